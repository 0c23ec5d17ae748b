//! Volumes are created, resized and deleted within the pool's free space; bad requests get clear
//! errors and change nothing; zeroing, trimming and block status behave as NBD clients expect.

#![allow(clippy::cast_possible_truncation)] // 64-bit only, like the engine

use crate::common::*;
use stria_dev::{FaultConfig, IoBytes, PowerSwitch};
use stria_engine::{DriveClass, EngineError, Layout, VolumeError};

const EC42: Layout = Layout::Ec { data_shards: 4, parity_shards: 2 };

#[tokio::test]
async fn placement_errors_name_the_problem() {
    let switch = PowerSwitch::new();
    let devs = drives(5, &switch, 1);
    let pool = create_pool(&devs).await;
    let err = pool.create_volume(spec("v", 1 << 20, EC42, 64 << 10)).await.unwrap_err();
    assert_eq!(err.to_string(), "ec:4+2 needs 6 active capacity drives; the pool has 5");
    let err =
        pool.create_volume(spec("v", 1 << 40, Layout::Raid1 { copies: 2 }, 64 << 10)).await.unwrap_err();
    // In totals: what the whole needs against what the drives have, not the one placement unit
    // that found no room.
    assert!(
        matches!(err, EngineError::NoSpace(_))
            && err.to_string().starts_with(
                "not enough free space for volume v (raid1:2, 1 TiB): its 2 members need 1 TiB each on \
                 distinct capacity drives, 2 TiB in all, and the active capacity drives have "
            ),
        "{err}"
    );
    let small =
        pool.create_volume(spec("small", 1 << 20, Layout::Raid0 { width: 5 }, 64 << 10)).await.unwrap();
    let err = pool.resize_volume("small", 1 << 40).await.unwrap_err();
    assert!(
        err.to_string().starts_with("not enough free space for ")
            && err.to_string().contains(" more of volume small (raid0:5): its 5 members need "),
        "{err}"
    );
    assert_eq!(small.size_bytes(), 1 << 20, "the failed growth changed nothing");
    pool.delete_volume("small").await.unwrap();
    let mut fast = spec("f", 1 << 20, Layout::Raid1 { copies: 2 }, 64 << 10);
    fast.class = DriveClass::Fast;
    assert!(pool.create_volume(fast).await.unwrap_err().to_string().contains("0"));
    for bad in ["", "a/b", ".hidden", &"x".repeat(65)] {
        assert!(matches!(
            pool.create_volume(spec(bad, 1 << 20, Layout::Raid0 { width: 2 }, 64 << 10)).await,
            Err(EngineError::Invalid(_))
        ));
    }
    assert!(pool.create_volume(spec("odd", 1000, Layout::Raid0 { width: 2 }, 64 << 10)).await.is_err());
    assert!(pool.create_volume(spec("chunk", 1 << 20, Layout::Raid0 { width: 2 }, 3 << 10)).await.is_err());
    pool.create_volume(spec("ok", 1 << 20, Layout::Raid0 { width: 2 }, 64 << 10)).await.unwrap();
    assert!(matches!(
        pool.create_volume(spec("ok", 1 << 20, Layout::Raid0 { width: 2 }, 64 << 10)).await,
        Err(EngineError::VolumeExists(_))
    ));
    assert_eq!(pool.meta().volumes.len(), 1, "failed creates left nothing behind");
}

#[tokio::test]
async fn out_of_range_requests_are_errors_and_change_nothing() {
    let switch = PowerSwitch::new();
    let devs = drives(6, &switch, 2);
    let pool = create_pool(&devs).await;
    let vol = pool.create_volume(spec("v", 1 << 20, EC42, 16 << 10)).await.unwrap();
    let mut model = Model::new(1 << 20);
    write(&vol, &mut model, 0, vec![7u8; 1 << 20]).await;
    for (off, len) in [(1u64 << 20, 1usize), ((1 << 20) - 10, 11), (u64::MAX - 2, 5)] {
        assert!(matches!(vol.read(off, len).await, Err(VolumeError::OutOfRange { .. })));
        assert!(matches!(
            vol.write(off, IoBytes::zeroed(len), false).await,
            Err(VolumeError::OutOfRange { .. })
        ));
        assert!(matches!(
            vol.write_zeroes(off, len as u64, false, false).await,
            Err(VolumeError::OutOfRange { .. })
        ));
    }
    check(&vol, &model).await;
}

#[tokio::test]
async fn resize_grows_in_place_or_with_a_new_segment_and_shrinks() {
    for layout in [EC42, Layout::Raid10 { width: 3, copies: 2 }] {
        let switch = PowerSwitch::new();
        let devs = drives(6, &switch, 3);
        let pool = create_pool(&devs).await;
        let vol = pool.create_volume(spec("v", 1 << 20, layout, 16 << 10)).await.unwrap();
        // A neighbour right after it forces the second growth into a new segment.
        let mut model = Model::new(1 << 20);
        let mut rng = rng(3);
        write(&vol, &mut model, 0, random_bytes(&mut rng, 1 << 20)).await;
        pool.resize_volume("v", 2 << 20).await.unwrap();
        pool.create_volume(spec("neighbour", 1 << 20, layout, 16 << 10)).await.unwrap();
        pool.resize_volume("v", 5 << 20).await.unwrap();
        assert_eq!(vol.size_bytes(), 5 << 20);
        assert!(pool.meta().volume("v").unwrap().segments.len() >= 2, "{layout}: grew past a neighbour");
        model.bytes.resize(5 << 20, 0);
        check(&vol, &model).await; // the new space reads as zeros
        let tail = random_bytes(&mut rng, 3 << 20);
        write(&vol, &mut model, 2 << 20, tail).await;
        check(&vol, &model).await;
        pool.resize_volume("v", 3 << 20).await.unwrap();
        model.bytes.truncate(3 << 20);
        check(&vol, &model).await;
        assert!(matches!(vol.read(3 << 20, 1).await, Err(VolumeError::OutOfRange { .. })));
        // Shrunk-off space comes back as zeros when it grows again.
        pool.resize_volume("v", 4 << 20).await.unwrap();
        model.bytes.resize(4 << 20, 0);
        check(&vol, &model).await;
        // Everything survives a restart.
        pool.close().await.unwrap();
        let pool = open_pool(&reboot(&devs, 0)).await.unwrap();
        check(&pool.volume("v").unwrap(), &model).await;
    }
}

#[tokio::test]
async fn deleted_space_is_reused_and_reads_as_zeros() {
    let switch = PowerSwitch::new();
    let devs = drives(3, &switch, 4);
    let pool = create_pool(&devs).await;
    let vol = pool.create_volume(spec("a", 8 << 20, Layout::Raid0 { width: 3 }, 64 << 10)).await.unwrap();
    vol.write(0, IoBytes::copy_from(&vec![0xaa; 8 << 20]), false).await.unwrap();
    pool.delete_volume("a").await.unwrap();
    assert!(matches!(vol.read(0, 1).await, Err(VolumeError::Closed(_))));
    let b = pool.create_volume(spec("b", 8 << 20, Layout::Raid0 { width: 3 }, 64 << 10)).await.unwrap();
    let got = b.read(0, 8 << 20).await.unwrap();
    assert!(got.iter().all(|&x| x == 0), "a new volume must never show an old volume's data");
    pool.close().await.unwrap();
    let pool = open_pool(&reboot(&devs, 0)).await.unwrap();
    assert!(pool.volume("a").is_none());
    assert!(pool.volume("b").unwrap().read(0, 8 << 20).await.unwrap().iter().all(|&x| x == 0));
}

#[tokio::test]
async fn zeroes_trim_and_block_status() {
    for layout in [EC42, Layout::Raid1 { copies: 2 }] {
        let switch = PowerSwitch::new();
        let devs = drives(6, &switch, 5);
        let pool = create_pool(&devs).await;
        let vol = pool.create_volume(spec("v", 2 << 20, layout, 16 << 10)).await.unwrap();
        let status = vol.block_status(0, 2 << 20).await.unwrap();
        assert_eq!(status.len(), 1);
        assert!(status[0].unallocated, "a new volume is all holes");
        let mut model = Model::new(2 << 20);
        write(&vol, &mut model, 0, vec![1u8; 2 << 20]).await;
        assert!(!vol.block_status(0, 2 << 20).await.unwrap()[0].unallocated);
        let row = vol.row_bytes();
        // Fast zeroing works on whole stripes, and is refused (changing nothing) elsewhere.
        vol.write_zeroes(row, row, false, true).await.unwrap();
        model.write(row as usize, &vec![0; row as usize]);
        assert!(matches!(
            vol.write_zeroes(row * 3 + 1, 100, false, true).await,
            Err(VolumeError::NotCheap { .. })
        ));
        // Slow zeroing of an unaligned range writes zeros.
        vol.write_zeroes(row * 3 + 1, 100, false, false).await.unwrap();
        model.write((row * 3 + 1) as usize, &[0; 100]);
        check(&vol, &model).await;
        let st = vol.block_status(0, 4 * row).await.unwrap();
        let holes: u64 = st.iter().filter(|e| e.unallocated).map(|e| e.len_bytes).sum();
        assert_eq!(holes, row, "{layout}: exactly the fast-zeroed stripe is a hole: {st:?}");
        assert_eq!(st.iter().map(|e| e.len_bytes).sum::<u64>(), 4 * row);
        // Trim of whole units reads back as zeros; edges are left alone.
        vol.trim(6 * row - 10, row + 20).await.unwrap();
        model.write((6 * row) as usize, &vec![0; row as usize]);
        check(&vol, &model).await;
        // Unaligned status ranges are trimmed to the request.
        let st = vol.block_status(row + 5, 7).await.unwrap();
        assert_eq!(st.iter().map(|e| e.len_bytes).sum::<u64>(), 7);
        pool.flush().await.unwrap();
        pool.close().await.unwrap();
        let pool = open_pool(&reboot(&devs, 0)).await.unwrap();
        check(&pool.volume("v").unwrap(), &model).await;
    }
}

/// The engine twin of the tier's test of this name: eight 512-byte writes into each 4 KiB
/// block, and runs across block edges (and, with 4 KiB chunks, across row edges), all in flight
/// at once. Each is a read-modify-write of the blocks it touches, done under the stripe locks
/// of their rows, and none may undo another. The drives complete every request a seeded number
/// of polls after it was issued, so writers interleave at each read and write: without the
/// lock, two writers would read the same old block and the later one would write back the
/// earlier one's sector as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_sector_writes_into_one_block_all_survive() {
    const SECTOR: usize = 512;
    const SECTORS: usize = 64; // 8 blocks
    // Every sector written once a round: single sectors, plus sectors 7..10 (across the edge of
    // blocks 0 and 1) and 30..42 (block 3 sector 6 to block 5 sector 1: a whole block in the
    // middle, unaligned at both ends, across the edge of rows 0 and 1 of ec:4+2 in 4 KiB chunks).
    let runs = [(7usize, 3usize), (30, 12)];
    let mut pieces: Vec<(usize, usize)> = runs.to_vec();
    pieces.extend(
        (0..SECTORS).filter(|&s| !runs.iter().any(|&(a, n)| (a..a + n).contains(&s))).map(|s| (s, 1)),
    );
    let fill = |round: u8, sector: usize| round.wrapping_mul(101) ^ sector as u8;
    for (layout, drive_count) in [(Layout::Raid1 { copies: 2 }, 2), (EC42, 6)] {
        for chunk in [4u64 << 10, 64 << 10] {
            let switch = PowerSwitch::new();
            let devs = drives(drive_count, &switch, 17);
            for d in &devs {
                d.set_config(FaultConfig { completion_polls_max: 3, ..FaultConfig::default() });
            }
            let pool = create_pool(&devs).await;
            let vol = pool.create_volume(spec("v", 1 << 20, layout, chunk)).await.unwrap();
            for round in 0..20u8 {
                let mut writes = tokio::task::JoinSet::new();
                for &(first, count) in &pieces {
                    let vol = std::sync::Arc::clone(&vol);
                    let data: Vec<u8> =
                        (first..first + count).flat_map(|s| [fill(round, s); SECTOR]).collect();
                    writes.spawn(async move {
                        vol.write((first * SECTOR) as u64, IoBytes::copy_from(&data), false).await
                    });
                }
                while let Some(r) = writes.join_next().await {
                    r.expect("write task").unwrap();
                }
                let back = vol.read(0, SECTORS * SECTOR).await.unwrap();
                for (s, sector) in back.chunks(SECTOR).enumerate() {
                    assert!(
                        sector.iter().all(|&b| b == fill(round, s)),
                        "{layout}, {chunk}-byte chunks, round {round}: sector {s} lost its write"
                    );
                }
            }
            pool.close().await.unwrap();
        }
    }
}

/// A flush (and an ec FUA write) of one volume flushes that volume's drives only: on a pool of
/// eight drives with ten volumes, every drive written, a volume's flush leaves every drive that
/// holds none of its members unflushed and unwritten; a flush of the pool flushes them all.
#[tokio::test]
async fn a_flush_touches_only_the_volumes_own_drives() {
    use std::collections::BTreeSet;
    let switch = PowerSwitch::new();
    let devs = drives(8, &switch, 31);
    let pool = create_pool(&devs).await;
    let layouts = [
        Layout::Raid1 { copies: 2 },
        Layout::Raid0 { width: 1 },
        Layout::Ec { data_shards: 2, parity_shards: 1 },
    ];
    let mut vols = Vec::new();
    for i in 0..10 {
        let v = pool.create_volume(spec(&format!("v{i}"), 1 << 20, layouts[i % 3], 64 << 10)).await.unwrap();
        vols.push(v);
    }
    // The drive slots of each volume's members, from where its blocks live.
    let members = |v: &stria_engine::Volume<Dev>| -> BTreeSet<u32> {
        (0..256u64).flat_map(|b| v.locate(b * 4096).unwrap()).map(|l| l.slot).collect()
    };
    let counts = |f: fn(&stria_dev::DevCountersSnapshot) -> u64| -> Vec<(u32, u64)> {
        pool.drives().iter().map(|d| (d.slot(), f(&d.counters()))).collect()
    };
    let mut rng = rng(3);
    let mut strangers_seen = 0;
    for (i, v) in vols.iter().enumerate() {
        // Every volume written (partial ec stripes included), so every drive has something to
        // flush.
        for u in &vols {
            u.write(4096, IoBytes::copy_from(&random_bytes(&mut rng, 12 << 10)), false).await.unwrap();
        }
        let own = members(v);
        let flushes = counts(|s| s.flush_ops);
        let writes = counts(|s| s.write_ops);
        if i % 2 == 0 {
            v.flush().await.unwrap();
        } else {
            // A FUA write makes the volume's earlier writes durable on its own drives too.
            v.write(0, IoBytes::copy_from(&random_bytes(&mut rng, 4096)), true).await.unwrap();
        }
        // A volume on one drive has its flush epoch witnessed by one more drive of the pool (one
        // record written, not flushed: docs/design/stale-copies.md); no other drive is touched.
        let mut stranger_writes = 0;
        for ((slot, f0), (_, w0)) in flushes.iter().zip(&writes) {
            let (f1, w1) = (
                counts(|s| s.flush_ops).iter().find(|(s, _)| s == slot).unwrap().1,
                counts(|s| s.write_ops).iter().find(|(s, _)| s == slot).unwrap().1,
            );
            if own.contains(slot) {
                continue;
            }
            strangers_seen += 1;
            assert_eq!(f1 - f0, 0, "v{i} (members {own:?}): drive {slot} was flushed");
            stranger_writes += w1 - w0;
        }
        let witness = u64::from(own.len() == 1);
        assert!(
            stranger_writes <= witness,
            "v{i} (members {own:?}): {stranger_writes} writes to other drives (at most {witness} allowed)"
        );
        if i % 2 == 0 {
            let flushed: BTreeSet<u32> = counts(|s| s.flush_ops)
                .iter()
                .zip(&flushes)
                .filter(|((_, f1), (_, f0))| f1 > f0)
                .map(|((s, _), _)| *s)
                .collect();
            assert_eq!(flushed, own, "v{i}: the flush did not flush exactly its members");
        }
    }
    assert!(strangers_seen > 40, "the volumes shared every drive: the test proves nothing");
    // A flush of the pool still reaches every drive written.
    for u in &vols {
        u.write(0, IoBytes::copy_from(&random_bytes(&mut rng, 4096)), false).await.unwrap();
    }
    let before = counts(|s| s.flush_ops);
    pool.flush().await.unwrap();
    for ((slot, f0), (_, f1)) in before.iter().zip(counts(|s| s.flush_ops)) {
        assert!(f1 > *f0, "the pool flush left drive {slot} unflushed");
    }
    pool.close().await.unwrap();
}

/// A growth reads as zeros even when a power cut lands anywhere in it: the new rows are cleared
/// and flushed before the size that makes them readable is committed (it was committed first,
/// and a cut before the clearing left the new tail showing what its extents held before: here a
/// neighbour's data, given back by a shrink that does not clear, as log volumes shrink their
/// segment space). A cut at every device request of the growth; after the reboot the volume
/// has its old size or its new one, its old bytes, and zeros past them.
#[tokio::test]
async fn a_growth_cut_by_a_power_cut_anywhere_reads_as_zeros_past_the_old_end() {
    for layout in [Layout::Raid1 { copies: 2 }, EC42] {
        let setup = || async {
            let switch = PowerSwitch::new();
            let devs = drives(6, &switch, 9);
            let pool = create_pool(&devs).await;
            // The neighbour fills extents with data, then gives most of them back uncleared.
            let old = pool.create_volume(spec("old", 4 << 20, layout, 64 << 10)).await.unwrap();
            let junk = random_bytes(&mut rng(9), 4 << 20);
            old.write(0, IoBytes::copy_from(&junk), true).await.unwrap();
            old.flush().await.unwrap();
            pool.resize_volume_unzeroed("old", 1 << 20).await.unwrap();
            let v = pool.create_volume(spec("v", 1 << 20, layout, 64 << 10)).await.unwrap();
            let mut model = Model::new(1 << 20);
            write(&v, &mut model, 0, random_bytes(&mut rng(10), 1 << 20)).await;
            v.flush().await.unwrap();
            (switch, devs, pool, v, model)
        };
        let ops = {
            let (switch, _devs, pool, _v, _model) = setup().await;
            let before = switch.ops_passed();
            pool.resize_volume("v", 3 << 20).await.unwrap();
            switch.ops_passed() - before
        };
        for cut in 0..=ops + 1 {
            let (switch, devs, pool, v, mut model) = setup().await;
            switch.trip_after_ops(cut);
            let result = pool.resize_volume("v", 3 << 20).await;
            switch.trip();
            drop(v);
            drop(pool);
            let devs = reboot(&devs, cut);
            let pool = open_pool(&devs).await.unwrap();
            let v = pool.volume("v").unwrap();
            let size = v.size_bytes();
            assert!(size == 1 << 20 || size == 3 << 20, "{layout} cut {cut}: size {size}");
            if result.is_ok() {
                assert_eq!(size, 3 << 20, "{layout} cut {cut}: a growth that returned is durable");
            }
            model.bytes.resize(size as usize, 0);
            check(&v, &model).await;
        }
    }
}
