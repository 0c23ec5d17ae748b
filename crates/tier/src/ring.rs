//! The write cache ring: ever-increasing 64-bit positions over a ring of cache blocks.
//!
//! A position is *reserved* while its data is being written, *live* while a map entry points to
//! it, and free otherwise. The tail advances over free positions only, so a reserved or live
//! block is never reused; the head never passes the tail by more than the ring size. Writers that
//! find the ring full wait (back-pressure) and wake the mover.
//!
//! The ring grows ([`CacheRing::begin_growth`], docs/design/log-structured-volumes.md, "A
//! write cache that grows"): positions from a *base* on map into the larger ring, the new blocks
//! first; positions before it keep the old mapping until the tail passes them ([`RingLayout`]).
//!
//! Asserted: a position is claimed only while reserved, freed only while reserved or live and
//! only in the ring's current turn, and freed as a block's old place only while it holds that
//! block ([`CacheRing::release_owned`]); two blocks never hold one position; the live count
//! stays within the positions between tail and head.

use std::ops::Range;

use parking_lot::Mutex;
use tokio::sync::Notify;

/// How the positions from `base` on map to cache blocks: position `base` is block `off`, and
/// each next position the next block, around a ring of `blocks`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Epoch {
    pub base: u64,
    pub off: u64,
    pub blocks: u64,
}

impl Epoch {
    fn block_of(&self, pos: u64) -> u64 {
        // A position before the base (one a grow has left behind: never live) still maps into
        // the ring, so that a stale read reads some block of it and finds its checksum wrong.
        let rel = i128::from(pos) - i128::from(self.base) + i128::from(self.off);
        rel.rem_euclid(i128::from(self.blocks)) as u64
    }
}

/// Where each position of the ring lies: positions from `cur.base` on in the current ring,
/// those before it in the ring before the last growth (`prev`); positions `skip_from..cur.base`
/// were never handed out (the growth started the new ring at a position whose old block is the
/// ring's first). Positions before `prev.base` are never live (a growth waits until the tail
/// has passed the previous one's base). A ring that never grew has `prev == cur`, base 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RingLayout {
    pub prev: Epoch,
    pub cur: Epoch,
    pub skip_from: u64,
}

impl RingLayout {
    /// A ring of `blocks` that never grew.
    pub(crate) fn fixed(blocks: u64) -> RingLayout {
        let e = Epoch { base: 0, off: 0, blocks };
        RingLayout { prev: e, cur: e, skip_from: 0 }
    }

    /// Whether the ring ever grew (a header says so in format 6).
    pub(crate) fn grown(&self) -> bool {
        *self != RingLayout::fixed(self.cur.blocks)
    }

    /// Blocks in the ring now.
    pub(crate) fn blocks(&self) -> u64 {
        self.cur.blocks
    }

    fn epoch(&self, pos: u64) -> &Epoch {
        if pos >= self.cur.base { &self.cur } else { &self.prev }
    }

    /// The cache block of position `pos`.
    pub(crate) fn block_of(&self, pos: u64) -> u64 {
        self.epoch(pos).block_of(pos)
    }

    /// Positions from `pos` on that lie in consecutive cache blocks (up to where the ring, or
    /// the epoch, ends).
    pub(crate) fn contiguous(&self, pos: u64) -> u64 {
        let e = self.epoch(pos);
        let left = e.blocks - e.block_of(pos);
        if pos < self.cur.base { left.min(self.cur.base - pos) } else { left }
    }

    /// Whether position `pos` starts a new run of cache blocks (it does not follow `pos - 1`'s
    /// block in one read).
    pub(crate) fn breaks_at(&self, pos: u64) -> bool {
        pos == self.cur.base || pos == self.prev.base || self.block_of(pos) == 0
    }

    /// Whether position `q` was free once position `newest` was handed out: `newest` was a
    /// ring's length or more past it (the tail had passed it), or reused its block, or `q` is
    /// before the previous ring (free before the last growth).
    pub(crate) fn stale(&self, q: u64, newest: u64) -> bool {
        q + self.epoch(newest).blocks <= newest || self.first_reuse(q).is_none_or(|r| r <= newest)
    }

    /// The first position after `q` that could reuse `q`'s block: once a position that late was
    /// handed out, `q` was free (the tail had passed it). `None` for a position before the
    /// previous ring, which was free before the last growth.
    fn first_reuse(&self, q: u64) -> Option<u64> {
        if q >= self.cur.base {
            return Some(q + self.cur.blocks);
        }
        if q < self.prev.base {
            return None;
        }
        // In the previous ring: its own next turn, unless that falls in the positions skipped
        // (or later); then the current ring's first position on the same block.
        if q + self.prev.blocks < self.skip_from {
            return Some(q + self.prev.blocks);
        }
        let x = self.prev.block_of(q);
        Some(self.cur.base + (x + self.cur.blocks - self.cur.off) % self.cur.blocks)
    }

    /// The rules a layout keeps (a header's is checked against them when read and written).
    pub(crate) fn check(&self) -> Result<(), String> {
        let (p, c) = (self.prev, self.cur);
        let ok = if self.grown() {
            p.blocks > 0
                && c.blocks > p.blocks
                && c.off == p.blocks
                && p.base <= self.skip_from
                && self.skip_from <= c.base
                && c.base - self.skip_from < p.blocks
                && p.off < p.blocks
                && p.block_of(c.base) == 0
                && c.base < 1 << 62
        } else {
            c.blocks > 0
        };
        if ok { Ok(()) } else { Err(format!("the cache ring's layout breaks its rules: {self:?}")) }
    }

    /// The layout after a growth to `blocks` starting at the first position from `head` on
    /// whose block is the ring's first.
    fn grown_to(&self, head: u64, blocks: u64) -> RingLayout {
        let c = self.cur;
        let base = head + (c.blocks - c.block_of(head)) % c.blocks;
        RingLayout { prev: c, cur: Epoch { base, off: c.blocks, blocks }, skip_from: head }
    }
}

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
    layout: RingLayout,
    /// Positions never handed out (a growth's, until the tail passes them).
    skip: Range<u64>,
    /// Set while a growth is being made durable: nothing is reserved meanwhile.
    frozen: bool,
}

impl State {
    /// The slot of `pos`, which must lie in this turn of the ring, `[tail, head)`: outside it the
    /// slot may belong to another position, and a claim or release would hit that one.
    /// `message(tail, head)` says what the caller was doing, for the panic.
    fn slot_in_turn(&mut self, pos: u64, message: impl FnOnce(u64, u64) -> String) -> &mut Slot {
        assert!(
            pos >= self.tail && pos < self.head && !self.skip.contains(&pos),
            "cache ring: {}",
            message(self.tail, self.head)
        );
        let i = self.index(pos);
        &mut self.slots[i]
    }

    fn index(&self, pos: u64) -> usize {
        self.layout.block_of(pos) as usize
    }

    /// Whether `pos` is between tail and head and was handed out.
    fn in_turn(&self, pos: u64) -> bool {
        pos >= self.tail && pos < self.head && !self.skip.contains(&pos)
    }

    /// Moves the tail over free positions (and positions never handed out).
    fn advance_tail(&mut self) {
        while self.tail < self.head {
            if self.skip.contains(&self.tail) {
                self.tail = self.skip.end;
            } else if self.slots[self.index(self.tail)] == Slot::Free {
                self.tail += 1;
            } else {
                break;
            }
        }
    }
}

/// The write cache ring of one volume.
#[derive(Debug)]
pub(crate) struct CacheRing {
    state: Mutex<State>,
    space: Notify,
    /// Wakes the mover when a writer is waiting for space.
    pub(crate) hungry: Notify,
}

impl CacheRing {
    /// An empty log laid out as `layout` (positions start at its current base).
    pub(crate) fn new(layout: RingLayout) -> CacheRing {
        layout.check().expect("a valid ring layout");
        let blocks = usize::try_from(layout.blocks()).expect("ring fits");
        let start = layout.cur.base;
        CacheRing {
            state: Mutex::new(State {
                head: start,
                tail: start,
                slots: vec![Slot::Free; blocks],
                hot: vec![false; blocks],
                live: 0,
                waiting: 0,
                failed: None,
                shut: None,
                layout,
                skip: 0..0,
                frozen: false,
            }),
            space: Notify::new(),
            hungry: Notify::new(),
        }
    }

    /// A log holding the live positions `live` (position, owner), found at open; `describe`
    /// names an owner for the message if two claim one position.
    pub(crate) fn with_owners(
        layout: RingLayout,
        live: &[(u64, u64)],
        describe: impl Fn(u64) -> String,
    ) -> CacheRing {
        Self::rebuilt(layout, live, describe, Slot::Live)
    }

    /// A log holding the positions `owners` (position, owner) of a persisted table and of the
    /// replayed map deltas, as [`Slot::Restored`] ones. Positions free when the newest was
    /// handed out ([`RingLayout::stale`]) are dropped.
    pub(crate) fn restored(
        layout: RingLayout,
        owners: &[(u64, u64)],
        describe: impl Fn(u64) -> String,
    ) -> CacheRing {
        let newest = owners.iter().map(|o| o.0).max().unwrap_or(0);
        let mut kept: Vec<(u64, u64)> =
            owners.iter().copied().filter(|o| !layout.stale(o.0, newest)).collect();
        kept.sort_unstable();
        kept.dedup();
        Self::rebuilt(layout, &kept, describe, Slot::Restored)
    }

    fn rebuilt(
        layout: RingLayout,
        live: &[(u64, u64)],
        describe: impl Fn(u64) -> String,
        slot_of: fn(u64) -> Slot,
    ) -> CacheRing {
        let cache = CacheRing::new(layout);
        {
            let mut s = cache.state.lock();
            if let (Some(min), Some(max)) = (live.iter().map(|l| l.0).min(), live.iter().map(|l| l.0).max()) {
                assert!(
                    min >= layout.prev.base && max - min < layout.blocks(),
                    "live positions {min}..={max} do not fit the ring {layout:?}"
                );
                s.tail = min;
                s.head = max + 1;
                let c = layout.cur.base;
                if s.head <= c {
                    // Nothing handed out in the current ring yet: it starts at its base.
                    s.skip = s.head..c;
                    s.head = c;
                } else if s.tail < c {
                    s.skip = layout.skip_from..c;
                }
                for &(pos, owner) in live {
                    assert!(!s.skip.contains(&pos), "cache ring: position {pos} was never handed out");
                    let i = s.index(pos);
                    let slot = &mut s.slots[i];
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
        self.state.lock().layout.blocks()
    }

    /// Where the positions lie (a position's block never changes while it is handed out).
    pub(crate) fn layout(&self) -> RingLayout {
        self.state.lock().layout
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
        loop {
            let notified = self.space.notified();
            {
                let mut s = self.state.lock();
                if let Some(got) = Self::take(&mut s, n)? {
                    return Ok(got);
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

    /// Reserves `n` positions if there is room now (and no growth is being made durable).
    fn take(s: &mut State, n: u64) -> Result<Option<u64>, String> {
        let ring = s.layout.blocks();
        assert!(n > 0 && n <= ring, "reservation of {n} blocks in a ring of {ring}");
        if let Some(why) = &s.shut {
            return Err(why.clone());
        }
        if s.frozen || s.head + n - s.tail > ring {
            return Ok(None);
        }
        let start = s.head;
        for p in start..start + n {
            let i = s.index(p);
            s.slots[i] = Slot::Reserved;
        }
        s.head += n;
        Ok(Some(start))
    }

    /// Whether a growth could begin now: none is being made durable, and no position of the
    /// ring before the last growth is in use.
    pub(crate) fn may_grow(&self) -> bool {
        let s = self.state.lock();
        !s.frozen && s.shut.is_none() && s.tail >= s.layout.cur.base
    }

    /// Starts a growth to `blocks`: holds new reservations until [`Self::finish_growth`] or
    /// [`Self::cancel_growth`] and returns the layout to make durable, or `None` while
    /// positions of the ring before the last growth are still in use (or the ring is that
    /// large already).
    pub(crate) fn begin_growth(&self, blocks: u64) -> Option<RingLayout> {
        let mut s = self.state.lock();
        if s.frozen || blocks <= s.layout.blocks() || s.tail < s.layout.cur.base || s.shut.is_some() {
            return None;
        }
        s.frozen = true;
        let next = s.layout.grown_to(s.head, blocks);
        next.check().expect("a grown ring keeps the layout's rules");
        Some(next)
    }

    /// The growth `layout` is durable: new reservations take its positions.
    pub(crate) fn finish_growth(&self, layout: RingLayout) {
        {
            let mut s = self.state.lock();
            assert!(
                s.frozen && s.head == layout.skip_from,
                "cache ring: a growth finished that was not begun"
            );
            s.skip = s.head..layout.cur.base;
            s.head = layout.cur.base;
            s.layout = layout;
            let blocks = usize::try_from(layout.blocks()).expect("ring fits");
            s.slots.resize(blocks, Slot::Free);
            s.hot.resize(blocks, false);
            s.frozen = false;
            s.advance_tail();
        }
        self.space.notify_waiters();
    }

    /// The growth begun is not made: reservations go on in the ring as it was.
    pub(crate) fn cancel_growth(&self) {
        self.state.lock().frozen = false;
        self.space.notify_waiters();
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
        let slot = s.slot_in_turn(pos, |tail, head| {
            format!("claiming {pos} outside [{tail}, {head}) for block {block}")
        });
        assert_eq!(*slot, Slot::Reserved, "cache ring: claiming position {pos} that is not reserved");
        *slot = Slot::Live(block);
        let i = s.index(pos);
        s.hot[i] = false;
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
            let i = s.index(pos);
            if s.in_turn(pos) && s.slots[i].owner() == Some(block) {
                s.hot[i] = hot;
            }
        }
    }

    /// Whether each of `positions` was marked hot (false outside this turn of the ring).
    pub(crate) fn hot(&self, positions: impl IntoIterator<Item = u64>) -> Vec<bool> {
        let s = self.state.lock();
        positions.into_iter().map(|pos| s.in_turn(pos) && s.hot[s.index(pos)]).collect()
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
            let slot = s.slot_in_turn(pos, |tail, head| format!("releasing {pos} outside [{tail}, {head})"));
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
        s.advance_tail();
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
            if s.skip.contains(&pos) {
                pos = s.skip.end;
                continue;
            }
            if let Some(owner) = s.slots[s.index(pos)].owner() {
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
        s.in_turn(pos) && s.slots[s.index(pos)] == Slot::Restored(block)
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
        let cache = CacheRing::new(RingLayout::fixed(8));
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
        let cache = std::sync::Arc::new(CacheRing::new(RingLayout::fixed(4)));
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
        let cache = CacheRing::new(RingLayout::fixed(8));
        cache.reserve(2).await.unwrap();
        cache.release([1]);
        cache.release([1]);
    }

    #[tokio::test]
    #[should_panic(expected = "releasing 0 outside [2, 2)")]
    async fn releasing_a_position_the_tail_passed_is_a_bug() {
        let cache = CacheRing::new(RingLayout::fixed(8));
        cache.reserve(2).await.unwrap();
        cache.release([0, 1]);
        cache.release([0]);
    }

    #[tokio::test]
    async fn a_shut_log_stays_shut_when_destage_works_again() {
        let cache = std::sync::Arc::new(CacheRing::new(RingLayout::fixed(4)));
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
        let cache = CacheRing::new(RingLayout::fixed(8));
        let first = cache.reserve(8).await.unwrap();
        cache.release(first..first + 8);
        // Position 8 uses the slot of position 0, and is reserved now.
        assert_eq!(cache.reserve(2).await.unwrap(), 8);
        cache.claim_block(0, 1);
    }

    #[tokio::test]
    #[should_panic(expected = "freeing position 1 as block 9's old place, but it holds Live(8)")]
    async fn freeing_a_position_another_block_holds_is_a_bug() {
        let cache = CacheRing::new(RingLayout::fixed(8));
        cache.reserve(2).await.unwrap();
        cache.claim_block(0, 7);
        cache.claim_block(1, 8);
        cache.release_owned(&[(0, 7)]);
        cache.release_owned(&[(1, 9)]);
    }

    #[test]
    #[should_panic(expected = "position 100 claimed by block 7 and by another block")]
    fn a_position_two_map_entries_claim_is_a_bug() {
        CacheRing::with_owners(RingLayout::fixed(16), &[(100, 3), (100, 7)], |b| format!("block {b}"));
    }

    #[test]
    fn restored_positions_are_freed_only_when_found_stale() {
        // 3 is a whole ring behind the newest position (40): free when 40 was reserved.
        let cache =
            CacheRing::restored(RingLayout::fixed(16), &[(30, 1), (3, 2), (35, 4), (40, 5), (35, 4)], |b| {
                format!("block {b}")
            });
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
        let cache =
            CacheRing::with_owners(RingLayout::fixed(16), &[(100, 3), (103, 7)], |b| format!("block {b}"));
        assert_eq!(cache.used(), 4);
        assert_eq!(cache.live(), 2);
        assert_eq!(cache.oldest_live(8), vec![(100, 3), (103, 7)]);
        assert_eq!(cache.layout().block_of(103), 7);
    }

    #[tokio::test]
    async fn a_growth_keeps_cached_blocks_where_they_are_and_hands_out_the_new_ones_first() {
        let cache = std::sync::Arc::new(CacheRing::new(RingLayout::fixed(8)));
        let a = cache.reserve(6).await.unwrap();
        for k in 0..6 {
            cache.claim_block(a + k, 100 + k);
        }
        cache.release([0, 1]);
        // Head 6, tail 2: the larger ring starts at 8, the first position whose old block is 0.
        let grown = cache.begin_growth(16).expect("nothing of an earlier growth is in use");
        assert_eq!((grown.cur.base, grown.cur.off, grown.skip_from), (8, 8, 6));
        // Reservations wait while the growth is made durable.
        let waiter = {
            let cache = cache.clone();
            tokio::spawn(async move { cache.reserve(4).await })
        };
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "no position is handed out during a growth");
        cache.finish_growth(grown);
        assert_eq!(waiter.await.unwrap(), Ok(8), "positions 6 and 7 are skipped");
        let ring = cache.layout();
        assert_eq!((ring.block_of(5), ring.block_of(8), ring.block_of(11)), (5, 8, 11));
        assert_eq!(ring.contiguous(8), 8, "the new blocks first");
        assert_eq!(ring.contiguous(5), 3, "an old position's run ends with the old ring");
        assert!(ring.breaks_at(8) && !ring.breaks_at(9));
        // The larger ring fills: 8..16 in the new blocks, then 16..20 in blocks 0..4, which the
        // tail must have passed (positions 2..5 still hold blocks 2..5).
        let b = cache.reserve(4).await.unwrap();
        assert_eq!((b, cache.layout().block_of(b)), (12, 12));
        assert_eq!(cache.layout().block_of(16), 0);
        let full = {
            let cache = cache.clone();
            tokio::spawn(async move { cache.reserve(3).await })
        };
        tokio::task::yield_now().await;
        assert!(!full.is_finished(), "16 positions from the tail (2) on are in use");
        cache.release([2, 3]);
        assert_eq!(full.await.unwrap(), Ok(16));
        assert_eq!(cache.owners(), vec![(4, 104), (5, 105)]);
        // A second growth waits until the tail has passed the first one's base.
        assert!(cache.begin_growth(32).is_none());
        cache.release([4, 5]);
        cache.release(8..19);
        let again = cache.begin_growth(32).expect("the old ring is empty");
        assert_eq!((again.prev, again.cur.base, again.cur.off), (grown.cur, 32, 16));
        cache.cancel_growth();
        assert_eq!(cache.reserve(1).await, Ok(19), "a cancelled growth changes nothing");
    }

    /// A small deterministic generator for the model test (no dependency).
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
    }

    /// No two positions in use share a block.
    fn check_blocks(cache: &CacheRing) {
        let s = cache.state.lock();
        let mut seen = std::collections::HashMap::new();
        let mut pos = s.tail;
        while pos < s.head {
            if s.skip.contains(&pos) {
                pos = s.skip.end;
                continue;
            }
            if s.slots[s.index(pos)] != Slot::Free
                && let Some(other) = seen.insert(s.layout.block_of(pos), pos)
            {
                panic!("positions {other} and {pos} share block {}", s.layout.block_of(pos));
            }
            pos += 1;
        }
    }

    #[test]
    fn growths_among_random_writes_and_frees_never_put_two_positions_on_one_block_and_restore_keeps_every_live_one()
     {
        for seed in 1..=200u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
            let mut cache = CacheRing::new(RingLayout::fixed(4 + rng.below(8)));
            let mut live: std::collections::BTreeMap<u64, u64> = Default::default();
            let mut history: Vec<(u64, u64)> = Vec::new();
            let mut owner = 0;
            for _ in 0..400 {
                match rng.below(10) {
                    0..=3 => {
                        let n = 1 + rng.below(3.min(cache.ring_blocks()));
                        let got = CacheRing::take(&mut cache.state.lock(), n).unwrap();
                        if let Some(start) = got {
                            for p in start..start + n {
                                owner += 1;
                                cache.claim_block(p, owner);
                                live.insert(p, owner);
                                history.push((p, owner));
                            }
                        }
                    }
                    4..=7 if !live.is_empty() => {
                        let k = rng.below(live.len() as u64) as usize;
                        let (&p, &o) = live.iter().nth(k).unwrap();
                        cache.release_owned(&[(p, o)]);
                        live.remove(&p);
                    }
                    8 => {
                        let blocks = cache.ring_blocks() + 1 + rng.below(2 * cache.ring_blocks());
                        if let Some(layout) = cache.begin_growth(blocks) {
                            if rng.below(4) == 0 {
                                cache.cancel_growth();
                            } else {
                                cache.finish_growth(layout);
                            }
                        }
                    }
                    _ => {
                        // A crash: the table names the live positions and some that were live
                        // once (freed since); open keeps every live one, on its block.
                        let layout = cache.layout();
                        let mut owners: Vec<(u64, u64)> = live.iter().map(|(&p, &o)| (p, o)).collect();
                        for _ in 0..rng.below(6) {
                            if !history.is_empty() {
                                let h = history[rng.below(history.len() as u64) as usize];
                                if !live.contains_key(&h.0) {
                                    owners.push(h);
                                }
                            }
                        }
                        let back = CacheRing::restored(layout, &owners, |b| format!("block {b}"));
                        let kept = back.owners();
                        for (&p, &o) in &live {
                            assert!(kept.contains(&(p, o)), "seed {seed}: live position {p} dropped at open");
                        }
                        check_blocks(&back);
                        // Destage finds the stale ones stale and frees them.
                        for (p, o) in kept {
                            if !live.contains_key(&p) {
                                back.release_if_restored(p, o);
                            }
                        }
                        let live_now: Vec<(u64, u64)> = live.iter().map(|(&p, &o)| (p, o)).collect();
                        assert_eq!(back.owners(), live_now);
                        // Until a checkpoint, a later open may find what this one found.
                        history = owners;
                        cache = back;
                    }
                }
                check_blocks(&cache);
                let s = cache.state.lock();
                assert!(s.head - s.tail <= 2 * s.layout.blocks());
            }
        }
    }
}
