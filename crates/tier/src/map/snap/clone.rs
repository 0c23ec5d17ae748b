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

use stria_dev::{BLOCK_BYTES, BlockDevice};
use stria_engine::pagecache::Slot;

use super::delete::{DeleteStats, LetGo};
use super::{Layers, Need, Pin, Snap, TableOp, layers_error, room_for, table_index};
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
        self.snap.layers.lock().clones.iter().filter(|c| !c.record.hidden).map(|c| c.record.clone()).collect()
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
            pending.push(crate::map::Delta::entry(layer, key, u.block, u.entry, before));
            applied.push(Some(if view_entry == before { MapEntry::UNALLOCATED } else { before }));
        }
        assert!(needs.is_empty(), "pages found resident above stay resident while held");
        Ok(Ok(applied))
    }

    /// Deletes clone `layer`: its copies are dropped (a table record each, 128 to a log write)
    /// and `on_free` gets the entries its parent's view does not hold. If its parent was
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
        {
            let _gate = self.snap.gate.write().await;
            let mut l = self.snap.layers.lock();
            l.live_clone(layer)?.record.hidden = true;
            l.records_dirty = true;
        }
        // Durable before any copy is dropped: open finishes a delete a crash cut short. (The
        // clone takes no writes once hidden; the family's others go on.)
        self.checkpoint().await?;
        self.drop_clone(layer, hold, &mut on_free).await
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
        let finish_parent = {
            let _gate = self.snap.gate.write().await;
            self.remove_layer(layer).await?;
            let l = self.snap.layers.lock();
            l.snaps.iter().any(|s| s.record.id == parent && s.record.hidden) && !l.has_clones(parent)
        };
        self.checkpoint().await?;
        if finish_parent {
            let more = self.hand_on(parent, hold, on_free).await?;
            stats.pages_moved += more.pages_moved;
            stats.pages_dropped += more.pages_dropped;
            stats.entries_freed += more.entries_freed;
        }
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
        for (i, x) in copy.iter().enumerate() {
            let physical = matches!(x.place, crate::map::Place::Segment(_) | crate::map::Place::Cache(_));
            if physical && view[i].place != x.place {
                freed.push((page * ENTRIES_PER_PAGE + i as u64, *x));
            }
        }
        Ok(TableOp::Drop { layer, page, pool })
    }

    /// Snapshot `layer`'s view of head page `page` (hidden ones too).
    pub(super) async fn view_from(&self, layer: u16, page: u64) -> Result<Box<[MapEntry]>, MapError> {
        if let Some((_, own)) = self.own_copy(layer, page).await? {
            return Ok(own.page().entries.lock().clone());
        }
        self.view_after(layer, page).await
    }
}
