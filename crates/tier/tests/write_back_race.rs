//! Write-back on a multi-threaded runtime (as `stria serve` runs it): writers of the volume,
//! a writer of its clone, snapshots, clones, snapshot and clone deletes, snapshots of the clone
//! and rollbacks, with destage, GC and the write-back committer on the same two worker threads.
//! The single-threaded simulations interleave only at awaits; here the committer's freeing runs
//! truly beside GC's and the other paths that settle the write-back queue, which is where the
//! crash loop's "cache ring: position ... released twice" came from (the committer had taken
//! frees off the queue and not yet applied them when GC, finding the queue empty under
//! `settle`, forgot the same blocks as an overcount; a segment's count went below 0 here).
//!
//! Every panic on the test's runtime threads fails it (the volume's tasks are spawned, so a
//! panic there would otherwise only stop them: the writers then stall, which fails it too), and
//! so does any write error other than ENOSPC; at the end the live counts must be exact.
//!
//! `STRIA_WB_RACE_SECS=S` (default 4) and `STRIA_WB_RACE_SEEDS=N` (default 1) set the run;
//! `STRIA_WB_RACE_FIRST_SEED=F` where the seeds start. Before the fix, about one 8-second run
//! in five failed.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::time::{Duration, Instant};

use crate::common::*;
use rand::Rng;
use stria_dev::{IoBytes, PowerSwitch};
use stria_engine::ErrorKind;
use stria_tier::log::{self, CacheMode, LogSpec};

const THREAD: &str = "wb-race";

static PANICKED: AtomicBool = AtomicBool::new(false);

#[test]
fn write_back_beside_snapshots_clones_destage_and_gc_on_two_threads_frees_each_place_once() {
    let (secs, seeds, first) = (
        env_u64("STRIA_WB_RACE_SECS", 4),
        env_u64("STRIA_WB_RACE_SEEDS", 1),
        env_u64("STRIA_WB_RACE_FIRST_SEED", 0),
    );
    note_panics_of(THREAD, &PANICKED);
    for seed in first..first + seeds {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name(THREAD)
            .enable_all()
            .build()
            .unwrap();
        let summary = rt.block_on(run(seed, Duration::from_secs(secs)));
        rt.shutdown_timeout(Duration::from_secs(5));
        assert!(!PANICKED.load(SeqCst), "seed {seed}: a task of the volume panicked (above)");
        eprintln!("seed {seed}: {summary}");
    }
}

async fn run(seed: u64, secs: Duration) -> String {
    const BLOCKS: u64 = 1024;
    let switch = PowerSwitch::new();
    let devs = drives(&switch, seed);
    let pool = create_pool(&devs).await;
    let spec =
        LogSpec { cache_mode: CacheMode::WriteBack, ..small_spec("lv", BLOCKS * 4096, 100 * 124 * 4096) };
    let vol = log::create(&pool, spec).await.unwrap();
    let end = Instant::now() + secs;
    let stop = move || Instant::now() >= end || PANICKED.load(SeqCst);
    let clone_id = Arc::new(AtomicU64::new(u64::MAX));
    let mut writers = Vec::new();
    for w in 0..3u64 {
        let vol = vol.clone();
        writers.push(tokio::spawn(async move {
            let mut rng = rng(seed * 10 + w);
            let mut done = 0u64;
            while !stop() {
                let b = rng.random_range(0..BLOCKS - 4);
                let len = rng.random_range(1..=4u64) * 4096;
                let data = random_bytes(&mut rng, len as usize);
                match vol.write(b * 4096, IoBytes::copy_from(&data), rng.random_ratio(1, 20)).await {
                    Ok(()) => done += 1,
                    Err(e) if e.kind() == ErrorKind::NoSpace => {
                        tokio::time::sleep(Duration::from_millis(5)).await
                    }
                    Err(e) => panic!("seed {seed}: a write of the volume: {e}"),
                }
                if rng.random_ratio(1, 50) {
                    vol.flush().await.unwrap_or_else(|e| panic!("seed {seed}: a flush: {e}"));
                }
            }
            done
        }));
    }
    {
        let (vol, clone_id) = (vol.clone(), clone_id.clone());
        writers.push(tokio::spawn(async move {
            let mut rng = rng(seed * 10 + 7);
            let mut done = 0;
            while !stop() {
                let c = clone_id.load(SeqCst);
                if c == u64::MAX {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    continue;
                }
                let b = rng.random_range(0..BLOCKS - 2);
                let data = random_bytes(&mut rng, 8192);
                match vol.write_to(c as u16, b * 4096, IoBytes::copy_from(&data)).await {
                    Ok(()) => done += 1,
                    // The clone was deleted under it, or the space is full for a moment.
                    Err(e) if matches!(e.kind(), ErrorKind::NoSpace | ErrorKind::Closed) => {}
                    Err(e) => panic!("seed {seed}: a write of clone {c}: {e}"),
                }
            }
            done
        }));
    }
    let mut rng = rng(seed * 10 + 9);
    let (mut snaps, mut clone, mut ops) = (Vec::<String>::new(), None::<String>, [0u64; 6]);
    let mut i = 0;
    while !stop() {
        i += 1;
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..20))).await;
        match rng.random_range(0..10) {
            0..=2 => {
                if snaps.len() >= 3 {
                    vol.delete_snapshot(&snaps.remove(0)).await.unwrap();
                    ops[1] += 1;
                }
                let name = format!("s{i}");
                vol.create_snapshot(&name).await.unwrap();
                snaps.push(name.clone());
                ops[0] += 1;
                if clone.is_none() && rng.random_bool(0.7) {
                    let id = vol.create_clone(&name, &format!("k{i}")).await.unwrap().id;
                    clone_id.store(u64::from(id), SeqCst);
                    clone = Some(format!("k{i}"));
                    ops[2] += 1;
                }
            }
            3..=4 if !snaps.is_empty() => {
                let k = rng.random_range(0..snaps.len());
                vol.delete_snapshot(&snaps.remove(k)).await.unwrap();
                ops[1] += 1;
            }
            5 if clone.is_some() => {
                clone_id.store(u64::MAX, SeqCst);
                vol.delete_clone(&clone.take().unwrap()).await.unwrap();
                ops[3] += 1;
            }
            6 if clone.is_some() => {
                vol.create_clone_snapshot(clone.as_ref().unwrap(), &format!("c{i}")).await.unwrap();
                ops[4] += 1;
            }
            // The newest only; refused while it is kept for a clone (nothing changes then).
            7 if !snaps.is_empty() && rng.random_ratio(1, 3) => {
                ops[5] += u64::from(vol.rollback(snaps.last().unwrap()).await.is_ok());
            }
            _ => {}
        }
    }
    // A committer that died leaves the writers waiting for cache space for good.
    let mut writes = Vec::new();
    for w in writers {
        match tokio::time::timeout(Duration::from_secs(30), w).await {
            Ok(done) => writes.push(done.unwrap()),
            Err(_) => panic!("seed {seed}: a writer stalled (a task of the volume died?)"),
        }
    }
    assert!(!PANICKED.load(SeqCst), "seed {seed}: a task of the volume panicked (above)");
    vol.flush().await.unwrap();
    vol.destage_all().await.unwrap();
    assert!(vol.audit_live_counts().await.unwrap(), "seed {seed}: the live counts are exact");
    vol.close().await;
    let st = format!(
        "writes {writes:?} (the volume's three, the clone's); {} snapshots made, {} deleted, {} clones made, {} deleted, {} snapshots of a clone, {} rollbacks",
        ops[0], ops[1], ops[2], ops[3], ops[4], ops[5]
    );
    drop(devs);
    st
}
