//! The request table of a file drive: a fixed number of slots, one per request in flight.
//!
//! Both engines complete requests through this table. A slot owns the request's buffer from
//! submission until the kernel (or a pool thread) is done with it, whatever happens to the future
//! that asked: a future dropped early marks its slot abandoned, and the completion frees it. That
//! is what keeps the kernel from ever writing into freed memory.

use std::collections::VecDeque;
use std::task::Waker;

use crate::buf::{IoBuf, IoBytes};

/// Largest single system call: longer requests are split into calls of at most this many bytes
/// (below the kernel's 2 GiB per-call limit and `u32` SQE lengths).
pub(super) const MAX_IO_BYTES: usize = 1 << 30;

/// What a request does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum OpKind {
    Read,
    Write {
        fua: bool,
    },
    Flush,
    Discard,
    /// Make the range read as zeros without writing it (a punched hole, BLKZEROOUT).
    Zero,
}

/// The buffer a request owns while it is in flight.
#[derive(Debug)]
pub(super) enum Payload {
    None,
    Read(IoBuf),
    Write(IoBytes),
}

/// A request and its progress (short transfers continue where the last call stopped).
#[derive(Clone, Copy, Debug)]
pub(super) struct Request {
    pub(super) kind: OpKind,
    pub(super) offset_bytes: u64,
    pub(super) len_bytes: u64,
    /// Bytes already transferred by earlier calls of this request.
    pub(super) done_bytes: u64,
    /// EINTR/EAGAIN retries so far.
    pub(super) retries: u32,
}

/// One system call's worth of a request, ready for an engine to issue.
#[derive(Debug)]
pub(super) enum Syscall {
    Read { ptr: *mut u8, len: usize, offset_bytes: u64 },
    Write { ptr: *const u8, len: usize, offset_bytes: u64, fua: bool },
    Flush,
    Discard { offset_bytes: u64, len_bytes: u64 },
    Zero { offset_bytes: u64, len_bytes: u64 },
}

#[derive(Debug)]
enum SlotState {
    Free,
    /// Submitted; `waker` is the future's, `abandoned` once the future was dropped.
    InFlight {
        waker: Option<Waker>,
        abandoned: bool,
    },
    /// The call finished with `result` (bytes or `-errno`); the future has not looked yet.
    Done(i32),
}

#[derive(Debug)]
struct Slot {
    /// Bumped every time the slot is freed, so a stale completion is caught by an assertion.
    generation: u32,
    state: SlotState,
    request: Request,
    payload: Payload,
}

/// Identifies one use of one slot (index and generation), packed into an SQE's `user_data`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Ticket {
    pub(super) index: u32,
    pub(super) generation: u32,
}

impl Ticket {
    pub(super) fn user_data(self) -> u64 {
        (u64::from(self.generation) << 32) | u64::from(self.index)
    }

    pub(super) fn from_user_data(user_data: u64) -> Ticket {
        let low = |v: u64| u32::try_from(v & u64::from(u32::MAX)).expect("masked to 32 bits");
        Ticket { index: low(user_data), generation: low(user_data >> 32) }
    }
}

/// All slots of one drive, plus the pool engine's job queue. Guarded by one mutex.
#[derive(Debug)]
pub(super) struct Table {
    slots: Box<[Slot]>,
    free: Vec<u32>,
    /// Futures waiting for a free slot; all are woken when a slot frees up.
    waiters: Vec<Waker>,
    /// Slots waiting for a pool thread (thread engine, and discards the ring cannot do).
    pub(super) jobs: VecDeque<Ticket>,
    /// Set when the drive is closing: pool threads exit once `jobs` is empty.
    pub(super) stopping: bool,
}

impl Table {
    pub(super) fn new(queue_depth: u32) -> Table {
        let slots = (0..queue_depth)
            .map(|_| Slot {
                generation: 0,
                state: SlotState::Free,
                request: Request {
                    kind: OpKind::Flush,
                    offset_bytes: 0,
                    len_bytes: 0,
                    done_bytes: 0,
                    retries: 0,
                },
                payload: Payload::None,
            })
            .collect();
        Table {
            slots,
            free: (0..queue_depth).rev().collect(),
            waiters: Vec::new(),
            jobs: VecDeque::with_capacity(queue_depth as usize),
            stopping: false,
        }
    }

    /// True when no slot is in use (nothing in flight, nothing unconsumed).
    pub(super) fn is_idle(&self) -> bool {
        self.free.len() == self.slots.len()
    }

    /// Takes a free slot for `request`, or registers `waker` to be woken when one frees up.
    pub(super) fn reserve(
        &mut self,
        request: Request,
        payload: Payload,
        waker: &Waker,
    ) -> Result<Ticket, Payload> {
        let Some(index) = self.free.pop() else {
            self.waiters.push(waker.clone());
            return Err(payload);
        };
        let slot = &mut self.slots[index as usize];
        assert!(matches!(slot.state, SlotState::Free), "free list held a busy slot");
        slot.state = SlotState::InFlight { waker: Some(waker.clone()), abandoned: false };
        slot.request = request;
        slot.payload = payload;
        Ok(Ticket { index, generation: slot.generation })
    }

    fn slot(&mut self, ticket: Ticket) -> &mut Slot {
        let slot = &mut self.slots[ticket.index as usize];
        assert_eq!(slot.generation, ticket.generation, "stale ticket for slot {}", ticket.index);
        slot
    }

    /// The request of a slot in use.
    pub(super) fn request(&mut self, ticket: Ticket) -> &mut Request {
        &mut self.slot(ticket).request
    }

    /// The next system call of a slot's request. The pointers stay valid while the slot is in use.
    pub(super) fn syscall(&mut self, ticket: Ticket) -> Syscall {
        let slot = self.slot(ticket);
        let Request { kind, offset_bytes, len_bytes, done_bytes, .. } = slot.request;
        let done = usize::try_from(done_bytes).expect("request fits in memory");
        let at = offset_bytes + done_bytes;
        match (kind, &mut slot.payload) {
            (OpKind::Read, Payload::Read(buf)) => {
                let rest = &mut buf[done..];
                Syscall::Read { len: rest.len().min(MAX_IO_BYTES), ptr: rest.as_mut_ptr(), offset_bytes: at }
            }
            (OpKind::Write { fua }, Payload::Write(bytes)) => {
                let rest = &bytes[done..];
                Syscall::Write {
                    len: rest.len().min(MAX_IO_BYTES),
                    ptr: rest.as_ptr(),
                    offset_bytes: at,
                    fua,
                }
            }
            (OpKind::Flush, _) => Syscall::Flush,
            (OpKind::Discard, _) => Syscall::Discard { offset_bytes, len_bytes },
            (OpKind::Zero, _) => Syscall::Zero { offset_bytes, len_bytes },
            (kind, payload) => panic!("request {kind:?} carries the wrong payload {payload:?}"),
        }
    }

    /// Records the result of a slot's call; its waker (if any) goes to `wake`.
    ///
    /// An abandoned slot is freed here: the kernel is done with its buffer, nobody wants it.
    pub(super) fn complete(&mut self, ticket: Ticket, result: i32, wake: &mut Vec<Waker>) {
        let slot = self.slot(ticket);
        let SlotState::InFlight { waker, abandoned } = &mut slot.state else {
            panic!("completion for slot {} which is not in flight: {:?}", ticket.index, slot.state);
        };
        if *abandoned {
            self.release(ticket, wake);
            return;
        }
        wake.extend(waker.take());
        slot.state = SlotState::Done(result);
    }

    /// The result of a finished call, or `None` (with `waker` registered) while it is in flight.
    pub(super) fn poll_result(&mut self, ticket: Ticket, waker: &Waker) -> Option<i32> {
        let slot = self.slot(ticket);
        match &mut slot.state {
            SlotState::Done(result) => Some(*result),
            SlotState::InFlight { waker: registered, .. } => {
                match registered {
                    Some(w) if w.will_wake(waker) => {}
                    _ => *registered = Some(waker.clone()),
                }
                None
            }
            SlotState::Free => panic!("polled free slot {}", ticket.index),
        }
    }

    /// Puts a finished slot back in flight for its request's next call.
    pub(super) fn resume(&mut self, ticket: Ticket, waker: &Waker) {
        let slot = self.slot(ticket);
        assert!(matches!(slot.state, SlotState::Done(_)), "resume of slot {} that is not done", ticket.index);
        slot.state = SlotState::InFlight { waker: Some(waker.clone()), abandoned: false };
    }

    /// Frees a slot that is not in flight and returns its buffer; waiting futures go to `wake`.
    pub(super) fn release(&mut self, ticket: Ticket, wake: &mut Vec<Waker>) -> Payload {
        let slot = self.slot(ticket);
        let payload = std::mem::replace(&mut slot.payload, Payload::None);
        slot.state = SlotState::Free;
        slot.generation = slot.generation.wrapping_add(1);
        self.free.push(ticket.index);
        wake.append(&mut self.waiters);
        payload
    }

    /// The future of this slot was dropped: free it now if it is done, else when it completes.
    pub(super) fn abandon(&mut self, ticket: Ticket, wake: &mut Vec<Waker>) {
        let slot = self.slot(ticket);
        match &mut slot.state {
            SlotState::InFlight { waker, abandoned } => {
                *waker = None;
                *abandoned = true;
            }
            SlotState::Done(_) => drop(self.release(ticket, wake)),
            SlotState::Free => panic!("abandon of free slot {}", ticket.index),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_request(len_bytes: u64) -> Request {
        Request { kind: OpKind::Write { fua: false }, offset_bytes: 0, len_bytes, done_bytes: 0, retries: 0 }
    }

    #[test]
    fn a_full_table_queues_waiters_and_a_release_wakes_them() {
        let mut table = Table::new(1);
        let waker = Waker::noop();
        let first = table.reserve(write_request(4096), Payload::Write(IoBytes::zeroed(4096)), waker).unwrap();
        assert!(table.reserve(write_request(4096), Payload::None, waker).is_err());
        let mut wake = Vec::new();
        table.complete(first, 4096, &mut wake);
        assert_eq!(wake.len(), 1, "the request's own future is woken");
        wake.clear();
        assert_eq!(table.poll_result(first, waker), Some(4096));
        assert!(matches!(table.release(first, &mut wake), Payload::Write(_)));
        assert_eq!(wake.len(), 1, "the waiting future is woken");
        assert!(table.is_idle());
    }

    #[test]
    fn an_abandoned_slot_keeps_its_buffer_until_completion() {
        let mut table = Table::new(2);
        let waker = Waker::noop();
        let buf = IoBuf::zeroed(4096);
        let request = Request { kind: OpKind::Read, ..write_request(4096) };
        let ticket = table.reserve(request, Payload::Read(buf), waker).unwrap();
        let mut wake = Vec::new();
        table.abandon(ticket, &mut wake);
        assert!(!table.is_idle(), "the kernel may still write into the buffer");
        table.complete(ticket, 4096, &mut wake);
        assert!(table.is_idle());
        let again = table.reserve(request, Payload::None, waker).unwrap();
        assert_ne!(again, ticket, "a reused slot gets a new generation");
    }

    #[test]
    fn completions_in_any_order_reach_their_own_slot() {
        let mut table = Table::new(3);
        let waker = Waker::noop();
        let tickets: Vec<Ticket> = (0..3u64)
            .map(|i| table.reserve(write_request(4096 * (i + 1)), Payload::None, waker).unwrap())
            .collect();
        let mut wake = Vec::new();
        for (i, &ticket) in tickets.iter().enumerate().rev() {
            table.complete(ticket, i32::try_from(i).unwrap() * 10, &mut wake);
        }
        for (i, &ticket) in tickets.iter().enumerate() {
            assert_eq!(table.poll_result(ticket, waker), Some(i32::try_from(i).unwrap() * 10));
            assert_eq!(table.request(ticket).len_bytes, 4096 * (i as u64 + 1));
        }
    }

    #[test]
    fn tickets_round_trip_through_user_data() {
        let ticket = Ticket { index: 7, generation: 0xdead_beef };
        assert_eq!(Ticket::from_user_data(ticket.user_data()), ticket);
    }
}
