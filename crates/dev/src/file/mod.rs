//! A drive backed by a regular file or a block device, driven through io_uring (or, where
//! io_uring is unavailable, a bounded pool of threads doing blocking calls).
//!
//! See `docs/devices.md` for the design; the `engine` module has the threading details.

mod engine;
mod exclusive;
pub mod local;
mod op;
mod sys;
mod table;

use std::fs::{File, OpenOptions};
use std::future::Future;
use std::io;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::buf::{IoBuf, IoBytes};
use crate::counters::DevCounters;
use crate::device::{BLOCK_BYTES, BlockDevice, DevError, check_range};
use engine::Shared;
pub use exclusive::{DriveLock, Holder};
use op::OpFuture;
use table::{OpKind, Payload, Request};

/// Environment variable that picks the engine when [`IoEngine::Auto`] is asked for:
/// `uring` or `threads`.
pub const IO_ENGINE_ENV: &str = "STRIA_IO_ENGINE";

/// Default and largest number of requests in flight per drive (table slots, SQ entries).
pub const QUEUE_DEPTH_DEFAULT: u32 = 128;
pub const QUEUE_DEPTH_MAX: u32 = 4096;

/// Default and largest number of pool threads per drive (thread engine).
pub const IO_THREADS_DEFAULT: usize = 4;
pub const IO_THREADS_MAX: usize = 64;

/// How a file drive talks to the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IoEngine {
    /// `STRIA_IO_ENGINE` if set; else io_uring, except for files on tmpfs, where io_uring hands
    /// every request to a kernel worker (about 65 us per 4 KiB read here, against 1 us for
    /// `pread`): there the calls run inline. Falls back to threads if io_uring is refused.
    #[default]
    Auto,
    /// io_uring; falls back to threads (with a warning) if the kernel or sandbox refuses it.
    Uring,
    /// A bounded pool of threads doing `pread`/`pwrite`.
    Threads,
    /// Blocking calls on the submitting thread, for memory-backed files (tmpfs) only: there a
    /// call is a memory copy that never waits for a device, and handing it to another thread
    /// costs more (two context switches) than the copy itself.
    Inline,
}

/// How to open a file drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct FileOptions {
    pub engine: IoEngine,
    /// Requests in flight at most (1..=[`QUEUE_DEPTH_MAX`]); more wait for a free slot.
    pub queue_depth: u32,
    /// Pool threads for the thread engine (1..=[`IO_THREADS_MAX`]).
    pub io_threads: usize,
    /// Bypass the page cache (`O_DIRECT`); falls back to buffered I/O if the filesystem refuses.
    pub direct_io: bool,
}

impl Default for FileOptions {
    fn default() -> Self {
        FileOptions {
            engine: IoEngine::Auto,
            queue_depth: QUEUE_DEPTH_DEFAULT,
            io_threads: IO_THREADS_DEFAULT,
            direct_io: true,
        }
    }
}

/// Why a file drive could not be opened or created.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// A system call on the path failed.
    #[error("{path}: {op} failed: {source}")]
    Io {
        path: PathBuf,
        op: &'static str,
        #[source]
        source: io::Error,
    },
    /// Another process (or the kernel: a mount, device-mapper, md, swap) holds the drive; see
    /// [`DriveLock`].
    #[error("{path} is in use: {holder}")]
    Busy { path: PathBuf, holder: Holder },
    /// The path is neither a regular file nor a block device.
    #[error("{path}: not a regular file or block device")]
    NotAFileOrBlockDevice { path: PathBuf },
    /// The drive holds less than one block.
    #[error("{path}: {size_bytes} bytes is smaller than one {BLOCK_BYTES}-byte block")]
    TooSmall { path: PathBuf, size_bytes: u64 },
    /// An option is outside its allowed range.
    #[error("invalid file drive option: {0}")]
    InvalidOption(String),
}

/// A drive on a regular file or a block device.
#[derive(Debug)]
pub struct FileDevice {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    size_bytes: u64,
    engine: IoEngine,
    direct_io: bool,
    counters: DevCounters,
    /// This process's exclusive hold on the drive, for as long as the device lives.
    _hold: Arc<DriveLock>,
}

impl FileDevice {
    /// Opens an existing regular file or block device as a drive, held exclusively by this
    /// process for as long as the device lives (see [`DriveLock`]): fails with
    /// [`OpenError::Busy`], naming the holder, when another process holds it, or when a block
    /// device is mounted or used by the kernel.
    pub fn open(path: impl AsRef<Path>, opts: &FileOptions) -> Result<FileDevice, OpenError> {
        let path = path.as_ref();
        validate(opts)?;
        let hold = DriveLock::take(path)?;
        let (file, direct_io) = open_file(path, opts.direct_io)?;
        let io_err = |op, source| OpenError::Io { path: path.to_path_buf(), op, source };
        let meta = file.metadata().map_err(|e| io_err("stat", e))?;
        if !hold.covers(&meta) {
            return Err(io_err("open", io::Error::other("the path changed while it was being opened")));
        }
        let file_type = meta.file_type();
        let is_block_device = file_type.is_block_device();
        let raw_size_bytes = if is_block_device {
            sys::blk_size_bytes(&file).map_err(|e| io_err("ioctl(BLKGETSIZE64)", e))?
        } else if file_type.is_file() {
            meta.len()
        } else {
            return Err(OpenError::NotAFileOrBlockDevice { path: path.to_path_buf() });
        };
        let size_bytes = raw_size_bytes - raw_size_bytes % BLOCK_BYTES;
        if size_bytes == 0 {
            return Err(OpenError::TooSmall { path: path.to_path_buf(), size_bytes: raw_size_bytes });
        }
        let name: Arc<str> = Arc::from(path.to_string_lossy().as_ref());
        let on_tmpfs = !is_block_device && sys::is_on_tmpfs(&file);
        let inline = wants_inline(&name, opts, on_tmpfs);
        let ring = if inline { None } else { choose_ring(&name, opts, on_tmpfs) };
        let engine = match (&ring, inline) {
            (Some(_), _) => IoEngine::Uring,
            (None, true) => IoEngine::Inline,
            (None, false) => IoEngine::Threads,
        };
        // With a ring, pool threads only do block-device discards: one is enough. Inline, the
        // pool is idle; one thread is kept so that shutdown works the same way.
        let pool_threads = if ring.is_some() || inline { 1 } else { opts.io_threads };
        let shared = Arc::new(Shared::new(name, file, is_block_device, ring, inline, opts.queue_depth));
        let threads =
            engine::spawn_threads(&shared, pool_threads).map_err(|e| io_err("spawn I/O thread", e))?;
        Ok(FileDevice {
            shared,
            threads,
            size_bytes,
            engine,
            direct_io,
            counters: DevCounters::default(),
            _hold: hold,
        })
    }

    /// Creates a new sparse file of `size_bytes` (rounded down to whole blocks) and opens it
    /// with default options. Fails if the path exists.
    pub fn create(path: impl AsRef<Path>, size_bytes: u64) -> Result<FileDevice, OpenError> {
        FileDevice::create_with(path, size_bytes, &FileOptions::default())
    }

    /// [`FileDevice::create`] with explicit options.
    pub fn create_with(
        path: impl AsRef<Path>,
        size_bytes: u64,
        opts: &FileOptions,
    ) -> Result<FileDevice, OpenError> {
        let path = path.as_ref();
        let io_err = |op, source| OpenError::Io { path: path.to_path_buf(), op, source };
        let size_bytes = size_bytes - size_bytes % BLOCK_BYTES;
        if size_bytes == 0 {
            return Err(OpenError::TooSmall { path: path.to_path_buf(), size_bytes });
        }
        let file =
            OpenOptions::new().write(true).create_new(true).open(path).map_err(|e| io_err("create", e))?;
        // From here on the file is ours: a failure removes it, so that a retry does not meet a
        // half-made drive file (an empty one, when the size is more than the filesystem takes).
        let made = (|| {
            file.set_len(size_bytes).map_err(|e| io_err("ftruncate", e))?;
            file.sync_all().map_err(|e| io_err("fsync", e))?;
            drop(file);
            // Make the new directory entry durable too.
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                File::open(dir).and_then(|d| d.sync_all()).map_err(|e| io_err("fsync directory", e))?;
            }
            FileDevice::open(path, opts)
        })();
        if made.is_err() {
            let _ = std::fs::remove_file(path);
        }
        made
    }

    /// The engine actually in use ([`IoEngine::Uring`], [`IoEngine::Threads`] or
    /// [`IoEngine::Inline`]).
    pub fn engine(&self) -> IoEngine {
        self.engine
    }

    /// True when the drive was opened with `O_DIRECT`.
    pub fn direct_io(&self) -> bool {
        self.direct_io
    }

    /// True when the drive is a block device (not a regular file).
    pub fn is_block_device(&self) -> bool {
        self.shared.is_block_device
    }

    fn submit(&self, request: Request, payload: Payload) -> OpFuture<'_> {
        OpFuture::new(&self.shared, &self.counters, request, payload)
    }

    fn request(kind: OpKind, offset_bytes: u64, len_bytes: u64) -> Request {
        Request { kind, offset_bytes, len_bytes, done_bytes: 0, retries: 0 }
    }

    /// `O_DIRECT` needs buffer addresses aligned to the logical block size; views that are not
    /// (an `IoBuf` split at an odd offset) go through an aligned bounce buffer.
    fn needs_bounce(&self, aligned: bool) -> bool {
        self.direct_io && !aligned
    }
}

impl Drop for FileDevice {
    fn drop(&mut self) {
        // Calls of this drive in this thread's own ring finish only when this thread reaps them,
        // and the completion thread joined below waits for every call.
        local::drain_drive(&self.shared);
        self.shared.begin_shutdown();
        for handle in self.threads.drain(..) {
            if handle.join().is_err() {
                tracing::error!(device = %self.shared.name, "an I/O thread panicked");
            }
        }
    }
}

fn validate(opts: &FileOptions) -> Result<(), OpenError> {
    if !(1..=QUEUE_DEPTH_MAX).contains(&opts.queue_depth) {
        return Err(OpenError::InvalidOption(format!(
            "queue_depth {} is outside 1..={QUEUE_DEPTH_MAX}",
            opts.queue_depth
        )));
    }
    if !(1..=IO_THREADS_MAX).contains(&opts.io_threads) {
        return Err(OpenError::InvalidOption(format!(
            "io_threads {} is outside 1..={IO_THREADS_MAX}",
            opts.io_threads
        )));
    }
    Ok(())
}

/// Opens read-write with `O_CLOEXEC` (std's default) and `O_DIRECT` if asked; returns whether
/// `O_DIRECT` is in effect.
fn open_file(path: &Path, direct_io: bool) -> Result<(File, bool), OpenError> {
    let io_err = |source| OpenError::Io { path: path.to_path_buf(), op: "open", source };
    let mut options = OpenOptions::new();
    options.read(true).write(true).custom_flags(libc::O_CLOEXEC);
    if direct_io {
        match options.clone().custom_flags(libc::O_CLOEXEC | libc::O_DIRECT).open(path) {
            Ok(file) => return Ok((file, true)),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                tracing::warn!(
                    path = %path.display(),
                    "the filesystem refuses O_DIRECT; using buffered I/O (the page cache sits between stria and the drive)"
                );
            }
            Err(e) => return Err(io_err(e)),
        }
    }
    options.open(path).map(|f| (f, false)).map_err(io_err)
}

/// The engine asked for, after the environment override for [`IoEngine::Auto`].
fn requested_engine(opts: &FileOptions) -> IoEngine {
    if opts.engine != IoEngine::Auto {
        return opts.engine;
    }
    engine_from_env(std::env::var(IO_ENGINE_ENV).ok().as_deref())
}

/// What `STRIA_IO_ENGINE` selects for [`IoEngine::Auto`].
fn engine_from_env(value: Option<&str>) -> IoEngine {
    match value {
        Some("threads") => IoEngine::Threads,
        Some("uring") => IoEngine::Uring,
        Some("inline") => IoEngine::Inline,
        None | Some("auto" | "") => IoEngine::Auto,
        Some(other) => {
            tracing::warn!(
                "{IO_ENGINE_ENV}={other:?} is not one of uring, threads, inline, auto; ignoring it"
            );
            IoEngine::Auto
        }
    }
}

/// True when calls run on the submitting thread: asked for (or chosen by `Auto`) on tmpfs.
/// Anywhere else a call may wait for a device and would stall the caller's thread, so `Inline`
/// is refused there (with a warning) and the thread engine is used instead.
fn wants_inline(name: &str, opts: &FileOptions, on_tmpfs: bool) -> bool {
    match requested_engine(opts) {
        IoEngine::Auto => on_tmpfs,
        IoEngine::Inline if on_tmpfs => true,
        IoEngine::Inline => {
            tracing::warn!(device = name, "the inline engine is only for files on tmpfs; using threads");
            false
        }
        IoEngine::Uring | IoEngine::Threads => false,
    }
}

/// A ring for the drive, or `None` for the thread engine (asked for, or io_uring refused).
fn choose_ring(name: &str, opts: &FileOptions, on_tmpfs: bool) -> Option<io_uring::IoUring> {
    match requested_engine(opts) {
        IoEngine::Threads | IoEngine::Inline => return None,
        IoEngine::Auto if on_tmpfs => return None,
        IoEngine::Auto | IoEngine::Uring => {}
    }
    match engine::new_ring(opts.queue_depth) {
        Ok(ring) => Some(ring),
        Err(e) => {
            tracing::warn!(
                device = name,
                error = %e,
                "io_uring is unavailable ({e}); using a pool of {} threads with blocking I/O",
                opts.io_threads
            );
            None
        }
    }
}

impl BlockDevice for FileDevice {
    fn name(&self) -> &str {
        &self.shared.name
    }

    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn read(&self, offset_bytes: u64, buf: IoBuf) -> impl Future<Output = Result<IoBuf, DevError>> + Send {
        let len_bytes = buf.len() as u64;
        let checked = check_range(&self.shared.name, self.size_bytes, offset_bytes, len_bytes);
        async move {
            checked?;
            let request = FileDevice::request(OpKind::Read, offset_bytes, len_bytes);
            if !self.needs_bounce(buf.is_aligned()) {
                let Payload::Read(buf) = self.submit(request, Payload::Read(buf)).await? else {
                    unreachable!("a read gives back its buffer")
                };
                return Ok(buf);
            }
            let mut buf = buf;
            let bounce = IoBuf::zeroed(buf.len());
            let Payload::Read(bounce) = self.submit(request, Payload::Read(bounce)).await? else {
                unreachable!("a read gives back its buffer")
            };
            buf.copy_from_slice(&bounce);
            Ok(buf)
        }
    }

    fn write(
        &self,
        offset_bytes: u64,
        data: IoBytes,
        fua: bool,
    ) -> impl Future<Output = Result<(), DevError>> + Send {
        let len_bytes = data.len() as u64;
        let checked = check_range(&self.shared.name, self.size_bytes, offset_bytes, len_bytes);
        async move {
            checked?;
            let data = if self.needs_bounce(data.is_aligned()) { IoBytes::copy_from(&data) } else { data };
            let request = FileDevice::request(OpKind::Write { fua }, offset_bytes, len_bytes);
            self.submit(request, Payload::Write(data)).await.map(drop)
        }
    }

    fn flush(&self) -> impl Future<Output = Result<(), DevError>> + Send {
        let request = FileDevice::request(OpKind::Flush, 0, 0);
        async move { self.submit(request, Payload::None).await.map(drop) }
    }

    fn discard(
        &self,
        offset_bytes: u64,
        len_bytes: u64,
    ) -> impl Future<Output = Result<(), DevError>> + Send {
        let checked = check_range(&self.shared.name, self.size_bytes, offset_bytes, len_bytes);
        async move {
            checked?;
            if len_bytes == 0 {
                return Ok(());
            }
            let request = FileDevice::request(OpKind::Discard, offset_bytes, len_bytes);
            self.submit(request, Payload::None).await.map(drop)
        }
    }

    fn zero(&self, offset_bytes: u64, len_bytes: u64) -> impl Future<Output = Result<(), DevError>> + Send {
        let checked = check_range(&self.shared.name, self.size_bytes, offset_bytes, len_bytes);
        async move {
            checked?;
            if len_bytes == 0 {
                return Ok(());
            }
            let request = FileDevice::request(OpKind::Zero, offset_bytes, len_bytes);
            match self.submit(request, Payload::None).await {
                Ok(_) => Ok(()),
                // A filesystem that cannot punch holes, a device without the ioctl: the zeros
                // are written.
                Err(DevError::Io { source, .. })
                    if matches!(
                        source.raw_os_error(),
                        Some(libc::EOPNOTSUPP | libc::ENOTTY | libc::EINVAL)
                    ) =>
                {
                    crate::device::write_zeros(self, offset_bytes, len_bytes).await
                }
                Err(e) => Err(e),
            }
        }
    }

    fn counters(&self) -> &DevCounters {
        &self.counters
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_picks_the_engine_only_for_auto() {
        assert_eq!(engine_from_env(None), IoEngine::Auto);
        assert_eq!(engine_from_env(Some("threads")), IoEngine::Threads);
        assert_eq!(engine_from_env(Some("uring")), IoEngine::Uring);
        assert_eq!(engine_from_env(Some("bogus")), IoEngine::Auto);
        let opts = FileOptions { engine: IoEngine::Threads, ..FileOptions::default() };
        assert_eq!(requested_engine(&opts), IoEngine::Threads);
    }

    #[test]
    fn options_out_of_range_are_rejected() {
        let zero_depth = FileOptions { queue_depth: 0, ..FileOptions::default() };
        assert!(matches!(validate(&zero_depth), Err(OpenError::InvalidOption(_))));
        let many_threads = FileOptions { io_threads: IO_THREADS_MAX + 1, ..FileOptions::default() };
        assert!(matches!(validate(&many_threads), Err(OpenError::InvalidOption(_))));
        assert!(validate(&FileOptions::default()).is_ok());
    }
}
