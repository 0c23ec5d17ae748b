//! Runs the erasure-code benchmark on its own: `stria-bench-ec --help`.

use clap::Parser;

#[derive(Debug, Parser)]
#[command(version, about = "Erasure-code throughput of stria-ec against Intel ISA-L, XOR and memcpy")]
struct Cli {
    #[command(flatten)]
    args: stria_bench::ec::EcBenchArgs,
}

fn main() {
    // Errors as the `stria` command reports them: one line on stderr, exit status 1.
    if let Err(e) = stria_bench::ec::run(&Cli::parse().args) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
