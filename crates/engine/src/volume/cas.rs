//! Compare and write (the contract's `compare_and_write`, SCSI COMPARE AND WRITE): the range is
//! read, compared and written while the stripe locks of its rows are held, the locks every write,
//! zeroing, discard, repair and row-walking maintenance of those rows holds. So nothing that
//! changes the range lands between the compare and the write.

use std::sync::atomic::Ordering::Relaxed;

use stria_dev::{BlockDevice, IoBuf, IoBytes};

use super::bytes::Span;
use super::{InFamily, LayoutFamily, Volume};
use crate::error::VolumeError;

impl<F: Sync, D: BlockDevice> InFamily<'_, F, D>
where
    Self: LayoutFamily<D>,
{
    /// [`Volume::compare_and_write`].
    async fn compare_and_write_in(
        &self,
        offset_bytes: u64,
        compare: IoBytes,
        write: IoBytes,
        fua: bool,
    ) -> Result<(), VolumeError> {
        let _op = self.enter_op()?;
        stria_volume::check_compare_and_write(offset_bytes, &compare, &write)?;
        let len_bytes = write.len() as u64;
        self.check_range(offset_bytes, len_bytes)?;
        self.host.check_writable().map_err(|e| self.pool_error(e))?;
        self.counters.read_ops.fetch_add(1, Relaxed);
        self.counters.read_bytes.fetch_add(len_bytes, Relaxed);
        if len_bytes == 0 {
            return Ok(());
        }
        let span = Span::new(offset_bytes, len_bytes);
        self.write_span_locked(&span, None, fua, |map| async move {
            // The whole blocks, read with the locks held (the slow path must not take them again).
            let mut whole =
                self.read_blocks_in(&map, span.first, IoBuf::zeroed(span.whole_len()), true, None).await?;
            let (head, len) = (span.head(), write.len());
            stria_volume::check_compare(&self.name, offset_bytes, &compare, &whole[head..head + len])?;
            self.counters.write_ops.fetch_add(1, Relaxed);
            self.counters.write_bytes.fetch_add(len_bytes, Relaxed);
            whole[head..head + len].copy_from_slice(&write);
            let data = whole.freeze();
            // The drives take aligned memory; a read's buffer is, unless it was joined by copy.
            Ok(if data.is_aligned() { data } else { IoBytes::copy_from(&data) })
        })
        .await
    }
}

impl<D: BlockDevice> Volume<D> {
    /// Writes `write` at `offset_bytes` only if the range holds `compare`, under the stripe
    /// locks of the range (contract, "Compare and write"); a mismatch is
    /// [`VolumeError::Miscompare`] and writes nothing. With `fua` the write is durable when this
    /// returns. Counted as a read of the range, and as a write when it writes.
    pub async fn compare_and_write(
        &self,
        offset_bytes: u64,
        compare: IoBytes,
        write: IoBytes,
        fua: bool,
    ) -> Result<(), VolumeError> {
        with_family!(self, |f| f.compare_and_write_in(offset_bytes, compare, write, fua).await)
    }
}
