//! `stria node run --http ADDR`: a cluster node's read-only listener (docs/design/cluster.md §1):
//! `/metrics` (the node's lease, every volume as this node serves it, the NBD requests of its
//! exports), `/api/v1/cluster` (nodes and volumes from etcd, what `stria cluster status --json`
//! prints), `/api/v1/node` (this node's report) and `/` (a page that shows both).
//!
//! Nothing here changes anything, and nothing carries a secret; still, the listener serves the
//! loopback only (no TLS or token for nodes yet): put a proxy in front to publish it.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use stria_cluster::etcd::Cluster;
use stria_cluster::{Keys, Reporter};
use stria_front::Registry;
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::metrics::{Exposition, requests};

const NODE_HTML: &str = include_str!("../../ui/node.html");

#[derive(Clone)]
struct NodeState {
    reporter: Reporter,
    exports: Arc<Registry>,
    etcd: Arc<(Vec<String>, Keys)>,
    /// Connected at the first request that needs it (the node starts without etcd too).
    cluster: Arc<tokio::sync::OnceCell<Cluster>>,
}

/// The running listener.
pub(crate) struct NodeHttp {
    pub(crate) url: String,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl NodeHttp {
    pub(crate) async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

/// Refuses an address off the loopback (nodes have no TLS or token yet).
pub(crate) fn check_addr(addr: SocketAddr) -> Result<()> {
    if !addr.ip().is_loopback() {
        bail!(
            "--http {addr}: a node's HTTP listener serves the loopback only (it has no TLS or \
             token yet); publish it through a proxy"
        );
    }
    Ok(())
}

/// Binds `addr` (the loopback only) and serves until [`NodeHttp::shutdown`].
pub(crate) async fn start(
    addr: SocketAddr,
    reporter: Reporter,
    exports: Arc<Registry>,
    etcd: Vec<String>,
    keys: Keys,
) -> Result<NodeHttp> {
    check_addr(addr)?;
    let listener = TcpListener::bind(addr).await.with_context(|| format!("cannot listen on {addr}"))?;
    let url = format!("http://{}/", listener.local_addr()?);
    let app = Router::new()
        .route("/metrics", get(scrape))
        .route("/api/v1/cluster", get(cluster_status))
        .route("/api/v1/node", get(node_report))
        .route(
            "/",
            get(|| async {
                (
                    [(header::CONTENT_TYPE, "text/html; charset=utf-8"), (header::CACHE_CONTROL, "no-cache")],
                    NODE_HTML,
                )
            }),
        )
        .layer(axum::extract::DefaultBodyLimit::max(super::BODY_BYTES_MAX))
        .with_state(NodeState { reporter, exports, etcd: Arc::new((etcd, keys)), cluster: Arc::default() });
    let (stop, stopped) = watch::channel(false);
    let task = tokio::spawn(super::accept_loop(listener, app, None, stopped));
    tracing::info!(url, "node http listener: metrics, cluster status, page");
    Ok(NodeHttp { url, stop, task })
}

async fn cluster_status(State(state): State<NodeState>) -> Response {
    let status = async {
        let (endpoints, keys) = &*state.etcd;
        let cluster = state.cluster.get_or_try_init(|| Cluster::connect(endpoints, keys.clone())).await?;
        cluster.status().await
    };
    match status.await {
        Ok(status) => axum::Json(status).into_response(),
        Err(e) => {
            (StatusCode::SERVICE_UNAVAILABLE, axum::Json(serde_json::json!({ "error": e.to_string() })))
                .into_response()
        }
    }
}

async fn node_report(State(state): State<NodeState>) -> Response {
    axum::Json(state.reporter.report()).into_response()
}

async fn scrape(State(state): State<NodeState>) -> impl IntoResponse {
    let report = state.reporter.report();
    let mut out = Exposition::default();
    let node = report.node.as_str();
    out.family("stria_node_lease_valid", "gauge", "1 while the node's etcd lease deadline holds.");
    out.sample("stria_node_lease_valid", &[("node", node)], f64::from(u8::from(report.lease_valid)));
    out.family(
        "stria_node_volume_owned",
        "gauge",
        "1 for a volume this node coordinates, 0 for one it forwards or holds.",
    );
    for v in &report.volumes {
        out.sample(
            "stria_node_volume_owned",
            &[("volume", &v.name)],
            f64::from(u8::from(v.route == "local")),
        );
    }
    out.family("stria_node_volume_serving", "gauge", "1 for an owned volume served now (not suspended).");
    out.family("stria_node_volume_epoch", "gauge", "The fencing epoch of this node's ownership of a volume.");
    out.family("stria_node_volume_members", "gauge", "Members of an owned volume, by state.");
    out.family(
        "stria_node_rebuilt_bytes_total",
        "counter",
        "Bytes this ownership of a volume rebuilt onto members.",
    );
    out.family(
        "stria_node_resync_skipped_bytes_total",
        "counter",
        "Bytes a delta resync of this ownership did not copy (unchanged while the member was out).",
    );
    for v in report.volumes.iter().filter(|v| v.route == "local") {
        let l = [("volume", v.name.as_str())];
        out.sample("stria_node_volume_serving", &l, f64::from(u8::from(v.serving)));
        out.sample("stria_node_volume_epoch", &l, v.epoch.unwrap_or(0) as f64);
        for (state, n) in [("in", v.members_in), ("out", v.members_out), ("rebuilding", v.members_rebuilding)]
        {
            out.sample(
                "stria_node_volume_members",
                &[("volume", v.name.as_str()), ("state", state)],
                n as f64,
            );
        }
        out.sample("stria_node_rebuilt_bytes_total", &l, v.rebuilt_bytes as f64);
        out.sample("stria_node_resync_skipped_bytes_total", &l, v.resync_skipped_bytes as f64);
    }
    out.family(
        "stria_node_forwarded_requests_total",
        "counter",
        "Requests this node forwarded to a volume's owner.",
    );
    out.family(
        "stria_node_retried_requests_total",
        "counter",
        "Tries of a request no owner answered (between owners, moving, connection lost), made again.",
    );
    for v in &report.volumes {
        let l = [("volume", v.name.as_str())];
        out.sample("stria_node_forwarded_requests_total", &l, v.counters.forwarded as f64);
        out.sample("stria_node_retried_requests_total", &l, v.counters.retried as f64);
    }
    requests(&mut out, &state.exports.stats());
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], out.text)
}
