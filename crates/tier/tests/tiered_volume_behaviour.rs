//! A tiered volume reads back what was written while destage moves data to the capacity tier,
//! across reopening; writers wait (never fail) when the cache is full; the capacity tier sees
//! only full-stripe writes; the write path costs one metadata page write per blockset touched.

use std::sync::atomic::Ordering::Relaxed;

use crate::common::*;
use stria_dev::{IoBytes, PowerSwitch};

#[tokio::test]
async fn reads_match_writes_while_destage_runs_and_after_reopen() {
    for always_on in [false, true] {
        let switch = PowerSwitch::new();
        let devs = drives(&switch, 1);
        let pool = create_pool(&devs).await;
        let vol = stria_tier::create(&pool, spec()).await.unwrap();
        if always_on {
            always(&vol);
        }
        let size = vol.size_bytes() as usize;
        let mut model = vec![0u8; size];
        let mut rng = rng(7);
        for i in 0..300 {
            let (o, d) = random_write(&mut rng, 0, size as u64);
            vol.write(o, IoBytes::copy_from(&d), false).await.unwrap();
            model[o as usize..o as usize + d.len()].copy_from_slice(&d);
            if i % 50 == 0 {
                check(&vol, &model).await;
            }
            if i % 7 == 0 {
                tokio::task::yield_now().await; // let the destager run
            }
        }
        // Zeroing and trimming read back as zeros.
        vol.write_zeroes(100_000, 300_000, false).await.unwrap();
        model[100_000..400_000].fill(0);
        vol.trim(1 << 20, 65536).await.unwrap();
        model[1 << 20..(1 << 20) + 65536].fill(0);
        check(&vol, &model).await;
        vol.destage_all().await.unwrap();
        assert_eq!(vol.dirty().0, 0);
        check(&vol, &model).await;
        let st = vol.status();
        assert!(st.destaged_blocksets > 0);
        let cap = &st.parts[2];
        assert_eq!(cap.partial_stripe_writes, 0, "the capacity tier sees only full stripes: {cap:?}");
        assert!(cap.full_stripe_writes > 0);
        // Every capacity drive write is a whole chunk (16 KiB here) or larger: nothing in the
        // 4-8 KiB bucket except metadata-sized writes (checksum pages, bitmaps) of the engine.
        vol.close().await;
        drop(vol);
        pool.close().await.unwrap();

        let devs = reboot(&devs, 3);
        let pool = open_pool(&devs).await;
        let vol = open_tiered(&pool).await;
        check(&vol, &model).await;
        // Write more after the restart; dirty data survives another reopen without destage.
        vol.set_params(stria_tier::TierParams {
            start_percent: 100,
            stop_percent: 100,
            idle_ms: u64::MAX,
            always: false,
            ..vol.params()
        });
        let (o, d) = random_write(&mut rng, 0, size as u64);
        vol.write(o, IoBytes::copy_from(&d), false).await.unwrap();
        model[o as usize..o as usize + d.len()].copy_from_slice(&d);
        vol.close().await;
        drop(vol);
        drop(pool);
        let pool = open_pool(&reboot(&devs, 4)).await;
        let vol = open_tiered(&pool).await;
        check(&vol, &model).await;
    }
}

#[tokio::test]
async fn a_full_cache_slows_writers_down_and_never_fails_them() {
    let switch = PowerSwitch::new();
    let devs = drives(&switch, 2);
    let pool = create_pool(&devs).await;
    let vol = stria_tier::create(&pool, spec()).await.unwrap();
    let size = vol.size_bytes() as usize;
    let mut model = vec![0u8; size];
    let mut rng = rng(9);
    // Four times the cache size in writes, with no destage until writers wait.
    vol.set_params(stria_tier::TierParams {
        start_percent: 100,
        stop_percent: 0,
        idle_ms: u64::MAX,
        ..vol.params()
    });
    for _ in 0..64 {
        let o = rng.random_range(0..size as u64 / 32768) * 32768;
        let d = random_bytes(&mut rng, 32768);
        vol.write(o, IoBytes::copy_from(&d), false).await.unwrap();
        model[o as usize..o as usize + d.len()].copy_from_slice(&d);
    }
    assert!(vol.counters().write_waits.load(Relaxed) > 0, "the cache filled up");
    check(&vol, &model).await;
}

#[tokio::test]
async fn the_write_path_costs_one_metadata_write_per_blockset_touched() {
    let switch = PowerSwitch::new();
    let devs = drives(&switch, 3);
    let pool = create_pool(&devs).await;
    let vol = stria_tier::create(&pool, spec()).await.unwrap();
    vol.set_params(stria_tier::TierParams {
        start_percent: 100,
        stop_percent: 100,
        idle_ms: u64::MAX,
        ..vol.params()
    });
    let before = vol.counters().metadata_page_writes.load(Relaxed);
    for i in 0..40u64 {
        vol.write(i * 8192, IoBytes::copy_from(&[i as u8; 4096]), false).await.unwrap();
    }
    assert_eq!(vol.counters().metadata_page_writes.load(Relaxed) - before, 40);
}

use rand::Rng;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_sector_writes_into_one_block_all_survive() {
    // Eight 512-byte writes into each 4 KiB block, all in flight at once: each is a
    // read-modify-write of the same block, and none may undo another.
    let switch = PowerSwitch::new();
    let devs = drives(&switch, 5);
    let pool = create_pool(&devs).await;
    let vol = stria_tier::create(&pool, spec()).await.unwrap();
    always(&vol);
    for round in 0..20u8 {
        let writes = (0..4u64).flat_map(|block| {
            let vol = &vol;
            (0..8u64).map(move |sector| {
                let fill = round ^ (block * 8 + sector) as u8;
                async move {
                    vol.write(block * 4096 + sector * 512, IoBytes::copy_from(&[fill; 512]), false).await
                }
            })
        });
        for r in futures::future::join_all(writes).await {
            r.unwrap();
        }
        let back = vol.read(0, 4 * 4096).await.unwrap();
        for (i, sector) in back.chunks(512).enumerate() {
            let fill = round ^ i as u8;
            assert!(sector.iter().all(|&b| b == fill), "round {round}: sector {i} lost its write");
        }
    }
}

#[tokio::test]
async fn a_misplaced_capacity_block_is_detected_by_the_tier_checksum_and_never_returned() {
    // The capacity tier holds the wrong bytes for a block while its own (engine) checksums say
    // they are fine, as after a destage that wrote the wrong place: the tier's record CRC must
    // catch it, and the read fails instead of returning them.
    let switch = PowerSwitch::new();
    let devs = drives(&switch, 9);
    let pool = create_pool(&devs).await;
    let vol = stria_tier::create(&pool, spec()).await.unwrap();
    let mut rng = rng(11);
    let data = random_bytes(&mut rng, 64 << 10);
    vol.write(0, IoBytes::copy_from(&data), false).await.unwrap();
    vol.destage_all().await.unwrap();
    assert_eq!(&vol.read(0, data.len()).await.unwrap()[..], &data[..]);
    let wrong = random_bytes(&mut rng, 4096);
    vol.capacity_volume().write(8192, IoBytes::copy_from(&wrong), true).await.unwrap();
    // Reads touching the block fail (single block, spanning read, unaligned read)...
    for (offset, len) in [(8192u64, 4096usize), (0, 64 << 10), (8000, 300)] {
        let err = vol.read(offset, len).await.expect_err("the misplaced block must not be returned");
        assert!(err.to_string().contains("checksum"), "{err}");
    }
    // ...and the blocks around it still read back.
    assert_eq!(&vol.read(0, 8192).await.unwrap()[..], &data[..8192]);
    assert_eq!(&vol.read(12288, 4096).await.unwrap()[..], &data[12288..16384]);
}

/// An old copy of one drive put back (a fast drive carrying cache and metadata copies, or a
/// capacity drive): the pool leaves it out, every block reads the current data (from the good
/// mirror copy or from parity), and a scrub of the parts repairs nothing from the old copy.
#[tokio::test]
async fn an_old_copy_of_a_fast_or_capacity_drive_is_left_out() {
    for victim in [0usize, 1, 2, 5] {
        let switch = PowerSwitch::new();
        let devs = drives(&switch, 20 + victim as u64);
        let pool = create_pool(&devs).await;
        let vol = stria_tier::create(&pool, spec()).await.unwrap();
        let size = vol.size_bytes() as usize;
        vol.write(0, IoBytes::copy_from(&vec![0xaa; size]), false).await.unwrap();
        vol.destage_all().await.unwrap();
        vol.write(0, IoBytes::copy_from(&vec![0xaa; size / 2]), false).await.unwrap();
        vol.close().await;
        drop(vol);
        pool.close().await.unwrap();
        let old = reboot(&devs, 0);

        let devs = reboot(&devs, 0);
        let pool = open_pool(&devs).await;
        let vol = open_tiered(&pool).await;
        vol.write(0, IoBytes::copy_from(&vec![0xbb; size]), false).await.unwrap();
        vol.destage_all().await.unwrap();
        vol.write(0, IoBytes::copy_from(&vec![0xbb; size / 2]), false).await.unwrap();
        vol.flush().await.unwrap();
        vol.close().await;
        drop(vol);
        pool.close().await.unwrap();

        let mut restored = reboot(&devs, 0);
        restored[victim] = old[victim].clone();
        let found = restored
            .iter()
            .map(|d| stria_engine::FoundDrive { dev: d.clone(), path: format!("disk{}", restored.len()) })
            .collect();
        let pool = std::sync::Arc::new(stria_engine::Pool::open_skipping(found, false).await.unwrap());
        assert_eq!(pool.ignored_drives().len(), 1, "drive {victim}: {:?}", pool.ignored_drives());
        let vol = open_tiered(&pool).await;
        check(&vol, &vec![0xbb; size]).await;
        for part in ["tv.cache", "tv.meta", "tv.cap"] {
            let r = pool.scrub(part, |_, _| {}).await.unwrap();
            assert_eq!(
                (r.unrecoverable_blocks, r.parity_blocks_fixed, r.copy_blocks_fixed, r.inconsistent_blocks),
                (0, 0, 0, 0),
                "drive {victim}: {part}: {r:?}"
            );
        }
        check(&vol, &vec![0xbb; size]).await;
        vol.close().await;
    }
}
