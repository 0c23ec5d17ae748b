//! The fencing rule of docs/design/cluster.md §4 at one slice: once a newer owner's FENCE is
//! answered, no request of an older owner executes there again — not after a restart or a
//! power cut, not for a request that was already on its way.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use stria_dev::mem::MemDevice;
use stria_dev::{BlockDevice, DevError, FaultConfig, FaultDevice, HoldWrites, IoBuf, IoBytes};
use stria_slice::{RemoteDevice, Slice};

use crate::common::*;

fn handle() -> tokio::runtime::Handle {
    tokio::runtime::Handle::current()
}

#[tokio::test]
async fn a_fenced_owner_can_neither_write_nor_read_and_cannot_fence_back() {
    let (node, _mem) = mem_node("s", 1 << 20).await;
    let old = owner(node.addr, 1).await;
    old.write(0, IoBytes::copy_from(&[1u8; 4096]), true).await.unwrap();

    let new = owner(node.addr, 2).await;
    match old.write(0, IoBytes::copy_from(&[2u8; 4096]), true).await {
        Err(DevError::Fenced { epoch: 1, drive_epoch: 2, .. }) => {}
        other => panic!("the old owner's write after the fence: {other:?}"),
    }
    assert!(old.read(0, IoBuf::zeroed(4096)).await.unwrap_err().is_fenced());
    assert!(old.flush().await.unwrap_err().is_fenced());
    assert!(old.discard(0, 4096).await.unwrap_err().is_fenced());
    assert!(old.fence(1).await.unwrap_err().is_fenced(), "fencing back with the old epoch");
    let got = new.read(0, IoBuf::zeroed(4096)).await.unwrap();
    assert!(got.iter().all(|&b| b == 1), "the refused write changed the data");

    // A request of a higher epoch than the slice's is refused too (FENCE first), and not as
    // fenced: the sender is not the one who lost.
    let early = RemoteDevice::connect(&handle(), node.addr, 0, 3).await.unwrap();
    let err = early.write(0, IoBytes::copy_from(&[3u8; 4096]), true).await.unwrap_err();
    assert!(!err.is_fenced() && err.to_string().contains("not fenced"), "{err}");
    assert!(new.read(0, IoBuf::zeroed(4096)).await.unwrap().iter().all(|&b| b == 1));

    let c = &node.slices.get(0).unwrap().counters;
    assert_eq!(c.fenced.load(Relaxed), 4, "old owner's write, read, flush and discard");
    assert_eq!(c.unfenced.load(Relaxed), 1);
    assert_eq!(c.fences.load(Relaxed), 2);
}

#[tokio::test]
async fn the_epoch_survives_a_power_cut_of_the_slice_node() {
    let fault = Arc::new(FaultDevice::new("s", (1 << 20) + 4096, 7));
    let slice = Slice::format(0, Arc::clone(&fault)).await.unwrap();
    let node = Node::start(vec![slice], None).await;
    let old = owner(node.addr, 4).await;
    old.write(8192, IoBytes::copy_from(&[4u8; 4096]), true).await.unwrap();
    let _new = owner(node.addr, 5).await;
    node.stop();

    // What the drive holds after a power cut: only what was made durable. The fence was.
    let image = fault.crash_image(11);
    let after = FaultDevice::with_config(image, FaultConfig::default(), 12);
    let slice = Slice::open(0, after).await.unwrap();
    assert_eq!(slice.epoch().await, 5, "the fence was acknowledged, so it is durable");
    let node = Node::start(vec![slice], None).await;
    let old = RemoteDevice::connect(&handle(), node.addr, 0, 4).await.unwrap();
    assert!(old.write(8192, IoBytes::copy_from(&[9u8; 4096]), true).await.unwrap_err().is_fenced());
    assert!(old.fence(4).await.unwrap_err().is_fenced());
    let new = owner(node.addr, 5).await;
    assert!(new.read(8192, IoBuf::zeroed(4096)).await.unwrap().iter().all(|&b| b == 4));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_waits_for_the_old_owners_requests_already_running() {
    let gated = Arc::new(HoldWrites::new(MemDevice::new("g", (1 << 20) + 4096)));
    let slice = Slice::format(0, Arc::clone(&gated)).await.unwrap();
    let node = Node::start(vec![slice], None).await;
    let old = Arc::new(owner(node.addr, 1).await);

    // The old owner's write reaches the drive and hangs there.
    gated.hold(|_, _, _| true);
    let writer = Arc::clone(&old);
    let write = tokio::spawn(async move { writer.write(4096, IoBytes::copy_from(&[7u8; 4096]), true).await });
    gated.until_held(1).await;

    // The new owner's fence cannot complete while it runs.
    let addr = node.addr;
    let fence = tokio::spawn(async move { owner(addr, 2).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!fence.is_finished(), "the fence was answered while an older write was running");

    // A request of the old owner that arrives now waits behind the fence, then is refused.
    let late_writer = Arc::clone(&old);
    let late =
        tokio::spawn(async move { late_writer.write(8192, IoBytes::copy_from(&[8u8; 4096]), true).await });
    tokio::time::sleep(Duration::from_millis(50)).await;

    gated.release();
    write.await.unwrap().expect("the write admitted before the fence completes");
    let new = fence.await.unwrap();
    assert!(late.await.unwrap().unwrap_err().is_fenced(), "a write of the old epoch ran after the fence");
    assert!(new.read(4096, IoBuf::zeroed(4096)).await.unwrap().iter().all(|&b| b == 7));
    assert!(new.read(8192, IoBuf::zeroed(4096)).await.unwrap().iter().all(|&b| b == 0));
}

/// A FENCE makes its connection the slice's, even at the epoch the slice has: a request that
/// comes later on an older connection (one still unread in its buffer when the owner connected
/// again) is refused, not as fenced (its sender is the owner), and changes nothing.
#[tokio::test]
async fn a_fence_on_a_new_connection_refuses_the_old_connections_requests() {
    let (node, _mem) = mem_node("s", 1 << 20).await;
    let first = owner(node.addr, 1).await;
    first.write(0, IoBytes::copy_from(&[1u8; 4096]), true).await.unwrap();

    // The same owner, on a new connection, fences at the same epoch.
    let second = owner(node.addr, 1).await;
    let err = first.write(0, IoBytes::copy_from(&[2u8; 4096]), true).await.unwrap_err();
    assert!(!err.is_fenced() && err.to_string().contains("not fenced"), "{err}");
    assert!(first.read(0, IoBuf::zeroed(4096)).await.is_err(), "the old connection still reads");
    second.write(4096, IoBytes::copy_from(&[3u8; 4096]), true).await.unwrap();
    let got = second.read(0, IoBuf::zeroed(4096)).await.unwrap();
    assert!(got.iter().all(|&b| b == 1), "the old connection's refused write changed the data");

    let c = &node.slices.get(0).unwrap().counters;
    assert_eq!(c.superseded.load(Relaxed), 2, "the old connection's write and read");
    assert_eq!(c.fences.load(Relaxed), 1, "the second fence raised nothing");
}
