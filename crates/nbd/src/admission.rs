//! Connection budgets: places in the handshake and in transmission, server-wide and per peer,
//! the server-wide budget of bytes held for requests in flight, and the gauges behind
//! [`crate::Server::stats`].

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::Limits;

/// A snapshot of what the server holds for its clients (see [`crate::Server::stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Connections in the handshake.
    pub handshaking: usize,
    /// Connections in transmission.
    pub transmitting: usize,
    /// Connections refused so far (at accept, or at the end of the handshake), for any limit.
    pub refused_connections: u64,
    /// Bytes taken from the server-wide in-flight budget (`max_total_in_flight_bytes`) now. Always
    /// at least what connections hold for requests in flight.
    pub reserved_bytes: usize,
    /// The most `reserved_bytes` has been since the server started.
    pub peak_reserved_bytes: usize,
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
    reserved_bytes: AtomicUsize,
    peak_reserved_bytes: AtomicUsize,
    held_bytes: AtomicUsize,
    stalled_closed: AtomicU64,
}

impl Gauges {
    pub(crate) fn reserved(&self, bytes: usize) {
        let now = self.reserved_bytes.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.peak_reserved_bytes.fetch_max(now, Ordering::Relaxed);
    }

    pub(crate) fn released(&self, bytes: usize) {
        self.reserved_bytes.fetch_sub(bytes, Ordering::Relaxed);
    }

    pub(crate) fn held_changed(&self, before: usize, after: usize) {
        if after > before {
            self.held_bytes.fetch_add(after - before, Ordering::Relaxed);
        } else if before > after {
            self.held_bytes.fetch_sub(before - after, Ordering::Relaxed);
        }
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
            reserved_bytes: self.reserved_bytes.load(Ordering::Relaxed),
            peak_reserved_bytes: self.peak_reserved_bytes.load(Ordering::Relaxed),
            held_bytes: self.held_bytes.load(Ordering::Relaxed),
            stalled_connections_closed: self.stalled_closed.load(Ordering::Relaxed),
        }
    }
}

/// Why a connection was refused a place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// `max_handshaking` connections are in the handshake.
    Handshaking,
    /// `max_handshaking_per_peer` connections of this peer are in the handshake.
    PeerHandshaking,
    /// `max_connections` connections are in transmission.
    Transmitting,
    /// `max_connections_per_peer` connections of this peer are in transmission.
    PeerTransmitting,
}

#[derive(Debug, Default, Clone, Copy)]
struct PeerCount {
    handshaking: usize,
    transmitting: usize,
}

/// Places in the handshake and in transmission, and the in-flight byte budget.
#[derive(Debug)]
pub(crate) struct Admission {
    limits: Limits,
    handshaking: Arc<Semaphore>,
    transmitting: Arc<Semaphore>,
    peers: Mutex<HashMap<IpAddr, PeerCount>>,
    /// Permits are bytes of `max_total_in_flight_bytes`.
    pub(crate) bytes: Arc<Semaphore>,
    pub(crate) gauges: Arc<Gauges>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Handshake,
    Transmission,
}

/// A place in the handshake or in transmission; freed on drop.
#[derive(Debug)]
pub(crate) struct Place {
    admission: Arc<Admission>,
    peer: Option<IpAddr>,
    transmission: bool,
    _permit: OwnedSemaphorePermit,
}

impl Drop for Place {
    fn drop(&mut self) {
        let phase = if self.transmission { Phase::Transmission } else { Phase::Handshake };
        self.admission.leave(phase, self.peer);
    }
}

impl Admission {
    pub(crate) fn new(limits: &Limits) -> Admission {
        Admission {
            limits: limits.clone(),
            handshaking: Arc::new(Semaphore::new(limits.max_handshaking)),
            transmitting: Arc::new(Semaphore::new(limits.max_connections)),
            peers: Mutex::new(HashMap::new()),
            bytes: Arc::new(Semaphore::new(limits.max_total_in_flight_bytes)),
            gauges: Arc::new(Gauges::default()),
        }
    }

    fn peers(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, PeerCount>> {
        self.peers.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A place in the handshake for a connection from `peer` (`None`: no per-peer limit).
    pub(crate) fn enter_handshake(self: &Arc<Self>, peer: Option<IpAddr>) -> Result<Place, Refusal> {
        self.enter(Phase::Handshake, peer)
    }

    /// A place in transmission for a connection from `peer` that ends its handshake.
    pub(crate) fn enter_transmission(self: &Arc<Self>, peer: Option<IpAddr>) -> Result<Place, Refusal> {
        self.enter(Phase::Transmission, peer)
    }

    fn enter(self: &Arc<Self>, phase: Phase, peer: Option<IpAddr>) -> Result<Place, Refusal> {
        let (semaphore, per_peer, refusal, peer_refusal, gauge) = match phase {
            Phase::Handshake => (
                &self.handshaking,
                self.limits.max_handshaking_per_peer,
                Refusal::Handshaking,
                Refusal::PeerHandshaking,
                &self.gauges.handshaking,
            ),
            Phase::Transmission => (
                &self.transmitting,
                self.limits.max_connections_per_peer,
                Refusal::Transmitting,
                Refusal::PeerTransmitting,
                &self.gauges.transmitting,
            ),
        };
        let result = (|| {
            let mut peers = self.peers();
            if let Some(ip) = peer {
                let count = peers.get(&ip).copied().unwrap_or_default();
                let used = if phase == Phase::Handshake { count.handshaking } else { count.transmitting };
                if used >= per_peer {
                    return Err(peer_refusal);
                }
            }
            let permit = Arc::clone(semaphore).try_acquire_owned().map_err(|_| refusal)?;
            if let Some(ip) = peer {
                let count = peers.entry(ip).or_default();
                match phase {
                    Phase::Handshake => count.handshaking += 1,
                    Phase::Transmission => count.transmitting += 1,
                }
            }
            gauge.fetch_add(1, Ordering::Relaxed);
            Ok(Place {
                admission: Arc::clone(self),
                peer,
                transmission: phase == Phase::Transmission,
                _permit: permit,
            })
        })();
        if result.is_err() {
            self.gauges.refused();
        }
        result
    }

    fn leave(&self, phase: Phase, peer: Option<IpAddr>) {
        match phase {
            Phase::Handshake => self.gauges.handshaking.fetch_sub(1, Ordering::Relaxed),
            Phase::Transmission => self.gauges.transmitting.fetch_sub(1, Ordering::Relaxed),
        };
        let Some(ip) = peer else { return };
        let mut peers = self.peers();
        if let Some(count) = peers.get_mut(&ip) {
            match phase {
                Phase::Handshake => count.handshaking -= 1,
                Phase::Transmission => count.transmitting -= 1,
            }
            if count.handshaking == 0 && count.transmitting == 0 {
                peers.remove(&ip);
            }
        }
    }

    /// Waits until every place is free and takes them all (shutdown), so no new connection gets
    /// one. Gives up after `timeout`; returns whether it got them.
    pub(crate) async fn wait_until_empty(&self, timeout: std::time::Duration) -> bool {
        let all_handshaking = u32::try_from(self.limits.max_handshaking).expect("validated");
        let all_transmitting = u32::try_from(self.limits.max_connections).expect("validated");
        let both = async {
            let handshaking = self.handshaking.acquire_many(all_handshaking).await;
            let transmitting = self.transmitting.acquire_many(all_transmitting).await;
            (handshaking, transmitting)
        };
        tokio::time::timeout(timeout, both).await.is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_are_counted_per_phase_and_per_peer() {
        let limits = Limits {
            max_handshaking: 3,
            max_handshaking_per_peer: 2,
            max_connections: 2,
            max_connections_per_peer: 1,
            ..Limits::default()
        };
        let admission = Arc::new(Admission::new(&limits));
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        let a1 = admission.enter_handshake(Some(a)).unwrap();
        let a2 = admission.enter_handshake(Some(a)).unwrap();
        assert_eq!(admission.enter_handshake(Some(a)).unwrap_err(), Refusal::PeerHandshaking);
        let b1 = admission.enter_handshake(Some(b)).unwrap();
        assert_eq!(admission.enter_handshake(None).unwrap_err(), Refusal::Handshaking);
        let ta1 = admission.enter_transmission(Some(a)).unwrap();
        drop(a1);
        assert_eq!(admission.enter_transmission(Some(a)).unwrap_err(), Refusal::PeerTransmitting);
        let tb1 = admission.enter_transmission(Some(b)).unwrap();
        drop(b1);
        assert_eq!(admission.enter_transmission(None).unwrap_err(), Refusal::Transmitting);
        let stats = admission.gauges.snapshot();
        assert_eq!((stats.handshaking, stats.transmitting, stats.refused_connections), (1, 2, 4));
        drop((a2, ta1, tb1));
        assert!(admission.peers().is_empty(), "peers without connections are forgotten");
        let stats = admission.gauges.snapshot();
        assert_eq!((stats.handshaking, stats.transmitting), (0, 0));
    }
}
