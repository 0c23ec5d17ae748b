//! Runs the write-amplification benchmark of log-structured volumes: `stria-bench-wa --help`.

/// The daemon's allocator (`stria serve` uses mimalloc): with the system allocator, buffers
/// freed on another worker thread than the one that allocated them contend on glibc's arena
/// locks, and the per-core scaling this program measures would be the allocator's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    stria_bench::main_with::<stria_bench::wa::WaBenchArgs>(
        "stria-bench-wa",
        "Capacity and fast bytes written per host byte: log-structured ec:4+2 volumes at given fills of the capacity tier, against the in-place tiered volume measured in the same run (memory drives)",
        stria_bench::wa::run,
    );
}
