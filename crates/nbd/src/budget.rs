//! One connection's bytes for requests in flight: its guarantee, and what it borrows from the
//! shared budget (`max_shared_in_flight_bytes`).
//!
//! Every connection in transmission may hold one request of any allowed size (its *guarantee*,
//! [`crate::Limits::guaranteed_in_flight_bytes`]) without asking anyone. Beyond that it borrows
//! from the shared budget, a semaphore whose permits are bytes, up to its own limit
//! (`max_in_flight_bytes`). A connection takes a request's bytes (its cost: payload plus largest
//! reply) *before* reading the request off its buffer, so what all connections hold never exceeds
//! `max_connections` guarantees plus the shared budget. It gives back what it no longer needs at
//! the end of every poll.
//!
//! Bytes come back when replies are sent, so a client that reads no replies keeps what it holds
//! until `send_timeout` closes it. Its guarantee is its own, so it stalls itself and, at worst,
//! takes shared bytes others could have used for deeper queues: every other connection keeps
//! its guarantee and goes on being served. When the shared budget is short, a connection waits
//! in the semaphore's first-come-first-served queue (so a large request is not starved by small
//! ones) holding nothing borrowed beyond what it holds, and stops waiting as soon as its own
//! guarantee covers the request again.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::sync::{AcquireError, OwnedSemaphorePermit, Semaphore};

use crate::admission::Gauges;

type Acquire = Pin<Box<dyn Future<Output = Result<OwnedSemaphorePermit, AcquireError>> + Send>>;

/// One connection's bytes: its guarantee and what it borrowed from the shared budget.
pub(crate) struct ByteBudget {
    shared: Arc<Semaphore>,
    pub(crate) gauges: Arc<Gauges>,
    /// Bytes the connection may hold without borrowing.
    guaranteed: usize,
    /// Bytes taken from the shared semaphore (their permits forgotten).
    borrowed: usize,
    /// Bytes set aside for the next request, not yet held: what the connection holds plus this
    /// is always at most `guaranteed + borrowed`.
    granted: usize,
    /// What the connection held and reserved at the last [`ByteBudget::settle`], as told to the
    /// gauges.
    reported_held: usize,
    reported_reserved: usize,
    /// A wait in the shared semaphore's queue for this many bytes.
    waiting: Option<(usize, Acquire)>,
}

impl ByteBudget {
    pub(crate) fn new(shared: Arc<Semaphore>, gauges: Arc<Gauges>, guaranteed: usize) -> ByteBudget {
        ByteBudget {
            shared,
            gauges,
            guaranteed,
            borrowed: 0,
            granted: 0,
            reported_held: 0,
            reported_reserved: 0,
            waiting: None,
        }
    }

    fn borrowed_more(&mut self, bytes: usize) {
        self.gauges.shared_changed(self.borrowed, self.borrowed + bytes);
        self.borrowed += bytes;
    }

    fn give_back(&mut self, bytes: usize) {
        if bytes > 0 {
            self.gauges.shared_changed(self.borrowed, self.borrowed - bytes);
            self.borrowed -= bytes;
            self.shared.add_permits(bytes);
        }
    }

    /// Gives back borrowed bytes beyond what `needed` (held plus granted) takes past the
    /// guarantee.
    fn keep_borrowed_for(&mut self, needed: usize) {
        let keep = needed.saturating_sub(self.guaranteed);
        if self.borrowed > keep {
            self.give_back(self.borrowed - keep);
        }
    }

    /// Sets `cost` bytes aside for the next request of a connection that holds `held`. `Pending`
    /// (with the waker registered) while the guarantee does not cover it and the shared budget is
    /// short.
    pub(crate) fn poll_grant(&mut self, cx: &mut Context<'_>, cost: usize, held: usize) -> Poll<()> {
        loop {
            if self.granted >= cost {
                return Poll::Ready(());
            }
            let needed = held + cost;
            let allowed = self.guaranteed + self.borrowed;
            if needed <= allowed {
                // Replies were sent since the wait began: no need to wait any more.
                self.waiting = None;
                self.granted = cost;
                continue;
            }
            if let Some((bytes, acquire)) = self.waiting.as_mut() {
                let bytes = *bytes;
                let Poll::Ready(permit) = acquire.as_mut().poll(cx) else { return Poll::Pending };
                permit.expect("the shared budget is never closed").forget();
                self.waiting = None;
                self.borrowed_more(bytes);
                continue;
            }
            let more = needed - allowed;
            let more_permits = u32::try_from(more).expect("a connection's bytes fit in 32 bits (validated)");
            match Arc::clone(&self.shared).try_acquire_many_owned(more_permits) {
                Ok(permit) => {
                    permit.forget();
                    self.borrowed_more(more);
                }
                Err(_) => {
                    // Queue for what is missing, holding nothing borrowed that is not held.
                    self.granted = 0;
                    self.keep_borrowed_for(held);
                    let more = needed - (self.guaranteed + self.borrowed);
                    let permits = u32::try_from(more).expect("a connection's bytes fit in 32 bits");
                    let shared = Arc::clone(&self.shared);
                    self.waiting = Some((more, Box::pin(shared.acquire_many_owned(permits))));
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

    /// The connection holds `held` bytes: give back what it borrowed and no longer needs, update
    /// the gauges.
    pub(crate) fn settle(&mut self, held: usize) {
        let needed = held + self.granted;
        assert!(
            needed <= self.guaranteed + self.borrowed,
            "a connection holds {held} bytes (+{} granted) beyond its guarantee of {} and {} borrowed",
            self.granted,
            self.guaranteed,
            self.borrowed
        );
        self.keep_borrowed_for(needed);
        let reserved = needed.min(self.guaranteed) + self.borrowed;
        self.gauges.reserved_changed(self.reported_reserved, reserved);
        self.reported_reserved = reserved;
        self.gauges.held_changed(self.reported_held, held);
        self.reported_held = held;
    }
}

impl Drop for ByteBudget {
    fn drop(&mut self) {
        self.waiting = None;
        self.give_back(self.borrowed);
        self.gauges.reserved_changed(self.reported_reserved, 0);
        self.gauges.held_changed(self.reported_held, 0);
    }
}

#[cfg(test)]
mod tests {
    use std::task::Waker;

    use super::*;

    fn shared(total: usize) -> (Arc<Semaphore>, Arc<Gauges>) {
        (Arc::new(Semaphore::new(total)), Arc::new(Gauges::default()))
    }

    #[test]
    fn the_guarantee_needs_no_shared_bytes_and_borrowing_waits_first_come_first_served() {
        let (semaphore, gauges) = shared(100);
        let mut cx = Context::from_waker(Waker::noop());
        let budget = || ByteBudget::new(Arc::clone(&semaphore), Arc::clone(&gauges), 10);
        let (mut a, mut b, mut c) = (budget(), budget(), budget());
        // a: 10 of its own and 70 borrowed.
        assert!(a.poll_grant(&mut cx, 80, 0).is_ready());
        a.consume(80);
        a.settle(80);
        assert_eq!(semaphore.available_permits(), 30);
        // b wants 50 beyond its 10: waits. c then wants 20 beyond its 10: fits, but queues behind b.
        assert!(b.poll_grant(&mut cx, 60, 0).is_pending());
        assert!(c.poll_grant(&mut cx, 30, 0).is_pending());
        // c's guarantee still covers a small request: it stops waiting.
        assert!(c.poll_grant(&mut cx, 10, 0).is_ready());
        c.consume(10);
        c.settle(10);
        assert_eq!(gauges.snapshot().shared_bytes, 70);
        // a sent 40 of its 80 bytes: b now fits (30 free + 40 back - 20 it still waits for).
        a.settle(40);
        assert!(b.poll_grant(&mut cx, 60, 0).is_ready());
        b.consume(60);
        b.settle(60);
        assert_eq!(gauges.snapshot().shared_bytes, 80);
        assert_eq!(gauges.snapshot().reserved_bytes, 40 + 60 + 10);
        assert_eq!(gauges.snapshot().held_bytes, 40 + 60 + 10);
        drop((a, b, c));
        assert_eq!(semaphore.available_permits(), 100);
        let stats = gauges.snapshot();
        assert_eq!((stats.shared_bytes, stats.reserved_bytes, stats.held_bytes), (0, 0, 0));
        assert_eq!((stats.peak_shared_bytes, stats.peak_reserved_bytes), (80, 110));
    }

    #[test]
    fn borrowed_bytes_are_given_back_when_not_held_and_before_waiting() {
        let (semaphore, gauges) = shared(100);
        let mut cx = Context::from_waker(Waker::noop());
        let mut a = ByteBudget::new(Arc::clone(&semaphore), Arc::clone(&gauges), 10);
        assert!(a.poll_grant(&mut cx, 50, 0).is_ready());
        a.consume(50);
        // Holds 50 (40 borrowed); 20 of them were sent but not yet settled: a request of 20
        // reuses them.
        assert!(a.poll_grant(&mut cx, 20, 30).is_ready());
        a.consume(20);
        assert_eq!(semaphore.available_permits(), 60);
        // A request of 100 while holding 50: waits (the queued wait collects the free bytes),
        // and gives nothing borrowed back meanwhile that is still held.
        assert!(a.poll_grant(&mut cx, 100, 50).is_pending());
        assert_eq!(semaphore.available_permits(), 0);
        a.settle(50);
        assert_eq!(gauges.snapshot().shared_bytes, 40);
        // Everything sent: the 40 borrowed go back, to the wait at the head of the queue.
        a.settle(0);
        assert!(a.poll_grant(&mut cx, 100, 0).is_ready());
        a.consume(100);
        a.settle(100);
        assert_eq!(semaphore.available_permits(), 10, "borrowed what the guarantee does not cover");
        a.settle(0);
        assert_eq!(semaphore.available_permits(), 100);
    }
}
