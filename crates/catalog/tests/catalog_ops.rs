//! The catalog's own operations, through `Catalog` as the daemon uses it: create, lookup, show,
//! status, resize, delete, snapshots, clones and rollback, their refusals (each leaving the pool
//! as it was), names and sizes, a reopen, and a log-structured volume that cannot be opened.

use stria_catalog::{Catalog, CatalogError, CreateVolume, VolumeView};
use stria_dev::{BLOCK_BYTES, IoBytes};
use stria_engine::{Durability, ErrorKind, VOLUME_BYTES_MAX};

use crate::common::{Rig, catalog_kind, create_req, random_bytes, rng};

const MIB: u64 = 1 << 20;

/// Asserts that `r` failed with a catalog error of `kind`, and returns its message.
#[track_caller]
fn refused<T: std::fmt::Debug>(r: Result<T, CatalogError>, kind: ErrorKind, what: &str) -> String {
    match r {
        Err(e) => {
            assert_eq!(catalog_kind(&e), kind, "{what}: refused with {e} ({e:?}), expected {kind:?}");
            e.to_string()
        }
        Ok(v) => panic!("{what}: accepted ({v:?}), expected a refusal of kind {kind:?}"),
    }
}

/// Every layout the catalog knows, one volume each.
const LAYOUTS: [(&str, &str); 6] = [
    ("r0", "raid0"),
    ("r1", "raid1"),
    ("r10", "raid10"),
    ("ec", "ec:4+2"),
    ("tv", "tiered:ec:4+2"),
    ("lv", "log:ec:4+2"),
];

async fn rig_with_every_layout() -> Rig {
    let rig = Rig::new(7).await;
    for (name, layout) in LAYOUTS {
        let view = rig.catalog.create(create_req(name, 4 * MIB, layout)).await.expect("create");
        let is_log = matches!(view, VolumeView::Log(_));
        assert_eq!(is_log, stria_catalog::is_log_layout(layout), "{layout}: create shows the kind made");
    }
    rig
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_lookup_show_and_status_for_every_layout() {
    let rig = rig_with_every_layout().await;
    let c = &rig.catalog;
    let mut want: Vec<String> = LAYOUTS.iter().map(|(n, _)| n.to_string()).collect();
    want.sort();
    assert_eq!(c.names(), want, "names: every client-visible volume, sorted, no parts");
    for (name, layout) in LAYOUTS {
        let v = rig.volume(name);
        let info = v.info();
        assert_eq!(info.name, name);
        assert!(!info.read_only, "{name}");
        assert_eq!(v.size_bytes(), 4 * MIB, "{name}");
        let kind = layout.split(':').next().unwrap();
        assert!(info.layout.starts_with(kind), "{name}: layout {} names {kind}", info.layout);
        match c.show(name).expect("show") {
            VolumeView::Plain(p) => {
                assert!(!stria_catalog::is_log_layout(layout), "{name}");
                assert_eq!(
                    (p.status.name.as_str(), p.status.size_bytes, p.status.role.as_str()),
                    (name, 4 * MIB, "plain")
                );
            }
            VolumeView::Log(l) => {
                assert!(stria_catalog::is_log_layout(layout), "{name}");
                assert_eq!((l.status.name.as_str(), l.status.size_bytes), (name, 4 * MIB));
                assert!(l.snapshots.is_empty() && l.clones.is_empty());
            }
            VolumeView::Clone(_) => panic!("{name} shows as a clone"),
        }
        assert!(c.resizable(name), "{name}: resizable (every kind)");
    }
    // The parts of log-structured volumes: shown (diagnostics), never looked up or listed.
    for part in ["tv.meta", "tv.cache", "tv.seg", "lv.meta", "lv.cache", "lv.seg"] {
        assert!(c.lookup(part).is_none(), "{part} is not client-visible");
        assert!(matches!(c.show(part), Ok(VolumeView::Plain(_))), "{part} can be shown");
    }
    let status = c.status();
    let mut logs: Vec<&str> = status.log.iter().map(|l| l.name.as_str()).collect();
    logs.sort_unstable();
    assert_eq!(logs, ["lv", "tv"], "status: every log-structured volume");
    assert!(status.unavailable.is_empty() && status.snapshots.is_empty() && status.clones.is_empty());
    assert!(status.thin.is_some(), "status sums the thin volumes");
    // Unknown names.
    assert!(c.lookup("nope").is_none());
    refused(c.show("nope"), ErrorKind::NotFound, "show of an unknown volume");
    // A chunk size is kept.
    let req = CreateVolume { chunk_bytes: Some(16 << 10), ..create_req("small-chunks", MIB, "raid10") };
    let VolumeView::Plain(p) = c.create(req).await.expect("create with a chunk") else { panic!("plain") };
    assert_eq!(p.status.chunk_bytes, 16 << 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_leave_the_pool_as_it_was() {
    let rig = rig_with_every_layout().await;
    let c = &rig.catalog;
    let before = c.names();

    // Sizes: whole 4 KiB blocks, not zero, at most VOLUME_BYTES_MAX.
    for size in [0, 1, BLOCK_BYTES - 1, BLOCK_BYTES + 1, VOLUME_BYTES_MAX + BLOCK_BYTES, u64::MAX] {
        for layout in ["raid1", "ec:4+2", "tiered:ec:4+2", "log:ec:4+2"] {
            refused(
                c.create(create_req("new", size, layout)).await,
                ErrorKind::InvalidInput,
                &format!("{layout} of {size} bytes"),
            );
        }
    }
    // The largest size passes the size check and is refused for want of space, not as invalid.
    refused(
        c.create(create_req("new", VOLUME_BYTES_MAX, "raid1")).await,
        ErrorKind::NoSpace,
        "a plain volume of 2^60 bytes",
    );
    // Nor for a log-structured volume (whose cache, map and space derive from the size).
    for layout in ["tiered:ec:4+2", "log:ec:4+2"] {
        assert!(
            c.create(create_req("new", VOLUME_BYTES_MAX, layout)).await.is_err(),
            "{layout} of 2^60 bytes"
        );
    }
    // Names.
    let long = "n".repeat(65);
    for name in ["", "-x", ".x", "a b", "a/b", "a@b", long.as_str()] {
        refused(
            c.create(create_req(name, MIB, "raid1")).await,
            ErrorKind::InvalidInput,
            &format!("name {name:?}"),
        );
    }
    // Taken names: a volume of either kind, a part.
    for (name, layout) in [
        ("r1", "raid0"),
        ("r1", "log:ec:4+2"),
        ("lv", "raid1"),
        ("lv", "tiered:ec:4+2"),
        ("tv.meta", "raid1"),
    ] {
        let e = c.create(create_req(name, MIB, layout)).await.expect_err(&format!("{layout} over {name}"));
        assert!(
            matches!(catalog_kind(&e), ErrorKind::Conflict | ErrorKind::InvalidInput),
            "{layout} over {name}: {e} ({:?})",
            catalog_kind(&e)
        );
    }
    // Layouts.
    for layout in
        ["raid5", "ec:4", "ec:0+2", "ec:a+b", "raid10:3", "tiered:raid1", "log:ec:4", "tiered:ec:x+2", ""]
    {
        refused(
            c.create(create_req("new", MIB, layout)).await,
            ErrorKind::InvalidInput,
            &format!("layout {layout:?}"),
        );
    }
    // More members than drives of the class.
    let e = c.create(create_req("new", MIB, "ec:8+2")).await.expect_err("ec:8+2 on 6 drives");
    assert!(matches!(catalog_kind(&e), ErrorKind::Conflict | ErrorKind::InvalidInput), "ec:8+2: {e}");
    // Options of log-structured layouts on a plain one.
    let req = CreateVolume { cache_bytes: Some(MIB), ..create_req("new", MIB, "raid1") };
    refused(c.create(req).await, ErrorKind::InvalidInput, "--cache-size on raid1");
    let req = CreateVolume { space_bytes: Some(MIB), ..create_req("new", MIB, "ec:4+2") };
    refused(c.create(req).await, ErrorKind::InvalidInput, "--space on ec");
    let req =
        CreateVolume { gc: Some(stria_tier::log::GcPolicy::Greedy), ..create_req("new", MIB, "raid10") };
    refused(c.create(req).await, ErrorKind::InvalidInput, "--gc on raid10");
    // Resizing: what cannot be resized, sizes, unknown names, parts.
    refused(c.resize("lv", MIB + 1).await, ErrorKind::InvalidInput, "resize a log volume to part of a block");
    refused(c.resize("lv", 0).await, ErrorKind::InvalidInput, "resize a log volume to 0");
    refused(c.resize("r1", 0).await, ErrorKind::InvalidInput, "resize to 0");
    refused(c.resize("r1", MIB + 1).await, ErrorKind::InvalidInput, "resize to part of a block");
    refused(
        c.resize("r1", VOLUME_BYTES_MAX + BLOCK_BYTES).await,
        ErrorKind::InvalidInput,
        "resize past the most",
    );
    refused(c.resize("nope", MIB).await, ErrorKind::NotFound, "resize an unknown volume");
    refused(c.resize("tv.seg", MIB).await, ErrorKind::InvalidInput, "resize a part");
    // Deleting: unknown names, parts.
    refused(c.delete("nope").await, ErrorKind::NotFound, "delete an unknown volume");
    refused(c.delete("lv.cache").await, ErrorKind::InvalidInput, "delete a part");
    // Snapshots and clones of what has none.
    refused(c.snapshot_create("r1", "s").await, ErrorKind::InvalidInput, "snapshot of a plain volume");
    refused(c.snapshot_create("nope", "s").await, ErrorKind::NotFound, "snapshot of an unknown volume");
    refused(c.volume_clone("lv", "c").await, ErrorKind::InvalidInput, "clone of a volume, not a snapshot");
    assert!(c.volume_clone("lv@nope", "c").await.is_err(), "clone of an unknown snapshot");
    assert!(c.volume_rollback("lv", "nope").await.is_err(), "rollback to an unknown snapshot");
    refused(c.volume_rollback("r1", "s").await, ErrorKind::InvalidInput, "rollback of a plain volume");

    assert_eq!(c.names(), before, "a refusal leaves the volumes as they were");
    assert!(c.pool().meta().volumes.iter().all(|v| !v.name.starts_with("new")), "nor a part behind");
    assert!(c.snapshots(None).expect("snapshots").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resize_keeps_the_data_it_keeps() {
    let rig = Rig::new(8).await;
    let c = &rig.catalog;
    let mut r = rng(8);
    for layout in ["raid0", "raid1", "raid10", "ec:4+2"] {
        c.create(create_req("v", 2 * MIB, layout)).await.expect("create");
        let data = random_bytes(&mut r, (2 * MIB) as usize);
        let v = rig.volume("v");
        v.write(0, IoBytes::copy_from(&data), Durability::Fua).await.expect("write");
        c.resize("v", 5 * MIB + BLOCK_BYTES).await.expect("grow");
        let v = rig.volume("v");
        assert_eq!(v.size_bytes(), 5 * MIB + BLOCK_BYTES, "{layout}: grown");
        let got = v.read(0, (5 * MIB + BLOCK_BYTES) as usize).await.expect("read");
        assert!(got[..2 * MIB as usize] == data[..], "{layout}: the old bytes survive growing");
        assert!(got[2 * MIB as usize..].iter().all(|&b| b == 0), "{layout}: the new bytes read as zeros");
        c.resize("v", MIB).await.expect("shrink");
        let v = rig.volume("v");
        assert_eq!(v.size_bytes(), MIB, "{layout}: shrunk");
        let got = v.read(0, MIB as usize).await.expect("read");
        assert!(got[..] == data[..MIB as usize], "{layout}: the kept bytes survive shrinking");
        c.delete("v").await.expect("delete");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_frees_the_name_and_guards_clones() {
    let rig = rig_with_every_layout().await;
    let c = &rig.catalog;
    for (name, _) in LAYOUTS {
        if name == "lv" {
            continue;
        }
        c.delete(name).await.unwrap_or_else(|e| panic!("delete {name}: {e}"));
        assert!(c.lookup(name).is_none() && !c.names().contains(&name.to_string()), "{name} is gone");
        refused(c.show(name), ErrorKind::NotFound, "show of a deleted volume");
    }
    assert!(c.pool().meta().volumes.iter().all(|v| !v.name.starts_with("tv")), "the parts went with tv");
    // A name is free again once deleted, for either kind.
    c.create(create_req("tv", MIB, "raid1")).await.expect("a plain volume named as a deleted log volume");
    c.create(create_req("r1", 4 * MIB, "log:ec:4+2"))
        .await
        .expect("a log volume named as a deleted plain one");
    // A log volume with snapshots and no clone goes with them.
    c.snapshot_create("lv", "s").await.expect("snapshot");
    c.delete("lv").await.expect("delete the volume and its snapshot");
    assert!(c.lookup("lv@s").is_none() && c.snapshots(None).expect("snapshots").is_empty());
    assert!(c.pool().meta().volumes.iter().all(|v| !v.name.starts_with("lv.")), "the parts went with lv");
}

/// Issue 39: a log volume whose snapshots have clones can be deleted; it is kept, hidden, for
/// them (gone from lookups, lists and snapshots; its name not free), the clones read and write
/// as before through a reopen, and the last clone's delete takes its parts, also when the power
/// is cut in that delete (open finishes it: the family of a deleted origin with no clone left,
/// or the parts left when the cut fell between the pool record's removal and theirs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_origin_with_clones_is_kept_hidden_until_its_last_clone_goes() {
    let (mut finished_at_open, mut not_begun) = (0, 0);
    // Cut points from before the clone's delete to the end of its parts' (about 350 requests).
    let cuts = [0, 3, 6, 10, 16, 24, 32, 40, 50, 64, 80, 100, 125, 150, 180, 210, 240, 280, 320, 360, 400];
    for cut in std::iter::once(None).chain(cuts.into_iter().map(Some)) {
        let mut rig = Rig::new(14).await;
        let mut r = rng(14);
        let what = format!("last clone's delete cut after {cut:?} requests");
        // Room for the head, its snapshots' blocks and the clones' own.
        let req = CreateVolume {
            space_bytes: Some(16 * MIB),
            cache_bytes: Some(4 * MIB),
            ..create_req("v", 4 * MIB, "tiered:ec:4+2")
        };
        rig.catalog.create(req).await.expect("create");
        let a = random_bytes(&mut r, (4 * MIB) as usize);
        rig.volume("v").write(0, IoBytes::copy_from(&a), Durability::Fua).await.expect("write");
        rig.catalog.snapshot_create("v", "s1").await.expect("s1");
        rig.catalog.volume_clone("v@s1", "c1").await.expect("c1");
        let b = random_bytes(&mut r, MIB as usize);
        rig.volume("v").write(0, IoBytes::copy_from(&b), Durability::Fua).await.expect("write");
        rig.catalog.snapshot_create("v", "s2").await.expect("s2");
        rig.catalog.volume_clone("v@s2", "c2").await.expect("c2");
        rig.catalog.snapshot_create("v", "s3").await.expect("s3");
        let mut c1 = a.clone();
        let ours = random_bytes(&mut r, MIB as usize);
        rig.volume("c1").write(2 * MIB, IoBytes::copy_from(&ours), Durability::Fua).await.expect("write c1");
        c1[(2 * MIB) as usize..(3 * MIB) as usize].copy_from_slice(&ours);
        let mut c2 = a.clone();
        c2[..MIB as usize].copy_from_slice(&b);

        // Its snapshots' deletes and the freeing of what only it held left to the background
        // (finished by the task, or by the reopen below if it has not).
        let background = rig.catalog.delete_in_background("v").await.expect("delete an origin with clones");
        assert!(background, "{what}: an origin's delete left to the background");
        for round in ["after the delete", "after a reopen"] {
            let c = &rig.catalog;
            assert!(c.lookup("v").is_none() && c.lookup("v@s1").is_none(), "{round}: v is not handed out");
            assert!(!c.names().contains(&"v".to_string()), "{round}: nor named");
            assert!(
                c.names().contains(&"c1".to_string()) && c.names().contains(&"c2".to_string()),
                "{round}"
            );
            refused(c.show("v"), ErrorKind::NotFound, "show of a deleted origin");
            refused(c.delete("v").await, ErrorKind::NotFound, "a second delete");
            refused(
                c.snapshot_create("v", "s4").await,
                ErrorKind::NotFound,
                "a snapshot of a deleted origin",
            );
            assert!(c.snapshots(None).expect("snapshots").is_empty(), "{round}: its snapshots are gone");
            let message =
                refused(c.create(create_req("v", MIB, "raid1")).await, ErrorKind::InvalidInput, "reuse");
            assert!(
                message.contains("c1") && message.contains("c2"),
                "{round}: the refusal names the clones: {message}"
            );
            let listed = c.status().volume_list();
            let kept = listed.iter().find(|e| e.name == "v").expect("the kept origin is listed");
            assert_eq!(kept.kind, "deleted", "{round}");
            assert!(kept.reason.as_deref().is_some_and(|r| r.contains("c1")), "{round}: {kept:?}");
            let got = rig.volume("c1").read(0, (4 * MIB) as usize).await.expect("read c1");
            assert!(got[..] == c1[..], "{round}: c1 reads as before");
            let got = rig.volume("c2").read(0, (4 * MIB) as usize).await.expect("read c2");
            assert!(got[..] == c2[..], "{round}: c2 reads as its snapshot");
            if round == "after the delete" {
                rig.reopen().await;
            }
        }
        // Left to the background: c2 still reads through the family.
        let background = rig.catalog.delete_in_background("c1").await.expect("delete c1");
        assert!(background, "{what}: c1's pages are dropped by the background task");
        assert!(!rig.catalog.names().contains(&"c1".to_string()), "{what}: c1 is gone at once");
        assert!(rig.catalog.status().volume_list().iter().any(|e| e.name == "v"), "{what}: kept for c2");
        let c2_write = random_bytes(&mut r, 4096);
        rig.volume("c2").write(0, IoBytes::copy_from(&c2_write), Durability::Fua).await.expect("write c2");
        match cut {
            None => {
                // The last clone of a deleted origin goes with the family's parts, now.
                let background = rig.catalog.delete_in_background("c2").await.expect("delete the last clone");
                assert!(!background, "nothing is left to a background task");
            }
            Some(n) => {
                rig.switch.trip_after_ops(n);
                let returned = rig.catalog.delete("c2").await.is_ok();
                rig.power_cut(n).await;
                if rig.catalog.names().contains(&"c2".to_string()) {
                    assert!(!returned, "{what}: the delete returned and c2 is back");
                    let got = rig.volume("c2").read(0, 4096).await.expect("read c2");
                    assert!(got[..] == c2_write[..], "{what}: c2 as it was");
                    not_begun += 1;
                    rig.catalog.delete("c2").await.expect("delete the last clone again");
                } else {
                    finished_at_open += u32::from(!returned);
                }
            }
        }
        let c = &rig.catalog;
        assert!(
            c.status().volume_list().is_empty(),
            "{what}: nothing is left: {:?}",
            c.status().volume_list()
        );
        assert!(
            c.pool().meta().volumes.is_empty() && c.pool().meta().tiered.is_empty(),
            "{what}: the parts went"
        );
        c.create(create_req("v", MIB, "raid1")).await.expect("the name is free again");
    }
    assert!(finished_at_open > 0 && not_begun > 0, "cuts landed before and after the clone's delete");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_clones_and_rollback() {
    let rig = Rig::new(9).await;
    let c = &rig.catalog;
    let mut r = rng(9);
    c.create(create_req("v", 4 * MIB, "tiered:ec:4+2")).await.expect("create");
    let v = rig.volume("v");
    let first = random_bytes(&mut r, (4 * MIB) as usize);
    v.write(0, IoBytes::copy_from(&first), Durability::Buffered).await.expect("write");
    let snap = c.snapshot_create("v", "s1").await.expect("snapshot");
    assert_eq!((snap.volume.as_str(), snap.name.as_str(), snap.export.as_str()), ("v", "s1", "v@s1"));
    assert_eq!(snap.size_bytes, 4 * MIB);
    // Names of snapshots.
    assert!(c.snapshot_create("v", "s1").await.is_err(), "a snapshot name twice");
    let long = "s".repeat(65);
    for bad in ["", "a@b", "a/b", "a b", long.as_str()] {
        assert!(c.snapshot_create("v", bad).await.is_err(), "snapshot name {bad:?}");
    }
    // The snapshot reads as the volume did; the volume moves on.
    let second = random_bytes(&mut r, MIB as usize);
    v.write(MIB, IoBytes::copy_from(&second), Durability::Fua).await.expect("write after the snapshot");
    let s1 = rig.volume("v@s1");
    assert!(s1.info().read_only, "a snapshot is read-only");
    assert!(
        s1.read(0, (4 * MIB) as usize).await.expect("read")[..] == first[..],
        "the snapshot holds the old data"
    );
    assert!(c.lookup("v@nope").is_none() && c.lookup("nope@s1").is_none());
    // Listing.
    c.snapshot_create("v", "s2").await.expect("second snapshot");
    let names = |list: Vec<stria_catalog::SnapshotView>| list.into_iter().map(|s| s.name).collect::<Vec<_>>();
    assert_eq!(names(c.snapshots(Some("v")).expect("list")), ["s1", "s2"], "oldest first");
    assert_eq!(names(c.snapshots(None).expect("list")), ["s1", "s2"]);
    let full = c.snapshot_list(Some("v")).await.expect("list with sizes");
    assert!(full.iter().all(|s| s.exclusive_bytes.is_some()), "snapshot list says what each holds");
    let VolumeView::Log(l) = c.show("v").expect("show") else { panic!("a log view") };
    assert_eq!(l.snapshots.len(), 2);
    // Left to the background: gone from the list and the lookups at once, counted by `show`
    // until the volume's task has handed its pages on.
    let deleted = c.snapshot_delete_in_background("v", "s2").await.expect("delete s2");
    assert!(deleted.in_background && !deleted.kept_for_clones, "{deleted:?}");
    assert_eq!(names(c.snapshots(Some("v")).expect("list")), ["s1"]);
    assert!(c.lookup("v@s2").is_none(), "a deleted snapshot is not looked up");
    let in_progress = || match c.show("v").expect("show") {
        VolumeView::Log(l) => l.status.deletes_in_progress,
        _ => panic!("a log view"),
    };
    let started = std::time::Instant::now();
    while in_progress() > 0 {
        assert!(started.elapsed().as_secs() < 20, "s2's delete did not finish in the background");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    // A clone: readable as its snapshot, writable, its name taken.
    let clone_view = c.volume_clone("v@s1", "c1").await.expect("clone");
    assert_eq!((clone_view.origin.as_str(), clone_view.snapshot.as_str()), ("v", "s1"));
    assert!(c.names().contains(&"c1".to_string()), "a clone is a client-visible volume");
    let c1 = rig.volume("c1");
    assert!(!c1.info().read_only);
    assert!(
        c1.read(0, (4 * MIB) as usize).await.expect("read")[..] == first[..],
        "a clone reads as its snapshot"
    );
    c1.write(0, IoBytes::copy_from(&[9u8; 4096]), Durability::Fua).await.expect("write to a clone");
    assert!(s1.read(0, 4096).await.expect("read")[..] == first[..4096], "a clone's write stays in the clone");
    refused(c.volume_clone("v@s1", "c1").await, ErrorKind::InvalidInput, "a clone name twice");
    refused(c.volume_clone("v@s1", "v").await, ErrorKind::InvalidInput, "a clone named as a volume");
    refused(
        c.create(create_req("c1", MIB, "raid1")).await,
        ErrorKind::InvalidInput,
        "a volume named as a clone",
    );
    // A clone grows past its origin's size (the family's map grows); the origin keeps its.
    let Ok(VolumeView::Clone(grown)) = c.resize("c1", 8 * MIB).await else { panic!("a clone grows past v") };
    assert_eq!(grown.size_bytes, 8 * MIB);
    assert_eq!(rig.volume("c1").size_bytes(), 8 * MIB, "the clone's volume has the new size");
    assert_eq!(v.size_bytes(), 4 * MIB, "v keeps its size");
    assert!(
        rig.volume("c1").read(4 * MIB, MIB as usize).await.expect("read")[..] == vec![0u8; MIB as usize][..],
        "what the clone gained past v reads as zeros"
    );
    assert!(matches!(c.show("c1"), Ok(VolumeView::Clone(_))));
    assert_eq!(c.status().clones.len(), 1);
    // Rollback: the volume reads as the snapshot again.
    let rolled = c.volume_rollback("v", "s1").await.expect("rollback");
    assert!(rolled.blocks_changed >= MIB / BLOCK_BYTES, "the rolled back blocks are counted: {rolled:?}");
    assert!(v.read(0, (4 * MIB) as usize).await.expect("read")[..] == first[..], "rolled back");
    // Deleting a snapshot a clone reads through keeps it for the clone.
    let deleted = c.snapshot_delete("v", "s1").await.expect("delete s1");
    assert!(deleted.kept_for_clones, "s1 is kept for c1: {deleted:?}");
    assert!(c.lookup("v@s1").is_none(), "a deleted snapshot is not looked up");
    assert!(
        c1.read(4096, 4096).await.expect("read")[..] == first[4096..8192],
        "the clone still reads through it"
    );
    refused(c.snapshot_delete("v", "s1").await, ErrorKind::InvalidInput, "a snapshot deleted twice");
    assert!(c.snapshots(Some("v")).expect("list").is_empty());
}

/// `volume rollback --destroy-newer`: any snapshot, the newer ones deleted first; refused,
/// with nothing deleted, while a clone was made of a newer one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_to_an_older_snapshot_deletes_the_newer_ones_first() {
    let rig = rig_with_every_layout().await;
    let c = &rig.catalog;
    let mut r = rng(11);
    let v = rig.volume("lv");
    let mut versions = Vec::new();
    for name in ["a", "b", "c"] {
        let data = random_bytes(&mut r, MIB as usize);
        v.write(0, IoBytes::copy_from(&data), Durability::Fua).await.expect("write");
        c.snapshot_create("lv", name).await.expect("snapshot");
        versions.push(data);
    }
    v.write(0, IoBytes::copy_from(&random_bytes(&mut r, MIB as usize)), Durability::Fua)
        .await
        .expect("write");
    let names = || c.snapshots(Some("lv")).expect("list").into_iter().map(|s| s.name).collect::<Vec<_>>();
    refused(c.volume_rollback("lv", "a").await, ErrorKind::InvalidInput, "an older snapshot, plainly");
    c.volume_clone("lv@b", "cb").await.expect("clone of b");
    let e = c.volume_rollback_with("lv", "a", true).await.expect_err("a clone of b stands in the way");
    assert!(e.to_string().contains("cb (of lv@b)"), "{e}");
    assert_eq!(names(), ["a", "b", "c"], "nothing deleted");
    // Left to the background; the rollback finishes it first (b's delete needs it gone).
    assert!(c.delete_in_background("cb").await.expect("delete the clone"), "cb's delete in the background");
    let rolled = c.volume_rollback_with("lv", "a", true).await.expect("rollback to a");
    assert_eq!(rolled.snapshots_deleted, ["c", "b"], "newest first");
    assert_eq!(names(), ["a"]);
    assert!(v.read(0, MIB as usize).await.expect("read")[..] == versions[0][..], "reads as a");
    // To the newest, the flag deletes nothing.
    let again = c.volume_rollback_with("lv", "a", true).await.expect("rollback to a again");
    assert!(again.snapshots_deleted.is_empty());
}

/// A clone takes snapshots (served read-only as `CLONE@SNAP`), clones of them, rollbacks (with
/// `--destroy-newer` too) and deletes, through the catalog's names; `volume delete` of the
/// clone takes its snapshots but one a clone was made of.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clones_take_snapshots_rollbacks_and_clones_of_their_own() {
    let mut rig = rig_with_every_layout().await;
    let mut r = rng(14);
    let base = random_bytes(&mut r, MIB as usize);
    rig.volume("lv").write(0, IoBytes::copy_from(&base), Durability::Fua).await.expect("write");
    rig.catalog.snapshot_create("lv", "s").await.expect("snapshot");
    rig.catalog.volume_clone("lv@s", "c").await.expect("clone");
    let c = &rig.catalog;
    let mut versions = Vec::new();
    for name in ["a", "b", "z"] {
        let data = random_bytes(&mut r, MIB as usize);
        rig.volume("c").write(0, IoBytes::copy_from(&data), Durability::Fua).await.expect("write c");
        let snap = c.snapshot_create("c", name).await.expect("snapshot of the clone");
        assert_eq!((snap.volume.as_str(), snap.export.as_str()), ("c", format!("c@{name}").as_str()));
        versions.push(data);
    }
    let names = |c: &Catalog<_>| {
        c.snapshots(Some("c")).expect("list").into_iter().map(|s| s.name).collect::<Vec<_>>()
    };
    assert_eq!(names(c), ["a", "b", "z"]);
    assert_eq!(c.snapshots(Some("lv")).expect("list").len(), 1, "the volume's own are apart");
    assert_eq!(c.snapshots(None).expect("all").len(), 4, "every volume's and clone's");
    for (name, data) in ["a", "b", "z"].iter().zip(&versions) {
        let snap = rig.volume(&format!("c@{name}"));
        assert!(snap.info().read_only, "c@{name} is read-only");
        assert!(snap.read(0, MIB as usize).await.expect("read")[..] == data[..], "c@{name}");
    }
    assert!(rig.volume("lv@s").read(0, MIB as usize).await.expect("read")[..] == base[..], "lv@s");
    // A clone of a clone's snapshot; its view says what it was made of.
    let d = c.volume_clone("c@a", "d").await.expect("clone of c@a");
    assert_eq!((d.of_clone.as_deref(), d.snapshot.as_str()), (Some("c"), "a"));
    let shown = match c.show("c").expect("show c") {
        VolumeView::Clone(v) => v,
        other => panic!("c is a clone: {other:?}"),
    };
    assert_eq!(
        (shown.of_clone, shown.snapshot.as_str(), shown.snapshots),
        (None, "s", vec!["a".to_string(), "b".into(), "z".into()])
    );
    assert!(
        rig.volume("d").read(0, MIB as usize).await.expect("read")[..] == versions[0][..],
        "d reads as c@a"
    );
    // Rollback: to the newest, else with --destroy-newer (refused while a clone of a newer one lives).
    rig.volume("c")
        .write(0, IoBytes::copy_from(&random_bytes(&mut r, MIB as usize)), Durability::Fua)
        .await
        .expect("write c");
    refused(
        c.volume_rollback("c", "b").await,
        ErrorKind::InvalidInput,
        "an older snapshot of the clone, plainly",
    );
    c.volume_clone("c@z", "e").await.expect("clone of c@z");
    let e = c.volume_rollback_with("c", "b", true).await.expect_err("a clone of z stands in the way");
    assert!(e.to_string().contains("e (of c@z)"), "{e}");
    assert_eq!(names(c), ["a", "b", "z"], "nothing deleted");
    c.delete("e").await.expect("delete e");
    let rolled = c.volume_rollback_with("c", "b", true).await.expect("rollback to b");
    assert_eq!(rolled.snapshots_deleted, ["z"]);
    assert!(
        rig.volume("c").read(0, MIB as usize).await.expect("read")[..] == versions[1][..],
        "c reads as b"
    );
    refused(c.snapshot_create("c", "a").await, ErrorKind::InvalidInput, "a taken name");
    refused(c.snapshot_delete("c", "nope").await, ErrorKind::InvalidInput, "an unknown snapshot");
    // Through a reopen.
    rig.reopen().await;
    let c = &rig.catalog;
    assert_eq!(names(c), ["a", "b"]);
    assert!(
        rig.volume("c@a").read(0, MIB as usize).await.expect("read")[..] == versions[0][..],
        "c@a reopened"
    );
    // Deleting c takes b, keeps a (d was made of it) hidden; d reads as before.
    c.delete("c").await.expect("delete c");
    assert!(c.lookup("c@a").is_none() && c.lookup("c").is_none(), "c and its snapshots are gone");
    assert!(
        rig.volume("d").read(0, MIB as usize).await.expect("read")[..] == versions[0][..],
        "d after c went"
    );
    c.delete("d").await.expect("delete d");
    assert!(rig.volume("lv@s").read(0, MIB as usize).await.expect("read")[..] == base[..], "lv@s at the end");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reopen_keeps_every_volume_snapshot_and_clone() {
    let mut rig = rig_with_every_layout().await;
    let mut r = rng(10);
    let mut data = Vec::new();
    for (name, _) in LAYOUTS {
        let bytes = random_bytes(&mut r, (4 * MIB) as usize);
        rig.volume(name).write(0, IoBytes::copy_from(&bytes), Durability::Buffered).await.expect("write");
        data.push((name.to_string(), bytes));
    }
    rig.catalog.snapshot_create("tv", "s").await.expect("snapshot");
    rig.catalog.volume_clone("tv@s", "c").await.expect("clone");
    data.push(("tv@s".into(), data[4].1.clone()));
    data.push(("c".into(), data[4].1.clone()));
    let names = rig.catalog.names();
    rig.reopen().await;
    assert_eq!(rig.catalog.names(), names);
    for (name, bytes) in &data {
        let got = rig.volume(name).read(0, bytes.len()).await.expect("read");
        assert!(got[..] == bytes[..], "{name} reads back after a clean reopen");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unavailable_log_volume_is_listed_refused_and_deletable() {
    let mut rig = rig_with_every_layout().await;
    let bytes = random_bytes(&mut rng(12), MIB as usize);
    rig.volume("r1").write(0, IoBytes::copy_from(&bytes), Durability::Fua).await.expect("write");
    // Both copies of the header block of lv's metadata part, damaged while the pool is closed.
    let copies = rig.catalog.pool().volume("lv.meta").expect("lv.meta").locate(0).expect("locate");
    assert_eq!(copies.len(), 2, "the metadata part has two copies");
    rig.catalog.close().await.expect("close");
    for at in copies {
        rig.devs[at.slot as usize].poke(at.device_offset_bytes, &[0xA5; BLOCK_BYTES as usize]);
    }
    rig = Rig::open(rig.devs.clone(), std::sync::Arc::clone(&rig.switch)).await;
    let c = &rig.catalog;
    assert!(c.names().contains(&"lv".to_string()), "an unavailable volume is listed");
    assert!(c.lookup("lv").is_none(), "and not handed out");
    let status = c.status();
    assert_eq!(status.unavailable.len(), 1, "status names it");
    assert_eq!(status.unavailable[0].name, "lv");
    assert!(!status.unavailable[0].reason.is_empty(), "with why");
    let message = refused(c.show("lv"), ErrorKind::InvalidInput, "show of an unavailable volume");
    assert!(message.contains("unavailable"), "{message}");
    refused(c.snapshot_create("lv", "s").await, ErrorKind::InvalidInput, "snapshot of an unavailable volume");
    refused(c.resize("lv", MIB).await, ErrorKind::InvalidInput, "resize of an unavailable volume");
    assert!(c.create(create_req("lv", MIB, "raid1")).await.is_err(), "its name stays taken");
    // Everything else serves.
    assert!(rig.volume("r1").read(0, MIB as usize).await.expect("read")[..] == bytes[..]);
    assert!(c.lookup("tv").is_some());
    // It can be deleted, with its parts, and its name is free again.
    c.delete("lv").await.expect("delete an unavailable volume");
    assert!(!c.names().contains(&"lv".to_string()) && c.status().unavailable.is_empty());
    assert!(c.pool().meta().volumes.iter().all(|v| !v.name.starts_with("lv")), "its parts are gone");
    c.create(create_req("lv", MIB, "raid1")).await.expect("the name is free again");
}

/// Tiered and log volumes resize through the catalog like plain ones: what `show` and a looked-up
/// volume say follows, the data stays, and a snapshot keeps its size and data through a grow and
/// a shrink.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_volumes_resize_through_the_catalog_and_their_snapshots_keep_their_size() {
    let rig = rig_with_every_layout().await;
    let c = &rig.catalog;
    for name in ["tv", "lv"] {
        let data = vec![0x5a; 64 << 10];
        let v = c.lookup(name).expect("looked up");
        v.write(0, stria_dev::IoBytes::copy_from(&data), stria_engine::Durability::Fua).await.unwrap();
        c.resize(name, 12 * MIB).await.unwrap();
        assert_eq!(c.lookup(name).expect("looked up").size_bytes(), 12 * MIB, "{name}");
        match c.show(name).unwrap() {
            VolumeView::Log(l) => assert_eq!(l.status.size_bytes, 12 * MIB, "{name}"),
            other => panic!("{name} shows as {other:?}"),
        }
        c.snapshot_create(name, "s").await.unwrap();
        c.resize(name, 16 * MIB).await.unwrap();
        assert_eq!(c.lookup(&format!("{name}@s")).expect("the snapshot").size_bytes(), 12 * MIB);
        // A shrink with the snapshot: the snapshot keeps its size and its data.
        c.resize(name, 8 * MIB).await.expect("shrink with a snapshot");
        assert_eq!(c.lookup(name).expect("looked up").size_bytes(), 8 * MIB, "{name}");
        let snap = c.lookup(&format!("{name}@s")).expect("the snapshot");
        assert_eq!(snap.size_bytes(), 12 * MIB, "{name}@s");
        assert!(snap.read(0, 64 << 10).await.unwrap()[..] == data[..], "{name}@s: its data stays");
        let got = c.lookup(name).unwrap().read(0, 64 << 10).await.unwrap();
        assert!(got[..] == data[..], "{name}: the data stays");
    }
}
