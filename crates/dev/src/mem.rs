//! A drive held in memory: for tests, simulations and the in-process engine benchmark.
//!
//! Storage is sparse (pages never written cost nothing and read as zeros) and every page has
//! its own lock, so requests from many threads proceed in parallel.

use std::future::{Future, ready};
use std::sync::Arc;

use parking_lot::RwLock;

use crate::buf::{IoBuf, IoBytes};
use crate::counters::DevCounters;
use crate::device::{BlockDevice, DevError, check_range};

/// Bytes per lockable, separately allocated page of a memory drive.
const PAGE_BYTES: usize = 64 * 1024;

/// One page: `None` until first written (reads as zeros).
type Page = RwLock<Option<Box<[u8]>>>;

/// A sparse in-memory drive.
pub struct MemDevice {
    name: Arc<str>,
    size_bytes: u64,
    pages: Box<[Page]>,
    counters: DevCounters,
}

impl std::fmt::Debug for MemDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemDevice").field("name", &self.name).field("size_bytes", &self.size_bytes).finish()
    }
}

impl MemDevice {
    /// A zero-filled drive of `size_bytes` (rounded down to whole blocks).
    pub fn new(name: &str, size_bytes: u64) -> MemDevice {
        let size_bytes = size_bytes - size_bytes % crate::BLOCK_BYTES;
        let page_count =
            usize::try_from(size_bytes.div_ceil(PAGE_BYTES as u64)).expect("memory drive too large");
        MemDevice {
            name: Arc::from(name),
            size_bytes,
            pages: (0..page_count).map(|_| RwLock::new(None)).collect(),
            counters: DevCounters::default(),
        }
    }

    /// Copies bytes at `offset_bytes` into `out`, synchronously and without counting.
    ///
    /// Used by wrappers (the fault injector) and tests; any offset and length inside the drive.
    pub fn read_at(&self, offset_bytes: u64, out: &mut [u8]) {
        self.for_each_page(offset_bytes, out.len(), |page, in_page, at| {
            let dst = &mut out[at..at + in_page.len()];
            match &*self.pages[page].read() {
                Some(bytes) => dst.copy_from_slice(&bytes[in_page]),
                None => dst.fill(0),
            }
        });
    }

    /// Copies `data` to `offset_bytes`, synchronously and without counting.
    pub fn write_at(&self, offset_bytes: u64, data: &[u8]) {
        self.for_each_page(offset_bytes, data.len(), |page, in_page, at| {
            let src = &data[at..at + in_page.len()];
            let mut slot = self.pages[page].write();
            let bytes = slot.get_or_insert_with(|| vec![0u8; PAGE_BYTES].into_boxed_slice());
            bytes[in_page].copy_from_slice(src);
        });
    }

    /// Zeroes `len_bytes` at `offset_bytes`, freeing whole pages.
    pub fn zero_at(&self, offset_bytes: u64, len_bytes: u64) {
        let len = usize::try_from(len_bytes).expect("length fits in memory");
        self.for_each_page(offset_bytes, len, |page, in_page, _| {
            let mut slot = self.pages[page].write();
            if in_page.len() == PAGE_BYTES {
                *slot = None;
            } else if let Some(bytes) = slot.as_mut() {
                bytes[in_page].fill(0);
            }
        });
    }

    /// A new drive named `name` with a copy of this drive's contents (pages never written stay
    /// unallocated). Counters start at zero.
    pub fn clone_contents(&self, name: &str) -> MemDevice {
        let copy = MemDevice::new(name, self.size_bytes);
        for (mine, theirs) in self.pages.iter().zip(copy.pages.iter()) {
            if let Some(bytes) = &*mine.read() {
                *theirs.write() = Some(bytes.clone());
            }
        }
        copy
    }

    /// Bytes of memory actually allocated for data.
    pub fn resident_bytes(&self) -> u64 {
        self.pages.iter().filter(|p| p.read().is_some()).count() as u64 * PAGE_BYTES as u64
    }

    /// Calls `f(page_index, range_in_page, offset_in_request)` for each page the range covers.
    fn for_each_page(
        &self,
        offset_bytes: u64,
        len: usize,
        mut f: impl FnMut(usize, std::ops::Range<usize>, usize),
    ) {
        let end = offset_bytes.checked_add(len as u64).expect("range overflows");
        assert!(end <= self.size_bytes, "memory drive {}: range beyond end", self.name);
        let mut at = 0usize;
        while at < len {
            let pos = offset_bytes + at as u64;
            let page = usize::try_from(pos / PAGE_BYTES as u64).expect("page index fits");
            let in_start = usize::try_from(pos % PAGE_BYTES as u64).expect("in-page offset fits");
            let n = (PAGE_BYTES - in_start).min(len - at);
            f(page, in_start..in_start + n, at);
            at += n;
        }
    }
}

impl BlockDevice for MemDevice {
    fn name(&self) -> &str {
        &self.name
    }

    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn read(
        &self,
        offset_bytes: u64,
        mut buf: IoBuf,
    ) -> impl Future<Output = Result<IoBuf, DevError>> + Send {
        let len = buf.len() as u64;
        let result = check_range(&self.name, self.size_bytes, offset_bytes, len).map(|()| {
            self.read_at(offset_bytes, &mut buf);
            self.counters.record_read(len);
            buf
        });
        ready(result)
    }

    fn write(
        &self,
        offset_bytes: u64,
        data: IoBytes,
        _fua: bool,
    ) -> impl Future<Output = Result<(), DevError>> + Send {
        let len = data.len() as u64;
        let result = check_range(&self.name, self.size_bytes, offset_bytes, len).map(|()| {
            self.write_at(offset_bytes, &data);
            self.counters.record_write(len);
        });
        ready(result)
    }

    fn flush(&self) -> impl Future<Output = Result<(), DevError>> + Send {
        self.counters.record_flush();
        ready(Ok(()))
    }

    fn discard(
        &self,
        offset_bytes: u64,
        len_bytes: u64,
    ) -> impl Future<Output = Result<(), DevError>> + Send {
        let result = check_range(&self.name, self.size_bytes, offset_bytes, len_bytes).map(|()| {
            self.zero_at(offset_bytes, len_bytes);
            self.counters.record_discard();
        });
        ready(result)
    }

    fn zero(&self, offset_bytes: u64, len_bytes: u64) -> impl Future<Output = Result<(), DevError>> + Send {
        let result = check_range(&self.name, self.size_bytes, offset_bytes, len_bytes).map(|()| {
            self.zero_at(offset_bytes, len_bytes);
            self.counters.record_discard();
        });
        ready(result)
    }

    fn counters(&self) -> &DevCounters {
        &self.counters
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block_on<F: Future>(f: F) -> F::Output {
        // Memory futures are ready on first poll.
        let mut f = std::pin::pin!(f);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match f.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(v) => v,
            std::task::Poll::Pending => panic!("memory device future was not ready"),
        }
    }

    #[test]
    fn writes_read_back_across_page_boundaries() {
        let dev = MemDevice::new("m0", 1 << 20);
        let data: Vec<u8> = (0..3 * 4096).map(|i| (i * 7 % 251) as u8).collect();
        let off = PAGE_BYTES as u64 - 4096;
        block_on(dev.write(off, IoBytes::copy_from(&data), false)).unwrap();
        let buf = block_on(dev.read(off, IoBuf::zeroed(data.len()))).unwrap();
        assert_eq!(&buf[..], &data[..]);
        let snap = dev.counters().snapshot();
        assert_eq!((snap.read_ops, snap.write_ops, snap.write_bytes), (1, 1, data.len() as u64));
    }

    #[test]
    fn unwritten_and_discarded_ranges_read_as_zeros() {
        let dev = MemDevice::new("m0", 1 << 20);
        block_on(dev.write(0, IoBytes::copy_from(&vec![9u8; PAGE_BYTES * 2]), false)).unwrap();
        block_on(dev.discard(0, PAGE_BYTES as u64 + 4096)).unwrap();
        let buf = block_on(dev.read(0, IoBuf::zeroed(PAGE_BYTES * 2))).unwrap();
        assert!(buf[..PAGE_BYTES + 4096].iter().all(|&b| b == 0));
        assert!(buf[PAGE_BYTES + 4096..].iter().all(|&b| b == 9));
        assert_eq!(dev.resident_bytes(), PAGE_BYTES as u64);
    }

    #[test]
    fn cloned_contents_are_independent_copies() {
        let dev = MemDevice::new("m0", 1 << 20);
        dev.write_at(PAGE_BYTES as u64, &[7u8; 4096]);
        let copy = dev.clone_contents("m1");
        dev.write_at(PAGE_BYTES as u64, &[8u8; 4096]);
        let mut out = [0u8; 4096];
        copy.read_at(PAGE_BYTES as u64, &mut out);
        assert_eq!(out, [7u8; 4096]);
        assert_eq!(
            (copy.name(), copy.size_bytes(), copy.resident_bytes()),
            ("m1", 1 << 20, PAGE_BYTES as u64)
        );
    }

    #[test]
    fn bad_requests_are_errors_not_panics() {
        let dev = MemDevice::new("m0", 8192);
        assert!(matches!(block_on(dev.read(4096, IoBuf::zeroed(8192))), Err(DevError::OutOfRange { .. })));
        assert!(matches!(block_on(dev.read(100, IoBuf::zeroed(4096))), Err(DevError::Misaligned { .. })));
    }
}
