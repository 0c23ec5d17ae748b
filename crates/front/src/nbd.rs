//! The NBD adapter: a served volume is an `stria_nbd::Export` ([`NbdExport`], one per
//! connection that looks it up, so each counts as a client), and the [`Registry`] is the NBD
//! server's `ExportRegistry`. Everything but the protocol's own shapes (its error values, its
//! 32-bit extents, its cache hint) is the registry's and the attachment's.

use std::sync::Arc;

use stria_dev::{BLOCK_BYTES, IoBuf, IoBytes};
use stria_nbd::{BoxFuture, Errno, Export, ExportError, ExportRegistry, Extent, NamedExport};
use stria_volume::{Dealloc, Durability, VolumeError, ZeroCost, Zeroing};

use crate::errors::nbd_errno;
use crate::registry::{Attachment, Registry};
use crate::status;

/// Largest extent one NBD block-status entry can describe (its length is 32 bits), in whole
/// blocks.
const EXTENT_MAX_BYTES: u64 = u32::MAX as u64 / BLOCK_BYTES * BLOCK_BYTES;

/// A volume served over NBD to one connection: the export speaks the volume contract only.
#[derive(Debug)]
pub struct NbdExport(Attachment);

impl NbdExport {
    /// Serves `attachment` over NBD.
    pub fn new(attachment: Attachment) -> NbdExport {
        NbdExport(attachment)
    }
}

impl ExportRegistry for Registry {
    /// The volume `name`; the empty name means the only volume when there is exactly one.
    fn lookup(&self, name: &str) -> Option<NamedExport> {
        let attachment = self.attach(name)?;
        Some(NamedExport { name: attachment.name().to_string(), export: Arc::new(NbdExport(attachment)) })
    }

    fn names(&self) -> Vec<String> {
        Registry::names(self)
    }
}

/// The NBD answer to a volume error: the error value of its kind ([`nbd_errno`], the one
/// mapping), carried by the `ExportError` variant that sends it.
pub fn export_error(e: VolumeError) -> ExportError {
    let (offset_bytes, len_bytes) = match &e {
        VolumeError::OutOfRange { offset_bytes, len_bytes, .. }
        | VolumeError::Unrecoverable { offset_bytes, len_bytes, .. }
        | VolumeError::NotCheap { offset_bytes, len_bytes }
        | VolumeError::NoSpace { offset_bytes, len_bytes, .. }
        | VolumeError::InvalidRequest { offset_bytes, len_bytes, .. }
        | VolumeError::Miscompare { offset_bytes, len_bytes, .. } => (*offset_bytes, *len_bytes),
        _ => (0, 0),
    };
    match nbd_errno(e.kind()) {
        Errno::Inval => {
            ExportError::InvalidArgument(format!("request at {offset_bytes} is beyond the end of the volume"))
        }
        Errno::NotSup => ExportError::NotSupported("zeroing this range is not cheap".into()),
        Errno::Shutdown => ExportError::ShuttingDown,
        Errno::Perm => ExportError::ReadOnly,
        Errno::NoSpc => ExportError::NoSpace { offset_bytes },
        // The table gives no kind `ENOMEM` or `EOVERFLOW` (the server's own answers).
        Errno::Io | Errno::NoMem | Errno::Overflow => {
            ExportError::Io { offset_bytes, len_bytes, reason: e.to_string() }
        }
    }
}

impl Export for NbdExport {
    fn size_bytes(&self) -> u64 {
        self.0.size_bytes()
    }

    fn read_only(&self) -> bool {
        self.0.info().read_only
    }

    fn description(&self) -> Option<String> {
        let info = self.0.info();
        Some(format!("stria volume {} ({})", info.name, info.layout))
    }

    fn preferred_block_bytes(&self) -> u32 {
        // A whole chunk: what one drive gets before the next (the stripe height).
        u32::try_from(self.0.info().preferred_block_bytes).unwrap_or(4096).max(4096)
    }

    fn can_fast_zero(&self) -> bool {
        true
    }

    fn read(&self, offset_bytes: u64, len_bytes: u32) -> BoxFuture<'_, Result<IoBuf, ExportError>> {
        let read = self.0.read(offset_bytes, len_bytes as usize);
        Box::pin(async move { read.await.map_err(export_error) })
    }

    fn write(&self, offset_bytes: u64, data: IoBytes, fua: bool) -> BoxFuture<'_, Result<(), ExportError>> {
        let write = self.0.write(offset_bytes, data, Durability::from_fua(fua));
        Box::pin(async move { write.await.map_err(export_error) })
    }

    fn write_zeroes(
        &self,
        offset_bytes: u64,
        len_bytes: u32,
        may_trim: bool,
        fua: bool,
    ) -> BoxFuture<'_, Result<(), ExportError>> {
        // NBD_CMD_FLAG_FAST_ZERO never reaches an export (`can_fast_zero` is true and the
        // server passes no such flag), so zeroing may always cost what it costs. NO_HOLE is
        // passed on as `Dealloc::Forbidden`, which the volumes do not honour yet: unmapped
        // blocks read back as zeros, which is what a client can observe.
        let zeroing = Zeroing {
            dealloc: if may_trim { Dealloc::Allowed } else { Dealloc::Forbidden },
            cost: ZeroCost::Any,
        };
        let zero =
            self.0.write_zeroes(offset_bytes, u64::from(len_bytes), zeroing, Durability::from_fua(fua));
        Box::pin(async move { zero.await.map_err(export_error) })
    }

    fn trim(&self, offset_bytes: u64, len_bytes: u32, fua: bool) -> BoxFuture<'_, Result<(), ExportError>> {
        let trim = self.0.discard(offset_bytes, u64::from(len_bytes), Durability::from_fua(fua));
        Box::pin(async move { trim.await.map_err(export_error) })
    }

    fn flush(&self) -> BoxFuture<'_, Result<(), ExportError>> {
        let flush = self.0.flush();
        Box::pin(async move { flush.await.map_err(export_error) })
    }

    fn cache(&self, offset_bytes: u64, len_bytes: u32) -> BoxFuture<'_, Result<(), ExportError>> {
        // There is no cache to warm below the engine (drives are read directly): validate only.
        Box::pin(async move {
            match offset_bytes.checked_add(u64::from(len_bytes)) {
                Some(end) if end <= self.0.size_bytes() => Ok(()),
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
            let extents =
                self.0.block_status(offset_bytes, u64::from(len_bytes)).await.map_err(export_error)?;
            let out = status::split(extents, EXTENT_MAX_BYTES)
                .map(|e| Extent {
                    len_bytes: u32::try_from(e.len_bytes).expect("split to at most u32::MAX bytes"),
                    hole: e.unallocated,
                    zero: e.unallocated,
                })
                .collect();
            Ok(out)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::MapVolume;
    use stria_volume::{ErrorKind, PoolFailure};

    #[derive(Debug)]
    struct Refused(ErrorKind);

    impl std::fmt::Display for Refused {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "refused ({:?})", self.0)
        }
    }

    impl std::error::Error for Refused {}

    impl PoolFailure for Refused {
        fn kind(&self) -> ErrorKind {
            self.0
        }
    }

    #[test]
    fn every_kind_reaches_the_client_as_its_errno() {
        for kind in ErrorKind::ALL {
            let e = VolumeError::Pool { volume: "v".into(), source: Box::new(Refused(kind)) };
            assert_eq!(export_error(e).errno(), nbd_errno(kind), "{kind:?}");
        }
        let full = VolumeError::NoSpace {
            volume: "v".into(),
            offset_bytes: 8192,
            len_bytes: 4096,
            why: "full".into(),
        };
        assert_eq!(export_error(full), ExportError::NoSpace { offset_bytes: 8192 });
        let lost = VolumeError::Unrecoverable {
            volume: "v".into(),
            offset_bytes: 4096,
            len_bytes: 512,
            reason: "two members lost".into(),
        };
        assert!(matches!(export_error(lost), ExportError::Io { offset_bytes: 4096, len_bytes: 512, .. }));
        assert_eq!(export_error(VolumeError::ReadOnly { volume: "v".into() }), ExportError::ReadOnly);
    }

    #[tokio::test]
    async fn an_export_is_a_client_of_its_volume_and_cuts_long_extents() {
        let registry = Arc::new(Registry::new());
        let size_bytes = 3 * EXTENT_MAX_BYTES;
        registry.insert("v", Arc::new(MapVolume::new(size_bytes, &[])));
        let found = ExportRegistry::lookup(&*registry, "").expect("the only volume");
        assert_eq!(found.name, "v");
        assert_eq!(registry.clients("v"), 1);
        assert_eq!(ExportRegistry::names(&*registry), ["v"]);
        let export = &found.export;
        assert_eq!(
            (export.size_bytes(), export.read_only(), export.preferred_block_bytes()),
            (size_bytes, false, 4096)
        );
        assert_eq!(export.description().as_deref(), Some("stria volume map (test)"));
        let extents = export.block_status(0, u32::MAX).await.expect("status");
        // One look of 64 MiB (the prefix limit), one extent, under the entry limit.
        assert_eq!(extents, [Extent { len_bytes: 64 << 20, hole: true, zero: true }]);
        export.write(0, IoBytes::zeroed(4096), true).await.expect("write");
        assert!(export.cache(size_bytes - 4096, 4096).await.is_ok());
        assert!(export.cache(size_bytes - 4096, 4097).await.is_err());
        assert_eq!(registry.stats()[0].write.count, 1);
        drop(found);
        assert_eq!(registry.clients("v"), 0);
    }
}
