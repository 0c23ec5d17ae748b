//! Range locks: what makes a compare and write atomic against every host write, zeroing and
//! discard of its range (the contract's "Compare and write").
//!
//! A fixed table of async read-write locks; block `b` belongs to region `b / REGION_BLOCKS`,
//! whose lock is slot `region % RANGE_LOCKS`. Host writes, zeroing and discards hold the slots of
//! their range *shared* from before they read an edge block until their map update is applied,
//! so they never wait for each other here; a compare and write holds the slots of its range
//! *exclusively* from before its read until its map update is applied. Regions that share a
//! slot share a lock, which costs a compare and write a little concurrency, never correctness.
//! Every request takes its slots once each, in ascending order, so requests cannot deadlock.
//!
//! The slots are layer-blind: a clone's writes and its origin's share them (one family, one
//! table), which again costs only concurrency.

use std::ops::Range;

use tokio::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Slots in a volume's table.
pub(crate) const RANGE_LOCKS: usize = 1024;
/// Blocks per region: 256 KiB. A write of up to 256 KiB takes one or two slots; a compare and
/// write of the longest kind (1 MiB) five at most.
pub(crate) const REGION_BLOCKS: u64 = 64;

/// The range lock table of one log-structured volume (and its clones).
pub(crate) struct RangeLocks {
    slots: Box<[RwLock<()>]>,
}

/// Slots held for one request (released when dropped).
pub(crate) struct RangeGuards<G> {
    /// The slot of a request within one region (the common case: no list to allocate).
    _one: Option<G>,
    _more: Vec<G>,
}

impl RangeLocks {
    pub(crate) fn new() -> RangeLocks {
        RangeLocks { slots: (0..RANGE_LOCKS).map(|_| RwLock::new(())).collect() }
    }

    /// The slots of blocks `first..end` (non-empty), ascending, each once: one run, or two when
    /// the regions wrap around the table.
    fn slots(first: u64, end: u64) -> [Range<usize>; 2] {
        assert!(first < end, "invariant: a range lock covers at least one block ({first}..{end})");
        let regions = end.div_ceil(REGION_BLOCKS) - first / REGION_BLOCKS;
        if regions >= RANGE_LOCKS as u64 {
            return [0..RANGE_LOCKS, 0..0];
        }
        let start = (first / REGION_BLOCKS % RANGE_LOCKS as u64) as usize;
        let stop = start + regions as usize;
        if stop <= RANGE_LOCKS { [start..stop, 0..0] } else { [0..stop - RANGE_LOCKS, start..RANGE_LOCKS] }
    }

    /// Holds the slots of blocks `first..end` shared (host writes, zeroing, discards).
    pub(crate) async fn shared(&self, first: u64, end: u64) -> RangeGuards<RwLockReadGuard<'_, ()>> {
        let [a, b] = Self::slots(first, end);
        if a.len() == 1 && b.is_empty() {
            return RangeGuards { _one: Some(self.slots[a.start].read().await), _more: Vec::new() };
        }
        let mut more = Vec::with_capacity(a.len() + b.len());
        for s in a.chain(b) {
            more.push(self.slots[s].read().await);
        }
        RangeGuards { _one: None, _more: more }
    }

    /// Holds the slots of blocks `first..end` exclusively (compare and write): no host write,
    /// zeroing or discard of those blocks runs until the guards are dropped.
    pub(crate) async fn exclusive(&self, first: u64, end: u64) -> RangeGuards<RwLockWriteGuard<'_, ()>> {
        let [a, b] = Self::slots(first, end);
        let mut more = Vec::with_capacity(a.len() + b.len());
        for s in a.chain(b) {
            more.push(self.slots[s].write().await);
        }
        RangeGuards { _one: None, _more: more }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const R: u64 = REGION_BLOCKS;
    const N: u64 = RANGE_LOCKS as u64;

    fn slot_list(first: u64, end: u64) -> Vec<usize> {
        RangeLocks::slots(first, end).into_iter().flatten().collect()
    }

    #[test]
    fn slots_are_the_regions_of_the_range_ascending_and_each_once() {
        assert_eq!(slot_list(0, 1), [0]);
        assert_eq!(slot_list(R - 1, R + 1), [0, 1]);
        assert_eq!(slot_list(5 * R, 6 * R), [5]);
        assert_eq!(slot_list(N * R + 3, N * R + 4), [0], "regions a table apart share a slot");
        assert_eq!(slot_list((N - 1) * R, (N + 1) * R + 1), [0, 1, (N - 1) as usize], "wraps, ascending");
        assert_eq!(slot_list(7, 7 + N * R).len(), RANGE_LOCKS, "a long range takes every slot once");
        // Against the obvious definition.
        for (first, end) in [(0, 1), (63, 65), (1000, 90_000), ((N - 2) * R + 5, (N + 3) * R), (R, 2 * R)] {
            let mut want: Vec<usize> = (first / R..end.div_ceil(R)).map(|r| (r % N) as usize).collect();
            want.sort_unstable();
            want.dedup();
            assert_eq!(slot_list(first, end), want, "{first}..{end}");
        }
    }

    #[tokio::test]
    async fn shared_holders_do_not_wait_for_each_other_and_exclusive_waits_for_both_ways() {
        let locks = RangeLocks::new();
        let a = locks.shared(0, 2 * R).await;
        let b = locks.shared(R, R + 1).await;
        let excl = locks.exclusive(R + 5, R + 6);
        tokio::pin!(excl);
        assert!(futures::poll!(&mut excl).is_pending(), "a shared holder keeps an exclusive one out");
        drop(a);
        assert!(futures::poll!(&mut excl).is_pending());
        drop(b);
        let held = excl.await;
        let other = locks.shared(3 * R, 4 * R).await;
        drop(other);
        let waiter = locks.shared(R, R + 1);
        tokio::pin!(waiter);
        assert!(futures::poll!(&mut waiter).is_pending(), "an exclusive holder keeps writes out");
        drop(held);
        drop(waiter.await);
    }
}
