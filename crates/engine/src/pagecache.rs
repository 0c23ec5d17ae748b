//! A bounded cache of fixed-size metadata pages that live on disk: the drives' checksum tables
//! (drive/csum.rs) and the maps of log-structured volumes use it.
//!
//! The cache only keeps pages; reading a missing page and writing dirty ones back is the
//! owner's job (each knows its device and its order rules). What the cache guarantees:
//!
//! * a page is evicted (CLOCK, second chance) only when it is *clean*, *unheld* (no
//!   [`Arc`] to its slot outside the cache) and not *frozen*, so a change can never be lost by
//!   eviction: it stays until the owner took it with [`PageCache::take_dirty`] and the write
//!   finished (the owner holds the taken slots until then);
//! * a frozen page (the owner's choice: a damaged page being repaired) is never evicted and
//!   never handed out for write-back;
//! * [`PageCache::over_budget`] says when the owner should write back, because only dirty
//!   pages are left to evict.
//!
//! The lock is held for lookups, inserts and evictions only, never across I/O.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst};

use smallvec::SmallVec;

/// One cached page and its flags.
#[derive(Debug)]
pub struct Slot<P> {
    page: P,
    dirty: AtomicBool,
    frozen: AtomicBool,
    /// CLOCK's second-chance bit.
    referenced: AtomicBool,
}

impl<P> Slot<P> {
    /// The page.
    pub fn page(&self) -> &P {
        &self.page
    }

    /// True while the page is frozen (see [`PageCache::set_frozen`]).
    pub fn is_frozen(&self) -> bool {
        self.frozen.load(SeqCst)
    }
}

/// Counters of one cache.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PageCacheStats {
    /// Pages in memory now.
    pub resident_pages: u64,
    /// The budget in pages.
    pub budget_pages: u64,
    /// Pages inserted after a miss (read from disk by the owner).
    pub loaded_pages: u64,
    /// Pages dropped by the CLOCK hand.
    pub evicted_pages: u64,
}

/// Page ids hash with foldhash (seeded per process), not std's SipHash: a lookup per page of
/// every request (checksum tables, maps) spent a few percent of a log volume's write CPU
/// hashing (docs/design/datapath.md §6).
type Slots<P> = HashMap<u64, Arc<Slot<P>>, foldhash::fast::RandomState>;

/// The slots a lookup found (`None` for misses), in the order asked: inline for the one or two
/// pages nearly every request touches, so a lookup allocates nothing.
pub type Looked<P> = SmallVec<[Option<Arc<Slot<P>>>; 4]>;

#[derive(Debug)]
struct Resident<P> {
    slots: Slots<P>,
    /// Resident page ids in CLOCK order.
    clock: Vec<u64>,
    hand: usize,
    /// Pages whose dirty flag went from clear to set since they were last taken.
    dirty: Vec<u64>,
}

impl<P> Resident<P> {
    fn evict(&mut self, budget: usize) -> u64 {
        let mut evicted = 0;
        let mut steps = 2 * self.clock.len();
        while self.slots.len() > budget && steps > 0 && !self.clock.is_empty() {
            steps -= 1;
            if self.hand >= self.clock.len() {
                self.hand = 0;
            }
            let id = self.clock[self.hand];
            // A page forgotten (or forgotten and cached again) leaves its old place on the
            // clock behind: dropped here, where the hand finds it.
            let Some(slot) = self.slots.get(&id) else {
                self.clock.swap_remove(self.hand);
                continue;
            };
            let evictable = Arc::strong_count(slot) == 1 && !slot.dirty.load(SeqCst) && !slot.is_frozen();
            if evictable && !slot.referenced.swap(false, Relaxed) {
                self.slots.remove(&id);
                self.clock.swap_remove(self.hand);
                evicted += 1;
            } else {
                self.hand += 1;
            }
        }
        evicted
    }
}

/// A bounded cache of pages keyed by page index.
#[derive(Debug)]
pub struct PageCache<P> {
    budget: AtomicUsize,
    resident: parking_lot::Mutex<Resident<P>>,
    /// `resident.dirty.len()` and `resident.slots.len()`, readable without the lock.
    dirty_len: AtomicUsize,
    resident_len: AtomicUsize,
    loaded: AtomicU64,
    evicted: AtomicU64,
    /// Write-backs that took pages so far ([`PageCache::load_ticket`]).
    write_backs: AtomicU64,
}

/// What a load that missed takes before its lookup, and gives [`PageCache::insert_loaded`]
/// with what it read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadTicket(u64);

impl<P> PageCache<P> {
    /// An empty cache of at most `budget` pages (at least one).
    pub fn new(budget: u64) -> PageCache<P> {
        PageCache {
            budget: AtomicUsize::new(Self::clamp(budget)),
            resident: parking_lot::Mutex::new(Resident {
                slots: Slots::default(),
                clock: Vec::new(),
                hand: 0,
                dirty: Vec::new(),
            }),
            dirty_len: AtomicUsize::new(0),
            resident_len: AtomicUsize::new(0),
            loaded: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
            write_backs: AtomicU64::new(0),
        }
    }

    fn clamp(budget: u64) -> usize {
        usize::try_from(budget.max(1)).unwrap_or(usize::MAX)
    }

    /// Sets the budget and evicts down to it what can go.
    pub fn set_budget(&self, budget: u64) {
        self.budget.store(Self::clamp(budget), Relaxed);
        self.trim();
    }

    /// Evicts down to the budget what can be evicted (after a write-back made pages clean).
    pub fn trim(&self) {
        let mut r = self.resident.lock();
        let evicted = r.evict(self.budget.load(Relaxed));
        self.note(&r, evicted);
    }

    fn note(&self, r: &Resident<P>, evicted: u64) {
        self.resident_len.store(r.slots.len(), Relaxed);
        self.dirty_len.store(r.dirty.len(), Relaxed);
        if evicted > 0 {
            self.evicted.fetch_add(evicted, Relaxed);
        }
    }

    /// The counters.
    pub fn stats(&self) -> PageCacheStats {
        PageCacheStats {
            resident_pages: self.resident_len.load(Relaxed) as u64,
            budget_pages: self.budget.load(Relaxed) as u64,
            loaded_pages: self.loaded.load(Relaxed),
            evicted_pages: self.evicted.load(Relaxed),
        }
    }

    /// Pages marked dirty and not yet taken for write-back.
    pub fn dirty_pages(&self) -> u64 {
        self.dirty_len.load(Relaxed) as u64
    }

    /// True when more pages are cached than the budget allows and some are dirty: only a
    /// write-back can make room.
    pub fn over_budget(&self) -> bool {
        self.resident_len.load(Relaxed) > self.budget.load(Relaxed) && self.dirty_len.load(Relaxed) > 0
    }

    /// The cached slots of pages `first..first + count` (`None` for misses), marked recently
    /// used.
    pub fn lookup(&self, first: u64, count: u64) -> Looked<P> {
        self.lookup_ids(first..first + count)
    }

    /// The cached slots of pages `ids` (`None` for misses), marked recently used: one look
    /// under the lock for pages in no particular order (a batch of map updates).
    pub fn lookup_each(&self, ids: &[u64]) -> Looked<P> {
        self.lookup_ids(ids.iter().copied())
    }

    fn lookup_ids(&self, ids: impl Iterator<Item = u64>) -> Looked<P> {
        let r = self.resident.lock();
        ids.map(|id| {
            let slot = r.slots.get(&id).cloned();
            // Written only when it changes: a store on every hit would move the slot's cache
            // line to this core each time another core had read it.
            if let Some(s) = &slot
                && !s.referenced.load(Relaxed)
            {
                s.referenced.store(true, Relaxed);
            }
            slot
        })
        .collect()
    }

    /// The cached slot of page `id`, if resident (does not count as a use).
    pub fn peek(&self, id: u64) -> Option<Arc<Slot<P>>> {
        self.resident.lock().slots.get(&id).cloned()
    }

    /// Inserts pages read after a miss (`frozen`: see [`PageCache::set_frozen`]), keeping a page
    /// another request inserted meanwhile (it may have changed since), then evicts down to the
    /// budget. Returns the resident slots in order, and for each whether it was this insert.
    ///
    /// What was read may be older than a version another request loaded, changed, wrote back
    /// and saw evicted while the read was on its way: a loader that others may race uses
    /// [`PageCache::load_ticket`] and [`PageCache::insert_loaded`] instead.
    pub fn insert(&self, pages: Vec<(u64, P, bool)>) -> Vec<(Arc<Slot<P>>, bool)> {
        let mut r = self.resident.lock();
        self.insert_locked(&mut r, pages)
    }

    /// Taken by a load before the lookup that missed: [`PageCache::insert_loaded`] refuses what
    /// it read if a write-back took pages since. A page missing at the lookup can only get to
    /// disk newer than the load read it (and be evicted again) through such a write-back: a
    /// page is evicted only clean and unheld, and a write-back holds what it took until written.
    pub fn load_ticket(&self) -> LoadTicket {
        LoadTicket(self.write_backs.load(SeqCst))
    }

    /// [`PageCache::insert`] of pages read after the lookup of `ticket`, or `None` (nothing
    /// inserted) when a write-back took pages since: the caller looks up and reads again.
    pub fn insert_loaded(
        &self,
        ticket: LoadTicket,
        pages: Vec<(u64, P, bool)>,
    ) -> Option<Vec<(Arc<Slot<P>>, bool)>> {
        let mut r = self.resident.lock();
        if self.write_backs.load(SeqCst) != ticket.0 {
            return None;
        }
        Some(self.insert_locked(&mut r, pages))
    }

    fn insert_locked(&self, r: &mut Resident<P>, pages: Vec<(u64, P, bool)>) -> Vec<(Arc<Slot<P>>, bool)> {
        let mut out = Vec::with_capacity(pages.len());
        for (id, page, frozen) in pages {
            if let Some(s) = r.slots.get(&id) {
                out.push((Arc::clone(s), false));
                continue;
            }
            let slot = Arc::new(Slot {
                page,
                dirty: AtomicBool::new(false),
                frozen: AtomicBool::new(frozen),
                referenced: AtomicBool::new(true),
            });
            r.slots.insert(id, Arc::clone(&slot));
            r.clock.push(id);
            self.loaded.fetch_add(1, Relaxed);
            out.push((slot, true));
        }
        let evicted = r.evict(self.budget.load(Relaxed));
        self.note(r, evicted);
        out
    }

    /// Drops page `id` from the cache, dirty or not: the owner freed the page on disk, and
    /// whatever it held must not be written or read again.
    /// Its places on the clock and in the dirty list go lazily (the hand and the next
    /// [`PageCache::take_dirty`] skip them), so this costs no scan.
    pub fn forget(&self, id: u64) {
        let mut r = self.resident.lock();
        r.slots.remove(&id);
        self.note(&r, 0);
    }

    /// Marks page `id` (whose slot the caller holds) dirty. Call it *after* changing the page:
    /// a write-back that took the page before this either saw the change or leaves it dirty.
    pub fn mark_dirty(&self, id: u64, slot: &Slot<P>) {
        if !slot.dirty.swap(true, SeqCst) {
            let mut r = self.resident.lock();
            r.dirty.push(id);
            self.dirty_len.store(r.dirty.len(), Relaxed);
        }
    }

    /// Takes the dirty pages to write back, sorted, clearing their flags; frozen ones are left
    /// out (they become dirty again when thawed). The caller holds the returned slots until
    /// their write is done (so they cannot be evicted, then read back stale, in between) and
    /// gives them to [`PageCache::redirty`] if it fails.
    pub fn take_dirty(&self) -> Vec<(u64, Arc<Slot<P>>)> {
        let mut r = self.resident.lock();
        let mut ids = std::mem::take(&mut r.dirty);
        self.dirty_len.store(0, Relaxed);
        // A dirty page stays cached unless it was forgotten: then its id is skipped, or, if it
        // was cached again since, taken only if the new page is dirty itself.
        ids.sort_unstable();
        ids.dedup();
        let mut out: Vec<(u64, Arc<Slot<P>>)> = ids
            .into_iter()
            .filter_map(|id| {
                let slot = Arc::clone(r.slots.get(&id)?);
                if !slot.dirty.swap(false, SeqCst) {
                    return None;
                }
                (!slot.is_frozen()).then_some((id, slot))
            })
            .collect();
        out.sort_by_key(|(id, _)| *id);
        // Under the lock: a load that checks its ticket under it either inserted before these
        // pages were taken (they are held, so its insert kept them) or is refused.
        if !out.is_empty() {
            self.write_backs.fetch_add(1, SeqCst);
        }
        out
    }

    /// Puts taken pages back in the dirty set (their write-back failed).
    pub fn redirty(&self, pages: &[(u64, Arc<Slot<P>>)]) {
        for (id, slot) in pages {
            self.mark_dirty(*id, slot);
        }
    }

    /// Freezes or thaws page `id` (resident). A frozen page is never evicted or written back;
    /// thawing marks it dirty so it is written at the next write-back.
    pub fn set_frozen(&self, id: u64, frozen: bool) {
        let slot = self.peek(id).unwrap_or_else(|| panic!("page {id} is not cached"));
        if slot.frozen.swap(frozen, SeqCst) && !frozen {
            self.mark_dirty(id, &slot);
        }
    }
}

/// For tests: holds the next load made after [`LoadHold::arm`] between its read and its insert
/// until [`LoadHold::open`] (as if its thread were descheduled there), so that a test can run
/// what races it meanwhile. The owner of a cache calls [`LoadHold::pass`] at that point in its
/// test builds only.
#[derive(Debug, Default)]
pub struct LoadHold {
    armed: AtomicBool,
    held: AtomicBool,
    open: AtomicBool,
    opened: tokio::sync::Notify,
}

impl LoadHold {
    /// The next load waits at [`LoadHold::pass`].
    pub fn arm(&self) {
        self.armed.store(true, SeqCst);
    }

    /// True once a load is waiting (or waited).
    pub fn is_held(&self) -> bool {
        self.held.load(SeqCst)
    }

    /// Lets the waiting load (and every later one) go on.
    pub fn open(&self) {
        self.open.store(true, SeqCst);
        self.opened.notify_waiters();
    }

    /// Where a load waits when armed.
    pub async fn pass(&self) {
        if !self.armed.swap(false, SeqCst) {
            return;
        }
        self.held.store(true, SeqCst);
        while !self.open.load(SeqCst) {
            let opened = self.opened.notified();
            if self.open.load(SeqCst) {
                break;
            }
            opened.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forgotten_page_is_neither_written_back_nor_kept_and_its_id_can_be_cached_again() {
        let cache: PageCache<u32> = PageCache::new(2);
        let (slot, _) = cache.insert(vec![(7, 70, false)]).remove(0);
        cache.mark_dirty(7, &slot);
        drop(slot);
        cache.forget(7);
        assert!(cache.peek(7).is_none());
        assert!(cache.take_dirty().is_empty(), "its write-back is dropped with it");
        // Cached again (clean): not taken for the old dirty mark; dirty again: taken once.
        let (slot, inserted) = cache.insert(vec![(7, 71, false)]).remove(0);
        assert!(inserted);
        cache.forget(7);
        let (slot2, _) = cache.insert(vec![(7, 72, false)]).remove(0);
        drop(slot);
        assert!(cache.take_dirty().is_empty());
        cache.mark_dirty(7, &slot2);
        let taken = cache.take_dirty();
        assert_eq!(taken.len(), 1);
        assert_eq!(*taken[0].1.page(), 72);
        drop((taken, slot2));
        // The clock's stale places go as the hand meets them: the budget still holds.
        for id in 0..50 {
            cache.insert(vec![(id, id as u32, false)]);
            if id % 3 == 0 {
                cache.forget(id);
            }
        }
        cache.trim();
        assert!(cache.stats().resident_pages <= 2, "{:?}", cache.stats());
    }
}
