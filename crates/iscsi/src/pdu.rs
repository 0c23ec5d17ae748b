//! iSCSI PDUs (RFC 7143 §11): the 48-byte Basic Header Segment with its fields by offset, and
//! reading and writing whole PDUs (header, AHS, digests, padded data) with bounds checked before
//! anything is read into memory. docs/design/iscsi.md §2 has the byte tables.

use tokio::io::{AsyncRead, AsyncReadExt};

/// Length of the Basic Header Segment.
pub const BHS_BYTES: usize = 48;

/// Opcodes an initiator sends.
pub mod op {
    /// NOP-Out.
    pub const NOP_OUT: u8 = 0x00;
    /// SCSI Command.
    pub const SCSI_COMMAND: u8 = 0x01;
    /// Task Management Function Request.
    pub const TASK_MGMT: u8 = 0x02;
    /// Login Request.
    pub const LOGIN: u8 = 0x03;
    /// Text Request.
    pub const TEXT: u8 = 0x04;
    /// SCSI Data-Out.
    pub const DATA_OUT: u8 = 0x05;
    /// Logout Request.
    pub const LOGOUT: u8 = 0x06;
    /// SNACK Request.
    pub const SNACK: u8 = 0x10;
    /// NOP-In.
    pub const NOP_IN: u8 = 0x20;
    /// SCSI Response.
    pub const SCSI_RESPONSE: u8 = 0x21;
    /// Task Management Function Response.
    pub const TASK_MGMT_RESPONSE: u8 = 0x22;
    /// Login Response.
    pub const LOGIN_RESPONSE: u8 = 0x23;
    /// Text Response.
    pub const TEXT_RESPONSE: u8 = 0x24;
    /// SCSI Data-In.
    pub const DATA_IN: u8 = 0x25;
    /// Logout Response.
    pub const LOGOUT_RESPONSE: u8 = 0x26;
    /// Ready To Transfer.
    pub const R2T: u8 = 0x31;
    /// Reject.
    pub const REJECT: u8 = 0x3F;
}

/// Reject reasons (RFC 7143 §11.17.1).
pub mod reject {
    /// Data (payload) digest error.
    pub const DATA_DIGEST: u8 = 0x02;
    /// Protocol error.
    pub const PROTOCOL_ERROR: u8 = 0x04;
    /// Command not supported.
    pub const NOT_SUPPORTED: u8 = 0x05;
    /// Immediate command rejected: too many immediate commands.
    pub const IMMEDIATE_REJECTED: u8 = 0x06;
    /// Invalid PDU field.
    pub const INVALID_FIELD: u8 = 0x09;
    /// Out of resources.
    pub const OUT_OF_RESOURCES: u8 = 0x0A;
}

/// The tag that means "none" (Initiator and Target Transfer Tags).
pub const NO_TAG: u32 = 0xFFFF_FFFF;

/// A Basic Header Segment.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Bhs(pub [u8; BHS_BYTES]);

impl std::fmt::Debug for Bhs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Bhs(op {:#04x}, itt {:#x}, dsl {})", self.opcode(), self.itt(), self.data_len())
    }
}

impl Bhs {
    /// A header of `opcode` with every other field zero.
    pub fn new(opcode: u8) -> Bhs {
        let mut b = [0; BHS_BYTES];
        b[0] = opcode & 0x3F;
        Bhs(b)
    }

    /// The opcode (6 bits).
    pub fn opcode(&self) -> u8 {
        self.0[0] & 0x3F
    }

    /// The immediate bit.
    pub fn immediate(&self) -> bool {
        self.0[0] & 0x40 != 0
    }

    /// Byte 1: the final bit and the opcode's flags.
    pub fn flags(&self) -> u8 {
        self.0[1]
    }

    /// The final bit (byte 1, bit 7).
    pub fn final_bit(&self) -> bool {
        self.0[1] & 0x80 != 0
    }

    /// TotalAHSLength in bytes.
    pub fn ahs_len(&self) -> usize {
        usize::from(self.0[4]) * 4
    }

    /// DataSegmentLength in bytes (without padding).
    pub fn data_len(&self) -> usize {
        usize::from(self.0[5]) << 16 | usize::from(self.0[6]) << 8 | usize::from(self.0[7])
    }

    /// Sets DataSegmentLength (at most 2^24 - 1: callers split larger data).
    pub fn set_data_len(&mut self, len: usize) {
        debug_assert!(len < 1 << 24);
        let b = u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes();
        self.0[5..8].copy_from_slice(&b[1..4]);
    }

    /// The 8 bytes at 8..16 (LUN, or ISID and TSIH).
    pub fn lun(&self) -> u64 {
        self.u64_at(8)
    }

    /// The Initiator Task Tag.
    pub fn itt(&self) -> u32 {
        self.u32_at(16)
    }

    /// The big-endian u32 at `at`.
    pub fn u32_at(&self, at: usize) -> u32 {
        u32::from_be_bytes([self.0[at], self.0[at + 1], self.0[at + 2], self.0[at + 3]])
    }

    /// The big-endian u16 at `at`.
    pub fn u16_at(&self, at: usize) -> u16 {
        u16::from_be_bytes([self.0[at], self.0[at + 1]])
    }

    /// The big-endian u64 at `at`.
    pub fn u64_at(&self, at: usize) -> u64 {
        let mut b = [0; 8];
        b.copy_from_slice(&self.0[at..at + 8]);
        u64::from_be_bytes(b)
    }

    /// Sets the big-endian u32 at `at`.
    pub fn set_u32(&mut self, at: usize, v: u32) -> &mut Bhs {
        self.0[at..at + 4].copy_from_slice(&v.to_be_bytes());
        self
    }

    /// Sets the big-endian u16 at `at`.
    pub fn set_u16(&mut self, at: usize, v: u16) -> &mut Bhs {
        self.0[at..at + 2].copy_from_slice(&v.to_be_bytes());
        self
    }

    /// Sets the big-endian u64 at `at`.
    pub fn set_u64(&mut self, at: usize, v: u64) -> &mut Bhs {
        self.0[at..at + 8].copy_from_slice(&v.to_be_bytes());
        self
    }
}

/// Why a PDU could not be read.
#[derive(Debug, thiserror::Error)]
pub enum PduError {
    /// The connection broke or closed.
    #[error("connection: {0}")]
    Io(#[from] std::io::Error),
    /// The data segment is longer than this side accepts.
    #[error("data segment of {len} bytes is longer than the {max} negotiated")]
    TooLong {
        /// DataSegmentLength.
        len: usize,
        /// What this side accepts.
        max: usize,
    },
    /// The header digest did not match: the PDU's lengths cannot be trusted.
    #[error("header digest mismatch")]
    HeaderDigest,
}

/// One PDU as read: the header, the AHS (raw), and the data segment without padding.
#[derive(Debug)]
pub struct Pdu {
    /// The Basic Header Segment.
    pub bhs: Bhs,
    /// Additional Header Segments, raw.
    pub ahs: Vec<u8>,
    /// The data segment, without padding.
    pub data: Vec<u8>,
    /// False when a data digest was negotiated and did not match (the caller decides).
    pub data_digest_ok: bool,
}

/// The digests negotiated on a connection.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Digests {
    /// CRC32C over header and AHS.
    pub header: bool,
    /// CRC32C over the padded data segment.
    pub data: bool,
}

/// Padding after `len` bytes of data, to a multiple of 4.
pub fn pad(len: usize) -> usize {
    (4 - len % 4) % 4
}

/// Reads one PDU. `max_data` bounds the data segment; it is checked (as is the header digest)
/// before the data is read into memory.
pub async fn read_pdu<R: AsyncRead + Unpin>(
    r: &mut R,
    digests: Digests,
    max_data: usize,
) -> Result<Pdu, PduError> {
    let mut bhs = Bhs([0; BHS_BYTES]);
    r.read_exact(&mut bhs.0).await?;
    let mut ahs = vec![0; bhs.ahs_len()];
    r.read_exact(&mut ahs).await?;
    if digests.header {
        let mut d = [0; 4];
        r.read_exact(&mut d).await?;
        let crc = crc32c::crc32c_append(crc32c::crc32c(&bhs.0), &ahs);
        if u32::from_le_bytes(d) != crc {
            return Err(PduError::HeaderDigest);
        }
    }
    let len = bhs.data_len();
    if len > max_data {
        return Err(PduError::TooLong { len, max: max_data });
    }
    let mut data = vec![0; len + pad(len)];
    r.read_exact(&mut data).await?;
    let mut data_digest_ok = true;
    if digests.data && len > 0 {
        let mut d = [0; 4];
        r.read_exact(&mut d).await?;
        data_digest_ok = u32::from_le_bytes(d) == crc32c::crc32c(&data);
    }
    data.truncate(len);
    Ok(Pdu { bhs, ahs, data, data_digest_ok })
}

/// Appends one PDU (header, digests, data padded) to `out`.
pub fn encode_pdu(out: &mut Vec<u8>, mut bhs: Bhs, data: &[u8], digests: Digests) {
    bhs.set_data_len(data.len());
    out.extend_from_slice(&bhs.0);
    if digests.header {
        out.extend_from_slice(&crc32c::crc32c(&bhs.0).to_le_bytes());
    }
    if !data.is_empty() {
        let start = out.len();
        out.extend_from_slice(data);
        out.extend_from_slice(&[0; 3][..pad(data.len())]);
        if digests.data {
            let crc = crc32c::crc32c(&out[start..]);
            out.extend_from_slice(&crc.to_le_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_pdu_round_trips_with_and_without_digests() {
        for digests in [Digests::default(), Digests { header: true, data: true }] {
            let mut bhs = Bhs::new(op::SCSI_COMMAND);
            bhs.set_u32(16, 0xABCD).set_u64(8, 1 << 48);
            let mut wire = Vec::new();
            encode_pdu(&mut wire, bhs, b"hello", digests);
            let extra = if digests.header { 4 } else { 0 } + if digests.data { 4 } else { 0 };
            assert_eq!(wire.len(), 48 + 8 + extra, "padded to 4");
            let pdu = read_pdu(&mut &wire[..], digests, 1024).await.expect("read");
            assert_eq!((pdu.bhs.opcode(), pdu.bhs.itt(), pdu.bhs.lun()), (op::SCSI_COMMAND, 0xABCD, 1 << 48));
            assert_eq!(pdu.data, b"hello");
            assert!(pdu.data_digest_ok);
        }
    }

    #[tokio::test]
    async fn bad_digests_and_long_segments_are_caught_before_the_data_is_read() {
        let digests = Digests { header: true, data: true };
        let mut wire = Vec::new();
        encode_pdu(&mut wire, Bhs::new(op::NOP_OUT), b"ping", digests);
        let mut bad_header = wire.clone();
        bad_header[49] ^= 1;
        assert!(matches!(read_pdu(&mut &bad_header[..], digests, 1024).await, Err(PduError::HeaderDigest)));
        let mut bad_data = wire.clone();
        bad_data[53] ^= 1;
        let pdu = read_pdu(&mut &bad_data[..], digests, 1024).await.expect("read");
        assert!(!pdu.data_digest_ok);
        // A 16 MiB segment announced on a 52-byte stream: refused from the header alone.
        let mut long = Bhs::new(op::NOP_OUT);
        long.set_data_len((1 << 24) - 1);
        let mut wire = Vec::new();
        wire.extend_from_slice(&long.0);
        let e = read_pdu(&mut &wire[..], Digests::default(), 8192).await.expect_err("too long");
        assert!(matches!(e, PduError::TooLong { len: 16_777_215, max: 8192 }), "{e}");
    }
}
