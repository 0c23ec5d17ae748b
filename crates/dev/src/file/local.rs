//! Rings of the thread: an io_uring per connection thread, for every file drive it calls
//! (docs/design/datapath.md §4 "Drives per core" and §6 "Rings of the thread").
//!
//! A drive's own ring ([`super::engine`]) is reaped by a completion thread of the drive's: every
//! call then crosses threads twice (the kernel completes the call in the submitter's task work,
//! the completion thread is woken for the CQE, and it wakes the future's thread). A thread that
//! runs a current-thread runtime (a connection thread, or `stria serve` on one CPU) may instead
//! [`install`] a ring of its own: the calls its tasks make to any file drive with a ring go there,
//! and the thread reaps them itself, in a task of its runtime ([`Reaper`]), so a request's drive
//! calls start and finish on the thread that read it from the socket.
//!
//! The ring is made with `SINGLE_ISSUER | DEFER_TASKRUN`: only this thread enters it, and the
//! kernel finishes its calls only when this thread asks (an enter with `GETEVENTS`), not by
//! interrupting it. The kernel signals the ring's eventfd when a call is ready to finish; the
//! runtime's reactor watches that eventfd, and the reaper task enters the ring and completes the
//! drives' table slots. `TASKRUN_FLAG` tells, without a system call, whether there is work.
//!
//! What keeps memory safe is the drives' tables, as for a drive's own ring: a slot owns the
//! call's buffer until its completion is recorded, whoever reaps it. What keeps calls from being
//! lost: the ring holds an `Arc` of every drive with a call in it, and a ring is never dropped
//! with a call in it ([`LocalRing`]'s drop waits for them, at thread exit); a drive closed on the
//! thread that owns a ring with its calls in flight first reaps them here ([`drain_drive`]), since
//! the drive's close waits for every slot to come back.

use std::cell::RefCell;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::task::Waker;

use io_uring::{IoUring, squeue};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

use super::engine::Shared;
use super::table::Ticket;

/// SQ entries of a thread's ring (calls are submitted as they are pushed, so this is a bound on
/// one submission, not on calls in flight); the CQ has eight times as many, and the kernel keeps
/// what overflows (`IORING_FEAT_NODROP`) until it is reaped.
const SQ_ENTRIES: u32 = 256;

/// How long an enter backs off when the kernel says EAGAIN/EBUSY, and how often it retries
/// before declaring the ring broken (as a drive's own ring does).
const SUBMIT_BACKOFF: std::time::Duration = std::time::Duration::from_micros(50);
const SUBMIT_RETRIES_MAX: u32 = 20_000;

/// Environment variable that turns rings of the thread off when `0`.
pub const THREAD_RINGS_ENV: &str = "STRIA_THREAD_RINGS";

thread_local! {
    static RING: RefCell<Option<LocalRing>> = const { RefCell::new(None) };
}

/// A thread's ring and the calls in it.
struct LocalRing {
    ring: IoUring,
    /// The call behind each `user_data` (an index here): its drive and its table slot.
    calls: Vec<Option<(Arc<Shared>, Ticket)>>,
    free: Vec<usize>,
    in_flight: usize,
    /// Calls submitted here since the ring was made.
    submitted: u64,
}

/// Gives the calling thread a ring of its own and returns the task that reaps it, which must be
/// spawned on the thread's current-thread runtime: it is the only thing that finishes the ring's
/// calls while the thread runs. Call it inside that runtime (the ring's eventfd is registered
/// with its reactor); a multi-thread runtime is refused (its tasks move between threads, and only
/// the thread that made a ring may enter it). `Ok(None)` if the thread has one already.
///
/// Only for a thread that runs one current-thread runtime for as long as it makes drive calls
/// and never blocks while waiting for one of its own calls: a call submitted here finishes only
/// when this thread reaps it.
pub fn install() -> io::Result<Option<Reaper>> {
    if RING.with(|r| r.borrow().is_some()) || std::env::var(THREAD_RINGS_ENV).is_ok_and(|v| v == "0") {
        return Ok(None);
    }
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::CurrentThread) => {}
        Ok(_) => return Err(io::Error::other("a ring of the thread needs a current-thread runtime")),
        Err(_) => return Err(io::Error::other("a ring of the thread is made inside the thread's runtime")),
    }
    let mut ring = IoUring::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .setup_taskrun_flag()
        .setup_cqsize(SQ_ENTRIES * 8)
        .build(SQ_ENTRIES)?;
    // SAFETY: eventfd returns a new descriptor or -1.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new descriptor that nothing else owns.
    let eventfd = unsafe { OwnedFd::from_raw_fd(fd) };
    ring.submitter().register_eventfd(eventfd.as_raw_fd())?;
    probe(&mut ring, &eventfd)?;
    // SAFETY: the AsyncFd owns the descriptor (an `OwnedFd`): it stays open and the same for the
    // AsyncFd's life.
    let eventfd = unsafe { AsyncFd::register_with_interest(eventfd, Interest::READABLE) }?;
    RING.with(|r| {
        *r.borrow_mut() =
            Some(LocalRing { ring, calls: Vec::new(), free: Vec::new(), in_flight: 0, submitted: 0 })
    });
    Ok(Some(Reaper { eventfd }))
}

/// `user_data` of the probe's timeout (no call has it: calls are indexes into a short list).
const PROBE_USER_DATA: u64 = u64::MAX;

/// Checks, once per ring, that this kernel signals the ring's eventfd when a call is ready to
/// finish (deferred task work): a 1 ms timeout, which the kernel finishes as task work, must make
/// the eventfd readable. If it does not (a kernel that has `DEFER_TASKRUN` but not that signal),
/// the reaper would never wake and calls would wait forever: refuse the ring instead, and the
/// drives' own rings take the calls.
fn probe(ring: &mut IoUring, eventfd: &OwnedFd) -> io::Result<()> {
    let timeout = io_uring::types::Timespec::new().nsec(1_000_000);
    let entry = io_uring::opcode::Timeout::new(&timeout).build().user_data(PROBE_USER_DATA);
    // SAFETY: the timespec is read when the entry is submitted, just below, while it lives.
    unsafe { ring.submission().push(&entry) }.map_err(|_| io::Error::other("a new ring's SQ is full"))?;
    ring.submit()?;
    let mut poll = libc::pollfd { fd: eventfd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    let ready = loop {
        // SAFETY: one valid pollfd.
        match unsafe { libc::poll(&mut poll, 1, 2_000) } {
            -1 if io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) => {}
            -1 => return Err(io::Error::last_os_error()),
            n => break n == 1,
        }
    };
    if !ready {
        return Err(io::Error::other(
            "this kernel does not signal a ring's eventfd for deferred completions",
        ));
    }
    empty_eventfd(eventfd.as_raw_fd());
    ring.submit_and_wait(1)?;
    match ring.completion().next() {
        Some(cqe) if cqe.user_data() == PROBE_USER_DATA => Ok(()),
        _ => Err(io::Error::other("a new ring's probe did not come back")),
    }
}

/// Calls the calling thread's ring has taken so far, or `None` if the thread has none.
pub fn calls_submitted() -> Option<u64> {
    RING.try_with(|r| r.try_borrow().ok().and_then(|r| r.as_ref().map(|l| l.submitted))).ok().flatten()
}

/// True when the calling thread has a ring that can take a call now.
pub(super) fn available() -> bool {
    RING.try_with(|r| r.try_borrow().is_ok_and(|r| r.is_some())).unwrap_or(false)
}

/// Submits `entry` (a call of `shared`'s slot `ticket`) on the calling thread's ring. Gives the
/// entry back if the thread has none (or it is busy: a call made while the ring is reaped).
pub(super) fn submit(
    shared: &Arc<Shared>,
    ticket: Ticket,
    entry: squeue::Entry,
) -> Result<(), squeue::Entry> {
    let mut entry = Some(entry);
    let _ = RING.try_with(|cell| {
        if let Ok(mut guard) = cell.try_borrow_mut()
            && let Some(local) = guard.as_mut()
            && let Some(entry) = entry.take()
        {
            local.submit(shared, ticket, entry);
        }
    });
    entry.map_or(Ok(()), Err)
}

/// Reaps the calling thread's ring without waiting: records every finished call in its drive's
/// table and wakes the futures. Returns how many calls finished.
fn reap() -> usize {
    let finished =
        RING.try_with(|cell| cell.try_borrow_mut().ok().and_then(|mut g| g.as_mut().map(|l| l.take(false))));
    match finished {
        Ok(Some(calls)) => complete(calls),
        _ => 0,
    }
}

/// If the calling thread's ring has calls in flight, waits for at least one and finishes what is
/// ready (true); else false. For a thread that blocks outside its runtime ([`crate::exec`]):
/// its ring's calls finish only when it reaps them.
pub(crate) fn wait_for_a_call() -> bool {
    let finished = RING.try_with(|cell| {
        let mut guard = cell.try_borrow_mut().ok()?;
        let local = guard.as_mut()?;
        (local.in_flight > 0).then(|| local.take(true))
    });
    match finished {
        Ok(Some(calls)) => {
            complete(calls);
            true
        }
        _ => false,
    }
}

/// Waits, on the calling thread, for every call of `shared` in this thread's ring: a drive that
/// is closed waits for all its calls, and those in this thread's ring finish only when this thread
/// reaps them.
pub(super) fn drain_drive(shared: &Arc<Shared>) {
    loop {
        let finished = RING.try_with(|cell| {
            let mut guard = cell.try_borrow_mut().ok()?;
            let local = guard.as_mut()?;
            let mine = local.calls.iter().flatten().any(|(s, _)| Arc::ptr_eq(s, shared));
            mine.then(|| local.take(true))
        });
        match finished {
            Ok(Some(calls)) => {
                complete(calls);
            }
            _ => return,
        }
    }
}

impl LocalRing {
    fn submit(&mut self, shared: &Arc<Shared>, ticket: Ticket, entry: squeue::Entry) {
        let index = self.free.pop().unwrap_or_else(|| {
            self.calls.push(None);
            self.calls.len() - 1
        });
        self.calls[index] = Some((Arc::clone(shared), ticket));
        self.in_flight += 1;
        self.submitted += 1;
        let entry = entry.user_data(index as u64);
        loop {
            // SAFETY: the entry's buffer lies in the slot's payload, which the slot keeps alive
            // (even if the future is dropped) until this call's completion is recorded.
            if unsafe { self.ring.submission().push(&entry) }.is_ok() {
                break;
            }
            self.enter(false); // the SQ is full: submit what it holds, then push again
        }
        self.enter(false);
    }

    /// Submits what the SQ holds and, when `wait` or when the kernel has calls to finish, runs
    /// them (enter with `GETEVENTS`). Backs off and retries while the kernel is short of memory
    /// (EAGAIN) or its CQ (EBUSY), as a drive's own ring does.
    fn enter(&mut self, wait: bool) {
        let mut tries = 0u32;
        loop {
            let result = if wait { self.ring.submit_and_wait(1) } else { self.submit_or_run() };
            match result {
                Ok(_) => return,
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EBUSY)) => {
                    tries += 1;
                    assert!(tries < SUBMIT_RETRIES_MAX, "a thread's io_uring keeps refusing calls: {e}");
                    std::thread::sleep(SUBMIT_BACKOFF);
                }
                Err(e) => panic!("a thread's io_uring failed: {e}"),
            }
        }
    }

    /// One enter without waiting: submits the SQ, and runs the kernel's finished calls if the
    /// taskrun flag says there are any (`submit_and_wait(0)` adds `GETEVENTS` then).
    fn submit_or_run(&mut self) -> io::Result<usize> {
        let pending = !self.ring.submission().is_empty();
        let taskrun = self.ring.submission().taskrun() || self.ring.submission().cq_overflow();
        if pending || taskrun { self.ring.submit_and_wait(0) } else { Ok(0) }
    }

    /// Takes the finished calls off the CQ (after running the kernel's pending work; waiting for
    /// at least one if `wait` and one is in flight).
    fn take(&mut self, wait: bool) -> Vec<(Arc<Shared>, Ticket, i32)> {
        self.enter(wait && self.in_flight > 0);
        let mut done = Vec::new();
        for cqe in self.ring.completion() {
            let index = usize::try_from(cqe.user_data()).expect("user_data is an index");
            let (shared, ticket) = self.calls[index].take().expect("a completion for a call in flight");
            self.free.push(index);
            self.in_flight -= 1;
            done.push((shared, ticket, cqe.result()));
        }
        done
    }
}

/// Records finished calls in their drives' tables and wakes their futures, with the thread's ring
/// not borrowed (a waker may do anything).
fn complete(calls: Vec<(Arc<Shared>, Ticket, i32)>) -> usize {
    let n = calls.len();
    let mut wake: Vec<Waker> = Vec::new();
    for (shared, ticket, result) in calls {
        shared.complete_local(ticket, result, &mut wake);
    }
    wake.into_iter().for_each(Waker::wake);
    n
}

impl Drop for LocalRing {
    /// At thread exit: waits for the calls still in the ring (their futures were dropped with the
    /// runtime; the kernel may still be writing into their buffers, which their slots hold).
    fn drop(&mut self) {
        while self.in_flight > 0 {
            complete(self.take(true));
        }
    }
}

/// The task that reaps a thread's ring: it waits until the kernel signals the ring's eventfd and
/// then finishes what is ready. Spawn it on the thread that [`install`]ed the ring.
#[derive(Debug)]
pub struct Reaper {
    eventfd: AsyncFd<OwnedFd>,
}

impl Reaper {
    /// Runs until the runtime drops it (or its reactor shuts down). Must be polled on the thread
    /// whose ring it reaps.
    pub async fn run(self) {
        loop {
            let Ok(mut ready) = self.eventfd.readable().await else { return };
            // Empty the counter (non-blocking; nothing to read is fine), then reap. A signal
            // after the reap is a new readiness event, which `clear_ready` keeps.
            empty_eventfd(self.eventfd.as_raw_fd());
            reap();
            ready.clear_ready();
        }
    }
}

/// Empties an eventfd's counter (non-blocking: nothing to read is fine).
fn empty_eventfd(fd: std::os::fd::RawFd) {
    let mut count = [0u8; 8];
    // SAFETY: reads at most 8 bytes into a local buffer.
    let _ = unsafe { libc::read(fd, count.as_mut_ptr().cast(), count.len()) };
}
