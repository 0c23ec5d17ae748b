//! Loading the layers: the layer table, directories and tables at open, and the table and
//! pool pages an update or a read needs (cached in the map's caches).

use std::sync::Arc;
use std::sync::atomic::Ordering::SeqCst;

use stria_dev::{BLOCK_USIZE, BlockDevice};
use stria_engine::pagecache::Slot;

use super::{
    HEAD_LAYER, Layers, Need, POOL_KEY, Pin, Snap, TablePage, layers_error, table_index, table_slot,
};
use crate::layers::{
    INDEX_ENTRIES, IndexLevel, IndexPage, LAYER_TABLE_BLOCKS, LayerKind, LayerRecord, PagePool,
    decode_layer_table,
};
use crate::map::{ENTRIES_PER_PAGE, MapError, MapPage, MapStore};

impl<D: BlockDevice> MapStore<D> {
    /// Reads the layer table, the snapshots' and clones' directories and tables (at open,
    /// before replay), rebuilding which pool pages are in use and which head pages the newest
    /// snapshot owns.
    pub(in crate::map) async fn load_layers(&self) -> Result<(), MapError> {
        let Some(pl) = self.layout().pool else { return Ok(()) };
        let bytes = self.vol.read(pl.layers_at, LAYER_TABLE_BLOCKS * BLOCK_USIZE).await?;
        let records = decode_layer_table(&bytes).map_err(layers_error)?;
        let head = records.iter().find(|r| r.kind == LayerKind::Head).cloned();
        let mut snap_records: Vec<LayerRecord> = records
            .iter()
            .filter(|r| r.kind == LayerKind::Snapshot && r.parent == HEAD_LAYER)
            .cloned()
            .collect();
        snap_records.sort_by_key(|r| r.created_seq);
        let mut clone_records: Vec<LayerRecord> =
            records.into_iter().filter(|r| matches!(r.kind, LayerKind::Clone | LayerKind::Frozen)).collect();
        // A frozen layer nothing is over that is not being deleted: a snapshot of a clone whose
        // making a crash cut between its two checkpoints. The clone still names every copy the
        // frozen layer's tables do: the frozen layer is left out, untouched (docs/design/
        // snapshots.md, "Snapshots, rollback and clones of a clone").
        let orphans: Vec<u16> = clone_records
            .iter()
            .filter(|r| r.kind == LayerKind::Frozen && !r.hidden)
            .filter(|r| !clone_records.iter().any(|o| o.parent == r.id))
            .map(|r| r.id)
            .collect();
        clone_records.retain(|r| !orphans.contains(&r.id));
        // Parents first (a clone's parent may be a frozen layer).
        clone_records.sort_by_key(|r| r.created_seq);
        let mut used = Vec::new();
        let mut copies = Vec::new();
        let mut snaps = Vec::new();
        for record in snap_records {
            snaps.push(self.load_layer(record, &mut used, &mut copies).await?);
        }
        let mut clones = Vec::new();
        for record in &clone_records {
            let known = |id: u16| {
                snaps.iter().any(|s: &Snap| s.record.id == id)
                    || clone_records.iter().any(|o| o.id == id && o.kind == LayerKind::Frozen)
            };
            if !known(record.parent) {
                return Err(layers_error(format!(
                    "clone {:?} (layer {}) names parent snapshot {}, which the layer table does not hold",
                    record.name, record.id, record.parent
                )));
            }
        }
        for record in clone_records {
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
        let next_id = snaps
            .iter()
            .chain(&clones)
            .map(|s| s.record.id)
            .chain(orphans.iter().copied())
            .max()
            .unwrap_or(HEAD_LAYER)
            + 1;
        if !orphans.is_empty() {
            tracing::info!(?orphans, "left out a snapshot of a clone whose making a crash cut short");
        }
        let mut l = self.snap.layers.lock();
        self.snap.head_deleted.store(head.as_ref().is_some_and(|h| h.hidden), SeqCst);
        let records_dirty = !orphans.is_empty();
        *l = Layers { head, snaps, clones, pool, records_dirty, next_id, deleting: None };
        Ok(())
    }

    /// Reads the root, directory and table pages of snapshot or clone `record`, adding its index
    /// pages to `used` and the copies its tables name to `copies`.
    pub(super) async fn load_layer(
        &self,
        record: LayerRecord,
        used: &mut Vec<u32>,
        copies: &mut Vec<u32>,
    ) -> Result<Snap, MapError> {
        let tables_per_snap = self.layout().pages().div_ceil(INDEX_ENTRIES as u64) as usize;
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

    pub(super) async fn read_index(
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
    ///
    /// A miss reads the page and caches it, but only what is still the newest version: loads
    /// of a page go one at a time (a second waits and finds the first's), and a load that a
    /// write-back overlapped reads again, since the page it read may meanwhile have been
    /// changed, written and evicted (a page freed and given out again; a stale slot cached
    /// over it would hide the new copies it names: a layer would read through to its parent).
    pub(super) async fn table_page(
        &self,
        table: u32,
        layer: u16,
        first: u64,
    ) -> Result<Arc<Slot<TablePage>>, MapError> {
        let key = u64::from(table);
        if let Some(Some(slot)) = self.snap.tables.lookup(key, 1).pop() {
            return Ok(slot);
        }
        let _loading = self.loads[(key % crate::map::LOAD_STRIPES as u64) as usize].lock().await;
        loop {
            let ticket = self.snap.tables.load_ticket();
            if let Some(Some(slot)) = self.snap.tables.lookup(key, 1).pop() {
                return Ok(slot);
            }
            let page = self.read_index(table, IndexLevel::Table, layer, first).await?;
            #[cfg(test)]
            self.snap.load_hold.pass().await;
            let tp = TablePage { layer, first, entries: parking_lot::Mutex::new(page.entries) };
            if let Some(mut got) = self.snap.tables.insert_loaded(ticket, vec![(key, tp, false)]) {
                return Ok(got.remove(0).0);
            }
        }
    }

    /// The cached pool page `pool`: `layer`'s copy of head page `page` (a miss is loaded as
    /// [`Self::table_page`] loads one).
    pub(super) async fn pool_page(
        &self,
        pool: u32,
        layer: u16,
        page: u64,
    ) -> Result<Arc<Slot<MapPage>>, MapError> {
        let key = POOL_KEY | u64::from(pool);
        if let Some(Some(slot)) = self.cache.lookup(key, 1).pop() {
            return Ok(slot);
        }
        let pl = self.pool_layout()?;
        let _loading = self.loads[(u64::from(pool) % crate::map::LOAD_STRIPES as u64) as usize].lock().await;
        loop {
            let ticket = self.cache.load_ticket();
            if let Some(Some(slot)) = self.cache.lookup(key, 1).pop() {
                return Ok(slot);
            }
            let bytes = self.vol.read(pl.page_offset(u64::from(pool)), BLOCK_USIZE).await?;
            let entries = crate::map::decode_owned_page(page, &bytes).ok_or_else(|| {
                layers_error(format!(
                    "pool page {pool} (snapshot {layer}'s copy of map page {page}) is damaged"
                ))
            })?;
            #[cfg(test)]
            self.snap.load_hold.pass().await;
            let mp = MapPage { entries: parking_lot::Mutex::new(entries), owner: layer.into(), page };
            if let Some(mut got) = self.cache.insert_loaded(ticket, vec![(key, mp, false)]) {
                return Ok(got.remove(0).0);
            }
        }
    }

    /// Loads what an update needs (its slots are held by the caller until it applied).
    pub(in crate::map) async fn load_needs(&self, needs: Vec<Need>) -> Result<Vec<Pin>, MapError> {
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
    pub(super) fn own_page_now(
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
                // The copy a layer's table names for a head page is a copy of that page: an
                // update through another would change the wrong blocks of the layer.
                assert_eq!(
                    slot.page().page,
                    page,
                    "layer {layer}'s table names pool page {pool} for map page {page}, a copy of map page {}",
                    slot.page().page
                );
                held.push(Pin::Map(Arc::clone(&slot)));
                Some((key, slot))
            }
            None => {
                needs.push(Need::Pool { pool, layer, page });
                None
            }
        }
    }
}
