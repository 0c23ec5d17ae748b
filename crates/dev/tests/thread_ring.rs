//! Rings of the thread (`stria_dev::file::local`): a current-thread runtime whose thread has an
//! io_uring of its own sends its file-drive calls there and reaps them itself. What must hold:
//! the calls really go there, the data is right, and no call is lost or its buffer freed early
//! when a future is dropped, when its drive is closed (on that thread or another) or when the
//! thread exits with calls in its ring.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::mpsc;
use std::task::{Context, Waker};
use std::time::Duration;

use stria_dev::exec::join_all;
use stria_dev::file::local;
use stria_dev::{BlockDevice, FileDevice, FileOptions, IoBuf, IoBytes, IoEngine};

const MIB: u64 = 1 << 20;
/// Large enough that a read is still in flight after its first poll.
const BIG: usize = 8 << 20;

/// Whether the tests can expect a ring of the thread: io_uring allowed here and a kernel that has
/// `DEFER_TASKRUN` and signals a ring's eventfd for its deferred work (6.2 and later; on older
/// ones `install` may refuse, and the drives' own rings take every call, as before).
fn rings_available() -> bool {
    if io_uring::IoUring::new(2).is_err() {
        eprintln!("io_uring refused here: rings of the thread not tested");
        return false;
    }
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut numbers = release.split(|c: char| !c.is_ascii_digit()).filter_map(|n| n.parse::<u32>().ok());
    let version = (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0));
    if version < (6, 2) {
        eprintln!("kernel {release}: rings of the thread not tested (they need 6.2)");
        return false;
    }
    true
}

fn drive(root: &str, queue_depth: u32, size_bytes: u64) -> (tempfile::TempDir, FileDevice) {
    let dir = tempfile::tempdir_in(root).expect("temp dir");
    let opts = FileOptions { engine: IoEngine::Uring, queue_depth, ..FileOptions::default() };
    let dev = FileDevice::create_with(dir.path().join("drive.img"), size_bytes, &opts).expect("create drive");
    assert_eq!(dev.engine(), IoEngine::Uring);
    (dir, dev)
}

fn pattern(block_index: u64, pass: u8, len_bytes: usize) -> IoBytes {
    let seed = block_index.to_le_bytes()[0] ^ pass;
    let bytes: Vec<u8> = (0..len_bytes).map(|i| seed ^ (i / 512).to_le_bytes()[0]).collect();
    IoBytes::copy_from(&bytes)
}

/// A drive in /tmp holding `pattern(pass, pass)` in its first 8 MiB, shared.
fn written_drive(pass: u8) -> (tempfile::TempDir, Arc<FileDevice>) {
    let (dir, dev) = drive("/tmp", 4, 16 * MIB);
    stria_dev::exec::block_on(dev.write(0, pattern(u64::from(pass), pass, BIG), false)).unwrap();
    (dir, Arc::new(dev))
}

/// Drops the last owner of `dev` on a thread of its own and fails the test unless the close
/// finishes within 30 s (it waits for every call of the drive).
fn close_in_time(dev: Arc<FileDevice>, what: &str) {
    let (dropped_tx, dropped_rx) = mpsc::channel();
    std::thread::spawn(move || {
        drop(Arc::into_inner(dev).expect("the last owner"));
        let _ = dropped_tx.send(());
    });
    dropped_rx.recv_timeout(Duration::from_secs(30)).unwrap_or_else(|_| panic!("{what}"));
}

/// Runs `body` on a new thread with a current-thread runtime and a ring of its own (its reaper
/// spawned), and fails the test if it does not finish within `secs` (a lost completion hangs).
fn on_ring_thread<T, F, Fut>(secs: u64, body: F) -> T
where
    T: Send + 'static,
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = T>,
{
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let out = runtime.block_on(async move {
            let reaper = local::install().expect("a ring of the thread").expect("the first install");
            drop(tokio::spawn(reaper.run()));
            body().await
        });
        drop(runtime);
        let _ = tx.send(out);
    });
    rx.recv_timeout(Duration::from_secs(secs))
        .expect("the ring's thread finished in time (a lost completion hangs it)")
}

#[test]
fn a_threads_ring_takes_its_calls_and_the_data_round_trips() {
    if !rings_available() {
        return;
    }
    assert_eq!(local::calls_submitted(), None, "a thread without a ring counts nothing");
    for root in ["/tmp", "/dev/shm"] {
        on_ring_thread(60, move || async move {
            const BLOCKS: u64 = 256;
            // A queue of 8: most calls wait for a slot.
            let (_dir, dev) = drive(root, 8, BLOCKS * 4096);
            let before = local::calls_submitted().expect("this thread has a ring");
            let order: Vec<u64> = (0..BLOCKS).map(|i| (i * 97) % BLOCKS).collect();
            let writes = order.iter().map(|&b| dev.write(b * 4096, pattern(b, 7, 4096), b % 5 == 0));
            assert!(join_all(writes).into_iter().all(|r| r.is_ok()));
            dev.flush().await.expect("flush");
            let reads = order.iter().map(|&b| dev.read(b * 4096, IoBuf::zeroed(4096)));
            for (&b, got) in order.iter().zip(join_all(reads)) {
                assert_eq!(&got.expect("read")[..], &pattern(b, 7, 4096)[..], "block {b} on {root}");
            }
            let calls = local::calls_submitted().unwrap() - before;
            // One call per request (4 KiB transfers are never short): every one on this ring.
            assert_eq!(calls, 2 * BLOCKS + 1, "calls on the thread's ring, one per request");
            let snap = dev.counters().snapshot();
            assert_eq!((snap.write_ops, snap.read_ops, snap.flush_ops, snap.errors), (BLOCKS, BLOCKS, 1, 0));
        });
    }
}

/// `join_all` polls its futures from the runtime's task: the calls are this thread's. The same
/// drive used from a thread without a ring goes through the drive's own ring meanwhile.
#[test]
fn a_drive_serves_a_ring_thread_and_other_threads_at_once() {
    if !rings_available() {
        return;
    }
    let (dir, dev) = drive("/tmp", 16, 4 * MIB);
    let dev = Arc::new(dev);
    let other = Arc::clone(&dev);
    let elsewhere = std::thread::spawn(move || {
        for pass in 0..20u8 {
            let writes = (512..544u64).map(|b| other.write(b * 4096, pattern(b, pass, 4096), false));
            assert!(stria_dev::exec::block_on(async { join_all(writes) }).iter().all(Result::is_ok));
        }
    });
    let mine = Arc::clone(&dev);
    on_ring_thread(60, move || async move {
        for pass in 0..20u8 {
            let writes = (0..32u64).map(|b| mine.write(b * 4096, pattern(b, pass, 4096), false));
            assert!(join_all(writes).iter().all(Result::is_ok));
            let reads = (0..32u64).map(|b| mine.read(b * 4096, IoBuf::zeroed(4096)));
            for (b, got) in (0..32u64).zip(join_all(reads)) {
                assert_eq!(&got.unwrap()[..], &pattern(b, pass, 4096)[..]);
            }
        }
    });
    elsewhere.join().expect("the other thread");
    for b in (0..32u64).chain(512..544) {
        let got = stria_dev::exec::block_on(dev.read(b * 4096, IoBuf::zeroed(4096))).unwrap();
        assert_eq!(&got[..], &pattern(b, 19, 4096)[..], "block {b}");
    }
    drop(dir);
}

/// Futures dropped while their calls are in the thread's ring, then the drive closed on that
/// thread: the close reaps them here (nobody else can), the buffers are never freed early.
#[test]
fn a_drive_closed_on_the_rings_thread_waits_for_its_calls_there() {
    if !rings_available() {
        return;
    }
    on_ring_thread(60, || async {
        let (_dir, dev) = drive("/tmp", 4, 16 * MIB);
        dev.write(0, pattern(1, 1, BIG), false).await.unwrap();
        let mut cx = Context::from_waker(Waker::noop());
        let before = local::calls_submitted().unwrap();
        for _ in 0..4 {
            let mut read = pin!(dev.read(0, IoBuf::zeroed(BIG)));
            assert!(read.as_mut().poll(&mut cx).is_pending(), "an 8 MiB read is not instant");
        }
        assert_eq!(local::calls_submitted().unwrap() - before, 4, "the reads went to this thread's ring");
        let again = dev.read(0, IoBuf::zeroed(BIG)).await.unwrap();
        assert_eq!(&again[..], &pattern(1, 1, BIG)[..]);
        {
            let mut abandoned = pin!(dev.read(0, IoBuf::zeroed(BIG)));
            assert!(abandoned.as_mut().poll(&mut cx).is_pending());
        }
        drop(dev); // would wait forever for its completion thread if this thread did not reap
    });
}

/// A drive closed on another thread while one of its calls is in a ring thread's ring: the close
/// waits for the call, which that thread finishes and then tells the drive's completion thread.
#[test]
fn a_drive_closed_elsewhere_waits_for_a_call_in_a_threads_ring() {
    if !rings_available() {
        return;
    }
    let (dir, dev) = written_drive(2);
    let (abandoned_tx, abandoned_rx) = mpsc::channel::<()>();
    let (closed_tx, closed_rx) = tokio::sync::oneshot::channel::<()>();
    let theirs = Arc::clone(&dev);
    let ring_thread = std::thread::spawn(move || {
        on_ring_thread(60, move || async move {
            let mut cx = Context::from_waker(Waker::noop());
            {
                let mut read = pin!(theirs.read(0, IoBuf::zeroed(BIG)));
                assert!(read.as_mut().poll(&mut cx).is_pending());
            }
            drop(theirs);
            abandoned_tx.send(()).unwrap();
            // Idle in the runtime (its reaper runs) until the drive is closed.
            closed_rx.await.unwrap();
        });
    });
    abandoned_rx.recv().unwrap();
    close_in_time(dev, "the drive closed while its call was in another thread's ring");
    closed_tx.send(()).unwrap();
    ring_thread.join().expect("the ring's thread");
    drop(dir);
}

/// A ring thread whose runtime ends with a call in its ring (the task is dropped with it): the
/// thread waits for the call as it exits, so the drive closes and its data is intact.
#[test]
fn a_thread_that_exits_with_calls_in_its_ring_finishes_them() {
    if !rings_available() {
        return;
    }
    let (dir, dev) = written_drive(3);
    let theirs = Arc::clone(&dev);
    on_ring_thread(60, move || async move {
        // A task that is in its read when the runtime (and the task with it) is dropped.
        let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
        drop(tokio::spawn(async move {
            let read = theirs.read(0, IoBuf::zeroed(BIG));
            let mut read = pin!(read);
            let pending =
                std::future::poll_fn(|cx| std::task::Poll::Ready(read.as_mut().poll(cx).is_pending())).await;
            assert!(pending);
            let _ = started_tx.send(());
            let _ = read.await;
        }));
        started_rx.await.unwrap();
    });
    let whole = stria_dev::exec::block_on(dev.read(0, IoBuf::zeroed(BIG))).unwrap();
    assert_eq!(&whole[..], &pattern(3, 3, BIG)[..]);
    close_in_time(dev, "the drive closed after the ring's thread exited");
    drop(dir);
}
