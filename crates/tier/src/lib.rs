//! Log-structured volumes (`tiered:ec:K+M` with a fast tier, `log:ec:K+M` without): a mirrored
//! write cache and a paged, logged block map in front of an erasure-coded segment space that sees
//! only whole, large stripes appended to open segments.
//!
//! Design: docs/design/log-structured-volumes.md; format: docs/on-disk-format.md §7-§8.
#![forbid(unsafe_code)]
// Block counts index in-memory tables; stria runs on 64-bit targets only (see stria-engine).
#![allow(clippy::cast_possible_truncation)]

mod contract;
pub use contract::{CloneVolume, SnapshotVolume};
#[doc(hidden)]
pub mod fuzzing;
pub mod layers;
pub mod log;
pub mod map;
mod ring;

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use serde::{Deserialize, Serialize};
use stria_dev::{BlockDevice, IoBytes};
use stria_engine::{
    DriveClass, EngineError, Layout, Pool, TieredRecord, Volume, VolumeRole, VolumeSpec, VolumeState,
};

/// Default chunk of the segment space: each drive write of a batch is this large.
pub const DEFAULT_TIER_CHUNK_BYTES: u64 = 128 << 10;

/// Status of one part (cache, meta, segments).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PartStatus {
    pub role: String,
    pub volume: String,
    pub layout: String,
    pub size_bytes: u64,
    pub state: VolumeState,
    pub write_ops: u64,
    pub write_bytes: u64,
    pub read_ops: u64,
    pub read_bytes: u64,
    pub full_stripe_writes: u64,
    pub partial_stripe_writes: u64,
    /// Bytes this part's writes put on its drives (data, copies, parity, journal records): what
    /// the volume's write amplification is computed from.
    #[serde(default)]
    pub member_write_bytes: u64,
    /// Bytes written to and read from the part's drives (drive counters: they also count every
    /// other volume on those drives, so they are exact only when the drives hold this part
    /// alone, as in the benchmarks).
    pub drive_bytes_written: u64,
    pub drive_bytes_read: u64,
    /// Drive writes by size: bucket i counts writes of [2^(12+i), 2^(13+i)) bytes.
    pub drive_write_size_hist: Vec<u64>,
}

/// Why a volume could not be created or opened.
#[derive(Debug, thiserror::Error)]
pub enum TierError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Volume(#[from] stria_engine::VolumeError),
    #[error("{0}")]
    Invalid(String),
    #[error("volume {name}: {reason}")]
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

/// Creates the parts in order, each cleared (see `log::create`); if one cannot be created,
/// deletes those made before it and returns its index with the error.
async fn create_parts<D: BlockDevice>(
    pool: &Pool<D>,
    parts: [VolumeSpec; 3],
) -> Result<Vec<Arc<Volume<D>>>, (usize, TierError)> {
    let mut made: Vec<Arc<Volume<D>>> = Vec::new();
    for (i, p) in parts.into_iter().enumerate() {
        match pool.create_volume(p).await {
            Ok(v) => made.push(v),
            Err(e) => {
                for v in made {
                    let _ = pool.delete_volume(v.name()).await;
                }
                return Err((i, e.into()));
            }
        }
    }
    Ok(made)
}

/// The parts of a log-structured volume's record, in the order cache, metadata, and
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

/// Deletes a log-structured volume and its three parts.
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

/// Status of the parts of a log-structured volume, with their drives' counters.
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
                member_write_bytes: c.member_write_bytes.load(Relaxed),
                drive_bytes_written: written,
                drive_bytes_read: read,
                drive_write_size_hist: hist,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    /// Map entries and segment summaries hold block checksums: the one function now shared with
    /// the engine (`stria_dev::block_crc`, crc-fast) gives what this crate computed before with
    /// the crc32c crate (0 remapped to 1), so volumes written before read back.
    #[test]
    fn the_block_checksum_is_the_one_the_map_always_stored() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..64 {
            let block: Vec<u8> = (0..stria_dev::BLOCK_USIZE)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            let before = match crc32c::crc32c(&block) {
                0 => 1,
                c => c,
            };
            assert_eq!(stria_dev::block_crc(&block), before);
        }
        assert_eq!(stria_dev::block_crc(&[0u8; stria_dev::BLOCK_USIZE]), crc32c::crc32c(&[0u8; 4096]));
    }
}
