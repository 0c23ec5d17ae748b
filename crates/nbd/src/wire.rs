//! Pure functions over bytes: parsing what a client sends (option headers and payloads, request
//! headers, request validity) and encoding what the server sends. No I/O, no allocation beyond
//! the values returned, so the fuzzer and the unit tests drive them directly.

use crate::export::Extent;
use crate::proto::{self, Errno, MAX_STRING_BYTES, cflag, cmd, reply};

/// Bytes of an option header: magic (8), option (4), length (4).
pub const OPTION_HEADER_BYTES: usize = 16;
/// Bytes of a request header: magic (4), flags (2), type (2), cookie (8), offset (8), length (4).
pub const REQUEST_HEADER_BYTES: usize = 28;
/// Bytes of a simple reply header.
pub const SIMPLE_REPLY_BYTES: usize = 16;
/// Bytes of a structured reply chunk header.
pub const CHUNK_HEADER_BYTES: usize = 20;

fn be_u16(bytes: &[u8], at: usize) -> Option<u16> {
    let end = at.checked_add(2)?;
    Some(u16::from_be_bytes(bytes.get(at..end)?.try_into().ok()?))
}

fn be_u32(bytes: &[u8], at: usize) -> Option<u32> {
    let end = at.checked_add(4)?;
    Some(u32::from_be_bytes(bytes.get(at..end)?.try_into().ok()?))
}

/// A client option header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptionHeader {
    /// `NBD_OPT_*` code.
    pub option: u32,
    /// Bytes of option data that follow.
    pub len_bytes: u32,
}

/// The stream is not NBD; the connection must be closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FramingError {
    /// Option header does not start with IHAVEOPT
    #[error("option header does not start with IHAVEOPT (got {0:#018x})")]
    BadOptionMagic(u64),
    /// Request header does not start with the request magic
    #[error("request header does not start with the request magic (got {0:#010x})")]
    BadRequestMagic(u32),
    /// Write payload larger than the limit
    #[error("write payload of {len_bytes} bytes exceeds the limit of {max_bytes}")]
    PayloadTooLarge {
        /// Length the client announced.
        len_bytes: u32,
        /// The server's limit.
        max_bytes: u32,
    },
}

/// Parses an option header.
pub fn parse_option_header(bytes: &[u8; OPTION_HEADER_BYTES]) -> Result<OptionHeader, FramingError> {
    let magic = u64::from_be_bytes(bytes[0..8].try_into().expect("8 bytes"));
    if magic != proto::IHAVEOPT {
        return Err(FramingError::BadOptionMagic(magic));
    }
    let option = u32::from_be_bytes(bytes[8..12].try_into().expect("4 bytes"));
    let len_bytes = u32::from_be_bytes(bytes[12..16].try_into().expect("4 bytes"));
    Ok(OptionHeader { option, len_bytes })
}

/// `NBD_OPT_INFO` / `NBD_OPT_GO` data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InfoRequest {
    /// Export name (empty: the default export).
    pub name: String,
    /// Requested `NBD_INFO_*` types.
    pub info_types: Vec<u16>,
}

/// `NBD_OPT_LIST_META_CONTEXT` / `NBD_OPT_SET_META_CONTEXT` data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetaRequest {
    /// Export name.
    pub export_name: String,
    /// Queries such as `base:allocation`.
    pub queries: Vec<String>,
}

/// A parsed client option.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientOption {
    /// `NBD_OPT_EXPORT_NAME`.
    ExportName(String),
    /// `NBD_OPT_ABORT` (any data is ignored, as the spec asks).
    Abort,
    /// `NBD_OPT_LIST`.
    List,
    /// `NBD_OPT_STARTTLS`.
    StartTls,
    /// `NBD_OPT_INFO`.
    Info(InfoRequest),
    /// `NBD_OPT_GO`.
    Go(InfoRequest),
    /// `NBD_OPT_STRUCTURED_REPLY`.
    StructuredReply,
    /// `NBD_OPT_LIST_META_CONTEXT`.
    ListMetaContext(MetaRequest),
    /// `NBD_OPT_SET_META_CONTEXT`.
    SetMetaContext(MetaRequest),
    /// An option this server does not know; answered `NBD_REP_ERR_UNSUP`.
    Unknown(u32),
}

/// Why a known option's data was refused (answered `NBD_REP_ERR_INVALID`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OptionDataError {
    /// The option takes no data
    #[error("this option takes no data")]
    UnexpectedData,
    /// The data is shorter than its own length fields say
    #[error("option data is truncated")]
    Truncated,
    /// The data is longer than its own length fields say
    #[error("option data has trailing bytes")]
    TrailingBytes,
    /// A string is longer than 4096 bytes
    #[error("string longer than 4096 bytes")]
    StringTooLong,
    /// A string is not UTF-8 or contains NUL
    #[error("string is not UTF-8 or contains NUL")]
    BadString,
}

fn parse_string(bytes: &[u8]) -> Result<String, OptionDataError> {
    if bytes.len() > MAX_STRING_BYTES {
        return Err(OptionDataError::StringTooLong);
    }
    let text = std::str::from_utf8(bytes).map_err(|_| OptionDataError::BadString)?;
    if text.contains('\0') {
        return Err(OptionDataError::BadString);
    }
    Ok(text.to_owned())
}

/// Reads a 32-bit length-prefixed string at `*at`, advancing it.
fn take_prefixed_string(data: &[u8], at: &mut usize) -> Result<String, OptionDataError> {
    let len = be_u32(data, *at).ok_or(OptionDataError::Truncated)?;
    let start = *at + 4;
    let len = usize::try_from(len).map_err(|_| OptionDataError::Truncated)?;
    if len > MAX_STRING_BYTES {
        return Err(OptionDataError::StringTooLong);
    }
    let end = start.checked_add(len).ok_or(OptionDataError::Truncated)?;
    let bytes = data.get(start..end).ok_or(OptionDataError::Truncated)?;
    *at = end;
    parse_string(bytes)
}

fn parse_info_request(data: &[u8]) -> Result<InfoRequest, OptionDataError> {
    let mut at = 0;
    let name = take_prefixed_string(data, &mut at)?;
    let count = be_u16(data, at).ok_or(OptionDataError::Truncated)?;
    at += 2;
    let needed = usize::from(count) * 2;
    let rest = data.get(at..).ok_or(OptionDataError::Truncated)?;
    if rest.len() < needed {
        return Err(OptionDataError::Truncated);
    }
    if rest.len() > needed {
        return Err(OptionDataError::TrailingBytes);
    }
    let info_types = rest.chunks_exact(2).map(|pair| u16::from_be_bytes([pair[0], pair[1]])).collect();
    Ok(InfoRequest { name, info_types })
}

fn parse_meta_request(data: &[u8]) -> Result<MetaRequest, OptionDataError> {
    let mut at = 0;
    let export_name = take_prefixed_string(data, &mut at)?;
    let count = be_u32(data, at).ok_or(OptionDataError::Truncated)?;
    at += 4;
    // Each query takes at least its 4-byte length, so a count larger than that is a lie; checking
    // first keeps a hostile count from sizing an allocation.
    let remaining = data.len() - at;
    let count = usize::try_from(count).map_err(|_| OptionDataError::Truncated)?;
    if count > remaining / 4 {
        return Err(OptionDataError::Truncated);
    }
    let mut queries = Vec::with_capacity(count);
    for _ in 0..count {
        queries.push(take_prefixed_string(data, &mut at)?);
    }
    if at != data.len() {
        return Err(OptionDataError::TrailingBytes);
    }
    Ok(MetaRequest { export_name, queries })
}

/// Parses the data of option `option`.
pub fn parse_option(option: u32, data: &[u8]) -> Result<ClientOption, OptionDataError> {
    let no_data = |value: ClientOption| {
        if data.is_empty() { Ok(value) } else { Err(OptionDataError::UnexpectedData) }
    };
    match option {
        proto::opt::EXPORT_NAME => Ok(ClientOption::ExportName(parse_string(data)?)),
        proto::opt::ABORT => Ok(ClientOption::Abort),
        proto::opt::LIST => no_data(ClientOption::List),
        proto::opt::STARTTLS => no_data(ClientOption::StartTls),
        proto::opt::INFO => Ok(ClientOption::Info(parse_info_request(data)?)),
        proto::opt::GO => Ok(ClientOption::Go(parse_info_request(data)?)),
        proto::opt::STRUCTURED_REPLY => no_data(ClientOption::StructuredReply),
        proto::opt::LIST_META_CONTEXT => Ok(ClientOption::ListMetaContext(parse_meta_request(data)?)),
        proto::opt::SET_META_CONTEXT => Ok(ClientOption::SetMetaContext(parse_meta_request(data)?)),
        other => Ok(ClientOption::Unknown(other)),
    }
}

/// Which metadata contexts a query names, for `LIST` (`listing`) or `SET`.
///
/// Only `base:allocation` exists: `base:allocation` names it; `base:` names it when listing (a
/// wildcard) and nothing when setting (the spec says to ignore it); anything else names nothing.
pub fn query_selects_base_allocation(query: &str, listing: bool) -> bool {
    query == proto::BASE_ALLOCATION || (listing && query == "base:")
}

/// A transmission request header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestHeader {
    /// Command flags.
    pub flags: u16,
    /// Command type.
    pub kind: u16,
    /// Opaque value echoed in the reply.
    pub cookie: u64,
    /// Offset in bytes.
    pub offset_bytes: u64,
    /// Length in bytes.
    pub len_bytes: u32,
}

/// Parses a request header.
pub fn parse_request_header(bytes: &[u8; REQUEST_HEADER_BYTES]) -> Result<RequestHeader, FramingError> {
    let magic = u32::from_be_bytes(bytes[0..4].try_into().expect("4 bytes"));
    if magic != proto::REQUEST_MAGIC {
        return Err(FramingError::BadRequestMagic(magic));
    }
    Ok(RequestHeader {
        flags: u16::from_be_bytes(bytes[4..6].try_into().expect("2 bytes")),
        kind: u16::from_be_bytes(bytes[6..8].try_into().expect("2 bytes")),
        cookie: u64::from_be_bytes(bytes[8..16].try_into().expect("8 bytes")),
        offset_bytes: u64::from_be_bytes(bytes[16..24].try_into().expect("8 bytes")),
        len_bytes: u32::from_be_bytes(bytes[24..28].try_into().expect("4 bytes")),
    })
}

/// Bytes of payload that follow `header` on the wire. A write larger than `max_payload_bytes`
/// cannot be skipped safely (the spec lets the server treat it as denial of service), so it is a
/// framing error and the connection closes.
pub fn request_payload_bytes(header: &RequestHeader, max_payload_bytes: u32) -> Result<u32, FramingError> {
    if header.kind != cmd::WRITE {
        return Ok(0);
    }
    if header.len_bytes > max_payload_bytes {
        return Err(FramingError::PayloadTooLarge {
            len_bytes: header.len_bytes,
            max_bytes: max_payload_bytes,
        });
    }
    Ok(header.len_bytes)
}

/// What the negotiation settled that requests are checked against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionParams {
    /// Export size in bytes.
    pub size_bytes: u64,
    /// The export refuses writes.
    pub read_only: bool,
    /// Structured replies were negotiated.
    pub structured: bool,
    /// `base:allocation` was selected for this export.
    pub block_status: bool,
    /// Largest read or write payload.
    pub max_payload_bytes: u32,
}

/// A checked request: in range, with flags valid for its command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    /// Read `len_bytes` at `offset_bytes`.
    Read {
        /// Start.
        offset_bytes: u64,
        /// Length.
        len_bytes: u32,
    },
    /// Write the payload at `offset_bytes`.
    Write {
        /// Start.
        offset_bytes: u64,
        /// Length of the payload.
        len_bytes: u32,
        /// Force unit access.
        fua: bool,
    },
    /// Soft disconnect.
    Disconnect,
    /// Flush.
    Flush,
    /// Trim.
    Trim {
        /// Start.
        offset_bytes: u64,
        /// Length.
        len_bytes: u32,
        /// Force unit access.
        fua: bool,
    },
    /// Cache hint.
    Cache {
        /// Start.
        offset_bytes: u64,
        /// Length.
        len_bytes: u32,
    },
    /// Write zeroes.
    WriteZeroes {
        /// Start.
        offset_bytes: u64,
        /// Length.
        len_bytes: u32,
        /// The range may be deallocated (no `NO_HOLE`).
        may_trim: bool,
        /// Fail with `ENOTSUP` unless zeroing is cheap.
        fast: bool,
        /// Force unit access.
        fua: bool,
    },
    /// Block status for `base:allocation`.
    BlockStatus {
        /// Start.
        offset_bytes: u64,
        /// Length.
        len_bytes: u32,
        /// Only one extent wanted.
        req_one: bool,
    },
}

/// A request refused before reaching the export.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// Error value for the reply.
    pub errno: Errno,
    /// Message for structured error chunks.
    pub message: &'static str,
}

const fn refuse(errno: Errno, message: &'static str) -> Refusal {
    Refusal { errno, message }
}

/// True when `[offset, offset + len)` fits in `size` (overflow-safe).
pub fn range_fits(offset_bytes: u64, len_bytes: u32, size_bytes: u64) -> bool {
    offset_bytes.checked_add(u64::from(len_bytes)).is_some_and(|end| end <= size_bytes)
}

/// Checks a request against the session: command known, flags valid for the command, range in
/// the export, writes allowed. Errors follow the spec: unknown command or flag `EINVAL`, write
/// or zero to a read-only export `EPERM`, write or zero past the end `ENOSPC`, read, trim, cache
/// or block status past the end `EINVAL`, oversized read `EINVAL`.
pub fn check_request(header: &RequestHeader, session: &SessionParams) -> Result<Command, Refusal> {
    let allowed_flags = match header.kind {
        cmd::READ => cflag::FUA | if session.structured { cflag::DF } else { 0 },
        cmd::WRITE | cmd::DISC | cmd::FLUSH | cmd::TRIM | cmd::CACHE => cflag::FUA,
        cmd::WRITE_ZEROES => cflag::FUA | cflag::NO_HOLE | cflag::FAST_ZERO,
        cmd::BLOCK_STATUS => cflag::FUA | cflag::REQ_ONE,
        _ => return Err(refuse(Errno::Inval, "unknown command")),
    };
    if header.flags & !allowed_flags != 0 {
        return Err(refuse(Errno::Inval, "command flag not valid for this command"));
    }
    let fua = header.flags & cflag::FUA != 0;
    let (offset_bytes, len_bytes) = (header.offset_bytes, header.len_bytes);
    let fits = range_fits(offset_bytes, len_bytes, session.size_bytes);
    match header.kind {
        cmd::READ => {
            if len_bytes > session.max_payload_bytes {
                return Err(refuse(Errno::Inval, "read larger than the maximum block size"));
            }
            if !fits {
                return Err(refuse(Errno::Inval, "read beyond the end of the export"));
            }
            Ok(Command::Read { offset_bytes, len_bytes })
        }
        cmd::WRITE => {
            if session.read_only {
                return Err(refuse(Errno::Perm, "the export is read-only"));
            }
            if !fits {
                return Err(refuse(Errno::NoSpc, "write beyond the end of the export"));
            }
            Ok(Command::Write { offset_bytes, len_bytes, fua })
        }
        cmd::DISC => Ok(Command::Disconnect),
        cmd::FLUSH => Ok(Command::Flush),
        cmd::TRIM => {
            if session.read_only {
                return Err(refuse(Errno::Perm, "the export is read-only"));
            }
            if !fits {
                return Err(refuse(Errno::Inval, "trim beyond the end of the export"));
            }
            Ok(Command::Trim { offset_bytes, len_bytes, fua })
        }
        cmd::CACHE => {
            if !fits {
                return Err(refuse(Errno::Inval, "cache beyond the end of the export"));
            }
            Ok(Command::Cache { offset_bytes, len_bytes })
        }
        cmd::WRITE_ZEROES => {
            if session.read_only {
                return Err(refuse(Errno::Perm, "the export is read-only"));
            }
            if !fits {
                return Err(refuse(Errno::NoSpc, "write zeroes beyond the end of the export"));
            }
            let may_trim = header.flags & cflag::NO_HOLE == 0;
            let fast = header.flags & cflag::FAST_ZERO != 0;
            Ok(Command::WriteZeroes { offset_bytes, len_bytes, may_trim, fast, fua })
        }
        cmd::BLOCK_STATUS => {
            if !session.block_status {
                return Err(refuse(Errno::Inval, "no metadata context was negotiated"));
            }
            if len_bytes == 0 {
                return Err(refuse(Errno::Inval, "block status of zero bytes"));
            }
            if !fits {
                return Err(refuse(Errno::Inval, "block status beyond the end of the export"));
            }
            let req_one = header.flags & cflag::REQ_ONE != 0;
            Ok(Command::BlockStatus { offset_bytes, len_bytes, req_one })
        }
        _ => unreachable!("unknown commands returned above"),
    }
}

// ---- encoding -------------------------------------------------------------------------------

/// Appends an option reply with `payload`.
pub fn encode_option_reply(out: &mut Vec<u8>, option: u32, reply_type: u32, payload: &[u8]) {
    let len = u32::try_from(payload.len()).expect("option reply payloads are small");
    out.extend_from_slice(&proto::OPTION_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&reply_type.to_be_bytes());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(payload);
}

/// `NBD_REP_INFO` payload for `NBD_INFO_EXPORT`.
pub fn info_export_payload(size_bytes: u64, transmission_flags: u16) -> [u8; 12] {
    let mut payload = [0u8; 12];
    payload[0..2].copy_from_slice(&proto::info::EXPORT.to_be_bytes());
    payload[2..10].copy_from_slice(&size_bytes.to_be_bytes());
    payload[10..12].copy_from_slice(&transmission_flags.to_be_bytes());
    payload
}

/// `NBD_REP_INFO` payload for `NBD_INFO_BLOCK_SIZE`.
pub fn info_block_size_payload(minimum: u32, preferred: u32, maximum: u32) -> [u8; 14] {
    let mut payload = [0u8; 14];
    payload[0..2].copy_from_slice(&proto::info::BLOCK_SIZE.to_be_bytes());
    payload[2..6].copy_from_slice(&minimum.to_be_bytes());
    payload[6..10].copy_from_slice(&preferred.to_be_bytes());
    payload[10..14].copy_from_slice(&maximum.to_be_bytes());
    payload
}

/// `NBD_REP_INFO` payload for a string info type (`NAME`, `DESCRIPTION`).
pub fn info_string_payload(info_type: u16, text: &str) -> Vec<u8> {
    let mut payload = Vec::with_capacity(2 + text.len());
    payload.extend_from_slice(&info_type.to_be_bytes());
    payload.extend_from_slice(text.as_bytes());
    payload
}

/// `NBD_REP_SERVER` payload: name length, name, description.
pub fn rep_server_payload(name: &str, description: Option<&str>) -> Vec<u8> {
    let name_len = u32::try_from(name.len()).expect("names are at most 4096 bytes");
    let description = description.unwrap_or("");
    let mut payload = Vec::with_capacity(4 + name.len() + description.len());
    payload.extend_from_slice(&name_len.to_be_bytes());
    payload.extend_from_slice(name.as_bytes());
    payload.extend_from_slice(description.as_bytes());
    payload
}

/// `NBD_REP_META_CONTEXT` payload: id and name.
pub fn rep_meta_context_payload(context_id: u32, name: &str) -> Vec<u8> {
    let mut payload = Vec::with_capacity(4 + name.len());
    payload.extend_from_slice(&context_id.to_be_bytes());
    payload.extend_from_slice(name.as_bytes());
    payload
}

/// Appends a simple reply header (the read payload, if any, follows separately).
pub fn encode_simple_reply(out: &mut Vec<u8>, cookie: u64, error: u32) {
    out.extend_from_slice(&proto::SIMPLE_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&error.to_be_bytes());
    out.extend_from_slice(&cookie.to_be_bytes());
}

/// Appends a structured reply chunk header.
pub fn encode_chunk_header(out: &mut Vec<u8>, flags: u16, chunk_type: u16, cookie: u64, len_bytes: u32) {
    out.extend_from_slice(&proto::STRUCTURED_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&chunk_type.to_be_bytes());
    out.extend_from_slice(&cookie.to_be_bytes());
    out.extend_from_slice(&len_bytes.to_be_bytes());
}

/// Appends the header of a final `OFFSET_DATA` chunk for `data_len` bytes at `offset_bytes`; the
/// data follows separately.
pub fn encode_read_chunk_header(out: &mut Vec<u8>, cookie: u64, offset_bytes: u64, data_len: u32) {
    let len = data_len.checked_add(8).expect("read payloads are limited far below 4 GiB");
    encode_chunk_header(out, reply::FLAG_DONE, reply::TYPE_OFFSET_DATA, cookie, len);
    out.extend_from_slice(&offset_bytes.to_be_bytes());
}

/// Appends a final `NONE` chunk.
pub fn encode_done_chunk(out: &mut Vec<u8>, cookie: u64) {
    encode_chunk_header(out, reply::FLAG_DONE, reply::TYPE_NONE, cookie, 0);
}

/// Longest error message put in an error chunk.
pub const MAX_ERROR_MESSAGE_BYTES: usize = 1024;

/// Appends a final `ERROR` chunk with a message (cut to [`MAX_ERROR_MESSAGE_BYTES`] on a
/// character boundary).
pub fn encode_error_chunk(out: &mut Vec<u8>, cookie: u64, errno: Errno, message: &str) {
    let mut cut = message.len().min(MAX_ERROR_MESSAGE_BYTES);
    while !message.is_char_boundary(cut) {
        cut -= 1;
    }
    let message = &message.as_bytes()[..cut];
    let message_len = u16::try_from(message.len()).expect("cut to 1024 bytes");
    let len = 6 + u32::from(message_len);
    encode_chunk_header(out, reply::FLAG_DONE, reply::TYPE_ERROR, cookie, len);
    out.extend_from_slice(&errno.code().to_be_bytes());
    out.extend_from_slice(&message_len.to_be_bytes());
    out.extend_from_slice(message);
}

/// Makes the export's extents a valid answer for a request of `len_bytes`: drops empty extents,
/// merges neighbours with equal status, clips to the request, keeps at most `max_extents`
/// (one with `req_one`). Returns a single "allocated, unknown" extent when the export gave none.
pub fn normalize_extents(
    extents: &[Extent],
    len_bytes: u32,
    req_one: bool,
    max_extents: usize,
) -> Vec<Extent> {
    let limit = if req_one { 1 } else { max_extents.max(1) };
    let mut out: Vec<Extent> = Vec::with_capacity(extents.len().min(limit));
    let mut covered: u32 = 0;
    for extent in extents {
        if covered >= len_bytes {
            break;
        }
        let take = extent.len_bytes.min(len_bytes - covered);
        if take == 0 {
            continue;
        }
        covered += take;
        match out.last_mut() {
            Some(last) if last.hole == extent.hole && last.zero == extent.zero => last.len_bytes += take,
            _ => {
                if out.len() == limit {
                    break;
                }
                out.push(Extent { len_bytes: take, hole: extent.hole, zero: extent.zero });
            }
        }
    }
    if out.is_empty() {
        out.push(Extent { len_bytes, hole: false, zero: false });
    }
    out
}

/// Appends a final `BLOCK_STATUS` chunk for one context.
pub fn encode_block_status(out: &mut Vec<u8>, cookie: u64, context_id: u32, extents: &[Extent]) {
    assert!(!extents.is_empty(), "a block status reply needs at least one extent");
    let len = extents
        .len()
        .checked_mul(8)
        .and_then(|bytes| bytes.checked_add(4))
        .and_then(|bytes| u32::try_from(bytes).ok())
        .expect("extent count is limited");
    encode_chunk_header(out, reply::FLAG_DONE, reply::TYPE_BLOCK_STATUS, cookie, len);
    out.extend_from_slice(&context_id.to_be_bytes());
    for extent in extents {
        assert!(extent.len_bytes > 0, "extents are never empty");
        out.extend_from_slice(&extent.len_bytes.to_be_bytes());
        out.extend_from_slice(&extent.flags().to_be_bytes());
    }
}

#[cfg(test)]
mod tests;
