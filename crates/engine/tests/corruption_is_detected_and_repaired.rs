//! Silent corruption (bit flips), latent sector errors and misdirected writes on up to M drives
//! of an `ec:K+M` volume (and on one copy of mirrors): every bad block is detected, repaired from
//! redundancy and counted; none is ever returned to the reader.

#![allow(clippy::cast_possible_truncation)] // 64-bit only, like the engine

mod common;

use std::collections::BTreeSet;

use common::*;
use rand::Rng;
use stria_dev::{IoBytes, PowerSwitch};
use stria_engine::Layout;

const VOLUME_BYTES: u64 = 2 << 20;
const CHUNK: u64 = 16 << 10;

fn total_repairs(pool: &stria_engine::Pool<Dev>) -> u64 {
    pool.status().drives.iter().map(|d| d.checksum_repairs).sum()
}

#[tokio::test]
async fn bit_flips_and_latent_errors_on_up_to_m_drives_are_repaired_and_counted() {
    let cases = [
        (Layout::Ec { data_shards: 4, parity_shards: 2 }, 6),
        (Layout::Ec { data_shards: 3, parity_shards: 1 }, 4),
        (Layout::Ec { data_shards: 2, parity_shards: 3 }, 5),
        (Layout::Raid1 { copies: 2 }, 2),
        (Layout::Raid10 { width: 2, copies: 2 }, 4),
    ];
    for (layout, n) in cases {
        for seed in 0..6u64 {
            let switch = PowerSwitch::new();
            let devs = drives(n, &switch, seed);
            let pool = create_pool(&devs).await;
            let vol = pool.create_volume(spec("v", VOLUME_BYTES, layout, CHUNK)).await.unwrap();
            let mut model = Model::new(VOLUME_BYTES as usize);
            let mut rng = rng(seed);
            let data = random_bytes(&mut rng, VOLUME_BYTES as usize);
            write(&vol, &mut model, 0, data).await;
            pool.flush().await.unwrap();

            // Pick up to `tolerance` drives and damage blocks on them: data and parity alike.
            let tolerance = layout.tolerance() as usize;
            let victims: Vec<u32> = {
                let mut all: Vec<u32> = (0..n as u32).collect();
                let mut chosen = Vec::new();
                for _ in 0..rng.random_range(1..=tolerance) {
                    let i = rng.random_range(0..all.len());
                    chosen.push(all.remove(i));
                }
                chosen
            };
            let mut damaged: BTreeSet<(u32, u64)> = BTreeSet::new();
            for _ in 0..60 {
                let offset = rng.random_range(0..VOLUME_BYTES / 4096) * 4096;
                let locations = vol.locate(offset).unwrap();
                for loc in locations.iter().filter(|l| victims.contains(&l.slot)) {
                    let block = loc.device_offset_bytes / 4096;
                    if !damaged.insert((loc.slot, block)) {
                        continue;
                    }
                    let dev = &devs[loc.slot as usize];
                    if rng.random_bool(0.5) {
                        dev.flip_bit(block, rng.random_range(0..4096 * 8));
                    } else {
                        dev.add_latent_error(block);
                    }
                }
            }
            assert!(!damaged.is_empty());
            let before = total_repairs(&pool);
            // Every read returns the right data; scrub finds what reads did not touch (parity).
            check(&vol, &model).await;
            let report = pool.scrub("v", |_, _| {}).await.unwrap();
            assert_eq!(report.unrecoverable_blocks, 0, "{layout} seed {seed}: {report:?}");
            let repaired = total_repairs(&pool) - before;
            assert_eq!(
                repaired,
                damaged.len() as u64,
                "{layout} seed {seed}: injected {} bad blocks, repaired {repaired}",
                damaged.len()
            );
            // Nothing is left to find, and no drive was failed for it.
            let again = pool.scrub("v", |_, _| {}).await.unwrap();
            assert_eq!((again.blocks_repaired, again.parity_blocks_fixed), (0, 0), "{layout} seed {seed}");
            assert!(pool.status().drives.iter().all(|d| d.state == "active"));
            check(&vol, &model).await;
        }
    }
}

#[tokio::test]
async fn misdirected_and_lost_writes_are_caught_by_checksums() {
    for (layout, n) in
        [(Layout::Ec { data_shards: 4, parity_shards: 2 }, 6), (Layout::Raid1 { copies: 2 }, 2)]
    {
        for seed in 0..8u64 {
            let switch = PowerSwitch::new();
            let devs = drives(n, &switch, seed);
            let pool = create_pool(&devs).await;
            let vol = pool.create_volume(spec("v", VOLUME_BYTES, layout, CHUNK)).await.unwrap();
            let mut model = Model::new(VOLUME_BYTES as usize);
            let mut rng = rng(seed + 100);
            let data = random_bytes(&mut rng, VOLUME_BYTES as usize);
            write(&vol, &mut model, 0, data).await;
            // One drive misdirects or loses the data part of the next write.
            let victim = rng.random_range(0..n);
            if seed % 2 == 0 {
                devs[victim].arm_misdirected_write();
            } else {
                devs[victim].arm_lost_write();
            }
            for _ in 0..20 {
                let (o, d) = random_write(&mut rng, VOLUME_BYTES, vol.row_bytes());
                vol.write(o, IoBytes::copy_from(&d), false).await.unwrap();
                model.write(o as usize, &d);
            }
            check(&vol, &model).await;
            let report = pool.scrub("v", |_, _| {}).await.unwrap();
            assert_eq!(report.unrecoverable_blocks, 0, "{layout} seed {seed}: {report:?}");
            check(&vol, &model).await;
            let again = pool.scrub("v", |_, _| {}).await.unwrap();
            assert_eq!((again.blocks_repaired, again.parity_blocks_fixed), (0, 0), "{layout} seed {seed}");
        }
    }
}
