//! A fixed set of future slots polled by one task: the per-connection executor.
//!
//! Like `FuturesUnordered`, only futures whose waker fired are polled again, but the slots and
//! their wakers are made once per connection, so running a request allocates nothing here (the
//! export's boxed future is the only per-request allocation). The slot count is the connection's
//! in-flight request limit.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

/// Which slots were woken, and the task to wake when one is.
struct ReadyList {
    woken: Vec<usize>,
    is_woken: Vec<bool>,
    task: Option<Waker>,
}

struct Shared {
    ready: Mutex<ReadyList>,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, ReadyList> {
        self.ready.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn mark(&self, index: usize) -> Option<Waker> {
        let mut ready = self.lock();
        if !ready.is_woken[index] {
            ready.is_woken[index] = true;
            ready.woken.push(index);
        }
        ready.task.take()
    }
}

struct SlotWaker {
    index: usize,
    shared: Arc<Shared>,
}

impl Wake for SlotWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if let Some(task) = self.shared.mark(self.index) {
            task.wake();
        }
    }
}

/// Up to `capacity` futures, each polled only when woken.
pub(crate) struct Slots<F> {
    futures: Vec<Option<F>>,
    wakers: Vec<Waker>,
    free: Vec<usize>,
    shared: Arc<Shared>,
    scratch: Vec<usize>,
}

impl<F: Future + Unpin> Slots<F> {
    /// A set with room for `capacity` futures.
    pub(crate) fn new(capacity: usize) -> Slots<F> {
        let shared = Arc::new(Shared {
            ready: Mutex::new(ReadyList {
                woken: Vec::with_capacity(capacity),
                is_woken: vec![false; capacity],
                task: None,
            }),
        });
        let wakers = (0..capacity)
            .map(|index| Waker::from(Arc::new(SlotWaker { index, shared: Arc::clone(&shared) })))
            .collect();
        Slots {
            futures: (0..capacity).map(|_| None).collect(),
            wakers,
            free: (0..capacity).rev().collect(),
            shared,
            scratch: Vec::with_capacity(capacity),
        }
    }

    /// True when no future is held.
    pub(crate) fn is_empty(&self) -> bool {
        self.free.len() == self.futures.len()
    }

    /// True when every slot is taken.
    pub(crate) fn is_full(&self) -> bool {
        self.free.is_empty()
    }

    /// Adds a future; it is polled on the next [`Slots::poll_ready`].
    ///
    /// Panics when full: callers admit requests only while there is room.
    pub(crate) fn insert(&mut self, future: F) {
        let index = self.free.pop().expect("Slots::insert called while full");
        assert!(self.futures[index].is_none(), "free slot {index} holds a future");
        self.futures[index] = Some(future);
        // A new future must be polled once; waking its slot does that without a special case.
        let _task = self.shared.mark(index);
    }

    /// Polls every woken future; hands each finished one's output to `done`. Returns how many
    /// finished. Registers `cx`'s waker so that the task is woken when any slot is.
    pub(crate) fn poll_ready(&mut self, cx: &mut Context<'_>, mut done: impl FnMut(F::Output)) -> usize {
        {
            let mut ready = self.shared.lock();
            ready.task = Some(cx.waker().clone());
            std::mem::swap(&mut ready.woken, &mut self.scratch);
            for &index in &self.scratch {
                ready.is_woken[index] = false;
            }
        }
        let mut finished = 0;
        for &index in &self.scratch {
            let Some(future) = self.futures[index].as_mut() else { continue };
            let mut slot_cx = Context::from_waker(&self.wakers[index]);
            if let Poll::Ready(output) = Pin::new(future).poll(&mut slot_cx) {
                self.futures[index] = None;
                self.free.push(index);
                finished += 1;
                done(output);
            }
        }
        self.scratch.clear();
        finished
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A future that is pending until its shared flag is set.
    struct Gate {
        open: Arc<AtomicUsize>,
        waker: Arc<Mutex<Option<Waker>>>,
        value: u32,
    }

    impl Future for Gate {
        type Output = u32;
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<u32> {
            if self.open.load(Ordering::SeqCst) > 0 {
                Poll::Ready(self.value)
            } else {
                *self.waker.lock().unwrap() = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }

    #[test]
    fn only_woken_futures_finish_and_slots_are_reused() {
        let mut slots: Slots<Gate> = Slots::new(2);
        let open = Arc::new(AtomicUsize::new(0));
        let inner_waker = Arc::new(Mutex::new(None));
        slots.insert(Gate { open: Arc::clone(&open), waker: Arc::clone(&inner_waker), value: 1 });
        slots.insert(Gate { open: Arc::new(AtomicUsize::new(1)), waker: Arc::default(), value: 2 });
        assert!(slots.is_full());
        let mut cx = Context::from_waker(Waker::noop());
        let mut got = Vec::new();
        assert_eq!(slots.poll_ready(&mut cx, |v| got.push(v)), 1);
        assert_eq!(got, vec![2]);
        assert!(!slots.is_empty() && !slots.is_full());
        // Not woken: polling again does nothing.
        assert_eq!(slots.poll_ready(&mut cx, |v| got.push(v)), 0);
        open.store(1, Ordering::SeqCst);
        inner_waker.lock().unwrap().take().unwrap().wake();
        assert_eq!(slots.poll_ready(&mut cx, |v| got.push(v)), 1);
        assert_eq!(got, vec![2, 1]);
        assert!(slots.is_empty());
    }
}
