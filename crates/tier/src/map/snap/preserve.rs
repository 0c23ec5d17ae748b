//! Updates of the head with snapshots present (rules 5 and 6): the preserve that copies a head
//! page into the newest snapshot before its first change, moves of every holder, and making a
//! snapshot.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering::SeqCst;

use stria_dev::{BLOCK_USIZE, BlockDevice};

use super::{
    HEAD_LAYER, Layers, Need, POOL_KEY, Snap, TablePage, layers_error, room_for, table_index, table_slot,
};
use crate::layers::{INDEX_ENTRIES, LayerKind, LayerRecord, PagePool};
use crate::map::{DirtyPage, ENTRIES_PER_PAGE, MapEntry, MapError, MapPage, MapStore, Pending, Update};

impl<D: BlockDevice> MapStore<D> {
    /// Applies `updates` with snapshots present (rules 5 and 6). `Ok(Err(needs))`: pages to load
    /// first (nothing was applied). Called with `pending` and `layers` locked.
    pub(in crate::map) fn apply_with_snapshots(
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
        let target = layers.preserve_target();
        // The snapshots whose copy of a preserved page says whether the head's entry is held:
        // the newest; while it is being deleted, the target too (a page the newest no longer
        // owns was handed to it, or it owned the page before).
        let newest = layers.snaps.len() - 1;
        let holders: Vec<usize> = std::iter::once(newest).chain(target.filter(|&t| t != newest)).collect();
        for u in updates {
            let page = u.block / ENTRIES_PER_PAGE;
            if u.expect.is_none() {
                if self.snap.is_preserved(page) {
                    let had = needs.len();
                    if self.holder_copy_now(layers, &holders, page, &mut needs, &mut held).is_none()
                        && needs.len() == had
                    {
                        return Err(layers_error(format!(
                            "map page {page} is marked preserved but has no copy"
                        )));
                    }
                } else if let Some(t) = target {
                    new_pages.insert(page);
                    let table = layers.snaps[t].dir[table_index(page)];
                    if table == 0 {
                        new_tables.insert(table_index(page));
                    } else {
                        self.own_page_now(&layers.snaps[t], page, &mut needs, &mut held);
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
                    if let (false, Some(t)) = (self.snap.is_preserved(*page), target) {
                        self.preserve(pending, layers, t, *page, &entries);
                    }
                    // No snapshot sees the page when none is preserved into (the only one is
                    // being deleted and owns no copy of it): the entry is held by no snapshot.
                    let kept = self.snap.is_preserved(*page) && {
                        let (_, own) = self
                            .holder_copy_now(layers, &holders, *page, &mut needs, &mut held)
                            .expect("a snapshot owns a page marked preserved (resident, checked above)");
                        own.page().entries.lock()[at] == before
                    };
                    entries[at] = u.entry;
                    drop(entries);
                    self.cache.mark_dirty(*page, slot);
                    pending.push(crate::map::Delta::entry(0, *page, u.block, u.entry, before));
                    applied.push(Some(if kept { MapEntry::UNALLOCATED } else { before }));
                }
                Some(from) => {
                    let mut moved = false;
                    if before == from {
                        entries[at] = u.entry;
                        self.cache.mark_dirty(*page, slot);
                        pending.push(crate::map::Delta::entry(0, *page, u.block, u.entry, before));
                        moved = true;
                    }
                    drop(entries);
                    for s in layers.snaps.iter().chain(&layers.clones) {
                        if let Some((key, own)) = self.own_page_now(s, *page, &mut needs, &mut held) {
                            let mut e = own.page().entries.lock();
                            if e[at] == from {
                                let was = e[at];
                                e[at] = u.entry;
                                drop(e);
                                self.cache.mark_dirty(key, &own);
                                pending.push(crate::map::Delta::entry(
                                    s.record.id,
                                    key,
                                    u.block,
                                    u.entry,
                                    was,
                                ));
                                moved = true;
                            }
                        }
                    }
                    applied.push(moved.then_some(from));
                }
            }
        }
        assert!(needs.is_empty(), "pages found resident above stay resident while held");
        Ok(Ok(applied))
    }

    /// The resident copy of head page `page` that the first of snapshots `holders` (indexes)
    /// owning one has; `None` when none does, or with what to load in `needs`.
    fn holder_copy_now(
        &self,
        layers: &Layers,
        holders: &[usize],
        page: u64,
        needs: &mut Vec<Need>,
        held: &mut Vec<super::Pin>,
    ) -> Option<(u64, std::sync::Arc<stria_engine::pagecache::Slot<MapPage>>)> {
        for &h in holders {
            let had = needs.len();
            if let Some(own) = self.own_page_now(&layers.snaps[h], page, needs, held) {
                return Some(own);
            }
            if needs.len() > had {
                return None;
            }
        }
        None
    }

    /// Copies head page `page` (its entries `head`) into a new pool page of snapshot
    /// `snaps[target]` (the newest, or the one [`Layers::preserve_target`] names) and queues
    /// the preserve record (rule 5).
    pub(super) fn preserve(
        &self,
        pending: &mut Pending,
        layers: &mut Layers,
        target: usize,
        page: u64,
        head: &[MapEntry],
    ) {
        assert!(!self.snap.is_preserved(page), "map page {page} preserved twice into the newest snapshot");
        if target + 1 != layers.snaps.len() {
            self.stats_preserved_past_delete.fetch_add(1, SeqCst);
        }
        let Layers { snaps, pool, .. } = layers;
        let snap = &mut snaps[target];
        self.copy_page(pending, snap, pool, page, head);
        self.snap.set_preserved(page);
        self.stats_preserved.fetch_add(1, SeqCst);
    }

    /// Makes `entries` layer `snap`'s own copy of head page `page` in a new pool page (a table
    /// page too if it has none there; the caller checked the pool has room) and queues the
    /// record that names it: a preserve, or a clone's first change of a page it read through
    /// its parent (the copy record is the same: replay takes the copy from its pool page).
    pub(super) fn copy_page(
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
        // A layer owns at most one copy of a page: a second would leave the first unreachable
        // (its pool page never freed) and the layer's view of the page split between them.
        let had = ts.page().entries.lock()[table_slot(page)];
        assert_eq!(had, 0, "layer {layer} copies map page {page} while it owns a copy (pool page {had})");
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
        pending.push(crate::map::Delta {
            preserve: Some((layer, page, copy, new_table)),
            ..crate::map::Delta::entry(0, 0, 0, MapEntry::UNALLOCATED, MapEntry::UNALLOCATED)
        });
    }

    /// The bytes of the copies whose preserve records are among the first `n` queued deltas,
    /// as they are once those `n` are durable: later queued changes of the copies undone.
    pub(in crate::map) fn preserved_copies(
        &self,
        pending: &Pending,
        n: usize,
    ) -> Vec<(u32, stria_dev::IoBuf)> {
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
        let undo = crate::map::undo_map(pending, n, |key| keys.contains(&key));
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
                crate::map::encode_page(mp.owner(), page, &entries, &mut buf);
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
        let tables = self.layout().pages().div_ceil(INDEX_ENTRIES as u64) as usize;
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
            for w in self.snap.preserved.read().iter() {
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
}
