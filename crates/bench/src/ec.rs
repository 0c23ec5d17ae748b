//! `cargo run --release -p stria-bench --bin stria-bench-ec --`: erasure-code throughput of
//! stria-ec against Intel ISA-L, and against the memory limits (k-way XOR and memcpy), on the
//! same buffers in the same run.
//!
//! Throughput is GB/s of data: `K x shard bytes` per encode or reconstruct call, and the changed
//! bytes (`shard bytes`) per update call, over 10^9. Each figure is the median of `--samples`
//! samples; stria and ISA-L samples alternate so that frequency drift and noisy neighbours hit
//! both alike.
//!
//! Shards below `--cold-from` are "hot": one stripe, reused, so it stays in cache. Larger shards
//! are "cold": the run cycles through stripes totalling at least `--cold-mib` MiB of data, so
//! every call reads from memory.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use stria_ec::{Backend, ReedSolomon};

use crate::isal::Isal;

/// What to measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Op {
    /// Compute all M parity shards from K data shards.
    Encode,
    /// Rebuild M lost data shards from the K survivors, decode tables cached.
    Reconstruct,
    /// The same, inverting the survivors' matrix on every call.
    ReconstructUncached,
    /// Patch the M parity shards for a new version of one data shard (old and new given).
    Update,
    /// The same, given old XOR new.
    UpdateDelta,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Encode => "encode",
            Op::Reconstruct => "reconstruct",
            Op::ReconstructUncached => "reconstruct-uncached",
            Op::Update => "update",
            Op::UpdateDelta => "update-delta",
        }
    }
}

/// A stripe shape, written `K+M`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Data shards.
    pub k: usize,
    /// Parity shards.
    pub m: usize,
}

fn parse_shape(s: &str) -> Result<Shape, String> {
    let (k, m) = s.split_once('+').ok_or_else(|| format!("expected K+M, got {s:?}"))?;
    let k: usize = k.trim().parse().map_err(|e| format!("{s:?}: {e}"))?;
    let m: usize = m.trim().parse().map_err(|e| format!("{s:?}: {e}"))?;
    if k == 0 || m == 0 || m > MAX_PARITY || k + m > MAX_SHARDS {
        return Err(format!("{s:?}: need K, M >= 1, M <= {MAX_PARITY} and K + M <= {MAX_SHARDS}"));
    }
    Ok(Shape { k, m })
}

/// Parses `4096`, `4k`, `64KiB`, `1m`, `1MiB`: [`crate::parse_positive_size`] as a `usize`.
pub(crate) fn parse_bytes(s: &str) -> Result<usize, String> {
    let n = crate::parse_positive_size(s)?;
    usize::try_from(n).map_err(|_| format!("{s:?}: too large for this machine"))
}

/// Most shards per stripe the benchmark handles (keeps its pointer arrays on the stack).
const MAX_SHARDS: usize = 64;
/// Most parity shards per stripe the benchmark handles.
const MAX_PARITY: usize = 8;

/// Options of `target/release/stria-bench-ec`.
#[derive(Clone, Debug, clap::Args)]
pub struct EcBenchArgs {
    /// Operations to measure.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "encode,reconstruct,reconstruct-uncached,update"
    )]
    pub ops: Vec<Op>,
    /// Stripe shapes, K+M.
    #[arg(long, value_parser = parse_shape, value_delimiter = ',', default_value = "4+2,8+2,8+3,10+4,16+4")]
    pub shapes: Vec<Shape>,
    /// Shard sizes (4k, 64k, 1m, ...).
    #[arg(long, value_parser = parse_bytes, value_delimiter = ',', default_value = "4k,64k,1m")]
    pub sizes: Vec<usize>,
    /// Samples per figure; the median is reported.
    #[arg(long, default_value_t = 7)]
    pub samples: usize,
    /// Data processed per hot sample, MiB.
    #[arg(long, default_value_t = 128)]
    pub sample_mib: usize,
    /// Shards of at least this size are measured cold, from memory.
    #[arg(long, value_parser = parse_bytes, default_value = "1m")]
    pub cold_from: usize,
    /// Data cycled through when cold, MiB (at least).
    #[arg(long, default_value_t = 256)]
    pub cold_mib: usize,
    /// Force a stria-ec backend (gfni-avx512, gfni-avx2, avx512bw, avx2, ssse3, scalar).
    #[arg(long)]
    pub backend: Option<String>,
    /// The ISA-L shared library to compare with (default: .bench/isal, then the system's).
    #[arg(long)]
    pub isal: Option<PathBuf>,
    /// Skip ISA-L.
    #[arg(long)]
    pub no_isal: bool,
    /// Print one JSON object per cell instead of the table.
    #[arg(long)]
    pub json: bool,
    /// How samples are timed: `cpu` counts only the time the benchmark thread ran
    /// (CLOCK_THREAD_CPUTIME_ID), so other processes sharing the cores don't inflate it; `wall` is
    /// elapsed time.
    #[arg(long, value_enum, default_value = "cpu")]
    pub clock: Clock,
    /// Skip the XOR and memcpy reference figures.
    #[arg(long)]
    pub no_limits: bool,
}

/// The clock samples are timed with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Clock {
    /// On-CPU time of the benchmark thread.
    Cpu,
    /// Elapsed time.
    Wall,
}

/// One measured figure.
#[derive(Clone, Debug)]
struct Cell {
    shape: Shape,
    shard_bytes: usize,
    cold: bool,
    op: Op,
    gbps: f64,
    isal_gbps: Option<f64>,
    xor_gbps: f64,
    memcpy_gbps: f64,
}

impl Cell {
    fn ratio(&self) -> Option<f64> {
        self.isal_gbps.map(|i| self.gbps / i)
    }
}

/// Runs the benchmark and prints the table (or JSON) to stdout.
///
/// # Errors
/// Bad options, an unsupported backend, or (with `--isal`) a library that can't be loaded.
pub fn run(args: &EcBenchArgs) -> Result<()> {
    if args.samples == 0 || args.ops.is_empty() || args.shapes.is_empty() || args.sizes.is_empty() {
        bail!("nothing to measure: samples, ops, shapes and sizes must be non-empty");
    }
    let backend = match &args.backend {
        Some(name) => Backend::from_name(name).with_context(|| format!("unknown backend {name:?}"))?,
        None => Backend::detect(),
    };
    let isal = if args.no_isal {
        None
    } else {
        match Isal::load(args.isal.as_deref()) {
            Ok(isal) => Some(isal),
            Err(e) if args.isal.is_none() => {
                eprintln!("warning: running without ISA-L: {e:#}");
                None
            }
            Err(e) => return Err(e),
        }
    };
    if !args.json {
        print_header(backend, isal.as_ref(), args);
    }
    let mut cells = Vec::new();
    for &shape in &args.shapes {
        for &shard_bytes in &args.sizes {
            let rs = ReedSolomon::with_backend(shape.k, shape.m, backend)?;
            let mut bench = StripeSet::new(shape, shard_bytes, args);
            let new_cells = bench.measure_all(&rs, isal.as_ref(), args);
            if !args.json {
                for cell in &new_cells {
                    println!("{}", table_row(cell));
                }
            }
            cells.extend(new_cells);
        }
    }
    if args.json {
        println!("{}", to_json(&cells, backend, isal.as_ref()));
    } else {
        print!("{}", goals_summary(&cells));
    }
    Ok(())
}

fn print_header(backend: Backend, isal: Option<&Isal>, args: &EcBenchArgs) {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    println!("stria-ec backend {backend} on {cpu}");
    match isal {
        Some(i) => println!("ISA-L {} from {}", i.version(), i.path().display()),
        None => println!("ISA-L: not loaded"),
    }
    println!(
        "GB/s of data (10^9 B/s; K x shard per encode/reconstruct call, the changed shard per update), median of {} samples \
         timed on the {:?} clock; cold = shards cycled over >= {} MiB",
        args.samples, args.clock, args.cold_mib
    );
    println!(
        "{:>6} {:>8} {:>4} {:<21} {:>8} {:>8} {:>7} {:>8} {:>8}",
        "K+M", "shard", "", "op", "stria", "ISA-L", "ratio", "xor", "memcpy"
    );
}

fn size_label(bytes: usize) -> String {
    if bytes.is_multiple_of(1 << 20) {
        format!("{}MiB", bytes >> 20)
    } else if bytes.is_multiple_of(1 << 10) {
        format!("{}KiB", bytes >> 10)
    } else {
        format!("{bytes}B")
    }
}

fn table_row(c: &Cell) -> String {
    let opt = |v: Option<f64>, suffix: &str| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.2}{suffix}"));
    format!(
        "{:>6} {:>8} {:>4} {:<21} {:>8.2} {:>8} {:>7} {:>8.2} {:>8.2}",
        format!("{}+{}", c.shape.k, c.shape.m),
        size_label(c.shard_bytes),
        if c.cold { "cold" } else { "hot" },
        c.op.name(),
        c.gbps,
        opt(c.isal_gbps, ""),
        opt(c.ratio(), "x"),
        c.xor_gbps,
        c.memcpy_gbps
    )
}

fn json_num(v: Option<f64>) -> String {
    v.filter(|v| v.is_finite()).map_or_else(|| "null".to_owned(), |v| format!("{v:.3}"))
}

fn to_json(cells: &[Cell], backend: Backend, isal: Option<&Isal>) -> String {
    let isal_version = isal.map_or_else(|| "null".to_owned(), |i| format!("\"{}\"", i.version()));
    let objects: Vec<String> = cells
        .iter()
        .map(|c| {
            format!(
                "{{\"k\":{},\"m\":{},\"shard_bytes\":{},\"cold\":{},\"op\":\"{}\",\"gbps\":{},\"isal_gbps\":{},\"ratio\":{},\
                 \"xor_gbps\":{},\"memcpy_gbps\":{},\"backend\":\"{}\",\"isal_version\":{}}}",
                c.shape.k,
                c.shape.m,
                c.shard_bytes,
                c.cold,
                c.op.name(),
                json_num(Some(c.gbps)),
                json_num(c.isal_gbps),
                json_num(c.ratio()),
                json_num(Some(c.xor_gbps)),
                json_num(Some(c.memcpy_gbps)),
                backend.name(),
                isal_version
            )
        })
        .collect();
    format!("[\n{}\n]", objects.join(",\n"))
}

/// The ratios the goals are stated in, per shape and size.
fn goals_summary(cells: &[Cell]) -> String {
    let find = |c: &Cell, op: Op| {
        cells
            .iter()
            .find(|o| o.shape == c.shape && o.shard_bytes == c.shard_bytes && o.op == op)
            .map(|o| o.gbps)
    };
    let mut out = String::from("\nratios within stria (same shape and size):\n");
    let _ = writeln!(
        out,
        "{:>6} {:>8} {:>22} {:>22} {:>16}",
        "K+M", "shard", "reconstruct/encode", "update/encode", "encode/xor"
    );
    for c in cells.iter().filter(|c| c.op == Op::Encode) {
        let fmt = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{:.2}x", v / c.gbps));
        let _ = writeln!(
            out,
            "{:>6} {:>8} {:>22} {:>22} {:>16}",
            format!("{}+{}", c.shape.k, c.shape.m),
            size_label(c.shard_bytes),
            fmt(find(c, Op::Reconstruct)),
            fmt(find(c, Op::Update)),
            format!("{:.2}x", c.gbps / c.xor_gbps)
        );
    }
    out
}

/// The buffers of one (shape, shard size) cell: `stripes` stripes of K data, M parity and M
/// rebuilt shards, laid out back to back with a small gap so shards don't alias in the cache.
struct StripeSet {
    shape: Shape,
    shard_bytes: usize,
    stride: usize,
    stripes: usize,
    cold: bool,
    /// Calls per sample.
    calls: usize,
    arena: Vec<u8>,
    base: usize,
    /// memcpy destination: K shards per stripe.
    copy_dst: Vec<u8>,
}

/// Bytes between consecutive shards beyond the shard itself.
const SHARD_GAP_BYTES: usize = 256;

impl StripeSet {
    fn new(shape: Shape, shard_bytes: usize, args: &EcBenchArgs) -> Self {
        let cold = shard_bytes >= args.cold_from;
        let stripe_data = shape.k * shard_bytes;
        let stripes = if cold { (args.cold_mib << 20).div_ceil(stripe_data).max(2) } else { 1 };
        let per_sample = if cold { stripes * stripe_data } else { (args.sample_mib << 20).max(stripe_data) };
        let calls = per_sample.div_ceil(stripe_data);
        let stride = (shard_bytes + SHARD_GAP_BYTES).next_multiple_of(64);
        let len = stripes * (shape.k + 2 * shape.m) * stride + 64;
        let mut arena = vec![0u8; len];
        let base = arena.as_ptr().align_offset(64);
        // Random-ish data, and every page touched before timing.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for chunk in arena.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
        }
        let copy_dst = vec![1u8; stripes * shape.k * shard_bytes];
        Self { shape, shard_bytes, stride, stripes, cold, calls, arena, base, copy_dst }
    }

    /// Borrows every stripe's shards: (data, parity, rebuilt).
    fn stripes_mut(&mut self) -> Vec<StripeRefs<'_>> {
        let (k, m, stride, shard) = (self.shape.k, self.shape.m, self.stride, self.shard_bytes);
        let body = &mut self.arena[self.base..];
        let mut shards = body.chunks_mut(stride).map(|c| &mut c[..shard]);
        (0..self.stripes)
            .map(|_| {
                let data = shards.by_ref().take(k).map(|s| &*s).collect();
                let parity = shards.by_ref().take(m).collect();
                let rebuilt = shards.by_ref().take(m).collect();
                StripeRefs { data, parity, rebuilt }
            })
            .collect()
    }

    fn measure_all(&mut self, rs: &ReedSolomon, isal: Option<&Isal>, args: &EcBenchArgs) -> Vec<Cell> {
        // Valid parity first, so that reconstruct rebuilds real data.
        for s in &mut self.stripes_mut() {
            rs.encode(&s.data, &mut s.parity).expect("benchmark stripes are well formed");
        }
        let (xor_gbps, memcpy_gbps) =
            if args.no_limits { (f64::NAN, f64::NAN) } else { self.measure_limits(args.samples, args.clock) };
        let isal_codec = isal.map(|i| IsalCodec::new(i, self.shape));
        args.ops
            .iter()
            .map(|&op| {
                let (gbps, isal_gbps) =
                    self.measure_op(op, rs, isal_codec.as_ref(), args.samples, args.clock);
                Cell {
                    shape: self.shape,
                    shard_bytes: self.shard_bytes,
                    cold: self.cold,
                    op,
                    gbps,
                    isal_gbps,
                    xor_gbps,
                    memcpy_gbps,
                }
            })
            .collect()
    }

    /// GB/s of data for one call's worth of bytes, from a sample's duration.
    fn gbps(&self, op: Op, seconds: f64) -> f64 {
        let per_call = match op {
            Op::Update | Op::UpdateDelta => self.shard_bytes,
            _ => self.shape.k * self.shard_bytes,
        };
        (per_call * self.calls) as f64 / seconds / 1e9
    }

    /// k-way XOR (K data shards into one) and memcpy (K data shards to elsewhere).
    ///
    /// The XOR figure is the better of two implementations, a plain loop and stria-ec's own
    /// `M = 1` code (a pure XOR kernel), so that a slow reference can't flatter the ratio.
    fn measure_limits(&mut self, samples: usize, clock: Clock) -> (f64, f64) {
        let (calls, k, shard) = (self.calls, self.shape.k, self.shard_bytes);
        let xor_codec = ReedSolomon::new(k, 1).expect("K + 1 shards is a valid shape");
        let mut copy_dst = std::mem::take(&mut self.copy_dst);
        let mut stripes = self.stripes_mut();
        let n = stripes.len();
        let mut xor_times = Vec::with_capacity(samples);
        let mut kernel_xor_times = Vec::with_capacity(samples);
        let mut copy_times = Vec::with_capacity(samples);
        for _ in 0..samples {
            xor_times.push(time(clock, || {
                for call in 0..calls {
                    let s = &mut stripes[call % n];
                    xor_into(s.parity[0], &s.data);
                }
            }));
            kernel_xor_times.push(time(clock, || {
                for call in 0..calls {
                    let s = &mut stripes[call % n];
                    xor_codec.encode(&s.data, &mut s.parity[..1]).expect("well-formed stripe");
                }
            }));
            copy_times.push(time(clock, || {
                for call in 0..calls {
                    let i = call % n;
                    let dst = &mut copy_dst[i * k * shard..(i + 1) * k * shard];
                    for (d, src) in dst.chunks_mut(shard).zip(&stripes[i].data) {
                        d.copy_from_slice(src);
                    }
                }
            }));
        }
        drop(stripes);
        self.copy_dst = copy_dst;
        let xor_seconds = median(&mut xor_times).min(median(&mut kernel_xor_times));
        (self.gbps(Op::Encode, xor_seconds), self.gbps(Op::Encode, median(&mut copy_times)))
    }

    fn measure_op(
        &mut self,
        op: Op,
        rs: &ReedSolomon,
        isal: Option<&IsalCodec<'_>>,
        samples: usize,
        clock: Clock,
    ) -> (f64, Option<f64>) {
        let calls = self.calls;
        let (k, shard) = (self.shape.k, self.shard_bytes);
        // Updates change a middle shard (shard 0's column is all ones, which would flatter us).
        let vec_i = k / 2;
        let stripes = self.stripes_mut();
        let mut ours = Vec::with_capacity(samples);
        let mut theirs = Vec::with_capacity(samples);
        if matches!(op, Op::Reconstruct | Op::ReconstructUncached) {
            let mut stripes: Vec<Degraded<'_>> = stripes.into_iter().map(|s| Degraded::new(s, k)).collect();
            let n = stripes.len();
            let mut scratch = isal.map(IsalCodec::scratch);
            for _ in 0..samples {
                ours.push(time(clock, || {
                    for call in 0..calls {
                        let s = &mut stripes[call % n];
                        let result = if op == Op::Reconstruct {
                            rs.reconstruct(&s.shards, &mut s.wanted)
                        } else {
                            rs.reconstruct_uncached(&s.shards, &mut s.wanted)
                        };
                        result.expect("benchmark calls are well formed");
                    }
                }));
                if let (Some(codec), Some(scratch)) = (isal, scratch.as_mut()) {
                    theirs.push(time(clock, || {
                        for call in 0..calls {
                            codec.reconstruct(op, &mut stripes[call % n], shard, scratch);
                        }
                    }));
                }
            }
        } else {
            let mut stripes = stripes;
            let n = stripes.len();
            for _ in 0..samples {
                ours.push(time(clock, || {
                    for call in 0..calls {
                        let s = &mut stripes[call % n];
                        run_ours(op, rs, s, vec_i).expect("benchmark calls are well formed");
                    }
                }));
                if let Some(codec) = isal {
                    theirs.push(time(clock, || {
                        for call in 0..calls {
                            codec.run(op, &mut stripes[call % n], vec_i, shard);
                        }
                    }));
                }
            }
        }
        let ours = self.gbps(op, median(&mut ours));
        let theirs = isal.map(|_| self.gbps(op, median(&mut theirs)));
        (ours, theirs)
    }
}

/// One stripe's shards, borrowed from the arena.
struct StripeRefs<'a> {
    data: Vec<&'a [u8]>,
    parity: Vec<&'a mut [u8]>,
    rebuilt: Vec<&'a mut [u8]>,
}

fn run_ours(op: Op, rs: &ReedSolomon, s: &mut StripeRefs<'_>, vec_i: usize) -> Result<(), stria_ec::EcError> {
    let k = rs.data_shards();
    match op {
        Op::Encode => rs.encode(&s.data, &mut s.parity),
        Op::Reconstruct | Op::ReconstructUncached => unreachable!("degraded stripes are measured apart"),
        Op::Update => rs.update(vec_i, s.data[vec_i], s.data[(vec_i + 1) % k], &mut s.parity),
        Op::UpdateDelta => rs.update_delta(vec_i, s.data[(vec_i + 1) % k], &mut s.parity),
    }
}

/// A stripe that lost data shards 0..M, with the arguments of both peers' reconstruct calls
/// built once, outside the timed loop.
struct Degraded<'a> {
    /// stria's view: K + M entries, `None` for the lost shards.
    shards: Vec<Option<&'a [u8]>>,
    /// stria's outputs: (lost shard, buffer).
    wanted: Vec<(usize, &'a mut [u8])>,
    /// ISA-L's view: the K survivors, data M..K then parity 0..M.
    survivors: Vec<&'a [u8]>,
}

impl<'a> Degraded<'a> {
    fn new(s: StripeRefs<'a>, k: usize) -> Self {
        let m = s.parity.len();
        let parity: Vec<&'a [u8]> = s.parity.into_iter().map(|p| &*p).collect();
        let shards =
            (0..k).map(|i| (i >= m).then(|| s.data[i])).chain(parity.iter().map(|&p| Some(p))).collect();
        let survivors = s.data[m..].iter().copied().chain(parity.iter().copied()).collect();
        let wanted = s.rebuilt.into_iter().enumerate().collect();
        Self { shards, wanted, survivors }
    }
}

/// `out = inputs[0] ^ inputs[1] ^ ...`, a block at a time so `out` stays in L1: K reads and one
/// write per byte, the least memory traffic any code producing parity can have.
fn xor_into(out: &mut [u8], inputs: &[&[u8]]) {
    const BLOCK: usize = 4096;
    for (b, out) in out.chunks_mut(BLOCK).enumerate() {
        let range = b * BLOCK..b * BLOCK + out.len();
        out.copy_from_slice(&inputs[0][range.clone()]);
        for input in &inputs[1..] {
            for (o, i) in out.iter_mut().zip(&input[range.clone()]) {
                *o ^= i;
            }
        }
    }
}

/// ISA-L set up for one shape the way its own example does.
struct IsalCodec<'a> {
    isal: &'a Isal,
    k: usize,
    m: usize,
    /// `(K + M) x K` generator from `gf_gen_cauchy1_matrix`.
    matrix: Vec<u8>,
    encode_tables: Vec<u8>,
    /// Tables rebuilding data 0..M from data M..K and parity 0..M, computed once ("cached").
    decode_tables: Vec<u8>,
}

/// Per-call buffers of ISA-L's uncached decode, allocated once.
struct IsalScratch {
    select: Vec<u8>,
    inverse: Vec<u8>,
    rows: Vec<u8>,
    tables: Vec<u8>,
}

impl<'a> IsalCodec<'a> {
    fn new(isal: &'a Isal, shape: Shape) -> Self {
        let (k, m) = (shape.k, shape.m);
        let matrix = isal.cauchy_matrix(k, m);
        let encode_tables = isal.init_tables(k, m, &matrix[k * k..]);
        let mut codec = Self { isal, k, m, matrix, encode_tables, decode_tables: Vec::new() };
        let mut scratch = codec.scratch();
        codec.decode_tables(&mut scratch);
        codec.decode_tables = scratch.tables;
        codec
    }

    fn scratch(&self) -> IsalScratch {
        let (k, m) = (self.k, self.m);
        IsalScratch {
            select: vec![0; k * k],
            inverse: vec![0; k * k],
            rows: vec![0; m * k],
            tables: vec![0; 32 * k * m],
        }
    }

    /// ISA-L's decode set-up for "data 0..M lost": invert the survivors' rows, keep the rows
    /// of the lost shards, expand them into tables.
    fn decode_tables(&self, s: &mut IsalScratch) {
        let (k, m) = (self.k, self.m);
        for (i, survivor) in (m..k + m).enumerate() {
            s.select[i * k..(i + 1) * k].copy_from_slice(&self.matrix[survivor * k..(survivor + 1) * k]);
        }
        assert!(self.isal.invert(&mut s.select, &mut s.inverse, k), "ISA-L's Cauchy matrix is MDS");
        s.rows.copy_from_slice(&s.inverse[..m * k]);
        s.tables = self.isal.init_tables(k, m, &s.rows);
    }

    fn reconstruct(&self, op: Op, s: &mut Degraded<'_>, len: usize, scratch: &mut IsalScratch) {
        let tables = if op == Op::Reconstruct {
            &self.decode_tables
        } else {
            self.decode_tables(scratch);
            &scratch.tables
        };
        let mut outs: [&mut [u8]; MAX_PARITY] = Default::default();
        for (o, (_, w)) in outs.iter_mut().zip(s.wanted.iter_mut()) {
            *o = &mut **w;
        }
        self.isal.encode(tables, &s.survivors, &mut outs[..self.m], len);
    }

    fn run(&self, op: Op, s: &mut StripeRefs<'_>, vec_i: usize, len: usize) {
        let k = self.k;
        match op {
            Op::Encode => self.isal.encode(&self.encode_tables, &s.data, &mut s.parity, len),
            Op::Reconstruct | Op::ReconstructUncached => unreachable!("degraded stripes are measured apart"),
            Op::Update => {
                // ISA-L's update multiplies one input into the parity: old, then new.
                self.isal.update(&self.encode_tables, k, vec_i, s.data[vec_i], &mut s.parity, len);
                self.isal.update(&self.encode_tables, k, vec_i, s.data[(vec_i + 1) % k], &mut s.parity, len);
            }
            Op::UpdateDelta => {
                self.isal.update(&self.encode_tables, k, vec_i, s.data[(vec_i + 1) % k], &mut s.parity, len);
            }
        }
    }
}

/// Seconds `f` took on `clock`.
fn time(clock: Clock, f: impl FnOnce()) -> f64 {
    match clock {
        Clock::Cpu => {
            let start = cpu_time::ThreadTime::now();
            f();
            start.elapsed().as_secs_f64()
        }
        Clock::Wall => {
            let start = Instant::now();
            f();
            start.elapsed().as_secs_f64()
        }
    }
}

fn median(samples: &mut [f64]) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_shapes_parse() {
        assert_eq!(parse_bytes("4k"), Ok(4096));
        assert_eq!(parse_bytes("64KiB"), Ok(65536));
        assert_eq!(parse_bytes("1m"), Ok(1 << 20));
        assert_eq!(parse_bytes("100"), Ok(100));
        assert!(parse_bytes("0").is_err() && parse_bytes("x").is_err());
        assert_eq!(parse_shape("10+4"), Ok(Shape { k: 10, m: 4 }));
        assert!(parse_shape("0+1").is_err() && parse_shape("10").is_err() && parse_shape("60+5").is_err());
    }

    #[test]
    fn xor_into_xors() {
        let a: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
        let b: Vec<u8> = (0..5000u32).map(|i| (i % 13) as u8).collect();
        let mut out = vec![0u8; 5000];
        xor_into(&mut out, &[&a, &b]);
        assert!(out.iter().zip(a.iter().zip(&b)).all(|(o, (x, y))| *o == x ^ y));
    }
}
