//! Resizing log-structured volumes online (issue 39): a grow while writes go on keeps every byte
//! and the new blocks read as zeros, a shrink discards only the tail and gives its space back, a
//! volume grown and shrunk many times reopens with the same contents, and a power cut at any
//! device request of a grow or a shrink leaves the old size or the new one, never a volume that
//! does not open or a byte lost below the smaller of the two.

use std::sync::Arc;

use rand::Rng;

use crate::common::*;
use stria_dev::{IoBytes, PowerSwitch};
use stria_engine::Pool;
use stria_tier::log::{self, LogVolume};

const BLOCKS: u64 = 384;
const B: usize = 4096;

async fn new_volume(switch: &Arc<PowerSwitch>, seed: u64) -> (Vec<Dev>, Arc<Pool<Dev>>, Arc<LogVolume<Dev>>) {
    new_volume_with_space(switch, seed, small_space(BLOCKS)).await
}

/// A volume whose segment space may hold `space` bytes (snapshots need more than 1.5x).
async fn new_volume_with_space(
    switch: &Arc<PowerSwitch>,
    seed: u64,
    space: u64,
) -> (Vec<Dev>, Arc<Pool<Dev>>, Arc<LogVolume<Dev>>) {
    let devs = drives(switch, seed);
    let pool = create_pool(&devs).await;
    let vol = log::create(&pool, small_spec("lv", BLOCKS * 4096, space)).await.unwrap();
    (devs, pool, vol)
}

fn record_size(pool: &Pool<Dev>) -> u64 {
    pool.meta().tiered.iter().find(|t| t.name == "lv").expect("record").size_bytes
}

async fn reopen_clean(
    pool: Arc<Pool<Dev>>,
    vol: Arc<LogVolume<Dev>>,
    devs: &[Dev],
) -> (Arc<Pool<Dev>>, Arc<LogVolume<Dev>>) {
    vol.close().await;
    drop(vol);
    pool.close().await.unwrap();
    drop(pool);
    let pool = open_pool(devs).await;
    let vol = open_log(&pool, "lv").await.unwrap();
    (pool, vol)
}

async fn write_random(vol: &LogVolume<Dev>, model: &mut [u8], seed: u64, n: usize) {
    let mut rng = rng(seed);
    for _ in 0..n {
        let (o, data) = random_write(&mut rng, 0, model.len() as u64);
        vol.write(o, IoBytes::copy_from(&data), false).await.unwrap();
        model[o as usize..o as usize + data.len()].copy_from_slice(&data);
    }
}

#[tokio::test]
async fn a_log_volume_grows_and_shrinks_online_and_keeps_every_byte() {
    let switch = PowerSwitch::new();
    let (devs, pool, vol) = new_volume(&switch, 1).await;
    let mut model = random_bytes(&mut rng(1), BLOCKS as usize * B);
    vol.write(0, IoBytes::copy_from(&model), true).await.unwrap();
    // Grow to 1024 blocks while writes to the old blocks go on.
    let space_max = vol.status().space_max_bytes;
    let mut during = model.clone();
    let (grown, ()) = tokio::join!(vol.resize(1024 * 4096), write_random(&vol, &mut during, 2, 200));
    grown.unwrap();
    model = during;
    assert_eq!(vol.size_bytes(), 1024 * 4096);
    assert_eq!(record_size(&pool), 1024 * 4096, "the pool record follows the header");
    assert!(
        vol.status().space_max_bytes >= space_max * 1024 / BLOCKS,
        "the segment space's bound grew with the volume"
    );
    model.resize(1024 * B, 0);
    check(&vol, &model).await;
    // The whole larger volume takes data (past what the segment space was bounded by before).
    let fill = random_bytes(&mut rng(3), 1024 * B);
    vol.write(0, IoBytes::copy_from(&fill), true).await.unwrap();
    model.copy_from_slice(&fill);
    write_random(&vol, &mut model, 4, 300).await;
    vol.flush().await.unwrap();
    check(&vol, &model).await;
    let (pool, vol) = reopen_clean(pool, vol, &devs).await;
    assert_eq!(vol.size_bytes(), 1024 * 4096);
    assert!(vol.opened_from_table(), "the segment table moved with the growth and was written there");
    check(&vol, &model).await;

    // Shrink: the tail is discarded and its space given back; reads past the end are refused.
    let live_before = vol.status().allocated_bytes / 4096;
    vol.resize(600 * 4096).await.unwrap();
    assert_eq!(vol.size_bytes(), 600 * 4096);
    assert_eq!(record_size(&pool), 600 * 4096);
    model.truncate(600 * B);
    check(&vol, &model).await;
    assert!(vol.read(600 * 4096, 4096).await.is_err(), "a read past the new end is refused");
    let st = vol.status();
    let live = st.allocated_bytes / 4096;
    assert!(
        live < live_before && live <= 600,
        "{live} live blocks after the shrink (were {live_before}): {st:?}"
    );
    let (pool, vol) = reopen_clean(pool, vol, &devs).await;
    assert_eq!(vol.size_bytes(), 600 * 4096);
    check(&vol, &model).await;

    // Grow back: what was discarded reads as zeros.
    vol.resize(1000 * 4096).await.unwrap();
    model.resize(1000 * B, 0);
    check(&vol, &model).await;
    write_random(&vol, &mut model, 5, 100).await;
    let (pool, vol) = reopen_clean(pool, vol, &devs).await;
    check(&vol, &model).await;

    // With a snapshot it shrinks too: the snapshot keeps its size and every byte, and the
    // blocks only it holds stay allocated until it is deleted.
    let s = vol.create_snapshot("s").await.unwrap().id;
    let at_s = model.clone();
    let live_before = vol.status().allocated_bytes / 4096;
    vol.resize(700 * 4096).await.unwrap();
    assert_eq!(vol.size_bytes(), 700 * 4096);
    assert_eq!(record_size(&pool), 700 * 4096);
    model.truncate(700 * B);
    check(&vol, &model).await;
    assert!(vol.read(700 * 4096, 4096).await.is_err(), "a read past the new end is refused");
    assert_eq!(vol.layer_bytes(s), 1000 * 4096, "the snapshot keeps its size");
    assert!(read_layer(&vol, s).await == at_s, "the snapshot reads as it was made");
    let live = vol.status().allocated_bytes / 4096;
    assert!(
        live >= live_before,
        "the snapshot holds the discarded blocks: {live} live, {live_before} before"
    );
    write_random(&vol, &mut model, 6, 100).await;
    // Across a reopen; then a growth back reads zeros past 700 in the head, not the snapshot's.
    let (pool, vol) = reopen_clean(pool, vol, &devs).await;
    assert_eq!(vol.size_bytes(), 700 * 4096);
    check(&vol, &model).await;
    assert!(read_layer(&vol, s).await == at_s);
    let refused = vol.rollback("s").await.unwrap_err().to_string();
    assert!(refused.contains("does not change a volume's size"), "{refused}");
    vol.resize(1000 * 4096).await.unwrap();
    model.resize(1000 * B, 0);
    check(&vol, &model).await;
    write_random(&vol, &mut model, 7, 100).await;
    assert!(read_layer(&vol, s).await == at_s);
    // Shrunk again with the snapshot, which then goes: the map ends with the volume again.
    vol.resize(900 * 4096).await.unwrap();
    model.truncate(900 * B);
    vol.delete_snapshot("s").await.unwrap();
    let (pool, vol) = reopen_clean(pool, vol, &devs).await;
    check(&vol, &model).await;
    vol.resize(800 * 4096).await.unwrap();
    model.truncate(800 * B);
    vol.resize(1100 * 4096).await.unwrap();
    model.resize(1100 * B, 0);
    write_random(&vol, &mut model, 8, 100).await;
    let (pool, vol) = reopen_clean(pool, vol, &devs).await;
    check(&vol, &model).await;
    vol.close().await;
    pool.close().await.unwrap();
}

async fn read_layer(vol: &LogVolume<Dev>, layer: u16) -> Vec<u8> {
    vol.read_snapshot(layer, 0, vol.layer_bytes(layer) as usize).await.expect("read the layer").to_vec()
}

/// Snapshots and clones keep their sizes when their volume grows: each reads as it did, only up
/// to its own end; a clone of an older snapshot has that snapshot's size; a rollback to a
/// snapshot of another size is refused with nothing changed, one to a snapshot made after the
/// growth works; all of it across a reopen.
#[tokio::test]
async fn snapshots_and_clones_keep_their_sizes_when_their_volume_grows() {
    let switch = PowerSwitch::new();
    let (devs, pool, vol) = new_volume_with_space(&switch, 21, small_space(3 * BLOCKS)).await;
    let a = random_bytes(&mut rng(21), BLOCKS as usize * B);
    vol.write(0, IoBytes::copy_from(&a), true).await.unwrap();
    let s1 = vol.create_snapshot("s1").await.unwrap().id;
    let c1 = vol.create_clone("s1", "c1").await.unwrap().id;
    let mut c1_model = a.clone();
    write_random_to(&vol, c1, &mut c1_model, 22, 30).await;
    // The head changes some of the old blocks, then grows while writes go on.
    let mut head = a.clone();
    write_random(&vol, &mut head, 23, 50).await;
    let (grown, ()) = tokio::join!(vol.resize(900 * 4096), write_random(&vol, &mut head, 24, 100));
    grown.unwrap();
    head.resize(900 * B, 0);
    write_random(&vol, &mut head, 25, 300).await;
    check(&vol, &head).await;
    assert_eq!(vol.layer_bytes(s1), BLOCKS * 4096, "the snapshot keeps its size");
    assert!(read_layer(&vol, s1).await == a, "s1 reads as it was made");
    assert!(vol.read_snapshot(s1, BLOCKS * 4096, 4096).await.is_err(), "nothing past the snapshot's end");
    assert_eq!(vol.layer_bytes(c1), BLOCKS * 4096, "the clone keeps its size");
    assert!(read_layer(&vol, c1).await == c1_model);
    assert!(vol.write_to(c1, BLOCKS * 4096, IoBytes::copy_from(&[1u8; 4096])).await.is_err(), "nor writes");
    // A clone of s1 made now has s1's size; a snapshot made now has the new size.
    let c2 = vol.create_clone("s1", "c2").await.unwrap().id;
    assert_eq!(vol.layer_bytes(c2), BLOCKS * 4096);
    assert!(read_layer(&vol, c2).await == a);
    // A rollback to s1 (the newest, of another size) is refused, nothing changed.
    let refused = vol.rollback("s1").await.unwrap_err().to_string();
    assert!(refused.contains("does not change a volume's size"), "{refused}");
    check(&vol, &head).await;
    let s2 = vol.create_snapshot("s2").await.unwrap().id;
    let at_s2 = head.clone();
    assert_eq!(vol.layer_bytes(s2), 900 * 4096);
    write_random(&vol, &mut head, 26, 200).await;
    // A shrink with snapshots and clones: each keeps its size and what it reads.
    vol.resize(800 * 4096).await.unwrap();
    head.truncate(800 * B);
    check(&vol, &head).await;
    assert!(read_layer(&vol, s2).await == at_s2 && read_layer(&vol, s1).await == a);
    assert!(read_layer(&vol, c1).await == c1_model && read_layer(&vol, c2).await == a);
    assert_eq!(vol.layer_bytes(s2), 900 * 4096);
    // A rollback to s2 (900 blocks) waits for the volume to be that size again.
    let refused = vol.rollback("s2").await.unwrap_err().to_string();
    assert!(refused.contains("does not change a volume's size"), "{refused}");
    vol.resize(900 * 4096).await.unwrap();
    head.resize(900 * B, 0);
    check(&vol, &head).await;
    // Across a reopen (the snapshots' indexes reach the grown map), and a second growth.
    let (pool, vol) = reopen_clean(pool, vol, &devs).await;
    check(&vol, &head).await;
    assert!(read_layer(&vol, s1).await == a && read_layer(&vol, c1).await == c1_model);
    assert!(read_layer(&vol, s2).await == at_s2);
    vol.rollback("s2").await.unwrap();
    check(&vol, &at_s2).await;
    // A second growth; s1 deleted (kept hidden for its clones); the rest as they were.
    vol.resize(1200 * 4096).await.unwrap();
    head = at_s2.clone();
    head.resize(1200 * B, 0);
    write_random(&vol, &mut head, 27, 200).await;
    vol.delete_snapshot("s1").await.unwrap_or_else(|e| panic!("delete s1 (kept for clones): {e}"));
    assert!(read_layer(&vol, c1).await == c1_model && read_layer(&vol, c2).await == a);
    let (pool, vol) = reopen_clean(pool, vol, &devs).await;
    check(&vol, &head).await;
    assert!(read_layer(&vol, s2).await == at_s2 && read_layer(&vol, c1).await == c1_model);
    assert!(read_layer(&vol, c2).await == a);
    vol.close().await;
    pool.close().await.unwrap();
}

async fn write_random_to(vol: &LogVolume<Dev>, layer: u16, model: &mut [u8], seed: u64, n: usize) {
    let mut rng = rng(seed);
    for _ in 0..n {
        let (o, data) = random_write(&mut rng, 0, model.len() as u64);
        vol.write_to(layer, o, IoBytes::copy_from(&data)).await.unwrap();
        model[o as usize..o as usize + data.len()].copy_from_slice(&data);
    }
}

#[tokio::test]
async fn a_map_grown_in_many_runs_reopens_and_refuses_a_growth_its_header_cannot_say() {
    let switch = PowerSwitch::new();
    let (devs, pool, vol) = new_volume(&switch, 7).await;
    let mut model = vec![0u8; BLOCKS as usize * B];
    let mut size = BLOCKS;
    let mut refused = None;
    for i in 0..20u64 {
        // A page and a bit more each time: a new run of map pages and a larger segment table.
        match vol.resize((size + 300) * 4096).await {
            Ok(()) => {
                size += 300;
                model.resize(size as usize * B, 0);
                write_random(&vol, &mut model, 100 + i, 20).await;
            }
            Err(e) => {
                refused = Some((i, e.to_string()));
                break;
            }
        }
    }
    let (i, why) = refused.expect("a header holds a bounded number of runs");
    assert!(i >= 10, "refused after {i} growths: {why}");
    assert!(why.contains("grown as often as its header can say"), "{why}");
    assert_eq!(vol.size_bytes(), size * 4096, "a refused growth changes nothing");
    check(&vol, &model).await;
    let (pool, vol) = reopen_clean(pool, vol, &devs).await;
    check(&vol, &model).await;
    // A shrink needs no run: it still works.
    vol.resize(500 * 4096).await.unwrap();
    model.truncate(500 * B);
    let (pool, vol) = reopen_clean(pool, vol, &devs).await;
    check(&vol, &model).await;
    vol.close().await;
    pool.close().await.unwrap();
}

/// A power cut at every device request of a resize (found by counting a dry run's): the volume
/// opens at the old size or the new, its record agrees, every byte below the smaller size is
/// the model's, a grown tail reads as zeros and a shrunk tail that stayed reads as it was or as
/// zeros (a shrink asked for its discard). Then it takes writes across its size and reopens.
#[tokio::test]
async fn a_power_cut_at_any_request_of_a_resize_leaves_the_old_or_the_new_size_and_loses_nothing() {
    let mut checked = 0;
    for (from, to, snap) in
        [(BLOCKS, 900, false), (BLOCKS, 300, false), (BLOCKS, 900, true), (BLOCKS, 300, true)]
    {
        // The dry run: how many device requests the resize takes (the mover adds some).
        let ops = {
            let switch = PowerSwitch::new();
            let (_devs, pool, vol) = new_volume_with_space(&switch, 11, small_space(3 * BLOCKS)).await;
            let model = random_bytes(&mut rng(11), from as usize * B);
            vol.write(0, IoBytes::copy_from(&model), true).await.unwrap();
            if snap {
                vol.create_snapshot("s").await.unwrap();
            }
            let before = switch.ops_passed();
            vol.resize(to * 4096).await.unwrap();
            let ops = switch.ops_passed() - before;
            vol.close().await;
            pool.close().await.unwrap();
            ops
        };
        let mut outcomes = [0u32; 2];
        for cut in 0..=ops + 2 {
            let seed = 1000 + cut;
            let switch = PowerSwitch::new();
            let (devs, pool, vol) = new_volume_with_space(&switch, 11, small_space(3 * BLOCKS)).await;
            let model = random_bytes(&mut rng(11), from as usize * B);
            vol.write(0, IoBytes::copy_from(&model), true).await.unwrap();
            let snap_id = if snap { Some(vol.create_snapshot("s").await.unwrap().id) } else { None };
            switch.trip_after_ops(cut);
            let result = vol.resize(to * 4096).await;
            let (devs, _switch, pool, vol) = cut_and_reopen(&switch, vol, pool, &devs, seed).await;
            let size = vol.size_bytes() / 4096;
            assert!(
                size == from || size == to,
                "cut after {cut} requests ({result:?}): the volume has {size} blocks, neither {from} nor {to}"
            );
            assert_eq!(record_size(&pool), size * 4096, "cut after {cut}: the record agrees with the header");
            if result.is_ok() {
                assert_eq!(size, to, "cut after {cut}: a resize that returned is durable");
            }
            let got = vol.read(0, size as usize * B).await.unwrap();
            let low = from.min(to).min(size) as usize * B;
            if got[..low] != model[..low] {
                let i = (0..low).find(|&i| got[i] != model[i]).unwrap();
                panic!(
                    "{from} -> {to}, cut after {cut} ({result:?}, size {size}): byte {i} (block {}) changed",
                    i / B
                );
            }
            for b in (low / B)..size as usize {
                let blk = &got[b * B..(b + 1) * B];
                let was = model.get(b * B..(b + 1) * B);
                assert!(
                    blk.iter().all(|&x| x == 0) || Some(blk) == was,
                    "cut after {cut}: block {b} past the smaller size is neither zeros nor what it held"
                );
            }
            if let Some(id) = snap_id {
                assert!(read_layer(&vol, id).await == model, "cut after {cut}: the snapshot changed");
            }
            // It takes writes everywhere and keeps them.
            let mut now = got.to_vec();
            write_random(&vol, &mut now, seed, 50).await;
            let (pool, vol) = reopen_clean(pool, vol, &devs).await;
            check(&vol, &now).await;
            vol.close().await;
            pool.close().await.unwrap();
            checked += 1;
            outcomes[usize::from(size == to)] += 1;
        }
        // The cuts landed on both sides of the header write.
        assert!(
            outcomes[0] > 0 && outcomes[1] > 0,
            "{from} -> {to}: old/new sizes after the cuts {outcomes:?}"
        );
        println!(
            "{from} -> {to} blocks: {} cut points ({ops} requests), old size after {}, new after {}",
            ops + 3,
            outcomes[0],
            outcomes[1]
        );
    }
    assert!(checked > 10, "{checked} cut points");
}

fn clone_id(vol: &LogVolume<Dev>, name: &str) -> u16 {
    vol.clones().into_iter().find(|c| c.name == name).expect("the clone").id
}

/// A clone grows (up to its volume's size) and shrinks online: the blocks a growth adds read as
/// zeros although the volume holds data there, writes go on during the growth, a growth past
/// the volume's size is refused with nothing changed, a shrink discards the tail (a growth
/// after it shows zeros, neither the clone's old bytes nor its parent's), and the parent
/// snapshot and the volume keep theirs; all of it across reopens.
#[tokio::test]
async fn a_clone_grows_and_shrinks_online_and_the_blocks_it_gains_read_as_zeros() {
    let switch = PowerSwitch::new();
    let (devs, pool, vol) = new_volume_with_space(&switch, 31, small_space(4 * BLOCKS)).await;
    let a = random_bytes(&mut rng(31), BLOCKS as usize * B);
    vol.write(0, IoBytes::copy_from(&a), true).await.unwrap();
    let s1 = vol.create_snapshot("s1").await.unwrap().id;
    let c = vol.create_clone("s1", "c").await.unwrap().id;
    let mut cm = a.clone();
    write_random_to(&vol, c, &mut cm, 32, 30).await;
    // The volume grows and fills its new blocks: a clone's growth must not show them.
    vol.resize(900 * 4096).await.unwrap();
    let mut head = a.clone();
    head.resize(900 * B, 0);
    write_random(&vol, &mut head, 33, 400).await;
    let more = random_bytes(&mut rng(34), 516 * B);
    vol.write(BLOCKS * 4096, IoBytes::copy_from(&more), true).await.unwrap();
    head[BLOCKS as usize * B..].copy_from_slice(&more);
    let (grown, ()) =
        tokio::join!(vol.resize_clone("c", 700 * 4096), write_random_to(&vol, c, &mut cm, 35, 60));
    grown.unwrap();
    cm.resize(700 * B, 0);
    assert_eq!(vol.layer_bytes(c), 700 * 4096);
    assert!(read_layer(&vol, c).await == cm, "the clone after its growth (a tail of zeros)");
    write_random_to(&vol, c, &mut cm, 36, 200).await;
    assert!(read_layer(&vol, c).await == cm);
    // Past the volume's 900 blocks: the family's map grows, the volume keeps its size.
    vol.resize_clone("c", 1000 * 4096).await.unwrap();
    cm.resize(1000 * B, 0);
    assert_eq!((vol.layer_bytes(c), vol.size_bytes()), (1000 * 4096, 900 * 4096));
    assert_eq!(record_size(&pool), 900 * 4096, "the pool record keeps the volume's size");
    assert!(read_layer(&vol, c).await == cm, "the clone grown past the volume (zeros past 700)");
    for (b, seed) in [(920u64, 37), (999, 38), (901, 39)] {
        let data = random_bytes(&mut rng(seed), B);
        vol.write_to(c, b * 4096, IoBytes::copy_from(&data)).await.unwrap();
        cm[b as usize * B..(b as usize + 1) * B].copy_from_slice(&data);
    }
    assert!(read_layer(&vol, c).await == cm, "the clone's writes past the volume's end");
    check(&vol, &head).await;
    assert!(vol.read(900 * 4096, B).await.is_err(), "the volume reads nothing past its own end");
    assert!(vol.write(900 * 4096, IoBytes::copy_from(&[1u8; B]), true).await.is_err());
    let (pool, vol) = reopen_clean(pool, vol, &devs).await;
    assert_eq!((vol.layer_bytes(c), vol.layer_bytes(s1)), (1000 * 4096, BLOCKS * 4096));
    assert_eq!(vol.size_bytes(), 900 * 4096, "the volume's size after a reopen");
    assert!(read_layer(&vol, c).await == cm, "the grown clone after a reopen");
    check(&vol, &head).await;
    // The volume grows into the map pages the clone's growth added (zeros, though the clone
    // wrote there), then past them.
    vol.resize(950 * 4096).await.unwrap();
    head.resize(950 * B, 0);
    check(&vol, &head).await;
    let mine = random_bytes(&mut rng(40), B);
    vol.write(930 * 4096, IoBytes::copy_from(&mine), true).await.unwrap();
    head[930 * B..931 * B].copy_from_slice(&mine);
    vol.resize(1100 * 4096).await.unwrap();
    head.resize(1100 * B, 0);
    check(&vol, &head).await;
    assert!(read_layer(&vol, c).await == cm, "the clone after the volume grew past it");
    let (pool, vol) = reopen_clean(pool, vol, &devs).await;
    assert_eq!((vol.size_bytes(), record_size(&pool)), (1100 * 4096, 1100 * 4096));
    check(&vol, &head).await;
    assert!(read_layer(&vol, c).await == cm);
    // A shrink below its parent's size while it is written, then a growth: zeros past the cut.
    let (shrunk, ()) = tokio::join!(vol.resize_clone("c", 200 * 4096), async {
        for i in 0..50u64 {
            // Writes below the new end succeed; those past it may be refused once it shrank.
            let o = (i * 37 % 650) * 4096;
            let data = [i as u8 + 1; B];
            if vol.write_to(c, o, IoBytes::copy_from(&data)).await.is_ok() && o < 200 * 4096 {
                cm[o as usize..o as usize + B].copy_from_slice(&data);
            }
        }
    });
    shrunk.unwrap();
    cm.truncate(200 * B);
    assert!(vol.read_snapshot(c, 200 * 4096, 4096).await.is_err(), "nothing past the new end");
    assert!(vol.write_to(c, 200 * 4096, IoBytes::copy_from(&[1u8; B])).await.is_err());
    assert!(read_layer(&vol, c).await == cm);
    let (pool, vol) = reopen_clean(pool, vol, &devs).await;
    assert_eq!(vol.layer_bytes(c), 200 * 4096);
    assert!(read_layer(&vol, c).await == cm, "the shrunk clone after a reopen");
    vol.resize_clone("c", 500 * 4096).await.unwrap();
    cm.resize(500 * B, 0);
    assert!(read_layer(&vol, c).await == cm, "grown again: zeros where the tail was cut");
    // The parent and the volume kept theirs; the clone's delete frees what only it held.
    assert!(read_layer(&vol, s1).await == a);
    check(&vol, &head).await;
    let (pool, vol) = reopen_clean(pool, vol, &devs).await;
    assert!(read_layer(&vol, c).await == cm && read_layer(&vol, s1).await == a);
    check(&vol, &head).await;
    vol.delete_clone("c").await.unwrap();
    check(&vol, &head).await;
    vol.close().await;
    pool.close().await.unwrap();
}

/// A power cut at every device request of a clone's growth and of its shrink: the clone opens
/// at the old size or the new, a resize that returned is durable, every byte below the smaller
/// size is the model's, a shrunk tail that stayed reads as it was or as zeros, and a growth to
/// the volume's size afterwards shows zeros past whatever size the clone came back with.
#[tokio::test]
async fn a_power_cut_at_any_request_of_a_clone_resize_leaves_the_old_or_the_new_size() {
    let mut checked = 0;
    // To 700 blocks (under the volume's 900), to 200 (a shrink), to 1000 (past the volume: the
    // family's map grows first).
    for (to, writes) in [(700u64, 0u64), (200, 40), (1000, 20)] {
        let setup = |switch: Arc<PowerSwitch>| async move {
            let (devs, pool, vol) = new_volume_with_space(&switch, 41, small_space(4 * BLOCKS)).await;
            let a = random_bytes(&mut rng(41), BLOCKS as usize * B);
            vol.write(0, IoBytes::copy_from(&a), true).await.unwrap();
            vol.create_snapshot("s1").await.unwrap();
            let c = vol.create_clone("s1", "c").await.unwrap().id;
            let mut cm = a.clone();
            write_random_to(&vol, c, &mut cm, 42, writes as usize).await;
            vol.resize(900 * 4096).await.unwrap();
            let more = random_bytes(&mut rng(43), 516 * B);
            vol.write(BLOCKS * 4096, IoBytes::copy_from(&more), true).await.unwrap();
            (devs, pool, vol, cm)
        };
        let ops = {
            let switch = PowerSwitch::new();
            let (_devs, pool, vol, _) = setup(Arc::clone(&switch)).await;
            let before = switch.ops_passed();
            vol.resize_clone("c", to * 4096).await.unwrap();
            let ops = switch.ops_passed() - before;
            vol.close().await;
            pool.close().await.unwrap();
            ops
        };
        let mut outcomes = [0u32; 2];
        for cut in 0..=ops + 2 {
            let switch = PowerSwitch::new();
            let (devs, pool, vol, cm) = setup(Arc::clone(&switch)).await;
            switch.trip_after_ops(cut);
            let result = vol.resize_clone("c", to * 4096).await;
            let (devs, _switch, pool, vol) = cut_and_reopen(&switch, vol, pool, &devs, 2000 + cut).await;
            let c = clone_id(&vol, "c");
            let size = vol.layer_bytes(c) / 4096;
            assert_eq!(vol.size_bytes(), 900 * 4096, "cut after {cut}: the volume keeps its size");
            let more = random_bytes(&mut rng(43), 516 * B);
            assert!(
                vol.read(BLOCKS * 4096, 516 * B).await.unwrap()[..] == more[..],
                "cut after {cut}: the volume's blocks"
            );
            assert!(
                size == BLOCKS || size == to,
                "cut after {cut} ({result:?}): the clone has {size} blocks"
            );
            if result.is_ok() {
                assert_eq!(size, to, "cut after {cut}: a resize that returned is durable");
            }
            let got = read_layer(&vol, c).await;
            let low = BLOCKS.min(to) as usize * B;
            assert!(
                got[..low] == cm[..low],
                "cut after {cut} ({result:?}, size {size}): a byte below {low} changed"
            );
            for b in (low / B)..size as usize {
                let blk = &got[b * B..(b + 1) * B];
                assert!(
                    blk.iter().all(|&x| x == 0) || cm.get(b * B..(b + 1) * B) == Some(blk),
                    "cut after {cut}: block {b} is neither zeros nor what the clone held"
                );
            }
            // Grown to the volume's size (or past it): zeros past the size it came back with.
            vol.resize_clone("c", to.max(900) * 4096).await.unwrap();
            let all = read_layer(&vol, c).await;
            assert!(all[..size as usize * B] == got[..], "cut after {cut}: the growth changed a byte");
            assert!(
                all[size as usize * B..].iter().all(|&x| x == 0),
                "cut after {cut}: the growth from {size} blocks shows bytes past them"
            );
            vol.close().await;
            pool.close().await.unwrap();
            drop(devs);
            checked += 1;
            outcomes[usize::from(size == to)] += 1;
        }
        assert!(
            outcomes[0] > 0 && outcomes[1] > 0,
            "{BLOCKS} -> {to}: old/new sizes after the cuts {outcomes:?}"
        );
        println!(
            "clone {BLOCKS} -> {to} blocks: {} cut points ({ops} requests), old size after {}, new after {}",
            ops + 3,
            outcomes[0],
            outcomes[1]
        );
    }
    assert!(checked > 10, "{checked} cut points");
}

/// A clone of a snapshot made before its volume grew, grown past that size, reads zeros there
/// although a snapshot made after the growth holds what the volume wrote there: the older
/// snapshot took its own copies of those pages (empty past its end) when the volume first changed
/// them, so its view never falls through to the newer one's there. Before and after the clone's
/// first writes to those pages, and across a reopen.
#[tokio::test]
async fn a_clone_grown_past_its_parent_reads_zeros_though_a_newer_snapshot_holds_data_there() {
    let switch = PowerSwitch::new();
    let (devs, pool, vol) = new_volume_with_space(&switch, 51, small_space(5 * BLOCKS)).await;
    let a = random_bytes(&mut rng(51), BLOCKS as usize * B);
    vol.write(0, IoBytes::copy_from(&a), true).await.unwrap();
    vol.create_snapshot("s1").await.unwrap();
    vol.resize(900 * 4096).await.unwrap();
    let past = random_bytes(&mut rng(52), 516 * B);
    vol.write(BLOCKS * 4096, IoBytes::copy_from(&past), true).await.unwrap();
    vol.create_snapshot("s2").await.unwrap();
    // Every page past s1's end changes again: s2 (the newest) takes copies holding `past`.
    let again = random_bytes(&mut rng(53), 516 * B);
    vol.write(BLOCKS * 4096, IoBytes::copy_from(&again), true).await.unwrap();
    let c = vol.create_clone("s1", "c").await.unwrap().id;
    vol.resize_clone("c", 900 * 4096).await.unwrap();
    let mut cm = a.clone();
    cm.resize(900 * B, 0);
    assert!(read_layer(&vol, c).await == cm, "the grown clone shows zeros past s1's end");
    // A write in the boundary page and one past it copy pages: still zeros around them.
    write_random_to(&vol, c, &mut cm, 54, 40).await;
    for at in [BLOCKS - 1, BLOCKS + 1, 700] {
        let data = [at as u8 | 1; B];
        vol.write_to(c, at * 4096, IoBytes::copy_from(&data)).await.unwrap();
        cm[at as usize * B..(at as usize + 1) * B].copy_from_slice(&data);
    }
    assert!(read_layer(&vol, c).await == cm);
    let (pool, vol) = reopen_clean(pool, vol, &devs).await;
    let c = clone_id(&vol, "c");
    assert!(read_layer(&vol, c).await == cm, "after a reopen");
    vol.delete_clone("c").await.unwrap();
    let mut head = a.clone();
    head.extend_from_slice(&again);
    check(&vol, &head).await;
    vol.close().await;
    pool.close().await.unwrap();
}

/// What one layer must read: its bytes (its size is their length).
struct Layered {
    head: Vec<u8>,
    /// Snapshots of the head by name, oldest first.
    snaps: Vec<(String, Vec<u8>)>,
    /// Clones by name, with what each reads.
    clones: Vec<(String, Vec<u8>)>,
}

async fn check_layers(vol: &LogVolume<Dev>, m: &Layered, what: &str) {
    assert_eq!(vol.size_bytes(), m.head.len() as u64, "{what}: the head's size");
    check(vol, &m.head).await;
    for (name, bytes) in &m.snaps {
        let id = vol
            .snapshots()
            .into_iter()
            .find(|s| &s.name == name)
            .unwrap_or_else(|| panic!("{what}: {name}"))
            .id;
        assert_eq!(vol.layer_bytes(id), bytes.len() as u64, "{what}: snapshot {name}'s size");
        assert!(read_layer(vol, id).await == *bytes, "{what}: snapshot {name} reads as made");
    }
    for (name, bytes) in &m.clones {
        let id = clone_id(vol, name);
        assert_eq!(vol.layer_bytes(id), bytes.len() as u64, "{what}: clone {name}'s size");
        assert!(read_layer(vol, id).await == *bytes, "{what}: clone {name} reads its own");
    }
}

/// Seeded sequences of head writes (often into the tail a shrink will cut), snapshots, clones
/// and their writes, grows and shrinks of the head and of clones, snapshot deletes, rollbacks
/// and clean reopens: after every step every layer reads as its model, each at its own size.
/// (The log simulation resizes layered volumes amid power cuts, but its writers keep to the low
/// blocks; this puts data in the tails the shrinks discard, which the snapshots must keep.)
#[tokio::test]
async fn sequences_of_resizes_with_snapshots_and_clones_keep_every_layer() {
    let seeds = env_u64("STRIA_RESIZE_SEEDS", 12);
    // Where a long run starts (the seeds 0..N of an earlier run are not run again).
    let first = env_u64("STRIA_RESIZE_FIRST_SEED", 0);
    let mut shrinks_with_layers = 0;
    // Steps taken, by kind (a resize or rollback counts when it was done, not refused).
    let mut done = std::collections::BTreeMap::<&str, u32>::new();
    for seed in first..first + seeds {
        let switch = PowerSwitch::new();
        let (devs, mut pool, mut vol) =
            new_volume_with_space(&switch, 400 + seed, small_space(12 * BLOCKS)).await;
        let mut rng = rng(400 + seed);
        let mut m = Layered { head: vec![0; BLOCKS as usize * B], snaps: Vec::new(), clones: Vec::new() };
        let mut made = 0;
        for step in 0..30 {
            let what = format!("seed {seed} step {step}");
            match rng.random_range(0..10) {
                0..=2 => {
                    // Writes, half of them in the last quarter (where a shrink cuts).
                    let len = m.head.len() as u64;
                    for _ in 0..rng.random_range(5..30) {
                        let lo = if rng.random_bool(0.5) { len / 4 * 3 } else { 0 };
                        let (o, data) = random_write(&mut rng, lo, len);
                        vol.write(o, IoBytes::copy_from(&data), false).await.unwrap();
                        m.head[o as usize..o as usize + data.len()].copy_from_slice(&data);
                    }
                    *done.entry("write steps").or_default() += 1;
                }
                3 if m.snaps.len() < 4 => {
                    made += 1;
                    let name = format!("s{made}");
                    vol.create_snapshot(&name).await.unwrap_or_else(|e| panic!("{what}: snapshot: {e}"));
                    m.snaps.push((name, m.head.clone()));
                    *done.entry("snapshots").or_default() += 1;
                }
                4 if !m.snaps.is_empty() && m.clones.len() < 2 => {
                    let (snap, bytes) = m.snaps[rng.random_range(0..m.snaps.len())].clone();
                    made += 1;
                    let name = format!("k{made}");
                    vol.create_clone(&snap, &name).await.unwrap_or_else(|e| panic!("{what}: clone: {e}"));
                    let mut bytes = bytes;
                    write_random_to(&vol, clone_id(&vol, &name), &mut bytes, rng.random(), 10).await;
                    m.clones.push((name, bytes));
                    *done.entry("clones").or_default() += 1;
                }
                5 | 6 => {
                    // The head grows or shrinks (not below 64 blocks, not past the map's
                    // growth limits: a refusal must change nothing).
                    let blocks = (m.head.len() / B) as u64;
                    let to = if rng.random_bool(0.5) {
                        rng.random_range(64..blocks.max(65))
                    } else {
                        blocks + rng.random_range(1..=300)
                    };
                    let layered = !m.snaps.is_empty() || !m.clones.is_empty();
                    match vol.resize(to * 4096).await {
                        Ok(()) => {
                            if to < blocks && layered {
                                shrinks_with_layers += 1;
                            }
                            *done.entry("resizes").or_default() += 1;
                            m.head.resize(to as usize * B, 0);
                        }
                        Err(e) => assert!(to > blocks && layered, "{what}: resize {blocks} -> {to}: {e}"),
                    }
                }
                7 if !m.clones.is_empty() => {
                    // A clone grows (up to the volume's size) or shrinks.
                    let i = rng.random_range(0..m.clones.len());
                    let blocks = (m.clones[i].1.len() / B) as u64;
                    let to = rng.random_range(32..=((m.head.len() / B) as u64).max(33));
                    if vol.resize_clone(&m.clones[i].0, to * 4096).await.is_ok() {
                        m.clones[i].1.resize(to as usize * B, 0);
                        *done.entry("clone resizes").or_default() += 1;
                    } else {
                        assert!(to > blocks, "{what}: a clone's shrink {blocks} -> {to} refused");
                    }
                }
                8 if !m.snaps.is_empty() => {
                    if rng.random_bool(0.5) {
                        // Rollback to the newest snapshot: done when sizes agree, else refused.
                        let (name, bytes) = m.snaps.last().expect("one").clone();
                        match vol.rollback(&name).await {
                            Ok(_) => {
                                m.head = bytes;
                                *done.entry("rollbacks").or_default() += 1;
                            }
                            Err(e) => assert!(
                                bytes.len() != m.head.len() || e.to_string().contains("kept for its clones"),
                                "{what}: rollback: {e}"
                            ),
                        }
                    } else {
                        let i = rng.random_range(0..m.snaps.len());
                        let name = m.snaps.remove(i).0;
                        vol.delete_snapshot(&name)
                            .await
                            .unwrap_or_else(|e| panic!("{what}: delete {name}: {e}"));
                        *done.entry("snapshot deletes").or_default() += 1;
                    }
                }
                9 => {
                    (pool, vol) = reopen_clean(pool, vol, &devs).await;
                    *done.entry("reopens").or_default() += 1;
                }
                _ => continue,
            }
            check_layers(&vol, &m, &what).await;
        }
        let (p, v) = reopen_clean(pool, vol, &devs).await;
        check_layers(&v, &m, &format!("seed {seed}, at the end")).await;
        v.close().await;
        p.close().await.unwrap();
    }
    eprintln!("{seeds} seeds: {done:?}, {shrinks_with_layers} shrinks with layers");
    assert!(shrinks_with_layers >= seeds / 2, "{shrinks_with_layers} shrinks with layers in {seeds} seeds");
}
