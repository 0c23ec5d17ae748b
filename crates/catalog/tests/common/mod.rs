//! Rig: a pool of 2 fast + 6 capacity memory drives (fault-injecting drives with no fault armed,
//! on one power switch) opened through the catalog, as users reach volumes: by name, as
//! `Arc<dyn BlockVolume>`.
#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use stria_catalog::{Catalog, CatalogError, CreateVolume};
use stria_dev::{BlockDevice, FaultConfig, FaultDevice, PowerSwitch};
use stria_engine::{BlockVolume, DriveClass, ErrorKind, FoundDrive, NewDrive, Pool, QosSpec};

pub type Dev = Arc<FaultDevice>;

/// Each drive: small enough to stay cheap in memory, large enough for every kind at once.
pub const DRIVE_BYTES: u64 = 64 << 20;
/// Fast drives come first (slots 0 and 1), then capacity drives.
pub const FAST_DRIVES: usize = 2;
pub const CAPACITY_DRIVES: usize = 6;

pub fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

pub fn random_bytes(rng: &mut ChaCha8Rng, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    rng.fill(&mut v[..]);
    v
}

/// An open pool and its catalog, with the drives under it.
pub struct Rig {
    pub devs: Vec<Dev>,
    pub switch: Arc<PowerSwitch>,
    pub catalog: Catalog<Dev>,
}

impl Rig {
    /// A new pool named `t` on fresh drives.
    pub async fn new(seed: u64) -> Rig {
        let switch = PowerSwitch::new();
        let devs: Vec<Dev> = (0..FAST_DRIVES + CAPACITY_DRIVES)
            .map(|i| {
                Arc::new(
                    FaultDevice::new(
                        &format!("d{i}"),
                        DRIVE_BYTES,
                        seed.wrapping_mul(100).wrapping_add(i as u64),
                    )
                    .with_power_switch(Arc::clone(&switch)),
                )
            })
            .collect();
        let drives = devs
            .iter()
            .enumerate()
            .map(|(i, d)| NewDrive {
                dev: Arc::clone(d),
                path: d.name().into(),
                class: if i < FAST_DRIVES { DriveClass::Fast } else { DriveClass::Capacity },
                domain: String::new(),
                fresh: true,
            })
            .collect();
        let pool = Arc::new(Pool::create("t", drives).await.expect("create the pool"));
        let catalog = Catalog::open(pool).await.expect("open the catalog");
        Rig { devs, switch, catalog }
    }

    /// The pool on `devs` assembled again, and its catalog.
    pub async fn open(devs: Vec<Dev>, switch: Arc<PowerSwitch>) -> Rig {
        let found = devs.iter().map(|d| FoundDrive { dev: Arc::clone(d), path: d.name().into() }).collect();
        let pool = Arc::new(Pool::open(found).await.expect("assemble the pool"));
        let catalog = Catalog::open(pool).await.expect("open the catalog");
        Rig { devs, switch, catalog }
    }

    /// Cuts the power of every drive now and boots on what survived (each unflushed block at its
    /// durable version or a later one, chosen by `seed`). The old catalog is dropped unclosed.
    pub async fn power_cut(&mut self, seed: u64) {
        self.switch.trip();
        let switch = PowerSwitch::new();
        let devs = self
            .devs
            .iter()
            .enumerate()
            .map(|(i, d)| {
                Arc::new(
                    FaultDevice::with_config(
                        d.crash_image(seed.wrapping_add(i as u64)),
                        FaultConfig::default(),
                        seed ^ 0x5eed,
                    )
                    .with_power_switch(Arc::clone(&switch)),
                )
            })
            .collect();
        *self = Rig::open(devs, switch).await;
    }

    /// Closes the catalog cleanly and opens the pool again on the same drives.
    pub async fn reopen(&mut self) {
        self.catalog.close().await.expect("clean close");
        *self = Rig::open(self.devs.clone(), Arc::clone(&self.switch)).await;
    }

    /// Looks up a client-visible volume, which must exist.
    pub fn volume(&self, name: &str) -> Arc<dyn BlockVolume> {
        self.catalog.lookup(name).unwrap_or_else(|| panic!("no volume `{name}`"))
    }
}

/// A creation request with the defaults the CLI uses, and a write cache small enough for these
/// drives on log-structured layouts.
pub fn create_req(name: &str, size_bytes: u64, layout: &str) -> CreateVolume {
    let log = stria_catalog::is_log_layout(layout);
    CreateVolume {
        name: name.into(),
        size_bytes,
        layout: layout.into(),
        chunk_bytes: None,
        class: None,
        cache_bytes: log.then_some(1 << 20),
        cache_copies: None,
        space_bytes: None,
        gc: None,
        cache_mode: None,
        qos: QosSpec::default(),
    }
}

/// The kind of a catalog error, as a front end would see it: `Engine`/`Tier` errors by their
/// kind, the catalog's own by theirs.
pub fn catalog_kind(e: &CatalogError) -> ErrorKind {
    match e {
        CatalogError::Engine(e) => e.kind(),
        CatalogError::Tier(stria_tier::TierError::Engine(e)) => e.kind(),
        CatalogError::Tier(stria_tier::TierError::Volume(e)) => e.kind(),
        CatalogError::Tier(_) | CatalogError::Invalid(_) => ErrorKind::InvalidInput,
        CatalogError::NotFound(_) => ErrorKind::NotFound,
    }
}

/// Seeds of a test: `STRIA_CONFORMANCE_SEED=S` replays one, `STRIA_CONFORMANCE_SEEDS=N` runs
/// `N` (default `default`).
pub fn seeds(default: u64) -> Vec<u64> {
    if let Ok(s) = std::env::var("STRIA_CONFORMANCE_SEED") {
        return vec![s.parse().expect("STRIA_CONFORMANCE_SEED is a number")];
    }
    let n = std::env::var("STRIA_CONFORMANCE_SEEDS")
        .map(|s| s.parse().expect("STRIA_CONFORMANCE_SEEDS is a number"))
        .unwrap_or(default);
    (1..=n).collect()
}
