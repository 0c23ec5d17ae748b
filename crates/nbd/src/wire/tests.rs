#![allow(clippy::cast_possible_truncation)] // test inputs are small, known sizes
use super::*;
use crate::proto::{opt, tflag};

fn header(kind: u16, flags: u16, offset_bytes: u64, len_bytes: u32) -> RequestHeader {
    RequestHeader { flags, kind, cookie: 0x1122_3344_5566_7788, offset_bytes, len_bytes }
}

fn session() -> SessionParams {
    SessionParams {
        size_bytes: 1 << 20,
        read_only: false,
        structured: true,
        block_status: true,
        max_payload_bytes: 32 << 20,
    }
}

fn prefixed(text: &[u8]) -> Vec<u8> {
    let mut out = (text.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(text);
    out
}

#[test]
fn option_header_round_trip_and_bad_magic() {
    let mut bytes = [0u8; 16];
    bytes[0..8].copy_from_slice(&proto::IHAVEOPT.to_be_bytes());
    bytes[8..12].copy_from_slice(&7u32.to_be_bytes());
    bytes[12..16].copy_from_slice(&42u32.to_be_bytes());
    assert_eq!(parse_option_header(&bytes), Ok(OptionHeader { option: 7, len_bytes: 42 }));
    bytes[0] ^= 1;
    assert!(matches!(parse_option_header(&bytes), Err(FramingError::BadOptionMagic(_))));
}

#[test]
fn go_parses_name_and_info_types() {
    let mut data = prefixed(b"disk");
    data.extend_from_slice(&2u16.to_be_bytes());
    data.extend_from_slice(&proto::info::NAME.to_be_bytes());
    data.extend_from_slice(&proto::info::BLOCK_SIZE.to_be_bytes());
    let parsed = parse_option(opt::GO, &data).unwrap();
    assert_eq!(
        parsed,
        ClientOption::Go(InfoRequest {
            name: "disk".into(),
            info_types: vec![proto::info::NAME, proto::info::BLOCK_SIZE]
        })
    );
}

#[test]
fn go_with_lying_lengths_is_invalid() {
    // Name length beyond the data.
    let mut data = 100u32.to_be_bytes().to_vec();
    data.extend_from_slice(b"ab");
    assert_eq!(parse_option(opt::GO, &data), Err(OptionDataError::Truncated));
    // Info count larger than the data.
    let mut data = prefixed(b"");
    data.extend_from_slice(&5u16.to_be_bytes());
    assert_eq!(parse_option(opt::INFO, &data), Err(OptionDataError::Truncated));
    // Trailing garbage.
    let mut data = prefixed(b"");
    data.extend_from_slice(&0u16.to_be_bytes());
    data.push(9);
    assert_eq!(parse_option(opt::GO, &data), Err(OptionDataError::TrailingBytes));
    // Name length near u32::MAX must not overflow.
    let data = u32::MAX.to_be_bytes().to_vec();
    assert_eq!(parse_option(opt::GO, &data), Err(OptionDataError::StringTooLong));
}

#[test]
fn names_are_limited_to_4096_bytes_utf8_without_nul() {
    let long = vec![b'a'; 4097];
    assert_eq!(parse_option(opt::EXPORT_NAME, &long), Err(OptionDataError::StringTooLong));
    let exact = vec![b'a'; 4096];
    assert!(parse_option(opt::EXPORT_NAME, &exact).is_ok());
    assert_eq!(parse_option(opt::EXPORT_NAME, b"a\0b"), Err(OptionDataError::BadString));
    assert_eq!(parse_option(opt::EXPORT_NAME, &[0xff, 0xfe]), Err(OptionDataError::BadString));
}

#[test]
fn options_without_data_refuse_data_except_abort() {
    assert_eq!(parse_option(opt::LIST, b"x"), Err(OptionDataError::UnexpectedData));
    assert_eq!(parse_option(opt::STARTTLS, b"x"), Err(OptionDataError::UnexpectedData));
    assert_eq!(parse_option(opt::STRUCTURED_REPLY, b"x"), Err(OptionDataError::UnexpectedData));
    assert_eq!(parse_option(opt::ABORT, b"ignored"), Ok(ClientOption::Abort));
    assert_eq!(parse_option(4242, b"whatever"), Ok(ClientOption::Unknown(4242)));
}

#[test]
fn meta_context_parsing_and_hostile_counts() {
    let mut data = prefixed(b"disk");
    data.extend_from_slice(&2u32.to_be_bytes());
    data.extend_from_slice(&prefixed(b"base:allocation"));
    data.extend_from_slice(&prefixed(b"qemu:dirty-bitmap:x"));
    let parsed = parse_option(opt::SET_META_CONTEXT, &data).unwrap();
    let ClientOption::SetMetaContext(request) = parsed else { panic!("wrong option") };
    assert_eq!(request.export_name, "disk");
    assert_eq!(request.queries, vec!["base:allocation", "qemu:dirty-bitmap:x"]);

    let mut data = prefixed(b"disk");
    data.extend_from_slice(&u32::MAX.to_be_bytes());
    assert_eq!(parse_option(opt::LIST_META_CONTEXT, &data), Err(OptionDataError::Truncated));
}

#[test]
fn query_matching() {
    assert!(query_selects_base_allocation("base:allocation", false));
    assert!(query_selects_base_allocation("base:allocation", true));
    assert!(query_selects_base_allocation("base:", true));
    assert!(!query_selects_base_allocation("base:", false));
    assert!(!query_selects_base_allocation("qemu:allocation-depth", true));
}

#[test]
fn request_header_parse() {
    let mut bytes = [0u8; REQUEST_HEADER_BYTES];
    bytes[0..4].copy_from_slice(&proto::REQUEST_MAGIC.to_be_bytes());
    bytes[4..6].copy_from_slice(&cflag::FUA.to_be_bytes());
    bytes[6..8].copy_from_slice(&cmd::WRITE.to_be_bytes());
    bytes[8..16].copy_from_slice(&99u64.to_be_bytes());
    bytes[16..24].copy_from_slice(&4096u64.to_be_bytes());
    bytes[24..28].copy_from_slice(&512u32.to_be_bytes());
    let parsed = parse_request_header(&bytes).unwrap();
    assert_eq!(
        parsed,
        RequestHeader { flags: 1, kind: cmd::WRITE, cookie: 99, offset_bytes: 4096, len_bytes: 512 }
    );
    assert_eq!(request_payload_bytes(&parsed, 1024), Ok(512));
    assert!(matches!(request_payload_bytes(&parsed, 256), Err(FramingError::PayloadTooLarge { .. })));
    bytes[3] ^= 0xff;
    assert!(matches!(parse_request_header(&bytes), Err(FramingError::BadRequestMagic(_))));
}

#[test]
fn errors_follow_the_spec() {
    let s = session();
    let errno = |h: RequestHeader, s: &SessionParams| check_request(&h, s).unwrap_err().errno;
    // Past the end: writes and zeroes ENOSPC; reads, trims, cache, block status EINVAL.
    assert_eq!(errno(header(cmd::WRITE, 0, (1 << 20) - 1, 2), &s), Errno::NoSpc);
    assert_eq!(errno(header(cmd::WRITE_ZEROES, 0, 1 << 20, 1), &s), Errno::NoSpc);
    assert_eq!(errno(header(cmd::READ, 0, 1 << 20, 1), &s), Errno::Inval);
    assert_eq!(errno(header(cmd::TRIM, 0, u64::MAX, 1), &s), Errno::Inval);
    assert_eq!(errno(header(cmd::CACHE, 0, 1 << 20, 1), &s), Errno::Inval);
    assert_eq!(errno(header(cmd::BLOCK_STATUS, 0, 1 << 20, 1), &s), Errno::Inval);
    // Overflowing offset + length.
    assert_eq!(errno(header(cmd::READ, 0, u64::MAX - 1, 4), &s), Errno::Inval);
    // Unknown command and unknown or misplaced flags.
    assert_eq!(errno(header(99, 0, 0, 0), &s), Errno::Inval);
    assert_eq!(errno(header(cmd::READ, 1 << 9, 0, 1), &s), Errno::Inval);
    assert_eq!(errno(header(cmd::WRITE, cflag::DF, 0, 1), &s), Errno::Inval);
    assert_eq!(errno(header(cmd::READ, cflag::NO_HOLE, 0, 1), &s), Errno::Inval);
    assert_eq!(errno(header(cmd::TRIM, cflag::REQ_ONE, 0, 1), &s), Errno::Inval);
    // DF only with structured replies.
    let simple = SessionParams { structured: false, block_status: false, ..s };
    assert!(check_request(&header(cmd::READ, cflag::DF, 0, 1), &s).is_ok());
    assert_eq!(errno(header(cmd::READ, cflag::DF, 0, 1), &simple), Errno::Inval);
    // Block status needs a negotiated context.
    assert_eq!(errno(header(cmd::BLOCK_STATUS, 0, 0, 1), &simple), Errno::Inval);
    // Read-only.
    let ro = SessionParams { read_only: true, ..s };
    assert_eq!(errno(header(cmd::WRITE, 0, 0, 1), &ro), Errno::Perm);
    assert_eq!(errno(header(cmd::WRITE_ZEROES, 0, 0, 1), &ro), Errno::Perm);
    assert_eq!(errno(header(cmd::TRIM, 0, 0, 1), &ro), Errno::Perm);
    assert!(check_request(&header(cmd::READ, 0, 0, 1), &ro).is_ok());
    // Oversized read.
    assert_eq!(
        errno(header(cmd::READ, 0, 0, (32 << 20) + 1), &SessionParams { size_bytes: u64::MAX, ..s }),
        Errno::Inval
    );
}

#[test]
fn valid_requests_decode_their_flags() {
    let s = session();
    assert_eq!(
        check_request(&header(cmd::WRITE_ZEROES, cflag::NO_HOLE | cflag::FAST_ZERO | cflag::FUA, 0, 8), &s),
        Ok(Command::WriteZeroes { offset_bytes: 0, len_bytes: 8, may_trim: false, fast: true, fua: true })
    );
    assert_eq!(
        check_request(&header(cmd::BLOCK_STATUS, cflag::REQ_ONE, 4096, 8), &s),
        Ok(Command::BlockStatus { offset_bytes: 4096, len_bytes: 8, req_one: true })
    );
    // Zero-length requests at the very end are in range.
    assert!(check_request(&header(cmd::READ, 0, 1 << 20, 0), &s).is_ok());
    assert!(check_request(&header(cmd::WRITE, 0, 1 << 20, 0), &s).is_ok());
    // FUA is accepted on every command (clients are known to set it everywhere).
    assert_eq!(check_request(&header(cmd::FLUSH, cflag::FUA, 0, 0), &s), Ok(Command::Flush));
}

#[test]
fn reply_encodings_have_the_wire_layout() {
    let mut out = Vec::new();
    encode_simple_reply(&mut out, 5, 22);
    assert_eq!(out, [0x67, 0x44, 0x66, 0x98, 0, 0, 0, 22, 0, 0, 0, 0, 0, 0, 0, 5]);

    let mut out = Vec::new();
    encode_read_chunk_header(&mut out, 5, 4096, 512);
    assert_eq!(out.len(), CHUNK_HEADER_BYTES + 8);
    assert_eq!(&out[0..4], &proto::STRUCTURED_REPLY_MAGIC.to_be_bytes());
    assert_eq!(&out[4..6], &reply::FLAG_DONE.to_be_bytes());
    assert_eq!(&out[6..8], &reply::TYPE_OFFSET_DATA.to_be_bytes());
    assert_eq!(&out[16..20], &520u32.to_be_bytes());
    assert_eq!(&out[20..28], &4096u64.to_be_bytes());

    let mut out = Vec::new();
    encode_error_chunk(&mut out, 5, Errno::Io, "boom");
    assert_eq!(&out[6..8], &reply::TYPE_ERROR.to_be_bytes());
    assert_eq!(&out[16..20], &10u32.to_be_bytes());
    assert_eq!(&out[20..24], &5u32.to_be_bytes());
    assert_eq!(&out[24..26], &4u16.to_be_bytes());
    assert_eq!(&out[26..], b"boom");

    // Long messages are cut on a character boundary.
    let mut out = Vec::new();
    encode_error_chunk(&mut out, 5, Errno::Io, &"é".repeat(1000));
    let message_len = u16::from_be_bytes([out[24], out[25]]) as usize;
    assert!(message_len <= MAX_ERROR_MESSAGE_BYTES);
    assert!(std::str::from_utf8(&out[26..]).is_ok());

    let mut out = Vec::new();
    let extents = [
        Extent { len_bytes: 4096, hole: true, zero: true },
        Extent { len_bytes: 512, hole: false, zero: false },
    ];
    encode_block_status(&mut out, 5, 1, &extents);
    assert_eq!(&out[16..20], &20u32.to_be_bytes());
    assert_eq!(&out[20..24], &1u32.to_be_bytes());
    assert_eq!(&out[24..32], &[0, 0, 0x10, 0, 0, 0, 0, 3]);
    assert_eq!(&out[32..40], &[0, 0, 2, 0, 0, 0, 0, 0]);

    let mut out = Vec::new();
    encode_option_reply(&mut out, opt::GO, proto::rep::ACK, &[]);
    assert_eq!(out.len(), 20);
    assert_eq!(&out[0..8], &proto::OPTION_REPLY_MAGIC.to_be_bytes());
    let payload = info_export_payload(1 << 30, tflag::HAS_FLAGS | tflag::READ_ONLY);
    assert_eq!(payload, [0, 0, 0, 0, 0, 0, 0x40, 0, 0, 0, 0, 3]);
}

#[test]
fn normalize_clips_merges_and_limits() {
    let e = |len_bytes, hole, zero| Extent { len_bytes, hole, zero };
    // Clipped to the request, neighbours merged, empties dropped.
    let got = normalize_extents(
        &[e(100, true, true), e(0, false, false), e(50, true, true), e(500, false, false)],
        200,
        false,
        16,
    );
    assert_eq!(got, vec![e(150, true, true), e(50, false, false)]);
    // REQ_ONE keeps one extent no longer than the request.
    let got = normalize_extents(&[e(100, true, true), e(100, false, false)], 150, true, 16);
    assert_eq!(got, vec![e(100, true, true)]);
    // Limit on the count.
    let many: Vec<Extent> = (0..10).map(|i| e(1, i % 2 == 0, false)).collect();
    assert_eq!(normalize_extents(&many, 10, false, 3).len(), 3);
    // Nothing usable: one allocated extent for the whole request.
    assert_eq!(normalize_extents(&[], 77, false, 16), vec![e(77, false, false)]);
}
