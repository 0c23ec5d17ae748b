//! stria nodes on etcd (docs/design/cluster.md).
//!
//! etcd holds configuration, membership, leases and volume ownership — nothing per I/O. A node
//! keeps one lease ([`Session`]); the coordinator of a volume owns it with a key bound to that
//! lease, and the revision of that key is the volume's fencing epoch, which the coordinator
//! persists on every slice before it serves ([`coordinator`]). Changing which slices are in
//! service is a transaction that checks the owner key is still the one it created.

pub mod coordinator;
pub mod etcd;
pub mod forward;
pub mod node;
pub mod placement;
pub mod records;
pub mod repair;

pub use coordinator::{Coordinated, create, take};
pub use etcd::{
    ClusterError, ClusterStatus, CordonStatus, EtcdStatus, Moved, OutStatus, Session, SessionConfig,
    VolumeStatus,
};
pub use node::{Node, NodeConfig, NodeReport, Reporter, VolumeReport, prepare_slices};
pub use records::{
    CordonRecord, DeleteRecord, Keys, MembersRecord, MoveRecord, NodeRecord, OutSlice, OwnerRecord,
    ResizeRecord, SliceInfoRecord, SliceRef, VolumeRecord, parse_layout,
};
