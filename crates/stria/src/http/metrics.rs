//! `GET /metrics`: the Prometheus text format (version 0.0.4), read from the pool's status, the
//! exports' request counters and the NBD server's gauges at scrape time: nothing is registered
//! or counted per request beyond the sharded counters themselves. Names and labels:
//! docs/design/observability.md, section 1b; `promtool check metrics` passes on a scrape (test).

use std::fmt::Write as _;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use stria_catalog::StatusView;
use stria_tier::log::LogStatus;

use super::AppState;
use crate::jobs::{JobState, JobView};
use crate::stats::DriveIo;
use stria_dev::HistogramSnapshot;
use stria_front::{Op, VolumeStatsSnapshot};

/// Latency bucket bounds exposed, as powers of two of nanoseconds: 2^13 ns (8.2 µs) to 2^34 ns
/// (17 s). Each is a bound of the fine histogram, so the cumulative counts are exact.
const LE_LOG2_NS: std::ops::RangeInclusive<u32> = 13..=34;

/// A metric read from a status: name, help and how to read it from one item.
type Field<T, V> = (&'static str, &'static str, fn(&T) -> V);

pub(crate) async fn scrape(State(state): State<AppState>) -> impl IntoResponse {
    let status = state.daemon.catalog.status();
    let stats = state.daemon.stats_of(status.pool.drives.clone());
    let exports = stats.volumes;
    let nbd = state.daemon.nbd.stats();
    let jobs = state.daemon.jobs.list();
    let mut out = Exposition::default();
    drives(&mut out, &status);
    pool(&mut out, &status);
    volumes(&mut out, &status, &jobs);
    requests(&mut out, &exports);
    drive_latency(&mut out, &stats.drives);
    tiers(&mut out, &status);
    out.family("stria_nbd_connections", "gauge", "NBD connections by phase.");
    out.sample("stria_nbd_connections", &[("phase", "handshake")], nbd.handshaking as f64);
    out.sample("stria_nbd_connections", &[("phase", "transmission")], nbd.transmitting as f64);
    out.family("stria_nbd_requests_in_flight", "gauge", "NBD requests received and not yet answered.");
    out.sample("stria_nbd_requests_in_flight", &[], exports.iter().map(|e| e.in_flight as f64).sum());
    out.family("stria_nbd_in_flight_bytes", "gauge", "Bytes the NBD server holds for requests in flight.");
    out.sample("stria_nbd_in_flight_bytes", &[], nbd.reserved_bytes as f64);
    out.family(
        "stria_nbd_shared_in_flight_bytes",
        "gauge",
        "Bytes NBD connections borrowed beyond their guarantee.",
    );
    out.sample("stria_nbd_shared_in_flight_bytes", &[], nbd.shared_bytes as f64);
    if let Some(target) = &state.daemon.iscsi {
        let c = &target.counters;
        let load = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed) as f64;
        out.family("stria_iscsi_connections", "gauge", "iSCSI connections by phase.");
        out.sample("stria_iscsi_connections", &[("phase", "login")], target.logins_in_progress() as f64);
        out.sample("stria_iscsi_connections", &[("phase", "full_feature")], load(&c.sessions));
        out.family(
            "stria_iscsi_refused_connections_total",
            "counter",
            "iSCSI connections refused at the limit.",
        );
        out.sample("stria_iscsi_refused_connections_total", &[], load(&c.refused_connections));
        out.family(
            "stria_iscsi_failed_logins_total",
            "counter",
            "iSCSI logins refused, failed or timed out.",
        );
        out.sample("stria_iscsi_failed_logins_total", &[], load(&c.failed_logins));
        out.family(
            "stria_iscsi_protocol_errors_total",
            "counter",
            "iSCSI connections closed for a protocol error.",
        );
        out.sample("stria_iscsi_protocol_errors_total", &[], load(&c.protocol_errors));
    }
    out.family("stria_nbd_refused_connections_total", "counter", "NBD connections refused at a limit.");
    out.sample("stria_nbd_refused_connections_total", &[], nbd.refused_connections as f64);
    out.family(
        "stria_nbd_evicted_handshakes_total",
        "counter",
        "NBD handshakes closed to make room for a new connection.",
    );
    out.sample("stria_nbd_evicted_handshakes_total", &[], nbd.evicted_handshakes as f64);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], out.text)
}

/// A Prometheus text exposition being written.
#[derive(Default)]
pub(crate) struct Exposition {
    pub(crate) text: String,
}

impl Exposition {
    pub(crate) fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.text, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    /// The samples of one histogram (its family written before).
    pub(crate) fn histogram(&mut self, name: &str, labels: &[(&str, &str)], h: &HistogramSnapshot) {
        let bucket = format!("{name}_bucket");
        for log2 in LE_LOG2_NS {
            let le = format!("{}", (1u64 << log2) as f64 / 1e9);
            self.sample(&bucket, &[labels, &[("le", le.as_str())]].concat(), h.count_below(1 << log2) as f64);
        }
        self.sample(&bucket, &[labels, &[("le", "+Inf")]].concat(), h.count as f64);
        self.sample(&format!("{name}_sum"), labels, h.sum_ns as f64 / 1e9);
        self.sample(&format!("{name}_count"), labels, h.count as f64);
    }

    pub(crate) fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.text.push_str(name);
        if !labels.is_empty() {
            self.text.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.text.push(',');
                }
                let _ = write!(self.text, "{k}=\"{}\"", escape(v));
            }
            self.text.push('}');
        }
        let _ = writeln!(self.text, " {value}");
    }
}

/// A label value with `\`, `"` and newlines escaped.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

fn drives(out: &mut Exposition, status: &StatusView) {
    let drives = &status.pool.drives;
    let counters: [Field<stria_engine::DriveStatus, u64>; 4] = [
        ("stria_drive_read_bytes_total", "Bytes read from the drive.", |d| d.bytes_read),
        ("stria_drive_written_bytes_total", "Bytes written to the drive.", |d| d.bytes_written),
        ("stria_drive_read_ops_total", "Read requests completed by the drive.", |d| d.read_ops),
        ("stria_drive_write_ops_total", "Write requests completed by the drive.", |d| d.write_ops),
    ];
    for (name, help, value) in counters {
        out.family(name, "counter", help);
        for d in drives {
            let id = d.id.to_string();
            out.sample(name, &[("drive", &id), ("class", &d.class), ("domain", &d.domain)], value(d) as f64);
        }
    }
    out.family(
        "stria_drive_errors_total",
        "counter",
        "Drive errors kept in the pool metadata (until `drive clear-errors`): failed reads, failed writes, blocks repaired from redundancy.",
    );
    for d in drives {
        let id = d.id.to_string();
        for (kind, n) in
            [("read", d.read_errors), ("write", d.write_errors), ("checksum_repair", d.checksum_repairs)]
        {
            out.sample("stria_drive_errors_total", &[("drive", &id), ("kind", kind)], n as f64);
        }
    }
    out.family("stria_drive_state", "gauge", "1 for the drive's current state.");
    for d in drives {
        let id = d.id.to_string();
        let now = if d.draining { "draining" } else { d.state.as_str() };
        for state in ["active", "draining", "failed", "missing", "spare"] {
            out.sample(
                "stria_drive_state",
                &[("drive", &id), ("state", state)],
                f64::from(u8::from(now == state)),
            );
        }
    }
    for (name, help, value) in [
        (
            "stria_drive_size_bytes",
            "Drive size.",
            (|d| d.size_bytes) as fn(&stria_engine::DriveStatus) -> u64,
        ),
        ("stria_drive_used_bytes", "Bytes of the drive given to volumes.", |d| d.used_bytes),
    ] {
        out.family(name, "gauge", help);
        for d in drives {
            out.sample(name, &[("drive", &d.id.to_string())], value(d) as f64);
        }
    }
}

fn pool(out: &mut Exposition, status: &StatusView) {
    let mut classes: Vec<(&str, u64, u64)> = Vec::new();
    for d in status.pool.drives.iter().filter(|d| d.state == "active") {
        match classes.iter_mut().find(|c| c.0 == d.class) {
            Some(c) => (c.1, c.2) = (c.1 + d.size_bytes, c.2 + d.used_bytes),
            None => classes.push((&d.class, d.size_bytes, d.used_bytes)),
        }
    }
    for (name, help, pick) in [
        ("stria_pool_capacity_bytes", "Bytes of the active drives of a class.", 0),
        ("stria_pool_allocated_bytes", "Bytes of them given to volumes.", 1),
        ("stria_pool_free_bytes", "Bytes of them free for new extents.", 2),
    ] {
        out.family(name, "gauge", help);
        for (class, size, used) in &classes {
            let v = [*size, *used, size.saturating_sub(*used)][pick];
            out.sample(name, &[("class", class)], v as f64);
        }
    }
    out.family("stria_pool_suspended", "gauge", "1 while writes are suspended (a full host filesystem).");
    out.sample("stria_pool_suspended", &[], f64::from(u8::from(status.pool.suspended.is_some())));
    let r = status.pool.rebalance.clone().unwrap_or_default();
    out.family("stria_rebalance_moves_total", "counter", "Extent moves finished since the pool was opened.");
    out.sample("stria_rebalance_moves_total", &[], r.moves_done as f64);
    let (done, total) = r.current.map_or((0, 0), |m| (m.rows_done, m.rows_total));
    out.family("stria_rebalance_rows_done", "gauge", "Rows copied of the extent moving now.");
    out.sample("stria_rebalance_rows_done", &[], done as f64);
    out.family("stria_rebalance_rows", "gauge", "Rows of the extent moving now.");
    out.sample("stria_rebalance_rows", &[], total as f64);
}

fn volumes(out: &mut Exposition, status: &StatusView, jobs: &[JobView]) {
    const STATES: [&str; 4] = ["healthy", "degraded", "rebuilding", "failed"];
    out.family(
        "stria_volume_state",
        "gauge",
        "1 for the volume's current state (parts of tiered volumes carry role=\"tier-part\").",
    );
    let state_name = |s: stria_engine::VolumeState| {
        serde_json::to_value(s).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default()
    };
    for v in &status.pool.volumes {
        let now = state_name(v.state);
        for s in STATES {
            let labels = [("volume", v.name.as_str()), ("role", v.role.as_str()), ("state", s)];
            out.sample("stria_volume_state", &labels, f64::from(u8::from(now == s)));
        }
    }
    for v in &status.log {
        let now = state_name(v.state);
        for s in STATES {
            let labels = [("volume", v.name.as_str()), ("role", "log"), ("state", s)];
            out.sample("stria_volume_state", &labels, f64::from(u8::from(now == s)));
        }
    }
    for (name, help, done) in [
        ("stria_volume_rebuild_rows_done", "Rows rebuilt of the volume's rebuild in progress.", true),
        ("stria_volume_rebuild_rows", "Rows of the volume's rebuild in progress.", false),
    ] {
        out.family(name, "gauge", help);
        for v in &status.pool.volumes {
            if let Some(r) = &v.rebuild {
                out.sample(
                    name,
                    &[("volume", &v.name)],
                    (if done { r.rows_done } else { r.rows_total }) as f64,
                );
            }
        }
    }
    let scrubs: Vec<(&str, u64, u64)> = jobs
        .iter()
        .filter(|j| j.state == JobState::Running && j.op == "scrub")
        .filter_map(|j| {
            let p = j.progress.as_ref()?;
            Some((j.request["name"].as_str().unwrap_or(""), p.done, p.total))
        })
        .collect();
    for (name, help, done) in [
        ("stria_scrub_rows_done", "Progress of the scrub running on the volume (its current part).", true),
        ("stria_scrub_rows", "Size of the scrub running on the volume (its current part).", false),
    ] {
        out.family(name, "gauge", help);
        for (volume, d, t) in &scrubs {
            out.sample(name, &[("volume", volume)], (if done { *d } else { *t }) as f64);
        }
    }
}

/// What clients (NBD and iSCSI) see, per volume and operation.
pub(super) fn requests(out: &mut Exposition, exports: &[VolumeStatsSnapshot]) {
    for (name, kind, help) in [
        ("stria_volume_ops_total", "counter", "Client requests completed, NBD and iSCSI (failed ones too)."),
        (
            "stria_volume_bytes_total",
            "counter",
            "Bytes of client requests (NBD and iSCSI) completed without error.",
        ),
        ("stria_volume_errors_total", "counter", "Client requests (NBD and iSCSI) answered with an error."),
    ] {
        out.family(name, kind, help);
        for e in exports {
            for op in Op::ALL {
                let s = e.op(op);
                let v = match name {
                    "stria_volume_ops_total" => s.count,
                    "stria_volume_bytes_total" => s.bytes,
                    _ => s.errors,
                };
                out.sample(name, &[("volume", &e.name), ("op", op.name())], v as f64);
            }
        }
    }
    out.family("stria_volume_requests_in_flight", "gauge", "NBD requests of the volume not yet answered.");
    for e in exports {
        out.sample("stria_volume_requests_in_flight", &[("volume", &e.name)], e.in_flight as f64);
    }
    let name = "stria_volume_op_latency_seconds";
    out.family(name, "histogram", "Time from receiving an NBD request to its answer being ready.");
    for e in exports {
        for op in Op::ALL {
            out.histogram(name, &[("volume", &e.name), ("op", op.name())], &e.op(op).latency);
        }
    }
}

/// Latency and queue of each drive (file drives time their requests).
fn drive_latency(out: &mut Exposition, drives: &[DriveIo]) {
    let name = "stria_drive_op_latency_seconds";
    out.family(name, "histogram", "Time from a drive request being made to its completion.");
    for d in drives {
        let id = d.id.to_string();
        out.histogram(name, &[("drive", &id), ("op", "read")], &d.latency.read);
        out.histogram(name, &[("drive", &id), ("op", "write")], &d.latency.write);
    }
    out.family("stria_drive_requests_in_flight", "gauge", "Drive requests made and not yet completed.");
    for d in drives {
        out.sample(
            "stria_drive_requests_in_flight",
            &[("drive", &d.id.to_string())],
            d.latency.in_flight as f64,
        );
    }
}

/// Tiered and log volumes: cache fill, destage, write amplification per tier.
fn tiers(out: &mut Exposition, status: &StatusView) {
    let gauges: [Field<LogStatus, f64>; 4] = [
        (
            "stria_tier_full",
            "1 while writes that need new space fail with ENOSPC (the space is full).",
            |t| f64::from(u8::from(t.full)),
        ),
        ("stria_tier_cache_fill_ratio", "Live blocks in the write cache over its size.", |t| {
            if t.cache_blocks == 0 { 0.0 } else { t.cache_live_blocks as f64 / t.cache_blocks as f64 }
        }),
        ("stria_tier_destage_backlog_bytes", "Live bytes in the write cache not yet destaged.", |t| {
            (t.cache_live_blocks * stria_dev::BLOCK_BYTES) as f64
        }),
        ("stria_tier_garbage_bytes", "Dead bytes in the segment space for GC to collect.", |t| {
            t.garbage_bytes as f64
        }),
    ];
    for (name, help, value) in gauges {
        out.family(name, "gauge", help);
        for t in &status.log {
            out.sample(name, &[("volume", &t.name)], value(t));
        }
    }
    let counters: [Field<LogStatus, u64>; 6] = [
        (
            "stria_tier_host_written_bytes_total",
            "Bytes written by clients since the volume was opened.",
            |t| t.host_write_bytes,
        ),
        ("stria_tier_destaged_bytes_total", "Bytes destaged from the cache to the capacity tier.", |t| {
            t.destaged_blocks * stria_dev::BLOCK_BYTES
        }),
        ("stria_tier_gc_moved_bytes_total", "Bytes GC moved to free segments.", |t| {
            t.gc_moved_blocks * stria_dev::BLOCK_BYTES
        }),
        (
            "stria_tier_map_log_writes_total",
            "Blocks written to the map's log (one FUA write of the fast drives each).",
            |t| t.map_log_blocks_written,
        ),
        ("stria_tier_map_deltas_total", "Changed map entries the map's log carried.", |t| {
            t.map_deltas_logged
        }),
        ("stria_tier_map_checkpoint_pages_total", "Map pages written by checkpoints.", |t| {
            t.map_pages_written
        }),
    ];
    for (name, help, value) in counters {
        out.family(name, "counter", help);
        for t in &status.log {
            out.sample(name, &[("volume", &t.name)], value(t) as f64);
        }
    }
    let name = "stria_tier_write_amplification";
    out.family(
        name,
        "gauge",
        "Bytes written to a tier's drives over bytes written by clients, since the volume was opened.",
    );
    for t in &status.log {
        for (tier, wa) in [("fast", t.write_amplification_fast), ("capacity", t.write_amplification_capacity)]
        {
            if let Some(wa) = wa {
                out.sample(name, &[("volume", &t.name), ("tier", tier)], wa);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        let mut out = Exposition::default();
        out.family("x_total", "counter", "X.");
        out.sample("x_total", &[("volume", "a\"b\\c\nd"), ("op", "read")], 3.0);
        out.sample("x_total", &[], 0.5);
        assert_eq!(
            out.text,
            "# HELP x_total X.\n# TYPE x_total counter\nx_total{volume=\"a\\\"b\\\\c\\nd\",op=\"read\"} 3\nx_total 0.5\n"
        );
    }
}
