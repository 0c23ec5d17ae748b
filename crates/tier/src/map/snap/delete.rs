//! Snapshot delete (docs/design/snapshots.md, "Snapshot delete"): copies handed on to the next
//! older snapshot or dropped, table records logged before they apply, places no layer holds
//! any more handed to the caller to free.

use std::sync::Arc;
use std::sync::atomic::Ordering::SeqCst;

use stria_dev::BlockDevice;
use stria_engine::pagecache::Slot;

use super::{HAND_ON_BATCH, Layers, POOL_KEY, TableOp, layers_error, table_index, table_slot};
use crate::layers::{INDEX_ENTRIES, LayerKind};
use crate::map::{ENTRIES_PER_PAGE, MapEntry, MapError, MapPage, MapStore};

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

impl DeleteStats {
    /// Adds what a further step of the same delete did.
    pub(super) fn add(&mut self, more: DeleteStats) {
        self.pages_moved += more.pages_moved;
        self.pages_dropped += more.pages_dropped;
        self.entries_freed += more.entries_freed;
    }
}

/// Adds to `freed` the entries of `copy` (a dropped copy of map page `page`) that name a place
/// (a segment block or a cache position) none of `holders` (the same page as the layers that may
/// still hold its places see it) names for the same block.
pub(super) fn frees_of_copy(
    page: u64,
    copy: &[MapEntry],
    holders: &[&[MapEntry]],
    freed: &mut Vec<(u64, MapEntry)>,
) {
    for (i, x) in copy.iter().enumerate() {
        let physical = matches!(x.place, crate::map::Place::Segment(_) | crate::map::Place::Cache(_));
        if physical && holders.iter().all(|h| h[i].place != x.place) {
            freed.push((page * ENTRIES_PER_PAGE + i as u64, *x));
        }
    }
}

impl<D: BlockDevice> MapStore<D> {
    /// Snapshot `layer`'s own copy of head page `page`, if it has one.
    pub(super) async fn own_copy(
        &self,
        layer: u16,
        page: u64,
    ) -> Result<Option<(u32, Arc<Slot<MapPage>>)>, MapError> {
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
    pub(super) async fn view_after(&self, layer: u16, page: u64) -> Result<Box<[MapEntry]>, MapError> {
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
    /// entries no layer holds any more (their places are the caller's to free). It costs a
    /// table record per page the snapshot owns; writes to the volume wait for one batch at a
    /// time (see [`MapStore::set_delete_batch`]), not for the delete. `hold`, if given, is
    /// taken shared around each batch, from its map change to its frees (the log volume's
    /// barrier that a recount takes alone).
    pub async fn delete_snapshot(
        &self,
        layer: u16,
        hold: Option<&tokio::sync::RwLock<()>>,
        mut on_free: impl FnMut(Vec<(u64, MapEntry)>),
    ) -> Result<DeleteStats, MapError> {
        if self.hide_snapshot(layer).await? {
            return Ok(DeleteStats { kept_for_clones: true, ..DeleteStats::default() });
        }
        self.hand_on(layer, hold, &mut on_free).await
    }

    /// The first step of [`Self::delete_snapshot`]: snapshot `layer` is marked deleted
    /// (hidden), durably, and is never read or listed again. Returns whether it has clones (it
    /// is then kept, hidden, for them). Otherwise its copies are still to be handed on: by
    /// [`Self::finish_deletes`], which an open runs and a background task may run (writes go on
    /// meanwhile, preserving into it while it is the newest, as before the mark).
    pub async fn hide_snapshot(&self, layer: u16) -> Result<bool, MapError> {
        self.pool_layout()?;
        {
            let _gate = self.snap.gate.write().await;
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
            self.snap.generation.fetch_add(1, SeqCst);
        }
        // The hidden mark is durable before any copy is handed on: the snapshot's own view is
        // never read again, and open finishes a delete a crash cut short. (Writes go on during
        // this checkpoint, preserving into the snapshot, still the newest, as before the mark.)
        self.checkpoint().await?;
        Ok(self.snap.layers.lock().has_clones(layer))
    }

    /// Pages a snapshot or clone delete hands on or drops per batch, one log write each (128
    /// unless set; at least 1): the longest a host write waits for a delete. For tests, which
    /// set it small so that writes land between batches.
    #[doc(hidden)]
    pub fn set_delete_batch(&self, pages: usize) {
        self.snap.delete_batch.store(pages.clamp(1, HAND_ON_BATCH), SeqCst);
    }

    /// Whether the origin's head was deleted while clones lived: it is kept, hidden, for them
    /// (their parent snapshots read through it) until the last one is deleted.
    pub fn head_deleted(&self) -> bool {
        self.snap.head_deleted.load(SeqCst)
    }

    /// Marks the origin's head deleted, durably (docs/design/snapshots.md, "Deleting an origin
    /// that has clones"): from here on it takes no writes and is not shown, and open deletes
    /// its snapshots if a crash cut the delete short. Refused without a live clone (then the
    /// whole family is deleted instead) or with a rollback unfinished.
    pub async fn mark_head_deleted(&self) -> Result<(), MapError> {
        {
            let mut l = self.snap.layers.lock();
            if l.clones.iter().all(|c| c.record.hidden || c.record.kind != LayerKind::Clone) {
                return Err(layers_error("the volume has no clones"));
            }
            let head = l.head.as_mut().ok_or_else(|| layers_error("the volume has no snapshot"))?;
            if head.rollback_to != 0 {
                return Err(layers_error("a rollback has not finished"));
            }
            head.hidden = true;
            l.records_dirty = true;
            self.snap.head_deleted.store(true, SeqCst);
        }
        self.checkpoint().await
    }

    /// Stops deletes before their next batch (the volume is closing): they return
    /// [`MapError::Stopped`], and the next open finishes them. For good: a closed volume is
    /// opened again as a new one.
    pub fn stop_deletes(&self) {
        self.snap.deletes_stopped.store(true, SeqCst);
    }

    /// Whether hidden layer `layer` is kept for clones: a snapshot of the head with clones, or
    /// a snapshot of a clone with more than one layer over it.
    pub fn kept_for_clones(&self, layer: u16) -> bool {
        let l = self.snap.layers.lock();
        match l.clones.iter().find(|c| c.record.id == layer) {
            Some(c) => c.record.kind == LayerKind::Frozen && l.children(layer).len() > 1,
            None => l.has_clones(layer),
        }
    }

    /// How many layers are marked deleted with their delete still to finish
    /// ([`Self::finish_deletes`] would act on them; those kept for clones are not counted).
    pub fn deletes_pending(&self) -> usize {
        let l = self.snap.layers.lock();
        let clones = l.clones.iter().filter(|c| c.record.hidden && c.record.kind == LayerKind::Clone).count();
        let frozen = l
            .clones
            .iter()
            .filter(|c| {
                c.record.hidden && c.record.kind == LayerKind::Frozen && l.children(c.record.id).len() <= 1
            })
            .count();
        let snaps = l.snaps.iter().filter(|s| s.record.hidden && !l.has_clones(s.record.id)).count();
        clones + frozen + snaps
    }

    /// Finishes the deletes marked but not finished: those a crash cut short (at open, before
    /// the map is used, `hold` `None`) and those left to a background task (`hold` as for
    /// [`Self::delete_snapshot`]; writes go on between batches).
    pub async fn finish_deletes(
        &self,
        hold: Option<&tokio::sync::RwLock<()>>,
        mut on_free: impl FnMut(Vec<(u64, MapEntry)>),
    ) -> Result<usize, MapError> {
        let clones: Vec<u16> = {
            let l = self.snap.layers.lock();
            let hidden = |c: &&super::Snap| c.record.hidden && c.record.kind == LayerKind::Clone;
            l.clones.iter().filter(hidden).map(|c| c.record.id).collect()
        };
        for &layer in &clones {
            self.drop_clone(layer, hold, &mut on_free).await?;
        }
        // Deleted snapshots of clones (frozen layers) with at most one layer over them.
        let frozen: Vec<u16> = {
            let l = self.snap.layers.lock();
            l.clones
                .iter()
                .filter(|c| c.record.hidden && c.record.kind == LayerKind::Frozen)
                .map(|c| c.record.id)
                .collect()
        };
        for &layer in &frozen {
            if self.snap.layers.lock().layer(layer).is_some() {
                self.finish_hidden(layer, hold, &mut on_free).await?;
            }
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
            self.hand_on(layer, hold, &mut on_free).await?;
        }
        Ok(clones.len() + frozen.len() + hidden.len())
    }

    /// Deletes frozen layer `layer`, a snapshot of a clone (docs/design/snapshots.md,
    /// "Snapshots, rollback and clones of a clone"): hidden first, durably; then, with one layer
    /// over it (the clone or its next snapshot), its copies are handed up to that one or
    /// dropped; with more (clones were made of it), it is kept, hidden, until they are deleted.
    /// No data is copied; writes wait for one batch at a time.
    pub async fn delete_frozen(
        &self,
        layer: u16,
        hold: Option<&tokio::sync::RwLock<()>>,
        mut on_free: impl FnMut(Vec<(u64, MapEntry)>),
    ) -> Result<DeleteStats, MapError> {
        self.hide_frozen(layer).await?;
        self.finish_hidden(layer, hold, &mut on_free).await
    }

    /// The first step of [`Self::delete_frozen`]: frozen layer `layer` is marked deleted,
    /// durably; [`Self::finish_deletes`] does the rest (or keeps it for the clones made of it).
    pub async fn hide_frozen(&self, layer: u16) -> Result<(), MapError> {
        self.pool_layout()?;
        {
            let _gate = self.snap.gate.write().await;
            let mut l = self.snap.layers.lock();
            let f = l
                .clones
                .iter_mut()
                .find(|c| c.record.id == layer && c.record.kind == LayerKind::Frozen && !c.record.hidden)
                .ok_or_else(|| layers_error(format!("no snapshot of a clone with layer id {layer}")))?;
            f.record.hidden = true;
            l.records_dirty = true;
            self.snap.generation.fetch_add(1, SeqCst);
        }
        self.checkpoint().await
    }

    /// Marks deleted, durably, clone `layer` and every snapshot of it (its frozen layers): the
    /// snapshots first, then the clone, so that a crash between leaves no frozen layer nothing
    /// is over that is not marked (open drops such a one untouched, as a freeze cut short).
    pub(super) async fn hide_clone_and_snapshots(&self, layer: u16) -> Result<(), MapError> {
        for step in [LayerKind::Frozen, LayerKind::Clone] {
            {
                let _gate = self.snap.gate.write().await;
                let mut l = self.snap.layers.lock();
                if step == LayerKind::Clone {
                    l.live_clone(layer)?;
                }
                for c in l.clones.iter_mut() {
                    let ours = match step {
                        LayerKind::Frozen => c.record.kind == LayerKind::Frozen && c.record.of_clone == layer,
                        _ => c.record.id == layer,
                    };
                    if ours && !c.record.hidden {
                        c.record.hidden = true;
                    }
                }
                l.records_dirty = true;
                self.snap.generation.fetch_add(1, SeqCst);
            }
            self.checkpoint().await?;
        }
        Ok(())
    }

    /// Finishes the delete of hidden layer `layer` if nothing keeps it any more, and then of
    /// the hidden layers under it that this leaves without a reason to stay: a frozen layer
    /// with no layer over it drops its copies (freeing what its parent's view does not hold),
    /// one with a single layer over it hands its copies up to that one; a snapshot of the head
    /// with no clone is handed on ([`Self::hand_on`]). Anything else stays.
    pub(super) async fn finish_hidden(
        &self,
        layer: u16,
        hold: Option<&tokio::sync::RwLock<()>>,
        on_free: &mut impl FnMut(Vec<(u64, MapEntry)>),
    ) -> Result<DeleteStats, MapError> {
        enum Step {
            /// It stays; a frozen layer's parent may still be finished (a hidden one whose only
            /// layer over it is this one is handed up into it).
            Keep(Option<u16>),
            HandOn,
            Drop {
                parent: u16,
                dir: Vec<u32>,
            },
            HandUp {
                child: u16,
                parent: u16,
                dir: Vec<u32>,
            },
        }
        let mut stats = DeleteStats::default();
        let mut next = Some(layer);
        while let Some(id) = next.take() {
            let step = {
                let l = self.snap.layers.lock();
                match l.clones.iter().find(|c| c.record.id == id) {
                    Some(f) if f.record.hidden && f.record.kind == LayerKind::Frozen => {
                        let (parent, dir) = (f.record.parent, f.dir.clone());
                        match l.children(id)[..] {
                            [] => Step::Drop { parent, dir },
                            [child] => Step::HandUp { child, parent, dir },
                            _ => Step::Keep(Some(parent)),
                        }
                    }
                    Some(_) => Step::Keep(None),
                    None => match l.snaps.iter().find(|s| s.record.id == id) {
                        Some(s) if s.record.hidden && !l.has_clones(id) => Step::HandOn,
                        _ => Step::Keep(None),
                    },
                }
            };
            let done = match step {
                Step::Keep(parent) => {
                    if id == layer {
                        stats.kept_for_clones = true;
                    }
                    next = parent;
                    continue;
                }
                Step::HandOn => self.hand_on(id, hold, on_free).await?,
                Step::Drop { parent, dir } => {
                    let done = self.let_go(id, &dir, LetGo::DropClone { parent }, hold, on_free).await?;
                    self.remove_and_checkpoint(id).await?;
                    next = Some(parent);
                    done
                }
                Step::HandUp { child, parent, dir } => {
                    let done = self.let_go(id, &dir, LetGo::HandUp { child, parent }, hold, on_free).await?;
                    // The layer over it reads through its parent now: durable before the layer
                    // goes from the table (a torn table write must not leave a parent unknown).
                    {
                        let _gate = self.snap.gate.write().await;
                        let mut l = self.snap.layers.lock();
                        l.layer_mut(child).expect("the layer over it is kept").record.parent = parent;
                        l.records_dirty = true;
                        self.snap.generation.fetch_add(1, SeqCst);
                    }
                    self.checkpoint().await?;
                    self.remove_and_checkpoint(id).await?;
                    next = Some(parent);
                    done
                }
            };
            stats.add(done);
        }
        Ok(stats)
    }

    /// What deleting frozen layer `layer` does with its copy `pool` of head page `page` when
    /// `child` is the one layer over it: hands it up if `child` has no copy (its view of the
    /// page was this one), else drops it, adding to `freed` the entries neither `child`'s copy
    /// nor `parent`'s view holds (a place in the copy came from the parent's view or was
    /// written after it by the clone, and then only layers over this one hold it).
    pub(super) async fn hand_up_page(
        &self,
        layer: u16,
        child: u16,
        parent: u16,
        page: u64,
        pool: u32,
        freed: &mut Vec<(u64, MapEntry)>,
    ) -> Result<TableOp, MapError> {
        let child_copy = match self.own_copy(child, page).await? {
            None => return Ok(TableOp::Own { from: layer, to: child, page, pool, table: 0 }),
            Some((_, c)) => c.page().entries.lock().clone(),
        };
        let copy = self.pool_page(pool, layer, page).await?.page().entries.lock().clone();
        let below = self.view_from(parent, page).await?;
        frees_of_copy(page, &copy, &[&child_copy, &below], freed);
        Ok(TableOp::Drop { layer, page, pool })
    }

    /// Hands on or drops every copy of hidden snapshot `layer`, then removes it. Writes go on
    /// between its batches (the caller does not hold the gate): while `layer` is the newest,
    /// they preserve into the next older snapshot instead ([`Layers::preserve_target`]), so
    /// the pages marked preserved are from the start those either owns.
    pub(super) async fn hand_on(
        &self,
        layer: u16,
        hold: Option<&tokio::sync::RwLock<()>>,
        on_free: &mut impl FnMut(Vec<(u64, MapEntry)>),
    ) -> Result<DeleteStats, MapError> {
        let (dir, older) = {
            let _gate = self.snap.gate.write().await;
            let (newest, dir, older) = {
                let l = self.snap.layers.lock();
                let k = l.snaps.iter().position(|s| s.record.id == layer).expect("known layer");
                let older = k.checked_sub(1).map(|i| (l.snaps[i].record.id, l.snaps[i].dir.clone()));
                (k + 1 == l.snaps.len(), l.snaps[k].dir.clone(), older)
            };
            if newest {
                if let Some((id, older_dir)) = &older {
                    let bits = self.owned_bits(*id, older_dir).await?;
                    for (w, b) in self.snap.preserved.read().iter().zip(bits) {
                        w.fetch_or(b, SeqCst);
                    }
                }
                self.snap.layers.lock().deleting = Some(layer);
            }
            (dir, older.map(|o| o.0))
        };
        let stats = self.let_go(layer, &dir, LetGo::HandOn { older }, hold, on_free).await?;
        self.remove_and_checkpoint(layer).await?;
        Ok(stats)
    }

    /// The bitmap (a bit per head page) of the pages snapshot `id` (directory `dir`) owns.
    async fn owned_bits(&self, id: u16, dir: &[u32]) -> Result<Vec<u64>, MapError> {
        let mut bits = vec![0u64; self.snap.preserved.read().len()];
        for (ti, &t) in dir.iter().enumerate() {
            if t == 0 {
                continue;
            }
            let ts = self.table_page(t, id, (ti * INDEX_ENTRIES) as u64).await?;
            for (k, &p) in ts.page().entries.lock().iter().enumerate() {
                if p != 0 {
                    let page = ti * INDEX_ENTRIES + k;
                    bits[page / 64] |= 1 << (page % 64);
                }
            }
        }
        Ok(bits)
    }

    /// Lets go of every copy snapshot or clone `layer` owns (its directory `dir`), in batches,
    /// each logged and durable before it applies; `on_free` gets what no other layer holds.
    /// Each batch holds the gate alone (and `hold` shared) from reading the pages it lets go of
    /// to its frees; updates run between batches, and each batch reads the layer's table again.
    pub(super) async fn let_go(
        &self,
        layer: u16,
        dir: &[u32],
        how: LetGo,
        hold: Option<&tokio::sync::RwLock<()>>,
        on_free: &mut impl FnMut(Vec<(u64, MapEntry)>),
    ) -> Result<DeleteStats, MapError> {
        let mut stats = DeleteStats::default();
        for (ti, &table) in dir.iter().enumerate() {
            if table == 0 {
                continue;
            }
            loop {
                if self.snap.deletes_stopped.load(SeqCst) {
                    return Err(MapError::Stopped);
                }
                let _held = match hold {
                    Some(h) => Some(h.read().await),
                    None => None,
                };
                let _gate = self.snap.gate.write().await;
                let owned = self.owned_in_table(layer, table, ti).await?;
                if owned.is_empty() {
                    break;
                }
                let batch = &owned[..owned.len().min(self.snap.delete_batch.load(SeqCst))];
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
                        LetGo::HandUp { child, parent } => {
                            self.hand_up_page(layer, child, parent, page, pool, &mut freed).await?
                        }
                    });
                }
                self.log_table_ops(&mut ops).await?;
                // The newest snapshot, deleted with no older one to preserve into: a page it
                // dropped is owned by no snapshot now, and a write to it preserves nothing.
                if matches!(how, LetGo::HandOn { older: None })
                    && self.snap.layers.lock().deleting == Some(layer)
                {
                    for op in &ops {
                        if let TableOp::Drop { page, .. } = op {
                            self.snap.clear_preserved(*page);
                        }
                    }
                }
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
    pub(super) async fn owned_in_table(
        &self,
        layer: u16,
        table: u32,
        ti: usize,
    ) -> Result<Vec<(u64, u32)>, MapError> {
        let first = (ti * INDEX_ENTRIES) as u64;
        let ts = self.table_page(table, layer, first).await?;
        let entries = ts.page().entries.lock();
        Ok(entries.iter().enumerate().filter(|e| *e.1 != 0).map(|(i, &p)| (first + i as u64, p)).collect())
    }

    /// What deleting snapshot `layer` does with its copy `pool` of head page `page`: hand it to
    /// `older` if that one has none (its view of the page was this copy), else drop it, adding
    /// to `freed` the entries no other layer holds (only a neighbour's view can: the layers
    /// that see one version of a block are consecutive).
    pub(super) async fn hand_on_page(
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
        let mut holders: Vec<&[MapEntry]> = vec![&newer];
        holders.extend(older_copy.as_deref());
        frees_of_copy(page, &copy, &holders, freed);
        Ok(TableOp::Drop { layer, page, pool })
    }

    /// Blocks only snapshot `layer` holds: what deleting it would free. It walks the pages the
    /// snapshot owns (what changed between it and the next newer), as a delete would, without
    /// changing anything; writes going on meanwhile make it a moment's figure.
    pub async fn exclusive_blocks(&self, layer: u16) -> Result<u64, MapError> {
        let _no_delete = self.snap.gate.read().await;
        let (dir, how) = {
            let l = self.snap.layers.lock();
            let frozen = l
                .clones
                .iter()
                .find(|c| c.record.id == layer && c.record.kind == LayerKind::Frozen && !c.record.hidden);
            if let Some(f) = frozen {
                let parent = f.record.parent;
                let how = match l.children(layer)[..] {
                    [] => LetGo::DropClone { parent },
                    [child] => LetGo::HandUp { child, parent },
                    // Clones were made of it: deleting it now frees nothing.
                    _ => return Ok(0),
                };
                (f.dir.clone(), how)
            } else {
                let k = l.visible(layer)?;
                if l.has_clones(layer) {
                    // Deleting it now frees nothing: its clones read through it.
                    return Ok(0);
                }
                (
                    l.snaps[k].dir.clone(),
                    LetGo::HandOn { older: k.checked_sub(1).map(|i| l.snaps[i].record.id) },
                )
            }
        };
        let mut freed = Vec::new();
        let mut blocks = 0;
        for (ti, &table) in dir.iter().enumerate() {
            if table == 0 {
                continue;
            }
            let owned = self.owned_in_table(layer, table, ti).await?;
            for (page, pool) in owned {
                match how {
                    LetGo::HandOn { older } => {
                        self.hand_on_page(layer, older, page, pool, &mut freed).await?
                    }
                    LetGo::DropClone { parent } => {
                        self.drop_clone_page(layer, parent, page, pool, &mut freed).await?
                    }
                    LetGo::HandUp { child, parent } => {
                        self.hand_up_page(layer, child, parent, page, pool, &mut freed).await?
                    }
                };
                blocks += freed.len() as u64;
                freed.clear();
            }
        }
        Ok(blocks)
    }

    /// Logs `ops` (choosing the table pages moves need first) and applies them once durable,
    /// with no checkpoint between: one that ran between would move replay past records whose
    /// changes it did not write.
    pub(super) async fn log_table_ops(&self, ops: &mut [TableOp]) -> Result<(), MapError> {
        let _one = self.checkpointing.lock().await;
        {
            let mut l = self.snap.layers.lock();
            let Layers { snaps, clones, pool, .. } = &mut *l;
            let mut made: std::collections::HashMap<(u16, usize), u32> = std::collections::HashMap::new();
            for op in ops.iter_mut() {
                if let TableOp::Own { to, page, table, .. } = op {
                    let ti = table_index(*page);
                    let s =
                        snaps.iter().chain(clones.iter()).find(|s| s.record.id == *to).expect("known layer");
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
            .map(|&op| crate::map::Delta {
                table_op: Some(op),
                ..crate::map::Delta::entry(0, 0, 0, MapEntry::UNALLOCATED, MapEntry::UNALLOCATED)
            })
            .collect();
        self.log_held(deltas).await?;
        // Raised before and after: a read that walks the layers while copies change hands (the
        // applies await page loads) sees the generation change and looks again.
        self.snap.generation.fetch_add(1, SeqCst);
        for &op in ops.iter() {
            self.apply_table_op(op, None).await?;
        }
        self.snap.generation.fetch_add(1, SeqCst);
        Ok(())
    }

    /// Applies a table record: when it is made (`replayed` None) or replayed from log block
    /// `replayed`. A record of a layer no longer known is skipped: the checkpoint that removed
    /// the layer wrote the tables the record changed before the layer table.
    pub(in crate::map) async fn apply_table_op(
        &self,
        op: TableOp,
        replayed: Option<u64>,
    ) -> Result<(), MapError> {
        let (layer, page, pool) = match op {
            TableOp::Own { from, to, page, pool, .. } => {
                if replayed.is_some() {
                    self.saw_layer(from);
                    self.saw_layer(to);
                    let l = self.snap.layers.lock();
                    if l.layer(from).is_none() || l.layer(to).is_none() {
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
            let had = std::mem::replace(&mut ts.page().entries.lock()[table_slot(page)], pool);
            if replayed.is_some() {
                // The copy is in use now, whatever the tables on disk say: a checkpoint that did
                // not finish may have written the giving layer's table without it and not yet the
                // taking layer's (or its directory), and then no table at open named it.
                self.snap.layers.lock().pool.claim(pool);
            }
            // Made now, a hand-on goes only to a layer without a copy of the page (replayed, the
            // table may hold it already: a checkpoint that did not finish wrote it).
            assert!(
                replayed.is_some() || had == 0,
                "snapshot {to} takes over pool page {pool} for map page {page} while it owns pool page {had}"
            );
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
        assert!(
            replayed.is_some() || table != 0,
            "layer {layer} lets go of pool page {pool} for map page {page} and has no table there"
        );
        if table != 0 {
            let ts = self.table_page(table, layer, (table_index(page) * INDEX_ENTRIES) as u64).await?;
            let mut entries = ts.page().entries.lock();
            // Made now, the record lets go of the layer's own copy.
            assert!(
                replayed.is_some() || entries[table_slot(page)] == pool,
                "layer {layer} lets go of pool page {pool} for map page {page}, and its table names {}",
                entries[table_slot(page)]
            );
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
            // Not in use after a checkpoint that did not finish wrote the table without it; made
            // now, the copy is in use and released once.
            assert!(
                replayed.is_some() || (l.pool.is_used(pool) && !l.pool.is_released(pool)),
                "layer {layer} lets go of pool page {pool}, which is free or released already"
            );
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
    pub(super) async fn log_held(&self, deltas: Vec<crate::map::Delta>) -> Result<(), MapError> {
        let n = deltas.len();
        let mut deltas = Some(deltas);
        loop {
            let mut log = self.log.lock().await;
            if self.failed.load(SeqCst) {
                return Err(MapError::Failed);
            }
            let ticket = {
                let mut p = self.pending.lock();
                let blocks = (p.deltas.len() + n).div_ceil(crate::map::DELTAS_PER_LOG_BLOCK) as u64;
                if log.next_seq - log.replay_seq + blocks <= self.layout().log_blocks {
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

    /// [`Self::remove_layer`] under the gate, then a checkpoint that writes the table without it
    /// (writes go on meanwhile).
    pub(super) async fn remove_and_checkpoint(&self, layer: u16) -> Result<(), MapError> {
        {
            let _gate = self.snap.gate.write().await;
            self.remove_layer(layer).await?;
        }
        self.checkpoint().await
    }

    /// Removes hidden snapshot `layer`, whose copies were all handed on or dropped: its index
    /// pages go back to the pool after the checkpoint that writes the layer table without it.
    /// If it was the newest, the next older one is now the one preserves go to. The caller
    /// holds the gate, and then writes the checkpoint (without the gate: writes go on).
    pub(super) async fn remove_layer(&self, layer: u16) -> Result<(), MapError> {
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
        let bits = match (newest, &older) {
            (true, Some((id, dir))) => self.owned_bits(*id, dir).await?,
            _ => vec![0u64; self.snap.preserved.read().len()],
        };
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
            if l.deleting == Some(layer) {
                l.deleting = None;
            }
            if newest {
                for (w, b) in self.snap.preserved.read().iter().zip(bits) {
                    w.store(b, SeqCst);
                }
            }
        }
        self.snap.generation.fetch_add(1, SeqCst);
        Ok(())
    }
}

/// What a delete does with each copy a layer owns.
#[derive(Debug, Clone, Copy)]
pub(super) enum LetGo {
    /// A snapshot's: hand it to `older` (the next older snapshot) if that one has none, else drop it.
    HandOn { older: Option<u16> },
    /// A clone's, or a frozen layer's with nothing over it: drop it (what `parent`'s view does
    /// not hold is freed).
    DropClone { parent: u16 },
    /// A frozen layer's with `child` alone over it: hand it up to `child` if that one has none,
    /// else drop it (what neither `child`'s copy nor `parent`'s view holds is freed).
    HandUp { child: u16, parent: u16 },
}
