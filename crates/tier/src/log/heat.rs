//! The temperature of host writes, for [`super::GcPolicy::Temperature`]: a block is written hot
//! when it is rewritten soon after its last write. The interval is counted in write sequences
//! (the map entry of the version replaced carries the sequence that wrote it, kept through
//! destage and GC), against a running mean of the intervals seen. Hot means shorter than twice
//! the mean, and either the version replaced was hot too (it lay in a hot segment or a hot cache
//! position) or the interval was shorter than half the mean: a cold block needs two short
//! intervals in a row to be taken for hot, a hot one one long one to be taken for cold
//! (docs/design/log-structured-volumes.md, "GC that knows temperature"). Only a hint for where
//! destage writes a block: nothing read or kept depends on it.

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;

use crate::map::{MapEntry, Place};

/// Weight of a new interval in the running mean: 1 / 2^MEAN_SHIFT.
const MEAN_SHIFT: u32 = 12;

/// The running mean of rewrite intervals (in write sequences, fixed point: times 2^MEAN_SHIFT).
#[derive(Debug)]
pub(crate) struct Heat {
    mean: AtomicU64,
}

impl Heat {
    /// Starts from a mean of `blocks` (a volume's worth of writes between rewrites, as uniform
    /// writes would give).
    pub(crate) fn new(blocks: u64) -> Heat {
        Heat { mean: AtomicU64::new(blocks.max(1) << MEAN_SHIFT) }
    }

    /// Whether a write with sequence `seq` that replaced `old` is hot (`was_hot`: the version
    /// replaced was). A block never written, or zeroed, is cold. Writers race on the mean
    /// (a lost update moves it less): it is a hint.
    pub(crate) fn is_hot(&self, seq: u32, old: &MapEntry, was_hot: bool) -> bool {
        if !matches!(old.place, Place::Cache(_) | Place::Segment(_)) {
            return false;
        }
        let interval = u64::from(seq.wrapping_sub(old.seq));
        let fixed = self.mean.load(Relaxed);
        let mean = fixed >> MEAN_SHIFT;
        // mean += (interval - mean) / 2^MEAN_SHIFT, in fixed point.
        self.mean.store((fixed - mean + interval).max(1), Relaxed);
        interval < 2 * mean && (was_hot || interval < mean / 2)
    }

    /// The running mean (write sequences).
    #[cfg(test)]
    pub(crate) fn mean(&self) -> u64 {
        self.mean.load(Relaxed) >> MEAN_SHIFT
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(place: Place, seq: u32) -> MapEntry {
        MapEntry { place, crc: 1, seq }
    }

    #[test]
    fn a_block_is_hot_after_two_short_intervals_or_one_very_short_one() {
        let h = Heat::new(1000);
        let seg = Place::Segment(7);
        assert!(!h.is_hot(5000, &MapEntry::UNALLOCATED, true), "a first write is cold");
        assert!(!h.is_hot(5000, &at(seg, 3000), false), "2000 since: longer than twice the mean");
        assert!(!h.is_hot(5000, &at(seg, 4300), false), "700: short, but the last version was cold");
        assert!(h.is_hot(5000, &at(seg, 4300), true), "700 after a hot version");
        assert!(h.is_hot(5000, &at(Place::Cache(3), 4800), false), "200: very short");
        assert!(!h.is_hot(5000, &at(seg, 2900), true), "2100 since: cold, even after a hot version");
        assert!(h.is_hot(3, &at(seg, u32::MAX - 10), true), "the sequence wraps");
    }

    #[test]
    fn the_mean_follows_the_intervals_seen() {
        let h = Heat::new(1_000_000);
        for i in 0..100_000u32 {
            h.is_hot(i + 500, &at(Place::Segment(0), i), false);
        }
        assert!((500..520).contains(&h.mean()), "mean {} after 100,000 intervals of 500", h.mean());
    }
}
