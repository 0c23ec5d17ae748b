//! Where each logical block of a volume lives: segments, members and the address arithmetic
//! of the two layout families.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::drive::Drive;
use crate::format::meta::Layout;

/// `rebuild_cursor` value of a member that is not being rebuilt.
pub(crate) const NOT_REBUILDING: u64 = u64::MAX;

/// One member extent of a segment.
#[derive(Debug)]
pub(crate) struct Member<D> {
    pub(crate) drive: Arc<Drive<D>>,
    pub(crate) start_block: u64,
    /// Rows below this are valid on the member ([`NOT_REBUILDING`] when it is not rebuilding).
    pub(crate) rebuild_cursor: AtomicU64,
    /// The cursor as last committed to the metadata: after a crash the member is trusted only
    /// below it. Never above `rebuild_cursor`.
    pub(crate) rebuild_cursor_durable: AtomicU64,
}

impl<D: stria_dev::BlockDevice> Member<D> {
    /// True when `row` of this member can be read and must be written.
    pub(crate) fn usable(&self, row: u64) -> bool {
        !self.drive.is_failed() && row < self.rebuild_cursor.load(Ordering::Acquire)
    }

    /// True when `row` of this member would still be usable after a crash now: it is not failed
    /// and the committed rebuild cursor is past the row. A stripe write that skips the journal
    /// (full stripe, or zeroing by checksum entries) is only safe when every member of the row
    /// is durably usable: if a crash rolled the cursor back below the row, the member's chunk
    /// would be rebuilt from the others, which such a write may have left half old, half new.
    pub(crate) fn durably_usable(&self, row: u64) -> bool {
        self.usable(row) && row < self.rebuild_cursor_durable.load(Ordering::Acquire)
    }

    /// True while the member is being rebuilt (or waits to be).
    pub(crate) fn rebuilding(&self) -> bool {
        self.rebuild_cursor.load(Ordering::Acquire) != NOT_REBUILDING
    }
}

/// One instance of the layout over `rows` rows of its members.
#[derive(Debug)]
pub(crate) struct Segment<D> {
    /// First logical block of the volume in this segment.
    pub(crate) first_block: u64,
    pub(crate) rows: u64,
    pub(crate) members: Vec<Member<D>>,
}

/// Layout shape with the chunk size, for address arithmetic.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Geometry {
    pub(crate) layout: Layout,
    pub(crate) chunk_blocks: u64,
}

/// A run of logical blocks that maps to one chunk of one row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ChunkRun {
    /// Segment index.
    pub(crate) segment: usize,
    /// Row (stripe) within the segment.
    pub(crate) row: u64,
    /// Data column (stripe layouts) or data shard index (ec).
    pub(crate) column: u32,
    /// Block offset within the chunk.
    pub(crate) offset_in_chunk: u64,
    /// Number of blocks.
    pub(crate) blocks: u64,
}

impl Geometry {
    /// Logical blocks per row (stripe).
    pub(crate) fn row_blocks(&self) -> u64 {
        u64::from(self.layout.data_columns()) * self.chunk_blocks
    }

    /// Copies of each column (stripe layouts); 1 for ec.
    pub(crate) fn copies(&self) -> u32 {
        match self.layout {
            Layout::Raid0 { .. } | Layout::Ec { .. } => 1,
            Layout::Raid1 { copies } | Layout::Raid10 { copies, .. } => copies,
        }
    }

    /// Member index holding copy `copy` of `column` (stripe layouts).
    pub(crate) fn mirror_member(&self, column: u32, copy: u32) -> usize {
        (column * self.copies() + copy) as usize
    }

    /// Member index holding shard `shard` of stripe `row` (ec; parity rotates per stripe).
    pub(crate) fn ec_member(&self, row: u64, shard: u32) -> usize {
        let n = u64::from(self.layout.members());
        ((u64::from(shard) + row) % n) as usize
    }

    /// Shard index stored on member `member` in stripe `row` (inverse of [`Geometry::ec_member`]).
    pub(crate) fn ec_shard(&self, row: u64, member: usize) -> u32 {
        let n = u64::from(self.layout.members());
        ((member as u64 + n - row % n) % n) as u32
    }

    /// Member-extent block of `row`, `offset_in_chunk`.
    pub(crate) fn member_block(&self, row: u64, offset_in_chunk: u64) -> u64 {
        row * self.chunk_blocks + offset_in_chunk
    }

    /// Splits `blocks` logical blocks from segment-relative block `lb` into chunk runs.
    pub(crate) fn runs(&self, segment: usize, mut lb: u64, mut blocks: u64, out: &mut Vec<ChunkRun>) {
        let row_blocks = self.row_blocks();
        while blocks > 0 {
            let row = lb / row_blocks;
            let in_row = lb % row_blocks;
            let column = (in_row / self.chunk_blocks) as u32;
            let offset_in_chunk = in_row % self.chunk_blocks;
            let n = (self.chunk_blocks - offset_in_chunk).min(blocks);
            out.push(ChunkRun { segment, row, column, offset_in_chunk, blocks: n });
            lb += n;
            blocks -= n;
        }
    }
}

/// The segments of a volume, resolved to open drives. Replaced as a whole (through an
/// `ArcSwap`) when members change.
#[derive(Debug)]
pub(crate) struct VolumeMap<D> {
    pub(crate) segments: Vec<Segment<D>>,
    pub(crate) total_blocks: u64,
}

impl<D> VolumeMap<D> {
    /// The run of `blocks` logical blocks from `lb` when they lie in one chunk (the common case
    /// of small requests): what [`VolumeMap::runs`] would return as its only element, without
    /// allocating. `None` when the range spans chunks.
    pub(crate) fn single_run(&self, geo: &Geometry, lb: u64, blocks: u64) -> Option<ChunkRun> {
        let segment = self.segments.partition_point(|s| s.first_block <= lb).checked_sub(1)?;
        let s = &self.segments[segment];
        let rel = lb - s.first_block;
        let row_blocks = geo.row_blocks();
        let in_row = rel % row_blocks;
        let offset_in_chunk = in_row % geo.chunk_blocks;
        if blocks == 0 || offset_in_chunk + blocks > geo.chunk_blocks || rel + blocks > s.rows * row_blocks {
            return None;
        }
        let column = (in_row / geo.chunk_blocks) as u32;
        Some(ChunkRun { segment, row: rel / row_blocks, column, offset_in_chunk, blocks })
    }

    /// Splits a logical block range into chunk runs across segments.
    pub(crate) fn runs(&self, geo: &Geometry, mut lb: u64, mut blocks: u64) -> Vec<ChunkRun> {
        let mut out = Vec::new();
        let row_blocks = geo.row_blocks();
        let mut seg = self.segments.partition_point(|s| s.first_block <= lb).saturating_sub(1);
        while blocks > 0 {
            let s = &self.segments[seg];
            let seg_blocks = s.rows * row_blocks;
            let rel = lb - s.first_block;
            let n = (seg_blocks - rel).min(blocks);
            geo.runs(seg, rel, n, &mut out);
            lb += n;
            blocks -= n;
            seg += 1;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_split_at_chunk_boundaries() {
        let geo = Geometry { layout: Layout::Raid0 { width: 3 }, chunk_blocks: 4 };
        let mut out = Vec::new();
        geo.runs(0, 2, 12, &mut out);
        let cols: Vec<_> = out.iter().map(|r| (r.row, r.column, r.offset_in_chunk, r.blocks)).collect();
        assert_eq!(cols, vec![(0, 0, 2, 2), (0, 1, 0, 4), (0, 2, 0, 4), (1, 0, 0, 2)]);
    }

    #[test]
    fn single_run_agrees_with_runs() {
        let geo = Geometry { layout: Layout::Ec { data_shards: 4, parity_shards: 2 }, chunk_blocks: 16 };
        let segment = |first_block, rows| Segment::<()> { first_block, rows, members: Vec::new() };
        let map = VolumeMap { segments: vec![segment(0, 3), segment(192, 2)], total_blocks: 320 };
        for lb in 0..320 {
            for blocks in 1..=40u64.min(320 - lb) {
                let runs = map.runs(&geo, lb, blocks);
                let expected = if runs.len() == 1 { Some(runs[0]) } else { None };
                assert_eq!(map.single_run(&geo, lb, blocks), expected, "lb {lb} blocks {blocks}");
            }
        }
    }

    #[test]
    fn ec_members_rotate_and_invert() {
        let geo = Geometry { layout: Layout::Ec { data_shards: 4, parity_shards: 2 }, chunk_blocks: 16 };
        for row in 0..12 {
            let mut seen = [false; 6];
            for shard in 0..6 {
                let m = geo.ec_member(row, shard);
                assert!(!seen[m]);
                seen[m] = true;
                assert_eq!(geo.ec_shard(row, m), shard);
            }
        }
        assert_ne!(geo.ec_member(0, 4), geo.ec_member(1, 4), "parity moves between stripes");
    }
}
