//! Pool metadata (format §3): the JSON document and its checksummed container.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::{FormatError, Reader, Writer};

const MAGIC: &[u8; 8] = b"STRIA-MD";
const HEADER_BYTES: usize = 64;

/// Speed class of a drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum DriveClass {
    /// Small, fast, durable drives (Optane-like): write cache and metadata.
    Fast,
    /// Large, cheap drives (QLC-like): the capacity tier.
    Capacity,
}

impl fmt::Display for DriveClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DriveClass::Fast => "fast",
            DriveClass::Capacity => "capacity",
        })
    }
}

impl FromStr for DriveClass {
    type Err = String;
    fn from_str(s: &str) -> Result<DriveClass, String> {
        match s {
            "fast" => Ok(DriveClass::Fast),
            "capacity" => Ok(DriveClass::Capacity),
            other => Err(format!("unknown drive class `{other}`: expected `fast` or `capacity`")),
        }
    }
}

/// Lifecycle state of a drive in the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DriveState {
    /// In service.
    Active,
    /// Out of service after an error or `drive fail`; its extents are rebuilt elsewhere.
    Failed,
    /// Formatted and waiting to replace a failed drive.
    Spare,
}

/// One drive as the pool remembers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriveRecord {
    pub slot: u32,
    pub uuid: Uuid,
    pub class: DriveClass,
    #[serde(default)]
    pub domain: String,
    pub state: DriveState,
    #[serde(default)]
    pub failed_reason: Option<String>,
    /// The path the drive was last opened at (a hint; drives are found by identity).
    #[serde(default)]
    pub path_hint: String,
    pub data_blocks: u64,
    /// Error counters kept across restarts until cleared (absent in pools made before them).
    #[serde(default)]
    pub errors: DriveErrors,
    /// Being emptied by `drive remove`: no new extents go to it, and the rebalance moves its
    /// members to the other drives of its class (docs/design/pool-growth.md). Otherwise active.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub draining: bool,
    /// Set when the drive went out through the pool's failure path, until it is back and
    /// resynchronised (docs/design/delta-resync.md): what its delta resync needs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub out: Option<OutRecord>,
}

/// The outage of a drive, for its delta resync (docs/design/delta-resync.md).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutRecord {
    /// The out generation the other drives mark while it is out.
    pub generation: u64,
    /// Unix time it went out.
    pub since_unix_secs: u64,
    /// The flush epoch the pool had confirmed of it: a device that comes back with an older one
    /// is an old copy.
    pub epoch: u64,
    /// Its own intent regions found dirty when it came back (bytes may have reached it that the
    /// others lack); resynchronised like the regions the others marked.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub regions: Vec<u64>,
}

/// One persistent error counter: how many events, and when the last one happened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorCount {
    #[serde(default)]
    pub count: u64,
    /// Unix time of the last event counted; 0 while `count` is 0.
    #[serde(default)]
    pub last_unix_secs: u64,
}

impl ErrorCount {
    /// Adds `delta` (events counted elsewhere): the counts add up, the later time wins.
    pub fn add(&mut self, delta: ErrorCount) {
        if delta.count == 0 {
            return;
        }
        self.count = self.count.saturating_add(delta.count);
        self.last_unix_secs = self.last_unix_secs.max(delta.last_unix_secs);
    }
}

/// The error counters of a drive, like the READ/WRITE/CKSUM columns of `zpool status`: they
/// survive restarts and are reset only on request (`stria drive clear-errors`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriveErrors {
    /// Read requests to the drive that failed with an I/O error (each attempt counts, also one
    /// that a retry or the redundancy covered).
    #[serde(default)]
    pub read_errors: ErrorCount,
    /// Write and flush requests to the drive that failed with an I/O error.
    #[serde(default)]
    pub write_errors: ErrorCount,
    /// Blocks of the drive found bad (checksum mismatch or unreadable) and rewritten from
    /// redundancy.
    #[serde(default)]
    pub checksum_repairs: ErrorCount,
}

impl DriveErrors {
    /// Adds `delta` counter by counter.
    pub fn add(&mut self, delta: &DriveErrors) {
        self.read_errors.add(delta.read_errors);
        self.write_errors.add(delta.write_errors);
        self.checksum_repairs.add(delta.checksum_repairs);
    }

    /// True when nothing was counted.
    pub fn is_zero(&self) -> bool {
        self.read_errors.count == 0 && self.write_errors.count == 0 && self.checksum_repairs.count == 0
    }
}

/// How a volume spreads its data over its members.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Layout {
    /// Striping without redundancy over `width` drives.
    Raid0 { width: u32 },
    /// `copies` full copies.
    Raid1 { copies: u32 },
    /// Striping over `width` columns of `copies` copies each.
    Raid10 { width: u32, copies: u32 },
    /// Reed-Solomon: `data_shards` + `parity_shards` chunks per stripe.
    Ec { data_shards: u32, parity_shards: u32 },
}

impl Layout {
    /// Number of member extents one segment of this layout has.
    pub fn members(&self) -> u32 {
        match *self {
            Layout::Raid0 { width } => width,
            Layout::Raid1 { copies } => copies,
            Layout::Raid10 { width, copies } => width * copies,
            Layout::Ec { data_shards, parity_shards } => data_shards + parity_shards,
        }
    }

    /// Chunks of data per row (stripe width in data chunks).
    pub fn data_columns(&self) -> u32 {
        match *self {
            Layout::Raid0 { width } | Layout::Raid10 { width, .. } => width,
            Layout::Raid1 { .. } => 1,
            Layout::Ec { data_shards, .. } => data_shards,
        }
    }

    /// How many member failures (in the worst placement) the layout survives.
    pub fn tolerance(&self) -> u32 {
        match *self {
            Layout::Raid0 { .. } => 0,
            Layout::Raid1 { copies } | Layout::Raid10 { copies, .. } => copies - 1,
            Layout::Ec { parity_shards, .. } => parity_shards,
        }
    }

    /// Checks the parameters are in range.
    pub fn validate(&self) -> Result<(), String> {
        let ok = match *self {
            Layout::Raid0 { width } => (1..=64).contains(&width),
            Layout::Raid1 { copies } => (2..=8).contains(&copies),
            Layout::Raid10 { width, copies } => (1..=64).contains(&width) && (2..=8).contains(&copies),
            Layout::Ec { data_shards, parity_shards } => {
                data_shards >= 1 && parity_shards >= 1 && data_shards + parity_shards <= 64
            }
        };
        if ok {
            Ok(())
        } else {
            Err(format!(
                "layout `{self}` is out of range (raid0 width 1-64, raid1 copies 2-8, ec K>=1, M>=1, K+M<=64)"
            ))
        }
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Layout::Raid0 { width } => write!(f, "raid0:{width}"),
            Layout::Raid1 { copies } => write!(f, "raid1:{copies}"),
            Layout::Raid10 { width, copies } => write!(f, "raid10:{width}x{copies}"),
            Layout::Ec { data_shards, parity_shards } => write!(f, "ec:{data_shards}+{parity_shards}"),
        }
    }
}

/// One member extent of a segment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberRecord {
    pub slot: u32,
    pub start_block: u64,
    /// While being rebuilt: rows below this are valid on the member.
    #[serde(default)]
    pub rebuild_cursor_rows: Option<u64>,
    /// While the member is being moved: the extent it is being copied to. The member itself
    /// (`slot`, `start_block`) stays where it is, complete, until the commit that ends the move.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub move_to: Option<ExtentRecord>,
    /// While the member is being moved: rows below this were copied to `move_to` when it was
    /// committed (a restart copies again those an intent bit marks, and resumes here; docs/
    /// design/pool-growth.md, "Resuming a move"). 0 when not moving.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub move_cursor_rows: u64,
    /// The extent the member was moved away from, still reserved until a later commit (reads
    /// that started before the move ended may still be reading it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moved_from: Option<ExtentRecord>,
}

impl MemberRecord {
    /// A member at `start_block` of drive `slot`, not being rebuilt or moved.
    pub fn at(slot: u32, start_block: u64) -> MemberRecord {
        MemberRecord {
            slot,
            start_block,
            rebuild_cursor_rows: None,
            move_to: None,
            move_cursor_rows: 0,
            moved_from: None,
        }
    }

    /// True while the member is being moved or its old extent is still reserved (its records
    /// count the rows of its segment as it is).
    pub fn in_motion(&self) -> bool {
        self.move_to.is_some() || self.moved_from.is_some()
    }

    /// Ends the member's move, if any (its destination and cursor); returns the destination.
    pub fn take_move(&mut self) -> Option<ExtentRecord> {
        self.move_cursor_rows = 0;
        self.move_to.take()
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// An extent of a drive that a member reserves besides its own (same length as the member's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExtentRecord {
    pub slot: u32,
    pub start_block: u64,
}

/// A rebalance the operator asked for (`pool rebalance`), kept until it has nothing left to
/// move so that a restart resumes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RebalanceRecord {
    /// Bytes copied per second at most (0: no limit besides the QoS dispatcher).
    pub rate_bytes_per_sec: u64,
}

/// One instance of the layout over `rows` rows of its members.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentRecord {
    pub rows: u64,
    pub members: Vec<MemberRecord>,
}

/// What a volume is for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum VolumeRole {
    /// A volume clients see.
    Plain,
    /// A part of a tiered volume (`cache`, `meta` or `capacity`), not exported on its own.
    TierPart { tiered: String, part: String },
}

/// A volume as the pool remembers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeRecord {
    pub id: u64,
    pub name: String,
    pub size_bytes: u64,
    pub layout: Layout,
    pub chunk_blocks: u32,
    pub class: DriveClass,
    pub role: VolumeRole,
    pub segments: Vec<SegmentRecord>,
}

/// A tiered volume: three engine volumes and the tiering parameters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TieredRecord {
    pub name: String,
    pub size_bytes: u64,
    pub cache_volume: u64,
    pub meta_volume: u64,
    pub capacity_volume: u64,
    /// Parameters owned by the tiering code (kept opaque here so it can evolve on its own).
    #[serde(default)]
    pub params: serde_json::Value,
    /// Set while this volume is being made to replace plain volume `replaces` (`volume
    /// convert`, docs/design/convert.md): until [`crate::Pool::adopt_tiered`] commits, the plain
    /// volume is the real one, and open deletes this one if it finds the plain volume still
    /// there (absent: an ordinary volume).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replaces: Option<String>,
}

/// The whole pool metadata document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolMeta {
    pub pool_uuid: Uuid,
    pub name: String,
    pub generation: u64,
    pub created_unix_secs: u64,
    pub next_volume_id: u64,
    pub next_slot: u32,
    pub drives: Vec<DriveRecord>,
    pub volumes: Vec<VolumeRecord>,
    #[serde(default)]
    pub tiered: Vec<TieredRecord>,
    /// QoS settings per client-visible volume name (absent: none). A name with no volume (a
    /// crash between a delete and this entry's removal) is ignored and overwritten at create.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub qos: std::collections::BTreeMap<String, QosSpec>,
    /// What `pool calibrate` measured (absent: never calibrated).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calibration: Option<Calibration>,
    /// A rebalance in progress (absent: none asked for).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rebalance: Option<RebalanceRecord>,
    /// The rebuild bandwidth limit `drive rebuild-rate` set, bytes per second (absent, or 0: no
    /// limit). Kept here so that it outlives the daemon that was told.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rebuild_rate_bytes_per_sec: Option<u64>,
    /// Per record of the document, the generation of the commit that last changed it
    /// (pool/store.rs names the records: `pool`, `ids`, `volume/NAME`, `tiered/NAME`,
    /// `qos/NAME`). A record with no entry has not changed since records got generations.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub record_generations: std::collections::BTreeMap<String, u64>,
}

/// A volume's QoS settings (docs/design/qos.md). Rates are per second; absent means none.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QosSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iops_limit: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bw_limit: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iops_reserve: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bw_reserve: Option<u64>,
    /// Share of what is left once reservations are met (default 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
}

impl QosSpec {
    /// The weight a volume without one has.
    pub const DEFAULT_WEIGHT: u32 = 100;

    /// True when nothing is set.
    pub fn is_empty(&self) -> bool {
        *self == QosSpec::default()
    }

    /// True when a reservation is set.
    pub fn reserves(&self) -> bool {
        self.iops_reserve.is_some() || self.bw_reserve.is_some()
    }
}

/// What one drive class delivered to `pool calibrate`, through a raid0 volume over all of its
/// active drives: 4 KiB random reads and writes at queue depth 32 and 1 MiB sequential ones at
/// queue depth 4.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClassCalibration {
    pub class: DriveClass,
    pub drives: u32,
    pub read_iops: u64,
    pub write_iops: u64,
    pub read_bytes_per_sec: u64,
    pub write_bytes_per_sec: u64,
    /// Mean latency of the 4 KiB random reads at queue depth 32 (the dispatcher's window).
    pub read_latency_us: u64,
}

/// The pool's calibration: one entry per drive class that has active drives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Calibration {
    pub measured_unix_secs: u64,
    pub classes: Vec<ClassCalibration>,
}

impl Calibration {
    /// The figures of `class`, if it was measured.
    pub fn class(&self, class: DriveClass) -> Option<&ClassCalibration> {
        self.classes.iter().find(|c| c.class == class)
    }
}

impl PoolMeta {
    /// The record of the drive in `slot`.
    pub fn drive(&self, slot: u32) -> Option<&DriveRecord> {
        self.drives.iter().find(|d| d.slot == slot)
    }

    /// The record of the volume called `name`.
    pub fn volume(&self, name: &str) -> Option<&VolumeRecord> {
        self.volumes.iter().find(|v| v.name == name)
    }

    /// Encodes the container (header + JSON), padded to whole blocks.
    pub fn encode(&self, slot_bytes: u64) -> Result<Vec<u8>, FormatError> {
        let payload = serde_json::to_vec(self).map_err(|e| FormatError::BadPayload(e.to_string()))?;
        let len_bytes = (HEADER_BYTES + payload.len()) as u64;
        if len_bytes > slot_bytes {
            return Err(FormatError::MetadataTooLarge { len_bytes, slot_bytes });
        }
        let mut w = Writer::new(HEADER_BYTES);
        w.bytes(MAGIC);
        w.u64(self.generation);
        w.bytes(self.pool_uuid.as_bytes());
        w.u32(u32::try_from(payload.len()).expect("payload fits its slot"));
        w.u32(crc32c::crc32c(&payload));
        w.zeros(20);
        debug_assert_eq!(w.position(), 60);
        let mut out = w.finish();
        let header_crc = crc32c::crc32c(&out[..60]);
        out[60..64].copy_from_slice(&header_crc.to_le_bytes());
        out.extend_from_slice(&payload);
        out.resize(out.len().next_multiple_of(4096), 0);
        Ok(out)
    }

    /// Reads the header of a slot: `(generation, pool_uuid, payload_bytes)`.
    pub fn decode_header(header: &[u8]) -> Result<(u64, Uuid, usize, u32), FormatError> {
        if header.len() < HEADER_BYTES || &header[..8] != MAGIC {
            return Err(FormatError::NotStria);
        }
        let stored = u32::from_le_bytes(header[60..64].try_into().expect("4 bytes"));
        if crc32c::crc32c(&header[..60]) != stored {
            return Err(FormatError::BadChecksum("metadata header"));
        }
        let mut r = Reader::new(&header[8..]);
        let generation = r.u64();
        let pool_uuid = r.uuid();
        let payload_bytes = r.u32() as usize;
        let payload_crc = r.u32();
        Ok((generation, pool_uuid, payload_bytes, payload_crc))
    }

    /// Decodes a whole slot (header and payload).
    pub fn decode(slot: &[u8]) -> Result<PoolMeta, FormatError> {
        let (generation, pool_uuid, payload_bytes, payload_crc) = PoolMeta::decode_header(slot)?;
        let payload = slot
            .get(HEADER_BYTES..HEADER_BYTES + payload_bytes)
            .ok_or(FormatError::BadField("metadata length beyond its slot"))?;
        if crc32c::crc32c(payload) != payload_crc {
            return Err(FormatError::BadChecksum("metadata payload"));
        }
        let meta: PoolMeta =
            serde_json::from_slice(payload).map_err(|e| FormatError::BadPayload(e.to_string()))?;
        if meta.generation != generation || meta.pool_uuid != pool_uuid {
            return Err(FormatError::BadField("metadata header and payload disagree"));
        }
        Ok(meta)
    }
}

/// A sample document for unit tests elsewhere in the crate.
#[cfg(test)]
pub(crate) mod tests_support {
    pub(crate) fn sample() -> super::PoolMeta {
        super::tests::sample()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn sample() -> PoolMeta {
        PoolMeta {
            pool_uuid: Uuid::from_u128(9),
            name: "tank".into(),
            generation: 3,
            created_unix_secs: 1,
            next_volume_id: 2,
            next_slot: 1,
            drives: vec![DriveRecord {
                slot: 0,
                uuid: Uuid::from_u128(5),
                class: DriveClass::Fast,
                domain: String::new(),
                state: DriveState::Active,
                failed_reason: None,
                path_hint: "/tmp/d0".into(),
                data_blocks: 1000,
                errors: DriveErrors {
                    read_errors: ErrorCount { count: 2, last_unix_secs: 1_700_000_000 },
                    ..DriveErrors::default()
                },
                draining: true,
                out: Some(OutRecord { generation: 9, since_unix_secs: 4, epoch: 7, regions: vec![1, 5] }),
            }],
            volumes: vec![VolumeRecord {
                id: 1,
                name: "v".into(),
                size_bytes: 1 << 20,
                layout: Layout::Ec { data_shards: 4, parity_shards: 2 },
                chunk_blocks: 16,
                class: DriveClass::Capacity,
                role: VolumeRole::Plain,
                segments: vec![SegmentRecord {
                    rows: 4,
                    members: vec![
                        MemberRecord { rebuild_cursor_rows: Some(2), ..MemberRecord::at(0, 0) },
                        MemberRecord {
                            move_to: Some(ExtentRecord { slot: 2, start_block: 64 }),
                            move_cursor_rows: 3,
                            moved_from: Some(ExtentRecord { slot: 3, start_block: 128 }),
                            ..MemberRecord::at(1, 0)
                        },
                    ],
                }],
            }],
            tiered: vec![],
            qos: Default::default(),
            calibration: None,
            rebalance: Some(RebalanceRecord { rate_bytes_per_sec: 1 << 20 }),
            rebuild_rate_bytes_per_sec: Some(200 << 20),
            record_generations: Default::default(),
        }
    }

    #[test]
    fn a_document_without_a_rebuild_rate_reads_as_none() {
        let mut old = serde_json::to_value(sample()).unwrap();
        old.as_object_mut().unwrap().remove("rebuild_rate_bytes_per_sec");
        let m: PoolMeta = serde_json::from_value(old).unwrap();
        assert_eq!(m.rebuild_rate_bytes_per_sec, None);
        let none = PoolMeta { rebuild_rate_bytes_per_sec: None, ..sample() };
        let text = serde_json::to_string(&none).unwrap();
        assert!(!text.contains("rebuild_rate"), "an unset rate is not written: {text}");
    }

    #[test]
    fn round_trips_through_the_container() {
        let m = sample();
        let bytes = m.encode(1 << 20).unwrap();
        assert_eq!(bytes.len() % 4096, 0);
        assert_eq!(PoolMeta::decode(&bytes).unwrap(), m);
    }

    #[test]
    fn drive_records_without_error_counters_still_decode() {
        let old = r#"{"slot": 0, "uuid": "00000000-0000-0000-0000-000000000005", "class": "fast",
            "state": "active", "data_blocks": 1000}"#;
        let rec: DriveRecord = serde_json::from_str(old).unwrap();
        assert!(rec.errors.is_zero());
    }

    #[test]
    fn error_counts_add_up_and_keep_the_latest_time() {
        let mut total = ErrorCount { count: 3, last_unix_secs: 50 };
        total.add(ErrorCount { count: 0, last_unix_secs: 90 });
        assert_eq!(total, ErrorCount { count: 3, last_unix_secs: 50 }, "an empty delta changes nothing");
        total.add(ErrorCount { count: 2, last_unix_secs: 40 });
        assert_eq!(total, ErrorCount { count: 5, last_unix_secs: 50 });
        total.add(ErrorCount { count: 1, last_unix_secs: 70 });
        assert_eq!(total, ErrorCount { count: 6, last_unix_secs: 70 });
    }

    #[test]
    fn corruption_anywhere_is_detected() {
        let bytes = sample().encode(1 << 20).unwrap();
        let json_len = bytes.iter().rposition(|&b| b != 0).unwrap();
        for at in [0usize, 10, 40, 61, 64, 100, json_len] {
            let mut bad = bytes.clone();
            bad[at] ^= 1;
            assert!(PoolMeta::decode(&bad).is_err(), "flip at {at} not detected");
        }
    }

    #[test]
    fn too_large_metadata_is_an_error() {
        assert!(matches!(sample().encode(128), Err(FormatError::MetadataTooLarge { .. })));
    }

    #[test]
    fn layouts_know_their_shape() {
        let ec = Layout::Ec { data_shards: 4, parity_shards: 2 };
        assert_eq!((ec.members(), ec.data_columns(), ec.tolerance()), (6, 4, 2));
        let r10 = Layout::Raid10 { width: 3, copies: 2 };
        assert_eq!((r10.members(), r10.data_columns(), r10.tolerance()), (6, 3, 1));
        assert_eq!(ec.to_string(), "ec:4+2");
        assert!(Layout::Raid1 { copies: 1 }.validate().is_err());
    }
}
