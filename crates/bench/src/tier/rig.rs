//! The `tiered:ec:K+M` (log-structured) volume under test: a pool of 2 fast + 6 capacity drives (memory-backed files or
//! memory drives), each drive wrapped in a [`Tap`] that splits its writes by region of the stria
//! drive layout, so the capacity tier's data writes can be told from the engine's own
//! (checksum pages, intent bitmap, journal, pool metadata).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use stria_dev::counters::WRITE_SIZE_BUCKETS;
use stria_dev::{BlockDevice, DevCountersSnapshot};
use stria_engine::{DriveClass, NewDrive, Pool};
use stria_tier::log::{LogParams, LogSpec, LogStatus, LogVolume};
use stria_tier::map::MapStats;

pub(super) use crate::regions::{REGIONS, Region, RegionCounters, Tap};

/// Fast drives (write cache and map) and capacity drives (the `ec:K+M` segment space).
pub(super) const FAST_DRIVES: usize = 2;
/// Drive space beyond what the parts need: superblocks, pool metadata, intent bitmap, journal,
/// checksum table, allocator slack.
const DRIVE_SLACK_BYTES: u64 = 160 << 20;

/// A fresh directory for drive files, removed with everything in it when dropped (also when the
/// benchmark fails; a panic aborts the release build, and then the directory stays).
#[derive(Debug)]
pub(super) struct TempDir(PathBuf);

impl TempDir {
    pub(super) fn new(parent: &Path) -> Result<TempDir> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let path = parent.join(format!("stria-bench-tier.{}.{nanos:09}", std::process::id()));
        std::fs::create_dir(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(TempDir(path))
    }

    pub(super) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.0) {
            eprintln!("warning: could not remove {}: {e}", self.0.display());
        }
    }
}

/// What the volume is made of.
#[derive(Clone, Copy, Debug)]
pub(super) struct Shape {
    pub(super) volume_bytes: u64,
    pub(super) cache_bytes: u64,
    pub(super) chunk_bytes: u64,
    pub(super) data_shards: u32,
    pub(super) parity_shards: u32,
}

/// Counters at one moment: the volume's status and map counters, and the taps of the drives.
#[derive(Debug, Clone)]
pub(super) struct Snapshot {
    pub(super) status: LogStatus,
    pub(super) map: MapStats,
    pub(super) host_write_ops: u64,
    pub(super) host_read_ops: u64,
    /// Capacity drives, summed, by region.
    pub(super) cap_regions: [DevCountersSnapshot; REGIONS],
    /// Fast drives, summed, by region.
    pub(super) fast_regions: [DevCountersSnapshot; REGIONS],
}

/// The pool and the volume, with the taps of their drives.
pub(super) struct Rig<D: BlockDevice> {
    pub(super) pool: Arc<Pool<Tap<D>>>,
    pub(super) vol: Arc<LogVolume<Tap<D>>>,
    /// Per drive: whether it is a capacity drive, and its tap.
    taps: Vec<(bool, Arc<RegionCounters>)>,
    /// The daemon's housekeeping (`Pool::tick` every 2 s: clears idle intent bits), so intent
    /// bitmap writes are counted as a served volume would do them.
    housekeeping: tokio::task::JoinHandle<()>,
}

impl Shape {
    /// The volume's spec.
    pub(super) fn spec(&self) -> LogSpec {
        LogSpec {
            chunk_bytes: self.chunk_bytes,
            cache_bytes: Some(self.cache_bytes),
            fast_tier: true,
            ..LogSpec::new("bench", self.volume_bytes, self.data_shards, self.parity_shards)
        }
    }

    /// Bytes of the volume's metadata part (one copy), as `create` will size it.
    pub(super) fn meta_bytes(&self) -> Result<u64> {
        Ok(stria_tier::log::plan(&self.spec()).context("sizing the volume")?.meta_bytes)
    }
}

/// Sizes of the fast and the capacity drives for `shape` (the segment space is 1.5 x the
/// volume, the default).
fn drive_sizes(shape: &Shape) -> Result<(u64, u64)> {
    let fast = shape.cache_bytes + shape.meta_bytes()? + DRIVE_SLACK_BYTES;
    let member = shape.volume_bytes * 3 / 2 / u64::from(shape.data_shards) + (64 << 20);
    let cap = member + DRIVE_SLACK_BYTES;
    let mib = 1 << 20;
    Ok((fast.next_multiple_of(mib), cap.next_multiple_of(mib)))
}

impl<D: BlockDevice> Rig<D> {
    /// Makes the drives with `make(name, size)` (slots 0-1 fast, the rest capacity), the pool, and
    /// the `tiered:ec:K+M` volume, with destage set to run whenever a batch is cached.
    pub(super) async fn build(shape: &Shape, make: impl Fn(&str, u64) -> Result<D>) -> Result<Rig<D>> {
        let (fast_bytes, cap_bytes) = drive_sizes(shape)?;
        let capacity = (shape.data_shards + shape.parity_shards) as usize;
        let mut drives = Vec::new();
        let mut taps = Vec::new();
        for i in 0..FAST_DRIVES + capacity {
            let is_cap = i >= FAST_DRIVES;
            let name = if is_cap { format!("capacity-{}", i - FAST_DRIVES) } else { format!("fast-{i}") };
            let tap = Tap::new(make(&name, if is_cap { cap_bytes } else { fast_bytes })?)?;
            taps.push((is_cap, Arc::clone(tap.regions())));
            drives.push(NewDrive {
                dev: tap,
                path: name,
                class: if is_cap { DriveClass::Capacity } else { DriveClass::Fast },
                domain: String::new(),
                fresh: true,
            });
        }
        let pool = Arc::new(Pool::create("bench-tier", drives).await.context("creating the pool")?);
        let vol = stria_tier::log::create(&pool, shape.spec()).await.context("creating the tiered volume")?;
        // The seed's proof of concept: "the destage code is tweaked to run all the time".
        vol.set_params(LogParams { always: true, ..vol.params() });
        let housekeeping = {
            let pool = Arc::clone(&pool);
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_secs(2));
                loop {
                    tick.tick().await;
                    if let Err(e) = pool.tick().await {
                        eprintln!("warning: pool housekeeping failed: {e}");
                    }
                }
            })
        };
        Ok(Rig { pool, vol, taps, housekeeping })
    }

    pub(super) async fn snapshot(&self) -> Snapshot {
        let sum = |cap: bool| {
            let mut out: [DevCountersSnapshot; REGIONS] = Default::default();
            for (_, t) in self.taps.iter().filter(|(c, _)| *c == cap) {
                for (o, s) in out.iter_mut().zip(t.snapshot()) {
                    o.add(&s);
                }
            }
            out
        };
        let c = self.vol.counters();
        Snapshot {
            status: self.vol.status(),
            map: self.vol.map_stats(),
            host_write_ops: c.host_write_ops.load(std::sync::atomic::Ordering::Relaxed),
            host_read_ops: c.host_read_ops.load(std::sync::atomic::Ordering::Relaxed),
            cap_regions: sum(true),
            fast_regions: sum(false),
        }
    }

    /// Waits until destage has moved every cached block (those a full batch can take) to the
    /// segment space; returns how long that took.
    pub(super) async fn drain(&self, limit: Duration) -> Result<Duration> {
        let start = Instant::now();
        loop {
            let blocks = self.vol.status().cache_live_blocks;
            if blocks < self.vol.geometry().batch_data() {
                return Ok(start.elapsed());
            }
            if start.elapsed() > limit {
                bail!("destage did not drain {blocks} dirty blocks within {limit:?}");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Stops the mover and closes the pool.
    pub(super) async fn close(&self) -> Result<()> {
        self.housekeeping.abort();
        self.vol.close().await;
        self.pool.close().await.context("closing the pool")?;
        Ok(())
    }
}

impl<D: BlockDevice> Drop for Rig<D> {
    fn drop(&mut self) {
        self.housekeeping.abort();
        self.vol.stop();
    }
}

/// Buckets of a write-size histogram at or above `bytes` (a power of two >= 8 KiB).
pub(super) fn writes_at_least(hist: &[u64], bytes: u64) -> u64 {
    let first = (63 - bytes.leading_zeros()) as usize - 12;
    hist.iter().skip(first.min(WRITE_SIZE_BUCKETS)).sum()
}
