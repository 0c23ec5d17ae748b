//! The things measured: a set of raw memory drives, and a volume of a pool built on the same
//! number of memory drives. Both are filled with tagged data before anything is timed.

use std::future::Future;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use stria_dev::mem::MemDevice;
use stria_dev::{BlockDevice, DevCountersSnapshot, IoBuf, IoBytes};
use stria_engine::{DriveClass, Layout, NewDrive, Pool, Volume, VolumeRole, VolumeSpec};

use super::load::{Rng, Target, check_tags};

/// Bytes per write while filling.
const FILL_BYTES: usize = 4 << 20;
/// Drive space beyond the volume's members: superblocks, metadata, intent bitmap, journal,
/// checksum table, allocator slack.
const DRIVE_OVERHEAD_BYTES: u64 = 160 << 20;

/// Tag of block `block` of raw drive `drive`.
fn raw_tag(drive: usize, block: u64) -> u64 {
    ((drive as u64) << 40) | block
}

/// `n` memory drives used directly. The linear space is striped over them in units of the
/// request: request `i` (of `len` bytes at `i * len`) goes to drive `i % n` at `(i / n) * len`.
pub(super) struct RawDrives {
    devs: Vec<MemDevice>,
    per_drive_bytes: u64,
}

impl RawDrives {
    /// `n` drives holding `span_bytes` of tagged data between them.
    pub(super) async fn new(n: usize, span_bytes: u64) -> Result<RawDrives> {
        let per_drive_bytes = (span_bytes / n as u64).next_multiple_of(FILL_BYTES as u64);
        let devs: Vec<MemDevice> =
            (0..n).map(|i| MemDevice::new(&format!("raw{i}"), per_drive_bytes)).collect();
        let mut template = vec![0u8; FILL_BYTES];
        Rng::new(0x5eed).fill(&mut template);
        for (d, dev) in devs.iter().enumerate() {
            let mut at = 0;
            while at < per_drive_bytes {
                let mut buf = IoBuf::copy_from(&template);
                for (i, block) in buf.chunks_exact_mut(4096).enumerate() {
                    block[..8].copy_from_slice(&raw_tag(d, at / 4096 + i as u64).to_le_bytes());
                }
                dev.write(at, buf.freeze(), false).await.context("filling a raw drive")?;
                at += FILL_BYTES as u64;
            }
        }
        Ok(RawDrives { devs, per_drive_bytes })
    }

    fn place(&self, offset: u64, len: usize) -> (usize, u64) {
        let n = self.devs.len() as u64;
        let index = offset / len as u64;
        ((index % n) as usize, (index / n) * len as u64)
    }
}

impl Target for RawDrives {
    fn span_bytes(&self) -> u64 {
        self.per_drive_bytes * self.devs.len() as u64
    }

    fn read(&self, offset: u64, len: usize) -> impl Future<Output = Result<(), String>> + Send {
        let (d, at) = self.place(offset, len);
        async move {
            let buf = self.devs[d].read(at, IoBuf::for_overwrite(len)).await.map_err(|e| e.to_string())?;
            check_tags(&buf, |i| raw_tag(d, at / 4096 + i))
        }
    }

    fn write(&self, offset: u64, data: IoBytes) -> impl Future<Output = Result<(), String>> + Send {
        let (d, at) = self.place(offset, data.len());
        async move { self.devs[d].write(at, data, false).await.map_err(|e| e.to_string()) }
    }

    fn drive_counters(&self) -> DevCountersSnapshot {
        let mut total = DevCountersSnapshot::default();
        for d in &self.devs {
            total.add(&d.counters().snapshot());
        }
        total
    }
}

/// A volume of `layout` in a pool of exactly `layout.members()` memory drives.
pub(super) struct VolumeUnderTest<D: BlockDevice> {
    pub(super) pool: Pool<D>,
    pub(super) vol: Arc<Volume<D>>,
}

/// The drives of a pool for a volume of `volume_bytes` with `layout`, made by `make(name,
/// size)`.
pub(super) async fn build_volume<D: BlockDevice>(
    layout: Layout,
    volume_bytes: u64,
    chunk_bytes: u64,
    make: impl Fn(&str, u64) -> D,
) -> Result<VolumeUnderTest<D>> {
    let n = layout.members() as usize;
    let row_bytes = u64::from(layout.data_columns()) * chunk_bytes;
    let volume_bytes = volume_bytes.next_multiple_of(row_bytes);
    let member_bytes = volume_bytes / row_bytes * chunk_bytes;
    let drive_bytes = member_bytes + DRIVE_OVERHEAD_BYTES;
    let drives = (0..n)
        .map(|i| {
            let name = format!("d{i}");
            NewDrive {
                dev: make(&name, drive_bytes),
                path: name,
                class: DriveClass::Capacity,
                domain: String::new(),
                fresh: true,
            }
        })
        .collect();
    let pool = Pool::create("bench", drives).await.context("creating the pool")?;
    let spec = VolumeSpec {
        name: "bench".into(),
        size_bytes: volume_bytes,
        layout,
        chunk_bytes,
        class: DriveClass::Capacity,
        role: VolumeRole::Plain,
    };
    let vol = pool.create_volume(spec).await.with_context(|| format!("creating a {layout} volume"))?;
    Ok(VolumeUnderTest { pool, vol })
}

impl<D: BlockDevice> VolumeUnderTest<D> {
    /// Writes tagged data over the whole volume (whole stripes, so ec uses its full-stripe
    /// path) and flushes, so every timed read hits a written block on a drive.
    pub(super) async fn fill(&self) -> Result<()> {
        let size = self.vol.size_bytes();
        let step = (FILL_BYTES as u64).next_multiple_of(self.vol.row_bytes());
        let mut template = vec![0u8; step as usize];
        Rng::new(0xf111).fill(&mut template);
        let mut at = 0;
        while at < size {
            let n = step.min(size - at);
            let mut buf = IoBuf::copy_from(&template[..n as usize]);
            for (i, block) in buf.chunks_exact_mut(4096).enumerate() {
                block[..8].copy_from_slice(&(at / 4096 + i as u64).to_le_bytes());
            }
            self.vol.write(at, buf.freeze(), false).await.context("filling the volume")?;
            at += n;
        }
        self.pool.flush().await.context("flushing after the fill")?;
        Ok(())
    }

    /// Fails the drive in slot 0 (every layout measured spreads its members symmetrically, so
    /// which one does not matter).
    pub(super) async fn fail_one_drive(&self) -> Result<()> {
        self.pool.fail_drive(0, "failed by the benchmark").await.context("failing a drive")?;
        if self.vol.state() != stria_engine::VolumeState::Degraded {
            bail!("volume is {:?} after failing one drive, expected degraded", self.vol.state());
        }
        Ok(())
    }
}

impl<D: BlockDevice> Target for VolumeUnderTest<D> {
    fn span_bytes(&self) -> u64 {
        self.vol.size_bytes()
    }

    async fn read(&self, offset: u64, len: usize) -> Result<(), String> {
        let buf = self.vol.read(offset, len).await.map_err(|e| e.to_string())?;
        if buf.len() != len {
            return Err(format!("read of {len} bytes returned {}", buf.len()));
        }
        check_tags(&buf, |i| offset / 4096 + i)
    }

    async fn write(&self, offset: u64, data: IoBytes) -> Result<(), String> {
        self.vol.write(offset, data, false).await.map_err(|e| e.to_string())
    }

    fn drive_counters(&self) -> DevCountersSnapshot {
        let mut total = DevCountersSnapshot::default();
        for d in self.pool.drives().iter() {
            total.add(&d.counters());
        }
        total
    }
}
