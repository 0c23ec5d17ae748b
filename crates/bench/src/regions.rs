//! Drive writes split by region of the stria drive layout (data, checksum pages, journal, intent
//! bitmap, pool metadata): a pass-through [`BlockDevice`] wrapper the engine and tier
//! benchmarks put under their pools, so that a volume's own writes can be told from the
//! engine's bookkeeping.

use std::future::Future;
use std::sync::Arc;

use anyhow::{Context, Result};
use stria_dev::{BlockDevice, DevCounters, DevCountersSnapshot, DevError, IoBuf, IoBytes};
use stria_engine::format::layout::DriveLayout;

/// Drive regions writes are counted in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Region {
    /// Superblocks and pool metadata.
    Meta = 0,
    Intent = 1,
    Journal = 2,
    Checksums = 3,
    /// What the volumes store: cache log, tier records, capacity stripes.
    Data = 4,
}

pub(crate) const REGIONS: usize = 5;

/// Write counters of one drive by region (each with its own size histogram).
#[derive(Debug, Default)]
pub(crate) struct RegionCounters {
    by_region: [DevCounters; REGIONS],
}

impl RegionCounters {
    pub(crate) fn snapshot(&self) -> [DevCountersSnapshot; REGIONS] {
        std::array::from_fn(|r| self.by_region[r].snapshot())
    }
}

/// A drive that counts its writes per region of the stria drive layout, and passes everything
/// through (its [`BlockDevice::counters`] are the inner drive's, so the pool's and the tiered
/// volume's status see the inner drive exactly).
#[derive(Debug)]
pub(crate) struct Tap<D> {
    inner: D,
    layout: DriveLayout,
    regions: Arc<RegionCounters>,
    /// Yield to the scheduler once per request before passing it on, as a request to a real
    /// drive would (memory drives complete at once, so without this no two requests are ever
    /// in flight together and nothing that batches concurrent requests can batch).
    yield_io: bool,
}

impl<D: BlockDevice> Tap<D> {
    pub(crate) fn new(inner: D) -> Result<Tap<D>> {
        let layout = DriveLayout::for_new_drive(inner.size_bytes())
            .with_context(|| format!("drive {} is too small", inner.name()))?;
        Ok(Tap { inner, layout, regions: Arc::default(), yield_io: false })
    }

    /// The same tap, yielding once per request (see `yield_io`).
    pub(crate) fn yielding(self) -> Tap<D> {
        Tap { yield_io: true, ..self }
    }

    /// The counters, shared: they outlive the drive (the pool owns it).
    pub(crate) fn regions(&self) -> &Arc<RegionCounters> {
        &self.regions
    }

    fn region(&self, offset: u64) -> Region {
        let l = &self.layout;
        let inside = |start: u64, len: u64| offset >= start && offset < start + len;
        if inside(l.data_offset_bytes, l.data_bytes) {
            Region::Data
        } else if inside(l.csum_offset_bytes, l.csum_bytes) {
            Region::Checksums
        } else if inside(l.journal_offset_bytes, l.journal_bytes) {
            Region::Journal
        } else if inside(l.intent_offset_bytes, l.intent_bytes) {
            Region::Intent
        } else {
            Region::Meta
        }
    }
}

impl<D: BlockDevice> BlockDevice for Tap<D> {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read(&self, offset_bytes: u64, buf: IoBuf) -> impl Future<Output = Result<IoBuf, DevError>> + Send {
        let (y, io) = (self.yield_io, self.inner.read(offset_bytes, buf));
        async move {
            if y {
                tokio::task::yield_now().await;
            }
            io.await
        }
    }
    fn write(
        &self,
        offset_bytes: u64,
        data: IoBytes,
        fua: bool,
    ) -> impl Future<Output = Result<(), DevError>> + Send {
        // Counted at submission: the benchmark compares settled totals, after every write completed.
        self.regions.by_region[self.region(offset_bytes) as usize].record_write(data.len() as u64);
        let (y, io) = (self.yield_io, self.inner.write(offset_bytes, data, fua));
        async move {
            if y {
                tokio::task::yield_now().await;
            }
            io.await
        }
    }
    fn flush(&self) -> impl Future<Output = Result<(), DevError>> + Send {
        let (y, io) = (self.yield_io, self.inner.flush());
        async move {
            if y {
                tokio::task::yield_now().await;
            }
            io.await
        }
    }
    fn discard(
        &self,
        offset_bytes: u64,
        len_bytes: u64,
    ) -> impl Future<Output = Result<(), DevError>> + Send {
        self.inner.discard(offset_bytes, len_bytes)
    }
    fn counters(&self) -> &DevCounters {
        self.inner.counters()
    }
}
