//! 4 KiB random read/write benchmark of the file drive, io_uring against the thread pool.
//!
//! ```text
//! cargo run --release -p stria-dev --example iobench -- [DIR] [SECONDS_PER_RUN] [FILE_MIB]
//! ```
//!
//! Creates `DIR/iobench.img` (default DIR /tmp, 2 s per run, 256 MiB), fills it, then for each
//! of randread/randwrite at queue depth 1 and 32 runs both engines and prints IOPS, latency
//! percentiles and the io_uring/threads ratio measured in the same run. Removes the file after.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use stria_dev::exec::{block_on, join_all};
use stria_dev::{BlockDevice, FileDevice, FileOptions, IoBuf, IoBytes, IoEngine};

const IO_BYTES: usize = 4096;
const FILL_CHUNK_BYTES: usize = 1 << 20;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    RandRead,
    RandWrite,
}

struct RunResult {
    iops: f64,
    latency_us_p50: f64,
    latency_us_p99: f64,
}

/// A small xorshift generator: the benchmark only needs cheap, decent spread.
fn next_random(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

async fn worker(dev: &FileDevice, mode: Mode, seed: u64, deadline: Instant) -> Vec<u32> {
    let blocks = dev.size_bytes() / IO_BYTES as u64;
    let mut rng = seed | 1;
    let mut buf = IoBuf::zeroed(IO_BYTES);
    let data = IoBytes::copy_from(&[0x5a; IO_BYTES]);
    let mut latencies_ns = Vec::with_capacity(1 << 16);
    while Instant::now() < deadline {
        let offset_bytes = (next_random(&mut rng) % blocks) * IO_BYTES as u64;
        let start = Instant::now();
        match mode {
            Mode::RandRead => buf = dev.read(offset_bytes, buf).await.expect("read"),
            Mode::RandWrite => dev.write(offset_bytes, data.clone(), false).await.expect("write"),
        }
        latencies_ns.push(u32::try_from(start.elapsed().as_nanos()).unwrap_or(u32::MAX));
    }
    latencies_ns
}

fn run(dev: &FileDevice, mode: Mode, queue_depth: u64, seconds: f64) -> RunResult {
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(seconds);
    let per_worker =
        join_all((0..queue_depth).map(|i| worker(dev, mode, 0x9e37_79b9_7f4a_7c15 ^ (i + 1), deadline)));
    let elapsed = started.elapsed().as_secs_f64();
    let mut all: Vec<u32> = per_worker.into_iter().flatten().collect();
    all.sort_unstable();
    // Integer percentile index: `permille` thousandths of the way through the sorted samples.
    let percentile = |permille: usize| f64::from(all[(all.len() - 1) * permille / 1000]) / 1000.0;
    RunResult {
        iops: all.len() as f64 / elapsed,
        latency_us_p50: percentile(500),
        latency_us_p99: percentile(990),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dir = PathBuf::from(args.first().map_or("/tmp", String::as_str));
    let seconds: f64 = args.get(1).map_or(2.0, |s| s.parse().expect("seconds"));
    let file_mib: u64 = args.get(2).map_or(256, |s| s.parse().expect("file MiB"));
    let path = dir.join("iobench.img");
    let _ = std::fs::remove_file(&path);
    let size_bytes = file_mib << 20;
    {
        let dev = FileDevice::create(&path, size_bytes).expect("create bench file");
        let chunk = IoBytes::copy_from(&vec![0xa5; FILL_CHUNK_BYTES]);
        let offsets: Vec<u64> =
            (0..size_bytes / FILL_CHUNK_BYTES as u64).map(|i| i * FILL_CHUNK_BYTES as u64).collect();
        for batch in offsets.chunks(16) {
            let writes = batch.iter().map(|&at| dev.write(at, chunk.clone(), false));
            assert!(join_all(writes).into_iter().all(|r| r.is_ok()), "fill failed");
        }
        block_on(dev.flush()).expect("flush");
    }
    println!("file {} ({file_mib} MiB), {seconds} s per run, {IO_BYTES}-byte requests", path.display());
    println!(
        "{:<10} {:>3} {:>8} {:>10} {:>9} {:>9} {:>14}",
        "mode", "qd", "engine", "IOPS", "p50_us", "p99_us", "uring/threads"
    );
    for mode in [Mode::RandRead, Mode::RandWrite] {
        for queue_depth in [1u64, 32] {
            let mut iops_by_engine = Vec::new();
            for engine in [IoEngine::Uring, IoEngine::Threads] {
                let opts = FileOptions { engine, io_threads: 32, ..FileOptions::default() };
                let dev = FileDevice::open(&path, &opts).expect("open");
                assert_eq!(dev.engine(), engine, "engine unavailable");
                let result = run(&dev, mode, queue_depth, seconds);
                iops_by_engine.push(result.iops);
                let ratio = if iops_by_engine.len() == 2 {
                    format!("{:.2}", iops_by_engine[0] / iops_by_engine[1])
                } else {
                    String::new()
                };
                println!(
                    "{:<10} {:>3} {:>8} {:>10.0} {:>9.1} {:>9.1} {:>14}",
                    format!("{mode:?}").to_lowercase(),
                    queue_depth,
                    format!("{engine:?}").to_lowercase(),
                    result.iops,
                    result.latency_us_p50,
                    result.latency_us_p99,
                    ratio
                );
            }
        }
    }
    let _ = std::fs::remove_file(&path);
}
