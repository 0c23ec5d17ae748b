//! Request streams against the tiered volume, and the tags that let every read be checked.
//!
//! Every 4 KiB block the benchmark writes starts with its block number, a write generation and
//! a magic number. Per block the benchmark keeps the generation last *issued* and the last
//! *completed*; a read of a block must return a generation between the completed one loaded
//! before the read was sent and the issued one loaded after it returned (writes to one block
//! never overlap: each write stream owns its region, and a stream's requests in flight are
//! distinct). A block never written (zeros), another block's data or a stale version all fail
//! the check, so nothing can be fast by reading what was not written.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub(super) use stria_dev::BLOCK_BYTES as BLOCK;
use stria_dev::{BLOCK_USIZE, BlockDevice, IoBuf, IoBytes};
use stria_tier::log::LogVolume;

use crate::engine::hist::Histogram;

/// Bytes 12..16 of every block the benchmark writes.
const MAGIC: u32 = 0x5354_4254; // "TBTS"

/// Per-block generations, and the random filler of written blocks.
pub(super) struct Tags {
    issued: Box<[AtomicU32]>,
    completed: Box<[AtomicU32]>,
    filler: Vec<u8>,
}

impl Tags {
    pub(super) fn new(blocks: u64, max_req_bytes: usize) -> Tags {
        let mut filler = vec![0u8; max_req_bytes];
        Rng::new(0xf111).fill(&mut filler);
        let zeros = || (0..blocks).map(|_| AtomicU32::new(0)).collect();
        Tags { issued: zeros(), completed: zeros(), filler }
    }

    /// A payload for blocks `[first, first + n)` with the next generation of each, which is
    /// recorded as issued.
    fn payload(&self, first: u64, n: usize) -> IoBytes {
        let mut buf = IoBuf::for_overwrite(n * BLOCK_USIZE);
        buf.copy_from_slice(&self.filler[..n * BLOCK_USIZE]);
        for (i, block) in buf.chunks_exact_mut(BLOCK_USIZE).enumerate() {
            let b = first + i as u64;
            let g = self.issued[b as usize].load(Ordering::Acquire) + 1;
            self.issued[b as usize].store(g, Ordering::Release);
            block[..8].copy_from_slice(&b.to_le_bytes());
            block[8..12].copy_from_slice(&g.to_le_bytes());
            block[12..16].copy_from_slice(&MAGIC.to_le_bytes());
        }
        buf.freeze()
    }

    /// Records that the generations issued for `[first, first + n)` are written.
    fn complete(&self, first: u64, n: usize) {
        for b in first..first + n as u64 {
            let g = self.issued[b as usize].load(Ordering::Acquire);
            self.completed[b as usize].store(g, Ordering::Release);
        }
    }

    fn completed(&self, first: u64, n: usize) -> Vec<u32> {
        (first..first + n as u64).map(|b| self.completed[b as usize].load(Ordering::Acquire)).collect()
    }

    /// Checks a read of `[first, first + n)`; `low` from [`Tags::completed`] before the read.
    fn check(&self, buf: &[u8], first: u64, low: &[u32]) -> Result<(), String> {
        for (i, block) in buf.chunks_exact(BLOCK_USIZE).enumerate() {
            let b = first + i as u64;
            let word = |at: usize| u32::from_le_bytes(block[at..at + 4].try_into().expect("4 bytes"));
            let tag = u64::from_le_bytes(block[..8].try_into().expect("8 bytes"));
            let (generation, magic) = (word(8), word(12));
            let high = self.issued[b as usize].load(Ordering::Acquire);
            if magic != MAGIC || tag != b || generation < low[i] || generation > high {
                return Err(format!(
                    "block {b}: read tag {tag} generation {generation} magic {magic:#x}; expected block {b}, \
                     generation {}..={high}, magic {MAGIC:#x}",
                    low[i]
                ));
            }
        }
        Ok(())
    }
}

/// xorshift64*: cheap and good enough to pick addresses.
#[derive(Debug, Clone)]
pub(super) struct Rng(u64);

impl Rng {
    pub(super) fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next()) * u128::from(n)) >> 64) as u64
    }

    fn fill(&mut self, bytes: &mut [u8]) {
        for chunk in bytes.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

/// A sequential write stream over its own region of blocks; the cursor carries over from phase
/// to phase (so a stream keeps moving through its region instead of rewriting its start).
#[derive(Debug)]
pub(super) struct SeqRegion {
    pub(super) first_block: u64,
    pub(super) blocks: u64,
    cursor: AtomicU64,
}

impl SeqRegion {
    pub(super) fn new(first_block: u64, blocks: u64) -> Arc<SeqRegion> {
        Arc::new(SeqRegion { first_block, blocks, cursor: AtomicU64::new(0) })
    }

    /// The first block of the next request of `n` blocks.
    fn next(&self, n: u64) -> u64 {
        let slots = self.blocks / n;
        self.first_block + (self.cursor.fetch_add(1, Ordering::Relaxed) % slots) * n
    }
}

/// What a group of tasks does.
#[derive(Debug, Clone)]
pub(super) enum Job {
    /// Sequential writes of `req_bytes` through `region`.
    SeqWrite { region: Arc<SeqRegion> },
    /// Reads of `req_bytes` at random aligned offsets over the whole volume.
    RandRead,
}

/// Tasks doing one job: `streams` x `qd` tasks (a stream's tasks share its region's cursor).
#[derive(Debug, Clone)]
pub(super) struct Group {
    pub(super) jobs: Vec<Job>,
    pub(super) qd: usize,
    pub(super) req_bytes: usize,
}

/// What a group did.
#[derive(Debug, Clone)]
pub(super) struct GroupResult {
    pub(super) ops: u64,
    pub(super) bytes: u64,
    pub(super) hist: Histogram,
    pub(super) lat_sum_ns: u128,
    pub(super) lat_max_ns: u64,
    pub(super) errors: u64,
    pub(super) mismatches: u64,
    pub(super) first_error: Option<String>,
}

impl GroupResult {
    fn new() -> GroupResult {
        GroupResult {
            ops: 0,
            bytes: 0,
            hist: Histogram::new(),
            lat_sum_ns: 0,
            lat_max_ns: 0,
            errors: 0,
            mismatches: 0,
            first_error: None,
        }
    }

    fn merge(&mut self, o: GroupResult) {
        self.ops += o.ops;
        self.bytes += o.bytes;
        self.hist.merge(&o.hist);
        self.lat_sum_ns += o.lat_sum_ns;
        self.lat_max_ns = self.lat_max_ns.max(o.lat_max_ns);
        self.errors += o.errors;
        self.mismatches += o.mismatches;
        if self.first_error.is_none() {
            self.first_error = o.first_error;
        }
    }

    pub(super) fn mean_us(&self) -> f64 {
        if self.ops == 0 { f64::NAN } else { self.lat_sum_ns as f64 / self.ops as f64 / 1000.0 }
    }
}

/// How one request ended.
enum Outcome {
    Ok,
    /// The read returned data that is not what was written.
    Mismatch(String),
    /// The volume returned an error.
    Error(String),
}

/// Runs `groups` together for `duration` (each task finishes the request it has in flight at
/// the deadline); returns each group's result and the elapsed wall time. With `interleave`, a
/// task lets the others run after each request (memory drives complete requests without ever
/// suspending, so a task would otherwise keep its worker thread to itself).
pub(super) async fn run<D: BlockDevice>(
    vol: &Arc<LogVolume<D>>,
    tags: &Arc<Tags>,
    groups: &[Group],
    duration: Duration,
    interleave: bool,
    seed: u64,
) -> (Vec<GroupResult>, f64) {
    let start = Instant::now();
    let deadline = start + duration;
    let volume_blocks = vol.size_bytes() / BLOCK;
    let mut handles = Vec::new();
    for (g, group) in groups.iter().enumerate() {
        for (s, job) in group.jobs.iter().enumerate() {
            for q in 0..group.qd {
                let (vol, tags, job) = (Arc::clone(vol), Arc::clone(tags), job.clone());
                let n = group.req_bytes / BLOCK_USIZE;
                let mut rng = Rng::new(seed ^ ((g as u64) << 32 | (s as u64) << 16 | q as u64));
                handles.push((
                    g,
                    tokio::spawn(async move {
                        let mut r = GroupResult::new();
                        while Instant::now() < deadline {
                            let (outcome, latency) = match &job {
                                Job::SeqWrite { region } => {
                                    let first = region.next(n as u64);
                                    let data = tags.payload(first, n);
                                    let t0 = Instant::now();
                                    let res = vol.write(first * BLOCK, data, false).await;
                                    let latency = t0.elapsed();
                                    let outcome = match res {
                                        Ok(()) => {
                                            tags.complete(first, n);
                                            Outcome::Ok
                                        }
                                        Err(e) => Outcome::Error(e.to_string()),
                                    };
                                    (outcome, latency)
                                }
                                Job::RandRead => {
                                    let first = rng.below(volume_blocks / n as u64) * n as u64;
                                    let low = tags.completed(first, n);
                                    let t0 = Instant::now();
                                    let res = vol.read(first * BLOCK, n * BLOCK_USIZE).await;
                                    let latency = t0.elapsed();
                                    let outcome = match res {
                                        Ok(buf) => tags
                                            .check(&buf, first, &low)
                                            .map_or_else(Outcome::Mismatch, |()| Outcome::Ok),
                                        Err(e) => Outcome::Error(e.to_string()),
                                    };
                                    (outcome, latency)
                                }
                            };
                            let ns = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
                            r.hist.record(ns);
                            r.lat_sum_ns += u128::from(ns);
                            r.lat_max_ns = r.lat_max_ns.max(ns);
                            r.ops += 1;
                            r.bytes += n as u64 * BLOCK;
                            match outcome {
                                Outcome::Ok => {}
                                Outcome::Mismatch(why) => {
                                    r.mismatches += 1;
                                    r.first_error.get_or_insert(why);
                                }
                                Outcome::Error(why) => {
                                    r.errors += 1;
                                    r.first_error.get_or_insert(why);
                                }
                            }
                            if interleave {
                                tokio::task::yield_now().await;
                            }
                        }
                        r
                    }),
                ));
            }
        }
    }
    let mut results: Vec<GroupResult> = groups.iter().map(|_| GroupResult::new()).collect();
    for (g, h) in handles {
        match h.await {
            Ok(r) => results[g].merge(r),
            Err(e) => {
                results[g].errors += 1;
                results[g].first_error.get_or_insert(format!("a benchmark task failed: {e}"));
            }
        }
    }
    (results, start.elapsed().as_secs_f64())
}

/// Writes every block of the volume once (generation 1) with `streams` sequential streams of
/// `req_bytes`, `qd` each; returns the first error.
pub(super) async fn fill<D: BlockDevice>(
    vol: &Arc<LogVolume<D>>,
    tags: &Arc<Tags>,
    streams: usize,
    qd: usize,
    req_bytes: usize,
) -> Result<(), String> {
    let blocks = vol.size_bytes() / BLOCK;
    let n = (req_bytes / BLOCK_USIZE) as u64;
    let requests = blocks / n;
    let next = Arc::new(AtomicU64::new(0));
    let mut handles: Vec<tokio::task::JoinHandle<Result<(), String>>> = Vec::new();
    for _ in 0..streams * qd {
        let (vol, tags, next) = (Arc::clone(vol), Arc::clone(tags), Arc::clone(&next));
        handles.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i > requests {
                    return Ok(());
                }
                // The last request covers the tail that is not a whole request.
                let first = i * n;
                let count = if i == requests { blocks - first } else { n };
                if count == 0 {
                    return Ok(());
                }
                let data = tags.payload(first, count as usize);
                vol.write(first * BLOCK, data, false).await.map_err(|e| e.to_string())?;
                tags.complete(first, count as usize);
                tokio::task::yield_now().await;
            }
        }));
    }
    for h in handles {
        h.await.map_err(|e| e.to_string())??;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_must_return_the_block_and_a_current_generation() {
        let tags = Tags::new(64, 16 * BLOCK_USIZE);
        let low = tags.completed(8, 4);
        let first = tags.payload(8, 4);
        tags.complete(8, 4);
        // In flight: the old state (nothing) fails for lack of the magic; the new one passes.
        assert!(tags.check(&first, 8, &low).is_ok());
        assert!(tags.check(&vec![0u8; 4 * BLOCK_USIZE], 8, &low).is_err(), "never-written blocks");
        assert!(tags.check(&first, 9, &low).is_err(), "another block's data");
        // After a second write completed, the first version is stale.
        let low2 = tags.completed(8, 4);
        let second = tags.payload(8, 4);
        assert!(tags.check(&first, 8, &low2).is_ok(), "the old version while the new one is in flight");
        assert!(tags.check(&second, 8, &low2).is_ok(), "the new version while in flight");
        tags.complete(8, 4);
        let low3 = tags.completed(8, 4);
        assert!(tags.check(&first, 8, &low3).is_err(), "a stale version");
        assert!(tags.check(&second, 8, &low3).is_ok());
    }
}
