//! The transmission phase of one connection.
//!
//! One task, no spawns: a single poll function reads requests in batches from a buffer, starts
//! each on the export in a [`Slots`] executor, encodes replies as they complete (in any order)
//! and sends everything that is ready with one vectored write. Admission stops at the in-flight
//! limits (request count, the connection's bytes, and its guarantee plus what it can borrow from
//! the shared budget), which is what bounds the memory clients can make us hold: a request's
//! bytes (its cost: payload plus largest reply) are counted before it is read off the buffer, and
//! a connection that cannot have them stops reading requests until they are free. Replies that a client does not take for `send_timeout`
//! close the connection.
//!
//! Every export future that was started is polled to completion, even when the client went away
//! or broke the protocol: the export never sees an operation abandoned half way.

use std::future::{Future, poll_fn};
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use stria_dev::IoBuf;
use stria_poll::BusyPoll;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::time::Sleep;
use tracing::{debug, warn};

use crate::budget::ByteBudget;
use crate::config::Limits;
use crate::conn_io::{Incoming, OutQueue, RequestReader};
use crate::export::{BoxFuture, Export, ExportError, Extent};
use crate::proto::{self, Errno, cmd};
use crate::slots::Slots;
use crate::wire::{self, Command, FramingError, RequestHeader, SessionParams};

/// The longest reply that carries no data: an error chunk with the longest message (simple
/// replies, read chunk headers and done chunks are shorter).
pub(crate) const REPLY_BOUND_BYTES: usize = wire::CHUNK_HEADER_BYTES + 6 + wire::MAX_ERROR_MESSAGE_BYTES;

/// The longest block status reply under `limits`.
fn block_status_reply_bound(limits: &Limits) -> usize {
    limits.max_extents_per_reply.saturating_mul(8).saturating_add(wire::CHUNK_HEADER_BYTES + 4)
}

/// Bytes a request may make its connection hold, from admission until its reply is sent: its
/// payload (write data, or read data when the read is within the payload limit) and its largest
/// reply.
fn request_cost(header: &RequestHeader, limits: &Limits) -> usize {
    let len = usize::try_from(header.len_bytes).expect("u32 fits usize");
    match header.kind {
        cmd::READ if header.len_bytes <= limits.max_payload_bytes => len + REPLY_BOUND_BYTES,
        // Larger writes are framing errors, found before the cost is asked for.
        cmd::WRITE => len + REPLY_BOUND_BYTES,
        cmd::BLOCK_STATUS => REPLY_BOUND_BYTES.max(block_status_reply_bound(limits)),
        _ => REPLY_BOUND_BYTES,
    }
}

/// The largest [`request_cost`] under `limits`.
pub(crate) fn request_cost_bound(limits: &Limits) -> usize {
    let largest_payload = usize::try_from(limits.max_payload_bytes).expect("u32 fits usize");
    (largest_payload + REPLY_BOUND_BYTES).max(block_status_reply_bound(limits))
}

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
        future: BoxFuture<'e, Result<(), ExportError>>,
    },
    Status {
        cookie: u64,
        len_bytes: u32,
        req_one: bool,
        future: BoxFuture<'e, Result<Vec<Extent>, ExportError>>,
    },
}

/// An operation and the bytes its connection counts for it until it completes.
struct Costed<'e> {
    cost: usize,
    op: Op<'e>,
}

/// A finished export operation.
enum Done {
    Read { cookie: u64, offset_bytes: u64, len_bytes: u32, result: Result<IoBuf, ExportError> },
    Unit { cookie: u64, result: Result<(), ExportError> },
    Status { cookie: u64, len_bytes: u32, req_one: bool, result: Result<Vec<Extent>, ExportError> },
}

impl Future for Costed<'_> {
    type Output = (usize, Done);
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<(usize, Done)> {
        let Costed { cost, op } = self.get_mut();
        let done = match op {
            Op::Read { cookie, offset_bytes, len_bytes, future } => future.as_mut().poll(cx).map(|result| {
                Done::Read { cookie: *cookie, offset_bytes: *offset_bytes, len_bytes: *len_bytes, result }
            }),
            Op::Unit { cookie, future } => {
                future.as_mut().poll(cx).map(|result| Done::Unit { cookie: *cookie, result })
            }
            Op::Status { cookie, len_bytes, req_one, future } => future.as_mut().poll(cx).map(|result| {
                Done::Status { cookie: *cookie, len_bytes: *len_bytes, req_one: *req_one, result }
            }),
        };
        done.map(|done| (*cost, done))
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
    /// Bytes counted for executing requests (their costs: write data held, read data to come,
    /// room for the reply).
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

    fn complete(&mut self, cost: usize, done: Done) {
        // The reply encoded below is at most `cost` bytes.
        self.executing_bytes -= cost;
        match done {
            Done::Read { cookie, offset_bytes, len_bytes, result } => match result {
                Ok(data) => {
                    assert_eq!(data.len(), len_bytes as usize, "export returned a read of the wrong length");
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
            },
            Done::Unit { cookie, result } => match result {
                Ok(()) => self.ok(cookie),
                Err(error) => self.export_error(cookie, &error),
            },
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
    slots: Slots<Costed<'e>>,
    replies: Replies,
    /// This connection's guarantee and what it borrowed from the shared byte budget.
    budget: ByteBudget,
    /// Cost of the write whose payload is arriving (admitted when its header was read).
    pending_cost: usize,
    /// The next request is buffered but not admitted (request slots, the connection's bytes or
    /// the shared bytes are short): read no more until it is.
    blocked: bool,
    /// Started when replies wait for the client to take bytes; `send_timeout` closes the
    /// connection.
    stall: Option<Pin<Box<Sleep>>>,
    /// The client sent DISC: read no more.
    disconnecting: bool,
    /// Shutdown: read no more, finish what is in flight.
    pub(crate) draining: bool,
    end_of_stream: bool,
    /// The stream failed or the client broke the protocol: stop all I/O, finish the export work.
    broken: Option<TransmissionEnd>,
    /// Requests handled, for the disconnect log.
    pub(crate) requests_handled: u64,
    /// Rounds of the poll loop that did something (read, completed, sent): what the busy poll
    /// watches.
    pub(crate) busy_rounds: u64,
}

impl<'e> Connection<'e> {
    pub(crate) fn new(
        export: &'e dyn Export,
        session: SessionParams,
        limits: &Limits,
        budget: ByteBudget,
    ) -> Connection<'e> {
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
            budget,
            pending_cost: 0,
            blocked: false,
            stall: None,
            disconnecting: false,
            draining: false,
            end_of_stream: false,
            broken: None,
            requests_handled: 0,
            busy_rounds: 0,
        }
    }

    /// Bytes this connection holds for requests in flight: the costs of executing requests,
    /// queued reply bytes, and the cost of a write whose payload is arriving.
    fn held_bytes(&self) -> usize {
        self.replies.executing_bytes + self.replies.out.queued_bytes() + self.pending_cost
    }

    fn stopped_reading(&self) -> bool {
        self.disconnecting || self.draining || self.end_of_stream || self.broken.is_some()
    }

    fn stopped_admitting(&self) -> bool {
        self.disconnecting || self.draining || self.broken.is_some()
    }

    fn protocol_error(&mut self, error: FramingError) {
        debug!(%error, "malformed request stream; closing the connection");
        self.broken = Some(TransmissionEnd::Protocol(error));
    }

    /// Starts every complete buffered request that the limits admit. A request is admitted when
    /// a request slot is free, the connection holds nothing or its cost fits under
    /// `max_in_flight_bytes` with what it holds, and its guarantee or the shared budget has its cost.
    fn admit(&mut self, cx: &mut Context<'_>) -> bool {
        let mut admitted = false;
        self.blocked = false;
        while !self.stopped_admitting() {
            if self.reader.mid_payload() {
                // A write admitted when its header was read: its payload is arriving.
                match self.reader.next_request() {
                    Ok(Some(incoming)) => {
                        let cost = std::mem::take(&mut self.pending_cost);
                        self.dispatch(incoming, cost);
                        admitted = true;
                        continue;
                    }
                    Ok(None) => break,
                    Err(error) => {
                        self.protocol_error(error);
                        break;
                    }
                }
            }
            if self.slots.is_full() {
                self.blocked = true;
                break;
            }
            let header = match self.reader.peek_header() {
                Ok(Some(header)) => header,
                Ok(None) => break,
                Err(error) => {
                    self.protocol_error(error);
                    break;
                }
            };
            let cost = request_cost(&header, &self.limits);
            let held = self.held_bytes();
            if held > 0 && held + cost > self.limits.max_in_flight_bytes {
                self.blocked = true;
                break;
            }
            if self.budget.poll_grant(cx, cost, held).is_pending() {
                self.blocked = true;
                break;
            }
            self.budget.consume(cost);
            admitted = true;
            match self.reader.next_request() {
                Ok(Some(incoming)) => self.dispatch(incoming, cost),
                Ok(None) => {
                    debug_assert!(self.reader.mid_payload(), "a peeked header is a request");
                    self.pending_cost = cost;
                }
                Err(error) => {
                    self.protocol_error(error);
                    break;
                }
            }
        }
        admitted
    }

    /// Starts `incoming`, whose `cost` bytes were counted: the reply it queues at once, or the
    /// export operation it starts, stays within them.
    fn dispatch(&mut self, incoming: Incoming, cost: usize) {
        self.requests_handled += 1;
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
                Op::Read { cookie, offset_bytes, len_bytes, future: export.read(offset_bytes, len_bytes) }
            }
            Command::Write { offset_bytes, fua, .. } => {
                let data = payload.expect("write requests carry their payload").freeze();
                Op::Unit { cookie, future: export.write(offset_bytes, data, fua) }
            }
            Command::Flush => Op::Unit { cookie, future: export.flush() },
            Command::Trim { offset_bytes, len_bytes, fua } => {
                Op::Unit { cookie, future: export.trim(offset_bytes, len_bytes, fua) }
            }
            Command::Cache { offset_bytes, len_bytes } => {
                Op::Unit { cookie, future: export.cache(offset_bytes, len_bytes) }
            }
            Command::WriteZeroes { offset_bytes, len_bytes, may_trim, fua, .. } => {
                Op::Unit { cookie, future: export.write_zeroes(offset_bytes, len_bytes, may_trim, fua) }
            }
            Command::BlockStatus { offset_bytes, len_bytes, req_one } => Op::Status {
                cookie,
                len_bytes,
                req_one,
                future: export.block_status(offset_bytes, len_bytes),
            },
        };
        self.replies.executing_bytes += cost;
        self.slots.insert(Costed { cost, op });
    }

    fn io_failed(&mut self, error: io::Error) {
        if self.broken.is_none() {
            debug!(%error, "connection I/O failed");
            self.broken = Some(TransmissionEnd::Io(error));
        }
        self.replies.out.clear();
    }

    /// Drives the connection until it ends. Cancel-safe: all state lives in `self`.
    pub(crate) fn poll_run<S>(&mut self, cx: &mut Context<'_>, stream: Pin<&mut S>) -> Poll<()>
    where
        S: AsyncRead + AsyncWrite + ?Sized,
    {
        let poll = self.poll_rounds(cx, stream);
        if self.stopped_admitting() {
            self.budget.cancel();
        }
        self.budget.settle(self.held_bytes());
        poll
    }

    /// True when replies have waited `send_timeout` for the client to take a byte (the timer
    /// starts at the first write that would block and stops at the next that does not).
    fn send_stalled(&mut self, cx: &mut Context<'_>) -> bool {
        let timeout = self.limits.send_timeout;
        let stall = self.stall.get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        if stall.as_mut().poll(cx).is_pending() {
            return false;
        }
        self.stall = None;
        self.budget.gauges.stalled_closed();
        let message = format!("the client took no reply bytes for {} ms", timeout.as_millis());
        self.io_failed(io::Error::new(io::ErrorKind::TimedOut, message));
        true
    }

    fn poll_rounds<S>(&mut self, cx: &mut Context<'_>, mut stream: Pin<&mut S>) -> Poll<()>
    where
        S: AsyncRead + AsyncWrite + ?Sized,
    {
        for _ in 0..MAX_ROUNDS_PER_POLL {
            let mut progress = self.admit(cx);

            let wants_read = !self.stopped_reading()
                && (self.reader.mid_payload() || !self.blocked)
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
            if self.slots.poll_ready(cx, |(cost, done)| replies.complete(cost, done)) > 0 {
                progress = true;
            }
            if self.broken.is_some() {
                self.replies.out.clear();
            }

            let sending =
                !self.replies.out.is_empty() || (self.replies.out.needs_flush() && self.broken.is_none());
            if sending {
                let sent = if self.replies.out.is_empty() {
                    self.replies.out.poll_flush(cx, stream.as_mut())
                } else {
                    self.replies.out.poll_write(cx, stream.as_mut()).map_ok(drop)
                };
                match sent {
                    Poll::Ready(Ok(())) => {
                        self.stall = None;
                        progress = true;
                    }
                    Poll::Ready(Err(error)) => {
                        self.stall = None;
                        self.io_failed(error);
                        progress = true;
                    }
                    Poll::Pending => {
                        if self.send_stalled(cx) {
                            progress = true;
                        }
                    }
                }
            } else {
                self.stall = None;
            }

            let quiet =
                self.slots.is_empty() && self.replies.out.is_empty() && !self.replies.out.needs_flush();
            if self.broken.is_some() && self.slots.is_empty() {
                return Poll::Ready(());
            }
            // At end of stream, requests still buffered are answered first (one waiting for
            // the shared budget keeps the connection open until it gets it).
            let ended = self.disconnecting || self.draining || (self.end_of_stream && !self.blocked);
            if quiet && ended {
                return Poll::Ready(());
            }
            if !progress {
                return Poll::Pending;
            }
            self.busy_rounds += 1;
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
    budget: ByteBudget,
    shutdown: F,
) -> (TransmissionEnd, u64)
where
    S: AsyncRead + AsyncWrite + Unpin,
    F: Future<Output = ()>,
{
    let mut connection = Connection::new(export, session, limits, budget);
    let mut spin = BusyPoll::new(limits.busy_poll);
    let finished = {
        let run = poll_fn(|cx| {
            let poll = connection.poll_run(cx, Pin::new(&mut stream));
            if poll.is_pending() {
                spin.after_pending(cx, connection.busy_rounds);
            }
            poll
        });
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
