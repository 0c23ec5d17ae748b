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
//! Clones of snapshots are made too: workers write to them as to the head, each reads back as
//! its parent snapshot with its own writes, an overwrite in a clone frees only what its parent
//! does not hold, a deleted snapshot with clones keeps its view (hidden) until its last clone is
//! deleted, and a clone's delete frees exactly what no remaining layer holds.
//!
//! Clones take snapshots of their own (frozen layers, made between phases, some cut by the power):
//! each reads as its clone was when it was made; clones are made of them too; deleting one hands
//! its copies up to the one layer over it (or keeps it, hidden, while clones were made of it) and
//! frees exactly what only it held; a clone rolled back to its newest snapshot reads as it and
//! frees exactly what only it held; deleting a clone takes its snapshots but those kept for
//! clones. After every recovery each layer's parent is one the model knows.
//!
//! `STRIA_MAP_SEEDS=N` sets the number of seeds (default 60), `STRIA_MAP_FIRST_SEED=F` the first
//! (default 0; a long run starts where the last one stopped); `STRIA_MAP_SEED=S` replays one.

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
static CLONE_VIEWS_CHECKED: AtomicU64 = AtomicU64::new(0);
static CLONE_WRITES: AtomicU64 = AtomicU64::new(0);
static CLONE_DELETES: AtomicU64 = AtomicU64::new(0);
static SNAPSHOTS_KEPT_FOR_CLONES: AtomicU64 = AtomicU64::new(0);
static REFERENCED_CHECKED: AtomicU64 = AtomicU64::new(0);
static FROZEN_MADE: AtomicU64 = AtomicU64::new(0);
static FREEZES_CUT: AtomicU64 = AtomicU64::new(0);
static FROZEN_DELETES: AtomicU64 = AtomicU64::new(0);
static PAGES_HANDED_UP: AtomicU64 = AtomicU64::new(0);
static CLONE_ROLLBACKS: AtomicU64 = AtomicU64::new(0);

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
    /// Deleted while it had clones: kept (not listed) for them.
    hidden: bool,
    view: Versions,
}

/// A clone the model knows, or a snapshot of a clone (a frozen layer: `frozen`, read-only).
struct CloneModel {
    name: String,
    id: Option<u16>,
    /// Its parent's name: a snapshot of the head (`s..`) or a frozen layer (`f..`).
    parent: String,
    durable: bool,
    deleting: bool,
    view: Versions,
    /// A snapshot of clone `of` (the clone it was made of).
    frozen: Option<String>,
    /// A frozen layer deleted while clones were made of it: kept for them, not listed.
    hidden: bool,
}

struct Model {
    head: Versions,
    snaps: Vec<SnapModel>,
    clones: Vec<CloneModel>,
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

    /// The clones present in the map now.
    fn live_clones(&mut self) -> impl Iterator<Item = &mut CloneModel> {
        self.clones.iter_mut().filter(|c| c.id.is_some())
    }

    fn snap_named(&self, name: &str) -> &SnapModel {
        self.snaps.iter().find(|s| s.name == name).expect("a clone's parent is kept")
    }

    /// The view of a clone's or frozen layer's parent `name` (a snapshot or a frozen layer).
    fn parent_view(&self, name: &str) -> &Versions {
        match self.clones.iter().find(|c| c.name == name && c.frozen.is_some()) {
            Some(f) => &f.view,
            None => &self.snap_named(name).view,
        }
    }

    /// The layers (indexes into `clones`) whose parent is `name`, but those in `gone`.
    fn children(&self, name: &str, gone: &[Gone]) -> Vec<usize> {
        (0..self.clones.len())
            .filter(|&j| {
                self.clones[j].id.is_some()
                    && self.clones[j].parent == name
                    && !gone.contains(&Gone::Clone(j))
            })
            .collect()
    }

    /// What deleting clone `i` removes: it, then (a cascade, as the map finishes hidden layers)
    /// each hidden frozen layer under it left with at most one layer over it, and a hidden
    /// snapshot left with none. With its own snapshots marked hidden first (as the delete does).
    fn clone_delete_gone(&mut self, i: usize) -> Vec<Gone> {
        let name = self.clones[i].name.clone();
        for f in self.clones.iter_mut() {
            if f.frozen.as_deref() == Some(name.as_str()) {
                f.hidden = true;
            }
        }
        let mut gone = vec![Gone::Clone(i)];
        let mut p = self.clones[i].parent.clone();
        // A layer handed up into moves down to the parent of the one handed up.
        let mut moved_down = 0;
        loop {
            let children = self.children(&p, &gone).len() + moved_down;
            match self.clones.iter().position(|c| c.name == p && c.frozen.is_some()) {
                Some(f) => {
                    if !self.clones[f].hidden {
                        break;
                    }
                    moved_down = 0;
                    if children <= 1 {
                        gone.push(Gone::Clone(f));
                        moved_down = children;
                    }
                    p = self.clones[f].parent.clone();
                }
                None => {
                    let s = self.snaps.iter().position(|s| s.name == p).expect("kept");
                    if self.snaps[s].hidden && children == 0 {
                        gone.push(Gone::Snap(s));
                    }
                    break;
                }
            }
        }
        gone
    }

    /// Removes `gone` from the model (indexes as they were); a layer over a removed frozen one
    /// reads through that one's parent now.
    fn remove(&mut self, gone: &[Gone]) {
        for g in gone {
            if let Gone::Clone(f) = *g {
                let (name, parent) = (self.clones[f].name.clone(), self.clones[f].parent.clone());
                for c in self.clones.iter_mut() {
                    if c.parent == name {
                        c.parent = parent.clone();
                    }
                }
            }
        }
        let mut snaps: Vec<usize> =
            gone.iter().filter_map(|g| if let Gone::Snap(i) = g { Some(*i) } else { None }).collect();
        let mut clones: Vec<usize> =
            gone.iter().filter_map(|g| if let Gone::Clone(i) = g { Some(*i) } else { None }).collect();
        snaps.sort_unstable();
        clones.sort_unstable();
        for i in snaps.into_iter().rev() {
            self.snaps.remove(i);
        }
        for i in clones.into_iter().rev() {
            self.clones.remove(i);
        }
    }

    /// The views of every layer present but those `gone` says are going (snapshot and clone
    /// indexes), with the head's.
    fn holders(&self, b: u64, gone: &[Gone]) -> Vec<MapEntry> {
        let mut held = vec![self.head.latest(b)];
        for (i, s) in self.snaps.iter().enumerate() {
            if s.id.is_some() && !gone.contains(&Gone::Snap(i)) {
                held.push(s.view.latest(b));
            }
        }
        for (i, c) in self.clones.iter().enumerate() {
            if c.id.is_some() && !gone.contains(&Gone::Clone(i)) {
                held.push(c.view.latest(b));
            }
        }
        held
    }

    /// Checks places a delete handed back for freeing: no layer but those going holds them
    /// (the ones whose delete is under way may be gone already).
    fn check_freed(&self, freed: &[(u64, MapEntry)], gone: &[Gone], what: &str) {
        let mut going = gone.to_vec();
        going.extend(self.snaps.iter().enumerate().filter(|(_, s)| s.deleting).map(|(i, _)| Gone::Snap(i)));
        going.extend(self.clones.iter().enumerate().filter(|(_, c)| c.deleting).map(|(i, _)| Gone::Clone(i)));
        for (block, e) in freed {
            assert!(matches!(e.place, Place::Segment(_)), "{what}: freed {e:?}, not a place");
            assert!(
                !self.holders(*block, &going).contains(e),
                "{what}: freed {e:?} of block {block}, which a remaining layer holds"
            );
        }
    }

    /// Exactly what removing the layers `gone` frees: the places their views hold that no other
    /// layer does.
    fn frees_of(&self, gone: &[Gone]) -> Vec<MapEntry> {
        let mut want = Vec::new();
        for b in 0..BLOCKS {
            let rest = self.holders(b, gone);
            for g in gone {
                let e = match *g {
                    Gone::Snap(i) => self.snaps[i].view.latest(b),
                    Gone::Clone(i) => self.clones[i].view.latest(b),
                };
                if matches!(e.place, Place::Segment(_)) && !rest.contains(&e) && !want.contains(&e) {
                    want.push(e);
                }
            }
        }
        want.sort_by_key(|e| e.seq);
        want
    }
}

/// A layer of the model a delete removes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Gone {
    Snap(usize),
    Clone(usize),
}

fn record(name: &str, kind: LayerKind) -> LayerRecord {
    LayerRecord::named(name, kind, BLOCKS * 4096)
}

/// Worker `w` updates blocks of its own in `window` (a range of blocks), of the head or of a
/// clone.
async fn worker(store: &MapStore<Dev>, model: &RefCell<Model>, seed: u64, w: u64, window: (u64, u64)) {
    let mut rng = rng(seed ^ (w + 1).wrapping_mul(0x9e37_79b9));
    for _ in 0..rng.random_range(10..60) {
        if rng.random_bool(0.2) && !move_some(store, model, seed, w, &mut rng).await {
            return;
        }
        let n = rng.random_range(1..40);
        let mut updates = Vec::new();
        let mut replaced = Vec::new();
        let target = {
            let mut m = model.borrow_mut();
            let clones: Vec<usize> = m
                .clones
                .iter()
                .enumerate()
                .filter(|(_, c)| c.id.is_some() && c.frozen.is_none())
                .map(|(i, _)| i)
                .collect();
            let target = (!clones.is_empty() && rng.random_bool(0.4))
                .then(|| clones[rng.random_range(0..clones.len())]);
            for _ in 0..n {
                // Each worker owns the blocks b % WORKERS == w: per block, issue order is
                // apply order.
                let block = rng.random_range(window.0 / WORKERS..window.1 / WORKERS) * WORKERS + w;
                let entry = m.entry();
                let layer = match target {
                    None => &mut m.head,
                    Some(c) => &mut m.clones[c].view,
                };
                replaced.push(layer.latest(block));
                layer.versions[block as usize].push(entry);
                updates.push(Update { block, entry, expect: None });
            }
            target
        };
        let result = match target {
            None => store.update(&updates).await,
            Some(c) => {
                let id = model.borrow().clones[c].id.expect("live");
                store.update_clone(id, &updates).await
            }
        };
        match result {
            Ok(applied) => {
                let mut m = model.borrow_mut();
                for ((u, got), before) in updates.iter().zip(applied).zip(replaced) {
                    let got =
                        got.unwrap_or_else(|| panic!("seed {seed}: an unconditional update did not apply"));
                    // What another layer holds is never handed back for freeing; the rest is. A
                    // head's place only snapshots can hold; a clone's only its parent.
                    let held = match target {
                        None => m.live_snaps().any(|s| s.view.latest(u.block) == before),
                        Some(c) => m.parent_view(&m.clones[c].parent).latest(u.block) == before,
                    };
                    let want = if held { MapEntry::UNALLOCATED } else { before };
                    if held && before != MapEntry::UNALLOCATED {
                        FREES_HELD_BACK.fetch_add(1, Relaxed);
                    }
                    assert_eq!(
                        got, want,
                        "seed {seed}: overwriting block {} of {target:?} (another layer holds it: {held})",
                        u.block
                    );
                    match target {
                        None => m.head.ack(u.block, u.entry),
                        Some(c) => {
                            m.clones[c].view.ack(u.block, u.entry);
                            CLONE_WRITES.fetch_add(1, Relaxed);
                        }
                    }
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
        let mut held = m.holders(block, &[]);
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
        for c in m.live_clones() {
            if c.view.latest(block) == from {
                c.view.versions[block as usize].push(to);
            }
        }
        (block, from, to)
    };
    match store.update(&[Update { block, entry: to, expect: Some(from) }]).await {
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
            for c in m.live_clones() {
                if c.view.latest(block) == to {
                    c.view.ack(block, to);
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
        MapLayout { base: 4096 * rng.random_range(0..4), log_blocks, blocks: BLOCKS, pool: None, head: None };
    let snapshots = rng.random_bool(0.5);
    if snapshots {
        // Room for every snapshot, clone and snapshot of a clone a seed makes (at most 10, 6 and
        // 8: 15 pages each, and the clone's copies made again after each freeze).
        let layers_at = layout.end();
        let pages_at = layers_at + LAYER_TABLE_BLOCKS as u64 * 4096;
        layout.pool = Some(PoolLayout { layers_at, pages_at, pages: 512, runs: None });
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
        clones: Vec::new(),
        next: 0,
    });
    let mut made = 0;
    let mut clones_made = 0;
    let mut frozen_made = 0;
    // The snapshots of clones draw from a stream of their own: the other choices of a seed stay
    // what they were before those existed.
    let mut crng = crate::common::rng(seed ^ 0x00c1_0e5f_7a11);
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
        // Deletes in batches of a few pages: a cut may fall between any two.
        store.set_delete_batch(if rng.random_bool(0.7) { rng.random_range(1..=3) } else { 128 });
        // A rollback, then a delete, a cut interrupted are finished before anything else.
        let mut freed = Vec::new();
        store
            .finish_clone_rollbacks(|f| freed.extend(f))
            .await
            .unwrap_or_else(|e| panic!("seed {seed} cycle {cycle}: finishing clone rollbacks: {e}"));
        store
            .finish_deletes(None, |f| freed.extend(f))
            .await
            .unwrap_or_else(|e| panic!("seed {seed} cycle {cycle}: finishing deletes: {e}"));
        let freed_at_open = freed;
        // Every block is one of its allowed versions; what it is now is the new baseline.
        let all: Vec<u64> = (0..BLOCKS).collect();
        let now = store.get_many(&all).await.unwrap_or_else(|e| panic!("seed {seed}: get: {e}"));
        model.borrow_mut().head.settle(now, &format!("seed {seed} cycle {cycle}: head"));
        // Clones and snapshots whose making returned are there; one whose making failed may be.
        let found_clones = store.clones();
        let found_frozen: Vec<LayerRecord> =
            found_clones.iter().flat_map(|c| store.clone_snapshots(c.id)).collect();
        let found = store.snapshots();
        {
            let mut m = model.borrow_mut();
            for f in found_clones.iter().chain(&found_frozen) {
                assert!(
                    m.clones.iter().any(|c| c.name == f.name),
                    "seed {seed} cycle {cycle}: clone or snapshot of a clone {:?} was never made",
                    f.name
                );
            }
            // A layer the table still holds under `id`, hidden (kept for clones).
            let hidden_as = |id: Option<u16>, name: &str, kind: LayerKind| {
                id.and_then(|id| store.layer_record(id))
                    .is_some_and(|r| r.hidden && r.name == name && r.kind == kind)
            };
            m.clones.retain_mut(|c| {
                let listed = match c.frozen {
                    None => found_clones.iter().find(|f| f.name == c.name).map(|f| f.id),
                    Some(_) => found_frozen.iter().find(|f| f.name == c.name).map(|f| f.id),
                };
                let kept =
                    c.frozen.is_some() && listed.is_none() && hidden_as(c.id, &c.name, LayerKind::Frozen);
                assert!(
                    listed.is_some() || kept || !c.durable || c.deleting || c.hidden,
                    "seed {seed} cycle {cycle}: {:?} was made and is gone",
                    c.name
                );
                if !kept {
                    c.id = listed;
                }
                c.hidden = kept;
                c.deleting = false;
                c.id.is_some()
            });
            for f in &found {
                assert!(
                    m.snaps.iter().any(|s| s.name == f.name && !s.hidden),
                    "seed {seed} cycle {cycle}: snapshot {:?} was never made (or was deleted)",
                    f.name
                );
            }
            m.snaps.retain_mut(|s| {
                let listed = found.iter().find(|f| f.name == s.name).map(|f| f.id);
                let kept = listed.is_none() && hidden_as(s.id, &s.name, LayerKind::Snapshot);
                // A deleted one kept for clones goes with its last clone.
                assert!(
                    listed.is_some() || kept || !s.durable || s.deleting || s.hidden,
                    "seed {seed} cycle {cycle}: snapshot {:?} was made and is gone",
                    s.name
                );
                if !kept {
                    s.id = listed;
                }
                s.hidden = kept;
                s.deleting = false;
                s.id.is_some()
            });
            // Each clone's and frozen layer's parent as the table has it (a hand-up a cut
            // interrupted and open finished moved it): a layer the model knows.
            let ids: Vec<(String, u16)> = m
                .snaps
                .iter()
                .map(|s| (s.name.clone(), s.id.expect("present")))
                .chain(m.clones.iter().map(|c| (c.name.clone(), c.id.expect("present"))))
                .collect();
            for c in m.clones.iter_mut() {
                let rec = store.layer_record(c.id.expect("present")).expect("present");
                c.parent = ids
                    .iter()
                    .find(|(_, id)| *id == rec.parent)
                    .unwrap_or_else(|| {
                        panic!(
                            "seed {seed} cycle {cycle}: {:?} reads through layer {}, which is gone",
                            c.name, rec.parent
                        )
                    })
                    .0
                    .clone();
            }
        }
        let ids: Vec<(usize, u16)> =
            model.borrow().snaps.iter().enumerate().map(|(i, s)| (i, s.id.expect("present"))).collect();
        for (i, id) in ids {
            // A snapshot deleted while it has clones is kept, hidden: still read here.
            let got = store
                .get_in_kept(id, &all)
                .await
                .unwrap_or_else(|e| panic!("seed {seed}: snapshot {id}: {e}"));
            let mut m = model.borrow_mut();
            m.snaps[i].durable = true;
            if cycle > 0 {
                SNAPSHOT_VIEWS_CHECKED.fetch_add(1, Relaxed);
            }
            m.snaps[i].view.settle(got, &format!("seed {seed} cycle {cycle}: snapshot {id}"));
        }
        let ids: Vec<(usize, u16)> =
            model.borrow().clones.iter().enumerate().map(|(i, c)| (i, c.id.expect("present"))).collect();
        for (i, id) in ids {
            // (A frozen layer deleted and kept hidden for its clones too.)
            let got =
                store.get_in_kept(id, &all).await.unwrap_or_else(|e| panic!("seed {seed}: clone {id}: {e}"));
            let mut m = model.borrow_mut();
            m.clones[i].durable = true;
            if cycle > 0 {
                CLONE_VIEWS_CHECKED.fetch_add(1, Relaxed);
            }
            m.clones[i].view.settle(got, &format!("seed {seed} cycle {cycle}: clone {id}"));
        }
        model.borrow().check_freed(
            &freed_at_open,
            &[],
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
                        hidden: false,
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
                    .filter(|(_, s)| s.id.is_some() && !s.hidden)
                    .map(|(i, _)| i)
                    .collect();
                let live_frozen: Vec<usize> = model
                    .borrow()
                    .clones
                    .iter()
                    .enumerate()
                    .filter(|(_, c)| c.id.is_some() && c.frozen.is_some() && !c.hidden)
                    .map(|(i, _)| i)
                    .collect();
                if phase > 0 && !live.is_empty() && clones_made < 6 && rng.random_bool(0.4) {
                    // A clone of a snapshot, or of a snapshot of a clone: it reads as that until
                    // written.
                    clones_made += 1;
                    let i = live[rng.random_range(0..live.len())];
                    let name = format!("c{clones_made}");
                    let (parent, id, view) = {
                        let m = model.borrow();
                        let (parent, id, of) = if !live_frozen.is_empty() && crng.random_bool(0.5) {
                            let f = &m.clones[live_frozen[crng.random_range(0..live_frozen.len())]];
                            (f.name.clone(), f.id.expect("live"), &f.view)
                        } else {
                            let s = &m.snaps[i];
                            (s.name.clone(), s.id.expect("live"), &s.view)
                        };
                        let view: Vec<MapEntry> = (0..BLOCKS).map(|b| of.latest(b)).collect();
                        (parent, id, Versions::new(view))
                    };
                    model.borrow_mut().clones.push(CloneModel {
                        name: name.clone(),
                        id: None,
                        parent,
                        durable: false,
                        deleting: false,
                        view,
                        frozen: None,
                        hidden: false,
                    });
                    let made_ok = store.create_clone(id, record(&name, LayerKind::Clone)).await;
                    let mut m = model.borrow_mut();
                    let c = m.clones.last_mut().expect("pushed");
                    match made_ok {
                        Ok(id) => {
                            c.id = Some(id);
                            c.durable = true;
                        }
                        Err(MapError::PoolFull { .. }) => {
                            panic!("seed {seed}: the pool is sized for every clone")
                        }
                        Err(_) => break,
                    }
                }
                let live_clones = || -> Vec<usize> {
                    model
                        .borrow()
                        .clones
                        .iter()
                        .enumerate()
                        .filter(|(_, c)| c.id.is_some() && c.frozen.is_none())
                        .map(|(i, _)| i)
                        .collect()
                };
                let clones_now = live_clones();
                if phase > 0 && !clones_now.is_empty() && frozen_made < 8 && crng.random_bool(0.35) {
                    // A snapshot of a clone: it freezes the clone's pages; the clone goes on
                    // over it (no update is in flight between phases).
                    frozen_made += 1;
                    let i = clones_now[crng.random_range(0..clones_now.len())];
                    let name = format!("f{frozen_made}");
                    let (id, frozen) = {
                        let m = model.borrow();
                        let c = &m.clones[i];
                        let view: Vec<MapEntry> = (0..BLOCKS).map(|b| c.view.latest(b)).collect();
                        let frozen = CloneModel {
                            name: name.clone(),
                            id: None,
                            parent: c.parent.clone(),
                            durable: false,
                            deleting: false,
                            view: Versions::new(view),
                            frozen: Some(c.name.clone()),
                            hidden: false,
                        };
                        (c.id.expect("live"), frozen)
                    };
                    model.borrow_mut().clones.push(frozen);
                    if !clean && crng.random_bool(0.3) {
                        switch.trip_after_ops(crng.random_range(0..30));
                    }
                    let made_ok = store.freeze_clone(id, record(&name, LayerKind::Frozen)).await;
                    let mut m = model.borrow_mut();
                    match made_ok {
                        Ok(fid) => {
                            let f = m.clones.last_mut().expect("pushed");
                            f.id = Some(fid);
                            f.durable = true;
                            m.clones[i].parent = name;
                            FROZEN_MADE.fetch_add(1, Relaxed);
                        }
                        Err(MapError::PoolFull { .. }) => {
                            panic!("seed {seed}: the pool is sized for every layer")
                        }
                        Err(_) => {
                            FREEZES_CUT.fetch_add(1, Relaxed);
                            break;
                        }
                    }
                }
                let frozen_now: Vec<usize> = model
                    .borrow()
                    .clones
                    .iter()
                    .enumerate()
                    .filter(|(_, c)| c.id.is_some() && c.frozen.is_some() && !c.hidden)
                    .map(|(i, _)| i)
                    .collect();
                if phase > 0 && !frozen_now.is_empty() && crng.random_bool(0.3) {
                    // Deleting a snapshot of a clone: handed up to the one layer over it, or kept
                    // (hidden) while clones were made of it.
                    let i = frozen_now[crng.random_range(0..frozen_now.len())];
                    let (id, kept) = {
                        let mut m = model.borrow_mut();
                        m.clones[i].deleting = true;
                        let name = m.clones[i].name.clone();
                        (m.clones[i].id.expect("live"), m.children(&name, &[]).len() > 1)
                    };
                    let exclusive = store.exclusive_blocks(id).await;
                    if !clean && crng.random_bool(0.3) {
                        switch.trip_after_ops(crng.random_range(0..40));
                    }
                    let mut freed = Vec::new();
                    let deleted = store.delete_frozen(id, None, |f| freed.extend(f)).await;
                    let what = format!("seed {seed} cycle {cycle}: deleting frozen layer {id}");
                    let mut m = model.borrow_mut();
                    m.check_freed(&freed, &[Gone::Clone(i)], &what);
                    match deleted {
                        Ok(stats) => {
                            let want = if kept { Vec::new() } else { m.frees_of(&[Gone::Clone(i)]) };
                            let mut got: Vec<MapEntry> = freed.iter().map(|f| f.1).collect();
                            got.sort_by_key(|e| e.seq);
                            assert_eq!(got, want, "{what}: the places only it held");
                            assert_eq!(stats.kept_for_clones, kept, "{what}: kept for clones");
                            assert_eq!(
                                exclusive.expect("the delete went through: so did the walk before it"),
                                want.len() as u64,
                                "{what}: exclusive blocks"
                            );
                            m.clones[i].deleting = false;
                            FROZEN_DELETES.fetch_add(1, Relaxed);
                            if kept {
                                m.clones[i].hidden = true;
                            } else {
                                PAGES_HANDED_UP.fetch_add(stats.pages_moved, Relaxed);
                                m.remove(&[Gone::Clone(i)]);
                            }
                        }
                        Err(_) => {
                            DELETES_CUT.fetch_add(1, Relaxed);
                            break;
                        }
                    }
                }
                let clones_now = live_clones();
                let own_newest: Vec<usize> = {
                    let m = model.borrow();
                    clones_now
                        .iter()
                        .copied()
                        .filter(|&i| {
                            m.clones.iter().any(|f| {
                                f.name == m.clones[i].parent && f.frozen.as_ref() == Some(&m.clones[i].name)
                            })
                        })
                        .collect()
                };
                if phase > 0 && !own_newest.is_empty() && crng.random_bool(0.2) {
                    // A clone rolled back to its newest snapshot: it reads as that again, and
                    // what only it held is freed.
                    let i = own_newest[crng.random_range(0..own_newest.len())];
                    let (id, want, back) = {
                        let m = model.borrow();
                        let parent = m.parent_view(&m.clones[i].parent);
                        let back: Vec<MapEntry> = (0..BLOCKS).map(|b| parent.latest(b)).collect();
                        (m.clones[i].id.expect("live"), m.frees_of(&[Gone::Clone(i)]), back)
                    };
                    if !clean && crng.random_bool(0.3) {
                        switch.trip_after_ops(crng.random_range(0..40));
                    }
                    let mut freed = Vec::new();
                    let rolled = store.rollback_clone(id, None, |f| freed.extend(f)).await;
                    let what = format!("seed {seed} cycle {cycle}: rolling clone {id} back");
                    let mut m = model.borrow_mut();
                    // Either way, the clone may read as the snapshot after a cut.
                    for (b, e) in back.iter().enumerate() {
                        if m.clones[i].view.latest(b as u64) != *e {
                            m.clones[i].view.versions[b].push(*e);
                        }
                    }
                    for (block, e) in &freed {
                        assert!(
                            want.contains(e),
                            "{what}: freed {e:?} of block {block}, which another layer holds"
                        );
                    }
                    match rolled {
                        Ok(_) => {
                            let mut got: Vec<MapEntry> = freed.iter().map(|f| f.1).collect();
                            got.sort_by_key(|e| e.seq);
                            assert_eq!(got, want, "{what}: the places only it held");
                            m.clones[i].view = Versions::new(back);
                            CLONE_ROLLBACKS.fetch_add(1, Relaxed);
                        }
                        Err(_) => {
                            DELETES_CUT.fetch_add(1, Relaxed);
                            break;
                        }
                    }
                }
                let live_clones = live_clones();
                if phase > 0 && !live_clones.is_empty() && rng.random_bool(0.25) {
                    let i = live_clones[rng.random_range(0..live_clones.len())];
                    let (id, gone) = {
                        let mut m = model.borrow_mut();
                        m.clones[i].deleting = true;
                        // It, its snapshots and what is kept only for them.
                        let gone = m.clone_delete_gone(i);
                        (m.clones[i].id.expect("live"), gone)
                    };
                    let mut freed = Vec::new();
                    if !clean && rng.random_bool(0.3) {
                        switch.trip_after_ops(rng.random_range(0..40));
                    }
                    let deleted = store.delete_clone(id, None, |f| freed.extend(f)).await;
                    let what = format!("seed {seed} cycle {cycle}: deleting clone {id}");
                    let mut m = model.borrow_mut();
                    m.check_freed(&freed, &gone, &what);
                    match deleted {
                        Ok(_) => {
                            let want = m.frees_of(&gone);
                            let mut got: Vec<MapEntry> = freed.iter().map(|f| f.1).collect();
                            got.sort_by_key(|e| e.seq);
                            assert_eq!(
                                got, want,
                                "{what}: the places only it (and a parent kept for it) held"
                            );
                            CLONE_DELETES.fetch_add(1, Relaxed);
                            m.remove(&gone);
                        }
                        Err(_) => {
                            DELETES_CUT.fetch_add(1, Relaxed);
                            break;
                        }
                    }
                }
                // (A clone's delete may have removed a snapshot kept for it.)
                let live: Vec<usize> = model
                    .borrow()
                    .snaps
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| s.id.is_some() && !s.hidden)
                    .map(|(i, _)| i)
                    .collect();
                if phase > 0 && !live.is_empty() && rng.random_bool(0.4) {
                    let i = live[rng.random_range(0..live.len())];
                    let (id, has_clones) = {
                        let mut m = model.borrow_mut();
                        m.snaps[i].deleting = true;
                        let name = m.snaps[i].name.clone();
                        (m.snaps[i].id.expect("live"), m.clones.iter().any(|c| c.parent == name))
                    };
                    let mut freed = Vec::new();
                    // What every snapshot references (its view's data), as the model has it.
                    if let Ok(refs) = store.referenced_blocks().await {
                        let m = model.borrow();
                        for s in m.snaps.iter().filter(|s| s.id.is_some() && !s.deleting) {
                            let want = (0..BLOCKS)
                                .filter(|&b| {
                                    matches!(s.view.latest(b).place, Place::Segment(_) | Place::Cache(_))
                                })
                                .count() as u64;
                            let got = refs.iter().find(|r| Some(r.0) == s.id).map(|r| r.1);
                            assert_eq!(
                                got,
                                Some(want),
                                "seed {seed} cycle {cycle}: blocks {} references",
                                s.name
                            );
                            REFERENCED_CHECKED.fetch_add(1, Relaxed);
                        }
                    }
                    // What it says deleting would free, asked before (the delete must free as much).
                    let exclusive = store.exclusive_blocks(id).await;
                    if !clean && rng.random_bool(0.3) {
                        // A cut inside the delete (it writes a checkpoint and a few log blocks).
                        switch.trip_after_ops(rng.random_range(0..40));
                    }
                    let deleted = store.delete_snapshot(id, None, |f| freed.extend(f)).await;
                    let what = format!("seed {seed} cycle {cycle}: deleting snapshot {id}");
                    let mut m = model.borrow_mut();
                    m.check_freed(&freed, &[Gone::Snap(i)], &what);
                    match deleted {
                        Ok(stats) => {
                            // Exactly: every place only it held is freed (nothing while clones
                            // read through it).
                            let want = if has_clones { Vec::new() } else { m.frees_of(&[Gone::Snap(i)]) };
                            let mut got: Vec<MapEntry> = freed.iter().map(|f| f.1).collect();
                            got.sort_by_key(|e| e.seq);
                            assert_eq!(got, want, "{what}: the places only it held");
                            assert_eq!(stats.kept_for_clones, has_clones, "{what}: kept for clones");
                            assert_eq!(
                                exclusive.expect("the delete went through: so did the walk before it"),
                                want.len() as u64,
                                "{what}: exclusive blocks"
                            );
                            PAGES_HANDED_ON.fetch_add(stats.pages_moved, Relaxed);
                            DELETES_DONE.fetch_add(1, Relaxed);
                            m.snaps[i].deleting = false;
                            if has_clones {
                                SNAPSHOTS_KEPT_FOR_CLONES.fetch_add(1, Relaxed);
                                m.snaps[i].hidden = true;
                            } else {
                                m.snaps.remove(i);
                            }
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
        let stats = store.stats();
        assert!(
            stats.cache.resident_pages <= cache_pages + WORKERS * 40,
            "seed {seed}: cache unbounded: {stats:?}"
        );
        drop(store);
        drop(pool);
        (devs, switch) = power_cycle(&devs, seed * 10 + cycle);
    }
}

/// Seeds beyond the default count that once found a bug, run every time:
/// - 1618: a power cut in a checkpoint after a snapshot of a clone was handed up into the layer
///   over it; the checkpoint had written the giving layer's table (without the copies) and not
///   the taking layer's new table, so no table at open named the copies, and replaying the
///   hand-up left them free in the page pool while a table named them.
const FOUND_BUGS: &[u64] = &[1618];

/// Names the seed that was running when a panic unwinds through it (replay it with
/// `STRIA_MAP_SEED`).
struct NameOnPanic(u64);

impl Drop for NameOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("map store seed {} failed; replay it with STRIA_MAP_SEED={}", self.0, self.0);
        }
    }
}

#[tokio::test]
async fn map_updates_survive_any_sequence_of_power_cuts() {
    if let Ok(one) = std::env::var("STRIA_MAP_SEED") {
        run_seed(one.parse().expect("STRIA_MAP_SEED is a number")).await;
        return;
    }
    let seeds = env_u64("STRIA_MAP_SEEDS", 60);
    let first = env_u64("STRIA_MAP_FIRST_SEED", 0);
    let run = first..first + seeds;
    let found = FOUND_BUGS.iter().copied().filter(|s| !run.contains(s));
    for seed in run.clone().chain(found) {
        let _named = NameOnPanic(seed);
        run_seed(seed).await;
    }
    let (views, held, moves) = (
        SNAPSHOT_VIEWS_CHECKED.load(Relaxed),
        FREES_HELD_BACK.load(Relaxed),
        MOVES_OF_SNAPSHOT_ONLY_BLOCKS.load(Relaxed),
    );
    let (deletes, cut, handed) =
        (DELETES_DONE.load(Relaxed), DELETES_CUT.load(Relaxed), PAGES_HANDED_ON.load(Relaxed));
    let (clone_views, clone_writes, clone_deletes, kept) = (
        CLONE_VIEWS_CHECKED.load(Relaxed),
        CLONE_WRITES.load(Relaxed),
        CLONE_DELETES.load(Relaxed),
        SNAPSHOTS_KEPT_FOR_CLONES.load(Relaxed),
    );
    let referenced = REFERENCED_CHECKED.load(Relaxed);
    let (frozen, freezes_cut, frozen_deletes, handed_up, rollbacks) = (
        FROZEN_MADE.load(Relaxed),
        FREEZES_CUT.load(Relaxed),
        FROZEN_DELETES.load(Relaxed),
        PAGES_HANDED_UP.load(Relaxed),
        CLONE_ROLLBACKS.load(Relaxed),
    );
    eprintln!(
        "{seeds} seeds from {first}: {frozen} snapshots of clones made ({freezes_cut} cut), {frozen_deletes} deleted ({handed_up} pages handed up), {rollbacks} clone rollbacks"
    );
    assert!(
        seeds < 20 || (frozen > 0 && freezes_cut > 0 && frozen_deletes > 0 && handed_up > 0 && rollbacks > 0),
        "the paths of snapshots of clones did not run"
    );
    eprintln!(
        "{seeds} seeds from {first}: {views} snapshot views checked after a reopen, {held} overwrites kept a place another layer holds, {moves} moves of blocks only snapshots or clones hold, {deletes} snapshot deletes ({handed} pages handed on, {kept} kept for clones), {cut} deletes cut by the power, {referenced} referenced counts checked; {clone_views} clone views checked after a reopen, {clone_writes} clone block writes, {clone_deletes} clone deletes"
    );
    assert!(
        seeds < 20
            || (views > 0 && held > 0 && moves > 0 && deletes > 0 && handed > 0 && cut > 0 && referenced > 0),
        "the snapshot paths did not run"
    );
    assert!(
        seeds < 20 || (clone_views > 0 && clone_writes > 0 && clone_deletes > 0 && kept > 0),
        "the clone paths did not run"
    );
}
