//! One connection: the login phase, then the full feature phase (docs/design/iscsi.md §4).
//!
//! Three kinds of task share a connection. A PDU reader turns the byte stream into PDUs (with
//! the negotiated digests and the data bound checked before anything is read). The connection's
//! own loop ([`Conn`]) keeps the command window, collects each write's data (immediate,
//! unsolicited, then asked for with R2Ts), admits commands within the data budget, answers NOP,
//! text, task management and logout, and spawns one task per command that runs it on the
//! logical unit. A writer numbers everything that goes out (StatSN, ExpCmdSN, MaxCmdSN) in the
//! order it sends it and splits read data into Data-In PDUs.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

use parking_lot::Mutex;
use stria_dev::{IoBuf, IoBytes};
use stria_front::Attachment;
use stria_poll::BusyPoll;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufReader, ReadHalf, WriteHalf};
use tokio::sync::mpsc;

use crate::login::{Login, Params, SessionType, Step};
use crate::pdu::{self, Bhs, Digests, NO_TAG, Pdu, PduError, op, reject};
use crate::scsi::{self, LogicalUnit, Nexus, Response};
use crate::target::Target;
use crate::text;

/// Commands in progress per connection (the command window).
pub const WINDOW: u32 = 32;
/// Immediate commands in progress per connection (outside the window).
const IMMEDIATE_MAX: u32 = 8;
/// Bytes of data held for commands in progress per connection (write data asked for with
/// R2Ts, and the data reads will return); a command that would pass it waits.
pub const DATA_BUDGET_BYTES: u64 = 32 << 20;
/// Largest transfer of one command (VPD 0xB0's MAXIMUM TRANSFER LENGTH).
pub const TRANSFER_MAX_BYTES: u64 = scsi::MAX_TRANSFER_BYTES;

/// Why a connection ended other than by logout or the initiator closing it.
#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    /// Reading a PDU failed.
    #[error(transparent)]
    Pdu(#[from] PduError),
    /// Writing failed.
    #[error("connection: {0}")]
    Io(#[from] std::io::Error),
    /// The initiator broke the protocol (the connection is closed after a Reject).
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The login failed or took too long.
    #[error("login: {0}")]
    Login(String),
}

/// The reading half of a connection.
type Rd<S> = BufReader<ReadHalf<S>>;
/// The writing half of a connection.
type Wr<S> = WriteHalf<S>;

/// Serves one accepted connection (TCP, or a pipe in the fuzzer) to its end. `portal` is the
/// address it was accepted on (what SendTargets reports).
pub(crate) async fn run<S>(
    target: Arc<Target>,
    stream: S,
    peer: String,
    portal: String,
) -> Result<(), ConnError>
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (rd, mut wr) = tokio::io::split(stream);
    let mut rd = BufReader::with_capacity(256 * 1024, rd);
    let Ok(permit) = Arc::clone(&target.logins).try_acquire_owned() else {
        target.counters.failed_logins.fetch_add(1, Ordering::Relaxed);
        return Err(ConnError::Login(format!("more than {} logins in progress", target.config.max_logins)));
    };
    let mut stopping = target.stopping.subscribe();
    let login = tokio::select! {
        login = tokio::time::timeout(target.config.login_timeout, login(&target, &mut rd, &mut wr)) => login,
        _ = crate::target::stopped(&mut stopping) => return Ok(()),
    };
    drop(permit);
    let (params, stat_sn, exp_cmd_sn) = match login {
        Ok(Ok(Some(done))) => done,
        Ok(Ok(None)) => {
            target.counters.failed_logins.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        Ok(Err(e)) => {
            target.counters.failed_logins.fetch_add(1, Ordering::Relaxed);
            return Err(e);
        }
        Err(_) => {
            target.counters.failed_logins.fetch_add(1, Ordering::Relaxed);
            return Err(ConnError::Login(format!("not done within {:?}", target.config.login_timeout)));
        }
    };
    let session = match params.session_type {
        SessionType::Discovery => None,
        SessionType::Normal => {
            let volume = target.volume_of(&params.target_name);
            let Some(attachment) = volume.as_deref().and_then(|v| target.registry.attach(v)) else {
                return Err(ConnError::Login(format!("{} is no longer served", params.target_name)));
            };
            let unit = target.unit(attachment.name());
            let nexus = Nexus {
                initiator_port: format!("{},i,0x{:012x}", params.initiator_name, params.isid),
                relative_target_port: 1,
            };
            unit.nexus_added(&nexus);
            Some(SessionCtx {
                attachment: Arc::new(attachment),
                unit,
                nexus,
                ended: std::sync::atomic::AtomicBool::new(false),
            })
        }
    };
    tracing::info!(%peer, initiator = %params.initiator_name, target = %params.target_name,
        kind = ?params.session_type, "iscsi: logged in");
    target.counters.sessions.fetch_add(1, Ordering::Relaxed);
    let result = full_feature(&target, rd, wr, params, stat_sn, exp_cmd_sn, session.as_ref(), portal).await;
    target.counters.sessions.fetch_sub(1, Ordering::Relaxed);
    if let Some(s) = &session {
        s.end_nexus();
    }
    if matches!(result, Err(ConnError::Protocol(_))) {
        target.counters.protocol_errors.fetch_add(1, Ordering::Relaxed);
    }
    result
}

/// The login phase: `Some` with the parameters, the next StatSN and the ExpCmdSN when it
/// succeeded, `None` when it failed (the failure was answered).
async fn login<S: AsyncRead + AsyncWrite + Send + 'static>(
    target: &Target,
    rd: &mut Rd<S>,
    wr: &mut Wr<S>,
) -> Result<Option<(Params, u32, u32)>, ConnError> {
    let mut login = Login::new(target.config.offer, WINDOW).with_chap(target.config.chap.clone());
    loop {
        let req = pdu::read_pdu(rd, Digests::default(), text::TEXT_MAX_BYTES).await?;
        let step = login.step(&req, |name| target.volume_of(name).is_some(), || target.new_tsih());
        let mut out = Vec::new();
        match step {
            Step::Continue(bhs, data) => {
                pdu::encode_pdu(&mut out, bhs, &data, Digests::default());
                wr.write_all(&out).await?;
            }
            Step::Done(bhs, data) => {
                pdu::encode_pdu(&mut out, bhs, &data, Digests::default());
                wr.write_all(&out).await?;
                let (stat_sn, exp_cmd_sn) = login.sequence();
                return Ok(Some((login.params().clone(), stat_sn, exp_cmd_sn)));
            }
            Step::Fail(bhs) => {
                tracing::info!(status = format_args!("{:#06x}", bhs.u16_at(36)), "iscsi: login refused");
                pdu::encode_pdu(&mut out, bhs, &[], Digests::default());
                wr.write_all(&out).await?;
                return Ok(None);
            }
        }
    }
}

/// What a normal session addresses.
struct SessionCtx {
    attachment: Arc<Attachment>,
    unit: Arc<LogicalUnit>,
    nexus: Nexus,
    /// The nexus was removed from the unit (at logout, before the response; else when the
    /// connection ends): once only, so a later session of the same nexus keeps its state.
    ended: std::sync::atomic::AtomicBool,
}

impl SessionCtx {
    /// Ends the I_T nexus at the unit (its SPC-2 reservation released), once.
    fn end_nexus(&self) {
        if !self.ended.swap(true, Ordering::SeqCst) {
            self.unit.nexus_removed(&self.nexus);
        }
    }
}

/// The command window, shared by the connection's loop (which takes commands in) and the
/// writer (which reports it in every PDU).
#[derive(Debug, Clone, Copy)]
struct Window {
    exp_cmd_sn: u32,
    /// Non-immediate SCSI commands received and not yet answered.
    in_progress: u32,
    /// Immediate SCSI commands received and not yet answered.
    immediate: u32,
}

impl Window {
    fn max_cmd_sn(&self) -> u32 {
        self.exp_cmd_sn.wrapping_sub(1).wrapping_add(WINDOW.saturating_sub(self.in_progress))
    }
}

/// How a PDU the writer sends uses StatSN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stat {
    /// It carries a status: the next StatSN, which then advances.
    Advance,
    /// It carries the next StatSN without advancing it (R2T, an unsolicited NOP-In).
    Peek,
}

/// What the writer sends.
enum Out {
    /// A PDU: the writer fills in StatSN (bytes 24-27), ExpCmdSN and MaxCmdSN (28-35).
    Pdu { bhs: Bhs, data: Vec<u8>, stat: Stat },
    /// A command's answer.
    Answer(Answer),
}

/// A command's outcome, for the writer to send as Data-In PDUs and a status.
struct Answer {
    itt: u32,
    immediate: bool,
    edtl: u32,
    /// Residual of a write: the data the initiator was to send that the command did not use
    /// (underflow) or the data the command needed and did not get (overflow).
    write_residual: Option<Residual>,
    /// R2Ts sent for the command (its SCSI Response's ExpDataSN).
    r2ts: u32,
    response: Response,
    state: Arc<AtomicU8>,
}

/// A running command's state: the writer and an abort race for it, and exactly one wins.
const RUNNING: u8 = 0;
/// Aborted: its answer is never sent.
const ABORTED: u8 = 1;
/// Its answer was taken by the writer: too late to abort.
const ANSWERED: u8 = 2;

#[derive(Debug, Clone, Copy)]
enum Residual {
    Under(u32),
    Over(u32),
}

impl Residual {
    fn of(expected: u64, actual: u64) -> Option<Residual> {
        let n = |d: u64| u32::try_from(d).unwrap_or(u32::MAX);
        match actual.cmp(&expected) {
            std::cmp::Ordering::Less => Some(Residual::Under(n(expected - actual))),
            std::cmp::Ordering::Greater => Some(Residual::Over(n(actual - expected))),
            std::cmp::Ordering::Equal => None,
        }
    }

    /// Byte 1 flags (O 0x04, U 0x02) and the Residual Count.
    fn encode(r: Option<Residual>) -> (u8, u32) {
        match r {
            Some(Residual::Over(n)) => (0x04, n),
            Some(Residual::Under(n)) => (0x02, n),
            None => (0, 0),
        }
    }
}

/// Sends what the connection's loop and the command tasks give it, numbered, until every
/// sender is gone.
async fn writer<W: AsyncWrite + Unpin>(
    mut wr: W,
    mut rx: mpsc::Receiver<Out>,
    window: Arc<Mutex<Window>>,
    params: Params,
    mut stat_sn: u32,
    sent: Arc<AtomicU64>,
) -> std::io::Result<()> {
    let digests = Digests { header: params.header_digest, data: params.data_digest };
    let segment = usize::try_from(params.send_data_segment).unwrap_or(8192).max(512);
    let burst = usize::try_from(params.max_burst).unwrap_or(262_144).max(512);
    let mut buf = Vec::with_capacity(1 << 20);
    while let Some(first) = rx.recv().await {
        buf.clear();
        let mut next = Some(first);
        // Everything already queued goes out in one write.
        while let Some(out) = next.take() {
            encode_out(&mut buf, out, &window, &mut stat_sn, digests, segment, burst);
            if buf.len() < 1 << 20 {
                next = rx.try_recv().ok();
            }
        }
        if !buf.is_empty() {
            wr.write_all(&buf).await?;
            sent.fetch_add(1, Ordering::Relaxed);
        }
        // A large read's copy is not kept for the connection's life.
        if buf.capacity() > 4 << 20 {
            buf = Vec::with_capacity(1 << 20);
        }
    }
    wr.shutdown().await
}

/// Appends `out` to `buf` as PDUs.
fn encode_out(
    buf: &mut Vec<u8>,
    out: Out,
    window: &Mutex<Window>,
    stat_sn: &mut u32,
    digests: Digests,
    segment: usize,
    burst: usize,
) {
    let mut number = |bhs: &mut Bhs, stat: Option<Stat>, window: &Window| {
        match stat {
            Some(Stat::Advance) => {
                bhs.set_u32(24, *stat_sn);
                *stat_sn = stat_sn.wrapping_add(1);
            }
            Some(Stat::Peek) => {
                bhs.set_u32(24, *stat_sn);
            }
            None => {}
        }
        bhs.set_u32(28, window.exp_cmd_sn).set_u32(32, window.max_cmd_sn());
    };
    match out {
        Out::Pdu { mut bhs, data, stat } => {
            number(&mut bhs, Some(stat), &window.lock());
            pdu::encode_pdu(buf, bhs, &data, digests);
        }
        Out::Answer(a) => {
            // The command leaves the window before its answer is numbered, so the answer
            // itself opens the window again.
            let w = {
                let mut w = window.lock();
                if a.immediate {
                    w.immediate = w.immediate.saturating_sub(1);
                } else {
                    w.in_progress = w.in_progress.saturating_sub(1);
                }
                *w
            };
            if a.state.compare_exchange(RUNNING, ANSWERED, Ordering::AcqRel, Ordering::Acquire).is_err() {
                return;
            }
            let r = a.response;
            let data: &[u8] = r.data_in.as_deref().unwrap_or(&[]);
            // Data for the initiator: it gets at most what it expects, and the difference is
            // the residual. A command without data reports its write residual, if any.
            let (xfer, residual) = match &r.data_in {
                Some(_) => {
                    let xfer = data.len().min(usize::try_from(a.edtl).unwrap_or(usize::MAX));
                    (xfer, Residual::of(u64::from(a.edtl), data.len() as u64))
                }
                None => (0, a.write_residual),
            };
            let mut data_sn = 0u32;
            let good = r.status == scsi::GOOD && r.sense.is_none();
            if good && xfer > 0 {
                let mut at = 0;
                while at < xfer {
                    let n = segment.min(xfer - at).min(burst - at % burst);
                    let last = at + n == xfer;
                    let mut bhs = Bhs::new(op::DATA_IN);
                    bhs.set_u32(16, a.itt).set_u32(20, NO_TAG);
                    bhs.set_u32(36, data_sn).set_u32(40, u32::try_from(at).unwrap_or(u32::MAX));
                    data_sn = data_sn.wrapping_add(1);
                    if last {
                        let (flags, count) = Residual::encode(residual);
                        bhs.0[1] = 0x80 | 0x01 | flags;
                        bhs.0[3] = r.status;
                        bhs.set_u32(44, count);
                        number(&mut bhs, Some(Stat::Advance), &w);
                    } else {
                        if (at + n) % burst == 0 {
                            bhs.0[1] = 0x80;
                        }
                        number(&mut bhs, None, &w);
                    }
                    pdu::encode_pdu(buf, bhs, &data[at..at + n], digests);
                    at += n;
                }
                return;
            }
            let mut bhs = Bhs::new(op::SCSI_RESPONSE);
            let (flags, count) = Residual::encode(residual);
            bhs.0[1] = 0x80 | flags;
            bhs.0[3] = r.status;
            bhs.set_u32(16, a.itt).set_u32(36, a.r2ts).set_u32(44, count);
            number(&mut bhs, Some(Stat::Advance), &w);
            let mut sense_segment = Vec::new();
            if let Some(sense) = &r.sense {
                let len = u16::try_from(sense.len()).unwrap_or(u16::MAX);
                sense_segment.extend_from_slice(&len.to_be_bytes());
                sense_segment.extend_from_slice(&sense[..usize::from(len)]);
            }
            pdu::encode_pdu(buf, bhs, &sense_segment, digests);
        }
    }
}

/// A command's data being collected.
struct Collect {
    immediate: bool,
    cdb: Vec<u8>,
    edtl: u32,
    /// Bytes of data the command uses (at most the EDTL).
    want: usize,
    /// The data, `filled` bytes of it received.
    buf: IoBuf,
    filled: usize,
    /// Bytes the initiator sent (offsets continue from here; may pass `want`).
    received: usize,
    /// Unsolicited Data-Out still to come (the command's F bit was clear).
    unsolicited: bool,
    /// The R2T outstanding: its tag and the offset where its burst ends.
    r2t: Option<(u32, usize)>,
    r2ts: u32,
    /// The DataSN the next Data-Out must carry (from 0 in each sequence: the unsolicited one,
    /// then each R2T's).
    data_sn: u32,
    residual: Option<Residual>,
    /// Bytes of the data budget this command holds (0 until admitted).
    budget: u64,
    /// Waiting in the admission queue.
    queued: bool,
}

/// A command in progress.
enum Task {
    Collecting(Box<Collect>),
    Running { state: Arc<AtomicU8> },
}

/// A command task ended (its answer is queued at the writer before this is sent).
struct Done {
    itt: u32,
    budget: u64,
}

/// A task management request waiting for tasks to end.
struct TmfWait {
    bhs: Bhs,
    tasks: HashSet<u32>,
    reset: bool,
}

/// The connection's loop in the full feature phase.
struct Conn<'a> {
    target: &'a Target,
    session: Option<&'a SessionCtx>,
    params: Params,
    portal: String,
    window: Arc<Mutex<Window>>,
    out: mpsc::Sender<Out>,
    tasks: HashMap<u32, Task>,
    budget_used: u64,
    admission: VecDeque<u32>,
    next_ttt: u32,
    done_tx: mpsc::UnboundedSender<Done>,
    tmf: Vec<TmfWait>,
    /// Text request data received with the C bit, and text response data still to send.
    text_in: Vec<u8>,
    text_out: Option<(u32, Vec<u8>)>,
    /// A logout waiting for the tasks in progress.
    logout: Option<Bhs>,
    closed: bool,
}

#[allow(clippy::too_many_arguments)]
async fn full_feature<S: AsyncRead + AsyncWrite + Send + 'static>(
    target: &Target,
    rd: Rd<S>,
    wr: Wr<S>,
    params: Params,
    stat_sn: u32,
    exp_cmd_sn: u32,
    session: Option<&SessionCtx>,
    portal: String,
) -> Result<(), ConnError> {
    let window = Arc::new(Mutex::new(Window { exp_cmd_sn, in_progress: 0, immediate: 0 }));
    let (out, out_rx) = mpsc::channel(2 * WINDOW as usize);
    // Writes the writer made: with the reads, the activity the reader's busy poll watches.
    let sent = Arc::new(AtomicU64::new(0));
    let writer =
        tokio::spawn(writer(wr, out_rx, Arc::clone(&window), params.clone(), stat_sn, Arc::clone(&sent)));
    let digests = Digests { header: params.header_digest, data: params.data_digest };
    let max_data = usize::try_from(params.recv_data_segment).unwrap_or(8192);
    let (pdu_tx, mut pdus) = mpsc::channel(4);
    let mut spin = BusyPoll::new(target.config.busy_poll);
    let reader = tokio::spawn(async move {
        let mut rd = rd;
        let mut read_pdus = 0u64;
        loop {
            let read = {
                let mut reading = std::pin::pin!(pdu::read_pdu(&mut rd, digests, max_data));
                std::future::poll_fn(|cx| {
                    let poll = reading.as_mut().poll(cx);
                    if poll.is_pending() {
                        spin.after_pending(cx, read_pdus.wrapping_add(sent.load(Ordering::Relaxed)));
                    }
                    poll
                })
                .await
            };
            read_pdus += 1;
            let stop = read.is_err();
            if pdu_tx.send(read).await.is_err() || stop {
                break;
            }
        }
    });
    let (done_tx, mut done_rx) = mpsc::unbounded_channel();
    let mut conn = Conn {
        target,
        session,
        params,
        portal,
        window,
        out,
        tasks: HashMap::new(),
        budget_used: 0,
        admission: VecDeque::new(),
        next_ttt: 1,
        done_tx,
        tmf: Vec::new(),
        text_in: Vec::new(),
        text_out: None,
        logout: None,
        closed: false,
    };
    let mut stopping = target.stopping.subscribe();
    let mut draining = false;
    let result: Result<(), ConnError> = loop {
        tokio::select! {
            biased;
            Some(done) = done_rx.recv() => {
                if let Err(e) = conn.on_done(done).await {
                    break Err(e);
                }
            }
            // The target stops: no more commands are read; those running answer first.
            _ = crate::target::stopped(&mut stopping), if !draining => {
                draining = true;
                conn.tasks.retain(|_, t| matches!(t, Task::Running { .. }));
            }
            read = pdus.recv(), if conn.logout.is_none() && !draining => match read {
                Some(Ok(pdu)) => {
                    if let Err(e) = conn.on_pdu(pdu).await {
                        break Err(e);
                    }
                }
                Some(Err(PduError::Io(e))) if e.kind() == std::io::ErrorKind::UnexpectedEof => break Ok(()),
                Some(Err(e)) => break Err(e.into()),
                None => break Ok(()),
            },
        }
        if conn.closed || (draining && conn.tasks.is_empty()) {
            break Ok(());
        }
    };
    reader.abort();
    // Commands still running are polled to completion by their own tasks; the nexus ends only
    // after its last one. Their answers (and a last Reject) go out while the initiator reads;
    // one that stopped reading gets 5 s, then the writer is stopped and the answers dropped.
    conn.tasks.retain(|_, t| matches!(t, Task::Running { .. }));
    let mut tasks = std::mem::take(&mut conn.tasks);
    drop(conn);
    let mut drain = std::pin::pin!(async {
        while !tasks.is_empty() {
            match done_rx.recv().await {
                Some(done) => {
                    tasks.remove(&done.itt);
                }
                None => break,
            }
        }
    });
    let mut writer = writer;
    let grace = std::time::Duration::from_secs(5);
    if tokio::time::timeout(grace, drain.as_mut()).await.is_err() {
        writer.abort();
        drain.await;
    }
    match tokio::time::timeout(grace, &mut writer).await {
        Ok(Ok(Err(e))) if result.is_ok() => Err(e.into()),
        Ok(_) => result,
        Err(_) => {
            writer.abort();
            result
        }
    }
}

impl Conn<'_> {
    async fn send(&self, bhs: Bhs, data: Vec<u8>, stat: Stat) -> Result<(), ConnError> {
        self.out
            .send(Out::Pdu { bhs, data, stat })
            .await
            .map_err(|_| ConnError::Io(std::io::ErrorKind::BrokenPipe.into()))
    }

    /// Answers a PDU with a Reject carrying its header.
    async fn reject(&self, reason: u8, bhs: &Bhs) -> Result<(), ConnError> {
        let mut r = Bhs::new(op::REJECT);
        r.0[1] = 0x80;
        r.0[2] = reason;
        r.set_u32(16, NO_TAG);
        self.send(r, bhs.0.to_vec(), Stat::Advance).await
    }

    /// Rejects the PDU and ends the connection.
    async fn protocol_error(&mut self, bhs: &Bhs, why: String) -> Result<(), ConnError> {
        self.reject(reject::PROTOCOL_ERROR, bhs).await?;
        Err(ConnError::Protocol(why))
    }

    /// Takes a PDU's CmdSN: true when the PDU is to be handled. A non-immediate PDU must carry
    /// ExpCmdSN (one connection: anything else is outside the window or a gap) and, for a SCSI
    /// command, find room in the window; otherwise it is dropped (RFC 7143 §4.2.2.1).
    fn take_cmd_sn(&self, bhs: &Bhs, scsi_command: bool) -> bool {
        let mut w = self.window.lock();
        if bhs.immediate() {
            if scsi_command {
                if w.immediate >= IMMEDIATE_MAX {
                    return false;
                }
                w.immediate += 1;
            }
            return true;
        }
        let cmd_sn = bhs.u32_at(24);
        if cmd_sn != w.exp_cmd_sn || (scsi_command && w.in_progress >= WINDOW) {
            tracing::debug!(cmd_sn, exp = w.exp_cmd_sn, "iscsi: CmdSN outside the window: dropped");
            return false;
        }
        if scsi_command {
            w.in_progress += 1;
        }
        w.exp_cmd_sn = w.exp_cmd_sn.wrapping_add(1);
        true
    }

    async fn on_pdu(&mut self, pdu: Pdu) -> Result<(), ConnError> {
        let bhs = pdu.bhs;
        if !pdu.data_digest_ok {
            // Error recovery level 0: the data is lost and so is the connection.
            self.reject(reject::DATA_DIGEST, &bhs).await?;
            return Err(ConnError::Protocol("data digest error".into()));
        }
        match bhs.opcode() {
            op::SCSI_COMMAND => self.on_command(pdu).await,
            op::DATA_OUT => self.on_data_out(pdu).await,
            op::NOP_OUT => self.on_nop(pdu).await,
            op::TEXT => self.on_text(pdu).await,
            op::TASK_MGMT => self.on_tmf(pdu).await,
            op::LOGOUT => self.on_logout(pdu).await,
            op::SNACK => self.reject(reject::NOT_SUPPORTED, &bhs).await,
            other => {
                self.protocol_error(&bhs, format!("opcode {other:#04x} in the full feature phase")).await
            }
        }
    }

    async fn on_nop(&mut self, pdu: Pdu) -> Result<(), ConnError> {
        let bhs = pdu.bhs;
        if !self.take_cmd_sn(&bhs, false) || bhs.itt() == NO_TAG {
            // A NOP-Out with no tag answers a ping of ours (the target sends none) or wants
            // no answer.
            return Ok(());
        }
        let mut r = Bhs::new(op::NOP_IN);
        r.0[1] = 0x80;
        r.0[8..16].copy_from_slice(&bhs.0[8..16]);
        r.set_u32(16, bhs.itt()).set_u32(20, NO_TAG);
        self.send(r, pdu.data, Stat::Advance).await
    }

    async fn on_command(&mut self, pdu: Pdu) -> Result<(), ConnError> {
        let bhs = pdu.bhs;
        if self.session.is_none() {
            return self.protocol_error(&bhs, "a SCSI command in a discovery session".into()).await;
        };
        if !self.take_cmd_sn(&bhs, true) {
            if bhs.immediate() {
                // Too many immediate commands at once: refused, so the initiator is not left
                // waiting (RFC 7143 §11.17.1, reason 0x06).
                return self.reject(reject::IMMEDIATE_REJECTED, &bhs).await;
            }
            return Ok(());
        }
        let itt = bhs.itt();
        if self.tasks.contains_key(&itt) {
            self.release_window(bhs.immediate());
            return self.protocol_error(&bhs, format!("task tag {itt:#x} already in use")).await;
        }
        let mut cdb = bhs.0[32..48].to_vec();
        if let Some(extended) = extended_cdb(&pdu.ahs) {
            cdb.extend_from_slice(extended);
        }
        let (write, edtl) = (bhs.flags() & 0x20 != 0, bhs.u32_at(20));
        let answer = |status, sense| Response { status, sense: Some(sense), data_in: None };
        // One logical unit: LUN 0. Another answers INQUIRY as "not connected" (SPC-5 peripheral
        // qualifier 3) and everything but REPORT LUNS with LOGICAL UNIT NOT SUPPORTED.
        if bhs.lun() != 0 && cdb[0] != 0xA0 {
            let response = if cdb[0] == 0x12 {
                let mut data = vec![0; 36];
                data[0] = 0x7F;
                data[4] = 31;
                Response { status: scsi::GOOD, sense: None, data_in: Some(IoBuf::copy_from(&data)) }
            } else {
                answer(scsi::CHECK_CONDITION, scsi::fixed_sense(0x05, 0x25, 0x00, None, None))
            };
            return self.answer_now(&bhs, edtl, None, response).await;
        }
        if u64::from(edtl) > TRANSFER_MAX_BYTES {
            // Refused before any of its data is held; its unsolicited data is dropped when
            // it comes (no task has its tag).
            let response = answer(scsi::CHECK_CONDITION, scsi::fixed_sense(0x05, 0x24, 0x00, None, None));
            return self.answer_now(&bhs, edtl, None, response).await;
        }
        let need = LogicalUnit::data_out_bytes(&cdb).unwrap_or(0);
        let sent = if write { u64::from(edtl) } else { 0 };
        // COMPARE AND WRITE and WRITE SAME cannot run on part of their data: a transfer of
        // another length is refused before any of it is held (its Data-Out is dropped). On a
        // write-protected unit the protection is what the initiator hears about (libiscsi's
        // ReadOnly suite sends WRITE SAME with UNMAP and no data).
        let read_only = self.session.is_some_and(|s| s.attachment.info().read_only);
        if matches!(cdb[0], 0x89 | 0x41 | 0x93) && need != sent && !read_only {
            let response = if cdb[0] == 0x89 {
                // The NUMBER OF LOGICAL BLOCKS disagrees with the data sent.
                answer(scsi::CHECK_CONDITION, scsi::fixed_sense(0x05, 0x24, 0x00, None, None))
            } else {
                Response::data_out_length_mismatch()
            };
            return self.answer_now(&bhs, edtl, Residual::of(sent, need), response).await;
        }
        let residual = if need > 0 || write { Residual::of(sent, need) } else { None };
        if need > sent {
            // The initiator sends less than the CDB asks for: a write writes only the whole
            // blocks it was given (libiscsi's residual tests; SAM-5 overflow).
            shrink_write(&mut cdb, sent / scsi::LOGICAL_BLOCK_BYTES);
        }
        let want = usize::try_from(need.min(sent)).unwrap_or(0);
        let c = Collect {
            immediate: bhs.immediate(),
            cdb,
            edtl,
            want,
            // Only the `filled` prefix is ever handed on (`start` splits off the rest), so the
            // buffer need not be zeroed first.
            buf: IoBuf::for_overwrite(want),
            filled: 0,
            received: 0,
            unsolicited: write && !bhs.final_bit(),
            r2t: None,
            r2ts: 0,
            data_sn: 0,
            residual,
            budget: 0,
            queued: false,
        };
        let mut c = Box::new(c);
        c.take(&pdu.data);
        self.tasks.insert(itt, Task::Collecting(c));
        // A read is admitted against the budget for the data it will return.
        let read_bytes = if write { 0 } else { u64::from(edtl) };
        self.advance(itt, read_bytes).await
    }

    fn release_window(&self, immediate: bool) {
        let mut w = self.window.lock();
        if immediate {
            w.immediate = w.immediate.saturating_sub(1);
        } else {
            w.in_progress = w.in_progress.saturating_sub(1);
        }
    }

    /// Answers a command at once (it never ran).
    async fn answer_now(
        &mut self,
        bhs: &Bhs,
        edtl: u32,
        residual: Option<Residual>,
        response: Response,
    ) -> Result<(), ConnError> {
        let answer = Answer {
            itt: bhs.itt(),
            immediate: bhs.immediate(),
            edtl,
            write_residual: residual,
            r2ts: 0,
            response,
            state: Arc::default(),
        };
        self.out
            .send(Out::Answer(answer))
            .await
            .map_err(|_| ConnError::Io(std::io::ErrorKind::BrokenPipe.into()))
    }

    /// Moves a collecting command on: runs it when its data is in, asks for more with an R2T
    /// when the unsolicited data is over, admitting it against the data budget first.
    /// `read_bytes` is what a read will return (its budget).
    async fn advance(&mut self, itt: u32, read_bytes: u64) -> Result<(), ConnError> {
        let (ready, waiting, budget, cost) = match self.tasks.get(&itt) {
            Some(Task::Collecting(c)) => {
                (c.filled >= c.want, c.unsolicited || c.r2t.is_some(), c.budget, (c.want - c.filled) as u64)
            }
            _ => return Ok(()),
        };
        if ready {
            if read_bytes > 0 && budget == 0 && !self.admit(itt, read_bytes) {
                return Ok(());
            }
            return self.start(itt);
        }
        if waiting || (budget == 0 && !self.admit(itt, cost)) {
            return Ok(());
        }
        let burst = usize::try_from(self.params.max_burst).unwrap_or(262_144);
        let ttt = self.new_ttt();
        let Some(Task::Collecting(c)) = self.tasks.get_mut(&itt) else { return Ok(()) };
        let len = burst.min(c.want - c.filled);
        c.r2t = Some((ttt, c.received + len));
        c.data_sn = 0;
        let mut r = Bhs::new(op::R2T);
        r.0[1] = 0x80;
        r.set_u32(16, itt).set_u32(20, ttt).set_u32(36, c.r2ts);
        r.set_u32(40, u32::try_from(c.received).unwrap_or(u32::MAX));
        r.set_u32(44, u32::try_from(len).unwrap_or(u32::MAX));
        c.r2ts += 1;
        self.send(r, Vec::new(), Stat::Peek).await
    }

    /// Reserves `cost` bytes of the data budget for `itt`, or queues it. A command alone may
    /// always run (the budget bounds what runs beside it).
    fn admit(&mut self, itt: u32, cost: u64) -> bool {
        let Some(Task::Collecting(c)) = self.tasks.get_mut(&itt) else { return false };
        if self.budget_used > 0 && self.budget_used + cost > DATA_BUDGET_BYTES {
            if !c.queued {
                c.queued = true;
                self.admission.push_back(itt);
            }
            return false;
        }
        c.budget = cost;
        c.queued = false;
        self.budget_used += cost;
        true
    }

    /// Runs a command whose data is in.
    fn start(&mut self, itt: u32) -> Result<(), ConnError> {
        let Some(session) = self.session else { return Ok(()) };
        let Some(Task::Collecting(c)) = self.tasks.remove(&itt) else { return Ok(()) };
        let state = Arc::new(AtomicU8::new(RUNNING));
        self.tasks.insert(itt, Task::Running { state: Arc::clone(&state) });
        let Collect { immediate, cdb, edtl, mut buf, filled, r2ts, residual, budget, .. } = *c;
        let _ = buf.split_off(filled);
        let data: IoBytes = buf.freeze();
        let (unit, attachment, nexus) =
            (Arc::clone(&session.unit), Arc::clone(&session.attachment), session.nexus.clone());
        let (out, done) = (self.out.clone(), self.done_tx.clone());
        tokio::spawn(async move {
            let response = unit.execute(&attachment, &nexus, &cdb, data).await;
            let answer = Answer { itt, immediate, edtl, write_residual: residual, r2ts, response, state };
            // A writer gone (connection broken) drops the answer; the command ran to its end.
            let _ = out.send(Out::Answer(answer)).await;
            let _ = done.send(Done { itt, budget });
        });
        Ok(())
    }

    async fn on_data_out(&mut self, pdu: Pdu) -> Result<(), ConnError> {
        let bhs = pdu.bhs;
        let itt = bhs.itt();
        let first_burst = usize::try_from(self.params.first_burst).unwrap_or(0);
        let Some(Task::Collecting(c)) = self.tasks.get_mut(&itt) else {
            // Data for a task that was answered already (refused at once, or aborted): dropped.
            return Ok(());
        };
        let (ttt, offset) = (bhs.u32_at(20), usize::try_from(bhs.u32_at(40)).unwrap_or(usize::MAX));
        let end = c.received.saturating_add(pdu.data.len());
        let edtl = usize::try_from(c.edtl).unwrap_or(usize::MAX);
        let data_sn = bhs.u32_at(36);
        if data_sn != c.data_sn {
            // A Data-Out lost or out of order: the task fails (its data is incomplete), the
            // session goes on. Data-Out still coming for it is dropped.
            tracing::info!(
                itt,
                data_sn,
                expected = c.data_sn,
                "iscsi: Data-Out out of sequence: task failed"
            );
            let (budget, immediate, edtl) = (c.budget, c.immediate, c.edtl);
            self.tasks.remove(&itt);
            self.budget_used -= budget.min(self.budget_used);
            self.reject(reject::PROTOCOL_ERROR, &bhs).await?;
            // ABORTED COMMAND, DATA PHASE ERROR.
            let response = Response {
                status: scsi::CHECK_CONDITION,
                sense: Some(scsi::fixed_sense(0x0B, 0x4B, 0x00, None, None)),
                data_in: None,
            };
            let answer = Answer {
                itt,
                immediate,
                edtl,
                write_residual: None,
                r2ts: 0,
                response,
                state: Arc::default(),
            };
            return self
                .out
                .send(Out::Answer(answer))
                .await
                .map_err(|_| ConnError::Io(std::io::ErrorKind::BrokenPipe.into()));
        }
        let fault = match c.r2t {
            _ if offset != c.received => {
                Some(format!("Data-Out at offset {offset}, expected {}", c.received))
            }
            Some((tag, burst_end)) if tag == ttt => {
                (end > burst_end).then(|| format!("Data-Out past its R2T ({end} > {burst_end})"))
            }
            _ if ttt == NO_TAG && c.unsolicited => {
                let limit = edtl.min(first_burst.max(c.received));
                (end > limit).then(|| format!("unsolicited Data-Out past the first burst ({end} > {limit})"))
            }
            _ => Some(format!("Data-Out with an unexpected tag {ttt:#x}")),
        };
        if let Some(why) = fault {
            return self.protocol_error(&bhs, why).await;
        }
        c.take(&pdu.data);
        c.data_sn = c.data_sn.wrapping_add(1);
        if bhs.final_bit() {
            if ttt == NO_TAG {
                c.unsolicited = false;
            } else {
                c.r2t = None;
            }
        }
        self.advance(itt, 0).await
    }

    async fn on_done(&mut self, done: Done) -> Result<(), ConnError> {
        self.tasks.remove(&done.itt);
        self.budget_used -= done.budget.min(self.budget_used);
        let mut answered = Vec::new();
        for (i, wait) in self.tmf.iter_mut().enumerate() {
            wait.tasks.remove(&done.itt);
            if wait.tasks.is_empty() {
                answered.push(i);
            }
        }
        for i in answered.into_iter().rev() {
            let wait = self.tmf.remove(i);
            self.tmf_done(wait).await?;
        }
        // Commands waiting for the budget, in order.
        while let Some(&itt) = self.admission.front() {
            let cost = match self.tasks.get(&itt) {
                Some(Task::Collecting(c)) if c.want > 0 => (c.want - c.filled) as u64,
                Some(Task::Collecting(c)) => u64::from(c.edtl),
                _ => {
                    self.admission.pop_front();
                    continue;
                }
            };
            if self.budget_used > 0 && self.budget_used + cost > DATA_BUDGET_BYTES {
                break;
            }
            self.admission.pop_front();
            if let Some(Task::Collecting(c)) = self.tasks.get_mut(&itt) {
                c.queued = false;
                c.budget = cost;
                self.budget_used += cost;
            }
            self.advance(itt, 0).await?;
        }
        self.maybe_logout().await
    }

    async fn on_tmf(&mut self, pdu: Pdu) -> Result<(), ConnError> {
        let bhs = pdu.bhs;
        if !self.take_cmd_sn(&bhs, false) {
            return Ok(());
        }
        let function = bhs.flags() & 0x7F;
        let referenced = bhs.u32_at(20);
        let mut wait = TmfWait { bhs, tasks: HashSet::new(), reset: false };
        match function {
            // ABORT TASK
            // ABORT TASK: a task that was answered already (or never came) does not exist,
            // as initiators expect (libiscsi's AbortTaskSimpleAsync, Linux's scsi error handling).
            1 => {
                if !self.abort(referenced, &mut wait) {
                    return self.tmf_response(&bhs, 1).await;
                }
            }
            // ABORT TASK SET, CLEAR TASK SET, LOGICAL UNIT RESET
            2 | 4 | 5 => {
                if bhs.lun() != 0 {
                    return self.tmf_response(&bhs, 2).await;
                }
                let all: Vec<u32> = self.tasks.keys().copied().collect();
                for itt in all {
                    self.abort(itt, &mut wait);
                }
                wait.reset = function == 5;
            }
            // CLEAR ACA, TARGET WARM/COLD RESET, TASK REASSIGN: not supported.
            3 | 6 | 7 | 8 => return self.tmf_response(&bhs, 5).await,
            _ => return self.tmf_response(&bhs, 255).await,
        }
        if wait.tasks.is_empty() {
            self.tmf_done(wait).await
        } else {
            self.tmf.push(wait);
            Ok(())
        }
    }

    /// Aborts a task: one collecting data is dropped at once, a running one is waited for
    /// (every volume call runs to its end) and its answer suppressed. False when there is no
    /// such task or its answer was sent already.
    fn abort(&mut self, itt: u32, wait: &mut TmfWait) -> bool {
        match self.tasks.get(&itt) {
            Some(Task::Collecting(c)) => {
                let (budget, immediate) = (c.budget, c.immediate);
                self.tasks.remove(&itt);
                self.budget_used -= budget.min(self.budget_used);
                self.release_window(immediate);
                true
            }
            Some(Task::Running { state }) => {
                let aborted =
                    state.compare_exchange(RUNNING, ABORTED, Ordering::AcqRel, Ordering::Acquire).is_ok();
                if aborted {
                    wait.tasks.insert(itt);
                }
                aborted
            }
            None => false,
        }
    }

    async fn tmf_done(&mut self, wait: TmfWait) -> Result<(), ConnError> {
        if wait.reset
            && let Some(s) = self.session
        {
            s.unit.reset(&s.nexus);
        }
        self.tmf_response(&wait.bhs, 0).await
    }

    async fn tmf_response(&self, req: &Bhs, response: u8) -> Result<(), ConnError> {
        let mut r = Bhs::new(op::TASK_MGMT_RESPONSE);
        r.0[1] = 0x80;
        r.0[2] = response;
        r.set_u32(16, req.itt());
        self.send(r, Vec::new(), Stat::Advance).await
    }

    async fn on_text(&mut self, pdu: Pdu) -> Result<(), ConnError> {
        let bhs = pdu.bhs;
        if !self.take_cmd_sn(&bhs, false) {
            return Ok(());
        }
        let ttt = bhs.u32_at(20);
        // The next part of a long answer.
        if ttt != NO_TAG {
            return match self.text_out.take() {
                Some((tag, rest)) if tag == ttt => self.text_answer(&bhs, rest).await,
                _ => self.protocol_error(&bhs, format!("Text Request with an unknown tag {ttt:#x}")).await,
            };
        }
        self.text_out = None;
        self.text_in.extend_from_slice(&pdu.data);
        if self.text_in.len() > text::TEXT_MAX_BYTES {
            self.text_in.clear();
            return self.reject(reject::OUT_OF_RESOURCES, &bhs).await;
        }
        if bhs.flags() & 0x40 != 0 {
            // More of the request follows: an empty answer with a tag asks for it.
            let mut r = Bhs::new(op::TEXT_RESPONSE);
            r.set_u32(16, bhs.itt()).set_u32(20, self.new_ttt());
            return self.send(r, Vec::new(), Stat::Advance).await;
        }
        let keys = match text::parse(&std::mem::take(&mut self.text_in)) {
            Ok(keys) => keys,
            Err(e) => return self.protocol_error(&bhs, e.to_string()).await,
        };
        let mut answer: Vec<(String, String)> = Vec::new();
        for (key, value) in keys {
            if key != "SendTargets" {
                answer.push((key, "NotUnderstood".into()));
                continue;
            }
            let names = match value.as_str() {
                "All" if self.session.is_none() => self.target.names(),
                // A normal session may ask about its own target only.
                "" | "All" => vec![self.params.target_name.clone()],
                name => self.target.names().into_iter().filter(|n| n == name).collect(),
            };
            for name in names {
                answer.push(("TargetName".into(), name));
                answer.push(("TargetAddress".into(), format!("{},1", self.portal)));
            }
        }
        self.text_answer(&bhs, text::encode(&answer)).await
    }

    /// Sends `data` as a Text Response, continued (C bit and a tag) when it is longer than
    /// the initiator takes in one PDU.
    async fn text_answer(&mut self, req: &Bhs, mut data: Vec<u8>) -> Result<(), ConnError> {
        let max = usize::try_from(self.params.send_data_segment).unwrap_or(8192);
        let mut r = Bhs::new(op::TEXT_RESPONSE);
        r.set_u32(16, req.itt());
        if data.len() > max {
            let rest = data.split_off(max);
            let tag = self.new_ttt();
            self.text_out = Some((tag, rest));
            r.0[1] = 0x40;
            r.set_u32(20, tag);
        } else {
            r.0[1] = 0x80;
            r.set_u32(20, NO_TAG);
        }
        self.send(r, data, Stat::Advance).await
    }

    fn new_ttt(&mut self) -> u32 {
        let t = self.next_ttt;
        self.next_ttt = self.next_ttt.wrapping_add(1).max(1);
        if self.next_ttt == NO_TAG {
            self.next_ttt = 1;
        }
        t
    }

    async fn on_logout(&mut self, pdu: Pdu) -> Result<(), ConnError> {
        let bhs = pdu.bhs;
        if !self.take_cmd_sn(&bhs, false) {
            return Ok(());
        }
        // Tasks still collecting data will get none: dropped. Running ones finish first.
        let collecting: Vec<u32> = self
            .tasks
            .iter()
            .filter(|(_, t)| matches!(t, Task::Collecting(_)))
            .map(|(&itt, _)| itt)
            .collect();
        let mut ignored = TmfWait { bhs, tasks: HashSet::new(), reset: false };
        for itt in collecting {
            self.abort(itt, &mut ignored);
        }
        self.logout = Some(bhs);
        self.maybe_logout().await
    }

    async fn maybe_logout(&mut self) -> Result<(), ConnError> {
        let Some(req) = self.logout else { return Ok(()) };
        if !self.tasks.is_empty() {
            return Ok(());
        }
        // The nexus ends before the response: an initiator that logs out and then, from
        // another session, takes the reservation this one held must find it released (libiscsi's
        // Reserve6.Logout; once failed under load when the release waited for the teardown).
        if let Some(s) = self.session {
            s.end_nexus();
        }
        let mut r = Bhs::new(op::LOGOUT_RESPONSE);
        r.0[1] = 0x80;
        // Reason 2 (remove the connection for recovery) needs error recovery level 2.
        r.0[2] = if req.flags() & 0x7F == 2 { 2 } else { 0 };
        r.set_u32(16, req.itt()).set_u16(40, 2).set_u16(42, 0);
        self.send(r, Vec::new(), Stat::Advance).await?;
        self.closed = true;
        Ok(())
    }
}

impl Collect {
    /// Takes data that arrived at `received` (what passes `want` is dropped).
    fn take(&mut self, data: &[u8]) {
        let room = self.want.saturating_sub(self.filled);
        let n = room.min(data.len());
        self.buf[self.filled..self.filled + n].copy_from_slice(&data[..n]);
        self.filled += n;
        self.received += data.len();
    }
}

/// The bytes of an Extended CDB AHS (type 1) beyond the first 16, if there is one.
fn extended_cdb(ahs: &[u8]) -> Option<&[u8]> {
    let mut at = 0;
    while at + 4 <= ahs.len() {
        let len = usize::from(u16::from_be_bytes([ahs[at], ahs[at + 1]]));
        let kind = ahs[at + 2];
        // AHSLength counts the reserved byte after the type.
        let body = ahs.get(at + 3..at + 3 + len)?;
        if kind == 1 {
            return body.get(1..);
        }
        at += 3 + len + pdu::pad(3 + len);
    }
    None
}

/// Lowers the TRANSFER LENGTH of a WRITE or WRITE AND VERIFY (10/12/16) to `blocks`.
fn shrink_write(cdb: &mut [u8], blocks: u64) {
    match cdb[0] {
        0x2A | 0x2E => {
            let b = u16::try_from(blocks).unwrap_or(u16::MAX).to_be_bytes();
            cdb[7..9].copy_from_slice(&b);
        }
        0xAA | 0xAE => {
            let b = u32::try_from(blocks).unwrap_or(u32::MAX).to_be_bytes();
            cdb[6..10].copy_from_slice(&b);
        }
        0x8A | 0x8E => {
            let b = u32::try_from(blocks).unwrap_or(u32::MAX).to_be_bytes();
            cdb[10..14].copy_from_slice(&b);
        }
        _ => {}
    }
}
