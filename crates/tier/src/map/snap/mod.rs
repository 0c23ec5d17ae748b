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
//!
//! Files, by concern: `load` (the layer table, directories and tables read at open; table and
//! pool pages loaded for an update), `preserve` (head updates with snapshots: preserves and
//! moves of every holder; making a snapshot), `view` (reads through the layers, holders),
//! `write_back` (what a checkpoint writes for the layers), `replay`, `delete`, `rollback`,
//! `clone`, `record` (the layers' log records).

mod clone;
mod delete;
mod load;
mod preserve;
mod record;
mod replay;
mod rollback;
mod view;
mod write_back;

pub use delete::DeleteStats;
pub(in crate::map) use record::{Record, TableOp, decode_record, encode_preserve, encode_table_op};

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

use stria_dev::{BLOCK_BYTES, BlockDevice};
use stria_engine::pagecache::{PageCache, Slot};

use super::{ENTRIES_PER_PAGE, MapError, MapPage, MapStore};
use crate::layers::{INDEX_ENTRIES, LAYER_TABLE_BLOCKS, LayerKind, LayerRecord, MAX_LAYERS, PagePool};

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
/// Most frozen layers (snapshots of clones) under a clone: a read of a page the clone has not
/// changed looks through each of them (docs/design/snapshots.md, "Snapshots, rollback and
/// clones of a clone").
pub(super) const MAX_FROZEN_DEPTH: usize = 16;

/// Where a family's layer table and page pool are in the map's backing volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolLayout {
    /// Byte offset of the layer table (`LAYER_TABLE_BLOCKS` blocks).
    pub layers_at: u64,
    /// Byte offset of pool page 0 (page 0 itself is never used).
    pub pages_at: u64,
    /// Pages of the pool.
    pub pages: u32,
    /// Where the pages lie when the pool grew in pieces (log volume format 4); else from
    /// `pages_at` on.
    pub runs: Option<super::Runs>,
}

impl PoolLayout {
    /// Bytes from `layers_at` to the end of the pool.
    pub fn bytes(&self) -> u64 {
        (LAYER_TABLE_BLOCKS as u64 + u64::from(self.pages)) * BLOCK_BYTES
    }

    /// Byte offset where the last of the layer table and the pages ends.
    pub fn end(&self) -> u64 {
        let table = self.layers_at + LAYER_TABLE_BLOCKS as u64 * BLOCK_BYTES;
        match &self.runs {
            Some(runs) => {
                runs.spans(u64::from(self.pages)).iter().map(|s| s.1).max().unwrap_or(table).max(table)
            }
            None => self.layers_at + self.bytes(),
        }
    }

    pub(super) fn page_offset(&self, page: u64) -> u64 {
        match &self.runs {
            Some(runs) => runs.offset(page),
            None => self.pages_at + page * BLOCK_BYTES,
        }
    }

    /// How many pool pages from `page` on (at most `most`) lie one after another.
    pub(super) fn contiguous(&self, page: u64, most: u64) -> u64 {
        self.runs.as_ref().map_or(most, |r| r.contiguous(page, most))
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
    /// Clones (writable layers over a snapshot or a frozen layer: their pages are copies, like
    /// a snapshot's, of their own changed pages; the rest they read through their parent) and
    /// frozen layers (a clone's snapshots: read-only, with a parent as a clone has).
    clones: Vec<Snap>,
    pool: PagePool,
    records_dirty: bool,
    /// The next layer id to give out: ids are not reused while the log may hold records of a
    /// deleted layer (past ids seen in the layer table and in replayed records).
    next_id: u16,
    /// The snapshot whose copies a delete is handing on, batch by batch, while writes go on
    /// (in memory only: open finishes a cut delete before any write). While it is the newest,
    /// head writes preserve into the next older one instead ([`Layers::preserve_target`]).
    deleting: Option<u16>,
}

/// Snapshot state of a [`MapStore`].
#[derive(Debug)]
pub(super) struct SnapState {
    pub(super) layers: parking_lot::Mutex<Layers>,
    pub(super) tables: PageCache<TablePage>,
    /// Updates hold it shared from finding their pages to applying them; making a snapshot holds
    /// it alone, so no update is half applied when the snapshot is made, and so does each batch
    /// of a snapshot or clone delete.
    pub(super) gate: tokio::sync::RwLock<()>,
    /// Bit per head page: the newest snapshot owns a copy of it, or, while the newest is being
    /// deleted, it or the snapshot preserves go to meanwhile does (longer when the map grows).
    preserved: parking_lot::RwLock<Vec<AtomicU64>>,
    /// Pages a delete hands on or drops per batch: writes wait for one batch, not the delete.
    pub(super) delete_batch: std::sync::atomic::AtomicUsize,
    /// Raised when a snapshot is made: a view read that began before re-resolves.
    generation: AtomicU64,
    /// The head's record is hidden (the origin was deleted for its clones): kept apart from the
    /// record so that every host write can ask without taking the layers' lock.
    pub(super) head_deleted: std::sync::atomic::AtomicBool,
    /// Set when the volume closes: a delete stops before its next batch ([`MapError::Stopped`]).
    pub(super) deletes_stopped: std::sync::atomic::AtomicBool,
    /// Tests hold a table or pool page load here, between its read and its insert.
    #[cfg(test)]
    pub(in crate::map) load_hold: stria_engine::pagecache::LoadHold,
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

    /// The index of the snapshot a head write preserves a page into before its first change:
    /// the newest; while the newest is being deleted, the next older one (whose view the page
    /// then is, exactly: neither owns it, so both read the head); `None` when no snapshot would
    /// see the change.
    pub(super) fn preserve_target(&self) -> Option<usize> {
        let newest = self.snaps.len().checked_sub(1)?;
        if self.deleting == Some(self.snaps[newest].record.id) { newest.checked_sub(1) } else { Some(newest) }
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
            LayerKind::Clone | LayerKind::Frozen => ("clone or snapshot", &self.clones),
            _ => ("snapshot", &self.snaps),
        };
        let alike = |s: &&Snap| {
            s.record.kind == kind && (kind != LayerKind::Frozen || s.record.of_clone == record.of_clone)
        };
        if let Some(same) =
            same.iter().filter(alike).find(|s| s.record.name == record.name && !s.record.hidden)
        {
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
        assert!(
            self.snaps.iter().chain(&self.clones).all(|s| s.record.id != id) && id > HEAD_LAYER,
            "layer id {id} given out twice"
        );
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

    /// Whether snapshot or frozen layer `id` has layers over it: clones, or a frozen layer
    /// (deleted ones whose delete has not finished included).
    fn has_clones(&self, id: u16) -> bool {
        self.clones.iter().any(|c| c.record.parent == id)
    }

    /// The clones and frozen layers whose parent is `id`.
    fn children(&self, id: u16) -> Vec<u16> {
        self.clones.iter().filter(|c| c.record.parent == id).map(|c| c.record.id).collect()
    }

    /// Clone `layer`, unless it is unknown or being deleted.
    fn live_clone(&mut self, layer: u16) -> Result<&mut Snap, MapError> {
        self.clones
            .iter_mut()
            .find(|c| c.record.id == layer && c.record.kind == LayerKind::Clone && !c.record.hidden)
            .ok_or_else(|| layers_error(format!("no clone with layer id {layer}")))
    }

    /// The frozen layers under clone or frozen layer `id`, nearest first (indexes into
    /// `clones`), and the index of the snapshot of the head they rest on: what `id` reads
    /// through for a page it has no copy of.
    fn chain_below(&self, id: u16) -> (Vec<usize>, usize) {
        let mut frozen = Vec::new();
        let mut parent = self.clones.iter().find(|c| c.record.id == id).expect("a known clone").record.parent;
        while let Some(i) = self.clones.iter().position(|c| c.record.id == parent) {
            frozen.push(i);
            parent = self.clones[i].record.parent;
        }
        let k = self.snaps.iter().position(|s| s.record.id == parent).expect("a chain rests on a snapshot");
        (frozen, k)
    }

    /// A layer a clone may be made of: a snapshot or a frozen layer, not being deleted.
    fn clone_parent(&self, layer: u16) -> Result<(), MapError> {
        let frozen = self
            .clones
            .iter()
            .any(|c| c.record.id == layer && c.record.kind == LayerKind::Frozen && !c.record.hidden);
        if frozen { Ok(()) } else { self.visible(layer).map(|_| ()) }
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
                deleting: None,
            }),
            tables: PageCache::new((cache_pages / 16).max(4)),
            gate: tokio::sync::RwLock::new(()),
            preserved: parking_lot::RwLock::new(
                (0..head_pages.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
            ),
            generation: AtomicU64::new(0),
            head_deleted: std::sync::atomic::AtomicBool::new(false),
            deletes_stopped: std::sync::atomic::AtomicBool::new(false),
            delete_batch: std::sync::atomic::AtomicUsize::new(HAND_ON_BATCH),
            #[cfg(test)]
            load_hold: stria_engine::pagecache::LoadHold::default(),
        }
    }

    fn is_preserved(&self, page: u64) -> bool {
        self.preserved.read()[(page / 64) as usize].load(SeqCst) >> (page % 64) & 1 == 1
    }

    fn set_preserved(&self, page: u64) {
        self.preserved.read()[(page / 64) as usize].fetch_or(1 << (page % 64), SeqCst);
    }

    fn clear_preserved(&self, page: u64) {
        self.preserved.read()[(page / 64) as usize].fetch_and(!(1 << (page % 64)), SeqCst);
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
        self.layout()
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
    pub fn grow_pool(&self, pages: u32, runs: Option<super::Runs>) {
        let mut l = self.snap.layers.lock();
        if pages > l.pool.pages() {
            let mut layout = self.layout.write();
            if let Some(pl) = layout.pool.as_mut() {
                pl.pages = pages;
                pl.runs = runs;
            }
            l.pool.grow(pages);
        }
    }

    /// Whether the map has snapshots or clones (hidden ones too).
    pub fn has_layers(&self) -> bool {
        let l = self.snap.layers.lock();
        !l.snaps.is_empty() || !l.clones.is_empty()
    }

    /// Whether the map can grow to `blocks` with the snapshots and clones it has: each one's
    /// directory pages (fixed when it was made) must reach the table pages of the new head
    /// pages (one directory page reaches 1,016 x 1,016 head pages: 263 M blocks, about 1 TiB).
    pub fn can_grow_to(&self, blocks: u64) -> Result<(), String> {
        let tables = blocks.div_ceil(ENTRIES_PER_PAGE).div_ceil(INDEX_ENTRIES as u64);
        let l = self.snap.layers.lock();
        match l.snaps.iter().chain(&l.clones).find(|s| (s.dir_pages.len() * INDEX_ENTRIES) < tables as usize)
        {
            Some(s) => Err(format!(
                "snapshot or clone {:?} was made with an index that reaches {} blocks",
                s.record.name,
                s.dir_pages.len() as u64 * INDEX_ENTRIES as u64 * INDEX_ENTRIES as u64 * ENTRIES_PER_PAGE
            )),
            None => Ok(()),
        }
    }

    /// Maps `blocks` blocks from now on, its head pages where `head` says (pages past the old
    /// end read as never written until written). With snapshots or clones only a growth
    /// ([`MapStore::can_grow_to`] checked first): their directories reach the new pages (no
    /// table yet: a change to a new page preserves it, empty, into the newest snapshot, and
    /// each layer still reads only up to its own size). The caller has made the backing volume
    /// hold the pages and the header that says where they are durable, and holds
    /// [`MapStore::hold_checkpoints`] across both. A map that shrinks keeps its pages past the
    /// new end (the caller cleared their blocks and checkpointed first: no delta names them).
    pub fn resize(&self, blocks: u64, head: Option<super::Runs>) {
        let tables = blocks.div_ceil(ENTRIES_PER_PAGE).div_ceil(INDEX_ENTRIES as u64) as usize;
        {
            let mut l = self.snap.layers.lock();
            if !l.snaps.is_empty() || !l.clones.is_empty() {
                assert!(blocks >= self.blocks(), "a map with snapshots or clones only grows");
                let Layers { snaps, clones, .. } = &mut *l;
                for s in snaps.iter_mut().chain(clones.iter_mut()) {
                    assert!(s.dir_pages.len() * INDEX_ENTRIES >= tables, "growth checked by can_grow_to");
                    if s.dir.len() < tables {
                        s.dir.resize(tables, 0);
                    }
                }
            }
        }
        let mut layout = self.layout.write();
        layout.blocks = blocks;
        layout.head = head;
        let words = layout.pages().div_ceil(64) as usize;
        let mut preserved = self.snap.preserved.write();
        while preserved.len() < words {
            preserved.push(AtomicU64::new(0));
        }
        self.blocks.store(blocks, SeqCst);
    }

    /// Holds off checkpoints (one runs at a time) until the guard drops.
    pub async fn hold_checkpoints(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.checkpointing.lock().await
    }
}

/// A page an update holds (only held: a held page cannot be evicted) from when it was loaded
/// until the update applied.
pub(super) enum Pin {
    Table(#[expect(dead_code, reason = "held, never read")] Arc<Slot<TablePage>>),
    Map(#[expect(dead_code, reason = "held, never read")] Arc<Slot<MapPage>>),
}

#[cfg(test)]
impl<D: BlockDevice> MapStore<D> {
    /// The table page layer `layer` has for head page `page` (0: none).
    pub(in crate::map) fn table_of(&self, layer: u16, page: u64) -> u32 {
        self.snap.layers.lock().layer(layer).expect("a known layer").dir[table_index(page)]
    }
}
