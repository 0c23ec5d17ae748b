//! Pool operations: one implementation, run either in this process (pool opened locally) or in
//! the daemon (sent over the control socket). Requests and results are JSON.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use stria_catalog::{Catalog, ConvertVolume, CreateVolume, QosUpdate, SnapshotView};
use stria_dev::{BLOCK_BYTES, FileDevice};
use stria_engine::maint::{self, Refusal, Removal};
use stria_engine::units::format_size;
use stria_engine::{DriveClass, EngineError, NewDrive, Pool};
use stria_tier::log::CacheMode;

use crate::drive_check;
use crate::pooldir::{Dev, PoolDir};
use crate::refusal;
use crate::transfer;

/// What a client asks of the pool.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub(crate) enum Request {
    Status,
    VolumeCreate(CreateVolume),
    VolumeShow {
        name: String,
    },
    VolumeResize {
        name: String,
        size_bytes: u64,
        /// Shrink even with NBD clients attached.
        #[serde(default)]
        force: bool,
        /// Shrinking discards everything past the new end: it must be asked for.
        #[serde(default)]
        allow_shrink: bool,
    },
    VolumeDelete {
        name: String,
        /// Delete even with NBD clients attached.
        #[serde(default)]
        force: bool,
        /// Delete the volume's snapshots with it: without this, a volume that has snapshots is
        /// refused.
        #[serde(default)]
        with_snapshots: bool,
        /// A clone: drop its map pages before answering (else a background task does, after
        /// the answer).
        #[serde(default)]
        wait: bool,
    },
    VolumeImport {
        name: String,
        path: PathBuf,
        /// Write over data the volume holds where the image goes.
        #[serde(default)]
        overwrite: bool,
        /// Import even with NBD clients attached.
        #[serde(default)]
        force: bool,
    },
    VolumeExport {
        name: String,
        path: PathBuf,
        /// Replace an existing file, or write over a block device (never a drive of this pool,
        /// nor one another process holds).
        #[serde(default)]
        overwrite: bool,
        /// Go on past blocks that cannot be read (none of their copies or parity is good),
        /// leaving zeros in the image there and listing them; by default the export stops at
        /// the first.
        #[serde(default)]
        skip_unreadable: bool,
    },
    DriveFail {
        drive: String,
        /// Fail it even when a volume has no other copy of some data.
        #[serde(default)]
        force: bool,
    },
    DriveReplace {
        drive: String,
        new_path: Option<PathBuf>,
        domain: Option<String>,
        /// Replace it even when a volume has nothing to rebuild from.
        #[serde(default)]
        force: bool,
        /// Format the replacement even though it carries another pool's superblock.
        #[serde(default)]
        overwrite: bool,
    },
    /// Brings a failed drive back into service, rebuilt from the other drives.
    DriveOnline {
        drive: String,
        #[serde(default)]
        force: bool,
    },
    RebuildRate {
        bytes_per_sec: u64,
    },
    /// Takes a drive out of the pool: at once when it holds no data, otherwise once its
    /// members have moved to the other drives of its class.
    DriveRemove {
        drive: String,
        /// Bytes per second for the moves (0: no limit besides QoS); also asks for a rebalance.
        #[serde(default)]
        rate_bytes_per_sec: u64,
    },
    /// Moves extents until the drives of each class are evenly used (resumed after a restart).
    PoolRebalance {
        /// Bytes copied per second at most (0: no limit besides QoS).
        #[serde(default)]
        rate_bytes_per_sec: u64,
    },
    /// Adds a drive to the pool (a device or file; a new sparse file of `size_bytes` when none).
    DriveAdd {
        class: DriveClass,
        path: Option<PathBuf>,
        size_bytes: Option<u64>,
        domain: Option<String>,
        /// Format it even though it carries another pool's superblock.
        #[serde(default)]
        overwrite: bool,
        /// Do not ask for a rebalance onto it (by default one is asked for).
        #[serde(default)]
        no_rebalance: bool,
    },
    /// Resets the persistent error counters of one drive (id or path), or of all for `None`.
    DriveClearErrors {
        drive: Option<String>,
    },
    Scrub {
        name: String,
    },
    /// Resumes writes suspended by a full host filesystem (after a resync of what the failed
    /// writes touched).
    PoolClear,
    SnapshotCreate {
        volume: String,
        name: String,
    },
    SnapshotList {
        volume: Option<String>,
    },
    SnapshotDelete {
        volume: String,
        name: String,
        /// Delete it even with NBD clients attached to its export.
        #[serde(default)]
        force: bool,
        /// Hand its pages on before answering (else a background task does, after the answer).
        #[serde(default)]
        wait: bool,
    },
    VolumeRollback {
        volume: String,
        snapshot: String,
        /// Roll back even with NBD clients attached.
        #[serde(default)]
        force: bool,
        /// Delete the snapshots newer than `snapshot` first.
        #[serde(default)]
        destroy_newer: bool,
    },
    /// Makes a plain volume log-structured, in place of it (docs/design/convert.md).
    VolumeConvert {
        #[serde(flatten)]
        volume: ConvertVolume,
        /// Convert even with NBD clients attached (their requests fail meanwhile).
        #[serde(default)]
        force: bool,
    },
    VolumeClone {
        /// `VOL@SNAP`.
        source: String,
        name: String,
    },
    /// Changes a volume's QoS settings.
    VolumeSet {
        name: String,
        qos: QosUpdate,
    },
    /// Changes when a tiered or log volume acknowledges writes without FUA.
    VolumeCacheMode {
        name: String,
        cache_mode: CacheMode,
    },
    /// Measures each drive class for QoS costs and admission.
    PoolCalibrate,
    /// The daemon's request counters and latency histograms (`stria iostat`).
    Stats,
}

impl Request {
    /// True when the request only reads (the daemon runs it at once, not as a job).
    pub(crate) fn is_read_only(&self) -> bool {
        matches!(
            self,
            Request::Status | Request::VolumeShow { .. } | Request::SnapshotList { .. } | Request::Stats
        )
    }

    /// The volume whose name the request gives to another volume object (the daemon serves the
    /// name anew afterwards, whether the request succeeded or not).
    pub(crate) fn replaces_volume(&self) -> Option<&str> {
        match self {
            Request::VolumeConvert { volume, .. } => Some(&volume.name),
            _ => None,
        }
    }

    /// True when the request changes which volumes exist (the daemon re-syncs its exports).
    pub(crate) fn changes_volumes(&self) -> bool {
        matches!(
            self,
            Request::VolumeCreate(_)
                | Request::VolumeDelete { .. }
                | Request::VolumeResize { .. }
                | Request::SnapshotCreate { .. }
                | Request::SnapshotDelete { .. }
                | Request::VolumeRollback { .. }
                | Request::VolumeConvert { .. }
                | Request::VolumeClone { .. }
        )
    }
}

/// Progress of a long operation.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Progress {
    pub(crate) what: String,
    pub(crate) done: u64,
    pub(crate) total: u64,
}

/// Where a long operation reports its progress.
pub(crate) type ProgressFn<'a> = &'a mut (dyn FnMut(Progress) + Send);

/// Where the request runs.
pub(crate) struct Ctx<'a> {
    pub(crate) catalog: &'a Catalog<Dev>,
    pub(crate) dir: &'a PoolDir,
    /// In the daemon, rebuilds run in the background instead of in the request.
    pub(crate) daemon: bool,
    /// In the daemon: how many NBD connections have a volume open (none without a daemon: it
    /// holds the pool's lock while it runs).
    pub(crate) clients: Option<&'a (dyn Fn(&str) -> usize + Sync)>,
}

impl Ctx<'_> {
    /// Refuses a change that cuts off or errs the NBD clients of `name`, unless forced.
    fn check_clients(&self, name: &str, what: &str, force: bool) -> Result<()> {
        let attached = self.clients.map_or(0, |count| count(name));
        if attached > 0 && !force {
            return Err(refusal::conflict(format!(
                "volume {name} has {attached} NBD client(s) attached; {what} would cut them off or fail \
                 their requests. Disconnect them first, or run the same command again with --force"
            )));
        }
        if attached > 0 {
            tracing::warn!(volume = name, clients = attached, "{what} with clients attached (--force)");
        }
        Ok(())
    }
}

/// Refuses to delete volume `name` while it has snapshots, unless `allowed`: they would go with
/// it (as `zfs destroy` needs `-r` and `rbd rm` refuses an image with snapshots).
fn check_snapshots_deleted(name: &str, snapshots: &[SnapshotView], allowed: bool) -> Result<()> {
    if snapshots.is_empty() {
        return Ok(());
    }
    const LISTED: usize = 8;
    let mut names: Vec<&str> = snapshots.iter().take(LISTED).map(|s| s.name.as_str()).collect();
    let more = format!("and {} more", snapshots.len().saturating_sub(LISTED));
    if snapshots.len() > LISTED {
        names.push(&more);
    }
    let message = format!(
        "volume {name} has {} snapshot(s) ({}); deleting it deletes them too",
        snapshots.len(),
        names.join(", ")
    );
    if allowed {
        tracing::warn!("{message} (--with-snapshots)");
        return Ok(());
    }
    Err(refusal::conflict(format!(
        "{message}. Delete them first (`stria snapshot delete {name} SNAPSHOT`), or say so with \
         --with-snapshots (`\"with_snapshots\": true` through the REST API)"
    )))
}

/// Refuses to delete the unavailable volume `name` unless `allowed`: what it has cannot be
/// listed, and its snapshots and clones, if any, go with its parts.
fn check_unlisted_deleted(name: &str, why: &str, allowed: bool) -> Result<()> {
    let message = format!(
        "volume {name} is unavailable ({why}), so its snapshots and clones cannot be listed; deleting it \
         deletes any it has"
    );
    if allowed {
        tracing::warn!("{message} (--with-snapshots)");
        return Ok(());
    }
    Err(refusal::conflict(format!(
        "{message}. Bring its drives back first (`stria status` lists what it lacks), or say so with \
         --with-snapshots (`\"with_snapshots\": true` through the REST API)"
    )))
}

/// Refuses to shrink volume `name` from `old_bytes` to `new_bytes` unless `allowed`: what lies
/// past the new end is discarded (as `rbd resize` needs `--allow-shrink` and `lvreduce` asks).
fn check_shrink(name: &str, old_bytes: u64, new_bytes: u64, allowed: bool) -> Result<()> {
    let message = format!(
        "shrinking volume {name} from {} to {} discards its last {} (bytes {new_bytes} to {old_bytes}) and \
         whatever is stored there",
        format_size(old_bytes),
        format_size(new_bytes),
        format_size(old_bytes - new_bytes)
    );
    if allowed {
        tracing::warn!("{message} (--allow-shrink)");
        return Ok(());
    }
    bail!(
        "{message}. Shrink the filesystem on it first; then say so with --allow-shrink (`\"allow_shrink\": \
         true` through the REST API)"
    )
}

/// A refusal of the engine's guarded drive workflows as this binary says it: the same message,
/// with the hint of how to go ahead from the command line (the REST API says so too: its requests
/// take the same `force`). Other errors pass as they are.
fn refused(e: EngineError) -> anyhow::Error {
    let EngineError::Refused(r) = e else { return e.into() };
    let message = match r {
        Refusal::LastCopy { .. } => format!(
            "{r}. Replace or bring back another drive first, or run the same command again with --force"
        ),
        Refusal::NoRebuildSource { .. } => format!(
            "{r}. To give it up, delete them (`stria volume delete NAME`) and run this command again, or run it \
             again with --force: the drive comes back for the other volumes and those stay failed"
        ),
        r => r.to_string(),
    };
    refusal::conflict(message)
}

/// Finds a drive by slot number or by path.
fn find_drive(pool: &Pool<FileDevice>, id: &str) -> Result<u32> {
    let meta = pool.meta();
    if let Ok(slot) = id.parse::<u32>()
        && meta.drive(slot).is_some()
    {
        return Ok(slot);
    }
    let wanted = std::fs::canonicalize(id).unwrap_or_else(|_| PathBuf::from(id));
    for d in &meta.drives {
        let hint = std::fs::canonicalize(&d.path_hint).unwrap_or_else(|_| PathBuf::from(&d.path_hint));
        if hint == wanted {
            return Ok(d.slot);
        }
    }
    let known: Vec<String> = meta.drives.iter().map(|d| format!("{} ({})", d.slot, d.path_hint)).collect();
    Err(refusal::not_found(format!("no drive `{id}` in the pool; drives are: {}", known.join(", "))))
}

/// A typed view as the JSON the control socket carries and `--json` prints.
fn to_json(view: &impl Serialize) -> Result<Value> {
    Ok(serde_json::to_value(view)?)
}

/// Runs a request.
pub(crate) async fn execute(
    ctx: &Ctx<'_>,
    req: Request,
    progress: &mut (dyn FnMut(Progress) + Send),
) -> Result<Value> {
    let catalog = ctx.catalog;
    let pool = catalog.pool();
    match req {
        Request::Status => to_json(&catalog.status()),
        Request::VolumeCreate(req) => to_json(&catalog.create(req).await?),
        Request::VolumeShow { name } => to_json(&catalog.show_full(&name).await?),
        Request::VolumeResize { name, size_bytes, force, allow_shrink } => {
            // Volumes that cannot be resized get the catalog's refusal, whatever the size.
            let resizable = catalog.lookup(&name).filter(|_| catalog.resizable(&name));
            if let Some(old_bytes) = resizable.map(|v| v.size_bytes()) {
                let new_bytes = size_bytes.next_multiple_of(BLOCK_BYTES);
                if new_bytes < old_bytes {
                    check_shrink(&name, old_bytes, new_bytes, allow_shrink)?;
                    ctx.check_clients(&name, "shrinking it", force)?;
                }
            }
            to_json(&catalog.resize(&name, size_bytes).await?)
        }
        Request::VolumeDelete { name, force, with_snapshots, wait } => {
            ctx.check_clients(&name, "deleting it", force)?;
            // A name with no snapshots to list (a plain volume, an unavailable one, none at all)
            // gets the delete's own answer.
            let snapshots = catalog.snapshots(Some(&name)).unwrap_or_default();
            check_snapshots_deleted(&name, &snapshots, with_snapshots)?;
            if let Some(why) = catalog.unavailable_reason(&name) {
                check_unlisted_deleted(&name, &why, with_snapshots)?;
            }
            // As for a snapshot: without a daemon the command finishes a clone's delete.
            let in_background = if wait || !ctx.daemon {
                catalog.delete(&name).await?;
                false
            } else {
                catalog.delete_in_background(&name).await?
            };
            let mut answer = json!({ "deleted": name });
            if let Some(clones) = catalog.kept_for_clones(&name) {
                answer["kept_for_clones"] = json!(clones);
            }
            if in_background {
                answer["in_background"] = json!(true);
            }
            Ok(answer)
        }
        Request::VolumeImport { name, path, overwrite, force } => {
            ctx.check_clients(&name, "importing an image into it", force)?;
            transfer::import(catalog, &name, &path, overwrite, progress).await
        }
        Request::VolumeExport { name, path, overwrite, skip_unreadable } => {
            transfer::export(
                catalog,
                &name,
                &path,
                transfer::ExportOptions { overwrite, skip_unreadable },
                progress,
            )
            .await
        }
        Request::DriveFail { drive, force } => {
            let slot = find_drive(pool, &drive)?;
            maint::fail_drive(pool, slot, force, "failed by the operator (drive fail)")
                .await
                .map_err(refused)?;
            Ok(json!({ "failed": slot }))
        }
        Request::DriveOnline { drive, force } => {
            let slot = find_drive(pool, &drive)?;
            let (new_slot, resync) = match online(ctx, slot, force).await? {
                stria_engine::Comeback::Delta { slot, .. } => (slot, "delta".to_string()),
                stria_engine::Comeback::Full { slot, why } => (slot, format!("full ({why})")),
            };
            rebuild_here(ctx, progress).await?;
            Ok(
                json!({ "online": slot, "new_drive": new_slot, "resync": resync, "rebuild": rebuild_where(ctx) }),
            )
        }
        Request::DriveReplace { drive, new_path, domain, force, overwrite } => {
            let slot = find_drive(pool, &drive)?;
            let replacing = maint::Replacement::check(pool, slot, force).map_err(refused)?;
            let (new_slot, kept) = replace(ctx, replacing, new_path, domain, overwrite).await?;
            rebuild_here(ctx, progress).await?;
            Ok(json!({
                "replaced": slot,
                "new_drive": new_slot,
                "rebuild": rebuild_where(ctx),
                "old_file_kept_as": kept,
            }))
        }
        Request::DriveAdd { class, path, size_bytes, domain, overwrite, no_rebalance } => {
            let slot = add(ctx, class, path, size_bytes, domain, overwrite).await?;
            // The automatic policy: existing extents spread onto the new drive, in the daemon's
            // background (without a daemon, at its next start or by `pool rebalance`).
            if !no_rebalance {
                let rate = pool.meta().rebalance.map_or(0, |r| r.rate_bytes_per_sec);
                pool.request_rebalance(rate).await?;
            }
            let rebalance = match (no_rebalance, ctx.daemon) {
                (true, _) => "not asked for",
                (false, true) => "running in the daemon",
                (false, false) => {
                    "asked for: it runs when the daemon starts, or now with `stria pool rebalance`"
                }
            };
            Ok(json!({ "added": slot, "rebalance": rebalance, "status": pool.status() }))
        }
        Request::DriveRemove { drive, rate_bytes_per_sec } => {
            let slot = find_drive(pool, &drive)?;
            if maint::start_remove(pool, slot, rate_bytes_per_sec).await? == Removal::Draining {
                if ctx.daemon {
                    return Ok(json!({ "draining": slot, "rebalance": "running in the daemon" }));
                }
                let report = rebalance_here(ctx, progress).await?;
                maint::check_drained(pool, slot, &report).map_err(refused)?;
            }
            let kept = finish_remove(pool, ctx.dir, slot).await?;
            Ok(json!({ "removed": slot, "file_kept_as": kept }))
        }
        Request::PoolRebalance { rate_bytes_per_sec } => {
            pool.request_rebalance(rate_bytes_per_sec).await?;
            if ctx.daemon {
                return Ok(
                    json!({ "rebalance": "running in the daemon", "status": pool.rebalance_status() }),
                );
            }
            let report = rebalance_here(ctx, progress).await?;
            for slot in pool.drained() {
                finish_remove(pool, ctx.dir, slot).await?;
            }
            Ok(json!({ "rebalance": "done", "report": to_json(&report)? }))
        }
        Request::RebuildRate { bytes_per_sec } => {
            pool.store_rebuild_rate(bytes_per_sec).await?;
            Ok(json!({ "rebuild_rate_bytes_per_sec": bytes_per_sec }))
        }
        Request::DriveClearErrors { drive } => {
            let slot = drive.map(|d| find_drive(pool, &d)).transpose()?;
            let cleared = pool.clear_drive_errors(slot).await?;
            Ok(json!({ "cleared": cleared, "all": slot.is_none() }))
        }
        Request::PoolClear => {
            let was = pool.suspension();
            let report = pool.clear_suspension().await?;
            Ok(json!({ "was_suspended": was, "resync": to_json(&report)? }))
        }
        Request::SnapshotCreate { volume, name } => to_json(&catalog.snapshot_create(&volume, &name).await?),
        Request::SnapshotList { volume } => to_json(&catalog.snapshot_list(volume.as_deref()).await?),
        Request::SnapshotDelete { volume, name, force, wait } => {
            ctx.check_clients(&format!("{volume}@{name}"), "deleting the snapshot", force)?;
            // Without a daemon the pool closes when the command ends, which would stop a
            // background delete (and leave it to the next open): the command finishes it.
            if wait || !ctx.daemon {
                to_json(&catalog.snapshot_delete(&volume, &name).await?)
            } else {
                to_json(&catalog.snapshot_delete_in_background(&volume, &name).await?)
            }
        }
        Request::VolumeConvert { volume, force } => {
            let name = volume.name.clone();
            ctx.check_clients(&name, "converting it (its requests fail until the conversion ends)", force)?;
            let what = format!("convert {name}");
            let done = catalog
                .convert(volume, &mut |done, total| progress(Progress { what: what.clone(), done, total }))
                .await?;
            to_json(&done)
        }
        Request::VolumeClone { source, name } => to_json(&catalog.volume_clone(&source, &name).await?),
        Request::VolumeSet { name, qos } => to_json(&catalog.set_qos(&name, &qos).await?),
        Request::VolumeCacheMode { name, cache_mode } => {
            to_json(&catalog.set_cache_mode(&name, cache_mode).await?)
        }
        Request::PoolCalibrate => to_json(&pool.calibrate().await?),
        Request::Stats => {
            bail!("request counters live in the daemon: start `stria serve` (or `stria up`) and ask again")
        }
        Request::VolumeRollback { volume, snapshot, force, destroy_newer } => {
            ctx.check_clients(&volume, "rolling it back (its data changes under them)", force)?;
            to_json(&catalog.volume_rollback_with(&volume, &snapshot, destroy_newer).await?)
        }
        Request::Scrub { name } => {
            let report = catalog
                .scrub(&name, &mut |part, done, total| {
                    progress(Progress { what: format!("scrub {part}"), done, total })
                })
                .await?;
            to_json(&report)
        }
    }
}

/// Runs the moves in the request (no daemon): first any pending rebuild, which moves wait for.
async fn rebalance_here(
    ctx: &Ctx<'_>,
    progress: &mut (dyn FnMut(Progress) + Send),
) -> Result<stria_engine::RebalanceReport> {
    rebuild_here(ctx, progress).await?;
    let report = ctx
        .catalog
        .pool()
        .rebalance(|m| {
            progress(Progress {
                what: format!(
                    "move {} segment {} member {} to drive {}",
                    m.volume, m.segment, m.member, m.to_drive
                ),
                done: m.rows_done,
                total: m.rows_total,
            })
        })
        .await?;
    Ok(report)
}

/// Takes a drive that holds nothing out of the pool: its record, its line in `pool.json`, and a
/// drive file of the pool's own renamed to `NAME.img.removed` (a device is left as it is).
/// Returns where the file went.
pub(crate) async fn finish_remove(pool: &Pool<Dev>, dir: &PoolDir, slot: u32) -> Result<Option<String>> {
    let path = maint::take_out(pool, slot).await?;
    let kept = forget_drive(dir, Path::new(&path))?;
    tracing::info!(slot, "drive removed from the pool");
    Ok(kept)
}

/// After a drive at `path` left the pool: its line in `pool.json` goes, and a drive file of the
/// pool's own is renamed to `NAME.img.removed`. Returns where the file went.
fn forget_drive(dir: &PoolDir, path: &Path) -> Result<Option<String>> {
    dir.remove_device(path)?;
    // Renamed, or the pool would list it as "not a member any more" at every open.
    let ours = crate::pooldir::absolute(&dir.drives_dir()).is_ok_and(|d| path.starts_with(d));
    let mut kept = None;
    if ours && path.exists() {
        let to = path.with_extension("img.removed");
        match std::fs::rename(path, &to) {
            Ok(()) => kept = Some(to.display().to_string()),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot rename the removed drive file")
            }
        }
    }
    Ok(kept)
}

/// What the daemon's maintenance services do in the pool directory when they have taken a
/// drained drive out of the pool (as [`finish_remove`] does after the engine's part).
pub(crate) struct DirRemoval(pub(crate) PoolDir);

impl maint::DriveRemoved for DirRemoval {
    fn drive_removed(&self, _slot: u32, path: &str) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        forget_drive(&self.0, Path::new(path)).map(|_| ()).map_err(Into::into)
    }
}

/// Runs the pending rebuilds in the request, unless the daemon runs them in the background.
async fn rebuild_here(ctx: &Ctx<'_>, progress: &mut (dyn FnMut(Progress) + Send)) -> Result<()> {
    if !ctx.daemon {
        ctx.catalog
            .pool()
            .rebuild(|p| {
                progress(Progress {
                    what: format!("rebuild {}", p.volume),
                    done: p.rows_done,
                    total: p.rows_total,
                })
            })
            .await?;
    }
    Ok(())
}

fn rebuild_where(ctx: &Ctx<'_>) -> &'static str {
    if ctx.daemon { "running in the daemon" } else { "done" }
}

/// `drive online`: a failed drive whose device is there again comes back, in its own slot with
/// a delta resync of what it missed when it can, else as a new drive id on the same device,
/// rebuilt in full (docs/design/delta-resync.md).
async fn online(ctx: &Ctx<'_>, slot: u32, force: bool) -> Result<stria_engine::Comeback> {
    let pool = ctx.catalog.pool();
    if pool.meta().drive(slot).is_none() {
        return Err(refusal::not_found(format!("no drive {slot}")));
    }
    let online = maint::Online::check(pool, slot, force).map_err(refused)?;
    let path = PathBuf::from(&online.record().path_hint);
    let dev = drive_check::open_drive(&path).with_context(|| {
        format!("drive {slot} was last seen at {}, which cannot be opened; replace it instead (`stria drive replace {slot}`)", path.display())
    })?;
    Ok(online.run(pool, dev).await?)
}

/// Replaces the drive the guards allowed to replace; returns the new drive's slot and where the
/// old drive file of ours was kept, if it was.
async fn replace(
    ctx: &Ctx<'_>,
    replacing: maint::Replacement,
    new_path: Option<PathBuf>,
    domain: Option<String>,
    overwrite: bool,
) -> Result<(u32, Option<String>)> {
    let pool = ctx.catalog.pool();
    let slot = replacing.slot();
    let meta = pool.meta();
    let old = meta.drive(slot).ok_or_else(|| anyhow!("no drive {slot}"))?.clone();
    let old_bytes = pool
        .drives()
        .iter()
        .find(|d| d.slot() == slot)
        .map(|d| d.superblock().layout.drive_bytes)
        .unwrap_or(old.data_blocks * BLOCK_BYTES);
    let path = match new_path {
        Some(p) => crate::pooldir::absolute(&p)?,
        None => {
            let mut i = meta.next_slot;
            loop {
                let p = ctx.dir.drives_dir().join(format!("{}-{i}.img", old.class));
                if !p.exists() {
                    break p;
                }
                i += 1;
            }
        }
    };
    ctx.dir.refuse_member(&path, slot, pool).await?;
    let (dev, fresh) = if path.exists() {
        let dev = drive_check::open_drive(&path)?;
        // A drive of this pool got here only as the drive being replaced (refuse_member).
        let ours = stria_engine::read_label(&dev).await.is_some_and(|l| l.pool_uuid == pool.meta().pool_uuid);
        if !ours {
            drive_check::refuse_foreign(&dev, &path, overwrite, "--overwrite").await?;
        }
        (dev, false)
    } else {
        let dev = FileDevice::create(&path, old_bytes)
            .with_context(|| format!("cannot create {}", path.display()))?;
        (dev, true)
    };
    let nd = NewDrive {
        dev,
        path: path.display().to_string(),
        class: old.class,
        domain: domain.unwrap_or_default(),
        fresh,
    };
    let new_slot = replacing.run(pool, nd).await?;
    ctx.dir.add_device(&path)?;
    // A replaced drive file of ours is renamed out of the way (kept, not deleted: it may be
    // all that is left of some data), and the reply says where.
    let old_path = PathBuf::from(&old.path_hint);
    let ours = crate::pooldir::absolute(&ctx.dir.drives_dir()).is_ok_and(|d| old_path.starts_with(d));
    let mut kept = None;
    if ours && old_path.exists() && old_path != path {
        let to = old_path.with_extension("img.replaced");
        match std::fs::rename(&old_path, &to) {
            Ok(()) => kept = Some(to.display().to_string()),
            Err(e) => {
                tracing::warn!(path = %old_path.display(), error = %e, "cannot rename the replaced drive file")
            }
        }
    }
    Ok((new_slot, kept))
}

/// Adds a drive of `class` at `path` (a new sparse file of `size_bytes` in the pool directory
/// when there is none): refused when it is a drive of this pool already or, without
/// `overwrite`, of another pool. A device formatted for this pool by an add that crashed before
/// its commit (its slot unknown to the metadata) may be given again.
async fn add(
    ctx: &Ctx<'_>,
    class: DriveClass,
    path: Option<PathBuf>,
    size_bytes: Option<u64>,
    domain: Option<String>,
    overwrite: bool,
) -> Result<u32> {
    let pool = ctx.catalog.pool();
    let meta = pool.meta();
    let path = match path {
        Some(p) => crate::pooldir::absolute(&p)?,
        None => {
            let mut i = meta.next_slot;
            loop {
                let p = crate::pooldir::absolute(&ctx.dir.drives_dir().join(format!("{class}-{i}.img")))?;
                if !p.exists() {
                    break p;
                }
                i += 1;
            }
        }
    };
    let (dev, fresh) = if path.exists() {
        if size_bytes.is_some() {
            return Err(refusal::invalid(format!(
                "{} exists: --size is for a new file (give a new path, or no --size)",
                path.display()
            )));
        }
        let dev = drive_check::open_drive(&path)?;
        let label = stria_engine::read_label(&dev).await;
        // A label of this pool naming a slot the metadata does not know: a crashed add.
        let leftover =
            label.as_ref().filter(|l| l.pool_uuid == meta.pool_uuid && meta.drive(l.slot).is_none());
        ctx.dir.refuse_member(&path, leftover.map_or(u32::MAX, |l| l.slot), pool).await?;
        if leftover.is_none() {
            drive_check::refuse_foreign(&dev, &path, overwrite, "--overwrite").await?;
        }
        (dev, false)
    } else {
        let Some(size) = size_bytes else {
            return Err(refusal::invalid(format!(
                "{} does not exist: give --size to create it as a sparse file",
                path.display()
            )));
        };
        let dev =
            FileDevice::create(&path, size).with_context(|| format!("cannot create {}", path.display()))?;
        (dev, true)
    };
    let nd =
        NewDrive { dev, path: path.display().to_string(), class, domain: domain.unwrap_or_default(), fresh };
    let added = pool.add_drive(nd).await;
    if added.is_err() && fresh {
        let _ = std::fs::remove_file(&path);
    }
    let slot = added?;
    ctx.dir.add_device(&path)?;
    Ok(slot)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(r: Refusal) -> (String, stria_engine::ErrorKind) {
        let e = refused(EngineError::Refused(r));
        (format!("{e:#}"), refusal::kind_of(&e))
    }

    /// The engine's refusals as the CLI and the REST API said them before the guards moved into
    /// the engine, word for word.
    #[test]
    fn the_engine_s_refusals_read_as_they_did_with_the_cli_s_hints() {
        let cases = [
            (Refusal::AlreadyFailed { slot: 2 }, "drive 2 is failed already".to_string()),
            (
                Refusal::NotFailed { slot: 2, state: stria_engine::DriveState::Active },
                "drive 2 is active, not failed; there is nothing to bring back".to_string(),
            ),
            (
                Refusal::LastCopy {
                    slot: 1,
                    action: maint::DriveAction::Fail,
                    volumes: vec!["r".into(), "s".into()],
                },
                "drive 1 holds the last in-sync copy of data of volume(s) r, s: failing it would make them \
                 unreadable. Replace or bring back another drive first, or run the same command again with \
                 --force"
                    .to_string(),
            ),
            (
                Refusal::LastCopy { slot: 1, action: maint::DriveAction::Replace, volumes: vec!["r".into()] },
                "drive 1 holds the last in-sync copy of data of volume(s) r: replacing it would make them \
                 unreadable. Replace or bring back another drive first, or run the same command again with \
                 --force"
                    .to_string(),
            ),
            (
                Refusal::NoRebuildSource { slot: 0, raid0: vec!["r".into()], other: vec!["e".into()] },
                "nothing to rebuild drive 0 from: volume(s) r are raid0: there is no copy or parity of their \
                 part; volume(s) e have lost more members than their copies or parity cover. A drive brought \
                 back or replaced is rebuilt from the other drives (stria does not take back a failed drive's \
                 old contents where it cannot know what the drive missed while it was out), so their data on \
                 it would be lost. Those volumes stay failed until deleted, and their data on drive 0 is \
                 left as it is for as long as the device is not reused. To give it up, delete them (`stria \
                 volume delete NAME`) and run this command again, or run it again with --force: the drive \
                 comes back for the other volumes and those stay failed"
                    .to_string(),
            ),
            (
                Refusal::NotDrained { slot: 3, why: "moves were abandoned".into() },
                "drive 3 is draining but could not be emptied yet: moves were abandoned".to_string(),
            ),
        ];
        for (r, said) in cases {
            assert_eq!(message(r), (said, stria_engine::ErrorKind::Conflict));
        }
        let other = refused(EngineError::NoSuchDrive("slot 9".into()));
        assert_eq!(
            refusal::kind_of(&other),
            stria_engine::ErrorKind::NotFound,
            "other errors pass as they are"
        );
    }
}
