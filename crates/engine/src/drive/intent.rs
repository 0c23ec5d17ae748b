//! The write-intent bitmap of one drive (format §4).
//!
//! A region's bit is durably set before any write into it, and cleared only when the region has
//! no write in flight and every write into it has been covered by a completed flush. After an
//! unclean stop, the set bits bound where data, checksums, copies and parity may disagree.
//!
//! Writers and the clearer meet through three per-region atomics (state, in-flight count, epoch
//! of the last completed write) in a Dekker-style handshake: a writer increments `inflight` and
//! then reads `state`; the clearer moves `state` away from DIRTY and then reads `inflight`. With
//! sequentially consistent ordering at least one of them sees the other, so a bit is never
//! cleared under a write that skipped setting it.

use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering::SeqCst};

use stria_dev::{BLOCK_USIZE as BLOCK, BlockDevice, DevError, IoBytes};

use crate::format::layout::{INTENT_BITS_PER_PAGE, INTENT_REGION_BLOCKS};
use crate::format::page_crc;

const MAGIC: u32 = 0x5354_4942;
const BITS_BYTES: usize = 4080;

const CLEAN: u8 = 0;
const DIRTY: u8 = 1;
const CLEARING: u8 = 2;

/// Per-region write-intent state of one drive.
#[derive(Debug)]
pub(crate) struct IntentMap {
    state: Box<[AtomicU8]>,
    inflight: Box<[AtomicU32]>,
    last_write_epoch: Box<[AtomicU64]>,
    /// The bitmap as it is on disk; the lock also serialises bitmap page writes.
    image: tokio::sync::Mutex<Vec<u8>>,
    /// Flush epoch: incremented when a flush starts.
    epoch: AtomicU64,
    /// Epoch of the newest completed flush.
    durable_epoch: AtomicU64,
    offset_bytes: u64,
}

impl IntentMap {
    /// An all-clean map of `regions` regions whose bitmap starts at `offset_bytes`.
    pub(crate) fn new(regions: u64, offset_bytes: u64) -> IntentMap {
        let n = usize::try_from(regions).expect("region count fits");
        let pages = regions.div_ceil(INTENT_BITS_PER_PAGE) as usize;
        IntentMap {
            state: (0..n).map(|_| AtomicU8::new(CLEAN)).collect(),
            inflight: (0..n).map(|_| AtomicU32::new(0)).collect(),
            last_write_epoch: (0..n).map(|_| AtomicU64::new(0)).collect(),
            image: tokio::sync::Mutex::new(vec![0u8; pages * BITS_BYTES]),
            epoch: AtomicU64::new(1),
            durable_epoch: AtomicU64::new(0),
            offset_bytes,
        }
    }

    /// Number of bitmap pages.
    pub(crate) fn pages(&self) -> u64 {
        (self.state.len() as u64).div_ceil(INTENT_BITS_PER_PAGE)
    }

    /// Loads page `page` from disk; returns the regions it marks dirty. A damaged page marks
    /// every region it covers (they are all resynchronised).
    pub(crate) fn load_page(&mut self, page: u64, bytes: &[u8]) -> Vec<u64> {
        let first = page * INTENT_BITS_PER_PAGE;
        let last = (first + INTENT_BITS_PER_PAGE).min(self.state.len() as u64);
        let valid = bytes.iter().all(|&b| b == 0) || {
            let magic = u32::from_le_bytes(bytes[0..4].try_into().expect("4 bytes"));
            let index = u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes"));
            let crc = u32::from_le_bytes(bytes[12..16].try_into().expect("4 bytes"));
            magic == MAGIC && u64::from(index) == page && crc == page_crc(bytes)
        };
        let image = self.image.get_mut();
        let mut dirty = Vec::new();
        for r in first..last {
            let i = (r - first) as usize;
            let set = if valid { bytes[16 + i / 8] & (1 << (i % 8)) != 0 } else { true };
            if set {
                dirty.push(r);
                self.state[r as usize].store(DIRTY, SeqCst);
                image[(r / 8) as usize] |= 1 << (r % 8);
            }
        }
        dirty
    }

    /// Regions covering `count` blocks from `first_block`.
    fn regions(first_block: u64, count: u64) -> std::ops::RangeInclusive<u64> {
        debug_assert!(count > 0);
        first_block / INTENT_REGION_BLOCKS..=(first_block + count - 1) / INTENT_REGION_BLOCKS
    }

    /// Declares a write to `count` blocks from `first_block`: makes sure their regions are
    /// durably marked dirty before returning. Must be paired with [`IntentMap::end`].
    pub(crate) async fn begin<D: BlockDevice>(
        &self,
        dev: &D,
        first_block: u64,
        count: u64,
    ) -> Result<(), DevError> {
        let regions = Self::regions(first_block, count);
        let mut need_mark = false;
        for r in regions.clone() {
            self.inflight[r as usize].fetch_add(1, SeqCst);
            need_mark |= self.state[r as usize].load(SeqCst) != DIRTY;
        }
        if !need_mark {
            return Ok(());
        }
        let mut image = self.image.lock().await;
        let mut pages = Vec::new();
        let mut newly = Vec::new();
        for r in regions.clone() {
            if self.state[r as usize].load(SeqCst) != DIRTY {
                image[(r / 8) as usize] |= 1 << (r % 8);
                newly.push(r);
                let page = r / INTENT_BITS_PER_PAGE;
                if pages.last() != Some(&page) {
                    pages.push(page);
                }
            }
        }
        if let Err(e) = self.write_pages(dev, &image, &pages).await {
            for r in regions {
                self.inflight[r as usize].fetch_sub(1, SeqCst);
            }
            return Err(e);
        }
        for r in newly {
            self.state[r as usize].store(DIRTY, SeqCst);
        }
        Ok(())
    }

    /// Ends a write declared with [`IntentMap::begin`] (after its checksum entries are set),
    /// whether it succeeded or not.
    pub(crate) fn end(&self, first_block: u64, count: u64) {
        let epoch = self.epoch.load(SeqCst);
        for r in Self::regions(first_block, count) {
            self.last_write_epoch[r as usize].fetch_max(epoch, SeqCst);
            let before = self.inflight[r as usize].fetch_sub(1, SeqCst);
            // An end without its begin would let the bit be cleared under a write in flight.
            assert!(before > 0, "intent region {r}: write ended twice or never began");
        }
    }

    /// Holds the regions of `count` blocks from `first_block` as if a write were in flight there
    /// (rule R2, docs/design/delta-resync.md): their bits are not cleared, and an out generation
    /// opened meanwhile seeds them. Paired with [`IntentMap::release`].
    pub(crate) fn hold(&self, first_block: u64, count: u64) {
        for r in Self::regions(first_block, count) {
            if let Some(n) = self.inflight.get(r as usize) {
                n.fetch_add(1, SeqCst);
            }
        }
    }

    /// Ends a [`IntentMap::hold`].
    pub(crate) fn release(&self, first_block: u64, count: u64) {
        for r in Self::regions(first_block, count) {
            if let Some(n) = self.inflight.get(r as usize) {
                let before = n.fetch_sub(1, SeqCst);
                assert!(before > 0, "intent region {r}: hold released twice");
            }
        }
    }

    /// Regions with a write (or a hold) in flight or their bit set: what an out generation
    /// opened now must start with.
    pub(crate) fn busy_regions(&self) -> Vec<u64> {
        (0..self.state.len())
            .filter(|&r| self.inflight[r].load(SeqCst) > 0 || self.state[r].load(SeqCst) != CLEAN)
            .map(|r| r as u64)
            .collect()
    }

    /// Starts a flush: returns its epoch.
    pub(crate) fn flush_started(&self) -> u64 {
        self.epoch.fetch_add(1, SeqCst) + 1
    }

    /// Records that the flush with epoch `epoch` completed (data and checksum pages durable).
    pub(crate) fn flush_completed(&self, epoch: u64) {
        self.durable_epoch.fetch_max(epoch, SeqCst);
    }

    /// Number of regions whose bit is set.
    pub(crate) fn dirty_regions(&self) -> u64 {
        self.state.iter().filter(|s| s.load(SeqCst) != CLEAN).count() as u64
    }

    /// The regions whose bit is set.
    pub(crate) fn dirty_list(&self) -> Vec<u64> {
        (0..self.state.len() as u64).filter(|&r| self.state[r as usize].load(SeqCst) != CLEAN).collect()
    }

    /// Clears the bits of regions with nothing in flight whose last write is covered by a
    /// completed flush. With `force_all`, a region need only be idle (used right after a flush
    /// when the pool closes cleanly, or after recovery resynchronised it).
    pub(crate) async fn clear_idle<D: BlockDevice>(&self, dev: &D, force_all: bool) -> Result<u64, DevError> {
        let durable = self.durable_epoch.load(SeqCst);
        let mut image = self.image.lock().await;
        let mut cleared = Vec::new();
        let mut pages = Vec::new();
        for (r, state) in self.state.iter().enumerate() {
            if state.compare_exchange(DIRTY, CLEARING, SeqCst, SeqCst).is_err() {
                continue;
            }
            let idle = self.inflight[r].load(SeqCst) == 0;
            let covered = self.last_write_epoch[r].load(SeqCst) < durable;
            if idle && (covered || force_all) {
                image[r / 8] &= !(1 << (r % 8));
                cleared.push(r);
                let page = r as u64 / INTENT_BITS_PER_PAGE;
                if pages.last() != Some(&page) {
                    pages.push(page);
                }
            } else {
                state.store(DIRTY, SeqCst);
            }
        }
        let result = self.write_pages(dev, &image, &pages).await;
        for &r in &cleared {
            // On a failed write the bits may still be set on disk: keep them dirty in memory too.
            self.state[r].store(if result.is_ok() { CLEAN } else { DIRTY }, SeqCst);
        }
        result.map(|()| cleared.len() as u64)
    }

    /// Writes bitmap pages `pages` (sorted) from `image`, with FUA.
    async fn write_pages<D: BlockDevice>(
        &self,
        dev: &D,
        image: &[u8],
        pages: &[u64],
    ) -> Result<(), DevError> {
        for &page in pages {
            let mut block = vec![0u8; BLOCK];
            block[0..4].copy_from_slice(&MAGIC.to_le_bytes());
            block[4..8].copy_from_slice(&u32::try_from(page).expect("page fits").to_le_bytes());
            let bits = &image[page as usize * BITS_BYTES..(page as usize + 1) * BITS_BYTES];
            block[16..].copy_from_slice(bits);
            let crc = page_crc(&block);
            block[12..16].copy_from_slice(&crc.to_le_bytes());
            dev.write(self.offset_bytes + page * BLOCK as u64, IoBytes::copy_from(&block), true).await?;
        }
        Ok(())
    }
}
