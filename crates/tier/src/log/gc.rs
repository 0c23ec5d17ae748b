//! GC: the live blocks of a victim segment (the emptiest with garbage, or compaction's tail)
//! read batch by batch through its summaries, carried, and written as whole batches of the GC
//! stream; overcounts a persisted table left are forgotten on drained victims, or recounted.

use std::sync::atomic::Ordering::Relaxed;

use stria_dev::{BLOCK_BYTES, BLOCK_USIZE, BlockDevice, IoBuf, IoBytes};
use stria_engine::{VolumeError, join_all_ok};

use super::LogVolume;
use super::destage::Move;
use super::space::{SegState, Stream, SummaryEntry, decode_summary};
use crate::map::{MapEntry, Place};
use stria_dev::block_crc;

/// A victim batch is read in the runs of its live blocks where under one block in this many of
/// the victim's batches not read yet is live.
const SPARSE_VICTIM: u64 = 8;

/// Dead blocks a sparse victim's read goes through between two live runs (one read, not two).
const RUN_GAP: usize = 4;

/// What GC read of one victim batch: its summary and the data of some of its slots.
pub(crate) struct BatchRead {
    summary: Vec<Option<SummaryEntry>>,
    /// Runs of data slots, in slot order: the first slot, the data, each block's checksum as
    /// the drives verified it.
    runs: Vec<(usize, IoBytes, Vec<u32>)>,
    summary_blocks: u64,
}

impl BatchRead {
    /// The slots whose summary names a block of a volume of `blocks`, with that block.
    fn named(&self, blocks: u64) -> Vec<(usize, u64)> {
        self.summary
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.filter(|s| s.block < blocks).map(|s| (i, s.block)))
            .collect()
    }

    /// The run holding slot `slot` and the slot's index in it, if it was read.
    fn find(&self, slot: usize) -> Option<(usize, usize)> {
        let k = self.runs.partition_point(|(first, _, _)| *first <= slot).checked_sub(1)?;
        let i = slot - self.runs[k].0;
        (i < self.runs[k].2.len()).then_some((k, i))
    }

    /// Whether slot `slot` was read.
    fn has(&self, slot: usize) -> bool {
        self.find(slot).is_some()
    }

    /// Slot `slot`'s data and checksum, if it was read.
    fn block(&self, slot: usize) -> Option<(IoBytes, u32)> {
        let (k, i) = self.find(slot)?;
        let (_, data, crcs) = &self.runs[k];
        Some((data.slice(i * BLOCK_USIZE..(i + 1) * BLOCK_USIZE), crcs[i]))
    }

    /// Data blocks read.
    fn data_blocks(&self) -> usize {
        self.runs.iter().map(|(_, _, crcs)| crcs.len()).sum()
    }

    /// Blocks read, data and summary.
    fn blocks(&self) -> u64 {
        self.data_blocks() as u64 + self.summary_blocks
    }
}

/// How GC picks its next victim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pick {
    /// A sealed segment with at least a batch of garbage, by the volume's [`GcPolicy`].
    Garbage,
    /// Space is critical: the emptiest with any garbage.
    Critical,
    /// Compaction towards the given target ([`super::space::Space::compaction_victim`]).
    Compact(usize),
}

/// GC's progress through its victim, and blocks read but not yet written.
#[derive(Default)]
pub(crate) struct Gc {
    victim: Option<(usize, u64)>,
    /// The victim's use (see [`super::space::Space::opened`]) and whether every summary read
    /// from it so far was valid.
    victim_use: u64,
    victim_clean: bool,
    /// Survivors go to the hot GC stream: the last victim chosen was a hot segment, under
    /// [`super::GcPolicy::Temperature`], not for compaction (which packs the space with the cold
    /// stream alone) and not sealed early to be collected (`Space::seal_hot`); the hot stream
    /// gives way to the cold one when space is critical (`Space::stream_for`).
    hot: bool,
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
    pub(super) shrink_failed: Option<std::time::Instant>,
}

impl<D: BlockDevice> LogVolume<D> {
    /// One step of GC: write a full batch of carried blocks, or read the next batch of the
    /// victim (chosen by `pick`). Blocks left over when no victim is left are written as a
    /// short batch only when space is critical or compaction is emptying the tail (padding
    /// makes garbage). Returns whether it did anything.
    pub(crate) async fn gc_step(&self, gc: &mut Gc, pick: Pick) -> Result<bool, VolumeError> {
        self.check_writable(0, self.size_bytes())?;
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
            if !self.space.counts_suspect.load(Relaxed) {
                gc.fruitless.clear();
            }
            let mut carried: std::collections::HashSet<usize> =
                gc.carry.iter().filter_map(|m| self.segment_of_place(m.from)).collect();
            carried.extend(gc.unreadable.iter().copied());
            carried.extend(gc.fruitless.iter().copied());
            // Set when the victim is a hot segment sealed for it: its survivors go to the cold
            // stream, or the next hot segment would be sealed the same way, round and round.
            let mut sealed_hot = false;
            let victim = {
                let mut space = self.space.lock();
                let victim = match pick {
                    Pick::Garbage => space.victim_by(self.params().gc, self.geo.batch_data(), &carried),
                    // Any garbage, but only while all there is adds up to a segment and a batch:
                    // with less no segment can come free (GC pads its last batch, and the segment
                    // it fills takes one), and GC would only swap nearly full segments forever.
                    // Less is a full space: destage finds none and writes get ENOSPC.
                    Pick::Critical
                        if space.counts().garbage_blocks
                            >= self.geo.segment_data() + self.geo.batch_data() =>
                    {
                        // None sealed with garbage: the hot streams' open segments may hold it.
                        space.victim(1, &carried).or_else(|| {
                            sealed_hot = space.seal_hot();
                            if sealed_hot { space.victim(1, &carried) } else { None }
                        })
                    }
                    Pick::Critical => None,
                    Pick::Compact(target) => space.compaction_victim(target, &carried),
                };
                // Only a sealed segment is collected: an open one still takes batches, a free
                // one may be opened under GC; and never one whose blocks are carried already.
                if let Some(v) = victim {
                    assert!(
                        space.state(v) == SegState::Sealed && !carried.contains(&v),
                        "volume {}: GC chose segment {v} ({:?}) as its victim",
                        self.name,
                        space.state(v)
                    );
                }
                victim
            };
            match victim {
                Some(v) => {
                    gc.victim = Some((v, 0));
                    gc.victim_use = self.space.lock().opened(v);
                    gc.victim_clean = true;
                    gc.hot = !matches!(pick, Pick::Compact(_))
                        && !sealed_hot
                        && self.params().gc == super::GcPolicy::Temperature
                        && self.space.lock().is_hot(v);
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
        // Where the victim's batches not read yet are mostly garbage (a hot segment cost-benefit
        // collects young, or the rest of one whose first batches held most of its survivors: its
        // live count less those read and carried), a batch is read its summary first and then
        // only the runs the map still holds; otherwise data and summary in one read.
        let unread = (self.geo.segment_batches - batch) * self.geo.batch_data();
        let carried = gc.carry.iter().filter(|m| self.segment_of_place(m.from) == Some(v)).count() as u64;
        let sparse = self.space.lock().live(v).saturating_sub(carried) * SPARSE_VICTIM < unread;
        let read = if sparse { self.read_batch_live(base).await? } else { self.read_batch_whole(base).await };
        let read = match read {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(volume = %self.name, segment = v, batch, error = %e,
                    "GC could not read a batch; the segment is left for later");
                gc.unreadable.insert(v);
                gc.victim = None;
                return Ok(true);
            }
        };
        self.counters.gc_read_blocks.fetch_add(read.blocks(), Relaxed);
        gc.victim_clean &= read.summary.iter().all(Option::is_some);
        // Live if the head or a snapshot's copy holds the slot: asked after the data was read,
        // so a slot held now was held when read (a place is never pointed at again once left,
        // and no batch is written into any segment during this step: it holds `moving`).
        // A slot a sparse read left out was dead when looked at, and stays dead: only debug
        // builds ask the map about those too, to check it.
        let mut named = read.named(self.blocks());
        if !cfg!(debug_assertions) {
            named.retain(|&(i, _)| read.has(i));
        }
        let held = self.held_slots(base, &named).await?;
        let mut live = Vec::with_capacity(named.len());
        for (&(i, block), e) in named.iter().zip(held) {
            let at = Place::Segment(base + i as u64);
            let Some(e) = e else { continue };
            assert_eq!(
                e.place, at,
                "volume {}: block {block} is held at {:?}, asked at {at:?}",
                self.name, e.place
            );
            let (data, crc) = read.block(i).unwrap_or_else(|| {
                panic!("volume {}: block {block} is held at {at:?}, a slot GC did not read", self.name)
            });
            debug_assert_eq!(crc, block_crc(&data));
            if crc != e.crc {
                return Err(
                    self.unrecoverable(block, "GC: a segment block does not match its checksum in the map")
                );
            }
            live.push(Move { block, from: at, entry: e, data });
        }
        // The survivors wait in `carry` until a batch of them is gathered. Slices of a batch
        // read would keep its whole 2 MiB alive for each: where fewer than a quarter of what was
        // read survives (the usual victim read whole), they are copied into a buffer of their
        // own, so that carried data holds at most four times its bytes (without it, at 80 % fill
        // under random writes, GC held over 50 reads of 2 MiB at once for a few MiB of
        // survivors, and freed them in bursts the allocator answered with fresh pages:
        // docs/design/datapath.md).
        if live.len() * 4 < read.data_blocks() {
            let mut own = IoBuf::for_overwrite(live.len() * BLOCK_USIZE);
            for (k, m) in live.iter().enumerate() {
                own[k * BLOCK_USIZE..(k + 1) * BLOCK_USIZE].copy_from_slice(&m.data);
            }
            let own = own.freeze();
            for (k, m) in live.iter_mut().enumerate() {
                m.data = own.slice(k * BLOCK_USIZE..(k + 1) * BLOCK_USIZE);
            }
        }
        gc.carry.extend(live);
        gc.victim = (batch + 1 < self.geo.segment_batches).then_some((v, batch + 1));
        if gc.victim.is_none() {
            if gc.victim_clean {
                gc.drained.push((v, gc.victim_use));
            } else if self.space.counts_suspect.load(Relaxed) {
                gc.fruitless.insert(v);
            }
        }
        Ok(true)
    }

    /// The map entry holding each `(slot, block)` of the batch at `base` there (the head's or a
    /// snapshot's), if any.
    async fn held_slots(
        &self,
        base: u64,
        named: &[(usize, u64)],
    ) -> Result<Vec<Option<MapEntry>>, VolumeError> {
        let asked: Vec<(u64, Place)> =
            named.iter().map(|&(i, block)| (block, Place::Segment(base + i as u64))).collect();
        self.map.holding(&asked).await.map_err(|e| super::map_error(&self.name, e))
    }

    /// Reads the victim batch at `base` whole: data and summary in one read.
    async fn read_batch_whole(&self, base: u64) -> Result<BatchRead, VolumeError> {
        let want = self.geo.batch_data() as usize;
        let (bytes, mut crcs) = self
            .parts
            .seg
            .read_with_crcs(base * BLOCK_BYTES, (self.geo.batch_blocks() * BLOCK_BYTES) as usize)
            .await?;
        let bytes = bytes.freeze();
        let summary = decode_summary(&bytes[want * BLOCK_USIZE..], want);
        crcs.truncate(want);
        let data = bytes.slice(0..want * BLOCK_USIZE);
        Ok(BatchRead { summary, runs: vec![(0, data, crcs)], summary_blocks: self.geo.summary_blocks() })
    }

    /// Reads the victim batch at `base` in two steps: its summary, then (all at once) the runs
    /// of slots the map holds now, through gaps of up to [`RUN_GAP`] dead blocks. The outer
    /// error is the map's (GC stops), the inner a read's (the segment is left for later).
    async fn read_batch_live(&self, base: u64) -> Result<Result<BatchRead, VolumeError>, VolumeError> {
        let want = self.geo.batch_data() as usize;
        let summary_blocks = self.geo.summary_blocks();
        let read = self
            .parts
            .seg
            .read((base + want as u64) * BLOCK_BYTES, (summary_blocks * BLOCK_BYTES) as usize)
            .await;
        let summary = match read {
            Ok(bytes) => decode_summary(&bytes, want),
            Err(e) => return Ok(Err(e)),
        };
        let mut read = BatchRead { summary, runs: Vec::new(), summary_blocks };
        let named = read.named(self.blocks());
        let held = self.held_slots(base, &named).await?;
        let mut spans: Vec<(usize, usize)> = Vec::new();
        for (&(i, _), e) in named.iter().zip(held) {
            if e.is_none() {
                continue;
            }
            match spans.last_mut() {
                Some((first, n)) if i <= *first + *n + RUN_GAP => *n = i + 1 - *first,
                _ => spans.push((i, 1)),
            }
        }
        let reads = spans.iter().map(|&(first, n)| {
            self.parts.seg.read_with_crcs((base + first as u64) * BLOCK_BYTES, n * BLOCK_USIZE)
        });
        match join_all_ok(reads).await {
            Ok(got) => {
                read.runs = spans
                    .iter()
                    .zip(got)
                    .map(|(&(first, _), (data, crcs))| (first, data.freeze(), crcs))
                    .collect();
                Ok(Ok(read))
            }
            Err(e) => Ok(Err(e)),
        }
    }

    /// Forgets the counts left on drained victims whose moves are all resolved (an overcount
    /// from a persisted table: docs/design/log-structured-volumes.md, "Step 3a"), once no
    /// writer is between a map update and the lowering of the count it replaced.
    pub(super) async fn forget_drained(&self, gc: &mut Gc) {
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
        let _settled = self.gates.settle.write().await;
        if self.settle_write_back().await.is_err() {
            return;
        }
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
        let _settled = self.gates.settle.write().await;
        self.settle_write_back().await?;
        // A resize may raise the space's bound while the scan runs (it does not take settle):
        // the counts must then be taken again for the new bound (the crash loop's
        // tiered-resize scenario hit it: 28 counts for 29 segments).
        let live = loop {
            let (segments, most) = {
                let s = self.space.lock();
                (s.segments(), s.max_segments())
            };
            let live = super::scan_map(&self.map, self.geometry(), segments)
                .await
                .map_err(|why| self.unrecoverable(0, why))?
                .live;
            if live.len() as u64 == most && self.space.lock().max_segments() == most {
                break live;
            }
        };
        let before = self.space_counts();
        self.space.lock().recount(&live);
        self.space.counts_suspect.store(false, Relaxed);
        let after = self.space_counts();
        tracing::info!(
            volume = %self.name,
            "segment space nearly full: recounted live blocks from the map ({} -> {} live, {} -> {} free segments)",
            before.live_blocks, after.live_blocks, before.free_segments, after.free_segments
        );
        Ok(())
    }

    /// [`Self::recount`], as the mover does when space runs low (for tests).
    #[doc(hidden)]
    pub async fn recount_live_counts(&self) -> Result<(), VolumeError> {
        let _moves = self.gates.moving.lock().await;
        self.recount().await
    }

    /// Checks every live count against a scan of the map, with no batch and no writer between a
    /// map update and its lowering (for tests and debugging): a count below the scan (an
    /// undercount: GC would free a segment the map still points into) is an error always, one
    /// above it (a leak) while the counts are exact (not opened from a persisted table since the
    /// last recount). Nothing is checked once the volume failed.
    #[doc(hidden)]
    /// Returns whether the counts were exact (checked both ways).
    pub async fn audit_live_counts(&self) -> Result<bool, String> {
        // No batch between its take and its map update either.
        let _moves = self.gates.moving.lock().await;
        let _settled = self.gates.settle.write().await;
        self.settle_write_back().await.map_err(|e| e.to_string())?;
        let segments = self.space.lock().segments();
        let scanned = super::scan_map(&self.map, self.geometry(), segments).await?.live;
        if let Some(why) = self.health.failure.lock().clone() {
            // Updates may be applied in memory and never made durable: nothing to check.
            return Err(format!("volume {} failed: {why}", self.name));
        }
        let counted = self.space.lock().live_counts();
        let exact = !self.space.counts_suspect.load(Relaxed);
        for (seg, (&c, &m)) in counted.iter().zip(&scanned).enumerate() {
            if c < m || (exact && c != m) {
                return Err(format!(
                    "volume {}: segment {seg} counts {c} live blocks, the map points {m} into it{}",
                    self.name,
                    if c < m { " (an undercount)" } else { "" }
                ));
            }
        }
        Ok(exact)
    }

    pub(super) async fn gc_write(&self, gc: &mut Gc, n: usize) -> Result<bool, VolumeError> {
        // Carried until written: a batch that fails (no room, a write error) leaves its blocks
        // where they are, and a victim whose moves are carried is not forgotten (its count
        // would go to 0 while the map points into it, and the segment be written over).
        let moves: Vec<Move> = gc.carry[..n].to_vec();
        let moved = self.write_batch(if gc.hot { Stream::GcHot } else { Stream::Gc }, moves, None).await?;
        gc.carry.drain(..n);
        self.counters.gc_batches.fetch_add(1, Relaxed);
        self.counters.gc_moved_blocks.fetch_add(moved, Relaxed);
        Ok(true)
    }

    pub(super) fn segment_of_place(&self, p: Place) -> Option<usize> {
        match p {
            Place::Segment(a) => Some(self.geo.segment_of(a)),
            _ => None,
        }
    }
}
