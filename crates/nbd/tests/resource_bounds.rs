//! What hostile or careless clients can make the server hold: places in the handshake and in
//! transmission (server-wide and per peer).
#![allow(clippy::cast_possible_truncation)] // test inputs are small, known sizes

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::common::{Client, fixture_with, info_data};
use stria_nbd::proto::{self, cmd, opt, rep};
use stria_nbd::{Limits, ListenAddr, Server, ServerHandle, ServerStats};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpSocket, TcpStream, UnixStream};

fn socket_path(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("stria-nbd-bounds-{}-{tag}.sock", std::process::id()))
}

async fn unix_client(path: &Path) -> Client<UnixStream> {
    Client { stream: UnixStream::connect(path).await.unwrap() }
}

/// A TCP connection to `server` from the loopback address `source` (all of 127.0.0.0/8 is
/// loopback on Linux, so tests can be several peers).
async fn tcp_from(source: &str, server: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(source.parse().unwrap(), 0)).unwrap();
    socket.connect(server).await.unwrap()
}

async fn serve_tcp(server: &Server) -> (ServerHandle, SocketAddr) {
    let handle = server.serve_tcp("127.0.0.1:0").await.unwrap();
    let ListenAddr::Tcp(addr) = handle.local_addr().clone() else { panic!("tcp address expected") };
    (handle, addr)
}

/// Polls `condition` on the server's stats until it holds (panics after 10 s).
async fn wait_for_stats(
    server: &Server,
    what: &str,
    condition: impl Fn(&ServerStats) -> bool,
) -> ServerStats {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stats = server.stats();
        if condition(&stats) {
            return stats;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}: {stats:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A silent socket got a place in the handshake: the server greeted it.
async fn greeted<S: tokio::io::AsyncRead + Unpin>(stream: &mut S) -> bool {
    let mut greeting = [0u8; 18];
    matches!(tokio::time::timeout(Duration::from_secs(5), stream.read_exact(&mut greeting)).await, Ok(Ok(_)))
}

/// Sends `NBD_OPT_GO` for `export` and returns the final reply's type and message.
async fn go<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    client: &mut Client<S>,
    export: &str,
) -> (u32, String) {
    client.send_option(opt::GO, &info_data(export, &[])).await;
    let last = client.read_option_replies().await.pop().unwrap();
    (last.reply_type, String::from_utf8_lossy(&last.data).into_owned())
}

/// A write and a read of it back, with simple replies.
async fn round_trip<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    client: &mut Client<S>,
    tag: u8,
) {
    client.send_request(cmd::WRITE, 0, 1, 4096, 512, &[tag; 512]).await;
    assert_eq!(client.read_reply().await.error(), 0);
    client.send_request(cmd::READ, 0, 2, 4096, 512, &[]).await;
    assert_eq!(client.read_reply().await.error(), 0);
    assert_eq!(client.read_exact_data(512).await, vec![tag; 512]);
}

/// Issue item 1: more silent sockets than the old single limit (128), all from one peer, with
/// the default limits. The peer gets `max_handshaking_per_peer` places; a client from another
/// address still completes its handshake and does I/O, long before the handshake timeout.
#[tokio::test]
async fn silent_sockets_from_one_peer_leave_room_for_other_peers() {
    let limits = Limits { handshake_timeout: Duration::from_secs(60), ..Limits::default() };
    let per_peer = limits.max_handshaking_per_peer;
    let fx = fixture_with(limits);
    let (handle, addr) = serve_tcp(&fx.server).await;
    let mut silent = Vec::new();
    for _ in 0..200 {
        silent.push(tcp_from("127.0.0.1", addr).await);
    }
    let stats = wait_for_stats(&fx.server, "all silent sockets accepted", |stats| {
        stats.handshaking + stats.refused_connections as usize == 200
    })
    .await;
    assert_eq!(stats.handshaking, per_peer, "{stats:?}");

    let started = Instant::now();
    let mut client = Client { stream: tcp_from("127.0.0.2", addr).await };
    client.handshake("disk", false, false).await;
    round_trip(&mut client, 7).await;
    assert!(started.elapsed() < Duration::from_secs(5));
    drop(silent);
    handle.shutdown().await;
}

/// Issue item 1: connections still in the handshake do not take places in transmission, and a
/// handshake that ends while transmission is full is told so (`NBD_REP_ERR_POLICY` to
/// `NBD_OPT_GO`) and may try again. Unix sockets: no per-peer limit.
#[tokio::test]
async fn silent_sockets_do_not_take_places_in_transmission() {
    let limits = Limits {
        max_handshaking: 16,
        max_connections: 2,
        handshake_timeout: Duration::from_secs(60),
        ..Limits::default()
    };
    let fx = fixture_with(limits);
    let path = socket_path("transmission-places");
    let handle = fx.server.serve_unix(&path).unwrap();
    let mut silent = Vec::new();
    for _ in 0..10 {
        let mut socket = UnixStream::connect(&path).await.unwrap();
        assert!(greeted(&mut socket).await);
        silent.push(socket);
    }

    let mut first = unix_client(&path).await;
    first.handshake("disk", false, false).await;
    round_trip(&mut first, 1).await;
    let mut second = unix_client(&path).await;
    second.handshake("disk", false, false).await;
    round_trip(&mut second, 2).await;

    let mut third = unix_client(&path).await;
    third.greet(proto::CLIENT_FIXED_NEWSTYLE | proto::CLIENT_NO_ZEROES).await;
    let (reply_type, message) = go(&mut third, "disk").await;
    assert_eq!(reply_type, rep::ERR_POLICY, "{message}");
    assert!(message.contains("2 connections in transmission"), "{message}");
    let stats = fx.server.stats();
    assert_eq!((stats.handshaking, stats.transmitting), (11, 2), "{stats:?}");

    // A place frees up: the same handshake goes on.
    first.send_request(cmd::DISC, 0, 9, 0, 0, &[]).await;
    assert!(first.is_closed().await);
    wait_for_stats(&fx.server, "a free place in transmission", |stats| stats.transmitting == 1).await;
    let (reply_type, message) = go(&mut third, "disk").await;
    assert_eq!(reply_type, rep::ACK, "{message}");
    round_trip(&mut third, 3).await;
    round_trip(&mut second, 4).await;
    drop(silent);
    handle.shutdown().await;
}

/// Issue item 1, per peer: one address gets `max_handshaking_per_peer` places in the handshake
/// and `max_connections_per_peer` in transmission; the next connection from it is refused while
/// the server keeps answering that peer's other connections and other peers.
#[tokio::test]
async fn per_peer_limits_refuse_only_that_peer() {
    let limits = Limits {
        max_handshaking_per_peer: 3,
        max_connections_per_peer: 2,
        handshake_timeout: Duration::from_secs(60),
        ..Limits::default()
    };
    let fx = fixture_with(limits);
    let (handle, addr) = serve_tcp(&fx.server).await;

    let mut silent = Vec::new();
    for _ in 0..3 {
        let mut socket = tcp_from("127.0.0.1", addr).await;
        assert!(greeted(&mut socket).await);
        silent.push(socket);
    }
    let mut refused = Client { stream: tcp_from("127.0.0.1", addr).await };
    assert!(refused.is_closed().await, "a fourth handshake from one peer is refused");
    let mut other = Client { stream: tcp_from("127.0.0.2", addr).await };
    other.handshake("disk", false, false).await;
    round_trip(&mut other, 1).await;
    drop(silent);
    wait_for_stats(&fx.server, "silent sockets gone", |stats| stats.handshaking == 0).await;

    let mut first = Client { stream: tcp_from("127.0.0.1", addr).await };
    first.handshake("disk", false, false).await;
    let mut second = Client { stream: tcp_from("127.0.0.1", addr).await };
    second.handshake("disk", false, false).await;
    let mut third = Client { stream: tcp_from("127.0.0.1", addr).await };
    third.greet(proto::CLIENT_FIXED_NEWSTYLE | proto::CLIENT_NO_ZEROES).await;
    let (reply_type, message) = go(&mut third, "disk").await;
    assert_eq!(reply_type, rep::ERR_POLICY, "{message}");
    assert!(message.contains("this client address"), "{message}");
    let mut other_second = Client { stream: tcp_from("127.0.0.2", addr).await };
    other_second.handshake("disk", false, false).await;
    for (tag, client) in [&mut first, &mut second, &mut other, &mut other_second].into_iter().enumerate() {
        round_trip(client, tag as u8).await;
    }
    handle.shutdown().await;
}
