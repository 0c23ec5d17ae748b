//! [`BlockVolume`] for log-structured volumes: every acknowledged write, zeroing and discard is
//! already durable (cache blocks and map deltas are written with FUA before the acknowledgement),
//! so [`Durability`] changes nothing here. A compare and write holds the range locks of its
//! range exclusively (`log::ranges`); a snapshot refuses it like any change.

use stria_dev::{BlockDevice, IoBuf, IoBytes};
use stria_engine::{BlockVolume, Durability, Extent, VolumeFuture, VolumeInfo, Zeroing};

impl<D: BlockDevice> BlockVolume for crate::log::LogVolume<D> {
    fn info(&self) -> VolumeInfo {
        VolumeInfo {
            name: self.name().to_string(),
            layout: self.layout(),
            preferred_block_bytes: stria_dev::BLOCK_BYTES,
            read_only: false,
        }
    }

    fn size_bytes(&self) -> u64 {
        crate::log::LogVolume::size_bytes(self)
    }

    fn read(&self, offset_bytes: u64, len_bytes: usize) -> VolumeFuture<'_, IoBuf> {
        Box::pin(crate::log::LogVolume::read(self, offset_bytes, len_bytes))
    }

    fn write(&self, offset_bytes: u64, data: IoBytes, durability: Durability) -> VolumeFuture<'_, ()> {
        Box::pin(crate::log::LogVolume::write(self, offset_bytes, data, durability.is_fua()))
    }

    fn compare_and_write(
        &self,
        offset_bytes: u64,
        compare: IoBytes,
        write: IoBytes,
        _durability: Durability,
    ) -> VolumeFuture<'_, ()> {
        Box::pin(crate::log::LogVolume::compare_and_write(self, offset_bytes, compare, write))
    }

    fn write_zeroes(
        &self,
        offset_bytes: u64,
        len_bytes: u64,
        zeroing: Zeroing,
        _durability: Durability,
    ) -> VolumeFuture<'_, ()> {
        Box::pin(crate::log::LogVolume::write_zeroes(self, offset_bytes, len_bytes, zeroing.cheap_only()))
    }

    fn discard(&self, offset_bytes: u64, len_bytes: u64, _durability: Durability) -> VolumeFuture<'_, ()> {
        Box::pin(crate::log::LogVolume::trim(self, offset_bytes, len_bytes))
    }

    fn flush(&self) -> VolumeFuture<'_, ()> {
        Box::pin(crate::log::LogVolume::flush(self))
    }

    fn block_status(&self, offset_bytes: u64, len_bytes: u64) -> VolumeFuture<'_, Vec<Extent>> {
        Box::pin(crate::log::LogVolume::block_status(self, offset_bytes, len_bytes))
    }
}

/// A snapshot of a log-structured volume behind the volume contract: reads see the volume as it
/// was when the snapshot was made; writes, zeroing and discards are refused (it is exported
/// read-only, so NBD clients get `EPERM` before asking).
#[derive(Debug)]
pub struct SnapshotVolume<D: BlockDevice> {
    volume: std::sync::Arc<crate::log::LogVolume<D>>,
    layer: u16,
    /// `VOL@SNAP`.
    name: String,
}

impl<D: BlockDevice> SnapshotVolume<D> {
    /// Snapshot `layer` (named `snap`) of `volume`.
    pub fn new(
        volume: std::sync::Arc<crate::log::LogVolume<D>>,
        layer: u16,
        snap: &str,
    ) -> SnapshotVolume<D> {
        let name = format!("{}@{snap}", volume.name());
        SnapshotVolume { volume, layer, name }
    }

    /// Why a change is refused: out of range (contract, "Ranges": every call checks its range
    /// first), closed (the snapshot was deleted), else read-only.
    fn refused(&self, offset_bytes: u64, len_bytes: u64) -> stria_engine::VolumeError {
        if let Err(e) = stria_engine::volume::bytes::check_range(offset_bytes, len_bytes, self.size_bytes()) {
            return e;
        }
        if self.gone() {
            return stria_engine::VolumeError::Closed(self.name.clone());
        }
        stria_engine::VolumeError::ReadOnly { volume: self.name.clone() }
    }

    /// Snapshot `layer` (named `snap`) of clone `clone` of `volume`'s family (`CLONE@SNAP`).
    pub fn of_clone(
        volume: std::sync::Arc<crate::log::LogVolume<D>>,
        layer: u16,
        clone: &str,
        snap: &str,
    ) -> SnapshotVolume<D> {
        SnapshotVolume { volume, layer, name: format!("{clone}@{snap}") }
    }

    /// The snapshot was deleted (a handle outlived it).
    fn gone(&self) -> bool {
        !self.volume.snapshot_shown(self.layer)
    }
}

/// `result`, with an error reported as [`stria_engine::VolumeError::Closed`] when the layer is
/// gone (deleted while a handle to it was kept): a deleted snapshot or clone is closed, not
/// damaged. Checked only after an error, so requests that succeed pay nothing.
fn closed_if_gone<T>(
    result: Result<T, stria_engine::VolumeError>,
    gone: impl FnOnce() -> bool,
    name: &str,
) -> Result<T, stria_engine::VolumeError> {
    match result {
        Err(e) if !matches!(e, stria_engine::VolumeError::OutOfRange { .. }) && gone() => {
            Err(stria_engine::VolumeError::Closed(name.to_string()))
        }
        r => r,
    }
}

impl<D: BlockDevice> BlockVolume for SnapshotVolume<D> {
    fn info(&self) -> VolumeInfo {
        VolumeInfo {
            name: self.name.clone(),
            layout: format!("snapshot of {}", self.volume.layout()),
            preferred_block_bytes: stria_dev::BLOCK_BYTES,
            read_only: true,
        }
    }

    fn size_bytes(&self) -> u64 {
        self.volume.layer_bytes(self.layer)
    }

    fn read(&self, offset_bytes: u64, len_bytes: usize) -> VolumeFuture<'_, IoBuf> {
        Box::pin(async move {
            let r = self.volume.read_snapshot(self.layer, offset_bytes, len_bytes).await;
            closed_if_gone(r, || self.gone(), &self.name)
        })
    }

    fn write(&self, offset_bytes: u64, data: IoBytes, _durability: Durability) -> VolumeFuture<'_, ()> {
        let e = self.refused(offset_bytes, data.len() as u64);
        Box::pin(async move { Err(e) })
    }

    fn compare_and_write(
        &self,
        offset_bytes: u64,
        compare: IoBytes,
        write: IoBytes,
        _durability: Durability,
    ) -> VolumeFuture<'_, ()> {
        // A request of the wrong shape is refused as such on every kind, then as any change.
        let e = match stria_engine::volume::contract::check_compare_and_write(offset_bytes, &compare, &write)
        {
            Err(e) => e,
            Ok(()) => self.refused(offset_bytes, write.len() as u64),
        };
        Box::pin(async move { Err(e) })
    }

    fn write_zeroes(
        &self,
        offset_bytes: u64,
        len_bytes: u64,
        _zeroing: Zeroing,
        _durability: Durability,
    ) -> VolumeFuture<'_, ()> {
        let e = self.refused(offset_bytes, len_bytes);
        Box::pin(async move { Err(e) })
    }

    fn discard(&self, offset_bytes: u64, len_bytes: u64, _durability: Durability) -> VolumeFuture<'_, ()> {
        let e = self.refused(offset_bytes, len_bytes);
        Box::pin(async move { Err(e) })
    }

    fn flush(&self) -> VolumeFuture<'_, ()> {
        Box::pin(async { Ok(()) })
    }

    fn block_status(&self, offset_bytes: u64, len_bytes: u64) -> VolumeFuture<'_, Vec<Extent>> {
        // Everything reads as allocated ("allocated" when in doubt, as the contract allows).
        Box::pin(async move {
            stria_engine::volume::bytes::check_range(offset_bytes, len_bytes, self.size_bytes())?;
            if self.gone() {
                return Err(stria_engine::VolumeError::Closed(self.name.clone()));
            }
            Ok(if len_bytes == 0 { Vec::new() } else { vec![Extent { len_bytes, unallocated: false }] })
        })
    }
}

/// A clone of a snapshot of a log-structured volume behind the volume contract: an ordinary
/// writable volume (docs/design/snapshots.md, "Clone") that lives in its origin's family (its
/// cache, segment space and GC). Like the origin, every acknowledged write is durable already.
#[derive(Debug)]
pub struct CloneVolume<D: BlockDevice> {
    volume: std::sync::Arc<crate::log::LogVolume<D>>,
    layer: u16,
    name: String,
    /// `VOL@SNAP` it was made from.
    origin: String,
}

impl<D: BlockDevice> CloneVolume<D> {
    /// Clone `record` of `volume`.
    pub fn new(
        volume: std::sync::Arc<crate::log::LogVolume<D>>,
        record: &crate::layers::LayerRecord,
    ) -> Self {
        let parent = volume.parent_name(record.parent);
        let origin = format!("{}@{parent}", volume.name());
        CloneVolume { volume, layer: record.id, name: record.name.clone(), origin }
    }

    /// The clone was deleted (a handle outlived it).
    fn gone(&self) -> bool {
        !self.volume.clones().iter().any(|c| c.id == self.layer)
    }

    /// `result`, or `Closed` if it failed because the clone is gone.
    fn closed_if_gone<T>(
        &self,
        result: Result<T, stria_engine::VolumeError>,
    ) -> Result<T, stria_engine::VolumeError> {
        closed_if_gone(result, || self.gone(), &self.name)
    }
}

impl<D: BlockDevice> BlockVolume for CloneVolume<D> {
    fn info(&self) -> VolumeInfo {
        VolumeInfo {
            name: self.name.clone(),
            layout: format!("clone of {} ({})", self.origin, self.volume.layout()),
            preferred_block_bytes: stria_dev::BLOCK_BYTES,
            read_only: false,
        }
    }

    fn size_bytes(&self) -> u64 {
        self.volume.layer_bytes(self.layer)
    }

    fn read(&self, offset_bytes: u64, len_bytes: usize) -> VolumeFuture<'_, IoBuf> {
        Box::pin(async move {
            self.closed_if_gone(self.volume.read_snapshot(self.layer, offset_bytes, len_bytes).await)
        })
    }

    fn write(&self, offset_bytes: u64, data: IoBytes, _durability: Durability) -> VolumeFuture<'_, ()> {
        Box::pin(
            async move { self.closed_if_gone(self.volume.write_to(self.layer, offset_bytes, data).await) },
        )
    }

    fn compare_and_write(
        &self,
        offset_bytes: u64,
        compare: IoBytes,
        write: IoBytes,
        _durability: Durability,
    ) -> VolumeFuture<'_, ()> {
        Box::pin(async move {
            let r = self.volume.compare_and_write_to(self.layer, offset_bytes, compare, write).await;
            // The log volume names itself (the clone's origin): the clone's client is told its name.
            let r = r.map_err(|e| match e {
                stria_engine::VolumeError::Miscompare {
                    volume: _,
                    offset_bytes,
                    len_bytes,
                    miscompare_offset_bytes,
                } => stria_engine::VolumeError::Miscompare {
                    volume: self.name.clone(),
                    offset_bytes,
                    len_bytes,
                    miscompare_offset_bytes,
                },
                e => e,
            });
            self.closed_if_gone(r)
        })
    }

    fn write_zeroes(
        &self,
        offset_bytes: u64,
        len_bytes: u64,
        zeroing: Zeroing,
        _durability: Durability,
    ) -> VolumeFuture<'_, ()> {
        Box::pin(async move {
            let r =
                self.volume.write_zeroes_to(self.layer, offset_bytes, len_bytes, zeroing.cheap_only()).await;
            self.closed_if_gone(r)
        })
    }

    fn discard(&self, offset_bytes: u64, len_bytes: u64, _durability: Durability) -> VolumeFuture<'_, ()> {
        Box::pin(async move {
            self.closed_if_gone(self.volume.trim_in(self.layer, offset_bytes, len_bytes).await)
        })
    }

    fn flush(&self) -> VolumeFuture<'_, ()> {
        Box::pin(self.volume.flush())
    }

    fn block_status(&self, offset_bytes: u64, len_bytes: u64) -> VolumeFuture<'_, Vec<Extent>> {
        Box::pin(async move {
            self.closed_if_gone(self.volume.block_status_in(self.layer, offset_bytes, len_bytes).await)
        })
    }
}
