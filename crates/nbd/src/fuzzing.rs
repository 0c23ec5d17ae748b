//! Entry points for the fuzzer and for the corpus replay tests. Not part of the stable API.
//!
//! [`parsers`] drives the pure parsers in [`crate::wire`] and checks their invariants;
//! [`session`] plays bytes as a whole client stream against a real server connection (handshake
//! and transmission) over an in-memory pipe, against a small [`MemExport`].

use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::config::{Limits, ServerConfig};
use crate::export::ExportMap;
use crate::mem::MemExport;
use crate::server::Server;
use crate::wire::{self, Command, SessionParams};

fn u32_at(data: &[u8], at: usize) -> u32 {
    let mut bytes = [0u8; 4];
    for (index, byte) in bytes.iter_mut().enumerate() {
        *byte = data.get(at + index).copied().unwrap_or(0);
    }
    u32::from_be_bytes(bytes)
}

/// Runs the option, request and extent parsers on `data` and asserts their invariants.
pub fn parsers(data: &[u8]) {
    let Some((&selector, rest)) = data.split_first() else { return };
    match selector % 3 {
        0 => {
            let option = u32_at(rest, 0);
            let payload = rest.get(4..).unwrap_or(&[]);
            if let Ok(parsed) = wire::parse_option(option % 16, payload) {
                check_option(&parsed);
            }
            if let Ok(header) = <&[u8; 16]>::try_from(&rest[..rest.len().min(16)]) {
                let _ = wire::parse_option_header(header);
            }
        }
        1 => {
            let mut header_bytes = [0u8; wire::REQUEST_HEADER_BYTES];
            let take = rest.len().min(wire::REQUEST_HEADER_BYTES);
            header_bytes[..take].copy_from_slice(&rest[..take]);
            header_bytes[0..4].copy_from_slice(&crate::proto::REQUEST_MAGIC.to_be_bytes());
            let header = wire::parse_request_header(&header_bytes).expect("magic was set");
            let tail = rest.get(wire::REQUEST_HEADER_BYTES..).unwrap_or(&[]);
            let size_bytes = u64::from(u32_at(tail, 0)) << (tail.first().copied().unwrap_or(0) % 33);
            let session = SessionParams {
                size_bytes,
                read_only: tail.get(4).is_some_and(|b| b & 1 != 0),
                structured: tail.get(4).is_some_and(|b| b & 2 != 0),
                block_status: tail.get(4).is_some_and(|b| b & 4 != 0),
                max_payload_bytes: 32 << 20,
            };
            let _ = wire::request_payload_bytes(&header, session.max_payload_bytes);
            if let Ok(command) = wire::check_request(&header, &session) {
                check_command(&command, &session);
            }
        }
        _ => {
            let len_bytes = u32_at(rest, 0);
            let extents: Vec<crate::Extent> = rest
                .get(4..)
                .unwrap_or(&[])
                .chunks(5)
                .map(|chunk| crate::Extent {
                    len_bytes: u32_at(chunk, 0),
                    hole: chunk.get(4).is_some_and(|b| b & 1 != 0),
                    zero: chunk.get(4).is_some_and(|b| b & 2 != 0),
                })
                .collect();
            let req_one = len_bytes & 1 != 0;
            let len_bytes = len_bytes.max(1);
            let out = wire::normalize_extents(&extents, len_bytes, req_one, 16);
            assert!(!out.is_empty() && out.len() <= if req_one { 1 } else { 16 });
            assert!(out.iter().all(|extent| extent.len_bytes > 0));
            let total: u64 = out.iter().map(|extent| u64::from(extent.len_bytes)).sum();
            assert!(total <= u64::from(len_bytes));
            let mut encoded = Vec::new();
            wire::encode_block_status(&mut encoded, 7, 1, &out);
            assert_eq!(encoded.len(), wire::CHUNK_HEADER_BYTES + 4 + 8 * out.len());
        }
    }
}

fn check_option(parsed: &wire::ClientOption) {
    let strings: Vec<&String> = match parsed {
        wire::ClientOption::ExportName(name) => vec![name],
        wire::ClientOption::Info(request) | wire::ClientOption::Go(request) => vec![&request.name],
        wire::ClientOption::ListMetaContext(request) | wire::ClientOption::SetMetaContext(request) => {
            std::iter::once(&request.export_name).chain(request.queries.iter()).collect()
        }
        _ => Vec::new(),
    };
    for text in strings {
        assert!(text.len() <= crate::proto::MAX_STRING_BYTES && !text.contains('\0'));
    }
}

fn check_command(command: &Command, session: &SessionParams) {
    let range = match *command {
        Command::Read { offset_bytes, len_bytes } => {
            assert!(len_bytes <= session.max_payload_bytes);
            Some((offset_bytes, len_bytes))
        }
        Command::Write { offset_bytes, len_bytes, .. }
        | Command::Trim { offset_bytes, len_bytes, .. }
        | Command::WriteZeroes { offset_bytes, len_bytes, .. } => {
            assert!(!session.read_only, "write-like command admitted on a read-only export");
            Some((offset_bytes, len_bytes))
        }
        Command::Cache { offset_bytes, len_bytes } => Some((offset_bytes, len_bytes)),
        Command::BlockStatus { offset_bytes, len_bytes, .. } => {
            assert!(session.block_status && len_bytes > 0);
            Some((offset_bytes, len_bytes))
        }
        Command::Disconnect | Command::Flush => None,
    };
    if let Some((offset_bytes, len_bytes)) = range {
        let end = offset_bytes.checked_add(u64::from(len_bytes)).expect("admitted range overflows");
        assert!(end <= session.size_bytes, "admitted range beyond the export");
    }
}

/// Limits small enough that a fuzz input reaches them.
fn fuzz_limits() -> Limits {
    Limits {
        max_requests_in_flight: 4,
        max_in_flight_bytes: 1 << 20,
        max_payload_bytes: 1 << 20,
        max_option_bytes: 16 << 10,
        max_options_per_handshake: 64,
        handshake_timeout: std::time::Duration::from_secs(5),
        shutdown_grace: std::time::Duration::from_secs(1),
        max_extents_per_reply: 8,
        ..Limits::default()
    }
}

/// Plays `data` as everything a client sends on one connection, to a server with a 1 MiB
/// writable export named `disk`, a read-only one named `ro`, and one that fails with EIO; returns
/// what the server sent back. Must never panic or hang.
pub fn session(data: &[u8]) -> Vec<u8> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a current-thread runtime");
    runtime.block_on(async {
        let exports = Arc::new(ExportMap::new());
        exports.insert("disk", Arc::new(MemExport::new(1 << 20))).expect("valid name");
        exports.insert("ro", Arc::new(MemExport::new(1 << 16).with_read_only(true))).expect("valid name");
        exports
            .insert("bad", Arc::new(MemExport::new(1 << 16).with_io_error_range(4096..8192)))
            .expect("valid name");
        let config = ServerConfig { limits: fuzz_limits(), ..ServerConfig::default() };
        let server = Server::new(config, exports).expect("valid config");
        let (client, server_side) = tokio::io::duplex(64 << 10);
        let serve = server.serve_stream(server_side, "fuzz");
        let (mut client_read, mut client_write) = tokio::io::split(client);
        let send = async {
            let _ = client_write.write_all(data).await;
            let _ = client_write.shutdown().await;
        };
        let mut received = Vec::new();
        let receive = async {
            let _ = client_read.read_to_end(&mut received).await;
        };
        tokio::join!(serve, send, receive);
        received
    })
}
