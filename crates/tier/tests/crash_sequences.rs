//! Seeded *sequences* of crashes on one pool with drive events, on a `tiered:ec:4+2`
//! log-structured volume (cache and map on the fast drives): see "Sequences of crashes" below.
//! After every boot each durable write reads back (a write is durable when acknowledged; on odd
//! seeds, which write back, a plain write once a later flush completed), nothing older comes
//! back, and a scrub of every part finds nothing to fix.
//!
//! `STRIA_TIER_SEQ_SEEDS=N` sets the number of seeds (default 60), `STRIA_TIER_SEQ_FIRST_SEED=F`
//! the first (default 0); `STRIA_TIER_SEQ_SEED=S` replays one with its history.

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::common::*;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use stria_dev::{FaultConfig, FaultDevice, IoBytes, PowerSwitch};
use stria_engine::{DriveClass, DriveState, FoundDrive, NewDrive, Pool};
use stria_tier::log::{GcPolicy, LogParams, LogVolume};

// ------------------------------------------------------------------------------------------------
// Sequences of crashes on one pool (the volume's counterpart of crates/engine/tests/crash_sequences.rs).
//
// Each seed creates a pool of 2 fast + 6 capacity drives and a small tiered:ec:4+2 volume whose
// cache and segments are small enough that destage and GC run all the time, then runs 1-8 cycles of
// boot → verify → scrub → (drive event) → work → crash on the same drives:
//
// * A **boot** (pool assembly and recovery, then opening the volume: map replay) may itself be cut
//   (a crash during recovery), and is then retried.
// * **Verify** reads every block: each must be its last acknowledged version or a newer one (a
//   write is durable when acknowledged, FUA or not), never an older one, never bytes that were
//   never written. A **scrub** of the cache, map and segment parts must find nothing to fix.
// * **Work** is three writers (aligned and unaligned writes, FUA or not, zeroing and trim; two of
//   them share every 64 KiB of their half), a reader checking what it sees against the
//   acknowledged versions, a flusher, the mover (destage always on, or between low watermarks;
//   GC whenever free segments run low) and one maintenance task: a scrub of a part, a rebuild of
//   a replaced drive, or nothing.
// * The **crash** is a power cut (unflushed writes dropped or torn, per block), a process kill
//   (everything the drives accepted is kept), or a clean close (`vol.close()` then `pool.close()`,
//   racing the writers). The cut is armed at a random request count, so it lands during cache
//   writes, map log writes and checkpoints, destage and GC batches, rebuild rows and metadata
//   commits.
// * **Drive events** happen between cycles only, with the mover held and everything durable
//   (after verify and scrub): a fast drive fails (the mirrors tolerate one), a capacity drive
//   fails (ec:4+2 tolerates two), or a failed drive is replaced by a new one, rebuilt during the
//   next work phase. Never under load: a capacity member lost at the same crash as an unflushed
//   full-stripe write is the documented write-hole limit of ec volumes (docs/crash-consistency.md,
//   "Limits"), which the engine's simulation avoids for ec the same way.
//
// `STRIA_TIER_SEQ_SEEDS=N` sets the number of seeds (default 60); `STRIA_TIER_SEQ_SEED=S` replays
// one seed and prints its history. Time is paused (tokio's test clock), so a seed replays the
// same way.

/// The volume of the simulation: 512 blocks.
const SEQ_VOLUME_BYTES: u64 = 2 << 20;
const SEQ_BLOCKS: usize = (SEQ_VOLUME_BYTES / 4096) as usize;
/// Replacement drives a seed may add.
const SPARES_MAX: usize = 3;
/// The three parts of the volume `tv`.
const PARTS: [&str; 3] = ["tv.cache", "tv.meta", "tv.seg"];
/// Requests per writer per work phase.
const WRITES_PER_WORKER: usize = 30;

/// How a cycle ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    PowerCut,
    Kill,
    CleanClose,
}

/// The background task of a work phase (besides the mover).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Maintenance {
    None,
    Scrub(&'static str),
    Rebuild,
}

struct World {
    seed: u64,
    rng: ChaCha8Rng,
    /// Every drive the operator has (failed and replaced ones too: the pool must leave them out).
    disks: Vec<Dev>,
    spares: usize,
    /// The power switch every current drive hangs on.
    switch: Arc<PowerSwitch>,
    tracker: Tracker,
    history: Vec<String>,
    /// Names of the fast drives (slots 0-1 and their replacements).
    fast_names: Vec<String>,
}

/// What the seeds did, summed over a run (printed at the end, so a run shows what it covered).
#[derive(Default)]
struct Coverage {
    cycles: AtomicU64,
    power_cuts: AtomicU64,
    kills: AtomicU64,
    clean_closes: AtomicU64,
    boot_cuts: AtomicU64,
    cuts_on_fast: AtomicU64,
    cuts_on_capacity: AtomicU64,
    fast_failures: AtomicU64,
    capacity_failures: AtomicU64,
    replacements: AtomicU64,
    rebuilds_done: AtomicU64,
    rebuilds_cut: AtomicU64,
    scrubs_under_load: AtomicU64,
    destaged_blocks: AtomicU64,
    gc_moved_blocks: AtomicU64,
    cache_growths: AtomicU64,
}

static COVERAGE: std::sync::LazyLock<Coverage> = std::sync::LazyLock::new(Coverage::default);

fn count(c: &AtomicU64) {
    c.fetch_add(1, Relaxed);
}

/// Drives of the simulation: requests complete after a few polls, so the writers, the mover
/// and maintenance interleave between a request's submission and its completion.
fn sim_config() -> FaultConfig {
    FaultConfig { completion_polls_max: 3, ..FaultConfig::default() }
}

fn sim_drive(name: &str, switch: &Arc<PowerSwitch>, seed: u64) -> Dev {
    let mem = stria_dev::mem::MemDevice::new(name, DRIVE_BYTES);
    Arc::new(FaultDevice::with_config(mem, sim_config(), seed).with_power_switch(Arc::clone(switch)))
}

fn dev_name(dev: &Dev) -> String {
    use stria_dev::BlockDevice;
    dev.name().to_string()
}

/// No destage or GC until the work phase (no writer waits for space between cycles): drive
/// events happen with nothing in flight and everything durable.
fn hold_mover(vol: &LogVolume<Dev>) {
    vol.set_params(LogParams { hold: true, ..vol.params() });
}

/// Any panic of a seed (a check here or an assertion in the tier or the engine) shows the seed
/// and what it did.
impl Drop for World {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "seed {} failed (replay: STRIA_TIER_SEQ_SEED={}); history:\n  {}",
                self.seed,
                self.seed,
                self.history.join("\n  ")
            );
        }
    }
}

impl World {
    fn note(&mut self, what: String) {
        if std::env::var("STRIA_TIER_SEQ_SEED").is_ok() {
            eprintln!("seed {}: {what}", self.seed);
        }
        self.history.push(what);
    }

    fn fail(&self, what: String) -> ! {
        panic!("seed {}: {what}", self.seed);
    }

    /// The drives as found after a reboot: fresh drives with the given contents, on a new switch.
    fn reboot(&mut self, images: Vec<stria_dev::mem::MemDevice>) -> Arc<PowerSwitch> {
        let switch = PowerSwitch::new();
        for (disk, image) in self.disks.iter_mut().zip(images) {
            let seed = self.seed ^ 0x5eed ^ self.rng.random::<u64>();
            *disk = Arc::new(
                FaultDevice::with_config(image, sim_config(), seed).with_power_switch(Arc::clone(&switch)),
            );
        }
        self.switch = Arc::clone(&switch);
        switch
    }

    fn images(&mut self, ending: Ending) -> Vec<stria_dev::mem::MemDevice> {
        let base = self.rng.random::<u64>();
        self.disks
            .iter()
            .enumerate()
            .map(|(i, d)| match ending {
                Ending::PowerCut => d.crash_image(base.wrapping_add(i as u64)),
                Ending::Kill | Ending::CleanClose => d.kill_image(),
            })
            .collect()
    }

    /// Opens the pool from every drive the operator has, then the volume, with its mover
    /// held. A boot may be cut (a crash during recovery); it is then retried.
    async fn boot(&mut self) -> (Arc<Pool<Dev>>, Arc<LogVolume<Dev>>) {
        for attempt in 0.. {
            let images = self.images(Ending::Kill);
            let switch = self.reboot(images);
            if attempt < 3 && self.rng.random_bool(0.25) {
                let ops = self.rng.random_range(0..800);
                switch.trip_after_ops(ops);
                self.note(format!("boot {attempt}: power cut armed after {ops} requests"));
            }
            let found =
                self.disks.iter().map(|d| FoundDrive { dev: Arc::clone(d), path: dev_name(d) }).collect();
            let opened = match Pool::open_skipping(found, false).await {
                Ok(pool) => {
                    let pool = Arc::new(pool);
                    small_csum_cache(&pool, self.seed);
                    if !pool.meta().tiered.iter().any(|t| t.name == "tv") {
                        self.fail("the pool lost volume tv".into())
                    }
                    open_log(&pool, "tv").await.map(|vol| (pool, vol)).map_err(|e| e.to_string())
                }
                Err(e) => Err(e.to_string()),
            };
            match opened {
                Ok((pool, vol)) if !switch.is_off() => {
                    // Before the mover first runs (it was only spawned).
                    hold_mover(&vol);
                    switch.trip_after_ops(u64::MAX);
                    return (pool, vol);
                }
                Ok((_, vol)) => {
                    vol.close().await;
                    self.note("boot: cut after the volume opened".into());
                }
                Err(e) if switch.is_off() => self.note(format!("boot cut during recovery: {e}")),
                Err(e) => self.fail(format!("the pool or the volume did not open: {e}")),
            }
            count(&COVERAGE.boot_cuts);
            let images = self.images(Ending::PowerCut);
            self.reboot(images);
        }
        unreachable!()
    }

    /// Reads every block (in reads of 1-32 blocks): each must be an allowed version; then what
    /// was read becomes the only version.
    async fn verify(&mut self, vol: &LogVolume<Dev>, when: &str) {
        let mut b = 0;
        while b < SEQ_BLOCKS {
            let n = self.rng.random_range(1..=32).min(SEQ_BLOCKS - b);
            let got = match vol.read(b as u64 * 4096, n * 4096).await {
                Ok(got) => got,
                Err(e) => self.fail(format!("{when}: blocks {b}..{} unreadable: {e}", b + n)),
            };
            for (k, block) in got.chunks_exact(4096).enumerate() {
                if !self.tracker.allowed(b + k).iter().any(|v| v[..] == block[..]) {
                    self.fail(format!(
                        "{when}: block {} holds {}",
                        b + k,
                        self.tracker.describe(b + k, block)
                    ));
                }
                self.tracker.settle(b + k, block);
            }
            b += n;
        }
    }

    async fn check_scrub(&self, pool: &Pool<Dev>, cycle: u64) {
        for part in PARTS {
            let r =
                pool.scrub(part, |_, _| {}).await.unwrap_or_else(|e| self.fail(format!("scrub {part}: {e}")));
            let found =
                (r.unrecoverable_blocks, r.parity_blocks_fixed, r.copy_blocks_fixed, r.inconsistent_blocks);
            if found != (0, 0, 0, 0) || r.blocks_repaired != 0 {
                self.fail(format!("cycle {cycle}: {part} inconsistent after recovery: {r:?}"));
            }
        }
    }
}

/// Slots of the members of part `name` that are failed or still being rebuilt.
fn lost_members(pool: &Pool<Dev>, name: &str) -> Vec<u32> {
    let meta = pool.meta();
    let vol = meta.volumes.iter().find(|v| v.name == name).expect("part");
    let mut lost: Vec<u32> = vol
        .segments
        .iter()
        .flat_map(|s| s.members.iter())
        .filter(|m| {
            m.rebuild_cursor_rows.is_some()
                || meta.drive(m.slot).is_none_or(|d| d.state != DriveState::Active)
        })
        .map(|m| m.slot)
        .collect();
    lost.sort_unstable();
    lost.dedup();
    lost
}

/// Active drives of `class` that are whole members of every part they hold.
fn whole_drives(pool: &Pool<Dev>, class: DriveClass) -> Vec<u32> {
    let lost: Vec<u32> = PARTS.iter().flat_map(|p| lost_members(pool, p)).collect();
    pool.meta()
        .drives
        .iter()
        .filter(|d| d.class == class && d.state == DriveState::Active && !lost.contains(&d.slot))
        .map(|d| d.slot)
        .collect()
}

/// Between cycles, at a quiescent point (after verify and scrub, mover held, nothing in
/// flight, everything durable): fail a fast or a capacity drive within the parts' tolerance, or
/// replace a failed drive (rebuilt during the next work phase).
async fn drive_event(world: &mut World, pool: &Pool<Dev>) -> Maintenance {
    let fast_ok = ["tv.cache", "tv.meta"].iter().all(|p| lost_members(pool, p).is_empty());
    let cap_ok = lost_members(pool, "tv.seg").len() < 2;
    let failed: Vec<(u32, DriveClass)> = pool
        .meta()
        .drives
        .iter()
        .filter(|d| d.state == DriveState::Failed)
        .map(|d| (d.slot, d.class))
        .collect();
    let (class, coverage) = match world.rng.random_range(0..10) {
        0 if fast_ok => (DriveClass::Fast, &COVERAGE.fast_failures),
        1 | 2 if cap_ok => (DriveClass::Capacity, &COVERAGE.capacity_failures),
        3..=5 if !failed.is_empty() && world.spares < SPARES_MAX => {
            let (slot, class) = failed[world.rng.random_range(0..failed.len())];
            world.spares += 1;
            let name = format!("spare{}", world.spares);
            let dev = sim_drive(&name, &world.switch, world.seed * 100 + 50 + world.spares as u64);
            let new = NewDrive {
                dev: Arc::clone(&dev),
                path: name.clone(),
                class,
                domain: String::new(),
                fresh: true,
            };
            match pool.replace_drive(slot, new).await {
                Ok(new_slot) => {
                    world.note(format!("{class} drive in slot {slot} replaced by {name} (slot {new_slot})"));
                    count(&COVERAGE.replacements);
                    if class == DriveClass::Fast {
                        world.fast_names.push(name);
                    }
                    world.disks.push(dev);
                }
                // A failed drive that was itself a replacement being rebuilt.
                Err(stria_engine::EngineError::Busy(why)) => {
                    world.note(format!("replacing slot {slot} refused: {why}"));
                }
                Err(e) => world.fail(format!("replace slot {slot}: {e}")),
            }
            return Maintenance::Rebuild;
        }
        _ => return Maintenance::None,
    };
    let candidates = whole_drives(pool, class);
    let slot = candidates[world.rng.random_range(0..candidates.len())];
    world.note(format!("{class} drive in slot {slot} failed (idle)"));
    pool.fail_drive(slot, "failed by the test").await.unwrap_or_else(|e| world.fail(format!("fail: {e}")));
    count(coverage);
    Maintenance::None
}

/// Which bytes worker `w` (of 3) writes: worker 0 owns the first half (64 KiB pieces, long and
/// unaligned writes); workers 1 and 2 share the second half in alternating 32 KiB pieces, so
/// every map page there gets updates from both.
fn seq_range(rng: &mut ChaCha8Rng, w: usize) -> (u64, u64) {
    let half = SEQ_VOLUME_BYTES / 2;
    if w == 0 {
        if rng.random_range(0..4) == 0 {
            let sets = half / (64 << 10);
            let s = rng.random_range(0..sets);
            return (s * (64 << 10), (64 << 10) * rng.random_range(1..=2.min(sets - s)));
        }
        let start = rng.random_range(0..half / 4096) * 4096;
        let len = rng.random_range(1..=(half - start).min(160 << 10));
        let start = if rng.random_bool(0.3) { start + rng.random_range(0..4096).min(len - 1) } else { start };
        return (start, len.min(half - start).max(1));
    }
    let pieces = half / (32 << 10);
    let p = (rng.random_range(0..pieces / 2) * 2 + (w as u64 - 1)) * (32 << 10) + half;
    if rng.random_range(0..4) == 0 {
        return (p, 32 << 10);
    }
    let o = rng.random_range(0..32 << 10);
    (p + o, rng.random_range(1..=(32 << 10) - o))
}

async fn seq_worker(vol: &LogVolume<Dev>, t: &RefCell<Tracker>, seed: u64, w: usize) {
    let mut rng = rng(seed * 31 + w as u64);
    for _ in 0..WRITES_PER_WORKER {
        let (offset, len) = seq_range(&mut rng, w);
        let roll = rng.random_range(0..12);
        // Zeroing, trim and FUA writes are durable when they return; plain writes unless the
        // volume writes back (then a completed flush makes them so).
        let (written, result, durable) = match roll {
            0 => {
                let written = t.borrow_mut().issue(offset, &vec![0u8; len as usize]);
                (written, vol.write_zeroes(offset, len, false).await, true)
            }
            1 => {
                // Trim zeroes the whole blocks inside the range only.
                let (a, b) = (offset.next_multiple_of(4096), (offset + len) / 4096 * 4096);
                let written =
                    if b > a { t.borrow_mut().issue(a, &vec![0u8; (b - a) as usize]) } else { Vec::new() };
                (written, vol.trim(offset, len).await, true)
            }
            _ => {
                let data = random_bytes(&mut rng, len as usize);
                let written = t.borrow_mut().issue(offset, &data);
                (written, vol.write(offset, IoBytes::copy_from(&data), roll <= 3).await, roll <= 3)
            }
        };
        if result.is_err() {
            return; // the power is off or the volume closed
        }
        if durable {
            t.borrow_mut().acknowledge_durable(&written);
        } else {
            t.borrow_mut().acknowledge(&written);
        }
        tokio::task::yield_now().await;
    }
}

/// Reads racing the writers and the mover: every block is a version at least as new as the
/// one acknowledged when the read started. An error is allowed only once the power is off or the
/// volume is closing.
async fn seq_reader(
    vol: &LogVolume<Dev>,
    t: &RefCell<Tracker>,
    seed: u64,
    down: impl Fn() -> bool,
) -> Result<(), String> {
    let mut rng = rng(seed * 17 + 5);
    for _ in 0..20 {
        let first = rng.random_range(0..SEQ_BLOCKS);
        let n = rng.random_range(1..=16).min(SEQ_BLOCKS - first);
        let floor: Vec<usize> = t.borrow().acked[first..first + n].to_vec();
        let got = match vol.read(first as u64 * 4096, n * 4096).await {
            Ok(got) => got,
            Err(_) if down() => return Ok(()),
            Err(e) => return Err(format!("a read of blocks {first}..{} failed: {e}", first + n)),
        };
        for (k, block) in got.chunks_exact(4096).enumerate() {
            let (b, t) = (first + k, t.borrow());
            if !t.versions[b][floor[k]..].iter().any(|v| v[..] == block[..]) {
                return Err(format!("a read during work: block {b} holds {}", t.describe(b, block)));
            }
        }
        tokio::task::yield_now().await;
    }
    Ok(())
}

async fn seq_flusher(vol: &LogVolume<Dev>, t: &RefCell<Tracker>, seed: u64) {
    let mut rng = rng(seed * 7 + 3);
    for _ in 0..12 {
        for _ in 0..rng.random_range(1..8) {
            tokio::task::yield_now().await;
        }
        let at = t.borrow().flush_started();
        if vol.flush().await.is_err() {
            return;
        }
        t.borrow_mut().flushed(&at);
    }
}

async fn seq_maintenance(pool: &Pool<Dev>, task: Maintenance) {
    match task {
        Maintenance::None => {}
        Maintenance::Scrub(part) => {
            count(&COVERAGE.scrubs_under_load);
            let _ = pool.scrub(part, |_, _| {}).await;
        }
        Maintenance::Rebuild => match pool.rebuild(|_| {}).await {
            Ok(()) => count(&COVERAGE.rebuilds_done),
            Err(_) => count(&COVERAGE.rebuilds_cut),
        },
    }
}

/// The destage policy of a work phase: always on, or between low watermarks.
fn work_params(rng: &mut ChaCha8Rng, p: LogParams) -> LogParams {
    if rng.random_bool(0.6) {
        return LogParams { always: true, hold: false, ..p };
    }
    let start_percent = rng.random_range(10..=60);
    let stop_percent = rng.random_range(0..start_percent);
    LogParams { always: false, hold: false, start_percent, stop_percent, ..p }
}

async fn work(world: &mut World, pool: &Pool<Dev>, vol: &LogVolume<Dev>, task: Maintenance, cycle: u64) {
    let ending = match world.rng.random_range(0..5) {
        0 | 1 => Ending::PowerCut,
        2 | 3 => Ending::Kill,
        _ => Ending::CleanClose,
    };
    let switch = Arc::clone(&world.switch);
    // A work phase takes some 3,000-6,000 requests: most cuts land inside it, some after it
    // (then the power goes at the end, with the mover maybe in the middle of a batch).
    // A rebuild takes a few hundred requests at the start of the phase: half of its cuts land
    // early, so that some cut the rebuild.
    let cut_after = match task {
        Maintenance::Rebuild if world.rng.random_bool(0.5) => world.rng.random_range(0..1000),
        _ => world.rng.random_range(0..6000),
    };
    // Every GC policy in turn (their streams differ; not drawn, which would change every seed).
    let gc = [GcPolicy::Greedy, GcPolicy::CostBenefit, GcPolicy::Temperature][(cycle % 3) as usize];
    let params =
        LogParams { gc, write_back: world.tracker.write_back, ..work_params(&mut world.rng, vol.params()) };
    let close_after = world.rng.random_range(0..1500);
    let policy = if params.always {
        "always".to_string()
    } else {
        format!("from {}% down to {}%", params.start_percent, params.stop_percent)
    };
    world.note(format!(
        "cycle {cycle}: work with {task:?}, destage {policy}, GC {gc:?}, write-back {}, ending {ending:?} ({})",
        params.write_back,
        if ending == Ending::CleanClose {
            format!("close after {close_after} yields")
        } else {
            format!("cut after {cut_after} requests")
        }
    ));
    let destaged_before = vol.counters().destaged_blocks.load(Relaxed);
    let moved_before = vol.counters().gc_moved_blocks.load(Relaxed);
    vol.set_params(params);
    let ops_before = switch.ops_passed();
    if ending != Ending::CleanClose {
        switch.trip_after_ops(cut_after);
    }
    let tracker = RefCell::new(std::mem::replace(&mut world.tracker, Tracker::new(SEQ_BLOCKS)));
    let closing = std::cell::Cell::new(false);
    let seed = world.seed * 1000 + cycle;
    let closer = async {
        if ending != Ending::CleanClose {
            return Ok(());
        }
        for _ in 0..close_after {
            tokio::task::yield_now().await;
        }
        closing.set(true);
        vol.close().await;
        // A clean close makes every acknowledged write durable.
        let at = tracker.borrow().flush_started();
        tracker.borrow_mut().flushed(&at);
        pool.close().await
    };
    let down = || switch.is_off() || closing.get();
    let (_, _, _, read, (), (), closed) = tokio::join!(
        seq_worker(vol, &tracker, seed, 0),
        seq_worker(vol, &tracker, seed, 1),
        seq_worker(vol, &tracker, seed, 2),
        seq_reader(vol, &tracker, seed, down),
        seq_flusher(vol, &tracker, seed),
        seq_maintenance(pool, task),
        closer
    );
    world.tracker = tracker.into_inner();
    if let Err(e) = read {
        world.fail(format!("cycle {cycle}: {e}"));
    }
    if let Err(e) = closed {
        world.fail(format!("cycle {cycle}: clean close failed: {e}"));
    }
    if let Some(cut) = switch.cut_point().filter(|c| !c.device.is_empty()) {
        let fast = world.fast_names.contains(&cut.device);
        count(if fast { &COVERAGE.cuts_on_fast } else { &COVERAGE.cuts_on_capacity });
        world.note(format!("cycle {cycle}: the cut landed under a request to {}", cut.device));
    }
    world.note(format!("cycle {cycle}: {} requests in the work phase", switch.ops_passed() - ops_before));
    // The crash: the mover may be in the middle of a batch.
    switch.trip();
    vol.close().await;
    COVERAGE
        .destaged_blocks
        .fetch_add(vol.counters().destaged_blocks.load(Relaxed) - destaged_before, Relaxed);
    COVERAGE.gc_moved_blocks.fetch_add(vol.counters().gc_moved_blocks.load(Relaxed) - moved_before, Relaxed);
    COVERAGE.cache_growths.fetch_add(vol.counters().cache_growths.load(Relaxed), Relaxed);
    count(&COVERAGE.cycles);
    count(match ending {
        Ending::PowerCut => &COVERAGE.power_cuts,
        Ending::Kill => &COVERAGE.kills,
        Ending::CleanClose => &COVERAGE.clean_closes,
    });
    let images = world.images(ending);
    world.reboot(images);
}

async fn run_sequence(seed: u64) {
    let mut world = World {
        seed,
        rng: rng(seed ^ 0x7132_5e9e),
        disks: Vec::new(),
        spares: 0,
        switch: PowerSwitch::new(),
        // Odd seeds write back: plain writes are durable at the next completed flush.
        tracker: Tracker { write_back: seed % 2 == 1, ..Tracker::new(SEQ_BLOCKS) },
        history: Vec::new(),
        fast_names: vec!["d0".into(), "d1".into()],
    };
    let switch = Arc::clone(&world.switch);
    world.disks = (0..8).map(|i| sim_drive(&format!("d{i}"), &switch, seed * 100 + i)).collect();
    // A cache of 2-8 batches of 31 blocks; the segment space at 2/3 fill, so GC runs.
    let cache_bytes = [256 << 10, 512 << 10, 1 << 20][world.rng.random_range(0..3)];
    {
        let pool = create_pool(&world.disks).await;
        let spec = stria_tier::log::LogSpec {
            cache_bytes: Some(cache_bytes),
            // A third of the seeds: a cache that grows to 4 times that as writers find it full.
            cache_max_bytes: (seed % 3 == 2).then_some(4 * cache_bytes),
            ..small_spec("tv", SEQ_VOLUME_BYTES, small_space(SEQ_BLOCKS as u64))
        };
        let vol = stria_tier::log::create(&pool, spec).await.expect("create the volume");
        vol.close().await;
        pool.close().await.expect("close");
    }
    let cycles = world.rng.random_range(1..=8);
    world.note(format!("{cycles} cycles, cache {} KiB", cache_bytes >> 10));
    for cycle in 0..=cycles {
        let (pool, vol) = world.boot().await;
        world.verify(&vol, &format!("cycle {cycle} after boot")).await;
        world.check_scrub(&pool, cycle).await;
        if cycle == cycles {
            vol.close().await;
            pool.close().await.unwrap_or_else(|e| world.fail(format!("final close: {e}")));
            return;
        }
        let mut task = drive_event(&mut world, &pool).await;
        if task == Maintenance::None {
            task = match world.rng.random_range(0..4) {
                _ if pool.rebuild_pending() => Maintenance::Rebuild,
                0 => Maintenance::Scrub(PARTS[world.rng.random_range(0..3)]),
                _ => Maintenance::None,
            };
        }
        work(&mut world, &pool, &vol, task, cycle).await;
    }
}

/// The seed being run, for the watchdog.
static CURRENT_SEED: AtomicU64 = AtomicU64::new(u64::MAX);
/// Wall-clock seconds after which a seed counts as hung (a seed takes well under a second).
const SEED_SECONDS_MAX: u64 = 300;

/// A hang (every task waiting for something that never comes) parks the runtime for good, since
/// time is paused and no timer is due: name the seed and end the process instead of hanging.
fn start_watchdog() {
    std::thread::spawn(|| {
        let (mut seed, mut since) = (u64::MAX, std::time::Instant::now());
        loop {
            std::thread::sleep(std::time::Duration::from_secs(5));
            let now = CURRENT_SEED.load(Relaxed);
            if now != seed {
                (seed, since) = (now, std::time::Instant::now());
            } else if since.elapsed().as_secs() > SEED_SECONDS_MAX {
                eprintln!(
                    "seed {seed} has not finished after {SEED_SECONDS_MAX} s: a hang (replay: STRIA_TIER_SEQ_SEED={seed})"
                );
                std::process::exit(1);
            }
        }
    });
}

#[tokio::test(start_paused = true)]
async fn sequences_of_crashes_during_destage_lose_no_write() {
    start_watchdog();
    if let Ok(one) = std::env::var("STRIA_TIER_SEQ_SEED") {
        let seed = one.parse().expect("STRIA_TIER_SEQ_SEED is a number");
        CURRENT_SEED.store(seed, Relaxed);
        run_sequence(seed).await;
        return;
    }
    let seeds: u64 = std::env::var("STRIA_TIER_SEQ_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(60);
    let first: u64 =
        std::env::var("STRIA_TIER_SEQ_FIRST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0);
    for seed in first..first + seeds {
        CURRENT_SEED.store(seed, Relaxed);
        run_sequence(seed).await;
    }
    let c = &*COVERAGE;
    let n = |a: &AtomicU64| a.load(Relaxed);
    eprintln!(
        "{seeds} seeds from {first}: {} cycles ({} power cuts, {} kills, {} clean closes), {} boots cut during recovery, \
         cuts under fast/capacity drive requests {}/{}, {} fast and {} capacity drives failed, {} replaced, \
         {} rebuilds completed and {} cut, {} scrubs under load, {} blocks destaged, \
         {} moved by GC, {} cache growths",
        n(&c.cycles),
        n(&c.power_cuts),
        n(&c.kills),
        n(&c.clean_closes),
        n(&c.boot_cuts),
        n(&c.cuts_on_fast),
        n(&c.cuts_on_capacity),
        n(&c.fast_failures),
        n(&c.capacity_failures),
        n(&c.replacements),
        n(&c.rebuilds_done),
        n(&c.rebuilds_cut),
        n(&c.scrubs_under_load),
        n(&c.destaged_blocks),
        n(&c.gc_moved_blocks),
        n(&c.cache_growths),
    );
}
