//! The pool's operation gate: every operation that may write to the drives (a volume request,
//! a scrub or rebuild row) holds a pass while it runs, and a clean close waits for the last pass
//! to be returned before its final flush.
//!
//! Without it a close could flush, then clear every intent bit, while a write that had already
//! passed its checks was still running: the write's data reached the drive after the flush, its
//! checksum entries were never written, and the region was marked clean, so the next open
//! neither resynchronised the region nor could read it back (found by the real-process crash
//! loop, tests/crash/crashloop.py, on a tiered volume whose destager was writing at SIGTERM).
//!
//! Writers and the closer meet Dekker-style: a writer increments `active` and then reads
//! `closing`; the closer sets `closing` and then reads `active`. With sequentially consistent
//! ordering at least one sees the other, so no pass is handed out that the closer misses.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};

use tokio::sync::Notify;

/// Counts operations in progress and refuses new ones once closing.
#[derive(Debug, Default)]
pub(crate) struct OpGate {
    active: AtomicU64,
    closing: AtomicBool,
    idle: Notify,
}

/// Held by an operation while it runs.
#[derive(Debug)]
pub(crate) struct OpPass<'a> {
    gate: &'a OpGate,
}

impl OpGate {
    /// A pass for one operation, or `None` when the pool is closing.
    pub(crate) fn enter(&self) -> Option<OpPass<'_>> {
        self.active.fetch_add(1, SeqCst);
        if self.closing.load(SeqCst) {
            self.leave();
            return None;
        }
        Some(OpPass { gate: self })
    }

    fn leave(&self) {
        let before = self.active.fetch_sub(1, SeqCst);
        assert!(before > 0, "operation gate: more passes returned than handed out");
        if before == 1 {
            self.idle.notify_waiters();
        }
    }

    /// True once [`OpGate::close`] was called.
    #[cfg(test)]
    pub(crate) fn is_closing(&self) -> bool {
        self.closing.load(SeqCst)
    }

    /// Refuses new operations and waits until every operation in progress has finished.
    pub(crate) async fn close(&self) {
        self.closing.store(true, SeqCst);
        loop {
            let idle = self.idle.notified();
            tokio::pin!(idle);
            // Register before checking, so a pass returned in between still wakes us.
            idle.as_mut().enable();
            if self.active.load(SeqCst) == 0 {
                return;
            }
            idle.await;
        }
    }
}

impl Drop for OpPass<'_> {
    fn drop(&mut self) {
        self.gate.leave();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[tokio::test]
    async fn close_waits_for_passes_and_refuses_new_ones() {
        let gate = Arc::new(OpGate::default());
        let pass = gate.enter().expect("open");
        let closer = {
            let gate = Arc::clone(&gate);
            tokio::spawn(async move { gate.close().await })
        };
        tokio::task::yield_now().await;
        assert!(!closer.is_finished(), "close returned with an operation in progress");
        assert!(gate.enter().is_none(), "a pass was handed out while closing");
        drop(pass);
        closer.await.expect("close finishes once the last pass is returned");
        assert!(gate.is_closing());
    }
}
