//! Contract, "Unaligned writes": any alignment is taken, edge blocks are read, merged and
//! rewritten without touching the bytes around them, and writes to *disjoint* byte ranges never
//! undo each other, even inside one block, even from concurrent tasks.

use std::sync::Arc;

use rand::Rng;
use rand::seq::SliceRandom;
use stria_dev::{BLOCK_BYTES, IoBytes};
use stria_engine::{BlockVolume, Durability, ErrorKind};

use super::{Kind, Subject, Wrap, every_kind, expect_kind};
use crate::common::{random_bytes, rng};

/// Unaligned writes at every edge: the first and last bytes of the volume, of a block, of a unit
/// (chunk row on ec), across them, single bytes, a byte short of and past a block.
pub async fn edges(kind: Kind, wrap: Wrap) {
    let mut s = Subject::new(kind, 31, wrap).await;
    let mut r = rng(31);
    let size = s.size();
    let unit = s.zero_unit.max(64 << 10);
    let b = BLOCK_BYTES;
    let starts =
        [0, 1, b - 1, b, b + 1, unit - 1, unit, unit + 1, unit + b / 2, size - b - 1, size - b, size - 1];
    let lens = [1, 7, b - 1, b, b + 1, 2 * b - 1, 2 * b + 3, unit + 3];
    for &o in &starts {
        for &l in &lens {
            let l = l.min(size - o);
            let data = random_bytes(&mut r, l as usize);
            let durability = if r.random_bool(0.5) { Durability::Fua } else { Durability::Buffered };
            let what = format!("unaligned write at {o} +{l}");
            let res = s.vol.write(o, IoBytes::copy_from(&data), durability).await;
            if kind.read_only() {
                expect_kind(res, ErrorKind::ReadOnly, &what);
            } else {
                res.unwrap_or_else(|e| panic!("{kind:?} {what}: {e}"));
                s.model.write(o, &data);
            }
            // The write and two blocks on either side of it.
            let lo = o.saturating_sub(2 * b);
            let hi = (o + l + 2 * b).min(size);
            s.check_range(lo, hi - lo, &what).await;
            // Reads at the same unaligned edges.
            let got = s.vol.read(o, l as usize).await.expect("read");
            s.model.check(o, &got).unwrap_or_else(|m| panic!("{kind:?} {what}, read back unaligned: {m}"));
        }
    }
    s.check_all("after the edge writes").await;
}

/// Disjoint byte ranges of one block (and of two blocks across a unit boundary), written by
/// concurrent tasks, all land.
pub async fn concurrent_disjoint(kind: Kind, wrap: Wrap) {
    let mut s = Subject::new(kind, 41, wrap).await;
    if kind.read_only() {
        return;
    }
    let mut r = rng(41);
    let size = s.size();
    let unit = s.zero_unit.max(64 << 10);
    for round in 0..24 {
        // A block, or two blocks straddling a unit boundary, or the last block.
        let (start, span) = match round % 3 {
            0 => (r.random_range(0..size / BLOCK_BYTES) * BLOCK_BYTES, BLOCK_BYTES),
            1 => (unit - BLOCK_BYTES, 2 * BLOCK_BYTES),
            _ => (size - BLOCK_BYTES, BLOCK_BYTES),
        };
        let tasks = r.random_range(2..=12);
        // Cut points split [start, start + span) into `tasks` disjoint ranges.
        let mut cuts: Vec<u64> = (0..tasks - 1).map(|_| r.random_range(1..span)).collect();
        cuts.extend([0, span]);
        cuts.sort_unstable();
        cuts.dedup();
        let mut pieces: Vec<(u64, Vec<u8>)> =
            cuts.windows(2).map(|w| (start + w[0], random_bytes(&mut r, (w[1] - w[0]) as usize))).collect();
        pieces.shuffle(&mut r);
        let handles: Vec<_> = pieces
            .iter()
            .map(|(o, data)| {
                let vol: Arc<dyn BlockVolume> = Arc::clone(&s.vol);
                let (o, data) = (*o, IoBytes::copy_from(data));
                tokio::spawn(async move { vol.write(o, data, Durability::Buffered).await })
            })
            .collect();
        for h in handles {
            h.await.expect("writer task").unwrap_or_else(|e| panic!("{kind:?}: concurrent write: {e}"));
        }
        for (o, data) in &pieces {
            s.model.write(*o, data);
        }
        s.check_range(
            start,
            span,
            &format!("round {round}: {} concurrent disjoint writes at {start}", pieces.len()),
        )
        .await;
    }
    s.check_all("after the concurrent writes").await;
}

mod edges {
    super::every_kind!(super::edges);
}
mod concurrent_disjoint {
    super::every_kind!(super::concurrent_disjoint);
}
