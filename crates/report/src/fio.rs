//! fio's own JSON (`fio --output-format=json`): completion latency percentiles of each job, as
//! CDFs, and a table of IOPS, bandwidth and latency.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Result, bail};
use serde::Deserialize;

use crate::md;
use crate::plot::{self, Panel};

/// The part of fio's output the report uses.
#[derive(Debug, Deserialize)]
pub(crate) struct FioOutput {
    #[serde(rename = "fio version", default)]
    pub(crate) version: String,
    pub(crate) jobs: Vec<FioJob>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct FioJob {
    pub(crate) jobname: String,
    pub(crate) read: FioSide,
    pub(crate) write: FioSide,
}

#[derive(Debug, Deserialize)]
pub(crate) struct FioSide {
    pub(crate) iops: f64,
    pub(crate) bw_bytes: f64,
    pub(crate) total_ios: u64,
    pub(crate) clat_ns: FioLatency,
}

#[derive(Debug, Deserialize)]
pub(crate) struct FioLatency {
    pub(crate) mean: f64,
    /// Percentile ("99.000000") -> nanoseconds; absent when fio ran no I/O in that direction.
    #[serde(default)]
    pub(crate) percentile: BTreeMap<String, f64>,
}

/// (percent, microseconds) pairs sorted by percent, from a map of percent strings to a latency in
/// `unit_per_us` units per microsecond (fio: nanoseconds, 1000; already microseconds: 1).
pub(crate) fn percentiles(map: &BTreeMap<String, f64>, unit_per_us: f64) -> Vec<(f64, f64)> {
    let mut v: Vec<(f64, f64)> = map
        .iter()
        .filter_map(|(k, ns)| Some((k.trim_start_matches(['p', 'P']).parse::<f64>().ok()?, ns / unit_per_us)))
        .filter(|(p, us)| p.is_finite() && us.is_finite() && *us > 0.0)
        .collect();
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    v
}

/// One fio output and the name it goes by in the report (its file name).
#[derive(Debug)]
pub(crate) struct Labeled {
    pub(crate) label: String,
    pub(crate) output: FioOutput,
}

impl Labeled {
    pub(crate) fn read(path: &Path) -> Result<Labeled> {
        let label = path.file_stem().map_or_else(|| "fio".into(), |s| s.to_string_lossy().into_owned());
        Ok(Labeled { label, output: crate::read_json(path)? })
    }
}

/// Writes `fio-cdf.png` and `REPORT.md`; returns the files written.
pub(crate) fn report(runs: &[Labeled], dir: &Path) -> Result<Vec<String>> {
    let mut rows = Vec::new();
    let mut by_dir: [Vec<plot::Series>; 2] = [Vec::new(), Vec::new()];
    let mut index = 0;
    for run in runs {
        for job in &run.output.jobs {
            let name = if run.output.jobs.len() > 1 {
                format!("{} {}", run.label, job.jobname)
            } else {
                run.label.clone()
            };
            for (d, (what, side)) in [("read", &job.read), ("write", &job.write)].into_iter().enumerate() {
                if side.total_ios == 0 {
                    continue;
                }
                let pct = percentiles(&side.clat_ns.percentile, 1000.0);
                let p = |q: f64| pct.iter().find(|(x, _)| (*x - q).abs() < 1e-6).map(|&(_, v)| v);
                rows.push(vec![
                    name.clone(),
                    what.into(),
                    md::num(Some(side.iops / 1e3), 1),
                    md::num(Some(side.bw_bytes / 1e6), 1),
                    md::num(Some(side.clat_ns.mean / 1e3), 1),
                    md::num(p(50.0), 1),
                    md::num(p(99.0), 1),
                    md::num(p(99.9), 1),
                ]);
                if !pct.is_empty() {
                    by_dir[d].push(plot::cdf_series(&name, index, &pct));
                }
            }
            index += 1;
        }
    }
    if rows.is_empty() {
        bail!("no job with any I/O in the fio output");
    }
    let mut out = String::from("# fio report\n\n");
    if let Some(v) = runs.first().map(|r| r.output.version.as_str()).filter(|v| !v.is_empty()) {
        out.push_str(&format!("{v}; completion latency (clat), from fio's JSON output.\n\n"));
    }
    out.push_str(&md::table(
        &["job", "direction", "kIOPS", "MB/s", "mean us", "p50 us", "p99 us", "p99.9 us"],
        &[false, false, true, true, true, true, true, true],
        &rows,
    ));
    let mut written = Vec::new();
    let panels: Vec<Panel> = ["reads", "writes"]
        .iter()
        .zip(by_dir)
        .filter(|(_, s)| !s.is_empty())
        .map(|(what, s)| Panel::Lines(plot::cdf_chart(format!("Completion latency CDF, {what}"), s)))
        .collect();
    if !panels.is_empty() {
        plot::render(&dir.join("fio-cdf.png"), &panels, 2)?;
        out.push('\n');
        out.push_str(&md::image("completion latency CDFs", "fio-cdf.png"));
        written.push("fio-cdf.png".to_owned());
    }
    std::fs::write(dir.join("REPORT.md"), out)?;
    written.push("REPORT.md".into());
    Ok(written)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::testutil::{TempDir, is_png};

    /// A trimmed fio 3.33 output (one job, reads only), with the note fio prints before it.
    pub(crate) const FIXTURE: &str = r#"note: both iodepth >= 1 and synchronous I/O engine are selected
{
  "fio version" : "fio-3.33",
  "jobs" : [
    {
      "jobname" : "bench",
      "read" : {
        "io_bytes" : 1, "bw_bytes" : 490000000, "iops" : 119600.5, "total_ios" : 239000,
        "clat_ns" : { "min" : 20000, "max" : 900000, "mean" : 133000.0,
          "percentile" : { "1.000000" : 50000, "50.000000" : 120000, "99.000000" : 354000,
                           "99.900000" : 600000, "99.990000" : 880000 } }
      },
      "write" : {
        "io_bytes" : 0, "bw_bytes" : 0, "iops" : 0.0, "total_ios" : 0,
        "clat_ns" : { "min" : 0, "max" : 0, "mean" : 0.0 }
      }
    }
  ]
}"#;

    #[test]
    fn parses_fio_output_after_a_note() {
        let o: FioOutput = crate::parse_json(FIXTURE).unwrap();
        assert_eq!(o.version, "fio-3.33");
        assert_eq!(o.jobs[0].read.total_ios, 239000);
        let p = percentiles(&o.jobs[0].read.clat_ns.percentile, 1000.0);
        assert_eq!(p.first(), Some(&(1.0, 50.0)));
        assert_eq!(p.last(), Some(&(99.99, 880.0)));
        assert!(o.jobs[0].write.clat_ns.percentile.is_empty());
    }

    #[test]
    fn writes_a_report_and_a_cdf_png() {
        let dir = TempDir::new("fio");
        let run = Labeled { label: "raid0".into(), output: crate::parse_json(FIXTURE).unwrap() };
        let files = report(&[run], dir.path()).unwrap();
        assert_eq!(files, ["fio-cdf.png", "REPORT.md"]);
        assert!(is_png(&dir.path().join("fio-cdf.png")));
        let md = std::fs::read_to_string(dir.path().join("REPORT.md")).unwrap();
        assert!(md.contains("| raid0 | read | 119.6 | 490.0 | 133.0 | 120.0 | 354.0 | 600.0 |"), "{md}");
    }
}
