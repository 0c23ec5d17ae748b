//! A bounded, adaptive busy poll for the connection loops of the front ends (NBD, iSCSI), and
//! the threads their connections run on ([`threads`]).
//!
//! For a window after a connection last did something (read a request, finished one, sent a
//! reply), a poll that finds nothing to do asks to be polled again once the runtime has looked
//! at its sockets without sleeping, instead of sleeping until woken: a busy client's next
//! request is then picked up without the runtime going to sleep in `epoll_wait` and being woken
//! for it, which on a virtual machine costs tens of microseconds per request
//! (docs/design/datapath.md §3 and §6). The window adapts, as Linux's NAPI busy polling does:
//! each window that passes with nothing arriving halves the next one (a client that pauses
//! stops costing CPU after a few pauses), and work that arrives within the largest window, while
//! polling or after a sleep that polling would have covered, restores it.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod threads;

pub use threads::ConnectionThreads;

use std::future::Future;
use std::task::Context;
use std::time::{Duration, Instant};

/// The state of one connection's busy poll.
#[derive(Debug)]
pub struct BusyPoll {
    max: Duration,
    window: Duration,
    /// The activity count when last seen, and when it last changed.
    seen: u64,
    at: Instant,
    polling: bool,
}

impl BusyPoll {
    /// A busy poll whose window is at most `max` (zero: never poll).
    pub fn new(max: Duration) -> Self {
        BusyPoll { max, window: max, seen: 0, at: Instant::now(), polling: false }
    }

    /// Called when the connection's future returned `Pending`; `activity` is a count that grows
    /// whenever the connection does something. While within the window, arranges for the task
    /// to be polled again after the runtime has polled its I/O driver without blocking (tokio's
    /// `yield_now` defers its wake until then); the poll's own registrations (socket readiness,
    /// timers) stay as they were, so nothing is lost when the window ends and the task sleeps.
    pub fn after_pending(&mut self, cx: &mut Context<'_>, activity: u64) {
        if self.max.is_zero() || !self.keep_polling(Instant::now(), activity) {
            return;
        }
        let mut yielded = std::pin::pin!(tokio::task::yield_now());
        let _ = yielded.as_mut().poll(cx);
    }

    /// Whether to poll again at `now`, having seen `activity`.
    fn keep_polling(&mut self, now: Instant, activity: u64) -> bool {
        if activity != self.seen {
            if self.polling || now.duration_since(self.at) < self.max {
                self.window = self.max;
            }
            self.seen = activity;
            self.at = now;
        } else if self.polling && now.duration_since(self.at) >= self.window {
            // Nothing came while polling: poll half as long after the next piece of work.
            self.window /= 2;
        }
        self.polling = now.duration_since(self.at) < self.window;
        self.polling
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_halves_while_a_client_pauses_and_comes_back_when_it_is_busy() {
        let us = Duration::from_micros;
        let t0 = Instant::now();
        let mut spin = BusyPoll::new(us(100));
        spin.at = t0;
        // Work, then polling until the window has passed with nothing arriving.
        assert!(spin.keep_polling(t0 + us(1), 1));
        assert!(spin.keep_polling(t0 + us(60), 1));
        assert!(!spin.keep_polling(t0 + us(102), 1), "the window has passed");
        assert_eq!(spin.window, us(50), "halved after a window with nothing");
        // The client pauses (1 ms) each time: the window keeps halving, then nothing is polled.
        let mut t = t0 + us(102);
        for round in 2..20u64 {
            t += us(1000);
            let polled = spin.keep_polling(t, round);
            t += spin.window + us(1);
            assert!(!spin.keep_polling(t, round));
            assert!(polled || spin.window.is_zero(), "polls while its window lasts");
        }
        assert!(spin.window < us(1), "a pausing client costs no polling: {:?}", spin.window);
        // Requests that follow each other within the largest window restore it.
        t += us(1000);
        spin.keep_polling(t, 100);
        t += us(40);
        assert!(spin.keep_polling(t, 101));
        assert_eq!(spin.window, us(100), "work within the largest window restores it");
        assert!(spin.keep_polling(t + us(99), 101));
        assert!(!spin.keep_polling(t + us(101), 101));
    }

    #[test]
    fn a_zero_window_never_polls() {
        let mut spin = BusyPoll::new(Duration::ZERO);
        let now = Instant::now();
        assert!(!spin.keep_polling(now, 1));
        assert!(!spin.keep_polling(now, 2));
    }
}
