//! A node's connection to etcd: its lease, kept alive, and the fenced transactions on a
//! volume's keys (docs/design/cluster.md §2, §4).

use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{Client, Compare, CompareOp, ConnectOptions, PutOptions, Txn, TxnOp, TxnOpResponse};
use parking_lot::Mutex;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::task::JoinHandle;

use crate::records::{
    CordonRecord, DeleteRecord, Keys, MembersRecord, MoveRecord, NodeRecord, OutSlice, OwnerRecord,
    ResizeRecord, SliceRef, VolumeRecord, now_unix,
};

/// Why a cluster operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("etcd: {0}")]
    Etcd(#[from] etcd_client::Error),
    #[error("volume {volume} is owned by node {node}")]
    Owned { volume: String, node: String },
    #[error("volume {0} already exists")]
    Exists(String),
    #[error("no volume {0} in the cluster")]
    NoSuchVolume(String),
    #[error(
        "this node no longer owns volume {volume} at epoch {epoch}: its lease expired or a newer owner took it"
    )]
    NotOwner { volume: String, epoch: u64 },
    #[error("a malformed record at {key}: {why}")]
    Record { key: String, why: String },
    #[error(transparent)]
    Engine(#[from] stria_engine::EngineError),
    #[error(transparent)]
    Volume(#[from] stria_engine::VolumeError),
    #[error("slice {slice} is claimed by volume {by}")]
    Claimed { slice: String, by: String },
    #[error("{0}")]
    Unavailable(String),
    #[error(
        "volume {volume} has NBD clients attached ({at}); {doing}. \
         Disconnect them first, or run the same command again with --force"
    )]
    Attached { volume: String, at: String, doing: &'static str },
    #[error(
        "shrinking volume {volume} from {from} to {to} discards its last {lost} (bytes {to_bytes} to \
         {from_bytes}) and whatever is stored there. Shrink the filesystem on it first; then say so \
         with --allow-shrink",
        from = stria_engine::units::format_size(*from_bytes),
        to = stria_engine::units::format_size(*to_bytes),
        lost = stria_engine::units::format_size(from_bytes - to_bytes)
    )]
    Shrink { volume: String, from_bytes: u64, to_bytes: u64 },
}

/// The cluster's records in etcd, read and specified without a lease (what `stria cluster`
/// uses; a node's [`Session`] derefs to one).
#[derive(Clone)]
pub struct Cluster {
    client: Client,
    keys: Keys,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster").field("keys", &self.keys).finish()
    }
}

impl Cluster {
    /// Connects to etcd (3 s to connect, 5 s per request).
    pub async fn connect(endpoints: &[String], keys: Keys) -> Result<Cluster, ClusterError> {
        Ok(Cluster { client: Client::connect(endpoints, Some(connect_options())).await?, keys })
    }

    /// The nodes registered now.
    pub async fn nodes(&self) -> Result<Vec<NodeRecord>, ClusterError> {
        let prefix = self.keys.nodes();
        let kvs = self.list(&prefix).await?;
        kvs.iter().map(|kv| parse(&prefix, kv.value())).collect()
    }

    /// Every key under `prefix`, with its value and revisions.
    async fn list(&self, prefix: &str) -> Result<Vec<etcd_client::KeyValue>, ClusterError> {
        let mut resp =
            self.client.clone().get(prefix, Some(etcd_client::GetOptions::new().with_prefix())).await?;
        Ok(resp.take_kvs())
    }

    /// Writes a new volume's spec, without taking it: the first node that takes it makes its
    /// pool (`coordinator::take`).
    pub async fn put_spec(&self, spec: &VolumeRecord) -> Result<(), ClusterError> {
        spec.check()?;
        let key = self.keys.spec(&spec.name);
        let mut when = vec![Compare::create_revision(key.clone(), CompareOp::Equal, 0)];
        let mut ops = vec![TxnOp::put(key, json(spec), None)];
        self.claim_ops(spec, &mut when, &mut ops);
        if !self.client.clone().txn(Txn::new().when(when).and_then(ops)).await?.succeeded() {
            return Err(self.why_not_created(spec).await);
        }
        Ok(())
    }

    /// The compares and puts that claim every slice of `spec` for it.
    fn claim_ops(&self, spec: &VolumeRecord, when: &mut Vec<Compare>, ops: &mut Vec<TxnOp>) {
        for slice in &spec.slices {
            let key = self.keys.claim(slice);
            when.push(Compare::create_revision(key.clone(), CompareOp::Equal, 0));
            ops.push(TxnOp::put(key, spec.name.as_bytes().to_vec(), None));
        }
    }

    /// Why a create transaction failed: the name is taken, or one of its slices is.
    async fn why_not_created(&self, spec: &VolumeRecord) -> ClusterError {
        if let Ok(claims) = self.claims().await {
            for slice in &spec.slices {
                if let Some((_, by)) = claims.iter().find(|(s, _)| s.same(slice)) {
                    return ClusterError::Claimed { slice: slice.to_string(), by: by.clone() };
                }
            }
        }
        ClusterError::Exists(spec.name.clone())
    }

    /// Every claimed slice (node and id; no address) and the volume it belongs to.
    pub async fn claims(&self) -> Result<Vec<(SliceRef, String)>, ClusterError> {
        let prefix = self.keys.claims();
        let kvs = self.list(&prefix).await?;
        let mut out = Vec::new();
        for kv in &kvs {
            let rest = String::from_utf8_lossy(&kv.key()[prefix.len()..]).into_owned();
            let Some((node, slice)) = rest.rsplit_once('/') else { continue };
            let Ok(slice) = slice.parse() else { continue };
            let volume = String::from_utf8_lossy(kv.value()).into_owned();
            out.push((SliceRef { node: node.to_string(), addr: String::new(), slice }, volume));
        }
        Ok(out)
    }

    /// Every volume's spec.
    pub async fn specs(&self) -> Result<Vec<VolumeRecord>, ClusterError> {
        Ok(self.specs_created().await?.into_iter().map(|(spec, _)| spec).collect())
    }

    /// Every volume's spec, with the revision that created it: a volume deleted and specified
    /// again under its name has another one (a resize keeps it).
    pub async fn specs_created(&self) -> Result<Vec<(VolumeRecord, u64)>, ClusterError> {
        let prefix = self.keys.volumes();
        let kvs = self.list(&prefix).await?;
        kvs.iter()
            .filter(|kv| kv.key().ends_with(b"/spec"))
            .map(|kv| Ok((parse(&prefix, kv.value())?, u64::try_from(kv.create_revision()).unwrap_or(0))))
            .collect()
    }

    /// A stream of every change under the cluster's prefix (a node's agent looks at the
    /// cluster again at each one instead of waiting for its next poll).
    pub async fn watch(&self) -> Result<etcd_client::WatchStream, ClusterError> {
        let options = etcd_client::WatchOptions::new().with_prefix();
        Ok(self.client.clone().watch(self.keys.all(), Some(options)).await?)
    }

    /// Nodes and volumes as `stria cluster status` and a node's `/api/v1/cluster` show them.
    pub async fn status(&self) -> Result<ClusterStatus, ClusterError> {
        let nodes = self.nodes().await?;
        let moves = self.moves().await?;
        let deletes = self.deletes().await?;
        let resizes = self.resizes().await?;
        // Every count in one read (`clients/<vol>/<node>`), not one read per volume.
        let counts_prefix = self.keys.all_clients();
        let mut clients: std::collections::BTreeMap<String, u64> = std::collections::BTreeMap::new();
        for kv in self.list(&counts_prefix).await? {
            let rest = String::from_utf8_lossy(&kv.key()[counts_prefix.len()..]).into_owned();
            if let Some((volume, _node)) = rest.rsplit_once('/') {
                *clients.entry(volume.to_string()).or_default() += client_count(&kv);
            }
        }
        let mut volumes = Vec::new();
        for spec in self.specs().await? {
            let (spec, owner, members) = self.volume(&spec.name).await?;
            let resize = resizes.iter().find(|(v, _, _)| *v == spec.name).map(|(_, r, _)| r);
            let nbd = owner
                .as_ref()
                .and_then(|(o, _)| nodes.iter().find(|n| n.name == o.node))
                .and_then(|n| n.nbd_addr.clone());
            volumes.push(VolumeStatus {
                layout: spec.layout.to_string(),
                size_bytes: spec.size_bytes,
                owner: owner.as_ref().map(|(o, _)| o.node.clone()),
                epoch: owner.as_ref().map(|(_, e)| *e),
                nbd,
                moving_to: moves.iter().find(|(v, _)| *v == spec.name).map(|(_, m)| m.to.clone()),
                deleting: deletes.contains(&spec.name),
                resizing_to: resize.map(|r| r.size_bytes),
                resize_error: resize.and_then(|r| r.error.clone()),
                clients: clients.get(&spec.name).copied().unwrap_or(0),
                in_service: members.in_service.iter().map(ToString::to_string).collect(),
                rebuilding: members.joining.iter().map(ToString::to_string).collect(),
                out: members
                    .out
                    .iter()
                    .map(|o| OutStatus {
                        slice: o.slice.to_string(),
                        epoch: o.epoch,
                        since_unix: o.since_unix,
                        reason: o.reason.clone(),
                    })
                    .collect(),
                name: spec.name,
            });
        }
        let cordons = self
            .cordons()
            .await?
            .into_iter()
            .map(|(node, c)| CordonStatus { node, since_unix: c.since_unix, reason: c.reason })
            .collect();
        Ok(ClusterStatus { etcd: self.etcd_status().await?, nodes, cordons, volumes })
    }

    /// etcd's members and the leader the answering member knows (none: no quorum there).
    async fn etcd_status(&self) -> Result<EtcdStatus, ClusterError> {
        let mut client = self.client.clone();
        let members = client.member_list().await?;
        let status = client.status().await?;
        let name = |id: u64| members.members().iter().find(|m| m.id() == id).map(|m| m.name().to_string());
        Ok(EtcdStatus {
            members: members.members().iter().map(|m| m.name().to_string()).collect(),
            leader: if status.leader() == 0 { None } else { name(status.leader()) },
            raft_term: status.raft_term(),
        })
    }

    /// Asks for `volume` to move to `node` (a planned move, docs/design/cluster.md §6.3). Refused
    /// when a move of it is pending already or the volume does not exist.
    pub async fn request_move(&self, volume: &str, node: &str) -> Result<(), ClusterError> {
        let (spec_key, move_key) = (self.keys.spec(volume), self.keys.moving(volume));
        let txn = Txn::new()
            .when([
                Compare::create_revision(spec_key, CompareOp::Greater, 0),
                Compare::create_revision(move_key.clone(), CompareOp::Equal, 0),
            ])
            .and_then([TxnOp::put(move_key, json(&MoveRecord { to: node.to_string() }), None)]);
        if self.client.clone().txn(txn).await?.succeeded() {
            return Ok(());
        }
        match self.moves().await?.into_iter().find(|(v, _)| v == volume) {
            Some((_, m)) => Err(ClusterError::Unavailable(format!(
                "a move of {volume} to {} is pending already (`stria cluster volume-move {volume} --cancel` ends it)",
                m.to
            ))),
            None => Err(ClusterError::NoSuchVolume(volume.to_string())),
        }
    }

    /// Asks for `volume` to be deleted (docs/design/cluster.md §6.4): the owner closes and
    /// deletes it; nobody owning it, [`Cluster::delete_unowned`] does. Refused while a node
    /// counts clients attached to it, unless `force`.
    pub async fn request_delete(&self, volume: &str, force: bool) -> Result<(), ClusterError> {
        let (spec_key, delete_key) = (self.keys.spec(volume), self.keys.deleting(volume));
        let mut when = vec![
            Compare::create_revision(spec_key, CompareOp::Greater, 0),
            Compare::create_revision(delete_key.clone(), CompareOp::Equal, 0),
        ];
        if !force {
            // Every key of the range compared, and an empty range as a key never written.
            let prefix = self.keys.clients(volume);
            when.push(
                Compare::create_revision(prefix.clone(), CompareOp::Equal, 0).with_range(prefix_end(&prefix)),
            );
        }
        let record = DeleteRecord { force, since_unix: now_unix() };
        let txn = Txn::new().when(when).and_then([TxnOp::put(delete_key, json(&record), None)]);
        if self.client.clone().txn(txn).await?.succeeded() {
            return Ok(());
        }
        self.volume(volume).await?;
        if self.deletes().await?.iter().any(|v| v == volume) {
            return Err(ClusterError::Unavailable(format!(
                "a delete of {volume} is pending already: its owner, or any node while it has none, carries it out"
            )));
        }
        let at = self.attached(volume).await?;
        let at: Vec<String> = at.iter().map(|(node, n)| format!("{n} at {node}")).collect();
        Err(ClusterError::Attached {
            volume: volume.to_string(),
            at: at.join(", "),
            doing: "deleting it would cut them off",
        })
    }

    /// Asks for `volume` to be made `size_bytes` long (docs/design/cluster.md §6.5); its owner
    /// carries it out. Returns the size it had; the same size asks for nothing (and clears a
    /// refused request). A shrink needs
    /// `allow_shrink`, and `force` while a node counts clients attached to the volume.
    pub async fn request_resize(
        &self,
        volume: &str,
        size_bytes: u64,
        allow_shrink: bool,
        force: bool,
    ) -> Result<u64, ClusterError> {
        stria_engine::check_volume_size(size_bytes)?;
        let keys = &self.keys;
        let (spec_key, resize_key) = (keys.spec(volume), keys.resizing(volume));
        let Some((spec, spec_rev)) = self.get_parsed::<VolumeRecord>(&spec_key).await? else {
            return Err(ClusterError::NoSuchVolume(volume.to_string()));
        };
        let pending = self.resize_of(volume).await?;
        if let Some((r, _)) = pending.as_ref().filter(|(r, _)| r.error.is_none()) {
            return Err(ClusterError::Unavailable(format!(
                "a resize of {volume} to {} bytes is pending already: its owner carries it out",
                r.size_bytes
            )));
        }
        if size_bytes == spec.size_bytes {
            // Nothing to do; a refused request (shown by `cluster status`) is cleared.
            if let Some((_, rev)) = pending {
                self.end_resize(volume, rev).await?;
            }
            return Ok(spec.size_bytes);
        }
        let shrink = size_bytes < spec.size_bytes;
        if shrink && !allow_shrink {
            return Err(ClusterError::Shrink {
                volume: volume.to_string(),
                from_bytes: spec.size_bytes,
                to_bytes: size_bytes,
            });
        }
        let mut when = vec![
            Compare::mod_revision(spec_key, CompareOp::Equal, spec_rev),
            Compare::create_revision(keys.deleting(volume), CompareOp::Equal, 0),
            // Absent, or the refused request read above (replaced).
            Compare::mod_revision(
                resize_key.clone(),
                CompareOp::Equal,
                pending.as_ref().map_or(0, |(_, rev)| *rev),
            ),
        ];
        if shrink && !force {
            let prefix = keys.clients(volume);
            when.push(
                Compare::create_revision(prefix.clone(), CompareOp::Equal, 0).with_range(prefix_end(&prefix)),
            );
        }
        let record = ResizeRecord { size_bytes, since_unix: now_unix(), error: None };
        let txn = Txn::new().when(when).and_then([TxnOp::put(resize_key, json(&record), None)]);
        if self.client.clone().txn(txn).await?.succeeded() {
            return Ok(spec.size_bytes);
        }
        if self.deletes().await?.iter().any(|v| v == volume) {
            return Err(ClusterError::Unavailable(format!("a delete of {volume} is pending")));
        }
        let at = self.attached(volume).await?;
        if shrink && !force && !at.is_empty() {
            let at: Vec<String> = at.iter().map(|(node, n)| format!("{n} at {node}")).collect();
            return Err(ClusterError::Attached {
                volume: volume.to_string(),
                at: at.join(", "),
                doing: "shrinking it would give them errors past the new end",
            });
        }
        Err(ClusterError::Unavailable(format!(
            "volume {volume} changed while its resize was asked for (another resize or a delete); try again"
        )))
    }

    /// The resize request of `volume`, if any, with its `mod_revision`.
    pub async fn resize_of(&self, volume: &str) -> Result<Option<(ResizeRecord, i64)>, ClusterError> {
        self.get_parsed(&self.keys.resizing(volume)).await
    }

    /// The record at `key`, if any, with its `mod_revision`.
    async fn get_parsed<T: DeserializeOwned>(&self, key: &str) -> Result<Option<(T, i64)>, ClusterError> {
        let got = self.client.clone().get(key, None).await?;
        match got.kvs().first() {
            Some(kv) => Ok(Some((parse(key, kv.value())?, kv.mod_revision()))),
            None => Ok(None),
        }
    }

    /// Every pending or refused resize: the volume, the request and its `mod_revision`.
    pub async fn resizes(&self) -> Result<Vec<(String, ResizeRecord, i64)>, ClusterError> {
        let mut out = Vec::new();
        for (volume, kv) in self.volume_keys_named("resize").await? {
            out.push((volume, parse(&String::from_utf8_lossy(kv.key()), kv.value())?, kv.mod_revision()));
        }
        Ok(out)
    }

    /// Removes a refused resize request (read at `revision`) of `volume`.
    pub async fn end_resize(&self, volume: &str, revision: i64) -> Result<(), ClusterError> {
        let key = self.keys.resizing(volume);
        let txn = Txn::new()
            .when([Compare::mod_revision(key.clone(), CompareOp::Equal, revision)])
            .and_then([TxnOp::delete(key, None)]);
        self.client.clone().txn(txn).await?;
        Ok(())
    }

    /// The volumes whose delete is pending.
    pub async fn deletes(&self) -> Result<Vec<String>, ClusterError> {
        Ok(self.volume_keys_named("delete").await?.into_iter().map(|(volume, _)| volume).collect())
    }

    /// The nodes that count NBD clients attached to `volume`, and how many each.
    pub async fn attached(&self, volume: &str) -> Result<Vec<(String, u64)>, ClusterError> {
        let prefix = self.keys.clients(volume);
        let kvs = self.list(&prefix).await?;
        Ok(kvs
            .iter()
            .map(|kv| {
                let node = String::from_utf8_lossy(&kv.key()[prefix.len()..]).into_owned();
                (node, client_count(kv))
            })
            .collect())
    }

    /// Deletes `volume` if its delete is pending and nobody owns it: every key of it and the
    /// claims of its slices, in one transaction. Returns the slices freed; `None` when it was not
    /// done (owned, not marked, or a claim changed meanwhile).
    pub async fn delete_unowned(&self, volume: &str) -> Result<Option<Vec<SliceRef>>, ClusterError> {
        let guard = Compare::create_revision(self.keys.owner(volume), CompareOp::Equal, 0);
        self.delete_guarded(volume, guard).await
    }

    /// The transaction of a delete: `guard` (who may), the request still there, each claim still
    /// the volume's; deletes the volume's keys, its owner key and those claims.
    async fn delete_guarded(
        &self,
        volume: &str,
        guard: Compare,
    ) -> Result<Option<Vec<SliceRef>>, ClusterError> {
        let keys = &self.keys;
        let mut when = vec![guard, Compare::create_revision(keys.deleting(volume), CompareOp::Greater, 0)];
        let mut ops = vec![
            TxnOp::delete(keys.volume_keys(volume), Some(etcd_client::DeleteOptions::new().with_prefix())),
            TxnOp::delete(keys.owner(volume), None),
            TxnOp::delete(keys.clients(volume), Some(etcd_client::DeleteOptions::new().with_prefix())),
        ];
        let mut freed = Vec::new();
        for (slice, by) in self.claims().await? {
            if by == volume {
                let key = keys.claim(&slice);
                when.push(Compare::value(key.clone(), CompareOp::Equal, volume.as_bytes().to_vec()));
                ops.push(TxnOp::delete(key, None));
                freed.push(slice);
            }
        }
        let done = self.client.clone().txn(Txn::new().when(when).and_then(ops)).await?.succeeded();
        Ok(done.then_some(freed))
    }

    /// Every pending move: the volume and where it goes.
    pub async fn moves(&self) -> Result<Vec<(String, MoveRecord)>, ClusterError> {
        let mut out = Vec::new();
        for (volume, kv) in self.volume_keys_named("move").await? {
            out.push((volume, parse(&String::from_utf8_lossy(kv.key()), kv.value())?));
        }
        Ok(out)
    }

    /// Every `volumes/<vol>/<name>` key, with its volume.
    async fn volume_keys_named(
        &self,
        name: &str,
    ) -> Result<Vec<(String, etcd_client::KeyValue)>, ClusterError> {
        let prefix = self.keys.volumes();
        let suffix = format!("/{name}");
        let kvs = self.list(&prefix).await?;
        Ok(kvs
            .into_iter()
            .filter_map(|kv| {
                let key = String::from_utf8_lossy(kv.key()).into_owned();
                let volume = key.strip_prefix(&prefix)?.strip_suffix(&suffix)?.to_string();
                Some((volume, kv))
            })
            .collect())
    }

    /// Ends a pending move of `volume` (done, or given up).
    pub async fn end_move(&self, volume: &str) -> Result<(), ClusterError> {
        self.client.clone().delete(self.keys.moving(volume), None).await?;
        Ok(())
    }

    /// Ends the move of `volume` to `node` if that is the one pending (not one asked for since).
    pub async fn end_move_to(&self, volume: &str, node: &str) -> Result<(), ClusterError> {
        let key = self.keys.moving(volume);
        let txn = Txn::new()
            .when([Compare::value(key.clone(), CompareOp::Equal, json(&MoveRecord { to: node.to_string() }))])
            .and_then([TxnOp::delete(key, None)]);
        self.client.clone().txn(txn).await?;
        Ok(())
    }

    /// Cordons `node` (docs/design/cluster.md §6.6) and ends the moves pending to it. A node
    /// cordoned already keeps its first record. True when it was not cordoned before.
    pub async fn cordon(&self, node: &str, reason: &str) -> Result<bool, ClusterError> {
        let key = self.keys.cordon(node);
        let record = CordonRecord { since_unix: now_unix(), reason: reason.to_string() };
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key, json(&record), None)]);
        let new = self.client.clone().txn(txn).await?.succeeded();
        for (volume, m) in self.moves().await? {
            if m.to == node {
                self.end_move_to(&volume, node).await?;
            }
        }
        Ok(new)
    }

    /// Ends `node`'s cordon. False when it had none.
    pub async fn uncordon(&self, node: &str) -> Result<bool, ClusterError> {
        Ok(self.client.clone().delete(self.keys.cordon(node), None).await?.deleted() > 0)
    }

    /// The slices a new volume may be placed on: on live nodes that are not cordoned, `need`
    /// bytes or more, claimed by no volume (a create's transaction claims them, and fails if
    /// another create took one meanwhile). Also the cordoned nodes left out.
    pub async fn free_slices(&self, need: u64) -> Result<(Vec<SliceRef>, Vec<String>), ClusterError> {
        let used: Vec<SliceRef> = self.claims().await?.into_iter().map(|(s, _)| s).collect();
        let cordoned = self.cordoned_nodes().await?;
        let mut free = Vec::new();
        for node in self.nodes().await? {
            if cordoned.contains(&node.name) {
                continue;
            }
            for s in &node.slices {
                let r = SliceRef { node: node.name.clone(), addr: node.slice_addr.clone(), slice: s.id };
                if s.bytes >= need && !used.iter().any(|u| u.same(&r)) {
                    free.push(r);
                }
            }
        }
        Ok((free, cordoned))
    }

    /// The names of the cordoned nodes.
    pub async fn cordoned_nodes(&self) -> Result<Vec<String>, ClusterError> {
        Ok(self.cordons().await?.into_iter().map(|(n, _)| n).collect())
    }

    /// Every cordoned node, with its record.
    pub async fn cordons(&self) -> Result<Vec<(String, CordonRecord)>, ClusterError> {
        let prefix = self.keys.cordons();
        let mut out = Vec::new();
        for kv in self.list(&prefix).await? {
            let node = String::from_utf8_lossy(&kv.key()[prefix.len()..]).into_owned();
            out.push((node, parse(&prefix, kv.value())?));
        }
        Ok(out)
    }

    /// Asks for a planned move of `volume` to `node` and waits, at most `wait`, until `node`
    /// serves it (docs/design/cluster.md §6.3). Refused for a node that is not alive or is
    /// cordoned.
    pub async fn move_volume(&self, volume: &str, node: &str, wait: Duration) -> Result<Moved, ClusterError> {
        let (_, owner, _) = self.volume(volume).await?;
        let nodes = self.nodes().await?;
        if !nodes.iter().any(|n| n.name == node) {
            let alive: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
            return Err(ClusterError::Unavailable(format!(
                "node {node} is not alive in the cluster (alive: {})",
                alive.join(", ")
            )));
        }
        if owner.as_ref().is_some_and(|(o, _)| o.node == node) {
            return Ok(Moved::Already);
        }
        if self.cordons().await?.iter().any(|(c, _)| c == node) {
            return Err(ClusterError::Unavailable(format!(
                "node {node} is cordoned: it receives no volume (`stria cluster node-uncordon {node}` ends that)"
            )));
        }
        let started = Instant::now();
        self.request_move(volume, node).await?;
        loop {
            let (_, owner, _) = self.volume(volume).await?;
            let pending = self.moves().await?.into_iter().any(|(v, _)| v == volume);
            match owner {
                Some((o, epoch)) if o.node == node => {
                    return Ok(Moved::Done { epoch, took: started.elapsed() });
                }
                Some((o, _)) if !pending => {
                    return Err(ClusterError::Unavailable(format!(
                        "the move was given up: {} serves volume {volume} (see the nodes' logs)",
                        o.node
                    )));
                }
                _ => {}
            }
            if started.elapsed() >= wait {
                return Err(ClusterError::Unavailable(format!(
                    "volume {volume} is not on {node} after {} s; the move stays pending \
                     (`stria cluster volume-move {volume} --cancel` ends it)",
                    wait.as_secs()
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Takes `node` out of service (docs/design/cluster.md §6.6): cordons it, then moves each
    /// volume it owns, one at a time, to the live node that is not cordoned and owns the fewest,
    /// calling `each(volume, to, took)` after each move. Gives up, the node still cordoned,
    /// when a move fails or `wait` has passed.
    pub async fn drain(
        &self,
        node: &str,
        reason: &str,
        wait: Duration,
        mut each: impl FnMut(&str, &str, Duration),
    ) -> Result<usize, ClusterError> {
        let deadline = Instant::now() + wait;
        self.cordon(node, reason).await?;
        let mut moved = 0;
        loop {
            let owners = self.owners().await?;
            let owned_by = |n: &str| owners.iter().filter(|(_, o, _)| o.node == n).count();
            let theirs: Vec<&str> =
                owners.iter().filter(|(_, o, _)| o.node == node).map(|(v, _, _)| v.as_str()).collect();
            let Some(&volume) = theirs.first() else { return Ok(moved) };
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ClusterError::Unavailable(format!(
                    "node {node} still owns {} after {} s; it stays cordoned, and running the drain again goes on",
                    theirs.join(", "),
                    wait.as_secs()
                )));
            }
            let cordons = self.cordons().await?;
            let nodes = self.nodes().await?;
            let open = |n: &str| {
                n != node && nodes.iter().any(|l| l.name == n) && !cordons.iter().any(|(c, _)| c == n)
            };
            // A move of it asked for before: one to a node that can take it is let finish; one
            // that leads nowhere (a node not alive, or cordoned) is ended, and the drain moves it.
            if let Some((_, m)) = self.moves().await?.into_iter().find(|(v, _)| v == volume) {
                if open(&m.to) {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
                self.end_move_to(volume, &m.to).await?;
            }
            let Some(to) =
                nodes.iter().filter(|n| open(&n.name)).min_by_key(|n| (owned_by(&n.name), n.name.clone()))
            else {
                return Err(ClusterError::Unavailable(format!(
                    "node {node} is cordoned, but no live node that is not cordoned is left to take its {} \
                     volume(s) ({}); they stay on {node}",
                    theirs.len(),
                    theirs.join(", ")
                )));
            };
            match self.move_volume(volume, &to.name, left).await {
                Ok(Moved::Done { took, .. }) => {
                    moved += 1;
                    each(volume, &to.name, took);
                }
                Ok(Moved::Already) => {}
                Err(e) => {
                    // Another node may have taken it meanwhile (the owner stopped): gone all the same.
                    let now = self.volume(volume).await.ok().and_then(|(_, o, _)| o).map(|(o, _)| o.node);
                    if now.as_deref() == Some(node) {
                        return Err(ClusterError::Unavailable(format!(
                            "node {node} stays cordoned and still owns {volume}: {e}"
                        )));
                    }
                }
            }
        }
    }

    /// Who owns each owned volume, with its epoch.
    pub async fn owners(&self) -> Result<Vec<(String, OwnerRecord, u64)>, ClusterError> {
        let prefix = self.keys.owners();
        let kvs = self.list(&prefix).await?;
        let mut out = Vec::new();
        for kv in &kvs {
            let volume = String::from_utf8_lossy(&kv.key()[prefix.len()..]).into_owned();
            out.push((volume, parse(&prefix, kv.value())?, u64::try_from(kv.mod_revision()).unwrap_or(0)));
        }
        Ok(out)
    }

    /// A volume's spec, owner (node and epoch) and members.
    pub async fn volume(
        &self,
        volume: &str,
    ) -> Result<(VolumeRecord, Option<(OwnerRecord, u64)>, MembersRecord), ClusterError> {
        let keys = &self.keys;
        let Some((spec, _)) = self.get_parsed::<VolumeRecord>(&keys.spec(volume)).await? else {
            return Err(ClusterError::NoSuchVolume(volume.to_string()));
        };
        let owner = self
            .get_parsed::<OwnerRecord>(&keys.owner(volume))
            .await?
            .map(|(owner, revision)| (owner, u64::try_from(revision).unwrap_or(0)));
        let members = self
            .get_parsed::<MembersRecord>(&keys.members(volume))
            .await?
            .map(|(m, _)| m)
            .unwrap_or_default();
        Ok((spec, owner, members))
    }
}

/// How [`Cluster::move_volume`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Moved {
    /// The node served the volume already.
    Already,
    /// The node took it at `epoch`, `took` after the request.
    Done { epoch: u64, took: Duration },
}

/// The cluster as an operator reads it (`stria cluster status --json`).
#[derive(Clone, Debug, serde::Serialize)]
pub struct ClusterStatus {
    pub etcd: EtcdStatus,
    pub nodes: Vec<NodeRecord>,
    /// Nodes out of service (docs/design/cluster.md §6.6), alive or not.
    pub cordons: Vec<CordonStatus>,
    pub volumes: Vec<VolumeStatus>,
}

/// A cordoned node.
#[derive(Clone, Debug, serde::Serialize)]
pub struct CordonStatus {
    pub node: String,
    pub since_unix: u64,
    pub reason: String,
}

/// etcd's members, and its leader as the member that answered knows it (a member cut off from
/// the majority knows none: no quorum).
#[derive(Clone, Debug, serde::Serialize)]
pub struct EtcdStatus {
    pub members: Vec<String>,
    pub leader: Option<String>,
    pub raft_term: u64,
}

/// One volume: where it is served and which of its members are in service.
#[derive(Clone, Debug, serde::Serialize)]
pub struct VolumeStatus {
    pub name: String,
    pub layout: String,
    pub size_bytes: u64,
    pub owner: Option<String>,
    pub epoch: Option<u64>,
    /// The owner's NBD address.
    pub nbd: Option<String>,
    /// A pending planned move's target.
    pub moving_to: Option<String>,
    /// A delete is pending (docs/design/cluster.md §6.4).
    pub deleting: bool,
    /// A resize to this many bytes is pending, or was refused (docs/design/cluster.md §6.5).
    pub resizing_to: Option<u64>,
    /// Why the owner refused the resize.
    pub resize_error: Option<String>,
    /// NBD clients attached, at every node (as the nodes last counted them).
    pub clients: u64,
    pub in_service: Vec<String>,
    pub rebuilding: Vec<String>,
    pub out: Vec<OutStatus>,
}

/// A member out of service.
#[derive(Clone, Debug, serde::Serialize)]
pub struct OutStatus {
    pub slice: String,
    pub epoch: u64,
    pub since_unix: u64,
    pub reason: String,
}

impl std::ops::Deref for Session {
    type Target = Cluster;
    fn deref(&self) -> &Cluster {
        &self.cluster
    }
}

/// Settings of a node's etcd session.
#[derive(Clone, Debug)]
pub struct SessionConfig {
    pub endpoints: Vec<String>,
    /// The node's name (unique in the cluster).
    pub node: String,
    /// Lease time to live. A dead node's volumes can be taken this long after its last renewal.
    pub ttl: Duration,
    /// Subtracted from the lease deadline to cover clock-rate drift between this node and
    /// etcd's leader (docs/design/cluster.md §4.4).
    pub margin: Duration,
    pub keys: Keys,
}

impl SessionConfig {
    pub fn new(endpoints: Vec<String>, node: &str) -> SessionConfig {
        SessionConfig {
            endpoints,
            node: node.to_string(),
            ttl: Duration::from_secs(5),
            margin: Duration::from_millis(500),
            keys: Keys::default(),
        }
    }
}

/// A node's session: an etcd client and the node's one lease, renewed every third of its TTL.
pub struct Session {
    cluster: Cluster,
    config: SessionConfig,
    lease: i64,
    /// Until when this node may act on its ownerships: the send time of the last renewal etcd
    /// acknowledged, plus the TTL, minus the margin (monotonic clock).
    valid_until: Arc<Mutex<Instant>>,
    keepalive: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session").field("node", &self.config.node).field("lease", &self.lease).finish()
    }
}

/// 3 s to connect, 5 s per request, and HTTP/2 pings every second (answered within a second,
/// idle or not): a connection to an etcd member that a partition cut off drops packets rather than
/// closing, and without the pings the balanced channel would keep sending a node's keep-alives
/// into it until its lease lapsed (the partition long run: docs/design/cluster.md §13).
fn connect_options() -> ConnectOptions {
    ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(3))
        .with_timeout(Duration::from_secs(5))
        .with_keep_alive(Duration::from_secs(1), Duration::from_secs(1))
        .with_keep_alive_while_idle(true)
}

fn json<T: Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("records serialize")
}

fn parse<T: DeserializeOwned>(key: &str, bytes: &[u8]) -> Result<T, ClusterError> {
    serde_json::from_slice(bytes)
        .map_err(|e| ClusterError::Record { key: key.to_string(), why: e.to_string() })
}

impl Session {
    /// Connects, grants the node's lease and registers the node under it.
    pub async fn start(config: SessionConfig, record: &NodeRecord) -> Result<Session, ClusterError> {
        let mut client = Client::connect(&config.endpoints, Some(connect_options())).await?;
        let ttl_secs = i64::try_from(config.ttl.as_secs().max(1)).unwrap_or(i64::MAX);
        let granted_at = Instant::now();
        let lease = client.lease_grant(ttl_secs, None).await?.id();
        client
            .put(config.keys.node(&config.node), json(record), Some(PutOptions::new().with_lease(lease)))
            .await?;
        let valid_until = Arc::new(Mutex::new(granted_at + config.ttl.saturating_sub(config.margin)));
        let cluster = Cluster { client, keys: config.keys.clone() };
        let session = Session { cluster, config, lease, valid_until, keepalive: Mutex::new(None) };
        let task = tokio::spawn(keep_alive(
            session.cluster.client.clone(),
            lease,
            session.config.ttl,
            session.config.margin,
            Arc::clone(&session.valid_until),
        ));
        *session.keepalive.lock() = Some(task);
        Ok(session)
    }

    pub fn node(&self) -> &str {
        &self.config.node
    }

    pub fn keys(&self) -> &Keys {
        &self.cluster.keys
    }

    /// The cluster as this session sees it (also reachable through `Deref`).
    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    pub fn lease(&self) -> i64 {
        self.lease
    }

    /// True while the lease deadline holds on this node's clock: the node may serve its volumes.
    pub fn lease_valid(&self) -> bool {
        Instant::now() < *self.valid_until.lock()
    }

    /// Until when the lease is known to hold.
    pub fn valid_until(&self) -> Instant {
        *self.valid_until.lock()
    }

    /// Stops renewing the lease (a clean stop revokes it instead). Tests use it to make a
    /// node look dead to etcd while its process goes on, as a paused or cut-off node would.
    pub fn stop_renewing(&self) {
        if let Some(task) = self.keepalive.lock().take() {
            task.abort();
        }
    }

    /// Revokes the lease: the node's key and every ownership bound to it go at once.
    pub async fn revoke(&self) -> Result<(), ClusterError> {
        self.stop_renewing();
        self.cluster.client.clone().lease_revoke(self.lease).await?;
        Ok(())
    }

    /// Creates a volume's spec and takes its ownership in one transaction; returns the epoch.
    pub async fn create_volume(&self, spec: &VolumeRecord) -> Result<u64, ClusterError> {
        spec.check()?;
        let keys = &self.cluster.keys;
        let (spec_key, owner_key) = (keys.spec(&spec.name), keys.owner(&spec.name));
        let mut when = vec![
            Compare::create_revision(spec_key.clone(), CompareOp::Equal, 0),
            Compare::create_revision(owner_key.clone(), CompareOp::Equal, 0),
        ];
        let mut ops = vec![
            TxnOp::put(spec_key, json(spec), None),
            TxnOp::put(
                owner_key,
                json(&OwnerRecord { node: self.config.node.clone() }),
                Some(self.lease_put()),
            ),
        ];
        self.cluster.claim_ops(spec, &mut when, &mut ops);
        let resp = self.cluster.client.clone().txn(Txn::new().when(when).and_then(ops)).await?;
        if !resp.succeeded() {
            return Err(self.cluster.why_not_created(spec).await);
        }
        Ok(revision(&resp))
    }

    /// True while the keep-alive task runs (false once the lease expired or renewing stopped).
    pub fn renewing(&self) -> bool {
        self.keepalive.lock().as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Undoes a create that failed after [`Session::create_volume`]: deletes the volume's keys
    /// if this node still owns it at `epoch`.
    pub async fn abandon_create(&self, volume: &str, epoch: u64) -> Result<(), ClusterError> {
        let keys = &self.cluster.keys;
        let mut ops = vec![
            TxnOp::delete(keys.spec(volume), None),
            TxnOp::delete(keys.members(volume), None),
            TxnOp::delete(keys.owner(volume), None),
        ];
        for (slice, by) in self.cluster.claims().await? {
            if by == volume {
                ops.push(TxnOp::delete(keys.claim(&slice), None));
            }
        }
        let txn = Txn::new()
            .when([Compare::mod_revision(keys.owner(volume), CompareOp::Equal, epoch_rev(epoch))])
            .and_then(ops);
        self.cluster.client.clone().txn(txn).await?;
        Ok(())
    }

    /// Takes ownership of `volume` if no live node holds it: one transaction, bound to this
    /// node's lease. Returns the epoch (the revision of the put), higher than any before.
    pub async fn take_ownership(&self, volume: &str) -> Result<u64, ClusterError> {
        let keys = &self.cluster.keys;
        let (spec_key, owner_key) = (keys.spec(volume), keys.owner(volume));
        let txn = Txn::new()
            .when([
                Compare::create_revision(spec_key, CompareOp::Greater, 0),
                Compare::create_revision(owner_key.clone(), CompareOp::Equal, 0),
            ])
            .and_then([TxnOp::put(
                owner_key.clone(),
                json(&OwnerRecord { node: self.config.node.clone() }),
                Some(self.lease_put()),
            )])
            .or_else([TxnOp::get(owner_key.clone(), None)]);
        let resp = self.cluster.client.clone().txn(txn).await?;
        if resp.succeeded() {
            return Ok(revision(&resp));
        }
        for op in resp.op_responses() {
            if let TxnOpResponse::Get(get) = op
                && let Some(kv) = get.kvs().first()
            {
                let owner: OwnerRecord = parse(&owner_key, kv.value())?;
                return Err(ClusterError::Owned { volume: volume.to_string(), node: owner.node });
            }
        }
        Err(ClusterError::NoSuchVolume(volume.to_string()))
    }

    /// Gives up ownership taken at `epoch` (no-op if a newer owner holds it).
    pub async fn release(&self, volume: &str, epoch: u64) -> Result<(), ClusterError> {
        let owner_key = self.cluster.keys.owner(volume);
        let txn = Txn::new()
            .when([Compare::mod_revision(owner_key.clone(), CompareOp::Equal, epoch_rev(epoch))])
            .and_then([TxnOp::delete(owner_key, None)]);
        self.cluster.client.clone().txn(txn).await?;
        Ok(())
    }

    /// Deletes `volume`, owned by this node at `epoch` and closed, if its delete is pending
    /// (docs/design/cluster.md §6.4). Returns the slices freed; `None`: not done.
    pub async fn delete_owned(
        &self,
        volume: &str,
        epoch: u64,
    ) -> Result<Option<Vec<SliceRef>>, ClusterError> {
        let guard =
            Compare::mod_revision(self.cluster.keys.owner(volume), CompareOp::Equal, epoch_rev(epoch));
        self.cluster.delete_guarded(volume, guard).await
    }

    /// Ends the resize of `volume` (request read at `revision`) that this node, owner at `epoch`,
    /// carried out: the spec says `size_bytes` from now on, and the request is gone. `false`: not
    /// done (ownership lost, or the request or the spec changed).
    pub async fn finish_resize(
        &self,
        volume: &str,
        epoch: u64,
        revision: i64,
        size_bytes: u64,
    ) -> Result<bool, ClusterError> {
        let keys = &self.cluster.keys;
        let spec_key = keys.spec(volume);
        let Some((mut spec, spec_rev)) = self.cluster.get_parsed::<VolumeRecord>(&spec_key).await? else {
            return Ok(false);
        };
        spec.size_bytes = size_bytes;
        let resize_key = keys.resizing(volume);
        let txn = Txn::new()
            .when([
                Compare::mod_revision(keys.owner(volume), CompareOp::Equal, epoch_rev(epoch)),
                Compare::mod_revision(resize_key.clone(), CompareOp::Equal, revision),
                Compare::mod_revision(spec_key.clone(), CompareOp::Equal, spec_rev),
            ])
            .and_then([TxnOp::put(spec_key, json(&spec), None), TxnOp::delete(resize_key, None)]);
        Ok(self.cluster.client.clone().txn(txn).await?.succeeded())
    }

    /// Records why this node, owner of `volume` at `epoch`, cannot carry out its resize request
    /// (read at `revision`).
    pub async fn refuse_resize(
        &self,
        volume: &str,
        epoch: u64,
        revision: i64,
        mut request: ResizeRecord,
        error: String,
    ) -> Result<bool, ClusterError> {
        let keys = &self.cluster.keys;
        let resize_key = keys.resizing(volume);
        request.error = Some(error);
        let txn = Txn::new()
            .when([
                Compare::mod_revision(keys.owner(volume), CompareOp::Equal, epoch_rev(epoch)),
                Compare::mod_revision(resize_key.clone(), CompareOp::Equal, revision),
            ])
            .and_then([TxnOp::put(resize_key, json(&request), None)]);
        Ok(self.cluster.client.clone().txn(txn).await?.succeeded())
    }

    /// Says how many NBD clients this node has attached to `volume` (bound to the node's lease;
    /// 0 deletes the key).
    pub async fn publish_clients(&self, volume: &str, count: usize) -> Result<(), ClusterError> {
        let key = self.cluster.keys.client_count(volume, &self.config.node);
        let mut client = self.cluster.client.clone();
        if count == 0 {
            client.delete(key, None).await?;
        } else {
            client.put(key, count.to_string(), Some(self.lease_put())).await?;
        }
        Ok(())
    }

    /// Writes the volume's members if this node still owns it at `epoch` (a fenced write:
    /// an owner superseded, however long it was paused, cannot change them).
    pub async fn put_members(
        &self,
        volume: &str,
        epoch: u64,
        members: &MembersRecord,
    ) -> Result<(), ClusterError> {
        let keys = &self.cluster.keys;
        let owner_key = keys.owner(volume);
        let txn = Txn::new()
            .when([Compare::mod_revision(owner_key, CompareOp::Equal, epoch_rev(epoch))])
            .and_then([TxnOp::put(keys.members(volume), json(members), None)]);
        let resp = self.cluster.client.clone().txn(txn).await?;
        if !resp.succeeded() {
            return Err(ClusterError::NotOwner { volume: volume.to_string(), epoch });
        }
        Ok(())
    }

    /// The guard of a coordinated volume's pool ([`MembersGuard`]).
    pub fn members_guard(&self, volume: &str, epoch: u64, members: MembersRecord) -> MembersGuard {
        MembersGuard {
            client: self.cluster.client.clone(),
            keys: self.cluster.keys.clone(),
            volume: volume.to_string(),
            epoch,
            last: tokio::sync::Mutex::new(members),
        }
    }

    fn lease_put(&self) -> PutOptions {
        PutOptions::new().with_lease(self.lease)
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.stop_renewing();
    }
}

fn revision(resp: &etcd_client::TxnResponse) -> u64 {
    resp.header().map(|h| u64::try_from(h.revision()).unwrap_or(0)).unwrap_or(0)
}

/// The value of a `clients/<vol>/<node>` key: a count, as text.
fn client_count(kv: &etcd_client::KeyValue) -> u64 {
    String::from_utf8_lossy(kv.value()).parse().unwrap_or(0)
}

/// The end of the key range of every key starting with `prefix` (its last byte one higher).
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

fn epoch_rev(epoch: u64) -> i64 {
    i64::try_from(epoch).unwrap_or(i64::MAX)
}

/// Renews the lease every third of its TTL. The deadline moves only on an acknowledged
/// renewal, and then to the time the renewal was *sent* plus the TTL, minus the margin: etcd
/// cannot let the lease expire before that on its own clock (assuming bounded clock-rate drift).
async fn keep_alive(
    client: Client,
    lease: i64,
    ttl: Duration,
    margin: Duration,
    valid_until: Arc<Mutex<Instant>>,
) {
    let period = ttl / 3;
    let mut stream = None;
    loop {
        let sent = Instant::now();
        let renewed = renew(&client, lease, &mut stream);
        match tokio::time::timeout(period, renewed).await {
            Ok(Ok(ttl_left)) if ttl_left > 0 => {
                let until = sent + ttl.saturating_sub(margin);
                let mut v = valid_until.lock();
                if until > *v {
                    *v = until;
                }
            }
            Ok(Ok(_)) => {
                tracing::error!(lease, "the node's lease expired; its volumes may be taken by other nodes");
                return;
            }
            // Opening a keep-alive stream for an expired lease answers "lease not found"
            // (etcd-client reads the first reply's TTL of 0 that way): the lease is gone.
            Ok(Err(etcd_client::Error::LeaseKeepAliveError(why))) if why.contains("not found") => {
                tracing::error!(lease, "the node's lease expired; its volumes may be taken by other nodes");
                return;
            }
            Ok(Err(e)) => {
                stream = None;
                tracing::warn!(lease, error = %e, "lease renewal failed; retrying");
            }
            Err(_) => {
                stream = None;
                tracing::warn!(lease, "lease renewal timed out; retrying");
            }
        }
        tokio::time::sleep_until((sent + period).into()).await;
    }
}

type KeepAlive = (etcd_client::LeaseKeeper, etcd_client::LeaseKeepAliveStream);

/// One renewal on the lease's keep-alive stream (opened again after an error); the TTL left.
async fn renew(
    client: &Client,
    lease: i64,
    stream: &mut Option<KeepAlive>,
) -> Result<i64, etcd_client::Error> {
    if stream.is_none() {
        *stream = Some(client.clone().lease_keep_alive(lease).await?);
    }
    let (keeper, responses) = stream.as_mut().expect("opened above");
    keeper.keep_alive().await?;
    match responses.message().await? {
        Some(r) => Ok(r.ttl()),
        None => Err(etcd_client::Error::InvalidArgs("the keep-alive stream ended".into())),
    }
}

/// The commit guard of a coordinated volume's pool, and the one writer of its members: before
/// the engine commits a metadata change, checks in one transaction that this node still owns the
/// volume at its epoch, and writes the members as the new document says (a drive the document
/// fails goes `out`; a joining slice the document holds goes in service; an out slice whose drive
/// the document no longer lists is released, its claim deleted). So a member leaves service in
/// etcd before any drive records it, and an owner that was superseded — however long it was
/// paused — commits nothing (docs/design/cluster.md §4.1, §7).
pub struct MembersGuard {
    client: Client,
    keys: Keys,
    volume: String,
    epoch: u64,
    /// The members last written, locked across each write so writes apply in order. A slice is
    /// matched to its drive by the drive's path hint (`node/slice-N`, set when the pool was
    /// created or opened, or the drive added).
    last: tokio::sync::Mutex<MembersRecord>,
}

impl std::fmt::Debug for MembersGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MembersGuard").field("volume", &self.volume).field("epoch", &self.epoch).finish()
    }
}

/// The members `next` implies after `last`, and the slices it lets go.
fn members_for(
    last: &MembersRecord,
    epoch: u64,
    next: &stria_engine::PoolMeta,
) -> (MembersRecord, Vec<SliceRef>) {
    // Every slice the volume knows of, once each; a joining one first (its address is the newest).
    let mut known: Vec<&SliceRef> = Vec::new();
    for s in last.joining.iter().chain(&last.in_service).chain(last.out.iter().map(|o| &o.slice)) {
        if !known.iter().any(|k| k.same(s)) {
            known.push(s);
        }
    }
    let mut members =
        MembersRecord { epoch, in_service: Vec::new(), out: Vec::new(), joining: last.joining.clone() };
    let mut released = Vec::new();
    for slice in known {
        let name = slice.to_string();
        match next.drives.iter().find(|d| d.path_hint == name) {
            Some(d) if d.state == stria_engine::DriveState::Failed => {
                let out =
                    last.out.iter().find(|o| o.slice.same(slice)).cloned().unwrap_or_else(|| OutSlice {
                        slice: slice.clone(),
                        epoch,
                        since_unix: now_unix(),
                        reason: d.failed_reason.clone().unwrap_or_else(|| "failed".into()),
                    });
                members.out.push(out);
            }
            Some(_) => members.in_service.push(slice.clone()),
            // Not in the pool: still in service as it was (the pool never dropped it), claimed
            // but not added yet (joining), or an out slice whose drive was replaced: let go.
            None if last.in_service.iter().any(|s| s.same(slice)) => members.in_service.push(slice.clone()),
            None if last.joining.iter().any(|s| s.same(slice)) => {}
            None => released.push(slice.clone()),
        }
    }
    (members, released)
}

impl MembersGuard {
    /// The members as last written.
    pub async fn members(&self) -> MembersRecord {
        self.last.lock().await.clone()
    }

    /// One fenced write of the members: `change` applied to the last ones, with `when` and
    /// `ops` in the same transaction (claims). Refused as [`ClusterError::NotOwner`] when the
    /// volume is no longer this owner's, and as [`ClusterError::Claimed`] when a `when` failed.
    pub async fn update(
        &self,
        change: impl FnOnce(&mut MembersRecord),
        when: Vec<Compare>,
        ops: Vec<TxnOp>,
    ) -> Result<MembersRecord, ClusterError> {
        let mut last = self.last.lock().await;
        let mut members = last.clone();
        change(&mut members);
        members.epoch = self.epoch;
        let owner =
            Compare::mod_revision(self.keys.owner(&self.volume), CompareOp::Equal, epoch_rev(self.epoch));
        let mut all = vec![owner];
        all.extend(when);
        let mut puts = vec![TxnOp::put(self.keys.members(&self.volume), json(&members), None)];
        puts.extend(ops);
        let resp = self.client.clone().txn(Txn::new().when(all).and_then(puts)).await?;
        if !resp.succeeded() {
            return Err(self.why_refused().await);
        }
        *last = members.clone();
        Ok(members)
    }

    async fn why_refused(&self) -> ClusterError {
        let owner = self.keys.owner(&self.volume);
        let ours = match self.client.clone().get(owner, None).await {
            Ok(r) => {
                r.kvs().first().is_some_and(|kv| u64::try_from(kv.mod_revision()).ok() == Some(self.epoch))
            }
            Err(e) => return ClusterError::Etcd(e),
        };
        if ours {
            ClusterError::Claimed { slice: "the slice asked for".into(), by: "another volume".into() }
        } else {
            ClusterError::NotOwner { volume: self.volume.clone(), epoch: self.epoch }
        }
    }

    /// Claims `slice` (free, or this volume's already) as joining.
    pub async fn claim(&self, slice: &SliceRef) -> Result<(), ClusterError> {
        let key = self.keys.claim(slice);
        let mine = self.volume.as_bytes().to_vec();
        // Free, or claimed by this very volume (a slice of its own that comes back, or a claim
        // an earlier owner made and did not finish).
        let current = self.client.clone().get(key.clone(), None).await?;
        let when = match current.kvs().first() {
            None => Compare::create_revision(key.clone(), CompareOp::Equal, 0),
            Some(kv) if kv.value() == mine.as_slice() => {
                Compare::value(key.clone(), CompareOp::Equal, mine.clone())
            }
            Some(kv) => {
                return Err(ClusterError::Claimed {
                    slice: slice.to_string(),
                    by: String::from_utf8_lossy(kv.value()).into_owned(),
                });
            }
        };
        let joining = slice.clone();
        self.update(
            move |m| {
                m.joining.retain(|j| !j.same(&joining));
                m.joining.push(joining);
            },
            vec![when],
            vec![TxnOp::put(key, mine, None)],
        )
        .await
        .map(|_| ())
    }

    /// The claim key of `slice`.
    pub fn claim_key(&self, slice: &SliceRef) -> String {
        self.keys.claim(slice)
    }

    /// `slice` is complete (rebuilt) or given up: no longer joining.
    pub async fn joined(&self, slice: &SliceRef) -> Result<(), ClusterError> {
        let s = slice.clone();
        self.update(move |m| m.joining.retain(|j| !j.same(&s)), Vec::new(), Vec::new()).await.map(|_| ())
    }

    async fn check(&self, next: &stria_engine::PoolMeta) -> Result<(), ClusterError> {
        let mut last = self.last.lock().await;
        let (members, released) = members_for(&last, self.epoch, next);
        let unchanged =
            members.in_service == last.in_service && members.out == last.out && released.is_empty();
        let guard =
            Compare::mod_revision(self.keys.owner(&self.volume), CompareOp::Equal, epoch_rev(self.epoch));
        let mut ops = Vec::new();
        if !unchanged {
            ops.push(TxnOp::put(self.keys.members(&self.volume), json(&members), None));
        }
        let resp = self.client.clone().txn(Txn::new().when([guard.clone()]).and_then(ops)).await?;
        if !resp.succeeded() {
            return Err(ClusterError::NotOwner { volume: self.volume.clone(), epoch: self.epoch });
        }
        // A released slice's claim is deleted only while it is still this volume's (never
        // another volume's claim of the same slice).
        for slice in &released {
            let key = self.keys.claim(slice);
            let ours = Compare::value(key.clone(), CompareOp::Equal, self.volume.as_bytes().to_vec());
            let txn = Txn::new().when([guard.clone(), ours]).and_then([TxnOp::delete(key, None)]);
            let done = self.client.clone().txn(txn).await?.succeeded();
            tracing::info!(volume = %self.volume, %slice, claim_deleted = done, "slice released: its member was rebuilt elsewhere");
        }
        if !unchanged {
            *last = members;
        }
        Ok(())
    }
}

impl stria_engine::CommitGuard for MembersGuard {
    fn allow<'a>(
        &'a self,
        next: &'a stria_engine::PoolMeta,
    ) -> futures::future::BoxFuture<'a, Result<(), String>> {
        Box::pin(async move { self.check(next).await.map_err(|e| e.to_string()) })
    }
}
