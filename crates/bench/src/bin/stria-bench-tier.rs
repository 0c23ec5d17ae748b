//! Runs the tiered-volume benchmark on its own: `stria-bench-tier --help`.

use clap::Parser;

#[derive(Debug, Parser)]
#[command(
    version,
    about = "Seed 000's proof-of-concept tests on a tiered:ec:4+2 volume (2 fast + 6 capacity memory-backed drives, destage always on)"
)]
struct Cli {
    #[command(flatten)]
    args: stria_bench::tier::TierBenchArgs,
}

fn main() {
    // Errors as the `stria` command reports them: one line on stderr, exit status 1.
    if let Err(e) = stria_bench::tier::run(&Cli::parse().args) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
