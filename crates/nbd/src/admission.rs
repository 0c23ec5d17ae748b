//! Connection budgets: places in the handshake and in transmission, server-wide and per peer,
//! which handshake gives way when the handshake places are full, and the gauges behind
//! [`crate::Server::stats`].
//!
//! Transmission places are refused when full (a client told `NBD_REP_ERR_POLICY` may retry).
//! Handshake places are never refused: a new connection takes the place of the handshake that
//! has the weakest claim to it (see [`Admission::enter_handshake`]), so sockets that say nothing
//! cannot keep newcomers out.

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::{Notify, Semaphore, oneshot};

use crate::config::Limits;

/// A snapshot of what the server holds for its clients (see [`crate::Server::stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Connections in the handshake.
    pub handshaking: usize,
    /// Connections in transmission.
    pub transmitting: usize,
    /// Handshakes ended when they ended because transmission was full, for any limit.
    pub refused_connections: u64,
    /// Handshakes closed to make room for a new connection (handshake places full).
    pub evicted_handshakes: u64,
    /// Bytes connections hold or have set aside for their next request now, as taken from the
    /// server-wide total (`Limits::max_total_in_flight_bytes`): the part of each connection's
    /// guarantee in use plus what it took from the shared budget. Always at least `held_bytes`.
    pub reserved_bytes: usize,
    /// The most `reserved_bytes` has been since the server started.
    pub peak_reserved_bytes: usize,
    /// Bytes taken from the shared budget (`max_shared_in_flight_bytes`) now.
    pub shared_bytes: usize,
    /// The most `shared_bytes` has been since the server started.
    pub peak_shared_bytes: usize,
    /// Bytes connections hold for requests in flight now (as counted for `max_in_flight_bytes`),
    /// as of each connection's last poll.
    pub held_bytes: usize,
    /// Connections closed because their client read no replies for `send_timeout`.
    pub stalled_connections_closed: u64,
}

/// Counters shared by every connection of a server.
#[derive(Debug, Default)]
pub(crate) struct Gauges {
    handshaking: AtomicUsize,
    transmitting: AtomicUsize,
    refused: AtomicU64,
    evicted: AtomicU64,
    reserved_bytes: AtomicUsize,
    peak_reserved_bytes: AtomicUsize,
    shared_bytes: AtomicUsize,
    peak_shared_bytes: AtomicUsize,
    held_bytes: AtomicUsize,
    stalled_closed: AtomicU64,
}

fn change(gauge: &AtomicUsize, before: usize, after: usize) -> usize {
    if after > before {
        gauge.fetch_add(after - before, Ordering::Relaxed) + (after - before)
    } else {
        gauge.fetch_sub(before - after, Ordering::Relaxed) - (before - after)
    }
}

impl Gauges {
    pub(crate) fn reserved_changed(&self, before: usize, after: usize) {
        let now = change(&self.reserved_bytes, before, after);
        self.peak_reserved_bytes.fetch_max(now, Ordering::Relaxed);
    }

    pub(crate) fn shared_changed(&self, before: usize, after: usize) {
        let now = change(&self.shared_bytes, before, after);
        self.peak_shared_bytes.fetch_max(now, Ordering::Relaxed);
    }

    pub(crate) fn held_changed(&self, before: usize, after: usize) {
        change(&self.held_bytes, before, after);
    }

    pub(crate) fn refused(&self) {
        self.refused.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn stalled_closed(&self) {
        self.stalled_closed.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> ServerStats {
        ServerStats {
            handshaking: self.handshaking.load(Ordering::Relaxed),
            transmitting: self.transmitting.load(Ordering::Relaxed),
            refused_connections: self.refused.load(Ordering::Relaxed),
            evicted_handshakes: self.evicted.load(Ordering::Relaxed),
            reserved_bytes: self.reserved_bytes.load(Ordering::Relaxed),
            peak_reserved_bytes: self.peak_reserved_bytes.load(Ordering::Relaxed),
            shared_bytes: self.shared_bytes.load(Ordering::Relaxed),
            peak_shared_bytes: self.peak_shared_bytes.load(Ordering::Relaxed),
            held_bytes: self.held_bytes.load(Ordering::Relaxed),
            stalled_connections_closed: self.stalled_closed.load(Ordering::Relaxed),
        }
    }
}

/// Who a connection counts as for the per-peer limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum PeerKey {
    /// A TCP client: its IPv4 address or the /64 prefix of its IPv6 address.
    Ip(IpAddr),
    /// A Unix-socket client: the user id its socket was opened with (`SO_PEERCRED`).
    Uid(u32),
}

impl fmt::Display for PeerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PeerKey::Ip(ip) => write!(f, "{ip}"),
            PeerKey::Uid(uid) => write!(f, "uid {uid}"),
        }
    }
}

/// A connection's peer, and whether the per-peer limits apply to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Peer {
    pub(crate) key: PeerKey,
    /// False for the users exempt from the per-peer limits (root and the server's own user on
    /// Unix sockets): their connections still count against the server-wide limits.
    pub(crate) limited: bool,
}

impl Peer {
    /// A TCP peer (see [`ip_peer_key`]).
    pub(crate) fn tcp(ip: IpAddr) -> Peer {
        Peer { key: PeerKey::Ip(ip_peer_key(ip)), limited: true }
    }

    /// A Unix-socket peer with user id `uid`; `server_uid` (the user owning the socket file) and
    /// root are not limited per peer: either can stop the server anyway, and a trusted
    /// orchestrator often runs as one of them.
    pub(crate) fn unix(uid: u32, server_uid: u32) -> Peer {
        Peer { key: PeerKey::Uid(uid), limited: uid != 0 && uid != server_uid }
    }
}

/// The peer a TCP client counts as for the per-peer limits: its IPv4 address, or the /64 prefix of
/// its IPv6 address (one host or network typically has a whole /64, so single IPv6 addresses
/// would be no limit at all). IPv4-mapped IPv6 addresses count as the IPv4 address.
pub(crate) fn ip_peer_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(std::net::Ipv6Addr::from(v6.to_bits() & !u128::from(u64::MAX))),
        },
    }
}

/// How strong a handshake's claim to its place is; the weakest gives way first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Standing {
    /// The client has not sent a complete message (not even its flags).
    Silent,
    /// The client has sent at least its flags.
    Talking,
    /// The client presented a certificate the server verified (TLS with client certificates).
    Authenticated,
}

/// Why a connection was refused a place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// `max_connections` connections are in transmission.
    Transmitting,
    /// `max_connections_per_peer` connections of this peer are in transmission.
    PeerTransmitting,
    /// The server is shutting down.
    ShuttingDown,
}

/// Which handshake limit made a new connection take another handshake's place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Eviction {
    /// `max_handshaking` was reached.
    Handshaking,
    /// `max_handshaking_per_peer` was reached for the new connection's peer: one of that peer's
    /// own handshakes gave way.
    PeerHandshaking,
}

#[derive(Debug, Default, Clone, Copy)]
struct PeerCount {
    handshaking: usize,
    transmitting: usize,
}

#[derive(Debug)]
struct Handshake {
    peer: Option<PeerKey>,
    standing: Standing,
    /// When the client last sent a complete message (or connected).
    last_progress: Instant,
    evict: Option<oneshot::Sender<()>>,
}

#[derive(Debug, Default)]
struct State {
    /// Shutting down: no new places.
    closed: bool,
    handshaking: usize,
    transmitting: usize,
    /// Handshakes evicted whose connection is not closed yet.
    closing: usize,
    peers: HashMap<PeerKey, PeerCount>,
    handshakes: HashMap<u64, Handshake>,
    next_handshake_id: u64,
}

impl State {
    fn peer_count(&mut self, key: PeerKey) -> &mut PeerCount {
        self.peers.entry(key).or_default()
    }

    fn forget_peer_if_idle(&mut self, key: PeerKey) {
        if let Some(count) = self.peers.get(&key)
            && count.handshaking == 0
            && count.transmitting == 0
        {
            self.peers.remove(&key);
        }
    }

    /// Handshakes of `peer` (`None`: connections without a peer).
    fn handshakes_of(&self, peer: Option<PeerKey>) -> usize {
        match peer {
            Some(key) => self.peers.get(&key).map_or(0, |count| count.handshaking),
            None => self.handshakes.values().filter(|handshake| handshake.peer.is_none()).count(),
        }
    }

    /// The handshake that gives way: among those of `only` (when given), the weakest standing;
    /// then the peer holding the most handshake places (so a flood from one peer pushes out its
    /// own sockets first); then the one whose client has been quiet the longest.
    fn weakest_handshake(&self, only: Option<PeerKey>) -> Option<u64> {
        type Rank = (Standing, std::cmp::Reverse<usize>, Instant);
        let mut best: Option<(u64, Rank)> = None;
        for (&id, handshake) in &self.handshakes {
            if only.is_some() && handshake.peer != only {
                continue;
            }
            let rank = (
                handshake.standing,
                std::cmp::Reverse(self.handshakes_of(handshake.peer)),
                handshake.last_progress,
            );
            if best.as_ref().is_none_or(|(_, best_rank)| rank < *best_rank) {
                best = Some((id, rank));
            }
        }
        best.map(|(id, _)| id)
    }
}

/// Places in the handshake and in transmission, and the shared in-flight byte budget.
#[derive(Debug)]
pub(crate) struct Admission {
    limits: Limits,
    state: Mutex<State>,
    /// Woken when a place is given back (shutdown waits for none to be left) or an evicted
    /// handshake is closed (accepting waits while too many are closing).
    changed: Notify,
    /// Permits are bytes of `max_shared_in_flight_bytes`.
    pub(crate) shared_bytes: Arc<Semaphore>,
    pub(crate) gauges: Arc<Gauges>,
}

/// A place in the handshake, given back on drop.
#[derive(Debug)]
pub(crate) struct HandshakeTicket {
    admission: Arc<Admission>,
    id: u64,
}

/// A place in the handshake: the ticket, and the signal that another connection took it.
#[derive(Debug)]
pub(crate) struct HandshakePlace {
    pub(crate) ticket: HandshakeTicket,
    /// Completes when the place was given to a new connection: close this one at once.
    pub(crate) evicted: oneshot::Receiver<()>,
}

impl HandshakeTicket {
    /// The client sent a complete message (`Talking`) or proved who it is (`Authenticated`).
    pub(crate) fn progressed(&self, standing: Standing) {
        let mut state = self.admission.lock();
        if let Some(handshake) = state.handshakes.get_mut(&self.id) {
            handshake.standing = handshake.standing.max(standing);
            handshake.last_progress = Instant::now();
        }
    }
}

impl Drop for HandshakeTicket {
    fn drop(&mut self) {
        let mut state = self.admission.lock();
        match state.handshakes.remove(&self.id) {
            Some(handshake) => {
                state.handshaking -= 1;
                self.admission.gauges.handshaking.fetch_sub(1, Ordering::Relaxed);
                if let Some(key) = handshake.peer {
                    state.peer_count(key).handshaking -= 1;
                    state.forget_peer_if_idle(key);
                }
            }
            // Evicted: its place was given away already.
            None => state.closing -= 1,
        }
        drop(state);
        self.admission.changed.notify_waiters();
    }
}

/// A place in transmission; given back on drop.
#[derive(Debug)]
pub(crate) struct Place {
    admission: Arc<Admission>,
    peer: Option<PeerKey>,
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut state = self.admission.lock();
        state.transmitting -= 1;
        self.admission.gauges.transmitting.fetch_sub(1, Ordering::Relaxed);
        if let Some(key) = self.peer {
            state.peer_count(key).transmitting -= 1;
            state.forget_peer_if_idle(key);
        }
        drop(state);
        self.admission.changed.notify_waiters();
    }
}

impl Admission {
    pub(crate) fn new(limits: &Limits) -> Admission {
        Admission {
            limits: limits.clone(),
            state: Mutex::new(State::default()),
            changed: Notify::new(),
            shared_bytes: Arc::new(Semaphore::new(limits.max_shared_in_flight_bytes)),
            gauges: Arc::new(Gauges::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A place in the handshake for a new connection from `peer` (`None`: no peer). Never
    /// refused for the limits: when `peer` already has `max_handshaking_per_peer` handshakes, its
    /// own weakest one gives way; when the server has `max_handshaking`, the weakest of all does
    /// (see [`State::weakest_handshake`]). The evicted connection is told through its
    /// [`HandshakePlace::evicted`] and closes. Refused only while shutting down.
    pub(crate) fn enter_handshake(
        self: &Arc<Self>,
        peer: Option<Peer>,
    ) -> Result<(HandshakePlace, Option<Eviction>), Refusal> {
        let mut state = self.lock();
        if state.closed {
            return Err(Refusal::ShuttingDown);
        }
        let mut eviction = None;
        if let Some(peer) = peer
            && peer.limited
            && state.handshakes_of(Some(peer.key)) >= self.limits.max_handshaking_per_peer
        {
            let victim = state.weakest_handshake(Some(peer.key)).expect("the peer has handshakes");
            self.evict(&mut state, victim);
            eviction = Some(Eviction::PeerHandshaking);
        }
        if state.handshaking >= self.limits.max_handshaking {
            let victim = state.weakest_handshake(None).expect("handshakes are full");
            self.evict(&mut state, victim);
            eviction = Some(Eviction::Handshaking);
        }
        let key = peer.map(|peer| peer.key);
        let (evict, evicted) = oneshot::channel();
        let id = state.next_handshake_id;
        state.next_handshake_id += 1;
        state.handshakes.insert(
            id,
            Handshake {
                peer: key,
                standing: Standing::Silent,
                last_progress: Instant::now(),
                evict: Some(evict),
            },
        );
        state.handshaking += 1;
        if let Some(key) = key {
            state.peer_count(key).handshaking += 1;
        }
        self.gauges.handshaking.fetch_add(1, Ordering::Relaxed);
        let ticket = HandshakeTicket { admission: Arc::clone(self), id };
        Ok((HandshakePlace { ticket, evicted }, eviction))
    }

    fn evict(&self, state: &mut State, id: u64) {
        let mut handshake = state.handshakes.remove(&id).expect("the victim is a handshake");
        state.handshaking -= 1;
        state.closing += 1;
        if let Some(key) = handshake.peer {
            state.peer_count(key).handshaking -= 1;
            state.forget_peer_if_idle(key);
        }
        self.gauges.handshaking.fetch_sub(1, Ordering::Relaxed);
        self.gauges.evicted.fetch_add(1, Ordering::Relaxed);
        if let Some(evict) = handshake.evict.take() {
            // The connection may be ending on its own; then nobody listens, which is fine.
            let _ = evict.send(());
        }
    }

    /// Waits while `max_handshaking` evicted handshakes are still closing, so a flood of new
    /// connections cannot keep more than twice `max_handshaking` handshaking sockets open.
    pub(crate) async fn wait_for_handshake_room(&self) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.lock().closing < self.limits.max_handshaking {
                return;
            }
            changed.await;
        }
    }

    /// A place in transmission for a connection from `peer` that ends its handshake.
    pub(crate) fn enter_transmission(self: &Arc<Self>, peer: Option<Peer>) -> Result<Place, Refusal> {
        let mut state = self.lock();
        let refusal = if state.closed {
            Some(Refusal::ShuttingDown)
        } else if let Some(peer) = peer
            && peer.limited
            && state
                .peers
                .get(&peer.key)
                .is_some_and(|count| count.transmitting >= self.limits.max_connections_per_peer)
        {
            Some(Refusal::PeerTransmitting)
        } else if state.transmitting >= self.limits.max_connections {
            Some(Refusal::Transmitting)
        } else {
            None
        };
        if let Some(refusal) = refusal {
            self.gauges.refused();
            return Err(refusal);
        }
        let key = peer.map(|peer| peer.key);
        state.transmitting += 1;
        if let Some(key) = key {
            state.peer_count(key).transmitting += 1;
        }
        self.gauges.transmitting.fetch_add(1, Ordering::Relaxed);
        Ok(Place { admission: Arc::clone(self), peer: key })
    }

    /// Stops giving places (shutdown) and waits until every connection has given its back, for
    /// at most `timeout`; returns whether they all did.
    pub(crate) async fn wait_until_empty(&self, timeout: std::time::Duration) -> bool {
        self.lock().closed = true;
        let empty = async {
            loop {
                let changed = self.changed.notified();
                tokio::pin!(changed);
                changed.as_mut().enable();
                {
                    let state = self.lock();
                    if state.handshaking == 0 && state.transmitting == 0 && state.closing == 0 {
                        return;
                    }
                }
                changed.await;
            }
        };
        tokio::time::timeout(timeout, empty).await.is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> Option<Peer> {
        Some(Peer::tcp(text.parse().unwrap()))
    }

    #[test]
    fn tcp_peers_are_ipv4_addresses_or_ipv6_prefixes() {
        let key = |text: &str| ip_peer_key(text.parse().unwrap()).to_string();
        assert_eq!(key("192.0.2.7"), "192.0.2.7");
        assert_eq!(key("::ffff:192.0.2.7"), "192.0.2.7");
        assert_eq!(key("2001:db8:1:2:aaaa:bbbb:cccc:dddd"), "2001:db8:1:2::");
        assert_eq!(key("2001:db8:1:2::1"), "2001:db8:1:2::");
        assert_ne!(key("2001:db8:1:3::1"), key("2001:db8:1:2::1"));
    }

    fn evicted(place: &mut HandshakePlace) -> bool {
        place.evicted.try_recv().is_ok()
    }

    #[test]
    fn transmission_places_are_counted_server_wide_and_per_peer() {
        let limits = Limits { max_connections: 2, max_connections_per_peer: 1, ..Limits::default() };
        let admission = Arc::new(Admission::new(&limits));
        let a1 = admission.enter_transmission(ip("192.0.2.1")).unwrap();
        assert_eq!(admission.enter_transmission(ip("192.0.2.1")).unwrap_err(), Refusal::PeerTransmitting);
        let b1 = admission.enter_transmission(ip("192.0.2.2")).unwrap();
        assert_eq!(admission.enter_transmission(None).unwrap_err(), Refusal::Transmitting);
        let stats = admission.gauges.snapshot();
        assert_eq!((stats.transmitting, stats.refused_connections), (2, 2));
        drop(a1);
        let a2 = admission.enter_transmission(ip("192.0.2.1")).unwrap();
        drop((a2, b1));
        assert!(admission.lock().peers.is_empty(), "peers without connections are forgotten");
        assert_eq!(admission.gauges.snapshot().transmitting, 0);
    }

    #[test]
    fn unix_peers_are_limited_per_user_except_root_and_the_servers_user() {
        let limits = Limits { max_connections_per_peer: 1, ..Limits::default() };
        let admission = Arc::new(Admission::new(&limits));
        let server_uid = 1000;
        let user = Some(Peer::unix(1001, server_uid));
        let _first = admission.enter_transmission(user).unwrap();
        assert_eq!(admission.enter_transmission(user).unwrap_err(), Refusal::PeerTransmitting);
        let _other_user = admission.enter_transmission(Some(Peer::unix(1002, server_uid))).unwrap();
        let exempt: Vec<Place> = (0..3)
            .flat_map(|_| [Peer::unix(0, server_uid), Peer::unix(server_uid, server_uid)])
            .map(|peer| admission.enter_transmission(Some(peer)).unwrap())
            .collect();
        assert_eq!(exempt.len(), 6);
        assert_eq!(admission.gauges.snapshot().transmitting, 8);
    }

    #[test]
    fn a_full_handshake_budget_evicts_the_weakest_instead_of_refusing() {
        let limits = Limits { max_handshaking: 3, max_handshaking_per_peer: 2, ..Limits::default() };
        let admission = Arc::new(Admission::new(&limits));
        // The peer's limit: its own oldest silent handshake gives way.
        let (mut a1, none) = admission.enter_handshake(ip("192.0.2.1")).unwrap();
        assert_eq!(none, None);
        let (mut a2, _) = admission.enter_handshake(ip("192.0.2.1")).unwrap();
        let (mut a3, why) = admission.enter_handshake(ip("192.0.2.1")).unwrap();
        assert_eq!(why, Some(Eviction::PeerHandshaking));
        assert!(evicted(&mut a1) && !evicted(&mut a2) && !evicted(&mut a3));
        // The server's limit: a talking handshake outlasts silent ones, even newer ones.
        let (mut b1, _) = admission.enter_handshake(ip("192.0.2.2")).unwrap();
        b1.ticket.progressed(Standing::Talking);
        let (mut c1, why) = admission.enter_handshake(ip("192.0.2.3")).unwrap();
        assert_eq!(why, Some(Eviction::Handshaking));
        assert!(evicted(&mut a2), "the oldest silent handshake of the peer holding the most");
        assert!(!evicted(&mut b1) && !evicted(&mut a3) && !evicted(&mut c1));
        let stats = admission.gauges.snapshot();
        assert_eq!((stats.handshaking, stats.evicted_handshakes), (3, 2));
        assert_eq!(admission.lock().closing, 2);
        drop((a1, a2));
        assert_eq!(admission.lock().closing, 0, "evicted handshakes closed");
        // Only talking handshakes left besides c1 and a3: silent ones go first, then the one
        // quiet the longest.
        a3.ticket.progressed(Standing::Talking);
        c1.ticket.progressed(Standing::Authenticated);
        let (_d1, _) = admission.enter_handshake(None).unwrap();
        assert!(evicted(&mut b1), "b1 has been quiet longer than a3");
        assert!(!evicted(&mut a3) && !evicted(&mut c1));
        drop((b1, a3, c1));
        assert_eq!(admission.gauges.snapshot().handshaking, 1);
    }

    #[test]
    fn root_floods_only_evict_roots_own_handshakes_first() {
        let limits = Limits { max_handshaking: 4, max_handshaking_per_peer: 4, ..Limits::default() };
        let admission = Arc::new(Admission::new(&limits));
        let (mut user, _) = admission.enter_handshake(Some(Peer::unix(1001, 0))).unwrap();
        let mut flood = Vec::new();
        for _ in 0..20 {
            flood.push(admission.enter_handshake(Some(Peer::unix(0, 0))).unwrap().0);
        }
        assert!(!evicted(&mut user), "the peer holding the most handshakes gives way first");
        assert_eq!(flood.iter_mut().filter_map(|place| (!evicted(place)).then_some(())).count(), 3);
    }

    #[tokio::test]
    async fn shutdown_waits_for_every_place_and_gives_no_new_ones() {
        let admission = Arc::new(Admission::new(&Limits::default()));
        let (handshake, _) = admission.enter_handshake(None).unwrap();
        let place = admission.enter_transmission(None).unwrap();
        assert!(!admission.wait_until_empty(std::time::Duration::from_millis(50)).await);
        assert_eq!(admission.enter_handshake(None).unwrap_err(), Refusal::ShuttingDown);
        drop(handshake);
        let waiting = {
            let admission = Arc::clone(&admission);
            tokio::spawn(async move { admission.wait_until_empty(std::time::Duration::from_secs(5)).await })
        };
        tokio::task::yield_now().await;
        drop(place);
        assert!(waiting.await.unwrap());
    }
}
