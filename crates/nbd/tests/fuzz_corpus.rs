//! Replays the fuzz corpora (seeds and any crashers kept) as ordinary tests, so every input the
//! fuzzer ever found interesting stays a regression test.

use std::path::PathBuf;

fn corpus(folder: &str) -> Vec<(String, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/corpus").join(folder);
    let mut inputs: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|err| panic!("cannot read {}: {err}", dir.display()))
        .map(|entry| {
            let path = entry.unwrap().path();
            (path.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&path).unwrap())
        })
        .collect();
    inputs.sort();
    assert!(inputs.len() >= 10, "corpus {folder} has only {} inputs", inputs.len());
    inputs
}

#[test]
fn parser_corpus_replays() {
    for (name, data) in corpus("parsers") {
        let result = std::panic::catch_unwind(|| stria_nbd::fuzzing::parsers(&data));
        assert!(result.is_ok(), "parsers panicked on corpus input {name}");
    }
}

#[test]
fn session_corpus_replays() {
    for (name, data) in corpus("session") {
        let result = std::panic::catch_unwind(|| stria_nbd::fuzzing::session(&data));
        assert!(result.is_ok(), "session panicked on corpus input {name}");
    }
}

#[test]
fn session_seeds_get_the_expected_answers() {
    // Spot checks that the seeds reach the code they were written for.
    let inputs = corpus("session");
    let reply_of = |name: &str| {
        let (_, data) = inputs.iter().find(|(n, _)| n == name).unwrap();
        stria_nbd::fuzzing::session(data)
    };
    // Greeting (18 bytes) then nothing: the flags were refused.
    assert_eq!(reply_of("seed-bad-client-flags").len(), 18);
    // rw-simple: read reply carries the written bytes.
    let out = reply_of("seed-rw-simple");
    assert!(out.windows(300).any(|w| w.iter().all(|&b| b == 0xab)));
}
