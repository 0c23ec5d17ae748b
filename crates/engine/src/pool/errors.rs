//! Per-drive error counters that survive restarts (format §3, `DriveRecord::errors`).
//!
//! Drives count read errors, write errors and repaired blocks in memory as they happen
//! (drive/errors.rs). The pool moves those deltas into the metadata with an ordinary commit,
//! at most one per call for all drives together: from [`Pool::tick`] (the daemon calls it every
//! 2 s), at the end of a scrub and in [`Pool::close`]. So an error storm costs one metadata
//! commit per tick, not one per error. A delta is subtracted from the drive only once the
//! commit that carries it succeeded; a failed commit leaves it pending for the next try.

use std::sync::Arc;

use stria_dev::BlockDevice;

use super::Pool;
use super::core::PoolCore;
use crate::drive::Drive;
use crate::error::EngineError;
use crate::format::meta::{DriveErrors, PoolMeta};

impl<D: BlockDevice> PoolCore<D> {
    /// Commits the error events every drive counted since the last commit. Returns whether there
    /// was anything to commit.
    pub(crate) async fn commit_drive_errors(&self) -> Result<bool, EngineError> {
        let _serial = self.error_commit.lock().await;
        let drives = self.drives();
        let deltas: Vec<(&Arc<Drive<D>>, DriveErrors)> =
            drives.iter().map(|d| (d, d.pending_errors())).filter(|(_, e)| !e.is_zero()).collect();
        if deltas.is_empty() {
            return Ok(false);
        }
        let by_slot: Vec<(u32, DriveErrors)> = deltas.iter().map(|(d, e)| (d.slot(), *e)).collect();
        let add = move |m: &mut PoolMeta| {
            for (slot, delta) in &by_slot {
                // A drive that left the pool (replaced) has no record: its events go with it.
                if let Some(rec) = m.drives.iter_mut().find(|r| r.slot == *slot) {
                    rec.errors.add(delta);
                }
            }
            Ok(((), true))
        };
        let settle = || {
            for (d, delta) in &deltas {
                d.settle_errors(delta);
            }
        };
        self.update_then(super::store::Scope::Any, add, settle).await?;
        Ok(true)
    }

    /// Resets the error counters of the drive in `slot` (every drive for `None`) to zero, events
    /// not yet committed included, and commits the reset. Returns the slots cleared.
    pub(crate) async fn clear_drive_errors(&self, slot: Option<u32>) -> Result<Vec<u32>, EngineError> {
        let _serial = self.error_commit.lock().await;
        let meta = self.meta();
        let slots: Vec<u32> = match slot {
            Some(s) if meta.drive(s).is_none() => return Err(EngineError::NoSuchDrive(format!("slot {s}"))),
            Some(s) => vec![s],
            None => meta.drives.iter().map(|r| r.slot).collect(),
        };
        let discarded: Vec<(Arc<Drive<D>>, DriveErrors)> = slots
            .iter()
            .filter_map(|&s| self.drive(s))
            .map(|d| {
                let pending = d.pending_errors();
                (d, pending)
            })
            .collect();
        let targets = slots.clone();
        let reset = move |m: &mut PoolMeta| {
            let mut changed = false;
            for rec in m.drives.iter_mut().filter(|r| targets.contains(&r.slot)) {
                changed |= !rec.errors.is_zero();
                rec.errors = DriveErrors::default();
            }
            Ok(((), changed))
        };
        let forget = || {
            for (d, pending) in &discarded {
                d.settle_errors(pending);
            }
        };
        self.update_then(super::store::Scope::Any, reset, forget).await?;
        Ok(slots)
    }

    /// The error counters of the drive in `slot` as of now: the committed totals plus the events
    /// not yet committed.
    pub(crate) fn drive_errors(&self, slot: u32) -> DriveErrors {
        let _publish = self.publish.lock();
        let mut total = self.meta().drive(slot).map(|r| r.errors).unwrap_or_default();
        if let Some(d) = self.drive(slot) {
            total.add(&d.pending_errors());
        }
        total
    }
}

impl<D: BlockDevice> Pool<D> {
    /// Commits the drives' error events counted since the last commit (one metadata commit for
    /// all drives; none when nothing was counted). [`Pool::tick`], [`Pool::scrub`] and
    /// [`Pool::close`] call it; returns whether anything was committed.
    pub async fn commit_drive_errors(&self) -> Result<bool, EngineError> {
        self.core.commit_drive_errors().await
    }

    /// Resets the persistent error counters of the drive in `slot`, or of every drive for `None`
    /// (`stria drive clear-errors`). Returns the slots cleared.
    pub async fn clear_drive_errors(&self, slot: Option<u32>) -> Result<Vec<u32>, EngineError> {
        self.core.clear_drive_errors(slot).await
    }

    /// The error counters of the drive in `slot`: committed totals plus events not yet committed.
    pub fn drive_errors(&self, slot: u32) -> DriveErrors {
        self.core.drive_errors(slot)
    }
}
