//! Reading a CDB without trusting it: every field read is bounds-checked and a CDB too short for
//! its field is INVALID FIELD IN CDB, so no CDB can make the layer index out of bounds.

use super::sense::Check;
use super::{LOGICAL_BLOCK_BYTES, op};

/// A CDB cut to the length its operation code's group gives (SPC-5 4.2.5.1), with readers
/// that fail with INVALID FIELD IN CDB instead of panicking.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cdb<'a> {
    bytes: &'a [u8],
}

/// The CDB length of an operation code's group: 6, 10, 12 or 16 bytes; None for the groups
/// with variable or vendor-specific lengths, which this layer knows no commands of.
pub(crate) fn group_len(opcode: u8) -> Option<usize> {
    match opcode >> 5 {
        0 => Some(6),
        1 | 2 => Some(10),
        4 => Some(16),
        5 => Some(12),
        _ => None,
    }
}

impl<'a> Cdb<'a> {
    /// The CDB for its opcode's length; a CDB shorter than that is refused (INVALID FIELD IN
    /// CDB at the first byte missing). Bytes past the length (iSCSI pads CDBs to 16) are ignored.
    pub(crate) fn new(bytes: &'a [u8]) -> Result<Cdb<'a>, Check> {
        let opcode = *bytes.first().ok_or_else(Check::invalid_opcode)?;
        let len = group_len(opcode).ok_or_else(Check::invalid_opcode)?;
        match bytes.get(..len) {
            Some(bytes) => Ok(Cdb { bytes }),
            None => Err(Check::invalid_cdb(u16::try_from(bytes.len()).unwrap_or(u16::MAX), None)),
        }
    }

    pub(crate) fn opcode(&self) -> u8 {
        self.bytes[0]
    }

    pub(crate) fn len(&self) -> usize {
        self.bytes.len()
    }

    fn field(&self, at: usize, n: usize) -> Result<&'a [u8], Check> {
        let pointer = u16::try_from(at).unwrap_or(u16::MAX);
        at.checked_add(n).and_then(|end| self.bytes.get(at..end)).ok_or(Check::invalid_cdb(pointer, None))
    }

    pub(crate) fn u8(&self, at: usize) -> Result<u8, Check> {
        Ok(self.field(at, 1)?[0])
    }

    /// A bit of byte `at`.
    pub(crate) fn bit(&self, at: usize, bit: u8) -> Result<bool, Check> {
        Ok(self.u8(at)? & (1 << bit) != 0)
    }

    pub(crate) fn be16(&self, at: usize) -> Result<u16, Check> {
        Ok(u16::from_be_bytes(self.field(at, 2)?.try_into().expect("two bytes")))
    }

    pub(crate) fn be24(&self, at: usize) -> Result<u32, Check> {
        let b = self.field(at, 3)?;
        Ok(u32::from_be_bytes([0, b[0], b[1], b[2]]))
    }

    pub(crate) fn be32(&self, at: usize) -> Result<u32, Check> {
        Ok(u32::from_be_bytes(self.field(at, 4)?.try_into().expect("four bytes")))
    }

    pub(crate) fn be64(&self, at: usize) -> Result<u64, Check> {
        Ok(u64::from_be_bytes(self.field(at, 8)?.try_into().expect("eight bytes")))
    }

    /// The service action of a 12- or 16-byte command (byte 1, bits 4..0).
    pub(crate) fn service_action(&self) -> Result<u8, Check> {
        Ok(self.u8(1)? & 0x1F)
    }

    /// Refuses a CONTROL byte asking for NACA (bit 2) or LINK (bit 0), which this target does
    /// not support (SAM-5: INVALID FIELD IN CDB).
    pub(crate) fn check_control(&self) -> Result<(), Check> {
        let last = self.len() - 1;
        let control = self.u8(last)?;
        let pointer = u16::try_from(last).expect("a CDB is at most 16 bytes");
        if control & 0x04 != 0 {
            return Err(Check::invalid_cdb(pointer, Some(2)));
        }
        if control & 0x01 != 0 {
            return Err(Check::invalid_cdb(pointer, Some(0)));
        }
        Ok(())
    }
}

/// Reads a big-endian field of a parameter list (Data-Out); None when it is too short.
pub(crate) fn param_be(data: &[u8], at: usize, n: usize) -> Option<u64> {
    let bytes = data.get(at..at.checked_add(n)?)?;
    Some(bytes.iter().fold(0u64, |acc, b| (acc << 8) | u64::from(*b)))
}

/// Bytes of Data-Out a CDB transfers (see [`super::LogicalUnit::data_out_bytes`]).
pub(crate) fn data_out_bytes(bytes: &[u8]) -> Option<u64> {
    let cdb = Cdb::new(bytes).ok()?;
    let blocks = |n: u64| n.checked_mul(LOGICAL_BLOCK_BYTES);
    match cdb.opcode() {
        op::WRITE_6 => {
            let n = cdb.u8(4).ok()?;
            blocks(if n == 0 { 256 } else { u64::from(n) })
        }
        op::WRITE_10 | op::WRITE_AND_VERIFY_10 => blocks(u64::from(cdb.be16(7).ok()?)),
        op::WRITE_12 | op::WRITE_AND_VERIFY_12 => blocks(u64::from(cdb.be32(6).ok()?)),
        op::WRITE_16 | op::WRITE_AND_VERIFY_16 => blocks(u64::from(cdb.be32(10).ok()?)),
        op::VERIFY_10 => verify_bytes(cdb.u8(1).ok()?, u64::from(cdb.be16(7).ok()?)),
        op::VERIFY_12 => verify_bytes(cdb.u8(1).ok()?, u64::from(cdb.be32(6).ok()?)),
        op::VERIFY_16 => verify_bytes(cdb.u8(1).ok()?, u64::from(cdb.be32(10).ok()?)),
        op::COMPARE_AND_WRITE => blocks(2 * u64::from(cdb.u8(13).ok()?)),
        op::WRITE_SAME_10 => Some(LOGICAL_BLOCK_BYTES),
        op::WRITE_SAME_16 => Some(if cdb.bit(1, 0).ok()? { 0 } else { LOGICAL_BLOCK_BYTES }),
        op::UNMAP => Some(u64::from(cdb.be16(7).ok()?)),
        op::MODE_SELECT_6 => Some(u64::from(cdb.u8(4).ok()?)),
        op::MODE_SELECT_10 => Some(u64::from(cdb.be16(7).ok()?)),
        op::PERSISTENT_RESERVE_OUT => Some(u64::from(cdb.be32(5).ok()?)),
        o if op::KNOWN.contains(&o) => Some(0),
        _ => None,
    }
}

/// Data-Out of a VERIFY: none for BYTCHK 00b, the whole range for 01b, one block for 11b.
fn verify_bytes(byte1: u8, blocks: u64) -> Option<u64> {
    match (byte1 >> 1) & 0x03 {
        0b01 => blocks.checked_mul(LOGICAL_BLOCK_BYTES),
        0b11 => Some(LOGICAL_BLOCK_BYTES),
        _ => Some(0),
    }
}
