//! Destage: move cached blocksets to the capacity tier as full stripes.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Weak};
use std::time::Duration;

use stria_dev::{BLOCK_BYTES as BLOCK, BLOCK_USIZE, BlockDevice, IoBuf};
use stria_engine::VolumeError;

use crate::record::{CLEAN, Entry, ZERO_CRC, ZEROED, block_crc};
use crate::volume::TieredVolume;

/// Runs until the volume is closed or dropped.
pub(crate) async fn destage_loop<D: BlockDevice>(vol: Weak<TieredVolume<D>>) {
    let mut draining = false;
    loop {
        let Some(v) = vol.upgrade() else { return };
        if v.closed.load(Relaxed) || v.write_failure.lock().is_some() {
            return;
        }
        let (wanted, still_draining) = v.destage_wanted(draining);
        draining = still_draining;
        if !wanted {
            // Holding `v` for at most one short wait: the loop still ends soon after the last
            // other reference is dropped.
            let hungry = v.log.hungry.notified();
            tokio::select! {
                () = hungry => {}
                () = tokio::time::sleep(Duration::from_millis(50)) => {}
            }
            continue;
        }
        let result = {
            let _running = v.destaging.lock().await;
            if v.closed.load(Relaxed) {
                return;
            }
            v.destage_batch().await
        };
        if result.is_ok() {
            v.log.clear_failure();
        }
        match result {
            Ok(0) => {
                drop(v);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Ok(_) => {}
            Err(e) => {
                tracing::error!(volume = %v.name(), error = %e, "destage failed; retrying");
                v.log.fail_waiters(e.to_string());
                drop(v);
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

impl<D: BlockDevice> TieredVolume<D> {
    /// Whether destage should run now, and whether a drain (start..stop watermarks) continues.
    fn destage_wanted(&self, draining: bool) -> (bool, bool) {
        let p = self.params();
        let used = self.log.used();
        let ring = self.log.ring_blocks();
        if self.log.waiting() > 0 {
            return (true, true);
        }
        if p.always {
            return (used > 0 || self.has_zeroed_dirty(), false);
        }
        let above = |pct: u8| used * 100 > u64::from(pct) * ring;
        if above(p.start_percent) || (draining && above(p.stop_percent)) {
            return (true, true);
        }
        let idle = self.now_ms().saturating_sub(self.last_write_ms.load(Relaxed)) >= p.idle_ms;
        (idle && (used > 0 || self.has_zeroed_dirty()), false)
    }

    /// Whether some blockset may hold zeroed entries (cheap: the hint; the batch prunes it).
    fn has_zeroed_dirty(&self) -> bool {
        !self.zeroed_hint.lock().is_empty()
    }

    /// Up to `want` blocksets that hold zeroed entries and are not in `sets`, from the hint;
    /// hinted blocksets found without any are dropped from it (under their record's lock, so a
    /// zeroing that adds them back after its record update cannot be lost).
    fn zeroed_blocksets(&self, sets: &[u32], want: usize) -> Vec<u32> {
        let hinted: Vec<u32> = self.zeroed_hint.lock().iter().copied().collect();
        let mut out = Vec::new();
        for bs in hinted {
            if out.len() >= want {
                break;
            }
            let rec = self.records[bs as usize].lock();
            if rec.entries.iter().any(|e| e.position == ZEROED) {
                if !sets.contains(&bs) {
                    out.push(bs);
                }
            } else {
                self.zeroed_hint.lock().remove(&bs);
            }
        }
        out
    }

    /// Destages one batch; returns how many blocksets were written to the capacity tier.
    pub(crate) async fn destage_batch(&self) -> Result<usize, VolumeError> {
        self.check_writable(0, self.size_bytes)?;
        let batch = self.params().batch_blocksets.max(1) as usize;
        let mut sets: Vec<u32> = self.log.oldest_blocksets(batch);
        if sets.len() < batch {
            let more = self.zeroed_blocksets(&sets, batch - sets.len());
            sets.extend(more);
        }
        // In blockset order: the capacity tier sees sequential stripe writes.
        sets.sort_unstable();
        let mut written = Vec::new();
        for bs in sets {
            if let Some(snapshot) = self.destage_one(bs as usize).await? {
                written.push((bs as usize, snapshot));
            }
        }
        if written.is_empty() {
            return Ok(0);
        }
        // The stripes must be durable before any record stops pointing at the cache.
        self.pool
            .flush()
            .await
            .map_err(|e| VolumeError::Pool { volume: self.name.clone(), source: Box::new(e) })?;
        for (bs, snapshot) in &written {
            let _io = self.io_lock(*bs).lock().await;
            self.update_record_locked(*bs, |rec| {
                let mut freed = Vec::new();
                for (i, snap) in snapshot.iter().enumerate() {
                    // A block written again since the snapshot keeps its newer entry.
                    if snap.dirty() && rec.entries[i] == *snap {
                        if snap.in_cache() {
                            freed.push(snap.position);
                        }
                        let crc = if snap.position == ZEROED { ZERO_CRC } else { snap.crc };
                        rec.entries[i] = Entry { position: CLEAN, crc };
                    }
                }
                freed
            })
            .await?;
            self.counters.destaged_blocksets.fetch_add(1, Relaxed);
        }
        Ok(written.len())
    }

    /// Writes blockset `bs` to the capacity tier as one full stripe; returns the entries it
    /// wrote (None if nothing was dirty, or a cache block changed under it: retried later).
    async fn destage_one(&self, bs: usize) -> Result<Option<Vec<Entry>>, VolumeError> {
        // The snapshot must be the *durable* record: a writer holds the blockset's I/O lock from
        // its in-memory update until its page write is durable, so under that lock memory and
        // disk agree. (Destaging a newer, not yet durable version would overwrite the capacity
        // copy that the durable record still calls clean with the older version's checksum.)
        let snapshot = {
            let _io = self.io_lock(bs).lock().await;
            self.records[bs].lock().entries.clone()
        };
        if !snapshot.iter().any(Entry::dirty) {
            return Ok(None);
        }
        let n = self.blockset_blocks;
        let base = bs as u64 * n as u64;
        let mut data = IoBuf::zeroed(n * BLOCK_USIZE);
        // Clean blocks that hold data: read the blockset from the capacity tier first.
        if snapshot.iter().any(|e| !e.dirty() && e.crc != ZERO_CRC) {
            let old = self.cap.read(base * BLOCK, n * BLOCK_USIZE).await?;
            for (i, e) in snapshot.iter().enumerate() {
                if !e.dirty() && e.crc != ZERO_CRC {
                    let block = &old[i * BLOCK_USIZE..(i + 1) * BLOCK_USIZE];
                    if block_crc(block) != e.crc {
                        return Err(VolumeError::Unrecoverable {
                            volume: self.name.clone(),
                            offset_bytes: (base + i as u64) * BLOCK,
                            len_bytes: BLOCK,
                            reason: "capacity tier data does not match its checksum in the tier metadata"
                                .into(),
                        });
                    }
                    data[i * BLOCK_USIZE..(i + 1) * BLOCK_USIZE].copy_from_slice(block);
                    self.counters.destage_fill_blocks.fetch_add(1, Relaxed);
                }
            }
        }
        // Dirty blocks: from the cache log, in runs of consecutive positions.
        let mut i = 0;
        while i < n {
            if !snapshot[i].in_cache() {
                i += 1;
                continue;
            }
            let mut j = i + 1;
            while j < n
                && snapshot[j].in_cache()
                && snapshot[j].position == snapshot[j - 1].position + 1
                && self.log.block_of(snapshot[j].position) != 0
            {
                j += 1;
            }
            let off = self.log.block_of(snapshot[i].position) * BLOCK;
            let cached = self.cache.read(off, (j - i) * BLOCK_USIZE).await?;
            for k in i..j {
                let block = &cached[(k - i) * BLOCK_USIZE..(k - i + 1) * BLOCK_USIZE];
                if block_crc(block) != snapshot[k].crc {
                    if self.records[bs].lock().entries[k] != snapshot[k] {
                        // Rewritten (and its old position reused) while we read: next time.
                        return Ok(None);
                    }
                    return Err(VolumeError::Unrecoverable {
                        volume: self.name.clone(),
                        offset_bytes: (base + k as u64) * BLOCK,
                        len_bytes: BLOCK,
                        reason: "cached data does not match its checksum in the tier metadata".into(),
                    });
                }
                data[k * BLOCK_USIZE..(k + 1) * BLOCK_USIZE].copy_from_slice(block);
            }
            self.counters.destaged_dirty_blocks.fetch_add((j - i) as u64, Relaxed);
            i = j;
        }
        let len = (n as u64) * BLOCK;
        if data.iter().all(|&b| b == 0) {
            // A blockset of zeros costs the capacity tier no writes (its stripe is unmapped).
            self.cap.write_zeroes(base * BLOCK, len, false, false).await?;
        } else {
            self.cap.write(base * BLOCK, data.freeze(), false).await?;
        }
        Ok(Some(snapshot))
    }

    /// Destages everything that is dirty now (tests, clean shutdown of a benchmark).
    pub async fn destage_all(&self) -> Result<(), VolumeError> {
        loop {
            let (blocks, _) = self.dirty();
            if blocks == 0 {
                return Ok(());
            }
            let before = self.counters.destaged_blocksets.load(Relaxed);
            let n = self.destage_batch().await?;
            if n == 0 && self.counters.destaged_blocksets.load(Relaxed) == before {
                tokio::task::yield_now().await;
            }
        }
    }
}

/// Starts the destager of `vol` on the current tokio runtime.
pub(crate) fn spawn<D: BlockDevice>(vol: &Arc<TieredVolume<D>>) {
    let weak = Arc::downgrade(vol);
    tokio::spawn(destage_loop(weak));
}
