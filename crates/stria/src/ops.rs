//! Pool operations: one implementation, run either in this process (pool opened locally) or in
//! the daemon (sent over the control socket). Requests and results are JSON.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use stria_catalog::{Catalog, CreateVolume};
use stria_dev::{BLOCK_BYTES, FileDevice, IoBytes};
use stria_engine::units::format_size;
use stria_engine::{DriveClass, Durability, NewDrive, Pool, Zeroing};

use crate::pooldir::{Dev, PoolDir};

/// Bytes moved per request by import/export.
const COPY_STEP_BYTES: usize = 4 << 20;

/// What a client asks of the pool.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub(crate) enum Request {
    Status,
    VolumeCreate {
        name: String,
        size_bytes: u64,
        layout: String,
        chunk_bytes: Option<u64>,
        class: Option<DriveClass>,
        #[serde(default)]
        cache_bytes: Option<u64>,
        #[serde(default)]
        cache_copies: Option<u32>,
    },
    VolumeShow {
        name: String,
    },
    VolumeResize {
        name: String,
        size_bytes: u64,
    },
    VolumeDelete {
        name: String,
    },
    VolumeImport {
        name: String,
        path: PathBuf,
    },
    VolumeExport {
        name: String,
        path: PathBuf,
    },
    DriveFail {
        drive: String,
    },
    DriveReplace {
        drive: String,
        new_path: Option<PathBuf>,
        domain: Option<String>,
    },
    RebuildRate {
        bytes_per_sec: u64,
    },
    /// Resets the persistent error counters of one drive (id or path), or of all for `None`.
    DriveClearErrors {
        drive: Option<String>,
    },
    Scrub {
        name: String,
    },
}

impl Request {
    /// True when the request changes which volumes exist (the daemon re-syncs its exports).
    pub(crate) fn changes_volumes(&self) -> bool {
        matches!(
            self,
            Request::VolumeCreate { .. } | Request::VolumeDelete { .. } | Request::VolumeResize { .. }
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
type ProgressFn<'a> = &'a mut (dyn FnMut(Progress) + Send);

/// Where the request runs.
pub(crate) struct Ctx<'a> {
    pub(crate) catalog: &'a Catalog<Dev>,
    pub(crate) dir: &'a PoolDir,
    /// In the daemon, rebuilds run in the background instead of in the request.
    pub(crate) daemon: bool,
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
    bail!("no drive `{id}` in the pool; drives are: {}", known.join(", "))
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
        Request::VolumeCreate { name, size_bytes, layout, chunk_bytes, class, cache_bytes, cache_copies } => {
            let req =
                CreateVolume { name, size_bytes, layout, chunk_bytes, class, cache_bytes, cache_copies };
            to_json(&catalog.create(req).await?)
        }
        Request::VolumeShow { name } => to_json(&catalog.show(&name)?),
        Request::VolumeResize { name, size_bytes } => to_json(&catalog.resize(&name, size_bytes).await?),
        Request::VolumeDelete { name } => {
            catalog.delete(&name).await?;
            Ok(json!({ "deleted": name }))
        }
        Request::VolumeImport { name, path } => import(catalog, &name, &path, progress).await,
        Request::VolumeExport { name, path } => export(catalog, &name, &path, progress).await,
        Request::DriveFail { drive } => {
            let slot = find_drive(pool, &drive)?;
            pool.fail_drive(slot, "failed by the operator (drive fail)").await?;
            Ok(json!({ "failed": slot }))
        }
        Request::DriveReplace { drive, new_path, domain } => {
            let slot = find_drive(pool, &drive)?;
            let new_slot = replace(ctx, slot, new_path, domain).await?;
            if !ctx.daemon {
                pool.rebuild(|p| {
                    progress(Progress {
                        what: format!("rebuild {}", p.volume),
                        done: p.rows_done,
                        total: p.rows_total,
                    })
                })
                .await?;
            }
            Ok(
                json!({ "replaced": slot, "new_drive": new_slot, "rebuild": if ctx.daemon { "running in the daemon" } else { "done" } }),
            )
        }
        Request::RebuildRate { bytes_per_sec } => {
            pool.set_rebuild_rate(bytes_per_sec);
            Ok(json!({ "rebuild_rate_bytes_per_sec": bytes_per_sec }))
        }
        Request::DriveClearErrors { drive } => {
            let slot = drive.map(|d| find_drive(pool, &d)).transpose()?;
            let cleared = pool.clear_drive_errors(slot).await?;
            Ok(json!({ "cleared": cleared, "all": slot.is_none() }))
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

async fn replace(ctx: &Ctx<'_>, slot: u32, new_path: Option<PathBuf>, domain: Option<String>) -> Result<u32> {
    let pool = ctx.catalog.pool();
    let meta = pool.meta();
    let old = meta.drive(slot).ok_or_else(|| anyhow!("no drive {slot}"))?.clone();
    let old_bytes = pool
        .drives()
        .iter()
        .find(|d| d.slot() == slot)
        .map(|d| d.superblock().layout.drive_bytes)
        .unwrap_or(old.data_blocks * BLOCK_BYTES);
    let path = match new_path {
        Some(p) => p,
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
    let (dev, fresh) = if path.exists() {
        (
            FileDevice::open(&path, &stria_dev::FileOptions::default())
                .with_context(|| format!("cannot open {}", path.display()))?,
            false,
        )
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
    let new_slot = pool.replace_drive(slot, nd).await?;
    ctx.dir.add_device(&path)?;
    // A replaced drive file of ours is renamed out of the way (kept, not deleted).
    let old_path = PathBuf::from(&old.path_hint);
    if old_path.starts_with(ctx.dir.drives_dir()) && old_path.exists() {
        let _ = std::fs::rename(&old_path, old_path.with_extension("img.replaced"));
    }
    Ok(new_slot)
}

/// Why an image does not fit a volume, and what would make it fit.
fn image_too_large(
    catalog: &Catalog<Dev>,
    name: &str,
    path: &std::path::Path,
    len: u64,
    vol_bytes: u64,
) -> String {
    let fix = if catalog.resizable(name) {
        format!("resize the volume first: `stria volume resize {name} --size {len}`")
    } else {
        // `volume resize` refuses tiered volumes (not supported yet).
        "tiered volumes cannot be resized yet; import into a new, larger volume".to_string()
    };
    format!(
        "{} is {} but volume {name} is {}; {fix}",
        path.display(),
        format_size(len),
        format_size(vol_bytes)
    )
}

async fn import(catalog: &Catalog<Dev>, name: &str, path: &Path, progress: ProgressFn<'_>) -> Result<Value> {
    let vol = catalog.lookup(name).ok_or_else(|| anyhow!("no volume named `{name}`"))?;
    let mut file = std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let len = file.metadata()?.len();
    if len > vol.size_bytes() {
        bail!(image_too_large(catalog, name, path, len, vol.size_bytes()));
    }
    let mut buf = vec![0u8; COPY_STEP_BYTES];
    let mut at = 0u64;
    let mut zeroed = 0u64;
    while at < len {
        let n = usize::try_from(len - at).unwrap_or(usize::MAX).min(COPY_STEP_BYTES);
        file.read_exact(&mut buf[..n])?;
        if buf[..n].iter().all(|&b| b == 0) {
            vol.write_zeroes(at, n as u64, Zeroing::ANY, Durability::Buffered).await?;
            zeroed += n as u64;
        } else {
            vol.write(at, IoBytes::copy_from(&buf[..n]), Durability::Buffered).await?;
        }
        at += n as u64;
        progress(Progress { what: format!("import {name}"), done: at, total: len });
    }
    vol.flush().await?;
    Ok(json!({ "volume": name, "bytes": len, "zero_bytes": zeroed, "volume_bytes": vol.size_bytes() }))
}

async fn export(catalog: &Catalog<Dev>, name: &str, path: &Path, progress: ProgressFn<'_>) -> Result<Value> {
    let vol = catalog.lookup(name).ok_or_else(|| anyhow!("no volume named `{name}`"))?;
    let tmp = path.with_extension("stria-partial");
    let mut file = std::fs::File::create(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
    let size = vol.size_bytes();
    let mut at = 0u64;
    while at < size {
        let n = usize::try_from(size - at).unwrap_or(usize::MAX).min(COPY_STEP_BYTES);
        // Holes stay holes in the file (it is sparse where the volume is).
        let status = vol.block_status(at, n as u64)?;
        if status.iter().all(|e| e.unallocated) {
            file.seek(SeekFrom::Current(n as i64))?;
        } else {
            let data = vol.read(at, n).await?;
            file.write_all(&data)?;
        }
        at += n as u64;
        progress(Progress { what: format!("export {name}"), done: at, total: size });
    }
    file.set_len(size)?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)?;
    Ok(json!({ "volume": name, "bytes": size, "path": path }))
}
