//! Option haggling against `MemExport`s over an in-memory pipe.
#![allow(clippy::cast_possible_truncation)] // test inputs are small, known sizes

use crate::common::{connect, fixture, info_data, meta_data};
use stria_nbd::proto::{self, info, opt, rep, tflag};

#[tokio::test]
async fn go_reports_size_flags_name_description_and_block_sizes() {
    let fx = fixture();
    let mut client = connect(&fx.server);
    client.greet(proto::CLIENT_FIXED_NEWSTYLE).await;
    client.send_option(opt::STRUCTURED_REPLY, &[]).await;
    assert_eq!(client.read_option_reply().await.reply_type, rep::ACK);
    client
        .send_option(opt::INFO, &info_data("disk", &[info::NAME, info::DESCRIPTION, info::BLOCK_SIZE]))
        .await;
    let replies = client.read_option_replies().await;
    assert_eq!(replies.last().unwrap().reply_type, rep::ACK);
    let by_type =
        |t: u16| replies.iter().find(|r| r.reply_type == rep::INFO && r.data[0..2] == t.to_be_bytes());
    let export = by_type(info::EXPORT).unwrap();
    assert_eq!(u64::from_be_bytes(export.data[2..10].try_into().unwrap()), crate::common::DISK_BYTES);
    let flags = u16::from_be_bytes(export.data[10..12].try_into().unwrap());
    for flag in [
        tflag::HAS_FLAGS,
        tflag::SEND_FLUSH,
        tflag::SEND_FUA,
        tflag::SEND_TRIM,
        tflag::SEND_WRITE_ZEROES,
        tflag::SEND_FAST_ZERO,
        tflag::SEND_DF,
        tflag::SEND_CACHE,
        tflag::CAN_MULTI_CONN,
    ] {
        assert_ne!(flags & flag, 0, "flag {flag:#x} missing from {flags:#x}");
    }
    assert_eq!(flags & tflag::READ_ONLY, 0);
    assert_eq!(&by_type(info::NAME).unwrap().data[2..], b"disk");
    assert_eq!(&by_type(info::DESCRIPTION).unwrap().data[2..], b"test disk");
    let sizes = &by_type(info::BLOCK_SIZE).unwrap().data[2..];
    assert_eq!(u32::from_be_bytes(sizes[0..4].try_into().unwrap()), 1);
    assert_eq!(u32::from_be_bytes(sizes[4..8].try_into().unwrap()), 4096);
    assert_eq!(u32::from_be_bytes(sizes[8..12].try_into().unwrap()), 4 << 20);
    // INFO does not end the handshake: GO still works.
    client.send_option(opt::GO, &info_data("disk", &[])).await;
    assert_eq!(client.read_option_replies().await.last().unwrap().reply_type, rep::ACK);
}

#[tokio::test]
async fn read_only_export_advertises_read_only_and_no_write_features() {
    let fx = fixture();
    let mut client = connect(&fx.server);
    let (_, flags) = client.handshake("ro", false, false).await;
    assert_ne!(flags & tflag::READ_ONLY, 0);
    assert_eq!(flags & (tflag::SEND_TRIM | tflag::SEND_WRITE_ZEROES | tflag::SEND_DF), 0);
}

#[tokio::test]
async fn unknown_options_are_refused_and_parsing_goes_on() {
    let fx = fixture();
    let mut client = connect(&fx.server);
    client.greet(proto::CLIENT_FIXED_NEWSTYLE).await;
    client.send_option(4242, b"some bytes the server must skip").await;
    let reply = client.read_option_reply().await;
    assert_eq!((reply.option, reply.reply_type), (4242, rep::ERR_UNSUP));
    client.send_option(opt::LIST, b"data").await;
    assert_eq!(client.read_option_reply().await.reply_type, rep::ERR_INVALID);
    client.send_option(opt::LIST, &[]).await;
    let replies = client.read_option_replies().await;
    let names: Vec<String> = replies
        .iter()
        .filter(|r| r.reply_type == rep::SERVER)
        .map(|r| {
            let len = u32::from_be_bytes(r.data[0..4].try_into().unwrap()) as usize;
            String::from_utf8(r.data[4..4 + len].to_vec()).unwrap()
        })
        .collect();
    assert_eq!(names, ["bad", "disk", "ro", "slowzero"]);
    client.send_option(opt::ABORT, &[]).await;
    assert_eq!(client.read_option_reply().await.reply_type, rep::ACK);
    assert!(client.is_closed().await);
}

#[tokio::test]
async fn unknown_and_ambiguous_default_exports_are_refused_with_a_message() {
    let fx = fixture();
    let mut client = connect(&fx.server);
    client.greet(proto::CLIENT_FIXED_NEWSTYLE).await;
    client.send_option(opt::GO, &info_data("nope", &[])).await;
    assert_eq!(client.read_option_reply().await.reply_type, rep::ERR_UNKNOWN);
    client.send_option(opt::GO, &info_data("", &[])).await;
    let reply = client.read_option_reply().await;
    assert_eq!(reply.reply_type, rep::ERR_UNKNOWN);
    assert!(String::from_utf8_lossy(&reply.data).contains("no default export"));
    // With one export left, the empty name means that one.
    for name in ["ro", "bad", "slowzero"] {
        fx.exports.remove(name);
    }
    client.send_option(opt::GO, &info_data("", &[info::NAME])).await;
    let replies = client.read_option_replies().await;
    assert_eq!(replies.last().unwrap().reply_type, rep::ACK);
    assert!(replies.iter().any(|r| r.data[0..2] == info::NAME.to_be_bytes() && &r.data[2..] == b"disk"));
}

#[tokio::test]
async fn export_name_option_enters_transmission_with_or_without_zeroes() {
    let fx = fixture();
    for (client_flags, padding) in [(proto::CLIENT_FIXED_NEWSTYLE, 124), (3, 0)] {
        let mut client = connect(&fx.server);
        client.greet(client_flags).await;
        client.send_option(opt::EXPORT_NAME, b"disk").await;
        let reply = client.read_exact_data(10 + padding).await;
        assert_eq!(u64::from_be_bytes(reply[0..8].try_into().unwrap()), crate::common::DISK_BYTES);
        client.send_request(proto::cmd::FLUSH, 0, 1, 0, 0, &[]).await;
        assert_eq!(client.read_reply().await, crate::common::Reply::Simple { cookie: 1, error: 0 });
    }
    // Unknown export: the option cannot fail, so the connection closes.
    let mut client = connect(&fx.server);
    client.greet(proto::CLIENT_FIXED_NEWSTYLE).await;
    client.send_option(opt::EXPORT_NAME, b"nope").await;
    assert!(client.is_closed().await);
}

#[tokio::test]
async fn bad_client_flags_and_non_fixed_newstyle_are_refused() {
    let fx = fixture();
    for flags in [0u32, 1 << 5] {
        let mut client = connect(&fx.server);
        client.greet(flags).await;
        assert!(client.is_closed().await, "client flags {flags:#x} accepted");
    }
}

#[tokio::test]
async fn option_limits_close_the_connection() {
    let fx = fixture();
    // Option payload over the limit.
    let mut client = connect(&fx.server);
    client.greet(proto::CLIENT_FIXED_NEWSTYLE).await;
    let mut header = proto::IHAVEOPT.to_be_bytes().to_vec();
    header.extend_from_slice(&opt::GO.to_be_bytes());
    header.extend_from_slice(&u32::MAX.to_be_bytes());
    tokio::io::AsyncWriteExt::write_all(&mut client.stream, &header).await.unwrap();
    assert!(client.is_closed().await);
    // Bad option magic.
    let mut client = connect(&fx.server);
    client.greet(proto::CLIENT_FIXED_NEWSTYLE).await;
    tokio::io::AsyncWriteExt::write_all(&mut client.stream, &[0x55; 16]).await.unwrap();
    assert!(client.is_closed().await);
    // A name longer than 4096 bytes is invalid, and the handshake goes on.
    let mut client = connect(&fx.server);
    client.greet(proto::CLIENT_FIXED_NEWSTYLE).await;
    client.send_option(opt::GO, &info_data(&"x".repeat(5000), &[])).await;
    assert_eq!(client.read_option_reply().await.reply_type, rep::ERR_INVALID);
    client.send_option(opt::GO, &info_data("disk", &[])).await;
    assert_eq!(client.read_option_replies().await.last().unwrap().reply_type, rep::ACK);
}

#[tokio::test]
async fn meta_contexts_list_and_set() {
    let fx = fixture();
    let mut client = connect(&fx.server);
    client.greet(proto::CLIENT_FIXED_NEWSTYLE).await;
    // Before structured replies: invalid.
    client.send_option(opt::SET_META_CONTEXT, &meta_data("disk", &["base:allocation"])).await;
    assert_eq!(client.read_option_reply().await.reply_type, rep::ERR_INVALID);
    client.send_option(opt::STRUCTURED_REPLY, &[]).await;
    assert_eq!(client.read_option_reply().await.reply_type, rep::ACK);
    // Listing everything, the base: wildcard, and unknown namespaces.
    for (queries, expect) in [(&[][..], 1), (&["base:"][..], 1), (&["qemu:dirty-bitmap:a"][..], 0)] {
        client.send_option(opt::LIST_META_CONTEXT, &meta_data("disk", queries)).await;
        let replies = client.read_option_replies().await;
        assert_eq!(replies.len(), expect + 1, "{queries:?}: {replies:?}");
        if expect == 1 {
            assert_eq!(&replies[0].data[4..], b"base:allocation");
        }
    }
    // SET: base: is ignored; base:allocation is selected with a nonzero id.
    client.send_option(opt::SET_META_CONTEXT, &meta_data("disk", &["base:"])).await;
    assert_eq!(client.read_option_replies().await.len(), 1);
    client.send_option(opt::SET_META_CONTEXT, &meta_data("nope", &["base:allocation"])).await;
    assert_eq!(client.read_option_reply().await.reply_type, rep::ERR_UNKNOWN);
    client.send_option(opt::SET_META_CONTEXT, &meta_data("disk", &["base:allocation", "x-y:z"])).await;
    let replies = client.read_option_replies().await;
    assert_eq!(replies[0].reply_type, rep::META_CONTEXT);
    assert_eq!(u32::from_be_bytes(replies[0].data[0..4].try_into().unwrap()), proto::BASE_ALLOCATION_ID);
    // Malformed query counts are invalid.
    let mut bad = meta_data("disk", &[]);
    bad.truncate(bad.len() - 4);
    bad.extend_from_slice(&1000u32.to_be_bytes());
    client.send_option(opt::LIST_META_CONTEXT, &bad).await;
    assert_eq!(client.read_option_reply().await.reply_type, rep::ERR_INVALID);
}

#[tokio::test]
async fn starttls_is_refused_by_policy_when_tls_is_off() {
    let fx = fixture();
    let mut client = connect(&fx.server);
    client.greet(proto::CLIENT_FIXED_NEWSTYLE).await;
    client.send_option(opt::STARTTLS, &[]).await;
    assert_eq!(client.read_option_reply().await.reply_type, rep::ERR_POLICY);
    client.send_option(opt::GO, &info_data("disk", &[])).await;
    assert_eq!(client.read_option_replies().await.last().unwrap().reply_type, rep::ACK);
}
