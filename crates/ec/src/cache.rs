//! A bounded cache of decode plans, keyed by erasure pattern.
//!
//! Two levels:
//! - a per-thread list of the last [`RECENT_SLOTS`] plans used (any codec), looked up without
//!   a lock or an atomic: a degraded read that keeps hitting the same pattern pays a few
//!   compares of 64-byte keys;
//! - behind it, a map shared by all threads and bounded to the codec's `decode_cache_entries`,
//!   evicting the least recently used plan when full.
//!
//! A plan evicted from the shared map may live on in a thread's recent list until that list
//! moves on; that is at most [`RECENT_SLOTS`] plans per thread.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::decode::{DecodePlan, PatternKey};

/// Decode plans kept by default per codec (each costs about `41 * K * rebuilt` bytes).
pub const DEFAULT_DECODE_CACHE_ENTRIES: usize = 256;

/// Plans each thread keeps in its lock-free front list.
pub(crate) const RECENT_SLOTS: usize = 4;

/// Distinguishes codecs in the per-thread lists; never reused.
static NEXT_CODEC_ID: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static RECENT: RefCell<Recent> = const { RefCell::new(Recent::new()) };
}

struct Recent {
    slots: [Option<RecentSlot>; RECENT_SLOTS],
    next: usize,
}

struct RecentSlot {
    codec_id: u64,
    key: PatternKey,
    plan: Arc<DecodePlan>,
}

impl Recent {
    const fn new() -> Self {
        Self { slots: [const { None }; RECENT_SLOTS], next: 0 }
    }

    fn find(&self, codec_id: u64, key: &PatternKey) -> Option<&DecodePlan> {
        self.slots.iter().flatten().find(|s| s.codec_id == codec_id && s.key == *key).map(|s| &*s.plan)
    }

    fn insert(&mut self, codec_id: u64, key: PatternKey, plan: Arc<DecodePlan>) {
        self.slots[self.next] = Some(RecentSlot { codec_id, key, plan });
        self.next = (self.next + 1) % RECENT_SLOTS;
    }
}

struct SharedEntry {
    plan: Arc<DecodePlan>,
    last_used: u64,
}

#[derive(Default)]
struct Shared {
    map: HashMap<PatternKey, SharedEntry>,
    clock: u64,
}

/// The decode plans of one codec.
pub(crate) struct DecodeCache {
    codec_id: u64,
    capacity: usize,
    shared: Mutex<Shared>,
}

impl std::fmt::Debug for DecodeCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecodeCache").field("capacity", &self.capacity).field("len", &self.len()).finish()
    }
}

impl DecodeCache {
    /// A cache holding at most `capacity` plans; 0 disables caching.
    pub(crate) fn new(capacity: usize) -> Self {
        let codec_id = NEXT_CODEC_ID.fetch_add(1, Ordering::Relaxed);
        Self { codec_id, capacity, shared: Mutex::new(Shared::default()) }
    }

    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Plans in the shared map.
    pub(crate) fn len(&self) -> usize {
        self.shared.lock().unwrap_or_else(PoisonError::into_inner).map.len()
    }

    /// Calls `use_plan` with the plan for `key`, building it with `build` on a miss.
    pub(crate) fn with_plan<R>(
        &self,
        key: &PatternKey,
        build: impl FnOnce() -> DecodePlan,
        use_plan: impl FnOnce(&DecodePlan) -> R,
    ) -> R {
        if self.capacity == 0 {
            return use_plan(&build());
        }
        let mut use_plan = Some(use_plan);
        let mut take = || use_plan.take().expect("the plan is used once");
        // The plan is used while the thread's list is borrowed: no reference count to touch.
        let fast =
            RECENT.try_with(|recent| recent.borrow().find(self.codec_id, key).map(|plan| take()(plan)));
        match fast {
            Ok(Some(out)) => return out,
            Ok(None) => {}
            // The thread is exiting and its list is gone: go to the shared map only.
            Err(_) => return take()(&self.shared_plan(key, build)),
        }
        let plan = self.shared_plan(key, build);
        let use_plan = take();
        let out = use_plan(&plan);
        // Ignoring a failure is fine: it means the thread is exiting.
        let _ = RECENT.try_with(|recent| recent.borrow_mut().insert(self.codec_id, *key, plan));
        out
    }

    fn shared_plan(&self, key: &PatternKey, build: impl FnOnce() -> DecodePlan) -> Arc<DecodePlan> {
        {
            let mut shared = self.shared.lock().unwrap_or_else(PoisonError::into_inner);
            shared.clock += 1;
            let now = shared.clock;
            if let Some(entry) = shared.map.get_mut(key) {
                entry.last_used = now;
                return Arc::clone(&entry.plan);
            }
        }
        // Build outside the lock: inverting a matrix is O(K^3). Two threads may both build the
        // same plan; the second insert simply replaces the first.
        let plan = Arc::new(build());
        let mut shared = self.shared.lock().unwrap_or_else(PoisonError::into_inner);
        if shared.map.len() >= self.capacity && !shared.map.contains_key(key) {
            let oldest = shared.map.iter().min_by_key(|(_, e)| e.last_used).map(|(k, _)| *k);
            if let Some(oldest) = oldest {
                shared.map.remove(&oldest);
            }
        }
        shared.clock += 1;
        let last_used = shared.clock;
        shared.map.insert(*key, SharedEntry { plan: Arc::clone(&plan), last_used });
        debug_assert!(shared.map.len() <= self.capacity);
        plan
    }
}
