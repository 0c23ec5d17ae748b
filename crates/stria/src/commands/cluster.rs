//! `stria node run` and `stria cluster ...` (docs/design/cluster.md): a cluster node, and what an
//! operator reads and specifies in etcd.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use stria_cluster::etcd::Cluster;
use stria_cluster::placement::place;
use stria_cluster::records::now_unix;
use stria_cluster::{Keys, Moved, Node, NodeConfig, VolumeRecord, parse_layout, prepare_slices};
use stria_engine::units::format_size;
use stria_front::Registry;
use stria_nbd::{Server, ServerConfig};

use crate::cli::{ClusterCmd, EtcdArgs, NodeRunArgs, ResizeArgs};
use crate::daemon::Signals;

pub(super) async fn node_run(args: NodeRunArgs) -> Result<()> {
    let listen: SocketAddr = args
        .listen
        .parse()
        .with_context(|| format!("--listen {}: not an IP address and port", args.listen))?;
    if let Some(addr) = args.http {
        crate::http::node::check_addr(addr)?;
    }
    match (args.slices, args.slice_size) {
        (Some(n), Some(bytes)) => prepare_slices(&args.dir, n, bytes).await?,
        (Some(_), None) => bail!("--slices needs --slice-size"),
        _ => {}
    }
    let mut signals = Signals::install()?;
    let exports = Arc::new(Registry::new());
    let registry: Arc<Registry> = Arc::clone(&exports);
    let server = Server::new(ServerConfig::default(), registry).map_err(crate::nbd_limits::explain)?;
    let nbd = server
        .serve_tcp(args.nbd.as_str())
        .await
        .with_context(|| format!("cannot listen on {}", args.nbd))?;
    let nbd_addr = match nbd.local_addr() {
        stria_nbd::ListenAddr::Tcp(sa) => sa.to_string(),
        other => format!("{other:?}"),
    };
    let mut config = NodeConfig::new(&args.name, args.etcd.clone(), args.dir.clone(), listen);
    config.nbd_addr = Some(nbd_addr.clone());
    config.ttl = std::time::Duration::from_secs(args.ttl.max(2));
    config.out_time = std::time::Duration::from_secs(args.out_time);
    config.suspend = std::time::Duration::from_secs(args.suspend);
    config.keys = Keys::new(&args.prefix);
    let node = Node::start(config, Arc::clone(&exports)).await?;
    let http = match args.http {
        Some(addr) => {
            let keys = Keys::new(&args.prefix);
            match crate::http::node::start(addr, node.reporter(), exports, args.etcd.clone(), keys).await {
                Ok(http) => Some(http),
                Err(e) => {
                    node.stop().await;
                    nbd.shutdown().await;
                    return Err(e);
                }
            }
        }
        None => None,
    };
    outln!(
        "node {}: slices {:?} on {}, NBD on {}{}",
        args.name,
        node.slices.ids(),
        node.slice_addr,
        nbd_addr,
        http.as_ref().map(|h| format!(", HTTP on {}", h.url)).unwrap_or_default()
    );
    signals.wait(|| {}).await;
    if let Some(http) = http {
        http.shutdown().await;
    }
    node.stop().await;
    nbd.shutdown().await;
    tracing::info!("node stopped cleanly");
    Ok(())
}

pub(super) async fn cluster(cmd: ClusterCmd) -> Result<()> {
    let endpoints = match &cmd {
        ClusterCmd::Status { at, .. }
        | ClusterCmd::VolumeCreate { at, .. }
        | ClusterCmd::VolumeMove { at, .. }
        | ClusterCmd::VolumeDelete { at, .. }
        | ClusterCmd::VolumeResize { at, .. }
        | ClusterCmd::NodeCordon { at, .. }
        | ClusterCmd::NodeDrain { at, .. }
        | ClusterCmd::NodeUncordon { at, .. } => at.etcd.join(","),
    };
    cluster_at(cmd).await.map_err(|e| match e.downcast_ref::<stria_cluster::ClusterError>() {
        Some(stria_cluster::ClusterError::Etcd(_)) => e.context(format!("cannot reach etcd at {endpoints}")),
        _ => e,
    })
}

async fn cluster_at(cmd: ClusterCmd) -> Result<()> {
    match cmd {
        ClusterCmd::Status { at, json } => status(&at, json).await,
        ClusterCmd::VolumeMove { name, node, cancel, wait, at } => {
            let cluster = connect(&at).await?;
            if cancel {
                let pending = cluster.moves().await?.into_iter().find(|(v, _)| *v == name);
                let Some((_, m)) = pending else { bail!("no move of {name} is pending") };
                cluster.end_move(&name).await?;
                outln!("the move of {name} to {} is given up", m.to);
                return Ok(());
            }
            let node = node.expect("clap requires NODE without --cancel");
            volume_move(&cluster, &name, &node, Duration::from_secs(wait)).await
        }
        ClusterCmd::NodeCordon { node, reason, at } => {
            let cluster = connect(&at).await?;
            known_node(&cluster, &node).await?;
            if cluster.cordon(&node, &reason).await? {
                outln!(
                    "node {node} is cordoned: it takes no volume while another node can, and receives none"
                );
            } else {
                outln!("node {node} is cordoned already");
            }
            Ok(())
        }
        ClusterCmd::NodeDrain { node, reason, wait, at } => {
            let cluster = connect(&at).await?;
            known_node(&cluster, &node).await?;
            let started = Instant::now();
            let moved = cluster
                .drain(&node, &reason, Duration::from_secs(wait), |volume, to, took| {
                    outln!("  moved {volume} to {to} in {} ms", took.as_millis());
                })
                .await?;
            outln!(
                "node {node} is drained: {moved} volume(s) moved in {} ms; it stays cordoned \
                 (`stria cluster node-uncordon {node}` ends that)",
                started.elapsed().as_millis()
            );
            Ok(())
        }
        ClusterCmd::NodeUncordon { node, at } => {
            let cluster = connect(&at).await?;
            if cluster.uncordon(&node).await? {
                outln!("node {node} is in service again");
            } else {
                outln!("node {node} was not cordoned");
            }
            Ok(())
        }
        ClusterCmd::VolumeDelete { name, force, wait, at } => {
            let cluster = connect(&at).await?;
            volume_delete(&cluster, &name, force, Duration::from_secs(wait)).await
        }
        ClusterCmd::VolumeResize { name, to, wait, at } => {
            let cluster = connect(&at).await?;
            volume_resize(&cluster, &name, &to, Duration::from_secs(wait)).await
        }
        ClusterCmd::VolumeCreate { name, layout, size, tolerate, chunk, at } => {
            let layout = parse_layout(&layout).map_err(anyhow::Error::msg)?;
            // The spec's own checks (`put_spec` makes them too) before the placement, whose
            // refusals would hide them.
            let unplaced = VolumeRecord {
                name: name.clone(),
                layout,
                size_bytes: size,
                chunk_bytes: chunk,
                slices: Vec::new(),
            };
            unplaced.check()?;
            let cluster = connect(&at).await?;
            // A slice must hold the member's share plus the drive's own metadata: the journal
            // (16 MiB under 4 GiB, 64 MiB above), metadata slots, checksum and intent tables.
            let members = u64::from(match layout {
                stria_engine::Layout::Raid0 { width } => width,
                stria_engine::Layout::Raid1 { .. } => 1,
                stria_engine::Layout::Raid10 { width, .. } => width,
                stria_engine::Layout::Ec { data_shards, .. } => data_shards,
            });
            let share = size.div_ceil(members);
            let need = share + share / 16 + (72 << 20);
            let (free, cordoned) = cluster.free_slices(need).await?;
            let left_out = if cordoned.is_empty() {
                String::new()
            } else {
                format!("; cordoned nodes left out: {}", cordoned.join(", "))
            };
            let slices = place(layout, &free, tolerate)
                .map_err(|e| anyhow::anyhow!("{e} (free slices of at least {} MiB{left_out})", need >> 20))?;
            let spec = VolumeRecord { slices, ..unplaced };
            cluster.put_spec(&spec).await?;
            let on: Vec<String> = spec.slices.iter().map(|s| s.to_string()).collect();
            outln!(
                "volume {name} ({layout}) specified on {}; the first node to take it serves it",
                on.join(", ")
            );
            Ok(())
        }
    }
}

/// Asks for a planned move and waits until `node` serves the volume (docs/design/cluster.md §6.3).
async fn volume_move(cluster: &Cluster, name: &str, node: &str, wait: Duration) -> Result<()> {
    match cluster.move_volume(name, node, wait).await? {
        Moved::Already => outln!("volume {name} is served by {node} already"),
        Moved::Done { epoch, took } => {
            outln!("volume {name} moved to {node} (epoch {epoch}) in {} ms", took.as_millis())
        }
    }
    Ok(())
}

/// Refuses a node etcd has never heard of (alive, cordoned, or holding a claimed slice): a
/// cordon of a misspelt name would do nothing and say it did.
async fn known_node(cluster: &Cluster, node: &str) -> Result<()> {
    let nodes = cluster.nodes().await?;
    if nodes.iter().any(|n| n.name == node)
        || cluster.cordons().await?.iter().any(|(c, _)| c == node)
        || cluster.claims().await?.iter().any(|(s, _)| s.node == node)
    {
        return Ok(());
    }
    let alive: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
    bail!("no node {node} in the cluster (alive: {})", alive.join(", "))
}

/// Asks for a delete and waits until the volume is gone (docs/design/cluster.md §6.4). With no
/// owner, this command deletes it itself (the nodes would too, at their next look).
async fn volume_delete(cluster: &Cluster, name: &str, force: bool, wait: Duration) -> Result<()> {
    cluster.volume(name).await?;
    let claimed: Vec<String> =
        cluster.claims().await?.into_iter().filter(|(_, v)| v == name).map(|(s, _)| s.to_string()).collect();
    let started = Instant::now();
    cluster.request_delete(name, force).await?;
    loop {
        let (_, owner, _) = match cluster.volume(name).await {
            Ok(v) => v,
            Err(stria_cluster::ClusterError::NoSuchVolume(_)) => break,
            Err(e) => return Err(e.into()),
        };
        if owner.is_none() && cluster.delete_unowned(name).await?.is_some() {
            break;
        }
        if started.elapsed() >= wait {
            bail!(
                "volume {name} is not deleted after {} s; the delete stays pending and its owner, or any \
                 node while it has none, carries it out (`stria cluster status` shows it)",
                wait.as_secs()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    outln!(
        "deleted volume {name} in {} ms; slices free: {}",
        started.elapsed().as_millis(),
        claimed.join(", ")
    );
    Ok(())
}

/// Asks for a resize and waits until the spec says the new size (docs/design/cluster.md §6.5).
async fn volume_resize(cluster: &Cluster, name: &str, to: &ResizeArgs, wait: Duration) -> Result<()> {
    let started = Instant::now();
    let size = to.size;
    let was = cluster.request_resize(name, size, to.allow_shrink, to.force).await?;
    if was == size {
        outln!("volume {name} is {} already", format_size(size));
        return Ok(());
    }
    loop {
        let (spec, _, _) = cluster.volume(name).await?;
        match cluster.resize_of(name).await? {
            None if spec.size_bytes == size => break,
            None => bail!("the resize of {name} was given up (it is {} bytes)", spec.size_bytes),
            Some((r, revision)) if r.size_bytes == size && r.error.is_some() => {
                cluster.end_resize(name, revision).await?;
                bail!(
                    "volume {name}'s owner cannot make it {}: {}",
                    format_size(size),
                    r.error.unwrap_or_default()
                );
            }
            Some((r, _)) if r.size_bytes != size => {
                bail!("another resize of {name}, to {} bytes, replaced this one", r.size_bytes)
            }
            Some(_) => {}
        }
        if started.elapsed() >= wait {
            bail!(
                "volume {name} is not resized after {} s; the resize stays pending and its owner carries it \
                 out (`stria cluster status` shows it)",
                wait.as_secs()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    outln!(
        "resized volume {name} from {} to {} in {} ms; NBD clients see the new size when they connect again",
        format_size(was),
        format_size(size),
        started.elapsed().as_millis()
    );
    Ok(())
}

/// The cluster's records at `at`.
async fn connect(at: &EtcdArgs) -> Result<Cluster> {
    Ok(Cluster::connect(&at.etcd, Keys::new(&at.prefix)).await?)
}

async fn status(at: &EtcdArgs, as_json: bool) -> Result<()> {
    let cluster = connect(at).await?;
    let status = cluster.status().await?;
    if as_json {
        outln!("{}", serde_json::to_string_pretty(&status)?);
        return Ok(());
    }
    let e = &status.etcd;
    outln!(
        "etcd: {} member(s) ({}), leader {} (raft term {})",
        e.members.len(),
        e.members.join(", "),
        e.leader.as_deref().unwrap_or("none: no quorum"),
        e.raft_term
    );
    outln!("{} node(s) alive:", status.nodes.len());
    for n in &status.nodes {
        let slices: Vec<String> = n.slices.iter().map(|s| format!("{}:{}MiB", s.id, s.bytes >> 20)).collect();
        outln!(
            "  {}  slices {} at {}  NBD {}",
            n.name,
            slices.join(" "),
            n.slice_addr,
            n.nbd_addr.as_deref().unwrap_or("-")
        );
    }
    for c in &status.cordons {
        let age = now_unix().saturating_sub(c.since_unix);
        let alive = if status.nodes.iter().any(|n| n.name == c.node) { "" } else { ", not alive" };
        let reason = if c.reason.is_empty() { String::new() } else { format!(": {}", c.reason) };
        outln!("  {} cordoned {age} s ago{alive}{reason}", c.node);
    }
    outln!("{} volume(s):", status.volumes.len());
    for v in &status.volumes {
        let mut owner = match (&v.owner, v.epoch) {
            (Some(o), Some(e)) => {
                format!("owner {o} epoch {e} nbd://{}/{}", v.nbd.as_deref().unwrap_or("?"), v.name)
            }
            _ => "no owner (waiting for a node to take it)".into(),
        };
        if let Some(to) = &v.moving_to {
            owner = format!("{owner} (moving to {to})");
        }
        if v.deleting {
            owner = format!("{owner} (being deleted)");
        }
        match (v.resizing_to, &v.resize_error) {
            (Some(to), None) => owner = format!("{owner} (being resized to {})", format_size(to)),
            (Some(to), Some(why)) => {
                owner = format!("{owner} (resize to {} refused: {why})", format_size(to))
            }
            _ => {}
        }
        if v.clients > 0 {
            owner = format!("{owner}, {} client(s)", v.clients);
        }
        let out: Vec<String> = v.out.iter().map(|o| format!("{} ({})", o.slice, o.reason)).collect();
        outln!(
            "  {} {} {}  in: {}  rebuilding: {}  out: {}",
            v.name,
            v.layout,
            owner,
            v.in_service.join(","),
            if v.rebuilding.is_empty() { "-".into() } else { v.rebuilding.join(",") },
            if out.is_empty() { "-".into() } else { out.join(",") }
        );
    }
    Ok(())
}
