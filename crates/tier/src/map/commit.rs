//! Group commit of the map log (rule 1 of the module doc): queued deltas become durable in log
//! blocks written with FUA, one writer at a time, as many callers' deltas to a block as are
//! queued when it is written.

use stria_dev::{BLOCK_USIZE, BlockDevice, IoBuf, IoBytes};

use super::{
    DELTAS_PER_LOG_BLOCK, Delta, GROUP_YIELDS, LogState, MapError, MapStore, Pending, encode_log_block,
};

impl<D: BlockDevice> MapStore<D> {
    /// Makes every delta queued up to `ticket` durable (group commit: one caller writes all
    /// that is queued, the others find theirs done).
    pub(super) async fn commit(&self, ticket: u64) -> Result<(), MapError> {
        // Let the tasks that are ready queue their deltas first: one log block then carries
        // them all (a log block is a 4 KiB mirrored write, whatever it holds). Yield until two
        // passes in a row bring nothing (writers whose cache writes complete meanwhile join):
        // in stria-bench-wa (qd 16) a log block carried 6.6 deltas after one pass and 29 this
        // way, at the same IOPS (docs/design/log-structured-volumes.md, "Group commit").
        let (mut seen, mut idle) = (self.pending.lock().queued, 0);
        assert!(ticket <= seen, "map log: waiting for delta {ticket}, and {seen} were ever queued");
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
                    self.counts.lock().checkpoint_waits += 1;
                    drop(log);
                    let _one = self.checkpointing.lock().await;
                    if self.ring_used.load(std::sync::atomic::Ordering::Relaxed) >= self.layout().log_blocks {
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
    pub(super) async fn write_pending(&self, log: &mut LogState) -> Result<bool, MapError> {
        let mut buf = IoBuf::zeroed(BLOCK_USIZE);
        loop {
            // The oldest deltas stay queued until their log block is written: only the holder of
            // the log removes them, and others only append.
            let (chunk, copies) = {
                let p = self.pending.lock();
                if p.deltas.is_empty() {
                    assert!(
                        p.queued >= log.durable,
                        "map log: {} deltas durable, {} ever queued",
                        log.durable,
                        p.queued
                    );
                    log.durable = p.queued;
                    self.durable_seen.store(log.durable, std::sync::atomic::Ordering::SeqCst);
                    return Ok(true);
                }
                if log.next_seq - log.replay_seq >= self.layout().log_blocks {
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
                let pl = self.layout().pool.expect("preserves need a pool");
                let writes = copies.into_iter().map(|(pool, bytes)| {
                    self.vol.write(pl.page_offset(u64::from(pool)), bytes.freeze(), true)
                });
                stria_engine::join_all_ok(writes).await?;
            }
            // The block this write overwrites (a lap of the ring ago) is one replay no longer
            // needs: replay starts at `replay_seq` and reads the ring's blocks from there.
            assert!(
                log.replay_seq <= log.next_seq && log.next_seq - log.replay_seq < self.layout().log_blocks,
                "map log: block {} would overwrite one that replay from {} needs ({} blocks in the ring)",
                log.next_seq,
                log.replay_seq,
                self.layout().log_blocks
            );
            if let Some(barrier) = self.barrier.get() {
                barrier().await?;
            }
            encode_log_block(log.next_seq, &chunk, &mut buf);
            let bytes = IoBytes::copy_from(&buf);
            self.vol.write(self.layout().log_block_offset(log.next_seq), bytes, true).await?;
            let logged = {
                let mut p = self.pending.lock();
                // Only the holder of the log removes deltas: the oldest `taken` are still these.
                assert!(
                    p.deltas.len() >= taken,
                    "map log: queued deltas removed by a task that does not hold the log"
                );
                let Pending { deltas, copies, .. } = &mut *p;
                for d in deltas.drain(..taken) {
                    if let Some((_, _, pool, _)) = d.preserve {
                        copies.remove(&pool);
                    }
                }
                p.queued - p.deltas.len() as u64
            };
            log.next_seq += 1;
            {
                let mut counts = self.counts.lock();
                counts.log_blocks_written += 1;
                counts.deltas_logged += chunk.len() as u64;
            }
            assert!(
                logged >= log.durable,
                "map log: durable deltas went back from {} to {logged}",
                log.durable
            );
            log.durable = logged;
            self.durable_seen.store(logged, std::sync::atomic::Ordering::SeqCst);
            self.note_ring(log);
        }
    }
}
