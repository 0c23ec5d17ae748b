//! Contract, `block_status`: coalesced extents covering exactly the range; `unallocated` only
//! where the range reads as zeros ("allocated" when in doubt); and ("Zeroing") whole units that
//! were zeroed report unallocated.

use stria_dev::BLOCK_BYTES;
use stria_engine::{Durability, Extent, Zeroing};

use super::{Kind, Subject, Wrap, every_kind};
use crate::common::{random_bytes, rng};

/// Checks `extents`, the status of `[offset, offset + len)`, against the contract and the model.
pub fn check_extents(s: &Subject, offset: u64, len: u64, extents: &[Extent], what: &str) {
    let kind = s.kind;
    let total: u64 = extents.iter().map(|e| e.len_bytes).sum();
    assert_eq!(total, len, "{kind:?} {what}: extents {extents:?} cover exactly the range");
    assert!(extents.iter().all(|e| e.len_bytes > 0), "{kind:?} {what}: an empty extent in {extents:?}");
    assert!(
        extents.windows(2).all(|w| w[0].unallocated != w[1].unallocated),
        "{kind:?} {what}: extents {extents:?} are not coalesced"
    );
    let mut at = offset;
    for e in extents {
        if e.unallocated {
            assert!(
                s.model.reads_zero(at, e.len_bytes),
                "{kind:?} {what}: [{at}, +{}) reported unallocated, but the model holds data there",
                e.len_bytes
            );
        }
        at += e.len_bytes;
    }
}

/// Whether `[offset, offset + len)` is reported unallocated as a whole.
async fn reported_unallocated(s: &Subject, offset: u64, len: u64) -> bool {
    let extents = s.vol.block_status(offset, len).await.expect("block status");
    check_extents(s, offset, len, &extents, "status");
    extents.iter().all(|e| e.unallocated)
}

pub async fn clause(kind: Kind, wrap: Wrap) {
    let mut s = Subject::new(kind, 21, wrap).await;
    let mut r = rng(21);
    let size = s.size();
    let unit = s.zero_unit;

    // The whole volume, single blocks, single bytes, unaligned spans across units.
    let mut ranges = vec![(0, size), (0, 1), (size - 1, 1), (size - BLOCK_BYTES, BLOCK_BYTES), (unit - 1, 2)];
    for _ in 0..40 {
        ranges.push(super::model_ops::pick_range(&mut r, size, unit, 4 * unit));
    }
    for &(o, l) in &ranges {
        let extents =
            s.vol.block_status(o, l).await.unwrap_or_else(|e| panic!("{kind:?}: status {o} +{l}: {e}"));
        check_extents(&s, o, l, &extents, &format!("status {o} +{l}"));
    }
    if !kind.reports_holes() {
        return;
    }

    // Whole units zeroed (or written, then zeroed) report unallocated; so does a whole-unit
    // zeroing inside a larger, unaligned one.
    let first = unit;
    let data = random_bytes(&mut r, (3 * unit) as usize);
    s.write(first, data, Durability::Buffered).await;
    assert!(!reported_unallocated(&s, first, unit).await, "{kind:?}: written data reported unallocated");
    s.vol.write_zeroes(first, 2 * unit, Zeroing::ANY, Durability::Buffered).await.expect("zeroing");
    s.model.zero(first, 2 * unit);
    assert!(
        reported_unallocated(&s, first, 2 * unit).await,
        "{kind:?}: two whole zeroed units of {unit} bytes at {first} report allocated"
    );
    let third = first + 2 * unit;
    s.vol.write_zeroes(third - 100, unit + 200, Zeroing::ANY, Durability::Fua).await.expect("zeroing");
    s.model.zero(third - 100, unit + 200);
    assert!(
        reported_unallocated(&s, third, unit).await,
        "{kind:?}: the whole unit inside an unaligned zeroing reports allocated"
    );
    s.check_all("after zeroing").await;
    for &(o, l) in &ranges {
        let extents = s.vol.block_status(o, l).await.expect("status");
        check_extents(&s, o, l, &extents, &format!("status {o} +{l} after zeroing"));
    }
}

every_kind!(clause);
