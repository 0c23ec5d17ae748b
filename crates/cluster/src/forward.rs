//! Every node serves every volume (docs/design/cluster.md §6.2): the owner serves it itself, any
//! other node forwards each request to the owner as an NBD client of the owner's NBD server.
//! While a volume is between owners (a failover, a planned move) a request is held, not failed,
//! and goes to the next owner once one is known, for at most the hold time.
//!
//! [`Routed`] is what a node's NBD server exports under the volume's name. The node's agent sets
//! its [`Route`] from etcd: [`Route::Local`] while the node owns the volume, [`Route::Remote`]
//! while another node does, [`Route::Between`] while nobody does. A forwarder reaches the owner
//! through the owner's *direct* export ([`direct_name`]), which never forwards again, so a request
//! crosses at most one hop whatever the nodes' views of etcd.
//!
//! Retried: a request the owner refused before running it (the volume is not its own any more,
//! or it is moving: `ESHUTDOWN`, [`VolumeError::Closed`] locally), and one whose connection broke
//! (it may have run). A block write or zeroing that runs twice within the client's one request is
//! allowed by the block contract; a compare and write is never forwarded (NBD has none).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use stria_dev::{IoBuf, IoBytes};
use stria_nbd::{ClientError, NbdClient};
use stria_volume::{
    BlockVolume, Dealloc, Durability, ErrorKind, Extent, PoolFailure, VolumeError, VolumeFuture, VolumeInfo,
    Zeroing,
};
use tokio::sync::watch;

/// The export name under which an owner serves a volume to forwarders (never forwarded again).
/// Volume names cannot contain `/`, so this cannot name a volume.
pub fn direct_name(volume: &str) -> String {
    format!("owner/{volume}")
}

/// Where a node sends a volume's requests now.
#[derive(Clone)]
pub enum Route {
    /// This node owns the volume and serves it.
    Local(Arc<dyn BlockVolume>),
    /// `node` owns it; its NBD server is at `addr`.
    Remote { node: String, addr: String },
    /// Nobody serves it now (a takeover or a move in progress): requests wait.
    Between,
    /// The volume was deleted (docs/design/cluster.md §6.4): requests fail at once.
    Deleted,
}

impl std::fmt::Debug for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Route::Local(_) => f.write_str("Local"),
            Route::Remote { node, addr } => write!(f, "Remote({node} at {addr})"),
            Route::Between => f.write_str("Between"),
            Route::Deleted => f.write_str("Deleted"),
        }
    }
}

impl Route {
    /// The same route (the same local volume object, or the same node at the same address).
    pub fn same(&self, other: &Route) -> bool {
        match (self, other) {
            (Route::Local(a), Route::Local(b)) => Arc::ptr_eq(a, b),
            (Route::Remote { node: a, addr: x }, Route::Remote { node: b, addr: y }) => a == b && x == y,
            (Route::Between, Route::Between) | (Route::Deleted, Route::Deleted) => true,
            _ => false,
        }
    }
}

/// An error the owner answered, of a kind its NBD value names.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
struct Forwarded {
    kind: ErrorKind,
    message: String,
}

impl PoolFailure for Forwarded {
    fn kind(&self) -> ErrorKind {
        self.kind
    }
}

/// A request as it is forwarded.
enum Request {
    Read { offset: u64, len: usize },
    Write { offset: u64, data: IoBytes, durability: Durability },
    Zeroes { offset: u64, len: u64, zeroing: Zeroing, durability: Durability },
    Discard { offset: u64, len: u64, durability: Durability },
    Flush,
}

enum Answer {
    Data(IoBuf),
    Done,
}

/// What one try came to.
enum Try {
    Answered(Result<Answer, VolumeError>),
    /// Not carried out by an owner (or not known to be): try again on the next route.
    Again(String),
}

/// A volume as a node's clients reach it, wherever its owner is.
pub struct Routed {
    name: String,
    info: VolumeInfo,
    /// The spec's size: what clients are told at connect and requests are checked against
    /// (a resize changes it, docs/design/cluster.md §6.5).
    size_bytes: AtomicU64,
    route: watch::Receiver<Route>,
    /// The connection to the remote owner, and that owner's address.
    client: tokio::sync::Mutex<Option<(String, Arc<NbdClient>)>>,
    hold: Duration,
    /// Requests sent to a remote owner (tries, retries included).
    forwarded: AtomicU64,
    /// Tries that were not answered by an owner and were made again.
    retried: AtomicU64,
}

/// What a node's export of a volume has counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct RouteCounters {
    /// Requests sent to a remote owner (retries included).
    pub forwarded: u64,
    /// Tries not answered by an owner (between owners, refused before running, a broken
    /// connection), made again.
    pub retried: u64,
}

impl std::fmt::Debug for Routed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Routed").field("name", &self.name).field("route", &*self.route.borrow()).finish()
    }
}

impl Routed {
    /// The volume `name` of `size_bytes`, routed by `route`; a request waits at most `hold` for
    /// an owner to answer it.
    pub fn new(
        name: &str,
        layout: String,
        size_bytes: u64,
        route: watch::Receiver<Route>,
        hold: Duration,
    ) -> Routed {
        Routed {
            name: name.to_string(),
            info: VolumeInfo {
                name: name.to_string(),
                layout,
                preferred_block_bytes: 4096,
                read_only: false,
            },
            size_bytes: AtomicU64::new(size_bytes),
            route,
            client: tokio::sync::Mutex::new(None),
            hold,
            forwarded: AtomicU64::new(0),
            retried: AtomicU64::new(0),
        }
    }

    /// The volume was resized: clients that connect from now on are told `size_bytes`, and the
    /// connection to the owner is made again at that size.
    pub fn set_size(&self, size_bytes: u64) {
        self.size_bytes.store(size_bytes, Ordering::Relaxed);
    }

    /// What this export has counted since it was made.
    pub fn counters(&self) -> RouteCounters {
        RouteCounters {
            forwarded: self.forwarded.load(Ordering::Relaxed),
            retried: self.retried.load(Ordering::Relaxed),
        }
    }

    async fn call(&self, request: Request) -> Result<Answer, VolumeError> {
        let deadline = Instant::now() + self.hold;
        let mut route = self.route.clone();
        loop {
            let now = route.borrow_and_update().clone();
            let why = match self.try_once(&now, &request).await {
                Try::Answered(answer) => return answer,
                Try::Again(why) => why,
            };
            self.retried.fetch_add(1, Ordering::Relaxed);
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(VolumeError::Closed(format!(
                    "{}: no owner answered within {} s ({why})",
                    self.name,
                    self.hold.as_secs()
                )));
            }
            // The next route, or the same one again shortly (an owner that restarts, a
            // connection that broke).
            let node_runs = tokio::select! {
                changed = route.changed() => changed.is_ok(),
                () = tokio::time::sleep(left.min(RETRY)) => true,
            };
            if !node_runs {
                return Err(VolumeError::Closed(format!("{}: this node stopped ({why})", self.name)));
            }
        }
    }

    async fn try_once(&self, route: &Route, request: &Request) -> Try {
        match route {
            Route::Between => Try::Again("the volume is between owners".into()),
            Route::Deleted => {
                Try::Answered(Err(VolumeError::Closed(format!("{}: the volume was deleted", self.name))))
            }
            Route::Local(v) => match local(&**v, request).await {
                // Refused before it ran: lost, moving, or suspended too long.
                Err(VolumeError::Closed(why)) => Try::Again(why),
                other => Try::Answered(other),
            },
            Route::Remote { node, addr } => {
                let client = match self.connect(addr).await {
                    Ok(c) => c,
                    Err(e) => return Try::Again(format!("owner {node}: {e}")),
                };
                self.forwarded.fetch_add(1, Ordering::Relaxed);
                match remote(&client, request).await {
                    Ok(answer) => Try::Answered(Ok(answer)),
                    Err(ClientError::Server(108)) => {
                        // The export this connection is attached to was closed (the volume was
                        // lost or moved, or the node took it again at a new epoch): connect again.
                        self.forget(&client).await;
                        Try::Again(format!("owner {node} refused it (ESHUTDOWN)"))
                    }
                    Err(ClientError::Server(code)) => Try::Answered(Err(self.error(request, code))),
                    Err(e @ ClientError::Invalid(_)) => Try::Answered(Err(VolumeError::InvalidRequest {
                        offset_bytes: request.offset(),
                        len_bytes: request.len(),
                        why: e.to_string(),
                    })),
                    Err(e) => {
                        self.forget(&client).await;
                        Try::Again(format!("owner {node}: {e}"))
                    }
                }
            }
        }
    }

    /// The connection to the owner at `addr`, made now if there is none.
    async fn connect(&self, addr: &str) -> Result<Arc<NbdClient>, ClientError> {
        let mut slot = self.client.lock().await;
        let size_bytes = self.size_bytes.load(Ordering::Relaxed);
        if let Some((at, c)) = slot.as_ref()
            && at == addr
            && !c.is_closed()
            && c.size_bytes() == size_bytes
        {
            return Ok(Arc::clone(c));
        }
        let c = Arc::new(
            tokio::time::timeout(CONNECT, NbdClient::connect(addr, &direct_name(&self.name)))
                .await
                .map_err(|_| {
                    ClientError::Disconnected(format!("{addr}: no answer in {} s", CONNECT.as_secs()))
                })??,
        );
        // A different size: another volume of that name, or the owner resized it and this node
        // has not seen the spec say so yet (tried again).
        if c.size_bytes() != size_bytes {
            return Err(ClientError::Disconnected(format!(
                "{addr} serves {} with {} bytes, not {size_bytes}",
                self.name,
                c.size_bytes(),
            )));
        }
        *slot = Some((addr.to_string(), Arc::clone(&c)));
        Ok(c)
    }

    async fn forget(&self, client: &Arc<NbdClient>) {
        let mut slot = self.client.lock().await;
        if slot.as_ref().is_some_and(|(_, c)| Arc::ptr_eq(c, client)) {
            *slot = None;
        }
    }

    fn error(&self, request: &Request, code: u32) -> VolumeError {
        let (offset_bytes, len_bytes) = (request.offset(), request.len());
        match code {
            1 => VolumeError::ReadOnly { volume: self.name.clone() },
            22 => VolumeError::InvalidRequest {
                offset_bytes,
                len_bytes,
                why: "refused by the owner (EINVAL)".into(),
            },
            95 => VolumeError::NotCheap { offset_bytes, len_bytes },
            28 => self.pool_error(ErrorKind::NoSpace, "the owner answered ENOSPC".into()),
            code => self.pool_error(ErrorKind::Io, format!("the owner answered error {code}")),
        }
    }

    fn pool_error(&self, kind: ErrorKind, message: String) -> VolumeError {
        VolumeError::Pool { volume: self.name.clone(), source: Box::new(Forwarded { kind, message }) }
    }
}

/// How long a forwarder waits to connect to an owner.
const CONNECT: Duration = Duration::from_secs(2);
/// How soon a request refused by an unchanged route is tried again.
const RETRY: Duration = Duration::from_millis(100);

impl Request {
    fn offset(&self) -> u64 {
        match self {
            Request::Read { offset, .. }
            | Request::Write { offset, .. }
            | Request::Zeroes { offset, .. }
            | Request::Discard { offset, .. } => *offset,
            Request::Flush => 0,
        }
    }

    fn len(&self) -> u64 {
        match self {
            Request::Read { len, .. } => *len as u64,
            Request::Write { data, .. } => data.len() as u64,
            Request::Zeroes { len, .. } | Request::Discard { len, .. } => *len,
            Request::Flush => 0,
        }
    }
}

async fn local(v: &dyn BlockVolume, request: &Request) -> Result<Answer, VolumeError> {
    match request {
        Request::Read { offset, len } => v.read(*offset, *len).await.map(Answer::Data),
        Request::Write { offset, data, durability } => {
            v.write(*offset, data.clone(), *durability).await.map(|()| Answer::Done)
        }
        Request::Zeroes { offset, len, zeroing, durability } => {
            v.write_zeroes(*offset, *len, *zeroing, *durability).await.map(|()| Answer::Done)
        }
        Request::Discard { offset, len, durability } => {
            v.discard(*offset, *len, *durability).await.map(|()| Answer::Done)
        }
        Request::Flush => v.flush().await.map(|()| Answer::Done),
    }
}

/// Longest zeroing or discard sent in one NBD request (the length field has 32 bits).
const MAX_RANGE: u64 = 1 << 30;

async fn remote(c: &NbdClient, request: &Request) -> Result<Answer, ClientError> {
    match request {
        Request::Read { offset, len } => c.read(*offset, *len).await.map(Answer::Data),
        Request::Write { offset, data, durability } => {
            c.write(*offset, data.clone(), *durability == Durability::Fua).await.map(|()| Answer::Done)
        }
        Request::Zeroes { offset, len, zeroing, durability } => {
            let no_hole = zeroing.dealloc == Dealloc::Forbidden;
            let fast = zeroing.cheap_only();
            let fua = *durability == Durability::Fua;
            for (at, n) in pieces(*offset, *len) {
                c.write_zeroes(at, n, no_hole, fast, fua).await?;
            }
            Ok(Answer::Done)
        }
        Request::Discard { offset, len, durability } => {
            for (at, n) in pieces(*offset, *len) {
                c.trim(at, n, *durability == Durability::Fua).await?;
            }
            Ok(Answer::Done)
        }
        Request::Flush => c.flush().await.map(|()| Answer::Done),
    }
}

/// A range cut into NBD-sized pieces.
fn pieces(offset: u64, len: u64) -> impl Iterator<Item = (u64, u32)> {
    (0..len.div_ceil(MAX_RANGE)).map(move |i| {
        let at = i * MAX_RANGE;
        (offset + at, u32::try_from((len - at).min(MAX_RANGE)).expect("at most 1 GiB"))
    })
}

fn done(answer: Result<Answer, VolumeError>) -> Result<(), VolumeError> {
    answer.map(|_| ())
}

impl BlockVolume for Routed {
    fn info(&self) -> VolumeInfo {
        match &*self.route.borrow() {
            Route::Local(v) => v.info(),
            _ => self.info.clone(),
        }
    }

    fn size_bytes(&self) -> u64 {
        self.size_bytes.load(Ordering::Relaxed)
    }

    fn read(&self, offset_bytes: u64, len_bytes: usize) -> VolumeFuture<'_, IoBuf> {
        Box::pin(async move {
            match self.call(Request::Read { offset: offset_bytes, len: len_bytes }).await? {
                Answer::Data(buf) => Ok(buf),
                Answer::Done => unreachable!("a read answers data"),
            }
        })
    }

    fn write(&self, offset_bytes: u64, data: IoBytes, durability: Durability) -> VolumeFuture<'_, ()> {
        Box::pin(
            async move { done(self.call(Request::Write { offset: offset_bytes, data, durability }).await) },
        )
    }

    fn compare_and_write(
        &self,
        offset_bytes: u64,
        compare: IoBytes,
        write: IoBytes,
        durability: Durability,
    ) -> VolumeFuture<'_, ()> {
        // Only where the volume is served here: a compare and write must not run twice.
        let route = self.route.borrow().clone();
        Box::pin(async move {
            match route {
                Route::Local(v) => v.compare_and_write(offset_bytes, compare, write, durability).await,
                _ => Err(VolumeError::InvalidRequest {
                    offset_bytes,
                    len_bytes: write.len() as u64,
                    why: format!("compare and write is served only by {}'s owner", self.name),
                }),
            }
        })
    }

    fn write_zeroes(
        &self,
        offset_bytes: u64,
        len_bytes: u64,
        zeroing: Zeroing,
        durability: Durability,
    ) -> VolumeFuture<'_, ()> {
        Box::pin(async move {
            done(
                self.call(Request::Zeroes { offset: offset_bytes, len: len_bytes, zeroing, durability })
                    .await,
            )
        })
    }

    fn discard(&self, offset_bytes: u64, len_bytes: u64, durability: Durability) -> VolumeFuture<'_, ()> {
        Box::pin(async move {
            done(self.call(Request::Discard { offset: offset_bytes, len: len_bytes, durability }).await)
        })
    }

    fn flush(&self) -> VolumeFuture<'_, ()> {
        Box::pin(async move { done(self.call(Request::Flush).await) })
    }

    fn block_status(&self, offset_bytes: u64, len_bytes: u64) -> VolumeFuture<'_, Vec<Extent>> {
        // Allocation is a hint: where the volume is not served here, all of it is data.
        let route = self.route.borrow().clone();
        Box::pin(async move {
            match route {
                Route::Local(v) => v.block_status(offset_bytes, len_bytes).await,
                _ => Ok(vec![Extent { len_bytes, unallocated: false }]),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use stria_dev::IoBytes;
    use stria_volume::{BlockVolume, Durability, VolumeError};
    use tokio::sync::watch;

    use super::{Route, Routed};

    fn routed(route: Route, hold: Duration) -> (watch::Sender<Route>, Arc<Routed>) {
        let (tx, rx) = watch::channel(route);
        (tx, Arc::new(Routed::new("v", "raid0:1".into(), 1 << 20, rx, hold)))
    }

    fn write(v: &Arc<Routed>) -> tokio::task::JoinHandle<Result<(), VolumeError>> {
        let v = Arc::clone(v);
        tokio::spawn(async move { v.write(0, IoBytes::copy_from(&[9u8; 4096]), Durability::Fua).await })
    }

    /// A request waits while the volume is between owners and is served once a route is known;
    /// it fails when no owner answers within the hold time, and at once when the node stops.
    #[tokio::test]
    async fn requests_wait_for_an_owner_for_at_most_the_hold_time() {
        let volume: Arc<dyn BlockVolume> = crate::node::tests::volume().await;
        let (tx, v) = routed(Route::Between, Duration::from_secs(30));
        let held = write(&v);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!held.is_finished(), "a request with no owner did not wait");
        tx.send_replace(Route::Local(Arc::clone(&volume)));
        held.await.unwrap().unwrap();
        assert_eq!(&v.read(0, 4096).await.unwrap()[..], &[9u8; 4096][..]);

        // An owner that cannot be reached: tried again until the hold time passes.
        let (_tx, v) = routed(
            Route::Remote { node: "n9".into(), addr: "127.0.0.1:1".into() },
            Duration::from_millis(400),
        );
        let start = Instant::now();
        let err = write(&v).await.unwrap().unwrap_err();
        assert!(matches!(err, VolumeError::Closed(_)), "{err}");
        assert!(start.elapsed() >= Duration::from_millis(390), "failed after {:?}", start.elapsed());

        // The node stops (its routes go): waiting requests fail at once.
        let (tx, v) = routed(Route::Between, Duration::from_secs(30));
        let held = write(&v);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let stopped = Instant::now();
        drop(tx);
        assert!(matches!(held.await.unwrap(), Err(VolumeError::Closed(_))));
        assert!(stopped.elapsed() < Duration::from_secs(5));

        // The volume is deleted (its route ends as the node's agent ends it: the last route
        // sent, then the sender dropped): a waiting request and a later one fail at once, saying
        // so, not "this node stopped".
        let (tx, v) = routed(Route::Between, Duration::from_secs(30));
        let held = write(&v);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let deleted = Instant::now();
        tx.send_replace(Route::Deleted);
        drop(tx);
        for result in [held.await.unwrap(), write(&v).await.unwrap()] {
            let err = result.unwrap_err();
            assert!(matches!(err, VolumeError::Closed(_)) && err.to_string().contains("deleted"), "{err}");
        }
        assert!(deleted.elapsed() < Duration::from_secs(5));
    }
}
