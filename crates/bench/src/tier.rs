//! `cargo run --release -p stria-bench --bin stria-bench-tier --`: seed 000's proof-of-concept
//! tests, reproduced in-process on a `tiered:ec:4+2` volume over 2 fast + 6 capacity drives
//! (memory-backed files on tmpfs by default), with destage running all the time as the seed's
//! was.
//!
//! Phases, each `--seconds` long, repeated `--reps` times (medians are reported):
//! 1. one sequential 512 KiB write stream;
//! 2. `--streams` sequential 512 KiB write streams, each in its own region;
//! 3. `--streams` 4 KiB random read streams (after destage drained: reads come from the capacity
//!    tier);
//! 4. `--streams` 64 KiB random read streams;
//! 5. the same with one sequential 512 KiB write stream beside them;
//! 6. one 4 KiB random read at a time, idle and then beside one sequential write stream.
//!
//! Each stream keeps `--qd` requests in flight (default 1: the seed's "threads"). Before every
//! phase destage drains the cache; after the timed part the benchmark waits for destage again and
//! only then reads the counters, so a phase's drive bytes are exactly what its host writes cost.
//! The volume is filled first, and every read is checked against what was written (see
//! `tier/load.rs`).

// Counts, sizes and block numbers are u64 and index in-memory tables on 64-bit Linux (the only
// target), and latency quantiles round floats: truncation cannot happen in practice.
#![allow(clippy::cast_possible_truncation)]

mod load;
mod report;
mod rig;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use stria_dev::mem::MemDevice;
use stria_dev::{BlockDevice, FileDevice, FileOptions};

use crate::host::loadavg;

use crate::ec::parse_bytes;
use load::{BLOCK, Group, GroupResult, Job, SeqRegion, Tags};
use rig::{Region, Rig, Shape, Snapshot, TempDir, writes_at_least};

const DATA_SHARDS: u32 = 4;
const PARITY_SHARDS: u32 = 2;
/// Request sizes of the seed's tests.
const SEQ_BYTES: usize = 512 << 10;
const SMALL_READ_BYTES: usize = 4 << 10;
const LARGE_READ_BYTES: usize = 64 << 10;
/// The size goal for capacity drive writes.
const GOAL_MIN_DRIVE_WRITE: u64 = 128 << 10;
/// Longest wait for destage to drain the cache.
const DRAIN_LIMIT: Duration = Duration::from_secs(300);
/// Interval of the write-amplification time series of the write phases.
const SAMPLE_EVERY: Duration = Duration::from_millis(100);

/// Where the drives live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Drives {
    /// `FileDevice` files in a fresh directory under `--dir` (tmpfs: memory-backed files),
    /// removed at the end.
    File,
    /// `MemDevice` memory drives.
    Memory,
}

/// Parses a size: `512m`, `2g`, `64k`, `4096` ([`crate::parse_positive_size`]).
fn parse_size(s: &str) -> Result<u64, String> {
    crate::parse_positive_size(s)
}

/// Options of `target/release/stria-bench-tier`.
#[derive(Clone, Debug, clap::Args)]
pub struct TierBenchArgs {
    /// Length of each measured phase, seconds.
    #[arg(long, default_value_t = 3.0)]
    pub seconds: f64,
    /// Times the whole set of phases is run; medians are reported.
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Streams of the multi-stream phases (2, 3, 4 and 5).
    #[arg(long, default_value_t = 4)]
    pub streams: usize,
    /// Requests in flight per stream (each stream is this many tasks sharing its cursor).
    #[arg(long, default_value_t = 1)]
    pub qd: usize,
    /// Size of the tiered volume.
    #[arg(long, value_parser = parse_size, default_value = "2g")]
    pub volume_size: u64,
    /// Size of the write cache (mirrored on the 2 fast drives).
    #[arg(long, value_parser = parse_size, default_value = "256m")]
    pub cache_size: u64,
    /// Chunk of the capacity tier: each drive write of a destaged stripe (a blockset is 4 chunks).
    #[arg(long, value_parser = parse_bytes, default_value = "128k")]
    pub chunk: usize,
    /// Drives: memory-backed files (`file`, in `--dir`) or memory drives (`memory`).
    #[arg(long, value_enum, default_value = "file")]
    pub drives: Drives,
    /// Where `--drives file` puts its temporary directory of drive files.
    #[arg(long, default_value = "/dev/shm")]
    pub dir: PathBuf,
    /// Let the tasks of a worker thread take turns after each request (`tokio::task::yield_now`),
    /// as `target/release/stria-bench-engine` does. Always on with `--drives memory` (memory
    /// drives complete requests without suspending, so a task would keep its worker thread until
    /// the phase ends); off by default with files, whose requests suspend once per drive
    /// operation anyway.
    #[arg(long)]
    pub interleave: bool,
    /// Tokio runtime worker threads.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Print one JSON object per phase instead of the tables.
    #[arg(long)]
    pub json: bool,
}

/// The phases, in the order they run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    SeqWrite1,
    SeqWriteN,
    RandRead4k,
    RandRead64k,
    RandRead64kWrite,
    Latency4kIdle,
    Latency4kWrite,
}

impl Phase {
    const ALL: [Phase; 7] = [
        Phase::SeqWrite1,
        Phase::SeqWriteN,
        Phase::RandRead4k,
        Phase::RandRead64k,
        Phase::RandRead64kWrite,
        Phase::Latency4kIdle,
        Phase::Latency4kWrite,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Phase::SeqWrite1 => "seq-write-1",
            Phase::SeqWriteN => "seq-write-n",
            Phase::RandRead4k => "rand-read-4k",
            Phase::RandRead64k => "rand-read-64k",
            Phase::RandRead64kWrite => "rand-read-64k+write",
            Phase::Latency4kIdle => "lat-4k-idle",
            Phase::Latency4kWrite => "lat-4k+write",
        }
    }

    fn writes(self) -> bool {
        matches!(self, Phase::SeqWrite1 | Phase::SeqWriteN | Phase::RandRead64kWrite | Phase::Latency4kWrite)
    }
}

/// Named figures of one run of one phase.
pub(crate) type Metrics = Vec<(&'static str, f64)>;

/// One phase over all repetitions.
#[derive(Debug, Clone)]
pub(crate) struct PhaseResult {
    pub(crate) phase: Phase,
    /// What ran: streams, request sizes, queue depth.
    pub(crate) what: String,
    pub(crate) reps: Vec<Metrics>,
    pub(crate) errors: u64,
    pub(crate) mismatches: u64,
    pub(crate) first_error: Option<String>,
    /// Per repetition, of the write phases: drive bytes since the phase began, every
    /// [`SAMPLE_EVERY`] while the load ran and while destage drained after it.
    pub(crate) series: Vec<Vec<WaSample>>,
}

/// Counters of a write phase since it began, `t_s` seconds after (the report's "write
/// amplification over time": `cap_mib / host_mib`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct WaSample {
    pub(crate) t_s: f64,
    pub(crate) host_mib: f64,
    pub(crate) cap_mib: f64,
    pub(crate) fast_mib: f64,
    /// Cached bytes not yet destaged.
    pub(crate) backlog_mib: f64,
}

impl WaSample {
    fn between(before: &Snapshot, now: &Snapshot, t0: Instant) -> WaSample {
        let mib = |b: u64| b as f64 / f64::from(1u32 << 20);
        let fast: u64 = (0..rig::REGIONS)
            .map(|r| now.fast_regions[r].write_bytes - before.fast_regions[r].write_bytes)
            .sum();
        WaSample {
            t_s: t0.elapsed().as_secs_f64(),
            host_mib: mib(now.status.host_write_bytes - before.status.host_write_bytes),
            cap_mib: mib(now.status.parts[2].drive_bytes_written - before.status.parts[2].drive_bytes_written),
            fast_mib: mib(fast),
            backlog_mib: mib(now.status.cache_live_blocks * BLOCK),
        }
    }
}

/// Samples the counters every [`SAMPLE_EVERY`] into `out` until `stop` is set.
async fn sample_wa<D: BlockDevice>(
    rig: &Rig<D>,
    before: &Snapshot,
    t0: Instant,
    stop: &AtomicBool,
    out: &mut Vec<WaSample>,
) {
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(SAMPLE_EVERY).await;
        out.push(WaSample::between(before, &rig.snapshot().await, t0));
    }
}

impl PhaseResult {
    /// Median over the repetitions of metric `key` (NaN when absent).
    pub(crate) fn median(&self, key: &str) -> f64 {
        let mut v: Vec<f64> = self
            .reps
            .iter()
            .filter_map(|m| m.iter().find(|(k, _)| *k == key).map(|&(_, v)| v))
            .filter(|v| !v.is_nan())
            .collect();
        if v.is_empty() {
            return f64::NAN;
        }
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    }

    /// Sum over the repetitions of metric `key`.
    pub(crate) fn sum(&self, key: &str) -> f64 {
        self.reps.iter().filter_map(|m| m.iter().find(|(k, _)| *k == key).map(|&(_, v)| v)).sum()
    }

    /// Keys in the order of the first repetition.
    pub(crate) fn keys(&self) -> Vec<&'static str> {
        self.reps.first().map(|m| m.iter().map(|(k, _)| *k).collect()).unwrap_or_default()
    }
}

/// Everything measured, for the report.
#[derive(Debug)]
pub(crate) struct Outcome {
    pub(crate) phases: Vec<PhaseResult>,
    pub(crate) fill_mb_s: f64,
    pub(crate) fill_drain_s: f64,
    pub(crate) shape: String,
    pub(crate) drive_engine: String,
}

/// Runs the benchmark and prints the tables (or JSON) to stdout.
///
/// The measurement runs on a thread of its own with its own tokio runtime (so it can be called
/// from inside another runtime).
///
/// # Errors
/// Bad options, a failure to build the pool, an I/O error, or a read that did not return what
/// was written.
pub fn run(args: &TierBenchArgs) -> Result<()> {
    if args.reps == 0 || args.streams == 0 || args.qd == 0 || args.threads == 0 {
        bail!("--reps, --streams, --qd and --threads must be at least 1");
    }
    if !(args.seconds > 0.0 && args.seconds.is_finite()) {
        bail!("--seconds must be positive");
    }
    if !args.chunk.is_multiple_of(4096) {
        bail!("--chunk must be a multiple of 4 KiB");
    }
    let row = u64::from(DATA_SHARDS) * args.chunk as u64;
    let volume_bytes = args.volume_size.next_multiple_of(row);
    if volume_bytes < 4 * args.streams as u64 * row {
        bail!("--volume-size is too small for {} streams", args.streams);
    }
    let shape = Shape {
        volume_bytes,
        cache_bytes: args.cache_size,
        chunk_bytes: args.chunk as u64,
        data_shards: DATA_SHARDS,
        parity_shards: PARITY_SHARDS,
    };
    check_memory(args, &shape)?;
    let load_before = loadavg();
    let args2 = args.clone();
    let outcome = std::thread::spawn(move || -> Result<Outcome> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(args2.threads)
            .enable_all()
            .build()
            .context("starting the benchmark runtime")?;
        match args2.drives {
            Drives::Memory => {
                rt.block_on(measure(&args2, &shape, "memory drives (MemDevice)".into(), |n, s| {
                    Ok(MemDevice::new(n, s))
                }))
            }
            Drives::File => {
                let dir = TempDir::new(&args2.dir)?;
                let opts = FileOptions { direct_io: false, ..FileOptions::default() };
                let engine = std::sync::Mutex::new(None);
                let result = rt.block_on(measure(&args2, &shape, String::new(), |name, size| {
                    let path = dir.path().join(format!("{name}.img"));
                    let dev = FileDevice::create_with(&path, size, &opts)
                        .with_context(|| format!("creating drive file {}", path.display()))?;
                    *engine.lock().expect("not poisoned") = Some(dev.engine());
                    Ok(dev)
                }));
                drop(rt);
                let engine = engine.lock().expect("not poisoned").map_or("?".into(), |e| format!("{e:?}"));
                result.map(|mut o| {
                    o.drive_engine = format!(
                        "FileDevice files in {} (I/O engine {engine}; removed at the end)",
                        args2.dir.display()
                    );
                    o
                })
            }
        }
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the benchmark thread panicked"))??;
    let load_after = loadavg();
    if args.json {
        println!("{}", report::to_json(&outcome, args));
    } else {
        report::print(&outcome, args, &load_before, &load_after);
    }
    if let Some(p) = outcome.phases.iter().find(|p| p.errors > 0 || p.mismatches > 0) {
        bail!(
            "{}: {} failed requests and {} reads that did not return what was written; first: {}",
            p.phase.name(),
            p.errors,
            p.mismatches,
            p.first_error.as_deref().unwrap_or("?")
        );
    }
    Ok(())
}

/// Bytes the drives will hold once the volume is filled: the segment space's stripes and the
/// mirrored cache and map, plus the engine's own regions (a guess on the high side).
fn memory_needed(shape: &Shape) -> Result<u64> {
    let k = u64::from(shape.data_shards);
    let capacity = shape.volume_bytes * 3 / 2 / k * (k + u64::from(shape.parity_shards));
    let fast = 2 * (shape.cache_bytes + shape.meta_bytes()?);
    Ok(capacity + fast + (256 << 20))
}

/// Whether `dir` is on a tmpfs (its longest mount point prefix in /proc/mounts).
fn on_tmpfs(dir: &std::path::Path) -> bool {
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, at, fs) = (f.next()?, f.next()?, f.next()?);
            dir.starts_with(at).then(|| (at.len(), fs == "tmpfs"))
        })
        .max_by_key(|&(len, _)| len)
        .is_some_and(|(_, tmpfs)| tmpfs)
}

/// Refuses to start when the drives would not fit in the memory available now (other processes
/// may hold much of it, e.g. in /dev/shm): running out would get the benchmark OOM-killed, and a
/// killed process leaves its drive files behind.
fn check_memory(args: &TierBenchArgs, shape: &Shape) -> Result<()> {
    if args.drives == Drives::File && !on_tmpfs(&args.dir) {
        return Ok(());
    }
    let available = std::fs::read_to_string("/proc/meminfo").ok().and_then(|s| {
        let line = s.lines().find(|l| l.starts_with("MemAvailable:"))?;
        line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kib| kib << 10)
    });
    let need = memory_needed(shape)?;
    if let Some(available) = available
        && need + (1 << 30) > available
    {
        bail!(
            "the drives need about {} MiB of memory (plus 1 GiB to spare) and only {} MiB is available now; \
             use a smaller --volume-size or --cache-size",
            need >> 20,
            available >> 20
        );
    }
    Ok(())
}

/// Whether request streams yield after each request (see [`TierBenchArgs::interleave`]).
fn interleave(args: &TierBenchArgs) -> bool {
    args.interleave || args.drives == Drives::Memory
}

/// The regions of the write streams (cursors carry over from repetition to repetition).
struct Streams {
    /// Phase 1: the whole volume.
    single: Arc<SeqRegion>,
    /// Phase 2: one region each.
    multi: Vec<Arc<SeqRegion>>,
    /// The write load beside reads (phases 5 and 6): the whole volume, from the middle.
    load: Arc<SeqRegion>,
}

impl Streams {
    fn new(volume_blocks: u64, streams: usize, blockset_blocks: u64) -> Streams {
        let per = volume_blocks / streams as u64 / blockset_blocks * blockset_blocks;
        let half = volume_blocks / 2 / blockset_blocks * blockset_blocks;
        Streams {
            single: SeqRegion::new(0, volume_blocks),
            multi: (0..streams as u64).map(|i| SeqRegion::new(i * per, per)).collect(),
            load: SeqRegion::new(half, volume_blocks - half),
        }
    }
}

async fn measure<D: BlockDevice>(
    args: &TierBenchArgs,
    shape: &Shape,
    drive_engine: String,
    make: impl Fn(&str, u64) -> Result<D>,
) -> Result<Outcome> {
    let rig = Rig::build(shape, make).await?;
    let result = measure_on(args, &rig, drive_engine).await;
    let closed = rig.close().await;
    let outcome = result?;
    closed?;
    Ok(outcome)
}

async fn measure_on<D: BlockDevice>(
    args: &TierBenchArgs,
    rig: &Rig<D>,
    drive_engine: String,
) -> Result<Outcome> {
    let vol = &rig.vol;
    let blocks = vol.size_bytes() / BLOCK;
    let tags = Arc::new(Tags::new(blocks, SEQ_BYTES));
    // Fill: every block written once (so every read has something to check), then destaged.
    let start = Instant::now();
    load::fill(vol, &tags, args.streams, 2, SEQ_BYTES).await.map_err(|e| anyhow::anyhow!("filling: {e}"))?;
    let fill_s = start.elapsed().as_secs_f64();
    let fill_drain_s = rig.drain(DRAIN_LIMIT).await?.as_secs_f64();
    let streams = Streams::new(blocks, args.streams, u64::from(DATA_SHARDS) * args.chunk as u64 / BLOCK);
    let mut phases: Vec<PhaseResult> = Phase::ALL
        .iter()
        .map(|&phase| PhaseResult {
            phase,
            what: describe(phase, args),
            reps: Vec::new(),
            errors: 0,
            mismatches: 0,
            first_error: None,
            series: Vec::new(),
        })
        .collect();
    for rep in 0..args.reps {
        for (i, &phase) in Phase::ALL.iter().enumerate() {
            let groups = groups(phase, args, &streams);
            let seed = (rep * 100 + i) as u64 + 1;
            let (mut metrics, results, series) = run_phase(rig, &tags, phase, &groups, args, seed).await?;
            // Ratios against the peer phase of the same repetition.
            let peer = |p: Phase, key: &str| {
                phases
                    .iter()
                    .find(|r| r.phase == p)
                    .and_then(|r| r.reps.last())
                    .and_then(|m| m.iter().find(|(k, _)| *k == key).map(|&(_, v)| v))
            };
            let get =
                |m: &Metrics, key: &str| m.iter().find(|(k, _)| *k == key).map_or(f64::NAN, |&(_, v)| v);
            match phase {
                Phase::RandRead64kWrite => {
                    let without = peer(Phase::RandRead64k, "read_mb_s").unwrap_or(f64::NAN);
                    metrics.push(("read_vs_without_write", get(&metrics, "read_mb_s") / without));
                    let single = peer(Phase::SeqWrite1, "write_mb_s").unwrap_or(f64::NAN);
                    metrics.push(("write_vs_seq_write_1", get(&metrics, "write_mb_s") / single));
                }
                Phase::Latency4kWrite => {
                    for (key, ratio) in [
                        ("read_mean_us", "mean_vs_idle"),
                        ("read_p50_us", "p50_vs_idle"),
                        ("read_p99_us", "p99_vs_idle"),
                    ] {
                        let idle = peer(Phase::Latency4kIdle, key).unwrap_or(f64::NAN);
                        metrics.push((ratio, get(&metrics, key) / idle));
                    }
                    let single = peer(Phase::SeqWrite1, "write_mb_s").unwrap_or(f64::NAN);
                    metrics.push(("write_vs_seq_write_1", get(&metrics, "write_mb_s") / single));
                }
                _ => {}
            }
            let p = &mut phases[i];
            for r in results {
                p.errors += r.errors;
                p.mismatches += r.mismatches;
                if p.first_error.is_none() {
                    p.first_error = r.first_error;
                }
            }
            p.reps.push(metrics);
            if phase.writes() {
                p.series.push(series);
            }
        }
    }
    Ok(Outcome {
        phases,
        fill_mb_s: vol.size_bytes() as f64 / fill_s / 1e6,
        fill_drain_s,
        shape: format!(
            "{} (log-structured), {} MiB volume, {} MiB cache (raid1 over 2 fast drives), {} KiB chunk, \
             batches of {} rows, {} MiB segments, 6 capacity drives",
            vol.layout(),
            vol.size_bytes() >> 20,
            vol.parts()[1].size_bytes() >> 20,
            args.chunk >> 10,
            vol.geometry().batch_rows,
            (vol.geometry().segment_data() * BLOCK) >> 20
        ),
        drive_engine,
    })
}

fn describe(phase: Phase, args: &TierBenchArgs) -> String {
    let (n, qd) = (args.streams, args.qd);
    match phase {
        Phase::SeqWrite1 => format!("1 x seq write 512K, QD {qd}"),
        Phase::SeqWriteN => format!("{n} x seq write 512K, QD {qd} each"),
        Phase::RandRead4k => format!("{n} x rand read 4K, QD {qd} each"),
        Phase::RandRead64k => format!("{n} x rand read 64K, QD {qd} each"),
        Phase::RandRead64kWrite => format!("{n} x rand read 64K, QD {qd} each + 1 x seq write 512K, QD {qd}"),
        Phase::Latency4kIdle => "1 x rand read 4K, QD 1".into(),
        Phase::Latency4kWrite => format!("1 x rand read 4K, QD 1 + 1 x seq write 512K, QD {qd}"),
    }
}

/// The request groups of `phase`: reads first (if any), then writes (if any).
fn groups(phase: Phase, args: &TierBenchArgs, streams: &Streams) -> Vec<Group> {
    let reads = |n: usize, qd: usize, req_bytes: usize| Group { jobs: vec![Job::RandRead; n], qd, req_bytes };
    let load = || Group {
        jobs: vec![Job::SeqWrite { region: Arc::clone(&streams.load) }],
        qd: args.qd,
        req_bytes: SEQ_BYTES,
    };
    match phase {
        Phase::SeqWrite1 => vec![Group {
            jobs: vec![Job::SeqWrite { region: Arc::clone(&streams.single) }],
            qd: args.qd,
            req_bytes: SEQ_BYTES,
        }],
        Phase::SeqWriteN => vec![Group {
            jobs: streams.multi.iter().map(|r| Job::SeqWrite { region: Arc::clone(r) }).collect(),
            qd: args.qd,
            req_bytes: SEQ_BYTES,
        }],
        Phase::RandRead4k => vec![reads(args.streams, args.qd, SMALL_READ_BYTES)],
        Phase::RandRead64k => vec![reads(args.streams, args.qd, LARGE_READ_BYTES)],
        Phase::RandRead64kWrite => vec![reads(args.streams, args.qd, LARGE_READ_BYTES), load()],
        Phase::Latency4kIdle => vec![reads(1, 1, SMALL_READ_BYTES)],
        Phase::Latency4kWrite => vec![reads(1, 1, SMALL_READ_BYTES), load()],
    }
}

/// One run of one phase: drain, counters, the timed load, drain again, counters (and, for write
/// phases, a time series of the counters during the load and the drain).
async fn run_phase<D: BlockDevice>(
    rig: &Rig<D>,
    tags: &Arc<Tags>,
    phase: Phase,
    groups: &[Group],
    args: &TierBenchArgs,
    seed: u64,
) -> Result<(Metrics, Vec<GroupResult>, Vec<WaSample>)> {
    rig.drain(DRAIN_LIMIT).await?;
    let before = rig.snapshot().await;
    let t0 = Instant::now();
    let mut series = Vec::new();
    let (load_done, drain_done) = (AtomicBool::new(!phase.writes()), AtomicBool::new(!phase.writes()));
    let timed = async {
        let r =
            load::run(&rig.vol, tags, groups, Duration::from_secs_f64(args.seconds), interleave(args), seed)
                .await;
        load_done.store(true, Ordering::Relaxed);
        r
    };
    let ((results, wall_s), ()) = tokio::join!(timed, sample_wa(rig, &before, t0, &load_done, &mut series));
    let backlog_bytes = rig.vol.status().cache_live_blocks * BLOCK;
    let drain = async {
        let r = rig.drain(DRAIN_LIMIT).await;
        drain_done.store(true, Ordering::Relaxed);
        r
    };
    let (drained, ()) = tokio::join!(drain, sample_wa(rig, &before, t0, &drain_done, &mut series));
    let drain_s = drained?.as_secs_f64();
    let after = rig.snapshot().await;
    if phase.writes() {
        series.push(WaSample::between(&before, &after, t0));
    }
    let mut m: Metrics = vec![("seconds", wall_s)];
    for (g, r) in groups.iter().zip(&results) {
        let prefix = if g.jobs.iter().any(|j| matches!(j, Job::RandRead)) { "read" } else { "write" };
        push_group(&mut m, prefix, r, wall_s);
    }
    if phase.writes() {
        write_accounting(&mut m, &before, &after, backlog_bytes, drain_s);
    }
    let (cache, cap) = (
        after.status.blocks_read_from_cache - before.status.blocks_read_from_cache,
        after.status.blocks_read_from_segments - before.status.blocks_read_from_segments,
    );
    if after.host_read_ops > before.host_read_ops {
        m.push(("read_from_capacity_pct", 100.0 * cap as f64 / (cache + cap).max(1) as f64));
    }
    Ok((m, results, series))
}

fn push_group(m: &mut Metrics, prefix: &'static str, r: &GroupResult, wall_s: f64) {
    let key = |what: &str| -> &'static str {
        match (prefix, what) {
            ("read", "iops") => "read_iops",
            ("read", "mb_s") => "read_mb_s",
            ("read", "p50") => "read_p50_us",
            ("read", "mean") => "read_mean_us",
            ("read", "p99") => "read_p99_us",
            ("read", "p999") => "read_p999_us",
            ("read", "max") => "read_max_us",
            (_, "iops") => "write_iops",
            (_, "mb_s") => "write_mb_s",
            (_, "p50") => "write_p50_us",
            (_, "mean") => "write_mean_us",
            (_, "p99") => "write_p99_us",
            (_, "p999") => "write_p999_us",
            _ => "write_max_us",
        }
    };
    m.push((key("iops"), r.ops as f64 / wall_s));
    m.push((key("mb_s"), r.bytes as f64 / wall_s / 1e6));
    m.push((key("p50"), r.hist.quantile_us(0.5)));
    m.push((key("mean"), r.mean_us()));
    m.push((key("p99"), r.hist.quantile_us(0.99)));
    m.push((key("p999"), r.hist.quantile_us(0.999)));
    m.push((key("max"), r.lat_max_ns as f64 / 1000.0));
}

/// What the host writes of a phase cost on the drives (counters read after destage drained).
fn write_accounting(m: &mut Metrics, before: &Snapshot, after: &Snapshot, backlog_bytes: u64, drain_s: f64) {
    let (b, a) = (&before.status, &after.status);
    let host_bytes = (a.host_write_bytes - b.host_write_bytes).max(1) as f64;
    let host_ops = (after.host_write_ops - before.host_write_ops).max(1) as f64;
    let (cap_b, cap_a) = (&b.parts[2], &a.parts[2]);
    let cap_bytes = cap_a.drive_bytes_written - cap_b.drive_bytes_written;
    let hist: Vec<u64> =
        cap_a.drive_write_size_hist.iter().zip(&cap_b.drive_write_size_hist).map(|(x, y)| x - y).collect();
    let data = Region::Data as usize;
    let cap_data = after.cap_regions[data].since(&before.cap_regions[data]);
    let region_bytes = |r: Region| {
        (after.cap_regions[r as usize].write_bytes - before.cap_regions[r as usize].write_bytes) as f64
    };
    let fast_bytes: u64 = (0..rig::REGIONS)
        .map(|r| after.fast_regions[r].write_bytes - before.fast_regions[r].write_bytes)
        .sum();
    let full = cap_a.full_stripe_writes - cap_b.full_stripe_writes;
    let partial = cap_a.partial_stripe_writes - cap_b.partial_stripe_writes;
    // Map writes: log blocks (each one FUA write, shared by the deltas of host writes, destage
    // and GC batches of the moment) and the pages checkpoints wrote.
    let map_writes = (after.map.log_blocks_written - before.map.log_blocks_written)
        + (after.map.pages_written - before.map.pages_written);
    let destaged = a.destaged_blocks - b.destaged_blocks;
    let pct = |part: u64, whole: u64| 100.0 * part as f64 / whole.max(1) as f64;
    m.extend([
        ("host_write_mib", host_bytes / f64::from(1u32 << 20)),
        ("cap_wa", cap_bytes as f64 / host_bytes),
        ("cap_data_wa", cap_data.write_bytes as f64 / host_bytes),
        ("cap_checksum_wa", region_bytes(Region::Checksums) / host_bytes),
        ("cap_intent_wa", region_bytes(Region::Intent) / host_bytes),
        ("cap_journal_wa", region_bytes(Region::Journal) / host_bytes),
        ("cap_pool_meta_wa", region_bytes(Region::Meta) / host_bytes),
        ("fast_wa", fast_bytes as f64 / host_bytes),
        ("full_stripe_writes", full as f64),
        ("partial_stripe_writes", partial as f64),
        ("full_stripe_pct", pct(full, full + partial)),
        ("cap_data_writes", cap_data.write_ops as f64),
        (
            "cap_data_writes_ge_128k_pct",
            pct(writes_at_least(&cap_data.write_size_hist, GOAL_MIN_DRIVE_WRITE), cap_data.write_ops),
        ),
        ("cap_drive_writes", hist.iter().sum::<u64>() as f64),
        (
            "cap_drive_writes_ge_128k_pct",
            pct(writes_at_least(&hist, GOAL_MIN_DRIVE_WRITE), hist.iter().sum()),
        ),
        ("meta_writes_per_host_write", map_writes as f64 / host_ops),
        ("destaged_blocks", destaged as f64),
        ("gc_moved_blocks", (a.gc_moved_blocks - b.gc_moved_blocks) as f64),
        ("backlog_mib", backlog_bytes as f64 / f64::from(1u32 << 20)),
        ("drain_s", drain_s),
    ]);
}
