//! Numbers of the NBD protocol (NetworkBlockDevice `doc/proto.md`): magics, option and reply
//! codes, command types and flags, error values. Nothing here has behaviour.

/// `NBDMAGIC`, the first 8 bytes the server sends.
pub const NBD_MAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`: the newstyle handshake magic, also the prefix of every client option.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Prefix of every option reply.
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// Prefix of every transmission request.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// Prefix of a simple reply.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// Prefix of a structured reply chunk.
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

/// Handshake flag: the server speaks fixed newstyle.
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
/// Handshake flag: the server can omit the 124 zero bytes after `NBD_OPT_EXPORT_NAME`.
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
/// Client flag: the client speaks fixed newstyle.
pub const CLIENT_FIXED_NEWSTYLE: u32 = 1 << 0;
/// Client flag: omit the 124 zero bytes.
pub const CLIENT_NO_ZEROES: u32 = 1 << 1;

/// Transmission flags (16 bits, sent with the export size).
pub mod tflag {
    /// Always set.
    pub const HAS_FLAGS: u16 = 1 << 0;
    /// The export refuses writes.
    pub const READ_ONLY: u16 = 1 << 1;
    /// `NBD_CMD_FLUSH` is understood.
    pub const SEND_FLUSH: u16 = 1 << 2;
    /// `NBD_CMD_FLAG_FUA` is understood.
    pub const SEND_FUA: u16 = 1 << 3;
    /// The medium is rotational (never set by this server).
    pub const ROTATIONAL: u16 = 1 << 4;
    /// `NBD_CMD_TRIM` is understood.
    pub const SEND_TRIM: u16 = 1 << 5;
    /// `NBD_CMD_WRITE_ZEROES` and `NBD_CMD_FLAG_NO_HOLE` are understood.
    pub const SEND_WRITE_ZEROES: u16 = 1 << 6;
    /// `NBD_CMD_FLAG_DF` is understood (only with structured replies).
    pub const SEND_DF: u16 = 1 << 7;
    /// Flush and FUA are visible across all connections to the export.
    pub const CAN_MULTI_CONN: u16 = 1 << 8;
    /// `NBD_CMD_CACHE` is understood.
    pub const SEND_CACHE: u16 = 1 << 10;
    /// `NBD_CMD_FLAG_FAST_ZERO` is understood.
    pub const SEND_FAST_ZERO: u16 = 1 << 11;
}

/// Option codes sent by the client during the handshake.
pub mod opt {
    /// Choose an export and enter transmission (cannot report errors).
    pub const EXPORT_NAME: u32 = 1;
    /// End the handshake.
    pub const ABORT: u32 = 2;
    /// List the exports.
    pub const LIST: u32 = 3;
    /// Upgrade the connection to TLS.
    pub const STARTTLS: u32 = 5;
    /// Describe an export.
    pub const INFO: u32 = 6;
    /// Describe an export and enter transmission.
    pub const GO: u32 = 7;
    /// Use structured replies in transmission.
    pub const STRUCTURED_REPLY: u32 = 8;
    /// List metadata contexts.
    pub const LIST_META_CONTEXT: u32 = 9;
    /// Select metadata contexts.
    pub const SET_META_CONTEXT: u32 = 10;
}

/// Option reply types.
pub mod rep {
    /// Success, no more data for this option.
    pub const ACK: u32 = 1;
    /// One export in a `NBD_OPT_LIST` answer.
    pub const SERVER: u32 = 2;
    /// One piece of export information for `NBD_OPT_INFO` / `NBD_OPT_GO`.
    pub const INFO: u32 = 3;
    /// One metadata context.
    pub const META_CONTEXT: u32 = 4;
    /// The option is unknown to this server.
    pub const ERR_UNSUP: u32 = (1 << 31) + 1;
    /// Policy forbids the option.
    pub const ERR_POLICY: u32 = (1 << 31) + 2;
    /// The option is malformed or not valid now.
    pub const ERR_INVALID: u32 = (1 << 31) + 3;
    /// TLS must be negotiated first.
    pub const ERR_TLS_REQD: u32 = (1 << 31) + 5;
    /// The export does not exist.
    pub const ERR_UNKNOWN: u32 = (1 << 31) + 6;
    /// The server is shutting down.
    pub const ERR_SHUTDOWN: u32 = (1 << 31) + 7;
    /// The request or the reply is too large.
    pub const ERR_TOO_BIG: u32 = (1 << 31) + 9;
}

/// `NBD_INFO_*` types inside `NBD_REP_INFO`.
pub mod info {
    /// Size and transmission flags.
    pub const EXPORT: u16 = 0;
    /// Canonical export name.
    pub const NAME: u16 = 1;
    /// Human-readable description.
    pub const DESCRIPTION: u16 = 2;
    /// Minimum, preferred and maximum block sizes.
    pub const BLOCK_SIZE: u16 = 3;
}

/// Command types of transmission requests.
pub mod cmd {
    /// Read data.
    pub const READ: u16 = 0;
    /// Write data (payload follows the header).
    pub const WRITE: u16 = 1;
    /// Soft disconnect.
    pub const DISC: u16 = 2;
    /// Make completed writes durable.
    pub const FLUSH: u16 = 3;
    /// Discard a range.
    pub const TRIM: u16 = 4;
    /// Prefetch a range.
    pub const CACHE: u16 = 5;
    /// Write zeroes without a payload.
    pub const WRITE_ZEROES: u16 = 6;
    /// Query allocation status.
    pub const BLOCK_STATUS: u16 = 7;
}

/// Command flags.
pub mod cflag {
    /// Force unit access: reply only once the data is durable.
    pub const FUA: u16 = 1 << 0;
    /// `WRITE_ZEROES` must not leave a hole.
    pub const NO_HOLE: u16 = 1 << 1;
    /// `READ` must be answered with at most one content chunk.
    pub const DF: u16 = 1 << 2;
    /// `BLOCK_STATUS` wants only one extent.
    pub const REQ_ONE: u16 = 1 << 3;
    /// `WRITE_ZEROES` must fail fast with `ENOTSUP` unless zeroing is cheap.
    pub const FAST_ZERO: u16 = 1 << 4;
}

/// Structured reply chunk types and flags.
pub mod reply {
    /// Flag: last chunk of this reply.
    pub const FLAG_DONE: u16 = 1 << 0;
    /// No payload; only as the final chunk.
    pub const TYPE_NONE: u16 = 0;
    /// Offset + data.
    pub const TYPE_OFFSET_DATA: u16 = 1;
    /// Offset + length of zeroes.
    pub const TYPE_OFFSET_HOLE: u16 = 2;
    /// Metadata context id + extent descriptors.
    pub const TYPE_BLOCK_STATUS: u16 = 5;
    /// Error + message.
    pub const TYPE_ERROR: u16 = (1 << 15) + 1;
    /// Error + message + offset.
    pub const TYPE_ERROR_OFFSET: u16 = (1 << 15) + 2;
}

/// `base:allocation` status flag: the extent is not allocated.
pub const STATE_HOLE: u32 = 1 << 0;
/// `base:allocation` status flag: the extent reads as zeroes.
pub const STATE_ZERO: u32 = 1 << 1;

/// The only metadata context this server knows.
pub const BASE_ALLOCATION: &str = "base:allocation";
/// The id this server gives `base:allocation` when a client selects it.
pub const BASE_ALLOCATION_ID: u32 = 1;

/// Longest string (export name, description, query) the protocol allows, in bytes.
pub const MAX_STRING_BYTES: usize = 4096;

/// Error values of transmission replies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Errno {
    /// Operation not permitted (write to a read-only export).
    Perm = 1,
    /// Input/output error.
    Io = 5,
    /// Cannot allocate memory.
    NoMem = 12,
    /// Invalid argument (bad flags, out of range reads, unknown commands).
    Inval = 22,
    /// No space left (writes beyond the end).
    NoSpc = 28,
    /// Value too large (`DF` read that cannot be sent unfragmented).
    Overflow = 75,
    /// Operation not supported (`FAST_ZERO` when zeroing is not cheap).
    NotSup = 95,
    /// The server is shutting down.
    Shutdown = 108,
}

impl Errno {
    /// The value sent on the wire.
    pub fn code(self) -> u32 {
        self as u32
    }
}
