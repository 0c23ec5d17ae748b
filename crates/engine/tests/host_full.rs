//! A full host filesystem is a transient fault (issue 11, item 5): seeded sequences of fills,
//! power cuts, kills and clean closes on one pool, for every layout.
//!
//! Every drive of a seed sits on one simulated host filesystem ([`HostSpace`]). Each cycle
//! boots the pool (while the filesystem may still be full: the open must then refuse with
//! `HostFull` and fail nothing, and the operator frees space), verifies every block and scrubs,
//! then runs three writers and a flusher while the filesystem fills after a seeded number of
//! requests. After the fill:
//!
//! * no drive is failed, in memory or in the committed metadata;
//! * the pool is suspended exactly when some request met ENOSPC, and a write then fails with
//!   `HostFull` before touching a drive;
//! * either the operator frees space and clears the suspension, after which every block reads
//!   back as an allowed version, a scrub finds every stripe consistent, and a second round of
//!   writes and flushes all succeed; or the filesystem stays full;
//! * the cycle ends with a power cut, a process kill or a clean close (which succeeds on a
//!   suspended pool without flushing), and the filesystem may stay full across the reboot.
//!
//! Durability is checked as in crash_sequences.rs: a block reads back as its last durable
//! version (last FUA write, or last write completed before an acknowledged flush) or newer.
//! `STRIA_FULL_SEEDS=N` sets the number of seeds (default 60); `STRIA_FULL_SEED=S` replays one.

use std::cell::RefCell;
use std::sync::Arc;

use crate::common::workload::{BLOCKS, FuaMix, Tracker, VOLUME_BYTES, flusher, worker};
use crate::common::*;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use stria_dev::{BlockDevice, FaultConfig, FaultDevice, HostSpace, IoBytes, PowerSwitch};
use stria_engine::{EngineError, FoundDrive, Layout, Pool, Volume, VolumeError, VolumeState};

const CHUNK: u64 = 16 << 10;

struct World {
    seed: u64,
    rng: ChaCha8Rng,
    layout: Layout,
    devs: Vec<Dev>,
    space: Arc<HostSpace>,
    switch: Arc<PowerSwitch>,
    tracker: Tracker,
    history: Vec<String>,
}

fn sim_config() -> FaultConfig {
    FaultConfig { completion_polls_max: 3, ..FaultConfig::default() }
}

fn layout_for(seed: u64) -> (Layout, usize) {
    match seed % 5 {
        0 => (Layout::Ec { data_shards: 4, parity_shards: 2 }, 6),
        1 => (Layout::Ec { data_shards: 2, parity_shards: 1 }, 3),
        2 => (Layout::Raid1 { copies: 2 }, 2),
        3 => (Layout::Raid10 { width: 2, copies: 2 }, 4),
        _ => (Layout::Raid0 { width: 3 }, 3),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    PowerCut,
    Kill,
    CleanClose,
}

impl World {
    fn note(&mut self, what: String) {
        if std::env::var("STRIA_FULL_SEED").is_ok() {
            eprintln!("seed {}: {what}", self.seed);
        }
        self.history.push(what);
    }

    fn fail(&self, what: String) -> ! {
        panic!("seed {} ({}): {what}\nhistory:\n  {}", self.seed, self.layout, self.history.join("\n  "));
    }

    /// Fresh devices with the given contents, on a new power switch and the same filesystem.
    fn reboot(&mut self, images: Vec<stria_dev::mem::MemDevice>) {
        self.switch = PowerSwitch::new();
        self.devs = images
            .into_iter()
            .map(|image| {
                Arc::new(
                    FaultDevice::with_config(image, sim_config(), self.rng.random::<u64>())
                        .with_power_switch(Arc::clone(&self.switch))
                        .with_host_space(Arc::clone(&self.space)),
                )
            })
            .collect();
    }

    fn images(&mut self, ending: Ending) -> Vec<stria_dev::mem::MemDevice> {
        let base = self.rng.random::<u64>();
        crash_images(self.devs.iter(), ending == Ending::PowerCut, base)
    }

    fn found(&self) -> Vec<FoundDrive<Dev>> {
        self.devs.iter().map(|d| FoundDrive { dev: Arc::clone(d), path: d.name().to_string() }).collect()
    }

    /// Opens the pool. While the filesystem is full the open must refuse with `HostFull` (or
    /// open, if it needed no write); then the operator frees space and it opens.
    async fn boot(&mut self) -> Pool<Dev> {
        if self.space.is_full() {
            match Pool::open(self.found()).await {
                Err(EngineError::HostFull(why)) => {
                    self.note(format!("boot on a full filesystem refused: {why}"))
                }
                Err(e) => self.fail(format!("boot on a full filesystem: unexpected error {e}")),
                Ok(pool) => self.fail(format!(
                    "the pool opened on a full filesystem (suspended: {:?})",
                    pool.suspension()
                )),
            }
            // The refused open wrote nothing it relies on; whatever it wrote is on the drives.
            let images = self.images(Ending::Kill);
            self.space.free();
            self.note("space freed".into());
            self.reboot(images);
        }
        match Pool::open(self.found()).await {
            Ok(pool) => {
                small_csum_cache(&pool, self.seed);
                pool
            }
            Err(e) => self.fail(format!("the pool did not open: {e}")),
        }
    }

    fn check_no_drive_failed(&self, pool: &Pool<Dev>, when: &str) {
        for d in pool.drives().iter() {
            if d.is_failed() {
                self.fail(format!("{when}: drive in slot {} is failed in memory", d.slot()));
            }
        }
        for r in &pool.meta().drives {
            if r.state == stria_engine::DriveState::Failed {
                self.fail(format!("{when}: drive in slot {} failed: {:?}", r.slot, r.failed_reason));
            }
        }
    }

    async fn verify(&mut self, vol: &Volume<Dev>, when: &str) {
        for b in 0..BLOCKS {
            match vol.read(b as u64 * 4096, 4096).await {
                Ok(got) => {
                    if !self.tracker.allowed(b).iter().any(|v| v[..] == got[..]) {
                        let what = self.tracker.describe(b, &got);
                        self.fail(format!("{when}: block {b} reads {what}"));
                    }
                    self.tracker.settle(b, got.to_vec());
                }
                Err(e) => self.fail(format!("{when}: block {b} unreadable: {e}")),
            }
        }
    }

    async fn check_scrub(&self, pool: &Pool<Dev>, when: &str) {
        let r = pool.scrub("v", |_, _| {}).await.unwrap_or_else(|e| self.fail(format!("{when}: scrub: {e}")));
        let bad = (
            r.unrecoverable_blocks,
            r.parity_blocks_fixed,
            r.copy_blocks_fixed,
            r.blocks_repaired,
            r.inconsistent_blocks,
        );
        if bad != (0, 0, 0, 0, 0) {
            self.fail(format!("{when}: stripes inconsistent: {r:?}"));
        }
    }

    fn host_full_requests(&self) -> u64 {
        self.devs.iter().map(|d| d.counts().host_full_requests).sum()
    }
}

/// Runs the three writers and the flusher; returns once they stopped (done or at the first
/// error).
async fn load(world: &mut World, vol: &Volume<Dev>, seed: u64) {
    let tracker = RefCell::new(std::mem::replace(&mut world.tracker, Tracker::new()));
    tokio::join!(
        worker(vol, &tracker, seed, 0, FuaMix::WritesAndZeroing),
        worker(vol, &tracker, seed, 1, FuaMix::WritesAndZeroing),
        worker(vol, &tracker, seed, 2, FuaMix::WritesAndZeroing),
        flusher(vol, &tracker, seed),
    );
    world.tracker = tracker.into_inner();
}

async fn run_seed(seed: u64) {
    let (layout, n) = layout_for(seed);
    let space = HostSpace::new();
    let switch = PowerSwitch::new();
    let devs: Vec<Dev> = (0..n)
        .map(|i| {
            let mem = stria_dev::mem::MemDevice::new(&format!("d{i}"), DRIVE_BYTES);
            Arc::new(
                FaultDevice::with_config(mem, sim_config(), seed * 1000 + i as u64)
                    .with_power_switch(Arc::clone(&switch))
                    .with_host_space(Arc::clone(&space)),
            )
        })
        .collect();
    let mut world = World {
        seed,
        rng: rng(seed ^ 0xf111),
        layout,
        devs,
        space,
        switch,
        tracker: Tracker::new(),
        history: Vec::new(),
    };
    {
        let pool = create_pool(&world.devs).await;
        pool.create_volume(spec("v", VOLUME_BYTES, layout, CHUNK)).await.expect("create volume");
        pool.close().await.expect("close");
    }
    let cycles = world.rng.random_range(2..=5);
    for cycle in 0..cycles {
        let pool = world.boot().await;
        let vol = pool.volume("v").expect("volume v");
        world.check_no_drive_failed(&pool, &format!("cycle {cycle} after boot"));
        world.verify(&vol, &format!("cycle {cycle} after boot")).await;
        world.check_scrub(&pool, &format!("cycle {cycle} after boot")).await;

        let fill_after = world.rng.random_range(0..1200);
        let ending = match world.rng.random_range(0..3) {
            0 => Ending::PowerCut,
            1 => Ending::Kill,
            _ => Ending::CleanClose,
        };
        world.note(format!(
            "cycle {cycle}: the filesystem fills after {fill_after} writes; ending {ending:?}"
        ));
        let before = world.host_full_requests();
        world.space.fill_after_ops(fill_after);
        load(&mut world, &vol, seed * 1000 + cycle).await;
        let hit = world.host_full_requests() > before;
        world.check_no_drive_failed(&pool, &format!("cycle {cycle} after the fill"));
        match (hit, pool.suspension()) {
            (true, None) => world.fail("requests met ENOSPC but the pool is not suspended".into()),
            (false, Some(why)) => world.fail(format!("suspended without any ENOSPC: {why}")),
            (true, Some(why)) => {
                count(&COVERAGE.suspensions);
                world.note(format!("suspended: {why}"));
                // A write is refused before it reaches a drive.
                let probe = vol.write(0, IoBytes::copy_from(&[7u8; 4096]), false).await;
                if !matches!(&probe, Err(VolumeError::Pool { source, .. }) if matches!(source.downcast_ref::<EngineError>(), Some(EngineError::HostFull(_))))
                {
                    world.fail(format!("a write to a suspended pool returned {probe:?}"));
                }
            }
            (false, None) => {}
        }
        if hit && world.rng.random_bool(0.3) {
            // A clear before space is freed: it fails and stays suspended when the resync or
            // its flush needs space, or resumes when what it rewrote needed none.
            match pool.clear_suspension().await {
                Err(EngineError::HostFull(why)) if pool.suspension().is_some() => {
                    count(&COVERAGE.clears_refused);
                    world.note(format!("clear while full refused: {why}"));
                }
                Err(EngineError::HostFull(why)) => {
                    world.fail(format!("a refused clear resumed writes: {why}"))
                }
                Err(e) => world.fail(format!("clear while full: unexpected error {e}")),
                Ok(_) if pool.suspension().is_some() => {
                    world.fail("still suspended after a successful clear".into())
                }
                Ok(report) => world.note(format!("clear while full needed no space: {report:?}")),
            }
        }
        if hit && world.rng.random_bool(0.6) {
            world.space.free();
            let report = pool
                .clear_suspension()
                .await
                .unwrap_or_else(|e| world.fail(format!("clearing the suspension after freeing space: {e}")));
            count(&COVERAGE.clears);
            world.note(format!("space freed, suspension cleared: {report:?}"));
            if pool.suspension().is_some() {
                world.fail("still suspended after a successful clear".into());
            }
            // The clear's flush made everything completed durable: what reads back is the baseline.
            world.verify(&vol, &format!("cycle {cycle} after the clear")).await;
            world.check_scrub(&pool, &format!("cycle {cycle} after the clear")).await;
            let ops_before = world.tracker.seq;
            load(&mut world, &vol, seed * 1000 + cycle + 500).await;
            // 3 writers x 30 operations and 12 flushes, all acknowledged.
            if world.tracker.seq - ops_before < 90 {
                world.fail(format!(
                    "writes after the clear failed: only {} operations completed",
                    world.tracker.seq - ops_before
                ));
            }
        }
        match ending {
            Ending::CleanClose => {
                let suspended = pool.suspension().is_some();
                match pool.close().await {
                    Ok(()) if !suspended && pool.suspension().is_none() => world.tracker.flushed(u64::MAX),
                    Ok(()) => {}
                    Err(EngineError::HostFull(_)) => {}
                    Err(e) => world.fail(format!("clean close: {e}")),
                }
            }
            Ending::PowerCut | Ending::Kill => world.switch.trip(),
        }
        count(&COVERAGE.cycles);
        drop(vol);
        drop(pool);
        // A full filesystem stays full across the reboot half of the time.
        if !world.space.is_full() || world.rng.random_bool(0.5) {
            world.space.free();
        }
        world.note(format!("reboot; filesystem full: {}", world.space.is_full()));
        let images = world.images(ending);
        world.reboot(images);
    }
    let pool = world.boot().await;
    let vol = pool.volume("v").expect("volume v");
    world.check_no_drive_failed(&pool, "final boot");
    world.verify(&vol, "final boot").await;
    world.check_scrub(&pool, "final boot").await;
    assert_eq!(vol.state(), VolumeState::Healthy, "seed {seed}: volume state at the end");
    pool.close().await.expect("final close");
}

#[derive(Default)]
struct Coverage {
    cycles: std::sync::atomic::AtomicU64,
    suspensions: std::sync::atomic::AtomicU64,
    clears: std::sync::atomic::AtomicU64,
    clears_refused: std::sync::atomic::AtomicU64,
}

static COVERAGE: std::sync::LazyLock<Coverage> = std::sync::LazyLock::new(Coverage::default);

fn count(c: &std::sync::atomic::AtomicU64) {
    c.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

#[tokio::test]
async fn a_full_host_filesystem_suspends_writes_and_loses_nothing() {
    if let Ok(one) = std::env::var("STRIA_FULL_SEED") {
        let filter = std::env::var("STRIA_LOG").unwrap_or_else(|_| "info".into());
        let _ = tracing_subscriber::fmt().with_env_filter(filter).with_test_writer().try_init();
        run_seed(one.parse().expect("STRIA_FULL_SEED is a number")).await;
        return;
    }
    let seeds: u64 = std::env::var("STRIA_FULL_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(60);
    for seed in 0..seeds {
        run_seed(seed).await;
    }
    let n = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!(
        "{seeds} seeds: {} cycles, {} suspensions, {} cleared while serving, {} clears refused while full",
        n(&COVERAGE.cycles),
        n(&COVERAGE.suspensions),
        n(&COVERAGE.clears),
        n(&COVERAGE.clears_refused)
    );
    assert!(n(&COVERAGE.suspensions) > 0 && n(&COVERAGE.clears) > 0, "the fills never met a request");
    assert!(n(&COVERAGE.clears_refused) > 0, "no clear was ever tried (and refused) while full");
}
