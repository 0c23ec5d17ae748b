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
    /// The lock of a request within one stripe (the common case: no list to allocate).
    _one: Option<MutexGuard<'a, ()>>,
    _more: Vec<MutexGuard<'a, ()>>,
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

    /// The slots of `keys`: `Ok(slot)` when they all share one (the common case: no list to
    /// allocate), otherwise every slot, sorted and without repeats. `Ok(None)` for no keys.
    fn slots(keys: impl IntoIterator<Item = (usize, u64)>) -> Result<Option<usize>, Vec<usize>> {
        let mut keys = keys.into_iter();
        let Some((s, r)) = keys.next() else { return Ok(None) };
        let first = Self::slot(s, r);
        let mut slots: Vec<usize> = Vec::new();
        for (s, r) in keys {
            let slot = Self::slot(s, r);
            if slot != first {
                if slots.is_empty() {
                    slots.push(first);
                }
                slots.push(slot);
            }
        }
        if slots.is_empty() {
            return Ok(Some(first));
        }
        slots.sort_unstable();
        slots.dedup();
        Err(slots)
    }

    /// Locks the stripes `keys` (segment, row) for the caller's exclusive use.
    pub(crate) async fn lock(&self, keys: impl IntoIterator<Item = (usize, u64)>) -> StripeGuards<'_> {
        let slots = match Self::slots(keys) {
            Ok(None) => return StripeGuards { _one: None, _more: Vec::new() },
            Ok(Some(slot)) => {
                return StripeGuards { _one: Some(self.slots[slot].lock().await), _more: Vec::new() };
            }
            Err(slots) => slots,
        };
        let mut guards = Vec::with_capacity(slots.len());
        for s in slots {
            guards.push(self.slots[s].lock().await);
        }
        StripeGuards { _one: None, _more: guards }
    }

    /// Locks every stripe of the volume (in slot order, as requests do, so it cannot deadlock
    /// with them): no write, repair or row maintenance runs until the guards are dropped.
    pub(crate) async fn lock_all(&self) -> StripeGuards<'_> {
        let mut guards = Vec::with_capacity(LOCK_SLOTS);
        for slot in self.slots.iter() {
            guards.push(slot.lock().await);
        }
        StripeGuards { _one: None, _more: guards }
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
