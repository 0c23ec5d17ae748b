//! Reassembly after restart from drives found in any order (and under other names), and refusal
//! of foreign, stale and duplicate drives and of a missing quorum, each with a clear message.

#![allow(clippy::cast_possible_truncation)] // 64-bit only, like the engine

use std::sync::Arc;

use crate::common::*;
use stria_dev::{BlockDevice, FaultConfig, FaultDevice, PowerSwitch};
use stria_engine::{EngineError, FoundDrive, Layout, Pool, VolumeState};

async fn pool_with_data(seed: u64) -> (Vec<Dev>, Model) {
    let switch = PowerSwitch::new();
    let devs = drives(6, &switch, seed);
    let pool = create_pool(&devs).await;
    let vol = pool
        .create_volume(spec("v", 1 << 20, Layout::Ec { data_shards: 4, parity_shards: 2 }, 16 << 10))
        .await
        .unwrap();
    let mut model = Model::new(1 << 20);
    let mut rng = rng(seed);
    write(&vol, &mut model, 0, random_bytes(&mut rng, 1 << 20)).await;
    pool.close().await.unwrap();
    (devs, model)
}

/// The same drives under new names (as after a reboot that renumbered the disks).
fn renamed(devs: &[Dev], prefix: &str) -> Vec<Dev> {
    devs.iter()
        .enumerate()
        .map(|(i, d)| {
            let image = d.crash_image(0).clone_contents(&format!("{prefix}{i}"));
            Arc::new(FaultDevice::with_config(image, FaultConfig::default(), 1))
        })
        .collect()
}

#[tokio::test]
async fn drives_found_in_any_order_under_any_name_reassemble() {
    let (devs, model) = pool_with_data(1).await;
    let mut shuffled = renamed(&devs, "nvme");
    shuffled.reverse();
    shuffled.swap(1, 4);
    let pool = open_pool(&shuffled).await.unwrap();
    let vol = pool.volume("v").unwrap();
    assert_eq!(vol.state(), VolumeState::Healthy);
    check(&vol, &model).await;
    assert_eq!(pool.recovery_report().rows_resynced, 0, "a clean close needs no resync");
}

#[tokio::test]
async fn a_foreign_drive_is_refused_by_name() {
    let (devs, _) = pool_with_data(2).await;
    let (other, _) = pool_with_data(3).await;
    let mut mixed = reboot(&devs, 0);
    mixed.push(reboot(&other, 0).remove(0));
    let err = open_pool(&mixed).await.unwrap_err();
    assert!(matches!(err, EngineError::ForeignDrive { .. }), "{err}");
    assert!(err.to_string().contains("belongs to pool"), "{err}");

    let blank = Arc::new(FaultDevice::new("blank", DRIVE_BYTES, 9));
    let mut with_blank = reboot(&devs, 0);
    with_blank.push(blank);
    let err = open_pool(&with_blank).await.unwrap_err();
    assert!(err.to_string().contains("no stria superblock"), "{err}");
}

#[tokio::test]
async fn a_stale_drive_is_refused_and_the_pool_opens_without_it() {
    let (devs, model) = pool_with_data(4).await;
    // The pool runs without drive 2 (failed), then drive 2 comes back with its old contents.
    let stale_copy = reboot(&devs[2..3], 0).remove(0);
    let live = reboot(&devs, 0);
    {
        let pool = open_pool(&live).await.unwrap();
        pool.fail_drive(2, "pulled").await.unwrap();
        pool.close().await.unwrap();
    }
    let mut back = reboot(&live, 0);
    back[2] = stale_copy;
    let err = open_pool(&back).await.unwrap_err();
    assert!(matches!(err, EngineError::StaleDrive { slot: 2, .. }), "{err}");
    assert!(err.to_string().contains("drive replace"), "the message says what to do: {err}");

    let without: Vec<Dev> =
        back.iter().enumerate().filter(|(i, _)| *i != 2).map(|(_, d)| d.clone()).collect();
    let pool = open_pool(&without).await.unwrap();
    let vol = pool.volume("v").unwrap();
    assert_eq!(vol.state(), VolumeState::Degraded);
    check(&vol, &model).await;
}

#[tokio::test]
async fn a_missing_drive_within_tolerance_is_marked_failed() {
    let (devs, model) = pool_with_data(5).await;
    let some = reboot(&devs[..5], 0);
    let pool = open_pool(&some).await.unwrap();
    assert_eq!(pool.volume("v").unwrap().state(), VolumeState::Degraded);
    let missing = pool.status().drives.into_iter().find(|d| d.id == 5).unwrap();
    assert_eq!(missing.state, "missing");
    check(&pool.volume("v").unwrap(), &model).await;
    pool.close().await.unwrap();
    // Drive 5 reappears: the pool went on without it, so it is stale now.
    let mut all = reboot(&some, 0);
    all.push(reboot(&devs[5..], 0).remove(0));
    assert!(matches!(open_pool(&all).await.unwrap_err(), EngineError::StaleDrive { slot: 5, .. }));
}

#[tokio::test]
async fn too_few_drives_is_no_quorum_unless_forced() {
    let (devs, _) = pool_with_data(6).await;
    let three = reboot(&devs[..3], 0);
    let err = open_pool(&three).await.unwrap_err();
    assert!(matches!(err, EngineError::NoQuorum { present: 3, total: 6, needed: 4, .. }), "{err}");
    // The engine says a forced open is possible but names no flag: only some commands of the
    // binary take `--force`, and the binary names one (see stria's no_quorum_message).
    let text = err.to_string();
    assert!(text.contains("forced open") && !text.contains("--"), "{text}");
    // Forced, it opens, and the volume (missing more than M members) is failed, not wrong.
    let found = three.iter().map(|d| FoundDrive { dev: d.clone(), path: d.name().into() }).collect();
    let pool: Pool<Dev> = Pool::open_with(found, true).await.unwrap();
    assert_eq!(pool.volume("v").unwrap().state(), VolumeState::Failed);
}

#[tokio::test]
async fn the_same_drive_twice_is_refused() {
    let (devs, _) = pool_with_data(7).await;
    let mut twice = reboot(&devs, 0);
    twice.push(reboot(&devs[..1], 0).remove(0));
    assert!(matches!(open_pool(&twice).await.unwrap_err(), EngineError::DuplicateDrive { .. }));
}

#[tokio::test]
async fn a_crash_in_the_middle_of_a_metadata_commit_leaves_a_usable_pool() {
    for cut in 0..40 {
        let switch = PowerSwitch::new();
        let devs = drives(6, &switch, 8);
        let pool = create_pool(&devs).await;
        let _ = pool.create_volume(spec("a", 1 << 20, Layout::Raid1 { copies: 2 }, 16 << 10)).await.unwrap();
        switch.trip_after_ops(cut);
        let created = pool
            .create_volume(spec("b", 1 << 20, Layout::Ec { data_shards: 4, parity_shards: 2 }, 16 << 10))
            .await;
        let pool = open_pool(&reboot(&devs, cut)).await.unwrap_or_else(|e| panic!("cut {cut}: {e}"));
        assert!(pool.volume("a").is_some(), "cut {cut}: an older committed volume vanished");
        if created.is_ok() {
            assert!(pool.volume("b").is_some(), "cut {cut}: an acknowledged volume vanished");
        }
    }
}

/// Copies of drives as they are now (a backup, or `cp` of a drive file while the pool is down).
fn copies(devs: &[Dev]) -> Vec<Dev> {
    devs.iter()
        .map(|d| Arc::new(FaultDevice::with_config(d.kill_image(), FaultConfig::default(), 1)))
        .collect()
}

fn found(devs: &[Dev]) -> Vec<FoundDrive<Dev>> {
    devs.iter().map(|d| FoundDrive { dev: Arc::clone(d), path: d.name().to_string() }).collect()
}

/// The outside check of issue 9: write 0xaa, stop cleanly, copy one drive; start, overwrite
/// with 0xbb, flush, stop; put the old copy back and start. On every layout and for every
/// drive: the old copy is refused by a strict open and left out by the daemon's open, the
/// volume reads 0xbb (or fails with an error when the layout cannot lose the drive), never
/// 0xaa, and a scrub repairs nothing from the old copy.
#[tokio::test]
async fn an_old_copy_of_a_drive_is_never_trusted_on_any_layout() {
    for (layout, n) in layouts() {
        for victim in 0..n {
            let switch = PowerSwitch::new();
            let devs = drives(n, &switch, 40 + victim as u64);
            let pool = create_pool(&devs).await;
            let vol = pool.create_volume(spec("v", 1 << 20, layout, 16 << 10)).await.unwrap();
            vol.write(0, stria_dev::IoBytes::copy_from(&vec![0xaa; 1 << 20]), false).await.unwrap();
            pool.close().await.unwrap();
            drop((vol, pool));
            let old = copies(&devs);

            let devs = copies(&devs);
            let pool = open_pool(&devs).await.unwrap();
            let vol = pool.volume("v").unwrap();
            vol.write(0, stria_dev::IoBytes::copy_from(&vec![0xbb; 1 << 20]), false).await.unwrap();
            vol.flush().await.unwrap();
            pool.close().await.unwrap();
            drop((vol, pool));

            let mut restored = copies(&devs);
            restored[victim] = Arc::clone(&old[victim]);
            let err = Pool::open(found(&restored)).await.unwrap_err();
            assert!(matches!(err, EngineError::StaleDrive { .. }), "{layout} drive {victim}: {err}");
            // Without the old copy the rest may be too few to trust the metadata (a two-way
            // mirror): then it is refused until forced.
            let pool = match Pool::open_skipping(found(&restored), false).await {
                Ok(pool) => pool,
                Err(EngineError::NoQuorum { present, total, .. }) => {
                    assert!(
                        present * 2 <= total,
                        "{layout} drive {victim}: {present} of {total} is a majority"
                    );
                    Pool::open_skipping(found(&restored), true).await.unwrap()
                }
                Err(e) => panic!("{layout} drive {victim}: {e}"),
            };
            assert_eq!(pool.ignored_drives().len(), 1, "{layout} drive {victim}: the old copy is left out");
            assert!(pool.ignored_drives()[0].1.contains("stale"), "{:?}", pool.ignored_drives());
            let vol = pool.volume("v").unwrap();
            let expect_data = layout.tolerance() > 0;
            for pass in ["before scrub", "after scrub"] {
                match vol.read(0, 1 << 20).await {
                    Ok(buf) => {
                        assert!(expect_data, "{layout} drive {victim}: read without the drive {pass}");
                        assert!(buf.iter().all(|&b| b == 0xbb), "{layout} drive {victim}: old data {pass}");
                    }
                    Err(e) => assert!(!expect_data, "{layout} drive {victim}: {pass}: {e}"),
                }
                if pass == "before scrub" {
                    let _ = pool.scrub("v", |_, _| {}).await;
                }
            }
            // The old copy's superblock was not raised: it is still refused after another open.
            pool.close().await.unwrap();
            drop((vol, pool));
            let again = Pool::open(found(&restored)).await.unwrap_err();
            assert!(
                matches!(again, EngineError::StaleDrive { .. } | EngineError::NoQuorum { .. }),
                "{again}"
            );
        }
    }
}

/// Sets both superblock copies of `dev` to on-disk format `version` (the bytes of format 1 and 2
/// superblocks are the same; only the version differs).
async fn set_superblock_version(dev: &Dev, version: u32) {
    let size = dev.size_bytes();
    for offset in [0, size - 4096] {
        let mut block = dev.read(offset, stria_dev::IoBuf::zeroed(4096)).await.unwrap().to_vec();
        assert_eq!(&block[..8], b"STRIA-SB");
        block[8..12].copy_from_slice(&version.to_le_bytes());
        let crc = crc32c::crc32c(&block[..4092]);
        block[4092..].copy_from_slice(&crc.to_le_bytes());
        dev.write(offset, stria_dev::IoBytes::copy_from(&block), true).await.unwrap();
    }
    dev.flush().await.unwrap();
}

async fn contents_crc(devs: &[Dev]) -> Vec<u32> {
    let mut out = Vec::new();
    for d in devs {
        out.push(crc32c::crc32c(&d.read(0, stria_dev::IoBuf::zeroed(DRIVE_BYTES as usize)).await.unwrap()));
    }
    out
}

#[tokio::test]
async fn a_pool_of_the_previous_on_disk_format_is_refused_with_the_way_out_and_left_untouched() {
    let (devs, _) = pool_with_data(4).await;
    let devs = reboot(&devs, 0);
    for d in &devs {
        set_superblock_version(d, 1).await;
    }
    let before = contents_crc(&devs).await;
    let err = open_pool(&devs).await.unwrap_err();
    assert!(matches!(err, EngineError::OldFormat { found: 1, wants: 2, .. }), "{err}");
    let message = err.to_string();
    for needle in ["older stria", "format 1", "format 2", "stria volume export", "Nothing was written"] {
        assert!(message.contains(needle), "`{needle}` missing from: {message}");
    }
    // Found by a directory scan (drives of other pools skipped): refused too, not skipped.
    let found = devs.iter().map(|d| FoundDrive { dev: Arc::clone(d), path: d.name().into() }).collect();
    let err = Pool::open_skipping(found, false).await.unwrap_err();
    assert!(matches!(err, EngineError::OldFormat { .. }), "{err}");
    assert_eq!(contents_crc(&devs).await, before, "the refusal wrote nothing");
    // Back to the current format, the pool opens (the refusal is the version, nothing else).
    for d in &devs {
        set_superblock_version(d, 2).await;
    }
    open_pool(&devs).await.unwrap().close().await.unwrap();
}
