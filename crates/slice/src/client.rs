//! A remote slice as a block device: the coordinator's side of the slice protocol.
//!
//! [`RemoteDevice`] implements [`BlockDevice`], so a pool is assembled over remote slices exactly
//! as over local drives (docs/design/cluster.md §1). Every request carries the device's fencing
//! epoch; a slice fenced by a newer owner answers FENCED, which becomes
//! [`DevError::Fenced`] (the engine then refuses writes and fails no drive).
//!
//! The request futures only use channels, so any executor may poll them; the socket work runs
//! on the tokio runtime whose handle the device was connected with. One connection per device,
//! pipelined: requests are tagged and their replies may come in any order. When the connection
//! breaks, every request in flight fails with an I/O error and the next request connects again.
//! A device that has fenced claims the slice again on its new connection before anything else
//! (INFO, then FENCE at its own epoch only if the slice has that very epoch: a reconnection never
//! raises an epoch), because a slice serves only the connection that fenced it last.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use stria_dev::{BlockDevice, DevCounters, DevError, IoBuf, IoBytes, check_range};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufWriter};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::runtime::Handle;
use tokio::sync::{mpsc, oneshot};

use crate::wire::{INFO_BYTES, MAX_IO_BYTES, Op, REPLY_BYTES, Reply, Request, Status};

type Answer = Result<(Reply, Option<IoBuf>), io::Error>;

struct Outgoing {
    req: Request,
    payload: Option<IoBytes>,
    answer: oneshot::Sender<Answer>,
}

/// Requests sent and not answered, of the current connection.
#[derive(Default)]
struct Pending {
    /// Set by the reader when the connection broke: nothing more may wait on it.
    dead: bool,
    waiting: HashMap<u64, (Op, oneshot::Sender<Answer>)>,
}

/// A slice on another node, used as a drive.
pub struct RemoteDevice {
    name: Arc<str>,
    slice: u32,
    size_bytes: u64,
    epoch: Arc<AtomicU64>,
    tx: mpsc::Sender<Outgoing>,
    counters: DevCounters,
}

impl std::fmt::Debug for RemoteDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteDevice")
            .field("name", &self.name)
            .field("epoch", &self.epoch.load(Ordering::Relaxed))
            .finish()
    }
}

/// What INFO says about a slice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SliceInfo {
    pub usable_bytes: u64,
    pub epoch: u64,
}

fn lost(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionAborted, what.to_string())
}

impl RemoteDevice {
    /// Connects to slice `slice` at `addr` and asks its size. Requests will carry `epoch`
    /// (a coordinator [`fence`](Self::fence)s before it does I/O). `runtime` runs the socket.
    pub async fn connect(
        runtime: &Handle,
        addr: SocketAddr,
        slice: u32,
        epoch: u64,
    ) -> io::Result<RemoteDevice> {
        let (tx, rx) = mpsc::channel(crate::server::MAX_IN_FLIGHT);
        let epoch = Arc::new(AtomicU64::new(epoch));
        runtime.spawn(run_connection(addr, slice, Arc::clone(&epoch), rx));
        let mut dev = RemoteDevice {
            name: format!("{addr}/slice-{slice}").into(),
            slice,
            size_bytes: 0,
            epoch,
            tx,
            counters: DevCounters::default(),
        };
        dev.size_bytes = dev.info().await?.usable_bytes;
        Ok(dev)
    }

    /// The epoch this device's requests carry.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Asks the slice's size and persisted epoch.
    pub async fn info(&self) -> io::Result<SliceInfo> {
        let (reply, payload) = self.call_at(self.epoch(), Op::Info, 0, 0, false, None).await?;
        check_status(&reply)?;
        let p = payload.filter(|p| p.len() == INFO_BYTES as usize).ok_or_else(|| lost("short INFO reply"))?;
        let usable_bytes = u64::from_le_bytes(p[0..8].try_into().expect("8 bytes"));
        let epoch = u64::from_le_bytes(p[8..16].try_into().expect("8 bytes"));
        Ok(SliceInfo { usable_bytes, epoch })
    }

    /// Fences the slice at `epoch` (persisted on the slice before this returns) and sends every
    /// later request with it. Fails with [`DevError::Fenced`] when the slice is already at a
    /// higher epoch.
    pub async fn fence(&self, epoch: u64) -> Result<(), DevError> {
        let (reply, _) =
            self.call_at(epoch, Op::Fence, 0, 0, false, None).await.map_err(|e| self.io_error(0, 0, e))?;
        self.result(&reply, epoch, 0, 0)?;
        self.epoch.fetch_max(epoch, Ordering::AcqRel);
        Ok(())
    }

    async fn call_at(
        &self,
        epoch: u64,
        op: Op,
        offset: u64,
        len: u32,
        fua: bool,
        payload: Option<IoBytes>,
    ) -> io::Result<(Reply, Option<IoBuf>)> {
        let req = Request { op, fua, tag: 0, epoch, slice: self.slice, offset, len };
        let (answer, rx) = oneshot::channel();
        self.tx
            .send(Outgoing { req, payload, answer })
            .await
            .map_err(|_| lost("the connection task ended"))?;
        rx.await.map_err(|_| lost("the connection task ended"))?
    }

    fn io_error(&self, offset_bytes: u64, len_bytes: u64, source: io::Error) -> DevError {
        DevError::Io { device: Arc::clone(&self.name), offset_bytes, len_bytes, source }
    }

    /// Maps a reply's status to the device's error.
    fn result(&self, reply: &Reply, epoch: u64, offset_bytes: u64, len_bytes: u64) -> Result<(), DevError> {
        let io = |kind: io::ErrorKind, what: &str| {
            self.io_error(offset_bytes, len_bytes, io::Error::new(kind, what))
        };
        match reply.status {
            Status::Ok => Ok(()),
            Status::Fenced => {
                Err(DevError::Fenced { device: Arc::clone(&self.name), epoch, drive_epoch: reply.epoch })
            }
            Status::OutOfRange => Err(DevError::OutOfRange {
                device: Arc::clone(&self.name),
                offset_bytes,
                len_bytes,
                size_bytes: self.size_bytes,
            }),
            Status::NoSpace => Err(io(io::ErrorKind::StorageFull, "the filesystem under the slice is full")),
            Status::Unfenced => {
                Err(io(io::ErrorKind::PermissionDenied, "the slice is not fenced at this epoch"))
            }
            Status::Io => Err(io(io::ErrorKind::Other, "the slice's drive failed the request")),
            Status::Invalid => Err(io(io::ErrorKind::InvalidInput, "the slice server refused the request")),
            Status::NoSuchSlice => Err(io(io::ErrorKind::NotFound, "no such slice on the server")),
        }
    }

    async fn data_call(
        &self,
        op: Op,
        offset: u64,
        len: u64,
        fua: bool,
        payload: Option<IoBytes>,
    ) -> Result<Option<IoBuf>, DevError> {
        let epoch = self.epoch();
        let (reply, data) = self
            .call_at(epoch, op, offset, u32::try_from(len).unwrap_or(u32::MAX), fua, payload)
            .await
            .map_err(|e| self.io_error(offset, len, e))?;
        self.result(&reply, epoch, offset, len)?;
        Ok(data)
    }
}

fn check_status(reply: &Reply) -> io::Result<()> {
    if reply.status == Status::Ok {
        Ok(())
    } else {
        Err(io::Error::other(format!("slice server answered {:?}", reply.status)))
    }
}

impl BlockDevice for RemoteDevice {
    fn name(&self) -> &str {
        &self.name
    }

    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    async fn read(&self, offset_bytes: u64, mut buf: IoBuf) -> Result<IoBuf, DevError> {
        let len = buf.len() as u64;
        check_range(&self.name, self.size_bytes, offset_bytes, len)?;
        self.counters.record_read(len);
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(u64::from(MAX_IO_BYTES));
            let data = self.data_call(Op::Read, offset_bytes + done, n, false, None).await?;
            let data = data.filter(|d| d.len() as u64 == n).ok_or_else(|| {
                self.io_error(offset_bytes + done, n, lost("a read reply without its data"))
            })?;
            buf[done as usize..(done + n) as usize].copy_from_slice(&data);
            done += n;
        }
        Ok(buf)
    }

    async fn write(&self, offset_bytes: u64, data: IoBytes, fua: bool) -> Result<(), DevError> {
        let len = data.len() as u64;
        check_range(&self.name, self.size_bytes, offset_bytes, len)?;
        self.counters.record_write(len);
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(u64::from(MAX_IO_BYTES));
            let piece = data.slice(done as usize..(done + n) as usize);
            self.data_call(Op::Write, offset_bytes + done, n, fua, Some(piece)).await?;
            done += n;
        }
        Ok(())
    }

    async fn flush(&self) -> Result<(), DevError> {
        self.counters.record_flush();
        self.data_call(Op::Flush, 0, 0, false, None).await.map(drop)
    }

    async fn discard(&self, offset_bytes: u64, len_bytes: u64) -> Result<(), DevError> {
        check_range(&self.name, self.size_bytes, offset_bytes, len_bytes)?;
        self.counters.record_discard();
        let mut done = 0u64;
        while done < len_bytes {
            let n = (len_bytes - done).min(u64::from(MAX_IO_BYTES));
            self.data_call(Op::Discard, offset_bytes + done, n, false, None).await?;
            done += n;
        }
        Ok(())
    }

    fn counters(&self) -> &DevCounters {
        &self.counters
    }
}

/// Owns the socket of one device: connects when a request comes and no connection is up,
/// writes requests in order, and lets a reader task answer them by tag.
async fn run_connection(
    addr: SocketAddr,
    slice: u32,
    epoch: Arc<AtomicU64>,
    mut rx: mpsc::Receiver<Outgoing>,
) {
    let mut next_tag = 1u64;
    let mut conn: Option<(BufWriter<OwnedWriteHalf>, Arc<Mutex<Pending>>)> = None;
    let mut connected_before = false;
    while let Some(out) = rx.recv().await {
        if conn.as_ref().is_some_and(|(_, p)| p.lock().dead) {
            conn = None;
        }
        if conn.is_none() {
            match TcpStream::connect(addr).await {
                Ok(stream) => {
                    let _ = stream.set_nodelay(true);
                    let (rd, wr) = stream.into_split();
                    let pending = Arc::new(Mutex::new(Pending::default()));
                    tokio::spawn(read_replies(rd, Arc::clone(&pending)));
                    let mut c = (BufWriter::with_capacity(256 * 1024, wr), pending);
                    let e = epoch.load(Ordering::Acquire);
                    if connected_before && e > 0 {
                        match claim(&mut c, &mut next_tag, slice, e).await {
                            Ok(None) => {}
                            Ok(Some(refused)) => {
                                let reply = Reply { tag: out.req.tag, len: 0, ..refused };
                                let _ = out.answer.send(Ok((reply, None)));
                                continue;
                            }
                            Err(err) => {
                                let _ = out.answer.send(Err(err));
                                continue;
                            }
                        }
                    }
                    connected_before = true;
                    conn = Some(c);
                }
                Err(e) => {
                    let _ = out.answer.send(Err(e));
                    continue;
                }
            }
        }
        let (wr, pending) = conn.as_mut().expect("connected above");
        let mut req = out.req;
        req.tag = next_tag;
        next_tag += 1;
        {
            let mut p = pending.lock();
            if p.dead {
                let _ = out.answer.send(Err(lost("the connection to the slice server broke")));
                continue;
            }
            p.waiting.insert(req.tag, (req.op, out.answer));
        }
        let mut sent = wr.write_all(&req.encode()).await;
        if let (Ok(()), Some(payload)) = (&sent, &out.payload) {
            sent = wr.write_all(payload).await;
        }
        if sent.is_ok() && rx.is_empty() {
            sent = wr.flush().await;
        }
        if let Err(e) = sent {
            fail_all(pending, &e.to_string());
            conn = None;
        }
    }
}

/// Claims the slice on a new connection for a device fenced at `epoch`: INFO, and FENCE at
/// `epoch` only when the slice is at that very epoch. `Ok(None)`: claimed; `Ok(Some(reply))`: the
/// slice answered with another epoch (FENCED or UNFENCED, for the waiting request).
async fn claim(
    conn: &mut (BufWriter<OwnedWriteHalf>, Arc<Mutex<Pending>>),
    next_tag: &mut u64,
    slice: u32,
    epoch: u64,
) -> io::Result<Option<Reply>> {
    let info = round_trip(
        conn,
        next_tag,
        Request { op: Op::Info, fua: false, tag: 0, epoch, slice, offset: 0, len: 0 },
    )
    .await?;
    check_status(&info)?;
    if info.epoch != epoch {
        let status = if info.epoch > epoch { Status::Fenced } else { Status::Unfenced };
        return Ok(Some(Reply { status, ..info }));
    }
    let fence = round_trip(
        conn,
        next_tag,
        Request { op: Op::Fence, fua: false, tag: 0, epoch, slice, offset: 0, len: 0 },
    )
    .await?;
    match fence.status {
        Status::Ok => Ok(None),
        _ => Ok(Some(fence)),
    }
}

/// Sends one request with no payload on `conn` and waits for its reply.
async fn round_trip(
    conn: &mut (BufWriter<OwnedWriteHalf>, Arc<Mutex<Pending>>),
    next_tag: &mut u64,
    mut req: Request,
) -> io::Result<Reply> {
    let (wr, pending) = conn;
    req.tag = *next_tag;
    *next_tag += 1;
    let (answer, rx) = oneshot::channel();
    pending.lock().waiting.insert(req.tag, (req.op, answer));
    wr.write_all(&req.encode()).await?;
    wr.flush().await?;
    let (reply, _) = rx.await.map_err(|_| lost("the connection to the slice server broke"))??;
    Ok(reply)
}

fn fail_all(pending: &Mutex<Pending>, why: &str) {
    let waiting = {
        let mut p = pending.lock();
        p.dead = true;
        std::mem::take(&mut p.waiting)
    };
    for (_, (_, answer)) in waiting {
        let _ = answer.send(Err(lost(&format!("the connection to the slice server broke: {why}"))));
    }
}

async fn read_replies(mut rd: OwnedReadHalf, pending: Arc<Mutex<Pending>>) {
    let why = loop {
        let mut head = [0u8; REPLY_BYTES];
        if let Err(e) = rd.read_exact(&mut head).await {
            break e.to_string();
        }
        let reply = match Reply::parse(&head) {
            Ok(r) => r,
            Err(e) => break format!("bad reply: {e}"),
        };
        let Some((op, answer)) = pending.lock().waiting.remove(&reply.tag) else {
            break format!("a reply for tag {} that no request has", reply.tag);
        };
        let expected = match (op, reply.status) {
            (Op::Read, Status::Ok) | (Op::Info, Status::Ok) => reply.len,
            _ => 0,
        };
        if reply.len != expected {
            let _ = answer.send(Err(lost("a reply of the wrong length")));
            break format!("a reply of {} bytes where {expected} were due", reply.len);
        }
        let mut payload = None;
        if reply.len > 0 {
            let mut buf = IoBuf::for_overwrite(reply.len as usize);
            if let Err(e) = rd.read_exact(&mut buf).await {
                let _ = answer.send(Err(lost(&e.to_string())));
                break e.to_string();
            }
            payload = Some(buf);
        }
        let _ = answer.send(Ok((reply, payload)));
    };
    fail_all(&pending, &why);
}
