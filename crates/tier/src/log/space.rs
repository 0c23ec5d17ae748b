//! The segment space of a log-structured volume: geometry, batch summaries, and the in-memory
//! segment table (state and live-block count per segment).
//!
//! Crash rules this module keeps (docs/crash-consistency.md, "Log-structured volumes"):
//! * A segment's live count is raised *before* a map update may point into it and lowered only
//!   *after* the update that replaced such an entry is durable, so it never undercounts.
//! * A sealed segment whose count reaches 0 is free: no durable or in-flight map entry points
//!   into it. Open segments are never freed (their batches are being handed out).
//!
//! Asserted (a broken rule stops the process before a batch lands where live data is): a
//! count never goes below 0, nor above the slots handed out in a segment opened since the
//! volume was opened (a count from a persisted table may be an overcount, never an
//! undercount); a free segment has no live block and is opened only when free, and only open
//! segments are sealed; the free count is the number of free segments; the host stream never
//! takes GC's reserve. The whole table is checked after every change in debug builds (the
//! tests and simulations), the part a change touches in every build.

use stria_dev::BLOCK_USIZE;

/// Entries of one summary block.
pub const SUMMARY_ENTRIES: u64 = 255;
const SUMMARY_MAGIC: u32 = u32::from_le_bytes(*b"SSUM");
/// A summary slot that holds no block (padding of a short batch).
pub const NO_BLOCK: u64 = u64::MAX;

/// How the segment space is cut: rows of the ec layout, batches of rows (one write each, data
/// then summary), segments of batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Data blocks of one full stripe (K x chunk / 4 KiB).
    pub row_blocks: u64,
    /// Rows per batch.
    pub batch_rows: u64,
    /// Batches per segment.
    pub segment_batches: u64,
    /// Segments the space may grow to (those that exist: [`Space::segments`]).
    pub segments: u64,
}

impl Geometry {
    /// Blocks of one batch (data and summary).
    pub fn batch_blocks(&self) -> u64 {
        self.row_blocks * self.batch_rows
    }

    /// Summary blocks at the end of each batch.
    pub fn summary_blocks(&self) -> u64 {
        self.batch_blocks().div_ceil(SUMMARY_ENTRIES + 1)
    }

    /// Data blocks of one batch.
    pub fn batch_data(&self) -> u64 {
        self.batch_blocks() - self.summary_blocks()
    }

    /// Blocks of one segment.
    pub fn segment_blocks(&self) -> u64 {
        self.batch_blocks() * self.segment_batches
    }

    /// Data blocks of one segment.
    pub fn segment_data(&self) -> u64 {
        self.batch_data() * self.segment_batches
    }

    /// Blocks of the whole space at its largest.
    pub fn space_blocks(&self) -> u64 {
        self.segment_blocks() * self.segments
    }

    /// The segment holding space address `addr`.
    pub fn segment_of(&self, addr: u64) -> usize {
        usize::try_from(addr / self.segment_blocks()).expect("segment index fits")
    }

    /// First block (space address) of batch `batch` of segment `seg`.
    pub fn batch_addr(&self, seg: usize, batch: u64) -> u64 {
        seg as u64 * self.segment_blocks() + batch * self.batch_blocks()
    }
}

/// One summary entry: which logical block a data slot holds, its write sequence and CRC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SummaryEntry {
    pub block: u64,
    pub seq: u32,
    pub crc: u32,
}

impl SummaryEntry {
    pub const NONE: SummaryEntry = SummaryEntry { block: NO_BLOCK, seq: 0, crc: 0 };
}

/// Writes the summary of a batch (`entries`, one per data slot, padded with [`SummaryEntry::NONE`])
/// into `out` (the batch's summary blocks).
pub fn encode_summary(batch_seq: u64, entries: &[SummaryEntry], out: &mut [u8]) {
    out.fill(0);
    let blocks = out.len() / BLOCK_USIZE;
    assert!(entries.len() as u64 <= blocks as u64 * SUMMARY_ENTRIES, "summary too small");
    for (k, block) in out.chunks_exact_mut(BLOCK_USIZE).enumerate() {
        block[0..4].copy_from_slice(&SUMMARY_MAGIC.to_le_bytes());
        block[8..16].copy_from_slice(&batch_seq.to_le_bytes());
        let start = k * SUMMARY_ENTRIES as usize;
        for i in 0..SUMMARY_ENTRIES as usize {
            let e = entries.get(start + i).copied().unwrap_or(SummaryEntry::NONE);
            let at = 16 + 16 * i;
            block[at..at + 8].copy_from_slice(&e.block.to_le_bytes());
            block[at + 8..at + 12].copy_from_slice(&e.seq.to_le_bytes());
            block[at + 12..at + 16].copy_from_slice(&e.crc.to_le_bytes());
        }
        let crc = summary_crc(block);
        block[4..8].copy_from_slice(&crc.to_le_bytes());
    }
}

fn summary_crc(block: &[u8]) -> u32 {
    stria_dev::crc::crc32c_parts(&[&block[..4], &block[8..]])
}

/// Reads a batch's summary blocks: one entry per data slot (`data` of them), or `None` for a
/// block that is not a valid summary (torn, or bytes of something else). An all-zero block is a
/// batch never written since the space was new: its slots hold nothing.
pub fn decode_summary(bytes: &[u8], data: usize) -> Vec<Option<SummaryEntry>> {
    let mut out = Vec::with_capacity(data);
    for block in bytes.chunks_exact(BLOCK_USIZE) {
        let never_written = block.iter().all(|&b| b == 0);
        let valid = u32::from_le_bytes(block[0..4].try_into().expect("4")) == SUMMARY_MAGIC
            && u32::from_le_bytes(block[4..8].try_into().expect("4")) == summary_crc(block);
        for i in 0..SUMMARY_ENTRIES as usize {
            if out.len() == data {
                break;
            }
            if never_written {
                out.push(Some(SummaryEntry::NONE));
                continue;
            }
            let at = 16 + 16 * i;
            out.push(valid.then(|| SummaryEntry {
                block: u64::from_le_bytes(block[at..at + 8].try_into().expect("8")),
                seq: u32::from_le_bytes(block[at + 8..at + 12].try_into().expect("4")),
                crc: u32::from_le_bytes(block[at + 12..at + 16].try_into().expect("4")),
            }));
        }
    }
    out.resize(data, None);
    out
}

/// State of one segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SegState {
    Free,
    /// Batches are being handed out by one stream.
    Open,
    Sealed,
}

/// The writers of the space: destage (new data) and GC (survivors), kept in separate segments
/// so that data of different ages does not mix; under [`GcPolicy::Temperature`] each has a hot
/// sibling for blocks rewritten soon after their last write (and the survivors of segments
/// those filled), so that hot and cold blocks do not share segments either.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Host,
    Gc,
    HostHot,
    GcHot,
}

impl Stream {
    /// Every stream, in the order of their open segments in [`Space`].
    const ALL: [Stream; 4] = [Stream::Host, Stream::Gc, Stream::HostHot, Stream::GcHot];

    fn index(self) -> usize {
        Self::ALL.iter().position(|&s| s == self).expect("listed")
    }

    /// Destage's streams (the others are GC's).
    pub fn is_host(self) -> bool {
        matches!(self, Stream::Host | Stream::HostHot)
    }

    pub fn is_hot(self) -> bool {
        matches!(self, Stream::HostHot | Stream::GcHot)
    }

    /// The cold stream of the same writer.
    fn cold(self) -> Stream {
        if self.is_host() { Stream::Host } else { Stream::Gc }
    }
}

#[derive(Debug, Clone, Copy)]
struct Seg {
    state: SegState,
    live: u64,
    /// The use of the segment: a number unique across the space, given when the segment is
    /// opened (0: not opened since the volume was opened). Tells a drained victim from a later
    /// use of the same segment, even one given back to the pool and grown again.
    opened: u64,
    /// Opened by a hot stream ([`Stream::is_hot`]); in memory only (cold after an open).
    hot: bool,
}

/// How GC picks the segment it collects when it is not pressed for space (then, and when it
/// compacts, it takes the emptiest), and whether hot and cold blocks get streams of their own.
/// Temperature is the default: on a 4 GiB volume at 80 % fill it wrote 0.85x greedy's capacity
/// bytes on 80/20 writes, 0.97x on Zipf 1.1 and 1.02x on uniform ones (docs/benchmarks.md,
/// "GC that knows temperature"); cost-benefit alone measured 0.92-1.00x of greedy on uniform
/// and 80/20 writes and 1.01-1.24x on Zipf 1.1, since one host stream mixes hot and cold blocks
/// in every segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GcPolicy {
    /// The sealed segment with the fewest live blocks.
    Greedy,
    /// Garbage times age per cost (Rosenblum and Ousterhout's LFS): a segment whose blocks have
    /// lived long is likely to keep them, so it is worth collecting with less garbage than a
    /// young one, whose blocks are still dying.
    CostBenefit,
    /// Cost-benefit victims, and hot and cold blocks in segments of their own: destage writes a
    /// block rewritten soon after its last write (and after a hot version, or very soon) into
    /// the hot host stream, GC the survivors of a hot segment into the hot GC stream
    /// (docs/design/log-structured-volumes.md, "GC that knows temperature").
    #[default]
    Temperature,
}

impl GcPolicy {
    /// Every policy, as `volume create --gc` names them.
    pub const ALL: [GcPolicy; 3] = [GcPolicy::Greedy, GcPolicy::CostBenefit, GcPolicy::Temperature];

    /// The policy's name (`greedy`, `cost-benefit`, `temperature`).
    pub fn name(self) -> &'static str {
        match self {
            GcPolicy::Greedy => "greedy",
            GcPolicy::CostBenefit => "cost-benefit",
            GcPolicy::Temperature => "temperature",
        }
    }
}

impl std::fmt::Display for GcPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for GcPolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<GcPolicy, String> {
        GcPolicy::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| format!("unknown GC policy `{s}`: expected greedy, cost-benefit or temperature"))
    }
}

/// Fewest spare segments (segments minus those the live blocks would fill) a space has for its
/// hot streams to open segments of their own. Below it the two more open segments take too
/// much of what GC works with: measured, a space of 21 segments at 80 % (4 spare) cost 2.2x
/// greedy's write amplification with hot streams; with 49 at 2/3 (about 16 spare) 0.82x on
/// 80/20 writes (docs/benchmarks.md, "Small spaces").
pub const HOT_MIN_SPARE: u64 = 16;

/// The segment table.
#[derive(Debug)]
pub struct Space {
    geo: Geometry,
    /// The segments that exist (the space grows up to `geo.segments`).
    segs: Vec<Seg>,
    free: u64,
    /// Open segment and its next batch, per stream (in the order of [`Stream::ALL`]).
    open: [Option<(usize, u64)>; 4],
    /// Free segments only GC may open.
    reserve: u64,
    /// Data slots handed out (live or not): for "garbage".
    written_slots: u64,
    /// The last use given to an opened segment.
    uses: u64,
    /// Sum of the segments' live counts (kept, so that no decision sums the table).
    live_total: u64,
}

/// Counts for status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpaceCounts {
    pub segments: u64,
    /// Segments the space may grow to.
    pub max_segments: u64,
    pub free_segments: u64,
    pub reserve_segments: u64,
    pub live_blocks: u64,
    /// Data slots of open and sealed segments that no map entry points to.
    pub garbage_blocks: u64,
}

impl Space {
    /// A table of the first `segments` segments (those that exist) from the live counts found
    /// at open (one per segment the space may grow to; the caller makes sure none past the
    /// existing ones is counted): segments holding live blocks are sealed (their unwritten
    /// batches are garbage until GC), the others free.
    pub fn from_live(geo: Geometry, live: Vec<u64>, segments: u64, reserve: u64) -> Space {
        assert_eq!(live.len() as u64, geo.segments);
        assert!(segments <= geo.segments && live[segments as usize..].iter().all(|&l| l == 0));
        let segs: Vec<Seg> = live[..segments as usize]
            .iter()
            .map(|&l| Seg {
                state: if l > 0 { SegState::Sealed } else { SegState::Free },
                live: l,
                opened: 0,
                hot: false,
            })
            .collect();
        let free = segs.iter().filter(|s| s.state == SegState::Free).count() as u64;
        let written_slots = (segments - free) * geo.segment_data();
        let live_total = segs.iter().map(|s| s.live).sum();
        let space = Space { geo, segs, free, open: [None; 4], reserve, written_slots, uses: 0, live_total };
        space.check();
        space
    }

    /// Checks the whole table: the free count is the number of free segments, a free segment
    /// holds no live block, each stream's open segment is open (and the two differ), and a
    /// segment opened since the volume was opened counts no more live blocks than its slots.
    /// O(segments): every change calls it in debug builds ([`Self::checked`]); rare changes
    /// (growth, shrinking, recounts) in every build.
    pub fn check(&self) {
        let free = self.segs.iter().filter(|s| s.state == SegState::Free).count() as u64;
        assert_eq!(
            free, self.free,
            "segment table: {free} segments are free, the free count says {}",
            self.free
        );
        let live: u64 = self.segs.iter().map(|s| s.live).sum();
        assert_eq!(
            live, self.live_total,
            "segment table: the segments count {live} live blocks, the total says {}",
            self.live_total
        );
        assert!(
            self.segs.len() as u64 <= self.geo.segments,
            "segment table: {} segments, more than the {} the space may grow to",
            self.segs.len(),
            self.geo.segments
        );
        for (i, s) in self.segs.iter().enumerate() {
            assert!(
                s.state != SegState::Free || s.live == 0,
                "segment table: free segment {i} counts {} live blocks (a segment reused while a map entry points into it)",
                s.live
            );
            assert!(
                s.opened == 0 || s.live <= self.geo.segment_data(),
                "segment table: segment {i} counts {} live blocks in {} slots (a place counted twice)",
                s.live,
                self.geo.segment_data()
            );
            assert!(
                s.opened <= self.uses,
                "segment table: segment {i} has use {}, past the last given ({})",
                s.opened,
                self.uses
            );
        }
        for (k, open) in self.open.iter().enumerate() {
            if let Some((seg, next)) = *open {
                assert!(
                    self.segs.get(seg).is_some_and(|s| s.state == SegState::Open)
                        && next < self.geo.segment_batches,
                    "segment table: stream {k}'s open segment {seg} (next batch {next}) is not an open segment with that batch"
                );
            }
        }
        for (k, a) in self.open.iter().enumerate() {
            for b in &self.open[k + 1..] {
                if let (Some((a, _)), Some((b, _))) = (a, b) {
                    assert_ne!(a, b, "segment table: two streams write into one segment ({a})");
                }
            }
        }
    }

    /// [`Self::check`] in debug builds.
    fn checked(&self) {
        if cfg!(debug_assertions) {
            self.check();
        }
    }

    /// Segments that exist.
    pub fn segments(&self) -> u64 {
        self.segs.len() as u64
    }

    /// Adds `n` free segments at the end (the engine volume under the space has grown).
    pub fn grow(&mut self, n: u64) {
        assert!(self.segments() + n <= self.geo.segments, "growing past the most segments");
        let free = Seg { state: SegState::Free, live: 0, opened: 0, hot: false };
        self.segs.resize(self.segs.len() + n as usize, free);
        self.free += n;
        self.check();
    }

    /// Whether the space should grow rather than collect garbage: it can, and its live blocks
    /// fill more than 2/3 of its segments (where GC's cost starts to climb steeply) or no sealed
    /// segment has a batch of garbage to collect.
    pub fn wants_growth(&self) -> bool {
        let data = self.segments() * self.geo.segment_data();
        self.segments() < self.geo.segments
            && (self.live_blocks() * 3 >= data * 2
                || self.victim(self.geo.batch_data(), &Default::default()).is_none())
    }

    /// Fewest segments a space keeps when it gives segments back: what a new volume starts
    /// with (or its most, if less), so a new volume does not give back what it was just given.
    fn floor(&self) -> u64 {
        super::INITIAL_SEGMENTS.min(self.geo.segments)
    }

    /// Segments a growth adds (before the pool's room and the most are applied), and the least
    /// a shrink gives back: an eighth of the space, at least 4.
    /// Segments the space may grow to.
    pub fn max_segments(&self) -> u64 {
        self.geo.segments
    }

    /// Lets the space grow to `most` segments (a volume that grew; never fewer than before).
    pub fn set_max_segments(&mut self, most: u64) {
        assert!(most >= self.geo.segments, "the segment space's bound only rises");
        self.geo.segments = most;
        self.check();
    }

    pub fn step(&self) -> u64 {
        (self.segments() / 8).max(4)
    }

    /// Segments the space needs for its data now: twice its live data (utilization 1/2, below
    /// where growth starts), the segments in use plus the reserve, one more and a growth step
    /// (so neither GC nor growth starts right after a shrink), and at least
    /// [`Self::floor`].
    fn needed(&self) -> u64 {
        let in_use = self.segments() - self.free;
        self.twice_the_live_data().max(in_use + self.reserve + 1 + self.step()).max(self.floor())
    }

    /// Segments that hold twice the live blocks (utilization 1/2).
    fn twice_the_live_data(&self) -> u64 {
        (2 * self.live_blocks()).div_ceil(self.geo.segment_data())
    }

    /// How many trailing free segments to give back to the pool: all of them down to what the
    /// space needs ([`Self::needed`]), when that is at least a growth step, else 0.
    pub fn shrinkable(&self) -> u64 {
        let tail = self.segs.iter().rev().take_while(|s| s.state == SegState::Free).count() as u64;
        let n = tail.min(self.segments().saturating_sub(self.needed()));
        if n >= self.step() { n } else { 0 }
    }

    /// Removes the last `n` segments, which must be free (the engine volume under the space is
    /// about to shrink); [`Self::grow`] puts them back if it does not.
    pub fn give_back(&mut self, n: u64) {
        let keep = self.segs.len() - n as usize;
        assert!(self.segs[keep..].iter().all(|s| s.state == SegState::Free), "giving back a used segment");
        assert!(
            keep as u64 >= self.floor(),
            "giving back {n} segments leaves {keep}, fewer than the {} a space keeps",
            self.floor()
        );
        self.segs.truncate(keep);
        self.free -= n;
        self.check();
    }

    /// Where compaction moves the tail to: `Some(target)` when the live data would fit in a
    /// third of the segments, so that the segments from `target` on can be emptied and given
    /// back; `target` leaves the headroom of [`Self::needed`] counting only the live data.
    pub fn compaction_target(&self) -> Option<usize> {
        let data = self.segments() * self.geo.segment_data();
        if self.live_blocks() * 3 >= data {
            return None;
        }
        let target = (self.twice_the_live_data() + self.reserve + 2 + self.step()).max(self.floor());
        (target + self.step() <= self.segments()).then_some(target as usize)
    }

    /// Seals the hot streams' open segments, their unwritten batches left as garbage, so that GC
    /// may collect them: when space is critical and no sealed segment has garbage to collect (a
    /// hot stream's open segment may hold much of it, and would stay open while no hot block
    /// comes). Returns whether one was sealed. Only between batches: none may be on its way.
    pub fn seal_hot(&mut self) -> bool {
        let mut sealed = false;
        for stream in [Stream::HostHot, Stream::GcHot] {
            if let Some((seg, next)) = self.open[stream.index()].take() {
                self.written_slots += (self.geo.segment_batches - next) * self.geo.batch_data();
                self.seal(seg);
                sealed = true;
            }
        }
        self.checked();
        sealed
    }

    /// Seals the open segments of both streams from `target` on, their unwritten batches left
    /// as garbage (as open leaves them in every segment it finds in use), so that compaction can
    /// empty them; only when a free segment before `target` can take their next batches (else
    /// each batch would waste a segment). Only between batches: none may be on its way.
    pub fn seal_open_from(&mut self, target: usize) {
        let target = target.min(self.segs.len());
        if !self.segs[..target].iter().any(|s| s.state == SegState::Free) {
            return;
        }
        for i in 0..self.open.len() {
            if let Some((seg, next)) = self.open[i]
                && seg >= target
            {
                self.open[i] = None;
                self.written_slots += (self.geo.segment_batches - next) * self.geo.batch_data();
                self.seal(seg);
            }
        }
        self.checked();
    }

    /// Compaction's victim (not in `skip`): while GC's survivors land before `target` (its open
    /// segment is there, or the free segment it would open next), the last sealed segment from
    /// `target` on, whatever its garbage (moving a tail segment into the tail would go round for
    /// ever). Otherwise, or when the tail is empty, the emptiest sealed segment before `target`
    /// with a batch of garbage: that makes room there, and packs the segments in use (each one
    /// holds the space up by the headroom [`Self::needed`] keeps after it).
    pub fn compaction_victim(&self, target: usize, skip: &std::collections::HashSet<usize>) -> Option<usize> {
        let target = target.min(self.segs.len());
        let lands_before = match self.open[Stream::Gc.index()] {
            Some((seg, _)) => seg < target,
            None => self.segs[..target].iter().any(|s| s.state == SegState::Free),
        };
        let tail = (target..self.segs.len())
            .rev()
            .find(|i| lands_before && self.segs[*i].state == SegState::Sealed && !skip.contains(i));
        tail.or_else(|| self.victim_in(0..target, self.geo.batch_data(), skip))
    }

    fn live_blocks(&self) -> u64 {
        self.live_total
    }

    /// Segments not needed to hold the live blocks: what GC and the open segments work with.
    fn spare(&self) -> u64 {
        self.segments().saturating_sub(self.live_total.div_ceil(self.geo.segment_data()))
    }

    /// Hands out the next batch of `stream`'s open segment, opening a free one when needed (the
    /// host stream may not take the last `reserve` free segments), and counts `live` blocks in
    /// it before they are written. `None`: no space for this stream.
    /// True when [`Space::take_batch`] would find a batch for `stream` now.
    pub fn has_batch(&self, stream: Stream) -> bool {
        let stream = self.stream_for(stream);
        self.open[stream.index()].is_some() || self.free > Self::floor_of(stream, self.reserve)
    }

    /// Free segments a stream leaves when it opens one: the host streams leave GC's reserve.
    fn floor_of(stream: Stream, reserve: u64) -> u64 {
        if stream.is_host() { reserve } else { 0 }
    }

    /// The stream that takes a batch meant for `stream`: a hot stream with no open segment
    /// writes into its cold sibling's when it may not open one: the host's where the host
    /// streams stop (GC's reserve), GC's when one free segment is left (GC's cold stream, the
    /// one critical space and compaction use, keeps it). Hot segments are a preference, never
    /// what runs the space out.
    /// While the space has fewer than [`HOT_MIN_SPARE`] spare segments the hot streams open
    /// none: two more open segments would be a large part of what GC works with.
    fn stream_for(&self, stream: Stream) -> Stream {
        let cold = stream.cold();
        if stream.is_hot()
            && self.open[stream.index()].is_none()
            && (self.free <= Self::floor_of(cold, self.reserve) + u64::from(!stream.is_host())
                || self.spare() < HOT_MIN_SPARE)
        {
            cold
        } else {
            stream
        }
    }

    /// Whether `seg` was opened by a hot stream (since the volume was opened).
    pub fn is_hot(&self, seg: usize) -> bool {
        self.segs.get(seg).is_some_and(|s| s.hot)
    }

    pub fn take_batch(&mut self, stream: Stream, live: u64) -> Option<(usize, u64)> {
        let stream = self.stream_for(stream);
        let i = stream.index();
        let (seg, batch) = match self.open[i] {
            Some(open) => open,
            None => {
                let floor = Self::floor_of(stream, self.reserve);
                if self.free <= floor {
                    return None;
                }
                let seg = self.segs.iter().position(|s| s.state == SegState::Free).expect("free counted");
                assert_eq!(self.segs[seg].live, 0, "segment {seg} opened while it counts live blocks");
                self.uses += 1;
                self.segs[seg].state = SegState::Open;
                self.segs[seg].opened = self.uses;
                self.segs[seg].hot = stream.is_hot();
                self.free -= 1;
                assert!(
                    !stream.is_host() || self.free >= self.reserve,
                    "the host stream took GC's reserve: {} free segments, {} reserved",
                    self.free,
                    self.reserve
                );
                (seg, 0)
            }
        };
        // A batch handed out twice would put two blocks in one slot.
        assert!(
            self.segs[seg].state == SegState::Open && batch < self.geo.segment_batches,
            "segment {seg}: batch {batch} handed out from a segment that is not open at it"
        );
        assert!(
            live <= self.geo.batch_data(),
            "{live} blocks counted in a batch of {} slots",
            self.geo.batch_data()
        );
        self.segs[seg].live += live;
        self.live_total += live;
        assert!(
            self.segs[seg].live <= (batch + 1) * self.geo.batch_data(),
            "segment {seg}: {} live blocks in the {} slots handed out (a place counted twice)",
            self.segs[seg].live,
            (batch + 1) * self.geo.batch_data()
        );
        self.written_slots += self.geo.batch_data();
        if batch + 1 == self.geo.segment_batches {
            self.open[i] = None;
            self.seal(seg);
        } else {
            self.open[i] = Some((seg, batch + 1));
        }
        self.checked();
        Some((seg, batch))
    }

    fn seal(&mut self, seg: usize) {
        assert_eq!(self.segs[seg].state, SegState::Open, "segment {seg}: sealing a segment that is not open");
        self.segs[seg].state = SegState::Sealed;
        self.free_if_empty(seg);
    }

    fn free_if_empty(&mut self, seg: usize) {
        let s = &mut self.segs[seg];
        if s.state == SegState::Sealed && s.live == 0 {
            s.state = SegState::Free;
            self.free += 1;
            self.written_slots -= self.geo.segment_data();
        }
    }

    /// `n` blocks of `seg` stopped being live (the updates that moved them away are durable, or
    /// a planned move into it did not happen).
    pub fn lower(&mut self, seg: usize, n: u64) {
        let segments = self.segs.len();
        let Some(s) = self.segs.get_mut(seg) else {
            panic!("segment {seg}: lowering its live count by {n}, but the space has {segments} segments");
        };
        // Below 0: a place freed that was never counted, or freed twice; the segment would be
        // reused while a map entry points into it.
        assert!(
            s.state != SegState::Free && s.live >= n,
            "segment {seg} ({:?}): lowering its live count {} by {n}",
            s.state,
            s.live
        );
        s.live -= n;
        self.live_total -= n;
        self.free_if_empty(seg);
        self.checked();
    }

    /// The GC victim: the sealed segment with the fewest live blocks, among those with at least
    /// `min_garbage` dead slots and not in `skip`.
    pub fn victim(&self, min_garbage: u64, skip: &std::collections::HashSet<usize>) -> Option<usize> {
        self.victim_in(0..self.segs.len(), min_garbage, skip)
    }

    /// The GC victim by `policy`, among the sealed segments with at least `min_garbage` dead
    /// slots and not in `skip`: [`GcPolicy::Greedy`] as [`Space::victim`];
    /// [`GcPolicy::CostBenefit`] the one with the most garbage times age per cost (LFS's
    /// `(1 - u) * age / (1 + u)`, u the live fraction), age counted in segments opened since it
    /// was (a segment not opened since the volume was opened counts as the oldest). Ties go to
    /// the emptiest.
    pub fn victim_by(
        &self,
        policy: GcPolicy,
        min_garbage: u64,
        skip: &std::collections::HashSet<usize>,
    ) -> Option<usize> {
        if policy == GcPolicy::Greedy {
            return self.victim(min_garbage, skip);
        }
        // CostBenefit and Temperature.
        let data = self.geo.segment_data();
        self.segs
            .iter()
            .enumerate()
            .filter(|(i, s)| s.state == SegState::Sealed && s.live + min_garbage <= data && !skip.contains(i))
            .max_by(|(_, a), (_, b)| {
                // garbage * age / (data + live), compared without division.
                let score = |s: &Seg| {
                    let age = u128::from(self.uses - s.opened.min(self.uses) + 1);
                    (u128::from(data - s.live) * age, u128::from(data + s.live))
                };
                let ((na, da), (nb, db)) = (score(a), score(b));
                (na * db).cmp(&(nb * da)).then(b.live.cmp(&a.live))
            })
            .map(|(i, _)| i)
    }

    fn victim_in(
        &self,
        range: std::ops::Range<usize>,
        min_garbage: u64,
        skip: &std::collections::HashSet<usize>,
    ) -> Option<usize> {
        self.segs[range.clone()]
            .iter()
            .zip(range)
            .map(|(s, i)| (i, s))
            .filter(|(i, s)| {
                s.state == SegState::Sealed
                    && s.live + min_garbage <= self.geo.segment_data()
                    && !skip.contains(i)
            })
            .min_by_key(|(_, s)| s.live)
            .map(|(i, _)| i)
    }

    /// Live count of `seg` (0 for a segment given back).
    pub fn live(&self, seg: usize) -> u64 {
        self.segs.get(seg).map_or(0, |s| s.live)
    }

    /// The use of `seg` (see [`Seg::opened`]; for [`Space::forget`]).
    pub fn opened(&self, seg: usize) -> u64 {
        self.segs.get(seg).map_or(0, |s| s.opened)
    }

    /// Sets the count of sealed segment `seg`, still in use `opened`, to 0 (it is free): the
    /// caller knows no map entry points into it and no lowering for one is pending, so what is
    /// left is an overcount from a persisted table. Returns the blocks forgotten.
    pub fn forget(&mut self, seg: usize, opened: u64) -> u64 {
        let Some(s) = self.segs.get_mut(seg) else { return 0 };
        if s.state != SegState::Sealed || s.opened != opened {
            return 0;
        }
        let n = s.live;
        s.live = 0;
        self.live_total -= n;
        self.free_if_empty(seg);
        self.checked();
        n
    }

    /// Replaces every count with `live` (one per segment the space may grow to), counted by a
    /// scan of the map while no count could change: sealed segments found empty are free.
    pub fn recount(&mut self, live: &[u64]) {
        assert_eq!(live.len() as u64, self.geo.segments);
        let (live, beyond) = live.split_at(self.segs.len());
        assert!(beyond.iter().all(|&l| l == 0), "the map points past the segments that exist");
        for (seg, &l) in live.iter().enumerate() {
            let s = &mut self.segs[seg];
            assert!(
                l <= s.live,
                "segment {seg}: the map points {l} blocks into it, its count said {} (an undercount)",
                s.live
            );
            let dropped = s.live - l;
            s.live = l;
            self.live_total -= dropped;
            self.free_if_empty(seg);
        }
        self.check();
    }

    /// The live count of every segment the space may grow to (for the persisted table).
    pub fn live_counts(&self) -> Vec<u64> {
        let mut live: Vec<u64> = self.segs.iter().map(|s| s.live).collect();
        live.resize(self.geo.segments as usize, 0);
        live
    }

    /// State of `seg`; a segment given back to the pool (or not grown yet) is free.
    pub fn state(&self, seg: usize) -> SegState {
        self.segs.get(seg).map_or(SegState::Free, |s| s.state)
    }

    pub fn free(&self) -> u64 {
        self.free
    }

    pub fn reserve(&self) -> u64 {
        self.reserve
    }

    pub fn counts(&self) -> SpaceCounts {
        let live_blocks = self.live_blocks();
        SpaceCounts {
            segments: self.segments(),
            max_segments: self.geo.segments,
            free_segments: self.free,
            reserve_segments: self.reserve,
            live_blocks,
            garbage_blocks: self.written_slots.saturating_sub(live_blocks),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geo() -> Geometry {
        Geometry { row_blocks: 16, batch_rows: 32, segment_batches: 2, segments: 4 }
    }

    #[test]
    fn a_batch_is_data_then_summary() {
        let g = Geometry { row_blocks: 128, batch_rows: 4, segment_batches: 16, segments: 10 };
        assert_eq!((g.batch_blocks(), g.summary_blocks(), g.batch_data()), (512, 2, 510));
        let g = Geometry { row_blocks: 16, batch_rows: 1, ..g };
        assert_eq!((g.summary_blocks(), g.batch_data()), (1, 15));
        assert_eq!(g.segment_of(g.batch_addr(3, 15) + 15), 3);
    }

    #[test]
    fn summaries_round_trip_and_damage_is_seen() {
        let g = geo();
        let entries: Vec<SummaryEntry> =
            (0..300).map(|i| SummaryEntry { block: i * 7, seq: i as u32, crc: 99 }).collect();
        let mut buf = vec![0u8; (g.summary_blocks() as usize) * BLOCK_USIZE];
        encode_summary(5, &entries, &mut buf);
        let got = decode_summary(&buf, g.batch_data() as usize);
        assert_eq!(got.len() as u64, g.batch_data());
        assert_eq!(got[299], Some(entries[299]));
        assert_eq!(got[300], Some(SummaryEntry::NONE), "padding");
        buf[BLOCK_USIZE + 100] ^= 1;
        let got = decode_summary(&buf, g.batch_data() as usize);
        assert_eq!(got[0], Some(entries[0]));
        assert_eq!(got[255], None, "the damaged block's entries are unknown, not trusted");
    }

    #[test]
    fn overcounts_are_forgotten_only_for_the_same_use_of_a_sealed_segment() {
        let mut s = Space::from_live(geo(), vec![5, 0, 0, 0], 4, 1);
        assert_eq!(s.state(0), SegState::Sealed);
        assert_eq!(s.forget(0, 1), 0, "another use of the segment");
        assert_eq!(s.forget(0, 0), 5);
        assert_eq!((s.state(0), s.free()), (SegState::Free, 4));
        s.take_batch(Stream::Host, 3).unwrap();
        assert_eq!(s.opened(0), 1);
        assert_eq!(s.forget(0, 1), 0, "an open segment is never forgotten");
        let mut t = Space::from_live(geo(), vec![9, 4, 0, 0], 4, 1);
        t.recount(&[0, 4, 0, 0]);
        assert_eq!((t.state(0), t.state(1), t.free()), (SegState::Free, SegState::Sealed, 3));
    }

    #[test]
    fn live_counts_free_sealed_segments_and_the_host_leaves_a_reserve() {
        let mut s = Space::from_live(geo(), vec![0; 4], 4, 1);
        assert_eq!(s.take_batch(Stream::Host, 10), Some((0, 0)));
        assert_eq!(s.take_batch(Stream::Host, 5), Some((0, 1)), "last batch seals segment 0");
        assert_eq!(s.state(0), SegState::Sealed);
        assert_eq!(s.take_batch(Stream::Gc, 3), Some((1, 0)));
        assert_eq!(s.take_batch(Stream::Host, 1), Some((2, 0)));
        assert_eq!(s.take_batch(Stream::Host, 1), Some((2, 1)));
        assert_eq!(s.take_batch(Stream::Host, 1), None, "the last free segment is GC's reserve");
        assert_eq!(s.victim(1, &Default::default()), Some(2), "fewest live blocks");
        assert_eq!(s.victim(1019, &Default::default()), None, "none has 1019 dead slots of 1020");
        assert_eq!(s.victim(1, &[2].into()), Some(0));
        s.lower(0, 15);
        assert_eq!(
            (s.state(0), s.free()),
            (SegState::Free, 2),
            "a sealed segment with no live block is free"
        );
        s.lower(1, 3);
        assert_eq!(s.state(1), SegState::Open, "an open segment is never freed");
        assert_eq!(s.take_batch(Stream::Host, 0), Some((0, 0)));
    }

    #[test]
    fn hot_streams_open_segments_of_their_own_and_fall_back_to_their_cold_sibling_near_the_reserve() {
        // 18 segments: 0-11 sealed, a tenth of each live (16 spare), 12-17 free.
        let g = Geometry { segments: 18, ..geo() };
        let mut live = vec![g.segment_data() / 10; 12];
        live.resize(18, 0);
        let mut s = Space::from_live(g, live, 18, 2);
        assert_eq!(s.take_batch(Stream::Host, 1), Some((12, 0)));
        assert_eq!(s.take_batch(Stream::HostHot, 1), Some((13, 0)), "a segment of its own");
        assert!(s.is_hot(13) && !s.is_hot(12));
        assert_eq!(s.take_batch(Stream::GcHot, 1), Some((14, 0)));
        assert_eq!(s.take_batch(Stream::Gc, 1), Some((15, 0)));
        assert!(s.is_hot(14) && !s.is_hot(15));
        // 16 and 17 are free: GC's reserve. Both hot streams still have room.
        assert_eq!(s.take_batch(Stream::HostHot, 1), Some((13, 1)), "sealed by its last batch");
        assert_eq!(s.take_batch(Stream::GcHot, 1), Some((14, 1)));
        // The hot host stream has no open segment and nothing above the reserve: its batch goes
        // into the cold one's open segment.
        assert_eq!(s.take_batch(Stream::HostHot, 1), Some((12, 1)), "into the cold host segment");
        assert!(!s.has_batch(Stream::HostHot) && !s.has_batch(Stream::Host));
        assert_eq!(s.take_batch(Stream::HostHot, 1), None, "no host stream takes the reserve");
        // GC's hot stream leaves its cold sibling a segment: the cold one's open segment takes
        // its batch, then the hot one opens a free segment only while two are free.
        assert_eq!(s.take_batch(Stream::GcHot, 1), Some((16, 0)), "two free: the hot one opens one");
        assert!(s.is_hot(16));
        assert_eq!(s.take_batch(Stream::Gc, 1), Some((15, 1)));
        assert_eq!(s.take_batch(Stream::GcHot, 1), Some((16, 1)));
        assert_eq!(s.take_batch(Stream::GcHot, 1), Some((17, 0)), "one free: into the cold stream");
        assert!(!s.is_hot(17), "opened by the cold stream");
        assert_eq!(s.take_batch(Stream::GcHot, 1), Some((17, 1)), "into the cold stream's segment");
        // A hot segment open when space runs out is sealed for GC, its unwritten batch garbage.
        s.lower(13, 2);
        s.lower(16, 2);
        assert_eq!((s.state(13), s.free()), (SegState::Free, 2), "sealed hot segments emptied are free");
        assert_eq!(s.take_batch(Stream::GcHot, 1), Some((13, 0)));
        assert!(s.is_hot(13) && s.state(13) == SegState::Open);
        assert!(s.seal_hot(), "the hot GC segment was open");
        assert_eq!(s.state(13), SegState::Sealed);
        assert_eq!(s.victim(1, &Default::default()), Some(13), "now GC can take it");
        assert!(!s.seal_hot(), "none open");
    }

    #[test]
    fn hot_streams_open_segments_only_while_the_space_has_enough_spare() {
        // 24 segments, 0-6 sealed and full: 17 spare.
        let g = Geometry { segments: 24, ..geo() };
        let (data, batch) = (g.segment_data(), g.batch_data());
        let mut live = vec![data; 7];
        live.resize(24, 0);
        let mut s = Space::from_live(g, live, 24, 2);
        assert_eq!(s.take_batch(Stream::HostHot, 1), Some((7, 0)));
        assert_eq!(s.take_batch(Stream::GcHot, 1), Some((8, 0)));
        assert!(s.is_hot(7) && s.is_hot(8));
        // A segment's worth more live blocks: 15 spare. An open hot segment is written to its
        // end, then the hot stream writes into its cold sibling's segments.
        assert_eq!(s.take_batch(Stream::Host, batch), Some((9, 0)));
        assert_eq!(s.take_batch(Stream::Host, batch), Some((9, 1)));
        assert_eq!(s.take_batch(Stream::HostHot, 1), Some((7, 1)), "its open segment, to its end");
        assert_eq!(s.take_batch(Stream::HostHot, 1), Some((10, 0)), "then a cold one");
        assert!(!s.is_hot(10));
        // Two full segments die: 17 spare again, and the hot stream opens one of its own.
        s.lower(0, data);
        s.lower(1, data);
        assert_eq!(s.take_batch(Stream::HostHot, 1), Some((0, 0)));
        assert!(s.is_hot(0));
    }

    #[test]
    fn cost_benefit_takes_an_old_segment_over_a_slightly_emptier_young_one() {
        let g = Geometry { segments: 8, ..geo() };
        let data = g.segment_data();
        let mut s = Space::from_live(g, vec![0; 8], 8, 1);
        // Segments 0-4 are written in turn (uses 1-5), each full of live blocks.
        for seg in 0..5 {
            assert_eq!(s.take_batch(Stream::Host, g.batch_data()), Some((seg, 0)));
            assert_eq!(s.take_batch(Stream::Host, g.batch_data()), Some((seg, 1)));
        }
        // The oldest loses 40 % of its blocks, the youngest 50 %, the others 10 %.
        s.lower(0, data * 4 / 10);
        s.lower(4, data / 2);
        for seg in 1..4 {
            s.lower(seg, data / 10);
        }
        let none = Default::default();
        assert_eq!(s.victim_by(GcPolicy::Greedy, 1, &none), Some(4), "greedy: the emptiest");
        // 0.4 * 5 / 1.6 against 0.5 * 1 / 1.5: the old one, with less garbage.
        assert_eq!(s.victim_by(GcPolicy::CostBenefit, 1, &none), Some(0));
        assert_eq!(s.victim_by(GcPolicy::CostBenefit, 1, &[0].into()), Some(4), "then the young one");
        assert_eq!(s.victim_by(GcPolicy::CostBenefit, data / 2 + 1, &none), None, "none has enough garbage");
    }

    #[test]
    fn the_space_grows_when_full_of_live_blocks_or_without_a_victim_and_never_past_its_most() {
        let g = geo();
        let mut s = Space::from_live(g, vec![0; 4], 2, 0);
        assert_eq!((s.segments(), s.counts().max_segments, s.free()), (2, 4, 2));
        assert!(s.wants_growth(), "no victim at all");
        let batch = g.batch_data();
        s.take_batch(Stream::Host, batch).unwrap();
        s.take_batch(Stream::Host, batch).unwrap();
        assert!(s.wants_growth(), "one segment of two sealed and full: no victim with garbage");
        s.lower(0, 600);
        assert!(!s.wants_growth(), "a batch of garbage, a fifth of the data live: collect it");
        s.take_batch(Stream::Gc, batch).unwrap();
        s.take_batch(Stream::Gc, batch).unwrap();
        assert!(s.wants_growth(), "live blocks fill more than 2/3 of the space");
        s.grow(2);
        assert_eq!((s.segments(), s.free(), s.state(3)), (4, 2, SegState::Free));
        assert_eq!(s.live_counts(), vec![2 * batch - 600, 2 * batch, 0, 0]);
        assert!(!s.wants_growth(), "at its most");
        let t = Space::from_live(g, vec![7, 0, 0, 0], 1, 0);
        assert_eq!((t.segments(), t.free(), t.live_counts()), (1, 0, vec![7, 0, 0, 0]));
    }

    #[test]
    fn trailing_free_segments_go_back_down_to_what_the_space_needs() {
        let g = Geometry { segments: 40, ..geo() };
        let data = g.segment_data();
        let mut live = vec![0; 40];
        live[..3].fill(data);
        let mut s = Space::from_live(g, live.clone(), 32, 2);
        // Keeps what a new volume starts with (16), more than the 3 used segments, the reserve
        // (2), one more and a growth step (32 / 8) need.
        assert_eq!(s.shrinkable(), 16);
        s.give_back(16);
        assert_eq!((s.segments(), s.free()), (16, 13));
        assert_eq!(s.shrinkable(), 0, "down to what it needs");
        assert!(s.free() > s.reserve() + 1, "a shrunk space is not where GC or growth start");
        s.grow(1);
        assert_eq!(s.shrinkable(), 0, "less than a growth step to give back");
        live[..3].fill(0);
        live[31] = 5;
        let t = Space::from_live(g, live, 32, 2);
        assert_eq!(t.shrinkable(), 0, "a used segment at the end holds the free ones before it");
    }

    #[test]
    fn compaction_empties_the_tail_into_the_front_and_never_the_tail_into_itself() {
        let g = Geometry { segments: 40, ..geo() };
        let (data, batch) = (g.segment_data(), g.batch_data());
        let mut live = vec![0; 40];
        live[31] = data;
        let mut s = Space::from_live(g, live.clone(), 32, 2);
        // Twice one segment of live data, the reserve, 2 more and a growth step (32 / 8): less
        // than a new volume's 16.
        assert_eq!(s.compaction_target(), Some(16));
        assert_eq!(
            s.compaction_victim(16, &Default::default()),
            Some(31),
            "the tail, survivors land in front"
        );
        assert_eq!(s.take_batch(Stream::Gc, batch), Some((0, 0)));
        assert_eq!(s.take_batch(Stream::Gc, batch), Some((0, 1)));
        let used = s.opened(0);
        s.lower(31, data);
        assert_eq!(s.compaction_victim(16, &Default::default()), None, "nothing sealed past the target");
        assert_eq!(s.shrinkable(), 16, "the emptied tail goes back");
        s.give_back(16);
        assert_eq!(s.compaction_target(), None, "1/8 of the space is live");
        s.grow(4);
        s.lower(0, data);
        s.take_batch(Stream::Host, 1).unwrap();
        assert_ne!(s.opened(0), used, "a later use of a segment is never taken for an earlier one");

        // The tail is empty but sparse segments in use hold the space up: pack them.
        let mut sparse = vec![0; 40];
        sparse[..15].fill(data / 4);
        let v = Space::from_live(g, sparse, 24, 2);
        assert_eq!(v.shrinkable(), 0, "15 in use + reserve + 1 + a step of 4 = 22 of 24");
        assert_eq!(v.compaction_target(), Some(16));
        assert_eq!(v.compaction_victim(16, &Default::default()), Some(0));

        // The front is all in use: make room there before moving the tail.
        live[..31].fill(data - batch);
        live[7] = data - 2 * batch;
        let t = Space::from_live(g, live, 32, 2);
        assert_eq!(t.compaction_target(), None, "almost all live: nothing to compact");
        let mut live = vec![0; 40];
        live[..32].fill(batch / 4);
        live[3] = batch / 4 - 1;
        let mut u = Space::from_live(g, live, 32, 2);
        let target = u.compaction_target().expect("an eighth live");
        assert_eq!(u.compaction_victim(target, &Default::default()), Some(3), "emptiest before the target");
        // GC's open segment past the target is sealed only once its next batch can land before.
        u.grow(2);
        assert_eq!(u.take_batch(Stream::Gc, 1), Some((32, 0)));
        u.seal_open_from(target);
        assert_eq!(u.state(32), SegState::Open, "no free segment before the target");
        u.lower(3, batch / 4 - 1);
        u.seal_open_from(target);
        assert_eq!((u.state(32), u.take_batch(Stream::Gc, 0)), (SegState::Sealed, Some((3, 0))));
    }
}
