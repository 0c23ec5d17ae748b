//! `stria serve --http ADDR`: one listener for the metrics (`/metrics`), the REST API
//! (`/api/v1/...`) and the dashboard (`/`). docs/design/observability.md gives the design;
//! docs/api/openapi.yaml lists the routes.
//!
//! Bounds: [`CONNECTIONS_MAX`] connections (more are closed at accept), request bodies of
//! [`BODY_BYTES_MAX`], [`HEADER_TIMEOUT`] to send a request's headers and to finish a TLS
//! handshake, and [`CONNECTION_LIFETIME`] for any one connection.

mod api;
mod auth;
mod metrics;
pub(crate) mod node;
mod transfer;
mod ui;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use axum::Router;
use axum::extract::DefaultBodyLimit;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio_rustls::TlsAcceptor;

use crate::daemon::Daemon;

pub(crate) use auth::Token;

/// Connections served at once; one more is closed at accept.
const CONNECTIONS_MAX: usize = 64;
/// Largest request body (a request is a few hundred bytes of JSON).
const BODY_BYTES_MAX: usize = 64 << 10;
/// Time to finish a TLS handshake and to send a request's headers.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// A connection is closed after this long, whatever it does (a browser opens a new one).
const CONNECTION_LIFETIME: Duration = Duration::from_secs(300);

/// Where and how the HTTP listener serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HttpOptions {
    pub(crate) addr: SocketAddr,
    /// PEM certificate chain and key: HTTPS instead of HTTP (required off the loopback).
    pub(crate) tls_cert: Option<PathBuf>,
    pub(crate) tls_key: Option<PathBuf>,
    /// The bearer token's file (default `POOL/http.token`, made at the first start).
    pub(crate) token_file: Option<PathBuf>,
    /// The directory the API's import and export may use (`api_transfer_dir`); none: refused.
    pub(crate) transfer_dir: Option<PathBuf>,
}

/// `tcp:HOST:PORT` (or `HOST:PORT`), e.g. `tcp:127.0.0.1:9810`.
pub(crate) fn parse_addr(text: &str) -> Result<SocketAddr, String> {
    let a = text.strip_prefix("tcp:").unwrap_or(text);
    a.parse::<SocketAddr>().map_err(|_| format!("`{text}`: expected tcp:IP:PORT, e.g. tcp:127.0.0.1:9810"))
}

/// What every handler gets.
#[derive(Clone)]
pub(crate) struct AppState {
    pub(crate) daemon: Arc<Daemon>,
    pub(crate) token: Arc<parking_lot::RwLock<Token>>,
    /// Reads need the token too when the listener is not on the loopback.
    pub(crate) reads_need_token: bool,
    /// Where the API's import and export may read and write (resolved; see transfer.rs).
    pub(crate) transfer_dir: Option<Arc<PathBuf>>,
}

/// The running listener.
#[derive(Debug)]
pub(crate) struct HttpHandle {
    /// `http://ADDR/` or `https://ADDR/` (with the real port for `:0`).
    pub(crate) url: String,
    token: Arc<parking_lot::RwLock<Token>>,
    token_file: PathBuf,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl HttpHandle {
    /// Reads the token again (SIGHUP), from `path` or the file it was read from at start.
    pub(crate) fn reload_token(&self, path: Option<&std::path::Path>) -> Result<()> {
        let token = Token::load_or_create(path.unwrap_or(&self.token_file))?;
        *self.token.write() = token;
        Ok(())
    }

    /// Stops accepting and closes the connections.
    pub(crate) async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

/// The router of the three parts, with authentication and the body bound.
pub(crate) fn router(state: AppState) -> Router {
    Router::new()
        .route("/metrics", axum::routing::get(metrics::scrape))
        .merge(ui::router())
        .nest("/api/v1", api::router())
        .layer(axum::middleware::from_fn_with_state(state.clone(), auth::check))
        .layer(axum::middleware::from_fn(log_request))
        .layer(DefaultBodyLimit::max(BODY_BYTES_MAX))
        .with_state(state)
}

/// Logs method, path and status of each request (never headers or the query: no token).
async fn log_request(req: axum::extract::Request, next: axum::middleware::Next) -> axum::response::Response {
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    let response = next.run(req).await;
    let status = response.status().as_u16();
    if status >= 400 {
        tracing::info!(%method, path, status, "http request refused");
    } else {
        tracing::debug!(%method, path, status, "http request");
    }
    response
}

/// Binds the listener and serves until [`HttpHandle::shutdown`].
pub(crate) async fn start(opts: &HttpOptions, daemon: Arc<Daemon>) -> Result<HttpHandle> {
    let loopback = opts.addr.ip().is_loopback();
    let tls = match (&opts.tls_cert, &opts.tls_key) {
        (Some(cert), Some(key)) => Some(
            stria_nbd::TlsConfig::from_pem_files(stria_nbd::TlsMode::Require, cert, key)?
                .acceptor
                .context("no TLS acceptor")?,
        ),
        (None, None) if loopback => None,
        (None, None) => bail!(
            "--http {} is not on the loopback: give --http-tls-cert and --http-tls-key (the API \
             carries a bearer token, which must not cross a network in the clear)",
            opts.addr
        ),
        _ => bail!("--http-tls-cert and --http-tls-key go together"),
    };
    let transfer_dir = opts.transfer_dir.as_deref().map(transfer::resolve_dir).transpose()?.map(Arc::new);
    let token_file = opts.token_file.clone().unwrap_or_else(|| daemon.dir.path.join("http.token"));
    let token = Arc::new(parking_lot::RwLock::new(Token::load_or_create(&token_file)?));
    let listener =
        TcpListener::bind(opts.addr).await.with_context(|| format!("cannot listen on {}", opts.addr))?;
    let local = listener.local_addr()?;
    let url = format!("{}://{local}/", if tls.is_some() { "https" } else { "http" });
    tracing::info!(url, token_file = %token_file.display(), "http listener: metrics, REST API, dashboard");
    let app =
        router(AppState { daemon, token: Arc::clone(&token), reads_need_token: !loopback, transfer_dir });
    let (stop, stopped) = watch::channel(false);
    let task = tokio::spawn(accept_loop(listener, app, tls, stopped));
    Ok(HttpHandle { url, token, token_file, stop, task })
}

async fn accept_loop(
    listener: TcpListener,
    app: Router,
    tls: Option<TlsAcceptor>,
    mut stop: watch::Receiver<bool>,
) {
    let permits = Arc::new(Semaphore::new(CONNECTIONS_MAX));
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "http accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = stop.changed() => break,
        };
        while connections.try_join_next().is_some() {}
        let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
            tracing::warn!(%peer, limit = CONNECTIONS_MAX, "http connection refused: too many open");
            continue;
        };
        let (app, tls) = (app.clone(), tls.clone());
        connections.spawn(async move {
            let _permit = permit;
            let _ = tokio::time::timeout(CONNECTION_LIFETIME, serve_connection(stream, app, tls)).await;
        });
    }
    connections.shutdown().await;
}

async fn serve_connection(stream: tokio::net::TcpStream, app: Router, tls: Option<TlsAcceptor>) {
    let service = hyper_util::service::TowerToHyperService::new(app);
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(HEADER_TIMEOUT);
    let result = match tls {
        None => builder.serve_connection(TokioIo::new(stream), service).await,
        Some(acceptor) => match tokio::time::timeout(HEADER_TIMEOUT, acceptor.accept(stream)).await {
            Ok(Ok(stream)) => builder.serve_connection(TokioIo::new(stream), service).await,
            Ok(Err(e)) => return tracing::debug!(error = %e, "https handshake failed"),
            Err(_) => return tracing::debug!("https handshake timed out"),
        },
    };
    if let Err(e) = result {
        tracing::debug!(error = %e, "http connection ended with an error");
    }
}
