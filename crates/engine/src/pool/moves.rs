//! Moving member extents between drives while I/O continues: `pool rebalance` (even out the
//! drives of a class after `drive add`) and the drain of `drive remove`
//! (docs/design/pool-growth.md).
//!
//! One extent moves at a time. A move is three steps:
//!
//! 1. **Start** (one commit): the member gets `move_to`, a free extent on the destination drive.
//!    The member itself stays where it is and stays complete: every read and write uses it.
//! 2. **Copy**: a shadow on the source drive repeats every write to the member's extent on the
//!    destination (drive/shadow.rs), and each row is copied under its stripe lock, so a copied
//!    row stays equal on both. A request waits at most for one chunk's copy. Every 2 s (or
//!    [`MOVE_CURSOR_STEP_BYTES`]) the destination is flushed and the rows copied are committed
//!    (`move_cursor_rows`).
//! 3. **Switch** (under every stripe lock of the volume): flush all drives, then one commit points
//!    the member at the destination and keeps the source reserved as `moved_from` (reads that
//!    started before may still be reading it), the map is replaced and the shadow removed. Once
//!    a grace period of the operation gate has passed (pool/gate.rs), a commit frees the source.
//!
//! A crash before the switch commit leaves the member complete where it was (the destination's
//! rows are never read before the switch). Recovery copies again the rows below the committed
//! cursor that an intent bit of either drive (or a replayed journal piece) marks, the only rows
//! where the two can differ, installs the shadow before any request runs, and the copy resumes
//! at the cursor ([`Pool::resume_move`]; docs/design/pool-growth.md, "Resuming a move"). A
//! crash after the switch commit leaves the member on the destination, which the flush made
//! hold every write acknowledged before the switch.

use crate::volume::member::MemberDrive;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use stria_dev::{BLOCK_BYTES, BLOCK_USIZE, BlockDevice, IoBuf};

use super::{Pool, alloc};
use crate::drive::Drive;
use crate::drive::csum::Entry;
use crate::drive::shadow::Shadow;
use crate::error::EngineError;
use crate::format::meta::{
    DriveClass, DriveState, ExtentRecord, Layout, MemberRecord, PoolMeta, RebalanceRecord,
};
use crate::volume::Volume;

/// A drive's used fraction may differ from its class's mean by this share of the mean before
/// the rebalance moves anything (5 %: at most 5 % above or below even).
pub const BALANCE_SLACK: f64 = 0.05;

/// A move commits its cursor at least this often...
const CURSOR_PERIOD: Duration = Duration::from_secs(2);

/// ...and after copying this many bytes, unless the pool was told otherwise
/// ([`Pool::set_move_cursor_step`]). Each commit flushes the destination and writes the pool's
/// metadata, so commits are spaced by time and bytes, not by rows: a unit of 16 MiB, copied in
/// well under 2 s, is copied again whole after a crash; one of 31 GiB loses at most 2 s of copy.
pub const MOVE_CURSOR_STEP_BYTES: u64 = 1 << 30;

/// At most this much of a move (and at most a quarter of its extent) is copied again while a
/// pool opens (the rows below its cursor that a crash may have left different); past it the
/// cursor comes down instead, and the runner copies the rest in the background.
const RECOPY_AT_OPEN_BYTES: u64 = 64 << 20;

/// The chunk (blocks per member row) of the volume of move `p`.
fn rows_chunk(meta: &PoolMeta, p: &Planned) -> u64 {
    meta.volume(&p.volume).map_or(1, |v| u64::from(v.chunk_blocks))
}

/// The rows of an extent (`start`, `blocks` long) with rows of `chunk` blocks that the drive
/// range `(first, len)` touches.
fn rows_touched((start, blocks): (u64, u64), chunk: u64, (first, len): (u64, u64)) -> std::ops::Range<u64> {
    let lo = first.max(start);
    let hi = (first + len).min(start + blocks);
    if lo >= hi {
        return 0..0;
    }
    (lo - start) / chunk..(hi - 1 - start) / chunk + 1
}

/// The move in progress, for `status`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MoveProgress {
    pub volume: String,
    pub segment: usize,
    pub member: usize,
    pub from_drive: u32,
    pub to_drive: u32,
    pub rows_done: u64,
    pub rows_total: u64,
}

/// What `status` says about moving extents.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RebalanceStatus {
    /// A `pool rebalance` was asked for and has not finished.
    pub requested: bool,
    pub rate_bytes_per_sec: u64,
    /// Drives being emptied by `drive remove`.
    pub draining: Vec<u32>,
    /// Moves finished since the pool was opened.
    pub moves_done: u64,
    pub current: Option<MoveProgress>,
}

/// What a run of [`Pool::rebalance`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RebalanceReport {
    pub moves: u64,
    pub bytes_copied: u64,
    /// Bytes a resumed move found copied before (by a run cut short, before a restart too) and
    /// did not copy again.
    #[serde(default)]
    pub bytes_resumed: u64,
    /// Moves given up (a drive failed, a rebuild started, the volume was deleted); the planner
    /// picks the extent again on the next run.
    pub abandoned: u64,
    /// Why nothing more could be moved, when a drain or the balance is not complete.
    pub stuck: Option<String>,
}

/// The extent being moved, as the runner and the code that may abandon it see it.
pub(crate) struct ActiveMove<D> {
    volume: String,
    source: Arc<Drive<D>>,
    shadow: Arc<Shadow<D>>,
    progress: MoveProgress,
}

/// Intent regions of a move's source held since its shadow was dropped: (drive, first block,
/// blocks).
pub(crate) type CursorPin<D> = (Arc<Drive<D>>, u64, u64);

/// One planned move: member `member` of segment `segment` of `volume` to drive `to`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Planned {
    volume: String,
    segment: usize,
    member: usize,
    to: u32,
}

impl Planned {
    /// The record of the member this move is about, in `meta` (none once the volume, segment
    /// or member is gone).
    fn member_mut<'a>(&self, meta: &'a mut PoolMeta) -> Option<&'a mut MemberRecord> {
        let v = meta.volumes.iter_mut().find(|v| v.name == self.volume)?;
        v.segments.get_mut(self.segment)?.members.get_mut(self.member)
    }
}

/// Why the runner stops a move.
enum Stop {
    /// Given up; the reason is logged.
    Abandon(String),
    /// The pool is closing: leave the move in the metadata for the next open.
    Closing,
    Error(EngineError),
}

impl From<EngineError> for Stop {
    fn from(e: EngineError) -> Stop {
        Stop::Error(e)
    }
}

impl<D: BlockDevice> Pool<D> {
    /// Commits a move's cursor after every `bytes` copied (rounded to whole rows; default
    /// [`MOVE_CURSOR_STEP_BYTES`]), besides every 2 s. Tests set it small so that crashes land
    /// between commits of short moves.
    pub fn set_move_cursor_step(&self, bytes: u64) {
        self.move_cursor_step.store(bytes.max(1), Ordering::Relaxed);
    }

    /// Asks for a rebalance (kept in the metadata, so a restart resumes it) at most
    /// `rate_bytes_per_sec` (0: no limit). The daemon runs it in the background; otherwise call
    /// [`Pool::rebalance`].
    pub async fn request_rebalance(&self, rate_bytes_per_sec: u64) -> Result<(), EngineError> {
        self.core
            .update(move |m| {
                let next = Some(RebalanceRecord { rate_bytes_per_sec });
                let changed = m.rebalance != next;
                m.rebalance = next;
                Ok(((), changed))
            })
            .await
    }

    /// Starts emptying drive `slot` for `drive remove`: no new extent goes to it and the
    /// rebalance moves its members to the other drives of its class. Refused, with the volume
    /// and the reason, when those cannot take them.
    pub async fn drain_drive(&self, slot: u32) -> Result<(), EngineError> {
        self.core
            .update(move |m| {
                let rec = m.drive(slot).ok_or_else(|| EngineError::NoSuchDrive(format!("slot {slot}")))?;
                if rec.state != DriveState::Active {
                    return Err(EngineError::Busy(format!(
                        "drive {slot} is {}: fail and replace it instead",
                        format!("{:?}", rec.state).to_lowercase()
                    )));
                }
                if rec.draining {
                    return Ok(((), false));
                }
                let mut probe = m.clone();
                probe.drives.iter_mut().filter(|d| d.slot == slot).for_each(|d| d.draining = true);
                drain_fits(&probe, slot)?;
                *m = probe;
                Ok(((), true))
            })
            .await
    }

    /// True when there is something to move: a member of a draining drive, a move left by a
    /// crash, a source extent to free, or an uneven class while a rebalance is asked for.
    pub fn rebalance_pending(&self) -> bool {
        let meta = self.core.meta();
        let mut members = meta.volumes.iter().flat_map(|v| &v.segments).flat_map(|s| &s.members);
        if members.any(|m| m.in_motion()) {
            return true;
        }
        if self.rebuild_pending() {
            return false;
        }
        meta.rebalance.is_some() || meta.drives.iter().any(|d| d.draining) && plan(&meta).is_some()
    }

    /// Draining drives that hold nothing any more: `drive remove` can take them out now.
    pub fn drained(&self) -> Vec<u32> {
        let meta = self.core.meta();
        meta.drives
            .iter()
            .filter(|d| d.draining && alloc::used_extents(&meta, d.slot).is_empty())
            .map(|d| d.slot)
            .collect()
    }

    /// What `status` shows about moves.
    pub fn rebalance_status(&self) -> RebalanceStatus {
        let meta = self.core.meta();
        RebalanceStatus {
            requested: meta.rebalance.is_some(),
            rate_bytes_per_sec: meta.rebalance.map_or(0, |r| r.rate_bytes_per_sec),
            draining: meta.drives.iter().filter(|d| d.draining).map(|d| d.slot).collect(),
            moves_done: self.moves_done.load(Ordering::Relaxed),
            current: self.moving.lock().as_ref().map(|m| m.progress.clone()),
        }
    }

    /// Moves extents until the drains are done and (when a rebalance was asked for) every
    /// drive's usage is within [`BALANCE_SLACK`] of its class's mean, one at a time, while I/O
    /// continues. Stopping early (dropping the future, closing the pool) loses at most the
    /// extent being copied, which the next run copies again.
    pub async fn rebalance(
        &self,
        mut report: impl FnMut(&MoveProgress),
    ) -> Result<RebalanceReport, EngineError> {
        let mut out = RebalanceReport::default();
        let started = Instant::now();
        loop {
            if self.closed.load(Ordering::Relaxed) {
                return Ok(out);
            }
            if self.rebuild_pending() {
                out.stuck = Some("a rebuild is pending; moves wait for it".into());
                return Ok(out);
            }
            // A move left by a crash (or by an earlier run) goes on first; then the planner.
            let next = match self.started_move() {
                Some(p) => Some(p),
                None => self.start_move().await?,
            };
            let Some(planned) = next else {
                self.free_sources().await?;
                let meta = self.core.meta();
                if meta.drives.iter().any(|d| d.draining && !alloc::used_extents(&meta, d.slot).is_empty()) {
                    out.stuck = Some(drain_stuck(&meta));
                } else if meta.rebalance.is_some() {
                    self.core
                        .update(|m| {
                            let changed = m.rebalance.take().is_some();
                            Ok(((), changed))
                        })
                        .await?;
                    tracing::info!(moves = out.moves, "rebalance complete");
                }
                return Ok(out);
            };
            let rate = self.core.meta().rebalance.map_or(0, |r| r.rate_bytes_per_sec);
            match self.run_move(&planned, rate, started, &mut out, &mut report).await {
                Ok(()) => {
                    out.moves += 1;
                    self.moves_done.fetch_add(1, Ordering::Relaxed);
                }
                Err(Stop::Closing) => return Ok(out),
                Err(Stop::Abandon(why)) => {
                    tracing::warn!(volume = %planned.volume, reason = %why, "move abandoned");
                    out.abandoned += 1;
                    self.abandon_move(&planned).await?;
                    if out.abandoned > 3 {
                        out.stuck = Some(format!("moves keep failing: {why}"));
                        return Ok(out);
                    }
                }
                Err(Stop::Error(e)) => {
                    self.drop_shadow();
                    return Err(e);
                }
            }
        }
    }

    /// The move recorded in the metadata, if any (one at a time).
    fn started_move(&self) -> Option<Planned> {
        let meta = self.core.meta();
        for v in &meta.volumes {
            for (si, s) in v.segments.iter().enumerate() {
                for (mi, m) in s.members.iter().enumerate() {
                    if let Some(to) = m.move_to {
                        return Some(Planned {
                            volume: v.name.clone(),
                            segment: si,
                            member: mi,
                            to: to.slot,
                        });
                    }
                }
            }
        }
        None
    }

    /// Plans the next move and records it (one commit, which also frees the sources of earlier
    /// moves). `None` when there is nothing to move.
    async fn start_move(&self) -> Result<Option<Planned>, EngineError> {
        self.free_sources().await?;
        self.core
            .update(|m| {
                let Some(p) = plan(m) else { return Ok((None, false)) };
                let (rows, chunk, to_blocks) = {
                    let v = m.volume(&p.volume).expect("planned from this document");
                    let to = m.drive(p.to).expect("planned from this document");
                    (v.segments[p.segment].rows, u64::from(v.chunk_blocks), to.data_blocks)
                };
                let start =
                    alloc::first_fit(m, p.to, to_blocks, rows * chunk).expect("planner checked the space");
                let v =
                    m.volumes.iter_mut().find(|v| v.name == p.volume).expect("planned from this document");
                v.segments[p.segment].members[p.member].move_to =
                    Some(ExtentRecord { slot: p.to, start_block: start });
                Ok((Some(p), true))
            })
            .await
    }

    /// Frees (one commit) the source extents of finished moves, once no request that could
    /// still read one is left: every request that loaded a map before its switch entered the
    /// operation gate before it, so a grace period of the gate covers them.
    async fn free_sources(&self) -> Result<(), EngineError> {
        let meta = self.core.meta();
        let mut sources = Vec::new();
        for v in &meta.volumes {
            for s in &v.segments {
                for m in &s.members {
                    if let Some(e) = m.moved_from {
                        sources.push((e, s.rows * u64::from(v.chunk_blocks)));
                    }
                }
            }
        }
        if sources.is_empty() {
            return Ok(());
        }
        self.core.ops.grace().await;
        let Some(_op) = self.core.ops.enter() else { return Ok(()) };
        // As a deleted volume's extents: their checksums cleared, so they read as zeros.
        for (e, blocks) in &sources {
            if let Some(d) = self.core.drive(e.slot).filter(|d| !d.is_failed()) {
                d.zero(e.start_block, *blocks).await?;
            }
        }
        self.core
            .update(|m| {
                let mut changed = false;
                for mem in m.volumes.iter_mut().flat_map(|v| &mut v.segments).flat_map(|s| &mut s.members) {
                    changed |= mem.moved_from.take().is_some();
                }
                Ok(((), changed))
            })
            .await
    }

    /// Copies the member of `p` to its destination and switches it there.
    async fn run_move(
        &self,
        p: &Planned,
        rate: u64,
        started: Instant,
        out: &mut RebalanceReport,
        report: &mut impl FnMut(&MoveProgress),
    ) -> Result<(), Stop> {
        let vol = self.volume(&p.volume).ok_or_else(|| Stop::Abandon("the volume is gone".into()))?;
        let meta = self.core.meta();
        let rec = meta.volume(&p.volume).ok_or_else(|| Stop::Abandon("the volume is gone".into()))?;
        let seg = &rec.segments[p.segment];
        let member = &seg.members[p.member];
        let dst = member.move_to.ok_or_else(|| Stop::Abandon("the move was taken back".into()))?;
        let (src_slot, src_start) = (member.slot, member.start_block);
        let chunk = u64::from(rec.chunk_blocks);
        let rows = seg.rows;
        let source = self.core.drive(src_slot).filter(|d| !d.is_failed());
        let target = self.core.drive(dst.slot).filter(|d| !d.is_failed());
        let (Some(source), Some(target)) = (source, target) else {
            return Err(Stop::Abandon("the source or the destination drive is failed".into()));
        };
        // The shadow this move already has (installed by recovery, or left by an earlier run
        // whose future was dropped) has repeated every write since it was installed, so the
        // rows it covered are copied; any other shadow goes, and the copy starts at row 0.
        let (shadow, first) = match self.shadow_for(p, (src_slot, src_start), dst, rows) {
            Some(found) => found,
            None => {
                // The recorded cursor was covered by a shadow that is gone: it says nothing now.
                if member.move_cursor_rows > 0 {
                    self.store_cursor(p, dst, 0).await?;
                }
                (self.install_shadow(p, (&source, src_start), (&target, dst), rows, 0), 0)
            }
        };
        out.bytes_resumed += first * chunk * BLOCK_BYTES;
        tracing::info!(volume = %p.volume, segment = p.segment, member = p.member, from = src_slot, to = dst.slot, rows, from_row = first, "moving an extent");
        let step = self.move_cursor_step.load(Ordering::Relaxed);
        let commit_every = (step / (chunk * BLOCK_BYTES)).max(1);
        let (mut committed, mut committed_at) = (first, Instant::now());
        for row in first..rows {
            let Some(_op) = self.core.ops.enter() else { return Err(Stop::Closing) };
            if vol.is_closed() {
                return Err(Stop::Abandon("the volume was deleted".into()));
            }
            self.check_move(p, &shadow, &source)?;
            let turn =
                self.background_turn(crate::qos::REBALANCE_FLOW, &vol, crate::qos::OpKind::Rebuild).await;
            self.copy_row(&vol, p.segment, row, chunk, (&source, src_start), (&target, dst.start_block))
                .await?;
            drop(turn);
            out.bytes_copied += chunk * BLOCK_BYTES;
            if let Some(m) = self.moving.lock().as_mut() {
                m.progress.rows_done = row + 1;
                report(&m.progress);
            }
            let done = row + 1;
            if done < rows && (done - committed >= commit_every || committed_at.elapsed() >= CURSOR_PERIOD) {
                self.commit_cursor(p, dst, &target, done).await?;
                (committed, committed_at) = (done, Instant::now());
            }
            if rate > 0 {
                let due = Duration::from_secs_f64(out.bytes_copied as f64 / rate as f64);
                if let Some(wait) = due.checked_sub(started.elapsed()) {
                    tokio::time::sleep(wait).await;
                }
            }
        }
        let Some(_op) = self.core.ops.enter() else { return Err(Stop::Closing) };
        self.switch(&vol, p, &shadow, &source, (src_slot, src_start), dst).await?;
        tracing::info!(volume = %p.volume, segment = p.segment, member = p.member, from = src_slot, to = dst.slot, "extent moved");
        Ok(())
    }

    /// The shadow installed for move `p` of the extent at `src` to `dst` (`rows` rows), and the
    /// rows it has covered, if it is whole.
    fn shadow_for(
        &self,
        p: &Planned,
        src: (u32, u64),
        dst: ExtentRecord,
        rows: u64,
    ) -> Option<(Arc<Shadow<D>>, u64)> {
        let moving = self.moving.lock();
        let m = moving.as_ref()?;
        let same = m.progress.volume == p.volume
            && (m.progress.segment, m.progress.member) == (p.segment, p.member)
            && (m.progress.from_drive, m.shadow.src_start) == src
            && (m.progress.to_drive, m.shadow.dst_start) == (dst.slot, dst.start_block)
            && m.progress.rows_total == rows;
        (same && !m.shadow.is_broken()).then(|| (Arc::clone(&m.shadow), m.progress.rows_done))
    }

    /// Installs a new shadow for move `p` of the extent at `src_start` of `source` to `dst` on
    /// `target` (any other shadow goes first), with `done` of its `rows` rows copied.
    fn install_shadow(
        &self,
        p: &Planned,
        (source, src_start): (&Arc<Drive<D>>, u64),
        (target, dst): (&Arc<Drive<D>>, ExtentRecord),
        rows: u64,
        done: u64,
    ) -> Arc<Shadow<D>> {
        let chunk = rows_chunk(&self.core.meta(), p);
        let shadow = Arc::new(Shadow::new(src_start, rows * chunk, Arc::clone(target), dst.start_block));
        self.drop_shadow();
        source.add_shadow(Arc::clone(&shadow));
        *self.moving.lock() = Some(ActiveMove {
            volume: p.volume.clone(),
            source: Arc::clone(source),
            shadow: Arc::clone(&shadow),
            progress: MoveProgress {
                volume: p.volume.clone(),
                segment: p.segment,
                member: p.member,
                from_drive: source.slot(),
                to_drive: dst.slot,
                rows_done: done,
                rows_total: rows,
            },
        });
        shadow
    }

    /// Makes the first `done` rows of the move's copy durable on the destination and commits
    /// them as its cursor.
    async fn commit_cursor(
        &self,
        p: &Planned,
        dst: ExtentRecord,
        target: &Drive<D>,
        done: u64,
    ) -> Result<(), Stop> {
        target.flush().await.map_err(|e| Stop::Abandon(format!("flush of the destination failed: {e}")))?;
        if self.store_cursor(p, dst, done).await? {
            Ok(())
        } else {
            Err(Stop::Abandon("the move was taken back".into()))
        }
    }

    /// At open, after recovery resynchronised every volume and before any request runs: a move
    /// recorded with a cursor gets its shadow back, and the rows below the cursor that may
    /// differ between its drives (those `dirty` marks on any drive of the segment or on the
    /// destination: slot -> drive block ranges that an intent bit, a damaged checksum page or a
    /// replayed journal piece touched) are copied from the source again, so the copy resumes at
    /// the cursor. Returns the rows copied again. When that cannot be done the move is left
    /// without a shadow: the runner then starts it at row 0.
    pub(super) async fn resume_move(
        &self,
        dirty: &BTreeMap<u32, Vec<(u64, u64)>>,
    ) -> Result<u64, EngineError> {
        let Some(p) = self.started_move() else { return Ok(0) };
        let meta = self.core.meta();
        let Some(rec) = meta.volume(&p.volume) else { return Ok(0) };
        let seg = &rec.segments[p.segment];
        let member = &seg.members[p.member];
        let (Some(dst), cursor) = (member.move_to, member.move_cursor_rows.min(seg.rows)) else {
            return Ok(0);
        };
        let (src_slot, src_start, chunk, rows) =
            (member.slot, member.start_block, u64::from(rec.chunk_blocks), seg.rows);
        if cursor == 0 {
            return Ok(0);
        }
        let source = self.core.drive(src_slot).filter(|d| !d.is_failed() && !d.is_missing());
        let target = self.core.drive(dst.slot).filter(|d| !d.is_failed() && !d.is_missing());
        let (Some(source), Some(target), Some(vol)) = (source, target, self.volume(&p.volume)) else {
            // The runner takes the move back; until then the cursor must not outlive the marks.
            self.store_cursor(&p, dst, 0).await?;
            return Ok(0);
        };
        // Recovery resynchronised the rows any member's drive marks, which may have rewritten
        // the source's chunk of them; the destination's own marks say where it may lack a write.
        let mut again = BTreeSet::new();
        let extents =
            seg.members.iter().map(|m| (m.slot, m.start_block)).chain([(dst.slot, dst.start_block)]);
        for (slot, start) in extents {
            for &(first, len) in dirty.get(&slot).map(Vec::as_slice).unwrap_or(&[]) {
                again.extend(rows_touched((start, cursor * chunk), chunk, (first, len)));
            }
        }
        // Open copies at most RECOPY_AT_OPEN_BYTES or a quarter of the extent; past that the
        // cursor comes down to the first marked row beyond them, and the runner copies the
        // rest in the background. The lower cursor is committed before the marks are cleared.
        let most = (RECOPY_AT_OPEN_BYTES / (chunk * BLOCK_BYTES)).min(rows / 4).max(1) as usize;
        let resume_at = again.iter().nth(most).copied().unwrap_or(cursor);
        again.retain(|&r| r < resume_at);
        if resume_at < cursor {
            self.store_cursor(&p, dst, resume_at).await?;
        }
        if resume_at == 0 {
            return Ok(0);
        }
        self.install_shadow(&p, (&source, src_start), (&target, dst), rows, resume_at);
        for &row in &again {
            match self
                .copy_row(&vol, p.segment, row, chunk, (&source, src_start), (&target, dst.start_block))
                .await
            {
                Ok(()) => {}
                Err(Stop::Abandon(why)) => {
                    tracing::warn!(volume = %p.volume, reason = %why, "a move cannot resume at its cursor; it starts again");
                    self.drop_shadow();
                    self.store_cursor(&p, dst, 0).await?;
                    return Ok(0);
                }
                Err(Stop::Closing) => return Ok(0),
                Err(Stop::Error(e)) => return Err(e),
            }
        }
        tracing::info!(volume = %p.volume, segment = p.segment, member = p.member, cursor, resume_at, rows, copied_again = again.len(), "a move resumes at its cursor");
        Ok(again.len() as u64)
    }

    /// Commits `done` as the cursor of move `p` to `dst`; false when that move is not
    /// recorded any more.
    async fn store_cursor(&self, p: &Planned, dst: ExtentRecord, done: u64) -> Result<bool, EngineError> {
        let p = p.clone();
        let stored = self
            .core
            .update(move |m| {
                let mem = p.member_mut(m).filter(|mem| mem.move_to == Some(dst));
                let Some(mem) = mem else { return Ok((false, false)) };
                let changed = mem.move_cursor_rows != done;
                mem.move_cursor_rows = done;
                Ok((true, changed))
            })
            .await;
        if done == 0 && stored.is_ok() {
            self.release_cursor_pins();
        }
        stored
    }

    /// Stops the move unless it is still recorded and both drives still follow it.
    fn check_move(&self, p: &Planned, shadow: &Shadow<D>, source: &Drive<D>) -> Result<(), Stop> {
        if shadow.is_broken() {
            return Err(Stop::Abandon("a write could not be repeated on the destination".into()));
        }
        if source.is_failed() || shadow.target.is_failed() {
            return Err(Stop::Abandon("the source or the destination drive failed".into()));
        }
        if self.rebuild_pending() {
            return Err(Stop::Abandon("a rebuild started; moves wait for it".into()));
        }
        let meta = self.core.meta();
        let still = meta
            .volume(&p.volume)
            .and_then(|v| v.segments.get(p.segment))
            .and_then(|s| s.members.get(p.member))
            .is_some_and(|m| m.move_to.is_some_and(|e| e.slot == p.to));
        if !still {
            return Err(Stop::Abandon("the move was taken back".into()));
        }
        Ok(())
    }

    /// Copies row `row` of the member from `src` to `dst` under the row's stripe lock:
    /// verified data where the source has data, unwritten where it has none. A block that fails
    /// its checksum is repaired from redundancy first (a scrub of the row), never copied.
    async fn copy_row(
        &self,
        vol: &Volume<D>,
        si: usize,
        row: u64,
        chunk: u64,
        (src, src_start): (&Arc<Drive<D>>, u64),
        (dst, dst_start): (&Arc<Drive<D>>, u64),
    ) -> Result<(), Stop> {
        let at = src_start + row * chunk;
        let to = dst_start + row * chunk;
        for attempt in 0..2 {
            let guard = vol.lock_rows([(si, row)]).await;
            let entries =
                src.csum_entries(at, chunk).await.map_err(|e| Stop::Abandon(format!("source: {e}")))?;
            match src.read_verified(at, IoBuf::zeroed((chunk * BLOCK_BYTES) as usize)).await {
                Ok(data) => {
                    let data = data.freeze();
                    let written: Vec<bool> = entries.iter().map(|e| *e != Entry::Unwritten).collect();
                    let unwritten: Vec<bool> = written.iter().map(|w| !w).collect();
                    let mut ops = Vec::new();
                    crate::volume::maint::for_each_run(&written, |a, b| ops.push((a, b, true)));
                    crate::volume::maint::for_each_run(&unwritten, |a, b| ops.push((a, b, false)));
                    for (a, b, write) in ops {
                        let r = if write {
                            dst.write(to + a as u64, data.slice(a * BLOCK_USIZE..b * BLOCK_USIZE), false)
                                .await
                        } else {
                            dst.zero(to + a as u64, (b - a) as u64).await
                        };
                        r.map_err(|e| Stop::Abandon(format!("write to the destination failed: {e}")))?;
                    }
                    drop(guard);
                    return Ok(());
                }
                Err(_) if attempt == 0 => {
                    drop(guard);
                    tracing::warn!(
                        volume = vol.name(),
                        segment = si,
                        row,
                        "bad block in an extent being moved; repairing the row first"
                    );
                    let map = vol.current_map();
                    vol.scrub_row(&map, si, row).await?;
                }
                Err(_) => {}
            }
        }
        Err(Stop::Abandon(format!(
            "row {row} of segment {si} of {} has blocks that can be neither read nor repaired; run a scrub",
            vol.name()
        )))
    }

    /// Ends a copied move: under every stripe lock of the volume, flushes, commits the member at
    /// its destination (the source kept reserved), and replaces the map.
    async fn switch(
        &self,
        vol: &Volume<D>,
        p: &Planned,
        shadow: &Arc<Shadow<D>>,
        source: &Arc<Drive<D>>,
        (src_slot, src_start): (u32, u64),
        dst: ExtentRecord,
    ) -> Result<(), Stop> {
        let _all = vol.lock_all_rows().await;
        self.check_move(p, shadow, source)?;
        self.core.flush_all().await?;
        // A write repeated on the destination may have failed during the flush's wait.
        self.check_move(p, shadow, source)?;
        let (name, segment, member) = (p.volume.clone(), p.segment, p.member);
        let switched = self
            .core
            .update(move |m| {
                let v =
                    m.volumes.iter_mut().find(|v| v.name == name).ok_or(EngineError::NoSuchVolume(name))?;
                let mem = &mut v.segments[segment].members[member];
                // `drive replace` takes moves back without the stripe locks (it stops the shadow
                // first, so `check_move` catches it, unless it commits between that check and
                // this one).
                if !(mem.slot == src_slot && mem.start_block == src_start && mem.move_to == Some(dst)) {
                    return Ok((false, false));
                }
                mem.moved_from = Some(ExtentRecord { slot: src_slot, start_block: src_start });
                mem.slot = dst.slot;
                mem.start_block = dst.start_block;
                mem.take_move();
                Ok((true, true))
            })
            .await?;
        if !switched {
            return Err(Stop::Abandon("the move was taken back".into()));
        }
        self.refresh_volume(vol.name())?;
        self.drop_shadow();
        self.release_cursor_pins();
        Ok(())
    }

    /// Takes back a move the runner gave up: the destination extent is freed.
    async fn abandon_move(&self, p: &Planned) -> Result<(), EngineError> {
        self.drop_shadow();
        let meta = self.core.meta();
        let found =
            meta.volume(&p.volume).and_then(|v| v.segments.get(p.segment)?.members.get(p.member)?.move_to);
        // The destination's blocks are not cleared: a volume created there later clears its
        // extents anyway, and a concurrent `drive replace` may already own them.
        if found.is_none() {
            self.release_cursor_pins();
            return Ok(());
        }
        let p = p.clone();
        self.core
            .update(move |m| {
                let changed = p.member_mut(m).is_some_and(|mem| mem.take_move().is_some());
                Ok(((), changed))
            })
            .await?;
        self.release_cursor_pins();
        Ok(())
    }

    /// Stops repeating writes for the move in progress (a switch, an abandon, or a change that
    /// takes the move back: `drive replace`, a volume delete).
    pub(crate) fn drop_shadow(&self) {
        if let Some(m) = self.moving.lock().take() {
            // The move may stay recorded with its cursor for a while (until its abandon commit,
            // or for good after a crash): the source's bits are held first, so a write the
            // destination no longer gets keeps its bit set, and a restart copies its row again
            // (released once the record goes or its cursor is 0: `release_cursor_pins`).
            m.source.intent.hold(m.shadow.src_start, m.shadow.blocks);
            self.cursor_pins.lock().push((Arc::clone(&m.source), m.shadow.src_start, m.shadow.blocks));
            // Broken next: writes from now on are not repeated, so the move must not switch
            // (the switch checks under every stripe lock, after any such write).
            m.shadow.set_broken();
            m.source.remove_shadow(&m.shadow);
        }
    }

    /// Releases the holds [`Pool::drop_shadow`] took: no move is recorded with a cursor that
    /// rows written since could contradict.
    pub(crate) fn release_cursor_pins(&self) {
        for (drive, first, blocks) in self.cursor_pins.lock().drain(..) {
            drive.intent.release(first, blocks);
        }
    }

    /// Like [`Pool::drop_shadow`], only for a move of `volume`.
    pub(crate) fn drop_shadow_of(&self, volume: &str) {
        let ours = self.moving.lock().as_ref().is_some_and(|m| m.volume == volume);
        if ours {
            self.drop_shadow();
        }
    }
}

/// Used and total blocks of each active drive of `class` that takes new extents.
fn usage(meta: &PoolMeta, class: DriveClass) -> Vec<(u32, u64, u64)> {
    meta.drives
        .iter()
        .filter(|d| d.class == class && d.state == DriveState::Active && !d.draining && d.data_blocks > 0)
        .map(|d| {
            let used: u64 = alloc::used_extents(meta, d.slot).iter().map(|e| e.1).sum();
            (d.slot, used, d.data_blocks)
        })
        .collect()
}

/// Members of segment `mi`'s group that must sit in distinct failure domains from it.
fn group(layout: Layout, members: usize, mi: usize) -> std::ops::Range<usize> {
    match layout {
        Layout::Raid0 { .. } => mi..mi + 1,
        Layout::Raid1 { copies } | Layout::Raid10 { copies, .. } => {
            let c = copies as usize;
            (mi / c) * c..(mi / c + 1) * c
        }
        Layout::Ec { .. } => 0..members,
    }
}

/// True when member `mi` of segment `si` of volume `vi` may move to drive `to`: the segment
/// has nothing on it (members, or destinations of moves), its group has no other member in
/// its failure domain, and it has a free extent big enough.
fn may_move(meta: &PoolMeta, vi: usize, si: usize, mi: usize, to: u32) -> bool {
    let v = &meta.volumes[vi];
    let seg = &v.segments[si];
    let on =
        |slot: u32| seg.members.iter().any(|m| m.slot == slot || m.move_to.is_some_and(|e| e.slot == slot));
    if on(to) {
        return false;
    }
    let domain = alloc::domain_of(meta, to);
    let clash = group(v.layout, seg.members.len(), mi)
        .filter(|&j| j != mi)
        .any(|j| alloc::domain_of(meta, seg.members[j].slot) == domain);
    if clash {
        return false;
    }
    let Some(d) = meta.drive(to) else { return false };
    alloc::first_fit(meta, to, d.data_blocks, seg.rows * u64::from(v.chunk_blocks)).is_some()
}

/// Segments whose members may be moved: none rebuilding, failed or already moving.
fn movable(meta: &PoolMeta, vi: usize, si: usize) -> bool {
    meta.volumes[vi].segments[si].members.iter().all(|m| {
        m.rebuild_cursor_rows.is_none()
            && m.move_to.is_none()
            && meta.drive(m.slot).is_some_and(|d| d.state == DriveState::Active)
    })
}

/// The next move: first a member of a draining drive (to the least used drive that may take
/// it), then, when a rebalance is asked for, the move that best evens out the most and the
/// least used drives of a class.
fn plan(meta: &PoolMeta) -> Option<Planned> {
    let fraction = |(_, used, total): &(u32, u64, u64)| *used as f64 / *total as f64;
    for drain in meta.drives.iter().filter(|d| d.draining) {
        let mut targets = usage(meta, drain.class);
        targets.sort_by(|a, b| fraction(a).total_cmp(&fraction(b)));
        for (vi, v) in meta.volumes.iter().enumerate() {
            for (si, s) in v.segments.iter().enumerate() {
                for (mi, m) in s.members.iter().enumerate() {
                    if m.slot != drain.slot || !movable(meta, vi, si) {
                        continue;
                    }
                    if let Some(t) = targets.iter().find(|t| may_move(meta, vi, si, mi, t.0)) {
                        return Some(Planned { volume: v.name.clone(), segment: si, member: mi, to: t.0 });
                    }
                }
            }
        }
    }
    meta.rebalance?;
    for class in [DriveClass::Fast, DriveClass::Capacity] {
        let drives = usage(meta, class);
        let (used, total) = drives.iter().fold((0, 0), |(u, t), d| (u + d.1, t + d.2));
        if drives.len() < 2 || total == 0 {
            continue;
        }
        let mean = used as f64 / total as f64;
        let mut order = drives.clone();
        order.sort_by(|a, b| fraction(b).total_cmp(&fraction(a)));
        let slack = BALANCE_SLACK * mean;
        if fraction(&order[0]) - mean <= slack && mean - fraction(&order[order.len() - 1]) <= slack {
            continue;
        }
        // Best move: the largest drop of the higher of the two drives' fractions.
        let mut best: Option<(f64, Planned)> = None;
        for donor in order.iter().take_while(|d| fraction(d) > mean) {
            for target in order.iter().rev().take_while(|d| fraction(d) < mean) {
                for (vi, v) in meta.volumes.iter().enumerate().filter(|(_, v)| v.class == class) {
                    for (si, s) in v.segments.iter().enumerate() {
                        let blocks = s.rows * u64::from(v.chunk_blocks);
                        let after = ((donor.1 - blocks.min(donor.1)) as f64 / donor.2 as f64)
                            .max((target.1 + blocks) as f64 / target.2 as f64);
                        if after >= fraction(donor) || !movable(meta, vi, si) {
                            continue;
                        }
                        for (mi, m) in s.members.iter().enumerate() {
                            if m.slot == donor.0
                                && best.as_ref().is_none_or(|(b, _)| after < *b)
                                && may_move(meta, vi, si, mi, target.0)
                            {
                                let p =
                                    Planned { volume: v.name.clone(), segment: si, member: mi, to: target.0 };
                                best = Some((after, p));
                            }
                        }
                    }
                }
            }
            if best.is_some() {
                break;
            }
        }
        if let Some((_, p)) = best {
            return Some(p);
        }
    }
    None
}

/// Refuses a drain the other drives of the class cannot take: plans every move of the drained
/// drive's members on a copy of the metadata.
fn drain_fits(meta: &PoolMeta, slot: u32) -> Result<(), EngineError> {
    let mut probe = meta.clone();
    probe.rebalance = None;
    loop {
        let mut left = Vec::new();
        for (vi, v) in probe.volumes.iter().enumerate() {
            for (si, s) in v.segments.iter().enumerate() {
                for (mi, m) in s.members.iter().enumerate() {
                    if m.slot == slot {
                        left.push((vi, si, mi));
                    }
                }
            }
        }
        let Some(&(vi, si, mi)) = left.first() else { return Ok(()) };
        let Some(p) = plan(&probe) else {
            // Nothing movable is left: name a segment that cannot move now, if one is why.
            if let Some((vi, si, why)) =
                left.iter().find_map(|&(vi, si, _)| unmovable(&probe, vi, si).map(|why| (vi, si, why)))
            {
                let v = &probe.volumes[vi];
                return Err(EngineError::Busy(format!(
                    "drive {slot} cannot be emptied now: segment {si} of volume {} ({}) {why}",
                    v.name, v.layout
                )));
            }
            let v = &probe.volumes[vi];
            return Err(EngineError::Placement(format!(
                "drive {slot} cannot be emptied: volume {} ({}) needs its member {mi} of segment {si} on another \
                 active {} drive with {} free, in a failure domain none of its peers use, and none has it",
                v.name,
                v.layout,
                v.class,
                crate::units::format_size(v.segments[si].rows * u64::from(v.chunk_blocks) * BLOCK_BYTES),
            )));
        };
        let v = probe.volumes.iter().position(|v| v.name == p.volume).expect("planned from the probe");
        let blocks = probe.volumes[v].segments[p.segment].rows * u64::from(probe.volumes[v].chunk_blocks);
        let data_blocks = probe.drive(p.to).map_or(0, |d| d.data_blocks);
        let start = alloc::first_fit(&probe, p.to, data_blocks, blocks).expect("planner checked the space");
        let m = &mut probe.volumes[v].segments[p.segment].members[p.member];
        m.slot = p.to;
        m.start_block = start;
    }
}

/// Why segment `si` of volume `vi` cannot be moved now ([`movable`] says no), for a refusal;
/// `None` when it can.
fn unmovable(meta: &PoolMeta, vi: usize, si: usize) -> Option<String> {
    if movable(meta, vi, si) {
        return None;
    }
    let v = &meta.volumes[vi];
    let members = &v.segments[si].members;
    if members.iter().any(|m| m.move_to.is_some()) {
        return Some("is being moved (the daemon, or `pool rebalance` without one, finishes the move): try again when it is done".into());
    }
    if let Some((m, d)) = members
        .iter()
        .filter_map(|m| meta.drive(m.slot).map(|d| (m, d)))
        .find(|(_, d)| d.state != DriveState::Active)
    {
        return Some(format!(
            "has a member on drive {}, which is {}: replace that drive or bring it back first",
            m.slot,
            format!("{:?}", d.state).to_lowercase()
        ));
    }
    // Members waiting for a rebuild: more of them in one group than the layout survives is data
    // lost for good (a replaced drive of a raid0, say), which no rebuild will ever finish.
    let waiting = |j: &usize| members[*j].rebuild_cursor_rows.is_some();
    let lost = (0..members.len())
        .any(|mi| group(v.layout, members.len(), mi).filter(waiting).count() > v.layout.tolerance() as usize);
    Some(if lost {
        format!(
            "has lost more members than its layout survives (its data there is gone and no rebuild can restore \
             it): delete volume {} first, or keep the drive",
            v.name
        )
    } else {
        "has a member being rebuilt: empty the drive once the rebuild is done".into()
    })
}

/// Why a drain cannot go on (no member of the draining drives is movable now).
fn drain_stuck(meta: &PoolMeta) -> String {
    let draining: Vec<String> =
        meta.drives.iter().filter(|d| d.draining).map(|d| d.slot.to_string()).collect();
    format!(
        "drive(s) {} still hold members that cannot move now (a segment rebuilding or degraded, or no drive \
         with room in a free failure domain)",
        draining.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::meta::{MemberRecord, SegmentRecord, VolumeRecord, VolumeRole};

    fn pool(drives: u32, blocks: u64) -> PoolMeta {
        let mut m = alloc::tests::meta(&vec![""; drives as usize]);
        for d in &mut m.drives {
            d.data_blocks = blocks;
        }
        m
    }

    fn volume(m: &mut PoolMeta, name: &str, layout: Layout, slots: &[u32], rows: u64) {
        let members =
            slots.iter().map(|&s| MemberRecord::at(s, alloc::first_fit(m, s, 1000, rows).unwrap())).collect();
        m.volumes.push(VolumeRecord {
            id: m.volumes.len() as u64 + 1,
            name: name.into(),
            size_bytes: rows * 4096,
            layout,
            chunk_blocks: 1,
            class: DriveClass::Capacity,
            role: VolumeRole::Plain,
            segments: vec![SegmentRecord { rows, members }],
        });
    }

    /// Applies planned moves until there are none; returns how many.
    fn settle(m: &mut PoolMeta) -> usize {
        let mut n = 0;
        while let Some(p) = plan(m) {
            let v = m.volumes.iter().position(|v| v.name == p.volume).unwrap();
            let rows = m.volumes[v].segments[p.segment].rows;
            let start = alloc::first_fit(m, p.to, 1000, rows).unwrap();
            let mem = &mut m.volumes[v].segments[p.segment].members[p.member];
            mem.slot = p.to;
            mem.start_block = start;
            n += 1;
            assert!(n < 100, "the planner does not converge");
        }
        n
    }

    #[test]
    fn rebalance_evens_out_a_grown_class_and_keeps_segments_on_distinct_drives() {
        let mut m = pool(8, 1000);
        let ec = Layout::Ec { data_shards: 4, parity_shards: 2 };
        for i in 0..4 {
            volume(&mut m, &format!("v{i}"), ec, &[0, 1, 2, 3, 4, 5], 100);
        }
        assert_eq!(plan(&m), None, "nothing moves unless a rebalance is asked for");
        m.rebalance = Some(RebalanceRecord { rate_bytes_per_sec: 0 });
        let moves = settle(&mut m);
        assert_eq!(moves, 6, "2 new drives take 3 extents each");
        for d in usage(&m, DriveClass::Capacity) {
            assert_eq!(d.1, 300, "drive {} holds {} blocks", d.0, d.1);
        }
        for v in &m.volumes {
            let mut slots: Vec<u32> = v.segments[0].members.iter().map(|m| m.slot).collect();
            slots.sort_unstable();
            slots.dedup();
            assert_eq!(slots.len(), 6, "{} has two members on one drive", v.name);
        }
    }

    #[test]
    fn drain_moves_every_member_off_and_refuses_what_cannot_fit() {
        let mut m = pool(7, 1000);
        let ec = Layout::Ec { data_shards: 4, parity_shards: 2 };
        volume(&mut m, "a", ec, &[0, 1, 2, 3, 4, 5], 100);
        volume(&mut m, "b", Layout::Raid1 { copies: 2 }, &[5, 6], 100);
        m.drives[5].draining = true;
        drain_fits(&m, 5).expect("drive 6 can take a's member; b's goes to 0-4");
        settle(&mut m);
        assert!(alloc::used_extents(&m, 5).is_empty());
        // Seven drives, ec:4+2 over six of them and a 7-wide raid0: a drive cannot be emptied.
        let mut full = pool(7, 1000);
        volume(&mut full, "w", Layout::Raid0 { width: 7 }, &[0, 1, 2, 3, 4, 5, 6], 10);
        full.drives[3].draining = true;
        let e = drain_fits(&full, 3).unwrap_err().to_string();
        assert!(e.contains("volume w") && e.contains("cannot be emptied"), "{e}");
    }

    #[test]
    fn a_drain_held_up_by_a_segment_that_cannot_move_says_why() {
        // Found by the crash sequences (seed 10734): a raid0:1 volume whose drive was replaced
        // has a member waiting for a rebuild that can never come; a drain of its drive, with an
        // empty drive added, was refused as if no drive had room.
        let mut m = pool(8, 1000);
        let ec = Layout::Ec { data_shards: 4, parity_shards: 2 };
        volume(&mut m, "v", ec, &[0, 1, 2, 3, 4, 5], 100);
        volume(&mut m, "scratch", Layout::Raid0 { width: 1 }, &[5], 10);
        m.drives[5].draining = true;
        drain_fits(&m, 5).expect("drive 6 and 7 take both members");
        m.volumes[1].segments[0].members[0].rebuild_cursor_rows = Some(0);
        let e = drain_fits(&m, 5).unwrap_err();
        assert!(matches!(e, EngineError::Busy(_)), "{e:?}");
        let e = e.to_string();
        assert!(
            e.contains("volume scratch (raid0:1) has lost more members")
                && e.contains("delete volume scratch"),
            "{e}"
        );
        // Within what the layout survives, the member is only waiting for its rebuild.
        m.volumes[1].segments[0].members[0].rebuild_cursor_rows = None;
        m.volumes[0].segments[0].members[5].rebuild_cursor_rows = Some(3);
        let e = drain_fits(&m, 5).unwrap_err().to_string();
        assert!(e.contains("volume v (ec:4+2) has a member being rebuilt"), "{e}");
        // A member on a failed drive.
        m.volumes[0].segments[0].members[5].rebuild_cursor_rows = None;
        m.drives[0].state = DriveState::Failed;
        let e = drain_fits(&m, 5).unwrap_err().to_string();
        assert!(e.contains("has a member on drive 0, which is failed"), "{e}");
    }

    #[test]
    fn failure_domains_hold_across_moves() {
        let mut m = alloc::tests::meta(&["a", "a", "b", "b", "c", "c"]);
        for d in &mut m.drives {
            d.data_blocks = 1000;
        }
        // raid1:2 copies in domains a and b; only drives of c are empty.
        volume(&mut m, "r", Layout::Raid1 { copies: 2 }, &[0, 2], 400);
        m.rebalance = Some(RebalanceRecord { rate_bytes_per_sec: 0 });
        settle(&mut m);
        let s = &m.volumes[0].segments[0];
        assert_ne!(alloc::domain_of(&m, s.members[0].slot), alloc::domain_of(&m, s.members[1].slot));
    }
}
