//! `stria-bench-ec --json`'s output: erasure-code throughput of stria-ec's kernel against Intel
//! ISA-L (when the run could load it) and the memory references (K-way XOR, memcpy), measured on
//! the same buffers in the same run.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Result, bail};
use serde::Deserialize;

use crate::md;
use crate::plot::{self, BarSeries, GroupedBarChart, Panel};

/// One figure of the benchmark: an operation on one stripe shape and shard size.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct EcCell {
    pub(crate) k: u32,
    pub(crate) m: u32,
    pub(crate) shard_bytes: u64,
    #[serde(default)]
    pub(crate) cold: bool,
    pub(crate) op: String,
    /// stria-ec's kernel, GB/s of data (10^9 B/s).
    pub(crate) gbps: f64,
    #[serde(default)]
    pub(crate) isal_gbps: Option<f64>,
    /// stria / ISA-L, as recorded.
    #[serde(default)]
    pub(crate) ratio: Option<f64>,
    #[serde(default)]
    pub(crate) xor_gbps: Option<f64>,
    #[serde(default)]
    pub(crate) memcpy_gbps: Option<f64>,
    /// The stria-ec backend (kernel) the run chose or was given.
    #[serde(default)]
    pub(crate) backend: String,
    #[serde(default)]
    pub(crate) isal_version: Option<String>,
    /// The CPU model, if a later version of the benchmark records it.
    #[serde(default)]
    pub(crate) cpu: Option<String>,
}

impl EcCell {
    fn shape(&self) -> String {
        format!("{}+{}", self.k, self.m)
    }

    /// stria / ISA-L: as recorded, else computed.
    fn ratio(&self) -> Option<f64> {
        self.ratio.or_else(|| self.isal_gbps.filter(|i| *i > 0.0).map(|i| self.gbps / i))
    }

    /// stria / the K-way XOR reference; not for updates, whose GB/s count one shard, not K.
    fn vs_xor(&self) -> Option<f64> {
        if self.op.starts_with("update") {
            return None;
        }
        self.xor_gbps.filter(|x| *x > 0.0).map(|x| self.gbps / x)
    }
}

/// `4096` -> `4KiB`, `1048576` -> `1MiB`.
pub(crate) fn size_label(bytes: u64) -> String {
    if bytes >= 1 << 20 && bytes.is_multiple_of(1 << 20) {
        format!("{}MiB", bytes >> 20)
    } else if bytes >= 1 << 10 && bytes.is_multiple_of(1 << 10) {
        format!("{}KiB", bytes >> 10)
    } else {
        format!("{bytes}B")
    }
}

/// Distinct values in the order they first appear.
fn distinct<T: PartialEq + Clone>(items: impl Iterator<Item = T>) -> Vec<T> {
    let mut out: Vec<T> = Vec::new();
    for i in items {
        if !out.contains(&i) {
            out.push(i);
        }
    }
    out
}

/// The geometric mean of the finite positive values (`None` without any).
pub(crate) fn geomean(values: impl Iterator<Item = f64>) -> Option<f64> {
    let logs: Vec<f64> = values.filter(|v| v.is_finite() && *v > 0.0).map(f64::ln).collect();
    (!logs.is_empty()).then(|| (logs.iter().sum::<f64>() / logs.len() as f64).exp())
}

fn joined(values: &[String], none: &str) -> String {
    if values.is_empty() { none.to_owned() } else { values.join(", ") }
}

/// Writes `REPORT.md` and one `ec-OP.png` per operation (a panel per shard size, a group of
/// bars per stripe shape: stria, ISA-L, XOR, memcpy); returns the files written.
pub(crate) fn report(cells: &[EcCell], dir: &Path) -> Result<Vec<String>> {
    if cells.is_empty() {
        bail!("the erasure-code benchmark JSON has no cells");
    }
    let backends = distinct(cells.iter().map(|c| c.backend.clone()).filter(|b| !b.is_empty()));
    let isal_versions = distinct(cells.iter().filter_map(|c| c.isal_version.clone()));
    let cpus = distinct(cells.iter().filter_map(|c| c.cpu.clone()));
    let has_isal = cells.iter().any(|c| c.isal_gbps.is_some());
    let ops = distinct(cells.iter().map(|c| c.op.clone()));
    let mut out = String::from("# Erasure coding: stria-ec against ISA-L and the memory limits\n\n");
    let _ = writeln!(
        out,
        "Made by `stria-report ec` from the JSON of `stria-bench-ec --json`. GB/s of data (10^9 B/s): K x shard \
         bytes per encode or reconstruct call, the changed shard per update call; each figure is the median of \
         the run's samples, stria and ISA-L samples alternating on the same buffers. Shards marked cold are \
         cycled through a working set larger than the caches, so they come from memory.\n"
    );
    let _ = writeln!(out, "* stria-ec kernel (backend): {}", joined(&backends, "not recorded"));
    let _ = writeln!(
        out,
        "* CPU: {}",
        joined(
            &cpus,
            "not recorded in the JSON (`stria-bench-ec` prints the model only in its table header; see where \
             this report is linked from)"
        )
    );
    if has_isal {
        let _ = writeln!(
            out,
            "* ISA-L: {} (the reference measured in the same run)",
            joined(&isal_versions, "loaded")
        );
    } else {
        out.push_str(
            "* ISA-L: **not measured in this run** (the library could not be loaded, or `--no-isal`; \
             `scripts/fetch-isal.sh` fetches it into `.bench/isal`). Ratios to ISA-L are missing; the XOR and \
             memcpy figures are the only references.\n",
        );
    }
    out.push_str(
        "* References: `xor` is a K-way XOR over the same shards (the better of a plain loop and stria's own M=1 \
         kernel), `memcpy` copies the same bytes: what memory allows, not a competitor. They count K shards per \
         call, an update counts the one shard it changes, so stria / xor is left out for updates.\n",
    );

    out.push_str("\n## Summary\n\n");
    let summary: Vec<Vec<String>> = ops
        .iter()
        .map(|op| {
            let of_op = || cells.iter().filter(|c| &c.op == op);
            let ratios: Vec<f64> = of_op().filter_map(EcCell::ratio).collect();
            let lo = ratios.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            vec![
                op.clone(),
                of_op().count().to_string(),
                md::num(geomean(of_op().map(|c| c.gbps)), 2),
                md::num(geomean(of_op().filter_map(|c| c.isal_gbps)), 2),
                md::ratio(geomean(ratios.iter().copied())),
                if ratios.is_empty() { "-".into() } else { format!("{lo:.2}x – {hi:.2}x") },
                md::ratio(geomean(of_op().filter_map(EcCell::vs_xor))),
            ]
        })
        .collect();
    out.push_str(&md::table(
        &[
            "op",
            "cells",
            "stria GB/s (geomean)",
            "ISA-L GB/s (geomean)",
            "stria / ISA-L (geomean)",
            "range",
            "stria / xor",
        ],
        &[false, true, true, true, true, true, true],
        &summary,
    ));

    out.push_str("\n## All cells\n\n");
    let rows: Vec<Vec<String>> = ops
        .iter()
        .flat_map(|op| cells.iter().filter(move |c| &c.op == op))
        .map(|c| {
            vec![
                c.op.clone(),
                c.shape(),
                size_label(c.shard_bytes),
                if c.cold { "cold" } else { "hot" }.into(),
                md::num(Some(c.gbps), 2),
                md::num(c.isal_gbps, 2),
                md::ratio(c.ratio()),
                md::num(c.xor_gbps, 2),
                md::num(c.memcpy_gbps, 2),
                md::ratio(c.vs_xor()),
            ]
        })
        .collect();
    out.push_str(&md::table(
        &[
            "op",
            "K+M",
            "shard",
            "",
            "stria GB/s",
            "ISA-L GB/s",
            "stria / ISA-L",
            "xor GB/s",
            "memcpy GB/s",
            "stria / xor",
        ],
        &[false, false, true, false, true, true, true, true, true, true],
        &rows,
    ));

    let mut written = Vec::new();
    out.push_str("\n## Plots\n\nThe ratio above each stria bar is stria / ISA-L (stria / xor when ISA-L is missing). \
         Updates are plotted without the memory references (they count K shards per call, an update one).\n\n");
    for op in &ops {
        let of_op: Vec<&EcCell> = cells.iter().filter(|c| &c.op == op).collect();
        let sizes = distinct(of_op.iter().map(|c| c.shard_bytes));
        let panels: Vec<Panel> = sizes
            .iter()
            .filter_map(|&size| {
                let row: Vec<&EcCell> = of_op.iter().copied().filter(|c| c.shard_bytes == size).collect();
                let shapes = distinct(row.iter().map(|c| c.shape()));
                let cell = |s: &String| row.iter().copied().find(|c| &c.shape() == s);
                let values = |f: &dyn Fn(&EcCell) -> Option<f64>| -> Vec<Option<f64>> {
                    shapes.iter().map(|s| cell(s).and_then(f)).collect()
                };
                let mut series = vec![BarSeries {
                    name: format!("stria ({})", joined(&backends, "?")),
                    color_index: 0,
                    values: values(&|c| Some(c.gbps)),
                    annotations: shapes
                        .iter()
                        .map(|s| {
                            let c = cell(s);
                            match c.and_then(EcCell::ratio) {
                                Some(r) => format!("{r:.2}x"),
                                None => c
                                    .and_then(EcCell::vs_xor)
                                    .map_or_else(String::new, |r| format!("{r:.2}x xor")),
                            }
                        })
                        .collect(),
                }];
                if has_isal {
                    series.push(BarSeries {
                        name: "ISA-L".into(),
                        color_index: 1,
                        values: values(&|c| c.isal_gbps),
                        annotations: Vec::new(),
                    });
                }
                for (name, ci, f) in [
                    ("xor (memory ref.)", 5, (|c: &EcCell| c.xor_gbps) as fn(&EcCell) -> Option<f64>),
                    ("memcpy (memory ref.)", 6, |c: &EcCell| c.memcpy_gbps),
                ] {
                    let v = values(&f);
                    // An update's GB/s count one shard, the references K: not on the same scale.
                    if !op.starts_with("update") && v.iter().any(Option::is_some) {
                        series.push(BarSeries {
                            name: name.into(),
                            color_index: ci,
                            values: v,
                            annotations: Vec::new(),
                        });
                    }
                }
                let cold = row.iter().any(|c| c.cold);
                Some(Panel::Groups(GroupedBarChart {
                    title: format!(
                        "{op}, {} shards ({})",
                        size_label(size),
                        if cold { "cold" } else { "hot" }
                    ),
                    y_label: "GB/s of data".into(),
                    categories: shapes.clone(),
                    series,
                }))
                .filter(|_| !shapes.is_empty())
            })
            .collect();
        if panels.is_empty() {
            continue;
        }
        let name = format!("ec-{}.png", op.replace(|ch: char| !ch.is_ascii_alphanumeric() && ch != '-', "_"));
        plot::render(&dir.join(&name), &panels, 3)?;
        out.push_str(&md::image(&format!("{op}: GB/s per stripe shape and shard size"), &name));
        out.push('\n');
        written.push(name);
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
{"k":4,"m":2,"shard_bytes":4096,"cold":false,"op":"encode","gbps":12.000,"isal_gbps":10.000,"ratio":1.200,"xor_gbps":30.000,"memcpy_gbps":40.000,"backend":"avx2","isal_version":"2.31.1"},
{"k":8,"m":3,"shard_bytes":4096,"cold":false,"op":"encode","gbps":8.000,"isal_gbps":10.000,"ratio":null,"xor_gbps":20.000,"memcpy_gbps":40.000,"backend":"avx2","isal_version":"2.31.1"},
{"k":4,"m":2,"shard_bytes":1048576,"cold":true,"op":"encode","gbps":5.000,"isal_gbps":5.000,"ratio":1.000,"xor_gbps":6.000,"memcpy_gbps":7.000,"backend":"avx2","isal_version":"2.31.1"},
{"k":4,"m":2,"shard_bytes":4096,"cold":false,"op":"reconstruct","gbps":9.000,"isal_gbps":12.000,"ratio":0.750,"xor_gbps":30.000,"memcpy_gbps":40.000,"backend":"avx2","isal_version":"2.31.1"}
]"#;

    const NO_ISAL: &str = r#"[
{"k":4,"m":2,"shard_bytes":65536,"cold":false,"op":"update","gbps":3.000,"isal_gbps":null,"ratio":null,"xor_gbps":6.000,"memcpy_gbps":9.000,"backend":"ssse3","isal_version":null}
]"#;

    #[test]
    fn parses_and_computes_missing_ratios() {
        let cells: Vec<EcCell> = crate::parse_json(FIXTURE).unwrap();
        assert_eq!(cells.len(), 4);
        assert_eq!(cells[0].ratio(), Some(1.2));
        assert_eq!(cells[1].ratio(), Some(0.8));
        assert_eq!(cells[1].vs_xor(), Some(0.4));
        assert_eq!(size_label(4096), "4KiB");
        assert_eq!(size_label(1 << 20), "1MiB");
        assert!((geomean([2.0, 8.0].into_iter()).unwrap() - 4.0).abs() < 1e-9);
        assert_eq!(geomean(std::iter::empty()), None);
    }

    #[test]
    fn writes_report_and_pngs() {
        let cells: Vec<EcCell> = crate::parse_json(FIXTURE).unwrap();
        let dir = TempDir::new("ec");
        let files = report(&cells, dir.path()).unwrap();
        assert_eq!(files, ["ec-encode.png", "ec-reconstruct.png", "REPORT.md"]);
        assert!(is_png(&dir.path().join("ec-encode.png")));
        let md = std::fs::read_to_string(dir.path().join("REPORT.md")).unwrap();
        assert!(md.contains("kernel (backend): avx2"), "{md}");
        assert!(md.contains("ISA-L: 2.31.1"), "{md}");
        assert!(md.contains("CPU: not recorded"), "{md}");
        assert!(
            md.contains("| encode | 8+3 | 4KiB | hot | 8.00 | 10.00 | 0.80x | 20.00 | 40.00 | 0.40x |"),
            "{md}"
        );
        assert!(md.contains("| encode | 3 |"), "{md}");
        assert!(md.contains("0.80x – 1.20x"), "{md}");
        assert!(md.contains("| reconstruct | 1 | 9.00 | 12.00 | 0.75x |"), "{md}");
    }

    #[test]
    fn works_without_isal() {
        let cells: Vec<EcCell> = crate::parse_json(NO_ISAL).unwrap();
        let dir = TempDir::new("ec-noisal");
        let files = report(&cells, dir.path()).unwrap();
        assert_eq!(files, ["ec-update.png", "REPORT.md"]);
        assert!(is_png(&dir.path().join("ec-update.png")));
        let md = std::fs::read_to_string(dir.path().join("REPORT.md")).unwrap();
        assert!(md.contains("not measured in this run"), "{md}");
        assert!(md.contains("| update | 4+2 | 64KiB | hot | 3.00 | - | - | 6.00 | 9.00 | - |"), "{md}");
    }

    #[test]
    fn empty_is_an_error() {
        let dir = TempDir::new("ec-empty");
        assert!(report(&[], dir.path()).is_err());
    }
}
