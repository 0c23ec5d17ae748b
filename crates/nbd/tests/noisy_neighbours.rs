//! A well-behaved client beside hostile neighbours on the same server (issue finding 5): sockets
//! that connect and say nothing, from one address, one local user or a continuing flood; clients
//! that pipeline reads and never read a reply. The client must be served within 2 s, with the
//! default limits, and the server must hold well under 512 MiB for the deaf clients.

use std::path::PathBuf;
use std::time::Duration;

use crate::common::{Client, fixture_with, round_trip, serve_tcp, tcp_from};
use stria_nbd::proto::cmd;
use stria_nbd::{Limits, Server};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::UnixStream;

/// How long a well-behaved client may take beside the neighbours (the bound).
const SERVED_WITHIN: Duration = Duration::from_secs(2);
const SILENT_SOCKETS: usize = 200;
const DEAF_CLIENTS: usize = 24;
const MIB: usize = 1 << 20;
/// The bound on the daemon's memory beside the deaf clients.
const MEMORY_BOUND_BYTES: usize = 512 * MIB;

/// A Unix socket path for one test, removed when dropped (also when the test fails: the
/// server's shutdown, which removes it too, is not reached then).
struct SocketPath(PathBuf);

impl SocketPath {
    fn new(tag: &str) -> SocketPath {
        SocketPath(
            std::env::temp_dir().join(format!("stria-nbd-neighbours-{}-{tag}.sock", std::process::id())),
        )
    }
}

impl Drop for SocketPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Handshake, a write and a read back, within `SERVED_WITHIN`.
async fn served<S: AsyncRead + AsyncWrite + Unpin>(client: &mut Client<S>, what: &str) {
    let work = async {
        client.handshake("disk", false, false).await;
        round_trip(client, 0x5a).await;
    };
    tokio::time::timeout(SERVED_WITHIN, work)
        .await
        .unwrap_or_else(|_| panic!("{what}: not served within {SERVED_WITHIN:?}"));
}

/// Waits until the server has accepted what was connected: its handshake count stops changing.
async fn settled(server: &Server) {
    let mut last = server.stats();
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = server.stats();
        if now == last {
            return;
        }
        last = now;
    }
}

/// 200 silent Unix sockets of one local user (here root, as the tests run): before, they held
/// all 64 handshake places and every newcomer was closed at once until the handshake timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_is_served_beside_200_silent_unix_sockets() {
    let fx = fixture_with(Limits::default());
    let socket = SocketPath::new("silent-unix");
    let path = socket.0.clone();
    let handle = fx.server.serve_unix(&path).unwrap();
    let mut silent = Vec::new();
    for _ in 0..SILENT_SOCKETS {
        silent.push(UnixStream::connect(&path).await.unwrap());
    }
    settled(&fx.server).await;
    let mut client = Client { stream: UnixStream::connect(&path).await.unwrap() };
    served(&mut client, "beside 200 silent Unix sockets").await;
    drop(silent);
    handle.shutdown().await;
}

/// The same from one TCP address that the client shares (one host, or one NAT): before, the
/// address's 16 handshake places were full and its newcomers were closed at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_is_served_beside_200_silent_sockets_from_its_own_address() {
    let fx = fixture_with(Limits::default());
    let (handle, addr) = serve_tcp(&fx.server).await;
    let mut silent = Vec::new();
    for _ in 0..SILENT_SOCKETS {
        silent.push(tcp_from("127.0.0.1", addr).await);
    }
    settled(&fx.server).await;
    let mut client = Client { stream: tcp_from("127.0.0.1", addr).await };
    served(&mut client, "beside 200 silent sockets from its address").await;
    drop(silent);
    handle.shutdown().await;
}

/// Silent sockets keep coming while the client negotiates (one every 2 ms, more than the
/// handshake places in the client's time): the client's handshake outlasts them once it talks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_is_served_during_a_continuing_flood_of_silent_sockets() {
    let fx = fixture_with(Limits::default());
    let socket = SocketPath::new("silent-flood");
    let path = socket.0.clone();
    let handle = fx.server.serve_unix(&path).unwrap();
    let flood = {
        let path = path.clone();
        tokio::spawn(async move {
            let mut silent = Vec::new();
            loop {
                if let Ok(socket) = UnixStream::connect(&path).await {
                    silent.push(socket);
                }
                if silent.len() > 1000 {
                    silent.drain(..500);
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    for round in 0..5 {
        let mut client = Client { stream: UnixStream::connect(&path).await.unwrap() };
        served(&mut client, &format!("during a flood, client {round}")).await;
    }
    flood.abort();
    let _ = flood.await;
    handle.shutdown().await;
}

/// 24 clients pipeline 1 MiB reads and never read a reply. Before, each could hold 64 MiB (and
/// 16 of them the whole 1 GiB server-wide budget): the server held 1 GiB for them and a client
/// that reads waited for `send_timeout` (60 s). Now each holds its guarantee and a share of the
/// shared budget, and the reader is served from its own guarantee at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_is_served_beside_24_clients_that_never_read() {
    let fx = fixture_with(Limits::default());
    let socket = SocketPath::new("deaf");
    let path = socket.0.clone();
    let handle = fx.server.serve_unix(&path).unwrap();
    let mut deaf = Vec::new();
    for _ in 0..DEAF_CLIENTS {
        let mut client = Client { stream: UnixStream::connect(&path).await.unwrap() };
        client.handshake("disk", false, false).await;
        for cookie in 0..96u64 {
            client.send_request(cmd::READ, 0, cookie, 0, MIB as u32, &[]).await;
        }
        deaf.push(client);
    }
    settled(&fx.server).await;
    let stats = fx.server.stats();
    assert!(stats.held_bytes > 100 * MIB, "the deaf clients hold their share: {stats:?}");
    let mut client = Client { stream: UnixStream::connect(&path).await.unwrap() };
    served(&mut client, "beside 24 clients that never read").await;
    let stats = fx.server.stats();
    assert!(stats.peak_reserved_bytes < MEMORY_BOUND_BYTES, "{stats:?}");
    drop(deaf);
    handle.shutdown().await;
}
