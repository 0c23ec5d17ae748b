//! The frames of the slice protocol (docs/design/cluster.md §3): pure encoders and parsers.
//!
//! Every number is little-endian. A request is a 48-byte header, followed by the payload for a
//! WRITE; a reply is a 32-byte header, followed by the payload for a READ or an INFO. Both
//! headers end with the CRC32C of the bytes before it, so a torn or corrupted header is
//! refused instead of read as another request.

use stria_dev::BLOCK_BYTES;

/// Bytes of a request header.
pub const REQUEST_BYTES: usize = 48;
/// Bytes of a reply header.
pub const REPLY_BYTES: usize = 32;
/// The most bytes one READ, WRITE or DISCARD may carry (or cover, for DISCARD).
pub const MAX_IO_BYTES: u32 = 1 << 20;
/// Bytes of the INFO reply payload: the slice's size and epoch.
pub const INFO_BYTES: u32 = 16;

const REQUEST_MAGIC: [u8; 4] = *b"STRQ";
const REPLY_MAGIC: [u8; 4] = *b"STRP";
const FLAG_FUA: u8 = 1;

/// What a request asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Read `len` bytes at `offset`.
    Read,
    /// Write the `len` payload bytes that follow the header at `offset` (durable at once with FUA).
    Write,
    /// Make every write completed before it durable.
    Flush,
    /// The range is no longer needed.
    Discard,
    /// Raise the slice's epoch to the request's epoch, persisted, once no request of a lower
    /// epoch is running.
    Fence,
    /// The slice's size and epoch.
    Info,
}

impl Op {
    fn code(self) -> u8 {
        match self {
            Op::Read => 1,
            Op::Write => 2,
            Op::Flush => 3,
            Op::Discard => 4,
            Op::Fence => 5,
            Op::Info => 6,
        }
    }

    fn from_code(code: u8) -> Option<Op> {
        Some(match code {
            1 => Op::Read,
            2 => Op::Write,
            3 => Op::Flush,
            4 => Op::Discard,
            5 => Op::Fence,
            6 => Op::Info,
            _ => return None,
        })
    }

    /// True for the requests that move data and are admitted only at the slice's own epoch.
    pub fn is_io(self) -> bool {
        matches!(self, Op::Read | Op::Write | Op::Flush | Op::Discard)
    }
}

/// One request header, parsed and checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub op: Op,
    /// With `Op::Write`: durable when the reply comes.
    pub fua: bool,
    /// Chosen by the client, echoed in the reply.
    pub tag: u64,
    /// The sender's fencing epoch.
    pub epoch: u64,
    pub slice: u32,
    /// Byte offset in the slice (a multiple of 4096).
    pub offset: u64,
    /// Byte length (a multiple of 4096, at most [`MAX_IO_BYTES`]); 0 for FLUSH, FENCE and INFO.
    pub len: u32,
}

/// Why a request header was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("bad magic {0:02x?}")]
    Magic([u8; 4]),
    #[error("header checksum {found:#010x}, expected {expected:#010x}")]
    Checksum { found: u32, expected: u32 },
    #[error("unknown operation {0}")]
    Op(u8),
    #[error("reserved bits set (flags {flags:#x})")]
    Reserved { flags: u8 },
    #[error("length {len} is not a multiple of 4096, over {MAX_IO_BYTES}, or wrong for {op:?}")]
    Length { op: Op, len: u32 },
    #[error("offset {0} is not a multiple of 4096")]
    Offset(u64),
    #[error("unknown status {0}")]
    Status(u32),
}

fn crc(bytes: &[u8]) -> u32 {
    stria_dev::crc::crc32c(bytes)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

impl Request {
    /// The header's bytes.
    pub fn encode(&self) -> [u8; REQUEST_BYTES] {
        let mut b = [0u8; REQUEST_BYTES];
        b[0..4].copy_from_slice(&REQUEST_MAGIC);
        b[4] = self.op.code();
        b[5] = if self.fua { FLAG_FUA } else { 0 };
        b[8..16].copy_from_slice(&self.tag.to_le_bytes());
        b[16..24].copy_from_slice(&self.epoch.to_le_bytes());
        b[24..28].copy_from_slice(&self.slice.to_le_bytes());
        b[32..40].copy_from_slice(&self.offset.to_le_bytes());
        b[40..44].copy_from_slice(&self.len.to_le_bytes());
        let sum = crc(&b[..44]);
        b[44..48].copy_from_slice(&sum.to_le_bytes());
        b
    }

    /// Parses and checks a header. An accepted request has an aligned offset, an aligned length
    /// within [`MAX_IO_BYTES`] that is non-zero exactly for READ, WRITE and DISCARD, and FUA only
    /// on a WRITE.
    pub fn parse(b: &[u8; REQUEST_BYTES]) -> Result<Request, FrameError> {
        let magic = [b[0], b[1], b[2], b[3]];
        if magic != REQUEST_MAGIC {
            return Err(FrameError::Magic(magic));
        }
        let expected = crc(&b[..44]);
        let found = u32_at(b, 44);
        if found != expected {
            return Err(FrameError::Checksum { found, expected });
        }
        let op = Op::from_code(b[4]).ok_or(FrameError::Op(b[4]))?;
        let flags = b[5];
        let fua_allowed = if op == Op::Write { FLAG_FUA } else { 0 };
        if flags & !fua_allowed != 0 || b[6..8] != [0, 0] || b[28..32] != [0; 4] {
            return Err(FrameError::Reserved { flags });
        }
        let offset = u64_at(b, 32);
        let len = u32_at(b, 40);
        let wants_len = matches!(op, Op::Read | Op::Write | Op::Discard);
        if (len == 0) == wants_len || !u64::from(len).is_multiple_of(BLOCK_BYTES) || len > MAX_IO_BYTES {
            return Err(FrameError::Length { op, len });
        }
        if !offset.is_multiple_of(BLOCK_BYTES) {
            return Err(FrameError::Offset(offset));
        }
        Ok(Request {
            op,
            fua: flags & FLAG_FUA != 0,
            tag: u64_at(b, 8),
            epoch: u64_at(b, 16),
            slice: u32_at(b, 24),
            offset,
            len,
        })
    }

    /// Bytes of payload that follow this header on the wire.
    pub fn payload_bytes(&self) -> usize {
        if self.op == Op::Write { self.len as usize } else { 0 }
    }
}

/// How a request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Ok,
    /// The slice's drive failed the request.
    Io,
    /// The request's epoch is below the slice's: a newer owner fenced it.
    Fenced,
    /// The request's epoch is above the slice's persisted epoch (FENCE first), or another
    /// connection fenced the slice since this one did.
    Unfenced,
    /// The range reaches past the end of the slice.
    OutOfRange,
    /// A malformed request; the server closes the connection after this reply.
    Invalid,
    /// No slice with that id on this server.
    NoSuchSlice,
    /// The host filesystem under the slice is full.
    NoSpace,
}

impl Status {
    fn code(self) -> u32 {
        match self {
            Status::Ok => 0,
            Status::Io => 1,
            Status::Fenced => 2,
            Status::Unfenced => 3,
            Status::OutOfRange => 4,
            Status::Invalid => 5,
            Status::NoSuchSlice => 6,
            Status::NoSpace => 7,
        }
    }

    fn from_code(code: u32) -> Option<Status> {
        Some(match code {
            0 => Status::Ok,
            1 => Status::Io,
            2 => Status::Fenced,
            3 => Status::Unfenced,
            4 => Status::OutOfRange,
            5 => Status::Invalid,
            6 => Status::NoSuchSlice,
            7 => Status::NoSpace,
            _ => return None,
        })
    }
}

/// One reply header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reply {
    pub status: Status,
    pub tag: u64,
    /// The slice's persisted epoch when the reply was made (0 where there is no slice).
    pub epoch: u64,
    /// Bytes of payload that follow (READ data, INFO).
    pub len: u32,
}

impl Reply {
    /// The header's bytes.
    pub fn encode(&self) -> [u8; REPLY_BYTES] {
        let mut b = [0u8; REPLY_BYTES];
        b[0..4].copy_from_slice(&REPLY_MAGIC);
        b[4..8].copy_from_slice(&self.status.code().to_le_bytes());
        b[8..16].copy_from_slice(&self.tag.to_le_bytes());
        b[16..24].copy_from_slice(&self.epoch.to_le_bytes());
        b[24..28].copy_from_slice(&self.len.to_le_bytes());
        let sum = crc(&b[..28]);
        b[28..32].copy_from_slice(&sum.to_le_bytes());
        b
    }

    /// Parses and checks a reply header (the payload length is bounded by [`MAX_IO_BYTES`]).
    pub fn parse(b: &[u8; REPLY_BYTES]) -> Result<Reply, FrameError> {
        let magic = [b[0], b[1], b[2], b[3]];
        if magic != REPLY_MAGIC {
            return Err(FrameError::Magic(magic));
        }
        let expected = crc(&b[..28]);
        let found = u32_at(b, 28);
        if found != expected {
            return Err(FrameError::Checksum { found, expected });
        }
        let code = u32_at(b, 4);
        let status = Status::from_code(code).ok_or(FrameError::Status(code))?;
        let len = u32_at(b, 24);
        if len > MAX_IO_BYTES {
            return Err(FrameError::Length { op: Op::Read, len });
        }
        Ok(Reply { status, tag: u64_at(b, 8), epoch: u64_at(b, 16), len })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_round_trips_and_any_flipped_bit_is_refused() {
        let r = Request { op: Op::Write, fua: true, tag: 7, epoch: 9, slice: 3, offset: 8192, len: 4096 };
        let b = r.encode();
        assert_eq!(Request::parse(&b), Ok(r));
        for bit in 0..REQUEST_BYTES * 8 {
            let mut c = b;
            c[bit / 8] ^= 1 << (bit % 8);
            assert!(Request::parse(&c).is_err(), "bit {bit} flipped was accepted");
        }
    }

    #[test]
    fn lengths_and_flags_are_checked_per_operation() {
        let ok = |op, fua, len, offset| Request { op, fua, tag: 1, epoch: 1, slice: 0, offset, len };
        let parse = |r: Request| Request::parse(&r.encode());
        assert!(parse(ok(Op::Read, false, 4096, 0)).is_ok());
        assert!(parse(ok(Op::Read, true, 4096, 0)).is_err(), "FUA on a read");
        assert!(parse(ok(Op::Read, false, 0, 0)).is_err(), "empty read");
        assert!(parse(ok(Op::Read, false, 512, 0)).is_err(), "misaligned length");
        assert!(parse(ok(Op::Read, false, 4096, 512)).is_err(), "misaligned offset");
        assert!(parse(ok(Op::Write, false, MAX_IO_BYTES + 4096, 0)).is_err(), "too long");
        assert!(parse(ok(Op::Write, false, MAX_IO_BYTES, 0)).is_ok());
        assert!(parse(ok(Op::Flush, false, 4096, 0)).is_err(), "flush with a length");
        assert!(parse(ok(Op::Fence, false, 0, 0)).is_ok());
        assert!(parse(ok(Op::Discard, false, 0, 0)).is_err(), "empty discard");
    }

    #[test]
    fn a_reply_round_trips() {
        let r = Reply { status: Status::Fenced, tag: u64::MAX, epoch: 12, len: 0 };
        assert_eq!(Reply::parse(&r.encode()), Ok(r));
        let mut b = r.encode();
        b[4] = 99;
        assert!(Reply::parse(&b).is_err());
    }
}
