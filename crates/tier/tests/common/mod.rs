//! Rig for log-structured volume tests: a pool of 2 fast + 6 capacity fault-injecting drives.
#![allow(dead_code, unreachable_pub, clippy::cast_possible_truncation)]

use std::sync::Arc;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use stria_dev::{BlockDevice, FaultConfig, FaultDevice, PowerSwitch};
use stria_engine::{DriveClass, FoundDrive, NewDrive, Pool};
use stria_tier::log::{self, LogParams, LogSpec, LogVolume};

pub type Dev = Arc<FaultDevice>;
pub const DRIVE_BYTES: u64 = 48 << 20;

pub fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

/// 2 fast + 6 capacity drives on `switch`: slots 0-1 fast, 2-7 capacity.
pub fn drives(switch: &Arc<PowerSwitch>, seed: u64) -> Vec<Dev> {
    drives_of(switch, seed, DRIVE_BYTES)
}

/// [`drives`] of `bytes` each.
pub fn drives_of(switch: &Arc<PowerSwitch>, seed: u64, bytes: u64) -> Vec<Dev> {
    (0..8)
        .map(|i| {
            Arc::new(
                FaultDevice::new(&format!("d{i}"), bytes, seed * 100 + i).with_power_switch(switch.clone()),
            )
        })
        .collect()
}

pub async fn create_pool(devs: &[Dev]) -> Arc<Pool<Dev>> {
    let nd = devs
        .iter()
        .enumerate()
        .map(|(i, d)| NewDrive {
            dev: d.clone(),
            path: d.name().into(),
            class: if i < 2 { DriveClass::Fast } else { DriveClass::Capacity },
            domain: String::new(),
            fresh: true,
        })
        .collect();
    Arc::new(Pool::create("t", nd).await.expect("pool"))
}

pub async fn open_pool(devs: &[Dev]) -> Arc<Pool<Dev>> {
    let found = devs.iter().map(|d| FoundDrive { dev: d.clone(), path: d.name().into() }).collect();
    Arc::new(Pool::open(found).await.expect("reopen pool"))
}

/// What survives a power cut of `devs`, as new drives on a new power switch (returned, so the
/// next cut can be armed).
pub fn power_cycle(devs: &[Dev], seed: u64) -> (Vec<Dev>, Arc<PowerSwitch>) {
    let switch = PowerSwitch::new();
    let devs = devs
        .iter()
        .enumerate()
        .map(|(i, d)| {
            Arc::new(
                FaultDevice::with_config(d.crash_image(seed + i as u64), FaultConfig::default(), seed)
                    .with_power_switch(switch.clone()),
            )
        })
        .collect();
    (devs, switch)
}

/// What survives a power cut of `devs` (see [`power_cycle`]).
pub fn reboot(devs: &[Dev], seed: u64) -> Vec<Dev> {
    power_cycle(devs, seed).0
}

/// A small `tiered:ec:4+2` volume `name` (cache and map on the fast drives): 16 KiB chunks
/// (rows of 16 blocks), batches of 2 rows (31 data blocks + 1 summary), segments of 4 batches
/// (124 data blocks), a 64-block cache and a 16-block map log (so checkpoints happen all the time).
pub fn small_spec(name: &str, size_bytes: u64, space_bytes: u64) -> LogSpec {
    LogSpec {
        chunk_bytes: 16 << 10,
        space_bytes: Some(space_bytes),
        cache_bytes: Some(64 << 12),
        batch_rows: Some(2),
        segment_batches: Some(4),
        map_log_blocks: Some(16),
        map_cache_pages: 64,
        fast_tier: true,
        ..LogSpec::new(name, size_bytes, 4, 2)
    }
}

/// Segment-space bytes for a volume of `blocks` at 2/3 fill, in the small segments of
/// [`small_spec`], plus the GC reserve.
pub fn small_space(blocks: u64) -> u64 {
    ((blocks * 3 / 2).div_ceil(124) + 2) * 124 * 4096
}

pub async fn open_log(
    pool: &Arc<Pool<Dev>>,
    name: &str,
) -> Result<Arc<LogVolume<Dev>>, stria_tier::TierError> {
    let rec = pool.meta().tiered.iter().find(|t| t.name == name).cloned().expect("volume record");
    log::open(pool, &rec).await
}

pub fn set_always(vol: &LogVolume<Dev>, always: bool, map_cache_pages: u64) {
    vol.set_params(LogParams { always, map_cache_pages, ..vol.params() });
}

pub fn random_bytes(rng: &mut ChaCha8Rng, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    rng.fill(&mut v[..]);
    v
}

/// A random write inside `[lo, hi)`: blocks, blocksets or unaligned bytes.
pub fn random_write(rng: &mut ChaCha8Rng, lo: u64, hi: u64) -> (u64, Vec<u8>) {
    let span = hi - lo;
    let (o, len) = match rng.random_range(0..3) {
        0 => {
            let b = rng.random_range(0..span / 4096);
            (lo + b * 4096, 4096 * rng.random_range(1..=8.min(span / 4096 - b)))
        }
        1 => {
            let o = rng.random_range(0..span / 65536) * 65536;
            (lo + o, 65536.min(span - o))
        }
        _ => {
            let o = rng.random_range(0..span - 1);
            (lo + o, rng.random_range(1..=(span - o).min(20_000)))
        }
    };
    (o, random_bytes(rng, len as usize))
}

pub async fn check(vol: &LogVolume<Dev>, model: &[u8]) {
    let step = 256 << 10;
    let mut at = 0;
    while at < model.len() {
        let n = step.min(model.len() - at);
        let got = vol.read(at as u64, n).await.unwrap_or_else(|e| panic!("read at {at}: {e}"));
        if got[..] != model[at..at + n] {
            let i = (0..n).find(|&i| got[i] != model[at + i]).unwrap();
            panic!("the volume differs from the model at byte {}", at + i);
        }
        at += n;
    }
}

/// Half the seeds (by a hash, independent of the rest of the seed's choices) run with a
/// checksum cache of 3 pages per drive, so crashes land in page loads, evictions and the
/// write-backs the budget forces (as in the engine's simulations).
pub fn small_csum_cache(pool: &Pool<Dev>, seed: u64) {
    if seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 63 == 1 {
        pool.set_metadata_cache(3 * 4096 * pool.drives().len() as u64);
    }
}

/// Per block: every version in order and the newest acknowledged one.
pub struct Tracker {
    pub versions: Vec<Vec<Vec<u8>>>,
    /// The newest version acknowledged: what a read during work sees at least.
    pub acked: Vec<usize>,
    /// The newest version durable (acknowledged as FUA, or before a completed flush began; every
    /// acknowledged write unless the volume writes back): what a block reads as at least after a
    /// power cut.
    pub durable: Vec<usize>,
    /// The volume writes back ([`stria_tier::log::LogParams::write_back`]): a plain write is
    /// durable only once a flush that began after it completed.
    pub write_back: bool,
}

impl Tracker {
    pub fn new(blocks: usize) -> Tracker {
        Tracker {
            versions: vec![vec![vec![0u8; 4096]]; blocks],
            acked: vec![0; blocks],
            durable: vec![0; blocks],
            write_back: false,
        }
    }

    /// A write of these (block, version) pairs was acknowledged: durable unless the volume
    /// writes back (docs/crash-consistency.md).
    pub fn acknowledge(&mut self, written: &[(usize, usize)]) {
        for &(b, v) in written {
            self.acked[b] = self.acked[b].max(v);
            if !self.write_back {
                self.durable[b] = self.durable[b].max(v);
            }
        }
    }

    /// A write that is durable when acknowledged (FUA, zeroing, trim) was acknowledged.
    pub fn acknowledge_durable(&mut self, written: &[(usize, usize)]) {
        for &(b, v) in written {
            self.acked[b] = self.acked[b].max(v);
            self.durable[b] = self.durable[b].max(v);
        }
    }

    /// What a flush starting now will make durable.
    pub fn flush_started(&self) -> Vec<usize> {
        self.acked.clone()
    }

    /// A flush started with `at` ([`Tracker::flush_started`]) completed.
    pub fn flushed(&mut self, at: &[usize]) {
        for (d, &a) in self.durable.iter_mut().zip(at) {
            *d = (*d).max(a);
        }
    }

    /// The versions block `b` may read back as after a power cut: the last durable one or a
    /// newer one.
    pub fn allowed(&self, b: usize) -> &[Vec<u8>] {
        &self.versions[b][self.durable[b]..]
    }

    /// After a verified boot, what was read is the only version.
    pub fn settle(&mut self, b: usize, observed: &[u8]) {
        self.versions[b] = vec![observed.to_vec()];
        self.acked[b] = 0;
        self.durable[b] = 0;
    }

    /// What a wrong read of block `b` holds instead, for the failure message.
    pub fn describe(&self, b: usize, got: &[u8]) -> String {
        let older = self.versions[b][..self.acked[b]].iter().position(|v| v[..] == got[..]);
        format!(
            "{} (acknowledged version {} of {})",
            older.map_or("data never written".to_string(), |v| format!(
                "version {v}, older than an acknowledged write"
            )),
            self.acked[b],
            self.versions[b].len() - 1
        )
    }

    pub fn issue(&mut self, offset: u64, data: &[u8]) -> Vec<(usize, usize)> {
        let first = (offset / 4096) as usize;
        let last = ((offset + data.len() as u64 - 1) / 4096) as usize;
        (first..=last)
            .map(|b| {
                let mut block = self.versions[b].last().unwrap().clone();
                let s = (b * 4096).max(offset as usize);
                let e = ((b + 1) * 4096).min(offset as usize + data.len());
                block[s - b * 4096..e - b * 4096]
                    .copy_from_slice(&data[s - offset as usize..e - offset as usize]);
                self.versions[b].push(block);
                (b, self.versions[b].len() - 1)
            })
            .collect()
    }
}

/// Cuts the power under `vol` and opens the pool and the volume again from what survived (on
/// new drives and a new power switch, returned).
pub async fn cut_and_reopen(
    switch: &PowerSwitch,
    vol: Arc<LogVolume<Dev>>,
    pool: Arc<Pool<Dev>>,
    devs: &[Dev],
    seed: u64,
) -> (Vec<Dev>, Arc<PowerSwitch>, Arc<Pool<Dev>>, Arc<LogVolume<Dev>>) {
    let name = vol.name().to_string();
    switch.trip();
    vol.stop();
    drop(vol);
    drop(pool);
    let (devs, switch) = power_cycle(devs, seed);
    let pool = open_pool(&devs).await;
    let vol = open_log(&pool, &name).await.unwrap();
    (devs, switch, pool, vol)
}

/// The number in environment variable `name` (a long mode's setting), or `default`.
pub fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

/// Sets `flag` when a thread named `thread` panics (a test's own runtime threads: the volume's
/// spawned tasks would otherwise only stop), then reports the panic as before. Other tests of
/// the binary run beside it, so only that name counts.
pub fn note_panics_of(thread: &'static str, flag: &'static std::sync::atomic::AtomicBool) {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if std::thread::current().name() == Some(thread) {
            flag.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        hook(info);
    }));
}
