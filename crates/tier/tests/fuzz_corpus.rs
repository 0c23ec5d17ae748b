//! The fuzz corpus of a log-structured volume's decoders (`fuzz/`, target `tier_decoders`;
//! `stria_tier::fuzzing::decoders`) replayed as ordinary tests, so every input the fuzzer ever
//! found interesting stays a regression test, and seeds taken from a live volume checked on
//! every run.
//!
//! Seeds: the map's structures made by its encoders, the structures of a `tiered:ec:4+2` volume
//! with a snapshot and a clone as its parts hold them after a clean close (volume header, map log
//! header and blocks, map pages, segment table, layer table, index pages, a batch summary), and
//! edge cases. Each file is a selector byte, a flags byte and the bytes. Files named `made-*` and
//! `live-*` must decode (the volume header, tables and pages also re-encode to their own bytes).
//! Regenerate with
//! `STRIA_WRITE_CORPUS=1 cargo test -p stria-tier --test tier_scenarios fuzz_corpus::write_seeds -- --ignored`.

use std::path::PathBuf;

use stria_dev::{BLOCK_USIZE, IoBytes, PowerSwitch};
use stria_tier::fuzzing::{Outcome, SEAL, Structure, decoders};
use stria_tier::log;

use crate::common::{create_pool, drives, random_bytes, rng, small_space, small_spec};

fn corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/decoders")
}

/// A volume with data in its cache and its segments, a snapshot (so copies, index pages and the
/// page pool are used) and a clone written beside it, closed cleanly; its seeds.
async fn live_seeds() -> Vec<(String, Vec<u8>)> {
    let switch = PowerSwitch::new();
    let devs = drives(&switch, 5);
    let pool = create_pool(&devs).await;
    let blocks = 2048;
    let vol = log::create(&pool, small_spec("v", blocks * 4096, small_space(blocks))).await.expect("create");
    let mut r = rng(5);
    for i in 0..8u64 {
        let data = random_bytes(&mut r, 96 << 10);
        vol.write(i * (1 << 20), IoBytes::copy_from(&data), false).await.expect("write");
    }
    vol.create_snapshot("s1").await.expect("snapshot");
    for i in 0..8u64 {
        let data = random_bytes(&mut r, 40 << 10);
        vol.write(i * (1 << 20) + 8192, IoBytes::copy_from(&data), false)
            .await
            .expect("write after the snapshot");
    }
    let clone = vol.create_clone("s1", "c1").await.expect("clone");
    let data = random_bytes(&mut r, 64 << 10);
    vol.write_to(clone.id, 3 << 20, IoBytes::copy_from(&data)).await.expect("write to the clone");
    vol.destage_all().await.expect("destage");
    vol.close().await;
    stria_tier::fuzzing::seeds(&vol).await
}

/// Edge cases of every structure: empty, zeros, sealed ones and garbage; each seed with a byte
/// flipped, plain and resealed; each cut short.
fn edge_seeds(seeds: &[(String, Vec<u8>)]) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for s in Structure::ALL {
        let name = format!("{s:?}").to_lowercase();
        let input = |flags: u8, bytes: &[u8]| [&[s.selector(), flags][..], bytes].concat();
        out.push((format!("edge-{name}-empty"), input(0, &[])));
        out.push((format!("edge-{name}-zeros"), input(0, &[0; BLOCK_USIZE])));
        out.push((format!("edge-{name}-ones-sealed"), input(SEAL, &[0xFF; BLOCK_USIZE])));
        let garbage = random_bytes(&mut rng(u64::from(s.selector())), BLOCK_USIZE);
        out.push((format!("edge-{name}-garbage-sealed"), input(SEAL, &garbage)));
    }
    for (name, data) in seeds {
        let base = name.trim_start_matches("made-").trim_start_matches("live-");
        let mut flipped = data.clone();
        flipped[2 + (data.len() - 2) / 3] ^= 0x40;
        out.push((format!("edge-{base}-flipped"), flipped.clone()));
        flipped[1] = SEAL;
        out.push((format!("edge-{base}-flipped-sealed"), flipped));
        out.push((format!("edge-{base}-truncated"), data[..data.len().min(2 + 100)].to_vec()));
    }
    out
}

/// Checks one input: no panic; a `made-` or `live-` seed decodes; one whose bytes the encoder
/// wrote whole (not a log block a checkpoint left behind, a summary or a map page that the map
/// rewrote) re-encodes to them.
fn check(name: &str, data: &[u8]) {
    let outcome = std::panic::catch_unwind(|| decoders(data))
        .unwrap_or_else(|_| panic!("decoders panicked on corpus input {name}"));
    if name.starts_with("made-") || name.starts_with("live-") {
        let exact = !name.contains("log-block-") && !name.contains("live-map-page");
        let ok = match outcome {
            Outcome::Accepted { exact: e } => e || !exact,
            Outcome::Refused => false,
        };
        assert!(ok, "{name}: {outcome:?}");
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeds_from_a_live_volume_round_trip() {
    let seeds = live_seeds().await;
    for s in Structure::ALL {
        assert!(seeds.iter().any(|(_, d)| d[0] == s.selector()), "a live seed of {s:?}");
    }
    for (name, data) in seeds.iter().chain(&edge_seeds(&seeds)) {
        check(name, data);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "writes the seed corpus: STRIA_WRITE_CORPUS=1 ... -- --ignored"]
async fn write_seeds() {
    if std::env::var("STRIA_WRITE_CORPUS").as_deref() != Ok("1") {
        return;
    }
    let seeds = live_seeds().await;
    let dir = corpus_dir();
    std::fs::create_dir_all(&dir).expect("corpus folder");
    for (name, data) in seeds.iter().chain(&edge_seeds(&seeds)) {
        check(name, data);
        std::fs::write(dir.join(name), data).expect("write a seed");
    }
}
