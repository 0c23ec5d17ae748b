//! Contract, "Durability": a `Fua` write (zeroing, discard, compare and write) is durable when
//! it completes; a
//! `Buffered` one once a later flush completes, and a flush covers every write completed before
//! it, on any handle. Log-structured kinds make every acknowledged write durable before
//! completing. Checked by cutting the power of every drive (each unflushed block survives at its
//! durable version or a later one, by seed), assembling the pool again and looking the volume up
//! by name. Writes that were neither flushed nor FUA read, per block, as old or new
//! (docs/crash-consistency.md), and every read succeeds.

use rand::Rng;
use stria_dev::{BLOCK_BYTES, IoBytes};
use stria_engine::{COMPARE_AND_WRITE_ALIGN_BYTES, COMPARE_AND_WRITE_MAX_BYTES, Durability, Zeroing};

use super::{Kind, Subject, Wrap, every_kind, model_ops::pick_range};
use crate::common::{random_bytes, rng, seeds};

pub async fn clause(kind: Kind, wrap: Wrap) {
    for seed in seeds(2) {
        run_seed(kind, wrap, seed).await;
    }
}

async fn run_seed(kind: Kind, wrap: Wrap, seed: u64) {
    let mut s = Subject::new(kind, 1000 + seed, wrap).await;
    let mut r = rng(1000 + seed);
    let size = s.size();
    let unit = s.zero_unit;
    if !kind.read_only() {
        // Buffered writes, then a flush through a second handle (a flush covers every write
        // completed before it, on any connection).
        for _ in 0..20 {
            let (o, l) = pick_range(&mut r, size, unit, 64 << 10);
            s.write(o, random_bytes(&mut r, l as usize), Durability::Buffered).await;
        }
        s.vol.write_zeroes(unit, unit, Zeroing::ANY, Durability::Buffered).await.expect("zeroing");
        s.model.zero(unit, unit);
        s.rig.volume(&s.name).flush().await.expect("flush on another handle");
        // FUA writes, zeroing and a discard, with no flush after them.
        for _ in 0..20 {
            let (o, l) = pick_range(&mut r, size, unit, 64 << 10);
            s.write(o, random_bytes(&mut r, l as usize), Durability::Fua).await;
        }
        s.vol.write_zeroes(3 * unit + 7, unit, Zeroing::ANY, Durability::Fua).await.expect("FUA zeroing");
        s.model.zero(3 * unit + 7, unit);
        s.vol.discard(5 * unit, 2 * unit, Durability::Fua).await.expect("FUA discard");
        s.model.discard(5 * unit, 2 * unit);
        // FUA compare and writes (after the discard, whose flush would make them durable anyway),
        // each comparing with what its range reads: short ones, and long ones that cover whole
        // ec rows (a partial row is durable through the journal anyway).
        let sector = COMPARE_AND_WRITE_ALIGN_BYTES;
        for i in 0..8 {
            let o = r.random_range(0..size / sector) * sector;
            let most = if i % 2 == 0 { 64 } else { COMPARE_AND_WRITE_MAX_BYTES / sector };
            let l = (r.random_range(1..=most) * sector).min(size - o);
            let current = s.vol.read(o, l as usize).await.expect("read before a compare and write");
            let data = random_bytes(&mut r, l as usize);
            s.vol
                .compare_and_write(o, current.freeze(), IoBytes::copy_from(&data), Durability::Fua)
                .await
                .unwrap_or_else(|e| panic!("{kind:?}: FUA compare and write at {o} +{l}: {e}"));
            s.model.write(o, &data);
        }
    }
    let durable = s.model.clone();
    // Then buffered writes never flushed, each block written at most once: after the cut each
    // reads as before or after (as after, on kinds whose acknowledged writes are durable).
    let mut loose = Vec::new();
    if !kind.read_only() {
        let mut touched = vec![false; (size / BLOCK_BYTES) as usize];
        for _ in 0..20 {
            let (o, l) = pick_range(&mut r, size, unit, 32 << 10);
            let blocks = (o / BLOCK_BYTES) as usize..(o + l).div_ceil(BLOCK_BYTES) as usize;
            if touched[blocks.clone()].iter().any(|&t| t) {
                continue;
            }
            touched[blocks].fill(true);
            let data = random_bytes(&mut r, l as usize);
            s.vol.write(o, IoBytes::copy_from(&data), Durability::Buffered).await.expect("buffered write");
            s.model.write(o, &data);
            loose.push((o, l));
        }
    }
    let after = s.model.clone();
    let cut_seed = r.random();
    s.rig.power_cut(cut_seed).await;
    s.relookup();
    let what = format!("seed {seed}, cut {cut_seed}, {} writes neither flushed nor FUA", loose.len());
    let got = s.vol.read(0, size as usize).await.unwrap_or_else(|e| panic!("{kind:?} {what}: read: {e}"));
    if kind.acked_is_durable() {
        after
            .check(0, &got)
            .unwrap_or_else(|m| panic!("{kind:?} {what}: an acknowledged write was lost: {m}"));
        return;
    }
    for (i, block) in got.chunks(BLOCK_BYTES as usize).enumerate() {
        let at = i as u64 * BLOCK_BYTES;
        if let Err(m) = durable.check(at, block)
            && after.check(at, block).is_err()
        {
            panic!("{kind:?} {what}: block {i} is neither its durable contents nor the newer ones: {m}");
        }
    }
}

every_kind!(clause);
