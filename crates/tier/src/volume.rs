//! A tiered volume: the write path, the read path, zeroing, status.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::Instant;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use stria_dev::{BLOCK_BYTES, BLOCK_USIZE, BlockDevice, IoBuf, IoBytes};
use stria_engine::join_all_ok;
use stria_engine::volume::bytes::{self, ExtentRuns, Span, ZeroSplit};
use stria_engine::{Extent, Pool, Volume, VolumeError, VolumeState};

use crate::log::CacheLog;
use crate::record::{CLEAN, Entry, PAGE_BYTES, Record, ZERO_CRC, ZEROED, block_crc};

/// Slots of the per-blockset I/O lock table (record page writes, unaligned writes).
const IO_LOCKS: usize = 1024;
/// Locks serialising read-modify-writes of partly written blocks, by block number.
pub(crate) const RMW_LOCKS: usize = 1024;
/// A read that keeps racing with destage gives up after this many tries (it never returns wrong
/// data: giving up is an error).
const READ_ATTEMPTS: usize = 8;

/// Destage policy and sizes, kept in the pool metadata with the tiered volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TierParams {
    /// One full stripe of the capacity volume.
    pub blockset_bytes: u64,
    /// Blocks in the cache log.
    pub cache_blocks: u64,
    /// Destage starts above this fill of the log (percent).
    pub start_percent: u8,
    /// Destage stops below this fill (percent).
    pub stop_percent: u8,
    /// Everything is destaged after this long without writes (milliseconds).
    pub idle_ms: u64,
    /// Destage whenever anything is dirty (the seed's "destage running all the time").
    pub always: bool,
    /// Blocksets destaged per batch (one capacity flush per batch).
    pub batch_blocksets: u32,
}

/// Host-side and tier counters.
#[derive(Debug, Default)]
pub struct TierCounters {
    pub host_read_ops: AtomicU64,
    pub host_read_bytes: AtomicU64,
    pub host_write_ops: AtomicU64,
    pub host_write_bytes: AtomicU64,
    pub blocks_read_from_cache: AtomicU64,
    pub blocks_read_from_capacity: AtomicU64,
    pub blocks_read_as_zero: AtomicU64,
    pub cache_write_bytes: AtomicU64,
    pub metadata_page_writes: AtomicU64,
    pub destaged_blocksets: AtomicU64,
    pub destaged_dirty_blocks: AtomicU64,
    /// Clean blocks read from the capacity tier to complete partly dirty blocksets.
    pub destage_fill_blocks: AtomicU64,
    pub read_retries: AtomicU64,
    pub write_waits: AtomicU64,
}

/// A tiered volume.
pub struct TieredVolume<D: BlockDevice> {
    pub(crate) name: String,
    pub(crate) size_bytes: u64,
    pub(crate) blockset_blocks: usize,
    pub(crate) pool: Arc<Pool<D>>,
    pub(crate) cache: Arc<Volume<D>>,
    pub(crate) meta: Arc<Volume<D>>,
    pub(crate) cap: Arc<Volume<D>>,
    pub(crate) records: Box<[Mutex<Record>]>,
    /// Blocksets that may hold zeroed entries (`ZEROED`), for the destager: a superset, pruned
    /// by the destager under the record's lock, added to by zeroing after its record update.
    pub(crate) zeroed_hint: Mutex<std::collections::BTreeSet<u32>>,
    pub(crate) io_locks: Box<[tokio::sync::Mutex<()>]>,
    /// Held by unaligned writes across the read and the write of their edge blocks.
    pub(crate) rmw_locks: Box<[tokio::sync::Mutex<()>]>,
    pub(crate) log: CacheLog,
    pub(crate) params: Mutex<TierParams>,
    pub(crate) counters: TierCounters,
    pub(crate) started: Instant,
    pub(crate) last_write_ms: AtomicU64,
    pub(crate) closed: AtomicBool,
    /// Why the volume takes no more writes: a record page write failed, so that record's durable
    /// version is unknown (the old one or the new one) until the volume is reopened. See
    /// [`TieredVolume::record_write_failed`].
    pub(crate) write_failure: Mutex<Option<String>>,
    /// Held by the destager while it runs a batch, so that [`TieredVolume::close`] can wait for
    /// the batch in progress (its capacity writes must finish before the pool's final flush).
    pub(crate) destaging: tokio::sync::Mutex<()>,
}

impl<D: BlockDevice> std::fmt::Debug for TieredVolume<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TieredVolume")
            .field("name", &self.name)
            .field("size_bytes", &self.size_bytes)
            .finish()
    }
}

/// Status of one part (cache, meta, capacity).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PartStatus {
    pub role: String,
    pub volume: String,
    pub layout: String,
    pub size_bytes: u64,
    pub state: VolumeState,
    pub write_ops: u64,
    pub write_bytes: u64,
    pub read_ops: u64,
    pub read_bytes: u64,
    pub full_stripe_writes: u64,
    pub partial_stripe_writes: u64,
    /// Bytes written to and read from the part's drives (drive counters: exact when the drives
    /// hold only this part, as in a pool whose fast drives carry cache and metadata and whose
    /// capacity drives carry the capacity tier).
    pub drive_bytes_written: u64,
    pub drive_bytes_read: u64,
    /// Capacity-drive writes by size: bucket i counts writes of [2^(12+i), 2^(13+i)) bytes.
    pub drive_write_size_hist: Vec<u64>,
}

/// Status of a tiered volume for `stria status --json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TierStatus {
    pub name: String,
    pub layout: String,
    pub size_bytes: u64,
    pub state: VolumeState,
    pub blockset_bytes: u64,
    pub cache_blocks: u64,
    pub log_used_blocks: u64,
    pub dirty_blocks: u64,
    pub dirty_blocksets: u64,
    pub host_read_bytes: u64,
    pub host_write_bytes: u64,
    pub blocks_read_from_cache: u64,
    pub blocks_read_from_capacity: u64,
    pub cache_write_bytes: u64,
    pub metadata_page_writes: u64,
    pub destaged_blocksets: u64,
    pub destage_fill_blocks: u64,
    pub writes_waited_for_space: u64,
    /// Drive bytes written per host byte written, per tier: the fast drives (write cache and
    /// metadata, every drive counted once) and the capacity drives. `None` before any host write.
    /// Drive counters start at zero when the pool is opened.
    pub write_amplification_fast: Option<f64>,
    pub write_amplification_capacity: Option<f64>,
    pub parts: Vec<PartStatus>,
}

impl<D: BlockDevice> TieredVolume<D> {
    /// The volume's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Size in bytes.
    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    /// Bytes per blockset (one capacity stripe).
    pub fn blockset_bytes(&self) -> u64 {
        self.blockset_blocks as u64 * BLOCK_BYTES
    }

    /// Counters.
    pub fn counters(&self) -> &TierCounters {
        &self.counters
    }

    /// The capacity part.
    pub fn capacity_volume(&self) -> &Arc<Volume<D>> {
        &self.cap
    }

    /// The cache part.
    pub fn cache_volume(&self) -> &Arc<Volume<D>> {
        &self.cache
    }

    /// The metadata part.
    pub fn meta_volume(&self) -> &Arc<Volume<D>> {
        &self.meta
    }

    /// Current destage policy.
    pub fn params(&self) -> TierParams {
        *self.params.lock()
    }

    /// Changes the destage policy (not persisted; see `stria`'s tiered options).
    pub fn set_params(&self, params: TierParams) {
        *self.params.lock() = params;
        self.log.hungry.notify_one();
    }

    fn check_range(&self, offset_bytes: u64, len_bytes: u64) -> Result<(), VolumeError> {
        if self.closed.load(Relaxed) {
            return Err(VolumeError::Closed(self.name.clone()));
        }
        bytes::check_range(offset_bytes, len_bytes, self.size_bytes)
    }

    fn unrecoverable(&self, block: u64, reason: impl Into<String>) -> VolumeError {
        VolumeError::Unrecoverable {
            volume: self.name.clone(),
            offset_bytes: block * BLOCK_BYTES,
            len_bytes: BLOCK_BYTES,
            reason: reason.into(),
        }
    }

    /// Refuses writes (and destage) once a record page write failed.
    pub(crate) fn check_writable(&self, offset_bytes: u64, len_bytes: u64) -> Result<(), VolumeError> {
        match &*self.write_failure.lock() {
            None => Ok(()),
            Some(why) => Err(VolumeError::Unrecoverable {
                volume: self.name.clone(),
                offset_bytes,
                len_bytes,
                reason: format!("the volume takes no writes until it is reopened: {why}"),
            }),
        }
    }

    /// A record page write failed: the blockset's durable record is the old version or the new
    /// one, and which is unknown. Until the volume is reopened (recovery reads the records back),
    /// nothing may rely on either: a destage from the in-memory record could overwrite capacity
    /// data that the durable record still calls clean, and a position freed because one version
    /// stopped pointing at it could be reused under the other. So the volume stops taking writes
    /// and destaging; reads go on. (The engine fails a volume write only when it cannot persist
    /// it at all: a failed part, a pool that refuses writes, a closed pool.)
    fn record_write_failed(&self, bs: usize, e: &VolumeError) {
        let why = format!("the metadata record of blockset {bs} could not be written ({e})");
        tracing::error!(volume = %self.name, "{why}; the tiered volume takes no more writes until it is reopened");
        self.write_failure.lock().get_or_insert(why.clone());
        self.log.shut(why);
        self.log.hungry.notify_one();
    }

    pub(crate) fn io_lock(&self, blockset: usize) -> &tokio::sync::Mutex<()> {
        &self.io_locks[blockset % IO_LOCKS]
    }

    pub(crate) fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    // ---------------------------------------------------------------- reads

    /// Reads `len_bytes` at `offset_bytes` (any alignment).
    pub async fn read(&self, offset_bytes: u64, len_bytes: usize) -> Result<IoBuf, VolumeError> {
        self.check_range(offset_bytes, len_bytes as u64)?;
        self.counters.host_read_ops.fetch_add(1, Relaxed);
        self.counters.host_read_bytes.fetch_add(len_bytes as u64, Relaxed);
        if len_bytes == 0 {
            return Ok(IoBuf::zeroed(0));
        }
        let span = Span::new(offset_bytes, len_bytes as u64);
        let buf = self.read_blocks(span.first, span.blocks()).await?;
        Ok(span.clip(buf))
    }

    /// The entries of blocks `[first, first + n)` as they are now.
    fn snapshot(&self, first: u64, n: u64) -> Vec<Entry> {
        let bsb = self.blockset_blocks as u64;
        let mut out = Vec::with_capacity(n as usize);
        let mut b = first;
        while b < first + n {
            let bs = (b / bsb) as usize;
            let upto = ((bs as u64 + 1) * bsb).min(first + n);
            let rec = self.records[bs].lock();
            for blk in b..upto {
                out.push(rec.entries[(blk % bsb) as usize]);
            }
            b = upto;
        }
        out
    }

    /// Reads whole blocks, verifying each against its record.
    pub(crate) async fn read_blocks(&self, first: u64, n: u64) -> Result<IoBuf, VolumeError> {
        let mut entries = self.snapshot(first, n);
        if let Some(buf) = self.read_one_run(first, &entries).await? {
            return Ok(buf);
        }
        let mut out = IoBuf::zeroed((n * BLOCK_BYTES) as usize);
        let mut pending: Vec<u64> = (0..n).collect();
        for attempt in 0..READ_ATTEMPTS {
            if attempt > 0 {
                self.counters.read_retries.fetch_add(1, Relaxed);
                tokio::task::yield_now().await;
                entries = pending.iter().map(|&i| self.snapshot(first + i, 1)[0]).collect();
            }
            let (bad, clean_bad) = self.read_some(first, &pending, &entries, &mut out).await?;
            if let Some(i) = clean_bad {
                return Err(self.unrecoverable(
                    first + i,
                    "capacity tier data does not match its checksum in the tier metadata",
                ));
            }
            if bad.is_empty() {
                return Ok(out);
            }
            pending = bad;
        }
        Err(self.unrecoverable(first + pending[0], "cache block kept changing under the read"))
    }

    /// The common case: every block of the read lives in one place (all clean in the capacity
    /// tier, or at consecutive cache positions that do not wrap), so one part read returns the
    /// whole buffer, handed back as it is when every block matches its record. `None` (nothing
    /// counted) when the blocks are spread out or one does not match: the caller's general
    /// path then reads again, retries races and reports corruption.
    async fn read_one_run(&self, first: u64, entries: &[Entry]) -> Result<Option<IoBuf>, VolumeError> {
        let n = entries.len() as u64;
        let e0 = entries[0];
        let all_capacity = entries.iter().all(|e| e.position == CLEAN && e.crc != ZERO_CRC);
        let all_cache = e0.in_cache()
            && self.log.block_of(e0.position) + n <= self.log.ring_blocks()
            && entries.iter().zip(0..).all(|(e, k)| e.in_cache() && e.position == e0.position + k);
        let len = (n * BLOCK_BYTES) as usize;
        let buf = if all_cache {
            self.cache.read(self.log.block_of(e0.position) * BLOCK_BYTES, len).await?
        } else if all_capacity {
            self.cap.read(first * BLOCK_BYTES, len).await?
        } else {
            return Ok(None);
        };
        if !buf.chunks_exact(BLOCK_USIZE).zip(entries).all(|(data, e)| block_crc(data) == e.crc) {
            return Ok(None);
        }
        let counter = if all_cache {
            &self.counters.blocks_read_from_cache
        } else {
            &self.counters.blocks_read_from_capacity
        };
        counter.fetch_add(n, Relaxed);
        Ok(Some(buf))
    }

    /// Reads the `pending` blocks (indices from `first`) per `entries`; returns the indices that
    /// failed verification in the cache (retry) and the first that failed in the capacity tier.
    async fn read_some(
        &self,
        first: u64,
        pending: &[u64],
        entries: &[Entry],
        out: &mut IoBuf,
    ) -> Result<(Vec<u64>, Option<u64>), VolumeError> {
        // Group into runs: consecutive blocks from the capacity tier, or consecutive cache positions.
        let mut runs: Vec<(u64, u64, bool)> = Vec::new(); // (first index, count, from_cache)
        for (k, (&i, e)) in pending.iter().zip(entries).enumerate() {
            if !e.dirty() && e.crc == ZERO_CRC || e.position == ZEROED {
                out[(i * BLOCK_BYTES) as usize..((i + 1) * BLOCK_BYTES) as usize].fill(0);
                self.counters.blocks_read_as_zero.fetch_add(1, Relaxed);
                continue;
            }
            let from_cache = e.in_cache();
            if let Some(last) = runs.last_mut() {
                let prev = entries[k - 1];
                let contiguous = last.0 + last.1 == i
                    && last.2 == from_cache
                    && (!from_cache
                        || (prev.in_cache()
                            && prev.position + 1 == e.position
                            && self.log.block_of(e.position) != 0));
                if contiguous {
                    last.1 += 1;
                    continue;
                }
            }
            runs.push((i, 1, from_cache));
        }
        let reads = runs.iter().map(|&(i, count, from_cache)| {
            // `pending` is sorted: it starts as 0..n and retries keep the order.
            let k = pending.binary_search(&i).expect("run starts at a pending block");
            let e = entries[k];
            async move {
                let buf = if from_cache {
                    let off = self.log.block_of(e.position) * BLOCK_BYTES;
                    self.cache.read(off, (count * BLOCK_BYTES) as usize).await?
                } else {
                    self.cap.read((first + i) * BLOCK_BYTES, (count * BLOCK_BYTES) as usize).await?
                };
                Ok::<_, VolumeError>((i, count, from_cache, buf))
            }
        });
        let results = join_all_ok(reads).await?;
        let mut bad = Vec::new();
        let mut clean_bad = None;
        for (i, count, from_cache, buf) in results {
            for j in 0..count {
                let idx = i + j;
                let k = pending.binary_search(&idx).expect("pending");
                let data = &buf[(j * BLOCK_BYTES) as usize..((j + 1) * BLOCK_BYTES) as usize];
                if block_crc(data) != entries[k].crc {
                    if from_cache {
                        bad.push(idx);
                    } else if clean_bad.is_none() {
                        // A clean block may have been written (and its record changed) while we
                        // read: only a mismatch that persists is corruption.
                        if self.snapshot(first + idx, 1)[0] == entries[k] {
                            clean_bad = Some(idx);
                        } else {
                            bad.push(idx);
                        }
                    }
                    continue;
                }
                out[(idx * BLOCK_BYTES) as usize..((idx + 1) * BLOCK_BYTES) as usize].copy_from_slice(data);
                let c = if from_cache {
                    &self.counters.blocks_read_from_cache
                } else {
                    &self.counters.blocks_read_from_capacity
                };
                c.fetch_add(1, Relaxed);
            }
        }
        Ok((bad, clean_bad))
    }

    // ---------------------------------------------------------------- writes

    /// Writes `data` at `offset_bytes` (any alignment). The write is durable (in the mirrored
    /// cache and its metadata) when this returns, FUA or not.
    pub async fn write(&self, offset_bytes: u64, data: IoBytes, _fua: bool) -> Result<(), VolumeError> {
        let len = data.len() as u64;
        self.check_range(offset_bytes, len)?;
        self.check_writable(offset_bytes, len)?;
        self.counters.host_write_ops.fetch_add(1, Relaxed);
        self.counters.host_write_bytes.fetch_add(len, Relaxed);
        self.last_write_ms.store(self.now_ms(), Relaxed);
        if len == 0 {
            return Ok(());
        }
        let span = Span::new(offset_bytes, len);
        crate::write_any_alignment(
            span,
            data,
            &self.rmw_locks,
            |b| self.read_blocks(b, 1),
            |first, d| self.write_blocks(first, d),
        )
        .await
    }

    /// The aligned write path: log, then records.
    async fn write_blocks(&self, first: u64, data: IoBytes) -> Result<(), VolumeError> {
        let n = data.len() as u64 / BLOCK_BYTES;
        let ring = self.log.ring_blocks();
        // Large writes go through the log in pieces of at most half the ring.
        let step = (ring / 2).max(1);
        let mut done = 0;
        while done < n {
            let m = (n - done).min(step);
            let piece = data.slice((done * BLOCK_BYTES) as usize..((done + m) * BLOCK_BYTES) as usize);
            self.write_piece(first + done, piece).await?;
            done += m;
        }
        Ok(())
    }

    async fn write_piece(&self, first: u64, data: IoBytes) -> Result<(), VolumeError> {
        let n = data.len() as u64 / BLOCK_BYTES;
        if self.log.waiting() > 0 || self.log.used() + n > self.log.ring_blocks() {
            self.counters.write_waits.fetch_add(1, Relaxed);
        }
        let start = self.log.reserve(n).await.map_err(|why| VolumeError::Unrecoverable {
            volume: self.name.clone(),
            offset_bytes: first * BLOCK_BYTES,
            len_bytes: n * BLOCK_BYTES,
            reason: format!("the write cache is full and cannot be emptied: {why}"),
        })?;
        self.write_reserved(first, start, &data).await
    }

    async fn write_reserved(&self, first: u64, start: u64, data: &IoBytes) -> Result<(), VolumeError> {
        let n = data.len() as u64 / BLOCK_BYTES;
        // 1. Data into the cache log, durably (split where the ring wraps).
        let phys = self.log.block_of(start);
        let ring = self.log.ring_blocks();
        let before_wrap = (ring - phys).min(n);
        let mut writes = vec![self.cache.write(
            phys * BLOCK_BYTES,
            data.slice(0..(before_wrap * BLOCK_BYTES) as usize),
            true,
        )];
        if before_wrap < n {
            writes.push(self.cache.write(
                0,
                data.slice((before_wrap * BLOCK_BYTES) as usize..data.len()),
                true,
            ));
        }
        if let Err(e) = join_all_ok(writes).await {
            // Nothing points to the reserved positions: free them.
            self.log.release(start..start + n);
            return Err(e);
        }
        self.counters.cache_write_bytes.fetch_add(data.len() as u64, Relaxed);
        // 2. Records, durably, one blockset at a time.
        let crcs: Vec<u32> = data.chunks_exact(BLOCK_USIZE).map(block_crc).collect();
        let entry = |k: u64| Entry { position: start + k, crc: crcs[k as usize] };
        self.set_entries(first, n, entry).await.map_err(|(reached, e)| {
            // Only the positions of the blocks after the failed blockset are pointed to by no
            // record. The blocksets before it point at theirs durably (and destage or a newer
            // write may already have freed them); the failed blockset's record may be durable
            // too. Freeing all the reserved positions here freed positions that records pointed
            // to: a double free, or a live cache block reused (crates/tier/tests/
            // crash_during_destage.rs, sequence seed 25).
            self.log.release(start + reached..start + n);
            e
        })
    }

    /// Applies `updates` (entry index, new entry) to blockset `bs`'s record, writes the record
    /// durably, then frees the cache positions the record no longer points to.
    pub(crate) async fn update_record(
        &self,
        bs: usize,
        updates: &[(usize, Entry)],
    ) -> Result<(), VolumeError> {
        let _io = self.io_lock(bs).lock().await;
        self.update_record_locked(bs, |rec| {
            let mut freed = Vec::new();
            for &(i, e) in updates {
                let old = rec.entries[i];
                if old.in_cache() {
                    freed.push(old.position);
                }
                rec.entries[i] = e;
            }
            freed
        })
        .await
    }

    /// Changes a record with `change` (which returns the positions it stops pointing to) under
    /// the blockset's I/O lock (held by the caller), writes it, claims its new cache positions
    /// and frees the old ones.
    pub(crate) async fn update_record_locked(
        &self,
        bs: usize,
        change: impl FnOnce(&mut Record) -> Vec<u64>,
    ) -> Result<(), VolumeError> {
        self.check_writable((bs * self.blockset_blocks) as u64 * BLOCK_BYTES, self.blockset_bytes())?;
        let mut page = vec![0u8; PAGE_BYTES];
        let (freed, claimed) = {
            let mut rec = self.records[bs].lock();
            // A cache position belongs to one block (entry) for its whole life, so "new in this
            // record" is "different from what the same entry held before".
            let before: Vec<u64> = rec.entries.iter().map(|e| e.position).collect();
            let generation = rec.generation;
            let freed = change(&mut rec);
            rec.generation += 1;
            self.check_record(bs, &rec, generation);
            rec.owner = 0;
            let claimed: Vec<(u64, u16)> = rec
                .entries
                .iter()
                .zip(&before)
                .enumerate()
                .filter(|(_, (e, old))| e.in_cache() && e.position != **old)
                .map(|(i, (e, _))| (e.position, u16::try_from(i).expect("bounded")))
                .collect();
            rec.encode(&mut page);
            (freed, claimed)
        };
        for &(pos, i) in &claimed {
            self.log.claim(pos, u32::try_from(bs).expect("blockset index fits"), i);
        }
        if let Err(e) = self.meta.write((1 + bs as u64) * BLOCK_BYTES, IoBytes::copy_from(&page), true).await
        {
            // The page on disk is now the old record or the new one: keep the new one in memory
            // (readers may see the unacknowledged data, as with any failed write) and free neither
            // the old positions nor the new ones, since the durable record may point at either.
            self.record_write_failed(bs, &e);
            return Err(e);
        }
        self.counters.metadata_page_writes.fetch_add(1, Relaxed);
        self.log.release(freed);
        Ok(())
    }

    /// Stops the process before a record that breaks an invariant is written: one entry per
    /// block of the blockset, no cache position held by two entries (a position belongs to one
    /// block for its whole life), and a generation above the one it replaces (recovery keeps the
    /// newest copy).
    fn check_record(&self, bs: usize, rec: &Record, generation_before: u64) {
        assert_eq!(
            rec.entries.len(),
            self.blockset_blocks,
            "invariant: the record of blockset {bs} has one entry per block"
        );
        let mut positions: Vec<u64> =
            rec.entries.iter().filter(|e| e.in_cache()).map(|e| e.position).collect();
        positions.sort_unstable();
        if let Some(w) = positions.windows(2).find(|w| w[0] == w[1]) {
            panic!("invariant: no two entries of blockset {bs} point at one cache position ({})", w[0]);
        }
        assert!(
            rec.generation > generation_before,
            "invariant: the generation of blockset {bs}'s record grows strictly ({generation_before} -> {})",
            rec.generation
        );
    }

    /// Zeroes a range. Whole blocks only change the records (no data is written); partial edge
    /// blocks are written as zeros unless `fast_only` (then [`VolumeError::NotCheap`]).
    pub async fn write_zeroes(
        &self,
        offset_bytes: u64,
        len_bytes: u64,
        fast_only: bool,
    ) -> Result<(), VolumeError> {
        self.check_range(offset_bytes, len_bytes)?;
        if len_bytes == 0 {
            return Ok(());
        }
        let split = ZeroSplit::new(offset_bytes, len_bytes, BLOCK_BYTES);
        if fast_only && split.has_slow_part() {
            return Err(VolumeError::NotCheap { offset_bytes, len_bytes });
        }
        if let Some((first, n)) = split.cheap_blocks() {
            self.zero_blocks(first, n).await?;
        }
        for edge in [split.head, split.tail] {
            if !edge.is_empty() {
                self.write(edge.start, IoBytes::zeroed((edge.end - edge.start) as usize), false).await?;
            }
        }
        Ok(())
    }

    /// Discards whole blocks (edges are left as they are): they read as zeros.
    pub async fn trim(&self, offset_bytes: u64, len_bytes: u64) -> Result<(), VolumeError> {
        self.check_range(offset_bytes, len_bytes)?;
        if let Some((first, n)) = ZeroSplit::new(offset_bytes, len_bytes, BLOCK_BYTES).cheap_blocks() {
            self.zero_blocks(first, n).await?;
        }
        Ok(())
    }

    async fn zero_blocks(&self, first: u64, n: u64) -> Result<(), VolumeError> {
        self.check_writable(first * BLOCK_BYTES, n * BLOCK_BYTES)?;
        self.last_write_ms.store(self.now_ms(), Relaxed);
        let result = self
            .set_entries(first, n, |_| Entry { position: ZEROED, crc: ZERO_CRC })
            .await
            .map_err(|(_, e)| e);
        // After the records changed (see `zeroed_hint`): also after a failure, for the
        // blocksets it may have reached.
        let bsb = self.blockset_blocks as u64;
        let sets = (first / bsb..(first + n).div_ceil(bsb)).map(|b| u32::try_from(b).expect("fits"));
        self.zeroed_hint.lock().extend(sets);
        result
    }

    /// Points the entries of blocks `first..first + n` at `entry(k)` (k = block - first),
    /// writing each blockset's record durably in turn. On failure, also returns how many blocks
    /// (from `first`) the records may point to: those up to the end of the failed blockset; no
    /// record points to the entries of the blocks after it.
    async fn set_entries(
        &self,
        first: u64,
        n: u64,
        entry: impl Fn(u64) -> Entry,
    ) -> Result<(), (u64, VolumeError)> {
        let bsb = self.blockset_blocks as u64;
        let mut b = first;
        while b < first + n {
            let bs = (b / bsb) as usize;
            let upto = ((bs as u64 + 1) * bsb).min(first + n);
            assert!(
                bs < self.records.len() && b >= bs as u64 * bsb && upto <= (bs as u64 + 1) * bsb,
                "invariant: a set_entries update stays inside its blockset ({bs}: blocks {b}..{upto})"
            );
            let updates: Vec<(usize, Entry)> =
                (b..upto).map(|blk| ((blk % bsb) as usize, entry(blk - first))).collect();
            self.update_record(bs, &updates).await.map_err(|e| (upto - first, e))?;
            b = upto;
        }
        Ok(())
    }

    /// Every acknowledged write is already durable; a flush only has to wait for nothing.
    pub async fn flush(&self) -> Result<(), VolumeError> {
        if self.closed.load(Relaxed) {
            return Err(VolumeError::Closed(self.name.clone()));
        }
        Ok(())
    }

    /// Allocation map: a block is a hole when it reads as zeros without being stored.
    pub fn block_status(&self, offset_bytes: u64, len_bytes: u64) -> Result<Vec<Extent>, VolumeError> {
        self.check_range(offset_bytes, len_bytes)?;
        if len_bytes == 0 {
            return Ok(Vec::new());
        }
        let span = Span::new(offset_bytes, len_bytes);
        let mut out = ExtentRuns::new();
        for e in self.snapshot(span.first, span.blocks()) {
            out.push(e.position == ZEROED || (e.position == CLEAN && e.crc == ZERO_CRC), 1);
        }
        Ok(out.finish(&span))
    }

    /// Blocks not yet in the capacity tier, and blocksets holding them.
    pub fn dirty(&self) -> (u64, u64) {
        let mut blocks = 0;
        let mut sets = 0;
        for r in self.records.iter() {
            let d = r.lock().entries.iter().filter(|e| e.dirty()).count() as u64;
            blocks += d;
            sets += u64::from(d > 0);
        }
        (blocks, sets)
    }

    /// Worst state of the three parts.
    pub fn state(&self) -> VolumeState {
        crate::worst_state([self.cache.state(), self.meta.state(), self.cap.state()])
    }

    /// Stops the destager and waits for the batch it is running, if any; requests after this
    /// fail with `Closed`. Call it before closing the pool.
    pub async fn close(&self) {
        self.stop();
        drop(self.destaging.lock().await);
    }

    /// Like [`TieredVolume::close`] without waiting (for `Drop` implementations): the destager
    /// stops after its current batch.
    pub fn stop(&self) {
        self.closed.store(true, Relaxed);
        self.log.shut(format!("volume {} is closed", self.name));
        self.log.hungry.notify_one();
    }
}
