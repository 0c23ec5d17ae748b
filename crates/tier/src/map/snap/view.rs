//! Reads through the layers: a snapshot's or clone's view of a block, which layer holds a
//! place (destage and GC ask), the scan of the copies for live counts at open, and the blocks
//! each snapshot references.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering::SeqCst;

use stria_dev::{BLOCK_BYTES, BlockDevice};

use super::{layers_error, table_index, table_slot};
use crate::layers::INDEX_ENTRIES;
use crate::map::{ENTRIES_PER_PAGE, MapEntry, MapError, MapStore};

impl<D: BlockDevice> MapStore<D> {
    /// Blocks each snapshot's view maps to data (a segment block or a cache position: not
    /// zeros, not unallocated) within its size, by layer id, oldest first, those deleted and
    /// kept for clones included: what it references. One pass over the head's pages (read in
    /// runs, not cached) and one read of each copy the snapshots own, whatever their number.
    /// Writes going on meanwhile make it a moment's figure, as [`MapStore::exclusive_blocks`].
    pub async fn referenced_blocks(&self) -> Result<Vec<(u16, u64)>, MapError> {
        let _no_delete = self.snap.gate.read().await;
        // (id, blocks in its size, directory), oldest first.
        let snaps: Vec<(u16, u64, Vec<u32>)> = {
            let l = self.snap.layers.lock();
            l.snaps
                .iter()
                .map(|s| (s.record.id, s.record.logical_bytes / BLOCK_BYTES, s.dir.clone()))
                .collect()
        };
        if snaps.is_empty() {
            return Ok(Vec::new());
        }
        // The pages some snapshot owns a copy of, with (snapshot index, pool page) per owner.
        let mut owned: BTreeMap<u64, Vec<(usize, u32)>> = BTreeMap::new();
        for (k, (id, _, dir)) in snaps.iter().enumerate() {
            for (ti, &table) in dir.iter().enumerate() {
                if table != 0 {
                    for (page, pool) in self.owned_in_table(*id, table, ti).await? {
                        owned.entry(page).or_default().push((k, pool));
                    }
                }
            }
        }
        let data = |entries: &[MapEntry], first: u64, end: u64| {
            let within = end.saturating_sub(first).min(entries.len() as u64) as usize;
            entries[..within]
                .iter()
                .filter(|e| matches!(e.place, crate::map::Place::Segment(_) | crate::map::Place::Cache(_)))
                .count() as u64
        };
        let mut refs = vec![0u64; snaps.len()];
        // Every snapshot sees a page no snapshot owns as the head has it.
        let mut heads: HashMap<u64, Box<[MapEntry]>> = HashMap::new();
        self.scan(|first, entries| {
            let page = first / ENTRIES_PER_PAGE;
            if owned.contains_key(&page) {
                heads.insert(page, entries.into());
            } else {
                for (k, s) in snaps.iter().enumerate() {
                    refs[k] += data(entries, first, s.1);
                }
            }
        })
        .await?;
        // A page some own: newest to oldest, each sees its own copy, else the next newer's view.
        for (&page, owners) in &owned {
            let first = page * ENTRIES_PER_PAGE;
            let mut view = heads
                .remove(&page)
                .ok_or_else(|| layers_error(format!("a snapshot owns page {page}, past the head's end")))?;
            for k in (0..snaps.len()).rev() {
                if let Some(&(_, pool)) = owners.iter().find(|o| o.0 == k) {
                    view = self.pool_page(pool, snaps[k].0, page).await?.page().entries.lock().clone();
                }
                refs[k] += data(&view, first, snaps[k].1);
            }
        }
        Ok(snaps.iter().zip(refs).map(|(s, r)| (s.0, r)).collect())
    }

    /// The entries of `blocks` as snapshot or clone `layer` sees them.
    pub async fn get_in(&self, layer: u16, blocks: &[u64]) -> Result<Vec<MapEntry>, MapError> {
        let chained = {
            let l = self.snap.layers.lock();
            match l.clones.iter().find(|c| c.record.id == layer && !c.record.hidden) {
                Some(_) => true,
                None => {
                    l.visible(layer).map_err(|_| MapError::LayerGone { layer })?;
                    false
                }
            }
        };
        let mut out = Vec::with_capacity(blocks.len());
        for &block in blocks {
            if block >= self.blocks() {
                return Err(MapError::OutOfRange { block, blocks: self.blocks() });
            }
            // A clone's or frozen layer's own copy of the page, else its parent's view. A write
            // racing the read may make the copy in between: the read then sees the block before.
            out.push(if chained {
                self.chain_entry(layer, block).await?
            } else {
                self.view_entry(layer, block).await?
            });
        }
        Ok(out)
    }

    /// [`MapStore::get_in`] for a snapshot or frozen layer, also one deleted and kept for its
    /// clones (which read through it): for checks and diagnostics.
    pub async fn get_in_kept(&self, layer: u16, blocks: &[u64]) -> Result<Vec<MapEntry>, MapError> {
        let chained = self.snap.layers.lock().clones.iter().any(|c| c.record.id == layer);
        let mut out = Vec::with_capacity(blocks.len());
        for &block in blocks {
            if block >= self.blocks() {
                return Err(MapError::OutOfRange { block, blocks: self.blocks() });
            }
            out.push(if chained {
                self.chain_entry(layer, block).await?
            } else {
                self.view_entry(layer, block).await?
            });
        }
        Ok(out)
    }

    /// The entry of `block` as snapshot `layer` sees it (a deleted one kept for its clones too).
    pub(super) async fn view_entry(&self, layer: u16, block: u64) -> Result<MapEntry, MapError> {
        let page = block / ENTRIES_PER_PAGE;
        let at = (block % ENTRIES_PER_PAGE) as usize;
        'resolve: loop {
            let generation = self.snap.generation.load(SeqCst);
            let chain: Vec<(u16, u32)> = {
                let l = self.snap.layers.lock();
                let k =
                    l.snaps.iter().position(|s| s.record.id == layer).ok_or(MapError::LayerGone { layer })?;
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
    pub async fn holding(
        &self,
        items: &[(u64, crate::map::Place)],
    ) -> Result<Vec<Option<MapEntry>>, MapError> {
        // A block past the map's end (the volume shrank; a summary or cache position may still
        // name it) is held by nobody.
        let end = self.blocks();
        if items.iter().any(|i| i.0 >= end) {
            let inside: Vec<(u64, crate::map::Place)> = items.iter().copied().filter(|i| i.0 < end).collect();
            let mut found = Box::pin(self.holding(&inside)).await?.into_iter();
            return Ok(items
                .iter()
                .map(|i| if i.0 < end { found.next().expect("one per item") } else { None })
                .collect());
        }
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
        let pages = self.layout().pages();
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
}
