//! A fixed-size latency histogram: log-linear buckets (32 per power of two, so a reported
//! percentile is within ~3 % of the true value), no allocation while recording.

/// Sub-buckets per power of two.
const SUB_BITS: u32 = 5;
const SUB: usize = 1 << SUB_BITS;
/// Powers of two covered above the linear range: up to 2^(SUB_BITS + OCTAVES) ns (~9 minutes).
const OCTAVES: usize = 35;
const BUCKETS: usize = SUB * (OCTAVES + 1);

/// Counts of request latencies in nanoseconds.
#[derive(Clone)]
pub(crate) struct Histogram {
    counts: Box<[u64; BUCKETS]>,
    total: u64,
}

impl std::fmt::Debug for Histogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Histogram").field("total", &self.total).finish()
    }
}

impl Histogram {
    pub(crate) fn new() -> Histogram {
        Histogram { counts: Box::new([0; BUCKETS]), total: 0 }
    }

    fn index(ns: u64) -> usize {
        if ns < SUB as u64 {
            return ns as usize;
        }
        let top = 63 - ns.leading_zeros(); // >= SUB_BITS
        let octave = (top - SUB_BITS + 1) as usize;
        let sub = ((ns >> (top - SUB_BITS)) as usize) & (SUB - 1);
        (octave * SUB + sub).min(BUCKETS - 1)
    }

    /// The middle of bucket `i`, in ns.
    fn value(i: usize) -> f64 {
        if i < SUB {
            return i as f64;
        }
        let octave = i / SUB;
        let sub = (i % SUB) as u64;
        let shift = (octave - 1) as u32;
        let low = (SUB as u64 + sub) << shift;
        low as f64 + ((1u64 << shift) as f64 - 1.0) / 2.0
    }

    pub(crate) fn record(&mut self, ns: u64) {
        self.counts[Self::index(ns)] += 1;
        self.total += 1;
    }

    pub(crate) fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(other.counts.iter()) {
            *a += b;
        }
        self.total += other.total;
    }

    /// The `q` quantile (0..=1) in microseconds; NaN when empty.
    pub(crate) fn quantile_us(&self, q: f64) -> f64 {
        if self.total == 0 {
            return f64::NAN;
        }
        let rank = ((q * self.total as f64).ceil() as u64).clamp(1, self.total);
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Self::value(i) / 1000.0;
            }
        }
        f64::NAN
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotonic_and_close() {
        let mut last = 0;
        for ns in [0u64, 1, 31, 32, 33, 63, 64, 100, 1000, 4095, 4096, 1 << 20, 1 << 35] {
            let i = Histogram::index(ns);
            assert!(i >= last, "{ns}");
            last = i;
            let v = Histogram::value(i);
            assert!((v - ns as f64).abs() <= ns as f64 * 0.035 + 0.5, "{ns} -> {v}");
        }
    }

    #[test]
    fn quantiles_pick_the_right_rank() {
        let mut h = Histogram::new();
        for ns in 1..=1000u64 {
            h.record(ns * 1000);
        }
        assert!((h.quantile_us(0.5) - 500.0).abs() < 20.0);
        assert!((h.quantile_us(0.99) - 990.0).abs() < 35.0);
        let mut g = Histogram::new();
        g.merge(&h);
        assert_eq!(g.total, 1000);
    }
}
