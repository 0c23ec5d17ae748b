//! Pools: a set of drives with one metadata document, and the volumes carved from them.

pub(crate) mod alloc;
mod assemble;
pub(crate) mod core;
mod csum_cache;
mod epochs;
mod errors;
mod moves;
mod qos;
mod rebuild;
mod recovery;
mod resync;
mod scrub;
mod status;
pub(crate) mod store;
mod suspend;

use crate::volume::member::MemberDrive;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::RwLock;
use stria_dev::{BLOCK_BYTES as BLOCK, BlockDevice};
use stria_ec::ReedSolomon;
use uuid::Uuid;

use self::core::PoolCore;
use self::epochs::EpochBook;
use crate::drive::Drive;
use crate::error::EngineError;
use crate::format::layout::DriveLayout;
use crate::format::meta::{
    DriveClass, DriveErrors, DriveRecord, DriveState, Layout, MemberRecord, PoolMeta, SegmentRecord,
    TieredRecord, VolumeRecord, VolumeRole,
};
use crate::format::superblock::Superblock;
pub(crate) use crate::time::now_unix_secs;
use crate::units::format_size;
use crate::volume::map::{Geometry, Member, NOT_REBUILDING, Segment, VolumeMap};
use crate::volume::{Family, Volume, VolumeState};

pub use moves::{BALANCE_SLACK, MOVE_CURSOR_STEP_BYTES, MoveProgress, RebalanceReport, RebalanceStatus};
pub use rebuild::RebuildProgress;
pub use recovery::RecoveryReport;
pub use resync::{Comeback, RebuildCounters};
pub use scrub::ScrubReport;
pub use status::{DriveStatus, IgnoredDrive, PoolStatus, VolumeStatus};
pub use store::CommitGuard;

/// Default chunk (stripe height): 64 KiB.
pub const DEFAULT_CHUNK_BYTES: u64 = 64 << 10;
/// Largest chunk: a partial-stripe journal record must fit one record.
pub const MAX_CHUNK_BYTES: u64 = 2 << 20;

/// A device to format as a new pool member.
#[derive(Debug)]
pub struct NewDrive<D> {
    pub dev: D,
    /// Where it was found (for messages and as a hint to find it again).
    pub path: String,
    pub class: DriveClass,
    /// Failure-domain label; empty makes the drive its own domain.
    pub domain: String,
    /// The device is known to read as zeros (a new sparse file): skip zeroing tables.
    pub fresh: bool,
}

/// A device found when assembling a pool.
#[derive(Debug)]
pub struct FoundDrive<D> {
    pub dev: D,
    pub path: String,
}

/// What to create.
#[derive(Debug, Clone)]
pub struct VolumeSpec {
    pub name: String,
    pub size_bytes: u64,
    pub layout: Layout,
    pub chunk_bytes: u64,
    pub class: DriveClass,
    pub role: VolumeRole,
}

/// An open pool.
pub struct Pool<D: BlockDevice> {
    pub(crate) core: Arc<PoolCore<D>>,
    volumes: RwLock<BTreeMap<String, Arc<Volume<D>>>>,
    codecs: parking_lot::Mutex<HashMap<(usize, usize), Arc<ReedSolomon>>>,
    recovery: RecoveryReport,
    /// Drives found but left out at assembly, with the reason.
    ignored: Vec<(String, String)>,
    /// Rebuild bandwidth limit in bytes per second (0 = unlimited).
    pub(crate) rebuild_rate_bytes: AtomicU64,
    pub(crate) closed: AtomicBool,
    /// Serialises [`Pool::clear_suspension`] calls.
    clearing: tokio::sync::Mutex<()>,
    /// Per-volume QoS (see `pool/qos.rs`).
    qos: Arc<crate::qos::Dispatcher>,
    /// The extent being moved, if any (see `pool/moves.rs`).
    moving: parking_lot::Mutex<Option<moves::ActiveMove<D>>>,
    /// Extent moves finished since the pool was opened.
    moves_done: AtomicU64,
    /// Bytes a move copies between commits of its cursor (it also commits every 2 s).
    move_cursor_step: AtomicU64,
    /// Source extents whose intent bits are held since their move's shadow was dropped while
    /// the move stayed recorded with a cursor (pool/moves.rs): (drive, first block, blocks).
    cursor_pins: parking_lot::Mutex<Vec<moves::CursorPin<D>>>,
    /// Bytes of members the rebuilds copied, and bytes a delta resync found unchanged and
    /// skipped, since the pool was opened.
    rebuild_copied_bytes: AtomicU64,
    rebuild_skipped_bytes: AtomicU64,
}

impl<D: BlockDevice> std::fmt::Debug for Pool<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool").field("core", &self.core).finish()
    }
}

/// Refuses a volume name the pool would not take (clones of log volumes, which are not engine
/// volumes, are named by the same rule). A name is an export name and an argument on command
/// lines, so it must start with a letter or a digit: `-rf` would read as options to `stria` and
/// to every tool it is passed to, and `.x` as a hidden or relative path. Only new names are
/// checked: volumes of older pools keep the names they were made with.
pub fn check_volume_name(name: &str) -> Result<(), EngineError> {
    let ok = name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    if ok {
        Ok(())
    } else {
        Err(EngineError::Invalid(format!(
            "volume name `{name}` is invalid: use 1-64 letters, digits, `-`, `_` or `.`, starting with a \
             letter or a digit (a name starting with `-` reads as an option, one starting with `.` as a \
             hidden file)"
        )))
    }
}

/// The largest volume: 2^60 bytes (1024 PiB). Sizes derived from a volume's (a log-structured
/// volume's segment space, 1.5 times it by default; its map, 1/256 of it) and byte offsets within
/// it stay far from overflowing a u64.
pub const VOLUME_BYTES_MAX: u64 = 1 << 60;

/// Refuses a volume size the pool would not take: zero, not whole 4 KiB blocks, or above
/// [`VOLUME_BYTES_MAX`].
pub fn check_volume_size(size_bytes: u64) -> Result<(), EngineError> {
    if size_bytes > VOLUME_BYTES_MAX {
        return Err(EngineError::Invalid(format!(
            "volume size {size_bytes} bytes is too large: a volume is at most {} (2^60 bytes)",
            format_size(VOLUME_BYTES_MAX)
        )));
    }
    if size_bytes == 0 || !size_bytes.is_multiple_of(BLOCK) {
        return Err(EngineError::Invalid(format!(
            "volume size {size_bytes} bytes must be a non-zero multiple of 4 KiB"
        )));
    }
    Ok(())
}

/// Refuses a chunk (stripe height) that is not a power of two from 4 KiB to the largest a volume
/// takes.
pub fn check_chunk_size(chunk_bytes: u64) -> Result<(), EngineError> {
    if !(BLOCK..=MAX_CHUNK_BYTES).contains(&chunk_bytes) || !chunk_bytes.is_power_of_two() {
        return Err(EngineError::Invalid(format!(
            "chunk size {} is invalid: use a power of two from 4 KiB to {}",
            format_size(chunk_bytes),
            format_size(MAX_CHUNK_BYTES)
        )));
    }
    Ok(())
}

impl<D: BlockDevice> Pool<D> {
    /// Formats `drives` as a new pool called `name`.
    pub async fn create(name: &str, drives: Vec<NewDrive<D>>) -> Result<Pool<D>, EngineError> {
        if drives.is_empty() {
            return Err(EngineError::NoDrives);
        }
        if name.is_empty() || name.len() > 64 {
            return Err(EngineError::Invalid("pool name must be 1-64 bytes".into()));
        }
        let pool_uuid = Uuid::new_v4();
        let created = now_unix_secs();
        let mut opened = Vec::new();
        let mut records = Vec::new();
        for (slot, nd) in drives.into_iter().enumerate() {
            let slot = u32::try_from(slot).expect("slot fits");
            let layout = DriveLayout::for_new_drive(nd.dev.size_bytes())
                .map_err(|e| EngineError::Invalid(format!("{}: {e}", nd.path)))?;
            let sb = Superblock {
                pool_uuid,
                drive_uuid: Uuid::new_v4(),
                slot,
                class: nd.class,
                generation: 1,
                layout,
                created_unix_secs: created,
                domain: nd.domain.clone(),
                pool_name: name.to_string(),
                committed_generation: 0,
                format_version: crate::format::superblock::FORMAT_VERSION,
            };
            records.push(DriveRecord {
                slot,
                uuid: sb.drive_uuid,
                class: nd.class,
                domain: nd.domain,
                state: DriveState::Active,
                failed_reason: None,
                path_hint: nd.path,
                data_blocks: layout.data_blocks(),
                errors: DriveErrors::default(),
                draining: false,
                out: None,
            });
            opened.push(Arc::new(Drive::format(nd.dev, sb, nd.fresh).await?));
        }
        let meta = PoolMeta {
            pool_uuid,
            name: name.to_string(),
            generation: 0,
            created_unix_secs: created,
            next_volume_id: 1,
            next_slot: u32::try_from(records.len()).expect("fits"),
            drives: records,
            volumes: vec![],
            tiered: vec![],
            qos: Default::default(),
            calibration: None,
            rebalance: None,
            rebuild_rate_bytes_per_sec: None,
            record_generations: Default::default(),
        };
        let book = EpochBook::from_records(opened.iter().map(|d| (d.slot(), None)));
        let core = Arc::new(PoolCore::new(meta, opened, 1, 0, book));
        core.update(|_| Ok(((), true))).await?;
        Ok(Pool::from_core(core, RecoveryReport::default()))
    }

    pub(crate) fn from_core(core: Arc<PoolCore<D>>, recovery: RecoveryReport) -> Pool<D> {
        let meta = core.meta();
        let qos = crate::qos::Dispatcher::new(meta.calibration.clone());
        for (name, spec) in &meta.qos {
            qos.set(name, *spec);
        }
        Pool {
            qos,
            core,
            volumes: RwLock::new(BTreeMap::new()),
            codecs: parking_lot::Mutex::new(HashMap::new()),
            recovery,
            ignored: Vec::new(),
            rebuild_rate_bytes: AtomicU64::new(meta.rebuild_rate_bytes_per_sec.unwrap_or(0)),
            closed: AtomicBool::new(false),
            clearing: tokio::sync::Mutex::new(()),
            moving: parking_lot::Mutex::new(None),
            moves_done: AtomicU64::new(0),
            move_cursor_step: AtomicU64::new(moves::MOVE_CURSOR_STEP_BYTES),
            cursor_pins: parking_lot::Mutex::new(Vec::new()),
            rebuild_copied_bytes: AtomicU64::new(0),
            rebuild_skipped_bytes: AtomicU64::new(0),
        }
    }

    /// The committed metadata.
    pub fn meta(&self) -> Arc<PoolMeta> {
        self.core.meta()
    }

    /// What recovery found and did when the pool was opened.
    pub fn recovery_report(&self) -> &RecoveryReport {
        &self.recovery
    }

    /// Drives found but left out when the pool was opened ([`Pool::open_skipping`]): (path,
    /// reason).
    pub fn ignored_drives(&self) -> &[(String, String)] {
        &self.ignored
    }

    /// Every drive of the pool (failed and missing ones included).
    pub fn drives(&self) -> Arc<Vec<Arc<Drive<D>>>> {
        self.core.drives()
    }

    /// The volume called `name`.
    pub fn volume(&self, name: &str) -> Option<Arc<Volume<D>>> {
        self.volumes.read().get(name).cloned()
    }

    /// The volume with id `id`.
    pub fn volume_by_id(&self, id: u64) -> Option<Arc<Volume<D>>> {
        self.volumes.read().values().find(|v| v.id() == id).cloned()
    }

    /// All volumes, by name.
    pub fn volumes(&self) -> Vec<Arc<Volume<D>>> {
        self.volumes.read().values().cloned().collect()
    }

    fn codec(&self, layout: Layout) -> Option<Arc<ReedSolomon>> {
        let Layout::Ec { data_shards, parity_shards } = layout else { return None };
        let key = (data_shards as usize, parity_shards as usize);
        let mut codecs = self.codecs.lock();
        Some(
            codecs
                .entry(key)
                .or_insert_with(|| Arc::new(ReedSolomon::new(key.0, key.1).expect("layout validated")))
                .clone(),
        )
    }

    /// Builds the in-memory map of a volume record.
    pub(crate) fn build_map(&self, rec: &VolumeRecord) -> Result<VolumeMap<D>, EngineError> {
        let geo = Geometry { layout: rec.layout, chunk_blocks: u64::from(rec.chunk_blocks) };
        let mut first_block = 0;
        let mut segments = Vec::new();
        for seg in &rec.segments {
            let members = seg
                .members
                .iter()
                .map(|m| {
                    let drive = self.core.drive(m.slot).ok_or_else(|| {
                        EngineError::Invalid(format!(
                            "volume {} refers to unknown drive slot {}",
                            rec.name, m.slot
                        ))
                    })?;
                    let cursor = m.rebuild_cursor_rows.unwrap_or(NOT_REBUILDING);
                    Ok(Member {
                        drive,
                        start_block: m.start_block,
                        rebuild_cursor: AtomicU64::new(cursor),
                        rebuild_cursor_durable: AtomicU64::new(cursor),
                    })
                })
                .collect::<Result<Vec<_>, EngineError>>()?;
            segments.push(Segment { first_block, rows: seg.rows, members });
            first_block += seg.rows * geo.row_blocks();
        }
        Ok(VolumeMap { segments, total_blocks: rec.size_bytes / BLOCK })
    }

    pub(crate) fn install_volume(&self, rec: &VolumeRecord) -> Result<Arc<Volume<D>>, EngineError> {
        let vol = self.new_handle(rec)?;
        self.volumes.write().insert(rec.name.clone(), Arc::clone(&vol));
        Ok(vol)
    }

    /// A handle of the volume `rec` describes, not installed (the pool hands out the installed
    /// one).
    fn new_handle(&self, rec: &VolumeRecord) -> Result<Arc<Volume<D>>, EngineError> {
        let map = self.build_map(rec)?;
        let vol = Arc::new(Volume::new(
            rec.id,
            rec.name.clone(),
            rec.class,
            Geometry { layout: rec.layout, chunk_blocks: u64::from(rec.chunk_blocks) },
            map,
            Arc::clone(&self.core) as Arc<dyn crate::volume::host::VolumeHost>,
            Family::new(rec.layout, self.codec(rec.layout)),
        ));
        Ok(vol)
    }

    /// Cuts the segments of volumes made before placement units into units where they lie
    /// (`alloc::split_into_units`), so that the rebalance can move them a unit at a time. Run at
    /// open, before any request can hold a run or stripe lock of the old segments. Only an
    /// optimisation of placement: if the commit fails, the volumes stay as they were.
    async fn cut_old_segments_into_units(&self) -> Result<(), EngineError> {
        let cut = self
            .core
            .update(|m| {
                let names = alloc::split_into_units(m);
                let changed = !names.is_empty();
                Ok((names, changed))
            })
            .await;
        match cut {
            Ok(names) => {
                for name in names {
                    let segments = self.core.meta().volume(&name).map_or(0, |v| v.segments.len());
                    tracing::info!(volume = %name, segments, "volume made before placement units cut into units");
                    // The handle's segments must be the record's: moves and rebuilds name
                    // segments by their index in both.
                    if self.volume(&name).is_some() {
                        self.refresh_volume(&name)?;
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "old volumes not cut into placement units; they stay whole"),
        }
        Ok(())
    }

    /// Re-reads a volume's members from the committed metadata (after a replace or resize).
    pub(crate) fn refresh_volume(&self, name: &str) -> Result<(), EngineError> {
        let meta = self.core.meta();
        let rec = meta.volume(name).ok_or_else(|| EngineError::NoSuchVolume(name.into()))?;
        let vol = self.volume(name).ok_or_else(|| EngineError::NoSuchVolume(name.into()))?;
        vol.install_map(self.build_map(rec)?);
        Ok(())
    }

    /// Creates a volume.
    pub async fn create_volume(&self, spec: VolumeSpec) -> Result<Arc<Volume<D>>, EngineError> {
        self.create_volume_with(spec, true, true).await
    }

    /// Creates a volume as builds before placement units did: one segment, each member one
    /// extent of the whole member size. Only for tests of what open does with such volumes
    /// (cuts them into units); not part of the API.
    #[doc(hidden)]
    pub async fn create_volume_whole(&self, spec: VolumeSpec) -> Result<Arc<Volume<D>>, EngineError> {
        self.create_volume_with(spec, true, false).await
    }

    /// Creates a volume whose blocks are not made to read as zeros first: an extent reused from
    /// a deleted volume may return that volume's old data where nothing was written yet (scrub
    /// may also find its old rows inconsistent and fix them). Only for owners that never read a
    /// block before writing it (the calibration's scratch volumes); it spares the create a
    /// checksum-page write per 4 MiB of every member. (Log-structured volumes clear all three
    /// parts: see `stria_tier::log::create`.)
    pub async fn create_volume_unzeroed(&self, spec: VolumeSpec) -> Result<Arc<Volume<D>>, EngineError> {
        self.create_volume_with(spec, false, true).await
    }

    async fn create_volume_with(
        &self,
        spec: VolumeSpec,
        zero: bool,
        in_units: bool,
    ) -> Result<Arc<Volume<D>>, EngineError> {
        check_volume_name(&spec.name)?;
        spec.layout.validate().map_err(EngineError::Invalid)?;
        let chunk = spec.chunk_bytes;
        check_chunk_size(chunk)?;
        check_volume_size(spec.size_bytes)?;
        let chunk_blocks = u32::try_from(chunk / BLOCK).expect("bounded");
        let row_blocks = u64::from(spec.layout.data_columns()) * u64::from(chunk_blocks);
        let rows = (spec.size_bytes / BLOCK).div_ceil(row_blocks);
        let spec2 = spec.clone();
        let rec = self
            .core
            .update_volume(&spec.name, move |m| {
                if m.volume(&spec2.name).is_some() || m.tiered.iter().any(|t| t.name == spec2.name) {
                    return Err(EngineError::VolumeExists(spec2.name.clone()));
                }
                // In placement units, each placed against the free space the ones before left
                // (docs/design/pool-growth.md, "Placement units").
                let unit = match in_units {
                    true => alloc::rows_per_unit(m, spec2.class, u64::from(chunk_blocks)),
                    false => rows,
                };
                m.volumes.push(VolumeRecord {
                    id: m.next_volume_id,
                    name: spec2.name.clone(),
                    size_bytes: spec2.size_bytes,
                    layout: spec2.layout,
                    chunk_blocks,
                    class: spec2.class,
                    role: spec2.role.clone(),
                    segments: Vec::new(),
                });
                m.next_volume_id += 1;
                let what =
                    format!("volume {} ({}, {})", spec2.name, spec2.layout, format_size(spec2.size_bytes));
                let add = |m: &mut PoolMeta, rows: u64, members: Vec<MemberRecord>| {
                    let rec = m.volumes.last_mut().expect("just pushed");
                    rec.segments.push(SegmentRecord { rows, members });
                };
                let units = alloc::Units {
                    layout: spec2.layout,
                    class: spec2.class,
                    chunk_blocks: u64::from(chunk_blocks),
                    rows,
                    unit,
                };
                alloc::place_units(m, units, &what, add)?;
                let rec = m.volumes.last().expect("just pushed").clone();
                Ok((rec, true))
            })
            .await?;
        // The extents may hold an old volume's checksums: make sure they read as zeros, durably,
        // before anyone can write (the extents were freed with their entries cleared, but a
        // crash could have left them set).
        if zero {
            self.clear_extents(&rec).await?;
            self.core.flush_all().await?;
        }
        self.install_volume(&rec)
    }

    async fn clear_extents(&self, rec: &VolumeRecord) -> Result<(), EngineError> {
        for seg in &rec.segments {
            self.clear_segment(rec, seg).await?;
        }
        Ok(())
    }

    async fn clear_segment(&self, rec: &VolumeRecord, seg: &SegmentRecord) -> Result<(), EngineError> {
        for m in &seg.members {
            if let Some(d) = self.core.drive(m.slot).filter(|d| !d.is_failed()) {
                d.zero(m.start_block, seg.rows * u64::from(rec.chunk_blocks)).await?;
            }
        }
        Ok(())
    }

    /// Deletes a volume; its extents return to free space.
    pub async fn delete_volume(&self, name: &str) -> Result<(), EngineError> {
        let vol = self.volume(name).ok_or_else(|| EngineError::NoSuchVolume(name.into()))?;
        let meta = self.core.meta();
        let rec = meta.volume(name).ok_or_else(|| EngineError::NoSuchVolume(name.into()))?.clone();
        if let VolumeRole::TierPart { tiered, .. } = &rec.role
            && meta.tiered.iter().any(|t| &t.name == tiered)
        {
            return Err(EngineError::Busy(format!(
                "volume {name} is part of tiered volume {tiered}; delete {tiered} instead"
            )));
        }
        vol.close();
        self.drop_shadow_of(name);
        // Journal records of this volume must not be replayed onto a future owner of its extents.
        self.core.flush_all().await?;
        self.clear_extents(&rec).await?;
        self.core.flush_all().await?;
        let name2 = name.to_string();
        self.core
            .update_volume(name, move |m| {
                m.volumes.retain(|v| v.name != name2);
                Ok(((), true))
            })
            .await?;
        self.volumes.write().remove(name);
        Ok(())
    }

    /// Closes plain volume `name` for a conversion (docs/design/convert.md): new requests are
    /// refused (`Closed`), every request that got past the check before is waited for, and the
    /// pool is flushed, so everything acknowledged to it is on its drives and nothing changes
    /// it any more. Returns the one handle that still reads it (not handed out by
    /// [`Pool::volume`]: the caller's, to copy it). [`Pool::reopen_volume`] undoes it.
    pub async fn close_volume(&self, name: &str) -> Result<Arc<Volume<D>>, EngineError> {
        let vol = self.volume(name).ok_or_else(|| EngineError::NoSuchVolume(name.into()))?;
        vol.close();
        // A request that entered before the close may not have seen it: wait for all of those.
        self.core.ops.grace().await;
        self.core.flush_all().await?;
        let meta = self.core.meta();
        self.new_handle(meta.volume(name).ok_or_else(|| EngineError::NoSuchVolume(name.into()))?)
    }

    /// Opens volume `name` again after [`Pool::close_volume`] (a conversion that failed): a
    /// new handle from its record; the closed one keeps refusing.
    pub fn reopen_volume(&self, name: &str) -> Result<Arc<Volume<D>>, EngineError> {
        let meta = self.core.meta();
        let rec = meta.volume(name).ok_or_else(|| EngineError::NoSuchVolume(name.into()))?;
        self.install_volume(rec)
    }

    /// Makes tiered volume `temp` take the place of plain volume `plain`, in one metadata
    /// commit (docs/design/convert.md, step 5): `plain`'s record goes (its extents become
    /// free, not cleared), `temp`'s record becomes `plain`'s with its `replaces` mark removed,
    /// and its parts `temp.P` are renamed `plain.P`. `temp` must have been made with
    /// `replaces: Some(plain)`, `plain` closed by [`Pool::close_volume`], and the tiered
    /// volume's owner closed (its parts are installed again under their new names).
    pub async fn adopt_tiered(&self, temp: &str, plain: &str) -> Result<(), EngineError> {
        let (temp2, plain2) = (temp.to_string(), plain.to_string());
        let renamed = self
            .core
            .update(move |m| {
                let (temp, plain) = (temp2, plain2);
                let t = m
                    .tiered
                    .iter()
                    .position(|t| t.name == temp)
                    .ok_or(EngineError::NoSuchVolume(temp.clone()))?;
                if m.tiered[t].replaces.as_deref() != Some(plain.as_str()) {
                    return Err(EngineError::Invalid(format!(
                        "tiered volume {temp} was not made to replace {plain}"
                    )));
                }
                if !m.volume(&plain).is_some_and(|v| v.role == VolumeRole::Plain) {
                    return Err(EngineError::NoSuchVolume(plain));
                }
                m.volumes.retain(|v| v.name != plain);
                m.tiered[t].name = plain.clone();
                m.tiered[t].replaces = None;
                let mut renamed = Vec::new();
                for v in &mut m.volumes {
                    if let VolumeRole::TierPart { tiered, part } = &mut v.role
                        && *tiered == temp
                    {
                        let suffix = v.name.strip_prefix(&temp).unwrap_or(&format!(".{part}")).to_string();
                        let name = format!("{plain}{suffix}");
                        renamed.push((std::mem::replace(&mut v.name, name.clone()), name));
                        tiered.clone_from(&plain);
                    }
                }
                Ok((renamed, true))
            })
            .await?;
        self.drop_shadow_of(plain);
        self.volumes.write().remove(plain);
        let meta = self.core.meta();
        for (old, new) in renamed {
            self.drop_shadow_of(&old);
            if let Some(v) = self.volumes.write().remove(&old) {
                v.close();
            }
            let rec = meta.volume(&new).ok_or_else(|| EngineError::NoSuchVolume(new.clone()))?;
            self.install_volume(rec)?;
        }
        Ok(())
    }

    /// Grows or shrinks a volume to `new_size_bytes`. Shrinking discards the tail.
    pub async fn resize_volume(&self, name: &str, new_size_bytes: u64) -> Result<(), EngineError> {
        self.resize_volume_with(name, new_size_bytes, true).await
    }

    /// [`Pool::resize_volume`] for a volume made by [`Pool::create_volume_unzeroed`]: rows added
    /// or removed are not cleared (the owner never reads a block it did not write), so a resize
    /// costs one metadata commit and no I/O per byte.
    pub async fn resize_volume_unzeroed(&self, name: &str, new_size_bytes: u64) -> Result<(), EngineError> {
        self.resize_volume_with(name, new_size_bytes, false).await
    }

    async fn resize_volume_with(
        &self,
        name: &str,
        new_size_bytes: u64,
        zero: bool,
    ) -> Result<(), EngineError> {
        check_volume_size(new_size_bytes)?;
        let vol = self.volume(name).ok_or_else(|| EngineError::NoSuchVolume(name.into()))?;
        let rec =
            self.core.meta().volume(name).ok_or_else(|| EngineError::NoSuchVolume(name.into()))?.clone();
        if rec.segments.iter().any(|s| s.members.iter().any(|m| m.rebuild_cursor_rows.is_some())) {
            return Err(EngineError::Busy(format!(
                "volume {name} is rebuilding; resize it when the rebuild is done"
            )));
        }
        let row_blocks = u64::from(rec.layout.data_columns()) * u64::from(rec.chunk_blocks);
        let have_rows: u64 = rec.segments.iter().map(|s| s.rows).sum();
        let need_rows = (new_size_bytes / BLOCK).div_ceil(row_blocks);
        let mut shrunk = rec.clone();
        shrunk.size_bytes = new_size_bytes;
        let freed =
            if need_rows < have_rows { shrink_rows(&mut shrunk, have_rows - need_rows) } else { Vec::new() };
        if !freed.is_empty() {
            if zero {
                // Everything past the new end must read back as zeros if it is ever reused.
                for seg in &freed {
                    self.clear_segment(&rec, seg).await?;
                }
            }
            // Journal records of the tail must not be replayed onto a later owner of its extents.
            self.core.flush_all().await?;
        }
        // A growth that must read as zeros: rows first (the size unchanged, so nothing reads
        // them), cleared, flushed, and only then the size. Every row past those the old size
        // uses is cleared, also rows a growth a crash cut short left (allocated, uncleared):
        // with the size committed first, such a crash left the new tail reading whatever its
        // extents held before (another volume's stripes, a log volume's given-back segments).
        let old_rows = (rec.size_bytes / BLOCK).div_ceil(row_blocks);
        let rec = if zero && need_rows > old_rows {
            let staged = if need_rows > have_rows {
                let (name2, rec2) = (name.to_string(), rec.clone());
                self.core
                    .update_volume(name, move |m| {
                        if m.volume(&name2) != Some(&rec2) {
                            return Err(EngineError::Busy(format!(
                                "volume {name2} changed while it was being resized; try again"
                            )));
                        }
                        let mut grown = rec2.clone();
                        grow_rows(m, &mut grown, need_rows - have_rows)?;
                        let slot = m.volumes.iter_mut().find(|v| v.name == name2).expect("checked above");
                        *slot = grown.clone();
                        Ok((grown, true))
                    })
                    .await?
            } else {
                rec
            };
            self.clear_rows(&staged, old_rows, need_rows).await?;
            self.core.flush_all().await?;
            staged
        } else {
            rec
        };
        let have_rows: u64 = rec.segments.iter().map(|s| s.rows).sum();
        // New extents are placed under the metadata lock, against the free space of the moment
        // (two growths at once must not take the same extents).
        let (name2, rec2) = (name.to_string(), rec.clone());
        let next = self
            .core
            .update_volume(name, move |m| {
                if m.volume(&name2) != Some(&rec2) {
                    return Err(EngineError::Busy(format!(
                        "volume {name2} changed while it was being resized; try again"
                    )));
                }
                let next = if need_rows > have_rows {
                    let mut grown = rec2.clone();
                    grown.size_bytes = new_size_bytes;
                    grow_rows(m, &mut grown, need_rows - have_rows)?;
                    grown
                } else if need_rows < have_rows {
                    shrunk
                } else {
                    // The rows are there (a growth staged them above): only the size changes.
                    let mut same = rec2.clone();
                    same.size_bytes = new_size_bytes;
                    same
                };
                let slot = m.volumes.iter_mut().find(|v| v.name == name2).expect("checked above");
                *slot = next.clone();
                Ok((next, true))
            })
            .await?;
        vol.install_map(self.build_map(&next)?);
        Ok(())
    }

    /// Clears rows `from..to` of volume `rec` (counted over its segments in order): their
    /// checksum entries say unwritten, so they read as zeros once flushed.
    async fn clear_rows(&self, rec: &VolumeRecord, from: u64, to: u64) -> Result<(), EngineError> {
        let mut at = 0;
        for seg in &rec.segments {
            let (lo, hi) = (at, at + seg.rows);
            let (a, b) = (from.max(lo), to.min(hi));
            if a < b {
                self.clear_segment(rec, &rows_after(&seg.members, a - lo, b - a, rec.chunk_blocks)).await?;
            }
            at = hi;
        }
        Ok(())
    }

    /// Records a tiered volume (its three parts must exist).
    pub async fn add_tiered(&self, rec: TieredRecord) -> Result<(), EngineError> {
        let scope = rec.name.clone();
        self.core
            .update_volume(&scope, move |m| {
                if m.tiered.iter().any(|t| t.name == rec.name) || m.volume(&rec.name).is_some() {
                    return Err(EngineError::VolumeExists(rec.name.clone()));
                }
                m.tiered.push(rec);
                Ok(((), true))
            })
            .await
    }

    /// Updates the parameters of a tiered volume.
    pub async fn update_tiered(&self, name: &str, params: serde_json::Value) -> Result<(), EngineError> {
        self.change_tiered(name, move |t| {
            let changed = t.params != params;
            t.params = params;
            changed
        })
        .await
    }

    /// Changes tiered volume `name`'s record with `f` (which says whether it changed anything:
    /// nothing is committed otherwise).
    async fn change_tiered(
        &self,
        name: &str,
        f: impl FnOnce(&mut TieredRecord) -> bool + Send + 'static,
    ) -> Result<(), EngineError> {
        let scope = name;
        let name = name.to_string();
        self.core
            .update_volume(scope, move |m| {
                let t =
                    m.tiered.iter_mut().find(|t| t.name == name).ok_or(EngineError::NoSuchVolume(name))?;
                Ok(((), f(t)))
            })
            .await
    }

    /// Sets the size a tiered volume's record says (its own header has it first: the tier
    /// resizes, then records).
    pub async fn set_tiered_size(&self, name: &str, size_bytes: u64) -> Result<(), EngineError> {
        self.change_tiered(name, move |t| {
            let changed = t.size_bytes != size_bytes;
            t.size_bytes = size_bytes;
            changed
        })
        .await
    }

    /// Removes a tiered volume's record (its parts are deleted separately, after).
    pub async fn remove_tiered(&self, name: &str) -> Result<(), EngineError> {
        let scope = name;
        let name = name.to_string();
        self.core
            .update_volume(scope, move |m| {
                let before = m.tiered.len();
                m.tiered.retain(|t| t.name != name);
                if m.tiered.len() == before {
                    return Err(EngineError::NoSuchVolume(name));
                }
                Ok(((), true))
            })
            .await
    }

    /// The volumes on the drive in `slot` that could not be read whole if it failed (no other
    /// copy or enough parity left), each with its state now. What `drive fail` refuses to do
    /// without `--force`, and what `drive replace` would have nothing to rebuild from.
    pub fn volumes_lost_without(&self, slot: u32) -> Vec<(String, VolumeState)> {
        self.volumes()
            .into_iter()
            .filter(|v| v.uses_drive(slot) && v.state_if_failed(slot) == VolumeState::Failed)
            .map(|v| (v.name().to_string(), v.state()))
            .collect()
    }

    /// Makes every later metadata commit ask `guard` first (a cluster coordinator's ownership
    /// check; docs/design/cluster.md §4.1). False if a guard is set already.
    pub fn set_commit_guard(&self, guard: Arc<dyn CommitGuard>) -> bool {
        self.core.set_guard(guard)
    }

    /// Fails a drive by hand (`stria drive fail`).
    pub async fn fail_drive(&self, slot: u32, reason: &str) -> Result<(), EngineError> {
        if self.core.drive(slot).is_none() {
            return Err(EngineError::NoSuchDrive(format!("slot {slot}")));
        }
        self.core.fail_drive(slot, reason.to_string()).await
    }

    /// Makes every completed write of every volume durable.
    pub async fn flush(&self) -> Result<(), EngineError> {
        self.core.flush_all().await
    }

    /// Housekeeping to call every few seconds: resynchronises what checksum pages found damaged
    /// cover, flushes drives with dirty regions and clears the intent bits of idle, flushed
    /// regions, and commits the drives' error counters when they changed (one metadata commit
    /// at most).
    pub async fn tick(&self) -> Result<(), EngineError> {
        // While suspended the bits mark what a failed write may have left inconsistent: they
        // stay until the suspension is cleared (pool/suspend.rs).
        if self.core.suspension().is_some() {
            return Ok(());
        }
        self.repair_damaged_csum_pages().await?;
        // FUA writes into blocks the drive's checksum pages already mark written leave those
        // pages for later (drive/mod.rs `write_inner`): a pool flush writes them back and lets
        // the bits of the regions they cover be cleared. It also raises the flush epoch, so a
        // copy of a drive that missed writes acknowledged only as FUA is told apart once this
        // tick has run (docs/design/stale-copies.md). With nothing written since the last pool
        // flush there is nothing to do.
        if self.core.drives().iter().any(|d| !d.is_failed() && d.was_written()) {
            self.core.flush_all().await?;
        }
        for d in self.core.drives().iter().filter(|d| !d.is_failed()) {
            if let Err(e) = d.clear_idle_intents(false).await {
                self.core.drive_error(d.slot(), "intent bitmap write failed", &e).await?;
            }
        }
        self.core.commit_drive_errors().await?;
        Ok(())
    }

    /// Clean shutdown: refuse new requests, wait for those in progress, commit the drives'
    /// error counters, flush everything and clear every intent bit, so the next open needs no
    /// resynchronisation. The bits may only be cleared once nothing can write any more: a write
    /// finishing after the final flush would leave its checksum entries unwritten in a region
    /// marked clean.
    pub async fn close(&self) -> Result<(), EngineError> {
        self.closed.store(true, Ordering::Relaxed);
        self.core.ops.close().await;
        for v in self.volumes() {
            v.close();
        }
        // Committed before the final flush; a failed commit (no metadata majority) must not keep
        // the pool from closing cleanly, so it is reported after the flush.
        let counters = self.core.commit_drive_errors().await;
        if let Some(reason) = self.core.suspension() {
            // No flush can succeed and no intent bit may be cleared: the next open resyncs the
            // marked regions, as after a crash. Nothing acknowledged needs this flush (a client
            // whose flush failed knows its writes are not durable).
            tracing::warn!(%reason, "closing a suspended pool: the next open resynchronises what the failed writes touched");
            return counters.map(|_| ());
        }
        self.core.flush_all().await?;
        for d in self.core.drives().iter().filter(|d| !d.is_failed()) {
            if let Err(e) = d.clear_idle_intents(true).await {
                // Everything is durable; a bit left set only costs a resync at the next open.
                self.core.drive_error(d.slot(), "intent bitmap write", &e).await?;
            }
        }
        // Every clean close commits (and confirms) a generation: a copy of a drive taken at any
        // moment of this session is behind it, and is never trusted again
        // (docs/design/stale-copies.md).
        let committed = self.core.update(|_| Ok(((), true))).await;
        counters?;
        committed
    }

    /// The newest flush epoch confirmed of the drive in `slot` (docs/design/stale-copies.md): a
    /// copy of that drive taken before the flush that confirmed it is never trusted.
    pub fn flush_epoch_confirmed(&self, slot: u32) -> u64 {
        self.core.flush_epoch_confirmed(slot)
    }

    /// The newest metadata generation confirmed on every drive active in it: a drive whose
    /// superblock is behind it is never trusted (docs/on-disk-format.md §2).
    pub fn confirmed_generation(&self) -> u64 {
        self.core.confirmed_generation()
    }
}

/// Adds `extra` rows at the end of volume `next`: its last segment grown in place up to a
/// placement unit when every member can grow where it is, the rest as new segments of a unit at
/// most, placed like the volume's. `meta` holds `next`'s record as the placement goes.
fn grow_rows(meta: &mut PoolMeta, next: &mut VolumeRecord, mut extra: u64) -> Result<(), EngineError> {
    let chunk = u64::from(next.chunk_blocks);
    let (layout, class) = (next.layout, next.class);
    let unit = alloc::rows_per_unit(meta, class, chunk);
    // The last segment grows in place while it stays within a unit (docs/design/pool-growth.md,
    // "Placement units"); the rest comes in new units.
    let last = next.segments.last_mut().expect("a volume has a segment");
    let room = unit.saturating_sub(last.rows).min(extra);
    let extend_in_place = room > 0
        && last.members.iter().all(|m| {
            meta.drive(m.slot).is_some_and(|d| {
                d.state == DriveState::Active
                    && alloc::can_extend(
                        meta,
                        m.slot,
                        d.data_blocks,
                        m.start_block,
                        last.rows * chunk,
                        room * chunk,
                    )
            })
        });
    if extend_in_place {
        last.rows += room;
        extra -= room;
    }
    if extra == 0 {
        return Ok(());
    }
    let adding = extra * chunk * u64::from(layout.data_columns()) * BLOCK;
    let what = format!("{} more of volume {} ({layout})", format_size(adding), next.name);
    // Placed against the units placed before it: the record as it grows stands in the document
    // (the caller stores it there in the end anyway).
    let sync = |meta: &mut PoolMeta, next: &VolumeRecord| {
        if let Some(slot) = meta.volumes.iter_mut().find(|v| v.name == next.name) {
            *slot = next.clone();
        }
    };
    sync(meta, next);
    let units = alloc::Units { layout, class, chunk_blocks: chunk, rows: extra, unit };
    alloc::place_units(meta, units, &what, |meta, rows, members| {
        next.segments.push(SegmentRecord { rows, members });
        sync(meta, next);
    })
}

/// Removes `excess` rows from the end of volume `next` (dropping or shortening segments; the
/// first segment always stays); returns the rows removed, which must be cleared.
fn shrink_rows(next: &mut VolumeRecord, mut excess: u64) -> Vec<SegmentRecord> {
    let mut freed = Vec::new();
    while excess > 0 {
        let segments = next.segments.len();
        let last = next.segments.last_mut().expect("segments remain");
        if last.rows <= excess && segments > 1 {
            excess -= last.rows;
            freed.push(next.segments.pop().expect("checked"));
        } else {
            let keep = last.rows - excess;
            freed.push(rows_after(&last.members, keep, excess, next.chunk_blocks));
            last.rows = keep;
            excess = 0;
        }
    }
    freed
}

/// The `rows` rows of a segment on `members` that follow its first `skip_rows` rows.
fn rows_after(members: &[MemberRecord], skip_rows: u64, rows: u64, chunk_blocks: u32) -> SegmentRecord {
    let members = members
        .iter()
        .map(|m| {
            let mut t = m.clone();
            t.start_block += skip_rows * u64::from(chunk_blocks);
            t
        })
        .collect();
    SegmentRecord { rows, members }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stria_dev::IoBytes;
    use stria_dev::mem::MemDevice;

    /// Drives that held another pool's write-hole journal join this pool as replacements: none
    /// of the old pool's records may ever be replayed into this one. (Found by the cluster
    /// scenarios: two slices released by one ec volume and claimed in turn by another; a
    /// takeover replayed 278 of the old volume's journal transactions into the new one, and
    /// reads returned the other volume's data. A formatted journal starts at sequence 1 in
    /// session 1 at the ring's start, as the old one had, so the old records looked like its
    /// own; with this test as it is, 32 blocks changed at the first open.)
    #[tokio::test]
    async fn a_replacement_that_held_another_pools_journal_replays_none_of_it() {
        let devs = |p: &str| -> Vec<Arc<MemDevice>> {
            (0..3).map(|i| Arc::new(MemDevice::new(&format!("{p}{i}"), 64 << 20))).collect()
        };
        let new_drive = |d: &Arc<MemDevice>, fresh| NewDrive {
            dev: Arc::clone(d),
            path: d.name().to_string(),
            class: DriveClass::Capacity,
            domain: d.name().to_string(),
            fresh,
        };
        let spec = |name: &str| VolumeSpec {
            name: name.into(),
            size_bytes: 1 << 20,
            layout: Layout::Ec { data_shards: 2, parity_shards: 1 },
            chunk_bytes: 16 << 10,
            class: DriveClass::Capacity,
            role: VolumeRole::Plain,
        };
        // Pool a: journaled sub-stripe writes, then a clean close.
        let a = devs("a");
        let pa = Pool::create("a", a.iter().map(|d| new_drive(d, true)).collect()).await.unwrap();
        let mut va = pa.create_volume(spec("x")).await.unwrap();
        let mut pa = pa;
        for session in 0..3u8 {
            for i in 0..100u64 {
                va.write((i % 256) * 4096, IoBytes::copy_from(&[0x11 + session; 4096]), true).await.unwrap();
            }
            drop(va);
            drop(pa);
            let found =
                a.iter().map(|d| FoundDrive { dev: Arc::clone(d), path: d.name().to_string() }).collect();
            pa = Pool::open(found).await.unwrap();
            va = pa.volume("x").unwrap();
        }
        drop(va);
        pa.close().await.unwrap();
        // Pool b: its own data; a's third drive replaces b's third.
        let b = devs("b");
        let pb = Pool::create("b", b.iter().map(|d| new_drive(d, true)).collect()).await.unwrap();
        let vb = pb.create_volume(spec("y")).await.unwrap();
        vb.write(0, IoBytes::copy_from(&vec![0x22; 1 << 20]), true).await.unwrap();
        // Two of a's drives replace two of b's, one after the other (each rebuilt before the next
        // goes): a's transactions then have all their pieces in b.
        for (i, joining) in a.iter().enumerate().skip(1) {
            let name = format!("b{i}");
            let slot = pb.meta().drives.iter().find(|d| d.path_hint == name).unwrap().slot;
            pb.fail_drive(slot, "test").await.unwrap();
            pb.replace_drive(slot, new_drive(joining, false)).await.unwrap();
            pb.rebuild(|_| {}).await.unwrap();
        }
        drop(vb);
        let mut pb = pb;
        // Unclean stops: each open recovers from the journals and starts a new session, whose
        // number the old pool's sessions on that drive also had.
        for open in 0..4 {
            drop(pb);
            let found = [&b[0], &a[1], &a[2]]
                .into_iter()
                .map(|d| FoundDrive { dev: Arc::clone(d), path: d.name().to_string() })
                .collect();
            pb = Pool::open(found).await.unwrap();
            let got = pb.volume("y").unwrap().read(0, 1 << 20).await.unwrap();
            let bad = got.chunks(4096).filter(|b| b.iter().any(|&x| x != 0x22)).count();
            assert_eq!(bad, 0, "open {open}: blocks of y changed: {:?}", pb.recovery_report());
        }
    }

    #[test]
    fn a_volume_name_starts_with_a_letter_or_a_digit() {
        for bad in ["-rf", "--force", ".hidden", "_x", "", "a/b", "a b", "v@s", &"x".repeat(65)] {
            assert!(check_volume_name(bad).is_err(), "`{bad}` was taken");
        }
        for good in ["vm", "9", "db-1", "a.b_c-d", &"x".repeat(64)] {
            check_volume_name(good).unwrap_or_else(|e| panic!("`{good}`: {e}"));
        }
        let e = check_volume_name("-rf").unwrap_err().to_string();
        assert!(e.contains("starting with a letter or a digit"), "{e}");
    }

    #[test]
    fn a_volume_size_has_a_limit_that_is_named() {
        check_volume_size(VOLUME_BYTES_MAX).expect("the largest volume");
        let e = check_volume_size(u64::MAX - 4095).unwrap_err().to_string();
        assert!(e.contains("too large") && e.contains("1024 PiB"), "{e}");
        assert!(check_volume_size(0).is_err() && check_volume_size(4097).is_err());
    }

    /// A pool named `t` of `n` fresh 64 MiB memory drives `m0`, `m1`, ..., each its own failure
    /// domain.
    async fn memory_pool(n: usize) -> (Vec<Arc<MemDevice>>, Pool<Arc<MemDevice>>) {
        let devs: Vec<Arc<MemDevice>> =
            (0..n).map(|i| Arc::new(MemDevice::new(&format!("m{i}"), 64 << 20))).collect();
        let drives = devs
            .iter()
            .map(|d| NewDrive {
                dev: Arc::clone(d),
                path: d.name().to_string(),
                class: DriveClass::Capacity,
                domain: d.name().to_string(),
                fresh: true,
            })
            .collect();
        (devs, Pool::create("t", drives).await.expect("create"))
    }

    /// Names were first checked only for their characters: a pool may hold a volume called
    /// `-rf`. Such a pool still opens and serves that volume; only new names are refused.
    #[tokio::test]
    async fn a_volume_named_before_the_rule_still_opens() {
        let (devs, pool) = memory_pool(2).await;
        let spec = VolumeSpec {
            name: "rf".into(),
            size_bytes: 1 << 20,
            layout: Layout::Raid1 { copies: 2 },
            chunk_bytes: DEFAULT_CHUNK_BYTES,
            class: DriveClass::Capacity,
            role: VolumeRole::Plain,
        };
        pool.create_volume(spec).await.expect("create volume");
        // What an older stria wrote when asked for `volume create -- -rf`.
        pool.core
            .update(|m| {
                m.volumes.iter_mut().find(|v| v.name == "rf").expect("rf").name = "-rf".into();
                Ok(((), true))
            })
            .await
            .expect("rename");
        pool.close().await.expect("close");
        drop(pool);
        let found =
            devs.iter().map(|d| FoundDrive { dev: Arc::clone(d), path: d.name().to_string() }).collect();
        let pool = Pool::open(found).await.expect("a pool with a volume named -rf opens");
        let vol = pool.volume("-rf").expect("the volume keeps its name");
        vol.write(0, IoBytes::copy_from(&[7u8; 4096]), true).await.expect("write");
        assert!(vol.read(0, 4096).await.expect("read").iter().all(|&b| b == 7));
        pool.close().await.expect("close");
    }

    /// A flush of a volume's drives counts durable only the stripe transactions whose every
    /// drive it flushed. A move's switch may point a member at another drive after a flush's
    /// caller named the volume's drives; a transaction applied on the new drive since must keep
    /// holding the volume's mark back (so recovery replays it) until a flush holds that drive.
    /// Simulation seed 167478: the mark passed such a transaction, a checkpoint released its
    /// journal records, a power cut lost its piece on the new drive, and a degraded stripe
    /// decoded bytes never written.
    #[tokio::test]
    async fn a_volume_flush_counts_durable_only_transactions_on_drives_it_flushed() {
        let (_devs, pool) = memory_pool(4).await;
        let spec = VolumeSpec {
            name: "x".into(),
            size_bytes: 1 << 20,
            layout: Layout::Ec { data_shards: 2, parity_shards: 1 },
            chunk_bytes: 16 << 10,
            class: DriveClass::Capacity,
            role: VolumeRole::Plain,
        };
        let vol = pool.create_volume(spec).await.expect("create volume");
        let members = vol.member_slots();
        let elsewhere = (0..4).find(|s| !members.contains(s)).expect("a drive outside the volume");
        let core = &pool.core;
        let id = vol.id();
        let slot = |s: u32| u16::try_from(s).expect("slot fits");
        let txn = core.next_txn_id(id, &[slot(members[0]), slot(elsewhere)]).expect("a transaction id");
        core.txn_done(txn);
        core.flush(core::FlushScope::Volume { id, slots: &members }).await.expect("volume flush");
        assert!(
            core.watermarks().of(id) < txn,
            "a flush of drives {members:?} counted durable a transaction that wrote drive {elsewhere}"
        );
        let all: Vec<u32> = (0..4).collect();
        core.flush(core::FlushScope::Volume { id, slots: &all }).await.expect("flush of every drive");
        assert!(
            core.watermarks().of(id) >= txn,
            "a flush of every drive the transaction wrote left it pending"
        );
        drop(vol);
        pool.close().await.expect("close");
    }
}
