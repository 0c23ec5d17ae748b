//! Byte arithmetic shared by the two kinds of volume (the engine's [`Volume`](super::Volume) and
//! the tier's `LogVolume`): range checks, the whole blocks a byte range touches, the
//! read-modify-write merge of an unaligned write, the split of a zeroing or discard at its
//! unit, and allocation extents cut to a byte range.
//!
//! Pure functions and one async merge: no I/O of its own, no locks. Each kind calls it inside its
//! own critical section and keeps its own order of checks (closed flag, range, writability,
//! counters).

use std::future::Future;
use std::ops::Range;

pub use stria_dev::{BLOCK_BYTES, BLOCK_USIZE};
use stria_dev::{IoBuf, IoBytes};

use super::Extent;
use crate::error::VolumeError;

/// `OutOfRange` unless `offset_bytes + len_bytes` neither overflows nor passes `size_bytes`.
/// `len_bytes == 0` only checks the offset.
pub fn check_range(offset_bytes: u64, len_bytes: u64, size_bytes: u64) -> Result<(), VolumeError> {
    match offset_bytes.checked_add(len_bytes) {
        Some(end) if end <= size_bytes => Ok(()),
        _ => Err(VolumeError::OutOfRange { offset_bytes, len_bytes, size_bytes }),
    }
}

/// The whole blocks a non-empty byte range touches: `first..end` (block numbers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub offset_bytes: u64,
    pub len_bytes: u64,
    /// First block touched.
    pub first: u64,
    /// One past the last block touched.
    pub end: u64,
}

impl Span {
    /// The span of `len_bytes` (> 0) at `offset_bytes`; the caller checked the range.
    pub fn new(offset_bytes: u64, len_bytes: u64) -> Span {
        assert!(len_bytes > 0, "a span covers at least one byte");
        let first = offset_bytes / BLOCK_BYTES;
        let end = (offset_bytes + len_bytes).div_ceil(BLOCK_BYTES);
        Span { offset_bytes, len_bytes, first, end }
    }

    /// Blocks touched.
    pub fn blocks(&self) -> u64 {
        self.end - self.first
    }

    /// Bytes of the whole blocks touched.
    pub fn whole_len(&self) -> usize {
        (self.blocks() * BLOCK_BYTES) as usize
    }

    /// Offset of the range inside its first block.
    pub fn head(&self) -> usize {
        (self.offset_bytes % BLOCK_BYTES) as usize
    }

    /// True when offset and length are whole blocks (the range only, not the buffer memory).
    pub fn is_aligned(&self) -> bool {
        self.offset_bytes.is_multiple_of(BLOCK_BYTES) && self.len_bytes.is_multiple_of(BLOCK_BYTES)
    }

    /// The first block is only partly covered.
    fn partial_head(&self) -> bool {
        self.head() != 0
    }

    /// The last block is only partly covered.
    fn partial_tail(&self) -> bool {
        !(self.offset_bytes + self.len_bytes).is_multiple_of(BLOCK_BYTES)
    }

    /// Blocks an unaligned write must read first: the first and/or the last, each once, in that
    /// order. None for an aligned span.
    pub fn edge_blocks(&self) -> impl Iterator<Item = u64> {
        let head = self.partial_head().then_some(self.first);
        let tail = (self.partial_tail() && (self.end - 1 != self.first || !self.partial_head()))
            .then_some(self.end - 1);
        head.into_iter().chain(tail)
    }

    /// A whole-block read of the span (`whole_len()` bytes) cut to the requested bytes.
    pub fn clip(&self, whole: IoBuf) -> IoBuf {
        let mut buf = whole;
        let head = self.head();
        if head > 0 {
            drop(buf.split_to(head));
        }
        let len = self.len_bytes as usize;
        if buf.len() > len {
            drop(buf.split_off(len));
        }
        buf
    }
}

/// Whole-block image of an unaligned write: the edge blocks from `read_block` (in the order of
/// [`Span::edge_blocks`], one at a time), `data` laid over them. The caller holds the locks that
/// make this atomic (engine: stripe locks; tier: RMW locks) until the merged write completes.
/// On an aligned span nothing is read: `data` is only copied (into aligned memory).
pub async fn merge_unaligned<F, Fut>(
    span: &Span,
    data: &[u8],
    mut read_block: F,
) -> Result<IoBytes, VolumeError>
where
    F: FnMut(u64) -> Fut,
    Fut: Future<Output = Result<IoBuf, VolumeError>>,
{
    assert_eq!(data.len() as u64, span.len_bytes, "merge_unaligned: the data is the span's bytes");
    let mut whole = IoBuf::zeroed(span.whole_len());
    for block in span.edge_blocks() {
        let old = read_block(block).await?;
        let at = ((block - span.first) * BLOCK_BYTES) as usize;
        whole[at..at + BLOCK_USIZE].copy_from_slice(&old);
    }
    let head = span.head();
    whole[head..head + data.len()].copy_from_slice(data);
    assert!(
        whole.len() as u64 == span.blocks() * BLOCK_BYTES && whole.len().is_multiple_of(BLOCK_USIZE),
        "invariant: merge_unaligned returns the span's whole blocks ({} bytes for {:?})",
        whole.len(),
        span
    );
    Ok(whole.freeze())
}

/// A zeroing or discard split at `unit_bytes` (a block, or an ec row): `cheap` is the whole
/// units (maybe empty), `head` and `tail` the partial edges before and after it (maybe empty).
/// A discard uses only `cheap`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZeroSplit {
    pub cheap: Range<u64>,
    pub head: Range<u64>,
    pub tail: Range<u64>,
}

impl ZeroSplit {
    /// The split of `len_bytes` at `offset_bytes` (a checked range; may be empty).
    pub fn new(offset_bytes: u64, len_bytes: u64, unit_bytes: u64) -> ZeroSplit {
        let end = offset_bytes + len_bytes;
        let cheap_start = offset_bytes.next_multiple_of(unit_bytes).min(end);
        let cheap_end = (end / unit_bytes * unit_bytes).max(cheap_start);
        ZeroSplit { cheap: cheap_start..cheap_end, head: offset_bytes..cheap_start, tail: cheap_end..end }
    }

    /// Some of the range is not whole units: zeroing it writes data.
    pub fn has_slow_part(&self) -> bool {
        !self.head.is_empty() || !self.tail.is_empty()
    }

    /// The whole units as blocks: (first block, blocks); `None` when there are none.
    pub fn cheap_blocks(&self) -> Option<(u64, u64)> {
        (!self.cheap.is_empty())
            .then(|| (self.cheap.start / BLOCK_BYTES, (self.cheap.end - self.cheap.start) / BLOCK_BYTES))
    }
}

/// Per-block allocation states, coalesced into extents, then cut to a span.
#[derive(Debug, Default)]
pub struct ExtentRuns {
    out: Vec<Extent>,
    /// Blocks pushed.
    blocks: u64,
}

impl ExtentRuns {
    pub fn new() -> ExtentRuns {
        ExtentRuns::default()
    }

    /// Appends `blocks` blocks of one state.
    pub fn push(&mut self, unallocated: bool, blocks: u64) {
        self.blocks += blocks;
        let len_bytes = blocks * BLOCK_BYTES;
        match self.out.last_mut() {
            Some(e) if e.unallocated == unallocated => e.len_bytes += len_bytes,
            _ => self.out.push(Extent { len_bytes, unallocated }),
        }
    }

    /// The extents, the first and last cut to the span's bytes (the pushed blocks are the span's
    /// whole blocks); empty ones dropped.
    pub fn finish(self, span: &Span) -> Vec<Extent> {
        // Every block of the span once: the extents then sum to the requested length.
        assert_eq!(
            self.blocks,
            span.blocks(),
            "invariant: block status extents cover exactly the requested range ({span:?})"
        );
        let mut out = self.out;
        out[0].len_bytes -= span.offset_bytes - span.first * BLOCK_BYTES;
        let last = out.len() - 1;
        out[last].len_bytes -= span.end * BLOCK_BYTES - (span.offset_bytes + span.len_bytes);
        out.retain(|e| e.len_bytes > 0);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BLOCK: u64 = 4096;
    const UNITS: [u64; 2] = [BLOCK, 3 * BLOCK];

    /// Every (offset, len) with offsets 0..3 blocks and lengths 0..=3 blocks in 512-byte steps,
    /// plus a few larger lengths.
    fn cases() -> impl Iterator<Item = (u64, u64)> {
        let offsets = (0..3 * BLOCK).step_by(512);
        offsets.flat_map(|o| {
            (0..=3 * BLOCK).step_by(512).chain([5 * BLOCK + 512, 8 * BLOCK]).map(move |l| (o, l))
        })
    }

    // ---- the formulas as engine volume/mod.rs and tier volume.rs wrote them before this module

    fn old_check_range(offset_bytes: u64, len_bytes: u64, size_bytes: u64) -> Result<(), VolumeError> {
        match offset_bytes.checked_add(len_bytes) {
            Some(end) if end <= size_bytes => Ok(()),
            _ => Err(VolumeError::OutOfRange { offset_bytes, len_bytes, size_bytes }),
        }
    }

    /// (first, end, head, aligned) of the engine's read/write.
    fn old_span(offset_bytes: u64, len_bytes: u64) -> (u64, u64, usize, bool) {
        let first = offset_bytes / BLOCK;
        let end = (offset_bytes + len_bytes).div_ceil(BLOCK);
        let head = (offset_bytes % BLOCK) as usize;
        let aligned = offset_bytes.is_multiple_of(BLOCK) && len_bytes.is_multiple_of(BLOCK);
        (first, end, head, aligned)
    }

    /// The blocks the old engine `merge_unaligned` read, in order.
    fn old_engine_edge_reads(offset_bytes: u64, len_bytes: u64) -> Vec<u64> {
        let (first, end, head, _) = old_span(offset_bytes, len_bytes);
        let needs_head = head != 0;
        let needs_tail = !(offset_bytes + len_bytes).is_multiple_of(BLOCK);
        let mut reads = Vec::new();
        if needs_head {
            reads.push(first);
        }
        if needs_tail && (end - 1 != first || !needs_head) {
            reads.push(end - 1);
        }
        reads
    }

    /// The blocks the old tier unaligned write read, in order.
    fn old_tier_edge_reads(offset_bytes: u64, len: u64) -> Vec<u64> {
        let first = offset_bytes / BLOCK;
        let end = (offset_bytes + len).div_ceil(BLOCK);
        let head = (offset_bytes % BLOCK) as usize;
        let mut reads = Vec::new();
        if head != 0 {
            reads.push(first);
        }
        if !(offset_bytes + len).is_multiple_of(BLOCK) && (end - 1 != first || head == 0) {
            reads.push(end - 1);
        }
        reads
    }

    /// The old engine read clipping (the tier's differs only in cutting unconditionally).
    fn old_clip(offset_bytes: u64, len_bytes: usize, mut buf: IoBuf) -> IoBuf {
        let head = (offset_bytes % BLOCK) as usize;
        if head > 0 {
            drop(buf.split_to(head));
        }
        if buf.len() > len_bytes {
            drop(buf.split_off(len_bytes));
        }
        buf
    }

    /// Engine write_zeroes: (cheap_start, cheap_end, has_slow_part).
    fn old_zero(offset_bytes: u64, len_bytes: u64, unit: u64) -> (u64, u64, bool) {
        let end = offset_bytes + len_bytes;
        let cheap_start = offset_bytes.next_multiple_of(unit).min(end);
        let cheap_end = (end / unit * unit).max(cheap_start);
        (cheap_start, cheap_end, cheap_start != offset_bytes || cheap_end != end)
    }

    /// Engine/tier trim: the unmapped range, if any.
    fn old_trim(offset_bytes: u64, len_bytes: u64, unit: u64) -> Option<(u64, u64)> {
        let start = offset_bytes.next_multiple_of(unit);
        let end = (offset_bytes + len_bytes) / unit * unit;
        (end > start).then_some((start, end))
    }

    /// Engine/tier block_status coalescing and trimming, given per-block states.
    fn old_extents(offset_bytes: u64, len_bytes: u64, states: &[bool]) -> Vec<Extent> {
        let mut out: Vec<Extent> = Vec::new();
        let first = offset_bytes / BLOCK;
        let end = (offset_bytes + len_bytes).div_ceil(BLOCK);
        for &unallocated in states {
            match out.last_mut() {
                Some(e) if e.unallocated == unallocated => e.len_bytes += BLOCK,
                _ => out.push(Extent { len_bytes: BLOCK, unallocated }),
            }
        }
        let head = offset_bytes - first * BLOCK;
        out[0].len_bytes -= head;
        let over = end * BLOCK - (offset_bytes + len_bytes);
        let last = out.len() - 1;
        out[last].len_bytes -= over;
        out.retain(|e| e.len_bytes > 0);
        out
    }

    // ---- the comparisons

    #[test]
    fn check_range_matches_the_old_formula() {
        let size = 3 * BLOCK;
        for (o, l) in cases().chain([(u64::MAX, 1), (1, u64::MAX), (size, 0), (size + 1, 0)]) {
            let new = check_range(o, l, size).map_err(|e| e.to_string());
            let old = old_check_range(o, l, size).map_err(|e| e.to_string());
            assert_eq!(new, old, "offset {o} len {l}");
        }
    }

    #[test]
    fn span_matches_the_old_formulas() {
        for (o, l) in cases().filter(|&(_, l)| l > 0) {
            let s = Span::new(o, l);
            let (first, end, head, aligned) = old_span(o, l);
            assert_eq!((s.first, s.end, s.head(), s.is_aligned()), (first, end, head, aligned), "{o} {l}");
            assert_eq!(s.whole_len() as u64, (end - first) * BLOCK);
            let edges: Vec<u64> = s.edge_blocks().collect();
            assert_eq!(edges, old_engine_edge_reads(o, l), "engine edges {o} {l}");
            assert_eq!(edges, old_tier_edge_reads(o, l), "tier edges {o} {l}");
            assert_eq!(edges.is_empty(), aligned, "an aligned span reads no edge {o} {l}");
            let whole = || {
                let mut b = IoBuf::zeroed(s.whole_len());
                for (i, x) in b.iter_mut().enumerate() {
                    *x = (i % 251) as u8;
                }
                b
            };
            let new = s.clip(whole());
            let old = old_clip(o, l as usize, whole());
            assert_eq!(&new[..], &old[..], "clip {o} {l}");
            assert_eq!(new.len() as u64, l);
        }
    }

    #[test]
    fn merge_unaligned_matches_the_old_merge() {
        for (o, l) in cases().filter(|&(_, l)| l > 0) {
            let s = Span::new(o, l);
            let data: Vec<u8> = (0..l).map(|i| (i % 7 + 1) as u8).collect();
            let old_block = |b: u64| IoBuf::copy_from(&vec![0x80 | (b as u8); BLOCK_USIZE]);
            let mut reads = Vec::new();
            let merged = futures::executor::block_on(merge_unaligned(&s, &data, |b| {
                reads.push(b);
                std::future::ready(Ok(old_block(b)))
            }))
            .expect("no read fails");
            assert_eq!(reads, old_engine_edge_reads(o, l), "{o} {l}");
            // The old merge: zeros, then the edge blocks, then the data.
            let (first, end, head, _) = old_span(o, l);
            let mut want = vec![0u8; ((end - first) * BLOCK) as usize];
            for b in old_engine_edge_reads(o, l) {
                let at = ((b - first) * BLOCK) as usize;
                want[at..at + BLOCK_USIZE].copy_from_slice(&old_block(b));
            }
            want[head..head + data.len()].copy_from_slice(&data);
            assert_eq!(&merged[..], &want[..], "{o} {l}");
            assert_eq!(merged.len() % BLOCK_USIZE, 0);
        }
    }

    #[test]
    fn merge_unaligned_stops_at_the_first_failed_read() {
        let s = Span::new(512, 2 * BLOCK);
        let mut reads = 0;
        let err = futures::executor::block_on(merge_unaligned(&s, &vec![1; 2 * BLOCK_USIZE], |_| {
            reads += 1;
            std::future::ready(Err(VolumeError::Closed("v".into())))
        }))
        .unwrap_err();
        assert!(matches!(err, VolumeError::Closed(_)));
        assert_eq!(reads, 1);
    }

    #[test]
    fn zero_split_matches_the_old_zeroing_and_trim() {
        for unit in UNITS {
            for (o, l) in cases() {
                let z = ZeroSplit::new(o, l, unit);
                let (cs, ce, slow) = old_zero(o, l, unit);
                assert_eq!((z.cheap.start, z.cheap.end, z.has_slow_part()), (cs, ce, slow), "{o} {l} {unit}");
                // The old edge loops wrote [offset, cheap_start) then [cheap_end, end).
                assert_eq!((z.head.clone(), z.tail.clone()), (o..cs, ce..o + l), "{o} {l} {unit}");
                assert_eq!(z.cheap_blocks(), (ce > cs).then(|| (cs / BLOCK, (ce - cs) / BLOCK)));
                // Trim used its own formula: the same whole units.
                assert_eq!(
                    old_trim(o, l, unit),
                    (!z.cheap.is_empty()).then_some((cs, ce)),
                    "trim {o} {l} {unit}"
                );
                if l > 0 {
                    assert_eq!(z.head.end - z.head.start + (ce - cs) + z.tail.end - z.tail.start, l);
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "invariant: block status extents cover exactly the requested range")]
    fn extent_runs_refuse_a_state_list_that_misses_a_block() {
        let span = Span::new(512, 2 * BLOCK);
        let mut runs = ExtentRuns::new();
        runs.push(false, span.blocks() - 1);
        drop(runs.finish(&span));
    }

    #[test]
    fn extent_runs_match_the_old_coalescing() {
        for (o, l) in cases().filter(|&(_, l)| l > 0) {
            let s = Span::new(o, l);
            let n = s.blocks() as usize;
            // Every allocation pattern of up to 6 blocks, a few patterns beyond.
            let patterns: Vec<Vec<bool>> = if n <= 6 {
                (0..1u32 << n).map(|bits| (0..n).map(|i| bits >> i & 1 == 1).collect()).collect()
            } else {
                vec![vec![true; n], vec![false; n], (0..n).map(|i| i % 3 == 0).collect()]
            };
            for states in patterns {
                let mut runs = ExtentRuns::new();
                for &u in &states {
                    runs.push(u, 1);
                }
                let new = runs.finish(&s);
                assert_eq!(new, old_extents(o, l, &states), "{o} {l} {states:?}");
                assert_eq!(new.iter().map(|e| e.len_bytes).sum::<u64>(), l);
            }
            // Pushing a run at once is pushing its blocks one by one.
            let mut a = ExtentRuns::new();
            a.push(true, s.blocks());
            let mut b = ExtentRuns::new();
            (0..s.blocks()).for_each(|_| b.push(true, 1));
            assert_eq!(a.finish(&s), b.finish(&s));
        }
    }
}
