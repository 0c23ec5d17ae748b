//! The free space of the host filesystem under several file-backed drives, shared by the
//! [`super::FaultDevice`]s that model them: when it runs out, every write and flush of every
//! attached drive fails with ENOSPC at once (as sparse drive files on one full filesystem do),
//! until space is freed.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};

/// A filesystem shared by drives (`Arc<HostSpace>`): full or not, switched by the test.
#[derive(Debug, Default)]
pub struct HostSpace {
    full: AtomicBool,
    /// Writes and flushes still allowed before the filesystem fills, when armed.
    fill_after: AtomicU64,
    armed: AtomicBool,
}

impl HostSpace {
    /// A filesystem with room to spare.
    pub fn new() -> Arc<HostSpace> {
        Arc::new(HostSpace::default())
    }

    /// Fills the filesystem now.
    pub fn fill(&self) {
        self.armed.store(false, SeqCst);
        self.full.store(true, SeqCst);
    }

    /// Lets `ops` more writes and flushes (over all drives) through, then fills the filesystem.
    pub fn fill_after_ops(&self, ops: u64) {
        self.fill_after.store(ops, SeqCst);
        self.armed.store(true, SeqCst);
    }

    /// Frees space: requests succeed again.
    pub fn free(&self) {
        self.armed.store(false, SeqCst);
        self.full.store(false, SeqCst);
    }

    /// True while the filesystem is full.
    pub fn is_full(&self) -> bool {
        self.full.load(SeqCst)
    }

    /// Passes one write or flush: false when there is no room for it.
    pub(super) fn admit(&self) -> bool {
        if self.armed.load(SeqCst) {
            let left = self.fill_after.load(SeqCst);
            if left == 0 {
                self.fill();
            } else {
                self.fill_after.store(left - 1, SeqCst);
            }
        }
        !self.full.load(SeqCst)
    }
}
