//! The raw system calls of the file drive, in one place: blocking I/O for the thread-pool engine
//! and the block-device ioctls.
//!
//! Every function returns the kernel's convention (a byte count, or `-errno`) so both engines feed
//! the same completion code.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

/// `_IOR(0x12, 114, u64)`: size of a block device in bytes.
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
/// `_IO(0x12, 119)`: discard a byte range `[start, len]` of a block device.
const BLKDISCARD: libc::c_ulong = 0x1277;
/// `_IO(0x12, 127)`: make a byte range `[start, len]` of a block device read as zeros.
const BLKZEROOUT: libc::c_ulong = 0x127F;

/// `-errno` of the last failed call, as an `i32` completion result.
fn last_errno_result() -> i32 {
    -io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

/// Converts a `ssize_t` return value into a completion result.
fn ssize_result(ret: isize) -> i32 {
    if ret < 0 {
        last_errno_result()
    } else {
        // Callers never ask for more than `MAX_IO_BYTES` (< 2^31) per call.
        i32::try_from(ret).expect("one call moves less than 2 GiB")
    }
}

/// Converts an `int` status return value into a completion result.
fn status_result(ret: libc::c_int) -> i32 {
    if ret < 0 { last_errno_result() } else { 0 }
}

fn off(offset_bytes: u64) -> libc::off_t {
    // Offsets were checked against the device size, which the kernel reported as an off_t.
    libc::off_t::try_from(offset_bytes).expect("offset fits in off_t")
}

/// `pread(2)` of `len` bytes into `ptr`.
///
/// # Safety
/// `ptr` must be valid for writes of `len` bytes for the duration of the call, and nothing else
/// may access those bytes meanwhile.
pub(super) unsafe fn pread(file: &File, ptr: *mut u8, len: usize, offset_bytes: u64) -> i32 {
    // SAFETY: the caller guarantees `ptr..ptr+len` is valid, exclusively ours, writable memory.
    let ret = unsafe { libc::pread(file.as_raw_fd(), ptr.cast(), len, off(offset_bytes)) };
    ssize_result(ret)
}

/// `pwritev2(2)` of `len` bytes from `ptr`, with `RWF_DSYNC` when `fua`.
///
/// # Safety
/// `ptr` must be valid for reads of `len` bytes for the duration of the call.
pub(super) unsafe fn pwrite(file: &File, ptr: *const u8, len: usize, offset_bytes: u64, fua: bool) -> i32 {
    let iov = libc::iovec { iov_base: ptr.cast_mut().cast(), iov_len: len };
    let flags = if fua { libc::RWF_DSYNC } else { 0 };
    // SAFETY: `iov` describes memory the caller guarantees readable; the kernel only reads it.
    let ret = unsafe { libc::pwritev2(file.as_raw_fd(), &iov, 1, off(offset_bytes), flags) };
    ssize_result(ret)
}

/// `fdatasync(2)`.
pub(super) fn fdatasync(file: &File) -> i32 {
    // SAFETY: plain syscall on a file descriptor we own; no memory is passed.
    status_result(unsafe { libc::fdatasync(file.as_raw_fd()) })
}

/// `fallocate(PUNCH_HOLE | KEEP_SIZE)`: frees the range of a regular file.
pub(super) fn punch_hole(file: &File, offset_bytes: u64, len_bytes: u64) -> i32 {
    let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    // SAFETY: plain syscall on a file descriptor we own; no memory is passed.
    status_result(unsafe { libc::fallocate(file.as_raw_fd(), mode, off(offset_bytes), off(len_bytes)) })
}

/// `ioctl(BLKDISCARD)`: tells a block device the range is unused.
pub(super) fn blk_discard(file: &File, offset_bytes: u64, len_bytes: u64) -> i32 {
    let range: [u64; 2] = [offset_bytes, len_bytes];
    // SAFETY: BLKDISCARD reads two u64 (start, length) from the pointer, which points at `range`.
    status_result(unsafe { libc::ioctl(file.as_raw_fd(), BLKDISCARD, range.as_ptr()) })
}

/// `ioctl(BLKZEROOUT)`: makes the range of a block device read as zeros (the kernel uses the
/// device's WRITE ZEROES or unmap when it has one, and writes zeros when not).
pub(super) fn blk_zeroout(file: &File, offset_bytes: u64, len_bytes: u64) -> i32 {
    let range: [u64; 2] = [offset_bytes, len_bytes];
    // SAFETY: BLKZEROOUT reads two u64 (start, length) from the pointer, which points at `range`.
    status_result(unsafe { libc::ioctl(file.as_raw_fd(), BLKZEROOUT, range.as_ptr()) })
}

/// Size in bytes of an open block device (`ioctl(BLKGETSIZE64)`).
pub(super) fn blk_size_bytes(file: &File) -> io::Result<u64> {
    let mut size_bytes: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer, which points at `size_bytes`.
    let ret = unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64, &mut size_bytes as *mut u64) };
    if ret < 0 { Err(io::Error::last_os_error()) } else { Ok(size_bytes) }
}

/// True when the file lives on tmpfs (`fstatfs` magic), where io_uring cannot do reads and
/// writes without blocking and hands every request to a kernel worker thread.
pub(super) fn is_on_tmpfs(file: &File) -> bool {
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    // SAFETY: `statfs` is plain old data; all-zero is a valid value that fstatfs overwrites.
    let mut stats: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: fstatfs writes one `statfs` through the pointer, which points at `stats`.
    let ret = unsafe { libc::fstatfs(file.as_raw_fd(), &mut stats) };
    // `f_type` is a c_long on x86_64 but a c_uint on some targets; widen either way.
    #[allow(clippy::useless_conversion)]
    let fs_magic = i64::from(stats.f_type);
    ret == 0 && fs_magic == TMPFS_MAGIC
}
