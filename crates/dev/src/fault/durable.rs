//! Which versions of each block a power cut may leave behind.
//!
//! The memory drive holds the live contents (what reads return). For every block written since
//! the last flush this keeps the durable version (from before the first such write) and each
//! version written since, oldest first. A flush makes the live contents durable (drops all
//! history); a FUA write makes its own blocks durable. A power cut leaves each block with history
//! at one of its versions, chosen independently per block by a seed: so unflushed writes may be
//! lost, reordered or torn, and flushed data always survives.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::BLOCK;
use crate::BLOCK_BYTES;
use crate::mem::MemDevice;

/// Versions of blocks written since the last flush.
#[derive(Debug)]
pub(super) struct Versions {
    /// `block_index -> [durable, written since (oldest first)...]`; never fewer than 2 entries.
    unflushed: BTreeMap<u64, Vec<Box<[u8]>>>,
    /// Versions written since the flush kept per block (at least 1: the latest).
    written_versions_max: usize,
}

impl Versions {
    pub(super) fn new(written_versions_max: usize) -> Versions {
        Versions { unflushed: BTreeMap::new(), written_versions_max: written_versions_max.max(1) }
    }

    /// Writes `data` at `offset_bytes` to `mem` and records the new block versions.
    ///
    /// `durable`: the write is durable when it completes (FUA).
    pub(super) fn write(&mut self, mem: &MemDevice, offset_bytes: u64, data: &[u8], durable: bool) {
        assert!(data.len().is_multiple_of(BLOCK) && offset_bytes.is_multiple_of(BLOCK_BYTES));
        for (i, block) in data.chunks_exact(BLOCK).enumerate() {
            let block_index = offset_bytes / BLOCK_BYTES + i as u64;
            if durable {
                self.unflushed.remove(&block_index);
                continue;
            }
            let versions = match self.unflushed.entry(block_index) {
                Entry::Occupied(versions) => versions.into_mut(),
                Entry::Vacant(slot) => {
                    let mut old = vec![0u8; BLOCK].into_boxed_slice();
                    mem.read_at(block_index * BLOCK_BYTES, &mut old);
                    if *old == *block {
                        continue; // rewriting the durable contents: nothing a crash could undo
                    }
                    slot.insert(vec![old])
                }
            };
            versions.push(block.into());
            if versions.len() > self.written_versions_max + 1 {
                versions.remove(1); // forget the oldest non-durable version
            }
        }
        mem.write_at(offset_bytes, data);
    }

    /// Everything written so far is durable.
    pub(super) fn flush(&mut self) {
        self.unflushed.clear();
    }

    /// Number of blocks written since the last flush.
    pub(super) fn unflushed_blocks(&self) -> usize {
        self.unflushed.len()
    }

    /// Flips one bit of every stored version of a block (the medium is corrupt whichever
    /// version survives a crash). The live copy in `mem` is flipped too.
    pub(super) fn flip_bit(&mut self, mem: &MemDevice, block_index: u64, bit_index: u32) {
        let byte = (bit_index / 8) as usize;
        let mask = 1u8 << (bit_index % 8);
        let mut live = [0u8; 1];
        let at = block_index * BLOCK_BYTES + byte as u64;
        mem.read_at(at, &mut live);
        mem.write_at(at, &[live[0] ^ mask]);
        if let Some(versions) = self.unflushed.get_mut(&block_index) {
            for version in versions {
                version[byte] ^= mask;
            }
        }
    }

    /// The contents after a power cut now: `mem` where nothing is unflushed, and for each
    /// unflushed block one of its versions, chosen by `seed`.
    pub(super) fn crash_image(&self, mem: &MemDevice, name: &str, seed: u64) -> MemDevice {
        let image = mem.clone_contents(name);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        for (&block_index, versions) in &self.unflushed {
            let chosen = &versions[rng.random_range(0..versions.len())];
            image.write_at(block_index * BLOCK_BYTES, chosen);
        }
        image
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(fill: u8) -> Vec<u8> {
        vec![fill; BLOCK]
    }

    fn first_byte(mem: &MemDevice, block_index: u64) -> u8 {
        let mut b = [0u8; 1];
        mem.read_at(block_index * BLOCK_BYTES, &mut b);
        b[0]
    }

    #[test]
    fn crash_images_pick_the_durable_or_a_later_version_per_block() {
        let mem = MemDevice::new("m", 16 * BLOCK_BYTES);
        let mut versions = Versions::new(8);
        versions.write(&mem, 0, &block(1), false);
        versions.flush();
        for fill in 2..=4 {
            versions.write(&mem, 0, &block(fill), false);
        }
        versions.write(&mem, BLOCK_BYTES, &block(9), true);
        assert_eq!(versions.unflushed_blocks(), 1);
        let mut seen = std::collections::BTreeSet::new();
        for seed in 0..64 {
            let image = versions.crash_image(&mem, "m", seed);
            seen.insert(first_byte(&image, 0));
            assert_eq!(first_byte(&image, 1), 9, "a FUA write is durable");
        }
        assert_eq!(seen.into_iter().collect::<Vec<_>>(), vec![1, 2, 3, 4]);
    }

    #[test]
    fn only_the_newest_versions_are_kept_beyond_the_limit() {
        let mem = MemDevice::new("m", 4 * BLOCK_BYTES);
        let mut versions = Versions::new(2);
        for fill in 1..=5 {
            versions.write(&mem, 0, &block(fill), false);
        }
        let seen: std::collections::BTreeSet<u8> =
            (0..64).map(|seed| first_byte(&versions.crash_image(&mem, "m", seed), 0)).collect();
        assert_eq!(seen.into_iter().collect::<Vec<_>>(), vec![0, 4, 5]);
    }

    #[test]
    fn a_bit_flip_corrupts_every_version() {
        let mem = MemDevice::new("m", 4 * BLOCK_BYTES);
        let mut versions = Versions::new(4);
        versions.write(&mem, 0, &block(0), false);
        versions.flip_bit(&mem, 0, 3);
        assert_eq!(first_byte(&mem, 0), 8);
        for seed in 0..8 {
            assert_eq!(first_byte(&versions.crash_image(&mem, "m", seed), 0), 8);
        }
    }
}
