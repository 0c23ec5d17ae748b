//! Moving extents between drives (`drive add` + `pool rebalance`, `drive remove`) while the
//! volume is written: data stays exactly what was written, on every layout, across a clean
//! reopen and across a power cut right after a move (docs/design/pool-growth.md). The seeded
//! crash sequences (crash_sequences.rs) cut the power at random points of moves as well.

use std::sync::Arc;

use crate::common::*;
use stria_dev::PowerSwitch;
use stria_engine::{DriveClass, Layout, Pool};

const SIZE: u64 = 4 << 20;
const CHUNK: u64 = 16 << 10;

/// A pool of `n` drives with volume `v` of `layout` filled with random data, plus one more
/// drive added; returns the pool, every drive, and the model.
async fn grown_pool(layout: Layout, n: usize, seed: u64) -> (Pool<Dev>, Vec<Dev>, Model) {
    let switch = PowerSwitch::new();
    let mut devs = drives(n, &switch, seed);
    let pool = create_pool(&devs).await;
    let vol = pool.create_volume(spec("v", SIZE, layout, CHUNK)).await.expect("create");
    let mut model = Model::new(SIZE as usize);
    let mut rng = rng(seed);
    for _ in 0..40 {
        let (offset, data) = random_write(&mut rng, SIZE, CHUNK * 4);
        write(&vol, &mut model, offset, data).await;
    }
    let extra = drive("added", &switch, seed + 77);
    pool.add_drive(new_drive(&extra, DriveClass::Capacity, "")).await.expect("drive add");
    devs.push(extra);
    (pool, devs, model)
}

#[tokio::test]
async fn a_drained_drive_empties_while_the_volume_is_written_on_every_layout() {
    for (i, (layout, n)) in layouts().into_iter().enumerate() {
        let seed = 900 + i as u64;
        let (pool, devs, mut model) = grown_pool(layout, n, seed).await;
        let vol = pool.volume("v").expect("v");
        let victim = pool.meta().volumes[0].segments[0].members[0].slot;
        pool.drain_drive(victim).await.unwrap_or_else(|e| panic!("{layout}: drain: {e}"));
        let mut rng = rng(seed + 1);
        let writes = async {
            for _ in 0..60 {
                let (offset, data) = random_write(&mut rng, SIZE, CHUNK * 4);
                write(&vol, &mut model, offset, data).await;
                tokio::task::yield_now().await;
            }
        };
        let (report, ()) = tokio::join!(pool.rebalance(|_| {}), writes);
        let report = report.unwrap_or_else(|e| panic!("{layout}: rebalance: {e}"));
        assert_eq!((report.moves, report.abandoned, report.stuck.as_deref()), (1, 0, None), "{layout}");
        assert_eq!(pool.drained(), vec![victim], "{layout}: the drained drive holds nothing");
        check(&vol, &model).await;
        pool.remove_empty_drive(victim).await.unwrap_or_else(|e| panic!("{layout}: remove: {e}"));
        let scrub = pool.scrub("v", |_, _| {}).await.expect("scrub");
        assert_eq!(
            (scrub.blocks_repaired, scrub.parity_blocks_fixed, scrub.copy_blocks_fixed),
            (0, 0, 0),
            "{layout}"
        );
        pool.close().await.expect("close");
        // The removed drive is not a member any more; the others reassemble with the data.
        let rest: Vec<Dev> = devs
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != victim as usize)
            .map(|(_, d)| Arc::clone(d))
            .collect();
        let pool = open_pool(&rest).await.unwrap_or_else(|e| panic!("{layout}: reopen: {e}"));
        check(&pool.volume("v").expect("v"), &model).await;
        assert!(!pool.rebalance_pending(), "{layout}: nothing left to move");
        pool.close().await.expect("close");
    }
}

#[tokio::test]
async fn a_power_cut_right_after_a_move_loses_nothing() {
    for (i, (layout, n)) in layouts().into_iter().enumerate() {
        let seed = 950 + i as u64;
        let (pool, devs, model) = grown_pool(layout, n, seed).await;
        pool.volume("v").expect("v").flush().await.expect("flush");
        let victim = pool.meta().volumes[0].segments[0].members[0].slot;
        pool.drain_drive(victim).await.expect("drain");
        let report = pool.rebalance(|_| {}).await.expect("rebalance");
        assert_eq!(report.moves, 1, "{layout}");
        // No flush after the move: what it copied must already be durable.
        let images = reboot(&devs, seed);
        drop(pool);
        let pool = open_pool(&images).await.unwrap_or_else(|e| panic!("{layout}: reopen: {e}"));
        let vol = pool.volume("v").expect("v");
        let members = &pool.meta().volumes[0].segments[0].members;
        assert!(members.iter().all(|m| m.slot != victim), "{layout}: a member is still on the drained drive");
        check(&vol, &model).await;
        pool.close().await.expect("close");
    }
}

#[tokio::test]
async fn rebalance_spreads_a_grown_pool_evenly() {
    let switch = PowerSwitch::new();
    let devs = drives(6, &switch, 31);
    let pool = create_pool(&devs).await;
    let ec = Layout::Ec { data_shards: 4, parity_shards: 2 };
    let mut models = Vec::new();
    let mut rng = rng(31);
    for i in 0..4 {
        let vol = pool.create_volume(spec(&format!("v{i}"), SIZE, ec, CHUNK)).await.expect("create");
        let mut model = Model::new(SIZE as usize);
        for _ in 0..10 {
            let (offset, data) = random_write(&mut rng, SIZE, CHUNK * 4);
            write(&vol, &mut model, offset, data).await;
        }
        models.push(model);
    }
    assert!(!pool.rebalance_pending(), "nothing to do before drives are added");
    for j in 0..2 {
        let d = drive(&format!("added{j}"), &switch, 40 + j);
        pool.add_drive(new_drive(&d, DriveClass::Capacity, "")).await.expect("add");
    }
    pool.request_rebalance(0).await.expect("request");
    assert!(pool.rebalance_pending());
    let report = pool.rebalance(|_| {}).await.expect("rebalance");
    assert_eq!((report.moves, report.stuck), (6, None), "two new drives take three of 24 extents each");
    let meta = pool.meta();
    assert!(meta.rebalance.is_none(), "a finished rebalance is no longer pending");
    let mut per_drive = std::collections::BTreeMap::<u32, usize>::new();
    for v in &meta.volumes {
        for m in &v.segments[0].members {
            *per_drive.entry(m.slot).or_default() += 1;
            assert!(m.move_to.is_none() && m.moved_from.is_none(), "{m:?}");
        }
    }
    assert!(per_drive.len() == 8 && per_drive.values().all(|&c| c == 3), "{per_drive:?}");
    for (i, model) in models.iter().enumerate() {
        check(&pool.volume(&format!("v{i}")).expect("volume"), model).await;
    }
    pool.close().await.expect("close");
}

#[tokio::test]
async fn a_drive_failure_during_a_move_takes_it_back_and_nothing_is_lost() {
    // The destination fails mid-copy: the move is abandoned, the member stays complete where it
    // was, writes go on; once the failed drive is replaced the drain finishes.
    for (i, (layout, n)) in layouts().into_iter().filter(|(l, _)| l.tolerance() > 0).enumerate() {
        let seed = 990 + i as u64;
        let (pool, _devs, mut model) = grown_pool(layout, n, seed).await;
        let vol = pool.volume("v").expect("v");
        let victim = pool.meta().volumes[0].segments[0].members[0].slot;
        let added = pool.meta().drives.iter().map(|d| d.slot).max().expect("drives");
        pool.drain_drive(victim).await.expect("drain");
        pool.request_rebalance(2 << 20).await.expect("slow, so the failure lands mid-copy");
        let mut rng = rng(seed + 2);
        let fail_destination = async {
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            let moving = pool.rebalance_status().current.expect("a move is running");
            assert_eq!((moving.from_drive, moving.to_drive), (victim, added), "{layout}");
            assert!(moving.rows_done > 0 && moving.rows_done < moving.rows_total, "{layout}: {moving:?}");
            pool.fail_drive(added, "failed by the test").await.expect("fail");
            for _ in 0..20 {
                let (offset, data) = random_write(&mut rng, SIZE, CHUNK * 4);
                write(&vol, &mut model, offset, data).await;
            }
        };
        let (report, ()) = tokio::join!(pool.rebalance(|_| {}), fail_destination);
        let report = report.unwrap_or_else(|e| panic!("{layout}: rebalance: {e}"));
        assert!(report.moves == 0 && report.abandoned >= 1, "{layout}: {report:?}");
        let members = &pool.meta().volumes[0].segments[0].members;
        assert!(members.iter().all(|m| m.move_to.is_none()), "{layout}: the move was not taken back");
        assert!(members.iter().any(|m| m.slot == victim), "{layout}: the member left its drive");
        check(&vol, &model).await;
        // The failed destination is replaced (it holds nothing of the volume), then the drain
        // finishes onto the replacement.
        let spare = drive("spare", &PowerSwitch::new(), seed + 5);
        pool.replace_drive(added, new_drive(&spare, DriveClass::Capacity, "")).await.expect("replace");
        let report = pool.rebalance(|_| {}).await.unwrap_or_else(|e| panic!("{layout}: rebalance: {e}"));
        assert_eq!((report.moves, report.stuck.as_deref()), (1, None), "{layout}");
        assert_eq!(pool.drained(), vec![victim], "{layout}");
        check(&vol, &model).await;
        pool.close().await.expect("close");
    }
}
