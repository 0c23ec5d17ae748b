//! Three whole nodes (`Node`: slice server, agent, NBD server) on one etcd: every node serves
//! every volume, forwarding to the owner (docs/design/cluster.md §6.2), and planned moves and a
//! node's clean stop hand the volume over with no error at clients connected to any node (§6.3).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::Relaxed};
use std::time::{Duration, Instant};

use stria_cluster::etcd::Cluster;
use stria_cluster::placement::place;
use stria_cluster::{Keys, Node, NodeConfig, SliceRef, VolumeRecord, prepare_slices};
use stria_dev::IoBytes;
use stria_engine::Layout;
use stria_front::Registry;
use stria_nbd::{NbdClient, Server, ServerConfig, ServerHandle};

use crate::common::*;

const PREFIX: &str = "/stria-test-forward/v1";

/// A node with its own directory (48 MiB slice files, one unless said) and NBD server on 127.0.0.1.
struct WholeNode {
    name: String,
    nbd: String,
    node: Option<Node>,
    server: Option<ServerHandle>,
    _dir: tempfile::TempDir,
}

impl WholeNode {
    async fn start(name: &str, etcd: &Etcd) -> WholeNode {
        WholeNode::start_with(name, etcd, 1).await
    }

    /// A node with `slices` slice files of 48 MiB.
    async fn start_with(name: &str, etcd: &Etcd, slices: u32) -> WholeNode {
        WholeNode::start_polling(name, etcd, slices, Duration::from_millis(100)).await
    }

    /// A node whose agent polls etcd every `poll` (changes wake it too).
    async fn start_polling(name: &str, etcd: &Etcd, slices: u32, poll: Duration) -> WholeNode {
        let dir = tempfile::tempdir().unwrap();
        prepare_slices(dir.path(), slices, 48 << 20).await.unwrap();
        let exports = Arc::new(Registry::new());
        let registry: Arc<Registry> = Arc::clone(&exports);
        let server = Server::new(ServerConfig::default(), registry).unwrap();
        let server = server.serve_tcp("127.0.0.1:0").await.unwrap();
        let nbd = match server.local_addr() {
            stria_nbd::ListenAddr::Tcp(sa) => sa.to_string(),
            other => panic!("{other:?}"),
        };
        let mut config = NodeConfig::new(
            name,
            vec![etcd.endpoint.clone()],
            dir.path().into(),
            "127.0.0.1:0".parse().unwrap(),
        );
        config.nbd_addr = Some(nbd.clone());
        config.ttl = Duration::from_secs(2);
        config.poll = poll;
        config.suspend = Duration::from_secs(30);
        config.keys = Keys::new(PREFIX);
        let node = Node::start(config, exports).await.unwrap();
        WholeNode { name: name.into(), nbd, node: Some(node), server: Some(server), _dir: dir }
    }

    async fn stop(&mut self) {
        if let Some(node) = self.node.take() {
            node.stop().await;
        }
    }

    /// Stops the node, then its NBD server.
    async fn shut(&mut self) {
        self.stop().await;
        if let Some(server) = self.server.take() {
            server.shutdown().await;
        }
    }
}

/// Waits for `count` nodes to register, then lists their slices `0..per_node` (each node's
/// first ones), node by node.
async fn registered_slices(cluster: &Cluster, count: usize, per_node: u32) -> Vec<SliceRef> {
    let records = loop {
        let r = cluster.nodes().await.unwrap();
        if r.len() == count {
            break r;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    records
        .iter()
        .flat_map(|n| {
            (0..per_node).map(|slice| SliceRef { node: n.name.clone(), addr: n.slice_addr.clone(), slice })
        })
        .collect()
}

/// Three whole nodes, n0 to n2, with `slices` slice files each, once all have registered: the
/// nodes, the cluster's records and their slices (node by node).
async fn three_nodes(etcd: &Etcd, slices: u32) -> (Vec<WholeNode>, Cluster, Vec<SliceRef>) {
    let mut nodes = Vec::new();
    for i in 0..3 {
        nodes.push(WholeNode::start_with(&format!("n{i}"), etcd, slices).await);
    }
    let cluster = Cluster::connect(std::slice::from_ref(&etcd.endpoint), Keys::new(PREFIX)).await.unwrap();
    let free = registered_slices(&cluster, 3, slices).await;
    (nodes, cluster, free)
}

async fn owner(cluster: &Cluster, volume: &str) -> Option<String> {
    cluster.volume(volume).await.unwrap().1.map(|(o, _)| o.node)
}

async fn wait_owner(cluster: &Cluster, volume: &str, pred: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(o) = owner(cluster, volume).await
            && pred(&o)
        {
            return o;
        }
        assert!(Instant::now() < deadline, "no owner as wanted for {volume} within 30 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Writes register `block` again and again (FUA), each a new value, until `stop`; every write
/// must succeed. `last` is the last sequence number acknowledged.
async fn writer(
    client: Arc<NbdClient>,
    id: u8,
    block: u64,
    stop: Arc<AtomicBool>,
    last: Arc<AtomicU32>,
) -> Result<(), String> {
    let mut seq = 0;
    while !stop.load(Relaxed) {
        seq += 1;
        let data = IoBytes::copy_from(&register(block, id, seq));
        if let Err(e) = client.write(block * 4096, data, true).await {
            return Err(format!("writer {id}: write {seq} failed: {e}"));
        }
        last.store(seq, Relaxed);
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_serves_every_volume_and_moves_lose_no_request() {
    let etcd = Etcd::start().await;
    // Three nodes, then a mirror over them.
    let (mut nodes, cluster, free) = three_nodes(&etcd, 1).await;
    let layout = Layout::Raid1 { copies: 3 };
    let spec = small_spec("m", layout, place(layout, &free, 1).unwrap());
    cluster.put_spec(&spec).await.unwrap();
    let first = wait_owner(&cluster, "m", |_| true).await;
    eprintln!("m is owned by {first}");

    // A client on every node: the owner serves it, the others forward. Each writes its own
    // register throughout; none may see an error.
    let mut clients = Vec::new();
    for n in &nodes {
        let deadline = Instant::now() + Duration::from_secs(10);
        let client = loop {
            match NbdClient::connect(&n.nbd, "m").await {
                Ok(c) => break c,
                Err(e) if Instant::now() < deadline => {
                    eprintln!("{}: {e}; retrying", n.name);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("{}: {e}", n.name),
            }
        };
        assert_eq!(client.size_bytes(), 4 << 20);
        clients.push(Arc::new(client));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    let mut lasts = Vec::new();
    for (i, c) in clients.iter().enumerate() {
        let last = Arc::new(AtomicU32::new(0));
        lasts.push(Arc::clone(&last));
        writers.push(tokio::spawn(writer(Arc::clone(c), i as u8 + 1, i as u64, Arc::clone(&stop), last)));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Two planned moves, each to a node that does not own the volume.
    let mut at = first.clone();
    for _ in 0..2 {
        let to = nodes.iter().map(|n| n.name.clone()).find(|n| *n != at).unwrap();
        let before = lasts.iter().map(|l| l.load(Relaxed)).collect::<Vec<_>>();
        let started = Instant::now();
        cluster.request_move("m", &to).await.unwrap();
        wait_owner(&cluster, "m", |o| o == to).await;
        eprintln!("moved {at} -> {to} in {:?}", started.elapsed());
        at = to;
        // Writes go on through every node after the move.
        let deadline = Instant::now() + Duration::from_secs(10);
        while lasts.iter().zip(&before).any(|(l, b)| l.load(Relaxed) <= *b + 2) {
            assert!(Instant::now() < deadline, "writes did not go on after the move");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The target ends the move just after it takes the volume.
        let deadline = Instant::now() + Duration::from_secs(5);
        while !cluster.moves().await.unwrap().is_empty() {
            assert!(Instant::now() < deadline, "the move record was left behind");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    // The owner's node stops (cleanly): another node takes the volume, clients on the other
    // nodes see no error.
    let owner_index = nodes.iter().position(|n| n.name == at).unwrap();
    let before = lasts.iter().map(|l| l.load(Relaxed)).collect::<Vec<_>>();
    nodes[owner_index].stop().await;
    let next = wait_owner(&cluster, "m", |o| o != at).await;
    eprintln!("{at} stopped; {next} took m");
    let deadline = Instant::now() + Duration::from_secs(15);
    while lasts.iter().enumerate().any(|(i, l)| i != owner_index && l.load(Relaxed) <= before[i] + 2) {
        assert!(Instant::now() < deadline, "writes did not go on after the owner's node stopped");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Relaxed);
    for (i, w) in writers.into_iter().enumerate() {
        let ended = w.await.unwrap();
        // The stopped node's own client loses its server (not a forwarding error).
        if i != owner_index {
            ended.unwrap();
        }
    }

    // Every acknowledged write is there, read through a node that does not own the volume.
    let reader = nodes.iter().find(|n| n.node.is_some() && n.name != next).unwrap();
    let client = NbdClient::connect(&reader.nbd, "m").await.unwrap();
    for (i, last) in lasts.iter().enumerate() {
        let seq = last.load(Relaxed);
        let got = client.read(i as u64 * 4096, 4096).await.unwrap();
        let want = register(i as u64, i as u8 + 1, seq);
        // The stopped node's writer may have had one more write applied but not acknowledged.
        let next_one = register(i as u64, i as u8 + 1, seq + 1);
        assert!(
            got[..] == want[..] || (i == owner_index && got[..] == next_one[..]),
            "register {i}: not the last acknowledged write {seq}"
        );
    }
    // A pending move to a node that is not alive is ignored by the owner (the CLI refuses to
    // ask for one).
    cluster.request_move("m", "nobody").await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(owner(&cluster, "m").await.as_deref(), Some(next.as_str()));
    cluster.end_move("m").await.unwrap();

    for n in &mut nodes {
        n.shut().await;
    }
}

/// The revision of `etcd`'s keyspace: it grows by one with every write.
async fn etcd_revision(etcd: &Etcd) -> i64 {
    let mut client = etcd_client::Client::connect([&etcd.endpoint], None).await.unwrap();
    client.get("revision", None).await.unwrap().header().expect("a response header").revision()
}

/// A volume no node can take (its slices on a node that does not exist) is tried again after
/// growing waits, not in a loop: each try writes the node's ownership to etcd and releases it,
/// and those writes wake the node's agent again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_no_node_can_take_is_tried_again_after_growing_waits() {
    let etcd = Etcd::start().await;
    let mut node = WholeNode::start("n0", &etcd).await;
    let cluster = Cluster::connect(std::slice::from_ref(&etcd.endpoint), Keys::new(PREFIX)).await.unwrap();
    let ghost = |slice| SliceRef { node: "ghost".into(), addr: "127.0.0.1:1".into(), slice };
    let spec = small_spec("g", Layout::Raid1 { copies: 2 }, vec![ghost(0), ghost(1)]);
    cluster.put_spec(&spec).await.unwrap();
    let before = etcd_revision(&etcd).await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    let writes = etcd_revision(&etcd).await - before;
    // Waits of 1, 2 and 4 s: three or four tries in 6 s, two writes each. Without them the
    // agent's 100 ms poll and the watch of its own writes made it hundreds.
    assert!(writes >= 2, "the volume was never tried ({writes} etcd writes)");
    assert!(writes <= 16, "{writes} etcd writes in 6 s for a volume no node can take");
    assert!(owner(&cluster, "g").await.is_none(), "a volume on slices nobody serves has an owner");
    node.stop().await;
}

/// `stria cluster volume-delete` (docs/design/cluster.md §6.4): refused while a node counts a
/// client of the volume; forced, the owner closes and deletes it, a client attached at another
/// node has its next request refused at once (not held for an owner), and the slices are free
/// for the next volume, which a node takes and serves. A volume nobody can take is deleted by
/// the node that sees its request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_volume_frees_its_slices_and_refuses_its_clients() {
    let etcd = Etcd::start().await;
    let mut nodes = vec![WholeNode::start("n0", &etcd).await, WholeNode::start("n1", &etcd).await];
    let cluster = Cluster::connect(std::slice::from_ref(&etcd.endpoint), Keys::new(PREFIX)).await.unwrap();
    let slices = registered_slices(&cluster, 2, 1).await;
    let spec = |name: &str| small_spec(name, Layout::Raid1 { copies: 2 }, slices.clone());
    cluster.put_spec(&spec("d")).await.unwrap();
    let first = wait_owner(&cluster, "d", |_| true).await;
    // A client at the node that does not own it (its requests are forwarded).
    let other = nodes.iter().find(|n| n.name != first).unwrap();
    let client = connect(&other.nbd, "d").await;
    client.write(0, IoBytes::copy_from(&register(0, 1, 1)), true).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while cluster.attached("d").await.unwrap().is_empty() {
        assert!(Instant::now() < deadline, "the client at {} was not counted within 10 s", other.name);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(cluster.attached("d").await.unwrap(), vec![(other.name.clone(), 1)]);

    // Refused while the client is there, and nothing changes.
    let refused = cluster.request_delete("d", false).await.unwrap_err();
    assert!(
        matches!(&refused, stria_cluster::ClusterError::Attached { at, .. } if at.contains(&other.name)),
        "{refused}"
    );
    assert!(cluster.deletes().await.unwrap().is_empty());
    client.write(4096, IoBytes::copy_from(&register(1, 1, 1)), true).await.unwrap();

    // Forced: deleted by its owner, its keys and claims gone.
    cluster.request_delete("d", true).await.unwrap();
    let again = cluster.request_delete("d", true).await.unwrap_err();
    assert!(
        again.to_string().contains("pending already") || again.to_string().contains("no volume"),
        "{again}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while !matches!(cluster.volume("d").await, Err(stria_cluster::ClusterError::NoSuchVolume(_))) {
        assert!(Instant::now() < deadline, "d is not deleted within 10 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(cluster.claims().await.unwrap().is_empty(), "claims left: {:?}", cluster.claims().await.unwrap());
    assert!(cluster.owners().await.unwrap().is_empty());
    assert!(cluster.attached("d").await.unwrap().is_empty());
    // The client's next request fails at once (the nodes' hold time is 30 s).
    let started = Instant::now();
    let failed = client.write(0, IoBytes::copy_from(&register(0, 1, 2)), true).await;
    assert!(failed.is_err(), "a write to a deleted volume succeeded");
    assert!(started.elapsed() < Duration::from_secs(5), "refused after {:?}: {failed:?}", started.elapsed());

    // The same slices make the next volume, under the same name and twice the size, which a
    // node takes and every node serves at its new size.
    cluster.put_spec(&VolumeRecord { size_bytes: 8 << 20, ..spec("d") }).await.unwrap();
    let owner_d = wait_owner(&cluster, "d", |_| true).await;
    eprintln!("the new d is owned by {owner_d}");
    for n in &nodes {
        let d = connect(&n.nbd, "d").await;
        assert_eq!(d.size_bytes(), 8 << 20, "the new d at {}", n.name);
        let data = register(1000, 9, 9);
        d.write(1000 * 4096, IoBytes::copy_from(&data), true).await.unwrap();
        assert_eq!(&d.read(1000 * 4096, 4096).await.unwrap()[..], &data[..]);
    }

    // A volume no node can take (its slices on a node that does not exist) is deleted by a
    // node that sees the request.
    let ghost = |slice| SliceRef { node: "ghost".into(), addr: "127.0.0.1:1".into(), slice };
    cluster
        .put_spec(&VolumeRecord { name: "g".into(), slices: vec![ghost(0), ghost(1)], ..spec("g") })
        .await
        .unwrap();
    cluster.request_delete("g", false).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !matches!(cluster.volume("g").await, Err(stria_cluster::ClusterError::NoSuchVolume(_))) {
        assert!(Instant::now() < deadline, "g is not deleted within 10 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(cluster.claims().await.unwrap().len(), 2, "only the new d's claims are left");
    for n in &mut nodes {
        n.shut().await;
    }
}

/// Waits until `volume`'s spec says `size_bytes` and no resize of it is pending.
async fn wait_resized(cluster: &Cluster, volume: &str, size_bytes: u64) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (spec, _, _) = cluster.volume(volume).await.unwrap();
        let pending = cluster.resize_of(volume).await.unwrap();
        if spec.size_bytes == size_bytes && pending.is_none() {
            return;
        }
        assert!(
            pending.as_ref().is_none_or(|(r, _)| r.error.is_none()),
            "the resize was refused: {pending:?}"
        );
        assert!(
            Instant::now() < deadline,
            "{volume} is {} bytes, not {size_bytes}, after 15 s",
            spec.size_bytes
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A volume resized online (docs/design/cluster.md §6.5): grown, every node serves it at the new
/// size to clients that connect again, with what was written before in place and the new tail
/// reading zeros, while a client attached before goes on; a shrink is refused without
/// `allow_shrink`, and with clients attached without `force`; forced, the tail is gone for every
/// client; a growth past what the slices hold is refused by the owner, the refusal recorded in
/// the request, and nothing changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resized_volume_is_served_at_its_new_size_by_every_node() {
    let etcd = Etcd::start().await;
    let mut nodes = vec![WholeNode::start("n0", &etcd).await, WholeNode::start("n1", &etcd).await];
    let cluster = Cluster::connect(std::slice::from_ref(&etcd.endpoint), Keys::new(PREFIX)).await.unwrap();
    let slices = registered_slices(&cluster, 2, 1).await;
    let spec = small_spec("r", Layout::Raid1 { copies: 2 }, slices);
    cluster.put_spec(&spec).await.unwrap();
    let first = wait_owner(&cluster, "r", |_| true).await;
    let other = nodes.iter().find(|n| n.name != first).unwrap();
    let early = connect(&other.nbd, "r").await;
    assert_eq!(early.size_bytes(), 4 << 20);
    let (head, last) = (register(0, 1, 1), register(1023, 1, 1));
    early.write(0, IoBytes::copy_from(&head), true).await.unwrap();
    early.write(1023 * 4096, IoBytes::copy_from(&last), true).await.unwrap();

    // Grown to 12 MiB.
    assert_eq!(cluster.request_resize("r", 12 << 20, false, false).await.unwrap(), 4 << 20);
    wait_resized(&cluster, "r", 12 << 20).await;
    for n in &nodes {
        let c = connect(&n.nbd, "r").await;
        let deadline = Instant::now() + Duration::from_secs(10);
        let c = if c.size_bytes() == 12 << 20 {
            c
        } else {
            // The node has not looked at the spec since: connect again.
            loop {
                assert!(Instant::now() < deadline, "{} still serves r at its old size", n.name);
                tokio::time::sleep(Duration::from_millis(100)).await;
                let c = connect(&n.nbd, "r").await;
                if c.size_bytes() == 12 << 20 {
                    break c;
                }
            }
        };
        assert_eq!(&c.read(0, 4096).await.unwrap()[..], &head[..], "block 0 at {}", n.name);
        assert_eq!(&c.read(1023 * 4096, 4096).await.unwrap()[..], &last[..], "block 1023 at {}", n.name);
        assert!(
            c.read(2000 * 4096, 4096).await.unwrap().iter().all(|&b| b == 0),
            "the new tail at {}",
            n.name
        );
        let data = register(3000, 7, 7);
        c.write(3000 * 4096, IoBytes::copy_from(&data), true).await.unwrap();
        assert_eq!(&c.read(3000 * 4096, 4096).await.unwrap()[..], &data[..], "block 3000 at {}", n.name);
    }
    // The client attached before the resize goes on.
    let data = register(5, 2, 2);
    early.write(5 * 4096, IoBytes::copy_from(&data), true).await.unwrap();
    assert_eq!(&early.read(5 * 4096, 4096).await.unwrap()[..], &data[..]);

    // Shrinks: refused without saying so, then while a client is attached.
    let refused = cluster.request_resize("r", 8 << 20, false, false).await.unwrap_err();
    assert!(matches!(refused, stria_cluster::ClusterError::Shrink { .. }), "{refused}");
    assert!(refused.to_string().contains("--allow-shrink"), "{refused}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while cluster.attached("r").await.unwrap().is_empty() {
        assert!(Instant::now() < deadline, "the clients were not counted within 10 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let refused = cluster.request_resize("r", 8 << 20, true, false).await.unwrap_err();
    assert!(matches!(refused, stria_cluster::ClusterError::Attached { .. }), "{refused}");
    assert!(cluster.resize_of("r").await.unwrap().is_none());
    assert_eq!(cluster.volume("r").await.unwrap().0.size_bytes, 12 << 20);

    // Forced: the tail is gone for every client, the head stays.
    cluster.request_resize("r", 8 << 20, true, true).await.unwrap();
    wait_resized(&cluster, "r", 8 << 20).await;
    for n in &nodes {
        let deadline = Instant::now() + Duration::from_secs(10);
        let c = loop {
            let c = connect(&n.nbd, "r").await;
            if c.size_bytes() == 8 << 20 {
                break c;
            }
            assert!(Instant::now() < deadline, "{} still serves r at 12 MiB", n.name);
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert_eq!(&c.read(0, 4096).await.unwrap()[..], &head[..], "block 0 at {}", n.name);
    }
    let past = early.write(3000 * 4096, IoBytes::copy_from(&register(3000, 1, 9)), true).await;
    assert!(past.is_err(), "a write past the new end succeeded");

    // More than the slices hold: refused by the owner, recorded, nothing changed.
    cluster.request_resize("r", 1 << 30, false, false).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    let (request, _) = loop {
        if let Some((r, rev)) = cluster.resize_of("r").await.unwrap()
            && r.error.is_some()
        {
            break (r, rev);
        }
        assert!(Instant::now() < deadline, "the owner did not refuse a 1 GiB growth of 48 MiB slices");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    eprintln!("refused: {:?}", request.error);
    assert_eq!(cluster.volume("r").await.unwrap().0.size_bytes, 8 << 20);
    assert_eq!(cluster.status().await.unwrap().volumes[0].resizing_to, Some(1 << 30));
    // Asking for the size it has clears the refusal.
    assert_eq!(cluster.request_resize("r", 8 << 20, false, false).await.unwrap(), 8 << 20);
    assert!(cluster.resize_of("r").await.unwrap().is_none());
    cluster.request_resize("r", 1 << 30, false, false).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    let revision = loop {
        if let Some((r, rev)) = cluster.resize_of("r").await.unwrap()
            && r.error.is_some()
        {
            break rev;
        }
        assert!(Instant::now() < deadline, "the owner did not refuse the same growth again");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // A refused request is replaced by the next one.
    cluster.request_resize("r", 16 << 20, false, false).await.unwrap();
    wait_resized(&cluster, "r", 16 << 20).await;
    assert!(cluster.end_resize("r", revision).await.is_ok());
    let c = connect(&first_node(&nodes, &first).nbd, "r").await;
    assert_eq!(&c.read(0, 4096).await.unwrap()[..], &head[..]);
    for n in &mut nodes {
        n.shut().await;
    }
}

fn first_node<'a>(nodes: &'a [WholeNode], name: &str) -> &'a WholeNode {
    nodes.iter().find(|n| n.name == name).unwrap()
}

/// An NBD client of `volume` at `addr`, retried for up to 10 s while the node learns of it.
async fn connect(addr: &str, volume: &str) -> NbdClient {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match NbdClient::connect(addr, volume).await {
            Ok(c) => return c,
            Err(e) if Instant::now() < deadline => {
                eprintln!("{addr}: {e}; retrying");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("{addr}: {e}"),
        }
    }
}

/// `ec:4+2` surviving one node loss on three nodes puts two members on each node (the ⌊M/f⌋ rule
/// of docs/design/cluster.md §5): its pool is made and served, and after a node's two members are
/// lost with it another node takes the volume and reads back what was written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ec_volume_with_two_members_per_node_survives_a_node() {
    let etcd = Etcd::start().await;
    let (mut nodes, cluster, free) = three_nodes(&etcd, 2).await;
    let layout = Layout::Ec { data_shards: 4, parity_shards: 2 };
    let spec = VolumeRecord {
        name: "w".into(),
        layout,
        size_bytes: 8 << 20,
        chunk_bytes: 64 << 10,
        slices: place(layout, &free, 1).unwrap(),
    };
    cluster.put_spec(&spec).await.unwrap();
    let first = wait_owner(&cluster, "w", |_| true).await;
    let survivor = nodes.iter().find(|n| n.name != first).unwrap();
    let client = connect(&survivor.nbd, "w").await;
    let mut written = Vec::new();
    for block in [0u64, 17, 1000, 2047] {
        let data = register(block, 4, 1);
        client.write(block * 4096, IoBytes::copy_from(&data), true).await.unwrap();
        written.push((block, data));
    }
    drop(client);
    // The owner's node goes, with two of the six members.
    let i = nodes.iter().position(|n| n.name == first).unwrap();
    nodes[i].shut().await;
    let next = wait_owner(&cluster, "w", |o| o != first).await;
    let n = nodes.iter().find(|n| n.name == next).unwrap();
    let client = connect(&n.nbd, "w").await;
    for (block, data) in &written {
        assert_eq!(
            &client.read(block * 4096, 4096).await.unwrap()[..],
            &data[..],
            "block {block} after {first} went"
        );
    }
    drop(client);
    for n in &mut nodes {
        n.shut().await;
    }
}

/// Cordon and drain (docs/design/cluster.md §6.6): the drained node gives its volumes to the
/// nodes that are not cordoned with no error at a client attached to it, receives no move, no
/// new slice and no failover while another node can take the volume, and takes them when it is
/// the only live node left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_node_owns_nothing_and_takes_nothing_while_cordoned() {
    if let Ok(filter) = std::env::var("STRIA_LOG") {
        let _ = tracing_subscriber::fmt().with_env_filter(filter).with_test_writer().try_init();
    }
    let etcd = Etcd::start().await;
    let (mut nodes, cluster, free) = three_nodes(&etcd, 3).await;
    // Two three-way mirrors, both coordinated by n0. `a` has two copies on n0, so that it can
    // be served with n1 and n2 both gone (a pool assembles from a majority of its members).
    let layout = Layout::Raid1 { copies: 3 };
    let at =
        |node: &str, slice: u32| free.iter().find(|s| s.node == node && s.slice == slice).unwrap().clone();
    for (name, slices) in
        [("a", [at("n0", 0), at("n0", 1), at("n1", 0)]), ("b", [at("n0", 2), at("n1", 1), at("n2", 0)])]
    {
        let slices = slices.to_vec();
        let spec = small_spec(name, layout, slices);
        cluster.put_spec(&spec).await.unwrap();
        wait_owner(&cluster, name, |_| true).await;
        cluster.move_volume(name, "n0", Duration::from_secs(30)).await.unwrap();
    }
    assert_eq!(owner(&cluster, "a").await.as_deref(), Some("n0"));
    assert_eq!(owner(&cluster, "b").await.as_deref(), Some("n0"));

    // A client at n0 writes throughout; none of its writes may fail.
    let client = Arc::new(connect(&nodes[0].nbd, "a").await);
    let stop = Arc::new(AtomicBool::new(false));
    let last = Arc::new(AtomicU32::new(0));
    let writing = tokio::spawn(writer(Arc::clone(&client), 9, 3, Arc::clone(&stop), Arc::clone(&last)));
    let progress = |what: &'static str| {
        let last = Arc::clone(&last);
        async move {
            let before = last.load(Relaxed);
            let deadline = Instant::now() + Duration::from_secs(15);
            while last.load(Relaxed) <= before + 2 {
                assert!(Instant::now() < deadline, "the client at n0 made no progress after {what}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    progress("its start").await;

    // The drain: one volume to each other node (the one owning fewer first, ties by name). A
    // move of `a` to a node that is not alive, pending from before (its owner ignores it), is
    // ended by the drain.
    cluster.request_move("a", "gone").await.unwrap();
    let mut moves = Vec::new();
    let moved = cluster
        .drain("n0", "new kernel", Duration::from_secs(60), |v, to, took| {
            moves.push((v.to_string(), to.to_string(), took));
        })
        .await
        .unwrap();
    eprintln!("drained n0: {moves:?}");
    assert_eq!(moved, 2);
    assert_eq!(
        moves.iter().map(|(v, to, _)| (v.as_str(), to.as_str())).collect::<Vec<_>>(),
        [("a", "n1"), ("b", "n2")]
    );
    assert_eq!(owner(&cluster, "a").await.as_deref(), Some("n1"));
    assert_eq!(owner(&cluster, "b").await.as_deref(), Some("n2"));
    let cordons = cluster.cordons().await.unwrap();
    assert_eq!(cordons.len(), 1);
    assert_eq!((cordons[0].0.as_str(), cordons[0].1.reason.as_str()), ("n0", "new kernel"));
    assert_eq!(cluster.status().await.unwrap().cordons.len(), 1);
    progress("the drain").await;
    // A drain again has nothing to move; a cordon again keeps the first record.
    assert_eq!(cluster.drain("n0", "", Duration::from_secs(10), |_, _, _| {}).await.unwrap(), 0);
    assert!(!cluster.cordon("n0", "other").await.unwrap());
    assert_eq!(cluster.cordons().await.unwrap()[0].1.reason, "new kernel");

    // No move to it: refused, and one asked for behind the check's back is given up.
    let refused = cluster.move_volume("a", "n0", Duration::from_secs(5)).await.unwrap_err();
    assert!(refused.to_string().contains("cordoned"), "{refused}");
    cluster.request_move("a", "n0").await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cluster.moves().await.unwrap().is_empty() {
        assert!(Instant::now() < deadline, "the move to the cordoned node was not given up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(owner(&cluster, "a").await.as_deref(), Some("n1"));
    // No new slice on it.
    let (free_now, left_out) = cluster.free_slices(1 << 20).await.unwrap();
    assert_eq!(left_out, ["n0"]);
    assert!(!free_now.is_empty() && free_now.iter().all(|s| s.node != "n0"), "{free_now:?}");

    // a's owner stops: n2 takes it, not the cordoned n0.
    nodes[1].stop().await;
    assert_eq!(wait_owner(&cluster, "a", |o| o != "n1").await, "n2");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(owner(&cluster, "a").await.as_deref(), Some("n2"));
    progress("n1 stopped").await;

    // Every live node cordoned, the owner stops: n0 serves, cordoned or not (b, with one
    // member left, cannot be served by anyone).
    assert!(cluster.cordon("n2", "").await.unwrap());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(owner(&cluster, "a").await.as_deref(), Some("n2"), "a cordon alone moves nothing");
    nodes[2].stop().await;
    progress("n2 stopped").await;
    assert_eq!(owner(&cluster, "a").await.as_deref(), Some("n0"));
    stop.store(true, Relaxed);
    writing.await.unwrap().unwrap();
    let seq = last.load(Relaxed);
    assert_eq!(&client.read(3 * 4096, 4096).await.unwrap()[..], &register(3, 9, seq)[..]);

    assert!(cluster.uncordon("n0").await.unwrap());
    assert!(!cluster.uncordon("n0").await.unwrap());
    assert_eq!(cluster.cordons().await.unwrap().len(), 1, "n2's stays");
    for n in &mut nodes {
        n.shut().await;
    }
}

/// A node dropped without `stop` stops its agent (which once spun, every pass returning at once
/// on the dropped stop signal, flooding the log with thousands of failed checks a second once
/// etcd was gone): it gives up its lease at once, as a clean stop does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_dropped_without_stop_stops_its_agent() {
    let etcd = Etcd::start().await;
    let cluster = Cluster::connect(std::slice::from_ref(&etcd.endpoint), Keys::new(PREFIX)).await.unwrap();
    let mut n = WholeNode::start("n0", &etcd).await;
    registered_slices(&cluster, 1, 1).await;
    drop(n.node.take());
    // The lease lives 2 s unless revoked; the agent's exit revokes it.
    let deadline = Instant::now() + Duration::from_millis(1500);
    while !cluster.nodes().await.unwrap().is_empty() {
        assert!(Instant::now() < deadline, "the dropped node's agent still holds its lease");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    n.shut().await;
}

/// A client's attach is published in etcd at once (the attach wakes the node's agent), not at
/// the agent's next poll: the count a delete checks (docs/design/cluster.md §6.4) is as fresh as
/// an etcd round trip. The node polls every 30 s here; nothing else wakes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attached_client_is_counted_at_once() {
    let etcd = Etcd::start().await;
    let mut n = WholeNode::start_polling("n0", &etcd, 1, Duration::from_secs(30)).await;
    let cluster = Cluster::connect(std::slice::from_ref(&etcd.endpoint), Keys::new(PREFIX)).await.unwrap();
    let slices = registered_slices(&cluster, 1, 1).await;
    let spec = small_spec("c", Layout::Raid0 { width: 1 }, slices);
    cluster.put_spec(&spec).await.unwrap();
    wait_owner(&cluster, "c", |_| true).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let client = connect(&n.nbd, "c").await;
    let attached = Instant::now();
    while cluster.attached("c").await.unwrap().is_empty() {
        assert!(attached.elapsed() < Duration::from_secs(3), "the attach was not published within 3 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    eprintln!("published {:?} after the attach", attached.elapsed());
    let refused = cluster.request_delete("c", false).await.unwrap_err();
    assert!(matches!(refused, stria_cluster::ClusterError::Attached { .. }), "{refused}");
    drop(client);
    n.shut().await;
}
