//! Volumes: the byte-addressed block interface clients see, on top of a layout.
//!
//! This module splits requests into chunk runs, handles unaligned requests by read-modify-write
//! under the stripe lock, and dispatches to the two layout families: mirror/stripe (`mirror.rs`)
//! and erasure-coded (`ec.rs`). The family is chosen once, when the volume is installed
//! (`Family`); each operation is written once, generic over `LayoutFamily`, and picks the
//! family in one place (`with_family!`). Byte arithmetic shared with the tier is in `bytes.rs`.

/// The one place an operation picks its layout family: runs `$body` with `$f` bound to the
/// volume `$vol` seen through its family (an [`InFamily`], generic code over [`LayoutFamily`]).
/// Used once per operation, outside every loop.
macro_rules! with_family {
    ($vol:expr, |$f:ident| $body:expr) => {{
        let vol = $vol;
        match &vol.family {
            $crate::volume::Family::Mirror(fam) => {
                let $f = $crate::volume::InFamily { vol, fam };
                $body
            }
            $crate::volume::Family::Ec(fam) => {
                let $f = $crate::volume::InFamily { vol, fam };
                $body
            }
        }
    }};
}

pub mod bytes;
mod cas;
pub mod contract;
mod ec;
pub(crate) mod host;
pub(crate) mod locks;
pub(crate) mod maint;
pub(crate) mod map;
pub(crate) mod member;
mod mirror;

use crate::volume::member::MemberDrive;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed, Ordering::SeqCst};

use crate::join::join_all_ok;
use arc_swap::ArcSwap;
use smallvec::SmallVec;
use stria_dev::{BLOCK_BYTES, BLOCK_USIZE, BlockDevice, IoBuf, IoBytes};
use stria_ec::ReedSolomon;

use crate::drive::intent::IntentMap;
use crate::drive::{Drive, ReadFault};
use crate::error::{EngineError, VolumeError};
use crate::format::meta::{DriveClass, Layout};
use bytes::{ExtentRuns, Span, ZeroSplit};
use host::VolumeHost;
use locks::StripeLocks;
use map::{ChunkRun, Geometry, Member, Segment, VolumeMap};

// The contract's types, defined in `stria-volume`.
pub use stria_volume::{Extent, VolumeState};

/// What a drive block holds for a logical block (see [`Volume::locate`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockRole {
    /// The block's data (ec), or one of its copies (mirror layouts).
    Data,
    /// A parity block of the same stripe row (ec).
    Parity,
}

/// Where a logical block lives on the drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockLocation {
    pub slot: u32,
    pub device_offset_bytes: u64,
    pub role: BlockRole,
}

/// Host-side counters of a volume.
#[derive(Debug, Default)]
pub struct VolumeCounters {
    pub read_ops: stria_dev::Counter,
    pub read_bytes: stria_dev::Counter,
    pub write_ops: stria_dev::Counter,
    pub write_bytes: stria_dev::Counter,
    pub flush_ops: stria_dev::Counter,
    /// Blocks found bad on a drive and rewritten from redundancy.
    pub repaired_blocks: stria_dev::Counter,
    /// Reads that needed reconstruction (missing or bad member).
    pub degraded_reads: stria_dev::Counter,
    /// Erasure-coded writes by path.
    pub full_stripe_writes: stria_dev::Counter,
    pub partial_stripe_writes: stria_dev::Counter,
    /// Bytes this volume's writes put on its drives: data, mirror copies and parity, and the
    /// journal records of partial-stripe writes (payload and header block). Write amplification
    /// is measured with it: a drive's own counters also count every other volume on the drive.
    /// (Rebuild, scrub and repair writes are not counted here.)
    pub member_write_bytes: stria_dev::Counter,
}

/// The layout family of a volume, chosen once when the volume is installed: what differs between
/// mirror/stripe layouts and erasure-coded ones, and the state each needs (the ec codec).
pub(crate) enum Family {
    /// raid0, raid1, raid10.
    Mirror(mirror::Mirror),
    /// ec:K+M.
    Ec(ec::Ec),
}

impl Family {
    /// The family of `layout`; `codec` is the pool's codec for an ec layout (`None` otherwise).
    pub(crate) fn new(layout: Layout, codec: Option<Arc<ReedSolomon>>) -> Family {
        match layout {
            Layout::Ec { .. } => Family::Ec(ec::Ec { codec: codec.expect("an ec layout has a codec") }),
            Layout::Raid0 { .. } | Layout::Raid1 { .. } | Layout::Raid10 { .. } => {
                Family::Mirror(mirror::Mirror)
            }
        }
    }
}

/// A volume seen through its layout family: the volume (by `Deref`) and the family's state.
/// Built only by `with_family!`.
pub(crate) struct InFamily<'a, F, D: BlockDevice> {
    vol: &'a Volume<D>,
    fam: &'a F,
}

impl<F, D: BlockDevice> std::ops::Deref for InFamily<'_, F, D> {
    type Target = Volume<D>;

    fn deref(&self) -> &Volume<D> {
        self.vol
    }
}

/// What resynchronising or scrubbing one row found and did.
pub(crate) type RowResult = Result<maint::RowStats, EngineError>;

/// A member's chunk as rebuilt from the others.
pub(crate) type ChunkResult = Result<IoBuf, EngineError>;

/// What differs between layout families, implemented by `InFamily<'_, Mirror, D>` (mirror.rs)
/// and `InFamily<'_, Ec, D>` (ec.rs). The operations of [`Volume`] are written once, generic
/// over it, and pick their family once with `with_family!`: a new family is one module, one
/// [`Family`] variant and one arm of the macro.
pub(crate) trait LayoutFamily<D: BlockDevice>: std::ops::Deref<Target = Volume<D>> + Sync {
    /// The groups of a segment's members (indices) that each survive up to
    /// `Layout::tolerance()` missing members: every copy of a column, or the whole stripe.
    fn failure_groups(&self, members: usize) -> Vec<Vec<usize>>;

    /// A FUA write completes with one pool flush after its stripe locks are released, instead
    /// of FUA writes to the drives (ec: see [`Volume::write`]).
    fn fua_by_pool_flush(&self) -> bool;

    /// The member and its drive block that a run is read from without repair (ec: the data
    /// shard's member; mirror: the first usable copy, starting at a copy chosen by row so that
    /// reads of different rows spread over the copies). `None` when it is not usable.
    fn fast_source<'m>(&self, seg: &'m Segment<D>, run: &ChunkRun) -> Option<(&'m Member<D>, u64)>;

    /// Reads a run with its stripe lock held (the slow path): reads what is available,
    /// reconstructs what is missing or bad, and rewrites bad blocks on usable members.
    /// `spare` is the caller's buffer when the fast path did not use it up (ec decodes into it),
    /// of unspecified contents: a path that uses it overwrites every byte it returns.
    fn read_locked(
        &self,
        map: &VolumeMap<D>,
        run: ChunkRun,
        spare: Option<IoBuf>,
    ) -> impl Future<Output = Result<IoBuf, VolumeError>> + Send;

    /// Writes block-aligned `data` covering `runs` (the caller holds their stripe locks, and has
    /// checked that `data` is exactly the bytes of `runs`: `Volume::check_runs_cover`).
    /// `crcs`, when the caller has them, are the blocks' checksums, one per block of `data`:
    /// the members take them instead of computing them again.
    fn write_runs_locked(
        &self,
        map: &VolumeMap<D>,
        runs: &[ChunkRun],
        data: IoBytes,
        crcs: Option<&[u32]>,
        fua: bool,
    ) -> impl Future<Output = Result<(), VolumeError>> + Send;

    /// Zeroing and discard drop whole units of this many blocks (the rest is written as zeros,
    /// or left alone): a block, or an ec row.
    fn unmap_unit_blocks(&self) -> u64;

    /// The members whose checksum tables say whether the blocks of `run` are unwritten: a
    /// block is reported as a hole only when it is unwritten on every one of them, and never
    /// when there are none. Only usable members know the truth (a failed drive's table is
    /// stale, a member being rebuilt is not written yet). Saying "allocated" when unsure is
    /// always safe; saying "hole" wrongly makes clients skip real data.
    fn status_members<'m>(&self, seg: &'m Segment<D>, run: &ChunkRun) -> Vec<&'m Member<D>>;

    /// The members holding the block of `run` (one block long), with what each holds.
    fn locate_members(&self, run: &ChunkRun) -> Vec<(usize, BlockRole)>;

    /// Resynchronises row `row` of segment `si` after an unclean stop (see maint.rs; recovery,
    /// no I/O runs concurrently).
    fn resync(&self, map: &VolumeMap<D>, si: usize, row: u64) -> impl Future<Output = RowResult> + Send;

    /// Scrubs row `row` of segment `si` (see maint.rs; the caller holds its stripe lock).
    fn scrub_locked(&self, map: &VolumeMap<D>, si: usize, row: u64)
    -> impl Future<Output = RowResult> + Send;

    /// Member `mi`'s chunk of row `row` of segment `si` as the other members say it should be
    /// (the caller holds the stripe lock and writes it to the member).
    fn rebuild_chunk(
        &self,
        map: &VolumeMap<D>,
        si: usize,
        mi: usize,
        row: u64,
    ) -> impl Future<Output = ChunkResult> + Send;

    /// Zeroing may be cheap (no data written) only while the volume is healthy.
    fn cheap_zero_needs_healthy(&self) -> bool;

    /// Drops the whole units of `run` (the caller holds its stripe lock and confirms skipped
    /// members afterwards): they read as zeros and use no space.
    fn unmap_run(
        &self,
        map: &VolumeMap<D>,
        run: &ChunkRun,
    ) -> impl Future<Output = Result<(), VolumeError>> + Send;
}

/// A volume of a pool. Its fields are its own: the pool builds it with [`Volume::new`], swaps
/// its map with [`Volume::install_map`], closes it with [`Volume::close`] and walks its rows under
/// their stripe locks ([`Volume::lock_rows`], [`Volume::lock_all_rows`]).
pub struct Volume<D: BlockDevice> {
    id: u64,
    name: String,
    class: DriveClass,
    geo: Geometry,
    map: ArcSwap<VolumeMap<D>>,
    locks: StripeLocks,
    /// Whoever hosts the volume (its pool): the only way to it.
    host: Arc<dyn VolumeHost>,
    family: Family,
    counters: VolumeCounters,
    closed: AtomicBool,
}

impl<D: BlockDevice> Volume<D> {
    /// A volume `name` (id `id`, on drives of `class`) of geometry `geo` over `map`, hosted by
    /// `host`; `family` must be the family of `geo.layout`.
    pub(crate) fn new(
        id: u64,
        name: String,
        class: DriveClass,
        geo: Geometry,
        map: VolumeMap<D>,
        host: Arc<dyn VolumeHost>,
        family: Family,
    ) -> Volume<D> {
        assert_eq!(
            matches!(family, Family::Ec(_)),
            matches!(geo.layout, Layout::Ec { .. }),
            "volume {name}: layout family chosen for another layout ({})",
            geo.layout
        );
        Volume {
            id,
            name,
            class,
            geo,
            map: ArcSwap::from_pointee(map),
            locks: StripeLocks::new(),
            host,
            family,
            counters: VolumeCounters::default(),
            closed: AtomicBool::new(false),
        }
    }

    /// The volume's map as it is now (members, rebuild cursors, segments).
    pub(crate) fn current_map(&self) -> Arc<VolumeMap<D>> {
        self.map.load_full()
    }

    /// Replaces the volume's map (after a metadata commit changed its members or size).
    pub(crate) fn install_map(&self, map: VolumeMap<D>) {
        self.map.store(Arc::new(map));
    }

    /// Refuses every request from now on (`Closed`). Sequentially consistent with the operation
    /// gate: a request that enters after a grace begun after this sees it
    /// ([`crate::Pool::close_volume`]).
    pub(crate) fn close(&self) {
        self.closed.store(true, SeqCst);
    }

    /// True once closed.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(SeqCst)
    }

    /// The volume's geometry.
    pub(crate) fn geometry(&self) -> Geometry {
        self.geo
    }

    /// Holds the stripe locks of the given (segment, row) pairs.
    pub(crate) async fn lock_rows(
        &self,
        rows: impl IntoIterator<Item = (usize, u64)>,
    ) -> locks::StripeGuards<'_> {
        self.locks.lock(rows).await
    }

    /// Holds every stripe lock of the volume (no write runs while it is held).
    pub(crate) async fn lock_all_rows(&self) -> locks::StripeGuards<'_> {
        self.locks.lock_all().await
    }
}

/// Rule R2 (docs/design/delta-resync.md): while a write runs, the intent regions of every
/// member of the rows it writes count as in flight, on every member, until the whole write (and
/// any drive failure it causes) is over. So a drive that fails under the write finds the regions
/// the write touched elsewhere still held, and the out generation its failure opens seeds them.
///
/// The holds borrow the map the write uses (it outlives them): no reference count is taken per
/// member, and a write to a row of up to eight members allocates nothing for them.
struct RegionHolds<'m> {
    parts: SmallVec<[(&'m IntentMap, u64, u64); 8]>,
}

impl<'m> RegionHolds<'m> {
    fn new<D: BlockDevice>(map: &'m VolumeMap<D>, geo: &Geometry, runs: &[ChunkRun]) -> RegionHolds<'m> {
        let mut parts = SmallVec::new();
        let mut last = None;
        for run in runs {
            if last == Some((run.segment, run.row)) {
                continue;
            }
            last = Some((run.segment, run.row));
            for m in &map.segments[run.segment].members {
                let first = m.start_block + geo.member_block(run.row, 0);
                m.drive.intent.hold(first, geo.chunk_blocks);
                parts.push((&m.drive.intent, first, geo.chunk_blocks));
            }
        }
        RegionHolds { parts }
    }
}

impl Drop for RegionHolds<'_> {
    fn drop(&mut self) {
        for (intent, first, blocks) in &self.parts {
            intent.release(*first, *blocks);
        }
    }
}

impl<D: BlockDevice> std::fmt::Debug for Volume<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Volume").field("name", &self.name).field("layout", &self.geo.layout).finish()
    }
}

impl<'a, F: Sync, D: BlockDevice> InFamily<'a, F, D>
where
    Self: LayoutFamily<D>,
{
    /// [`Volume::read`].
    async fn read_in(&self, offset_bytes: u64, len_bytes: usize) -> Result<IoBuf, VolumeError> {
        self.read_span_in(offset_bytes, len_bytes, None, None).await
    }

    /// [`Volume::read_with_crcs`] (whole blocks: the caller checked).
    async fn read_with_crcs_in(
        &self,
        offset_bytes: u64,
        buf: IoBuf,
    ) -> Result<(IoBuf, Vec<u32>), VolumeError> {
        let mut crcs = vec![0u32; buf.len() / BLOCK_USIZE];
        let buf = self.read_span_in(offset_bytes, buf.len(), Some(buf), Some(&mut crcs)).await?;
        Ok((buf, crcs))
    }

    /// Reads `len_bytes` at `offset_bytes`, into `into` if given (a whole-block range of
    /// exactly its length) or a new buffer; with `crcs`, a whole-block range whose blocks'
    /// checksums are set too.
    async fn read_span_in(
        &self,
        offset_bytes: u64,
        len_bytes: usize,
        into: Option<IoBuf>,
        crcs: Option<&mut [u32]>,
    ) -> Result<IoBuf, VolumeError> {
        // Reads hold a pass too: a read that finds a bad block rewrites it.
        let _op = self.enter_op()?;
        let map = self.map.load_full();
        self.check_range_in(&map, offset_bytes, len_bytes as u64)?;
        self.counters.read_ops.fetch_add(1, Relaxed);
        self.counters.read_bytes.fetch_add(len_bytes as u64, Relaxed);
        if len_bytes == 0 {
            return Ok(into.unwrap_or_else(|| IoBuf::zeroed(0)));
        }
        let span = Span::new(offset_bytes, len_bytes as u64);
        // Not zeroed: a drive's verified read fills every byte or fails (unwritten blocks are
        // zeroed by the drive), and the locked path overwrites what it returns in a spare
        // buffer (`LayoutFamily::read_locked`). Clearing it first cost a memset per read (2 MiB
        // per batch the tier's GC reads). Debug builds poison such buffers, so a test that
        // reads back data would see a byte left unwritten.
        let buf = match into {
            Some(buf) => {
                debug_assert!(
                    span.is_aligned() && buf.len() == len_bytes,
                    "volume {}: a read into a buffer of {} bytes covers {len_bytes} bytes at {offset_bytes}",
                    self.name,
                    buf.len()
                );
                buf
            }
            None => IoBuf::for_overwrite(span.whole_len()),
        };
        let buf = self.read_blocks_in(&map, span.first, buf, false, crcs).await?;
        Ok(span.clip(buf))
    }

    /// Reads whole blocks from logical block `lb` into `buf`. With `locked`, the caller already
    /// holds the stripe locks of the range (the slow path must not take them again).
    async fn read_blocks(&self, lb: u64, buf: IoBuf, locked: bool) -> Result<IoBuf, VolumeError> {
        let map = self.map.load_full();
        self.read_blocks_in(&map, lb, buf, locked, None).await
    }

    /// Reads whole blocks; with `crcs` (one per block) also says each block's checksum.
    async fn read_blocks_in(
        &self,
        map: &VolumeMap<D>,
        lb: u64,
        buf: IoBuf,
        locked: bool,
        crcs: Option<&mut [u32]>,
    ) -> Result<IoBuf, VolumeError> {
        let blocks = buf.len() as u64 / BLOCK_BYTES;
        // Small requests lie in one chunk: no run list to allocate.
        if let Some(run) = map.single_run(&self.geo, lb, blocks) {
            return self.read_run(map, run, buf, locked, crcs).await;
        }
        let runs = map.runs(&self.geo, lb, blocks);
        let mut rest = buf;
        let mut rest_crcs = crcs;
        let mut reads = Vec::with_capacity(runs.len());
        for run in runs {
            let tail = rest.split_off((run.blocks * BLOCK_BYTES) as usize);
            let piece = std::mem::replace(&mut rest, tail);
            let piece_crcs = rest_crcs.take().map(|c| {
                let (head, tail) = c.split_at_mut(run.blocks as usize);
                rest_crcs = Some(tail);
                head
            });
            reads.push(self.read_run(map, run, piece, locked, piece_crcs));
        }
        Ok(IoBuf::join_or_copy(join_all_ok(reads).await?))
    }

    /// Reads one run into `buf` (whole blocks): one verified drive read from the family's fast
    /// source; a missing member or a bad block goes to the locked path, which repairs. With
    /// `locked`, the caller holds the run's stripe lock (the slow path must not take it again).
    async fn read_run(
        &self,
        map: &VolumeMap<D>,
        run: ChunkRun,
        buf: IoBuf,
        locked: bool,
        mut crcs: Option<&mut [u32]>,
    ) -> Result<IoBuf, VolumeError> {
        let mut spare = Some(buf);
        if let Some((member, block)) = self.fast_source(&map.segments[run.segment], &run) {
            let buf = spare.take().expect("not taken yet");
            let read = match crcs.as_deref_mut() {
                // The checksums the drive verified the blocks against: not computed again.
                Some(out) => member.drive.read_verified_crcs(block, buf, out).await,
                None => member.drive.read_verified(block, buf).await,
            };
            match read {
                Ok(buf) => return Ok(buf),
                Err(ReadFault::Io(e)) => {
                    tracing::warn!(volume = %self.name, error = %e, "read error; repairing")
                }
                Err(ReadFault::Failed | ReadFault::Corrupt { .. }) => {}
            }
        }
        let buf = if locked {
            self.read_locked(map, run, spare).await?
        } else {
            let _guard = self.locks.lock([(run.segment, run.row)]).await;
            // The locked path may repair: where the members are now (see `write_in`).
            self.read_locked(&self.map.load_full(), run, spare).await?
        };
        // The slow path (a repair or a reconstruction) computes them from what it returns.
        if let Some(out) = crcs {
            for (c, b) in out.iter_mut().zip(buf.chunks_exact(BLOCK_USIZE)) {
                *c = stria_dev::block_crc(b);
            }
        }
        Ok(buf)
    }

    /// [`Volume::write`].
    async fn write_in(
        &self,
        offset_bytes: u64,
        data: IoBytes,
        crcs: Option<&[u32]>,
        fua: bool,
    ) -> Result<(), VolumeError> {
        let _op = self.enter_op()?;
        let len_bytes = data.len() as u64;
        self.check_range(offset_bytes, len_bytes)?;
        self.host.check_writable().map_err(|e| self.pool_error(e))?;
        self.counters.write_ops.fetch_add(1, Relaxed);
        self.counters.write_bytes.fetch_add(len_bytes, Relaxed);
        if len_bytes == 0 {
            return Ok(());
        }
        let span = Span::new(offset_bytes, len_bytes);
        // Checksums carried in are for the blocks as given: only an aligned write keeps them.
        let crcs = crcs.filter(|_| span.is_aligned() && data.is_aligned());
        self.write_span_locked(&span, crcs, fua, |_map| async {
            // An aligned range in unaligned memory goes through the merge too: it reads nothing
            // and only copies.
            if span.is_aligned() && data.is_aligned() {
                Ok(data)
            } else {
                bytes::merge_unaligned(&span, &data, |b| {
                    self.read_blocks(b, IoBuf::zeroed(BLOCK_USIZE), true)
                })
                .await
            }
        })
        .await
    }

    /// Writes the whole blocks of `span` while holding the stripe locks of their rows: `data`
    /// makes them from the volume's map as it is under the locks (an `Err` writes nothing). The
    /// one sequence of a write and a compare and write.
    async fn write_span_locked<Fut>(
        &self,
        span: &Span,
        crcs: Option<&[u32]>,
        fua: bool,
        data: impl FnOnce(Arc<VolumeMap<D>>) -> Fut,
    ) -> Result<(), VolumeError>
    where
        Fut: Future<Output = Result<IoBytes, VolumeError>>,
    {
        let mut map = self.map.load_full();
        let runs = map.runs(&self.geo, span.first, span.blocks());
        // On ec, a FUA write completes with a pool flush instead of per-drive FUA: the flush
        // raises the transaction watermark past every older journaled write to these stripes,
        // so recovery can never replay one over this (durable) write.
        let by_pool_flush = self.fua_by_pool_flush();
        let holds = {
            let _guards = self.locks.lock(runs.iter().map(|r| (r.segment, r.row))).await;
            // Members may have moved while this waited (a move ends under every stripe lock):
            // write where they are now. Runs do not change (segments only ever get appended).
            // (A guard, not a second reference count update, when nothing changed.)
            if !Arc::ptr_eq(&map, &*self.map.load()) {
                map = self.map.load_full();
            }
            let data = data(Arc::clone(&map)).await?;
            Volume::<D>::check_runs_cover(&runs, data.len());
            let holds = RegionHolds::new(&map, &self.geo, &runs);
            self.write_runs_locked(&map, &runs, data, crcs, fua && !by_pool_flush).await?;
            holds
        };
        self.confirm_skipped(&map, &runs).await?;
        drop(holds);
        if fua && by_pool_flush {
            self.flush_members().await?;
        }
        Ok(())
    }

    /// [`Volume::write_zeroes`].
    async fn write_zeroes_in(
        &self,
        offset_bytes: u64,
        len_bytes: u64,
        fua: bool,
        fast_only: bool,
    ) -> Result<(), VolumeError> {
        let _op = self.enter_op()?;
        self.check_range(offset_bytes, len_bytes)?;
        if len_bytes == 0 {
            return Ok(());
        }
        let split = ZeroSplit::new(offset_bytes, len_bytes, self.unmap_unit_blocks() * BLOCK_BYTES);
        let not_healthy = self.cheap_zero_needs_healthy() && self.state_in(None) != VolumeState::Healthy;
        if fast_only && (split.has_slow_part() || not_healthy) {
            return Err(VolumeError::NotCheap { offset_bytes, len_bytes });
        }
        // Cheap middle: mark unwritten under the stripe locks.
        let cheap = split.cheap_blocks();
        if let Some((lb, blocks)) = cheap {
            self.unmap_blocks(lb, blocks).await?;
        }
        for edge in [split.head, split.tail] {
            let mut at = edge.start;
            while at < edge.end {
                let n = (edge.end - at).min(4 << 20);
                self.write_in(at, IoBytes::zeroed(n as usize), None, fua).await?;
                at += n;
            }
        }
        if fua && cheap.is_some() {
            self.flush().await?;
        }
        Ok(())
    }

    /// [`Volume::trim`].
    async fn trim_in(&self, offset_bytes: u64, len_bytes: u64) -> Result<(), VolumeError> {
        let _op = self.enter_op()?;
        self.check_range(offset_bytes, len_bytes)?;
        let unit_bytes = self.unmap_unit_blocks() * BLOCK_BYTES;
        if let Some((lb, blocks)) = ZeroSplit::new(offset_bytes, len_bytes, unit_bytes).cheap_blocks() {
            self.unmap_blocks(lb, blocks).await?;
        }
        Ok(())
    }

    /// Marks whole units (blocks on mirror layouts, stripes on ec) unwritten on every member.
    async fn unmap_blocks(&self, lb: u64, blocks: u64) -> Result<(), VolumeError> {
        let unit = self.unmap_unit_blocks();
        assert!(
            lb.is_multiple_of(unit) && blocks.is_multiple_of(unit),
            "invariant: unmap_blocks gets whole units of {unit} blocks (on ec a partial row would zero \
             parity under live data); got {blocks} blocks at block {lb}"
        );
        let map = self.map.load_full();
        // Bound the number of locks held at once.
        let step = (self.geo.row_blocks() * 256).max(1);
        let mut at = lb;
        while at < lb + blocks {
            let n = (lb + blocks - at).min(step);
            let runs = map.runs(&self.geo, at, n);
            let _guards = self.locks.lock(runs.iter().map(|r| (r.segment, r.row))).await;
            self.host.check_writable().map_err(|e| self.pool_error(e))?;
            let map = self.map.load_full(); // as in `write_in`
            let _holds = RegionHolds::new(&map, &self.geo, &runs);
            for run in &runs {
                self.unmap_run(&map, run).await?;
            }
            self.confirm_skipped(&map, &runs).await?;
            at += n;
        }
        Ok(())
    }

    /// [`Volume::block_status`].
    async fn block_status_in(&self, offset_bytes: u64, len_bytes: u64) -> Result<Vec<Extent>, VolumeError> {
        // A pass like a read: an extent move frees the old place of a member only once no
        // request that could still look at it is left (pool/gate.rs, grace periods).
        let _op = self.enter_op()?;
        self.check_range(offset_bytes, len_bytes)?;
        if len_bytes == 0 {
            return Ok(Vec::new());
        }
        let span = Span::new(offset_bytes, len_bytes);
        let mut out = ExtentRuns::new();
        let map = self.map.load();
        for run in map.runs(&self.geo, span.first, span.blocks()) {
            let members = self.status_members(&map.segments[run.segment], &run);
            let block = self.geo.member_block(run.row, run.offset_in_chunk);
            for i in 0..run.blocks {
                let mut unallocated = !members.is_empty();
                for m in &members {
                    unallocated = unallocated && m.drive.is_unwritten(m.start_block + block + i, 1).await;
                }
                out.push(unallocated, 1);
            }
        }
        Ok(out.finish(&span))
    }

    /// [`Volume::state`], as it would be if the drive in `also_failed` failed too.
    fn state_in(&self, also_failed: Option<u32>) -> VolumeState {
        let map = self.map.load();
        let tolerance = self.geo.layout.tolerance();
        let mut state = VolumeState::Healthy;
        for seg in &map.segments {
            for group in self.failure_groups(seg.members.len()) {
                let out = |m: usize| {
                    let d = &seg.members[m].drive;
                    d.is_failed() || also_failed == Some(d.slot())
                };
                let failed = group.iter().filter(|&&m| out(m)).count() as u32;
                let rebuilding =
                    group.iter().filter(|&&m| !out(m) && seg.members[m].rebuilding()).count() as u32;
                if failed + rebuilding > tolerance {
                    // A rebuild onto a new member can still finish only if enough members survive.
                    return VolumeState::Failed;
                }
                if rebuilding > 0 {
                    state = VolumeState::Rebuilding;
                } else if failed > 0 && state == VolumeState::Healthy {
                    state = VolumeState::Degraded;
                }
            }
        }
        state
    }
}

impl<D: BlockDevice> Volume<D> {
    /// The volume's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Pool-unique id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Size in bytes.
    pub fn size_bytes(&self) -> u64 {
        self.map.load().total_blocks * BLOCK_BYTES
    }

    /// Layout.
    pub fn layout(&self) -> Layout {
        self.geo.layout
    }

    /// Drive class the volume lives on.
    pub fn class(&self) -> DriveClass {
        self.class
    }

    /// Chunk (stripe height) in bytes.
    pub fn chunk_bytes(&self) -> u64 {
        self.geo.chunk_blocks * BLOCK_BYTES
    }

    /// Bytes of data in one full row (stripe): the natural unit of a full-stripe write.
    pub fn row_bytes(&self) -> u64 {
        self.geo.row_blocks() * BLOCK_BYTES
    }

    /// Host-side counters.
    pub fn counters(&self) -> &VolumeCounters {
        &self.counters
    }

    /// A pass of the pool's operation gate for one request (see pool/gate.rs): a clean close
    /// waits for every request holding one.
    pub(crate) fn enter_op(&self) -> Result<crate::gate::OpPass<'_>, VolumeError> {
        match self.host.enter() {
            Some(pass) if !self.closed.load(SeqCst) => Ok(pass),
            _ => Err(VolumeError::Closed(self.name.clone())),
        }
    }

    fn check_range(&self, offset_bytes: u64, len_bytes: u64) -> Result<(), VolumeError> {
        self.check_range_in(&self.map.load(), offset_bytes, len_bytes)
    }

    /// [`Volume::check_range`] against a map the caller already loaded (one `ArcSwap` load per
    /// request instead of two on the I/O paths).
    fn check_range_in(
        &self,
        map: &VolumeMap<D>,
        offset_bytes: u64,
        len_bytes: u64,
    ) -> Result<(), VolumeError> {
        if self.closed.load(SeqCst) {
            return Err(VolumeError::Closed(self.name.clone()));
        }
        bytes::check_range(offset_bytes, len_bytes, map.total_blocks * BLOCK_BYTES)
    }

    pub(crate) fn unrecoverable(&self, run: &ChunkRun, reason: impl Into<String>) -> VolumeError {
        let map = self.map.load();
        let lb = map.segments[run.segment].first_block
            + run.row * self.geo.row_blocks()
            + u64::from(run.column) * self.geo.chunk_blocks
            + run.offset_in_chunk;
        VolumeError::Unrecoverable {
            volume: self.name.clone(),
            offset_bytes: lb * BLOCK_BYTES,
            len_bytes: run.blocks * BLOCK_BYTES,
            reason: reason.into(),
        }
    }

    /// [`Volume::unrecoverable`] for the blocks of `run` that `lost` marks (one flag per block):
    /// the error names the first to the last of them, not the whole run, and how many they are
    /// when readable ones lie between.
    pub(crate) fn unrecoverable_blocks(&self, run: &ChunkRun, lost: &[bool], reason: &str) -> VolumeError {
        debug_assert_eq!(lost.len() as u64, run.blocks, "one flag per block of the run");
        let first = lost.iter().position(|&l| l).unwrap_or(0);
        let last = lost.iter().rposition(|&l| l).unwrap_or(lost.len().saturating_sub(1));
        let span = (last + 1 - first) as u64;
        let count = lost.iter().filter(|&&l| l).count() as u64;
        let narrowed = ChunkRun { offset_in_chunk: run.offset_in_chunk + first as u64, blocks: span, ..*run };
        if count == span {
            self.unrecoverable(&narrowed, reason)
        } else {
            self.unrecoverable(&narrowed, format!("{reason} ({count} of these {span} blocks of 4 KiB)"))
        }
    }

    /// Reads `len_bytes` at `offset_bytes` (any alignment).
    pub async fn read(&self, offset_bytes: u64, len_bytes: usize) -> Result<IoBuf, VolumeError> {
        with_family!(self, |f| f.read_in(offset_bytes, len_bytes).await)
    }

    /// [`Volume::read`] of whole blocks that also returns each block's checksum
    /// (`stria_dev::block_crc`) as the drive verified it, so a caller that checks the data
    /// against checksums of its own (the tier's map) need not compute them again.
    pub async fn read_with_crcs(
        &self,
        offset_bytes: u64,
        len_bytes: usize,
    ) -> Result<(IoBuf, Vec<u32>), VolumeError> {
        self.read_with_crcs_into(offset_bytes, IoBuf::for_overwrite(len_bytes)).await
    }

    /// [`Volume::read_with_crcs`] into `buf` (whole blocks, `buf.len()` bytes): a caller that
    /// gathers several reads into one buffer (the tier's destage batch) reads each into its
    /// piece instead of copying it there. The buffer returned is `buf`, unless the read had to
    /// rebuild the data elsewhere (a repair or a reconstruction: then one of its own); a failed
    /// read drops `buf`.
    pub async fn read_with_crcs_into(
        &self,
        offset_bytes: u64,
        buf: IoBuf,
    ) -> Result<(IoBuf, Vec<u32>), VolumeError> {
        assert!(
            offset_bytes.is_multiple_of(BLOCK_BYTES) && (buf.len() as u64).is_multiple_of(BLOCK_BYTES),
            "volume {}: a read returning checksums covers whole blocks ({} bytes at {offset_bytes})",
            self.name,
            buf.len()
        );
        with_family!(self, |f| f.read_with_crcs_in(offset_bytes, buf).await)
    }

    /// Writes `data` at `offset_bytes` (any alignment). With `fua` the data is durable when
    /// this returns.
    pub async fn write(&self, offset_bytes: u64, data: IoBytes, fua: bool) -> Result<(), VolumeError> {
        with_family!(self, |f| f.write_in(offset_bytes, data, None, fua).await)
    }

    /// [`Volume::write`] of whole blocks whose checksums the caller has already computed
    /// (`crcs[i]` is `stria_dev::block_crc` of block `i` of `data`): the members store them
    /// instead of computing them again for each copy, so a block's CRC is computed once where
    /// it enters (the tier's cache and segment writes). Debug builds check every one.
    pub async fn write_with_crcs(
        &self,
        offset_bytes: u64,
        data: IoBytes,
        crcs: &[u32],
        fua: bool,
    ) -> Result<(), VolumeError> {
        assert!(
            offset_bytes.is_multiple_of(BLOCK_BYTES) && data.len() as u64 == crcs.len() as u64 * BLOCK_BYTES,
            "volume {}: a write carrying checksums covers whole blocks, one checksum each ({} bytes at {offset_bytes}, {} checksums)",
            self.name,
            data.len(),
            crcs.len()
        );
        with_family!(self, |f| f.write_in(offset_bytes, data, Some(crcs), fua).await)
    }

    /// Before a write that skipped failed members is acknowledged, their failure must be in the
    /// committed metadata (otherwise, after a restart, a drive still called active would serve
    /// data that misses this write). Cheap unless a failure is being committed right now.
    pub(crate) async fn confirm_skipped(
        &self,
        map: &VolumeMap<D>,
        runs: &[ChunkRun],
    ) -> Result<(), VolumeError> {
        let mut last_segment = usize::MAX;
        for run in runs {
            if run.segment == last_segment {
                continue;
            }
            last_segment = run.segment;
            for m in &map.segments[run.segment].members {
                if m.drive.is_failed() && !self.host.failure_committed(m.drive.slot()) {
                    self.fail_drive(&m.drive, "failed while a write was skipping it".into()).await?;
                }
            }
        }
        self.host.check_writable().map_err(|e| self.pool_error(e))
    }

    fn pool_error(&self, e: crate::error::EngineError) -> VolumeError {
        VolumeError::Pool { volume: self.name.clone(), source: Box::new(e) }
    }

    /// Writes zeros. Whole blocks (mirror layouts) or whole stripes (ec) are zeroed by marking
    /// them unwritten, without writing data; anything else is written as zeros unless
    /// `fast_only`, which fails with [`VolumeError::NotCheap`] instead.
    pub async fn write_zeroes(
        &self,
        offset_bytes: u64,
        len_bytes: u64,
        fua: bool,
        fast_only: bool,
    ) -> Result<(), VolumeError> {
        with_family!(self, |f| f.write_zeroes_in(offset_bytes, len_bytes, fua, fast_only).await)
    }

    /// Discards a range: whole blocks (mirror) or whole stripes (ec) are unmapped and read back
    /// as zeros; partial edges are left as they are (NBD allows a trim to do nothing).
    pub async fn trim(&self, offset_bytes: u64, len_bytes: u64) -> Result<(), VolumeError> {
        with_family!(self, |f| f.trim_in(offset_bytes, len_bytes).await)
    }

    /// Stops the process unless `data_len` is exactly the bytes of `runs` (what
    /// `write_runs_locked` slices the data by): otherwise blocks would be written with another
    /// block's data, or not at all.
    fn check_runs_cover(runs: &[ChunkRun], data_len: usize) {
        let blocks: u64 = runs.iter().map(|r| r.blocks).sum();
        assert_eq!(
            data_len as u64,
            blocks * BLOCK_BYTES,
            "invariant: write_runs_locked gets exactly the bytes of its runs ({blocks} blocks)"
        );
    }

    /// Marks `blocks` on the members of `run` unwritten (the caller holds the run's stripe
    /// lock). Failed members are skipped; a member whose intent bitmap cannot be written is
    /// failed (persisted).
    pub(crate) async fn zero_members(
        &self,
        seg: &map::Segment<D>,
        run: &ChunkRun,
        members: impl IntoIterator<Item = usize>,
    ) -> Result<(), VolumeError> {
        let block_in_member = self.geo.member_block(run.row, run.offset_in_chunk);
        for m in members {
            let member = &seg.members[m];
            if member.drive.is_failed() {
                continue;
            }
            if let Err(e) = member.drive.zero(member.start_block + block_in_member, run.blocks).await {
                self.drive_error(&member.drive, "intent bitmap write failed", &e).await?;
            }
        }
        Ok(())
    }

    /// Allocation map of a range, in extents of equal state.
    pub async fn block_status(&self, offset_bytes: u64, len_bytes: u64) -> Result<Vec<Extent>, VolumeError> {
        with_family!(self, |f| f.block_status_in(offset_bytes, len_bytes).await)
    }

    /// Makes every write completed before this call durable.
    pub async fn flush(&self) -> Result<(), VolumeError> {
        let _op = self.enter_op()?;
        self.counters.flush_ops.fetch_add(1, Relaxed);
        self.host.check_writable().map_err(|e| self.pool_error(e))?;
        self.flush_members().await?;
        // Failed members were left out of the flush (and their failure is committed, see
        // `PoolCore::flush_drives`): the volume must still hold its data.
        if self.state() == VolumeState::Failed {
            return Err(VolumeError::Unrecoverable {
                volume: self.name.clone(),
                offset_bytes: 0,
                len_bytes: self.size_bytes(),
                reason: "more members failed than the layout tolerates; the flush cannot make data durable"
                    .into(),
            });
        }
        Ok(())
    }

    /// Flushes the drives holding the volume's members, nothing else. The destination of a
    /// member being moved needs no flush here: it is never read before the move's switch, which
    /// flushes the whole pool first (pool/moves.rs).
    async fn flush_members(&self) -> Result<(), VolumeError> {
        let slots = self.member_slots();
        self.host.flush_members(self.id, &slots).await.map_err(|e| self.pool_error(e))
    }

    /// The drive slots of the volume's members, sorted, each once.
    pub(crate) fn member_slots(&self) -> Vec<u32> {
        let map = self.map.load();
        let mut slots: Vec<u32> =
            map.segments.iter().flat_map(|s| s.members.iter().map(|m| m.drive.slot())).collect();
        slots.sort_unstable();
        slots.dedup();
        slots
    }

    /// Where the block holding byte `offset_bytes` lives: every copy (mirror layouts), or the
    /// data block and the parity blocks of its row (ec). For diagnostics and fault tests.
    pub fn locate(&self, offset_bytes: u64) -> Result<Vec<BlockLocation>, VolumeError> {
        self.check_range(offset_bytes, 1)?;
        let map = self.map.load();
        let run = map.runs(&self.geo, offset_bytes / BLOCK_BYTES, 1)[0];
        let seg = &map.segments[run.segment];
        let block = self.geo.member_block(run.row, run.offset_in_chunk);
        let at = |m: usize, role| {
            let member = &seg.members[m];
            BlockLocation {
                slot: member.drive.slot(),
                device_offset_bytes: member.drive.superblock().layout.data_offset_bytes
                    + (member.start_block + block) * BLOCK_BYTES,
                role,
            }
        };
        let members = with_family!(self, |f| f.locate_members(&run));
        Ok(members.into_iter().map(|(m, role)| at(m, role)).collect())
    }

    /// Current health, from the state of the members.
    pub fn state(&self) -> VolumeState {
        with_family!(self, |f| f.state_in(None))
    }

    /// The health the volume would have if the drive in `slot` failed as well (what `drive
    /// fail` and `drive replace` check before they act).
    pub fn state_if_failed(&self, slot: u32) -> VolumeState {
        with_family!(self, |f| f.state_in(Some(slot)))
    }

    /// True when a member of the volume is on the drive in `slot`.
    pub fn uses_drive(&self, slot: u32) -> bool {
        self.map.load().segments.iter().any(|s| s.members.iter().any(|m| m.drive.slot() == slot))
    }

    /// Fails `drive` after an error (persisting it) before the request that saw it completes.
    pub(crate) async fn fail_drive(&self, drive: &Arc<Drive<D>>, reason: String) -> Result<(), VolumeError> {
        if drive.is_retired() {
            // Failed and committed long ago; its slot now holds the drive back from that
            // outage, which this request's map predates (pool/resync.rs).
            return Ok(());
        }
        self.host.fail_member(drive.slot(), drive.incarnation(), reason).await.map_err(|e| self.pool_error(e))
    }

    /// Handles an I/O error of `drive` met by `what`: a full host filesystem suspends the pool's
    /// writes and fails the request (the drive is not to blame; see pool/suspend.rs); any other
    /// error fails the drive (persisted) and lets the request go on without it.
    pub(crate) async fn drive_error(
        &self,
        drive: &Arc<Drive<D>>,
        what: &str,
        e: &stria_dev::DevError,
    ) -> Result<(), VolumeError> {
        if drive.is_retired() {
            return Ok(()); // as in `fail_drive`
        }
        self.host
            .member_error(drive.slot(), drive.incarnation(), what, e)
            .await
            .map_err(|e| self.pool_error(e))
    }

    /// Counts and logs `blocks` blocks at `drive_block` of `drive` rewritten from redundancy.
    pub(crate) fn note_repair(&self, drive: &Drive<D>, drive_block: u64, blocks: u64) {
        tracing::warn!(
            volume = %self.name,
            drive = drive.slot(),
            drive_offset_bytes = drive.superblock().layout.data_offset_bytes + drive_block * BLOCK_BYTES,
            bytes = blocks * BLOCK_BYTES,
            "repaired a bad range from redundancy"
        );
        drive.record_repairs(blocks);
        self.counters.repaired_blocks.fetch_add(blocks, Relaxed);
    }
}
