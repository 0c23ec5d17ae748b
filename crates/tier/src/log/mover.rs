//! The mover of a log-structured volume: one task that runs destage (destage.rs: cached blocks
//! -> whole stripes of the host segment), GC (gc.rs: live blocks of the emptiest sealed segment
//! -> whole stripes of the GC segment) and the space's growth and shrinking (resize.rs), one
//! batch at a time; and the task that runs the map's checkpoints.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Weak};
use std::time::Duration;

use stria_dev::BlockDevice;
use stria_engine::VolumeError;

use super::LogVolume;
use super::gc::{Gc, Pick};
use super::space::Stream;

/// Compaction waits for this long without host writes, TRIMs or zeroing: a large TRIM (fstrim
/// of a file system) arrives as many requests, and moving blocks the next ones discard is waste.
const COMPACT_QUIET_MS: u64 = 1000;

/// The "space is full" warning of one volume's mover, rate-limited.
#[derive(Default)]
struct FullWarning {
    /// When it was last logged, and how many times it was due since.
    last: Option<std::time::Instant>,
    suppressed: u64,
}

impl FullWarning {
    fn warn(&mut self, volume: &str, e: &VolumeError) {
        match self.last {
            Some(at) if at.elapsed() < FULL_WARNING_INTERVAL => self.suppressed += 1,
            _ => {
                tracing::warn!(
                    volume,
                    retries_since_last_warning = self.suppressed,
                    "writes that need new space fail with ENOSPC: {e}"
                );
                self.last = Some(std::time::Instant::now());
                self.suppressed = 0;
            }
        }
    }

    /// The mover made progress (or has nothing to do): the space is no longer full.
    fn ended(&mut self, volume: &str) {
        if self.last.take().is_some() {
            tracing::info!(volume, "space available again: writes that need new space are accepted");
            self.suppressed = 0;
        }
    }
}

pub(crate) fn spawn<D: BlockDevice>(vol: &Arc<LogVolume<D>>) {
    tokio::spawn(run(Arc::downgrade(vol)));
}

/// While the space stays full, the warning that says so (and what frees space) is logged at
/// most once per this interval; the retries in between are counted in the next one.
const FULL_WARNING_INTERVAL: Duration = Duration::from_secs(60);

async fn run<D: BlockDevice>(vol: Weak<LogVolume<D>>) {
    let mut draining = false;
    let mut full = FullWarning::default();
    loop {
        let Some(v) = vol.upgrade() else { return };
        if v.health.closed.load(Relaxed) || v.health.failure.lock().is_some() {
            return;
        }
        let result = {
            let mut gc = v.gates.moving.lock().await;
            if v.health.closed.load(Relaxed) {
                return;
            }
            v.step(&mut gc, &mut draining).await
        };
        // TRIM, deletes and GC free segments: once a host batch would find room, the volume
        // is no longer full (writes that need new space are taken again).
        if v.space.no_space.lock().is_some() && v.space.lock().has_batch(Stream::Host) {
            *v.space.no_space.lock() = None;
        }
        if v.space.no_space.lock().is_none() {
            full.ended(v.name());
        }
        // Writers that found the cache full: it grows if it may (in a task of its own).
        v.grow_cache_if_wanted();
        let pause = match result {
            Ok(true) => {
                v.ring.clear_failure();
                continue;
            }
            // Nothing to do: wait for a writer that needs space, or look again soon.
            Ok(false) => Duration::from_millis(50),
            Err(e) => {
                let no_space = e.kind() == stria_engine::ErrorKind::NoSpace;
                if no_space {
                    full.warn(v.name(), &e);
                } else {
                    tracing::error!(volume = %v.name(), error = %e, "destage or GC failed; retrying");
                }
                v.ring.fail_waiters(e.to_string());
                Duration::from_millis(if no_space { 50 } else { 1000 })
            }
        };
        // Holding `v` for at most one short wait: the loop still ends soon after the last
        // other reference is dropped.
        tokio::select! {
            () = v.ring.hungry.notified() => {}
            () = tokio::time::sleep(pause) => {}
        }
    }
}

/// Runs the deletes `snapshot delete` leaves to the background (docs/design/snapshots.md,
/// "Deletes in the background"): woken when one is marked, it finishes every marked delete under
/// `snapshot_ops`, batch by batch, writes going on between batches.
pub(crate) fn spawn_deleter<D: BlockDevice>(vol: &Arc<LogVolume<D>>) {
    tokio::spawn(deleter(Arc::downgrade(vol)));
}

async fn deleter<D: BlockDevice>(vol: Weak<LogVolume<D>>) {
    loop {
        let Some(v) = vol.upgrade() else { return };
        if v.health.closed.load(Relaxed) || v.health.failure.lock().is_some() {
            return;
        }
        let mut pause = Duration::from_secs(1);
        if v.deletes_pending() > 0 {
            let _one = v.gates.snapshot_ops.lock().await;
            match v.finish_deletes_held().await {
                Ok(0) => {}
                Ok(finished) => {
                    tracing::info!(volume = %v.name(), finished, "finished snapshot deletes in the background")
                }
                // Closing: the next open finishes it.
                Err(_) if v.health.closed.load(Relaxed) => return,
                Err(e) => {
                    tracing::error!(volume = %v.name(), error = %e, "a snapshot delete failed in the background; retrying");
                    pause = Duration::from_secs(5);
                }
            }
        }
        // As in the mover: `v` is held for at most one short wait.
        tokio::select! {
            () = v.gates.deletes_wanted.notified() => {}
            () = tokio::time::sleep(pause) => {}
        }
    }
}

/// Commits write-back host writes' deltas a couple of milliseconds after they were queued and
/// frees what they replaced ([`super::LogParams::write_back`]), so that the cache ring and the
/// replaced places come back without a flush. Sleeps while nothing waits.
pub(crate) fn spawn_write_back<D: BlockDevice>(vol: &Arc<LogVolume<D>>) {
    tokio::spawn(write_back_committer(Arc::downgrade(vol)));
}

/// How long a write-back delta waits for others to share its log block at most.
const WRITE_BACK_COMMIT: Duration = Duration::from_millis(2);

async fn write_back_committer<D: BlockDevice>(vol: Weak<LogVolume<D>>) {
    loop {
        let Some(v) = vol.upgrade() else { return };
        if v.health.closed.load(Relaxed) || v.health.failure.lock().is_some() {
            return;
        }
        if v.wb.frees.lock().is_empty() {
            // As in the mover: `v` is held for at most one short wait.
            tokio::select! {
                () = v.wb.wake.notified() => {}
                () = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
            continue;
        }
        drop(v);
        tokio::time::sleep(WRITE_BACK_COMMIT).await;
        let Some(v) = vol.upgrade() else { return };
        if let Err(e) = v.commit_write_back().await {
            tracing::warn!(volume = %v.name(), error = %e, "committing write-back writes failed");
        }
    }
}

/// Runs the map's checkpoints in their own task, so writers do not wait for one (they only wake
/// it; docs/design/log-structured-volumes.md, "Checkpoints that do not stop writers").
pub(crate) fn spawn_checkpoints<D: BlockDevice>(vol: &Arc<LogVolume<D>>) {
    vol.map.checkpoint_in_background();
    tokio::spawn(checkpoints(Arc::downgrade(vol)));
}

async fn checkpoints<D: BlockDevice>(vol: Weak<LogVolume<D>>) {
    loop {
        let Some(v) = vol.upgrade() else { return };
        if v.health.closed.load(Relaxed) || v.health.failure.lock().is_some() {
            return;
        }
        let pause = match v.map.checkpoint_if_due().await {
            Ok(true) => continue,
            Ok(false) => Duration::from_millis(100),
            Err(e) => {
                tracing::warn!(volume = %v.name(), error = %e, "map checkpoint failed; retrying");
                Duration::from_millis(1000)
            }
        };
        // As in the mover: `v` is held for at most one short wait.
        tokio::select! {
            () = v.map.checkpoint_wanted() => {}
            () = tokio::time::sleep(pause) => {}
        }
    }
}

impl<D: BlockDevice> LogVolume<D> {
    /// One step of the mover: GC when free segments run low and GC can gain space, else
    /// destage when the cache asks for it. Returns whether it did anything.
    async fn step(&self, gc: &mut Gc, draining: &mut bool) -> Result<bool, VolumeError> {
        if self.params().hold && self.ring.waiting() == 0 {
            return Ok(false);
        }
        if self.gc_wanted(gc).await? {
            return Ok(true);
        }
        let p = self.params();
        let ring = self.ring.ring_blocks();
        let used = self.ring.used();
        let live = self.ring.live();
        let batch = self.geo.batch_data();
        let waiting = self.ring.waiting() > 0;
        let above = |pct: u8| used * 100 > u64::from(pct) * ring;
        if waiting || above(p.start_percent) || (*draining && above(p.stop_percent)) {
            *draining = true;
            // A short batch only when writers wait and the cache holds less than a batch of
            // movable blocks (padding costs capacity writes): the rest of the ring is in flight
            // or holes behind an old block at the tail, and a waiting writer (pieces of up to
            // half the ring) may need that old block moved before anything frees room for it.
            let pad = waiting && live < batch;
            return self.destage_batch(pad).await;
        }
        *draining = false;
        if p.always && live >= batch {
            return self.destage_batch(false).await;
        }
        // Idle: give segments back to the pool, or (when writes have been quiet for a while)
        // compact the space so that some can be.
        if self.shrink_space(gc).await {
            return Ok(true);
        }
        if !p.eager_compaction
            && self.now_ms().saturating_sub(self.clock.last_write_ms.load(Relaxed)) < COMPACT_QUIET_MS
        {
            return Ok(false);
        }
        let target = {
            let mut space = self.space.lock();
            let target = space.compaction_target();
            if let Some(target) = target {
                space.seal_open_from(target);
            }
            target
        };
        match target {
            Some(target) => self.gc_step(gc, Pick::Compact(target)).await,
            None => Ok(false),
        }
    }

    /// Runs a GC step if free segments run low; returns whether it did anything. GC starts one
    /// segment above the host stream's floor (the reserve), so destage rarely waits for it, and
    /// no earlier: free segments held idle are over-provisioning lost to the steady state.
    async fn gc_wanted(&self, gc: &mut Gc) -> Result<bool, VolumeError> {
        let (mut free, reserve) = {
            let s = self.space.lock();
            (s.free(), s.reserve())
        };
        if free <= reserve && self.space.counts_suspect.load(Relaxed) {
            // Counts from a persisted table may be too high: with space critical, GC would chase
            // segments that only look full (and its own padded batches) while destage starves.
            self.recount().await?;
            free = self.space.lock().free();
        }
        if free <= reserve + 1 && self.space.lock().wants_growth() && self.grow_space().await {
            return Ok(true);
        }
        let pick = if free <= reserve { Pick::Critical } else { Pick::Garbage };
        Ok(free <= reserve + 1 && self.gc_step(gc, pick).await?)
    }

    /// Destages every cached block (short last batch padded); for tests and benchmarks.
    pub async fn destage_all(&self) -> Result<(), VolumeError> {
        let mut gc = self.gates.moving.lock().await;
        while self.ring.live() > 0 {
            if !self.gc_wanted(&mut gc).await? && !self.destage_batch(true).await? {
                tokio::task::yield_now().await;
            }
        }
        Ok(())
    }
}
