//! A log volume on a multi-threaded runtime (as `stria serve` runs it), in both cache modes,
//! with every read checked against a model of what was acknowledged. `write_back_race.rs`
//! checks that nothing panics and the live counts stay exact; this test checks the data:
//!
//! * three writers of the volume, each owning a third of the first 768 blocks, write (some
//!   FUA), zero, trim, flush and read back their own blocks;
//! * a writer of a clone does the same to the clone;
//! * beside them, on the same two threads: snapshots made and deleted (at once or in the
//!   background), their contents read and checked while the writers go on, rollbacks, clones
//!   made and deleted (racing their writer), snapshots and rollbacks of the clone, the volume
//!   and the clone grown and shrunk above the writers' blocks, the cache mode switched, with
//!   destage, GC and (in write-back) the committer running all the while.
//!
//! A snapshot made while writes are in flight may or may not hold each of them; the model says
//! exactly which versions it may hold (every version acknowledged before the snapshot was asked
//! for is in, every one begun after it returned is out), and each read narrows it to what it
//! found. At the end every block of the volume, the snapshots and the clone is read and
//! checked, then again after a clean close and reopen, and the live counts must be exact.
//!
//! `STRIA_THREADS_SECS=S` (default 3, per cache mode), `STRIA_THREADS_SEEDS=N` (default 1) and
//! `STRIA_THREADS_FIRST_SEED=F` set the run.
//!
//! The clone has a writer of its own too (`STRIA_THREADS_CLONE_WRITER=0` turns it off). It found
//! a fault (crash-consistency.md, "Bugs the crash tests found", 20): about one run in 60 of 6
//! seconds on a loaded machine, a block of the clone read as an older version than the clone's
//! last acknowledged write, because a table page load raced a write, a checkpoint and an
//! eviction of the same page and cached the older version.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::*;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use stria_dev::{IoBytes, PowerSwitch, block_crc};
use stria_engine::ErrorKind;
use stria_tier::TierError;
use stria_tier::log::{self, CacheMode, LogSpec, LogVolume};
use tokio::sync::RwLock;

const THREAD: &str = "lv-threads";
const BLOCK: u64 = 4096;
/// Blocks each head writer owns; the writers own the first `WRITERS * OWN` blocks.
const OWN: u64 = 256;
const WRITERS: u64 = 3;
const MODELLED: u64 = WRITERS * OWN;
/// The volume's size at create; it is resized between `MODELLED + 32` and twice this.
const BLOCKS: u64 = 1024;

static PANICKED: AtomicBool = AtomicBool::new(false);

#[test]
fn a_log_volume_on_two_threads_reads_back_every_acknowledged_write_in_both_cache_modes() {
    let (secs, seeds, first) = (
        env_u64("STRIA_THREADS_SECS", 3),
        env_u64("STRIA_THREADS_SEEDS", 1),
        env_u64("STRIA_THREADS_FIRST_SEED", 0),
    );
    note_panics_of(THREAD, &PANICKED);
    for seed in first..first + seeds {
        for mode in [CacheMode::WriteThrough, CacheMode::WriteBack] {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name(THREAD)
                .enable_all()
                .build()
                .unwrap();
            let summary = rt.block_on(run(seed, mode, Duration::from_secs(secs)));
            rt.shutdown_timeout(Duration::from_secs(5));
            assert!(!PANICKED.load(SeqCst), "seed {seed}, {mode:?}: a task of the volume panicked (above)");
            eprintln!("seed {seed}, {mode:?}: {summary}");
        }
    }
}

/// What a block may read as: one of these checksums, or anything (a write that failed may or
/// may not have landed).
#[derive(Debug, Clone, PartialEq)]
enum Val {
    Any,
    OneOf(Vec<u32>),
}

impl Val {
    fn one(crc: u32) -> Val {
        Val::OneOf(vec![crc])
    }

    fn admits(&self, crc: u32) -> bool {
        match self {
            Val::Any => true,
            Val::OneOf(v) => v.contains(&crc),
        }
    }

    fn union(&mut self, other: &Val) {
        match (&mut *self, other) {
            (Val::Any, _) => {}
            (_, Val::Any) => *self = Val::Any,
            (Val::OneOf(a), Val::OneOf(b)) => {
                for c in b {
                    if !a.contains(c) {
                        a.push(*c);
                    }
                }
            }
        }
    }
}

/// One version of a head block: begun at event `start`, acknowledged at `acked` (`u64::MAX`
/// while in flight).
#[derive(Debug, Clone)]
struct Version {
    start: u64,
    acked: u64,
    val: Val,
}

/// The head's blocks, each its history of versions (never empty), and the event clock.
struct Head {
    clock: AtomicU64,
    blocks: Vec<Mutex<Vec<Version>>>,
}

impl Head {
    fn new(zero: u32) -> Head {
        let first = || Mutex::new(vec![Version { start: 0, acked: 0, val: Val::one(zero) }]);
        Head { clock: AtomicU64::new(1), blocks: (0..MODELLED).map(|_| first()).collect() }
    }

    fn tick(&self) -> u64 {
        self.clock.fetch_add(1, SeqCst)
    }

    /// Starts a write of `vals` at `first`; returns its start event.
    fn begin(&self, first: u64, vals: &[Val]) -> u64 {
        let start = self.tick();
        for (i, v) in vals.iter().enumerate() {
            self.blocks[(first + i as u64) as usize].lock().unwrap().push(Version {
                start,
                acked: u64::MAX,
                val: v.clone(),
            });
        }
        start
    }

    /// Ends the write begun at `first` for `n` blocks: acknowledged, or failed (anything).
    fn end(&self, first: u64, n: u64, ok: bool) {
        let at = self.tick();
        for b in first..first + n {
            let mut h = self.blocks[b as usize].lock().unwrap();
            let last = h.last_mut().unwrap();
            last.acked = at;
            if !ok {
                last.val = Val::Any;
            }
        }
    }

    /// What block `b` reads as now (no write of it in flight: its writer asks, or all wait).
    fn now(&self, b: u64) -> Val {
        self.blocks[b as usize].lock().unwrap().last().unwrap().val.clone()
    }

    /// Block `b` was read as `crc` with no write of it in flight.
    fn settle(&self, b: u64, crc: u32) {
        self.blocks[b as usize].lock().unwrap().last_mut().unwrap().val = Val::one(crc);
    }

    /// Sets every block (all writers wait), as a rollback does.
    fn reset(&self, vals: &[Val]) {
        let at = self.tick();
        for (b, v) in vals.iter().enumerate() {
            self.blocks[b].lock().unwrap().push(Version { start: at, acked: at, val: v.clone() });
        }
    }

    /// What a snapshot asked for at event `asked` and returned at `returned` may hold: per
    /// block, the newest version acknowledged before `asked` and any begun before `returned`
    /// after it.
    fn snapshot(&self, asked: u64, returned: u64) -> Vec<Val> {
        self.blocks
            .iter()
            .map(|h| {
                let h = h.lock().unwrap();
                let base = h.iter().rposition(|v| v.acked < asked).expect("the first version");
                let mut val = h[base].val.clone();
                for v in &h[base + 1..] {
                    if v.start < returned {
                        val.union(&v.val);
                    }
                }
                val
            })
            .collect()
    }
}

/// A snapshot (of the volume or the clone) and what its blocks may hold.
struct Snap {
    name: String,
    id: u16,
    model: Vec<Val>,
}

/// The live clone, its model (writes to it and changes of it hold `CloneSide`'s lock), and its
/// snapshots.
struct CloneState {
    name: String,
    id: u16,
    model: Vec<Val>,
    snaps: Vec<Snap>,
    /// The snapshot it was made of, and the checksums its writer wrote to each block (for the
    /// message of a failed check).
    parent: String,
    written: Vec<Vec<u32>>,
    /// Each modelled block's changes of model: the event, why, and the new model.
    changes: Vec<Vec<(u64, &'static str, Val)>>,
}

impl CloneState {
    fn set(&mut self, b: u64, at: u64, why: &'static str, v: Val) {
        self.changes[b as usize].push((at, why, v.clone()));
        self.model[b as usize] = v;
    }
}

/// The control task's latest operations, for the message of a failed check.
type Events = Arc<Mutex<std::collections::VecDeque<String>>>;

fn event(events: &Events, e: String) {
    let mut ev = events.lock().unwrap();
    if ev.len() == 40 {
        ev.pop_front();
    }
    ev.push_back(e);
}

trait Positions {
    fn positions_of(self, crc: u32) -> Vec<usize>;
}

impl<'a, I: Iterator<Item = &'a u32>> Positions for I {
    fn positions_of(self, crc: u32) -> Vec<usize> {
        self.enumerate().filter(|&(_, &c)| c == crc).map(|(i, _)| i).collect()
    }
}

/// Where a checksum read from block `b` was seen before: among the head's versions, or the
/// clone's writes.
fn provenance(head: &Head, clone: &CloneState, b: u64, crc: u32) -> String {
    let h = head.blocks[b as usize].lock().unwrap();
    let in_head: Vec<String> = h
        .iter()
        .enumerate()
        .filter(|(_, v)| v.val.admits(crc) && v.val != Val::Any)
        .map(|(i, v)| {
            format!(
                "head version {i} of {} (begun at event {}, acknowledged at {})",
                h.len(),
                v.start,
                v.acked
            )
        })
        .collect();
    let w = &clone.written[b as usize];
    let in_clone: Vec<String> = w
        .iter()
        .enumerate()
        .filter(|&(_, &c)| c == crc)
        .map(|(i, _)| format!("clone write {i} of {}", w.len()))
        .collect();
    let expected: Vec<String> = match &clone.model[b as usize] {
        Val::Any => Vec::new(),
        Val::OneOf(v) => v
            .iter()
            .map(|&e| {
                let hs: Vec<usize> = h
                    .iter()
                    .enumerate()
                    .filter(|(_, v)| v.val.admits(e) && v.val != Val::Any)
                    .map(|(i, _)| i)
                    .collect();
                format!("{e:08x}: head versions {hs:?}, clone writes {:?}", w.iter().positions_of(e))
            })
            .collect(),
    };
    let recent: Vec<String> = h
        .iter()
        .enumerate()
        .rev()
        .take(8)
        .map(|(i, v)| format!("v{i} [{}, {}] {:?}", v.start, v.acked, v.val))
        .collect();
    format!(
        "clone {} (of snapshot {}); the checksum read is {:?} {:?}; the expected {:?}; the clone model's changes {:?}; the head's latest versions {:?}",
        clone.name, clone.parent, in_head, in_clone, expected, clone.changes[b as usize], recent
    )
}

type CloneSide = Arc<RwLock<Option<CloneState>>>;

fn refused(e: &TierError) -> bool {
    matches!(e, TierError::Invalid(_))
}

/// The checksums of `n` blocks read at `first` of `layer` (`None`: the head).
async fn read_crcs(vol: &LogVolume<Dev>, layer: Option<u16>, first: u64, n: u64) -> Vec<u32> {
    let (off, len) = (first * BLOCK, (n * BLOCK) as usize);
    let got = match layer {
        None => vol.read(off, len).await,
        Some(l) => vol.read_snapshot(l, off, len).await,
    };
    let got = got.unwrap_or_else(|e| panic!("a read of layer {layer:?} at block {first}: {e}"));
    got.chunks_exact(BLOCK as usize).map(block_crc).collect()
}

fn check(what: &str, b: u64, expect: &Val, crc: u32) {
    assert!(expect.admits(crc), "{what}, block {b}: read checksum {crc:08x}, the model allows {expect:?}");
}

/// Random contents of `n` blocks, and their checksums.
fn blocks(rng: &mut ChaCha8Rng, n: u64) -> (Vec<u8>, Vec<Val>) {
    let data = random_bytes(rng, (n * BLOCK) as usize);
    let vals = data.chunks_exact(BLOCK as usize).map(|d| Val::one(block_crc(d))).collect();
    (data, vals)
}

async fn run(seed: u64, mode: CacheMode, secs: Duration) -> String {
    let zero = block_crc(&[0u8; BLOCK as usize]);
    let switch = PowerSwitch::new();
    let devs = drives(&switch, seed);
    let pool = create_pool(&devs).await;
    let spec = LogSpec { cache_mode: mode, ..small_spec("lv", BLOCKS * BLOCK, 100 * 124 * BLOCK) };
    let vol = log::create(&pool, spec).await.unwrap();
    let end = Instant::now() + secs;
    let stop = move || Instant::now() >= end || PANICKED.load(SeqCst);
    let head = Arc::new(Head::new(zero));
    // Writers of the head hold it shared for each request; a rollback holds it alone.
    let rollbacks = Arc::new(RwLock::new(()));
    let clone: CloneSide = Arc::new(RwLock::new(None));
    let events: Events = Arc::default();
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let (vol, head, rollbacks) = (vol.clone(), head.clone(), rollbacks.clone());
        writers.push(tokio::spawn(async move {
            let mut rng = rng(seed * 10 + w);
            let (lo, mut ops) = (w * OWN, [0u64; 5]);
            while !stop() {
                let _writing = rollbacks.read().await;
                let n = rng.random_range(1..=4u64);
                let b = lo + rng.random_range(0..OWN - n + 1);
                match rng.random_range(0..20) {
                    0..=4 => {
                        let at = lo + rng.random_range(0..OWN - 8);
                        let crcs = read_crcs(&vol, None, at, 8).await;
                        for (i, crc) in crcs.into_iter().enumerate() {
                            let b = at + i as u64;
                            check(&format!("seed {seed}, {mode:?}: the volume"), b, &head.now(b), crc);
                            head.settle(b, crc);
                        }
                        ops[3] += 1;
                    }
                    5 | 6 => {
                        let trim = rng.random_bool(0.5);
                        head.begin(b, &vec![Val::one(zero); n as usize]);
                        let r = if trim {
                            vol.trim(b * BLOCK, n * BLOCK).await
                        } else {
                            vol.write_zeroes(b * BLOCK, n * BLOCK, false).await
                        };
                        match r {
                            Ok(()) => head.end(b, n, true),
                            Err(e) if e.kind() == ErrorKind::NoSpace => head.end(b, n, false),
                            Err(e) => panic!("seed {seed}, {mode:?}: a trim or zeroing of the volume: {e}"),
                        }
                        ops[1 + usize::from(!trim)] += 1;
                    }
                    _ => {
                        let (data, vals) = blocks(&mut rng, n);
                        head.begin(b, &vals);
                        match vol.write(b * BLOCK, IoBytes::copy_from(&data), rng.random_ratio(1, 20)).await {
                            Ok(()) => head.end(b, n, true),
                            Err(e) if e.kind() == ErrorKind::NoSpace => {
                                head.end(b, n, false);
                                tokio::time::sleep(Duration::from_millis(5)).await;
                            }
                            Err(e) => panic!("seed {seed}, {mode:?}: a write of the volume: {e}"),
                        }
                        ops[0] += 1;
                    }
                }
                if rng.random_ratio(1, 50) {
                    vol.flush().await.unwrap_or_else(|e| panic!("seed {seed}: a flush: {e}"));
                    ops[4] += 1;
                }
            }
            ops
        }));
    }
    if env_u64("STRIA_THREADS_CLONE_WRITER", 1) == 1 {
        let (vol, clone, head, events) = (vol.clone(), clone.clone(), head.clone(), events.clone());
        writers.push(tokio::spawn(async move {
            let mut rng = rng(seed * 10 + 7);
            let mut ops = [0u64; 5];
            while !stop() {
                let mut side = clone.write().await;
                let Some(c) = side.as_mut() else {
                    drop(side);
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    continue;
                };
                let b = rng.random_range(0..MODELLED - 8);
                if rng.random_ratio(1, 4) {
                    match vol.read_snapshot(c.id, b * BLOCK, 8 * BLOCK as usize).await {
                        Ok(got) => {
                            for (i, d) in got.chunks_exact(BLOCK as usize).enumerate() {
                                let (b, crc) = (b + i as u64, block_crc(d));
                                if !c.model[b as usize].admits(crc) {
                                    // Read again: a stale read or a lost write?
                                    let mut again = Vec::new();
                                    for _ in 0..3 {
                                        tokio::time::sleep(Duration::from_millis(20)).await;
                                        let r = vol.read_snapshot(c.id, b * BLOCK, BLOCK as usize).await;
                                        again.push(r.map(|d| format!("{:08x}", block_crc(&d))).map_err(|e| e.to_string()));
                                    }
                                    panic!(
                                        "seed {seed}, {mode:?}: clone {}, block {b}: read checksum {crc:08x} (read again: {again:?}), the model allows {:?}; {}; the latest operations: {:?}",
                                        c.name,
                                        c.model[b as usize],
                                        provenance(&head, c, b, crc),
                                        events.lock().unwrap()
                                    );
                                }
                                if c.model[b as usize] != Val::one(crc) {
                                    c.set(b, head.tick(), "read", Val::one(crc));
                                }
                            }
                            ops[3] += 1;
                        }
                        // Deleted under it.
                        Err(e) if e.kind() == ErrorKind::Closed => {}
                        Err(e) => panic!("seed {seed}, {mode:?}: a read of clone {}: {e}", c.name),
                    }
                    continue;
                }
                let (data, vals) = blocks(&mut rng, 2);
                match vol.write_to(c.id, b * BLOCK, IoBytes::copy_from(&data)).await {
                    Ok(()) => {
                        let at = head.tick();
                        for (j, v) in vals.iter().enumerate() {
                            c.set(b + j as u64, at, "write", v.clone());
                            if let Val::OneOf(crcs) = v {
                                c.written[b as usize + j].push(crcs[0]);
                            }
                        }
                        ops[0] += 1;
                    }
                    // Deleted under it (its model goes with it), or the space is full for a moment.
                    Err(e) if matches!(e.kind(), ErrorKind::NoSpace | ErrorKind::Closed) => {
                        let at = head.tick();
                        c.set(b, at, "failed write", Val::Any);
                        c.set(b + 1, at, "failed write", Val::Any);
                    }
                    Err(e) => panic!("seed {seed}, {mode:?}: a write of clone {}: {e}", c.name),
                }
            }
            ops
        }));
    }

    let mut rng = rng(seed * 10 + 9);
    let mut snaps: Vec<Snap> = Vec::new();
    let mut ops = std::collections::BTreeMap::<&str, u64>::new();
    let mut i = 0;
    while !stop() {
        i += 1;
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..15))).await;
        let op = match rng.random_range(0..16) {
            0..=2 => {
                if snaps.len() >= 3 {
                    let s = snaps.remove(0);
                    vol.delete_snapshot(&s.name).await.unwrap();
                    event(&events, format!("deleted {} ({})", s.name, s.id));
                }
                let name = format!("s{i}");
                let asked = head.tick();
                let rec = vol.create_snapshot(&name).await.unwrap();
                let returned = head.tick();
                event(&events, format!("made {name} ({}) between events {asked} and {returned}", rec.id));
                snaps.push(Snap { name, id: rec.id, model: head.snapshot(asked, returned) });
                "snapshot"
            }
            3 if !snaps.is_empty() => {
                let s = snaps.remove(rng.random_range(0..snaps.len()));
                event(&events, format!("deleting {} ({})", s.name, s.id));
                if rng.random_bool(0.5) {
                    vol.delete_snapshot(&s.name).await.unwrap();
                    "snapshot delete"
                } else {
                    vol.start_snapshot_delete(&s.name).await.unwrap();
                    vol.finish_deletes().await.unwrap();
                    "snapshot delete in the background"
                }
            }
            4..=5 if !snaps.is_empty() => {
                let k = rng.random_range(0..snaps.len());
                let s = &mut snaps[k];
                let at = rng.random_range(0..MODELLED - 16);
                let crcs = read_crcs(&vol, Some(s.id), at, 16).await;
                for (j, crc) in crcs.into_iter().enumerate() {
                    let b = at + j as u64;
                    check(
                        &format!("seed {seed}, {mode:?}: snapshot {}", s.name),
                        b,
                        &s.model[b as usize],
                        crc,
                    );
                    s.model[b as usize] = Val::one(crc);
                }
                "snapshot read"
            }
            6 if !snaps.is_empty() => {
                // The newest only; refused while it is kept for a clone, or of another size.
                let _alone = rollbacks.write().await;
                let s = snaps.last().unwrap();
                event(&events, format!("rolling back to {} ({})", s.name, s.id));
                match vol.rollback(&s.name).await {
                    Ok(_) => {
                        head.reset(&s.model);
                        "rollback"
                    }
                    Err(e) if refused(&e) => "rollback refused",
                    Err(e) => panic!("seed {seed}, {mode:?}: a rollback: {e}"),
                }
            }
            7 if !snaps.is_empty() => {
                let mut side = clone.write().await;
                if side.is_some() {
                    continue;
                }
                let s = &snaps[rng.random_range(0..snaps.len())];
                let name = format!("k{i}");
                let rec = vol.create_clone(&s.name, &name).await.unwrap();
                event(&events, format!("made clone {name} ({}) of {}", rec.id, s.name));
                *side = Some(CloneState {
                    name,
                    id: rec.id,
                    model: s.model.clone(),
                    snaps: Vec::new(),
                    parent: s.name.clone(),
                    written: vec![Vec::new(); MODELLED as usize],
                    changes: s.model.iter().map(|v| vec![(head.tick(), "made", v.clone())]).collect(),
                });
                "clone"
            }
            8 => {
                let name = match clone.read().await.as_ref() {
                    Some(c) => c.name.clone(),
                    None => continue,
                };
                // Unguarded: it races the clone's writer.
                vol.delete_clone(&name).await.unwrap();
                *clone.write().await = None;
                "clone delete"
            }
            9 => {
                let mut side = clone.write().await;
                let Some(c) = side.as_mut() else { continue };
                if c.snaps.len() >= 2 {
                    let s = c.snaps.remove(0);
                    vol.delete_clone_snapshot(&c.name, &s.name).await.unwrap();
                    event(&events, format!("deleted {} ({}) of clone {}", s.name, s.id, c.name));
                }
                let name = format!("c{i}");
                let rec = vol.create_clone_snapshot(&c.name, &name).await.unwrap();
                event(&events, format!("made {name} ({}) of clone {}", rec.id, c.name));
                c.snaps.push(Snap { name, id: rec.id, model: c.model.clone() });
                "clone snapshot"
            }
            10 => {
                let mut side = clone.write().await;
                let Some(c) = side.as_mut() else { continue };
                let Some(s) = c.snaps.last() else { continue };
                event(&events, format!("rolling clone {} back to {} ({})", c.name, s.name, s.id));
                match vol.rollback_clone(&c.name, &s.name).await {
                    Ok(_) => {
                        let (at, model) = (head.tick(), s.model.clone());
                        for (b, v) in model.into_iter().enumerate() {
                            c.set(b as u64, at, "rollback", v);
                        }
                        "clone rollback"
                    }
                    Err(e) if refused(&e) => "clone rollback refused",
                    Err(e) => panic!("seed {seed}, {mode:?}: a clone rollback: {e}"),
                }
            }
            11 => {
                let size = rng.random_range(MODELLED + 32..=2 * BLOCKS) * BLOCK;
                event(&events, format!("resizing to {} blocks", size / BLOCK));
                match vol.resize(size).await {
                    Ok(()) => "resize",
                    Err(e) if refused(&e) => "resize refused",
                    Err(e) => panic!("seed {seed}, {mode:?}: a resize to {size}: {e}"),
                }
            }
            12 => {
                let side = clone.read().await;
                let Some(c) = side.as_ref() else { continue };
                let size = rng.random_range(MODELLED + 32..=2 * BLOCKS) * BLOCK;
                event(&events, format!("resizing clone {} to {} blocks", c.name, size / BLOCK));
                match vol.resize_clone(&c.name, size).await {
                    Ok(()) => "clone resize",
                    Err(e) if refused(&e) => "clone resize refused",
                    Err(e) => panic!("seed {seed}, {mode:?}: a resize of clone {} to {size}: {e}", c.name),
                }
            }
            13 => {
                let to = if rng.random_bool(0.5) { CacheMode::WriteBack } else { CacheMode::WriteThrough };
                vol.set_cache_mode(to).await.unwrap();
                "cache mode"
            }
            _ => continue,
        };
        *ops.entry(op).or_default() += 1;
        event(&events, format!("{i}: {op} (event {})", head.tick()));
    }
    let mut writes = Vec::new();
    for w in writers {
        // A task of the volume that died leaves the writers waiting for cache space for good.
        match tokio::time::timeout(Duration::from_secs(30), w).await {
            Ok(done) => writes.push(done.unwrap()),
            Err(_) => panic!("seed {seed}, {mode:?}: a writer stalled (a task of the volume died?)"),
        }
    }
    assert!(!PANICKED.load(SeqCst), "seed {seed}, {mode:?}: a task of the volume panicked (above)");
    let clone = Arc::try_unwrap(clone).ok().unwrap().into_inner();
    vol.flush().await.unwrap();
    check_all(&format!("seed {seed}, {mode:?}, at the end"), &vol, &head, &snaps, clone.as_ref()).await;
    vol.destage_all().await.unwrap();
    assert!(vol.audit_live_counts().await.unwrap(), "seed {seed}, {mode:?}: the live counts are exact");
    vol.close().await;
    drop(vol);
    pool.close().await.unwrap();
    let pool = open_pool(&devs).await;
    let vol = open_log(&pool, "lv").await.unwrap();
    check_all(&format!("seed {seed}, {mode:?}, reopened"), &vol, &head, &snaps, clone.as_ref()).await;
    // Opened from the persisted table the counts may be over (never under) the map's.
    vol.audit_live_counts().await.unwrap_or_else(|why| panic!("seed {seed}, {mode:?}: reopened: {why}"));
    vol.close().await;
    pool.close().await.unwrap();
    format!(
        "writes, trims, zeroings, reads, flushes of the writers (the clone's last, if on) {writes:?}; {ops:?}"
    )
}

/// Reads every modelled block of the volume, its snapshots, the clone and the clone's snapshots.
async fn check_all(
    what: &str,
    vol: &LogVolume<Dev>,
    head: &Head,
    snaps: &[Snap],
    clone: Option<&CloneState>,
) {
    let crcs = read_crcs(vol, None, 0, MODELLED).await;
    for (b, crc) in crcs.into_iter().enumerate() {
        check(&format!("{what}: the volume"), b as u64, &head.now(b as u64), crc);
    }
    let mut layers: Vec<(&str, u16, &[Val])> =
        snaps.iter().map(|s| (&s.name[..], s.id, &s.model[..])).collect();
    if let Some(c) = clone {
        layers.push((&c.name, c.id, &c.model));
        layers.extend(c.snaps.iter().map(|s| (&s.name[..], s.id, &s.model[..])));
    }
    for (name, id, model) in layers {
        let crcs = read_crcs(vol, Some(id), 0, MODELLED).await;
        for (b, crc) in crcs.into_iter().enumerate() {
            check(&format!("{what}: {name}"), b as u64, &model[b], crc);
        }
    }
}
