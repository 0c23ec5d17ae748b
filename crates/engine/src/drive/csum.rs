//! The per-block checksum table of one drive (format §6): on the drive, with a bounded cache of
//! its pages in memory (docs/design/paged-checksums.md).
//!
//! A page is read from the drive the first time a request touches one of its blocks and stays
//! cached until the CLOCK hand evicts it. Only clean pages that no request holds are evicted: a
//! dirty page stays until a drive flush writes it back (after the data it describes is
//! durable), so an entry can never be lost by eviction. When the cache is over its budget and
//! nothing can be evicted, [`ChecksumTable::over_budget`] tells the write path to flush.
//!
//! A page that fails its CRC when loaded is *damaged*: its entries read as
//! [`Entry::Unknown`] (a verified read reports those blocks corrupt, so they are repaired from
//! redundancy, never returned unverified) and it is queued until the pool resynchronises the
//! rows it covers and calls [`ChecksumTable::mark_repaired`]; it is never written back or
//! evicted before that.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};

use smallvec::SmallVec;
use stria_dev::{BLOCK_BYTES, BLOCK_USIZE as BLOCK, BlockDevice, DevError, IoBuf};

use crate::format::layout::CSUM_ENTRIES_PER_PAGE;
use crate::format::page_crc;
use crate::pagecache::{PageCache, Slot};

const MAGIC: u32 = 0x5354_4353;
const ENTRIES: usize = CSUM_ENTRIES_PER_PAGE as usize;
/// Pages read from the drive in one request at most when a range misses.
const LOAD_RUN_PAGES: u64 = 64;

/// Entry value of a block that was never written (or was zeroed or trimmed): it reads as zeros.
pub(crate) const UNWRITTEN: u32 = 0;

/// Default cache budget of one drive's table: 8192 pages (32 MiB), covering 32 GiB of data.
pub const DEFAULT_CSUM_CACHE_PAGES: u64 = 8192;

/// The stored checksum of one 4 KiB block: its CRC32C, with 0 remapped to 1 so that 0 can mean
/// "unwritten" (one function for the engine and the log volumes' maps, in stria-dev).
pub(crate) use stria_dev::block_crc;

/// What the table says about one block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Entry {
    /// Never written, zeroed or trimmed: reads as zeros.
    Unwritten,
    /// Written; its contents have this checksum.
    Crc(u32),
    /// Its checksum page is damaged and not yet repaired: the contents cannot be verified.
    Unknown,
}

/// The entries of one page, and whether the page's version on the drive marks every block it
/// covers written (no `Unwritten` entry): then a FUA write into it needs no checksum write-back
/// to survive a crash (docs/crash-consistency.md, invariant 1: recovery blesses written blocks
/// of dirty regions from their data, but keeps unwritten ones unwritten).
#[derive(Debug)]
pub(crate) struct Entries(Box<[AtomicU32]>, AtomicBool);

impl Entries {
    fn empty() -> Entries {
        Entries((0..ENTRIES).map(|_| AtomicU32::new(UNWRITTEN)).collect(), AtomicBool::new(false))
    }

    /// Whether every entry of the first `used` is written, as they are now.
    fn all_written(&self, used: usize) -> bool {
        self.0[..used].iter().all(|e| e.load(SeqCst) != UNWRITTEN)
    }
}

type PageSlot = Arc<Slot<Entries>>;

/// Pages held for one request: they cannot be evicted while this lives.
#[derive(Debug)]
pub(crate) struct Pinned {
    first_page: u64,
    pages: SmallVec<[PageSlot; 4]>,
}

impl Pinned {
    fn slot(&self, block: u64) -> (&PageSlot, usize) {
        let p = block / CSUM_ENTRIES_PER_PAGE;
        let slot = p.checked_sub(self.first_page).and_then(|i| self.pages.get(i as usize));
        let slot =
            slot.unwrap_or_else(|| panic!("checksum entry of block {block} used outside the pinned pages"));
        (slot, (block % CSUM_ENTRIES_PER_PAGE) as usize)
    }

    /// The entry of `block`; every entry of a damaged (frozen) page is unknown.
    pub(crate) fn get(&self, block: u64) -> Entry {
        let (slot, i) = self.slot(block);
        if slot.is_frozen() {
            return Entry::Unknown;
        }
        match slot.page().0[i].load(SeqCst) {
            UNWRITTEN => Entry::Unwritten,
            crc => Entry::Crc(crc),
        }
    }

    /// True when every block of the range is known to be unwritten.
    pub(crate) fn all_unwritten(&self, first: u64, count: u64) -> bool {
        (first..first + count).all(|b| self.get(b) == Entry::Unwritten)
    }

    /// True when the drive's own copy of every page covering the range marks all its blocks
    /// written (and no page is damaged).
    pub(crate) fn written_on_disk(&self) -> bool {
        self.pages.iter().all(|p| !p.is_frozen() && p.page().1.load(SeqCst))
    }
}

/// Counters of a table's cache (since open).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CsumCacheStats {
    /// Pages in memory now.
    pub resident_pages: u64,
    /// The budget in pages.
    pub budget_pages: u64,
    /// Pages read from the drive (cache misses).
    pub loaded_pages: u64,
    /// Pages dropped by the CLOCK hand.
    pub evicted_pages: u64,
    /// Pages found damaged when loaded.
    pub damaged_pages: u64,
}

/// Checksum entries for every data block of a drive, paged in from the drive on demand. A
/// damaged page is kept *frozen* in the cache (never evicted, never written back) until the
/// pool repaired it.
#[derive(Debug)]
pub(crate) struct ChecksumTable {
    blocks: u64,
    /// Byte offset of page 0 on the drive.
    offset_bytes: u64,
    cache: PageCache<Entries>,
    /// Damaged pages found and not yet handed to the pool for repair.
    damaged: parking_lot::Mutex<Vec<u64>>,
    damaged_found: AtomicU64,
    /// Tests hold a page load here, between its read and its insert.
    #[cfg(test)]
    load_hold: crate::pagecache::LoadHold,
}

impl ChecksumTable {
    /// The table of a drive with `blocks` data blocks whose page 0 is at `offset_bytes`, with
    /// the default budget and nothing cached.
    pub(crate) fn new(blocks: u64, offset_bytes: u64) -> ChecksumTable {
        ChecksumTable {
            blocks,
            offset_bytes,
            cache: PageCache::new(DEFAULT_CSUM_CACHE_PAGES),
            damaged: parking_lot::Mutex::new(Vec::new()),
            damaged_found: AtomicU64::new(0),
            #[cfg(test)]
            load_hold: crate::pagecache::LoadHold::default(),
        }
    }

    /// Number of entries (data blocks).
    pub(crate) fn blocks(&self) -> u64 {
        self.blocks
    }

    /// Number of pages.
    pub(crate) fn pages(&self) -> u64 {
        self.blocks.div_ceil(CSUM_ENTRIES_PER_PAGE)
    }

    /// Sets how many pages may stay cached (at least one) and evicts down to it.
    pub(crate) fn set_budget(&self, pages: u64) {
        self.cache.set_budget(pages);
    }

    /// Evicts down to the budget what can be evicted (after a write-back made pages clean).
    pub(crate) fn trim(&self) {
        self.cache.trim();
    }

    /// The cache's counters.
    pub(crate) fn stats(&self) -> CsumCacheStats {
        let c = self.cache.stats();
        CsumCacheStats {
            resident_pages: c.resident_pages,
            budget_pages: c.budget_pages,
            loaded_pages: c.loaded_pages,
            evicted_pages: c.evicted_pages,
            damaged_pages: self.damaged_found.load(Relaxed),
        }
    }

    /// True when more pages are cached than the budget allows and eviction could not help
    /// (they are dirty): the writer should flush the drive, which writes them back.
    pub(crate) fn over_budget(&self) -> bool {
        self.cache.over_budget()
    }

    /// Holds the pages covering `count` blocks from `first`, reading the missing ones from
    /// `dev` (consecutive misses in one read). A read error is returned (the caller counts it
    /// against the drive).
    pub(crate) async fn pin<D: BlockDevice>(
        &self,
        dev: &D,
        first: u64,
        count: u64,
    ) -> Result<Pinned, DevError> {
        self.check_range("pin", first, count);
        if count == 0 {
            return Ok(Pinned { first_page: 0, pages: SmallVec::new() });
        }
        let first_page = first / CSUM_ENTRIES_PER_PAGE;
        let last_page = (first + count - 1) / CSUM_ENTRIES_PER_PAGE;
        // A page read while another request loaded, changed, wrote back and evicted it would be
        // cached older than the table: its blocks' checksums stale (reported corrupt). Such a
        // load is refused and the pages are looked up and read again.
        let slots = 'load: loop {
            let ticket = self.cache.load_ticket();
            let mut slots = self.cache.lookup(first_page, last_page - first_page + 1);
            let mut i = 0;
            while i < slots.len() {
                if slots[i].is_some() {
                    i += 1;
                    continue;
                }
                let mut j = i + 1;
                while j < slots.len() && slots[j].is_none() && ((j - i) as u64) < LOAD_RUN_PAGES {
                    j += 1;
                }
                let run_first = first_page + i as u64;
                let buf = dev
                    .read(self.offset_bytes + run_first * BLOCK_BYTES, IoBuf::zeroed((j - i) * BLOCK))
                    .await?;
                let decoded = buf
                    .chunks_exact(BLOCK)
                    .enumerate()
                    .map(|(k, bytes)| {
                        let id = run_first + k as u64;
                        let (entries, damaged) = decode_page(id, bytes);
                        (id, entries, damaged)
                    })
                    .collect();
                #[cfg(test)]
                self.load_hold.pass().await;
                let Some(inserted) = self.cache.insert_loaded(ticket, decoded) else { continue 'load };
                for (k, (slot, inserted)) in inserted.into_iter().enumerate() {
                    if inserted && slot.is_frozen() {
                        let id = run_first + k as u64;
                        self.damaged_found.fetch_add(1, Relaxed);
                        self.damaged.lock().push(id);
                        tracing::warn!(page = id, "checksum page damaged: its blocks are resynchronised");
                    }
                    slots[i + k] = Some(slot);
                }
                i = j;
            }
            break slots;
        };
        Ok(Pinned { first_page, pages: slots.into_iter().map(|s| s.expect("loaded")).collect() })
    }

    /// Sets the entries of the blocks starting at `first` from their contents.
    pub(crate) fn set_from_data(&self, pin: &Pinned, first: u64, data: &[u8]) {
        // A tail shorter than a block would keep the old checksum of the block it lands in.
        assert!(
            data.len().is_multiple_of(BLOCK),
            "checksums are set for whole blocks; got {} bytes at block {first}",
            data.len()
        );
        self.set_many(pin, first, data.chunks_exact(BLOCK).map(block_crc));
    }

    /// Sets entries from precomputed values.
    pub(crate) fn set_values(&self, pin: &Pinned, first: u64, values: &[u32]) {
        self.set_many(pin, first, values.iter().copied());
    }

    /// Marks `count` blocks from `first` unwritten.
    pub(crate) fn clear(&self, pin: &Pinned, first: u64, count: u64) {
        self.set_many(pin, first, std::iter::repeat_n(UNWRITTEN, count as usize));
    }

    /// Sets consecutive entries from `first`, marking each changed page dirty once (after its
    /// entries are stored).
    fn set_many(&self, pin: &Pinned, first: u64, values: impl ExactSizeIterator<Item = u32>) {
        self.check_range("set", first, values.len() as u64);
        let mut changed: Option<u64> = None;
        for (i, value) in values.enumerate() {
            let block = first + i as u64;
            let page_id = block / CSUM_ENTRIES_PER_PAGE;
            if let Some(p) = changed.filter(|&p| p != page_id) {
                self.cache.mark_dirty(p, pin.slot(p * CSUM_ENTRIES_PER_PAGE).0);
                changed = None;
            }
            let (slot, at) = pin.slot(block);
            if slot.page().0[at].swap(value, SeqCst) != value {
                changed = Some(page_id);
            }
        }
        if let Some(p) = changed {
            self.cache.mark_dirty(p, pin.slot(p * CSUM_ENTRIES_PER_PAGE).0);
        }
    }

    /// Takes the dirty pages to write back (see [`PageCache::take_dirty`]).
    pub(crate) fn take_dirty(&self) -> Vec<(u64, PageSlot)> {
        self.cache.take_dirty()
    }

    /// Puts pages back in the dirty set (after a failed write-back).
    pub(crate) fn redirty(&self, pages: &[(u64, PageSlot)]) {
        for (id, _) in pages {
            self.check_page("redirty", *id);
        }
        self.cache.redirty(pages);
    }

    /// Damaged pages found since the last call (each is reported once).
    pub(crate) fn take_damaged(&self) -> Vec<u64> {
        let mut pages = std::mem::take(&mut *self.damaged.lock());
        pages.sort_unstable();
        pages
    }

    /// Puts damaged pages back in the queue (their repair failed).
    pub(crate) fn requeue_damaged(&self, pages: &[u64]) {
        self.damaged.lock().extend_from_slice(pages);
    }

    /// The rows covering these damaged pages were resynchronised (every written block's entry
    /// set from its contents): their entries are known again and the pages are written back at
    /// the next flush.
    pub(crate) fn mark_repaired(&self, pages: &[u64]) {
        for &id in pages {
            self.cache.set_frozen(id, false);
        }
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

    /// Before writing back a snapshot of page `id` (`all_written`: whether the snapshot marks
    /// every block written): a snapshot that does not clears the page's on-disk flag first, so
    /// that no FUA write trusts it while the write-back is under way.
    pub(crate) fn before_write_back(entries: &Entries, all_written: bool) {
        if !all_written {
            entries.1.store(false, SeqCst);
        }
    }

    /// After a snapshot of the page is durable on the drive.
    pub(crate) fn after_write_back(entries: &Entries, all_written: bool) {
        entries.1.store(all_written, SeqCst);
    }

    /// Encodes page `id` as it is now; returns whether it marks every block written.
    pub(crate) fn encode_page(&self, id: u64, entries: &Entries, out: &mut [u8]) -> bool {
        assert_eq!(out.len(), BLOCK, "a checksum page is one block");
        self.check_page("encode", id);
        out.fill(0);
        out[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        out[4..8].copy_from_slice(&u32::try_from(id).expect("page index fits").to_le_bytes());
        let used = self.entries_in(id);
        let mut all_written = used == ENTRIES;
        for (i, e) in entries.0[..used].iter().enumerate() {
            let v = e.load(SeqCst);
            all_written &= v != UNWRITTEN;
            out[16 + 4 * i..20 + 4 * i].copy_from_slice(&v.to_le_bytes());
        }
        let crc = page_crc(out);
        out[12..16].copy_from_slice(&crc.to_le_bytes());
        all_written
    }

    /// Entries of page `id` that describe blocks of the drive (the last page may be partial).
    fn entries_in(&self, id: u64) -> usize {
        let first = id * CSUM_ENTRIES_PER_PAGE;
        (self.blocks.min(first + CSUM_ENTRIES_PER_PAGE) - first) as usize
    }
}

/// Decodes page `id` from its on-disk bytes. An all-zero page is a valid empty page (a freshly
/// created drive). Returns the entries and whether the page is damaged (then they are unknown).
pub(crate) fn decode_page(id: u64, bytes: &[u8]) -> (Entries, bool) {
    if bytes.iter().all(|&b| b == 0) {
        return (Entries::empty(), false);
    }
    let magic = u32::from_le_bytes(bytes[0..4].try_into().expect("4 bytes"));
    let index = u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes"));
    let crc = u32::from_le_bytes(bytes[12..16].try_into().expect("4 bytes"));
    if magic != MAGIC || u64::from(index) != id || crc != page_crc(bytes) {
        return (Entries::empty(), true);
    }
    let entries = Entries::empty();
    for (i, e) in entries.0.iter().enumerate() {
        e.store(u32::from_le_bytes(bytes[16 + 4 * i..20 + 4 * i].try_into().expect("4 bytes")), Relaxed);
    }
    // (The unused tail of a drive's last page reads as unwritten: that page never counts as
    // all written, which only costs write-backs.)
    entries.1.store(entries.all_written(ENTRIES), SeqCst);
    (entries, false)
}

#[cfg(test)]
mod tests {
    use stria_dev::IoBytes;
    use stria_dev::mem::MemDevice;

    use super::*;

    const BLOCKS: u64 = 5000; // five pages, the last one partial

    async fn write_back(t: &ChecksumTable, dev: &MemDevice) {
        let pages = t.take_dirty();
        let mut buf = vec![0u8; BLOCK];
        for (id, page) in &pages {
            let all_written = t.encode_page(*id, page.page(), &mut buf);
            ChecksumTable::before_write_back(page.page(), all_written);
            dev.write(id * BLOCK_BYTES, IoBytes::copy_from(&buf), false).await.unwrap();
            ChecksumTable::after_write_back(page.page(), all_written);
        }
    }

    async fn entry(t: &ChecksumTable, dev: &MemDevice, block: u64) -> Entry {
        t.pin(dev, block, 1).await.unwrap().get(block)
    }

    #[tokio::test]
    async fn a_page_counts_as_written_on_disk_only_once_a_fully_written_snapshot_is_back() {
        let dev = MemDevice::new("csum", 8 * BLOCK_BYTES);
        let t = ChecksumTable::new(BLOCKS, 0);
        let whole = vec![7u8; BLOCK * CSUM_ENTRIES_PER_PAGE as usize];
        let pin = t.pin(&dev, 0, CSUM_ENTRIES_PER_PAGE).await.unwrap();
        assert!(!pin.written_on_disk(), "a fresh page marks its blocks unwritten on disk");
        t.set_from_data(&pin, 0, &whole);
        assert!(!pin.written_on_disk(), "written in memory only");
        drop(pin);
        write_back(&t, &dev).await;
        let pin = t.pin(&dev, 5, 1).await.unwrap();
        assert!(pin.written_on_disk());
        // A trim puts an unwritten entry in the next snapshot: the flag drops when it is written.
        t.clear(&pin, 5, 1);
        assert!(pin.written_on_disk(), "the drive's copy still marks it written");
        drop(pin);
        write_back(&t, &dev).await;
        assert!(!t.pin(&dev, 5, 1).await.unwrap().written_on_disk());
        // Read back from the drive (a new table: nothing cached), the flag comes from the page.
        let fresh = ChecksumTable::new(BLOCKS, 0);
        assert!(!fresh.pin(&dev, 0, 1).await.unwrap().written_on_disk());
        let pin = t.pin(&dev, 5, 1).await.unwrap();
        t.set_from_data(&pin, 5, &whole[..BLOCK]);
        drop(pin);
        write_back(&t, &dev).await;
        let fresh = ChecksumTable::new(BLOCKS, 0);
        assert!(fresh.pin(&dev, 0, 1).await.unwrap().written_on_disk());
        assert!(!fresh.pin(&dev, 4000, 1).await.unwrap().written_on_disk(), "the partial last page never is");
    }

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

    #[tokio::test]
    async fn dirty_pages_round_trip_through_the_drive() {
        let dev = MemDevice::new("csum", 8 * BLOCK_BYTES);
        let t = ChecksumTable::new(BLOCKS, 0);
        let pin = t.pin(&dev, 0, BLOCKS).await.unwrap();
        assert!(pin.all_unwritten(0, BLOCKS), "a zeroed table is all unwritten");
        t.set_values(&pin, 3, &[77]);
        t.set_values(&pin, 2500, &[99, 98]);
        t.set_values(&pin, 4999, &[5]);
        drop(pin);
        let dirty: Vec<u64> = t.take_dirty().iter().map(|(id, _)| *id).collect();
        assert_eq!(dirty, vec![0, 2, 4]);
        assert!(t.take_dirty().is_empty(), "taking clears the set");
        t.set_values(&t.pin(&dev, 3, 1).await.unwrap(), 3, &[77]);
        assert!(t.take_dirty().is_empty(), "an unchanged entry does not dirty its page");
        // As after a failed write-back: the pages go back in the dirty set.
        let pin = t.pin(&dev, 0, BLOCKS).await.unwrap();
        t.redirty(&[0, 2, 4].map(|p| (p, Arc::clone(pin.slot(p * CSUM_ENTRIES_PER_PAGE).0))));
        drop(pin);
        // Write everything back, then read it with a fresh table.
        write_back(&t, &dev).await;
        let fresh = ChecksumTable::new(BLOCKS, 0);
        let pin = fresh.pin(&dev, 0, BLOCKS).await.unwrap();
        assert_eq!(
            [3, 2500, 2501, 4999, 4].map(|b| pin.get(b)),
            [Entry::Crc(77), Entry::Crc(99), Entry::Crc(98), Entry::Crc(5), Entry::Unwritten]
        );
    }

    #[tokio::test]
    async fn only_clean_unheld_pages_are_evicted() {
        let dev = MemDevice::new("csum", 8 * BLOCK_BYTES);
        let t = ChecksumTable::new(BLOCKS, 0);
        t.set_budget(2);
        for p in 0..5 {
            let _ = entry(&t, &dev, p * CSUM_ENTRIES_PER_PAGE).await;
        }
        assert_eq!(t.stats().resident_pages, 2, "clean pages beyond the budget are dropped");
        // Three dirty pages and one held page: none of them may go.
        for p in 0..3 {
            let b = p * CSUM_ENTRIES_PER_PAGE;
            t.set_values(&t.pin(&dev, b, 1).await.unwrap(), b, &[1000 + p as u32]);
        }
        let held = t.pin(&dev, 3 * CSUM_ENTRIES_PER_PAGE, 1).await.unwrap();
        let _ = entry(&t, &dev, 4 * CSUM_ENTRIES_PER_PAGE).await;
        assert!(t.stats().resident_pages >= 4, "{:?}", t.stats());
        assert!(t.over_budget(), "dirty pages over the budget ask for a write-back");
        write_back(&t, &dev).await;
        drop(held);
        t.trim();
        assert!(t.stats().resident_pages <= 2, "written back, they can go: {:?}", t.stats());
        assert!(!t.over_budget());
        // What was evicted comes back from the drive.
        for p in 0..3 {
            assert_eq!(entry(&t, &dev, p * CSUM_ENTRIES_PER_PAGE).await, Entry::Crc(1000 + p as u32));
        }
        assert!(t.stats().evicted_pages > 0 && t.stats().loaded_pages > 5);
    }

    /// A load that read a page must not cache it over a newer version another request loaded,
    /// changed, wrote back and saw evicted meanwhile (its thread descheduled between its read
    /// and its insert): the blocks that request wrote would read as corrupt.
    #[tokio::test]
    async fn a_slow_load_does_not_cache_a_page_older_than_one_written_back_meanwhile() {
        let dev = MemDevice::new("csum", 8 * BLOCK_BYTES);
        let t = Arc::new(ChecksumTable::new(BLOCKS, 0));
        t.set_budget(1);
        // Page 1 is on the drive and not cached.
        let b = CSUM_ENTRIES_PER_PAGE + 3;
        t.set_values(&t.pin(&dev, b, 1).await.unwrap(), b, &[11]);
        write_back(&t, &dev).await;
        let _ = entry(&t, &dev, 0).await;
        assert_eq!(t.stats().resident_pages, 1);
        let dev = Arc::new(dev);
        t.load_hold.arm();
        let slow = tokio::spawn({
            let (t, dev) = (Arc::clone(&t), Arc::clone(&dev));
            async move { t.pin(&*dev, b, 1).await.unwrap().get(b) }
        });
        while !t.load_hold.is_held() {
            tokio::task::yield_now().await;
        }
        // Meanwhile another write of the page's block: loaded, set, written back, evicted.
        t.set_values(&t.pin(&*dev, b, 1).await.unwrap(), b, &[22]);
        write_back(&t, &dev).await;
        let _ = entry(&t, &dev, 0).await;
        assert_eq!(t.stats().resident_pages, 1, "page 1 was evicted");
        t.load_hold.open();
        let seen = slow.await.unwrap();
        assert!(seen == Entry::Crc(22), "the slow load saw {seen:?}");
        assert_eq!(entry(&t, &dev, b).await, Entry::Crc(22), "the table keeps the newer checksum");
    }

    #[tokio::test]
    async fn a_damaged_page_is_unknown_until_repaired_and_never_written_back() {
        let dev = MemDevice::new("csum", 8 * BLOCK_BYTES);
        let t = ChecksumTable::new(BLOCKS, 0);
        t.set_values(&t.pin(&dev, 1021, 1).await.unwrap(), 1021, &[42]);
        write_back(&t, &dev).await;
        let mut bytes = vec![0u8; BLOCK];
        dev.read_at(BLOCK_BYTES, &mut bytes);
        bytes[100] ^= 4;
        dev.write_at(BLOCK_BYTES, &bytes);

        let t = ChecksumTable::new(BLOCKS, 0);
        t.set_budget(1);
        let pin = t.pin(&dev, 1020, 2).await.unwrap();
        assert_eq!((pin.get(1020), pin.get(1021)), (Entry::Unknown, Entry::Unknown));
        assert!(!pin.all_unwritten(1020, 1), "an unknown block is not known to be unwritten");
        t.set_values(&pin, 1021, &[43]);
        drop(pin);
        assert!(t.take_dirty().is_empty(), "a damaged page is not written back");
        assert_eq!(t.take_damaged(), vec![1]);
        assert!(t.take_damaged().is_empty(), "reported once");
        for p in [0, 2, 3, 4] {
            let _ = entry(&t, &dev, p * CSUM_ENTRIES_PER_PAGE).await;
        }
        assert_eq!(entry(&t, &dev, 1021).await, Entry::Unknown, "a damaged page is never evicted");
        t.mark_repaired(&[1]);
        assert_eq!(entry(&t, &dev, 1021).await, Entry::Crc(43));
        assert_eq!(t.take_dirty().iter().map(|(id, _)| *id).collect::<Vec<_>>(), vec![1]);
        assert_eq!(t.stats().damaged_pages, 1);
    }

    #[tokio::test]
    async fn a_page_of_another_index_is_damaged() {
        let dev = MemDevice::new("csum", 8 * BLOCK_BYTES);
        let t = ChecksumTable::new(BLOCKS, 0);
        t.set_values(&t.pin(&dev, 1, 1).await.unwrap(), 1, &[5]);
        write_back(&t, &dev).await;
        let mut bytes = vec![0u8; BLOCK];
        dev.read_at(0, &mut bytes);
        dev.write_at(2 * BLOCK_BYTES, &bytes);
        let t = ChecksumTable::new(BLOCKS, 0);
        assert_eq!(entry(&t, &dev, 2 * CSUM_ENTRIES_PER_PAGE + 1).await, Entry::Unknown);
        assert_eq!(entry(&t, &dev, 1).await, Entry::Crc(5));
    }

    #[tokio::test]
    #[should_panic(expected = "set of 3 entries from block 4999 outside the table of 5000 blocks")]
    async fn setting_past_the_table_is_a_bug() {
        let dev = MemDevice::new("csum", 8 * BLOCK_BYTES);
        let t = ChecksumTable::new(BLOCKS, 0);
        let pin = t.pin(&dev, 4999, 1).await.unwrap();
        t.clear(&pin, 4999, 3);
    }

    #[tokio::test]
    #[should_panic(expected = "checksums are set for whole blocks")]
    async fn checksums_of_part_of_a_block_are_a_bug() {
        let dev = MemDevice::new("csum", 8 * BLOCK_BYTES);
        let t = ChecksumTable::new(BLOCKS, 0);
        let pin = t.pin(&dev, 0, 2).await.unwrap();
        t.set_from_data(&pin, 0, &[1u8; BLOCK + 512]);
    }
}
