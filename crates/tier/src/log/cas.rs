//! Compare and write (the contract's `compare_and_write`, SCSI COMPARE AND WRITE): the range's
//! locks (`ranges`) are held exclusively from before the read until the map update of the write
//! is applied. Every host write, zeroing and trim holds the locks of its range shared over the
//! same span of its own work, so none lands between the compare and the write. The mover may move
//! the blocks meanwhile (a move never changes what a block holds, and loses to the write if it
//! comes after it).

use std::sync::atomic::Ordering::Relaxed;

use stria_dev::{BlockDevice, IoBytes};
use stria_engine::VolumeError;
use stria_engine::volume::bytes::Span;
use stria_engine::volume::contract::{check_compare, check_compare_and_write};

use super::{HEAD, LogVolume};

impl<D: BlockDevice> LogVolume<D> {
    /// Writes `write` at `offset_bytes` only if the range holds `compare` (contract, "Compare
    /// and write"); a mismatch is [`VolumeError::Miscompare`] and writes nothing. Durable when
    /// this returns, like every write. Counted as a host read of the range, and as a host write
    /// when it writes.
    pub async fn compare_and_write(
        &self,
        offset_bytes: u64,
        compare: IoBytes,
        write: IoBytes,
    ) -> Result<(), VolumeError> {
        self.compare_and_write_to(HEAD, offset_bytes, compare, write).await
    }

    /// [`Self::compare_and_write`] on the head ([`HEAD`]) or on clone `layer`.
    pub async fn compare_and_write_to(
        &self,
        layer: u16,
        offset_bytes: u64,
        compare: IoBytes,
        write: IoBytes,
    ) -> Result<(), VolumeError> {
        check_compare_and_write(offset_bytes, &compare, &write)?;
        let len = write.len() as u64;
        self.check_range_of(layer, offset_bytes, len)?;
        self.check_writable(offset_bytes, len)?;
        self.counters.host_read_ops.fetch_add(1, Relaxed);
        self.counters.host_read_bytes.fetch_add(len, Relaxed);
        if len == 0 {
            return Ok(());
        }
        let _write = self.gates.writes.read().await;
        self.check_layer_takes_writes(layer)?;
        self.check_range_of(layer, offset_bytes, len)?;
        let span = Span::new(offset_bytes, len);
        let _range = self.gates.ranges.exclusive(span.first, span.end).await;
        let view = (layer != HEAD).then_some(layer);
        let mut whole = self.read_view(view, span.first, span.blocks()).await?;
        let (head, n) = (span.head(), write.len());
        check_compare(&self.name, offset_bytes, &compare, &whole[head..head + n])?;
        self.counters.host_write_ops.fetch_add(1, Relaxed);
        self.counters.host_write_bytes.fetch_add(len, Relaxed);
        self.clock.last_write_ms.store(self.now_ms(), Relaxed);
        whole[head..head + n].copy_from_slice(&write);
        self.write_blocks(layer, span.first, whole.freeze(), true).await
    }
}
