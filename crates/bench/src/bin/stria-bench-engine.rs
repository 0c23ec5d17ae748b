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

fn main() -> anyhow::Result<()> {
    stria_bench::engine::run(&Cli::parse().args)
}
