//! Contract, "Zeroing" and "Discard": zeroing leaves the range reading as zeros, whatever its
//! alignment and whatever `Dealloc` says; `CheapOnly` fails with `NotCheap` before changing
//! anything when the range has an edge that is not a whole unit (a block, an ec row), and
//! succeeds on whole units. A discard leaves each byte reading as before or as zero, and the
//! bytes around it untouched.

use rand::Rng;
use stria_dev::BLOCK_BYTES;
use stria_engine::{Dealloc, Durability, ErrorKind, ZeroCost, Zeroing};

use super::{Kind, Subject, Wrap, every_kind, expect_kind};
use crate::common::{random_bytes, rng};

const CHEAP: Zeroing = Zeroing { dealloc: Dealloc::Allowed, cost: ZeroCost::CheapOnly };

/// Fills the whole volume with random data (so zeros are visible) and returns the subject.
async fn filled(kind: Kind, seed: u64, wrap: Wrap) -> Subject {
    let mut s = Subject::new(kind, seed, wrap).await;
    if !kind.read_only() {
        let data = random_bytes(&mut rng(seed), s.size() as usize);
        s.write(0, data, Durability::Buffered).await;
    }
    s
}

/// The ranges zeroed and discarded: whole units, unaligned spans over units, inside one block,
/// the ends of the volume, the whole volume last.
fn ranges(s: &Subject) -> Vec<(u64, u64)> {
    let (size, unit, b) = (s.size(), s.zero_unit, BLOCK_BYTES);
    vec![
        (unit, unit),
        (2 * unit, 2 * unit),
        (unit + 1, unit),
        (3 * unit - 5, 10),
        (b + 100, 200),
        (5 * b, 3 * b),
        (0, 1),
        (size - 1, 1),
        (size - unit - 3, unit + 3),
        (size - 2 * b, 2 * b),
        (0, size),
    ]
}

/// `[offset, offset + len)` and a block on either side, inside the volume.
fn around(s: &Subject, offset: u64, len: u64) -> (u64, u64) {
    (offset.saturating_sub(BLOCK_BYTES), (offset + len + BLOCK_BYTES).min(s.size()))
}

pub async fn zeroing(kind: Kind, wrap: Wrap) {
    let mut s = filled(kind, 51, wrap).await;
    let mut r = rng(51);
    for (o, l) in ranges(&s) {
        let what = format!("zeroing {o} +{l}");
        // Fast zeroing first: refused, changing nothing, where the range has an edge.
        let res = s.vol.write_zeroes(o, l, CHEAP, Durability::Buffered).await;
        if kind.read_only() {
            expect_kind(res, ErrorKind::ReadOnly, &what);
            s.check_range(o, l, &what).await;
            continue;
        }
        if s.zeroing_has_edge(o, l) {
            expect_kind(res, ErrorKind::NotCheap, &format!("CheapOnly {what} (unit {})", s.zero_unit));
            let (lo, hi) = around(&s, o, l);
            s.check_range(lo, hi - lo, &format!("refused {what}")).await;
            let dealloc = if r.random_bool(0.5) { Dealloc::Allowed } else { Dealloc::Forbidden };
            let durability = if r.random_bool(0.5) { Durability::Fua } else { Durability::Buffered };
            s.vol
                .write_zeroes(o, l, Zeroing { dealloc, cost: ZeroCost::Any }, durability)
                .await
                .unwrap_or_else(|e| panic!("{kind:?} {what}: {e}"));
        } else {
            res.unwrap_or_else(|e| panic!("{kind:?}: CheapOnly {what} on whole units: {e}"));
        }
        s.model.zero(o, l);
        // The range and a block on either side (untouched).
        let (lo, hi) = around(&s, o, l);
        s.check_range(lo, hi - lo, &what).await;
        // Refill for the next range.
        let data = random_bytes(&mut r, l as usize);
        s.write(o, data, Durability::Buffered).await;
    }
    s.check_all("after zeroing").await;
}

pub async fn discard(kind: Kind, wrap: Wrap) {
    let mut s = filled(kind, 61, wrap).await;
    let mut r = rng(61);
    for (o, l) in ranges(&s) {
        let what = format!("discard {o} +{l}");
        let durability = if r.random_bool(0.5) { Durability::Fua } else { Durability::Buffered };
        let res = s.vol.discard(o, l, durability).await;
        if kind.read_only() {
            expect_kind(res, ErrorKind::ReadOnly, &what);
        } else {
            res.unwrap_or_else(|e| panic!("{kind:?} {what}: {e}"));
            s.model.discard(o, l);
        }
        let (lo, hi) = around(&s, o, l);
        s.check_range(lo, hi - lo, &what).await;
        if !kind.read_only() {
            let data = random_bytes(&mut r, l as usize);
            s.write(o, data, Durability::Buffered).await;
        }
    }
    s.check_all("after discards").await;
}

mod zero {
    super::every_kind!(super::zeroing);
}
mod discards {
    super::every_kind!(super::discard);
}
