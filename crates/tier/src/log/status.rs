//! The status of a log volume (`stria status --json`, metrics).

use std::sync::atomic::Ordering::Relaxed;

use serde::{Deserialize, Serialize};
use stria_dev::{BLOCK_BYTES, BlockDevice};
use stria_engine::VolumeState;

use super::LogVolume;
use crate::PartStatus;

/// Status for `stria status --json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LogStatus {
    pub name: String,
    pub layout: String,
    pub size_bytes: u64,
    pub state: VolumeState,
    /// Bytes the volume's live blocks take in the segment space (thin: allocated on write).
    pub allocated_bytes: u64,
    /// Data bytes of the segments that exist (allocated from the pool's capacity drives).
    pub space_bytes: u64,
    /// Data bytes the segment space may grow to (`--space`).
    pub space_max_bytes: u64,
    pub free_bytes: u64,
    pub garbage_bytes: u64,
    pub reserved_bytes: u64,
    pub segment_bytes: u64,
    pub free_segments: u64,
    pub segments: u64,
    /// How GC picks its victims (`volume create --gc`).
    #[serde(default)]
    pub gc: super::GcPolicy,
    /// When writes without FUA are acknowledged (`--cache-mode`; absent: write-through).
    #[serde(default)]
    pub cache_mode: super::CacheMode,
    pub cache_blocks: u64,
    /// Blocks the cache may grow to (as many as it has when it stays; absent: it stays).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_max_blocks: u64,
    /// Why the cache's last growth failed (it is tried again every few seconds), if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_growth_error: Option<String>,
    pub cache_live_blocks: u64,
    pub host_write_bytes: u64,
    pub host_read_bytes: u64,
    pub blocks_read_from_cache: u64,
    pub blocks_read_from_segments: u64,
    /// Writes into the cache ring and the batches they went in (host writes that arrive
    /// together share one write per run of consecutive cache blocks).
    #[serde(default)]
    pub cache_writes: u64,
    #[serde(default)]
    pub cache_write_batches: u64,
    pub destage_batches: u64,
    /// Of those, batches written into hot segments (GC policy `temperature`; left out when none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub destage_hot_batches: u64,
    pub destaged_blocks: u64,
    pub padded_slots: u64,
    pub gc_batches: u64,
    pub gc_moved_blocks: u64,
    pub gc_victims: u64,
    pub moves_lost: u64,
    /// Free segments given back to the pool since the volume was opened.
    pub segments_given_back: u64,
    /// Pages of the snapshot page pool (the map pages snapshots and clones own, and their
    /// indexes) in use, and in all (it grows when full, as far as the metadata part can).
    #[serde(default)]
    pub snapshot_pool_pages_used: u64,
    #[serde(default)]
    pub snapshot_pool_pages: u64,
    /// The map's log: blocks written (each one FUA write of the fast tier) and the deltas
    /// (changed map entries) they carried; checkpoints and the map pages they wrote.
    #[serde(default)]
    pub map_log_blocks_written: u64,
    #[serde(default)]
    pub map_deltas_logged: u64,
    #[serde(default)]
    pub map_checkpoints: u64,
    #[serde(default)]
    pub map_pages_written: u64,
    /// Why writes that need new space fail (with ENOSPC), if they do.
    pub no_space: Option<String>,
    /// True while writes that need new space fail: the volume's state reads `full` beside its
    /// redundancy state (`healthy, full`).
    #[serde(default)]
    pub full: bool,
    /// The volume was deleted while clones of its snapshots lived: it takes no I/O and is not
    /// listed as a volume; its parts stay for the clones until the last one is deleted.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deleted_for_clones: bool,
    /// Snapshots (and snapshots of clones) deleted whose map pages the background task has
    /// not handed on yet (their blocks come back as it does).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub deletes_in_progress: u64,
    pub write_amplification_fast: Option<f64>,
    pub write_amplification_capacity: Option<f64>,
    pub parts: Vec<PartStatus>,
}

impl<D: BlockDevice> LogVolume<D> {
    /// Status and counters.
    pub fn status(&self) -> LogStatus {
        let c = &self.counters;
        let counts = self.space_counts();
        let block = |n: u64| n * BLOCK_BYTES;
        let seg_data = self.geo.segment_data();
        let parts = crate::parts_status(
            &self.pool,
            &[("meta", &self.parts.meta), ("cache", &self.parts.cache), ("seg", &self.parts.seg)],
        );
        // This volume's own drive writes, not its drives' (which count every volume on them).
        let fast_written = parts[0].member_write_bytes + parts[1].member_write_bytes;
        let no_space = self.space.no_space.lock().clone();
        let host_written = c.host_write_bytes.load(Relaxed);
        let per_host_byte = |drive: u64| (host_written > 0).then(|| drive as f64 / host_written as f64);
        let map = self.map.stats();
        LogStatus {
            name: self.name.clone(),
            layout: self.layout(),
            size_bytes: self.size_bytes(),
            state: self.state(),
            allocated_bytes: block(counts.live_blocks),
            space_bytes: block(counts.segments * seg_data),
            space_max_bytes: block(counts.max_segments * seg_data),
            free_bytes: block(counts.free_segments * seg_data),
            garbage_bytes: block(counts.garbage_blocks),
            reserved_bytes: block(counts.reserve_segments * seg_data),
            segment_bytes: block(seg_data),
            free_segments: counts.free_segments,
            segments: counts.segments,
            gc: self.params().gc,
            cache_mode: self.cache_mode(),
            cache_blocks: self.ring.ring_blocks(),
            cache_max_blocks: self.cache_max_blocks(),
            cache_growth_error: self.cache_growth_error(),
            cache_live_blocks: self.ring.live(),
            host_write_bytes: host_written,
            host_read_bytes: c.host_read_bytes.load(Relaxed),
            blocks_read_from_cache: c.blocks_read_from_cache.load(Relaxed),
            blocks_read_from_segments: c.blocks_read_from_segments.load(Relaxed),
            cache_writes: c.cache_writes.load(Relaxed),
            cache_write_batches: c.cache_write_batches.load(Relaxed),
            destage_batches: c.destage_batches.load(Relaxed),
            destage_hot_batches: c.destage_hot_batches.load(Relaxed),
            destaged_blocks: c.destaged_blocks.load(Relaxed),
            padded_slots: c.padded_slots.load(Relaxed),
            gc_batches: c.gc_batches.load(Relaxed),
            gc_moved_blocks: c.gc_moved_blocks.load(Relaxed),
            gc_victims: c.gc_victims.load(Relaxed),
            moves_lost: c.moves_lost.load(Relaxed),
            segments_given_back: c.segments_given_back.load(Relaxed),
            snapshot_pool_pages_used: u64::from(self.map.pool_pages().0),
            snapshot_pool_pages: u64::from(self.map.pool_pages().1),
            map_log_blocks_written: map.log_blocks_written,
            map_deltas_logged: map.deltas_logged,
            map_checkpoints: map.checkpoints,
            map_pages_written: map.pages_written,
            full: no_space.is_some(),
            deleted_for_clones: self.origin_deleted(),
            deletes_in_progress: self.deletes_pending() as u64,
            no_space,
            write_amplification_fast: per_host_byte(fast_written),
            write_amplification_capacity: per_host_byte(parts[2].member_write_bytes),
            parts,
        }
    }
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
fn is_zero(n: &u64) -> bool {
    *n == 0
}
