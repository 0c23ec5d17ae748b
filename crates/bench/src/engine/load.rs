//! The workload driver: `qd` tasks issuing requests against a [`Target`] (raw drives or a
//! volume) until a deadline, each timing its own requests.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use stria_dev::{DevCountersSnapshot, IoBytes};

use super::hist::Histogram;

/// First 8 bytes of every block the benchmark writes during measurements: reads accept it in
/// place of the block's own tag (see [`Target::read`]).
pub(super) const ANY_TAG: u64 = u64::MAX;

/// Something requests go to: the raw drives, or a volume over the same number of drives.
///
/// Offsets are in a linear byte space of [`Target::span_bytes`]. Every block the rig writes
/// carries an 8-byte tag naming its address; a read checks the tag of every block it returns
/// (the same few compares on both sides), so a benchmark that read zeros or the wrong block
/// would fail instead of reporting a fast number.
pub(super) trait Target: Send + Sync + 'static {
    /// Bytes addressable by the workload.
    fn span_bytes(&self) -> u64;
    /// Reads `len` bytes at `offset` and checks the block tags.
    fn read(&self, offset: u64, len: usize) -> impl Future<Output = Result<(), String>> + Send;
    /// Writes `data` at `offset`.
    fn write(&self, offset: u64, data: IoBytes) -> impl Future<Output = Result<(), String>> + Send;
    /// Counters of the drives, summed.
    fn drive_counters(&self) -> DevCountersSnapshot;
}

/// Checks the tag of each 4 KiB block of `buf` against `expected(block index in buf)`.
pub(super) fn check_tags(buf: &[u8], expected: impl Fn(u64) -> u64) -> Result<(), String> {
    for (i, block) in buf.chunks_exact(4096).enumerate() {
        let tag = u64::from_le_bytes(block[..8].try_into().expect("8 bytes"));
        let want = expected(i as u64);
        if tag != want && tag != ANY_TAG {
            return Err(format!("block {i} of a read has tag {tag:#x}, expected {want:#x}"));
        }
    }
    Ok(())
}

/// Where the requests of a workload go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Pattern {
    /// Uniformly random, aligned to the request size.
    Random,
    /// Consecutive requests (shared cursor, so `qd` of them are in flight in order).
    Sequential,
}

/// One workload.
#[derive(Clone, Debug)]
pub(super) struct Workload {
    pub(super) pattern: Pattern,
    pub(super) write: bool,
    pub(super) req_bytes: usize,
    pub(super) qd: usize,
    pub(super) sample: Duration,
    /// Let the other tasks run after every request (so `qd` requests interleave on a thread).
    pub(super) interleave: bool,
}

/// What one sample measured.
#[derive(Debug, Clone)]
pub(super) struct Sample {
    pub(super) ops: u64,
    pub(super) wall_s: f64,
    pub(super) cpu_s: f64,
    pub(super) hist: Histogram,
    pub(super) drives: DevCountersSnapshot,
    pub(super) first_error: Option<String>,
    pub(super) errors: u64,
}

/// Pre-built write payloads (every block tagged [`ANY_TAG`], the rest pseudo-random), cloned
/// per request without copying.
pub(super) struct Payloads {
    bufs: Vec<IoBytes>,
}

impl Payloads {
    pub(super) fn new(req_bytes: usize, count: usize, seed: u64) -> Payloads {
        let mut rng = Rng::new(seed);
        let bufs = (0..count)
            .map(|_| {
                let mut bytes = vec![0u8; req_bytes];
                rng.fill(&mut bytes);
                for block in bytes.chunks_exact_mut(4096) {
                    block[..8].copy_from_slice(&ANY_TAG.to_le_bytes());
                }
                IoBytes::copy_from(&bytes)
            })
            .collect();
        Payloads { bufs }
    }

    pub(super) fn pick(&self, rng: &mut Rng) -> IoBytes {
        self.bufs[rng.below(self.bufs.len() as u64) as usize].clone()
    }
}

/// xorshift64*: cheap and good enough to pick addresses.
#[derive(Debug, Clone)]
pub(super) struct Rng(u64);

impl Rng {
    pub(super) fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub(super) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n` (multiply-shift, no division).
    pub(super) fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next()) * u128::from(n)) >> 64) as u64
    }

    pub(super) fn fill(&mut self, bytes: &mut [u8]) {
        for chunk in bytes.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

/// Runs one sample of `load` against `target`. `cursor` carries the sequential position from
/// sample to sample.
pub(super) async fn run_sample<T: Target>(
    target: &Arc<T>,
    load: &Workload,
    payloads: &Arc<Payloads>,
    cursor: &Arc<AtomicU64>,
    seed: u64,
) -> Sample {
    let slots = target.span_bytes() / load.req_bytes as u64;
    assert!(slots > 0, "target smaller than one request");
    let before = target.drive_counters();
    let cpu = cpu_time::ProcessTime::now();
    let start = Instant::now();
    let deadline = start + load.sample;
    let tasks: Vec<_> = (0..load.qd)
        .map(|t| {
            let target = Arc::clone(target);
            let payloads = Arc::clone(payloads);
            let cursor = Arc::clone(cursor);
            let load = load.clone();
            let mut rng = Rng::new(seed.wrapping_mul(1000).wrapping_add(t as u64 + 1));
            tokio::spawn(async move {
                let mut hist = Histogram::new();
                let (mut ops, mut errors, mut first_error) = (0u64, 0u64, None);
                let req = load.req_bytes as u64;
                let mut now = Instant::now();
                while now < deadline {
                    let slot = match load.pattern {
                        Pattern::Random => rng.below(slots),
                        Pattern::Sequential => cursor.fetch_add(1, Relaxed) % slots,
                    };
                    let result = if load.write {
                        target.write(slot * req, payloads.pick(&mut rng)).await
                    } else {
                        target.read(slot * req, load.req_bytes).await
                    };
                    let end = Instant::now();
                    hist.record(u64::try_from((end - now).as_nanos()).unwrap_or(u64::MAX));
                    ops += 1;
                    if let Err(e) = result {
                        errors += 1;
                        first_error.get_or_insert(e);
                    }
                    now = end;
                    if load.interleave {
                        tokio::task::yield_now().await;
                        now = Instant::now();
                    }
                }
                (hist, ops, errors, first_error)
            })
        })
        .collect();
    let mut sample = Sample {
        ops: 0,
        wall_s: 0.0,
        cpu_s: 0.0,
        hist: Histogram::new(),
        drives: DevCountersSnapshot::default(),
        first_error: None,
        errors: 0,
    };
    for task in tasks {
        let (hist, ops, errors, first_error) = task.await.expect("benchmark task panicked");
        sample.hist.merge(&hist);
        sample.ops += ops;
        sample.errors += errors;
        if sample.first_error.is_none() {
            sample.first_error = first_error;
        }
    }
    sample.wall_s = start.elapsed().as_secs_f64();
    sample.cpu_s = cpu.elapsed().as_secs_f64();
    sample.drives = target.drive_counters().since(&before);
    sample
}
