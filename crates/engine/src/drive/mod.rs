//! One pool member: a device plus its checksum table, intent bitmap and journal.
//!
//! Every read of the data area is verified against the checksum table before it is handed up;
//! every write is covered by the intent bitmap and updates the table when it completes.

pub mod csum;
pub(crate) mod errors;
pub(crate) mod intent;
pub(crate) mod journal;
mod member;
pub(crate) mod out;
pub(crate) mod shadow;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use stria_dev::{
    BLOCK_BYTES as BLOCK, BLOCK_USIZE, BlockDevice, DevCountersSnapshot, DevError, IoBuf, IoBytes,
};
use uuid::Uuid;

use crate::format::FormatError;
use crate::format::flush_record::{FLUSH_RECORD_OFFSET_BYTES, FlushRecord};
use crate::format::layout::{DriveLayout, INTENT_REGION_BLOCKS};
use crate::format::meta::{DriveClass, DriveErrors, PoolMeta};
use crate::format::superblock::Superblock;
use crate::time::now_unix_secs;
use csum::{ChecksumTable, CsumCacheStats, Entry, Pinned, block_crc};
use errors::{ErrorKind, PendingErrors};
use intent::IntentMap;
pub(crate) use journal::Watermarks;
use journal::{AppendError, Journal, JournalPiece, RecoveredPiece};
use out::OutMap;

/// Why a verified read did not return data.
#[derive(Debug)]
pub(crate) enum ReadFault {
    /// The drive is failed (or was failed while the request ran).
    Failed,
    /// The device reported an error.
    Io(DevError),
    /// The data came back but these blocks (indices within the request) fail their checksum.
    Corrupt { buf: IoBuf, bad: Vec<usize> },
}

/// What opening a drive found that recovery must deal with.
#[derive(Debug, Default)]
pub(crate) struct OpenFindings {
    /// Intent regions marked dirty (data blocks `r * INTENT_REGION_BLOCKS ..`).
    pub(crate) dirty_regions: Vec<u64>,
    /// Checksum pages that failed their CRC (their blocks need resynchronisation).
    pub(crate) bad_csum_pages: Vec<u64>,
    /// Journal records after the checkpoint.
    pub(crate) journal: Vec<RecoveredPiece>,
    /// What the journal header says is durable.
    pub(crate) watermarks: Watermarks,
    /// The out generation every out page carries, if they all carry one (the pool keeps it open
    /// only if a failed drive's record names it).
    pub(crate) out_generation: Option<u64>,
}

/// The next [`Drive`] object's `incarnation`.
static NEXT_INCARNATION: AtomicU64 = AtomicU64::new(1);

/// One drive of a pool.
pub struct Drive<D> {
    /// `None` for a drive the pool knows but that was not found: it is failed for good.
    dev: Option<D>,
    sb: Superblock,
    pub(crate) csum: ChecksumTable,
    pub(crate) intent: IntentMap,
    pub(crate) out: OutMap,
    pub(crate) journal: Journal,
    failed: AtomicBool,
    /// Set on a failed drive's object when the drive came back to its slot as a new object
    /// (a delta resync): errors met through it are about the old outage, already committed.
    pub(crate) retired: AtomicBool,
    /// This object's number, unique in the process: a failure reported of a slot names the
    /// object it was met on, so one that arrives after the slot's drive came back as a new
    /// object is told from a failure of the new one (`PoolCore::fail_drive_of`).
    incarnation: u64,
    /// Set when the device refused a request because a newer owner fenced it
    /// (`DevError::Fenced`, remote slices only): the pool must stop, not fail the drive.
    fenced: AtomicBool,
    flush_arrivals: AtomicU64,
    flush_covered: tokio::sync::Mutex<u64>,
    /// Set when a data-area write, zeroing, journal append or bless completes; taken by the
    /// pool flush (docs/design/stale-copies.md: a pool flush raises the flush epoch only after
    /// writes, and one with nothing written since the last does nothing).
    written: AtomicBool,
    /// Error events not yet committed to the pool metadata.
    errors: PendingErrors,
    /// Extents of this drive being moved, whose writes are repeated on their destination
    /// (shadow.rs).
    shadows: arc_swap::ArcSwap<Vec<std::sync::Arc<shadow::Shadow<D>>>>,
}

impl<D> std::fmt::Debug for Drive<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Drive").field("slot", &self.sb.slot).field("uuid", &self.sb.drive_uuid).finish()
    }
}

/// Reads both superblock copies of a device and returns the valid one with the highest
/// generation.
pub(crate) async fn read_superblock<D: BlockDevice>(dev: &D) -> Result<Superblock, FormatError> {
    let size = dev.size_bytes();
    let mut best: Option<Superblock> = None;
    let mut first_error = FormatError::NotStria;
    let offsets = [0, size.saturating_sub(BLOCK)];
    for offset in offsets {
        let block = match dev.read(offset, IoBuf::zeroed(BLOCK_USIZE)).await {
            Ok(b) => b,
            Err(_) => continue,
        };
        match Superblock::decode(&block) {
            Ok(sb) if sb.layout.drive_bytes <= size => {
                if best.as_ref().is_none_or(|b| sb.generation > b.generation) {
                    best = Some(sb);
                }
            }
            Ok(_) => first_error = FormatError::BadLayout("superblock describes a larger drive"),
            Err(e) => {
                if !matches!(e, FormatError::NotStria) {
                    first_error = e;
                }
            }
        }
    }
    best.ok_or(first_error)
}

/// Who a device says it belongs to, read from its superblock without opening any pool: what
/// the CLI checks before it formats a device (is it already a drive of this or another pool?).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriveLabel {
    pub pool_uuid: Uuid,
    pub pool_name: String,
    pub slot: u32,
    pub drive_uuid: Uuid,
}

/// The label of `dev`, or `None` when it holds no readable stria superblock.
pub async fn read_label<D: BlockDevice>(dev: &D) -> Option<DriveLabel> {
    read_superblock(dev).await.ok().map(|sb| DriveLabel {
        pool_uuid: sb.pool_uuid,
        pool_name: sb.pool_name,
        slot: sb.slot,
        drive_uuid: sb.drive_uuid,
    })
}

/// Reads both metadata slots of a drive; returns the valid documents.
pub(crate) async fn read_metadata<D: BlockDevice>(dev: &D, layout: &DriveLayout) -> Vec<PoolMeta> {
    let mut found = Vec::new();
    for slot in 0..2 {
        let offset = layout.metadata_slot_offset_bytes(slot);
        let Ok(head) = dev.read(offset, IoBuf::zeroed(BLOCK_USIZE)).await else { continue };
        let Ok((_, _, payload_bytes, _)) = PoolMeta::decode_header(&head) else { continue };
        let total = (64 + payload_bytes as u64).next_multiple_of(BLOCK);
        if total > layout.metadata_slot_bytes {
            continue;
        }
        let Ok(all) = dev.read(offset, IoBuf::zeroed(total as usize)).await else { continue };
        if let Ok(meta) = PoolMeta::decode(&all) {
            found.push(meta);
        }
    }
    found
}

/// The flush record of the drive `sb` describes (docs/design/stale-copies.md); `None` when it
/// has none (a pool made before records existed) or holds another drive's. Such a drive counts
/// as epoch 0, confirmed 0.
pub(crate) async fn read_flush_record<D: BlockDevice>(dev: &D, sb: &Superblock) -> Option<FlushRecord> {
    let block = dev.read(FLUSH_RECORD_OFFSET_BYTES, IoBuf::zeroed(BLOCK_USIZE)).await.ok()?;
    FlushRecord::decode(&block).ok().filter(|r| r.pool_uuid == sb.pool_uuid && r.drive_uuid == sb.drive_uuid)
}

/// The checksum of a block of zeros (what an unwritten block reads as).
fn zero_block_crc() -> u32 {
    static ZERO: std::sync::LazyLock<u32> = std::sync::LazyLock::new(|| block_crc(&[0u8; BLOCK_USIZE]));
    *ZERO
}

impl<D: BlockDevice> Drive<D> {
    /// Formats `dev` as a new pool member and returns it open. `fresh` says the device is known
    /// to read as zeros (a new sparse file), so the tables need not be written out.
    pub(crate) async fn format(dev: D, sb: Superblock, fresh: bool) -> Result<Drive<D>, DevError> {
        let l = sb.layout;
        if !fresh {
            // Old bytes in the tables would be read back as structures: zero them. The journal
            // too: a new journal starts at sequence 1 in session 1 at the ring's start, as the
            // old one did, so records of a pool the device served before (with their pieces on
            // other drives that also came from that pool) would be taken for this pool's and
            // replayed into its volumes.
            for (offset, len) in [
                (l.metadata_offset_bytes, 2 * l.metadata_slot_bytes),
                (l.intent_offset_bytes, l.intent_bytes),
                (l.journal_offset_bytes, l.journal_bytes),
                (l.csum_offset_bytes, l.csum_bytes),
            ] {
                // A hole punched in a drive file, a block device's WRITE ZEROES, or zeros
                // written where neither exists (`BlockDevice::zero`).
                dev.zero(offset, len).await?;
            }
        }
        Journal::format(&dev, l.journal_offset_bytes).await?;
        let drive = Drive::new(Some(dev), sb, Journal::new(l.journal_offset_bytes, l.journal_bytes));
        // Epoch 0: a pool being created starts there; a drive joining a running pool gets the
        // pool's epoch when it is admitted (`PoolCore::add_drive`).
        drive.write_flush_record(0, &[], false).await?;
        drive.write_superblock(drive.sb.generation, drive.sb.committed_generation).await?;
        drive.dev().flush().await?;
        Ok(drive)
    }

    fn new(dev: Option<D>, sb: Superblock, journal: Journal) -> Drive<D> {
        let l = sb.layout;
        let blocks = if dev.is_some() { l.data_blocks() } else { 0 };
        Drive {
            csum: ChecksumTable::new(blocks, l.csum_offset_bytes),
            intent: IntentMap::new(if dev.is_some() { l.intent_regions() } else { 0 }, l.intent_offset_bytes),
            out: OutMap::new(if dev.is_some() { l.intent_regions() } else { 0 }, l.metadata_offset_bytes),
            journal,
            failed: AtomicBool::new(dev.is_none()),
            retired: AtomicBool::new(false),
            incarnation: NEXT_INCARNATION.fetch_add(1, Ordering::Relaxed),
            fenced: AtomicBool::new(false),
            dev,
            sb,
            flush_arrivals: AtomicU64::new(0),
            flush_covered: tokio::sync::Mutex::new(0),
            written: AtomicBool::new(false),
            errors: PendingErrors::default(),
            shadows: arc_swap::ArcSwap::from_pointee(Vec::new()),
        }
    }

    /// Opens a member whose superblock was already read: loads the checksum table, the intent
    /// bitmap and the journal, and reports what recovery must look at.
    pub(crate) async fn open(dev: D, sb: Superblock) -> Result<(Drive<D>, OpenFindings), DevError> {
        let l = sb.layout;
        let (journal, pieces, watermarks) =
            Journal::open(&dev, l.journal_offset_bytes, l.journal_bytes).await?;
        let mut drive = Drive::new(Some(dev), sb, journal);
        let mut findings = OpenFindings { journal: pieces, watermarks, ..OpenFindings::default() };
        (findings.dirty_regions, findings.bad_csum_pages) = drive.load_intent().await?;
        findings.out_generation = drive.out.load(drive.dev()).await?;
        Ok((drive, findings))
    }

    /// Reads the intent bitmap; returns the dirty regions and the checksum pages of those
    /// regions that fail their CRC. Only the checksum pages of dirty regions can have been torn
    /// by a crash: those are loaded (and checked) now; the others are paged in when first used,
    /// and one found damaged then is repaired by the pool (`Pool::tick`).
    async fn load_intent(&mut self) -> Result<(Vec<u64>, Vec<u64>), DevError> {
        let l = self.sb.layout;
        let ipages = self.intent.pages();
        let buf = self.dev().read(l.intent_offset_bytes, IoBuf::zeroed((ipages * BLOCK) as usize)).await?;
        let mut dirty = Vec::new();
        for (i, bytes) in buf.chunks_exact(BLOCK_USIZE).enumerate() {
            dirty.extend(self.intent.load_page(i as u64, bytes));
        }
        for &r in &dirty {
            let first = r * INTENT_REGION_BLOCKS;
            let blocks = INTENT_REGION_BLOCKS.min(self.data_blocks().saturating_sub(first));
            if blocks > 0 {
                self.csum.pin(self.dev(), first, blocks).await?;
            }
        }
        Ok((dirty, self.csum.take_damaged()))
    }

    /// Opens a member that was out and comes back for a delta resync
    /// (docs/design/delta-resync.md): its journal is zeroed and restarted (its records are from
    /// before it went out), its intent and out bitmaps are read. Returns the drive, its dirty
    /// intent regions (bytes may have reached it that the others lack) and whether every
    /// checksum page of those regions is sound (if not, the caller rebuilds it in full).
    pub(crate) async fn rejoin(
        dev: D,
        sb: Superblock,
    ) -> Result<(Drive<D>, Vec<u64>, Option<u64>, bool), DevError> {
        let l = sb.layout;
        dev.zero(l.journal_offset_bytes, l.journal_bytes).await?;
        Journal::format(&dev, l.journal_offset_bytes).await?;
        let mut drive = Drive::new(Some(dev), sb, Journal::new(l.journal_offset_bytes, l.journal_bytes));
        let (dirty, damaged) = drive.load_intent().await?;
        let sound = damaged.is_empty();
        let out_generation = drive.out.load(drive.dev()).await?;
        drive.dev().flush().await?;
        Ok((drive, dirty, out_generation, sound))
    }

    /// A stand-in for a pool member that was not found: permanently failed, no device.
    pub(crate) fn missing(sb: Superblock) -> Drive<D> {
        let l = sb.layout;
        Drive::new(None, sb, Journal::new(l.journal_offset_bytes, l.journal_bytes))
    }

    /// The device, given back (a drive opened for a delta resync that needs a full rebuild).
    pub(crate) fn into_device(self) -> Option<D> {
        self.dev
    }

    /// True when the drive was not found at assembly.
    pub fn is_missing(&self) -> bool {
        self.dev.is_none()
    }

    /// Rewrites both superblock copies with `generation` and `committed_generation` (see
    /// [`Superblock::committed_generation`]).
    pub(crate) async fn write_superblock(&self, generation: u64, committed: u64) -> Result<(), DevError> {
        assert!(committed <= generation, "committed generation {committed} above generation {generation}");
        let mut sb = self.sb.clone();
        sb.generation = generation;
        sb.committed_generation = committed;
        let block = IoBytes::copy_from(&sb.encode());
        let result = async {
            self.dev().write(0, block.clone(), true).await?;
            self.dev().write(sb.layout.tail_superblock_offset_bytes(), block, true).await
        }
        .await;
        self.count_write(result)
    }

    /// Writes `meta` into its slot (by generation parity) and makes it durable.
    pub(crate) async fn write_metadata(&self, meta: &PoolMeta) -> Result<(), crate::EngineError> {
        let l = &self.sb.layout;
        let bytes = meta.encode(l.metadata_slot_bytes)?;
        let offset = l.metadata_slot_offset_bytes(meta.generation);
        self.count_write(self.dev().write(offset, IoBytes::copy_from(&bytes), true).await)?;
        Ok(())
    }

    /// Writes the drive's flush record (docs/design/stale-copies.md); durable at once with `fua`,
    /// else with the next device flush.
    pub(crate) async fn write_flush_record(
        &self,
        epoch: u64,
        witnessed: &[(u32, u64)],
        fua: bool,
    ) -> Result<(), DevError> {
        let record = FlushRecord {
            pool_uuid: self.sb.pool_uuid,
            drive_uuid: self.sb.drive_uuid,
            epoch,
            witnessed: witnessed.to_vec(),
        };
        let block = IoBytes::copy_from(&record.encode());
        let result = self.dev().write(FLUSH_RECORD_OFFSET_BYTES, block, fua).await;
        self.count_write(result)
    }

    /// Notes that a write reached the data area or the journal (see `written`): called once
    /// everything the write changes in memory (checksum entries, the intent's end) is done.
    fn note_written(&self) {
        self.written.store(true, Ordering::Release);
    }

    /// True when something was written since the pool flush last took the flag.
    pub(crate) fn was_written(&self) -> bool {
        self.written.load(Ordering::Acquire)
    }

    /// Takes the flag: true when something was written since the last time.
    pub(crate) fn take_written(&self) -> bool {
        self.written.swap(false, Ordering::AcqRel)
    }

    /// Puts the flag back (a pool flush that took it failed).
    pub(crate) fn mark_written(&self) {
        self.note_written();
    }

    /// The device. Panics for a missing drive: callers check [`Drive::is_failed`] first.
    pub fn device(&self) -> &D {
        self.dev.as_ref().expect("I/O to a missing drive")
    }

    fn dev(&self) -> &D {
        self.device()
    }

    /// The superblock this drive was opened with.
    pub fn superblock(&self) -> &Superblock {
        &self.sb
    }

    /// Slot number in the pool.
    pub fn slot(&self) -> u32 {
        self.sb.slot
    }

    /// Identity.
    pub fn uuid(&self) -> Uuid {
        self.sb.drive_uuid
    }

    /// Speed class.
    pub fn class(&self) -> DriveClass {
        self.sb.class
    }

    /// Number of blocks in the data area.
    pub fn data_blocks(&self) -> u64 {
        self.sb.layout.data_blocks()
    }

    /// True once the drive has been failed; requests to it are refused.
    pub fn is_failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// True once the device refused a request as fenced by a newer owner.
    pub fn was_fenced(&self) -> bool {
        self.fenced.load(Ordering::Acquire)
    }

    /// This object's number (see `incarnation`).
    pub(crate) fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// True once the drive came back to its slot as another object (see `retired`).
    pub(crate) fn is_retired(&self) -> bool {
        self.retired.load(Ordering::SeqCst)
    }

    /// Marks the drive failed in memory (the pool persists it).
    pub(crate) fn set_failed(&self) {
        self.failed.store(true, Ordering::SeqCst);
    }

    /// Counters of the underlying device.
    pub fn counters(&self) -> DevCountersSnapshot {
        self.dev.as_ref().map(|d| d.counters().snapshot()).unwrap_or_default()
    }

    /// Latency histograms and queue of the underlying device (empty for a missing drive).
    pub fn latency(&self) -> stria_dev::DevLatency {
        self.dev.as_ref().map(|d| d.counters().latency()).unwrap_or_default()
    }

    /// Error events counted since the last commit that took them (see the `errors` module).
    pub(crate) fn pending_errors(&self) -> DriveErrors {
        self.errors.take()
    }

    /// Forgets error events a successful metadata commit recorded (or a clear discarded).
    pub(crate) fn settle_errors(&self, committed: &DriveErrors) {
        self.errors.settle(committed);
    }

    fn count_error(&self, kind: ErrorKind) {
        self.errors.record(kind, 1, now_unix_secs());
    }

    /// Counts a failed read request, passing the result on.
    fn count_read<T>(&self, result: Result<T, DevError>) -> Result<T, DevError> {
        if let Err(e) = &result {
            if e.is_fenced() {
                self.fenced.store(true, Ordering::Release);
            } else {
                self.count_error(ErrorKind::Read);
            }
        }
        result
    }

    /// Counts a failed write (or flush) request, passing the result on.
    /// A full host filesystem is not the drive's fault and is not counted.
    fn count_write<T>(&self, result: Result<T, DevError>) -> Result<T, DevError> {
        if let Err(e) = &result {
            if e.is_fenced() {
                self.fenced.store(true, Ordering::Release);
            } else if !e.is_no_space() {
                self.count_error(ErrorKind::Write);
            }
        }
        result
    }

    fn data_offset(&self, block: u64) -> u64 {
        self.sb.layout.data_offset_bytes + block * BLOCK
    }

    fn check_data_range(&self, block: u64, blocks: u64) {
        assert!(
            block.checked_add(blocks).is_some_and(|end| end <= self.data_blocks()),
            "data-area access {block}+{blocks} beyond {} blocks of drive {}",
            self.data_blocks(),
            self.sb.slot
        );
    }

    /// Reads `buf.len()` bytes of the data area at `block` and verifies each block.
    /// Unwritten blocks come back as zeros (without touching the device when all are).
    async fn read_verified(&self, block: u64, buf: IoBuf) -> Result<IoBuf, ReadFault> {
        self.read_verified_inner(block, buf, None).await
    }

    /// [`Drive::read_verified`]; with `crcs`, also the checksum each block was verified against
    /// (that of a zero block for an unwritten one).
    async fn read_verified_inner(
        &self,
        block: u64,
        mut buf: IoBuf,
        mut crcs: Option<&mut [u32]>,
    ) -> Result<IoBuf, ReadFault> {
        let blocks = buf.len() as u64 / BLOCK;
        self.check_data_range(block, blocks);
        if let Some(c) = &crcs {
            assert_eq!(c.len() as u64, blocks, "one checksum per block read");
        }
        if self.is_failed() {
            return Err(ReadFault::Failed);
        }
        let pin = self.pin_csum(block, blocks).await.map_err(ReadFault::Io)?;
        if pin.all_unwritten(block, blocks) {
            buf.fill(0);
            if let Some(c) = crcs {
                c.fill(zero_block_crc());
            }
            return Ok(buf);
        }
        let read = self.dev().read(self.data_offset(block), buf).await;
        let mut buf = self.count_read(read).map_err(ReadFault::Io)?;
        let mut bad = Vec::new();
        for (i, data) in buf.chunks_exact_mut(BLOCK_USIZE).enumerate() {
            let crc = match pin.get(block + i as u64) {
                Entry::Unwritten => {
                    data.fill(0);
                    zero_block_crc()
                }
                Entry::Crc(expected) if block_crc(data) == expected => expected,
                // A wrong checksum, or none known (a damaged checksum page): never returned.
                Entry::Crc(_) | Entry::Unknown => {
                    bad.push(i);
                    0
                }
            };
            if let Some(c) = crcs.as_deref_mut() {
                c[i] = crc;
            }
        }
        if bad.is_empty() { Ok(buf) } else { Err(ReadFault::Corrupt { buf, bad }) }
    }

    /// Reads `blocks` blocks at `block` for the repair paths: on an I/O error, reads again block
    /// by block to find exactly which blocks fail. Returns the data (bad blocks zeroed), which
    /// blocks are good, and whether any block failed with an I/O error; `None` if the drive is
    /// failed.
    async fn read_isolating(&self, block: u64, blocks: u64) -> Option<(IoBuf, Vec<bool>, bool)> {
        let n = blocks as usize;
        match self.read_verified(block, IoBuf::zeroed(n * BLOCK_USIZE)).await {
            Ok(buf) => Some((buf, vec![true; n], false)),
            Err(ReadFault::Failed) => None,
            Err(ReadFault::Corrupt { buf, bad }) => {
                let mut good = vec![true; n];
                for i in bad {
                    good[i] = false;
                }
                Some((buf, good, false))
            }
            Err(ReadFault::Io(_)) => {
                let mut buf = IoBuf::zeroed(n * BLOCK_USIZE);
                let mut good = vec![false; n];
                for (i, g) in good.iter_mut().enumerate() {
                    if let Ok(one) = self.read_verified(block + i as u64, IoBuf::zeroed(BLOCK_USIZE)).await {
                        buf[i * BLOCK_USIZE..(i + 1) * BLOCK_USIZE].copy_from_slice(&one);
                        *g = true;
                    }
                }
                Some((buf, good, true))
            }
        }
    }

    /// Reads the data area without verification (recovery and scrub look at raw contents).
    async fn read_raw(&self, block: u64, buf: IoBuf) -> Result<IoBuf, DevError> {
        self.check_data_range(block, buf.len() as u64 / BLOCK);
        self.count_read(self.dev().read(self.data_offset(block), buf).await)
    }

    /// Writes `data` at data-area `block` and sets the blocks' checksums.
    async fn write(&self, block: u64, data: IoBytes, fua: bool) -> Result<(), DevError> {
        self.write_inner(block, data, fua, None).await
    }

    /// Writes `data` whose block checksums are already known (journal replay).
    pub(crate) async fn write_with_crcs(
        &self,
        block: u64,
        data: IoBytes,
        crcs: &[u32],
    ) -> Result<(), DevError> {
        self.write_inner(block, data, false, Some(crcs)).await
    }

    /// The write, then the same write on the destinations of extents being moved (shadow.rs).
    async fn write_inner(
        &self,
        block: u64,
        data: IoBytes,
        fua: bool,
        crcs: Option<&[u32]>,
    ) -> Result<(), DevError> {
        // While the write is repeated on a move's destination, this drive's intent bit for it
        // stays set (held), so the two never differ under a clean bit; if the repeat fails the
        // hold is kept (docs/design/pool-growth.md, "Resuming a move").
        let shadowed = self.shadowed(block, data.len() as u64 / BLOCK);
        if shadowed {
            self.intent.hold(block, data.len() as u64 / BLOCK);
        }
        let result = self.write_own(block, data.clone(), fua, crcs).await;
        if result.is_ok() {
            if self.mirror_write(block, &data, fua, crcs).await && shadowed {
                self.intent.release(block, data.len() as u64 / BLOCK);
            }
        } else if shadowed {
            self.intent.release(block, data.len() as u64 / BLOCK);
        }
        result
    }

    /// A data-area write on this drive alone.
    pub(super) async fn write_own(
        &self,
        block: u64,
        data: IoBytes,
        fua: bool,
        crcs: Option<&[u32]>,
    ) -> Result<(), DevError> {
        let blocks = data.len() as u64 / BLOCK;
        assert!((data.len() as u64).is_multiple_of(BLOCK) && blocks > 0, "unaligned data-area write");
        if let Some(values) = crcs {
            // Otherwise blocks would keep stale checksums, or neighbours would get these.
            assert_eq!(values.len() as u64, blocks, "a data-area write carries one checksum per block");
            // Computed where the block entered (or read from a journal record that verified):
            // a wrong one would make the block read as corrupt. Every test checks them.
            if cfg!(debug_assertions) {
                for (i, (b, &c)) in data.chunks_exact(BLOCK as usize).zip(values).enumerate() {
                    assert_eq!(block_crc(b), c, "block {} of a write at {block} carries a wrong checksum", i);
                }
            }
        }
        self.check_data_range(block, blocks);
        // The checksum pages are read (if not cached) before the data is touched, so a failure
        // there leaves the blocks as they were.
        let pin = self.pin_csum(block, blocks).await?;
        self.count_write(self.intent.begin(self.dev(), block, blocks).await)?;
        if let Err(e) = self.count_write(self.out.mark(self.dev(), block, blocks).await) {
            self.intent.end(block, blocks);
            return Err(e);
        }
        let written = self.dev().write(self.data_offset(block), data.clone(), fua).await;
        let mut result = self.count_write(written);
        if result.is_ok() {
            match crcs {
                Some(values) => self.csum.set_values(&pin, block, values),
                None => self.csum.set_from_data(&pin, block, &data),
            }
            // FUA: the data is durable (the device write had FUA). If the drive's own checksum
            // pages still mark a block of it unwritten, its entry must become durable too, or
            // recovery would take the block for unwritten and the write would be lost. If they
            // mark every block written, a stale entry is harmless: the region's intent bit stays
            // set until a full flush writes the pages, and recovery blesses written blocks of
            // dirty regions from their data (docs/crash-consistency.md, "FUA writes").
            // Over budget: the cache is full of dirty pages, and only a write-back frees them.
            // A full drive flush does both in the safe order (data durable before any page).
            let entries_durable = pin.written_on_disk();
            drop(pin);
            if (fua && !entries_durable) || self.csum.over_budget() {
                result = self.flush().await;
            }
        }
        self.intent.end(block, blocks);
        // Last: a pool flush that sees the flag sees the entries and the intent's end too.
        self.note_written();
        result
    }

    /// Marks blocks unwritten: they read as zeros from now on (no data is written). Covered by
    /// the intent bitmap like a write, since the on-disk checksums lag until the next flush.
    async fn zero(&self, block: u64, blocks: u64) -> Result<(), DevError> {
        // As in `write_inner`: the bit stays held while the zeroing is repeated.
        let shadowed = self.shadowed(block, blocks);
        if shadowed {
            self.intent.hold(block, blocks);
        }
        let result = self.zero_own(block, blocks).await;
        if result.is_ok() {
            if self.mirror_zero(block, blocks).await && shadowed {
                self.intent.release(block, blocks);
            }
        } else if shadowed {
            self.intent.release(block, blocks);
        }
        result
    }

    /// [`Drive::zero`] on this drive alone.
    pub(super) async fn zero_own(&self, block: u64, blocks: u64) -> Result<(), DevError> {
        self.check_data_range(block, blocks);
        let pin = self.pin_csum(block, blocks).await?;
        self.count_write(self.intent.begin(self.dev(), block, blocks).await)?;
        if let Err(e) = self.count_write(self.out.mark(self.dev(), block, blocks).await) {
            self.intent.end(block, blocks);
            return Err(e);
        }
        self.csum.clear(&pin, block, blocks);
        drop(pin);
        self.intent.end(block, blocks);
        self.note_written();
        if self.csum.over_budget() {
            return self.flush().await;
        }
        Ok(())
    }

    /// True when every block of the range is known to be unwritten ("no" when the checksum
    /// pages cannot be read).
    async fn is_unwritten(&self, block: u64, blocks: u64) -> bool {
        self.check_data_range(block, blocks);
        self.pin_csum(block, blocks).await.is_ok_and(|pin| pin.all_unwritten(block, blocks))
    }

    /// Holds the checksum pages of a data-area range, reading missing ones from the drive (a
    /// failed read counts as a read error of the drive).
    async fn pin_csum(&self, block: u64, blocks: u64) -> Result<Pinned, DevError> {
        let pinned = self.csum.pin(self.dev(), block, blocks).await;
        self.count_read(pinned)
    }

    /// The checksum entries of a data-area range (recovery and scrub look at them with the raw
    /// contents).
    async fn csum_entries(&self, block: u64, blocks: u64) -> Result<Vec<Entry>, DevError> {
        self.check_data_range(block, blocks);
        let pin = self.pin_csum(block, blocks).await?;
        Ok((block..block + blocks).map(|b| pin.get(b)).collect())
    }

    /// Sets the checksum of each block of the range marked in `written` from `data` (resync
    /// trusts what it found).
    async fn bless(&self, block: u64, data: &[u8], written: &[bool]) -> Result<(), DevError> {
        self.check_data_range(block, written.len() as u64);
        if self.shadowed(block, written.len() as u64) {
            // The destination does not get this: the move is broken, and the region's bit is
            // set and kept set, so a restart copies these rows again if it resumes the move.
            self.count_write(self.intent.begin(self.dev(), block, written.len() as u64).await)?;
            self.mirror_bless(block, written.len() as u64);
        }
        let pin = self.pin_csum(block, written.len() as u64).await?;
        for (i, w) in written.iter().enumerate() {
            if *w {
                self.csum.set_from_data(
                    &pin,
                    block + i as u64,
                    &data[i * BLOCK_USIZE..(i + 1) * BLOCK_USIZE],
                );
            }
        }
        self.note_written();
        Ok(())
    }

    /// Sets how many checksum pages this drive keeps cached.
    pub(crate) fn set_csum_cache_pages(&self, pages: u64) {
        self.csum.set_budget(pages);
    }

    /// The checksum cache's counters.
    pub fn csum_cache_stats(&self) -> CsumCacheStats {
        self.csum.stats()
    }

    /// Makes every write completed before this call durable, with its checksums. Concurrent
    /// callers share flushes. Journal checkpoints are separate (see `PoolCore::flush_all`):
    /// a record may only be checkpointed once every drive of its transaction is flushed.
    pub(crate) async fn flush(&self) -> Result<(), DevError> {
        self.flush_inner(None).await
    }

    /// [`Drive::flush`] that also makes the drive's flush record (its new `epoch`, and what it
    /// witnessed of others) durable, written after the data and before the second device flush
    /// (docs/design/stale-copies.md): a copy that lacks a write this flush covers lacks the
    /// record too. Never shares another caller's flush.
    pub(crate) async fn flush_with_record(
        &self,
        epoch: u64,
        witnessed: &[(u32, u64)],
    ) -> Result<(), DevError> {
        self.flush_inner(Some((epoch, witnessed))).await
    }

    async fn flush_inner(&self, record: Option<(u64, &[(u32, u64)])>) -> Result<(), DevError> {
        if self.is_missing() {
            return Ok(());
        }
        let arrival = self.flush_arrivals.fetch_add(1, Ordering::SeqCst) + 1;
        let mut covered = self.flush_covered.lock().await;
        if *covered >= arrival && record.is_none() {
            return Ok(());
        }
        let covers = self.flush_arrivals.load(Ordering::SeqCst);
        let epoch = self.intent.flush_started();
        // A checksum entry may reach the disk only once the data it describes is durable (a page
        // persisted ahead of its data would make recovery trust stale bytes, for example bytes a
        // zeroing had hidden). So: snapshot the dirty pages, make the data durable, then write
        // the snapshot and make it durable.
        let pages = self.csum.take_dirty();
        let (snapshot, all_written) = self.encode_csum_pages(&pages);
        let result = async {
            self.dev().flush().await?;
            if !pages.is_empty() || record.is_some() {
                for ((_, slot), &w) in pages.iter().zip(&all_written) {
                    csum::ChecksumTable::before_write_back(slot.page(), w);
                }
                // The checksum pages and the flush record go out together: both only need the
                // data durable first (the device flush above) and both are made durable by the
                // next.
                let pages_written = self.write_csum_pages(&snapshot);
                let record_written = async {
                    match record {
                        Some((flush_epoch, witnessed)) => {
                            self.write_flush_record(flush_epoch, witnessed, false).await
                        }
                        None => Ok(()),
                    }
                };
                let (pages_written, record_written) = futures::join!(pages_written, record_written);
                pages_written.and(record_written)?;
                self.dev().flush().await?;
                for ((_, slot), &w) in pages.iter().zip(&all_written) {
                    csum::ChecksumTable::after_write_back(slot.page(), w);
                }
            }
            Ok::<(), DevError>(())
        }
        .await;
        if let Err(e) = result {
            if !e.is_no_space() {
                self.count_error(ErrorKind::Write);
            }
            self.csum.redirty(&pages);
            return Err(e);
        }
        // Written back, the pages are clean: the cache may shrink to its budget.
        drop(pages);
        self.csum.trim();
        self.intent.flush_completed(epoch);
        *covered = (*covered).max(covers);
        Ok(())
    }

    /// Encodes checksum pages (sorted) as they are now, grouped in runs of consecutive pages:
    /// (first page, encoded bytes).
    fn encode_csum_pages(
        &self,
        pages: &[(u64, Arc<crate::pagecache::Slot<csum::Entries>>)],
    ) -> (Vec<(u64, IoBytes)>, Vec<bool>) {
        let mut runs = Vec::new();
        let mut all_written = Vec::with_capacity(pages.len());
        let mut i = 0;
        while i < pages.len() {
            let mut j = i + 1;
            while j < pages.len() && pages[j].0 == pages[j - 1].0 + 1 && j - i < 256 {
                j += 1;
            }
            let mut buf = IoBuf::zeroed((j - i) * BLOCK_USIZE);
            for (k, out) in buf.chunks_exact_mut(BLOCK_USIZE).enumerate() {
                let (id, slot) = &pages[i + k];
                all_written.push(self.csum.encode_page(*id, slot.page(), out));
            }
            runs.push((pages[i].0, buf.freeze()));
            i = j;
        }
        (runs, all_written)
    }

    /// Writes runs of checksum pages, all at once (every write finishes before an error is
    /// returned).
    async fn write_csum_pages(&self, runs: &[(u64, IoBytes)]) -> Result<(), DevError> {
        let writes = runs.iter().map(|(first, bytes)| {
            let offset = self.sb.layout.csum_offset_bytes + first * BLOCK;
            self.dev().write(offset, bytes.clone(), false)
        });
        crate::join::join_all_ok(writes).await.map(|_| ())
    }

    /// Writes the journal checkpoint `seq` (taken with `journal.checkpoint_candidate()` before
    /// the flush that made those records' in-place writes durable).
    pub(crate) async fn checkpoint_journal(&self, seq: u64, marks: &Watermarks) -> Result<(), DevError> {
        if self.is_missing() {
            return Ok(());
        }
        self.count_write(self.journal.checkpoint(self.dev(), seq, marks).await)
    }

    /// Starts this session's journal epoch (see `Journal::begin_session`), once every record
    /// found at open is checkpointed.
    pub(crate) async fn begin_journal_session(&self) -> Result<(), DevError> {
        if self.is_missing() {
            return Ok(());
        }
        self.count_write(self.journal.begin_session(self.dev()).await)
    }

    /// Appends a piece to the journal (see `Journal::append`), counting a failed write.
    async fn journal_append(&self, piece: JournalPiece) -> Result<u64, AppendError> {
        let appended = self.journal.append(self.dev(), piece, &self.errors).await;
        self.note_written();
        appended
    }

    /// Clears intent bits of idle regions whose writes are all durable.
    pub(crate) async fn clear_idle_intents(&self, force_all: bool) -> Result<u64, DevError> {
        self.count_write(self.intent.clear_idle(self.dev(), force_all).await)
    }

    /// Intent regions currently marked dirty.
    pub fn dirty_regions(&self) -> u64 {
        self.intent.dirty_regions()
    }

    /// Journal ring blocks holding records not yet checkpointed.
    pub fn journal_used_blocks(&self) -> u64 {
        self.journal.used_blocks()
    }

    /// Counts `blocks` repaired on this drive (in the device's counters of this run and in the
    /// error counters the pool persists).
    fn record_repairs(&self, blocks: u64) {
        if let Some(dev) = &self.dev {
            dev.counters().record_repairs(blocks);
        }
        self.errors.record(ErrorKind::ChecksumRepair, blocks, now_unix_secs());
    }
}

/// A shared drive handle.
pub type DriveRef<D> = Arc<Drive<D>>;
