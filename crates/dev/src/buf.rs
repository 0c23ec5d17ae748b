//! I/O buffers whose memory stays valid until every device that uses them is done.
//!
//! Devices driven by io_uring or a thread pool write into (or read from) a buffer after the call
//! that submitted the request has returned, so a request owns its buffer: [`IoBuf`] is a unique,
//! writable view, [`IoBytes`] a shared, read-only one. Both are views into one reference-counted
//! allocation aligned to [`BUF_ALIGN_BYTES`], which is what `O_DIRECT` needs. A buffer can be split
//! into disjoint views (one per drive a request touches) and joined again without copying.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::cell::RefCell;
use std::fmt;
use std::ops::{Deref, DerefMut, Range};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Alignment of every allocation: enough for `O_DIRECT` on 4 KiB-sector drives.
pub const BUF_ALIGN_BYTES: usize = 4096;
// A memory alignment, not a block size, tied to it so that changing either is looked at: the
// smallest recycled class (`BUF_ALIGN_BYTES << 0`) is meant to hold exactly one block.
const _: () = assert!(BUF_ALIGN_BYTES == crate::BLOCK_USIZE, "BUF_ALIGN_BYTES is one block");

/// Allocation sizes recycled: `BUF_ALIGN_BYTES << class` for `class < RECYCLE_CLASSES`
/// (4 KiB to 4 MiB: a log-structured volume's batches are 2 MiB). Requests up to 4 MiB are
/// rounded up to their class.
const RECYCLE_CLASSES: usize = 11;
/// Freed allocations one thread keeps per size class.
const RECYCLE_PER_CLASS: usize = 32;
/// Bytes of freed allocations one thread keeps in all.
const RECYCLE_BYTES_PER_THREAD: usize = 12 << 20;

/// What a [`IoBuf::for_overwrite`] buffer holds in debug builds (tests): a reader that relied on
/// such a buffer starting as zeros, or a path that left part of it unwritten, returns these
/// bytes instead of zeros, which the tests' data checks see. Release builds leave the bytes as
/// they are (zeros, or an earlier buffer's of this thread).
pub const POISON: u8 = 0xDB;

/// Freed allocations of the current thread, by size class, for the next buffers it makes.
///
/// Every request allocates its buffers and frees them on completion. Going to the system
/// allocator each time costs a `posix_memalign` and a `free` per buffer, and with glibc the
/// freed 4 KiB-aligned chunks make the heap shrink and grow again, so new buffers often arrive
/// as fresh pages that fault on first touch. A small per-thread stack of recent allocations
/// avoids both; it holds at most [`RECYCLE_BYTES_PER_THREAD`]. Large allocations it has no
/// room for go to [`SHARED`], for any thread.
struct Recycler {
    free: [Vec<NonNull<u8>>; RECYCLE_CLASSES],
    bytes: usize,
}

impl Drop for Recycler {
    fn drop(&mut self) {
        for (class, list) in self.free.iter_mut().enumerate() {
            for ptr in list.drain(..) {
                // SAFETY: every pointer in the list came from `alloc_zeroed` with `class_layout(class)`
                // and is owned by the list alone.
                unsafe { dealloc(ptr.as_ptr(), class_layout(class)) }
            }
        }
    }
}

/// The smallest size class also kept for every thread (64 KiB): see [`Shared`].
const SHARED_MIN_CLASS: usize = 4;
/// Freed allocations kept for every thread, per size class.
const SHARED_PER_CLASS: usize = 16;
/// Bytes of freed allocations kept for every thread, in all.
const SHARED_BYTES: usize = 64 << 20;

/// Large freed allocations (64 KiB to 4 MiB) that their thread's recycler had no room for,
/// for any thread to take.
///
/// A thin volume's mover allocates a 2 MiB batch per destage and a 2 MiB read per GC step, and
/// its task moves between the runtime's threads, so the thread that frees a batch is often not
/// the one that next needs one: its own recycler fills while the other's stays empty, and every
/// miss went to the allocator, which had returned the freed pages to the kernel and got fresh
/// ones back, faulted and cleared on first touch (5 % of a log volume's write CPU, measured with
/// perf, docs/design/datapath.md). Allocations this large are made per batch, not per request,
/// so a lock per class costs nothing that matters; small ones stay with their thread.
struct Shared {
    free: Mutex<Vec<Kept>>,
}

/// A freed allocation held by [`SHARED`].
struct Kept(NonNull<u8>);

// SAFETY: a kept allocation is owned by the list alone; no view of it exists any more.
unsafe impl Send for Kept {}

static SHARED: [Shared; RECYCLE_CLASSES - SHARED_MIN_CLASS] =
    [const { Shared { free: Mutex::new(Vec::new()) } }; RECYCLE_CLASSES - SHARED_MIN_CLASS];
/// Bytes [`SHARED`] holds.
static SHARED_HELD: AtomicUsize = AtomicUsize::new(0);

fn shared_take(class: usize) -> Option<NonNull<u8>> {
    let shared = SHARED.get(class.checked_sub(SHARED_MIN_CLASS)?)?;
    let kept = shared.free.lock().unwrap_or_else(|e| e.into_inner()).pop()?;
    SHARED_HELD.fetch_sub(BUF_ALIGN_BYTES << class, Ordering::Relaxed);
    Some(kept.0)
}

fn shared_keep(class: usize, ptr: NonNull<u8>) -> bool {
    let Some(shared) = class.checked_sub(SHARED_MIN_CLASS).and_then(|i| SHARED.get(i)) else { return false };
    let size = BUF_ALIGN_BYTES << class;
    let mut free = shared.free.lock().unwrap_or_else(|e| e.into_inner());
    if free.len() >= SHARED_PER_CLASS {
        return false;
    }
    if SHARED_HELD.fetch_add(size, Ordering::Relaxed) + size > SHARED_BYTES {
        SHARED_HELD.fetch_sub(size, Ordering::Relaxed);
        return false;
    }
    free.push(Kept(ptr));
    true
}

thread_local! {
    static RECYCLER: RefCell<Recycler> =
        RefCell::new(Recycler { free: Default::default(), bytes: 0 });
    /// The allocation every empty view of this thread shares: empty buffers are placeholders
    /// (a write without payload, a block not read yet) made per request, which should cost no
    /// allocation. No view can reach its bytes, so sharing it is sound.
    static EMPTY: Arc<Alloc> = Alloc::allocate(0, true);
}

fn class_layout(class: usize) -> Layout {
    Layout::from_size_align(BUF_ALIGN_BYTES << class, BUF_ALIGN_BYTES).expect("class sizes are valid")
}

/// The size class of an allocation of `size` bytes (a multiple of [`BUF_ALIGN_BYTES`]).
fn class_of(size: usize) -> Option<usize> {
    let blocks = (size / BUF_ALIGN_BYTES).next_power_of_two();
    let class = blocks.trailing_zeros() as usize;
    (class < RECYCLE_CLASSES).then_some(class)
}

/// A freed allocation of `class` from this thread's recycler, or else (large ones) from
/// [`SHARED`], if either has one.
fn take_recycled(class: usize) -> Option<NonNull<u8>> {
    take_own(class).or_else(|| shared_take(class))
}

fn take_own(class: usize) -> Option<NonNull<u8>> {
    RECYCLER
        .try_with(|r| {
            let mut r = r.borrow_mut();
            let ptr = r.free[class].pop()?;
            r.bytes -= BUF_ALIGN_BYTES << class;
            Some(ptr)
        })
        .ok()
        .flatten()
}

/// Keeps `ptr` (an allocation of `class`) for reuse, by this thread or (large ones, when its
/// recycler is full) by any; false when there is no room (or the thread's recycler is gone, as
/// the thread exits, and the allocation is small) and the caller must free it.
fn recycle(class: usize, ptr: NonNull<u8>) -> bool {
    keep_own(class, ptr) || shared_keep(class, ptr)
}

fn keep_own(class: usize, ptr: NonNull<u8>) -> bool {
    RECYCLER
        .try_with(|r| {
            let mut r = r.borrow_mut();
            let size = BUF_ALIGN_BYTES << class;
            if r.free[class].len() >= RECYCLE_PER_CLASS || r.bytes + size > RECYCLE_BYTES_PER_THREAD {
                return false;
            }
            r.free[class].push(ptr);
            r.bytes += size;
            true
        })
        .unwrap_or(false)
}

/// One heap allocation, freed (or recycled) when the last view of it is dropped.
///
/// Its bytes are always initialised: zeroed when first allocated, and afterwards only ever
/// written with initialised bytes.
struct Alloc {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: `Alloc` owns plain bytes; access to them is coordinated by the views (`IoBuf` views are
// disjoint and unique, `IoBytes` views are read-only), so moving or sharing the owner across
// threads is sound.
unsafe impl Send for Alloc {}
// SAFETY: see `Send`: the owner itself exposes no access to the bytes.
unsafe impl Sync for Alloc {}

impl Alloc {
    /// An allocation of at least `len_bytes`; with `zero`, its first `len_bytes` are zeros
    /// (the only bytes a view of it can reach), otherwise they are unspecified.
    fn new(len_bytes: usize, zero: bool) -> Arc<Alloc> {
        if len_bytes == 0
            && let Ok(empty) = EMPTY.try_with(Arc::clone)
        {
            return empty;
        }
        Alloc::allocate(len_bytes, zero)
    }

    fn allocate(len_bytes: usize, zero: bool) -> Arc<Alloc> {
        // A zero-length allocation is not allowed by the global allocator; round up to one block.
        let size = len_bytes.max(1).next_multiple_of(BUF_ALIGN_BYTES);
        let class = class_of(size);
        if let Some(class) = class
            && let Some(ptr) = take_recycled(class)
        {
            if zero || cfg!(debug_assertions) {
                // SAFETY: `ptr` is a live allocation of `BUF_ALIGN_BYTES << class >= len_bytes`
                // bytes that the recycler handed over to us alone.
                unsafe { ptr.as_ptr().write_bytes(if zero { 0 } else { POISON }, len_bytes) }
            }
            return Arc::new(Alloc { ptr, layout: class_layout(class) });
        }
        let layout = match class {
            Some(class) => class_layout(class),
            None => Layout::from_size_align(size, BUF_ALIGN_BYTES).expect("buffer size overflows"),
        };
        // SAFETY: `layout` has a non-zero size (rounded up above) and a power-of-two alignment.
        let raw = unsafe { alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else { std::alloc::handle_alloc_error(layout) };
        if !zero && cfg!(debug_assertions) {
            // SAFETY: `raw` is a fresh allocation of `layout.size() >= len_bytes` bytes.
            unsafe { ptr.as_ptr().write_bytes(POISON, len_bytes) }
        }
        Arc::new(Alloc { ptr, layout })
    }
}

impl Drop for Alloc {
    fn drop(&mut self) {
        let size = self.layout.size();
        if let Some(class) = class_of(size)
            && class_layout(class) == self.layout
            && recycle(class, self.ptr)
        {
            return;
        }
        // SAFETY: `ptr` came from `alloc_zeroed` with exactly this layout and is freed only here,
        // when the last view holding the `Arc` is gone (and the recycler did not take it).
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// A unique, writable view of an aligned allocation.
///
/// No other `IoBuf` or `IoBytes` overlaps its bytes, which is what makes `DerefMut` sound.
pub struct IoBuf {
    owner: Arc<Alloc>,
    start: usize,
    len: usize,
}

impl IoBuf {
    /// A zero-filled buffer of `len_bytes`, aligned to [`BUF_ALIGN_BYTES`].
    pub fn zeroed(len_bytes: usize) -> IoBuf {
        IoBuf { owner: Alloc::new(len_bytes, true), start: 0, len: len_bytes }
    }

    /// A buffer of `len_bytes`, aligned to [`BUF_ALIGN_BYTES`], whose contents are unspecified
    /// (initialised, but possibly bytes of an earlier buffer of this thread; [`POISON`] in debug
    /// builds): for outputs the caller overwrites entirely before anything reads them, such as
    /// erasure-code parity or a device read that either fills every byte or fails. Use
    /// [`IoBuf::zeroed`] for anything only partly filled.
    pub fn for_overwrite(len_bytes: usize) -> IoBuf {
        IoBuf { owner: Alloc::new(len_bytes, false), start: 0, len: len_bytes }
    }

    /// A buffer holding a copy of `bytes`.
    pub fn copy_from(bytes: &[u8]) -> IoBuf {
        let mut buf = IoBuf::zeroed(bytes.len());
        buf.copy_from_slice(bytes);
        buf
    }

    /// Length of this view in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the view is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// True when the view starts on a [`BUF_ALIGN_BYTES`] boundary (what `O_DIRECT` needs).
    pub fn is_aligned(&self) -> bool {
        self.start.is_multiple_of(BUF_ALIGN_BYTES)
    }

    /// Splits off the bytes `[at, len)` into a new view; `self` keeps `[0, at)`.
    ///
    /// Panics if `at > len` (a caller bug, like `Vec::split_off`).
    pub fn split_off(&mut self, at: usize) -> IoBuf {
        assert!(at <= self.len, "split_off at {at} beyond length {}", self.len);
        let tail = IoBuf { owner: Arc::clone(&self.owner), start: self.start + at, len: self.len - at };
        self.len = at;
        tail
    }

    /// Splits off the bytes `[0, at)` into a new view; `self` keeps `[at, len)`.
    pub fn split_to(&mut self, at: usize) -> IoBuf {
        assert!(at <= self.len, "split_to at {at} beyond length {}", self.len);
        let head = IoBuf { owner: Arc::clone(&self.owner), start: self.start, len: at };
        self.start += at;
        self.len -= at;
        head
    }

    /// Appends `next`, which must be the view that directly follows `self` in the same
    /// allocation (as produced by [`IoBuf::split_off`]). Gives `next` back otherwise.
    pub fn unsplit(&mut self, next: IoBuf) -> Result<(), IoBuf> {
        if Arc::ptr_eq(&self.owner, &next.owner) && self.start + self.len == next.start {
            self.len += next.len;
            Ok(())
        } else {
            Err(next)
        }
    }

    /// Joins views that are consecutive pieces of one allocation, in order.
    ///
    /// Panics if they are not: joining is only done by code that made the pieces.
    pub fn join(pieces: Vec<IoBuf>) -> IoBuf {
        let mut iter = pieces.into_iter();
        let mut whole = iter.next().unwrap_or_else(|| IoBuf::zeroed(0));
        for piece in iter {
            if whole.unsplit(piece).is_err() {
                panic!("IoBuf::join: pieces are not consecutive views of one allocation");
            }
        }
        whole
    }

    /// Joins pieces into one buffer: without copying when they are consecutive views of one
    /// allocation (the usual case), by copying into a new buffer otherwise (a piece that was
    /// rebuilt into a buffer of its own).
    pub fn join_or_copy(pieces: Vec<IoBuf>) -> IoBuf {
        let consecutive = pieces
            .windows(2)
            .all(|w| Arc::ptr_eq(&w[0].owner, &w[1].owner) && w[0].start + w[0].len == w[1].start);
        if consecutive {
            return IoBuf::join(pieces);
        }
        let mut whole = IoBuf::zeroed(pieces.iter().map(IoBuf::len).sum());
        let mut at = 0;
        for p in &pieces {
            whole[at..at + p.len()].copy_from_slice(p);
            at += p.len();
        }
        whole
    }

    /// Turns the view read-only so it can be shared (for example, one write sent to two mirrors).
    pub fn freeze(self) -> IoBytes {
        IoBytes { owner: self.owner, start: self.start, len: self.len }
    }

    fn view_ptr(&self) -> *const u8 {
        // SAFETY: `start <= allocation size` is an invariant of every view.
        unsafe { self.owner.ptr.as_ptr().add(self.start) }
    }

    /// Raw pointer to the first byte, for submitting the buffer to the kernel.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        // SAFETY: `start <= allocation size` is an invariant of every view, so the offset stays
        // inside (or one past the end of) the allocation.
        unsafe { self.owner.ptr.as_ptr().add(self.start) }
    }
}

impl Deref for IoBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        let ptr = self.view_ptr();
        // SAFETY: `[start, start + len)` lies inside the allocation, which lives as long as
        // `owner`; no other view overlaps it, and the memory is initialised (see `Alloc`).
        unsafe { std::slice::from_raw_parts(ptr, self.len) }
    }
}

impl DerefMut for IoBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        let ptr = self.as_mut_ptr();
        // SAFETY: as for `deref`; `&mut self` and view disjointness make this the only reference.
        unsafe { std::slice::from_raw_parts_mut(ptr, self.len) }
    }
}

impl fmt::Debug for IoBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IoBuf").field("start", &self.start).field("len", &self.len).finish()
    }
}

/// A shared, read-only view of an aligned allocation. Cloning and slicing never copy.
#[derive(Clone)]
pub struct IoBytes {
    owner: Arc<Alloc>,
    start: usize,
    len: usize,
}

impl IoBytes {
    /// A shared buffer holding a copy of `bytes`.
    pub fn copy_from(bytes: &[u8]) -> IoBytes {
        IoBuf::copy_from(bytes).freeze()
    }

    /// A shared buffer of `len_bytes` zeros.
    pub fn zeroed(len_bytes: usize) -> IoBytes {
        IoBuf::zeroed(len_bytes).freeze()
    }

    /// Length of this view in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the view is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// True when the view starts on a [`BUF_ALIGN_BYTES`] boundary.
    pub fn is_aligned(&self) -> bool {
        self.start.is_multiple_of(BUF_ALIGN_BYTES)
    }

    /// A view of `range` (relative to this view). Panics if out of bounds.
    pub fn slice(&self, range: Range<usize>) -> IoBytes {
        assert!(
            range.start <= range.end && range.end <= self.len,
            "slice {range:?} out of bounds of {}",
            self.len
        );
        IoBytes { owner: Arc::clone(&self.owner), start: self.start + range.start, len: range.len() }
    }

    /// Appends `next`, which must be the view that directly follows `self` in the same
    /// allocation (two frozen pieces of one [`IoBuf`]). Gives `next` back otherwise.
    pub fn unsplit(&mut self, next: IoBytes) -> Result<(), IoBytes> {
        if Arc::ptr_eq(&self.owner, &next.owner) && self.start + self.len == next.start {
            self.len += next.len;
            Ok(())
        } else {
            Err(next)
        }
    }

    /// Raw pointer to the first byte, for submitting the buffer to the kernel.
    pub fn as_ptr(&self) -> *const u8 {
        // SAFETY: `start` lies inside (or one past the end of) the allocation.
        unsafe { self.owner.ptr.as_ptr().add(self.start) }
    }
}

impl Deref for IoBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        let ptr = self.as_ptr();
        // SAFETY: `[start, start + len)` lies inside the live allocation; `IoBytes` views are only
        // made from a frozen `IoBuf`, after which nothing writes to those bytes.
        unsafe { std::slice::from_raw_parts(ptr, self.len) }
    }
}

impl fmt::Debug for IoBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IoBytes").field("start", &self.start).field("len", &self.len).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_buffers_are_zeroed_and_aligned() {
        for len in [0, 1, 511, 4096, 4097, 1 << 20] {
            let buf = IoBuf::zeroed(len);
            assert_eq!(buf.len(), len);
            assert!(buf.iter().all(|&b| b == 0));
            assert_eq!(buf.as_ptr() as usize % BUF_ALIGN_BYTES, 0);
        }
    }

    #[test]
    fn recycled_buffers_are_zeroed_again() {
        for len in [1, 4096, 12288, 65536, 1 << 20, (1 << 20) + 4096] {
            let mut buf = IoBuf::zeroed(len);
            buf.fill(0xa5);
            let first = buf.as_ptr();
            drop(buf);
            let again = IoBuf::zeroed(len);
            assert!(again.iter().all(|&b| b == 0), "len {len}");
            assert_eq!(again.as_ptr() as usize % BUF_ALIGN_BYTES, 0);
            if len <= 1 << 20 {
                assert_eq!(again.as_ptr(), first, "len {len}: the freed allocation is reused");
            }
        }
    }

    #[test]
    fn large_buffers_freed_by_one_thread_are_reused_by_another() {
        // 4 MiB (the largest class, which no other test here uses): a thread frees more of them
        // than its own recycler keeps, and this thread's next one is one of them, zeroed.
        let len = (3 << 20) + 1;
        let freed: Vec<usize> = std::thread::spawn(move || {
            let bufs: Vec<IoBuf> = (0..8)
                .map(|_| {
                    let mut b = IoBuf::zeroed(len);
                    b.fill(0xa5);
                    b
                })
                .collect();
            bufs.iter().map(|b| b.as_ptr() as usize).collect()
        })
        .join()
        .unwrap();
        let buf = IoBuf::zeroed(len);
        assert!(freed.contains(&(buf.as_ptr() as usize)), "a fresh allocation instead of a freed one");
        assert!(buf.iter().all(|&b| b == 0));
    }

    #[test]
    fn empty_buffers_share_one_allocation_per_thread() {
        let a = IoBuf::zeroed(0);
        let b = IoBuf::for_overwrite(0);
        let c = IoBytes::zeroed(0);
        assert!(Arc::ptr_eq(&a.owner, &b.owner) && Arc::ptr_eq(&a.owner, &c.owner));
        let other = std::thread::spawn(|| Arc::as_ptr(&IoBuf::zeroed(0).owner) as usize).join().unwrap();
        assert_ne!(other, Arc::as_ptr(&a.owner) as usize, "each thread has its own");
        // An empty view joins nothing but another empty view, as before.
        let mut a = a;
        assert!(a.unsplit(b).is_ok() && a.is_empty());
        let real = IoBuf::zeroed(4096);
        assert!(a.unsplit(real).is_err());
        // A buffer cut to nothing keeps its own allocation.
        let mut whole = IoBuf::zeroed(4096);
        let tail = whole.split_off(4096);
        assert!(tail.is_empty() && Arc::ptr_eq(&tail.owner, &whole.owner));
    }

    #[test]
    fn for_overwrite_buffers_have_the_asked_length() {
        for len in [0, 4096, 3 * 4096, 1 << 21] {
            let mut buf = IoBuf::for_overwrite(len);
            assert_eq!(buf.len(), len);
            assert_eq!(buf.as_ptr() as usize % BUF_ALIGN_BYTES, 0);
            buf.fill(7);
            assert!(buf.iter().all(|&b| b == 7));
        }
    }

    /// What makes a reader that leaves part of such a buffer unwritten visible in tests.
    #[test]
    #[cfg(debug_assertions)]
    fn for_overwrite_buffers_are_poisoned_in_debug_builds() {
        // Recycled (a dropped zeroed buffer of the class comes back), and, past the largest
        // recycled class, always fresh from the allocator.
        for len in [4096, 3 * 4096, 1 << 21, (4 << 20) + 4096] {
            drop(IoBuf::zeroed(len));
            for _ in 0..2 {
                let buf = IoBuf::for_overwrite(len);
                assert!(buf.iter().all(|&b| b == POISON), "{len} bytes");
            }
            assert!(IoBuf::zeroed(len).iter().all(|&b| b == 0));
        }
    }

    #[test]
    fn class_sizes_round_up_to_powers_of_two() {
        assert_eq!(class_of(4096), Some(0));
        assert_eq!(class_of(8192), Some(1));
        assert_eq!(class_of(12288), Some(2));
        assert_eq!(class_of(1 << 20), Some(8));
        assert_eq!(class_of((1 << 20) + 4096), Some(9));
        assert_eq!(class_of(4 << 20), Some(10));
        assert_eq!(class_of((4 << 20) + 4096), None);
    }

    #[test]
    fn split_write_join_round_trips() {
        let mut whole = IoBuf::zeroed(3 * 4096);
        let mut mid = whole.split_off(4096);
        let mut tail = mid.split_off(4096);
        assert!(mid.is_aligned() && tail.is_aligned());
        whole.fill(1);
        mid.fill(2);
        tail.fill(3);
        let joined = IoBuf::join(vec![whole, mid, tail]);
        assert_eq!(joined.len(), 3 * 4096);
        assert!(joined[..4096].iter().all(|&b| b == 1));
        assert!(joined[4096..8192].iter().all(|&b| b == 2));
        assert!(joined[8192..].iter().all(|&b| b == 3));
    }

    #[test]
    fn join_or_copy_handles_foreign_pieces() {
        let mut a = IoBuf::copy_from(&[1, 2, 3, 4]);
        let b = a.split_off(2);
        let joined = IoBuf::join_or_copy(vec![a, b]);
        assert_eq!(&joined[..], &[1, 2, 3, 4]);
        let mut a = IoBuf::copy_from(&[1, 2, 3, 4]);
        let _b = a.split_off(2);
        let joined = IoBuf::join_or_copy(vec![a, IoBuf::copy_from(&[9, 9])]);
        assert_eq!(&joined[..], &[1, 2, 9, 9]);
    }

    #[test]
    fn split_to_keeps_the_tail() {
        let mut buf = IoBuf::copy_from(&[1, 2, 3, 4]);
        let head = buf.split_to(1);
        assert_eq!(&head[..], &[1]);
        assert_eq!(&buf[..], &[2, 3, 4]);
    }

    #[test]
    fn unsplit_refuses_non_neighbours() {
        let mut a = IoBuf::zeroed(8192);
        let b = a.split_off(4096);
        let other = IoBuf::zeroed(4096);
        let other = a.unsplit(other).unwrap_err();
        assert_eq!(other.len(), 4096);
        a.unsplit(b).unwrap();
        assert_eq!(a.len(), 8192);
    }

    #[test]
    fn frozen_neighbours_join_and_others_do_not() {
        let mut buf = IoBuf::copy_from(&[1, 2, 3, 4, 5, 6]);
        let mut rest = buf.split_off(2);
        let tail = rest.split_off(2);
        let mut front = buf.freeze();
        // Not the next piece: the one after it.
        let tail = front.unsplit(tail.freeze()).unwrap_err();
        let other = front.unsplit(IoBytes::copy_from(&[3, 4])).unwrap_err();
        assert_eq!(&other[..], &[3, 4]);
        front.unsplit(rest.freeze()).unwrap();
        front.unsplit(tail).unwrap();
        assert_eq!(&front[..], &[1, 2, 3, 4, 5, 6]);
    }

    #[test]
    fn frozen_slices_share_bytes() {
        let bytes = IoBytes::copy_from(b"hello world");
        let world = bytes.slice(6..11);
        assert_eq!(&world[..], b"world");
        let clone = world.clone();
        drop(bytes);
        assert_eq!(&clone[..], b"world");
    }
}
