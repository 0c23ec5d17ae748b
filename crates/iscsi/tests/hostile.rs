//! Hostile and broken initiators against a real listener: oversized and malformed PDUs, wrong
//! digests, logins that stall, more connections and logins than allowed. Each gets a clear end
//! (the connection closed, the login refused) and the target goes on serving the others.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use stria_front::Registry;
use stria_iscsi::pdu::{Bhs, op};
use stria_iscsi::testing::MemVolume;
use stria_iscsi::{Target, TargetConfig};
use stria_volume::BlockVolume;
use tokio::io::AsyncWriteExt;

use crate::client::{Client, read10, write10};

const TARGET: &str = "iqn.2026-11.io.stria:t:v";

async fn serve(config: TargetConfig) -> (SocketAddr, Arc<Target>) {
    let registry = Arc::new(Registry::new());
    registry.insert("v", Arc::new(MemVolume::new(false)) as Arc<dyn BlockVolume>);
    let target = Target::new(registry, TargetConfig { pool: "t".into(), ..config });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(Arc::clone(&target).serve(listener));
    (addr, target)
}

/// A logged-in client writes and reads back a pattern (the target still serves).
async fn still_served(addr: SocketAddr) {
    let mut c = Client::connect(addr).await;
    c.login(TARGET, &[]).await.expect("login");
    let data = vec![0x5A; 4096];
    let w = c.command(&write10(16, 8), &data, 4096, 0).await;
    assert_eq!(w.status, 0, "write: {:02x?}", w.sense);
    let r = c.command(&read10(16, 8), &[], 0, 4096).await;
    assert_eq!((r.status, r.data), (0, data));
}

#[tokio::test]
async fn oversized_and_malformed_pdus_close_only_their_connection() {
    let (addr, target) = serve(TargetConfig::default()).await;
    // A login announcing a 16 MiB data segment: refused from its header, nothing more read.
    let mut big = Client::connect(addr).await;
    let mut bhs = Bhs::new(op::LOGIN);
    bhs.0[0] |= 0x40;
    bhs.0[1] = 0x87;
    bhs.0[5..8].copy_from_slice(&[0xFF, 0xFF, 0xFF]);
    big.stream.write_all(&bhs.0).await.expect("send");
    assert!(
        big.closed_within(Duration::from_secs(5)).await,
        "an oversized segment must close the connection"
    );
    // Garbage instead of a login.
    let mut junk = Client::connect(addr).await;
    junk.stream.write_all(&[0xEE; 4096]).await.expect("send");
    assert!(junk.closed_within(Duration::from_secs(5)).await, "garbage must close the connection");
    // A PDU with an opcode the full feature phase has no use for.
    let mut odd = Client::connect(addr).await;
    odd.login(TARGET, &[]).await.expect("login");
    odd.send(Bhs::new(0x3E), &[]).await.expect("send");
    let reject = odd.read().await.expect("a reject");
    assert_eq!((reject.bhs.opcode(), reject.bhs.0[2]), (op::REJECT, 0x04));
    assert!(odd.closed_within(Duration::from_secs(5)).await);
    still_served(addr).await;
    assert!(target.counters.protocol_errors.load(Ordering::Relaxed) >= 1);
}

#[tokio::test]
async fn a_wrong_header_digest_closes_the_connection() {
    let (addr, _target) = serve(TargetConfig::default()).await;
    let mut c = Client::connect(addr).await;
    let keys =
        c.login(TARGET, &[("HeaderDigest", "CRC32C,None"), ("DataDigest", "CRC32C")]).await.expect("login");
    assert!(keys.contains(&("HeaderDigest".into(), "CRC32C".into())), "{keys:?}");
    // With digests on, a command round-trips...
    assert_eq!(c.ping(b"hello").await, b"hello");
    let r = c.command(&read10(0, 1), &[], 0, 512).await;
    assert_eq!((r.status, r.data.len()), (0, 512));
    // ...and a header whose digest is wrong ends the connection.
    let mut bhs = Bhs::new(op::NOP_OUT);
    bhs.0[0] |= 0x40;
    bhs.0[1] = 0x80;
    let mut wire = bhs.0.to_vec();
    wire.extend_from_slice(&[1, 2, 3, 4]);
    c.stream.write_all(&wire).await.expect("send");
    assert!(c.closed_within(Duration::from_secs(5)).await);
    still_served(addr).await;
}

#[tokio::test]
async fn a_login_that_stalls_is_closed_after_the_timeout() {
    let config = TargetConfig { login_timeout: Duration::from_millis(300), ..TargetConfig::default() };
    let (addr, target) = serve(config).await;
    let mut c = Client::connect(addr).await;
    c.stream.write_all(&[0x43, 0x87, 0, 0]).await.expect("half a header");
    let started = std::time::Instant::now();
    assert!(c.closed_within(Duration::from_secs(5)).await);
    assert!(started.elapsed() >= Duration::from_millis(250), "closed before the timeout");
    assert_eq!(target.counters.failed_logins.load(Ordering::Relaxed), 1);
    still_served(addr).await;
}

#[tokio::test]
async fn connections_and_logins_beyond_their_bounds_are_refused_and_the_others_served() {
    let config = TargetConfig { max_connections: 4, max_logins: 2, ..TargetConfig::default() };
    let (addr, target) = serve(config).await;
    // Two logins in progress (stalled): a third login is refused at once.
    let mut stalled = Vec::new();
    for _ in 0..2 {
        let mut c = Client::connect(addr).await;
        c.stream.write_all(&[0x43]).await.expect("one byte");
        stalled.push(c);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut third = Client::connect(addr).await;
    assert!(third.closed_within(Duration::from_secs(5)).await, "a login beyond the bound must be refused");
    drop(third);
    drop(stalled);
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Four sessions: a fifth connection is closed at accept; one ends, and a new one is served.
    let mut sessions = Vec::new();
    for _ in 0..4 {
        let mut c = Client::connect(addr).await;
        c.login(TARGET, &[]).await.expect("login");
        sessions.push(c);
    }
    let mut fifth = Client::connect(addr).await;
    assert!(fifth.closed_within(Duration::from_secs(5)).await, "a fifth connection must be refused");
    assert!(target.counters.refused_connections.load(Ordering::Relaxed) >= 1);
    for c in &mut sessions {
        assert_eq!(c.ping(b"still here").await, b"still here");
    }
    drop(sessions.pop());
    tokio::time::sleep(Duration::from_millis(200)).await;
    still_served(addr).await;
}

#[tokio::test]
async fn writes_through_r2ts_read_back() {
    let (addr, _target) = serve(TargetConfig::default()).await;
    let mut c = Client::connect(addr).await;
    c.login(TARGET, &[("InitialR2T", "Yes"), ("ImmediateData", "No"), ("MaxBurstLength", "65536")])
        .await
        .expect("login");
    // 1 MiB: sixteen R2Ts of 64 KiB each, every byte distinct enough to catch a misplaced burst.
    let data: Vec<u8> = (0..1 << 20).map(|i: u32| (i % 251) as u8 ^ (i >> 16) as u8).collect();
    let w = c.command(&write10(2048, 2048), &data, 0, 0).await;
    assert_eq!(w.status, 0, "{:02x?}", w.sense);
    let r = c.command(&read10(2048, 2048), &[], 0, 1 << 20).await;
    assert_eq!(r.status, 0);
    assert!(r.data == data, "the data read back differs");
}

#[tokio::test]
async fn shutdown_closes_sessions_logins_and_the_listener() {
    let (addr, target) = serve(TargetConfig::default()).await;
    let mut session = Client::connect(addr).await;
    session.login(TARGET, &[]).await.expect("login");
    let mut logging_in = Client::connect(addr).await;
    logging_in.stream.write_all(&[0x43]).await.expect("one byte of a login");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = std::time::Instant::now();
    target.shutdown(Duration::from_secs(5)).await;
    assert!(started.elapsed() < Duration::from_secs(2), "shutdown waited {:?}", started.elapsed());
    assert!(session.closed_within(Duration::from_secs(1)).await, "the session was not closed");
    assert!(logging_in.closed_within(Duration::from_secs(1)).await, "the login was not ended");
    assert_eq!(target.counters.sessions.load(Ordering::Relaxed), 0);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(tokio::net::TcpStream::connect(addr).await.is_err(), "the listener still accepts");
}

/// Connections on threads of their own (`connection_threads`): each session, with its reader,
/// writer and commands, runs on the connection thread with the fewest; data written through
/// one (in R2T bursts too) reads back through another; shutdown ends them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_on_connection_threads_are_spread_served_and_shut_down() {
    let (addr, target) = serve(TargetConfig { connection_threads: 2, ..TargetConfig::default() }).await;
    let mut sessions = Vec::new();
    for _ in 0..3 {
        let mut c = Client::connect(addr).await;
        c.login(TARGET, &[("InitialR2T", "Yes"), ("ImmediateData", "No"), ("MaxBurstLength", "65536")])
            .await
            .expect("login");
        sessions.push(c);
    }
    let mut per_thread = target.connections_per_thread();
    per_thread.sort_unstable();
    assert_eq!(per_thread, vec![1, 2], "three sessions on two threads");
    for (i, c) in sessions.iter_mut().enumerate() {
        let lba = 512 * u32::try_from(i).expect("small");
        let data: Vec<u8> = (0..256 << 10).map(|b: u32| (b % 253) as u8 ^ i as u8).collect();
        let w = c.command(&write10(lba, 512), &data, 0, 0).await;
        assert_eq!(w.status, 0, "{:02x?}", w.sense);
    }
    for i in 0..3 {
        let reader = &mut sessions[(i + 1) % 3];
        let lba = 512 * u32::try_from(i).expect("small");
        let r = reader.command(&read10(lba, 512), &[], 0, 256 << 10).await;
        let data: Vec<u8> = (0..256 << 10).map(|b: u32| (b % 253) as u8 ^ i as u8).collect();
        assert!(r.status == 0 && r.data == data, "session {i}'s data read through another differs");
    }
    target.shutdown(Duration::from_secs(5)).await;
    for c in &mut sessions {
        assert!(c.closed_within(Duration::from_secs(2)).await, "a session was not closed");
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while target.connections_per_thread() != vec![0, 0] {
        assert!(
            std::time::Instant::now() < deadline,
            "threads still count {:?}",
            target.connections_per_thread()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
