//! Engine volumes as NBD exports.

use stria_dev::{BlockDevice, IoBuf, IoBytes};
use stria_engine::VolumeError;
use stria_nbd::{BoxFuture, Export, ExportError, Extent};

use crate::stack::AnyVolume;

/// Largest extent one NBD block-status entry can describe.
const EXTENT_MAX_BYTES: u64 = u32::MAX as u64 / 4096 * 4096;

/// A volume (plain or tiered) served over NBD.
pub(crate) struct VolumeExport<D: BlockDevice> {
    pub(crate) volume: AnyVolume<D>,
}

fn map_err(e: VolumeError) -> ExportError {
    match e {
        VolumeError::OutOfRange { offset_bytes, .. } => {
            ExportError::InvalidArgument(format!("request at {offset_bytes} is beyond the end of the volume"))
        }
        VolumeError::NotCheap { .. } => ExportError::NotSupported("zeroing this range is not cheap".into()),
        VolumeError::Closed(_) => ExportError::ShuttingDown,
        VolumeError::Unrecoverable { offset_bytes, len_bytes, reason, .. } => {
            ExportError::Io { offset_bytes, len_bytes, reason }
        }
        e @ VolumeError::Pool { .. } => {
            ExportError::Io { offset_bytes: 0, len_bytes: 0, reason: e.to_string() }
        }
    }
}

impl<D: BlockDevice> Export for VolumeExport<D> {
    fn size_bytes(&self) -> u64 {
        self.volume.size_bytes()
    }

    fn read_only(&self) -> bool {
        false
    }

    fn description(&self) -> Option<String> {
        Some(format!("stria volume {} ({})", self.volume.name(), self.volume.layout()))
    }

    fn preferred_block_bytes(&self) -> u32 {
        // A whole chunk: what one drive gets before the next (the stripe height).
        u32::try_from(self.volume.preferred_block_bytes()).unwrap_or(4096).max(4096)
    }

    fn can_fast_zero(&self) -> bool {
        true
    }

    fn read(&self, offset_bytes: u64, len_bytes: u32) -> BoxFuture<'_, Result<IoBuf, ExportError>> {
        Box::pin(async move { self.volume.read(offset_bytes, len_bytes as usize).await.map_err(map_err) })
    }

    fn write(&self, offset_bytes: u64, data: IoBytes, fua: bool) -> BoxFuture<'_, Result<(), ExportError>> {
        Box::pin(async move { self.volume.write(offset_bytes, data, fua).await.map_err(map_err) })
    }

    fn write_zeroes(
        &self,
        offset_bytes: u64,
        len_bytes: u32,
        may_trim: bool,
        fua: bool,
    ) -> BoxFuture<'_, Result<(), ExportError>> {
        // Zeroing by unmapping reads back as zeros on every layout, so NO_HOLE (may_trim false)
        // needs nothing different: data that must stay allocated is written as zeros anyway
        // where unmapping is not possible.
        let _ = may_trim;
        Box::pin(async move {
            self.volume.write_zeroes(offset_bytes, u64::from(len_bytes), fua, false).await.map_err(map_err)
        })
    }

    fn trim(&self, offset_bytes: u64, len_bytes: u32, fua: bool) -> BoxFuture<'_, Result<(), ExportError>> {
        Box::pin(async move {
            self.volume.trim(offset_bytes, u64::from(len_bytes)).await.map_err(map_err)?;
            if fua {
                self.volume.flush().await.map_err(map_err)?;
            }
            Ok(())
        })
    }

    fn flush(&self) -> BoxFuture<'_, Result<(), ExportError>> {
        Box::pin(async move { self.volume.flush().await.map_err(map_err) })
    }

    fn cache(&self, offset_bytes: u64, len_bytes: u32) -> BoxFuture<'_, Result<(), ExportError>> {
        // There is no cache to warm below the engine (drives are read directly): validate only.
        Box::pin(async move {
            match offset_bytes.checked_add(u64::from(len_bytes)) {
                Some(end) if end <= self.volume.size_bytes() => Ok(()),
                _ => Err(ExportError::InvalidArgument("cache request beyond the end".into())),
            }
        })
    }

    fn block_status(
        &self,
        offset_bytes: u64,
        len_bytes: u32,
    ) -> BoxFuture<'_, Result<Vec<Extent>, ExportError>> {
        Box::pin(async move {
            let extents = self.volume.block_status(offset_bytes, u64::from(len_bytes)).map_err(map_err)?;
            let mut out = Vec::with_capacity(extents.len());
            for e in extents {
                let mut left = e.len_bytes;
                while left > 0 {
                    let n = left.min(EXTENT_MAX_BYTES);
                    out.push(Extent {
                        len_bytes: u32::try_from(n).expect("bounded"),
                        hole: e.unallocated,
                        zero: e.unallocated,
                    });
                    left -= n;
                }
            }
            Ok(out)
        })
    }
}
