//! [`MemExport`]: a sparse in-memory export with real hole and zero tracking, for tests and the
//! example server.

use std::ops::Range;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use stria_dev::{IoBuf, IoBytes};

use crate::export::{BoxFuture, Export, ExportError, Extent};
use crate::page_table::PageTable;

/// Granularity of allocation and of the status this export reports.
pub const MEM_PAGE_BYTES: u64 = 4096;
/// Most extents one `block_status` call returns; the client asks again for the rest.
pub const MEM_MAX_EXTENTS: usize = 4096;

/// One allocated page. A page that is absent from the map is a hole (reads as zeroes).
enum Page {
    /// Allocated, known to be all zeroes (written with `NO_HOLE` zeroing).
    Zero,
    /// Allocated with data.
    Data(Box<[u8]>),
}

/// A sparse export held in memory. Unwritten and trimmed pages are holes; pages zeroed with
/// `NO_HOLE` stay allocated and report `zero`; everything else reports data.
///
/// Flush is a no-op (memory is the durable medium here), which satisfies the multi-connection
/// rule because every connection shares the one page map.
pub struct MemExport {
    size_bytes: u64,
    read_only: bool,
    description: Option<String>,
    fast_zero: bool,
    /// Any operation touching this range fails with `EIO` (fault injection for tests).
    io_error_range: Option<Range<u64>>,
    pages: Mutex<PageTable<Page>>,
    flushes: AtomicU64,
}

impl std::fmt::Debug for MemExport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemExport")
            .field("size_bytes", &self.size_bytes)
            .field("read_only", &self.read_only)
            .field("allocated_pages", &self.allocated_pages())
            .finish()
    }
}

impl MemExport {
    /// A writable, empty (all holes) export of `size_bytes`.
    pub fn new(size_bytes: u64) -> MemExport {
        MemExport {
            size_bytes,
            read_only: false,
            description: None,
            fast_zero: true,
            io_error_range: None,
            pages: Mutex::new(PageTable::new(size_bytes.div_ceil(MEM_PAGE_BYTES))),
            flushes: AtomicU64::new(0),
        }
    }

    /// Makes the export read-only.
    pub fn with_read_only(mut self, read_only: bool) -> MemExport {
        self.read_only = read_only;
        self
    }

    /// Sets the description.
    pub fn with_description(mut self, description: impl Into<String>) -> MemExport {
        self.description = Some(description.into());
        self
    }

    /// Whether `FAST_ZERO` requests are accepted (default true).
    pub fn with_fast_zero(mut self, fast_zero: bool) -> MemExport {
        self.fast_zero = fast_zero;
        self
    }

    /// Makes every read, write, zero and trim that touches `range` fail with `EIO`.
    pub fn with_io_error_range(mut self, range: Range<u64>) -> MemExport {
        self.io_error_range = Some(range);
        self
    }

    /// Pages currently allocated (data or zero).
    pub fn allocated_pages(&self) -> usize {
        self.lock().len()
    }

    /// Number of completed flushes.
    pub fn flush_count(&self) -> u64 {
        self.flushes.load(Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PageTable<Page>> {
        self.pages.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The pages, locked for a change of `len` bytes at `offset_bytes`, once the export takes
    /// writes, the range is inside it and no injected fault covers it.
    fn lock_for_change(
        &self,
        offset_bytes: u64,
        len: u64,
    ) -> Result<std::sync::MutexGuard<'_, PageTable<Page>>, ExportError> {
        self.check_writable()?;
        self.check_range(offset_bytes, len)?;
        self.check_fault(offset_bytes, len)?;
        Ok(self.lock())
    }

    fn check_fault(&self, offset_bytes: u64, len_bytes: u64) -> Result<(), ExportError> {
        if let Some(bad) = &self.io_error_range {
            let end = offset_bytes.saturating_add(len_bytes);
            if offset_bytes < bad.end && bad.start < end {
                return Err(ExportError::Io {
                    offset_bytes,
                    len_bytes,
                    reason: "injected media error".to_owned(),
                });
            }
        }
        Ok(())
    }

    fn check_range(&self, offset_bytes: u64, len_bytes: u64) -> Result<(), ExportError> {
        match offset_bytes.checked_add(len_bytes) {
            Some(end) if end <= self.size_bytes => Ok(()),
            _ => Err(ExportError::InvalidArgument(format!(
                "range {offset_bytes}+{len_bytes} beyond export of {} bytes",
                self.size_bytes
            ))),
        }
    }

    /// Splits `[offset, offset + len)` into per-page pieces: (page index, start in page, length).
    fn pieces(offset_bytes: u64, len_bytes: u64) -> impl Iterator<Item = (u64, usize, usize)> {
        let end = offset_bytes + len_bytes;
        let mut at = offset_bytes;
        std::iter::from_fn(move || {
            if at >= end {
                return None;
            }
            let page = at / MEM_PAGE_BYTES;
            let in_page = at % MEM_PAGE_BYTES;
            let take = (MEM_PAGE_BYTES - in_page).min(end - at);
            at += take;
            let in_page = usize::try_from(in_page).expect("page offsets fit usize");
            let take = usize::try_from(take).expect("page lengths fit usize");
            Some((page, in_page, take))
        })
    }

    fn page_len() -> usize {
        usize::try_from(MEM_PAGE_BYTES).expect("page size fits usize")
    }

    fn read_now(&self, offset_bytes: u64, len_bytes: u32) -> Result<IoBuf, ExportError> {
        self.check_range(offset_bytes, u64::from(len_bytes))?;
        self.check_fault(offset_bytes, u64::from(len_bytes))?;
        let len = usize::try_from(len_bytes).expect("u32 fits usize");
        let mut buf = IoBuf::zeroed(len);
        let pages = self.lock();
        let mut filled = 0;
        for (page, in_page, take) in Self::pieces(offset_bytes, u64::from(len_bytes)) {
            if let Some(Page::Data(data)) = pages.get(page) {
                buf[filled..filled + take].copy_from_slice(&data[in_page..in_page + take]);
            }
            filled += take;
        }
        Ok(buf)
    }

    fn write_now(&self, offset_bytes: u64, data: &[u8]) -> Result<(), ExportError> {
        let len = u64::try_from(data.len()).expect("usize fits u64");
        let mut pages = self.lock_for_change(offset_bytes, len)?;
        let mut consumed = 0;
        for (page, in_page, take) in Self::pieces(offset_bytes, len) {
            let src = &data[consumed..consumed + take];
            consumed += take;
            if take == Self::page_len() {
                // Overwrite in place when the page already holds data: no allocation.
                match pages.get_mut(page) {
                    Some(Page::Data(bytes)) => bytes.copy_from_slice(src),
                    _ => {
                        pages.insert(page, Page::Data(src.into()));
                    }
                }
                continue;
            }
            let entry = pages.get_or_insert_with(page, || Page::Zero);
            if let Page::Zero = entry {
                *entry = Page::Data(vec![0u8; Self::page_len()].into_boxed_slice());
            }
            let Page::Data(bytes) = entry else { unreachable!("made a data page above") };
            bytes[in_page..in_page + take].copy_from_slice(src);
        }
        Ok(())
    }

    fn zero_now(&self, offset_bytes: u64, len_bytes: u32, may_trim: bool) -> Result<(), ExportError> {
        let mut pages = self.lock_for_change(offset_bytes, u64::from(len_bytes))?;
        for (page, in_page, take) in Self::pieces(offset_bytes, u64::from(len_bytes)) {
            if take == Self::page_len() {
                if may_trim {
                    pages.remove(page);
                } else {
                    pages.insert(page, Page::Zero);
                }
                continue;
            }
            match pages.get_mut(page) {
                Some(Page::Data(bytes)) => bytes[in_page..in_page + take].fill(0),
                Some(Page::Zero) => {}
                // A hole already reads as zeroes; NO_HOLE asks for it to be allocated.
                None if !may_trim => {
                    pages.insert(page, Page::Zero);
                }
                None => {}
            }
        }
        Ok(())
    }

    fn trim_now(&self, offset_bytes: u64, len_bytes: u32) -> Result<(), ExportError> {
        let mut pages = self.lock_for_change(offset_bytes, u64::from(len_bytes))?;
        // Only whole pages are discarded; the spec lets a trim round inwards.
        for (page, _, take) in Self::pieces(offset_bytes, u64::from(len_bytes)) {
            if take == Self::page_len() {
                pages.remove(page);
            }
        }
        Ok(())
    }

    fn status_now(&self, offset_bytes: u64, len_bytes: u32) -> Result<Vec<Extent>, ExportError> {
        self.check_range(offset_bytes, u64::from(len_bytes))?;
        let end = offset_bytes + u64::from(len_bytes);
        let first_page = offset_bytes / MEM_PAGE_BYTES;
        let last_page = (end - 1) / MEM_PAGE_BYTES;
        let pages = self.lock();
        let mut extents: Vec<Extent> = Vec::new();
        let mut at = offset_bytes;
        let mut push = |extents: &mut Vec<Extent>, upto: u64, hole: bool, zero: bool| {
            let len = u32::try_from(upto - at).expect("within one u32 request");
            at = upto;
            if len == 0 {
                return;
            }
            match extents.last_mut() {
                Some(last) if last.hole == hole && last.zero == zero => last.len_bytes += len,
                _ => extents.push(Extent { len_bytes: len, hole, zero }),
            }
        };
        for (page, state) in pages.range(first_page, last_page) {
            if extents.len() >= MEM_MAX_EXTENTS {
                return Ok(extents);
            }
            let page_start = (page * MEM_PAGE_BYTES).max(offset_bytes);
            let page_end = ((page + 1) * MEM_PAGE_BYTES).min(end);
            push(&mut extents, page_start, true, true);
            let zero = matches!(state, Page::Zero);
            push(&mut extents, page_end, false, zero);
        }
        push(&mut extents, end, true, true);
        Ok(extents)
    }

    fn check_writable(&self) -> Result<(), ExportError> {
        if self.read_only { Err(ExportError::ReadOnly) } else { Ok(()) }
    }
}

impl Export for MemExport {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn description(&self) -> Option<String> {
        self.description.clone()
    }

    fn preferred_block_bytes(&self) -> u32 {
        u32::try_from(MEM_PAGE_BYTES).expect("page size fits u32")
    }

    fn can_fast_zero(&self) -> bool {
        self.fast_zero
    }

    fn read(&self, offset_bytes: u64, len_bytes: u32) -> BoxFuture<'_, Result<IoBuf, ExportError>> {
        let result = self.read_now(offset_bytes, len_bytes);
        Box::pin(std::future::ready(result))
    }

    fn write(&self, offset_bytes: u64, data: IoBytes, _fua: bool) -> BoxFuture<'_, Result<(), ExportError>> {
        let result = self.write_now(offset_bytes, &data);
        Box::pin(std::future::ready(result))
    }

    fn write_zeroes(
        &self,
        offset_bytes: u64,
        len_bytes: u32,
        may_trim: bool,
        _fua: bool,
    ) -> BoxFuture<'_, Result<(), ExportError>> {
        let result = self.zero_now(offset_bytes, len_bytes, may_trim);
        Box::pin(std::future::ready(result))
    }

    fn trim(&self, offset_bytes: u64, len_bytes: u32, _fua: bool) -> BoxFuture<'_, Result<(), ExportError>> {
        let result = self.trim_now(offset_bytes, len_bytes);
        Box::pin(std::future::ready(result))
    }

    fn flush(&self) -> BoxFuture<'_, Result<(), ExportError>> {
        self.flushes.fetch_add(1, Ordering::Relaxed);
        Box::pin(std::future::ready(Ok(())))
    }

    fn cache(&self, offset_bytes: u64, len_bytes: u32) -> BoxFuture<'_, Result<(), ExportError>> {
        let result = self.check_range(offset_bytes, u64::from(len_bytes));
        Box::pin(std::future::ready(result))
    }

    fn block_status(
        &self,
        offset_bytes: u64,
        len_bytes: u32,
    ) -> BoxFuture<'_, Result<Vec<Extent>, ExportError>> {
        let result = self.status_now(offset_bytes, len_bytes);
        Box::pin(std::future::ready(result))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run<T>(future: BoxFuture<'_, T>) -> T {
        // MemExport futures are always ready.
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        let mut future = future;
        match future.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(value) => value,
            std::task::Poll::Pending => panic!("MemExport futures are ready at once"),
        }
    }

    #[test]
    fn unaligned_write_reads_back_and_neighbours_stay_zero() {
        let export = MemExport::new(1 << 20);
        run(export.write(4000, IoBytes::copy_from(&[7u8; 300]), false)).unwrap();
        let data = run(export.read(3990, 320)).unwrap();
        assert!(data[..10].iter().all(|&b| b == 0));
        assert!(data[10..310].iter().all(|&b| b == 7));
        assert!(data[310..].iter().all(|&b| b == 0));
        assert_eq!(export.allocated_pages(), 2);
    }

    #[test]
    fn status_reports_holes_zero_and_data() {
        let export = MemExport::new(64 * 1024);
        run(export.write(8192, IoBytes::copy_from(&[1u8; 4096]), false)).unwrap();
        run(export.write_zeroes(16384, 8192, false, false)).unwrap();
        let extents = run(export.block_status(0, 64 * 1024)).unwrap();
        let flags: Vec<(u32, bool, bool)> = extents.iter().map(|e| (e.len_bytes, e.hole, e.zero)).collect();
        assert_eq!(
            flags,
            vec![
                (8192, true, true),
                (4096, false, false),
                (4096, true, true),
                (8192, false, true),
                (40960, true, true)
            ]
        );
    }

    #[test]
    fn trim_and_zero_with_may_trim_free_whole_pages_only() {
        let export = MemExport::new(64 * 1024);
        run(export.write(0, IoBytes::copy_from(&[9u8; 16384]), false)).unwrap();
        run(export.trim(100, 8192, false)).unwrap();
        // Page 1 is wholly inside [100, 8292); pages 0 and 2 are partial and kept.
        assert_eq!(export.allocated_pages(), 3);
        run(export.write_zeroes(0, 16384, true, false)).unwrap();
        assert_eq!(export.allocated_pages(), 0);
        assert!(run(export.read(0, 16384)).unwrap().iter().all(|&b| b == 0));
    }

    #[test]
    fn injected_fault_fails_with_eio() {
        let export = MemExport::new(1 << 20).with_io_error_range(4096..8192);
        let err = run(export.read(4000, 200)).unwrap_err();
        assert_eq!(err.errno(), crate::proto::Errno::Io);
        assert!(run(export.read(0, 4096)).is_ok());
    }
}
