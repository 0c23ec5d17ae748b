//! Contract, "Compare and write": the range is written only when it holds the compare buffer,
//! a mismatch is `Miscompare` naming the first differing byte and changes nothing, requests of
//! the wrong shape are `InvalidInput` and out of range `OutOfRange` on every kind, a snapshot
//! refuses with `ReadOnly` and a deleted volume with `Closed`; and it is atomic against every
//! other write to its range: compare and writes used as a counter never lose an increment, and
//! writes beside them in the same block and stripe are never undone. (Durability is in
//! `durability.rs`.)

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use stria_dev::{BLOCK_BYTES, FaultConfig, IoBytes};
use stria_engine::{
    BlockVolume, COMPARE_AND_WRITE_ALIGN_BYTES, COMPARE_AND_WRITE_MAX_BYTES, Durability, ErrorKind,
    VolumeError,
};
use tokio::sync::Barrier;

use super::{Kind, Subject, Wrap, every_kind, expect_kind};
use crate::common::{random_bytes, rng};

const SECTOR: u64 = COMPARE_AND_WRITE_ALIGN_BYTES;
const MAX: u64 = COMPARE_AND_WRITE_MAX_BYTES;

async fn cas(
    v: &dyn BlockVolume,
    offset: u64,
    compare: &[u8],
    write: &[u8],
    d: Durability,
) -> Result<(), VolumeError> {
    v.compare_and_write(offset, IoBytes::copy_from(compare), IoBytes::copy_from(write), d).await
}

/// Ranges at the edges that matter: sectors inside a block, across a block, a unit (chunk row)
/// and a stripe boundary, the last block and sector of the volume, the longest request.
fn ranges(s: &Subject) -> Vec<(u64, u64)> {
    let size = s.size();
    let unit = s.zero_unit.max(64 << 10);
    let b = BLOCK_BYTES;
    vec![
        (0, SECTOR),
        (SECTOR, SECTOR),
        (b - SECTOR, 2 * SECTOR),
        (b, b),
        (3 * b + SECTOR, 3 * b),
        (unit - b, 2 * b),
        (unit - SECTOR, 2 * SECTOR + b),
        (s.zero_unit, s.zero_unit.min(MAX)),
        (size - b, b),
        (size - SECTOR, SECTOR),
        (0, MAX),
        (size - MAX - SECTOR, MAX),
    ]
}

/// A matching compare writes (read back, and nothing around it changes); a mismatch at the
/// first, a middle or the last byte is `Miscompare` naming that byte, and writes nothing.
pub async fn matches_and_misses(kind: Kind, wrap: Wrap) {
    let mut s = Subject::new(kind, 131, wrap).await;
    let mut r = rng(131);
    let size = s.size();
    for (i, (o, l)) in ranges(&s).into_iter().enumerate() {
        let d = if i % 2 == 0 { Durability::Fua } else { Durability::Buffered };
        let what = format!("{kind:?}: compare and write at {o} +{l} ({d:?})");
        let current = s.vol.read(o, l as usize).await.unwrap_or_else(|e| panic!("{what}: read: {e}"));
        s.model.check(o, &current).unwrap_or_else(|m| panic!("{what}: before: {m}"));
        let new = random_bytes(&mut r, l as usize);
        if kind.read_only() {
            expect_kind(cas(&*s.vol, o, &current, &new, d).await, ErrorKind::ReadOnly, &what);
            continue;
        }
        // Mismatches: the byte named is the first that differs, not any later one.
        for at in [0, l / 2 + 3, l - 1] {
            let mut wrong = current.to_vec();
            wrong[at as usize] ^= 0x5A;
            if at + 7 < l {
                wrong[(at + 7) as usize] ^= 0xA5;
            }
            match cas(&*s.vol, o, &wrong, &new, d).await {
                Err(VolumeError::Miscompare { offset_bytes, len_bytes, miscompare_offset_bytes, .. }) => {
                    assert_eq!(
                        (offset_bytes, len_bytes, miscompare_offset_bytes),
                        (o, l, at),
                        "{what}: the miscompare names the request and its first differing byte"
                    );
                }
                other => panic!("{what}: compare differing at byte {at}: {other:?}, expected a miscompare"),
            }
            let lo = o.saturating_sub(2 * BLOCK_BYTES);
            let hi = (o + l + 2 * BLOCK_BYTES).min(size);
            s.check_range(lo, hi - lo, &format!("{what}: after a miscompare at byte {at}")).await;
        }
        // A match writes, and a second one compares with what the first wrote.
        cas(&*s.vol, o, &current, &new, d).await.unwrap_or_else(|e| panic!("{what}: matching: {e}"));
        s.model.write(o, &new);
        let newer = random_bytes(&mut r, l as usize);
        expect_kind(
            cas(&*s.vol, o, &current, &newer, d).await,
            ErrorKind::Miscompare,
            &format!("{what}: stale"),
        );
        cas(&*s.vol, o, &new, &newer, d).await.unwrap_or_else(|e| panic!("{what}: chained: {e}"));
        s.model.write(o, &newer);
        let lo = o.saturating_sub(2 * BLOCK_BYTES);
        let hi = (o + l + 2 * BLOCK_BYTES).min(size);
        s.check_range(lo, hi - lo, &format!("{what}: after two matching ones")).await;
    }
    s.check_all("after the compare and writes").await;
}

/// Requests of the wrong shape are `InvalidInput` on every kind (checked before the range),
/// requests past the end `OutOfRange` (before read-only), an empty one in range succeeds (a
/// snapshot refuses it as a change), and a handle kept across the volume's delete is `Closed`.
/// None of them changes anything.
pub async fn refusals(kind: Kind, wrap: Wrap) {
    let s = Subject::new(kind, 141, wrap).await;
    let v = &*s.vol;
    let size = s.size();
    let d = Durability::Fua;
    // Any bytes: the shape is refused before anything is compared.
    let bytes = |n: u64| vec![0x3C; n as usize];
    let shapes: [(u64, u64, u64, &str); 7] = [
        (1, SECTOR, SECTOR, "an offset inside a sector"),
        (100, BLOCK_BYTES, BLOCK_BYTES, "an offset inside a sector"),
        (0, 1000, 1000, "a length of part of a sector"),
        (BLOCK_BYTES, SECTOR + 1, SECTOR + 1, "a length of part of a sector"),
        (0, SECTOR, 2 * SECTOR, "buffers of different lengths"),
        (0, 0, SECTOR, "buffers of different lengths"),
        (0, MAX + SECTOR, MAX + SECTOR, "longer than the longest"),
    ];
    for (o, lc, lw, why) in shapes {
        let what = format!("{kind:?}: compare and write of {lc}/{lw} bytes at {o} ({why})");
        expect_kind(cas(v, o, &bytes(lc), &bytes(lw), d).await, ErrorKind::InvalidInput, &what);
    }
    // Unaligned and past the end: the shape is refused first.
    expect_kind(
        cas(v, size + 1, &bytes(8), &bytes(8), d).await,
        ErrorKind::InvalidInput,
        "shape before range",
    );
    let past: [(u64, u64); 5] = [
        (size, SECTOR),
        (size - SECTOR, 2 * SECTOR),
        (size + BLOCK_BYTES, BLOCK_BYTES),
        (u64::MAX - (SECTOR - 1), SECTOR),
        (size + SECTOR, 0),
    ];
    for (o, l) in past {
        let what = format!("{kind:?}: compare and write at {o} +{l}");
        expect_kind(cas(v, o, &bytes(l), &bytes(l), d).await, ErrorKind::OutOfRange, &what);
    }
    for o in [0, SECTOR, size / 2, size] {
        let res = cas(v, o, &[], &[], Durability::Buffered).await;
        if kind.read_only() {
            expect_kind(res, ErrorKind::ReadOnly, &format!("{kind:?}: an empty compare and write"));
        } else {
            res.unwrap_or_else(|e| panic!("{kind:?}: an empty compare and write at {o}: {e}"));
        }
    }
    s.check_all("after the refused compare and writes").await;

    let held = Arc::clone(&s.vol);
    match kind {
        Kind::Snapshot => {
            drop(s.rig.catalog.snapshot_delete("base", "snap").await.expect("delete the snapshot"))
        }
        _ => s.rig.catalog.delete(&s.name).await.expect("delete"),
    }
    let block = bytes(BLOCK_BYTES);
    expect_kind(
        cas(&*held, 0, &block, &block, d).await,
        ErrorKind::Closed,
        &format!("{kind:?}: a compare and write through a handle kept across the delete"),
    );
}

/// Where the counter lives: the first sector of the second block of the second unit (a stripe
/// row on ec, a chunk row otherwise), so that the blocks on either side are in the same stripe.
fn counter_offset(s: &Subject) -> u64 {
    s.zero_unit.max(64 << 10) + BLOCK_BYTES
}

/// Tasks incrementing the counter, and rounds: in each, every task reads the counter, then
/// every task compares and writes the value it read plus one.
const TASKS: usize = 6;
const ROUNDS: u64 = 48;

/// One task's rounds of incrementing the counter sector at `at`: read `v`, wait for every task
/// to have read, compare and write `v + 1` (retrying in the next round on a miscompare), wait
/// for every task to have tried. Returns its successful compare and writes, or the first error
/// other than a miscompare (after going through every round's barriers, so that the other tasks
/// are not left waiting).
async fn increment(
    v: Arc<dyn BlockVolume>,
    at: u64,
    read: Arc<Barrier>,
    tried: Arc<Barrier>,
) -> Result<u64, String> {
    let mut won = 0;
    let mut failed = None;
    for round in 0..ROUNDS {
        let mut next = None;
        if failed.is_none() {
            match v.read(at, SECTOR as usize).await {
                Ok(current) => {
                    let n = u64::from_le_bytes(current[..8].try_into().expect("8 bytes"));
                    let mut new = current.to_vec();
                    new[..8].copy_from_slice(&(n + 1).to_le_bytes());
                    next = Some((current, new));
                }
                Err(e) => failed = Some(format!("round {round}: reading the counter: {e}")),
            }
        }
        // Every task read the same value: all but one compare and write must miss.
        read.wait().await;
        if let Some((current, new)) = next {
            match cas(&*v, at, &current, &new, Durability::Buffered).await {
                Ok(()) => won += 1,
                Err(e) if e.kind() == ErrorKind::Miscompare => {}
                Err(e) => failed = Some(format!("round {round}: compare and write of the counter: {e}")),
            }
        }
        tried.wait().await;
    }
    failed.map_or(Ok(won), Err)
}

/// Rounds of the writers beside the counter.
const NEIGHBOUR_ROUNDS: u64 = 40;

/// Writes, round after round, the rest of the counter's block (bytes after the counter sector:
/// an unaligned write into the block the compare and writes rewrite) and the whole blocks on
/// either side of it; each round's data is its number. Returns the last round.
async fn neighbours(v: Arc<dyn BlockVolume>, at: u64, stop: Arc<AtomicBool>) -> u64 {
    let mut round = 0;
    while round < NEIGHBOUR_ROUNDS || !stop.load(Relaxed) {
        round += 1;
        let fill = |n: u64| IoBytes::copy_from(&vec![(round % 251) as u8 + 1; n as usize]);
        let rest = BLOCK_BYTES - SECTOR;
        let (a, b, c) = (
            v.write(at + SECTOR, fill(rest), Durability::Buffered),
            v.write(at - BLOCK_BYTES, fill(BLOCK_BYTES), Durability::Buffered),
            v.write(at + BLOCK_BYTES, fill(BLOCK_BYTES), Durability::Buffered),
        );
        let (a, b, c) = tokio::join!(a, b, c);
        a.and(b).and(c).expect("a write beside the counter");
    }
    round
}

/// Compare and writes used as a counter by concurrent tasks that all try to increment the same
/// value at once, round after round, with writes into the rest of the counter's block and the
/// blocks beside it running meanwhile: exactly one task wins each round, the counter ends at the
/// number of successful compare and writes (none landed between another's compare and its
/// write), and the writes beside it are all there (none undone by a compare and write's merge).
pub async fn atomic_counter(kind: Kind, wrap: Wrap) {
    let mut s = Subject::new(kind, 151, wrap).await;
    let at = counter_offset(&s);
    if kind.read_only() {
        let current = s.vol.read(at, SECTOR as usize).await.expect("read");
        expect_kind(
            cas(&*s.vol, at, &current, &current, Durability::Fua).await,
            ErrorKind::ReadOnly,
            "counter",
        );
        return;
    }
    // Drive requests complete after a few polls: the tasks' requests interleave at every drive
    // access, as on real drives, instead of each compare and write running through at once.
    for d in &s.rig.devs {
        d.set_config(FaultConfig { completion_polls_max: 3, ..FaultConfig::default() });
    }
    let mut r = rng(151);
    let mut start = random_bytes(&mut r, SECTOR as usize);
    start[..8].copy_from_slice(&0u64.to_le_bytes());
    s.write(at, start.clone(), Durability::Buffered).await;
    let finished = Arc::new(AtomicBool::new(false));
    let side = tokio::spawn(neighbours(Arc::clone(&s.vol), at, Arc::clone(&finished)));
    let (read, tried) = (Arc::new(Barrier::new(TASKS)), Arc::new(Barrier::new(TASKS)));
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| tokio::spawn(increment(Arc::clone(&s.vol), at, Arc::clone(&read), Arc::clone(&tried))))
        .collect();
    let mut won = 0;
    for t in tasks {
        won += t.await.expect("counter task").unwrap_or_else(|e| panic!("{kind:?}: {e}"));
    }
    finished.store(true, Relaxed);
    let rounds = side.await.expect("writer task");
    let got = s.vol.read(at - BLOCK_BYTES, 3 * BLOCK_BYTES as usize).await.expect("read back");
    let counter = u64::from_le_bytes(got[BLOCK_BYTES as usize..][..8].try_into().expect("8 bytes"));
    assert_eq!(
        (won, counter),
        (ROUNDS, ROUNDS),
        "{kind:?}: (successful compare and writes, counter) after {ROUNDS} rounds of {TASKS} tasks each \
         incrementing the same value: more than one won a round, so one landed between another's compare \
         and its write"
    );
    let mut want = vec![(rounds % 251) as u8 + 1; 3 * BLOCK_BYTES as usize];
    let sector = BLOCK_BYTES as usize..(BLOCK_BYTES + SECTOR) as usize;
    want[sector.clone()].copy_from_slice(&start);
    want[sector.start..sector.start + 8].copy_from_slice(&counter.to_le_bytes());
    if let Some(i) = (0..want.len()).find(|&i| got[i] != want[i]) {
        panic!(
            "{kind:?}: byte {i} beside the counter (from {}) reads {:#04x}, the last write ({rounds} rounds) put \
             {:#04x} there: a compare and write undid a write beside it",
            at - BLOCK_BYTES,
            got[i],
            want[i]
        );
    }
    s.model.write(at - BLOCK_BYTES, &want);
    s.check_all("after the counter").await;
}

/// A writer of the rounds of `against_writes`: after every task read, it writes round `round`'s
/// data over the counter sector (a whole-block write, or an unaligned one across the block
/// before), and once every task tried, checks that the sector holds that data.
async fn overlapping_writer(
    v: Arc<dyn BlockVolume>,
    at: u64,
    read: Arc<Barrier>,
    tried: Arc<Barrier>,
    seed: u64,
) -> Result<(), String> {
    let mut r = rng(seed);
    let mut failed = None;
    for round in 0..ROUNDS {
        let (o, l) = if round % 2 == 0 { (at, BLOCK_BYTES) } else { (at - 1000, 2000) };
        let data = random_bytes(&mut r, l as usize);
        read.wait().await;
        if failed.is_none()
            && let Err(e) = v.write(o, IoBytes::copy_from(&data), Durability::Buffered).await
        {
            failed = Some(format!("round {round}: the write over the sector: {e}"));
        }
        tried.wait().await;
        if failed.is_some() {
            continue;
        }
        let want = &data[(at - o) as usize..][..SECTOR as usize];
        match v.read(at, SECTOR as usize).await {
            Ok(got) if got[..] == want[..] => {}
            Ok(_) => {
                failed = Some(format!(
                    "round {round}: the sector does not hold the write of {l} bytes at {o}, which every \
                     compare and write of the round raced: one compared before the write and wrote after it"
                ))
            }
            Err(e) => failed = Some(format!("round {round}: reading the sector: {e}")),
        }
    }
    failed.map_or(Ok(()), Err)
}

/// Compare and writes of one sector racing writes over it, round after round: in each, every
/// task reads the sector, then the tasks' compare and writes of what they read and a write of
/// new data over the sector (whole-block or unaligned) all run at once. Whichever order they
/// land in, the write's data ends in the sector: a compare and write that lands before it is
/// overwritten, and one that lands after it miscompares. Only a write landing between a compare
/// and its write leaves anything else.
pub async fn against_writes(kind: Kind, wrap: Wrap) {
    let s = Subject::new(kind, 161, wrap).await;
    if kind.read_only() {
        return; // `atomic_counter` checks the refusal.
    }
    for d in &s.rig.devs {
        d.set_config(FaultConfig { completion_polls_max: 3, ..FaultConfig::default() });
    }
    let at = counter_offset(&s);
    let (read, tried) = (Arc::new(Barrier::new(TASKS + 1)), Arc::new(Barrier::new(TASKS + 1)));
    let writer =
        tokio::spawn(overlapping_writer(Arc::clone(&s.vol), at, Arc::clone(&read), Arc::clone(&tried), 161));
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| tokio::spawn(increment(Arc::clone(&s.vol), at, Arc::clone(&read), Arc::clone(&tried))))
        .collect();
    let mut won = 0;
    for t in tasks {
        won += t.await.expect("compare and write task").unwrap_or_else(|e| panic!("{kind:?}: {e}"));
    }
    writer.await.expect("writer task").unwrap_or_else(|e| panic!("{kind:?}: {e}"));
    assert!(won <= ROUNDS, "{kind:?}: {won} compare and writes won {ROUNDS} rounds of one value each");
}

mod matches_and_misses {
    super::every_kind!(super::matches_and_misses);
}
mod refusals {
    super::every_kind!(super::refusals);
}
mod atomic_counter {
    super::every_kind!(super::atomic_counter);
}
mod against_writes {
    super::every_kind!(super::against_writes);
}
