//! The pool's side of the paged checksum tables (drive/csum.rs): how many pages each drive
//! keeps cached, and the repair of checksum pages found damaged while the pool runs.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering::Relaxed;

use stria_dev::{BLOCK_BYTES, BlockDevice};

use super::Pool;
use super::recovery::dirty_rows;
use crate::error::EngineError;
use crate::format::layout::CSUM_ENTRIES_PER_PAGE;

impl<D: BlockDevice> Pool<D> {
    /// Bounds the memory of the checksum tables to about `bytes` (`--metadata-cache`), split
    /// evenly over the drives present, at least one page each. Takes effect at once (clean
    /// pages beyond the new budget are dropped) and for drives added later.
    pub fn set_metadata_cache(&self, bytes: u64) {
        let drives = self.core.drives();
        let present = drives.iter().filter(|d| !d.is_missing()).count().max(1) as u64;
        let pages = (bytes / BLOCK_BYTES / present).max(1);
        self.core.csum_cache_pages.store(pages, Relaxed);
        for d in drives.iter().filter(|d| !d.is_missing()) {
            d.set_csum_cache_pages(pages);
        }
    }

    /// The checksum pages each drive may keep cached.
    pub fn csum_cache_pages_per_drive(&self) -> u64 {
        self.core.csum_cache_pages.load(Relaxed)
    }

    /// Resynchronises the rows covered by checksum pages found damaged since the last call (as
    /// recovery does for those found at open), then lets the pages be written back. Until then
    /// their blocks read as unverifiable (repaired from redundancy, or an error). Returns how
    /// many pages were repaired.
    pub(super) async fn repair_damaged_csum_pages(&self) -> Result<u64, EngineError> {
        let mut ranges: BTreeMap<u32, Vec<(u64, u64)>> = BTreeMap::new();
        let mut taken = Vec::new();
        for d in self.core.drives().iter().filter(|d| !d.is_failed()) {
            let pages = d.csum.take_damaged();
            if pages.is_empty() {
                continue;
            }
            tracing::warn!(slot = d.slot(), ?pages, "resynchronising the blocks of damaged checksum pages");
            let r = ranges.entry(d.slot()).or_default();
            for &p in &pages {
                r.push((p * CSUM_ENTRIES_PER_PAGE, CSUM_ENTRIES_PER_PAGE));
            }
            taken.push((d.clone(), pages));
        }
        if taken.is_empty() {
            return Ok(0);
        }
        for vol in self.volumes() {
            let map = vol.current_map();
            for (si, row) in dirty_rows(&vol, &map, &ranges) {
                if let Err(e) = vol.resync_row(&map, si, row).await {
                    // Try again at the next tick.
                    for (d, pages) in &taken {
                        d.csum.requeue_damaged(pages);
                    }
                    return Err(e);
                }
            }
        }
        let mut repaired = 0;
        for (d, pages) in taken {
            d.csum.mark_repaired(&pages);
            repaired += pages.len() as u64;
        }
        Ok(repaired)
    }
}
