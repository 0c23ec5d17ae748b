//! A small NBD client: fixed newstyle handshake with `NBD_OPT_GO`, then pipelined requests with
//! simple replies (no structured replies, no TLS). A cluster node uses it to forward a volume's
//! requests to the volume's owner (docs/design/cluster.md §6.2); tests use it as a client.
//!
//! One connection carries any number of requests at once: a writer half behind a lock sends
//! each request whole, a reader task matches each reply to its request by cookie. When the
//! connection fails every request waiting on it gets [`ClientError::Disconnected`] and every
//! later one fails at once: the caller makes a new client.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use stria_dev::{IoBuf, IoBytes};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::proto::{
    CLIENT_FIXED_NEWSTYLE, CLIENT_NO_ZEROES, FLAG_FIXED_NEWSTYLE, FLAG_NO_ZEROES, IHAVEOPT, NBD_MAGIC,
    OPTION_REPLY_MAGIC, REQUEST_MAGIC, SIMPLE_REPLY_MAGIC, cflag, cmd, info, opt, rep, tflag,
};

/// What went wrong with a request or a connection.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server answered the request with this error value (`errno` numbers: 5 `EIO`,
    /// 28 `ENOSPC`, 108 `ESHUTDOWN`...).
    #[error("the server answered error {0}")]
    Server(u32),
    /// The server refused the export in the handshake (`NBD_REP_ERR_*`), with its message.
    #[error("the server refused export {export:?}: {message} (reply {code:#x})")]
    Refused { export: String, code: u32, message: String },
    /// The connection broke, or the server broke the protocol; the request may or may not have
    /// been carried out.
    #[error("the NBD connection was lost: {0}")]
    Disconnected(String),
    /// The request is not valid here (range, size), and was not sent.
    #[error("{0}")]
    Invalid(String),
}

/// The answer a request waits for: an error value, and for a read its data.
type Reply = Result<Option<IoBuf>, ClientError>;

/// A request sent and not answered yet: its reply channel and, for a read, the bytes to expect.
struct Pending {
    tx: oneshot::Sender<Reply>,
    read_bytes: usize,
}

type Writer = Box<dyn AsyncWrite + Send + Unpin>;

/// One connection to one export.
pub struct NbdClient {
    export: String,
    size_bytes: u64,
    flags: u16,
    writer: tokio::sync::Mutex<Writer>,
    pending: Arc<Mutex<Option<HashMap<u64, Pending>>>>,
    cookies: AtomicU64,
    reader: JoinHandle<()>,
}

impl std::fmt::Debug for NbdClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NbdClient")
            .field("export", &self.export)
            .field("size_bytes", &self.size_bytes)
            .finish()
    }
}

impl Drop for NbdClient {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// Longest reply message or info payload the client reads in the handshake.
const MAX_OPTION_REPLY_BYTES: u32 = 64 << 10;
/// Largest read or write the client sends in one request (the server's default maximum).
pub const MAX_REQUEST_BYTES: usize = 32 << 20;

impl NbdClient {
    /// Connects to `addr` (`host:port`) and opens `export`.
    pub async fn connect(addr: &str, export: &str) -> Result<NbdClient, ClientError> {
        let stream =
            TcpStream::connect(addr).await.map_err(|e| ClientError::Disconnected(format!("{addr}: {e}")))?;
        let _ = stream.set_nodelay(true);
        let (read, write) = stream.into_split();
        NbdClient::over(Box::new(read), Box::new(write), export).await
    }

    /// Opens `export` over an established byte stream.
    pub async fn over(
        mut read: Box<dyn AsyncRead + Send + Unpin>,
        mut write: Writer,
        export: &str,
    ) -> Result<NbdClient, ClientError> {
        let (size_bytes, flags) = handshake(&mut read, &mut write, export).await?;
        let pending = Arc::new(Mutex::new(Some(HashMap::new())));
        let reader = tokio::spawn(read_replies(read, Arc::clone(&pending)));
        Ok(NbdClient {
            export: export.to_string(),
            size_bytes,
            flags,
            writer: tokio::sync::Mutex::new(write),
            pending,
            cookies: AtomicU64::new(1),
            reader,
        })
    }

    /// The export's size.
    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    /// The export's transmission flags ([`tflag`]).
    pub fn flags(&self) -> u16 {
        self.flags
    }

    /// True once the connection has failed (every request now fails).
    pub fn is_closed(&self) -> bool {
        self.pending.lock().is_none()
    }

    /// Reads `len_bytes` at `offset_bytes`.
    pub async fn read(&self, offset_bytes: u64, len_bytes: usize) -> Result<IoBuf, ClientError> {
        let len = self.check(offset_bytes, len_bytes as u64)?;
        let got = self.request(cmd::READ, 0, offset_bytes, len, None, len_bytes).await?;
        got.ok_or_else(|| ClientError::Disconnected("a read reply without data".into()))
    }

    /// Writes `data` at `offset_bytes`; `fua`: answered only once durable.
    pub async fn write(&self, offset_bytes: u64, data: IoBytes, fua: bool) -> Result<(), ClientError> {
        let len = self.check(offset_bytes, data.len() as u64)?;
        let flags = if fua { cflag::FUA } else { 0 };
        self.request(cmd::WRITE, flags, offset_bytes, len, Some(data), 0).await.map(drop)
    }

    /// Makes every completed write durable.
    pub async fn flush(&self) -> Result<(), ClientError> {
        self.request(cmd::FLUSH, 0, 0, 0, None, 0).await.map(drop)
    }

    /// Discards a range (`NBD_CMD_TRIM`).
    pub async fn trim(&self, offset_bytes: u64, len_bytes: u32, fua: bool) -> Result<(), ClientError> {
        let len = self.check(offset_bytes, u64::from(len_bytes))?;
        let flags = if fua { cflag::FUA } else { 0 };
        self.request(cmd::TRIM, flags, offset_bytes, len, None, 0).await.map(drop)
    }

    /// Writes zeroes over a range; `no_hole`: the range stays allocated; `fast`: fail with
    /// `ENOTSUP` (95) unless zeroing is cheap.
    pub async fn write_zeroes(
        &self,
        offset_bytes: u64,
        len_bytes: u32,
        no_hole: bool,
        fast: bool,
        fua: bool,
    ) -> Result<(), ClientError> {
        let len = self.check(offset_bytes, u64::from(len_bytes))?;
        let mut flags = if fua { cflag::FUA } else { 0 };
        if no_hole {
            flags |= cflag::NO_HOLE;
        }
        if fast {
            flags |= cflag::FAST_ZERO;
        }
        self.request(cmd::WRITE_ZEROES, flags, offset_bytes, len, None, 0).await.map(drop)
    }

    /// Ends the session politely (`NBD_CMD_DISC`); requests in flight are still answered.
    pub async fn disconnect(&self) {
        let mut header = [0u8; 28];
        encode_request(&mut header, cmd::DISC, 0, 0, 0, 0);
        let mut w = self.writer.lock().await;
        let _ = w.write_all(&header).await;
        let _ = w.flush().await;
    }

    fn check(&self, offset_bytes: u64, len_bytes: u64) -> Result<u32, ClientError> {
        if len_bytes > MAX_REQUEST_BYTES as u64 {
            return Err(ClientError::Invalid(format!(
                "a request of {len_bytes} bytes is over the client's {MAX_REQUEST_BYTES}"
            )));
        }
        if offset_bytes.checked_add(len_bytes).is_none_or(|end| end > self.size_bytes) {
            return Err(ClientError::Invalid(format!(
                "{len_bytes} bytes at {offset_bytes} are past the end of {:?} ({} bytes)",
                self.export, self.size_bytes
            )));
        }
        Ok(u32::try_from(len_bytes).expect("checked against MAX_REQUEST_BYTES"))
    }

    async fn request(
        &self,
        command: u16,
        flags: u16,
        offset_bytes: u64,
        len_bytes: u32,
        payload: Option<IoBytes>,
        read_bytes: usize,
    ) -> Result<Option<IoBuf>, ClientError> {
        let cookie = self.cookies.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        match self.pending.lock().as_mut() {
            Some(map) => map.insert(cookie, Pending { tx, read_bytes }),
            None => return Err(ClientError::Disconnected("the connection failed earlier".into())),
        };
        let mut header = [0u8; 28];
        encode_request(&mut header, command, flags, cookie, offset_bytes, len_bytes);
        let sent = async {
            let mut w = self.writer.lock().await;
            w.write_all(&header).await?;
            if let Some(data) = &payload {
                w.write_all(data).await?;
            }
            w.flush().await
        };
        if let Err(e) = sent.await {
            fail_all(&self.pending, &format!("send: {e}"));
        }
        rx.await.unwrap_or_else(|_| Err(ClientError::Disconnected("the reply reader stopped".into())))
    }
}

fn encode_request(out: &mut [u8; 28], command: u16, flags: u16, cookie: u64, offset: u64, len: u32) {
    out[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
    out[4..6].copy_from_slice(&flags.to_be_bytes());
    out[6..8].copy_from_slice(&command.to_be_bytes());
    out[8..16].copy_from_slice(&cookie.to_be_bytes());
    out[16..24].copy_from_slice(&offset.to_be_bytes());
    out[24..28].copy_from_slice(&len.to_be_bytes());
}

/// Fails every request waiting and every later one.
fn fail_all(pending: &Mutex<Option<HashMap<u64, Pending>>>, why: &str) {
    if let Some(map) = pending.lock().take() {
        for (_, p) in map {
            let _ = p.tx.send(Err(ClientError::Disconnected(why.to_string())));
        }
    }
}

async fn read_replies(
    mut read: Box<dyn AsyncRead + Send + Unpin>,
    pending: Arc<Mutex<Option<HashMap<u64, Pending>>>>,
) {
    let why = loop {
        let mut header = [0u8; 16];
        if let Err(e) = read.read_exact(&mut header).await {
            break format!("receive: {e}");
        }
        let magic = u32::from_be_bytes(header[0..4].try_into().expect("4 bytes"));
        if magic != SIMPLE_REPLY_MAGIC {
            break format!("a reply with magic {magic:#x} (only simple replies were asked for)");
        }
        let error = u32::from_be_bytes(header[4..8].try_into().expect("4 bytes"));
        let cookie = u64::from_be_bytes(header[8..16].try_into().expect("8 bytes"));
        let Some(p) = pending.lock().as_mut().and_then(|m| m.remove(&cookie)) else {
            break format!("a reply to cookie {cookie}, which no request has");
        };
        // A simple reply to a read carries the data only when it succeeded.
        let reply = if error != 0 {
            Err(ClientError::Server(error))
        } else if p.read_bytes > 0 {
            let mut buf = IoBuf::for_overwrite(p.read_bytes);
            if let Err(e) = read.read_exact(&mut buf).await {
                let _ = p.tx.send(Err(ClientError::Disconnected(format!("receive: {e}"))));
                break format!("receive: {e}");
            }
            Ok(Some(buf))
        } else {
            Ok(None)
        };
        let _ = p.tx.send(reply);
    };
    fail_all(&pending, &why);
}

async fn handshake(
    read: &mut (dyn AsyncRead + Send + Unpin),
    write: &mut Writer,
    export: &str,
) -> Result<(u64, u16), ClientError> {
    let lost = |e: std::io::Error| ClientError::Disconnected(format!("handshake: {e}"));
    let broken = |what: String| ClientError::Disconnected(format!("handshake: {what}"));
    let mut hello = [0u8; 18];
    read.read_exact(&mut hello).await.map_err(lost)?;
    let magic = u64::from_be_bytes(hello[0..8].try_into().expect("8 bytes"));
    let newstyle = u64::from_be_bytes(hello[8..16].try_into().expect("8 bytes"));
    if magic != NBD_MAGIC || newstyle != IHAVEOPT {
        return Err(broken("not a newstyle NBD server".into()));
    }
    let server_flags = u16::from_be_bytes([hello[16], hello[17]]);
    if server_flags & FLAG_FIXED_NEWSTYLE == 0 {
        return Err(broken("the server does not speak fixed newstyle".into()));
    }
    let mut client_flags = CLIENT_FIXED_NEWSTYLE;
    if server_flags & FLAG_NO_ZEROES != 0 {
        client_flags |= CLIENT_NO_ZEROES;
    }
    // NBD_OPT_GO: name length, name, no info requests.
    let name = export.as_bytes();
    let name_len =
        u32::try_from(name.len()).map_err(|_| ClientError::Invalid("export name too long".into()))?;
    let mut msg = Vec::with_capacity(26 + name.len());
    msg.extend_from_slice(&client_flags.to_be_bytes());
    msg.extend_from_slice(&IHAVEOPT.to_be_bytes());
    msg.extend_from_slice(&opt::GO.to_be_bytes());
    msg.extend_from_slice(&(name_len + 6).to_be_bytes());
    msg.extend_from_slice(&name_len.to_be_bytes());
    msg.extend_from_slice(name);
    msg.extend_from_slice(&0u16.to_be_bytes());
    write.write_all(&msg).await.map_err(lost)?;
    write.flush().await.map_err(lost)?;
    let mut export_info: Option<(u64, u16)> = None;
    loop {
        let mut head = [0u8; 20];
        read.read_exact(&mut head).await.map_err(lost)?;
        let magic = u64::from_be_bytes(head[0..8].try_into().expect("8 bytes"));
        let option = u32::from_be_bytes(head[8..12].try_into().expect("4 bytes"));
        let reply = u32::from_be_bytes(head[12..16].try_into().expect("4 bytes"));
        let len = u32::from_be_bytes(head[16..20].try_into().expect("4 bytes"));
        if magic != OPTION_REPLY_MAGIC || option != opt::GO {
            return Err(broken(format!("an option reply with magic {magic:#x} for option {option}")));
        }
        if len > MAX_OPTION_REPLY_BYTES {
            return Err(broken(format!("an option reply of {len} bytes")));
        }
        let mut payload = vec![0u8; len as usize];
        read.read_exact(&mut payload).await.map_err(lost)?;
        match reply {
            rep::ACK => {
                return export_info
                    .ok_or_else(|| broken("NBD_OPT_GO acknowledged without the export's size".into()));
            }
            rep::INFO => {
                if payload.len() >= 12 && u16::from_be_bytes([payload[0], payload[1]]) == info::EXPORT {
                    let size = u64::from_be_bytes(payload[2..10].try_into().expect("8 bytes"));
                    let flags = u16::from_be_bytes([payload[10], payload[11]]);
                    if flags & tflag::HAS_FLAGS == 0 {
                        return Err(broken("transmission flags without HAS_FLAGS".into()));
                    }
                    export_info = Some((size, flags));
                }
            }
            code if code & (1 << 31) != 0 => {
                return Err(ClientError::Refused {
                    export: export.to_string(),
                    code,
                    message: String::from_utf8_lossy(&payload).into_owned(),
                });
            }
            other => return Err(broken(format!("an unexpected option reply {other}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use stria_dev::IoBytes;

    use super::{ClientError, NbdClient};
    use crate::{ExportMap, MemExport, Server, ServerConfig};

    async fn server() -> (crate::ServerHandle, String) {
        let exports = Arc::new(ExportMap::new());
        exports.insert("disk", Arc::new(MemExport::new(1 << 20))).unwrap();
        let server = Server::new(ServerConfig::default(), exports).unwrap();
        let handle = server.serve_tcp("127.0.0.1:0").await.unwrap();
        let addr = match handle.local_addr() {
            crate::ListenAddr::Tcp(sa) => sa.to_string(),
            other => panic!("{other:?}"),
        };
        (handle, addr)
    }

    /// Pipelined writes, reads, zeroes, trims and flushes round-trip; errors come back as the
    /// server's values; an unknown export is refused with the server's message.
    #[tokio::test]
    async fn requests_round_trip_and_errors_are_the_servers() {
        let (handle, addr) = server().await;
        let c = Arc::new(NbdClient::connect(&addr, "disk").await.unwrap());
        assert_eq!(c.size_bytes(), 1 << 20);
        let mut tasks = Vec::new();
        for i in 0..32u8 {
            let c = Arc::clone(&c);
            tasks.push(tokio::spawn(async move {
                let data = vec![i + 1; 4096];
                let at = u64::from(i) * 4096;
                c.write(at, IoBytes::copy_from(&data), i % 2 == 0).await.unwrap();
                let got = c.read(at, 4096).await.unwrap();
                assert_eq!(&got[..], &data[..]);
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        c.flush().await.unwrap();
        c.write_zeroes(0, 8192, true, false, false).await.unwrap();
        c.trim(8192, 4096, false).await.unwrap();
        assert_eq!(&c.read(0, 8192).await.unwrap()[..], &[0u8; 8192][..]);
        assert_eq!(&c.read(3 * 4096, 4096).await.unwrap()[..], &[4u8; 4096][..]);
        assert!(matches!(c.read(1 << 20, 4096).await, Err(ClientError::Invalid(_))));

        let err = NbdClient::connect(&addr, "nope").await.unwrap_err();
        assert!(matches!(err, ClientError::Refused { .. }), "{err}");

        // The server going away fails what waits and what comes after.
        c.disconnect().await;
        handle.shutdown().await;
        let err = c.read(0, 4096).await.unwrap_err();
        assert!(matches!(err, ClientError::Disconnected(_)), "{err}");
        assert!(c.is_closed());
    }
}
