//! The per-block checksum table of one drive (format §6), held in memory and written back at
//! flush.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};

use stria_dev::BLOCK_USIZE as BLOCK;

use crate::format::layout::CSUM_ENTRIES_PER_PAGE;
use crate::format::page_crc;

const MAGIC: u32 = 0x5354_4353;

/// Entry value of a block that was never written (or was zeroed or trimmed): it reads as zeros.
pub(crate) const UNWRITTEN: u32 = 0;

/// The stored checksum of one 4 KiB block: its CRC32C, with 0 remapped to 1 so that 0 can mean
/// "unwritten".
///
/// Computed with `crc-fast` (VPCLMULQDQ folding on CPUs with AVX-512, ~110 ns per 4 KiB block on
/// Zen 4 against ~230 ns for the SSE4.2 `crc32c` crate; `target/release/stria-bench-engine`
/// prints both). Every block read from a drive goes through here, so its speed is a large part
/// of the read path.
pub(crate) fn block_crc(block: &[u8]) -> u32 {
    assert_eq!(block.len(), BLOCK, "a block checksum covers exactly one block");
    match crc_fast::crc32_iscsi(block) {
        0 => 1,
        crc => crc,
    }
}

/// Checksum entries for every data block of a drive, with dirty tracking per page.
#[derive(Debug)]
pub(crate) struct ChecksumTable {
    entries: Box<[AtomicU32]>,
    dirty_pages: Box<[AtomicU64]>,
}

impl ChecksumTable {
    /// A table of `blocks` unwritten entries.
    pub(crate) fn new(blocks: u64) -> ChecksumTable {
        let n = usize::try_from(blocks).expect("block count fits in memory");
        let pages = n.div_ceil(CSUM_ENTRIES_PER_PAGE as usize);
        ChecksumTable {
            entries: (0..n).map(|_| AtomicU32::new(UNWRITTEN)).collect(),
            dirty_pages: (0..pages.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Number of entries (data blocks).
    pub(crate) fn blocks(&self) -> u64 {
        self.entries.len() as u64
    }

    /// Number of pages.
    pub(crate) fn pages(&self) -> u64 {
        self.blocks().div_ceil(CSUM_ENTRIES_PER_PAGE)
    }

    /// The entry of `block`.
    pub(crate) fn get(&self, block: u64) -> u32 {
        self.entries[block as usize].load(Relaxed)
    }

    /// Sets the entry of `block` and marks its page dirty.
    pub(crate) fn set(&self, block: u64, value: u32) {
        let old = self.entries[block as usize].swap(value, Relaxed);
        if old != value {
            self.mark_dirty(block / CSUM_ENTRIES_PER_PAGE);
        }
    }

    /// Sets the entries of the blocks starting at `first` from their contents.
    pub(crate) fn set_from_data(&self, first: u64, data: &[u8]) {
        // A tail shorter than a block would keep the old checksum of the block it lands in.
        assert!(
            data.len().is_multiple_of(BLOCK),
            "checksums are set for whole blocks; got {} bytes at block {first}",
            data.len()
        );
        self.set_many(first, data.chunks_exact(BLOCK).map(block_crc));
    }

    /// Sets entries from precomputed values.
    pub(crate) fn set_values(&self, first: u64, values: &[u32]) {
        self.set_many(first, values.iter().copied());
    }

    /// Sets consecutive entries from `first`, marking each page dirty once (not once per entry)
    /// when any of its entries changed: a 64 KiB write touches one page, not 16 dirty bits.
    fn set_many(&self, first: u64, values: impl ExactSizeIterator<Item = u32>) {
        self.check_range("set", first, values.len() as u64);
        let mut dirty_page = None;
        for (i, value) in values.enumerate() {
            let block = first + i as u64;
            let page = block / CSUM_ENTRIES_PER_PAGE;
            if dirty_page.is_some_and(|p| p != page) {
                self.mark_dirty(dirty_page.take().expect("checked"));
            }
            if self.entries[block as usize].swap(value, Relaxed) != value {
                dirty_page = Some(page);
            }
        }
        if let Some(page) = dirty_page {
            self.mark_dirty(page);
        }
    }

    /// Marks `count` blocks from `first` unwritten.
    pub(crate) fn clear(&self, first: u64, count: u64) {
        self.check_range("clear", first, count);
        for b in first..first + count {
            self.set(b, UNWRITTEN);
        }
    }

    /// True when every block of the range is unwritten.
    pub(crate) fn all_unwritten(&self, first: u64, count: u64) -> bool {
        (first..first + count).all(|b| self.get(b) == UNWRITTEN)
    }

    /// Stops the process when `count` entries from `first` are not all in the table: the caller
    /// computed the wrong blocks, and the checksums of other blocks would change (or none).
    fn check_range(&self, what: &str, first: u64, count: u64) {
        assert!(
            first.checked_add(count).is_some_and(|end| end <= self.blocks()),
            "checksum table: {what} of {count} entries from block {first} outside the table of {} blocks",
            self.blocks()
        );
    }

    /// Stops the process when `page` is not a page of the table.
    fn check_page(&self, what: &str, page: u64) {
        assert!(
            page < self.pages(),
            "checksum table: {what} page {page} of a table of {} pages",
            self.pages()
        );
    }

    fn mark_dirty(&self, page: u64) {
        self.dirty_pages[(page / 64) as usize].fetch_or(1 << (page % 64), Relaxed);
    }

    /// Takes the set of dirty pages (clearing it). Entries changed after this call dirty their
    /// page again and are written by the next flush.
    pub(crate) fn take_dirty_pages(&self) -> Vec<u64> {
        let mut pages = Vec::new();
        for (word_index, word) in self.dirty_pages.iter().enumerate() {
            let mut bits = word.swap(0, Relaxed);
            while bits != 0 {
                let bit = u64::from(bits.trailing_zeros());
                pages.push(word_index as u64 * 64 + bit);
                bits &= bits - 1;
            }
        }
        pages
    }

    /// Puts pages back in the dirty set (after a failed write-back).
    pub(crate) fn redirty(&self, pages: &[u64]) {
        for &p in pages {
            self.check_page("redirty", p);
            self.mark_dirty(p);
        }
    }

    /// Encodes page `page` as it is now.
    pub(crate) fn encode_page(&self, page: u64, out: &mut [u8]) {
        assert_eq!(out.len(), BLOCK, "a checksum page is one block");
        self.check_page("encode", page);
        out.fill(0);
        out[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        out[4..8].copy_from_slice(&u32::try_from(page).expect("page index fits").to_le_bytes());
        let first = page * CSUM_ENTRIES_PER_PAGE;
        let last = (first + CSUM_ENTRIES_PER_PAGE).min(self.blocks());
        for (i, b) in (first..last).enumerate() {
            out[16 + 4 * i..20 + 4 * i].copy_from_slice(&self.get(b).to_le_bytes());
        }
        let crc = page_crc(out);
        out[12..16].copy_from_slice(&crc.to_le_bytes());
    }

    /// Loads page `page` from its on-disk bytes. An all-zero page is a valid empty page (a
    /// freshly created drive). Returns false if the page is damaged (entries left unwritten).
    pub(crate) fn load_page(&self, page: u64, bytes: &[u8]) -> bool {
        assert_eq!(bytes.len(), BLOCK, "a checksum page is one block");
        self.check_page("load", page);
        if bytes.iter().all(|&b| b == 0) {
            return true;
        }
        let magic = u32::from_le_bytes(bytes[0..4].try_into().expect("4 bytes"));
        let index = u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes"));
        let crc = u32::from_le_bytes(bytes[12..16].try_into().expect("4 bytes"));
        if magic != MAGIC || u64::from(index) != page || crc != page_crc(bytes) {
            return false;
        }
        let first = page * CSUM_ENTRIES_PER_PAGE;
        let last = (first + CSUM_ENTRIES_PER_PAGE).min(self.blocks());
        for (i, b) in (first..last).enumerate() {
            let v = u32::from_le_bytes(bytes[16 + 4 * i..20 + 4 * i].try_into().expect("4 bytes"));
            self.entries[b as usize].store(v, Relaxed);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_crc_is_crc32c() {
        // The same CRC-32C (Castagnoli) as the `crc32c` crate and the on-disk format.
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..64 {
            let block: Vec<u8> = (0..BLOCK)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            assert_eq!(block_crc(&block), crc32c::crc32c(&block).max(1));
        }
        assert_eq!(crc_fast::crc32_iscsi(b"123456789"), 0xe306_9283);
    }

    #[test]
    fn crc_never_collides_with_unwritten() {
        assert_ne!(block_crc(&[0u8; BLOCK]), UNWRITTEN);
        assert_ne!(block_crc(&[0xffu8; BLOCK]), UNWRITTEN);
    }

    #[test]
    fn dirty_pages_round_trip_through_encoding() {
        let t = ChecksumTable::new(5000);
        t.set(3, 77);
        t.set(2500, 99);
        let pages = t.take_dirty_pages();
        assert_eq!(pages, vec![0, 2]);
        assert!(t.take_dirty_pages().is_empty());
        let fresh = ChecksumTable::new(5000);
        let mut page = vec![0u8; BLOCK];
        for p in pages {
            t.encode_page(p, &mut page);
            assert!(fresh.load_page(p, &page));
        }
        assert_eq!((fresh.get(3), fresh.get(2500), fresh.get(4)), (77, 99, 0));
    }

    #[test]
    #[should_panic(expected = "clear of 3 entries from block 1999 outside the table of 2000 blocks")]
    fn clearing_past_the_table_is_a_bug() {
        ChecksumTable::new(2000).clear(1999, 3);
    }

    #[test]
    #[should_panic(expected = "checksums are set for whole blocks")]
    fn checksums_of_part_of_a_block_are_a_bug() {
        ChecksumTable::new(2000).set_from_data(0, &[1u8; BLOCK + 512]);
    }

    #[test]
    fn damaged_pages_are_refused() {
        let t = ChecksumTable::new(2000);
        t.set(1, 5);
        let mut page = vec![0u8; BLOCK];
        t.encode_page(0, &mut page);
        page[100] ^= 4;
        assert!(!ChecksumTable::new(2000).load_page(0, &page));
        t.encode_page(0, &mut page);
        assert!(!ChecksumTable::new(2000).load_page(1, &page), "page index is checked");
    }
}
