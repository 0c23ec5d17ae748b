//! Seeded power cuts while a tiered volume takes writes and destages continuously, with a fast
//! or a capacity drive failed (or none): after reassembly every acknowledged write reads back
//! (a tiered write is durable when acknowledged), nothing older comes back, and the capacity
//! tier and the mirrors are consistent.
//!
//! `STRIA_TIER_CRASH_SEEDS=N` sets the number of seeds (default 120); `STRIA_TIER_CRASH_SEED=S`
//! runs one.
#![allow(clippy::cast_possible_truncation)]

mod common;

use std::cell::RefCell;

use crate::common::*;
use rand::Rng;
use stria_dev::{IoBytes, PowerSwitch};

const BLOCKS: usize = 1024; // 4 MiB

/// Per block: every version in order and the newest acknowledged one.
struct Tracker {
    versions: Vec<Vec<Vec<u8>>>,
    acked: Vec<usize>,
}

impl Tracker {
    fn issue(&mut self, offset: u64, data: &[u8]) -> Vec<(usize, usize)> {
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

async fn worker(vol: &stria_tier::TieredVolume<Dev>, t: &RefCell<Tracker>, seed: u64, w: u64) {
    let mut rng = rng(seed * 13 + w);
    // Worker w owns the half [w * 2 MiB, (w + 1) * 2 MiB): one writer per block.
    let (lo, hi) = (w * (2 << 20), (w + 1) * (2 << 20));
    for _ in 0..40 {
        let zero = rng.random_range(0..8) == 0;
        let (o, d) = random_write(&mut rng, lo, hi);
        let d = if zero { vec![0u8; d.len()] } else { d };
        let written = t.borrow_mut().issue(o, &d);
        let r = if zero {
            vol.write_zeroes(o, d.len() as u64, false).await
        } else {
            vol.write(o, IoBytes::copy_from(&d), false).await
        };
        if r.is_err() {
            return;
        }
        {
            let mut t = t.borrow_mut();
            for (b, v) in written {
                t.acked[b] = t.acked[b].max(v);
            }
        }
        tokio::task::yield_now().await;
    }
}

async fn run_seed(seed: u64) {
    let switch = PowerSwitch::new();
    let devs = drives(&switch, seed);
    let pool = create_pool(&devs).await;
    let vol = stria_tier::create(&pool, spec()).await.unwrap();
    always(&vol);
    // Scenario: 0 healthy, 1 a fast drive failed, 2 a capacity drive failed.
    let failed = match seed % 3 {
        1 => Some(1usize),
        2 => Some(2 + (seed as usize / 3) % 6),
        _ => None,
    };
    if let Some(slot) = failed {
        devs[slot].kill();
        pool.fail_drive(slot as u32, "test").await.unwrap();
    }
    let tracker =
        RefCell::new(Tracker { versions: vec![vec![vec![0u8; 4096]]; BLOCKS], acked: vec![0; BLOCKS] });
    let cut = rng(seed).random_range(0..6000);
    switch.trip_after_ops(cut);
    tokio::join!(worker(&vol, &tracker, seed, 0), worker(&vol, &tracker, seed, 1));
    switch.trip();
    vol.close().await;
    drop(vol);
    drop(pool);
    let t = tracker.into_inner();

    let given: Vec<Dev> =
        devs.iter().enumerate().filter(|(i, _)| Some(*i) != failed).map(|(_, d)| d.clone()).collect();
    let rebooted = reboot(&given, seed);
    let pool = open_pool(&rebooted).await;
    let vol = open_tiered(&pool).await;
    for b in 0..BLOCKS {
        let got = vol
            .read(b as u64 * 4096, 4096)
            .await
            .unwrap_or_else(|e| panic!("seed {seed} (failed {failed:?}): block {b} unreadable: {e}"));
        let allowed = &t.versions[b][t.acked[b]..];
        if !allowed.iter().any(|v| v[..] == got[..]) {
            let older = t.versions[b][..t.acked[b]].iter().position(|v| v[..] == got[..]);
            panic!(
                "seed {seed} (failed {failed:?}): block {b} holds {} (acknowledged version {} of {})",
                older.map_or("data never written".to_string(), |v| format!(
                    "version {v}, older than an acknowledged write"
                )),
                t.acked[b],
                t.versions[b].len() - 1
            );
        }
    }
    // Destage everything left, read again, and check the parts' redundancy.
    vol.destage_all().await.unwrap_or_else(|e| panic!("seed {seed}: destage after recovery: {e}"));
    for part in ["tv.cache", "tv.meta", "tv.cap"] {
        let r = pool.scrub(part, |_, _| {}).await.unwrap();
        assert_eq!(
            (r.unrecoverable_blocks, r.parity_blocks_fixed, r.copy_blocks_fixed, r.inconsistent_blocks),
            (0, 0, 0, 0),
            "seed {seed}: {part} inconsistent: {r:?}"
        );
    }
}

#[tokio::test]
async fn power_cuts_during_cache_writes_metadata_updates_and_destage_lose_no_acknowledged_write() {
    if let Ok(s) = std::env::var("STRIA_TIER_CRASH_SEED") {
        run_seed(s.parse().unwrap()).await;
        return;
    }
    let n: u64 = std::env::var("STRIA_TIER_CRASH_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(120);
    for seed in 0..n {
        run_seed(seed).await;
    }
}
