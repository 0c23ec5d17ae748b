//! For every layout and every set of failed drives up to its tolerance, data reads back
//! byte-identical to a reference model (before and after degraded writes, and after a rebuild
//! onto replacement drives); one failure more gives I/O errors, never wrong data.

#![allow(clippy::cast_possible_truncation)] // 64-bit only, like the engine

use crate::common::*;
use stria_dev::PowerSwitch;
use stria_engine::{Layout, VolumeState};

const VOLUME_BYTES: u64 = 3 << 20;
const CHUNK: u64 = 16 << 10;

fn subsets(n: usize, max: usize) -> Vec<Vec<usize>> {
    let mut out = Vec::new();
    for mask in 1u32..(1 << n) {
        if (mask.count_ones() as usize) <= max {
            out.push((0..n).filter(|i| mask & (1 << i) != 0).collect());
        }
    }
    out
}

/// One more failure than `set`, in the same protection group (so it really exceeds tolerance).
fn one_too_many(layout: Layout, set: &[usize], n: usize) -> Vec<usize> {
    match layout {
        // Both copies of column 0.
        Layout::Raid10 { copies, .. } => (0..copies as usize).collect(),
        _ => {
            let mut s = set.to_vec();
            s.push((0..n).find(|i| !set.contains(i)).expect("a survivor"));
            s
        }
    }
}

#[tokio::test]
async fn every_layout_survives_every_tolerated_failure_set() {
    for (layout, n) in layouts() {
        let switch = PowerSwitch::new();
        let devs = drives(n, &switch, 7);
        let pool = create_pool(&devs).await;
        let vol = pool.create_volume(spec("v", VOLUME_BYTES, layout, CHUNK)).await.unwrap();
        let mut model = Model::new(VOLUME_BYTES as usize);
        let mut rng = rng(n as u64);
        for _ in 0..40 {
            let (o, d) = random_write(&mut rng, VOLUME_BYTES, vol.row_bytes());
            write(&vol, &mut model, o, d).await;
        }
        check(&vol, &model).await;
        pool.close().await.unwrap();

        let tolerance = layout.tolerance() as usize;
        for set in subsets(n, tolerance) {
            let devs = reboot(&devs, 1);
            let pool = open_pool(&devs).await.unwrap();
            let vol = pool.volume("v").unwrap();
            for &i in &set {
                devs[i].kill();
            }
            check(&vol, &model).await;
            check_block_status(&vol, &model).await;
            assert_eq!(vol.state(), VolumeState::Degraded, "{layout} with {set:?} failed");
            // Writes while degraded.
            let mut m2 = model.clone();
            let mut rng = crate::common::rng(100 + set.len() as u64);
            for _ in 0..15 {
                let (o, d) = random_write(&mut rng, VOLUME_BYTES, vol.row_bytes());
                write(&vol, &mut m2, o, d).await;
            }
            check(&vol, &m2).await;
        }

        if tolerance == 0 {
            let devs = reboot(&devs, 1);
            let pool = open_pool(&devs).await.unwrap();
            devs[1].kill();
            let errors = check_or_error(&pool.volume("v").unwrap(), &model).await;
            assert!(errors > 0, "{layout}: losing a drive must lose data");
            continue;
        }
        // One failure too many: errors, never wrong data.
        let devs2 = reboot(&devs, 1);
        let pool = open_pool(&devs2).await.unwrap();
        for i in one_too_many(layout, &(0..tolerance).collect::<Vec<_>>(), n) {
            devs2[i].kill();
        }
        let vol = pool.volume("v").unwrap();
        let errors = check_or_error(&vol, &model).await;
        assert!(errors > 0, "{layout}: one failure too many must give errors");
        assert_eq!(vol.state(), VolumeState::Failed);
    }
}

#[tokio::test]
async fn replacing_failed_drives_rebuilds_full_redundancy() {
    for (layout, n) in layouts().into_iter().filter(|(l, _)| l.tolerance() > 0) {
        let switch = PowerSwitch::new();
        let devs = drives(n, &switch, 11);
        let pool = create_pool(&devs).await;
        let vol = pool.create_volume(spec("v", VOLUME_BYTES, layout, CHUNK)).await.unwrap();
        let mut model = Model::new(VOLUME_BYTES as usize);
        let mut rng = rng(5);
        for _ in 0..30 {
            let (o, d) = random_write(&mut rng, VOLUME_BYTES, vol.row_bytes());
            write(&vol, &mut model, o, d).await;
        }
        // Fail as many drives as tolerated, replace them all, write during the rebuild.
        let tolerance = layout.tolerance() as usize;
        let mut replacements = Vec::new();
        for (slot, dev) in devs.iter().enumerate().take(tolerance) {
            dev.kill();
            pool.fail_drive(slot as u32, "test").await.unwrap();
        }
        // Degraded writes before the replacement arrives.
        for _ in 0..30 {
            let (o, d) = random_write(&mut rng, VOLUME_BYTES, vol.row_bytes());
            write(&vol, &mut model, o, d).await;
        }
        check(&vol, &model).await;
        for slot in 0..tolerance {
            let spare = drive(&format!("spare{slot}"), &switch, 50 + slot as u64);
            let new_slot = pool
                .replace_drive(slot as u32, new_drive(&spare, stria_engine::DriveClass::Capacity, ""))
                .await
                .unwrap();
            replacements.push((new_slot, spare));
        }
        assert_eq!(vol.state(), VolumeState::Rebuilding);
        // Before any row is rebuilt, status and data come from the surviving members.
        check(&vol, &model).await;
        check_block_status(&vol, &model).await;
        let mut progress = 0;
        let rebuild = pool.rebuild(|_| progress += 1);
        let writes = async {
            for _ in 0..10 {
                let (o, d) = random_write(&mut rng, VOLUME_BYTES, vol.row_bytes());
                write(&vol, &mut model, o, d).await;
                tokio::task::yield_now().await;
            }
        };
        let (r, ()) = tokio::join!(rebuild, writes);
        r.unwrap();
        assert!(progress > 0);
        assert_eq!(vol.state(), VolumeState::Healthy, "{layout}");
        check(&vol, &model).await;
        // The rebuilt drives carry real redundancy: lose every original survivor we can afford.
        for dev in &devs[tolerance..(2 * tolerance).min(n)] {
            dev.kill();
        }
        check(&vol, &model).await;
        let report = pool.scrub("v", |_, _| {}).await.unwrap();
        assert_eq!(report.unrecoverable_blocks, 0, "{layout}: {report:?}");
        assert_eq!(report.parity_blocks_fixed, 0, "{layout}: {report:?}");
    }
}

/// `drive fail` takes effect at once: from the moment the call returns, no read or write of any
/// layout touches the failed drive (nothing read from it earlier is served again), and the data
/// still reads back from the others.
#[tokio::test]
async fn a_failed_drive_is_not_touched_after_the_fail_returns() {
    use stria_dev::BlockDevice;
    for (layout, n) in layouts().into_iter().filter(|(l, _)| l.tolerance() > 0) {
        let switch = PowerSwitch::new();
        let devs = drives(n, &switch, 90);
        let pool = create_pool(&devs).await;
        let vol = pool.create_volume(spec("v", VOLUME_BYTES, layout, CHUNK)).await.unwrap();
        let mut model = Model::new(VOLUME_BYTES as usize);
        let mut rng = rng(9);
        write(&vol, &mut model, 0, random_bytes(&mut rng, VOLUME_BYTES as usize)).await;
        check(&vol, &model).await;
        pool.fail_drive(1, "test").await.unwrap();
        let before = devs[1].counters().snapshot();
        check(&vol, &model).await;
        write(&vol, &mut model, 4096, random_bytes(&mut rng, 256 << 10)).await;
        vol.flush().await.unwrap();
        check(&vol, &model).await;
        let after = devs[1].counters().snapshot().since(&before);
        assert_eq!(
            (after.read_ops, after.write_ops, after.flush_ops),
            (0, 0, 0),
            "{layout}: the failed drive was used after the fail returned"
        );
        assert_eq!(vol.state(), VolumeState::Degraded);
    }
}
