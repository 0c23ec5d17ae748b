//! `scripts/bench-nbd.sh`'s JSON: fio against stria's volumes and nbdkit in the same run.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Result, bail};
use serde::Deserialize;

use crate::md;
use crate::plot::{self, LineChart, Panel, Series};

#[derive(Debug, Deserialize)]
pub(crate) struct NbdRun {
    #[serde(default)]
    pub(crate) cpu: String,
    #[serde(default)]
    pub(crate) drives: String,
    #[serde(default)]
    pub(crate) reps: u32,
    #[serde(default)]
    pub(crate) runtime_s: f64,
    #[serde(default)]
    pub(crate) load_start: String,
    #[serde(default)]
    pub(crate) load_end: String,
    #[serde(default)]
    pub(crate) fio: String,
    #[serde(default)]
    pub(crate) nbdkit: String,
    #[serde(default)]
    pub(crate) stria_rev: String,
    pub(crate) results: Vec<NbdResult>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct NbdResult {
    pub(crate) mode: String,
    /// `randread-4k-qd16`: the family (`randread-4k`) and the queue depth.
    pub(crate) workload: String,
    pub(crate) server: String,
    pub(crate) median: Figures,
    pub(crate) ratio_iops_vs_nbdkit: Option<f64>,
    pub(crate) ratio_p99_vs_nbdkit: Option<f64>,
    #[serde(default)]
    pub(crate) samples: Vec<Figures>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct Figures {
    pub(crate) kiops: f64,
    pub(crate) mean_us: f64,
    pub(crate) p99_us: f64,
    pub(crate) gbps: f64,
    /// Completion latency percentiles (percent -> us), when the script recorded them.
    #[serde(default)]
    pub(crate) clat_pct_us: BTreeMap<String, f64>,
}

/// `randread-4k-qd16` -> (`randread-4k`, 16).
pub(crate) fn split_workload(name: &str) -> Option<(&str, u32)> {
    let (family, qd) = name.rsplit_once("-qd")?;
    Some((family, qd.parse().ok()?))
}

/// Keeps first-seen order.
fn unique<'a>(it: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
    let mut v: Vec<&str> = Vec::new();
    for s in it {
        if !v.contains(&s) {
            v.push(s);
        }
    }
    v
}

/// The sample whose IOPS is the median one (its percentiles stand for the workload).
fn median_sample(r: &NbdResult) -> Option<&Figures> {
    let mut s: Vec<&Figures> = r.samples.iter().filter(|s| !s.clat_pct_us.is_empty()).collect();
    s.sort_by(|a, b| a.kiops.total_cmp(&b.kiops));
    s.get(s.len() / 2).copied()
}

/// Writes `REPORT.md`, `nbd-MODE.png` (IOPS, mean and p99 latency against queue depth) and
/// `nbd-MODE-cdf.png` (latency CDFs, when the JSON has percentiles); returns the files written.
pub(crate) fn report(run: &NbdRun, dir: &Path) -> Result<Vec<String>> {
    if run.results.is_empty() {
        bail!("the NBD benchmark JSON has no results");
    }
    let modes = unique(run.results.iter().map(|r| r.mode.as_str()));
    let servers = unique(run.results.iter().map(|r| r.server.as_str()));
    let mut out = String::from("# NBD benchmark: stria against nbdkit\n\n");
    let _ = writeln!(
        out,
        "fio (nbd engine) against `stria serve` ({} drives) and `{}` on Unix sockets, in the same run; \
         medians of {} runs of {} s. {}; {}; stria {}. Load average {} at the start, {} at the end. \
         Made by `stria-report nbd` from the JSON of `scripts/bench-nbd.sh`.\n",
        run.drives,
        run.nbdkit,
        run.reps,
        run.runtime_s,
        run.cpu,
        run.fio,
        run.stria_rev,
        run.load_start,
        run.load_end
    );
    let mut written = Vec::new();
    for mode in &modes {
        let rows: Vec<&NbdResult> = run.results.iter().filter(|r| r.mode == *mode).collect();
        let _ = writeln!(out, "## {mode}\n");
        let table: Vec<Vec<String>> = rows
            .iter()
            .map(|r| {
                vec![
                    r.workload.clone(),
                    r.server.clone(),
                    md::num(Some(r.median.kiops), 1),
                    md::num(Some(r.median.mean_us), 1),
                    md::num(Some(r.median.p99_us), 1),
                    md::num(Some(r.median.gbps), 2),
                    md::ratio(r.ratio_iops_vs_nbdkit),
                    md::ratio(r.ratio_p99_vs_nbdkit),
                ]
            })
            .collect();
        out.push_str(&md::table(
            &["workload", "server", "kIOPS", "mean us", "p99 us", "GB/s", "IOPS vs nbdkit", "p99 vs nbdkit"],
            &[false, false, true, true, true, true, true, true],
            &table,
        ));
        out.push('\n');
        let file = format!("nbd-{mode}.png");
        let panels = qd_panels(&rows, &servers, mode);
        if !panels.is_empty() {
            plot::render(&dir.join(&file), &panels, 3)?;
            out.push_str(&md::image(&format!("IOPS and latency against queue depth, {mode}"), &file));
            written.push(file);
        }
        let cdf = cdf_panels(&rows, &servers, mode);
        if !cdf.is_empty() {
            let file = format!("nbd-{mode}-cdf.png");
            plot::render(&dir.join(&file), &cdf, 3)?;
            out.push('\n');
            out.push_str(&md::image(&format!("completion latency CDFs, {mode}"), &file));
            written.push(file);
        }
        out.push('\n');
    }
    std::fs::write(dir.join("REPORT.md"), out)?;
    written.push("REPORT.md".into());
    Ok(written)
}

/// For each workload family run at more than one queue depth: kIOPS, mean and p99 latency
/// against the queue depth, a line per server.
fn qd_panels(rows: &[&NbdResult], servers: &[&str], mode: &str) -> Vec<Panel> {
    let families = unique(rows.iter().filter_map(|r| split_workload(&r.workload)).map(|(f, _)| f));
    let mut panels = Vec::new();
    for family in families {
        let of = |server: &str| -> Vec<(u32, &Figures)> {
            let mut v: Vec<(u32, &Figures)> = rows
                .iter()
                .filter(|r| r.server == server)
                .filter_map(|r| {
                    split_workload(&r.workload).filter(|(f, _)| *f == family).map(|(_, q)| (q, &r.median))
                })
                .collect();
            v.sort_by_key(|x| x.0);
            v
        };
        if servers.iter().all(|s| of(s).len() < 2) {
            continue;
        }
        let chart = |what: &str, unit: &str, get: fn(&Figures) -> f64, log_y: bool| {
            let series = servers
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    Series::new(*s, i, of(s).iter().map(|&(q, f)| (f64::from(q), get(f))).collect())
                })
                .filter(|s| !s.points.is_empty())
                .collect();
            Panel::Lines(LineChart {
                title: format!("{family}: {what} ({mode})"),
                x_label: "queue depth (log2 scale)".into(),
                y_label: unit.into(),
                x_pow2: true,
                y_log: log_y,
                y_from_zero: true,
                series,
                ..LineChart::default()
            })
        };
        panels.push(chart("IOPS", "thousands of IOPS", |f| f.kiops, false));
        panels.push(chart("mean latency", "mean completion latency (us, log)", |f| f.mean_us, true));
        panels.push(chart("p99 latency", "p99 completion latency (us, log)", |f| f.p99_us, true));
    }
    panels
}

/// One CDF per workload, a line per server (from the median-IOPS sample's percentiles).
fn cdf_panels(rows: &[&NbdResult], servers: &[&str], mode: &str) -> Vec<Panel> {
    let workloads = unique(rows.iter().map(|r| r.workload.as_str()));
    workloads
        .into_iter()
        .filter_map(|w| {
            let series: Vec<Series> = servers
                .iter()
                .enumerate()
                .filter_map(|(i, s)| {
                    let r = rows.iter().find(|r| r.workload == w && r.server == *s)?;
                    let pct = crate::fio::percentiles(&median_sample(r)?.clat_pct_us, 1.0);
                    (!pct.is_empty()).then(|| plot::cdf_series(s, i, &pct))
                })
                .collect();
            (!series.is_empty()).then(|| Panel::Lines(plot::cdf_chart(format!("{w} ({mode})"), series)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{TempDir, is_png};

    /// Two servers, two queue depths of one family and a sequential workload, as the script
    /// writes it (the percentiles only on some samples).
    const FIXTURE: &str = r#"{"cpu": "AMD EPYC, 2 CPUs", "drives": "memory", "reps": 1, "runtime_s": 1.0,
      "load_start": "1.0 1.0 1.0", "load_end": "1.2 1.1 1.0", "fio": "fio-3.33", "nbdkit": "nbdkit 1.32.5",
      "stria_rev": "abc1234", "results": [
      {"mode": "pinned", "workload": "randread-4k-qd1", "server": "nbdkit",
       "median": {"kiops": 17.2, "mean_us": 55.0, "p99_us": 122.0, "gbps": 0.07},
       "ratio_iops_vs_nbdkit": null, "ratio_p99_vs_nbdkit": null,
       "samples": [{"kiops": 17.2, "mean_us": 55.0, "p99_us": 122.0, "gbps": 0.07,
                    "clat_pct_us": {"50.000000": 50.0, "99.000000": 122.0, "99.990000": 300.0}}]},
      {"mode": "pinned", "workload": "randread-4k-qd1", "server": "stria-raid0",
       "median": {"kiops": 12.5, "mean_us": 70.0, "p99_us": 159.0, "gbps": 0.05},
       "ratio_iops_vs_nbdkit": 0.73, "ratio_p99_vs_nbdkit": 1.3,
       "samples": [{"kiops": 12.5, "mean_us": 70.0, "p99_us": 159.0, "gbps": 0.05}]},
      {"mode": "pinned", "workload": "randread-4k-qd16", "server": "nbdkit",
       "median": {"kiops": 109.3, "mean_us": 140.0, "p99_us": 750.0, "gbps": 0.45},
       "ratio_iops_vs_nbdkit": null, "ratio_p99_vs_nbdkit": null, "samples": []},
      {"mode": "pinned", "workload": "randread-4k-qd16", "server": "stria-raid0",
       "median": {"kiops": 119.5, "mean_us": 130.0, "p99_us": 354.0, "gbps": 0.49},
       "ratio_iops_vs_nbdkit": 1.09, "ratio_p99_vs_nbdkit": 0.47, "samples": []},
      {"mode": "pinned", "workload": "seqread-128k-qd16", "server": "stria-raid0",
       "median": {"kiops": 23.0, "mean_us": 690.0, "p99_us": 900.0, "gbps": 3.06},
       "ratio_iops_vs_nbdkit": 1.08, "ratio_p99_vs_nbdkit": 0.9, "samples": []}
    ]}"#;

    #[test]
    fn workload_names_split_into_family_and_queue_depth() {
        assert_eq!(split_workload("randread-4k-qd16"), Some(("randread-4k", 16)));
        assert_eq!(split_workload("seqwrite-128k-qd16"), Some(("seqwrite-128k", 16)));
        assert_eq!(split_workload("fill"), None);
    }

    #[test]
    fn parses_the_scripts_json() {
        let run: NbdRun = crate::parse_json(FIXTURE).unwrap();
        assert_eq!(run.results.len(), 5);
        assert_eq!(run.results[1].ratio_iops_vs_nbdkit, Some(0.73));
        assert_eq!(run.results[0].ratio_iops_vs_nbdkit, None);
        assert_eq!(run.results[0].samples[0].clat_pct_us.len(), 3);
    }

    #[test]
    fn writes_report_and_pngs() {
        let run: NbdRun = crate::parse_json(FIXTURE).unwrap();
        let dir = TempDir::new("nbd");
        let files = report(&run, dir.path()).unwrap();
        assert_eq!(files, ["nbd-pinned.png", "nbd-pinned-cdf.png", "REPORT.md"]);
        assert!(is_png(&dir.path().join("nbd-pinned.png")));
        assert!(is_png(&dir.path().join("nbd-pinned-cdf.png")));
        let md = std::fs::read_to_string(dir.path().join("REPORT.md")).unwrap();
        assert!(
            md.contains("| randread-4k-qd16 | stria-raid0 | 119.5 | 130.0 | 354.0 | 0.49 | 1.09x | 0.47x |")
        );
        assert!(md.contains("![IOPS and latency against queue depth, pinned](nbd-pinned.png)"));
    }
}
