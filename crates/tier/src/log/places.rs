//! The map as a log volume uses it: entries of the head or a layer, updates (a full snapshot
//! page pool grown once), and the freeing of the places durable updates replaced.

use stria_dev::{BLOCK_BYTES, BLOCK_USIZE, BlockDevice, IoBytes};
use stria_engine::VolumeError;

use super::header::Header;
use super::{HEAD, LogVolume, map_error};
use crate::map::{MapEntry, MapError, Place, Update};

impl<D: BlockDevice> LogVolume<D> {
    /// Map entries of `n` blocks from `first`.
    pub(crate) async fn entries(&self, first: u64, n: u64) -> Result<Vec<MapEntry>, VolumeError> {
        self.entries_in(None, first, n).await
    }

    /// Map entries of `n` blocks from `first` as the head (`None`) or a snapshot sees them.
    pub(super) async fn entries_in(
        &self,
        view: Option<u16>,
        first: u64,
        n: u64,
    ) -> Result<Vec<MapEntry>, VolumeError> {
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
        Ok(self.update_layer(HEAD, updates).await?)
    }

    /// [`Self::update_map`] of the head ([`HEAD`]) or of a clone (host writes only). A full
    /// snapshot page pool is grown once and the update tried again.
    pub(super) async fn update_layer(
        &self,
        layer: u16,
        updates: &[Update],
    ) -> Result<Vec<Option<MapEntry>>, UpdateFailed> {
        self.check_updates(layer, updates);
        let olds = self
            .growing_the_pool(updates, || async {
                if layer == HEAD {
                    self.map.update(updates).await
                } else {
                    self.map.update_clone(layer, updates).await
                }
            })
            .await?;
        self.check_applied(updates, &olds);
        Ok(olds)
    }

    /// [`Self::update_layer`] of the head for a write-back write: applied and queued, not
    /// waited for (`MapStore::update_queued`); the olds and the delta's ticket.
    pub(super) async fn update_head_queued(
        &self,
        updates: &[Update],
    ) -> Result<(Vec<Option<MapEntry>>, u64), UpdateFailed> {
        self.check_updates(HEAD, updates);
        let (olds, ticket) = self.growing_the_pool(updates, || self.map.update_queued(updates)).await?;
        self.check_applied(updates, &olds);
        Ok((olds, ticket))
    }

    /// Runs map update `update`; a full snapshot page pool is grown once and the update tried
    /// again (a pool that cannot grow, or is full again: ENOSPC, nothing applied). Any other
    /// failure stops the volume's writes ([`Self::map_failed`]).
    async fn growing_the_pool<T, F, Fut>(&self, updates: &[Update], mut update: F) -> Result<T, UpdateFailed>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, MapError>>,
    {
        let at = updates.first().map_or(0, |u| u.block * BLOCK_BYTES);
        let mut grown = false;
        let result = loop {
            match update().await {
                Err(MapError::PoolFull { needed, .. }) if !grown => {
                    grown = true;
                    if let Err(why) = self.grow_page_pool(needed).await {
                        return Err(UpdateFailed::unapplied(self.no_space_error(
                            at,
                            BLOCK_BYTES,
                            format!("the snapshot page pool is full and {why}"),
                        )));
                    }
                }
                result => break result,
            }
        };
        result.map_err(|e| {
            if matches!(e, MapError::PoolFull { .. }) {
                return UpdateFailed::unapplied(self.no_space_error(at, BLOCK_BYTES, e.to_string()));
            }
            // A clone write that passed its check before the clone's delete marked it: nothing
            // applied, the family goes on.
            if let MapError::LayerGone { layer } = e {
                return UpdateFailed::unapplied(VolumeError::Closed(format!(
                    "{} (clone layer {layer}, deleted)",
                    self.name
                )));
            }
            self.map_failed(&e);
            UpdateFailed { error: map_error(&self.name, e), nothing_applied: false }
        })
    }

    /// Grows the snapshot page pool by at least `needed` pages (and by a quarter at least): the
    /// metadata part first, then the header that counts the pages (FUA), then the map. A crash
    /// between them leaves a larger part and the old count (the tail unused): nothing is lost.
    /// Fails (with why) when the part cannot grow, e.g. its drives are full.
    pub(crate) async fn grow_page_pool(&self, needed: u64) -> Result<(), String> {
        let _one = self.gates.pool_growth.lock().await;
        let (used, total) = self.map.pool_pages();
        if u64::from(total - used) >= needed {
            return Ok(()); // grown meanwhile
        }
        let mut header =
            Header::decode(&self.parts.meta.read(0, BLOCK_USIZE).await.map_err(|e| e.to_string())?)?;
        let add = needed.max(u64::from(total) / 4).max(64);
        let pages = (u64::from(total) + add).min(u64::from(u32::MAX));
        // The pool grows in place when it is the last region (always, before format 4); else
        // its new pages are a run where the metadata part ends (a volume that grew put its map
        // pages after the pool).
        let end = header.meta_bytes();
        let pool_end = header.regions.pool.spans(header.pool_pages).last().map_or(0, |s| s.1);
        if header.version >= 4 && pool_end < end {
            header.regions.pool.push(header.pool_pages, end).map_err(|e| {
                format!("its page pool has grown in pieces as often as the header can say ({e})")
            })?;
        }
        header.pool_pages = pages;
        let bytes = header.meta_bytes().next_multiple_of(BLOCK_BYTES);
        if bytes > self.parts.meta.size_bytes() {
            self.pool
                .resize_volume(self.parts.meta.name(), bytes)
                .await
                .map_err(|e| format!("the metadata part could not grow to {bytes} bytes for it: {e}"))?;
        }
        self.parts
            .meta
            .write(0, IoBytes::copy_from(&header.encode()), true)
            .await
            .map_err(|e| format!("the header could not be written: {e}"))?;
        let runs = header.map_layout().pool.and_then(|p| p.runs);
        self.map.grow_pool(u32::try_from(pages).expect("capped"), runs);
        tracing::info!(volume = %self.name, from = total, to = pages, "snapshot page pool grown");
        Ok(())
    }

    /// Frees the places that durable updates moved blocks away from.
    /// `(block, old entry)`: a cache position must still hold the block (asserted by the ring),
    /// a segment's count must not fall below 0 (asserted by the space).
    pub(crate) fn free_places(&self, olds: impl IntoIterator<Item = (u64, MapEntry)>) {
        let mut cache_positions = Vec::new();
        let mut lowered: Vec<(usize, u64)> = Vec::new();
        for (block, old) in olds {
            match old.place {
                Place::Cache(p) => cache_positions.push((p, block)),
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
        self.ring.release_owned(&cache_positions);
    }

    /// What every map update of the volume keeps, checked before it is applied: the block is the
    /// volume's; an entry has a checksum exactly when it has data (a block's CRC is never 0);
    /// a segment place lies in a segment that exists; only the head's entries are moved (a move
    /// changes every layer holding the place through the head's update).
    fn check_updates(&self, layer: u16, updates: &[Update]) {
        let mut segment_end = None;
        for u in updates {
            // The map's end, not the volume's: a shrink discards its tail after the volume's end
            // moved and before the map's does.
            assert!(
                u.block < self.map.blocks(),
                "volume {}: a map update of block {} past its {} blocks",
                self.name,
                u.block,
                self.map.blocks()
            );
            let data = matches!(u.entry.place, Place::Cache(_) | Place::Segment(_));
            assert_eq!(
                data,
                u.entry.crc != 0,
                "volume {}: block {}'s new entry {:?} (a place with data needs its checksum, one without none)",
                self.name,
                u.block,
                u.entry
            );
            if let Place::Segment(a) = u.entry.place {
                let end = *segment_end
                    .get_or_insert_with(|| self.space.lock().segments() * self.geo.segment_blocks());
                assert!(
                    a < end,
                    "volume {}: block {} would point at segment address {a}, past the space ({end} blocks)",
                    self.name,
                    u.block
                );
            }
            assert!(
                layer == HEAD || u.expect.is_none(),
                "volume {}: a move of clone {layer}'s block {} (moves go through the head's update)",
                self.name,
                u.block
            );
        }
    }

    /// What a map update returned, checked: one result per update; an unconditional one always
    /// applied; a move applied only to an entry still at its source (destage and GC never move
    /// a block whose entry points elsewhere, a newer write wins).
    fn check_applied(&self, updates: &[Update], olds: &[Option<MapEntry>]) {
        assert_eq!(
            olds.len(),
            updates.len(),
            "volume {}: a map update answered for {} of {} updates",
            self.name,
            olds.len(),
            updates.len()
        );
        for (u, old) in updates.iter().zip(olds) {
            match (u.expect, old) {
                (None, None) => panic!(
                    "volume {}: the unconditional update of block {} was not applied",
                    self.name, u.block
                ),
                (Some(from), Some(old)) => assert_eq!(
                    *old, from,
                    "volume {}: block {} moved from {from:?} while its entry was {old:?}",
                    self.name, u.block
                ),
                _ => {}
            }
        }
    }
}

/// A failed map update of [`LogVolume::update_layer`]: the error, and whether the map was left
/// untouched (a full snapshot page pool that could not grow, a clone deleted meanwhile), so the
/// places the update would have pointed at can go back.
#[derive(Debug)]
pub(super) struct UpdateFailed {
    pub(super) error: VolumeError,
    pub(super) nothing_applied: bool,
}

impl UpdateFailed {
    fn unapplied(error: VolumeError) -> Self {
        Self { error, nothing_applied: true }
    }
}

impl From<UpdateFailed> for VolumeError {
    fn from(f: UpdateFailed) -> Self {
        f.error
    }
}
