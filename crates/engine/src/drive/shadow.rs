//! Shadow extents: while a member extent is being moved to another drive, every write that
//! reaches the extent on its own drive is made to the destination too, right after (the
//! destination's own intent bit, checksums and flush cover it there). The copy of each row and
//! these writes are ordered by the volume's stripe lock, so once every row has been copied the
//! destination holds what the source holds (docs/design/pool-growth.md, "Moving an extent").
//!
//! Hooking the drive rather than the volume's write paths means no path can miss it: data
//! writes, zeroing, repairs and journal replay all end in [`Drive::write`] or [`Drive::zero`].

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use stria_dev::{BLOCK_BYTES as BLOCK, BlockDevice, IoBytes};

use super::Drive;

/// The destination of one extent being moved.
#[derive(Debug)]
pub(crate) struct Shadow<D> {
    /// First data block of the source extent (on the drive that holds this shadow).
    pub(crate) src_start: u64,
    pub(crate) blocks: u64,
    pub(crate) target: Arc<Drive<D>>,
    /// First data block of the destination extent on `target`.
    pub(crate) dst_start: u64,
    /// Set when a write could not be repeated on the destination (it failed, or a resync set
    /// checksums here without writing): the destination no longer follows the source, and the
    /// move must be abandoned.
    pub(crate) broken: AtomicBool,
}

impl<D> Shadow<D> {
    pub(crate) fn new(src_start: u64, blocks: u64, target: Arc<Drive<D>>, dst_start: u64) -> Shadow<D> {
        Shadow { src_start, blocks, target, dst_start, broken: AtomicBool::new(false) }
    }

    pub(crate) fn is_broken(&self) -> bool {
        self.broken.load(Ordering::Acquire)
    }

    pub(crate) fn set_broken(&self) {
        self.broken.store(true, Ordering::Release);
    }

    /// The part of `block..block + blocks` this shadow covers: (index of its first block within
    /// the range, destination block, length), or `None`.
    fn overlap(&self, block: u64, blocks: u64) -> Option<(u64, u64, u64)> {
        overlap((self.src_start, self.blocks, self.dst_start), block, blocks)
    }
}

/// [`Shadow::overlap`] of `(src_start, len, dst_start)`.
fn overlap((src, len, dst): (u64, u64, u64), block: u64, blocks: u64) -> Option<(u64, u64, u64)> {
    let lo = block.max(src);
    let hi = (block + blocks).min(src + len);
    (lo < hi).then(|| (lo - block, dst + (lo - src), hi - lo))
}

impl<D: BlockDevice> Drive<D> {
    /// Starts repeating writes to `shadow`'s source extent on its destination.
    pub(crate) fn add_shadow(&self, shadow: Arc<Shadow<D>>) {
        let mut all: Vec<Arc<Shadow<D>>> = (**self.shadows.load()).clone();
        all.push(shadow);
        self.shadows.store(Arc::new(all));
    }

    /// Stops repeating writes on `shadow`'s destination.
    pub(crate) fn remove_shadow(&self, shadow: &Arc<Shadow<D>>) {
        let all: Vec<Arc<Shadow<D>>> =
            self.shadows.load().iter().filter(|s| !Arc::ptr_eq(s, shadow)).cloned().collect();
        self.shadows.store(Arc::new(all));
    }

    /// True when a shadow covers part of `block..block + blocks`.
    pub(super) fn shadowed(&self, block: u64, blocks: u64) -> bool {
        self.shadows.load().iter().any(|s| s.overlap(block, blocks).is_some())
    }

    /// Repeats a completed write of `data` at `block` on the shadows it touches; false when a
    /// repeat failed (that shadow is broken).
    pub(super) async fn mirror_write(
        &self,
        block: u64,
        data: &IoBytes,
        fua: bool,
        crcs: Option<&[u32]>,
    ) -> bool {
        let shadows = self.shadows.load();
        let blocks = data.len() as u64 / BLOCK;
        let mut all = true;
        for s in shadows.iter() {
            let Some((skip, dst, n)) = s.overlap(block, blocks) else { continue };
            if s.target.is_failed() {
                s.set_broken();
                all = false;
                continue;
            }
            let piece = data.slice((skip * BLOCK) as usize..((skip + n) * BLOCK) as usize);
            let crcs = crcs.map(|c| &c[skip as usize..(skip + n) as usize]);
            if let Err(e) = s.target.write_own(dst, piece, fua, crcs).await {
                tracing::warn!(slot = s.target.slot(), error = %e, "write to a move's destination failed");
                s.set_broken();
                all = false;
            }
        }
        all
    }

    /// Repeats a completed zeroing on the shadows it touches; false when a repeat failed.
    pub(super) async fn mirror_zero(&self, block: u64, blocks: u64) -> bool {
        let shadows = self.shadows.load();
        let mut all = true;
        for s in shadows.iter() {
            let Some((_, dst, n)) = s.overlap(block, blocks) else { continue };
            if s.target.is_failed() {
                s.set_broken();
                all = false;
                continue;
            }
            if let Err(e) = s.target.zero_own(dst, n).await {
                tracing::warn!(slot = s.target.slot(), error = %e, "zeroing on a move's destination failed");
                s.set_broken();
                all = false;
            }
        }
        all
    }

    /// Checksums were set from data found on the drive (resync): the destination did not get
    /// that, so the shadows touched are broken.
    pub(super) fn mirror_bless(&self, block: u64, blocks: u64) {
        for s in self.shadows.load().iter() {
            if s.overlap(block, blocks).is_some() {
                s.set_broken();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlap_clips_to_the_source_extent() {
        let s = (100, 10, 500);
        assert_eq!(overlap(s, 90, 10), None);
        assert_eq!(overlap(s, 90, 11), Some((10, 500, 1)));
        assert_eq!(overlap(s, 105, 2), Some((0, 505, 2)));
        assert_eq!(overlap(s, 108, 10), Some((0, 508, 2)));
        assert_eq!(overlap(s, 110, 5), None);
    }
}
