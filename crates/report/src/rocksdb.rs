//! `scripts/bench-rocksdb.sh`'s JSON: db_bench on ext4 over stria volumes and over a local file
//! of the same size, in the same run.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Result, bail};
use serde::Deserialize;

use crate::md;
use crate::plot::{self, BarChart, Panel, Series};

#[derive(Debug, Deserialize)]
pub(crate) struct RocksRun {
    #[serde(default)]
    pub(crate) cpu: String,
    #[serde(default)]
    pub(crate) stria_rev: String,
    #[serde(default)]
    pub(crate) db_bench: String,
    /// `quick` or `full`.
    #[serde(default)]
    pub(crate) mode: String,
    /// What ran, in words (pool, volume size, filesystem, db_bench options).
    #[serde(default)]
    pub(crate) setup: String,
    #[serde(default)]
    pub(crate) load_start: String,
    #[serde(default)]
    pub(crate) load_end: String,
    #[serde(default)]
    pub(crate) seconds: f64,
    /// The target ratios are taken against (the local file).
    pub(crate) reference: String,
    /// A second reference on the volumes' own client path (nbdkit through nbdfuse), if run.
    #[serde(default)]
    pub(crate) path_reference: Option<String>,
    /// Targets in the order they ran.
    pub(crate) targets: Vec<String>,
    /// Workloads in the order they ran, with what each does.
    pub(crate) workloads: Vec<Workload>,
    pub(crate) results: Vec<RocksResult>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct Workload {
    pub(crate) name: String,
    #[serde(default)]
    pub(crate) description: String,
}

#[derive(Debug, Deserialize)]
pub(crate) struct RocksResult {
    pub(crate) target: String,
    pub(crate) workload: String,
    pub(crate) ops_per_s: f64,
    #[serde(default)]
    pub(crate) mb_s: Option<f64>,
    #[serde(default)]
    pub(crate) ratio_vs_reference: Option<f64>,
    #[serde(default)]
    pub(crate) ratio_vs_path_reference: Option<f64>,
    /// db_bench's histogram: percent ("99.9") -> microseconds per operation.
    #[serde(default)]
    pub(crate) percentiles_us: BTreeMap<String, f64>,
    #[serde(default)]
    pub(crate) mean_us: Option<f64>,
}

impl RocksRun {
    fn result(&self, target: &str, workload: &str) -> Option<&RocksResult> {
        self.results.iter().find(|r| r.target == target && r.workload == workload)
    }

    /// The ratio against the reference: as recorded, else computed.
    fn ratio(&self, r: &RocksResult) -> Option<f64> {
        r.ratio_vs_reference.or_else(|| {
            let base = self.result(&self.reference, &r.workload)?;
            (base.ops_per_s > 0.0).then(|| r.ops_per_s / base.ops_per_s)
        })
    }
}

/// Writes `REPORT.md`, `rocksdb-ops.png` (ops/s per workload, a bar per target) and
/// `rocksdb-cdf.png` (latency CDFs, when the JSON has percentiles); returns the files written.
pub(crate) fn report(run: &RocksRun, dir: &Path) -> Result<Vec<String>> {
    if run.results.is_empty() {
        bail!("the RocksDB benchmark JSON has no results");
    }
    let color = |t: &str| run.targets.iter().position(|x| x == t).unwrap_or(run.targets.len());
    let mut out = String::from("# RocksDB db_bench on ext4: stria volumes against a local file\n\n");
    let _ = writeln!(
        out,
        "{} ({} mode). {}; {}; stria {}. Load average {} at the start, {} at the end; {:.0} s in all. Made by \
         `stria-report rocksdb` from the JSON of `scripts/bench-rocksdb.sh`.\n",
        run.setup, run.mode, run.cpu, run.db_bench, run.stria_rev, run.load_start, run.load_end, run.seconds
    );
    out.push_str("Workloads:\n\n");
    for w in &run.workloads {
        let _ = writeln!(out, "* `{}`: {}", w.name, w.description);
    }
    let _ = writeln!(out, "\nops/s (ratio to `{}`):\n", run.reference);
    let mut headers = vec!["workload"];
    headers.extend(run.targets.iter().map(String::as_str));
    let right: Vec<bool> = (0..headers.len()).map(|i| i > 0).collect();
    let pivot: Vec<Vec<String>> = run
        .workloads
        .iter()
        .map(|w| {
            let mut row = vec![w.name.clone()];
            row.extend(run.targets.iter().map(|t| match run.result(t, &w.name) {
                Some(r) if *t == run.reference => format!("{:.0}", r.ops_per_s),
                Some(r) => format!("{:.0} ({})", r.ops_per_s, md::ratio(run.ratio(r))),
                None => "-".into(),
            }));
            row
        })
        .collect();
    out.push_str(&md::table(&headers, &right, &pivot));
    if let Some(path_ref) = &run.path_reference {
        let _ = writeln!(
            out,
            "\nRatio to `{path_ref}` (the same nbdfuse and loop-device path, another NBD server: what is \
             left is stria's own cost):\n"
        );
        let vols: Vec<&String> =
            run.targets.iter().filter(|t| **t != run.reference && *t != path_ref).collect();
        let mut headers = vec!["workload"];
        headers.extend(vols.iter().map(|t| t.as_str()));
        let right: Vec<bool> = (0..headers.len()).map(|i| i > 0).collect();
        let rows: Vec<Vec<String>> = run
            .workloads
            .iter()
            .map(|w| {
                let base = run.result(path_ref, &w.name).map(|r| r.ops_per_s);
                let mut row = vec![w.name.clone()];
                row.extend(vols.iter().map(|t| {
                    let r = run.result(t, &w.name);
                    md::ratio(r.and_then(|r| {
                        r.ratio_vs_path_reference
                            .or_else(|| base.filter(|b| *b > 0.0).map(|b| r.ops_per_s / b))
                    }))
                }));
                row
            })
            .collect();
        out.push_str(&md::table(&headers, &right, &rows));
    }
    out.push_str("\nLatency per operation (db_bench's histogram, us):\n\n");
    let lat: Vec<Vec<String>> = run
        .results
        .iter()
        .map(|r| {
            let p = |k: &str| r.percentiles_us.get(k).copied();
            vec![
                r.workload.clone(),
                r.target.clone(),
                md::num(Some(r.ops_per_s), 0),
                md::num(r.mb_s, 1),
                md::num(r.mean_us, 1),
                md::num(p("50"), 1),
                md::num(p("99"), 1),
                md::num(p("99.9"), 1),
                md::num(p("99.99"), 1),
            ]
        })
        .collect();
    out.push_str(&md::table(
        &["workload", "target", "ops/s", "MB/s", "mean", "p50", "p99", "p99.9", "p99.99"],
        &[false, false, true, true, true, true, true, true, true],
        &lat,
    ));
    let mut written = Vec::new();
    let bars: Vec<Panel> = run
        .workloads
        .iter()
        .map(|w| {
            let rs: Vec<&RocksResult> = run.targets.iter().filter_map(|t| run.result(t, &w.name)).collect();
            Panel::Bars(BarChart {
                title: format!("{} (ratio to {})", w.name, run.reference),
                y_label: "operations per second".into(),
                bars: rs.iter().map(|r| (r.target.clone(), r.ops_per_s, color(&r.target))).collect(),
                annotations: rs
                    .iter()
                    .map(|r| {
                        if r.target == run.reference {
                            plot::tick(r.ops_per_s)
                        } else {
                            format!("{} ({})", plot::tick(r.ops_per_s), md::ratio(run.ratio(r)))
                        }
                    })
                    .collect(),
            })
        })
        .filter(|p| matches!(p, Panel::Bars(b) if !b.bars.is_empty()))
        .collect();
    if !bars.is_empty() {
        plot::render(&dir.join("rocksdb-ops.png"), &bars, 2)?;
        out.push('\n');
        out.push_str(&md::image("db_bench operations per second", "rocksdb-ops.png"));
        written.push("rocksdb-ops.png".to_owned());
    }
    let cdfs: Vec<Panel> = run
        .workloads
        .iter()
        .filter_map(|w| {
            let series: Vec<Series> = run
                .targets
                .iter()
                .filter_map(|t| {
                    let r = run.result(t, &w.name)?;
                    let pct = crate::fio::percentiles(&r.percentiles_us, 1.0);
                    (!pct.is_empty()).then(|| plot::cdf_series(t, color(t), &pct))
                })
                .collect();
            (!series.is_empty()).then(|| {
                let mut c = plot::cdf_chart(format!("{}: latency per operation", w.name), series);
                c.x_label = "microseconds per operation (log scale)".into();
                c.y_label = "operations at or below (%)".into();
                Panel::Lines(c)
            })
        })
        .collect();
    if !cdfs.is_empty() {
        plot::render(&dir.join("rocksdb-cdf.png"), &cdfs, 2)?;
        out.push('\n');
        out.push_str(&md::image("db_bench latency CDFs", "rocksdb-cdf.png"));
        written.push("rocksdb-cdf.png".to_owned());
    }
    std::fs::write(dir.join("REPORT.md"), out)?;
    written.push("REPORT.md".into());
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{TempDir, is_png};

    const FIXTURE: &str = r#"{"cpu": "AMD EPYC, 2 CPUs", "stria_rev": "abc1234", "db_bench": "db_bench 7.8.3",
      "mode": "quick", "setup": "ext4 over a loop device", "load_start": "1", "load_end": "2", "seconds": 100,
      "reference": "local-file", "path_reference": "nbdkit-file", "targets": ["local-file", "nbdkit-file", "raid10"],
      "workloads": [{"name": "fillseq", "description": "bulk load, WAL off"},
                    {"name": "readrandom", "description": "random point reads"}],
      "results": [
        {"target": "local-file", "workload": "fillseq", "ops_per_s": 400000, "mb_s": 170.1, "mean_us": 2.5,
         "percentiles_us": {"50": 1.2, "99": 9.0, "99.9": 30.0}},
        {"target": "raid10", "workload": "fillseq", "ops_per_s": 300000, "ratio_vs_reference": 0.75,
         "percentiles_us": {"50": 1.4, "99": 12.0, "99.9": 50.0}},
        {"target": "local-file", "workload": "readrandom", "ops_per_s": 100000},
        {"target": "nbdkit-file", "workload": "readrandom", "ops_per_s": 40000},
        {"target": "raid10", "workload": "readrandom", "ops_per_s": 50000}
      ]}"#;

    #[test]
    fn parses_and_computes_missing_ratios() {
        let run: RocksRun = crate::parse_json(FIXTURE).unwrap();
        let r = run.result("raid10", "readrandom").unwrap();
        assert_eq!(run.ratio(r), Some(0.5));
        assert_eq!(run.ratio(run.result("raid10", "fillseq").unwrap()), Some(0.75));
        assert_eq!(run.result("local-file", "fillseq").unwrap().percentiles_us.len(), 3);
    }

    #[test]
    fn writes_report_and_pngs() {
        let run: RocksRun = crate::parse_json(FIXTURE).unwrap();
        let dir = TempDir::new("rocksdb");
        let files = report(&run, dir.path()).unwrap();
        assert_eq!(files, ["rocksdb-ops.png", "rocksdb-cdf.png", "REPORT.md"]);
        assert!(is_png(&dir.path().join("rocksdb-ops.png")));
        assert!(is_png(&dir.path().join("rocksdb-cdf.png")));
        let md = std::fs::read_to_string(dir.path().join("REPORT.md")).unwrap();
        assert!(md.contains("| readrandom | 100000 | 40000 (0.40x) | 50000 (0.50x) |"), "{md}");
        assert!(md.contains("| readrandom | 1.25x |"), "{md}");
        assert!(md.contains("| fillseq | - |"), "{md}");
    }
}
