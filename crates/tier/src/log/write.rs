//! The write path: host writes into the cache ring, then the map (durable before the
//! acknowledgement; with write-back, applied and queued, durable at the next commit), then the
//! old places freed (with write-back, once the map is durable); zeroing and trim as map updates
//! alone.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use stria_dev::{BLOCK_BYTES, BLOCK_USIZE, BlockDevice, IoBytes};
use stria_engine::VolumeError;
use stria_engine::volume::bytes::{Span, ZeroSplit};

use super::{HEAD, LogVolume};
use crate::map::{MapEntry, Place, Update};
use stria_dev::block_crc;

/// Blocks per map update of a large zeroing or trim.
pub(super) const ZERO_STEP: u64 = 4096;

impl<D: BlockDevice> LogVolume<D> {
    /// Writes `data` at `offset_bytes` (any alignment). Durable when this returns, FUA or not,
    /// unless the volume writes back ([`super::LogParams::write_back`]): then a write without
    /// FUA is durable once a later flush (or any commit of the map) completes.
    pub async fn write(&self, offset_bytes: u64, data: IoBytes, fua: bool) -> Result<(), VolumeError> {
        self.write_to_as(HEAD, offset_bytes, data, fua).await
    }

    /// [`Self::write`] to the head ([`HEAD`]) or to clone `layer`.
    pub async fn write_to(&self, layer: u16, offset_bytes: u64, data: IoBytes) -> Result<(), VolumeError> {
        self.write_to_as(layer, offset_bytes, data, true).await
    }

    /// [`Self::write_to`]; `durable`: durable on return even when the volume writes back (only
    /// the head's writes without FUA are taken as write-back).
    async fn write_to_as(
        &self,
        layer: u16,
        offset_bytes: u64,
        data: IoBytes,
        durable: bool,
    ) -> Result<(), VolumeError> {
        let len = data.len() as u64;
        self.check_range_of(layer, offset_bytes, len)?;
        self.check_writable(offset_bytes, len)?;
        self.counters.host_write_ops.fetch_add(1, Relaxed);
        self.counters.host_write_bytes.fetch_add(len, Relaxed);
        self.clock.last_write_ms.store(self.now_ms(), Relaxed);
        if len == 0 {
            return Ok(());
        }
        let _write = self.gates.writes.read().await;
        self.check_layer_takes_writes(layer)?;
        // Again under the gate: a shrink that lowered the size drained the writes that had it.
        self.check_range_of(layer, offset_bytes, len)?;
        let span = Span::new(offset_bytes, len);
        // Kept out of the range of a compare and write (see `ranges`), from the edge reads on.
        let _range = self.gates.ranges.shared(span.first, span.end).await;
        crate::write_any_alignment(
            span,
            data,
            &self.gates.rmw,
            |b| self.read_view((layer != HEAD).then_some(layer), b, 1),
            |first, d| self.write_blocks(layer, first, d, durable),
        )
        .await
    }

    pub(super) async fn write_blocks(
        &self,
        layer: u16,
        first: u64,
        data: IoBytes,
        durable: bool,
    ) -> Result<(), VolumeError> {
        let n = data.len() as u64 / BLOCK_BYTES;
        let step = (self.ring.ring_blocks() / 2).max(1);
        let mut done = 0;
        while done < n {
            let m = (n - done).min(step);
            let piece = data.slice((done * BLOCK_BYTES) as usize..((done + m) * BLOCK_BYTES) as usize);
            self.write_piece(layer, first + done, piece, durable).await?;
            done += m;
        }
        Ok(())
    }

    pub(super) fn no_space_error(&self, offset_bytes: u64, len_bytes: u64, why: String) -> VolumeError {
        VolumeError::NoSpace { volume: self.name.clone(), offset_bytes, len_bytes, why }
    }

    pub(super) async fn write_piece(
        &self,
        layer: u16,
        first: u64,
        data: IoBytes,
        durable: bool,
    ) -> Result<(), VolumeError> {
        // Only the head's writes without FUA write back, snapshots and clones or not
        // (docs/design/log-structured-volumes.md, "Host writes on a disk, and write-back").
        let lazy = !durable && layer == HEAD && self.wb.enabled.load(std::sync::atomic::Ordering::Relaxed);
        let n = data.len() as u64 / BLOCK_BYTES;
        assert!(
            data.len() as u64 == n * BLOCK_BYTES && n > 0 && first + n <= self.blocks(),
            "volume {}: a write of {} bytes at block {first} reached the cache (whole blocks of {} only)",
            self.name,
            data.len(),
            self.blocks()
        );
        let start = match self.ring.reserve(n).await {
            Ok(s) => s,
            Err(why) => {
                // The mover's own reason (what is full, what frees space), not its error text.
                if let Some(full) = self.space.no_space.lock().clone() {
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
        // 1. Data into the cache, durably (split where the ring wraps), in one batch with the
        // writes that arrive together.
        // The blocks' checksums, computed once here: for the map entries and both cache copies.
        let crcs: Vec<u32> = data.chunks_exact(BLOCK_USIZE).map(block_crc).collect();
        // Reserved positions: their blocks stay where this layout says while they are.
        let ring = self.ring.layout();
        let mut pieces = Vec::with_capacity(2);
        let mut done = 0;
        while done < n {
            let (at, k) = (start + done, done as usize);
            let m = ring.contiguous(at).min(n - done) as usize;
            pieces.push((
                ring.block_of(at),
                data.slice(k * BLOCK_USIZE..(k + m) * BLOCK_USIZE),
                Arc::from(&crcs[k..k + m]),
            ));
            done += m as u64;
        }
        if let Err(e) = self.write_cache(pieces, !lazy).await {
            self.ring.release(start..start + n);
            return Err(e);
        }
        if lazy {
            // Before the delta is queued: the barrier before its log block covers this write.
            self.wb.done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        // 2. The map, durably. Positions are claimed first: a newer write may free them as soon
        // as the update is applied.
        let seq = self.seq.fetch_add(1, Relaxed) as u32;
        let updates: Vec<Update> = crcs
            .iter()
            .zip(0..)
            .map(|(&crc, k)| {
                self.ring.claim_block(start + k, first + k);
                Update {
                    block: first + k,
                    entry: MapEntry { place: Place::Cache(start + k), crc, seq },
                    expect: None,
                }
            })
            .collect();
        let settle = self.gates.settle.read().await;
        // A write-back write's update is queued (a ticket), not waited for.
        let applied = if lazy {
            self.update_head_queued(&updates).await.map(|(olds, ticket)| (olds, Some(ticket)))
        } else {
            self.update_layer(layer, &updates).await.map(|olds| (olds, None))
        };
        let (olds, ticket) = match applied {
            Ok(r) => r,
            Err(e) => {
                if e.nothing_applied {
                    // No entry points at the positions: they go back to the ring.
                    self.ring.release(start..start + n);
                }
                return Err(e.into());
            }
        };
        if self.params().gc == super::GcPolicy::Temperature {
            self.mark_heat(seq, &updates, &olds);
        }
        let freed = updates.iter().zip(olds).map(|(u, o)| (u.block, o.expect("unconditional")));
        let Some(ticket) = ticket else {
            // 3. Acknowledged; free what the blocks no longer use.
            self.free_places(freed);
            drop(settle);
            return Ok(());
        };
        // 3. Write-back: acknowledged; what the blocks no longer use is freed once the ticket
        // is durable.
        let first = {
            let mut frees = self.wb.frees.lock();
            frees.push_back((ticket, freed.collect()));
            frees.len() == 1
        };
        self.wb.used.store(true, std::sync::atomic::Ordering::Relaxed);
        if first {
            self.wb.wake.notify_one();
        }
        drop(settle);
        self.free_durable();
        Ok(())
    }

    /// Marks the cache positions of a host write hot or cold ([`super::heat`]), from the
    /// versions it replaced (before their places are freed: a hot cache position is read here).
    fn mark_heat(&self, seq: u32, updates: &[Update], olds: &[Option<MapEntry>]) {
        let olds: Vec<MapEntry> = olds.iter().map(|o| o.unwrap_or(MapEntry::UNALLOCATED)).collect();
        let cached = self.ring.hot(olds.iter().map(|o| match o.place {
            Place::Cache(p) => p,
            _ => u64::MAX,
        }));
        let segments: Vec<bool> = {
            let space = self.space.lock();
            olds.iter()
                .map(|o| match o.place {
                    Place::Segment(a) => space.is_hot(self.geo.segment_of(a)),
                    _ => false,
                })
                .collect()
        };
        let marks: Vec<(u64, u64, bool)> = updates
            .iter()
            .zip(&olds)
            .enumerate()
            .filter_map(|(i, (u, old))| match u.entry.place {
                Place::Cache(pos) => {
                    Some((pos, u.block, self.heat.is_hot(seq, old, cached[i] || segments[i])))
                }
                _ => None,
            })
            .collect();
        self.ring.set_hot(marks);
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
        self.check_range_of(layer, offset_bytes, len_bytes)?;
        if len_bytes == 0 {
            return Ok(());
        }
        let split = ZeroSplit::new(offset_bytes, len_bytes, BLOCK_BYTES);
        if fast_only && split.has_slow_part() {
            return Err(VolumeError::NotCheap { offset_bytes, len_bytes });
        }
        if let Some((first, n)) = split.cheap_blocks() {
            let _write = self.gates.writes.read().await;
            self.check_layer_takes_writes(layer)?;
            self.check_range_of(layer, offset_bytes, len_bytes)?;
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
        self.check_range_of(layer, offset_bytes, len_bytes)?;
        if let Some((first, n)) = ZeroSplit::new(offset_bytes, len_bytes, BLOCK_BYTES).cheap_blocks() {
            let _write = self.gates.writes.read().await;
            self.check_layer_takes_writes(layer)?;
            self.check_range_of(layer, offset_bytes, len_bytes)?;
            self.set_places(layer, first, n, Place::Unallocated).await?;
        }
        Ok(())
    }

    pub(super) async fn set_places(
        &self,
        layer: u16,
        first: u64,
        n: u64,
        place: Place,
    ) -> Result<(), VolumeError> {
        assert!(
            matches!(place, Place::Unallocated | Place::Zero),
            "volume {}: blocks set to {place:?} without data",
            self.name
        );
        self.check_writable(first * BLOCK_BYTES, n * BLOCK_BYTES)?;
        self.clock.last_write_ms.store(self.now_ms(), Relaxed);
        let mut b = first;
        while b < first + n {
            let m = (first + n - b).min(ZERO_STEP);
            // Kept out of the range of a compare and write, one step at a time (see `ranges`).
            let _range = self.gates.ranges.shared(b, b + m).await;
            let seq = self.seq.fetch_add(1, Relaxed) as u32;
            let updates: Vec<Update> = (b..b + m)
                .map(|block| Update { block, entry: MapEntry { place, crc: 0, seq }, expect: None })
                .collect();
            let settle = self.gates.settle.read().await;
            let olds = self.update_layer(layer, &updates).await?;
            self.free_places(updates.iter().zip(olds).map(|(u, o)| (u.block, o.expect("unconditional"))));
            drop(settle);
            b += m;
        }
        // Freed space may let a stuck destage go on.
        self.ring.hungry.notify_one();
        Ok(())
    }
}
