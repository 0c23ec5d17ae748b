//! Runs the engine benchmark on its own: `stria-bench-engine --help`.

fn main() {
    stria_bench::main_with::<stria_bench::engine::EngineBenchArgs>(
        "stria-bench-engine",
        "stria's engine over memory drives: IOPS, bandwidth, latency and write amplification against the raw drives",
        stria_bench::engine::run,
    );
}
