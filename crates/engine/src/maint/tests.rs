//! The maintenance services on pools of memory drives under Tokio's paused clock (ticks and
//! retry waits pass in virtual time), and the refusals of the guarded drive workflows.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use stria_dev::{BlockDevice, FaultDevice, HoldWrites, HostSpace, IoBytes};

use super::*;
use crate::{
    DriveClass, EngineError, ErrorKind, Layout, NewDrive, Pool, VolumeRole, VolumeSpec, VolumeState,
};

const DRIVE_BYTES: u64 = 48 << 20;
const VOLUME_BYTES: u64 = 1 << 20;
const CHUNK_BYTES: u64 = 16 << 10;

/// A drive whose writes can be held (to catch a rebuild in the middle of a row), on a host
/// filesystem that the test can fill.
type Dev = Arc<HoldWrites<FaultDevice>>;

fn gated(name: &str, space: &Arc<HostSpace>) -> Dev {
    Arc::new(HoldWrites::new(FaultDevice::new(name, DRIVE_BYTES, 7).with_host_space(Arc::clone(space))))
}

struct Rig {
    pool: Arc<Pool<Dev>>,
    space: Arc<HostSpace>,
}

fn new_drive(dev: &Dev) -> NewDrive<Dev> {
    NewDrive {
        dev: Arc::clone(dev),
        path: dev.name().to_string(),
        class: DriveClass::Capacity,
        domain: String::new(),
        fresh: true,
    }
}

/// A pool of `drives` drives with volume `v` of `layout`, written whole with non-zero bytes.
async fn rig(drives: usize, layout: Layout) -> Rig {
    let space = HostSpace::new();
    let devs: Vec<Dev> = (0..drives).map(|i| gated(&format!("d{i}"), &space)).collect();
    let pool = Pool::create("t", devs.iter().map(new_drive).collect()).await.expect("create pool");
    let spec = VolumeSpec {
        name: "v".into(),
        size_bytes: VOLUME_BYTES,
        layout,
        chunk_bytes: CHUNK_BYTES,
        class: DriveClass::Capacity,
        role: VolumeRole::Plain,
    };
    let vol = pool.create_volume(spec).await.expect("create volume");
    vol.write(0, IoBytes::copy_from(&vec![0xab; VOLUME_BYTES as usize]), true).await.expect("write");
    Rig { pool: Arc::new(pool), space }
}

impl Rig {
    /// Fails the drive in `slot` and replaces it by a new drive; returns the new one.
    async fn fail_and_replace(&self, slot: u32, name: &str) -> Dev {
        fail_drive(&self.pool, slot, false, "test").await.expect("fail");
        let new = gated(name, &self.space);
        let replacing = Replacement::check(&self.pool, slot, false).expect("the guards allow it");
        replacing.run(&self.pool, new_drive(&new)).await.expect("replace");
        assert!(self.pool.rebuild_pending());
        new
    }

    async fn read_back(&self) {
        let data = self.pool.volume("v").expect("v").read(0, VOLUME_BYTES as usize).await.expect("read");
        assert!(data.iter().all(|&b| b == 0xab), "the volume reads back what was written");
    }
}

fn settings() -> Settings {
    Settings { tick: Duration::from_secs(2), retry_after: Duration::from_secs(60), ..Settings::default() }
}

/// Waits (in virtual time) until `done`, for at most `limit`.
async fn until(limit: Duration, mut done: impl FnMut() -> bool) {
    let start = tokio::time::Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "not done after {limit:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Stops the services as the daemon does: ask, close the pool, wait.
async fn stop_and_close(services: Services, pool: &Pool<Dev>) {
    let stopping = services.stop();
    pool.close().await.expect("close");
    stopping.await;
}

#[tokio::test(start_paused = true)]
async fn a_replaced_drive_is_rebuilt_by_the_services() {
    let rig = rig(2, Layout::Raid1 { copies: 2 }).await;
    rig.fail_and_replace(1, "new").await;
    let services = Services::start(Arc::clone(&rig.pool), settings());
    until(Duration::from_secs(30), || !rig.pool.rebuild_pending()).await;
    let activity = services.activity();
    assert_eq!((activity.rebuilds_started, activity.rebuilds_failed), (1, 0), "{activity:?}");
    assert_eq!(rig.pool.volume("v").expect("v").state(), VolumeState::Healthy);
    rig.read_back().await;
    stop_and_close(services, &rig.pool).await;
}

#[tokio::test(start_paused = true)]
async fn a_failed_rebuild_is_retried_after_the_wait() {
    let rig = rig(2, Layout::Raid1 { copies: 2 }).await;
    rig.fail_and_replace(1, "new").await;
    // The host filesystem fills: the rebuild's first write fails and the pool suspends writes.
    rig.space.fill();
    let services = Services::start(Arc::clone(&rig.pool), settings());
    until(Duration::from_secs(30), || services.activity().rebuilds_failed == 1).await;
    let failed_at = tokio::time::Instant::now();
    assert!(rig.pool.suspension().is_some(), "the rebuild met a full filesystem");
    // The operator frees space and clears the suspension; no retry comes before the wait is over.
    rig.space.free();
    rig.pool.clear_suspension().await.expect("clear");
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(services.activity().rebuilds_started, 1, "retried before the wait was over");
    until(Duration::from_secs(120), || !rig.pool.rebuild_pending()).await;
    assert!(failed_at.elapsed() >= Duration::from_secs(58), "retried after {:?}", failed_at.elapsed());
    let activity = services.activity();
    assert_eq!((activity.rebuilds_started, activity.rebuilds_failed), (2, 1), "{activity:?}");
    rig.read_back().await;
    stop_and_close(services, &rig.pool).await;
}

#[tokio::test(start_paused = true)]
async fn stop_waits_for_the_row_in_progress() {
    let rig = rig(2, Layout::Raid1 { copies: 2 }).await;
    let new = rig.fail_and_replace(1, "new").await;
    // One row a second (virtual time), so that the rebuild is caught between rows.
    rig.pool.set_rebuild_rate(CHUNK_BYTES);
    // No housekeeping tick during the rebuild (the first comes at once, before it starts): the
    // first write held is then a rebuild row's, not a tick's intent page.
    let quiet = Settings { tick: Duration::from_secs(3600), ..settings() };
    let services = Services::start(Arc::clone(&rig.pool), quiet);
    let rows_done = || rig.pool.rebuild_progress().first().map_or(0, |p| p.rows_done);
    until(Duration::from_secs(30), || rows_done() >= 2).await;
    new.hold(|_, _, _| true);
    until(Duration::from_secs(30), || new.held() > 0).await;
    let held_at = rows_done();

    let mut stopping = services.stop();
    let pool = Arc::clone(&rig.pool);
    let mut closing = tokio::spawn(async move { pool.close().await });
    let waited = tokio::time::timeout(Duration::from_secs(10), &mut stopping).await;
    assert!(waited.is_err(), "the services stopped while a row was in progress");
    assert!(!closing.is_finished(), "the pool closed while a row was in progress");

    new.release();
    stopping.await;
    (&mut closing).await.expect("the close task").expect("close");
    assert_eq!(rows_done(), held_at + 1, "the row in progress was finished, and no other was started");
    assert!(rig.pool.rebuild_pending(), "the rest of the rebuild is left for the next open");
}

#[tokio::test(start_paused = true)]
async fn housekeeping_goes_on_during_a_rebuild() {
    let rig = rig(2, Layout::Raid1 { copies: 2 }).await;
    let _new = rig.fail_and_replace(1, "new").await;
    // One row a second: the rebuild of 64 rows takes a minute of virtual time.
    rig.pool.set_rebuild_rate(CHUNK_BYTES);
    let services = Services::start(Arc::clone(&rig.pool), settings());
    let rows_done = || rig.pool.rebuild_progress().first().map_or(0, |p| p.rows_done);
    until(Duration::from_secs(30), || rows_done() >= 2).await;
    // A write marks the surviving drive's region; only a tick clears the bit again.
    let vol = rig.pool.volume("v").expect("v");
    vol.write(0, IoBytes::copy_from(&vec![0xab; CHUNK_BYTES as usize]), false).await.expect("write");
    let dirty =
        |slot: u32| rig.pool.status().drives.iter().find(|d| d.id == slot).map_or(0, |d| d.dirty_regions);
    assert!(dirty(0) > 0, "the write marked the surviving drive");
    until(Duration::from_secs(20), || dirty(0) == 0).await;
    assert!(rig.pool.rebuild_pending(), "the bit was cleared while the rebuild ran");
    let stopping = services.stop();
    rig.pool.close().await.expect("close");
    stopping.await;
}

#[tokio::test(start_paused = true)]
async fn stop_between_ticks_needs_no_close() {
    let rig = rig(2, Layout::Raid1 { copies: 2 }).await;
    let services = Services::start(Arc::clone(&rig.pool), settings());
    until(Duration::from_secs(10), || services.activity().ticks >= 2).await;
    services.stop().await;
    rig.read_back().await;
    rig.pool.close().await.expect("close");
}

/// Records the drives the services took out.
#[derive(Debug, Default)]
struct Removed(Mutex<Vec<(u32, String)>>);

impl DriveRemoved for Removed {
    fn drive_removed(&self, slot: u32, path: &str) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        self.0.lock().push((slot, path.to_string()));
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn a_drained_drive_is_moved_off_and_removed() {
    let rig = rig(3, Layout::Raid1 { copies: 2 }).await;
    let victim = rig.pool.meta().volumes[0].segments[0].members[0].slot;
    let empty = (0..3).find(|s| !rig.pool.volume("v").expect("v").uses_drive(*s)).expect("a free drive");
    assert_eq!(start_remove(&rig.pool, victim, 0).await.expect("remove"), Removal::Draining);
    let removed = Arc::new(Removed::default());
    let services = Services::start(Arc::clone(&rig.pool), settings().on_drive_removed(removed.clone()));
    until(Duration::from_secs(60), || services.activity().drives_removed == 1).await;
    assert_eq!(*removed.0.lock(), vec![(victim, format!("d{victim}"))]);
    assert!(rig.pool.meta().drive(victim).is_none(), "drive {victim} is still in the pool");
    assert!(rig.pool.volume("v").expect("v").uses_drive(empty), "the member moved to drive {empty}");
    let activity = services.activity();
    assert_eq!((activity.moves_started, activity.moves_failed), (1, 0), "{activity:?}");
    rig.read_back().await;
    stop_and_close(services, &rig.pool).await;
}

#[tokio::test]
async fn a_drive_that_holds_nothing_is_removed_at_once() {
    let rig = rig(3, Layout::Raid1 { copies: 2 }).await;
    let empty = (0..3).find(|s| !rig.pool.volume("v").expect("v").uses_drive(*s)).expect("a free drive");
    assert_eq!(start_remove(&rig.pool, empty, 0).await.expect("remove"), Removal::Empty);
    assert_eq!(take_out(&rig.pool, empty).await.expect("take out"), format!("d{empty}"));
    assert!(rig.pool.meta().drive(empty).is_none());
    rig.pool.close().await.expect("close");
}

/// The refusal inside `e`, after checking its kind and its message.
fn refusal(e: EngineError, message: &str) -> Refusal {
    assert_eq!(e.kind(), ErrorKind::Conflict, "{e}");
    assert_eq!(e.to_string(), message);
    match e {
        EngineError::Refused(r) => r,
        e => panic!("not a refusal: {e:?}"),
    }
}

#[tokio::test]
async fn failing_the_last_copy_is_refused_unless_forced() {
    // Three drives, so that one is left to commit the metadata once both copies are failed.
    let rig = rig(3, Layout::Raid1 { copies: 2 }).await;
    let members: Vec<u32> = rig.pool.meta().volumes[0].segments[0].members.iter().map(|m| m.slot).collect();
    let (first, last) = (members[0], members[1]);
    fail_drive(&rig.pool, first, false, "test").await.expect("the other copy is in sync");
    let again = fail_drive(&rig.pool, first, false, "test").await.unwrap_err();
    let again = refusal(again, &format!("drive {first} is failed already"));
    assert_eq!(again, Refusal::AlreadyFailed { slot: first });
    let refused = fail_drive(&rig.pool, last, false, "test").await.unwrap_err();
    let refused = refusal(
        refused,
        &format!(
            "drive {last} holds the last in-sync copy of data of volume(s) v: failing it would make them \
             unreadable"
        ),
    );
    let volumes = vec!["v".to_string()];
    assert_eq!(refused, Refusal::LastCopy { slot: last, action: DriveAction::Fail, volumes });
    let state = rig.pool.meta().drive(last).expect("the last copy's drive").state;
    assert_eq!(state, crate::DriveState::Active, "refused: nothing was done");
    // Replacing it would fail it first: the same guard, naming the replacement.
    let replace = Replacement::check(&rig.pool, last, false).unwrap_err();
    let replace = refusal(
        replace,
        &format!(
            "drive {last} holds the last in-sync copy of data of volume(s) v: replacing it would make them \
             unreadable"
        ),
    );
    assert!(matches!(replace, Refusal::LastCopy { action: DriveAction::Replace, .. }));
    fail_drive(&rig.pool, last, true, "test").await.expect("forced");
    assert_eq!(rig.pool.volume("v").expect("v").state(), VolumeState::Failed);
    rig.pool.close().await.expect("close");
}

#[tokio::test]
async fn rebuilding_with_nothing_to_rebuild_from_is_refused_unless_forced() {
    let rig = rig(2, Layout::Raid0 { width: 2 }).await;
    fail_drive(&rig.pool, 0, true, "test").await.expect("forced");
    let message = "nothing to rebuild drive 0 from: volume(s) v are raid0: there is no copy or parity of \
        their part. A drive brought back or replaced is rebuilt from the other drives (stria does not \
        take back a failed drive's old contents where it cannot know what the drive missed while it was \
        out), so their data on it would be lost. Those volumes stay failed until deleted, and their data \
        on drive 0 is left as it is for as long as the device is not reused";
    let expected = Refusal::NoRebuildSource { slot: 0, raid0: vec!["v".into()], other: vec![] };
    assert_eq!(refusal(Replacement::check(&rig.pool, 0, false).unwrap_err(), message), expected);
    assert_eq!(refusal(Online::check(&rig.pool, 0, false).unwrap_err(), message), expected);
    let online = Online::check(&rig.pool, 0, true).expect("forced");
    assert_eq!((online.record().slot, online.record().path_hint.as_str()), (0, "d0"));
    let forced = Replacement::check(&rig.pool, 0, true).expect("forced");
    assert_eq!(forced.slot(), 0);
    rig.pool.close().await.expect("close");
}

#[tokio::test]
async fn lost_members_beyond_the_parity_are_named_as_such() {
    let rig = rig(3, Layout::Ec { data_shards: 2, parity_shards: 1 }).await;
    fail_drive(&rig.pool, 0, false, "test").await.expect("parity covers one");
    fail_drive(&rig.pool, 1, true, "test").await.expect("forced");
    let e = Replacement::check(&rig.pool, 1, false).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Conflict);
    let r =
        refusal(e, &Refusal::NoRebuildSource { slot: 1, raid0: vec![], other: vec!["v".into()] }.to_string());
    assert!(
        r.to_string().contains("volume(s) v have lost more members than their copies or parity cover"),
        "{r}"
    );
    rig.pool.close().await.expect("close");
}

#[tokio::test]
async fn bringing_back_a_drive_that_is_not_failed_is_refused() {
    let rig = rig(2, Layout::Raid1 { copies: 2 }).await;
    let e = Online::check(&rig.pool, 1, false).unwrap_err();
    let r = refusal(e, "drive 1 is active, not failed; there is nothing to bring back");
    assert_eq!(r, Refusal::NotFailed { slot: 1, state: crate::DriveState::Active });
    assert!(matches!(Online::check(&rig.pool, 9, false), Err(EngineError::NoSuchDrive(_))));
    rig.pool.close().await.expect("close");
}

#[tokio::test]
async fn a_drive_that_did_not_empty_is_refused_with_the_reason() {
    let rig = rig(2, Layout::Raid1 { copies: 2 }).await;
    let report = crate::RebalanceReport { stuck: Some("no drive can take it".into()), ..Default::default() };
    let e = check_drained(&rig.pool, 1, &report).unwrap_err();
    let r = refusal(e, "drive 1 is draining but could not be emptied yet: no drive can take it");
    assert_eq!(r, Refusal::NotDrained { slot: 1, why: "no drive can take it".into() });
    let e = check_drained(&rig.pool, 1, &crate::RebalanceReport::default()).unwrap_err();
    refusal(e, "drive 1 is draining but could not be emptied yet: moves were abandoned");
    rig.pool.close().await.expect("close");
}

/// A drive replaced while a rebuild runs is rebuilt by that same run: the rebuild follows the
/// volume's map as it changes, and reports done only when no member is left to rebuild. (The
/// dashboard's test once saw a volume still degraded after "rebuild finished".)
#[tokio::test(start_paused = true)]
async fn a_drive_replaced_during_a_rebuild_is_rebuilt_by_the_same_run() {
    let rig = rig(3, Layout::Raid1 { copies: 3 }).await;
    rig.fail_and_replace(1, "new1").await;
    // One row a second (virtual time), so that the second replacement lands in the middle.
    rig.pool.set_rebuild_rate(CHUNK_BYTES);
    let pool = Arc::clone(&rig.pool);
    let running = tokio::spawn(async move { pool.rebuild(|_| {}).await });
    let rows_done = || rig.pool.rebuild_progress().first().map_or(0, |p| p.rows_done);
    until(Duration::from_secs(30), || rows_done() >= 2).await;
    rig.fail_and_replace(2, "new2").await;
    rig.pool.set_rebuild_rate(0);
    running.await.expect("join").expect("rebuild");
    assert!(!rig.pool.rebuild_pending(), "the rebuild returned with a member left to rebuild");
    assert_eq!(rig.pool.volume("v").expect("v").state(), VolumeState::Healthy);
    rig.read_back().await;
    rig.pool.close().await.expect("close");
}
