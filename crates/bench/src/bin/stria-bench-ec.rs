//! Runs the erasure-code benchmark on its own: `stria-bench-ec --help`.

fn main() {
    stria_bench::main_with::<stria_bench::ec::EcBenchArgs>(
        "stria-bench-ec",
        "Erasure-code throughput of stria-ec against Intel ISA-L, XOR and memcpy",
        stria_bench::ec::run,
    );
}
