//! Shared rig for the engine's scenario tests: pools on seeded fault-injecting drives, a byte
//! model of what a volume must read back, crash images and reassembly.
#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use stria_dev::{FaultConfig, FaultDevice, IoBytes, PowerSwitch};
use stria_engine::{
    DriveClass, EngineError, FoundDrive, Layout, NewDrive, Pool, Volume, VolumeError, VolumeRole, VolumeSpec,
};

pub mod workload;

pub type Dev = Arc<FaultDevice>;

/// Size of each test drive: small, so that everything stays in memory and fast.
pub const DRIVE_BYTES: u64 = 48 << 20;

pub fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

/// `n` fault drives attached to `switch`.
pub fn drives(n: usize, switch: &Arc<PowerSwitch>, seed: u64) -> Vec<Dev> {
    (0..n)
        .map(|i| {
            Arc::new(
                FaultDevice::new(
                    &format!("d{i}"),
                    DRIVE_BYTES,
                    seed.wrapping_mul(1000).wrapping_add(i as u64),
                )
                .with_power_switch(Arc::clone(switch)),
            )
        })
        .collect()
}

/// One more drive named `name` on `switch` (a replacement).
pub fn drive(name: &str, switch: &Arc<PowerSwitch>, seed: u64) -> Dev {
    Arc::new(FaultDevice::new(name, DRIVE_BYTES, seed).with_power_switch(Arc::clone(switch)))
}

pub fn new_drive(dev: &Dev, class: DriveClass, domain: &str) -> NewDrive<Dev> {
    NewDrive { dev: Arc::clone(dev), path: dev_name(dev), class, domain: domain.into(), fresh: true }
}

fn dev_name(dev: &Dev) -> String {
    use stria_dev::BlockDevice;
    dev.name().to_string()
}

/// A pool of capacity drives, each its own failure domain.
pub async fn create_pool(devs: &[Dev]) -> Pool<Dev> {
    let nd = devs.iter().map(|d| new_drive(d, DriveClass::Capacity, "")).collect();
    Pool::create("test", nd).await.expect("create pool")
}

/// Reassembles a pool from `devs`.
pub async fn open_pool(devs: &[Dev]) -> Result<Pool<Dev>, EngineError> {
    Pool::open(devs.iter().map(|d| FoundDrive { dev: Arc::clone(d), path: dev_name(d) }).collect()).await
}

/// Post-crash images of `devs` as fresh drives (on a new power switch), as after a reboot.
pub fn reboot(devs: &[Dev], seed: u64) -> Vec<Dev> {
    let switch = PowerSwitch::new();
    devs.iter()
        .enumerate()
        .map(|(i, d)| {
            let image = d.crash_image(seed.wrapping_add(i as u64));
            Arc::new(
                FaultDevice::with_config(image, FaultConfig::default(), seed ^ 0x5eed)
                    .with_power_switch(Arc::clone(&switch)),
            )
        })
        .collect()
}

pub fn spec(name: &str, size_bytes: u64, layout: Layout, chunk_bytes: u64) -> VolumeSpec {
    VolumeSpec {
        name: name.into(),
        size_bytes,
        layout,
        chunk_bytes,
        class: DriveClass::Capacity,
        role: VolumeRole::Plain,
    }
}

/// The layouts every scenario runs over, with the drive count they get.
pub fn layouts() -> Vec<(Layout, usize)> {
    vec![
        (Layout::Raid0 { width: 3 }, 3),
        (Layout::Raid1 { copies: 2 }, 2),
        (Layout::Raid1 { copies: 3 }, 3),
        (Layout::Raid10 { width: 2, copies: 2 }, 4),
        (Layout::Ec { data_shards: 3, parity_shards: 1 }, 4),
        (Layout::Ec { data_shards: 4, parity_shards: 2 }, 6),
        (Layout::Ec { data_shards: 2, parity_shards: 3 }, 5),
    ]
}

/// What a volume must contain.
#[derive(Debug, Clone)]
pub struct Model {
    pub bytes: Vec<u8>,
}

impl Model {
    pub fn new(size: usize) -> Model {
        Model { bytes: vec![0; size] }
    }

    pub fn write(&mut self, offset: usize, data: &[u8]) {
        self.bytes[offset..offset + data.len()].copy_from_slice(data);
    }
}

/// Random bytes.
pub fn random_bytes(rng: &mut ChaCha8Rng, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    rng.fill(&mut v[..]);
    v
}

/// A random write: mixes whole stripes, single blocks, and unaligned byte ranges.
pub fn random_write(rng: &mut ChaCha8Rng, size: u64, row_bytes: u64) -> (u64, Vec<u8>) {
    let (offset, len) = match rng.random_range(0..4) {
        0 => {
            let rows = size / row_bytes;
            let r = rng.random_range(0..rows);
            let n = rng.random_range(1..=2.min(rows - r));
            (r * row_bytes, n * row_bytes)
        }
        1 => {
            let b = rng.random_range(0..size / 4096);
            (b * 4096, 4096 * rng.random_range(1..=4.min(size / 4096 - b)))
        }
        _ => {
            let o = rng.random_range(0..size - 1);
            (o, rng.random_range(1..=(size - o).min(70_000)))
        }
    };
    (offset, random_bytes(rng, len as usize))
}

/// Writes to the volume and the model.
pub async fn write(vol: &Volume<Dev>, model: &mut Model, offset: u64, data: Vec<u8>) {
    vol.write(offset, IoBytes::copy_from(&data), false)
        .await
        .unwrap_or_else(|e| panic!("write at {offset}: {e}"));
    model.write(offset as usize, &data);
}

/// Reads the whole volume in pieces and compares with the model.
pub async fn check(vol: &Volume<Dev>, model: &Model) {
    let size = model.bytes.len();
    let step = 256 << 10;
    let mut at = 0;
    while at < size {
        let n = step.min(size - at);
        let got = vol.read(at as u64, n).await.unwrap_or_else(|e| panic!("read at {at}: {e}"));
        if got[..] != model.bytes[at..at + n] {
            let first = (0..n).find(|&i| got[i] != model.bytes[at + i]).expect("differs");
            panic!("volume differs from the model at byte {}", at + first);
        }
        at += n;
    }
}

/// Reads every block: never wrong data; returns how many blocks failed with an error.
pub async fn check_or_error(vol: &Volume<Dev>, model: &Model) -> usize {
    let mut errors = 0;
    for b in 0..model.bytes.len() / 4096 {
        let at = b * 4096;
        match vol.read(at as u64, 4096).await {
            Ok(got) => assert_eq!(&got[..], &model.bytes[at..at + 4096], "wrong data returned at block {b}"),
            // Beyond tolerance the failure may not even be recordable (every copy gone): still an error.
            Err(VolumeError::Unrecoverable { .. } | VolumeError::Pool { .. }) => errors += 1,
            Err(e) => panic!("unexpected error at block {b}: {e}"),
        }
    }
    errors
}

/// Block status never calls a block a hole when it holds data.
pub async fn check_block_status(vol: &Volume<Dev>, model: &Model) {
    let mut at = 0u64;
    for e in vol.block_status(0, model.bytes.len() as u64).await.expect("block status") {
        if e.unallocated {
            let range = at as usize..(at + e.len_bytes) as usize;
            assert!(
                model.bytes[range].iter().all(|&b| b == 0),
                "block status calls [{at}, +{}) a hole but it holds data",
                e.len_bytes
            );
        }
        at += e.len_bytes;
    }
    assert_eq!(at, model.bytes.len() as u64);
}

/// The drives' contents after a power cut (`power_cut`: unflushed writes dropped or torn, per
/// block, by `base`) or after the process was killed (every accepted write kept).
pub fn crash_images<'a>(
    devs: impl Iterator<Item = &'a Dev>,
    power_cut: bool,
    base: u64,
) -> Vec<stria_dev::mem::MemDevice> {
    devs.enumerate()
        .map(|(i, d)| if power_cut { d.crash_image(base.wrapping_add(i as u64)) } else { d.kill_image() })
        .collect()
}

/// Half the seeds (picked by a hash, independent of the layout the seed also picks) run with a
/// checksum cache of 3 pages per drive: nearly every request then evicts, reloads or writes
/// back checksum pages, so crashes land in those paths too. The other half keep the default
/// (everything cached), where unflushed checksum pages stay in memory longest.
pub fn small_csum_cache(pool: &Pool<Dev>, seed: u64) {
    if seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 63 == 1 {
        pool.set_metadata_cache(3 * 4096 * pool.drives().len() as u64);
    }
}
