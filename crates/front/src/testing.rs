//! A volume for the unit tests: reads zeros, takes writes without keeping them, and reports a
//! fixed allocation map; it records the ranges `block_status` was asked about. A compare and
//! write compares with the zeros it reads (and keeps nothing, like a write).

use parking_lot::Mutex;
use stria_dev::{IoBuf, IoBytes};
use stria_volume::{BlockVolume, Durability, Extent, VolumeError, VolumeFuture, VolumeInfo, Zeroing};

pub(crate) struct MapVolume {
    size_bytes: u64,
    /// Allocated ranges (start, length), in order, disjoint.
    allocated: Vec<(u64, u64)>,
    looks: Mutex<Vec<u64>>,
}

impl MapVolume {
    pub(crate) fn new(size_bytes: u64, allocated: &[(u64, u64)]) -> MapVolume {
        MapVolume { size_bytes, allocated: allocated.to_vec(), looks: Mutex::default() }
    }

    /// The lengths `block_status` was called with, in order.
    pub(crate) fn looks(&self) -> Vec<u64> {
        self.looks.lock().clone()
    }

    fn check(&self, offset_bytes: u64, len_bytes: u64) -> Result<(), VolumeError> {
        match offset_bytes.checked_add(len_bytes) {
            Some(end) if end <= self.size_bytes => Ok(()),
            _ => Err(VolumeError::OutOfRange { offset_bytes, len_bytes, size_bytes: self.size_bytes }),
        }
    }

    /// Coalesced extents covering exactly the range.
    fn map(&self, offset_bytes: u64, len_bytes: u64) -> Vec<Extent> {
        let end = offset_bytes + len_bytes;
        let mut out: Vec<Extent> = Vec::new();
        let mut push = |len_bytes: u64, unallocated: bool| match out.last_mut() {
            _ if len_bytes == 0 => {}
            Some(last) if last.unallocated == unallocated => last.len_bytes += len_bytes,
            _ => out.push(Extent { len_bytes, unallocated }),
        };
        let mut at = offset_bytes;
        for &(start, len) in &self.allocated {
            let (start, stop) = (start.clamp(at, end), (start + len).clamp(at, end));
            push(start - at, true);
            push(stop - start, false);
            at = stop;
        }
        push(end - at, true);
        out
    }
}

impl BlockVolume for MapVolume {
    fn info(&self) -> VolumeInfo {
        VolumeInfo {
            name: "map".into(),
            layout: "test".into(),
            preferred_block_bytes: 4096,
            read_only: false,
        }
    }

    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn read(&self, offset_bytes: u64, len_bytes: usize) -> VolumeFuture<'_, IoBuf> {
        Box::pin(async move {
            self.check(offset_bytes, len_bytes as u64)?;
            Ok(IoBuf::zeroed(len_bytes))
        })
    }

    fn write(&self, offset_bytes: u64, data: IoBytes, _: Durability) -> VolumeFuture<'_, ()> {
        Box::pin(async move { self.check(offset_bytes, data.len() as u64) })
    }

    fn compare_and_write(
        &self,
        offset_bytes: u64,
        compare: IoBytes,
        write: IoBytes,
        _: Durability,
    ) -> VolumeFuture<'_, ()> {
        Box::pin(async move {
            stria_volume::check_compare_and_write(offset_bytes, &compare, &write)?;
            self.check(offset_bytes, write.len() as u64)?;
            // Atomic trivially: the contents never change.
            stria_volume::check_compare("map", offset_bytes, &compare, &vec![0; compare.len()])
        })
    }

    fn write_zeroes(
        &self,
        offset_bytes: u64,
        len_bytes: u64,
        _: Zeroing,
        _: Durability,
    ) -> VolumeFuture<'_, ()> {
        Box::pin(async move { self.check(offset_bytes, len_bytes) })
    }

    fn discard(&self, offset_bytes: u64, len_bytes: u64, _: Durability) -> VolumeFuture<'_, ()> {
        Box::pin(async move { self.check(offset_bytes, len_bytes) })
    }

    fn flush(&self) -> VolumeFuture<'_, ()> {
        Box::pin(async { Ok(()) })
    }

    fn block_status(&self, offset_bytes: u64, len_bytes: u64) -> VolumeFuture<'_, Vec<Extent>> {
        Box::pin(async move {
            self.check(offset_bytes, len_bytes)?;
            self.looks.lock().push(len_bytes);
            Ok(self.map(offset_bytes, len_bytes))
        })
    }
}
