//! The map of log-structured volumes (`stria_tier::map`) under power cuts: after any sequence of
//! crashes and reopenings, every block reads back as the entry of its last update that
//! `MapStore::update` acknowledged, or of a later one, never an older one. Small log rings and
//! caches force checkpoints, ring wrap-arounds, evictions and re-reads of pages; large ones
//! leave the log alone to carry what was acknowledged.
//!
//! `STRIA_MAP_SEEDS=N` sets the number of seeds (default 60); `STRIA_MAP_SEED=S` replays one.

use std::cell::RefCell;
use std::sync::Arc;

use rand::Rng;
use stria_dev::{BlockDevice, FaultConfig, PowerSwitch};
use stria_engine::{DriveClass, FoundDrive, Layout, Pool, VolumeRole, VolumeSpec};
use stria_tier::map::{MapEntry, MapLayout, MapStore, Place, Update};

use crate::common::*;

const BLOCKS: u64 = 3000;
const WORKERS: u64 = 3;

/// What each block may read back as: `versions[b][acked[b]..]` (index 0 is what it held when
/// the cycle began).
struct Model {
    versions: Vec<Vec<MapEntry>>,
    acked: Vec<usize>,
    next: u64,
}

impl Model {
    fn entry(&mut self) -> MapEntry {
        self.next += 1;
        let n = self.next;
        MapEntry { place: Place::Segment(n), crc: n as u32, seq: n as u32 }
    }
}

async fn worker(store: &MapStore<Dev>, model: &RefCell<Model>, seed: u64, w: u64) {
    let mut rng = rng(seed ^ (w + 1).wrapping_mul(0x9e37_79b9));
    for _ in 0..rng.random_range(20..120) {
        let n = rng.random_range(1..40);
        let mut updates = Vec::new();
        {
            let mut m = model.borrow_mut();
            for _ in 0..n {
                // Each worker owns the blocks b % WORKERS == w: per block, issue order is
                // apply order.
                let block = rng.random_range(0..BLOCKS / WORKERS) * WORKERS + w;
                let entry = m.entry();
                m.versions[block as usize].push(entry);
                updates.push(Update { block, entry, expect: None });
            }
        }
        match store.update(&updates).await {
            Ok(applied) => {
                assert!(
                    applied.iter().all(Option::is_some),
                    "seed {seed}: an unconditional update did not apply"
                );
                let mut m = model.borrow_mut();
                for u in &updates {
                    let b = u.block as usize;
                    let at = m.versions[b].iter().rposition(|e| *e == u.entry).expect("issued");
                    m.acked[b] = m.acked[b].max(at);
                }
            }
            Err(_) => return, // the power went out
        }
        if rng.random_bool(0.05) && store.checkpoint().await.is_err() {
            return;
        }
    }
}

async fn run_seed(seed: u64) {
    let mut rng = rng(seed);
    let switch = PowerSwitch::new();
    let mut devs = drives(&switch, seed);
    // Small rings wrap (forcing checkpoints) all the time; large ones let the log carry
    // everything between rare checkpoints.
    let log_blocks = if rng.random_bool(0.5) { rng.random_range(4..24) } else { rng.random_range(64..256) };
    let layout = MapLayout { base: 4096 * rng.random_range(0..4), log_blocks, blocks: BLOCKS };
    {
        let pool = create_pool(&devs).await;
        let spec = VolumeSpec {
            name: "map".into(),
            size_bytes: (layout.base + layout.bytes()).next_multiple_of(64 << 10),
            layout: Layout::Raid1 { copies: 2 },
            chunk_bytes: 64 << 10,
            class: DriveClass::Fast,
            role: VolumeRole::Plain,
        };
        pool.create_volume(spec).await.expect("map volume");
        pool.close().await.expect("close");
    }
    let model = RefCell::new(Model {
        versions: vec![vec![MapEntry::UNALLOCATED]; BLOCKS as usize],
        acked: vec![0; BLOCKS as usize],
        next: 0,
    });
    let mut switch = switch;
    for cycle in 0..rng.random_range(2..6) {
        // Requests that complete a few polls after they were made let the workers and a
        // checkpoint interleave at every I/O, not only where the map yields.
        let polls = rng.random_range(0..=3);
        for d in &devs {
            d.set_config(FaultConfig { completion_polls_max: polls, ..FaultConfig::default() });
        }
        let found = devs.iter().map(|d| FoundDrive { dev: d.clone(), path: d.name().into() }).collect();
        let pool = Arc::new(Pool::open(found).await.unwrap_or_else(|e| panic!("seed {seed}: open: {e}")));
        let vol = pool.volume("map").expect("map volume");
        // Small caches evict and checkpoint on nearly every update; 64 pages hold the whole map.
        let cache_pages = if rng.random_bool(0.5) { rng.random_range(1..8) } else { 64 };
        let store = MapStore::open(vol, layout, cache_pages)
            .await
            .unwrap_or_else(|e| panic!("seed {seed} cycle {cycle}: map open: {e}"));
        // Every block is one of its allowed versions; what it is now is the new baseline.
        let mut now = Vec::with_capacity(BLOCKS as usize);
        for b in 0..BLOCKS {
            now.push(store.get(b).await.unwrap_or_else(|e| panic!("seed {seed}: get {b}: {e}")));
        }
        {
            let mut m = model.borrow_mut();
            for (b, got) in now.into_iter().enumerate() {
                let allowed = &m.versions[b][m.acked[b]..];
                assert!(
                    allowed.contains(&got),
                    "seed {seed} cycle {cycle}: block {b} reads {got:?}, acknowledged {:?}, allowed {allowed:?}",
                    m.versions[b][m.acked[b]]
                );
                m.versions[b] = vec![got];
                m.acked[b] = 0;
            }
        }
        let clean = rng.random_bool(0.2);
        if !clean {
            switch.trip_after_ops(rng.random_range(50..3000));
        }
        // Half the cycles hand checkpoints to a task of their own, as log-structured volumes do:
        // they then run while workers log, and a worker waits only for a full ring or a cache
        // past its hard bound.
        let background = rng.random_bool(0.5);
        if background {
            store.checkpoint_in_background();
        }
        let done = std::cell::Cell::new(false);
        let workers = async {
            futures::future::join_all((0..WORKERS).map(|w| worker(&store, &model, seed * 100 + cycle, w)))
                .await;
            done.set(true);
        };
        let checkpoints = async {
            while background && !done.get() {
                tokio::select! {
                    () = store.checkpoint_wanted() => {}
                    () = tokio::time::sleep(std::time::Duration::from_millis(1)) => {}
                }
                if store.checkpoint_if_due().await.is_err() {
                    return; // the power went out
                }
            }
        };
        futures::future::join(workers, checkpoints).await;
        if clean {
            store.checkpoint().await.unwrap_or_else(|e| panic!("seed {seed}: checkpoint: {e}"));
            pool.close().await.unwrap_or_else(|e| panic!("seed {seed}: close: {e}"));
        }
        let stats = store.stats().await;
        assert!(
            stats.cache.resident_pages <= cache_pages + WORKERS * 40,
            "seed {seed}: cache unbounded: {stats:?}"
        );
        drop(store);
        drop(pool);
        (devs, switch) = power_cycle(&devs, seed * 10 + cycle);
    }
}

#[tokio::test]
async fn map_updates_survive_any_sequence_of_power_cuts() {
    if let Ok(one) = std::env::var("STRIA_MAP_SEED") {
        run_seed(one.parse().expect("STRIA_MAP_SEED is a number")).await;
        return;
    }
    let seeds: u64 = std::env::var("STRIA_MAP_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(60);
    for seed in 0..seeds {
        run_seed(seed).await;
    }
}
