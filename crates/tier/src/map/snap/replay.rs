//! Replay of the layers' log records at open: preserves (copies), moves of snapshot entries.

use std::sync::Arc;

use stria_dev::BlockDevice;
use stria_engine::pagecache::Slot;

use super::{Layers, TablePage, layers_error, table_index, table_slot};
use crate::layers::INDEX_ENTRIES;
use crate::map::{ENTRIES_PER_PAGE, MapEntry, MapError, MapStore};

impl<D: BlockDevice> MapStore<D> {
    /// Notes a layer id named by a replayed record: ids are not given out again while the
    /// log may hold records of them.
    pub(super) fn saw_layer(&self, layer: u16) {
        let mut l = self.snap.layers.lock();
        l.next_id = l.next_id.max(layer.saturating_add(1));
    }

    /// The table page of snapshot `layer` covering head page `page`; made as pool page `table`
    /// when the snapshot has none there yet (`table` is what the record that makes it names;
    /// `claim`: take it from the pool, as replay does). `None` if `layer` is not known.
    pub(super) async fn table_for(
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
    pub(in crate::map) async fn replay_preserve(
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
    pub(in crate::map) async fn replay_snapshot_entry(
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
