//! Errors of the engine: one type for the I/O path ([`VolumeError`], part of the volume
//! contract in `stria-volume`), one for pool administration ([`EngineError`]), and the kind of
//! failure each is ([`ErrorKind`], also the contract's), which front ends map once per protocol.

use stria_dev::DevError;
pub use stria_volume::{ErrorKind, PoolFailure, VolumeError};

use crate::format::FormatError;

/// Why a pool operation failed. Messages say what is wrong and, where possible, what would fix it.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Dev(#[from] DevError),
    #[error("on-disk format: {0}")]
    Format(#[from] FormatError),
    /// A drive that belongs to no pool or to another pool.
    #[error("{path}: {reason}")]
    ForeignDrive { path: String, reason: String },
    /// A drive of a pool made by an older stria, whose on-disk format this build does not open.
    #[error(
        "{path}: drive of pool `{pool}`, made by an older stria (on-disk format {found}; this stria opens format \
         {wants} only: its tiered volumes are log-structured and the old in-place ones cannot be read). Nothing \
         was written to it. To move the data: open the pool with the stria that made it, `stria volume export` \
         each volume, then `stria volume import` them into a pool made by this stria"
    )]
    OldFormat { path: String, pool: String, found: u32, wants: u32 },
    /// A drive the pool has moved on without.
    #[error(
        "{path}: stale drive (slot {slot}, generation {drive_generation}; the pool is at generation {pool_generation}): {reason}"
    )]
    StaleDrive { path: String, slot: u32, drive_generation: u64, pool_generation: u64, reason: String },
    /// Too few drives to trust the metadata. The message names no flag: which command can force
    /// the open is the caller's to say (the `stria` binary adds it).
    #[error(
        "only {present} of the pool's {total} active drives were found (need {needed}); missing: {missing}. \
         If those drives are gone for good, the pool can still be opened without them (a forced open), \
         losing any drive failure or change recorded only on them"
    )]
    NoQuorum { present: usize, total: usize, needed: usize, missing: String },
    /// The same drive was given twice.
    #[error("drive {uuid} appears twice: {first} and {second}")]
    DuplicateDrive { uuid: String, first: String, second: String },
    #[error("no drives given")]
    NoDrives,
    #[error("volume `{0}` already exists")]
    VolumeExists(String),
    #[error("no volume named `{0}`")]
    NoSuchVolume(String),
    #[error("no drive `{0}` in the pool")]
    NoSuchDrive(String),
    /// The layout cannot be placed on the pool's drives.
    #[error("{0}")]
    Placement(String),
    /// Not enough free space.
    #[error("{0}")]
    NoSpace(String),
    /// A malformed request (bad size, name, layout parameters...).
    #[error("{0}")]
    Invalid(String),
    /// The operation conflicts with the volume's state (e.g. a rebuild in progress).
    #[error("{0}")]
    Busy(String),
    /// Metadata could not be written to a majority of drives.
    #[error(
        "metadata generation {generation} reached only {written} of {total} drives (need {needed}); the change was not made"
    )]
    CommitFailed { generation: u64, written: usize, total: usize, needed: usize },
    #[error(transparent)]
    Volume(#[from] VolumeError),
    /// Writes are suspended: the filesystem (or quota) holding the drives ran out of space.
    /// Nothing was failed; once space is freed, clearing the suspension resumes writes. The
    /// message names no command (the `stria` binary adds it).
    #[error("writes are suspended: {0}")]
    HostFull(String),
    /// A drive failure could not be recorded in the metadata: no write or flush may be
    /// acknowledged any more (a drive the metadata still calls active would miss it).
    #[error("the pool could not record a drive failure in its metadata; it refuses writes until restarted")]
    WritesRefused,
    /// A drive answered that a newer owner of the pool fenced it (a remote slice whose epoch
    /// is above this owner's; docs/design/cluster.md): the pool refuses writes and fails no drive.
    #[error("a newer owner fenced this pool's drives; it refuses writes")]
    Fenced,
    /// The pool's commit guard refused a metadata change (a cluster coordinator that no longer
    /// owns the volume, or cannot reach etcd to record the change); nothing was written.
    #[error("the metadata change was refused: {0}")]
    GuardRefused(String),
    /// A guarded drive workflow refused: going ahead would lose data or makes no sense in the
    /// drive's state (`crate::maint`). The same request, forced, goes ahead where it can.
    #[error(transparent)]
    Refused(#[from] crate::maint::Refusal),
}

impl EngineError {
    /// The kind of failure, for the front ends.
    pub fn kind(&self) -> ErrorKind {
        match self {
            EngineError::Dev(e) if e.is_fenced() => ErrorKind::Unavailable,
            EngineError::Dev(_) | EngineError::Format(_) => ErrorKind::Io,
            EngineError::ForeignDrive { .. }
            | EngineError::OldFormat { .. }
            | EngineError::StaleDrive { .. }
            | EngineError::DuplicateDrive { .. }
            | EngineError::VolumeExists(_)
            | EngineError::Placement(_)
            | EngineError::Busy(_)
            | EngineError::Refused(_) => ErrorKind::Conflict,
            EngineError::NoQuorum { .. }
            | EngineError::CommitFailed { .. }
            | EngineError::WritesRefused
            | EngineError::Fenced
            | EngineError::GuardRefused(_) => ErrorKind::Unavailable,
            EngineError::NoDrives | EngineError::Invalid(_) => ErrorKind::InvalidInput,
            EngineError::NoSuchVolume(_) | EngineError::NoSuchDrive(_) => ErrorKind::NotFound,
            EngineError::NoSpace(_) => ErrorKind::NoSpace,
            EngineError::Volume(v) => v.kind(),
            EngineError::HostFull(_) => ErrorKind::Suspended,
        }
    }
}

/// What a volume's [`VolumeError::Pool`] carries: the pool's error, with its kind.
impl PoolFailure for EngineError {
    fn kind(&self) -> ErrorKind {
        EngineError::kind(self)
    }
}
