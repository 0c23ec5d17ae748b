//! Runs the tiered-volume benchmark on its own: `stria-bench-tier --help`.

fn main() {
    stria_bench::main_with::<stria_bench::tier::TierBenchArgs>(
        "stria-bench-tier",
        "Seed 000's proof-of-concept tests on a tiered:ec:4+2 volume (2 fast + 6 capacity memory-backed drives, destage always on)",
        stria_bench::tier::run,
    );
}
