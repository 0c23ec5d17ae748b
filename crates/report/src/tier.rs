//! `stria-bench-tier --json`: one object per phase of the tiered-volume benchmark (medians over
//! the repetitions, every repetition's figures, and, for the write phases, a time series of the
//! drive bytes written since the phase began).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Result, bail};
use serde::Deserialize;
use serde_json::Value;

use crate::md;
use crate::plot::{self, BarChart, LineChart, Panel, Series};

/// The benchmark's volume is `tiered:ec:4+2`: the capacity-tier goal for sequential writes is
/// (K+M)/K x 1.05.
const WA_GOAL: f64 = 6.0 / 4.0 * 1.05;
/// Samples with less host data than this are left out of the WA-over-time curves (a ratio of a
/// few blocks says nothing).
const MIN_HOST_MIB: f64 = 8.0;

/// One phase object. Figures are kept by name, since the set differs between phases.
#[derive(Debug, Deserialize)]
pub(crate) struct TierPhase {
    pub(crate) phase: String,
    #[serde(default)]
    pub(crate) load: String,
    #[serde(default)]
    pub(crate) volume: String,
    #[serde(default)]
    pub(crate) drives: String,
    /// Per repetition: samples taken while the phase ran and while destage drained after it.
    #[serde(default)]
    pub(crate) wa_series: Vec<Vec<WaSample>>,
    #[serde(flatten)]
    pub(crate) figures: BTreeMap<String, Value>,
}

/// Counters since the phase began, at `t_s` seconds.
#[derive(Debug, Clone, Copy, Deserialize)]
pub(crate) struct WaSample {
    pub(crate) t_s: f64,
    pub(crate) host_mib: f64,
    pub(crate) cap_mib: f64,
    pub(crate) fast_mib: f64,
    pub(crate) backlog_mib: f64,
}

impl TierPhase {
    fn get(&self, key: &str) -> Option<f64> {
        self.figures.get(key).and_then(Value::as_f64)
    }

    fn writes(&self) -> bool {
        self.get("cap_wa").is_some()
    }
}

/// Writes `REPORT.md`, `tier-wa.png` (write amplification per phase, and over time when the
/// JSON has the series) and `tier-latency.png`; returns the files written.
pub(crate) fn report(phases: &[TierPhase], dir: &Path) -> Result<Vec<String>> {
    if phases.is_empty() {
        bail!("the tier benchmark JSON has no phases");
    }
    let mut out = String::from("# Tiered volume benchmark (`stria-bench-tier`)\n\n");
    let _ = writeln!(
        out,
        "Volume: {}. Drives: {}. Phases of {} s; medians over {} repetition(s). Made by `stria-report tier` \
         from `stria-bench-tier --json`.\n",
        phases[0].volume,
        phases[0].drives,
        md::num(phases[0].get("seconds_per_phase"), 1),
        md::num(phases[0].get("reps"), 0),
    );
    let rows: Vec<Vec<String>> = phases
        .iter()
        .map(|p| {
            vec![
                p.phase.clone(),
                p.load.clone(),
                md::num(p.get("read_mb_s"), 0),
                md::num(p.get("read_iops"), 0),
                md::num(p.get("read_p50_us"), 1),
                md::num(p.get("read_p99_us"), 1),
                md::num(p.get("write_mb_s"), 0),
                md::num(p.get("write_p99_us"), 1),
                md::num(p.get("cap_wa"), 3),
                md::num(p.get("fast_wa"), 3),
                md::num(p.get("full_stripe_pct"), 1),
            ]
        })
        .collect();
    out.push_str(&md::table(
        &[
            "phase",
            "load",
            "read MB/s",
            "read IOPS",
            "read p50 us",
            "read p99 us",
            "write MB/s",
            "write p99 us",
            "capacity WA",
            "fast WA",
            "full stripes %",
        ],
        &[false, false, true, true, true, true, true, true, true, true, true],
        &rows,
    ));
    let _ = writeln!(
        out,
        "\nWA = drive bytes written per host byte, counted after destage drained (capacity: the 6 ec:4+2 \
         drives, all regions; fast: the 2 mirrored cache and map drives). Goal for sequential writes: \
         capacity WA <= {WA_GOAL:.3}.\n"
    );
    let mut written = Vec::new();
    let wa = wa_panels(phases);
    if !wa.is_empty() {
        plot::render(&dir.join("tier-wa.png"), &wa, 2)?;
        out.push_str(&md::image("write amplification", "tier-wa.png"));
        written.push("tier-wa.png".to_owned());
    }
    let lat = latency_panels(phases);
    if !lat.is_empty() {
        plot::render(&dir.join("tier-latency.png"), &lat, 2)?;
        out.push('\n');
        out.push_str(&md::image("latency percentiles per phase", "tier-latency.png"));
        written.push("tier-latency.png".to_owned());
    }
    std::fs::write(dir.join("REPORT.md"), out)?;
    written.push("REPORT.md".into());
    Ok(written)
}

fn wa_panels(phases: &[TierPhase]) -> Vec<Panel> {
    let writers: Vec<(usize, &TierPhase)> = phases.iter().enumerate().filter(|(_, p)| p.writes()).collect();
    if writers.is_empty() {
        return Vec::new();
    }
    let mut panels = vec![Panel::Bars(BarChart {
        title: "Capacity-tier write amplification per phase".into(),
        y_label: "capacity bytes written per host byte".into(),
        bars: writers
            .iter()
            .map(|&(i, p)| (p.phase.clone(), p.get("cap_wa").unwrap_or(f64::NAN), i))
            .collect(),
        annotations: writers.iter().map(|(_, p)| md::num(p.get("cap_wa"), 3)).collect(),
    })];
    let with_series: Vec<(usize, &TierPhase, &Vec<WaSample>)> = writers
        .iter()
        .filter_map(|&(i, p)| p.wa_series.first().filter(|s| !s.is_empty()).map(|s| (i, p, s)))
        .collect();
    if with_series.is_empty() {
        return panels;
    }
    let t_end = with_series.iter().flat_map(|(_, _, s)| s.iter().map(|x| x.t_s)).fold(0.0, f64::max);
    let mut wa: Vec<Series> = with_series
        .iter()
        .map(|&(i, p, s)| {
            let pts = s
                .iter()
                .filter(|x| x.host_mib >= MIN_HOST_MIB)
                .map(|x| (x.t_s, x.cap_mib / x.host_mib))
                .collect();
            Series::new(p.phase.clone(), i, pts)
        })
        .collect();
    let mut goal = Series::new(format!("goal {WA_GOAL:.3}"), 6, vec![(0.0, WA_GOAL), (t_end, WA_GOAL)]);
    goal.reference = true;
    wa.push(goal);
    panels.push(Panel::Lines(LineChart {
        title: "Capacity WA since the phase began (repetition 1)".into(),
        x_label: "seconds since the phase began (timed load, then destage drains)".into(),
        y_label: "capacity bytes / host bytes so far".into(),
        y_from_zero: true,
        series: wa,
        ..LineChart::default()
    }));
    panels.push(Panel::Lines(LineChart {
        title: "Fast-tier WA since the phase began (repetition 1)".into(),
        x_label: "seconds since the phase began".into(),
        y_label: "fast-drive bytes / host bytes so far".into(),
        y_from_zero: true,
        series: with_series
            .iter()
            .map(|&(i, p, s)| {
                let pts = s
                    .iter()
                    .filter(|x| x.host_mib >= MIN_HOST_MIB)
                    .map(|x| (x.t_s, x.fast_mib / x.host_mib))
                    .collect();
                Series::new(p.phase.clone(), i, pts)
            })
            .collect(),
        ..LineChart::default()
    }));
    panels.push(Panel::Lines(LineChart {
        title: "Write-cache backlog (repetition 1)".into(),
        x_label: "seconds since the phase began".into(),
        y_label: "MiB cached, not yet destaged".into(),
        y_from_zero: true,
        series: with_series
            .iter()
            .map(|&(i, p, s)| {
                Series::new(p.phase.clone(), i, s.iter().map(|x| (x.t_s, x.backlog_mib)).collect())
            })
            .collect(),
        ..LineChart::default()
    }));
    panels
}

/// Percentile curves (p50, p99, p99.9) of reads and of writes, a line per phase.
fn latency_panels(phases: &[TierPhase]) -> Vec<Panel> {
    ["read", "write"]
        .iter()
        .filter_map(|what| {
            let series: Vec<Series> = phases
                .iter()
                .enumerate()
                .filter_map(|(i, p)| {
                    let pts: Vec<(f64, f64)> = [("p50", 50.0), ("p99", 99.0), ("p999", 99.9)]
                        .iter()
                        .filter_map(|&(k, pct)| Some((pct, p.get(&format!("{what}_{k}_us"))?)))
                        .collect();
                    (pts.len() >= 2).then(|| plot::cdf_series(&p.phase, i, &pts))
                })
                .collect();
            (!series.is_empty()).then(|| {
                let mut c = plot::cdf_chart(format!("{what} latency per phase (p50, p99, p99.9)"), series);
                c.x_label = "latency, submit to completion (us, log scale)".into();
                Panel::Lines(c)
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{TempDir, is_png};

    /// Two phases as `stria-bench-tier --json` writes them (trimmed), one with a series.
    const FIXTURE: &str = r#"[
      {"phase": "seq-write-1", "load": "1 x seq write 512K, QD 1", "volume": "tiered:ec:4+2", "drives": "files",
       "seconds_per_phase": 2.0, "reps": 1, "write_mb_s": 900.0, "write_p50_us": 400.0, "write_p99_us": 1500.0,
       "write_p999_us": 3000.0, "write_max_us": 9000.0, "cap_wa": 1.519, "fast_wa": 2.1,
       "full_stripe_pct": 100.0, "per_rep": [{"cap_wa": 1.519}], "errors": 0, "mismatches": 0,
       "wa_series": [[{"t_s": 0.1, "host_mib": 0.5, "cap_mib": 0.0, "fast_mib": 1.0, "backlog_mib": 0.5},
                      {"t_s": 0.2, "host_mib": 90.0, "cap_mib": 60.0, "fast_mib": 190.0, "backlog_mib": 50.0},
                      {"t_s": 2.5, "host_mib": 1800.0, "cap_mib": 2734.0, "fast_mib": 3700.0, "backlog_mib": 0.0}]]},
      {"phase": "rand-read-4k", "load": "4 x rand read 4K, QD 1 each", "read_mb_s": 600.0, "read_iops": 149000.0,
       "read_p50_us": 20.0, "read_p99_us": 80.0, "read_p999_us": 200.0, "read_max_us": 900.0, "per_rep": [],
       "errors": 0, "mismatches": 0}
    ]"#;

    #[test]
    fn parses_phases_and_series() {
        let phases: Vec<TierPhase> = crate::parse_json(FIXTURE).unwrap();
        assert_eq!(phases.len(), 2);
        assert!(phases[0].writes() && !phases[1].writes());
        assert_eq!(phases[0].get("cap_wa"), Some(1.519));
        assert_eq!(phases[0].wa_series[0].len(), 3);
        assert!(phases[1].wa_series.is_empty());
    }

    #[test]
    fn writes_report_and_pngs() {
        let phases: Vec<TierPhase> = crate::parse_json(FIXTURE).unwrap();
        let dir = TempDir::new("tier");
        let files = report(&phases, dir.path()).unwrap();
        assert_eq!(files, ["tier-wa.png", "tier-latency.png", "REPORT.md"]);
        assert!(is_png(&dir.path().join("tier-wa.png")));
        assert!(is_png(&dir.path().join("tier-latency.png")));
        let md = std::fs::read_to_string(dir.path().join("REPORT.md")).unwrap();
        assert!(
            md.contains("| seq-write-1 | 1 x seq write 512K, QD 1 | - | - | - | - | 900 | 1500.0 | 1.519 |")
        );
    }
}
