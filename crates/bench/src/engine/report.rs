//! Tables, goal lines and JSON of `target/release/stria-bench-engine`.

use std::fmt::Write as _;

use stria_engine::Layout;

use super::amp::AmpRow;
use super::{Cell, EngineBenchArgs, Op};
use crate::host::{cpu_model, num_cpus};

fn size_label(bytes: usize) -> String {
    if bytes.is_multiple_of(1 << 20) { format!("{}M", bytes >> 20) } else { format!("{}K", bytes >> 10) }
}

fn raw_for<'a>(cells: &'a [Cell], c: &Cell) -> Option<&'a Cell> {
    cells
        .iter()
        .find(|r| r.layout.is_none() && r.drives == c.drives && r.op == c.op && r.req_bytes == c.req_bytes)
}

fn healthy_for<'a>(cells: &'a [Cell], c: &Cell) -> Option<&'a Cell> {
    cells.iter().find(|h| h.layout == c.layout && !h.degraded && h.op == c.op && h.req_bytes == c.req_bytes)
}

fn vs_raw(cells: &[Cell], c: &Cell) -> Option<f64> {
    c.layout?;
    raw_for(cells, c).map(|r| c.iops() / r.iops())
}

fn vs_healthy(cells: &[Cell], c: &Cell) -> Option<f64> {
    if !c.degraded {
        return None;
    }
    healthy_for(cells, c).map(|h| c.iops() / h.iops())
}

fn state(c: &Cell) -> &'static str {
    match (c.layout, c.degraded) {
        (None, _) => "-",
        (_, false) => "healthy",
        (_, true) => "degraded",
    }
}

fn ratio(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.2}x"))
}

/// Drive reads per host request, and drive bytes written per host byte.
fn drive_io(c: &Cell) -> (f64, f64) {
    let ops = c.ops.max(1) as f64;
    let host_bytes = ops * c.req_bytes as f64;
    (c.drive_read_ops as f64 / ops, c.drive_write_bytes as f64 / host_bytes)
}

pub(super) fn print(
    cells: &[Cell],
    amp: &[AmpRow],
    args: &EngineBenchArgs,
    load_before: &str,
    load_after: &str,
) {
    let mode = if args.threads == 1 { "current-thread" } else { "multi-thread" };
    println!("stria-bench-engine on {} ({} CPUs online)", cpu_model(), num_cpus());
    println!(
        "memory drives (MemDevice); working set {} MiB per cell; chunk {}; QD {} ({} tasks{}) on {} runtime thread(s) \
         (tokio {mode}); median of {} runs of {} ms after 1 warm-up; IOPS by the {:?} clock; latency = submit to \
         completion, wall clock; load average before {load_before}, after {load_after}",
        args.data_mib,
        size_label(args.chunk),
        args.qd,
        args.qd,
        if args.no_interleave { ", run one after the other" } else { ", taking turns after each request" },
        args.threads,
        args.runs,
        args.sample_ms,
        args.clock,
    );
    println!(
        "{:<12} {:>3} {:<9} {:<17} {:>5} {:>10} {:>9} {:>8} {:>8} {:>8} {:>7} {:>8} {:>7} {:>7}",
        "layout",
        "drv",
        "state",
        "op",
        "req",
        "IOPS",
        "MiB/s",
        "p50 us",
        "p99 us",
        "p99.9us",
        "vs raw",
        "vs hlthy",
        "rd/op",
        "wr/B"
    );
    for c in cells {
        let (reads_per_op, writes_per_byte) = drive_io(c);
        println!(
            "{:<12} {:>3} {:<9} {:<17} {:>5} {:>10.0} {:>9.0} {:>8.2} {:>8.2} {:>8.2} {:>7} {:>8} {:>7.2} {:>7.2}",
            c.label(),
            c.drives,
            state(c),
            c.op.name(),
            size_label(c.req_bytes),
            c.iops(),
            c.mib_s(),
            c.hist.quantile_us(0.5),
            c.hist.quantile_us(0.99),
            c.hist.quantile_us(0.999),
            ratio(vs_raw(cells, c)),
            ratio(vs_healthy(cells, c)),
            reads_per_op,
            writes_per_byte
        );
    }
    println!("rd/op: drive reads per request; wr/B: drive bytes written per host byte (all regions)");
    print!("{}", goals(cells));
    if !amp.is_empty() {
        print!("{}", amp_table(amp));
    }
}

fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "NOT met" }
}

/// The goals of the issue, evaluated on this run.
fn goals(cells: &[Cell]) -> String {
    let mut out = String::from("\ngoals:\n");
    for c in cells.iter().filter(|c| !c.degraded) {
        let Some(Layout::Ec { data_shards, parity_shards }) = c.layout else { continue };
        match c.op {
            Op::RandRead => {
                if let Some(r) = vs_raw(cells, c) {
                    let _ = writeln!(
                        out,
                        "  {} 4K random read vs raw: {r:.2}x (goal >= 0.90x): {}",
                        c.label(),
                        verdict(r >= 0.9)
                    );
                }
            }
            Op::FullStripeWrite => {
                if let Some(raw) = raw_for(cells, c) {
                    let (k, m) = (f64::from(data_shards), f64::from(parity_shards));
                    let target = raw.mib_s() * k / (k + m);
                    let r = c.mib_s() / target;
                    let _ = writeln!(
                        out,
                        "  {} full-stripe write {:.0} MiB/s vs raw write {:.0} MiB/s x K/(K+M) = {target:.0} MiB/s: \
                         {r:.2}x (goal >= 0.80x): {}",
                        c.label(),
                        c.mib_s(),
                        raw.mib_s(),
                        verdict(r >= 0.8)
                    );
                }
            }
            _ => {}
        }
    }
    for c in cells.iter().filter(|c| c.degraded) {
        if let Some(r) = vs_healthy(cells, c) {
            let _ = writeln!(
                out,
                "  {} {} degraded vs healthy: {r:.2}x (goal >= 0.75x): {}",
                c.label(),
                c.op.name(),
                verdict(r >= 0.75)
            );
        }
    }
    out
}

fn amp_table(rows: &[AmpRow]) -> String {
    let mut out = String::from(
        "\ndrive bytes written per host byte, by drive region (writes one at a time, a volume flush every N \
         writes and at the end):\n",
    );
    let _ = writeln!(
        out,
        "{:<12} {:>7} {:<5} {:>5} {:>6} {:>8} {:>8} {:>9} {:>8} {:>8} {:>8}",
        "layout", "volume", "io", "req", "N", "data", "journal", "checksum", "intent", "meta", "total"
    );
    for r in rows {
        let _ = writeln!(
            out,
            "{:<12} {:>6}G {:<5} {:>5} {:>6} {:>8.3} {:>8.3} {:>9.4} {:>8.4} {:>8.4} {:>8.3}",
            r.layout.to_string(),
            r.volume_bytes >> 30,
            r.pattern,
            size_label(r.req_bytes),
            r.flush_every,
            r.data(),
            r.journal(),
            r.checksums(),
            r.intent(),
            r.meta(),
            r.total()
        );
    }
    out.push_str(
        "checksum = the checksum write amplification (checksum-page bytes per host byte); data = the layout's own \
         writes (copies, parity, read-modify-write); journal = ec partial-stripe records and checkpoint headers\n",
    );
    out
}

fn num(v: Option<f64>) -> String {
    v.filter(|v| v.is_finite()).map_or_else(|| "null".to_owned(), |v| format!("{v:.4}"))
}

pub(super) fn to_json(cells: &[Cell], amp: &[AmpRow], args: &EngineBenchArgs) -> String {
    let mut objects = Vec::new();
    for c in cells {
        let (reads_per_op, writes_per_byte) = drive_io(c);
        objects.push(format!(
            "{{\"kind\":\"io\",\"layout\":\"{}\",\"drives\":{},\"state\":\"{}\",\"op\":\"{}\",\"req_bytes\":{},\
             \"qd\":{},\"threads\":{},\"clock\":\"{:?}\",\"runs\":{},\"iops\":{},\"wall_iops\":{},\"mib_s\":{},\
             \"lat_us_p50\":{},\"lat_us_p99\":{},\"lat_us_p999\":{},\"vs_raw\":{},\"vs_healthy\":{},\
             \"drive_reads_per_op\":{},\"drive_write_bytes_per_host_byte\":{},\"errors\":{}}}",
            c.label(),
            c.drives,
            state(c),
            c.op.name(),
            c.req_bytes,
            args.qd,
            args.threads,
            args.clock,
            c.iops_runs.len(),
            num(Some(c.iops())),
            num(Some(super::median(&c.wall_iops_runs))),
            num(Some(c.mib_s())),
            num(Some(c.hist.quantile_us(0.5))),
            num(Some(c.hist.quantile_us(0.99))),
            num(Some(c.hist.quantile_us(0.999))),
            num(vs_raw(cells, c)),
            num(vs_healthy(cells, c)),
            num(Some(reads_per_op)),
            num(Some(writes_per_byte)),
            c.errors
        ));
    }
    for r in amp {
        objects.push(format!(
            "{{\"kind\":\"write-amp\",\"layout\":\"{}\",\"volume_bytes\":{},\"pattern\":\"{}\",\"req_bytes\":{},\
             \"flush_every\":{},\"host_bytes\":{},\"data_per_host_byte\":{},\"journal_per_host_byte\":{},\
             \"checksum_per_host_byte\":{},\"intent_per_host_byte\":{},\"meta_per_host_byte\":{},\
             \"total_per_host_byte\":{}}}",
            r.layout,
            r.volume_bytes,
            r.pattern,
            r.req_bytes,
            r.flush_every,
            r.host_bytes,
            num(Some(r.data())),
            num(Some(r.journal())),
            num(Some(r.checksums())),
            num(Some(r.intent())),
            num(Some(r.meta())),
            num(Some(r.total()))
        ));
    }
    format!("[\n{}\n]", objects.join(",\n"))
}
