//! Write amplification by drive region: how many bytes each host byte costs on the drives, split
//! into the layout's own writes (data, copies, parity), the journal, the checksum pages, the
//! intent bitmap and the metadata, for a given write pattern and flush interval.

use anyhow::{Context, Result};
use stria_dev::mem::MemDevice;
use stria_engine::Layout;

use crate::regions::{REGIONS, Region, Tap};

use super::load::{Payloads, Rng};
use super::rig::{VolumeUnderTest, build_volume};

/// A memory drive whose writes are counted by region.
fn tapped_memory(name: &str, size_bytes: u64) -> Tap<MemDevice> {
    Tap::new(MemDevice::new(name, size_bytes)).expect("benchmark drives are large enough")
}

/// One measured write pattern.
#[derive(Clone, Debug)]
pub(super) struct AmpRow {
    pub(super) layout: Layout,
    pub(super) volume_bytes: u64,
    pub(super) pattern: &'static str,
    pub(super) req_bytes: usize,
    pub(super) flush_every: u64,
    pub(super) host_bytes: u64,
    /// Drive bytes per host byte, by region (see [`Region`]).
    per_host: [f64; REGIONS],
}

impl AmpRow {
    pub(super) fn meta(&self) -> f64 {
        self.per_host[Region::Meta as usize]
    }
    pub(super) fn intent(&self) -> f64 {
        self.per_host[Region::Intent as usize]
    }
    pub(super) fn journal(&self) -> f64 {
        self.per_host[Region::Journal as usize]
    }
    pub(super) fn checksums(&self) -> f64 {
        self.per_host[Region::Checksums as usize]
    }
    pub(super) fn data(&self) -> f64 {
        self.per_host[Region::Data as usize]
    }
    pub(super) fn total(&self) -> f64 {
        self.per_host.iter().sum()
    }
}

/// What to measure.
#[derive(Clone, Debug)]
pub(super) struct AmpPlan {
    pub(super) layouts: Vec<Layout>,
    pub(super) volume_bytes: Vec<u64>,
    pub(super) chunk_bytes: u64,
    pub(super) flush_every: Vec<u64>,
    pub(super) random_writes: u64,
    pub(super) seq_bytes: usize,
    pub(super) seq_writes: u64,
}

/// Measures every (layout, volume size, pattern, flush interval) of `plan`.
pub(super) async fn measure(plan: &AmpPlan) -> Result<Vec<AmpRow>> {
    let mut rows = Vec::new();
    for &layout in &plan.layouts {
        for &volume_bytes in &plan.volume_bytes {
            // A fresh pool per volume size; patterns and intervals run one after the other on it
            // (each starts from a flushed state, so nothing carries over).
            let vut = build_volume(layout, volume_bytes, plan.chunk_bytes, tapped_memory).await?;
            let patterns =
                [("rand", 4096usize, plan.random_writes), ("seq", plan.seq_bytes, plan.seq_writes)];
            for (pattern, req_bytes, writes) in patterns {
                let payloads = Payloads::new(req_bytes, 16, 7);
                for &flush_every in &plan.flush_every {
                    let per_host = run_pattern(&vut, pattern, req_bytes, writes, flush_every, &payloads)
                        .await
                        .with_context(|| format!("{layout} {pattern} writes, flush every {flush_every}"))?;
                    rows.push(AmpRow {
                        layout,
                        volume_bytes: vut.vol.size_bytes(),
                        pattern,
                        req_bytes,
                        flush_every,
                        host_bytes: writes * req_bytes as u64,
                        per_host,
                    });
                }
            }
        }
    }
    Ok(rows)
}

fn tallies(vut: &VolumeUnderTest<Tap<MemDevice>>) -> [u64; REGIONS] {
    let mut out = [0; REGIONS];
    for d in vut.pool.drives().iter() {
        for (o, r) in out.iter_mut().zip(d.device().regions().snapshot()) {
            *o += r.write_bytes;
        }
    }
    out
}

/// Issues `writes` writes (one at a time) with a volume flush after every `flush_every`, and a
/// final one; returns drive bytes per host byte by region.
async fn run_pattern(
    vut: &VolumeUnderTest<Tap<MemDevice>>,
    pattern: &str,
    req_bytes: usize,
    writes: u64,
    flush_every: u64,
    payloads: &Payloads,
) -> Result<[f64; REGIONS]> {
    let slots = vut.vol.size_bytes() / req_bytes as u64;
    vut.vol.flush().await?;
    let before = tallies(vut);
    let mut rng = Rng::new(flush_every ^ req_bytes as u64);
    let mut next_seq = rng.below(slots);
    for i in 1..=writes {
        let slot = if pattern == "rand" {
            rng.below(slots)
        } else {
            next_seq = (next_seq + 1) % slots;
            next_seq
        };
        let data = payloads.pick(&mut rng);
        vut.vol.write(slot * req_bytes as u64, data, false).await?;
        if i % flush_every == 0 {
            vut.vol.flush().await?;
        }
    }
    vut.vol.flush().await?;
    let after = tallies(vut);
    let host = (writes * req_bytes as u64) as f64;
    Ok(std::array::from_fn(|r| (after[r] - before[r]) as f64 / host))
}
