//! What a request costs the drives (docs/design/qos.md, "Cost units"), and admission control.
//!
//! A request's cost is the time it takes of each drive class, in microseconds of the whole
//! class (a class does 10^6 of them per second), from the layout's drive work and the pool's
//! calibration: `10^6 x (max(read ops / read IOPS, read bytes / read bandwidth) + the same for
//! writes)`.

use crate::format::meta::{Calibration, ClassCalibration, DriveClass, Layout, QosSpec};
use crate::units::format_size;

use super::sched::Demand;

/// The share of a class's calibrated time that reservations may take together (the rest is
/// headroom for background work and calibration error).
pub const RESERVABLE: f64 = 0.8;

/// The index of a class in [`Demand::cost`].
pub fn class_index(class: DriveClass) -> usize {
    match class {
        DriveClass::Fast => 0,
        DriveClass::Capacity => 1,
    }
}

/// What a volume makes the drives do, by kind of request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum CostProfile {
    /// A plain volume.
    Plain { layout: Layout, chunk_bytes: u64, class: DriveClass },
    /// A log-structured volume (`log:` or `tiered:`), its snapshots and clones: writes land in
    /// `copies` copies of the write cache on `cache_class` and reach `seg_class` as full
    /// `ec:data+parity` stripes; reads come from the segments (the cache serves few).
    Log {
        copies: u32,
        cache_class: DriveClass,
        data: u32,
        parity: u32,
        chunk_bytes: u64,
        seg_class: DriveClass,
    },
}

/// A request's kind, as far as cost goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    Read,
    Write,
    /// Zeroing, discard and flush: metadata (one small write), whatever the range.
    Meta,
    /// Rebuilding one row of a plain volume (`bytes`: its chunk): the reads it is rebuilt from
    /// and one chunk written.
    Rebuild,
    /// Scrubbing one row of a plain volume (`bytes`: its chunk): every member's chunk read.
    Scrub,
}

/// Drive work on one class.
#[derive(Debug, Clone, Copy, Default)]
struct Work {
    read_ops: f64,
    read_bytes: f64,
    write_ops: f64,
    write_bytes: f64,
}

impl Work {
    fn micros(&self, c: &ClassCalibration) -> f64 {
        let per = |ops: f64, bytes: f64, iops: u64, bps: u64| {
            (ops / iops.max(1) as f64).max(bytes / bps.max(1) as f64)
        };
        1e6 * (per(self.read_ops, self.read_bytes, c.read_iops, c.read_bytes_per_sec)
            + per(self.write_ops, self.write_bytes, c.write_iops, c.write_bytes_per_sec))
    }
}

/// Drive requests a range of `bytes` makes with `chunk`-byte chunks (at least one).
fn pieces(bytes: f64, chunk: u64) -> f64 {
    (bytes / chunk as f64).ceil().max(1.0)
}

/// Figures for a class never calibrated (only weights and windows use them; a reservation
/// needs a calibration): a modest NVMe drive per drive of the class.
fn uncalibrated(class: DriveClass) -> ClassCalibration {
    ClassCalibration {
        class,
        drives: 1,
        read_iops: 100_000,
        write_iops: 50_000,
        read_bytes_per_sec: 1 << 30,
        write_bytes_per_sec: 512 << 20,
        read_latency_us: 500,
    }
}

/// The figures the cost of `class` is computed from.
pub fn class_figures(cal: Option<&Calibration>, class: DriveClass) -> ClassCalibration {
    cal.and_then(|c| c.class(class)).cloned().unwrap_or_else(|| uncalibrated(class))
}

impl CostProfile {
    /// The drive work of one request, per class.
    fn work(&self, kind: OpKind, bytes: u64) -> [(DriveClass, Work); 2] {
        let n = bytes as f64;
        let mut fast = Work::default();
        let mut cap = Work::default();
        let on = |class: DriveClass, fast: &mut Work, cap: &mut Work, f: &dyn Fn(&mut Work)| match class {
            DriveClass::Fast => f(fast),
            DriveClass::Capacity => f(cap),
        };
        match *self {
            CostProfile::Plain { layout, chunk_bytes, class } => {
                let p = pieces(n, chunk_bytes);
                let chunk = chunk_bytes as f64;
                let members = f64::from(layout.members());
                let sources = match layout {
                    Layout::Raid0 { .. } => 0.0,
                    Layout::Raid1 { .. } | Layout::Raid10 { .. } => 1.0,
                    Layout::Ec { data_shards, .. } => f64::from(data_shards),
                };
                on(class, &mut fast, &mut cap, &|w: &mut Work| match (kind, layout) {
                    (OpKind::Rebuild, _) => {
                        w.read_ops = sources;
                        w.read_bytes = sources * n;
                        w.write_ops = 1.0;
                        w.write_bytes = n;
                    }
                    (OpKind::Scrub, _) => {
                        w.read_ops = members;
                        w.read_bytes = members * n;
                    }
                    (OpKind::Read, _) => {
                        w.read_ops = p;
                        w.read_bytes = n;
                    }
                    (OpKind::Meta, _) => w.write_ops = 1.0,
                    (OpKind::Write, Layout::Raid0 { .. }) => {
                        w.write_ops = p;
                        w.write_bytes = n;
                    }
                    (OpKind::Write, Layout::Raid1 { copies } | Layout::Raid10 { copies, .. }) => {
                        w.write_ops = p * f64::from(copies);
                        w.write_bytes = n * f64::from(copies);
                    }
                    (OpKind::Write, Layout::Ec { data_shards, parity_shards }) => {
                        let (k, m) = (f64::from(data_shards), f64::from(parity_shards));
                        if n >= k * chunk {
                            // Whole stripes: data and parity written, nothing read.
                            w.write_ops = n / (k * chunk) * (k + m);
                            w.write_bytes = n * (k + m) / k;
                        } else {
                            // Read-modify-write of the data pieces and every parity.
                            w.read_ops = p + m;
                            w.read_bytes = n + m * n.min(chunk);
                            w.write_ops = p + m;
                            w.write_bytes = w.read_bytes;
                        }
                    }
                });
            }
            CostProfile::Log { copies, cache_class, data, parity, chunk_bytes, seg_class } => {
                let (k, m, chunk) = (f64::from(data), f64::from(parity), chunk_bytes as f64);
                match kind {
                    // Rebuild and scrub run on the parts, which are plain volumes.
                    OpKind::Read | OpKind::Rebuild | OpKind::Scrub => {
                        on(seg_class, &mut fast, &mut cap, &|w: &mut Work| {
                            w.read_ops = pieces(n, chunk_bytes);
                            w.read_bytes = n;
                        })
                    }
                    OpKind::Meta => on(cache_class, &mut fast, &mut cap, &|w: &mut Work| {
                        w.write_ops = f64::from(copies);
                    }),
                    OpKind::Write => {
                        on(cache_class, &mut fast, &mut cap, &|w: &mut Work| {
                            w.write_ops += f64::from(copies);
                            w.write_bytes += n * f64::from(copies);
                        });
                        // Its share of the destage: whole stripes, written once.
                        on(seg_class, &mut fast, &mut cap, &|w: &mut Work| {
                            w.write_ops += n / (k * chunk) * (k + m);
                            w.write_bytes += n * (k + m) / k;
                        });
                    }
                }
            }
        }
        [(DriveClass::Fast, fast), (DriveClass::Capacity, cap)]
    }

    /// What one request of `bytes` asks of the drives under `cal`.
    pub fn demand(&self, kind: OpKind, bytes: u64, cal: Option<&Calibration>) -> Demand {
        let mut cost = [0.0; 2];
        for (class, w) in self.work(kind, bytes) {
            cost[class_index(class)] = w.micros(&class_figures(cal, class));
        }
        Demand { bytes: bytes as f64, cost }
    }

    /// The class time per second (microseconds, per class) that `spec`'s reservation can
    /// take: its IOPS as 4 KiB requests and its bandwidth as 1 MiB requests, each at the
    /// dearer of a read and a write.
    pub fn reserved(&self, spec: &QosSpec, cal: Option<&Calibration>) -> [f64; 2] {
        let mut out = [0.0; 2];
        let mut add = |count: f64, bytes: u64| {
            let r = self.demand(OpKind::Read, bytes, cal).cost;
            let w = self.demand(OpKind::Write, bytes, cal).cost;
            for i in 0..2 {
                out[i] += count * r[i].max(w[i]);
            }
        };
        if let Some(iops) = spec.iops_reserve {
            add(iops as f64, 4096);
        }
        if let Some(bw) = spec.bw_reserve {
            add(bw as f64 / f64::from(1u32 << 20), 1 << 20);
        }
        out
    }
}

/// Refuses `new` (for volume `name` with `profile`) when, with the reservations of `others`,
/// some class would be reserved beyond [`RESERVABLE`] of its calibrated time. The error gives
/// the numbers.
pub fn admit_reservation(
    cal: &Calibration,
    name: &str,
    new: &QosSpec,
    profile: &CostProfile,
    others: &[(String, QosSpec, CostProfile)],
) -> Result<(), String> {
    let asked = profile.reserved(new, Some(cal));
    for class in [DriveClass::Fast, DriveClass::Capacity] {
        let i = class_index(class);
        if asked[i] == 0.0 {
            continue;
        }
        let Some(fig) = cal.class(class) else {
            return Err(format!("the pool's {class} drives were not calibrated; run `stria pool calibrate`"));
        };
        let mut holders = Vec::new();
        let mut taken = 0.0;
        for (other, spec, p) in others {
            let t = p.reserved(spec, Some(cal))[i];
            if t > 0.0 {
                taken += t;
                holders.push(format!("{other} {:.0} %", t / 1e4));
            }
        }
        if taken + asked[i] > RESERVABLE * 1e6 * (1.0 + 1e-9) {
            let held = if holders.is_empty() { String::new() } else { format!(" ({})", holders.join(", ")) };
            return Err(format!(
                "reservation refused: `{name}` would take {:.0} % of the {class} drives' time \
                 ({}), {:.0} % is reserved already{held}, and at most {:.0} % may be reserved; \
                 the {} {class} drives were calibrated at {} 4 KiB random reads/s, {} writes/s, \
                 {}/s read, {}/s written",
                asked[i] / 1e4,
                describe(new),
                taken / 1e4,
                RESERVABLE * 100.0,
                fig.drives,
                fig.read_iops,
                fig.write_iops,
                format_size(fig.read_bytes_per_sec),
                format_size(fig.write_bytes_per_sec),
            ));
        }
    }
    Ok(())
}

/// `iops-reserve 5000, bw-reserve 100 MiB/s`.
fn describe(spec: &QosSpec) -> String {
    let mut parts = Vec::new();
    if let Some(v) = spec.iops_reserve {
        parts.push(format!("iops-reserve {v}"));
    }
    if let Some(v) = spec.bw_reserve {
        parts.push(format!("bw-reserve {}/s", format_size(v)));
    }
    parts.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cal() -> Calibration {
        let class = |class, iops: u64| ClassCalibration {
            class,
            drives: 6,
            read_iops: iops,
            write_iops: iops / 2,
            read_bytes_per_sec: 1 << 30,
            write_bytes_per_sec: 1 << 29,
            read_latency_us: 300,
        };
        Calibration {
            measured_unix_secs: 0,
            classes: vec![class(DriveClass::Fast, 200_000), class(DriveClass::Capacity, 100_000)],
        }
    }

    #[test]
    fn an_ec_random_write_costs_more_than_a_read_and_a_full_stripe_less_per_byte() {
        let ec = CostProfile::Plain {
            layout: Layout::Ec { data_shards: 4, parity_shards: 2 },
            chunk_bytes: 64 << 10,
            class: DriveClass::Capacity,
        };
        let c = cal();
        let read = ec.demand(OpKind::Read, 4096, Some(&c)).total_cost();
        let write = ec.demand(OpKind::Write, 4096, Some(&c)).total_cost();
        // A read is one drive read (10 us of a 100k IOPS class); a write reads and writes three.
        assert!((read - 10.0).abs() < 1e-9, "{read}");
        assert!((write - (30.0 + 60.0)).abs() < 1e-9, "{write}");
        let stripe = ec.demand(OpKind::Write, 256 << 10, Some(&c)).total_cost();
        assert!(stripe / 64.0 < write, "a full stripe costs less per 4 KiB: {stripe}");
    }

    #[test]
    fn a_tiered_write_is_charged_on_both_classes() {
        let t = CostProfile::Log {
            copies: 2,
            cache_class: DriveClass::Fast,
            data: 4,
            parity: 2,
            chunk_bytes: 64 << 10,
            seg_class: DriveClass::Capacity,
        };
        let d = t.demand(OpKind::Write, 4096, Some(&cal()));
        assert!(d.cost[0] > 0.0 && d.cost[1] > 0.0, "{d:?}");
        let r = t.demand(OpKind::Read, 4096, Some(&cal()));
        assert_eq!(r.cost[0], 0.0);
    }

    #[test]
    fn admission_refuses_beyond_the_reservable_share_with_the_numbers() {
        let c = cal();
        let raid1 = CostProfile::Plain {
            layout: Layout::Raid1 { copies: 2 },
            chunk_bytes: 4096,
            class: DriveClass::Capacity,
        };
        // A 4 KiB raid1 write: 2 writes of a 50k IOPS class = 40 us; 10,000/s is 40 %.
        let half = QosSpec { iops_reserve: Some(10_000), ..QosSpec::default() };
        assert!(admit_reservation(&c, "a", &half, &raid1, &[]).is_ok());
        let others = vec![("a".to_string(), half, raid1)];
        assert!(admit_reservation(&c, "b", &half, &raid1, &others).is_ok(), "80 % is allowed");
        let more = QosSpec { iops_reserve: Some(10_001), ..QosSpec::default() };
        let e = admit_reservation(&c, "b", &more, &raid1, &others).unwrap_err();
        assert!(e.contains("40 % is reserved already (a 40 %)") && e.contains("at most 80 %"), "{e}");
    }
}
