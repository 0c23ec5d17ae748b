//! The port the NBD server serves: [`Export`] (one block device) and [`ExportRegistry`] (exports by
//! name). The stria daemon implements both for its volumes; [`crate::MemExport`] and
//! [`ExportMap`] are the in-memory versions used by tests and the example server.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, RwLock};

use stria_dev::{IoBuf, IoBytes};

use crate::proto::{Errno, MAX_STRING_BYTES};

/// A boxed, sendable future borrowed from the export for `'a`.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Why an export operation failed. Each variant maps to one NBD error value ([`Self::errno`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExportError {
    /// I/O error at offset {offset_bytes} (+{len_bytes} bytes): {reason}
    #[error("I/O error at offset {offset_bytes} (+{len_bytes} bytes): {reason}")]
    Io {
        /// Start of the failed range.
        offset_bytes: u64,
        /// Length of the failed range.
        len_bytes: u64,
        /// What went wrong, for the client's user and the log.
        reason: String,
    },
    /// No space left to write at offset {offset_bytes}
    #[error("no space left to write at offset {offset_bytes}")]
    NoSpace {
        /// Where the write needed space.
        offset_bytes: u64,
    },
    /// Invalid request: {0}
    #[error("invalid request: {0}")]
    InvalidArgument(String),
    /// The export is read-only
    #[error("the export is read-only")]
    ReadOnly,
    /// Not supported: {0}
    #[error("not supported: {0}")]
    NotSupported(String),
    /// The export is shutting down
    #[error("the export is shutting down")]
    ShuttingDown,
}

impl ExportError {
    /// The NBD error value sent to the client.
    pub fn errno(&self) -> Errno {
        match self {
            ExportError::Io { .. } => Errno::Io,
            ExportError::NoSpace { .. } => Errno::NoSpc,
            ExportError::InvalidArgument(_) => Errno::Inval,
            ExportError::ReadOnly => Errno::Perm,
            ExportError::NotSupported(_) => Errno::NotSup,
            ExportError::ShuttingDown => Errno::Shutdown,
        }
    }
}

/// One run of bytes with the same allocation status (`base:allocation`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    /// Length of the run; never zero.
    pub len_bytes: u32,
    /// Not allocated in the backing store (`NBD_STATE_HOLE`).
    pub hole: bool,
    /// Known to read as zeroes (`NBD_STATE_ZERO`).
    pub zero: bool,
}

impl Extent {
    /// The `base:allocation` status flags of this extent.
    pub fn flags(&self) -> u32 {
        (if self.hole { crate::proto::STATE_HOLE } else { 0 })
            | (if self.zero { crate::proto::STATE_ZERO } else { 0 })
    }
}

/// One block device served over NBD.
///
/// # Contract
///
/// - **Ranges are checked by the server.** Every call has `len_bytes > 0` and
///   `offset_bytes + len_bytes <= size_bytes()`; offsets and lengths need not be aligned (the
///   server advertises a minimum block size of 1), so the export does read-modify-write itself.
///   Write-like calls are never made on an export whose [`Export::read_only`] is true.
/// - **Concurrency.** Many calls may be in flight at once, from one connection or from several;
///   completion order is free. A read that overlaps an in-flight write may see either version.
/// - **Multi-connection flush (`NBD_FLAG_CAN_MULTI_CONN` is always advertised).** When
///   [`Export::flush`] completes, every write, zero and trim that *completed* before it was called
///   — on any connection to this export — must be durable. A write with `fua` must be durable
///   (and visible to all connections) when it completes. An export with a per-connection cache
///   would break this; it must share its cache between connections or write through.
/// - **Cancellation.** The server polls every future it started to completion, even when the
///   client has gone away, so an export never sees a half-finished operation dropped.
/// - **Errors.** Return an [`ExportError`] whose [`ExportError::errno`] says what the client
///   should see: an I/O failure the export could not mask (by retrying or using redundancy) is
///   [`ExportError::Io`].
pub trait Export: Send + Sync + 'static {
    /// Size of the export in bytes. Must not change while a connection is open.
    fn size_bytes(&self) -> u64;
    /// True when writes must be refused.
    fn read_only(&self) -> bool;
    /// A human-readable description for `NBD_INFO_DESCRIPTION` and `NBD_OPT_LIST`.
    fn description(&self) -> Option<String>;
    /// The size at which aligned I/O avoids read-modify-write (for example the volume's chunk
    /// size). The server rounds it to a power of two between 512 bytes and the request limit.
    fn preferred_block_bytes(&self) -> u32;
    /// True when zeroing is cheap (metadata only); `FAST_ZERO` requests fail with `ENOTSUP`
    /// otherwise, without calling the export.
    fn can_fast_zero(&self) -> bool;
    /// Reads `len_bytes` at `offset_bytes`. The returned buffer must be exactly `len_bytes` long.
    fn read(&self, offset_bytes: u64, len_bytes: u32) -> BoxFuture<'_, Result<IoBuf, ExportError>>;
    /// Writes `data` at `offset_bytes`; with `fua`, durable before completing.
    fn write(&self, offset_bytes: u64, data: IoBytes, fua: bool) -> BoxFuture<'_, Result<(), ExportError>>;
    /// Makes the range read as zeroes. With `may_trim` the export may deallocate it; without, it
    /// must stay allocated (`NBD_CMD_FLAG_NO_HOLE`).
    fn write_zeroes(
        &self,
        offset_bytes: u64,
        len_bytes: u32,
        may_trim: bool,
        fua: bool,
    ) -> BoxFuture<'_, Result<(), ExportError>>;
    /// Hint that the range is no longer needed; the export may deallocate all, part or none of it.
    fn trim(&self, offset_bytes: u64, len_bytes: u32, fua: bool) -> BoxFuture<'_, Result<(), ExportError>>;
    /// Makes every completed write durable (see the multi-connection rule above).
    fn flush(&self) -> BoxFuture<'_, Result<(), ExportError>>;
    /// Hint that the range will be read soon. May do nothing.
    fn cache(&self, offset_bytes: u64, len_bytes: u32) -> BoxFuture<'_, Result<(), ExportError>>;
    /// Allocation status of the range, as consecutive extents starting at `offset_bytes`. May
    /// cover only a prefix of the range (the client asks again for the rest), must cover at least
    /// one byte; extents past the range are clipped by the server.
    fn block_status(
        &self,
        offset_bytes: u64,
        len_bytes: u32,
    ) -> BoxFuture<'_, Result<Vec<Extent>, ExportError>>;
}

/// An export together with its canonical name.
#[derive(Clone)]
pub struct NamedExport {
    /// Canonical name (what `NBD_OPT_LIST` shows).
    pub name: String,
    /// The export.
    pub export: Arc<dyn Export>,
}

impl std::fmt::Debug for NamedExport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NamedExport")
            .field("name", &self.name)
            .field("size_bytes", &self.export.size_bytes())
            .finish()
    }
}

/// The exports a server offers, by name. Exports may be added and removed while serving; a
/// connection keeps the export it opened until it disconnects.
pub trait ExportRegistry: Send + Sync + 'static {
    /// Finds an export. The empty name asks for the default export; the registry decides what
    /// that is (or that there is none).
    fn lookup(&self, name: &str) -> Option<NamedExport>;
    /// Canonical names of all exports, in a stable order, for `NBD_OPT_LIST`.
    fn names(&self) -> Vec<String>;
}

/// Why an export could not be registered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    /// Export name is longer than 4096 bytes or contains NUL
    #[error("export name is longer than 4096 bytes or contains NUL")]
    BadName,
}

/// A registry in a `RwLock<HashMap>`.
///
/// The default export (empty name) is the export registered under `""` if there is one, otherwise
/// the only export if there is exactly one; with several exports and none named `""` the default
/// is refused (the client sees `NBD_REP_ERR_UNKNOWN` and must name one).
#[derive(Default)]
pub struct ExportMap {
    exports: RwLock<HashMap<String, Arc<dyn Export>>>,
}

impl std::fmt::Debug for ExportMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExportMap").field("names", &self.names()).finish()
    }
}

impl ExportMap {
    /// An empty registry.
    pub fn new() -> ExportMap {
        ExportMap::default()
    }

    /// Adds or replaces an export; returns the export it replaced.
    pub fn insert(
        &self,
        name: &str,
        export: Arc<dyn Export>,
    ) -> Result<Option<Arc<dyn Export>>, RegistryError> {
        if name.len() > MAX_STRING_BYTES || name.contains('\0') {
            return Err(RegistryError::BadName);
        }
        let mut map = self.exports.write().unwrap_or_else(|poisoned| poisoned.into_inner());
        Ok(map.insert(name.to_owned(), export))
    }

    /// Removes an export; open connections keep serving it until they disconnect.
    pub fn remove(&self, name: &str) -> Option<Arc<dyn Export>> {
        let mut map = self.exports.write().unwrap_or_else(|poisoned| poisoned.into_inner());
        map.remove(name)
    }
}

impl ExportRegistry for ExportMap {
    fn lookup(&self, name: &str) -> Option<NamedExport> {
        let map = self.exports.read().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(export) = map.get(name) {
            return Some(NamedExport { name: name.to_owned(), export: Arc::clone(export) });
        }
        if name.is_empty() && map.len() == 1 {
            let (only_name, export) = map.iter().next()?;
            return Some(NamedExport { name: only_name.clone(), export: Arc::clone(export) });
        }
        None
    }

    fn names(&self) -> Vec<String> {
        let map = self.exports.read().unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut names: Vec<String> = map.keys().cloned().collect();
        names.sort();
        names
    }
}
