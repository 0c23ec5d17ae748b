//! Tables, goal lines and JSON of `target/release/stria-bench-tier`.

use std::fmt::Write as _;

use crate::host::{cpu_model, num_cpus};

use super::{DATA_SHARDS, Outcome, PARITY_SHARDS, Phase, PhaseResult, TierBenchArgs};

fn phase(o: &Outcome, p: Phase) -> Option<&PhaseResult> {
    o.phases.iter().find(|r| r.phase == p)
}

/// A figure for a table cell: `-` when not measured.
fn cell(v: f64, decimals: usize) -> String {
    if v.is_finite() { format!("{v:.decimals$}") } else { "-".into() }
}

fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "NOT met" }
}

pub(super) fn print(o: &Outcome, args: &TierBenchArgs, load_before: &str, load_after: &str) {
    println!(
        "stria-bench-tier: seed 000's proof-of-concept tests on a tiered (log-structured) volume, destage always on"
    );
    println!("volume: {}", o.shape);
    println!("drives: {}", o.drive_engine);
    println!(
        "{} ({} CPUs), tokio multi-thread runtime with {} workers, request streams {}; phases of {} s, medians \
         of {} repetitions; load average before {load_before}, after {load_after}",
        cpu_model(),
        num_cpus(),
        args.threads,
        if super::interleave(args) { "yielding after each request" } else { "not yielding between requests" },
        args.seconds,
        args.reps
    );
    println!(
        "fill: every block written once at {:.0} MB/s, destage drained in {:.1} s; every read below checked \
         against what was written",
        o.fill_mb_s, o.fill_drain_s
    );
    println!();
    println!(
        "{:<20} {:<52} {:>7} {:>7} {:>7} {:>7} {:>7} {:>8} {:>8} {:>7} {:>8}",
        "phase",
        "load",
        "MB/s",
        "IOPS",
        "p50 us",
        "mean us",
        "p99 us",
        "p99.9 us",
        "max us",
        "wr MB/s",
        "from cap"
    );
    for p in &o.phases {
        let main = if p.keys().contains(&"read_mb_s") { "read" } else { "write" };
        let get = |what: &str| p.median(&format!("{main}_{what}"));
        let extra_write = if main == "read" { p.median("write_mb_s") } else { f64::NAN };
        let from_cap = p.median("read_from_capacity_pct");
        println!(
            "{:<20} {:<52} {:>7} {:>7} {:>7} {:>7} {:>7} {:>8} {:>8} {:>7} {:>8}",
            p.phase.name(),
            p.what,
            cell(get("mb_s"), 0),
            cell(get("iops"), 0),
            cell(get("p50_us"), 1),
            cell(get("mean_us"), 1),
            cell(get("p99_us"), 1),
            cell(get("p999_us"), 1),
            cell(get("max_us"), 0),
            cell(extra_write, 0),
            if from_cap.is_finite() { format!("{from_cap:.1}%") } else { "-".into() },
        );
    }
    println!(
        "MB/s = 10^6 bytes/s of host requests (reads for the read phases; wr MB/s: the write stream beside them); \
         latency = submit to completion, wall clock; from cap = blocks read from the capacity tier (the rest from \
         the write cache)"
    );
    println!();
    println!(
        "write accounting (counters read after destage drained, so a phase's drive writes are its own):"
    );
    println!(
        "{:<20} {:>8} {:>7} {:>7} {:>7} {:>7} {:>7} {:>8} {:>8} {:>10} {:>9} {:>7} {:>7} {:>6}",
        "phase",
        "host MiB",
        "cap WA",
        "data",
        "csum",
        "other",
        "fast WA",
        "full st",
        "part st",
        "data>=128K",
        "all>=128K",
        "meta/wr",
        "backlog",
        "gc mv"
    );
    for p in o.phases.iter().filter(|p| p.phase.writes()) {
        let other = p.median("cap_intent_wa") + p.median("cap_journal_wa") + p.median("cap_pool_meta_wa");
        println!(
            "{:<20} {:>8} {:>7} {:>7} {:>7} {:>7} {:>7} {:>8} {:>8} {:>10} {:>9} {:>7} {:>7} {:>6}",
            p.phase.name(),
            cell(p.median("host_write_mib"), 0),
            cell(p.median("cap_wa"), 3),
            cell(p.median("cap_data_wa"), 3),
            cell(p.median("cap_checksum_wa"), 4),
            cell(other, 4),
            cell(p.median("fast_wa"), 3),
            cell(p.sum("full_stripe_writes"), 0),
            cell(p.sum("partial_stripe_writes"), 0),
            format!("{}%", cell(p.median("cap_data_writes_ge_128k_pct"), 1)),
            format!("{}%", cell(p.median("cap_drive_writes_ge_128k_pct"), 1)),
            cell(p.median("meta_writes_per_host_write"), 3),
            cell(p.median("backlog_mib"), 0),
            cell(p.median("gc_moved_blocks"), 0),
        );
    }
    println!(
        "cap WA = capacity drive bytes written per host byte (all regions), split into data (stripes), csum \
         (checksum pages) and other (intent bitmap, journal, pool metadata); fast WA = the same for the 2 fast \
         drives; full/part st = capacity stripe writes, summed over the repetitions; data>=128K / all>=128K = \
         capacity drive writes of at least 128 KiB, data region only / all regions; meta/wr = map writes (log \
         blocks and checkpoint pages, destage and GC deltas included) per host write; backlog = MiB still \
         cached when the timed part ended; gc mv = blocks GC moved"
    );
    print!("{}", goals(o));
}

/// The goals of the issue, evaluated on the medians.
fn goals(o: &Outcome) -> String {
    let mut out = String::from("\ngoals (medians over the repetitions):\n");
    let (k, m) = (f64::from(DATA_SHARDS), f64::from(PARITY_SHARDS));
    let writers: Vec<&PhaseResult> = o.phases.iter().filter(|p| p.phase.writes()).collect();
    let full: f64 = writers.iter().map(|p| p.sum("full_stripe_writes")).sum();
    let partial: f64 = writers.iter().map(|p| p.sum("partial_stripe_writes")).sum();
    let full_pct = 100.0 * full / (full + partial).max(1.0);
    let _ = writeln!(
        out,
        "  capacity stripe writes that are full stripes: {full_pct:.2}% ({full:.0} full, {partial:.0} partial, \
         all write phases and repetitions; goal 100%): {}",
        verdict(partial == 0.0 && full > 0.0)
    );
    let data_ge: Vec<String> = writers
        .iter()
        .map(|p| format!("{} {:.2}%", p.phase.name(), p.median("cap_data_writes_ge_128k_pct")))
        .collect();
    let data_min =
        writers.iter().map(|p| p.median("cap_data_writes_ge_128k_pct")).fold(f64::INFINITY, f64::min);
    let _ = writeln!(
        out,
        "  capacity drive data writes >= 128 KiB: {} (goal 100%): {}",
        data_ge.join(", "),
        verdict(data_min >= 100.0)
    );
    let all_ge: Vec<String> = writers
        .iter()
        .map(|p| format!("{} {:.2}%", p.phase.name(), p.median("cap_drive_writes_ge_128k_pct")))
        .collect();
    let _ = writeln!(
        out,
        "    all capacity drive writes (with the engine's checksum pages, intent bitmap, journal): {}",
        all_ge.join(", ")
    );
    let wa_goal = (k + m) / k * 1.05;
    for p in [Phase::SeqWrite1, Phase::SeqWriteN].iter().filter_map(|&p| phase(o, p)) {
        let wa = p.median("cap_wa");
        let _ = writeln!(
            out,
            "  {} capacity drive bytes per host byte: {wa:.3} (data {:.3}, checksums {:.4}; goal <= {:.0}/{:.0} x \
             1.05 = {wa_goal:.3}): {}",
            p.phase.name(),
            p.median("cap_data_wa"),
            p.median("cap_checksum_wa"),
            k + m,
            k,
            verdict(wa <= wa_goal)
        );
    }
    if let (Some(idle), Some(busy)) = (phase(o, Phase::Latency4kIdle), phase(o, Phase::Latency4kWrite)) {
        let r = busy.median("mean_vs_idle");
        let _ = writeln!(
            out,
            "  4 KiB QD1 read latency under one write stream: mean {:.1} -> {:.1} us = {r:.2}x of idle (p50 {:.2}x, \
             p99 {:.2}x; writes at {:.0} MB/s = {:.0}% of seq-write-1; goal <= 1.30x, the seed saw 240 -> 308 us = \
             1.28x): {}",
            idle.median("read_mean_us"),
            busy.median("read_mean_us"),
            busy.median("p50_vs_idle"),
            busy.median("p99_vs_idle"),
            busy.median("write_mb_s"),
            100.0 * busy.median("write_vs_seq_write_1"),
            verdict(r <= 1.3)
        );
    }
    if let (Some(alone), Some(mixed)) = (phase(o, Phase::RandRead64k), phase(o, Phase::RandRead64kWrite)) {
        let r = mixed.median("read_vs_without_write");
        let _ = writeln!(
            out,
            "  64 KiB read bandwidth under one write stream: {:.0} -> {:.0} MB/s = {r:.2}x (writes at {:.0} MB/s; \
             goal >= 0.70x, the seed lost 30%): {}",
            alone.median("read_mb_s"),
            mixed.median("read_mb_s"),
            mixed.median("write_mb_s"),
            verdict(r >= 0.7)
        );
    }
    let meta: Vec<String> = writers
        .iter()
        .map(|p| format!("{} {:.3}", p.phase.name(), p.median("meta_writes_per_host_write")))
        .collect();
    let meta_max = writers.iter().map(|p| p.median("meta_writes_per_host_write")).fold(0.0, f64::max);
    let _ = writeln!(
        out,
        "  map writes (log blocks + checkpoint pages) per host write: {} (goal <= 1): {}",
        meta.join(", "),
        verdict(meta_max <= 1.0)
    );
    out
}

fn json_num(v: f64) -> serde_json::Value {
    serde_json::Number::from_f64(v).map_or(serde_json::Value::Null, serde_json::Value::Number)
}

/// One JSON object per phase: its medians, and every repetition's figures.
pub(super) fn to_json(o: &Outcome, args: &TierBenchArgs) -> String {
    let objects: Vec<serde_json::Value> = o
        .phases
        .iter()
        .map(|p| {
            let mut obj = serde_json::Map::new();
            obj.insert("phase".into(), p.phase.name().into());
            obj.insert("load".into(), p.what.clone().into());
            obj.insert("volume".into(), o.shape.clone().into());
            obj.insert("drives".into(), o.drive_engine.clone().into());
            obj.insert("seconds_per_phase".into(), json_num(args.seconds));
            obj.insert("reps".into(), p.reps.len().into());
            obj.insert("streams".into(), args.streams.into());
            obj.insert("qd".into(), args.qd.into());
            obj.insert("interleave".into(), super::interleave(args).into());
            for key in p.keys() {
                obj.insert(key.into(), json_num(p.median(key)));
            }
            if p.phase.writes() {
                obj.insert("full_stripe_writes_total".into(), json_num(p.sum("full_stripe_writes")));
                obj.insert("partial_stripe_writes_total".into(), json_num(p.sum("partial_stripe_writes")));
            }
            obj.insert(
                "per_rep".into(),
                p.reps
                    .iter()
                    .map(|m| {
                        serde_json::Value::Object(
                            m.iter().map(|&(k, v)| (k.to_owned(), json_num(v))).collect(),
                        )
                    })
                    .collect(),
            );
            if !p.series.is_empty() {
                obj.insert(
                    "wa_series".into(),
                    p.series
                        .iter()
                        .map(|rep| {
                            rep.iter()
                                .map(|w| {
                                    serde_json::json!({
                                        "t_s": json_num(w.t_s), "host_mib": json_num(w.host_mib),
                                        "cap_mib": json_num(w.cap_mib), "fast_mib": json_num(w.fast_mib),
                                        "backlog_mib": json_num(w.backlog_mib),
                                    })
                                })
                                .collect::<serde_json::Value>()
                        })
                        .collect(),
                );
            }
            obj.insert("errors".into(), p.errors.into());
            obj.insert("mismatches".into(), p.mismatches.into());
            serde_json::Value::Object(obj)
        })
        .collect();
    serde_json::to_string_pretty(&objects).expect("JSON of plain values")
}
