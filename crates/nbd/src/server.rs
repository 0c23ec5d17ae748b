//! The server: listeners, connection limits, TLS upgrade, graceful shutdown.

use std::future::Future;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, ToSocketAddrs, UnixListener};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use crate::admission::{
    Admission, Eviction, HandshakePlace, HandshakeTicket, Peer, Place, Refusal, ServerStats, Standing,
};
use crate::budget::ByteBudget;
use crate::config::{ConfigError, ServerConfig};
use crate::export::ExportRegistry;
use crate::handshake::{self, HandshakeContext, HandshakeEnd, HandshakeError, Negotiated, NegotiationState};
use crate::transmission::{self, TransmissionEnd};
use crate::warn_limit::{Kind, Warnings};
use crate::wire::SessionParams;
use stria_poll::ConnectionThreads;

/// A byte stream a connection can run on.
pub trait NbdStream: AsyncRead + AsyncWrite + Unpin + Send + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> NbdStream for T {}

/// An accepted socket that can leave the runtime that accepted it for a connection thread's
/// (deregistered from one reactor, registered with the other's).
trait Rehome: NbdStream + Sized {
    type Std: Send + 'static;
    fn into_std(self) -> io::Result<Self::Std>;
    /// Call within the runtime the socket is to be registered with.
    fn from_std(std: Self::Std) -> io::Result<Self>;
}

impl Rehome for tokio::net::UnixStream {
    type Std = std::os::unix::net::UnixStream;
    fn into_std(self) -> io::Result<Self::Std> {
        tokio::net::UnixStream::into_std(self)
    }
    fn from_std(std: Self::Std) -> io::Result<Self> {
        tokio::net::UnixStream::from_std(std)
    }
}

impl Rehome for tokio::net::TcpStream {
    type Std = std::net::TcpStream;
    fn into_std(self) -> io::Result<Self::Std> {
        tokio::net::TcpStream::into_std(self)
    }
    fn from_std(std: Self::Std) -> io::Result<Self> {
        tokio::net::TcpStream::from_std(std)
    }
}

struct Inner {
    config: ServerConfig,
    registry: Arc<dyn ExportRegistry>,
    admission: Arc<Admission>,
    warnings: Warnings,
    shutdown: watch::Sender<bool>,
    listeners: Mutex<Vec<JoinHandle<()>>>,
    unix_paths: Mutex<Vec<PathBuf>>,
    next_connection_id: AtomicU64,
    /// Where accepted connections run (`None`: on the accepting runtime).
    threads: Option<ConnectionThreads>,
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
        let threads = match config.connection_threads {
            0 => None,
            n => Some(
                ConnectionThreads::start(n, "stria-nbd-conn", config.connection_thread_stack_bytes)
                    .map_err(|e| ConfigError::Threads(e.to_string()))?,
            ),
        };
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
                threads,
            }),
        })
    }

    /// Live connections on each connection thread (empty without connection threads).
    pub fn connections_per_thread(&self) -> Vec<usize> {
        self.inner.threads.as_ref().map_or_else(Vec::new, ConnectionThreads::live)
    }

    /// Listens on a Unix socket at `path` (which must not exist). Call within a Tokio runtime.
    pub fn serve_unix(&self, path: impl AsRef<Path>) -> io::Result<ServerHandle> {
        let path = path.as_ref().to_path_buf();
        let listener = UnixListener::bind(&path)?;
        // The socket file's owner is the server's user, exempt from the per-peer limits like root.
        let server_uid = std::fs::metadata(&path)?.uid();
        info!(path = %path.display(), "NBD server listening on a Unix socket");
        lock(&self.inner.unix_paths).push(path.clone());
        let server = self.clone();
        let label = path.display().to_string();
        let task = tokio::spawn(async move {
            server
                .accept_loop(
                    || listener.accept(),
                    |(stream, _addr), id| {
                        // The user the client's socket was opened with (SO_PEERCRED).
                        let peer = match stream.peer_cred() {
                            Ok(cred) => Some(Peer::unix(cred.uid(), server_uid)),
                            Err(error) => {
                                debug!(%error, "cannot read the peer's credentials; no per-peer limit");
                                None
                            }
                        };
                        let uid = peer.map(|peer| peer.key.to_string()).unwrap_or_default();
                        (stream, format!("unix:{label}#{id} {uid}"), peer)
                    },
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
                        (stream, addr.to_string(), Some(Peer::tcp(addr.ip())))
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
        prepare: impl Fn(T, u64) -> (S, String, Option<Peer>),
    ) where
        A: FnMut() -> Fut,
        Fut: Future<Output = io::Result<T>>,
        S: Rehome,
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
                // At most `max_handshaking` evicted handshakes still closing: see `Admission`.
                accepted = async {
                    self.inner.admission.wait_for_handshake_room().await;
                    accept().await
                } => accepted,
            };
            match accepted {
                Ok(accepted) => {
                    let id = self.inner.next_connection_id.fetch_add(1, Ordering::Relaxed);
                    let (stream, label, peer) = prepare(accepted, id);
                    match self.inner.admission.enter_handshake(peer) {
                        Ok((place, eviction)) => {
                            if let Some(eviction) = eviction {
                                self.log_eviction(&label, eviction);
                            }
                            self.start_connection(stream, label, peer, place);
                        }
                        Err(refusal) => self.log_refusal(&label, refusal),
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

    /// Runs an accepted connection: on the connection thread with the fewest connections when
    /// the server has them, else as a task of this runtime.
    fn start_connection<S: Rehome>(
        &self,
        stream: S,
        label: String,
        peer: Option<Peer>,
        place: HandshakePlace,
    ) {
        let server = self.clone();
        let Some(threads) = &self.inner.threads else {
            tokio::spawn(async move { server.run_connection(stream, label, peer, place).await });
            return;
        };
        let std = match stream.into_std() {
            Ok(std) => std,
            Err(error) => {
                // Dropping the place frees it: the connection is closed like a refused one.
                debug!(peer = label, %error, "cannot hand a connection to its thread; closing it");
                return;
            }
        };
        threads.spawn(async move {
            match S::from_std(std) {
                Ok(stream) => server.run_connection(stream, label, peer, place).await,
                Err(error) => {
                    debug!(peer = label, %error, "cannot register a connection on its thread; closing it")
                }
            }
        });
    }

    /// Serves one already-connected stream to completion (for tests, fuzzing and socket
    /// activation). Counts against the handshake and transmission limits (not a per-peer one);
    /// like an accepted connection, it may take the place of the weakest handshake when the
    /// handshake places are full. Returns at once while the server shuts down.
    pub async fn serve_stream<S: NbdStream>(&self, stream: S, label: impl Into<String>) {
        let label = label.into();
        match self.inner.admission.enter_handshake(None) {
            Ok((place, eviction)) => {
                if let Some(eviction) = eviction {
                    self.log_eviction(&label, eviction);
                }
                self.run_connection(stream, label, None, place).await;
            }
            Err(refusal) => self.log_refusal(&label, refusal),
        }
    }

    /// What the server holds for its clients now: connections per phase, bytes in flight.
    pub fn stats(&self) -> ServerStats {
        self.inner.admission.gauges.snapshot()
    }

    /// Logs that a new connection took the place of a handshake (rate-limited).
    fn log_eviction(&self, peer: &str, eviction: Eviction) {
        let limits = &self.inner.config.limits;
        let (kind, limit, what) = match eviction {
            Eviction::Handshaking => (
                Kind::HandshakeEvicted,
                limits.max_handshaking,
                "handshake limit reached; closing the least active handshake to make room",
            ),
            Eviction::PeerHandshaking => (
                Kind::PeerHandshakeEvicted,
                limits.max_handshaking_per_peer,
                "per-peer handshake limit reached; closing that peer's least active handshake to make room",
            ),
        };
        self.inner.warnings.warn(kind, |left_out| warn!(peer, limit, left_out, "{what}"));
    }

    /// Logs a refused connection (rate-limited).
    fn log_refusal(&self, peer: &str, refusal: Refusal) {
        let limits = &self.inner.config.limits;
        let (kind, limit, what) = match refusal {
            Refusal::ShuttingDown => {
                debug!(peer, "refused: the server is shutting down");
                return;
            }
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
    fn enter_transmission(&self, label: &str, peer: Option<Peer>) -> Result<Place, String> {
        self.inner.admission.enter_transmission(peer).map_err(|refusal| {
            self.log_refusal(label, refusal);
            let limits = &self.inner.config.limits;
            match refusal {
                Refusal::PeerTransmitting => format!(
                    "this client ({}) already has {} connections in transmission, the server's \
                     limit per peer; try again later",
                    peer.map(|peer| peer.key.to_string()).unwrap_or_default(),
                    limits.max_connections_per_peer
                ),
                Refusal::ShuttingDown => "the server is shutting down".to_owned(),
                _ => format!(
                    "the server already has {} connections in transmission, its limit; try again later",
                    limits.max_connections
                ),
            }
        })
    }

    /// Runs one connection: the handshake (until it ends, times out, is evicted or the server
    /// shuts down), then transmission. `peer` is the label for logs, `peer_id` what the per-peer
    /// limits count.
    async fn run_connection<S: NbdStream>(
        &self,
        stream: S,
        peer: String,
        peer_id: Option<Peer>,
        place: HandshakePlace,
    ) {
        let peer = peer.as_str();
        debug!(peer, "client connected");
        let mut shutdown = self.inner.shutdown.subscribe();
        let limits = &self.inner.config.limits;
        let HandshakePlace { ticket, mut evicted } = place;
        let handshake =
            tokio::time::timeout(limits.handshake_timeout, self.handshake(stream, peer, peer_id, &ticket));
        let outcome = tokio::select! {
            _ = wait_for_shutdown(&mut shutdown) => {
                debug!(peer, "closing a handshaking connection for shutdown");
                return;
            }
            _ = &mut evicted => {
                debug!(peer, "closing a handshake to make room for a new connection");
                return;
            }
            outcome = handshake => outcome,
        };
        // The handshake is over: its place is free (a connection entering transmission took a
        // place there during the handshake).
        drop(ticket);
        let upgraded = match outcome {
            Err(_) => {
                let timeout_ms = limits.handshake_timeout.as_millis();
                self.inner.warnings.warn(Kind::HandshakeTimeout, |left_out| {
                    warn!(peer, timeout_ms, left_out, "handshake timed out");
                });
                return;
            }
            Ok(Err(error)) => {
                handshake::log_handshake_error(peer, &error, &self.inner.warnings);
                return;
            }
            Ok(Ok(None)) => {
                debug!(peer, "client aborted the handshake");
                return;
            }
            Ok(Ok(Some(upgraded))) => upgraded,
        };
        match upgraded {
            Upgraded::Plain(stream, negotiated) => self.transmit(stream, negotiated, peer, false).await,
            Upgraded::Tls(stream, negotiated) => self.transmit(*stream, negotiated, peer, true).await,
        }
    }

    async fn handshake<S: NbdStream>(
        &self,
        mut stream: S,
        label: &str,
        peer: Option<Peer>,
        ticket: &HandshakeTicket,
    ) -> Result<Option<Upgraded<S>>, HandshakeError> {
        let tls = &self.inner.config.tls;
        let enter_transmission = || self.enter_transmission(label, peer);
        let progressed = || ticket.progressed(Standing::Talking);
        let ctx = HandshakeContext {
            limits: &self.inner.config.limits,
            tls_mode: tls.mode,
            registry: self.inner.registry.as_ref(),
            enter_transmission: &enter_transmission,
            progressed: &progressed,
        };
        let mut state =
            NegotiationState { no_zeroes: handshake::greet(&mut stream).await?, ..Default::default() };
        progressed();
        match handshake::negotiate(&mut stream, &mut state, &ctx).await? {
            HandshakeEnd::Transmission(negotiated) => Ok(Some(Upgraded::Plain(stream, negotiated))),
            HandshakeEnd::Aborted => Ok(None),
            HandshakeEnd::StartTls => {
                let acceptor =
                    tls.acceptor.as_ref().expect("STARTTLS is acknowledged only with a certificate");
                let mut stream = acceptor.accept(stream).await.map_err(HandshakeError::Tls)?;
                // With client certificates required, only a verified client gets this far.
                ticket.progressed(if tls.client_auth { Standing::Authenticated } else { Standing::Talking });
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
        let budget = ByteBudget::new(
            Arc::clone(&admission.shared_bytes),
            Arc::clone(&admission.gauges),
            limits.guaranteed_in_flight_bytes(),
        );
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

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
