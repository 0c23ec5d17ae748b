//! The journal ring of one drive (format §5).
//!
//! Pieces of erasure-coded stripe updates are made durable here before they are applied in
//! place. Appends are batched (group commit): whoever finds the writer free takes every pending
//! record and writes them as one FUA write, so one journal write is in flight per drive and
//! records become durable strictly in sequence order. A checkpoint (written at flush, after the
//! in-place writes are durable) releases ring space.

use std::collections::VecDeque;
use std::sync::Arc;

use parking_lot::Mutex;
use stria_dev::{BLOCK_BYTES as BLOCK, BlockDevice, DevError, IoBuf, IoBytes};
use tokio::sync::oneshot;

use super::csum::block_crc;
use super::errors::{ErrorKind, PendingErrors};
use crate::format::{crc_of, seal_crc};
use crate::time::now_unix_secs;

pub(crate) const HEADER_MAGIC: &[u8; 8] = b"STRIA-JH";
pub(crate) const RECORD_MAGIC: &[u8; 8] = b"STRIA-JR";
/// Header copies at the start of the journal area; the ring follows.
pub(crate) const HEADER_COPIES: u64 = 2;
/// Most payload blocks one record may carry (bounded by the CRC list in its header block).
pub(crate) const MAX_RECORD_BLOCKS: u64 = 880;
/// Most drives one transaction may span.
pub(crate) const MAX_PIECES: usize = 255;

/// Most volumes a journal header can name with a watermark of their own (format §5).
pub(crate) const MAX_VOLUME_MARKS: usize = 252;
/// Where a header's per-volume marks start: 16 bytes each, up to byte 4088.
const VOLUME_MARKS_OFFSET: usize = 56;

/// What a journal header says is durable (format §5, docs/crash-consistency.md invariant 4):
/// every stripe transaction with an id up to `all` is applied in place and durable on every drive
/// it names, except the transactions of the volumes in `except`, each durable up to its own
/// mark (below `all`). A header from before the per-volume marks says `all` = its one watermark.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Watermarks {
    pub(crate) all: u64,
    /// `(volume id, mark)`, sorted by volume id, each volume once, each mark below `all`.
    pub(crate) except: Vec<(u64, u64)>,
}

impl Watermarks {
    /// The mark of `volume`'s transactions.
    pub(crate) fn of(&self, volume: u64) -> u64 {
        self.except.iter().find(|&&(v, _)| v == volume).map_or(self.all, |&(_, m)| m)
    }

    /// The mark of every volume's transactions: the pool-wide watermark (what a checkpoint may
    /// release up to).
    pub(crate) fn lowest(&self) -> u64 {
        self.except.iter().map(|&(_, m)| m).min().unwrap_or(self.all).min(self.all)
    }

    /// True when no volume's mark is below what `earlier` said: a header may only say more.
    pub(crate) fn covers(&self, earlier: &Watermarks) -> bool {
        self.all >= earlier.all
            && earlier.except.iter().all(|&(v, m)| self.of(v) >= m)
            && self.except.iter().all(|&(v, m)| m >= earlier.of(v))
    }
}

/// A journal header's fields (format §5).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct JournalHeader {
    pub(crate) checkpoint_seq: u64,
    pub(crate) next_offset_blocks: u64,
    pub(crate) marks: Watermarks,
    pub(crate) epoch: u64,
}

/// One drive's share of a stripe update.
#[derive(Debug, Clone)]
pub(crate) struct JournalPiece {
    pub(crate) txn_id: u64,
    pub(crate) volume_id: u64,
    /// Data-area block of this drive the payload belongs at.
    pub(crate) target_block: u64,
    /// Slots of every drive holding a piece of the transaction.
    pub(crate) piece_slots: Vec<u16>,
    pub(crate) data: IoBytes,
    /// The checksum of each block of `data` (`block_crc`): computed once by the writer, stored
    /// in the record and given to the in-place write; read back and verified by recovery.
    pub(crate) crcs: Vec<u32>,
}

impl JournalPiece {
    /// The checksums of `data`'s blocks, for [`JournalPiece::crcs`].
    pub(crate) fn crcs_of(data: &[u8]) -> Vec<u32> {
        data.chunks_exact(BLOCK as usize).map(block_crc).collect()
    }
}

/// A piece read back by recovery (its checksums verified against its payload).
#[derive(Debug, Clone)]
pub(crate) struct RecoveredPiece {
    pub(crate) seq: u64,
    pub(crate) piece: JournalPiece,
}

/// Why a record was not appended.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AppendError {
    /// No room until a flush checkpoints records of transactions applied meanwhile.
    #[error("journal full")]
    Full,
    /// The record could never be placed in this ring, however empty.
    #[error("a journal record of {blocks} blocks does not fit a ring of {ring_blocks}")]
    TooLarge { blocks: u64, ring_blocks: u64 },
    #[error(transparent)]
    Dev(#[from] DevError),
}

/// Outcome of a batch for one waiter (a `DevError` is shared by every record of the batch).
#[derive(Debug)]
enum BatchError {
    Full,
    Dev(Arc<DevError>),
    /// The task writing the batch was cancelled before it could report: whether the record
    /// reached the drive is unknown, so it is appended again (a duplicate record of a
    /// transaction is harmless: replay writes the same blocks twice).
    Abandoned(JournalPiece),
}

struct Pending {
    piece: JournalPiece,
    done: oneshot::Sender<Result<u64, BatchError>>,
}

/// The records of a batch placed in the ring and not yet reported to their waiters. If the
/// batch's future is dropped (its caller was cancelled) the waiters learn it, instead of
/// finding their channel closed.
struct Unreported(Vec<(Pending, u64)>);

impl Drop for Unreported {
    fn drop(&mut self) {
        for (p, _) in self.0.drain(..) {
            let _ = p.done.send(Err(BatchError::Abandoned(p.piece)));
        }
    }
}

#[derive(Debug)]
struct RingState {
    next_seq: u64,
    /// Ring position (in blocks) where the next record goes.
    head: u64,
    /// Records written and not yet checkpointed: (seq, position, blocks including header/pad,
    /// txn id; 0 for a pad).
    live: VecDeque<(u64, u64, u64, u64)>,
    /// Blocks used by live records (including pads).
    used: u64,
    checkpoint_seq: u64,
    /// Watermarks written with the last checkpoint.
    marks: Watermarks,
    /// The session epoch (format §5): every record carries it, and a scan accepts only records
    /// of the header's epoch.
    epoch: u64,
}

/// The journal of one drive.
pub(crate) struct Journal {
    offset_bytes: u64,
    ring_blocks: u64,
    writer: tokio::sync::Mutex<()>,
    pending: Mutex<Vec<Pending>>,
    ring: Mutex<RingState>,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal").field("ring", &*self.ring.lock()).finish()
    }
}

impl Journal {
    /// An empty journal over the area at `offset_bytes` of `len_bytes`.
    pub(crate) fn new(offset_bytes: u64, len_bytes: u64) -> Journal {
        Journal::with_state(offset_bytes, len_bytes, 0, 0, 0)
    }

    fn with_state(offset_bytes: u64, len_bytes: u64, checkpoint_seq: u64, head: u64, epoch: u64) -> Journal {
        Journal {
            offset_bytes,
            ring_blocks: len_bytes / BLOCK - HEADER_COPIES,
            writer: tokio::sync::Mutex::new(()),
            pending: Mutex::new(Vec::new()),
            ring: Mutex::new(RingState {
                next_seq: checkpoint_seq + 1,
                head,
                live: VecDeque::new(),
                used: 0,
                checkpoint_seq,
                marks: Watermarks::default(),
                epoch,
            }),
        }
    }

    /// Encoded header block.
    pub(crate) fn encode_header(h: &JournalHeader) -> Vec<u8> {
        let marks = &h.marks;
        assert!(
            marks.except.len() <= MAX_VOLUME_MARKS
                && marks.except.windows(2).all(|w| w[0].0 < w[1].0)
                && marks.except.iter().all(|&(_, m)| m < marks.all),
            "journal header watermarks out of shape: {marks:?}"
        );
        let mut block = vec![0u8; BLOCK as usize];
        block[..8].copy_from_slice(HEADER_MAGIC);
        block[8..16].copy_from_slice(&h.checkpoint_seq.to_le_bytes());
        block[16..24].copy_from_slice(&h.next_offset_blocks.to_le_bytes());
        block[24..32].copy_from_slice(&marks.lowest().to_le_bytes());
        block[32..40].copy_from_slice(&h.epoch.to_le_bytes());
        block[40..48].copy_from_slice(&marks.all.to_le_bytes());
        let count = u16::try_from(marks.except.len()).expect("at most MAX_VOLUME_MARKS");
        block[48..50].copy_from_slice(&count.to_le_bytes());
        for (i, &(v, m)) in marks.except.iter().enumerate() {
            let o = VOLUME_MARKS_OFFSET + i * 16;
            block[o..o + 8].copy_from_slice(&v.to_le_bytes());
            block[o + 8..o + 16].copy_from_slice(&m.to_le_bytes());
        }
        seal_crc(&mut block);
        block
    }

    /// A valid header block's fields; `None` for a block that is not one (bad magic or CRC, or
    /// watermarks out of shape).
    pub(crate) fn decode_header(buf: &[u8]) -> Option<JournalHeader> {
        if &buf[..8] != HEADER_MAGIC || crc_of(buf) != u32::from_le_bytes(buf[4092..].try_into().expect("4"))
        {
            return None;
        }
        let u64_at = |o: usize| u64::from_le_bytes(buf[o..o + 8].try_into().expect("8"));
        let lowest = u64_at(24);
        let count = usize::from(u16::from_le_bytes(buf[48..50].try_into().expect("2")));
        // A header written before the per-volume marks has zeros here: its one watermark holds
        // for every volume.
        let all = match u64_at(40) {
            0 => lowest,
            all => all,
        };
        if count > MAX_VOLUME_MARKS {
            return None;
        }
        let except: Vec<(u64, u64)> =
            (0..count).map(|i| VOLUME_MARKS_OFFSET + i * 16).map(|o| (u64_at(o), u64_at(o + 8))).collect();
        let marks = Watermarks { all, except };
        let shaped = marks.except.windows(2).all(|w| w[0].0 < w[1].0)
            && marks.except.iter().all(|&(_, m)| m < marks.all)
            && marks.lowest() == lowest;
        shaped.then(|| JournalHeader {
            checkpoint_seq: u64_at(8),
            next_offset_blocks: u64_at(16),
            marks,
            epoch: u64_at(32),
        })
    }

    /// Writes a fresh, empty journal (at pool creation).
    pub(crate) async fn format<D: BlockDevice>(dev: &D, offset_bytes: u64) -> Result<(), DevError> {
        let header = IoBytes::copy_from(&Self::encode_header(&JournalHeader::default()));
        for copy in 0..HEADER_COPIES {
            dev.write(offset_bytes + copy * BLOCK, header.clone(), true).await?;
        }
        Ok(())
    }

    /// Reads the journal of a drive: the newest valid header and every valid record after its
    /// checkpoint, in order. Returns the journal positioned after the last valid record, the
    /// records, and the header's watermarks (what it says was applied and durable when it was
    /// written).
    pub(crate) async fn open<D: BlockDevice>(
        dev: &D,
        offset_bytes: u64,
        len_bytes: u64,
    ) -> Result<(Journal, Vec<RecoveredPiece>, Watermarks), DevError> {
        let mut best: Option<JournalHeader> = None;
        for copy in 0..HEADER_COPIES {
            let buf = dev.read(offset_bytes + copy * BLOCK, IoBuf::zeroed(BLOCK as usize)).await?;
            if let Some(h) = Self::decode_header(&buf) {
                // Equal checkpoints: the newer session's copy (a crash between the two copies of
                // `begin_session`).
                if best.as_ref().is_none_or(|b| (h.checkpoint_seq, h.epoch) > (b.checkpoint_seq, b.epoch)) {
                    best = Some(h);
                }
            }
        }
        let ring_blocks = len_bytes / BLOCK - HEADER_COPIES;
        let JournalHeader { checkpoint_seq, next_offset_blocks: start, marks, epoch } =
            best.unwrap_or_else(|| {
                tracing::warn!(
                    device = dev.name(),
                    "journal header unreadable; treating the journal as empty"
                );
                JournalHeader::default()
            });
        let start = if start < ring_blocks { start } else { 0 };

        let mut pieces = Vec::new();
        let mut live = VecDeque::new();
        let mut pos = start;
        let mut expect = checkpoint_seq + 1;
        let mut scanned = 0u64;
        while scanned < ring_blocks {
            let header =
                dev.read(offset_bytes + (HEADER_COPIES + pos) * BLOCK, IoBuf::zeroed(BLOCK as usize)).await?;
            let Some(rec) = decode_record_header(&header, expect, epoch) else { break };
            if rec.len_blocks == 0 {
                // Pad: the rest of the ring is unused; continue at the start.
                live.push_back((expect, pos, ring_blocks - pos, 0));
                scanned += ring_blocks - pos;
                pos = 0;
                expect += 1;
                continue;
            }
            if pos + 1 + rec.len_blocks > ring_blocks {
                break;
            }
            let payload = dev
                .read(
                    offset_bytes + (HEADER_COPIES + pos + 1) * BLOCK,
                    IoBuf::zeroed((rec.len_blocks * BLOCK) as usize),
                )
                .await?;
            let intact = payload.chunks_exact(BLOCK as usize).zip(&rec.crcs).all(|(b, &c)| block_crc(b) == c);
            if !intact {
                break;
            }
            pieces.push(RecoveredPiece {
                seq: expect,
                piece: JournalPiece {
                    txn_id: rec.txn_id,
                    volume_id: rec.volume_id,
                    target_block: rec.target_block,
                    piece_slots: rec.piece_slots,
                    data: payload.freeze(),
                    crcs: rec.crcs,
                },
            });
            live.push_back((expect, pos, 1 + rec.len_blocks, rec.txn_id));
            pos += 1 + rec.len_blocks;
            scanned += 1 + rec.len_blocks;
            if pos >= ring_blocks {
                pos = 0;
            }
            expect += 1;
        }
        // The records found stay live until recovery has replayed them and a flush checkpoints
        // them, which rewrites the header; until then a crash finds them again.
        let journal = Journal::with_state(offset_bytes, len_bytes, checkpoint_seq, pos, epoch);
        {
            let mut ring = journal.ring.lock();
            ring.marks = marks.clone();
            ring.next_seq = expect;
            ring.used = live.iter().map(|l| l.2).sum();
            ring.live = live;
        }
        Ok((journal, pieces, marks))
    }

    /// Appends a piece; returns its sequence number once it is durable. A failed ring write is
    /// counted in `errors` once (not once per record of its batch).
    pub(crate) async fn append<D: BlockDevice>(
        &self,
        dev: &D,
        piece: JournalPiece,
        errors: &PendingErrors,
    ) -> Result<u64, AppendError> {
        let blocks = piece.data.len() as u64 / BLOCK;
        assert!(
            (piece.data.len() as u64).is_multiple_of(BLOCK) && (1..=MAX_RECORD_BLOCKS).contains(&blocks),
            "journal piece of {} bytes",
            piece.data.len()
        );
        assert!(
            piece.piece_slots.len() <= MAX_PIECES,
            "journal piece of a transaction over {} drives (at most {MAX_PIECES})",
            piece.piece_slots.len()
        );
        if blocks + 2 > self.ring_blocks / 2 {
            // A record this large could never be placed reliably in this ring.
            return Err(AppendError::TooLarge { blocks: blocks + 1, ring_blocks: self.ring_blocks });
        }
        let mut piece = piece;
        loop {
            match self.append_once(dev, piece, errors).await {
                Ok(seq) => return Ok(seq),
                Err(BatchError::Full) => return Err(AppendError::Full),
                Err(BatchError::Dev(e)) => return Err(AppendError::Dev(copy_dev_error(&e))),
                Err(BatchError::Abandoned(p)) => piece = p,
            }
        }
    }

    /// Queues `piece` and makes sure some writer writes it (this task, or one that took it in
    /// its batch); returns that writer's report.
    async fn append_once<D: BlockDevice>(
        &self,
        dev: &D,
        piece: JournalPiece,
        errors: &PendingErrors,
    ) -> Result<u64, BatchError> {
        let (tx, mut rx) = oneshot::channel();
        self.pending.lock().push(Pending { piece, done: tx });
        loop {
            let writer = self.writer.lock().await;
            match rx.try_recv() {
                Ok(report) => return report,
                Err(oneshot::error::TryRecvError::Empty) => {}
                Err(oneshot::error::TryRecvError::Closed) => {
                    unreachable!("a journal waiter's sender is dropped only after reporting")
                }
            }
            let batch: Vec<Pending> = std::mem::take(&mut *self.pending.lock());
            if batch.is_empty() {
                // Our record was taken by a writer that has not reported yet; wait for it.
                drop(writer);
                return rx.await.expect("a journal waiter's sender reports before it is dropped");
            }
            self.write_batch(dev, batch, errors).await;
        }
    }

    /// Writes a batch of pending records and reports to each waiter.
    async fn write_batch<D: BlockDevice>(&self, dev: &D, batch: Vec<Pending>, errors: &PendingErrors) {
        // Place records; those that do not fit fail with `Full` (their writers flush and retry).
        let mut placed = Unreported(Vec::new());
        let mut blocks_out: Vec<Block> = Vec::new(); // what goes where, in ring order
        let epoch;
        {
            let mut ring = self.ring.lock();
            epoch = ring.epoch;
            for p in batch {
                let blocks = 1 + p.piece.data.len() as u64 / BLOCK;
                let wrap = ring.head + blocks > self.ring_blocks;
                let pad = if wrap { self.ring_blocks - ring.head } else { 0 };
                if ring.used + pad + blocks > self.ring_blocks {
                    let _ = p.done.send(Err(BatchError::Full));
                    continue;
                }
                if wrap {
                    let seq = ring.next_seq;
                    ring.next_seq += 1;
                    let head = ring.head;
                    self.check_follows(&ring, seq, head);
                    blocks_out.push(Block { pos: head, seq, record: None });
                    ring.live.push_back((seq, head, pad, 0));
                    ring.used += pad;
                    ring.head = 0;
                }
                let seq = ring.next_seq;
                ring.next_seq += 1;
                let pos = ring.head;
                self.check_follows(&ring, seq, pos);
                blocks_out.push(Block { pos, seq, record: Some(placed.0.len()) });
                ring.live.push_back((seq, pos, blocks, p.piece.txn_id));
                ring.used += blocks;
                ring.head = (pos + blocks) % self.ring_blocks;
                // Live records never take more than the ring: one block more would be written
                // over a record not yet checkpointed.
                assert!(
                    ring.used <= self.ring_blocks,
                    "journal ring over-full: {} blocks of live records in a ring of {}",
                    ring.used,
                    self.ring_blocks
                );
                placed.0.push((p, seq));
            }
        }
        if placed.0.is_empty() {
            return;
        }
        // One buffer per run of consecutive ring blocks, filled once: each header is encoded in
        // place and each payload copied once (the one copy the journal needs, since a record
        // and its header go down as one write).
        let pieces: Vec<&JournalPiece> = placed.0.iter().map(|(p, _)| &p.piece).collect();
        let writes = assemble_runs(&blocks_out, &pieces, epoch);
        let mut result = Ok(());
        for (pos, bytes) in writes {
            let offset = self.offset_bytes + (HEADER_COPIES + pos) * BLOCK;
            if let Err(e) = dev.write(offset, bytes, true).await {
                errors.record(ErrorKind::Write, 1, now_unix_secs());
                result = Err(Arc::new(e));
                break;
            }
        }
        for (p, seq) in placed.0.drain(..) {
            let report = match &result {
                Ok(()) => Ok(seq),
                Err(e) => Err(BatchError::Dev(Arc::clone(e))),
            };
            let _ = p.done.send(report);
        }
    }

    /// The checkpoint a flush may write once every drive is flushed, given the pool's
    /// transaction watermark taken before that flush (every transaction with an id up to it is
    /// applied): the end of the longest prefix of records whose transactions are all covered.
    pub(crate) fn checkpoint_candidate(&self, txn_watermark: u64) -> u64 {
        let ring = self.ring.lock();
        let mut candidate = ring.checkpoint_seq;
        for &(seq, _, _, txn) in &ring.live {
            if txn > txn_watermark {
                return candidate;
            }
            candidate = seq;
        }
        ring.next_seq - 1
    }

    /// Writes the checkpoint `seq` with the watermarks it was computed from (both taken after
    /// the flush that made those records' in-place writes durable) and frees ring space. The
    /// header is written even when `seq` did not move, so that the drive carries the newest
    /// watermarks.
    pub(crate) async fn checkpoint<D: BlockDevice>(
        &self,
        dev: &D,
        seq: u64,
        marks: &Watermarks,
    ) -> Result<(), DevError> {
        let _writer = self.writer.lock().await;
        let (next_offset, epoch) = {
            let ring = self.ring.lock();
            // Checkpoints are taken under the pool's flush lock, in order: going back would
            // make recovery replay records over newer data.
            assert!(
                seq >= ring.checkpoint_seq && marks.covers(&ring.marks),
                "journal checkpoint going back: seq {} -> {seq}, watermarks {:?} -> {marks:?}",
                ring.checkpoint_seq,
                ring.marks
            );
            assert!(
                seq < ring.next_seq,
                "journal checkpoint {seq} past the last record {}",
                ring.next_seq - 1
            );
            if seq == ring.checkpoint_seq && *marks == ring.marks {
                return Ok(());
            }
            (ring.live.iter().find(|l| l.0 > seq).map_or(ring.head, |l| l.1), ring.epoch)
        };
        let header = IoBytes::copy_from(&Self::encode_header(&JournalHeader {
            checkpoint_seq: seq,
            next_offset_blocks: next_offset,
            marks: marks.clone(),
            epoch,
        }));
        for copy in 0..HEADER_COPIES {
            dev.write(self.offset_bytes + copy * BLOCK, header.clone(), true).await?;
        }
        let mut ring = self.ring.lock();
        while ring.live.front().is_some_and(|l| l.0 <= seq) {
            let (released, _, blocks, _) = ring.live.pop_front().expect("front exists");
            ring.used = ring.used.checked_sub(blocks).unwrap_or_else(|| {
                panic!(
                    "journal ring accounting: record {released} frees {blocks} blocks, {} in use",
                    ring.used
                )
            });
        }
        assert!(
            ring.live.is_empty() == (ring.used == 0),
            "journal ring accounting: {} live records in {} blocks after checkpoint {seq}",
            ring.live.len(),
            ring.used
        );
        ring.checkpoint_seq = seq;
        ring.marks = marks.clone();
        Ok(())
    }

    /// Starts a new session once recovery has checkpointed every record found at open: rewrites
    /// the header with the next epoch, so that records the previous session left in the ring
    /// beyond its last valid one (a torn batch write) can never be taken for this session's
    /// records, even where their sequence numbers and positions would fit. Until this header is
    /// durable nothing is appended.
    pub(crate) async fn begin_session<D: BlockDevice>(&self, dev: &D) -> Result<(), DevError> {
        let _writer = self.writer.lock().await;
        let (header, epoch) = {
            let mut ring = self.ring.lock();
            assert!(
                ring.live.is_empty() && ring.checkpoint_seq + 1 == ring.next_seq,
                "journal session started with {} records not checkpointed",
                ring.live.len()
            );
            ring.epoch += 1;
            let header = JournalHeader {
                checkpoint_seq: ring.checkpoint_seq,
                next_offset_blocks: ring.head,
                marks: ring.marks.clone(),
                epoch: ring.epoch,
            };
            (Self::encode_header(&header), ring.epoch)
        };
        let header = IoBytes::copy_from(&header);
        for copy in 0..HEADER_COPIES {
            dev.write(self.offset_bytes + copy * BLOCK, header.clone(), true).await?;
        }
        tracing::debug!(epoch, "journal session started");
        Ok(())
    }

    /// Stops the process unless a record (or pad) numbered `seq` at ring position `pos` comes
    /// right after the last live record, in number and in place (or right after the checkpoint
    /// when none is live). Recovery scans from the checkpoint's position for consecutive numbers,
    /// so a record out of sequence or out of place would never be found again after a crash,
    /// though its transaction was acknowledged.
    fn check_follows(&self, ring: &RingState, seq: u64, pos: u64) {
        let (prev_seq, prev_end) = match ring.live.back() {
            Some(&(s, p, blocks, _)) => (s, Some((p + blocks) % self.ring_blocks)),
            None => (ring.checkpoint_seq, None),
        };
        assert!(
            seq == prev_seq + 1 && prev_end.is_none_or(|end| end == pos),
            "journal record {seq} at ring block {pos} does not follow record {prev_seq} (ending at {prev_end:?})"
        );
    }

    /// Blocks of the ring in use by records not yet checkpointed.
    pub(crate) fn used_blocks(&self) -> u64 {
        self.ring.lock().used
    }
}

/// One entry of a batch's placement: a pad (`record` None: one header block, the ring then
/// wraps) or a record (its header block and payload; `record` indexes the batch's pieces).
struct Block {
    pos: u64,
    seq: u64,
    record: Option<usize>,
}

impl Block {
    /// Ring blocks this entry writes (a pad writes only its header block).
    fn written_blocks(&self, pieces: &[&JournalPiece]) -> u64 {
        self.record.map_or(1, |i| 1 + pieces[i].data.len() as u64 / BLOCK)
    }
}

/// The device writes of a batch: each run of entries that follow one another in the ring
/// becomes one buffer, sized exactly and written into once.
fn assemble_runs(blocks: &[Block], pieces: &[&JournalPiece], epoch: u64) -> Vec<(u64, IoBytes)> {
    let mut writes = Vec::new();
    let mut at = 0;
    while at < blocks.len() {
        let mut end = at + 1;
        let mut next = blocks[at].pos + blocks[at].written_blocks(pieces);
        while end < blocks.len() && blocks[end].pos == next {
            next += blocks[end].written_blocks(pieces);
            end += 1;
        }
        let mut buf = IoBuf::for_overwrite(((next - blocks[at].pos) * BLOCK) as usize);
        let mut off = 0;
        for b in &blocks[at..end] {
            let header = &mut buf[off..off + BLOCK as usize];
            match b.record {
                None => encode_pad_into(header, b.seq, epoch),
                Some(i) => encode_record_header_into(header, b.seq, epoch, pieces[i]),
            }
            off += BLOCK as usize;
            if let Some(i) = b.record {
                let data = &pieces[i].data;
                buf[off..off + data.len()].copy_from_slice(data);
                off += data.len();
            }
        }
        debug_assert_eq!(off, buf.len());
        writes.push((blocks[at].pos, buf.freeze()));
        at = end;
    }
    writes
}

/// `DevError` is not `Clone`; each waiter of a failed batch gets an equivalent error.
fn copy_dev_error(e: &DevError) -> DevError {
    match e {
        DevError::Io { device, offset_bytes, len_bytes, source } => DevError::Io {
            device: device.clone(),
            offset_bytes: *offset_bytes,
            len_bytes: *len_bytes,
            source: std::io::Error::new(source.kind(), source.to_string()),
        },
        DevError::OutOfRange { device, offset_bytes, len_bytes, size_bytes } => DevError::OutOfRange {
            device: device.clone(),
            offset_bytes: *offset_bytes,
            len_bytes: *len_bytes,
            size_bytes: *size_bytes,
        },
        DevError::Misaligned { device, offset_bytes, len_bytes } => DevError::Misaligned {
            device: device.clone(),
            offset_bytes: *offset_bytes,
            len_bytes: *len_bytes,
        },
        DevError::Fenced { device, epoch, drive_epoch } => {
            DevError::Fenced { device: device.clone(), epoch: *epoch, drive_epoch: *drive_epoch }
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) struct RecordHeader {
    pub(crate) txn_id: u64,
    pub(crate) volume_id: u64,
    pub(crate) target_block: u64,
    pub(crate) len_blocks: u64,
    pub(crate) piece_slots: Vec<u16>,
    pub(crate) crcs: Vec<u32>,
}

pub(crate) fn encode_record_header(seq: u64, epoch: u64, piece: &JournalPiece) -> Vec<u8> {
    let mut block = vec![0u8; BLOCK as usize];
    encode_record_header_into(&mut block, seq, epoch, piece);
    block
}

/// Encodes a record's header block into `block` (one block; every byte is written).
fn encode_record_header_into(block: &mut [u8], seq: u64, epoch: u64, piece: &JournalPiece) {
    let len_blocks = piece.data.len() as u64 / BLOCK;
    block.fill(0);
    block[..8].copy_from_slice(RECORD_MAGIC);
    block[8..16].copy_from_slice(&seq.to_le_bytes());
    block[16..24].copy_from_slice(&piece.txn_id.to_le_bytes());
    block[24..32].copy_from_slice(&piece.volume_id.to_le_bytes());
    block[32..40].copy_from_slice(&piece.target_block.to_le_bytes());
    block[40..44].copy_from_slice(&u32::try_from(len_blocks).expect("bounded").to_le_bytes());
    block[44..46].copy_from_slice(&u16::try_from(piece.piece_slots.len()).expect("bounded").to_le_bytes());
    for (i, slot) in piece.piece_slots.iter().enumerate() {
        block[48 + 2 * i..50 + 2 * i].copy_from_slice(&slot.to_le_bytes());
    }
    assert_eq!(piece.crcs.len() as u64, len_blocks, "a journal record carries one checksum per block");
    for (i, crc) in piece.crcs.iter().enumerate() {
        block[560 + 4 * i..564 + 4 * i].copy_from_slice(&crc.to_le_bytes());
    }
    block[EPOCH_AT..EPOCH_AT + 8].copy_from_slice(&epoch.to_le_bytes());
    seal_crc(block);
}

/// Where a record header keeps its session epoch (after the largest CRC list).
pub(crate) const EPOCH_AT: usize = 560 + 4 * MAX_RECORD_BLOCKS as usize;

pub(crate) fn encode_pad(seq: u64, epoch: u64) -> Vec<u8> {
    let mut block = vec![0u8; BLOCK as usize];
    encode_pad_into(&mut block, seq, epoch);
    block
}

/// Encodes a pad's header block into `block` (one block; every byte is written).
fn encode_pad_into(block: &mut [u8], seq: u64, epoch: u64) {
    block.fill(0);
    block[..8].copy_from_slice(RECORD_MAGIC);
    block[8..16].copy_from_slice(&seq.to_le_bytes());
    block[EPOCH_AT..EPOCH_AT + 8].copy_from_slice(&epoch.to_le_bytes());
    seal_crc(block);
}

pub(crate) fn decode_record_header(block: &[u8], expect_seq: u64, epoch: u64) -> Option<RecordHeader> {
    if &block[..8] != RECORD_MAGIC || crc_of(block) != u32::from_le_bytes(block[4092..].try_into().ok()?) {
        return None;
    }
    let u64_at = |o: usize| u64::from_le_bytes(block[o..o + 8].try_into().expect("8 bytes"));
    // A record of an earlier session (left beyond where that session's scan stopped, say by a
    // torn batch write) never continues this one, even where its sequence number would fit.
    if u64_at(8) != expect_seq || u64_at(EPOCH_AT) != epoch {
        return None;
    }
    let len_blocks = u64::from(u32::from_le_bytes(block[40..44].try_into().ok()?));
    let count = usize::from(u16::from_le_bytes(block[44..46].try_into().ok()?));
    if len_blocks > MAX_RECORD_BLOCKS || count > MAX_PIECES {
        return None;
    }
    let piece_slots =
        (0..count).map(|i| u16::from_le_bytes([block[48 + 2 * i], block[49 + 2 * i]])).collect();
    let crcs = (0..len_blocks as usize)
        .map(|i| u32::from_le_bytes(block[560 + 4 * i..564 + 4 * i].try_into().expect("4 bytes")))
        .collect();
    Some(RecordHeader {
        txn_id: u64_at(16),
        volume_id: u64_at(24),
        target_block: u64_at(32),
        len_blocks,
        piece_slots,
        crcs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use stria_dev::mem::MemDevice;

    fn marks(all: u64) -> Watermarks {
        Watermarks { all, except: Vec::new() }
    }

    /// A header carries per-volume marks below its `all` mark and gives them back; a header
    /// written before the marks existed (zeros after the epoch) says its one watermark for every
    /// volume; marks out of shape are no header.
    #[test]
    fn headers_carry_per_volume_marks_and_read_old_headers() {
        let h = JournalHeader {
            checkpoint_seq: 9,
            next_offset_blocks: 40,
            marks: Watermarks { all: 100, except: vec![(3, 41), (7, 99)] },
            epoch: 2,
        };
        let block = Journal::encode_header(&h);
        assert_eq!(Journal::decode_header(&block), Some(h.clone()));
        assert_eq!(
            u64::from_le_bytes(block[24..32].try_into().unwrap()),
            41,
            "the old field is the lowest mark"
        );
        assert_eq!((h.marks.of(3), h.marks.of(7), h.marks.of(8), h.marks.lowest()), (41, 99, 100, 41));
        // A header of the format before the marks: bytes 40.. zero.
        let mut old = block.clone();
        old[40..4092].fill(0);
        seal_crc(&mut old);
        let read = Journal::decode_header(&old).expect("an old header reads");
        assert_eq!(read.marks, Watermarks { all: 41, except: Vec::new() });
        // Out of shape: unsorted volumes, a mark not below `all`, a count past the room.
        for (at, value) in [(56usize, 9u64), (64, 100), (48, 253)] {
            let mut bad = block.clone();
            if at == 48 {
                bad[48..50].copy_from_slice(&(value as u16).to_le_bytes());
            } else {
                bad[at..at + 8].copy_from_slice(&value.to_le_bytes());
            }
            seal_crc(&mut bad);
            assert_eq!(Journal::decode_header(&bad), None, "byte {at} = {value}");
        }
        // Later marks may only say more.
        let later = Watermarks { all: 120, except: vec![(7, 110)] };
        assert!(later.covers(&h.marks));
        assert!(!Watermarks { all: 120, except: vec![(3, 40)] }.covers(&h.marks));
        assert!(!Watermarks { all: 99, except: vec![] }.covers(&h.marks));
    }

    fn piece(txn: u64, blocks: usize, fill: u8) -> JournalPiece {
        JournalPiece {
            txn_id: txn,
            volume_id: 1,
            target_block: txn * 10,
            piece_slots: vec![0, 3, 5],
            data: IoBytes::copy_from(&vec![fill; blocks * 4096]),
            crcs: JournalPiece::crcs_of(&vec![fill; blocks * 4096]),
        }
    }

    #[tokio::test]
    async fn records_survive_reopen_until_checkpointed() {
        let dev = MemDevice::new("j", 1 << 20);
        Journal::format(&dev, 0).await.unwrap();
        let (j, found, _) = Journal::open(&dev, 0, 1 << 20).await.unwrap();
        assert!(found.is_empty());
        let s1 = j.append(&dev, piece(1, 2, 0xa1), &PendingErrors::default()).await.unwrap();
        let s2 = j.append(&dev, piece(2, 1, 0xa2), &PendingErrors::default()).await.unwrap();
        assert_eq!((s1, s2), (1, 2));
        let (_, found, _) = Journal::open(&dev, 0, 1 << 20).await.unwrap();
        assert_eq!(found.len(), 2);
        assert_eq!(found[0].piece.txn_id, 1);
        assert!(found[1].piece.data.iter().all(|&b| b == 0xa2));
        assert_eq!(found[1].piece.piece_slots, vec![0, 3, 5]);

        let _ = s1;
        assert_eq!(j.checkpoint_candidate(1), 1, "transaction 2 is not applied yet");
        j.checkpoint(&dev, 1, &marks(1)).await.unwrap();
        let (j2, found, watermark) = Journal::open(&dev, 0, 1 << 20).await.unwrap();
        assert_eq!(watermark, marks(1));
        assert_eq!(found.iter().map(|p| p.seq).collect::<Vec<_>>(), vec![2]);
        // The reopened journal continues the sequence.
        assert_eq!(j2.append(&dev, piece(3, 1, 1), &PendingErrors::default()).await.unwrap(), 3);
    }

    #[tokio::test]
    async fn the_ring_wraps_and_reports_full() {
        // 64 KiB area: 2 header blocks + 14 ring blocks.
        let dev = MemDevice::new("j", 1 << 20);
        Journal::format(&dev, 0).await.unwrap();
        let (j, _, _) = Journal::open(&dev, 0, 64 << 10).await.unwrap();
        let mut seqs = Vec::new();
        for t in 0..3 {
            seqs.push(j.append(&dev, piece(t, 3, t as u8), &PendingErrors::default()).await.unwrap());
        }
        assert!(matches!(
            j.append(&dev, piece(9, 3, 9), &PendingErrors::default()).await,
            Err(AppendError::Full)
        ));
        assert_eq!(seqs.len(), 3);
        let c = j.checkpoint_candidate(u64::MAX);
        j.checkpoint(&dev, c, &marks(3)).await.unwrap();
        assert_eq!(j.used_blocks(), 0);
        // This one must wrap: 12 blocks used from 0, 2 left at the end of the ring.
        let s = j.append(&dev, piece(10, 3, 10), &PendingErrors::default()).await.unwrap();
        let (_, found, _) = Journal::open(&dev, 0, 64 << 10).await.unwrap();
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].seq, s);
        assert_eq!(found[0].piece.txn_id, 10);
    }

    /// A batch's entries that follow one another in the ring go down as one write holding each
    /// header and payload in order; a pad (one header block, then the ring wraps) ends a run.
    #[test]
    fn a_batch_is_one_write_per_run_of_consecutive_blocks() {
        let (a, b, c) = (piece(1, 2, 0xa1), piece(2, 1, 0xa2), piece(3, 1, 0xa3));
        let pieces = [&a, &b, &c];
        let blocks = [
            Block { pos: 10, seq: 5, record: Some(0) },
            Block { pos: 13, seq: 6, record: Some(1) },
            Block { pos: 15, seq: 7, record: None },
            Block { pos: 0, seq: 8, record: Some(2) },
        ];
        let writes = assemble_runs(&blocks, &pieces, 4);
        assert_eq!(
            writes.iter().map(|(pos, w)| (*pos, w.len())).collect::<Vec<_>>(),
            [(10, 6 * 4096), (0, 2 * 4096)]
        );
        let mut expect = encode_record_header(5, 4, &a);
        expect.extend_from_slice(&a.data);
        expect.extend_from_slice(&encode_record_header(6, 4, &b));
        expect.extend_from_slice(&b.data);
        expect.extend_from_slice(&encode_pad(7, 4));
        assert!(writes[0].1[..] == expect[..], "run at 10: headers and payloads in ring order");
        let mut expect = encode_record_header(8, 4, &c);
        expect.extend_from_slice(&c.data);
        assert!(writes[1].1[..] == expect[..], "run at 0");
    }

    /// Appends that arrive while a writer is busy go down as one batch, wrapping the ring (a
    /// pad) inside it in two writes, and read back in order, each with its own payload.
    #[tokio::test]
    async fn a_batch_of_appends_wraps_and_reads_back_in_order() {
        let dev = MemDevice::new("j", 1 << 20);
        Journal::format(&dev, 0).await.unwrap();
        // 2 header blocks + 31 ring blocks; records of 3 blocks.
        let (j, _, _) = Journal::open(&dev, 0, 132 << 10).await.unwrap();
        let errors = PendingErrors::default();
        for t in 0..7 {
            j.append(&dev, piece(t, 2, t as u8), &errors).await.unwrap();
        }
        let c = j.checkpoint_candidate(u64::MAX);
        j.checkpoint(&dev, c, &marks(7)).await.unwrap();
        // Head at ring block 21: three records fit before the end, a pad takes block 30.
        let busy = j.writer.lock().await;
        let appends =
            futures::future::try_join_all((10..16).map(|t| j.append(&dev, piece(t, 2, t as u8), &errors)));
        tokio::pin!(appends);
        assert!(futures::poll!(&mut appends).is_pending(), "every append waits for the writer");
        let writes_before = dev.counters().snapshot().write_ops;
        drop(busy);
        let seqs = appends.await.unwrap();
        assert_eq!(seqs, [8, 9, 10, 12, 13, 14], "sequence 11 is the pad");
        assert_eq!(dev.counters().snapshot().write_ops - writes_before, 2, "one write per run");
        let (_, found, _) = Journal::open(&dev, 0, 132 << 10).await.unwrap();
        assert_eq!(found.iter().map(|p| p.seq).collect::<Vec<_>>(), seqs);
        for (f, t) in found.iter().zip(10u64..) {
            assert_eq!(f.piece.txn_id, t);
            assert!(f.piece.data.iter().all(|&x| x == t as u8), "record of transaction {t}");
        }
    }

    #[tokio::test]
    async fn a_torn_record_ends_the_scan() {
        let dev = MemDevice::new("j", 1 << 20);
        Journal::format(&dev, 0).await.unwrap();
        let (j, _, _) = Journal::open(&dev, 0, 1 << 20).await.unwrap();
        j.append(&dev, piece(1, 1, 1), &PendingErrors::default()).await.unwrap();
        j.append(&dev, piece(2, 1, 2), &PendingErrors::default()).await.unwrap();
        // Corrupt the payload of record 1 (ring block 1 = area block 3).
        dev.write_at(3 * 4096 + 17, &[0xee]);
        let (_, found, _) = Journal::open(&dev, 0, 1 << 20).await.unwrap();
        assert!(found.is_empty(), "a record after a damaged one is not trusted");
    }

    /// A torn batch write left record 3 in the ring without record 2 before it. The next session
    /// writes a new record 2 of the same size at the same place; after a crash the old record 3
    /// sits exactly where this session's record 3 would be, with the sequence number expected
    /// there. It must not be taken for part of this session (its transaction may be an id the
    /// new session reused, and replaying it would write old data).
    #[tokio::test]
    async fn a_record_left_by_an_earlier_session_never_continues_a_later_one() {
        let dev = MemDevice::new("j", 1 << 20);
        let errors = PendingErrors::default();
        Journal::format(&dev, 0).await.unwrap();
        let (j, _, _) = Journal::open(&dev, 0, 1 << 20).await.unwrap();
        for t in 1..=3 {
            j.append(&dev, piece(t, 1, t as u8), &errors).await.unwrap();
        }
        // Record 2 (ring blocks 2-3 = area blocks 4-5) never landed.
        dev.write_at(4 * 4096, &[0u8; 8192]);
        let (j, found, _) = Journal::open(&dev, 0, 1 << 20).await.unwrap();
        assert_eq!(found.iter().map(|p| p.seq).collect::<Vec<_>>(), vec![1]);
        // Recovery checkpoints what it found, then the new session starts.
        j.checkpoint(&dev, 1, &marks(1)).await.unwrap();
        j.begin_session(&dev).await.unwrap();
        let s = j.append(&dev, piece(7, 1, 0x77), &errors).await.unwrap();
        assert_eq!(s, 2, "the new session reuses sequence 2 at the same ring position");
        let (_, found, _) = Journal::open(&dev, 0, 1 << 20).await.unwrap();
        assert_eq!(
            found.iter().map(|p| (p.seq, p.piece.txn_id)).collect::<Vec<_>>(),
            vec![(2, 7)],
            "the old record 3 was taken for this session's"
        );
    }
}
