//! Entry points for the fuzzer (fuzz/fuzz_targets/iscsi_*.rs) and for the corpus replay tests
//! (tests/fuzz_corpus.rs). Not part of the stable API.
//!
//! [`parsers`] runs the text-key parser, the login negotiation and the command layer's CDB
//! sizing on any bytes; [`session`] plays bytes as everything an initiator sends on one
//! connection against a real target connection over an in-memory pipe, with a memory volume
//! behind it.

use std::sync::Arc;
use std::time::Duration;

use stria_front::Registry;
use stria_volume::BlockVolume;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::login::{Login, Offer, Step};
use crate::pdu::{self, Digests};
use crate::scsi::LogicalUnit;
use crate::target::{Target, TargetConfig};
use crate::testing::MemVolume;
use crate::text;

/// The pool name the fuzzed target uses: its volume `v` is `iqn.2026-11.io.stria:p:v`.
pub const POOL: &str = "p";

/// Runs the parsers on `data` and checks their invariants.
pub fn parsers(data: &[u8]) {
    if let Ok(pairs) = text::parse(data) {
        assert_eq!(text::parse(&text::encode(&pairs)).as_ref(), Ok(&pairs), "text does not re-encode");
    }
    // The bytes as a CDB: sizing never panics and never asks for more than the transfer bound
    // allows, for the CDBs the layer accepts.
    let _ = LogicalUnit::data_out_bytes(data);
    // The bytes as a run of login requests.
    let runtime = tokio::runtime::Builder::new_current_thread().build().expect("a runtime");
    runtime.block_on(async {
        let mut login = Login::new(Offer::default(), 32);
        let mut rd = data;
        for _ in 0..16 {
            let Ok(req) = pdu::read_pdu(&mut rd, Digests::default(), text::TEXT_MAX_BYTES).await else {
                break;
            };
            match login.step(&req, |name| name.ends_with(":v"), || 1) {
                Step::Continue(bhs, _) => assert_eq!(bhs.opcode(), pdu::op::LOGIN_RESPONSE),
                Step::Done(bhs, _) => {
                    assert_eq!(bhs.opcode(), pdu::op::LOGIN_RESPONSE);
                    let p = login.params();
                    assert!(p.first_burst <= p.max_burst && p.max_burst <= Offer::default().max_burst);
                    break;
                }
                Step::Fail(bhs) => {
                    assert_ne!(bhs.u16_at(36), 0, "a failed login answered success");
                    break;
                }
            }
        }
    });
}

/// Plays `data` as an initiator's byte stream against one target connection and reads what the
/// target sends until it closes. Panics if the target panics or hangs.
pub fn session(data: &[u8]) {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    runtime.block_on(async {
        let registry = Arc::new(Registry::new());
        registry.insert("v", Arc::new(MemVolume::new(false)) as Arc<dyn BlockVolume>);
        let config = TargetConfig {
            pool: POOL.into(),
            login_timeout: Duration::from_secs(5),
            ..TargetConfig::default()
        };
        let target = Target::new(registry, config);
        let (client, server) = tokio::io::duplex(256 * 1024);
        let task = tokio::spawn(crate::conn::run(target, server, "fuzz".into(), "127.0.0.1:3260".into()));
        let (mut rd, mut wr) = tokio::io::split(client);
        let bytes = data.to_vec();
        let writer = tokio::spawn(async move {
            let _ = wr.write_all(&bytes).await;
            let _ = wr.shutdown().await;
        });
        let reader = async {
            let mut buf = vec![0; 64 * 1024];
            while let Ok(n) = rd.read(&mut buf).await {
                if n == 0 {
                    break;
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(20), reader).await.expect("the target hung");
        let _ = writer.await;
        let _ = task.await.expect("the connection task panicked");
    });
}
