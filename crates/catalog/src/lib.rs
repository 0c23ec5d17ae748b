//! The catalog of a pool's client-visible volumes: the one place that knows there are two kinds
//! (plain engine volumes and log-structured volumes, `tiered:` or `log:`) and hands each out as an
//! `Arc<dyn BlockVolume>`.
//!
//! Everything above it (the CLI, the daemon, the NBD export) goes arguments -> typed request ->
//! catalog -> typed view -> rendering, and never asks "plain or log?" itself. Another kind of
//! volume is one more [`Entry`] variant and one more arm in each operation below.
#![forbid(unsafe_code)]

mod convert;
mod layout;
mod view;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use parking_lot::RwLock;
use stria_dev::BlockDevice;
use stria_engine::qos::{CostProfile, QosVolume, admit_reservation};
use stria_engine::{
    BlockVolume, DEFAULT_CHUNK_BYTES, DriveClass, DriveState, EngineError, Layout, Pool, QosSpec,
    ScrubReport, Volume, VolumeRole, VolumeSpec,
};
use stria_tier::TierError;
use stria_tier::layers::LayerRecord;
use stria_tier::log::{self, CacheMode, GcPolicy, LogSpec, LogVolume};

pub use convert::{ConvertView, ConvertVolume};
pub use layout::{LayoutSpec, PlainLayout, is_log_layout, parse_plain_layout};
pub use view::{
    CloneTag, CloneView, LogTag, LogView, MAX_WEIGHT, MemberView, PlainView, QosUpdate, QosView,
    RollbackView, SegmentView, Setting, SnapshotDeletedView, SnapshotView, StatusView, ThinView,
    UnavailableView, VolumeListEntry, VolumeView,
};

/// Why a catalog operation failed. Engine and tier errors keep their own messages and sources.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Tier(#[from] TierError),
    /// No client-visible volume (nor part, where parts count) of that name.
    #[error("no volume named `{0}`")]
    NotFound(String),
    /// A request the catalog refuses as it stands (bad layout, an option that does not apply, an
    /// operation this kind of volume does not support).
    #[error("{0}")]
    Invalid(String),
}

/// What to create (the CLI's `volume create`; also the control socket's request).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct CreateVolume {
    pub name: String,
    pub size_bytes: u64,
    /// `raid0[:W]`, `raid1[:N]`, `raid10[:WxN]`, `ec:K+M`, `tiered:ec:K+M` or `log:ec:K+M`.
    pub layout: String,
    pub chunk_bytes: Option<u64>,
    /// Plain volumes: the drive class (default: capacity drives if the pool has any).
    pub class: Option<DriveClass>,
    /// Tiered and log volumes: write cache size (default: an eighth of the volume).
    #[serde(default)]
    pub cache_bytes: Option<u64>,
    /// Tiered and log volumes: copies of cache and map (default 2).
    #[serde(default)]
    pub cache_copies: Option<u32>,
    /// Tiered and log volumes: data bytes of the segment space (default 1.5 x the size; less
    /// than the size over-commits the volume).
    #[serde(default)]
    pub space_bytes: Option<u64>,
    /// Tiered and log volumes: how GC picks victims (default `temperature`).
    #[serde(default)]
    pub gc: Option<GcPolicy>,
    /// Tiered and log volumes: when writes without FUA are acknowledged (default
    /// `write-through`).
    #[serde(default)]
    pub cache_mode: Option<CacheMode>,
    /// QoS settings (none by default).
    #[serde(default)]
    pub qos: QosSpec,
}

/// A client-visible volume of one kind.
enum Entry<D: BlockDevice> {
    Plain(Arc<Volume<D>>),
    Log(Arc<LogVolume<D>>),
    /// A clone (its record) in the family of a log-structured volume.
    Clone(Arc<LogVolume<D>>, LayerRecord),
}

/// What `volume show` says of clone `rec` of `lv`.
fn clone_view<D: BlockDevice>(lv: &LogVolume<D>, rec: &LayerRecord) -> CloneView {
    let (of_clone, snapshot) = lv.clone_source(rec);
    CloneView {
        name: rec.name.clone(),
        origin: lv.name().to_string(),
        of_clone,
        snapshots: lv.clone_snapshots(&rec.name).into_iter().map(|s| s.name).collect(),
        snapshot,
        // Its own size (its snapshot's, or what a resize made it), not its origin's.
        size_bytes: lv.layer_bytes(rec.id),
        id: rec.id,
        created_ms: rec.created_ms,
        kind: CloneTag,
        qos: None,
    }
}

/// What requests to log-structured volume `lv` (its snapshots and clones too) cost the drives.
fn log_profile<D: BlockDevice>(lv: &LogVolume<D>) -> CostProfile {
    let [_, cache, seg] = lv.parts();
    let copies = match cache.layout() {
        Layout::Raid1 { copies } | Layout::Raid10 { copies, .. } => copies,
        _ => 1,
    };
    let (data, parity) = match seg.layout() {
        Layout::Ec { data_shards, parity_shards } => (data_shards, parity_shards),
        other => (other.data_columns(), 0),
    };
    CostProfile::Log {
        copies,
        cache_class: cache.class(),
        data,
        parity,
        chunk_bytes: seg.chunk_bytes(),
        seg_class: seg.class(),
    }
}

/// The options `volume create` and `volume convert` take for log layouts (absent: defaults).
pub(crate) struct LogOptions {
    pub(crate) chunk_bytes: Option<u64>,
    pub(crate) cache_bytes: Option<u64>,
    pub(crate) cache_copies: Option<u32>,
    pub(crate) space_bytes: Option<u64>,
    pub(crate) gc: Option<GcPolicy>,
    pub(crate) cache_mode: Option<CacheMode>,
}

/// The spec of log volume `name` of `size_bytes` in `layout` (a parsed `tiered:` or `log:`
/// layout) with `options` and their defaults.
pub(crate) fn log_spec(name: &str, size_bytes: u64, layout: LayoutSpec, options: LogOptions) -> LogSpec {
    let LayoutSpec::Log { data_shards, parity_shards, fast_tier } = layout else {
        unreachable!("a tiered: or log: layout text parses as a log layout or not at all")
    };
    LogSpec {
        chunk_bytes: options.chunk_bytes.unwrap_or(stria_tier::DEFAULT_TIER_CHUNK_BYTES),
        cache_bytes: options.cache_bytes,
        fast_tier,
        copies: options.cache_copies.unwrap_or(2),
        space_bytes: options.space_bytes,
        gc: options.gc.unwrap_or_default(),
        cache_mode: options.cache_mode.unwrap_or_default(),
        ..LogSpec::new(name, size_bytes, data_shards, parity_shards)
    }
}

/// The refusal of an operation on a log-structured volume that could not be opened.
fn unavailable(name: &str, why: &str) -> CatalogError {
    CatalogError::Invalid(format!(
        "volume `{name}` is unavailable ({why}); its parts can be inspected with \
         `stria volume show {name}.meta` (and .cache and .seg), and it can be deleted"
    ))
}

/// An open pool and its client-visible volumes.
pub struct Catalog<D: BlockDevice> {
    pool: Arc<Pool<D>>,
    /// Log-structured volumes are objects of their own (a mover each); plain ones live in the
    /// pool.
    logs: RwLock<BTreeMap<String, Arc<LogVolume<D>>>>,
    /// Log-structured volumes that could not be opened, with why: the rest of the pool still opens and
    /// serves; these are listed, not exported, and can be inspected (their parts) and deleted.
    unavailable: RwLock<BTreeMap<String, String>>,
    /// Serialises QoS changes: a reservation is checked against the others and stored under it,
    /// so two racing reservations cannot both take the same free share.
    qos_changes: tokio::sync::Mutex<()>,
}

impl<D: BlockDevice> std::fmt::Debug for Catalog<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Catalog").field("volumes", &self.names()).finish()
    }
}

impl<D: BlockDevice> Catalog<D> {
    /// Opens every log-structured volume of `pool` (their movers start on the current runtime).
    /// One that cannot be opened (its map or cache lost beyond repair) is set aside as
    /// unavailable, with the reason, instead of failing the whole pool.
    pub async fn open(pool: Arc<Pool<D>>) -> Result<Catalog<D>, CatalogError> {
        let mut logs = BTreeMap::new();
        let mut unavailable = BTreeMap::new();
        for rec in pool.meta().tiered.clone() {
            // The copy of a conversion a crash cut short: the plain volume it was to replace is
            // still the volume (docs/design/convert.md).
            if let Some(plain) = &rec.replaces
                && pool.meta().volume(plain).is_some_and(|v| v.role == VolumeRole::Plain)
            {
                match stria_tier::delete(&pool, &rec.name).await {
                    Ok(()) => {
                        tracing::info!(volume = %plain, copy = %rec.name, "deleted the copy of a conversion a crash cut short; the volume is as it was")
                    }
                    Err(e) => {
                        tracing::warn!(volume = %plain, copy = %rec.name, error = %e, "could not delete the copy of a conversion a crash cut short")
                    }
                }
                continue;
            }
            match log::open(&pool, &rec).await {
                // An origin deleted for its clones whose last clone's delete a crash cut short.
                Ok(v) if v.origin_deleted() && v.clones().is_empty() => {
                    v.close().await;
                    match stria_tier::delete(&pool, &rec.name).await {
                        Ok(()) => {
                            tracing::info!(volume = %rec.name, "finished deleting an origin whose last clone was deleted")
                        }
                        // The rest of the pool still opens; the next open tries again.
                        Err(e) => {
                            tracing::warn!(volume = %rec.name, error = %e, "could not finish deleting an origin whose last clone was deleted")
                        }
                    }
                }
                Ok(v) => drop(logs.insert(rec.name.clone(), v)),
                Err(e) => {
                    tracing::error!(volume = %rec.name, error = %e, "volume unavailable; the rest of the pool is served");
                    unavailable.insert(rec.name.clone(), e.to_string());
                }
            }
        }
        // Parts of a log-structured volume whose delete a crash cut short (the pool record went
        // first, then the parts one by one).
        let orphans: Vec<String> = {
            let meta = pool.meta();
            meta.volumes
                .iter()
                .filter(|v| {
                    matches!(&v.role, VolumeRole::TierPart { tiered, .. } if !meta.tiered.iter().any(|t| &t.name == tiered))
                })
                .map(|v| v.name.clone())
                .collect()
        };
        for part in orphans {
            match pool.delete_volume(&part).await {
                Ok(()) => {
                    tracing::info!(part = %part, "finished deleting a part of a deleted log-structured volume")
                }
                // The rest of the pool still opens; the next open tries again.
                Err(e) => {
                    tracing::warn!(part = %part, error = %e, "could not finish deleting a part of a deleted log-structured volume")
                }
            }
        }
        let catalog = Catalog {
            pool,
            logs: RwLock::new(logs),
            unavailable: RwLock::new(unavailable),
            qos_changes: tokio::sync::Mutex::new(()),
        };
        // Settings of a volume deleted just before a crash (the delete removes them after).
        let names = catalog.names();
        for name in catalog.pool.meta().qos.keys() {
            if !names.contains(name) {
                catalog.pool.set_qos(name, QosSpec::default()).await?;
            }
        }
        Ok(catalog)
    }

    /// The pool (drive operations, rebuild, counters).
    pub fn pool(&self) -> &Arc<Pool<D>> {
        &self.pool
    }

    /// The client-visible volume `name`, if there is one (parts are not).
    fn entry(&self, name: &str) -> Option<Entry<D>> {
        if let Some(l) = self.live_log(name) {
            return Some(Entry::Log(l));
        }
        if let Some((lv, rec)) = self.clone_named(name) {
            return Some(Entry::Clone(lv, rec));
        }
        if self.pool.meta().volume(name)?.role != VolumeRole::Plain {
            return None;
        }
        self.pool.volume(name).map(Entry::Plain)
    }

    /// Log-structured volume `name`, unless it was deleted and is kept for its clones.
    fn live_log(&self, name: &str) -> Option<Arc<LogVolume<D>>> {
        self.logs.read().get(name).filter(|l| !l.origin_deleted()).cloned()
    }

    /// The clone named `name` and the log-structured volume whose family it lives in.
    fn clone_named(&self, name: &str) -> Option<(Arc<LogVolume<D>>, LayerRecord)> {
        self.logs
            .read()
            .values()
            .find_map(|lv| lv.clones().into_iter().find(|c| c.name == name).map(|c| (Arc::clone(lv), c)))
    }

    /// Like [`Catalog::entry`], with the error an operator sees for a missing volume or a part.
    fn entry_or_err(&self, name: &str) -> Result<Entry<D>, CatalogError> {
        match self.entry(name) {
            Some(e) => Ok(e),
            None if self.pool.volume(name).is_some() => Err(CatalogError::Invalid(format!(
                "`{name}` is a part of a log-structured volume; operate on that volume instead"
            ))),
            None if let Some(why) = self.unavailable.read().get(name) => Err(unavailable(name, why)),
            None => Err(CatalogError::NotFound(name.to_string())),
        }
    }

    /// The plain volume `name`, or why an operation meant for plain volumes cannot take it.
    fn plain(&self, name: &str) -> Result<Arc<Volume<D>>, CatalogError> {
        match self.entry_or_err(name)? {
            Entry::Plain(v) => Ok(v),
            Entry::Log(_) => Err(CatalogError::Invalid(format!("`{name}` is a log-structured volume"))),
            Entry::Clone(..) => Err(CatalogError::Invalid(format!("`{name}` is a clone of a snapshot"))),
        }
    }

    /// Names of every client-visible volume, sorted.
    pub fn names(&self) -> Vec<String> {
        let meta = self.pool.meta();
        let mut names: Vec<String> =
            meta.volumes.iter().filter(|v| v.role == VolumeRole::Plain).map(|v| v.name.clone()).collect();
        for lv in self.logs.read().values() {
            if !lv.origin_deleted() {
                names.push(lv.name().to_string());
            }
            names.extend(lv.clones().into_iter().map(|c| c.name));
        }
        names.extend(self.unavailable.read().keys().cloned());
        names.sort();
        names
    }

    /// A client-visible volume by name, behind the volume contract and the pool's QoS
    /// dispatcher; `VOL@SNAP` is snapshot SNAP of log-structured volume VOL (read-only).
    pub fn lookup(&self, name: &str) -> Option<Arc<dyn BlockVolume>> {
        let (volume, profile): (Arc<dyn BlockVolume>, CostProfile) =
            if let Some((vol, snap)) = name.split_once('@') {
                if let Some(lv) = self.live_log(vol) {
                    let id = lv.snapshots().into_iter().find(|s| s.name == snap)?.id;
                    let profile = log_profile(&lv);
                    (Arc::new(stria_tier::SnapshotVolume::new(lv, id, snap)), profile)
                } else {
                    let (lv, _) = self.clone_named(vol)?;
                    let id = lv.clone_snapshots(vol).into_iter().find(|s| s.name == snap)?.id;
                    let profile = log_profile(&lv);
                    (Arc::new(stria_tier::SnapshotVolume::of_clone(lv, id, vol, snap)), profile)
                }
            } else {
                let entry = self.entry(name)?;
                let profile = Self::profile(&entry);
                let volume: Arc<dyn BlockVolume> = match entry {
                    Entry::Plain(v) => v,
                    Entry::Log(v) => v,
                    Entry::Clone(lv, rec) => Arc::new(stria_tier::CloneVolume::new(lv, &rec)),
                };
                (volume, profile)
            };
        Some(Arc::new(QosVolume::new(volume, Arc::clone(self.pool.qos()), name, profile)))
    }

    /// What requests to `entry` cost the drives.
    fn profile(entry: &Entry<D>) -> CostProfile {
        match entry {
            Entry::Plain(v) => {
                CostProfile::Plain { layout: v.layout(), chunk_bytes: v.chunk_bytes(), class: v.class() }
            }
            Entry::Log(lv) | Entry::Clone(lv, _) => log_profile(lv),
        }
    }

    /// Changes the QoS settings of volume `name` (durably; live for its NBD clients). A
    /// reservation is admitted only if, with the others, it leaves each drive class at most
    /// [`stria_engine::qos::RESERVABLE`] of its calibrated time; the pool is calibrated first
    /// if it never was (a few seconds).
    pub async fn set_qos(&self, name: &str, update: &QosUpdate) -> Result<VolumeView, CatalogError> {
        let entry = self.entry_or_err(name)?;
        let _one_at_a_time = self.qos_changes.lock().await;
        let spec = update.apply(self.pool.qos().spec(name)).map_err(CatalogError::Invalid)?;
        self.admit(name, &entry, &spec).await?;
        self.pool.set_qos(name, spec).await?;
        self.show(name)
    }

    /// Sets when log-structured volume `name` acknowledges writes without FUA (durably; at
    /// once for its clients).
    pub async fn set_cache_mode(&self, name: &str, mode: CacheMode) -> Result<VolumeView, CatalogError> {
        match self.entry_or_err(name)? {
            Entry::Log(lv) => lv.set_cache_mode(mode).await?,
            Entry::Clone(lv, _) => {
                return Err(CatalogError::Invalid(format!(
                    "`{name}` is a clone: it shares the write cache of `{}`; set the cache mode there",
                    lv.name()
                )));
            }
            Entry::Plain(_) => {
                return Err(CatalogError::Invalid(format!(
                    "`{name}` is a plain volume: --cache-mode applies to tiered and log volumes"
                )));
            }
        }
        self.show(name)
    }

    /// Checks `spec` for `name` against the other reservations (calibrating an uncalibrated
    /// pool when a setting needs the drives' figures: a reservation or a weight).
    async fn admit(&self, name: &str, entry: &Entry<D>, spec: &QosSpec) -> Result<(), CatalogError> {
        if (spec.reserves() || spec.weight.is_some()) && self.pool.meta().calibration.is_none() {
            tracing::info!("calibrating the pool for QoS (once; `stria pool calibrate` measures again)");
            self.pool.calibrate().await?;
        }
        if !spec.reserves() {
            return Ok(());
        }
        let cal = self.pool.meta().calibration.clone().expect("calibrated above");
        let others: Vec<_> = self
            .pool
            .qos()
            .specs()
            .into_iter()
            .filter(|(other, s)| other != name && s.reserves())
            .filter_map(|(other, s)| self.entry(&other).map(|e| (other, s, Self::profile(&e))))
            .collect();
        admit_reservation(&cal, name, spec, &Self::profile(entry), &others).map_err(CatalogError::Invalid)
    }

    /// The QoS part of `volume show`: settings and what the volume got (none when the volume
    /// has no settings and the dispatcher is off).
    fn qos_view(&self, name: &str) -> Option<QosView> {
        let d = self.pool.qos();
        let settings = d.spec(name);
        if settings.is_empty() && !d.active() {
            return None;
        }
        Some(QosView::new(settings, &d.rates(name)))
    }

    /// Whether `name` can be resized: every volume and clone can (a clone past its origin's
    /// size too: the family's map grows for it).
    pub fn resizable(&self, name: &str) -> bool {
        self.entry(name).is_some()
    }

    /// The clones log-structured volume `name` was deleted and is kept for, if it was.
    pub fn kept_for_clones(&self, name: &str) -> Option<Vec<String>> {
        let logs = self.logs.read();
        let kept = logs.get(name).filter(|l| l.origin_deleted())?;
        Some(kept.clones().into_iter().map(|c| c.name).collect())
    }

    /// Refuses the name of a log-structured volume deleted and kept for its clones.
    fn check_not_kept(&self, name: &str) -> Result<(), CatalogError> {
        if let Some(clones) = self.kept_for_clones(name) {
            return Err(CatalogError::Invalid(format!(
                "`{name}` was deleted and is kept, hidden, for its clones ({}): the name is free again once they are deleted",
                clones.join(", ")
            )));
        }
        Ok(())
    }

    /// Refuses a new volume or clone name that a volume, a clone or a part has already.
    fn check_name_free(&self, name: &str) -> Result<(), CatalogError> {
        self.check_not_kept(name)?;
        if self.entry(name).is_some()
            || self.pool.volume(name).is_some()
            || self.unavailable.read().contains_key(name)
        {
            return Err(CatalogError::Invalid(format!("a volume named `{name}` exists")));
        }
        Ok(())
    }

    /// Active drives of `class`.
    fn active_in_class(&self, class: DriveClass) -> u32 {
        let meta = self.pool.meta();
        let n = meta.drives.iter().filter(|d| d.class == class && d.state == DriveState::Active).count();
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// The class a volume goes on when none is given: capacity drives if the pool has any.
    fn default_class(&self) -> DriveClass {
        if self.active_in_class(DriveClass::Capacity) > 0 { DriveClass::Capacity } else { DriveClass::Fast }
    }

    /// Creates a volume of the kind its layout names; returns what `show` would.
    pub async fn create(&self, req: CreateVolume) -> Result<VolumeView, CatalogError> {
        // Before anything derives sizes from it (a log volume's space and cache): whole blocks,
        // not rounded behind the caller's back, and not too large.
        stria_engine::check_volume_size(req.size_bytes)?;
        if self.clone_named(&req.name).is_some() {
            return Err(CatalogError::Invalid(format!("a clone named `{}` exists", req.name)));
        }
        self.check_not_kept(&req.name)?;
        let parsed = req.layout.parse::<LayoutSpec>();
        if is_log_layout(&req.layout) {
            let options = LogOptions {
                chunk_bytes: req.chunk_bytes,
                cache_bytes: req.cache_bytes,
                cache_copies: req.cache_copies,
                space_bytes: req.space_bytes,
                gc: req.gc,
                cache_mode: req.cache_mode,
            };
            let spec = log_spec(&req.name, req.size_bytes, parsed?, options);
            let lv = log::create(&self.pool, spec).await?;
            self.logs.write().insert(lv.name().to_string(), lv);
            return self.created(&req).await;
        }
        if req.cache_bytes.is_some()
            || req.cache_copies.is_some()
            || req.space_bytes.is_some()
            || req.gc.is_some()
            || req.cache_mode.is_some()
        {
            return Err(CatalogError::Invalid(
                "--cache-size, --cache-copies, --space, --gc and --cache-mode apply to tiered and log layouts \
                 only (tiered:ec:K+M, log:ec:K+M)"
                    .into(),
            ));
        }
        let class = req.class.unwrap_or_else(|| self.default_class());
        let LayoutSpec::Plain(plain) = parsed? else {
            unreachable!("a layout text that is not tiered: or log: parses as plain or not at all")
        };
        let layout = plain.resolve(self.active_in_class(class))?;
        let spec = VolumeSpec {
            name: req.name.clone(),
            size_bytes: req.size_bytes,
            layout,
            chunk_bytes: req.chunk_bytes.unwrap_or(DEFAULT_CHUNK_BYTES),
            class,
            role: VolumeRole::Plain,
        };
        self.pool.create_volume(spec).await?;
        self.created(&req).await
    }

    /// Gives new volume `req.name` its QoS settings (clearing stale ones of an earlier volume of
    /// that name); one that cannot be admitted deletes the new, empty volume again.
    async fn created(&self, req: &CreateVolume) -> Result<VolumeView, CatalogError> {
        let stale = self.pool.meta().qos.contains_key(&req.name);
        if req.qos.is_empty() && !stale {
            return self.show(&req.name);
        }
        let one_at_a_time = self.qos_changes.lock().await;
        let checked = match QosUpdate::from_spec(&req.qos).apply(QosSpec::default()) {
            Ok(spec) => {
                let entry = self.entry_or_err(&req.name)?;
                match self.admit(&req.name, &entry, &spec).await {
                    Ok(()) => Ok(spec),
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(CatalogError::Invalid(e)),
        };
        match checked {
            Ok(spec) => {
                self.pool.set_qos(&req.name, spec).await?;
                drop(one_at_a_time);
                self.show(&req.name)
            }
            Err(e) => {
                drop(one_at_a_time);
                if let Err(undo) = self.delete(&req.name).await {
                    tracing::error!(volume = %req.name, error = %undo, "could not delete the volume whose QoS was refused");
                }
                Err(e)
            }
        }
    }

    /// Grows or shrinks a volume, online (a log-structured one with its snapshots and clones,
    /// which keep their sizes and contents).
    pub async fn resize(&self, name: &str, size_bytes: u64) -> Result<VolumeView, CatalogError> {
        stria_engine::check_volume_size(size_bytes)?;
        // A clone grows (past its origin's size too) and shrinks (docs/design/snapshots.md).
        if let Some((lv, _)) = self.clone_named(name) {
            lv.resize_clone(name, size_bytes).await?;
            return self.show(name);
        }
        if let Some(lv) = self.live_log(name) {
            lv.resize(size_bytes).await?;
            return self.show(name);
        }
        self.plain(name)?;
        self.pool.resize_volume(name, size_bytes).await?;
        self.show(name)
    }

    /// Deletes a volume (a log-structured one with its parts, after its mover stopped; an
    /// unavailable one with whatever parts are left; a clone's map pages before it returns).
    pub async fn delete(&self, name: &str) -> Result<(), CatalogError> {
        self.delete_volume(name, true).await.map(|_| ())
    }

    /// [`Catalog::delete`], but a clone is only marked deleted, durably, before this returns
    /// (gone from every listing, its name free) and the background task of its family drops
    /// its map pages (docs/design/snapshots.md, "Deletes in the background"); so are an
    /// origin with clones and its snapshots (the task hands theirs on and frees what only the
    /// origin held). Returns whether something was left to that task (not for other volumes,
    /// nor for the last clone of a deleted origin: the family's parts go with it).
    pub async fn delete_in_background(&self, name: &str) -> Result<bool, CatalogError> {
        self.delete_volume(name, false).await
    }

    async fn delete_volume(&self, name: &str, wait: bool) -> Result<bool, CatalogError> {
        if self.unavailable.read().contains_key(name) {
            stria_tier::delete(&self.pool, name).await?;
            self.unavailable.write().remove(name);
            return Ok(false);
        }
        let mut in_background = false;
        match self.entry_or_err(name)? {
            // With clones: the origin is deleted, its snapshots too (those with clones are kept,
            // hidden, for them), and its parts stay for the clones until the last one goes.
            Entry::Log(lv) if !lv.clones().is_empty() => {
                let (deleted, kept) = if wait {
                    lv.delete_origin().await?
                } else {
                    in_background = true;
                    lv.start_origin_delete().await?
                };
                tracing::info!(
                    volume = name,
                    ?deleted,
                    ?kept,
                    "volume deleted; its parts are kept for its clones"
                );
            }
            Entry::Log(lv) => {
                lv.close().await;
                stria_tier::delete(&self.pool, name).await?;
                self.logs.write().remove(name);
            }
            Entry::Plain(_) => self.pool.delete_volume(name).await?,
            Entry::Clone(lv, _) => {
                if wait {
                    lv.delete_clone(name).await?;
                } else {
                    lv.start_clone_delete(name).await?;
                }
                // The last clone of a deleted origin: its family's parts go now (a delete
                // left to the background stops at the close; nothing is left to drop).
                in_background = !self.delete_if_kept_for_none(&lv).await? && !wait;
            }
        }
        if self.pool.meta().qos.contains_key(name) {
            self.pool.set_qos(name, QosSpec::default()).await?;
        }
        Ok(in_background)
    }

    /// Deletes the family of `lv` when its origin was deleted and its last clone is gone (a
    /// crash before this finishes is finished at open). Returns whether it did.
    async fn delete_if_kept_for_none(&self, lv: &Arc<LogVolume<D>>) -> Result<bool, CatalogError> {
        if !lv.origin_deleted() || !lv.clones().is_empty() {
            return Ok(false);
        }
        let name = lv.name().to_string();
        let Some(lv) = self.logs.write().remove(&name) else { return Ok(false) };
        lv.close().await;
        if let Err(e) = stria_tier::delete(&self.pool, &name).await {
            // Kept listed (as deleted, with no clones): the next open finishes the delete.
            self.logs.write().insert(name, lv);
            return Err(e.into());
        }
        tracing::info!(volume = %name, "deleted an origin's parts with its last clone");
        Ok(true)
    }

    /// Scrubs a volume (a log-structured one part by part) and sums what was found.
    /// `progress(part, rows_done, rows_total)` is called as rows complete.
    pub async fn scrub(
        &self,
        name: &str,
        progress: &mut (dyn FnMut(&str, u64, u64) + Send),
    ) -> Result<ScrubReport, CatalogError> {
        let parts: Vec<String> = match self.entry_or_err(name)? {
            // A clone's data lives in its origin's parts.
            Entry::Log(lv) | Entry::Clone(lv, _) => lv.parts().iter().map(|v| v.name().to_string()).collect(),
            Entry::Plain(_) => vec![name.to_string()],
        };
        let mut total = ScrubReport { volume: name.to_string(), ..ScrubReport::default() };
        for part in parts {
            let report = self.pool.scrub(&part, |done, all| progress(&part, done, all)).await?;
            total.add(&report);
        }
        Ok(total)
    }

    /// The pool with every log-structured volume.
    pub fn status(&self) -> StatusView {
        let unavailable = self
            .unavailable
            .read()
            .iter()
            .map(|(name, reason)| UnavailableView { name: name.clone(), reason: reason.clone() })
            .collect();
        let logs: Vec<Arc<LogVolume<D>>> = self.logs.read().values().cloned().collect();
        let log: Vec<_> = logs.iter().map(|l| l.status()).collect();
        let clones = logs.iter().flat_map(|lv| lv.clones().into_iter().map(|c| clone_view(lv, &c))).collect();
        let thin = ThinView::of(&log);
        let snapshots = self.snapshots(None).unwrap_or_default();
        StatusView { pool: self.pool.status(), log, thin, unavailable, clones, snapshots }
    }

    /// Why the log-structured volume `name` could not be opened, if it could not (its
    /// snapshots and clones cannot be listed then).
    pub fn unavailable_reason(&self, name: &str) -> Option<String> {
        self.unavailable.read().get(name).cloned()
    }

    /// Any volume by name, parts included (diagnostics show each part).
    pub fn show(&self, name: &str) -> Result<VolumeView, CatalogError> {
        if let Some(why) = self.unavailable.read().get(name) {
            return Err(unavailable(name, why));
        }
        if let Some(lv) = self.live_log(name) {
            let snapshots =
                lv.snapshots().iter().map(|r| SnapshotView::of(name, lv.layer_bytes(r.id), r)).collect();
            let clones = lv.clones().iter().map(|c| clone_view(&lv, c)).collect();
            let qos = self.qos_view(name);
            return Ok(VolumeView::Log(Box::new(LogView {
                status: lv.status(),
                kind: LogTag,
                snapshots,
                clones,
                qos,
            })));
        }
        if let Some((lv, rec)) = self.clone_named(name) {
            return Ok(VolumeView::Clone(CloneView { qos: self.qos_view(name), ..clone_view(&lv, &rec) }));
        }
        let status = self.pool.status();
        let vol = status
            .volumes
            .into_iter()
            .find(|v| v.name == name)
            .ok_or_else(|| CatalogError::NotFound(name.to_string()))?;
        let meta = self.pool.meta();
        let rec = meta.volume(name).ok_or_else(|| CatalogError::NotFound(name.to_string()))?;
        let qos = if rec.role == VolumeRole::Plain { self.qos_view(name) } else { None };
        Ok(VolumeView::Plain(PlainView { qos, ..PlainView::new(vol, rec) }))
    }

    /// [`Catalog::show`], with the bytes only each snapshot of a log-structured volume holds
    /// (a walk of the map pages each owns).
    pub async fn show_full(&self, name: &str) -> Result<VolumeView, CatalogError> {
        let mut view = self.show(name)?;
        // Only the bytes each holds alone (a walk of its own pages); what each references and
        // shares needs a pass over the whole map, which `snapshot list` makes.
        if let (VolumeView::Log(l), Some(Entry::Log(lv))) = (&mut view, self.entry(name)) {
            for s in &mut l.snapshots {
                s.exclusive_bytes = Some(lv.exclusive_bytes(s.id).await?);
            }
        }
        Ok(view)
    }

    /// Log-structured volume `volume`, the kind that has snapshots, or the family of clone
    /// `volume` with its record (a clone has snapshots of its own).
    fn with_snapshots(&self, volume: &str) -> Result<(Arc<LogVolume<D>>, Option<LayerRecord>), CatalogError> {
        match self.entry_or_err(volume)? {
            Entry::Log(lv) => Ok((lv, None)),
            Entry::Clone(lv, rec) => Ok((lv, Some(rec))),
            Entry::Plain(_) => Err(CatalogError::Invalid(format!(
                "`{volume}` is not log-structured: snapshots are for tiered:ec:K+M and log:ec:K+M volumes \
                 (`stria volume convert {volume} --layout tiered:ec:K+M` makes it one, with its data)"
            ))),
        }
    }

    /// Makes snapshot `snap` of log-structured volume or clone `volume`
    /// (docs/design/snapshots.md): writes in flight finish first, new ones wait; it is durable
    /// when this returns.
    pub async fn snapshot_create(&self, volume: &str, snap: &str) -> Result<SnapshotView, CatalogError> {
        let (lv, clone) = self.with_snapshots(volume)?;
        let rec = match clone {
            None => lv.create_snapshot(snap).await?,
            Some(_) => lv.create_clone_snapshot(volume, snap).await?,
        };
        Ok(SnapshotView::of(volume, lv.layer_bytes(rec.id), &rec))
    }

    /// Deletes snapshot `snap` of `volume` (docs/design/snapshots.md, "Snapshot delete"): no
    /// data is copied; what only it held is freed for GC.
    pub async fn snapshot_delete(
        &self,
        volume: &str,
        snap: &str,
    ) -> Result<SnapshotDeletedView, CatalogError> {
        self.delete_snapshot(volume, snap, true).await
    }

    /// Starts deleting snapshot `snap` of `volume` (docs/design/snapshots.md, "Deletes in the
    /// background"): once this returns it is deleted for every reader (durably marked, gone
    /// from the listings); its map pages are handed on and its blocks freed by the volume's
    /// background task (`volume show` counts the deletes in progress).
    pub async fn snapshot_delete_in_background(
        &self,
        volume: &str,
        snap: &str,
    ) -> Result<SnapshotDeletedView, CatalogError> {
        self.delete_snapshot(volume, snap, false).await
    }

    async fn delete_snapshot(
        &self,
        volume: &str,
        snap: &str,
        wait: bool,
    ) -> Result<SnapshotDeletedView, CatalogError> {
        let (lv, clone) = self.with_snapshots(volume)?;
        let started = std::time::Instant::now();
        let stats = match (clone, wait) {
            (None, true) => lv.delete_snapshot(snap).await?,
            (Some(_), true) => lv.delete_clone_snapshot(volume, snap).await?,
            (None, false) => kept_only(lv.start_snapshot_delete(snap).await?),
            (Some(_), false) => kept_only(lv.start_clone_snapshot_delete(volume, snap).await?),
        };
        Ok(SnapshotDeletedView {
            volume: volume.to_string(),
            name: snap.to_string(),
            map_pages_handed_on: stats.pages_moved,
            map_pages_dropped: stats.pages_dropped,
            blocks_freed: stats.entries_freed,
            kept_for_clones: stats.kept_for_clones,
            seconds: started.elapsed().as_secs_f64(),
            in_background: !wait && !stats.kept_for_clones,
        })
    }

    /// Makes clone `name` of snapshot `source` (`VOL@SNAP`): a writable volume that reads as
    /// the snapshot until written; no data or map page is copied to make it.
    pub async fn volume_clone(&self, source: &str, name: &str) -> Result<CloneView, CatalogError> {
        let Some((volume, snap)) = source.split_once('@') else {
            return Err(CatalogError::Invalid(format!(
                "`{source}`: a clone is made of a snapshot, named VOLUME@SNAPSHOT"
            )));
        };
        stria_engine::check_volume_name(name)?;
        self.check_name_free(name)?;
        let (lv, clone) = self.with_snapshots(volume)?;
        let rec = match clone {
            None => lv.create_clone(snap, name).await?,
            Some(_) => lv.create_clone_of_clone(volume, snap, name).await?,
        };
        Ok(clone_view(&lv, &rec))
    }

    /// Rolls `volume` back to its snapshot `snap` (see [`LogVolume::rollback`]).
    pub async fn volume_rollback(&self, volume: &str, snap: &str) -> Result<RollbackView, CatalogError> {
        self.volume_rollback_with(volume, snap, false).await
    }

    /// [`Catalog::volume_rollback`]; with `destroy_newer`, the snapshots newer than `snap` are
    /// deleted first, newest first (as `zfs rollback -r` does), so any snapshot can be rolled
    /// back to. Refused before anything is deleted when a clone was made of one of them (the
    /// snapshot would stay, hidden, for the clone, and still stand in the way). A crash in the
    /// middle leaves some of them deleted and the volume not rolled back: the same command
    /// finishes it.
    pub async fn volume_rollback_with(
        &self,
        volume: &str,
        snap: &str,
        destroy_newer: bool,
    ) -> Result<RollbackView, CatalogError> {
        let (lv, clone) = self.with_snapshots(volume)?;
        if clone.is_some() {
            return self.clone_rollback(&lv, volume, snap, destroy_newer).await;
        }
        let started = std::time::Instant::now();
        let mut deleted = Vec::new();
        // Refused before any newer snapshot is deleted.
        lv.check_rollback_size(snap)?;
        if destroy_newer {
            let list = self.snapshots(Some(volume))?;
            let Some(at) = list.iter().position(|s| s.name == snap) else {
                return Err(CatalogError::Invalid(format!("`{volume}` has no snapshot `{snap}`")));
            };
            let newer: Vec<String> = list[at + 1..].iter().map(|s| s.name.clone()).collect();
            let blocking: Vec<String> = lv
                .clones()
                .iter()
                .map(|c| clone_view(&lv, c))
                .filter(|c| newer.contains(&c.snapshot))
                .map(|c| format!("{} (of {}@{})", c.name, volume, c.snapshot))
                .collect();
            if !blocking.is_empty() {
                return Err(CatalogError::Invalid(format!(
                    "cannot roll `{volume}` back to {snap}: clones were made of newer snapshots: {}; delete them first",
                    blocking.join(", ")
                )));
            }
            for name in newer.iter().rev() {
                lv.delete_snapshot(name).await?;
                deleted.push(name.clone());
            }
        }
        let blocks_changed = lv.rollback(snap).await?;
        Ok(RollbackView {
            volume: volume.to_string(),
            snapshot: snap.to_string(),
            blocks_changed,
            seconds: started.elapsed().as_secs_f64(),
            snapshots_deleted: deleted,
        })
    }

    /// [`Catalog::volume_rollback_with`] of clone `clone` of `lv`'s family: to its newest
    /// snapshot, or (`destroy_newer`) to an older one after deleting the newer ones, newest
    /// first; refused before anything is deleted when a clone was made of one of them.
    async fn clone_rollback(
        &self,
        lv: &Arc<LogVolume<D>>,
        clone: &str,
        snap: &str,
        destroy_newer: bool,
    ) -> Result<RollbackView, CatalogError> {
        let started = std::time::Instant::now();
        let list = lv.clone_snapshots(clone);
        let Some(at) = list.iter().position(|s| s.name == snap) else {
            return Err(CatalogError::Invalid(format!("clone `{clone}` has no snapshot `{snap}`")));
        };
        let newer: Vec<String> = list[at + 1..].iter().map(|s| s.name.clone()).collect();
        let mut deleted = Vec::new();
        if destroy_newer && !newer.is_empty() {
            let blocking: Vec<String> = lv
                .clones()
                .iter()
                .map(|c| clone_view(lv, c))
                .filter(|c| c.of_clone.as_deref() == Some(clone) && newer.contains(&c.snapshot))
                .map(|c| format!("{} (of {clone}@{})", c.name, c.snapshot))
                .collect();
            if !blocking.is_empty() {
                return Err(CatalogError::Invalid(format!(
                    "cannot roll `{clone}` back to {snap}: clones were made of newer snapshots: {}; delete them first",
                    blocking.join(", ")
                )));
            }
            for name in newer.iter().rev() {
                lv.delete_clone_snapshot(clone, name).await?;
                deleted.push(name.clone());
            }
        }
        let blocks_changed = lv.rollback_clone(clone, snap).await?;
        Ok(RollbackView {
            volume: clone.to_string(),
            snapshot: snap.to_string(),
            blocks_changed,
            seconds: started.elapsed().as_secs_f64(),
            snapshots_deleted: deleted,
        })
    }

    /// The snapshots of `volume` (a log-structured volume or a clone), or of every
    /// log-structured volume and clone; oldest first per volume.
    pub fn snapshots(&self, volume: Option<&str>) -> Result<Vec<SnapshotView>, CatalogError> {
        let of_volume = |lv: &LogVolume<D>| -> Vec<SnapshotView> {
            lv.snapshots()
                .into_iter()
                .map(|r| SnapshotView::of(lv.name(), lv.layer_bytes(r.id), &r))
                .collect()
        };
        let of_clone = |lv: &LogVolume<D>, clone: &str| -> Vec<SnapshotView> {
            lv.clone_snapshots(clone)
                .into_iter()
                .map(|r| SnapshotView::of(clone, lv.layer_bytes(r.id), &r))
                .collect()
        };
        Ok(match volume {
            Some(name) => match self.entry_or_err(name)? {
                Entry::Log(lv) => of_volume(&lv),
                Entry::Clone(lv, rec) => of_clone(&lv, &rec.name),
                Entry::Plain(_) => Vec::new(),
            },
            None => {
                let logs: Vec<Arc<LogVolume<D>>> = self.logs.read().values().cloned().collect();
                let mut all = Vec::new();
                for lv in &logs {
                    all.extend(of_volume(lv));
                    for c in lv.clones() {
                        all.extend(of_clone(lv, &c.name));
                    }
                }
                all
            }
        })
    }

    /// [`Catalog::snapshots`] with the bytes only each snapshot holds (a walk of the map pages
    /// each owns) and the bytes each references and shares (a pass over the volume's whole map:
    /// about 3 s per TiB of volume size measured, snapshot create and delete wait meanwhile).
    pub async fn snapshot_list(&self, volume: Option<&str>) -> Result<Vec<SnapshotView>, CatalogError> {
        let mut list = self.snapshots(volume)?;
        let mut referenced: HashMap<String, Vec<(u16, u64)>> = HashMap::new();
        for s in &mut list {
            match self.entry(&s.volume) {
                Some(Entry::Log(lv)) => {
                    if !referenced.contains_key(&s.volume) {
                        referenced.insert(s.volume.clone(), lv.referenced_bytes().await?);
                    }
                    s.fill_bytes(lv.exclusive_bytes(s.id).await?, &referenced[&s.volume]);
                }
                // A clone's snapshot: what only it holds (what it references is not counted).
                Some(Entry::Clone(lv, _)) => s.exclusive_bytes = Some(lv.exclusive_bytes(s.id).await?),
                _ => {}
            }
        }
        Ok(list)
    }

    /// Stops every mover, then closes the pool cleanly.
    pub async fn close(&self) -> Result<(), CatalogError> {
        let logs: Vec<Arc<LogVolume<D>>> = self.logs.read().values().cloned().collect();
        for l in logs {
            l.close().await;
        }
        self.pool.close().await?;
        Ok(())
    }
}

/// What a delete left to the background reports: only whether it was kept for clones.
fn kept_only(kept_for_clones: bool) -> stria_tier::map::DeleteStats {
    stria_tier::map::DeleteStats { kept_for_clones, ..Default::default() }
}
