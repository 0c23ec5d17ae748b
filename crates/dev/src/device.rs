//! The block-device trait everything above the drives is generic over.

use std::future::Future;
use std::io;
use std::sync::Arc;

use crate::buf::{IoBuf, IoBytes};
use crate::counters::DevCounters;

/// Every device offset and length is a multiple of this (one "block").
pub const BLOCK_BYTES: u64 = 4096;

/// [`BLOCK_BYTES`] as a `usize`, for buffer lengths and slice indices.
pub const BLOCK_USIZE: usize = 4096;
const _: () = assert!(BLOCK_USIZE as u64 == BLOCK_BYTES);

/// A drive: a file, a block device, memory, a fault-injecting wrapper, or later a remote drive.
///
/// The interface is asynchronous and owns its buffers, so an implementation may keep many
/// requests in flight and complete them in any order (io_uring, a thread pool, a network peer).
/// Offsets and lengths must be multiples of [`BLOCK_BYTES`] and lie inside the device; buffers
/// passed to `read` and `write` should be aligned views (see [`crate::buf`]).
///
/// Durability: a completed `write` may still sit in a volatile cache. It is durable once a
/// `flush` that started after the write completed has itself completed, or at once when the
/// write was submitted with `fua` (force unit access).
pub trait BlockDevice: Send + Sync + 'static {
    /// A short human name for logs and errors (usually the path).
    fn name(&self) -> &str;

    /// Usable size in bytes (a multiple of [`BLOCK_BYTES`]).
    fn size_bytes(&self) -> u64;

    /// Fills `buf` with the bytes at `offset_bytes` and gives it back.
    fn read(&self, offset_bytes: u64, buf: IoBuf) -> impl Future<Output = Result<IoBuf, DevError>> + Send;

    /// Writes `data` at `offset_bytes`; with `fua` the data is durable when this completes.
    fn write(
        &self,
        offset_bytes: u64,
        data: IoBytes,
        fua: bool,
    ) -> impl Future<Output = Result<(), DevError>> + Send;

    /// Makes every write completed before this call durable.
    fn flush(&self) -> impl Future<Output = Result<(), DevError>> + Send;

    /// Tells the device the range is no longer needed. Contents afterwards are unspecified.
    fn discard(&self, offset_bytes: u64, len_bytes: u64)
    -> impl Future<Output = Result<(), DevError>> + Send;

    /// Makes the range read as zeros, durably after the next `flush`. The default writes zeros
    /// a MiB at a time; a device that can do it without writing the bytes (a hole punched in
    /// a file, a block device's WRITE ZEROES) overrides it, so that formatting a large drive
    /// writes almost nothing and a sparse drive file stays sparse.
    fn zero(&self, offset_bytes: u64, len_bytes: u64) -> impl Future<Output = Result<(), DevError>> + Send {
        write_zeros(self, offset_bytes, len_bytes)
    }

    /// Operation and byte counters of this device.
    fn counters(&self) -> &DevCounters;
}

/// Writes zeros over `len_bytes` of `dev` from `offset_bytes`, a MiB at a time: what
/// [`BlockDevice::zero`] does on a device with no better way.
pub async fn write_zeros<D: BlockDevice + ?Sized>(
    dev: &D,
    offset_bytes: u64,
    len_bytes: u64,
) -> Result<(), DevError> {
    const CHUNK: usize = 1 << 20;
    let zeros = IoBytes::zeroed(CHUNK);
    let mut at = 0;
    while at < len_bytes {
        let n = usize::try_from(len_bytes - at).map_or(CHUNK, |rest| rest.min(CHUNK));
        dev.write(offset_bytes + at, zeros.slice(0..n), false).await?;
        at += n as u64;
    }
    Ok(())
}

/// A shared device is a device: lets a test keep a handle to a drive a pool owns.
impl<T: BlockDevice> BlockDevice for Arc<T> {
    fn name(&self) -> &str {
        (**self).name()
    }
    fn size_bytes(&self) -> u64 {
        (**self).size_bytes()
    }
    fn read(&self, offset_bytes: u64, buf: IoBuf) -> impl Future<Output = Result<IoBuf, DevError>> + Send {
        (**self).read(offset_bytes, buf)
    }
    fn write(
        &self,
        offset_bytes: u64,
        data: IoBytes,
        fua: bool,
    ) -> impl Future<Output = Result<(), DevError>> + Send {
        (**self).write(offset_bytes, data, fua)
    }
    fn flush(&self) -> impl Future<Output = Result<(), DevError>> + Send {
        (**self).flush()
    }
    fn discard(
        &self,
        offset_bytes: u64,
        len_bytes: u64,
    ) -> impl Future<Output = Result<(), DevError>> + Send {
        (**self).discard(offset_bytes, len_bytes)
    }
    fn zero(&self, offset_bytes: u64, len_bytes: u64) -> impl Future<Output = Result<(), DevError>> + Send {
        (**self).zero(offset_bytes, len_bytes)
    }
    fn counters(&self) -> &DevCounters {
        (**self).counters()
    }
}

/// Why a device request failed.
#[derive(Debug, thiserror::Error)]
pub enum DevError {
    /// The device reported an error (or the fault injector simulated one).
    #[error("I/O error on {device} at offset {offset_bytes} (+{len_bytes} bytes): {source}")]
    Io {
        device: Arc<str>,
        offset_bytes: u64,
        len_bytes: u64,
        #[source]
        source: io::Error,
    },
    /// The request reaches past the end of the device.
    #[error(
        "{device}: request at offset {offset_bytes} (+{len_bytes} bytes) is outside the device ({size_bytes} bytes)"
    )]
    OutOfRange { device: Arc<str>, offset_bytes: u64, len_bytes: u64, size_bytes: u64 },
    /// The offset or length is not a multiple of the block size.
    #[error(
        "{device}: request at offset {offset_bytes} (+{len_bytes} bytes) is not aligned to {BLOCK_BYTES} bytes"
    )]
    Misaligned { device: Arc<str>, offset_bytes: u64, len_bytes: u64 },
    /// A remote drive refused the request because a newer owner fenced it: the request's
    /// epoch is below the epoch the drive persisted (docs/design/cluster.md). Not a fault of the
    /// drive: the caller has lost the right to use it and must stop, not fail the drive.
    #[error("{device}: fenced: request epoch {epoch} is below the drive's epoch {drive_epoch}")]
    Fenced { device: Arc<str>, epoch: u64, drive_epoch: u64 },
}

impl DevError {
    /// True for errors the drive itself reported (a reason to fail the drive), false for caller bugs.
    pub fn is_media_error(&self) -> bool {
        matches!(self, DevError::Io { .. }) && !self.is_no_space()
    }

    /// True when a newer owner fenced the drive off ([`DevError::Fenced`]): the caller must stop
    /// using it and must not record it as failed (that is the new owner's decision).
    pub fn is_fenced(&self) -> bool {
        matches!(self, DevError::Fenced { .. })
    }

    /// True when the host ran out of space under the device (ENOSPC or EDQUOT from the
    /// filesystem holding a drive file): a fault of the host, not of the drive, that freeing
    /// space cures. The engine suspends writes instead of failing the drive.
    pub fn is_no_space(&self) -> bool {
        match self {
            DevError::Io { source, .. } => {
                matches!(source.kind(), io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded)
                    || matches!(source.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
            }
            _ => false,
        }
    }
}

/// Checks that a request is block-aligned and inside a device of `size_bytes`.
///
/// Every backend calls this first, so a bad request never reaches the medium.
pub fn check_range(
    device: &Arc<str>,
    size_bytes: u64,
    offset_bytes: u64,
    len_bytes: u64,
) -> Result<(), DevError> {
    if !offset_bytes.is_multiple_of(BLOCK_BYTES) || !len_bytes.is_multiple_of(BLOCK_BYTES) {
        return Err(DevError::Misaligned { device: Arc::clone(device), offset_bytes, len_bytes });
    }
    match offset_bytes.checked_add(len_bytes) {
        Some(end) if end <= size_bytes => Ok(()),
        _ => Err(DevError::OutOfRange { device: Arc::clone(device), offset_bytes, len_bytes, size_bytes }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_range_rejects_misaligned_and_overflowing_requests() {
        let dev: Arc<str> = Arc::from("d0");
        assert!(check_range(&dev, 8192, 0, 8192).is_ok());
        assert!(matches!(check_range(&dev, 8192, 1, 4096), Err(DevError::Misaligned { .. })));
        assert!(matches!(check_range(&dev, 8192, 4096, 8192), Err(DevError::OutOfRange { .. })));
        assert!(matches!(check_range(&dev, 8192, u64::MAX - 4095, 4096), Err(DevError::OutOfRange { .. })));
    }
}
