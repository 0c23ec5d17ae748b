//! Engine volumes as NBD exports.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::RwLock;

use stria_dev::{BLOCK_BYTES, IoBuf, IoBytes};
use stria_engine::{BlockVolume, Dealloc, Durability, ErrorKind, VolumeError, VolumeInfo, ZeroCost, Zeroing};
use stria_nbd::{BoxFuture, Export, ExportError, ExportRegistry, Extent, NamedExport};

use crate::stats::{Op, VolumeStats, VolumeStatsSnapshot};

/// Largest extent one NBD block-status entry can describe.
/// Most bytes one NBD block-status request looks at (it answers for a prefix of the range).
const BLOCK_STATUS_MAX_BYTES: u64 = 64 << 20;
const EXTENT_MAX_BYTES: u64 = u32::MAX as u64 / BLOCK_BYTES * BLOCK_BYTES;

/// A volume of any kind served over NBD: the export speaks the volume contract only. Each
/// connection that looks the volume up gets one of its own, counted in the volume's client
/// count for as long as the connection holds it.
pub(crate) struct VolumeExport {
    volume: Arc<dyn BlockVolume>,
    /// Fixed for the volume's life (name, layout, preferred I/O size).
    info: VolumeInfo,
    clients: Arc<AtomicUsize>,
    /// What this export's clients see (shared by every connection to it).
    stats: Arc<VolumeStats>,
}

impl VolumeExport {
    fn new(exported: &Exported) -> VolumeExport {
        let info = exported.volume.info();
        exported.clients.fetch_add(1, Ordering::Relaxed);
        VolumeExport {
            volume: Arc::clone(&exported.volume),
            info,
            clients: Arc::clone(&exported.clients),
            stats: Arc::clone(&exported.stats),
        }
    }
}

impl Drop for VolumeExport {
    fn drop(&mut self) {
        self.clients.fetch_sub(1, Ordering::Relaxed);
    }
}

/// An exported volume, how many connections hold it, and what they see.
struct Exported {
    volume: Arc<dyn BlockVolume>,
    clients: Arc<AtomicUsize>,
    stats: Arc<VolumeStats>,
}

/// The daemon's exports: one per client-visible volume, with how many connections hold each.
#[derive(Default)]
pub(crate) struct VolumeRegistry {
    volumes: RwLock<BTreeMap<String, Exported>>,
}

impl VolumeRegistry {
    /// Exports `volume` as `name` (replacing an export of that name).
    pub(crate) fn insert(&self, name: &str, volume: Arc<dyn BlockVolume>) {
        let exported = Exported { volume, clients: Arc::default(), stats: Arc::default() };
        self.volumes.write().insert(name.to_string(), exported);
    }

    /// Stops exporting `name`; connections that hold it keep it until they close.
    pub(crate) fn remove(&self, name: &str) {
        self.volumes.write().remove(name);
    }

    pub(crate) fn contains(&self, name: &str) -> bool {
        self.volumes.read().contains_key(name)
    }

    /// Connections that have `name` open (or are asking about it in their handshake).
    pub(crate) fn clients(&self, name: &str) -> usize {
        self.volumes.read().get(name).map_or(0, |e| e.clients.load(Ordering::Relaxed))
    }

    /// Every export's request counters, by name.
    pub(crate) fn stats(&self) -> Vec<VolumeStatsSnapshot> {
        self.volumes.read().iter().map(|(name, e)| e.stats.snapshot(name)).collect()
    }
}

impl ExportRegistry for VolumeRegistry {
    /// The volume `name`; the empty name means the only volume when there is exactly one.
    fn lookup(&self, name: &str) -> Option<NamedExport> {
        let map = self.volumes.read();
        let (name, exported) = match map.get_key_value(name) {
            Some(found) => found,
            None if name.is_empty() && map.len() == 1 => map.iter().next()?,
            None => return None,
        };
        let export = Arc::new(VolumeExport::new(exported));
        Some(NamedExport { name: name.clone(), export })
    }

    fn names(&self) -> Vec<String> {
        self.volumes.read().keys().cloned().collect()
    }
}

/// The NBD answer to a volume error, by its kind (the one mapping of error kinds to NBD).
/// A full thin volume and writes suspended for a full host filesystem answer `ENOSPC` (qemu's
/// `werror=enospc` pauses the guest until space is freed, instead of reporting a media error); a
/// snapshot answers `EPERM`.
fn map_err(e: VolumeError) -> ExportError {
    let (offset_bytes, len_bytes) = match &e {
        VolumeError::OutOfRange { offset_bytes, len_bytes, .. }
        | VolumeError::Unrecoverable { offset_bytes, len_bytes, .. }
        | VolumeError::NotCheap { offset_bytes, len_bytes }
        | VolumeError::NoSpace { offset_bytes, len_bytes, .. } => (*offset_bytes, *len_bytes),
        _ => (0, 0),
    };
    match e.kind() {
        ErrorKind::OutOfRange | ErrorKind::InvalidInput => {
            ExportError::InvalidArgument(format!("request at {offset_bytes} is beyond the end of the volume"))
        }
        ErrorKind::NotCheap => ExportError::NotSupported("zeroing this range is not cheap".into()),
        ErrorKind::Closed => ExportError::ShuttingDown,
        ErrorKind::ReadOnly => ExportError::ReadOnly,
        ErrorKind::NoSpace | ErrorKind::Suspended => ExportError::NoSpace { offset_bytes },
        ErrorKind::Unrecoverable
        | ErrorKind::Io
        | ErrorKind::NotFound
        | ErrorKind::Conflict
        | ErrorKind::Unavailable => ExportError::Io { offset_bytes, len_bytes, reason: e.to_string() },
    }
}

impl Export for VolumeExport {
    fn size_bytes(&self) -> u64 {
        self.volume.size_bytes()
    }

    fn read_only(&self) -> bool {
        self.info.read_only
    }

    fn description(&self) -> Option<String> {
        Some(format!("stria volume {} ({})", self.info.name, self.info.layout))
    }

    fn preferred_block_bytes(&self) -> u32 {
        // A whole chunk: what one drive gets before the next (the stripe height).
        u32::try_from(self.info.preferred_block_bytes).unwrap_or(4096).max(4096)
    }

    fn can_fast_zero(&self) -> bool {
        true
    }

    fn read(&self, offset_bytes: u64, len_bytes: u32) -> BoxFuture<'_, Result<IoBuf, ExportError>> {
        let read = self.volume.read(offset_bytes, len_bytes as usize);
        Box::pin(async move { self.stats.count(Op::Read, u64::from(len_bytes), read).await.map_err(map_err) })
    }

    fn write(&self, offset_bytes: u64, data: IoBytes, fua: bool) -> BoxFuture<'_, Result<(), ExportError>> {
        let len = data.len() as u64;
        let write = self.volume.write(offset_bytes, data, Durability::from_fua(fua));
        Box::pin(async move { self.stats.count(Op::Write, len, write).await.map_err(map_err) })
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
        let len = u64::from(len_bytes);
        let zero = self.volume.write_zeroes(offset_bytes, len, zeroing, Durability::from_fua(fua));
        Box::pin(async move { self.stats.count(Op::Zero, len, zero).await.map_err(map_err) })
    }

    fn trim(&self, offset_bytes: u64, len_bytes: u32, fua: bool) -> BoxFuture<'_, Result<(), ExportError>> {
        let len = u64::from(len_bytes);
        let trim = self.volume.discard(offset_bytes, len, Durability::from_fua(fua));
        Box::pin(async move { self.stats.count(Op::Trim, len, trim).await.map_err(map_err) })
    }

    fn flush(&self) -> BoxFuture<'_, Result<(), ExportError>> {
        Box::pin(async move { self.stats.count(Op::Flush, 0, self.volume.flush()).await.map_err(map_err) })
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
            // A prefix of a long range: the client asks again for the rest. It starts at 1 MiB
            // and grows while the answer is one extent: looking at the whole range every time
            // made a fragmented map cost a quadratic scan (a 1 GiB `qemu-img compare` of a
            // volume rolled back to a snapshot ran for minutes).
            let wanted = u64::from(len_bytes).min(BLOCK_STATUS_MAX_BYTES);
            let mut len = wanted.min(1 << 20);
            let extents = loop {
                let extents = self.volume.block_status(offset_bytes, len).await.map_err(map_err)?;
                if extents.len() > 1 || len == wanted {
                    break extents;
                }
                len = (len * 8).min(wanted);
            };
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
