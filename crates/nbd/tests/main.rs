//! Every integration test of the NBD server, in one test binary: each scenario file is a module
//! (one link of the dependency graph instead of one per file).
#![allow(clippy::cast_possible_truncation)] // 64-bit only, like the engine; test inputs are small

mod common;
mod fuzz_corpus;
mod handshake_options;
mod hostile_streams;
mod noisy_neighbours;
mod resource_bounds;
mod transmission_errors;
