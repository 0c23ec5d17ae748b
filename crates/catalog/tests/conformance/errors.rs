//! Contract, "Errors", by kind (front ends choose their answer by `VolumeError::kind`):
//! `ReadOnly` for every change to a snapshot (and a flush that succeeds), `Closed` for a handle
//! kept across the volume's delete, `NoSpace` for a thin log-structured volume whose space is
//! full, after which every acknowledged write still reads back, the failed write left each
//! block old or new, and zeroing and discards (which need no new space) still work.
//! (`OutOfRange` is `ranges.rs`, `NotCheap` is `zeroing.rs`.)

use stria_dev::{BLOCK_BYTES, IoBytes};
use stria_engine::{Durability, ErrorKind, Zeroing};

use super::{Kind, Model, Subject, Wrap, every_kind, expect_kind};
use crate::common::{Rig, create_req, random_bytes, rng};

pub async fn read_only(kind: Kind, wrap: Wrap) {
    let s = Subject::new(kind, 71, wrap).await;
    let v = &s.vol;
    for (o, l) in [(0, BLOCK_BYTES), (s.zero_unit, s.zero_unit), (5, 3), (0, s.size())] {
        let data = IoBytes::copy_from(&vec![0x5A; l as usize]);
        for d in [Durability::Buffered, Durability::Fua] {
            let w = v.write(o, data.clone(), d).await;
            let z = v.write_zeroes(o, l, Zeroing::ANY, d).await;
            let t = v.discard(o, l, d).await;
            if kind.read_only() {
                let what = format!("{kind:?}: a change at {o} +{l}");
                expect_kind(w, ErrorKind::ReadOnly, &what);
                expect_kind(z, ErrorKind::ReadOnly, &what);
                expect_kind(t, ErrorKind::ReadOnly, &what);
            } else {
                w.and(z).and(t).unwrap_or_else(|e| panic!("{kind:?}: a change at {o} +{l}: {e}"));
            }
        }
    }
    v.flush().await.unwrap_or_else(|e| panic!("{kind:?}: flush: {e}"));
    if kind.read_only() {
        s.check_all("after the refused changes").await;
    }
}

pub async fn closed(kind: Kind, wrap: Wrap) {
    let mut s = Subject::new(kind, 81, wrap).await;
    if !kind.read_only() {
        s.write(100, vec![1; 5000], Durability::Fua).await;
    }
    let held = std::sync::Arc::clone(&s.vol);
    match kind {
        Kind::Snapshot => {
            drop(s.rig.catalog.snapshot_delete("base", "snap").await.expect("delete the snapshot"))
        }
        _ => s.rig.catalog.delete(&s.name).await.expect("delete"),
    }
    assert!(s.rig.catalog.lookup(&s.name).is_none(), "{kind:?}: a deleted volume is not looked up");
    let what = format!("{kind:?}: a handle kept across the delete");
    expect_kind(held.read(0, 4096).await, ErrorKind::Closed, &format!("{what}: read"));
    if !kind.read_only() {
        let data = IoBytes::copy_from(&[7u8; 4096]);
        expect_kind(held.write(0, data, Durability::Fua).await, ErrorKind::Closed, &format!("{what}: write"));
        expect_kind(
            held.write_zeroes(0, 4096, Zeroing::ANY, Durability::Fua).await,
            ErrorKind::Closed,
            &format!("{what}: zeroing"),
        );
    }
}

/// The segment space of the thin volume: the least the tier takes (6 segments) and a little.
const SPACE_BYTES: u64 = 4 << 20;

/// Fills a thin volume of `layout` (a clone of one, for `clone`) until a write fails with
/// `NoSpace`.
async fn no_space(layout: &str, clone: bool) {
    let rig = Rig::new(91).await;
    let size = 16 << 20;
    let req =
        stria_catalog::CreateVolume { space_bytes: Some(SPACE_BYTES), ..create_req("thin", size, layout) };
    rig.catalog.create(req).await.expect("create a thin volume");
    let name = if clone {
        rig.catalog.snapshot_create("thin", "s").await.expect("snapshot");
        rig.catalog.volume_clone("thin@s", "c").await.expect("clone");
        "c"
    } else {
        "thin"
    };
    let v = rig.volume(name);
    let mut model = Model::zeros(size);
    let mut r = rng(91);
    let chunk = 256 << 10;
    let mut full = None;
    for at in (0..size).step_by(chunk as usize) {
        let data = random_bytes(&mut r, chunk as usize);
        // A full volume answers; it does not wait for space that will not come.
        let write = v.write(at, IoBytes::copy_from(&data), Durability::Buffered);
        let res = tokio::time::timeout(std::time::Duration::from_secs(60), write).await;
        match res.unwrap_or_else(|_| panic!("{layout}: a write at {at} neither completed nor failed in 60 s"))
        {
            Ok(()) => model.write(at, &data),
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::NoSpace, "{layout}: a write to a full thin volume: {e}");
                full = Some((at, data));
                break;
            }
        }
    }
    let (at, data) =
        full.unwrap_or_else(|| panic!("{layout}: {size} bytes written into {SPACE_BYTES} bytes of space"));
    // The failed write left each block old or new; everything acknowledged reads back.
    let got = v.read(0, size as usize).await.expect("read after NoSpace");
    for (i, block) in got.chunks(BLOCK_BYTES as usize).enumerate() {
        let o = i as u64 * BLOCK_BYTES;
        let new_ok = (at..at + chunk).contains(&o)
            && block == &data[(o - at) as usize..(o - at + BLOCK_BYTES) as usize];
        assert!(new_ok || model.check(o, block).is_ok(), "{layout}: block {i} after the failed write");
    }
    // Zeroing and discards need no new space.
    v.write_zeroes(0, chunk, Zeroing::ANY, Durability::Fua).await.expect("zeroing a full volume");
    model.zero(0, chunk);
    v.discard(chunk, chunk, Durability::Fua).await.expect("discarding in a full volume");
    model.discard(chunk, chunk);
    let got = v.read(0, at as usize).await.expect("read");
    model.check(0, &got).unwrap_or_else(|m| panic!("{layout}: after zeroing a full volume: {m}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_space_tiered() {
    no_space("tiered:ec:4+2", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_space_log() {
    no_space("log:ec:4+2", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_space_clone() {
    no_space("tiered:ec:4+2", true).await;
}

mod read_only {
    super::every_kind!(super::read_only);
}
mod closed {
    super::every_kind!(super::closed);
}

/// A log-structured volume with the default space (1.5 x its size: not over-committed) and a
/// 1 MiB write cache, written whole, discarded whole and written whole again, a few times. Its
/// live data never exceeds its size, so no write may fail, and a space condition is never
/// `Unrecoverable`.
///
/// Finding (issue 36 conformance work): the rewrite fails at once on `log:`, after some rounds
/// on `tiered:`, with `Unrecoverable` ("the write cache is full and cannot be emptied: ...
/// destage: the segment space is full: 2 of 10 segments free, 2 reserved for GC, 1000 KiB of
/// garbage to collect"): destage gives up while GC could still reclaim the garbage, and the
/// error claims data loss for a space condition. Ignored until the tier is fixed; run with
/// `--ignored`.
async fn trim_then_rewrite(layout: &str, rounds: usize) {
    let rig = Rig::new(111).await;
    let size = super::SIZE_BYTES;
    rig.catalog.create(create_req("v", size, layout)).await.expect("create");
    let v = rig.volume("v");
    let mut r = rng(111);
    for round in 0..rounds {
        let data = random_bytes(&mut r, size as usize);
        v.write(0, IoBytes::copy_from(&data), Durability::Buffered).await.unwrap_or_else(|e| {
            panic!("{layout}: round {round}: rewrite after a discard: {e} ({:?})", e.kind())
        });
        let got = v.read(0, size as usize).await.expect("read");
        assert!(got[..] == data[..], "{layout}: round {round}: the volume reads back what was written");
        v.discard(0, size, Durability::Buffered).await.expect("discard");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "finding: a trimmed log volume refuses a rewrite with Unrecoverable (see trim_then_rewrite)"]
async fn trim_then_rewrite_log() {
    trim_then_rewrite("log:ec:4+2", 64).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "finding: a trimmed log volume refuses a rewrite with Unrecoverable (see trim_then_rewrite)"]
async fn trim_then_rewrite_tiered() {
    trim_then_rewrite("tiered:ec:4+2", 64).await;
}
