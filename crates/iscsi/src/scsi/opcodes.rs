//! REPORT SUPPORTED OPERATION CODES (SPC-5 6.35; MAINTENANCE IN, service action 0Ch): the
//! commands this layer runs, all at once or one at a time, with their CDB usage maps.

use super::cdb::{Cdb, group_len};
use super::sense::Check;
use super::{Outcome, data_in, op};

/// Its service action of MAINTENANCE IN.
pub(super) const SA_REPORT_SUPPORTED_OPCODES: u8 = 0x0C;

/// Service actions of the commands that have them, as this layer runs them.
fn service_actions(opcode: u8) -> Option<&'static [u8]> {
    match opcode {
        op::SERVICE_ACTION_IN_16 => Some(&[op::SA_READ_CAPACITY_16, op::SA_GET_LBA_STATUS]),
        op::MAINTENANCE_IN => Some(&[SA_REPORT_SUPPORTED_OPCODES]),
        // READ KEYS, READ RESERVATION, REPORT CAPABILITIES, READ FULL STATUS.
        op::PERSISTENT_RESERVE_IN => Some(&[0x00, 0x01, 0x02, 0x03]),
        // REGISTER, RESERVE, RELEASE, CLEAR, PREEMPT, PREEMPT AND ABORT, REGISTER AND IGNORE.
        op::PERSISTENT_RESERVE_OUT => Some(&[0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06]),
        _ => None,
    }
}

/// The CDB usage map of a command: its operation code, its service action where the CDB has
/// one (byte 1, low 5 bits), and every other bit marked as one the device server looks at
/// (no command here is refused for a bit the map shows).
fn usage(opcode: u8, action: Option<u8>) -> Vec<u8> {
    let len = group_len(opcode).unwrap_or(6);
    let mut u = vec![0xFF; len];
    u[0] = opcode;
    if let Some(a) = action {
        u[1] = a & 0x1F;
    }
    u[len - 1] = 0x00; // the control byte: no NACA, no vendor bits
    u
}

/// A command timeouts descriptor (SPC-5 6.35.4): length 0Ah, no timeouts given (0: not
/// specified).
fn timeouts(d: &mut Vec<u8>) {
    d.extend_from_slice(&[0x00, 0x0A]);
    d.extend_from_slice(&[0; 10]);
}

/// MAINTENANCE IN: REPORT SUPPORTED OPERATION CODES; any other service action is refused.
pub(super) fn maintenance_in(cdb: &Cdb<'_>) -> Outcome {
    if cdb.service_action()? != SA_REPORT_SUPPORTED_OPCODES {
        return Err(Check::invalid_cdb(1, Some(4)).into());
    }
    let rctd = cdb.bit(2, 7)?;
    let options = cdb.u8(2)? & 0x07;
    let requested = cdb.u8(3)?;
    let requested_action = cdb.be16(4)?;
    let alloc = usize::try_from(cdb.be32(6)?).unwrap_or(usize::MAX);
    let mut d = Vec::new();
    match options {
        // Every command: a descriptor each.
        0 => {
            d.extend_from_slice(&[0; 4]);
            for &opcode in &op::KNOWN {
                let cdb_len = u16::try_from(group_len(opcode).unwrap_or(6)).unwrap_or(6);
                let actions: Vec<Option<u8>> = match service_actions(opcode) {
                    Some(a) => a.iter().copied().map(Some).collect(),
                    None => vec![None],
                };
                for action in actions {
                    d.push(opcode);
                    d.push(0);
                    d.extend_from_slice(&u16::from(action.unwrap_or(0)).to_be_bytes());
                    d.push(0);
                    d.push(u8::from(rctd) << 1 | u8::from(action.is_some()));
                    d.extend_from_slice(&cdb_len.to_be_bytes());
                    if rctd {
                        timeouts(&mut d);
                    }
                }
            }
            let len = u32::try_from(d.len() - 4).unwrap_or(u32::MAX);
            d[0..4].copy_from_slice(&len.to_be_bytes());
        }
        // One command: by operation code (1), by operation code and service action (2), or
        // by operation code with its service action if it has them (3).
        1..=3 => {
            let known = op::KNOWN.contains(&requested);
            let actions = service_actions(requested);
            let action = match (options, actions) {
                (1, Some(_)) | (2, None) if known => return Err(Check::invalid_cdb(2, Some(2)).into()),
                (2 | 3, Some(a)) => u8::try_from(requested_action).ok().filter(|sa| a.contains(sa)).map(Some),
                _ if known => Some(None),
                _ => None,
            };
            match action {
                Some(action) => {
                    let u = usage(requested, action);
                    d.push(0);
                    d.push(u8::from(rctd) << 7 | 0x03); // supported as the standard says
                    d.extend_from_slice(&u16::try_from(u.len()).unwrap_or(0).to_be_bytes());
                    d.extend_from_slice(&u);
                    if rctd {
                        timeouts(&mut d);
                    }
                }
                // Not supported: SUPPORT 001b, no usage data.
                None => d.extend_from_slice(&[0, 0x01, 0, 0]),
            }
        }
        _ => return Err(Check::invalid_cdb(2, Some(2)).into()),
    }
    Ok(data_in(d, alloc))
}
