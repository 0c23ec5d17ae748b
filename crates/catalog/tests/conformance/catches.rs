//! The suite catches broken implementations: each test wraps a real volume in one that breaks
//! one clause of the contract the way a plausible bug would, runs the clause's body against it,
//! and expects it to fail. A clause that passed against a broken volume would prove nothing.

use std::sync::Arc;

use stria_dev::{BLOCK_BYTES, IoBuf, IoBytes};
use stria_engine::{BlockVolume, Durability, Extent, VolumeFuture, VolumeInfo, Zeroing};

use super::{Kind, Wrap};

/// A volume that forwards everything to `inner` except what its `Fault` breaks.
struct Broken {
    inner: Arc<dyn BlockVolume>,
    fault: Fault,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// Reads start at the block holding the offset (an unaligned read returns the wrong bytes).
    RoundedReads,
    /// FUA is dropped: every write, zeroing and discard is buffered.
    DroppedFua,
    /// Requests past the end are clipped to the volume instead of refused.
    ClippedRanges,
    /// Unaligned writes do their own read-modify-write of whole blocks, with no lock.
    UnlockedMerge,
    /// Zeroing drops whole blocks and leaves the partial edges as they were.
    ZeroingSkipsEdges,
    /// Block status reports everything unallocated.
    AllHoles,
    /// Compare and write reads, compares and writes through the other calls, with no lock.
    UnlockedCompareAndWrite,
    /// FUA is dropped from compare and writes (only).
    DroppedCompareAndWriteFua,
}

impl Broken {
    fn wrap(inner: Arc<dyn BlockVolume>, fault: Fault) -> Arc<dyn BlockVolume> {
        Arc::new(Broken { inner, fault })
    }

    fn clip(&self, offset: u64, len: u64) -> (u64, u64) {
        let size = self.inner.size_bytes();
        let offset = offset.min(size);
        (offset, len.min(size - offset))
    }

    fn durability(&self, d: Durability) -> Durability {
        if self.fault == Fault::DroppedFua { Durability::Buffered } else { d }
    }

    /// Read, merge and write back the whole blocks under `data`, unlocked, yielding between the
    /// read and the write (as a slow drive would).
    async fn merge_unlocked(
        &self,
        offset: u64,
        data: IoBytes,
        d: Durability,
    ) -> Result<(), stria_engine::VolumeError> {
        let first = offset / BLOCK_BYTES * BLOCK_BYTES;
        let end = (offset + data.len() as u64).next_multiple_of(BLOCK_BYTES);
        let mut merged = self.inner.read(first, (end - first) as usize).await?.to_vec();
        // Wide enough that concurrent merges of one block all read before any writes: one
        // yield let a fast volume (raid10) finish a merge alone in about a third of the runs,
        // and the catch failed to catch.
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        let at = (offset - first) as usize;
        merged[at..at + data.len()].copy_from_slice(&data);
        self.inner.write(first, IoBytes::copy_from(&merged), d).await
    }
}

impl BlockVolume for Broken {
    fn info(&self) -> VolumeInfo {
        self.inner.info()
    }

    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }

    fn read(&self, offset_bytes: u64, len_bytes: usize) -> VolumeFuture<'_, IoBuf> {
        match self.fault {
            Fault::RoundedReads => self.inner.read(offset_bytes / BLOCK_BYTES * BLOCK_BYTES, len_bytes),
            Fault::ClippedRanges => Box::pin(async move {
                let (o, l) = self.clip(offset_bytes, len_bytes as u64);
                let got = self.inner.read(o, l as usize).await?;
                let mut out = IoBuf::zeroed(len_bytes);
                out[..got.len()].copy_from_slice(&got);
                Ok(out)
            }),
            _ => self.inner.read(offset_bytes, len_bytes),
        }
    }

    fn write(&self, offset_bytes: u64, data: IoBytes, durability: Durability) -> VolumeFuture<'_, ()> {
        let d = self.durability(durability);
        match self.fault {
            Fault::ClippedRanges => {
                let (o, l) = self.clip(offset_bytes, data.len() as u64);
                self.inner.write(o, data.slice(0..l as usize), d)
            }
            Fault::UnlockedMerge
                if !offset_bytes.is_multiple_of(BLOCK_BYTES)
                    || !(data.len() as u64).is_multiple_of(BLOCK_BYTES) =>
            {
                Box::pin(self.merge_unlocked(offset_bytes, data, d))
            }
            _ => self.inner.write(offset_bytes, data, d),
        }
    }

    fn compare_and_write(
        &self,
        offset_bytes: u64,
        compare: IoBytes,
        write: IoBytes,
        d: Durability,
    ) -> VolumeFuture<'_, ()> {
        let d = match self.fault {
            Fault::DroppedCompareAndWriteFua => Durability::Buffered,
            _ => self.durability(d),
        };
        if self.fault != Fault::UnlockedCompareAndWrite {
            return self.inner.compare_and_write(offset_bytes, compare, write, d);
        }
        Box::pin(async move {
            let found = self.inner.read(offset_bytes, compare.len()).await?;
            stria_engine::volume::contract::check_compare("broken", offset_bytes, &compare, &found)?;
            tokio::task::yield_now().await;
            self.inner.write(offset_bytes, write, d).await
        })
    }

    fn write_zeroes(
        &self,
        offset_bytes: u64,
        len_bytes: u64,
        zeroing: Zeroing,
        d: Durability,
    ) -> VolumeFuture<'_, ()> {
        let d = self.durability(d);
        match self.fault {
            Fault::ClippedRanges => {
                let (o, l) = self.clip(offset_bytes, len_bytes);
                self.inner.write_zeroes(o, l, zeroing, d)
            }
            Fault::ZeroingSkipsEdges => {
                let first = offset_bytes.next_multiple_of(BLOCK_BYTES);
                let end = (offset_bytes + len_bytes) / BLOCK_BYTES * BLOCK_BYTES;
                if end <= first {
                    return Box::pin(async { Ok(()) });
                }
                self.inner.write_zeroes(first, end - first, zeroing, d)
            }
            _ => self.inner.write_zeroes(offset_bytes, len_bytes, zeroing, d),
        }
    }

    fn discard(&self, offset_bytes: u64, len_bytes: u64, d: Durability) -> VolumeFuture<'_, ()> {
        let d = self.durability(d);
        if self.fault == Fault::ClippedRanges {
            let (o, l) = self.clip(offset_bytes, len_bytes);
            return self.inner.discard(o, l, d);
        }
        self.inner.discard(offset_bytes, len_bytes, d)
    }

    fn flush(&self) -> VolumeFuture<'_, ()> {
        self.inner.flush()
    }

    fn block_status(&self, offset_bytes: u64, len_bytes: u64) -> VolumeFuture<'_, Vec<Extent>> {
        match self.fault {
            Fault::AllHoles => Box::pin(async move {
                let extents = self.inner.block_status(offset_bytes, len_bytes).await?;
                Ok(if len_bytes == 0 { extents } else { vec![Extent { len_bytes, unallocated: true }] })
            }),
            Fault::ClippedRanges => {
                let (o, l) = self.clip(offset_bytes, len_bytes);
                self.inner.block_status(o, l)
            }
            _ => self.inner.block_status(offset_bytes, len_bytes),
        }
    }
}

/// Runs `body` on `kind` wrapped by `wrap` and asserts that it fails (panics).
async fn fails<F, Fut>(body: F, kind: Kind, wrap: Wrap, what: &str)
where
    F: FnOnce(Kind, Wrap) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let outcome = tokio::spawn(body(kind, wrap)).await;
    assert!(
        outcome.as_ref().is_err_and(tokio::task::JoinError::is_panic),
        "the suite did not catch {what} on {kind:?}"
    );
}

macro_rules! broken {
    ($fault:ident) => {
        |v| Broken::wrap(v, Fault::$fault)
    };
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rounded_reads() {
    fails(super::model_ops::clause, Kind::Raid1, broken!(RoundedReads), "reads rounded down to a block")
        .await;
    fails(super::unaligned::edges, Kind::Snapshot, broken!(RoundedReads), "reads rounded down to a block")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_fua() {
    // Plain volumes only: log-structured ones make every write durable anyway.
    for kind in [Kind::Raid1, Kind::Ec] {
        fails(super::durability::clause, kind, broken!(DroppedFua), "FUA dropped").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clipped_ranges() {
    fails(super::ranges::clause, Kind::Raid0, broken!(ClippedRanges), "requests past the end clipped").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlocked_merge() {
    for kind in [Kind::Raid10, Kind::Log] {
        fails(super::unaligned::concurrent_disjoint, kind, broken!(UnlockedMerge), "an unlocked merge").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zeroing_skips_edges() {
    fails(super::zeroing::zeroing, Kind::Tiered, broken!(ZeroingSkipsEdges), "zeroing without its edges")
        .await;
    fails(super::model_ops::clause, Kind::Ec, broken!(ZeroingSkipsEdges), "zeroing without its edges").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_holes() {
    fails(super::block_status::clause, Kind::Clone, broken!(AllHoles), "block status all holes").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlocked_compare_and_write() {
    for kind in [Kind::Ec, Kind::Tiered] {
        fails(
            super::compare_and_write::atomic_counter,
            kind,
            broken!(UnlockedCompareAndWrite),
            "an unlocked compare and write",
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_compare_and_write_fua() {
    // Plain volumes only: log-structured ones make every write durable anyway.
    for kind in [Kind::Raid1, Kind::Ec] {
        fails(
            super::durability::clause,
            kind,
            broken!(DroppedCompareAndWriteFua),
            "FUA dropped from compare and writes",
        )
        .await;
    }
}
