//! State shared by a pool and its volumes: metadata and its commits, the open drives, flushes.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use arc_swap::ArcSwap;
use futures::future::join_all;
use smallvec::SmallVec;
use stria_dev::BlockDevice;
use uuid::Uuid;

use super::epochs::EpochBook;
use super::store::{self, DriveQuorum, MetaStore, Scope};
use crate::drive::journal::MAX_VOLUME_MARKS;
use crate::drive::{Drive, Watermarks};
use crate::error::EngineError;
use crate::format::meta::{DriveState, PoolMeta};
use crate::gate::OpGate;

/// The drive slots a stripe transaction writes in place (its pieces' drives).
type TxnSlots = SmallVec<[u32; 8]>;

/// One stripe transaction not yet durable: its volume and the drives it writes.
#[derive(Debug)]
struct Txn {
    volume: u64,
    slots: TxnSlots,
}

/// Stripe transactions on their way to being durable.
#[derive(Debug, Default)]
struct Txns {
    /// Started, not yet applied in place on every drive they name.
    unapplied: BTreeMap<u64, Txn>,
    /// Applied in place (or abandoned before any in-place write), not yet made durable by a
    /// flush of their drives.
    unflushed: BTreeMap<u64, Txn>,
    /// How many transactions of each volume are in `unapplied` or `unflushed` (no entry at 0).
    pending: HashMap<u64, usize>,
}

impl Txns {
    fn start(&mut self, id: u64, volume: u64, slots: TxnSlots) {
        let fresh = self.unapplied.insert(id, Txn { volume, slots }).is_none();
        assert!(fresh, "stripe transaction id {id} handed out twice");
        *self.pending.entry(volume).or_insert(0) += 1;
    }

    /// Transaction `id` is durable: it no longer holds its volume's mark back.
    fn flushed(&mut self, id: u64) {
        let txn = self.unflushed.remove(&id);
        let volume = txn.unwrap_or_else(|| panic!("stripe transaction {id} flushed twice")).volume;
        let n = self.pending.get_mut(&volume).expect("a pending transaction counted");
        *n -= 1;
        if *n == 0 {
            self.pending.remove(&volume);
        }
    }
}

/// How far the flushes of one scope have covered its callers: the arrivals up to `upto`, with
/// the drives `slots` (`None`: every drive) flushed after they arrived. A caller whose volume's
/// members have changed since (a move switched a member to another drive) is covered only if
/// its drives are among those (simulation seed 8976: a flush of the old member set answered a
/// caller whose write had gone to the new member's drive).
#[derive(Debug, Clone, Default)]
struct Covered {
    upto: u64,
    slots: Option<Vec<u32>>,
}

impl Covered {
    fn covers(&self, arrival: u64, slots: Option<&[u32]>) -> bool {
        self.upto >= arrival
            && match (&self.slots, slots) {
                (None, _) => true,
                (Some(_), None) => false,
                (Some(flushed), Some(wanted)) => wanted.iter().all(|s| flushed.contains(s)),
            }
    }
}

/// What one flush covers.
#[derive(Debug, Clone, Copy)]
pub(crate) enum FlushScope<'a> {
    /// Every drive of the pool.
    Pool,
    /// The drives of one volume: its id and its members' slots.
    Volume { id: u64, slots: &'a [u32] },
}

impl FlushScope<'_> {
    fn key(self) -> Option<u64> {
        match self {
            FlushScope::Pool => None,
            FlushScope::Volume { id, .. } => Some(id),
        }
    }

    /// The drives the scope flushes (`None`: every drive).
    fn slots(self) -> Option<Vec<u32>> {
        match self {
            FlushScope::Pool => None,
            FlushScope::Volume { slots, .. } => Some(slots.to_vec()),
        }
    }

    fn holds(self, slot: u32) -> bool {
        match self {
            FlushScope::Pool => true,
            FlushScope::Volume { slots, .. } => slots.contains(&slot),
        }
    }

    fn holds_volume(self, volume: u64) -> bool {
        match self {
            FlushScope::Pool => true,
            FlushScope::Volume { id, .. } => id == volume,
        }
    }
}

/// The part of a pool that volumes hold on to.
pub(crate) struct PoolCore<D: BlockDevice> {
    /// Authoritative metadata; the lock serialises commits.
    meta: tokio::sync::Mutex<PoolMeta>,
    /// The last committed metadata, for readers that need no lock.
    snapshot: ArcSwap<PoolMeta>,
    /// Every drive the pool knows, open or missing, in slot order (shared with the store).
    drives: Arc<ArcSwap<Vec<Arc<Drive<D>>>>>,
    /// Where commits go (pool/store.rs): the drives themselves today.
    store: Box<dyn MetaStore>,
    /// Asked before every commit, once set (`Pool::set_commit_guard`).
    guard: std::sync::OnceLock<Arc<dyn store::CommitGuard>>,
    txn_next: AtomicU64,
    /// Erasure-coded stripe transactions not yet durable in place, with their volumes
    /// (docs/crash-consistency.md invariant 4).
    txns: parking_lot::Mutex<Txns>,
    /// Woken whenever a transaction is applied (or abandoned): what a writer that found a
    /// journal full waits for before it flushes and tries again.
    txn_applied: tokio::sync::Notify,
    /// Set when a drive failure could not be committed: from then on no write or flush may be
    /// acknowledged (a drive the metadata still calls active would miss it).
    poisoned: AtomicBool,
    /// Set when a drive answered that a newer owner fenced it (docs/design/cluster.md): from
    /// then on the pool refuses writes and fails no drive (which drives are in service is the
    /// new owner's decision, not this one's).
    fenced: AtomicBool,
    /// Why writes are suspended (a full host filesystem, see suspend.rs); `None` when not.
    pub(super) suspended: parking_lot::Mutex<Option<String>>,
    /// Fast check of `suspended.is_some()` on the write path.
    pub(super) suspended_flag: AtomicBool,
    /// Flush requests arrived, per scope (`None`: the whole pool; `Some(id)`: one volume).
    flush_arrivals: parking_lot::Mutex<HashMap<Option<u64>, u64>>,
    /// Held while a flush runs (flushes run one at a time): the arrivals each scope's flushes
    /// have covered.
    flush_covered: tokio::sync::Mutex<HashMap<Option<u64>, Covered>>,
    /// Operations in progress (see gate.rs); a clean close waits for them.
    pub(crate) ops: OpGate,
    /// The highest generation any commit has tried to write. A commit that fails (no
    /// majority) or is abandoned half way may have left its document on some drives, so its
    /// generation is never used again for different contents.
    generation_high: AtomicU64,
    /// The highest transaction watermark a flush has used (it may only grow).
    watermark_high: AtomicU64,
    /// Every drive's flush epochs (docs/design/stale-copies.md): claimed under the flush lock,
    /// confirmed once the drives hold them.
    epochs: parking_lot::Mutex<EpochBook>,
    /// Serialises take-commit-settle of the drives' pending error counters (pool/errors.rs), so
    /// that no delta is committed twice.
    pub(super) error_commit: tokio::sync::Mutex<()>,
    /// Held while a commit publishes its metadata (and settles what it carried), so a reader
    /// holding it sees the committed document and the drives' pending counts agree.
    pub(super) publish: parking_lot::Mutex<()>,
    /// Checksum pages each drive keeps cached (see pool/csum_cache.rs).
    pub(super) csum_cache_pages: AtomicU64,
    /// The open out generation (docs/design/delta-resync.md; 0: none). Changed only under its
    /// lock, which `fail_drive` holds while it opens and seeds it.
    out_generation: parking_lot::Mutex<u64>,
    /// Held by `fail_drive` from before it marks the drive failed until its commit: a caller
    /// that finds the drive failed in memory waits for that commit (which carries the drive's
    /// out record) instead of committing the failure without one. Every other metadata commit
    /// takes it too, before `meta` (`update_then`), so none comes between the two.
    failing: tokio::sync::Mutex<()>,
}

impl<D: BlockDevice> std::fmt::Debug for PoolCore<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolCore").field("generation", &self.snapshot.load().generation).finish()
    }
}

impl<D: BlockDevice> PoolCore<D> {
    pub(crate) fn new(
        meta: PoolMeta,
        drives: Vec<Arc<Drive<D>>>,
        txn_next: u64,
        committed_generation: u64,
        epochs: EpochBook,
    ) -> PoolCore<D> {
        let drives = Arc::new(ArcSwap::from_pointee(drives));
        PoolCore {
            snapshot: ArcSwap::from_pointee(meta.clone()),
            meta: tokio::sync::Mutex::new(meta),
            store: Box::new(DriveQuorum::new(Arc::clone(&drives), committed_generation)),
            guard: std::sync::OnceLock::new(),
            drives,
            txn_next: AtomicU64::new(txn_next),
            txns: parking_lot::Mutex::new(Txns::default()),
            txn_applied: tokio::sync::Notify::new(),
            poisoned: AtomicBool::new(false),
            fenced: AtomicBool::new(false),
            suspended: parking_lot::Mutex::new(None),
            suspended_flag: AtomicBool::new(false),
            flush_arrivals: parking_lot::Mutex::new(HashMap::new()),
            flush_covered: tokio::sync::Mutex::new(HashMap::new()),
            ops: OpGate::default(),
            generation_high: AtomicU64::new(0),
            watermark_high: AtomicU64::new(0),
            epochs: parking_lot::Mutex::new(epochs),
            error_commit: tokio::sync::Mutex::new(()),
            publish: parking_lot::Mutex::new(()),
            csum_cache_pages: AtomicU64::new(crate::drive::csum::DEFAULT_CSUM_CACHE_PAGES),
            out_generation: parking_lot::Mutex::new(0),
            failing: tokio::sync::Mutex::new(()),
        }
    }

    /// At open: the out generation the failed drives' records name (if any) stays open on the
    /// drives whose pages carry it (`loaded` by slot); the others do not have it.
    pub(crate) fn adopt_out_generation(&self, loaded: &HashMap<u32, Option<u64>>) {
        let open = self.meta().drives.iter().find_map(|d| d.out.as_ref().map(|o| o.generation));
        *self.out_generation.lock() = open.unwrap_or(0);
        for d in self.drives.load().iter() {
            d.out.adopt(loaded.get(&d.slot()).copied().flatten(), open);
        }
    }

    /// The open out generation, if any.
    pub(crate) fn out_generation(&self) -> Option<u64> {
        Some(*self.out_generation.lock()).filter(|&g| g != 0)
    }

    /// Opens the out generation (a new one when none is open) on the drives that may carry it
    /// and seeds it with every region they have a write or hold in flight in, or an intent bit
    /// set; in memory only ([`PoolCore::persist_out_generation`] writes it). Must run before
    /// `slot` is marked failed (docs/design/delta-resync.md, rule R2).
    fn open_out_generation(&self, slot: u32) -> u64 {
        let mut open = self.out_generation.lock();
        let fresh = *open == 0;
        if fresh {
            *open = Uuid::new_v4().as_u64_pair().0 | 1;
        }
        let g = *open;
        for d in self.drives.load().iter() {
            if d.slot() == slot || d.is_failed() || d.is_missing() {
                continue;
            }
            // A drive that joined after the generation opened missed its start: it never gets it.
            if fresh {
                d.out.open(g);
            } else if d.out.generation() != Some(g) {
                continue;
            }
            for r in d.intent.busy_regions() {
                d.out.seed(r);
            }
        }
        g
    }

    /// Writes the out generation `g` to every drive that has it (but `slot`); a drive that
    /// cannot take it loses it (it is then no source of a delta), nothing else.
    async fn persist_out_generation(&self, g: u64, slot: u32) {
        for d in self.drives.load().iter() {
            if d.slot() == slot || d.is_failed() || d.out.generation() != Some(g) {
                continue;
            }
            if let Err(e) = d.out.persist(d.device()).await {
                tracing::warn!(slot = d.slot(), error = %e, "out bitmap not written; the drive is no delta source");
            }
        }
    }

    /// Closes the out generation once no drive record is out any more.
    pub(crate) fn close_out_generation_if_done(&self) {
        let mut open = self.out_generation.lock();
        if *open == 0 || self.meta().drives.iter().any(|d| d.out.is_some()) {
            return;
        }
        *open = 0;
        for d in self.drives.load().iter() {
            d.out.close();
        }
        tracing::info!("no drive is out any more: out bitmaps closed");
    }

    /// Puts `drive` in the place of the failed drive object of its slot (a drive back for a
    /// delta resync) and commits `change` (which makes it active), with no flush in between (a
    /// flush must not confirm the epoch of a drive the metadata still calls failed): the flush
    /// epochs of the slot restart at `epoch`, what its flush record holds, and its record is
    /// rewritten with the witnesses. If the commit fails the drive is failed again in memory.
    pub(crate) async fn readmit_drive(
        &self,
        drive: Arc<Drive<D>>,
        epoch: u64,
        change: impl FnOnce(&mut PoolMeta) -> Result<((), bool), EngineError>,
    ) -> Result<(), EngineError> {
        let _no_flush = self.flush_covered.lock().await;
        let slot = drive.slot();
        let witnesses = {
            let mut book = self.epochs.lock();
            book.forget(slot);
            book.admit_at(slot, epoch);
            book.witnesses()
        };
        drive.write_flush_record(epoch, &witnesses, true).await?;
        drive.set_csum_cache_pages(self.csum_cache_pages.load(std::sync::atomic::Ordering::Relaxed));
        if let Some(old) = self.drive(slot) {
            old.set_failed();
            old.retired.store(true, Ordering::SeqCst);
        }
        let mut all: Vec<Arc<Drive<D>>> =
            self.drives.load().iter().filter(|d| d.slot() != slot).cloned().collect();
        all.push(Arc::clone(&drive));
        all.sort_by_key(|d| d.slot());
        self.drives.store(Arc::new(all));
        let committed = self.update(change).await;
        if committed.is_err() {
            drive.set_failed();
        }
        committed
    }

    /// The last committed metadata.
    pub(crate) fn meta(&self) -> Arc<PoolMeta> {
        self.snapshot.load_full()
    }

    /// Every drive the pool knows (open or missing).
    pub(crate) fn drives(&self) -> Arc<Vec<Arc<Drive<D>>>> {
        self.drives.load_full()
    }

    /// The drive in `slot`.
    pub(crate) fn drive(&self, slot: u32) -> Option<Arc<Drive<D>>> {
        self.drives.load().iter().find(|d| d.slot() == slot).cloned()
    }

    /// Adds a newly formatted drive, at flush epoch 0 (nothing was ever confirmed of its slot: a
    /// drive that joins is never taken for an old copy; docs/design/stale-copies.md). Admitted
    /// while no flush runs.
    pub(crate) async fn add_drive(&self, drive: Arc<Drive<D>>) -> Result<(), EngineError> {
        let _no_flush = self.flush_covered.lock().await;
        let witnesses = {
            let mut book = self.epochs.lock();
            book.admit(drive.slot());
            book.witnesses()
        };
        drive.write_flush_record(0, &witnesses, true).await?;
        drive.set_csum_cache_pages(self.csum_cache_pages.load(std::sync::atomic::Ordering::Relaxed));
        let mut all: Vec<Arc<Drive<D>>> = (**self.drives.load()).clone();
        all.push(drive);
        all.sort_by_key(|d| d.slot());
        self.drives.store(Arc::new(all));
        Ok(())
    }

    /// The newest metadata generation confirmed on every drive active in it.
    pub(crate) fn confirmed_generation(&self) -> u64 {
        self.store.confirmed_generation()
    }

    /// The newest flush epoch confirmed of the drive in `slot`.
    pub(crate) fn flush_epoch_confirmed(&self, slot: u32) -> u64 {
        self.epochs.lock().confirmed(slot)
    }

    /// Forgets a drive that left the pool (replaced).
    pub(crate) fn remove_drive(&self, slot: u32) {
        self.epochs.lock().forget(slot);
        let all: Vec<Arc<Drive<D>>> =
            self.drives.load().iter().filter(|d| d.slot() != slot).cloned().collect();
        self.drives.store(Arc::new(all));
    }

    /// Starts an erasure-coded stripe transaction of `volume` that writes in place on the drives
    /// `slots`: a fresh id (monotonic across restarts), unapplied until [`PoolCore::txn_done`],
    /// then not durable until a flush of the pool or of a scope holding all of `slots`. `None`
    /// when as many other volumes have transactions not yet durable as a journal header can
    /// name (`MAX_VOLUME_MARKS`): a flush of the pool makes room.
    pub(crate) fn next_txn_id(&self, volume: u64, slots: &[u16]) -> Option<u64> {
        let mut txns = self.txns.lock();
        if txns.pending.len() >= MAX_VOLUME_MARKS && !txns.pending.contains_key(&volume) {
            return None;
        }
        let id = self.txn_next.fetch_add(1, Ordering::Relaxed);
        // An id at or below a watermark already used would count as applied: a checkpoint could
        // release its journal records, and recovery would not replay it.
        let watermark = self.watermark_high.load(Ordering::SeqCst);
        assert!(
            id > watermark,
            "stripe transaction id {id} at or below the transaction watermark {watermark}"
        );
        txns.start(id, volume, slots.iter().map(|&s| u32::from(s)).collect());
        Some(id)
    }

    /// The transaction is applied in place on every drive (or abandoned before any in-place
    /// write); it waits for a flush of its volume's drives.
    pub(crate) fn txn_done(&self, id: u64) {
        let mut txns = self.txns.lock();
        // A transaction completed twice (or never started) would let the watermark pass one
        // still being applied, and recovery would skip its replay.
        let txn = txns.unapplied.remove(&id);
        let txn = txn.unwrap_or_else(|| panic!("stripe transaction {id} completed twice or never started"));
        txns.unflushed.insert(id, txn);
        drop(txns);
        self.txn_applied.notify_waiters();
    }

    /// The transaction watermarks (docs/crash-consistency.md invariant 4): every transaction
    /// handed out so far is applied in place and durable on every drive it names, except those
    /// of the volumes with one unapplied or waiting for a flush, each durable up to one below its
    /// first such transaction.
    pub(crate) fn watermarks(&self) -> Watermarks {
        let txns = self.txns.lock();
        let all = self.txn_next.load(Ordering::Relaxed) - 1;
        let mut first: BTreeMap<u64, u64> = BTreeMap::new();
        for (&id, txn) in txns.unapplied.iter().chain(&txns.unflushed) {
            let f = first.entry(txn.volume).or_insert(id);
            *f = (*f).min(id);
        }
        assert_eq!(first.len(), txns.pending.len(), "pending transactions counted per volume");
        let except: Vec<(u64, u64)> = first.into_iter().map(|(v, id)| (v, id - 1)).collect();
        assert!(
            except.len() <= MAX_VOLUME_MARKS,
            "{} volumes with transactions not yet durable: next_txn_id admits at most {MAX_VOLUME_MARKS}",
            except.len()
        );
        Watermarks { all, except }
    }

    /// Applies `change` to a copy of the metadata and commits it. The change returns `false`
    /// when there is nothing to commit. On any error nothing changes in memory either.
    pub(crate) async fn update<T>(
        &self,
        change: impl FnOnce(&mut PoolMeta) -> Result<(T, bool), EngineError>,
    ) -> Result<T, EngineError> {
        self.update_then(Scope::Any, change, || {}).await
    }

    /// [`PoolCore::update`] of the records of one client-visible volume only (its engine
    /// volumes, tiered record and QoS; pool/store.rs): a change that touches any other record is
    /// refused and nothing is written. What a coordinator of one volume will be allowed to
    /// commit.
    pub(crate) async fn update_volume<T>(
        &self,
        volume: &str,
        change: impl FnOnce(&mut PoolMeta) -> Result<(T, bool), EngineError>,
    ) -> Result<T, EngineError> {
        self.update_then(Scope::Volume(volume), change, || {}).await
    }

    /// [`PoolCore::update`], running `published` once the change is committed (or at once when
    /// there is nothing to commit) under the same `publish` lock as the store of the new
    /// document, so readers holding that lock see both or neither. Not run on an error.
    pub(crate) async fn update_then<T>(
        &self,
        scope: Scope<'_>,
        change: impl FnOnce(&mut PoolMeta) -> Result<(T, bool), EngineError>,
        published: impl FnOnce(),
    ) -> Result<T, EngineError> {
        // No commit goes between a `fail_drive`'s marking its drive failed in memory and the
        // commit of that failure: such a commit would leave the drive out while its document
        // still counts it active, and miss the majority on a pool of two drives (crash
        // sequence seed 21560: a clean close racing a drive failure). Lock order: `failing`,
        // then `meta`.
        let _failing = self.failing.lock().await;
        self.update_then_failing(scope, change, published).await
    }

    /// [`PoolCore::update_then`] for a caller that holds `failing` (a drive failure's commit).
    async fn update_then_failing<T>(
        &self,
        scope: Scope<'_>,
        change: impl FnOnce(&mut PoolMeta) -> Result<(T, bool), EngineError>,
        published: impl FnOnce(),
    ) -> Result<T, EngineError> {
        let mut current = self.meta.lock().await;
        let mut next = current.clone();
        let (out, changed) = change(&mut next)?;
        let touched = match (changed, current.generation) {
            (false, _) => Vec::new(),
            (true, 0) => store::all(&next), // a new pool's first commit
            (true, _) => store::changed(&current, &next),
        };
        store::check_scope(scope, &touched)?;
        if changed && self.fenced.load(Ordering::Acquire) {
            return Err(EngineError::Fenced);
        }
        if !changed {
            let _publish = self.publish.lock();
            published();
            return Ok(out);
        }
        // A drive that cannot take the metadata is dead too: fail it and try again with the
        // drives that are left (under a new generation: the first attempt's document may be on
        // some drives).
        loop {
            next.generation = self.claim_generation(current.generation);
            store::stamp(&mut next, &touched);
            if let Some(guard) = self.guard.get()
                && let Err(why) = guard.allow(&next).await
            {
                tracing::error!(generation = next.generation, %why, "the commit guard refused a metadata change");
                return Err(EngineError::GuardRefused(why));
            }
            let report = self.store.commit(&current, &next).await;
            let (result, dead) = (report.result, report.dead);
            // A drive a newer owner fenced is not dead: this owner has lost the pool. Dropping
            // the fenced drives and committing on the ones left would make a second pool of
            // them (docs/design/cluster.md §4.3), so stop here, failing nothing.
            if let Some(&slot) = dead.iter().find(|&&slot| self.drive(slot).is_some_and(|d| d.was_fenced())) {
                self.set_fenced(slot);
                return Err(EngineError::Fenced);
            }
            let full = report.full.iter().map(|(slot, e)| self.suspend(*slot, "metadata write", e)).last();
            // A drive that missed the document because the host filesystem is full is not
            // failed: the pool suspends writes instead. Missing one generation is what a crash
            // during a commit leaves too, and assembly copes with it (the drive's superblock
            // stays at or above the newest generation confirmed on every drive).
            let result = match (result, full) {
                (Err(_), Some(reason)) => return Err(EngineError::HostFull(reason)),
                (r, _) => r,
            };
            match (result, dead) {
                (Ok(()), dead) if dead.is_empty() => {
                    self.confirm(&next).await;
                    break;
                }
                // Committed, but some drives missed it: they are failed in memory now, and their
                // failure is committed before anything relies on it (invariant 5).
                (Ok(()), dead) => {
                    for slot in dead {
                        if let Some(d) = self.drive(slot) {
                            d.set_failed();
                        }
                    }
                    break;
                }
                (Err(e), dead) if dead.is_empty() => return Err(e),
                (Err(_), dead) => {
                    for slot in dead {
                        if let Some(d) = self.drive(slot) {
                            d.set_failed();
                        }
                        if let Some(rec) = next.drives.iter_mut().find(|r| r.slot == slot) {
                            tracing::error!(slot, "drive failed: metadata write failed");
                            rec.state = DriveState::Failed;
                            rec.failed_reason = Some("metadata write failed".into());
                        }
                    }
                }
            }
        }
        {
            let _publish = self.publish.lock();
            self.snapshot.store(Arc::new(next.clone()));
            published();
        }
        *current = next;
        Ok(out)
    }

    /// A generation above `committed` and above every generation attempted before, claimed
    /// before anything is written (so a commit abandoned half way still uses it up).
    fn claim_generation(&self, committed: u64) -> u64 {
        let high = self.generation_high.fetch_max(committed, Ordering::SeqCst).max(committed);
        let claimed = high + 1;
        let prev = self.generation_high.fetch_max(claimed, Ordering::SeqCst);
        assert!(prev < claimed, "metadata generation {claimed} claimed twice (commits are serialised)");
        claimed
    }

    /// After generation `meta.generation` reached every drive active in it: records that on
    /// those drives (their superblocks' `committed_generation`). From then on a drive whose
    /// superblock is older than this generation can only be an old copy, and assembly keeps it
    /// out (docs/on-disk-format.md §2). A drive that cannot take the confirmation is failed in
    /// memory, like one that cannot take a commit; the rest keep theirs.
    async fn confirm(&self, meta: &PoolMeta) {
        for (slot, e) in self.store.confirm(meta).await {
            // The drive holds generation `g` (the commit wrote it); only the confirmation is
            // missing, which a later commit writes again.
            if e.is_no_space() {
                self.suspend(slot, "superblock confirmation", &e);
            } else if e.is_fenced() {
                self.set_fenced(slot);
            } else {
                tracing::error!(slot, error = %e, "superblock confirmation failed; failing the drive");
                if let Some(d) = self.drive(slot) {
                    d.set_failed();
                }
            }
        }
    }

    /// Errors once a drive failure could not be committed (see `poisoned`).
    pub(crate) fn check_writable(&self) -> Result<(), EngineError> {
        if self.fenced.load(Ordering::Acquire) {
            return Err(EngineError::Fenced);
        }
        if self.poisoned.load(Ordering::Acquire) {
            return Err(EngineError::WritesRefused);
        }
        if self.suspended_flag.load(Ordering::Acquire)
            && let Some(reason) = self.suspension()
        {
            return Err(EngineError::HostFull(reason));
        }
        Ok(())
    }

    /// True when the committed metadata already says the drive in `slot` is failed (or the drive
    /// has left the pool).
    pub(crate) fn failure_committed(&self, slot: u32) -> bool {
        self.snapshot.load().drive(slot).is_none_or(|r| r.state == DriveState::Failed)
    }

    /// Fails the drive in `slot`: no new I/O goes to it from now on, and its state is committed
    /// before this returns (so no write that skipped it is acknowledged before the pool knows).
    /// If the commit fails the pool is poisoned: it refuses writes from then on.
    pub(crate) async fn fail_drive(&self, slot: u32, reason: String) -> Result<(), EngineError> {
        self.fail_drive_of(slot, None, reason).await
    }

    /// [`PoolCore::fail_drive`] of the drive object numbered `incarnation` (`None`: the one
    /// in the slot now). The failure waits for the failure lock; a drive that comes back by a
    /// delta resync meanwhile is a new object in the slot, which this failure is not about (the
    /// old object's failure was committed before it could come back): then nothing is done.
    /// Failing the new object instead would leave it failed in memory while the metadata says
    /// active, so that commits and confirmations skip it and the next open finds it stale
    /// (cluster simulation seed 120971).
    pub(crate) async fn fail_drive_of(
        &self,
        slot: u32,
        incarnation: Option<u64>,
        reason: String,
    ) -> Result<(), EngineError> {
        let erred = incarnation.or_else(|| self.drive(slot).map(|d| d.incarnation()));
        if self.fenced.load(Ordering::Acquire) || self.drive(slot).is_some_and(|d| d.was_fenced()) {
            self.set_fenced(slot);
            return Err(EngineError::Fenced);
        }
        let _failing = self.failing.lock().await;
        if let (Some(erred), Some(now)) = (erred, self.drive(slot))
            && now.incarnation() != erred
        {
            tracing::info!(slot, %reason, "a failure of the drive before it came back to its slot; nothing to do");
            return Ok(());
        }
        // A drive failed here (not already by the commit machinery) may come back by a delta
        // resync: the other drives start marking what it misses before it is marked failed.
        let delta = self
            .drive(slot)
            .filter(|d| !d.is_failed() && !d.is_missing())
            .map(|_| self.open_out_generation(slot));
        if let Some(d) = self.drive(slot) {
            d.set_failed();
        }
        let delta = match delta {
            Some(g) => {
                self.persist_out_generation(g, slot).await;
                Some((g, self.flush_epoch_confirmed(slot)))
            }
            None => None,
        };
        let result = self.fail_drive_commit(slot, reason, delta).await;
        if result.is_err() {
            self.poisoned.store(true, Ordering::Release);
        }
        result
    }

    /// At open, before anything is written: records the drive of `slot`, active in the metadata
    /// but not found (or found stale), as failed, with an out record so that the very drive can
    /// come back by a delta resync. Nothing runs yet, so every write it may have missed is one
    /// the others have an intent bit set for (rule R2 kept them set), which seed the generation.
    /// `witnessed` is the flush epoch the other drives' records saw of it: with none, an old
    /// copy could not be told apart, and it gets no out record.
    pub(crate) async fn fail_missing_drive(
        &self,
        slot: u32,
        reason: String,
        witnessed: u64,
    ) -> Result<(), EngineError> {
        let _failing = self.failing.lock().await;
        let delta = if witnessed > 0 {
            let g = self.open_out_generation(slot);
            self.persist_out_generation(g, slot).await;
            Some((g, witnessed))
        } else {
            None
        };
        let result = self.fail_drive_commit(slot, reason, delta).await;
        if result.is_err() {
            self.poisoned.store(true, Ordering::Release);
        }
        result
    }

    /// Sets the guard every later commit asks first; false if one is set already.
    pub(crate) fn set_guard(&self, guard: Arc<dyn store::CommitGuard>) -> bool {
        self.guard.set(guard).is_ok()
    }

    /// Records that the drive in `slot` was fenced by a newer owner: the pool stops taking
    /// writes (see `fenced`).
    pub(crate) fn set_fenced(&self, slot: u32) {
        if !self.fenced.swap(true, Ordering::AcqRel) {
            tracing::error!(slot, "a newer owner fenced this pool's drive; refusing writes from now on");
        }
    }

    async fn fail_drive_commit(
        &self,
        slot: u32,
        reason: String,
        delta: Option<(u64, u64)>,
    ) -> Result<(), EngineError> {
        let logged = reason.clone();
        let changed = self
            .update_then_failing(
                Scope::Any,
                |m| {
                    // A drive that left the pool (replaced, or drained and removed) while a
                    // request that met its error was on its way here: it is out already, and
                    // the request goes on without it. (An error here would poison the pool.)
                    let Some(rec) = m.drives.iter_mut().find(|d| d.slot == slot) else {
                        return Ok((false, false));
                    };
                    if rec.state == DriveState::Failed {
                        return Ok((false, false));
                    }
                    rec.state = DriveState::Failed;
                    rec.failed_reason = Some(reason);
                    rec.out = match (delta, rec.out.take()) {
                        // Failed again during its resync: the same outage goes on. The drive
                        // took part in flushes meanwhile: what comes back must hold them too,
                        // or it is an old copy (one taken during the resync and put back; the
                        // outage's first epoch would let it in for a delta resync, and the
                        // next open would find it behind what the others saw of it).
                        (Some((g, epoch)), Some(mut out)) if out.generation == g => {
                            out.epoch = out.epoch.max(epoch);
                            Some(out)
                        }
                        (Some((generation, epoch)), _) => Some(crate::format::meta::OutRecord {
                            generation,
                            since_unix_secs: crate::time::now_unix_secs(),
                            epoch,
                            regions: Vec::new(),
                        }),
                        (None, _) => None,
                    };
                    Ok((true, true))
                },
                || {},
            )
            .await?;
        if changed {
            tracing::error!(slot, reason = %logged, "drive failed");
        }
        Ok(())
    }

    /// Flushes every drive of the pool written since the last flush, and checkpoints every
    /// journal: [`PoolCore::flush`] of the whole pool (what a clean close, recovery, metadata
    /// changes and a full journal ring need).
    pub(crate) async fn flush_all(&self) -> Result<(), EngineError> {
        self.flush(FlushScope::Pool).await
    }

    /// Makes every write completed before the call durable on the drives of `scope`.
    ///
    /// Flushes each drive of the scope written since the last flush, then checkpoints the
    /// scope's journals with the pool's transaction watermark (two phases, docs/crash-
    /// consistency.md invariant 4): the scope's transactions applied before the flush are
    /// durable once their drives are flushed (a transaction's pieces are on its volume's
    /// drives), and only then do they stop holding the watermark back; a record is released
    /// only if its transaction is at or below the watermark, that is applied *and* flushed,
    /// whichever volume it belongs to. Each drive written raises its flush epoch
    /// (docs/design/stale-copies.md): its flush makes its record of the new epoch durable after
    /// its data, and once every flushed drive holds its record the new epochs are confirmed in
    /// the records of the scope's drives. With nothing written and no transaction of the scope
    /// applied since the last flush, nothing is done. A drive whose flush fails is failed.
    /// Flushes run one at a time; concurrent callers of one scope share a flush, and a flush of
    /// the pool covers every volume's callers that arrived before it.
    pub(crate) async fn flush(&self, scope: FlushScope<'_>) -> Result<(), EngineError> {
        let key = scope.key();
        let arrival = {
            let mut arrivals = self.flush_arrivals.lock();
            let n = arrivals.entry(key).or_insert(0);
            *n += 1;
            *n
        };
        let mut covered = self.flush_covered.lock().await;
        let slots = scope.slots();
        if covered.get(&key).is_some_and(|c| c.covers(arrival, slots.as_deref())) {
            return Ok(());
        }
        // What this flush will cover: every arrival so far of its scope (of every scope, for the
        // whole pool).
        let covers: Vec<(Option<u64>, u64)> = {
            let arrivals = self.flush_arrivals.lock();
            match scope {
                FlushScope::Pool => arrivals.iter().map(|(&k, &n)| (k, n)).collect(),
                FlushScope::Volume { .. } => vec![(key, arrivals[&key])],
            }
        };
        self.check_writable()?;
        let drives = self.drives();
        let ours: Vec<&Arc<Drive<D>>> = drives.iter().filter(|d| scope.holds(d.slot())).collect();
        // A drive left out of the flush because it failed must be failed in the committed
        // metadata too, or the flush would vouch for data it did not flush.
        for d in ours.iter().filter(|d| d.is_failed() && !self.failure_committed(d.slot())) {
            self.fail_drive(d.slot(), "failed before a flush".into()).await?;
        }
        let live: Vec<&Arc<Drive<D>>> = ours.iter().copied().filter(|d| !d.is_failed()).collect();
        // Taken before the drives are flushed: each was applied in place before this point, so
        // after the flush below it is durable on its drives. Only those whose every drive the
        // scope holds: a move's switch may have pointed a member at another drive after the
        // caller named the volume's drives, and a transaction applied there since waits for a
        // flush that holds that drive (simulation seed 167478: its pieces on the new drive
        // were lost in a power cut while the watermark had passed it).
        let txns: Vec<u64> = {
            let txns = self.txns.lock();
            txns.unflushed
                .iter()
                .filter(|(_, t)| scope.holds_volume(t.volume) && t.slots.iter().all(|&s| scope.holds(s)))
                .map(|(&id, _)| id)
                .collect()
        };
        // Taken before the drives are flushed too: a write that completes after this point sets
        // its drive's flag again for the next flush. A drive not written since the last flush
        // took its flag holds nothing that flush did not make durable (flushes run one at a
        // time, so that flush is over).
        let written: Vec<&Arc<Drive<D>>> = live.iter().copied().filter(|d| d.take_written()).collect();
        // Nothing to make durable, and no checkpoint to move: the watermark is where the last
        // flush left it (the first flush after an open always moves it, and so checkpoints the
        // records recovery found; simulation seed 852).
        let stays = self.watermarks().lowest() == self.watermark_high.load(Ordering::SeqCst);
        if written.is_empty() && txns.is_empty() && stays {
            Self::mark_covered(&mut covered, &covers, &slots);
            return Ok(());
        }
        let result = self.flush_drives(&live, &written, &txns).await;
        if result.is_err() {
            // Whatever was taken is not covered: the next flush must not skip it.
            for d in &written {
                d.mark_written();
            }
        } else {
            Self::mark_covered(&mut covered, &covers, &slots);
        }
        result
    }

    /// Flushes run one at a time and each takes its arrivals after the last one's, so `n` is
    /// never below what a scope's entry holds.
    fn mark_covered(
        covered: &mut HashMap<Option<u64>, Covered>,
        covers: &[(Option<u64>, u64)],
        slots: &Option<Vec<u32>>,
    ) {
        for &(k, n) in covers {
            let c = covered.entry(k).or_default();
            assert!(n >= c.upto, "flush arrivals went back from {} to {n}", c.upto);
            *c = Covered { upto: n, slots: slots.clone() };
        }
    }

    /// The body of [`PoolCore::flush`]: flushes the `written` drives (raising their epochs),
    /// then counts the transactions `txns` durable, checkpoints the journals of the `live` ones
    /// with the watermark that follows, and confirms the new epochs on them.
    async fn flush_drives(
        &self,
        live: &[&Arc<Drive<D>>],
        written: &[&Arc<Drive<D>>],
        txns: &[u64],
    ) -> Result<(), EngineError> {
        // Claimed before any record is written, so an epoch abandoned half way is never reused.
        let (claims, witnesses) = {
            let mut book = self.epochs.lock();
            let claims: Vec<Option<u64>> = written.iter().map(|d| book.claim(d.slot())).collect();
            (claims, book.witnesses())
        };
        let witnesses = &witnesses;
        let flushed = join_all(written.iter().zip(&claims).map(|(d, &claim)| async move {
            match claim {
                Some(e) => d.flush_with_record(e, witnesses).await,
                // The drive left the pool meanwhile (a drained drive removed): no epoch.
                None => d.flush().await,
            }
        }))
        .await;
        for (d, r) in written.iter().zip(flushed) {
            if let Err(e) = r {
                self.drive_error(d.slot(), "flush failed", &e).await?;
            }
        }
        // Every drive the transactions name is flushed (or failed, committed): they are durable.
        {
            let mut t = self.txns.lock();
            for &id in txns {
                t.flushed(id);
            }
        }
        let marks = self.watermarks();
        let watermark = marks.lowest();
        let before = self.watermark_high.fetch_max(watermark, Ordering::SeqCst);
        assert!(
            watermark >= before,
            "transaction watermark went back from {before} to {watermark}: a journal checkpoint would release \
             records of transactions not yet durable"
        );
        let candidates: Vec<u64> = live.iter().map(|d| d.journal.checkpoint_candidate(watermark)).collect();
        // The journal checkpoints and the confirmation go out together: each needs only the
        // flushes above.
        let checkpoints = live.iter().zip(&candidates).filter(|(d, _)| !d.is_failed()).map(|(d, &c)| {
            let marks = &marks;
            async move { (d.slot(), d.checkpoint_journal(c, marks).await) }
        });
        let (checkpointed, confirmed) = futures::join!(join_all(checkpoints), async {
            if written.is_empty() { Ok(()) } else { self.confirm_epochs(live, written).await }
        });
        for (slot, r) in checkpointed {
            if let Err(e) = r {
                self.drive_error(slot, "journal checkpoint failed", &e).await?;
            }
        }
        confirmed
    }

    /// Every `written` drive still in use holds its new epoch durably (a drive that could not
    /// take it was failed, and its failure committed, above): confirms the epochs and writes
    /// them as witnesses into the record of every drive of `live` still in use. Not flushed:
    /// the next flush's records carry them durably; until then a power cut may lose them
    /// (docs/design/stale-copies.md, "What still cannot be told apart").
    async fn confirm_epochs(
        &self,
        live: &[&Arc<Drive<D>>],
        written: &[&Arc<Drive<D>>],
    ) -> Result<(), EngineError> {
        let mut used: Vec<&Arc<Drive<D>>> = live.iter().copied().filter(|d| !d.is_failed()).collect();
        // A witness is only worth something on another drive: a volume down to one live drive
        // (a mirror after two failures) has its epoch witnessed by one more drive of the pool,
        // or an old copy of that drive would find no drive that knows better (simulation seed
        // 6382).
        let others = self.drives();
        if used.len() < 2
            && let Some(other) =
                others.iter().find(|d| !d.is_failed() && used.iter().all(|u| u.slot() != d.slot()))
        {
            used.push(other);
        }
        // A drive failed since `used` was taken (on another thread: a request that met its
        // error) is failed in memory before its failure is committed, so only a drive still
        // in use in memory that the metadata calls failed would be wrong. A record written to
        // one failed meanwhile is harmless: a failed drive's witnesses are never read.
        assert!(
            used.iter()
                .filter(|d| !d.is_failed())
                .all(|d| self.meta().drive(d.slot()).is_none_or(|r| r.state != DriveState::Failed)),
            "flush epochs confirmed with a drive the metadata calls failed"
        );
        let slots: Vec<u32> = written.iter().filter(|d| !d.is_failed()).map(|d| d.slot()).collect();
        // The records carry the new epochs as witnesses; the book counts them confirmed only
        // once every record is written (so what it reports as confirmed is on the drives: a
        // crash between the two never leaves the pool believing in a witness no drive holds).
        let (own, witnesses) = {
            let book = self.epochs.lock();
            let mut next = book.clone();
            next.confirm(&slots);
            let own: Vec<u64> = used.iter().map(|d| book.own(d.slot())).collect();
            (own, next.witnesses())
        };
        let records = used.iter().zip(&own).map(|(d, &e)| d.write_flush_record(e, &witnesses, false));
        let mut all_written = true;
        for (d, r) in used.iter().zip(join_all(records).await) {
            if let Err(e) = r {
                all_written = false;
                self.drive_error(d.slot(), "flush record write failed", &e).await?;
            }
        }
        if all_written {
            self.epochs.lock().confirm(&slots);
        }
        Ok(())
    }
}

/// The pool hosts its volumes (docs/design/seams.md §2.3).
impl<D: BlockDevice> crate::volume::host::VolumeHost for PoolCore<D> {
    fn enter(&self) -> Option<crate::gate::OpPass<'_>> {
        self.ops.enter()
    }

    fn check_writable(&self) -> Result<(), EngineError> {
        PoolCore::check_writable(self)
    }

    fn failure_committed(&self, slot: u32) -> bool {
        PoolCore::failure_committed(self, slot)
    }

    fn fail_member(
        &self,
        slot: u32,
        incarnation: u64,
        reason: String,
    ) -> futures::future::BoxFuture<'_, Result<(), EngineError>> {
        Box::pin(self.fail_drive_of(slot, Some(incarnation), reason))
    }

    fn member_error<'a>(
        &'a self,
        slot: u32,
        incarnation: u64,
        what: &'a str,
        e: &'a stria_dev::DevError,
    ) -> futures::future::BoxFuture<'a, Result<(), EngineError>> {
        Box::pin(self.drive_error_of(slot, Some(incarnation), what, e))
    }

    fn next_txn_id(&self, volume: u64, slots: &[u16]) -> Option<u64> {
        PoolCore::next_txn_id(self, volume, slots)
    }

    fn txn_done(&self, id: u64) {
        PoolCore::txn_done(self, id);
    }

    fn flush_members<'a>(
        &'a self,
        volume: u64,
        slots: &'a [u32],
    ) -> futures::future::BoxFuture<'a, Result<(), EngineError>> {
        Box::pin(self.flush(FlushScope::Volume { id: volume, slots }))
    }

    fn txn_applied(&self, most: std::time::Duration) -> futures::future::BoxFuture<'_, ()> {
        Box::pin(async move {
            let _ = tokio::time::timeout(most, self.txn_applied.notified()).await;
        })
    }

    fn flush_all(&self) -> futures::future::BoxFuture<'_, Result<(), EngineError>> {
        Box::pin(PoolCore::flush_all(self))
    }
}
