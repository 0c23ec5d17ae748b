//! The SCSI command layer of the target: SBC-4 (block commands) and SPC-5 (primary commands)
//! over a volume reached through a `stria_front::Attachment`. The transport hands it one CDB
//! at a time with the Data-Out it collected ([`LogicalUnit::execute`]) and sends back the
//! status, sense data and Data-In of the [`Response`].
//!
//! A [`LogicalUnit`] is one served volume as SCSI sees it: 512-byte logical blocks, 4 KiB
//! physical blocks, thin provisioned (unmapped blocks read as zeros), with the state SPC keeps
//! across every session that addresses it: unit attentions per I_T nexus, SPC-2 and persistent
//! reservations, and the changeable mode parameters.
//!
//! What it supports, by module:
//!
//! * [`inquiry`]: INQUIRY (standard data and the VPD pages 00h, 80h, 83h, B0h, B1h, B2h),
//!   REPORT LUNS, REQUEST SENSE.
//! * [`block`]: READ/WRITE (6, 10, 12, 16), WRITE AND VERIFY, VERIFY, READ CAPACITY (10, 16),
//!   SYNCHRONIZE CACHE, WRITE SAME (10, 16), UNMAP, COMPARE AND WRITE, GET LBA STATUS.
//! * [`mode`]: MODE SENSE and MODE SELECT (6, 10) with the caching, control and informational
//!   exceptions pages.
//! * [`pr`]: PERSISTENT RESERVE IN/OUT and RESERVE/RELEASE (6, 10), and which commands a
//!   reservation lets through.
//!
//! Every field read from a CDB or a parameter list is bounds-checked ([`cdb::Cdb`]) and every
//! size is bounded by a named limit, so no input makes the layer panic or allocate without
//! bound; a malformed command ends in CHECK CONDITION with the sense SPC prescribes.
//!
//! Persistent reservations live in memory only: they survive logouts and lost connections (as
//! SPC requires) but not a restart of the daemon, since they are not yet stored with the
//! pool's metadata; REPORT CAPABILITIES says so (PTPL_C = 0), and APTPL is refused.

mod block;
mod cdb;
mod inquiry;
mod mode;
mod opcodes;
mod pr;
mod sense;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, VecDeque};

use parking_lot::Mutex;
use stria_dev::{IoBuf, IoBytes};
use stria_front::Attachment;

use cdb::Cdb;
pub use pr::MAX_REGISTRATIONS;
use sense::{Check, KEY_NO_SENSE};
pub use sense::{FIXED_SENSE_BYTES, fixed_sense};

/// SCSI status GOOD.
pub const GOOD: u8 = 0x00;
/// SCSI status CHECK CONDITION: the response carries sense data.
pub const CHECK_CONDITION: u8 = 0x02;
/// SCSI status RESERVATION CONFLICT: a reservation held through another I_T nexus blocks it.
pub const RESERVATION_CONFLICT: u8 = 0x18;

/// The logical block size exported: 512 bytes, what every initiator handles (VMware's ATS
/// compares one such block); volumes store 4 KiB blocks, reported as the physical block.
pub const LOGICAL_BLOCK_BYTES: u64 = 512;
/// Logical blocks per physical block, as the exponent READ CAPACITY(16) reports: 2^3 = 8, a
/// 4 KiB physical block (stria's block).
pub const LOGICAL_PER_PHYSICAL_EXPONENT: u8 = 3;
/// The most bytes one READ, WRITE or VERIFY transfers (Block Limits VPD MAXIMUM TRANSFER
/// LENGTH): 32 MiB (libiscsi's WRITE SAME tests write 65536 blocks in one WRITE16). The
/// transport holds at most one such command's data beside others (its data budget).
pub const MAX_TRANSFER_BYTES: u64 = 32 << 20;
/// [`MAX_TRANSFER_BYTES`] in logical blocks.
pub const MAX_TRANSFER_BLOCKS: u32 = 65536;
/// The most logical blocks one WRITE SAME covers (MAXIMUM WRITE SAME LENGTH): 1 GiB. Without
/// UNMAP it is written in chunks of [`WRITE_SAME_CHUNK_BYTES`].
pub const MAX_WRITE_SAME_BLOCKS: u64 = 1 << 21;
/// The largest write one WRITE SAME sends to the volume at a time.
pub const WRITE_SAME_CHUNK_BYTES: usize = 1 << 20;
/// The most logical blocks one UNMAP command covers (MAXIMUM UNMAP LBA COUNT): 512 MiB.
pub const MAX_UNMAP_BLOCKS: u32 = 1 << 20;
/// The most block descriptors one UNMAP carries (MAXIMUM UNMAP BLOCK DESCRIPTOR COUNT).
pub const MAX_UNMAP_DESCRIPTORS: u32 = 256;
/// Unit attentions kept per I_T nexus; further ones are dropped (the oldest are the ones an
/// initiator must see first).
const UA_QUEUE_MAX: usize = 8;

/// One I_T nexus as the logical unit sees it: which initiator port sends a command.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Nexus {
    /// The initiator port's name: the iSCSI initiator name, ",i,0x", and the session's ISID in 12 hex digits.
    pub initiator_port: String,
    /// The target port's relative identifier (1 for now).
    pub relative_target_port: u16,
}

/// What one command answers.
#[derive(Debug)]
pub struct Response {
    /// SCSI status: [`GOOD`], [`CHECK_CONDITION`] or [`RESERVATION_CONFLICT`].
    pub status: u8,
    /// Fixed-format sense data (SPC-5 4.4.3, response code 0x70, 18 bytes) when status is
    /// CHECK CONDITION.
    pub sense: Option<Vec<u8>>,
    /// Data for the initiator (Data-In), already cut to the CDB's ALLOCATION LENGTH: the
    /// transport cuts it further to the Expected Data Transfer Length and reports the residual
    /// against that.
    pub data_in: Option<IoBuf>,
}

impl Response {
    fn good(data_in: Option<IoBuf>) -> Response {
        Response { status: GOOD, sense: None, data_in }
    }

    fn check(check: &Check) -> Response {
        Response { status: CHECK_CONDITION, sense: Some(check.encode()), data_in: None }
    }

    /// CHECK CONDITION, ILLEGAL REQUEST, INVALID FIELD IN COMMAND INFORMATION UNIT (0Eh/03h):
    /// what the transport answers, without running the command, when the initiator's Expected
    /// Data Transfer Length differs from what a Data-Out command's CDB transfers
    /// ([`LogicalUnit::data_out_bytes`]). FCP-4 and libiscsi's residual tests accept this (with
    /// the residual reported as usual) in place of writing part of the data.
    pub fn data_out_length_mismatch() -> Response {
        Response::check(&Check::data_out_mismatch())
    }
}

/// Why a command did not end GOOD.
#[derive(Debug)]
enum Failure {
    Check(Check),
    Conflict,
}

impl From<Check> for Failure {
    fn from(c: Check) -> Failure {
        Failure::Check(c)
    }
}

type Outcome = Result<Option<IoBuf>, Failure>;

/// The operation codes this layer knows.
pub(crate) mod op {
    pub(crate) const TEST_UNIT_READY: u8 = 0x00;
    pub(crate) const REQUEST_SENSE: u8 = 0x03;
    pub(crate) const READ_6: u8 = 0x08;
    pub(crate) const WRITE_6: u8 = 0x0A;
    pub(crate) const INQUIRY: u8 = 0x12;
    pub(crate) const MODE_SELECT_6: u8 = 0x15;
    pub(crate) const RESERVE_6: u8 = 0x16;
    pub(crate) const RELEASE_6: u8 = 0x17;
    pub(crate) const MODE_SENSE_6: u8 = 0x1A;
    pub(crate) const START_STOP_UNIT: u8 = 0x1B;
    pub(crate) const PREVENT_ALLOW_MEDIUM_REMOVAL: u8 = 0x1E;
    pub(crate) const READ_CAPACITY_10: u8 = 0x25;
    pub(crate) const READ_10: u8 = 0x28;
    pub(crate) const WRITE_10: u8 = 0x2A;
    pub(crate) const WRITE_AND_VERIFY_10: u8 = 0x2E;
    pub(crate) const VERIFY_10: u8 = 0x2F;
    pub(crate) const SYNCHRONIZE_CACHE_10: u8 = 0x35;
    pub(crate) const WRITE_SAME_10: u8 = 0x41;
    pub(crate) const UNMAP: u8 = 0x42;
    pub(crate) const MODE_SELECT_10: u8 = 0x55;
    pub(crate) const RESERVE_10: u8 = 0x56;
    pub(crate) const RELEASE_10: u8 = 0x57;
    pub(crate) const MODE_SENSE_10: u8 = 0x5A;
    pub(crate) const PERSISTENT_RESERVE_IN: u8 = 0x5E;
    pub(crate) const PERSISTENT_RESERVE_OUT: u8 = 0x5F;
    pub(crate) const READ_16: u8 = 0x88;
    pub(crate) const COMPARE_AND_WRITE: u8 = 0x89;
    pub(crate) const WRITE_16: u8 = 0x8A;
    pub(crate) const WRITE_AND_VERIFY_16: u8 = 0x8E;
    pub(crate) const VERIFY_16: u8 = 0x8F;
    pub(crate) const SYNCHRONIZE_CACHE_16: u8 = 0x91;
    pub(crate) const WRITE_SAME_16: u8 = 0x93;
    pub(crate) const SERVICE_ACTION_IN_16: u8 = 0x9E;
    pub(crate) const REPORT_LUNS: u8 = 0xA0;
    pub(crate) const MAINTENANCE_IN: u8 = 0xA3;
    pub(crate) const READ_12: u8 = 0xA8;
    pub(crate) const WRITE_12: u8 = 0xAA;
    pub(crate) const WRITE_AND_VERIFY_12: u8 = 0xAE;
    pub(crate) const VERIFY_12: u8 = 0xAF;

    /// Service actions of SERVICE ACTION IN(16).
    pub(crate) const SA_READ_CAPACITY_16: u8 = 0x10;
    pub(crate) const SA_GET_LBA_STATUS: u8 = 0x12;

    /// Every operation code above.
    pub(crate) const KNOWN: [u8; 39] = [
        TEST_UNIT_READY,
        REQUEST_SENSE,
        READ_6,
        WRITE_6,
        INQUIRY,
        MODE_SELECT_6,
        RESERVE_6,
        RELEASE_6,
        MODE_SENSE_6,
        START_STOP_UNIT,
        PREVENT_ALLOW_MEDIUM_REMOVAL,
        READ_CAPACITY_10,
        READ_10,
        WRITE_10,
        WRITE_AND_VERIFY_10,
        VERIFY_10,
        SYNCHRONIZE_CACHE_10,
        WRITE_SAME_10,
        UNMAP,
        MODE_SELECT_10,
        RESERVE_10,
        RELEASE_10,
        MODE_SENSE_10,
        PERSISTENT_RESERVE_IN,
        PERSISTENT_RESERVE_OUT,
        READ_16,
        COMPARE_AND_WRITE,
        WRITE_16,
        WRITE_AND_VERIFY_16,
        VERIFY_16,
        SYNCHRONIZE_CACHE_16,
        WRITE_SAME_16,
        SERVICE_ACTION_IN_16,
        REPORT_LUNS,
        MAINTENANCE_IN,
        READ_12,
        WRITE_12,
        WRITE_AND_VERIFY_12,
        VERIFY_12,
    ];
}

/// A unit attention condition: its ASC and ASCQ (the sense key is UNIT ATTENTION).
type UnitAttention = (u8, u8);

/// POWER ON, RESET, OR BUS DEVICE RESET OCCURRED (29h/00h): a new I_T nexus.
const UA_POWER_ON: UnitAttention = (0x29, 0x00);
/// BUS DEVICE RESET FUNCTION OCCURRED (29h/03h): a LOGICAL UNIT RESET from another nexus.
const UA_LU_RESET: UnitAttention = (0x29, 0x03);
/// MODE PARAMETERS CHANGED (2Ah/01h).
const UA_MODE_CHANGED: UnitAttention = (0x2A, 0x01);
/// RESERVATIONS PREEMPTED (2Ah/03h).
const UA_RESERVATIONS_PREEMPTED: UnitAttention = (0x2A, 0x03);
/// RESERVATIONS RELEASED (2Ah/04h).
const UA_RESERVATIONS_RELEASED: UnitAttention = (0x2A, 0x04);
/// REGISTRATIONS PREEMPTED (2Ah/05h).
const UA_REGISTRATIONS_PREEMPTED: UnitAttention = (0x2A, 0x05);

/// What a logical unit keeps across commands, under one lock that is never held across an
/// await.
#[derive(Debug, Default)]
struct State {
    /// The I_T nexuses logged in, each with its pending unit attentions, oldest first.
    nexuses: HashMap<Nexus, VecDeque<UnitAttention>>,
    /// Persistent reservations and registrations.
    pr: pr::Persistent,
    /// The holder of an SPC-2 reservation (RESERVE(6)/(10)), if any.
    reserved_by: Option<Nexus>,
    /// The mode parameters that MODE SELECT can change.
    mode: mode::ModeState,
}

impl State {
    /// Queues a unit attention for `nexus` if it is logged in. A reset-class one (29h) takes
    /// the place of everything queued, which it supersedes (SAM-5 precedence).
    fn add_ua(&mut self, nexus: &Nexus, ua: UnitAttention) {
        let Some(queue) = self.nexuses.get_mut(nexus) else { return };
        if ua.0 == 0x29 {
            queue.clear();
        }
        if !queue.contains(&ua) && queue.len() < UA_QUEUE_MAX {
            queue.push_back(ua);
        }
    }

    /// Queues a unit attention for every logged-in nexus but `except`.
    fn add_ua_to_others(&mut self, except: &Nexus, ua: UnitAttention) {
        let others: Vec<Nexus> = self.nexuses.keys().filter(|n| *n != except).cloned().collect();
        for n in others {
            self.add_ua(&n, ua);
        }
    }
}

/// A logical unit: one served volume, and the state kept across every session and connection
/// that addresses it (persistent reservations, unit attentions, mode page changeable state).
/// Cheap to share: the transport keeps one `Arc<LogicalUnit>` per volume name for as long as
/// the target serves it.
pub struct LogicalUnit {
    /// The target's IQN, for VPD page 83h.
    target_name: String,
    /// The unit serial number (VPD page 80h), printable ASCII.
    serial: String,
    /// The NAA locally assigned identifier (VPD page 83h).
    naa: [u8; 8],
    state: Mutex<State>,
    /// Where persistent reservations with APTPL are kept, if anywhere.
    store: Option<Box<dyn ReservationStore>>,
}

/// Where a logical unit keeps its persistent reservations while APTPL is on, so that they
/// survive a restart of the daemon (SPC-5 "persist through power loss").
pub trait ReservationStore: Send + Sync + 'static {
    /// The state saved last, if any.
    fn load(&self) -> std::io::Result<Option<Vec<u8>>>;
    /// Saves `state` durably before returning (None: removes what was saved).
    fn save(&self, state: Option<&[u8]>) -> std::io::Result<()>;
}

/// A [`ReservationStore`] in one file: written to a temporary file, synced, renamed over the
/// old one and the directory synced, so a crash leaves the old state or the new one.
#[derive(Debug)]
pub struct FileReservationStore {
    path: std::path::PathBuf,
}

impl FileReservationStore {
    /// Keeps the state in `path` (its directory must exist).
    pub fn new(path: std::path::PathBuf) -> FileReservationStore {
        FileReservationStore { path }
    }

    fn sync_dir(&self) -> std::io::Result<()> {
        match self.path.parent() {
            Some(dir) => std::fs::File::open(dir)?.sync_all(),
            None => Ok(()),
        }
    }
}

impl ReservationStore for FileReservationStore {
    fn load(&self) -> std::io::Result<Option<Vec<u8>>> {
        match std::fs::read(&self.path) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn save(&self, state: Option<&[u8]>) -> std::io::Result<()> {
        use std::io::Write;
        match state {
            Some(bytes) => {
                let tmp = self.path.with_extension("tmp");
                let mut f = std::fs::File::create(&tmp)?;
                f.write_all(bytes)?;
                f.sync_all()?;
                std::fs::rename(&tmp, &self.path)?;
            }
            None => match std::fs::remove_file(&self.path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                _ => {}
            },
        }
        self.sync_dir()
    }
}

impl std::fmt::Debug for LogicalUnit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogicalUnit")
            .field("target_name", &self.target_name)
            .field("serial", &self.serial)
            .finish()
    }
}

impl LogicalUnit {
    /// `target_name` is the target's IQN (for VPD page 0x83's SCSI name string designator);
    /// `serial` a unique serial for VPD 0x80. The NAA designator is derived from both by a
    /// fixed hash (FNV-1a), so it stays the same across restarts, which multipath and VMware
    /// rely on to recognise the device.
    pub fn new(target_name: &str, serial: &str) -> LogicalUnit {
        LogicalUnit {
            target_name: target_name.to_string(),
            serial: inquiry::printable(serial),
            naa: inquiry::naa_locally_assigned(target_name, serial),
            state: Mutex::new(State::default()),
            store: None,
        }
    }

    /// Keeps persistent reservations made with APTPL in `store`, and takes back what it holds
    /// (registrations and the reservation made before a restart). A store that cannot be read,
    /// or holds what this version did not write, is logged and the unit starts with none.
    pub fn with_store(mut self, store: Box<dyn ReservationStore>) -> LogicalUnit {
        match store.load() {
            Ok(Some(bytes)) => match pr::Persistent::decode(&bytes) {
                Some(pr) => self.state.get_mut().pr = pr,
                None => {
                    tracing::error!(unit = %self.target_name, "iscsi: saved reservations unreadable: ignored")
                }
            },
            Ok(None) => {}
            Err(e) => {
                tracing::error!(unit = %self.target_name, error = %e, "iscsi: saved reservations: cannot read")
            }
        }
        self.store = Some(store);
        self
    }

    /// A new I_T nexus logged in: a unit attention POWER ON, RESET, OR BUS DEVICE RESET
    /// OCCURRED (29h/00h) is established for it, reported by its first command other than
    /// INQUIRY, REPORT LUNS and REQUEST SENSE (libiscsi, like Linux, clears it with TEST UNIT
    /// READY right after login).
    pub fn nexus_added(&self, nexus: &Nexus) {
        let mut state = self.state.lock();
        state.nexuses.insert(nexus.clone(), VecDeque::new());
        state.add_ua(nexus, UA_POWER_ON);
    }

    /// An I_T nexus ended (logout or connection lost): its unit attentions and any SPC-2
    /// reservation it held go; its persistent registrations survive (SPC-5).
    pub fn nexus_removed(&self, nexus: &Nexus) {
        let mut state = self.state.lock();
        state.nexuses.remove(nexus);
        if state.reserved_by.as_ref() == Some(nexus) {
            state.reserved_by = None;
        }
    }

    /// LOGICAL UNIT RESET task management function: releases an SPC-2 reservation (persistent
    /// reservations are unaffected, SPC-5 5.14) and sets unit attention 29h/03h for every other
    /// nexus.
    pub fn reset(&self, from: &Nexus) {
        let mut state = self.state.lock();
        state.reserved_by = None;
        state.add_ua_to_others(from, UA_LU_RESET);
    }

    /// How many bytes of Data-Out the CDB transfers (from its TRANSFER LENGTH / PARAMETER LIST
    /// LENGTH), or None for a CDB the layer does not know or that is too short for its
    /// operation code (execute answers those with CHECK CONDITION). The transport compares it
    /// with the initiator's Expected Data Transfer Length.
    pub fn data_out_bytes(cdb: &[u8]) -> Option<u64> {
        cdb::data_out_bytes(cdb)
    }

    /// Runs one command. `data_out` holds the Data-Out the initiator sent (already collected
    /// by the transport; its length is min(expected transfer length, what the CDB asks)); a
    /// command given less than its CDB transfers ends in INVALID FIELD IN COMMAND INFORMATION
    /// UNIT without touching the volume. Never panics on any input.
    pub async fn execute(
        &self,
        volume: &Attachment,
        nexus: &Nexus,
        cdb: &[u8],
        data_out: IoBytes,
    ) -> Response {
        match self.run(volume, nexus, cdb, data_out).await {
            Ok(data_in) => Response::good(data_in),
            Err(Failure::Check(check)) => Response::check(&check),
            Err(Failure::Conflict) => Response { status: RESERVATION_CONFLICT, sense: None, data_in: None },
        }
    }

    async fn run(&self, volume: &Attachment, nexus: &Nexus, raw: &[u8], data_out: IoBytes) -> Outcome {
        let Some(&opcode) = raw.first() else { return Err(Check::invalid_opcode().into()) };
        // SPC-5 5.14: every command but these three reports a pending unit attention instead
        // of running; REQUEST SENSE returns it as its data.
        if !matches!(opcode, op::INQUIRY | op::REPORT_LUNS | op::REQUEST_SENSE)
            && let Some((asc, ascq)) = self.take_ua(nexus)
        {
            return Err(Check::unit_attention(asc, ascq).into());
        }
        if !op::KNOWN.contains(&opcode) {
            return Err(Check::invalid_opcode().into());
        }
        let cdb = Cdb::new(raw)?;
        cdb.check_control()?;
        // A command that would write a write-protected unit hears about the protection, whatever
        // data came with it (libiscsi's ReadOnly suite sends WRITE SAME with UNMAP and no data).
        let protected_write = volume.info().read_only
            && matches!(opcode, 0x0A | 0x2A | 0xAA | 0x8A | 0x2E | 0xAE | 0x8E | 0x41 | 0x93 | 0x89 | 0x42);
        if let Some(needed) = cdb::data_out_bytes(raw)
            && !protected_write
            && u64::try_from(data_out.len()).is_ok_and(|have| have < needed)
        {
            return Err(Check::data_out_mismatch().into());
        }
        self.check_reservations(nexus, &cdb)?;
        self.dispatch(volume, nexus, &cdb, data_out).await
    }

    async fn dispatch(
        &self,
        volume: &Attachment,
        nexus: &Nexus,
        cdb: &Cdb<'_>,
        data_out: IoBytes,
    ) -> Outcome {
        match cdb.opcode() {
            op::TEST_UNIT_READY => Ok(None),
            op::REQUEST_SENSE => self.request_sense(nexus, cdb),
            op::INQUIRY => self.inquiry(volume, nexus, cdb),
            op::REPORT_LUNS => inquiry::report_luns(cdb),
            op::MODE_SENSE_6 | op::MODE_SENSE_10 => self.mode_sense(volume, cdb),
            op::MODE_SELECT_6 | op::MODE_SELECT_10 => self.mode_select(nexus, cdb, &data_out),
            op::START_STOP_UNIT => Ok(None),
            op::PREVENT_ALLOW_MEDIUM_REMOVAL => prevent_allow(cdb),
            op::RESERVE_6 | op::RESERVE_10 | op::RELEASE_6 | op::RELEASE_10 => {
                self.reserve_release(nexus, cdb)
            }
            op::PERSISTENT_RESERVE_IN => self.persistent_reserve_in(cdb),
            op::PERSISTENT_RESERVE_OUT => self.persistent_reserve_out(nexus, cdb, &data_out),
            op::MAINTENANCE_IN => opcodes::maintenance_in(cdb),
            _ => self.block_command(volume, cdb, data_out).await,
        }
    }

    /// The oldest unit attention pending for `nexus`, removed: it counts as reported.
    fn take_ua(&self, nexus: &Nexus) -> Option<UnitAttention> {
        self.state.lock().nexuses.get_mut(nexus).and_then(VecDeque::pop_front)
    }

    /// REQUEST SENSE: the pending unit attention (which it clears) or NO SENSE, as fixed-format
    /// sense data. DESC (descriptor format) is refused: this target sends fixed format only.
    fn request_sense(&self, nexus: &Nexus, cdb: &Cdb<'_>) -> Outcome {
        if cdb.bit(1, 0)? {
            return Err(Check::invalid_cdb(1, Some(0)).into());
        }
        let alloc = usize::from(cdb.u8(4)?);
        let sense = match self.take_ua(nexus) {
            Some((asc, ascq)) => Check::unit_attention(asc, ascq).encode(),
            None => fixed_sense(KEY_NO_SENSE, 0, 0, None, None),
        };
        Ok(data_in(sense, alloc))
    }

    /// Whether a reservation held through another nexus blocks this command.
    fn check_reservations(&self, nexus: &Nexus, cdb: &Cdb<'_>) -> Result<(), Failure> {
        let state = self.state.lock();
        let access = pr::access(cdb);
        if let Some(holder) = &state.reserved_by
            && holder != nexus
            && !pr::allowed_under_spc2_reservation(cdb.opcode())
        {
            return Err(Failure::Conflict);
        }
        if state.pr.blocks(nexus, access) {
            return Err(Failure::Conflict);
        }
        Ok(())
    }
}

/// PREVENT ALLOW MEDIUM REMOVAL: the medium is not removable, so preventing its removal is a
/// no-op that succeeds (as on most disks); the obsolete persistent prevent values (2, 3) are
/// refused.
fn prevent_allow(cdb: &Cdb<'_>) -> Outcome {
    if cdb.u8(4)? & 0x03 > 1 {
        return Err(Check::invalid_cdb(4, Some(1)).into());
    }
    Ok(None)
}

/// Data-In of `data` cut to the CDB's ALLOCATION LENGTH (SPC-5 4.2.5.6): never more than the
/// initiator allowed, so that the transport's residual is counted against what it expects.
fn data_in(mut data: Vec<u8>, alloc_len: usize) -> Option<IoBuf> {
    data.truncate(alloc_len);
    Some(IoBuf::copy_from(&data))
}
