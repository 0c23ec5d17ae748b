//! Snapshots of the head in the map (docs/design/snapshots.md, "The model: a flat head and
//! before-image layers"): a snapshot owns a copy of each head page the head changed after the
//! snapshot was made, taken just before the first change (a *preserve*); its view of any other
//! page is the next newer snapshot's, and finally the head's.
//!
//! Rules on top of the map's (module doc of `map`):
//! 5. Every change to a head page after the newest snapshot was made is preceded, in memory and
//!    in the log, by a preserve of that page into the newest snapshot. The copy is written to its
//!    pool page (FUA) before the log block carrying the preserve record: replay does not copy the
//!    head page (which a checkpoint may have written with later changes, rule 2), it takes the
//!    copy. Until the record is durable a checkpoint writes the copy with the head's queued
//!    changes before the record undone too (rule 4): they are in the copy, durable only with it.
//! 6. A move (conditional update) changes every holder of the place it moves: the head's entry
//!    and each snapshot's own entry that equals it. An overwrite returns the place it replaced
//!    for freeing only when the newest snapshot does not hold it (none older can then).
//! 7. A checkpoint writes map pages and snapshot pages, flushes, writes table pages, flushes,
//!    writes directory and root pages, flushes, then the layer table, before the header: no
//!    table, directory or record on disk names a page whose contents are not durable.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

use stria_dev::{BLOCK_BYTES, BLOCK_USIZE, BlockDevice, IoBytes};
use stria_engine::pagecache::{PageCache, Slot};

use super::{DirtyPage, ENTRIES_PER_PAGE, MapEntry, MapError, MapPage, MapStore, Pending, Update};
use crate::layers::{
    INDEX_ENTRIES, IndexLevel, IndexPage, LAYER_TABLE_BLOCKS, LayerKind, LayerRecord, MAX_LAYERS, PagePool,
    decode_layer_table, encode_layer_table,
};

/// Cache keys of snapshot pages in the pool: `POOL_KEY | pool page` (head pages are their index).
pub(super) const POOL_KEY: u64 = 1 << 62;
/// Log records that are not entry deltas have this in the top 16 bits of their block field.
pub(super) const CONTROL_TAG: u64 = 0xFFFF;
/// Low bits of a log record's block field: the logical block (or a control record's operands).
pub(super) const BLOCK_MASK: u64 = (1 << 48) - 1;
const OP_PRESERVE: u64 = 1;
const OP_OWN: u64 = 2;
const OP_DROP: u64 = 3;
/// Pages a snapshot delete hands on per batch of table records (one log block holds 169).
const HAND_ON_BATCH: usize = 128;
/// The origin head's layer id in layer records (its deltas carry layer 0 in the log).
pub const HEAD_LAYER: u16 = 1;

/// Where a family's layer table and page pool are in the map's backing volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolLayout {
    /// Byte offset of the layer table (`LAYER_TABLE_BLOCKS` blocks).
    pub layers_at: u64,
    /// Byte offset of pool page 0 (page 0 itself is never used).
    pub pages_at: u64,
    /// Pages of the pool.
    pub pages: u32,
}

impl PoolLayout {
    /// Bytes from `layers_at` to the end of the pool.
    pub fn bytes(&self) -> u64 {
        (LAYER_TABLE_BLOCKS as u64 + u64::from(self.pages)) * BLOCK_BYTES
    }

    pub(super) fn page_offset(&self, page: u64) -> u64 {
        self.pages_at + page * BLOCK_BYTES
    }
}

/// A cached table page of a snapshot.
#[derive(Debug)]
pub(super) struct TablePage {
    layer: u16,
    first: u64,
    entries: parking_lot::Mutex<Box<[u32]>>,
}

/// One snapshot of the head.
#[derive(Debug)]
pub(super) struct Snap {
    record: LayerRecord,
    /// Table page per `INDEX_ENTRIES` head pages (0: none yet).
    dir: Vec<u32>,
    /// Pool pages of its directory level (fixed when it is made).
    dir_pages: Vec<u32>,
    dir_dirty: bool,
    root_dirty: bool,
}

/// The snapshots of a map and their pool.
#[derive(Debug)]
pub(super) struct Layers {
    head: Option<LayerRecord>,
    /// Oldest first.
    snaps: Vec<Snap>,
    /// Clones: writable layers over a snapshot (their pages are copies, like a snapshot's, of
    /// their own changed pages; the rest they read through their parent snapshot).
    clones: Vec<Snap>,
    pool: PagePool,
    records_dirty: bool,
    /// The next layer id to give out: ids are not reused while the log may hold records of a
    /// deleted layer (past ids seen in the layer table and in replayed records).
    next_id: u16,
}

/// Snapshot state of a [`MapStore`].
#[derive(Debug)]
pub(super) struct SnapState {
    pub(super) layers: parking_lot::Mutex<Layers>,
    pub(super) tables: PageCache<TablePage>,
    /// Updates hold it shared from finding their pages to applying them; making a snapshot holds
    /// it alone, so no update is half applied when the snapshot is made.
    pub(super) gate: tokio::sync::RwLock<()>,
    /// Bit per head page: the newest snapshot owns a copy of it.
    preserved: Vec<AtomicU64>,
    /// Raised when a snapshot is made: a view read that began before re-resolves.
    generation: AtomicU64,
}

/// A page an update needs in memory before it can apply.
#[derive(Debug, Clone, Copy)]
pub(super) enum Need {
    Table {
        table: u32,
        layer: u16,
        first: u64,
    },
    Pool {
        pool: u32,
        layer: u16,
        page: u64,
    },
    /// A head page (a clone's view of a page no snapshot has a copy of).
    Head {
        page: u64,
    },
}

/// A snapshot's directory as a checkpoint writes it.
struct DirWrite {
    layer: u16,
    /// Its pool pages.
    pages: Vec<u32>,
    /// Table page per `INDEX_ENTRIES` head pages.
    dir: Vec<u32>,
    /// The root page, when it is written too (a new snapshot).
    root: Option<u32>,
}

/// What a checkpoint writes for the snapshots, taken with the dirty map pages.
#[derive(Default)]
pub(super) struct LayerWrites {
    tables: Vec<(u64, Arc<Slot<TablePage>>)>,
    dirs: Vec<DirWrite>,
    records: Option<Vec<u8>>,
}

impl LayerWrites {
    pub(super) fn is_empty(&self) -> bool {
        self.tables.is_empty() && self.dirs.is_empty() && self.records.is_none()
    }
}

fn table_index(page: u64) -> usize {
    (page / INDEX_ENTRIES as u64) as usize
}

fn table_slot(page: u64) -> usize {
    (page % INDEX_ENTRIES as u64) as usize
}

impl Layers {
    pub(super) fn has_snapshots(&self) -> bool {
        !self.snaps.is_empty()
    }

    /// A new snapshot or clone of `tables` table pages' reach: its id (not given out again in
    /// one open), root and directory pages taken from the pool; its record to be written.
    fn new_layer(
        &mut self,
        mut record: LayerRecord,
        kind: LayerKind,
        parent: u16,
        tables: usize,
    ) -> Result<Snap, MapError> {
        let (what, same) = match kind {
            LayerKind::Clone => ("clone", &self.clones),
            _ => ("snapshot", &self.snaps),
        };
        if let Some(same) = same.iter().find(|s| s.record.name == record.name && !s.record.hidden) {
            return Err(layers_error(format!("{what} {:?} exists (layer {})", record.name, same.record.id)));
        }
        if self.snaps.len() + self.clones.len() + 2 > MAX_LAYERS {
            return Err(layers_error(format!(
                "a volume has at most {} snapshots and clones",
                MAX_LAYERS - 1
            )));
        }
        let id = self
            .next_id
            .max(self.snaps.iter().chain(&self.clones).map(|s| s.record.id).max().unwrap_or(HEAD_LAYER) + 1);
        if id == CONTROL_TAG as u16 {
            return Err(layers_error("layer ids are used up until the volume is opened again"));
        }
        let dirs = tables.div_ceil(INDEX_ENTRIES);
        room_for(&self.pool, dirs + 1)?;
        self.next_id = id + 1;
        record.id = id;
        record.kind = kind;
        record.parent = parent;
        record.root_page = self.pool.allocate().expect("room checked");
        record.region_page = 0;
        let dir_pages = (0..dirs).map(|_| self.pool.allocate().expect("room checked")).collect();
        self.records_dirty = true;
        Ok(Snap { record, dir: vec![0; tables], dir_pages, dir_dirty: true, root_dirty: true })
    }

    /// Snapshot or clone `id`.
    fn layer(&self, id: u16) -> Option<&Snap> {
        self.snaps.iter().chain(&self.clones).find(|s| s.record.id == id)
    }

    fn layer_mut(&mut self, id: u16) -> Option<&mut Snap> {
        self.snaps.iter_mut().chain(self.clones.iter_mut()).find(|s| s.record.id == id)
    }

    /// Whether snapshot `id` has clones (deleted ones whose delete has not finished included).
    fn has_clones(&self, id: u16) -> bool {
        self.clones.iter().any(|c| c.record.parent == id)
    }

    /// The index of snapshot `layer` among `snaps`, unless it is unknown or being deleted.
    fn visible(&self, layer: u16) -> Result<usize, MapError> {
        self.snaps
            .iter()
            .position(|s| s.record.id == layer && !s.record.hidden)
            .ok_or_else(|| layers_error(format!("no snapshot with layer id {layer}")))
    }
}

impl SnapState {
    pub(super) fn new(head_pages: u64, cache_pages: u64, pool: Option<PoolLayout>) -> SnapState {
        SnapState {
            layers: parking_lot::Mutex::new(Layers {
                head: None,
                snaps: Vec::new(),
                clones: Vec::new(),
                pool: PagePool::new(pool.map_or(0, |p| p.pages)),
                records_dirty: false,
                next_id: HEAD_LAYER + 1,
            }),
            tables: PageCache::new((cache_pages / 16).max(4)),
            gate: tokio::sync::RwLock::new(()),
            preserved: (0..head_pages.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
            generation: AtomicU64::new(0),
        }
    }

    fn is_preserved(&self, page: u64) -> bool {
        self.preserved[(page / 64) as usize].load(SeqCst) >> (page % 64) & 1 == 1
    }

    fn set_preserved(&self, page: u64) {
        self.preserved[(page / 64) as usize].fetch_or(1 << (page % 64), SeqCst);
    }

    /// Whether a checkpoint has anything of the snapshots to write.
    pub(super) fn dirty(&self) -> bool {
        let l = self.layers.lock();
        l.records_dirty
            || l.snaps.iter().chain(&l.clones).any(|s| s.dir_dirty || s.root_dirty)
            || self.tables.dirty_pages() > 0
    }
}

/// Refuses, changing nothing, an update that needs `pages` new pool pages the pool does not have.
fn room_for(pool: &PagePool, pages: usize) -> Result<(), MapError> {
    let (needed, free) = (pages as u64, u64::from(pool.free()));
    if needed > free {
        return Err(MapError::PoolFull { needed, free });
    }
    Ok(())
}

fn layers_error(e: impl std::fmt::Display) -> MapError {
    MapError::Layers(e.to_string())
}

impl<D: BlockDevice> MapStore<D> {
    fn pool_layout(&self) -> Result<PoolLayout, MapError> {
        self.layout
            .pool
            .ok_or_else(|| layers_error("this volume was made without room for snapshots (format version 2)"))
    }

    /// The snapshots, oldest first.
    pub fn snapshots(&self) -> Vec<LayerRecord> {
        self.snap.layers.lock().snaps.iter().filter(|s| !s.record.hidden).map(|s| s.record.clone()).collect()
    }

    /// Pool pages in use and in all (0, 0 without a pool).
    pub fn pool_pages(&self) -> (u32, u32) {
        let l = self.snap.layers.lock();
        (l.pool.pages() - l.pool.free(), l.pool.pages())
    }

    /// Grows the page pool to `pages` pages in all. The caller has made the backing volume
    /// hold them and made the header that says so durable (so a reopen finds them too).
    pub fn grow_pool(&self, pages: u32) {
        let mut l = self.snap.layers.lock();
        if pages > l.pool.pages() {
            l.pool.grow(pages);
        }
    }

    /// Reads the layer table, the snapshots' and clones' directories and tables (at open,
    /// before replay), rebuilding which pool pages are in use and which head pages the newest
    /// snapshot owns.
    pub(super) async fn load_layers(&self) -> Result<(), MapError> {
        let Some(pl) = self.layout.pool else { return Ok(()) };
        let bytes = self.vol.read(pl.layers_at, LAYER_TABLE_BLOCKS * BLOCK_USIZE).await?;
        let records = decode_layer_table(&bytes).map_err(layers_error)?;
        let head = records.iter().find(|r| r.kind == LayerKind::Head).cloned();
        let mut snap_records: Vec<LayerRecord> = records
            .iter()
            .filter(|r| r.kind == LayerKind::Snapshot && r.parent == HEAD_LAYER)
            .cloned()
            .collect();
        snap_records.sort_by_key(|r| r.created_seq);
        let clone_records: Vec<LayerRecord> =
            records.into_iter().filter(|r| r.kind == LayerKind::Clone).collect();
        let mut used = Vec::new();
        let mut copies = Vec::new();
        let mut snaps = Vec::new();
        for record in snap_records {
            snaps.push(self.load_layer(record, &mut used, &mut copies).await?);
        }
        let mut clones = Vec::new();
        for record in clone_records {
            if !snaps.iter().any(|s: &Snap| s.record.id == record.parent) {
                return Err(layers_error(format!(
                    "clone {:?} (layer {}) names parent snapshot {}, which the layer table does not hold",
                    record.name, record.id, record.parent
                )));
            }
            clones.push(self.load_layer(record, &mut used, &mut copies).await?);
        }
        if let Some(newest) = snaps.last() {
            for (ti, &t) in newest.dir.iter().enumerate() {
                if t == 0 {
                    continue;
                }
                let id = newest.record.id;
                let table = self.read_index(t, IndexLevel::Table, id, (ti * INDEX_ENTRIES) as u64).await?;
                for (k, &p) in table.entries.iter().enumerate() {
                    if p != 0 {
                        self.snap.set_preserved((ti * INDEX_ENTRIES + k) as u64);
                    }
                }
            }
        }
        let mut pool = PagePool::with_used(pl.pages, used).map_err(layers_error)?;
        // A copy may be named by two snapshots' tables for a while: a checkpoint that did not
        // finish can have written the table of the snapshot a delete handed it to and not yet
        // the other's; replaying the delete's record clears the other.
        for p in copies {
            if p >= pl.pages {
                return Err(layers_error(format!(
                    "pool page {p} is named, but the pool has pages 1..{}",
                    pl.pages
                )));
            }
            pool.claim(p);
        }
        let next_id = snaps.iter().chain(&clones).map(|s| s.record.id).max().unwrap_or(HEAD_LAYER) + 1;
        let mut l = self.snap.layers.lock();
        *l = Layers { head, snaps, clones, pool, records_dirty: false, next_id };
        Ok(())
    }

    /// Reads the root, directory and table pages of snapshot or clone `record`, adding its index
    /// pages to `used` and the copies its tables name to `copies`.
    async fn load_layer(
        &self,
        record: LayerRecord,
        used: &mut Vec<u32>,
        copies: &mut Vec<u32>,
    ) -> Result<Snap, MapError> {
        let tables_per_snap = self.layout.pages().div_ceil(INDEX_ENTRIES as u64) as usize;
        let id = record.id;
        let root = self.read_index(record.root_page, IndexLevel::Root, id, 0).await?;
        used.push(record.root_page);
        let dir_pages: Vec<u32> =
            root.entries.iter().copied().take(tables_per_snap.div_ceil(INDEX_ENTRIES)).collect();
        let mut dir = Vec::with_capacity(tables_per_snap);
        for (i, &d) in dir_pages.iter().enumerate() {
            let page = self.read_index(d, IndexLevel::Directory, id, (i * INDEX_ENTRIES) as u64).await?;
            used.push(d);
            dir.extend(page.entries.iter().copied());
        }
        dir.truncate(tables_per_snap);
        for (ti, &t) in dir.iter().enumerate() {
            if t == 0 {
                continue;
            }
            let table = self.read_index(t, IndexLevel::Table, id, (ti * INDEX_ENTRIES) as u64).await?;
            used.push(t);
            copies.extend(table.entries.iter().copied().filter(|&p| p != 0));
        }
        Ok(Snap { record, dir, dir_pages, dir_dirty: false, root_dirty: false })
    }

    async fn read_index(
        &self,
        page: u32,
        level: IndexLevel,
        layer: u16,
        first: u64,
    ) -> Result<IndexPage, MapError> {
        let pl = self.pool_layout()?;
        // The pool as it is now: it grows while the volume serves.
        if page == 0 || page >= self.snap.layers.lock().pool.pages() {
            return Err(layers_error(format!("layer {layer} names pool page {page}, outside the pool")));
        }
        let bytes = self.vol.read(pl.page_offset(u64::from(page)), BLOCK_USIZE).await?;
        IndexPage::decode(&bytes, level, layer, first).map_err(layers_error)
    }

    /// The cached table page `table` of `layer` covering head pages from `first`.
    async fn table_page(&self, table: u32, layer: u16, first: u64) -> Result<Arc<Slot<TablePage>>, MapError> {
        let key = u64::from(table);
        if let Some(Some(slot)) = self.snap.tables.lookup(key, 1).pop() {
            return Ok(slot);
        }
        let page = self.read_index(table, IndexLevel::Table, layer, first).await?;
        let tp = TablePage { layer, first, entries: parking_lot::Mutex::new(page.entries) };
        Ok(self.snap.tables.insert(vec![(key, tp, false)]).remove(0).0)
    }

    /// The cached pool page `pool`: `layer`'s copy of head page `page`.
    async fn pool_page(&self, pool: u32, layer: u16, page: u64) -> Result<Arc<Slot<MapPage>>, MapError> {
        let key = POOL_KEY | u64::from(pool);
        if let Some(Some(slot)) = self.cache.lookup(key, 1).pop() {
            return Ok(slot);
        }
        let pl = self.pool_layout()?;
        let _loading = self.loads[(u64::from(pool) % super::LOAD_STRIPES as u64) as usize].lock().await;
        if let Some(Some(slot)) = self.cache.lookup(key, 1).pop() {
            return Ok(slot);
        }
        let bytes = self.vol.read(pl.page_offset(u64::from(pool)), BLOCK_USIZE).await?;
        let entries = super::decode_owned_page(page, &bytes).ok_or_else(|| {
            layers_error(format!("pool page {pool} (snapshot {layer}'s copy of map page {page}) is damaged"))
        })?;
        let mp = MapPage { entries: parking_lot::Mutex::new(entries), owner: layer.into(), page };
        Ok(self.cache.insert(vec![(key, mp, false)]).remove(0).0)
    }

    /// Loads what an update needs (its slots are held by the caller until it applied).
    pub(super) async fn load_needs(&self, needs: Vec<Need>) -> Result<Vec<Pin>, MapError> {
        let mut pins = Vec::with_capacity(needs.len());
        for n in needs {
            pins.push(match n {
                Need::Table { table, layer, first } => {
                    Pin::Table(self.table_page(table, layer, first).await?)
                }
                Need::Pool { pool, layer, page } => Pin::Map(self.pool_page(pool, layer, page).await?),
                Need::Head { page } => Pin::Map(self.page_of(page * ENTRIES_PER_PAGE).await?.1),
            });
        }
        Ok(pins)
    }

    /// The resident own page of `snap` for head page `page`; `None` if it has none, or with
    /// the pages still to load in `needs`. The pages it finds resident are added to `held`: a
    /// caller that goes on to insert pages (a preserve) keeps them from being evicted.
    fn own_page_now(
        &self,
        snap: &Snap,
        page: u64,
        needs: &mut Vec<Need>,
        held: &mut Vec<Pin>,
    ) -> Option<(u64, Arc<Slot<MapPage>>)> {
        let layer = snap.record.id;
        let table = snap.dir[table_index(page)];
        if table == 0 {
            return None;
        }
        let Some(ts) = self.snap.tables.peek(u64::from(table)) else {
            let first = (table_index(page) * INDEX_ENTRIES) as u64;
            needs.push(Need::Table { table, layer, first });
            return None;
        };
        let pool = ts.page().entries.lock()[table_slot(page)];
        held.push(Pin::Table(ts));
        if pool == 0 {
            return None;
        }
        let key = POOL_KEY | u64::from(pool);
        match self.cache.peek(key) {
            Some(slot) => {
                held.push(Pin::Map(Arc::clone(&slot)));
                Some((key, slot))
            }
            None => {
                needs.push(Need::Pool { pool, layer, page });
                None
            }
        }
    }

    /// Applies `updates` with snapshots present (rules 5 and 6). `Ok(Err(needs))`: pages to load
    /// first (nothing was applied). Called with `pending` and `layers` locked.
    pub(super) fn apply_with_snapshots(
        &self,
        pending: &mut Pending,
        layers: &mut Layers,
        updates: &[Update],
        slots: &[DirtyPage],
    ) -> Result<Result<Vec<Option<MapEntry>>, Vec<Need>>, MapError> {
        // 1. Everything needed is resident, and the pool has room, before anything changes.
        let mut needs = Vec::new();
        let mut held = Vec::new();
        let mut new_pages = BTreeSet::new();
        let mut new_tables = BTreeSet::new();
        let newest = layers.snaps.len() - 1;
        for u in updates {
            let page = u.block / ENTRIES_PER_PAGE;
            if u.expect.is_none() {
                if self.snap.is_preserved(page) {
                    let had = needs.len();
                    if self.own_page_now(&layers.snaps[newest], page, &mut needs, &mut held).is_none()
                        && needs.len() == had
                    {
                        return Err(layers_error(format!(
                            "map page {page} is marked preserved but has no copy"
                        )));
                    }
                } else {
                    new_pages.insert(page);
                    let table = layers.snaps[newest].dir[table_index(page)];
                    if table == 0 {
                        new_tables.insert(table_index(page));
                    } else {
                        self.own_page_now(&layers.snaps[newest], page, &mut needs, &mut held);
                    }
                }
            } else {
                for s in layers.snaps.iter().chain(&layers.clones) {
                    self.own_page_now(s, page, &mut needs, &mut held);
                }
            }
        }
        if !needs.is_empty() {
            return Ok(Err(needs));
        }
        room_for(&layers.pool, new_pages.len() + new_tables.len())?;
        // 2. Apply, in order.
        let mut applied = Vec::with_capacity(updates.len());
        for (u, (page, slot)) in updates.iter().zip(slots) {
            let at = (u.block % ENTRIES_PER_PAGE) as usize;
            let mut entries = slot.page().entries.lock();
            let before = entries[at];
            match u.expect {
                None => {
                    if !self.snap.is_preserved(*page) {
                        self.preserve(pending, layers, *page, &entries);
                    }
                    let (_, own) = self
                        .own_page_now(&layers.snaps[newest], *page, &mut needs, &mut held)
                        .expect("the newest snapshot owns a page just preserved");
                    let held = own.page().entries.lock()[at] == before;
                    entries[at] = u.entry;
                    drop(entries);
                    self.cache.mark_dirty(*page, slot);
                    pending.push(super::Delta::entry(0, *page, u.block, u.entry, before));
                    applied.push(Some(if held { MapEntry::UNALLOCATED } else { before }));
                }
                Some(from) => {
                    let mut moved = false;
                    if before.place == from {
                        entries[at] = u.entry;
                        self.cache.mark_dirty(*page, slot);
                        pending.push(super::Delta::entry(0, *page, u.block, u.entry, before));
                        moved = true;
                    }
                    drop(entries);
                    for s in layers.snaps.iter().chain(&layers.clones) {
                        if let Some((key, own)) = self.own_page_now(s, *page, &mut needs, &mut held) {
                            let mut e = own.page().entries.lock();
                            if e[at].place == from {
                                let was = e[at];
                                e[at] = u.entry;
                                drop(e);
                                self.cache.mark_dirty(key, &own);
                                pending.push(super::Delta::entry(s.record.id, key, u.block, u.entry, was));
                                moved = true;
                            }
                        }
                    }
                    applied.push(moved.then_some(MapEntry { place: from, ..u.entry }));
                }
            }
        }
        assert!(needs.is_empty(), "pages found resident above stay resident while held");
        Ok(Ok(applied))
    }

    /// Copies head page `page` (its entries `head`) into a new pool page of the newest snapshot
    /// and queues the preserve record (rule 5).
    fn preserve(&self, pending: &mut Pending, layers: &mut Layers, page: u64, head: &[MapEntry]) {
        let Layers { snaps, pool, .. } = layers;
        let snap = snaps.last_mut().expect("preserve needs a snapshot");
        self.copy_page(pending, snap, pool, page, head);
        self.snap.set_preserved(page);
        self.stats_preserved.fetch_add(1, SeqCst);
    }

    /// Makes `entries` layer `snap`'s own copy of head page `page` in a new pool page (a table
    /// page too if it has none there; the caller checked the pool has room) and queues the
    /// record that names it: a preserve, or a clone's first change of a page it read through
    /// its parent (the copy record is the same: replay takes the copy from its pool page).
    fn copy_page(
        &self,
        pending: &mut Pending,
        snap: &mut Snap,
        pool: &mut PagePool,
        page: u64,
        entries: &[MapEntry],
    ) {
        let layer = snap.record.id;
        let ti = table_index(page);
        let mut new_table = 0;
        if snap.dir[ti] == 0 {
            new_table = pool.allocate().expect("room checked");
            snap.dir[ti] = new_table;
            snap.dir_dirty = true;
            let tp = TablePage {
                layer,
                first: (ti * INDEX_ENTRIES) as u64,
                entries: parking_lot::Mutex::new(vec![0; INDEX_ENTRIES].into_boxed_slice()),
            };
            self.snap.tables.forget(u64::from(new_table));
            let (slot, inserted) = self.snap.tables.insert(vec![(u64::from(new_table), tp, false)]).remove(0);
            assert!(inserted, "a new table page {new_table} was cached already");
            self.snap.tables.mark_dirty(u64::from(new_table), &slot);
        }
        let table = snap.dir[ti];
        let ts = self.snap.tables.peek(u64::from(table)).expect("table page resident (checked or just made)");
        let copy = pool.allocate().expect("room checked");
        let key = POOL_KEY | u64::from(copy);
        let mp = MapPage { entries: parking_lot::Mutex::new(entries.into()), owner: layer.into(), page };
        // A page just allocated may still be cached from before it was freed (a read that
        // raced the delete that freed it): its old contents go.
        self.cache.forget(key);
        let (slot, inserted) = self.cache.insert(vec![(key, mp, false)]).remove(0);
        assert!(inserted, "a new pool page {copy} was cached already");
        self.cache.mark_dirty(key, &slot);
        ts.page().entries.lock()[table_slot(page)] = copy;
        self.snap.tables.mark_dirty(u64::from(table), &ts);
        pending.copies.insert(copy, slot);
        pending.push(super::Delta {
            preserve: Some((layer, page, copy, new_table)),
            ..super::Delta::entry(0, 0, 0, MapEntry::UNALLOCATED, MapEntry::UNALLOCATED)
        });
    }

    /// The bytes of the copies whose preserve records are among the first `n` queued deltas,
    /// as they are once those `n` are durable: later queued changes of the copies undone.
    pub(super) fn preserved_copies(&self, pending: &Pending, n: usize) -> Vec<(u32, stria_dev::IoBuf)> {
        let pools: Vec<(u32, u64)> = pending
            .deltas
            .iter()
            .take(n)
            .filter_map(|d| d.preserve.map(|(_, page, pool, _)| (pool, page)))
            .collect();
        if pools.is_empty() {
            return Vec::new();
        }
        let keys: BTreeSet<u64> = pools.iter().map(|(pool, _)| POOL_KEY | u64::from(*pool)).collect();
        let undo = super::undo_map(pending, n, |key| keys.contains(&key));
        pools
            .into_iter()
            .map(|(pool, page)| {
                let slot = &pending.copies[&pool];
                let mp = slot.page();
                let key = POOL_KEY | u64::from(pool);
                let mut entries = mp.entries.lock().to_vec();
                for ((_, at), before) in undo.range((key, 0)..(key, ENTRIES_PER_PAGE)) {
                    entries[*at as usize] = *before;
                }
                let mut buf = stria_dev::IoBuf::zeroed(BLOCK_USIZE);
                super::encode_page(mp.owner(), page, &entries, &mut buf);
                (pool, buf)
            })
            .collect()
    }

    /// Makes snapshot `record` of the head (its id and root page are chosen here) and returns
    /// its id once it is durable. Every update applied before it is in it, none after; the
    /// head's record `head` is written with it.
    pub async fn create_snapshot(&self, head: LayerRecord, record: LayerRecord) -> Result<u16, MapError> {
        self.pool_layout()?;
        let gate = self.snap.gate.write().await;
        let queued = self.pending.lock().queued;
        self.commit(queued).await?;
        let tables = self.layout.pages().div_ceil(INDEX_ENTRIES as u64) as usize;
        let id = {
            let mut l = self.snap.layers.lock();
            let snap = l.new_layer(record, LayerKind::Snapshot, HEAD_LAYER, tables)?;
            let id = snap.record.id;
            l.snaps.push(snap);
            if l.head.is_none() {
                l.head = Some(LayerRecord {
                    id: HEAD_LAYER,
                    kind: LayerKind::Head,
                    parent: 0,
                    root_page: 0,
                    ..head
                });
            }
            for w in &self.snap.preserved {
                w.store(0, SeqCst);
            }
            self.snap.generation.fetch_add(1, SeqCst);
            id
        };
        drop(gate);
        let _one = self.checkpointing.lock().await;
        self.write_back().await?;
        Ok(id)
    }

    /// The entries of `blocks` as snapshot or clone `layer` sees them.
    pub async fn get_in(&self, layer: u16, blocks: &[u64]) -> Result<Vec<MapEntry>, MapError> {
        let parent = {
            let l = self.snap.layers.lock();
            match l.clones.iter().find(|c| c.record.id == layer && !c.record.hidden) {
                Some(c) => Some(c.record.parent),
                None => {
                    l.visible(layer)?;
                    None
                }
            }
        };
        let mut out = Vec::with_capacity(blocks.len());
        for &block in blocks {
            if block >= self.layout.blocks {
                return Err(MapError::OutOfRange { block, blocks: self.layout.blocks });
            }
            match parent {
                None => out.push(self.view_entry(layer, block).await?),
                Some(parent) => {
                    // Its own copy of the page, else its parent's view. A write racing the read
                    // may make the copy in between: the read then sees the block before it.
                    let page = block / ENTRIES_PER_PAGE;
                    match self.own_copy(layer, page).await? {
                        Some((_, own)) => {
                            out.push(own.page().entries.lock()[(block % ENTRIES_PER_PAGE) as usize])
                        }
                        None => out.push(self.view_entry(parent, block).await?),
                    }
                }
            }
        }
        Ok(out)
    }

    /// [`MapStore::get_in`] for a snapshot, also one deleted and kept for its clones (which
    /// read through it): for checks and diagnostics.
    pub async fn get_in_kept(&self, layer: u16, blocks: &[u64]) -> Result<Vec<MapEntry>, MapError> {
        let mut out = Vec::with_capacity(blocks.len());
        for &block in blocks {
            if block >= self.layout.blocks {
                return Err(MapError::OutOfRange { block, blocks: self.layout.blocks });
            }
            out.push(self.view_entry(layer, block).await?);
        }
        Ok(out)
    }

    /// The entry of `block` as snapshot `layer` sees it (a deleted one kept for its clones too).
    async fn view_entry(&self, layer: u16, block: u64) -> Result<MapEntry, MapError> {
        let page = block / ENTRIES_PER_PAGE;
        let at = (block % ENTRIES_PER_PAGE) as usize;
        'resolve: loop {
            let generation = self.snap.generation.load(SeqCst);
            let chain: Vec<(u16, u32)> = {
                let l = self.snap.layers.lock();
                let k = l
                    .snaps
                    .iter()
                    .position(|s| s.record.id == layer)
                    .ok_or_else(|| layers_error(format!("no snapshot with layer id {layer}")))?;
                l.snaps[k..].iter().map(|s| (s.record.id, s.dir[table_index(page)])).collect()
            };
            for (id, table) in chain {
                if table == 0 {
                    continue;
                }
                let ts = self.table_page(table, id, (table_index(page) * INDEX_ENTRIES) as u64).await;
                if ts.is_err() && self.snap.generation.load(SeqCst) != generation {
                    continue 'resolve;
                }
                let pool = ts?.page().entries.lock()[table_slot(page)];
                if pool != 0 {
                    let own = self.pool_page(pool, id, page).await;
                    if self.snap.generation.load(SeqCst) != generation {
                        continue 'resolve;
                    }
                    return Ok(own?.page().entries.lock()[at]);
                }
            }
            // No snapshot from `layer` on owns the page: the head's is the view, unless the
            // newest took a copy (or a newer snapshot was made) since the chain was read.
            let (_, slot) = self.page_of(block).await?;
            let entries = slot.page().entries.lock();
            if self.snap.generation.load(SeqCst) == generation && !self.snap.is_preserved(page) {
                return Ok(entries[at]);
            }
        }
    }

    /// For each `(block, place)`, the entry of a layer that holds `place` for `block` (the head
    /// first, then the snapshots' copies), or `None` when no layer does: what destage and GC
    /// ask before they move a block (docs/design/snapshots.md, "Holders").
    pub async fn holding(&self, items: &[(u64, super::Place)]) -> Result<Vec<Option<MapEntry>>, MapError> {
        let blocks: Vec<u64> = items.iter().map(|i| i.0).collect();
        let heads = self.get_many(&blocks).await?;
        if !self.snap.layers.lock().has_snapshots() {
            return Ok(items
                .iter()
                .zip(heads)
                .map(|(&(_, place), h)| (h.place == place).then_some(h))
                .collect());
        }
        let mut out = Vec::with_capacity(items.len());
        for (&(block, place), head) in items.iter().zip(heads) {
            if head.place == place {
                out.push(Some(head));
                continue;
            }
            let page = block / ENTRIES_PER_PAGE;
            let found = loop {
                // A delete hands copies between layers (and removes one) under the gate, which
                // this does not take: a walk that overlapped one is done again.
                let generation = self.snap.generation.load(SeqCst);
                let ids: Vec<u16> = {
                    let l = self.snap.layers.lock();
                    l.snaps.iter().chain(&l.clones).map(|s| s.record.id).collect()
                };
                let mut found = None;
                let mut walked = true;
                for id in ids {
                    match self.own_copy(id, page).await {
                        Ok(Some((_, own))) => {
                            let e = own.page().entries.lock()[(block % ENTRIES_PER_PAGE) as usize];
                            if e.place == place {
                                found = Some(e);
                                break;
                            }
                        }
                        Ok(None) => {}
                        Err(_) if self.snap.generation.load(SeqCst) != generation => {
                            walked = false;
                            break;
                        }
                        Err(e) => return Err(e),
                    }
                }
                if walked && self.snap.generation.load(SeqCst) == generation {
                    break found;
                }
            };
            out.push(found);
        }
        Ok(out)
    }

    /// Calls `f(block, entry)` for the entries of the snapshots' copies whose place neither the
    /// head's page nor another copy of the same page names for that block: after a scan of the
    /// head, every place some layer holds is named exactly once (live counts at open).
    pub async fn scan_copies(&self, mut f: impl FnMut(u64, &MapEntry)) -> Result<(), MapError> {
        let snaps: Vec<(u16, Vec<u32>)> = {
            let l = self.snap.layers.lock();
            l.snaps.iter().chain(&l.clones).map(|s| (s.record.id, s.dir.clone())).collect()
        };
        let Some(tables) = snaps.first().map(|s| s.1.len()) else { return Ok(()) };
        let pages = self.layout.pages();
        for ti in 0..tables {
            let first = (ti * INDEX_ENTRIES) as u64;
            let mut tabs: Vec<(u16, Box<[u32]>)> = Vec::new();
            for (layer, dir) in &snaps {
                if dir[ti] != 0 {
                    tabs.push((
                        *layer,
                        self.table_page(dir[ti], *layer, first).await?.page().entries.lock().clone(),
                    ));
                }
            }
            for k in 0..INDEX_ENTRIES {
                let page = first + k as u64;
                if page >= pages {
                    break;
                }
                let copies: Vec<(u16, u32)> = tabs
                    .iter()
                    .filter(|t| t.1[k] != 0)
                    .map(|(layer, entries)| (*layer, entries[k]))
                    .collect();
                if copies.is_empty() {
                    continue;
                }
                let (_, head) = self.page_of(page * ENTRIES_PER_PAGE).await?;
                let head: Box<[MapEntry]> = head.page().entries.lock().clone();
                let mut own = Vec::with_capacity(copies.len());
                for (layer, pool) in copies {
                    own.push(self.pool_page(pool, layer, page).await?.page().entries.lock().clone());
                }
                for (i, h) in head.iter().enumerate() {
                    let mut named = vec![h.place];
                    for copy in &own {
                        if !named.contains(&copy[i].place) {
                            named.push(copy[i].place);
                            f(page * ENTRIES_PER_PAGE + i as u64, &copy[i]);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Takes what a checkpoint writes for the snapshots (with the log and `pending` locked, so
    /// no preserve is half taken).
    pub(super) fn take_layer_writes(&self) -> LayerWrites {
        let mut l = self.snap.layers.lock();
        let mut w = LayerWrites { tables: self.snap.tables.take_dirty(), ..LayerWrites::default() };
        let Layers { snaps, clones, .. } = &mut *l;
        for s in snaps.iter_mut().chain(clones.iter_mut()) {
            if s.dir_dirty || s.root_dirty {
                let root = s.root_dirty.then_some(s.record.root_page);
                w.dirs.push(DirWrite {
                    layer: s.record.id,
                    pages: s.dir_pages.clone(),
                    dir: s.dir.clone(),
                    root,
                });
                s.dir_dirty = false;
                s.root_dirty = false;
            }
        }
        if l.records_dirty {
            let mut records: Vec<LayerRecord> = l.head.iter().cloned().collect();
            records.extend(l.snaps.iter().chain(&l.clones).map(|s| s.record.clone()));
            w.records = Some(encode_layer_table(&records));
            l.records_dirty = false;
        }
        w
    }

    /// Puts back what a failed checkpoint did not write.
    pub(super) fn untake_layer_writes(&self, w: &LayerWrites) {
        self.snap.tables.redirty(&w.tables);
        let mut l = self.snap.layers.lock();
        for d in &w.dirs {
            if let Some(s) = l.layer_mut(d.layer) {
                s.dir_dirty = true;
                s.root_dirty |= d.root.is_some();
            }
        }
        if w.records.is_some() {
            l.records_dirty = true;
        }
    }

    /// Writes `w` in rule 7's order (the map and snapshot pages are durable already).
    pub(super) async fn write_layer_writes(&self, w: &LayerWrites) -> Result<(), MapError> {
        if w.is_empty() {
            return Ok(());
        }
        let pl = self.pool_layout()?;
        let write_index = |page: u32, index: IndexPage| {
            let mut buf = stria_dev::IoBuf::zeroed(BLOCK_USIZE);
            index.encode(&mut buf);
            self.vol.write(pl.page_offset(u64::from(page)), buf.freeze(), false)
        };
        // Table pages name only copies whose preserve record is durable (the copy is written
        // with its record); a page written without a newer entry is written again later.
        let encoded: Vec<(u32, IndexPage)> = {
            let pending = self.pending.lock();
            w.tables
                .iter()
                .map(|(key, slot)| {
                    let tp = slot.page();
                    let mut entries = tp.entries.lock().clone();
                    let mut held_back = false;
                    for e in entries.iter_mut() {
                        if *e != 0 && pending.copies.contains_key(e) {
                            *e = 0;
                            held_back = true;
                        }
                    }
                    if held_back {
                        self.snap.tables.mark_dirty(*key, slot);
                    }
                    (
                        *key as u32,
                        IndexPage { level: IndexLevel::Table, layer: tp.layer, first: tp.first, entries },
                    )
                })
                .collect()
        };
        let tables = encoded.into_iter().map(|(page, index)| write_index(page, index));
        stria_engine::join_all_ok(tables).await?;
        if !w.tables.is_empty() {
            self.vol.flush().await?;
        }
        let mut writes = Vec::new();
        for d in &w.dirs {
            for (i, &at) in d.pages.iter().enumerate() {
                let mut page = IndexPage::empty(IndexLevel::Directory, d.layer, (i * INDEX_ENTRIES) as u64);
                let part =
                    &d.dir[(i * INDEX_ENTRIES).min(d.dir.len())..((i + 1) * INDEX_ENTRIES).min(d.dir.len())];
                page.entries[..part.len()].copy_from_slice(part);
                writes.push(write_index(at, page));
            }
            if let Some(r) = d.root {
                let mut page = IndexPage::empty(IndexLevel::Root, d.layer, 0);
                page.entries[..d.pages.len()].copy_from_slice(&d.pages);
                writes.push(write_index(r, page));
            }
        }
        if !writes.is_empty() {
            stria_engine::join_all_ok(writes).await?;
            self.vol.flush().await?;
        }
        if let Some(bytes) = &w.records {
            self.vol.write(pl.layers_at, IoBytes::copy_from(bytes), true).await?;
        }
        Ok(())
    }

    /// A checkpoint whose replay starts at `until` is durable: pool pages released before it
    /// are free again.
    pub(super) fn layers_checkpointed(&self, until: u64) {
        self.snap.layers.lock().pool.checkpoint_done(until);
    }

    /// Notes a layer id named by a replayed record: ids are not given out again while the
    /// log may hold records of them.
    fn saw_layer(&self, layer: u16) {
        let mut l = self.snap.layers.lock();
        l.next_id = l.next_id.max(layer.saturating_add(1));
    }

    /// The table page of snapshot `layer` covering head page `page`; made as pool page `table`
    /// when the snapshot has none there yet (`table` is what the record that makes it names;
    /// `claim`: take it from the pool, as replay does). `None` if `layer` is not known.
    async fn table_for(
        &self,
        layer: u16,
        page: u64,
        table: u32,
        claim: bool,
    ) -> Result<Option<(u64, Arc<Slot<TablePage>>)>, MapError> {
        let bad = |why: String| layers_error(format!("snapshot {layer}'s table for map page {page}: {why}"));
        let first = (table_index(page) * INDEX_ENTRIES) as u64;
        let dir_table = {
            let mut l = self.snap.layers.lock();
            let Layers { snaps, clones, pool, .. } = &mut *l;
            let Some(s) = snaps.iter_mut().chain(clones.iter_mut()).find(|s| s.record.id == layer) else {
                return Ok(None);
            };
            let dir_table = *s.dir.get(table_index(page)).ok_or_else(|| bad("past the map".into()))?;
            if dir_table == 0 {
                if table == 0 {
                    return Err(bad("the record makes no table page".into()));
                }
                if claim && !pool.claim(table) {
                    return Err(bad(format!("its new table page {table} is in use")));
                }
                s.dir[table_index(page)] = table;
                s.dir_dirty = true;
            } else if table != 0 && table != dir_table {
                return Err(bad(format!(
                    "the record makes table page {table}, the directory has {dir_table}"
                )));
            }
            dir_table
        };
        if dir_table != 0 {
            return Ok(Some((u64::from(dir_table), self.table_page(dir_table, layer, first).await?)));
        }
        let tp = TablePage {
            layer,
            first,
            entries: parking_lot::Mutex::new(vec![0; INDEX_ENTRIES].into_boxed_slice()),
        };
        self.snap.tables.forget(u64::from(table));
        let (slot, _) = self.snap.tables.insert(vec![(u64::from(table), tp, false)]).remove(0);
        self.snap.tables.mark_dirty(u64::from(table), &slot);
        Ok(Some((u64::from(table), slot)))
    }

    /// Replays a preserve record: snapshot `layer`'s copy of head page `page` is pool page
    /// `pool` (with table page `table` made for it, if not 0), equal to the head page as replay
    /// has it now. A record of a snapshot the layer table does not know is skipped (its making
    /// never became durable, or it was deleted).
    pub(super) async fn replay_preserve(
        &self,
        layer: u16,
        page: u64,
        pool: u32,
        table: u32,
    ) -> Result<bool, MapError> {
        self.saw_layer(layer);
        let Some((key, ts)) = self.table_for(layer, page, table, true).await? else { return Ok(false) };
        let now = ts.page().entries.lock()[table_slot(page)];
        if now != pool {
            if now != 0 {
                return Err(layers_error(format!(
                    "replaying snapshot {layer}'s copy of map page {page}: the table names pool page {now}, the record {pool}"
                )));
            }
            // In use when a checkpoint that did not finish wrote the table of the snapshot a
            // later delete record hands it to: replaying that record clears this entry again.
            self.snap.layers.lock().pool.claim(pool);
            ts.page().entries.lock()[table_slot(page)] = pool;
        }
        self.snap.tables.mark_dirty(key, &ts);
        // The copy was written before the record: it must read back as that page.
        self.pool_page(pool, layer, page).await?;
        let newest = self.snap.layers.lock().snaps.last().is_some_and(|s| s.record.id == layer);
        if newest {
            self.snap.set_preserved(page);
        }
        Ok(true)
    }

    /// Replays an entry delta of snapshot `layer` (a move of one of its blocks).
    pub(super) async fn replay_snapshot_entry(
        &self,
        layer: u16,
        block: u64,
        entry: MapEntry,
    ) -> Result<bool, MapError> {
        let page = block / ENTRIES_PER_PAGE;
        let mut needs = Vec::new();
        loop {
            let own = {
                let l = self.snap.layers.lock();
                let Some(s) = l.layer(layer) else {
                    drop(l);
                    self.saw_layer(layer);
                    return Ok(false);
                };
                needs.clear();
                let own = self.own_page_now(s, page, &mut needs, &mut Vec::new());
                if own.is_none() && needs.is_empty() {
                    // A later delete record handed the copy on or dropped it, and a checkpoint
                    // that did not finish wrote the tables: the copy's own write (before those
                    // tables) holds this move already.
                    return Ok(false);
                }
                own
            };
            if let Some((key, slot)) = own {
                slot.page().entries.lock()[(block % ENTRIES_PER_PAGE) as usize] = entry;
                self.cache.mark_dirty(key, &slot);
                return Ok(true);
            }
            let _pins = self.load_needs(std::mem::take(&mut needs)).await?;
        }
    }
}

/// What deleting a snapshot did (docs/design/snapshots.md, "Snapshot delete").
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct DeleteStats {
    /// Copies handed to the next older snapshot (its view of those pages was the copy).
    pub pages_moved: u64,
    /// Copies let go of (the next older snapshot has its own copy, or there is none).
    pub pages_dropped: u64,
    /// Entries of dropped copies that no other layer held: their places were freed.
    pub entries_freed: u64,
    /// A snapshot with clones is only hidden: its pages stay (its clones read through them)
    /// until its last clone is deleted, and that delete finishes this one.
    pub kept_for_clones: bool,
}

impl<D: BlockDevice> MapStore<D> {
    /// Snapshot `layer`'s own copy of head page `page`, if it has one.
    async fn own_copy(&self, layer: u16, page: u64) -> Result<Option<(u32, Arc<Slot<MapPage>>)>, MapError> {
        let table = {
            let l = self.snap.layers.lock();
            let s = l.layer(layer).ok_or_else(|| layers_error(format!("no layer with id {layer}")))?;
            s.dir[table_index(page)]
        };
        if table == 0 {
            return Ok(None);
        }
        let ts = self.table_page(table, layer, (table_index(page) * INDEX_ENTRIES) as u64).await?;
        let pool = ts.page().entries.lock()[table_slot(page)];
        if pool == 0 {
            return Ok(None);
        }
        Ok(Some((pool, self.pool_page(pool, layer, page).await?)))
    }

    /// The entries of head page `page` as the first layer newer than snapshot `layer` sees
    /// them (a newer snapshot's copy, else the head's page).
    async fn view_after(&self, layer: u16, page: u64) -> Result<Box<[MapEntry]>, MapError> {
        let newer: Vec<u16> = {
            let l = self.snap.layers.lock();
            let k = l.snaps.iter().position(|s| s.record.id == layer).expect("known layer");
            l.snaps[k + 1..].iter().map(|s| s.record.id).collect()
        };
        for id in newer {
            if let Some((_, copy)) = self.own_copy(id, page).await? {
                return Ok(copy.page().entries.lock().clone());
            }
        }
        let (_, head) = self.page_of(page * ENTRIES_PER_PAGE).await?;
        Ok(head.page().entries.lock().clone())
    }

    /// Deletes snapshot `layer` without copying data: its copies are handed to the next older
    /// snapshot or dropped, and `on_free` gets, batch by batch once durable, the blocks and
    /// entries no layer holds any more (their places are the caller's to free). Writes to the volume wait
    /// until it is done; it costs a table record per page the snapshot owns.
    pub async fn delete_snapshot(
        &self,
        layer: u16,
        mut on_free: impl FnMut(Vec<(u64, MapEntry)>),
    ) -> Result<DeleteStats, MapError> {
        self.pool_layout()?;
        let _gate = self.snap.gate.write().await;
        {
            let mut l = self.snap.layers.lock();
            if l.head.as_ref().is_some_and(|h| h.rollback_to == layer) {
                return Err(layers_error("a rollback to it has not finished"));
            }
            let s = l
                .snaps
                .iter_mut()
                .find(|s| s.record.id == layer && !s.record.hidden)
                .ok_or_else(|| layers_error(format!("no snapshot with layer id {layer}")))?;
            s.record.hidden = true;
            l.records_dirty = true;
        }
        self.snap.generation.fetch_add(1, SeqCst);
        // The hidden mark is durable before any copy is handed on: the snapshot's own view is
        // never read again, and open finishes a delete a crash cut short.
        self.checkpoint().await?;
        if self.snap.layers.lock().has_clones(layer) {
            return Ok(DeleteStats { kept_for_clones: true, ..DeleteStats::default() });
        }
        self.hand_on(layer, &mut on_free).await
    }

    /// Finishes the deletes a crash cut short (at open, before the map is used).
    pub async fn finish_deletes(
        &self,
        mut on_free: impl FnMut(Vec<(u64, MapEntry)>),
    ) -> Result<usize, MapError> {
        let clones: Vec<u16> =
            self.snap.layers.lock().clones.iter().filter(|c| c.record.hidden).map(|c| c.record.id).collect();
        for &layer in &clones {
            let _gate = self.snap.gate.write().await;
            self.drop_clone(layer, &mut on_free).await?;
        }
        // Deleted snapshots kept for clones stay until their last clone goes.
        let hidden: Vec<u16> = {
            let l = self.snap.layers.lock();
            l.snaps
                .iter()
                .filter(|s| s.record.hidden && !l.has_clones(s.record.id))
                .map(|s| s.record.id)
                .collect()
        };
        for &layer in &hidden {
            let _gate = self.snap.gate.write().await;
            self.hand_on(layer, &mut on_free).await?;
        }
        Ok(clones.len() + hidden.len())
    }

    /// Hands on or drops every copy of hidden snapshot `layer`, then removes it (the caller
    /// holds the gate: no update runs meanwhile).
    async fn hand_on(
        &self,
        layer: u16,
        on_free: &mut impl FnMut(Vec<(u64, MapEntry)>),
    ) -> Result<DeleteStats, MapError> {
        let (dir, older) = {
            let l = self.snap.layers.lock();
            let k = l.snaps.iter().position(|s| s.record.id == layer).expect("known layer");
            (l.snaps[k].dir.clone(), k.checked_sub(1).map(|i| l.snaps[i].record.id))
        };
        let stats = self.let_go(layer, &dir, LetGo::HandOn { older }, on_free).await?;
        self.remove_layer(layer).await?;
        Ok(stats)
    }

    /// Lets go of every copy snapshot or clone `layer` owns (its directory `dir`), in batches,
    /// each logged and durable before it applies; `on_free` gets what no other layer holds.
    async fn let_go(
        &self,
        layer: u16,
        dir: &[u32],
        how: LetGo,
        on_free: &mut impl FnMut(Vec<(u64, MapEntry)>),
    ) -> Result<DeleteStats, MapError> {
        let mut stats = DeleteStats::default();
        for (ti, &table) in dir.iter().enumerate() {
            if table == 0 {
                continue;
            }
            let owned = self.owned_in_table(layer, table, ti).await?;
            for batch in owned.chunks(HAND_ON_BATCH) {
                let mut ops = Vec::with_capacity(batch.len());
                let mut freed = Vec::new();
                for &(page, pool) in batch {
                    ops.push(match how {
                        LetGo::HandOn { older } => {
                            self.hand_on_page(layer, older, page, pool, &mut freed).await?
                        }
                        LetGo::DropClone { parent } => {
                            self.drop_clone_page(layer, parent, page, pool, &mut freed).await?
                        }
                    });
                }
                self.log_table_ops(&mut ops).await?;
                for op in &ops {
                    match op {
                        TableOp::Own { .. } => stats.pages_moved += 1,
                        TableOp::Drop { .. } => stats.pages_dropped += 1,
                    }
                }
                stats.entries_freed += freed.len() as u64;
                on_free(freed);
            }
        }
        Ok(stats)
    }

    /// The (head page, pool page) pairs of snapshot `layer`'s table page `table`, the `ti`th.
    async fn owned_in_table(&self, layer: u16, table: u32, ti: usize) -> Result<Vec<(u64, u32)>, MapError> {
        let first = (ti * INDEX_ENTRIES) as u64;
        let ts = self.table_page(table, layer, first).await?;
        let entries = ts.page().entries.lock();
        Ok(entries.iter().enumerate().filter(|e| *e.1 != 0).map(|(i, &p)| (first + i as u64, p)).collect())
    }

    /// What deleting snapshot `layer` does with its copy `pool` of head page `page`: hand it to
    /// `older` if that one has none (its view of the page was this copy), else drop it, adding
    /// to `freed` the entries no other layer holds (only a neighbour's view can: the layers
    /// that see one version of a block are consecutive).
    async fn hand_on_page(
        &self,
        layer: u16,
        older: Option<u16>,
        page: u64,
        pool: u32,
        freed: &mut Vec<(u64, MapEntry)>,
    ) -> Result<TableOp, MapError> {
        let older_copy = match older {
            Some(o) => match self.own_copy(o, page).await? {
                None => return Ok(TableOp::Own { from: layer, to: o, page, pool, table: 0 }),
                Some((_, c)) => Some(c.page().entries.lock().clone()),
            },
            None => None,
        };
        let copy = self.pool_page(pool, layer, page).await?.page().entries.lock().clone();
        let newer = self.view_after(layer, page).await?;
        for (i, x) in copy.iter().enumerate() {
            let physical = matches!(x.place, super::Place::Segment(_) | super::Place::Cache(_));
            let held =
                newer[i].place == x.place || older_copy.as_ref().is_some_and(|o| o[i].place == x.place);
            if physical && !held {
                freed.push((page * ENTRIES_PER_PAGE + i as u64, *x));
            }
        }
        Ok(TableOp::Drop { layer, page, pool })
    }

    /// Blocks only snapshot `layer` holds: what deleting it would free. It walks the pages the
    /// snapshot owns (what changed between it and the next newer), as a delete would, without
    /// changing anything; writes going on meanwhile make it a moment's figure.
    pub async fn exclusive_blocks(&self, layer: u16) -> Result<u64, MapError> {
        let _no_delete = self.snap.gate.read().await;
        let (dir, older) = {
            let l = self.snap.layers.lock();
            let k = l.visible(layer)?;
            if l.has_clones(layer) {
                // Deleting it now frees nothing: its clones read through it.
                return Ok(0);
            }
            (l.snaps[k].dir.clone(), k.checked_sub(1).map(|i| l.snaps[i].record.id))
        };
        let mut freed = Vec::new();
        let mut blocks = 0;
        for (ti, &table) in dir.iter().enumerate() {
            if table == 0 {
                continue;
            }
            let owned = self.owned_in_table(layer, table, ti).await?;
            for (page, pool) in owned {
                self.hand_on_page(layer, older, page, pool, &mut freed).await?;
                blocks += freed.len() as u64;
                freed.clear();
            }
        }
        Ok(blocks)
    }

    /// Logs `ops` (choosing the table pages moves need first) and applies them once durable,
    /// with no checkpoint between: one that ran between would move replay past records whose
    /// changes it did not write.
    async fn log_table_ops(&self, ops: &mut [TableOp]) -> Result<(), MapError> {
        let _one = self.checkpointing.lock().await;
        {
            let mut l = self.snap.layers.lock();
            let Layers { snaps, pool, .. } = &mut *l;
            let mut made: std::collections::HashMap<(u16, usize), u32> = std::collections::HashMap::new();
            for op in ops.iter_mut() {
                if let TableOp::Own { to, page, table, .. } = op {
                    let ti = table_index(*page);
                    let s = snaps.iter().find(|s| s.record.id == *to).expect("known layer");
                    if s.dir[ti] == 0 {
                        *table = match made.get(&(*to, ti)) {
                            Some(&t) => t,
                            None => {
                                let t = pool.allocate().ok_or(MapError::PoolFull { needed: 1, free: 0 })?;
                                made.insert((*to, ti), t);
                                t
                            }
                        };
                    }
                }
            }
        }
        let deltas = ops
            .iter()
            .map(|&op| super::Delta {
                table_op: Some(op),
                ..super::Delta::entry(0, 0, 0, MapEntry::UNALLOCATED, MapEntry::UNALLOCATED)
            })
            .collect();
        self.log_held(deltas).await?;
        for &op in ops.iter() {
            self.apply_table_op(op, None).await?;
        }
        self.snap.generation.fetch_add(1, SeqCst);
        Ok(())
    }

    /// Applies a table record: when it is made (`replayed` None) or replayed from log block
    /// `replayed`. A record of a layer no longer known is skipped: the checkpoint that removed
    /// the layer wrote the tables the record changed before the layer table.
    pub(super) async fn apply_table_op(&self, op: TableOp, replayed: Option<u64>) -> Result<(), MapError> {
        let (layer, page, pool) = match op {
            TableOp::Own { from, to, page, pool, .. } => {
                if replayed.is_some() {
                    self.saw_layer(from);
                    self.saw_layer(to);
                    let l = self.snap.layers.lock();
                    if !l.snaps.iter().any(|s| s.record.id == from)
                        || !l.snaps.iter().any(|s| s.record.id == to)
                    {
                        return Ok(());
                    }
                }
                (from, page, pool)
            }
            TableOp::Drop { layer, page, pool } => {
                if replayed.is_some() {
                    self.saw_layer(layer);
                    if self.snap.layers.lock().layer(layer).is_none() {
                        return Ok(());
                    }
                }
                (layer, page, pool)
            }
        };
        if let TableOp::Own { to, table, .. } = op {
            let (key, ts) = self.table_for(to, page, table, replayed.is_some()).await?.expect("known layer");
            ts.page().entries.lock()[table_slot(page)] = pool;
            self.snap.tables.mark_dirty(key, &ts);
            if let Some(copy) = self.cache.peek(POOL_KEY | u64::from(pool)) {
                copy.page().owner.store(to, SeqCst);
                self.cache.mark_dirty(POOL_KEY | u64::from(pool), &copy);
            }
        }
        let table = {
            let l = self.snap.layers.lock();
            l.layer(layer).expect("known layer").dir[table_index(page)]
        };
        if table != 0 {
            let ts = self.table_page(table, layer, (table_index(page) * INDEX_ENTRIES) as u64).await?;
            let mut entries = ts.page().entries.lock();
            if entries[table_slot(page)] == pool {
                entries[table_slot(page)] = 0;
                drop(entries);
                self.snap.tables.mark_dirty(u64::from(table), &ts);
            }
        }
        if let TableOp::Drop { .. } = op {
            // The log block of the record: a checkpoint whose replay starts past it is past
            // every record naming the copy.
            let after = match replayed {
                Some(seq) => seq,
                None => self.log.lock().await.next_seq.saturating_sub(1),
            };
            let mut l = self.snap.layers.lock();
            // Not in use after a checkpoint that did not finish wrote the table without it.
            if l.pool.is_used(pool) && !l.pool.is_released(pool) {
                l.pool.release(pool, after);
            }
            drop(l);
            self.cache.forget(POOL_KEY | u64::from(pool));
        }
        Ok(())
    }

    /// Queues `deltas` and makes them durable (the caller holds `checkpointing`): a checkpoint
    /// first if the log ring has no room for them, so none runs between their log write and
    /// their apply.
    async fn log_held(&self, deltas: Vec<super::Delta>) -> Result<(), MapError> {
        let n = deltas.len();
        let mut deltas = Some(deltas);
        loop {
            let mut log = self.log.lock().await;
            if self.failed.load(SeqCst) {
                return Err(MapError::Failed);
            }
            let ticket = {
                let mut p = self.pending.lock();
                let blocks = (p.deltas.len() + n).div_ceil(super::DELTAS_PER_LOG_BLOCK) as u64;
                if log.next_seq - log.replay_seq + blocks <= self.layout.log_blocks {
                    for d in deltas.take().expect("queued once") {
                        p.push(d);
                    }
                    Some(p.queued)
                } else if log.next_seq == log.replay_seq {
                    return Err(layers_error(format!(
                        "{blocks} log blocks of records do not fit the map log"
                    )));
                } else {
                    None
                }
            };
            let Some(ticket) = ticket else {
                drop(log);
                self.write_back().await?;
                continue;
            };
            if let Err(e) = self.write_pending(&mut log).await {
                self.failed.store(true, SeqCst);
                return Err(e);
            }
            assert!(log.durable >= ticket, "records that fit the ring were logged");
            return Ok(());
        }
    }

    /// Removes hidden snapshot `layer`, whose copies were all handed on or dropped: its index
    /// pages go back to the pool after the checkpoint that writes the layer table without it.
    /// If it was the newest, the next older one is now the one preserves go to.
    async fn remove_layer(&self, layer: u16) -> Result<(), MapError> {
        let (newest, older) = {
            let l = self.snap.layers.lock();
            match l.snaps.iter().position(|s| s.record.id == layer) {
                Some(k) => (
                    k + 1 == l.snaps.len(),
                    k.checked_sub(1).map(|i| (l.snaps[i].record.id, l.snaps[i].dir.clone())),
                ),
                None => (false, None), // a clone
            }
        };
        let mut bits = vec![0u64; self.snap.preserved.len()];
        if let (true, Some((id, dir))) = (newest, &older) {
            for (ti, &t) in dir.iter().enumerate() {
                if t == 0 {
                    continue;
                }
                let ts = self.table_page(t, *id, (ti * INDEX_ENTRIES) as u64).await?;
                for (k, &p) in ts.page().entries.lock().iter().enumerate() {
                    if p != 0 {
                        let page = ti * INDEX_ENTRIES + k;
                        bits[page / 64] |= 1 << (page % 64);
                    }
                }
            }
        }
        let _one = self.checkpointing.lock().await;
        // The last log block written: every record naming the layer's pages is in it or before.
        let after = self.log.lock().await.next_seq.saturating_sub(1);
        {
            let mut l = self.snap.layers.lock();
            let s = match l.snaps.iter().position(|s| s.record.id == layer) {
                Some(k) => l.snaps.remove(k),
                None => {
                    let k = l.clones.iter().position(|c| c.record.id == layer).expect("known layer");
                    l.clones.remove(k)
                }
            };
            for &t in s.dir.iter().filter(|&&t| t != 0) {
                self.snap.tables.forget(u64::from(t));
                l.pool.release(t, after);
            }
            for &p in s.dir_pages.iter().chain([&s.record.root_page]) {
                l.pool.release(p, after);
            }
            l.records_dirty = true;
            if newest {
                for (w, b) in self.snap.preserved.iter().zip(bits) {
                    w.store(b, SeqCst);
                }
            }
        }
        self.snap.generation.fetch_add(1, SeqCst);
        self.write_back().await
    }
}

impl<D: BlockDevice> MapStore<D> {
    /// The head pages changed since snapshot `layer` was made: those it or a newer snapshot
    /// owns a copy of (every change after it was made copied the page into the newest first).
    pub async fn changed_since(&self, layer: u16) -> Result<Vec<u64>, MapError> {
        let snaps: Vec<(u16, Vec<u32>)> = {
            let l = self.snap.layers.lock();
            let k = l.visible(layer)?;
            l.snaps[k..].iter().map(|s| (s.record.id, s.dir.clone())).collect()
        };
        let mut pages = BTreeSet::new();
        for (id, dir) in snaps {
            for (ti, &t) in dir.iter().enumerate() {
                if t == 0 {
                    continue;
                }
                pages.extend(self.owned_in_table(id, t, ti).await?.into_iter().map(|(page, _)| page));
            }
        }
        Ok(pages.into_iter().collect())
    }

    /// The snapshot a rollback of the head began to and did not finish, if any.
    pub fn rollback_pending(&self) -> Option<u16> {
        self.snap.layers.lock().head.as_ref().map(|h| h.rollback_to).filter(|&t| t != 0)
    }

    /// Records durably that the head is being rolled back to snapshot `layer` (0: that it is
    /// done): open finishes a rollback a crash cut short.
    pub async fn mark_rollback(&self, layer: u16) -> Result<(), MapError> {
        {
            let mut l = self.snap.layers.lock();
            if layer != 0 && !l.snaps.iter().any(|s| s.record.id == layer && !s.record.hidden) {
                return Err(layers_error(format!("no snapshot with layer id {layer}")));
            }
            if layer != 0 && l.snaps.last().is_some_and(|s| s.record.id != layer) {
                return Err(layers_error(
                    "a deleted snapshot that is kept for its clones is newer: a rollback goes only to the newest",
                ));
            }
            let head = l.head.as_mut().ok_or_else(|| layers_error("the volume has no snapshot"))?;
            head.rollback_to = layer;
            l.records_dirty = true;
        }
        self.checkpoint().await
    }
}

/// Clones (docs/design/snapshots.md, "Clone"): a writable layer over a snapshot. Its own pages
/// are pool pages indexed like a snapshot's; a page it never changed it reads through its parent
/// snapshot's view. Rules on top of the snapshots':
/// 8. A clone's first change of a page copies its parent's view of that page into a new pool
///    page it owns, under the same locks as the change, logged as a copy record exactly like a
///    preserve (the copy is written before the record; replay takes it from there).
/// 9. A clone's overwrite frees the place it replaces unless its parent's view holds it (the
///    only other layer that can: its new places are its own, its old ones came from the view).
/// 10. A snapshot with clones is only hidden when deleted: its pages stay until its last clone
///    is deleted, whose delete then finishes it. The head's holders are unchanged: a place a
///    clone took from its parent's view is held by that snapshot's chain as long as it lives.
impl<D: BlockDevice> MapStore<D> {
    /// The newest snapshot, a deleted one kept for its clones included.
    pub fn newest_snapshot(&self) -> Option<LayerRecord> {
        self.snap.layers.lock().snaps.last().map(|s| s.record.clone())
    }

    /// The record of snapshot or clone `id`, hidden ones too.
    pub fn layer_record(&self, id: u16) -> Option<LayerRecord> {
        self.snap.layers.lock().layer(id).map(|s| s.record.clone())
    }

    /// The clones (deleted ones whose delete has not finished are left out).
    pub fn clones(&self) -> Vec<LayerRecord> {
        self.snap.layers.lock().clones.iter().filter(|c| !c.record.hidden).map(|c| c.record.clone()).collect()
    }

    /// Makes clone `record` of snapshot `parent` and returns its id once durable. It reads as
    /// the snapshot until written; no page is copied until then.
    pub async fn create_clone(&self, parent: u16, record: LayerRecord) -> Result<u16, MapError> {
        self.pool_layout()?;
        let _gate = self.snap.gate.write().await;
        let tables = self.layout.pages().div_ceil(INDEX_ENTRIES as u64) as usize;
        let id = {
            let mut l = self.snap.layers.lock();
            l.visible(parent)?;
            let clone = l.new_layer(record, LayerKind::Clone, parent, tables)?;
            let id = clone.record.id;
            l.clones.push(clone);
            id
        };
        let _one = self.checkpointing.lock().await;
        self.write_back().await?;
        Ok(id)
    }

    /// Applies host writes (unconditional updates) to clone `layer` and makes them durable.
    /// Returns per update the entry it replaced, or [`MapEntry::UNALLOCATED`] where the
    /// clone's parent still holds it (rule 9). Moves go through [`MapStore::update`], which
    /// moves every holder, clones included.
    pub async fn update_clone(
        &self,
        layer: u16,
        updates: &[Update],
    ) -> Result<Vec<Option<MapEntry>>, MapError> {
        assert!(updates.iter().all(|u| u.expect.is_none()), "a clone's own updates are host writes");
        if let Some(u) = updates.iter().find(|u| u.block >= self.layout.blocks) {
            return Err(MapError::OutOfRange { block: u.block, blocks: self.layout.blocks });
        }
        let gate = self.snap.gate.read().await;
        let mut pins = Vec::new();
        let (applied, ticket) = loop {
            let needs = {
                let mut pending = self.pending.lock();
                let mut layers = self.snap.layers.lock();
                match self.apply_to_clone(&mut pending, &mut layers, layer, updates)? {
                    Ok(applied) => break (applied, pending.queued),
                    Err(needs) => needs,
                }
            };
            pins.extend(self.load_needs(needs).await?);
        };
        drop(pins);
        drop(gate);
        self.commit(ticket).await?;
        self.after_update().await?;
        Ok(applied)
    }

    /// The resident page that is snapshot `snaps[0]`'s view of head page `page` (a copy of it
    /// or of a newer snapshot, else the head's page); `None` with what to load in `needs`.
    fn view_page_now(
        &self,
        snaps: &[Snap],
        page: u64,
        needs: &mut Vec<Need>,
        held: &mut Vec<Pin>,
    ) -> Option<(u64, Arc<Slot<MapPage>>)> {
        for s in snaps {
            let had = needs.len();
            if let Some(own) = self.own_page_now(s, page, needs, held) {
                return Some(own);
            }
            if needs.len() > had {
                return None;
            }
        }
        match self.cache.peek(page) {
            Some(slot) => {
                held.push(Pin::Map(Arc::clone(&slot)));
                Some((page, slot))
            }
            None => {
                needs.push(Need::Head { page });
                None
            }
        }
    }

    /// [`MapStore::update_clone`]'s apply, with `pending` and `layers` locked: `Ok(Err(needs))`
    /// when pages must be loaded first (nothing was applied).
    fn apply_to_clone(
        &self,
        pending: &mut Pending,
        layers: &mut Layers,
        layer: u16,
        updates: &[Update],
    ) -> Result<Result<Vec<Option<MapEntry>>, Vec<Need>>, MapError> {
        let ci = layers
            .clones
            .iter()
            .position(|c| c.record.id == layer && !c.record.hidden)
            .ok_or_else(|| layers_error(format!("no clone with layer id {layer}")))?;
        let parent = layers.clones[ci].record.parent;
        let k = layers.snaps.iter().position(|s| s.record.id == parent).expect("a clone's parent is kept");
        // 1. Everything needed is resident, and the pool has room, before anything changes.
        let mut needs = Vec::new();
        let mut held = Vec::new();
        let mut new_pages = BTreeSet::new();
        let mut new_tables = BTreeSet::new();
        for u in updates {
            let page = u.block / ENTRIES_PER_PAGE;
            self.view_page_now(&layers.snaps[k..], page, &mut needs, &mut held);
            let had = needs.len();
            let c = &layers.clones[ci];
            if self.own_page_now(c, page, &mut needs, &mut held).is_none() && needs.len() == had {
                new_pages.insert(page);
                if c.dir[table_index(page)] == 0 {
                    new_tables.insert(table_index(page));
                }
            }
        }
        if !needs.is_empty() {
            return Ok(Err(needs));
        }
        room_for(&layers.pool, new_pages.len() + new_tables.len())?;
        // 2. Apply, in order.
        let mut applied = Vec::with_capacity(updates.len());
        for u in updates {
            let page = u.block / ENTRIES_PER_PAGE;
            let at = (u.block % ENTRIES_PER_PAGE) as usize;
            let (_, view) =
                self.view_page_now(&layers.snaps[k..], page, &mut needs, &mut held).expect("resident, held");
            let view_entry = view.page().entries.lock()[at];
            let (key, own) = match self.own_page_now(&layers.clones[ci], page, &mut needs, &mut held) {
                Some(own) => own,
                None => {
                    let entries = view.page().entries.lock().clone();
                    let Layers { clones, pool, .. } = &mut *layers;
                    self.copy_page(pending, &mut clones[ci], pool, page, &entries);
                    self.own_page_now(&layers.clones[ci], page, &mut needs, &mut held)
                        .expect("the copy just made is resident")
                }
            };
            let mut e = own.page().entries.lock();
            let before = e[at];
            e[at] = u.entry;
            drop(e);
            self.cache.mark_dirty(key, &own);
            pending.push(super::Delta::entry(layer, key, u.block, u.entry, before));
            applied.push(Some(if view_entry == before { MapEntry::UNALLOCATED } else { before }));
        }
        assert!(needs.is_empty(), "pages found resident above stay resident while held");
        Ok(Ok(applied))
    }

    /// Deletes clone `layer`: its copies are dropped (a table record each, 128 to a log write)
    /// and `on_free` gets the entries its parent's view does not hold. If its parent was
    /// deleted and kept only for clones and this was the last, the parent's delete is finished
    /// too. No data is copied; writes to the family wait while it runs.
    pub async fn delete_clone(
        &self,
        layer: u16,
        mut on_free: impl FnMut(Vec<(u64, MapEntry)>),
    ) -> Result<DeleteStats, MapError> {
        self.pool_layout()?;
        let _gate = self.snap.gate.write().await;
        {
            let mut l = self.snap.layers.lock();
            let c = l
                .clones
                .iter_mut()
                .find(|c| c.record.id == layer && !c.record.hidden)
                .ok_or_else(|| layers_error(format!("no clone with layer id {layer}")))?;
            c.record.hidden = true;
            l.records_dirty = true;
        }
        // Durable before any copy is dropped: open finishes a delete a crash cut short.
        self.checkpoint().await?;
        self.drop_clone(layer, &mut on_free).await
    }

    /// Drops every copy of hidden clone `layer`, removes it, and finishes its parent's delete if
    /// that waited for it (the caller holds the gate).
    async fn drop_clone(
        &self,
        layer: u16,
        on_free: &mut impl FnMut(Vec<(u64, MapEntry)>),
    ) -> Result<DeleteStats, MapError> {
        let (dir, parent) = {
            let l = self.snap.layers.lock();
            let c = l.clones.iter().find(|c| c.record.id == layer).expect("known clone");
            (c.dir.clone(), c.record.parent)
        };
        let mut stats = self.let_go(layer, &dir, LetGo::DropClone { parent }, on_free).await?;
        self.remove_layer(layer).await?;
        let finish_parent = {
            let l = self.snap.layers.lock();
            l.snaps.iter().any(|s| s.record.id == parent && s.record.hidden) && !l.has_clones(parent)
        };
        if finish_parent {
            let more = self.hand_on(parent, on_free).await?;
            stats.pages_moved += more.pages_moved;
            stats.pages_dropped += more.pages_dropped;
            stats.entries_freed += more.entries_freed;
        }
        Ok(stats)
    }

    /// What deleting clone `layer` does with its copy `pool` of page `page`: drops it, adding
    /// to `freed` the entries its parent's view does not hold (rule 9).
    async fn drop_clone_page(
        &self,
        layer: u16,
        parent: u16,
        page: u64,
        pool: u32,
        freed: &mut Vec<(u64, MapEntry)>,
    ) -> Result<TableOp, MapError> {
        let copy = self.pool_page(pool, layer, page).await?.page().entries.lock().clone();
        let view = self.view_from(parent, page).await?;
        for (i, x) in copy.iter().enumerate() {
            let physical = matches!(x.place, super::Place::Segment(_) | super::Place::Cache(_));
            if physical && view[i].place != x.place {
                freed.push((page * ENTRIES_PER_PAGE + i as u64, *x));
            }
        }
        Ok(TableOp::Drop { layer, page, pool })
    }

    /// Snapshot `layer`'s view of head page `page` (hidden ones too).
    async fn view_from(&self, layer: u16, page: u64) -> Result<Box<[MapEntry]>, MapError> {
        if let Some((_, own)) = self.own_copy(layer, page).await? {
            return Ok(own.page().entries.lock().clone());
        }
        self.view_after(layer, page).await
    }
}

/// What a delete does with each copy a layer owns.
#[derive(Debug, Clone, Copy)]
enum LetGo {
    /// A snapshot's: hand it to `older` (the next older snapshot) if that one has none, else drop it.
    HandOn { older: Option<u16> },
    /// A clone's: drop it (what `parent`'s view does not hold is freed).
    DropClone { parent: u16 },
}

/// A page an update holds (only held: a held page cannot be evicted) from when it was loaded
/// until the update applied.
pub(super) enum Pin {
    Table(#[expect(dead_code, reason = "held, never read")] Arc<Slot<TablePage>>),
    Map(#[expect(dead_code, reason = "held, never read")] Arc<Slot<MapPage>>),
}

/// The bytes of a preserve record: (block field, 16 bytes).
pub(super) fn encode_preserve(layer: u16, page: u64, pool: u32, table: u32) -> (u64, [u8; 16]) {
    let mut b = [0u8; 16];
    b[0..8].copy_from_slice(&page.to_le_bytes());
    b[8..12].copy_from_slice(&pool.to_le_bytes());
    b[12..16].copy_from_slice(&table.to_le_bytes());
    (CONTROL_TAG << 48 | OP_PRESERVE << 32 | u64::from(layer), b)
}

/// A change to the snapshots' tables made by a delete: logged, durable, then applied (an
/// assignment, so replaying it twice is harmless).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TableOp {
    /// Snapshot `to` (the next older) takes over `from`'s copy of head page `page`, pool page
    /// `pool`, with table page `table` made for it if it has none there (else 0).
    Own { from: u16, to: u16, page: u64, pool: u32, table: u32 },
    /// Snapshot `layer` lets go of its copy of head page `page`, pool page `pool`.
    Drop { layer: u16, page: u64, pool: u32 },
}

/// The bytes of a table record: (block field, 16 bytes).
pub(super) fn encode_table_op(op: TableOp) -> (u64, [u8; 16]) {
    let mut b = [0u8; 16];
    let (field, page, pool, table) = match op {
        TableOp::Own { from, to, page, pool, table } => {
            (OP_OWN << 32 | u64::from(to) << 16 | u64::from(from), page, pool, table)
        }
        TableOp::Drop { layer, page, pool } => (OP_DROP << 32 | u64::from(layer), page, pool, 0),
    };
    b[0..8].copy_from_slice(&page.to_le_bytes());
    b[8..12].copy_from_slice(&pool.to_le_bytes());
    b[12..16].copy_from_slice(&table.to_le_bytes());
    (CONTROL_TAG << 48 | field, b)
}

/// A decoded log record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Record {
    Entry { layer: u16, block: u64, entry: MapEntry },
    Preserve { layer: u16, page: u64, pool: u32, table: u32 },
    Table(TableOp),
}

pub(super) fn decode_record(field: u64, b: &[u8]) -> Option<Record> {
    let tag = field >> 48;
    if tag != CONTROL_TAG {
        return Some(Record::Entry {
            layer: tag as u16,
            block: field & BLOCK_MASK,
            entry: MapEntry::decode(b),
        });
    }
    let page = u64::from_le_bytes(b[0..8].try_into().expect("8 bytes"));
    let pool = u32::from_le_bytes(b[8..12].try_into().expect("4 bytes"));
    let table = u32::from_le_bytes(b[12..16].try_into().expect("4 bytes"));
    match (field >> 32) & 0xFFFF {
        OP_PRESERVE => Some(Record::Preserve { layer: field as u16, page, pool, table }),
        OP_OWN => Some(Record::Table(TableOp::Own {
            from: field as u16,
            to: (field >> 16) as u16,
            page,
            pool,
            table,
        })),
        OP_DROP => Some(Record::Table(TableOp::Drop { layer: field as u16, page, pool })),
        _ => None,
    }
}
