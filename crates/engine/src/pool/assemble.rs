//! Assembling a pool from the drives found, in any order: identity, freshness and quorum checks.

use std::collections::HashMap;

use std::sync::Arc;

use stria_dev::BlockDevice;
use uuid::Uuid;

use super::core::PoolCore;
use super::epochs::EpochBook;
use super::{FoundDrive, Pool};
use crate::drive::{Drive, OpenFindings, read_flush_record, read_metadata, read_superblock};
use crate::error::EngineError;
use crate::format::FormatError;
use crate::format::flush_record::FlushRecord;
use crate::format::meta::{DriveState, PoolMeta};
use crate::format::superblock::Superblock;

impl<D: BlockDevice> Pool<D> {
    /// Opens the pool the given drives belong to, recovering from an unclean stop.
    ///
    /// Refuses, with a message naming the drive: a device with no stria superblock, a drive of
    /// another pool, a drive the pool does not list (removed or replaced), a drive the pool
    /// failed (stale), the same drive twice, and a set of drives smaller than a majority of the
    /// pool. Drives the pool lists as active but that are not found are marked failed.
    pub async fn open(found: Vec<FoundDrive<D>>) -> Result<Pool<D>, EngineError> {
        Pool::open_with(found, false).await
    }

    /// Like [`Pool::open_with`], but a stale drive or a drive the pool does not list (foreign,
    /// removed, replaced, blank) is left out with a warning instead of refusing the pool; what
    /// was left out and why is in [`Pool::ignored_drives`]. Used when drives are discovered by
    /// scanning a directory, where a failed drive's file is still lying around.
    pub async fn open_skipping(found: Vec<FoundDrive<D>>, force: bool) -> Result<Pool<D>, EngineError> {
        let mut keep = Vec::new();
        let mut ignored = Vec::new();
        let mut superblocks = Vec::new();
        for fd in found {
            match read_superblock(&fd.dev).await {
                Ok(sb) => {
                    refuse_old_format(&sb, &fd.path)?;
                    superblocks.push(sb);
                    keep.push(fd);
                }
                Err(e) => ignored.push((fd.path, format!("no usable stria superblock ({e})"))),
            }
        }
        // Keep the pool most drives belong to; check each drive against its newest metadata.
        let mut counts: HashMap<Uuid, usize> = HashMap::new();
        for sb in &superblocks {
            *counts.entry(sb.pool_uuid).or_default() += 1;
        }
        let Some((&pool_uuid, _)) = counts.iter().max_by_key(|(u, n)| (**n, **u)) else {
            return Err(EngineError::NoDrives);
        };
        let mut meta: Option<PoolMeta> = None;
        for (sb, fd) in superblocks.iter().zip(&keep) {
            for m in read_metadata(&fd.dev, &sb.layout).await {
                if m.pool_uuid == pool_uuid && meta.as_ref().is_none_or(|b| m.generation > b.generation) {
                    meta = Some(m);
                }
            }
        }
        let committed = newest_committed(superblocks.iter().filter(|sb| sb.pool_uuid == pool_uuid));
        let mut records = Vec::with_capacity(keep.len());
        for (sb, fd) in superblocks.iter().zip(&keep) {
            records.push(read_flush_record(&fd.dev, sb).await);
        }
        let of_pool: Vec<&FlushRecord> = superblocks
            .iter()
            .zip(&records)
            .filter(|(sb, _)| sb.pool_uuid == pool_uuid)
            .filter_map(|(_, r)| r.as_ref())
            .collect();
        let epochs: Vec<(u64, u64)> = superblocks
            .iter()
            .zip(&records)
            .map(|(sb, r)| (r.as_ref().map_or(0, |r| r.epoch), witnessed_of(sb, &of_pool)))
            .collect();
        let mut accepted = Vec::new();
        let mut stale = Vec::new();
        for ((sb, fd), (epoch, witnessed)) in superblocks.into_iter().zip(keep).zip(epochs) {
            let reason = if sb.pool_uuid != pool_uuid {
                Some(format!("belongs to another pool ({})", sb.pool_uuid))
            } else {
                match meta.as_ref().and_then(|m| m.drives.iter().find(|r| r.uuid == sb.drive_uuid)) {
                    None => Some("not a member any more (replaced or removed)".to_string()),
                    Some(r) if r.state == DriveState::Failed => Some(format!(
                        "stale: the pool failed it ({})",
                        r.failed_reason.as_deref().unwrap_or("no reason recorded")
                    )),
                    Some(_) if sb.generation < committed => {
                        let why = stale_reason(&sb, committed);
                        stale.push((sb.drive_uuid, why.clone()));
                        Some(why)
                    }
                    Some(_) if epoch < witnessed => {
                        let why = stale_epoch_reason(&sb, epoch, witnessed);
                        stale.push((sb.drive_uuid, why.clone()));
                        Some(why)
                    }
                    Some(_) => None,
                }
            };
            match reason {
                Some(r) => {
                    tracing::warn!(path = %fd.path, reason = %r, "leaving a drive out of the pool");
                    ignored.push((fd.path, r));
                }
                None => accepted.push(fd),
            }
        }
        // Boxed: assembly's future is large, and an unoptimized build polling it inline would
        // need more stack than a runtime thread has.
        let mut pool = Box::pin(Pool::assemble(accepted, force, &stale)).await?;
        pool.ignored = ignored;
        Ok(pool)
    }

    /// Like [`Pool::open`]; with `force`, a pool missing more drives than a majority of its
    /// active ones is opened anyway (the missing drives are failed). Use it only when the
    /// missing drives are known to be gone: if one of them holds newer metadata, what it
    /// recorded (a later drive failure, a new volume) is lost.
    pub async fn open_with(found: Vec<FoundDrive<D>>, force: bool) -> Result<Pool<D>, EngineError> {
        Box::pin(Pool::assemble(found, force, &[])).await
    }

    /// [`Pool::open_with`]; the drives in `stale` (identity, why) were found stale by the caller
    /// and left out: they are failed with that reason instead of "not found".
    async fn assemble(
        found: Vec<FoundDrive<D>>,
        force: bool,
        stale: &[(Uuid, String)],
    ) -> Result<Pool<D>, EngineError> {
        if found.is_empty() {
            return Err(EngineError::NoDrives);
        }
        let candidates = read_superblocks(found).await?;
        let pool_uuid = one_pool(&candidates)?;
        let meta = newest_meta(&candidates, pool_uuid).await?;
        let committed = newest_committed(candidates.iter().map(|(sb, _)| sb));
        let mut records = Vec::with_capacity(candidates.len());
        for (sb, fd) in &candidates {
            records.push(read_flush_record(&fd.dev, sb).await);
        }
        let all: Vec<&FlushRecord> = records.iter().flatten().collect();
        let drive_epochs: Vec<(u64, u64)> = candidates
            .iter()
            .zip(&records)
            .map(|((sb, _), r)| (r.as_ref().map_or(0, |r| r.epoch), witnessed_of(sb, &all)))
            .collect();
        check_membership(&meta, &candidates, committed, &drive_epochs)?;
        let epochs = EpochBook::from_records(
            candidates.iter().zip(&records).map(|((sb, _), r)| (sb.slot, r.as_ref())),
        );
        if let Err(e) = check_quorum(&meta, &candidates) {
            if !force {
                return Err(e);
            }
            tracing::warn!(error = %e, "opening without a quorum because of --force");
        }

        // Where each drive was found this time: what `status` shows from now on (drives are
        // recognised by their superblocks, so a path is only a record of where one was seen).
        let found_at: Vec<(u32, String)> =
            candidates.iter().map(|(sb, fd)| (sb.slot, fd.path.clone())).collect();
        let (drives, findings, missing) = open_drives(candidates, &meta).await?;
        let txn_next = findings
            .iter()
            .flat_map(|(_, f)| f.journal.iter().map(|p| p.piece.txn_id).chain([f.watermarks.all]))
            .max()
            .unwrap_or(0)
            + 1;
        let core = Arc::new(PoolCore::new(meta.clone(), drives, txn_next, committed, epochs));
        // Before anything is written (recovery included): the drives that carry the out
        // generation a failed drive's record names go on marking (docs/design/delta-resync.md).
        core.adopt_out_generation(&findings.iter().map(|(slot, f)| (*slot, f.out_generation)).collect());
        // Bring lagging drives (a crash during a commit) up to date, and record the missing and
        // stale ones as failed before anything is written (a stale drive is never written to,
        // so its superblock keeps the evidence).
        for slot in missing {
            let rec = meta.drive(slot).expect("listed");
            let reason = match stale.iter().find(|(uuid, _)| *uuid == rec.uuid) {
                Some((_, why)) => why.clone(),
                None => {
                    tracing::warn!(slot, path = %rec.path_hint, "drive not found; marking it failed");
                    format!("not found when the pool was opened (last seen at {})", rec.path_hint)
                }
            };
            let witnessed = all.iter().map(|r| r.witnessed(slot)).max().unwrap_or(0);
            core.fail_missing_drive(slot, reason, witnessed).await?;
        }
        core.update(move |m| {
            for (slot, path) in found_at {
                if let Some(rec) = m.drives.iter_mut().find(|d| d.slot == slot) {
                    rec.path_hint = path;
                }
            }
            Ok(((), true))
        })
        .await?;

        let mut pool = Pool::from_core(Arc::clone(&core), Default::default());
        for rec in &meta.volumes {
            pool.install_volume(rec)?;
        }
        pool.recovery = pool.recover(findings).await?;
        // Every record found is applied and checkpointed now; a new journal epoch keeps this
        // session's records apart from anything the last one left in the rings.
        pool.core.flush_all().await?;
        for d in pool.core.drives().iter().filter(|d| !d.is_failed()) {
            if let Err(e) = d.begin_journal_session().await {
                pool.core.drive_error(d.slot(), "journal header write failed", &e).await?;
            }
        }
        pool.cut_old_segments_into_units().await?;
        Ok(pool)
    }
}

/// A drive of an older on-disk format is refused (never opened, never written).
fn refuse_old_format(sb: &Superblock, path: &str) -> Result<(), EngineError> {
    use crate::format::superblock::FORMAT_VERSION;
    if sb.format_version == FORMAT_VERSION {
        return Ok(());
    }
    Err(EngineError::OldFormat {
        path: path.to_string(),
        pool: sb.pool_name.clone(),
        found: sb.format_version,
        wants: FORMAT_VERSION,
    })
}

/// Reads the superblock of every drive found; a drive without a readable one is foreign.
async fn read_superblocks<D: BlockDevice>(
    found: Vec<FoundDrive<D>>,
) -> Result<Vec<(Superblock, FoundDrive<D>)>, EngineError> {
    let mut candidates = Vec::with_capacity(found.len());
    for fd in found {
        match read_superblock(&fd.dev).await {
            Ok(sb) => {
                refuse_old_format(&sb, &fd.path)?;
                candidates.push((sb, fd));
            }
            Err(FormatError::NotStria) => {
                return Err(EngineError::ForeignDrive {
                    path: fd.path,
                    reason: "no stria superblock: it is not part of any pool".into(),
                });
            }
            Err(e) => {
                return Err(EngineError::ForeignDrive {
                    path: fd.path,
                    reason: format!("unreadable superblock: {e}"),
                });
            }
        }
    }
    Ok(candidates)
}

/// The pool most of the drives belong to. Any drive of another pool, and any drive given twice,
/// is refused.
fn one_pool<D: BlockDevice>(candidates: &[(Superblock, FoundDrive<D>)]) -> Result<Uuid, EngineError> {
    let mut by_pool: HashMap<Uuid, usize> = HashMap::new();
    for (sb, _) in candidates {
        *by_pool.entry(sb.pool_uuid).or_default() += 1;
    }
    let pool_uuid = *by_pool.iter().max_by_key(|(u, n)| (**n, **u)).expect("non-empty").0;
    if let Some((sb, fd)) = candidates.iter().find(|(sb, _)| sb.pool_uuid != pool_uuid) {
        return Err(EngineError::ForeignDrive {
            path: fd.path.clone(),
            reason: format!(
                "belongs to pool `{}` ({}), not to pool `{}` ({pool_uuid})",
                sb.pool_name,
                sb.pool_uuid,
                candidates.iter().find(|c| c.0.pool_uuid == pool_uuid).expect("exists").0.pool_name
            ),
        });
    }
    let mut seen: HashMap<Uuid, String> = HashMap::new();
    for (sb, fd) in candidates {
        if let Some(first) = seen.insert(sb.drive_uuid, fd.path.clone()) {
            return Err(EngineError::DuplicateDrive {
                uuid: sb.drive_uuid.to_string(),
                first,
                second: fd.path.clone(),
            });
        }
    }
    Ok(pool_uuid)
}

/// The newest metadata of pool `pool_uuid` any drive holds.
async fn newest_meta<D: BlockDevice>(
    candidates: &[(Superblock, FoundDrive<D>)],
    pool_uuid: Uuid,
) -> Result<PoolMeta, EngineError> {
    let mut meta: Option<PoolMeta> = None;
    for (sb, fd) in candidates {
        for m in read_metadata(&fd.dev, &sb.layout).await {
            if m.pool_uuid == pool_uuid && meta.as_ref().is_none_or(|b| m.generation > b.generation) {
                meta = Some(m);
            }
        }
    }
    meta.ok_or_else(|| {
        EngineError::Format(FormatError::BadPayload("no drive holds valid pool metadata".into()))
    })
}

/// Opens the drives found and stands in for the missing ones: every drive of `meta` by slot,
/// what opening found on each present one, and the active drives missing.
async fn open_drives<D: BlockDevice>(
    candidates: Vec<(Superblock, FoundDrive<D>)>,
    meta: &PoolMeta,
) -> Result<(Vec<Arc<Drive<D>>>, Vec<(u32, OpenFindings)>, Vec<u32>), EngineError> {
    let template = candidates[0].0.clone();
    let mut drives: Vec<Arc<Drive<D>>> = Vec::new();
    let mut findings: Vec<(u32, OpenFindings)> = Vec::new();
    let mut present: Vec<u32> = Vec::new();
    for (sb, fd) in candidates {
        let slot = sb.slot;
        let (drive, f) = Drive::open(fd.dev, sb).await?;
        if meta.drive(slot).is_some_and(|r| r.state == DriveState::Failed) {
            unreachable!("stale drives are refused above");
        }
        present.push(slot);
        findings.push((slot, f));
        drives.push(Arc::new(drive));
    }
    let mut missing = Vec::new();
    for rec in &meta.drives {
        if !present.contains(&rec.slot) {
            let mut sb = template.clone();
            sb.slot = rec.slot;
            sb.drive_uuid = rec.uuid;
            sb.class = rec.class;
            sb.domain = rec.domain.clone();
            drives.push(Arc::new(Drive::missing(sb)));
            if rec.state == DriveState::Active {
                missing.push(rec.slot);
            }
        }
    }
    drives.sort_by_key(|d| d.slot());
    Ok((drives, findings, missing))
}

/// The newest generation known to have reached every drive in use (see
/// [`Superblock::committed_generation`]), over the superblocks of one pool's drives.
fn newest_committed<'a>(superblocks: impl Iterator<Item = &'a Superblock>) -> u64 {
    superblocks.map(|sb| sb.committed_generation).max().unwrap_or(0)
}

/// What the records of the other drives witnessed of the drive `sb` describes: the highest
/// flush epoch of it they saw confirmed (docs/design/stale-copies.md).
fn witnessed_of(sb: &Superblock, records: &[&FlushRecord]) -> u64 {
    records.iter().filter(|r| r.drive_uuid != sb.drive_uuid).map(|r| r.witnessed(sb.slot)).max().unwrap_or(0)
}

/// Why a drive whose flush epoch is older than what the other drives witnessed of it is not
/// trusted.
fn stale_epoch_reason(sb: &Superblock, epoch: u64, witnessed: u64) -> String {
    format!(
        "stale: it took part in flushes up to its epoch {epoch} but the other drives saw its epoch {witnessed} \
         reach it after that, so this is an old copy of the drive (copied while the pool was in use and put \
         back, or restored from a backup) and its data is out of date; it is not used. Rebuild it from the \
         other drives with `stria drive replace {} PATH` (PATH may be this same drive or file)",
        sb.slot
    )
}

/// Why a drive whose superblock is older than `committed` is not trusted.
fn stale_reason(sb: &Superblock, committed: u64) -> String {
    format!(
        "stale: it holds metadata generation {} but generation {committed} reached every drive in use \
         after it was written, so this is an old copy (restored from a backup, or put back after the pool \
         went on without it) and its data is out of date; it is not used. Rebuild it from the other \
         drives with `stria drive replace {} PATH` (PATH may be this same drive or file)",
        sb.generation, sb.slot
    )
}

/// Every drive found must be an active (or spare) member the metadata lists with its identity,
/// and not an old copy of one (its generation behind `committed`, or its flush epoch behind the
/// pool's confirmed one).
fn check_membership<D>(
    meta: &PoolMeta,
    candidates: &[(Superblock, FoundDrive<D>)],
    committed: u64,
    drive_epochs: &[(u64, u64)],
) -> Result<(), EngineError> {
    for ((sb, fd), &(epoch, witnessed)) in candidates.iter().zip(drive_epochs) {
        let Some(rec) = meta.drives.iter().find(|r| r.uuid == sb.drive_uuid) else {
            return Err(EngineError::ForeignDrive {
                path: fd.path.clone(),
                reason: format!(
                    "drive {} (slot {}) is not a member of pool `{}` any more (it was replaced or removed); \
                     reformat it to reuse it",
                    sb.drive_uuid, sb.slot, meta.name
                ),
            });
        };
        if rec.slot != sb.slot {
            return Err(EngineError::ForeignDrive {
                path: fd.path.clone(),
                reason: format!(
                    "superblock says slot {} but the pool has this drive in slot {}",
                    sb.slot, rec.slot
                ),
            });
        }
        if rec.state == DriveState::Failed {
            return Err(EngineError::StaleDrive {
                path: fd.path.clone(),
                slot: sb.slot,
                drive_generation: sb.generation,
                pool_generation: meta.generation,
                reason: format!(
                    "the pool failed it ({}) and went on without it; replace it with `stria drive replace {}`",
                    rec.failed_reason.as_deref().unwrap_or("no reason recorded"),
                    sb.slot
                ),
            });
        }
        if sb.generation < committed {
            return Err(EngineError::StaleDrive {
                path: fd.path.clone(),
                slot: sb.slot,
                drive_generation: sb.generation,
                pool_generation: meta.generation,
                reason: stale_reason(sb, committed),
            });
        }
        if epoch < witnessed {
            return Err(EngineError::StaleDrive {
                path: fd.path.clone(),
                slot: sb.slot,
                drive_generation: sb.generation,
                pool_generation: meta.generation,
                reason: stale_epoch_reason(sb, epoch, witnessed),
            });
        }
    }
    Ok(())
}

/// A majority of the drives active in the newest metadata found must be present. Every commit
/// reaches a majority of the drives active in it, so a later commit than the newest one found
/// would have to be on a present drive: the metadata read is the newest there is.
fn check_quorum<D>(meta: &PoolMeta, candidates: &[(Superblock, FoundDrive<D>)]) -> Result<(), EngineError> {
    let active: Vec<_> = meta.drives.iter().filter(|r| r.state != DriveState::Failed).collect();
    let total = active.len();
    let needed = total / 2 + 1;
    let present = active.iter().filter(|r| candidates.iter().any(|(sb, _)| sb.drive_uuid == r.uuid)).count();
    if present < needed {
        let missing: Vec<String> = active
            .iter()
            .filter(|r| !candidates.iter().any(|(sb, _)| sb.drive_uuid == r.uuid))
            .map(|r| {
                format!(
                    "slot {} ({})",
                    r.slot,
                    if r.path_hint.is_empty() { "unknown path" } else { &r.path_hint }
                )
            })
            .collect();
        return Err(EngineError::NoQuorum { present, total, needed, missing: missing.join(", ") });
    }
    Ok(())
}
