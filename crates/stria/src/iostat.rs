//! `stria iostat [INTERVAL] [COUNT]`: what each volume's NBD clients and each drive got over the
//! last INTERVAL, as `zpool iostat -v` shows it: requests and MB per second, mean and p99
//! latency, requests in flight. Read from the daemon (`Request::Stats`) twice per report.

use std::time::Duration;

use anyhow::Result;
use stria_dev::HistogramSnapshot;

use stria_front::{OpSnapshot, VolumeStatsSnapshot};

use crate::stats::{DriveIo, StatsView};

/// The rates of one volume between two samples.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct VolumeRates {
    pub(crate) name: String,
    pub(crate) read_iops: f64,
    pub(crate) write_iops: f64,
    pub(crate) read_mb_per_s: f64,
    pub(crate) write_mb_per_s: f64,
    /// Mean and p99 latency of the reads and writes completed in between, microseconds.
    pub(crate) read_latency_us: (Option<f64>, Option<f64>),
    pub(crate) write_latency_us: (Option<f64>, Option<f64>),
    pub(crate) in_flight: u64,
}

fn latency_us(h: &HistogramSnapshot) -> (Option<f64>, Option<f64>) {
    if h.count == 0 {
        return (None, None);
    }
    let mean = h.sum_ns as f64 / h.count as f64 / 1e3;
    (Some(mean), h.quantile_ns(0.99).map(|ns| ns as f64 / 1e3))
}

fn per_second(now: u64, before: u64, secs: f64) -> f64 {
    now.saturating_sub(before) as f64 / secs
}

/// Rates of `now` against `before` (a volume new since then counts from zero).
pub(crate) fn volume_rates(
    now: &VolumeStatsSnapshot,
    before: Option<&VolumeStatsSnapshot>,
    secs: f64,
) -> VolumeRates {
    let empty = OpSnapshot::default();
    let (r0, w0) = before.map_or((&empty, &empty), |b| (&b.read, &b.write));
    VolumeRates {
        name: now.name.clone(),
        read_iops: per_second(now.read.count, r0.count, secs),
        write_iops: per_second(now.write.count, w0.count, secs),
        read_mb_per_s: per_second(now.read.bytes, r0.bytes, secs) / 1e6,
        write_mb_per_s: per_second(now.write.bytes, w0.bytes, secs) / 1e6,
        read_latency_us: latency_us(&now.read.latency.since(&r0.latency)),
        write_latency_us: latency_us(&now.write.latency.since(&w0.latency)),
        in_flight: now.in_flight,
    }
}

fn cell(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| if v >= 100.0 { format!("{v:.0}") } else { format!("{v:.1}") })
}

/// The columns after the name, in order.
const COLUMNS: [&str; 9] =
    ["read/s", "write/s", "rMB/s", "wMB/s", "r_avg_us", "r_p99_us", "w_avg_us", "w_p99_us", "queue"];

/// One line: `name` in a column of `width`, then the cells right-aligned under [`COLUMNS`].
fn line(out: &mut String, width: usize, name: &str, cells: &[String], tail: &str) {
    use std::fmt::Write as _;
    let _ = write!(out, "{name:<width$}");
    for (cell, title) in cells.iter().zip(COLUMNS) {
        let _ = write!(out, " {cell:>w$}", w = title.len().max(6) + 1);
    }
    let _ = writeln!(out, "{tail}");
}

/// The cells of one row: rates, latencies (mean, p99 of reads, then of writes) and the queue.
fn cells(
    ops: [f64; 2],
    mb: [f64; 2],
    read: (Option<f64>, Option<f64>),
    write: (Option<f64>, Option<f64>),
    queue: u64,
) -> Vec<String> {
    vec![
        format!("{:.0}", ops[0]),
        format!("{:.0}", ops[1]),
        format!("{:.1}", mb[0]),
        format!("{:.1}", mb[1]),
        cell(read.0),
        cell(read.1),
        cell(write.0),
        cell(write.1),
        queue.to_string(),
    ]
}

/// One report: the volumes, then the drives, over `secs` seconds.
pub(crate) fn report(now: &StatsView, before: &StatsView, secs: f64) -> String {
    let mut out = String::new();
    let titles: Vec<String> = COLUMNS.iter().map(|c| (*c).to_string()).collect();
    line(&mut out, 18, "volume", &titles, "");
    for v in &now.volumes {
        let r = volume_rates(v, before.volumes.iter().find(|b| b.name == v.name), secs);
        let row = cells(
            [r.read_iops, r.write_iops],
            [r.read_mb_per_s, r.write_mb_per_s],
            r.read_latency_us,
            r.write_latency_us,
            r.in_flight,
        );
        line(&mut out, 18, &r.name, &row, "");
    }
    line(&mut out, 18, "  drive", &titles, "  class, state");
    let zero = DriveIo::default();
    for d in &now.drives {
        let b = before.drives.iter().find(|b| b.id == d.id).unwrap_or(&zero);
        let row = cells(
            [per_second(d.read_ops, b.read_ops, secs), per_second(d.write_ops, b.write_ops, secs)],
            [
                per_second(d.read_bytes, b.read_bytes, secs) / 1e6,
                per_second(d.write_bytes, b.write_bytes, secs) / 1e6,
            ],
            latency_us(&d.latency.read.since(&b.latency.read)),
            latency_us(&d.latency.write.since(&b.latency.write)),
            d.latency.in_flight,
        );
        let name = format!("  {} {}", d.id, d.path.rsplit('/').next().unwrap_or(""));
        line(&mut out, 18, &name, &row, &format!("  {}, {}", d.class, d.state));
    }
    out
}

/// Prints `count` reports (for ever without one), `interval` apart. `sample` asks the daemon.
pub(crate) async fn run<F, Fut>(interval: Duration, count: Option<u64>, mut sample: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<StatsView>>,
{
    let mut before = sample().await?;
    let mut printed = 0;
    // A closed stdout (`stria iostat | head`) ends it: nobody reads the reports any more.
    while count.is_none_or(|c| printed < c) && !crate::stdio::stdout_gone() {
        tokio::time::sleep(interval).await;
        let now = sample().await?;
        let secs = (now.time_ms.saturating_sub(before.time_ms) as f64 / 1e3).max(1e-3);
        outln!("{}", report(&now, &before, secs));
        before = now;
        printed += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use stria_front::{Op, VolumeStats};

    #[tokio::test]
    async fn rates_come_from_the_difference_of_two_samples() {
        let stats = VolumeStats::default();
        for _ in 0..10 {
            stats.count(Op::Write, 4096, async { Ok::<_, ()>(()) }).await.expect("ok");
        }
        let before = stats.snapshot("v");
        for _ in 0..20 {
            stats.count(Op::Write, 1 << 20, async { Ok::<_, ()>(()) }).await.expect("ok");
        }
        stats.count(Op::Read, 4096, async { Ok::<_, ()>(()) }).await.expect("ok");
        let now = stats.snapshot("v");
        let r = volume_rates(&now, Some(&before), 2.0);
        assert_eq!((r.write_iops, r.read_iops), (10.0, 0.5));
        assert!((r.write_mb_per_s - 20.0 * 1048576.0 / 2.0 / 1e6).abs() < 1e-9);
        assert!(r.write_latency_us.0.is_some() && r.write_latency_us.1.is_some());
        let idle = volume_rates(&now, Some(&now), 1.0);
        assert_eq!((idle.write_iops, idle.write_latency_us), (0.0, (None, None)));
        let text = report(
            &StatsView { volumes: vec![now], ..StatsView::default() },
            &StatsView { volumes: vec![before], ..StatsView::default() },
            2.0,
        );
        assert!(text.lines().nth(1).is_some_and(|l| l.starts_with("v ") && l.contains(" 10 ")), "{text}");
    }
}
