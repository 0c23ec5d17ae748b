//! Runs the engine benchmark on its own: `stria-bench-engine --help`.

use clap::Parser;

#[derive(Debug, Parser)]
#[command(
    version,
    about = "stria's engine over memory drives: IOPS, bandwidth, latency and write amplification against the raw drives"
)]
struct Cli {
    #[command(flatten)]
    args: stria_bench::engine::EngineBenchArgs,
}

fn main() {
    // Errors as the `stria` command reports them: one line on stderr, exit status 1.
    if let Err(e) = stria_bench::engine::run(&Cli::parse().args) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
