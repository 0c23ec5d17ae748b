//! What hostile or careless clients can make the server hold: places in the handshake and in
//! transmission (server-wide and per peer), bytes in flight per connection and server-wide,
//! replies nobody reads, and log lines.
#![allow(clippy::cast_possible_truncation)] // test inputs are small, known sizes

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{
    Client, GatedExport, connect, fixture_on_threads, fixture_with, gated_server, info_data, round_trip,
    serve_tcp, tcp_from, wait_for_stats,
};
use stria_nbd::Limits;
use stria_nbd::proto::{self, cmd, opt, rep};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

const MIB: usize = 1 << 20;

/// A socket's path in the temporary directory, removed when dropped: a test that fails leaves
/// no file behind.
struct SocketPath(PathBuf);

impl Drop for SocketPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

impl std::ops::Deref for SocketPath {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for SocketPath {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

fn socket_path(tag: &str) -> SocketPath {
    SocketPath(std::env::temp_dir().join(format!("stria-nbd-bounds-{}-{tag}.sock", std::process::id())))
}

async fn unix_client(path: &Path) -> Client<UnixStream> {
    Client { stream: UnixStream::connect(path).await.unwrap() }
}

/// Waits until `probe` has not changed for 300 ms (panics after 10 s).
async fn wait_until_stable<T: PartialEq + std::fmt::Debug>(probe: impl Fn() -> T) -> T {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut last = probe();
    let mut since = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(25)).await;
        let now = probe();
        if now != last {
            last = now;
            since = Instant::now();
        } else if since.elapsed() >= Duration::from_millis(300) {
            return last;
        }
        assert!(Instant::now() < deadline, "never settled: {last:?}");
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

/// Issue item 1: more silent sockets than the old single limit (128), all from one peer, with
/// the default limits. The peer keeps `max_handshaking_per_peer` places (each new socket takes
/// the place of its oldest silent one); a client from another address still completes its
/// handshake and does I/O, long before the handshake timeout.
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
        stats.handshaking + stats.evicted_handshakes as usize == 200
    })
    .await;
    assert_eq!(stats.handshaking, per_peer, "{stats:?}");
    assert_eq!(stats.refused_connections, 0, "{stats:?}");

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
/// (a new connection from it takes the place of its own oldest silent one) and
/// `max_connections_per_peer` in transmission (the next handshake from it is refused); the
/// server keeps answering that peer's other connections and other peers.
#[tokio::test]
async fn per_peer_limits_hold_back_only_that_peer() {
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
    let mut fourth = Client { stream: tcp_from("127.0.0.1", addr).await };
    let mut oldest = Client { stream: silent.remove(0) };
    assert!(oldest.is_closed().await, "the peer's oldest silent handshake gave way to its fourth");
    fourth.handshake("disk", false, false).await;
    drop(fourth);
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
    assert!(message.contains("this client (127.0.0.1)"), "{message}");
    let mut other_second = Client { stream: tcp_from("127.0.0.2", addr).await };
    other_second.handshake("disk", false, false).await;
    for (tag, client) in [&mut first, &mut second, &mut other, &mut other_second].into_iter().enumerate() {
        round_trip(client, tag as u8).await;
    }
    handle.shutdown().await;
}

/// Issue item 2, per connection: the in-flight byte limit is a bound, not a threshold that the
/// last admitted request may cross. With 4 MiB requests and a 10 MiB limit, two are started, not
/// three (reads and writes alike).
#[tokio::test]
async fn one_connection_holds_at_most_max_in_flight_bytes() {
    let (export, gate) = GatedExport::new(64 << 20, false);
    let limits = Limits { max_in_flight_bytes: 10 * MIB, ..Limits::default() };
    let server = gated_server(limits, export.clone());
    let mut client = connect(&server);
    client.handshake("gated", false, false).await;
    for cookie in 0..10u64 {
        client.send_request(cmd::READ, 0, cookie, cookie * 4 * MIB as u64, 4 * MIB as u32, &[]).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(export.started(), 2, "requests started beyond the byte limit");
    let stats = server.stats();
    assert!(stats.held_bytes <= 10 * MIB && stats.reserved_bytes <= 10 * MIB, "{stats:?}");
    gate.send_replace(true);
    for _ in 0..10 {
        assert_eq!(client.read_reply().await.error(), 0);
        client.read_exact_data(4 * MIB).await;
    }

    gate.send_replace(false);
    let (mut reader, mut writer) = tokio::io::split(client.stream);
    let sender = tokio::spawn(async move {
        let data = vec![5u8; 4 * MIB];
        for cookie in 0..5u64 {
            let mut request = proto::REQUEST_MAGIC.to_be_bytes().to_vec();
            request.extend_from_slice(&0u16.to_be_bytes());
            request.extend_from_slice(&cmd::WRITE.to_be_bytes());
            request.extend_from_slice(&cookie.to_be_bytes());
            request.extend_from_slice(&(cookie * 4 * MIB as u64).to_be_bytes());
            request.extend_from_slice(&(4 * MIB as u32).to_be_bytes());
            writer.write_all(&request).await.unwrap();
            writer.write_all(&data).await.unwrap();
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(export.started(), 12, "writes started beyond the byte limit");
    gate.send_replace(true);
    let mut header = [0u8; 16];
    for _ in 0..5 {
        reader.read_exact(&mut header).await.unwrap();
        assert_eq!(&header[4..8], &[0, 0, 0, 0]);
    }
    sender.await.unwrap();
}

/// Issue item 2, server-wide: clients that send large reads and never read the replies hold at
/// most their guarantees and the shared budget together (each at most `max_in_flight_bytes`). A
/// client that does read is served at once from its own guarantee; a connection that needs shared
/// bytes waits for them (back-pressure, no error) and gets them when they are given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_read_nothing_take_only_the_shared_budget_from_others() {
    let (export, _gate) = GatedExport::new(64 << 20, true);
    let shared = 8 * MIB;
    let limits = Limits {
        max_in_flight_bytes: 16 * MIB,
        max_shared_in_flight_bytes: shared,
        send_timeout: Duration::from_secs(600),
        ..Limits::default()
    };
    let guaranteed = limits.guaranteed_in_flight_bytes();
    let server = gated_server(limits, export.clone());
    let path = socket_path("cap");
    let handle = server.serve_unix(&path).unwrap();

    let mut deaf = Vec::new();
    for _ in 0..3 {
        let mut client = unix_client(&path).await;
        client.handshake("gated", false, false).await;
        for cookie in 0..32u64 {
            client.send_request(cmd::READ, 0, cookie, cookie * 2 * MIB as u64, 2 * MIB as u32, &[]).await;
        }
        deaf.push(client);
    }
    let started_bytes = wait_until_stable(|| export.started_bytes()).await;
    let stats = server.stats();
    let cap = 3 * guaranteed + shared;
    assert!(stats.peak_reserved_bytes <= cap, "{stats:?}");
    assert!(stats.held_bytes <= cap && stats.peak_shared_bytes <= shared, "{stats:?}");
    // Reads produced: what the connections hold plus what fit in the three sockets' buffers.
    assert!(started_bytes <= cap + 3 * MIB, "{} MiB of reads started", started_bytes / MIB);
    assert!(stats.shared_bytes >= shared - 2 * MIB, "the shared budget is in use: {stats:?}");

    // A client that reads is served at once: one request is always within its guarantee.
    let mut reader = unix_client(&path).await;
    reader.handshake("gated", false, false).await;
    reader.send_request(cmd::READ, 0, 77, 0, 2 * MIB as u32, &[]).await;
    let reply = tokio::time::timeout(Duration::from_secs(2), reader.read_reply()).await.expect("served");
    assert_eq!((reply.cookie(), reply.error()), (77, 0));
    reader.read_exact_data(2 * MIB).await;
    // Two requests at once need 2 MiB of shared bytes: the second waits until the deaf clients
    // leave and their bytes go to the waiting reader.
    reader.send_request(cmd::READ, 0, 78, 0, 4 * MIB as u32, &[]).await;
    reader.send_request(cmd::READ, 0, 79, 0, 2 * MIB as u32, &[]).await;
    drop(deaf);
    for cookie in [78, 79] {
        let reply = tokio::time::timeout(Duration::from_secs(10), reader.read_reply()).await.expect("served");
        assert_eq!((reply.cookie(), reply.error()), (cookie, 0));
        reader.read_exact_data(if cookie == 78 { 4 } else { 2 } * MIB).await;
    }
    drop(reader);
    wait_for_stats(&server, "bytes given back", |stats| {
        stats.reserved_bytes == 0 && stats.held_bytes == 0 && stats.shared_bytes == 0
    })
    .await;
    handle.shutdown().await;
}

/// Issue item 2: a client that reads none of its replies is closed after `send_timeout`, which
/// frees what it held; a client that reads slowly but steadily is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_reads_no_replies_is_closed_after_the_send_timeout() {
    let limits = Limits { send_timeout: Duration::from_millis(500), ..Limits::default() };
    let fx = fixture_with(limits);
    let path = socket_path("send-timeout");
    let handle = fx.server.serve_unix(&path).unwrap();

    let mut slow = unix_client(&path).await;
    slow.handshake("disk", false, false).await;
    let slow_reader = tokio::spawn(async move {
        for cookie in 0..4u64 {
            slow.send_request(cmd::READ, 0, cookie, 0, MIB as u32, &[]).await;
        }
        let mut received = 0;
        let mut chunk = vec![0u8; 128 << 10];
        while received < 4 * (16 + MIB) {
            let want = chunk.len().min(4 * (16 + MIB) - received);
            slow.stream.read_exact(&mut chunk[..want]).await.unwrap();
            received += want;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        slow
    });

    let mut deaf = unix_client(&path).await;
    deaf.handshake("disk", false, false).await;
    for cookie in 0..16u64 {
        deaf.send_request(cmd::READ, 0, cookie, 0, MIB as u32, &[]).await;
    }
    wait_for_stats(&fx.server, "the deaf client closed", |stats| stats.stalled_connections_closed == 1).await;
    // What was in the socket buffer, then end of stream: far from all 16 replies.
    let mut received = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), deaf.stream.read_to_end(&mut received))
        .await
        .expect("the server closed the connection")
        .unwrap();
    assert!(received.len() < 4 * MIB, "{} bytes received", received.len());

    let mut slow = slow_reader.await.unwrap();
    round_trip(&mut slow, 9).await;
    let stats = fx.server.stats();
    assert_eq!(stats.stalled_connections_closed, 1, "{stats:?}");
    handle.shutdown().await;
}

/// Log lines written while a test runs on this thread.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}

impl Captured {
    /// Captures warnings logged on this thread (a current-thread runtime runs the server's
    /// tasks here too) until the guard is dropped.
    fn warnings() -> (Captured, tracing::subscriber::DefaultGuard) {
        let captured = Captured::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(captured.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::WARN)
            .finish();
        (captured.clone(), tracing::subscriber::set_default(subscriber))
    }

    fn lines(&self) -> Vec<String> {
        String::from_utf8_lossy(&self.0.lock().unwrap()).lines().map(str::to_owned).collect()
    }
}

/// Issue item 3: 500 connections that each close a handshake to make room log a few warnings,
/// not 500.
#[tokio::test]
async fn a_flood_of_evictions_logs_a_few_warnings() {
    let (captured, _guard) = Captured::warnings();
    let limits =
        Limits { max_handshaking: 1, handshake_timeout: Duration::from_secs(60), ..Limits::default() };
    let fx = fixture_with(limits);
    let path = socket_path("refusal-flood");
    let handle = fx.server.serve_unix(&path).unwrap();
    let mut holder = UnixStream::connect(&path).await.unwrap();
    assert!(greeted(&mut holder).await);
    let mut flood = Vec::new();
    for _ in 0..500 {
        flood.push(unix_client(&path).await);
    }
    wait_for_stats(&fx.server, "500 evictions", |stats| stats.evicted_handshakes == 500).await;
    assert!(holder.read(&mut [0u8; 1]).await.unwrap() == 0, "the first holder gave way");
    drop((holder, flood));
    handle.shutdown().await;
    let lines = captured.lines();
    assert!((1..=3).contains(&lines.len()), "{} warning lines: {lines:#?}", lines.len());
    assert!(lines[0].contains("handshake limit reached"), "{lines:#?}");
    // The summary at shutdown accounts for the rest.
    assert!(lines.iter().any(|line| line.contains("499 more")), "{lines:#?}");
}

/// Issue item 3: a flood of handshake timeouts logs a few warnings, not one per connection.
#[tokio::test]
async fn a_flood_of_handshake_timeouts_logs_a_few_warnings() {
    let (captured, _guard) = Captured::warnings();
    let limits = Limits { handshake_timeout: Duration::from_millis(100), ..Limits::default() };
    let fx = fixture_with(limits);
    let path = socket_path("timeout-flood");
    let handle = fx.server.serve_unix(&path).unwrap();
    let mut silent = Vec::new();
    for _ in 0..50 {
        silent.push(unix_client(&path).await);
    }
    for client in &mut silent {
        let mut greeting = [0u8; 18];
        client.stream.read_exact(&mut greeting).await.unwrap();
        assert!(client.is_closed().await, "closed at the handshake timeout");
    }
    let timeouts = captured.lines().iter().filter(|line| line.contains("timed out")).count();
    assert!((1..=2).contains(&timeouts), "{timeouts} timeout lines: {:#?}", captured.lines());
    handle.shutdown().await;
}

/// Connections on threads of their own (`connection_threads`, docs/design/datapath.md): each
/// accepted connection, Unix or TCP, goes to the thread with the fewest and is served there; the
/// places and limits count them as before; a connection that ends frees its thread's count; a
/// graceful shutdown ends the ones still open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_on_threads_of_their_own_are_spread_served_counted_and_shut_down() {
    let limits = Limits { max_connections: 3, ..Limits::default() };
    let fx = fixture_on_threads(limits, 2);
    let path = socket_path("threads");
    let unix = fx.server.serve_unix(&path).unwrap();
    let (_tcp, addr) = serve_tcp(&fx.server).await;

    let mut first = unix_client(&path).await;
    first.handshake("disk", false, false).await;
    let mut second = Client { stream: tcp_from("127.0.0.1", addr).await };
    second.handshake("disk", false, false).await;
    let mut third = unix_client(&path).await;
    third.handshake("disk", false, false).await;
    for (tag, client) in [(1, &mut first), (3, &mut third)] {
        round_trip(client, tag).await;
    }
    round_trip(&mut second, 2).await;
    let mut per_thread = fx.server.connections_per_thread();
    per_thread.sort_unstable();
    assert_eq!(per_thread, vec![1, 2], "three connections on two threads");
    assert_eq!(fx.server.stats().transmitting, 3);

    // The limit holds across threads: a fourth is refused in its handshake.
    let mut fourth = unix_client(&path).await;
    fourth.greet(proto::CLIENT_FIXED_NEWSTYLE | proto::CLIENT_NO_ZEROES).await;
    let (reply_type, message) = go(&mut fourth, "disk").await;
    assert_eq!(reply_type, rep::ERR_POLICY, "{message}");

    // One ends: its thread's count goes down, and the fourth's handshake goes on.
    second.send_request(cmd::DISC, 0, 9, 0, 0, &[]).await;
    assert!(second.is_closed().await);
    wait_for_stats(&fx.server, "a free place in transmission", |stats| stats.transmitting == 2).await;
    let (reply_type, message) = go(&mut fourth, "disk").await;
    assert_eq!(reply_type, rep::ACK, "{message}");
    round_trip(&mut fourth, 4).await;
    assert_eq!(
        fx.server.connections_per_thread().iter().sum::<usize>(),
        3,
        "the first, the third and the fourth"
    );
    drop(fourth);
    wait_for_stats(&fx.server, "the fourth gone", |stats| stats.transmitting == 2).await;

    tokio::time::timeout(Duration::from_secs(20), unix.shutdown()).await.expect("graceful shutdown ends");
    assert!(
        first.is_closed().await && third.is_closed().await,
        "shutdown closed the connections on the threads"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while fx.server.connections_per_thread() != vec![0, 0] {
        assert!(Instant::now() < deadline, "threads still count {:?}", fx.server.connections_per_thread());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
