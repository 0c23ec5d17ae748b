//! The segment space of a log-structured volume: geometry, batch summaries, and the in-memory
//! segment table (state and live-block count per segment).
//!
//! Crash rules this module keeps (docs/crash-consistency.md, "Log-structured volumes"):
//! * A segment's live count is raised *before* a map update may point into it and lowered only
//!   *after* the update that replaced such an entry is durable, so it never undercounts.
//! * A sealed segment whose count reaches 0 is free: no durable or in-flight map entry points
//!   into it. Open segments are never freed (their batches are being handed out).

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
    crc32c::crc32c_append(crc32c::crc32c(&block[..4]), &block[8..])
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

/// The two writers of the space: destage (new data) and GC (survivors), kept in separate
/// segments so that data of different ages does not mix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Host,
    Gc,
}

#[derive(Debug, Clone, Copy)]
struct Seg {
    state: SegState,
    live: u64,
    /// Times the segment was opened: tells a drained victim from a later use of it.
    opened: u64,
}

/// The segment table.
#[derive(Debug)]
pub struct Space {
    geo: Geometry,
    /// The segments that exist (the space grows up to `geo.segments`).
    segs: Vec<Seg>,
    free: u64,
    /// Open segment and its next batch, per stream.
    open: [Option<(usize, u64)>; 2],
    /// Free segments only GC may open.
    reserve: u64,
    /// Data slots handed out (live or not): for "garbage".
    written_slots: u64,
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
            })
            .collect();
        let free = segs.iter().filter(|s| s.state == SegState::Free).count() as u64;
        let written_slots = (segments - free) * geo.segment_data();
        Space { geo, segs, free, open: [None, None], reserve, written_slots }
    }

    /// Segments that exist.
    pub fn segments(&self) -> u64 {
        self.segs.len() as u64
    }

    /// Adds `n` free segments at the end (the engine volume under the space has grown).
    pub fn grow(&mut self, n: u64) {
        assert!(self.segments() + n <= self.geo.segments, "growing past the most segments");
        let free = Seg { state: SegState::Free, live: 0, opened: 0 };
        self.segs.resize(self.segs.len() + n as usize, free);
        self.free += n;
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

    fn live_blocks(&self) -> u64 {
        self.segs.iter().map(|s| s.live).sum()
    }

    fn stream_index(s: Stream) -> usize {
        match s {
            Stream::Host => 0,
            Stream::Gc => 1,
        }
    }

    /// Hands out the next batch of `stream`'s open segment, opening a free one when needed (the
    /// host stream may not take the last `reserve` free segments), and counts `live` blocks in
    /// it before they are written. `None`: no space for this stream.
    pub fn take_batch(&mut self, stream: Stream, live: u64) -> Option<(usize, u64)> {
        let i = Self::stream_index(stream);
        let (seg, batch) = match self.open[i] {
            Some(open) => open,
            None => {
                let floor = if stream == Stream::Host { self.reserve } else { 0 };
                if self.free <= floor {
                    return None;
                }
                let seg = self.segs.iter().position(|s| s.state == SegState::Free).expect("free counted");
                self.segs[seg].state = SegState::Open;
                self.segs[seg].opened += 1;
                self.free -= 1;
                (seg, 0)
            }
        };
        self.segs[seg].live += live;
        self.written_slots += self.geo.batch_data();
        if batch + 1 == self.geo.segment_batches {
            self.open[i] = None;
            self.seal(seg);
        } else {
            self.open[i] = Some((seg, batch + 1));
        }
        Some((seg, batch))
    }

    fn seal(&mut self, seg: usize) {
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
        let s = &mut self.segs[seg];
        assert!(s.live >= n, "segment {seg}: lowering its live count {} by {n}", s.live);
        s.live -= n;
        self.free_if_empty(seg);
    }

    /// The GC victim: the sealed segment with the fewest live blocks, among those with at least
    /// `min_garbage` dead slots and not in `skip`.
    pub fn victim(&self, min_garbage: u64, skip: &std::collections::HashSet<usize>) -> Option<usize> {
        self.segs
            .iter()
            .enumerate()
            .filter(|(i, s)| {
                s.state == SegState::Sealed
                    && s.live + min_garbage <= self.geo.segment_data()
                    && !skip.contains(i)
            })
            .min_by_key(|(_, s)| s.live)
            .map(|(i, _)| i)
    }

    /// Live count of `seg`.
    pub fn live(&self, seg: usize) -> u64 {
        self.segs[seg].live
    }

    /// How many times `seg` was opened (its use, for [`Space::forget`]).
    pub fn opened(&self, seg: usize) -> u64 {
        self.segs[seg].opened
    }

    /// Sets the count of sealed segment `seg`, still in use `opened`, to 0 (it is free): the
    /// caller knows no map entry points into it and no lowering for one is pending, so what is
    /// left is an overcount from a persisted table. Returns the blocks forgotten.
    pub fn forget(&mut self, seg: usize, opened: u64) -> u64 {
        let s = &mut self.segs[seg];
        if s.state != SegState::Sealed || s.opened != opened {
            return 0;
        }
        let n = s.live;
        s.live = 0;
        self.free_if_empty(seg);
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
            s.live = l;
            self.free_if_empty(seg);
        }
    }

    /// The live count of every segment the space may grow to (for the persisted table).
    pub fn live_counts(&self) -> Vec<u64> {
        let mut live: Vec<u64> = self.segs.iter().map(|s| s.live).collect();
        live.resize(self.geo.segments as usize, 0);
        live
    }

    pub fn state(&self, seg: usize) -> SegState {
        self.segs[seg].state
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
}
