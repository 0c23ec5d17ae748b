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

#[doc(hidden)]
pub mod fuzzing;
mod snap;

use std::sync::Arc;

use stria_dev::{BLOCK_BYTES, BLOCK_USIZE, BlockDevice, IoBuf, IoBytes};
use stria_engine::pagecache::{PageCache, PageCacheStats, Slot};
use stria_engine::{Volume, VolumeError};

use snap::POOL_KEY;
pub use snap::{DeleteStats, HEAD_LAYER, PoolLayout};

/// Map entries per page.
pub const ENTRIES_PER_PAGE: u64 = 255;
const PAGE_MAGIC: u32 = u32::from_le_bytes(*b"SMAP");
const LOG_MAGIC: u32 = u32::from_le_bytes(*b"SMLG");
const HEADER_MAGIC: u32 = u32::from_le_bytes(*b"SMLH");
const DELTA_BYTES: usize = 24;
/// Most scheduler passes a commit waits for more deltas to join its log block.
const GROUP_YIELDS: usize = 16;
const LOG_HEADER_BYTES: usize = 32;
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

const POSITION_MASK: u64 = (1 << 62) - 1;

impl Place {
    fn encode(self) -> u64 {
        match self {
            Place::Unallocated => 0,
            Place::Zero => 1 << 62,
            Place::Cache(p) => 2 << 62 | (p & POSITION_MASK),
            Place::Segment(p) => 3 << 62 | (p & POSITION_MASK),
        }
    }

    fn decode(raw: u64) -> Place {
        let at = raw & POSITION_MASK;
        match raw >> 62 {
            0 => Place::Unallocated,
            1 => Place::Zero,
            2 => Place::Cache(at),
            _ => Place::Segment(at),
        }
    }
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

    fn encode(self, out: &mut [u8]) {
        out[0..8].copy_from_slice(&self.place.encode().to_le_bytes());
        out[8..12].copy_from_slice(&self.crc.to_le_bytes());
        out[12..16].copy_from_slice(&self.seq.to_le_bytes());
    }

    fn decode(b: &[u8]) -> MapEntry {
        MapEntry {
            place: Place::decode(u64::from_le_bytes(b[0..8].try_into().expect("8 bytes"))),
            crc: u32::from_le_bytes(b[8..12].try_into().expect("4 bytes")),
            seq: u32::from_le_bytes(b[12..16].try_into().expect("4 bytes")),
        }
    }
}

/// A change to one block: set `entry`, if the block's place is `expect` (when given).
#[derive(Debug, Clone, Copy)]
pub struct Update {
    pub block: u64,
    pub entry: MapEntry,
    /// Apply only if the block still lives here (a move that a newer write must win over).
    pub expect: Option<Place>,
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
    #[error(
        "the snapshot page pool is full ({needed} pages needed, {free} free): it holds the copies of map pages that snapshots and clones own (writes to pages already copied still work); deleting snapshots or clones frees pages"
    )]
    PoolFull { needed: u64, free: u64 },
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
        let region = self.base + self.bytes();
        self.pool.map_or(region, |p| region.max(p.layers_at + p.bytes()))
    }

    fn log_block_offset(&self, ring_index: u64) -> u64 {
        self.base + (1 + ring_index % self.log_blocks) * BLOCK_BYTES
    }

    fn page_offset(&self, page: u64) -> u64 {
        self.base + (1 + self.log_blocks + page) * BLOCK_BYTES
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
    stats: MapStats,
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
    layout: MapLayout,
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
}

impl<D: BlockDevice> std::fmt::Debug for MapStore<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MapStore").field("layout", &self.layout).finish()
    }
}

fn page_crc(page: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&page[..8]), &page[12..])
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
            layout,
            cache: PageCache::new(cache_pages),
            pending: parking_lot::Mutex::new(Pending::default()),
            log: tokio::sync::Mutex::new(LogState {
                next_seq: replay_seq,
                replay_seq,
                durable: 0,
                stats: MapStats::default(),
            }),
            failed: std::sync::atomic::AtomicBool::new(false),
            table: std::sync::OnceLock::new(),
            checkpointing: tokio::sync::Mutex::new(()),
            ring_used: std::sync::atomic::AtomicU64::new(0),
            background: std::sync::atomic::AtomicBool::new(false),
            wanted: tokio::sync::Notify::new(),
            loads: (0..LOAD_STRIPES).map(|_| tokio::sync::Mutex::new(())).collect(),
            snap: snap::SnapState::new(layout.pages(), cache_pages, layout.pool),
            stats_preserved: std::sync::atomic::AtomicU64::new(0),
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
        while seq < log.replay_seq + self.layout.log_blocks {
            let bytes = self.vol.read(self.layout.log_block_offset(seq), BLOCK_USIZE).await?;
            let Some(records) = decode_log_block(&bytes, seq) else { break };
            for (field, raw) in records {
                match snap::decode_record(field, &raw) {
                    Some(snap::Record::Entry { layer: 0, block, entry }) => {
                        on_replay(block, &entry);
                        let (page, slot) = self.page_of(block).await?;
                        slot.page().entries.lock()[(block % ENTRIES_PER_PAGE) as usize] = entry;
                        self.cache.mark_dirty(page, &slot);
                        log.stats.deltas_replayed += 1;
                    }
                    Some(snap::Record::Entry { layer, block, entry }) => {
                        if self.replay_snapshot_entry(layer, block, entry).await? {
                            on_replay(block, &entry);
                            log.stats.deltas_replayed += 1;
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
        self.layout.blocks
    }

    /// The entry of `block`.
    pub async fn get(&self, block: u64) -> Result<MapEntry, MapError> {
        let (_, slot) = self.page_of(block).await?;
        let entry = slot.page().entries.lock()[(block % ENTRIES_PER_PAGE) as usize];
        Ok(entry)
    }

    /// The entries of `blocks`, their pages read [`READ_AHEAD`] at a time on misses.
    pub async fn get_many(&self, blocks: &[u64]) -> Result<Vec<MapEntry>, MapError> {
        let slots = self.pages_of(blocks).await?;
        Ok(blocks
            .iter()
            .zip(slots)
            .map(|(b, (_, slot))| slot.page().entries.lock()[(b % ENTRIES_PER_PAGE) as usize])
            .collect())
    }

    /// The cached pages holding `blocks`, in order, read [`READ_AHEAD`] at a time on misses.
    async fn pages_of(&self, blocks: &[u64]) -> Result<Vec<DirtyPage>, MapError> {
        let mut out = Vec::with_capacity(blocks.len());
        for chunk in blocks.chunks(READ_AHEAD) {
            let mut reads = Vec::with_capacity(chunk.len());
            for &b in chunk {
                reads.push(self.page_of(b));
            }
            for r in futures::future::join_all(reads).await {
                out.push(r?);
            }
        }
        Ok(out)
    }

    /// The cached page holding `block` (read from the volume on a miss).
    async fn page_of(&self, block: u64) -> Result<(u64, Arc<Slot<MapPage>>), MapError> {
        if block >= self.layout.blocks {
            return Err(MapError::OutOfRange { block, blocks: self.layout.blocks });
        }
        let page = block / ENTRIES_PER_PAGE;
        if let Some(Some(slot)) = self.cache.lookup(page, 1).pop() {
            return Ok((page, slot));
        }
        let _loading = self.loads[(page % LOAD_STRIPES as u64) as usize].lock().await;
        if let Some(Some(slot)) = self.cache.lookup(page, 1).pop() {
            return Ok((page, slot));
        }
        let bytes = self.vol.read(self.layout.page_offset(page), BLOCK_USIZE).await?;
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
        let blocks: Vec<u64> = updates.iter().map(|u| u.block).collect();
        let gate = self.snap.gate.read().await;
        let slots = self.pages_of(&blocks).await?;
        let mut pins = Vec::new();
        let (applied, ticket) = loop {
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
                        let ok = u.expect.is_none_or(|p| before.place == p);
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
        self.commit(ticket).await?;
        self.after_update().await?;
        Ok(applied)
    }

    /// Starts a checkpoint when one is due: wakes the checkpoint task, or (without one) runs it
    /// here unless one is running. Waits for one when the cache is past its hard bound.
    async fn after_update(&self) -> Result<(), MapError> {
        let stats = self.cache.stats();
        let hard = stats.budget_pages + stats.budget_pages * HARD_OVER_QUARTERS / 4;
        if self.cache.over_budget() && stats.resident_pages > hard {
            let _one = self.checkpointing.lock().await;
            self.log.lock().await.stats.checkpoint_waits += 1;
            if self.cache.over_budget() {
                self.write_back().await?;
            }
            return Ok(());
        }
        if self.due() {
            if self.background.load(std::sync::atomic::Ordering::Relaxed) {
                self.wanted.notify_one();
            } else if let Ok(_one) = self.checkpointing.try_lock() {
                self.write_back().await?;
            }
        }
        Ok(())
    }

    /// Whether a checkpoint should start: half the log ring is in use, half the cache budget
    /// is dirty, or the cache is over its budget with dirty pages.
    fn due(&self) -> bool {
        let budget = self.cache.stats().budget_pages;
        self.ring_used.load(std::sync::atomic::Ordering::Relaxed) >= self.layout.log_blocks / 2
            || self.cache.dirty_pages() >= budget.div_ceil(2)
            || self.cache.over_budget()
    }

    /// Hands checkpoints to a task that waits in [`MapStore::checkpoint_wanted`] and runs
    /// [`MapStore::checkpoint_if_due`]: updates then only wake it (they still wait for one when
    /// the log ring is full or the cache past its hard bound).
    pub fn checkpoint_in_background(&self) {
        self.background.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Returns when an update found a checkpoint due, or [`MapStore::wake_checkpoint_task`] was
    /// called (at once if either happened since the last call).
    pub async fn checkpoint_wanted(&self) {
        self.wanted.notified().await;
    }

    /// Wakes the task waiting in [`MapStore::checkpoint_wanted`] (to see that it should stop).
    pub fn wake_checkpoint_task(&self) {
        self.wanted.notify_one();
    }

    /// Runs a checkpoint if one is due and none is running; returns whether it ran one.
    pub async fn checkpoint_if_due(&self) -> Result<bool, MapError> {
        let Ok(_one) = self.checkpointing.try_lock() else { return Ok(false) };
        if !self.due() {
            return Ok(false);
        }
        self.write_back().await?;
        Ok(true)
    }

    /// Makes every delta queued up to `ticket` durable (group commit: one caller writes all
    /// that is queued, the others find theirs done).
    async fn commit(&self, ticket: u64) -> Result<(), MapError> {
        // Let the tasks that are ready queue their deltas first: one log block then carries
        // them all (a log block is a 4 KiB mirrored write, whatever it holds). Yield until two
        // passes in a row bring nothing (writers whose cache writes complete meanwhile join):
        // in stria-bench-wa (qd 16) a log block carried 6.6 deltas after one pass and 29 this
        // way, at the same IOPS (docs/design/log-structured-volumes.md, "Group commit").
        let (mut seen, mut idle) = (self.pending.lock().queued, 0);
        for _ in 0..GROUP_YIELDS {
            tokio::task::yield_now().await;
            let now = self.pending.lock().queued;
            idle = if now == seen { idle + 1 } else { 0 };
            if idle == 2 {
                break;
            }
            seen = now;
        }
        loop {
            let mut log = self.log.lock().await;
            if self.failed.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(MapError::Failed);
            }
            if log.durable >= ticket {
                return Ok(());
            }
            match self.write_pending(&mut log).await {
                Ok(true) => return Ok(()),
                Ok(false) => {
                    // The ring is full: replay needs every block in it. Wait for (or run) a
                    // checkpoint without holding the log, which it needs. What is still queued
                    // stays queued, in order, for whoever takes the log next.
                    log.stats.checkpoint_waits += 1;
                    drop(log);
                    let _one = self.checkpointing.lock().await;
                    if self.ring_used.load(std::sync::atomic::Ordering::Relaxed) >= self.layout.log_blocks {
                        self.write_back().await?;
                    }
                }
                Err(e) => {
                    self.failed.store(true, std::sync::atomic::Ordering::SeqCst);
                    return Err(e);
                }
            }
        }
    }

    /// Logs the queued deltas, oldest first, as many log blocks as the ring has room for.
    /// Returns whether the queue is empty (every delta queued so far is durable); `false` when
    /// the ring filled first.
    async fn write_pending(&self, log: &mut LogState) -> Result<bool, MapError> {
        let mut buf = IoBuf::zeroed(BLOCK_USIZE);
        loop {
            // The oldest deltas stay queued until their log block is written: only the holder of
            // the log removes them, and others only append.
            let (chunk, copies) = {
                let p = self.pending.lock();
                if p.deltas.is_empty() {
                    log.durable = p.queued;
                    return Ok(true);
                }
                if log.next_seq - log.replay_seq >= self.layout.log_blocks {
                    return Ok(false);
                }
                let chunk: Vec<(u64, [u8; 16])> =
                    p.deltas.iter().take(DELTAS_PER_LOG_BLOCK).map(Delta::record).collect();
                (chunk, self.preserved_copies(&p, DELTAS_PER_LOG_BLOCK))
            };
            let taken = chunk.len();
            // If this write fails the map is marked failed by the caller: nothing is acknowledged
            // after it, and no checkpoint writes a page any more. A preserve's copy is durable
            // before its record (replay takes the copy from its pool page).
            if !copies.is_empty() {
                let pl = self.layout.pool.expect("preserves need a pool");
                let writes = copies.into_iter().map(|(pool, bytes)| {
                    self.vol.write(pl.page_offset(u64::from(pool)), bytes.freeze(), true)
                });
                stria_engine::join_all_ok(writes).await?;
            }
            encode_log_block(log.next_seq, &chunk, &mut buf);
            let bytes = IoBytes::copy_from(&buf);
            self.vol.write(self.layout.log_block_offset(log.next_seq), bytes, true).await?;
            let logged = {
                let mut p = self.pending.lock();
                for d in p.deltas.drain(..taken).collect::<Vec<_>>() {
                    if let Some((_, _, pool, _)) = d.preserve {
                        p.copies.remove(&pool);
                    }
                }
                p.queued - p.deltas.len() as u64
            };
            log.next_seq += 1;
            log.stats.log_blocks_written += 1;
            log.stats.deltas_logged += chunk.len() as u64;
            log.durable = logged;
            self.note_ring(log);
        }
    }

    /// Makes every update applied so far durable, writes every dirty page and moves the replay
    /// position to where the log ended when the pages were taken.
    pub async fn checkpoint(&self) -> Result<(), MapError> {
        let queued = self.pending.lock().queued;
        self.commit(queued).await?;
        let _one = self.checkpointing.lock().await;
        self.write_back().await
    }

    /// One checkpoint (the caller holds `checkpointing`). Under the log: the position replay
    /// will start at (`until`, the next log block) and the dirty pages, which hold every delta
    /// logged before `until` (a delta is applied before it is queued). Without it: the pages
    /// written (rule 4) and flushed, the table written for `until`, then the header. Updates go
    /// on meanwhile; their deltas are logged at `until` or later.
    async fn write_back(&self) -> Result<(), MapError> {
        let (until, pages, layer_writes) = {
            let log = self.log.lock().await;
            if self.failed.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(MapError::Failed);
            }
            if log.next_seq == log.replay_seq && self.cache.dirty_pages() == 0 && !self.snap.dirty() {
                return Ok(());
            }
            // With `pending` held no update is between changing a page and queuing its delta,
            // so a preserve's copy and its table page are taken together (snapshot rule 7).
            let _applying = self.pending.lock();
            (log.next_seq, self.cache.take_dirty(), self.take_layer_writes())
        };
        let table = self.table.get();
        let result = async {
            // The table of the last checkpoint stays valid while pages are overwritten: they
            // hold only durable changes (rule 4), a state replay from its position leads to.
            self.write_pages(&pages).await?;
            self.vol.flush().await?;
            self.write_layer_writes(&layer_writes).await?;
            if let Some(t) = table {
                let (at, bytes) = t.snapshot(until);
                self.vol.write(at, bytes, true).await?;
            }
            let mut buf = IoBuf::zeroed(BLOCK_USIZE);
            encode_header(until, &mut buf);
            self.vol.write(self.layout.base, IoBytes::copy_from(&buf), true).await?;
            Ok::<(), MapError>(())
        }
        .await;
        if let Err(e) = result {
            self.cache.redirty(&pages);
            self.untake_layer_writes(&layer_writes);
            return Err(e);
        }
        self.layers_checkpointed(until);
        {
            let mut log = self.log.lock().await;
            log.replay_seq = until;
            log.stats.checkpoints += 1;
            log.stats.pages_written += pages.len() as u64;
            self.note_ring(&log);
        }
        drop(pages);
        self.cache.trim();
        Ok(())
    }

    /// Writes `pages` (sorted by index): runs of consecutive pages as one write of up to
    /// [`WRITE_BACK_RUN`] pages, [`WRITE_BACK_DEPTH`] writes in flight.
    async fn write_pages(&self, pages: &[DirtyPage]) -> Result<(), MapError> {
        // A snapshot's copy whose preserve record is not durable yet is left to that record's
        // log write (which writes it first) and to the next checkpoint: written here, it could
        // land after that write, older (snapshot rule 5).
        let pages: Vec<DirtyPage> = {
            let pending = self.pending.lock();
            let (later, now): (Vec<DirtyPage>, Vec<DirtyPage>) =
                pages.iter().cloned().partition(|(key, _)| {
                    key & POOL_KEY != 0 && pending.copies.contains_key(&((key & !POOL_KEY) as u32))
                });
            for (key, slot) in &later {
                self.cache.mark_dirty(*key, slot);
            }
            now
        };
        let pages = &pages[..];
        let mut runs: Vec<&[DirtyPage]> = Vec::new();
        let mut start = 0;
        for i in 1..=pages.len() {
            let ends =
                i == pages.len() || pages[i].0 != pages[i - 1].0 + 1 || (i - start) as u64 == WRITE_BACK_RUN;
            if ends {
                runs.push(&pages[start..i]);
                start = i;
            }
        }
        for group in runs.chunks(WRITE_BACK_DEPTH) {
            let (bufs, undone) = self.encode_durable(group);
            // A page written without a change must be written again once the change is durable.
            for (page, slot) in &undone {
                self.cache.mark_dirty(*page, slot);
            }
            let writes = group
                .iter()
                .zip(bufs)
                .map(|(run, buf)| self.vol.write(self.layout.key_offset(run[0].0), buf.freeze(), false));
            stria_engine::join_all_ok(writes).await?;
        }
        Ok(())
    }

    /// The bytes of the pages of `runs` (map rule 4: every change whose delta is not durable
    /// yet is undone, so a page written holds only changes the durable log leads to), and the
    /// pages that had such a change. Updates wait while it encodes.
    fn encode_durable(&self, runs: &[&[DirtyPage]]) -> (Vec<IoBuf>, Vec<DirtyPage>) {
        let pending = self.pending.lock();
        let (first, last) = (runs[0][0].0, runs[runs.len() - 1][runs[runs.len() - 1].len() - 1].0);
        // What each entry held before its oldest delta that is not durable, by (page key, slot).
        let undo = undo_map(&pending, 0, |key| (first..=last).contains(&key));
        let mut undone = Vec::new();
        let bufs = runs
            .iter()
            .map(|run| {
                let mut buf = IoBuf::zeroed(run.len() * BLOCK_USIZE);
                for (k, (key, slot)) in run.iter().enumerate() {
                    let out = &mut buf[k * BLOCK_USIZE..(k + 1) * BLOCK_USIZE];
                    let mp = slot.page();
                    let entries = mp.entries.lock();
                    let mut changes = undo.range((*key, 0)..(*key, ENTRIES_PER_PAGE)).peekable();
                    if changes.peek().is_none() {
                        encode_page(mp.owner(), mp.page, &entries, out);
                    } else {
                        let mut durable = entries.to_vec();
                        for ((_, at), before) in changes {
                            durable[*at as usize] = *before;
                        }
                        encode_page(mp.owner(), mp.page, &durable, out);
                        undone.push((*key, Arc::clone(slot)));
                    }
                }
                buf
            })
            .collect();
        (bufs, undone)
    }

    /// Calls `f(first block, entries)` for every page in order, cached pages as they are in
    /// memory (replay may have changed them), others read in runs without being cached, so a
    /// scan does not flush the cache.
    pub async fn scan(&self, mut f: impl FnMut(u64, &[MapEntry])) -> Result<(), MapError> {
        const RUN: u64 = 64;
        let pages = self.layout.pages();
        let mut first = 0;
        while first < pages {
            let n = RUN.min(pages - first);
            let cached = self.cache.lookup(first, n);
            let mut disk: Option<IoBuf> = None;
            if cached.iter().any(Option::is_none) {
                let len = (n * BLOCK_BYTES) as usize;
                disk = Some(self.vol.read(self.layout.page_offset(first), len).await?);
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
    pub async fn stats(&self) -> MapStats {
        let log = self.log.lock().await;
        MapStats {
            cache: self.cache.stats(),
            pages_preserved: self.stats_preserved.load(std::sync::atomic::Ordering::Relaxed),
            ..log.stats
        }
    }
}

/// What each entry held before its oldest change not durable yet, by (page key, slot), for the
/// pages `wanted` picks, counting the deltas of `pending` from index `from` on. A snapshot's
/// copy also undoes the head's changes queued before its preserve record (the copy has them;
/// they are durable only with the record).
fn undo_map(
    pending: &Pending,
    from: usize,
    wanted: impl Fn(u64) -> bool,
) -> std::collections::BTreeMap<(u64, u64), MapEntry> {
    // Queued preserves: head page -> (queue index, copy's key).
    let mut copies: std::collections::HashMap<u64, Vec<(usize, u64)>> = std::collections::HashMap::new();
    for (i, d) in pending.deltas.iter().enumerate().skip(from) {
        if let Some((_, page, pool, _)) = d.preserve {
            copies.entry(page).or_default().push((i, POOL_KEY | u64::from(pool)));
        }
    }
    let mut undo = std::collections::BTreeMap::new();
    for (i, d) in pending.deltas.iter().enumerate().skip(from) {
        if d.preserve.is_some() || d.table_op.is_some() {
            continue;
        }
        let at = d.block % ENTRIES_PER_PAGE;
        if wanted(d.key) {
            undo.entry((d.key, at)).or_insert(d.before);
        }
        if d.layer == 0 {
            for &(_, key) in copies.get(&d.key).into_iter().flatten().filter(|(j, _)| *j > i) {
                if wanted(key) {
                    undo.entry((key, at)).or_insert(d.before);
                }
            }
        }
    }
    undo
}

/// Encodes map page `page` of layer `owner` (0: the head; else a snapshot's copy of it).
fn encode_page(owner: u16, page: u64, entries: &[MapEntry], out: &mut [u8]) {
    out.fill(0);
    out[0..4].copy_from_slice(&PAGE_MAGIC.to_le_bytes());
    out[4..8].copy_from_slice(&u32::try_from(page).expect("page index fits in 32 bits").to_le_bytes());
    out[12..14].copy_from_slice(&owner.to_le_bytes());
    for (i, e) in entries.iter().enumerate() {
        e.encode(&mut out[16 + 16 * i..32 + 16 * i]);
    }
    let crc = page_crc(out);
    out[8..12].copy_from_slice(&crc.to_le_bytes());
}

/// The entries of page `page` from its bytes; all zeros is an empty page; `None` if damaged.
fn decode_page(page: u64, b: &[u8]) -> Option<Box<[MapEntry]>> {
    if b.iter().all(|&x| x == 0) {
        return Some(vec![MapEntry::UNALLOCATED; ENTRIES_PER_PAGE as usize].into_boxed_slice());
    }
    let magic = u32::from_le_bytes(b[0..4].try_into().expect("4 bytes"));
    let index = u32::from_le_bytes(b[4..8].try_into().expect("4 bytes"));
    let crc = u32::from_le_bytes(b[8..12].try_into().expect("4 bytes"));
    let owner = u16::from_le_bytes(b[12..14].try_into().expect("2 bytes"));
    if magic != PAGE_MAGIC || u64::from(index) != page || owner != 0 || crc != page_crc(b) {
        return None;
    }
    Some((0..ENTRIES_PER_PAGE as usize).map(|i| MapEntry::decode(&b[16 + 16 * i..32 + 16 * i])).collect())
}

/// A snapshot's copy of map page `page` from its bytes (never all zeros); `None` if it is not a
/// copy of that page. The owner written in it is not checked: a delete hands copies to older
/// snapshots, and a copy is rewritten with its new owner only at the next checkpoint.
fn decode_owned_page(page: u64, b: &[u8]) -> Option<Box<[MapEntry]>> {
    let magic = u32::from_le_bytes(b[0..4].try_into().expect("4 bytes"));
    let index = u32::from_le_bytes(b[4..8].try_into().expect("4 bytes"));
    let crc = u32::from_le_bytes(b[8..12].try_into().expect("4 bytes"));
    let found = u16::from_le_bytes(b[12..14].try_into().expect("2 bytes"));
    if magic != PAGE_MAGIC || u64::from(index) != page || found == 0 || crc != page_crc(b) {
        return None;
    }
    Some((0..ENTRIES_PER_PAGE as usize).map(|i| MapEntry::decode(&b[16 + 16 * i..32 + 16 * i])).collect())
}

fn encode_log_block(seq: u64, deltas: &[(u64, [u8; 16])], out: &mut [u8]) {
    out.fill(0);
    out[0..4].copy_from_slice(&LOG_MAGIC.to_le_bytes());
    out[4..6].copy_from_slice(&u16::try_from(deltas.len()).expect("fits").to_le_bytes());
    out[8..16].copy_from_slice(&seq.to_le_bytes());
    for (i, (block, e)) in deltas.iter().enumerate() {
        let at = LOG_HEADER_BYTES + DELTA_BYTES * i;
        out[at..at + 8].copy_from_slice(&block.to_le_bytes());
        out[at + 8..at + 24].copy_from_slice(e);
    }
    let crc = crc32c::crc32c_append(crc32c::crc32c(&out[..16]), &out[20..]);
    out[16..20].copy_from_slice(&crc.to_le_bytes());
}

/// The deltas of the log block expected to carry `seq`; `None` if it is not that block (stale
/// from an earlier lap of the ring, torn, or never written).
fn decode_log_block(b: &[u8], seq: u64) -> Option<Vec<(u64, [u8; 16])>> {
    let magic = u32::from_le_bytes(b[0..4].try_into().expect("4 bytes"));
    let count = usize::from(u16::from_le_bytes(b[4..6].try_into().expect("2 bytes")));
    let found = u64::from_le_bytes(b[8..16].try_into().expect("8 bytes"));
    let crc = u32::from_le_bytes(b[16..20].try_into().expect("4 bytes"));
    if magic != LOG_MAGIC
        || found != seq
        || count > DELTAS_PER_LOG_BLOCK
        || crc != crc32c::crc32c_append(crc32c::crc32c(&b[..16]), &b[20..])
    {
        return None;
    }
    Some(
        (0..count)
            .map(|i| {
                let at = LOG_HEADER_BYTES + DELTA_BYTES * i;
                let block = u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
                (block, b[at + 8..at + 24].try_into().expect("16 bytes"))
            })
            .collect(),
    )
}

fn encode_header(replay_seq: u64, out: &mut [u8]) {
    out.fill(0);
    out[0..4].copy_from_slice(&HEADER_MAGIC.to_le_bytes());
    out[8..16].copy_from_slice(&replay_seq.to_le_bytes());
    let crc = crc32c::crc32c(&out[..16]);
    out[16..20].copy_from_slice(&crc.to_le_bytes());
}

/// The replay position in a header block; `None` for a new (all-zero) or unreadable header.
fn decode_header(b: &[u8]) -> Option<u64> {
    let magic = u32::from_le_bytes(b[0..4].try_into().expect("4 bytes"));
    let crc = u32::from_le_bytes(b[16..20].try_into().expect("4 bytes"));
    (magic == HEADER_MAGIC && crc == crc32c::crc32c(&b[..16]))
        .then(|| u64::from_le_bytes(b[8..16].try_into().expect("8 bytes")))
}

#[cfg(test)]
mod tests {
    use stria_dev::mem::MemDevice;
    use stria_engine::{DriveClass, FoundDrive, Layout, NewDrive, Pool, VolumeRole, VolumeSpec};

    use super::*;

    fn entry(n: u64) -> MapEntry {
        MapEntry { place: Place::Segment(n), crc: n as u32 + 7, seq: n as u32 }
    }

    async fn pool_with_map_volume(layout: MapLayout) -> (Vec<Arc<MemDevice>>, Arc<Volume<Arc<MemDevice>>>) {
        let devs: Vec<Arc<MemDevice>> =
            (0..2).map(|i| Arc::new(MemDevice::new(&format!("m{i}"), 64 << 20))).collect();
        let vol = map_volume(&devs, layout).await;
        (devs, vol)
    }

    /// A mirrored volume for `layout` on a new pool of `devs`.
    async fn map_volume<D: BlockDevice + Clone>(devs: &[D], layout: MapLayout) -> Arc<Volume<D>> {
        let nd = devs
            .iter()
            .map(|d| NewDrive {
                dev: d.clone(),
                path: d.name().into(),
                class: DriveClass::Fast,
                domain: String::new(),
                fresh: true,
            })
            .collect();
        let pool = Pool::create("t", nd).await.unwrap();
        let spec = VolumeSpec {
            name: "map".into(),
            size_bytes: layout.end().next_multiple_of(64 << 10),
            layout: Layout::Raid1 { copies: 2 },
            chunk_bytes: 64 << 10,
            class: DriveClass::Fast,
            role: VolumeRole::Plain,
        };
        pool.create_volume(spec).await.unwrap()
    }

    /// A memory drive whose writes of more than one block without FUA wait while the gate is
    /// closed: a checkpoint's runs of consecutive pages (log blocks are single blocks written with
    /// FUA, and the engine's checksum pages that go with them single blocks too).
    #[derive(Clone)]
    struct WriteGate {
        dev: Arc<MemDevice>,
        closed: Arc<std::sync::atomic::AtomicBool>,
        opened: Arc<tokio::sync::Notify>,
    }

    impl BlockDevice for WriteGate {
        fn name(&self) -> &str {
            self.dev.name()
        }
        fn size_bytes(&self) -> u64 {
            self.dev.size_bytes()
        }
        fn read(
            &self,
            at: u64,
            buf: IoBuf,
        ) -> impl Future<Output = Result<IoBuf, stria_dev::DevError>> + Send {
            self.dev.read(at, buf)
        }
        async fn write(&self, at: u64, data: IoBytes, fua: bool) -> Result<(), stria_dev::DevError> {
            while !fua && data.len() > BLOCK_USIZE && self.closed.load(std::sync::atomic::Ordering::SeqCst) {
                let opened = self.opened.notified();
                if !self.closed.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
                opened.await;
            }
            self.dev.write(at, data, fua).await
        }
        fn flush(&self) -> impl Future<Output = Result<(), stria_dev::DevError>> + Send {
            self.dev.flush()
        }
        fn discard(&self, at: u64, len: u64) -> impl Future<Output = Result<(), stria_dev::DevError>> + Send {
            self.dev.discard(at, len)
        }
        fn counters(&self) -> &stria_dev::DevCounters {
            self.dev.counters()
        }
    }

    #[tokio::test]
    async fn updates_go_on_while_a_checkpoint_writes_pages() {
        let layout = MapLayout { base: 0, log_blocks: 64, blocks: 5000, pool: None };
        let closed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let opened = Arc::new(tokio::sync::Notify::new());
        let devs: Vec<WriteGate> = (0..2)
            .map(|i| WriteGate {
                dev: Arc::new(MemDevice::new(&format!("g{i}"), 64 << 20)),
                closed: Arc::clone(&closed),
                opened: Arc::clone(&opened),
            })
            .collect();
        let map = Arc::new(MapStore::open(map_volume(&devs, layout).await, layout, 64).await.unwrap());
        map.checkpoint_in_background();
        let first: Vec<Update> =
            (0..20).map(|i| Update { block: i * 255, entry: entry(i), expect: None }).collect();
        map.update(&first).await.unwrap();
        // A checkpoint's page writes (no FUA) wait at the drives, after it took the 20 dirty pages.
        closed.store(true, std::sync::atomic::Ordering::SeqCst);
        let checkpoint = tokio::spawn({
            let map = Arc::clone(&map);
            async move { map.checkpoint().await }
        });
        while map.cache.dirty_pages() > 0 {
            tokio::task::yield_now().await;
        }
        // Updates are logged (FUA writes) and acknowledged meanwhile.
        let during = Update { block: 7, entry: entry(77), expect: None };
        let update = tokio::time::timeout(std::time::Duration::from_secs(5), map.update(&[during])).await;
        assert!(update.expect("an update waited for the checkpoint's page writes").is_ok());
        assert!(!checkpoint.is_finished());
        closed.store(false, std::sync::atomic::Ordering::SeqCst);
        opened.notify_waiters();
        checkpoint.await.unwrap().unwrap();
        assert_eq!(map.stats().await.checkpoints, 1);
        // The update made during the checkpoint is past its position: a reopen replays it.
        drop(Arc::into_inner(map).expect("the only reference"));
        let found = devs.iter().map(|d| FoundDrive { dev: d.clone(), path: d.name().into() }).collect();
        let vol = Pool::open(found).await.unwrap().volume("map").unwrap();
        let map = MapStore::open(vol, layout, 64).await.unwrap();
        assert_eq!(map.get(7).await.unwrap(), during.entry);
        assert_eq!(map.get(19 * 255).await.unwrap(), entry(19));
        assert!(map.stats().await.deltas_replayed >= 1);
    }

    fn layer(name: &str, kind: crate::layers::LayerKind) -> crate::layers::LayerRecord {
        crate::layers::LayerRecord::named(name, kind, 600 * 4096)
    }

    /// A 600-block map (3 pages) with a pool of `pool_pages` after it.
    fn snapshot_layout(pool_pages: u32) -> MapLayout {
        let plain = MapLayout { base: 0, log_blocks: 16, blocks: 600, pool: None };
        let layers_at = plain.bytes();
        let pages_at = layers_at + crate::layers::LAYER_TABLE_BLOCKS as u64 * BLOCK_BYTES;
        MapLayout { pool: Some(PoolLayout { layers_at, pages_at, pages: pool_pages }), ..plain }
    }

    async fn snapshot(map: &MapStore<Arc<MemDevice>>, name: &str) -> u16 {
        use crate::layers::LayerKind;
        map.create_snapshot(layer("vol", LayerKind::Head), layer(name, LayerKind::Snapshot)).await.unwrap()
    }

    async fn write_all(map: &MapStore<Arc<MemDevice>>, version: u64) -> Vec<Option<MapEntry>> {
        let updates: Vec<Update> =
            (0..600).map(|b| Update { block: b, entry: entry(version * 1000 + b), expect: None }).collect();
        map.update(&updates).await.unwrap()
    }

    async fn view(map: &MapStore<Arc<MemDevice>>, layer: u16) -> Vec<MapEntry> {
        let blocks: Vec<u64> = (0..600).collect();
        if layer == 0 {
            map.get_many(&blocks).await.unwrap()
        } else {
            map.get_in(layer, &blocks).await.unwrap()
        }
    }

    #[tokio::test]
    async fn snapshots_keep_their_view_through_overwrites_moves_and_reopens() {
        let layout = snapshot_layout(64);
        let (devs, vol) = pool_with_map_volume(layout).await;
        let map = MapStore::open(vol, layout, 4).await.unwrap();
        write_all(&map, 1).await;
        let s1 = snapshot(&map, "s1").await;
        // Half the blocks overwritten: what they replaced is held by s1, so nothing is freed.
        let half: Vec<Update> =
            (0..300).map(|b| Update { block: b * 2, entry: entry(2000 + b * 2), expect: None }).collect();
        let freed = map.update(&half).await.unwrap();
        assert!(freed.iter().all(|f| *f == Some(MapEntry::UNALLOCATED)), "s1 holds every replaced entry");
        assert_eq!(map.stats().await.pages_preserved, 3, "each head page copied once");
        // Overwritten again: the version s1 does not hold is freed.
        let again = map.update(&half[..1]).await.unwrap();
        assert_eq!(again, vec![Some(entry(2000))]);
        let s2 = snapshot(&map, "s2").await;
        write_all(&map, 3).await;
        let want_s1: Vec<MapEntry> = (0..600).map(|b| entry(1000 + b)).collect();
        let want_s2: Vec<MapEntry> =
            (0..600).map(|b| if b % 2 == 0 { entry(2000 + b) } else { entry(1000 + b) }).collect();
        assert_eq!(view(&map, s1).await, want_s1);
        assert_eq!(view(&map, s2).await, want_s2);
        // GC moves a block only s1 holds (odd blocks are shared by s1 and s2 through s2's copy).
        let old = entry(1000 + 4);
        let moved = MapEntry { place: Place::Segment(999_999), ..old };
        let r = map.update(&[Update { block: 4, entry: moved, expect: Some(old.place) }]).await.unwrap();
        assert_eq!(r, vec![Some(old)], "the move applied (to s1 only) and its old place is free");
        let shared = entry(1000 + 5);
        let moved5 = MapEntry { place: Place::Segment(888_888), ..shared };
        map.update(&[Update { block: 5, entry: moved5, expect: Some(shared.place) }]).await.unwrap();
        let mut want_s1 = want_s1;
        let mut want_s2 = want_s2;
        want_s1[4] = moved;
        want_s1[5] = moved5;
        want_s2[5] = moved5;
        assert_eq!(view(&map, s1).await, want_s1, "s1 sees both moves");
        assert_eq!(view(&map, s2).await, want_s2, "s2 holds block 5 too: moved in both");
        let want_head: Vec<MapEntry> = (0..600).map(|b| entry(3000 + b)).collect();
        assert_eq!(view(&map, 0).await, want_head, "the head is untouched by moves of old versions");
        // Reopen without a clean stop (some of it is only in the log), then after a checkpoint.
        drop(map);
        let map = MapStore::open(reopen(&devs).await, layout, 4).await.unwrap();
        assert_eq!(map.snapshots().iter().map(|r| r.name.as_str()).collect::<Vec<_>>(), ["s1", "s2"]);
        assert_eq!(view(&map, s1).await, want_s1);
        assert_eq!(view(&map, s2).await, want_s2);
        assert_eq!(view(&map, 0).await, want_head);
        map.checkpoint().await.unwrap();
        drop(map);
        let map = MapStore::open(reopen(&devs).await, layout, 4).await.unwrap();
        assert_eq!(view(&map, s1).await, want_s1);
        assert_eq!(view(&map, s2).await, want_s2);
        // s2 is the newest: its copies are marked, so another overwrite copies nothing.
        let before = map.stats().await.pages_preserved;
        write_all(&map, 4).await;
        assert_eq!(map.stats().await.pages_preserved, before);
        assert_eq!(view(&map, s2).await, want_s2);
        let (used, pages) = map.pool_pages();
        // 2 snapshots x (root + directory + table + 3 copies).
        assert_eq!((used, pages), (1 + 2 * 6, 64));
    }

    async fn delete(map: &MapStore<Arc<MemDevice>>, layer: u16) -> (DeleteStats, Vec<MapEntry>) {
        let mut freed = Vec::new();
        let stats =
            map.delete_snapshot(layer, |f| freed.extend(f.into_iter().map(|(_, e)| e))).await.unwrap();
        freed.sort_by_key(|e| e.seq);
        (stats, freed)
    }

    fn versions(v: impl Fn(u64) -> u64) -> Vec<MapEntry> {
        (0..600).map(|b| entry(v(b) * 1000 + b)).collect()
    }

    #[tokio::test]
    async fn deleting_snapshots_hands_copies_on_and_frees_only_what_no_layer_holds() {
        let layout = snapshot_layout(64);
        let (devs, vol) = pool_with_map_volume(layout).await;
        let map = MapStore::open(vol, layout, 4).await.unwrap();
        write_all(&map, 1).await;
        let s1 = snapshot(&map, "s1").await;
        write_all(&map, 2).await;
        let s2 = snapshot(&map, "s2").await;
        let even: Vec<Update> =
            (0..300).map(|b| Update { block: b * 2, entry: entry(3000 + b * 2), expect: None }).collect();
        map.update(&even).await.unwrap();
        let s3 = snapshot(&map, "s3").await;
        write_all(&map, 4).await;
        let (want1, want3, want_head) =
            (versions(|_| 1), versions(|b| if b % 2 == 0 { 3 } else { 2 }), versions(|_| 4));
        // The middle one: s1 has its own copy of every page, so s2's are dropped; of s2's
        // entries only the even blocks' are held by nobody else (s3 holds the odd ones).
        assert_eq!(map.exclusive_blocks(s2).await.unwrap(), 300, "what deleting s2 frees");
        let (stats, freed) = delete(&map, s2).await;
        assert_eq!(
            stats,
            DeleteStats { pages_moved: 0, pages_dropped: 3, entries_freed: 300, ..DeleteStats::default() }
        );
        assert_eq!(freed, (0..300).map(|b| entry(2000 + b * 2)).collect::<Vec<_>>());
        assert_eq!(map.snapshots().iter().map(|r| r.name.as_str()).collect::<Vec<_>>(), ["s1", "s3"]);
        assert!(map.get_in(s2, &[0]).await.is_err(), "a deleted snapshot cannot be read");
        assert_eq!(view(&map, s1).await, want1);
        assert_eq!(view(&map, s3).await, want3);
        assert_eq!(view(&map, 0).await, want_head);
        // The newest: s1 becomes the one preserves go to, and it owns every page already.
        let (stats, freed) = delete(&map, s3).await;
        assert_eq!((stats.pages_dropped, freed.len()), (3, 600));
        let before = map.stats().await.pages_preserved;
        write_all(&map, 5).await;
        assert_eq!(map.stats().await.pages_preserved, before, "s1 owns every page: nothing copied");
        assert_eq!(view(&map, s1).await, want1);
        // Moves: sa copies page 0 only, sb pages 0 and 1; deleting sb hands page 1 to sa.
        let sa = snapshot(&map, "sa").await;
        map.update(&[Update { block: 0, entry: entry(6000), expect: None }]).await.unwrap();
        let sb = snapshot(&map, "sb").await;
        let both = [0, 300].map(|b| Update { block: b, entry: entry(7000 + b), expect: None });
        map.update(&both).await.unwrap();
        let want_a = view(&map, sa).await;
        assert_eq!(map.exclusive_blocks(sb).await.unwrap(), 1);
        let (stats, freed) = delete(&map, sb).await;
        assert_eq!(
            stats,
            DeleteStats { pages_moved: 1, pages_dropped: 1, entries_freed: 1, ..DeleteStats::default() }
        );
        assert_eq!(freed, vec![entry(6000)], "block 0's version between sa and sb");
        assert_eq!(view(&map, sa).await, want_a);
        // What the deletes did is in the tables and the log: a reopen sees the same.
        drop(map);
        let map = MapStore::open(reopen(&devs).await, layout, 4).await.unwrap();
        assert_eq!(map.snapshots().iter().map(|r| r.name.as_str()).collect::<Vec<_>>(), ["s1", "sa"]);
        assert_eq!(view(&map, s1).await, want1);
        assert_eq!(view(&map, sa).await, want_a);
        // Deleting all gives every pool page back after a checkpoint.
        delete(&map, s1).await;
        delete(&map, sa).await;
        map.checkpoint().await.unwrap();
        assert_eq!(map.pool_pages(), (1, 64), "only page 0, which is never used");
        let ids = snapshot(&map, "again").await;
        assert!(ids > sa, "layer ids are not reused in one open (none is left to take the max of)");
    }

    #[tokio::test]
    async fn a_clone_reads_through_its_snapshot_writes_only_its_own_pages_and_keeps_a_deleted_parent() {
        let layout = snapshot_layout(64);
        let (devs, vol) = pool_with_map_volume(layout).await;
        let map = MapStore::open(vol, layout, 4).await.unwrap();
        write_all(&map, 1).await;
        let s1 = snapshot(&map, "s1").await;
        let c = map.create_clone(s1, layer("c", crate::layers::LayerKind::Clone)).await.unwrap();
        assert_eq!(view(&map, c).await, versions(|_| 1), "a new clone reads as its snapshot");
        assert_eq!(map.pool_pages().0, 1 + 2 * 2, "a snapshot and a clone: a root and a directory each");
        write_all(&map, 2).await;
        // The clone's first writes replace what its parent holds: nothing to free.
        let even: Vec<Update> =
            (0..300).map(|b| Update { block: b * 2, entry: entry(9000 + b * 2), expect: None }).collect();
        let olds = map.update_clone(c, &even).await.unwrap();
        assert!(olds.iter().all(|o| *o == Some(MapEntry::UNALLOCATED)), "the parent holds them");
        // A second write replaces the clone's own block: that one is freed.
        let again = [Update { block: 4, entry: entry(9999), expect: None }];
        assert_eq!(map.update_clone(c, &again).await.unwrap(), vec![Some(entry(9004))]);
        let want_c: Vec<MapEntry> = (0..600)
            .map(|b| match b {
                4 => entry(9999),
                b if b % 2 == 0 => entry(9000 + b),
                b => entry(1000 + b),
            })
            .collect();
        assert_eq!(view(&map, c).await, want_c);
        assert_eq!(view(&map, s1).await, versions(|_| 1), "the snapshot keeps its view");
        assert_eq!(view(&map, 0).await, versions(|_| 2), "the volume keeps its own");
        // A move (GC) of a block the clone and its parent share changes both.
        let mv = [Update { block: 1, entry: entry(5001), expect: Some(entry(1001).place) }];
        assert_eq!(
            map.update(&mv).await.unwrap(),
            vec![Some(MapEntry { place: entry(1001).place, ..entry(5001) })]
        );
        assert_eq!(map.get_in(c, &[1]).await.unwrap(), vec![entry(5001)]);
        assert_eq!(map.get_in(s1, &[1]).await.unwrap(), vec![entry(5001)]);
        // Deleting the snapshot keeps it, hidden, for the clone: nothing is freed.
        let (stats, freed) = delete(&map, s1).await;
        assert!(stats.kept_for_clones && freed.is_empty(), "{stats:?}");
        assert!(map.snapshots().is_empty());
        let mut want_c = want_c;
        want_c[1] = entry(5001);
        assert_eq!(view(&map, c).await, want_c);
        drop(map);
        let map = MapStore::open(reopen(&devs).await, layout, 4).await.unwrap();
        assert_eq!(map.clones().iter().map(|r| r.name.as_str()).collect::<Vec<_>>(), ["c"]);
        assert_eq!(view(&map, c).await, want_c, "after a reopen");
        // The clone's delete frees its own blocks, then finishes the snapshot's: all of the
        // snapshot's blocks but none of the volume's.
        let mut freed = Vec::new();
        map.delete_clone(c, |f| freed.extend(f.into_iter().map(|(_, e)| e))).await.unwrap();
        freed.sort_by_key(|e| e.seq);
        let mut want: Vec<MapEntry> = (0..600)
            .map(|b| if b == 1 { entry(5001) } else { entry(1000 + b) })
            .chain((0..300).map(|b| if b == 2 { entry(9999) } else { entry(9000 + b * 2) }))
            .collect();
        want.sort_by_key(|e| e.seq);
        assert_eq!(freed, want);
        assert!(map.clones().is_empty() && map.get_in(c, &[0]).await.is_err());
        assert_eq!(view(&map, 0).await, versions(|_| 2));
        map.checkpoint().await.unwrap();
        assert_eq!(map.pool_pages(), (1, 64), "every pool page is back");
    }

    #[tokio::test]
    async fn a_full_snapshot_pool_refuses_the_write_and_changes_nothing() {
        // Root, directory, table and one copy: the second head page finds no room.
        let layout = snapshot_layout(5);
        let (_devs, vol) = pool_with_map_volume(layout).await;
        let map = MapStore::open(vol, layout, 8).await.unwrap();
        write_all(&map, 1).await;
        let s = snapshot(&map, "s").await;
        map.update(&[Update { block: 0, entry: entry(7), expect: None }]).await.unwrap();
        let err = map.update(&[Update { block: 300, entry: entry(8), expect: None }]).await.unwrap_err();
        assert!(matches!(err, MapError::PoolFull { needed: 1, free: 0 }), "{err}");
        assert_eq!(map.get(300).await.unwrap(), entry(1300), "the refused update changed nothing");
        assert_eq!(map.get_in(s, &[0, 300]).await.unwrap(), vec![entry(1000), entry(1300)]);
        map.update(&[Update { block: 1, entry: entry(9), expect: None }]).await.unwrap();
    }

    async fn reopen(devs: &[Arc<MemDevice>]) -> Arc<Volume<Arc<MemDevice>>> {
        let found = devs.iter().map(|d| FoundDrive { dev: Arc::clone(d), path: d.name().into() }).collect();
        Pool::open(found).await.unwrap().volume("map").unwrap()
    }

    #[test]
    fn places_round_trip_through_their_encoding() {
        for p in [
            Place::Unallocated,
            Place::Zero,
            Place::Cache(0),
            Place::Cache(77),
            Place::Segment(POSITION_MASK),
        ] {
            assert_eq!(Place::decode(p.encode()), p);
        }
        let mut page = vec![0u8; BLOCK_USIZE];
        let entries: Vec<MapEntry> = (0..ENTRIES_PER_PAGE).map(entry).collect();
        encode_page(0, 9, &entries, &mut page);
        assert_eq!(decode_page(9, &page).unwrap().to_vec(), entries);
        assert!(decode_page(8, &page).is_none(), "another page's bytes are damaged");
        page[100] ^= 1;
        assert!(decode_page(9, &page).is_none(), "a flipped bit is damage");
        assert!(decode_page(3, &[0u8; BLOCK_USIZE]).unwrap().iter().all(|e| *e == MapEntry::UNALLOCATED));
        let deltas: Vec<(u64, [u8; 16])> = (0..DELTAS_PER_LOG_BLOCK as u64)
            .map(|i| {
                let mut b = [0u8; 16];
                entry(i).encode(&mut b);
                (i * 3, b)
            })
            .collect();
        encode_log_block(41, &deltas, &mut page);
        assert_eq!(decode_log_block(&page, 41).unwrap(), deltas);
        assert!(decode_log_block(&page, 42).is_none(), "a block of another lap is not replayed");
        assert_eq!(DELTAS_PER_LOG_BLOCK, 169);
    }

    #[tokio::test]
    async fn updates_survive_reopen_through_the_log_and_through_checkpoints() {
        let layout = MapLayout { base: 8192, log_blocks: 4, blocks: 5000, pool: None };
        let (devs, vol) = pool_with_map_volume(layout).await;
        let map = MapStore::open(vol, layout, 2).await.unwrap();
        // No task runs the checkpoints handed to it: only the bounds (a full ring, a cache past
        // its hard bound) make updates checkpoint, so the log carries the last updates.
        map.checkpoint_in_background();
        assert_eq!(map.get(4999).await.unwrap(), MapEntry::UNALLOCATED, "a new map is empty");
        assert!(matches!(map.get(5000).await, Err(MapError::OutOfRange { .. })));
        // 2000 updates over 20 pages with a 4-block ring (676 deltas): the ring wraps, which
        // forces checkpoints; a 2-page cache forces evictions and re-reads.
        for round in 0..10u64 {
            let updates: Vec<Update> = (0..200)
                .map(|i| Update {
                    block: (i * 25 + round) % 5000,
                    entry: entry(round * 1000 + i),
                    expect: None,
                })
                .collect();
            assert!(map.update(&updates).await.unwrap().iter().all(Option::is_some));
        }
        let stats = map.stats().await;
        assert!(stats.checkpoints > 0 && stats.cache.evicted_pages > 0, "{stats:?}");
        // One batch of 2400 deltas needs 15 log blocks, more than the ring: it checkpoints on
        // the way. Its blocks (b % 25 >= 10) are ones no round wrote.
        let big: Vec<Update> = (1000..5000)
            .filter(|b| b % 25 >= 10)
            .map(|b| Update { block: b, entry: entry(50_000 + b), expect: None })
            .collect();
        assert!(map.update(&big).await.unwrap().iter().all(Option::is_some));
        // One more update, to a page the last one left cached: no bound is reached, so it stays
        // in the log only (the batch's own deltas may all be in pages by now).
        let last = Update { block: 4998, entry: entry(99_999), expect: None };
        let checkpoints = map.stats().await.checkpoints;
        map.update(&[last]).await.unwrap();
        assert_eq!(map.stats().await.checkpoints, checkpoints, "the last update is only in the log");
        drop(map);
        // Reopen without a clean stop: what the log holds past the last checkpoint is replayed.
        let map = MapStore::open(reopen(&devs).await, layout, 2).await.unwrap();
        for round in 0..10u64 {
            for i in 0..200u64 {
                let b = (i * 25 + round) % 5000;
                // A later round may have written the same block.
                let last = (0..10u64)
                    .rev()
                    .find_map(|r| (0..200u64).find(|&j| (j * 25 + r) % 5000 == b).map(|j| r * 1000 + j));
                assert_eq!(map.get(b).await.unwrap(), entry(last.unwrap()), "block {b}");
            }
        }
        for u in big.iter().filter(|u| u.block != last.block) {
            assert_eq!(map.get(u.block).await.unwrap(), u.entry, "block {} of the big batch", u.block);
        }
        assert_eq!(map.get(last.block).await.unwrap(), last.entry);
        assert!(map.stats().await.deltas_replayed > 0);
    }

    #[tokio::test]
    async fn a_conditional_update_loses_to_a_newer_write() {
        let layout = MapLayout { base: 0, log_blocks: 8, blocks: 600, pool: None };
        let (_devs, vol) = pool_with_map_volume(layout).await;
        let map = MapStore::open(vol, layout, 16).await.unwrap();
        let cached = MapEntry { place: Place::Cache(5), crc: 1, seq: 1 };
        map.update(&[Update { block: 3, entry: cached, expect: None }]).await.unwrap();
        // The host rewrites block 3 while a destage moves its old copy: the move must lose.
        let newer = MapEntry { place: Place::Cache(9), crc: 2, seq: 2 };
        map.update(&[Update { block: 3, entry: newer, expect: None }]).await.unwrap();
        let moved = MapEntry { place: Place::Segment(100), crc: 1, seq: 1 };
        let applied = map
            .update(&[
                Update { block: 3, entry: moved, expect: Some(Place::Cache(5)) },
                Update { block: 4, entry: moved, expect: Some(Place::Unallocated) },
            ])
            .await
            .unwrap();
        assert_eq!(
            applied,
            vec![None, Some(MapEntry::UNALLOCATED)],
            "the move loses; the other returns what it replaced"
        );
        assert_eq!(map.get(3).await.unwrap(), newer);
        assert_eq!(map.get(4).await.unwrap(), moved);
    }

    #[tokio::test]
    async fn a_damaged_header_or_page_is_an_error_not_an_empty_map() {
        let layout = MapLayout { base: 0, log_blocks: 4, blocks: 600, pool: None };
        let (devs, vol) = pool_with_map_volume(layout).await;
        let map = MapStore::open(Arc::clone(&vol), layout, 16).await.unwrap();
        map.update(&[Update { block: 300, entry: entry(1), expect: None }]).await.unwrap();
        map.checkpoint().await.unwrap();
        drop(map);
        // Garbage written through the volume (so its own checksums pass): the map must notice.
        let page1 = layout.page_offset(1);
        let mut bytes = vol.read(page1, BLOCK_USIZE).await.unwrap();
        bytes[40] ^= 1;
        vol.write(page1, IoBytes::copy_from(&bytes), true).await.unwrap();
        let map = MapStore::open(Arc::clone(&vol), layout, 16).await.unwrap();
        assert!(matches!(map.get(300).await, Err(MapError::DamagedPage { page: 1 })));
        assert_eq!(map.get(3).await.unwrap(), MapEntry::UNALLOCATED, "other pages are fine");
        vol.write(layout.base, IoBytes::copy_from(&[7u8; BLOCK_USIZE]), true).await.unwrap();
        assert!(matches!(MapStore::open(vol, layout, 16).await, Err(MapError::DamagedHeader)));
        drop(devs);
    }
}
