//! Sense data: how a command that fails says why ([`Check`]), and the one encoder of fixed-format
//! sense data ([`fixed_sense`], SPC-5 4.4.3).

use stria_front::errors::{Sense, scsi_sense};
use stria_volume::{ErrorKind, VolumeError};

/// Sense key NO SENSE (0h): REQUEST SENSE with nothing to report.
pub(crate) const KEY_NO_SENSE: u8 = 0x0;
/// Sense key ILLEGAL REQUEST (5h).
pub(crate) const KEY_ILLEGAL_REQUEST: u8 = 0x5;
/// Sense key UNIT ATTENTION (6h).
pub(crate) const KEY_UNIT_ATTENTION: u8 = 0x6;

/// Length of the fixed-format sense data this target sends: 8 bytes of header and 10 more
/// (ADDITIONAL SENSE LENGTH 10), enough for the sense-key specific bytes 15..18.
pub const FIXED_SENSE_BYTES: usize = 18;

/// Where in the CDB or parameter list the field an ILLEGAL REQUEST complains about is: the
/// SENSE KEY SPECIFIC bytes of SPC-5 4.4.3 (field pointer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FieldPointer {
    /// True for a CDB field, false for a field of the parameter list (Data-Out).
    pub(crate) in_cdb: bool,
    /// The byte of the field.
    pub(crate) byte: u16,
    /// The bit of the byte where the field starts (its most significant bit), when known.
    pub(crate) bit: Option<u8>,
}

/// A command ending in CHECK CONDITION, before it is encoded: sense key, ASC/ASCQ, the
/// INFORMATION field when it has one, and the field pointer of an ILLEGAL REQUEST.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Check {
    pub(crate) key: u8,
    pub(crate) asc: u8,
    pub(crate) ascq: u8,
    pub(crate) information: Option<u32>,
    pub(crate) field: Option<FieldPointer>,
}

impl Check {
    pub(crate) fn new(key: u8, asc: u8, ascq: u8) -> Check {
        Check { key, asc, ascq, information: None, field: None }
    }

    /// The sense of a kind of volume error, from the front ends' one table.
    pub(crate) fn of_kind(kind: ErrorKind) -> Check {
        let Sense { key, asc, ascq } = scsi_sense(kind);
        Check::new(key as u8, asc, ascq)
    }

    /// The sense of a volume error: its kind's, and for a miscompare the offset of the first
    /// differing byte in INFORMATION (SBC-4, COMPARE AND WRITE).
    pub(crate) fn of_volume(e: &VolumeError) -> Check {
        let check = Check::of_kind(e.kind());
        match e {
            VolumeError::Miscompare { miscompare_offset_bytes, .. } => {
                check.with_information(*miscompare_offset_bytes)
            }
            _ => check,
        }
    }

    /// MISCOMPARE DURING VERIFY OPERATION found by this layer (VERIFY with BYTCHK), with the
    /// offset of the first differing byte.
    pub(crate) fn miscompare_at(offset_bytes: u64) -> Check {
        Check::of_kind(ErrorKind::Miscompare).with_information(offset_bytes)
    }

    /// INFORMATION holds four bytes; an offset that does not fit is left out (VALID clear)
    /// rather than reported wrong. Offsets here are within one command's Data-Out, at most
    /// a few MiB, so this does not happen.
    fn with_information(mut self, value: u64) -> Check {
        self.information = u32::try_from(value).ok();
        self
    }

    fn illegal(asc: u8, ascq: u8, field: Option<FieldPointer>) -> Check {
        Check { field, ..Check::new(KEY_ILLEGAL_REQUEST, asc, ascq) }
    }

    /// INVALID COMMAND OPERATION CODE (20h/00h).
    pub(crate) fn invalid_opcode() -> Check {
        Check::illegal(0x20, 0x00, Some(FieldPointer { in_cdb: true, byte: 0, bit: Some(7) }))
    }

    /// INVALID FIELD IN CDB (24h/00h) pointing at `byte` (and `bit`) of the CDB.
    pub(crate) fn invalid_cdb(byte: u16, bit: Option<u8>) -> Check {
        Check::illegal(0x24, 0x00, Some(FieldPointer { in_cdb: true, byte, bit }))
    }

    /// INVALID FIELD IN PARAMETER LIST (26h/00h) pointing at `byte` (and `bit`) of the data.
    pub(crate) fn invalid_param(byte: u16, bit: Option<u8>) -> Check {
        Check::illegal(0x26, 0x00, Some(FieldPointer { in_cdb: false, byte, bit }))
    }

    /// PARAMETER LIST LENGTH ERROR (1Ah/00h).
    pub(crate) fn param_list_length() -> Check {
        Check::illegal(0x1A, 0x00, None)
    }

    /// LOGICAL BLOCK ADDRESS OUT OF RANGE (21h/00h).
    pub(crate) fn lba_out_of_range() -> Check {
        Check::of_kind(ErrorKind::OutOfRange)
    }

    /// WRITE PROTECTED (27h/00h) for a read-only volume, through the table.
    pub(crate) fn write_protected() -> Check {
        Check::of_kind(ErrorKind::ReadOnly)
    }

    /// SAVING PARAMETERS NOT SUPPORTED (39h/00h).
    pub(crate) fn saving_not_supported() -> Check {
        Check::illegal(0x39, 0x00, None)
    }

    /// INVALID FIELD IN COMMAND INFORMATION UNIT (0Eh/03h): the Data-Out sent does not match
    /// what the CDB transfers.
    pub(crate) fn data_out_mismatch() -> Check {
        Check::illegal(0x0E, 0x03, None)
    }

    /// INSUFFICIENT REGISTRATION RESOURCES (55h/04h).
    pub(crate) fn registrations_full() -> Check {
        Check::illegal(0x55, 0x04, None)
    }

    /// INVALID RELEASE OF PERSISTENT RESERVATION (26h/04h).
    pub(crate) fn invalid_release() -> Check {
        Check::illegal(0x26, 0x04, None)
    }

    /// A unit attention with its ASC/ASCQ.
    pub(crate) fn unit_attention(asc: u8, ascq: u8) -> Check {
        Check::new(KEY_UNIT_ATTENTION, asc, ascq)
    }

    /// The fixed-format sense data.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let sks = self.field.map(|f| {
            let mut b0 = 0x80; // SKSV
            if f.in_cdb {
                b0 |= 0x40; // C/D
            }
            if let Some(bit) = f.bit {
                b0 |= 0x08 | (bit & 0x07); // BPV and BIT POINTER
            }
            let [hi, lo] = f.byte.to_be_bytes();
            [b0, hi, lo]
        });
        fixed_sense(self.key, self.asc, self.ascq, self.information, sks)
    }
}

/// Fixed-format sense data (SPC-5 4.4.3), the one encoder: RESPONSE CODE 70h (F0h with VALID
/// when `information` is given), the sense key, INFORMATION in bytes 3..7, ADDITIONAL SENSE
/// LENGTH 10, ASC/ASCQ in bytes 12/13, and the sense-key specific bytes 15..18 (SKSV first).
pub fn fixed_sense(key: u8, asc: u8, ascq: u8, information: Option<u32>, sks: Option<[u8; 3]>) -> Vec<u8> {
    let mut s = vec![0u8; FIXED_SENSE_BYTES];
    s[0] = if information.is_some() { 0xF0 } else { 0x70 };
    s[2] = key & 0x0F;
    s[3..7].copy_from_slice(&information.unwrap_or(0).to_be_bytes());
    s[7] = 10;
    s[12] = asc;
    s[13] = ascq;
    if let Some(sks) = sks {
        s[15..18].copy_from_slice(&sks);
    }
    s
}
