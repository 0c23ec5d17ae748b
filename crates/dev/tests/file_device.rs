//! The file drive against real files on tmpfs (/dev/shm) and ext4 (/tmp), with both engines.

use std::future::Future;
use std::path::Path;
use std::pin::pin;
use std::task::{Context, Waker};

use stria_dev::exec::{block_on, join_all};
use stria_dev::{BlockDevice, DevError, FileDevice, FileOptions, IoBuf, IoBytes, IoEngine, OpenError};

const MIB: u64 = 1 << 20;
/// 8 MiB: large enough that a read is still in flight after its first poll.
const BIG: usize = 8 << 20;

fn uring_available() -> bool {
    io_uring::IoUring::new(2).is_ok()
}

fn options(engine: IoEngine, queue_depth: u32) -> FileOptions {
    FileOptions { engine, queue_depth, ..FileOptions::default() }
}

/// Creates a drive of `size_bytes` in a fresh directory under `root`.
fn new_drive(
    root: &str,
    engine: IoEngine,
    queue_depth: u32,
    size_bytes: u64,
) -> (tempfile::TempDir, FileDevice) {
    let dir = tempfile::tempdir_in(root).expect("temp dir");
    let dev =
        FileDevice::create_with(dir.path().join("drive.img"), size_bytes, &options(engine, queue_depth))
            .expect("create drive");
    if engine == IoEngine::Uring && uring_available() {
        assert_eq!(dev.engine(), IoEngine::Uring);
    }
    if engine == IoEngine::Threads {
        assert_eq!(dev.engine(), IoEngine::Threads);
    }
    if engine == IoEngine::Inline {
        // Inline only where calls never wait for a device (tmpfs); threads elsewhere.
        let expected = if root == "/dev/shm" { IoEngine::Inline } else { IoEngine::Threads };
        assert_eq!(dev.engine(), expected, "{root}");
    }
    (dir, dev)
}

/// A block whose every byte says which block and which pass wrote it.
fn pattern(block_index: u64, pass: u8, len_bytes: usize) -> IoBytes {
    let seed = block_index.to_le_bytes()[0] ^ pass;
    let bytes: Vec<u8> = (0..len_bytes).map(|i| seed ^ (i / 512).to_le_bytes()[0]).collect();
    IoBytes::copy_from(&bytes)
}

fn read_back(dev: &FileDevice, offset_bytes: u64, len_bytes: usize) -> IoBuf {
    block_on(dev.read(offset_bytes, IoBuf::zeroed(len_bytes))).expect("read")
}

fn round_trip(engine: IoEngine, root: &str) {
    let (_dir, dev) = new_drive(root, engine, 16, 4 * MIB);
    assert_eq!(dev.size_bytes(), 4 * MIB);
    assert!(read_back(&dev, 0, 8192).iter().all(|&b| b == 0), "a new drive reads as zeros");
    let data = pattern(3, 1, 3 * 4096);
    block_on(dev.write(12288, data.clone(), false)).unwrap();
    block_on(dev.write(MIB, pattern(9, 2, 4096), true)).unwrap();
    block_on(dev.flush()).unwrap();
    assert_eq!(&read_back(&dev, 12288, 3 * 4096)[..], &data[..]);
    assert_eq!(&read_back(&dev, MIB, 4096)[..], &pattern(9, 2, 4096)[..]);
    block_on(dev.discard(12288, 8192)).unwrap();
    let after = read_back(&dev, 12288, 3 * 4096);
    assert!(after[..8192].iter().all(|&b| b == 0), "a punched hole reads as zeros");
    assert_eq!(&after[8192..], &data[8192..]);
    let snap = dev.counters().snapshot();
    assert_eq!((snap.write_ops, snap.flush_ops, snap.discard_ops, snap.errors), (2, 1, 1, 0));
    assert_eq!(snap.write_bytes, 4 * 4096);
}

#[test]
fn uring_round_trip_on_tmpfs_and_ext4() {
    round_trip(IoEngine::Uring, "/dev/shm");
    round_trip(IoEngine::Uring, "/tmp");
}

#[test]
fn threads_round_trip_on_tmpfs_and_ext4() {
    round_trip(IoEngine::Threads, "/dev/shm");
    round_trip(IoEngine::Threads, "/tmp");
}

/// `zero` makes a range read as zeros without writing it: the drive file gives the space back
/// (a large range of an existing file costs no writes and stays sparse).
fn zero_punches_a_hole(engine: IoEngine, root: &str) {
    use std::os::unix::fs::MetadataExt;
    let (dir, dev) = new_drive(root, engine, 8, 64 * MIB);
    let allocated = || std::fs::metadata(dir.path().join("drive.img")).expect("stat").blocks() * 512;
    block_on(dev.write(0, IoBytes::copy_from(&vec![0xEE; 32 << 20]), false)).unwrap();
    block_on(dev.flush()).unwrap();
    assert!(allocated() >= 32 * MIB, "{root}: the data is allocated ({})", allocated());
    let writes = dev.counters().snapshot().write_bytes;
    block_on(dev.zero(4096, 32 * MIB - 8192)).unwrap();
    block_on(dev.flush()).unwrap();
    const END: usize = 32 << 20;
    let back = read_back(&dev, 0, END);
    assert!(back[..4096].iter().all(|&b| b == 0xEE) && back[END - 4096..].iter().all(|&b| b == 0xEE));
    assert!(back[4096..END - 4096].iter().all(|&b| b == 0), "{root}: zeroed");
    assert_eq!(dev.counters().snapshot().write_bytes, writes, "{root}: no bytes written");
    assert!(allocated() < 2 * MIB, "{root}: the space is given back ({} bytes left)", allocated());
    assert!(block_on(dev.zero(60 * MIB, 8 * MIB)).is_err(), "past the end");
}

#[test]
fn zero_punches_a_hole_with_every_engine() {
    for engine in [IoEngine::Uring, IoEngine::Threads, IoEngine::Inline] {
        zero_punches_a_hole(engine, "/dev/shm");
        zero_punches_a_hole(engine, "/tmp");
    }
}

/// 256 requests through a queue of 8: most wait for a slot, all complete in whatever order the
/// kernel finishes them, and each future gets its own result.
fn many_concurrent(engine: IoEngine, root: &str) {
    const BLOCKS: u64 = 256;
    let (_dir, dev) = new_drive(root, engine, 8, BLOCKS * 4096);
    // A scattered order so neighbouring requests are not neighbouring blocks.
    let order: Vec<u64> = (0..BLOCKS).map(|i| (i * 97) % BLOCKS).collect();
    let writes = order.iter().map(|&b| dev.write(b * 4096, pattern(b, 7, 4096), b % 5 == 0));
    assert!(join_all(writes).into_iter().all(|r| r.is_ok()));
    let reads = order.iter().map(|&b| dev.read(b * 4096, IoBuf::zeroed(4096)));
    for (&b, result) in order.iter().zip(join_all(reads)) {
        assert_eq!(&result.unwrap()[..], &pattern(b, 7, 4096)[..], "block {b}");
    }
    assert_eq!(dev.counters().snapshot().read_ops, BLOCKS);
}

#[test]
fn inline_round_trip_on_tmpfs_and_threads_elsewhere() {
    round_trip(IoEngine::Inline, "/dev/shm");
    round_trip(IoEngine::Inline, "/tmp");
}

#[test]
fn inline_many_concurrent_requests_and_threads() {
    many_concurrent(IoEngine::Inline, "/dev/shm");
    many_threads_in(IoEngine::Inline, "/dev/shm");
}

/// Four threads submit to one drive at once, each to its own blocks.
fn many_threads(engine: IoEngine) {
    many_threads_in(engine, "/tmp");
}

fn many_threads_in(engine: IoEngine, root: &str) {
    let (_dir, dev) = new_drive(root, engine, 16, MIB);
    std::thread::scope(|scope| {
        for t in 0..4u64 {
            let dev = &dev;
            scope.spawn(move || {
                let blocks: Vec<u64> = (0..32).map(|i| t * 32 + i).collect();
                let writes = blocks.iter().map(|&b| dev.write(b * 4096, pattern(b, 9, 4096), false));
                assert!(join_all(writes).iter().all(Result::is_ok));
                let reads = blocks.iter().map(|&b| dev.read(b * 4096, IoBuf::zeroed(4096)));
                for (&b, got) in blocks.iter().zip(join_all(reads)) {
                    assert_eq!(&got.unwrap()[..], &pattern(b, 9, 4096)[..]);
                }
            });
        }
    });
    assert_eq!(dev.counters().snapshot().write_ops, 128);
}

#[test]
fn uring_submissions_from_many_threads() {
    many_threads(IoEngine::Uring);
}

#[test]
fn threads_submissions_from_many_threads() {
    many_threads(IoEngine::Threads);
}

#[test]
fn uring_many_concurrent_requests() {
    many_concurrent(IoEngine::Uring, "/dev/shm");
    many_concurrent(IoEngine::Uring, "/tmp");
}

#[test]
fn threads_many_concurrent_requests() {
    many_concurrent(IoEngine::Threads, "/dev/shm");
    many_concurrent(IoEngine::Threads, "/tmp");
}

fn bad_requests(engine: IoEngine) {
    let (_dir, dev) = new_drive("/dev/shm", engine, 4, MIB);
    let r = block_on(dev.read(MIB, IoBuf::zeroed(4096)));
    assert!(matches!(r, Err(DevError::OutOfRange { .. })));
    let r = block_on(dev.write(512, IoBytes::zeroed(4096), false));
    assert!(matches!(r, Err(DevError::Misaligned { .. })));
    let r = block_on(dev.read(0, IoBuf::zeroed(1000)));
    assert!(matches!(r, Err(DevError::Misaligned { .. })));
    let r = block_on(dev.discard(MIB - 4096, 8192));
    assert!(matches!(r, Err(DevError::OutOfRange { .. })));
}

#[test]
fn uring_rejects_out_of_range_and_misaligned_requests() {
    bad_requests(IoEngine::Uring);
}

#[test]
fn threads_rejects_out_of_range_and_misaligned_requests() {
    bad_requests(IoEngine::Threads);
}

/// Starts a big read, drops the future while the kernel may still be filling the buffer, and
/// keeps using (then closes) the drive: the slot must hold the buffer until the completion.
fn drop_in_flight(engine: IoEngine) {
    let (_dir, dev) = new_drive("/tmp", engine, 4, 16 * MIB);
    block_on(dev.write(0, pattern(1, 1, BIG), false)).unwrap();
    let mut cx = Context::from_waker(Waker::noop());
    for _ in 0..8 {
        let mut fut = pin!(dev.read(0, IoBuf::zeroed(BIG)));
        assert!(fut.as_mut().poll(&mut cx).is_pending(), "an 8 MiB read is not instant");
        // Dropped here, probably in flight.
    }
    // Churn the allocator so a freed buffer would likely be reused.
    let reads = (0..4).map(|i| dev.read(i * 4096, IoBuf::zeroed(4096)));
    assert!(join_all(reads).iter().all(|r| r.is_ok()));
    let whole = read_back(&dev, 0, BIG);
    assert_eq!(&whole[..], &pattern(1, 1, BIG)[..]);
    {
        let mut abandoned = pin!(dev.write(0, IoBytes::zeroed(4096), false));
        let _ = abandoned.as_mut().poll(&mut cx);
    }
    drop(dev); // waits for the abandoned requests before closing
}

#[test]
fn uring_dropping_an_in_flight_future_is_safe() {
    drop_in_flight(IoEngine::Uring);
}

#[test]
fn threads_dropping_an_in_flight_future_is_safe() {
    drop_in_flight(IoEngine::Threads);
}

#[test]
fn unaligned_buffer_views_are_bounced() {
    let (_dir, dev) = new_drive("/dev/shm", IoEngine::Auto, 4, MIB);
    let mut big = IoBuf::zeroed(4096 + 512);
    let mut view = big.split_off(512);
    assert!(!view.is_aligned());
    view.fill(0xab);
    let frozen = view.freeze();
    block_on(dev.write(8192, frozen, true)).unwrap();
    let mut big = IoBuf::zeroed(4096 + 512);
    let view = big.split_off(512);
    let view = block_on(dev.read(8192, view)).unwrap();
    assert!(view.iter().all(|&b| b == 0xab));
}

#[test]
fn open_reports_size_direct_io_and_refuses_bad_paths() {
    for root in ["/dev/shm", "/tmp"] {
        let dir = tempfile::tempdir_in(root).unwrap();
        let path = dir.path().join("d.img");
        std::fs::File::create(&path).unwrap().set_len(MIB + 1000).unwrap();
        let dev = FileDevice::open(&path, &FileOptions::default()).unwrap();
        assert_eq!(dev.size_bytes(), MIB, "rounded down to whole blocks");
        assert!(dev.direct_io(), "{root} supports O_DIRECT here");
        assert!(!dev.is_block_device());
        assert_eq!(dev.name(), path.to_string_lossy());
        if std::env::var_os("STRIA_IO_ENGINE").is_none() && uring_available() {
            // Auto: io_uring on ext4, inline calls on tmpfs (where io_uring punts every request).
            let expected = if root == "/dev/shm" { IoEngine::Inline } else { IoEngine::Uring };
            assert_eq!(dev.engine(), expected, "{root}");
        }
        drop(dev);
        let again = FileDevice::create(&path, MIB);
        assert!(matches!(again, Err(OpenError::Io { op: "create", .. })), "create never clobbers");
        // A create that fails after making the file (a size no file can have) removes it.
        let huge = dir.path().join("huge.img");
        let refused = FileDevice::create(&huge, u64::MAX - 4095);
        assert!(matches!(refused, Err(OpenError::Io { op: "ftruncate", .. })), "{refused:?}");
        assert!(!huge.exists(), "a failed create left its file behind");
        let not_a_file = FileDevice::open(dir.path(), &FileOptions::default());
        assert!(matches!(not_a_file, Err(OpenError::Io { .. } | OpenError::NotAFileOrBlockDevice { .. })));
        let tiny = dir.path().join("tiny.img");
        std::fs::File::create(&tiny).unwrap().set_len(100).unwrap();
        assert!(matches!(FileDevice::open(&tiny, &FileOptions::default()), Err(OpenError::TooSmall { .. })));
        assert!(matches!(FileDevice::create(dir.path().join("t2"), 100), Err(OpenError::TooSmall { .. })));
    }
}

#[test]
fn data_survives_close_and_reopen() {
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    let path = dir.path().join("persist.img");
    {
        let dev = FileDevice::create(&path, MIB).unwrap();
        block_on(dev.write(4096, pattern(5, 5, 8192), false)).unwrap();
        block_on(dev.flush()).unwrap();
    }
    let dev = FileDevice::open(&path, &options(IoEngine::Threads, 2)).unwrap();
    assert_eq!(&read_back(&dev, 4096, 8192)[..], &pattern(5, 5, 8192)[..]);
    assert!(Path::new(&path).exists());
}

/// Destructive: runs only when `STRIA_TEST_BLOCK_DEVICE` names a scratch block device (for
/// example a loop device: `losetup -f --show scratch.img`). Both engines; discard goes through
/// BLKDISCARD, zero through BLKZEROOUT.
#[test]
fn block_device_round_trip_when_one_is_given() {
    let Some(path) = std::env::var_os("STRIA_TEST_BLOCK_DEVICE") else { return };
    for engine in [IoEngine::Uring, IoEngine::Threads] {
        let dev = FileDevice::open(&path, &options(engine, 8)).expect("open block device");
        assert!(dev.is_block_device());
        assert!(dev.size_bytes() >= MIB && dev.size_bytes().is_multiple_of(4096));
        let last = dev.size_bytes() - 8192;
        block_on(dev.write(last, pattern(2, 3, 8192), true)).unwrap();
        block_on(dev.flush()).unwrap();
        assert_eq!(&read_back(&dev, last, 8192)[..], &pattern(2, 3, 8192)[..]);
        block_on(dev.discard(last, 8192)).unwrap();
        assert_eq!(dev.counters().snapshot().discard_ops, 1);
        block_on(dev.write(last, pattern(2, 4, 8192), true)).unwrap();
        block_on(dev.zero(last, 8192)).unwrap();
        assert!(read_back(&dev, last, 8192).iter().all(|&b| b == 0), "BLKZEROOUT zeroes");
    }
}
