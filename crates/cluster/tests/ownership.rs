//! Ownership in etcd (docs/design/cluster.md §4): one owner at a time, bound to its node's
//! lease; each takeover a higher epoch; a superseded owner can change nothing; and its own
//! lease deadline runs out before anyone else can own the volume.

use std::time::{Duration, Instant};

use stria_cluster::{ClusterError, MembersRecord, VolumeRecord};
use stria_engine::Layout;

use crate::common::*;

fn spec(name: &str) -> VolumeRecord {
    VolumeRecord {
        name: name.into(),
        layout: Layout::Raid1 { copies: 3 },
        size_bytes: 1 << 20,
        chunk_bytes: 64 << 10,
        slices: Vec::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_owner_at_a_time_and_a_dead_owner_is_superseded_with_a_higher_epoch() {
    let etcd = Etcd::start().await;
    let ttl = Duration::from_secs(2);
    let a = etcd.session("a", ttl).await;
    let b = etcd.session("b", ttl).await;
    // A spec no node could make a pool of is refused before anything is written.
    for bad in [
        VolumeRecord { size_bytes: 0, ..spec("v") },
        VolumeRecord { size_bytes: 5000, ..spec("v") },
        VolumeRecord { chunk_bytes: 3 << 10, ..spec("v") },
        VolumeRecord { layout: Layout::Raid1 { copies: 9 }, ..spec("v") },
        VolumeRecord { name: "v/1".into(), ..spec("v") },
    ] {
        assert!(matches!(a.create_volume(&bad).await, Err(ClusterError::Engine(_))), "{bad:?}");
        assert!(matches!(a.put_spec(&bad).await, Err(ClusterError::Engine(_))), "{bad:?}");
    }
    assert!(a.specs().await.unwrap().is_empty(), "a refused spec was written");
    let e1 = a.create_volume(&spec("v")).await.unwrap();
    assert!(matches!(a.create_volume(&spec("v")).await, Err(ClusterError::Exists(_))));
    match b.take_ownership("v").await {
        Err(ClusterError::Owned { node, .. }) => assert_eq!(node, "a"),
        other => panic!("b took a live owner's volume: {other:?}"),
    }
    assert!(matches!(b.take_ownership("nope").await, Err(ClusterError::NoSuchVolume(_))));
    a.put_members("v", e1, &MembersRecord { epoch: e1, ..Default::default() }).await.unwrap();

    // a stops renewing (paused, or cut off from etcd). b gets the volume once a's lease
    // expires on etcd's clock — and by then a's own deadline has passed on its clock.
    a.stop_renewing();
    let stopped = Instant::now();
    let e2 = loop {
        match b.take_ownership("v").await {
            Ok(epoch) => break epoch,
            Err(ClusterError::Owned { .. }) => {
                assert!(stopped.elapsed() < ttl + Duration::from_secs(5), "a's lease never expired");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert!(!a.lease_valid(), "b owns the volume while a still believes its lease holds");
    assert!(e2 > e1, "the new epoch {e2} is not above the old {e1}");
    eprintln!("takeover after the owner stopped renewing: {:?} (ttl {ttl:?})", stopped.elapsed());

    // a, superseded, can change nothing: not the members, not the ownership.
    let stale = MembersRecord { epoch: e1, ..Default::default() };
    assert!(matches!(a.put_members("v", e1, &stale).await, Err(ClusterError::NotOwner { .. })));
    a.release("v", e1).await.unwrap();
    let (_, owner, members) = b.volume("v").await.unwrap();
    assert_eq!(owner.map(|(o, e)| (o.node, e)), Some(("b".to_string(), e2)));
    assert_eq!(members.epoch, e1, "the members a wrote while it owned the volume stay");
    b.put_members("v", e2, &MembersRecord { epoch: e2, ..Default::default() }).await.unwrap();

    // A clean stop revokes the lease: the volume is free at once.
    b.revoke().await.unwrap();
    let c = etcd.session("c", ttl).await;
    let e3 = c.take_ownership("v").await.unwrap();
    assert!(e3 > e2);
    assert_eq!(c.nodes().await.unwrap().iter().map(|n| n.name.as_str()).collect::<Vec<_>>(), vec!["c"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_lease_expired_knows_it_and_its_volumes_are_free() {
    // What a paused etcd leader does when it resumes: its leases' time ran on while it was
    // frozen, so they expire at once. Here the lease is revoked from outside, which etcd
    // reports the same way to the node's keep-alive ("lease not found").
    let etcd = Etcd::start().await;
    let a = etcd.session("a", Duration::from_secs(2)).await;
    let epoch = a.create_volume(&spec("v")).await.unwrap();
    assert!(a.renewing());
    let mut admin = etcd_client::Client::connect([&etcd.endpoint], None).await.unwrap();
    admin.lease_revoke(a.lease()).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(6);
    while a.renewing() {
        assert!(Instant::now() < deadline, "the node did not notice its lease was gone");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let b = etcd.session("b", Duration::from_secs(2)).await;
    assert!(b.take_ownership("v").await.unwrap() > epoch);
}
