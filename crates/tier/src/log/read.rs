//! The read path: map entries looked up, runs of blocks read from the cache or the segment
//! space, every block checked against its map CRC; a block whose entry changed under the read
//! (moved, rewritten, its segment given back) is read again.

use std::sync::atomic::Ordering::Relaxed;

use stria_dev::{BLOCK_BYTES, BlockDevice, IoBuf};
use stria_engine::volume::bytes::{ExtentRuns, Span};
use stria_engine::{Extent, VolumeError, join_all_ok};

use super::{LogVolume, map_error};
use crate::map::{MapEntry, Place};
use crate::ring::RingLayout;
use stria_dev::block_crc;

/// A read that keeps racing with moves gives up after this many tries (an error, never wrong data).
pub(super) const READ_ATTEMPTS: usize = 8;

impl<D: BlockDevice> LogVolume<D> {
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

    /// Reads `len_bytes` at `offset_bytes` of snapshot or clone `layer` (any alignment).
    pub async fn read_snapshot(
        &self,
        layer: u16,
        offset_bytes: u64,
        len_bytes: usize,
    ) -> Result<IoBuf, VolumeError> {
        self.check_range_of(layer, offset_bytes, len_bytes as u64)?;
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
    pub(super) async fn read_view(
        &self,
        view: Option<u16>,
        first: u64,
        n: u64,
    ) -> Result<IoBuf, VolumeError> {
        let mut entries = self.entries_in(view, first, n).await?;
        if let Some(buf) = self.read_one_run(&entries).await? {
            return Ok(buf);
        }
        let mut out = IoBuf::zeroed((n * BLOCK_BYTES) as usize);
        let mut pending: Vec<u64> = (0..n).collect();
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
            let reads = runs(&pending, &entries, &self.ring.layout()).into_iter().map(|run| async move {
                let got = match self.read_place(run.place, run.count).await {
                    None => Got::Zeros,
                    Some(Ok((buf, crcs))) => Got::Data(buf, crcs),
                    // A cache read has no one to race with: its error is the read's.
                    Some(Err(e)) if matches!(run.place, Place::Cache(_)) => return Err(e),
                    // GC may have emptied the segment and given it back to the pool under this
                    // read: its blocks are read again if an entry moved.
                    Some(Err(e)) => {
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
                        Got::Moved
                    }
                };
                Ok::<_, VolumeError>((run, got))
            });
            for (run, got) in join_all_ok(reads).await? {
                for j in 0..run.count {
                    let k = run.first_k + j as usize;
                    let i = pending[k];
                    let dst = &mut out[(i * BLOCK_BYTES) as usize..((i + 1) * BLOCK_BYTES) as usize];
                    let (buf, crcs) = match &got {
                        Got::Data(buf, crcs) => (buf, crcs),
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
                    // The checksum the drive verified the block against, not computed again:
                    // it must be the one the map says this version of the block has.
                    debug_assert_eq!(crcs[j as usize], block_crc(data));
                    if crcs[j as usize] == entries[k].crc {
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

    /// The common case of [`Self::read_view`]'s first attempt: blocks that are one run (a small
    /// read, a sequential one), read with one part read and returned in that read's buffer (no
    /// copy, none of the general path's bookkeeping). `None` when they are not one run, or when
    /// anything needs the general path (a segment read that failed, a block whose checksum is not
    /// its entry's: moved under the read, or corrupt), which then reads them again.
    async fn read_one_run(&self, entries: &[MapEntry]) -> Result<Option<IoBuf>, VolumeError> {
        let n = entries.len() as u64;
        let Some(place) = one_run(entries, &self.ring.layout()) else { return Ok(None) };
        let (buf, crcs) = match self.read_place(place, n).await {
            None => return Ok(Some(IoBuf::zeroed((n * BLOCK_BYTES) as usize))),
            Some(Ok(got)) => got,
            Some(Err(e)) if matches!(place, Place::Cache(_)) => return Err(e),
            Some(Err(_)) => return Ok(None),
        };
        for (j, (crc, e)) in crcs.iter().zip(entries).enumerate() {
            debug_assert_eq!(*crc, block_crc(&buf[j * BLOCK_BYTES as usize..(j + 1) * BLOCK_BYTES as usize]));
            if *crc != e.crc {
                return Ok(None);
            }
        }
        Ok(Some(buf))
    }

    /// One part read of `count` blocks at `place` (one run: never across the ring's end), with
    /// the checksum each was verified against by its drive; `None` for zeros.
    async fn read_place(&self, place: Place, count: u64) -> Option<Result<(IoBuf, Vec<u32>), VolumeError>> {
        let len = (count * BLOCK_BYTES) as usize;
        Some(match place {
            Place::Unallocated | Place::Zero => return None,
            Place::Cache(p) => {
                let ring = self.ring.layout();
                if ring.contiguous(p) < count {
                    // Runs are cut by the ring's layout when their entries were read: one that
                    // crosses a break now names positions a growth has left behind since (freed
                    // under the read). Zeros, with their checksums: an entry that does not hold
                    // zeros sees them wrong and is read again.
                    let zero = block_crc(&[0u8; BLOCK_BYTES as usize]);
                    return Some(Ok((IoBuf::zeroed(len), vec![zero; count as usize])));
                }
                self.counters.blocks_read_from_cache.fetch_add(count, Relaxed);
                self.parts.cache.read_with_crcs(ring.block_of(p) * BLOCK_BYTES, len).await
            }
            Place::Segment(a) => {
                self.counters.blocks_read_from_segments.fetch_add(count, Relaxed);
                self.parts.seg.read_with_crcs(a * BLOCK_BYTES, len).await
            }
        })
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

    /// Allocation map of clone `layer` (as [`Self::block_status`] of the head).
    pub async fn block_status_in(
        &self,
        layer: u16,
        offset_bytes: u64,
        len_bytes: u64,
    ) -> Result<Vec<Extent>, VolumeError> {
        self.check_range_of(layer, offset_bytes, len_bytes)?;
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
}

/// What a read of one run found.
pub(super) enum Got {
    /// The data, and each block's checksum as the drive verified it.
    Data(IoBuf, Vec<u32>),
    Zeros,
    /// The read failed and an entry of the run changed meanwhile: read it again.
    Moved,
}

/// Consecutive pending blocks that live in one place, contiguously.
#[derive(Debug, Clone, Copy)]
pub(super) struct Run {
    /// Index into `pending` of the first block.
    first_k: usize,
    count: u64,
    place: Place,
}

/// The place of the first of `entries` when all of them (consecutive blocks) are one run, as
/// [`runs`] groups them; `None` otherwise (or when there are none).
fn one_run(entries: &[MapEntry], ring: &RingLayout) -> Option<Place> {
    let first = entries.first()?.place;
    (0u64..).zip(entries).skip(1).all(|(k, e)| joins(first, k, e.place, ring)).then_some(first)
}

/// Whether a block at `next` can follow a run of `count` blocks from `first` in one part read.
fn joins(first: Place, count: u64, next: Place, ring: &RingLayout) -> bool {
    match (first, next) {
        (Place::Cache(a), Place::Cache(b)) => b == a + count && !ring.breaks_at(b),
        (Place::Segment(a), Place::Segment(b)) => b == a + count,
        (Place::Unallocated | Place::Zero, Place::Unallocated | Place::Zero) => true,
        _ => false,
    }
}

/// Groups `pending` blocks (with their `entries`) into runs readable with one part read: zeros,
/// consecutive cache positions that do not cross the ring's end, consecutive segment addresses.
pub(super) fn runs(pending: &[u64], entries: &[MapEntry], ring: &RingLayout) -> Vec<Run> {
    let mut out: Vec<Run> = Vec::new();
    for (k, (&i, e)) in pending.iter().zip(entries).enumerate() {
        if let Some(last) = out.last_mut() {
            let follows = pending[last.first_k] + last.count == i;
            if follows && joins(last.place, last.count, e.place, ring) {
                last.count += 1;
                continue;
            }
        }
        out.push(Run { first_k: k, count: 1, place: e.place });
    }
    out
}
