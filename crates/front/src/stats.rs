//! What the clients of each volume see: requests, bytes, errors and latency per operation, and
//! requests in flight. Counted around the volume call by the [`crate::Attachment`] a front end
//! holds (one clock pair covers every layer below), with sharded counters and histograms: no
//! shared atomic per request (docs/design/observability.md). Read by `/metrics`,
//! `/api/v1/stats` and `stria iostat`.

use std::future::Future;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use stria_dev::{Counter, Histogram, HistogramSnapshot};

/// The operations counted apart. Their names are those of NBD (and of the metrics); the other
/// protocols' commands count as the one they are (SCSI WRITE SAME of zeros is a `Zero`, UNMAP a
/// `Trim`, COMPARE AND WRITE a `Write`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// A read.
    Read,
    /// A write.
    Write,
    /// A flush (every completed write made durable).
    Flush,
    /// NBD_CMD_WRITE_ZEROES.
    Zero,
    /// NBD_CMD_TRIM (a discard).
    Trim,
}

impl Op {
    /// Every operation, in the order the metrics list them.
    pub const ALL: [Op; 5] = [Op::Read, Op::Write, Op::Flush, Op::Zero, Op::Trim];

    /// The operation's name in the metrics (`op` label) and the stats view.
    pub fn name(self) -> &'static str {
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

/// Counters of one volume (shared by every client of it).
#[derive(Debug, Default)]
pub struct VolumeStats {
    ops: [OpStats; 5],
    started: Counter,
}

/// A point-in-time copy of one operation's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpSnapshot {
    /// Completed requests (the latency histogram's count).
    pub count: u64,
    /// Bytes of the requests completed without error.
    pub bytes: u64,
    /// Requests answered with an error.
    pub errors: u64,
    /// Completed requests by latency.
    pub latency: HistogramSnapshot,
}

/// A point-in-time copy of one volume's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeStatsSnapshot {
    /// The volume's name as served.
    pub name: String,
    /// Requests started and not yet answered.
    pub in_flight: u64,
    /// Reads.
    pub read: OpSnapshot,
    /// Writes.
    pub write: OpSnapshot,
    /// Flushes.
    pub flush: OpSnapshot,
    /// Zeroing.
    pub write_zeroes: OpSnapshot,
    /// Discards.
    pub trim: OpSnapshot,
}

impl VolumeStatsSnapshot {
    /// The counters of `op`.
    pub fn op(&self, op: Op) -> &OpSnapshot {
        match op {
            Op::Read => &self.read,
            Op::Write => &self.write,
            Op::Flush => &self.flush,
            Op::Zero => &self.write_zeroes,
            Op::Trim => &self.trim,
        }
    }
}

impl VolumeStats {
    fn of(&self, op: Op) -> &OpStats {
        &self.ops[op as usize]
    }

    /// Runs `request` (an `op` of `bytes`), counting it in flight until it completes.
    pub async fn count<T, E>(
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

    /// The counters now, under the volume's `name`.
    pub fn snapshot(&self, name: &str) -> VolumeStatsSnapshot {
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

    #[test]
    fn every_op_has_its_own_counters_and_name() {
        let names: std::collections::BTreeSet<_> = Op::ALL.iter().map(|op| op.name()).collect();
        assert_eq!(names.len(), Op::ALL.len());
        for (i, op) in Op::ALL.into_iter().enumerate() {
            assert_eq!(op as usize, i, "Op::ALL is in index order");
        }
    }
}
