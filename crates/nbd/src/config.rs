//! Server configuration: limits with their defaults, and TLS.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

/// Bounds on what clients may make the server hold. Every field has a default (see
/// [`Limits::default`]) and is documented in `docs/nbd.md`.
///
/// A connection is first *handshaking* (from accept to the end of option haggling) and then, if
/// the client chose an export, *transmitting*. The two phases have separate budgets, so sockets
/// that never finish a handshake cannot take the places of clients that did; a full handshake
/// budget closes the handshake with the weakest claim rather than refusing the newcomer, so
/// silent sockets cannot keep clients out either. The per-peer limits apply to TCP clients (one
/// peer is one IPv4 address or IPv6 /64) and to Unix-socket clients (one peer is one user id,
/// from `SO_PEERCRED`; root and the server's own user are not limited per peer).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections in the handshake (accepted, not yet transmitting). A new connection beyond
    /// it takes the place of the handshake with the weakest claim (silent before talking before
    /// authenticated; then the peer holding the most; then the longest quiet), which is closed.
    pub max_handshaking: usize,
    /// Connections in the handshake from one peer. A new connection beyond it takes the place
    /// of that peer's own weakest handshake.
    pub max_handshaking_per_peer: usize,
    /// Connections in transmission. A handshake that ends while this many are transmitting is
    /// refused: `NBD_OPT_GO` is answered `NBD_REP_ERR_POLICY` (the client may retry within the
    /// handshake timeout), `NBD_OPT_EXPORT_NAME` closes the connection.
    pub max_connections: usize,
    /// Connections in transmission from one peer (TCP address or Unix-socket user); refused
    /// like `max_connections`.
    pub max_connections_per_peer: usize,
    /// Requests one connection may have in flight (executing or with replies not yet sent).
    /// Further requests are not read until one finishes.
    pub max_requests_in_flight: usize,
    /// Bytes one connection may hold for requests in flight: write data received, read data to
    /// produce or not yet sent, and each request's largest possible reply. A request that would
    /// go over is not read until enough is sent; a single request is always admitted when the
    /// connection holds nothing. At most 4 GiB.
    pub max_in_flight_bytes: usize,
    /// Bytes connections may hold for requests in flight beyond their guarantee, all together
    /// (counted as for `max_in_flight_bytes`). Every connection in transmission may hold one
    /// request of any allowed size ([`Limits::guaranteed_in_flight_bytes`]) whatever the others
    /// hold; beyond that it borrows from this budget, first come, first served, and a connection
    /// that cannot borrow its next request's bytes stops reading requests until they are free
    /// (nothing is refused). So a client that reads no replies stalls itself only: the most it
    /// can take from the others is their share of this budget, never their guarantee.
    pub max_shared_in_flight_bytes: usize,
    /// Largest read or write payload (advertised as the maximum block size). It is also what
    /// every connection is guaranteed (see `max_shared_in_flight_bytes`), so it sizes the
    /// server's worst-case memory with `max_connections`.
    pub max_payload_bytes: u32,
    /// Largest option payload during the handshake; a larger one closes the connection.
    pub max_option_bytes: u32,
    /// Options one handshake may send before the connection is closed.
    pub max_options_per_handshake: u32,
    /// Time from accept to the end of the handshake (including TLS); then the connection is
    /// closed and its handshake place freed.
    pub handshake_timeout: Duration,
    /// How long replies may wait for a client that reads none of them: a transmitting connection
    /// whose queued replies make no progress for this long is closed, which frees the bytes it
    /// holds for other clients.
    pub send_timeout: Duration,
    /// How long a graceful shutdown waits for connections to finish their in-flight requests.
    pub shutdown_grace: Duration,
    /// Most extents in one block status reply.
    pub max_extents_per_reply: usize,
    /// Warnings that clients can cause once per connection (refused connections, handshake
    /// timeouts and failures, protocol errors) are logged at most once per this interval and
    /// kind; the ones in between are counted and reported in one summary line.
    pub warning_interval: Duration,
    /// How long a connection keeps polling for its next request, without sleeping, after it
    /// last did something (a bounded busy poll; zero sleeps at once). It trades server CPU for
    /// latency: a busy client's next request is picked up without the runtime going to sleep
    /// and being woken for it. The window halves each time it passes with nothing arriving, so
    /// a client that pauses stops costing CPU after a few pauses.
    pub busy_poll: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_handshaking: 64,
            max_handshaking_per_peer: 16,
            max_connections: 128,
            max_connections_per_peer: 64,
            max_requests_in_flight: 128,
            max_in_flight_bytes: 16 << 20,
            max_shared_in_flight_bytes: 64 << 20,
            max_payload_bytes: 4 << 20,
            max_option_bytes: 64 << 10,
            max_options_per_handshake: 1024,
            handshake_timeout: Duration::from_secs(10),
            send_timeout: Duration::from_secs(60),
            shutdown_grace: Duration::from_secs(10),
            max_extents_per_reply: 4096,
            warning_interval: Duration::from_secs(10),
            busy_poll: Duration::from_micros(100),
        }
    }
}

impl Limits {
    /// The most bytes one request can make a connection hold: its payload (write data or read
    /// data) and its largest reply (an error chunk with the longest message, or a block status
    /// reply with `max_extents_per_reply` extents).
    pub fn max_request_bytes(&self) -> usize {
        crate::transmission::request_cost_bound(self)
    }

    /// Bytes every connection in transmission may hold whatever the others hold: one request of
    /// any allowed size ([`Limits::max_request_bytes`]).
    pub fn guaranteed_in_flight_bytes(&self) -> usize {
        self.max_request_bytes()
    }

    /// The most bytes all connections together may hold for requests in flight: every
    /// connection's guarantee and the shared budget, `max_connections` ×
    /// [`Limits::guaranteed_in_flight_bytes`] + `max_shared_in_flight_bytes` (saturating; a valid
    /// configuration does not overflow).
    pub fn max_total_in_flight_bytes(&self) -> usize {
        self.max_connections
            .saturating_mul(self.guaranteed_in_flight_bytes())
            .saturating_add(self.max_shared_in_flight_bytes)
    }
}

/// Whether and how TLS is offered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsMode {
    /// No TLS: `NBD_OPT_STARTTLS` is answered `NBD_REP_ERR_POLICY`.
    Off,
    /// TLS available at the client's choice; plaintext also allowed.
    On,
    /// TLS required (the spec's FORCEDTLS): every option other than `STARTTLS` and `ABORT` before
    /// TLS is answered `NBD_REP_ERR_TLS_REQD`, and `NBD_OPT_EXPORT_NAME` closes the connection.
    Require,
}

impl std::fmt::Display for TlsMode {
    /// As written in configurations: `off`, `on` or `require`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TlsMode::Off => "off",
            TlsMode::On => "on",
            TlsMode::Require => "require",
        })
    }
}

impl std::str::FromStr for TlsMode {
    type Err = ConfigError;
    fn from_str(text: &str) -> Result<TlsMode, ConfigError> {
        match text {
            "off" => Ok(TlsMode::Off),
            "on" => Ok(TlsMode::On),
            "require" => Ok(TlsMode::Require),
            other => Err(ConfigError::BadTlsMode(other.to_owned())),
        }
    }
}

/// TLS settings: the mode and, unless it is `Off`, the server's certificate and key.
#[derive(Clone)]
pub struct TlsConfig {
    /// The mode.
    pub mode: TlsMode,
    /// Acceptor built from the certificate and key; required unless `mode` is `Off`.
    pub acceptor: Option<TlsAcceptor>,
    /// The acceptor requires a client certificate signed by a configured CA (see
    /// [`TlsConfig::from_pem_files_with_client_ca`]).
    pub client_auth: bool,
}

impl std::fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConfig")
            .field("mode", &self.mode)
            .field("has_cert", &self.acceptor.is_some())
            .field("client_auth", &self.client_auth)
            .finish()
    }
}

impl TlsConfig {
    /// No TLS.
    pub fn off() -> TlsConfig {
        TlsConfig { mode: TlsMode::Off, acceptor: None, client_auth: false }
    }

    /// TLS in `mode` with an X.509 certificate chain and private key from PEM files. Clients
    /// need no certificate.
    pub fn from_pem_files(
        mode: TlsMode,
        cert_path: &Path,
        key_path: &Path,
    ) -> Result<TlsConfig, ConfigError> {
        TlsConfig::from_pem_files_with_client_ca(mode, cert_path, key_path, None)
    }

    /// As [`TlsConfig::from_pem_files`], and with `client_ca` (a PEM file of one or more CA
    /// certificates), every client must present a certificate chain to one of those CAs in the
    /// TLS handshake, or the handshake fails and the connection closes. Only meaningful with
    /// [`TlsMode::Require`] (validated by [`ServerConfig::validate`]): otherwise a client could
    /// skip TLS and with it the certificate.
    pub fn from_pem_files_with_client_ca(
        mode: TlsMode,
        cert_path: &Path,
        key_path: &Path,
        client_ca: Option<&Path>,
    ) -> Result<TlsConfig, ConfigError> {
        let certs = read_certificates(cert_path)?;
        let key = PrivateKeyDer::from_pem_file(key_path).map_err(|err| ConfigError::Pem {
            path: key_path.display().to_string(),
            reason: err.to_string(),
        })?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|err| ConfigError::Tls(err.to_string()))?;
        let builder = match client_ca {
            None => builder.with_no_client_auth(),
            Some(ca_path) => {
                let mut roots = rustls::RootCertStore::empty();
                for ca in read_certificates(ca_path)? {
                    roots.add(ca).map_err(|err| ConfigError::Pem {
                        path: ca_path.display().to_string(),
                        reason: format!("not a usable CA certificate: {err}"),
                    })?;
                }
                let verifier =
                    rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                        .build()
                        .map_err(|err| ConfigError::Tls(format!("client CA {}: {err}", ca_path.display())))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let config = builder.with_single_cert(certs, key).map_err(|err| ConfigError::Tls(err.to_string()))?;
        Ok(TlsConfig {
            mode,
            acceptor: Some(TlsAcceptor::from(Arc::new(config))),
            client_auth: client_ca.is_some(),
        })
    }
}

/// The certificates in a PEM file (at least one).
fn read_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, ConfigError> {
    let pem_error = |reason: String| ConfigError::Pem { path: path.display().to_string(), reason };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .map_err(|err| pem_error(err.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|err| pem_error(err.to_string()))?;
    if certs.is_empty() {
        return Err(pem_error("no certificate found".to_owned()));
    }
    Ok(certs)
}

/// Everything a [`crate::Server`] needs besides its exports.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Limits.
    pub limits: Limits,
    /// TLS.
    pub tls: TlsConfig,
    /// Threads that connections run on, each connection on one of them from accept to close
    /// (`stria_poll::ConnectionThreads`, docs/design/datapath.md); 0 runs every connection as a
    /// task of the runtime that accepted it. At most `stria_poll::threads::MAX_THREADS`.
    pub connection_threads: usize,
    /// Stack of each connection thread.
    pub connection_thread_stack_bytes: usize,
}

impl Default for ServerConfig {
    fn default() -> ServerConfig {
        ServerConfig {
            limits: Limits::default(),
            tls: TlsConfig::off(),
            connection_threads: 0,
            connection_thread_stack_bytes: 8 << 20,
        }
    }
}

/// A configuration the server cannot run with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// TLS mode is not off, on or require
    #[error("TLS mode {0:?} is not off, on or require")]
    BadTlsMode(String),
    /// TLS is on but no certificate was given
    #[error("TLS mode is on or require but no certificate and key were given")]
    MissingCertificate,
    /// Client certificates are required but TLS is not
    #[error(
        "client certificates (a client CA) need TLS mode require: with mode {0} a client could skip TLS and its certificate"
    )]
    ClientCaWithoutRequire(TlsMode),
    /// A PEM file could not be read
    #[error("cannot read PEM file {path}: {reason}")]
    Pem {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// rustls refused the certificate or key
    #[error("TLS setup failed: {0}")]
    Tls(String),
    /// The connection threads could not be started
    #[error("cannot start the connection threads: {0}")]
    Threads(String),
    /// A limit is out of range
    #[error("limit {name} is out of range: {reason}")]
    BadLimit {
        /// Which limit.
        name: &'static str,
        /// Why.
        reason: &'static str,
    },
}

impl ServerConfig {
    /// Checks that the configuration can be served.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.tls.mode != TlsMode::Off && self.tls.acceptor.is_none() {
            return Err(ConfigError::MissingCertificate);
        }
        if self.tls.client_auth && self.tls.mode != TlsMode::Require {
            return Err(ConfigError::ClientCaWithoutRequire(self.tls.mode));
        }
        if self.connection_threads > stria_poll::threads::MAX_THREADS {
            return Err(ConfigError::BadLimit { name: "connection_threads", reason: "must be at most 1024" });
        }
        let limits = &self.limits;
        let at_least_one = [
            ("max_handshaking", limits.max_handshaking),
            ("max_handshaking_per_peer", limits.max_handshaking_per_peer),
            ("max_connections", limits.max_connections),
            ("max_connections_per_peer", limits.max_connections_per_peer),
        ];
        for (name, value) in at_least_one {
            if value == 0 {
                return Err(ConfigError::BadLimit { name, reason: "must be at least 1" });
            }
        }
        // Tokio semaphores hold at most usize::MAX >> 3 permits.
        for (name, value) in
            [("max_handshaking", limits.max_handshaking), ("max_connections", limits.max_connections)]
        {
            if value > u32::MAX as usize {
                return Err(ConfigError::BadLimit { name, reason: "must fit in 32 bits" });
            }
        }
        if limits.max_shared_in_flight_bytes > usize::MAX >> 3 {
            return Err(ConfigError::BadLimit {
                name: "max_shared_in_flight_bytes",
                reason: "must be below 2^61",
            });
        }
        if u32::try_from(limits.max_in_flight_bytes).is_err() {
            return Err(ConfigError::BadLimit {
                name: "max_in_flight_bytes",
                reason: "must be at most 4 GiB",
            });
        }
        if limits.max_requests_in_flight == 0 {
            return Err(ConfigError::BadLimit {
                name: "max_requests_in_flight",
                reason: "must be at least 1",
            });
        }
        if limits.max_payload_bytes < 4096 {
            return Err(ConfigError::BadLimit { name: "max_payload_bytes", reason: "must be at least 4096" });
        }
        if limits.max_option_bytes < 8192 {
            return Err(ConfigError::BadLimit {
                name: "max_option_bytes",
                reason: "must be at least 8192 (two 4096-byte strings)",
            });
        }
        if limits.max_extents_per_reply == 0 {
            return Err(ConfigError::BadLimit {
                name: "max_extents_per_reply",
                reason: "must be at least 1",
            });
        }
        if u32::try_from(limits.max_request_bytes()).is_err() {
            return Err(ConfigError::BadLimit {
                name: "max_payload_bytes",
                reason: "one request's bytes (payload and largest reply) must fit in 32 bits",
            });
        }
        let total = limits
            .max_connections
            .checked_mul(limits.guaranteed_in_flight_bytes())
            .and_then(|guaranteed| guaranteed.checked_add(limits.max_shared_in_flight_bytes));
        if total.is_none_or(|total| total > usize::MAX >> 3) {
            return Err(ConfigError::BadLimit {
                name: "max_connections",
                reason: "max_connections guarantees of one request each, plus max_shared_in_flight_bytes, \
                         must be below 2^61 bytes",
            });
        }
        if limits.warning_interval.is_zero() {
            return Err(ConfigError::BadLimit { name: "warning_interval", reason: "must not be zero" });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(limits: Limits) -> Result<(), ConfigError> {
        ServerConfig { limits, ..ServerConfig::default() }.validate()
    }

    #[test]
    fn client_certificates_need_tls_required() {
        let tls = TlsConfig { client_auth: true, ..TlsConfig::off() };
        let config = ServerConfig { tls, ..ServerConfig::default() };
        assert_eq!(config.validate(), Err(ConfigError::ClientCaWithoutRequire(TlsMode::Off)));
    }

    #[test]
    fn defaults_are_valid_and_bound_the_total_in_flight() {
        check(Limits::default()).unwrap();
        let bad = |name| Err(ConfigError::BadLimit { name, reason: "must be at least 1" });
        assert_eq!(check(Limits { max_handshaking: 0, ..Limits::default() }), bad("max_handshaking"));
        assert_eq!(
            check(Limits { max_connections_per_peer: 0, ..Limits::default() }),
            bad("max_connections_per_peer")
        );
        let one_request = Limits::default().max_request_bytes();
        assert_eq!(one_request, (4 << 20) + 1050);
        assert_eq!(Limits::default().guaranteed_in_flight_bytes(), one_request);
        // 128 guarantees of one request and 64 MiB shared: about 576 MiB.
        assert_eq!(Limits::default().max_total_in_flight_bytes(), 128 * one_request + (64 << 20));
        check(Limits { max_shared_in_flight_bytes: 0, ..Limits::default() }).unwrap();
        let status_heavy = Limits { max_extents_per_reply: 8 << 20, ..Limits::default() };
        assert_eq!(status_heavy.max_request_bytes(), (8 << 20) * 8 + 24);
        let oversized = check(Limits { max_payload_bytes: u32::MAX, ..Limits::default() });
        assert!(
            matches!(oversized, Err(ConfigError::BadLimit { name: "max_payload_bytes", .. })),
            "{oversized:?}"
        );
        let too_many =
            check(Limits { max_connections: 1 << 31, max_payload_bytes: 1 << 30, ..Limits::default() });
        assert!(
            matches!(too_many, Err(ConfigError::BadLimit { name: "max_connections", .. })),
            "{too_many:?}"
        );
        let huge = check(Limits { max_in_flight_bytes: 1 << 33, ..Limits::default() });
        assert!(matches!(huge, Err(ConfigError::BadLimit { name: "max_in_flight_bytes", .. })), "{huge:?}");
    }
}
