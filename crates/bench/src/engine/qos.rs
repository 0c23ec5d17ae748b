//! `--qos`: what the QoS dispatcher costs a volume's IOPS when nothing binds (issue 14's goal:
//! at most 5 %). Three targets over the same volume, their runs alternating: the volume behind
//! the volume contract (`Arc<dyn BlockVolume>`, what the NBD export calls without QoS); the
//! volume behind `QosVolume` with the dispatcher off (no setting in the pool: the path every
//! volume takes when QoS is not used); and with it on (a weight set on another name, so every
//! request is queued, tagged, windowed and granted, but nothing holds it back). Then the
//! dispatcher alone, from 1 to every CPU's thread: admits and releases of requests that go on
//! their shard's lease, against the same through the pool's lock (a flow with a reservation
//! that never binds), in the same run.

use std::sync::Arc;

use anyhow::Result;
use stria_dev::mem::MemDevice;
use stria_dev::{DevCountersSnapshot, IoBytes};
use stria_engine::qos::{CostProfile, Dispatcher, OpKind, QosVolume};
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
    dispatcher_alone(args);
    Ok(())
}

/// Requests each thread admits and releases per measured run of [`dispatcher_alone`].
const ALONE_OPS: u64 = 1 << 20;

/// The dispatcher alone (no volume): `threads` threads each admit and release [`ALONE_OPS`]
/// 4 KiB reads of one flow, nothing binding. `leased`: the flow has only a weight (its requests
/// go on their shard's lease); otherwise a reservation of 1 request per second (every request
/// through the pool's lock: tags decide its phase; it never waits). Requests per second.
fn admit_rate(threads: usize, leased: bool) -> f64 {
    let d = Dispatcher::new(None);
    let spec = if leased {
        QosSpec { weight: Some(100), ..QosSpec::default() }
    } else {
        QosSpec { iops_reserve: Some(1), ..QosSpec::default() }
    };
    d.set("v", spec);
    let flow = d.flow("v");
    let profile = CostProfile::Plain {
        layout: stria_engine::Layout::Raid0 { width: 1 },
        chunk_bytes: 4096,
        class: stria_engine::DriveClass::Capacity,
    };
    let start = std::time::Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                for _ in 0..ALONE_OPS {
                    drop(at_once(d.admit(flow, &profile, OpKind::Read, 4096)));
                }
            });
        }
    });
    (threads as u64 * ALONE_OPS) as f64 / start.elapsed().as_secs_f64()
}

/// The output of a future that is ready at its first poll (an admit with nothing binding).
fn at_once<F: std::future::Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    match f.as_mut().poll(&mut std::task::Context::from_waker(std::task::Waker::noop())) {
        std::task::Poll::Ready(v) => v,
        std::task::Poll::Pending => panic!("an admit with nothing binding waited"),
    }
}

/// Prints the dispatcher-alone table: medians of `args.runs` runs, the two kinds alternating.
fn dispatcher_alone(args: &EngineBenchArgs) {
    println!(
        "the dispatcher alone, admit and release of a 4 KiB read with nothing binding, million requests/s \
         (median of {}), and ns per request per thread:",
        args.runs
    );
    println!("{:<8} {:>18} {:>18} {:>7}", "THREADS", "ON A LEASE", "POOL LOCK", "RATIO");
    for threads in 1..=num_cpus().max(1) {
        let (mut leased, mut locked) = (Vec::new(), Vec::new());
        for _ in 0..args.runs.max(1) {
            leased.push(admit_rate(threads, true));
            locked.push(admit_rate(threads, false));
        }
        let (a, b) = (super::median(&leased), super::median(&locked));
        let ns = |rate: f64| 1e9 * threads as f64 / rate;
        println!(
            "{:<8} {:>9.2} ({:>4.0} ns) {:>9.2} ({:>4.0} ns) {:>7.2}",
            threads,
            a / 1e6,
            ns(a),
            b / 1e6,
            ns(b),
            a / b
        );
    }
}
