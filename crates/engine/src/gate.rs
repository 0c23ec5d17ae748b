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
//! Writers and the closer meet Dekker-style: a writer increments its `active` counter and then
//! reads `closing`; the closer sets `closing` and then reads the counters. With sequentially
//! consistent ordering at least one sees the other, so no pass is handed out that the closer
//! misses.
//!
//! The gate also gives a *grace period* (as RCU does): [`OpGate::grace`] returns once every
//! operation that entered before it was called has left. Passes are counted in one of two
//! counters, chosen by the parity of `epoch`; a grace flips the epoch and waits for the old
//! counter to drain. An extent move uses it after replacing a volume's map: a request that loaded
//! the old map entered before, so once the grace is over nothing can still read the old extent
//! (pool/moves.rs).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};

use tokio::sync::Notify;

/// Counts operations in progress and refuses new ones once closing.
#[derive(Debug, Default)]
pub(crate) struct OpGate {
    /// Passes out, counted by the parity of the epoch they entered in.
    active: [AtomicU64; 2],
    epoch: AtomicU64,
    closing: AtomicBool,
    idle: Notify,
    /// Closers and graces waiting on `idle`: a returned pass wakes them only when there are
    /// some (`Notify::notify_waiters` takes a lock, on every request of an idle pool).
    waiting: AtomicUsize,
    /// Graces one at a time: a second flip of the epoch while a first grace waits would make
    /// it wait for operations that entered after it began.
    graces: tokio::sync::Mutex<()>,
}

/// Held by an operation while it runs.
#[derive(Debug)]
pub(crate) struct OpPass<'a> {
    gate: &'a OpGate,
    parity: usize,
}

impl OpGate {
    /// A pass for one operation, or `None` when the pool is closing.
    pub(crate) fn enter(&self) -> Option<OpPass<'_>> {
        let parity = (self.epoch.load(SeqCst) & 1) as usize;
        self.active[parity].fetch_add(1, SeqCst);
        if self.closing.load(SeqCst) {
            self.leave(parity);
            return None;
        }
        Some(OpPass { gate: self, parity })
    }

    fn leave(&self, parity: usize) {
        let before = self.active[parity].fetch_sub(1, SeqCst);
        assert!(before > 0, "operation gate: more passes returned than handed out");
        // Dekker-style with `Waiting::register`: a waiter counts itself before it registers
        // and then checks the counters, this reads the waiters after its decrement; so either
        // the waiter sees this pass returned, or this sees the waiter (registered by then, as
        // the notify's lock orders it after the registration) and wakes it.
        if before == 1 && self.waiting.load(SeqCst) > 0 {
            self.idle.notify_waiters();
        }
    }

    fn outstanding(&self) -> u64 {
        self.active[0].load(SeqCst) + self.active[1].load(SeqCst)
    }

    /// Waits until every operation that entered before this call has left (later ones are not
    /// waited for). The caller must not hold a pass. Graces run one at a time.
    pub(crate) async fn grace(&self) {
        let _one = self.graces.lock().await;
        let old = (self.epoch.fetch_add(1, SeqCst) & 1) as usize;
        let started = std::time::Instant::now();
        let mut warned = false;
        let _waiting = Waiting::register(self);
        loop {
            let idle = self.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if self.active[old].load(SeqCst) == 0 {
                return;
            }
            // An operation that holds its pass this long is stuck; say so, keep waiting.
            let tick = tokio::time::sleep(std::time::Duration::from_secs(10));
            tokio::select! {
                _ = idle => {}
                _ = tick => {
                    if !warned {
                        tracing::warn!(waited_s = started.elapsed().as_secs(), "still waiting for operations that started before an extent move or a volume close ended");
                        warned = true;
                    }
                }
            }
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
        let _waiting = Waiting::register(self);
        loop {
            let idle = self.idle.notified();
            tokio::pin!(idle);
            // Register before checking, so a pass returned in between still wakes us.
            idle.as_mut().enable();
            if self.outstanding() == 0 {
                return;
            }
            idle.await;
        }
    }
}

/// Counts a closer or grace in `OpGate::waiting` while it waits (also when its future is
/// dropped mid-wait).
struct Waiting<'a>(&'a OpGate);

impl<'a> Waiting<'a> {
    fn register(gate: &'a OpGate) -> Waiting<'a> {
        gate.waiting.fetch_add(1, SeqCst);
        Waiting(gate)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, SeqCst);
    }
}

impl Drop for OpPass<'_> {
    fn drop(&mut self) {
        self.gate.leave(self.parity);
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

    #[tokio::test]
    async fn a_grace_waits_for_earlier_passes_only() {
        let gate = Arc::new(OpGate::default());
        let early = gate.enter().expect("open");
        let grace = {
            let gate = Arc::clone(&gate);
            tokio::spawn(async move { gate.grace().await })
        };
        tokio::task::yield_now().await;
        let late = gate.enter().expect("open");
        tokio::task::yield_now().await;
        assert!(!grace.is_finished(), "the grace ended while an earlier pass was out");
        drop(early);
        grace.await.expect("the grace ends once the earlier pass is back, with a later one still out");
        drop(late);
        // A second grace flips back to the first counter, which is empty now.
        gate.grace().await;
    }

    /// Passes returned on other threads while a grace or a close starts to wait: no wake-up
    /// may be lost (a lost one hangs the waiter, which the timeout turns into a failure).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn waiters_are_woken_by_passes_returned_on_other_threads() {
        for round in 0..300 {
            let gate = Arc::new(OpGate::default());
            let passes: Vec<_> = (0..4)
                .map(|i| {
                    let gate = Arc::clone(&gate);
                    tokio::spawn(async move {
                        let pass = gate.enter();
                        for _ in 0..(round + i) % 7 {
                            tokio::task::yield_now().await;
                        }
                        drop(pass);
                    })
                })
                .collect();
            let waited = async {
                gate.grace().await;
                gate.close().await;
            };
            tokio::time::timeout(std::time::Duration::from_secs(10), waited)
                .await
                .unwrap_or_else(|_| panic!("round {round}: a waiter was not woken"));
            for p in passes {
                p.await.expect("pass task");
            }
            assert_eq!(gate.outstanding(), 0);
            assert_eq!(gate.waiting.load(SeqCst), 0, "a waiter stayed counted");
        }
    }
}
