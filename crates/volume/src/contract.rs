//! The contract of a client-visible volume: what the NBD export (and any later front end) may
//! rely on, whatever kind of volume serves it. Plain engine volumes (`stria_engine::Volume`) and
//! tiered volumes (`stria_tier::log::LogVolume`) implement it; the catalog (`stria-catalog`)
//! hands out `Arc<dyn BlockVolume>`.
//!
//! The semantics are those the code has; where the two kinds differ, the contract promises the
//! weaker behaviour and the implementation notes name the stronger one.

use std::future::Future;
use std::pin::Pin;

use stria_dev::{IoBuf, IoBytes};

use crate::error::VolumeError;

/// How durable a write must be when it completes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// Durable once a later [`BlockVolume::flush`] completes; may sit in a volatile cache until then.
    Buffered,
    /// Durable when the call completes (NBD `FUA`).
    Fua,
}

impl Durability {
    /// `Fua` for `true`.
    pub fn from_fua(fua: bool) -> Durability {
        if fua { Durability::Fua } else { Durability::Buffered }
    }

    /// True for `Fua`.
    pub fn is_fua(self) -> bool {
        self == Durability::Fua
    }
}

/// May zeroing leave the range deallocated (reading as zeros, using no space)?
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dealloc {
    /// The range may become a hole.
    Allowed,
    /// NBD `NO_HOLE`: the client asks that the range stay allocated. **Not honoured yet**: both
    /// kinds of volume deallocate whole units whatever is asked (a hole reads as zeros, which is
    /// all a client can observe through reads; `block_status` then reports it unallocated).
    Forbidden,
}

/// What zeroing may cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ZeroCost {
    /// Zeros are written where dropping data is not possible.
    Any,
    /// NBD `FAST_ZERO`: fail with [`VolumeError::NotCheap`], changing nothing, if any data would
    /// have to be written.
    CheapOnly,
}

/// How a range is to be zeroed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Zeroing {
    /// May the range become a hole?
    pub dealloc: Dealloc,
    /// May data be written to zero it?
    pub cost: ZeroCost,
}

impl Zeroing {
    /// Any way that leaves zeros: holes allowed, data written where needed.
    pub const ANY: Zeroing = Zeroing { dealloc: Dealloc::Allowed, cost: ZeroCost::Any };

    /// True for [`ZeroCost::CheapOnly`].
    pub fn cheap_only(self) -> bool {
        self.cost == ZeroCost::CheapOnly
    }
}

/// Fixed facts about a volume.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeInfo {
    /// The volume's name in its pool.
    pub name: String,
    /// `ec:4+2`, `raid10:3x2`, ... or `tiered:ec:4+2`.
    pub layout: String,
    /// Aligned I/O of this size avoids read-modify-write below the volume (a chunk for plain
    /// volumes, a blockset for tiered ones).
    pub preferred_block_bytes: u64,
    /// Takes no writes, zeroing or discards (a snapshot): exported read-only.
    pub read_only: bool,
}

/// Health of a volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VolumeState {
    /// Every member is present.
    Healthy,
    /// Some members are missing; data is served from redundancy.
    Degraded,
    /// Members are being rebuilt.
    Rebuilding,
    /// More members are missing than the layout tolerates somewhere.
    Failed,
}

/// A run of the volume with one allocation state (for NBD `BLOCK_STATUS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// Length of the run.
    pub len_bytes: u64,
    /// True when the range was never written (or was trimmed/zeroed): it reads as zeros and
    /// uses no space.
    pub unallocated: bool,
}

/// A boxed, `Send` volume future.
pub type VolumeFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, VolumeError>> + Send + 'a>>;

/// A byte-addressed block volume as clients see it.
///
/// # Contract
///
/// - **Ranges.** Every call takes a byte offset and a byte length with any alignment. When
///   `offset + len` overflows or passes [`BlockVolume::size_bytes`] the call fails with
///   [`VolumeError::OutOfRange`] and changes nothing. `len == 0` only checks the range (`read`
///   returns an empty buffer). Aligned (offset and length multiples of
///   [`stria_dev::BLOCK_BYTES`]) writes skip the read-modify-write of edge blocks.
/// - **Size** is a multiple of [`stria_dev::BLOCK_BYTES`]; it changes only through the catalog
///   (resizing a plain volume).
/// - **Unaligned writes** read, merge and rewrite their edge blocks while holding a lock that
///   covers those blocks until the merged write completes, so writes to *disjoint* byte ranges
///   never undo each other, even inside one block. Writes whose byte ranges *overlap* leave the
///   shared blocks unspecified (one or the other). Plain volumes take the stripe locks for every
///   write, zeroing, discard, scrub and rebuild row, so an unaligned write is atomic against all of
///   them. Tiered volumes lock only the edge blocks of unaligned writes and zeroing edges: an
///   unaligned write racing a whole-block write of the same block may bring back that block's old
///   bytes outside the unaligned range.
/// - **Reads** take no lock; a read that overlaps an in-flight write returns, per block, the old
///   or the new contents. Every block is verified (checksum, or the tier record's crc) and never
///   returned corrupt.
/// - **Durability.** [`Durability::Buffered`] writes are durable once a later `flush` completes;
///   [`Durability::Fua`] writes when the call completes. A flush covers every write completed
///   before it on any connection (no state per caller). Tiered volumes make every acknowledged
///   write, zeroing and discard durable before completing, so `Fua` costs them nothing.
/// - **Zeroing** leaves the range reading as zeros. Whole units (a block on mirror layouts and in
///   the tier, a full row on ec) are dropped without writing data and then report unallocated;
///   partial units at the edges are written as zeros. [`ZeroCost::CheapOnly`] fails with
///   [`VolumeError::NotCheap`] before changing anything when there is an edge, or (ec) when the
///   volume is not healthy. [`Dealloc::Forbidden`] is not honoured yet (see it).
/// - **Discard** is a hint: afterwards each byte reads as before or as zero (today whole units
///   read as zero and edges are untouched). With `Fua` the discard is followed by a flush.
/// - **Compare and write** ([`BlockVolume::compare_and_write`], SCSI COMPARE AND WRITE, which
///   VMware's ATS locking uses) reads the range, compares it with `compare` and writes `write`
///   only when they are equal, atomically against every other write, zeroing, discard and
///   compare and write that overlaps the range: none lands between the compare and the write.
///   Plain volumes hold the stripe locks of the range throughout (the locks every write holds);
///   log-structured volumes hold their range locks exclusively (every host write, zeroing and
///   discard holds those of its range shared). Both buffers are one length of whole sectors
///   ([`crate::COMPARE_AND_WRITE_ALIGN_BYTES`]) at a sector offset, at most
///   [`crate::COMPARE_AND_WRITE_MAX_BYTES`]; otherwise `InvalidRequest` (checked before the
///   range). A mismatch is [`VolumeError::Miscompare`] with the first differing byte, and writes
///   nothing. Durability is that of a write. Reads take no lock, so a read may see the range
///   before or after a compare and write (per block, as with writes).
/// - **Cancellation.** Callers poll every future to completion: dropping one half way can leave
///   a journal batch, intent bit or checksum entry half done (ARCHITECTURE.md).
/// - **Errors.** `OutOfRange`; `Closed` (volume deleted or closed, pool closing); `NotCheap`
///   (`CheapOnly` zeroing only); `Unrecoverable` (more damage than the redundancy covers; a tiered
///   volume also stops taking writes after a failed record write until reopened); `NoSpace` (a
///   thin volume whose space is full: the write changed nothing that needs new space); `ReadOnly`
///   (a snapshot); `InvalidRequest` and `Miscompare` (compare and write only); `Pool` (the pool
///   refused: writes suspended on a full host filesystem, a drive failure that could not be
///   committed). Front ends choose their answer by [`VolumeError::kind`], never by the text.
///   After a failed write or zeroing the range holds, per block, the old or the new contents.
pub trait BlockVolume: Send + Sync + 'static {
    /// Name, layout and preferred I/O size.
    fn info(&self) -> VolumeInfo;
    /// Size in bytes (a multiple of 4096).
    fn size_bytes(&self) -> u64;
    /// Reads `len_bytes` at `offset_bytes`.
    fn read(&self, offset_bytes: u64, len_bytes: usize) -> VolumeFuture<'_, IoBuf>;
    /// Writes `data` at `offset_bytes`.
    fn write(&self, offset_bytes: u64, data: IoBytes, durability: Durability) -> VolumeFuture<'_, ()>;
    /// Writes `write` at `offset_bytes` only if the range holds `compare` now, atomically against
    /// every overlapping write (see the contract, "Compare and write"). `compare` and `write`
    /// are one length, whole sectors at a sector offset, at most
    /// [`crate::COMPARE_AND_WRITE_MAX_BYTES`]. On a mismatch it fails with
    /// [`VolumeError::Miscompare`] and writes nothing.
    ///
    /// No default: one that read, compared and wrote through the other calls would not be atomic,
    /// so every kind of volume implements it under its own locks (or refuses, as a snapshot does).
    fn compare_and_write(
        &self,
        offset_bytes: u64,
        compare: IoBytes,
        write: IoBytes,
        durability: Durability,
    ) -> VolumeFuture<'_, ()>;
    /// Makes `len_bytes` at `offset_bytes` read as zeros.
    fn write_zeroes(
        &self,
        offset_bytes: u64,
        len_bytes: u64,
        zeroing: Zeroing,
        durability: Durability,
    ) -> VolumeFuture<'_, ()>;
    /// Discards a range (a hint; see the contract).
    fn discard(&self, offset_bytes: u64, len_bytes: u64, durability: Durability) -> VolumeFuture<'_, ()>;
    /// Makes every write, zeroing and discard completed before this call durable.
    fn flush(&self) -> VolumeFuture<'_, ()>;
    /// Allocation map of a range as coalesced extents covering exactly the range; `unallocated`
    /// means it reads as zeros without being stored ("allocated" when in doubt).
    fn block_status(&self, offset_bytes: u64, len_bytes: u64) -> VolumeFuture<'_, Vec<Extent>>;
}
