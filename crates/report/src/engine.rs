//! `stria-bench-engine --json`'s output: the engine's software overhead over memory drives, every
//! layout against raw drives of the same count driven with the same requests (healthy, and with
//! one drive failed where the layout tolerates it), and the drive write amplification.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Result, bail};
use serde::Deserialize;

use crate::md;
use crate::plot::{self, BarSeries, GroupedBarChart, Panel};

/// One object of the JSON array: `kind` tells an I/O cell from a write-amplification row.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "kind")]
pub(crate) enum EngineRow {
    #[serde(rename = "io")]
    Io(IoCell),
    #[serde(rename = "write-amp")]
    WriteAmp(AmpRow),
    #[serde(other)]
    Other,
}

/// A layout (or the raw drives, layout `raw`) doing one operation.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct IoCell {
    pub(crate) layout: String,
    pub(crate) drives: u32,
    /// `healthy`, `degraded`, or `-` for raw drives.
    pub(crate) state: String,
    pub(crate) op: String,
    pub(crate) req_bytes: u64,
    #[serde(default)]
    pub(crate) qd: Option<u32>,
    #[serde(default)]
    pub(crate) threads: Option<u32>,
    #[serde(default)]
    pub(crate) clock: Option<String>,
    #[serde(default)]
    pub(crate) runs: Option<u32>,
    pub(crate) iops: Option<f64>,
    #[serde(default)]
    pub(crate) mib_s: Option<f64>,
    #[serde(default)]
    pub(crate) lat_us_p50: Option<f64>,
    #[serde(default)]
    pub(crate) lat_us_p99: Option<f64>,
    #[serde(default)]
    pub(crate) lat_us_p999: Option<f64>,
    #[serde(default)]
    pub(crate) vs_raw: Option<f64>,
    #[serde(default)]
    pub(crate) vs_healthy: Option<f64>,
    #[serde(default)]
    pub(crate) drive_reads_per_op: Option<f64>,
    #[serde(default)]
    pub(crate) drive_write_bytes_per_host_byte: Option<f64>,
    #[serde(default)]
    pub(crate) errors: u64,
}

impl IoCell {
    fn is_raw(&self) -> bool {
        self.layout == "raw"
    }

    fn degraded(&self) -> bool {
        self.state == "degraded"
    }

    /// MiB/s: as recorded, else from IOPS and the request size.
    fn mib_s(&self) -> Option<f64> {
        self.mib_s.or_else(|| self.iops.map(|i| i * self.req_bytes as f64 / f64::from(1u32 << 20)))
    }

    /// Random 4 KiB cells are read in IOPS, sequential ones in MiB/s.
    fn bandwidth_op(&self) -> bool {
        !self.op.starts_with("rand")
    }

    fn figure(&self) -> Option<f64> {
        if self.bandwidth_op() { self.mib_s() } else { self.iops }
    }
}

/// Drive bytes written per host byte, by drive region.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct AmpRow {
    pub(crate) layout: String,
    pub(crate) volume_bytes: u64,
    pub(crate) pattern: String,
    pub(crate) req_bytes: u64,
    pub(crate) flush_every: u64,
    #[serde(default)]
    pub(crate) data_per_host_byte: Option<f64>,
    #[serde(default)]
    pub(crate) journal_per_host_byte: Option<f64>,
    #[serde(default)]
    pub(crate) checksum_per_host_byte: Option<f64>,
    #[serde(default)]
    pub(crate) intent_per_host_byte: Option<f64>,
    #[serde(default)]
    pub(crate) meta_per_host_byte: Option<f64>,
    #[serde(default)]
    pub(crate) total_per_host_byte: Option<f64>,
}

/// The run's I/O cells and write-amplification rows, in the JSON's order.
pub(crate) struct EngineRun {
    pub(crate) io: Vec<IoCell>,
    pub(crate) amp: Vec<AmpRow>,
}

impl EngineRun {
    pub(crate) fn new(rows: Vec<EngineRow>) -> EngineRun {
        let mut run = EngineRun { io: Vec::new(), amp: Vec::new() };
        for r in rows {
            match r {
                EngineRow::Io(c) => run.io.push(c),
                EngineRow::WriteAmp(a) => run.amp.push(a),
                EngineRow::Other => {}
            }
        }
        run
    }

    fn raw_for(&self, c: &IoCell) -> Option<&IoCell> {
        self.io
            .iter()
            .find(|r| r.is_raw() && r.drives == c.drives && r.op == c.op && r.req_bytes == c.req_bytes)
    }

    fn cell(&self, layout: &str, degraded: bool, op: &str) -> Option<&IoCell> {
        self.io.iter().find(|c| c.layout == layout && c.degraded() == degraded && c.op == op)
    }

    /// Layout / raw drives: as recorded, else computed from IOPS.
    fn vs_raw(&self, c: &IoCell) -> Option<f64> {
        if c.is_raw() {
            return None;
        }
        c.vs_raw.or_else(|| {
            let raw = self.raw_for(c)?.iops.filter(|r| *r > 0.0)?;
            c.iops.map(|i| i / raw)
        })
    }

    /// Degraded / healthy: as recorded, else computed.
    fn vs_healthy(&self, c: &IoCell) -> Option<f64> {
        if !c.degraded() {
            return None;
        }
        c.vs_healthy.or_else(|| {
            let h = self.cell(&c.layout, false, &c.op)?.iops.filter(|h| *h > 0.0)?;
            c.iops.map(|i| i / h)
        })
    }

    fn layouts(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for c in self.io.iter().filter(|c| !c.is_raw()) {
            if !out.contains(&c.layout) {
                out.push(c.layout.clone());
            }
        }
        out
    }

    fn ops(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for c in &self.io {
            if !out.contains(&c.op) {
                out.push(c.op.clone());
            }
        }
        out
    }
}

/// `ec:K+M` -> (K, M).
fn ec_shape(layout: &str) -> Option<(f64, f64)> {
    let (k, m) = layout.strip_prefix("ec:")?.split_once('+')?;
    Some((k.parse().ok()?, m.parse().ok()?))
}

/// The goals `stria-bench-engine` prints, evaluated on the JSON: ec 4 KiB random reads at least
/// 0.90x raw, ec full-stripe writes at least 0.80x of raw write bandwidth x K/(K+M), degraded at
/// least 0.75x of healthy.
fn goals(run: &EngineRun) -> String {
    let verdict = |ok: bool| if ok { "met" } else { "**not met**" };
    let mut rows = Vec::new();
    for c in run.io.iter().filter(|c| !c.is_raw() && !c.degraded()) {
        let Some((k, m)) = ec_shape(&c.layout) else { continue };
        if c.op == "rand-read" {
            if let Some(r) = run.vs_raw(c) {
                rows.push(vec![
                    format!("{} 4K random read vs raw", c.layout),
                    "0.90x".into(),
                    md::ratio(Some(r)),
                    verdict(r >= 0.9).into(),
                ]);
            }
        } else if c.op == "full-stripe-write" {
            let raw = run.raw_for(c).and_then(IoCell::mib_s);
            if let (Some(raw), Some(v)) = (raw, c.mib_s()) {
                let r = v / (raw * k / (k + m));
                rows.push(vec![
                    format!(
                        "{} full-stripe write vs raw write x K/(K+M) ({:.0} MiB/s)",
                        c.layout,
                        raw * k / (k + m)
                    ),
                    "0.80x".into(),
                    md::ratio(Some(r)),
                    verdict(r >= 0.8).into(),
                ]);
            }
        }
    }
    for c in run.io.iter().filter(|c| c.degraded()) {
        if let Some(r) = run.vs_healthy(c) {
            rows.push(vec![
                format!("{} {} degraded vs healthy", c.layout, c.op),
                "0.75x".into(),
                md::ratio(Some(r)),
                verdict(r >= 0.75).into(),
            ]);
        }
    }
    if rows.is_empty() {
        return String::new();
    }
    let mut out =
        String::from("\n## Goals\n\nThe goals `stria-bench-engine` prints with its tables, on this run:\n\n");
    out.push_str(&md::table(&["goal", "at least", "this run", ""], &[false, true, true, false], &rows));
    out
}

fn size_label(bytes: u64) -> String {
    crate::ec::size_label(bytes)
}

/// Writes `REPORT.md` and `engine-io.png` (a panel per operation, a group of bars per layout:
/// raw drives, healthy, degraded); returns the files written.
pub(crate) fn report(run: &EngineRun, dir: &Path) -> Result<Vec<String>> {
    if run.io.is_empty() {
        bail!("the engine benchmark JSON has no I/O cells");
    }
    let first = &run.io[0];
    let opt = |v: Option<u32>| v.map_or_else(|| "?".to_owned(), |v| v.to_string());
    let mut out = String::from("# Engine overhead: stria layouts against raw memory drives\n\n");
    let _ = writeln!(
        out,
        "Made by `stria-report engine` from the JSON of `stria-bench-engine --json`. In-process, over memory \
         drives (`MemDevice`): each layout on as many drives as it has members, against the same number of raw \
         drives given the same requests through the same `BlockDevice` path, runs alternating. Volumes are filled \
         with tagged data first and every read checks its tags. QD {}, {} runtime thread(s), median of {} runs, \
         rates by the `{}` clock (`Cpu`: per CPU-second of the process, so neighbours on the machine do not \
         lower them). The CPU model is not recorded in the JSON.\n",
        opt(first.qd),
        opt(first.threads),
        opt(first.runs),
        first.clock.as_deref().unwrap_or("?"),
    );
    out.push_str(
        "4 KiB random cells are compared in IOPS, sequential and full-stripe cells in MiB/s (the same ratio: raw \
         and layout use the same request size).\n",
    );
    let errors: u64 = run.io.iter().map(|c| c.errors).sum();
    if errors > 0 {
        let _ = writeln!(out, "\n**{errors} requests failed in this run**: its figures are not valid.");
    }

    let layouts = run.layouts();
    let ops = run.ops();
    let any_degraded = run.io.iter().any(IoCell::degraded);
    out.push_str("\n## Ratios to raw drives\n\nLayout / raw drives of the same count (degraded / healthy in brackets):\n\n");
    let mut headers = vec!["layout"];
    headers.extend(ops.iter().map(String::as_str));
    let right: Vec<bool> = (0..headers.len()).map(|i| i > 0).collect();
    let mut rows = Vec::new();
    for l in &layouts {
        for degraded in [false, true] {
            if degraded && !ops.iter().any(|o| run.cell(l, true, o).is_some()) {
                continue;
            }
            let mut row = vec![format!("{l} {}", if degraded { "degraded" } else { "healthy" })];
            row.extend(ops.iter().map(|o| match run.cell(l, degraded, o) {
                Some(c) if degraded => {
                    format!("{} ({})", md::ratio(run.vs_raw(c)), md::ratio(run.vs_healthy(c)))
                }
                Some(c) => md::ratio(run.vs_raw(c)),
                None => "-".into(),
            }));
            rows.push(row);
        }
    }
    out.push_str(&md::table(&headers, &right, &rows));

    out.push_str(&goals(run));

    out.push_str("\n## All cells\n\n");
    let all: Vec<Vec<String>> = run
        .io
        .iter()
        .map(|c| {
            vec![
                c.layout.clone(),
                c.drives.to_string(),
                c.state.clone(),
                c.op.clone(),
                size_label(c.req_bytes),
                md::num(c.iops, 0),
                md::num(c.mib_s(), 0),
                md::num(c.lat_us_p50, 1),
                md::num(c.lat_us_p99, 1),
                md::num(c.lat_us_p999, 1),
                md::ratio(run.vs_raw(c)),
                md::ratio(run.vs_healthy(c)),
                md::num(c.drive_reads_per_op, 2),
                md::num(c.drive_write_bytes_per_host_byte, 2),
            ]
        })
        .collect();
    out.push_str(&md::table(
        &[
            "layout",
            "drives",
            "state",
            "op",
            "req",
            "IOPS",
            "MiB/s",
            "p50 us",
            "p99 us",
            "p99.9 us",
            "vs raw",
            "vs healthy",
            "drive reads/op",
            "drive bytes written/host byte",
        ],
        &[false, true, false, false, true, true, true, true, true, true, true, true, true, true],
        &all,
    ));

    if !run.amp.is_empty() {
        out.push_str(
            "\n## Drive write amplification\n\nDrive bytes written per host byte, by drive region (writes one at a \
             time, a volume flush every N writes and at the end):\n\n",
        );
        let amp: Vec<Vec<String>> = run
            .amp
            .iter()
            .map(|r| {
                vec![
                    r.layout.clone(),
                    format!("{}G", r.volume_bytes >> 30),
                    r.pattern.clone(),
                    size_label(r.req_bytes),
                    r.flush_every.to_string(),
                    md::num(r.data_per_host_byte, 3),
                    md::num(r.journal_per_host_byte, 3),
                    md::num(r.checksum_per_host_byte, 4),
                    md::num(r.intent_per_host_byte, 4),
                    md::num(r.meta_per_host_byte, 4),
                    md::num(r.total_per_host_byte, 3),
                ]
            })
            .collect();
        out.push_str(&md::table(
            &["layout", "volume", "io", "req", "N", "data", "journal", "checksum", "intent", "meta", "total"],
            &[false, true, false, true, true, true, true, true, true, true, true],
            &amp,
        ));
    }

    let mut written = Vec::new();
    let panels: Vec<Panel> = ops
        .iter()
        .filter_map(|op| {
            let cats: Vec<&String> = layouts.iter().filter(|l| run.cell(l, false, op).is_some()).collect();
            if cats.is_empty() {
                return None;
            }
            let sample = run.cell(cats[0], false, op)?;
            let raw: Vec<Option<&IoCell>> =
                cats.iter().map(|l| run.cell(l, false, op).and_then(|c| run.raw_for(c))).collect();
            let mut series = vec![BarSeries {
                name: "raw drives (same count)".into(),
                color_index: 6,
                values: raw.iter().map(|r| r.and_then(IoCell::figure)).collect(),
                annotations: Vec::new(),
            }];
            for (degraded, name, ci) in [(false, "healthy", 0), (true, "one drive failed", 1)] {
                let cells: Vec<Option<&IoCell>> = cats.iter().map(|l| run.cell(l, degraded, op)).collect();
                if degraded && cells.iter().all(Option::is_none) {
                    continue;
                }
                series.push(BarSeries {
                    name: name.into(),
                    color_index: ci,
                    values: cells.iter().map(|c| c.and_then(IoCell::figure)).collect(),
                    annotations: cells
                        .iter()
                        .map(|c| {
                            c.and_then(|c| run.vs_raw(c)).map_or_else(String::new, |r| format!("{r:.2}x"))
                        })
                        .collect(),
                });
            }
            let (unit, what) = if sample.bandwidth_op() { ("MiB/s", "MiB/s") } else { ("IOPS", "IOPS") };
            Some(Panel::Groups(GroupedBarChart {
                title: format!("{op} {} ({what}, ratio to raw)", size_label(sample.req_bytes)),
                y_label: unit.into(),
                categories: cats.iter().map(|l| (*l).clone()).collect(),
                series,
            }))
        })
        .collect();
    if !panels.is_empty() {
        plot::render(&dir.join("engine-io.png"), &panels, 2)?;
        let _ = write!(
            out,
            "\n## Plots\n\nRaw drives (black), the layout healthy{} and the ratio to raw drives above each bar. \
             full-stripe-write's request is one stripe (K x chunk), so its raw drives are measured with that \
             request size too.\n\n",
            if any_degraded { " and with one drive failed" } else { "" }
        );
        out.push_str(&md::image("IOPS and bandwidth per layout against raw drives", "engine-io.png"));
        written.push("engine-io.png".to_owned());
    }
    std::fs::write(dir.join("REPORT.md"), out)?;
    written.push("REPORT.md".into());
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{TempDir, is_png};

    const FIXTURE: &str = r#"[
{"kind":"io","layout":"raw","drives":6,"state":"-","op":"rand-read","req_bytes":4096,"qd":32,"threads":1,"clock":"Cpu","runs":5,"iops":100000.0,"wall_iops":90000.0,"mib_s":390.625,"lat_us_p50":10.0,"lat_us_p99":20.0,"lat_us_p999":30.0,"vs_raw":null,"vs_healthy":null,"drive_reads_per_op":1.0,"drive_write_bytes_per_host_byte":0.0,"errors":0},
{"kind":"io","layout":"raw","drives":6,"state":"-","op":"seq-write","req_bytes":131072,"qd":32,"threads":1,"clock":"Cpu","runs":5,"iops":10000.0,"mib_s":1250.0,"errors":0},
{"kind":"io","layout":"ec:4+2","drives":6,"state":"healthy","op":"rand-read","req_bytes":4096,"qd":32,"threads":1,"clock":"Cpu","runs":5,"iops":90000.0,"mib_s":351.5625,"vs_raw":0.9,"vs_healthy":null,"errors":0},
{"kind":"io","layout":"ec:4+2","drives":6,"state":"healthy","op":"seq-write","req_bytes":131072,"iops":5000.0,"errors":0},
{"kind":"io","layout":"ec:4+2","drives":6,"state":"degraded","op":"rand-read","req_bytes":4096,"iops":45000.0,"vs_raw":0.45,"vs_healthy":0.5,"errors":0},
{"kind":"io","layout":"raid0:6","drives":6,"state":"healthy","op":"rand-read","req_bytes":4096,"iops":80000.0,"errors":0},
{"kind":"write-amp","layout":"ec:4+2","volume_bytes":1073741824,"pattern":"rand","req_bytes":4096,"flush_every":1,"host_bytes":33554432,"data_per_host_byte":2.5,"journal_per_host_byte":0.5,"checksum_per_host_byte":0.01,"intent_per_host_byte":0.001,"meta_per_host_byte":0.002,"total_per_host_byte":3.013}
]"#;

    fn run() -> EngineRun {
        EngineRun::new(crate::parse_json(FIXTURE).unwrap())
    }

    #[test]
    fn parses_and_computes_missing_ratios() {
        let run = run();
        assert_eq!((run.io.len(), run.amp.len()), (6, 1));
        let ec_seq = run.cell("ec:4+2", false, "seq-write").unwrap();
        assert_eq!(run.vs_raw(ec_seq), Some(0.5));
        assert_eq!(ec_seq.mib_s(), Some(625.0));
        let raid0 = run.cell("raid0:6", false, "rand-read").unwrap();
        assert_eq!(run.vs_raw(raid0), Some(0.8));
        assert_eq!(run.vs_healthy(run.cell("ec:4+2", true, "rand-read").unwrap()), Some(0.5));
        assert_eq!(run.layouts(), ["ec:4+2", "raid0:6"]);
        assert_eq!(run.ops(), ["rand-read", "seq-write"]);
        assert_eq!(ec_shape("ec:4+2"), Some((4.0, 2.0)));
        assert_eq!(ec_shape("raid0:6"), None);
    }

    #[test]
    fn writes_report_and_png() {
        let dir = TempDir::new("engine");
        let files = report(&run(), dir.path()).unwrap();
        assert_eq!(files, ["engine-io.png", "REPORT.md"]);
        assert!(is_png(&dir.path().join("engine-io.png")));
        let md = std::fs::read_to_string(dir.path().join("REPORT.md")).unwrap();
        assert!(md.contains("| ec:4+2 healthy | 0.90x | 0.50x |"), "{md}");
        assert!(md.contains("| ec:4+2 degraded | 0.45x (0.50x) | - |"), "{md}");
        assert!(md.contains("| raid0:6 healthy | 0.80x | - |"), "{md}");
        assert!(md.contains("| ec:4+2 | 1G | rand | 4KiB | 1 | 2.500 |"), "{md}");
        assert!(md.contains("QD 32, 1 runtime thread(s), median of 5 runs"), "{md}");
        assert!(md.contains("| ec:4+2 4K random read vs raw | 0.90x | 0.90x | met |"), "{md}");
        assert!(
            md.contains("| ec:4+2 rand-read degraded vs healthy | 0.75x | 0.50x | **not met** |"),
            "{md}"
        );
    }

    #[test]
    fn without_io_cells_is_an_error() {
        let dir = TempDir::new("engine-empty");
        assert!(report(&EngineRun::new(Vec::new()), dir.path()).is_err());
    }
}
