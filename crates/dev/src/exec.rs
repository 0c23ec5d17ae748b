//! A minimal executor for tests, benchmarks and tools that run device futures without a runtime.
//!
//! Device futures are runtime-agnostic (they only use the `Waker` they are polled with), so any
//! executor drives them; this one is enough to wait for one future or for many at once.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};

use parking_lot::Mutex;

/// Wakes a parked thread and remembers that it did (so a wake before the park is not lost).
struct ThreadWaker {
    thread: Thread,
    woken: AtomicBool,
}

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.thread.unpark();
    }
}

impl ThreadWaker {
    fn current() -> Arc<ThreadWaker> {
        Arc::new(ThreadWaker { thread: thread::current(), woken: AtomicBool::new(false) })
    }

    /// Parks until a wake arrived since the last call. A thread with an io_uring of its own
    /// (`crate::file::local`) waits on that ring instead while it has calls in flight: they
    /// finish only when this thread reaps them.
    fn wait(&self) {
        while !self.woken.swap(false, Ordering::Acquire) {
            if !crate::file::local::wait_for_a_call() {
                thread::park();
            }
        }
    }
}

/// Runs `future` to completion on the current thread.
pub fn block_on<F: Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let signal = ThreadWaker::current();
    let waker = Waker::from(Arc::clone(&signal));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return output;
        }
        signal.wait();
    }
}

/// Marks one future of a [`join_all`] as ready to poll, then wakes the joining thread.
struct TaskWaker {
    index: usize,
    ready: Arc<Mutex<Vec<usize>>>,
    signal: Arc<ThreadWaker>,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.ready.lock().push(self.index);
        self.signal.wake_by_ref();
    }
}

/// Runs all `futures` concurrently on the current thread; outputs come back in input order.
///
/// Only futures that were woken are polled again, so thousands of mostly-idle futures cost
/// nothing while they wait.
pub fn join_all<F: Future>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    let mut tasks: Vec<Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = tasks.iter().map(|_| None).collect();
    let signal = ThreadWaker::current();
    let ready = Arc::new(Mutex::new((0..tasks.len()).collect::<Vec<_>>()));
    let wakers: Vec<Waker> = (0..tasks.len())
        .map(|index| {
            let task = TaskWaker { index, ready: Arc::clone(&ready), signal: Arc::clone(&signal) };
            Waker::from(Arc::new(task))
        })
        .collect();
    let mut remaining = tasks.len();
    let mut batch = Vec::new();
    while remaining > 0 {
        std::mem::swap(&mut batch, &mut *ready.lock());
        for index in batch.drain(..) {
            if outputs[index].is_some() {
                continue; // a late or duplicate wake of a finished future
            }
            let mut cx = Context::from_waker(&wakers[index]);
            if let Poll::Ready(output) = tasks[index].as_mut().poll(&mut cx) {
                outputs[index] = Some(output);
                remaining -= 1;
            }
        }
        if remaining > 0 && ready.lock().is_empty() {
            signal.wait();
        }
    }
    outputs.into_iter().map(|o| o.expect("every future finished")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A future that completes once another thread sets its flag.
    struct Later {
        state: Arc<Mutex<(bool, Option<Waker>)>>,
    }

    impl Future for Later {
        type Output = u32;
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<u32> {
            let mut state = self.state.lock();
            if state.0 {
                Poll::Ready(7)
            } else {
                state.1 = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }

    fn later_from_thread(delay_ms: u64) -> Later {
        let state = Arc::new(Mutex::new((false, None::<Waker>)));
        let remote = Arc::clone(&state);
        thread::spawn(move || {
            thread::sleep(Duration::from_millis(delay_ms));
            let waker = {
                let mut s = remote.lock();
                s.0 = true;
                s.1.take()
            };
            if let Some(w) = waker {
                w.wake();
            }
        });
        Later { state }
    }

    #[test]
    fn block_on_waits_for_a_wake_from_another_thread() {
        assert_eq!(block_on(later_from_thread(5)), 7);
    }

    #[test]
    fn join_all_returns_outputs_in_input_order() {
        let futures = (0..8u64).map(|i| later_from_thread(8 - i));
        assert_eq!(join_all(futures), vec![7; 8]);
        let ready = join_all((0..3).map(std::future::ready));
        assert_eq!(ready, vec![0, 1, 2]);
    }
}
