//! Stripe locks: writes (and repairs) to the same stripe are serialised, nothing else is.
//!
//! A fixed table of async mutexes indexed by a hash of (segment, row). Two stripes that hash to
//! the same slot share a lock, which costs a little concurrency, never correctness. A request
//! that spans several stripes takes its slots in ascending order, so requests cannot deadlock.

use tokio::sync::{Mutex, MutexGuard};

/// Slots in a volume's lock table.
pub(crate) const LOCK_SLOTS: usize = 4096;

/// The lock table of one volume.
#[derive(Debug)]
pub(crate) struct StripeLocks {
    slots: Box<[Mutex<()>]>,
}

/// Locks held for one request.
#[derive(Debug)]
pub(crate) struct StripeGuards<'a> {
    _guards: Vec<MutexGuard<'a, ()>>,
}

impl StripeLocks {
    pub(crate) fn new() -> StripeLocks {
        StripeLocks { slots: (0..LOCK_SLOTS).map(|_| Mutex::new(())).collect() }
    }

    fn slot(segment: usize, row: u64) -> usize {
        // A multiplicative hash spreads consecutive rows and segments over the table.
        let key = row.wrapping_add((segment as u64) << 48);
        (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 52) as usize % LOCK_SLOTS
    }

    /// Locks the stripes `keys` (segment, row) for the caller's exclusive use.
    pub(crate) async fn lock(&self, keys: impl IntoIterator<Item = (usize, u64)>) -> StripeGuards<'_> {
        let mut slots: Vec<usize> = keys.into_iter().map(|(s, r)| Self::slot(s, r)).collect();
        slots.sort_unstable();
        slots.dedup();
        let mut guards = Vec::with_capacity(slots.len());
        for s in slots {
            guards.push(self.slots[s].lock().await);
        }
        StripeGuards { _guards: guards }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn overlapping_requests_wait_and_disjoint_ones_do_not() {
        let locks = StripeLocks::new();
        let held = locks.lock([(0, 1), (0, 2), (0, 1)]).await;
        // A disjoint stripe (unless it hashes to a held slot) is immediately available.
        let free_row = (3..100).find(|&r| {
            let s = StripeLocks::slot(0, r);
            s != StripeLocks::slot(0, 1) && s != StripeLocks::slot(0, 2)
        });
        let other = locks.lock([(0, free_row.unwrap())]).await;
        drop(other);
        let waiter = locks.lock([(0, 2)]);
        tokio::pin!(waiter);
        assert!(futures::poll!(&mut waiter).is_pending());
        drop(held);
        let _g = waiter.await;
    }
}
