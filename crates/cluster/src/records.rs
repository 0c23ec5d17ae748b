//! The values stria keeps in etcd (docs/design/cluster.md §2), as JSON. All small: a handful of
//! keys per volume and one per node, none written per I/O.

use serde::{Deserialize, Serialize};
use stria_engine::Layout;

/// Seconds since the Unix epoch, as the records' `since_unix` fields hold them.
pub fn now_unix() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// Where the keys live: `<prefix>/nodes/<node>`, `<prefix>/owners/<vol>`,
/// `<prefix>/volumes/<vol>/{spec,members}`.
#[derive(Clone, Debug)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    /// Keys under `prefix` (`/stria/v1` by default; tests use one prefix each).
    pub fn new(prefix: &str) -> Keys {
        Keys { prefix: prefix.trim_end_matches('/').to_string() }
    }

    /// Every key of the cluster (what a node watches).
    pub fn all(&self) -> String {
        format!("{}/", self.prefix)
    }

    pub fn node(&self, node: &str) -> String {
        format!("{}/nodes/{node}", self.prefix)
    }

    pub fn nodes(&self) -> String {
        format!("{}/nodes/", self.prefix)
    }

    pub fn spec(&self, volume: &str) -> String {
        format!("{}/volumes/{volume}/spec", self.prefix)
    }

    /// Owner keys have a prefix of their own, so one watch sees every ownership change and
    /// nothing else (docs/design/cluster.md §2).
    pub fn owner(&self, volume: &str) -> String {
        format!("{}/owners/{volume}", self.prefix)
    }

    pub fn volumes(&self) -> String {
        format!("{}/volumes/", self.prefix)
    }

    pub fn owners(&self) -> String {
        format!("{}/owners/", self.prefix)
    }

    pub fn members(&self, volume: &str) -> String {
        format!("{}/volumes/{volume}/members", self.prefix)
    }

    /// `volumes/<vol>/move`: a planned move to another node (docs/design/cluster.md §6.3), one at
    /// a time, deleted by the node that takes the volume.
    pub fn moving(&self, volume: &str) -> String {
        format!("{}/volumes/{volume}/move", self.prefix)
    }

    /// `claims/<node>/<slice>`: which volume a slice belongs to. Created in the same transaction
    /// as the spec (or, for a replacement, as the owner's claim), deleted when the volume lets the
    /// slice go; a slice without a claim is free.
    pub fn claim(&self, slice: &SliceRef) -> String {
        format!("{}/claims/{}/{}", self.prefix, slice.node, slice.slice)
    }

    pub fn claims(&self) -> String {
        format!("{}/claims/", self.prefix)
    }

    /// `volumes/<vol>/delete`: a delete requested (docs/design/cluster.md §6.4), carried out by
    /// the owner, or by anyone while nobody owns the volume.
    pub fn deleting(&self, volume: &str) -> String {
        format!("{}/volumes/{volume}/delete", self.prefix)
    }

    /// `volumes/<vol>/resize`: a new size requested (docs/design/cluster.md §6.5), carried out
    /// by the owner.
    pub fn resizing(&self, volume: &str) -> String {
        format!("{}/volumes/{volume}/resize", self.prefix)
    }

    /// `volumes/<vol>/`: every key of one volume but its owner's (spec, members, move, delete,
    /// resize).
    pub fn volume_keys(&self, volume: &str) -> String {
        format!("{}/volumes/{volume}/", self.prefix)
    }

    /// `cordons/<node>`: the node is out of service (docs/design/cluster.md §6.6). Not bound to
    /// a lease: it outlives the node's restarts.
    pub fn cordon(&self, node: &str) -> String {
        format!("{}/cordons/{node}", self.prefix)
    }

    pub fn cordons(&self) -> String {
        format!("{}/cordons/", self.prefix)
    }

    /// `clients/`: every volume's client counts.
    pub fn all_clients(&self) -> String {
        format!("{}/clients/", self.prefix)
    }

    /// `clients/<vol>/`: the nodes that count clients of `volume` now.
    pub fn clients(&self, volume: &str) -> String {
        format!("{}/clients/{volume}/", self.prefix)
    }

    /// `clients/<vol>/<node>`: how many NBD clients `node` has attached to `volume` (none: 0),
    /// bound to the node's lease.
    pub fn client_count(&self, volume: &str, node: &str) -> String {
        format!("{}/clients/{volume}/{node}", self.prefix)
    }
}

impl Default for Keys {
    fn default() -> Keys {
        Keys::new("/stria/v1")
    }
}

/// `nodes/<node>`: a node process, bound to its lease (gone when the node is).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    pub name: String,
    /// Where its slice server listens.
    pub slice_addr: String,
    /// Where it serves volumes to clients (NBD), if it does.
    #[serde(default)]
    pub nbd_addr: Option<String>,
    /// The slices it serves.
    #[serde(default)]
    pub slices: Vec<SliceInfoRecord>,
}

/// A slice a node serves: its id and usable bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SliceInfoRecord {
    pub id: u32,
    pub bytes: u64,
}

/// A slice of some node: where a member of a volume lives.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SliceRef {
    pub node: String,
    /// The node's slice-server address.
    pub addr: String,
    pub slice: u32,
}

impl SliceRef {
    /// The same slice (node and id; the address may have changed with a restart).
    pub fn same(&self, other: &SliceRef) -> bool {
        self.node == other.node && self.slice == other.slice
    }
}

impl std::fmt::Display for SliceRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/slice-{}", self.node, self.slice)
    }
}

/// `volumes/<vol>/spec`: what the volume is (written once, at create).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeRecord {
    pub name: String,
    pub layout: Layout,
    pub size_bytes: u64,
    pub chunk_bytes: u64,
    /// Every slice the volume's pool was made of.
    pub slices: Vec<SliceRef>,
}

impl VolumeRecord {
    /// Refuses a spec no node could make a pool of (its name, layout, size or chunk out of
    /// range): put in etcd, it would claim its slices and every node would try to take it.
    pub fn check(&self) -> Result<(), stria_engine::EngineError> {
        stria_engine::check_volume_name(&self.name)?;
        self.layout.validate().map_err(stria_engine::EngineError::Invalid)?;
        stria_engine::check_volume_size(self.size_bytes)?;
        stria_engine::check_chunk_size(self.chunk_bytes)
    }
}

/// `owners/<vol>`: the node coordinating the volume, bound to that node's lease. The
/// revision of the put that created it is the volume's epoch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnerRecord {
    pub node: String,
}

/// `volumes/<vol>/move`: the owner closes the volume and gives it up, and only `to` takes it
/// while `to` is alive.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveRecord {
    pub to: String,
}

/// `volumes/<vol>/delete`: the volume is to be deleted; `force`: even with clients attached.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeleteRecord {
    pub force: bool,
    pub since_unix: u64,
}

/// `volumes/<vol>/resize`: the volume is to be `size_bytes` long. `error`: why the owner could
/// not make it so (it does not try again; the CLI reports it and removes the request).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResizeRecord {
    pub size_bytes: u64,
    pub since_unix: u64,
    #[serde(default)]
    pub error: Option<String>,
}

/// `cordons/<node>`: the node takes no volume while a live node that is not cordoned could,
/// receives no planned move and no new slice (docs/design/cluster.md §6.6).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CordonRecord {
    pub since_unix: u64,
    /// What the operator gave (`--reason`), or empty.
    #[serde(default)]
    pub reason: String,
}

/// A slice taken out of service, and since when.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutSlice {
    pub slice: SliceRef,
    /// The epoch of the owner that took it out.
    pub epoch: u64,
    pub since_unix: u64,
    pub reason: String,
}

/// `volumes/<vol>/members`: which slices are in service. Written only by the owner, with a
/// transaction that checks the owner key is still the one it created (a fenced etcd write).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MembersRecord {
    /// The epoch of the owner that wrote this.
    pub epoch: u64,
    pub in_service: Vec<SliceRef>,
    #[serde(default)]
    pub out: Vec<OutSlice>,
    /// Slices claimed to replace an out member (docs/design/cluster.md §7): listed here from the
    /// claim on, in service too once the pool holds them, and here until their rebuild is done.
    /// Their data is incomplete until then, so a takeover does not count them as members it can
    /// read from.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub joining: Vec<SliceRef>,
}

impl MembersRecord {
    /// In service with complete data (not being rebuilt).
    pub fn complete(&self) -> impl Iterator<Item = &SliceRef> {
        self.in_service.iter().filter(|s| !self.joining.iter().any(|j| j.same(s)))
    }
}

/// Parses a plain layout as the CLI writes it: `raid0:N`, `raid1:N` (or `mirror:N`),
/// `raid10:WxC`, `ec:K+M`.
pub fn parse_layout(text: &str) -> Result<Layout, String> {
    let bad = || format!("unknown layout {text:?} (raid0:N, raid1:N or mirror:N, raid10:WxC, ec:K+M)");
    let (kind, rest) = text.split_once(':').ok_or_else(bad)?;
    let num = |s: &str| s.parse::<u32>().ok().filter(|&n| n > 0).ok_or_else(bad);
    let layout = match kind {
        "raid0" => Layout::Raid0 { width: num(rest)? },
        "raid1" | "mirror" => Layout::Raid1 { copies: num(rest)? },
        "raid10" => {
            let (w, c) = rest.split_once('x').ok_or_else(bad)?;
            Layout::Raid10 { width: num(w)?, copies: num(c)? }
        }
        "ec" => {
            let (k, m) = rest.split_once('+').ok_or_else(bad)?;
            Layout::Ec { data_shards: num(k)?, parity_shards: num(m)? }
        }
        _ => return Err(bad()),
    };
    Ok(layout)
}
