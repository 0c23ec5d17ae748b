//! The one mapping per protocol of [`ErrorKind`]: what an NBD client ([`nbd_errno`]), an HTTP
//! client ([`http_status`]) and a SCSI initiator ([`scsi_sense`]) are told. A front end chooses
//! its answer by the kind of the error ([`stria_volume::VolumeError::kind`]), never by its text.
//!
//! The tables agree on what a client should do: a full thin volume and writes suspended for a
//! full host filesystem are "no space" everywhere (NBD `ENOSPC` and SCSI SPACE ALLOCATION FAILED
//! WRITE PROTECT make qemu's `werror=enospc`, Linux and VMware pause or report `ENOSPC` instead of
//! a media error), a snapshot is write-protected, and lost data is a medium error.

use stria_nbd::Errno;
use stria_volume::ErrorKind;

/// The NBD error value of a kind.
pub fn nbd_errno(kind: ErrorKind) -> Errno {
    match kind {
        ErrorKind::OutOfRange | ErrorKind::InvalidInput => Errno::Inval,
        ErrorKind::NotCheap => Errno::NotSup,
        ErrorKind::Closed => Errno::Shutdown,
        ErrorKind::ReadOnly => Errno::Perm,
        ErrorKind::NoSpace | ErrorKind::Suspended => Errno::NoSpc,
        // NBD has no compare and write: a miscompare cannot reach an NBD client. Were one to, it
        // would be an I/O error like every other kind NBD has no value for.
        ErrorKind::Miscompare
        | ErrorKind::Unrecoverable
        | ErrorKind::Io
        | ErrorKind::NotFound
        | ErrorKind::Conflict
        | ErrorKind::Unavailable => Errno::Io,
    }
}

/// The HTTP status code of a kind: 400 for a malformed request, 404 for something that does not
/// exist, 409 for a request that conflicts with the state of things (a guard rail, a snapshot
/// written to, a compare and write that found other data), 503 while writes are suspended or the pool cannot commit, 507 when there is no
/// space, 500 for a device or data failure.
pub fn http_status(kind: ErrorKind) -> u16 {
    match kind {
        ErrorKind::InvalidInput | ErrorKind::OutOfRange => 400,
        ErrorKind::NotFound => 404,
        ErrorKind::Conflict | ErrorKind::ReadOnly | ErrorKind::NotCheap | ErrorKind::Miscompare => 409,
        ErrorKind::NoSpace => 507,
        ErrorKind::Suspended | ErrorKind::Closed | ErrorKind::Unavailable => 503,
        ErrorKind::Unrecoverable | ErrorKind::Io => 500,
    }
}

/// A SCSI sense key (SPC-5's table of sense keys: fixed and descriptor format sense data carry
/// it in four bits). The keys stria answers with, and `Miscompare` for COMPARE
/// AND WRITE.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum SenseKey {
    /// 2h: the logical unit cannot be accessed now; operator action may be needed.
    NotReady = 0x2,
    /// 3h: the command ended on an unrecovered error of the medium (the data).
    MediumError = 0x3,
    /// 4h: a failure of the device server that is not the medium's.
    HardwareError = 0x4,
    /// 5h: the command, its parameters or the addressed logical unit are not acceptable.
    IllegalRequest = 0x5,
    /// 7h: a write refused by the logical unit's protection.
    DataProtect = 0x7,
    /// Eh: the source data did not match the data read from the medium (COMPARE AND WRITE).
    Miscompare = 0xE,
}

/// SCSI sense data for a CHECK CONDITION: the sense key and the additional sense code and
/// qualifier (SPC-5 sense data; the codes' names are those of T10's `asc-num.txt`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Sense {
    /// What class of failure.
    pub key: SenseKey,
    /// The additional sense code (ASC).
    pub asc: u8,
    /// Its qualifier (ASCQ).
    pub ascq: u8,
}

impl Sense {
    /// The sense key's code (4 bits).
    pub fn key_code(self) -> u8 {
        self.key as u8
    }
}

/// The SCSI sense data of a kind. Values from SPC-5 (sense keys, and the ASC/ASCQ assignments
/// of its annex, T10 `asc-num.txt`) and SBC-4 (thin provisioning); what an initiator does with
/// each was checked against Linux's `scsi_check_sense` and `scsi_io_completion_action`.
///
/// | kind | key | ASC/ASCQ | name |
/// |---|---|---|---|
/// | `InvalidInput`, `NotCheap` | ILLEGAL REQUEST | 24h/00h | INVALID FIELD IN CDB |
/// | `NotFound` | ILLEGAL REQUEST | 25h/00h | LOGICAL UNIT NOT SUPPORTED |
/// | `Conflict` | ILLEGAL REQUEST | 2Ch/00h | COMMAND SEQUENCE ERROR |
/// | `OutOfRange` | ILLEGAL REQUEST | 21h/00h | LOGICAL BLOCK ADDRESS OUT OF RANGE |
/// | `NoSpace`, `Suspended` | DATA PROTECT | 27h/07h | SPACE ALLOCATION FAILED WRITE PROTECT |
/// | `ReadOnly` | DATA PROTECT | 27h/00h | WRITE PROTECTED |
/// | `Unrecoverable` | MEDIUM ERROR | 11h/00h | UNRECOVERED READ ERROR |
/// | `Io` | HARDWARE ERROR | 44h/00h | INTERNAL TARGET FAILURE |
/// | `Closed` | NOT READY | 04h/00h | LOGICAL UNIT NOT READY, CAUSE NOT REPORTABLE |
/// | `Unavailable` | NOT READY | 04h/03h | LOGICAL UNIT NOT READY, MANUAL INTERVENTION REQUIRED |
/// | `Miscompare` | MISCOMPARE | 1Dh/00h | MISCOMPARE DURING VERIFY OPERATION |
///
/// Why these: 27h/07h is SBC-4's answer of a thin-provisioned logical unit out of space, which
/// Linux turns into `ENOSPC` and VMware into a paused VM, as NBD's `ENOSPC` does for qemu (a
/// suspended pool is out of space too, until an operator frees some). A conflict (a guard rail,
/// a rebuild in progress) is not promised to clear by itself, so it is an illegal request that
/// initiators fail at once, not a NOT READY that Linux retries for 04h/01h, 04h/04h-09h. A closed
/// volume or pool, and a pool that needs a restart, are NOT READY with qualifiers that Linux does
/// not retry. A miscompare of COMPARE AND WRITE is what SBC-4 prescribes for it; the target puts
/// the offset of the first differing byte ([`stria_volume::VolumeError::Miscompare`]'s
/// `miscompare_offset_bytes`) in the sense data's INFORMATION field, with VALID set.
pub fn scsi_sense(kind: ErrorKind) -> Sense {
    let sense = |key, asc, ascq| Sense { key, asc, ascq };
    match kind {
        ErrorKind::InvalidInput | ErrorKind::NotCheap => sense(SenseKey::IllegalRequest, 0x24, 0x00),
        ErrorKind::NotFound => sense(SenseKey::IllegalRequest, 0x25, 0x00),
        ErrorKind::Conflict => sense(SenseKey::IllegalRequest, 0x2C, 0x00),
        ErrorKind::OutOfRange => sense(SenseKey::IllegalRequest, 0x21, 0x00),
        ErrorKind::NoSpace | ErrorKind::Suspended => sense(SenseKey::DataProtect, 0x27, 0x07),
        ErrorKind::ReadOnly => sense(SenseKey::DataProtect, 0x27, 0x00),
        ErrorKind::Unrecoverable => sense(SenseKey::MediumError, 0x11, 0x00),
        ErrorKind::Io => sense(SenseKey::HardwareError, 0x44, 0x00),
        ErrorKind::Closed => sense(SenseKey::NotReady, 0x04, 0x00),
        ErrorKind::Unavailable => sense(SenseKey::NotReady, 0x04, 0x03),
        ErrorKind::Miscompare => sense(SenseKey::Miscompare, 0x1D, 0x00),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use ErrorKind as K;

    #[test]
    fn the_nbd_table() {
        let table = [
            (K::InvalidInput, Errno::Inval),
            (K::NotFound, Errno::Io),
            (K::Conflict, Errno::Io),
            (K::OutOfRange, Errno::Inval),
            (K::NoSpace, Errno::NoSpc),
            (K::ReadOnly, Errno::Perm),
            (K::Unrecoverable, Errno::Io),
            (K::Io, Errno::Io),
            (K::Suspended, Errno::NoSpc),
            (K::Closed, Errno::Shutdown),
            (K::NotCheap, Errno::NotSup),
            (K::Unavailable, Errno::Io),
            (K::Miscompare, Errno::Io),
        ];
        assert_eq!(table.map(|(k, _)| k), ErrorKind::ALL, "one row per kind, in order");
        for (kind, errno) in table {
            assert_eq!(nbd_errno(kind), errno, "{kind:?}");
        }
    }

    #[test]
    fn the_http_table() {
        let table = [
            (K::InvalidInput, 400),
            (K::NotFound, 404),
            (K::Conflict, 409),
            (K::OutOfRange, 400),
            (K::NoSpace, 507),
            (K::ReadOnly, 409),
            (K::Unrecoverable, 500),
            (K::Io, 500),
            (K::Suspended, 503),
            (K::Closed, 503),
            (K::NotCheap, 409),
            (K::Unavailable, 503),
            (K::Miscompare, 409),
        ];
        assert_eq!(table.map(|(k, _)| k), ErrorKind::ALL, "one row per kind, in order");
        for (kind, status) in table {
            assert_eq!(http_status(kind), status, "{kind:?}");
            assert!((400..600).contains(&status), "{kind:?}: an error status");
        }
    }

    #[test]
    fn the_scsi_table() {
        use SenseKey::*;
        let table = [
            (K::InvalidInput, IllegalRequest, 0x24, 0x00),
            (K::NotFound, IllegalRequest, 0x25, 0x00),
            (K::Conflict, IllegalRequest, 0x2C, 0x00),
            (K::OutOfRange, IllegalRequest, 0x21, 0x00),
            (K::NoSpace, DataProtect, 0x27, 0x07),
            (K::ReadOnly, DataProtect, 0x27, 0x00),
            (K::Unrecoverable, MediumError, 0x11, 0x00),
            (K::Io, HardwareError, 0x44, 0x00),
            (K::Suspended, DataProtect, 0x27, 0x07),
            (K::Closed, NotReady, 0x04, 0x00),
            (K::NotCheap, IllegalRequest, 0x24, 0x00),
            (K::Unavailable, NotReady, 0x04, 0x03),
            (K::Miscompare, Miscompare, 0x1D, 0x00),
        ];
        assert_eq!(table.map(|(k, ..)| k), ErrorKind::ALL, "one row per kind, in order");
        for (kind, key, asc, ascq) in table {
            assert_eq!(scsi_sense(kind), Sense { key, asc, ascq }, "{kind:?}");
        }
        // The sense key codes of SPC-5.
        let codes = [
            (NotReady, 2),
            (MediumError, 3),
            (HardwareError, 4),
            (IllegalRequest, 5),
            (DataProtect, 7),
            (Miscompare, 0xE),
        ];
        for (key, code) in codes {
            assert_eq!(Sense { key, asc: 0, ascq: 0 }.key_code(), code, "{key:?}");
        }
    }

    #[test]
    fn the_protocols_agree_on_space_and_write_protection() {
        for kind in [K::NoSpace, K::Suspended] {
            assert_eq!(nbd_errno(kind), Errno::NoSpc);
            assert_eq!(scsi_sense(kind), Sense { key: SenseKey::DataProtect, asc: 0x27, ascq: 0x07 });
        }
        assert_eq!(
            (nbd_errno(K::ReadOnly), scsi_sense(K::ReadOnly).key),
            (Errno::Perm, SenseKey::DataProtect)
        );
    }
}
