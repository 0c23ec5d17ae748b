//! The map of log-structured volumes (`stria_tier::map`) under power cuts: after any sequence of
//! crashes and reopenings, every block reads back as the entry of its last update that
//! `MapStore::update` acknowledged, or of a later one, never an older one. Small log rings and
//! caches force checkpoints, ring wrap-arounds, evictions and re-reads of pages; large ones
//! leave the log alone to carry what was acknowledged.
//!
//! Half the seeds give the map a snapshot pool: snapshots are made between phases of updates,
//! workers also move blocks (as GC does) that the head or only a snapshot holds, and after every
//! recovery each snapshot whose making returned reads back exactly as the head was when it was
//! made (with the moves since), never with a later write; an overwrite frees a place only when no
//! snapshot holds it. Snapshots are also deleted between phases (and power cuts land in the
//! middle of deletes): the others keep their views, the entries a delete hands back for freeing
//! are exactly those no other layer holds, and a delete a cut interrupted is finished at open.
//!
//! `STRIA_MAP_SEEDS=N` sets the number of seeds (default 60); `STRIA_MAP_SEED=S` replays one.

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Totals over the seeds, printed at the end (and checked: the snapshot paths ran).
static SNAPSHOT_VIEWS_CHECKED: AtomicU64 = AtomicU64::new(0);
static FREES_HELD_BACK: AtomicU64 = AtomicU64::new(0);
static MOVES_OF_SNAPSHOT_ONLY_BLOCKS: AtomicU64 = AtomicU64::new(0);
static DELETES_DONE: AtomicU64 = AtomicU64::new(0);
static DELETES_CUT: AtomicU64 = AtomicU64::new(0);
static PAGES_HANDED_ON: AtomicU64 = AtomicU64::new(0);

use rand::Rng;
use stria_dev::{BlockDevice, FaultConfig, PowerSwitch};
use stria_engine::{DriveClass, FoundDrive, Layout, Pool, VolumeRole, VolumeSpec};
use stria_tier::layers::{LAYER_TABLE_BLOCKS, LayerKind, LayerRecord};
use stria_tier::map::{MapEntry, MapError, MapLayout, MapStore, Place, PoolLayout, Update};

use crate::common::*;

const BLOCKS: u64 = 3000;
const WORKERS: u64 = 3;

/// What each block of one layer may read back as: `versions[b][acked[b]..]` (index 0 is what
/// it held when the cycle began).
#[derive(Clone)]
struct Versions {
    versions: Vec<Vec<MapEntry>>,
    acked: Vec<usize>,
}

impl Versions {
    fn new(now: Vec<MapEntry>) -> Versions {
        Versions { acked: vec![0; now.len()], versions: now.into_iter().map(|e| vec![e]).collect() }
    }

    fn latest(&self, b: u64) -> MapEntry {
        *self.versions[b as usize].last().expect("one version at least")
    }

    fn ack(&mut self, b: u64, e: MapEntry) {
        let b = b as usize;
        let at = self.versions[b].iter().rposition(|x| *x == e).expect("issued");
        self.acked[b] = self.acked[b].max(at);
    }

    /// Checks `got` against what may be read back and makes it the new baseline.
    fn settle(&mut self, got: Vec<MapEntry>, what: &str) {
        for (b, got) in got.into_iter().enumerate() {
            let allowed = &self.versions[b][self.acked[b]..];
            assert!(
                allowed.contains(&got),
                "{what}: block {b} reads {got:?}, acknowledged {:?}, allowed {allowed:?}",
                self.versions[b][self.acked[b]]
            );
            self.versions[b] = vec![got];
            self.acked[b] = 0;
        }
    }
}

/// A snapshot the model knows: `durable` once its making returned.
struct SnapModel {
    name: String,
    id: Option<u16>,
    durable: bool,
    /// Its delete began and did not return: it may be gone after a cut.
    deleting: bool,
    view: Versions,
}

struct Model {
    head: Versions,
    snaps: Vec<SnapModel>,
    next: u64,
}

impl Model {
    fn entry(&mut self) -> MapEntry {
        self.next += 1;
        let n = self.next;
        MapEntry { place: Place::Segment(n), crc: n as u32, seq: n as u32 }
    }

    /// The snapshots present in the map now (made this cycle or found at open).
    fn live_snaps(&mut self) -> impl Iterator<Item = &mut SnapModel> {
        self.snaps.iter_mut().filter(|s| s.id.is_some())
    }

    /// Checks places a delete of snapshot `gone` (an index of `snaps`, or none at open) handed
    /// back for freeing: no other layer holds them.
    fn check_freed(&self, freed: &[(u64, MapEntry)], gone: Option<usize>, what: &str) {
        for (block, e) in freed {
            let b = *block;
            assert!(matches!(e.place, Place::Segment(_)), "{what}: freed {e:?}, not a place");
            assert!(self.head.latest(b) != *e, "{what}: freed {e:?}, which the head holds for block {b}");
            for (i, s) in self.snaps.iter().enumerate() {
                if Some(i) != gone && s.id.is_some() && !s.deleting {
                    assert!(s.view.latest(b) != *e, "{what}: freed {e:?}, which snapshot {} holds", s.name);
                }
            }
        }
    }
}

fn record(name: &str, kind: LayerKind) -> LayerRecord {
    LayerRecord::named(name, kind, BLOCKS * 4096)
}

/// Worker `w` updates blocks of its own in `window` (a range of blocks).
async fn worker(store: &MapStore<Dev>, model: &RefCell<Model>, seed: u64, w: u64, window: (u64, u64)) {
    let mut rng = rng(seed ^ (w + 1).wrapping_mul(0x9e37_79b9));
    for _ in 0..rng.random_range(10..60) {
        if rng.random_bool(0.2) && !move_some(store, model, seed, w, &mut rng).await {
            return;
        }
        let n = rng.random_range(1..40);
        let mut updates = Vec::new();
        let mut replaced = Vec::new();
        {
            let mut m = model.borrow_mut();
            for _ in 0..n {
                // Each worker owns the blocks b % WORKERS == w: per block, issue order is
                // apply order.
                let block = rng.random_range(window.0 / WORKERS..window.1 / WORKERS) * WORKERS + w;
                let entry = m.entry();
                replaced.push(m.head.latest(block));
                m.head.versions[block as usize].push(entry);
                updates.push(Update { block, entry, expect: None });
            }
        }
        match store.update(&updates).await {
            Ok(applied) => {
                let mut m = model.borrow_mut();
                for ((u, got), before) in updates.iter().zip(applied).zip(replaced) {
                    let got =
                        got.unwrap_or_else(|| panic!("seed {seed}: an unconditional update did not apply"));
                    // What a snapshot holds is never handed back for freeing; the rest is.
                    let held = m.live_snaps().any(|s| s.view.latest(u.block) == before);
                    let want = if held { MapEntry::UNALLOCATED } else { before };
                    if held && before != MapEntry::UNALLOCATED {
                        FREES_HELD_BACK.fetch_add(1, Relaxed);
                    }
                    assert_eq!(
                        got, want,
                        "seed {seed}: overwriting block {} (a snapshot holds it: {held})",
                        u.block
                    );
                    m.head.ack(u.block, u.entry);
                }
            }
            Err(_) => return, // the power went out
        }
        if rng.random_bool(0.05) && store.checkpoint().await.is_err() {
            return;
        }
    }
}

/// Moves one block of worker `w` the way GC does: a place the head or a snapshot holds goes
/// to a new place in every layer holding it. Returns false when the power went out.
async fn move_some(
    store: &MapStore<Dev>,
    model: &RefCell<Model>,
    seed: u64,
    w: u64,
    rng: &mut impl Rng,
) -> bool {
    let (block, from, to) = {
        let mut m = model.borrow_mut();
        let block = rng.random_range(0..BLOCKS / WORKERS) * WORKERS + w;
        let mut held: Vec<MapEntry> = vec![m.head.latest(block)];
        held.extend(m.live_snaps().map(|s| s.view.latest(block)));
        held.retain(|e| matches!(e.place, Place::Segment(_)));
        if held.is_empty() {
            return true;
        }
        let from = held[rng.random_range(0..held.len())];
        let n = m.entry();
        let to = MapEntry { place: n.place, ..from };
        if m.head.latest(block) == from {
            m.head.versions[block as usize].push(to);
        }
        for s in m.live_snaps() {
            if s.view.latest(block) == from {
                s.view.versions[block as usize].push(to);
            }
        }
        (block, from, to)
    };
    match store.update(&[Update { block, entry: to, expect: Some(from.place) }]).await {
        Ok(applied) => {
            assert_eq!(applied, vec![Some(from)], "seed {seed}: moving block {block} from {from:?}");
            let mut m = model.borrow_mut();
            if m.head.latest(block) != to {
                MOVES_OF_SNAPSHOT_ONLY_BLOCKS.fetch_add(1, Relaxed);
            }
            if m.head.latest(block) == to {
                m.head.ack(block, to);
            }
            for s in m.live_snaps() {
                if s.view.latest(block) == to {
                    s.view.ack(block, to);
                }
            }
            true
        }
        Err(_) => false,
    }
}

async fn run_seed(seed: u64) {
    let mut rng = rng(seed);
    let switch = PowerSwitch::new();
    let mut devs = drives(&switch, seed);
    // Small rings wrap (forcing checkpoints) all the time; large ones let the log carry
    // everything between rare checkpoints.
    let log_blocks = if rng.random_bool(0.5) { rng.random_range(4..24) } else { rng.random_range(64..256) };
    let mut layout =
        MapLayout { base: 4096 * rng.random_range(0..4), log_blocks, blocks: BLOCKS, pool: None };
    let snapshots = rng.random_bool(0.5);
    if snapshots {
        // Room for every snapshot a seed makes (at most 10: 15 pages each).
        let layers_at = layout.end();
        let pages_at = layers_at + LAYER_TABLE_BLOCKS as u64 * 4096;
        layout.pool = Some(PoolLayout { layers_at, pages_at, pages: 160 });
    }
    {
        let pool = create_pool(&devs).await;
        let spec = VolumeSpec {
            name: "map".into(),
            size_bytes: layout.end().next_multiple_of(64 << 10),
            layout: Layout::Raid1 { copies: 2 },
            chunk_bytes: 64 << 10,
            class: DriveClass::Fast,
            role: VolumeRole::Plain,
        };
        pool.create_volume(spec).await.expect("map volume");
        pool.close().await.expect("close");
    }
    let model = RefCell::new(Model {
        head: Versions::new(vec![MapEntry::UNALLOCATED; BLOCKS as usize]),
        snaps: Vec::new(),
        next: 0,
    });
    let mut made = 0;
    let mut switch = switch;
    for cycle in 0..rng.random_range(2..6) {
        // Requests that complete a few polls after they were made let the workers and a
        // checkpoint interleave at every I/O, not only where the map yields.
        let polls = rng.random_range(0..=3);
        for d in &devs {
            d.set_config(FaultConfig { completion_polls_max: polls, ..FaultConfig::default() });
        }
        let found = devs.iter().map(|d| FoundDrive { dev: d.clone(), path: d.name().into() }).collect();
        let pool = Arc::new(Pool::open(found).await.unwrap_or_else(|e| panic!("seed {seed}: open: {e}")));
        let vol = pool.volume("map").expect("map volume");
        // Small caches evict and checkpoint on nearly every update; 64 pages hold the whole map.
        let cache_pages = if rng.random_bool(0.5) { rng.random_range(1..8) } else { 64 };
        let store = MapStore::open(vol, layout, cache_pages)
            .await
            .unwrap_or_else(|e| panic!("seed {seed} cycle {cycle}: map open: {e}"));
        // A delete a cut interrupted is finished before anything else.
        let mut freed = Vec::new();
        store
            .finish_deletes(|f| freed.extend(f))
            .await
            .unwrap_or_else(|e| panic!("seed {seed} cycle {cycle}: finishing deletes: {e}"));
        let freed_at_open = freed;
        // Every block is one of its allowed versions; what it is now is the new baseline.
        let all: Vec<u64> = (0..BLOCKS).collect();
        let now = store.get_many(&all).await.unwrap_or_else(|e| panic!("seed {seed}: get: {e}"));
        model.borrow_mut().head.settle(now, &format!("seed {seed} cycle {cycle}: head"));
        // Snapshots whose making returned are there; one whose making failed may be.
        let found = store.snapshots();
        {
            let mut m = model.borrow_mut();
            for f in &found {
                assert!(
                    m.snaps.iter().any(|s| s.name == f.name),
                    "seed {seed} cycle {cycle}: snapshot {:?} was never made",
                    f.name
                );
            }
            m.snaps.retain_mut(|s| {
                s.id = found.iter().find(|f| f.name == s.name).map(|f| f.id);
                assert!(
                    s.id.is_some() || !s.durable || s.deleting,
                    "seed {seed} cycle {cycle}: snapshot {:?} was made and is gone",
                    s.name
                );
                s.deleting = false;
                s.id.is_some()
            });
        }
        let ids: Vec<(usize, u16)> =
            model.borrow().snaps.iter().enumerate().map(|(i, s)| (i, s.id.expect("present"))).collect();
        for (i, id) in ids {
            let got =
                store.get_in(id, &all).await.unwrap_or_else(|e| panic!("seed {seed}: snapshot {id}: {e}"));
            let mut m = model.borrow_mut();
            m.snaps[i].durable = true;
            if cycle > 0 {
                SNAPSHOT_VIEWS_CHECKED.fetch_add(1, Relaxed);
            }
            m.snaps[i].view.settle(got, &format!("seed {seed} cycle {cycle}: snapshot {id}"));
        }
        model.borrow().check_freed(
            &freed_at_open,
            None,
            &format!("seed {seed} cycle {cycle}: finishing a delete"),
        );
        let clean = rng.random_bool(0.2);
        if !clean {
            switch.trip_after_ops(rng.random_range(50..3000));
        }
        // Half the cycles hand checkpoints to a task of their own, as log-structured volumes do:
        // they then run while workers log, and a worker waits only for a full ring or a cache
        // past its hard bound.
        let background = rng.random_bool(0.5);
        if background {
            store.checkpoint_in_background();
        }
        let done = std::cell::Cell::new(false);
        let workers = async {
            let phases = if snapshots { rng.random_range(1..6) } else { 1 };
            for phase in 0..phases {
                if phase > 0 && made < 10 {
                    // Between phases no update is in flight: the snapshot is the head as it is.
                    made += 1;
                    let name = format!("s{made}");
                    let view =
                        model.borrow().head.versions.iter().map(|v| vec![*v.last().expect("one")]).collect();
                    let view = Versions { versions: view, acked: vec![0; BLOCKS as usize] };
                    model.borrow_mut().snaps.push(SnapModel {
                        name: name.clone(),
                        id: None,
                        durable: false,
                        deleting: false,
                        view,
                    });
                    let made_ok = store
                        .create_snapshot(record("vol", LayerKind::Head), record(&name, LayerKind::Snapshot))
                        .await;
                    let mut m = model.borrow_mut();
                    let s = m.snaps.last_mut().expect("pushed");
                    match made_ok {
                        Ok(id) => {
                            s.id = Some(id);
                            s.durable = true;
                        }
                        Err(MapError::PoolFull { .. }) => {
                            panic!("seed {seed}: the pool is sized for every snapshot")
                        }
                        // The power went out: the snapshot may exist after recovery. Updates fail
                        // from now on, so whether it takes part in them does not matter.
                        Err(_) => break,
                    }
                }
                let live: Vec<usize> = model
                    .borrow()
                    .snaps
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| s.id.is_some())
                    .map(|(i, _)| i)
                    .collect();
                if phase > 0 && !live.is_empty() && rng.random_bool(0.4) {
                    let i = live[rng.random_range(0..live.len())];
                    let id = {
                        let mut m = model.borrow_mut();
                        m.snaps[i].deleting = true;
                        m.snaps[i].id.expect("live")
                    };
                    let mut freed = Vec::new();
                    // What it says deleting would free, asked before (the delete must free as much).
                    let exclusive = store.exclusive_blocks(id).await;
                    if !clean && rng.random_bool(0.3) {
                        // A cut inside the delete (it writes a checkpoint and a few log blocks).
                        switch.trip_after_ops(rng.random_range(0..40));
                    }
                    let deleted = store.delete_snapshot(id, |f| freed.extend(f)).await;
                    let what = format!("seed {seed} cycle {cycle}: deleting snapshot {id}");
                    let mut m = model.borrow_mut();
                    m.check_freed(&freed, Some(i), &what);
                    match deleted {
                        Ok(stats) => {
                            // Exactly: every place only it held is freed.
                            let mut want: Vec<MapEntry> =
                                (0..BLOCKS)
                                    .map(|b| m.snaps[i].view.latest(b))
                                    .enumerate()
                                    .filter(|(b, e)| {
                                        let b = *b as u64;
                                        matches!(e.place, Place::Segment(_))
                                            && m.head.latest(b) != *e
                                            && !m.snaps.iter().enumerate().any(|(j, s)| {
                                                j != i && s.id.is_some() && s.view.latest(b) == *e
                                            })
                                    })
                                    .map(|(_, e)| e)
                                    .collect();
                            let mut got: Vec<MapEntry> = freed.iter().map(|f| f.1).collect();
                            want.sort_by_key(|e| e.seq);
                            got.sort_by_key(|e| e.seq);
                            assert_eq!(got, want, "{what}: the places only it held");
                            assert_eq!(
                                exclusive.expect("the delete went through: so did the walk before it"),
                                want.len() as u64,
                                "{what}: exclusive blocks"
                            );
                            PAGES_HANDED_ON.fetch_add(stats.pages_moved, Relaxed);
                            DELETES_DONE.fetch_add(1, Relaxed);
                            m.snaps.remove(i);
                        }
                        Err(_) => {
                            DELETES_CUT.fetch_add(1, Relaxed);
                            break;
                        }
                    }
                }
                let round = seed * 100 + cycle * 10 + phase as u64;
                // Some phases change a few map pages only: a later snapshot then has copies of
                // pages an older one does not, which deleting it hands on.
                let pages = BLOCKS.div_ceil(255);
                let window = if snapshots && rng.random_bool(0.8) {
                    let first = rng.random_range(0..pages);
                    let last = (first + rng.random_range(1..4)).min(pages);
                    (first * 255, (last * 255).min(BLOCKS))
                } else {
                    (0, BLOCKS)
                };
                futures::future::join_all((0..WORKERS).map(|w| worker(&store, &model, round, w, window)))
                    .await;
            }
            done.set(true);
        };
        let checkpoints = async {
            while background && !done.get() {
                tokio::select! {
                    () = store.checkpoint_wanted() => {}
                    () = tokio::time::sleep(std::time::Duration::from_millis(1)) => {}
                }
                if store.checkpoint_if_due().await.is_err() {
                    return; // the power went out
                }
            }
        };
        futures::future::join(workers, checkpoints).await;
        if clean {
            store.checkpoint().await.unwrap_or_else(|e| panic!("seed {seed}: checkpoint: {e}"));
            pool.close().await.unwrap_or_else(|e| panic!("seed {seed}: close: {e}"));
        }
        let stats = store.stats().await;
        assert!(
            stats.cache.resident_pages <= cache_pages + WORKERS * 40,
            "seed {seed}: cache unbounded: {stats:?}"
        );
        drop(store);
        drop(pool);
        (devs, switch) = power_cycle(&devs, seed * 10 + cycle);
    }
}

#[tokio::test]
async fn map_updates_survive_any_sequence_of_power_cuts() {
    if let Ok(one) = std::env::var("STRIA_MAP_SEED") {
        run_seed(one.parse().expect("STRIA_MAP_SEED is a number")).await;
        return;
    }
    let seeds: u64 = std::env::var("STRIA_MAP_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(60);
    for seed in 0..seeds {
        run_seed(seed).await;
    }
    let (views, held, moves) = (
        SNAPSHOT_VIEWS_CHECKED.load(Relaxed),
        FREES_HELD_BACK.load(Relaxed),
        MOVES_OF_SNAPSHOT_ONLY_BLOCKS.load(Relaxed),
    );
    let (deletes, cut, handed) =
        (DELETES_DONE.load(Relaxed), DELETES_CUT.load(Relaxed), PAGES_HANDED_ON.load(Relaxed));
    eprintln!(
        "{seeds} seeds: {views} snapshot views checked after a reopen, {held} overwrites kept a place a snapshot holds, {moves} moves of blocks only snapshots hold, {deletes} deletes ({handed} pages handed on), {cut} cut by the power"
    );
    assert!(
        seeds < 20 || (views > 0 && held > 0 && moves > 0 && deletes > 0 && handed > 0 && cut > 0),
        "the snapshot paths did not run"
    );
}
