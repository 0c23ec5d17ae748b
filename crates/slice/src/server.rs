//! The slice server: serves a node's slices to coordinators over TCP (docs/design/cluster.md §3).
//!
//! One task reads a connection's requests, one writes its replies; each request runs as a task
//! of its own, so requests are pipelined and complete in any order. At most
//! [`MAX_IN_FLIGHT`] requests of one connection run at once: past that the reader stops reading
//! (TCP pushes back on the client). A malformed header gets an INVALID reply and ends the
//! connection, since the stream can no longer be trusted to be in step. A FENCE makes its
//! connection the slice's: requests of the slice's other connections are refused (UNFENCED)
//! from then on, so one still unread in an old connection cannot run after it.

use std::collections::HashMap;
use std::io;
use std::sync::Arc;

use stria_dev::{BlockDevice, DevError, IoBuf};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, mpsc};

use crate::slice::{ConnectionId, Slice};

/// The id of the next connection (ids start at 1: 0 means none).
static NEXT_CONNECTION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
use crate::wire::{INFO_BYTES, Op, REQUEST_BYTES, Reply, Request, Status};

/// Requests of one connection running at once.
pub const MAX_IN_FLIGHT: usize = 256;

/// The slices a node serves, by id.
#[derive(Debug)]
pub struct SliceSet<D> {
    slices: HashMap<u32, Arc<Slice<D>>>,
}

impl<D: BlockDevice> SliceSet<D> {
    pub fn new(slices: impl IntoIterator<Item = Slice<D>>) -> SliceSet<D> {
        SliceSet { slices: slices.into_iter().map(|s| (s.id(), Arc::new(s))).collect() }
    }

    pub fn get(&self, id: u32) -> Option<&Arc<Slice<D>>> {
        self.slices.get(&id)
    }

    pub fn ids(&self) -> Vec<u32> {
        let mut ids: Vec<u32> = self.slices.keys().copied().collect();
        ids.sort_unstable();
        ids
    }
}

/// Accepts connections on `listener` and serves each until it closes. Runs until the task is
/// dropped or aborted.
pub async fn serve<D: BlockDevice>(listener: TcpListener, slices: Arc<SliceSet<D>>) -> io::Result<()> {
    loop {
        let (stream, peer) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let slices = Arc::clone(&slices);
        tokio::spawn(async move {
            if let Err(e) = serve_connection(stream, slices).await {
                tracing::debug!(%peer, error = %e, "slice connection ended");
            }
        });
    }
}

type Outgoing = (Reply, Option<IoBuf>);

/// Serves one connection (any byte stream) until the peer closes it or sends a bad frame.
pub async fn serve_connection<D: BlockDevice, S>(stream: S, slices: Arc<SliceSet<D>>) -> io::Result<()>
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let conn: ConnectionId = NEXT_CONNECTION.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let (mut rd, wr) = tokio::io::split(stream);
    let (tx, rx) = mpsc::channel::<Outgoing>(MAX_IN_FLIGHT);
    let writer = tokio::spawn(write_replies(wr, rx));
    let limit = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let result = loop {
        let permit = Arc::clone(&limit).acquire_owned().await.expect("never closed");
        let mut head = [0u8; REQUEST_BYTES];
        match rd.read_exact(&mut head).await {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => break Ok(()),
            Err(e) => break Err(e),
        }
        let req = match Request::parse(&head) {
            Ok(r) => r,
            Err(e) => {
                let tag = u64::from_le_bytes(head[8..16].try_into().expect("8 bytes"));
                let _ = tx.send((Reply { status: Status::Invalid, tag, epoch: 0, len: 0 }, None)).await;
                break Err(io::Error::new(io::ErrorKind::InvalidData, e.to_string()));
            }
        };
        let mut payload = None;
        if req.payload_bytes() > 0 {
            let mut buf = IoBuf::for_overwrite(req.payload_bytes());
            if let Err(e) = rd.read_exact(&mut buf).await {
                break Err(e);
            }
            payload = Some(buf);
        }
        let slices = Arc::clone(&slices);
        let tx = tx.clone();
        tokio::spawn(async move {
            let out = execute(&slices, conn, req, payload).await;
            let _ = tx.send(out).await;
            drop(permit);
        });
    };
    drop(tx);
    // Replies of requests still running go out before the connection closes.
    let _ = writer.await;
    result
}

async fn write_replies<W: AsyncWrite>(wr: W, mut rx: mpsc::Receiver<Outgoing>) -> io::Result<()> {
    let mut wr = std::pin::pin!(BufWriter::with_capacity(256 * 1024, wr));
    while let Some((reply, payload)) = rx.recv().await {
        wr.write_all(&reply.encode()).await?;
        if let Some(p) = payload {
            wr.write_all(&p).await?;
        }
        if rx.is_empty() {
            wr.flush().await?;
        }
    }
    wr.flush().await?;
    wr.shutdown().await
}

fn status_of(e: &DevError) -> Status {
    match e {
        DevError::OutOfRange { .. } => Status::OutOfRange,
        DevError::Misaligned { .. } => Status::Invalid,
        DevError::Fenced { .. } => Status::Fenced,
        e if e.is_no_space() => Status::NoSpace,
        _ => Status::Io,
    }
}

async fn execute<D: BlockDevice>(
    slices: &SliceSet<D>,
    conn: ConnectionId,
    req: Request,
    payload: Option<IoBuf>,
) -> Outgoing {
    let reply = |status, epoch, len| Reply { status, tag: req.tag, epoch, len };
    let Some(slice) = slices.get(req.slice) else {
        return (reply(Status::NoSuchSlice, 0, 0), None);
    };
    if req.op == Op::Fence {
        return match slice.fence_by(conn, req.epoch).await {
            Ok(now) if now == req.epoch => (reply(Status::Ok, now, 0), None),
            Ok(now) => (reply(Status::Fenced, now, 0), None),
            Err(e) => {
                tracing::error!(slice = req.slice, error = %e, "could not persist a fence");
                (reply(Status::Io, slice.epoch().await, 0), None)
            }
        };
    }
    if req.op == Op::Info {
        let epoch = slice.epoch().await;
        let mut info = IoBuf::zeroed(INFO_BYTES as usize);
        info[0..8].copy_from_slice(&slice.usable_bytes().to_le_bytes());
        info[8..16].copy_from_slice(&epoch.to_le_bytes());
        return (reply(Status::Ok, epoch, INFO_BYTES), Some(info));
    }
    let len = u64::from(req.len);
    if req.offset.checked_add(len).is_none_or(|end| end > slice.usable_bytes()) {
        return (reply(Status::OutOfRange, slice.epoch().await, 0), None);
    }
    let offset = req.offset;
    let admitted = slice
        .admit_by(conn, req.epoch, async |dev: &D, base: u64| -> Result<Option<IoBuf>, DevError> {
            match req.op {
                Op::Read => Ok(Some(dev.read(base + offset, IoBuf::for_overwrite(len as usize)).await?)),
                Op::Write => {
                    let data = payload.expect("a write has its payload").freeze();
                    dev.write(base + offset, data, req.fua).await.map(|()| None)
                }
                Op::Flush => dev.flush().await.map(|()| None),
                Op::Discard => dev.discard(base + offset, len).await.map(|()| None),
                Op::Fence | Op::Info => unreachable!("handled above"),
            }
        })
        .await;
    match admitted {
        Ok(Ok(Some(data))) => (reply(Status::Ok, req.epoch, req.len), Some(data)),
        Ok(Ok(None)) => (reply(Status::Ok, req.epoch, 0), None),
        Ok(Err(e)) => {
            tracing::warn!(slice = req.slice, error = %e, "slice request failed");
            (reply(status_of(&e), req.epoch, 0), None)
        }
        Err((true, current)) => (reply(Status::Fenced, current, 0), None),
        Err((false, current)) => (reply(Status::Unfenced, current, 0), None),
    }
}
