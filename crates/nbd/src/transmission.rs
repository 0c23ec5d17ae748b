//! The transmission phase of one connection.
//!
//! One task, no spawns: a single poll function reads requests in batches from a buffer, starts
//! each on the export in a [`Slots`] executor, encodes replies as they complete (in any order)
//! and sends everything that is ready with one vectored write. Admission stops at the in-flight
//! limits (request count and bytes), which is what bounds the memory a client can make us hold.
//!
//! Every export future that was started is polled to completion, even when the client went away
//! or broke the protocol: the export never sees an operation abandoned half way.

use std::future::{Future, poll_fn};
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use stria_dev::IoBuf;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tracing::{debug, warn};

use crate::config::Limits;
use crate::conn_io::{Incoming, OutQueue, RequestReader};
use crate::export::{BoxFuture, Export, ExportError, Extent};
use crate::proto::{self, Errno};
use crate::slots::Slots;
use crate::wire::{self, Command, FramingError, SessionParams};

/// Rounds of the poll loop before yielding to other tasks.
const MAX_ROUNDS_PER_POLL: usize = 32;

/// An export operation in flight, with what its reply needs.
enum Op<'e> {
    Read {
        cookie: u64,
        offset_bytes: u64,
        len_bytes: u32,
        future: BoxFuture<'e, Result<IoBuf, ExportError>>,
    },
    Unit {
        cookie: u64,
        held_bytes: usize,
        future: BoxFuture<'e, Result<(), ExportError>>,
    },
    Status {
        cookie: u64,
        len_bytes: u32,
        req_one: bool,
        future: BoxFuture<'e, Result<Vec<Extent>, ExportError>>,
    },
}

/// A finished export operation.
enum Done {
    Read { cookie: u64, offset_bytes: u64, len_bytes: u32, result: Result<IoBuf, ExportError> },
    Unit { cookie: u64, held_bytes: usize, result: Result<(), ExportError> },
    Status { cookie: u64, len_bytes: u32, req_one: bool, result: Result<Vec<Extent>, ExportError> },
}

impl Future for Op<'_> {
    type Output = Done;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Done> {
        match self.get_mut() {
            Op::Read { cookie, offset_bytes, len_bytes, future } => future.as_mut().poll(cx).map(|result| {
                Done::Read { cookie: *cookie, offset_bytes: *offset_bytes, len_bytes: *len_bytes, result }
            }),
            Op::Unit { cookie, held_bytes, future } => future.as_mut().poll(cx).map(|result| Done::Unit {
                cookie: *cookie,
                held_bytes: *held_bytes,
                result,
            }),
            Op::Status { cookie, len_bytes, req_one, future } => future.as_mut().poll(cx).map(|result| {
                Done::Status { cookie: *cookie, len_bytes: *len_bytes, req_one: *req_one, result }
            }),
        }
    }
}

/// Why a connection's transmission phase ended.
#[derive(Debug)]
pub(crate) enum TransmissionEnd {
    /// The client sent `NBD_CMD_DISC`.
    Disconnect,
    /// The client closed its side.
    EndOfStream,
    /// The server is shutting down.
    Shutdown,
    /// The stream broke (reset, broken pipe, TLS error).
    Io(io::Error),
    /// The client broke the protocol.
    Protocol(FramingError),
}

/// Replies and the byte accounting that goes with them.
struct Replies {
    out: OutQueue,
    structured: bool,
    max_extents: usize,
    /// Payload bytes of executing requests (write data held, read data to come).
    executing_bytes: usize,
}

impl Replies {
    fn refuse(&mut self, cookie: u64, errno: Errno, message: &str) {
        if self.structured {
            self.out.encode(|buf| wire::encode_error_chunk(buf, cookie, errno, message));
        } else {
            self.out.encode(|buf| wire::encode_simple_reply(buf, cookie, errno.code()));
        }
    }

    fn ok(&mut self, cookie: u64) {
        self.out.encode(|buf| wire::encode_simple_reply(buf, cookie, 0));
    }

    fn export_error(&mut self, cookie: u64, error: &ExportError) {
        debug!(cookie, %error, "export operation failed");
        self.refuse(cookie, error.errno(), &error.to_string());
    }

    fn complete(&mut self, done: Done) {
        match done {
            Done::Read { cookie, offset_bytes, len_bytes, result } => {
                self.executing_bytes -= usize::try_from(len_bytes).expect("u32 fits usize");
                match result {
                    Ok(data) => {
                        assert_eq!(
                            data.len(),
                            len_bytes as usize,
                            "export returned a read of the wrong length"
                        );
                        if self.structured {
                            self.out.encode(|buf| {
                                wire::encode_read_chunk_header(buf, cookie, offset_bytes, len_bytes)
                            });
                        } else {
                            self.out.encode(|buf| wire::encode_simple_reply(buf, cookie, 0));
                        }
                        self.out.push_data(data);
                    }
                    Err(error) => self.export_error(cookie, &error),
                }
            }
            Done::Unit { cookie, held_bytes, result } => {
                self.executing_bytes -= held_bytes;
                match result {
                    Ok(()) => self.ok(cookie),
                    Err(error) => self.export_error(cookie, &error),
                }
            }
            Done::Status { cookie, len_bytes, req_one, result } => match result {
                Ok(extents) => {
                    let extents = wire::normalize_extents(&extents, len_bytes, req_one, self.max_extents);
                    self.out.encode(|buf| {
                        wire::encode_block_status(buf, cookie, proto::BASE_ALLOCATION_ID, &extents)
                    });
                }
                Err(error) => self.export_error(cookie, &error),
            },
        }
    }
}

/// State of one connection in transmission.
pub(crate) struct Connection<'e> {
    export: &'e dyn Export,
    session: SessionParams,
    limits: Limits,
    reader: RequestReader,
    slots: Slots<Op<'e>>,
    replies: Replies,
    /// The client sent DISC: read no more.
    disconnecting: bool,
    /// Shutdown: read no more, finish what is in flight.
    pub(crate) draining: bool,
    end_of_stream: bool,
    /// The stream failed or the client broke the protocol: stop all I/O, finish the export work.
    broken: Option<TransmissionEnd>,
    /// Requests handled, for the disconnect log.
    pub(crate) requests_handled: u64,
}

impl<'e> Connection<'e> {
    pub(crate) fn new(export: &'e dyn Export, session: SessionParams, limits: &Limits) -> Connection<'e> {
        Connection {
            export,
            session,
            limits: limits.clone(),
            reader: RequestReader::new(session.max_payload_bytes),
            slots: Slots::new(limits.max_requests_in_flight),
            replies: Replies {
                out: OutQueue::new(),
                structured: session.structured,
                max_extents: limits.max_extents_per_reply,
                executing_bytes: 0,
            },
            disconnecting: false,
            draining: false,
            end_of_stream: false,
            broken: None,
            requests_handled: 0,
        }
    }

    /// Bytes this connection holds for requests in flight.
    fn held_bytes(&self) -> usize {
        self.replies.executing_bytes + self.replies.out.queued_bytes() + self.reader.pending_payload_bytes()
    }

    fn stopped_reading(&self) -> bool {
        self.disconnecting || self.draining || self.end_of_stream || self.broken.is_some()
    }

    /// True when another request may start.
    fn can_admit(&self) -> bool {
        if self.slots.is_full() {
            return false;
        }
        let idle = self.slots.is_empty() && self.replies.out.is_empty();
        idle || self.held_bytes() < self.limits.max_in_flight_bytes
    }

    /// Starts every complete buffered request that the limits admit.
    fn admit(&mut self) -> bool {
        let mut admitted = false;
        while !self.disconnecting && !self.draining && self.broken.is_none() && self.can_admit() {
            match self.reader.next_request() {
                Ok(Some(incoming)) => {
                    admitted = true;
                    self.requests_handled += 1;
                    self.dispatch(incoming);
                }
                Ok(None) => break,
                Err(error) => {
                    warn!(%error, "malformed request stream; closing the connection");
                    self.broken = Some(TransmissionEnd::Protocol(error));
                }
            }
        }
        admitted
    }

    fn dispatch(&mut self, incoming: Incoming) {
        let Incoming { header, payload } = incoming;
        let cookie = header.cookie;
        let command = match wire::check_request(&header, &self.session) {
            Ok(command) => command,
            Err(refusal) => {
                debug!(cookie, kind = header.kind, errno = ?refusal.errno, refusal.message, "request refused");
                self.replies.refuse(cookie, refusal.errno, refusal.message);
                return;
            }
        };
        let export = self.export;
        let op = match command {
            Command::Read { len_bytes: 0, .. } => {
                if self.session.structured {
                    self.replies.out.encode(|buf| wire::encode_done_chunk(buf, cookie));
                } else {
                    self.replies.ok(cookie);
                }
                return;
            }
            Command::Write { len_bytes: 0, .. }
            | Command::Trim { len_bytes: 0, .. }
            | Command::Cache { len_bytes: 0, .. }
            | Command::WriteZeroes { len_bytes: 0, fast: false, .. } => {
                self.replies.ok(cookie);
                return;
            }
            Command::WriteZeroes { fast: true, .. } if !export.can_fast_zero() => {
                self.replies.refuse(
                    cookie,
                    Errno::NotSup,
                    "zeroing is not faster than writing on this export",
                );
                return;
            }
            Command::WriteZeroes { len_bytes: 0, .. } => {
                self.replies.ok(cookie);
                return;
            }
            Command::Disconnect => {
                debug!("client sent NBD_CMD_DISC");
                self.disconnecting = true;
                return;
            }
            Command::Read { offset_bytes, len_bytes } => {
                self.replies.executing_bytes += len_bytes as usize;
                Op::Read { cookie, offset_bytes, len_bytes, future: export.read(offset_bytes, len_bytes) }
            }
            Command::Write { offset_bytes, fua, .. } => {
                let data = payload.expect("write requests carry their payload").freeze();
                let held_bytes = data.len();
                self.replies.executing_bytes += held_bytes;
                Op::Unit { cookie, held_bytes, future: export.write(offset_bytes, data, fua) }
            }
            Command::Flush => Op::Unit { cookie, held_bytes: 0, future: export.flush() },
            Command::Trim { offset_bytes, len_bytes, fua } => {
                Op::Unit { cookie, held_bytes: 0, future: export.trim(offset_bytes, len_bytes, fua) }
            }
            Command::Cache { offset_bytes, len_bytes } => {
                Op::Unit { cookie, held_bytes: 0, future: export.cache(offset_bytes, len_bytes) }
            }
            Command::WriteZeroes { offset_bytes, len_bytes, may_trim, fua, .. } => Op::Unit {
                cookie,
                held_bytes: 0,
                future: export.write_zeroes(offset_bytes, len_bytes, may_trim, fua),
            },
            Command::BlockStatus { offset_bytes, len_bytes, req_one } => Op::Status {
                cookie,
                len_bytes,
                req_one,
                future: export.block_status(offset_bytes, len_bytes),
            },
        };
        self.slots.insert(op);
    }

    fn io_failed(&mut self, error: io::Error) {
        if self.broken.is_none() {
            debug!(%error, "connection I/O failed");
            self.broken = Some(TransmissionEnd::Io(error));
        }
        self.replies.out.clear();
    }

    /// Drives the connection until it ends. Cancel-safe: all state lives in `self`.
    pub(crate) fn poll_run<S>(&mut self, cx: &mut Context<'_>, mut stream: Pin<&mut S>) -> Poll<()>
    where
        S: AsyncRead + AsyncWrite + ?Sized,
    {
        for _ in 0..MAX_ROUNDS_PER_POLL {
            let mut progress = self.admit();

            let wants_read = !self.stopped_reading()
                && (self.reader.mid_payload() || self.can_admit())
                && self.reader.can_fill();
            if wants_read {
                match self.reader.poll_fill(cx, stream.as_mut()) {
                    Poll::Ready(Ok(0)) => {
                        if self.reader.has_partial_request() {
                            debug!("client closed the connection in the middle of a request");
                        }
                        self.end_of_stream = true;
                        progress = true;
                    }
                    Poll::Ready(Ok(_)) => progress = true,
                    Poll::Ready(Err(error)) => {
                        self.io_failed(error);
                        progress = true;
                    }
                    Poll::Pending => {}
                }
            }

            let replies = &mut self.replies;
            if self.slots.poll_ready(cx, |done| replies.complete(done)) > 0 {
                progress = true;
            }
            if self.broken.is_some() {
                self.replies.out.clear();
            }

            if !self.replies.out.is_empty() {
                match self.replies.out.poll_write(cx, stream.as_mut()) {
                    Poll::Ready(Ok(_)) => progress = true,
                    Poll::Ready(Err(error)) => {
                        self.io_failed(error);
                        progress = true;
                    }
                    Poll::Pending => {}
                }
            } else if self.replies.out.needs_flush() && self.broken.is_none() {
                match self.replies.out.poll_flush(cx, stream.as_mut()) {
                    Poll::Ready(Ok(())) => progress = true,
                    Poll::Ready(Err(error)) => {
                        self.io_failed(error);
                        progress = true;
                    }
                    Poll::Pending => {}
                }
            }

            let quiet =
                self.slots.is_empty() && self.replies.out.is_empty() && !self.replies.out.needs_flush();
            if self.broken.is_some() && self.slots.is_empty() {
                return Poll::Ready(());
            }
            if quiet && (self.disconnecting || self.draining || self.end_of_stream) {
                return Poll::Ready(());
            }
            if !progress {
                return Poll::Pending;
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    /// Why the connection ended (after `poll_run` returned `Ready`).
    pub(crate) fn take_end(&mut self) -> TransmissionEnd {
        if let Some(end) = self.broken.take() {
            return end;
        }
        if self.disconnecting {
            TransmissionEnd::Disconnect
        } else if self.draining {
            TransmissionEnd::Shutdown
        } else {
            TransmissionEnd::EndOfStream
        }
    }
}

/// Runs the transmission phase on `stream` until the client leaves, the stream breaks or
/// `shutdown` completes; on shutdown, in-flight requests finish (within `limits.shutdown_grace`)
/// and the export is flushed.
pub(crate) async fn run<S, F>(
    mut stream: S,
    export: &dyn Export,
    session: SessionParams,
    limits: &Limits,
    shutdown: F,
) -> (TransmissionEnd, u64)
where
    S: AsyncRead + AsyncWrite + Unpin,
    F: Future<Output = ()>,
{
    let mut connection = Connection::new(export, session, limits);
    let finished = {
        let run = poll_fn(|cx| connection.poll_run(cx, Pin::new(&mut stream)));
        tokio::select! {
            () = run => true,
            () = shutdown => false,
        }
    };
    if !finished {
        connection.draining = true;
        let drain = poll_fn(|cx| connection.poll_run(cx, Pin::new(&mut stream)));
        if tokio::time::timeout(limits.shutdown_grace, drain).await.is_err() {
            warn!("in-flight requests did not finish within the shutdown grace period");
        }
        if !export.read_only()
            && let Err(error) = export.flush().await
        {
            warn!(%error, "flush at shutdown failed");
        }
    }
    let end = connection.take_end();
    let requests = connection.requests_handled;
    drop(connection);
    // Best effort: a TLS stream sends close_notify here; a plain socket shuts down its write side.
    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), stream.shutdown()).await;
    (end, requests)
}
