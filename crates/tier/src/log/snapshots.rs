//! Snapshots and clones of a log volume (docs/design/snapshots.md): making and deleting them,
//! rolling back, and what they hold; the map keeps the layers (`crate::map`).

use std::sync::atomic::Ordering::Relaxed;

use stria_dev::{BLOCK_BYTES, BlockDevice};
use stria_engine::VolumeError;

use super::{LogVolume, map_error};
use crate::TierError;
use crate::layers::{LayerKind, LayerRecord};
use crate::map::DeleteStats;
use crate::map::{ENTRIES_PER_PAGE, MapError, Update};

impl<D: BlockDevice> LogVolume<D> {
    /// Makes snapshot `name` of the volume (docs/design/snapshots.md): writes in flight finish
    /// first and new ones wait until it is made; it holds every write acknowledged before it,
    /// none after. Returns it once durable.
    pub async fn create_snapshot(&self, name: &str) -> Result<LayerRecord, TierError> {
        let refuse = |why: String| TierError::Invalid(format!("snapshot {name:?} of {}: {why}", self.name));
        if let Some(why) = crate::layers::name_problem(name) {
            return Err(refuse(why));
        }
        if self.map.snapshots().iter().any(|s| s.name == name) {
            return Err(refuse("a snapshot of that name exists".into()));
        }
        self.check_writable(0, self.size_bytes())?;
        let _one = self.snapshot_ops().await?;
        if self.origin_deleted() {
            return Err(refuse("the volume was deleted (it is kept only for its clones)".into()));
        }
        let _drained = self.gates.writes.write().await;
        let record = self.new_record(name, LayerKind::Snapshot);
        let head = LayerRecord::named(&self.name, LayerKind::Head, self.size_bytes());
        let mut made = self.map.create_snapshot(head.clone(), record.clone()).await;
        if let Err(MapError::PoolFull { needed, .. }) = made
            && self.grow_page_pool(needed).await.is_ok()
        {
            made = self.map.create_snapshot(head, record).await;
        }
        let id = made.map_err(|e| self.layer_op_error(&format!("snapshot {name:?}"), e))?;
        // Writes wait for it: every write after it preserves into it, the newest.
        assert_eq!(
            self.map.newest_snapshot().map(|s| s.id),
            Some(id),
            "volume {}: snapshot {name:?} just made is not the newest",
            self.name
        );
        Ok(self.map.snapshots().into_iter().find(|s| s.id == id).expect("just made"))
    }

    /// The record of a layer `name` to be made now (its id and pages are the map's to choose).
    pub(super) fn new_record(&self, name: &str, kind: LayerKind) -> LayerRecord {
        let mut record = LayerRecord::named(name, kind, self.size_bytes());
        record.created_seq = self.seq.load(Relaxed);
        record.created_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        record
    }

    /// Deletes snapshot `name` (docs/design/snapshots.md, "Snapshot delete"): no data is
    /// copied; its map page copies are handed to the next older snapshot or dropped, and the
    /// places no layer holds any more are freed for GC. It costs a log record per map page the
    /// snapshot owns, written in batches; writes go on between them, each waiting for one batch
    /// at most.
    pub async fn delete_snapshot(&self, name: &str) -> Result<DeleteStats, TierError> {
        let _one = self.snapshot_ops().await?;
        let Some(snap) = self.map.snapshots().into_iter().find(|s| s.name == name) else {
            return Err(TierError::Invalid(format!("{} has no snapshot {name:?}", self.name)));
        };
        self.delete_snapshot_held(&snap).await
    }

    /// Starts deleting snapshot `name` (docs/design/snapshots.md, "Deletes in the
    /// background"): it is marked deleted, durably, before this returns (gone from every
    /// listing; its blocks are never read through it again), and the volume's background
    /// deleter hands its map page copies on, batch by batch, writes going on between batches.
    /// A snapshot, clone, rollback or resize operation started meanwhile finishes it first; a
    /// close stops it between two batches and the next open finishes it. Returns whether the
    /// snapshot has clones: it is then kept, hidden, for them, and nothing is left to do until
    /// its last clone is deleted.
    pub async fn start_snapshot_delete(&self, name: &str) -> Result<bool, TierError> {
        let _one = self.snapshot_ops().await?;
        let Some(snap) = self.map.snapshots().into_iter().find(|s| s.name == name) else {
            return Err(TierError::Invalid(format!("{} has no snapshot {name:?}", self.name)));
        };
        self.check_writable(0, self.size_bytes())?;
        let kept = self
            .map
            .hide_snapshot(snap.id)
            .await
            .map_err(|e| self.layer_op_error(&format!("deleting snapshot {name:?}"), e))?;
        self.gates.deletes_wanted.notify_one();
        tracing::info!(volume = %self.name, snapshot = %name, kept_for_clones = kept, "snapshot marked deleted; its pages are handed on in the background");
        Ok(kept)
    }

    /// [`Self::start_snapshot_delete`] for snapshot `name` of clone `clone`. Returns whether it
    /// is kept, hidden, for the clones made of it.
    pub async fn start_clone_snapshot_delete(&self, clone: &str, name: &str) -> Result<bool, TierError> {
        let _one = self.snapshot_ops().await?;
        let c = self.live_clone_named(clone)?;
        let Some(snap) = self.map.clone_snapshots(c.id).into_iter().find(|s| s.name == name) else {
            return Err(TierError::Invalid(format!("clone {clone} has no snapshot {name:?}")));
        };
        self.check_writable(0, self.size_bytes())?;
        self.map
            .hide_frozen(snap.id)
            .await
            .map_err(|e| self.layer_op_error(&format!("deleting snapshot {name:?} of clone {clone:?}"), e))?;
        let kept = self.map.kept_for_clones(snap.id);
        self.gates.deletes_wanted.notify_one();
        tracing::info!(volume = %self.name, clone, snapshot = name, kept_for_clones = kept, "snapshot of a clone marked deleted; finished in the background");
        Ok(kept)
    }

    /// Starts deleting clone `name` (docs/design/snapshots.md, "Deletes in the background"): it
    /// and its snapshots are marked deleted, durably, before this returns (it takes no more
    /// writes, is gone from every listing and its name may be used again); the volume's
    /// background deleter drops its map pages batch by batch, as [`Self::delete_clone`] does,
    /// writes to the family going on between batches, and then frees what a deleted origin's
    /// head held for it alone. A close stops it between two batches; the next open finishes it.
    pub async fn start_clone_delete(&self, name: &str) -> Result<(), TierError> {
        let _one = self.snapshot_ops().await?;
        let clone = self.live_clone_named(name)?;
        self.check_writable(0, self.size_bytes())?;
        self.map
            .hide_clone(clone.id)
            .await
            .map_err(|e| self.layer_op_error(&format!("deleting clone {name:?}"), e))?;
        self.gates.deletes_wanted.notify_one();
        tracing::info!(volume = %self.name, clone = name, "clone marked deleted; its pages are dropped in the background");
        Ok(())
    }

    /// Layers marked deleted whose delete has not finished (those kept for clones are not
    /// counted): the background deleter's work.
    pub fn deletes_pending(&self) -> usize {
        self.map.deletes_pending() + usize::from(self.gates.free_head.load(Relaxed))
    }

    /// Finishes now the deletes left to the background deleter (waiting for its batch in
    /// progress first), for callers that want the space back before they go on. Returns how
    /// many layers it finished.
    pub async fn finish_deletes(&self) -> Result<usize, TierError> {
        let _one = self.gates.snapshot_ops.lock().await;
        self.finish_deletes_held().await
    }

    /// Takes `snapshot_ops` for a snapshot, clone, rollback or resize operation, first finishing
    /// the deletes left to the background deleter: none of them runs beside a layer marked
    /// deleted whose copies are not handed on yet (only layers kept for clones stay hidden).
    pub(super) async fn snapshot_ops(&self) -> Result<tokio::sync::MutexGuard<'_, ()>, TierError> {
        let one = self.gates.snapshot_ops.lock().await;
        self.finish_deletes_held().await?;
        Ok(one)
    }

    /// Finishes every delete marked but not finished; the caller holds `snapshot_ops`. Returns
    /// how many layers it finished.
    pub(super) async fn finish_deletes_held(&self) -> Result<usize, TierError> {
        if self.deletes_pending() == 0 {
            return Ok(0);
        }
        let _running = self.gates.deleter.lock().await;
        if self.health.closed.load(Relaxed) {
            return Err(VolumeError::Closed(self.name.clone()).into());
        }
        self.check_writable(0, self.size_bytes())?;
        let finished = self
            .map
            .finish_deletes(Some(&self.gates.settle), |freed| self.free_places(freed))
            .await
            .map_err(|e| self.layer_op_error("finishing snapshot deletes", e))?;
        // A clone's delete may have let a snapshot kept for it go: what the deleted origin's
        // head held for that one alone is freed, as `delete_clone` does.
        if finished > 0 || self.gates.free_head.load(Relaxed) {
            self.free_deleted_head().await?;
            self.gates.free_head.store(false, Relaxed);
        }
        // What they freed is GC's to take.
        self.ring.hungry.notify_one();
        Ok(finished)
    }

    /// [`Self::delete_snapshot`] of `snap`, the caller holding `snapshot_ops`.
    async fn delete_snapshot_held(&self, snap: &LayerRecord) -> Result<DeleteStats, TierError> {
        self.check_writable(0, self.size_bytes())?;
        let name = &snap.name;
        // Settle is held shared from each batch's map change to its free (as writers do): a
        // recount or a forgotten overcount between the two would see the places gone and then
        // be lowered again, below what the map holds. Per batch, not for the whole delete: the
        // destager takes it alone, and host writes queue behind a waiting destager.
        let stats = self
            .map
            .delete_snapshot(snap.id, Some(&self.gates.settle), |freed| self.free_places(freed))
            .await
            .map_err(|e| self.layer_op_error(&format!("deleting snapshot {name:?}"), e))?;
        tracing::info!(volume = %self.name, snapshot = %name, ?stats, "snapshot deleted");
        Ok(stats)
    }

    /// Whether the origin was deleted while clones lived ([`Self::delete_origin`]): its head
    /// takes no writes and the family is kept, hidden, until its last clone is deleted.
    pub fn origin_deleted(&self) -> bool {
        self.map.head_deleted()
    }

    /// Deletes the origin of a family whose snapshots have clones (docs/design/snapshots.md,
    /// "Deleting an origin that has clones"): its head is marked deleted, durably, and takes no
    /// more writes (those in flight finish first); then each of its snapshots is deleted, oldest
    /// first: one with clones is kept, hidden, for them, as `snapshot delete` keeps it. The
    /// family (cache, segment space, map) stays for the clones; the caller deletes it with the
    /// last clone. A crash after the mark leaves open to delete the snapshots. Returns the
    /// snapshots deleted and those kept for clones.
    pub async fn delete_origin(&self) -> Result<(Vec<String>, Vec<String>), TierError> {
        self.delete_origin_with(true).await
    }

    /// Starts deleting the origin of a family whose snapshots have clones (docs/design/
    /// snapshots.md, "Deletes in the background"): its head is marked deleted as by
    /// [`Self::delete_origin`], then each of its snapshots is marked deleted, durably, before
    /// this returns; the background deleter hands on those without clones and frees what only
    /// the head held, clone writes going on between its batches. A crash or a close leaves the
    /// rest to the next open. Returns the snapshots deleted and those kept for clones.
    pub async fn start_origin_delete(&self) -> Result<(Vec<String>, Vec<String>), TierError> {
        self.delete_origin_with(false).await
    }

    async fn delete_origin_with(&self, wait: bool) -> Result<(Vec<String>, Vec<String>), TierError> {
        let _one = self.snapshot_ops().await?;
        if self.map.clones().is_empty() {
            return Err(TierError::Invalid(format!(
                "{} has no clones: it is deleted with its parts, not kept",
                self.name
            )));
        }
        self.check_writable(0, self.size_bytes())?;
        {
            let _drained = self.gates.writes.write().await;
            self.map.mark_head_deleted().await.map_err(|e| self.layer_op_error("deleting the origin", e))?;
        }
        if wait {
            tracing::info!(volume = %self.name, "origin deleted; kept, hidden, for its clones");
            return self.delete_origin_snapshots().await;
        }
        let (mut deleted, mut kept) = (Vec::new(), Vec::new());
        for snap in self.map.snapshots() {
            let with_clones = self
                .map
                .hide_snapshot(snap.id)
                .await
                .map_err(|e| self.layer_op_error(&format!("deleting snapshot {:?}", snap.name), e))?;
            if with_clones { &mut kept } else { &mut deleted }.push(snap.name);
        }
        self.gates.free_head.store(true, Relaxed);
        self.gates.deletes_wanted.notify_one();
        tracing::info!(volume = %self.name, ?deleted, ?kept, "origin deleted; kept, hidden, for its clones; its snapshots are finished in the background");
        Ok((deleted, kept))
    }

    /// Deletes every snapshot of a deleted origin, oldest first, then frees the blocks only its
    /// head held (the caller holds `snapshot_ops`, or the volume is being opened).
    pub(super) async fn delete_origin_snapshots(&self) -> Result<(Vec<String>, Vec<String>), TierError> {
        let (mut deleted, mut kept) = (Vec::new(), Vec::new());
        for snap in self.map.snapshots() {
            let stats = self.delete_snapshot_held(&snap).await?;
            if stats.kept_for_clones { &mut kept } else { &mut deleted }.push(snap.name);
        }
        self.free_deleted_head().await?;
        Ok((deleted, kept))
    }

    /// Frees what only a deleted origin's head holds (docs/design/snapshots.md, "Deleting an
    /// origin that has clones"): no one reads the head any more, only the snapshots kept for
    /// the clones read through it, so it is rolled back to the newest of them (whose view it
    /// then is, page for page: the older ones read through that one or through pages the head
    /// never changed since). The rollback's own argument holds: every place the head shares
    /// with another layer the newest snapshot holds too, so only the head's own are freed.
    /// Durable as a rollback is (a mark, finished at open). Clone writes wait while it runs.
    /// Returns the blocks changed. The caller holds `snapshot_ops` (or the volume is opening).
    pub(super) async fn free_deleted_head(&self) -> Result<u64, TierError> {
        let Some(newest) = self.map.newest_snapshot().filter(|_| self.origin_deleted()) else { return Ok(0) };
        let _drained = self.gates.writes.write().await;
        let _moves = self.gates.moving.lock().await;
        let failed = |e: MapError| -> TierError {
            self.map_failed(&e);
            map_error(&self.name, e).into()
        };
        // Nothing to free (done before, at an open or an earlier delete): no marks written.
        if self.restore_or_look(newest.id, true).await? == 0 {
            return Ok(0);
        }
        // The pages changed since the newest are its own already: restoring them copies none.
        self.map.mark_rollback(newest.id).await.map_err(failed)?;
        let restored = self.restore(newest.id).await?;
        self.map.mark_rollback(0).await.map_err(failed)?;
        if restored > 0 {
            tracing::info!(volume = %self.name, restored, "freed the blocks only the deleted origin held");
        }
        Ok(restored)
    }

    /// The error of a snapshot or clone operation `what`: a refusal (nothing changed) for what
    /// the layers or a full page pool refuse; anything else stops writes (see
    /// [`Self::map_failed`]).
    pub(super) fn layer_op_error(&self, what: &str, e: MapError) -> TierError {
        match e {
            MapError::Layers(why) => TierError::Invalid(format!("{what} of {}: {why}", self.name)),
            MapError::PoolFull { .. } => TierError::Invalid(format!("{what} of {}: {e}", self.name)),
            MapError::Stopped => VolumeError::Closed(self.name.clone()).into(),
            e => {
                self.map_failed(&e);
                map_error(&self.name, e).into()
            }
        }
    }

    /// Refuses a rollback to snapshot `name` made when the volume had another size (it grew
    /// since): a rollback does not change a volume's size.
    pub fn check_rollback_size(&self, name: &str) -> Result<(), TierError> {
        match self.map.snapshots().into_iter().find(|s| s.name == name) {
            Some(snap) if snap.logical_bytes != self.size_bytes() => Err(TierError::Invalid(format!(
                "{name:?} was made when {} held {} bytes; it holds {} now, and a rollback does not change a volume's size \
                 (clone the snapshot instead: `stria volume clone {}@{name} NEW`)",
                self.name,
                snap.logical_bytes,
                self.size_bytes(),
                self.name
            ))),
            _ => Ok(()),
        }
    }

    /// Rolls the volume back to snapshot `name`, its newest: afterwards it reads as the
    /// snapshot does, and the snapshots stay as they were. No data is
    /// copied: the map entries of the pages changed since the snapshot are set to its entries.
    /// Host writes wait, and destage and GC pause, while it runs; clients should not have a
    /// file system mounted from the volume. A crash before it returns leaves it to open to
    /// finish. Returns how many blocks changed.
    pub async fn rollback(&self, name: &str) -> Result<u64, TierError> {
        let _one = self.snapshot_ops().await?;
        let snaps = self.map.snapshots();
        let Some(snap) = snaps.iter().find(|s| s.name == name).cloned() else {
            return Err(TierError::Invalid(format!("{} has no snapshot {name:?}", self.name)));
        };
        // Only to the newest: the head then holds what the newest holds, so every version of a
        // block is still held by a run of neighbouring layers, which frees rely on (an
        // overwrite asks only the newest snapshot, a delete only the neighbours). Rolled back
        // to an older one, the head would share blocks with it past the newer ones, and those
        // checks would free blocks it still holds (the log simulation found exactly that).
        if let Some(newer) = snaps.iter().rev().take_while(|s| s.id != snap.id).map(|s| &s.name).next() {
            return Err(TierError::Invalid(format!(
                "{} can be rolled back only to its newest snapshot ({newer:?}); delete the newer snapshots first",
                self.name
            )));
        }
        if let Some(kept) = self.map.newest_snapshot().filter(|s| s.id != snap.id) {
            return Err(TierError::Invalid(format!(
                "{} can be rolled back only to its newest snapshot, and {:?}, deleted but kept for its clones, is newer than {name:?}; delete those clones first",
                self.name, kept.name
            )));
        }
        self.check_rollback_size(name)?;
        self.check_writable(0, self.size_bytes())?;
        let _drained = self.gates.writes.write().await;
        let _moves = self.gates.moving.lock().await;
        let failed = |e: MapError| -> TierError {
            self.map_failed(&e);
            map_error(&self.name, e).into()
        };
        // Room first: each changed page may need a copy in the newest snapshot (and a table
        // page per 1,016), and a rollback that began must be able to finish at open.
        let pages = self.map.changed_since(snap.id).await.map_err(failed)?.len() as u64;
        let needed = pages + pages.div_ceil(crate::layers::INDEX_ENTRIES as u64);
        let (used, total) = self.map.pool_pages();
        if needed > u64::from(total - used) {
            let _ = self.grow_page_pool(needed - u64::from(total - used)).await;
        }
        let (used, total) = self.map.pool_pages();
        if needed > u64::from(total - used) {
            return Err(TierError::Invalid(format!(
                "rolling {} back to {name:?} may need {needed} snapshot map pages and {} are free (the pool could not grow): delete snapshots first",
                self.name,
                total - used
            )));
        }
        self.map.mark_rollback(snap.id).await.map_err(failed)?;
        let restored = self.restore(snap.id).await?;
        self.map.mark_rollback(0).await.map_err(failed)?;
        tracing::info!(volume = %self.name, snapshot = name, restored, "rolled back");
        Ok(restored)
    }

    /// Sets the head's entries of every page changed since snapshot `layer` to the snapshot's
    /// (as host writes would, so the newest snapshot keeps what they replace, and what none
    /// holds is freed). The caller keeps host writes, destage and GC out.
    pub(super) async fn restore(&self, layer: u16) -> Result<u64, VolumeError> {
        self.restore_or_look(layer, false).await
    }

    /// [`Self::restore`], or (`look`) only whether it would change a block: the number of
    /// blocks of the first pages found changed, 0 if none is.
    async fn restore_or_look(&self, layer: u16, look: bool) -> Result<u64, VolumeError> {
        let pages = self.map.changed_since(layer).await.map_err(|e| map_error(&self.name, e))?;
        let mut restored = 0;
        for chunk in pages.chunks(16) {
            let blocks: Vec<u64> = chunk
                .iter()
                .flat_map(|&p| p * ENTRIES_PER_PAGE..((p + 1) * ENTRIES_PER_PAGE).min(self.blocks()))
                .collect();
            let want = self.map.get_in_kept(layer, &blocks).await.map_err(|e| map_error(&self.name, e))?;
            let now = self.map.get_many(&blocks).await.map_err(|e| map_error(&self.name, e))?;
            let updates: Vec<Update> = blocks
                .iter()
                .zip(want.iter().zip(&now))
                .filter(|(_, (w, n))| w != n)
                .map(|(&block, (&entry, _))| Update { block, entry, expect: None })
                .collect();
            if updates.is_empty() {
                continue;
            }
            if look {
                return Ok(updates.len() as u64);
            }
            let olds = self.update_map(&updates).await?;
            self.free_places(updates.iter().zip(olds).filter_map(|(u, o)| o.map(|o| (u.block, o))));
            restored += updates.len() as u64;
        }
        Ok(restored)
    }

    /// Bytes only snapshot `layer` holds: what deleting it would free.
    pub async fn exclusive_bytes(&self, layer: u16) -> Result<u64, TierError> {
        let blocks = self.map.exclusive_blocks(layer).await.map_err(|e| match e {
            MapError::Layers(why) => TierError::Invalid(format!("{}: {why}", self.name)),
            e => map_error(&self.name, e).into(),
        })?;
        Ok(blocks * BLOCK_BYTES)
    }

    /// Bytes each snapshot's view maps to data, by layer id (one pass over the map: see
    /// [`MapStore::referenced_blocks`](crate::map::MapStore::referenced_blocks)); a snapshot
    /// shares with other layers what it references and does not hold alone.
    pub async fn referenced_bytes(&self) -> Result<Vec<(u16, u64)>, TierError> {
        let blocks = self.map.referenced_blocks().await.map_err(|e| match e {
            MapError::Layers(why) => TierError::Invalid(format!("{}: {why}", self.name)),
            e => map_error(&self.name, e).into(),
        })?;
        Ok(blocks.into_iter().map(|(id, b)| (id, b * BLOCK_BYTES)).collect())
    }

    /// The volume's snapshots, oldest first.
    pub fn snapshots(&self) -> Vec<LayerRecord> {
        self.map.snapshots()
    }

    /// The name of snapshot `id`, with a note if it was deleted and is kept for clones.
    pub fn parent_name(&self, id: u16) -> String {
        match self.map.layer_record(id) {
            Some(r) if r.hidden => format!("{} (deleted, kept for its clones)", r.name),
            Some(r) => r.name,
            None => format!("(layer {id}, gone)"),
        }
    }

    /// The clones of the volume's snapshots.
    pub fn clones(&self) -> Vec<LayerRecord> {
        self.map.clones()
    }

    /// Makes clone `name` of snapshot `snap` (docs/design/snapshots.md, "Clone"): a writable
    /// layer that reads as the snapshot until written, sharing its data and this volume's
    /// cache, segment space and GC. Nothing is copied; it is durable when this returns.
    pub async fn create_clone(&self, snap: &str, name: &str) -> Result<LayerRecord, TierError> {
        let refuse =
            |why: String| TierError::Invalid(format!("clone {name:?} of {}@{snap}: {why}", self.name));
        if let Some(why) = crate::layers::name_problem(name) {
            return Err(refuse(why));
        }
        let _one = self.snapshot_ops().await?;
        let Some(parent) = self.map.snapshots().into_iter().find(|s| s.name == snap) else {
            return Err(TierError::Invalid(format!("{} has no snapshot {snap:?}", self.name)));
        };
        self.make_clone(parent, name).await
    }

    /// Makes clone `name` of snapshot `snap` of clone `clone` (`CLONE@SNAP`; a frozen layer):
    /// as [`Self::create_clone`] of a snapshot of the volume.
    pub async fn create_clone_of_clone(
        &self,
        clone: &str,
        snap: &str,
        name: &str,
    ) -> Result<LayerRecord, TierError> {
        if let Some(why) = crate::layers::name_problem(name) {
            return Err(TierError::Invalid(format!("clone {name:?} of {clone}@{snap}: {why}")));
        }
        let _one = self.snapshot_ops().await?;
        let c = self.live_clone_named(clone)?;
        let Some(parent) = self.map.clone_snapshots(c.id).into_iter().find(|s| s.name == snap) else {
            return Err(TierError::Invalid(format!("clone {clone} has no snapshot {snap:?}")));
        };
        self.make_clone(parent, name).await
    }

    /// Makes clone `name` of snapshot or frozen layer `parent` (the caller holds `snapshot_ops`).
    async fn make_clone(&self, parent: LayerRecord, name: &str) -> Result<LayerRecord, TierError> {
        self.check_writable(0, self.size_bytes())?;
        // The clone has its snapshot's size (the volume may have grown since).
        let record =
            LayerRecord { logical_bytes: parent.logical_bytes, ..self.new_record(name, LayerKind::Clone) };
        let mut made = self.map.create_clone(parent.id, record.clone()).await;
        if let Err(MapError::PoolFull { needed, .. }) = made
            && self.grow_page_pool(needed).await.is_ok()
        {
            made = self.map.create_clone(parent.id, record).await;
        }
        let id = made.map_err(|e| self.layer_op_error(&format!("clone {name:?}"), e))?;
        Ok(self.map.clones().into_iter().find(|c| c.id == id).expect("just made"))
    }

    /// Deletes clone `name`: its own map pages are dropped (no data copied) and the places only
    /// it held are freed for GC; a deleted snapshot kept only for it goes too. Writes to the
    /// family wait while it runs.
    pub async fn delete_clone(&self, name: &str) -> Result<DeleteStats, TierError> {
        let _one = self.snapshot_ops().await?;
        let Some(clone) = self.map.clones().into_iter().find(|c| c.name == name) else {
            return Err(TierError::Invalid(format!("{} has no clone {name:?}", self.name)));
        };
        self.check_writable(0, self.size_bytes())?;
        // As a snapshot's delete (see there): no recount between a batch's map change and its
        // free.
        let stats = self
            .map
            .delete_clone(clone.id, Some(&self.gates.settle), |freed| self.free_places(freed))
            .await
            .map_err(|e| self.layer_op_error(&format!("deleting clone {name:?}"), e))?;
        // The snapshot kept for it may have gone with it: what the deleted origin's head holds
        // for that one alone is freed.
        self.free_deleted_head().await?;
        self.ring.hungry.notify_one();
        tracing::info!(volume = %self.name, clone = name, ?stats, "clone deleted");
        Ok(stats)
    }

    /// Clone `name`, unless it is unknown or being deleted.
    fn live_clone_named(&self, name: &str) -> Result<LayerRecord, TierError> {
        self.map
            .clones()
            .into_iter()
            .find(|c| c.name == name)
            .ok_or_else(|| TierError::Invalid(format!("{} has no clone {name:?}", self.name)))
    }

    /// The snapshots of clone `clone`, oldest first (none if it is not a clone of this volume).
    pub fn clone_snapshots(&self, clone: &str) -> Vec<LayerRecord> {
        self.map
            .clones()
            .into_iter()
            .find(|c| c.name == clone)
            .map_or_else(Vec::new, |c| self.map.clone_snapshots(c.id))
    }

    /// What clone `rec` was made of, past its own snapshots: `(None, snapshot)` for a snapshot
    /// of the volume, `(Some(clone), snapshot)` for a snapshot of another clone (a deleted one
    /// kept for this clone says so).
    pub fn clone_source(&self, rec: &LayerRecord) -> (Option<String>, String) {
        let mut id = rec.parent;
        loop {
            let Some(r) = self.map.layer_record(id) else { return (None, self.parent_name(id)) };
            match r.kind {
                LayerKind::Frozen if r.of_clone == rec.id => id = r.parent,
                LayerKind::Frozen => {
                    let clone = self
                        .map
                        .layer_record(r.of_clone)
                        .filter(|c| !c.hidden)
                        .map_or_else(|| format!("(deleted clone, layer {})", r.of_clone), |c| c.name);
                    let name =
                        if r.hidden { format!("{} (deleted, kept for its clones)", r.name) } else { r.name };
                    return (Some(clone), name);
                }
                _ => return (None, self.parent_name(id)),
            }
        }
    }

    /// Whether layer `id` is a snapshot (of the volume or of a clone) that has not been deleted.
    pub fn snapshot_shown(&self, id: u16) -> bool {
        self.map
            .layer_record(id)
            .is_some_and(|r| !r.hidden && matches!(r.kind, LayerKind::Snapshot | LayerKind::Frozen))
    }

    /// Makes snapshot `name` of clone `clone` (docs/design/snapshots.md, "Snapshots, rollback
    /// and clones of a clone"): writes to the family in flight finish first and new ones wait
    /// until it is made; it holds every write to the clone acknowledged before it, none after.
    /// The clone is frozen into it (its table pages copied, one per 1,016 map pages it changed;
    /// no map page, no data) and goes on over it. Returns it once durable.
    pub async fn create_clone_snapshot(&self, clone: &str, name: &str) -> Result<LayerRecord, TierError> {
        let refuse = |why: String| TierError::Invalid(format!("snapshot {name:?} of clone {clone}: {why}"));
        if let Some(why) = crate::layers::name_problem(name) {
            return Err(refuse(why));
        }
        let _one = self.snapshot_ops().await?;
        let c = self.live_clone_named(clone)?;
        if self.map.clone_snapshots(c.id).iter().any(|s| s.name == name) {
            return Err(refuse("a snapshot of that name exists".into()));
        }
        self.check_writable(0, self.size_bytes())?;
        let _drained = self.gates.writes.write().await;
        let record =
            LayerRecord { logical_bytes: c.logical_bytes, ..self.new_record(name, LayerKind::Frozen) };
        let mut made = self.map.freeze_clone(c.id, record.clone()).await;
        if let Err(MapError::PoolFull { needed, .. }) = made
            && self.grow_page_pool(needed).await.is_ok()
        {
            made = self.map.freeze_clone(c.id, record).await;
        }
        let id =
            made.map_err(|e| self.layer_op_error(&format!("snapshot {name:?} of clone {clone:?}"), e))?;
        tracing::info!(volume = %self.name, clone, snapshot = name, "snapshot of a clone made");
        Ok(self.map.layer_record(id).expect("just made"))
    }

    /// Deletes snapshot `name` of clone `clone`: its map page copies are handed up to the next
    /// newer snapshot of the clone (or the clone) or dropped, and what no layer holds any more
    /// is freed; one that clones were made of is kept, hidden, until they are deleted. No data
    /// is copied; writes wait for one batch of 128 pages at a time.
    pub async fn delete_clone_snapshot(&self, clone: &str, name: &str) -> Result<DeleteStats, TierError> {
        let _one = self.snapshot_ops().await?;
        let c = self.live_clone_named(clone)?;
        let Some(snap) = self.map.clone_snapshots(c.id).into_iter().find(|s| s.name == name) else {
            return Err(TierError::Invalid(format!("clone {clone} has no snapshot {name:?}")));
        };
        self.check_writable(0, self.size_bytes())?;
        let stats = self
            .map
            .delete_frozen(snap.id, Some(&self.gates.settle), |freed| self.free_places(freed))
            .await
            .map_err(|e| self.layer_op_error(&format!("deleting snapshot {name:?} of clone {clone:?}"), e))?;
        self.ring.hungry.notify_one();
        tracing::info!(volume = %self.name, clone, snapshot = name, ?stats, "snapshot of a clone deleted");
        Ok(stats)
    }

    /// Rolls clone `clone` back to its newest snapshot `name`: its own map pages are dropped
    /// (no data copied; what the snapshot does not hold is freed), so it reads as the snapshot
    /// again. Writes to the family wait while it runs. A crash before it returns leaves open
    /// to finish it. Returns how many map pages the clone let go of.
    pub async fn rollback_clone(&self, clone: &str, name: &str) -> Result<u64, TierError> {
        let _one = self.snapshot_ops().await?;
        let c = self.live_clone_named(clone)?;
        let snaps = self.map.clone_snapshots(c.id);
        let Some(snap) = snaps.iter().find(|s| s.name == name) else {
            return Err(TierError::Invalid(format!("clone {clone} has no snapshot {name:?}")));
        };
        if snap.id != c.parent {
            let newest = snaps.last().map_or_else(String::new, |s| s.name.clone());
            return Err(TierError::Invalid(format!(
                "{clone} can be rolled back only to its newest snapshot ({newest:?}); delete the newer snapshots first"
            )));
        }
        if snap.logical_bytes != c.logical_bytes {
            return Err(TierError::Invalid(format!(
                "{name:?} was made when {clone} held {} bytes; it holds {} now, and a rollback does not change a volume's size",
                snap.logical_bytes, c.logical_bytes
            )));
        }
        self.check_writable(0, self.size_bytes())?;
        let _drained = self.gates.writes.write().await;
        let _moves = self.gates.moving.lock().await;
        let stats = self
            .map
            .rollback_clone(c.id, Some(&self.gates.settle), |freed| self.free_places(freed))
            .await
            .map_err(|e| self.layer_op_error(&format!("rolling clone {clone:?} back"), e))?;
        self.ring.hungry.notify_one();
        tracing::info!(volume = %self.name, clone, snapshot = name, ?stats, "clone rolled back");
        Ok(stats.pages_dropped)
    }
}
