//! Error events of one drive counted since the last metadata commit that took them.
//!
//! The totals live in the pool metadata (`DriveRecord::errors`); committing on every error would
//! turn an error storm into a metadata-write storm, so the drive only counts here (relaxed
//! atomics, no lock on the I/O path) and the pool commits the delta now and then
//! (`PoolCore::commit_drive_errors`). The protocol keeps every event counted exactly once:
//! [`PendingErrors::take`] copies the delta, the pool commits it, and only after the commit
//! succeeded does [`PendingErrors::settle`] subtract what was committed; events that arrive in
//! between stay pending, and a failed commit leaves the whole delta pending.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::format::meta::{DriveErrors, ErrorCount};

/// What went wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ErrorKind {
    /// A read request failed with an I/O error.
    Read,
    /// A write (or flush) request failed with an I/O error.
    Write,
    /// Blocks were found bad and rewritten from redundancy.
    ChecksumRepair,
}

#[derive(Debug, Default)]
struct PendingCount {
    count: AtomicU64,
    /// Time of the latest event ever counted here (never reset: it only matters while `count`
    /// is non-zero, and a later event raises it).
    last_unix_secs: AtomicU64,
}

impl PendingCount {
    fn record(&self, events: u64, now_unix_secs: u64) {
        self.last_unix_secs.fetch_max(now_unix_secs, Relaxed);
        self.count.fetch_add(events, Relaxed);
    }

    fn load(&self) -> ErrorCount {
        let count = self.count.load(Relaxed);
        let last_unix_secs = if count == 0 { 0 } else { self.last_unix_secs.load(Relaxed) };
        ErrorCount { count, last_unix_secs }
    }

    fn settle(&self, committed: ErrorCount) {
        let before = self.count.fetch_sub(committed.count, Relaxed);
        assert!(before >= committed.count, "settled {} error events of {before} pending", committed.count);
    }
}

/// Error events not yet committed to the pool metadata.
#[derive(Debug, Default)]
pub(crate) struct PendingErrors {
    read: PendingCount,
    write: PendingCount,
    checksum_repair: PendingCount,
}

impl PendingErrors {
    fn counter(&self, kind: ErrorKind) -> &PendingCount {
        match kind {
            ErrorKind::Read => &self.read,
            ErrorKind::Write => &self.write,
            ErrorKind::ChecksumRepair => &self.checksum_repair,
        }
    }

    /// Counts `events` of `kind` happening at `now_unix_secs`.
    pub(crate) fn record(&self, kind: ErrorKind, events: u64, now_unix_secs: u64) {
        if events > 0 {
            self.counter(kind).record(events, now_unix_secs);
        }
    }

    /// The delta not yet committed (left pending until [`PendingErrors::settle`]).
    pub(crate) fn take(&self) -> DriveErrors {
        DriveErrors {
            read_errors: self.read.load(),
            write_errors: self.write.load(),
            checksum_repairs: self.checksum_repair.load(),
        }
    }

    /// Forgets `committed`, a delta returned by [`PendingErrors::take`] whose commit succeeded.
    /// Callers serialise take-commit-settle (one commit of a delta at a time).
    pub(crate) fn settle(&self, committed: &DriveErrors) {
        self.read.settle(committed.read_errors);
        self.write.settle(committed.write_errors);
        self.checksum_repair.settle(committed.checksum_repairs);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_after_the_take_stay_pending_after_the_settle() {
        let p = PendingErrors::default();
        p.record(ErrorKind::Read, 3, 100);
        p.record(ErrorKind::ChecksumRepair, 64, 101);
        let delta = p.take();
        assert_eq!(delta.read_errors, ErrorCount { count: 3, last_unix_secs: 100 });
        assert_eq!(delta.checksum_repairs.count, 64);
        assert_eq!(delta.write_errors, ErrorCount::default());
        // Arrives while the delta is being committed.
        p.record(ErrorKind::Read, 1, 105);
        p.settle(&delta);
        let left = p.take();
        assert_eq!(left.read_errors, ErrorCount { count: 1, last_unix_secs: 105 });
        assert_eq!(left.checksum_repairs, ErrorCount::default());
    }

    #[test]
    fn a_failed_commit_keeps_the_whole_delta() {
        let p = PendingErrors::default();
        p.record(ErrorKind::Write, 2, 7);
        let delta = p.take();
        // The commit failed: no settle.
        p.record(ErrorKind::Write, 1, 9);
        let again = p.take();
        assert_eq!(again.write_errors, ErrorCount { count: 3, last_unix_secs: 9 });
        p.settle(&again);
        assert!(p.take().is_zero());
        assert_eq!(delta.write_errors.count, 2);
    }
}
