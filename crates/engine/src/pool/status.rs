//! A snapshot of the pool for `stria status` (human and JSON).

use std::sync::atomic::Ordering::Relaxed;

use stria_dev::counters::WRITE_SIZE_BUCKETS;
use stria_dev::{BLOCK_BYTES as BLOCK, BlockDevice};

use super::{Pool, RebuildProgress, RecoveryReport, alloc};
use crate::drive::Drive;
use crate::format::meta::{DriveState, ErrorCount, PoolMeta, VolumeRole};
use crate::volume::{Volume, VolumeState};

/// One drive.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct DriveStatus {
    /// Slot number: the drive's id within the pool.
    pub id: u32,
    pub uuid: String,
    pub path: String,
    pub class: String,
    pub domain: String,
    /// `active`, `failed`, `missing` or `spare`.
    pub state: String,
    pub failed_reason: Option<String>,
    pub size_bytes: u64,
    pub used_bytes: u64,
    pub read_ops: u64,
    pub bytes_read: u64,
    pub write_ops: u64,
    pub bytes_written: u64,
    /// Failed read requests, kept across restarts until cleared (`stria drive clear-errors`).
    pub read_errors: u64,
    /// Unix time of the last read error (`None` while there is none).
    pub last_read_error_unix_secs: Option<u64>,
    /// Failed write and flush requests, kept like `read_errors`.
    pub write_errors: u64,
    pub last_write_error_unix_secs: Option<u64>,
    /// Blocks found bad (checksum mismatch or unreadable) and rewritten from redundancy, kept
    /// like `read_errors`.
    pub checksum_repairs: u64,
    pub last_checksum_repair_unix_secs: Option<u64>,
    /// Intent regions (4 MiB) marked dirty right now.
    pub dirty_regions: u64,
    /// Journal bytes holding records not yet checkpointed.
    pub journal_used_bytes: u64,
    /// Writes by size: bucket `i` counts writes of [2^(12+i), 2^(13+i)) bytes (bucket 0: below 8 KiB).
    pub write_size_hist: [u64; WRITE_SIZE_BUCKETS],
    /// The drive's checksum page cache (pages resident, budget, loads, evictions, damaged).
    #[serde(default)]
    pub csum_cache: crate::CsumCacheStats,
    /// Being emptied by `drive remove` (its members move to other drives; it stays active).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub draining: bool,
}

/// One volume.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct VolumeStatus {
    pub name: String,
    pub id: u64,
    pub layout: String,
    pub size_bytes: u64,
    pub chunk_bytes: u64,
    pub class: String,
    /// `plain`, or `tier-part` for the parts of a tiered volume.
    pub role: String,
    pub state: VolumeState,
    pub rebuild: Option<RebuildProgress>,
    pub read_ops: u64,
    pub read_bytes: u64,
    pub write_ops: u64,
    pub write_bytes: u64,
    pub repaired_blocks: u64,
    pub degraded_reads: u64,
    pub full_stripe_writes: u64,
    pub partial_stripe_writes: u64,
}

/// The whole pool.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct PoolStatus {
    pub name: String,
    pub uuid: String,
    pub generation: u64,
    pub drives: Vec<DriveStatus>,
    pub volumes: Vec<VolumeStatus>,
    pub recovery: RecoveryReport,
    /// Devices found but left out at assembly (stale, foreign, replaced): path and reason.
    pub ignored_drives: Vec<IgnoredDrive>,
    /// Why writes are suspended (a full host filesystem, see `Pool::clear_suspension`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspended: Option<String>,
    /// Extents being moved (`pool rebalance`, `drive remove`); absent when there are none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rebalance: Option<super::RebalanceStatus>,
    /// The rebuild bandwidth limit in force, bytes per second (0: none).
    #[serde(default)]
    pub rebuild_rate_bytes_per_sec: u64,
}

/// A device left out of the pool at assembly.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct IgnoredDrive {
    pub path: String,
    pub reason: String,
}

impl<D: BlockDevice> Pool<D> {
    /// A snapshot of drives, volumes and counters.
    pub fn status(&self) -> PoolStatus {
        let meta = self.core.meta();
        let drives = self.core.drives().iter().map(|d| self.drive_status(&meta, d)).collect();
        let progress = self.rebuild_progress();
        let volumes = self
            .volumes()
            .iter()
            .map(|v| {
                let rebuild = progress.iter().find(|p| p.volume == v.name()).cloned();
                volume_status(&meta, v, rebuild)
            })
            .collect();
        PoolStatus {
            name: meta.name.clone(),
            uuid: meta.pool_uuid.to_string(),
            generation: meta.generation,
            drives,
            volumes,
            recovery: self.recovery.clone(),
            ignored_drives: self
                .ignored
                .iter()
                .map(|(p, r)| IgnoredDrive { path: p.clone(), reason: r.clone() })
                .collect(),
            suspended: self.core.suspension(),
            rebalance: Some(self.rebalance_status())
                .filter(|r| r.requested || !r.draining.is_empty() || r.current.is_some()),
            rebuild_rate_bytes_per_sec: self.rebuild_rate(),
        }
    }

    fn drive_status(&self, meta: &PoolMeta, d: &Drive<D>) -> DriveStatus {
        let rec = meta.drive(d.slot());
        let c = d.counters();
        let state = if d.is_missing() {
            "missing"
        } else {
            match rec.map(|r| r.state) {
                Some(DriveState::Failed) => "failed",
                Some(DriveState::Spare) => "spare",
                _ if d.is_failed() => "failed",
                _ => "active",
            }
        };
        let used: u64 = alloc::used_extents(meta, d.slot()).iter().map(|e| e.1).sum();
        let errors = self.drive_errors(d.slot());
        let last = |e: ErrorCount| (e.count > 0).then_some(e.last_unix_secs);
        DriveStatus {
            id: d.slot(),
            uuid: d.uuid().to_string(),
            path: rec.map(|r| r.path_hint.clone()).unwrap_or_default(),
            class: d.class().to_string(),
            domain: d.superblock().domain.clone(),
            state: state.into(),
            failed_reason: rec.and_then(|r| r.failed_reason.clone()),
            size_bytes: rec.map_or(0, |r| r.data_blocks * BLOCK),
            used_bytes: used * BLOCK,
            read_ops: c.read_ops,
            bytes_read: c.read_bytes,
            write_ops: c.write_ops,
            bytes_written: c.write_bytes,
            read_errors: errors.read_errors.count,
            last_read_error_unix_secs: last(errors.read_errors),
            write_errors: errors.write_errors.count,
            last_write_error_unix_secs: last(errors.write_errors),
            checksum_repairs: errors.checksum_repairs.count,
            last_checksum_repair_unix_secs: last(errors.checksum_repairs),
            dirty_regions: d.dirty_regions(),
            journal_used_bytes: d.journal_used_blocks() * BLOCK,
            write_size_hist: c.write_size_hist,
            csum_cache: d.csum_cache_stats(),
            draining: rec.is_some_and(|r| r.draining),
        }
    }
}

fn volume_status<D: BlockDevice>(
    meta: &PoolMeta,
    v: &Volume<D>,
    rebuild: Option<RebuildProgress>,
) -> VolumeStatus {
    let c = v.counters();
    VolumeStatus {
        name: v.name().to_string(),
        id: v.id(),
        layout: v.layout().to_string(),
        size_bytes: v.size_bytes(),
        chunk_bytes: v.chunk_bytes(),
        class: v.class().to_string(),
        role: match meta.volume(v.name()).map(|r| &r.role) {
            Some(VolumeRole::TierPart { .. }) => "tier-part".into(),
            _ => "plain".into(),
        },
        state: v.state(),
        rebuild,
        read_ops: c.read_ops.load(Relaxed),
        read_bytes: c.read_bytes.load(Relaxed),
        write_ops: c.write_ops.load(Relaxed),
        write_bytes: c.write_bytes.load(Relaxed),
        repaired_blocks: c.repaired_blocks.load(Relaxed),
        degraded_reads: c.degraded_reads.load(Relaxed),
        full_stripe_writes: c.full_stripe_writes.load(Relaxed),
        partial_stripe_writes: c.partial_stripe_writes.load(Relaxed),
    }
}
