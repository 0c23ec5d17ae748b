//! The server: listeners, connection limits, TLS upgrade, graceful shutdown.

use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, ToSocketAddrs, UnixListener};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use crate::admission::{Admission, Place, Refusal, ServerStats};
use crate::budget::ByteBudget;
use crate::config::{ConfigError, ServerConfig};
use crate::export::ExportRegistry;
use crate::handshake::{self, HandshakeContext, HandshakeEnd, HandshakeError, Negotiated, NegotiationState};
use crate::transmission::{self, TransmissionEnd};
use crate::warn_limit::{Kind, Warnings};
use crate::wire::SessionParams;

/// A byte stream a connection can run on.
pub trait NbdStream: AsyncRead + AsyncWrite + Unpin + Send + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> NbdStream for T {}

struct Inner {
    config: ServerConfig,
    registry: Arc<dyn ExportRegistry>,
    admission: Arc<Admission>,
    warnings: Warnings,
    shutdown: watch::Sender<bool>,
    listeners: Mutex<Vec<JoinHandle<()>>>,
    unix_paths: Mutex<Vec<PathBuf>>,
    next_connection_id: AtomicU64,
}

/// An NBD server. Cheap to clone; all clones serve the same exports under the same limits.
#[derive(Clone)]
pub struct Server {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server").field("config", &self.inner.config).finish()
    }
}

/// Where a listener listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListenAddr {
    /// A Unix socket path.
    Unix(PathBuf),
    /// A TCP address.
    Tcp(std::net::SocketAddr),
}

/// A running listener. Dropping it leaves the server running; [`ServerHandle::shutdown`] stops it.
#[derive(Debug)]
pub struct ServerHandle {
    server: Server,
    addr: ListenAddr,
}

impl ServerHandle {
    /// The address the listener is bound to (with the real port for `:0`).
    pub fn local_addr(&self) -> &ListenAddr {
        &self.addr
    }

    /// The server this listener belongs to.
    pub fn server(&self) -> &Server {
        &self.server
    }

    /// Shuts the whole server down gracefully (see [`Server::shutdown`]).
    pub async fn shutdown(self) {
        self.server.shutdown().await;
    }
}

impl Server {
    /// A server for the exports in `registry`.
    pub fn new(config: ServerConfig, registry: Arc<dyn ExportRegistry>) -> Result<Server, ConfigError> {
        config.validate()?;
        let (shutdown, _) = watch::channel(false);
        let admission = Arc::new(Admission::new(&config.limits));
        let warnings = Warnings::new(config.limits.warning_interval);
        Ok(Server {
            inner: Arc::new(Inner {
                config,
                registry,
                admission,
                warnings,
                shutdown,
                listeners: Mutex::new(Vec::new()),
                unix_paths: Mutex::new(Vec::new()),
                next_connection_id: AtomicU64::new(1),
            }),
        })
    }

    /// Listens on a Unix socket at `path` (which must not exist). Call within a Tokio runtime.
    pub fn serve_unix(&self, path: impl AsRef<Path>) -> io::Result<ServerHandle> {
        let path = path.as_ref().to_path_buf();
        let listener = UnixListener::bind(&path)?;
        info!(path = %path.display(), "NBD server listening on a Unix socket");
        lock(&self.inner.unix_paths).push(path.clone());
        let server = self.clone();
        let label = path.display().to_string();
        let task = tokio::spawn(async move {
            server
                .accept_loop(
                    || listener.accept(),
                    // No per-peer limit: see `Limits`.
                    |(stream, _addr), id| (stream, format!("unix:{label}#{id}"), None),
                )
                .await;
        });
        lock(&self.inner.listeners).push(task);
        Ok(ServerHandle { server: self.clone(), addr: ListenAddr::Unix(path) })
    }

    /// Listens on TCP. Call within a Tokio runtime.
    pub async fn serve_tcp(&self, addr: impl ToSocketAddrs) -> io::Result<ServerHandle> {
        let listener = TcpListener::bind(addr).await?;
        let local = listener.local_addr()?;
        info!(%local, "NBD server listening on TCP");
        let server = self.clone();
        let task = tokio::spawn(async move {
            server
                .accept_loop(
                    || listener.accept(),
                    |(stream, addr), _id| {
                        if let Err(error) = stream.set_nodelay(true) {
                            debug!(%error, "cannot set TCP_NODELAY");
                        }
                        (stream, addr.to_string(), Some(peer_key(addr.ip())))
                    },
                )
                .await;
        });
        lock(&self.inner.listeners).push(task);
        Ok(ServerHandle { server: self.clone(), addr: ListenAddr::Tcp(local) })
    }

    async fn accept_loop<A, Fut, T, S>(
        &self,
        mut accept: A,
        prepare: impl Fn(T, u64) -> (S, String, Option<IpAddr>),
    ) where
        A: FnMut() -> Fut,
        Fut: Future<Output = io::Result<T>>,
        S: NbdStream,
    {
        let mut shutdown = self.inner.shutdown.subscribe();
        let mut flush_warnings = tokio::time::interval(self.inner.warnings.interval());
        flush_warnings.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let accepted = tokio::select! {
                _ = wait_for_shutdown(&mut shutdown) => return,
                _ = flush_warnings.tick() => {
                    self.inner.warnings.flush();
                    continue;
                }
                accepted = accept() => accepted,
            };
            match accepted {
                Ok(accepted) => {
                    let id = self.inner.next_connection_id.fetch_add(1, Ordering::Relaxed);
                    let (stream, peer, ip) = prepare(accepted, id);
                    match self.inner.admission.enter_handshake(ip) {
                        Ok(place) => {
                            let server = self.clone();
                            tokio::spawn(async move { server.run_connection(stream, peer, ip, place).await });
                        }
                        Err(refusal) => self.log_refusal(&peer, refusal),
                    }
                }
                Err(error) => {
                    // EMFILE and friends: back off instead of spinning.
                    self.inner.warnings.warn(Kind::AcceptFailed, |left_out| {
                        warn!(%error, left_out, "accept failed");
                    });
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            }
        }
    }

    /// Serves one already-connected stream to completion (for tests, fuzzing and socket
    /// activation). Counts against the handshake and transmission limits (not a per-peer one);
    /// returns at once if the handshake limit is reached.
    pub async fn serve_stream<S: NbdStream>(&self, stream: S, peer: impl Into<String>) {
        let peer = peer.into();
        match self.inner.admission.enter_handshake(None) {
            Ok(place) => self.run_connection(stream, peer, None, place).await,
            Err(refusal) => self.log_refusal(&peer, refusal),
        }
    }

    /// What the server holds for its clients now: connections per phase, bytes in flight.
    pub fn stats(&self) -> ServerStats {
        self.inner.admission.gauges.snapshot()
    }

    /// Logs a refused connection (rate-limited).
    fn log_refusal(&self, peer: &str, refusal: Refusal) {
        let limits = &self.inner.config.limits;
        let (kind, limit, what) = match refusal {
            Refusal::Handshaking => (
                Kind::HandshakeLimit,
                limits.max_handshaking,
                "handshake limit reached; closing the new connection",
            ),
            Refusal::PeerHandshaking => (
                Kind::PeerHandshakeLimit,
                limits.max_handshaking_per_peer,
                "per-peer handshake limit reached; closing the new connection",
            ),
            Refusal::Transmitting => (
                Kind::ConnectionLimit,
                limits.max_connections,
                "connection limit reached; refusing the export",
            ),
            Refusal::PeerTransmitting => (
                Kind::PeerConnectionLimit,
                limits.max_connections_per_peer,
                "per-peer connection limit reached; refusing the export",
            ),
        };
        self.inner.warnings.warn(kind, |left_out| warn!(peer, limit, left_out, "{what}"));
    }

    /// A place in transmission for a connection ending its handshake, or the message that
    /// refuses it.
    fn enter_transmission(&self, peer: &str, ip: Option<IpAddr>) -> Result<Place, String> {
        self.inner.admission.enter_transmission(ip).map_err(|refusal| {
            self.log_refusal(peer, refusal);
            let limits = &self.inner.config.limits;
            match refusal {
                Refusal::PeerTransmitting => format!(
                    "this client address already has {} connections in transmission, the server's \
                     limit per address; try again later",
                    limits.max_connections_per_peer
                ),
                _ => format!(
                    "the server already has {} connections in transmission, its limit; try again later",
                    limits.max_connections
                ),
            }
        })
    }

    async fn run_connection<S: NbdStream>(&self, stream: S, peer: String, ip: Option<IpAddr>, place: Place) {
        debug!(peer, "client connected");
        let mut shutdown = self.inner.shutdown.subscribe();
        let limits = &self.inner.config.limits;
        let handshake = tokio::time::timeout(limits.handshake_timeout, self.handshake(stream, &peer, ip));
        let outcome = tokio::select! {
            _ = wait_for_shutdown(&mut shutdown) => {
                debug!(peer, "closing a handshaking connection for shutdown");
                return;
            }
            outcome = handshake => outcome,
        };
        // The handshake is over: its place is free (a connection entering transmission took a
        // place there during the handshake).
        drop(place);
        let upgraded = match outcome {
            Err(_) => {
                let timeout_ms = limits.handshake_timeout.as_millis();
                self.inner.warnings.warn(Kind::HandshakeTimeout, |left_out| {
                    warn!(peer, timeout_ms, left_out, "handshake timed out");
                });
                return;
            }
            Ok(Err(error)) => {
                handshake::log_handshake_error(&peer, &error, &self.inner.warnings);
                return;
            }
            Ok(Ok(None)) => {
                debug!(peer, "client aborted the handshake");
                return;
            }
            Ok(Ok(Some(upgraded))) => upgraded,
        };
        match upgraded {
            Upgraded::Plain(stream, negotiated) => self.transmit(stream, negotiated, &peer, false).await,
            Upgraded::Tls(stream, negotiated) => self.transmit(*stream, negotiated, &peer, true).await,
        }
    }

    async fn handshake<S: NbdStream>(
        &self,
        mut stream: S,
        peer: &str,
        ip: Option<IpAddr>,
    ) -> Result<Option<Upgraded<S>>, HandshakeError> {
        let tls = &self.inner.config.tls;
        let enter_transmission = || self.enter_transmission(peer, ip);
        let ctx = HandshakeContext {
            limits: &self.inner.config.limits,
            tls_mode: tls.mode,
            registry: self.inner.registry.as_ref(),
            enter_transmission: &enter_transmission,
        };
        let mut state =
            NegotiationState { no_zeroes: handshake::greet(&mut stream).await?, ..Default::default() };
        match handshake::negotiate(&mut stream, &mut state, &ctx).await? {
            HandshakeEnd::Transmission(negotiated) => Ok(Some(Upgraded::Plain(stream, negotiated))),
            HandshakeEnd::Aborted => Ok(None),
            HandshakeEnd::StartTls => {
                let acceptor =
                    tls.acceptor.as_ref().expect("STARTTLS is acknowledged only with a certificate");
                let mut stream = acceptor.accept(stream).await?;
                state.start_tls();
                match handshake::negotiate(&mut stream, &mut state, &ctx).await? {
                    HandshakeEnd::Transmission(negotiated) => {
                        Ok(Some(Upgraded::Tls(Box::new(stream), negotiated)))
                    }
                    HandshakeEnd::Aborted => Ok(None),
                    HandshakeEnd::StartTls => unreachable!("a second STARTTLS is refused inside negotiate"),
                }
            }
        }
    }

    async fn transmit<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        stream: S,
        negotiated: Negotiated,
        peer: &str,
        tls: bool,
    ) {
        let Negotiated { named, structured, block_status, place: _place } = negotiated;
        let export = Arc::clone(&named.export);
        let session = SessionParams {
            size_bytes: export.size_bytes(),
            read_only: export.read_only(),
            structured,
            block_status,
            max_payload_bytes: self.inner.config.limits.max_payload_bytes,
        };
        let name = named.name.as_str();
        info!(
            peer,
            export = name,
            tls,
            structured = session.structured,
            block_status = session.block_status,
            "client entered transmission"
        );
        let mut shutdown = self.inner.shutdown.subscribe();
        let limits = &self.inner.config.limits;
        let admission = &self.inner.admission;
        let budget = ByteBudget::new(Arc::clone(&admission.bytes), Arc::clone(&admission.gauges));
        let shutdown = wait_for_shutdown(&mut shutdown);
        let (end, requests) =
            transmission::run(stream, export.as_ref(), session, limits, budget, shutdown).await;
        match end {
            TransmissionEnd::Protocol(error) => self.inner.warnings.warn(Kind::ProtocolError, |left_out| {
                warn!(peer, export = name, requests, %error, left_out, "client disconnected: protocol error");
            }),
            TransmissionEnd::Io(error) => {
                info!(peer, export = name, requests, %error, "client disconnected: connection broke")
            }
            other => info!(peer, export = name, requests, reason = ?other, "client disconnected"),
        }
    }

    /// Stops accepting, closes handshaking connections, lets transmitting connections finish
    /// their in-flight requests (within `limits.shutdown_grace`), flushes their exports, and
    /// returns when every connection is closed. Removes the Unix socket files it created.
    pub async fn shutdown(&self) {
        self.inner.shutdown.send_replace(true);
        let listeners: Vec<JoinHandle<()>> = std::mem::take(&mut *lock(&self.inner.listeners));
        for listener in listeners {
            let _ = listener.await;
        }
        for path in std::mem::take(&mut *lock(&self.inner.unix_paths)) {
            let _ = std::fs::remove_file(&path);
        }
        let grace = self.inner.config.limits.shutdown_grace + std::time::Duration::from_secs(2);
        if !self.inner.admission.wait_until_empty(grace).await {
            warn!("connections still open after the shutdown grace period");
        }
        self.inner.warnings.flush_all();
        info!("NBD server stopped");
    }
}

enum Upgraded<S> {
    Plain(S, Negotiated),
    Tls(Box<tokio_rustls::server::TlsStream<S>>, Negotiated),
}

async fn wait_for_shutdown(shutdown: &mut watch::Receiver<bool>) {
    // An error means the server is gone, which is a shutdown too.
    let _ = shutdown.wait_for(|stopping| *stopping).await;
}

/// The peer a TCP client counts as for the per-peer limits: its IPv4 address, or the /64 prefix of
/// its IPv6 address (one host or network typically has a whole /64, so single IPv6 addresses
/// would be no limit at all). IPv4-mapped IPv6 addresses count as the IPv4 address.
fn peer_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(std::net::Ipv6Addr::from(v6.to_bits() & !u128::from(u64::MAX))),
        },
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_are_ipv4_addresses_or_ipv6_prefixes() {
        let key = |text: &str| peer_key(text.parse().unwrap()).to_string();
        assert_eq!(key("192.0.2.7"), "192.0.2.7");
        assert_eq!(key("::ffff:192.0.2.7"), "192.0.2.7");
        assert_eq!(key("2001:db8:1:2:aaaa:bbbb:cccc:dddd"), "2001:db8:1:2::");
        assert_eq!(key("2001:db8:1:2::1"), "2001:db8:1:2::");
        assert_ne!(key("2001:db8:1:3::1"), key("2001:db8:1:2::1"));
    }
}
