//! What the NBD clients of each export see: requests, bytes, errors and latency per operation,
//! and requests in flight. Counted around the volume call in the export (one clock pair covers
//! every layer below), with sharded counters and histograms: no shared atomic per request
//! (docs/design/observability.md). Read by `/metrics`, `/api/v1/stats` and `stria iostat`.

use std::future::Future;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use stria_dev::histogram::{HISTOGRAM_BUCKETS, bucket_upper_ns};
use stria_dev::{Counter, Histogram, HistogramSnapshot};

/// The operations counted apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Read,
    Write,
    Flush,
    /// NBD_CMD_WRITE_ZEROES.
    Zero,
    /// NBD_CMD_TRIM.
    Trim,
}

impl Op {
    pub(crate) const ALL: [Op; 5] = [Op::Read, Op::Write, Op::Flush, Op::Zero, Op::Trim];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
            Op::Flush => "flush",
            Op::Zero => "write_zeroes",
            Op::Trim => "trim",
        }
    }
}

/// Counters of one operation.
#[derive(Debug, Default)]
struct OpStats {
    bytes: Counter,
    errors: Counter,
    /// Completed requests (failed ones too) by latency.
    latency: Histogram,
}

/// Counters of one export.
#[derive(Debug, Default)]
pub(crate) struct VolumeStats {
    ops: [OpStats; 5],
    started: Counter,
}

/// A point-in-time copy of one operation's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct OpSnapshot {
    /// Completed requests (the latency histogram's count).
    pub(crate) count: u64,
    pub(crate) bytes: u64,
    pub(crate) errors: u64,
    pub(crate) latency: HistogramSnapshot,
}

/// A point-in-time copy of one export's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct VolumeStatsSnapshot {
    pub(crate) name: String,
    /// Requests started and not yet answered.
    pub(crate) in_flight: u64,
    pub(crate) read: OpSnapshot,
    pub(crate) write: OpSnapshot,
    pub(crate) flush: OpSnapshot,
    pub(crate) write_zeroes: OpSnapshot,
    pub(crate) trim: OpSnapshot,
}

impl VolumeStatsSnapshot {
    pub(crate) fn op(&self, op: Op) -> &OpSnapshot {
        match op {
            Op::Read => &self.read,
            Op::Write => &self.write,
            Op::Flush => &self.flush,
            Op::Zero => &self.write_zeroes,
            Op::Trim => &self.trim,
        }
    }
}

/// `GET /api/v1/stats` and `stria iostat`: every export's counters, cumulative since start.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct StatsView {
    /// When the counters were read, Unix milliseconds.
    pub(crate) time_ms: u64,
    /// The exclusive upper bound of each latency bucket, nanoseconds (the last is unbounded).
    pub(crate) bucket_upper_ns: Vec<u64>,
    pub(crate) volumes: Vec<VolumeStatsSnapshot>,
    pub(crate) drives: Vec<DriveIo>,
}

/// One drive's I/O counters, cumulative since the pool was opened.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct DriveIo {
    pub(crate) id: u32,
    pub(crate) path: String,
    pub(crate) class: String,
    pub(crate) state: String,
    pub(crate) read_ops: u64,
    pub(crate) read_bytes: u64,
    pub(crate) write_ops: u64,
    pub(crate) write_bytes: u64,
    /// Latency of its reads and writes, and its queue (file drives time their requests).
    #[serde(default)]
    pub(crate) latency: stria_dev::DevLatency,
}

impl StatsView {
    /// `latency` gives each drive's latency by id.
    pub(crate) fn new(
        volumes: Vec<VolumeStatsSnapshot>,
        drives: Vec<stria_engine::DriveStatus>,
        latency: impl Fn(u32) -> stria_dev::DevLatency,
    ) -> StatsView {
        let drives = drives
            .into_iter()
            .map(|d| DriveIo {
                latency: latency(d.id),
                id: d.id,
                path: d.path,
                class: d.class,
                state: d.state,
                read_ops: d.read_ops,
                read_bytes: d.bytes_read,
                write_ops: d.write_ops,
                write_bytes: d.bytes_written,
            })
            .collect();
        let time_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        StatsView {
            time_ms,
            bucket_upper_ns: (0..HISTOGRAM_BUCKETS).map(bucket_upper_ns).collect(),
            volumes,
            drives,
        }
    }
}

impl VolumeStats {
    fn of(&self, op: Op) -> &OpStats {
        &self.ops[op as usize]
    }

    /// Runs `request` (an `op` of `bytes`), counting it in flight until it completes.
    pub(crate) async fn count<T, E>(
        &self,
        op: Op,
        bytes: u64,
        request: impl Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        self.started.fetch_add(1, Relaxed);
        let start = Instant::now();
        let result = request.await;
        let ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let stats = self.of(op);
        if result.is_ok() {
            stats.bytes.fetch_add(bytes, Relaxed);
        } else {
            stats.errors.fetch_add(1, Relaxed);
        }
        // Recorded last: a reader that sees the completion in the histogram sees it counted.
        stats.latency.record(ns);
        result
    }

    pub(crate) fn snapshot(&self, name: &str) -> VolumeStatsSnapshot {
        let op = |op: Op| {
            let s = self.of(op);
            let latency = s.latency.snapshot();
            OpSnapshot {
                count: latency.count,
                bytes: s.bytes.load(Relaxed),
                errors: s.errors.load(Relaxed),
                latency,
            }
        };
        let (read, write, flush, write_zeroes, trim) =
            (op(Op::Read), op(Op::Write), op(Op::Flush), op(Op::Zero), op(Op::Trim));
        // Completions were read first, so this is never below the true value by their count.
        let done = read.count + write.count + flush.count + write_zeroes.count + trim.count;
        let in_flight = self.started.load(Relaxed).saturating_sub(done);
        VolumeStatsSnapshot { name: name.to_string(), in_flight, read, write, flush, write_zeroes, trim }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn requests_are_counted_by_op_with_their_latency_and_errors() {
        let s = VolumeStats::default();
        s.count(Op::Write, 4096, async { Ok::<_, ()>(()) }).await.expect("ok");
        s.count(Op::Write, 4096, async { Err::<(), _>(()) }).await.expect_err("err");
        s.count(Op::Read, 8192, async {
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
            Ok::<_, ()>(())
        })
        .await
        .expect("ok");
        let snap = s.snapshot("v");
        assert_eq!((snap.write.count, snap.write.bytes, snap.write.errors), (2, 4096, 1));
        assert_eq!((snap.read.count, snap.read.bytes), (1, 8192));
        assert!(snap.read.latency.sum_ns >= 2_000_000);
        assert!(snap.read.latency.quantile_ns(1.0).expect("one") >= 2_000_000);
        assert_eq!(snap.in_flight, 0);
        assert_eq!(snap.flush, OpSnapshot::default());
    }
}
