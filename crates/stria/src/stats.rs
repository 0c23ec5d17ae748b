//! `GET /api/v1/stats` and `stria iostat`: what each volume's clients see (counted by
//! `stria-front`'s registry: requests, bytes, errors and latency per operation) and what each
//! drive does, in one view.

use serde::{Deserialize, Serialize};
use stria_dev::histogram::{HISTOGRAM_BUCKETS, bucket_upper_ns};
use stria_front::VolumeStatsSnapshot;

/// `GET /api/v1/stats` and `stria iostat`: every export's counters, cumulative since start.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct StatsView {
    /// When the counters were read, Unix milliseconds.
    pub(crate) time_ms: u64,
    /// The exclusive upper bound of each latency bucket, nanoseconds (the last is unbounded).
    pub(crate) bucket_upper_ns: Vec<u64>,
    pub(crate) volumes: Vec<VolumeStatsSnapshot>,
    pub(crate) drives: Vec<DriveIo>,
}

/// One drive's I/O counters, cumulative since the pool was opened.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct DriveIo {
    pub(crate) id: u32,
    pub(crate) path: String,
    pub(crate) class: String,
    pub(crate) state: String,
    pub(crate) read_ops: u64,
    pub(crate) read_bytes: u64,
    pub(crate) write_ops: u64,
    pub(crate) write_bytes: u64,
    /// Latency of its reads and writes, and its queue (file drives time their requests).
    #[serde(default)]
    pub(crate) latency: stria_dev::DevLatency,
}

impl StatsView {
    /// `latency` gives each drive's latency by id.
    pub(crate) fn new(
        volumes: Vec<VolumeStatsSnapshot>,
        drives: Vec<stria_engine::DriveStatus>,
        latency: impl Fn(u32) -> stria_dev::DevLatency,
    ) -> StatsView {
        let drives = drives
            .into_iter()
            .map(|d| DriveIo {
                latency: latency(d.id),
                id: d.id,
                path: d.path,
                class: d.class,
                state: d.state,
                read_ops: d.read_ops,
                read_bytes: d.bytes_read,
                write_ops: d.write_ops,
                write_bytes: d.bytes_written,
            })
            .collect();
        let time_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        StatsView {
            time_ms,
            bucket_upper_ns: (0..HISTOGRAM_BUCKETS).map(bucket_upper_ns).collect(),
            volumes,
            drives,
        }
    }
}
