//! Runs the write-amplification benchmark of log-structured volumes: `stria-bench-wa --help`.

fn main() {
    stria_bench::main_with::<stria_bench::wa::WaBenchArgs>(
        "stria-bench-wa",
        "Capacity and fast bytes written per host byte: log-structured ec:4+2 volumes at given fills of the capacity tier, against the in-place tiered volume measured in the same run (memory drives)",
        stria_bench::wa::run,
    );
}
