//! Growing the write cache while the volume serves I/O (docs/design/log-structured-volumes.md,
//! "A write cache that grows"; crash argument in docs/crash-consistency.md, "Growing the write
//! cache").
//!
//! A new volume's cache starts small ([`super::INITIAL_CACHE_BYTES`]) so that a thin volume takes
//! little fast-tier room before it holds data; when writers find it full, or destage has moved as
//! much as it holds since it last grew, the mover asks for a growth, which doubles it up to the
//! volume's `cache_max_bytes`. Nothing cached moves: the
//! cache part grows at its end, and positions handed out from then on map into the larger ring
//! (new blocks first), while the positions before keep their blocks ([`crate::ring::RingLayout`]).

use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use stria_dev::{BLOCK_BYTES, BlockDevice, IoBytes};

use super::LogVolume;
use super::table;
use crate::TierError;

/// A growth that failed (the fast drives full, an I/O error) is tried again after this long.
const RETRY: Duration = Duration::from_secs(5);

/// Whether a growth runs, why the last one failed, and the blocks destaged when the cache last
/// grew (or the volume opened).
#[derive(Default)]
pub(crate) struct CacheGrowth {
    busy: std::sync::atomic::AtomicBool,
    failed: parking_lot::Mutex<Option<(String, Instant)>>,
    destaged_at_growth: std::sync::atomic::AtomicU64,
}

impl<D: BlockDevice> LogVolume<D> {
    /// Blocks the write cache may grow to (as many as it has when it stays).
    pub fn cache_max_blocks(&self) -> u64 {
        (self.params().cache_max_bytes / BLOCK_BYTES).max(self.ring.ring_blocks())
    }

    /// Why the cache's last growth failed, if it did (cleared by one that works).
    pub(crate) fn cache_growth_error(&self) -> Option<String> {
        self.cache_growth.failed.lock().as_ref().map(|(why, _)| why.clone())
    }

    /// Starts a growth of the cache in the background when the writes need a larger one (writers
    /// wait for cache space, or destage has moved as much as the cache holds since it last
    /// grew: it is written faster than it can keep rewrites), it may grow, and no growth runs
    /// or failed a moment ago (called by the mover).
    pub(crate) fn grow_cache_if_wanted(self: &std::sync::Arc<Self>) {
        let g = &self.cache_growth;
        let ring = self.ring.ring_blocks();
        let destaged = self.counters.destaged_blocks.load(Relaxed);
        let turned_over = destaged.saturating_sub(g.destaged_at_growth.load(Relaxed)) >= ring;
        if !(self.ring.waiting() > 0 || turned_over)
            || self.cache_max_blocks() <= ring
            || !self.ring.may_grow()
            || g.failed.lock().as_ref().is_some_and(|(_, at)| at.elapsed() < RETRY)
            || g.busy.swap(true, Relaxed)
        {
            return;
        }
        let vol = std::sync::Arc::clone(self);
        tokio::spawn(async move {
            match vol.grow_cache().await {
                Ok(_) => *vol.cache_growth.failed.lock() = None,
                Err(e) => {
                    let why = e.to_string();
                    let mut failed = vol.cache_growth.failed.lock();
                    if failed.as_ref().is_none_or(|(w, _)| *w != why) {
                        tracing::warn!(volume = %vol.name(), "the write cache could not grow: {why}");
                    }
                    *failed = Some((why, Instant::now()));
                }
            }
            vol.cache_growth.busy.store(false, Relaxed);
        });
    }

    /// Doubles the write cache (at most to [`Self::cache_max_blocks`]) while I/O goes on.
    /// Returns whether it grew: not when it is as large as it may be, when the volume closed,
    /// or while positions of the ring before the last growth are still in use (tried again
    /// later).
    ///
    /// In order: the cache part grows (durable, the new rows cleared); a persisted segment
    /// table with room for the larger ring's owners is placed where the metadata part ends;
    /// with checkpoints held and new reservations held for a moment, the last checkpoint's
    /// table is written there, then the header that names the new ring and the table (FUA);
    /// then memory follows and reservations go on in the larger ring. A crash before the
    /// header leaves the old ring (and a larger part whose tail nothing uses); after it, the
    /// new one, with no position of it handed out yet.
    pub async fn grow_cache(&self) -> Result<bool, TierError> {
        let most = self.cache_max_blocks();
        let have = self.ring.ring_blocks();
        if have >= most || self.health.closed.load(Relaxed) || !self.ring.may_grow() {
            return Ok(false);
        }
        let want = (2 * have).min(most);
        // Header writers (the page pool's growth, a resize, this) one at a time.
        let _one = self.gates.pool_growth.lock().await;
        if self.ring.ring_blocks() != have || self.health.closed.load(Relaxed) {
            return Ok(false);
        }
        let old = self.read_header().await?;
        if old.version < 4 {
            return Err(TierError::Invalid(format!(
                "volume {} was made by an older stria (metadata format {}): its cache cannot grow",
                self.name, old.version
            )));
        }
        debug_assert_eq!(old.ring, self.ring.layout(), "the header's cache ring is the ring's");
        if want * BLOCK_BYTES > self.parts.cache.size_bytes() {
            self.pool.resize_volume(self.parts.cache.name(), want * BLOCK_BYTES).await?;
        }
        let mut h = old;
        h.cache_blocks = want;
        h.regions.table_at = old.meta_bytes();
        let bytes = h.regions.table_at + table::region_bytes(h.geo.segments, want);
        if bytes > self.parts.meta.size_bytes() {
            self.pool.resize_volume(self.parts.meta.name(), bytes).await?;
        }
        let _held = self.map.hold_checkpoints().await;
        let Some(layout) = self.ring.begin_growth(want) else { return Ok(false) };
        h.ring = layout;
        h.fit_version();
        let table_written = async {
            self.copy_table(&old, old.geo.segments, h.regions.table_at).await?;
            self.parts.meta.flush().await?;
            Ok::<_, TierError>(())
        }
        .await;
        if let Err(e) = table_written {
            self.ring.cancel_growth();
            return Err(e);
        }
        if let Err(e) = self.parts.meta.write(0, IoBytes::copy_from(&h.encode()), true).await {
            // Whether the new header is on disk is unknown: neither ring may take a position
            // until the next open reads which one is.
            let why = format!("the header of a cache growth could not be written ({e})");
            self.stop_writes(why);
            return Err(e.into());
        }
        self.ring.finish_growth(layout);
        self.table_at.store(h.regions.table_at, Relaxed);
        self.cache_growth.destaged_at_growth.store(self.counters.destaged_blocks.load(Relaxed), Relaxed);
        self.counters.cache_growths.fetch_add(1, Relaxed);
        tracing::info!(
            volume = %self.name,
            "the write cache grew to {} (at most {})",
            stria_engine::units::format_size(want * BLOCK_BYTES),
            stria_engine::units::format_size(most * BLOCK_BYTES)
        );
        Ok(true)
    }
}
