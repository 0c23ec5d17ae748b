//! A minimal raw NBD client for integration tests: it sends exactly the bytes a test wants,
//! including malformed ones, and decodes replies.
#![allow(clippy::cast_possible_truncation)] // test inputs are small, known sizes
#![allow(dead_code, unreachable_pub)] // shared by several test crates, each using part

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use stria_dev::{IoBuf, IoBytes};
use stria_nbd::proto::{self, cmd, opt, rep};
use stria_nbd::{
    BoxFuture, Export, ExportError, ExportMap, Extent, Limits, ListenAddr, MemExport, Server, ServerConfig,
    ServerHandle, ServerStats,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::watch;

/// A server with exports `disk` (1 MiB), `ro` (read-only, 64 KiB), `bad` (EIO at [4096, 8192))
/// and `slowzero` (no fast zero), plus handles to the memory exports.
pub struct Fixture {
    pub server: Server,
    pub disk: Arc<MemExport>,
    pub exports: Arc<ExportMap>,
}

pub const DISK_BYTES: u64 = 1 << 20;

pub fn fixture_with(limits: Limits) -> Fixture {
    fixture_on_threads(limits, 0)
}

/// As [`fixture_with`], with connections run on `threads` connection threads (0: none).
pub fn fixture_on_threads(limits: Limits, threads: usize) -> Fixture {
    let exports = Arc::new(ExportMap::new());
    let disk = Arc::new(MemExport::new(DISK_BYTES).with_description("test disk"));
    exports.insert("disk", disk.clone()).unwrap();
    exports.insert("ro", Arc::new(MemExport::new(64 << 10).with_read_only(true))).unwrap();
    exports.insert("bad", Arc::new(MemExport::new(64 << 10).with_io_error_range(4096..8192))).unwrap();
    exports.insert("slowzero", Arc::new(MemExport::new(64 << 10).with_fast_zero(false))).unwrap();
    let config = ServerConfig { limits, connection_threads: threads, ..ServerConfig::default() };
    let server = Server::new(config, exports.clone()).unwrap();
    Fixture { server, disk, exports }
}

pub fn fixture() -> Fixture {
    fixture_with(Limits::default())
}

/// Starts one connection to `server` over an in-memory pipe.
pub fn connect(server: &Server) -> Client<DuplexStream> {
    let (client, server_side) = tokio::io::duplex(1 << 20);
    let server = server.clone();
    tokio::spawn(async move { server.serve_stream(server_side, "test").await });
    Client { stream: client }
}

/// A TCP connection to `server` from the loopback address `source` (all of 127.0.0.0/8 is
/// loopback on Linux, so tests can be several peers).
pub async fn tcp_from(source: &str, server: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(source.parse().unwrap(), 0)).unwrap();
    socket.connect(server).await.unwrap()
}

/// Listens on a free loopback port.
pub async fn serve_tcp(server: &Server) -> (ServerHandle, SocketAddr) {
    let handle = server.serve_tcp("127.0.0.1:0").await.unwrap();
    let ListenAddr::Tcp(addr) = handle.local_addr().clone() else { panic!("tcp address expected") };
    (handle, addr)
}

/// Polls `condition` on the server's stats until it holds (panics after 10 s).
pub async fn wait_for_stats(
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

/// A write and a read of it back, with simple replies.
pub async fn round_trip<S: AsyncRead + AsyncWrite + Unpin>(client: &mut Client<S>, tag: u8) {
    client.send_request(cmd::WRITE, 0, 1, 4096, 512, &[tag; 512]).await;
    assert_eq!(client.read_reply().await.error(), 0);
    client.send_request(cmd::READ, 0, 2, 4096, 512, &[]).await;
    assert_eq!(client.read_reply().await.error(), 0);
    assert_eq!(client.read_exact_data(512).await, vec![tag; 512]);
}

pub struct Client<S> {
    pub stream: S,
}

#[derive(Debug, PartialEq, Eq)]
pub struct OptionReply {
    pub option: u32,
    pub reply_type: u32,
    pub data: Vec<u8>,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Reply {
    Simple { cookie: u64, error: u32 },
    Chunk { flags: u16, chunk_type: u16, cookie: u64, payload: Vec<u8> },
}

impl Reply {
    pub fn cookie(&self) -> u64 {
        match self {
            Reply::Simple { cookie, .. } | Reply::Chunk { cookie, .. } => *cookie,
        }
    }

    /// The error value of a simple reply or an error chunk, 0 otherwise.
    pub fn error(&self) -> u32 {
        match self {
            Reply::Simple { error, .. } => *error,
            Reply::Chunk { chunk_type, payload, .. } if chunk_type & 0x8000 != 0 => {
                u32::from_be_bytes(payload[0..4].try_into().unwrap())
            }
            Reply::Chunk { .. } => 0,
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Client<S> {
    /// Reads the greeting and sends client flags.
    pub async fn greet(&mut self, client_flags: u32) {
        let mut greeting = [0u8; 18];
        self.stream.read_exact(&mut greeting).await.unwrap();
        assert_eq!(&greeting[0..8], &proto::NBD_MAGIC.to_be_bytes());
        assert_eq!(&greeting[8..16], &proto::IHAVEOPT.to_be_bytes());
        assert_eq!(u16::from_be_bytes([greeting[16], greeting[17]]), 3);
        self.stream.write_all(&client_flags.to_be_bytes()).await.unwrap();
    }

    pub async fn send_option(&mut self, option: u32, data: &[u8]) {
        let mut out = proto::IHAVEOPT.to_be_bytes().to_vec();
        out.extend_from_slice(&option.to_be_bytes());
        out.extend_from_slice(&(data.len() as u32).to_be_bytes());
        out.extend_from_slice(data);
        self.stream.write_all(&out).await.unwrap();
    }

    pub async fn read_option_reply(&mut self) -> OptionReply {
        let mut header = [0u8; 20];
        self.stream.read_exact(&mut header).await.unwrap();
        assert_eq!(&header[0..8], &proto::OPTION_REPLY_MAGIC.to_be_bytes());
        let option = u32::from_be_bytes(header[8..12].try_into().unwrap());
        let reply_type = u32::from_be_bytes(header[12..16].try_into().unwrap());
        let len = u32::from_be_bytes(header[16..20].try_into().unwrap());
        let mut data = vec![0u8; len as usize];
        self.stream.read_exact(&mut data).await.unwrap();
        OptionReply { option, reply_type, data }
    }

    /// Reads replies up to and including the final one (ACK or an error).
    pub async fn read_option_replies(&mut self) -> Vec<OptionReply> {
        let mut replies = Vec::new();
        loop {
            let reply = self.read_option_reply().await;
            let last = reply.reply_type == rep::ACK || reply.reply_type & (1 << 31) != 0;
            replies.push(reply);
            if last {
                return replies;
            }
        }
    }

    /// Negotiates structured replies (optional), `base:allocation` (optional) and GO.
    /// Returns (size, transmission flags).
    pub async fn handshake(&mut self, export: &str, structured: bool, meta: bool) -> (u64, u16) {
        self.greet(proto::CLIENT_FIXED_NEWSTYLE | proto::CLIENT_NO_ZEROES).await;
        if structured {
            self.send_option(opt::STRUCTURED_REPLY, &[]).await;
            assert_eq!(self.read_option_reply().await.reply_type, rep::ACK);
        }
        if meta {
            self.send_option(opt::SET_META_CONTEXT, &meta_data(export, &["base:allocation"])).await;
            let replies = self.read_option_replies().await;
            assert_eq!(replies.len(), 2, "{replies:?}");
            assert_eq!(replies[0].reply_type, rep::META_CONTEXT);
        }
        self.send_option(opt::GO, &info_data(export, &[])).await;
        let replies = self.read_option_replies().await;
        assert_eq!(replies.last().unwrap().reply_type, rep::ACK, "{replies:?}");
        let info = replies.iter().find(|r| r.data[0..2] == [0, 0]).expect("NBD_INFO_EXPORT");
        let size = u64::from_be_bytes(info.data[2..10].try_into().unwrap());
        let flags = u16::from_be_bytes(info.data[10..12].try_into().unwrap());
        (size, flags)
    }

    pub async fn send_request(
        &mut self,
        kind: u16,
        flags: u16,
        cookie: u64,
        offset: u64,
        len: u32,
        data: &[u8],
    ) {
        let mut out = Vec::with_capacity(28 + data.len());
        out.extend_from_slice(&proto::REQUEST_MAGIC.to_be_bytes());
        out.extend_from_slice(&flags.to_be_bytes());
        out.extend_from_slice(&kind.to_be_bytes());
        out.extend_from_slice(&cookie.to_be_bytes());
        out.extend_from_slice(&offset.to_be_bytes());
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(data);
        self.stream.write_all(&out).await.unwrap();
    }

    /// Reads one reply. For simple replies to reads, `read_len` bytes of data follow on success
    /// and are returned in a `Chunk`-free way via `read_simple_data`.
    pub async fn read_reply(&mut self) -> Reply {
        let magic = self.stream.read_u32().await.unwrap();
        if magic == proto::SIMPLE_REPLY_MAGIC {
            let error = self.stream.read_u32().await.unwrap();
            let cookie = self.stream.read_u64().await.unwrap();
            return Reply::Simple { cookie, error };
        }
        assert_eq!(magic, proto::STRUCTURED_REPLY_MAGIC, "unknown reply magic");
        let flags = self.stream.read_u16().await.unwrap();
        let chunk_type = self.stream.read_u16().await.unwrap();
        let cookie = self.stream.read_u64().await.unwrap();
        let len = self.stream.read_u32().await.unwrap();
        let mut payload = vec![0u8; len as usize];
        self.stream.read_exact(&mut payload).await.unwrap();
        Reply::Chunk { flags, chunk_type, cookie, payload }
    }

    pub async fn read_exact_data(&mut self, len: usize) -> Vec<u8> {
        let mut data = vec![0u8; len];
        self.stream.read_exact(&mut data).await.unwrap();
        data
    }

    /// True when the server closed the connection (reads hit end of stream).
    pub async fn is_closed(&mut self) -> bool {
        let mut byte = [0u8; 1];
        matches!(
            tokio::time::timeout(std::time::Duration::from_secs(5), self.stream.read(&mut byte)).await,
            Ok(Ok(0)) | Ok(Err(_))
        )
    }
}

pub fn info_data(name: &str, info_types: &[u16]) -> Vec<u8> {
    let mut data = (name.len() as u32).to_be_bytes().to_vec();
    data.extend_from_slice(name.as_bytes());
    data.extend_from_slice(&(info_types.len() as u16).to_be_bytes());
    for info_type in info_types {
        data.extend_from_slice(&info_type.to_be_bytes());
    }
    data
}

pub fn meta_data(name: &str, queries: &[&str]) -> Vec<u8> {
    let mut data = (name.len() as u32).to_be_bytes().to_vec();
    data.extend_from_slice(name.as_bytes());
    data.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for query in queries {
        data.extend_from_slice(&(query.len() as u32).to_be_bytes());
        data.extend_from_slice(query.as_bytes());
    }
    data
}

/// An export whose reads and writes wait for a gate to open (send `true` on the sender
/// [`GatedExport::new`] returns), counting how many were started and their bytes.
pub struct GatedExport {
    pub inner: MemExport,
    started: AtomicUsize,
    started_bytes: AtomicUsize,
    open: watch::Receiver<bool>,
}

impl GatedExport {
    pub fn new(size_bytes: u64, open: bool) -> (Arc<GatedExport>, watch::Sender<bool>) {
        let (gate, receiver) = watch::channel(open);
        let export = GatedExport {
            inner: MemExport::new(size_bytes),
            started: AtomicUsize::new(0),
            started_bytes: AtomicUsize::new(0),
            open: receiver,
        };
        (Arc::new(export), gate)
    }

    /// Reads and writes started.
    pub fn started(&self) -> usize {
        self.started.load(Ordering::SeqCst)
    }

    /// Bytes of the reads and writes started.
    pub fn started_bytes(&self) -> usize {
        self.started_bytes.load(Ordering::SeqCst)
    }

    fn start(&self, len_bytes: usize) -> watch::Receiver<bool> {
        self.started.fetch_add(1, Ordering::SeqCst);
        self.started_bytes.fetch_add(len_bytes, Ordering::SeqCst);
        self.open.clone()
    }
}

impl Export for GatedExport {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read_only(&self) -> bool {
        false
    }
    fn description(&self) -> Option<String> {
        None
    }
    fn preferred_block_bytes(&self) -> u32 {
        4096
    }
    fn can_fast_zero(&self) -> bool {
        true
    }
    fn read(&self, offset: u64, len: u32) -> BoxFuture<'_, Result<IoBuf, ExportError>> {
        let mut open = self.start(len as usize);
        Box::pin(async move {
            let _ = open.wait_for(|open| *open).await;
            self.inner.read(offset, len).await
        })
    }
    fn write(&self, offset: u64, data: IoBytes, fua: bool) -> BoxFuture<'_, Result<(), ExportError>> {
        let mut open = self.start(data.len());
        Box::pin(async move {
            let _ = open.wait_for(|open| *open).await;
            self.inner.write(offset, data, fua).await
        })
    }
    fn write_zeroes(&self, o: u64, l: u32, t: bool, f: bool) -> BoxFuture<'_, Result<(), ExportError>> {
        self.inner.write_zeroes(o, l, t, f)
    }
    fn trim(&self, o: u64, l: u32, f: bool) -> BoxFuture<'_, Result<(), ExportError>> {
        self.inner.trim(o, l, f)
    }
    fn flush(&self) -> BoxFuture<'_, Result<(), ExportError>> {
        self.inner.flush()
    }
    fn cache(&self, o: u64, l: u32) -> BoxFuture<'_, Result<(), ExportError>> {
        self.inner.cache(o, l)
    }
    fn block_status(&self, o: u64, l: u32) -> BoxFuture<'_, Result<Vec<Extent>, ExportError>> {
        self.inner.block_status(o, l)
    }
}

/// A server whose only export, `gated`, is `export`.
pub fn gated_server(limits: Limits, export: Arc<GatedExport>) -> Server {
    let exports = Arc::new(ExportMap::new());
    exports.insert("gated", export).unwrap();
    Server::new(ServerConfig { limits, ..ServerConfig::default() }, exports).unwrap()
}
