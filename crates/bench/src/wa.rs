//! `cargo run --release -p stria-bench --bin stria-bench-wa --`: write amplification of
//! log-structured `tiered:ec:4+2` volumes (`stria_tier::log`, issue 12's goals) against a thick
//! `ec:4+2` volume measured in the same run, in-process over memory drives (2 fast + 6 capacity, each
//! wrapped in a tap that splits its writes by region of the drive layout and yields once per
//! request, as a real drive's completion would, so that concurrent requests can meet).
//!
//! For each `--fills` value f: a tiered:ec:4+2 volume of `--volume` bytes over a segment space of
//! `--volume / f` data bytes (so a fully written volume fills a fraction f of the capacity
//! tier). Phases, each ended by destaging the whole cache so its drive bytes are counted:
//! 0. uniform random 4 KiB writes to never-written blocks of the new volume (a quarter of it);
//! 1. sequential 512 KiB writes over the whole volume (fills it);
//! 2. uniform random 4 KiB overwrites while the space is still free (before GC starts);
//! 3. the rest of `--warm` volumes' worth of them (GC reaches its steady state);
//! 4. `--turns` volumes' worth of them: measured.
//!
//! Then: first writes against overwrites (IOPS; no first-write cliff), and the p99 write
//! latency of phase 4 against phase 2 (GC must not stall writers).
//!
//! Reference: a thick `ec:4+2` volume of the same size on the capacity drives (each 4 KiB write a
//! journaled read-modify-write of its stripe), `--reference` bytes of uniform random 4 KiB writes.
//! (The in-place tiered kind the issue measured at 40.7 no longer exists.)
//!
//! Printed per phase: capacity bytes per host byte (data region, and all regions: the engine's
//! checksum pages, intent bitmap and journal too), fast bytes per host byte (all regions), the
//! share of capacity data writes that are at least 128 KiB per drive, GC moves, and host IOPS.
//! Everything written is read back and checked at the end of each volume's run.

#![allow(clippy::cast_possible_truncation)]

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use stria_dev::mem::MemDevice;
use stria_dev::{BLOCK_BYTES, DevCountersSnapshot, IoBytes};
use stria_engine::{DriveClass, Layout, NewDrive, Pool, VolumeRole, VolumeSpec};
use stria_tier::log::{self, GcPolicy, LogParams, LogSpec, LogVolume};

use crate::host::{cpu_model, num_cpus};
use crate::regions::{REGIONS, Region, RegionCounters, Tap};

type Dev = Tap<MemDevice>;

const DATA_SHARDS: u32 = 4;
const PARITY_SHARDS: u32 = 2;
const CHUNK: u64 = 128 << 10;
const SEQ_BYTES: usize = 512 << 10;
/// Drive space beyond what the parts need (superblocks, metadata, intent, journal, checksums).
const SLACK: u64 = 192 << 20;

/// Options of `target/release/stria-bench-wa`.
#[derive(Clone, Debug, clap::Args)]
pub struct WaBenchArgs {
    /// Logical size of the volumes.
    #[arg(long, default_value = "1g", value_parser = crate::parse_positive_size)]
    pub volume: u64,
    /// Fills of the capacity tier to measure (volume size / segment space).
    #[arg(long, value_delimiter = ',', default_value = "0.6667,0.8")]
    pub fills: Vec<f64>,
    /// Volumes' worth of random writes before the measured phase.
    #[arg(long, default_value_t = 2.0)]
    pub warm: f64,
    /// Volumes' worth of random writes measured.
    #[arg(long, default_value_t = 1.0)]
    pub turns: f64,
    /// Requests in flight.
    #[arg(long, default_value_t = 16)]
    pub qd: usize,
    /// Random-write bytes of the thick ec:4+2 reference (0: skip it).
    #[arg(long, default_value = "256m", value_parser = crate::parse_size_or_zero)]
    pub reference: u64,
    /// Write cache of every volume.
    #[arg(long, default_value = "128m", value_parser = crate::parse_positive_size)]
    pub cache: u64,
    /// Seed of the random offsets and data.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Where the random overwrites go: `uniform`, `80/20` (80 % of the writes to 20 % of the
    /// blocks) or `zipf` (Zipf's law with exponent 1.1 over the blocks' ranks); the hot blocks
    /// are scattered over the volume.
    #[arg(long, value_delimiter = ',', default_value = "uniform")]
    pub workloads: Vec<Workload>,
    /// GC victim policies, each run on the same writes (same seed), with cost over greedy's.
    #[arg(long, value_delimiter = ',', default_value = "temperature,greedy")]
    pub gc: Vec<GcPolicy>,
}

/// Where random overwrites go.
#[derive(Clone, Copy, Debug, PartialEq, clap::ValueEnum)]
pub enum Workload {
    /// Every block alike.
    Uniform,
    /// 80 % of the writes to 20 % of the blocks.
    #[value(name = "80/20")]
    Hot80,
    /// Zipf 1.1 over the blocks' ranks.
    Zipf,
}

impl std::fmt::Display for Workload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Workload::Uniform => "uniform",
            Workload::Hot80 => "80/20",
            Workload::Zipf => "zipf 1.1",
        })
    }
}

/// Draws the blocks of a [`Workload`]: a rank (0 the hottest), scattered over the volume by a
/// multiplication that permutes the blocks.
struct Picker {
    workload: Workload,
    blocks: u64,
    /// Zipf: the cumulative weight of ranks 0..=i, normalised to 1.
    cdf: Vec<f64>,
}

impl Picker {
    /// A prime: coprime with any block count below it, so `rank * SCATTER % blocks` permutes.
    const SCATTER: u64 = 2_654_435_761;

    fn new(workload: Workload, blocks: u64) -> Picker {
        let cdf = if workload == Workload::Zipf {
            let mut acc = 0.0;
            let mut cdf: Vec<f64> = (1..=blocks)
                .map(|r| {
                    acc += (r as f64).powf(-1.1);
                    acc
                })
                .collect();
            cdf.iter_mut().for_each(|c| *c /= acc);
            cdf
        } else {
            Vec::new()
        };
        Picker { workload, blocks, cdf }
    }

    fn next(&self, rand: &mut Rand) -> u64 {
        let r = rand.next();
        let rank = match self.workload {
            Workload::Uniform => return r % self.blocks,
            Workload::Hot80 => {
                let hot = (self.blocks / 5).max(1);
                if r % 100 < 80 { (r >> 8) % hot } else { hot + (r >> 8) % (self.blocks - hot).max(1) }
            }
            Workload::Zipf => {
                let u = (r >> 11) as f64 / (1u64 << 53) as f64;
                self.cdf.partition_point(|&c| c < u).min(self.cdf.len() - 1) as u64
            }
        };
        (rank % self.blocks) * (Self::SCATTER % self.blocks) % self.blocks
    }
}

/// Drive-write counters of one moment, by class and region.
#[derive(Clone, Debug, Default)]
struct Bytes {
    cap: [DevCountersSnapshot; REGIONS],
    fast: [DevCountersSnapshot; REGIONS],
}

impl Bytes {
    fn total(r: &[DevCountersSnapshot; REGIONS]) -> u64 {
        r.iter().map(|s| s.write_bytes).sum()
    }
}

struct Rig {
    pool: Arc<Pool<Dev>>,
    taps: Vec<(bool, Arc<RegionCounters>)>,
}

impl Rig {
    async fn build(fast_bytes: u64, cap_bytes: u64) -> Result<Rig> {
        let mut drives = Vec::new();
        let mut taps = Vec::new();
        for i in 0..2 + (DATA_SHARDS + PARITY_SHARDS) as usize {
            let is_cap = i >= 2;
            let name = format!("{}-{i}", if is_cap { "capacity" } else { "fast" });
            let size = if is_cap { cap_bytes } else { fast_bytes };
            let tap = Tap::new(MemDevice::new(&name, size.next_multiple_of(1 << 20)))?.yielding();
            taps.push((is_cap, Arc::clone(tap.regions())));
            drives.push(NewDrive {
                dev: tap,
                path: name,
                class: if is_cap { DriveClass::Capacity } else { DriveClass::Fast },
                domain: String::new(),
                fresh: true,
            });
        }
        let pool = Arc::new(Pool::create("bench-wa", drives).await.context("creating the pool")?);
        Ok(Rig { pool, taps })
    }

    fn bytes(&self) -> Bytes {
        let mut b = Bytes::default();
        for (is_cap, t) in &self.taps {
            let into = if *is_cap { &mut b.cap } else { &mut b.fast };
            for (o, s) in into.iter_mut().zip(t.snapshot()) {
                o.add(&s);
            }
        }
        b
    }
}

/// What one phase cost.
#[derive(Debug, Clone)]
struct Phase {
    name: String,
    host_bytes: u64,
    cap_data: u64,
    cap_all: u64,
    fast_all: u64,
    /// Fast drives by region (meta, intent, journal, checksums, data).
    fast_regions: [u64; REGIONS],
    /// Capacity data-region writes, and those of at least 128 KiB.
    cap_writes: u64,
    cap_large_writes: u64,
    gc_moved: u64,
    iops: f64,
    /// Write latency quantiles (microseconds): p50, p99.
    latency_us: Option<(f64, f64)>,
}

impl Phase {
    fn from(
        name: &str,
        host_bytes: u64,
        before: &Bytes,
        after: &Bytes,
        gc_moved: u64,
        ops: u64,
        secs: f64,
    ) -> Phase {
        let data = Region::Data as usize;
        let hist_large = |s: &DevCountersSnapshot| -> u64 { s.write_size_hist.iter().skip(5).sum() };
        Phase {
            name: name.into(),
            host_bytes,
            cap_data: after.cap[data].write_bytes - before.cap[data].write_bytes,
            cap_all: Bytes::total(&after.cap) - Bytes::total(&before.cap),
            fast_all: Bytes::total(&after.fast) - Bytes::total(&before.fast),
            fast_regions: std::array::from_fn(|r| after.fast[r].write_bytes - before.fast[r].write_bytes),
            cap_writes: after.cap[data].write_ops - before.cap[data].write_ops,
            cap_large_writes: hist_large(&after.cap[data]) - hist_large(&before.cap[data]),
            gc_moved,
            iops: ops as f64 / secs.max(1e-9),
            latency_us: None,
        }
    }

    /// With the latencies of its writes.
    fn with_latencies(mut self, mut lat: Vec<f64>) -> Phase {
        self.latency_us = Some((quantile(&mut lat, 0.5), quantile(&mut lat, 0.99)));
        self
    }

    fn print(&self) {
        let per = |x: u64| x as f64 / self.host_bytes.max(1) as f64;
        let share = if self.cap_writes == 0 {
            100.0
        } else {
            100.0 * self.cap_large_writes as f64 / self.cap_writes as f64
        };
        println!(
            "  {:<28} host {:>7.1} MiB  capacity/host {:>6.3} (data) {:>6.3} (all)  fast/host {:>6.3}  >=128KiB {:>5.1}%  GC moved {:>8}  {:>8.0} IOPS",
            self.name,
            self.host_bytes as f64 / (1 << 20) as f64,
            per(self.cap_data),
            per(self.cap_all),
            per(self.fast_all),
            share,
            self.gc_moved,
            self.iops
        );
        if let Some((p50, p99)) = self.latency_us {
            println!("  {:<28} write latency p50 {p50:.0} us, p99 {p99:.0} us", "");
        }
        let r = |x: Region| per(self.fast_regions[x as usize]);
        println!(
            "  {:<28} fast/host by region: data {:.3}, checksum pages {:.3}, intent {:.3}, journal {:.3}, pool metadata {:.3}",
            "",
            r(Region::Data),
            r(Region::Checksums),
            r(Region::Intent),
            r(Region::Journal),
            r(Region::Meta)
        );
    }
}

/// A tiny deterministic generator (xorshift*), so runs are comparable.
struct Rand(u64);

impl Rand {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// The data of (block, version): checkable without keeping it.
fn block_data(block: u64, version: u32) -> IoBytes {
    let mut v = vec![0u8; BLOCK_BYTES as usize];
    let mut r = Rand(block.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ u64::from(version) ^ 0xabcd);
    for c in v.chunks_exact_mut(8) {
        c.copy_from_slice(&r.next().to_le_bytes());
    }
    IoBytes::copy_from(&v)
}

/// Writes `count` random 4 KiB blocks with `qd` in flight through `write` (only blocks never
/// written when `first_only`); `versions` tracks the last version of each block. Returns each
/// write's latency in microseconds.
async fn random_writes<F, Fut>(
    count: u64,
    qd: usize,
    rand: &mut Rand,
    picker: &Picker,
    versions: &mut [u32],
    first_only: bool,
    write: F,
) -> Result<Vec<f64>>
where
    F: Fn(u64, IoBytes) -> Fut,
    Fut: std::future::Future<Output = Result<(), stria_engine::VolumeError>>,
{
    let mut done = 0;
    let mut latencies = Vec::with_capacity(count as usize);
    while done < count {
        let n = (count - done).min(qd as u64);
        let mut batch = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let b = picker.next(rand);
            // Two writes of one block in one round would race: skip the duplicate.
            if batch.iter().any(|&(x, _)| x == b) || (first_only && versions[b as usize] != 0) {
                continue;
            }
            versions[b as usize] += 1;
            batch.push((b, versions[b as usize]));
        }
        let timed = batch.iter().map(|&(b, v)| {
            let w = write(b * BLOCK_BYTES, block_data(b, v));
            async move {
                let t = Instant::now();
                w.await?;
                Ok::<_, stria_engine::VolumeError>(t.elapsed().as_secs_f64() * 1e6)
            }
        });
        latencies.extend(stria_engine::join_all_ok(timed).await.context("random write")?);
        done += n;
    }
    Ok(latencies)
}

/// The `q` quantile (0..1) of `v` (sorted in place).
fn quantile(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

async fn check_all<F, Fut>(blocks: u64, versions: &[u32], read: F) -> Result<()>
where
    F: Fn(u64, usize) -> Fut,
    Fut: std::future::Future<Output = Result<stria_dev::IoBuf, stria_engine::VolumeError>>,
{
    let step = 256u64;
    let mut b = 0;
    while b < blocks {
        let n = step.min(blocks - b);
        let got = read(b * BLOCK_BYTES, (n * BLOCK_BYTES) as usize).await.context("read back")?;
        for k in 0..n {
            let v = versions[(b + k) as usize];
            let want: &[u8] = if v == 0 { &[0u8; 4096] } else { &block_data(b + k, v)[..] };
            let at = (k * BLOCK_BYTES) as usize;
            if got[at..at + BLOCK_BYTES as usize] != *want {
                bail!("block {} does not read back as version {v}", b + k);
            }
        }
        b += n;
    }
    Ok(())
}

const FIRST: &str = "random 4 KiB, first writes";
const BEFORE_GC: &str = "random 4 KiB, before GC";
const WARM: &str = "random 4 KiB (warm-up)";
const MEASURED: &str = "random 4 KiB (measured)";

/// Runs the volume of one fill; returns its phases and the summary lines (printed after them).
async fn log_run(
    args: &WaBenchArgs,
    fill: f64,
    workload: Workload,
    policy: GcPolicy,
) -> Result<(Vec<Phase>, Vec<String>)> {
    let space = (args.volume as f64 / fill) as u64;
    let raw_per_drive = space / u64::from(DATA_SHARDS) + (64 << 20);
    let spec = LogSpec {
        chunk_bytes: CHUNK,
        space_bytes: Some(space),
        cache_bytes: Some(args.cache),
        fast_tier: true,
        ..LogSpec::new("wa", args.volume, DATA_SHARDS, PARITY_SHARDS)
    };
    // The fast drives hold the metadata part and the cache, sized as `create` sizes them.
    let meta_bytes = log::plan(&spec).context("sizing the log volume")?.meta_bytes;
    let rig = Rig::build(args.cache + meta_bytes + SLACK, raw_per_drive + SLACK).await?;
    let vol: Arc<LogVolume<Dev>> = log::create(&rig.pool, spec).await.context("creating the log volume")?;
    vol.set_params(LogParams { gc: policy, ..vol.params() });
    let geo = vol.geometry();
    println!(
        "{}, fill {:.1}%, {workload} overwrites, GC {policy:?}: {} segments of {} MiB data ({} rows of {} KiB per batch), cache {} MiB",
        vol.layout(),
        fill * 100.0,
        geo.segments,
        (geo.segment_data() * BLOCK_BYTES) >> 20,
        geo.batch_rows,
        (geo.row_blocks * BLOCK_BYTES) >> 10,
        args.cache >> 20
    );
    let blocks = args.volume / BLOCK_BYTES;
    let mut versions = vec![0u32; blocks as usize];
    let mut phases = Vec::new();
    let gc = |v: &LogVolume<Dev>| v.status().gc_moved_blocks;
    let mut rand = Rand(args.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let (uniform, picker) = (Picker::new(Workload::Uniform, blocks), Picker::new(workload, blocks));
    // 0. First writes: random 4 KiB writes to never-written blocks of the new volume (a quarter
    // of it), against the overwrites below: a thin volume should have no first-write cliff.
    {
        let count = blocks / 4;
        let (before, gc0, t) = (rig.bytes(), gc(&vol), Instant::now());
        let lat = random_writes(count, args.qd, &mut rand, &uniform, &mut versions, true, |o, d| {
            vol.write(o, d, false)
        })
        .await?;
        let secs = t.elapsed().as_secs_f64();
        vol.destage_all().await.context("destage")?;
        phases.push(
            Phase::from(FIRST, count * BLOCK_BYTES, &before, &rig.bytes(), gc(&vol) - gc0, count, secs)
                .with_latencies(lat),
        );
    }
    // 1. Sequential fill.
    let (before, gc0, t) = (rig.bytes(), gc(&vol), Instant::now());
    let per = (SEQ_BYTES as u64 / BLOCK_BYTES) as usize;
    let mut at = 0u64;
    while at < blocks {
        let mut futs = Vec::new();
        for _ in 0..4 {
            if at >= blocks {
                break;
            }
            let n = (blocks - at).min(per as u64);
            let mut buf = Vec::with_capacity((n * BLOCK_BYTES) as usize);
            for b in at..at + n {
                versions[b as usize] = 1;
                buf.extend_from_slice(&block_data(b, 1));
            }
            futs.push(vol.write(at * BLOCK_BYTES, IoBytes::copy_from(&buf), false));
            at += n;
        }
        stria_engine::join_all_ok(futs).await.context("sequential write")?;
    }
    let secs = t.elapsed().as_secs_f64();
    vol.destage_all().await.context("destage")?;
    phases.push(Phase::from(
        "sequential 512 KiB (fill)",
        args.volume,
        &before,
        &rig.bytes(),
        gc(&vol) - gc0,
        blocks / per as u64,
        secs,
    ));
    // 2. Overwrites while the space is still free (GC has not started: it starts one segment
    // above the reserve), 3. warm-up, 4. measured (GC in its steady state).
    let st = vol.status();
    // Free segments, and those the space may still grow by (it grows before it collects while
    // its live blocks fill more than 2/3 of it).
    let free_segments = st.free_segments + (st.space_max_bytes - st.space_bytes) / st.segment_bytes;
    let before_gc = (free_segments.saturating_sub(st.reserved_bytes / st.segment_bytes + 3)
        * st.segment_bytes
        / BLOCK_BYTES)
        .min(blocks / 2);
    let warm = (blocks as f64 * args.warm) as u64;
    for (name, count) in [
        (BEFORE_GC, before_gc),
        (WARM, warm.saturating_sub(before_gc)),
        (MEASURED, (blocks as f64 * args.turns) as u64),
    ] {
        let (before, gc0, t) = (rig.bytes(), gc(&vol), Instant::now());
        let lat = random_writes(count, args.qd, &mut rand, &picker, &mut versions, false, |o, d| {
            vol.write(o, d, false)
        })
        .await?;
        let secs = t.elapsed().as_secs_f64();
        vol.destage_all().await.context("destage")?;
        phases.push(
            Phase::from(name, count * BLOCK_BYTES, &before, &rig.bytes(), gc(&vol) - gc0, count, secs)
                .with_latencies(lat),
        );
    }
    let find = |name: &str| phases.iter().find(|p| p.name == name).cloned();
    let mut summary = Vec::new();
    if let (Some(first), Some(free), Some(steady)) = (find(FIRST), find(BEFORE_GC), find(MEASURED)) {
        let p99 = |p: &Phase| p.latency_us.map_or(f64::NAN, |l| l.1);
        summary.push(format!(
            "  first writes vs overwrites: {:.0} / {:.0} IOPS = {:.2}x before GC, {:.0} IOPS = {:.2}x in GC's steady state (goal >= 0.8x)",
            first.iops,
            free.iops,
            first.iops / free.iops,
            steady.iops,
            first.iops / steady.iops
        ));
        summary.push(format!(
            "  p99 write latency with GC / before GC: {:.0} / {:.0} us = {:.2}x (goal <= 3x; GC moved {} blocks before GC started)",
            p99(&steady),
            p99(&free),
            p99(&steady) / p99(&free),
            free.gc_moved
        ));
    }
    check_all(blocks, &versions, |o, n| vol.read(o, n)).await?;
    let m = vol.map_stats();
    println!(
        "  map: {} deltas in {} log blocks ({:.1} a block), {} checkpoints wrote {} pages",
        m.deltas_logged,
        m.log_blocks_written,
        m.deltas_logged as f64 / m.log_blocks_written.max(1) as f64,
        m.checkpoints,
        m.pages_written
    );
    let st = vol.status();
    println!(
        "  space: {} segments (at most {}), {} free, {} MiB allocated, {} MiB garbage; seg volume stripes: {} full, {} partial",
        st.segments,
        st.space_max_bytes / st.segment_bytes,
        st.free_segments,
        st.allocated_bytes >> 20,
        st.garbage_bytes >> 20,
        st.parts[2].full_stripe_writes,
        st.parts[2].partial_stripe_writes
    );
    let gc_read = vol.counters().gc_read_blocks.load(std::sync::atomic::Ordering::Relaxed);
    println!(
        "  destage: {} batches, {} of hot blocks; GC: {} victims, {} blocks moved, {} read ({:.2} a block moved)",
        st.destage_batches,
        st.destage_hot_batches,
        st.gc_victims,
        st.gc_moved_blocks,
        gc_read,
        gc_read as f64 / st.gc_moved_blocks.max(1) as f64
    );
    vol.close().await;
    rig.pool.close().await.context("closing the pool")?;
    Ok((phases, summary))
}

async fn reference_run(args: &WaBenchArgs) -> Result<Phase> {
    let rows = args.volume.div_ceil(u64::from(DATA_SHARDS) * CHUNK);
    let rig = Rig::build(SLACK, rows * CHUNK + SLACK).await?;
    let spec = VolumeSpec {
        name: "ref".into(),
        size_bytes: args.volume,
        layout: Layout::Ec { data_shards: DATA_SHARDS, parity_shards: PARITY_SHARDS },
        chunk_bytes: CHUNK,
        class: DriveClass::Capacity,
        role: VolumeRole::Plain,
    };
    let vol = rig.pool.create_volume(spec).await.context("creating the ec volume")?;
    let blocks = args.volume / BLOCK_BYTES;
    let mut versions = vec![0u32; blocks as usize];
    let mut rand = Rand(args.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let count = args.reference / BLOCK_BYTES;
    let (before, t) = (rig.bytes(), Instant::now());
    let lat = random_writes(
        count,
        args.qd,
        &mut rand,
        &Picker::new(Workload::Uniform, blocks),
        &mut versions,
        false,
        |o, d| vol.write(o, d, false),
    )
    .await?;
    vol.flush().await.context("flush")?;
    let secs = t.elapsed().as_secs_f64();
    let phase =
        Phase::from("thick ec:4+2, random 4 KiB", count * BLOCK_BYTES, &before, &rig.bytes(), 0, count, secs)
            .with_latencies(lat);
    check_all(blocks, &versions, |o, n| vol.read(o, n)).await?;
    drop(vol);
    rig.pool.close().await.context("closing the pool")?;
    Ok(phase)
}

/// Greedy GC's capacity bytes per host byte for uniform random writes at `fill` (the live
/// fraction x of its victims solves (1 - x) / (-ln x) = fill; each victim frees 1 - x of a
/// segment), times the parity of ec:K+M.
fn greedy_limit(fill: f64) -> f64 {
    let (mut lo, mut hi) = (1e-9, 1.0 - 1e-9);
    for _ in 0..100 {
        let x = f64::midpoint(lo, hi);
        if (1.0 - x) / -x.ln() < fill { lo = x } else { hi = x }
    }
    let x = f64::midpoint(lo, hi);
    1.0 / (1.0 - x) * f64::from(DATA_SHARDS + PARITY_SHARDS) / f64::from(DATA_SHARDS)
}

/// The measured phases side by side: each policy's capacity bytes per host byte (data region),
/// over greedy's on the same writes, and greedy's limit for uniform writes.
fn print_costs(costs: &[(f64, Workload, GcPolicy, f64)]) {
    println!("\nmeasured phase, capacity bytes per host byte (data region):");
    println!(
        "  {:<6} {:<10} {:<13} {:>7} {:>10} {:>15}",
        "fill", "workload", "GC", "cost", "/ greedy", "greedy's limit"
    );
    for &(fill, workload, policy, cost) in costs {
        let greedy = costs
            .iter()
            .find(|c| c.0 == fill && c.1 == workload && c.2 == GcPolicy::Greedy)
            .map_or(String::from("-"), |g| format!("{:.2}", cost / g.3));
        let limit =
            if workload == Workload::Uniform { format!("{:.2}", greedy_limit(fill)) } else { "-".into() };
        println!(
            "  {:<6} {:<10} {:<13} {:>7.3} {:>10} {:>15}",
            format!("{:.1}%", fill * 100.0),
            workload.to_string(),
            format!("{policy:?}"),
            cost,
            greedy,
            limit
        );
    }
}

/// Runs the benchmark.
pub fn run(args: &WaBenchArgs) -> Result<()> {
    if args.fills.iter().any(|f| !(0.05..=0.95).contains(f)) {
        bail!("--fills must be between 0.05 and 0.95");
    }
    println!(
        "stria-bench-wa on {} ({} CPUs online); erasure-code kernel: {:?}",
        cpu_model(),
        num_cpus(),
        stria_ec::Backend::detect()
    );
    println!(
        "volume {} MiB, cache {} MiB, qd {}, warm-up {} and measured {} volumes of random writes",
        args.volume >> 20,
        args.cache >> 20,
        args.qd,
        args.warm,
        args.turns
    );
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async {
        if args.reference > 0 {
            println!("reference (thick ec:{DATA_SHARDS}+{PARITY_SHARDS} on the capacity drives, same size):");
            reference_run(args).await?.print();
        }
        // Capacity bytes per host byte of each measured phase: (fill, workload, policy, cost).
        let mut costs: Vec<(f64, Workload, GcPolicy, f64)> = Vec::new();
        for &fill in &args.fills {
            for &workload in &args.workloads {
                for &policy in &args.gc {
                    let (phases, summary) = log_run(args, fill, workload, policy).await?;
                    if let Some(m) = phases.iter().find(|p| p.name == MEASURED) {
                        costs.push((fill, workload, policy, m.cap_data as f64 / m.host_bytes.max(1) as f64));
                    }
                    for p in phases {
                        p.print();
                    }
                    for line in summary {
                        println!("{line}");
                    }
                }
            }
        }
        print_costs(&costs);
        Ok(())
    })
}
