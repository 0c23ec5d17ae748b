//! `cargo run --release -p stria-bench --bin stria-bench-engine --`: the engine's software
//! overhead, measured in-process over memory drives (the way seed 004 measured RAID and volume
//! managers on RAM disks).
//!
//! Every layout is compared with raw drives of the same count: the same request pattern issued
//! straight to the drives through the `BlockDevice` trait, with the same buffer type and the same
//! async machinery. Volumes are filled with tagged data first and every read checks the tags, so
//! no cell can be fast by reading never-written blocks (which the engine answers without a drive
//! read). Cells: 4 KiB random read and write, sequential read and write (`--seq-bytes`), and on
//! ec layouts full-stripe sequential writes; healthy and with one drive failed. Then the drive
//! write amplification of checksums (and of everything else) per write pattern and flush interval.

// Counts, sizes and block numbers are u64 and index in-memory buffers on 64-bit Linux (the only
// target), and latency quantiles round floats: truncation cannot happen in practice.
#![allow(clippy::cast_possible_truncation)]

mod amp;
pub(crate) mod hist;
mod load;
mod qos;
mod report;
mod rig;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use stria_dev::mem::MemDevice;
use stria_engine::Layout;

use crate::ec::{Clock, parse_bytes};
use hist::Histogram;
use load::{Pattern, Payloads, Sample, Target, Workload, run_sample};
use rig::{RawDrives, build_volume};

/// What to measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Op {
    /// 4 KiB reads at random aligned offsets.
    RandRead,
    /// 4 KiB writes at random aligned offsets.
    RandWrite,
    /// Sequential reads of `--seq-bytes`.
    SeqRead,
    /// Sequential writes of `--seq-bytes`.
    SeqWrite,
    /// Sequential writes of exactly one stripe (ec layouts only; K x chunk bytes).
    FullStripeWrite,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::RandRead => "rand-read",
            Op::RandWrite => "rand-write",
            Op::SeqRead => "seq-read",
            Op::SeqWrite => "seq-write",
            Op::FullStripeWrite => "full-stripe-write",
        }
    }

    fn is_write(self) -> bool {
        matches!(self, Op::RandWrite | Op::SeqWrite | Op::FullStripeWrite)
    }
}

fn parse_layout(s: &str) -> Result<Layout, String> {
    let num = |t: &str| t.trim().parse::<u32>().map_err(|e| format!("{s:?}: {e}"));
    let layout = match s.trim() {
        "raid0" => Layout::Raid0 { width: 6 },
        "raid1" => Layout::Raid1 { copies: 2 },
        "raid10" => Layout::Raid10 { width: 3, copies: 2 },
        t if t.starts_with("raid0:") => Layout::Raid0 { width: num(&t[6..])? },
        t if t.starts_with("raid1:") => Layout::Raid1 { copies: num(&t[6..])? },
        t if t.starts_with("raid10:") => {
            let (w, c) = t[7..].split_once('x').ok_or_else(|| format!("{s:?}: expected raid10:WxN"))?;
            Layout::Raid10 { width: num(w)?, copies: num(c)? }
        }
        t if t.starts_with("ec:") => {
            let (k, m) = t[3..].split_once('+').ok_or_else(|| format!("{s:?}: expected ec:K+M"))?;
            Layout::Ec { data_shards: num(k)?, parity_shards: num(m)? }
        }
        _ => return Err(format!("{s:?}: expected raid0:W, raid1:N, raid10:WxN or ec:K+M")),
    };
    layout.validate()?;
    Ok(layout)
}

/// Options of `target/release/stria-bench-engine`.
#[derive(Clone, Debug, clap::Args)]
pub struct EngineBenchArgs {
    /// Layouts (raid0:W, raid1:N, raid10:WxN, ec:K+M), each on as many drives as it has
    /// members and compared with that many raw drives.
    #[arg(long, value_parser = parse_layout, value_delimiter = ',', default_value = "ec:4+2,raid0:6,raid10:3x2,raid1:2")]
    pub layouts: Vec<Layout>,
    /// Operations to measure.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "rand-read,rand-write,seq-read,seq-write,full-stripe-write"
    )]
    pub ops: Vec<Op>,
    /// Working set of every cell, MiB: the volume's size, and what the raw drives hold between
    /// them.
    #[arg(long, default_value_t = 1024)]
    pub data_mib: u64,
    /// Chunk (stripe height) of the volumes.
    #[arg(long, value_parser = parse_bytes, default_value = "64k")]
    pub chunk: usize,
    /// Request size of the sequential cells.
    #[arg(long, value_parser = parse_bytes, default_value = "128k")]
    pub seq_bytes: usize,
    /// Requests in flight: this many tasks, each issuing its next request when the last one
    /// completes.
    #[arg(long, default_value_t = 32)]
    pub qd: usize,
    /// Runtime threads (1: a current-thread tokio runtime; more: a multi-thread one).
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Measured runs per cell (after one warm-up run); the median is reported.
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// Length of one run, milliseconds.
    #[arg(long, default_value_t = 300)]
    pub sample_ms: u64,
    /// `cpu`: IOPS per CPU-second of the process (times `--threads`), so other processes
    /// sharing the cores do not lower the figures; `wall`: per elapsed second.
    #[arg(long, value_enum, default_value = "cpu")]
    pub clock: Clock,
    /// Do not let the tasks of a thread take turns after each request (they then run one
    /// after the other: effectively QD 1 per thread).
    #[arg(long)]
    pub no_interleave: bool,
    /// Skip the cells with one drive failed.
    #[arg(long)]
    pub no_degraded: bool,
    /// Only the cells with one drive failed (for profiling the degraded paths).
    #[arg(long, hide = true)]
    pub only_degraded: bool,
    /// Skip the write-amplification measurement.
    #[arg(long)]
    pub no_amp: bool,
    /// Volume sizes for the write-amplification measurement, GiB (drives are sparse: only what
    /// is written costs memory).
    #[arg(long, value_delimiter = ',', default_value = "1,64")]
    pub amp_volume_gib: Vec<u64>,
    /// Host flush intervals for the write-amplification measurement, in writes.
    #[arg(long, value_delimiter = ',', default_value = "1,16,256")]
    pub amp_flush_every: Vec<u64>,
    /// Random 4 KiB writes per write-amplification figure (sequential: a quarter as many).
    #[arg(long, default_value_t = 8192)]
    pub amp_writes: u64,
    /// Print one JSON object per cell instead of the tables.
    #[arg(long)]
    pub json: bool,
    /// Instead of the rest: what the QoS dispatcher costs 4 KiB random reads and writes of each
    /// layout when off (no setting) and on with nothing binding, against the volume itself; then
    /// the dispatcher alone from 1 thread to one per CPU, requests on their shard's lease against
    /// requests through the pool's lock.
    #[arg(long)]
    pub qos: bool,
}

/// One measured figure: a layout (or raw drives) doing one operation.
#[derive(Clone, Debug)]
pub(crate) struct Cell {
    /// `None` for raw drives.
    layout: Option<Layout>,
    drives: usize,
    degraded: bool,
    op: Op,
    req_bytes: usize,
    /// Per run, by the chosen clock.
    iops_runs: Vec<f64>,
    wall_iops_runs: Vec<f64>,
    hist: Histogram,
    ops: u64,
    drive_read_ops: u64,
    drive_read_bytes: u64,
    drive_write_bytes: u64,
    errors: u64,
    first_error: Option<String>,
}

impl Cell {
    fn new(layout: Option<Layout>, drives: usize, degraded: bool, op: Op, req_bytes: usize) -> Cell {
        Cell {
            layout,
            drives,
            degraded,
            op,
            req_bytes,
            iops_runs: Vec::new(),
            wall_iops_runs: Vec::new(),
            hist: Histogram::new(),
            ops: 0,
            drive_read_ops: 0,
            drive_read_bytes: 0,
            drive_write_bytes: 0,
            errors: 0,
            first_error: None,
        }
    }

    fn add(&mut self, s: &Sample, clock: Clock, threads: usize) {
        let seconds = match clock {
            Clock::Cpu => s.cpu_s / threads as f64,
            Clock::Wall => s.wall_s,
        };
        self.iops_runs.push(s.ops as f64 / seconds);
        self.wall_iops_runs.push(s.ops as f64 / s.wall_s);
        self.hist.merge(&s.hist);
        self.ops += s.ops;
        self.drive_read_ops += s.drives.read_ops;
        self.drive_read_bytes += s.drives.read_bytes;
        self.drive_write_bytes += s.drives.write_bytes;
        self.errors += s.errors;
        if self.first_error.is_none() {
            self.first_error.clone_from(&s.first_error);
        }
    }

    pub(crate) fn iops(&self) -> f64 {
        median(&self.iops_runs)
    }

    fn mib_s(&self) -> f64 {
        self.iops() * self.req_bytes as f64 / f64::from(1u32 << 20)
    }

    fn label(&self) -> String {
        self.layout.map_or_else(|| "raw".to_owned(), |l| l.to_string())
    }
}

fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Runs the benchmark and prints the tables (or JSON) to stdout.
///
/// The measurement runs on a thread of its own with its own tokio runtime (so it can be called
/// from inside another runtime).
///
/// # Errors
/// Bad options, or a cell that failed (an I/O error, or a read that returned the wrong block).
pub fn run(args: &EngineBenchArgs) -> Result<()> {
    if args.runs == 0 || args.qd == 0 || args.threads == 0 || args.layouts.is_empty() || args.ops.is_empty() {
        bail!("nothing to measure: runs, qd, threads, layouts and ops must be non-zero");
    }
    if !args.seq_bytes.is_multiple_of(4096) || !args.chunk.is_multiple_of(4096) {
        bail!("--seq-bytes and --chunk must be multiples of 4 KiB");
    }
    if args.amp_flush_every.contains(&0) {
        bail!("--amp-flush-every intervals must be at least 1");
    }
    if args.qos {
        let args2 = args.clone();
        return std::thread::spawn(move || -> Result<()> {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            rt.block_on(qos::measure(&args2))
        })
        .join()
        .map_err(|_| anyhow::anyhow!("the benchmark thread panicked"))?;
    }
    let load_before = crate::host::loadavg();
    let args2 = args.clone();
    let (cells, amp_rows) = std::thread::spawn(move || -> Result<_> {
        let rt = if args2.threads == 1 {
            tokio::runtime::Builder::new_current_thread().enable_all().build()
        } else {
            tokio::runtime::Builder::new_multi_thread().worker_threads(args2.threads).enable_all().build()
        }
        .context("starting the benchmark runtime")?;
        rt.block_on(measure_all(&args2))
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the benchmark thread panicked"))??;
    let load_after = crate::host::loadavg();
    if args.json {
        println!("{}", report::to_json(&cells, &amp_rows, args));
    } else {
        report::print(&cells, &amp_rows, args, &load_before, &load_after);
    }
    if let Some(c) = cells.iter().find(|c| c.errors > 0) {
        bail!(
            "{} {} {}: {} requests failed; first: {}",
            c.label(),
            if c.degraded { "degraded" } else { "healthy" },
            c.op.name(),
            c.errors,
            c.first_error.as_deref().unwrap_or("?")
        );
    }
    Ok(())
}

/// Which ops apply to `layout`, with their request sizes.
fn ops_for(layout: Layout, args: &EngineBenchArgs) -> Vec<(Op, usize)> {
    args.ops
        .iter()
        .filter_map(|&op| match op {
            Op::RandRead | Op::RandWrite => Some((op, 4096)),
            Op::SeqRead | Op::SeqWrite => Some((op, args.seq_bytes)),
            Op::FullStripeWrite => match layout {
                Layout::Ec { data_shards, .. } => Some((op, data_shards as usize * args.chunk)),
                _ => None,
            },
        })
        .collect()
}

fn workload(op: Op, req_bytes: usize, args: &EngineBenchArgs) -> Workload {
    Workload {
        pattern: if matches!(op, Op::RandRead | Op::RandWrite) {
            Pattern::Random
        } else {
            Pattern::Sequential
        },
        write: op.is_write(),
        req_bytes,
        qd: args.qd,
        sample: Duration::from_millis(args.sample_ms),
        interleave: !args.no_interleave,
    }
}

/// Per-op state of one target: its payloads and sequential cursor.
struct OpState {
    payloads: Arc<Payloads>,
    cursor: Arc<AtomicU64>,
}

impl OpState {
    fn new(req_bytes: usize, seed: u64) -> OpState {
        OpState {
            payloads: Arc::new(Payloads::new(req_bytes, 64, seed)),
            cursor: Arc::new(AtomicU64::new(0)),
        }
    }

    async fn sample<T: Target>(&self, target: &Arc<T>, load: &Workload, seed: u64) -> Sample {
        run_sample(target, load, &self.payloads, &self.cursor, seed).await
    }
}

async fn measure_all(args: &EngineBenchArgs) -> Result<(Vec<Cell>, Vec<amp::AmpRow>)> {
    let span = args.data_mib << 20;
    let mut raw_sets: BTreeMap<usize, Arc<RawDrives>> = BTreeMap::new();
    let mut raw_cells: BTreeMap<(usize, Op, usize), Cell> = BTreeMap::new();
    let mut cells = Vec::new();
    for &layout in &args.layouts {
        let n = layout.members() as usize;
        if let std::collections::btree_map::Entry::Vacant(e) = raw_sets.entry(n) {
            e.insert(Arc::new(RawDrives::new(n, span).await?));
        }
        let raw = Arc::clone(&raw_sets[&n]);
        let vut = Arc::new(build_volume(layout, span, args.chunk as u64, MemDevice::new).await?);
        vut.fill().await?;
        let ops = ops_for(layout, args);
        let mut healthy = Vec::new();
        for (i, &(op, req)) in ops.iter().enumerate().filter(|_| !args.only_degraded) {
            let load = workload(op, req, args);
            let (raw_state, vol_state) = (OpState::new(req, i as u64), OpState::new(req, 100 + i as u64));
            let raw_cell =
                raw_cells.entry((n, op, req)).or_insert_with(|| Cell::new(None, n, false, op, req));
            let mut cell = Cell::new(Some(layout), n, false, op, req);
            vut.pool.flush().await?;
            // Raw and volume runs alternate, so drift and neighbours hit both alike.
            for run in 0..=args.runs {
                let r = raw_state.sample(&raw, &load, run as u64).await;
                let v = vol_state.sample(&vut, &load, run as u64).await;
                if run > 0 {
                    raw_cell.add(&r, args.clock, args.threads);
                    cell.add(&v, args.clock, args.threads);
                }
            }
            healthy.push(cell);
        }
        let mut degraded = Vec::new();
        if !args.no_degraded && layout.tolerance() > 0 {
            vut.fail_one_drive().await?;
            for (i, &(op, req)) in ops.iter().enumerate() {
                let load = workload(op, req, args);
                let state = OpState::new(req, 200 + i as u64);
                let mut cell = Cell::new(Some(layout), n, true, op, req);
                vut.pool.flush().await?;
                for run in 0..=args.runs {
                    let v = state.sample(&vut, &load, run as u64).await;
                    if run > 0 {
                        cell.add(&v, args.clock, args.threads);
                    }
                }
                degraded.push(cell);
            }
        }
        vut.pool.close().await?;
        cells.extend(healthy);
        cells.extend(degraded);
    }
    drop(raw_sets);
    let mut all: Vec<Cell> = raw_cells.into_values().collect();
    all.extend(cells);
    let amp_rows = if args.no_amp {
        Vec::new()
    } else {
        let plan = amp::AmpPlan {
            layouts: args.layouts.clone(),
            volume_bytes: args.amp_volume_gib.iter().map(|g| g << 30).collect(),
            chunk_bytes: args.chunk as u64,
            flush_every: args.amp_flush_every.clone(),
            random_writes: args.amp_writes,
            seq_bytes: args.seq_bytes,
            seq_writes: (args.amp_writes / 4).max(1),
        };
        amp::measure(&plan).await?
    };
    Ok((all, amp_rows))
}
