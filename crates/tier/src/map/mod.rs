//! The block map of a log-structured volume (docs/design/log-structured-volumes.md, "The map"):
//! logical 4 KiB block -> where it lives, with its CRC32C and write sequence, stored on a
//! mirrored engine volume as 4 KiB pages and cached with a bound; changes are logged as small
//! deltas in batches (group commit) and reach the pages at checkpoints, so a 4 KiB host write
//! costs about 24 bytes of log, not a 4 KiB page rewrite.
//!
//! Region of the backing volume (byte offsets from `base`):
//!
//! | offset | size | what |
//! |---|---|---|
//! | 0 | 4096 | log header: where replay starts |
//! | 4096 | `log_blocks` x 4096 | log ring |
//! | 4096 x (1 + `log_blocks`) | `pages` x 4096 | map pages, page `p` covers blocks `255p ..` |
//!
//! Crash rules (docs/crash-consistency.md, "Map"):
//! 1. An update is applied in memory and queued, then made durable by a log write (FUA); the
//!    caller learns it is durable when [`MapStore::update`] returns. Whoever frees the place an
//!    update moved a block away from does so only after that.
//! 2. Deltas are assignments, applied in log order: replaying a delta a page already holds is
//!    harmless, so a checkpoint may write pages holding changes newer than its log position.
//! 3. A checkpoint writes every page dirtied up to its log position and flushes the volume
//!    before the header moves replay past those deltas. It holds the log only to read that
//!    position and take the dirty pages: updates and log writes go on while it writes them
//!    (their deltas land past the position, and the ring never overwrites a block replay needs).
//! 4. A page written by a checkpoint holds no change whose delta is not durable yet: such
//!    changes are undone in the bytes written (each queued delta keeps the entry it replaced).
//!    So the pages on disk are always a state the durable log leads to, and a table written by
//!    the last checkpoint stays valid while the next one writes pages (see [`CheckpointTable`]).

mod checkpoint;
mod commit;
mod format;
#[doc(hidden)]
pub mod fuzzing;
mod runs;
mod snap;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use stria_dev::{BLOCK_BYTES, BLOCK_USIZE, BlockDevice, IoBuf, IoBytes};
use stria_engine::pagecache::{PageCache, PageCacheStats, Slot};
use stria_engine::{Volume, VolumeError};

use checkpoint::undo_map;
use format::{
    DELTA_BYTES, LOG_HEADER_BYTES, decode_header, decode_log_block, decode_owned_page, decode_page,
    encode_header, encode_log_block, encode_page,
};
pub use runs::{MAX_RUNS, Runs};
use snap::POOL_KEY;
pub use snap::{DeleteStats, HEAD_LAYER, PoolLayout};

/// Map entries per page.
pub const ENTRIES_PER_PAGE: u64 = 255;
/// Most scheduler passes a commit waits for more deltas to join its log block.
const GROUP_YIELDS: usize = 16;
/// Stripes of the page load locks.
const LOAD_STRIPES: usize = 256;
/// Page reads in flight for one [`MapStore::get_many`] or [`MapStore::update`].
const READ_AHEAD: usize = 32;
/// Most consecutive dirty pages a checkpoint writes in one write.
const WRITE_BACK_RUN: u64 = 64;
/// Checkpoint writes in flight.
const WRITE_BACK_DEPTH: usize = 32;
/// A writer waits for a checkpoint only when the cache holds this many pages more than its
/// budget per 4 of budget (or the log ring is full); checkpoints start at half the ring or
/// half the budget dirty, so one normally finishes before either bound is reached.
const HARD_OVER_QUARTERS: u64 = 1;
/// Deltas per log block.
pub const DELTAS_PER_LOG_BLOCK: usize = (BLOCK_USIZE - LOG_HEADER_BYTES) / DELTA_BYTES;

/// Where a logical block lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Place {
    /// Never written, or trimmed: reads as zeros, holds no space.
    Unallocated,
    /// Written as zeros: reads as zeros, holds no space.
    Zero,
    /// A position in the write cache.
    Cache(u64),
    /// A block of the segment space.
    Segment(u64),
}

/// One map entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapEntry {
    pub place: Place,
    /// CRC32C of the block's contents (0 for places without data).
    pub crc: u32,
    /// The write sequence that produced it, low 32 bits.
    pub seq: u32,
}

impl MapEntry {
    /// The entry of a block never written.
    pub const UNALLOCATED: MapEntry = MapEntry { place: Place::Unallocated, crc: 0, seq: 0 };
}

/// A change to one block: set `entry`, if the block's entry is `expect` (when given).
#[derive(Debug, Clone, Copy)]
pub struct Update {
    pub block: u64,
    pub entry: MapEntry,
    /// Apply only if the block still has this entry (a move that a newer write must win over).
    /// The whole entry, not only its place: a place freed and written again between a move's
    /// read and its update holds other data, with another checksum and sequence number.
    pub expect: Option<MapEntry>,
}

/// Why a map operation failed.
#[derive(Debug, thiserror::Error)]
pub enum MapError {
    #[error("map: {0}")]
    Volume(#[from] VolumeError),
    #[error("map page {page} is damaged (bad magic, index or CRC)")]
    DamagedPage { page: u64 },
    #[error("map block {block} is beyond the map of {blocks} blocks")]
    OutOfRange { block: u64, blocks: u64 },
    #[error("the map log header is damaged: replay cannot know where to start")]
    DamagedHeader,
    #[error("an earlier map log write failed: no update can be made durable any more")]
    Failed,
    #[error("snapshot metadata: {0}")]
    Layers(String),
    /// A layer that is deleted or gone: an update of a clone being deleted (a write that raced
    /// the clone's delete: nothing was applied), or a read of a snapshot or clone deleted
    /// before or under it. The rest of the family goes on.
    #[error("layer {layer} is deleted")]
    LayerGone { layer: u16 },
    #[error(
        "the snapshot page pool is full ({needed} pages needed, {free} free): it holds the copies of map pages that snapshots and clones own (writes to pages already copied still work); deleting snapshots or clones frees pages"
    )]
    PoolFull { needed: u64, free: u64 },
    /// A snapshot or clone delete stopped between two of its batches because the volume is
    /// closing: what it did is durable, and the next open finishes it.
    #[error(
        "the delete stopped between two batches because the volume is closing; its next open finishes it"
    )]
    Stopped,
}

/// Where the map lives in its backing volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapLayout {
    /// Byte offset of the region in the backing volume.
    pub base: u64,
    /// Blocks of the log ring (at least 4).
    pub log_blocks: u64,
    /// Logical blocks mapped.
    pub blocks: u64,
    /// The layer table and page pool of snapshots (format version 3), if the map has them.
    pub pool: Option<PoolLayout>,
    /// Where the head pages lie when they are not right after the log ring (a map that grew:
    /// log volume format 4).
    pub head: Option<Runs>,
}

impl MapLayout {
    /// Pages the map needs.
    pub fn pages(&self) -> u64 {
        self.blocks.div_ceil(ENTRIES_PER_PAGE)
    }

    /// Bytes of the region.
    pub fn bytes(&self) -> u64 {
        (1 + self.log_blocks + self.pages()) * BLOCK_BYTES
    }

    /// Byte offset in the backing volume where the last thing of the map ends (the region, or
    /// the snapshot pool when it lies after it).
    pub fn end(&self) -> u64 {
        let ring = self.base + (1 + self.log_blocks) * BLOCK_BYTES;
        let head = match &self.head {
            Some(runs) => runs.spans(self.pages()).iter().map(|s| s.1).max().unwrap_or(ring),
            None => self.base + self.bytes(),
        };
        ring.max(head).max(self.pool.map_or(0, |p| p.end()))
    }

    fn log_block_offset(&self, ring_index: u64) -> u64 {
        self.base + (1 + ring_index % self.log_blocks) * BLOCK_BYTES
    }

    fn page_offset(&self, page: u64) -> u64 {
        match &self.head {
            Some(runs) => runs.offset(page),
            None => self.base + (1 + self.log_blocks + page) * BLOCK_BYTES,
        }
    }

    /// How many head pages from `page` on (at most `most`) lie one after another.
    fn head_contiguous(&self, page: u64, most: u64) -> u64 {
        self.head.as_ref().map_or(most, |r| r.contiguous(page, most))
    }

    /// Whether the page cached under `key + 1` lies right after the one under `key`.
    fn key_follows(&self, key: u64) -> bool {
        if key & POOL_KEY != 0 {
            self.pool.is_some_and(|p| p.contiguous(key & !POOL_KEY, 2) == 2)
        } else {
            self.head_contiguous(key, 2) == 2
        }
    }

    /// Where the page cached under `key` lives: a head page, or a pool page (`POOL_KEY | n`).
    fn key_offset(&self, key: u64) -> u64 {
        if key & POOL_KEY != 0 {
            self.pool.expect("pool pages need a pool").page_offset(key & !POOL_KEY)
        } else {
            self.page_offset(key)
        }
    }
}

/// A cached page and its index (taken for write-back, or held for an update).
type DirtyPage = (u64, Arc<Slot<MapPage>>);

/// Head pages are cached under their index, pool pages under `POOL_KEY | n`: an update through
/// the wrong one would change a layer it does not mean to.
fn assert_head_page(page: u64, slot: &Slot<MapPage>) {
    let mp = slot.page();
    assert!(
        mp.page == page && mp.owner() == 0,
        "map: the page cached for head page {page} is layer {}'s copy of page {}",
        mp.owner(),
        mp.page
    );
}

/// The entries of one cached page: a head page, or a snapshot's copy of head page `page` in
/// the pool (`owner` = the snapshot's layer id; 0 for head pages).
#[derive(Debug)]
struct MapPage {
    entries: parking_lot::Mutex<Box<[MapEntry]>>,
    /// Changes when a snapshot delete hands a copy to an older snapshot.
    owner: std::sync::atomic::AtomicU16,
    page: u64,
}

impl MapPage {
    fn head(page: u64, entries: Box<[MapEntry]>) -> MapPage {
        MapPage { entries: parking_lot::Mutex::new(entries), owner: 0.into(), page }
    }

    fn owner(&self) -> u16 {
        self.owner.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// Counters.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct MapStats {
    pub cache: PageCacheStats,
    /// Log blocks written (each one FUA write).
    pub log_blocks_written: u64,
    /// Deltas logged.
    pub deltas_logged: u64,
    /// Checkpoints done, and map pages they wrote.
    pub checkpoints: u64,
    pub pages_written: u64,
    /// Updates that waited for a checkpoint (log ring full, or the cache a quarter over its
    /// budget with dirty pages).
    pub checkpoint_waits: u64,
    /// Deltas replayed at open.
    pub deltas_replayed: u64,
    /// Head pages copied into snapshots before their first change (since open).
    pub pages_preserved: u64,
    /// Of those, copied into the next older snapshot while the newest was being deleted.
    pub pages_preserved_past_a_delete: u64,
}

/// The counters the log, replay and checkpoints keep (the rest of [`MapStats`] is read where
/// it lives).
#[derive(Debug, Default, Clone, Copy)]
struct LogCounts {
    log_blocks_written: u64,
    deltas_logged: u64,
    checkpoints: u64,
    pages_written: u64,
    checkpoint_waits: u64,
    deltas_replayed: u64,
}

/// A change applied in memory whose log write is not done.
#[derive(Debug, Clone, Copy)]
struct Delta {
    /// The layer whose page changed: 0 for the head, else a snapshot's id.
    layer: u16,
    /// The cache key of the page changed (a head page index, or `POOL_KEY | pool page`).
    key: u64,
    block: u64,
    entry: MapEntry,
    /// What the block held before: a checkpoint writes this while the delta is not durable.
    before: MapEntry,
    /// A preserve record (the other fields unused): `preserve.0`'s copy of head page
    /// `preserve.1` is pool page `preserve.2`, with table page `preserve.3` made for it (or 0).
    preserve: Option<(u16, u64, u32, u32)>,
    /// A table record of a snapshot delete (the other fields unused).
    table_op: Option<snap::TableOp>,
}

impl Delta {
    fn entry(layer: u16, key: u64, block: u64, entry: MapEntry, before: MapEntry) -> Delta {
        Delta { layer, key, block, entry, before, preserve: None, table_op: None }
    }

    /// Its log record: the block field (the layer in the top 16 bits) and 16 bytes.
    fn record(&self) -> (u64, [u8; 16]) {
        if let Some((layer, page, pool, table)) = self.preserve {
            return snap::encode_preserve(layer, page, pool, table);
        }
        if let Some(op) = self.table_op {
            return snap::encode_table_op(op);
        }
        // The layer rides in the top 16 bits: a larger block would change the layer replay sees.
        assert!(
            self.block <= snap::BLOCK_MASK && u64::from(self.layer) < snap::CONTROL_TAG,
            "map log: block {} of layer {} does not fit a log record",
            self.block,
            self.layer
        );
        let mut b = [0u8; 16];
        self.entry.encode(&mut b);
        (u64::from(self.layer) << 48 | self.block, b)
    }
}

/// Deltas applied in memory and not yet durable (queued, or being written to the log).
#[derive(Debug, Default)]
struct Pending {
    /// Oldest first: they are logged in this order, the order they were applied in. A delta
    /// leaves only once the log write that carries it is done.
    deltas: std::collections::VecDeque<Delta>,
    /// Number of deltas ever queued (the queue's end, as a count).
    queued: u64,
    /// The copies of queued preserves, kept cached until their record is durable (the record's
    /// log write writes them first, from memory).
    copies: std::collections::HashMap<u32, Arc<Slot<MapPage>>>,
}

impl Pending {
    fn push(&mut self, d: Delta) {
        self.deltas.push_back(d);
        self.queued += 1;
    }
}

/// The log's position (held by the one writer at a time).
#[derive(Debug)]
struct LogState {
    /// Sequence number of the next log block, and the ring index it goes to.
    next_seq: u64,
    /// Sequence of the first block replay must read (all before it are in the pages).
    replay_seq: u64,
    /// Deltas (as a count of queued ones) that are durable.
    durable: u64,
}

/// A table written with every checkpoint (the segment table of a log-structured volume), stamped
/// with the new replay position, once the pages are durable and before the header moves there
/// (deltas logged meanwhile are past that position, so open replays them over the table). The
/// last one stays valid while the next checkpoint writes pages, since pages hold only durable
/// changes (rule 4): docs/crash-consistency.md, "Map checkpoint and the segment table".
pub trait CheckpointTable: Send + Sync {
    /// Offset and bytes of the table for a checkpoint whose replay starts at `stamp`.
    fn snapshot(&self, stamp: u64) -> (u64, IoBytes);
}

/// The map of one log-structured volume.
pub struct MapStore<D: BlockDevice> {
    vol: Arc<Volume<D>>,
    /// Changes only when the map grows or shrinks ([`MapStore::resize`]) or its pool grows in
    /// a new run; `blocks` is its block count, read without the lock.
    layout: parking_lot::RwLock<MapLayout>,
    blocks: std::sync::atomic::AtomicU64,
    cache: PageCache<MapPage>,
    pending: parking_lot::Mutex<Pending>,
    log: tokio::sync::Mutex<LogState>,
    /// Set when a log write failed: deltas applied in memory may be neither durable nor
    /// queued any more, so nothing may be acknowledged after it.
    failed: std::sync::atomic::AtomicBool,
    /// Written with every checkpoint, once set.
    table: std::sync::OnceLock<Arc<dyn CheckpointTable>>,
    /// One checkpoint at a time. Lock order: this, then `log`.
    checkpointing: tokio::sync::Mutex<()>,
    /// Log blocks replay would read now (`next_seq - replay_seq`), readable without the log.
    ring_used: std::sync::atomic::AtomicU64,
    /// Set when a task runs checkpoints ([`MapStore::checkpoint_wanted`]); updates then only
    /// wake it, unless a bound is reached.
    background: std::sync::atomic::AtomicBool,
    wanted: tokio::sync::Notify,
    /// Loads of one page are serialised (page index modulo the stripes): a read started before
    /// another load of the same page was changed, written back and evicted would otherwise
    /// insert the page as it was before that change.
    loads: Box<[tokio::sync::Mutex<()>]>,
    /// Snapshots of the head (docs/design/snapshots.md).
    snap: snap::SnapState,
    stats_preserved: std::sync::atomic::AtomicU64,
    stats_preserved_past_delete: std::sync::atomic::AtomicU64,
    /// Counters (`MapStore::stats`), apart from the log so that status reads them without waiting.
    counts: parking_lot::Mutex<LogCounts>,
    /// Deltas durable so far (`LogState::durable`, readable without the log).
    durable_seen: std::sync::atomic::AtomicU64,
    /// Run before every log block write: makes durable the data the block's deltas may point
    /// at (write-back host writes, docs/design/log-structured-volumes.md).
    barrier: std::sync::OnceLock<Barrier>,
}

/// See [`MapStore::set_barrier`].
pub type Barrier =
    Arc<dyn Fn() -> futures::future::BoxFuture<'static, Result<(), VolumeError>> + Send + Sync>;

impl<D: BlockDevice> std::fmt::Debug for MapStore<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MapStore").field("layout", &self.layout()).finish()
    }
}

impl<D: BlockDevice> MapStore<D> {
    /// Opens the map in `layout` of `vol`: a region that reads as zeros is an empty map (so a
    /// new map costs no write), otherwise the log is replayed from the header's position. At
    /// most `cache_pages` pages stay cached (dirty ones until the next checkpoint).
    pub async fn open(
        vol: Arc<Volume<D>>,
        layout: MapLayout,
        cache_pages: u64,
    ) -> Result<MapStore<D>, MapError> {
        Self::open_with(vol, layout, cache_pages, |_, _| {}).await
    }

    /// Where replay starts: the log header's position (0 for a new map).
    pub async fn replay_position(vol: &Volume<D>, layout: MapLayout) -> Result<u64, MapError> {
        let header = vol.read(layout.base, BLOCK_USIZE).await?;
        if header.iter().all(|&b| b == 0) {
            return Ok(0);
        }
        decode_header(&header).ok_or(MapError::DamagedHeader)
    }

    /// [`MapStore::open`], calling `on_replay(block, new entry)` for every delta replayed, in
    /// log order.
    pub async fn open_with(
        vol: Arc<Volume<D>>,
        layout: MapLayout,
        cache_pages: u64,
        on_replay: impl FnMut(u64, &MapEntry),
    ) -> Result<MapStore<D>, MapError> {
        assert!(layout.log_blocks >= 4, "a map log needs at least 4 blocks");
        let replay_seq = Self::replay_position(&vol, layout).await?;
        let store = MapStore {
            vol,
            layout: parking_lot::RwLock::new(layout),
            blocks: layout.blocks.into(),
            cache: PageCache::new(cache_pages),
            pending: parking_lot::Mutex::new(Pending::default()),
            log: tokio::sync::Mutex::new(LogState { next_seq: replay_seq, replay_seq, durable: 0 }),
            counts: parking_lot::Mutex::new(LogCounts::default()),
            failed: std::sync::atomic::AtomicBool::new(false),
            table: std::sync::OnceLock::new(),
            checkpointing: tokio::sync::Mutex::new(()),
            ring_used: std::sync::atomic::AtomicU64::new(0),
            background: std::sync::atomic::AtomicBool::new(false),
            wanted: tokio::sync::Notify::new(),
            loads: (0..LOAD_STRIPES).map(|_| tokio::sync::Mutex::new(())).collect(),
            snap: snap::SnapState::new(layout.pages(), cache_pages, layout.pool),
            stats_preserved: std::sync::atomic::AtomicU64::new(0),
            stats_preserved_past_delete: std::sync::atomic::AtomicU64::new(0),
            durable_seen: std::sync::atomic::AtomicU64::new(0),
            barrier: std::sync::OnceLock::new(),
        };
        store.load_layers().await?;
        store.replay(on_replay).await?;
        Ok(store)
    }

    /// Writes `table` with every checkpoint from now on.
    pub fn set_checkpoint_table(&self, table: Arc<dyn CheckpointTable>) {
        assert!(self.table.set(table).is_ok(), "the checkpoint table is set once");
    }

    async fn replay(&self, mut on_replay: impl FnMut(u64, &MapEntry)) -> Result<(), MapError> {
        let mut log = self.log.lock().await;
        let mut seq = log.replay_seq;
        while seq < log.replay_seq + self.layout().log_blocks {
            let bytes = self.vol.read(self.layout().log_block_offset(seq), BLOCK_USIZE).await?;
            let Some(records) = decode_log_block(&bytes, seq) else { break };
            for (field, raw) in records {
                match snap::decode_record(field, &raw) {
                    Some(snap::Record::Entry { layer: 0, block, entry }) => {
                        on_replay(block, &entry);
                        let (page, slot) = self.page_of(block).await?;
                        slot.page().entries.lock()[(block % ENTRIES_PER_PAGE) as usize] = entry;
                        self.cache.mark_dirty(page, &slot);
                        self.counts.lock().deltas_replayed += 1;
                    }
                    Some(snap::Record::Entry { layer, block, entry }) => {
                        if self.replay_snapshot_entry(layer, block, entry).await? {
                            on_replay(block, &entry);
                            self.counts.lock().deltas_replayed += 1;
                        }
                    }
                    Some(snap::Record::Preserve { layer, page, pool, table }) => {
                        self.replay_preserve(layer, page, pool, table).await?;
                    }
                    Some(snap::Record::Table(op)) => {
                        self.apply_table_op(op, Some(seq)).await?;
                    }
                    None => {
                        return Err(MapError::Layers(format!(
                            "log block {seq} holds a record this build does not know"
                        )));
                    }
                }
            }
            seq += 1;
        }
        log.next_seq = seq;
        self.note_ring(&log);
        Ok(())
    }

    fn note_ring(&self, log: &LogState) {
        self.ring_used.store(log.next_seq - log.replay_seq, std::sync::atomic::Ordering::Relaxed);
    }

    /// Logical blocks mapped.
    pub fn blocks(&self) -> u64 {
        self.blocks.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Where the map lives now.
    pub fn layout(&self) -> MapLayout {
        *self.layout.read()
    }

    /// The entry of `block`.
    pub async fn get(&self, block: u64) -> Result<MapEntry, MapError> {
        let (_, slot) = self.page_of(block).await?;
        let entry = slot.page().entries.lock()[(block % ENTRIES_PER_PAGE) as usize];
        Ok(entry)
    }

    /// The entries of `blocks`, their pages read [`READ_AHEAD`] at a time on misses.
    pub async fn get_many(&self, blocks: &[u64]) -> Result<Vec<MapEntry>, MapError> {
        if let [block] = blocks {
            // One block (a 4 KiB read): one page lookup, none of the lists below.
            return Ok(vec![self.get(*block).await?]);
        }
        let slots = self.pages_of(blocks).await?;
        Ok(blocks
            .iter()
            .zip(slots)
            .map(|(b, (_, slot))| slot.page().entries.lock()[(b % ENTRIES_PER_PAGE) as usize])
            .collect())
    }

    /// The cached pages holding `blocks`, in order: the resident ones found under one look at
    /// the cache, the others read [`READ_AHEAD`] at a time.
    async fn pages_of(&self, blocks: &[u64]) -> Result<Vec<DirtyPage>, MapError> {
        let total = self.blocks();
        if let Some(&block) = blocks.iter().find(|&&b| b >= total) {
            return Err(MapError::OutOfRange { block, blocks: total });
        }
        let pages: Vec<u64> = blocks.iter().map(|b| b / ENTRIES_PER_PAGE).collect();
        let mut found = self.cache.lookup_each(&pages);
        for (&page, slot) in pages.iter().zip(&found) {
            if let Some(slot) = slot {
                assert_head_page(page, slot);
            }
        }
        // The misses: `page_of` reads them (and checks what it finds).
        let missing: Vec<usize> = (0..blocks.len()).filter(|&i| found[i].is_none()).collect();
        for chunk in missing.chunks(READ_AHEAD) {
            let reads = futures::future::join_all(chunk.iter().map(|&i| self.page_of(blocks[i]))).await;
            for (&i, read) in chunk.iter().zip(reads) {
                found[i] = Some(read?.1);
            }
        }
        Ok(pages
            .into_iter()
            .zip(found)
            .map(|(page, slot)| (page, slot.expect("found or read above")))
            .collect())
    }

    /// The cached page holding `block` (read from the volume on a miss).
    async fn page_of(&self, block: u64) -> Result<(u64, Arc<Slot<MapPage>>), MapError> {
        let blocks = self.blocks();
        if block >= blocks {
            return Err(MapError::OutOfRange { block, blocks });
        }
        let page = block / ENTRIES_PER_PAGE;
        let head = |slot: Arc<Slot<MapPage>>| {
            assert_head_page(page, &slot);
            Ok((page, slot))
        };
        if let Some(Some(slot)) = self.cache.lookup(page, 1).pop() {
            return head(slot);
        }
        let _loading = self.loads[(page % LOAD_STRIPES as u64) as usize].lock().await;
        if let Some(Some(slot)) = self.cache.lookup(page, 1).pop() {
            return head(slot);
        }
        let bytes = self.vol.read(self.layout().page_offset(page), BLOCK_USIZE).await?;
        let entries = decode_page(page, &bytes).ok_or(MapError::DamagedPage { page })?;
        let (slot, _) = self.cache.insert(vec![(page, MapPage::head(page, entries), false)]).remove(0);
        Ok((page, slot))
    }

    /// Applies `updates` in order (each conditional one only if its block still lives where
    /// it expects) and makes the applied ones durable. Returns, per update, the entry it
    /// replaced, or `None` when its condition failed. Concurrent callers share log writes
    /// (group commit).
    ///
    /// With snapshots, an overwrite's result is [`MapEntry::UNALLOCATED`] when the newest
    /// snapshot still holds the entry it replaced (its place must not be freed), and a move
    /// changes every layer holding the place it moves (docs/design/snapshots.md, "Holders").
    pub async fn update(&self, updates: &[Update]) -> Result<Vec<Option<MapEntry>>, MapError> {
        let (applied, ticket) = self.apply(updates).await?;
        self.commit(ticket).await?;
        self.after_update().await?;
        Ok(applied)
    }

    /// [`MapStore::update`] without waiting for the deltas to be durable: applied and queued,
    /// with the ticket [`MapStore::commit_to`] takes (write-back host writes).
    pub async fn update_queued(&self, updates: &[Update]) -> Result<(Vec<Option<MapEntry>>, u64), MapError> {
        let (applied, ticket) = self.apply(updates).await?;
        if self.failed.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(MapError::Failed);
        }
        self.after_update().await?;
        Ok((applied, ticket))
    }

    /// Applies `updates` in memory and queues their deltas; returns what each replaced (`None`
    /// where a condition did not hold) and the ticket of the last delta.
    async fn apply(&self, updates: &[Update]) -> Result<(Vec<Option<MapEntry>>, u64), MapError> {
        let blocks: Vec<u64> = updates.iter().map(|u| u.block).collect();
        let gate = self.snap.gate.read().await;
        let slots = self.pages_of(&blocks).await?;
        let mut pins = Vec::new();
        let applied = loop {
            let needs = {
                let mut pending = self.pending.lock();
                let mut layers = self.snap.layers.lock();
                if layers.has_snapshots() {
                    match self.apply_with_snapshots(&mut pending, &mut layers, updates, &slots)? {
                        Ok(applied) => break (applied, pending.queued),
                        Err(needs) => needs,
                    }
                } else {
                    drop(layers);
                    let mut applied = Vec::with_capacity(updates.len());
                    for (u, (page, slot)) in updates.iter().zip(&slots) {
                        let mut entries = slot.page().entries.lock();
                        let at = (u.block % ENTRIES_PER_PAGE) as usize;
                        let before = entries[at];
                        let ok = u.expect.is_none_or(|e| before == e);
                        if ok {
                            entries[at] = u.entry;
                            drop(entries);
                            self.cache.mark_dirty(*page, slot);
                            pending.push(Delta::entry(0, *page, u.block, u.entry, before));
                        }
                        applied.push(ok.then_some(before));
                    }
                    break (applied, pending.queued);
                }
            };
            pins.extend(self.load_needs(needs).await?);
        };
        drop(pins);
        drop(slots);
        drop(gate);
        Ok(applied)
    }

    /// Makes every delta up to `ticket` durable ([`MapStore::update_queued`]).
    pub async fn commit_to(&self, ticket: u64) -> Result<(), MapError> {
        self.commit(ticket).await
    }

    /// The ticket of the newest delta queued.
    pub fn queued_ticket(&self) -> u64 {
        self.pending.lock().queued
    }

    /// Deltas durable so far.
    pub fn durable_ticket(&self) -> u64 {
        self.durable_seen.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Sets the barrier run before every log block write (once).
    pub fn set_barrier(&self, barrier: Barrier) {
        let _ = self.barrier.set(barrier);
    }

    /// Calls `f(first block, entries)` for every page in order, cached pages as they are in
    /// memory (replay may have changed them), others read in runs without being cached, so a
    /// scan does not flush the cache.
    pub async fn scan(&self, mut f: impl FnMut(u64, &[MapEntry])) -> Result<(), MapError> {
        const RUN: u64 = 64;
        let layout = self.layout();
        let pages = layout.pages();
        let mut first = 0;
        while first < pages {
            let n = layout.head_contiguous(first, RUN.min(pages - first));
            let cached = self.cache.lookup(first, n);
            let mut disk: Option<IoBuf> = None;
            if cached.iter().any(Option::is_none) {
                let len = (n * BLOCK_BYTES) as usize;
                disk = Some(self.vol.read(layout.page_offset(first), len).await?);
            }
            for (k, c) in cached.into_iter().enumerate() {
                let page = first + k as u64;
                match c {
                    Some(slot) => f(page * ENTRIES_PER_PAGE, &slot.page().entries.lock()),
                    None => {
                        let buf = disk.as_ref().expect("read above");
                        let bytes = &buf[k * BLOCK_USIZE..(k + 1) * BLOCK_USIZE];
                        let entries = decode_page(page, bytes).ok_or(MapError::DamagedPage { page })?;
                        f(page * ENTRIES_PER_PAGE, &entries);
                    }
                }
            }
            first += n;
        }
        Ok(())
    }

    /// Counters.
    pub fn stats(&self) -> MapStats {
        let c = *self.counts.lock();
        MapStats {
            cache: self.cache.stats(),
            log_blocks_written: c.log_blocks_written,
            deltas_logged: c.deltas_logged,
            checkpoints: c.checkpoints,
            pages_written: c.pages_written,
            checkpoint_waits: c.checkpoint_waits,
            deltas_replayed: c.deltas_replayed,
            pages_preserved: self.stats_preserved.load(std::sync::atomic::Ordering::Relaxed),
            pages_preserved_past_a_delete: self
                .stats_preserved_past_delete
                .load(std::sync::atomic::Ordering::Relaxed),
        }
    }
}
