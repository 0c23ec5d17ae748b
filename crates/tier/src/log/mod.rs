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

mod mover;
pub mod space;
mod table;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::Instant;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use stria_dev::{BLOCK_BYTES, BLOCK_USIZE, BlockDevice, IoBuf, IoBytes};
use stria_engine::volume::bytes::{self, ExtentRuns, Span, ZeroSplit};
use stria_engine::{
    DriveClass, EngineError, Extent, Layout, Pool, TieredRecord, Volume, VolumeError, VolumeState,
    join_all_ok,
};

use crate::layers::{LayerKind, LayerRecord};
use crate::map::DeleteStats;
use crate::map::{ENTRIES_PER_PAGE, MapEntry, MapError, MapLayout, MapStore, Place, Update};
use crate::ring::CacheRing;
use crate::{PartStatus, TierError, block_crc};
use space::{Geometry, Space, SpaceCounts};

const HEADER_MAGIC: &[u8; 8] = b"STRIA-LV";
/// The origin's head, as the layer argument of the write functions (a clone is its layer id).
pub const HEAD: u16 = 0;
/// Version 2 adds the persisted segment table after the map region; version 1 headers (no
/// table: open scans the map) are still read.
const FORMAT_VERSION: u32 = 3;
/// Maps up to this many pages are checked against the persisted table at every open that used
/// it (debug builds: the tests).
const VERIFY_TABLE_PAGES: u64 = 65536;
/// A read that keeps racing with moves gives up after this many tries (an error, never wrong data).
const READ_ATTEMPTS: usize = 8;
/// Segments a new volume's space starts with (GC needs 6; the space grows as it fills).
pub(crate) const INITIAL_SEGMENTS: u64 = 16;
/// Blocks per map update of a large zeroing or trim.
const ZERO_STEP: u64 = 4096;
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
    /// Write cache (default: an eighth of the size, 64 MiB to 8 GiB).
    pub cache_bytes: Option<u64>,
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
            batch_rows: None,
            segment_batches: None,
            map_log_blocks: None,
            map_cache_pages: 65536,
            fast_tier: false,
            copies: 2,
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
    /// Move nothing unless a writer waits for cache space (tests that want quiet drives between
    /// phases; not persisted).
    #[serde(skip)]
    pub hold: bool,
    /// Compact the segment space without waiting for writes to be quiet (simulations, whose
    /// runs are shorter than the wait; not persisted).
    #[serde(skip)]
    pub eager_compaction: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogKind {
    Log,
}

/// Counters.
#[derive(Debug, Default)]
pub struct LogCounters {
    pub host_write_ops: AtomicU64,
    pub host_write_bytes: AtomicU64,
    pub host_read_ops: AtomicU64,
    pub host_read_bytes: AtomicU64,
    pub read_retries: AtomicU64,
    /// Blocks read from the write cache and from the segment space.
    pub blocks_read_from_cache: AtomicU64,
    pub blocks_read_from_segments: AtomicU64,
    pub destage_batches: AtomicU64,
    pub destaged_blocks: AtomicU64,
    /// Data slots written without a block (short batches).
    pub padded_slots: AtomicU64,
    pub gc_batches: AtomicU64,
    pub gc_moved_blocks: AtomicU64,
    pub gc_victims: AtomicU64,
    /// Moves that lost to a newer write (their slot is garbage at once).
    pub moves_lost: AtomicU64,
    /// Blocks of overcount (from a persisted table) forgotten on drained GC victims.
    pub overcount_forgotten: AtomicU64,
    /// Free segments given back to the pool.
    pub segments_given_back: AtomicU64,
}

/// Status for `stria status --json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LogStatus {
    pub name: String,
    pub layout: String,
    pub size_bytes: u64,
    pub state: VolumeState,
    /// Bytes the volume's live blocks take in the segment space (thin: allocated on write).
    pub allocated_bytes: u64,
    /// Data bytes of the segments that exist (allocated from the pool's capacity drives).
    pub space_bytes: u64,
    /// Data bytes the segment space may grow to (`--space`).
    pub space_max_bytes: u64,
    pub free_bytes: u64,
    pub garbage_bytes: u64,
    pub reserved_bytes: u64,
    pub segment_bytes: u64,
    pub free_segments: u64,
    pub segments: u64,
    pub cache_blocks: u64,
    pub cache_live_blocks: u64,
    pub host_write_bytes: u64,
    pub host_read_bytes: u64,
    pub blocks_read_from_cache: u64,
    pub blocks_read_from_segments: u64,
    pub destage_batches: u64,
    pub destaged_blocks: u64,
    pub padded_slots: u64,
    pub gc_batches: u64,
    pub gc_moved_blocks: u64,
    pub gc_victims: u64,
    pub moves_lost: u64,
    /// Free segments given back to the pool since the volume was opened.
    pub segments_given_back: u64,
    /// Pages of the snapshot page pool (the map pages snapshots and clones own, and their
    /// indexes) in use, and in all (it grows when full, as far as the metadata part can).
    #[serde(default)]
    pub snapshot_pool_pages_used: u64,
    #[serde(default)]
    pub snapshot_pool_pages: u64,
    /// Why writes that need new space fail (with ENOSPC), if they do.
    pub no_space: Option<String>,
    /// True while writes that need new space fail: the volume's state reads `full` beside its
    /// redundancy state (`healthy, full`).
    #[serde(default)]
    pub full: bool,
    pub write_amplification_fast: Option<f64>,
    pub write_amplification_capacity: Option<f64>,
    pub parts: Vec<PartStatus>,
}

/// A log-structured volume.
pub struct LogVolume<D: BlockDevice> {
    pub(crate) name: String,
    pub(crate) size_bytes: u64,
    pub(crate) blocks: u64,
    pub(crate) pool: Arc<Pool<D>>,
    pub(crate) cache: Arc<Volume<D>>,
    pub(crate) meta: Arc<Volume<D>>,
    pub(crate) seg: Arc<Volume<D>>,
    pub(crate) geo: Geometry,
    pub(crate) map: MapStore<D>,
    pub(crate) ring: Arc<CacheRing>,
    pub(crate) space: Arc<Mutex<Space>>,
    pub(crate) params: Mutex<LogParams>,
    rmw_locks: Box<[tokio::sync::Mutex<()>]>,
    /// Next write sequence (low 32 bits go into map entries and summaries).
    pub(crate) seq: Arc<AtomicU64>,
    pub(crate) counters: LogCounters,
    pub(crate) started: Instant,
    pub(crate) last_write_ms: AtomicU64,
    pub(crate) closed: AtomicBool,
    /// Set when a map update failed: whether it is durable is unknown until the volume is
    /// reopened (replay says), so no place may be freed or reused: no more writes or moves.
    pub(crate) failure: Mutex<Option<String>>,
    /// Set while destage cannot find space: writers that must wait for cache space get ENOSPC.
    pub(crate) no_space: Mutex<Option<String>>,
    /// The mover's GC state, held while a destage or GC batch runs (close waits for it).
    pub(crate) moving: tokio::sync::Mutex<mover::Gc>,
    /// Whether open used the persisted segment table (else it scanned the map).
    opened_from_table: bool,
    /// Held shared by writers from their map update until they have freed the places it
    /// replaced, exclusively by the mover when it must know that no such free is pending (a
    /// restored cache position found stale: the writer that replaced its entry may still be
    /// about to free it).
    pub(crate) settle: tokio::sync::RwLock<()>,
    /// One snapshot create, delete or rollback at a time.
    snapshot_ops: tokio::sync::Mutex<()>,
    /// One growth of the snapshot page pool at a time.
    pool_growth: tokio::sync::Mutex<()>,
    /// Set while live counts may be too high (opened from a persisted table, not recounted).
    pub(crate) counts_suspect: AtomicBool,
    /// Why the segment space could not grow the last time it tried (cleared when it grows).
    pub(crate) growth_failed: Mutex<Option<(String, Instant)>>,
    /// Held shared by every host write, zeroing and trim from start to acknowledgement; making a
    /// snapshot holds it alone, so the snapshot holds every write acknowledged before, none after.
    writes: tokio::sync::RwLock<()>,
}

impl<D: BlockDevice> std::fmt::Debug for LogVolume<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogVolume").field("name", &self.name).field("size_bytes", &self.size_bytes).finish()
    }
}

/// The metadata header (block 0 of `<name>.meta`); byte table in docs/on-disk-format.md §8.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Header {
    /// 1: no persisted segment table; 2: the table follows the map region; 3: a layer table and
    /// a page pool for snapshots follow the table.
    version: u32,
    volume_bytes: u64,
    geo: Geometry,
    cache_blocks: u64,
    map_log_blocks: u64,
    /// Pages of the snapshot page pool (version 3).
    pool_pages: u64,
}

impl Header {
    fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; BLOCK_USIZE];
        b[0..8].copy_from_slice(HEADER_MAGIC);
        b[8..12].copy_from_slice(&self.version.to_le_bytes());
        let fields = [
            self.volume_bytes,
            self.geo.row_blocks,
            self.geo.batch_rows,
            self.geo.segment_batches,
            self.geo.segments,
            self.cache_blocks,
            self.map_log_blocks,
            self.pool_pages,
        ];
        for (i, f) in fields.iter().enumerate() {
            b[16 + 8 * i..24 + 8 * i].copy_from_slice(&f.to_le_bytes());
        }
        let crc = header_crc(&b);
        b[12..16].copy_from_slice(&crc.to_le_bytes());
        b
    }

    fn decode(b: &[u8]) -> Result<Header, String> {
        if &b[0..8] != HEADER_MAGIC {
            return Err("not a log-structured volume header (bad magic)".into());
        }
        let version = u32::from_le_bytes(b[8..12].try_into().expect("4"));
        if !(1..=FORMAT_VERSION).contains(&version) {
            return Err(format!("header format version {version}; this build reads {FORMAT_VERSION}"));
        }
        if u32::from_le_bytes(b[12..16].try_into().expect("4")) != header_crc(b) {
            return Err("header checksum mismatch".into());
        }
        let f = |i: usize| u64::from_le_bytes(b[16 + 8 * i..24 + 8 * i].try_into().expect("8"));
        Ok(Header {
            version,
            volume_bytes: f(0),
            geo: Geometry { row_blocks: f(1), batch_rows: f(2), segment_batches: f(3), segments: f(4) },
            cache_blocks: f(5),
            map_log_blocks: f(6),
            pool_pages: if version >= 3 { f(7) } else { 0 },
        })
    }

    /// Byte offset and size of the persisted segment table in the metadata part, if it has one.
    fn table_region(&self) -> Option<(u64, u64)> {
        (self.version >= 2).then(|| {
            (
                BLOCK_BYTES + self.map_layout().bytes(),
                table::region_bytes(self.geo.segments, self.cache_blocks),
            )
        })
    }

    /// Bytes of the metadata part.
    fn meta_bytes(&self) -> u64 {
        let map = self.map_layout();
        map.end().max(BLOCK_BYTES + map.bytes() + self.table_region().map_or(0, |r| r.1))
    }

    fn map_layout(&self) -> MapLayout {
        let plain = MapLayout {
            base: BLOCK_BYTES,
            log_blocks: self.map_log_blocks,
            blocks: self.volume_bytes / BLOCK_BYTES,
            pool: None,
        };
        // Version 3: the layer table and the page pool follow the segment table.
        let pool = (self.version >= 3).then(|| {
            let layers_at =
                BLOCK_BYTES + plain.bytes() + table::region_bytes(self.geo.segments, self.cache_blocks);
            crate::map::PoolLayout {
                layers_at,
                pages_at: layers_at + crate::layers::LAYER_TABLE_BLOCKS as u64 * BLOCK_BYTES,
                pages: u32::try_from(self.pool_pages).expect("pool pages fit in 32 bits"),
            }
        });
        MapLayout { pool, ..plain }
    }
}

fn header_crc(b: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&b[..12]), &b[16..])
}

fn map_error(name: &str, e: MapError) -> VolumeError {
    match e {
        MapError::Volume(v) => v,
        other => VolumeError::Unrecoverable {
            volume: name.into(),
            offset_bytes: 0,
            len_bytes: 0,
            reason: other.to_string(),
        },
    }
}

/// Creates a log-structured volume: its three parts, its header, its pool record.
pub async fn create<D: BlockDevice>(
    pool: &Arc<Pool<D>>,
    spec: LogSpec,
) -> Result<Arc<LogVolume<D>>, TierError> {
    let ec = Layout::Ec { data_shards: spec.data_shards, parity_shards: spec.parity_shards };
    ec.validate().map_err(TierError::Invalid)?;
    let invalid = |s: String| Err(TierError::Invalid(s));
    let size_bytes = spec.size_bytes.next_multiple_of(BLOCK_BYTES);
    let blocks = size_bytes / BLOCK_BYTES;
    if blocks == 0 {
        return invalid("a log-structured volume needs a size of at least 4 KiB".into());
    }
    let row_blocks = u64::from(spec.data_shards) * spec.chunk_bytes / BLOCK_BYTES;
    if row_blocks == 0 || !spec.chunk_bytes.is_multiple_of(BLOCK_BYTES) {
        return invalid("the chunk must be a multiple of 4 KiB".into());
    }
    let space_data = spec.space_bytes.unwrap_or(size_bytes / 2 * 3) / BLOCK_BYTES;
    // Segments of 32 MiB of data (sized for QLC), or a sixteenth of the space when that is less
    // (small volumes keep enough segments for GC); batches of about 2 MiB, at most a segment.
    let segment_target = ((32u64 << 20) / BLOCK_BYTES).min(space_data / 16).max(row_blocks);
    let batch_rows =
        spec.batch_rows.unwrap_or_else(|| (512 / row_blocks).clamp(1, (segment_target / row_blocks).max(1)));
    let batch_bytes = row_blocks * batch_rows * BLOCK_BYTES;
    let segment_batches =
        spec.segment_batches.unwrap_or_else(|| (segment_target * BLOCK_BYTES).div_ceil(batch_bytes).max(1));
    let mut geo = Geometry { row_blocks, batch_rows, segment_batches, segments: 0 };
    geo.segments = space_data.div_ceil(geo.segment_data());
    if geo.segments < 6 {
        return invalid(format!(
            "the segment space holds {} segments of {} data; it needs at least 6 (GC needs room to work): use a larger size or a smaller --chunk",
            geo.segments,
            stria_engine::units::format_size(geo.segment_data() * BLOCK_BYTES)
        ));
    }
    let cache_bytes = spec
        .cache_bytes
        .unwrap_or_else(|| (size_bytes / 8).clamp(64 << 20, 8 << 30))
        .next_multiple_of(64 << 10);
    let cache_blocks = cache_bytes / BLOCK_BYTES;
    if cache_blocks < 2 * geo.batch_data() {
        return invalid(format!(
            "the cache ({}) must hold at least two batches ({} each)",
            stria_engine::units::format_size(cache_bytes),
            stria_engine::units::format_size(geo.batch_bytes_data())
        ));
    }
    let map_log_blocks = spec.map_log_blocks.unwrap_or_else(|| (blocks / 16).clamp(1024, 65536));
    // Snapshot copies of map pages: room for every page of the map to be copied twice (at most
    // 4 GiB; a write that needs a copy when it is full gets ENOSPC: docs/design/snapshots.md).
    let pool_pages = (2 * blocks.div_ceil(ENTRIES_PER_PAGE) + 64).min(1 << 20);
    let header = Header {
        version: FORMAT_VERSION,
        volume_bytes: size_bytes,
        geo,
        cache_blocks,
        map_log_blocks,
        pool_pages,
    };
    let name = spec.name.clone();
    if pool.volume(&name).is_some() || pool.meta().tiered.iter().any(|t| t.name == name) {
        return Err(EngineError::VolumeExists(name).into());
    }
    if !(2..=3).contains(&spec.copies) {
        return invalid(format!(
            "--cache-copies {}: the cache and map need 2 or 3 copies (the cache holds the only copy of new data)",
            spec.copies
        ));
    }
    let fast_class = if spec.fast_tier {
        let fast = pool
            .meta()
            .drives
            .iter()
            .filter(|d| d.class == DriveClass::Fast && d.state == stria_engine::DriveState::Active)
            .count() as u32;
        if fast < spec.copies {
            return invalid(format!(
                "a tiered volume keeps {} copies of its write cache and map on fast drives; this pool has {fast} \
                 active fast drive(s). Use log:ec:{}+{} to keep them on the capacity drives",
                spec.copies, spec.data_shards, spec.parity_shards
            ));
        }
        DriveClass::Fast
    } else {
        DriveClass::Capacity
    };
    let mirror = Layout::Raid1 { copies: spec.copies };
    let parts = [
        crate::part_spec(
            format!("{name}.meta"),
            header.meta_bytes(),
            mirror,
            64 << 10,
            fast_class,
            &name,
            "meta",
        ),
        crate::part_spec(format!("{name}.cache"), cache_bytes, mirror, 64 << 10, fast_class, &name, "cache"),
        crate::part_spec(
            format!("{name}.seg"),
            spec.initial_segments.unwrap_or(INITIAL_SEGMENTS).clamp(6, geo.segments)
                * geo.segment_blocks()
                * BLOCK_BYTES,
            ec,
            spec.chunk_bytes,
            DriveClass::Capacity,
            &name,
            "seg",
        ),
    ];
    // All three are cleared: the map so that it reads as zeros (an all-zero region is an empty
    // map, a zero table a stale one), the cache and the segment space
    // so that a scrub sees rows never written as unwritten (extents of a deleted volume keep its
    // stripes and checksums); clearing is metadata only (checksum entries, 1/1024 of the bytes).
    let made = crate::create_parts_zeroing(pool, parts, [true, true, true]).await?;
    let (meta, cache, seg) = (made[0].clone(), made[1].clone(), made[2].clone());
    meta.write(0, IoBytes::copy_from(&header.encode()), true).await?;
    if let Some((at, _)) = header.table_region() {
        // An empty table for the empty map (replay position 0): the first open needs no scan.
        let empty =
            table::Table { stamp: 0, next_seq: 1, live: vec![0; geo.segments as usize], owners: Vec::new() };
        meta.write(at, IoBytes::copy_from(&empty.encode()), true).await?;
    }
    let params = LogParams {
        kind: LogKind::Log,
        start_percent: 50,
        stop_percent: 25,
        always: false,
        map_cache_pages: spec.map_cache_pages.max(4),
        hold: false,
        eager_compaction: false,
    };
    pool.add_tiered(TieredRecord {
        name: name.clone(),
        size_bytes,
        cache_volume: cache.id(),
        meta_volume: meta.id(),
        capacity_volume: seg.id(),
        params: serde_json::to_value(params).expect("params serialize"),
    })
    .await?;
    let rec = pool.meta().tiered.iter().find(|t| t.name == name).cloned().expect("just added");
    let space_bytes = geo.segments * geo.segment_data() * BLOCK_BYTES;
    if size_bytes > space_bytes {
        tracing::warn!(
            volume = %name,
            "over-committed: {} logical over at most {} of segment space; writes get ENOSPC when the space is full, TRIM frees space",
            stria_engine::units::format_size(size_bytes),
            stria_engine::units::format_size(space_bytes)
        );
    }
    open(pool, &rec).await
}

/// Opens a log-structured volume (after the pool has recovered its parts): replays the map log,
/// takes the live counts and cached blocks from the persisted segment table (or, without a valid
/// one, from a scan of the whole map), and starts the mover.
pub async fn open<D: BlockDevice>(
    pool: &Arc<Pool<D>>,
    rec: &TieredRecord,
) -> Result<Arc<LogVolume<D>>, TierError> {
    let corrupt = |reason: String| TierError::Corrupt { name: rec.name.clone(), reason };
    let [cache, meta, seg] = crate::open_parts(pool, rec, "segment")?;
    let params: LogParams =
        serde_json::from_value(rec.params.clone()).map_err(|e| corrupt(format!("bad parameters: {e}")))?;
    let header = Header::decode(&meta.read(0, BLOCK_USIZE).await?).map_err(corrupt)?;
    let segment_bytes = header.geo.segment_blocks() * BLOCK_BYTES;
    if header.volume_bytes != rec.size_bytes
        || seg.size_bytes() > header.geo.space_blocks() * BLOCK_BYTES
        || !seg.size_bytes().is_multiple_of(segment_bytes)
        || header.meta_bytes() > meta.size_bytes()
    {
        return Err(corrupt("metadata header disagrees with the pool record".into()));
    }
    let geo = header.geo;
    // The segments that exist: the space grows by resizing its engine volume.
    let segments = seg.size_bytes() / segment_bytes;
    let layout = header.map_layout();
    let map_err = |e: MapError| corrupt(format!("map: {e}"));
    let table = match header.table_region() {
        Some((at, _)) => {
            let replay = MapStore::replay_position(&meta, layout).await.map_err(map_err)?;
            read_table(&meta, at, replay, &header).await?
        }
        None => None,
    };
    let from_table = table.is_some();
    let (map, Counts { live, owners, next_seq: max_seq, .. }) = if let Some(t) = table {
        // The table's counts and owners, plus +1 and a claim for every replayed delta: never
        // below the truth (docs/design/log-structured-volumes.md, "Step 3a").
        let mut live = t.live;
        // A count past the segments that exist is an overcount: a segment is given back only
        // when its count is 0, after the updates that moved every entry out were durable.
        live[segments as usize..].fill(0);
        let mut counts = Counts::new(geo, segments, live, t.owners, t.next_seq, true);
        let map = MapStore::open_with(Arc::clone(&meta), layout, params.map_cache_pages, |block, e| {
            counts.add(block, e);
        })
        .await
        .map_err(map_err)?;
        counts.check_past_end(&map).await.map_err(corrupt)?;
        (map, counts.checked().map_err(corrupt)?)
    } else {
        let map = MapStore::open(Arc::clone(&meta), layout, params.map_cache_pages).await.map_err(map_err)?;
        let counts = scan_map(&map, geo, segments).await.map_err(corrupt)?;
        (map, counts)
    };
    let describe = |b: u64| format!("block {b}");
    let ring = if from_table {
        CacheRing::restored(header.cache_blocks, &owners, describe)
    } else {
        CacheRing::with_owners(header.cache_blocks, &owners, describe)
    };
    if from_table && cfg!(debug_assertions) && layout.pages() <= VERIFY_TABLE_PAGES {
        verify_table(&map, geo, segments, &live, &ring.owners()).await.map_err(corrupt)?;
    }
    tracing::info!(
        volume = %rec.name,
        "{}",
        if from_table {
            "opened from the persisted segment table".to_string()
        } else {
            format!("scanned the map ({} pages) for live counts", layout.pages())
        }
    );
    // GC needs its open segment and one more to empty any victim (its live blocks fit in one).
    let reserve = 2;
    let vol = Arc::new(LogVolume {
        name: rec.name.clone(),
        size_bytes: rec.size_bytes,
        blocks: rec.size_bytes / BLOCK_BYTES,
        pool: Arc::clone(pool),
        cache,
        meta,
        seg,
        geo,
        map,
        ring: Arc::new(ring),
        space: Arc::new(Mutex::new(Space::from_live(geo, live, segments, reserve))),
        params: Mutex::new(params),
        rmw_locks: (0..RMW_LOCKS).map(|_| tokio::sync::Mutex::new(())).collect(),
        seq: Arc::new(AtomicU64::new(max_seq)),
        counters: LogCounters::default(),
        started: Instant::now(),
        last_write_ms: AtomicU64::new(0),
        closed: AtomicBool::new(false),
        failure: Mutex::new(None),
        no_space: Mutex::new(None),
        moving: tokio::sync::Mutex::new(mover::Gc::default()),
        opened_from_table: from_table,
        settle: tokio::sync::RwLock::new(()),
        snapshot_ops: tokio::sync::Mutex::new(()),
        pool_growth: tokio::sync::Mutex::new(()),
        writes: tokio::sync::RwLock::new(()),
        counts_suspect: AtomicBool::new(from_table),
        growth_failed: Mutex::new(None),
    });
    if let Some((at, _)) = header.table_region() {
        vol.map.set_checkpoint_table(Arc::new(table::Writer {
            at,
            space: Arc::clone(&vol.space),
            ring: Arc::clone(&vol.ring),
            seq: Arc::clone(&vol.seq),
        }));
    }
    // A rollback, then a snapshot delete, a crash cut short are finished before the volume is
    // used.
    if let Some(target) = vol.map.rollback_pending() {
        let restored =
            vol.restore(target).await.map_err(|e| corrupt(format!("finishing a rollback: {e}")))?;
        vol.map.mark_rollback(0).await.map_err(|e| corrupt(format!("finishing a rollback: {e}")))?;
        tracing::info!(volume = %rec.name, restored, "finished a rollback a crash interrupted");
    }
    let finished = vol
        .map
        .finish_deletes(|freed| vol.free_places(freed.into_iter().map(|(_, e)| e)))
        .await
        .map_err(|e| corrupt(format!("finishing a snapshot delete: {e}")))?;
    if finished > 0 {
        tracing::info!(volume = %rec.name, finished, "finished snapshot deletes a crash interrupted");
    }
    mover::spawn(&vol);
    mover::spawn_checkpoints(&vol);
    Ok(vol)
}

/// The persisted segment table at `at`, if it is valid and belongs to replay position `replay`.
async fn read_table<D: BlockDevice>(
    meta: &Volume<D>,
    at: u64,
    replay: u64,
    header: &Header,
) -> Result<Option<table::Table>, TierError> {
    let Some(h) = table::Table::decode_header(&meta.read(at, BLOCK_USIZE).await?) else {
        return Ok(None);
    };
    let (stamp, _, segments, owners, _) = h;
    if stamp != replay || segments != header.geo.segments || owners > header.cache_blocks {
        return Ok(None);
    }
    let len = table::Table::body_bytes(segments, owners).next_multiple_of(BLOCK_BYTES);
    let body = meta.read(at + BLOCK_BYTES, len as usize).await?;
    Ok(table::Table::decode_body(h, &body))
}

/// What open learns from map entries (a scan's, or the deltas replayed over a table): live
/// blocks per segment, cached blocks (position, block), the next write sequence.
struct Counts {
    geo: Geometry,
    /// Segments that exist.
    segments: u64,
    /// One per segment the space may grow to.
    live: Vec<u64>,
    owners: Vec<(u64, u64)>,
    next_seq: u64,
    /// Whether the entries are deltas replayed over a persisted table: a superseded delta may
    /// point into a segment given back to the pool since; only the final entry decides.
    replaying: bool,
    /// Blocks with a replayed delta past the segments that exist.
    past_end: Vec<u64>,
    /// The first entry that points past the segments that exist.
    bad: Option<String>,
}

impl Counts {
    fn new(
        geo: Geometry,
        segments: u64,
        live: Vec<u64>,
        owners: Vec<(u64, u64)>,
        next_seq: u64,
        replaying: bool,
    ) -> Counts {
        Counts { geo, segments, live, owners, next_seq, replaying, past_end: Vec::new(), bad: None }
    }

    /// The first space address past the segments that exist.
    fn end(&self) -> u64 {
        self.segments * self.geo.segment_blocks()
    }

    fn add(&mut self, block: u64, e: &MapEntry) {
        match e.place {
            Place::Segment(a) if a < self.end() => {
                self.live[self.geo.segment_of(a)] += 1;
            }
            Place::Segment(_) if self.replaying => self.past_end.push(block),
            Place::Segment(a) => {
                self.bad.get_or_insert(past_end(block, a, self.segments));
            }
            Place::Cache(p) => self.owners.push((p, block)),
            Place::Unallocated | Place::Zero => {}
        }
        self.next_seq = self.next_seq.max(u64::from(e.seq) + 1);
    }

    /// After a replay: checks the final entries of the blocks with a delta past the end.
    async fn check_past_end<D: BlockDevice>(&mut self, map: &MapStore<D>) -> Result<(), String> {
        self.past_end.sort_unstable();
        self.past_end.dedup();
        let entries = map.get_many(&self.past_end).await.map_err(|e| format!("map: {e}"))?;
        let end = self.end();
        for (&block, e) in self.past_end.iter().zip(entries) {
            if let Place::Segment(a) = e.place
                && a >= end
            {
                self.bad.get_or_insert(past_end(block, a, self.segments));
            }
        }
        Ok(())
    }

    fn checked(self) -> Result<Counts, String> {
        match &self.bad {
            Some(why) => Err(why.clone()),
            None => Ok(self),
        }
    }
}

fn past_end(block: u64, addr: u64, segments: u64) -> String {
    format!("block {block} points at segment address {addr}, past the {segments} segments of the space")
}

/// [`Counts`] from a scan of the whole map.
async fn scan_map<D: BlockDevice>(map: &MapStore<D>, geo: Geometry, segments: u64) -> Result<Counts, String> {
    let mut counts = Counts::new(geo, segments, vec![0; geo.segments as usize], Vec::new(), 0, false);
    map.scan(|first, entries| {
        for (i, e) in entries.iter().enumerate() {
            counts.add(first + i as u64, e);
        }
    })
    .await
    .map_err(|e| format!("map: {e}"))?;
    // Places only snapshots hold are live too (each counted once).
    map.scan_copies(|block, e| counts.add(block, e)).await.map_err(|e| format!("map (snapshots): {e}"))?;
    counts.checked()
}

/// Checks counts and owners taken from the persisted table against a scan of the map: no
/// segment below the scan's count, every cached block's position held.
async fn verify_table<D: BlockDevice>(
    map: &MapStore<D>,
    geo: Geometry,
    segments: u64,
    live: &[u64],
    owners: &[(u64, u64)],
) -> Result<(), String> {
    let Counts { live: scanned, owners: cached, .. } = scan_map(map, geo, segments).await?;
    for (seg, (&t, &m)) in live.iter().zip(&scanned).enumerate() {
        if t < m {
            return Err(format!(
                "the persisted segment table undercounts segment {seg}: {t} live blocks, the map points {m} into it"
            ));
        }
    }
    let held: std::collections::HashSet<(u64, u64)> = owners.iter().copied().collect();
    if let Some((p, b)) = cached.iter().find(|c| !held.contains(c)) {
        return Err(format!(
            "the persisted segment table lost cache position {p} of block {b} (the map points at it)"
        ));
    }
    Ok(())
}

impl Geometry {
    fn batch_bytes_data(&self) -> u64 {
        self.batch_data() * BLOCK_BYTES
    }
}

impl<D: BlockDevice> LogVolume<D> {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    /// `tiered:ec:K+M` when cache and map are on fast drives, `log:ec:K+M` otherwise.
    pub fn layout(&self) -> String {
        let fast = self.pool.meta().volume(self.cache.name()).is_some_and(|r| r.class == DriveClass::Fast);
        format!("{}:{}", if fast { "tiered" } else { "log" }, self.seg.layout())
    }

    pub fn counters(&self) -> &LogCounters {
        &self.counters
    }

    /// Whether open took live counts and cached blocks from the persisted segment table (else it
    /// scanned the whole map).
    pub fn opened_from_table(&self) -> bool {
        self.opened_from_table
    }

    /// The segment space's geometry.
    pub fn geometry(&self) -> Geometry {
        self.geo
    }

    pub fn params(&self) -> LogParams {
        *self.params.lock()
    }

    /// Changes the mover's policy (not persisted).
    pub fn set_params(&self, p: LogParams) {
        *self.params.lock() = p;
        self.ring.hungry.notify_one();
    }

    /// The map's counters (log writes, deltas, checkpoints, cache).
    pub async fn map_stats(&self) -> crate::map::MapStats {
        self.map.stats().await
    }

    /// The segment space's counts.
    pub fn space_counts(&self) -> SpaceCounts {
        self.space.lock().counts()
    }

    /// The three parts: metadata, cache, segment space.
    pub fn parts(&self) -> [&Arc<Volume<D>>; 3] {
        [&self.meta, &self.cache, &self.seg]
    }

    pub(crate) fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn check_range(&self, offset_bytes: u64, len_bytes: u64) -> Result<(), VolumeError> {
        if self.closed.load(Relaxed) {
            return Err(VolumeError::Closed(self.name.clone()));
        }
        bytes::check_range(offset_bytes, len_bytes, self.size_bytes)
    }

    fn check_writable(&self, offset_bytes: u64, len_bytes: u64) -> Result<(), VolumeError> {
        match &*self.failure.lock() {
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
        let why = format!("a map update could not be made durable ({e})");
        tracing::error!(volume = %self.name, "{why}; the volume takes no more writes until it is reopened");
        self.failure.lock().get_or_insert(why.clone());
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

    /// Map entries of `n` blocks from `first`.
    pub(crate) async fn entries(&self, first: u64, n: u64) -> Result<Vec<MapEntry>, VolumeError> {
        self.entries_in(None, first, n).await
    }

    /// Map entries of `n` blocks from `first` as the head (`None`) or a snapshot sees them.
    async fn entries_in(&self, view: Option<u16>, first: u64, n: u64) -> Result<Vec<MapEntry>, VolumeError> {
        let blocks: Vec<u64> = (first..first + n).collect();
        match view {
            None => self.map.get_many(&blocks).await,
            Some(layer) => self.map.get_in(layer, &blocks).await,
        }
        .map_err(|e| map_error(&self.name, e))
    }

    /// Applies map updates; on failure the volume stops taking writes (see [`Self::map_failed`]),
    /// except when the snapshot page pool had no room: then nothing was applied, and the caller
    /// gets ENOSPC (the volume goes on).
    pub(crate) async fn update_map(&self, updates: &[Update]) -> Result<Vec<Option<MapEntry>>, VolumeError> {
        self.update_layer(HEAD, updates).await
    }

    /// [`Self::update_map`] of the head ([`HEAD`]) or of a clone (host writes only). A full
    /// snapshot page pool is grown once and the update tried again.
    async fn update_layer(
        &self,
        layer: u16,
        updates: &[Update],
    ) -> Result<Vec<Option<MapEntry>>, VolumeError> {
        let mut grown = false;
        let result = loop {
            let result = if layer == HEAD {
                self.map.update(updates).await
            } else {
                self.map.update_clone(layer, updates).await
            };
            match result {
                Err(MapError::PoolFull { needed, .. }) if !grown => {
                    grown = true;
                    if let Err(why) = self.grow_page_pool(needed).await {
                        let at = updates.first().map_or(0, |u| u.block * BLOCK_BYTES);
                        return Err(self.no_space_error(
                            at,
                            BLOCK_BYTES,
                            format!("the snapshot page pool is full and {why}"),
                        ));
                    }
                }
                result => break result,
            }
        };
        result.map_err(|e| {
            if matches!(e, MapError::PoolFull { .. }) {
                let at = updates.first().map_or(0, |u| u.block * BLOCK_BYTES);
                return self.no_space_error(at, BLOCK_BYTES, e.to_string());
            }
            self.map_failed(&e);
            map_error(&self.name, e)
        })
    }

    /// Grows the snapshot page pool by at least `needed` pages (and by a quarter at least): the
    /// metadata part first, then the header that counts the pages (FUA), then the map. A crash
    /// between them leaves a larger part and the old count (the tail unused): nothing is lost.
    /// Fails (with why) when the part cannot grow, e.g. its drives are full.
    pub(crate) async fn grow_page_pool(&self, needed: u64) -> Result<(), String> {
        let _one = self.pool_growth.lock().await;
        let (used, total) = self.map.pool_pages();
        if u64::from(total - used) >= needed {
            return Ok(()); // grown meanwhile
        }
        let mut header = Header::decode(&self.meta.read(0, BLOCK_USIZE).await.map_err(|e| e.to_string())?)?;
        let add = needed.max(u64::from(total) / 4).max(64);
        let pages = (u64::from(total) + add).min(u64::from(u32::MAX));
        header.pool_pages = pages;
        let bytes = header.meta_bytes().next_multiple_of(BLOCK_BYTES);
        if bytes > self.meta.size_bytes() {
            self.pool
                .resize_volume(self.meta.name(), bytes)
                .await
                .map_err(|e| format!("the metadata part could not grow to {bytes} bytes for it: {e}"))?;
        }
        self.meta
            .write(0, IoBytes::copy_from(&header.encode()), true)
            .await
            .map_err(|e| format!("the header could not be written: {e}"))?;
        self.map.grow_pool(u32::try_from(pages).expect("capped"));
        tracing::info!(volume = %self.name, from = total, to = pages, "snapshot page pool grown");
        Ok(())
    }

    /// Whether an error of [`Self::update_map`] left the map untouched (a full snapshot pool).
    fn nothing_applied(e: &VolumeError) -> bool {
        matches!(e, VolumeError::NoSpace { .. })
    }

    /// Frees the places that durable updates moved blocks away from.
    pub(crate) fn free_places(&self, olds: impl IntoIterator<Item = MapEntry>) {
        let mut cache_positions = Vec::new();
        let mut lowered: Vec<(usize, u64)> = Vec::new();
        for old in olds {
            match old.place {
                Place::Cache(p) => cache_positions.push(p),
                Place::Segment(a) => {
                    let s = self.geo.segment_of(a);
                    match lowered.last_mut() {
                        Some((last, n)) if *last == s => *n += 1,
                        _ => lowered.push((s, 1)),
                    }
                }
                Place::Unallocated | Place::Zero => {}
            }
        }
        if !lowered.is_empty() {
            let mut space = self.space.lock();
            for (s, n) in lowered {
                space.lower(s, n);
            }
        }
        self.ring.release(cache_positions);
    }

    // ---------------------------------------------------------------- reads

    /// Reads `len_bytes` at `offset_bytes` (any alignment).
    pub async fn read(&self, offset_bytes: u64, len_bytes: usize) -> Result<IoBuf, VolumeError> {
        self.check_range(offset_bytes, len_bytes as u64)?;
        self.counters.host_read_ops.fetch_add(1, Relaxed);
        self.counters.host_read_bytes.fetch_add(len_bytes as u64, Relaxed);
        if len_bytes == 0 {
            return Ok(IoBuf::zeroed(0));
        }
        let span = Span::new(offset_bytes, len_bytes as u64);
        let buf = self.read_blocks(span.first, span.blocks()).await?;
        Ok(span.clip(buf))
    }

    /// Makes snapshot `name` of the volume (docs/design/snapshots.md): writes in flight finish
    /// first and new ones wait until it is made; it holds every write acknowledged before it,
    /// none after. Returns it once durable.
    pub async fn create_snapshot(&self, name: &str) -> Result<LayerRecord, TierError> {
        let refuse = |why: String| TierError::Invalid(format!("snapshot {name:?} of {}: {why}", self.name));
        if let Some(why) = crate::layers::name_problem(name) {
            return Err(refuse(why));
        }
        if self.map.snapshots().iter().any(|s| s.name == name) {
            return Err(refuse("a snapshot of that name exists".into()));
        }
        self.check_writable(0, self.size_bytes)?;
        let _one = self.snapshot_ops.lock().await;
        let _drained = self.writes.write().await;
        let record = self.new_record(name, LayerKind::Snapshot);
        let head = LayerRecord::named(&self.name, LayerKind::Head, self.size_bytes);
        let mut made = self.map.create_snapshot(head.clone(), record.clone()).await;
        if let Err(MapError::PoolFull { needed, .. }) = made
            && self.grow_page_pool(needed).await.is_ok()
        {
            made = self.map.create_snapshot(head, record).await;
        }
        let id = made.map_err(|e| self.layer_op_error(&format!("snapshot {name:?}"), e))?;
        Ok(self.map.snapshots().into_iter().find(|s| s.id == id).expect("just made"))
    }

    /// The record of a layer `name` to be made now (its id and pages are the map's to choose).
    fn new_record(&self, name: &str, kind: LayerKind) -> LayerRecord {
        let mut record = LayerRecord::named(name, kind, self.size_bytes);
        record.created_seq = self.seq.load(Relaxed);
        record.created_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        record
    }

    /// Deletes snapshot `name` (docs/design/snapshots.md, "Snapshot delete"): no data is
    /// copied; its map page copies are handed to the next older snapshot or dropped, and the
    /// places no layer holds any more are freed for GC. Writes wait while it runs (it costs a
    /// log record per map page the snapshot owns).
    pub async fn delete_snapshot(&self, name: &str) -> Result<DeleteStats, TierError> {
        let _one = self.snapshot_ops.lock().await;
        let Some(snap) = self.map.snapshots().into_iter().find(|s| s.name == name) else {
            return Err(TierError::Invalid(format!("{} has no snapshot {name:?}", self.name)));
        };
        self.check_writable(0, self.size_bytes)?;
        let stats = self
            .map
            .delete_snapshot(snap.id, |freed| self.free_places(freed.into_iter().map(|(_, e)| e)))
            .await
            .map_err(|e| self.layer_op_error(&format!("deleting snapshot {name:?}"), e))?;
        tracing::info!(volume = %self.name, snapshot = name, ?stats, "snapshot deleted");
        Ok(stats)
    }

    /// The error of a snapshot or clone operation `what`: a refusal (nothing changed) for what
    /// the layers or a full page pool refuse; anything else stops writes (see
    /// [`Self::map_failed`]).
    fn layer_op_error(&self, what: &str, e: MapError) -> TierError {
        match e {
            MapError::Layers(why) => TierError::Invalid(format!("{what} of {}: {why}", self.name)),
            MapError::PoolFull { .. } => TierError::Invalid(format!("{what} of {}: {e}", self.name)),
            e => {
                self.map_failed(&e);
                map_error(&self.name, e).into()
            }
        }
    }

    /// Rolls the volume back to snapshot `name`, its newest: afterwards it reads as the
    /// snapshot does, and the snapshots stay as they were. No data is
    /// copied: the map entries of the pages changed since the snapshot are set to its entries.
    /// Host writes wait, and destage and GC pause, while it runs; clients should not have a
    /// file system mounted from the volume. A crash before it returns leaves it to open to
    /// finish. Returns how many blocks changed.
    pub async fn rollback(&self, name: &str) -> Result<u64, TierError> {
        let _one = self.snapshot_ops.lock().await;
        let snaps = self.map.snapshots();
        let Some(snap) = snaps.iter().find(|s| s.name == name).cloned() else {
            return Err(TierError::Invalid(format!("{} has no snapshot {name:?}", self.name)));
        };
        // Only to the newest: the head then holds what the newest holds, so every version of a
        // block is still held by a run of neighbouring layers, which frees rely on (an
        // overwrite asks only the newest snapshot, a delete only the neighbours). Rolled back
        // to an older one, the head would share blocks with it past the newer ones, and those
        // checks would free blocks it still holds (the log simulation found exactly that).
        if let Some(newer) = snaps.iter().rev().take_while(|s| s.id != snap.id).map(|s| &s.name).next() {
            return Err(TierError::Invalid(format!(
                "{} can be rolled back only to its newest snapshot ({newer:?}); delete the newer snapshots first",
                self.name
            )));
        }
        if let Some(kept) = self.map.newest_snapshot().filter(|s| s.id != snap.id) {
            return Err(TierError::Invalid(format!(
                "{} can be rolled back only to its newest snapshot, and {:?}, deleted but kept for its clones, is newer than {name:?}; delete those clones first",
                self.name, kept.name
            )));
        }
        self.check_writable(0, self.size_bytes)?;
        let _drained = self.writes.write().await;
        let _moves = self.moving.lock().await;
        let failed = |e: MapError| -> TierError {
            self.map_failed(&e);
            map_error(&self.name, e).into()
        };
        // Room first: each changed page may need a copy in the newest snapshot (and a table
        // page per 1,016), and a rollback that began must be able to finish at open.
        let pages = self.map.changed_since(snap.id).await.map_err(failed)?.len() as u64;
        let needed = pages + pages.div_ceil(crate::layers::INDEX_ENTRIES as u64);
        let (used, total) = self.map.pool_pages();
        if needed > u64::from(total - used) {
            let _ = self.grow_page_pool(needed - u64::from(total - used)).await;
        }
        let (used, total) = self.map.pool_pages();
        if needed > u64::from(total - used) {
            return Err(TierError::Invalid(format!(
                "rolling {} back to {name:?} may need {needed} snapshot map pages and {} are free (the pool could not grow): delete snapshots first",
                self.name,
                total - used
            )));
        }
        self.map.mark_rollback(snap.id).await.map_err(failed)?;
        let restored = self.restore(snap.id).await?;
        self.map.mark_rollback(0).await.map_err(failed)?;
        tracing::info!(volume = %self.name, snapshot = name, restored, "rolled back");
        Ok(restored)
    }

    /// Sets the head's entries of every page changed since snapshot `layer` to the snapshot's
    /// (as host writes would, so the newest snapshot keeps what they replace, and what none
    /// holds is freed). The caller keeps host writes, destage and GC out.
    async fn restore(&self, layer: u16) -> Result<u64, VolumeError> {
        let pages = self.map.changed_since(layer).await.map_err(|e| map_error(&self.name, e))?;
        let mut restored = 0;
        for chunk in pages.chunks(16) {
            let blocks: Vec<u64> = chunk
                .iter()
                .flat_map(|&p| p * ENTRIES_PER_PAGE..((p + 1) * ENTRIES_PER_PAGE).min(self.blocks))
                .collect();
            let want = self.map.get_in(layer, &blocks).await.map_err(|e| map_error(&self.name, e))?;
            let now = self.map.get_many(&blocks).await.map_err(|e| map_error(&self.name, e))?;
            let updates: Vec<Update> = blocks
                .iter()
                .zip(want.iter().zip(&now))
                .filter(|(_, (w, n))| w != n)
                .map(|(&block, (&entry, _))| Update { block, entry, expect: None })
                .collect();
            if updates.is_empty() {
                continue;
            }
            let olds = self.update_map(&updates).await?;
            self.free_places(olds.into_iter().flatten());
            restored += updates.len() as u64;
        }
        Ok(restored)
    }

    /// Bytes only snapshot `layer` holds: what deleting it would free.
    pub async fn exclusive_bytes(&self, layer: u16) -> Result<u64, TierError> {
        let blocks = self.map.exclusive_blocks(layer).await.map_err(|e| match e {
            MapError::Layers(why) => TierError::Invalid(format!("{}: {why}", self.name)),
            e => map_error(&self.name, e).into(),
        })?;
        Ok(blocks * BLOCK_BYTES)
    }

    /// The volume's snapshots, oldest first.
    pub fn snapshots(&self) -> Vec<LayerRecord> {
        self.map.snapshots()
    }

    /// The name of snapshot `id`, with a note if it was deleted and is kept for clones.
    pub fn parent_name(&self, id: u16) -> String {
        match self.map.layer_record(id) {
            Some(r) if r.hidden => format!("{} (deleted, kept for its clones)", r.name),
            Some(r) => r.name,
            None => format!("(layer {id}, gone)"),
        }
    }

    /// The clones of the volume's snapshots.
    pub fn clones(&self) -> Vec<LayerRecord> {
        self.map.clones()
    }

    /// Makes clone `name` of snapshot `snap` (docs/design/snapshots.md, "Clone"): a writable
    /// layer that reads as the snapshot until written, sharing its data and this volume's
    /// cache, segment space and GC. Nothing is copied; it is durable when this returns.
    pub async fn create_clone(&self, snap: &str, name: &str) -> Result<LayerRecord, TierError> {
        let refuse =
            |why: String| TierError::Invalid(format!("clone {name:?} of {}@{snap}: {why}", self.name));
        if let Some(why) = crate::layers::name_problem(name) {
            return Err(refuse(why));
        }
        let _one = self.snapshot_ops.lock().await;
        let Some(parent) = self.map.snapshots().into_iter().find(|s| s.name == snap) else {
            return Err(TierError::Invalid(format!("{} has no snapshot {snap:?}", self.name)));
        };
        self.check_writable(0, self.size_bytes)?;
        let record = self.new_record(name, LayerKind::Clone);
        let mut made = self.map.create_clone(parent.id, record.clone()).await;
        if let Err(MapError::PoolFull { needed, .. }) = made
            && self.grow_page_pool(needed).await.is_ok()
        {
            made = self.map.create_clone(parent.id, record).await;
        }
        let id = made.map_err(|e| self.layer_op_error(&format!("clone {name:?}"), e))?;
        Ok(self.map.clones().into_iter().find(|c| c.id == id).expect("just made"))
    }

    /// Deletes clone `name`: its own map pages are dropped (no data copied) and the places only
    /// it held are freed for GC; a deleted snapshot kept only for it goes too. Writes to the
    /// family wait while it runs.
    pub async fn delete_clone(&self, name: &str) -> Result<DeleteStats, TierError> {
        let _one = self.snapshot_ops.lock().await;
        let Some(clone) = self.map.clones().into_iter().find(|c| c.name == name) else {
            return Err(TierError::Invalid(format!("{} has no clone {name:?}", self.name)));
        };
        self.check_writable(0, self.size_bytes)?;
        let stats = self
            .map
            .delete_clone(clone.id, |freed| self.free_places(freed.into_iter().map(|(_, e)| e)))
            .await
            .map_err(|e| self.layer_op_error(&format!("deleting clone {name:?}"), e))?;
        self.ring.hungry.notify_one();
        tracing::info!(volume = %self.name, clone = name, ?stats, "clone deleted");
        Ok(stats)
    }

    /// Allocation map of clone `layer` (as [`Self::block_status`] of the head).
    pub async fn block_status_in(
        &self,
        layer: u16,
        offset_bytes: u64,
        len_bytes: u64,
    ) -> Result<Vec<Extent>, VolumeError> {
        self.check_range(offset_bytes, len_bytes)?;
        if len_bytes == 0 {
            return Ok(Vec::new());
        }
        let span = Span::new(offset_bytes, len_bytes);
        let mut out = ExtentRuns::new();
        for e in self.entries_in(Some(layer), span.first, span.blocks()).await? {
            out.push(matches!(e.place, Place::Unallocated | Place::Zero), 1);
        }
        Ok(out.finish(&span))
    }

    /// Reads `len_bytes` at `offset_bytes` of snapshot or clone `layer` (any alignment).
    pub async fn read_snapshot(
        &self,
        layer: u16,
        offset_bytes: u64,
        len_bytes: usize,
    ) -> Result<IoBuf, VolumeError> {
        self.check_range(offset_bytes, len_bytes as u64)?;
        if len_bytes == 0 {
            return Ok(IoBuf::zeroed(0));
        }
        let span = Span::new(offset_bytes, len_bytes as u64);
        let buf = self.read_view(Some(layer), span.first, span.blocks()).await?;
        Ok(span.clip(buf))
    }

    /// Reads whole blocks, each verified against its map entry; a block whose entry changed
    /// under the read (moved, rewritten) is read again.
    pub(crate) async fn read_blocks(&self, first: u64, n: u64) -> Result<IoBuf, VolumeError> {
        self.read_view(None, first, n).await
    }

    /// [`Self::read_blocks`] of the head (`None`) or of a snapshot.
    async fn read_view(&self, view: Option<u16>, first: u64, n: u64) -> Result<IoBuf, VolumeError> {
        let mut out = IoBuf::zeroed((n * BLOCK_BYTES) as usize);
        let mut pending: Vec<u64> = (0..n).collect();
        let mut entries = self.entries_in(view, first, n).await?;
        for attempt in 0..READ_ATTEMPTS {
            if attempt > 0 {
                self.counters.read_retries.fetch_add(1, Relaxed);
                tokio::task::yield_now().await;
                entries.clear();
                for &i in &pending {
                    entries.push(self.entries_in(view, first + i, 1).await?[0]);
                }
            }
            let mut bad = Vec::new();
            let (pending_ref, entries_ref) = (&pending, &entries);
            let reads = runs(&pending, &entries, self.ring.ring_blocks()).into_iter().map(|run| async move {
                let buf = match run.place {
                    Place::Cache(p) => {
                        self.counters.blocks_read_from_cache.fetch_add(run.count, Relaxed);
                        Some(self.cache.read(self.ring.block_of(p) * BLOCK_BYTES, run.len_bytes()).await?)
                    }
                    Place::Segment(a) => {
                        self.counters.blocks_read_from_segments.fetch_add(run.count, Relaxed);
                        match self.seg.read(a * BLOCK_BYTES, run.len_bytes()).await {
                            Ok(buf) => Some(buf),
                            // GC may have emptied the segment and given it back to the pool
                            // under this read: its blocks are read again if an entry moved.
                            Err(e) => {
                                let ks = run.first_k..run.first_k + run.count as usize;
                                let blocks: Vec<u64> = ks.clone().map(|k| first + pending_ref[k]).collect();
                                let now = match view {
                                    None => self.map.get_many(&blocks).await,
                                    Some(layer) => self.map.get_in(layer, &blocks).await,
                                }
                                .map_err(|e| map_error(&self.name, e))?;
                                if now.iter().zip(&entries_ref[ks]).all(|(a, b)| a == b) {
                                    return Err(e);
                                }
                                return Ok((run, Got::Moved));
                            }
                        }
                    }
                    Place::Unallocated | Place::Zero => None,
                };
                Ok::<_, VolumeError>((run, buf.map_or(Got::Zeros, Got::Data)))
            });
            for (run, got) in join_all_ok(reads).await? {
                for j in 0..run.count {
                    let k = run.first_k + j as usize;
                    let i = pending[k];
                    let dst = &mut out[(i * BLOCK_BYTES) as usize..((i + 1) * BLOCK_BYTES) as usize];
                    let buf = match &got {
                        Got::Data(buf) => buf,
                        Got::Zeros => {
                            dst.fill(0);
                            continue;
                        }
                        Got::Moved => {
                            bad.push(i);
                            continue;
                        }
                    };
                    let data = &buf[(j * BLOCK_BYTES) as usize..((j + 1) * BLOCK_BYTES) as usize];
                    if block_crc(data) == entries[k].crc {
                        dst.copy_from_slice(data);
                    } else if self.entries_in(view, first + i, 1).await?[0] == entries[k] {
                        return Err(self.unrecoverable(
                            first + i,
                            "the block does not match its checksum in the map (corrupt; not returned)",
                        ));
                    } else {
                        bad.push(i);
                    }
                }
            }
            if bad.is_empty() {
                return Ok(out);
            }
            bad.sort_unstable();
            pending = bad;
        }
        Err(self.unrecoverable(first + pending[0], "the block kept moving under the read"))
    }

    // ---------------------------------------------------------------- writes

    /// Writes `data` at `offset_bytes` (any alignment). Durable when this returns, FUA or not.
    pub async fn write(&self, offset_bytes: u64, data: IoBytes, _fua: bool) -> Result<(), VolumeError> {
        self.write_to(HEAD, offset_bytes, data).await
    }

    /// [`Self::write`] to the head ([`HEAD`]) or to clone `layer`.
    pub async fn write_to(&self, layer: u16, offset_bytes: u64, data: IoBytes) -> Result<(), VolumeError> {
        let len = data.len() as u64;
        self.check_range(offset_bytes, len)?;
        self.check_writable(offset_bytes, len)?;
        self.counters.host_write_ops.fetch_add(1, Relaxed);
        self.counters.host_write_bytes.fetch_add(len, Relaxed);
        self.last_write_ms.store(self.now_ms(), Relaxed);
        if len == 0 {
            return Ok(());
        }
        let _write = self.writes.read().await;
        let span = Span::new(offset_bytes, len);
        crate::write_any_alignment(
            span,
            data,
            &self.rmw_locks,
            |b| self.read_view((layer != HEAD).then_some(layer), b, 1),
            |first, d| self.write_blocks(layer, first, d),
        )
        .await
    }

    async fn write_blocks(&self, layer: u16, first: u64, data: IoBytes) -> Result<(), VolumeError> {
        let n = data.len() as u64 / BLOCK_BYTES;
        let step = (self.ring.ring_blocks() / 2).max(1);
        let mut done = 0;
        while done < n {
            let m = (n - done).min(step);
            let piece = data.slice((done * BLOCK_BYTES) as usize..((done + m) * BLOCK_BYTES) as usize);
            self.write_piece(layer, first + done, piece).await?;
            done += m;
        }
        Ok(())
    }

    fn no_space_error(&self, offset_bytes: u64, len_bytes: u64, why: String) -> VolumeError {
        VolumeError::NoSpace { volume: self.name.clone(), offset_bytes, len_bytes, why }
    }

    async fn write_piece(&self, layer: u16, first: u64, data: IoBytes) -> Result<(), VolumeError> {
        let n = data.len() as u64 / BLOCK_BYTES;
        let start = match self.ring.reserve(n).await {
            Ok(s) => s,
            Err(why) => {
                // The mover's own reason (what is full, what frees space), not its error text.
                if let Some(full) = self.no_space.lock().clone() {
                    return Err(self.no_space_error(first * BLOCK_BYTES, n * BLOCK_BYTES, full));
                }
                return Err(VolumeError::Unrecoverable {
                    volume: self.name.clone(),
                    offset_bytes: first * BLOCK_BYTES,
                    len_bytes: n * BLOCK_BYTES,
                    reason: format!("the write cache is full and cannot be emptied: {why}"),
                });
            }
        };
        // 1. Data into the cache, durably (split where the ring wraps).
        let phys = self.ring.block_of(start);
        let before_wrap = (self.ring.ring_blocks() - phys).min(n);
        let mut writes = vec![self.cache.write(
            phys * BLOCK_BYTES,
            data.slice(0..(before_wrap * BLOCK_BYTES) as usize),
            true,
        )];
        if before_wrap < n {
            writes.push(self.cache.write(
                0,
                data.slice((before_wrap * BLOCK_BYTES) as usize..data.len()),
                true,
            ));
        }
        if let Err(e) = join_all_ok(writes).await {
            self.ring.release(start..start + n);
            return Err(e);
        }
        // 2. The map, durably. Positions are claimed first: a newer write may free them as soon
        // as the update is applied.
        let seq = self.seq.fetch_add(1, Relaxed) as u32;
        let updates: Vec<Update> = data
            .chunks_exact(BLOCK_USIZE)
            .zip(0..)
            .map(|(b, k)| {
                self.ring.claim_block(start + k, first + k);
                Update {
                    block: first + k,
                    entry: MapEntry { place: Place::Cache(start + k), crc: block_crc(b), seq },
                    expect: None,
                }
            })
            .collect();
        let settle = self.settle.read().await;
        let olds = match self.update_layer(layer, &updates).await {
            Ok(olds) => olds,
            Err(e) => {
                if Self::nothing_applied(&e) {
                    // No entry points at the positions: they go back to the ring.
                    self.ring.release(start..start + n);
                }
                return Err(e);
            }
        };
        // 3. Acknowledged; free what the blocks no longer use.
        self.free_places(olds.into_iter().map(|o| o.expect("unconditional")));
        drop(settle);
        Ok(())
    }

    /// Zeroes a range: whole blocks become `Zero` (no data, no space), partial edges are written.
    pub async fn write_zeroes(
        &self,
        offset_bytes: u64,
        len_bytes: u64,
        fast_only: bool,
    ) -> Result<(), VolumeError> {
        self.write_zeroes_to(HEAD, offset_bytes, len_bytes, fast_only).await
    }

    /// [`Self::write_zeroes`] of the head ([`HEAD`]) or of clone `layer`.
    pub async fn write_zeroes_to(
        &self,
        layer: u16,
        offset_bytes: u64,
        len_bytes: u64,
        fast_only: bool,
    ) -> Result<(), VolumeError> {
        self.check_range(offset_bytes, len_bytes)?;
        if len_bytes == 0 {
            return Ok(());
        }
        let split = ZeroSplit::new(offset_bytes, len_bytes, BLOCK_BYTES);
        if fast_only && split.has_slow_part() {
            return Err(VolumeError::NotCheap { offset_bytes, len_bytes });
        }
        if let Some((first, n)) = split.cheap_blocks() {
            let _write = self.writes.read().await;
            self.set_places(layer, first, n, Place::Zero).await?;
        }
        for edge in [split.head, split.tail] {
            if !edge.is_empty() {
                self.write_to(layer, edge.start, IoBytes::zeroed((edge.end - edge.start) as usize)).await?;
            }
        }
        Ok(())
    }

    /// Discards whole blocks (edges are left as they are): they read as zeros and hold no space.
    pub async fn trim(&self, offset_bytes: u64, len_bytes: u64) -> Result<(), VolumeError> {
        self.trim_in(HEAD, offset_bytes, len_bytes).await
    }

    /// [`Self::trim`] of the head ([`HEAD`]) or of clone `layer`.
    pub async fn trim_in(&self, layer: u16, offset_bytes: u64, len_bytes: u64) -> Result<(), VolumeError> {
        self.check_range(offset_bytes, len_bytes)?;
        if let Some((first, n)) = ZeroSplit::new(offset_bytes, len_bytes, BLOCK_BYTES).cheap_blocks() {
            let _write = self.writes.read().await;
            self.set_places(layer, first, n, Place::Unallocated).await?;
        }
        Ok(())
    }

    async fn set_places(&self, layer: u16, first: u64, n: u64, place: Place) -> Result<(), VolumeError> {
        self.check_writable(first * BLOCK_BYTES, n * BLOCK_BYTES)?;
        self.last_write_ms.store(self.now_ms(), Relaxed);
        let mut b = first;
        while b < first + n {
            let m = (first + n - b).min(ZERO_STEP);
            let seq = self.seq.fetch_add(1, Relaxed) as u32;
            let updates: Vec<Update> = (b..b + m)
                .map(|block| Update { block, entry: MapEntry { place, crc: 0, seq }, expect: None })
                .collect();
            let settle = self.settle.read().await;
            let olds = self.update_layer(layer, &updates).await?;
            self.free_places(olds.into_iter().map(|o| o.expect("unconditional")));
            drop(settle);
            b += m;
        }
        // Freed space may let a stuck destage go on.
        self.ring.hungry.notify_one();
        Ok(())
    }

    /// Every acknowledged write is durable already; the flush still asks the pool for one, which
    /// (after writes) raises the pool's flush epoch, so a copy of a drive taken before it is
    /// never trusted again (docs/design/stale-copies.md). With nothing written since the last
    /// pool flush that costs nothing.
    pub async fn flush(&self) -> Result<(), VolumeError> {
        if self.closed.load(Relaxed) {
            return Err(VolumeError::Closed(self.name.clone()));
        }
        self.pool
            .flush()
            .await
            .map_err(|e| VolumeError::Pool { volume: self.name.clone(), source: Box::new(e) })
    }

    /// Allocation map: unallocated and zeroed blocks are holes.
    pub async fn block_status(&self, offset_bytes: u64, len_bytes: u64) -> Result<Vec<Extent>, VolumeError> {
        self.check_range(offset_bytes, len_bytes)?;
        if len_bytes == 0 {
            return Ok(Vec::new());
        }
        let span = Span::new(offset_bytes, len_bytes);
        let mut out = ExtentRuns::new();
        for e in self.entries(span.first, span.blocks()).await? {
            out.push(matches!(e.place, Place::Unallocated | Place::Zero), 1);
        }
        Ok(out.finish(&span))
    }

    /// Worst state of the three parts.
    pub fn state(&self) -> VolumeState {
        crate::worst_state([self.meta.state(), self.cache.state(), self.seg.state()])
    }

    /// Stops the mover and waits for the batch it is running; writes a map checkpoint so the next
    /// open replays little. Requests after this fail with `Closed`.
    pub async fn close(&self) {
        self.stop();
        drop(self.moving.lock().await);
        if self.failure.lock().is_none()
            && let Err(e) = self.map.checkpoint().await
        {
            tracing::warn!(volume = %self.name, error = %e, "map checkpoint at close failed; the next open replays the log");
        }
    }

    /// Like [`LogVolume::close`] without waiting (for `Drop`): the mover stops after its batch.
    pub fn stop(&self) {
        self.closed.store(true, Relaxed);
        self.ring.shut(format!("volume {} is closed", self.name));
        self.ring.hungry.notify_one();
        self.map.wake_checkpoint_task();
    }

    /// Status and counters.
    pub fn status(&self) -> LogStatus {
        let c = &self.counters;
        let counts = self.space_counts();
        let block = |n: u64| n * BLOCK_BYTES;
        let seg_data = self.geo.segment_data();
        let parts = crate::parts_status(
            &self.pool,
            &[("meta", &self.meta), ("cache", &self.cache), ("seg", &self.seg)],
        );
        // This volume's own drive writes, not its drives' (which count every volume on them).
        let fast_written = parts[0].member_write_bytes + parts[1].member_write_bytes;
        let no_space = self.no_space.lock().clone();
        let host_written = c.host_write_bytes.load(Relaxed);
        let per_host_byte = |drive: u64| (host_written > 0).then(|| drive as f64 / host_written as f64);
        LogStatus {
            name: self.name.clone(),
            layout: self.layout(),
            size_bytes: self.size_bytes,
            state: self.state(),
            allocated_bytes: block(counts.live_blocks),
            space_bytes: block(counts.segments * seg_data),
            space_max_bytes: block(counts.max_segments * seg_data),
            free_bytes: block(counts.free_segments * seg_data),
            garbage_bytes: block(counts.garbage_blocks),
            reserved_bytes: block(counts.reserve_segments * seg_data),
            segment_bytes: block(seg_data),
            free_segments: counts.free_segments,
            segments: counts.segments,
            cache_blocks: self.ring.ring_blocks(),
            cache_live_blocks: self.ring.live(),
            host_write_bytes: host_written,
            host_read_bytes: c.host_read_bytes.load(Relaxed),
            blocks_read_from_cache: c.blocks_read_from_cache.load(Relaxed),
            blocks_read_from_segments: c.blocks_read_from_segments.load(Relaxed),
            destage_batches: c.destage_batches.load(Relaxed),
            destaged_blocks: c.destaged_blocks.load(Relaxed),
            padded_slots: c.padded_slots.load(Relaxed),
            gc_batches: c.gc_batches.load(Relaxed),
            gc_moved_blocks: c.gc_moved_blocks.load(Relaxed),
            gc_victims: c.gc_victims.load(Relaxed),
            moves_lost: c.moves_lost.load(Relaxed),
            segments_given_back: c.segments_given_back.load(Relaxed),
            snapshot_pool_pages_used: u64::from(self.map.pool_pages().0),
            snapshot_pool_pages: u64::from(self.map.pool_pages().1),
            full: no_space.is_some(),
            no_space,
            write_amplification_fast: per_host_byte(fast_written),
            write_amplification_capacity: per_host_byte(parts[2].member_write_bytes),
            parts,
        }
    }
}

/// What a read of one run found.
enum Got {
    Data(IoBuf),
    Zeros,
    /// The read failed and an entry of the run changed meanwhile: read it again.
    Moved,
}

/// Consecutive pending blocks that live in one place, contiguously.
#[derive(Debug, Clone, Copy)]
struct Run {
    /// Index into `pending` of the first block.
    first_k: usize,
    count: u64,
    place: Place,
}

impl Run {
    fn len_bytes(&self) -> usize {
        (self.count * BLOCK_BYTES) as usize
    }
}

/// Groups `pending` blocks (with their `entries`) into runs readable with one part read: zeros,
/// consecutive cache positions that do not cross the ring's end, consecutive segment addresses.
fn runs(pending: &[u64], entries: &[MapEntry], ring: u64) -> Vec<Run> {
    let mut out: Vec<Run> = Vec::new();
    for (k, (&i, e)) in pending.iter().zip(entries).enumerate() {
        if let Some(last) = out.last_mut() {
            let follows = pending[last.first_k] + last.count == i;
            let joins = match (last.place, e.place) {
                (Place::Cache(a), Place::Cache(b)) => b == a + last.count && !b.is_multiple_of(ring),
                (Place::Segment(a), Place::Segment(b)) => b == a + last.count,
                (Place::Unallocated | Place::Zero, Place::Unallocated | Place::Zero) => true,
                _ => false,
            };
            if follows && joins {
                last.count += 1;
                continue;
            }
        }
        out.push(Run { first_k: k, count: 1, place: e.place });
    }
    out
}
