//! The write cache ring: ever-increasing 64-bit positions over a ring of cache blocks.
//!
//! A position is *reserved* while its data is being written, *live* while a map entry points to
//! it, and free otherwise. The tail advances over free positions only, so a reserved or live
//! block is never reused; the head never passes the tail by more than the ring size. Writers that
//! find the ring full wait (back-pressure) and wake the mover.
//!
//! Asserted: a position is claimed only while reserved, freed only while reserved or live and
//! only in the ring's current turn, and freed as a block's old place only while it holds that
//! block ([`CacheRing::release_owned`]); two blocks never hold one position; the live count
//! stays within the positions between tail and head.

use parking_lot::Mutex;
use tokio::sync::Notify;

/// State of one ring slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Free,
    Reserved,
    /// Holds the data of one block: its owner, the logical block.
    Live(u64),
    /// Restored at open from a table that may name owners whose map update never became
    /// durable: live until destage finds the block's map entry elsewhere, then freed.
    Restored(u64),
}

impl Slot {
    fn owner(self) -> Option<u64> {
        match self {
            Slot::Live(o) | Slot::Restored(o) => Some(o),
            Slot::Free | Slot::Reserved => None,
        }
    }
}

#[derive(Debug)]
struct State {
    head: u64,
    tail: u64,
    slots: Vec<Slot>,
    /// Per slot, whether its block was written hot (a hint for destage's streams under
    /// `GcPolicy::Temperature`; false when claimed, in memory only).
    hot: Vec<bool>,
    /// Slots that are `Live` (kept with them, so asking costs nothing).
    live: u64,
    waiting: usize,
    /// Set while destage cannot free space (its last attempt failed): waiting writers get an
    /// error instead of waiting forever. Cleared when destage works again.
    failed: Option<String>,
    /// Set for good when the volume closes or stops taking writes: every reservation fails.
    /// Kept apart from `failed` so that a destage batch finishing after the close cannot clear
    /// it (a writer then waited for space that no mover would ever free).
    shut: Option<String>,
}

impl State {
    /// The slot of `pos`, which must lie in this turn of the ring, `[tail, head)`: outside it the
    /// slot may belong to another position, and a claim or release would hit that one.
    /// `message(tail, head)` says what the caller was doing, for the panic.
    fn slot_in_turn(&mut self, pos: u64, ring: u64, message: impl FnOnce(u64, u64) -> String) -> &mut Slot {
        assert!(pos >= self.tail && pos < self.head, "cache ring: {}", message(self.tail, self.head));
        &mut self.slots[(pos % ring) as usize]
    }
}

/// The write cache ring of one volume.
#[derive(Debug)]
pub(crate) struct CacheRing {
    ring: u64,
    state: Mutex<State>,
    space: Notify,
    /// Wakes the mover when a writer is waiting for space.
    pub(crate) hungry: Notify,
}

impl CacheRing {
    /// An empty log of `ring` blocks.
    pub(crate) fn new(ring: u64) -> CacheRing {
        assert!(ring > 0);
        CacheRing {
            ring,
            state: Mutex::new(State {
                head: 0,
                tail: 0,
                slots: vec![Slot::Free; usize::try_from(ring).expect("ring fits")],
                hot: vec![false; usize::try_from(ring).expect("ring fits")],
                live: 0,
                waiting: 0,
                failed: None,
                shut: None,
            }),
            space: Notify::new(),
            hungry: Notify::new(),
        }
    }

    /// A log holding the live positions `live` (position, owner), found at open; `describe`
    /// names an owner for the message if two claim one position.
    pub(crate) fn with_owners(ring: u64, live: &[(u64, u64)], describe: impl Fn(u64) -> String) -> CacheRing {
        Self::rebuilt(ring, live, describe, Slot::Live)
    }

    /// A log holding the positions `owners` (position, owner) of a persisted table and of the
    /// replayed map deltas, as [`Slot::Restored`] ones. Positions a whole ring or more behind
    /// the newest were free when the newest was reserved, and are dropped.
    pub(crate) fn restored(ring: u64, owners: &[(u64, u64)], describe: impl Fn(u64) -> String) -> CacheRing {
        let newest = owners.iter().map(|o| o.0).max().unwrap_or(0);
        let mut kept: Vec<(u64, u64)> = owners.iter().copied().filter(|o| o.0 + ring > newest).collect();
        kept.sort_unstable();
        kept.dedup();
        Self::rebuilt(ring, &kept, describe, Slot::Restored)
    }

    fn rebuilt(
        ring: u64,
        live: &[(u64, u64)],
        describe: impl Fn(u64) -> String,
        slot_of: fn(u64) -> Slot,
    ) -> CacheRing {
        let cache = CacheRing::new(ring);
        {
            let mut s = cache.state.lock();
            if let (Some(min), Some(max)) = (live.iter().map(|l| l.0).min(), live.iter().map(|l| l.0).max()) {
                assert!(max - min < ring, "live positions span more than the ring");
                s.tail = min;
                s.head = max + 1;
                for &(pos, owner) in live {
                    let slot = &mut s.slots[(pos % ring) as usize];
                    // Two blocks on one position: one of them would read the other's data.
                    assert_eq!(
                        *slot,
                        Slot::Free,
                        "cache ring: position {pos} claimed by {} and by another block",
                        describe(owner)
                    );
                    *slot = slot_of(owner);
                }
                s.live = live.len() as u64;
            }
        }
        cache
    }

    /// Blocks in the ring.
    pub(crate) fn ring_blocks(&self) -> u64 {
        self.ring
    }

    /// Physical block of position `pos`.
    pub(crate) fn block_of(&self, pos: u64) -> u64 {
        pos % self.ring
    }

    /// Positions between tail and head (live, reserved or not yet reclaimed).
    pub(crate) fn used(&self) -> u64 {
        let s = self.state.lock();
        s.head - s.tail
    }

    /// Number of writers waiting for space.
    pub(crate) fn waiting(&self) -> usize {
        self.state.lock().waiting
    }

    /// Reserves `n` consecutive positions, waiting for destage to free space when the ring is full.
    /// Returns the first position, or why no space will come (destage failing, volume closed).
    pub(crate) async fn reserve(&self, n: u64) -> Result<u64, String> {
        assert!(n > 0 && n <= self.ring, "reservation of {n} blocks in a ring of {}", self.ring);
        loop {
            let notified = self.space.notified();
            {
                let mut s = self.state.lock();
                if let Some(why) = &s.shut {
                    return Err(why.clone());
                }
                if s.head + n - s.tail <= self.ring {
                    let start = s.head;
                    for p in start..start + n {
                        s.slots[(p % self.ring) as usize] = Slot::Reserved;
                    }
                    s.head += n;
                    return Ok(start);
                }
                if let Some(why) = &s.failed {
                    return Err(why.clone());
                }
                s.waiting += 1;
            }
            self.hungry.notify_one();
            notified.await;
            self.state.lock().waiting -= 1;
        }
    }

    /// Destage cannot free space: fail the writers waiting for it.
    pub(crate) fn fail_waiters(&self, why: String) {
        self.state.lock().failed = Some(why);
        self.space.notify_waiters();
    }

    /// No space will ever come (the volume closed, or takes no more writes): fail the writers
    /// waiting for it and every later reservation.
    pub(crate) fn shut(&self, why: String) {
        self.state.lock().shut.get_or_insert(why);
        self.space.notify_waiters();
    }

    /// Destage works again.
    pub(crate) fn clear_failure(&self) {
        self.state.lock().failed = None;
    }

    /// Marks a reserved position live for logical block `block`.
    pub(crate) fn claim_block(&self, pos: u64, block: u64) {
        let mut s = self.state.lock();
        let slot = s.slot_in_turn(pos, self.ring, |tail, head| {
            format!("claiming {pos} outside [{tail}, {head}) for block {block}")
        });
        assert_eq!(*slot, Slot::Reserved, "cache ring: claiming position {pos} that is not reserved");
        *slot = Slot::Live(block);
        s.hot[(pos % self.ring) as usize] = false;
        s.live += 1;
        assert!(
            s.live <= s.head - s.tail,
            "cache ring: {} live positions between tail and head {}",
            s.live,
            s.head - s.tail
        );
    }

    /// Marks each `(position, block, hot)` hot or not, where the position still holds the block
    /// (a hint: a position freed meanwhile is left alone).
    pub(crate) fn set_hot(&self, marks: impl IntoIterator<Item = (u64, u64, bool)>) {
        let mut s = self.state.lock();
        for (pos, block, hot) in marks {
            let i = (pos % self.ring) as usize;
            if pos >= s.tail && pos < s.head && s.slots[i].owner() == Some(block) {
                s.hot[i] = hot;
            }
        }
    }

    /// Whether each of `positions` was marked hot (false outside this turn of the ring).
    pub(crate) fn hot(&self, positions: impl IntoIterator<Item = u64>) -> Vec<bool> {
        let s = self.state.lock();
        positions
            .into_iter()
            .map(|pos| pos >= s.tail && pos < s.head && s.hot[(pos % self.ring) as usize])
            .collect()
    }

    /// Frees positions (no durable map entry points to them any more) and advances the tail.
    pub(crate) fn release(&self, positions: impl IntoIterator<Item = u64>) {
        self.release_checked(positions.into_iter().map(|pos| (pos, None)));
    }

    /// Frees positions that blocks moved away from (`(position, block)`: the map entry of
    /// `block` pointed at `position` until an update that is durable now): each must still
    /// hold that block, or a position would be freed under another block's data.
    pub(crate) fn release_owned(&self, positions: &[(u64, u64)]) {
        self.release_checked(positions.iter().map(|&(pos, block)| (pos, Some(block))));
    }

    /// [`Self::release`], each position checked against the block it should hold (if given).
    fn release_checked(&self, positions: impl IntoIterator<Item = (u64, Option<u64>)>) {
        let mut s = self.state.lock();
        let mut any = false;
        for (pos, block) in positions {
            let slot = s.slot_in_turn(pos, self.ring, |tail, head| {
                format!("releasing {pos} outside [{tail}, {head})")
            });
            // A position released twice could be handed out while a map entry still points to it.
            assert_ne!(*slot, Slot::Free, "cache ring: position {pos} released twice");
            if let Some(block) = block {
                assert_eq!(
                    slot.owner(),
                    Some(block),
                    "cache ring: freeing position {pos} as block {block}'s old place, but it holds {slot:?}"
                );
            }
            let was_live = slot.owner().is_some();
            *slot = Slot::Free;
            assert!(
                s.live >= u64::from(was_live),
                "cache ring: releasing live position {pos} with none counted live"
            );
            s.live -= u64::from(was_live);
            any = true;
        }
        if !any {
            return;
        }
        let before = s.tail;
        while s.tail < s.head && s.slots[(s.tail % self.ring) as usize] == Slot::Free {
            s.tail += 1;
        }
        if s.tail != before {
            drop(s);
            self.space.notify_waiters();
        }
    }

    /// The oldest live positions and their owners, oldest first, at most `max`.
    pub(crate) fn oldest_live(&self, max: usize) -> Vec<(u64, u64)> {
        let s = self.state.lock();
        let mut out = Vec::new();
        let mut pos = s.tail;
        while pos < s.head && out.len() < max {
            if let Some(owner) = s.slots[(pos % self.ring) as usize].owner() {
                out.push((pos, owner));
            }
            pos += 1;
        }
        out
    }

    /// Every position with an owner (live or restored), oldest first: for the persisted table.
    pub(crate) fn owners(&self) -> Vec<(u64, u64)> {
        self.oldest_live(usize::MAX)
    }

    /// Whether `pos` is a restored position of `block`.
    pub(crate) fn is_restored(&self, pos: u64, block: u64) -> bool {
        let s = self.state.lock();
        pos >= s.tail && pos < s.head && s.slots[(pos % self.ring) as usize] == Slot::Restored(block)
    }

    /// Frees `pos` if it is (still) a restored position of `block`, whose map entry the caller
    /// found pointing elsewhere with no writer between its map update and its frees.
    pub(crate) fn release_if_restored(&self, pos: u64, block: u64) {
        if self.is_restored(pos, block) {
            self.release([pos]);
        }
    }

    /// Live positions (data some block still reads from the cache).
    pub(crate) fn live(&self) -> u64 {
        self.state.lock().live
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn tail_waits_for_live_and_reserved_positions() {
        let cache = CacheRing::new(8);
        let a = cache.reserve(3).await.unwrap();
        let b = cache.reserve(3).await.unwrap();
        assert_eq!((a, b), (0, 3));
        for i in 0..3 {
            cache.claim_block(a + i, 10 + i);
        }
        // b stays reserved (its write is in flight); freeing a advances the tail to b only.
        cache.release([0, 1, 2]);
        assert_eq!(cache.used(), 3);
        for i in 0..3 {
            cache.claim_block(b + i, 20 + i);
        }
        assert_eq!(cache.oldest_live(2), vec![(3, 20), (4, 21)]);
        cache.release([4]);
        assert_eq!(cache.used(), 3, "a hole in the middle does not move the tail");
        cache.release([3, 5]);
        assert_eq!(cache.used(), 0);
    }

    #[tokio::test]
    async fn a_full_ring_makes_writers_wait_until_space_is_freed() {
        let cache = std::sync::Arc::new(CacheRing::new(4));
        let first = cache.reserve(4).await.unwrap();
        let waiter = {
            let cache = cache.clone();
            tokio::spawn(async move { cache.reserve(2).await })
        };
        tokio::task::yield_now().await;
        assert_eq!(cache.waiting(), 1);
        assert!(!waiter.is_finished());
        cache.release([first, first + 1]);
        assert_eq!(waiter.await.unwrap(), Ok(4), "positions keep increasing across the wrap");
        // The ring is full again; with destage failing, a writer that would wait gets the reason.
        assert_eq!(cache.used(), 4);
        cache.fail_waiters("drives gone".into());
        assert_eq!(cache.reserve(1).await, Err("drives gone".into()));
    }

    #[tokio::test]
    #[should_panic(expected = "position 1 released twice")]
    async fn releasing_a_free_position_is_a_bug() {
        let cache = CacheRing::new(8);
        cache.reserve(2).await.unwrap();
        cache.release([1]);
        cache.release([1]);
    }

    #[tokio::test]
    #[should_panic(expected = "releasing 0 outside [2, 2)")]
    async fn releasing_a_position_the_tail_passed_is_a_bug() {
        let cache = CacheRing::new(8);
        cache.reserve(2).await.unwrap();
        cache.release([0, 1]);
        cache.release([0]);
    }

    #[tokio::test]
    async fn a_shut_log_stays_shut_when_destage_works_again() {
        let cache = std::sync::Arc::new(CacheRing::new(4));
        cache.reserve(4).await.unwrap();
        let waiter = {
            let cache = cache.clone();
            tokio::spawn(async move { cache.reserve(2).await })
        };
        tokio::task::yield_now().await;
        assert_eq!(cache.waiting(), 1);
        cache.shut("volume closed".into());
        // A destage batch that was running at the close finishes well: the close still holds.
        cache.clear_failure();
        assert_eq!(waiter.await.unwrap(), Err("volume closed".into()));
        cache.release([0, 1]);
        assert_eq!(cache.reserve(1).await, Err("volume closed".into()), "even with space");
    }

    #[tokio::test]
    #[should_panic(expected = "claiming 0 outside [8, 10)")]
    async fn claiming_a_position_of_an_earlier_turn_of_the_ring_is_a_bug() {
        let cache = CacheRing::new(8);
        let first = cache.reserve(8).await.unwrap();
        cache.release(first..first + 8);
        // Position 8 uses the slot of position 0, and is reserved now.
        assert_eq!(cache.reserve(2).await.unwrap(), 8);
        cache.claim_block(0, 1);
    }

    #[tokio::test]
    #[should_panic(expected = "freeing position 1 as block 9's old place, but it holds Live(8)")]
    async fn freeing_a_position_another_block_holds_is_a_bug() {
        let cache = CacheRing::new(8);
        cache.reserve(2).await.unwrap();
        cache.claim_block(0, 7);
        cache.claim_block(1, 8);
        cache.release_owned(&[(0, 7)]);
        cache.release_owned(&[(1, 9)]);
    }

    #[test]
    #[should_panic(expected = "position 100 claimed by block 7 and by another block")]
    fn a_position_two_map_entries_claim_is_a_bug() {
        CacheRing::with_owners(16, &[(100, 3), (100, 7)], |b| format!("block {b}"));
    }

    #[test]
    fn restored_positions_are_freed_only_when_found_stale() {
        // 3 is a whole ring behind the newest position (40): free when 40 was reserved.
        let cache =
            CacheRing::restored(16, &[(30, 1), (3, 2), (35, 4), (40, 5), (35, 4)], |b| format!("block {b}"));
        assert_eq!(cache.owners(), vec![(30, 1), (35, 4), (40, 5)]);
        assert_eq!(cache.live(), 3);
        cache.release_if_restored(30, 9);
        assert_eq!(cache.live(), 3, "another block's position stays");
        cache.release_if_restored(30, 1);
        assert_eq!((cache.live(), cache.used()), (2, 6), "the tail moves past the freed position");
        cache.release([35]);
        assert_eq!(cache.owners(), vec![(40, 5)]);
    }

    #[test]
    fn live_positions_rebuild_the_log() {
        let cache = CacheRing::with_owners(16, &[(100, 3), (103, 7)], |b| format!("block {b}"));
        assert_eq!(cache.used(), 4);
        assert_eq!(cache.live(), 2);
        assert_eq!(cache.oldest_live(8), vec![(100, 3), (103, 7)]);
        assert_eq!(cache.block_of(103), 7);
    }
}
