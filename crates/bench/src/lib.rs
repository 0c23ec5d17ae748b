//! stria's benchmark programs. Each is a module with a `clap::Args` struct and a `run` function,
//! run by a small binary in `src/bin/` (`cargo run --release -p stria-bench --bin
//! stria-bench-ec --`, and `-engine`, `-tier`). The `stria` binary does not link this crate.
//!
//! Benchmarks measure and print ratios against a peer measured in the same run; they assert
//! nothing.

pub mod ec;
pub mod engine;
mod host;
pub mod isal;
mod regions;
pub mod tier;
