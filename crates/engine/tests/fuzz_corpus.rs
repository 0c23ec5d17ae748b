//! The fuzz corpus of the drive format's decoders (`fuzz/`, target `engine_decoders`;
//! `stria_engine::fuzzing::decoders`) replayed as ordinary tests, so every input the fuzzer ever
//! found interesting stays a regression test, and seeds taken from a live pool checked on every
//! run.
//!
//! Seeds: the structures of a pool on memory drives (superblock, flush record, metadata slot,
//! journal header and records, a checksum page, an intent page) plus edge cases, each file a
//! selector byte, a flags byte and the bytes. Files named `valid-*` must decode and re-encode to
//! their own bytes. Regenerate with
//! `STRIA_WRITE_CORPUS=1 cargo test -p stria-engine --test engine_scenarios fuzz_corpus::write_seeds -- --ignored`.

use std::path::PathBuf;

use stria_dev::{BLOCK_USIZE, IoBytes, PowerSwitch};
use stria_engine::format::superblock::Superblock;
use stria_engine::fuzzing::{Outcome, SEAL, Structure, decoders};
use stria_engine::{Layout, PoolMeta};

use crate::common::{Dev, create_pool, drives, random_bytes, rng, spec};

fn corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/decoders")
}

fn input(structure: Structure, flags: u8, bytes: &[u8]) -> Vec<u8> {
    let mut v = vec![structure.selector(), flags];
    v.extend_from_slice(bytes);
    v
}

fn peek(dev: &Dev, offset: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    dev.peek(offset, &mut v);
    v
}

/// Structures of a live pool on memory drives, as its code wrote them: after a flush (the
/// checksum page and the flush record), then with partial-stripe writes of an ec volume not yet
/// flushed (journal records in the ring, intent bits set).
async fn live_seeds() -> Vec<(String, Vec<u8>)> {
    let switch = PowerSwitch::new();
    let devs = drives(6, &switch, 77);
    let pool = create_pool(&devs).await;
    let vol = pool
        .create_volume(spec("v", 8 << 20, Layout::Ec { data_shards: 4, parity_shards: 2 }, 64 << 10))
        .await;
    let vol = vol.expect("create a volume");
    let mut r = rng(77);
    vol.write(0, IoBytes::copy_from(&random_bytes(&mut r, 1 << 20)), false).await.expect("write");
    vol.flush().await.expect("flush");
    for i in 0..6u64 {
        let data = random_bytes(&mut r, 5000 + i as usize * 3000);
        vol.write((2 << 20) + i * 300_000 + 17, IoBytes::copy_from(&data), false)
            .await
            .expect("partial write");
    }
    let dev = &devs[0];
    let sb = Superblock::decode(&peek(dev, 0, BLOCK_USIZE)).expect("superblock");
    let l = sb.layout;
    let meta = pool.meta();
    let slot = peek(dev, l.metadata_offset_bytes + (meta.generation % 2) * l.metadata_slot_bytes, 64 << 10);
    let (_, _, payload_bytes, _) = PoolMeta::decode_header(&slot).expect("metadata header");
    let slot_len = (64 + payload_bytes).next_multiple_of(BLOCK_USIZE);
    // The header copies and the start of the ring, where the records are.
    let journal = peek(dev, l.journal_offset_bytes, 32 * BLOCK_USIZE);
    let record_at = journal
        .chunks_exact(BLOCK_USIZE)
        .skip(2)
        .position(|b| &b[..8] == b"STRIA-JR")
        .expect("a journal record in the ring");
    let record = journal[(2 + record_at) * BLOCK_USIZE..(3 + record_at) * BLOCK_USIZE].to_vec();
    vec![
        ("valid-superblock".into(), input(Structure::Superblock, 0, &peek(dev, 0, BLOCK_USIZE))),
        (
            "valid-superblock-copy-1".into(),
            input(Structure::Superblock, 0, &peek(dev, l.drive_bytes - 4096, BLOCK_USIZE)),
        ),
        ("valid-flush-record".into(), input(Structure::FlushRecord, 0, &peek(dev, 4096, BLOCK_USIZE))),
        ("valid-pool-meta".into(), input(Structure::PoolMeta, 0, &slot[..slot_len])),
        ("valid-journal-header".into(), input(Structure::JournalHeader, 0, &journal[..BLOCK_USIZE])),
        ("valid-journal-record".into(), input(Structure::JournalRecord, 0, &record)),
        ("live-journal-ring".into(), input(Structure::JournalRing, 0, &journal)),
        (
            "valid-csum-page".into(),
            input(Structure::CsumPage, 0, &peek(dev, l.csum_offset_bytes, BLOCK_USIZE)),
        ),
        (
            "live-intent-page".into(),
            input(Structure::IntentPage, 0, &peek(dev, l.intent_offset_bytes, BLOCK_USIZE)),
        ),
    ]
}

/// Edge cases of every structure: empty, all zeros, all ones, a bit flipped in a valid one,
/// truncated, and sealed garbage (past the checksum, into the fields).
fn edge_seeds(live: &[(String, Vec<u8>)]) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for s in Structure::ALL {
        let name = format!("{s:?}").to_lowercase();
        out.push((format!("edge-{name}-empty"), input(s, 0, &[])));
        out.push((format!("edge-{name}-zeros"), input(s, 0, &[0; BLOCK_USIZE])));
        out.push((format!("edge-{name}-ones-sealed"), input(s, SEAL, &[0xFF; BLOCK_USIZE])));
        let garbage = random_bytes(&mut rng(u64::from(s.selector())), BLOCK_USIZE);
        out.push((format!("edge-{name}-garbage-sealed"), input(s, SEAL, &garbage)));
    }
    for (name, data) in live {
        if name.starts_with("live-journal-ring") {
            continue; // large; the fuzzer flips its bits
        }
        let mut flipped = data.clone();
        let at = 2 + (data.len() - 2) / 3;
        flipped[at] ^= 0x40;
        out.push((format!("edge-{}-flipped", name.trim_start_matches("valid-")), flipped.clone()));
        // The same flip, resealed: the decoder sees a field it must check, not a checksum.
        flipped[1] = SEAL;
        out.push((format!("edge-{}-flipped-sealed", name.trim_start_matches("valid-")), flipped));
        let cut = data[..data.len().min(2 + 100)].to_vec();
        out.push((format!("edge-{}-truncated", name.trim_start_matches("valid-")), cut));
    }
    out
}

/// Checks one input: no panic; a `valid-` seed decodes and re-encodes to its own bytes.
fn check(name: &str, data: &[u8]) {
    let outcome = std::panic::catch_unwind(|| decoders(data))
        .unwrap_or_else(|_| panic!("decoders panicked on corpus input {name}"));
    if name.starts_with("valid-") {
        assert_eq!(outcome, Outcome::Accepted { exact: true }, "{name}");
    }
    if name.starts_with("live-") {
        assert!(matches!(outcome, Outcome::Accepted { .. }), "{name}: {outcome:?}");
    }
}

#[test]
fn corpus_replays() {
    let mut inputs: Vec<(String, Vec<u8>)> = std::fs::read_dir(corpus_dir())
        .expect("the corpus folder")
        .map(|entry| {
            let path = entry.expect("entry").path();
            (
                path.file_name().expect("name").to_string_lossy().into_owned(),
                std::fs::read(&path).expect("read"),
            )
        })
        .collect();
    inputs.sort();
    assert!(inputs.len() >= 40, "corpus has only {} inputs", inputs.len());
    for s in Structure::ALL {
        assert!(inputs.iter().any(|(_, d)| d.first() == Some(&s.selector())), "no corpus input for {s:?}");
    }
    for (name, data) in &inputs {
        check(name, data);
    }
}

#[tokio::test]
async fn seeds_from_a_live_pool_round_trip() {
    let live = live_seeds().await;
    for (name, data) in live.iter().chain(&edge_seeds(&live)) {
        check(name, data);
    }
}

#[tokio::test]
#[ignore = "writes the seed corpus: STRIA_WRITE_CORPUS=1 ... -- --ignored"]
async fn write_seeds() {
    if std::env::var("STRIA_WRITE_CORPUS").as_deref() != Ok("1") {
        return;
    }
    let live = live_seeds().await;
    let dir = corpus_dir();
    std::fs::create_dir_all(&dir).expect("corpus folder");
    for (name, data) in live.iter().chain(&edge_seeds(&live)) {
        check(name, data);
        std::fs::write(dir.join(name), data).expect("write a seed");
    }
}
