//! Runs the engine benchmark on its own: `stria-bench-engine --help`.

/// The daemon's allocator (`stria serve` uses mimalloc): with the system allocator, buffers
/// freed on another worker thread than the one that allocated them contend on glibc's arena
/// locks, and the per-core scaling this program measures would be the allocator's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    stria_bench::main_with::<stria_bench::engine::EngineBenchArgs>(
        "stria-bench-engine",
        "stria's engine over memory drives: IOPS, bandwidth, latency and write amplification against the raw drives",
        stria_bench::engine::run,
    );
}
