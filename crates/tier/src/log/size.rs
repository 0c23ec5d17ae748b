//! Growing and shrinking a log volume's logical size, online (docs/design/
//! log-structured-volumes.md, "Resize"; crash argument in docs/crash-consistency.md, "Resizing a
//! log volume").
//!
//! A grow adds what the larger map needs where the metadata part ends (a new run of head pages,
//! and a larger segment table when the segment space may grow further), so nothing written moves;
//! one FUA write of a version 4 header makes it the volume's, then the pool record follows. A
//! shrink refuses I/O past the new end, waits for writes in flight, discards the tail through
//! the map, checkpoints (so replay never meets a delta past the new end), then writes the header.

use std::sync::atomic::Ordering::{AcqRel, Relaxed};

use stria_dev::{BLOCK_BYTES, BLOCK_USIZE, BlockDevice, IoBytes};

use super::header::Header;
use super::table;
use super::write::ZERO_STEP;
use super::{HEAD, LogVolume};
use crate::TierError;
use crate::map::{MapEntry, MapError, Place, Update};

impl<D: BlockDevice> LogVolume<D> {
    /// Resizes the volume to `new_bytes` (rounded up to 4 KiB) while it serves I/O. A shrink
    /// discards everything past the new end (the caller asked for that explicitly). Snapshots
    /// and clones keep their sizes and contents either way: a shrink discards the head's tail as
    /// TRIMs would, preserving the map pages they see first, and keeps the map's size. Refused
    /// for volumes of format 1 and 2, and for a volume that takes no writes.
    pub async fn resize(&self, new_bytes: u64) -> Result<(), TierError> {
        let new_bytes = new_bytes.next_multiple_of(BLOCK_BYTES);
        stria_engine::check_volume_size(new_bytes)?;
        let _one = self.snapshot_ops().await?;
        if self.origin_deleted() {
            return Err(TierError::Invalid(format!(
                "{} was deleted (it is kept only for its clones)",
                self.name
            )));
        }
        self.check_writable(0, 0)?;
        let old_bytes = self.size_bytes();
        if new_bytes == old_bytes {
            return Ok(());
        }
        let map_bytes = self.blocks() * BLOCK_BYTES;
        if self.map.has_layers() && new_bytes > old_bytes {
            // Snapshots and clones keep their sizes; the head's growth reaches their indexes.
            if let Err(why) = self.map.can_grow_to((new_bytes / BLOCK_BYTES).max(map_bytes / BLOCK_BYTES)) {
                return Err(TierError::Invalid(format!(
                    "volume {} has snapshots or clones and cannot be resized to {} bytes: {why} \
                     (delete them first, or copy the volume into a new one of the size wanted)",
                    self.name, new_bytes
                )));
            }
        }
        let header = self.read_header().await?;
        if header.version < 3 {
            return Err(TierError::Invalid(format!(
                "volume {} was made by an older stria (metadata format {}); it cannot be resized: copy it into a new volume",
                self.name, header.version
            )));
        }
        if new_bytes > old_bytes {
            // Into map pages a clone's growth added (empty: no one writes the head there), or
            // past them.
            self.grow_to(new_bytes.max(map_bytes), new_bytes).await?;
        } else {
            self.shrink_to(new_bytes).await?;
        }
        // The header decides the size; the record follows (open corrects it if a crash came
        // between the two).
        self.pool.set_tiered_size(&self.name, new_bytes).await?;
        tracing::info!(volume = %self.name, from = old_bytes, to = new_bytes, "resized");
        Ok(())
    }

    /// Resizes clone `name` to `new_bytes` (rounded up to 4 KiB) while it serves I/O
    /// (docs/design/snapshots.md, "Resizing a clone"). Blocks a growth adds read as zeros: a
    /// layer's view past its size is empty (the head's by [`LogVolume::resize`], a snapshot's
    /// as the head was, a clone's from its parent and by the discard below). A growth past the
    /// family's map grows the map first, as the origin's growth does, keeping the origin's
    /// size; then it makes the clone's new size durable while writes wait, so no write past
    /// the old end is acknowledged before it. A shrink (asked for explicitly by the
    /// caller) refuses I/O past the new end, waits for the writes that checked the old one,
    /// discards the tail of the clone's view, then makes the size durable: a crash before that
    /// leaves the old size with the tail partly or wholly discarded.
    pub async fn resize_clone(&self, name: &str, new_bytes: u64) -> Result<(), TierError> {
        let new_bytes = new_bytes.next_multiple_of(BLOCK_BYTES);
        stria_engine::check_volume_size(new_bytes)?;
        let _one = self.snapshot_ops().await?;
        let Some(clone) = self.map.clones().into_iter().find(|c| c.name == name) else {
            return Err(TierError::Invalid(format!("{} has no clone {name:?}", self.name)));
        };
        self.check_writable(0, 0)?;
        let old_bytes = clone.logical_bytes;
        if new_bytes == old_bytes {
            return Ok(());
        }
        let map_bytes = self.blocks() * BLOCK_BYTES;
        if new_bytes > map_bytes {
            if let Err(why) = self.map.can_grow_to(new_bytes / BLOCK_BYTES) {
                return Err(TierError::Invalid(format!(
                    "clone {name} cannot grow to {new_bytes} bytes, past the map of {} that it shares: {why} \
                     (copy it into a new volume of the size wanted)",
                    self.name
                )));
            }
            let header = self.read_header().await?;
            if header.version < 3 {
                return Err(TierError::Invalid(format!(
                    "clone {name} cannot grow past {}: the volume was made by an older stria (metadata format {}); copy the clone into a new volume",
                    self.name, header.version
                )));
            }
            self.grow_to(new_bytes, self.size_bytes()).await?;
            tracing::info!(volume = %self.name, clone = name, map_bytes = new_bytes, "the family's map grew for a clone");
        }
        let failed = |e: MapError| {
            self.map_failed(&e);
            TierError::from(super::map_error(&self.name, e))
        };
        if new_bytes > old_bytes {
            let _drained = self.gates.writes.write().await;
            self.map.set_clone_bytes(clone.id, new_bytes).map_err(|e| super::map_error(&self.name, e))?;
            if let Err(e) = self.map.checkpoint().await {
                let _ = self.map.set_clone_bytes(clone.id, old_bytes);
                return Err(failed(e));
            }
        } else {
            *self.gates.clone_shrinking.lock() = Some((clone.id, new_bytes));
            // Writes in flight that checked the old size are done once this is had; later ones
            // check the new size under the gate.
            drop(self.gates.writes.write().await);
            let shrunk = async {
                self.discard(clone.id, new_bytes / BLOCK_BYTES, old_bytes / BLOCK_BYTES).await?;
                self.map.set_clone_bytes(clone.id, new_bytes).map_err(|e| super::map_error(&self.name, e))?;
                self.map.checkpoint().await.map_err(failed)
            }
            .await;
            *self.gates.clone_shrinking.lock() = None;
            shrunk?;
        }
        tracing::info!(volume = %self.name, clone = name, from = old_bytes, to = new_bytes, "clone resized");
        Ok(())
    }

    pub(super) async fn read_header(&self) -> Result<Header, TierError> {
        let bytes = self.parts.meta.read(0, BLOCK_USIZE).await?;
        Header::decode(&bytes).map_err(|reason| TierError::Corrupt { name: self.name.clone(), reason })
    }

    /// Grows the map to `new_bytes` (or keeps it, if as large) and sets the origin's size to
    /// `head_bytes`: the header's regions grow where the metadata part ends.
    async fn grow_to(&self, new_bytes: u64, head_bytes: u64) -> Result<(), TierError> {
        // Header writers: the page pool's growth, and this.
        let _pool = self.gates.pool_growth.lock().await;
        let old = self.read_header().await?;
        let new_bytes = new_bytes.max(old.volume_bytes);
        let mut h = old;
        h.set_sizes(new_bytes, head_bytes);
        let mut end = old.meta_bytes();
        let pages = h.map_pages();
        if pages > h.regions.head_cap {
            h.regions.head.push(h.regions.head_cap, end).map_err(|e| {
                TierError::Invalid(format!(
                    "volume {}: its map has grown as often as its header can say ({e}); copy it into a new volume",
                    self.name
                ))
            })?;
            end += (pages - h.regions.head_cap) * BLOCK_BYTES;
            h.regions.head_cap = pages;
        }
        // The segment space may grow in proportion (the bound `--space` or 1.5x the size set).
        let most = u64::try_from(
            (u128::from(old.geo.segments) * u128::from(new_bytes)).div_ceil(u128::from(old.volume_bytes)),
        )
        .unwrap_or(u64::MAX)
        .min(1 << 32);
        let mut moved_table = None;
        if most > old.geo.segments {
            h.geo.segments = most;
            h.regions.table_at = end;
            end += table::region_bytes(most, h.cache_blocks);
            moved_table = Some(h.regions.table_at);
        }
        let bytes = h.meta_bytes();
        debug_assert!(bytes <= end.max(old.meta_bytes()));
        let encoded = h.encode();
        if bytes > self.parts.meta.size_bytes() {
            self.pool.resize_volume(self.parts.meta.name(), bytes).await?;
        }
        // The new head pages are made empty (a page of zeros) by zeroing them, not by trusting
        // the part's tail: rows a resize added read as zeros only once it cleared them, which a
        // crash may have cut short, and an earlier growth cut short may have written there.
        // Whole blocks of a mirror are zeroed by marking them unwritten (no data written).
        if let Some(&(first, at)) = h.regions.head.pairs().last().filter(|r| r.0 >= old.regions.head_cap) {
            self.parts
                .meta
                .write_zeroes(at, (h.regions.head_cap - first) * BLOCK_BYTES, false, false)
                .await?;
        }
        let _held = self.map.hold_checkpoints().await;
        if let Some(at) = moved_table {
            self.copy_table(&old, most, at).await?;
        }
        // The zeros and the table before the header that names them.
        self.parts.meta.flush().await?;
        self.parts.meta.write(0, IoBytes::copy_from(&encoded), true).await?;
        // Durable: the memory follows (no checkpoint can run in between).
        self.map.resize(new_bytes / BLOCK_BYTES, h.map_layout().head);
        if let Some(at) = moved_table {
            self.space.lock().set_max_segments(most);
            self.table_at.store(at, Relaxed);
        }
        self.size_bytes.store(head_bytes, std::sync::atomic::Ordering::Release);
        Ok(())
    }

    /// Writes the last checkpoint's table (the one header `old` names), with counts for
    /// `segments`, at byte `at`, where a new header will say: after a crash open takes it as it
    /// would have the old one. Without a valid one, a zero block there: open then finds no table
    /// and scans the map (never an older table left there). Not flushed.
    pub(super) async fn copy_table(&self, old: &Header, segments: u64, at: u64) -> Result<(), TierError> {
        let bytes = match self.read_table(old).await? {
            Some(mut t) => {
                t.live.resize(segments as usize, 0);
                t.encode()
            }
            None => vec![0; BLOCK_USIZE],
        };
        self.parts.meta.write(at, IoBytes::copy_from(&bytes), false).await?;
        Ok(())
    }

    /// The persisted segment table `h` points to, if valid.
    pub(super) async fn read_table(&self, h: &Header) -> Result<Option<table::Table>, TierError> {
        let Some((at, len)) = h.table_region() else { return Ok(None) };
        let bytes = self.parts.meta.read(at, len as usize).await?;
        Ok(table::Table::decode_header(&bytes[..BLOCK_USIZE])
            .and_then(|th| table::Table::decode_body(th, &bytes[BLOCK_USIZE..])))
    }

    /// Shrinks to `new_bytes`: I/O past it is refused from now on, the tail is discarded, a
    /// checkpoint puts every delta naming it behind replay's start, and the header follows.
    /// With snapshots or clones the map keeps its size: they may see its pages past the head's
    /// new end (through the head where no snapshot took a copy of a page; the discard took one
    /// of every page it changed, as a TRIM does), and the head's entries there are all
    /// unallocated now, as past a head that a clone's growth left smaller than the map.
    async fn shrink_to(&self, new_bytes: u64) -> Result<(), TierError> {
        let old_bytes = self.size_bytes.swap(new_bytes, AcqRel);
        // Writes in flight (which checked the old size) are done once this is had.
        drop(self.gates.writes.write().await);
        if let Err(e) = self.discard(HEAD, new_bytes / BLOCK_BYTES, old_bytes / BLOCK_BYTES).await {
            // The tail may be partly discarded: the caller asked for it. The size stays.
            self.size_bytes.store(old_bytes, std::sync::atomic::Ordering::Release);
            return Err(e);
        }
        self.map.checkpoint().await.map_err(|e| {
            self.map_failed(&e);
            super::map_error(&self.name, e)
        })?;
        let _pool = self.gates.pool_growth.lock().await;
        let mut h = self.read_header().await?;
        // The caller holds the snapshot lock: no layer comes or goes meanwhile.
        let keep_map = self.map.has_layers();
        // No layers: the map's pages past the origin's old size (a clone's growth, the clone
        // since deleted, or a shrink with snapshots since deleted) held nothing; the map ends
        // with the origin again.
        let map_bytes = if keep_map { h.volume_bytes } else { new_bytes };
        h.set_sizes(map_bytes, new_bytes);
        let encoded = h.encode();
        let _held = self.map.hold_checkpoints().await;
        self.parts.meta.write(0, IoBytes::copy_from(&encoded), true).await?;
        if !keep_map {
            self.map.resize(new_bytes / BLOCK_BYTES, h.map_layout().head);
        }
        Ok(())
    }

    /// Makes blocks `first..end` of the head ([`HEAD`]) or of clone `layer` unallocated (those
    /// that are not), freeing their places.
    async fn discard(&self, layer: u16, first: u64, end: u64) -> Result<(), TierError> {
        let mut b = first;
        while b < end {
            let n = (end - b).min(ZERO_STEP);
            let blocks: Vec<u64> = (b..b + n).collect();
            let held = if layer == HEAD {
                self.map.get_many(&blocks).await
            } else {
                self.map.get_in(layer, &blocks).await
            }
            .map_err(|e| super::map_error(&self.name, e))?;
            let seq = self.seq.fetch_add(1, Relaxed) as u32;
            let updates: Vec<Update> = (b..b + n)
                .zip(held)
                .filter(|(_, e)| e.place != Place::Unallocated)
                .map(|(block, _)| Update {
                    block,
                    entry: MapEntry { place: Place::Unallocated, crc: 0, seq },
                    expect: None,
                })
                .collect();
            if !updates.is_empty() {
                let settle = self.gates.settle.read().await;
                let olds =
                    self.update_layer(layer, &updates).await.map_err(stria_engine::VolumeError::from)?;
                self.free_places(updates.iter().zip(olds).map(|(u, o)| (u.block, o.expect("unconditional"))));
                drop(settle);
            }
            b += n;
        }
        self.ring.hungry.notify_one();
        Ok(())
    }
}
