//! Malformed streams, limits, disconnects with replies in flight, graceful shutdown, over real
//! Unix sockets where it matters.
#![allow(clippy::cast_possible_truncation)] // test inputs are small, known sizes

use std::time::Duration;

use crate::common::{Client, GatedExport, Reply, connect, fixture, fixture_with, gated_server};
use stria_nbd::proto::cmd;
use stria_nbd::{Limits, ListenAddr};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

fn socket_path(tag: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("stria-nbd-test-{}-{tag}.sock", std::process::id()))
}

async fn unix_client(path: &std::path::Path) -> Client<UnixStream> {
    Client { stream: UnixStream::connect(path).await.unwrap() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_stream_closes_only_that_connection() {
    let fx = fixture();
    let path = socket_path("malformed");
    let handle = fx.server.serve_unix(&path).unwrap();
    assert_eq!(handle.local_addr(), &ListenAddr::Unix(path.clone()));

    let mut good = unix_client(&path).await;
    good.handshake("disk", true, false).await;
    let mut evil = unix_client(&path).await;
    evil.handshake("disk", false, false).await;
    // Garbage instead of a request header.
    evil.stream.write_all(&[0xde; 64]).await.unwrap();
    assert!(evil.is_closed().await);
    // A write announcing more than the payload limit.
    let mut evil = unix_client(&path).await;
    evil.handshake("disk", false, false).await;
    evil.send_request(cmd::WRITE, 0, 1, 0, u32::MAX, &[]).await;
    assert!(evil.is_closed().await);
    // A client that stops in the middle of a write payload.
    let mut evil = unix_client(&path).await;
    evil.handshake("disk", false, false).await;
    evil.send_request(cmd::WRITE, 0, 1, 0, 4096, &[1; 100]).await;
    drop(evil);

    for cookie in 0..100u64 {
        good.send_request(cmd::WRITE, 0, cookie, cookie * 512, 512, &[cookie as u8; 512]).await;
        assert_eq!(good.read_reply().await, Reply::Simple { cookie, error: 0 });
    }
    handle.shutdown().await;
    assert!(!path.exists(), "socket file removed at shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_vanishing_with_replies_in_flight_does_not_hurt_the_server() {
    let fx = fixture();
    let path = socket_path("vanish");
    let handle = fx.server.serve_unix(&path).unwrap();
    for round in 0..20 {
        let mut c = unix_client(&path).await;
        c.handshake("disk", round % 2 == 0, false).await;
        let mut batch = Vec::new();
        for cookie in 0..64u64 {
            batch.extend_from_slice(&stria_nbd::proto::REQUEST_MAGIC.to_be_bytes());
            batch.extend_from_slice(&0u16.to_be_bytes());
            batch.extend_from_slice(&cmd::READ.to_be_bytes());
            batch.extend_from_slice(&cookie.to_be_bytes());
            batch.extend_from_slice(&(cookie * 65536 % crate::common::DISK_BYTES).to_be_bytes());
            batch.extend_from_slice(&65536u32.to_be_bytes());
        }
        c.stream.write_all(&batch).await.unwrap();
        if round % 3 == 0 {
            let mut some = [0u8; 100];
            let _ = c.stream.read(&mut some).await;
        }
        drop(c);
    }
    // The server still serves.
    let mut c = unix_client(&path).await;
    c.handshake("disk", false, false).await;
    c.send_request(cmd::FLUSH, 0, 9, 0, 0, &[]).await;
    assert_eq!(c.read_reply().await, Reply::Simple { cookie: 9, error: 0 });
    handle.shutdown().await;
}

#[tokio::test]
async fn in_flight_limits_bound_what_a_client_can_queue() {
    let limits = Limits { max_requests_in_flight: 4, max_in_flight_bytes: 64 << 10, ..Limits::default() };
    let fx = fixture_with(limits);
    // A small pipe: the server can only make progress as fast as the client reads.
    let (client, server_side) = tokio::io::duplex(8 << 10);
    let server = fx.server.clone();
    tokio::spawn(async move { server.serve_stream(server_side, "limits").await });
    let mut c = Client { stream: client };
    c.handshake("disk", false, false).await;
    let (mut reader, mut writer) = tokio::io::split(c.stream);
    let sender = tokio::spawn(async move {
        for cookie in 0..500u64 {
            let mut request = stria_nbd::proto::REQUEST_MAGIC.to_be_bytes().to_vec();
            request.extend_from_slice(&0u16.to_be_bytes());
            request.extend_from_slice(&cmd::READ.to_be_bytes());
            request.extend_from_slice(&cookie.to_be_bytes());
            request.extend_from_slice(&0u64.to_be_bytes());
            request.extend_from_slice(&32768u32.to_be_bytes());
            writer.write_all(&request).await.unwrap();
        }
        writer
    });
    // Do not read for a while: the server must stall rather than buffer 500 x 32 KiB.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut seen = 0;
    let mut header = [0u8; 16];
    while seen < 500 {
        reader.read_exact(&mut header).await.unwrap();
        assert_eq!(&header[4..8], &[0, 0, 0, 0]);
        let mut data = vec![0u8; 32768];
        reader.read_exact(&mut data).await.unwrap();
        seen += 1;
    }
    sender.await.unwrap();
}

/// With the handshake places full, a new connection is not refused: the handshake with the
/// weakest claim (here the one that sent nothing) is closed to make room, and a handshake whose
/// client is talking goes on.
#[tokio::test]
async fn a_full_handshake_budget_closes_the_silent_handshake_for_a_newcomer() {
    let fx = fixture_with(Limits { max_handshaking: 2, ..Limits::default() });
    let mut talking = connect(&fx.server);
    talking.greet(stria_nbd::proto::CLIENT_FIXED_NEWSTYLE).await;
    let mut silent = connect(&fx.server);
    let mut greeting = [0u8; 18];
    silent.stream.read_exact(&mut greeting).await.unwrap();
    let mut newcomer = connect(&fx.server);
    assert!(silent.is_closed().await, "the silent handshake gave way");
    // The talking one finishes its handshake; entering transmission frees its handshake place.
    talking.send_option(stria_nbd::proto::opt::GO, &crate::common::info_data("disk", &[])).await;
    let replies = talking.read_option_replies().await;
    assert_eq!(replies.last().unwrap().reply_type, stria_nbd::proto::rep::ACK);
    newcomer.handshake("disk", false, false).await;
    talking.send_request(cmd::FLUSH, 0, 1, 0, 0, &[]).await;
    assert_eq!(talking.read_reply().await.error(), 0);
    newcomer.send_request(cmd::FLUSH, 0, 2, 0, 0, &[]).await;
    assert_eq!(newcomer.read_reply().await.error(), 0);
    let stats = fx.server.stats();
    assert_eq!((stats.evicted_handshakes, stats.transmitting), (1, 2), "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_finishes_in_flight_work_and_flushes() {
    let fx = fixture();
    let path = socket_path("shutdown");
    let handle = fx.server.serve_unix(&path).unwrap();
    let mut c = unix_client(&path).await;
    c.handshake("disk", false, false).await;
    c.send_request(cmd::WRITE, 0, 1, 0, 4, b"data").await;
    assert_eq!(c.read_reply().await.error(), 0);
    let mut idle = unix_client(&path).await;
    idle.greet(1).await; // stays in the handshake
    let flushes = fx.disk.flush_count();
    tokio::time::timeout(Duration::from_secs(10), handle.shutdown()).await.expect("shutdown finishes");
    assert!(fx.disk.flush_count() > flushes, "export flushed at shutdown");
    assert!(c.is_closed().await);
    assert!(idle.is_closed().await);
    assert!(UnixStream::connect(&path).await.is_err(), "no longer accepting");
}

#[tokio::test]
async fn tcp_listener_serves() {
    let fx = fixture();
    let handle = fx.server.serve_tcp("127.0.0.1:0").await.unwrap();
    let ListenAddr::Tcp(addr) = handle.local_addr().clone() else { panic!("tcp address expected") };
    let mut c = Client { stream: tokio::net::TcpStream::connect(addr).await.unwrap() };
    c.handshake("disk", true, true).await;
    c.send_request(cmd::READ, 0, 1, 0, 4096, &[]).await;
    let Reply::Chunk { payload, .. } = c.read_reply().await else { panic!() };
    assert_eq!(payload.len(), 8 + 4096);
    handle.shutdown().await;
}

#[tokio::test]
async fn requests_beyond_the_in_flight_limit_are_not_started_and_vanished_clients_finish() {
    let (export, gate) = GatedExport::new(1 << 20, false);
    let limits = Limits { max_requests_in_flight: 8, ..Limits::default() };
    let server = gated_server(limits, export.clone());
    let mut c = connect(&server);
    c.handshake("gated", false, false).await;
    for cookie in 0..100u64 {
        c.send_request(cmd::READ, 0, cookie, cookie * 4096, 4096, &[]).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(export.started(), 8, "only the limit is started");
    gate.send_replace(true);
    for _ in 0..100 {
        assert_eq!(c.read_reply().await.error(), 0);
        c.read_exact_data(4096).await;
    }
    // A client that leaves while its reads wait: the server finishes them and moves on.
    gate.send_replace(false);
    let mut c = connect(&server);
    c.handshake("gated", false, false).await;
    for cookie in 0..8u64 {
        c.send_request(cmd::READ, 0, cookie, 0, 4096, &[]).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    drop(c);
    gate.send_replace(true);
    let mut c = connect(&server);
    c.handshake("gated", false, false).await;
    c.send_request(cmd::FLUSH, 0, 1, 0, 0, &[]).await;
    assert_eq!(c.read_reply().await.error(), 0);
}
