//! Redundancy coming back (docs/design/cluster.md §7), against a real etcd: a member whose node
//! stays away past the out-time is rebuilt on a free slice of another node and its old slice
//! released; a member whose node comes back is rebuilt in place; until its rebuild is done a
//! replacement is `joining` and a takeover does not count it as a complete copy.

use std::time::{Duration, Instant};

use stria_cluster::repair::{self, Repair};
use stria_cluster::{Coordinated, MembersRecord, Session, coordinator};
use stria_engine::Layout;
use stria_slice::testing::Proxy;
use tokio::runtime::Handle;

use crate::common::*;

const SLICE_BYTES: u64 = 48 << 20;

/// Four nodes with one slice each, registered in etcd as live nodes (each reached through a
/// proxy, so a test can cut one off), and an owner session `a`.
struct Rig {
    etcd: Etcd,
    nodes: Vec<SliceNode>,
    proxies: Vec<Proxy>,
    sessions: Vec<Option<Session>>,
    a: Session,
}

impl Rig {
    async fn start() -> Rig {
        let etcd = Etcd::start().await;
        let mut nodes = Vec::new();
        let mut proxies = Vec::new();
        let mut sessions = Vec::new();
        for i in 0..4 {
            let node = SliceNode::start(&format!("n{i}"), 1, SLICE_BYTES).await;
            let proxy = Proxy::start(node.addr).await.unwrap();
            sessions.push(Some(etcd.session_as(node.record(proxy.addr), Duration::from_secs(5)).await));
            nodes.push(node);
            proxies.push(proxy);
        }
        let a = etcd.session("a", Duration::from_secs(5)).await;
        Rig { etcd, nodes, proxies, sessions, a }
    }

    /// A mirror:3 over n0, n1, n2, with every register written.
    async fn mirror(&self) -> Coordinated {
        let mut slices: Vec<_> = self.nodes[..3].iter().map(|n| n.slice(0)).collect();
        for (s, p) in slices.iter_mut().zip(&self.proxies) {
            s.addr = p.addr.to_string();
        }
        let spec = small_spec("m", Layout::Raid1 { copies: 3 }, slices);
        let c = coordinator::create(&self.a, &Handle::current(), spec).await.unwrap();
        write_registers(&c, 1, 1).await;
        c
    }

    /// Node `i` dies: its slices unreachable, its key gone from etcd.
    async fn kill(&mut self, i: usize) {
        self.proxies[i].refuse_new();
        self.proxies[i].cut();
        self.sessions[i].take().unwrap().revoke().await.unwrap();
    }

    /// Node `i` comes back, at the address it had.
    async fn revive(&mut self, i: usize) {
        self.proxies[i] = Proxy::start_at(self.proxies[i].addr, self.nodes[i].addr).await.unwrap();
        let record = self.nodes[i].record(self.proxies[i].addr);
        self.sessions[i] = Some(self.etcd.session_as(record, Duration::from_secs(5)).await);
    }

    async fn members(&self) -> MembersRecord {
        self.a.volume("m").await.unwrap().2
    }

    async fn claim_of(&self, node: &str) -> Option<String> {
        self.a.claims().await.unwrap().into_iter().find(|(s, _)| s.node == node).map(|(_, v)| v)
    }
}

fn nodes_of(slices: &[stria_cluster::SliceRef]) -> Vec<&str> {
    let mut v: Vec<&str> = slices.iter().map(|s| s.node.as_str()).collect();
    v.sort_unstable();
    v
}

/// Writes until the owner has taken n2's member out (its writes to n2 fail).
async fn write_until_out(rig: &Rig, c: &Coordinated, node: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seq = 2;
    while !rig.members().await.out.iter().any(|o| o.slice.node == node) {
        assert!(Instant::now() < deadline, "{node} never went out");
        write_registers(c, 1, seq).await;
        seq += 1;
    }
    write_registers(c, 1, 100).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_away_past_the_out_time_is_rebuilt_on_another_node() {
    let mut rig = Rig::start().await;
    let c = rig.mirror().await;
    assert_eq!(rig.claim_of("n2").await.as_deref(), Some("m"), "create claims its slices");
    assert_eq!(rig.claim_of("n3").await, None);
    rig.kill(2).await;
    write_until_out(&rig, &c, "n2").await;

    // Within the out-time nothing moves.
    let waiting = repair::step(&rig.a, &Handle::current(), &c, Duration::from_secs(600)).await.unwrap();
    assert!(
        matches!(&waiting, Repair::Waiting(why) if why.contains("out-time") || why.contains("after 600 s")),
        "{waiting:?}"
    );

    // Past it, n3's free slice replaces n2's; it is joining until rebuilt.
    let step = repair::step(&rig.a, &Handle::current(), &c, Duration::ZERO).await.unwrap();
    let Repair::Replaced { slice, replaces } = step else { panic!("no replacement: {step:?}") };
    assert_eq!((slice.node.as_str(), replaces.node.as_str()), ("n3", "n2"));
    let m = rig.members().await;
    assert_eq!(nodes_of(&m.in_service), ["n0", "n1", "n3"]);
    assert_eq!(nodes_of(&m.joining), ["n3"]);
    assert!(m.out.is_empty(), "{m:?}");
    assert_eq!(rig.claim_of("n3").await.as_deref(), Some("m"));
    assert_eq!(rig.claim_of("n2").await, None, "the old slice is released");
    assert!(c.pool.rebuild_pending());

    // Writes go on during the rebuild; then n3 is complete.
    write_registers(&c, 1, 101).await;
    c.pool.rebuild(|_| {}).await.unwrap();
    repair::finish(&c).await.unwrap();
    let m = rig.members().await;
    assert!(m.joining.is_empty(), "{m:?}");
    assert_eq!(repair::step(&rig.a, &Handle::current(), &c, Duration::ZERO).await.unwrap(), Repair::Nothing);

    // n3 holds every register: with n0 and n1 failed, the reads come from it alone.
    for node in ["n0", "n1"] {
        let slot = c.pool.meta().drives.iter().find(|d| d.path_hint.starts_with(node)).unwrap().slot;
        c.pool.fail_drive(slot, "test").await.unwrap();
    }
    check_registers(&c, 1, 101).await;
    c.pool.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_node_comes_back_is_rebuilt_in_place_and_a_takeover_waits_for_it() {
    let mut rig = Rig::start().await;
    let c = rig.mirror().await;
    rig.kill(2).await;
    write_until_out(&rig, &c, "n2").await;
    rig.revive(2).await;

    let step = repair::step(&rig.a, &Handle::current(), &c, Duration::from_secs(600)).await.unwrap();
    let Repair::Replaced { slice, replaces } = step else { panic!("no replacement: {step:?}") };
    assert!(slice.same(&replaces), "{slice} should replace itself");
    let m = rig.members().await;
    assert_eq!(nodes_of(&m.in_service), ["n0", "n1", "n2"]);
    assert_eq!(nodes_of(&m.joining), ["n2"]);
    assert_eq!(rig.claim_of("n2").await.as_deref(), Some("m"), "a slice rebuilt in place stays claimed");

    // The owner stops before the rebuild; with n0 and n1 out of reach a successor has only
    // the incomplete n2 and must refuse to serve.
    let b = rig.etcd.session("b", Duration::from_secs(2)).await;
    rig.a.stop_renewing();
    drop(c);
    rig.proxies[0].refuse_new();
    rig.proxies[0].cut();
    rig.proxies[1].refuse_new();
    rig.proxies[1].cut();
    let deadline = Instant::now() + Duration::from_secs(15);
    let err = loop {
        match coordinator::take(&b, &Handle::current(), "m").await {
            Err(stria_cluster::ClusterError::Owned { .. }) => {
                assert!(Instant::now() < deadline, "a's key outlived its lease");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => break e,
            Ok(_) => panic!("a takeover served from a member still being rebuilt"),
        }
    };
    assert!(err.to_string().contains("complete data"), "{err}");

    // With n0 and n1 back, the successor resumes the rebuild and n2 becomes complete.
    rig.proxies[0] = Proxy::start_at(rig.proxies[0].addr, rig.nodes[0].addr).await.unwrap();
    rig.proxies[1] = Proxy::start_at(rig.proxies[1].addr, rig.nodes[1].addr).await.unwrap();
    let new = take_when_free(&b, "m", Duration::from_secs(10)).await;
    assert!(new.pool.rebuild_pending(), "the rebuild of n2 resumes under the new owner");
    new.pool.rebuild(|_| {}).await.unwrap();
    repair::finish(&new).await.unwrap();
    assert!(rig.members().await.joining.is_empty());
    check_registers(&new, 1, 100).await;
    new.pool.close().await.unwrap();
}
