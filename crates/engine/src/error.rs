//! Errors of the engine: one type for the I/O path, one for pool administration, and the kind
//! of failure each is ([`ErrorKind`]), which front ends map once per protocol.

use stria_dev::DevError;

use crate::format::FormatError;

/// What kind of failure an error is, whatever its origin: what a front end tells its client.
/// Each protocol maps kinds once (NBD errno values in the NBD export, HTTP status codes in the
/// REST API, later SCSI sense data); nothing chooses a reply by an error's text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// A malformed request: a bad size, name, layout or parameter.
    InvalidInput,
    /// The volume, drive, snapshot or job named does not exist.
    NotFound,
    /// The request conflicts with the state of things: a name taken, a rebuild in progress,
    /// a guard rail (clients attached, the last copy of some data).
    Conflict,
    /// A byte range outside the volume.
    OutOfRange,
    /// No space for the request: a thin volume's space is full, or the pool has no room for a
    /// new volume or extent.
    NoSpace,
    /// The volume takes no writes (a snapshot).
    ReadOnly,
    /// The data of the range is gone: more members lost or corrupt than the layout tolerates.
    Unrecoverable,
    /// A device or metadata write failed for a reason that says nothing about space.
    Io,
    /// The pool refuses writes until an operator frees space on the filesystem under the drives
    /// and clears the suspension (`stria pool clear`); retrying after that succeeds.
    Suspended,
    /// The volume was deleted or closed, or the pool is shutting down.
    Closed,
    /// Fast zeroing that would have to write data (NBD `FAST_ZERO`).
    NotCheap,
    /// The pool cannot be trusted or changed right now: too few drives for a quorum, a
    /// metadata commit that reached too few of them, a drive failure that could not be recorded
    /// (writes are refused until a restart).
    Unavailable,
}

/// Why a volume request failed. Every variant names the range involved.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    /// The request reaches past the end of the volume.
    #[error(
        "request at offset {offset_bytes} (+{len_bytes} bytes) is beyond the end of the volume ({size_bytes} bytes)"
    )]
    OutOfRange { offset_bytes: u64, len_bytes: u64, size_bytes: u64 },
    /// More members are unavailable or corrupt than the layout tolerates for this range.
    #[error(
        "data at offset {offset_bytes} (+{len_bytes} bytes) of volume {volume} is unrecoverable: {reason}"
    )]
    Unrecoverable { volume: String, offset_bytes: u64, len_bytes: u64, reason: String },
    /// A fast-zero request could not be served without writing data.
    #[error("zeroing {len_bytes} bytes at offset {offset_bytes} is not cheap on this layout")]
    NotCheap { offset_bytes: u64, len_bytes: u64 },
    /// The pool could not persist a change the request depends on (a drive failure).
    #[error("volume {volume}: {source}")]
    Pool {
        volume: String,
        #[source]
        source: Box<EngineError>,
    },
    /// The volume was deleted or the pool closed while the request was in flight.
    #[error("volume {0} is closed")]
    Closed(String),
    /// The write needs space that is not there: a thin volume whose space is full.
    #[error("volume {volume}: no space for {len_bytes} bytes at offset {offset_bytes}: {why}")]
    NoSpace { volume: String, offset_bytes: u64, len_bytes: u64, why: String },
    /// The volume takes no writes, zeroing or discards (a snapshot).
    #[error("volume {volume} is read-only")]
    ReadOnly { volume: String },
}

impl VolumeError {
    /// The kind of failure, for the front ends.
    pub fn kind(&self) -> ErrorKind {
        match self {
            VolumeError::OutOfRange { .. } => ErrorKind::OutOfRange,
            VolumeError::Unrecoverable { .. } => ErrorKind::Unrecoverable,
            VolumeError::NotCheap { .. } => ErrorKind::NotCheap,
            VolumeError::Pool { source, .. } => source.kind(),
            VolumeError::Closed(_) => ErrorKind::Closed,
            VolumeError::NoSpace { .. } => ErrorKind::NoSpace,
            VolumeError::ReadOnly { .. } => ErrorKind::ReadOnly,
        }
    }
}

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
}

impl EngineError {
    /// The kind of failure, for the front ends.
    pub fn kind(&self) -> ErrorKind {
        match self {
            EngineError::Dev(_) | EngineError::Format(_) => ErrorKind::Io,
            EngineError::ForeignDrive { .. }
            | EngineError::OldFormat { .. }
            | EngineError::StaleDrive { .. }
            | EngineError::DuplicateDrive { .. }
            | EngineError::VolumeExists(_)
            | EngineError::Placement(_)
            | EngineError::Busy(_) => ErrorKind::Conflict,
            EngineError::NoQuorum { .. } | EngineError::CommitFailed { .. } | EngineError::WritesRefused => {
                ErrorKind::Unavailable
            }
            EngineError::NoDrives | EngineError::Invalid(_) => ErrorKind::InvalidInput,
            EngineError::NoSuchVolume(_) | EngineError::NoSuchDrive(_) => ErrorKind::NotFound,
            EngineError::NoSpace(_) => ErrorKind::NoSpace,
            EngineError::Volume(v) => v.kind(),
            EngineError::HostFull(_) => ErrorKind::Suspended,
        }
    }
}
