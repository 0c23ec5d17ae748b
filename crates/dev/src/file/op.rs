//! The future of one file-drive request: reserve a slot, dispatch, wait, continue short or
//! interrupted calls, then hand the buffer back.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use super::engine::Shared;
use super::table::{OpKind, Payload, Request, Ticket};
use crate::counters::DevCounters;
use crate::device::DevError;

/// EINTR/EAGAIN retries of one request before its error is returned.
const RETRIES_MAX: u32 = 16;

#[derive(Debug)]
enum State {
    /// Not yet submitted (possibly waiting for a free slot).
    Start {
        request: Request,
        payload: Payload,
    },
    InFlight(Ticket),
    Finished,
}

/// One request to a file drive. Dropping it early is safe: its slot keeps the buffer until the
/// kernel is done with it.
#[derive(Debug)]
pub(super) struct OpFuture<'a> {
    shared: &'a Arc<Shared>,
    counters: &'a DevCounters,
    state: State,
    /// When the request was made: its latency ends when it completes.
    started: std::time::Instant,
}

/// What the result of one call means for its request.
enum Step {
    /// Issue the request's next call (the rest of a short transfer, or a retry).
    Again,
    Done(io::Result<()>),
}

impl<'a> OpFuture<'a> {
    pub(super) fn new(
        shared: &'a Arc<Shared>,
        counters: &'a DevCounters,
        request: Request,
        payload: Payload,
    ) -> Self {
        counters.record_start();
        OpFuture {
            shared,
            counters,
            state: State::Start { request, payload },
            started: std::time::Instant::now(),
        }
    }

    fn error(&self, request: &Request, source: io::Error) -> DevError {
        DevError::Io {
            device: self.shared.name.clone(),
            offset_bytes: request.offset_bytes,
            len_bytes: request.len_bytes,
            source,
        }
    }

    fn count_success(&self, request: &Request) {
        let ns = || u64::try_from(self.started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        match request.kind {
            OpKind::Read => {
                self.counters.record_read(request.len_bytes);
                self.counters.record_read_latency(ns());
            }
            OpKind::Write { .. } => {
                self.counters.record_write(request.len_bytes);
                self.counters.record_write_latency(ns());
            }
            OpKind::Flush => self.counters.record_flush(),
            OpKind::Discard | OpKind::Zero => self.counters.record_discard(),
        }
    }
}

/// Folds one call's `result` (bytes moved or `-errno`) into `request`.
fn next_step(request: &mut Request, result: i32) -> Step {
    if result < 0 {
        let errno = -result;
        if matches!(errno, libc::EINTR | libc::EAGAIN) && request.retries < RETRIES_MAX {
            request.retries += 1;
            return Step::Again;
        }
        if request.kind == OpKind::Discard && errno == libc::EOPNOTSUPP {
            return Step::Done(Ok(())); // discard is a hint; a drive without it is fine
        }
        return Step::Done(Err(io::Error::from_raw_os_error(errno)));
    }
    if !matches!(request.kind, OpKind::Read | OpKind::Write { .. }) {
        return Step::Done(Ok(()));
    }
    let moved_bytes = u64::from(result.unsigned_abs());
    request.done_bytes += moved_bytes;
    assert!(request.done_bytes <= request.len_bytes, "kernel moved more bytes than asked: {request:?}");
    if request.done_bytes == request.len_bytes {
        Step::Done(Ok(()))
    } else if moved_bytes == 0 {
        // End of file (someone truncated it) or a device that accepts nothing more.
        let kind = if request.kind == OpKind::Read {
            io::ErrorKind::UnexpectedEof
        } else {
            io::ErrorKind::WriteZero
        };
        Step::Done(Err(io::Error::new(kind, format!("transfer stopped after {} bytes", request.done_bytes))))
    } else {
        Step::Again
    }
}

impl Future for OpFuture<'_> {
    type Output = Result<Payload, DevError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let shared = this.shared;
        let mut table = shared.table.lock();
        let ticket = match std::mem::replace(&mut this.state, State::Finished) {
            State::Start { request, payload } => {
                match table.reserve(request, payload, cx.waker()) {
                    Ok(ticket) => {
                        let kick = shared.dispatch(&mut table, ticket);
                        this.state = State::InFlight(ticket);
                        drop(table);
                        shared.kick(kick);
                    }
                    Err(payload) => this.state = State::Start { request, payload },
                }
                return Poll::Pending;
            }
            State::InFlight(ticket) => ticket,
            State::Finished => panic!("file drive request polled after it finished"),
        };
        let Some(result) = table.poll_result(ticket, cx.waker()) else {
            this.state = State::InFlight(ticket);
            return Poll::Pending;
        };
        let step = next_step(table.request(ticket), result);
        let request = *table.request(ticket);
        match step {
            Step::Again => {
                table.resume(ticket, cx.waker());
                let kick = shared.dispatch(&mut table, ticket);
                this.state = State::InFlight(ticket);
                drop(table);
                shared.kick(kick);
                Poll::Pending
            }
            Step::Done(outcome) => {
                let mut wake: Vec<Waker> = Vec::new();
                let payload = table.release(ticket, &mut wake);
                drop(table);
                wake.into_iter().for_each(Waker::wake);
                Poll::Ready(match outcome {
                    Ok(()) => {
                        this.count_success(&request);
                        Ok(payload)
                    }
                    Err(source) => {
                        this.counters.record_error();
                        Err(this.error(&request, source))
                    }
                })
            }
        }
    }
}

impl Drop for OpFuture<'_> {
    fn drop(&mut self) {
        self.counters.record_end();
        if let State::InFlight(ticket) = self.state {
            let mut wake: Vec<Waker> = Vec::new();
            self.shared.table.lock().abandon(ticket, &mut wake);
            wake.into_iter().for_each(Waker::wake);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(kind: OpKind, len_bytes: u64) -> Request {
        Request { kind, offset_bytes: 0, len_bytes, done_bytes: 0, retries: 0 }
    }

    #[test]
    fn short_transfers_continue_and_zero_progress_fails() {
        let mut r = request(OpKind::Read, 8192);
        assert!(matches!(next_step(&mut r, 4096), Step::Again));
        assert_eq!(r.done_bytes, 4096);
        assert!(
            matches!(next_step(&mut r, 0), Step::Done(Err(e)) if e.kind() == io::ErrorKind::UnexpectedEof)
        );
        let mut w = request(OpKind::Write { fua: true }, 4096);
        assert!(matches!(next_step(&mut w, 4096), Step::Done(Ok(()))));
    }

    #[test]
    fn interrupted_calls_retry_a_bounded_number_of_times() {
        let mut r = request(OpKind::Read, 4096);
        for _ in 0..RETRIES_MAX {
            assert!(matches!(next_step(&mut r, -libc::EINTR), Step::Again));
        }
        assert!(matches!(next_step(&mut r, -libc::EAGAIN), Step::Done(Err(_))));
    }

    #[test]
    fn unsupported_discard_is_not_an_error() {
        let mut d = request(OpKind::Discard, 4096);
        assert!(matches!(next_step(&mut d, -libc::EOPNOTSUPP), Step::Done(Ok(()))));
        let mut r = request(OpKind::Read, 4096);
        assert!(
            matches!(next_step(&mut r, -libc::EIO), Step::Done(Err(e)) if e.raw_os_error() == Some(libc::EIO))
        );
    }
}
