//! Typed views of the catalog: what `status`, `volume show` and `scrub` return. They serialize to
//! the JSON the CLI prints (`--json`) and the control socket carries.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use stria_engine::format::meta::VolumeRecord;
use stria_engine::qos::FlowRates;
use stria_engine::{PoolStatus, QosSpec, VolumeStatus};
use stria_tier::log::LogStatus;

/// The pool, with its log-structured (tiered and log) volumes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StatusView {
    #[serde(flatten)]
    pub pool: PoolStatus,
    /// Log-structured volumes, `tiered:` and `log:` ones.
    pub log: Vec<LogStatus>,
    /// Their segment spaces summed (absent when there are none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thin: Option<ThinView>,
    /// Volumes that could not be opened (absent when there are none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unavailable: Vec<UnavailableView>,
    /// Clones of snapshots of log-structured volumes (absent when there are none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clones: Vec<CloneView>,
    /// Snapshots of log-structured volumes, oldest first per volume, without the bytes only each
    /// holds (`snapshot list` computes those); absent when there are none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub snapshots: Vec<SnapshotView>,
}

impl StatusView {
    /// The volumes clients see, by name: plain volumes, tiered and log volumes (not the engine
    /// volumes they are made of), clones, and volumes that could not be opened. What `volume
    /// list --json` and `GET /api/v1/volumes` give.
    pub fn volume_list(&self) -> Vec<VolumeListEntry> {
        let mut list: Vec<VolumeListEntry> = Vec::new();
        for v in self.pool.volumes.iter().filter(|v| v.role == "plain") {
            list.push(VolumeListEntry {
                name: v.name.clone(),
                kind: "plain".into(),
                layout: Some(v.layout.clone()),
                size_bytes: Some(v.size_bytes),
                state: state_name(v.state).into(),
                class: Some(v.class.clone()),
                chunk_bytes: Some(v.chunk_bytes),
                rebuild: v.rebuild.clone(),
                ..VolumeListEntry::named(&v.name)
            });
        }
        for l in &self.log {
            let tiered = l.layout.starts_with("tiered:");
            if l.deleted_for_clones {
                let clones: Vec<&str> =
                    self.clones.iter().filter(|c| c.origin == l.name).map(|c| c.name.as_str()).collect();
                list.push(VolumeListEntry {
                    kind: "deleted".into(),
                    layout: Some(l.layout.clone()),
                    size_bytes: Some(l.size_bytes),
                    state: format!("{}, deleted (kept for {})", state_name(l.state), clones.join(", ")),
                    parts: l.parts.iter().map(|p| p.volume.clone()).collect(),
                    reason: Some(format!(
                        "deleted; its cache and segment space are kept for its clones ({}) until the last is deleted",
                        clones.join(", ")
                    )),
                    ..VolumeListEntry::named(&l.name)
                });
                continue;
            }
            list.push(VolumeListEntry {
                kind: if tiered { "tiered" } else { "log" }.into(),
                layout: Some(l.layout.clone()),
                size_bytes: Some(l.size_bytes),
                // `full` beside the redundancy state while writes that need new space fail.
                state: if l.full {
                    format!("{}, full", state_name(l.state))
                } else {
                    state_name(l.state).into()
                },
                class: Some(if tiered { "fast+capacity" } else { "capacity" }.into()),
                chunk_bytes: Some(stria_dev::BLOCK_BYTES),
                parts: l.parts.iter().map(|p| p.volume.clone()).collect(),
                ..VolumeListEntry::named(&l.name)
            });
        }
        for c in &self.clones {
            let origin = self.log.iter().find(|l| l.name == c.origin);
            list.push(VolumeListEntry {
                kind: "clone".into(),
                layout: origin.map(|o| o.layout.clone()),
                size_bytes: Some(c.size_bytes),
                state: origin.map_or("unknown", |o| state_name(o.state)).into(),
                chunk_bytes: Some(stria_dev::BLOCK_BYTES),
                origin: Some(format!("{}@{}", c.origin, c.snapshot)),
                ..VolumeListEntry::named(&c.name)
            });
        }
        for u in &self.unavailable {
            list.push(VolumeListEntry {
                kind: "unavailable".into(),
                state: "unavailable".into(),
                reason: Some(u.reason.clone()),
                ..VolumeListEntry::named(&u.name)
            });
        }
        list.sort_by(|a, b| a.name.cmp(&b.name));
        list
    }
}

/// One volume of [`StatusView::volume_list`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeListEntry {
    pub name: String,
    /// `plain`, `tiered`, `log`, `clone`, `unavailable`, or `deleted` (a log-structured volume
    /// deleted while clones of its snapshots live: kept, not usable, until the last is deleted).
    pub kind: String,
    /// As given at create (`raid1:2`, `tiered:ec:4+2`); a clone's is its origin's. Absent when
    /// unavailable.
    pub layout: Option<String>,
    pub size_bytes: Option<u64>,
    /// `healthy`, `degraded`, `rebuilding`, `failed` (a clone: its origin's), or `unavailable`.
    pub state: String,
    /// Where its data lives: a plain volume's drive class; `fast+capacity` for a tiered volume,
    /// `capacity` for a log volume.
    pub class: Option<String>,
    /// Stripe height (a log-structured volume and its clones map 4 KiB blocks).
    pub chunk_bytes: Option<u64>,
    pub rebuild: Option<stria_engine::RebuildProgress>,
    /// A tiered or log volume: the engine volumes it is made of (`volume show NAME` shows them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<String>,
    /// A clone: the `VOLUME@SNAPSHOT` it was made of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
    /// An unavailable volume: why it could not be opened; a deleted one: what keeps it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl VolumeListEntry {
    fn named(name: &str) -> VolumeListEntry {
        VolumeListEntry {
            name: name.to_string(),
            kind: String::new(),
            layout: None,
            size_bytes: None,
            state: String::new(),
            class: None,
            chunk_bytes: None,
            rebuild: None,
            parts: Vec::new(),
            origin: None,
            reason: None,
        }
    }
}

fn state_name(state: stria_engine::VolumeState) -> &'static str {
    use stria_engine::VolumeState as S;
    match state {
        S::Healthy => "healthy",
        S::Degraded => "degraded",
        S::Rebuilding => "rebuilding",
        S::Failed => "failed",
    }
}

/// The segment spaces of a pool's log-structured volumes, summed: what is thin.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThinView {
    pub volumes: u64,
    /// Sum of the volumes' sizes.
    pub logical_bytes: u64,
    /// Sum of their segment spaces (data bytes allocated from the pool).
    pub space_bytes: u64,
    /// Sum of what the segment spaces may grow to.
    #[serde(default)]
    pub space_max_bytes: u64,
    /// Live data (what the volumes' blocks take).
    pub allocated_bytes: u64,
    pub free_bytes: u64,
    /// Dead blocks GC will collect.
    pub garbage_bytes: u64,
    /// Free segments only GC may use.
    pub reserved_bytes: u64,
    /// Volumes larger than their segment space may grow (writes get ENOSPC when it is full).
    pub overcommitted: Vec<String>,
}

impl ThinView {
    /// Sums `volumes`; `None` when there are none.
    pub fn of(volumes: &[LogStatus]) -> Option<ThinView> {
        if volumes.is_empty() {
            return None;
        }
        let mut t = ThinView::default();
        for v in volumes {
            t.volumes += 1;
            t.logical_bytes += v.size_bytes;
            t.space_bytes += v.space_bytes;
            t.space_max_bytes += v.space_max_bytes;
            t.allocated_bytes += v.allocated_bytes;
            t.free_bytes += v.free_bytes;
            t.garbage_bytes += v.garbage_bytes;
            t.reserved_bytes += v.reserved_bytes;
            if v.size_bytes > v.space_max_bytes {
                t.overcommitted.push(v.name.clone());
            }
        }
        Some(t)
    }
}

/// A volume that could not be opened, and why.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UnavailableView {
    pub name: String,
    pub reason: String,
}

/// One volume: a log-structured volume, or a plain volume (or a part of a log-structured one)
/// with its placement.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
pub enum VolumeView {
    /// Boxed: much larger than the others (its status counters).
    Log(Box<LogView>),
    Clone(CloneView),
    Plain(PlainView),
}

/// A clone of a snapshot of a log-structured volume (`volume clone`, `volume show`): an ordinary
/// writable volume living in its origin's family (its cache, segment space and GC).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct CloneView {
    pub name: String,
    /// The log-structured volume whose snapshot it was made from.
    pub origin: String,
    /// That snapshot (it may since have been deleted; it is then kept, hidden, for the clone).
    pub snapshot: String,
    pub size_bytes: u64,
    /// Its layer id in the origin's map.
    pub id: u16,
    /// When it was made, Unix milliseconds.
    pub created_ms: u64,
    /// Always `"clone"` (what tells the views apart in JSON).
    pub kind: CloneTag,
    /// Absent when it has no settings and the dispatcher is off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos: Option<QosView>,
    /// The clone whose snapshot it was made of (`snapshot` is then that clone's); absent for a
    /// clone of a snapshot of `origin`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub of_clone: Option<String>,
    /// Its own snapshots, oldest first (`CLONE@NAME`: `snapshot list CLONE`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub snapshots: Vec<String>,
}

/// A log-structured volume (`tiered:` or `log:`; its `layout` says which).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LogView {
    #[serde(flatten)]
    pub status: LogStatus,
    /// Always `"log"` (what tells the views apart in JSON).
    pub kind: LogTag,
    /// Its snapshots, oldest first, with the bytes only each holds (`volume show`).
    #[serde(default)]
    pub snapshots: Vec<SnapshotView>,
    /// The clones of its snapshots.
    #[serde(default)]
    pub clones: Vec<CloneView>,
    /// Absent when it has no settings and the dispatcher is off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos: Option<QosView>,
}

/// A `"kind": "<name>"` marker: what tells the views apart in JSON.
macro_rules! kind_tag {
    ($(#[$doc:meta])* $tag:ident, $name:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct $tag;

        impl Serialize for $tag {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str($name)
            }
        }

        impl<'de> Deserialize<'de> for $tag {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<$tag, D::Error> {
                let kind = String::deserialize(d)?;
                if kind == $name {
                    Ok($tag)
                } else {
                    Err(serde::de::Error::custom(format!("expected kind {:?}, found {kind:?}", $name)))
                }
            }
        }
    };
}

kind_tag!(
    /// The `"kind": "clone"` marker of a [`CloneView`].
    CloneTag,
    "clone"
);

kind_tag!(
    /// The `"kind": "log"` marker of a [`LogView`].
    LogTag,
    "log"
);

/// A plain volume or a part of a log-structured one: status and counters, then where its chunks live.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PlainView {
    #[serde(flatten)]
    pub status: VolumeStatus,
    pub segments: Vec<SegmentView>,
    /// Absent when it has no settings and the dispatcher is off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos: Option<QosView>,
}

/// One segment of a volume: `rows` stripe rows on one set of members.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentView {
    pub rows: u64,
    pub members: Vec<MemberView>,
}

/// One member of a segment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberView {
    /// The drive's slot.
    pub drive: u32,
    pub start_block: u64,
    pub blocks: u64,
    /// While being rebuilt: rows below this are valid on the member.
    pub rebuild_cursor_rows: Option<u64>,
}

impl PlainView {
    /// The view of a volume from its status and its metadata record.
    pub fn new(status: VolumeStatus, rec: &VolumeRecord) -> PlainView {
        let segments = rec
            .segments
            .iter()
            .map(|s| SegmentView {
                rows: s.rows,
                members: s
                    .members
                    .iter()
                    .map(|m| MemberView {
                        drive: m.slot,
                        start_block: m.start_block,
                        blocks: s.rows * u64::from(rec.chunk_blocks),
                        rebuild_cursor_rows: m.rebuild_cursor_rows,
                    })
                    .collect(),
            })
            .collect();
        PlainView { status, segments, qos: None }
    }
}

/// A volume's QoS in `volume show`: its settings and what it got (rates over the last 5 s,
/// counted only while the pool's dispatcher is on, that is while any volume has a setting).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QosView {
    pub settings: QosSpec,
    pub iops: u64,
    pub bytes_per_sec: u64,
    /// Requests counted since the daemon started, and how many of them went within the
    /// reservation.
    pub ops: u64,
    pub reserved_ops: u64,
}

impl QosView {
    pub fn new(settings: QosSpec, rates: &FlowRates) -> QosView {
        QosView {
            settings,
            iops: rates.iops,
            bytes_per_sec: rates.bytes_per_sec,
            ops: rates.ops,
            reserved_ops: rates.reserved_ops,
        }
    }
}

/// One QoS setting in a change: set to a value, or cleared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Setting {
    Clear,
    Set(u64),
}

/// A change of QoS settings (`volume set`): settings absent here are kept.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QosUpdate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iops_limit: Option<Setting>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bw_limit: Option<Setting>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iops_reserve: Option<Setting>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bw_reserve: Option<Setting>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<Setting>,
}

/// The most a weight may be (the least is 1).
pub const MAX_WEIGHT: u64 = 10_000;

impl QosUpdate {
    /// The change that sets what `spec` sets.
    pub fn from_spec(spec: &QosSpec) -> QosUpdate {
        let set = |v: Option<u64>| v.map(Setting::Set);
        QosUpdate {
            iops_limit: set(spec.iops_limit),
            bw_limit: set(spec.bw_limit),
            iops_reserve: set(spec.iops_reserve),
            bw_reserve: set(spec.bw_reserve),
            weight: set(spec.weight.map(u64::from)),
        }
    }

    /// True when it changes nothing.
    pub fn is_empty(&self) -> bool {
        *self == QosUpdate::default()
    }

    /// `current` with this change, or why the result is refused.
    pub fn apply(&self, current: QosSpec) -> Result<QosSpec, String> {
        fn one(name: &str, now: Option<u64>, change: Option<Setting>) -> Result<Option<u64>, String> {
            match change {
                None => Ok(now),
                Some(Setting::Clear) => Ok(None),
                Some(Setting::Set(0)) => Err(format!("--{name} must be above 0 (use `none` to remove it)")),
                Some(Setting::Set(v)) => Ok(Some(v)),
            }
        }
        let weight = one("weight", current.weight.map(u64::from), self.weight)?;
        if let Some(w) = weight
            && w > MAX_WEIGHT
        {
            return Err(format!("--weight {w} is above {MAX_WEIGHT}"));
        }
        let spec = QosSpec {
            iops_limit: one("iops-limit", current.iops_limit, self.iops_limit)?,
            bw_limit: one("bw-limit", current.bw_limit, self.bw_limit)?,
            iops_reserve: one("iops-reserve", current.iops_reserve, self.iops_reserve)?,
            bw_reserve: one("bw-reserve", current.bw_reserve, self.bw_reserve)?,
            weight: weight.map(|w| u32::try_from(w).expect("at most MAX_WEIGHT")),
        };
        for (what, reserve, limit) in
            [("iops", spec.iops_reserve, spec.iops_limit), ("bw", spec.bw_reserve, spec.bw_limit)]
        {
            if let (Some(r), Some(l)) = (reserve, limit)
                && r > l
            {
                return Err(format!("--{what}-reserve {r} is above --{what}-limit {l}"));
            }
        }
        Ok(spec)
    }
}

/// One snapshot of a log-structured volume (`snapshot list`, `snapshot create`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SnapshotView {
    pub volume: String,
    pub name: String,
    /// The NBD export name: `VOL@SNAP` (read-only).
    pub export: String,
    /// Its layer id in the volume's map.
    pub id: u16,
    pub size_bytes: u64,
    /// When it was made, Unix milliseconds.
    pub created_ms: u64,
    /// Bytes only it holds: what deleting it frees (`snapshot list` computes it; `None` where
    /// not asked for).
    #[serde(default)]
    pub exclusive_bytes: Option<u64>,
    /// Bytes of data its view maps (its whole content less zeros and holes), computed with
    /// `exclusive_bytes`.
    #[serde(default)]
    pub referenced_bytes: Option<u64>,
    /// Bytes it references that another layer (the volume, another snapshot, a clone) holds
    /// too: `referenced_bytes - exclusive_bytes`, freed only when all of them go.
    #[serde(default)]
    pub shared_bytes: Option<u64>,
}

/// What `volume rollback` did.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RollbackView {
    pub volume: String,
    pub snapshot: String,
    /// Blocks whose map entry changed to the snapshot's.
    pub blocks_changed: u64,
    pub seconds: f64,
    /// The newer snapshots deleted first (`--destroy-newer`), newest first.
    #[serde(default)]
    pub snapshots_deleted: Vec<String>,
}

/// What `snapshot delete` did.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SnapshotDeletedView {
    pub volume: String,
    pub name: String,
    /// Map page copies handed to the next older snapshot (its view of those pages).
    pub map_pages_handed_on: u64,
    /// Map page copies dropped.
    pub map_pages_dropped: u64,
    /// Blocks only the snapshot held, now free for GC to collect.
    pub blocks_freed: u64,
    /// The snapshot has clones: it is hidden and kept (nothing freed) until its last clone is
    /// deleted, which finishes this delete.
    #[serde(default)]
    pub kept_for_clones: bool,
    pub seconds: f64,
    /// The delete was left to the volume's background task (the counts above are then zero):
    /// the snapshot is gone for every reader, its space comes back as the task runs.
    #[serde(default)]
    pub in_background: bool,
}

impl SnapshotView {
    /// Sets the byte counts from the bytes only it holds and what each layer of its volume
    /// references (by layer id). Computed one after the other while writes go on, the shared
    /// figure is kept from going below zero.
    pub fn fill_bytes(&mut self, exclusive: u64, referenced: &[(u16, u64)]) {
        self.exclusive_bytes = Some(exclusive);
        if let Some(&(_, r)) = referenced.iter().find(|(id, _)| *id == self.id) {
            self.referenced_bytes = Some(r);
            self.shared_bytes = Some(r.saturating_sub(exclusive));
        }
    }

    pub fn of(volume: &str, size_bytes: u64, rec: &stria_tier::layers::LayerRecord) -> SnapshotView {
        SnapshotView {
            volume: volume.to_string(),
            name: rec.name.clone(),
            export: format!("{volume}@{}", rec.name),
            id: rec.id,
            size_bytes,
            created_ms: rec.created_ms,
            exclusive_bytes: None,
            referenced_bytes: None,
            shared_bytes: None,
        }
    }
}
