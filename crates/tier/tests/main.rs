//! Every integration test of the log-structured volume, in one test binary: each scenario file is a
//! module (one link of the dependency graph instead of one per file).
#![allow(clippy::cast_possible_truncation)] // 64-bit only, like the engine; test inputs are small

mod clone_snapshots;
mod common;
mod crash_sequences;
mod fuzz_corpus;
mod log_volume;
mod map_store;
mod resize;
mod two_threads;
mod write_back_race;
