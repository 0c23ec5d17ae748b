//! Seeded random operations checked against the byte model: every read equals the model
//! (contract: "Reads", "Zeroing", "Discard"), block status agrees with it, `CheapOnly` zeroing is
//! refused exactly where the contract says and then changes nothing, and on a read-only kind
//! every change is refused with `ReadOnly` and changes nothing.
//!
//! `STRIA_CONFORMANCE_SEEDS=N` runs N seeds per kind (default 1), `STRIA_CONFORMANCE_SEED=S`
//! replays one; `STRIA_CONFORMANCE_OPS` sets the operations per seed (default 300).

use rand::Rng;
use rand_chacha::ChaCha8Rng;
use stria_dev::{BLOCK_BYTES, IoBytes};
use stria_engine::{Dealloc, Durability, ErrorKind, ZeroCost, Zeroing};

use super::{Kind, Subject, Wrap, block_status::check_extents, every_kind, expect_kind};
use crate::common::{random_bytes, rng, seeds};

fn ops_per_seed() -> usize {
    std::env::var("STRIA_CONFORMANCE_OPS")
        .map_or(300, |s| s.parse().expect("STRIA_CONFORMANCE_OPS is a number"))
}

/// A range biased towards the edges that matter: block and unit boundaries, the ends of the
/// volume, single bytes, whole units.
pub fn pick_range(r: &mut ChaCha8Rng, size: u64, unit: u64, max_len: u64) -> (u64, u64) {
    let (offset, len) = match r.random_range(0..6) {
        0 => {
            let b = r.random_range(0..size / BLOCK_BYTES);
            (b * BLOCK_BYTES, BLOCK_BYTES * r.random_range(1..=8))
        }
        1 => {
            let u = r.random_range(0..size.div_ceil(unit));
            (u * unit, unit * r.random_range(1..=2))
        }
        2 => {
            let o = r.random_range(0..size);
            (o, r.random_range(1..=max_len))
        }
        3 => {
            // Around a block or unit boundary.
            let step = if r.random_bool(0.5) { BLOCK_BYTES } else { unit };
            let boundary = r.random_range(1..size.div_ceil(step)) * step;
            let o = boundary.saturating_sub(r.random_range(0..=BLOCK_BYTES + 1)).min(size - 1);
            (o, r.random_range(1..=2 * BLOCK_BYTES + 2))
        }
        4 => {
            // At the end of the volume.
            let len = r.random_range(1..=max_len.min(size));
            (size - len, len)
        }
        _ => (r.random_range(0..size), r.random_range(1..=16)),
    };
    let len = len.min(size - offset).min(max_len).max(1);
    (offset, len)
}

pub async fn clause(kind: Kind, wrap: Wrap) {
    for seed in seeds(1) {
        run_seed(kind, wrap, seed).await;
    }
}

async fn run_seed(kind: Kind, wrap: Wrap, seed: u64) {
    let mut s = Subject::new(kind, seed, wrap).await;
    let mut r = rng(seed);
    let size = s.size();
    let unit = s.zero_unit;
    let mut history: Vec<String> = Vec::new();
    let ops = ops_per_seed();
    for step in 0..ops {
        let (o, l) = pick_range(&mut r, size, unit, 3 * unit.max(64 << 10));
        let choice = r.random_range(0..100);
        let durability = if r.random_bool(0.3) { Durability::Fua } else { Durability::Buffered };
        let op = match choice {
            0..40 => format!("write {o} +{l} {durability:?}"),
            40..65 => format!("read {o} +{l}"),
            65..75 => format!("zero {o} +{l}"),
            75..82 => format!("cheap zero {o} +{l}"),
            82..88 => format!("discard {o} +{l}"),
            88..93 => "flush".to_string(),
            _ => format!("block_status {o} +{l}"),
        };
        history.push(op.clone());
        let what = format!("seed {seed} step {step} ({op}); last ops: {:?}", tail(&history));
        match choice {
            0..40 => {
                let data = random_bytes(&mut r, l as usize);
                let res = s.vol.write(o, IoBytes::copy_from(&data), durability).await;
                if kind.read_only() {
                    expect_kind(res, ErrorKind::ReadOnly, &what);
                } else {
                    res.unwrap_or_else(|e| panic!("{kind:?} {what}: {e}"));
                    s.model.write(o, &data);
                }
            }
            40..65 => {
                let got = s.vol.read(o, l as usize).await.unwrap_or_else(|e| panic!("{kind:?} {what}: {e}"));
                assert_eq!(got.len() as u64, l, "{kind:?} {what}: length");
                if let Err(m) = s.model.check(o, &got) {
                    panic!("{kind:?} {what}: {m}");
                }
            }
            65..75 => {
                let dealloc = if r.random_bool(0.5) { Dealloc::Allowed } else { Dealloc::Forbidden };
                let zeroing = Zeroing { dealloc, cost: ZeroCost::Any };
                let res = s.vol.write_zeroes(o, l, zeroing, durability).await;
                if kind.read_only() {
                    expect_kind(res, ErrorKind::ReadOnly, &what);
                } else {
                    res.unwrap_or_else(|e| panic!("{kind:?} {what}: {e}"));
                    s.model.zero(o, l);
                }
            }
            75..82 => {
                let zeroing = Zeroing { dealloc: Dealloc::Allowed, cost: ZeroCost::CheapOnly };
                let res = s.vol.write_zeroes(o, l, zeroing, durability).await;
                if kind.read_only() {
                    expect_kind(res, ErrorKind::ReadOnly, &what);
                } else if s.zeroing_has_edge(o, l) {
                    expect_kind(res, ErrorKind::NotCheap, &what);
                    s.check_range(o, l, &format!("refused {what}")).await;
                } else {
                    res.unwrap_or_else(|e| panic!("{kind:?} {what}: {e}"));
                    s.model.zero(o, l);
                }
            }
            82..88 => {
                let res = s.vol.discard(o, l, durability).await;
                if kind.read_only() {
                    expect_kind(res, ErrorKind::ReadOnly, &what);
                } else {
                    res.unwrap_or_else(|e| panic!("{kind:?} {what}: {e}"));
                    s.model.discard(o, l);
                }
            }
            88..93 => s.vol.flush().await.unwrap_or_else(|e| panic!("{kind:?} {what}: {e}")),
            _ => {
                let extents =
                    s.vol.block_status(o, l).await.unwrap_or_else(|e| panic!("{kind:?} {what}: {e}"));
                check_extents(&s, o, l, &extents, &what);
            }
        }
        if step % 50 == 49 {
            s.check_all(&format!("seed {seed} after step {step}; last ops: {:?}", tail(&history))).await;
        }
    }
    s.check_all(&format!("seed {seed} at the end")).await;
}

fn tail(history: &[String]) -> &[String] {
    &history[history.len().saturating_sub(12)..]
}

every_kind!(clause);
