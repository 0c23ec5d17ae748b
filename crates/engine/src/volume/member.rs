//! What a volume needs from each of its members (docs/design/seams.md §2.3): the drive of the
//! pool today, a drive on another node behind a session tomorrow. `volume/` reaches a member's
//! drive only through this trait: the methods it names are not callable on `Drive` otherwise
//! (they are private to `drive/`), so the surface cannot grow unnoticed.
//!
//! Blocks are the member's data-area blocks (`BLOCK_BYTES` each); every data method keeps the
//! member's per-block checksums (drive/csum.rs) in step with the data.

use std::future::Future;

use stria_dev::{DevError, IoBuf, IoBytes};

use crate::drive::ReadFault;
use crate::drive::csum::Entry;
use crate::drive::journal::{AppendError, JournalPiece};

/// One member drive of a volume. (Its identity and state, `slot()` and `is_failed()`, are
/// public on every drive and not repeated here.)
pub(crate) trait MemberDrive: Send + Sync {
    /// Reads `buf.len()` bytes at `block`, each block verified against its checksum;
    /// unwritten blocks read as zeros.
    fn read_verified(&self, block: u64, buf: IoBuf) -> impl Future<Output = Result<IoBuf, ReadFault>> + Send;

    /// [`MemberDrive::read_verified`] that also sets `crcs[i]` to block `i`'s checksum as
    /// verified (an unwritten block's is that of a zero block); on an error they mean nothing.
    fn read_verified_crcs<'a>(
        &'a self,
        block: u64,
        buf: IoBuf,
        crcs: &'a mut [u32],
    ) -> impl Future<Output = Result<IoBuf, ReadFault>> + Send + 'a;

    /// Reads `blocks` blocks for the repair paths, block by block after an I/O error: the data
    /// (bad blocks zeroed), which blocks are good, whether an I/O error happened; `None` for a
    /// failed member.
    fn read_isolating(
        &self,
        block: u64,
        blocks: u64,
    ) -> impl Future<Output = Option<(IoBuf, Vec<bool>, bool)>> + Send;

    /// Reads without verification (resync and scrub compare raw contents).
    fn read_raw(&self, block: u64, buf: IoBuf) -> impl Future<Output = Result<IoBuf, DevError>> + Send;

    /// Writes `data` at `block` and sets the blocks' checksums (and repeats it on the
    /// destination of an extent being moved).
    fn write(
        &self,
        block: u64,
        data: IoBytes,
        fua: bool,
    ) -> impl Future<Output = Result<(), DevError>> + Send;

    /// [`MemberDrive::write`] of data whose block checksums the caller already has, one per
    /// block: a block's CRC is computed once, where it enters, and not again for each copy or
    /// stripe member (debug builds check each against the data).
    fn write_carrying<'a>(
        &'a self,
        block: u64,
        data: IoBytes,
        fua: bool,
        crcs: &'a [u32],
    ) -> impl Future<Output = Result<(), DevError>> + Send + 'a;

    /// Marks blocks unwritten (they read as zeros; no data is written).
    fn zero(&self, block: u64, blocks: u64) -> impl Future<Output = Result<(), DevError>> + Send;

    /// True when every block of the range is known to be unwritten.
    fn is_unwritten(&self, block: u64, blocks: u64) -> impl Future<Output = bool> + Send;

    /// The checksum entries of a range.
    fn csum_entries(
        &self,
        block: u64,
        blocks: u64,
    ) -> impl Future<Output = Result<Vec<Entry>, DevError>> + Send;

    /// Sets the checksums of the blocks marked in `written` from `data` (resync trusts what it
    /// found).
    fn bless<'a>(
        &'a self,
        block: u64,
        data: &'a [u8],
        written: &'a [bool],
    ) -> impl Future<Output = Result<(), DevError>> + Send + 'a;

    /// Appends a stripe transaction's piece to the member's journal; returns its sequence.
    fn journal_append(&self, piece: JournalPiece) -> impl Future<Output = Result<u64, AppendError>> + Send;

    /// Counts `blocks` repaired on the member.
    fn record_repairs(&self, blocks: u64);
}
