//! A cluster node (docs/design/cluster.md §1): serves its slices to every coordinator, keeps one
//! etcd session, takes every volume nobody owns (first come, one winner: the ownership
//! transaction), and serves every volume through a front-end registry (the NBD server of the
//! `stria node run` command): those it owns itself, the others by forwarding each request to
//! their owner ([`crate::forward`], §6.2). It stops serving a volume itself as soon as it is no
//! longer its own or its lease deadline passed.
//!
//! Past its lease deadline a node holds its volumes' requests (suspended, §8) for at most
//! `suspend`, then fails them; it serves again by itself when a renewal comes back and the
//! volume is still its own. Requests of a volume it lost go to the new owner.
//!
//! A planned move (§6.3): the owner of a volume with a pending move to another live node stops
//! admitting requests (they wait, then go to the new owner), lets those running finish, closes
//! the volume and gives up its ownership; while the target is alive only the target takes it.
//!
//! The agent looks at the cluster at every change etcd reports (a watch of the cluster's
//! prefix) and at least every `poll`. Not built yet (§13): ranked successors.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use stria_dev::{FileDevice, FileOptions, IoBuf, IoBytes};
use stria_engine::{BlockVolume, Durability, Extent, VolumeError, VolumeFuture, VolumeInfo, Zeroing};
use stria_front::Registry;
use stria_slice::{Slice, SliceSet};
use tokio::net::TcpListener;
use tokio::runtime::Handle;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::coordinator::{self, Coordinated};
use crate::etcd::{ClusterError, Session, SessionConfig};
use crate::forward::{Route, RouteCounters, Routed, direct_name};
use crate::records::{Keys, NodeRecord, ResizeRecord, SliceInfoRecord, VolumeRecord};

/// What a node needs to run.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    pub name: String,
    pub etcd: Vec<String>,
    /// Holds `slices/slice-<id>.img`.
    pub dir: PathBuf,
    /// Where the slice server listens.
    pub slice_listen: SocketAddr,
    /// Where this node's NBD server listens, as clients should dial it (for `status`).
    pub nbd_addr: Option<String>,
    pub ttl: Duration,
    /// How often the node looks for volumes to take and checks its own.
    pub poll: Duration,
    /// How long an out member's node may stay away before the member is rebuilt on another
    /// node (docs/design/cluster.md §7); a node back sooner gets its member rebuilt in place.
    pub out_time: Duration,
    /// How long requests are held past the lease deadline before they fail (§8).
    pub suspend: Duration,
    pub keys: Keys,
}

impl NodeConfig {
    pub fn new(name: &str, etcd: Vec<String>, dir: PathBuf, slice_listen: SocketAddr) -> NodeConfig {
        NodeConfig {
            name: name.into(),
            etcd,
            dir,
            slice_listen,
            nbd_addr: None,
            ttl: Duration::from_secs(5),
            poll: Duration::from_millis(500),
            out_time: Duration::from_secs(600),
            suspend: Duration::from_secs(60),
            keys: Keys::default(),
        }
    }
}

fn slice_path(dir: &Path, id: u32) -> PathBuf {
    dir.join("slices").join(format!("slice-{id}.img"))
}

/// Creates the slice files `0..count` of `bytes` usable bytes each that do not exist yet.
pub async fn prepare_slices(dir: &Path, count: u32, bytes: u64) -> Result<(), ClusterError> {
    std::fs::create_dir_all(dir.join("slices")).map_err(|e| ClusterError::Unavailable(e.to_string()))?;
    for id in 0..count {
        let path = slice_path(dir, id);
        if path.exists() {
            continue;
        }
        let dev = FileDevice::create(&path, bytes + stria_dev::BLOCK_BYTES)
            .map_err(|e| ClusterError::Unavailable(format!("{}: {e}", path.display())))?;
        Slice::format(id, dev).await.map_err(|e| ClusterError::Unavailable(e.to_string()))?;
    }
    Ok(())
}

/// Opens every `slices/slice-<id>.img` under `dir`.
async fn open_slices(dir: &Path) -> Result<Vec<Slice<FileDevice>>, ClusterError> {
    let mut out = Vec::new();
    let entries = std::fs::read_dir(dir.join("slices")).map_err(|e| {
        ClusterError::Unavailable(format!(
            "{}: {e} (create slices with --slices)",
            dir.join("slices").display()
        ))
    })?;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(id) =
            name.strip_prefix("slice-").and_then(|n| n.strip_suffix(".img")).and_then(|n| n.parse().ok())
        else {
            continue;
        };
        let dev = FileDevice::open(entry.path(), &FileOptions::default())
            .map_err(|e| ClusterError::Unavailable(format!("{}: {e}", entry.path().display())))?;
        out.push(Slice::open(id, dev).await.map_err(|e| ClusterError::Unavailable(e.to_string()))?);
    }
    out.sort_by_key(|s| s.id());
    Ok(out)
}

/// A running node.
pub struct Node {
    pub slice_addr: SocketAddr,
    pub slices: Arc<SliceSet<FileDevice>>,
    report: Reported,
    server: JoinHandle<std::io::Result<()>>,
    agent: JoinHandle<()>,
    stop: watch::Sender<bool>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node").field("slice_addr", &self.slice_addr).finish()
    }
}

impl Node {
    /// Opens the slices, starts the slice server and the agent that takes and serves volumes.
    pub async fn start(config: NodeConfig, exports: Arc<Registry>) -> Result<Node, ClusterError> {
        let slices = open_slices(&config.dir).await?;
        let infos: Vec<SliceInfoRecord> =
            slices.iter().map(|s| SliceInfoRecord { id: s.id(), bytes: s.usable_bytes() }).collect();
        let listener = TcpListener::bind(config.slice_listen).await.map_err(|e| {
            ClusterError::Unavailable(format!("cannot listen on {}: {e}", config.slice_listen))
        })?;
        let slice_addr = listener.local_addr().map_err(|e| ClusterError::Unavailable(e.to_string()))?;
        let slices = Arc::new(SliceSet::new(slices));
        let server = tokio::spawn(stria_slice::serve(listener, Arc::clone(&slices)));
        let record = NodeRecord {
            name: config.name.clone(),
            slice_addr: slice_addr.to_string(),
            nbd_addr: config.nbd_addr.clone(),
            slices: infos,
        };
        let (stop, stopped) = watch::channel(false);
        let report: Reported = Arc::new(parking_lot::Mutex::new(NodeReport {
            node: config.name.clone(),
            ..NodeReport::default()
        }));
        // A client's attach wakes the agent, which publishes the count a delete checks (§6.4)
        // at once instead of at its next poll.
        let attached = Arc::new(tokio::sync::Notify::new());
        let wake = Arc::clone(&attached);
        exports.on_attach(move || wake.notify_one());
        let agent = tokio::spawn(run_agent(config, record, exports, Arc::clone(&report), stopped, attached));
        Ok(Node { slice_addr, slices, report, server, agent, stop })
    }

    /// A handle that reads what the node's agent saw at its last look at the cluster, while the
    /// node runs (what the HTTP listener keeps for its metrics and API).
    pub fn reporter(&self) -> Reporter {
        Reporter(Arc::clone(&self.report))
    }

    /// Stops serving: closes every owned volume cleanly, gives up its ownership and the lease.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.agent.await;
        self.server.abort();
    }
}

/// A node as its agent last saw it: its lease, and every volume of the cluster as this node
/// serves it (owned here, forwarded, or waiting for an owner).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct NodeReport {
    pub node: String,
    /// True while the node's lease deadline holds (its owned volumes are served).
    pub lease_valid: bool,
    pub volumes: Vec<VolumeReport>,
}

/// One volume on one node.
#[derive(Clone, Debug, serde::Serialize)]
pub struct VolumeReport {
    pub name: String,
    /// `local` (this node owns it), `remote` (forwarded to `owner`), `between` (held).
    pub route: &'static str,
    pub owner: Option<String>,
    /// The epoch of this node's ownership (owned volumes only).
    pub epoch: Option<u64>,
    /// Owned and serving (not suspended).
    pub serving: bool,
    /// Owned volumes: members in service, out, and being rebuilt.
    pub members_in: usize,
    pub members_out: usize,
    pub members_rebuilding: usize,
    /// Owned volumes: bytes this ownership rebuilt, and bytes a delta resync skipped.
    pub rebuilt_bytes: u64,
    pub resync_skipped_bytes: u64,
    #[serde(flatten)]
    pub counters: RouteCounters,
}

type Reported = Arc<parking_lot::Mutex<NodeReport>>;

/// Reads a running node's [`NodeReport`].
#[derive(Clone, Debug)]
pub struct Reporter(Reported);

impl Reporter {
    pub fn report(&self) -> NodeReport {
        self.0.lock().clone()
    }
}

/// Whether a node serves a volume it coordinates (docs/design/cluster.md §8).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Gate {
    Serving,
    /// Past the lease deadline: requests wait for a renewal until `until`, then fail.
    Suspended {
        until: Instant,
    },
    /// No longer this node's: requests fail at once (clients go to the new owner).
    Lost,
}

/// A coordinated volume as its clients reach it: every request first passes the gate. Clients
/// attached before the node stopped serving (past its lease deadline, or after losing the
/// volume) are held or refused from then on, and a refused client reconnects to the new owner.
struct Served<V: ?Sized> {
    name: String,
    inner: Arc<V>,
    gate: watch::Receiver<Gate>,
    /// Held shared by every request from before its admission to its end: a move closes the
    /// gate, then takes it exclusively, so it waits for every admitted request and no request is
    /// admitted after.
    running: tokio::sync::RwLock<()>,
}

impl<V: BlockVolume + ?Sized> Served<V> {
    fn new(name: &str, inner: Arc<V>, gate: watch::Receiver<Gate>) -> Served<V> {
        Served { name: name.to_string(), inner, gate, running: tokio::sync::RwLock::new(()) }
    }

    /// Waits until no admitted request runs; the gate must be closed first.
    async fn drain(&self) {
        drop(self.running.write().await);
    }

    /// Waits while the volume is suspended; `Err` once it is lost or suspended too long.
    async fn admit(&self) -> Result<(), VolumeError> {
        // The common case, serving, without a receiver of its own.
        if *self.gate.borrow() == Gate::Serving {
            return Ok(());
        }
        let mut gate = self.gate.clone();
        loop {
            let state = *gate.borrow_and_update();
            match state {
                Gate::Serving => return Ok(()),
                Gate::Lost => return Err(VolumeError::Closed(self.name.clone())),
                Gate::Suspended { until } => {
                    match tokio::time::timeout_at(until.into(), gate.changed()).await {
                        Ok(Ok(())) => {}
                        _ => return Err(VolumeError::Closed(self.name.clone())),
                    }
                }
            }
        }
    }

    fn gated<'a, T: Send + 'static>(&'a self, op: VolumeFuture<'a, T>) -> VolumeFuture<'a, T> {
        Box::pin(async move {
            let _running = self.running.read().await;
            self.admit().await?;
            op.await
        })
    }
}

impl<V: BlockVolume + ?Sized> BlockVolume for Served<V> {
    fn info(&self) -> VolumeInfo {
        self.inner.info()
    }
    fn size_bytes(&self) -> u64 {
        BlockVolume::size_bytes(&*self.inner)
    }
    fn read(&self, offset_bytes: u64, len_bytes: usize) -> VolumeFuture<'_, IoBuf> {
        self.gated(BlockVolume::read(&*self.inner, offset_bytes, len_bytes))
    }
    fn write(&self, offset_bytes: u64, data: IoBytes, durability: Durability) -> VolumeFuture<'_, ()> {
        self.gated(BlockVolume::write(&*self.inner, offset_bytes, data, durability))
    }
    fn compare_and_write(
        &self,
        offset_bytes: u64,
        compare: IoBytes,
        write: IoBytes,
        durability: Durability,
    ) -> VolumeFuture<'_, ()> {
        self.gated(BlockVolume::compare_and_write(&*self.inner, offset_bytes, compare, write, durability))
    }
    fn write_zeroes(
        &self,
        offset_bytes: u64,
        len_bytes: u64,
        zeroing: Zeroing,
        durability: Durability,
    ) -> VolumeFuture<'_, ()> {
        self.gated(BlockVolume::write_zeroes(&*self.inner, offset_bytes, len_bytes, zeroing, durability))
    }
    fn discard(&self, offset_bytes: u64, len_bytes: u64, durability: Durability) -> VolumeFuture<'_, ()> {
        self.gated(BlockVolume::discard(&*self.inner, offset_bytes, len_bytes, durability))
    }
    fn flush(&self) -> VolumeFuture<'_, ()> {
        self.gated(BlockVolume::flush(&*self.inner))
    }
    fn block_status(&self, offset_bytes: u64, len_bytes: u64) -> VolumeFuture<'_, Vec<Extent>> {
        self.gated(BlockVolume::block_status(&*self.inner, offset_bytes, len_bytes))
    }
}

/// A volume this node coordinates, whether it serves it now, and its repair task.
struct OwnedVolume {
    c: Arc<Coordinated>,
    gate: watch::Sender<Gate>,
    served: Arc<Served<stria_engine::Volume<stria_slice::RemoteDevice>>>,
    repair: Option<JoinHandle<()>>,
    /// The pool's housekeeping (`Pool::tick`: flush dirty drives, clear idle intent bits,
    /// commit error counters), run every [`HOUSEKEEPING`] while serving.
    housekeeping: Option<JoinHandle<()>>,
    last_housekeeping: Instant,
    /// A resize being carried out (docs/design/cluster.md §6.5); a close waits for it.
    resize: Option<JoinHandle<()>>,
}

/// How often an owner runs its pool's housekeeping (as the single-node daemon does). Without it
/// the intent bits of every region ever written stay set: a takeover resynchronises them all,
/// and a returning member's delta resync copies them all.
const HOUSEKEEPING: Duration = Duration::from_secs(2);

/// A volume this node failed to take is not tried again before this long, doubled after each
/// failure up to [`TAKE_RETRY_MAX`]: every try writes to etcd (an ownership epoch, its release),
/// and each write wakes the agent, so a volume no node can open (too few slices reachable, a
/// pool that does not assemble) would otherwise be tried, and warned about, many times a second.
const TAKE_RETRY_FIRST: Duration = Duration::from_secs(1);
/// The longest wait between two tries of a volume that keeps failing.
const TAKE_RETRY_MAX: Duration = Duration::from_secs(8);

/// When a volume this node failed to take may be tried again, and the wait that led there.
#[derive(Debug, Clone, Copy)]
struct TakeRetry {
    after: Instant,
    wait: Duration,
}

/// Volumes whose last take by this node failed, by name.
type TakeRetries = BTreeMap<String, TakeRetry>;

/// The number of NBD clients attached to each volume at this node as last written to etcd
/// (`clients/<vol>/<node>`, docs/design/cluster.md §6.4); a volume with none is not listed.
type Published = BTreeMap<String, usize>;

impl Drop for OwnedVolume {
    fn drop(&mut self) {
        // A rebuild stopped here resumes from its last persisted cursor under the next owner.
        if let Some(task) = self.repair.take() {
            task.abort();
        }
        if let Some(task) = self.housekeeping.take() {
            task.abort();
        }
    }
}

/// Rebuilds what is pending, then replaces out members that can be replaced now, until nothing
/// more can be done (docs/design/cluster.md §7).
async fn repair(session: Arc<Session>, c: Arc<Coordinated>, out_time: Duration) {
    let name = c.volume.name().to_string();
    loop {
        if c.pool.rebuild_pending() {
            let started = std::time::Instant::now();
            let before = c.pool.rebuild_counters();
            if let Err(e) = c.pool.rebuild(|_| {}).await {
                tracing::warn!(volume = %name, error = %e, "rebuild stopped");
                return;
            }
            let after = c.pool.rebuild_counters();
            tracing::info!(
                volume = %name,
                rebuilt_bytes = after.copied_bytes - before.copied_bytes,
                skipped_bytes = after.skipped_bytes - before.skipped_bytes,
                ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
                "rebuild done"
            );
        }
        if let Err(e) = crate::repair::finish(&c).await {
            tracing::warn!(volume = %name, error = %e, "cannot record the rebuilt members");
            return;
        }
        match crate::repair::step(&session, &Handle::current(), &c, out_time).await {
            Ok(crate::repair::Repair::Replaced { .. }) => continue,
            Ok(crate::repair::Repair::Waiting(why)) => {
                tracing::debug!(volume = %name, %why, "an out member waits");
                return;
            }
            Ok(crate::repair::Repair::Nothing) => return,
            Err(e) => {
                tracing::warn!(volume = %name, error = %e, "repair failed; retrying later");
                return;
            }
        }
    }
}

/// The volumes this node coordinates, by name.
type Owned = BTreeMap<String, OwnedVolume>;

/// Every volume's route on this node, the export that follows it, and the revision that created
/// the volume's spec (a volume specified again under its name is another volume), by name.
type Routes = BTreeMap<String, (watch::Sender<Route>, Arc<Routed>, u64)>;

async fn run_agent(
    config: NodeConfig,
    record: NodeRecord,
    exports: Arc<Registry>,
    report: Reported,
    mut stopped: watch::Receiver<bool>,
    attached: Arc<tokio::sync::Notify>,
) {
    let mut session: Option<Arc<Session>> = None;
    let mut owned = Owned::new();
    let mut routes = Routes::new();
    let mut retries = TakeRetries::new();
    let mut published = Published::new();
    // Changes in etcd wake the agent at once; the poll is the fallback (and the only clock of
    // lease deadlines and housekeeping).
    let mut changes: Option<etcd_client::WatchStream> = None;
    loop {
        // A node dropped without `stop` stops too (else `stopped.changed()` would return at
        // once, every pass, and the agent would spin).
        if *stopped.borrow() || stopped.has_changed().is_err() {
            break;
        }
        // A session whose lease is gone (or never was) is replaced; what it owned is dropped
        // without a close: a successor may have fenced its slices already.
        if session.as_ref().is_some_and(|s| !s.renewing()) {
            tracing::error!(node = %config.name, "the node's lease is gone; dropping its volumes");
            drop_all(&mut owned, &exports, &routes);
            session = None;
            changes = None;
            // Its client counts were bound to its lease.
            published.clear();
        }
        if session.is_none() {
            let mut sc = SessionConfig::new(config.etcd.clone(), &config.name);
            sc.ttl = config.ttl;
            sc.keys = config.keys.clone();
            match Session::start(sc, &record).await {
                Ok(s) => {
                    tracing::info!(node = %config.name, lease = s.lease(), "joined the cluster");
                    session = Some(Arc::new(s));
                }
                Err(e) => tracing::warn!(node = %config.name, error = %e, "cannot reach etcd; retrying"),
            }
        }
        if let Some(s) = &session
            && let Err(e) =
                tick(&config, s, &mut owned, &exports, &mut routes, &mut retries, &mut published).await
        {
            tracing::warn!(node = %config.name, error = %e, "cluster check failed");
        }
        let lease_valid = session.as_ref().is_some_and(|s| s.lease_valid());
        *report.lock() = reported(&config.name, lease_valid, &owned, &routes).await;
        if changes.is_none()
            && let Some(s) = &session
        {
            changes = s.watch().await.ok();
        }
        tokio::select! {
            _ = tokio::time::sleep(config.poll) => {}
            _ = stopped.changed() => {}
            _ = attached.notified() => {}
            event = next_change(&mut changes, &config.keys) => {
                if !event {
                    changes = None;
                }
            }
        }
    }
    // A clean stop: close each volume (flush, checkpoint), then give it back.
    for (name, mut o) in std::mem::take(&mut owned) {
        if let Some(task) = o.repair.take() {
            task.abort();
        }
        o.gate.send_replace(Gate::Lost);
        let c = Arc::clone(&o.c);
        let served = Arc::clone(&o.served);
        let resizing = o.resize.take();
        drop(o);
        exports.remove(&direct_name(&name));
        served.drain().await;
        if let Some(resize) = resizing {
            let _ = resize.await;
        }
        if let Err(e) = c.pool.close().await {
            tracing::warn!(volume = %name, error = %e, "closing the volume");
        }
        if let Some(s) = &session {
            let _ = s.release(&name, c.epoch).await;
        }
    }
    for name in routes.keys() {
        exports.remove(name);
    }
    report.lock().volumes.clear();
    report.lock().lease_valid = false;
    if let Some(s) = session {
        let _ = s.revoke().await;
    }
}

/// Waits for the next change in etcd that can change what this node serves: a node, an owner,
/// a spec, a move, a delete or a resize (not a volume's members or a slice's claim, which change often and concern
/// only the owner). False when the watch ended (it is made again); never returns without one.
async fn next_change(changes: &mut Option<etcd_client::WatchStream>, keys: &Keys) -> bool {
    let Some(stream) = changes else { return std::future::pending().await };
    let (owners, nodes) = (keys.owners(), keys.nodes());
    let relevant = |key: &[u8]| {
        key.starts_with(owners.as_bytes())
            || key.starts_with(nodes.as_bytes())
            || key.ends_with(b"/spec")
            || key.ends_with(b"/move")
            || key.ends_with(b"/delete")
            || key.ends_with(b"/resize")
    };
    loop {
        match stream.message().await {
            Ok(Some(resp)) if resp.canceled() => return false,
            Ok(Some(resp)) => {
                if resp.events().iter().any(|e| e.kv().is_some_and(|kv| relevant(kv.key()))) {
                    return true;
                }
            }
            _ => return false,
        }
    }
}

fn drop_all(owned: &mut Owned, exports: &Registry, routes: &Routes) {
    for (name, o) in std::mem::take(owned) {
        o.gate.send_replace(Gate::Lost);
        exports.remove(&direct_name(&name));
        if let Some((route, _, _)) = routes.get(&name) {
            route.send_replace(Route::Between);
        }
    }
}

/// The node's report from its agent's state.
async fn reported(node: &str, lease_valid: bool, owned: &Owned, routes: &Routes) -> NodeReport {
    let mut volumes = Vec::new();
    for (name, (route, routed, _)) in routes {
        let (kind, owner) = match &*route.borrow() {
            Route::Local(_) => ("local", Some(node.to_string())),
            Route::Remote { node, .. } => ("remote", Some(node.clone())),
            Route::Between => ("between", None),
            Route::Deleted => ("deleted", None),
        };
        let mut v = VolumeReport {
            name: name.clone(),
            route: kind,
            owner,
            epoch: None,
            serving: false,
            members_in: 0,
            members_out: 0,
            members_rebuilding: 0,
            rebuilt_bytes: 0,
            resync_skipped_bytes: 0,
            counters: routed.counters(),
        };
        if let Some(o) = owned.get(name) {
            let members = o.c.guard.members().await;
            let rebuild = o.c.pool.rebuild_counters();
            v.epoch = Some(o.c.epoch);
            v.serving = *o.gate.borrow() == Gate::Serving;
            v.members_in = members.in_service.len();
            v.members_out = members.out.len();
            v.members_rebuilding = members.joining.len();
            v.rebuilt_bytes = rebuild.copied_bytes;
            v.resync_skipped_bytes = rebuild.skipped_bytes;
        }
        volumes.push(v);
    }
    NodeReport { node: node.to_string(), lease_valid, volumes }
}

/// Sets `name`'s route unless it is that already (a change wakes the requests waiting).
fn set_route(routes: &Routes, name: &str, route: Route) {
    if let Some((tx, _, _)) = routes.get(name)
        && !tx.borrow().same(&route)
    {
        tracing::debug!(volume = %name, ?route, "route");
        tx.send_replace(route);
    }
}

/// Stops serving an owned volume and closes it (a move, a delete): new requests wait (between
/// owners), those admitted finish, then the pool is flushed and closed. A close that fails leaves
/// what a crash leaves, which the next owner recovers.
async fn close_owned(
    name: &str,
    mut o: OwnedVolume,
    exports: &Registry,
    routes: &Routes,
    why: &str,
) -> Arc<Coordinated> {
    set_route(routes, name, Route::Between);
    o.gate.send_replace(Gate::Lost);
    exports.remove(&direct_name(name));
    o.served.drain().await;
    if let Some(resize) = o.resize.take() {
        let _ = resize.await;
    }
    let c = Arc::clone(&o.c);
    drop(o);
    if let Err(e) = c.pool.close().await {
        tracing::warn!(volume = %name, error = %e, "closing the volume {why}");
    }
    c
}

/// Closes an owned volume for a planned move and gives up its ownership: requests already
/// admitted finish, later ones wait and then go to the next owner (docs/design/cluster.md §6.3).
async fn hand_over(
    session: &Session,
    name: &str,
    o: OwnedVolume,
    to: &str,
    exports: &Registry,
    routes: &Routes,
) {
    let started = Instant::now();
    let c = close_owned(name, o, exports, routes, "for its move").await;
    match session.release(name, c.epoch).await {
        Ok(()) => tracing::info!(
            volume = %name,
            to,
            ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            "handed over for a move"
        ),
        // The next look at the cluster gives up the key of a volume this node does not hold.
        Err(e) => tracing::warn!(volume = %name, error = %e, "cannot give up the volume for its move"),
    }
}

/// Closes an owned volume whose delete is pending and deletes it (docs/design/cluster.md §6.4):
/// requests admitted finish, later ones fail; then one transaction guarded by this node's epoch
/// deletes its keys and frees its slices. Not done there (a claim changed, ownership lost), the
/// owner key left is given up at the next look and the delete is done as an unowned one.
async fn close_and_delete(
    session: &Session,
    name: &str,
    o: OwnedVolume,
    exports: &Registry,
    routes: &mut Routes,
) {
    let c = close_owned(name, o, exports, routes, "to delete it").await;
    match session.delete_owned(name, c.epoch).await {
        Ok(Some(freed)) => {
            let freed: Vec<String> = freed.iter().map(ToString::to_string).collect();
            tracing::info!(volume = %name, freed = %freed.join(","), "volume deleted");
            end_route(routes, exports, name);
        }
        Ok(None) => tracing::warn!(volume = %name, "the delete's transaction was refused; trying again"),
        Err(e) => tracing::warn!(volume = %name, error = %e, "cannot delete the volume; trying again"),
    }
}

/// Stops serving a deleted volume: requests of clients still attached fail at once.
fn end_route(routes: &mut Routes, exports: &Registry, name: &str) {
    if let Some((tx, _, _)) = routes.remove(name) {
        tx.send_replace(Route::Deleted);
    }
    exports.remove(name);
}

/// Carries out a resize request of a volume this node owns (docs/design/cluster.md §6.5): the
/// engine's volume first, then the spec says the new size and the request goes, in one
/// transaction fenced by the epoch. What the engine refuses is written into the request.
async fn resize(
    session: Arc<Session>,
    c: Arc<Coordinated>,
    name: String,
    request: ResizeRecord,
    revision: i64,
) {
    // The request as it is now: the look that found it may have been made before the previous
    // resize of this volume here finished (then this one is done, or refused, already), and a
    // request done or refused must not be carried out again: its size may no longer be wanted.
    match session.resize_of(&name).await {
        Ok(Some((now, rev))) if rev == revision && now.error.is_none() => {}
        Ok(_) => return,
        Err(e) => {
            tracing::warn!(volume = %name, error = %e, "cannot read the resize request; trying again");
            return;
        }
    }
    let started = Instant::now();
    match c.pool.resize_volume(&name, request.size_bytes).await {
        Ok(()) => match session.finish_resize(&name, c.epoch, revision, request.size_bytes).await {
            Ok(true) => tracing::info!(
                volume = %name,
                size_bytes = request.size_bytes,
                ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
                "volume resized"
            ),
            // Done already, or no longer this node's to finish (the next owner does).
            Ok(false) => tracing::debug!(volume = %name, "the resize's transaction was refused"),
            Err(e) => tracing::warn!(volume = %name, error = %e, "cannot record the resize; trying again"),
        },
        Err(e) => {
            tracing::warn!(volume = %name, size_bytes = request.size_bytes, error = %e, "cannot resize the volume");
            if let Err(e2) = session.refuse_resize(&name, c.epoch, revision, request, e.to_string()).await {
                tracing::warn!(volume = %name, error = %e2, "cannot record why the resize was refused");
            }
        }
    }
}

/// One look at the cluster: stop serving what is no longer ours, hand over what moves, take
/// what nobody owns, and route every volume's requests to its owner.
async fn tick(
    config: &NodeConfig,
    session: &Arc<Session>,
    owned: &mut Owned,
    exports: &Arc<Registry>,
    routes: &mut Routes,
    retries: &mut TakeRetries,
    published: &mut Published,
) -> Result<(), ClusterError> {
    if !session.lease_valid() {
        // Past the lease deadline another node may own our volumes: serve nothing until a
        // renewal is acknowledged again (then, if the volumes are still ours, serve again:
        // nothing needs a restart).
        for (name, o) in owned.iter() {
            if *o.gate.borrow() == Gate::Serving {
                o.gate.send_replace(Gate::Suspended { until: Instant::now() + config.suspend });
                tracing::warn!(node = %config.name, volume = %name, "past the lease deadline; requests held");
            }
        }
        return Ok(());
    }
    let created = session.specs_created().await?;
    let specs: Vec<VolumeRecord> = created.iter().map(|(spec, _)| spec.clone()).collect();
    // A volume deleted is served no more.
    let gone: Vec<String> = routes.keys().filter(|v| !specs.iter().any(|s| s.name == **v)).cloned().collect();
    for v in gone {
        tracing::info!(volume = %v, "deleted; not serving it");
        end_route(routes, exports, &v);
        if published.remove(&v).is_some() {
            session.publish_clients(&v, 0).await?;
        }
    }
    // Every volume is served here, by this node or through its owner. One deleted and specified
    // again under its name before this node looked is a new volume: served anew.
    for (spec, revision) in &created {
        if routes.get(&spec.name).is_some_and(|(_, _, r)| r != revision) {
            end_route(routes, exports, &spec.name);
        }
        // Resized (docs/design/cluster.md §6.5): clients connecting from now on see the new size.
        if let Some((_, routed, _)) = routes.get(&spec.name)
            && routed.size_bytes() != spec.size_bytes
        {
            tracing::info!(volume = %spec.name, from = routed.size_bytes(), to = spec.size_bytes, "resized");
            routed.set_size(spec.size_bytes);
        }
        if !routes.contains_key(&spec.name) {
            let (tx, rx) = watch::channel(Route::Between);
            let routed = Arc::new(Routed::new(
                &spec.name,
                spec.layout.to_string(),
                spec.size_bytes,
                rx,
                config.suspend,
            ));
            exports.insert(&spec.name, Arc::clone(&routed) as Arc<dyn BlockVolume>);
            routes.insert(spec.name.clone(), (tx, routed, *revision));
        }
    }
    let owners = session.owners().await?;
    let nodes = session.nodes().await?;
    let moves = session.moves().await?;
    let deletes = session.deletes().await?;
    let cordons = session.cordons().await?;
    let deleting = |v: &str| deletes.iter().any(|d| d == v);
    let live = |node: &str| nodes.iter().any(|n| n.name == node);
    let cordoned = |node: &str| cordons.iter().any(|(c, _)| c == node);
    // A cordoned node takes nothing while a live node that is not cordoned could (§6.6).
    let stand_aside =
        cordoned(&config.name) && nodes.iter().any(|n| n.name != config.name && !cordoned(&n.name));
    let mine: BTreeMap<&str, u64> =
        owners.iter().filter(|(_, o, _)| o.node == config.name).map(|(v, _, e)| (v.as_str(), *e)).collect();
    let lost: Vec<String> = owned
        .iter()
        .filter(|(v, o)| mine.get(v.as_str()) != Some(&o.c.epoch))
        .map(|(v, _)| v.clone())
        .collect();
    for v in lost {
        tracing::warn!(volume = %v, "no longer the owner; not serving it");
        exports.remove(&direct_name(&v));
        set_route(routes, &v, Route::Between);
        if let Some(o) = owned.remove(&v) {
            o.gate.send_replace(Gate::Lost);
        }
    }
    // An owner key of this node for a volume it does not hold (a hand-over whose release did not
    // reach etcd) would keep the volume from every node while this node's lease lives: give it up.
    for (v, o, epoch) in &owners {
        if o.node == config.name && !owned.contains_key(v) {
            tracing::warn!(volume = %v, epoch, "owned in etcd but not held here; giving it up");
            session.release(v, *epoch).await?;
        }
    }
    // Deletes: close what this node owns and delete it.
    for v in &deletes {
        if let Some(o) = owned.remove(v) {
            close_and_delete(session, v, o, exports, routes).await;
        }
    }
    // Planned moves: hand over what moves elsewhere; a move to where the volume is already is done.
    for (v, m) in &moves {
        if m.to == config.name && owned.contains_key(v) {
            session.end_move(v).await?;
        } else if m.to != config.name && cordoned(&m.to) && owned.contains_key(v) {
            tracing::warn!(volume = %v, to = %m.to, "a move to a cordoned node is given up");
            session.end_move_to(v, &m.to).await?;
        } else if m.to != config.name
            && live(&m.to)
            && !deleting(v)
            && owned.get(v).is_some_and(|o| *o.gate.borrow() == Gate::Serving)
            && let Some(o) = owned.remove(v)
        {
            hand_over(session, v, o, &m.to, exports, routes).await;
        }
    }
    // Resizes: the owner carries each out, once (a refused one keeps its error).
    for (v, request, revision) in session.resizes().await? {
        if request.error.is_none()
            && let Some(o) = owned.get_mut(&v)
            && *o.gate.borrow() == Gate::Serving
            && o.resize.as_ref().is_none_or(|t| t.is_finished())
        {
            o.resize =
                Some(tokio::spawn(resize(Arc::clone(session), Arc::clone(&o.c), v, request, revision)));
        }
    }
    for (name, o) in owned.iter_mut() {
        if session.lease_valid() && *o.gate.borrow() != Gate::Serving {
            o.gate.send_replace(Gate::Serving);
            tracing::info!(volume = %name, epoch = o.c.epoch, "serving again");
        }
        if o.repair.as_ref().is_none_or(|t| t.is_finished()) {
            o.repair = Some(tokio::spawn(repair(Arc::clone(session), Arc::clone(&o.c), config.out_time)));
        }
        if *o.gate.borrow() == Gate::Serving
            && o.last_housekeeping.elapsed() >= HOUSEKEEPING
            && o.housekeeping.as_ref().is_none_or(|t| t.is_finished())
        {
            o.last_housekeeping = Instant::now();
            let c = Arc::clone(&o.c);
            let name = name.clone();
            o.housekeeping = Some(tokio::spawn(async move {
                if let Err(e) = c.pool.tick().await {
                    tracing::warn!(volume = %name, error = %e, "housekeeping failed");
                }
            }));
        }
    }
    retries.retain(|name, _| specs.iter().any(|s| s.name == *name));
    let now = Instant::now();
    for spec in &specs {
        if owned.contains_key(&spec.name) || owners.iter().any(|(v, _, _)| *v == spec.name) {
            continue;
        }
        // A volume to delete is taken by nobody; owned by nobody, any node deletes it.
        if deleting(&spec.name) {
            if let Some(freed) = session.delete_unowned(&spec.name).await? {
                let freed: Vec<String> = freed.iter().map(ToString::to_string).collect();
                tracing::info!(volume = %spec.name, freed = %freed.join(","), "volume deleted (it had no owner)");
                end_route(routes, exports, &spec.name);
            }
            continue;
        }
        // A volume moving to another live node is that node's to take (unless it is cordoned:
        // then the move is as good as given up).
        let moving_to = moves
            .iter()
            .find(|(v, _)| *v == spec.name)
            .map(|(_, m)| m.to.as_str())
            .filter(|to| !cordoned(to));
        if moving_to.is_some_and(|to| to != config.name && live(to)) || stand_aside {
            continue;
        }
        // One this node failed to take waits its turn (a move to this node is tried at once).
        if moving_to.is_none() && retries.get(&spec.name).is_some_and(|r| now < r.after) {
            continue;
        }
        match coordinator::take(session, &Handle::current(), &spec.name).await {
            Ok(c) => {
                retries.remove(&spec.name);
                tracing::info!(
                    volume = %spec.name,
                    epoch = c.epoch,
                    took_ms = u64::try_from(c.took.as_millis()).unwrap_or(u64::MAX),
                    members = c.members.in_service.len(),
                    "coordinating"
                );
                let (gate, gated) = watch::channel(Gate::Serving);
                let served = Arc::new(Served::new(&spec.name, Arc::clone(&c.volume), gated));
                exports.insert(&direct_name(&spec.name), Arc::clone(&served) as Arc<dyn BlockVolume>);
                owned.insert(
                    spec.name.clone(),
                    OwnedVolume {
                        c: Arc::new(c),
                        gate,
                        served,
                        repair: None,
                        housekeeping: None,
                        // At once: what the takeover's recovery left set is cleared early.
                        last_housekeeping: Instant::now()
                            .checked_sub(HOUSEKEEPING)
                            .unwrap_or_else(Instant::now),
                        resize: None,
                    },
                );
                if moving_to.is_some() {
                    session.end_move(&spec.name).await?;
                }
            }
            Err(ClusterError::Owned { .. }) => {}
            Err(e) => {
                let wait =
                    retries.get(&spec.name).map_or(TAKE_RETRY_FIRST, |r| (r.wait * 2).min(TAKE_RETRY_MAX));
                retries.insert(spec.name.clone(), TakeRetry { after: Instant::now() + wait, wait });
                tracing::warn!(
                    volume = %spec.name,
                    error = %e,
                    retry_in_s = wait.as_secs(),
                    "cannot take the volume"
                );
                // A move this node cannot complete is given up, so that any node may take it.
                if moving_to == Some(config.name.as_str()) {
                    session.end_move(&spec.name).await?;
                }
            }
        }
    }
    // Routes: here, at the owner's NBD server, or nowhere yet (a volume this node just took is
    // in `owned`; one it just gave up still names it in `owners`).
    for spec in &specs {
        let route = match (owned.get(&spec.name), owners.iter().find(|(v, _, _)| *v == spec.name)) {
            (Some(o), _) => Route::Local(Arc::clone(&o.served) as Arc<dyn BlockVolume>),
            (None, Some((_, owner, _))) if owner.node != config.name => {
                match nodes.iter().find(|n| n.name == owner.node).and_then(|n| n.nbd_addr.clone()) {
                    Some(addr) => Route::Remote { node: owner.node.clone(), addr },
                    None => Route::Between,
                }
            }
            _ => Route::Between,
        };
        set_route(routes, &spec.name, route);
    }
    // The clients attached here, as a delete checks them.
    for name in routes.keys() {
        let count = exports.clients(name);
        if published.get(name).copied().unwrap_or(0) != count {
            session.publish_clients(name, count).await?;
            if count == 0 {
                published.remove(name);
            } else {
                published.insert(name.clone(), count);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use stria_dev::IoBytes;
    use stria_dev::mem::MemDevice;
    use stria_engine::{
        BlockVolume, DriveClass, Durability, Layout, NewDrive, Pool, VolumeError, VolumeRole, VolumeSpec,
    };
    use tokio::sync::watch;

    use super::{Gate, Served};
    use crate::forward::{Route, Routed};

    /// A 1 MiB volume on one memory drive.
    pub(crate) async fn volume() -> Arc<stria_engine::Volume<Arc<MemDevice>>> {
        let dev = Arc::new(MemDevice::new("m", 64 << 20));
        let drive = NewDrive {
            dev,
            path: "m".into(),
            class: DriveClass::Capacity,
            domain: String::new(),
            fresh: true,
        };
        let pool = Pool::create("t", vec![drive]).await.unwrap();
        let spec = VolumeSpec {
            name: "v".into(),
            size_bytes: 1 << 20,
            layout: Layout::Raid0 { width: 1 },
            chunk_bytes: 64 << 10,
            class: DriveClass::Capacity,
            role: VolumeRole::Plain,
        };
        pool.create_volume(spec).await.unwrap()
    }

    /// A FUA write of 4 KiB of `byte` at 0, running on its own.
    fn write_of<V: BlockVolume + ?Sized + 'static>(
        v: &Arc<V>,
        byte: u8,
    ) -> tokio::task::JoinHandle<Result<(), VolumeError>> {
        let v = Arc::clone(v);
        tokio::spawn(async move { v.write(0, IoBytes::copy_from(&[byte; 4096]), Durability::Fua).await })
    }

    fn write(
        v: &Arc<Served<stria_engine::Volume<Arc<MemDevice>>>>,
    ) -> tokio::task::JoinHandle<Result<(), VolumeError>> {
        write_of(v, 7)
    }

    /// Past the lease deadline requests wait (not fail) for a renewal, for at most the suspend
    /// time; a volume lost fails them at once (docs/design/cluster.md §8).
    #[tokio::test]
    async fn requests_are_held_while_suspended_then_served_or_failed() {
        let (gate, rx) = watch::channel(Gate::Serving);
        let served = Arc::new(Served::new("v", volume().await, rx));
        write(&served).await.unwrap().unwrap();

        // Suspended, then renewed: the held write completes.
        gate.send_replace(Gate::Suspended { until: Instant::now() + Duration::from_secs(30) });
        let held = write(&served);
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert!(!held.is_finished(), "a request past the deadline was not held");
        gate.send_replace(Gate::Serving);
        held.await.unwrap().unwrap();

        // Suspended too long: it fails when the bound passes, not before.
        let start = Instant::now();
        gate.send_replace(Gate::Suspended { until: start + Duration::from_millis(300) });
        let err = write(&served).await.unwrap().unwrap_err();
        assert!(matches!(err, VolumeError::Closed(_)), "{err}");
        assert!(start.elapsed() >= Duration::from_millis(290), "failed after {:?}", start.elapsed());

        // Lost while held: fails at once.
        gate.send_replace(Gate::Suspended { until: Instant::now() + Duration::from_secs(30) });
        let held = write(&served);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let lost = Instant::now();
        gate.send_replace(Gate::Lost);
        assert!(matches!(held.await.unwrap(), Err(VolumeError::Closed(_))));
        assert!(lost.elapsed() < Duration::from_secs(5));
    }

    /// An owner that closed the export a forwarder's connection is attached to (it lost the
    /// volume and took it again at a new epoch) answers ESHUTDOWN there: the forwarder connects
    /// again and reaches the new export, though the route did not change.
    #[tokio::test]
    async fn a_forwarder_connects_again_when_the_owner_closed_its_export() {
        let registry = Arc::new(stria_front::Registry::new());
        let (_lost, rx) = watch::channel(Gate::Lost);
        let old: Arc<dyn BlockVolume> = Arc::new(Served::new("v", volume().await, rx));
        registry.insert(&crate::forward::direct_name("v"), old);
        let exports: Arc<stria_front::Registry> = Arc::clone(&registry);
        let server = stria_nbd::Server::new(stria_nbd::ServerConfig::default(), exports).unwrap();
        let server = server.serve_tcp("127.0.0.1:0").await.unwrap();
        let addr = match server.local_addr() {
            stria_nbd::ListenAddr::Tcp(sa) => sa.to_string(),
            other => panic!("{other:?}"),
        };
        let (_route, routes) = watch::channel(Route::Remote { node: "n1".into(), addr });
        let v = Arc::new(Routed::new("v", "raid0:1".into(), 1 << 20, routes, Duration::from_secs(30)));
        let held = write_of(&v, 6);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!held.is_finished(), "a request refused by a closed export was not held");
        let (_serving, rx) = watch::channel(Gate::Serving);
        let next = volume().await;
        registry.insert(&crate::forward::direct_name("v"), Arc::new(Served::new("v", Arc::clone(&next), rx)));
        tokio::time::timeout(Duration::from_secs(10), held).await.expect("still held").unwrap().unwrap();
        assert_eq!(&next.read(0, 4096).await.unwrap()[..], &[6u8; 4096][..]);
        server.shutdown().await;
    }

    /// A volume this node lost (or handed over) refuses requests before they run; the node's
    /// export holds them and sends them to the next route, so the client sees no error.
    #[tokio::test]
    async fn a_request_refused_by_a_lost_volume_goes_to_the_next_route() {
        let (gate, rx) = watch::channel(Gate::Lost);
        let old: Arc<dyn BlockVolume> = Arc::new(Served::new("v", volume().await, rx));
        let (route, routes) = watch::channel(Route::Local(old));
        let v = Arc::new(Routed::new("v", "raid0:1".into(), 1 << 20, routes, Duration::from_secs(30)));
        let held = write_of(&v, 5);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!held.is_finished(), "a request refused by a lost volume was not held");
        let (_serving, rx) = watch::channel(Gate::Serving);
        let next = volume().await;
        route.send_replace(Route::Local(Arc::new(Served::new("v", Arc::clone(&next), rx))));
        held.await.unwrap().unwrap();
        assert_eq!(&next.read(0, 4096).await.unwrap()[..], &[5u8; 4096][..]);
        drop(gate);
    }
}
