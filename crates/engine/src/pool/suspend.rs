//! Suspended writes: a full host filesystem is a fault of the host, not of the drives.
//!
//! Drive files are usually sparse, so a filesystem that fills makes every drive's writes fail
//! with ENOSPC within a millisecond. Failing each drive in turn (what a write error means on a
//! real disk) would turn a transient fault into the permanent loss of the pool. Instead:
//!
//! * the write (or flush) that met ENOSPC fails back to its caller, unacknowledged, exactly
//!   like a write cut by a power loss; the drive stays active;
//! * the pool is *suspended*: every later write and flush is refused with
//!   [`EngineError::HostFull`] before touching a drive; reads go on;
//! * while suspended, no intent bit is cleared (neither by [`Pool::tick`] nor by a clean
//!   close), so the regions the failed write may have left inconsistent (a mirror copy or a
//!   parity chunk that missed it) stay marked, on disk, like after a crash;
//! * [`Pool::clear_suspension`] (`stria pool clear`), once space was freed, resynchronises
//!   every marked row under its stripe lock (the same row resync as crash recovery), then lifts
//!   the suspension and flushes. If space is still short, the resync's or the flush's own
//!   writes fail with ENOSPC and the pool stays suspended. A restart does the same resync in
//!   its recovery.
//!
//! Nothing acknowledged depends on a drive that missed a write: a write returns an error as
//! soon as one of its member writes met ENOSPC. See docs/design/transient-faults.md.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use stria_dev::{BlockDevice, DevError};

use super::Pool;
use super::core::PoolCore;
use super::recovery::RecoveryReport;
use crate::error::EngineError;
use crate::format::layout::INTENT_REGION_BLOCKS;

impl<D: BlockDevice> PoolCore<D> {
    /// Suspends writes after `e` (a no-space error of the drive in `slot` during `what`);
    /// returns the reason the pool gives (the first one, if it was suspended already).
    pub(crate) fn suspend(&self, slot: u32, what: &str, e: &DevError) -> String {
        let mut suspended = self.suspended.lock();
        if let Some(reason) = suspended.as_ref() {
            return reason.clone();
        }
        let reason = format!(
            "the filesystem holding drive {slot} is full ({what}: {e}); no drive was failed and nothing \
             acknowledged is lost"
        );
        tracing::error!(slot, what, error = %e, "host filesystem full: writes suspended, reads go on");
        *suspended = Some(reason.clone());
        self.suspended_flag.store(true, Ordering::Release);
        reason
    }

    /// Why writes are suspended, if they are.
    pub(crate) fn suspension(&self) -> Option<String> {
        if !self.suspended_flag.load(Ordering::Acquire) {
            return None;
        }
        self.suspended.lock().clone()
    }

    fn resume(&self) {
        let mut suspended = self.suspended.lock();
        *suspended = None;
        self.suspended_flag.store(false, Ordering::Release);
    }

    /// Handles an I/O error `e` of the drive in `slot` met by `what`: a full host filesystem
    /// suspends writes and returns [`EngineError::HostFull`] (the caller's request fails); any
    /// other error fails the drive (persisted) and returns `Ok` (the caller goes on without it).
    pub(crate) async fn drive_error(&self, slot: u32, what: &str, e: &DevError) -> Result<(), EngineError> {
        self.drive_error_of(slot, None, what, e).await
    }

    /// [`PoolCore::drive_error`] of the drive object numbered `incarnation` (see
    /// [`PoolCore::fail_drive_of`]).
    pub(crate) async fn drive_error_of(
        &self,
        slot: u32,
        incarnation: Option<u64>,
        what: &str,
        e: &DevError,
    ) -> Result<(), EngineError> {
        if e.is_no_space() {
            return Err(EngineError::HostFull(self.suspend(slot, what, e)));
        }
        if e.is_fenced() {
            self.set_fenced(slot);
            return Err(EngineError::Fenced);
        }
        self.fail_drive_of(slot, incarnation, format!("{what}: {e}")).await
    }
}

impl<D: BlockDevice> Pool<D> {
    /// Why writes are suspended (a full host filesystem), or `None`.
    pub fn suspension(&self) -> Option<String> {
        self.core.suspension()
    }

    /// Lifts a suspension once space was freed: resynchronises every row an intent bit marks
    /// (each under its stripe lock, while reads go on), resumes writes and flushes. Fails with
    /// [`EngineError::HostFull`] and stays suspended if space is still short. Returns what the
    /// resync did (all zeros when the pool was not suspended).
    pub async fn clear_suspension(&self) -> Result<RecoveryReport, EngineError> {
        let _serial = self.clearing.lock().await;
        let mut report = RecoveryReport::default();
        if self.core.suspension().is_none() {
            return Ok(report);
        }
        let mut dirty: BTreeMap<u32, Vec<(u64, u64)>> = BTreeMap::new();
        for d in self.core.drives().iter().filter(|d| !d.is_failed() && !d.is_missing()) {
            let regions = d.intent.dirty_list();
            report.dirty_regions += regions.len() as u64;
            dirty.insert(
                d.slot(),
                regions.into_iter().map(|r| (r * INTENT_REGION_BLOCKS, INTENT_REGION_BLOCKS)).collect(),
            );
        }
        for vol in self.volumes() {
            let map = vol.current_map();
            for (si, row) in super::recovery::dirty_rows(&vol, &map, &dirty) {
                let stats = vol.resync_row(&map, si, row).await.map_err(unwrap_host_full)?;
                report.rows_resynced += 1;
                report.parity_blocks_rewritten += stats.parity_blocks;
                report.copy_blocks_rewritten += stats.copy_blocks;
            }
        }
        self.core.resume();
        // Failing, this suspends the pool again (the flush met ENOSPC) or fails a drive.
        self.core.flush_all().await?;
        tracing::info!(?report, "suspension cleared: writes resumed");
        Ok(report)
    }
}

/// A resync that met a full filesystem fails with the pool's own error (`HostFull`), not the
/// volume's wrapping of it, so callers see one error for "still full".
fn unwrap_host_full(e: EngineError) -> EngineError {
    match e {
        EngineError::Volume(crate::error::VolumeError::Pool { source, .. })
            if matches!(source.downcast_ref::<EngineError>(), Some(EngineError::HostFull(_))) =>
        {
            *source.downcast::<EngineError>().expect("checked to be the pool's error")
        }
        other => other,
    }
}
