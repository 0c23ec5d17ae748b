//! Rollback of the head to its newest snapshot: which pages changed, and the durable mark that
//! lets open finish a rollback a crash cut short.

use std::collections::BTreeSet;

use stria_dev::BlockDevice;

use super::layers_error;
use crate::map::{MapError, MapStore};

impl<D: BlockDevice> MapStore<D> {
    /// The head pages changed since snapshot `layer` was made: those it or a newer snapshot
    /// owns a copy of (every change after it was made copied the page into the newest first).
    /// A deleted snapshot kept for its clones is one too (a deleted origin's head goes back to
    /// the newest, [`Self::mark_rollback`]).
    pub async fn changed_since(&self, layer: u16) -> Result<Vec<u64>, MapError> {
        let snaps: Vec<(u16, Vec<u32>)> = {
            let l = self.snap.layers.lock();
            let k = l
                .snaps
                .iter()
                .position(|s| s.record.id == layer)
                .ok_or_else(|| layers_error(format!("no snapshot with layer id {layer}")))?;
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
    /// done): open finishes a rollback a crash cut short. The head of a deleted origin goes back
    /// to its newest snapshot, deleted and kept for its clones, to free the blocks only the
    /// head held (no one reads the head itself any more).
    pub async fn mark_rollback(&self, layer: u16) -> Result<(), MapError> {
        {
            let mut l = self.snap.layers.lock();
            let deleted = self.head_deleted();
            if layer != 0 && !l.snaps.iter().any(|s| s.record.id == layer && (deleted || !s.record.hidden)) {
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
