//! The guarded drive workflows: fail a drive (refused when it holds the last in-sync copy of
//! some data), replace it or bring a failed one back (refused when a volume on it has nothing to
//! rebuild from), and remove one (drained first when it holds data).
//!
//! Each guard returns a [`Refusal`] inside [`EngineError::Refused`] (kind `Conflict`) that says
//! what would be lost; `force` goes ahead anyway and logs the refusal as a warning. The caller
//! says how to force it (the `stria` binary adds its `--force` hint to the message) and finds the
//! devices: a replacement or a drive brought back is opened by the caller between the guard
//! ([`Replacement::check`], [`Online::check`]) and the change ([`Replacement::run`],
//! [`Online::run`]), so a refused workflow opens and creates nothing.

use stria_dev::BlockDevice;

use crate::error::EngineError;
use crate::format::meta::{DriveRecord, DriveState, Layout};
use crate::pool::{Comeback, NewDrive, Pool, RebalanceReport};
use crate::volume::VolumeState;

/// Which workflow would take a drive out of service (the last-copy guard names it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriveAction {
    /// `drive fail`.
    Fail,
    /// `drive replace` of an active drive (it is failed first).
    Replace,
}

impl DriveAction {
    fn doing(self) -> &'static str {
        match self {
            DriveAction::Fail => "failing it",
            DriveAction::Replace => "replacing it",
        }
    }
}

/// What a guarded drive workflow refused to do, and why. Its kind is
/// [`crate::ErrorKind::Conflict`] (through [`EngineError::Refused`]): the request conflicts with
/// the state of the pool, and the same request with `force` goes ahead.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refusal {
    /// `fail` of a drive that is failed already.
    AlreadyFailed { slot: u32 },
    /// `online` of a drive that is not failed.
    NotFailed { slot: u32, state: DriveState },
    /// Taking the drive out of service would make `volumes` unreadable: it holds the last in-sync
    /// copy (or the last parity) of some of their data.
    LastCopy { slot: u32, action: DriveAction, volumes: Vec<String> },
    /// Volumes on the drive have nothing to rebuild it from: `raid0` ones have no copy or parity
    /// of their part at all, `other` ones lost more members than their copies or parity cover.
    NoRebuildSource { slot: u32, raid0: Vec<String>, other: Vec<String> },
    /// A drive being removed still holds data after the moves ran (`why`: what stopped them).
    NotDrained { slot: u32, why: String },
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::AlreadyFailed { slot } => write!(f, "drive {slot} is failed already"),
            Refusal::NotFailed { slot, state } => write!(
                f,
                "drive {slot} is {}, not failed; there is nothing to bring back",
                format!("{state:?}").to_lowercase()
            ),
            Refusal::LastCopy { slot, action, volumes } => write!(
                f,
                "drive {slot} holds the last in-sync copy of data of volume(s) {}: {} would make them \
                 unreadable",
                volumes.join(", "),
                action.doing()
            ),
            Refusal::NoRebuildSource { slot, raid0, other } => {
                let mut why = Vec::new();
                if !raid0.is_empty() {
                    why.push(format!(
                        "volume(s) {} are raid0: there is no copy or parity of their part",
                        raid0.join(", ")
                    ));
                }
                if !other.is_empty() {
                    why.push(format!(
                        "volume(s) {} have lost more members than their copies or parity cover",
                        other.join(", ")
                    ));
                }
                write!(
                    f,
                    "nothing to rebuild drive {slot} from: {}. A drive brought back or replaced is rebuilt \
                     from the other drives (stria does not take back a failed drive's old contents where it \
                     cannot know what the drive missed while it was out), so their data on it would be \
                     lost. Those volumes stay failed until deleted, and their data on drive {slot} is left \
                     as it is for as long as the device is not reused",
                    why.join("; ")
                )
            }
            Refusal::NotDrained { slot, why } => {
                write!(f, "drive {slot} is draining but could not be emptied yet: {why}")
            }
        }
    }
}

impl std::error::Error for Refusal {}

/// `Err(refusal)` unless `force` (then the refusal is logged as a warning and the workflow goes on).
fn refuse_unless(force: bool, refusal: Refusal) -> Result<(), EngineError> {
    if force {
        tracing::warn!("going ahead because it was forced: {refusal}");
        return Ok(());
    }
    Err(EngineError::Refused(refusal))
}

/// The last-copy guard: refuses to take drive `slot` out of service when it holds the last
/// in-sync copy of data of a volume that is not failed already.
fn check_not_last_copy<D: BlockDevice>(
    pool: &Pool<D>,
    slot: u32,
    action: DriveAction,
    force: bool,
) -> Result<(), EngineError> {
    let volumes: Vec<String> = pool
        .volumes_lost_without(slot)
        .into_iter()
        .filter(|(_, now)| *now != VolumeState::Failed)
        .map(|(name, _)| name)
        .collect();
    if volumes.is_empty() {
        return Ok(());
    }
    refuse_unless(force, Refusal::LastCopy { slot, action, volumes })
}

/// The rebuild-source guard: refuses to rebuild onto drive `slot` (replace, online) when a volume
/// on it has nothing to rebuild from. Both rebuild the drive from the others: a replacement in
/// full, a drive brought back in full or (docs/design/delta-resync.md) only where it missed
/// writes, which for a volume that lost more than it tolerates still needs a source. So bringing
/// a failed drive back never gives a rebuild a source; for a raid0 volume (a member on it failed
/// by force, its bytes still on the device) nothing inside the pool can bring that data back.
fn check_rebuild_source<D: BlockDevice>(pool: &Pool<D>, slot: u32, force: bool) -> Result<(), EngineError> {
    let lost: Vec<String> = pool.volumes_lost_without(slot).into_iter().map(|(name, _)| name).collect();
    if lost.is_empty() {
        return Ok(());
    }
    let meta = pool.meta();
    let (raid0, other): (Vec<String>, Vec<String>) = lost
        .into_iter()
        .partition(|n| meta.volume(n).is_some_and(|v| matches!(v.layout, Layout::Raid0 { .. })));
    refuse_unless(force, Refusal::NoRebuildSource { slot, raid0, other })
}

/// Fails drive `slot` by hand, recording `reason`: refused when it is failed already, or (unless
/// `force`) when it holds the last in-sync copy of some data.
pub async fn fail_drive<D: BlockDevice>(
    pool: &Pool<D>,
    slot: u32,
    force: bool,
    reason: &str,
) -> Result<(), EngineError> {
    if pool.meta().drive(slot).is_some_and(|d| d.state == DriveState::Failed) {
        return Err(EngineError::Refused(Refusal::AlreadyFailed { slot }));
    }
    check_not_last_copy(pool, slot, DriveAction::Fail, force)?;
    pool.fail_drive(slot, reason).await
}

/// A replacement of a drive that the guards allowed: the caller opens or creates the new device,
/// then [`Replacement::run`] formats it and makes it take the old drive's place (a rebuild is
/// then pending: [`Pool::rebuild`], or the maintenance services).
#[derive(Debug)]
#[must_use = "the replacement is only checked; `run` makes it"]
pub struct Replacement {
    slot: u32,
}

impl Replacement {
    /// Checks the replacement of drive `slot`: when it is active, the last-copy guard (it is
    /// failed first); in every case the rebuild-source guard. `force` overrides both.
    pub fn check<D: BlockDevice>(pool: &Pool<D>, slot: u32, force: bool) -> Result<Replacement, EngineError> {
        if pool.meta().drive(slot).is_some_and(|d| d.state == DriveState::Active) {
            check_not_last_copy(pool, slot, DriveAction::Replace, force)?;
        }
        check_rebuild_source(pool, slot, force)?;
        Ok(Replacement { slot })
    }

    /// The drive being replaced.
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// Replaces the drive by `new`; returns the new drive's slot.
    pub async fn run<D: BlockDevice>(self, pool: &Pool<D>, new: NewDrive<D>) -> Result<u32, EngineError> {
        pool.replace_drive(self.slot, new).await
    }
}

/// Bringing a failed drive back that the guards allowed: the caller opens its device where it
/// was last seen ([`Online::record`]'s `path_hint`), then [`Online::run`] takes it back: in its
/// own slot with a delta resync of what it missed when the pool kept that and the device is the
/// very drive, no older than when it went out; otherwise as a new drive, rebuilt in full
/// (docs/design/delta-resync.md).
#[derive(Debug)]
#[must_use = "bringing the drive back is only checked; `run` does it"]
pub struct Online {
    record: DriveRecord,
}

impl Online {
    /// Checks that drive `slot` can come back: it must be failed, and (unless `force`) every
    /// volume on it must have something to rebuild it from.
    pub fn check<D: BlockDevice>(pool: &Pool<D>, slot: u32, force: bool) -> Result<Online, EngineError> {
        let record = pool
            .meta()
            .drive(slot)
            .cloned()
            .ok_or_else(|| EngineError::NoSuchDrive(format!("slot {slot}")))?;
        if record.state != DriveState::Failed {
            return Err(EngineError::Refused(Refusal::NotFailed { slot, state: record.state }));
        }
        check_rebuild_source(pool, slot, force)?;
        Ok(Online { record })
    }

    /// The failed drive as the pool remembers it (where it was last seen, its class).
    pub fn record(&self) -> &DriveRecord {
        &self.record
    }

    /// Takes the drive back on `dev` (its device, opened again).
    pub async fn run<D: BlockDevice>(self, pool: &Pool<D>, dev: D) -> Result<Comeback, EngineError> {
        let rec = self.record;
        let comeback = pool.online_drive(rec.slot, dev, &rec.path_hint).await?;
        tracing::info!(slot = rec.slot, path = %rec.path_hint, ?comeback, "drive back online");
        Ok(comeback)
    }
}

/// What [`start_remove`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    /// The drive holds data: it is draining. The moves (a rebalance) empty it; once empty it is
    /// [`take_out`]'s (the maintenance services do both).
    Draining,
    /// The drive holds nothing: [`take_out`] can take it out now.
    Empty,
}

/// Starts removing drive `slot`: when a volume has a member (or a move) on it, it is drained (no
/// new extent goes to it, the rebalance moves its members to the other drives of its class;
/// refused, naming the volume, when those cannot take them) and, with a rate, a rebalance at that
/// rate is asked for.
pub async fn start_remove<D: BlockDevice>(
    pool: &Pool<D>,
    slot: u32,
    rate_bytes_per_sec: u64,
) -> Result<Removal, EngineError> {
    let holds = pool.meta().volumes.iter().flat_map(|v| &v.segments).flat_map(|s| &s.members).any(|m| {
        m.slot == slot
            || m.move_to.is_some_and(|e| e.slot == slot)
            || m.moved_from.is_some_and(|e| e.slot == slot)
    });
    if !holds {
        return Ok(Removal::Empty);
    }
    pool.drain_drive(slot).await?;
    if rate_bytes_per_sec > 0 {
        pool.request_rebalance(rate_bytes_per_sec).await?;
    }
    Ok(Removal::Draining)
}

/// After the moves of a removal ran in the caller (`report` is theirs): refused when drive
/// `slot` is not empty yet.
pub fn check_drained<D: BlockDevice>(
    pool: &Pool<D>,
    slot: u32,
    report: &RebalanceReport,
) -> Result<(), EngineError> {
    if pool.drained().contains(&slot) {
        return Ok(());
    }
    let why = report.stuck.clone().unwrap_or_else(|| "moves were abandoned".into());
    Err(EngineError::Refused(Refusal::NotDrained { slot, why }))
}

/// Takes drive `slot`, which must hold nothing, out of the pool's metadata; returns the path it
/// was last seen at (for the caller to forget it: the `stria` binary's pool directory lists it).
pub async fn take_out<D: BlockDevice>(pool: &Pool<D>, slot: u32) -> Result<String, EngineError> {
    let path = pool.meta().drive(slot).map(|d| d.path_hint.clone()).unwrap_or_default();
    pool.remove_empty_drive(slot).await?;
    Ok(path)
}
