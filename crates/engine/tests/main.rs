//! Every integration test of the engine, in one test binary: each scenario file is a module
//! (one link of the dependency graph instead of one per file).
#![allow(clippy::cast_possible_truncation)] // 64-bit only, like the engine; test inputs are small

mod common;
mod corruption_is_detected_and_repaired;
mod crash_consistency;
mod crash_sequences;
mod fuzz_corpus;
mod host_full;
mod layouts_survive_drive_failures;
mod pool_growth;
mod pool_reassembly;
mod two_threads;
mod volume_lifecycle;
