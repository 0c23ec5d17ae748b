//! Per-drive counters: the raw material of write-amplification figures; and [`Counter`], the
//! sharded counter every per-request statistic uses.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering, Ordering::Relaxed};

use crate::histogram::{Histogram, HistogramSnapshot};

/// Slots of a [`Counter`]: threads spread over them, so two cores rarely write one cache line.
pub(crate) const SHARDS: usize = 16;

/// One slot on a cache line of its own.
#[derive(Debug, Default)]
#[repr(align(64))]
struct Slot(AtomicU64);

static NEXT_SHARD: AtomicUsize = AtomicUsize::new(0);

/// This thread's shard of every sharded statistic.
pub(crate) fn shard_index() -> usize {
    SHARD.with(|s| *s)
}

thread_local! {
    /// This thread's slot, taken round-robin at its first count (a runtime worker keeps it).
    static SHARD: usize = NEXT_SHARD.fetch_add(1, Relaxed) % SHARDS;
}

/// A statistics counter without a shared atomic per update (docs/design/observability.md): each
/// thread adds to its own slot, a reader sums the slots. Updates are relaxed; a sum taken while
/// others count is some value between the counts before and after them. The methods mirror
/// `AtomicU64`'s so the two are interchangeable at call sites (the ordering is always relaxed).
#[derive(Debug, Default)]
pub struct Counter {
    slots: [Slot; SHARDS],
}

impl Counter {
    /// Adds `v`; returns nothing useful (0), unlike `AtomicU64::fetch_add`.
    pub fn fetch_add(&self, v: u64, _order: Ordering) -> u64 {
        self.slots[shard_index()].0.fetch_add(v, Relaxed);
        0
    }

    /// The sum of every slot.
    pub fn load(&self, _order: Ordering) -> u64 {
        self.slots.iter().map(|s| s.0.load(Relaxed)).fold(0, u64::wrapping_add)
    }
}

/// Number of buckets in the write-size histogram: bucket `i` counts writes of
/// `[2^(12+i), 2^(13+i))` bytes, the first bucket also everything below 8 KiB and the last
/// everything from 64 MiB up.
pub const WRITE_SIZE_BUCKETS: usize = 15;

/// Counters of one device. All updates are relaxed: they are statistics, not state.
#[derive(Debug, Default)]
pub struct DevCounters {
    read_ops: Counter,
    read_bytes: Counter,
    write_ops: Counter,
    write_bytes: Counter,
    flush_ops: Counter,
    discard_ops: Counter,
    errors: Counter,
    repairs: Counter,
    write_size_hist: [Counter; WRITE_SIZE_BUCKETS],
    /// Completed reads and writes by latency (devices that time their requests: file drives).
    read_latency: Histogram,
    write_latency: Histogram,
    /// Requests made and requests ended (completed, failed or dropped): the difference is the
    /// queue.
    started: Counter,
    ended: Counter,
}

/// A point-in-time copy of a device's latency histograms and queue.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DevLatency {
    pub read: HistogramSnapshot,
    pub write: HistogramSnapshot,
    /// Requests made and not yet ended.
    pub in_flight: u64,
}

/// A point-in-time copy of [`DevCounters`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DevCountersSnapshot {
    pub read_ops: u64,
    pub read_bytes: u64,
    pub write_ops: u64,
    pub write_bytes: u64,
    pub flush_ops: u64,
    pub discard_ops: u64,
    pub errors: u64,
    /// Blocks found corrupt (checksum mismatch or read error) and rewritten from redundancy.
    pub repairs: u64,
    pub write_size_hist: [u64; WRITE_SIZE_BUCKETS],
}

impl DevCounters {
    /// Counts one completed read of `len_bytes`.
    pub fn record_read(&self, len_bytes: u64) {
        self.read_ops.fetch_add(1, Relaxed);
        self.read_bytes.fetch_add(len_bytes, Relaxed);
    }

    /// Counts one completed write of `len_bytes`.
    pub fn record_write(&self, len_bytes: u64) {
        self.write_ops.fetch_add(1, Relaxed);
        self.write_bytes.fetch_add(len_bytes, Relaxed);
        self.write_size_hist[write_size_bucket(len_bytes)].fetch_add(1, Relaxed);
    }

    /// Counts one completed flush.
    pub fn record_flush(&self) {
        self.flush_ops.fetch_add(1, Relaxed);
    }

    /// Counts one completed discard.
    pub fn record_discard(&self) {
        self.discard_ops.fetch_add(1, Relaxed);
    }

    /// Records the latency of one completed read.
    pub fn record_read_latency(&self, ns: u64) {
        self.read_latency.record(ns);
    }

    /// Records the latency of one completed write.
    pub fn record_write_latency(&self, ns: u64) {
        self.write_latency.record(ns);
    }

    /// Counts a request made (its end is counted by [`DevCounters::record_end`]).
    pub fn record_start(&self) {
        self.started.fetch_add(1, Relaxed);
    }

    /// Counts a request ended, whatever its outcome.
    pub fn record_end(&self) {
        self.ended.fetch_add(1, Relaxed);
    }

    /// The latency histograms and the queue now.
    pub fn latency(&self) -> DevLatency {
        // Ends are read first: the queue is never below the true value by their count.
        let ended = self.ended.load(Relaxed);
        DevLatency {
            read: self.read_latency.snapshot(),
            write: self.write_latency.snapshot(),
            in_flight: self.started.load(Relaxed).saturating_sub(ended),
        }
    }

    /// Counts one failed request.
    pub fn record_error(&self) {
        self.errors.fetch_add(1, Relaxed);
    }

    /// Counts `blocks` repaired from redundancy.
    pub fn record_repairs(&self, blocks: u64) {
        self.repairs.fetch_add(blocks, Relaxed);
    }

    /// Copies the current values.
    pub fn snapshot(&self) -> DevCountersSnapshot {
        DevCountersSnapshot {
            read_ops: self.read_ops.load(Relaxed),
            read_bytes: self.read_bytes.load(Relaxed),
            write_ops: self.write_ops.load(Relaxed),
            write_bytes: self.write_bytes.load(Relaxed),
            flush_ops: self.flush_ops.load(Relaxed),
            discard_ops: self.discard_ops.load(Relaxed),
            errors: self.errors.load(Relaxed),
            repairs: self.repairs.load(Relaxed),
            write_size_hist: std::array::from_fn(|i| self.write_size_hist[i].load(Relaxed)),
        }
    }
}

impl DevCountersSnapshot {
    /// Counter-by-counter difference `self - earlier` (saturating), for per-run figures.
    pub fn since(&self, earlier: &DevCountersSnapshot) -> DevCountersSnapshot {
        DevCountersSnapshot {
            read_ops: self.read_ops.saturating_sub(earlier.read_ops),
            read_bytes: self.read_bytes.saturating_sub(earlier.read_bytes),
            write_ops: self.write_ops.saturating_sub(earlier.write_ops),
            write_bytes: self.write_bytes.saturating_sub(earlier.write_bytes),
            flush_ops: self.flush_ops.saturating_sub(earlier.flush_ops),
            discard_ops: self.discard_ops.saturating_sub(earlier.discard_ops),
            errors: self.errors.saturating_sub(earlier.errors),
            repairs: self.repairs.saturating_sub(earlier.repairs),
            write_size_hist: std::array::from_fn(|i| {
                self.write_size_hist[i].saturating_sub(earlier.write_size_hist[i])
            }),
        }
    }

    /// Adds another snapshot into this one (for totals over several drives).
    pub fn add(&mut self, other: &DevCountersSnapshot) {
        self.read_ops += other.read_ops;
        self.read_bytes += other.read_bytes;
        self.write_ops += other.write_ops;
        self.write_bytes += other.write_bytes;
        self.flush_ops += other.flush_ops;
        self.discard_ops += other.discard_ops;
        self.errors += other.errors;
        self.repairs += other.repairs;
        for (mine, theirs) in self.write_size_hist.iter_mut().zip(other.write_size_hist) {
            *mine += theirs;
        }
    }
}

/// The histogram bucket of a write of `len_bytes` (see [`WRITE_SIZE_BUCKETS`]).
pub fn write_size_bucket(len_bytes: u64) -> usize {
    let log2 = 63 - len_bytes.max(1).leading_zeros() as usize;
    log2.saturating_sub(12).min(WRITE_SIZE_BUCKETS - 1)
}

/// Lower bound in bytes of histogram bucket `bucket`.
pub fn write_size_bucket_floor_bytes(bucket: usize) -> u64 {
    if bucket == 0 { 0 } else { 1u64 << (12 + bucket) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_counter_sums_what_every_thread_added() {
        let c = std::sync::Arc::new(Counter::default());
        let threads: Vec<_> = (0..40u64)
            .map(|t| {
                let c = std::sync::Arc::clone(&c);
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        c.fetch_add(t, Relaxed);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("thread");
        }
        assert_eq!(c.load(Relaxed), 1000 * (0..40).sum::<u64>());
        // 40 threads over 16 slots: more than one slot was written.
        assert!(c.slots.iter().filter(|s| s.0.load(Relaxed) > 0).count() > 1);
        assert_eq!(std::mem::align_of::<Slot>(), 64, "each slot on a cache line of its own");
    }

    #[test]
    fn buckets_are_powers_of_two_from_4k() {
        assert_eq!(write_size_bucket(512), 0);
        assert_eq!(write_size_bucket(4096), 0);
        assert_eq!(write_size_bucket(8191), 0);
        assert_eq!(write_size_bucket(8192), 1);
        assert_eq!(write_size_bucket(128 * 1024), 5);
        assert_eq!(write_size_bucket(1 << 40), WRITE_SIZE_BUCKETS - 1);
        assert_eq!(write_size_bucket_floor_bytes(5), 128 * 1024);
    }

    #[test]
    fn snapshots_subtract_and_add() {
        let c = DevCounters::default();
        c.record_write(4096);
        let first = c.snapshot();
        c.record_write(131072);
        c.record_read(4096);
        let delta = c.snapshot().since(&first);
        assert_eq!(delta.write_ops, 1);
        assert_eq!(delta.write_bytes, 131072);
        assert_eq!(delta.read_ops, 1);
        assert_eq!(delta.write_size_hist[5], 1);
        let mut total = first;
        total.add(&delta);
        assert_eq!(total, c.snapshot());
    }
}
