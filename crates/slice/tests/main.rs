//! The slice protocol's scenarios, in one test binary.

// Test patterns truncate on purpose; stria is built for 64-bit only.
#![allow(clippy::cast_possible_truncation)]

mod common;
mod fencing;
mod fuzz_corpus;
mod pool_over_slices;
mod protocol;
