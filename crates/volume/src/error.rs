//! What went wrong with a volume request ([`VolumeError`]) and what kind of failure it is
//! ([`ErrorKind`]), which front ends map once per protocol.

use std::error::Error;
use std::fmt;

/// What kind of failure an error is, whatever its origin: what a front end tells its client.
/// Each protocol maps kinds once (`stria-front`'s tables: NBD errno values, HTTP status codes,
/// SCSI sense data); nothing chooses a reply by an error's text.
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
    /// A compare and write ([`crate::BlockVolume::compare_and_write`]) found other data than it
    /// was to compare with, and wrote nothing (SCSI MISCOMPARE).
    Miscompare,
}

impl ErrorKind {
    /// Every kind, for tables and their tests.
    pub const ALL: [ErrorKind; 13] = [
        ErrorKind::InvalidInput,
        ErrorKind::NotFound,
        ErrorKind::Conflict,
        ErrorKind::OutOfRange,
        ErrorKind::NoSpace,
        ErrorKind::ReadOnly,
        ErrorKind::Unrecoverable,
        ErrorKind::Io,
        ErrorKind::Suspended,
        ErrorKind::Closed,
        ErrorKind::NotCheap,
        ErrorKind::Unavailable,
        ErrorKind::Miscompare,
    ];
}

/// An error of whatever hosts a volume (the engine's pool), carried by [`VolumeError::Pool`]
/// with its kind. The contract does not know the host's error type: the host implements this
/// for it, and callers that know the type get it back with [`dyn PoolFailure::downcast_ref`].
pub trait PoolFailure: Error + Send + Sync + 'static {
    /// The kind of failure (what [`VolumeError::kind`] answers for [`VolumeError::Pool`]).
    fn kind(&self) -> ErrorKind;
}

impl dyn PoolFailure {
    /// True when the error is a `T`.
    pub fn is<T: PoolFailure>(&self) -> bool {
        (self as &dyn Error).is::<T>()
    }

    /// The error as a `T`, when it is one.
    pub fn downcast_ref<T: PoolFailure>(&self) -> Option<&T> {
        (self as &dyn Error).downcast_ref::<T>()
    }

    /// The error as a `T`, when it is one; itself otherwise.
    pub fn downcast<T: PoolFailure>(self: Box<Self>) -> Result<Box<T>, Box<Self>> {
        if !self.is::<T>() {
            return Err(self);
        }
        let any: Box<dyn Error + Send + Sync> = self;
        Ok(any.downcast::<T>().expect("checked to be a T just above"))
    }
}

/// Why a volume request failed. Every variant names the range involved.
#[derive(Debug)]
pub enum VolumeError {
    /// The request reaches past the end of the volume.
    OutOfRange {
        /// Start of the request.
        offset_bytes: u64,
        /// Length of the request.
        len_bytes: u64,
        /// Size of the volume.
        size_bytes: u64,
    },
    /// More members are unavailable or corrupt than the layout tolerates for this range.
    Unrecoverable {
        /// The volume's name.
        volume: String,
        /// Start of the range lost.
        offset_bytes: u64,
        /// Length of the range lost.
        len_bytes: u64,
        /// What was lost, for the log.
        reason: String,
    },
    /// A fast-zero request could not be served without writing data.
    NotCheap {
        /// Start of the request.
        offset_bytes: u64,
        /// Length of the request.
        len_bytes: u64,
    },
    /// The pool could not persist a change the request depends on (a drive failure), or
    /// refused the request (writes suspended on a full host filesystem).
    Pool {
        /// The volume's name.
        volume: String,
        /// The pool's error (the engine's `EngineError`), with its kind.
        source: Box<dyn PoolFailure>,
    },
    /// The volume was deleted or the pool closed while the request was in flight.
    Closed(String),
    /// The write needs space that is not there: a thin volume whose space is full.
    NoSpace {
        /// The volume's name.
        volume: String,
        /// Start of the request.
        offset_bytes: u64,
        /// Length of the request.
        len_bytes: u64,
        /// Which space is full.
        why: String,
    },
    /// The volume takes no writes, zeroing or discards (a snapshot).
    ReadOnly {
        /// The volume's name.
        volume: String,
    },
    /// A request of a shape the contract refuses whatever the volume holds (a compare and write
    /// whose buffers differ in length, are not whole sectors, or are too long): nothing changed.
    InvalidRequest {
        /// Start of the request.
        offset_bytes: u64,
        /// Length of the request.
        len_bytes: u64,
        /// What is wrong with it.
        why: String,
    },
    /// A compare and write found other data than it was to compare with: nothing was written.
    Miscompare {
        /// The volume's name.
        volume: String,
        /// Start of the request.
        offset_bytes: u64,
        /// Length of the request.
        len_bytes: u64,
        /// Bytes from `offset_bytes` to the first byte that differs (what SCSI reports in the
        /// INFORMATION field of its MISCOMPARE sense data).
        miscompare_offset_bytes: u64,
    },
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
            VolumeError::InvalidRequest { .. } => ErrorKind::InvalidInput,
            VolumeError::Miscompare { .. } => ErrorKind::Miscompare,
        }
    }
}

// Written out rather than derived (thiserror): the source of `Pool` is a trait object of the
// contract's own trait, which the derive cannot turn into `&dyn Error`.
impl fmt::Display for VolumeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VolumeError::OutOfRange { offset_bytes, len_bytes, size_bytes } => write!(
                f,
                "request at offset {offset_bytes} (+{len_bytes} bytes) is beyond the end of the volume ({size_bytes} bytes)"
            ),
            VolumeError::Unrecoverable { volume, offset_bytes, len_bytes, reason } => write!(
                f,
                "data at offset {offset_bytes} (+{len_bytes} bytes) of volume {volume} is unrecoverable: {reason}"
            ),
            VolumeError::NotCheap { offset_bytes, len_bytes } => {
                write!(f, "zeroing {len_bytes} bytes at offset {offset_bytes} is not cheap on this layout")
            }
            VolumeError::Pool { volume, source } => write!(f, "volume {volume}: {source}"),
            VolumeError::Closed(volume) => write!(f, "volume {volume} is closed"),
            VolumeError::NoSpace { volume, offset_bytes, len_bytes, why } => {
                write!(f, "volume {volume}: no space for {len_bytes} bytes at offset {offset_bytes}: {why}")
            }
            VolumeError::ReadOnly { volume } => write!(f, "volume {volume} is read-only"),
            VolumeError::InvalidRequest { offset_bytes, len_bytes, why } => {
                write!(f, "invalid request at offset {offset_bytes} (+{len_bytes} bytes): {why}")
            }
            VolumeError::Miscompare { volume, offset_bytes, len_bytes, miscompare_offset_bytes } => write!(
                f,
                "volume {volume}: compare and write at offset {offset_bytes} (+{len_bytes} bytes) found other data, first at byte {miscompare_offset_bytes} of the request; nothing was written"
            ),
        }
    }
}

impl Error for VolumeError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            VolumeError::Pool { source, .. } => Some(&**source as &(dyn Error + 'static)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Full;

    impl fmt::Display for Full {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("the host filesystem is full")
        }
    }

    impl Error for Full {}

    impl PoolFailure for Full {
        fn kind(&self) -> ErrorKind {
            ErrorKind::Suspended
        }
    }

    #[test]
    fn a_pool_failure_keeps_its_kind_its_text_and_its_type() {
        let e = VolumeError::Pool { volume: "v".into(), source: Box::new(Full) };
        assert_eq!(e.kind(), ErrorKind::Suspended);
        assert_eq!(e.to_string(), "volume v: the host filesystem is full");
        let source = e.source().expect("a source");
        assert!(source.downcast_ref::<Full>().is_some(), "the chain reaches the pool's own type");
        let VolumeError::Pool { source, .. } = e else { unreachable!() };
        assert!(source.is::<Full>() && source.downcast_ref::<Full>().is_some());
        assert!(source.downcast::<Full>().is_ok());
    }

    #[test]
    fn every_kind_is_listed_once() {
        let mut seen = std::collections::HashSet::new();
        for kind in ErrorKind::ALL {
            assert!(seen.insert(kind), "{kind:?} twice");
            // A new kind fails to compile here: add it to this match and to `ALL`.
            match kind {
                ErrorKind::InvalidInput
                | ErrorKind::NotFound
                | ErrorKind::Conflict
                | ErrorKind::OutOfRange
                | ErrorKind::NoSpace
                | ErrorKind::ReadOnly
                | ErrorKind::Unrecoverable
                | ErrorKind::Io
                | ErrorKind::Suspended
                | ErrorKind::Closed
                | ErrorKind::NotCheap
                | ErrorKind::Unavailable
                | ErrorKind::Miscompare => {}
            }
        }
    }
}
