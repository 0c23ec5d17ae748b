//! Entry points for the fuzzer (fuzz/fuzz_targets/slice_*.rs) and for the corpus replay tests.
//! Not part of the stable API.
//!
//! [`parsers`] runs the header parsers on any bytes and checks their invariants; [`session`]
//! plays bytes as everything a client sends on one connection against a real server
//! connection over an in-memory pipe, with two small memory slices behind it.

use std::sync::Arc;

use stria_dev::BLOCK_BYTES;
use stria_dev::mem::MemDevice;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::server::{SliceSet, serve_connection};
use crate::slice::{Slice, SliceHeader};
use crate::wire::{MAX_IO_BYTES, Op, REPLY_BYTES, REQUEST_BYTES, Reply, Request};

/// Runs the request, reply and slice-header parsers on `data` and asserts their invariants.
pub fn parsers(data: &[u8]) {
    let mut head = [0u8; REQUEST_BYTES];
    let n = data.len().min(REQUEST_BYTES);
    head[..n].copy_from_slice(&data[..n]);
    if let Ok(req) = Request::parse(&head) {
        assert_eq!(req.encode(), head, "an accepted request re-encodes to other bytes");
        assert!(req.offset.is_multiple_of(BLOCK_BYTES));
        assert!(u64::from(req.len).is_multiple_of(BLOCK_BYTES) && req.len <= MAX_IO_BYTES);
        assert_eq!(req.len > 0, matches!(req.op, Op::Read | Op::Write | Op::Discard));
        assert!(!req.fua || req.op == Op::Write);
    }
    let mut reply = [0u8; REPLY_BYTES];
    let n = data.len().min(REPLY_BYTES);
    reply[..n].copy_from_slice(&data[..n]);
    if let Ok(r) = Reply::parse(&reply) {
        assert_eq!(r.encode(), reply, "an accepted reply re-encodes to other bytes");
        assert!(r.len <= MAX_IO_BYTES);
    }
    if let Ok(h) = SliceHeader::decode(data) {
        assert_eq!(SliceHeader::decode(&h.encode()), Ok(h));
    }
}

/// Plays `data` as a client's byte stream against one server connection and reads every reply
/// until the server closes. Panics if the server panics, hangs, or answers with a reply it
/// cannot parse itself.
pub fn session(data: &[u8]) {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    runtime.block_on(async {
        let mut slices = Vec::new();
        for id in 0..2 {
            let dev = MemDevice::new(&format!("slice-{id}"), 16 * BLOCK_BYTES);
            slices.push(Slice::format(id, dev).await.expect("format"));
        }
        let slices = Arc::new(SliceSet::new(slices));
        let (client, server) = tokio::io::duplex(64 * 1024);
        let task = tokio::spawn(serve_connection(server, slices));
        let (mut rd, mut wr) = tokio::io::split(client);
        let bytes = data.to_vec();
        let writer = tokio::spawn(async move {
            let _ = wr.write_all(&bytes).await;
            let _ = wr.shutdown().await;
        });
        let reader = async {
            loop {
                let mut head = [0u8; REPLY_BYTES];
                if rd.read_exact(&mut head).await.is_err() {
                    break;
                }
                let reply = Reply::parse(&head).expect("the server sent a reply it cannot parse");
                let mut payload = vec![0u8; reply.len as usize];
                if rd.read_exact(&mut payload).await.is_err() {
                    break;
                }
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(10), reader).await.expect("the server hung");
        let _ = writer.await;
        let _ = task.await.expect("the server task panicked");
    });
}
