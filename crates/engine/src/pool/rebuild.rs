//! Drive replacement and rebuild: reconstruct every extent of a failed drive onto a new one,
//! row by row, while I/O continues. Progress is persisted, so a restart resumes.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use stria_dev::BlockDevice;
use uuid::Uuid;

use super::{NewDrive, Pool, alloc, now_unix_secs};
use crate::drive::Drive;
use crate::error::EngineError;
use crate::format::layout::DriveLayout;
use crate::format::meta::{DriveErrors, DriveRecord, DriveState, PoolMeta};
use crate::format::superblock::Superblock;
use crate::volume::Volume;
use crate::volume::map::NOT_REBUILDING;

/// How often rebuild progress is made durable.
const PERSIST_INTERVAL: Duration = Duration::from_secs(2);

/// Progress of the rebuild of one volume.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RebuildProgress {
    pub volume: String,
    pub rows_done: u64,
    pub rows_total: u64,
}

impl<D: BlockDevice> Pool<D> {
    /// Replaces the drive in `old_slot` by `new` (formatted now). Every extent on the old drive
    /// gets an extent on the new one, rebuilt by [`Pool::rebuild`]. An active old drive is failed
    /// first. Returns the new drive's slot.
    pub async fn replace_drive(&self, old_slot: u32, new: NewDrive<D>) -> Result<u32, EngineError> {
        let meta = self.core.meta();
        let old =
            meta.drive(old_slot).ok_or_else(|| EngineError::NoSuchDrive(format!("slot {old_slot}")))?.clone();
        if new.class != old.class {
            return Err(EngineError::Invalid(format!(
                "drive {old_slot} is a {} drive; its replacement must be {} too (got {})",
                old.class, old.class, new.class
            )));
        }
        // An active drive whose members are still being rebuilt is refused; a failed one is
        // not (it failed during its own resync: its members move to the new drive, which is
        // rebuilt from row 0 like any replacement, and nothing else could ever finish them).
        if old.state != DriveState::Failed
            && self.volumes().iter().any(|v| {
                v.current_map()
                    .segments
                    .iter()
                    .any(|s| s.members.iter().any(|m| m.rebuilding() && m.drive.slot() == old_slot))
            })
        {
            return Err(EngineError::Busy(format!(
                "drive {old_slot} is itself being rebuilt; wait for that to finish"
            )));
        }
        let domain = if new.domain.is_empty() { old.domain.clone() } else { new.domain.clone() };
        let slot = meta.next_slot;
        let (sb, record) = joining(&meta, &new, slot, domain)?;
        // Check the extents fit before touching anything.
        let mut probe = (*meta).clone();
        probe.drives.push(record.clone());
        move_extents(&mut probe, old_slot, slot)?;

        // A move in progress is taken back (the rebalance plans again after the rebuild).
        self.drop_shadow();
        if old.state == DriveState::Active {
            self.core.fail_drive(old_slot, "replaced".into()).await?;
        }
        let drive = Arc::new(Drive::format(new.dev, sb, new.fresh).await?);
        self.core.add_drive(drive).await?;
        self.core
            .update(move |m| {
                m.drives.push(record);
                m.next_slot = m.next_slot.max(slot + 1);
                move_extents(m, old_slot, slot)?;
                m.drives.retain(|d| d.slot != old_slot);
                Ok(((), true))
            })
            .await?;
        // Every move was taken back in that commit.
        self.release_cursor_pins();
        self.core.remove_drive(old_slot);
        self.core.close_out_generation_if_done();
        for v in self.volumes() {
            self.refresh_volume(v.name())?;
        }
        tracing::info!(old_slot, new_slot = slot, "drive replaced; rebuild pending");
        Ok(slot)
    }

    /// Adds `new` (formatted now) to the pool as an active drive of its class; new extents may
    /// use it at once, existing ones stay where they are (docs/design/pool-growth.md). Returns
    /// its slot.
    pub async fn add_drive(&self, new: NewDrive<D>) -> Result<u32, EngineError> {
        let meta = self.core.meta();
        let slot = meta.next_slot;
        let (sb, record) = joining(&meta, &new, slot, new.domain.clone())?;
        let drive = Arc::new(Drive::format(new.dev, sb, new.fresh).await?);
        self.core.add_drive(drive).await?;
        let added = self
            .core
            .update(move |m| {
                if m.drive(slot).is_some() {
                    return Err(EngineError::Busy(format!(
                        "slot {slot} was taken meanwhile; add the drive again"
                    )));
                }
                m.drives.push(record);
                m.next_slot = m.next_slot.max(slot + 1);
                Ok(((), true))
            })
            .await;
        if added.is_err() {
            self.core.remove_drive(slot);
        }
        added?;
        tracing::info!(slot, "drive added");
        Ok(slot)
    }

    /// Takes the drive in `slot` out of the pool's metadata, if no volume has a member on it (a
    /// drive just added, or one whose extents were all freed). Moving extents off a drive is not
    /// built (docs/design/pool-growth.md): a drive that holds any is refused, naming the volumes.
    pub async fn remove_empty_drive(&self, slot: u32) -> Result<(), EngineError> {
        let meta = self.core.meta();
        meta.drive(slot).ok_or_else(|| EngineError::NoSuchDrive(format!("slot {slot}")))?;
        let holders = |m: &PoolMeta| -> Vec<String> {
            let on = |e: Option<crate::format::meta::ExtentRecord>| e.is_some_and(|e| e.slot == slot);
            m.volumes
                .iter()
                .filter(|v| {
                    v.segments
                        .iter()
                        .flat_map(|s| &s.members)
                        .any(|mem| mem.slot == slot || on(mem.move_to) || on(mem.moved_from))
                })
                .map(|v| v.name.clone())
                .collect()
        };
        let used = holders(&meta);
        if !used.is_empty() {
            return Err(EngineError::Busy(format!(
                "drive {slot} holds members of {}; moving them to other drives is not built yet: delete \
                 those volumes first, or fail and replace the drive",
                used.join(", ")
            )));
        }
        self.core
            .update(move |m| {
                let used = holders(m);
                if !used.is_empty() {
                    return Err(EngineError::Busy(format!(
                        "drive {slot} took members of {} meanwhile",
                        used.join(", ")
                    )));
                }
                m.drives.retain(|d| d.slot != slot);
                Ok(((), true))
            })
            .await?;
        self.core.remove_drive(slot);
        tracing::info!(slot, "drive removed");
        Ok(())
    }

    /// Sets the rebuild bandwidth limit (bytes per second of rebuilt data; 0 = unlimited) for as
    /// long as the pool is open; the stored one ([`Pool::store_rebuild_rate`]) applies at the next
    /// open.
    pub fn set_rebuild_rate(&self, bytes_per_sec: u64) {
        self.rebuild_rate_bytes.store(bytes_per_sec, Ordering::Relaxed);
    }

    /// Sets the rebuild bandwidth limit and keeps it in the pool metadata (one commit), so that
    /// every later open starts with it.
    pub async fn store_rebuild_rate(&self, bytes_per_sec: u64) -> Result<(), EngineError> {
        self.core
            .update(move |m| {
                m.rebuild_rate_bytes_per_sec = Some(bytes_per_sec).filter(|&r| r > 0);
                Ok(((), true))
            })
            .await?;
        self.set_rebuild_rate(bytes_per_sec);
        Ok(())
    }

    /// The rebuild bandwidth limit in force (bytes per second; 0 = unlimited).
    pub fn rebuild_rate(&self) -> u64 {
        self.rebuild_rate_bytes.load(Ordering::Relaxed)
    }

    /// Progress of every volume with members being rebuilt.
    pub fn rebuild_progress(&self) -> Vec<RebuildProgress> {
        self.volumes().iter().filter_map(|v| volume_progress(v)).collect()
    }

    /// Runs every pending rebuild to completion, calling `report` as rows complete. Client I/O
    /// continues meanwhile; stopping early (dropping the future) loses at most the progress since
    /// the last persisted cursor.
    pub async fn rebuild(&self, mut report: impl FnMut(&RebuildProgress)) -> Result<(), EngineError> {
        for vol in self.volumes() {
            if volume_progress(&vol).is_none() {
                continue;
            }
            if vol.state() == crate::VolumeState::Failed {
                // More members are gone than the layout tolerates: there is nothing to rebuild
                // from. The volume stays failed (its lost data is not replaced by zeros).
                tracing::warn!(
                    volume = vol.name(),
                    "volume is failed; its replacement members cannot be rebuilt"
                );
                continue;
            }
            self.rebuild_volume(&vol, &mut report).await?;
        }
        Ok(())
    }

    /// True when some volume has members waiting to be rebuilt and enough members to do it.
    pub fn rebuild_pending(&self) -> bool {
        self.volumes().iter().any(|v| volume_progress(v).is_some() && v.state() != crate::VolumeState::Failed)
    }

    async fn rebuild_volume(
        &self,
        vol: &Arc<Volume<D>>,
        report: &mut impl FnMut(&RebuildProgress),
    ) -> Result<(), EngineError> {
        let started = Instant::now();
        let mut rebuilt_bytes = 0u64;
        let mut last_persist = Instant::now();
        // A drive replaced while this runs installs a new map with a new member to rebuild: the
        // pass runs again on the map in force until the map no longer changes under it.
        let mut map = vol.current_map();
        loop {
            for (si, seg) in map.segments.iter().enumerate() {
                for (mi, member) in seg.members.iter().enumerate() {
                    if !member.rebuilding() || member.drive.is_failed() {
                        continue;
                    }
                    let mut row = member.rebuild_cursor.load(Ordering::Acquire);
                    // A drive back from an outage copies only what it missed (delta-resync.md).
                    let delta = self.delta_of(member.drive.slot());
                    while row < seg.rows {
                        let Some(_op) = self.core.ops.enter() else { return Ok(()) };
                        if vol.is_closed() {
                            return Ok(());
                        }
                        if let Some(delta) = &delta
                            && vol.skip_unchanged_row(&map, si, mi, row, delta.generation, &delta.own).await
                        {
                            row += 1;
                            self.count_rebuilt(vol.chunk_bytes(), false);
                            continue;
                        }
                        let turn = self
                            .background_turn(crate::qos::REBUILD_FLOW, vol, crate::qos::OpKind::Rebuild)
                            .await;
                        vol.rebuild_row(&map, si, mi, row).await?;
                        drop(turn);
                        row += 1;
                        self.count_rebuilt(vol.chunk_bytes(), true);
                        rebuilt_bytes += vol.chunk_bytes();
                        if last_persist.elapsed() >= PERSIST_INTERVAL {
                            self.persist_cursors(vol).await?;
                            last_persist = Instant::now();
                        }
                        if let Some(p) = volume_progress(vol) {
                            report(&p);
                        }
                        let rate = self.rebuild_rate_bytes.load(Ordering::Relaxed);
                        if rate > 0 {
                            let due = Duration::from_secs_f64(rebuilt_bytes as f64 / rate as f64);
                            if let Some(wait) = due.checked_sub(started.elapsed()) {
                                tokio::time::sleep(wait).await;
                            }
                        }
                    }
                    // Done with this member: it is an ordinary member from now on.
                    member.rebuild_cursor.store(NOT_REBUILDING, Ordering::Release);
                }
            }
            let now = vol.current_map();
            if Arc::ptr_eq(&now, &map) {
                break;
            }
            map = now;
        }
        let Some(_op) = self.core.ops.enter() else { return Ok(()) };
        self.persist_cursors(vol).await?;
        tracing::info!(volume = vol.name(), "rebuild complete");
        Ok(())
    }

    /// Makes the rebuilt rows durable, then records the cursors in the metadata.
    async fn persist_cursors(&self, vol: &Arc<Volume<D>>) -> Result<(), EngineError> {
        self.core.flush_all().await?;
        let map = vol.current_map();
        let cursors: Vec<Vec<Option<u64>>> = map
            .segments
            .iter()
            .map(|s| {
                s.members
                    .iter()
                    .map(|m| match m.rebuild_cursor.load(Ordering::Acquire) {
                        NOT_REBUILDING => None,
                        c => Some(c),
                    })
                    .collect()
            })
            .collect();
        let name = vol.name().to_string();
        let committed = cursors.clone();
        self.core
            .update(move |m| {
                let rec =
                    m.volumes.iter_mut().find(|v| v.name == name).ok_or(EngineError::NoSuchVolume(name))?;
                let mut changed = false;
                for (seg, cs) in rec.segments.iter_mut().zip(&cursors) {
                    for (mem, c) in seg.members.iter_mut().zip(cs) {
                        if mem.rebuild_cursor_rows != *c {
                            mem.rebuild_cursor_rows = *c;
                            changed = true;
                        }
                    }
                }
                // A drive back from an outage whose members are all resynchronised is no
                // longer out (its cursors and this go in one commit).
                let resyncing: Vec<u32> = m
                    .volumes
                    .iter()
                    .flat_map(|v| &v.segments)
                    .flat_map(|s| &s.members)
                    .filter(|mem| mem.rebuild_cursor_rows.is_some())
                    .map(|mem| mem.slot)
                    .collect();
                for d in m.drives.iter_mut() {
                    if d.state == DriveState::Active && d.out.is_some() && !resyncing.contains(&d.slot) {
                        d.out = None;
                        changed = true;
                    }
                }
                Ok(((), changed))
            })
            .await?;
        self.core.close_out_generation_if_done();
        // Committed: rows below these cursors are now trusted after a crash too.
        for (seg, cs) in map.segments.iter().zip(&committed) {
            for (member, c) in seg.members.iter().zip(cs) {
                member.rebuild_cursor_durable.store(c.unwrap_or(NOT_REBUILDING), Ordering::Release);
            }
        }
        Ok(())
    }
}

/// The superblock and the metadata record of `new` joining the pool of `meta` in `slot`.
fn joining<D: BlockDevice>(
    meta: &PoolMeta,
    new: &NewDrive<D>,
    slot: u32,
    domain: String,
) -> Result<(Superblock, DriveRecord), EngineError> {
    let layout = DriveLayout::for_new_drive(new.dev.size_bytes())
        .map_err(|e| EngineError::Invalid(format!("{}: {e}", new.path)))?;
    let sb = Superblock {
        pool_uuid: meta.pool_uuid,
        drive_uuid: Uuid::new_v4(),
        slot,
        class: new.class,
        generation: meta.generation,
        layout,
        created_unix_secs: now_unix_secs(),
        domain: domain.clone(),
        pool_name: meta.name.clone(),
        committed_generation: 0,
        format_version: crate::format::superblock::FORMAT_VERSION,
    };
    let record = DriveRecord {
        slot,
        uuid: sb.drive_uuid,
        class: new.class,
        domain,
        state: DriveState::Active,
        failed_reason: None,
        path_hint: new.path.clone(),
        data_blocks: layout.data_blocks(),
        errors: DriveErrors::default(),
        draining: false,
        out: None,
    };
    Ok((sb, record))
}

/// Points every extent on `old_slot` at a new extent on `new_slot`, to be rebuilt.
fn move_extents(
    m: &mut crate::format::meta::PoolMeta,
    old_slot: u32,
    new_slot: u32,
) -> Result<(), EngineError> {
    let data_blocks = m.drive(new_slot).map(|d| d.data_blocks).unwrap_or(0);
    for mem in m.volumes.iter_mut().flat_map(|v| &mut v.segments).flat_map(|s| &mut s.members) {
        mem.take_move();
        if mem.moved_from.is_some_and(|e| e.slot == old_slot) {
            mem.moved_from = None;
        }
    }
    for vi in 0..m.volumes.len() {
        for si in 0..m.volumes[vi].segments.len() {
            for mi in 0..m.volumes[vi].segments[si].members.len() {
                if m.volumes[vi].segments[si].members[mi].slot != old_slot {
                    continue;
                }
                let blocks = m.volumes[vi].segments[si].rows * u64::from(m.volumes[vi].chunk_blocks);
                let start = alloc::first_fit(m, new_slot, data_blocks, blocks).ok_or_else(|| {
                    EngineError::NoSpace(format!(
                        "the replacement drive is too small: volume {} needs {} blocks on it",
                        m.volumes[vi].name, blocks
                    ))
                })?;
                let member = &mut m.volumes[vi].segments[si].members[mi];
                member.slot = new_slot;
                member.start_block = start;
                member.rebuild_cursor_rows = Some(0);
            }
        }
    }
    Ok(())
}

fn volume_progress<D: BlockDevice>(vol: &Volume<D>) -> Option<RebuildProgress> {
    let map = vol.current_map();
    let mut done = 0;
    let mut total = 0;
    for seg in &map.segments {
        for m in seg.members.iter().filter(|m| m.rebuilding()) {
            total += seg.rows;
            done += m.rebuild_cursor.load(Ordering::Acquire).min(seg.rows);
        }
    }
    (total > 0).then(|| RebuildProgress {
        volume: vol.name().to_string(),
        rows_done: done,
        rows_total: total,
    })
}
