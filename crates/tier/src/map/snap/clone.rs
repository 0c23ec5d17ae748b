//! Clones (docs/design/snapshots.md, "Clone"): a writable layer over a snapshot. Its own pages
//! are pool pages indexed like a snapshot's; a page it never changed it reads through its parent
//! snapshot's view. Rules on top of the snapshots':
//! 8. A clone's first change of a page copies its parent's view of that page into a new pool
//!    page it owns, under the same locks as the change, logged as a copy record exactly like a
//!    preserve (the copy is written before the record; replay takes it from there).
//! 9. A clone's overwrite frees the place it replaces unless its parent's view holds it (the
//!    only other layer that can: its new places are its own, its old ones came from the view).
//! 10. A snapshot with clones is only hidden when deleted: its pages stay until its last clone
//!    is deleted, whose delete then finishes it. The head's holders are unchanged: a place a
//!    clone took from its parent's view is held by that snapshot's chain as long as it lives.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::Ordering::SeqCst;

use stria_dev::{BLOCK_BYTES, BlockDevice};
use stria_engine::pagecache::Slot;

use super::delete::{DeleteStats, LetGo};
use super::{
    Layers, MAX_FROZEN_DEPTH, Need, POOL_KEY, Pin, Snap, TableOp, TablePage, layers_error, room_for,
    table_index,
};
use crate::layers::{INDEX_ENTRIES, LayerKind, LayerRecord};
use crate::map::{ENTRIES_PER_PAGE, MapEntry, MapError, MapPage, MapStore, Pending, Update};

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
        let l = self.snap.layers.lock();
        l.clones
            .iter()
            .filter(|c| c.record.kind == LayerKind::Clone && !c.record.hidden)
            .map(|c| c.record.clone())
            .collect()
    }

    /// The snapshots of clone `clone` (its frozen layers), oldest first; deleted ones are left
    /// out.
    pub fn clone_snapshots(&self, clone: u16) -> Vec<LayerRecord> {
        let l = self.snap.layers.lock();
        let mut out: Vec<LayerRecord> = l
            .clones
            .iter()
            .filter(|c| c.record.kind == LayerKind::Frozen && c.record.of_clone == clone && !c.record.hidden)
            .map(|c| c.record.clone())
            .collect();
        out.sort_by_key(|r| r.created_seq);
        out
    }

    /// Sets clone `layer`'s size in memory (the next checkpoint makes it durable) and returns
    /// the size it had: at most the map's blocks (a clone grows up to its family's size).
    pub fn set_clone_bytes(&self, layer: u16, bytes: u64) -> Result<u64, MapError> {
        if bytes.div_ceil(BLOCK_BYTES) > self.blocks() {
            return Err(MapError::OutOfRange { block: bytes / BLOCK_BYTES, blocks: self.blocks() });
        }
        let mut l = self.snap.layers.lock();
        let old = std::mem::replace(&mut l.live_clone(layer)?.record.logical_bytes, bytes);
        l.records_dirty = true;
        Ok(old)
    }

    /// Makes clone `record` of snapshot `parent` and returns its id once durable. It reads as
    /// the snapshot until written; no page is copied until then.
    pub async fn create_clone(&self, parent: u16, record: LayerRecord) -> Result<u16, MapError> {
        self.pool_layout()?;
        let _gate = self.snap.gate.write().await;
        let tables = self.layout().pages().div_ceil(INDEX_ENTRIES as u64) as usize;
        let id = {
            let mut l = self.snap.layers.lock();
            l.clone_parent(parent)?;
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
        if let Some(u) = updates.iter().find(|u| u.block >= self.blocks()) {
            return Err(MapError::OutOfRange { block: u.block, blocks: self.blocks() });
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
    pub(super) fn view_page_now(
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

    /// The resident page that is the view of head page `page` through frozen layers `frozen`
    /// (indexes into `clones`, nearest first) and then snapshot `snaps[k]`: the first copy one
    /// of them owns, else the snapshot's view; `None` with what to load in `needs`.
    fn chain_view_now(
        &self,
        layers: &Layers,
        frozen: &[usize],
        k: usize,
        page: u64,
        needs: &mut Vec<Need>,
        held: &mut Vec<Pin>,
    ) -> Option<(u64, Arc<Slot<MapPage>>)> {
        for &f in frozen {
            let had = needs.len();
            if let Some(own) = self.own_page_now(&layers.clones[f], page, needs, held) {
                return Some(own);
            }
            if needs.len() > had {
                return None;
            }
        }
        self.view_page_now(&layers.snaps[k..], page, needs, held)
    }

    /// [`MapStore::update_clone`]'s apply, with `pending` and `layers` locked: `Ok(Err(needs))`
    /// when pages must be loaded first (nothing was applied).
    pub(super) fn apply_to_clone(
        &self,
        pending: &mut Pending,
        layers: &mut Layers,
        layer: u16,
        updates: &[Update],
    ) -> Result<Result<Vec<Option<MapEntry>>, Vec<Need>>, MapError> {
        let ci = layers
            .clones
            .iter()
            .position(|c| c.record.id == layer && c.record.kind == LayerKind::Clone && !c.record.hidden)
            .ok_or(MapError::LayerGone { layer })?;
        let (frozen, k) = layers.chain_below(layer);
        // 1. Everything needed is resident, and the pool has room, before anything changes.
        let mut needs = Vec::new();
        let mut held = Vec::new();
        let mut new_pages = BTreeSet::new();
        let mut new_tables = BTreeSet::new();
        for u in updates {
            let page = u.block / ENTRIES_PER_PAGE;
            self.chain_view_now(layers, &frozen, k, page, &mut needs, &mut held);
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
                self.chain_view_now(layers, &frozen, k, page, &mut needs, &mut held).expect("resident, held");
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
            pending.push(crate::map::Delta::entry(layer, key, u.block, u.entry, before));
            applied.push(Some(if view_entry == before { MapEntry::UNALLOCATED } else { before }));
        }
        assert!(needs.is_empty(), "pages found resident above stay resident while held");
        Ok(Ok(applied))
    }

    /// Deletes clone `layer` and its snapshots: its copies are dropped (a table record each, 128
    /// to a log write) and `on_free` gets the entries its parent's view does not hold; then its
    /// snapshots go the same way, newest first, but for those clones were made of. If its parent was
    /// deleted and kept only for clones and this was the last, the parent's delete is finished
    /// too. No data is copied; writes to the family wait for one batch at a time, and `hold`
    /// is taken shared around each, as [`MapStore::delete_snapshot`] does.
    pub async fn delete_clone(
        &self,
        layer: u16,
        hold: Option<&tokio::sync::RwLock<()>>,
        mut on_free: impl FnMut(Vec<(u64, MapEntry)>),
    ) -> Result<DeleteStats, MapError> {
        self.pool_layout()?;
        // Durable before any copy is dropped: open finishes a delete a crash cut short. (The
        // clone takes no writes once hidden; the family's others go on.) Its snapshots go with
        // it, but for those clones were made of: they stay, hidden, for them.
        self.hide_clone_and_snapshots(layer).await?;
        self.drop_clone(layer, hold, &mut on_free).await
    }

    /// The first step of [`Self::delete_clone`]: clone `layer` and its snapshots are marked
    /// deleted, durably (the clone takes no writes from here on and is never listed again);
    /// [`Self::finish_deletes`] drops its copies, which an open runs and a background task may.
    pub async fn hide_clone(&self, layer: u16) -> Result<(), MapError> {
        self.pool_layout()?;
        self.hide_clone_and_snapshots(layer).await
    }

    /// Drops every copy of hidden clone `layer` (it takes no writes: hidden), removes it, and
    /// finishes its parent's delete if that waited for it (the caller does not hold the gate).
    pub(super) async fn drop_clone(
        &self,
        layer: u16,
        hold: Option<&tokio::sync::RwLock<()>>,
        on_free: &mut impl FnMut(Vec<(u64, MapEntry)>),
    ) -> Result<DeleteStats, MapError> {
        let (dir, parent) = {
            let l = self.snap.layers.lock();
            let c = l.clones.iter().find(|c| c.record.id == layer).expect("known clone");
            (c.dir.clone(), c.record.parent)
        };
        let mut stats = self.let_go(layer, &dir, LetGo::DropClone { parent }, hold, on_free).await?;
        self.remove_and_checkpoint(layer).await?;
        stats.add(self.finish_hidden(parent, hold, on_free).await?);
        Ok(stats)
    }

    /// What deleting clone `layer` does with its copy `pool` of page `page`: drops it, adding
    /// to `freed` the entries its parent's view does not hold (rule 9).
    pub(super) async fn drop_clone_page(
        &self,
        layer: u16,
        parent: u16,
        page: u64,
        pool: u32,
        freed: &mut Vec<(u64, MapEntry)>,
    ) -> Result<TableOp, MapError> {
        let copy = self.pool_page(pool, layer, page).await?.page().entries.lock().clone();
        let view = self.view_from(parent, page).await?;
        super::delete::frees_of_copy(page, &copy, &[&view], freed);
        Ok(TableOp::Drop { layer, page, pool })
    }

    /// Snapshot or frozen layer `layer`'s view of head page `page` (hidden ones too): its own
    /// copy, else (a frozen layer) its parent's view, else (a snapshot) the next newer's. The
    /// caller holds the gate (no delete hands copies between layers meanwhile).
    pub(super) async fn view_from(&self, layer: u16, page: u64) -> Result<Box<[MapEntry]>, MapError> {
        let mut id = layer;
        loop {
            if let Some((_, own)) = self.own_copy(id, page).await? {
                return Ok(own.page().entries.lock().clone());
            }
            let parent =
                self.snap.layers.lock().clones.iter().find(|c| c.record.id == id).map(|c| c.record.parent);
            match parent {
                Some(p) => id = p,
                None => return self.view_after(id, page).await,
            }
        }
    }

    /// The entry of `block` as clone or frozen layer `layer` sees it: its own copy of the page,
    /// else the first frozen layer's under it, else the snapshot's they rest on. A delete
    /// handing copies between layers meanwhile makes it look again.
    pub(super) async fn chain_entry(&self, layer: u16, block: u64) -> Result<MapEntry, MapError> {
        let page = block / ENTRIES_PER_PAGE;
        let at = (block % ENTRIES_PER_PAGE) as usize;
        'again: loop {
            let generation = self.snap.generation.load(SeqCst);
            let changed = || self.snap.generation.load(SeqCst) != generation;
            let mut id = layer;
            loop {
                let parent = {
                    let l = self.snap.layers.lock();
                    l.clones.iter().find(|c| c.record.id == id).map(|c| c.record.parent)
                };
                let Some(parent) = parent else {
                    let e = self.view_entry(id, block).await;
                    if changed() {
                        continue 'again;
                    }
                    return e;
                };
                match self.own_copy(id, page).await {
                    Ok(Some((_, own))) => return Ok(own.page().entries.lock()[at]),
                    Ok(None) => id = parent,
                    Err(_) if changed() => continue 'again,
                    Err(e) => return Err(e),
                }
            }
        }
    }

    /// Makes snapshot `record` of clone `clone` by freezing it (docs/design/snapshots.md,
    /// "Snapshots, rollback and clones of a clone") and returns the frozen layer's id once
    /// durable: the new layer takes the clone's copies (its own table pages name them) and
    /// parent, and the clone goes on over it with no page of its own. Nothing but the clone's
    /// table pages (one per 1,016 map pages it changed) is copied. Two checkpoints, in this
    /// order: the frozen layer (a crash after it leaves a frozen layer nothing is over, which
    /// open drops, the clone as it was), then the clone's new parent and index.
    pub async fn freeze_clone(&self, clone: u16, mut record: LayerRecord) -> Result<u16, MapError> {
        self.pool_layout()?;
        let _gate = self.snap.gate.write().await;
        // Every copy the clone's tables name has its record durable first: one whose record were
        // still queued would be replayed into the clone's new table, not the frozen layer's.
        let queued = self.pending.lock().queued;
        self.commit(queued).await?;
        let (dir, parent, depth) = {
            let mut l = self.snap.layers.lock();
            let c = l.live_clone(clone)?;
            let (dir, parent) = (c.dir.clone(), c.record.parent);
            (dir, parent, l.chain_below(clone).0.len())
        };
        if depth >= MAX_FROZEN_DEPTH {
            return Err(layers_error(format!(
                "the clone reads through {depth} snapshots of its own already, the most allowed: delete one first"
            )));
        }
        let mut tables = Vec::new();
        for (ti, &t) in dir.iter().enumerate() {
            if t != 0 {
                let ts = self.table_page(t, clone, (ti * INDEX_ENTRIES) as u64).await?;
                tables.push((ti, ts.page().entries.lock().clone()));
            }
        }
        let dirs = dir.len().div_ceil(INDEX_ENTRIES);
        let (id, copies) = {
            let mut l = self.snap.layers.lock();
            // The frozen layer's index and tables, and the clone's new (empty) index.
            room_for(&l.pool, tables.len() + 2 * (dirs + 1))?;
            record.of_clone = clone;
            let mut f = l.new_layer(record, LayerKind::Frozen, parent, dir.len())?;
            let id = f.record.id;
            let mut copies = Vec::new();
            for (ti, entries) in tables {
                let t = l.pool.allocate().expect("room checked");
                f.dir[ti] = t;
                copies.extend(entries.iter().copied().filter(|&p| p != 0));
                let tp = TablePage {
                    layer: id,
                    first: (ti * INDEX_ENTRIES) as u64,
                    entries: parking_lot::Mutex::new(entries),
                };
                self.snap.tables.forget(u64::from(t));
                let (slot, _) = self.snap.tables.insert(vec![(u64::from(t), tp, false)]).remove(0);
                self.snap.tables.mark_dirty(u64::from(t), &slot);
            }
            l.clones.push(f);
            (id, copies)
        };
        self.snap.generation.fetch_add(1, SeqCst);
        self.checkpoint().await?;
        {
            let _one = self.checkpointing.lock().await;
            let after = self.log.lock().await.next_seq.saturating_sub(1);
            let mut l = self.snap.layers.lock();
            let Layers { clones, pool, .. } = &mut *l;
            let c = clones.iter_mut().find(|c| c.record.id == clone).expect("the clone is kept");
            let old_dir = std::mem::replace(&mut c.dir, vec![0; dir.len()]);
            let old_index: Vec<u32> = c.dir_pages.iter().copied().chain([c.record.root_page]).collect();
            c.record.root_page = pool.allocate().expect("room checked");
            c.dir_pages = (0..dirs).map(|_| pool.allocate().expect("room checked")).collect();
            c.dir_dirty = true;
            c.root_dirty = true;
            c.record.parent = id;
            for t in old_dir.into_iter().filter(|&t| t != 0) {
                self.snap.tables.forget(u64::from(t));
                pool.release(t, after);
            }
            for p in old_index {
                pool.release(p, after);
            }
            l.records_dirty = true;
            for p in copies {
                if let Some(copy) = self.cache.peek(POOL_KEY | u64::from(p)) {
                    copy.page().owner.store(id, SeqCst);
                }
            }
        }
        self.snap.generation.fetch_add(1, SeqCst);
        self.checkpoint().await?;
        Ok(id)
    }

    /// Rolls clone `layer` back to its newest snapshot (its parent, a frozen layer of its own):
    /// its copies are dropped as a delete drops them, what the snapshot's view does not hold
    /// freed, so it reads as the snapshot again. A durable mark first lets open finish one a
    /// crash cut short ([`Self::finish_clone_rollbacks`]). The caller keeps the clone's writes
    /// out.
    pub async fn rollback_clone(
        &self,
        layer: u16,
        hold: Option<&tokio::sync::RwLock<()>>,
        mut on_free: impl FnMut(Vec<(u64, MapEntry)>),
    ) -> Result<DeleteStats, MapError> {
        self.pool_layout()?;
        {
            let mut l = self.snap.layers.lock();
            let parent = l.live_clone(layer)?.record.parent;
            let own = l.clones.iter().any(|c| {
                c.record.id == parent && c.record.kind == LayerKind::Frozen && c.record.of_clone == layer
            });
            if !own {
                return Err(layers_error("the clone has no snapshot of its own to go back to"));
            }
            l.live_clone(layer)?.record.rollback_to = parent;
            l.records_dirty = true;
        }
        self.checkpoint().await?;
        self.finish_clone_rollback(layer, hold, &mut on_free).await
    }

    /// Clone rollbacks a crash cut short: (clone, snapshot) pairs.
    pub fn clone_rollbacks_pending(&self) -> Vec<(u16, u16)> {
        let l = self.snap.layers.lock();
        l.clones
            .iter()
            .filter(|c| c.record.kind == LayerKind::Clone && c.record.rollback_to != 0)
            .map(|c| (c.record.id, c.record.rollback_to))
            .collect()
    }

    /// Finishes every clone rollback a crash cut short (at open, before the map is used).
    pub async fn finish_clone_rollbacks(
        &self,
        mut on_free: impl FnMut(Vec<(u64, MapEntry)>),
    ) -> Result<usize, MapError> {
        let pending = self.clone_rollbacks_pending();
        for &(clone, _) in &pending {
            self.finish_clone_rollback(clone, None, &mut on_free).await?;
        }
        Ok(pending.len())
    }

    async fn finish_clone_rollback(
        &self,
        layer: u16,
        hold: Option<&tokio::sync::RwLock<()>>,
        on_free: &mut impl FnMut(Vec<(u64, MapEntry)>),
    ) -> Result<DeleteStats, MapError> {
        let (dir, parent) = {
            let l = self.snap.layers.lock();
            let c = l.clones.iter().find(|c| c.record.id == layer).expect("known clone");
            assert_eq!(c.record.rollback_to, c.record.parent, "clone {layer} rolls back to its parent");
            (c.dir.clone(), c.record.parent)
        };
        let stats = self.let_go(layer, &dir, LetGo::DropClone { parent }, hold, on_free).await?;
        {
            let mut l = self.snap.layers.lock();
            if let Some(c) = l.clones.iter_mut().find(|c| c.record.id == layer) {
                c.record.rollback_to = 0;
            }
            l.records_dirty = true;
        }
        self.snap.generation.fetch_add(1, SeqCst);
        self.checkpoint().await?;
        Ok(stats)
    }
}
