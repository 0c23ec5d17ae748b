//! Partial-stripe writes that find a drive's journal ring full (docs/crash-consistency.md,
//! fault 21): a ring is checkpointed only past transactions applied in place, so one
//! transaction whose in-place write does not return keeps every ring it has a record in from
//! being released, and the writers behind it must wait for room, not fail; and a member that
//! fails while they wait is never checkpointed again, so they must leave it out.
//!
//! The drives hold the in-place writes of one transaction (writes to their data areas while the
//! test catches them), as a thread descheduled between its journal append and its in-place write,
//! or a slow drive, holds them. Tokio's clock is paused: every wait passes in virtual time.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use stria_dev::mem::MemDevice;
use stria_dev::{BlockDevice, HoldWrites, IoBytes};

use crate::format::layout::DriveLayout;
use crate::{DriveClass, Layout, NewDrive, Pool, Volume, VolumeRole, VolumeSpec};

const DRIVE_BYTES: u64 = 48 << 20;
const VOLUME_BYTES: u64 = 1 << 20;
const CHUNK_BYTES: u64 = 16 << 10;
/// One row of the ec:2+1 volume: two data chunks.
const ROW_BYTES: u64 = 2 * CHUNK_BYTES;
/// Writes behind the held transaction: each journals a record of two blocks on each of the two
/// drives the held one has records on, so their rings (4 MiB: about 1,020 blocks) fill after
/// about 500.
const WRITES: u64 = 800;

type Dev = Arc<HoldWrites<MemDevice>>;

/// The block written at `offset` by write `n`.
fn block(n: u64) -> Vec<u8> {
    let mut b = vec![(n % 251) as u8; 4096];
    b[..8].copy_from_slice(&n.to_le_bytes());
    b
}

struct Rig {
    pool: Arc<Pool<Dev>>,
    vol: Arc<Volume<Dev>>,
    devs: Vec<Dev>,
    /// The slots of the held transaction's two drives.
    held_slots: Vec<u32>,
    /// Offsets (first block of a row's first chunk) whose writes journal on exactly those drives.
    offsets: Vec<u64>,
    /// The held write's task.
    held: Option<tokio::task::JoinHandle<()>>,
}

impl Rig {
    /// An ec:2+1 volume on three drives, with one partial-stripe write (at offset 0) journaled
    /// and held in place on both its drives.
    async fn with_a_held_transaction() -> Rig {
        let devs: Vec<Dev> = (0..3)
            .map(|i| Arc::new(HoldWrites::new(MemDevice::new(&format!("d{i}"), DRIVE_BYTES))))
            .collect();
        let new_drive = |d: &Dev| NewDrive {
            dev: Arc::clone(d),
            path: d.name().to_string(),
            class: DriveClass::Capacity,
            domain: d.name().to_string(),
            fresh: true,
        };
        let pool = Pool::create("t", devs.iter().map(new_drive).collect()).await.expect("create pool");
        let spec = VolumeSpec {
            name: "v".into(),
            size_bytes: VOLUME_BYTES,
            layout: Layout::Ec { data_shards: 2, parity_shards: 1 },
            chunk_bytes: CHUNK_BYTES,
            class: DriveClass::Capacity,
            role: VolumeRole::Plain,
        };
        let vol = pool.create_volume(spec).await.expect("create volume");
        let pool = Arc::new(pool);
        let slots_of = |offset: u64| -> Vec<u32> {
            let mut s: Vec<u32> = vol.locate(offset).expect("locate").iter().map(|l| l.slot).collect();
            s.sort_unstable();
            s
        };
        let held_slots = slots_of(0);
        assert_eq!(held_slots.len(), 2, "a 4 KiB write of ec:2+1 has a data and a parity piece");
        let offsets: Vec<u64> = (1..VOLUME_BYTES / ROW_BYTES)
            .map(|r| r * ROW_BYTES)
            .filter(|&o| slots_of(o) == held_slots)
            .collect();
        assert!(offsets.len() >= 4, "rows whose first chunk and parity lie on the held drives: {offsets:?}");

        // The in-place writes: those to the data areas.
        let data_offset_bytes = DriveLayout::for_new_drive(DRIVE_BYTES).expect("layout").data_offset_bytes;
        for d in &devs {
            d.hold(move |offset_bytes, _, _| offset_bytes >= data_offset_bytes);
        }
        let held = {
            let vol = Arc::clone(&vol);
            tokio::spawn(async move {
                vol.write(0, IoBytes::copy_from(&block(u64::MAX)), true).await.expect("held write")
            })
        };
        while devs.iter().map(|d| d.held()).sum::<u64>() < 2 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        for d in &devs {
            d.stop_holding();
        }
        let slot_of =
            |d: &Dev| pool.meta().drives.iter().find(|m| m.path_hint == d.name()).expect("drive").slot;
        let mut caught: Vec<u32> = devs.iter().filter(|d| d.held() > 0).map(slot_of).collect();
        caught.sort_unstable();
        assert_eq!(caught, held_slots, "the held in-place writes are the write's data and parity pieces");
        Rig { pool, vol, devs, held_slots, offsets, held: Some(held) }
    }

    /// Starts a writer of [`WRITES`] blocks at the rows that journal on the held drives; it
    /// counts the writes done in the counter returned beside it and returns the first error.
    fn writer(&self) -> (tokio::task::JoinHandle<Result<(), String>>, Arc<AtomicU64>) {
        let done = Arc::new(AtomicU64::new(0));
        let (vol, offsets, count) = (Arc::clone(&self.vol), self.offsets.clone(), Arc::clone(&done));
        let writer = tokio::spawn(async move {
            for n in 0..WRITES {
                let at = offsets[(n as usize) % offsets.len()];
                vol.write(at, IoBytes::copy_from(&block(n)), true)
                    .await
                    .map_err(|e| format!("write {n}: {e}"))?;
                count.store(n + 1, Ordering::SeqCst);
            }
            Ok(())
        });
        (writer, done)
    }

    /// Starts the writer and waits (in virtual time) until it has stopped advancing for a
    /// second, which must be once the held transaction's rings are full; returns it, its
    /// counter and the writes it did.
    async fn stalled_writer(&self) -> (tokio::task::JoinHandle<Result<(), String>>, Arc<AtomicU64>, u64) {
        let (writer, done) = self.writer();
        let mut last = u64::MAX;
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let now = done.load(Ordering::SeqCst);
            if now == last {
                break;
            }
            last = now;
        }
        assert!(
            (100..WRITES).contains(&last),
            "the writer stops once the held transaction's rings are full (after {last} writes)"
        );
        (writer, done, last)
    }

    /// Lets the held transaction's writes go on, and waits for its write to finish.
    async fn release(&mut self) {
        for d in &self.devs {
            d.release();
        }
        if let Some(held) = self.held.take() {
            held.await.expect("held write task");
        }
    }

    /// Every offset reads back as the last write to it, and offset 0 as the held write.
    async fn read_back(&self) {
        let got = self.vol.read(0, 4096).await.expect("read the held write's block");
        assert_eq!(&got[..], &block(u64::MAX)[..], "the held write is in place once released");
        for (i, &at) in self.offsets.iter().enumerate() {
            let last = (0..WRITES).rev().find(|n| (*n as usize) % self.offsets.len() == i).expect("written");
            let got = self.vol.read(at, 4096).await.expect("read back");
            assert_eq!(&got[..8], &last.to_le_bytes(), "offset {at} reads back its last write");
            assert_eq!(&got[..], &block(last)[..], "offset {at}");
        }
    }
}

/// A transaction that stays unapplied for seconds (here: its in-place writes held) keeps the
/// rings it is in full; the writers behind it wait and finish once it is applied. (They gave up
/// with EIO after 64 quick retries before: a few milliseconds on a loaded machine.)
#[tokio::test(start_paused = true)]
async fn writers_behind_a_slow_transaction_wait_for_journal_room_instead_of_failing() {
    let mut rig = Rig::with_a_held_transaction().await;
    let (writer, done, stalled) = rig.stalled_writer().await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(!writer.is_finished(), "the writer waits while the transaction is held");
    assert_eq!(done.load(Ordering::SeqCst), stalled);
    rig.release().await;
    writer.await.expect("writer task").expect("every write behind the held transaction succeeds");
    rig.read_back().await;
}

/// A member that fails while a writer waits for its ring to have room is left out of the retry:
/// flushes leave failed drives out, so its ring is never checkpointed again and stays full. (The
/// retry kept appending to it before, and the write failed after 30 s with "journal stayed full".)
#[tokio::test(start_paused = true)]
async fn a_member_that_fails_while_writers_wait_for_journal_room_is_left_out_of_their_retries() {
    let mut rig = Rig::with_a_held_transaction().await;
    let (writer, _, _) = rig.stalled_writer().await;
    // The parity piece's drive or the data piece's: either way the rest of the stripe is there.
    let failing = rig.held_slots[1];
    rig.pool.fail_drive(failing, "test").await.expect("fail a drive of the full rings");
    rig.release().await;
    writer.await.expect("writer task").expect("the writes go on without the failed member");
    rig.read_back().await;
}

/// The wait is bounded: a transaction that is never applied (a drive whose writes never return)
/// fails the writers behind it after 30 s with an error that says so.
#[tokio::test(start_paused = true)]
async fn a_transaction_never_applied_fails_the_writers_behind_it_after_the_bound() {
    let mut rig = Rig::with_a_held_transaction().await;
    let start = tokio::time::Instant::now();
    let (writer, _) = rig.writer();
    let err = writer.await.expect("writer task").expect_err("the writer gives up");
    assert!(err.contains("journal stayed full"), "the error says why: {err}");
    let waited = start.elapsed();
    assert!(
        (super::JOURNAL_FULL_WAIT..super::JOURNAL_FULL_WAIT * 2).contains(&waited),
        "it gave up after the bound: {waited:?}"
    );
    rig.release().await;
    // Once the transaction is applied the volume takes writes again.
    rig.vol.write(rig.offsets[0], IoBytes::copy_from(&block(7)), true).await.expect("write after");
}
