//! [`Histogram`]: a latency histogram without a shared atomic per sample, for the metrics of
//! docs/design/observability.md. Like [`crate::Counter`], each thread records into a shard of
//! its own (one row of buckets, cache-line aligned) and a reader sums the rows.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::counters::shard_index;

/// Sub-buckets per power of two: a bucket's upper bound is at most 25 % above its lower bound.
const SUB_BUCKETS: usize = 4;
/// Powers of two covered above the first bucket: 2^10 ns (about 1 µs) to 2^34 ns (about 17 s).
const OCTAVES: usize = 24;
/// The smallest power of two with buckets of its own (values below 2^10 ns share bucket 0).
const FIRST_OCTAVE_LOG2: u32 = 10;
/// Buckets of a histogram: bucket 0 below 1024 ns, then 4 per power of two, the last one also
/// everything from 2^34 ns up.
pub const HISTOGRAM_BUCKETS: usize = 1 + OCTAVES * SUB_BUCKETS;
/// Shards of a histogram (as many as a [`crate::Counter`] has).
const SHARDS: usize = crate::counters::SHARDS;

/// One shard's buckets, count and sum, on cache lines no other shard uses.
#[derive(Debug)]
#[repr(align(64))]
struct Row {
    buckets: [AtomicU64; HISTOGRAM_BUCKETS],
    sum_ns: AtomicU64,
}

impl Default for Row {
    fn default() -> Row {
        Row { buckets: std::array::from_fn(|_| AtomicU64::new(0)), sum_ns: AtomicU64::new(0) }
    }
}

/// Latencies in nanoseconds, log-linear buckets (see [`HISTOGRAM_BUCKETS`]). About 12.6 KiB.
#[derive(Debug)]
pub struct Histogram {
    rows: Box<[Row; SHARDS]>,
}

impl Default for Histogram {
    fn default() -> Histogram {
        Histogram { rows: Box::new(std::array::from_fn(|_| Row::default())) }
    }
}

/// A point-in-time copy of a [`Histogram`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HistogramSnapshot {
    /// Samples per bucket (see [`bucket_upper_ns`]).
    pub buckets: Vec<u64>,
    /// Samples in all.
    pub count: u64,
    /// Sum of the samples, nanoseconds.
    pub sum_ns: u64,
}

impl Default for HistogramSnapshot {
    fn default() -> HistogramSnapshot {
        HistogramSnapshot { buckets: vec![0; HISTOGRAM_BUCKETS], count: 0, sum_ns: 0 }
    }
}

/// The bucket of a sample of `ns` nanoseconds.
pub fn bucket_of(ns: u64) -> usize {
    if ns < 1 << FIRST_OCTAVE_LOG2 {
        return 0;
    }
    let log2 = 63 - ns.leading_zeros();
    let octave = (log2 - FIRST_OCTAVE_LOG2) as usize;
    if octave >= OCTAVES {
        return HISTOGRAM_BUCKETS - 1;
    }
    // The two bits below the leading one pick the sub-bucket.
    let sub = ((ns >> (log2 - 2)) & 3) as usize;
    1 + octave * SUB_BUCKETS + sub
}

/// The exclusive upper bound of bucket `bucket`, in nanoseconds (`u64::MAX` for the last).
pub fn bucket_upper_ns(bucket: usize) -> u64 {
    if bucket == 0 {
        return 1 << FIRST_OCTAVE_LOG2;
    }
    if bucket >= HISTOGRAM_BUCKETS - 1 {
        return u64::MAX;
    }
    let octave = (bucket - 1) / SUB_BUCKETS;
    let sub = ((bucket - 1) % SUB_BUCKETS) as u64;
    let base = 1u64 << (FIRST_OCTAVE_LOG2 as usize + octave);
    base + (base / 4) * (sub + 1)
}

impl Histogram {
    /// Records one sample of `ns` nanoseconds.
    pub fn record(&self, ns: u64) {
        let row = &self.rows[shard_index()];
        row.buckets[bucket_of(ns)].fetch_add(1, Relaxed);
        row.sum_ns.fetch_add(ns, Relaxed);
    }

    /// Sums the shards. Taken while others record, the buckets and the sum may disagree by the
    /// samples in flight; the count is the sum of the buckets.
    pub fn snapshot(&self) -> HistogramSnapshot {
        let mut s = HistogramSnapshot::default();
        for row in self.rows.iter() {
            for (total, b) in s.buckets.iter_mut().zip(&row.buckets) {
                *total = total.wrapping_add(b.load(Relaxed));
            }
            s.sum_ns = s.sum_ns.wrapping_add(row.sum_ns.load(Relaxed));
        }
        s.count = s.buckets.iter().sum();
        s
    }
}

impl HistogramSnapshot {
    /// Samples at or below `le_ns`, counted in whole buckets: exact when `le_ns` is a bucket
    /// bound ([`bucket_upper_ns`] minus one, or a power of two from 2^10 ns up).
    pub fn count_below(&self, bound_ns: u64) -> u64 {
        self.buckets
            .iter()
            .enumerate()
            .take_while(|(i, _)| bucket_upper_ns(*i) <= bound_ns)
            .map(|(_, c)| c)
            .sum()
    }

    /// The `q` quantile (0..=1), as the upper bound of the bucket it falls in (at most 25 % high);
    /// `None` without samples.
    pub fn quantile_ns(&self, q: f64) -> Option<u64> {
        if self.count == 0 {
            return None;
        }
        // The rank of the sample wanted, 1-based: at least the first.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, clippy::cast_precision_loss)]
        let rank = ((q.clamp(0.0, 1.0) * self.count as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, c) in self.buckets.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Some(bucket_upper_ns(i).min(1 << 40));
            }
        }
        None
    }

    /// Bucket-by-bucket difference `self - earlier` (for rates between two samples).
    pub fn since(&self, earlier: &HistogramSnapshot) -> HistogramSnapshot {
        let buckets: Vec<u64> =
            self.buckets.iter().zip(&earlier.buckets).map(|(a, b)| a.saturating_sub(*b)).collect();
        HistogramSnapshot {
            count: buckets.iter().sum(),
            buckets,
            sum_ns: self.sum_ns.saturating_sub(earlier.sum_ns),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_falls_in_the_bucket_whose_bounds_hold_it() {
        let mut ns = 1u64;
        while ns < 1 << 36 {
            for v in [ns - 1, ns, ns + ns / 3, ns + ns / 2] {
                let b = bucket_of(v);
                assert!(v < bucket_upper_ns(b), "{v} below the upper bound of bucket {b}");
                if b > 0 {
                    assert!(v >= bucket_upper_ns(b - 1), "{v} at or above bucket {}'s bound", b - 1);
                }
            }
            ns *= 2;
        }
        assert_eq!(bucket_of(u64::MAX), HISTOGRAM_BUCKETS - 1);
        // Upper bounds rise and stay within 25 % of the lower bound.
        for b in 2..HISTOGRAM_BUCKETS - 1 {
            let (lo, hi) = (bucket_upper_ns(b - 1), bucket_upper_ns(b));
            assert!(hi > lo && (hi - lo) * 4 <= lo, "bucket {b}: {lo}..{hi}");
        }
    }

    #[test]
    fn snapshots_count_sum_and_quantiles() {
        let h = std::sync::Arc::new(Histogram::default());
        let threads: Vec<_> = (0..8u64)
            .map(|t| {
                let h = std::sync::Arc::clone(&h);
                std::thread::spawn(move || {
                    for i in 0..1000 {
                        // 90 % at about 10 µs, 10 % at about 1 ms.
                        h.record(if (i + t) % 10 == 0 { 1_000_000 } else { 10_000 });
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("thread");
        }
        let s = h.snapshot();
        assert_eq!(s.count, 8000);
        assert_eq!(s.sum_ns, 7200 * 10_000 + 800 * 1_000_000);
        let p50 = s.quantile_ns(0.5).expect("samples");
        let p99 = s.quantile_ns(0.99).expect("samples");
        assert!((10_000..=12_500).contains(&p50), "p50 {p50}");
        assert!((1_000_000..=1_250_000).contains(&p99), "p99 {p99}");
        assert_eq!(s.count_below(1 << 14), 7200, "10 µs samples are below 16.4 µs");
        assert_eq!(s.count_below(u64::MAX - 1), 8000);
        let later = {
            h.record(5_000);
            h.snapshot()
        };
        let d = later.since(&s);
        assert_eq!((d.count, d.sum_ns), (1, 5_000));
        assert_eq!(HistogramSnapshot::default().quantile_ns(0.5), None);
    }
}
