//! MODE SENSE and MODE SELECT (SPC-5 6.11..6.14) with the pages a disk reports: caching (08h),
//! control (0Ah) and informational exceptions control (1Ch).
//!
//! Only WCE of the caching page can be changed. With WCE set (the default) writes may sit in
//! the volume's volatile state until SYNCHRONIZE CACHE, unless FUA; with WCE clear every write
//! is made durable before it completes (written with FUA). Everything else is reported as
//! not changeable (PC 01b answers all zeros for it), and a MODE SELECT that changes it is refused
//! with INVALID FIELD IN PARAMETER LIST. The saved values are not supported (PC 11b and SP are
//! refused): the parameters last as long as the daemon serves the volume.

use stria_front::Attachment;
use stria_volume::Durability;

use super::cdb::{Cdb, param_be};
use super::sense::Check;
use super::{LOGICAL_BLOCK_BYTES, LogicalUnit, Nexus, Outcome, UA_MODE_CHANGED, data_in, op};

/// Page codes.
const CACHING: u8 = 0x08;
const CONTROL: u8 = 0x0A;
const INFORMATIONAL_EXCEPTIONS: u8 = 0x1C;
const ALL_PAGES: u8 = 0x3F;

/// The most bytes of a MODE SELECT(10) parameter list looked at: a header, a long block
/// descriptor and every page fit many times over.
const MODE_SELECT_MAX_BYTES: usize = 1024;

/// The mode parameters MODE SELECT can change, shared by every nexus.
#[derive(Debug, Clone, Copy)]
pub(super) struct ModeState {
    /// Write cache enabled (caching page WCE).
    wce: bool,
}

impl Default for ModeState {
    fn default() -> ModeState {
        ModeState { wce: true }
    }
}

impl ModeState {
    /// How a write without FUA is to be made durable.
    pub(super) fn durability(&self, fua: bool) -> Durability {
        Durability::from_fua(fua || !self.wce)
    }
}

/// Which values a page reports (the PC field).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Values {
    Current,
    Changeable,
    Default,
}

/// The page `code` for these values, whole (page code, PAGE LENGTH and parameters).
fn page(code: u8, values: Values, state: ModeState) -> Option<Vec<u8>> {
    let mut p = match code {
        CACHING => vec![0u8; 20],
        CONTROL => vec![0u8; 12],
        INFORMATIONAL_EXCEPTIONS => vec![0u8; 12],
        _ => return None,
    };
    p[0] = code;
    p[1] = u8::try_from(p.len() - 2).expect("short pages");
    match (code, values) {
        (CACHING, Values::Changeable) => p[2] = 0x04, // WCE
        (CACHING, Values::Current) => p[2] = if state.wce { 0x04 } else { 0 },
        (CACHING, Values::Default) => p[2] = 0x04,
        (CONTROL, Values::Current | Values::Default) => {
            // QUEUE ALGORITHM MODIFIER 1: commands may be reordered (each is atomic only
            // against overlapping ones, as the volume contract says). BUSY TIMEOUT PERIOD
            // unlimited.
            p[3] = 0x10;
            p[8..10].copy_from_slice(&0xFFFFu16.to_be_bytes());
        }
        (INFORMATIONAL_EXCEPTIONS, Values::Current | Values::Default) => p[2] = 0x08, // DEXCPT
        _ => {}
    }
    Some(p)
}

/// The pages MODE SENSE returns for a page code, in order.
fn pages(code: u8, values: Values, state: ModeState) -> Option<Vec<u8>> {
    if code == ALL_PAGES {
        let all = [CACHING, CONTROL, INFORMATIONAL_EXCEPTIONS];
        return Some(all.iter().filter_map(|c| page(*c, values, state)).flatten().collect());
    }
    page(code, values, state)
}

impl LogicalUnit {
    /// The durability of a write (FUA bit `fua`) under the current caching page.
    pub(super) fn durability(&self, fua: bool) -> Durability {
        self.state.lock().mode.durability(fua)
    }

    /// MODE SENSE(6) and (10).
    pub(super) fn mode_sense(&self, volume: &Attachment, cdb: &Cdb<'_>) -> Outcome {
        let ten = cdb.opcode() == op::MODE_SENSE_10;
        let dbd = cdb.bit(1, 3)?;
        let llbaa = ten && cdb.bit(1, 4)?;
        let pc = cdb.u8(2)? >> 6;
        let code = cdb.u8(2)? & 0x3F;
        let subpage = cdb.u8(3)?;
        let alloc = if ten { usize::from(cdb.be16(7)?) } else { usize::from(cdb.u8(4)?) };
        let values = match pc {
            0 => Values::Current,
            1 => Values::Changeable,
            2 => Values::Default,
            _ => return Err(Check::saving_not_supported().into()),
        };
        // No page has subpages: subpage 00h, or FFh with all pages (all pages and subpages).
        if subpage != 0 && !(subpage == 0xFF && code == ALL_PAGES) {
            return Err(Check::invalid_cdb(3, None).into());
        }
        let state = self.state.lock().mode;
        let body = pages(code, values, state).ok_or(Check::invalid_cdb(2, Some(5)))?;
        let blocks = volume.size_bytes() / LOGICAL_BLOCK_BYTES;
        let descriptor = match (dbd, llbaa) {
            (true, _) => Vec::new(),
            (false, false) => {
                let mut d = vec![0u8; 8];
                d[0..4].copy_from_slice(&u32::try_from(blocks).unwrap_or(u32::MAX).to_be_bytes());
                d[5..8].copy_from_slice(&512u32.to_be_bytes()[1..]);
                d
            }
            (false, true) => {
                let mut d = vec![0u8; 16];
                d[0..8].copy_from_slice(&blocks.to_be_bytes());
                d[12..16].copy_from_slice(&512u32.to_be_bytes());
                d
            }
        };
        // DEVICE-SPECIFIC PARAMETER: WP for a read-only volume, DPOFUA (FUA is honoured).
        let device_specific = if volume.info().read_only { 0x80 | 0x10 } else { 0x10 };
        let mut d = if ten {
            let mut h = vec![0u8; 8];
            h[3] = device_specific;
            h[4] = u8::from(llbaa && !dbd); // LONGLBA
            h[6..8].copy_from_slice(&u16::try_from(descriptor.len()).expect("16 at most").to_be_bytes());
            h
        } else {
            vec![0, 0, device_specific, u8::try_from(descriptor.len()).expect("8 at most")]
        };
        d.extend_from_slice(&descriptor);
        d.extend_from_slice(&body);
        // MODE DATA LENGTH: the bytes after itself.
        if ten {
            let len = u16::try_from(d.len() - 2).expect("short mode data");
            d[0..2].copy_from_slice(&len.to_be_bytes());
        } else {
            d[0] = u8::try_from(d.len() - 1).expect("short mode data");
        }
        Ok(data_in(d, alloc))
    }

    /// MODE SELECT(6) and (10): checks the whole parameter list before changing anything.
    pub(super) fn mode_select(&self, nexus: &Nexus, cdb: &Cdb<'_>, data: &[u8]) -> Outcome {
        let ten = cdb.opcode() == op::MODE_SELECT_10;
        if cdb.bit(1, 0)? {
            return Err(Check::invalid_cdb(1, Some(0)).into()); // SP: nothing is saved
        }
        let len = if ten { usize::from(cdb.be16(7)?) } else { usize::from(cdb.u8(4)?) };
        if len == 0 {
            return Ok(None);
        }
        if len > MODE_SELECT_MAX_BYTES {
            return Err(Check::param_list_length().into());
        }
        let data = data.get(..len).ok_or(Check::param_list_length())?;
        let header = if ten { 8 } else { 4 };
        let descriptors = if ten { param_be(data, 6, 2) } else { param_be(data, 3, 1) };
        let descriptors = usize::try_from(descriptors.ok_or(Check::param_list_length())?)
            .map_err(|_| Check::param_list_length())?;
        let long = ten && param_be(data, 4, 1).is_some_and(|b| b & 1 != 0);
        let mut at = header;
        match (descriptors, long) {
            (0, _) => {}
            (8, false) | (16, true) => {
                let block_len_at = at + if long { 12 } else { 5 };
                let width = if long { 4 } else { 3 };
                let block_len = param_be(data, block_len_at, width).ok_or(Check::param_list_length())?;
                if block_len != 0 && block_len != LOGICAL_BLOCK_BYTES {
                    let pointer = u16::try_from(block_len_at).expect("a short list");
                    return Err(Check::invalid_param(pointer, None).into());
                }
                at += descriptors;
            }
            _ => return Err(Check::invalid_param(if ten { 6 } else { 3 }, None).into()),
        }
        let mut state = self.state.lock();
        let mut mode = state.mode;
        while at < data.len() {
            let pointer = u16::try_from(at).expect("a short list");
            let (code, page_len) = match (data.get(at), data.get(at + 1)) {
                (Some(c), Some(l)) => (*c, usize::from(*l)),
                _ => return Err(Check::param_list_length().into()),
            };
            if code & 0x40 != 0 {
                return Err(Check::invalid_param(pointer, Some(6)).into()); // SPF: no subpages
            }
            let code = code & 0x3F;
            let current = page(code, Values::Current, mode).ok_or(Check::invalid_param(pointer, Some(5)))?;
            let changeable = page(code, Values::Changeable, mode).expect("every page has a mask");
            if page_len + 2 != current.len() {
                return Err(Check::invalid_param(pointer + 1, None).into());
            }
            let new = data.get(at..at + current.len()).ok_or(Check::param_list_length())?;
            for i in 2..current.len() {
                if (new[i] ^ current[i]) & !changeable[i] != 0 {
                    let byte = pointer + u16::try_from(i).expect("short pages");
                    return Err(Check::invalid_param(byte, None).into());
                }
            }
            if code == CACHING {
                mode.wce = new[2] & 0x04 != 0;
            }
            at += current.len();
        }
        if state.mode.wce != mode.wce {
            state.mode = mode;
            state.add_ua_to_others(nexus, UA_MODE_CHANGED);
        }
        Ok(None)
    }
}
