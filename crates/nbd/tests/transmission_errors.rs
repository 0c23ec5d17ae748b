//! Every command and every error value, with simple and with structured replies.
#![allow(clippy::cast_possible_truncation)] // test inputs are small, known sizes

use crate::common::{Reply, connect, fixture};
use stria_nbd::Errno;
use stria_nbd::proto::{cflag, cmd, reply};

const EPERM: u32 = Errno::Perm as u32;
const EIO: u32 = Errno::Io as u32;
const EINVAL: u32 = Errno::Inval as u32;
const ENOSPC: u32 = Errno::NoSpc as u32;
const ENOTSUP: u32 = Errno::NotSup as u32;

#[tokio::test]
async fn simple_replies_round_trip_and_error_values() {
    let fx = fixture();
    let mut c = connect(&fx.server);
    let (size, _) = c.handshake("disk", false, false).await;
    // Write, then read back.
    c.send_request(cmd::WRITE, cflag::FUA, 1, 1000, 5, b"hello").await;
    assert_eq!(c.read_reply().await, Reply::Simple { cookie: 1, error: 0 });
    c.send_request(cmd::READ, 0, 2, 998, 9, &[]).await;
    assert_eq!(c.read_reply().await, Reply::Simple { cookie: 2, error: 0 });
    assert_eq!(c.read_exact_data(9).await, b"\0\0hello\0\0");
    // Errors: no payload follows a simple error reply.
    let cases: [(u16, u16, u64, u32, u32); 9] = [
        (cmd::WRITE, 0, size - 2, 4, ENOSPC),
        (cmd::WRITE_ZEROES, 0, size, 1, ENOSPC),
        (cmd::READ, 0, size - 2, 4, EINVAL),
        (cmd::TRIM, 0, size, 4096, EINVAL),
        (cmd::CACHE, 0, u64::MAX, 2, EINVAL),
        (cmd::READ, cflag::DF, 0, 4, EINVAL), // DF without structured replies
        (cmd::BLOCK_STATUS, 0, 0, 4096, EINVAL), // no metadata context
        (77, 0, 0, 0, EINVAL),                // unknown command
        (cmd::FLUSH, 1 << 12, 0, 0, EINVAL),  // unknown flag
    ];
    for (index, (kind, flags, offset, len, errno)) in cases.into_iter().enumerate() {
        let cookie = 100 + index as u64;
        let payload = if kind == cmd::WRITE { vec![7u8; len as usize] } else { Vec::new() };
        c.send_request(kind, flags, cookie, offset, len, &payload).await;
        assert_eq!(c.read_reply().await, Reply::Simple { cookie, error: errno }, "case {index}");
    }
    // Zero-length requests succeed.
    for (cookie, kind) in [(200, cmd::READ), (201, cmd::WRITE), (202, cmd::TRIM), (203, cmd::WRITE_ZEROES)] {
        c.send_request(kind, 0, cookie, 0, 0, &[]).await;
        assert_eq!(c.read_reply().await, Reply::Simple { cookie, error: 0 });
    }
    // The connection still works after all that.
    c.send_request(cmd::READ, 0, 300, 1000, 5, &[]).await;
    assert_eq!(c.read_reply().await.error(), 0);
    assert_eq!(c.read_exact_data(5).await, b"hello");
    c.send_request(cmd::DISC, 0, 301, 0, 0, &[]).await;
    assert!(c.is_closed().await);
}

#[tokio::test]
async fn read_only_and_faulty_exports() {
    let fx = fixture();
    let mut c = connect(&fx.server);
    c.handshake("ro", true, false).await;
    for (cookie, kind) in [(1, cmd::WRITE), (2, cmd::WRITE_ZEROES), (3, cmd::TRIM)] {
        let payload = if kind == cmd::WRITE { vec![1u8; 16] } else { Vec::new() };
        c.send_request(kind, 0, cookie, 0, 16, &payload).await;
        let reply = c.read_reply().await;
        assert_eq!((reply.cookie(), reply.error()), (cookie, EPERM));
    }

    let mut c = connect(&fx.server);
    c.handshake("bad", true, false).await;
    c.send_request(cmd::READ, 0, 1, 4000, 200, &[]).await;
    let reply = c.read_reply().await;
    assert_eq!(reply.error(), EIO);
    let Reply::Chunk { flags, chunk_type, .. } = reply else { panic!("structured error expected") };
    assert_eq!((flags, chunk_type), (reply::FLAG_DONE, reply::TYPE_ERROR));
    c.send_request(cmd::WRITE, 0, 2, 8000, 4, b"abcd").await;
    assert_eq!(c.read_reply().await.error(), EIO);
    c.send_request(cmd::READ, 0, 3, 0, 4096, &[]).await;
    assert_eq!(c.read_reply().await.error(), 0);
}

#[tokio::test]
async fn fast_zero_fails_fast_where_zeroing_is_not_cheap() {
    let fx = fixture();
    let mut c = connect(&fx.server);
    c.handshake("slowzero", false, false).await;
    c.send_request(cmd::WRITE_ZEROES, cflag::FAST_ZERO, 1, 0, 4096, &[]).await;
    assert_eq!(c.read_reply().await, Reply::Simple { cookie: 1, error: ENOTSUP });
    c.send_request(cmd::WRITE_ZEROES, 0, 2, 0, 4096, &[]).await;
    assert_eq!(c.read_reply().await, Reply::Simple { cookie: 2, error: 0 });

    let mut c = connect(&fx.server);
    c.handshake("disk", false, false).await;
    c.send_request(cmd::WRITE_ZEROES, cflag::FAST_ZERO | cflag::NO_HOLE, 3, 0, 8192, &[]).await;
    assert_eq!(c.read_reply().await, Reply::Simple { cookie: 3, error: 0 });
}

#[tokio::test]
async fn structured_reads_block_status_and_req_one() {
    let fx = fixture();
    let mut c = connect(&fx.server);
    c.handshake("disk", true, true).await;
    c.send_request(cmd::WRITE, 0, 1, 8192, 4096, &[0xab; 4096]).await;
    assert_eq!(c.read_reply().await.error(), 0);
    c.send_request(cmd::WRITE_ZEROES, cflag::NO_HOLE, 2, 16384, 4096, &[]).await;
    assert_eq!(c.read_reply().await.error(), 0);

    // A read is one OFFSET_DATA chunk with DONE; DF is honoured.
    c.send_request(cmd::READ, cflag::DF, 3, 8190, 4, &[]).await;
    let Reply::Chunk { flags, chunk_type, cookie, payload } = c.read_reply().await else { panic!() };
    assert_eq!((flags, chunk_type, cookie), (reply::FLAG_DONE, reply::TYPE_OFFSET_DATA, 3));
    assert_eq!(u64::from_be_bytes(payload[0..8].try_into().unwrap()), 8190);
    assert_eq!(&payload[8..], &[0, 0, 0xab, 0xab]);
    // A zero-length read is a lone NONE chunk.
    c.send_request(cmd::READ, 0, 4, 0, 0, &[]).await;
    let Reply::Chunk { chunk_type, .. } = c.read_reply().await else { panic!() };
    assert_eq!(chunk_type, reply::TYPE_NONE);

    // Block status: hole, data, hole, zero (allocated), hole.
    c.send_request(cmd::BLOCK_STATUS, 0, 5, 0, 65536, &[]).await;
    let Reply::Chunk { flags, chunk_type, payload, .. } = c.read_reply().await else { panic!() };
    assert_eq!((flags, chunk_type), (reply::FLAG_DONE, reply::TYPE_BLOCK_STATUS));
    let extents: Vec<(u32, u32)> = payload[4..]
        .chunks(8)
        .map(|d| {
            (u32::from_be_bytes(d[0..4].try_into().unwrap()), u32::from_be_bytes(d[4..8].try_into().unwrap()))
        })
        .collect();
    assert_eq!(extents, vec![(8192, 3), (4096, 0), (4096, 3), (4096, 2), (45056, 3)]);
    c.send_request(cmd::BLOCK_STATUS, cflag::REQ_ONE, 6, 100, 65536, &[]).await;
    let Reply::Chunk { payload, .. } = c.read_reply().await else { panic!() };
    assert_eq!(payload.len(), 12);
    assert_eq!(u32::from_be_bytes(payload[4..8].try_into().unwrap()), 8092);
    // Zero-length and out-of-range block status are EINVAL.
    c.send_request(cmd::BLOCK_STATUS, 0, 7, 0, 0, &[]).await;
    assert_eq!(c.read_reply().await.error(), EINVAL);
    c.send_request(cmd::BLOCK_STATUS, 0, 8, crate::common::DISK_BYTES, 1, &[]).await;
    assert_eq!(c.read_reply().await.error(), EINVAL);
    // Out-of-range read in structured mode: an error chunk, never a simple reply.
    c.send_request(cmd::READ, 0, 9, crate::common::DISK_BYTES, 1, &[]).await;
    assert!(matches!(c.read_reply().await, Reply::Chunk { chunk_type: reply::TYPE_ERROR, .. }));
}

#[tokio::test]
async fn block_status_needs_the_context_for_the_same_export() {
    let fx = fixture();
    let mut c = connect(&fx.server);
    c.greet(3).await;
    c.send_option(stria_nbd::proto::opt::STRUCTURED_REPLY, &[]).await;
    c.read_option_reply().await;
    c.send_option(
        stria_nbd::proto::opt::SET_META_CONTEXT,
        &crate::common::meta_data("ro", &["base:allocation"]),
    )
    .await;
    c.read_option_replies().await;
    c.send_option(stria_nbd::proto::opt::GO, &crate::common::info_data("disk", &[])).await;
    c.read_option_replies().await;
    c.send_request(cmd::BLOCK_STATUS, 0, 1, 0, 4096, &[]).await;
    assert_eq!(c.read_reply().await.error(), EINVAL);
}

#[tokio::test]
async fn multi_conn_flush_and_visibility() {
    let fx = fixture();
    let mut a = connect(&fx.server);
    let mut b = connect(&fx.server);
    a.handshake("disk", true, false).await;
    b.handshake("disk", true, false).await;
    a.send_request(cmd::WRITE, 0, 1, 0, 3, b"abc").await;
    assert_eq!(a.read_reply().await.error(), 0);
    let flushes = fx.disk.flush_count();
    b.send_request(cmd::FLUSH, 0, 2, 0, 0, &[]).await;
    assert_eq!(b.read_reply().await.error(), 0);
    assert_eq!(fx.disk.flush_count(), flushes + 1);
    b.send_request(cmd::READ, 0, 3, 0, 3, &[]).await;
    let Reply::Chunk { payload, .. } = b.read_reply().await else { panic!() };
    assert_eq!(&payload[8..], b"abc");
}
