//! Data round trips through the protocol: what a coordinator writes, it reads back.

use std::sync::Arc;

use stria_dev::{BlockDevice, DevError, IoBuf, IoBytes};

use stria_slice::testing::Proxy;

use crate::common::*;

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| seed.wrapping_add((i / 4096) as u8).wrapping_mul(31) ^ (i as u8)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_read_back_pipelined_and_past_the_frame_limit() {
    let (node, _dev) = mem_node("s", 8 << 20).await;
    let dev = Arc::new(owner(node.addr, 1).await);
    assert_eq!(dev.size_bytes(), 8 << 20);

    // 64 writes of 4..64 KiB in flight at once, then read back at once.
    let mut writes = Vec::new();
    for i in 0..64u64 {
        let dev = Arc::clone(&dev);
        writes.push(tokio::spawn(async move {
            let len = 4096 * (1 + (i as usize % 16));
            dev.write(i * 65536, IoBytes::copy_from(&pattern(i as u8, len)), i % 3 == 0).await.unwrap();
        }));
    }
    for w in writes {
        w.await.unwrap();
    }
    dev.flush().await.unwrap();
    let mut reads = Vec::new();
    for i in 0..64u64 {
        let dev = Arc::clone(&dev);
        reads.push(tokio::spawn(async move {
            let len = 4096 * (1 + (i as usize % 16));
            let got = dev.read(i * 65536, IoBuf::zeroed(len)).await.unwrap();
            assert!(got[..] == pattern(i as u8, len)[..], "write {i} read back different");
        }));
    }
    for r in reads {
        r.await.unwrap();
    }

    // 3 MiB: more than one frame carries (1 MiB), split and joined by the device.
    let big = pattern(200, 3 << 20);
    dev.write(4 << 20, IoBytes::copy_from(&big), true).await.unwrap();
    assert!(dev.read(4 << 20, IoBuf::zeroed(3 << 20)).await.unwrap()[..] == big[..]);

    dev.discard(4 << 20, 3 << 20).await.unwrap();
    let c = dev.counters().snapshot();
    assert!(c.write_ops >= 65 && c.read_ops >= 65 && c.flush_ops >= 1, "{c:?}");
}

#[tokio::test]
async fn requests_outside_the_slice_are_refused_before_they_are_sent() {
    let (node, _dev) = mem_node("s", 1 << 20).await;
    let dev = owner(node.addr, 1).await;
    assert!(matches!(dev.read(1 << 20, IoBuf::zeroed(4096)).await, Err(DevError::OutOfRange { .. })));
    assert!(matches!(dev.write(512, IoBytes::zeroed(4096), false).await, Err(DevError::Misaligned { .. })));
    // The data area starts after the header block: a write at 0 does not touch the header.
    dev.write(0, IoBytes::copy_from(&[9u8; 4096]), true).await.unwrap();
    assert_eq!(dev.info().await.unwrap().epoch, 1, "the header still holds the epoch");
}

/// A device that connects again claims its slice at its own epoch and never raises one: behind
/// the same address now is a slice at an older epoch (an old copy put back), and the device's
/// requests are refused as not fenced while that slice keeps its epoch.
#[tokio::test]
async fn a_reconnection_claims_the_slice_but_never_raises_its_epoch() {
    let (node, _mem) = mem_node("s", 1 << 20).await;
    let (old_copy, _old_mem) = mem_node("old", 1 << 20).await;
    let proxy = Proxy::start(node.addr).await.unwrap();
    let listen = proxy.addr;
    let dev = owner(listen, 1).await;
    dev.write(0, IoBytes::copy_from(&[5u8; 4096]), true).await.unwrap();
    drop(proxy);
    let _swapped = Proxy::start_at(listen, old_copy.addr).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let err = dev.read(0, IoBuf::zeroed(4096)).await.unwrap_err();
    assert!(!err.is_fenced() && err.to_string().contains("not fenced"), "{err}");
    assert_eq!(
        old_copy.slices.get(0).unwrap().epoch().await,
        0,
        "the reconnection raised the old copy's epoch"
    );
}

#[tokio::test]
async fn a_broken_connection_fails_its_requests_then_the_device_connects_again() {
    let (node, _mem) = mem_node("s", 1 << 20).await;
    let proxy = Proxy::start(node.addr).await.unwrap();
    let dev = owner(proxy.addr, 1).await;
    dev.write(0, IoBytes::copy_from(&[5u8; 4096]), true).await.unwrap();
    proxy.cut();
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    // The device saw the connection break and connects again for the next request.
    let got = dev.read(0, IoBuf::zeroed(4096)).await.unwrap();
    assert!(got.iter().all(|&b| b == 5));
    // With nothing listening any more, requests fail with an I/O error (not a fence) at once.
    let addr = proxy.addr;
    drop(proxy);
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let err = dev.read(0, IoBuf::zeroed(4096)).await.unwrap_err();
    assert!(err.is_media_error() && !err.is_fenced(), "{err}");
    assert!(
        stria_slice::RemoteDevice::connect(&tokio::runtime::Handle::current(), addr, 0, 1).await.is_err()
    );
}

#[tokio::test]
async fn a_request_for_a_slice_the_node_lacks_is_an_error() {
    let (node, _dev) = mem_node("s", 1 << 20).await;
    let err = stria_slice::RemoteDevice::connect(&tokio::runtime::Handle::current(), node.addr, 7, 1)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("NoSuchSlice"), "{err}");
}
