//! Rate-limited warnings: what a client can cause once per connection (a refused connection, a
//! handshake timeout, a protocol error) must not become one log line per connection under a
//! flood. Each kind of warning logs its first event, then at most one line per interval: either
//! the next event (with how many were left out before it) or, from [`Warnings::flush`], a summary
//! of the ones left out.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use tracing::warn;

/// A counter and a timestamp: decides which events of one kind are logged.
#[derive(Debug)]
pub(crate) struct RateLimit {
    interval: Duration,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    last_logged: Option<Instant>,
    suppressed: u64,
}

impl RateLimit {
    pub(crate) fn new(interval: Duration) -> RateLimit {
        RateLimit { interval, state: Mutex::new(State::default()) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// An event happened at `now`: `Some(left_out)` when it is to be logged (`left_out` events
    /// since the last logged one were not), `None` when it is only counted.
    pub(crate) fn event(&self, now: Instant) -> Option<u64> {
        let mut state = self.lock();
        let due = state.last_logged.is_none_or(|last| now.saturating_duration_since(last) >= self.interval);
        if due {
            state.last_logged = Some(now);
            Some(std::mem::take(&mut state.suppressed))
        } else {
            state.suppressed += 1;
            None
        }
    }

    /// `Some((left_out, since))` when events were left out and the interval since the last
    /// logged line (`since` ago) has passed, or `force`: the caller logs a summary, which counts
    /// as a logged line.
    pub(crate) fn flush(&self, now: Instant, force: bool) -> Option<(u64, Duration)> {
        let mut state = self.lock();
        let since = state.last_logged.map_or(Duration::ZERO, |last| now.saturating_duration_since(last));
        if state.suppressed > 0 && (force || since >= self.interval) {
            state.last_logged = Some(now);
            Some((std::mem::take(&mut state.suppressed), since))
        } else {
            None
        }
    }
}

/// Kinds of per-connection warnings, each limited separately.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A handshake closed to make room for a new connection: the handshake limit was reached.
    HandshakeEvicted,
    /// A handshake closed to make room for a new connection of the same peer: that peer's
    /// handshake limit was reached.
    PeerHandshakeEvicted,
    /// A handshake refused at its end: the transmission limit was reached.
    ConnectionLimit,
    /// A handshake refused at its end: its peer's transmission limit was reached.
    PeerConnectionLimit,
    /// A handshake ran out of time.
    HandshakeTimeout,
    /// A handshake broke the protocol or a handshake limit.
    HandshakeRefused,
    /// A transmitting client broke the protocol.
    ProtocolError,
    /// `accept` failed (out of file descriptors and the like).
    AcceptFailed,
}

impl Kind {
    const ALL: [Kind; 8] = [
        Kind::HandshakeEvicted,
        Kind::PeerHandshakeEvicted,
        Kind::ConnectionLimit,
        Kind::PeerConnectionLimit,
        Kind::HandshakeTimeout,
        Kind::HandshakeRefused,
        Kind::ProtocolError,
        Kind::AcceptFailed,
    ];

    /// What the summary line says happened.
    fn summary(self) -> &'static str {
        match self {
            Kind::HandshakeEvicted => "handshakes closed to make room: handshake limit reached",
            Kind::PeerHandshakeEvicted => "handshakes closed to make room: per-peer handshake limit reached",
            Kind::ConnectionLimit => "handshakes refused: connection limit reached",
            Kind::PeerConnectionLimit => "handshakes refused: per-peer connection limit reached",
            Kind::HandshakeTimeout => "handshakes timed out",
            Kind::HandshakeRefused => "handshakes refused",
            Kind::ProtocolError => "clients disconnected for protocol errors",
            Kind::AcceptFailed => "accept failures",
        }
    }
}

/// One [`RateLimit`] per [`Kind`].
#[derive(Debug)]
pub(crate) struct Warnings {
    interval: Duration,
    limits: [RateLimit; Kind::ALL.len()],
}

impl Warnings {
    pub(crate) fn new(interval: Duration) -> Warnings {
        Warnings { interval, limits: std::array::from_fn(|_| RateLimit::new(interval)) }
    }

    fn limit(&self, kind: Kind) -> &RateLimit {
        let index = Kind::ALL.iter().position(|k| *k == kind).expect("every kind is listed");
        &self.limits[index]
    }

    /// Calls `log(left_out)` when this event of `kind` is to be logged.
    pub(crate) fn warn(&self, kind: Kind, log: impl FnOnce(u64)) {
        if let Some(left_out) = self.limit(kind).event(Instant::now()) {
            log(left_out);
        }
    }

    /// Logs one summary line per kind with events left out for at least an interval.
    pub(crate) fn flush(&self) {
        self.flush_with(false);
    }

    /// Logs one summary line per kind with events left out (at shutdown).
    pub(crate) fn flush_all(&self) {
        self.flush_with(true);
    }

    fn flush_with(&self, force: bool) {
        let now = Instant::now();
        for kind in Kind::ALL {
            if let Some((count, since)) = self.limit(kind).flush(now, force) {
                let seconds = since.as_secs();
                warn!(count, seconds, "{}: {count} more in the last {seconds} s", kind.summary());
            }
        }
    }

    /// How often [`Warnings::flush`] is worth calling.
    pub(crate) fn interval(&self) -> Duration {
        self.interval
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_event_logs_then_one_per_interval_with_the_count_left_out() {
        let limit = RateLimit::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(limit.event(t0), Some(0));
        for ms in 1..500u64 {
            assert_eq!(limit.event(t0 + Duration::from_millis(ms)), None);
        }
        assert_eq!(limit.flush(t0 + Duration::from_secs(9), false), None, "not before the interval");
        assert_eq!(limit.event(t0 + Duration::from_secs(10)), Some(499));
        assert_eq!(limit.event(t0 + Duration::from_secs(11)), None);
        assert_eq!(limit.flush(t0 + Duration::from_secs(19), false), None);
        assert_eq!(limit.flush(t0 + Duration::from_secs(20), false), Some((1, Duration::from_secs(10))));
        assert_eq!(limit.flush(t0 + Duration::from_secs(40), true), None, "nothing left out");
        assert_eq!(limit.event(t0 + Duration::from_secs(41)), Some(0), "quiet: logged at once");
        assert_eq!(limit.event(t0 + Duration::from_secs(42)), None);
        assert_eq!(limit.flush(t0 + Duration::from_secs(43), true), Some((1, Duration::from_secs(2))));
    }

    #[test]
    fn a_flood_over_a_minute_logs_about_one_line_per_interval() {
        let limit = RateLimit::new(Duration::from_secs(10));
        let t0 = Instant::now();
        let mut lines = 0;
        let mut counted = 0;
        for ms in (0..60_000u64).step_by(5) {
            let now = t0 + Duration::from_millis(ms);
            if let Some(left_out) = limit.event(now) {
                lines += 1;
                counted += left_out + 1;
            }
            if ms % 1000 == 0
                && let Some((left_out, _)) = limit.flush(now, false)
            {
                lines += 1;
                counted += left_out;
            }
        }
        counted += limit.flush(t0 + Duration::from_secs(120), false).map_or(0, |(left_out, _)| left_out);
        assert!(lines <= 7, "{lines} lines for a one-minute flood");
        assert_eq!(counted, 12_000, "every event is logged or counted in a summary");
    }

    #[test]
    fn kinds_are_limited_separately() {
        let warnings = Warnings::new(Duration::from_secs(3600));
        let mut logged = Vec::new();
        for kind in
            [Kind::HandshakeEvicted, Kind::HandshakeEvicted, Kind::HandshakeTimeout, Kind::HandshakeEvicted]
        {
            warnings.warn(kind, |left_out| logged.push((kind, left_out)));
        }
        assert_eq!(logged, vec![(Kind::HandshakeEvicted, 0), (Kind::HandshakeTimeout, 0)]);
    }
}
