//! Seeded *sequences* of crashes on one pool (TigerBeetle's VOPR, FoundationDB's simulator):
//! each seed creates a pool and runs 1-8 cycles of boot → verify → scrub → work → crash, on
//! the same drives, for every layout.
//!
//! * A **boot** may itself be cut (a crash during recovery), and is then retried.
//! * **Work** is three writers (partial- and full-stripe writes, FUA writes, zeroing), a
//!   flusher, two writers and a flusher of a second volume `w` on the same drives (flushes are
//!   per volume: one volume's flush must not vouch for the other's writes or transactions), and
//!   one maintenance task drawn by the seed: nothing, a scrub, a rebuild of a
//!   replaced drive, metadata commits (creating and deleting a scratch volume), moving extents
//!   (a drive added and a member drive drained for `drive remove`, so a member of the volume is
//!   copied while it is written, a crash landing mid-copy resumes it at its committed cursor,
//!   and the drive is removed once empty), or — on mirror layouts,
//!   which have no write hole — failing a drive under load.
//! * The **crash** is a power cut (unflushed writes dropped or torn, per block), a process kill
//!   (every write a drive accepted is kept, in any order, and nothing after), or a clean close
//!   racing the writers.
//! * Between cycles, with the pool down, a drive may be failed, replaced, or **swapped for an
//!   old copy of itself** (a drive restored from a backup, or its file put back).
//! * During the work a drive may be **copied live** (what it holds at a random instant, as `cp`
//!   of a drive file sees it) and the copy put back at the next boot, when the pool went on past a
//!   flush epoch or generation confirmed after the copy was taken, and the cycle did not end in a
//!   power cut (docs/design/stale-copies.md says which copies cannot be told apart; they are not
//!   put back). The copy must be left out.
//!
//! After every boot every block must read back as its last durable version (last FUA write, or
//! last write completed before an acknowledged flush started) or a newer one — never an older
//! one, never bytes that were never written — and a scrub must find every stripe consistent. A
//! read may fail only if the volume is failed (more members lost than it tolerates); a stale
//! drive must never be trusted.
//!
//! `STRIA_SEQ_SEEDS=N` sets the number of seeds (default 200), `STRIA_SEQ_FIRST_SEED=F` the
//! first (default 0; the seeds that once found a bug run too); `STRIA_SEQ_SEED=S` replays one
//! seed and prints its history. `STRIA_SEQ_FOCUS=moves` biases every seed (of any of these
//! modes) towards the races of moves with failures: ec:4+2 only, drives failed between cycles
//! more often, a drive added and a member drained whenever the pool is whole, and the move run
//! whenever one is pending (seed 167478 needed a move's switch, a flush and a stripe with two
//! members out in one cycle). The default seeds are unchanged by it.

#![allow(clippy::cast_possible_truncation)] // 64-bit only, like the engine

use std::cell::RefCell;
use std::sync::Arc;

use crate::common::workload::{BLOCKS, FuaMix, Tracker, VOLUME_BYTES, flusher, worker};
use crate::common::*;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use stria_dev::{FaultConfig, FaultDevice, PowerSwitch};
use stria_engine::{DriveClass, FoundDrive, Layout, Pool, Volume, VolumeState};

const CHUNK: u64 = 16 << 10;
/// Replacement drives a seed may add.
const SPARES_MAX: usize = 2;

/// How a cycle ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    PowerCut,
    Kill,
    CleanClose,
}

/// The background task of a work phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Maintenance {
    None,
    Scrub,
    Rebuild,
    MetadataCommits,
    FailUnderLoad,
    Rebalance,
}

/// An old copy of a disk, to be put back later (a backup, or a copied drive file).
enum Backup {
    None,
    /// To be taken at the next clean close (when the drive is consistent).
    Wanted,
    /// Taken at the clean close ending this cycle.
    Taken(Box<stria_dev::mem::MemDevice>, u64),
}

/// One drive the operator has: its current contents, and maybe an old copy of it.
struct Disk {
    dev: Dev,
    backup: Backup,
}

struct World {
    seed: u64,
    /// Biased towards moves racing failures (`STRIA_SEQ_FOCUS=moves`).
    focus: bool,
    rng: ChaCha8Rng,
    layout: Layout,
    disks: Vec<Disk>,
    spares: usize,
    tracker: Tracker,
    /// What volume `w` should hold: a second volume of the same layout on the same drives,
    /// written and flushed by its own writers and flusher, so that a flush of one volume never
    /// counts the other's transactions or writes durable (docs/crash-consistency.md invariant 4).
    neighbour: Tracker,
    history: Vec<String>,
    /// A drive was swapped for an old copy of itself at the last boot: its index and the
    /// current drive it replaced.
    swapped_in: Option<(usize, Dev)>,
    /// The power switch every current drive hangs on.
    switch: Arc<PowerSwitch>,
    /// How the last cycle ended.
    last_ending: Ending,
    /// A copy of disk `.0` taken during the last cycle's work, to be put back at the next boot.
    live_copy: Option<(usize, stria_dev::mem::MemDevice)>,
    /// Drives active in the pool when the last cycle ended.
    active_drives: usize,
}

/// Drives of the simulation: requests complete after a few polls, so other tasks run between a
/// request's submission and its completion (see `FaultConfig::completion_polls_max`).
fn sim_config() -> FaultConfig {
    FaultConfig { completion_polls_max: 3, ..FaultConfig::default() }
}

/// A new simulated drive on `switch`.
fn sim_drive(name: &str, switch: &Arc<PowerSwitch>, seed: u64) -> Dev {
    let mem = stria_dev::mem::MemDevice::new(name, DRIVE_BYTES);
    Arc::new(FaultDevice::with_config(mem, sim_config(), seed).with_power_switch(Arc::clone(switch)))
}

/// `STRIA_SEQ_FOCUS=moves` (see the module's doc).
fn focus_from_env() -> bool {
    std::env::var("STRIA_SEQ_FOCUS").is_ok_and(|f| f == "moves")
}

fn layout_for(seed: u64, focus: bool) -> (Layout, usize) {
    if focus {
        return (Layout::Ec { data_shards: 4, parity_shards: 2 }, 6);
    }
    match seed % 6 {
        0 => (Layout::Ec { data_shards: 4, parity_shards: 2 }, 6),
        1 => (Layout::Ec { data_shards: 3, parity_shards: 1 }, 4),
        2 => (Layout::Raid1 { copies: 2 }, 2),
        3 => (Layout::Raid10 { width: 2, copies: 2 }, 4),
        4 => (Layout::Raid1 { copies: 3 }, 3),
        _ => (Layout::Raid0 { width: 3 }, 3),
    }
}

impl World {
    fn note(&mut self, what: String) {
        if std::env::var("STRIA_SEQ_SEED").is_ok() {
            eprintln!("seed {}: {what}", self.seed);
        }
        self.history.push(what);
    }

    fn fail(&self, what: String) -> ! {
        let focus = if self.focus { ", focused on moves" } else { "" };
        panic!(
            "seed {} ({}{focus}): {what}\nhistory:\n  {}",
            self.seed,
            self.layout,
            self.history.join("\n  ")
        );
    }

    /// The devices as found after a reboot: fresh drives with the given contents, on a new
    /// power switch.
    fn reboot(&mut self, images: Vec<stria_dev::mem::MemDevice>) -> Arc<PowerSwitch> {
        let switch = PowerSwitch::new();
        for (disk, image) in self.disks.iter_mut().zip(images) {
            disk.dev = Arc::new(
                FaultDevice::with_config(image, sim_config(), self.seed ^ 0x5eed ^ self.rng.random::<u64>())
                    .with_power_switch(Arc::clone(&switch)),
            );
        }
        self.switch = Arc::clone(&switch);
        switch
    }

    fn images(&mut self, ending: Ending) -> Vec<stria_dev::mem::MemDevice> {
        let base = self.rng.random::<u64>();
        crash_images(self.disks.iter().map(|d| &d.dev), ending == Ending::PowerCut, base)
    }

    /// Opens the pool from every disk the operator has (failed and stale ones included: the
    /// pool must leave them out). A boot may be cut, then it is retried.
    async fn boot(&mut self) -> Pool<Dev> {
        for attempt in 0.. {
            let images = self.images(Ending::Kill);
            let switch = self.reboot(images);
            let cut = attempt < 3 && self.rng.random_bool(0.25);
            if cut {
                let ops = self.rng.random_range(0..600);
                switch.trip_after_ops(ops);
                self.note(format!("boot {attempt}: power cut armed after {ops} requests"));
            }
            let found =
                self.disks.iter().map(|d| FoundDrive { dev: Arc::clone(&d.dev), path: dev_path(&d.dev) });
            match Pool::open_skipping(found.collect(), false).await {
                Ok(pool) if !switch.is_off() => {
                    switch.trip_after_ops(u64::MAX);
                    let recopied = pool.recovery_report().move_rows_recopied;
                    COVERAGE.move_rows_recopied.fetch_add(recopied, std::sync::atomic::Ordering::Relaxed);
                    small_csum_cache(&pool, self.seed);
                    // Moves here are short: a cursor commit every few rows, so cuts land between.
                    pool.set_move_cursor_step(64 << 10);
                    return pool;
                }
                Ok(pool) => {
                    drop(pool);
                    self.note("boot: cut after the pool opened".into());
                    let images = self.images(Ending::PowerCut);
                    self.reboot(images);
                }
                // Left out as stale, the old copy may leave too few drives to trust the
                // metadata: refusing is right, and the operator puts the current drive back.
                Err(stria_engine::EngineError::NoQuorum { .. }) if self.swapped_in.is_some() => {
                    let (i, current) = self.swapped_in.take().expect("checked");
                    self.note(format!(
                        "refused to open with the old copy of {} (no quorum); put back",
                        dev_path(&current)
                    ));
                    count(&COVERAGE.swaps_refused);
                    self.disks[i].dev = current;
                }
                Err(e) if switch.is_off() => {
                    count(&COVERAGE.boot_cuts);
                    self.note(format!("boot cut during recovery: {e}"));
                    let images = self.images(Ending::PowerCut);
                    self.reboot(images);
                }
                Err(e) => self.fail(format!("the pool did not open: {e}")),
            }
        }
        unreachable!()
    }

    /// Reads every block: each must be an allowed version; then the read becomes the baseline.
    /// [`World::verify`] of volume `w`, against its own tracker.
    async fn verify_neighbour(&mut self, w: &Volume<Dev>, when: &str) {
        std::mem::swap(&mut self.tracker, &mut self.neighbour);
        self.verify(w, &format!("{when}, volume w")).await;
        std::mem::swap(&mut self.tracker, &mut self.neighbour);
    }

    /// For a failure message: which version of block `b` each disk holds at the block's data
    /// offset (by path; "other" for bytes that are no version of it, parity for instance).
    async fn raw_versions(&self, vol: &Volume<Dev>, b: usize) -> String {
        let Ok(locations) = vol.locate(b as u64 * 4096) else { return "unknown".into() };
        let Some(data) = locations.iter().find(|l| l.role == stria_engine::BlockRole::Data) else {
            return "no data location".into();
        };
        let mut out = Vec::new();
        for disk in &self.disks {
            let buf = stria_dev::IoBuf::zeroed(4096);
            let what = match stria_dev::BlockDevice::read(&*disk.dev, data.device_offset_bytes, buf).await {
                Ok(got) => match self.tracker.versions[b].iter().position(|v| v[..] == got[..]) {
                    Some(v) => format!("version {v}"),
                    None => "other".into(),
                },
                Err(e) => format!("unreadable ({e})"),
            };
            out.push(format!("{} {what}", dev_path(&disk.dev)));
        }
        out.join(", ")
    }

    async fn verify(&mut self, vol: &Volume<Dev>, when: &str) {
        let failed = vol.state() == VolumeState::Failed;
        for b in 0..BLOCKS {
            match vol.read(b as u64 * 4096, 4096).await {
                Ok(got) => {
                    if !self.tracker.allowed(b).iter().any(|v| v[..] == got[..]) {
                        let raw = self.raw_versions(vol, b).await;
                        let older = self.tracker.versions[b][..self.tracker.durable[b]]
                            .iter()
                            .position(|v| v[..] == got[..]);
                        self.fail(format!(
                            "{when}: block {b} (on {:?}) reads {} (durable version {} of {}; versions written: {}; \
                             what the disks hold there: {raw})",
                            vol.locate(b as u64 * 4096).ok(),
                            match older {
                                Some(v) => format!("version {v}, OLDER than the durable one"),
                                None => "bytes never written".into(),
                            },
                            self.tracker.durable[b],
                            self.tracker.versions[b].len() - 1,
                            self.tracker.how[b].join(", ")
                        ));
                    }
                    self.tracker.settle(b, got.to_vec());
                }
                Err(_) if failed => {}
                Err(e) => {
                    self.fail(format!("{when}: block {b} unreadable on a {:?} volume: {e}", vol.state()))
                }
            }
        }
    }
}

/// What the seeds did, summed over a run (printed at the end, so a run shows what it covered).
#[derive(Default)]
struct Coverage {
    cycles: std::sync::atomic::AtomicU64,
    power_cuts: std::sync::atomic::AtomicU64,
    kills: std::sync::atomic::AtomicU64,
    clean_closes: std::sync::atomic::AtomicU64,
    boot_cuts: std::sync::atomic::AtomicU64,
    swaps_left_out: std::sync::atomic::AtomicU64,
    swaps_refused: std::sync::atomic::AtomicU64,
    live_copies_taken: std::sync::atomic::AtomicU64,
    live_copies_put_back: std::sync::atomic::AtomicU64,
    failed_volumes: std::sync::atomic::AtomicU64,
    moves_done: std::sync::atomic::AtomicU64,
    moves_resumed: std::sync::atomic::AtomicU64,
    move_rows_recopied: std::sync::atomic::AtomicU64,
    drives_removed: std::sync::atomic::AtomicU64,
    onlines_delta: std::sync::atomic::AtomicU64,
    onlines_full: std::sync::atomic::AtomicU64,
}

static COVERAGE: std::sync::LazyLock<Coverage> = std::sync::LazyLock::new(Coverage::default);

fn count(c: &std::sync::atomic::AtomicU64) {
    c.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

fn dev_path(dev: &Dev) -> String {
    use stria_dev::BlockDevice;
    dev.name().to_string()
}

async fn maintenance(pool: &Pool<Dev>, task: Maintenance, victim: Option<u32>) {
    match task {
        Maintenance::None => {}
        Maintenance::Scrub => {
            let _ = pool.scrub("v", |_, _| {}).await;
        }
        Maintenance::Rebuild => {
            let _ = pool.rebuild(|_| {}).await;
        }
        Maintenance::MetadataCommits => {
            for i in 0..4 {
                tokio::task::yield_now().await;
                let s = spec(&format!("scratch{i}"), 64 << 10, Layout::Raid0 { width: 1 }, 4096);
                if pool.create_volume(s).await.is_err()
                    || pool.delete_volume(&format!("scratch{i}")).await.is_err()
                {
                    return;
                }
            }
        }
        Maintenance::Rebalance => {
            if let Ok(r) = pool.rebalance(|_| {}).await {
                COVERAGE.moves_done.fetch_add(r.moves, std::sync::atomic::Ordering::Relaxed);
                if r.bytes_resumed > 0 {
                    count(&COVERAGE.moves_resumed);
                }
            }
            for slot in pool.drained() {
                if pool.remove_empty_drive(slot).await.is_ok() {
                    count(&COVERAGE.drives_removed);
                }
            }
        }
        Maintenance::FailUnderLoad => {
            for _ in 0..20 {
                tokio::task::yield_now().await;
            }
            if let Some(slot) = victim {
                let _ = pool.fail_drive(slot, "failed under load by the test").await;
            }
        }
    }
}

/// Slots of the active drives holding part of volume `v`.
fn active_members(pool: &Pool<Dev>) -> Vec<u32> {
    let meta = pool.meta();
    let vol = meta.volumes.iter().find(|v| v.name == "v").expect("volume v");
    let mut slots: Vec<u32> = vol.segments.iter().flat_map(|s| s.members.iter().map(|m| m.slot)).collect();
    slots.sort_unstable();
    slots.dedup();
    slots.retain(|&s| meta.drive(s).is_some_and(|d| d.state == stria_engine::DriveState::Active));
    slots
}

fn failed_slots(pool: &Pool<Dev>) -> Vec<u32> {
    pool.meta()
        .drives
        .iter()
        .filter(|d| d.state == stria_engine::DriveState::Failed)
        .map(|d| d.slot)
        .collect()
}

/// Between cycles, with the pool running but idle: fail, replace, or back up a drive.
async fn drive_event(world: &mut World, pool: &Pool<Dev>) -> Maintenance {
    let members = active_members(pool);
    let failed = failed_slots(pool);
    let tolerance = world.layout.tolerance() as usize;
    let lost = world.layout_width() - members.len();
    let roll = if world.focus {
        // A whole pool adds a drive and drains a member; otherwise mostly idle failures.
        match world.rng.random_range(0..10) {
            _ if lost == 0 && world.spares < SPARES_MAX && pool.meta().drives.iter().all(|d| !d.draining) => {
                5
            }
            0..=4 => 0,
            r => r,
        }
    } else {
        world.rng.random_range(0..10)
    };
    match roll {
        0 | 1 if lost < tolerance => {
            let slot = members[world.rng.random_range(0..members.len())];
            world.note(format!("drive in slot {slot} failed (idle)"));
            pool.fail_drive(slot, "failed by the test")
                .await
                .unwrap_or_else(|e| world.fail(format!("fail: {e}")));
            Maintenance::None
        }
        2 | 3 if !failed.is_empty() && world.spares < SPARES_MAX => {
            let slot = failed[world.rng.random_range(0..failed.len())];
            // Only slots that still hold part of the volume need a replacement.
            let meta = pool.meta();
            let holds = meta
                .volumes
                .iter()
                .any(|v| v.segments.iter().any(|s| s.members.iter().any(|m| m.slot == slot)));
            if !holds {
                return Maintenance::None;
            }
            world.spares += 1;
            let dev = sim_drive(
                &format!("spare{}", world.spares),
                &world.switch,
                world.seed * 100 + world.spares as u64,
            );
            match pool.replace_drive(slot, new_drive(&dev, DriveClass::Capacity, "")).await {
                Ok(_) => {}
                // A failed drive that was itself a replacement being rebuilt: not replaceable yet.
                Err(stria_engine::EngineError::Busy(why)) => {
                    world.note(format!("replacing slot {slot} refused: {why}"));
                    return Maintenance::Rebuild;
                }
                Err(e) => world.fail(format!("replace: {e}")),
            }
            world.note(format!("drive in slot {slot} replaced by spare{}", world.spares));
            world.disks.push(Disk { dev, backup: Backup::None });
            Maintenance::Rebuild
        }
        5 if world.spares < SPARES_MAX
            && lost == 0
            && !pool.rebuild_pending()
            && pool.meta().drives.iter().all(|d| !d.draining) =>
        {
            // `drive add`, then `drive remove` of a member drive: its extent moves to the new one.
            world.spares += 1;
            let name = format!("added{}", world.spares);
            let dev = sim_drive(&name, &world.switch, world.seed * 100 + 50 + world.spares as u64);
            let added = pool
                .add_drive(new_drive(&dev, DriveClass::Capacity, ""))
                .await
                .unwrap_or_else(|e| world.fail(format!("drive add: {e}")));
            world.disks.push(Disk { dev, backup: Backup::None });
            let slot = members[world.rng.random_range(0..members.len())];
            // A scratch volume of a cut metadata commit (raid0:1) whose drive was replaced is lost
            // for good; while it has a member on the drive, the drain is refused and says so.
            let lost_scratch = pool.meta().volumes.iter().any(|v| {
                v.segments.iter().any(|s| s.members.iter().any(|m| m.slot == slot))
                    && pool.volume(&v.name).is_some_and(|vol| vol.state() == VolumeState::Failed)
            });
            match pool.drain_drive(slot).await {
                Ok(()) => world.note(format!("{name} added as slot {added}; slot {slot} draining")),
                Err(e)
                    if lost_scratch
                        && e.to_string().contains("has lost more members than its layout survives") =>
                {
                    world.note(format!("{name} added as slot {added}; drain of slot {slot} refused: {e}"));
                    return Maintenance::None;
                }
                Err(e) => world.fail(format!("drain of slot {slot} refused with an empty drive added: {e}")),
            }
            Maintenance::Rebalance
        }
        6 | 7 if !failed.is_empty() => {
            // `drive online`: a failed drive comes back on its own disk (which may hold an old
            // copy by now): a delta resync when the pool kept what it missed, else a full one.
            let slot = failed[world.rng.random_range(0..failed.len())];
            let rec = pool.meta().drive(slot).cloned().expect("failed drive listed");
            let Some(disk) = world.disks.iter().find(|d| dev_path(&d.dev) == rec.path_hint) else {
                return Maintenance::None;
            };
            let dev = Arc::clone(&disk.dev);
            if stria_engine::maint::Online::check(pool, slot, false).is_err() {
                return Maintenance::None;
            }
            match pool.online_drive(slot, dev, &rec.path_hint).await {
                Ok(c) => {
                    count(if matches!(c, stria_engine::Comeback::Delta { .. }) {
                        &COVERAGE.onlines_delta
                    } else {
                        &COVERAGE.onlines_full
                    });
                    world.note(format!("drive in slot {slot} back online: {c:?}"));
                }
                Err(stria_engine::EngineError::Busy(why)) => {
                    world.note(format!("bringing slot {slot} back refused: {why}"));
                }
                Err(e) => world.fail(format!("online: {e}")),
            }
            Maintenance::Rebuild
        }
        4 if world.disks.iter().all(|d| matches!(d.backup, Backup::None)) => {
            let i = world.rng.random_range(0..world.disks.len());
            world.note(format!(
                "a backup of disk {} will be taken at the next clean close",
                dev_path(&world.disks[i].dev)
            ));
            world.disks[i].backup = Backup::Wanted;
            Maintenance::None
        }
        _ => Maintenance::None,
    }
}

impl World {
    fn layout_width(&self) -> usize {
        match self.layout {
            Layout::Raid0 { width } => width as usize,
            Layout::Raid1 { copies } => copies as usize,
            Layout::Raid10 { width, copies } => (width * copies) as usize,
            Layout::Ec { data_shards, parity_shards } => (data_shards + parity_shards) as usize,
        }
    }
}

/// Runs one seed; `focus` biases it towards moves racing failures (`STRIA_SEQ_FOCUS=moves`).
async fn run_seed(seed: u64, focus: bool) {
    let (layout, n) = layout_for(seed, focus);
    let mut world = World {
        seed,
        focus,
        rng: rng(seed ^ 0x00c0_ffee),
        layout,
        disks: Vec::new(),
        spares: 0,
        tracker: Tracker::new(),
        neighbour: Tracker::new(),
        history: Vec::new(),
        swapped_in: None,
        switch: PowerSwitch::new(),
        last_ending: Ending::CleanClose,
        live_copy: None,
        active_drives: n,
    };
    let switch = Arc::clone(&world.switch);
    world.disks = (0..n)
        .map(|i| Disk {
            dev: sim_drive(&format!("d{i}"), &switch, seed * 1000 + i as u64),
            backup: Backup::None,
        })
        .collect();
    {
        let pool = create_pool(&world.disks.iter().map(|d| Arc::clone(&d.dev)).collect::<Vec<_>>()).await;
        pool.create_volume(spec("v", VOLUME_BYTES, layout, CHUNK)).await.expect("create volume");
        pool.create_volume(spec("w", VOLUME_BYTES, layout, CHUNK)).await.expect("create volume w");
        pool.close().await.expect("close");
    }
    let cycles = world.rng.random_range(1..=8);
    world.note(format!("{cycles} cycles"));
    for cycle in 0..=cycles {
        if !swap_in_live_copy(&mut world) {
            maybe_swap_in_backup(&mut world, cycle);
        }
        let pool = world.boot().await;
        let Some(vol) = pool.volume("v") else { world.fail("volume v is gone".into()) };
        let Some(w) = pool.volume("w") else { world.fail("volume w is gone".into()) };
        check_swapped_drive_kept_out(&mut world, &pool);
        check_no_current_drive_called_stale(&world, &pool);
        world.verify(&vol, &format!("cycle {cycle} after boot")).await;
        world.verify_neighbour(&w, &format!("cycle {cycle} after boot")).await;
        if vol.state() == VolumeState::Failed || w.state() == VolumeState::Failed {
            count(&COVERAGE.failed_volumes);
            world.note("volume failed: the seed ends".into());
            return;
        }
        check_scrub(&mut world, &pool, cycle).await;
        if cycle == cycles {
            pool.close().await.unwrap_or_else(|e| world.fail(format!("final close: {e}")));
            return;
        }
        let mut task = drive_event(&mut world, &pool).await;
        if task == Maintenance::None && world.focus && pool.rebalance_pending() {
            task = Maintenance::Rebalance;
        }
        if task == Maintenance::None {
            task = match world.rng.random_range(0..5) {
                0 => Maintenance::Scrub,
                1 => Maintenance::MetadataCommits,
                2 if !matches!(layout, Layout::Ec { .. } | Layout::Raid0 { .. }) => {
                    Maintenance::FailUnderLoad
                }
                _ if pool.rebuild_pending() => Maintenance::Rebuild,
                _ if pool.rebalance_pending() => Maintenance::Rebalance,
                _ => Maintenance::None,
            };
        }
        work(&mut world, &pool, [&vol, &w], task, cycle).await;
    }
}

/// A drive marked for a backup at an earlier cycle is put back in place of itself.
/// Only once the pool has gone on without it (a later session opened and committed): a copy
/// put back at the very next boot is still current. On ec layouts only after a clean close: a
/// crash and the loss of a member before the next boot is the documented write-hole limit
/// (docs/crash-consistency.md, "Limits"), which swapping a drive out amounts to.
fn maybe_swap_in_backup(world: &mut World, cycle: u64) {
    world.swapped_in = None;
    if matches!(world.layout, Layout::Ec { .. }) && world.last_ending != Ending::CleanClose {
        return;
    }
    // Putting back an old copy of the only drive in use is a restore of the whole pool from a
    // backup, which is allowed: no other drive can tell it is old.
    if world.active_drives < 2 {
        return;
    }
    let Some(i) =
        world.disks.iter().position(|d| matches!(d.backup, Backup::Taken(_, at) if at + 2 <= cycle))
    else {
        return;
    };
    if !world.rng.random_bool(0.5) {
        return;
    }
    let Backup::Taken(image, _) = std::mem::replace(&mut world.disks[i].backup, Backup::None) else {
        unreachable!()
    };
    world.note(format!("disk {} swapped for its old copy", dev_path(&world.disks[i].dev)));
    let current = std::mem::replace(
        &mut world.disks[i].dev,
        Arc::new(FaultDevice::with_config(*image, sim_config(), 1)),
    );
    world.swapped_in = Some((i, current));
}

/// The copy of a drive taken during the last cycle is put back in its place, if there is one.
fn swap_in_live_copy(world: &mut World) -> bool {
    let Some((i, image)) = world.live_copy.take() else { return false };
    world.note(format!(
        "disk {} swapped for the copy taken during the last cycle",
        dev_path(&world.disks[i].dev)
    ));
    let current = std::mem::replace(
        &mut world.disks[i].dev,
        Arc::new(FaultDevice::with_config(image, sim_config(), 2)),
    );
    world.swapped_in = Some((i, current));
    count(&COVERAGE.live_copies_put_back);
    true
}

/// Without a copy put back, no drive may be left out as stale: the rules that catch copies
/// must never catch a drive that took every flush and commit.
fn check_no_current_drive_called_stale(world: &World, pool: &Pool<Dev>) {
    if world.swapped_in.is_some() {
        return;
    }
    for (path, why) in pool.ignored_drives() {
        if why.starts_with("stale: it holds metadata generation") || why.starts_with("stale: it took part") {
            world.fail(format!("current disk {path} was left out: {why}"));
        }
    }
}

/// What a live copy of `dev` records: its slot, its flush epoch and its superblock generation,
/// as assembly will read them.
fn copy_stamps(dev: &Dev) -> (u32, u64, u64) {
    use stria_engine::format::flush_record::{FLUSH_RECORD_OFFSET_BYTES, FlushRecord};
    use stria_engine::format::superblock::Superblock;
    let mut block = vec![0u8; 4096];
    dev.peek(FLUSH_RECORD_OFFSET_BYTES, &mut block);
    let epoch = FlushRecord::decode(&block).map_or(0, |r| r.epoch);
    let (mut slot, mut generation) = (u32::MAX, 0);
    for offset in [0, DRIVE_BYTES - 4096] {
        dev.peek(offset, &mut block);
        if let Ok(sb) = Superblock::decode(&block) {
            generation = generation.max(sb.generation);
            slot = sb.slot;
        }
    }
    (slot, epoch, generation)
}

/// A drive put back from an old copy must not be trusted: the pool leaves it out.
fn check_swapped_drive_kept_out(world: &mut World, pool: &Pool<Dev>) {
    let Some((i, _)) = world.swapped_in else { return };
    let name = dev_path(&world.disks[i].dev);
    let used = pool.drives().iter().any(|d| {
        use stria_dev::BlockDevice;
        !d.is_missing() && !d.is_failed() && d.device().name() == name
    });
    if used {
        world.fail(format!("disk {name} was put back from an old copy and the pool trusts it"));
    }
    world.note(format!("disk {name} (old copy) was left out"));
    count(&COVERAGE.swaps_left_out);
}

async fn check_scrub(world: &mut World, pool: &Pool<Dev>, cycle: u64) {
    for name in ["v", "w"] {
        check_scrub_of(world, pool, cycle, name).await;
    }
}

async fn check_scrub_of(world: &mut World, pool: &Pool<Dev>, cycle: u64, name: &str) {
    let report =
        pool.scrub(name, |_, _| {}).await.unwrap_or_else(|e| world.fail(format!("scrub of {name}: {e}")));
    if (
        report.unrecoverable_blocks,
        report.parity_blocks_fixed,
        report.copy_blocks_fixed,
        report.blocks_repaired,
        report.inconsistent_blocks,
    ) != (0, 0, 0, 0, 0)
    {
        world.fail(format!("cycle {cycle}: stripes of {name} inconsistent after recovery: {report:?}"));
    }
}

async fn work(
    world: &mut World,
    pool: &Pool<Dev>,
    [vol, w]: [&Volume<Dev>; 2],
    task: Maintenance,
    cycle: u64,
) {
    let ending = match world.rng.random_range(0..5) {
        0 | 1 => Ending::PowerCut,
        2 | 3 => Ending::Kill,
        _ => Ending::CleanClose,
    };
    let switch = Arc::clone(&world.switch);
    let cut_after = world.rng.random_range(0..2500);
    if ending != Ending::CleanClose {
        switch.trip_after_ops(cut_after);
    }
    let victim = {
        let members = active_members(pool);
        (members.len() > world.layout_width() - world.layout.tolerance() as usize)
            .then(|| members[world.rng.random_range(0..members.len())])
    };
    world.note(format!(
        "cycle {cycle}: work with {task:?}, ending {ending:?} (cut after {cut_after} requests)"
    ));
    let tracker = RefCell::new(std::mem::replace(&mut world.tracker, Tracker::new()));
    let neighbour = RefCell::new(std::mem::replace(&mut world.neighbour, Tracker::new()));
    let seed = world.seed * 1000 + cycle;
    // A live copy of one disk, taken at a random moment of the work (a third of the cycles).
    let copy_of = world.rng.random_bool(0.33).then(|| world.rng.random_range(0..world.disks.len()));
    let copier = async {
        let i = copy_of?;
        for _ in 0..rng(seed ^ 0xc0b1).random_range(0..600) {
            tokio::task::yield_now().await;
        }
        let dev = &world.disks[i].dev;
        Some((i, dev.kill_image(), copy_stamps(dev)))
    };
    let closer = async {
        if ending == Ending::CleanClose {
            for _ in 0..world_yields(seed) {
                tokio::task::yield_now().await;
            }
            let r = pool.close().await;
            tracker.borrow_mut().flushed(u64::MAX);
            neighbour.borrow_mut().flushed(u64::MAX);
            r
        } else {
            Ok(())
        }
    };
    // Volume w's writers share stripes (partial-stripe ec writes go through the journals of
    // drives that v's transactions use too); its flusher runs at its own moments.
    let w_seed = seed ^ 0x5eed_0000;
    let (_, _, _, _, _, _, _, _, closed, copied) = tokio::join!(
        worker(vol, &tracker, seed, 0, FuaMix::WritesAndZeroing),
        worker(vol, &tracker, seed, 1, FuaMix::WritesAndZeroing),
        worker(vol, &tracker, seed, 2, FuaMix::WritesAndZeroing),
        flusher(vol, &tracker, seed),
        worker(w, &neighbour, w_seed, 1, FuaMix::WritesAndZeroing),
        worker(w, &neighbour, w_seed, 2, FuaMix::WritesAndZeroing),
        flusher(w, &neighbour, w_seed),
        maintenance(pool, task, victim),
        closer,
        copier
    );
    world.tracker = tracker.into_inner();
    world.neighbour = neighbour.into_inner();
    if let Err(e) = closed {
        world.fail(format!("clean close failed: {e}"));
    }
    switch.trip();
    // Backups are taken of consistent drives only: after a clean close.
    if ending == Ending::CleanClose {
        for d in world.disks.iter_mut().filter(|d| matches!(d.backup, Backup::Wanted)) {
            d.backup = Backup::Taken(Box::new(d.dev.kill_image()), cycle);
        }
    }
    world.last_ending = ending;
    count(&COVERAGE.cycles);
    count(match ending {
        Ending::PowerCut => &COVERAGE.power_cuts,
        Ending::Kill => &COVERAGE.kills,
        Ending::CleanClose => &COVERAGE.clean_closes,
    });
    world.active_drives =
        pool.meta().drives.iter().filter(|d| d.state == stria_engine::DriveState::Active).count();
    keep_live_copy(world, pool, ending, copied);
    let images = world.images(ending);
    world.reboot(images);
}

/// Keeps a live copy for the next boot when the design says it must be told apart: the pool
/// confirmed a flush epoch or a generation after the copy was taken, and the cycle ended with a
/// kill or a clean close (a power cut may lose the last confirmation). On ec layouts only after a
/// clean close: a member left out after a crash mid-write is the documented write-hole limit.
fn keep_live_copy(
    world: &mut World,
    pool: &Pool<Dev>,
    ending: Ending,
    copied: Option<(usize, stria_dev::mem::MemDevice, (u32, u64, u64))>,
) {
    let Some((i, image, (slot, epoch, generation))) = copied else { return };
    count(&COVERAGE.live_copies_taken);
    let confirmed = pool.flush_epoch_confirmed(slot);
    let behind = epoch < confirmed || generation < pool.confirmed_generation();
    let allowed = match ending {
        Ending::PowerCut => false,
        Ending::Kill => !matches!(world.layout, Layout::Ec { .. }),
        Ending::CleanClose => true,
    };
    world.note(format!(
        "disk {} copied live (slot {slot}, epoch {epoch}, generation {generation}; the pool confirmed its epoch \
         {confirmed}, generation {})",
        dev_path(&world.disks[i].dev),
        pool.confirmed_generation()
    ));
    if behind && allowed && world.active_drives >= 2 {
        world.live_copy = Some((i, image));
    }
}

fn world_yields(seed: u64) -> u64 {
    rng(seed ^ 0xc105e).random_range(0..400)
}

/// Names the seed when a panic inside the engine (an assertion) ends it, so that it can be
/// replayed with `STRIA_SEQ_SEED`.
struct NameOnPanic(u64, bool);

impl Drop for NameOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let focus = if self.1 { "STRIA_SEQ_FOCUS=moves " } else { "" };
            eprintln!("the panic above ended seed {} (replay: {focus}STRIA_SEQ_SEED={})", self.0, self.0);
        }
    }
}

/// Seeds of the long mode that found bugs: 453 and 1744 (a confirmation counted before the
/// records carrying it were written), 852 (the first flush after an open did not checkpoint),
/// 6382 (a volume down to one drive had no witness of its epochs), 8976 (a flush of a volume's
/// old members answered a caller whose write went to a moved member's new drive), 10734 (a drain
/// held up by a lost raid0 scratch volume was refused as if no drive had room), 21560 (a clean
/// close's commit went between a drive failure's marking in memory and its commit, and missed
/// the majority of a two-drive pool), 167478 (a flush of a volume's old members counted durable
/// a stripe transaction applied on a moved member's new drive; a power cut lost its piece there
/// after a checkpoint had released its journal records, and a degraded stripe decoded garbage).
const FOUND_BUGS: [u64; 8] = [453, 852, 1744, 6382, 8976, 10734, 21560, 167478];

/// Seeds of `STRIA_SEQ_FOCUS=moves` that found bugs: 1001847 (bug 17 of docs/crash-consistency.md
/// again, as 167478; with the fix taken out it fails at cycle 2 with bytes never written, and the
/// focused mode met it after 1,847 seeds where the plain one needed 167,478), 1066917 (a drive
/// failed again during its delta resync kept its outage's first flush epoch, so a copy of it
/// taken while it was back was let in for a delta resync, and the next open found it behind
/// the epoch the other drives saw of it: bug 22 of docs/crash-consistency.md).
const FOCUSED_FOUND_BUGS: [u64; 2] = [1001847, 1066917];

#[tokio::test]
async fn sequences_of_crashes_lose_no_durable_write() {
    if let Ok(one) = std::env::var("STRIA_SEQ_SEED") {
        // Replaying one seed: the engine's log too (STRIA_LOG=debug for details).
        let filter = std::env::var("STRIA_LOG").unwrap_or_else(|_| "info".into());
        let _ = tracing_subscriber::fmt().with_env_filter(filter).with_test_writer().try_init();
        run_seed(one.parse().expect("STRIA_SEQ_SEED is a number"), focus_from_env()).await;
        return;
    }
    let focus = focus_from_env();
    let seeds: u64 = std::env::var("STRIA_SEQ_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(200);
    let first: u64 = std::env::var("STRIA_SEQ_FIRST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0);
    // The seeds that once found a bug run every time (those outside the range run here).
    let in_range = |s: &u64, focused: bool| focused == focus && (first..first + seeds).contains(s);
    for seed in FOUND_BUGS.iter().copied().filter(|s| !in_range(s, false)) {
        let _name = NameOnPanic(seed, false);
        run_seed(seed, false).await;
    }
    for seed in FOCUSED_FOUND_BUGS.iter().copied().filter(|s| !in_range(s, true)) {
        let _name = NameOnPanic(seed, true);
        run_seed(seed, true).await;
    }
    for seed in first..first + seeds {
        let _name = NameOnPanic(seed, focus);
        run_seed(seed, focus).await;
    }
    let c = &*COVERAGE;
    let n = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!(
        "{seeds} seeds from {first}: {} cycles ({} power cuts, {} kills, {} clean closes), {} boots cut during recovery, \
         {} old copies left out, {} refused for lack of quorum ({} live copies taken, {} put back), \
         {} seeds ended with a failed volume, {} extents moved ({} resumed at a cursor; {} rows copied \
         again at open), {} drained drives removed, {} drives back by a delta resync, {} by a full one",
        n(&c.cycles),
        n(&c.power_cuts),
        n(&c.kills),
        n(&c.clean_closes),
        n(&c.boot_cuts),
        n(&c.swaps_left_out),
        n(&c.swaps_refused),
        n(&c.live_copies_taken),
        n(&c.live_copies_put_back),
        n(&c.failed_volumes),
        n(&c.moves_done),
        n(&c.moves_resumed),
        n(&c.move_rows_recopied),
        n(&c.drives_removed),
        n(&c.onlines_delta),
        n(&c.onlines_full)
    );
    // The default seeds cut moves short (200 seeds: 12 resumed at their cursors, 543 rows
    // copied again at open), so the resume path is exercised whenever this runs.
    if seeds >= 200 {
        assert!(
            n(&c.moves_resumed) > 0 && n(&c.move_rows_recopied) > 0,
            "no move resumed at a cursor with rows copied again at open"
        );
    }
}
