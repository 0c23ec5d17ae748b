//! stria's block engine: pools of drives and the volumes carved from them.
//!
//! * [`Pool`]: create, assemble (from drives found in any order), volumes, drive failure and
//!   replacement, rebuild, scrub, status.
//! * [`Volume`]: the byte-addressed block interface (read, write with FUA, write-zeroes, trim,
//!   flush, block status) over raid0/1/10 and erasure-coded layouts, with per-block checksums.
//! * [`maint`]: the maintenance services of an open pool (tick, rebuild and moves with retries,
//!   drained drives taken out) and the guarded drive workflows, for whoever owns the pool.
//!
//! Design: docs/engine.md. On-disk format: docs/on-disk-format.md. Crash consistency:
//! docs/crash-consistency.md.
#![forbid(unsafe_code)]
// Block and region numbers are u64 and index in-memory tables; stria runs on 64-bit Linux only
// (asserted below), where `u64 as usize` is lossless. Narrowing to u32/u16 still uses try_from.
#![allow(clippy::cast_possible_truncation)]

const _: () = assert!(usize::BITS == 64, "stria needs a 64-bit target");

pub mod drive;
mod error;
pub mod format;
#[doc(hidden)]
pub mod fuzzing;
pub(crate) mod gate;
mod join;
pub mod maint;
pub mod pagecache;
pub mod pool;
pub mod qos;
mod time;
pub mod units;
pub mod volume;

pub use drive::csum::{CsumCacheStats, DEFAULT_CSUM_CACHE_PAGES};
pub use drive::{Drive, DriveLabel, read_label};
pub use error::{EngineError, ErrorKind, PoolFailure, VolumeError};
pub use format::meta::{
    Calibration, ClassCalibration, DriveClass, DriveErrors, DriveState, ErrorCount, Layout, OutRecord,
    PoolMeta, QosSpec, TieredRecord, VolumeRole,
};
pub use join::join_all_ok;
pub use pool::{
    BALANCE_SLACK, Comeback, CommitGuard, DEFAULT_CHUNK_BYTES, DriveStatus, FoundDrive, IgnoredDrive,
    MOVE_CURSOR_STEP_BYTES, MoveProgress, NewDrive, Pool, PoolStatus, RebalanceReport, RebalanceStatus,
    RebuildCounters, RebuildProgress, RecoveryReport, ScrubReport, VOLUME_BYTES_MAX, VolumeSpec,
    VolumeStatus, check_chunk_size, check_volume_name, check_volume_size,
};
pub use volume::contract::{
    BlockVolume, COMPARE_AND_WRITE_ALIGN_BYTES, COMPARE_AND_WRITE_MAX_BYTES, Dealloc, Durability,
    VolumeFuture, VolumeInfo, ZeroCost, Zeroing,
};
pub use volume::{BlockLocation, BlockRole, Extent, Volume, VolumeState};
