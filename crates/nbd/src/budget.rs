//! One connection's share of the server-wide in-flight byte budget (`max_total_in_flight_bytes`).
//!
//! The budget is a semaphore whose permits are bytes. A connection takes a request's bytes (its
//! cost: payload plus largest reply) *before* reading the request off its buffer, so what all
//! connections hold never exceeds the budget. It gives back what it no longer holds at the end of
//! every poll. When the budget is short it waits in the semaphore's first-come-first-served queue
//! (so a large request is not starved by small ones) and, while it waits, keeps nothing beyond
//! what it holds: a waiting connection never sits on spare bytes another one needs.
//!
//! Bytes come back when replies are sent, so a client that reads no replies keeps what it holds
//! (at most `max_in_flight_bytes`) until `send_timeout` closes it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::sync::{AcquireError, OwnedSemaphorePermit, Semaphore};

use crate::admission::Gauges;

type Acquire = Pin<Box<dyn Future<Output = Result<OwnedSemaphorePermit, AcquireError>> + Send>>;

/// Bytes one connection has taken from the server-wide budget.
pub(crate) struct ByteBudget {
    semaphore: Arc<Semaphore>,
    pub(crate) gauges: Arc<Gauges>,
    /// Bytes taken from the semaphore (their permits forgotten). Always at least what the
    /// connection holds plus `granted`.
    reserved: usize,
    /// Part of `reserved` set aside for the next request, not yet held.
    granted: usize,
    /// What the connection held at the last [`ByteBudget::settle`], as told to the gauges.
    reported_held: usize,
    /// A wait in the semaphore's queue for this many bytes.
    waiting: Option<(usize, Acquire)>,
}

impl ByteBudget {
    pub(crate) fn new(semaphore: Arc<Semaphore>, gauges: Arc<Gauges>) -> ByteBudget {
        ByteBudget { semaphore, gauges, reserved: 0, granted: 0, reported_held: 0, waiting: None }
    }

    fn took(&mut self, bytes: usize) {
        self.reserved += bytes;
        self.gauges.reserved(bytes);
    }

    fn give_back(&mut self, bytes: usize) {
        if bytes > 0 {
            self.reserved -= bytes;
            self.semaphore.add_permits(bytes);
            self.gauges.released(bytes);
        }
    }

    /// Sets `cost` bytes aside for the next request of a connection that holds `held`. `Pending`
    /// (with the waker registered) while the budget is short.
    pub(crate) fn poll_grant(&mut self, cx: &mut Context<'_>, cost: usize, held: usize) -> Poll<()> {
        loop {
            if self.granted >= cost {
                return Poll::Ready(());
            }
            if let Some((bytes, acquire)) = self.waiting.as_mut() {
                let bytes = *bytes;
                let Poll::Ready(permit) = acquire.as_mut().poll(cx) else { return Poll::Pending };
                permit.expect("the byte budget is never closed").forget();
                self.waiting = None;
                self.took(bytes);
                self.granted += bytes;
                continue;
            }
            let need = cost - self.granted;
            let spare = self.reserved.saturating_sub(self.granted + held);
            if spare >= need {
                self.granted += need;
                continue;
            }
            let more = need - spare;
            let more_permits = u32::try_from(more).expect("a request's cost fits in 32 bits (validated)");
            match Arc::clone(&self.semaphore).try_acquire_many_owned(more_permits) {
                Ok(permit) => {
                    permit.forget();
                    self.took(more);
                    self.granted += need;
                }
                Err(_) => {
                    // Queue for all of it, holding nothing spare while waiting.
                    self.give_back(spare);
                    let need_permits = u32::try_from(need).expect("a request's cost fits in 32 bits");
                    let semaphore = Arc::clone(&self.semaphore);
                    self.waiting = Some((need, Box::pin(semaphore.acquire_many_owned(need_permits))));
                }
            }
        }
    }

    /// The bytes set aside by [`ByteBudget::poll_grant`] are now held by the admitted request.
    pub(crate) fn consume(&mut self, cost: usize) {
        debug_assert!(self.granted >= cost, "consumed more than was granted");
        self.granted -= cost.min(self.granted);
    }

    /// The connection takes no more requests: stop waiting, give back what was set aside.
    pub(crate) fn cancel(&mut self) {
        self.waiting = None;
        self.granted = 0;
    }

    /// The connection holds `held` bytes: give back the rest, update the gauges.
    pub(crate) fn settle(&mut self, held: usize) {
        debug_assert!(
            held <= self.reserved - self.granted,
            "a connection holds {held} bytes but reserved only {} (+{} granted)",
            self.reserved,
            self.granted
        );
        let keep = held + self.granted;
        if self.reserved > keep {
            self.give_back(self.reserved - keep);
        }
        self.gauges.held_changed(self.reported_held, held);
        self.reported_held = held;
    }
}

impl Drop for ByteBudget {
    fn drop(&mut self) {
        self.waiting = None;
        self.give_back(self.reserved);
        self.gauges.held_changed(self.reported_held, 0);
    }
}

#[cfg(test)]
mod tests {
    use std::task::Waker;

    use super::*;

    fn budget(total: usize) -> (Arc<Semaphore>, Arc<Gauges>) {
        (Arc::new(Semaphore::new(total)), Arc::new(Gauges::default()))
    }

    #[test]
    fn grants_wait_first_come_first_served_and_come_back_on_settle() {
        let (semaphore, gauges) = budget(100);
        let mut cx = Context::from_waker(Waker::noop());
        let mut a = ByteBudget::new(Arc::clone(&semaphore), Arc::clone(&gauges));
        let mut b = ByteBudget::new(Arc::clone(&semaphore), Arc::clone(&gauges));
        let mut c = ByteBudget::new(Arc::clone(&semaphore), Arc::clone(&gauges));
        assert!(a.poll_grant(&mut cx, 70, 0).is_ready());
        a.consume(70);
        a.settle(70);
        // b wants 60: waits. c then wants 20: fits, but queues behind b.
        assert!(b.poll_grant(&mut cx, 60, 0).is_pending());
        assert!(c.poll_grant(&mut cx, 20, 0).is_pending());
        assert_eq!(gauges.snapshot().reserved_bytes, 70);
        // a sent 40 of its 70 bytes: b now fits (30 free + 40), c still waits.
        a.settle(30);
        assert!(b.poll_grant(&mut cx, 60, 0).is_ready());
        assert!(c.poll_grant(&mut cx, 20, 0).is_pending());
        b.consume(60);
        b.settle(60);
        a.settle(0);
        assert!(c.poll_grant(&mut cx, 20, 0).is_ready());
        c.consume(20);
        c.settle(20);
        assert_eq!(gauges.snapshot().reserved_bytes, 80);
        assert_eq!(gauges.snapshot().peak_reserved_bytes, 90);
        drop((a, b, c));
        assert_eq!(semaphore.available_permits(), 100);
        assert_eq!(gauges.snapshot().reserved_bytes, 0);
        assert_eq!(gauges.snapshot().held_bytes, 0);
    }

    #[test]
    fn spare_bytes_are_used_first_and_given_back_before_waiting() {
        let (semaphore, gauges) = budget(100);
        let mut cx = Context::from_waker(Waker::noop());
        let mut a = ByteBudget::new(Arc::clone(&semaphore), Arc::clone(&gauges));
        assert!(a.poll_grant(&mut cx, 50, 0).is_ready());
        a.consume(50);
        // Holds 50; 20 of them were sent but not yet settled: a request of 20 reuses them.
        assert!(a.poll_grant(&mut cx, 20, 30).is_ready());
        a.consume(20);
        assert_eq!(semaphore.available_permits(), 50);
        // A request of 80 while holding 50: waits, and gives nothing spare back meanwhile.
        assert!(a.poll_grant(&mut cx, 80, 50).is_pending());
        a.settle(50);
        a.settle(0);
        assert!(a.poll_grant(&mut cx, 80, 0).is_ready());
        a.cancel();
        a.settle(0);
        assert_eq!(semaphore.available_permits(), 100);
    }
}
