//! A volume behind the pool's dispatcher: each request waits for its turn (when the dispatcher
//! is on) and holds its grant while it runs.

use std::sync::Arc;

use stria_dev::{IoBuf, IoBytes};

use crate::volume::Extent;
use crate::volume::contract::{BlockVolume, Durability, VolumeFuture, VolumeInfo, Zeroing};

use super::cost::{CostProfile, OpKind};
use super::dispatch::Dispatcher;
use super::sched::FlowId;

/// `inner` with its requests scheduled as flow `flow` of `dispatcher`.
pub struct QosVolume {
    inner: Arc<dyn BlockVolume>,
    dispatcher: Arc<Dispatcher>,
    flow: FlowId,
    profile: CostProfile,
}

impl std::fmt::Debug for QosVolume {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QosVolume").field("info", &self.inner.info()).field("flow", &self.flow).finish()
    }
}

impl QosVolume {
    /// `inner`, scheduled under the name `name` (its settings' key) with `profile`'s costs.
    pub fn new(
        inner: Arc<dyn BlockVolume>,
        dispatcher: Arc<Dispatcher>,
        name: &str,
        profile: CostProfile,
    ) -> Self {
        let flow = dispatcher.flow(name);
        QosVolume { inner, dispatcher, flow, profile }
    }

    /// Runs `op` when the dispatcher lets it go (at once, with no extra allocation, when it is
    /// off).
    fn gated<'a, T: Send + 'a>(
        &'a self,
        kind: OpKind,
        bytes: u64,
        op: impl FnOnce() -> VolumeFuture<'a, T> + Send + 'a,
    ) -> VolumeFuture<'a, T> {
        if !self.dispatcher.active() {
            return op();
        }
        Box::pin(async move {
            let _grant = self.dispatcher.admit(self.flow, &self.profile, kind, bytes).await;
            op().await
        })
    }
}

impl BlockVolume for QosVolume {
    fn info(&self) -> VolumeInfo {
        self.inner.info()
    }

    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }

    fn read(&self, offset_bytes: u64, len_bytes: usize) -> VolumeFuture<'_, IoBuf> {
        self.gated(OpKind::Read, len_bytes as u64, move || self.inner.read(offset_bytes, len_bytes))
    }

    fn write(&self, offset_bytes: u64, data: IoBytes, durability: Durability) -> VolumeFuture<'_, ()> {
        let bytes = data.len() as u64;
        self.gated(OpKind::Write, bytes, move || self.inner.write(offset_bytes, data, durability))
    }

    fn compare_and_write(
        &self,
        offset_bytes: u64,
        compare: IoBytes,
        write: IoBytes,
        durability: Durability,
    ) -> VolumeFuture<'_, ()> {
        // Costed as the write it may be (its read is of the same range, and short).
        let bytes = write.len() as u64;
        self.gated(OpKind::Write, bytes, move || {
            self.inner.compare_and_write(offset_bytes, compare, write, durability)
        })
    }

    fn write_zeroes(
        &self,
        offset_bytes: u64,
        len_bytes: u64,
        zeroing: Zeroing,
        durability: Durability,
    ) -> VolumeFuture<'_, ()> {
        self.gated(OpKind::Meta, 0, move || {
            self.inner.write_zeroes(offset_bytes, len_bytes, zeroing, durability)
        })
    }

    fn discard(&self, offset_bytes: u64, len_bytes: u64, durability: Durability) -> VolumeFuture<'_, ()> {
        self.gated(OpKind::Meta, 0, move || self.inner.discard(offset_bytes, len_bytes, durability))
    }

    fn flush(&self) -> VolumeFuture<'_, ()> {
        self.gated(OpKind::Meta, 0, move || self.inner.flush())
    }

    fn block_status(&self, offset_bytes: u64, len_bytes: u64) -> VolumeFuture<'_, Vec<Extent>> {
        // Reads the map only (no drive time worth scheduling).
        self.inner.block_status(offset_bytes, len_bytes)
    }
}
