//! Log-structured volumes (docs/design/log-structured-volumes.md): data is never overwritten in
//! place. Host writes land in a mirrored write cache; the mover appends
//! cached blocks, any logical addresses, as whole stripes to an open *segment* of an ec segment
//! space, each batch of rows ending with a summary of what it holds; a paged, logged map
//! ([`crate::map::MapStore`]) says where each logical block lives; GC moves the live blocks of
//! mostly-dead segments into new whole stripes and frees them. Space is allocated on write and
//! given back by TRIM / WRITE_ZEROES.
//!
//! Parts (engine volumes of the pool): `<name>.meta` (mirrored: header, map log, map pages),
//! `<name>.cache` (mirrored: the write-cache ring), `<name>.seg` (ec: the segment space). Layout
//! `tiered:ec:K+M` puts meta and cache on the fast drives, `log:ec:K+M` on the capacity drives.
//!
//! Write order, per path (docs/crash-consistency.md, "Log-structured volumes"):
//! * host write: data to the cache (FUA) -> map update `block -> Cache(pos)` (durable) ->
//!   acknowledge -> free the block's old place;
//! * destage and GC: batch (data + summary) to the segment space (FUA) -> conditional map update
//!   "still where I read it" (durable) -> free the old places of the moves that applied;
//! * TRIM / zeroing: map update `block -> Unallocated / Zero` (durable) -> free the old places.
//!
//! So a map entry only ever points at durable data, and a place is reused only after no
//! durable map entry points at it.
//!
//! Files, by concern: `open` (create, open: replay over the persisted table or a map scan),
//! `header` (the metadata header), `write` and `read` (the host paths), `places` (map updates
//! and the freeing of the places they replaced), `mover` (the background tasks) with `destage`,
//! `gc` and `resize` (growing and shrinking the segment space), `space` (the in-memory segment
//! table and batch summaries), `table` (the segment table each checkpoint persists),
//! `snapshots` (snapshots and clones), `status`. The cache ring is `crate::ring`, the map
//! `crate::map`.

mod cache_growth;
mod cache_writes;
mod cas;
mod destage;
#[doc(hidden)]
pub mod fuzzing;
mod gc;
mod header;
mod heat;
mod mover;
mod open;
mod places;
mod ranges;
mod read;
mod resize;
mod size;
mod snapshots;
pub mod space;
mod status;
mod table;
mod write;

pub use open::{LogPlan, create, open, plan};
pub use space::GcPolicy;
pub use status::LogStatus;

use open::scan_map;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::Instant;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use stria_dev::{BLOCK_BYTES, BlockDevice, Counter};
use stria_engine::volume::bytes::{self};
use stria_engine::{DriveClass, Pool, Volume, VolumeError, VolumeState};

use crate::TierError;
use crate::map::{MapError, MapStore};
use crate::ring::CacheRing;
use space::{Geometry, Space, SpaceCounts};

/// The origin's head, as the layer argument of the write functions (a clone is its layer id).
pub const HEAD: u16 = 0;
/// Segments a new volume's space starts with (GC needs 6; the space grows as it fills).
pub(crate) const INITIAL_SEGMENTS: u64 = 16;
/// Locks taken by unaligned writes around their edge blocks.
const RMW_LOCKS: usize = 1024;

/// What to create.
#[derive(Debug, Clone)]
pub struct LogSpec {
    pub name: String,
    /// Logical size (may exceed the segment space: thin, over-committed).
    pub size_bytes: u64,
    pub data_shards: u32,
    pub parity_shards: u32,
    pub chunk_bytes: u64,
    /// Data bytes the segment space may grow to (default: 1.5 x the size, so a full volume
    /// fills 2/3); it is allocated from the pool as it fills.
    pub space_bytes: Option<u64>,
    /// Segments allocated at create (default 16, at least 6; the space grows as it fills).
    pub initial_segments: Option<u64>,
    /// Write cache. Default: it starts at [`INITIAL_CACHE_BYTES`] and grows, as writes need it,
    /// to an eighth of the size (64 MiB to 8 GiB; of the space where that is smaller).
    /// Given: that size, fixed, unless `cache_max_bytes` lets it grow.
    pub cache_bytes: Option<u64>,
    /// With `cache_bytes` given: what the cache may grow to (tests; default: it stays).
    pub cache_max_bytes: Option<u64>,
    /// Rows per batch (default: batches of about 2 MiB, less in small volumes).
    pub batch_rows: Option<u64>,
    /// Batches per segment (default: segments of 32 MiB of data, or a sixteenth of the space
    /// when that is less).
    pub segment_batches: Option<u64>,
    /// Blocks of the map log ring (default: 1/16 of the volume's blocks, 1024 to 65536: a
    /// larger ring means fewer checkpoints, each writing every dirty map page).
    pub map_log_blocks: Option<u64>,
    /// Map pages kept in memory (default 65536: 256 MiB).
    pub map_cache_pages: u64,
    /// Cache and map on the fast drives (`tiered:`; refused without two active fast drives)
    /// or on the capacity drives (`log:`).
    pub fast_tier: bool,
    /// Copies of the cache and the map (2 or 3).
    pub copies: u32,
    /// The plain volume this one is made to replace (`volume convert`; the pool record's
    /// `replaces`, docs/design/convert.md), if any.
    pub replaces: Option<String>,
    /// How GC picks victims and whether hot blocks get segments of their own (kept in the
    /// volume's record).
    pub gc: GcPolicy,
    /// When a write without FUA is acknowledged (kept in the volume's record).
    pub cache_mode: CacheMode,
}

impl LogSpec {
    /// A spec with the defaults.
    pub fn new(name: &str, size_bytes: u64, data_shards: u32, parity_shards: u32) -> LogSpec {
        LogSpec {
            name: name.into(),
            size_bytes,
            data_shards,
            parity_shards,
            chunk_bytes: crate::DEFAULT_TIER_CHUNK_BYTES,
            space_bytes: None,
            initial_segments: None,
            cache_bytes: None,
            cache_max_bytes: None,
            batch_rows: None,
            segment_batches: None,
            map_log_blocks: None,
            map_cache_pages: 65536,
            fast_tier: false,
            copies: 2,
            replaces: None,
            gc: GcPolicy::default(),
            cache_mode: CacheMode::default(),
        }
    }
}

/// The mover's policy (kept in the pool record; changeable at run time).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogParams {
    /// Always "log" (what the record describes).
    pub kind: LogKind,
    /// Destage starts above this fill of the cache (percent).
    pub start_percent: u8,
    /// Destage stops below this fill (percent).
    pub stop_percent: u8,
    /// Destage whenever a full batch is cached (tests).
    pub always: bool,
    /// Map pages kept in memory.
    pub map_cache_pages: u64,
    /// How GC picks its victims (records written before it existed: the default).
    #[serde(default)]
    pub gc: GcPolicy,
    /// Move nothing unless a writer waits for cache space (tests that want quiet drives between
    /// phases; not persisted).
    #[serde(skip)]
    pub hold: bool,
    /// Compact the segment space without waiting for writes to be quiet (simulations, whose
    /// runs are shorter than the wait; not persisted).
    #[serde(skip)]
    pub eager_compaction: bool,
    /// Write-back host writes ([`CacheMode::WriteBack`]; kept in the volume's record, records
    /// written before it existed: write-through): a write without FUA is acknowledged once its
    /// data is in the cache and its map update is applied and queued, durable at the next
    /// flush (docs/design/log-structured-volumes.md, "Host writes on a disk, and write-back").
    /// Only the head's writes (a clone's are write-through). `STRIA_WRITE_BACK=1` in the
    /// environment sets it at open for every log volume the process opens (benchmarks).
    #[serde(default)]
    pub write_back: bool,
    /// What the write cache may grow to (`LogVolume::grow_cache`); 0 (records written before
    /// it existed, and caches sized with `--cache`): it stays as it is.
    #[serde(default)]
    pub cache_max_bytes: u64,
}

/// Where a write cache of the default size starts: small, so that a thin volume takes little
/// fast-tier room before it is written (issue 39); it grows as writes need it.
pub const INITIAL_CACHE_BYTES: u64 = 8 << 20;

/// When a thin volume acknowledges a host write without FUA (`volume create --cache-mode`,
/// `volume set --cache-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CacheMode {
    /// Once it is durable: its data in the cache and its map change in the map's log.
    #[default]
    WriteThrough,
    /// Once its data is in the cache and its map change is applied in memory; durable at the
    /// next flush (or a few milliseconds later), as with a drive's volatile write cache. A FUA
    /// write is durable when acknowledged either way.
    WriteBack,
}

impl CacheMode {
    /// Every mode, as `--cache-mode` names them.
    pub const ALL: [CacheMode; 2] = [CacheMode::WriteThrough, CacheMode::WriteBack];

    /// The mode's name (`write-through`, `write-back`).
    pub fn name(self) -> &'static str {
        match self {
            CacheMode::WriteThrough => "write-through",
            CacheMode::WriteBack => "write-back",
        }
    }

    fn of(write_back: bool) -> CacheMode {
        if write_back { CacheMode::WriteBack } else { CacheMode::WriteThrough }
    }
}

impl std::fmt::Display for CacheMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for CacheMode {
    type Err = String;

    fn from_str(s: &str) -> Result<CacheMode, String> {
        CacheMode::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| format!("unknown cache mode `{s}`: expected write-through or write-back"))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogKind {
    Log,
}

/// Counters. Those every host request bumps are sharded ([`Counter`]: no cache line shared by
/// the cores that count); the mover's (destage and GC, bumped once per batch by the one task
/// that holds `gates.moving`, or once per resize) have a single writer at a time and stay plain
/// atomics. Both read with `load(Relaxed)`.
#[derive(Debug, Default)]
pub struct LogCounters {
    pub host_write_ops: Counter,
    pub host_write_bytes: Counter,
    pub host_read_ops: Counter,
    pub host_read_bytes: Counter,
    pub read_retries: Counter,
    /// Blocks read from the write cache and from the segment space.
    pub blocks_read_from_cache: Counter,
    pub blocks_read_from_segments: Counter,
    /// Writes into the cache ring (each one run of consecutive positions) and the batches
    /// they were written in ([`cache_writes`]: group commit of host writes).
    pub cache_writes: AtomicU64,
    pub cache_write_batches: AtomicU64,
    pub destage_batches: AtomicU64,
    /// Batches destage wrote into a segment the hot host stream opened ([`GcPolicy::Temperature`]).
    pub destage_hot_batches: AtomicU64,
    pub destaged_blocks: AtomicU64,
    /// Data slots written without a block (short batches).
    pub padded_slots: AtomicU64,
    pub gc_batches: AtomicU64,
    pub gc_moved_blocks: AtomicU64,
    /// Blocks GC read from its victims (data and summaries; a sparse victim's batches are read
    /// in the runs the map still holds, [`gc`]).
    pub gc_read_blocks: AtomicU64,
    pub gc_victims: AtomicU64,
    /// Moves that lost to a newer write (their slot is garbage at once).
    pub moves_lost: AtomicU64,
    /// Blocks of overcount (from a persisted table) forgotten on drained GC victims.
    pub overcount_forgotten: AtomicU64,
    /// Free segments given back to the pool.
    pub segments_given_back: AtomicU64,
    /// Growths of the write cache ([`cache_growth`]).
    pub cache_growths: AtomicU64,
}

/// A log-structured volume.
pub struct LogVolume<D: BlockDevice> {
    pub(crate) name: String,
    /// Changes only in [`LogVolume::resize`].
    pub(crate) size_bytes: AtomicU64,
    pub(crate) pool: Arc<Pool<D>>,
    pub(crate) parts: Parts<D>,
    /// The geometry at open: its `segments` (the bound the space may grow to) rises when the
    /// volume grows, and the live bound is the space's (`Space::max_segments`, or
    /// [`LogVolume::geometry`]); every other field is fixed.
    pub(crate) geo: Geometry,
    pub(crate) map: MapStore<D>,
    pub(crate) ring: Arc<CacheRing>,
    pub(crate) space: SpaceState,
    pub(crate) params: Mutex<LogParams>,
    /// Next write sequence (low 32 bits go into map entries and summaries).
    pub(crate) seq: Arc<AtomicU64>,
    /// How soon blocks are rewritten (for [`GcPolicy::Temperature`]).
    pub(crate) heat: heat::Heat,
    pub(crate) counters: LogCounters,
    pub(crate) clock: Clock,
    pub(crate) health: Health,
    pub(crate) gates: Gates,
    /// Whether open used the persisted segment table (else it scanned the map).
    opened_from_table: bool,
    /// Byte offset of the persisted segment table in the metadata part (shared with the
    /// checkpoint's table writer; moves when the volume grows).
    pub(crate) table_at: Arc<AtomicU64>,
    /// Host writes' cache pieces, written in batches.
    pub(crate) cache_writes: cache_writes::CacheWrites,
    pub(crate) cache_growth: cache_growth::CacheGrowth,
    /// Write-back host writes ([`LogParams::write_back`]).
    pub(crate) wb: Arc<WriteBack>,
}

/// Write-back host writes ([`LogParams::write_back`]): whether they are taken, the cache writes
/// completed without FUA and the flushes that make them durable, and the places replaced by
/// deltas not durable yet.
#[derive(Default)]
pub(crate) struct WriteBack {
    /// [`LogParams::write_back`], as last set.
    pub(crate) enabled: AtomicBool,
    /// Set once a write-back write was taken: flushes commit from then on.
    pub(crate) used: AtomicBool,
    /// Cache writes without FUA completed (a generation: bumped before the write's delta is
    /// queued, so the barrier before the log block carrying the delta flushes it).
    pub(crate) done: AtomicU64,
    /// `done` as it was when the last completed cache flush began.
    pub(crate) flushed: AtomicU64,
    pub(crate) flushing: tokio::sync::Mutex<()>,
    /// Wakes the committer when the queue below gains its first entry.
    pub(crate) wake: tokio::sync::Notify,
    /// The places write-back writes replaced, with the ticket of their deltas: freed once the
    /// map's durable deltas reach the ticket (until then a power cut brings them back).
    pub(crate) frees: Mutex<std::collections::VecDeque<(u64, Replaced)>>,
}

/// `(block, the map entry a write replaced)`: a place to free.
pub(crate) type Replaced = Vec<(u64, crate::map::MapEntry)>;

/// The three engine volumes of the pool a log volume is made of.
pub(crate) struct Parts<D: BlockDevice> {
    /// `<name>.meta` (mirrored): the header, the map (log and pages), the persisted segment
    /// table, the layer table and the snapshot page pool.
    pub(crate) meta: Arc<Volume<D>>,
    /// `<name>.cache` (mirrored): the blocks of the cache ring.
    pub(crate) cache: Arc<Volume<D>>,
    /// `<name>.seg` (ec): the segment space.
    pub(crate) seg: Arc<Volume<D>>,
}

/// The segment space: its table, and what the mover learnt about it.
pub(crate) struct SpaceState {
    /// The in-memory segment table (shared with the checkpoint's table writer).
    pub(crate) table: Arc<Mutex<Space>>,
    /// Set while live counts may be too high (opened from a persisted table, not recounted).
    pub(crate) counts_suspect: AtomicBool,
    /// Why the segment space could not grow the last time it tried (cleared when it grows).
    pub(crate) growth_failed: Mutex<Option<(String, Instant)>>,
    /// Set while destage cannot find space: writers that must wait for cache space get ENOSPC.
    pub(crate) no_space: Mutex<Option<String>>,
}

impl SpaceState {
    /// The segment table, locked (a leaf lock: never held across an await).
    pub(crate) fn lock(&self) -> parking_lot::MutexGuard<'_, Space> {
        self.table.lock()
    }
}

/// Whether the volume still takes requests: once closed or failed it stays so until reopened.
pub(crate) struct Health {
    pub(crate) closed: AtomicBool,
    /// Set when a map update failed: whether it is durable is unknown until the volume is
    /// reopened (replay says), so no place may be freed or reused: no more writes or moves.
    pub(crate) failure: Mutex<Option<String>>,
}

/// Time since open, and when the last host write, zeroing or trim came (compaction waits for
/// writes to be quiet).
pub(crate) struct Clock {
    pub(crate) started: Instant,
    pub(crate) last_write_ms: AtomicU64,
}

/// The locks that order a log volume's operations. Lock order, outer first: `snapshot_ops`,
/// `writes`, `ranges`, `rmw` (an unaligned write's edge blocks), `moving`, `settle`,
/// `pool_growth`; a path takes a subset in this order (a writer: `writes`, `ranges` shared,
/// `rmw`, `settle`; a compare and write: `writes`, `ranges` exclusive, `settle`; the mover:
/// `moving`, `settle`; a rollback: `snapshot_ops`, `writes`, `moving`; a snapshot or clone
/// delete: `snapshot_ops`, `deleter`, then per batch `settle` shared). The map's own locks are
/// inside all of them, and the parking_lot mutexes (the segment table, the params, the health
/// and space notes) are leaves, never held across an await.
pub(crate) struct Gates {
    /// One snapshot create, delete or rollback at a time (taken through
    /// [`LogVolume::snapshot_ops`], which first finishes the deletes left to the background).
    pub(crate) snapshot_ops: tokio::sync::Mutex<()>,
    /// Held (inside `snapshot_ops`) while marked deletes are being finished: close waits for
    /// the batch in progress, after which the delete stops (`MapStore::stop_deletes`).
    pub(crate) deleter: tokio::sync::Mutex<()>,
    /// Wakes the background deleter: a delete was marked.
    pub(crate) deletes_wanted: tokio::sync::Notify,
    /// The deleter is to free what a deleted origin's head holds alone (an origin delete left
    /// to it whose snapshots all stay for clones: no delete of theirs finishes to trigger it).
    pub(crate) free_head: std::sync::atomic::AtomicBool,
    /// Held shared by every host write, zeroing and trim from start to acknowledgement; making a
    /// snapshot holds it alone, so the snapshot holds every write acknowledged before, none after.
    pub(crate) writes: tokio::sync::RwLock<()>,
    /// Held shared over their range by host writes, zeroing and trims, exclusively by a compare
    /// and write (see `ranges`).
    pub(crate) ranges: ranges::RangeLocks,
    /// Locks taken by unaligned writes around their edge blocks.
    pub(crate) rmw: Box<[tokio::sync::Mutex<()>]>,
    /// The mover's GC state, held while a destage or GC batch runs (close waits for it).
    pub(crate) moving: tokio::sync::Mutex<gc::Gc>,
    /// Held shared by writers (and snapshot and clone deletes) from their map update until
    /// they have freed the places it replaced, exclusively by the mover when it must know that
    /// no such free is pending (a restored cache position found stale: the writer that replaced
    /// its entry may still be about to free it; a recount; an overcount forgotten).
    pub(crate) settle: tokio::sync::RwLock<()>,
    /// One growth of the snapshot page pool at a time.
    pub(crate) pool_growth: tokio::sync::Mutex<()>,
    /// A clone being shrunk and its new size: I/O past it is refused before the size is
    /// durable (a checkpoint may write the record at any time, so the record changes only once
    /// the tail is discarded).
    pub(crate) clone_shrinking: parking_lot::Mutex<Option<(u16, u64)>>,
    /// One change of the persisted settings (the cache mode) at a time.
    pub(crate) settings: tokio::sync::Mutex<()>,
}

impl<D: BlockDevice> std::fmt::Debug for LogVolume<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogVolume").field("name", &self.name).field("size_bytes", &self.size_bytes()).finish()
    }
}

fn map_error(name: &str, e: MapError) -> VolumeError {
    match e {
        MapError::Volume(v) => v,
        // A read of a snapshot or clone that was deleted under it (or before it): the layer is
        // closed, no data is lost.
        MapError::LayerGone { layer } => VolumeError::Closed(format!("{name} (layer {layer}, deleted)")),
        other => VolumeError::Unrecoverable {
            volume: name.into(),
            offset_bytes: 0,
            len_bytes: 0,
            reason: other.to_string(),
        },
    }
}

impl<D: BlockDevice> LogVolume<D> {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn size_bytes(&self) -> u64 {
        self.size_bytes.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Blocks the family's map covers: the origin's size, or more once a clone grew past it
    /// (GC, restores and the cache take blocks of any layer up to here).
    pub(crate) fn blocks(&self) -> u64 {
        self.map.blocks()
    }

    /// `tiered:ec:K+M` when cache and map are on fast drives, `log:ec:K+M` otherwise.
    pub fn layout(&self) -> String {
        let fast =
            self.pool.meta().volume(self.parts.cache.name()).is_some_and(|r| r.class == DriveClass::Fast);
        format!("{}:{}", if fast { "tiered" } else { "log" }, self.parts.seg.layout())
    }

    pub fn counters(&self) -> &LogCounters {
        &self.counters
    }

    /// Whether open took live counts and cached blocks from the persisted segment table (else it
    /// scanned the whole map).
    pub fn opened_from_table(&self) -> bool {
        self.opened_from_table
    }

    /// The segment space's geometry (with the segments it may grow to now).
    pub fn geometry(&self) -> Geometry {
        Geometry { segments: self.space.lock().max_segments(), ..self.geo }
    }

    pub fn params(&self) -> LogParams {
        *self.params.lock()
    }

    /// When host writes without FUA are acknowledged.
    pub fn cache_mode(&self) -> CacheMode {
        CacheMode::of(self.params().write_back)
    }

    /// Sets the cache mode, durably (the volume's record) and at once. Switching to
    /// write-through first makes every write acknowledged so far durable.
    pub async fn set_cache_mode(&self, mode: CacheMode) -> Result<(), TierError> {
        let _one_at_a_time = self.gates.settings.lock().await;
        let write_back = mode == CacheMode::WriteBack;
        let rec = self.pool.meta().tiered.iter().find(|t| t.name == self.name).cloned();
        let rec = rec.ok_or_else(|| TierError::Invalid(format!("volume {} has no record", self.name)))?;
        let mut persisted: LogParams = serde_json::from_value(rec.params).map_err(|e| {
            TierError::Corrupt { name: self.name.clone(), reason: format!("bad parameters: {e}") }
        })?;
        persisted.write_back = write_back;
        self.pool
            .update_tiered(&self.name, serde_json::to_value(persisted).expect("params serialize"))
            .await?;
        self.set_params(LogParams { write_back, ..self.params() });
        if !write_back && self.wb.used.load(Relaxed) {
            self.commit_write_back().await?;
        }
        Ok(())
    }

    /// Changes the mover's policy and write-back (not persisted: [`Self::set_cache_mode`]
    /// persists the cache mode).
    pub fn set_params(&self, p: LogParams) {
        *self.params.lock() = p;
        self.wb.enabled.store(p.write_back, Relaxed);
        self.ring.hungry.notify_one();
    }

    /// Map pages a snapshot or clone delete lets go of per batch (128 unless set): host writes
    /// wait for one batch, not the delete. For tests, which set it small so that writes land
    /// between batches.
    #[doc(hidden)]
    pub fn set_delete_batch(&self, pages: usize) {
        self.map.set_delete_batch(pages);
    }

    /// The map's counters (log writes, deltas, checkpoints, cache).
    pub fn map_stats(&self) -> crate::map::MapStats {
        self.map.stats()
    }

    /// The segment space's counts.
    pub fn space_counts(&self) -> SpaceCounts {
        self.space.lock().counts()
    }

    /// The three parts: metadata, cache, segment space.
    pub fn parts(&self) -> [&Arc<Volume<D>>; 3] {
        [&self.parts.meta, &self.parts.cache, &self.parts.seg]
    }

    pub(crate) fn now_ms(&self) -> u64 {
        u64::try_from(self.clock.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn check_range(&self, offset_bytes: u64, len_bytes: u64) -> Result<(), VolumeError> {
        self.check_range_of(HEAD, offset_bytes, len_bytes)
    }

    /// [`Self::check_range`] against the size of the head ([`HEAD`]) or of snapshot or clone
    /// `layer`.
    fn check_range_of(&self, layer: u16, offset_bytes: u64, len_bytes: u64) -> Result<(), VolumeError> {
        if self.health.closed.load(Relaxed) {
            return Err(VolumeError::Closed(self.name.clone()));
        }
        bytes::check_range(offset_bytes, len_bytes, self.layer_bytes(layer))
    }

    /// The logical size of the head ([`HEAD`]), or of snapshot or clone `layer` (its size when
    /// it was made: a volume that grew since keeps its snapshots at their sizes). A layer that
    /// is gone answers the head's size (what reads of it then find says it is gone).
    pub fn layer_bytes(&self, layer: u16) -> u64 {
        if layer == HEAD {
            return self.size_bytes();
        }
        let bytes = self.map.layer_record(layer).map_or_else(|| self.size_bytes(), |r| r.logical_bytes);
        match *self.gates.clone_shrinking.lock() {
            Some((id, to)) if id == layer => bytes.min(to),
            _ => bytes,
        }
    }

    /// Refuses writes to the head of an origin deleted while clones live (kept, hidden, for
    /// them). Called with the writes gate held, so that none passes it once the delete marked
    /// the head (the delete takes the gate alone to mark it).
    fn check_layer_takes_writes(&self, layer: u16) -> Result<(), VolumeError> {
        if layer == HEAD && self.map.head_deleted() {
            return Err(VolumeError::Closed(self.name.clone()));
        }
        if layer != HEAD {
            match self.map.layer_record(layer) {
                Some(r) if r.kind == crate::layers::LayerKind::Clone && !r.hidden => {}
                // A snapshot, of the volume or of a clone: read-only.
                Some(r) if !r.hidden => return Err(VolumeError::ReadOnly { volume: r.name }),
                _ => return Err(VolumeError::Closed(format!("{} (layer {layer})", self.name))),
            }
        }
        Ok(())
    }

    fn check_writable(&self, offset_bytes: u64, len_bytes: u64) -> Result<(), VolumeError> {
        match &*self.health.failure.lock() {
            None => Ok(()),
            Some(why) => Err(VolumeError::Unrecoverable {
                volume: self.name.clone(),
                offset_bytes,
                len_bytes,
                reason: format!("the volume takes no writes until it is reopened: {why}"),
            }),
        }
    }

    /// A map update failed: stop writes and moves until reopened (replay decides what is durable).
    pub(crate) fn map_failed(&self, e: &MapError) {
        self.stop_writes(format!("a map update could not be made durable ({e})"));
    }

    /// Takes no more writes or moves until the volume is reopened (what is durable is unknown
    /// until then): `why` is kept as the volume's failure.
    pub(crate) fn stop_writes(&self, why: String) {
        tracing::error!(volume = %self.name, "{why}; the volume takes no more writes until it is reopened");
        self.health.failure.lock().get_or_insert(why.clone());
        self.ring.shut(why);
        self.ring.hungry.notify_one();
    }

    fn unrecoverable(&self, block: u64, reason: impl Into<String>) -> VolumeError {
        VolumeError::Unrecoverable {
            volume: self.name.clone(),
            offset_bytes: block * BLOCK_BYTES,
            len_bytes: BLOCK_BYTES,
            reason: reason.into(),
        }
    }

    /// Every acknowledged write is durable already; the flush still asks the pool for one, which
    /// (after writes) raises the pool's flush epoch, so a copy of a drive taken before it is
    /// never trusted again (docs/design/stale-copies.md). With nothing written since the last
    /// pool flush that costs nothing.
    pub async fn flush(&self) -> Result<(), VolumeError> {
        if self.health.closed.load(Relaxed) {
            return Err(VolumeError::Closed(self.name.clone()));
        }
        if self.wb.used.load(Relaxed) {
            self.commit_write_back().await?;
        }
        self.pool
            .flush()
            .await
            .map_err(|e| VolumeError::Pool { volume: self.name.clone(), source: Box::new(e) })
    }

    /// Makes every delta queued so far durable (the barrier flushes the cache first), then frees
    /// what they replaced.
    pub(crate) async fn commit_write_back(&self) -> Result<(), VolumeError> {
        let ticket = self.map.queued_ticket();
        self.map.commit_to(ticket).await.map_err(|e| {
            self.map_failed(&e);
            map_error(&self.name, e)
        })?;
        self.free_durable();
        Ok(())
    }

    /// [`Self::commit_write_back`] when write-back writes wait to free what they replaced: what
    /// needs no writer between a map update and its freeing calls it under `settle` held alone.
    pub(crate) async fn settle_write_back(&self) -> Result<(), VolumeError> {
        if self.wb.frees.lock().is_empty() {
            return Ok(());
        }
        self.commit_write_back().await
    }

    /// Flushes of the cache part so far (for tests: the write-back barrier's).
    #[doc(hidden)]
    pub fn cache_flushes(&self) -> u64 {
        self.parts.cache.counters().flush_ops.load(Relaxed)
    }

    /// Frees the places replaced by write-back deltas that are durable now.
    pub(crate) fn free_durable(&self) {
        let durable = self.map.durable_ticket();
        let mut ready = Vec::new();
        // The queue stays locked until the places are freed: `settle_write_back` (under
        // `settle` held alone) must not find it empty while a free taken from it has not
        // lowered its count yet, or GC's forgetting of an overcount, or a restored claim's
        // release, would take the same place once more (the committer on another thread; the
        // crash loop's "position released twice", a segment's count lowered below 0).
        let mut q = self.wb.frees.lock();
        while q.front().is_some_and(|(t, _)| *t <= durable) {
            ready.extend(q.pop_front().expect("checked").1);
        }
        if !ready.is_empty() {
            self.free_places(ready);
        }
        drop(q);
    }

    /// Worst state of the three parts.
    pub fn state(&self) -> VolumeState {
        crate::worst_state([self.parts.meta.state(), self.parts.cache.state(), self.parts.seg.state()])
    }

    /// Stops the mover and waits for the batch it is running; writes a map checkpoint so the next
    /// open replays little. Requests after this fail with `Closed`.
    pub async fn close(&self) {
        self.stop();
        // Writes in flight finish (or fail) first: the checkpoint below makes every acknowledged
        // write durable, write-back ones included (one that had not queued its map update when
        // the checkpoint committed would otherwise be lost; the crash sequences' seed 3,579).
        drop(self.gates.writes.write().await);
        // A delete in progress stops before its next batch; the next open finishes it.
        drop(self.gates.deleter.lock().await);
        drop(self.gates.moving.lock().await);
        // A cache growth in progress finishes (or stops at the ring, shut above).
        drop(self.gates.pool_growth.lock().await);
        if self.health.failure.lock().is_none()
            && let Err(e) = self.map.checkpoint().await
        {
            tracing::warn!(volume = %self.name, error = %e, "map checkpoint at close failed; the next open replays the log");
        }
    }

    /// Like [`LogVolume::close`] without waiting (for `Drop`): the mover stops after its batch.
    pub fn stop(&self) {
        self.health.closed.store(true, Relaxed);
        self.map.stop_deletes();
        self.gates.deletes_wanted.notify_one();
        self.ring.shut(format!("volume {} is closed", self.name));
        self.ring.hungry.notify_one();
        self.map.wake_checkpoint_task();
    }
}
