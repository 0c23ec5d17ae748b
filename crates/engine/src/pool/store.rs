//! The metadata store (docs/design/seams.md §2.4): where `PoolCore::update`, the one door for
//! metadata changes, keeps what it commits. Today's store is the drives themselves
//! ([`DriveQuorum`]: every commit writes the whole document to every active drive and succeeds
//! on a majority, docs/on-disk-format.md §3). A cluster's store will be etcd: each record a key,
//! a commit a transaction conditioned on the generations of the records it changes.
//!
//! The document is made of **records** ([`RecordKey`]): the pool record (its identity and its
//! drive set, with their states, calibration, rebalance and rebuild rate), the id counter, and
//! per volume its record, its tiered record and its QoS entry. Each record carries the
//! generation of the commit that last changed it (`PoolMeta::record_generations`), stamped by
//! [`stamp`]; a change names the records it may touch ([`Scope`]), and a change that touches
//! others is refused before anything is written.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arc_swap::ArcSwap;
use futures::future::{BoxFuture, join_all};
use stria_dev::{BlockDevice, DevError};

use crate::drive::Drive;
use crate::error::EngineError;
use crate::format::meta::{DriveState, PoolMeta};

/// One record of the metadata document.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum RecordKey {
    /// The pool's identity and its drive set (drives, calibration, rebalance, rebuild rate).
    Pool,
    /// The counter volume ids are taken from.
    Ids,
    /// An engine volume's record (its layout, segments and members).
    Volume(String),
    /// A tiered or log volume's record (its engine volumes and parameters).
    Tiered(String),
    /// A client-visible volume's QoS settings.
    Qos(String),
}

impl RecordKey {
    /// The key as the document stores it, and as an etcd store would name it.
    pub(crate) fn name(&self) -> String {
        match self {
            RecordKey::Pool => "pool".into(),
            RecordKey::Ids => "ids".into(),
            RecordKey::Volume(n) => format!("volume/{n}"),
            RecordKey::Tiered(n) => format!("tiered/{n}"),
            RecordKey::Qos(n) => format!("qos/{n}"),
        }
    }
}

/// What a change may touch.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Scope<'a> {
    /// Any record (pool-wide changes: a drive failed, added or replaced, which may take members
    /// of every volume with it).
    Any,
    /// The records of one volume: the engine volume of that name and those named `NAME.*`
    /// (a tiered or log volume's cache, map and segment space), its tiered record and QoS
    /// entry; and the id counter.
    Volume(&'a str),
}

impl Scope<'_> {
    fn allows(self, key: &RecordKey) -> bool {
        match (self, key) {
            (Scope::Any, _) | (Scope::Volume(_), RecordKey::Ids) => true,
            (Scope::Volume(_), RecordKey::Pool) => false,
            (Scope::Volume(name), RecordKey::Volume(n)) => {
                n == name || n.strip_prefix(name).is_some_and(|rest| rest.starts_with('.'))
            }
            (Scope::Volume(name), RecordKey::Tiered(n) | RecordKey::Qos(n)) => n == name,
        }
    }
}

/// Every record of `meta` by key, as its JSON value (records compare by content).
fn records(meta: &PoolMeta) -> BTreeMap<RecordKey, serde_json::Value> {
    fn value<T: serde::Serialize>(record: &T) -> serde_json::Value {
        serde_json::to_value(record).expect("metadata records serialize")
    }
    let mut out = BTreeMap::new();
    out.insert(
        RecordKey::Pool,
        serde_json::json!({
            "pool_uuid": meta.pool_uuid,
            "name": meta.name,
            "created_unix_secs": meta.created_unix_secs,
            "next_slot": meta.next_slot,
            "drives": meta.drives,
            "calibration": meta.calibration,
            "rebalance": meta.rebalance,
            "rebuild_rate_bytes_per_sec": meta.rebuild_rate_bytes_per_sec,
        }),
    );
    out.insert(RecordKey::Ids, serde_json::json!(meta.next_volume_id));
    for v in &meta.volumes {
        out.insert(RecordKey::Volume(v.name.clone()), value(v));
    }
    for t in &meta.tiered {
        out.insert(RecordKey::Tiered(t.name.clone()), value(t));
    }
    for (name, q) in &meta.qos {
        out.insert(RecordKey::Qos(name.clone()), value(q));
    }
    out
}

/// The records `next` adds, changes or removes relative to `prev`.
pub(crate) fn changed(prev: &PoolMeta, next: &PoolMeta) -> Vec<RecordKey> {
    let (a, b) = (records(prev), records(next));
    let keys: BTreeSet<&RecordKey> = a.keys().chain(b.keys()).collect();
    keys.into_iter().filter(|k| a.get(*k) != b.get(*k)).cloned().collect()
}

/// True when `meta` holds the record `key`.
fn exists(meta: &PoolMeta, key: &RecordKey) -> bool {
    match key {
        RecordKey::Pool | RecordKey::Ids => true,
        RecordKey::Volume(n) => meta.volumes.iter().any(|v| &v.name == n),
        RecordKey::Tiered(n) => meta.tiered.iter().any(|t| &t.name == n),
        RecordKey::Qos(n) => meta.qos.contains_key(n),
    }
}

/// Every record of `meta` (a new pool's first commit stamps them all).
pub(crate) fn all(meta: &PoolMeta) -> Vec<RecordKey> {
    records(meta).into_keys().collect()
}

/// Refuses a change that touches records outside its scope (a caller's bug: nothing is
/// written).
pub(crate) fn check_scope(scope: Scope<'_>, changed: &[RecordKey]) -> Result<(), EngineError> {
    match changed.iter().find(|k| !scope.allows(k)) {
        None => Ok(()),
        Some(k) => Err(EngineError::Invalid(format!(
            "a metadata change of {scope:?} touched record {} outside its scope",
            k.name()
        ))),
    }
}

/// Stamps the records `changed` with `next.generation` (removed ones lose their stamp). A
/// record's generation is what a store compares before it overwrites the record.
pub(crate) fn stamp(next: &mut PoolMeta, changed: &[RecordKey]) {
    let generation = next.generation;
    for key in changed {
        if exists(next, key) {
            next.record_generations.insert(key.name(), generation);
        } else {
            next.record_generations.remove(&key.name());
        }
    }
}

/// What a commit reached.
#[derive(Debug)]
pub(crate) struct CommitReport {
    /// Whether the document is committed (durable where the store's rule says).
    pub(crate) result: Result<(), EngineError>,
    /// Drives that could not take the document (their I/O failed).
    pub(crate) dead: Vec<u32>,
    /// Drives that could not take it because the host filesystem is full.
    pub(crate) full: Vec<(u32, DevError)>,
}

/// Where the metadata is kept. `PoolCore::update` is its only caller: it serialises commits,
/// claims each commit's generation, stamps the records the change touched, and handles the
/// drives a report names.
pub(crate) trait MetaStore: Send + Sync {
    /// Commits `next` over `prev` (`next.generation` is new, never used before).
    fn commit<'a>(&'a self, prev: &'a PoolMeta, next: &'a PoolMeta) -> BoxFuture<'a, CommitReport>;

    /// `meta` is committed and reached every place it goes: records that it is the newest
    /// generation anyone may trust. Returns the drives that could not take the confirmation.
    fn confirm<'a>(&'a self, meta: &'a PoolMeta) -> BoxFuture<'a, Vec<(u32, DevError)>>;

    /// The newest generation confirmed (see [`MetaStore::confirm`]).
    fn confirmed_generation(&self) -> u64;
}

/// Asked before each metadata commit of a pool, with the document about to be committed. A
/// cluster coordinator checks there that it still owns the volume and records in etcd which
/// members are in service, before any drive sees the change (docs/design/cluster.md §4.1: a
/// member leaves service only after a fenced etcd write). An error refuses the commit:
/// nothing is written, and the change fails with [`EngineError::GuardRefused`].
pub trait CommitGuard: Send + Sync {
    fn allow<'a>(&'a self, next: &'a PoolMeta) -> BoxFuture<'a, Result<(), String>>;
}

/// Today's store: the pool's own drives. Each commit writes the whole document, then the
/// superblock, to every active drive; it is committed when a majority of the drives active in
/// the new document *and* a majority of those active both before and after took it
/// (docs/on-disk-format.md §3).
pub(crate) struct DriveQuorum<D: BlockDevice> {
    drives: Arc<ArcSwap<Vec<Arc<Drive<D>>>>>,
    /// The newest generation confirmed on every drive active in it (see
    /// `Superblock::committed_generation`); written into superblocks by later commits.
    committed_high: AtomicU64,
}

impl<D: BlockDevice> DriveQuorum<D> {
    pub(crate) fn new(drives: Arc<ArcSwap<Vec<Arc<Drive<D>>>>>, committed_generation: u64) -> Self {
        DriveQuorum { drives, committed_high: AtomicU64::new(committed_generation) }
    }

    /// The drives a commit of `meta` writes: open, not failed, and active in `meta`.
    fn targets(&self, meta: &PoolMeta) -> Vec<Arc<Drive<D>>> {
        self.drives
            .load()
            .iter()
            .filter(|d| !d.is_failed())
            .filter(|d| meta.drive(d.slot()).is_some_and(|r| r.state != DriveState::Failed))
            .cloned()
            .collect()
    }

    async fn commit_inner(&self, prev: &PoolMeta, meta: &PoolMeta) -> CommitReport {
        let committed = self.committed_high.load(Ordering::SeqCst);
        let targets = self.targets(meta);
        let writes = targets.iter().map(|d| async move {
            d.write_metadata(meta).await?;
            d.write_superblock(meta.generation, committed).await?;
            Ok::<(), EngineError>(())
        });
        let results = join_all(writes).await;
        let mut written = Vec::new();
        let mut dead = Vec::new();
        let mut full = Vec::new();
        for (d, r) in targets.iter().zip(results) {
            match r {
                Ok(()) => written.push(d.slot()),
                Err(EngineError::Dev(e)) if e.is_no_space() => full.push((d.slot(), e)),
                Err(e) => {
                    tracing::error!(slot = d.slot(), error = %e, "metadata write failed");
                    dead.push(d.slot());
                }
            }
        }
        let active = |m: &PoolMeta, slot: u32| m.drive(slot).is_some_and(|r| r.state != DriveState::Failed);
        let new_set: Vec<u32> = meta.drives.iter().map(|d| d.slot).filter(|&s| active(meta, s)).collect();
        let kept: Vec<u32> = new_set.iter().copied().filter(|&s| active(prev, s)).collect();
        for set in [&new_set, &kept] {
            if set.is_empty() && set.len() != new_set.len() {
                continue; // a brand-new pool: nothing was active before
            }
            let got = set.iter().filter(|s| written.contains(s)).count();
            let needed = set.len() / 2 + 1;
            if got < needed {
                let e = EngineError::CommitFailed {
                    generation: meta.generation,
                    written: got,
                    total: set.len(),
                    needed,
                };
                return CommitReport { result: Err(e), dead, full };
            }
        }
        CommitReport { result: Ok(()), dead, full }
    }

    /// Records generation `meta.generation` as confirmed in the superblocks of the drives active
    /// in it. From then on a drive whose superblock is older than this generation can only be
    /// an old copy, and assembly keeps it out (docs/on-disk-format.md §2). Only a confirmation
    /// every drive took counts (a later commit writes it again): what the pool reports as
    /// confirmed is on the drives.
    async fn confirm_inner(&self, meta: &PoolMeta) -> Vec<(u32, DevError)> {
        let g = meta.generation;
        let targets = self.targets(meta);
        let results = join_all(targets.iter().map(|d| d.write_superblock(g, g))).await;
        let failed: Vec<(u32, DevError)> =
            targets.iter().zip(results).filter_map(|(d, r)| r.err().map(|e| (d.slot(), e))).collect();
        if failed.is_empty() {
            self.committed_high.fetch_max(g, Ordering::SeqCst);
        }
        failed
    }
}

impl<D: BlockDevice> MetaStore for DriveQuorum<D> {
    fn commit<'a>(&'a self, prev: &'a PoolMeta, next: &'a PoolMeta) -> BoxFuture<'a, CommitReport> {
        Box::pin(self.commit_inner(prev, next))
    }

    fn confirm<'a>(&'a self, meta: &'a PoolMeta) -> BoxFuture<'a, Vec<(u32, DevError)>> {
        Box::pin(self.confirm_inner(meta))
    }

    fn confirmed_generation(&self) -> u64 {
        self.committed_high.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> PoolMeta {
        let mut m = crate::format::meta::tests_support::sample();
        m.generation = 7;
        m
    }

    #[test]
    fn a_change_names_the_records_it_touched() {
        let prev = meta();
        let mut next = prev.clone();
        assert!(changed(&prev, &next).is_empty());
        let v = next.volumes[0].name.clone();
        next.volumes[0].size_bytes += 4096;
        next.next_volume_id += 1;
        assert_eq!(changed(&prev, &next), vec![RecordKey::Ids, RecordKey::Volume(v.clone())]);
        next.drives[0].state = DriveState::Failed;
        assert_eq!(changed(&prev, &next), vec![RecordKey::Pool, RecordKey::Ids, RecordKey::Volume(v)]);
    }

    #[test]
    fn a_change_outside_its_scope_is_refused() {
        let prev = meta();
        let mut next = prev.clone();
        let v = next.volumes[0].name.clone();
        next.volumes[0].size_bytes += 4096;
        let touched = changed(&prev, &next);
        check_scope(Scope::Volume(&v), &touched).expect("its own record");
        check_scope(Scope::Any, &touched).expect("any");
        let err = check_scope(Scope::Volume("other"), &touched).expect_err("another volume's record");
        assert!(err.to_string().contains(&format!("volume/{v}")), "{err}");
        next.drives[0].state = DriveState::Failed;
        check_scope(Scope::Volume(&v), &changed(&prev, &next)).expect_err("the drive set");
        // The engine volumes of a tiered volume belong to it; a volume whose name merely starts
        // the same does not.
        assert!(Scope::Volume("t").allows(&RecordKey::Volume("t.seg".into())));
        assert!(!Scope::Volume("t").allows(&RecordKey::Volume("tx".into())));
        assert!(!Scope::Volume("t").allows(&RecordKey::Tiered("t.seg".into())));
        assert!(!Scope::Volume("t.seg").allows(&RecordKey::Volume("t".into())));
    }

    #[test]
    fn stamps_follow_the_records_a_commit_changed() {
        let prev = meta();
        let mut next = prev.clone();
        next.generation = 8;
        let v = next.volumes[0].name.clone();
        next.volumes[0].size_bytes += 4096;
        let touched = changed(&prev, &next);
        stamp(&mut next, &touched);
        assert_eq!(next.record_generations.get(&format!("volume/{v}")), Some(&8));
        assert_eq!(next.record_generations.get("pool"), None, "the pool record was not touched");
        // A removed record loses its stamp.
        let mut after = next.clone();
        after.generation = 9;
        after.volumes.remove(0);
        let touched = changed(&next, &after);
        stamp(&mut after, &touched);
        assert_eq!(after.record_generations.get(&format!("volume/{v}")), None);
    }
}
