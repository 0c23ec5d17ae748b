//! The out bitmap of one drive (format §4a, docs/design/delta-resync.md): while some other drive
//! of the pool is out, one bit per intent region records that the region was written, so that
//! the drive that comes back copies only those regions.
//!
//! A *generation* names the outage: the bits mean something only on a drive whose every page
//! carries the generation that a failed drive's record names. Bits only accumulate; a generation
//! closes in memory when no drive is out any more, and its pages stay on disk, unreferenced.
//!
//! A region's state moves CLEAR → MARKING → SET; a writer skips the page write only when it sees
//! SET, which is stored after the page is durable, so no data reaches a region before its bit.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering::SeqCst};

use stria_dev::{BLOCK_USIZE as BLOCK, BlockDevice, DevError, IoBuf, IoBytes};

use crate::format::layout::{INTENT_REGION_BLOCKS, OUT_BITS_PER_PAGE, OUT_OFFSET_BYTES, OUT_PAGES_MAX};
use crate::format::page_crc;

const MAGIC: u32 = 0x5354_4F42;
const BITS_AT: usize = 24;

const CLEAR: u8 = 0;
const MARKING: u8 = 1;
const SET: u8 = 2;

/// Per-region out state of one drive.
#[derive(Debug)]
pub(crate) struct OutMap {
    /// The open generation (0: none).
    generation: AtomicU64,
    /// The generation could not be written to every page: the drive does not have it (it is no
    /// source of a delta) and writes stop marking.
    broken: AtomicBool,
    state: Box<[AtomicU8]>,
    /// Serialises page writes.
    pages_lock: tokio::sync::Mutex<()>,
}

impl OutMap {
    /// A map of `regions` regions with no generation, whose pages may use the first
    /// `metadata_offset` bytes of the drive from [`OUT_OFFSET_BYTES`]. A drive too large for the
    /// gap (or whose layout leaves no gap) never gets one: every delta through it is a full copy.
    pub(crate) fn new(regions: u64, metadata_offset: u64) -> OutMap {
        let n = usize::try_from(regions).expect("region count fits");
        let gap_pages = (metadata_offset.saturating_sub(OUT_OFFSET_BYTES) / BLOCK as u64).min(OUT_PAGES_MAX);
        OutMap {
            generation: AtomicU64::new(0),
            broken: AtomicBool::new(regions.div_ceil(OUT_BITS_PER_PAGE).max(1) > gap_pages),
            state: (0..n).map(|_| AtomicU8::new(CLEAR)).collect(),
            pages_lock: tokio::sync::Mutex::new(()),
        }
    }

    fn pages(&self) -> u64 {
        (self.state.len() as u64).div_ceil(OUT_BITS_PER_PAGE).max(1)
    }

    /// The generation this drive has: open in memory and written to every page.
    pub(crate) fn generation(&self) -> Option<u64> {
        let g = self.generation.load(SeqCst);
        (g != 0 && !self.broken.load(SeqCst)).then_some(g)
    }

    /// Reads the pages; returns the generation they all carry (if they do), with its bits
    /// loaded. Nothing is open until [`OutMap::adopt`].
    pub(crate) async fn load<D: BlockDevice>(&self, dev: &D) -> Result<Option<u64>, DevError> {
        if self.broken.load(SeqCst) {
            return Ok(None);
        }
        let pages = self.pages();
        let buf = dev.read(OUT_OFFSET_BYTES, IoBuf::zeroed(pages as usize * BLOCK)).await?;
        let mut found = None;
        for (i, page) in buf.chunks_exact(BLOCK).enumerate() {
            let field = |at: usize| u32::from_le_bytes(page[at..at + 4].try_into().expect("4 bytes"));
            let generation = u64::from_le_bytes(page[16..24].try_into().expect("8 bytes"));
            let valid = field(0) == MAGIC
                && u64::from(field(4)) == i as u64
                && field(12) == page_crc(page)
                && generation != 0
                && found.is_none_or(|g| g == generation);
            if !valid {
                return Ok(None);
            }
            found = Some(generation);
        }
        for (r, state) in self.state.iter().enumerate() {
            let (page, bit) = (r / OUT_BITS_PER_PAGE as usize, r % OUT_BITS_PER_PAGE as usize);
            let byte = buf[page * BLOCK + BITS_AT + bit / 8];
            state.store(if byte & (1 << (bit % 8)) != 0 { SET } else { CLEAR }, SeqCst);
        }
        Ok(found)
    }

    /// After [`OutMap::load`] found `loaded`: keeps it open when it is the generation the pool's
    /// records name (`open`), else forgets the bits.
    pub(crate) fn adopt(&self, loaded: Option<u64>, open: Option<u64>) {
        match (loaded, open) {
            (Some(l), Some(o)) if l == o => self.generation.store(l, SeqCst),
            _ => self.close(),
        }
    }

    /// Opens generation `g` in memory (the bits of another generation are dropped first).
    /// Callers seed it *after* this returns: a writer that began before this store is in flight
    /// and seen by the seeding; one after sees the generation and marks its own region.
    pub(crate) fn open(&self, g: u64) {
        assert_ne!(g, 0, "generation 0 means none");
        if self.generation.load(SeqCst) != g {
            for s in self.state.iter() {
                s.store(CLEAR, SeqCst);
            }
            self.generation.store(g, SeqCst);
        }
    }

    /// Marks region `r` of the open generation in memory, to be written by [`OutMap::persist`].
    pub(crate) fn seed(&self, r: u64) {
        if let Some(s) = self.state.get(r as usize) {
            let _ = s.compare_exchange(CLEAR, MARKING, SeqCst, SeqCst);
        }
    }

    /// Writes every page of the open generation; on failure the drive does not have it.
    pub(crate) async fn persist<D: BlockDevice>(&self, dev: &D) -> Result<(), DevError> {
        let Some(g) = self.generation() else { return Ok(()) };
        let _pages = self.pages_lock.lock().await;
        let all: Vec<u64> = (0..self.pages()).collect();
        match self.write_pages(dev, g, &all).await {
            Ok(()) => {
                for s in self.state.iter() {
                    let _ = s.compare_exchange(MARKING, SET, SeqCst, SeqCst);
                }
                Ok(())
            }
            Err(e) => {
                self.broken.store(true, SeqCst);
                Err(e)
            }
        }
    }

    /// Closes the generation in memory: writes stop marking.
    pub(crate) fn close(&self) {
        self.generation.store(0, SeqCst);
        for s in self.state.iter() {
            s.store(CLEAR, SeqCst);
        }
    }

    /// Makes sure the regions of `count` blocks from `first_block` are durably marked before a
    /// write into them, while a generation is open.
    pub(crate) async fn mark<D: BlockDevice>(
        &self,
        dev: &D,
        first_block: u64,
        count: u64,
    ) -> Result<(), DevError> {
        let Some(g) = self.generation() else { return Ok(()) };
        let regions = first_block / INTENT_REGION_BLOCKS..=(first_block + count - 1) / INTENT_REGION_BLOCKS;
        if regions.clone().all(|r| self.state[r as usize].load(SeqCst) == SET) {
            return Ok(());
        }
        let _pages = self.pages_lock.lock().await;
        if self.generation() != Some(g) {
            // Closed or broken meanwhile: nothing to keep.
            return Ok(());
        }
        let mut pages = Vec::new();
        for r in regions.clone() {
            if self.state[r as usize].load(SeqCst) != SET {
                self.state[r as usize].store(MARKING, SeqCst);
                let page = r / OUT_BITS_PER_PAGE;
                if pages.last() != Some(&page) {
                    pages.push(page);
                }
            }
        }
        if let Err(e) = self.write_pages(dev, g, &pages).await {
            self.broken.store(true, SeqCst);
            return Err(e);
        }
        for r in regions {
            let _ = self.state[r as usize].compare_exchange(MARKING, SET, SeqCst, SeqCst);
        }
        Ok(())
    }

    /// True when region `r` is marked in the open generation (durably or about to be).
    pub(crate) fn is_marked(&self, r: u64) -> bool {
        self.state.get(r as usize).is_none_or(|s| s.load(SeqCst) != CLEAR)
    }

    /// Number of regions marked.
    #[cfg(test)]
    pub(crate) fn marked(&self) -> u64 {
        self.state.iter().filter(|s| s.load(SeqCst) != CLEAR).count() as u64
    }

    async fn write_pages<D: BlockDevice>(&self, dev: &D, g: u64, pages: &[u64]) -> Result<(), DevError> {
        for &page in pages {
            let mut block = vec![0u8; BLOCK];
            block[0..4].copy_from_slice(&MAGIC.to_le_bytes());
            block[4..8].copy_from_slice(&u32::try_from(page).expect("page fits").to_le_bytes());
            block[16..24].copy_from_slice(&g.to_le_bytes());
            let first = page * OUT_BITS_PER_PAGE;
            let last = (first + OUT_BITS_PER_PAGE).min(self.state.len() as u64);
            for r in first..last {
                if self.state[r as usize].load(SeqCst) != CLEAR {
                    let i = (r - first) as usize;
                    block[BITS_AT + i / 8] |= 1 << (i % 8);
                }
            }
            let crc = page_crc(&block);
            block[12..16].copy_from_slice(&crc.to_le_bytes());
            dev.write(OUT_OFFSET_BYTES + page * BLOCK as u64, IoBytes::copy_from(&block), true).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stria_dev::mem::MemDevice;

    #[tokio::test]
    async fn marks_survive_a_reload_only_under_their_generation() {
        let dev = MemDevice::new("o", 64 << 20);
        let map = OutMap::new(100, 1 << 20);
        assert_eq!(map.load(&dev).await.unwrap(), None, "a fresh device has no generation");
        map.open(7);
        map.seed(3);
        map.persist(&dev).await.unwrap();
        map.mark(&dev, 50 * INTENT_REGION_BLOCKS + 10, 2).await.unwrap();
        assert_eq!(map.marked(), 2);

        let again = OutMap::new(100, 1 << 20);
        let loaded = again.load(&dev).await.unwrap();
        assert_eq!(loaded, Some(7));
        again.adopt(loaded, Some(7));
        assert!(again.is_marked(3) && again.is_marked(50) && !again.is_marked(4));
        assert_eq!(again.generation(), Some(7));

        let other = OutMap::new(100, 1 << 20);
        let loaded = other.load(&dev).await.unwrap();
        other.adopt(loaded, Some(8));
        assert_eq!((other.generation(), other.marked()), (None, 0), "another generation is not this one");
    }

    #[tokio::test]
    async fn a_damaged_page_means_no_generation() {
        let dev = MemDevice::new("o", 64 << 20);
        let map = OutMap::new(100, 1 << 20);
        map.open(9);
        map.persist(&dev).await.unwrap();
        dev.write_at(OUT_OFFSET_BYTES + 100, &[1u8; 8]);
        assert_eq!(OutMap::new(100, 1 << 20).load(&dev).await.unwrap(), None);
    }

    #[tokio::test]
    async fn with_no_generation_open_writes_mark_nothing() {
        let dev = MemDevice::new("o", 64 << 20);
        let map = OutMap::new(100, 1 << 20);
        map.mark(&dev, 0, 1).await.unwrap();
        assert_eq!(map.marked(), 0);
        map.open(5);
        map.mark(&dev, 0, 1).await.unwrap();
        map.close();
        map.mark(&dev, INTENT_REGION_BLOCKS, 1).await.unwrap();
        assert_eq!(map.marked(), 0);
    }
}
