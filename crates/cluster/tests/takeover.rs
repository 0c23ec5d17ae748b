//! Coordinators over slices on three nodes, with a real etcd (docs/design/cluster.md §4):
//! an owner that stops renewing its lease (paused, or cut off) is succeeded within the TTL plus
//! the takeover; the successor finds every write the old owner acknowledged; the old owner,
//! still running, can complete no write and read nothing once it is fenced; and a slice the
//! successor cannot reach leaves service in etcd before the successor serves.

use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use stria_cluster::{ClusterError, MembersRecord, VolumeRecord, coordinator};
use stria_dev::IoBytes;
use stria_engine::{ErrorKind, Layout};
use tokio::runtime::Handle;

use stria_slice::testing::Proxy;

use crate::common::*;

const SLICE_BYTES: u64 = 48 << 20;
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_owner_is_fenced_by_its_successor_and_no_acknowledged_write_is_lost() {
    let etcd = Etcd::start().await;
    let nodes = [
        SliceNode::start("n0", 2, SLICE_BYTES).await,
        SliceNode::start("n1", 2, SLICE_BYTES).await,
        SliceNode::start("n2", 2, SLICE_BYTES).await,
    ];
    let layouts =
        [("m", Layout::Raid1 { copies: 3 }), ("e", Layout::Ec { data_shards: 2, parity_shards: 1 })];
    for (slice, (name, layout)) in layouts.into_iter().enumerate() {
        let ttl = Duration::from_secs(2);
        let a = etcd.session(&format!("a-{name}"), ttl).await;
        let b = etcd.session(&format!("b-{name}"), ttl).await;
        let spec = small_spec(name, layout, nodes.iter().map(|n| n.slice(slice as u32)).collect());
        let old = coordinator::create(&a, &Handle::current(), spec).await.unwrap();
        write_registers(&old, 1, 1).await;
        old.volume
            .write(REGISTERS * 4096, IoBytes::copy_from(&register(REGISTERS, 1, 1)), false)
            .await
            .unwrap();
        old.volume.flush().await.unwrap();

        // a stops renewing but keeps running, with its pool open.
        a.stop_renewing();
        let stopped = Instant::now();
        assert!(
            matches!(coordinator::take(&b, &Handle::current(), name).await, Err(ClusterError::Owned { .. })),
            "b took the volume while a's lease held"
        );
        let new = take_when_free(&b, name, ttl + Duration::from_secs(10)).await;
        let failover = stopped.elapsed();
        eprintln!("{layout}: failover {failover:?} (ttl {ttl:?}), takeover itself {:?}", new.took);
        assert!(new.epoch > old.epoch);
        assert!(failover < ttl + Duration::from_secs(5), "failover took {failover:?}");

        // Every write a acknowledged (FUA, or before its acknowledged flush) is there.
        check_registers(&new, 1, 1).await;
        let flushed = new.volume.read(REGISTERS * 4096, 4096).await.unwrap();
        assert!(flushed[..] == register(REGISTERS, 1, 1)[..]);

        // a, still running, completes no write and reads nothing from the fenced slices.
        for block in 0..4 {
            let data = IoBytes::copy_from(&register(block, 1, 2));
            let err = old.volume.write(block * 4096, data, true).await.unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
        }
        assert!(old.volume.read(0, 4096).await.is_err(), "the old owner read a fenced slice");
        assert!(old.pool.drives().iter().all(|d| !d.is_failed()), "the old owner failed a drive");
        let refused: u64 =
            nodes.iter().map(|n| n.slices.get(slice as u32).unwrap().counters.fenced.load(Relaxed)).sum();
        assert!(refused >= 1, "no slice counted a refused request of the old epoch");
        let stale = MembersRecord { epoch: old.epoch, ..Default::default() };
        assert!(matches!(a.put_members(name, old.epoch, &stale).await, Err(ClusterError::NotOwner { .. })));

        // The new owner goes on, and nothing a tried after the fence shows.
        check_registers(&new, 1, 1).await;
        write_registers(&new, 2, 1).await;
        check_registers(&new, 2, 1).await;
        new.pool.close().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slice_the_successor_cannot_reach_leaves_service_in_etcd_before_it_serves() {
    let etcd = Etcd::start().await;
    let nodes = [
        SliceNode::start("n0", 1, SLICE_BYTES).await,
        SliceNode::start("n1", 1, SLICE_BYTES).await,
        SliceNode::start("n2", 1, SLICE_BYTES).await,
    ];
    // n2 is reached through a proxy that will refuse new connections: a keeps its connection
    // to n2, b cannot make one (n2 is cut off from b, not from a).
    let proxy = Proxy::start(nodes[2].addr).await.unwrap();
    let mut slices: Vec<_> = nodes.iter().map(|n| n.slice(0)).collect();
    slices[2].addr = proxy.addr.to_string();
    let ttl = Duration::from_secs(2);
    let a = etcd.session("a", ttl).await;
    let b = etcd.session("b", ttl).await;
    let spec = VolumeRecord {
        name: "e".into(),
        layout: Layout::Ec { data_shards: 2, parity_shards: 1 },
        size_bytes: 4 << 20,
        chunk_bytes: 64 << 10,
        slices,
    };
    let old = coordinator::create(&a, &Handle::current(), spec).await.unwrap();
    write_registers(&old, 1, 1).await;

    proxy.refuse_new();
    a.stop_renewing();
    let new = take_when_free(&b, "e", ttl + Duration::from_secs(10)).await;
    let (_, owner, members) = b.volume("e").await.unwrap();
    assert_eq!(owner.map(|(o, e)| (o.node, e)), Some(("b".to_string(), new.epoch)));
    assert_eq!(members.epoch, new.epoch);
    assert_eq!(members.in_service.iter().map(|s| s.node.as_str()).collect::<Vec<_>>(), vec!["n0", "n1"]);
    assert_eq!(members.out.len(), 1);
    assert_eq!((members.out[0].slice.node.as_str(), members.out[0].epoch), ("n2", new.epoch));

    // b serves from the two slices it fenced: every acknowledged write is there.
    check_registers(&new, 1, 1).await;
    // a still reaches n2, but two of its three members are fenced: it completes no write.
    for block in 0..4 {
        let err = old
            .volume
            .write(block * 4096, IoBytes::copy_from(&register(block, 1, 2)), true)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    }
    write_registers(&new, 2, 1).await;
    check_registers(&new, 2, 1).await;
    new.pool.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_leaves_service_in_etcd_first_and_a_deposed_owner_commits_nothing() {
    let etcd = Etcd::start().await;
    let nodes = [
        SliceNode::start("n0", 1, SLICE_BYTES).await,
        SliceNode::start("n1", 1, SLICE_BYTES).await,
        SliceNode::start("n2", 1, SLICE_BYTES).await,
    ];
    let ttl = Duration::from_secs(2);
    let a = etcd.session("a", ttl).await;
    let b = etcd.session("b", ttl).await;
    let spec = small_spec("m", Layout::Raid1 { copies: 3 }, nodes.iter().map(|n| n.slice(0)).collect());
    let old = coordinator::create(&a, &Handle::current(), spec).await.unwrap();
    write_registers(&old, 1, 1).await;
    let slot_of =
        |node: &str| old.pool.meta().drives.iter().find(|d| d.path_hint.starts_with(node)).unwrap().slot;

    // The owner fails n2's drive: the members in etcd say so, with its epoch, before the pool's
    // own metadata does.
    old.pool.fail_drive(slot_of("n2"), "by hand").await.unwrap();
    let (_, _, members) = b.volume("m").await.unwrap();
    assert_eq!(members.in_service.iter().map(|s| s.node.as_str()).collect::<Vec<_>>(), ["n0", "n1"]);
    assert_eq!(members.out.len(), 1);
    assert_eq!((members.out[0].slice.node.as_str(), members.out[0].epoch), ("n2", old.epoch));
    assert_eq!(members.out[0].reason, "by hand");
    write_registers(&old, 1, 2).await;

    // The owner's lease runs out (paused, or cut off from etcd). No successor has fenced
    // anything yet, but it can commit no metadata change: failing n1 would leave n0 holding
    // writes nobody else knows of.
    a.stop_renewing();
    let deadline = Instant::now() + ttl + Duration::from_secs(5);
    while b.volume("m").await.unwrap().1.is_some() {
        assert!(Instant::now() < deadline, "a's owner key outlived its lease");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let err = old.pool.fail_drive(slot_of("n1"), "by hand").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.to_string().contains("no longer owns"), "{err}");
    let (_, _, after) = b.volume("m").await.unwrap();
    assert_eq!(after, members, "the deposed owner changed the members");

    // The successor fences the two members in service and finds every acknowledged write.
    let new = coordinator::take(&b, &Handle::current(), "m").await.unwrap();
    assert_eq!(new.members.in_service.len(), 2);
    check_registers(&new, 1, 2).await;
    new.pool.close().await.unwrap();
}
