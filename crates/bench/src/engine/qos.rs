//! `--qos`: what the QoS dispatcher costs a volume's IOPS when nothing binds (issue 14's goal:
//! at most 5 %). Three targets over the same volume, their runs alternating: the volume behind
//! the volume contract (`Arc<dyn BlockVolume>`, what the NBD export calls without QoS); the
//! volume behind `QosVolume` with the dispatcher off (no setting in the pool: the path every
//! volume takes when QoS is not used); and with it on (a weight set on another name, so every
//! request is queued, tagged, windowed and granted, but nothing holds it back).

use std::sync::Arc;

use anyhow::Result;
use stria_dev::mem::MemDevice;
use stria_dev::{DevCountersSnapshot, IoBytes};
use stria_engine::qos::{CostProfile, QosVolume};
use stria_engine::{BlockVolume, Durability, QosSpec};

use super::load::{Target, check_tags};
use super::rig::{VolumeUnderTest, build_volume};
use super::{Cell, EngineBenchArgs, Op, OpState, workload};
use crate::host::{cpu_model, num_cpus};

struct Behind {
    vut: Arc<VolumeUnderTest<MemDevice>>,
    vol: Arc<dyn BlockVolume>,
}

impl Target for Behind {
    fn span_bytes(&self) -> u64 {
        self.vol.size_bytes()
    }

    async fn read(&self, offset: u64, len: usize) -> Result<(), String> {
        let buf = self.vol.read(offset, len).await.map_err(|e| e.to_string())?;
        check_tags(&buf, |i| offset / 4096 + i)
    }

    async fn write(&self, offset: u64, data: IoBytes) -> Result<(), String> {
        self.vol.write(offset, data, Durability::Buffered).await.map_err(|e| e.to_string())
    }

    fn drive_counters(&self) -> DevCountersSnapshot {
        self.vut.drive_counters()
    }
}

/// Measures and prints the table.
pub(super) async fn measure(args: &EngineBenchArgs) -> Result<()> {
    println!(
        "stria-bench-engine --qos on {} ({} CPUs online), qd {}, {} runs of {} ms (median), clock {:?}",
        cpu_model(),
        num_cpus(),
        args.qd,
        args.runs,
        args.sample_ms,
        args.clock
    );
    println!(
        "{:<10} {:<11} {:>12} {:>12} {:>7} {:>12} {:>7}",
        "LAYOUT", "OP", "CONTRACT", "QOS OFF", "RATIO", "QOS ON", "RATIO"
    );
    for &layout in &args.layouts {
        let vut =
            Arc::new(build_volume(layout, args.data_mib << 20, args.chunk as u64, MemDevice::new).await?);
        vut.fill().await?;
        let dispatcher = Arc::clone(vut.pool.qos());
        let profile = CostProfile::Plain { layout, chunk_bytes: args.chunk as u64, class: vut.vol.class() };
        let inner: Arc<dyn BlockVolume> = Arc::clone(&vut.vol) as Arc<dyn BlockVolume>;
        let plain = Arc::new(Behind { vut: Arc::clone(&vut), vol: Arc::clone(&inner) });
        let behind = Arc::new(Behind {
            vut: Arc::clone(&vut),
            vol: Arc::new(QosVolume::new(inner, Arc::clone(&dispatcher), "bench", profile)),
        });
        for (i, op) in [Op::RandRead, Op::RandWrite].into_iter().enumerate() {
            let load = workload(op, 4096, args);
            let states: Vec<OpState> = (0..3).map(|k| OpState::new(4096, 300 + 10 * i as u64 + k)).collect();
            let mut cells: Vec<Cell> =
                (0..3).map(|_| Cell::new(Some(layout), layout.members() as usize, false, op, 4096)).collect();
            for run in 0..=args.runs {
                let direct = states[0].sample(&plain, &load, run as u64).await;
                dispatcher.set("other", QosSpec::default());
                let off = states[1].sample(&behind, &load, run as u64).await;
                dispatcher.set("other", QosSpec { weight: Some(100), ..QosSpec::default() });
                let on = states[2].sample(&behind, &load, run as u64).await;
                dispatcher.set("other", QosSpec::default());
                if run > 0 {
                    for (cell, s) in cells.iter_mut().zip([&direct, &off, &on]) {
                        cell.add(s, args.clock, args.threads);
                    }
                }
            }
            if let Some(c) = cells.iter().find(|c| c.errors > 0) {
                anyhow::bail!(
                    "{layout} {}: {} requests failed; first: {}",
                    op.name(),
                    c.errors,
                    c.first_error.as_deref().unwrap_or("?")
                );
            }
            let (v, off, on) = (cells[0].iops(), cells[1].iops(), cells[2].iops());
            println!(
                "{:<10} {:<11} {:>12.0} {:>12.0} {:>7.3} {:>12.0} {:>7.3}",
                layout.to_string(),
                op.name(),
                v,
                off,
                off / v,
                on,
                on / v
            );
        }
        vut.pool.close().await?;
    }
    Ok(())
}
