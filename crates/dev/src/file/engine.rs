//! The two ways a file drive reaches the kernel: an io_uring with a completion thread, or a
//! bounded pool of threads doing blocking calls. Both fill the same [`Table`].
//!
//! io_uring: one ring per drive. Any thread submits: it takes the table lock, reserves a slot,
//! pushes the SQE (the SQ is only touched under that lock), releases the lock and calls
//! `io_uring_enter` to submit. One completion thread per drive waits in `io_uring_enter`, reaps
//! CQEs under the table lock, and wakes the futures after releasing it. The ring has as many SQ
//! entries as the table has slots, so a slot holder always finds room in the SQ, and the CQ (twice
//! that) never overflows.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::task::Waker;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use io_uring::{IoUring, opcode, squeue, types};
use parking_lot::{Condvar, Mutex};

use super::sys;
use super::table::{OpKind, Syscall, Table, Ticket};

/// `user_data` of the NOP that tells the completion thread the drive is closing.
const SHUTDOWN_USER_DATA: u64 = u64::MAX;

/// How long a submitter backs off when the kernel says EAGAIN/EBUSY, and how often it retries
/// before declaring the ring broken.
const SUBMIT_BACKOFF: Duration = Duration::from_micros(50);
const SUBMIT_RETRIES_MAX: u32 = 20_000;

/// State shared by a drive's handle, its futures and its engine threads.
pub(super) struct Shared {
    pub(super) name: Arc<str>,
    pub(super) file: File,
    pub(super) is_block_device: bool,
    ring: Option<IoUring>,
    /// Calls run on the submitting thread ([`super::IoEngine::Inline`]).
    inline: bool,
    pub(super) table: Mutex<Table>,
    /// Signals pool threads that `table.jobs` has work (or that the drive is closing).
    jobs_ready: Condvar,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("name", &self.name)
            .field("is_block_device", &self.is_block_device)
            .field("uses_ring", &self.ring.is_some())
            .finish_non_exhaustive()
    }
}

/// What to do after the table lock is released to get a dispatched call moving.
#[derive(Clone, Debug)]
pub(super) enum Kick {
    SubmitRing,
    NotifyPool,
    /// Submit the entry on the calling thread's own ring ([`super::local`]).
    LocalRing(Ticket, squeue::Entry),
}

impl Shared {
    pub(super) fn new(
        name: Arc<str>,
        file: File,
        is_block_device: bool,
        ring: Option<IoUring>,
        inline: bool,
        queue_depth: u32,
    ) -> Shared {
        Shared {
            name,
            file,
            is_block_device,
            ring,
            inline,
            table: Mutex::new(Table::new(queue_depth)),
            jobs_ready: Condvar::new(),
        }
    }

    pub(super) fn uses_ring(&self) -> bool {
        self.ring.is_some()
    }

    /// True when some requests go to pool threads: always without a ring, and block-device
    /// discards with one (io_uring has no portable BLKDISCARD).
    pub(super) fn needs_pool(&self) -> bool {
        self.ring.is_none() || self.is_block_device
    }

    /// Starts the slot's next system call. Call with the table locked, then [`Shared::kick`]
    /// after unlocking.
    pub(super) fn dispatch(&self, table: &mut Table, ticket: Ticket) -> Kick {
        let kind = table.request(ticket).kind;
        match &self.ring {
            Some(_) if !(matches!(kind, OpKind::Discard | OpKind::Zero) && self.is_block_device) => {
                let entry = self.sqe(table.syscall(ticket));
                if super::local::available() {
                    return Kick::LocalRing(ticket, entry);
                }
                self.push_shared(table, ticket, entry);
                Kick::SubmitRing
            }
            _ => {
                table.jobs.push_back(ticket);
                Kick::NotifyPool
            }
        }
    }

    /// Pushes a call on the drive's own ring. Call with the table locked (`table` proves it).
    fn push_shared(&self, _table: &mut Table, ticket: Ticket, entry: squeue::Entry) {
        let ring = self.ring.as_ref().expect("a ring call on a drive without a ring");
        let entry = entry.user_data(ticket.user_data());
        // SAFETY: the SQ is only ever touched with the table lock held, which the caller
        // holds, so this is the only `SubmissionQueue` in existence.
        let mut sq = unsafe { ring.submission_shared() };
        // SAFETY: the SQE's buffer pointer points into the slot's payload, which the slot
        // keeps alive (even if the future is dropped) until this SQE's CQE is reaped.
        let pushed = unsafe { sq.push(&entry) };
        // Every SQE in the ring belongs to a reserved slot and the SQ has one entry per
        // slot, so it cannot be full.
        assert!(pushed.is_ok(), "io_uring SQ full with a free slot: table and ring disagree");
        sq.sync();
    }

    pub(super) fn kick(self: &Arc<Self>, kick: Kick) {
        match kick {
            Kick::NotifyPool if self.inline => self.run_queued_inline(),
            Kick::NotifyPool => {
                self.jobs_ready.notify_one();
            }
            Kick::SubmitRing => self.submit_ring(),
            Kick::LocalRing(ticket, entry) => {
                if let Err(entry) = super::local::submit(self, ticket, entry) {
                    // The thread's ring went away in between (thread exit): the drive's own.
                    self.push_shared(&mut self.table.lock(), ticket, entry);
                    self.submit_ring();
                }
            }
        }
    }

    /// Records a call that a thread's ring finished ([`super::local`]). If the drive is closing
    /// and this was its last slot in use, tells the completion thread, which waits for exactly
    /// that and otherwise hears only of its own ring's calls.
    pub(super) fn complete_local(&self, ticket: Ticket, result: i32, wake: &mut Vec<Waker>) {
        let mut table = self.table.lock();
        table.complete(ticket, result, wake);
        // The table is idle, so the SQ holds no call: if it is full, it holds the close's own NOP,
        // not submitted yet, which makes the completion thread look after this completion anyway.
        if table.stopping && table.is_idle() && self.push_shutdown_nop(&mut table) {
            drop(table);
            self.submit_ring();
        }
    }

    /// Pushes the NOP that makes the completion thread look at the table (closing). Call with the
    /// table locked. False without a ring, or with the SQ full.
    fn push_shutdown_nop(&self, _table: &mut Table) -> bool {
        let Some(ring) = self.ring.as_ref() else { return false };
        let nop = opcode::Nop::new().build().user_data(SHUTDOWN_USER_DATA);
        // SAFETY: SQ access under the table lock, as everywhere.
        let mut sq = unsafe { ring.submission_shared() };
        // SAFETY: a NOP references no memory.
        let pushed = unsafe { sq.push(&nop) }.is_ok();
        sq.sync();
        pushed
    }

    fn submit_ring(&self) {
        let ring = self.ring.as_ref().expect("ring kick without a ring");
        let mut tries = 0u32;
        loop {
            match ring.submit() {
                Ok(_) => return,
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                // The SQEs stay in the ring; back off and try again (the completion thread's next
                // enter would also submit them).
                Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EBUSY)) => {
                    tries += 1;
                    assert!(tries < SUBMIT_RETRIES_MAX, "{}: io_uring submit keeps failing: {e}", self.name);
                    thread::sleep(SUBMIT_BACKOFF);
                }
                Err(e) => panic!("{}: io_uring submit failed: {e}", self.name),
            }
        }
    }

    /// The SQE for one call, without its `user_data`.
    fn sqe(&self, call: Syscall) -> squeue::Entry {
        let fd = types::Fd(self.file.as_raw_fd());
        match call {
            Syscall::Read { ptr, len, offset_bytes } => {
                opcode::Read::new(fd, ptr, sqe_len(len)).offset(offset_bytes).build()
            }
            Syscall::Write { ptr, len, offset_bytes, fua } => {
                let rw_flags = if fua { libc::RWF_DSYNC } else { 0 };
                opcode::Write::new(fd, ptr, sqe_len(len)).offset(offset_bytes).rw_flags(rw_flags).build()
            }
            Syscall::Flush => opcode::Fsync::new(fd).flags(types::FsyncFlags::DATASYNC).build(),
            Syscall::Discard { offset_bytes, len_bytes } | Syscall::Zero { offset_bytes, len_bytes } => {
                opcode::Fallocate::new(fd, len_bytes)
                    .offset(offset_bytes)
                    .mode(libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE)
                    .build()
            }
        }
    }

    /// Runs the queued calls on this thread (the inline engine), as a pool thread would, and
    /// wakes their futures (the submitter's own future is polled again right away).
    fn run_queued_inline(&self) {
        let mut wake: Vec<Waker> = Vec::new();
        loop {
            let (ticket, call) = {
                let mut table = self.table.lock();
                let Some(ticket) = table.jobs.pop_front() else { break };
                (ticket, table.syscall(ticket))
            };
            let result = self.run_blocking(call);
            self.table.lock().complete(ticket, result, &mut wake);
        }
        wake.into_iter().for_each(Waker::wake);
    }

    /// Runs one call with blocking system calls (pool threads).
    fn run_blocking(&self, call: Syscall) -> i32 {
        match call {
            // SAFETY: the pointer points into the slot's payload, kept alive and untouched by
            // anyone else until this call's completion is recorded.
            Syscall::Read { ptr, len, offset_bytes } => unsafe {
                sys::pread(&self.file, ptr, len, offset_bytes)
            },
            // SAFETY: as for reads; the payload is read-only while the slot is in flight.
            Syscall::Write { ptr, len, offset_bytes, fua } => unsafe {
                sys::pwrite(&self.file, ptr, len, offset_bytes, fua)
            },
            Syscall::Flush => sys::fdatasync(&self.file),
            Syscall::Discard { offset_bytes, len_bytes } if self.is_block_device => {
                sys::blk_discard(&self.file, offset_bytes, len_bytes)
            }
            Syscall::Zero { offset_bytes, len_bytes } if self.is_block_device => {
                sys::blk_zeroout(&self.file, offset_bytes, len_bytes)
            }
            Syscall::Discard { offset_bytes, len_bytes } | Syscall::Zero { offset_bytes, len_bytes } => {
                sys::punch_hole(&self.file, offset_bytes, len_bytes)
            }
        }
    }

    /// Tells the engine threads to finish what is queued and exit.
    ///
    /// Called when the drive handle is dropped: no future borrows the drive any more, so nothing
    /// new is submitted, but abandoned requests may still be in flight and are waited for.
    pub(super) fn begin_shutdown(&self) {
        {
            let mut table = self.table.lock();
            table.stopping = true;
            // Every earlier push was submitted by its pusher before its poll returned, and no
            // future is left to push (they borrow the drive), so the SQ has room.
            let pushed = self.push_shutdown_nop(&mut table);
            assert!(pushed || self.ring.is_none(), "{}: io_uring SQ full at shutdown", self.name);
        }
        self.jobs_ready.notify_all();
        if self.ring.is_some() {
            self.submit_ring();
        }
    }
}

fn sqe_len(len: usize) -> u32 {
    u32::try_from(len).expect("calls are capped at MAX_IO_BYTES")
}

/// Creates a ring with `queue_depth` SQ entries and twice as many CQ entries.
pub(super) fn new_ring(queue_depth: u32) -> io::Result<IoUring> {
    IoUring::builder().setup_cqsize(queue_depth.saturating_mul(2)).build(queue_depth)
}

/// Starts the engine threads of a drive: the ring's completion thread and/or `pool_threads`.
/// If one cannot be started, those already running are stopped before the error is returned.
pub(super) fn spawn_threads(shared: &Arc<Shared>, pool_threads: usize) -> io::Result<Vec<JoinHandle<()>>> {
    let mut handles = Vec::new();
    let mut spawn = |name: &str, body: fn(&Shared)| {
        let s = Arc::clone(shared);
        let spawned = thread::Builder::new().name(name.into()).spawn(move || {
            // A drive's I/O serves host requests: at the process's priority, whichever thread
            // opened the drive (a background job may have; crate::priority).
            crate::priority::foreground_or_warn(&s.name);
            body(&s)
        });
        spawned.map(|h| handles.push(h))
    };
    let mut result = Ok(());
    if shared.uses_ring() {
        result = spawn("stria-uring-cq", completion_loop);
    }
    if shared.needs_pool() {
        for _ in 0..pool_threads {
            result = result.and_then(|()| spawn("stria-io-pool", pool_loop));
        }
    }
    if let Err(e) = result {
        shared.begin_shutdown();
        handles.into_iter().for_each(|h| drop(h.join()));
        return Err(e);
    }
    Ok(handles)
}

/// The completion thread: waits for CQEs, records them, wakes futures. Exits after the shutdown
/// NOP once no slot is in use, so no buffer is freed while the kernel may still touch it.
fn completion_loop(shared: &Shared) {
    let ring = shared.ring.as_ref().expect("completion thread without a ring");
    let mut wake: Vec<Waker> = Vec::new();
    let mut shutting_down = false;
    loop {
        match ring.submitter().submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)) => {}
            Err(e) => panic!("{}: io_uring wait failed: {e}", shared.name),
        }
        let finished = {
            let mut table = shared.table.lock();
            // SAFETY: this thread is the only one that ever takes the completion queue.
            let cq = unsafe { ring.completion_shared() };
            for cqe in cq {
                if cqe.user_data() == SHUTDOWN_USER_DATA {
                    shutting_down = true;
                } else {
                    table.complete(Ticket::from_user_data(cqe.user_data()), cqe.result(), &mut wake);
                }
            }
            shutting_down && table.is_idle()
        };
        for waker in wake.drain(..) {
            waker.wake();
        }
        if finished {
            return;
        }
    }
}

/// A pool thread: takes a queued call, runs it with blocking syscalls, records the result.
fn pool_loop(shared: &Shared) {
    let mut wake: Vec<Waker> = Vec::new();
    loop {
        let (ticket, call) = {
            let mut table = shared.table.lock();
            let ticket = loop {
                if let Some(ticket) = table.jobs.pop_front() {
                    break ticket;
                }
                if table.stopping {
                    return;
                }
                shared.jobs_ready.wait(&mut table);
            };
            (ticket, table.syscall(ticket))
        };
        let result = shared.run_blocking(call);
        shared.table.lock().complete(ticket, result, &mut wake);
        for waker in wake.drain(..) {
            waker.wake();
        }
    }
}
