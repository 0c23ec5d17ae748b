//! Runs the tiered-volume benchmark on its own: `stria-bench-tier --help`.

/// The daemon's allocator (`stria serve` uses mimalloc): with the system allocator, buffers
/// freed on another worker thread than the one that allocated them contend on glibc's arena
/// locks, and the per-core scaling this program measures would be the allocator's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    stria_bench::main_with::<stria_bench::tier::TierBenchArgs>(
        "stria-bench-tier",
        "Seed 000's proof-of-concept tests on a tiered:ec:4+2 volume (2 fast + 6 capacity memory-backed drives, destage always on)",
        stria_bench::tier::run,
    );
}
