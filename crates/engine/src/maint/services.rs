//! The pool's maintenance services: the background loop whoever owns an open pool runs (the
//! `stria` daemon, a cluster node agent).
//!
//! Every tick (2 s by default) the loop, in order:
//!
//! 1. runs [`Pool::tick`] (resync of damaged checksum pages, a pool flush when something was
//!    written, idle intent bits cleared, error counters committed);
//! 2. runs the pending rebuilds ([`Pool::rebuild`]); after a failed one it waits
//!    [`Settings::retry_after`] (a minute by default) before trying again;
//! 3. runs the pending extent moves ([`Pool::rebalance`]: `pool rebalance`, drains of `drive
//!    remove`), never while a rebuild is pending; after moves that failed, got stuck or were
//!    abandoned it waits [`Settings::retry_after`] likewise;
//!
//!    while a rebuild or the moves run (hours, on large drives), [`Pool::tick`] goes on every
//!    tick beside them: otherwise no intent bit would be cleared meanwhile (a crash then
//!    resynchronises everything written since they started, and a move resumed at its cursor
//!    copies all of it again), nor a damaged checksum page repaired;
//! 4. takes drained drives out of the pool ([`super::take_out`]) and tells the owner
//!    ([`DriveRemoved`]).
//!
//! **Stopping never cancels work half done.** [`Services::stop`] only asks: the loop returns
//! between ticks, or when the rebuild or the moves in progress return. A task dropped in the
//! middle of a metadata commit or a rebuild row would leave its work half done, so the task is
//! never aborted. A rebuild or a move returns at its next row once the pool is closing
//! ([`Pool::close`] refuses new rows and waits for the one in flight), so an owner that stops
//! asks first, then closes the pool, then waits ([`Stopping`]):
//!
//! ```ignore
//! let stopping = services.stop();
//! pool.close().await?;
//! stopping.await;
//! ```

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use stria_dev::BlockDevice;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::error::EngineError;
use crate::pool::{Pool, RebalanceReport};

/// What the owner of a pool does outside it when a drained drive has left the pool's metadata:
/// the `stria` binary forgets the drive in its pool directory and renames its file.
pub trait DriveRemoved: Send + Sync + 'static {
    /// Drive `slot`, last seen at `path`, is not a member of the pool any more.
    fn drive_removed(&self, slot: u32, path: &str) -> Result<(), Box<dyn std::error::Error + Send + Sync>>;
}

/// How the services run.
#[derive(Clone)]
pub struct Settings {
    /// Time between two rounds of the loop.
    pub tick: Duration,
    /// Wait after a failed rebuild, or after moves that failed or got stuck, before trying again.
    pub retry_after: Duration,
    /// Least time between two progress lines in the log of a rebuild or a move.
    pub progress_log_every: Duration,
    /// Told when a drained drive leaves the pool.
    pub on_drive_removed: Option<Arc<dyn DriveRemoved>>,
}

impl Default for Settings {
    /// What the `stria` daemon runs: a tick every 2 s, a retry after a minute, progress in the log
    /// every 5 s, nobody told of removed drives.
    fn default() -> Settings {
        Settings {
            tick: Duration::from_secs(2),
            retry_after: Duration::from_secs(60),
            progress_log_every: Duration::from_secs(5),
            on_drive_removed: None,
        }
    }
}

impl Settings {
    /// These settings, telling `hook` when a drained drive leaves the pool.
    pub fn on_drive_removed(mut self, hook: Arc<dyn DriveRemoved>) -> Settings {
        self.on_drive_removed = Some(hook);
        self
    }
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("tick", &self.tick)
            .field("retry_after", &self.retry_after)
            .field("progress_log_every", &self.progress_log_every)
            .field("on_drive_removed", &self.on_drive_removed.is_some())
            .finish()
    }
}

/// What the services have done since they started (for the owner's status and for tests).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Activity {
    /// Rounds of the loop run.
    pub ticks: u64,
    /// Rebuilds started.
    pub rebuilds_started: u64,
    /// Rebuilds that returned an error (each retried after [`Settings::retry_after`]).
    pub rebuilds_failed: u64,
    /// Rebalance runs started.
    pub moves_started: u64,
    /// Rebalance runs that returned an error, got stuck or abandoned a move (each retried after
    /// [`Settings::retry_after`]).
    pub moves_failed: u64,
    /// Drained drives taken out of the pool.
    pub drives_removed: u64,
}

#[derive(Debug, Default)]
struct Counters {
    ticks: AtomicU64,
    rebuilds_started: AtomicU64,
    rebuilds_failed: AtomicU64,
    moves_started: AtomicU64,
    moves_failed: AtomicU64,
    drives_removed: AtomicU64,
}

impl Counters {
    fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn snapshot(&self) -> Activity {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Activity {
            ticks: get(&self.ticks),
            rebuilds_started: get(&self.rebuilds_started),
            rebuilds_failed: get(&self.rebuilds_failed),
            moves_started: get(&self.moves_started),
            moves_failed: get(&self.moves_failed),
            drives_removed: get(&self.drives_removed),
        }
    }
}

/// The maintenance services of one open pool, running on a task of their own until stopped.
#[derive(Debug)]
pub struct Services {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
    counters: Arc<Counters>,
}

impl Services {
    /// Starts the services of `pool` on a task of the current Tokio runtime.
    pub fn start<D: BlockDevice>(pool: Arc<Pool<D>>, settings: Settings) -> Services {
        let (stop, stopped) = watch::channel(false);
        let counters = Arc::new(Counters::default());
        let task = tokio::spawn(run(pool, settings, stopped, Arc::clone(&counters)));
        Services { stop, task, counters }
    }

    /// What the services have done so far.
    pub fn activity(&self) -> Activity {
        self.counters.snapshot()
    }

    /// Asks the services to stop, now; the returned [`Stopping`] completes once they have. They
    /// stop between ticks, or when the rebuild or the moves in progress return: never in the
    /// middle of a row or a metadata commit. A rebuild or a move returns at its next row once
    /// the pool is closing, so close the pool before awaiting it (see the module's example);
    /// otherwise the rebuild or the moves in progress run to their end first.
    pub fn stop(self) -> Stopping {
        let _ = self.stop.send(true);
        Stopping { task: self.task }
    }
}

/// The services on their way out ([`Services::stop`]): completes once their task has returned.
#[derive(Debug)]
#[must_use = "the services stop at their next safe point; await this to know they have"]
pub struct Stopping {
    task: JoinHandle<()>,
}

impl Future for Stopping {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        match Pin::new(&mut self.task).poll(cx) {
            Poll::Ready(Err(e)) => {
                tracing::warn!(error = %e, "housekeeping task ended abnormally");
                Poll::Ready(())
            }
            Poll::Ready(Ok(())) => Poll::Ready(()),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// The loop (see the module's documentation). Returns when `stop` turns true (or its sender is
/// gone: the [`Services`] were dropped), between ticks or when a rebuild or moves return.
async fn run<D: BlockDevice>(
    pool: Arc<Pool<D>>,
    settings: Settings,
    mut stop: watch::Receiver<bool>,
    counters: Arc<Counters>,
) {
    let mut tick = tokio::time::interval(settings.tick);
    let mut rebuild_retry_at = Instant::now();
    let mut moves_retry_at = Instant::now();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        if *stop.borrow() {
            return;
        }
        Counters::bump(&counters.ticks);
        if let Err(e) = pool.tick().await {
            tracing::error!(error = %e, "housekeeping failed");
        }
        if pool.rebuild_pending() && Instant::now() >= rebuild_retry_at {
            match with_ticks(&pool, &settings, &counters, rebuild(&pool, &settings, &counters)).await {
                Ok(()) if *stop.borrow() => return,
                Ok(()) => tracing::info!("rebuild finished"),
                Err(e) => {
                    Counters::bump(&counters.rebuilds_failed);
                    tracing::error!(error = %e, "rebuild stopped; retrying in {}", wait(settings.retry_after));
                    rebuild_retry_at = Instant::now() + settings.retry_after;
                }
            }
        }
        if pool.rebalance_pending() && !pool.rebuild_pending() && Instant::now() >= moves_retry_at {
            match with_ticks(&pool, &settings, &counters, rebalance(&pool, &settings, &counters)).await {
                Ok(_) if *stop.borrow() => return,
                Ok(r) if r.stuck.is_some() || r.abandoned > 0 => {
                    Counters::bump(&counters.moves_failed);
                    tracing::warn!(moves = r.moves, abandoned = r.abandoned, stuck = ?r.stuck, "moves stopped; retrying in {}", wait(settings.retry_after));
                    moves_retry_at = Instant::now() + settings.retry_after;
                }
                Ok(r) => tracing::info!(moves = r.moves, "moves finished"),
                Err(e) => {
                    Counters::bump(&counters.moves_failed);
                    tracing::error!(error = %e, "moves stopped; retrying in {}", wait(settings.retry_after));
                    moves_retry_at = Instant::now() + settings.retry_after;
                }
            }
        }
        for slot in pool.drained() {
            remove_drained(&pool, &settings, &counters, slot).await;
        }
    }
}

/// Runs `work` to its end while [`Pool::tick`] goes on every tick beside it. Both are polled
/// together (a tick may wait for a stripe lock the work holds), and neither is dropped half
/// done: a tick under way when the work ends finishes first.
async fn with_ticks<D: BlockDevice, T>(
    pool: &Pool<D>,
    settings: &Settings,
    counters: &Counters,
    work: impl Future<Output = T>,
) -> T {
    let finished = tokio::sync::Notify::new();
    let mut tick = tokio::time::interval_at(Instant::now() + settings.tick, settings.tick);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (out, ()) = tokio::join!(
        async {
            let out = work.await;
            finished.notify_one();
            out
        },
        async {
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    () = finished.notified() => return,
                }
                Counters::bump(&counters.ticks);
                if let Err(e) = pool.tick().await {
                    tracing::error!(error = %e, "housekeeping failed");
                }
            }
        }
    );
    out
}

/// A wait as the log says it ("a minute" for the default).
fn wait(d: Duration) -> String {
    if d == Duration::from_secs(60) { "a minute".into() } else { format!("{d:?}") }
}

/// Runs the pending rebuilds, logging their progress.
async fn rebuild<D: BlockDevice>(
    pool: &Pool<D>,
    settings: &Settings,
    counters: &Counters,
) -> Result<(), EngineError> {
    tracing::info!("rebuild starting");
    Counters::bump(&counters.rebuilds_started);
    let mut last = std::time::Instant::now();
    pool.rebuild(|p| {
        if last.elapsed() > settings.progress_log_every {
            tracing::info!(volume = %p.volume, done = p.rows_done, total = p.rows_total, "rebuilding");
            last = std::time::Instant::now();
        }
    })
    .await
}

/// Runs the pending moves, logging their progress.
async fn rebalance<D: BlockDevice>(
    pool: &Pool<D>,
    settings: &Settings,
    counters: &Counters,
) -> Result<RebalanceReport, EngineError> {
    Counters::bump(&counters.moves_started);
    let mut last = std::time::Instant::now();
    pool.rebalance(|m| {
        if last.elapsed() > settings.progress_log_every {
            tracing::info!(volume = %m.volume, from = m.from_drive, to = m.to_drive, done = m.rows_done, total = m.rows_total, "moving an extent");
            last = std::time::Instant::now();
        }
    })
    .await
}

/// Takes the drained drive `slot` out of the pool and tells the owner; a failure is logged (the
/// next tick tries again while the drive stays drained).
async fn remove_drained<D: BlockDevice>(pool: &Pool<D>, settings: &Settings, counters: &Counters, slot: u32) {
    let path = match super::take_out(pool, slot).await {
        Ok(path) => path,
        Err(e) => return tracing::error!(slot, error = %e, "cannot take the drained drive out of the pool"),
    };
    if let Some(hook) = &settings.on_drive_removed
        && let Err(e) = hook.drive_removed(slot, &path)
    {
        return tracing::error!(slot, error = %e, "cannot take the drained drive out of the pool");
    }
    Counters::bump(&counters.drives_removed);
    tracing::info!(slot, "drive removed from the pool");
}
