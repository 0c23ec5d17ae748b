//! Bringing a volume's redundancy back (docs/design/cluster.md §7): an out member whose node is
//! back is rebuilt onto its own slice at once; one whose node stays away longer than the
//! out-time is rebuilt onto a free slice of another node. Either way the owner claims the slice
//! in etcd (a fenced write), fences it at the volume's epoch, has the pool replace the out drive
//! by it (the commit guard puts it in service and releases a slice left behind), and rebuilds it
//! through the pool's rebuild, paced by the QoS rebuild class. The slice stays `joining` until the
//! rebuild is done, so a takeover meanwhile does not count it as a complete copy.
//!
//! A slice that comes back to its own node gets a delta resync (docs/design/delta-resync.md):
//! `Pool::online_drive` puts it back in its slot and the rebuild copies only the rows written
//! while it was out, unless it is not the very slice that went out or the pool did not keep what
//! it missed; then it is rebuilt in full.

use std::time::Duration;

use stria_engine::{DriveClass, DriveState, NewDrive};
use tokio::runtime::Handle;

use crate::coordinator::{Coordinated, fence_one};
use crate::etcd::{ClusterError, Session};
use crate::records::{MembersRecord, NodeRecord, OutSlice, SliceRef, VolumeRecord, now_unix};

/// What one look at a volume's members decided.
#[derive(Debug, PartialEq, Eq)]
pub enum Repair {
    /// Every member is in service and complete, or a rebuild is running.
    Nothing,
    /// An out member waits: its node is away and the out-time has not passed, or no free slice
    /// fits (the reason says which).
    Waiting(String),
    /// `slice` replaced the out member `replaces` in the pool; its rebuild is due.
    Replaced { slice: SliceRef, replaces: SliceRef },
}

/// Where `out` can be rebuilt: its own slice when its node is back (the node's current address),
/// else, after `out_time`, a free slice of another node that keeps the volume's spread (no node
/// holding more of its members than the most any node held at create), big enough, preferring
/// a slice this volume claimed already.
fn target(
    spec: &VolumeRecord,
    members: &MembersRecord,
    out: &OutSlice,
    nodes: &[NodeRecord],
    claims: &[(SliceRef, String)],
    cordoned: &[String],
    out_time: Duration,
) -> Result<SliceRef, String> {
    let live =
        |s: &SliceRef| nodes.iter().find(|n| n.name == s.node && n.slices.iter().any(|i| i.id == s.slice));
    if let Some(node) = live(&out.slice) {
        return Ok(SliceRef {
            node: node.name.clone(),
            addr: node.slice_addr.clone(),
            slice: out.slice.slice,
        });
    }
    let away = now_unix().saturating_sub(out.since_unix);
    if away < out_time.as_secs() {
        return Err(format!(
            "{} is away for {away} s; it is rebuilt elsewhere after {} s unless it comes back",
            out.slice,
            out_time.as_secs()
        ));
    }
    let cap = spec
        .slices
        .iter()
        .map(|s| spec.slices.iter().filter(|t| t.node == s.node).count())
        .max()
        .unwrap_or(1);
    let held = |node: &str| members.in_service.iter().filter(|s| s.node == node).count();
    let need = spec
        .slices
        .iter()
        .filter_map(|s| nodes.iter().find(|n| n.name == s.node)?.slices.iter().find(|i| i.id == s.slice))
        .map(|i| i.bytes)
        .max()
        .unwrap_or(0);
    let mut best: Option<(bool, SliceRef)> = None;
    for node in nodes {
        if node.name == out.slice.node || held(&node.name) >= cap || cordoned.contains(&node.name) {
            continue;
        }
        for info in &node.slices {
            let slice = SliceRef { node: node.name.clone(), addr: node.slice_addr.clone(), slice: info.id };
            let claim = claims.iter().find(|(c, _)| c.same(&slice)).map(|(_, v)| v.as_str());
            let ours = claim == Some(spec.name.as_str()) && members.joining.iter().any(|j| j.same(&slice));
            if info.bytes < need
                || (claim.is_some() && !ours)
                || members.in_service.iter().any(|s| s.same(&slice))
            {
                continue;
            }
            if best.as_ref().is_none_or(|(b, _)| ours && !*b) {
                best = Some((ours, slice));
            }
        }
    }
    best.map(|(_, s)| s).ok_or_else(|| {
        let left_out = if cordoned.is_empty() {
            String::new()
        } else {
            format!(" (cordoned, left out: {})", cordoned.join(", "))
        };
        format!(
            "{} is away for {away} s, past the out-time, but no live node outside the volume's has a free slice of at least {} MiB{left_out}",
            out.slice,
            need >> 20
        )
    })
}

/// One repair step for a volume `c` coordinates (no rebuild running): picks the first out
/// member that can be rebuilt now and puts its replacement in the pool. The rebuild itself is
/// the caller's (`c.pool.rebuild`), then [`finish`].
pub async fn step(
    session: &Session,
    runtime: &Handle,
    c: &Coordinated,
    out_time: Duration,
) -> Result<Repair, ClusterError> {
    let members = c.guard.members().await;
    if members.out.is_empty() {
        return Ok(Repair::Nothing);
    }
    let (spec, _, _) = session.volume(c.volume.name()).await?;
    let nodes = session.nodes().await?;
    let claims = session.claims().await?;
    let cordoned = session.cordoned_nodes().await?;
    let meta = c.pool.meta();
    let mut waiting = Vec::new();
    for out in &members.out {
        let name = out.slice.to_string();
        let Some(record) = meta.drives.iter().find(|d| d.path_hint == name && d.state == DriveState::Failed)
        else {
            // Out in etcd but not a failed drive of the pool (left out at a takeover, never
            // added): nothing in the pool to replace; the next commit releases it.
            continue;
        };
        let slot = record.slot;
        let slice = match target(&spec, &members, out, &nodes, &claims, &cordoned, out_time) {
            Ok(s) => s,
            Err(why) => {
                waiting.push(why);
                continue;
            }
        };
        c.guard.claim(&slice).await?;
        let dev = match fence_one(runtime, c.volume.name(), &slice, c.epoch).await {
            Ok(Ok(dev)) => dev,
            Ok(Err(why)) => {
                unclaim(c, &slice, &members).await;
                waiting.push(format!("{slice} cannot be reached: {why}"));
                continue;
            }
            // The slice is at a higher epoch: another volume's newer owner used it before it
            // was released. It cannot serve this volume's epoch.
            Err(ClusterError::NotOwner { .. }) => {
                unclaim(c, &slice, &members).await;
                waiting.push(format!("{slice} was fenced at a newer epoch by another volume"));
                continue;
            }
            Err(e) => return Err(e),
        };
        let joined = if slice.same(&out.slice) {
            c.pool.online_drive(slot, dev, &slice.to_string()).await.map(|comeback| {
                tracing::info!(volume = c.volume.name(), %slice, ?comeback, "an out member is back");
            })
        } else {
            let new = NewDrive {
                dev,
                path: slice.to_string(),
                class: DriveClass::Capacity,
                // Each slice is a failure domain of its own to the pool: placement across nodes
                // is the cluster's (docs/design/cluster.md §5), and the pool's allocator, which
                // wants every member of an ec stripe or a mirror in a domain of its own, would
                // refuse two members on one node (ec:4+2 on three nodes).
                domain: slice.to_string(),
                fresh: false,
            };
            c.pool.replace_drive(slot, new).await.map(|_| {
                tracing::info!(volume = c.volume.name(), %slice, replaces = %out.slice, "a replacement member joined; rebuilding it");
            })
        };
        if let Err(e) = joined {
            unclaim(c, &slice, &members).await;
            return Err(e.into());
        }
        return Ok(Repair::Replaced { slice, replaces: out.slice.clone() });
    }
    Ok(if waiting.is_empty() { Repair::Nothing } else { Repair::Waiting(waiting.join("; ")) })
}

/// Gives a claim back after a replacement that did not happen (unless the slice is one of the
/// volume's own members).
async fn unclaim(c: &Coordinated, slice: &SliceRef, members: &MembersRecord) {
    let own = members.in_service.iter().chain(members.out.iter().map(|o| &o.slice)).any(|s| s.same(slice));
    let ops = if own { Vec::new() } else { vec![etcd_client::TxnOp::delete(c.guard.claim_key(slice), None)] };
    let s = slice.clone();
    if let Err(e) = c.guard.update(move |m| m.joining.retain(|j| !j.same(&s)), Vec::new(), ops).await {
        tracing::warn!(volume = c.volume.name(), %slice, error = %e, "cannot give a claim back");
    }
}

/// After the pool's rebuild finished: every joining slice the pool holds is complete now.
pub async fn finish(c: &Coordinated) -> Result<(), ClusterError> {
    if c.pool.rebuild_pending() {
        return Ok(());
    }
    let members = c.guard.members().await;
    for slice in members.joining.iter().filter(|j| members.in_service.iter().any(|s| s.same(j))) {
        c.guard.joined(slice).await?;
        tracing::info!(volume = c.volume.name(), %slice, "rebuilt; a complete member again");
    }
    Ok(())
}
