//! Tiered volumes: a mirrored write cache and metadata on fast drives in front of an
//! erasure-coded capacity tier that sees only full, large, sequential stripe writes.
//!
//! Design and format: docs/tiering.md.
#![forbid(unsafe_code)]
// Block counts index in-memory tables; stria runs on 64-bit targets only (see stria-engine).
#![allow(clippy::cast_possible_truncation)]

mod contract;
mod destage;
mod log;
pub mod lsv;
pub mod map;
pub mod record;
mod volume;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::Instant;

use parking_lot::Mutex;
use stria_dev::{BLOCK_BYTES as BLOCK, BlockDevice, IoBytes};
use stria_engine::units::format_size;
use stria_engine::{DriveClass, EngineError, Layout, Pool, TieredRecord, Volume, VolumeRole, VolumeSpec};

pub use volume::{PartStatus, TierCounters, TierParams, TierStatus, TieredVolume};

use record::{Header, MAX_BLOCKS_PER_BLOCKSET, PAGE_BYTES, Record};

/// Default chunk of the capacity tier: each drive write of a destaged stripe is this large.
pub const DEFAULT_TIER_CHUNK_BYTES: u64 = 128 << 10;

/// What to create.
#[derive(Debug, Clone)]
pub struct TieredSpec {
    pub name: String,
    pub size_bytes: u64,
    pub data_shards: u32,
    pub parity_shards: u32,
    pub chunk_bytes: u64,
    /// Size of the write cache (default: an eighth of the volume, 64 MiB to 8 GiB).
    pub cache_bytes: Option<u64>,
    /// Copies of the cache and metadata (default 2).
    pub cache_copies: u32,
}

/// Why a tiered volume could not be created or opened.
#[derive(Debug, thiserror::Error)]
pub enum TierError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Volume(#[from] stria_engine::VolumeError),
    #[error("{0}")]
    Invalid(String),
    #[error("tiered volume {name}: {reason}")]
    Corrupt { name: String, reason: String },
}

fn part_spec(
    name: String,
    size_bytes: u64,
    layout: Layout,
    chunk_bytes: u64,
    class: DriveClass,
    tiered: &str,
    part: &str,
) -> VolumeSpec {
    VolumeSpec {
        name,
        size_bytes,
        layout,
        chunk_bytes,
        class,
        role: VolumeRole::TierPart { tiered: tiered.into(), part: part.into() },
    }
}

/// Creates a tiered volume: its three parts, its metadata header, its pool record.
pub async fn create<D: BlockDevice>(
    pool: &Arc<Pool<D>>,
    spec: TieredSpec,
) -> Result<Arc<TieredVolume<D>>, TierError> {
    let Plan { size_bytes, blockset_bytes, blocksets, parts } = plan(pool, &spec)?;
    let name = spec.name;
    let made = create_parts(pool, parts).await?;
    let (meta, cache, cap) = (made[0].clone(), made[1].clone(), made[2].clone());
    let header = Header {
        blockset_bytes,
        blocksets,
        cache_blocks: cache.size_bytes() / BLOCK,
        volume_bytes: size_bytes,
    };
    meta.write(0, IoBytes::copy_from(&header.encode()), true).await?;
    let params = TierParams {
        blockset_bytes,
        cache_blocks: header.cache_blocks,
        start_percent: 50,
        stop_percent: 20,
        idle_ms: 2000,
        always: false,
        batch_blocksets: 8,
    };
    pool.add_tiered(TieredRecord {
        name: name.clone(),
        size_bytes,
        cache_volume: cache.id(),
        meta_volume: meta.id(),
        capacity_volume: cap.id(),
        params: serde_json::to_value(params).expect("params serialize"),
    })
    .await?;
    let rec = pool.meta().tiered.iter().find(|t| t.name == name).cloned().expect("just added");
    open(pool, &rec).await
}

/// What a tiered volume needs, checked against the pool: its sizes and its three parts
/// (metadata, cache, capacity, in that order).
struct Plan {
    size_bytes: u64,
    blockset_bytes: u64,
    blocksets: u64,
    parts: [VolumeSpec; 3],
}

fn plan<D: BlockDevice>(pool: &Pool<D>, spec: &TieredSpec) -> Result<Plan, TierError> {
    let ec = Layout::Ec { data_shards: spec.data_shards, parity_shards: spec.parity_shards };
    ec.validate().map_err(TierError::Invalid)?;
    if spec.cache_copies < 2 {
        return Err(TierError::Invalid(
            "--cache-copies must be at least 2 (the cache holds the only copy of new data)".into(),
        ));
    }
    let blockset_bytes = u64::from(spec.data_shards) * spec.chunk_bytes;
    let blocks = (blockset_bytes / BLOCK) as usize;
    if blocks == 0 || blocks > MAX_BLOCKS_PER_BLOCKSET {
        return Err(TierError::Invalid(format!(
            "a blockset (K x chunk = {}) must be at most {} for a tiered volume; use a smaller --chunk",
            format_size(blockset_bytes),
            format_size(MAX_BLOCKS_PER_BLOCKSET as u64 * BLOCK)
        )));
    }
    let size_bytes = spec.size_bytes.next_multiple_of(BLOCK);
    let blocksets = size_bytes.div_ceil(blockset_bytes);
    let cache_bytes = spec
        .cache_bytes
        .unwrap_or_else(|| (size_bytes / 8).clamp(64 << 20, 8 << 30))
        .next_multiple_of(64 << 10);
    if cache_bytes < 2 * blockset_bytes {
        return Err(TierError::Invalid(format!(
            "the cache ({}) must hold at least two blocksets ({} each)",
            format_size(cache_bytes),
            format_size(blockset_bytes)
        )));
    }
    let fast = pool
        .meta()
        .drives
        .iter()
        .filter(|d| d.class == DriveClass::Fast && d.state == stria_engine::DriveState::Active)
        .count() as u32;
    let cache_layout = if fast >= 2 * spec.cache_copies {
        Layout::Raid10 { width: fast / spec.cache_copies, copies: spec.cache_copies }
    } else {
        Layout::Raid1 { copies: spec.cache_copies }
    };
    let meta_bytes = (1 + blocksets) * PAGE_BYTES as u64;
    let name = spec.name.clone();
    let parts = [
        part_spec(
            format!("{name}.meta"),
            meta_bytes,
            Layout::Raid1 { copies: 2 },
            64 << 10,
            DriveClass::Fast,
            &name,
            "meta",
        ),
        part_spec(
            format!("{name}.cache"),
            cache_bytes,
            cache_layout,
            64 << 10,
            DriveClass::Fast,
            &name,
            "cache",
        ),
        part_spec(
            format!("{name}.cap"),
            blocksets * blockset_bytes,
            ec,
            spec.chunk_bytes,
            DriveClass::Capacity,
            &name,
            "cap",
        ),
    ];
    if pool.volume(&name).is_some() || pool.meta().tiered.iter().any(|t| t.name == name) {
        return Err(EngineError::VolumeExists(name).into());
    }
    Ok(Plan { size_bytes, blockset_bytes, blocksets, parts })
}

/// Creates the parts in order; if one cannot be created, deletes those made before it.
async fn create_parts<D: BlockDevice>(
    pool: &Pool<D>,
    parts: [VolumeSpec; 3],
) -> Result<Vec<Arc<Volume<D>>>, TierError> {
    create_parts_zeroing(pool, parts, [true; 3]).await
}

/// Like [`create_parts`]; `zero[i]` false creates part `i` without making it read as zeros
/// first ([`Pool::create_volume_unzeroed`]).
async fn create_parts_zeroing<D: BlockDevice>(
    pool: &Pool<D>,
    parts: [VolumeSpec; 3],
    zero: [bool; 3],
) -> Result<Vec<Arc<Volume<D>>>, TierError> {
    let mut made: Vec<Arc<Volume<D>>> = Vec::new();
    for (p, zero) in parts.into_iter().zip(zero) {
        let created = if zero { pool.create_volume(p).await } else { pool.create_volume_unzeroed(p).await };
        match created {
            Ok(v) => made.push(v),
            Err(e) => {
                for v in made {
                    let _ = pool.delete_volume(v.name()).await;
                }
                return Err(e.into());
            }
        }
    }
    Ok(made)
}

/// Opens a tiered volume (after the pool has recovered its parts) and starts its destager.
pub async fn open<D: BlockDevice>(
    pool: &Arc<Pool<D>>,
    rec: &TieredRecord,
) -> Result<Arc<TieredVolume<D>>, TierError> {
    let corrupt = |reason: String| TierError::Corrupt { name: rec.name.clone(), reason };
    if lsv::is_log_record(rec) {
        return Err(corrupt("it is a log-structured volume (open it with stria_tier::lsv::open)".into()));
    }
    let [cache, meta, cap] = open_parts(pool, rec, "capacity")?;
    let params: TierParams =
        serde_json::from_value(rec.params.clone()).map_err(|e| corrupt(format!("bad parameters: {e}")))?;
    let header = Header::decode(&meta.read(0, PAGE_BYTES).await?).map_err(corrupt)?;
    if header.blockset_bytes != params.blockset_bytes || header.volume_bytes != rec.size_bytes {
        return Err(corrupt("metadata header disagrees with the pool record".into()));
    }
    let blocks = (header.blockset_bytes / BLOCK) as usize;
    let mut records = Vec::with_capacity(header.blocksets as usize);
    let mut live = Vec::new();
    let mut zeroed = std::collections::BTreeSet::new();
    let chunk_pages = 256u64;
    let mut page = 0;
    while page < header.blocksets {
        let n = chunk_pages.min(header.blocksets - page);
        let buf = meta.read((1 + page) * BLOCK, (n * BLOCK) as usize).await?;
        for (k, bytes) in buf.chunks_exact(PAGE_BYTES).enumerate() {
            let bs = page + k as u64;
            let r = Record::decode(bytes, blocks).map_err(|e| corrupt(format!("record {bs}: {e}")))?;
            for (i, e) in r.entries.iter().enumerate() {
                if e.in_cache() {
                    live.push((e.position, bs as u32, i as u16));
                }
                if e.position == record::ZEROED {
                    zeroed.insert(bs as u32);
                }
            }
            records.push(Mutex::new(r));
        }
        page += n;
    }
    let vol = Arc::new(TieredVolume {
        name: rec.name.clone(),
        size_bytes: rec.size_bytes,
        blockset_blocks: blocks,
        pool: Arc::clone(pool),
        cache,
        meta,
        cap,
        records: records.into_boxed_slice(),
        zeroed_hint: Mutex::new(zeroed),
        io_locks: (0..1024).map(|_| tokio::sync::Mutex::new(())).collect(),
        rmw_locks: (0..volume::RMW_LOCKS).map(|_| tokio::sync::Mutex::new(())).collect(),
        log: log::CacheLog::with_live(header.cache_blocks, &live),
        params: Mutex::new(params),
        counters: TierCounters::default(),
        started: Instant::now(),
        last_write_ms: AtomicU64::new(0),
        closed: AtomicBool::new(false),
        write_failure: Mutex::new(None),
        destaging: tokio::sync::Mutex::new(()),
    });
    destage::spawn(&vol);
    Ok(vol)
}

/// The parts of a tiered or log-structured volume's record, in the order cache, metadata, and
/// the third (`third`: what to call it in the error).
fn open_parts<D: BlockDevice>(
    pool: &Pool<D>,
    rec: &TieredRecord,
    third: &str,
) -> Result<[Arc<Volume<D>>; 3], TierError> {
    let part = |id: u64, what: &str| {
        pool.volume_by_id(id).ok_or_else(|| TierError::Corrupt {
            name: rec.name.clone(),
            reason: format!("its {what} volume (id {id}) is missing"),
        })
    };
    Ok([
        part(rec.cache_volume, "cache")?,
        part(rec.meta_volume, "metadata")?,
        part(rec.capacity_volume, third)?,
    ])
}

/// Deletes a tiered volume and its three parts.
pub async fn delete<D: BlockDevice>(pool: &Pool<D>, name: &str) -> Result<(), TierError> {
    let rec = pool
        .meta()
        .tiered
        .iter()
        .find(|t| t.name == name)
        .cloned()
        .ok_or_else(|| EngineError::NoSuchVolume(name.into()))?;
    pool.remove_tiered(name).await?;
    for id in [rec.cache_volume, rec.meta_volume, rec.capacity_volume] {
        if let Some(v) = pool.volume_by_id(id) {
            pool.delete_volume(v.name()).await?;
        }
    }
    Ok(())
}

/// A write at any alignment through `write_blocks` (which takes whole blocks): an unaligned one
/// reads its edge blocks with `read_block`, merges, and writes whole blocks, holding the edge
/// blocks' slots of `locks` from the read until the write is durable, so that two writes to
/// different bytes of one block cannot undo each other. (Whole-block writes need no lock: they
/// replace the blocks entirely.)
pub(crate) async fn write_any_alignment<R, RF, W, WF>(
    span: stria_engine::volume::bytes::Span,
    data: IoBytes,
    locks: &[tokio::sync::Mutex<()>],
    read_block: R,
    write_blocks: W,
) -> Result<(), stria_engine::VolumeError>
where
    R: Fn(u64) -> RF,
    RF: std::future::Future<Output = Result<stria_dev::IoBuf, stria_engine::VolumeError>>,
    W: Fn(u64, IoBytes) -> WF,
    WF: std::future::Future<Output = Result<(), stria_engine::VolumeError>>,
{
    if span.is_aligned() {
        return write_blocks(span.first, data).await;
    }
    let mut slots: Vec<usize> =
        [span.first, span.end - 1].iter().map(|&b| (b % locks.len() as u64) as usize).collect();
    slots.sort_unstable();
    slots.dedup();
    let mut guards = Vec::new();
    for s in slots {
        guards.push(locks[s].lock().await);
    }
    let whole = stria_engine::volume::bytes::merge_unaligned(&span, &data, read_block).await?;
    let result = write_blocks(span.first, whole).await;
    drop(guards);
    result
}

/// The worst of some volume states.
pub(crate) fn worst_state(
    states: impl IntoIterator<Item = stria_engine::VolumeState>,
) -> stria_engine::VolumeState {
    use stria_engine::VolumeState as S;
    let rank = |s: S| match s {
        S::Healthy => 0,
        S::Rebuilding => 1,
        S::Degraded => 2,
        S::Failed => 3,
    };
    states.into_iter().max_by_key(|s| rank(*s)).unwrap_or(S::Healthy)
}

/// Drive slots holding members of `vols`.
fn slots_of<D: BlockDevice>(pool: &Pool<D>, vols: &[&Arc<Volume<D>>]) -> Vec<u32> {
    let meta = pool.meta();
    vols.iter()
        .filter_map(|v| meta.volume(v.name()))
        .flat_map(|r| r.segments.iter().flat_map(|s| s.members.iter().map(|m| m.slot)))
        .collect()
}

/// Bytes written to the drives holding `vols`, each drive counted once.
pub(crate) fn drive_bytes_written<D: BlockDevice>(pool: &Pool<D>, vols: &[&Arc<Volume<D>>]) -> u64 {
    let slots = slots_of(pool, vols);
    pool.status().drives.iter().filter(|d| slots.contains(&d.id)).map(|d| d.bytes_written).sum()
}

/// Status of the parts of a tiered or log-structured volume, with their drives' counters.
pub(crate) fn parts_status<D: BlockDevice>(
    pool: &Pool<D>,
    parts: &[(&str, &Arc<Volume<D>>)],
) -> Vec<PartStatus> {
    let pool_status = pool.status();
    parts
        .iter()
        .map(|&(role, v)| {
            let slots = slots_of(pool, &[v]);
            let drives = pool_status.drives.iter().filter(|d| slots.contains(&d.id));
            let mut hist = vec![0u64; stria_dev::counters::WRITE_SIZE_BUCKETS];
            let (mut written, mut read) = (0, 0);
            for d in drives {
                written += d.bytes_written;
                read += d.bytes_read;
                for (h, x) in hist.iter_mut().zip(d.write_size_hist) {
                    *h += x;
                }
            }
            let c = v.counters();
            PartStatus {
                role: role.into(),
                volume: v.name().into(),
                layout: v.layout().to_string(),
                size_bytes: v.size_bytes(),
                state: v.state(),
                write_ops: c.write_ops.load(Relaxed),
                write_bytes: c.write_bytes.load(Relaxed),
                read_ops: c.read_ops.load(Relaxed),
                read_bytes: c.read_bytes.load(Relaxed),
                full_stripe_writes: c.full_stripe_writes.load(Relaxed),
                partial_stripe_writes: c.partial_stripe_writes.load(Relaxed),
                drive_bytes_written: written,
                drive_bytes_read: read,
                drive_write_size_hist: hist,
            }
        })
        .collect()
}

impl<D: BlockDevice> TieredVolume<D> {
    /// Status and counters, with the parts and write amplification per tier.
    pub fn status(&self) -> TierStatus {
        let parts = parts_status(
            &self.pool,
            &[("cache", &self.cache), ("meta", &self.meta), ("capacity", &self.cap)],
        );
        // Cache and metadata usually share the fast drives: count each drive once.
        let fast_written = drive_bytes_written(&self.pool, &[&self.cache, &self.meta]);
        let c = &self.counters;
        let host_written = c.host_write_bytes.load(Relaxed);
        let per_host_byte =
            |drive_bytes: u64| (host_written > 0).then(|| drive_bytes as f64 / host_written as f64);
        let (dirty_blocks, dirty_blocksets) = self.dirty();
        let p = self.params();
        TierStatus {
            name: self.name.clone(),
            layout: format!("tiered:{}", self.cap.layout()),
            size_bytes: self.size_bytes,
            state: self.state(),
            blockset_bytes: p.blockset_bytes,
            cache_blocks: p.cache_blocks,
            log_used_blocks: self.log.used(),
            dirty_blocks,
            dirty_blocksets,
            host_read_bytes: c.host_read_bytes.load(Relaxed),
            host_write_bytes: c.host_write_bytes.load(Relaxed),
            blocks_read_from_cache: c.blocks_read_from_cache.load(Relaxed),
            blocks_read_from_capacity: c.blocks_read_from_capacity.load(Relaxed),
            cache_write_bytes: c.cache_write_bytes.load(Relaxed),
            metadata_page_writes: c.metadata_page_writes.load(Relaxed),
            destaged_blocksets: c.destaged_blocksets.load(Relaxed),
            destage_fill_blocks: c.destage_fill_blocks.load(Relaxed),
            writes_waited_for_space: c.write_waits.load(Relaxed),
            write_amplification_fast: per_host_byte(fast_written),
            write_amplification_capacity: per_host_byte(parts[2].drive_bytes_written),
            parts,
        }
    }
}
