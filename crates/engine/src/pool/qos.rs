//! The pool's QoS: its dispatcher, the settings per volume (kept in the pool metadata) and
//! `pool calibrate`, which measures what each drive class delivers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::join_all;
use stria_dev::{BLOCK_BYTES as BLOCK, BlockDevice, IoBytes};

use super::{Pool, VolumeSpec, now_unix_secs};
use crate::error::EngineError;
use crate::format::meta::{
    Calibration, ClassCalibration, DriveClass, DriveState, Layout, QosSpec, VolumeRole,
};
use crate::qos::{CostProfile, Dispatcher, Grant, OpKind};
use crate::volume::Volume;

/// How long each calibration measurement runs.
const MEASURE: Duration = Duration::from_millis(700);
/// Queue depth of the random measurements (the window is the read latency at this depth).
const RANDOM_DEPTH: usize = 32;
/// Queue depth and size of the sequential ones.
const SEQ_DEPTH: usize = 4;
const SEQ_BYTES: usize = 1 << 20;
/// Scratch space per drive of the class measured.
const SCRATCH_PER_DRIVE: u64 = 32 << 20;
/// The role of the scratch volumes (a part of no tiered volume, so never exported; one left by
/// a crash is deleted by the next calibration).
const SCRATCH_OWNER: &str = "(calibration)";

impl<D: BlockDevice> Pool<D> {
    /// The pool's QoS dispatcher.
    pub fn qos(&self) -> &Arc<Dispatcher> {
        &self.qos
    }

    /// Waits for the dispatcher to let one row of background work (`kind`, on `vol`) go, as
    /// flow `flow`; `None` at once when the dispatcher is off. Hold the grant while the row runs.
    pub(crate) async fn background_turn(
        &self,
        flow: &str,
        vol: &Volume<D>,
        kind: OpKind,
    ) -> Option<Grant<'_>> {
        if !self.qos.active() {
            return None;
        }
        let profile =
            CostProfile::Plain { layout: vol.layout(), chunk_bytes: vol.chunk_bytes(), class: vol.class() };
        let id = self.qos.flow(flow);
        Some(self.qos.admit(id, &profile, kind, vol.chunk_bytes()).await)
    }

    /// Sets (an empty spec removes) the QoS settings of the client-visible volume `name`,
    /// durably, then in the dispatcher. The caller checks that the volume exists and admits
    /// reservations.
    pub async fn set_qos(&self, name: &str, spec: QosSpec) -> Result<(), EngineError> {
        let key = name.to_string();
        self.core
            .update_volume(name, move |m| {
                let changed = if spec.is_empty() {
                    m.qos.remove(&key).is_some()
                } else {
                    m.qos.insert(key, spec) != Some(spec)
                };
                Ok(((), changed))
            })
            .await?;
        self.qos.set(name, spec);
        Ok(())
    }

    /// Measures each drive class with active drives through a scratch raid0 volume over all of
    /// them (4 KiB random reads and writes at queue depth 32, 1 MiB sequential ones at depth 4,
    /// 0.7 s each), records the figures in the pool metadata and gives them to the dispatcher.
    /// Runs beside client I/O, which both slows the measurement and is slowed by it.
    pub async fn calibrate(&self) -> Result<Calibration, EngineError> {
        let mut classes = Vec::new();
        for class in [DriveClass::Fast, DriveClass::Capacity] {
            let meta = self.meta();
            let width =
                meta.drives.iter().filter(|d| d.class == class && d.state == DriveState::Active).count();
            if width == 0 {
                continue;
            }
            let name = format!("stria-calibrate-{class}");
            self.drop_scratch(&name).await?;
            let spec = VolumeSpec {
                name: name.clone(),
                size_bytes: SCRATCH_PER_DRIVE * width as u64,
                layout: Layout::Raid0 { width: u32::try_from(width).unwrap_or(u32::MAX) },
                chunk_bytes: 64 << 10,
                class,
                role: VolumeRole::TierPart { tiered: SCRATCH_OWNER.into(), part: class.to_string() },
            };
            let vol = self.create_volume_unzeroed(spec).await.map_err(|e| {
                EngineError::Invalid(format!(
                    "calibration needs {} free on each {class} drive: {e}",
                    crate::units::format_size(SCRATCH_PER_DRIVE)
                ))
            })?;
            let measured = measure(&vol, class, width).await;
            self.drop_scratch(&name).await?;
            classes.push(measured?);
        }
        let cal = Calibration { measured_unix_secs: now_unix_secs(), classes };
        let stored = cal.clone();
        self.core
            .update(move |m| {
                m.calibration = Some(stored);
                Ok(((), true))
            })
            .await?;
        self.qos.set_calibration(Some(cal.clone()));
        Ok(cal)
    }

    /// Deletes scratch volume `name` if it is there (a calibration cut short).
    async fn drop_scratch(&self, name: &str) -> Result<(), EngineError> {
        let is_scratch = self.meta().volume(name).is_some_and(
            |v| matches!(&v.role, VolumeRole::TierPart { tiered, .. } if tiered == SCRATCH_OWNER),
        );
        if is_scratch { self.delete_volume(name).await } else { Ok(()) }
    }
}

/// A small xorshift: calibration offsets need spread, not quality.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// Runs `depth` workers of `op(i)` for [`MEASURE`]; returns requests done and their mean
/// latency in microseconds.
async fn run<F, Fut>(depth: usize, op: F) -> Result<(u64, f64), EngineError>
where
    F: Fn(u64) -> Fut,
    Fut: std::future::Future<Output = Result<(), EngineError>>,
{
    let start = Instant::now();
    let op = &op;
    let workers = (0..depth).map(|w| async move {
        let mut seed = 0x9E37_79B9_7F4A_7C15u64 ^ (w as u64 + 1);
        let (mut done, mut busy) = (0u64, Duration::ZERO);
        while start.elapsed() < MEASURE {
            let t = Instant::now();
            op(next(&mut seed)).await?;
            busy += t.elapsed();
            done += 1;
        }
        Ok::<_, EngineError>((done, busy))
    });
    let mut done = 0;
    let mut busy = Duration::ZERO;
    for r in join_all(workers).await {
        let (d, b) = r?;
        done += d;
        busy += b;
    }
    let per_sec = done as f64 / start.elapsed().as_secs_f64();
    Ok((per_sec as u64, busy.as_secs_f64() * 1e6 / done.max(1) as f64))
}

async fn measure<D: BlockDevice>(
    vol: &Arc<Volume<D>>,
    class: DriveClass,
    width: usize,
) -> Result<ClassCalibration, EngineError> {
    let size = vol.size_bytes();
    let blocks = size / BLOCK;
    let seq_steps = size / SEQ_BYTES as u64;
    let seq = IoBytes::zeroed(SEQ_BYTES);
    let small = IoBytes::zeroed(BLOCK as usize);
    let err = |e: crate::error::VolumeError| EngineError::Invalid(format!("calibration I/O failed: {e}"));
    // Sequential writes first: they also fill the scratch volume, so reads read written blocks.
    let (write_seq, _) = run(SEQ_DEPTH, |r| {
        let data = seq.clone();
        async move { vol.write((r % seq_steps) * SEQ_BYTES as u64, data, false).await.map_err(err) }
    })
    .await?;
    for step in 0..seq_steps {
        vol.write(step * SEQ_BYTES as u64, seq.clone(), false).await.map_err(err)?;
    }
    let (read_seq, _) = run(SEQ_DEPTH, |r| async move {
        vol.read((r % seq_steps) * SEQ_BYTES as u64, SEQ_BYTES).await.map(drop).map_err(err)
    })
    .await?;
    let (write_iops, _) = run(RANDOM_DEPTH, |r| {
        let data = small.clone();
        async move { vol.write((r % blocks) * BLOCK, data, false).await.map_err(err) }
    })
    .await?;
    let (read_iops, read_latency_us) = run(RANDOM_DEPTH, |r| async move {
        vol.read((r % blocks) * BLOCK, BLOCK as usize).await.map(drop).map_err(err)
    })
    .await?;
    Ok(ClassCalibration {
        class,
        drives: u32::try_from(width).unwrap_or(u32::MAX),
        read_iops,
        write_iops,
        read_bytes_per_sec: read_seq * SEQ_BYTES as u64,
        write_bytes_per_sec: write_seq * SEQ_BYTES as u64,
        read_latency_us: read_latency_us as u64,
    })
}
