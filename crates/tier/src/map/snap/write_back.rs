//! What a checkpoint writes for the layers (rule 7): table pages, directories and roots, the
//! layer table, in that order, after the map and snapshot pages.

use stria_dev::{BLOCK_USIZE, BlockDevice, IoBytes};

use super::{DirWrite, LayerWrites, Layers};
use crate::layers::{INDEX_ENTRIES, IndexLevel, IndexPage, LayerRecord, encode_layer_table};
use crate::map::{MapError, MapStore};

impl<D: BlockDevice> MapStore<D> {
    /// Takes what a checkpoint writes for the snapshots (with the log and `pending` locked, so
    /// no preserve is half taken).
    pub(in crate::map) fn take_layer_writes(&self) -> LayerWrites {
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
    pub(in crate::map) fn untake_layer_writes(&self, w: &LayerWrites) {
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
    pub(in crate::map) async fn write_layer_writes(&self, w: &LayerWrites) -> Result<(), MapError> {
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
            let layers = self.snap.layers.lock();
            w.tables
                .iter()
                .map(|(key, slot)| {
                    let tp = slot.page();
                    let mut entries = tp.entries.lock().clone();
                    let mut held_back = false;
                    for e in entries.iter_mut() {
                        // A table on disk naming a free pool page would give a later copy there
                        // to this layer too at the next open.
                        assert!(
                            *e == 0 || layers.pool.is_used(*e),
                            "layer {}'s table page {key} names pool page {e}, which is free",
                            tp.layer
                        );
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
    pub(in crate::map) fn layers_checkpointed(&self, until: u64) {
        self.snap.layers.lock().pool.checkpoint_done(until);
    }
}
