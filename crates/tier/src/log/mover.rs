//! The mover of a log-structured volume: destage (cached blocks -> whole stripes of the host
//! segment) and GC (live blocks of the emptiest sealed segment -> whole stripes of the GC
//! segment), one batch at a time, in one task.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Weak};
use std::time::Duration;

use stria_dev::{BLOCK_BYTES, BLOCK_USIZE, BlockDevice, IoBuf, IoBytes};
use stria_engine::{EngineError, VolumeError};

use super::LogVolume;
use super::space::{SegState, Stream, SummaryEntry, decode_summary, encode_summary};
use crate::block_crc;
use crate::map::{MapEntry, Place, Update};

/// A segment space that could not grow or shrink tries again after this long (each try takes
/// the pool's metadata lock).
const RESIZE_RETRY: Duration = Duration::from_secs(1);

/// Compaction waits for this long without host writes, TRIMs or zeroing: a large TRIM (fstrim
/// of a file system) arrives as many requests, and moving blocks the next ones discard is waste.
const COMPACT_QUIET_MS: u64 = 1000;

/// How GC picks its next victim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pick {
    /// The emptiest sealed segment with at least a batch of garbage.
    Garbage,
    /// Space is critical: the emptiest with any garbage.
    Critical,
    /// Compaction towards the given target ([`super::space::Space::compaction_victim`]).
    Compact(usize),
}

/// A block on its way to a new place: where it is, its map entry there, its data.
pub(crate) struct Move {
    block: u64,
    from: Place,
    entry: MapEntry,
    data: IoBytes,
}

/// GC's progress through its victim, and blocks read but not yet written.
#[derive(Default)]
pub(crate) struct Gc {
    victim: Option<(usize, u64)>,
    /// The victim's use (see [`super::space::Space::opened`]) and whether every summary read
    /// from it so far was valid.
    victim_use: u64,
    victim_clean: bool,
    /// Victims read to their end with every summary valid, until their moves are resolved:
    /// then no map entry points into them, and a count left is an overcount to forget.
    drained: Vec<(usize, u64)>,
    /// Victims read to their end that could not be forgotten (a summary was not valid): with
    /// counts that may be too high, not chosen again until they are freed or the counts are
    /// rebuilt, or GC would read them over and over while destage starves.
    fruitless: std::collections::HashSet<usize>,
    carry: Vec<Move>,
    /// Sealed segments with a batch that could not be read: not chosen again while sealed (a
    /// batch never written in this volume's life may hold an old volume's rows, which a
    /// degraded read cannot reconstruct; its live blocks, if any, stay readable one by one).
    unreadable: std::collections::HashSet<usize>,
    /// When a shrink last failed (tried again after [`RESIZE_RETRY`]).
    shrink_failed: Option<std::time::Instant>,
}

/// The "space is full" warning of one volume's mover, rate-limited.
#[derive(Default)]
struct FullWarning {
    /// When it was last logged, and how many times it was due since.
    last: Option<std::time::Instant>,
    suppressed: u64,
}

impl FullWarning {
    fn warn(&mut self, volume: &str, e: &VolumeError) {
        match self.last {
            Some(at) if at.elapsed() < FULL_WARNING_INTERVAL => self.suppressed += 1,
            _ => {
                tracing::warn!(
                    volume,
                    retries_since_last_warning = self.suppressed,
                    "writes that need new space fail with ENOSPC: {e}"
                );
                self.last = Some(std::time::Instant::now());
                self.suppressed = 0;
            }
        }
    }

    /// The mover made progress (or has nothing to do): the space is no longer full.
    fn ended(&mut self, volume: &str) {
        if self.last.take().is_some() {
            tracing::info!(volume, "space available again: writes that need new space are accepted");
            self.suppressed = 0;
        }
    }
}

pub(crate) fn spawn<D: BlockDevice>(vol: &Arc<LogVolume<D>>) {
    tokio::spawn(run(Arc::downgrade(vol)));
}

/// While the space stays full, the warning that says so (and what frees space) is logged at
/// most once per this interval; the retries in between are counted in the next one.
const FULL_WARNING_INTERVAL: Duration = Duration::from_secs(60);

async fn run<D: BlockDevice>(vol: Weak<LogVolume<D>>) {
    let mut draining = false;
    let mut full = FullWarning::default();
    loop {
        let Some(v) = vol.upgrade() else { return };
        if v.closed.load(Relaxed) || v.failure.lock().is_some() {
            return;
        }
        let result = {
            let mut gc = v.moving.lock().await;
            if v.closed.load(Relaxed) {
                return;
            }
            v.step(&mut gc, &mut draining).await
        };
        // TRIM, deletes and GC free segments: once a host batch would find room, the volume
        // is no longer full (writes that need new space are taken again).
        if v.no_space.lock().is_some() && v.space.lock().has_batch(Stream::Host) {
            *v.no_space.lock() = None;
        }
        if v.no_space.lock().is_none() {
            full.ended(v.name());
        }
        let pause = match result {
            Ok(true) => {
                v.ring.clear_failure();
                continue;
            }
            // Nothing to do: wait for a writer that needs space, or look again soon.
            Ok(false) => Duration::from_millis(50),
            Err(e) => {
                let no_space = e.kind() == stria_engine::ErrorKind::NoSpace;
                if no_space {
                    full.warn(v.name(), &e);
                } else {
                    tracing::error!(volume = %v.name(), error = %e, "destage or GC failed; retrying");
                }
                v.ring.fail_waiters(e.to_string());
                Duration::from_millis(if no_space { 50 } else { 1000 })
            }
        };
        // Holding `v` for at most one short wait: the loop still ends soon after the last
        // other reference is dropped.
        tokio::select! {
            () = v.ring.hungry.notified() => {}
            () = tokio::time::sleep(pause) => {}
        }
    }
}

/// Runs the map's checkpoints in their own task, so writers do not wait for one (they only wake
/// it; docs/design/log-structured-volumes.md, "Checkpoints that do not stop writers").
pub(crate) fn spawn_checkpoints<D: BlockDevice>(vol: &Arc<LogVolume<D>>) {
    vol.map.checkpoint_in_background();
    tokio::spawn(checkpoints(Arc::downgrade(vol)));
}

async fn checkpoints<D: BlockDevice>(vol: Weak<LogVolume<D>>) {
    loop {
        let Some(v) = vol.upgrade() else { return };
        if v.closed.load(Relaxed) || v.failure.lock().is_some() {
            return;
        }
        let pause = match v.map.checkpoint_if_due().await {
            Ok(true) => continue,
            Ok(false) => Duration::from_millis(100),
            Err(e) => {
                tracing::warn!(volume = %v.name(), error = %e, "map checkpoint failed; retrying");
                Duration::from_millis(1000)
            }
        };
        // As in the mover: `v` is held for at most one short wait.
        tokio::select! {
            () = v.map.checkpoint_wanted() => {}
            () = tokio::time::sleep(pause) => {}
        }
    }
}

impl<D: BlockDevice> LogVolume<D> {
    /// One step of the mover: GC when free segments run low and GC can gain space, else
    /// destage when the cache asks for it. Returns whether it did anything.
    async fn step(&self, gc: &mut Gc, draining: &mut bool) -> Result<bool, VolumeError> {
        if self.params().hold && self.ring.waiting() == 0 {
            return Ok(false);
        }
        if self.gc_wanted(gc).await? {
            return Ok(true);
        }
        let p = self.params();
        let ring = self.ring.ring_blocks();
        let used = self.ring.used();
        let live = self.ring.live();
        let batch = self.geo.batch_data();
        let waiting = self.ring.waiting() > 0;
        let above = |pct: u8| used * 100 > u64::from(pct) * ring;
        if waiting || above(p.start_percent) || (*draining && above(p.stop_percent)) {
            *draining = true;
            // A short batch only when writers wait and the cache holds less than a batch of
            // movable blocks (padding costs capacity writes): the rest of the ring is in flight
            // or holes behind an old block at the tail, and a waiting writer (pieces of up to
            // half the ring) may need that old block moved before anything frees room for it.
            let pad = waiting && live < batch;
            return self.destage_batch(pad).await;
        }
        *draining = false;
        if p.always && live >= batch {
            return self.destage_batch(false).await;
        }
        // Idle: give segments back to the pool, or (when writes have been quiet for a while)
        // compact the space so that some can be.
        if self.shrink_space(gc).await {
            return Ok(true);
        }
        if !p.eager_compaction
            && self.now_ms().saturating_sub(self.last_write_ms.load(Relaxed)) < COMPACT_QUIET_MS
        {
            return Ok(false);
        }
        let target = {
            let mut space = self.space.lock();
            let target = space.compaction_target();
            if let Some(target) = target {
                space.seal_open_from(target);
            }
            target
        };
        match target {
            Some(target) => self.gc_step(gc, Pick::Compact(target)).await,
            None => Ok(false),
        }
    }

    /// Runs a GC step if free segments run low; returns whether it did anything. GC starts one
    /// segment above the host stream's floor (the reserve), so destage rarely waits for it, and
    /// no earlier: free segments held idle are over-provisioning lost to the steady state.
    async fn gc_wanted(&self, gc: &mut Gc) -> Result<bool, VolumeError> {
        let (mut free, reserve) = {
            let s = self.space.lock();
            (s.free(), s.reserve())
        };
        if free <= reserve && self.counts_suspect.load(Relaxed) {
            // Counts from a persisted table may be too high: with space critical, GC would chase
            // segments that only look full (and its own padded batches) while destage starves.
            self.recount().await?;
            free = self.space.lock().free();
        }
        if free <= reserve + 1 && self.space.lock().wants_growth() && self.grow_space().await {
            return Ok(true);
        }
        let pick = if free <= reserve { Pick::Critical } else { Pick::Garbage };
        Ok(free <= reserve + 1 && self.gc_step(gc, pick).await?)
    }

    /// Grows the segment space by an eighth (at least 4 segments, at most to `--space`; less
    /// when the pool has less room) in one engine resize that clears nothing: nothing points
    /// into the new segments, and every read of the space goes through the map. Returns whether
    /// it grew; why not is kept for the ENOSPC message (and tried again only after
    /// [`RESIZE_RETRY`]). The engine refuses a resize while the segment part rebuilds: until
    /// then the space cannot grow.
    pub(crate) async fn grow_space(&self) -> bool {
        let (have, most) = (self.space.lock().segments(), self.geo.segments);
        if have >= most {
            return false;
        }
        if self.growth_failed.lock().as_ref().is_some_and(|(_, at)| at.elapsed() < RESIZE_RETRY) {
            return false;
        }
        // An eighth, or as much as the pool still has room for.
        let mut add = self.space.lock().step().min(most - have);
        let grown = loop {
            match self.resize_space(have + add).await {
                Err(EngineError::NoSpace(_)) if add > 1 => add /= 2,
                done => break done,
            }
        };
        match grown {
            Ok(()) => {
                self.space.lock().grow(add);
                *self.growth_failed.lock() = None;
                tracing::info!(volume = %self.name, "the segment space grew to {} segments (at most {most})", have + add);
                true
            }
            Err(e) => {
                let why = e.to_string();
                let mut failed = self.growth_failed.lock();
                if failed.as_ref().is_none_or(|(w, _)| *w != why) {
                    tracing::warn!(volume = %self.name, "the segment space could not grow: {why}");
                }
                *failed = Some((why, std::time::Instant::now()));
                false
            }
        }
    }

    /// Gives the trailing free segments the space does not need back to the pool
    /// ([`super::space::Space::shrinkable`]) in one engine resize down: they leave the table
    /// first, so nothing opens them meanwhile, and come back if the resize fails. Returns
    /// whether it shrank. No map entry points into a free segment (docs/design/
    /// log-structured-volumes.md, "Step 3b, second part").
    pub(crate) async fn shrink_space(&self, gc: &mut Gc) -> bool {
        if gc.shrink_failed.is_some_and(|at| at.elapsed() < RESIZE_RETRY) {
            return false;
        }
        let (n, keep) = {
            let mut space = self.space.lock();
            let n = space.shrinkable();
            if n > 0 {
                space.give_back(n);
            }
            (n, space.segments())
        };
        if n == 0 {
            return false;
        }
        match self.resize_space(keep).await {
            Ok(()) => {
                gc.shrink_failed = None;
                self.counters.segments_given_back.fetch_add(n, Relaxed);
                tracing::info!(volume = %self.name, "gave {n} free segments back to the pool ({keep} left)");
                true
            }
            Err(e) => {
                self.space.lock().grow(n);
                gc.shrink_failed = Some(std::time::Instant::now());
                tracing::warn!(volume = %self.name, "could not give {n} free segments back to the pool: {e}");
                false
            }
        }
    }

    /// Resizes the engine volume under the space to `segments` segments (not zeroed: every
    /// read of the space goes through the map).
    async fn resize_space(&self, segments: u64) -> Result<(), EngineError> {
        let bytes = segments * self.geo.segment_blocks() * BLOCK_BYTES;
        if bytes > self.seg.size_bytes() {
            // New rows may be extents another volume gave back, with its stripes and checksums:
            // their checksum entries are cleared (1/1024 of the rows, metadata only), so a scrub
            // sees them as unwritten instead of as parity that disagrees.
            self.pool.resize_volume(self.seg.name(), bytes).await
        } else {
            self.pool.resize_volume_unzeroed(self.seg.name(), bytes).await
        }
    }

    /// Destages up to one batch of the oldest cached blocks; `pad` writes a short batch too
    /// (otherwise only full ones). Returns whether it wrote anything.
    pub(crate) async fn destage_batch(&self, pad: bool) -> Result<bool, VolumeError> {
        self.check_writable(0, self.size_bytes)?;
        let want = self.geo.batch_data() as usize;
        let mut moves: Vec<Move> = Vec::with_capacity(want);
        let mut scanned = 0;
        let mut stale = Vec::new();
        // Positions whose block has moved on (a newer write, being freed) are skipped.
        while moves.len() < want {
            let oldest = self.ring.oldest_live(scanned + want);
            if oldest.len() <= scanned {
                break;
            }
            // Entries of as many positions as could still fill the batch, read together.
            let chunk = &oldest[scanned..scanned + (want - moves.len()).min(oldest.len() - scanned)];
            // The head, or a snapshot that kept the block, may hold the position.
            let asked: Vec<(u64, Place)> =
                chunk.iter().map(|&(pos, block)| (block, Place::Cache(pos))).collect();
            let held = self.map.holding(&asked).await.map_err(|e| super::map_error(&self.name, e))?;
            for (&(pos, block), e) in chunk.iter().zip(held) {
                if let Some(e) = e {
                    moves.push(Move { block, from: e.place, entry: e, data: IoBytes::zeroed(0) });
                } else if self.ring.is_restored(pos, block) {
                    stale.push((pos, block));
                }
            }
            scanned += chunk.len();
        }
        if !stale.is_empty() {
            self.release_stale(stale).await?;
        }
        if moves.is_empty() || (moves.len() < want && !pad) {
            return Ok(false);
        }
        self.read_cached(&mut moves).await?;
        if moves.is_empty() {
            return Ok(false);
        }
        let written = self.write_batch(super::space::Stream::Host, moves).await?;
        self.counters.destage_batches.fetch_add(1, Relaxed);
        self.counters.destaged_blocks.fetch_add(written, Relaxed);
        Ok(true)
    }

    /// Frees restored cache positions (claims of a persisted table) whose block's map entry
    /// points elsewhere. A writer that replaced such an entry may not have freed the position
    /// yet: with every writer out of the map-update-to-free window, what still points elsewhere
    /// is stale (no later update can make a block point at an old position).
    async fn release_stale(&self, stale: Vec<(u64, u64)>) -> Result<(), VolumeError> {
        let _settled = self.settle.write().await;
        for (pos, block) in stale {
            let held = self
                .map
                .holding(&[(block, Place::Cache(pos))])
                .await
                .map_err(|e| super::map_error(&self.name, e))?;
            if held[0].is_none() {
                self.ring.release_if_restored(pos, block);
            }
        }
        Ok(())
    }

    /// Reads the cached blocks of `moves` (contiguous positions in one read) and drops the ones
    /// whose entry changed meanwhile.
    async fn read_cached(&self, moves: &mut Vec<Move>) -> Result<(), VolumeError> {
        let ring = self.ring.ring_blocks();
        let mut i = 0;
        while i < moves.len() {
            let Place::Cache(p0) = moves[i].from else { unreachable!("destage moves cached blocks") };
            let mut n = 1;
            while i + n < moves.len()
                && moves[i + n].from == Place::Cache(p0 + n as u64)
                && !(p0 + n as u64).is_multiple_of(ring)
            {
                n += 1;
            }
            let buf = self.cache.read(self.ring.block_of(p0) * BLOCK_BYTES, n * BLOCK_USIZE).await?.freeze();
            for (k, m) in moves[i..i + n].iter_mut().enumerate() {
                m.data = buf.slice(k * BLOCK_USIZE..(k + 1) * BLOCK_USIZE);
            }
            i += n;
        }
        let mut kept = Vec::with_capacity(moves.len());
        for m in moves.drain(..) {
            if block_crc(&m.data) == m.entry.crc {
                kept.push(m);
                continue;
            }
            let held =
                self.map.holding(&[(m.block, m.from)]).await.map_err(|e| super::map_error(&self.name, e))?;
            if held[0].is_some() {
                return Err(self.unrecoverable(
                    m.block,
                    "a cached block does not match its checksum in the map (both cache copies bad?)",
                ));
            }
        }
        *moves = kept;
        Ok(())
    }

    /// Writes `moves` (at most one batch) with their summary as the next batch of `stream`'s
    /// segment, then moves their map entries there (each only if the block is still where it
    /// was read), then frees the places the moves left. Returns the blocks moved.
    async fn write_batch(&self, stream: Stream, moves: Vec<Move>) -> Result<u64, VolumeError> {
        let geo = self.geo;
        let data_slots = geo.batch_data() as usize;
        assert!(moves.len() <= data_slots && !moves.is_empty());
        let mut taken = self.space.lock().take_batch(stream, moves.len() as u64);
        if taken.is_none() && stream == Stream::Host && self.counts_suspect.load(Relaxed) {
            self.recount().await?;
            taken = self.space.lock().take_batch(stream, moves.len() as u64);
        }
        if taken.is_none() && stream == Stream::Host && self.grow_space().await {
            taken = self.space.lock().take_batch(stream, moves.len() as u64);
        }
        let Some((seg, batch)) = taken else {
            let c = self.space_counts();
            let size =
                |segments: u64| stria_engine::units::format_size(segments * geo.segment_data() * BLOCK_BYTES);
            let limit = if c.segments >= c.max_segments {
                format!("it is at its most ({}, --space)", size(c.max_segments))
            } else {
                match &*self.growth_failed.lock() {
                    Some((why, _)) => format!("it cannot grow ({why})"),
                    None => "it could not grow".to_string(),
                }
            };
            let why = format!(
                "the segment space is full: {} of {} segments free, {} reserved for GC, {} of garbage to collect; \
                 {limit}; TRIM or delete data to free space",
                c.free_segments,
                c.segments,
                c.reserve_segments,
                stria_engine::units::format_size(c.garbage_blocks * BLOCK_BYTES),
            );
            self.no_space.lock().get_or_insert(why.clone());
            return Err(VolumeError::NoSpace {
                volume: self.name.clone(),
                offset_bytes: 0,
                len_bytes: 0,
                why: format!("destage: {why}"),
            });
        };
        if stream == Stream::Host {
            *self.no_space.lock() = None;
        }
        let base = geo.batch_addr(seg, batch);
        let mut buf = IoBuf::zeroed((geo.batch_blocks() * BLOCK_BYTES) as usize);
        let mut summary = Vec::with_capacity(moves.len());
        for (i, m) in moves.iter().enumerate() {
            buf[i * BLOCK_USIZE..(i + 1) * BLOCK_USIZE].copy_from_slice(&m.data);
            summary.push(SummaryEntry { block: m.block, seq: m.entry.seq, crc: m.entry.crc });
        }
        let batch_seq = self.seq.fetch_add(1, Relaxed);
        encode_summary(batch_seq, &summary, &mut buf[data_slots * BLOCK_USIZE..]);
        self.counters.padded_slots.fetch_add((data_slots - moves.len()) as u64, Relaxed);
        if let Err(e) = self.seg.write(base * BLOCK_BYTES, buf.freeze(), true).await {
            self.space.lock().lower(seg, moves.len() as u64);
            return Err(e);
        }
        let updates: Vec<Update> = moves
            .iter()
            .enumerate()
            .map(|(i, m)| Update {
                block: m.block,
                entry: MapEntry { place: Place::Segment(base + i as u64), ..m.entry },
                expect: Some(m.from),
            })
            .collect();
        let olds = self.update_map(&updates).await?;
        let lost = olds.iter().filter(|o| o.is_none()).count() as u64;
        if lost > 0 {
            self.counters.moves_lost.fetch_add(lost, Relaxed);
            self.space.lock().lower(seg, lost);
        }
        self.free_places(olds.into_iter().flatten());
        Ok(moves.len() as u64 - lost)
    }

    /// One step of GC: write a full batch of carried blocks, or read the next batch of the
    /// victim (chosen by `pick`). Blocks left over when no victim is left are written as a
    /// short batch only when space is critical or compaction is emptying the tail (padding
    /// makes garbage). Returns whether it did anything.
    pub(crate) async fn gc_step(&self, gc: &mut Gc, pick: Pick) -> Result<bool, VolumeError> {
        self.check_writable(0, self.size_bytes)?;
        let want = self.geo.batch_data() as usize;
        self.forget_drained(gc).await;
        if gc.carry.len() >= want {
            return self.gc_write(gc, want).await;
        }
        if let Some((v, _)) = gc.victim
            && self.space.lock().state(v) != SegState::Sealed
        {
            // Emptied (by overwrites, trims and our moves) and freed: done with it.
            gc.victim = None;
        }
        if gc.victim.is_none() {
            {
                let space = self.space.lock();
                gc.unreadable.retain(|&s| space.state(s) == SegState::Sealed);
                gc.fruitless.retain(|&s| space.state(s) == SegState::Sealed);
            }
            if !self.counts_suspect.load(Relaxed) {
                gc.fruitless.clear();
            }
            let mut carried: std::collections::HashSet<usize> =
                gc.carry.iter().filter_map(|m| self.segment_of_place(m.from)).collect();
            carried.extend(gc.unreadable.iter().copied());
            carried.extend(gc.fruitless.iter().copied());
            let victim = {
                let space = self.space.lock();
                match pick {
                    Pick::Garbage => space.victim(self.geo.batch_data(), &carried),
                    // Any garbage, but only while all there is adds up to a segment and a batch:
                    // with less no segment can come free (GC pads its last batch, and the segment
                    // it fills takes one), and GC would only swap nearly full segments forever.
                    // Less is a full space: destage finds none and writes get ENOSPC.
                    Pick::Critical
                        if space.counts().garbage_blocks
                            >= self.geo.segment_data() + self.geo.batch_data() =>
                    {
                        space.victim(1, &carried)
                    }
                    Pick::Critical => None,
                    Pick::Compact(target) => space.compaction_victim(target, &carried),
                }
            };
            match victim {
                Some(v) => {
                    gc.victim = Some((v, 0));
                    gc.victim_use = self.space.lock().opened(v);
                    gc.victim_clean = true;
                    self.counters.gc_victims.fetch_add(1, Relaxed);
                }
                None if pick != Pick::Garbage && !gc.carry.is_empty() => {
                    let n = gc.carry.len();
                    return self.gc_write(gc, n).await;
                }
                None => return Ok(false),
            }
        }
        let (v, batch) = gc.victim.expect("chosen above");
        let base = self.geo.batch_addr(v, batch);
        let read = self.seg.read(base * BLOCK_BYTES, (self.geo.batch_blocks() * BLOCK_BYTES) as usize).await;
        let bytes = match read {
            Ok(b) => b.freeze(),
            Err(e) => {
                tracing::warn!(volume = %self.name, segment = v, batch, error = %e,
                    "GC could not read a batch; the segment is left for later");
                gc.unreadable.insert(v);
                gc.victim = None;
                return Ok(true);
            }
        };
        let summary = decode_summary(&bytes[want * BLOCK_USIZE..], want);
        gc.victim_clean &= summary.iter().all(Option::is_some);
        let named: Vec<(usize, u64)> = summary
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.filter(|s| s.block < self.blocks).map(|s| (i, s.block)))
            .collect();
        // Live if the head or a snapshot's copy holds the slot.
        let asked: Vec<(u64, Place)> =
            named.iter().map(|&(i, block)| (block, Place::Segment(base + i as u64))).collect();
        let held = self.map.holding(&asked).await.map_err(|e| super::map_error(&self.name, e))?;
        for (&(i, block), e) in named.iter().zip(held) {
            let s = SummaryEntry { block, ..SummaryEntry::NONE };
            let at = Place::Segment(base + i as u64);
            let Some(e) = e else { continue };
            let data = &bytes[i * BLOCK_USIZE..(i + 1) * BLOCK_USIZE];
            if block_crc(data) != e.crc {
                return Err(
                    self.unrecoverable(s.block, "GC: a segment block does not match its checksum in the map")
                );
            }
            gc.carry.push(Move {
                block: s.block,
                from: at,
                entry: e,
                data: bytes.slice(i * BLOCK_USIZE..(i + 1) * BLOCK_USIZE),
            });
        }
        gc.victim = (batch + 1 < self.geo.segment_batches).then_some((v, batch + 1));
        if gc.victim.is_none() {
            if gc.victim_clean {
                gc.drained.push((v, gc.victim_use));
            } else if self.counts_suspect.load(Relaxed) {
                gc.fruitless.insert(v);
            }
        }
        Ok(true)
    }

    /// Forgets the counts left on drained victims whose moves are all resolved (an overcount
    /// from a persisted table: docs/design/log-structured-volumes.md, "Step 3a"), once no
    /// writer is between a map update and the lowering of the count it replaced.
    async fn forget_drained(&self, gc: &mut Gc) {
        if gc.drained.is_empty() {
            return;
        }
        let carried: std::collections::HashSet<usize> =
            gc.carry.iter().filter_map(|m| self.segment_of_place(m.from)).collect();
        let (ready, waiting): (Vec<_>, Vec<_>) =
            gc.drained.iter().partition(|(seg, _)| !carried.contains(seg));
        gc.drained = waiting;
        let left = |(seg, used): &(usize, u64)| {
            let s = self.space.lock();
            s.state(*seg) == SegState::Sealed && s.opened(*seg) == *used && s.live(*seg) > 0
        };
        let ready: Vec<(usize, u64)> = ready.into_iter().filter(left).collect();
        if ready.is_empty() {
            return;
        }
        let _settled = self.settle.write().await;
        let mut space = self.space.lock();
        for (seg, used) in ready {
            let n = space.forget(seg, used);
            if n > 0 {
                self.counters.overcount_forgotten.fetch_add(n, Relaxed);
                tracing::debug!(volume = %self.name, segment = seg, blocks = n, "GC forgot an overcount");
            }
        }
    }

    /// Rebuilds every live count from a scan of the map, with no writer between a map update
    /// and its lowering: after an open from a persisted table, the counts may be too high, and
    /// this is the last thing tried before a write gets ENOSPC.
    pub(crate) async fn recount(&self) -> Result<(), VolumeError> {
        let _settled = self.settle.write().await;
        let segments = self.space.lock().segments();
        let live = super::scan_map(&self.map, self.geo, segments)
            .await
            .map_err(|why| self.unrecoverable(0, why))?
            .live;
        let before = self.space_counts();
        self.space.lock().recount(&live);
        self.counts_suspect.store(false, Relaxed);
        let after = self.space_counts();
        tracing::info!(
            volume = %self.name,
            "segment space nearly full: recounted live blocks from the map ({} -> {} live, {} -> {} free segments)",
            before.live_blocks, after.live_blocks, before.free_segments, after.free_segments
        );
        Ok(())
    }

    async fn gc_write(&self, gc: &mut Gc, n: usize) -> Result<bool, VolumeError> {
        let moves: Vec<Move> = gc.carry.drain(..n).collect();
        let moved = self.write_batch(Stream::Gc, moves).await?;
        self.counters.gc_batches.fetch_add(1, Relaxed);
        self.counters.gc_moved_blocks.fetch_add(moved, Relaxed);
        Ok(true)
    }

    fn segment_of_place(&self, p: Place) -> Option<usize> {
        match p {
            Place::Segment(a) => Some(self.geo.segment_of(a)),
            _ => None,
        }
    }

    /// Destages every cached block (short last batch padded); for tests and benchmarks.
    pub async fn destage_all(&self) -> Result<(), VolumeError> {
        let mut gc = self.moving.lock().await;
        while self.ring.live() > 0 {
            if !self.gc_wanted(&mut gc).await? && !self.destage_batch(true).await? {
                tokio::task::yield_now().await;
            }
        }
        Ok(())
    }
}
