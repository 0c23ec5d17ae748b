//! Human output: tables and progress bars (JSON output is the results as they are).

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};
use serde_json::Value;
use stria_engine::units::format_size;

use crate::ops::Progress;

/// Prints rows as an aligned table with a header.
pub(crate) fn table(header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let parts: Vec<String> = cells.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        outln!("{}", parts.join("  ").trim_end());
    };
    line(header.iter().map(|s| s.to_string()).collect());
    for row in rows {
        line(row.clone());
    }
}

fn s(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

fn size(v: &Value) -> String {
    v.as_u64().map(format_size).unwrap_or_else(|| "-".into())
}

/// `stria status`.
pub(crate) fn status(v: &Value) {
    outln!("pool {} ({}), metadata generation {}", s(&v["name"]), s(&v["uuid"]), s(&v["generation"]));
    outln!();
    drives(v);
    outln!();
    volumes(v);
    if let Some(ignored) = v["ignored_drives"].as_array().filter(|a| !a.is_empty()) {
        outln!();
        outln!("devices left out of the pool:");
        for d in ignored {
            outln!("  {}: {}", s(&d["path"]), s(&d["reason"]));
        }
    }
}

/// The drive table.
pub(crate) fn drives(v: &Value) {
    let rows: Vec<Vec<String>> = v["drives"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|d| {
                    vec![
                        s(&d["id"]),
                        s(&d["class"]),
                        if s(&d["domain"]).is_empty() { "-".into() } else { s(&d["domain"]) },
                        s(&d["state"]),
                        size(&d["size_bytes"]),
                        size(&d["used_bytes"]),
                        size(&d["bytes_read"]),
                        size(&d["bytes_written"]),
                        s(&d["read_errors"]),
                        s(&d["write_errors"]),
                        s(&d["checksum_repairs"]),
                        s(&d["path"]),
                    ]
                })
                .collect()
        })
        .unwrap_or_default();
    table(
        &[
            "ID",
            "CLASS",
            "DOMAIN",
            "STATE",
            "SIZE",
            "USED",
            "READ",
            "WRITTEN",
            "READ-ERR",
            "WRITE-ERR",
            "REPAIRS",
            "PATH",
        ],
        &rows,
    );
    error_times(v);
}

/// Under the drive table: when each non-zero error counter last counted, and how to reset them.
fn error_times(v: &Value) {
    let mut any = false;
    for d in v["drives"].as_array().into_iter().flatten() {
        let mut parts = Vec::new();
        for (count, last, what) in [
            ("read_errors", "last_read_error_unix_secs", "read error"),
            ("write_errors", "last_write_error_unix_secs", "write error"),
            ("checksum_repairs", "last_checksum_repair_unix_secs", "repair"),
        ] {
            if d[count].as_u64().unwrap_or(0) > 0
                && let Some(t) = d[last].as_u64()
            {
                parts.push(format!("last {what} {}", utc_time(t)));
            }
        }
        if !parts.is_empty() {
            outln!("drive {}: {}", s(&d["id"]), parts.join(", "));
            any = true;
        }
    }
    if any {
        outln!(
            "(error counters are kept across restarts until cleared: `stria drive clear-errors --all`, \
             or a drive id instead of --all)"
        );
    }
}

/// `YYYY-MM-DD HH:MM:SS UTC` of a unix time (proleptic Gregorian calendar).
fn utc_time(unix_secs: u64) -> String {
    let days = unix_secs / 86_400;
    let secs = unix_secs % 86_400;
    // Howard Hinnant's civil_from_days, on days since 0000-03-01.
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC", secs / 3600, secs % 3600 / 60, secs % 60)
}

/// `stria drive clear-errors`.
pub(crate) fn cleared_errors(v: &Value) {
    let slots: Vec<String> = v["cleared"].as_array().into_iter().flatten().map(s).collect();
    if v["all"].as_bool().unwrap_or(false) {
        outln!("error counters of every drive ({}) cleared", slots.join(", "));
    } else {
        outln!("error counters of drive {} cleared", slots.join(", "));
    }
}

/// A layout the pool's drives can hold, for the example in the hint of an empty volume list:
/// volumes go to capacity drives when there are any, else to fast ones.
fn example_layout(v: &Value) -> String {
    let active = |class: &str| {
        v["drives"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|d| d["class"] == class && d["state"] == "active")
            .count()
    };
    let n = match active("capacity") {
        0 => active("fast"),
        n => n,
    };
    match n {
        0 | 1 => "raid0".into(),
        2 => "raid1".into(),
        3..=5 => format!("ec:{}+1", n - 1),
        _ => "ec:4+2".into(),
    }
}

/// The volume table.
pub(crate) fn volumes(v: &Value) {
    let rows: Vec<Vec<String>> = v["volumes"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|vol| s(&vol["role"]) == "plain")
                .map(|vol| {
                    let rebuild = match &vol["rebuild"] {
                        Value::Object(r) => {
                            let done = r["rows_done"].as_u64().unwrap_or(0);
                            let total = r["rows_total"].as_u64().unwrap_or(1).max(1);
                            format!("{}%", done * 100 / total)
                        }
                        _ => "-".into(),
                    };
                    vec![
                        s(&vol["name"]),
                        s(&vol["layout"]),
                        size(&vol["size_bytes"]),
                        size(&vol["chunk_bytes"]),
                        s(&vol["class"]),
                        s(&vol["state"]),
                        rebuild,
                    ]
                })
                .collect()
        })
        .unwrap_or_default();
    let mut rows = rows;
    if let Some(tiered) = v["tiered"].as_array() {
        for t in tiered {
            rows.push(vec![
                s(&t["name"]),
                s(&t["layout"]),
                size(&t["size_bytes"]),
                size(&t["blockset_bytes"]),
                "fast+capacity".into(),
                s(&t["state"]),
                "-".into(),
            ]);
        }
    }
    if rows.is_empty() {
        outln!(
            "no volumes (create one with `stria volume create NAME --size SIZE --layout {}`)",
            example_layout(v)
        );
        return;
    }
    table(&["NAME", "LAYOUT", "SIZE", "CHUNK", "CLASS", "STATE", "REBUILD"], &rows);
}

/// `stria volume show` of a tiered volume.
fn tiered(t: &Value) {
    outln!("tiered volume {} ({}), {}", s(&t["name"]), s(&t["layout"]), s(&t["state"]));
    outln!("  {:<22} {}", "size", size(&t["size_bytes"]));
    outln!("  {:<22} {}", "blockset (full stripe)", size(&t["blockset_bytes"]));
    let cache_bytes = t["cache_blocks"].as_u64().map(|b| b * 4096);
    let used = t["log_used_blocks"].as_u64().unwrap_or(0) * 4096;
    outln!(
        "  {:<22} {} used of {}, {} dirty blocks in {} blocksets",
        "write cache",
        format_size(used),
        cache_bytes.map(format_size).unwrap_or_default(),
        s(&t["dirty_blocks"]),
        s(&t["dirty_blocksets"])
    );
    outln!("  {:<22} {} written, {} read", "host", size(&t["host_write_bytes"]), size(&t["host_read_bytes"]));
    outln!(
        "  {:<22} {} from cache, {} from capacity",
        "blocks read",
        s(&t["blocks_read_from_cache"]),
        s(&t["blocks_read_from_capacity"])
    );
    outln!(
        "  {:<22} {} blocksets ({} clean blocks read back to fill partial ones)",
        "destaged",
        s(&t["destaged_blocksets"]),
        s(&t["destage_fill_blocks"])
    );
    outln!("  {:<22} {}", "metadata page writes", s(&t["metadata_page_writes"]));
    let wa = |v: &Value| v.as_f64().map_or_else(|| "-".to_string(), |x| format!("{x:.2}"));
    outln!(
        "  {:<22} fast drives {}, capacity drives {} (drive bytes written per host byte)",
        "write amplification",
        wa(&t["write_amplification_fast"]),
        wa(&t["write_amplification_capacity"])
    );
    let rows: Vec<Vec<String>> = t["parts"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|p| {
                    vec![
                        s(&p["role"]),
                        s(&p["volume"]),
                        s(&p["layout"]),
                        size(&p["size_bytes"]),
                        s(&p["state"]),
                        size(&p["write_bytes"]),
                        size(&p["drive_bytes_written"]),
                        size(&p["drive_bytes_read"]),
                        format!("{}/{}", s(&p["full_stripe_writes"]), s(&p["partial_stripe_writes"])),
                    ]
                })
                .collect()
        })
        .unwrap_or_default();
    outln!();
    table(
        &[
            "PART",
            "VOLUME",
            "LAYOUT",
            "SIZE",
            "STATE",
            "WRITTEN",
            "DRIVE WRITES",
            "DRIVE READS",
            "FULL/PARTIAL",
        ],
        &rows,
    );
}

/// `stria volume show`.
pub(crate) fn volume(v: &Value) {
    if v["kind"] == "tiered" {
        tiered(v);
        return;
    }
    outln!("volume {}", s(&v["name"]));
    for (k, label) in [("layout", "layout"), ("class", "class"), ("state", "state")] {
        outln!("  {label:<14} {}", s(&v[k]));
    }
    outln!("  {:<14} {}", "size", size(&v["size_bytes"]));
    outln!("  {:<14} {}", "chunk", size(&v["chunk_bytes"]));
    outln!("  {:<14} {} ops, {}", "reads", s(&v["read_ops"]), size(&v["read_bytes"]));
    outln!("  {:<14} {} ops, {}", "writes", s(&v["write_ops"]), size(&v["write_bytes"]));
    outln!(
        "  {:<14} {} full-stripe, {} partial-stripe",
        "ec writes",
        s(&v["full_stripe_writes"]),
        s(&v["partial_stripe_writes"])
    );
    outln!("  {:<14} {} blocks", "repaired", s(&v["repaired_blocks"]));
    if let Some(segs) = v["segments"].as_array() {
        for (i, seg) in segs.iter().enumerate() {
            let members: Vec<String> = seg["members"]
                .as_array()
                .map(|m| {
                    m.iter()
                        .map(|m| match &m["rebuild_cursor_rows"] {
                            Value::Number(c) => format!(
                                "{}@{} (rebuilding {c}/{})",
                                s(&m["drive"]),
                                s(&m["start_block"]),
                                s(&seg["rows"])
                            ),
                            _ => format!("{}@{}", s(&m["drive"]), s(&m["start_block"])),
                        })
                        .collect()
                })
                .unwrap_or_default();
            outln!("  segment {i}: {} rows on drive@block {}", s(&seg["rows"]), members.join(", "));
        }
    }
}

/// A scrub report.
pub(crate) fn scrub(v: &Value) {
    outln!(
        "scrub of {}: {} rows, {} blocks checked, {} repaired, {} parity and {} copy blocks fixed, {} unrecoverable, \
         {} inconsistent (left as they are)",
        s(&v["volume"]),
        s(&v["rows"]),
        s(&v["blocks_checked"]),
        s(&v["blocks_repaired"]),
        s(&v["parity_blocks_fixed"]),
        s(&v["copy_blocks_fixed"]),
        s(&v["unrecoverable_blocks"]),
        s(&v["inconsistent_blocks"])
    );
}

/// A progress bar on a terminal; nothing otherwise.
pub(crate) struct Bar {
    bar: Option<ProgressBar>,
    what: String,
}

impl Bar {
    pub(crate) fn new() -> Bar {
        Bar { bar: None, what: String::new() }
    }

    pub(crate) fn update(&mut self, p: &Progress) {
        if !std::io::stderr().is_terminal() {
            return;
        }
        if self.bar.is_none() || self.what != p.what {
            if let Some(b) = self.bar.take() {
                b.finish();
            }
            let bar = ProgressBar::new(p.total);
            bar.set_style(
                ProgressStyle::with_template("{msg:20} [{bar:40}] {percent:>3}% {elapsed_precise} eta {eta}")
                    .expect("valid template")
                    .progress_chars("=> "),
            );
            bar.set_message(p.what.clone());
            self.what = p.what.clone();
            self.bar = Some(bar);
        }
        if let Some(b) = &self.bar {
            b.set_length(p.total);
            b.set_position(p.done);
        }
    }

    pub(crate) fn finish(self) {
        if let Some(b) = self.bar {
            b.finish();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unix_times_print_as_utc_dates() {
        assert_eq!(utc_time(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc_time(1_700_000_000), "2023-11-14 22:13:20 UTC");
        assert_eq!(utc_time(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc_time(4_102_444_799), "2099-12-31 23:59:59 UTC");
    }

    #[test]
    fn the_example_layout_fits_the_pool() {
        let pool = |classes: &[&str]| {
            let drives: Vec<Value> =
                classes.iter().map(|c| serde_json::json!({"class": c, "state": "active"})).collect();
            serde_json::json!({ "drives": drives })
        };
        assert_eq!(example_layout(&pool(&["fast", "fast"])), "raid1");
        assert_eq!(example_layout(&pool(&["fast", "fast", "capacity", "capacity", "capacity"])), "ec:2+1");
        assert_eq!(
            example_layout(&pool(&["fast"; 2].iter().chain(&["capacity"; 6]).copied().collect::<Vec<_>>())),
            "ec:4+2"
        );
    }
}
