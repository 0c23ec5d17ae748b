//! Human output of the typed views: tables and progress bars (JSON output is the views as they
//! serialize).

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};
use serde_json::Value;
use stria_catalog::{StatusView, VolumeView};
use stria_engine::units::format_size;
use stria_engine::{DriveStatus, ScrubReport, VolumeState};
use stria_tier::PartStatus;

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

fn size(bytes: u64) -> String {
    format_size(bytes)
}

/// The name a volume state has in JSON (`healthy`, ...).
fn state(state: VolumeState) -> String {
    match serde_json::to_value(state) {
        Ok(Value::String(name)) => name,
        _ => format!("{state:?}"),
    }
}

/// The rebalance line of `stria status`.
pub(crate) fn rebalance(r: &stria_engine::RebalanceStatus) {
    let mut what = Vec::new();
    if let Some(m) = &r.current {
        what.push(format!(
            "moving {} segment {} member {} from drive {} to drive {}: {}/{} rows",
            m.volume, m.segment, m.member, m.from_drive, m.to_drive, m.rows_done, m.rows_total
        ));
    }
    if !r.draining.is_empty() {
        let ids: Vec<String> = r.draining.iter().map(u32::to_string).collect();
        what.push(format!("draining drive(s) {} (removed once empty)", ids.join(", ")));
    }
    if r.requested {
        let rate = if r.rate_bytes_per_sec == 0 {
            "no limit".into()
        } else {
            format!("{}/s", size(r.rate_bytes_per_sec))
        };
        what.push(format!("rebalance asked for ({rate})"));
    }
    outln!("rebalance: {}; {} move(s) done since the pool opened", what.join("; "), r.moves_done);
}

/// `stria status`.
pub(crate) fn status(v: &StatusView) {
    let pool = &v.pool;
    outln!("pool {} ({}), metadata generation {}", pool.name, pool.uuid, pool.generation);
    if let Some(why) = &pool.suspended {
        outln!("writes SUSPENDED: {why}; reads go on. Free space there, then run `stria pool clear`");
    }
    outln!();
    drives(&pool.drives);
    if let Some(r) = &pool.rebalance {
        rebalance(r);
    }
    outln!();
    volumes(v);
    if let Some(t) = &v.thin {
        outln!();
        outln!(
            "thin space of {} tiered/log volume(s), {} logical: {} of segment space (may grow to {}), {} allocated, {} \
             free ({} reserved for GC), {} garbage",
            t.volumes,
            size(t.logical_bytes),
            size(t.space_bytes),
            size(t.space_max_bytes),
            size(t.allocated_bytes),
            size(t.free_bytes),
            size(t.reserved_bytes),
            size(t.garbage_bytes)
        );
        if !t.overcommitted.is_empty() {
            outln!(
                "over-committed (larger than their segment space may grow; writes get ENOSPC when it is full, TRIM frees \
                 space): {}",
                t.overcommitted.join(", ")
            );
        }
    }
    for u in &v.unavailable {
        outln!();
        outln!("volume {} is unavailable: {}", u.name, u.reason);
    }
    if !pool.ignored_drives.is_empty() {
        outln!();
        outln!("devices left out of the pool:");
        for d in &pool.ignored_drives {
            outln!("  {}: {}", d.path, d.reason);
        }
    }
}

/// The drive table.
pub(crate) fn drives(drives: &[DriveStatus]) {
    let rows: Vec<Vec<String>> = drives
        .iter()
        .map(|d| {
            vec![
                d.id.to_string(),
                d.class.clone(),
                if d.domain.is_empty() { "-".into() } else { d.domain.clone() },
                if d.draining && d.state == "active" { "draining".into() } else { d.state.clone() },
                size(d.size_bytes),
                size(d.used_bytes),
                size(d.bytes_read),
                size(d.bytes_written),
                d.read_errors.to_string(),
                d.write_errors.to_string(),
                d.checksum_repairs.to_string(),
                d.path.clone(),
            ]
        })
        .collect();
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
    error_times(drives);
}

/// Under the drive table: when each non-zero error counter last counted, and how to reset them.
fn error_times(drives: &[DriveStatus]) {
    let mut any = false;
    for d in drives {
        let mut parts = Vec::new();
        for (count, last, what) in [
            (d.read_errors, d.last_read_error_unix_secs, "read error"),
            (d.write_errors, d.last_write_error_unix_secs, "write error"),
            (d.checksum_repairs, d.last_checksum_repair_unix_secs, "repair"),
        ] {
            if count > 0
                && let Some(t) = last
            {
                parts.push(format!("last {what} {}", utc_time(t)));
            }
        }
        if !parts.is_empty() {
            outln!("drive {}: {}", d.id, parts.join(", "));
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
fn example_layout(drives: &[DriveStatus]) -> String {
    let active = |class: &str| drives.iter().filter(|d| d.class == class && d.state == "active").count();
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

/// The volume table: the volumes clients see ([`StatusView::volume_list`], as `--json` gives
/// them).
pub(crate) fn volumes(v: &StatusView) {
    let dash = || "-".to_string();
    let rows: Vec<Vec<String>> = v
        .volume_list()
        .into_iter()
        .map(|e| {
            let rebuild = match &e.rebuild {
                Some(r) => format!("{}%", r.rows_done * 100 / r.rows_total.max(1)),
                None => dash(),
            };
            let layout = match &e.origin {
                Some(origin) => format!("clone of {origin}"),
                None => e.layout.unwrap_or_else(dash),
            };
            vec![
                e.name,
                layout,
                e.size_bytes.map_or_else(dash, size),
                e.chunk_bytes.map_or_else(dash, size),
                e.class.unwrap_or_else(dash),
                e.state,
                rebuild,
            ]
        })
        .collect();
    if rows.is_empty() {
        outln!(
            "no volumes (create one with `stria volume create NAME --size SIZE --layout {}`)",
            example_layout(&v.pool.drives)
        );
        return;
    }
    table(&["NAME", "LAYOUT", "SIZE", "CHUNK", "CLASS", "STATE", "REBUILD"], &rows);
}

/// The state of a log-structured volume: its redundancy, and `full` while writes that need new
/// space fail.
fn log_state(l: &stria_tier::log::LogStatus) -> String {
    if l.full { format!("{}, full", state(l.state)) } else { state(l.state) }
}

/// The parts of a log-structured volume: what was written to each, what its writes put on its
/// drives (TO DRIVES, the write amplification's measure), and its drives' own counters, which
/// count every volume on those drives.
fn parts_table(parts: &[PartStatus]) {
    let rows: Vec<Vec<String>> = parts
        .iter()
        .map(|p| {
            vec![
                p.role.clone(),
                p.volume.clone(),
                p.layout.clone(),
                size(p.size_bytes),
                state(p.state),
                size(p.write_bytes),
                size(p.member_write_bytes),
                size(p.drive_bytes_written),
                size(p.drive_bytes_read),
                format!("{}/{}", p.full_stripe_writes, p.partial_stripe_writes),
            ]
        })
        .collect();
    outln!();
    table(
        &[
            "PART",
            "VOLUME",
            "LAYOUT",
            "SIZE",
            "STATE",
            "WRITTEN",
            "TO DRIVES",
            "DRIVES' WRITES",
            "DRIVES' READS",
            "FULL/PARTIAL",
        ],
        &rows,
    );
}

/// `stria volume show` of a log-structured volume.
fn log_volume(view: &stria_catalog::LogView) {
    let l = &view.status;
    let kind = if l.layout.starts_with("tiered:") { "tiered" } else { "log-structured" };
    outln!("{kind} volume {} ({}), {}", l.name, l.layout, log_state(l));
    outln!("  {:<22} {} (thin: {} allocated)", "size", size(l.size_bytes), size(l.allocated_bytes));
    outln!(
        "  {:<22} {} in {} segments of {} (at most {}): {} free ({} segments), {} garbage, {} reserved for GC",
        "segment space",
        size(l.space_bytes),
        l.segments,
        size(l.segment_bytes),
        size(l.space_max_bytes),
        size(l.free_bytes),
        l.free_segments,
        size(l.garbage_bytes),
        size(l.reserved_bytes)
    );
    if l.size_bytes > l.space_max_bytes {
        outln!(
            "  {:<22} the size exceeds what the segment space may grow to: writes get ENOSPC when it is full; TRIM \
             frees space",
            "OVER-COMMITTED"
        );
    }
    if let Some(why) = &l.no_space {
        outln!("  {:<22} {why}", "FULL");
    }
    let mode = match l.cache_mode {
        stria_tier::log::CacheMode::WriteThrough => "write-through",
        stria_tier::log::CacheMode::WriteBack => {
            "write-back: writes without FUA are durable at the next flush"
        }
    };
    let grows = match (&l.cache_growth_error, l.cache_max_blocks > l.cache_blocks) {
        (_, false) => String::new(),
        (None, true) => format!(", growing to {} as writes fill it", format_size(l.cache_max_blocks * 4096)),
        (Some(why), true) => format!(
            ", to grow to {} as writes fill it but its last growth failed (tried again every 5 s): {why}",
            format_size(l.cache_max_blocks * 4096)
        ),
    };
    outln!(
        "  {:<22} {} blocks cached of {}{grows} ({mode})",
        "write cache",
        l.cache_live_blocks,
        l.cache_blocks
    );
    outln!("  {:<22} {} written, {} read", "host", size(l.host_write_bytes), size(l.host_read_bytes));
    outln!(
        "  {:<22} {} from cache, {} from segments",
        "blocks read",
        l.blocks_read_from_cache,
        l.blocks_read_from_segments
    );
    outln!(
        "  {:<22} {} blocks in {} batches ({} padding slots)",
        "destaged",
        l.destaged_blocks,
        l.destage_batches,
        l.padded_slots
    );
    outln!(
        "  {:<22} {} blocks moved from {} victims in {} batches ({} moves lost to newer writes), policy {}",
        "garbage collection",
        l.gc_moved_blocks,
        l.gc_victims,
        l.gc_batches,
        l.moves_lost,
        l.gc
    );
    outln!(
        "  {:<22} {} log blocks carrying {} changes; {} checkpoints wrote {} pages",
        "map",
        l.map_log_blocks_written,
        l.map_deltas_logged,
        l.map_checkpoints,
        l.map_pages_written
    );
    let wa = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |x| format!("{x:.2}"));
    outln!(
        "  {:<22} fast drives {}, capacity drives {} (drive bytes written per host byte)",
        "write amplification",
        wa(l.write_amplification_fast),
        wa(l.write_amplification_capacity)
    );
    for s in &view.snapshots {
        outln!(
            "  {:<22} {} (export {}, read-only): {} only in it",
            "snapshot",
            s.name,
            s.export,
            s.exclusive_bytes.map_or_else(|| "-".into(), format_size)
        );
    }
    if l.deletes_in_progress > 0 {
        outln!(
            "  {:<22} {} (their map pages are being handed on and their blocks freed in the background)",
            "snapshot deletes",
            l.deletes_in_progress
        );
    }
    for c in &view.clones {
        outln!("  {:<22} {} of {}@{}", "clone", c.name, c.origin, c.snapshot);
    }
    qos(22, view.qos.as_ref());
    parts_table(&l.parts);
}

/// The QoS lines of `volume show` (labels `width` wide).
fn qos(width: usize, q: Option<&stria_catalog::QosView>) {
    let Some(q) = q else { return };
    let s = &q.settings;
    let rate = |v: Option<u64>, bytes: bool| match v {
        None => "-".to_string(),
        Some(v) if bytes => format!("{}/s", format_size(v)),
        Some(v) => v.to_string(),
    };
    outln!(
        "  {:<width$} reserve {} IOPS, {}; limit {} IOPS, {}; weight {}",
        "qos",
        rate(s.iops_reserve, false),
        rate(s.bw_reserve, true),
        rate(s.iops_limit, false),
        rate(s.bw_limit, true),
        s.weight.unwrap_or(stria_engine::QosSpec::DEFAULT_WEIGHT)
    );
    outln!(
        "  {:<width$} {} IOPS, {}/s over the last 5 s; {} requests scheduled, {} within the reservation",
        "qos got",
        q.iops,
        format_size(q.bytes_per_sec),
        q.ops,
        q.reserved_ops
    );
}

/// `stria pool calibrate`.
pub(crate) fn calibration(c: &stria_engine::Calibration) {
    let rows: Vec<Vec<String>> = c
        .classes
        .iter()
        .map(|k| {
            vec![
                k.class.to_string(),
                k.drives.to_string(),
                k.read_iops.to_string(),
                k.write_iops.to_string(),
                format!("{}/s", format_size(k.read_bytes_per_sec)),
                format!("{}/s", format_size(k.write_bytes_per_sec)),
                format!("{} us", k.read_latency_us),
            ]
        })
        .collect();
    table(
        &["CLASS", "DRIVES", "4K READ IOPS", "4K WRITE IOPS", "1M READ", "1M WRITE", "QD32 READ LATENCY"],
        &rows,
    );
    outln!("QoS costs and reservations are counted against these figures (at most 80 % may be reserved).");
}

/// `stria volume show`.
pub(crate) fn volume(v: &VolumeView) {
    let p = match v {
        VolumeView::Log(l) => return log_volume(l),
        VolumeView::Clone(c) => return clone_volume(c),
        VolumeView::Plain(p) => p,
    };
    let st = &p.status;
    outln!("volume {}", st.name);
    for (label, value) in
        [("layout", st.layout.clone()), ("class", st.class.clone()), ("state", state(st.state))]
    {
        outln!("  {label:<14} {value}");
    }
    outln!("  {:<14} {}", "size", size(st.size_bytes));
    outln!("  {:<14} {}", "chunk", size(st.chunk_bytes));
    outln!("  {:<14} {} ops, {}", "reads", st.read_ops, size(st.read_bytes));
    outln!("  {:<14} {} ops, {}", "writes", st.write_ops, size(st.write_bytes));
    outln!(
        "  {:<14} {} full-stripe, {} partial-stripe",
        "ec writes",
        st.full_stripe_writes,
        st.partial_stripe_writes
    );
    outln!("  {:<14} {} blocks", "repaired", st.repaired_blocks);
    for (i, seg) in p.segments.iter().enumerate() {
        let members: Vec<String> = seg
            .members
            .iter()
            .map(|m| match m.rebuild_cursor_rows {
                Some(c) => format!("{}@{} (rebuilding {c}/{})", m.drive, m.start_block, seg.rows),
                None => format!("{}@{}", m.drive, m.start_block),
            })
            .collect();
        outln!("  segment {i}: {} rows on drive@block {}", seg.rows, members.join(", "));
    }
    qos(14, p.qos.as_ref());
}

/// `stria volume show` of a clone, and `volume clone`.
pub(crate) fn clone_volume(c: &stria_catalog::CloneView) {
    outln!("volume {} (clone)", c.name);
    outln!("  {:<14} {}@{}", "made from", c.of_clone.as_deref().unwrap_or(&c.origin), c.snapshot);
    if !c.snapshots.is_empty() {
        outln!("  {:<14} {}", "snapshots", c.snapshots.join(", "));
    }
    outln!("  {:<14} {}", "size", size(c.size_bytes));
    outln!("  {:<14} {} (its layer in {}'s map)", "layer", c.id, c.origin);
    outln!(
        "  {:<14} {}'s cache and segment space (see `stria volume show {}`)",
        "data in",
        c.origin,
        c.origin
    );
    qos(14, c.qos.as_ref());
}

/// `snapshot list`.
pub(crate) fn snapshots(list: &[stria_catalog::SnapshotView]) {
    if list.is_empty() {
        outln!("no snapshots");
        return;
    }
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|s| {
            vec![
                s.volume.clone(),
                s.name.clone(),
                s.export.clone(),
                format_size(s.size_bytes),
                s.referenced_bytes.map_or_else(|| "-".into(), format_size),
                s.shared_bytes.map_or_else(|| "-".into(), format_size),
                s.exclusive_bytes.map_or_else(|| "-".into(), format_size),
                s.id.to_string(),
            ]
        })
        .collect();
    table(
        &[
            "VOLUME",
            "SNAPSHOT",
            "EXPORT (read-only)",
            "SIZE",
            "DATA",
            "SHARED",
            "ONLY IN IT (freed by delete)",
            "LAYER",
        ],
        &rows,
    );
}

/// A scrub report.
pub(crate) fn scrub(r: &ScrubReport) {
    outln!(
        "scrub of {}: {} rows, {} blocks checked, {} repaired, {} parity and {} copy blocks fixed, {} unrecoverable, \
         {} inconsistent (left as they are)",
        r.volume,
        r.rows,
        r.blocks_checked,
        r.blocks_repaired,
        r.parity_blocks_fixed,
        r.copy_blocks_fixed,
        r.unrecoverable_blocks,
        r.inconsistent_blocks
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
        // Active drives of the given classes (the other fields do not matter here).
        let pool = |classes: &[&str]| -> Vec<DriveStatus> {
            classes
                .iter()
                .map(|c| {
                    serde_json::from_value(serde_json::json!({"class": c, "state": "active",
                        "id": 0, "uuid": "", "path": "", "domain": "", "failed_reason": null,
                        "size_bytes": 0, "used_bytes": 0, "read_ops": 0, "bytes_read": 0, "write_ops": 0,
                        "bytes_written": 0, "read_errors": 0, "last_read_error_unix_secs": null,
                        "write_errors": 0, "last_write_error_unix_secs": null, "checksum_repairs": 0,
                        "last_checksum_repair_unix_secs": null, "dirty_regions": 0, "journal_used_bytes": 0,
                        "write_size_hist": vec![0u64; stria_dev::counters::WRITE_SIZE_BUCKETS]}))
                    .expect("a drive status")
                })
                .collect()
        };
        assert_eq!(example_layout(&pool(&["fast", "fast"])), "raid1");
        assert_eq!(example_layout(&pool(&["fast", "fast", "capacity", "capacity", "capacity"])), "ec:2+1");
        assert_eq!(
            example_layout(&pool(&["fast"; 2].iter().chain(&["capacity"; 6]).copied().collect::<Vec<_>>())),
            "ec:4+2"
        );
    }
}
