//! The fuzz targets' seed corpora (tests/corpus, written by tests/corpus/make.py) replayed as
//! tests; see fuzz/README.md.

use std::path::PathBuf;

fn corpus(folder: &str) -> Vec<(String, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/corpus").join(folder);
    let mut inputs: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| {
            let path = e.expect("entry").path();
            (
                path.file_name().expect("name").to_string_lossy().into_owned(),
                std::fs::read(&path).expect("read"),
            )
        })
        .collect();
    inputs.sort();
    assert!(inputs.len() >= 10, "corpus {folder} has only {} inputs", inputs.len());
    inputs
}

#[test]
fn parser_corpus_replays() {
    for (name, data) in corpus("parsers") {
        eprintln!("parsers/{name}");
        stria_iscsi::fuzzing::parsers(&data);
    }
}

#[test]
fn session_corpus_replays() {
    for (name, data) in corpus("session") {
        eprintln!("session/{name}");
        stria_iscsi::fuzzing::session(&data);
    }
}
