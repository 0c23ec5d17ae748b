//! The pool with its open tiered volumes: what the CLI and the daemon work on.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::Result;
use parking_lot::RwLock;
use stria_dev::{BlockDevice, FileDevice, IoBuf, IoBytes};
use stria_engine::{Extent, Pool, Volume, VolumeError, VolumeRole};
use stria_tier::TieredVolume;

/// The drives of a pool directory.
pub(crate) type Dev = FileDevice;

/// A volume clients can use: plain or tiered.
pub(crate) enum AnyVolume<D: BlockDevice> {
    Plain(Arc<Volume<D>>),
    Tiered(Arc<TieredVolume<D>>),
}

impl<D: BlockDevice> Clone for AnyVolume<D> {
    fn clone(&self) -> AnyVolume<D> {
        match self {
            AnyVolume::Plain(v) => AnyVolume::Plain(Arc::clone(v)),
            AnyVolume::Tiered(v) => AnyVolume::Tiered(Arc::clone(v)),
        }
    }
}

impl<D: BlockDevice> AnyVolume<D> {
    pub(crate) fn name(&self) -> &str {
        match self {
            AnyVolume::Plain(v) => v.name(),
            AnyVolume::Tiered(v) => v.name(),
        }
    }

    pub(crate) fn size_bytes(&self) -> u64 {
        match self {
            AnyVolume::Plain(v) => v.size_bytes(),
            AnyVolume::Tiered(v) => v.size_bytes(),
        }
    }

    pub(crate) fn layout(&self) -> String {
        match self {
            AnyVolume::Plain(v) => v.layout().to_string(),
            AnyVolume::Tiered(v) => format!("tiered:{}", v.capacity_volume().layout()),
        }
    }

    /// The I/O size that suits the volume best (a chunk; a blockset for tiered).
    pub(crate) fn preferred_block_bytes(&self) -> u64 {
        match self {
            AnyVolume::Plain(v) => v.chunk_bytes(),
            AnyVolume::Tiered(v) => v.blockset_bytes(),
        }
    }

    pub(crate) async fn read(&self, offset: u64, len: usize) -> Result<IoBuf, VolumeError> {
        match self {
            AnyVolume::Plain(v) => v.read(offset, len).await,
            AnyVolume::Tiered(v) => v.read(offset, len).await,
        }
    }

    pub(crate) async fn write(&self, offset: u64, data: IoBytes, fua: bool) -> Result<(), VolumeError> {
        match self {
            AnyVolume::Plain(v) => v.write(offset, data, fua).await,
            AnyVolume::Tiered(v) => v.write(offset, data, fua).await,
        }
    }

    pub(crate) async fn write_zeroes(
        &self,
        offset: u64,
        len: u64,
        fua: bool,
        fast_only: bool,
    ) -> Result<(), VolumeError> {
        match self {
            AnyVolume::Plain(v) => v.write_zeroes(offset, len, fua, fast_only).await,
            AnyVolume::Tiered(v) => v.write_zeroes(offset, len, fast_only).await,
        }
    }

    pub(crate) async fn trim(&self, offset: u64, len: u64) -> Result<(), VolumeError> {
        match self {
            AnyVolume::Plain(v) => v.trim(offset, len).await,
            AnyVolume::Tiered(v) => v.trim(offset, len).await,
        }
    }

    pub(crate) async fn flush(&self) -> Result<(), VolumeError> {
        match self {
            AnyVolume::Plain(v) => v.flush().await,
            AnyVolume::Tiered(v) => v.flush().await,
        }
    }

    pub(crate) fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>, VolumeError> {
        match self {
            AnyVolume::Plain(v) => v.block_status(offset, len),
            AnyVolume::Tiered(v) => v.block_status(offset, len),
        }
    }
}

/// An open pool and its tiered volumes.
pub(crate) struct Stack<D: BlockDevice = Dev> {
    pub(crate) pool: Arc<Pool<D>>,
    tiers: RwLock<BTreeMap<String, Arc<TieredVolume<D>>>>,
}

impl<D: BlockDevice> Stack<D> {
    /// Opens every tiered volume of `pool` (their destagers start on this runtime).
    pub(crate) async fn open(pool: Pool<D>) -> Result<Stack<D>> {
        Stack::open_shared(Arc::new(pool)).await
    }

    /// Like [`Stack::open`] for a pool already shared.
    pub(crate) async fn open_shared(pool: Arc<Pool<D>>) -> Result<Stack<D>> {
        let mut tiers = BTreeMap::new();
        for rec in pool.meta().tiered.clone() {
            let tv = stria_tier::open(&pool, &rec).await?;
            tiers.insert(rec.name.clone(), tv);
        }
        Ok(Stack { pool, tiers: RwLock::new(tiers) })
    }

    pub(crate) fn tiered(&self, name: &str) -> Option<Arc<TieredVolume<D>>> {
        self.tiers.read().get(name).cloned()
    }

    pub(crate) fn tiered_all(&self) -> Vec<Arc<TieredVolume<D>>> {
        self.tiers.read().values().cloned().collect()
    }

    pub(crate) fn add_tiered(&self, tv: Arc<TieredVolume<D>>) {
        self.tiers.write().insert(tv.name().to_string(), tv);
    }

    pub(crate) fn remove_tiered(&self, name: &str) -> Option<Arc<TieredVolume<D>>> {
        self.tiers.write().remove(name)
    }

    /// A client-visible volume by name (tier parts are not).
    pub(crate) fn volume(&self, name: &str) -> Option<AnyVolume<D>> {
        if let Some(t) = self.tiered(name) {
            return Some(AnyVolume::Tiered(t));
        }
        let meta = self.pool.meta();
        let rec = meta.volume(name)?;
        if rec.role != VolumeRole::Plain {
            return None;
        }
        self.pool.volume(name).map(AnyVolume::Plain)
    }

    /// Names of every client-visible volume.
    pub(crate) fn names(&self) -> Vec<String> {
        let meta = self.pool.meta();
        let mut names: Vec<String> =
            meta.volumes.iter().filter(|v| v.role == VolumeRole::Plain).map(|v| v.name.clone()).collect();
        names.extend(self.tiers.read().keys().cloned());
        names.sort();
        names
    }

    /// Stops the destagers and closes the pool cleanly.
    pub(crate) async fn close(&self) -> Result<()> {
        for t in self.tiered_all() {
            t.close().await;
        }
        self.pool.close().await?;
        Ok(())
    }
}
