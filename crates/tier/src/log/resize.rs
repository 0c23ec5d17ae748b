//! Growing the segment space from the pool and giving trailing free segments back to it
//! (docs/design/log-structured-volumes.md, "Step 3b").

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use stria_dev::{BLOCK_BYTES, BlockDevice};
use stria_engine::EngineError;

use super::LogVolume;
use super::gc::Gc;

/// A segment space that could not grow or shrink tries again after this long (each try takes
/// the pool's metadata lock).
pub(super) const RESIZE_RETRY: Duration = Duration::from_secs(1);

impl<D: BlockDevice> LogVolume<D> {
    /// Grows the segment space by an eighth (at least 4 segments, at most to `--space`; less
    /// when the pool has less room) in one engine resize that clears nothing: nothing points
    /// into the new segments, and every read of the space goes through the map. Returns whether
    /// it grew; why not is kept for the ENOSPC message (and tried again only after
    /// [`RESIZE_RETRY`]). The engine refuses a resize while the segment part rebuilds: until
    /// then the space cannot grow.
    pub(crate) async fn grow_space(&self) -> bool {
        let (have, most) = {
            let space = self.space.lock();
            (space.segments(), space.max_segments())
        };
        if have >= most {
            return false;
        }
        if self.space.growth_failed.lock().as_ref().is_some_and(|(_, at)| at.elapsed() < RESIZE_RETRY) {
            return false;
        }
        // An eighth, or as much as the pool still has room for.
        let mut add = self.space.lock().step().min(most - have);
        let grown = loop {
            match self.resize_space(have + add).await {
                Err(EngineError::NoSpace(_)) if add > 1 => add /= 2,
                done => break done,
            }
        };
        match grown {
            Ok(()) => {
                {
                    let mut space = self.space.lock();
                    // Only the mover resizes the space (it holds `moving`).
                    assert_eq!(
                        space.segments(),
                        have,
                        "volume {}: the segment table changed size during a growth",
                        self.name
                    );
                    self.check_space_size(have + add);
                    space.grow(add);
                }
                *self.space.growth_failed.lock() = None;
                tracing::info!(volume = %self.name, "the segment space grew to {} segments (at most {most})", have + add);
                true
            }
            Err(e) => {
                let why = e.to_string();
                let mut failed = self.space.growth_failed.lock();
                if failed.as_ref().is_none_or(|(w, _)| *w != why) {
                    tracing::warn!(volume = %self.name, "the segment space could not grow: {why}");
                }
                *failed = Some((why, std::time::Instant::now()));
                false
            }
        }
    }

    /// Gives the trailing free segments the space does not need back to the pool
    /// ([`super::space::Space::shrinkable`]) in one engine resize down: they leave the table
    /// first, so nothing opens them meanwhile, and come back if the resize fails. Returns
    /// whether it shrank. No map entry points into a free segment (docs/design/
    /// log-structured-volumes.md, "Step 3b, second part").
    pub(crate) async fn shrink_space(&self, gc: &mut Gc) -> bool {
        if gc.shrink_failed.is_some_and(|at| at.elapsed() < RESIZE_RETRY) {
            return false;
        }
        let (n, keep) = {
            let mut space = self.space.lock();
            let n = space.shrinkable();
            if n > 0 {
                space.give_back(n);
            }
            (n, space.segments())
        };
        if n == 0 {
            return false;
        }
        match self.resize_space(keep).await {
            Ok(()) => {
                self.check_space_size(keep);
                gc.shrink_failed = None;
                self.counters.segments_given_back.fetch_add(n, Relaxed);
                tracing::info!(volume = %self.name, "gave {n} free segments back to the pool ({keep} left)");
                true
            }
            Err(e) => {
                self.space.lock().grow(n);
                gc.shrink_failed = Some(std::time::Instant::now());
                tracing::warn!(volume = %self.name, "could not give {n} free segments back to the pool: {e}");
                false
            }
        }
    }

    /// The engine volume under the space holds exactly `segments` segments after a resize: open
    /// takes the segments that exist from its size.
    fn check_space_size(&self, segments: u64) {
        let bytes = segments * self.geo.segment_blocks() * BLOCK_BYTES;
        assert_eq!(
            self.parts.seg.size_bytes(),
            bytes,
            "volume {}: the segment part holds {} bytes after a resize to {segments} segments",
            self.name,
            self.parts.seg.size_bytes()
        );
    }

    /// Resizes the engine volume under the space to `segments` segments (not zeroed: every
    /// read of the space goes through the map).
    pub(super) async fn resize_space(&self, segments: u64) -> Result<(), EngineError> {
        let bytes = segments * self.geo.segment_blocks() * BLOCK_BYTES;
        if bytes > self.parts.seg.size_bytes() {
            // New rows may be extents another volume gave back, with its stripes and checksums:
            // their checksum entries are cleared (1/1024 of the rows, metadata only), so a scrub
            // sees them as unwritten instead of as parity that disagrees.
            self.pool.resize_volume(self.parts.seg.name(), bytes).await
        } else {
            self.pool.resize_volume_unzeroed(self.parts.seg.name(), bytes).await
        }
    }
}
