//! stria's benchmark programs. Each is a module with a `clap::Args` struct and a `run` function,
//! so the `stria` binary can mount it as a subcommand (`stria bench ec`) and a small binary in
//! `src/bin/` can run it on its own.
//!
//! Benchmarks measure and print ratios against a peer measured in the same run; they assert
//! nothing.

pub mod ec;
pub mod engine;
mod host;
pub mod isal;
mod regions;
pub mod tier;
