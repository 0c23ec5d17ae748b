//! [`BlockVolume`] for log-structured volumes: every acknowledged write, zeroing and discard is
//! already durable (cache blocks and map deltas are written with FUA before the acknowledgement),
//! so [`Durability`] changes nothing here.

use stria_dev::{BlockDevice, IoBuf, IoBytes};
use stria_engine::{BlockVolume, Durability, Extent, VolumeFuture, VolumeInfo, Zeroing};

impl<D: BlockDevice> BlockVolume for crate::lsv::LogVolume<D> {
    fn info(&self) -> VolumeInfo {
        VolumeInfo {
            name: self.name().to_string(),
            layout: self.layout(),
            preferred_block_bytes: stria_dev::BLOCK_BYTES,
        }
    }

    fn size_bytes(&self) -> u64 {
        crate::lsv::LogVolume::size_bytes(self)
    }

    fn read(&self, offset_bytes: u64, len_bytes: usize) -> VolumeFuture<'_, IoBuf> {
        Box::pin(crate::lsv::LogVolume::read(self, offset_bytes, len_bytes))
    }

    fn write(&self, offset_bytes: u64, data: IoBytes, durability: Durability) -> VolumeFuture<'_, ()> {
        Box::pin(crate::lsv::LogVolume::write(self, offset_bytes, data, durability.is_fua()))
    }

    fn write_zeroes(
        &self,
        offset_bytes: u64,
        len_bytes: u64,
        zeroing: Zeroing,
        _durability: Durability,
    ) -> VolumeFuture<'_, ()> {
        Box::pin(crate::lsv::LogVolume::write_zeroes(self, offset_bytes, len_bytes, zeroing.cheap_only()))
    }

    fn discard(&self, offset_bytes: u64, len_bytes: u64, _durability: Durability) -> VolumeFuture<'_, ()> {
        Box::pin(crate::lsv::LogVolume::trim(self, offset_bytes, len_bytes))
    }

    fn flush(&self) -> VolumeFuture<'_, ()> {
        Box::pin(crate::lsv::LogVolume::flush(self))
    }

    fn block_status(&self, offset_bytes: u64, len_bytes: u64) -> VolumeFuture<'_, Vec<Extent>> {
        Box::pin(crate::lsv::LogVolume::block_status(self, offset_bytes, len_bytes))
    }
}
