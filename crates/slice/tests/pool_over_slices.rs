//! A pool whose drives are slices on three nodes (docs/design/cluster.md §1): the engine runs
//! over remote slices unchanged, and once a new owner has fenced them the old owner's pool can
//! complete no write — it refuses, and fails none of the drives it cannot use.

use std::sync::Arc;

use stria_dev::IoBytes;
use stria_dev::mem::MemDevice;
use stria_engine::{DriveClass, ErrorKind, FoundDrive, Layout, NewDrive, Pool, VolumeRole, VolumeSpec};
use stria_slice::RemoteDevice;

use crate::common::*;

const SLICE_BYTES: u64 = 48 << 20;

async fn nodes() -> Vec<(Node<Arc<MemDevice>>, Arc<MemDevice>)> {
    let mut out = Vec::new();
    for i in 0..3 {
        out.push(mem_node(&format!("node{i}"), SLICE_BYTES).await);
    }
    out
}

async fn remote_drives(nodes: &[(Node<Arc<MemDevice>>, Arc<MemDevice>)], epoch: u64) -> Vec<RemoteDevice> {
    let mut out = Vec::new();
    for (node, _) in nodes {
        out.push(owner(node.addr, epoch).await);
    }
    out
}

/// Slice 0 of node i as a new pool drive in failure domain `node{i}`.
fn new_drives(drives: Vec<RemoteDevice>) -> Vec<NewDrive<RemoteDevice>> {
    drives
        .into_iter()
        .enumerate()
        .map(|(i, dev)| NewDrive {
            path: format!("node{i}/slice-0"),
            dev,
            class: DriveClass::Capacity,
            domain: format!("node{i}"),
            fresh: true,
        })
        .collect()
}

fn pattern(seed: u8) -> Vec<u8> {
    (0..64 * 1024).map(|i| (i as u8).wrapping_mul(seed) ^ seed).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_over_three_nodes_serves_then_its_old_owner_is_fenced_off() {
    let nodes = nodes().await;
    let drives = remote_drives(&nodes, 1).await;
    let new = new_drives(drives);
    let old = Pool::create("cluster", new).await.unwrap();
    let vol = old
        .create_volume(VolumeSpec {
            name: "m".into(),
            size_bytes: 8 << 20,
            layout: Layout::Raid1 { copies: 3 },
            chunk_bytes: 64 << 10,
            class: DriveClass::Capacity,
            role: VolumeRole::Plain,
        })
        .await
        .unwrap();
    vol.write(0, IoBytes::copy_from(&pattern(3)), true).await.unwrap();
    vol.write(1 << 20, IoBytes::copy_from(&pattern(5)), false).await.unwrap();
    vol.flush().await.unwrap();
    assert!(vol.read(0, 64 * 1024).await.unwrap()[..] == pattern(3)[..]);

    // A new owner fences every slice at epoch 2. The old owner can complete no write, and
    // fails none of the drives (which are in service is not its decision any more).
    let fenced = remote_drives(&nodes, 2).await;
    let err = vol.write(0, IoBytes::copy_from(&pattern(9)), true).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    let err = vol.write(2 << 20, IoBytes::copy_from(&pattern(9)), false).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(vol.flush().await.is_err(), "the old owner's flush");
    assert!(vol.read(0, 4096).await.is_err(), "the old owner read from a fenced slice");
    assert!(old.drives().iter().all(|d| !d.is_failed()), "the fenced pool failed a drive");

    // The new owner assembles the pool from the same slices and finds every acknowledged
    // write, and every drive in service.
    let found = fenced
        .into_iter()
        .enumerate()
        .map(|(i, dev)| FoundDrive { dev, path: format!("node{i}/slice-0") })
        .collect();
    let new = Pool::open(found).await.unwrap();
    assert!(new.drives().iter().all(|d| !d.is_failed()));
    let vol = new.volume("m").unwrap();
    assert!(vol.read(0, 64 * 1024).await.unwrap()[..] == pattern(3)[..]);
    assert!(vol.read(1 << 20, 64 * 1024).await.unwrap()[..] == pattern(5)[..]);
    vol.write(0, IoBytes::copy_from(&pattern(11)), true).await.unwrap();
    new.close().await.unwrap();
}

type MemNodes = Vec<(Node<Arc<MemDevice>>, Arc<MemDevice>)>;

/// A pool over three nodes' slices at epoch 1 with a mirror and an ec:2+1 volume written once,
/// then a new owner fences nodes 0 and 1 only: node 2 still takes the old epoch.
async fn partly_fenced() -> (MemNodes, Pool<RemoteDevice>) {
    let nodes = nodes().await;
    let drives = remote_drives(&nodes, 1).await;
    let new = new_drives(drives);
    let old = Pool::create("cluster", new).await.unwrap();
    let spec = |name: &str, layout| VolumeSpec {
        name: name.into(),
        size_bytes: 4 << 20,
        layout,
        chunk_bytes: 64 << 10,
        class: DriveClass::Capacity,
        role: VolumeRole::Plain,
    };
    let mirror = old.create_volume(spec("m", Layout::Raid1 { copies: 3 })).await.unwrap();
    let ec = old.create_volume(spec("e", Layout::Ec { data_shards: 2, parity_shards: 1 })).await.unwrap();
    mirror.write(0, IoBytes::copy_from(&pattern(1)), true).await.unwrap();
    ec.write(0, IoBytes::copy_from(&pattern(1)), true).await.unwrap();
    for (node, _) in &nodes[..2] {
        owner(node.addr, 2).await;
    }
    (nodes, old)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_owner_cannot_complete_a_write_on_the_one_slice_the_new_owner_could_not_reach() {
    let (_nodes, old) = partly_fenced().await;
    for name in ["m", "e"] {
        let vol = old.volume(name).unwrap();
        for (offset, fua) in [(0, true), (1 << 20, false), (2 << 20, true)] {
            let err = vol.write(offset, IoBytes::copy_from(&pattern(7)), fua).await.unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Unavailable, "{name}: {err}");
        }
    }
    assert!(old.drives().iter().all(|d| !d.is_failed()), "the fenced pool failed a drive");
    assert!(old.meta().drives.iter().all(|d| d.failed_reason.is_none()), "a failure was committed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_owner_cannot_commit_metadata_on_the_slices_left_unfenced() {
    let (_nodes, old) = partly_fenced().await;
    // A metadata commit of the old owner (here an operator's `drive fail` of node 2's drive,
    // before any write met a fence) reaches the fenced slices first. It must not drop them and
    // commit on the one slice left: that would make node 2 a second pool that acknowledges
    // writes the new owner never sees.
    let n2 = old.meta().drives.iter().find(|d| d.path_hint.starts_with("node2")).unwrap().slot;
    let err = old.fail_drive(n2, "by hand").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    // Only the drive the operator named is out of use, in memory; nothing was committed.
    let failed: Vec<u32> = old.drives().iter().filter(|d| d.is_failed()).map(|d| d.slot()).collect();
    assert_eq!(failed, [n2], "the fenced pool failed other drives");
    assert!(old.meta().drives.iter().all(|d| d.failed_reason.is_none()), "a failure was committed");
    let err = old.volume("m").unwrap().write(0, IoBytes::copy_from(&pattern(7)), true).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
}

/// A member behind a slow link (the in-process fault proxy: 40 ms each way) slows the writes
/// that wait for it and is not failed for it; what the pool acknowledged reads back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_member_slows_writes_and_is_not_failed() {
    let nodes = nodes().await;
    let proxy = stria_slice::testing::Proxy::start(nodes[2].0.addr).await.unwrap();
    let mut drives = Vec::new();
    for (i, (node, _)) in nodes.iter().enumerate() {
        drives.push(owner(if i == 2 { proxy.addr } else { node.addr }, 1).await);
    }
    let pool = Pool::create("slow", new_drives(drives)).await.unwrap();
    let spec = VolumeSpec {
        name: "v".into(),
        size_bytes: 4 << 20,
        layout: Layout::Raid1 { copies: 3 },
        chunk_bytes: 64 << 10,
        class: DriveClass::Capacity,
        role: VolumeRole::Plain,
    };
    let vol = pool.create_volume(spec).await.unwrap();
    let fast = std::time::Instant::now();
    vol.write(0, IoBytes::copy_from(&[1u8; 4096]), true).await.unwrap();
    let fast = fast.elapsed();
    proxy.set_delay(std::time::Duration::from_millis(40));
    for block in 0..8u8 {
        let start = std::time::Instant::now();
        vol.write(u64::from(block) * 4096, IoBytes::copy_from(&[block + 10; 4096]), true).await.unwrap();
        let took = start.elapsed();
        assert!(
            took >= std::time::Duration::from_millis(80),
            "a FUA write waited {took:?} for the slow copy"
        );
    }
    proxy.set_delay(std::time::Duration::ZERO);
    for block in 0..8u8 {
        let got = vol.read(u64::from(block) * 4096, 4096).await.unwrap();
        assert!(got.iter().all(|&b| b == block + 10), "block {block}");
    }
    assert!(pool.drives().iter().all(|d| !d.is_failed()), "the slow member was failed");
    eprintln!("FUA write: {fast:?} without the delay");
    pool.close().await.unwrap();
}
