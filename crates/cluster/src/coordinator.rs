//! The coordinator of a volume (docs/design/cluster.md §4): takes ownership in etcd, fences
//! every in-service slice at its epoch, takes the slices it cannot reach out of service with a
//! fenced etcd write before serving, then assembles the volume's pool over the fenced slices.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::join_all;
use stria_engine::{DriveClass, FoundDrive, Layout, NewDrive, Pool, Volume, VolumeRole, VolumeSpec};
use stria_slice::RemoteDevice;
use tokio::runtime::Handle;

use crate::etcd::{ClusterError, MembersGuard, Session};
use crate::records::{MembersRecord, OutSlice, SliceRef, VolumeRecord, now_unix};

/// How long one slice may take to connect and to answer its FENCE before it counts as
/// unreachable.
pub const SLICE_TIMEOUT: Duration = Duration::from_secs(2);

/// How many in-service members a volume of `layout` can lose and still have every row
/// readable (one pool per volume, every row on all its members: a mirror needs one copy, ec
/// its data shards, raid10 conservatively one copy of every column).
fn tolerance(layout: Layout) -> usize {
    match layout {
        Layout::Raid0 { .. } => 0,
        Layout::Raid1 { copies } | Layout::Raid10 { copies, .. } => copies as usize - 1,
        Layout::Ec { parity_shards, .. } => parity_shards as usize,
    }
}

/// A volume this node coordinates.
pub struct Coordinated {
    pub pool: Arc<Pool<RemoteDevice>>,
    pub volume: Arc<Volume<RemoteDevice>>,
    pub epoch: u64,
    /// The members as the takeover wrote them (later ones: `guard.members()`).
    pub members: MembersRecord,
    /// The pool's commit guard, and the one writer of the volume's members.
    pub guard: Arc<MembersGuard>,
    /// From the ownership transaction to the pool open (the takeover time, without the wait
    /// for the old owner's lease).
    pub took: Duration,
}

impl std::fmt::Debug for Coordinated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Coordinated").field("epoch", &self.epoch).field("members", &self.members).finish()
    }
}

/// Connects to `slice` and fences it at `epoch`. `Err` says why it is unreachable; a slice
/// already at a higher epoch means a newer owner exists: [`ClusterError::NotOwner`].
pub(crate) async fn fence_one(
    runtime: &Handle,
    volume: &str,
    slice: &SliceRef,
    epoch: u64,
) -> Result<Result<RemoteDevice, String>, ClusterError> {
    let addr: SocketAddr = match slice.addr.parse() {
        Ok(a) => a,
        Err(e) => return Ok(Err(format!("bad address {}: {e}", slice.addr))),
    };
    let dev =
        match tokio::time::timeout(SLICE_TIMEOUT, RemoteDevice::connect(runtime, addr, slice.slice, epoch))
            .await
        {
            Ok(Ok(dev)) => dev,
            Ok(Err(e)) => return Ok(Err(e.to_string())),
            Err(_) => return Ok(Err("no answer in time".into())),
        };
    match tokio::time::timeout(SLICE_TIMEOUT, dev.fence(epoch)).await {
        Ok(Ok(())) => Ok(Ok(dev)),
        Ok(Err(e)) if e.is_fenced() => Err(ClusterError::NotOwner { volume: volume.to_string(), epoch }),
        Ok(Err(e)) => Ok(Err(e.to_string())),
        Err(_) => Ok(Err("the fence got no answer in time".into())),
    }
}

/// Creates a volume over `spec.slices` (one pool per volume, each slice a drive whose failure
/// domain is its node) and coordinates it.
pub async fn create(
    session: &Session,
    runtime: &Handle,
    spec: VolumeRecord,
) -> Result<Coordinated, ClusterError> {
    let start = Instant::now();
    let epoch = session.create_volume(&spec).await?;
    match create_at(session, runtime, &spec, epoch).await {
        Ok(mut c) => {
            c.took = start.elapsed();
            Ok(c)
        }
        Err(e) => {
            let _ = session.abandon_create(&spec.name, epoch).await;
            Err(e)
        }
    }
}

async fn create_at(
    session: &Session,
    runtime: &Handle,
    spec: &VolumeRecord,
    epoch: u64,
) -> Result<Coordinated, ClusterError> {
    let fenced = join_all(spec.slices.iter().map(|slice| fence_one(runtime, &spec.name, slice, epoch))).await;
    let mut drives = Vec::new();
    for (slice, result) in spec.slices.iter().zip(fenced) {
        match result? {
            Ok(dev) => drives.push(NewDrive {
                dev,
                path: slice.to_string(),
                class: DriveClass::Capacity,
                // Each slice is a failure domain of its own to the pool: placement across nodes
                // is the cluster's (docs/design/cluster.md §5), and the pool's allocator, which
                // wants every member of an ec stripe or a mirror in a domain of its own, would
                // refuse two members on one node (ec:4+2 on three nodes).
                domain: slice.to_string(),
                fresh: false,
            }),
            Err(why) => {
                return Err(ClusterError::Unavailable(format!("slice {slice} is unreachable: {why}")));
            }
        }
    }
    let pool = Arc::new(Pool::create(&spec.name, drives).await?);
    let volume = pool
        .create_volume(VolumeSpec {
            name: spec.name.clone(),
            size_bytes: spec.size_bytes,
            layout: spec.layout,
            chunk_bytes: spec.chunk_bytes,
            class: DriveClass::Capacity,
            role: VolumeRole::Plain,
        })
        .await?;
    let members = MembersRecord { epoch, in_service: spec.slices.clone(), ..MembersRecord::default() };
    session.put_members(&spec.name, epoch, &members).await?;
    let guard = Arc::new(session.members_guard(&spec.name, epoch, members.clone()));
    pool.set_commit_guard(Arc::clone(&guard) as Arc<dyn stria_engine::CommitGuard>);
    Ok(Coordinated { pool, volume, epoch, members, guard, took: Duration::ZERO })
}

/// Takes over `volume`: ownership (refused while another live node holds it), fences, the
/// members update, the pool assembly (which replays the journal).
pub async fn take(session: &Session, runtime: &Handle, volume: &str) -> Result<Coordinated, ClusterError> {
    let start = Instant::now();
    let epoch = session.take_ownership(volume).await?;
    let result = take_at(session, runtime, volume, epoch).await;
    match result {
        Ok(mut c) => {
            c.took = start.elapsed();
            Ok(c)
        }
        Err(e) => {
            // Give the volume back so another node (or a later try) can take it; a no-op when
            // a newer owner holds it already.
            let _ = session.release(volume, epoch).await;
            Err(e)
        }
    }
}

async fn take_at(
    session: &Session,
    runtime: &Handle,
    volume: &str,
    epoch: u64,
) -> Result<Coordinated, ClusterError> {
    let (spec, _, old) = session.volume(volume).await?;
    if old.epoch == 0 {
        // No owner ever wrote the members: the volume was only specified (`stria cluster
        // volume create`), and its first owner makes the pool. No client was served before
        // the members were written, so a first owner that died half way left nothing to keep.
        return create_at(session, runtime, &spec, epoch).await;
    }
    let in_service = old.in_service.clone();
    let fenced = join_all(in_service.iter().map(|slice| fence_one(runtime, volume, slice, epoch))).await;
    let mut found = Vec::new();
    let mut members =
        MembersRecord { epoch, in_service: Vec::new(), out: old.out.clone(), joining: old.joining.clone() };
    for (slice, result) in in_service.iter().zip(fenced) {
        match result? {
            Ok(dev) => {
                found.push(FoundDrive { dev, path: slice.to_string() });
                members.in_service.push(slice.clone());
            }
            Err(reason) => {
                tracing::warn!(volume, %slice, %reason, "a slice did not answer the fence");
                members.out.push(OutSlice { slice: slice.clone(), epoch, since_unix: now_unix(), reason });
            }
        }
    }
    // Counted against every slice of the volume: those out already are missing too, and so
    // are those still being rebuilt (their data is incomplete).
    let complete = members.complete().count();
    let missing = spec.slices.len().saturating_sub(complete);
    if missing > tolerance(spec.layout) {
        // The slices not reached may hold data no other has: take nothing out, serve nothing.
        return Err(ClusterError::Unavailable(format!(
            "volume {volume} ({}) reached {complete} of its {} slices with complete data; it needs {} to serve",
            spec.layout,
            spec.slices.len(),
            spec.slices.len() - tolerance(spec.layout)
        )));
    }
    // Assemble first: a pool that cannot open (too few of its drives) changes nothing in etcd,
    // so the slices not reached stay in service and a later try fences them again. Assembly
    // may record on the fenced slices that the unreached ones are missing; no client is served
    // before etcd says the same (a fenced write), just below. A slice the pool does not list
    // (a replacement whose addition never committed) or lists as failed is left out of the pool
    // and out of service.
    let pool = Arc::new(Pool::open_skipping(found, false).await?);
    for (path, why) in pool.ignored_drives() {
        if let Some(i) = members.in_service.iter().position(|s| s.to_string() == *path) {
            let slice = members.in_service.remove(i);
            tracing::warn!(volume, %slice, %why, "a slice left out of the pool");
            if !members.out.iter().any(|o| o.slice.same(&slice)) {
                members.out.push(OutSlice { slice, epoch, since_unix: now_unix(), reason: why.clone() });
            }
        }
    }
    session.put_members(volume, epoch, &members).await?;
    let volume_handle = pool
        .volume(volume)
        .ok_or_else(|| ClusterError::Unavailable(format!("the pool of {volume} holds no volume {volume}")))?;
    let guard = Arc::new(session.members_guard(volume, epoch, members.clone()));
    pool.set_commit_guard(Arc::clone(&guard) as Arc<dyn stria_engine::CommitGuard>);
    if !session.lease_valid() {
        return Err(ClusterError::Unavailable("the node's lease lapsed during the takeover".into()));
    }
    Ok(Coordinated { pool, volume: volume_handle, epoch, members, guard, took: Duration::ZERO })
}
