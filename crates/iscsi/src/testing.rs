//! Test support, for this crate's tests, its integration tests and the fuzzer (not a stable
//! API): [`MemVolume`], a volume in memory that keeps its data and a per-4 KiB allocation map, so
//! that every answer can be checked against what was written.

// Sizes and offsets here are within a 4 MiB volume.
#![allow(clippy::cast_possible_truncation)]

use parking_lot::Mutex;
use stria_dev::{IoBuf, IoBytes};
use stria_volume::{
    BlockVolume, Durability, Extent, VolumeError, VolumeFuture, VolumeInfo, Zeroing, check_compare,
    check_compare_and_write,
};

/// The size of a [`MemVolume`].
pub const MEM_VOLUME_BYTES: u64 = 4 << 20;
const VOLUME_BYTES: u64 = MEM_VOLUME_BYTES;
const UNIT_BYTES: u64 = 4096;

/// A volume in memory: data, which 4 KiB units are allocated, and the durability of each write.
#[derive(Debug)]
pub struct MemVolume {
    /// The bytes.
    pub data: Mutex<Vec<u8>>,
    /// Which 4 KiB units are allocated.
    pub allocated: Mutex<Vec<bool>>,
    /// The durability of every write, in order.
    pub durabilities: Mutex<Vec<Durability>>,
    read_only: bool,
}

impl MemVolume {
    /// A volume of [`MEM_VOLUME_BYTES`] zeros, nothing allocated.
    pub fn new(read_only: bool) -> MemVolume {
        let len = usize::try_from(VOLUME_BYTES).unwrap();
        let units = usize::try_from(VOLUME_BYTES / UNIT_BYTES).unwrap();
        MemVolume {
            data: Mutex::new(vec![0; len]),
            allocated: Mutex::new(vec![false; units]),
            durabilities: Mutex::default(),
            read_only,
        }
    }

    fn range(&self, offset: u64, len: u64) -> Result<std::ops::Range<usize>, VolumeError> {
        match offset.checked_add(len) {
            Some(end) if end <= VOLUME_BYTES => Ok(offset as usize..end as usize),
            _ => Err(VolumeError::OutOfRange {
                offset_bytes: offset,
                len_bytes: len,
                size_bytes: VOLUME_BYTES,
            }),
        }
    }

    fn writable(&self) -> Result<(), VolumeError> {
        if self.read_only { Err(VolumeError::ReadOnly { volume: "v".into() }) } else { Ok(()) }
    }

    fn store(&self, offset: u64, bytes: &[u8]) {
        let r = offset as usize..offset as usize + bytes.len();
        self.data.lock()[r.clone()].copy_from_slice(bytes);
        let mut map = self.allocated.lock();
        for unit in r.start / UNIT_BYTES as usize..r.end.div_ceil(UNIT_BYTES as usize) {
            map[unit] = true;
        }
    }

    /// Zeroes a range: whole units become holes, edges are written with zeros.
    fn zero(&self, offset: u64, len: u64) {
        let r = offset as usize..(offset + len) as usize;
        self.data.lock()[r.clone()].fill(0);
        let unit = UNIT_BYTES as usize;
        let mut map = self.allocated.lock();
        for u in r.start.div_ceil(unit)..r.end / unit {
            map[u] = false;
        }
    }
}

impl BlockVolume for MemVolume {
    fn info(&self) -> VolumeInfo {
        VolumeInfo {
            name: "vol\u{e9}1".into(),
            layout: "mem".into(),
            preferred_block_bytes: 65536,
            read_only: self.read_only,
        }
    }

    fn size_bytes(&self) -> u64 {
        VOLUME_BYTES
    }

    fn read(&self, offset: u64, len: usize) -> VolumeFuture<'_, IoBuf> {
        Box::pin(async move {
            let r = self.range(offset, len as u64)?;
            Ok(IoBuf::copy_from(&self.data.lock()[r]))
        })
    }

    fn write(&self, offset: u64, data: IoBytes, durability: Durability) -> VolumeFuture<'_, ()> {
        Box::pin(async move {
            self.range(offset, data.len() as u64)?;
            self.writable()?;
            self.durabilities.lock().push(durability);
            self.store(offset, &data);
            Ok(())
        })
    }

    fn compare_and_write(
        &self,
        offset: u64,
        compare: IoBytes,
        write: IoBytes,
        durability: Durability,
    ) -> VolumeFuture<'_, ()> {
        Box::pin(async move {
            check_compare_and_write(offset, &compare, &write)?;
            let r = self.range(offset, write.len() as u64)?;
            self.writable()?;
            let found = self.data.lock()[r].to_vec();
            check_compare("v", offset, &compare, &found)?;
            self.durabilities.lock().push(durability);
            self.store(offset, &write);
            Ok(())
        })
    }

    fn write_zeroes(&self, offset: u64, len: u64, _: Zeroing, _: Durability) -> VolumeFuture<'_, ()> {
        Box::pin(async move {
            self.range(offset, len)?;
            self.writable()?;
            self.zero(offset, len);
            Ok(())
        })
    }

    fn discard(&self, offset: u64, len: u64, _: Durability) -> VolumeFuture<'_, ()> {
        self.write_zeroes(offset, len, Zeroing::ANY, Durability::Buffered)
    }

    fn flush(&self) -> VolumeFuture<'_, ()> {
        Box::pin(async { Ok(()) })
    }

    fn block_status(&self, offset: u64, len: u64) -> VolumeFuture<'_, Vec<Extent>> {
        Box::pin(async move {
            let r = self.range(offset, len)?;
            let map = self.allocated.lock();
            let mut out: Vec<Extent> = Vec::new();
            let mut at = r.start as u64;
            while at < r.end as u64 {
                let unit_end = (at / UNIT_BYTES + 1) * UNIT_BYTES;
                let n = unit_end.min(r.end as u64) - at;
                let unallocated = !map[(at / UNIT_BYTES) as usize];
                match out.last_mut() {
                    Some(e) if e.unallocated == unallocated => e.len_bytes += n,
                    _ => out.push(Extent { len_bytes: n, unallocated }),
                }
                at += n;
            }
            Ok(out)
        })
    }
}
