//! The contract of a client-visible volume lives in `stria-volume` ([`BlockVolume`] and its
//! types, re-exported here where they were defined before); this is the plain engine volume's
//! implementation of it.

use stria_dev::{BlockDevice, IoBuf, IoBytes};

use super::{Extent, Volume};
pub use stria_volume::{
    BlockVolume, COMPARE_AND_WRITE_ALIGN_BYTES, COMPARE_AND_WRITE_MAX_BYTES, Dealloc, Durability,
    VolumeFuture, VolumeInfo, ZeroCost, Zeroing, check_compare, check_compare_and_write,
};

impl<D: BlockDevice> BlockVolume for Volume<D> {
    fn info(&self) -> VolumeInfo {
        VolumeInfo {
            name: self.name().to_string(),
            layout: self.layout().to_string(),
            preferred_block_bytes: self.chunk_bytes(),
            read_only: false,
        }
    }

    fn size_bytes(&self) -> u64 {
        Volume::size_bytes(self)
    }

    fn read(&self, offset_bytes: u64, len_bytes: usize) -> VolumeFuture<'_, IoBuf> {
        Box::pin(Volume::read(self, offset_bytes, len_bytes))
    }

    fn write(&self, offset_bytes: u64, data: IoBytes, durability: Durability) -> VolumeFuture<'_, ()> {
        Box::pin(Volume::write(self, offset_bytes, data, durability.is_fua()))
    }

    fn compare_and_write(
        &self,
        offset_bytes: u64,
        compare: IoBytes,
        write: IoBytes,
        durability: Durability,
    ) -> VolumeFuture<'_, ()> {
        Box::pin(Volume::compare_and_write(self, offset_bytes, compare, write, durability.is_fua()))
    }

    fn write_zeroes(
        &self,
        offset_bytes: u64,
        len_bytes: u64,
        zeroing: Zeroing,
        durability: Durability,
    ) -> VolumeFuture<'_, ()> {
        Box::pin(Volume::write_zeroes(
            self,
            offset_bytes,
            len_bytes,
            durability.is_fua(),
            zeroing.cheap_only(),
        ))
    }

    fn discard(&self, offset_bytes: u64, len_bytes: u64, durability: Durability) -> VolumeFuture<'_, ()> {
        Box::pin(async move {
            Volume::trim(self, offset_bytes, len_bytes).await?;
            if durability.is_fua() {
                Volume::flush(self).await?;
            }
            Ok(())
        })
    }

    fn flush(&self) -> VolumeFuture<'_, ()> {
        Box::pin(Volume::flush(self))
    }

    fn block_status(&self, offset_bytes: u64, len_bytes: u64) -> VolumeFuture<'_, Vec<Extent>> {
        Box::pin(Volume::block_status(self, offset_bytes, len_bytes))
    }
}
