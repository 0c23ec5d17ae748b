//! Reservations: persistent reservations (PERSISTENT RESERVE IN/OUT, SPC-5 5.13, 6.16, 6.17)
//! and SPC-2 reservations (RESERVE/RELEASE(6) and (10)), and which commands a reservation held
//! through another I_T nexus lets through (SPC-5 table 66, SBC-4 table 13).
//!
//! Registrations and the reservation are kept in memory (see the module above): they survive a
//! nexus' logout but not a restart, so REPORT CAPABILITIES clears PTPL_C and a REGISTER with
//! APTPL set is refused. SPEC_I_P, ALL_TG_PT and REGISTER AND MOVE are not supported either.

use super::cdb::{Cdb, param_be};
use super::sense::Check;
use super::{
    Failure, LogicalUnit, Nexus, Outcome, State, UA_REGISTRATIONS_PREEMPTED, UA_RESERVATIONS_PREEMPTED,
    UA_RESERVATIONS_RELEASED, data_in, op,
};

/// The most registrations a logical unit keeps; one more is INSUFFICIENT REGISTRATION
/// RESOURCES. Clusters register one key per host path: 64 paths is plenty.
pub const MAX_REGISTRATIONS: usize = 64;

/// The parameter list of every PERSISTENT RESERVE OUT this target supports: 24 bytes.
const PROUT_PARAMETER_BYTES: u64 = 24;

/// A persistent reservation type (SPC-5 table 176).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PrType {
    WriteExclusive = 1,
    ExclusiveAccess = 3,
    WriteExclusiveRegistrantsOnly = 5,
    ExclusiveAccessRegistrantsOnly = 6,
    WriteExclusiveAllRegistrants = 7,
    ExclusiveAccessAllRegistrants = 8,
}

impl PrType {
    fn from_code(code: u8) -> Option<PrType> {
        Some(match code {
            1 => PrType::WriteExclusive,
            3 => PrType::ExclusiveAccess,
            5 => PrType::WriteExclusiveRegistrantsOnly,
            6 => PrType::ExclusiveAccessRegistrantsOnly,
            7 => PrType::WriteExclusiveAllRegistrants,
            8 => PrType::ExclusiveAccessAllRegistrants,
            _ => return None,
        })
    }

    /// Every registrant holds an all-registrants reservation.
    fn all_registrants(self) -> bool {
        matches!(self, PrType::WriteExclusiveAllRegistrants | PrType::ExclusiveAccessAllRegistrants)
    }

    /// Registrants (holders or not) get access under a registrants-only or all-registrants
    /// reservation.
    fn registrants_have_access(self) -> bool {
        !matches!(self, PrType::WriteExclusive | PrType::ExclusiveAccess)
    }

    /// Reads are blocked for those without access (the exclusive access types).
    fn blocks_reads(self) -> bool {
        matches!(
            self,
            PrType::ExclusiveAccess
                | PrType::ExclusiveAccessRegistrantsOnly
                | PrType::ExclusiveAccessAllRegistrants
        )
    }
}

/// What a command does to the medium, for the reservation rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Access {
    /// Allowed whatever the reservation (INQUIRY, REPORT LUNS, PR IN/OUT, READ CAPACITY...).
    Any,
    /// Reads the medium or its state: blocked by the exclusive access types.
    Read,
    /// Changes the medium or the logical unit: blocked by every type.
    Write,
}

/// The class of a command (SPC-5 table 66 and SBC-4 table 13, for the commands known here).
pub(super) fn access(cdb: &Cdb<'_>) -> Access {
    match cdb.opcode() {
        op::INQUIRY
        | op::REPORT_LUNS
        | op::REQUEST_SENSE
        | op::TEST_UNIT_READY
        | op::PERSISTENT_RESERVE_IN
        | op::PERSISTENT_RESERVE_OUT
        | op::READ_CAPACITY_10
        | op::MAINTENANCE_IN
        | op::START_STOP_UNIT => Access::Any,
        op::PREVENT_ALLOW_MEDIUM_REMOVAL => {
            if cdb.u8(4).unwrap_or(0) & 0x03 == 0 {
                Access::Any
            } else {
                Access::Write
            }
        }
        op::SERVICE_ACTION_IN_16 => match cdb.service_action() {
            Ok(op::SA_READ_CAPACITY_16) => Access::Any,
            _ => Access::Read,
        },
        op::READ_6
        | op::READ_10
        | op::READ_12
        | op::READ_16
        | op::VERIFY_10
        | op::VERIFY_12
        | op::VERIFY_16
        | op::MODE_SENSE_6
        | op::MODE_SENSE_10 => Access::Read,
        _ => Access::Write,
    }
}

/// What an SPC-2 reservation held by another nexus lets through (SPC-2 table 31).
pub(super) fn allowed_under_spc2_reservation(opcode: u8) -> bool {
    matches!(
        opcode,
        op::INQUIRY
            | op::REQUEST_SENSE
            | op::REPORT_LUNS
            | op::RELEASE_6
            | op::RELEASE_10
            | op::MAINTENANCE_IN
    )
}

#[derive(Debug, Clone)]
struct Registration {
    nexus: Nexus,
    key: u64,
}

#[derive(Debug, Clone)]
struct Reservation {
    kind: PrType,
    /// The holding nexus; None for the all-registrants types, held by every registrant.
    holder: Option<Nexus>,
}

/// Persistent reservation state of a logical unit.
#[derive(Debug, Default, Clone)]
pub(super) struct Persistent {
    /// PRGENERATION: counts the PERSISTENT RESERVE OUT commands that changed registrations.
    generation: u32,
    registrations: Vec<Registration>,
    reservation: Option<Reservation>,
    /// Activate Persist Through Power Loss: the last REGISTER asked for it, so every change is
    /// kept in the unit's store (when it has one) and survives a restart of the daemon.
    aptpl: bool,
}

impl Persistent {
    /// The state as text, for the unit's store: a line per fact (`generation N`, `reg KEY
    /// PORT RTP`, `res TYPE PORT|*`), names last so that they may hold spaces.
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut out = format!("stria-pr 1\ngeneration {}\n", self.generation);
        for r in &self.registrations {
            out.push_str(&format!(
                "reg {:016x} {} {}\n",
                r.key, r.nexus.relative_target_port, r.nexus.initiator_port
            ));
        }
        if let Some(r) = &self.reservation {
            let holder = r
                .holder
                .as_ref()
                .map_or("*".to_string(), |h| format!("{} {}", h.relative_target_port, h.initiator_port));
            out.push_str(&format!("res {} {holder}\n", r.kind as u8));
        }
        out.into_bytes()
    }

    /// The state [`Persistent::encode`] wrote (with APTPL on), or None for text it did not
    /// write.
    pub(super) fn decode(bytes: &[u8]) -> Option<Persistent> {
        let text = std::str::from_utf8(bytes).ok()?;
        let mut lines = text.lines();
        if lines.next()? != "stria-pr 1" {
            return None;
        }
        let mut pr = Persistent { aptpl: true, ..Persistent::default() };
        let nexus = |rtp: &str, port: &str| -> Option<Nexus> {
            Some(Nexus { initiator_port: port.to_string(), relative_target_port: rtp.parse().ok()? })
        };
        for line in lines {
            let mut f = line.splitn(4, ' ');
            match (f.next()?, f.next(), f.next(), f.next()) {
                ("generation", Some(n), None, None) => pr.generation = n.parse().ok()?,
                ("reg", Some(key), Some(rtp), Some(port)) => {
                    if pr.registrations.len() >= MAX_REGISTRATIONS {
                        return None;
                    }
                    let key = u64::from_str_radix(key, 16).ok()?;
                    pr.registrations.push(Registration { nexus: nexus(rtp, port)?, key });
                }
                ("res", Some(kind), Some("*"), None) => {
                    let kind = PrType::from_code(kind.parse().ok()?)?;
                    pr.reservation = Some(Reservation { kind, holder: None });
                }
                ("res", Some(kind), Some(rtp), Some(port)) => {
                    let kind = PrType::from_code(kind.parse().ok()?)?;
                    pr.reservation = Some(Reservation { kind, holder: Some(nexus(rtp, port)?) });
                }
                _ => return None,
            }
        }
        Some(pr)
    }
}

impl Persistent {
    fn key_of(&self, nexus: &Nexus) -> Option<u64> {
        self.registrations.iter().find(|r| &r.nexus == nexus).map(|r| r.key)
    }

    fn is_holder(&self, nexus: &Nexus) -> bool {
        match &self.reservation {
            Some(Reservation { holder: Some(h), .. }) => h == nexus,
            Some(Reservation { holder: None, .. }) => self.key_of(nexus).is_some(),
            None => false,
        }
    }

    /// True when the reservation held through others keeps `nexus` from a command of `access`.
    pub(super) fn blocks(&self, nexus: &Nexus, access: Access) -> bool {
        let Some(r) = &self.reservation else { return false };
        if access == Access::Any || self.is_holder(nexus) {
            return false;
        }
        if r.kind.registrants_have_access() && self.key_of(nexus).is_some() {
            return false;
        }
        access == Access::Write || r.kind.blocks_reads()
    }

    fn bump(&mut self) {
        self.generation = self.generation.wrapping_add(1);
    }

    /// Removes the registrations matching `remove`, returning their nexuses.
    fn remove_where(&mut self, mut remove: impl FnMut(&Registration) -> bool) -> Vec<Nexus> {
        let mut removed = Vec::new();
        self.registrations.retain(|r| {
            let gone = remove(r);
            if gone {
                removed.push(r.nexus.clone());
            }
            !gone
        });
        removed
    }

    /// Drops the reservation when nobody holds it any more: its holder is no longer registered,
    /// or (all registrants) no registrant is left. Returns whether it did.
    fn drop_orphaned_reservation(&mut self) -> bool {
        let orphaned = match &self.reservation {
            Some(Reservation { holder: Some(h), .. }) => self.key_of(h).is_none(),
            Some(Reservation { holder: None, .. }) => self.registrations.is_empty(),
            None => false,
        };
        if orphaned {
            self.reservation = None;
        }
        orphaned
    }

    fn registered_nexuses(&self) -> Vec<Nexus> {
        self.registrations.iter().map(|r| r.nexus.clone()).collect()
    }
}

/// The fields of a basic PERSISTENT RESERVE OUT parameter list.
struct ProutParams {
    key: u64,
    service_action_key: u64,
    spec_i_pt: bool,
    all_tg_pt: bool,
    aptpl: bool,
}

fn prout_params(cdb: &Cdb<'_>, data: &[u8]) -> Result<ProutParams, Check> {
    let len = cdb.be32(5)?;
    if u64::from(len) != PROUT_PARAMETER_BYTES {
        return Err(Check::param_list_length());
    }
    let field = |at, n| param_be(data, at, n).ok_or(Check::param_list_length());
    let flags = field(20, 1)?;
    Ok(ProutParams {
        key: field(0, 8)?,
        service_action_key: field(8, 8)?,
        spec_i_pt: flags & 0x08 != 0,
        all_tg_pt: flags & 0x04 != 0,
        aptpl: flags & 0x01 != 0,
    })
}

/// Service actions of PERSISTENT RESERVE OUT.
mod sa {
    pub(super) const REGISTER: u8 = 0x00;
    pub(super) const RESERVE: u8 = 0x01;
    pub(super) const RELEASE: u8 = 0x02;
    pub(super) const CLEAR: u8 = 0x03;
    pub(super) const PREEMPT: u8 = 0x04;
    pub(super) const PREEMPT_AND_ABORT: u8 = 0x05;
    pub(super) const REGISTER_AND_IGNORE: u8 = 0x06;
}

impl LogicalUnit {
    /// PERSISTENT RESERVE IN: READ KEYS, READ RESERVATION, REPORT CAPABILITIES, READ FULL STATUS.
    pub(super) fn persistent_reserve_in(&self, cdb: &Cdb<'_>) -> Outcome {
        let action = cdb.service_action()?;
        let alloc = usize::from(cdb.be16(7)?);
        let state = self.state.lock();
        let pr = &state.pr;
        let mut d = pr.generation.to_be_bytes().to_vec();
        match action {
            0x00 => {
                let keys: Vec<u8> = pr.registrations.iter().flat_map(|r| r.key.to_be_bytes()).collect();
                d.extend_from_slice(&u32::try_from(keys.len()).expect("bounded").to_be_bytes());
                d.extend_from_slice(&keys);
            }
            0x01 => match &pr.reservation {
                None => d.extend_from_slice(&0u32.to_be_bytes()),
                Some(r) => {
                    d.extend_from_slice(&16u32.to_be_bytes());
                    let key = r.holder.as_ref().and_then(|h| pr.key_of(h)).unwrap_or(0);
                    d.extend_from_slice(&key.to_be_bytes());
                    d.extend_from_slice(&[0, 0, 0, 0, 0, r.kind as u8, 0, 0]);
                }
            },
            0x02 => {
                // LENGTH 8; CRH (RESERVE/RELEASE(6) may run beside registrations: no);
                // TMV, ALLOW COMMANDS 001b; the six types supported.
                // PTPL_C when the unit has a store; PTPL_A when APTPL is on.
                let ptpl_c = u8::from(self.store.is_some());
                d = vec![0, 8, ptpl_c, 0x90 | u8::from(pr.aptpl), 0xEA, 0x01, 0, 0];
            }
            0x03 => {
                let mut descriptors = Vec::new();
                for r in &pr.registrations {
                    full_status_descriptor(&mut descriptors, pr, r);
                }
                d.extend_from_slice(&u32::try_from(descriptors.len()).expect("bounded").to_be_bytes());
                d.extend_from_slice(&descriptors);
            }
            _ => return Err(Check::invalid_cdb(1, Some(4)).into()),
        }
        Ok(data_in(d, alloc))
    }

    /// PERSISTENT RESERVE OUT.
    pub(super) fn persistent_reserve_out(&self, nexus: &Nexus, cdb: &Cdb<'_>, data: &[u8]) -> Outcome {
        let action = cdb.service_action()?;
        if action > sa::REGISTER_AND_IGNORE {
            return Err(Check::invalid_cdb(1, Some(4)).into()); // REGISTER AND MOVE and beyond
        }
        let scope = cdb.u8(2)? >> 4;
        let kind_code = cdb.u8(2)? & 0x0F;
        let p = prout_params(cdb, data)?;
        if p.spec_i_pt || p.all_tg_pt {
            return Err(Check::invalid_param(20, Some(if p.spec_i_pt { 3 } else { 2 })).into());
        }
        if p.aptpl && self.store.is_none() {
            // Nowhere to keep them: persistence through a restart cannot be promised.
            return Err(Check::invalid_param(20, Some(0)).into());
        }
        let mut state = self.state.lock();
        let before = state.pr.clone();
        let outcome = self.prout_action(&mut state, nexus, action, scope, kind_code, &p);
        if outcome.is_ok() && (action == sa::REGISTER || action == sa::REGISTER_AND_IGNORE) {
            // The APTPL bit of the last REGISTER decides (SPC-5 5.13.5).
            state.pr.aptpl = p.aptpl;
        }
        // With APTPL (or when it was just turned off) the store follows every change; a store
        // that fails leaves the state as it was and the command fails.
        if let Some(store) = &self.store
            && outcome.is_ok()
            && (state.pr.aptpl || before.aptpl)
        {
            let saved = if state.pr.aptpl { store.save(Some(&state.pr.encode())) } else { store.save(None) };
            if let Err(e) = saved {
                tracing::error!(error = %e, "iscsi: persistent reservations could not be kept: change undone");
                state.pr = before;
                return Err(Check::of_kind(stria_volume::ErrorKind::Io).into());
            }
        }
        outcome
    }

    /// One PERSISTENT RESERVE OUT service action on the state.
    fn prout_action(
        &self,
        state: &mut State,
        nexus: &Nexus,
        action: u8,
        scope: u8,
        kind_code: u8,
        p: &ProutParams,
    ) -> Outcome {
        let registered = state.pr.key_of(nexus);
        if action == sa::REGISTER || action == sa::REGISTER_AND_IGNORE {
            return register(state, nexus, p, action == sa::REGISTER_AND_IGNORE);
        }
        // Every other service action needs the nexus registered under the key it gives.
        if registered != Some(p.key) {
            return Err(Failure::Conflict);
        }
        let typed = || -> Result<PrType, Failure> {
            if scope != 0 {
                return Err(Check::invalid_cdb(2, Some(7)).into());
            }
            PrType::from_code(kind_code).ok_or_else(|| Check::invalid_cdb(2, Some(3)).into())
        };
        match action {
            sa::RESERVE => reserve(state, nexus, typed()?),
            sa::RELEASE => release(state, nexus, typed()?),
            sa::CLEAR => {
                let others: Vec<Nexus> =
                    state.pr.registered_nexuses().into_iter().filter(|n| n != nexus).collect();
                state.pr.registrations.clear();
                state.pr.reservation = None;
                state.pr.bump();
                for n in others {
                    state.add_ua(&n, UA_RESERVATIONS_PREEMPTED);
                }
                Ok(None)
            }
            sa::PREEMPT | sa::PREEMPT_AND_ABORT => preempt(state, nexus, p.service_action_key, typed()?),
            _ => Err(Check::invalid_cdb(1, Some(4)).into()),
        }
    }

    /// RESERVE(6)/(10) and RELEASE(6)/(10): an SPC-2 reservation of the whole logical unit,
    /// refused while persistent registrations exist (SPC-5 5.13.3). Third-party and extent
    /// reservations are not supported.
    pub(super) fn reserve_release(&self, nexus: &Nexus, cdb: &Cdb<'_>) -> Outcome {
        let reserve = matches!(cdb.opcode(), op::RESERVE_6 | op::RESERVE_10);
        let ten = matches!(cdb.opcode(), op::RESERVE_10 | op::RELEASE_10);
        if ten && cdb.bit(1, 4)? {
            return Err(Check::invalid_cdb(1, Some(4)).into()); // 3RDPTY
        }
        if !ten && cdb.bit(1, 0)? {
            return Err(Check::invalid_cdb(1, Some(0)).into()); // obsolete extent reservation
        }
        let mut state = self.state.lock();
        if !state.pr.registrations.is_empty() {
            return Err(Failure::Conflict);
        }
        match (&state.reserved_by, reserve) {
            (Some(holder), true) if holder != nexus => Err(Failure::Conflict),
            (_, true) => {
                state.reserved_by = Some(nexus.clone());
                Ok(None)
            }
            (Some(holder), false) if holder == nexus => {
                state.reserved_by = None;
                Ok(None)
            }
            // Releasing what another nexus holds, or nothing, succeeds and changes nothing.
            (_, false) => Ok(None),
        }
    }
}

/// REGISTER and REGISTER AND IGNORE EXISTING KEY.
fn register(state: &mut State, nexus: &Nexus, p: &ProutParams, ignore_existing: bool) -> Outcome {
    let pr = &mut state.pr;
    match pr.key_of(nexus) {
        None => {
            if !ignore_existing && p.key != 0 {
                return Err(Failure::Conflict);
            }
            if p.service_action_key == 0 {
                return Ok(None); // unregistering what is not registered: nothing to do
            }
            if pr.registrations.len() >= MAX_REGISTRATIONS {
                return Err(Check::registrations_full().into());
            }
            pr.registrations.push(Registration { nexus: nexus.clone(), key: p.service_action_key });
        }
        Some(key) => {
            if !ignore_existing && key != p.key {
                return Err(Failure::Conflict);
            }
            if p.service_action_key != 0 {
                for r in pr.registrations.iter_mut().filter(|r| &r.nexus == nexus) {
                    r.key = p.service_action_key;
                }
            } else {
                let released_ro = pr.reservation.as_ref().is_some_and(|r| {
                    r.holder.as_ref() == Some(nexus)
                        && matches!(
                            r.kind,
                            PrType::WriteExclusiveRegistrantsOnly | PrType::ExclusiveAccessRegistrantsOnly
                        )
                });
                pr.remove_where(|r| &r.nexus == nexus);
                pr.drop_orphaned_reservation();
                if released_ro {
                    // SPC-5 5.13.11.2.2: a registrants-only reservation released by its holder
                    // unregistering is reported to the other registrants.
                    for n in state.pr.registered_nexuses() {
                        state.add_ua(&n, UA_RESERVATIONS_RELEASED);
                    }
                }
            }
        }
    }
    state.pr.bump();
    Ok(None)
}

/// RESERVE: creates the reservation, or confirms the one this nexus holds.
fn reserve(state: &mut State, nexus: &Nexus, kind: PrType) -> Outcome {
    let pr = &mut state.pr;
    match &pr.reservation {
        None => {
            let holder = if kind.all_registrants() { None } else { Some(nexus.clone()) };
            pr.reservation = Some(Reservation { kind, holder });
            Ok(None)
        }
        Some(r) if r.kind == kind && pr.is_holder(nexus) => Ok(None),
        Some(_) => Err(Failure::Conflict),
    }
}

/// RELEASE: by the holder, with the reservation's type; anyone else's release changes nothing.
fn release(state: &mut State, nexus: &Nexus, kind: PrType) -> Outcome {
    let Some(r) = &state.pr.reservation else { return Ok(None) };
    if !state.pr.is_holder(nexus) {
        return Ok(None);
    }
    if r.kind != kind {
        return Err(Check::invalid_release().into());
    }
    let tell_others = r.kind.registrants_have_access();
    state.pr.reservation = None;
    if tell_others {
        for n in state.pr.registered_nexuses().into_iter().filter(|n| n != nexus) {
            state.add_ua(&n, UA_RESERVATIONS_RELEASED);
        }
    }
    Ok(None)
}

/// PREEMPT (and PREEMPT AND ABORT, whose task aborts have nothing to do here: commands of this
/// layer are not queued behind one another). SPC-5 5.13.11.2.4.
fn preempt(state: &mut State, nexus: &Nexus, victim_key: u64, kind: PrType) -> Outcome {
    let pr = &mut state.pr;
    let removed: Vec<Nexus>;
    let mut changed_reservation = false;
    match pr.reservation.clone() {
        Some(r) if r.holder.is_none() => {
            // All registrants: a key of 0 takes the reservation over, removing every other
            // registration; another key only removes that key's registrations.
            if victim_key == 0 {
                removed = pr.remove_where(|r| &r.nexus != nexus);
                pr.reservation = Some(Reservation {
                    kind,
                    holder: if kind.all_registrants() { None } else { Some(nexus.clone()) },
                });
                changed_reservation = true;
            } else {
                removed = pr.remove_where(|r| r.key == victim_key && &r.nexus != nexus);
            }
        }
        Some(r) => {
            let holder = r.holder.expect("checked above");
            let holder_key = pr.key_of(&holder);
            if victim_key == 0 {
                return Err(Check::invalid_param(8, None).into());
            }
            if holder_key == Some(victim_key) {
                removed = pr.remove_where(|reg| reg.key == victim_key && reg.nexus != *nexus);
                let new_holder = if kind.all_registrants() { None } else { Some(nexus.clone()) };
                changed_reservation = r.kind != kind || holder != *nexus;
                pr.reservation = Some(Reservation { kind, holder: new_holder });
            } else {
                removed = pr.remove_where(|reg| reg.key == victim_key && reg.nexus != *nexus);
            }
        }
        None => {
            if victim_key == 0 {
                return Err(Check::invalid_param(8, None).into());
            }
            removed = pr.remove_where(|reg| reg.key == victim_key && reg.nexus != *nexus);
        }
    }
    if removed.is_empty() && !changed_reservation && victim_key != pr.key_of(nexus).unwrap_or(0) {
        return Err(Failure::Conflict);
    }
    pr.bump();
    for n in &removed {
        state.add_ua(n, UA_REGISTRATIONS_PREEMPTED);
    }
    if changed_reservation {
        for n in state.pr.registered_nexuses().into_iter().filter(|n| n != nexus) {
            state.add_ua(&n, UA_RESERVATIONS_RELEASED);
        }
    }
    Ok(None)
}

/// One READ FULL STATUS descriptor (SPC-5 6.16.5) with an iSCSI TransportID of format 01b
/// (initiator port name with ISID, SPC-5 7.6.4.6).
fn full_status_descriptor(out: &mut Vec<u8>, pr: &Persistent, r: &Registration) {
    let holder = pr.is_holder(&r.nexus);
    let mut name = super::inquiry::printable(&r.nexus.initiator_port).into_bytes();
    name.truncate(250);
    name.push(0);
    // Padded to a multiple of 4, and the TransportID to at least 20 bytes.
    name.resize(name.len().next_multiple_of(4).max(16), 0);
    // FORMAT CODE 01b, PROTOCOL IDENTIFIER iSCSI (5h).
    let mut tid = vec![0x45, 0];
    tid.extend_from_slice(&u16::try_from(name.len()).expect("short").to_be_bytes());
    tid.extend_from_slice(&name);
    out.extend_from_slice(&r.key.to_be_bytes());
    out.extend_from_slice(&[0; 4]);
    out.push(u8::from(holder)); // R_HOLDER
    let kind = if holder { pr.reservation.as_ref().map_or(0, |res| res.kind as u8) } else { 0 };
    out.push(kind);
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&r.nexus.relative_target_port.to_be_bytes());
    out.extend_from_slice(&u32::try_from(tid.len()).expect("short").to_be_bytes());
    out.extend_from_slice(&tid);
}
