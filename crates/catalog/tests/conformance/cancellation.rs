//! Contract, "Cancellation": callers poll every future to completion; dropping one *half way* may
//! leave a journal batch, an intent bit or a checksum entry half done, so the contract promises
//! nothing about it and this suite does not test it. What it does imply, and what is tested: a
//! request is its future (nothing happens before the first poll), so a future dropped before it
//! was ever polled changes nothing and leaves the volume serving; and a request handed to a task
//! of its own (what a front end does with each client request) completes even when whoever
//! spawned it stops waiting for it.

use std::sync::Arc;
use std::time::Duration;

use stria_dev::{BLOCK_BYTES, IoBytes};
use stria_engine::{BlockVolume, Durability, Zeroing};

use super::{Kind, Subject, Wrap, every_kind};
use crate::common::{random_bytes, rng};

pub async fn clause(kind: Kind, wrap: Wrap) {
    let mut s = Subject::new(kind, 101, wrap).await;
    let size = s.size();
    let unit = s.zero_unit;
    let mut r = rng(101);
    if !kind.read_only() {
        s.write(0, random_bytes(&mut r, (4 * unit) as usize), Durability::Buffered).await;
    }
    // Futures made and dropped without a poll: writes (aligned and not), zeroing, discards,
    // flushes and reads.
    for (o, l) in [(0, BLOCK_BYTES), (unit, unit), (7, 9000), (size - 3, 3)] {
        let data = IoBytes::copy_from(&random_bytes(&mut r, l as usize));
        drop(s.vol.write(o, data, Durability::Fua));
        drop(s.vol.write_zeroes(o, l, Zeroing::ANY, Durability::Fua));
        drop(s.vol.discard(o, l, Durability::Fua));
        drop(s.vol.flush());
        drop(s.vol.read(o, l as usize));
        drop(s.vol.block_status(o, l));
    }
    s.check_all("after futures dropped unpolled").await;

    // Requests on tasks of their own, the spawner gone before they complete.
    if !kind.read_only() {
        let mut expect = Vec::new();
        for i in 0..8u64 {
            let o = i * 3 * BLOCK_BYTES + 3 * i;
            let data = random_bytes(&mut r, (BLOCK_BYTES + i) as usize);
            let vol: Arc<dyn BlockVolume> = Arc::clone(&s.vol);
            let bytes = IoBytes::copy_from(&data);
            drop(tokio::spawn(async move { vol.write(o, bytes, Durability::Buffered).await }));
            expect.push((o, data));
        }
        for (o, data) in expect {
            s.model.write(o, &data);
        }
        // The detached writes finish on their own; wait until all of them show (bounded).
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let got = s.vol.read(0, (24 * BLOCK_BYTES) as usize).await.expect("read");
            if s.model.check(0, &got).is_ok() {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "{kind:?}: detached writes never completed");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    s.vol.flush().await.expect("flush");
    s.check_all("after the detached writes").await;
}

every_kind!(clause);
