//! Creating and opening a log volume: its parts, header and pool record; at open, the map's
//! replay over the persisted segment table (or a scan of the whole map) for the live counts and
//! the owners of cache positions.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::Instant;

use parking_lot::Mutex;
use stria_dev::{BLOCK_BYTES, BLOCK_USIZE, BlockDevice, IoBytes};
use stria_engine::{DriveClass, EngineError, Layout, Pool, TieredRecord, Volume};

use super::header::{Header, NEW_VERSION};
use super::space::{Geometry, Space};
use super::{
    Clock, Gates, Health, INITIAL_SEGMENTS, LogCounters, LogKind, LogParams, LogSpec, LogVolume, Parts,
    RMW_LOCKS, SpaceState, mover, table,
};
use crate::TierError;
use crate::map::{ENTRIES_PER_PAGE, MapEntry, MapError, MapStore, Place};
use crate::ring::CacheRing;

/// Maps up to this many pages are checked against the persisted table at every open that used
/// it (debug builds: the tests).
pub(super) const VERIFY_TABLE_PAGES: u64 = 65536;

/// What a log volume of a given spec is made of, before it is created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogPlan {
    /// Bytes of the metadata part (header, map log, map pages, segment table, snapshot page
    /// pool), mirrored on the fast drives (or capacity drives for `log:`).
    pub meta_bytes: u64,
    /// Bytes of the write cache at create, mirrored likewise.
    pub cache_bytes: u64,
    /// Bytes the write cache may grow to (as much as `cache_bytes` when it stays).
    pub cache_max_bytes: u64,
    /// Bytes of the segment space at most (its data; parity comes on top).
    pub space_bytes: u64,
}

/// The sizes [`create`] would give a volume of `spec`, or why it would refuse it (checked as
/// `create` checks the spec itself, not against a pool): for tools and benchmarks that size
/// drives for a volume.
pub fn plan(spec: &LogSpec) -> Result<LogPlan, TierError> {
    let p = plan_header(spec)?;
    Ok(LogPlan {
        meta_bytes: p.header.meta_bytes(),
        cache_bytes: p.cache_bytes,
        cache_max_bytes: p.cache_max_bytes,
        space_bytes: p.header.geo.segments * p.header.geo.segment_data() * BLOCK_BYTES,
    })
}

struct Planned {
    header: Header,
    ec: Layout,
    cache_bytes: u64,
    cache_max_bytes: u64,
}

/// The header and parts of a new volume of `spec`.
fn plan_header(spec: &LogSpec) -> Result<Planned, TierError> {
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
    // The default cache starts small and grows as writes need it (`grow_cache`), to an
    // eighth of what the volume can hold: its size, or its space where that is smaller (an
    // over-committed volume never holds more data than its space, and a cache larger than that
    // would only take fast-tier room). One given (`--cache-size`) stays that size.
    let two_batches = (2 * geo.batch_data() * BLOCK_BYTES).next_multiple_of(64 << 10);
    let (cache_bytes, cache_max_bytes) = match spec.cache_bytes {
        Some(bytes) => {
            let bytes = bytes.next_multiple_of(64 << 10);
            (bytes, spec.cache_max_bytes.map_or(bytes, |m| m.next_multiple_of(64 << 10).max(bytes)))
        }
        None => {
            let most = (size_bytes.min(space_data * BLOCK_BYTES) / 8)
                .clamp(64 << 20, 8 << 30)
                .next_multiple_of(64 << 10);
            (super::INITIAL_CACHE_BYTES.max(two_batches).min(most), most)
        }
    };
    let cache_blocks = cache_bytes / BLOCK_BYTES;
    if cache_blocks < 2 * geo.batch_data() {
        return invalid(format!(
            "the cache ({}) must hold at least two batches ({} each)",
            stria_engine::units::format_size(cache_bytes),
            stria_engine::units::format_size(geo.batch_bytes_data())
        ));
    }
    // Metadata sized by use, not by the logical size alone (issue 39). The map log: twice the
    // map's pages, so that a checkpoint (which starts at half the ring) writes at most as many
    // pages as log blocks were written since the last one, even when every page is dirty
    // (4 MiB at least, 256 MiB at most; it was a sixteenth of the blocks, 256 MiB for 4 GiB).
    let map_pages = blocks.div_ceil(ENTRIES_PER_PAGE);
    let map_log_blocks = spec.map_log_blocks.unwrap_or_else(|| (2 * map_pages).clamp(1024, 65536));
    // Snapshot copies of map pages: an eighth of the map to start with; the pool grows when a
    // write or a snapshot needs more (`grow_page_pool`: the part first, then the header), up to
    // 2^32 pages (it was made for every page copied twice: 32 MiB for 4 GiB before a snapshot).
    let pool_pages = (map_pages / 8 + 64).min(1 << 20);
    let header = Header::packed(NEW_VERSION, size_bytes, geo, cache_blocks, map_log_blocks, pool_pages);
    Ok(Planned { header, ec, cache_bytes, cache_max_bytes })
}

/// Creates a log-structured volume: its three parts, its header, its pool record.
pub async fn create<D: BlockDevice>(
    pool: &Arc<Pool<D>>,
    spec: LogSpec,
) -> Result<Arc<LogVolume<D>>, TierError> {
    let invalid = |s: String| Err(TierError::Invalid(s));
    let Planned { header, ec, cache_bytes, cache_max_bytes } = plan_header(&spec)?;
    let (size_bytes, geo) = (header.volume_bytes, header.geo);
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
    let seg_bytes = parts[2].size_bytes;
    let made = match crate::create_parts(pool, parts).await {
        Ok(made) => made,
        Err((part, TierError::Engine(EngineError::NoSpace(why)))) => {
            let why = if part == 0 {
                why
            } else {
                format!("{why} (counting the parts made before it, deleted again)")
            };
            let what = no_room_message(&spec, &header, cache_bytes, seg_bytes, fast_class, &why);
            return Err(EngineError::NoSpace(what).into());
        }
        Err((_, e)) => return Err(e),
    };
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
        gc: spec.gc,
        hold: false,
        eager_compaction: false,
        write_back: spec.cache_mode == super::CacheMode::WriteBack,
        cache_max_bytes: if cache_max_bytes > cache_bytes { cache_max_bytes } else { 0 },
    };
    pool.add_tiered(TieredRecord {
        name: name.clone(),
        size_bytes,
        cache_volume: cache.id(),
        meta_volume: meta.id(),
        capacity_volume: seg.id(),
        params: serde_json::to_value(params).expect("params serialize"),
        replaces: spec.replaces.clone(),
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
    let vol = open(pool, &rec).await?;
    // It opened from the table written above: every count is zero and the map is empty, so the
    // counts are exact (an open from a table marks them suspect, which would cost the first
    // moment of low space a scan of the whole map).
    vol.space.counts_suspect.store(false, std::sync::atomic::Ordering::Relaxed);
    Ok(vol)
}

/// Why a new log volume found no room, with what its parts need: a thin volume's metadata is
/// sized by its logical size (the map, 16 bytes per block), which surprises an operator who
/// asked for a large thin volume on small drives. `why` is the engine's refusal of the part
/// that did not fit (it counts the parts made before it, deleted again, as used).
fn no_room_message(
    spec: &LogSpec,
    header: &Header,
    cache_bytes: u64,
    seg_bytes: u64,
    class: DriveClass,
    why: &str,
) -> String {
    use stria_engine::units::format_size;
    let kind = if spec.fast_tier { "tiered" } else { "log" };
    format!(
        "not enough free space for volume {} ({kind}:ec:{}+{}, {}): it needs {} of metadata (its map \
         takes 16 bytes per 4 KiB block of the volume's size) and a write cache of {} (--cache-size), \
         each in {} copies on distinct {class} drives, and {} of segment space to start with. The part \
         that did not fit: {why}",
        spec.name,
        spec.data_shards,
        spec.parity_shards,
        format_size(header.volume_bytes),
        format_size(header.meta_bytes()),
        format_size(cache_bytes),
        spec.copies,
        format_size(seg_bytes),
    )
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
    let mut params: LogParams =
        serde_json::from_value(rec.params.clone()).map_err(|e| corrupt(format!("bad parameters: {e}")))?;
    // Benchmarks write back without changing the record.
    params.write_back |= std::env::var_os("STRIA_WRITE_BACK").is_some_and(|v| v == "1");
    let header = Header::decode(&meta.read(0, BLOCK_USIZE).await?).map_err(corrupt)?;
    let segment_bytes = header.geo.segment_blocks() * BLOCK_BYTES;
    // The header decides the size: a resize writes it first and the pool record after it, so a
    // crash between them leaves a version 4 header and the record of the old size (corrected
    // below, once open succeeds).
    if (header.volume_bytes != rec.size_bytes && header.version < 4)
        || seg.size_bytes() > header.geo.space_blocks() * BLOCK_BYTES
        || !seg.size_bytes().is_multiple_of(segment_bytes)
        || header.meta_bytes() > meta.size_bytes()
        || header.cache_blocks * BLOCK_BYTES > cache.size_bytes()
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
        CacheRing::restored(header.ring, &owners, describe)
    } else {
        CacheRing::with_owners(header.ring, &owners, describe)
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
        size_bytes: AtomicU64::new(header.head_size()),
        pool: Arc::clone(pool),
        parts: Parts { meta, cache, seg },
        geo,
        map,
        ring: Arc::new(ring),
        space: SpaceState {
            table: Arc::new(Mutex::new(Space::from_live(geo, live, segments, reserve))),
            counts_suspect: AtomicBool::new(from_table),
            growth_failed: Mutex::new(None),
            no_space: Mutex::new(None),
        },
        params: Mutex::new(params),
        seq: Arc::new(AtomicU64::new(max_seq)),
        heat: super::heat::Heat::new(header.volume_bytes / BLOCK_BYTES),
        counters: LogCounters::default(),
        clock: Clock { started: Instant::now(), last_write_ms: AtomicU64::new(0) },
        health: Health { closed: AtomicBool::new(false), failure: Mutex::new(None) },
        gates: Gates {
            snapshot_ops: tokio::sync::Mutex::new(()),
            deleter: tokio::sync::Mutex::new(()),
            deletes_wanted: tokio::sync::Notify::new(),
            free_head: AtomicBool::new(false),
            writes: tokio::sync::RwLock::new(()),
            ranges: super::ranges::RangeLocks::new(),
            rmw: (0..RMW_LOCKS).map(|_| tokio::sync::Mutex::new(())).collect(),
            moving: tokio::sync::Mutex::new(super::gc::Gc::default()),
            settle: tokio::sync::RwLock::new(()),
            pool_growth: tokio::sync::Mutex::new(()),
            clone_shrinking: parking_lot::Mutex::new(None),
            settings: tokio::sync::Mutex::new(()),
        },
        opened_from_table: from_table,
        table_at: Arc::new(AtomicU64::new(header.table_region().map_or(0, |r| r.0))),
        cache_writes: Default::default(),
        cache_growth: Default::default(),
        wb: Arc::new(super::WriteBack { enabled: AtomicBool::new(params.write_back), ..Default::default() }),
    });
    {
        let (wb, cache) = (Arc::clone(&vol.wb), Arc::clone(&vol.parts.cache));
        vol.map.set_barrier(Arc::new(move || {
            let (wb, cache) = (Arc::clone(&wb), Arc::clone(&cache));
            Box::pin(async move {
                use std::sync::atomic::Ordering::SeqCst;
                let want = wb.done.load(SeqCst);
                if wb.flushed.load(SeqCst) >= want {
                    return Ok(());
                }
                let _one = wb.flushing.lock().await;
                if wb.flushed.load(SeqCst) >= want {
                    return Ok(());
                }
                let at = wb.done.load(SeqCst);
                cache.flush().await?;
                wb.flushed.fetch_max(at, SeqCst);
                Ok(())
            })
        }));
    }
    if let Some((at, _)) = header.table_region() {
        vol.map.set_checkpoint_table(Arc::new(table::Writer {
            at: {
                debug_assert_eq!(vol.table_at.load(std::sync::atomic::Ordering::Relaxed), at);
                Arc::clone(&vol.table_at)
            },
            space: Arc::clone(&vol.space.table),
            ring: Arc::clone(&vol.ring),
            seq: Arc::clone(&vol.seq),
            last_stamp: AtomicU64::new(0),
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
    let rolled = vol
        .map
        .finish_clone_rollbacks(|freed| vol.free_places(freed))
        .await
        .map_err(|e| corrupt(format!("finishing a clone's rollback: {e}")))?;
    if rolled > 0 {
        tracing::info!(volume = %rec.name, rolled, "finished clone rollbacks a crash interrupted");
    }
    let finished = vol
        .map
        .finish_deletes(None, |freed| vol.free_places(freed))
        .await
        .map_err(|e| corrupt(format!("finishing a snapshot delete: {e}")))?;
    if finished > 0 {
        tracing::info!(volume = %rec.name, finished, "finished snapshot deletes a crash interrupted");
    }
    if vol.map.head_deleted() && !vol.map.snapshots().is_empty() {
        let (deleted, _) = vol
            .delete_origin_snapshots()
            .await
            .map_err(|e| corrupt(format!("finishing the delete of the origin: {e}")))?;
        tracing::info!(volume = %rec.name, ?deleted, "finished the delete of an origin a crash interrupted");
    } else if vol.map.head_deleted() {
        // A clone's delete cut before the deleted origin's head let go of what the snapshot it
        // kept held (when nothing changed: a walk of the newest snapshot's pages, nothing
        // written).
        vol.free_deleted_head()
            .await
            .map_err(|e| corrupt(format!("freeing a deleted origin's blocks: {e}")))?;
    }
    if header.head_size() != rec.size_bytes {
        // A resize wrote its header and crashed before the pool record followed.
        tracing::warn!(
            volume = %rec.name,
            header = header.head_size(),
            record = rec.size_bytes,
            "finishing a resize a crash interrupted: the pool record takes the header's size"
        );
        pool.set_tiered_size(&rec.name, header.head_size()).await?;
    }
    mover::spawn(&vol);
    mover::spawn_checkpoints(&vol);
    mover::spawn_write_back(&vol);
    mover::spawn_deleter(&vol);
    Ok(vol)
}

/// The persisted segment table at `at`, if it is valid and belongs to replay position `replay`.
pub(super) async fn read_table<D: BlockDevice>(
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
pub(super) struct Counts {
    pub(super) geo: Geometry,
    /// Segments that exist.
    pub(super) segments: u64,
    /// One per segment the space may grow to.
    pub(super) live: Vec<u64>,
    pub(super) owners: Vec<(u64, u64)>,
    pub(super) next_seq: u64,
    /// Whether the entries are deltas replayed over a persisted table: a superseded delta may
    /// point into a segment given back to the pool since; only the final entry decides.
    pub(super) replaying: bool,
    /// Blocks with a replayed delta past the segments that exist.
    pub(super) past_end: Vec<u64>,
    /// The first entry that points past the segments that exist.
    pub(super) bad: Option<String>,
}

impl Counts {
    pub(super) fn new(
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
    pub(super) fn end(&self) -> u64 {
        self.segments * self.geo.segment_blocks()
    }

    pub(super) fn add(&mut self, block: u64, e: &MapEntry) {
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
    pub(super) async fn check_past_end<D: BlockDevice>(&mut self, map: &MapStore<D>) -> Result<(), String> {
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

    pub(super) fn checked(self) -> Result<Counts, String> {
        match &self.bad {
            Some(why) => Err(why.clone()),
            None => Ok(self),
        }
    }
}

pub(super) fn past_end(block: u64, addr: u64, segments: u64) -> String {
    format!("block {block} points at segment address {addr}, past the {segments} segments of the space")
}

/// [`Counts`] from a scan of the whole map.
pub(super) async fn scan_map<D: BlockDevice>(
    map: &MapStore<D>,
    geo: Geometry,
    segments: u64,
) -> Result<Counts, String> {
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
pub(super) async fn verify_table<D: BlockDevice>(
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
    pub(super) fn batch_bytes_data(&self) -> u64 {
        self.batch_data() * BLOCK_BYTES
    }
}
