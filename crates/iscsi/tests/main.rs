//! The target's integration tests, in one binary: a real TCP listener with memory volumes
//! behind it and a small initiator (client.rs), and the fuzz targets' seed corpora.

// Test sizes are small constants.
#![allow(clippy::cast_possible_truncation)]

mod client;
mod fuzz_corpus;
mod hostile;
