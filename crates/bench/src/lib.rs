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
pub mod wa;

/// The daemon's allocator (`stria serve` uses mimalloc), for every benchmark program: with the
/// system allocator, buffers freed on another worker thread than the one that allocated them
/// contend on glibc's arena locks, and the per-core scaling measured would be the allocator's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The size options of the benchmarks: the engine's size syntax
/// ([`stria_engine::units::parse_size`]: a number with an optional binary suffix `K`, `M`, `G`,
/// `T`, `P`, with or without `iB`/`B`, any case), and a benchmark size must not be zero.
pub(crate) fn parse_positive_size(s: &str) -> Result<u64, String> {
    match stria_engine::units::parse_size(s)? {
        0 => Err(format!("{s:?}: sizes must be positive")),
        n => Ok(n),
    }
}

/// A size that may be zero (zero turns a part of a benchmark off).
pub(crate) fn parse_size_or_zero(s: &str) -> Result<u64, String> {
    stria_engine::units::parse_size(s)
}

/// The `main` of each benchmark binary: parses `A` from the command line (under `name`, with
/// `about` as its help) and runs `run` on it. An error is reported as the `stria` command reports
/// one: a line on stderr and exit status 1.
pub fn main_with<A: clap::Args + clap::FromArgMatches>(
    name: &'static str,
    about: &'static str,
    run: fn(&A) -> anyhow::Result<()>,
) {
    let command = A::augment_args(clap::Command::new(name).version(env!("CARGO_PKG_VERSION")).about(about));
    let args = A::from_arg_matches(&command.get_matches()).unwrap_or_else(|e| e.exit());
    if let Err(e) = run(&args) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
