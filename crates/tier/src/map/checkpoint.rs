//! Checkpoints of the map (rules 3 and 4 of the module doc): when one is due, and the write-back
//! of dirty pages that moves the replay position.

use std::sync::Arc;

use stria_dev::{BLOCK_USIZE, BlockDevice, IoBuf, IoBytes};

use super::{
    DirtyPage, ENTRIES_PER_PAGE, HARD_OVER_QUARTERS, MapEntry, MapError, MapStore, POOL_KEY, Pending,
    WRITE_BACK_DEPTH, WRITE_BACK_RUN, encode_header, encode_page,
};

impl<D: BlockDevice> MapStore<D> {
    /// Starts a checkpoint when one is due: wakes the checkpoint task, or (without one) runs it
    /// here unless one is running. Waits for one when the cache is past its hard bound.
    pub(super) async fn after_update(&self) -> Result<(), MapError> {
        let stats = self.cache.stats();
        let hard = stats.budget_pages + stats.budget_pages * HARD_OVER_QUARTERS / 4;
        if self.cache.over_budget() && stats.resident_pages > hard {
            let _one = self.checkpointing.lock().await;
            self.counts.lock().checkpoint_waits += 1;
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
    pub(super) fn due(&self) -> bool {
        let budget = self.cache.stats().budget_pages;
        self.ring_used.load(std::sync::atomic::Ordering::Relaxed) >= self.layout().log_blocks / 2
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
    pub(super) async fn write_back(&self) -> Result<(), MapError> {
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
            self.vol.write(self.layout().base, IoBytes::copy_from(&buf), true).await?;
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
            // One checkpoint at a time (the caller holds `checkpointing`), so the position replay
            // starts at only rises, and never past what was logged.
            assert!(
                log.replay_seq <= until && until <= log.next_seq,
                "map checkpoint: replay would move from {} to {until} with {} blocks logged",
                log.replay_seq,
                log.next_seq
            );
            log.replay_seq = until;
            let mut counts = self.counts.lock();
            counts.checkpoints += 1;
            counts.pages_written += pages.len() as u64;
            drop(counts);
            self.note_ring(&log);
        }
        drop(pages);
        self.cache.trim();
        Ok(())
    }

    /// Writes `pages` (sorted by index): runs of consecutive pages as one write of up to
    /// [`WRITE_BACK_RUN`] pages, [`WRITE_BACK_DEPTH`] writes in flight.
    pub(super) async fn write_pages(&self, pages: &[DirtyPage]) -> Result<(), MapError> {
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
        // Runs of consecutive pages are found in order: each page once, in key order.
        assert!(
            pages.windows(2).all(|w| w[0].0 < w[1].0),
            "map checkpoint: dirty pages out of order or taken twice"
        );
        let layout = self.layout();
        let mut runs: Vec<&[DirtyPage]> = Vec::new();
        let mut start = 0;
        for i in 1..=pages.len() {
            let ends = i == pages.len()
                || pages[i].0 != pages[i - 1].0 + 1
                || !layout.key_follows(pages[i - 1].0)
                || (i - start) as u64 == WRITE_BACK_RUN;
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
                .map(|(run, buf)| self.vol.write(layout.key_offset(run[0].0), buf.freeze(), false));
            stria_engine::join_all_ok(writes).await?;
        }
        Ok(())
    }

    /// The bytes of the pages of `runs` (map rule 4: every change whose delta is not durable
    /// yet is undone, so a page written holds only changes the durable log leads to), and the
    /// pages that had such a change. Updates wait while it encodes.
    pub(super) fn encode_durable(&self, runs: &[&[DirtyPage]]) -> (Vec<IoBuf>, Vec<DirtyPage>) {
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
}

/// What each entry held before its oldest change not durable yet, by (page key, slot), for the
/// pages `wanted` picks, counting the deltas of `pending` from index `from` on. A snapshot's
/// copy also undoes the head's changes queued before its preserve record (the copy has them;
/// they are durable only with the record).
pub(super) fn undo_map(
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
