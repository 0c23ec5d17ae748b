//! Pool operations: one implementation, run either in this process (pool opened locally) or in
//! the daemon (sent over the control socket). Requests and results are JSON.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::PathBuf;

use anyhow::{Context, Result, anyhow, bail};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use stria_dev::{FileDevice, IoBytes};
use stria_engine::units::format_size;
use stria_engine::{
    DEFAULT_CHUNK_BYTES, DriveClass, DriveState, Layout, NewDrive, Pool, VolumeRole, VolumeSpec,
};

use crate::pooldir::PoolDir;
use crate::stack::{AnyVolume, Stack};

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

/// Where the request runs.
pub(crate) struct Ctx<'a> {
    pub(crate) stack: &'a Stack,
    pub(crate) dir: &'a PoolDir,
    /// In the daemon, rebuilds run in the background instead of in the request.
    pub(crate) daemon: bool,
}

/// Parses a layout name against the pool (`raid0[:W]`, `raid1[:N]`, `raid10[:WxN]`, `ec:K+M`).
pub(crate) fn parse_layout(text: &str, drives_in_class: u32) -> Result<Layout> {
    let t = text.trim().to_ascii_lowercase();
    let num = |s: &str, what: &str| {
        s.parse::<u32>().map_err(|_| anyhow!("layout `{text}`: {what} `{s}` is not a number"))
    };
    let layout = if t == "raid0" {
        Layout::Raid0 { width: drives_in_class.max(1) }
    } else if let Some(w) = t.strip_prefix("raid0:") {
        Layout::Raid0 { width: num(w, "width")? }
    } else if t == "raid1" {
        Layout::Raid1 { copies: 2 }
    } else if let Some(n) = t.strip_prefix("raid1:") {
        Layout::Raid1 { copies: num(n, "copies")? }
    } else if t == "raid10" {
        Layout::Raid10 { width: (drives_in_class / 2).max(1), copies: 2 }
    } else if let Some(wn) = t.strip_prefix("raid10:") {
        let (w, n) = wn
            .split_once('x')
            .ok_or_else(|| anyhow!("layout `{text}`: expected raid10:WxN, e.g. raid10:3x2"))?;
        Layout::Raid10 { width: num(w, "width")?, copies: num(n, "copies")? }
    } else if let Some(km) = t.strip_prefix("ec:") {
        let (k, m) =
            km.split_once('+').ok_or_else(|| anyhow!("layout `{text}`: expected ec:K+M, e.g. ec:4+2"))?;
        Layout::Ec { data_shards: num(k, "K")?, parity_shards: num(m, "M")? }
    } else {
        bail!(
            "unknown layout `{text}`: use raid0, raid1, raid10, ec:K+M (e.g. ec:4+2), or raid0:W, raid1:N, raid10:WxN"
        );
    };
    layout.validate().map_err(|e| anyhow!(e))?;
    Ok(layout)
}

fn active_in_class(pool: &Pool<FileDevice>, class: DriveClass) -> u32 {
    let n = pool.meta().drives.iter().filter(|d| d.class == class && d.state == DriveState::Active).count();
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The class a volume goes on when none is given: capacity drives if the pool has any.
fn default_class(pool: &Pool<FileDevice>) -> DriveClass {
    if active_in_class(pool, DriveClass::Capacity) > 0 { DriveClass::Capacity } else { DriveClass::Fast }
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

/// Runs a request.
pub(crate) async fn execute(
    ctx: &Ctx<'_>,
    req: Request,
    progress: &mut (dyn FnMut(Progress) + Send),
) -> Result<Value> {
    let pool = &ctx.stack.pool;
    match req {
        Request::Status => status(ctx.stack),
        Request::VolumeCreate { name, size_bytes, layout, chunk_bytes, class, cache_bytes, cache_copies } => {
            if let Some(parsed) = stria_tier::parse_tiered_layout(&layout) {
                let (k, m) = parsed.map_err(|e| anyhow!(e))?;
                let spec = stria_tier::TieredSpec {
                    name: name.clone(),
                    size_bytes,
                    data_shards: k,
                    parity_shards: m,
                    chunk_bytes: chunk_bytes.unwrap_or(stria_tier::DEFAULT_TIER_CHUNK_BYTES),
                    cache_bytes,
                    cache_copies: cache_copies.unwrap_or(2),
                };
                let tv = stria_tier::create(pool, spec).await?;
                ctx.stack.add_tiered(tv);
                return volume_show(ctx.stack, &name);
            }
            if cache_bytes.is_some() || cache_copies.is_some() {
                bail!("--cache-size and --cache-copies apply to tiered layouts only (tiered:ec:K+M)");
            }
            let class = class.unwrap_or_else(|| default_class(pool));
            let layout = parse_layout(&layout, active_in_class(pool, class))?;
            let spec = VolumeSpec {
                name: name.clone(),
                size_bytes: size_bytes.next_multiple_of(4096),
                layout,
                chunk_bytes: chunk_bytes.unwrap_or(DEFAULT_CHUNK_BYTES),
                class,
                role: VolumeRole::Plain,
            };
            pool.create_volume(spec).await?;
            volume_show(ctx.stack, &name)
        }
        Request::VolumeShow { name } => volume_show(ctx.stack, &name),
        Request::VolumeResize { name, size_bytes } => {
            if ctx.stack.tiered(&name).is_some() {
                bail!("resizing a tiered volume is not supported yet");
            }
            require_plain(ctx.stack, &name)?;
            pool.resize_volume(&name, size_bytes.next_multiple_of(4096)).await?;
            volume_show(ctx.stack, &name)
        }
        Request::VolumeDelete { name } => {
            if let Some(tv) = ctx.stack.tiered(&name) {
                tv.close().await;
                stria_tier::delete(pool, &name).await?;
                ctx.stack.remove_tiered(&name);
            } else {
                require_plain(ctx.stack, &name)?;
                pool.delete_volume(&name).await?;
            }
            Ok(json!({ "deleted": name }))
        }
        Request::VolumeImport { name, path } => import(ctx.stack, &name, &path, progress).await,
        Request::VolumeExport { name, path } => export(ctx.stack, &name, &path, progress).await,
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
            let parts: Vec<String> = match ctx.stack.tiered(&name) {
                Some(tv) => [tv.cache_volume(), tv.meta_volume(), tv.capacity_volume()]
                    .iter()
                    .map(|v| v.name().to_string())
                    .collect(),
                None => {
                    require_plain(ctx.stack, &name)?;
                    vec![name.clone()]
                }
            };
            let mut total = json!({ "volume": name, "rows": 0, "blocks_checked": 0, "blocks_repaired": 0,
                "parity_blocks_fixed": 0, "copy_blocks_fixed": 0, "unrecoverable_blocks": 0,
                "inconsistent_blocks": 0 });
            for part in parts {
                let report = pool
                    .scrub(&part, |done, total| {
                        progress(Progress { what: format!("scrub {part}"), done, total })
                    })
                    .await?;
                let r = serde_json::to_value(report)?;
                for k in [
                    "rows",
                    "blocks_checked",
                    "blocks_repaired",
                    "parity_blocks_fixed",
                    "copy_blocks_fixed",
                    "unrecoverable_blocks",
                    "inconsistent_blocks",
                ] {
                    total[k] = json!(total[k].as_u64().unwrap_or(0) + r[k].as_u64().unwrap_or(0));
                }
            }
            Ok(total)
        }
    }
}

/// Errors unless `name` is a plain (client-visible) volume.
fn require_plain(stack: &Stack, name: &str) -> Result<()> {
    match stack.volume(name) {
        Some(AnyVolume::Plain(_)) => Ok(()),
        Some(AnyVolume::Tiered(_)) => bail!("`{name}` is a tiered volume"),
        None if stack.pool.volume(name).is_some() => {
            bail!("`{name}` is a part of a tiered volume; operate on the tiered volume instead")
        }
        None => bail!("no volume named `{name}`"),
    }
}

/// Pool status plus the tiered volumes.
fn status(stack: &Stack) -> Result<Value> {
    let mut v = serde_json::to_value(stack.pool.status())?;
    let tiered: Vec<Value> =
        stack.tiered_all().iter().map(|t| serde_json::to_value(t.status())).collect::<Result<_, _>>()?;
    v["tiered"] = Value::Array(tiered);
    Ok(v)
}

fn volume_show(stack: &Stack, name: &str) -> Result<Value> {
    if let Some(tv) = stack.tiered(name) {
        let mut v = serde_json::to_value(tv.status())?;
        v["kind"] = json!("tiered");
        return Ok(v);
    }
    let pool = &stack.pool;
    let status = pool.status();
    let vol =
        status.volumes.iter().find(|v| v.name == name).ok_or_else(|| anyhow!("no volume named `{name}`"))?;
    let meta = pool.meta();
    let rec = meta.volume(name).ok_or_else(|| anyhow!("no volume named `{name}`"))?;
    let segments: Vec<Value> = rec
        .segments
        .iter()
        .map(|s| {
            json!({
                "rows": s.rows,
                "members": s.members.iter().map(|m| json!({
                    "drive": m.slot,
                    "start_block": m.start_block,
                    "blocks": s.rows * u64::from(rec.chunk_blocks),
                    "rebuild_cursor_rows": m.rebuild_cursor_rows,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    let mut v = serde_json::to_value(vol)?;
    v["segments"] = Value::Array(segments);
    Ok(v)
}

async fn replace(ctx: &Ctx<'_>, slot: u32, new_path: Option<PathBuf>, domain: Option<String>) -> Result<u32> {
    let pool = &ctx.stack.pool;
    let meta = pool.meta();
    let old = meta.drive(slot).ok_or_else(|| anyhow!("no drive {slot}"))?.clone();
    let old_bytes = pool
        .drives()
        .iter()
        .find(|d| d.slot() == slot)
        .map(|d| d.superblock().layout.drive_bytes)
        .unwrap_or(old.data_blocks * 4096);
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
fn image_too_large(stack: &Stack, name: &str, path: &std::path::Path, len: u64, vol_bytes: u64) -> String {
    let fix = match stack.volume(name) {
        // `volume resize` refuses tiered volumes (not supported yet).
        Some(AnyVolume::Tiered(_)) => {
            "tiered volumes cannot be resized yet; import into a new, larger volume".to_string()
        }
        _ => format!("resize the volume first: `stria volume resize {name} --size {len}`"),
    };
    format!(
        "{} is {} but volume {name} is {}; {fix}",
        path.display(),
        format_size(len),
        format_size(vol_bytes)
    )
}

async fn import(
    stack: &Stack,
    name: &str,
    path: &PathBuf,
    progress: &mut (dyn FnMut(Progress) + Send),
) -> Result<Value> {
    let vol = stack.volume(name).ok_or_else(|| anyhow!("no volume named `{name}`"))?;
    let mut file = std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let len = file.metadata()?.len();
    if len > vol.size_bytes() {
        bail!(image_too_large(stack, name, path, len, vol.size_bytes()));
    }
    let mut buf = vec![0u8; COPY_STEP_BYTES];
    let mut at = 0u64;
    let mut zeroed = 0u64;
    while at < len {
        let n = usize::try_from(len - at).unwrap_or(usize::MAX).min(COPY_STEP_BYTES);
        file.read_exact(&mut buf[..n])?;
        if buf[..n].iter().all(|&b| b == 0) {
            vol.write_zeroes(at, n as u64, false, false).await?;
            zeroed += n as u64;
        } else {
            vol.write(at, IoBytes::copy_from(&buf[..n]), false).await?;
        }
        at += n as u64;
        progress(Progress { what: format!("import {name}"), done: at, total: len });
    }
    vol.flush().await?;
    Ok(json!({ "volume": name, "bytes": len, "zero_bytes": zeroed, "volume_bytes": vol.size_bytes() }))
}

async fn export(
    stack: &Stack,
    name: &str,
    path: &PathBuf,
    progress: &mut (dyn FnMut(Progress) + Send),
) -> Result<Value> {
    let vol = stack.volume(name).ok_or_else(|| anyhow!("no volume named `{name}`"))?;
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
