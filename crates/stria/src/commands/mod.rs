//! What each command does: its request, run through the daemon when one serves the pool or
//! here otherwise (`request`), and what it prints. One module per group of commands.

mod cluster;
mod drive;
mod serve;
mod snapshot;
mod status;
mod volume;

use anyhow::{Context, Result, bail};
use serde_json::Value;
use stria_catalog::Catalog;

use crate::cli::{Cli, Command, PoolCmd};
use crate::ops::{self, Ctx, Progress, Request};
use crate::pooldir::{Opener, PoolDir};
use crate::{control, iostat, output, stats};

#[cfg(test)]
pub(crate) use serve::serve_options;

/// Runs a command; returns the exit code (0 unless `status` reports a problem).
pub(crate) async fn run(cli: Cli) -> Result<i32> {
    let dir = PoolDir::new(&cli.pool);
    match cli.command {
        Command::Pool(PoolCmd::Calibrate { json }) => {
            let v = request(&dir, Request::PoolCalibrate).await?;
            if json { print_json(&v) } else { output::calibration(&view(v)?) }
        }
        Command::Pool(PoolCmd::Rebalance { rate, json }) => {
            let v = request(&dir, Request::PoolRebalance { rate_bytes_per_sec: rate }).await?;
            if json {
                print_json(&v);
            } else if v["rebalance"] == "done" {
                let r = &v["report"];
                outln!(
                    "rebalance done: {} extent(s) moved, {} copied",
                    r["moves"],
                    stria_engine::units::format_size(r["bytes_copied"].as_u64().unwrap_or(0))
                );
                if let Some(resumed) = r["bytes_resumed"].as_u64().filter(|&b| b > 0) {
                    outln!(
                        "{} had been copied before an interruption and was not copied again",
                        stria_engine::units::format_size(resumed)
                    );
                }
                if let Some(why) = r["stuck"].as_str() {
                    outln!("not everything could move: {why}");
                }
            } else {
                outln!("rebalance running in the daemon; `stria status` shows its progress");
            }
        }
        Command::Pool(PoolCmd::Clear) => {
            let v = request(&dir, Request::PoolClear).await?;
            if v["was_suspended"].is_null() {
                outln!("writes were not suspended; nothing to clear");
            } else {
                let r = &v["resync"];
                outln!(
                    "writes resumed: {} rows resynchronised ({} parity and {} copy blocks rewritten)",
                    r["rows_resynced"],
                    r["parity_blocks_rewritten"],
                    r["copy_blocks_rewritten"]
                );
            }
        }
        Command::Pool(PoolCmd::Create { name, fast, capacity, drive_size, drives, overwrite }) => {
            let existed = dir.path.exists();
            let lock = dir.lock_new()?;
            let pool = match dir.create_pool(&name, fast, capacity, drive_size, &drives, &overwrite).await {
                Ok(pool) => pool,
                Err(e) => {
                    // A refused create leaves nothing behind: the directories it made are
                    // removed if they are empty (never anything else).
                    drop(lock);
                    if !existed {
                        let _ = std::fs::remove_file(dir.path.join(".lock"));
                        let _ = std::fs::remove_dir(dir.drives_dir());
                        let _ = std::fs::remove_dir(&dir.path);
                    }
                    return Err(e);
                }
            };
            let status = pool.status();
            pool.close().await?;
            outln!("created pool {} with {} drives in {}", name, status.drives.len(), dir.path.display());
            output::drives(&status.drives);
            warn_overcommit(&dir);
        }
        Command::Volume(cmd) => volume::volume(&dir, cmd).await?,
        Command::Drive(cmd) => drive::drive(&dir, cmd).await?,
        Command::Snapshot(cmd) => snapshot::snapshot(&dir, cmd).await?,
        Command::Scrub { name, json } => status::scrub(&dir, name, json).await?,
        Command::Status { json } => return status::status(&dir, json).await,
        Command::Serve(args) => serve::serve(dir, args).await?,
        Command::Iostat { interval, count } => {
            let socket = dir.control_socket();
            if !control::daemon_running(&socket).await {
                bail!(
                    "no daemon is serving {}: iostat shows what `stria serve` (or `stria up`) counts; start it first",
                    dir.path.display()
                );
            }
            let sample = || async {
                let v = control::call(&socket, Request::Stats, |_| {}).await?;
                view::<stats::StatsView>(v)
            };
            iostat::run(std::time::Duration::from_secs_f64(interval), count, sample).await?;
        }
        Command::Up(args) => serve::up(dir, args).await?,
        Command::Node(crate::cli::NodeCmd::Run(args)) => cluster::node_run(args).await?,
        Command::Cluster(cmd) => cluster::cluster(cmd).await?,
    }
    Ok(0)
}

/// Warns (on stderr) when sparse drive files promise more than their filesystem has.
fn warn_overcommit(dir: &PoolDir) {
    for w in dir.overcommit_warnings() {
        errln!("warning: {w}");
    }
}

/// A reply as the typed view it was made from.
fn view<T: serde::de::DeserializeOwned>(v: Value) -> Result<T> {
    serde_json::from_value(v).context("the reply does not match this version of stria")
}

fn print_json(v: &Value) {
    outln!("{}", serde_json::to_string_pretty(v).expect("JSON values serialize"));
}

/// Runs a request through the daemon if one serves the pool, otherwise here.
async fn request(dir: &PoolDir, req: Request) -> Result<Value> {
    let mut bar = output::Bar::new();
    let socket = dir.control_socket();
    if control::daemon_running(&socket).await {
        let v = control::call(&socket, req, |p| bar.update(&p)).await;
        bar.finish();
        return v;
    }
    let _lock = dir.lock()?;
    let catalog = Catalog::open(std::sync::Arc::new(dir.open_pool(Opener::Command).await?)).await?;
    let ctx = Ctx { catalog: &catalog, dir, daemon: false, clients: None };
    let read_only = req.is_read_only();
    let bar = parking_lot::Mutex::new(bar);
    let finish = || std::mem::replace(&mut *bar.lock(), output::Bar::new()).finish();
    let mut on_progress = |p: Progress| bar.lock().update(&p);
    let work = ops::execute(&ctx, req, &mut on_progress);
    if read_only {
        let result = work.await;
        finish();
        catalog.close().await?;
        return result;
    }
    // A change may run long (a rebuild, a scrub, an import): Ctrl-C or SIGTERM stops it at its
    // next safe point and closes the pool cleanly, as the daemon does at shutdown.
    tokio::pin!(work);
    let signal = tokio::select! {
        result = &mut work => {
            finish();
            catalog.close().await?;
            return result;
        }
        // (Were the signals not to be had, the operation just runs to its end.)
        Ok(signal) = interrupt() => signal,
    };
    errln!("\n{signal}: stopping at the next safe point and closing the pool (again to exit at once)");
    tokio::spawn(async {
        if interrupt().await.is_ok() {
            errln!("exiting at once: the next open recovers the pool as after a crash");
            std::process::exit(INTERRUPTED);
        }
    });
    // The close refuses new requests and rebuild or move rows, waits for those in flight and
    // flushes; the operation, still polled meanwhile, ends at its next step.
    let (closed, result) = tokio::join!(catalog.close(), work);
    finish();
    closed?;
    if let Err(e) = result {
        tracing::debug!(error = %format!("{e:#}"), "the interrupted operation ended with an error");
    }
    Err(Interrupted(format!(
        "interrupted by {signal}: the pool was closed cleanly. What the command had not done yet is not \
         done; a rebuild or rebalance in progress goes on when the daemon starts (`stria serve --pool {}`) \
         and `stria status` shows what is left",
        dir.path.display()
    ))
    .into())
}

/// What an offline command ended with when a signal stopped it (exit code [`INTERRUPTED`]).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct Interrupted(String);

/// The exit code of a command stopped by SIGINT or SIGTERM (128 + SIGINT, as shells report).
pub(crate) const INTERRUPTED: i32 = 130;

/// Waits for SIGINT or SIGTERM; returns which.
async fn interrupt() -> Result<&'static str> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut int = signal(SignalKind::interrupt())?;
    let mut term = signal(SignalKind::terminate())?;
    Ok(tokio::select! {
        _ = int.recv() => "SIGINT",
        _ = term.recv() => "SIGTERM",
    })
}
