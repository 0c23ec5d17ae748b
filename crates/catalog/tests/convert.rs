//! `volume convert` (docs/design/convert.md): a plain volume of every layout becomes a
//! log-structured one with the same name, size, bytes and QoS; refusals change nothing; writes
//! racing the conversion are acknowledged into the new volume or refused, never lost; and a power
//! cut anywhere in it boots to the plain volume as it was (its copy deleted, nothing leaked) or
//! to the converted one.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use stria_catalog::{ConvertVolume, QosUpdate, Setting, VolumeView};
use stria_dev::{BLOCK_BYTES, IoBytes};
use stria_engine::{Durability, ErrorKind};

use crate::common::{Rig, catalog_kind, create_req, random_bytes, rng};

const MIB: u64 = 1 << 20;

fn convert_req(name: &str, layout: &str) -> ConvertVolume {
    ConvertVolume {
        name: name.into(),
        layout: layout.into(),
        chunk_bytes: None,
        cache_bytes: Some(MIB),
        cache_copies: None,
        space_bytes: None,
    }
}

/// Fills `name` (4 MiB) with data in its first half and one block near its end, zeros between.
async fn fill(rig: &Rig, name: &str, seed: u64) -> Vec<u8> {
    let mut r = rng(seed);
    let mut want = vec![0u8; (4 * MIB) as usize];
    let a = random_bytes(&mut r, (2 * MIB) as usize);
    want[..a.len()].copy_from_slice(&a);
    let b = random_bytes(&mut r, BLOCK_BYTES as usize);
    let at = (4 * MIB - 3 * BLOCK_BYTES) as usize;
    want[at..at + b.len()].copy_from_slice(&b);
    let v = rig.volume(name);
    v.write(0, IoBytes::copy_from(&a), Durability::Fua).await.expect("write");
    v.write(at as u64, IoBytes::copy_from(&b), Durability::Fua).await.expect("write");
    want
}

#[track_caller]
fn is_log(rig: &Rig, name: &str) -> bool {
    matches!(rig.catalog.show(name).expect("show"), VolumeView::Log(_))
}

async fn read_all(rig: &Rig, name: &str) -> Vec<u8> {
    let v = rig.volume(name);
    v.read(0, v.size_bytes() as usize).await.expect("read").to_vec()
}

/// Names of the pool's engine volumes and tiered records (what a conversion may leave behind).
fn records(rig: &Rig) -> (Vec<String>, Vec<String>) {
    let meta = rig.catalog.pool().meta();
    let mut v: Vec<String> = meta.volumes.iter().map(|v| v.name.clone()).collect();
    let mut t: Vec<String> = meta.tiered.iter().map(|t| t.name.clone()).collect();
    v.sort();
    t.sort();
    (v, t)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_plain_layout_converts_with_its_bytes_name_and_qos() {
    let mut rig = Rig::new(31).await;
    let plain = [
        ("r0", "raid0", "tiered:ec:4+2"),
        ("r1", "raid1", "log:ec:4+2"),
        ("r10", "raid10", "tiered:ec:4+2"),
        ("ec", "ec:4+2", "tiered:ec:2+1"),
    ];
    let mut wants = Vec::new();
    for (i, (name, layout, _)) in plain.iter().enumerate() {
        rig.catalog.create(create_req(name, 4 * MIB, layout)).await.expect("create");
        wants.push(fill(&rig, name, 100 + i as u64).await);
    }
    let limit = QosUpdate { iops_limit: Some(Setting::Set(5000)), ..QosUpdate::default() };
    rig.catalog.set_qos("r1", &limit).await.expect("qos");
    for (i, (name, _, to)) in plain.iter().enumerate() {
        let mut steps = Vec::new();
        let done = rig
            .catalog
            .convert(convert_req(name, to), &mut |done, total| steps.push((done, total)))
            .await
            .unwrap_or_else(|e| panic!("convert {name} to {to}: {e}"));
        assert_eq!(
            (done.data_bytes, done.zero_bytes),
            (2 * MIB + BLOCK_BYTES, 2 * MIB - BLOCK_BYTES),
            "{name}"
        );
        assert!(done.from_layout.starts_with(plain[i].1), "{name}: {done:?}");
        let VolumeView::Log(log) = rig.catalog.show(name).expect("show") else {
            panic!("{name}: not a log volume after the conversion")
        };
        assert_eq!(log.status.layout, *to, "{name}");
        assert_eq!(steps.last(), Some(&(4 * MIB, 4 * MIB)), "{name}: progress reaches the end");
        assert_eq!(rig.volume(name).size_bytes(), 4 * MIB, "{name}: its size");
        assert!(read_all(&rig, name).await == wants[i], "{name}: its bytes");
        // Thin: the 2 MiB of zeros between the data were not written.
        let extents = rig.volume(name).block_status(0, 4 * MIB).await.expect("block status");
        let allocated: u64 = extents.iter().filter(|e| !e.unallocated).map(|e| e.len_bytes).sum();
        assert_eq!(allocated, 2 * MIB + BLOCK_BYTES, "{name}: only the blocks of data are allocated");
    }
    assert_eq!(rig.catalog.pool().qos().spec("r1").iops_limit, Some(5000), "its QoS settings stay");
    let (volumes, tiered) = records(&rig);
    assert!(volumes.iter().all(|v| !v.contains(".convert")), "no copy left: {volumes:?}");
    assert_eq!(tiered, ["ec", "r0", "r1", "r10"]);
    assert!(volumes.iter().all(|v| v.contains('.')), "no plain volume left: {volumes:?}");
    // What a plain volume could not do.
    rig.catalog.snapshot_create("r1", "s").await.expect("a snapshot of the converted volume");
    rig.volume("r1").write(0, IoBytes::copy_from(&[7u8; 4096]), Durability::Fua).await.expect("write");
    rig.catalog.volume_clone("r1@s", "c").await.expect("a clone");
    assert!(read_all(&rig, "c").await == wants[1], "the clone reads the converted bytes");
    rig.reopen().await;
    for (i, (name, _, _)) in plain.iter().enumerate() {
        assert!(is_log(&rig, name), "{name} after a reopen");
        if *name != "r1" {
            assert!(read_all(&rig, name).await == wants[i], "{name} after a reopen");
        }
    }
    assert!(read_all(&rig, "r1@s").await == wants[1], "the snapshot after a reopen");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_conversions_leave_the_pool_as_it_was() {
    let rig = Rig::new(32).await;
    let c = &rig.catalog;
    c.create(create_req("p", 4 * MIB, "raid1")).await.expect("create");
    c.create(create_req("lv", 4 * MIB, "tiered:ec:4+2")).await.expect("create");
    c.snapshot_create("lv", "s").await.expect("snapshot");
    c.volume_clone("lv@s", "cl").await.expect("clone");
    c.create(create_req("q", 4 * MIB, "raid1")).await.expect("create");
    c.create(create_req("q.convert", MIB, "raid1")).await.expect("create");
    let long = "n".repeat(51);
    c.create(create_req(&long, MIB, "raid1")).await.expect("create a volume of a 51-character name");
    let want = fill(&rig, "p", 7).await;
    let before = (c.names(), records(&rig));
    for (name, layout, kind, what) in [
        ("p", "raid10", ErrorKind::InvalidInput, "a plain layout"),
        ("p", "tiered:raid1", ErrorKind::InvalidInput, "a bad log layout"),
        ("p", "tiered:ec:8+2", ErrorKind::InvalidInput, "more shards than drives"),
        ("lv", "log:ec:4+2", ErrorKind::InvalidInput, "a log volume"),
        ("cl", "log:ec:4+2", ErrorKind::InvalidInput, "a clone"),
        ("lv.seg", "log:ec:4+2", ErrorKind::InvalidInput, "a part"),
        ("nope", "log:ec:4+2", ErrorKind::NotFound, "an unknown volume"),
        ("q", "log:ec:4+2", ErrorKind::InvalidInput, "a volume whose copy's name is taken"),
        (long.as_str(), "log:ec:4+2", ErrorKind::InvalidInput, "a name too long for its copy's"),
    ] {
        let e = c.convert(convert_req(name, layout), &mut |_, _| {}).await.expect_err(what);
        let got = catalog_kind(&e);
        assert!(
            got == kind || (kind == ErrorKind::InvalidInput && got == ErrorKind::Conflict),
            "{what}: {e} ({got:?})"
        );
    }
    // No space for the copy: a space the pool cannot give.
    let req = ConvertVolume { space_bytes: Some(4 << 30), ..convert_req("p", "log:ec:4+2") };
    let e = c.convert(req, &mut |_, _| {}).await.expect_err("no space");
    assert!(!matches!(catalog_kind(&e), ErrorKind::NotFound), "no space: {e}");
    assert_eq!((c.names(), records(&rig)), before, "a refusal leaves the pool as it was");
    assert!(!is_log(&rig, "p"));
    assert!(read_all(&rig, "p").await == want, "p as it was, and it serves");
}

/// A writer keeps writing to the plain volume while it is converted: every write acknowledged
/// reads back from the converted volume; the writes refused are refused as `Closed`, not lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_racing_a_conversion_are_refused_or_kept() {
    let rig = Rig::new(33).await;
    rig.catalog.create(create_req("p", 4 * MIB, "ec:4+2")).await.expect("create");
    let mut want = fill(&rig, "p", 8).await;
    let handle = rig.volume("p");
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let stop = Arc::clone(&stop);
        tokio::spawn(async move {
            let mut r = rng(9);
            let (mut acked, mut refused) = (Vec::new(), 0u32);
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let block = (i * 37) % (4 * MIB / BLOCK_BYTES);
                let data = random_bytes(&mut r, BLOCK_BYTES as usize);
                match handle.write(block * BLOCK_BYTES, IoBytes::copy_from(&data), Durability::Buffered).await
                {
                    Ok(()) => acked.push((block, data)),
                    Err(e) => {
                        assert!(e.to_string().contains("closed"), "a refused write says why: {e}");
                        refused += 1;
                    }
                }
                i += 1;
                tokio::task::yield_now().await;
            }
            (acked, refused)
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    rig.catalog.convert(convert_req("p", "tiered:ec:4+2"), &mut |_, _| {}).await.expect("convert");
    stop.store(true, Ordering::Relaxed);
    let (acked, refused) = writer.await.expect("writer");
    assert!(
        !acked.is_empty() && refused > 0,
        "writes landed before and were refused after: {} / {refused}",
        acked.len()
    );
    for (block, data) in &acked {
        let at = (*block * BLOCK_BYTES) as usize;
        want[at..at + data.len()].copy_from_slice(data);
    }
    assert!(read_all(&rig, "p").await == want, "every acknowledged write is in the converted volume");
}

/// A power cut after each of a spread of request counts through a conversion, then after each
/// request between the last cut that kept the plain volume and the first that did not (where
/// the commit lies): the boot finds the plain volume as it was, with no copy and no record more
/// than before, or the converted volume; both with the bytes, and both can go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_power_cut_anywhere_in_a_conversion_leaves_the_plain_volume_or_the_converted_one() {
    // Requests of one conversion without a cut.
    let total = {
        let rig = Rig::new(34).await;
        rig.catalog.create(create_req("p", 4 * MIB, "raid1")).await.expect("create");
        fill(&rig, "p", 10).await;
        let before = rig.switch.ops_passed();
        rig.catalog.convert(convert_req("p", "tiered:ec:4+2"), &mut |_, _| {}).await.expect("convert");
        rig.switch.ops_passed() - before
    };
    let step = (total / 24).max(1) as usize;
    // Background work (the new volume's destage) makes the count vary a little from run to run:
    // go on past it until a cut finds the volume converted.
    let mut outcomes = Vec::new();
    for cut in (0..2 * total).step_by(step) {
        let converted = cut_a_conversion(cut, total).await;
        outcomes.push((cut, converted));
        if converted && cut >= total {
            break;
        }
    }
    let last_plain = outcomes
        .iter()
        .filter(|(_, converted)| !converted)
        .map(|(c, _)| *c)
        .max()
        .expect("a cut kept it plain");
    let first_converted =
        outcomes.iter().filter(|(_, converted)| *converted).map(|(c, _)| *c).min().expect("a cut converted");
    // (The order of the two can be either: the background work moves the commit a little.)
    for cut in last_plain.min(first_converted)..last_plain.max(first_converted) {
        if outcomes.iter().all(|(c, _)| *c != cut) {
            outcomes.push((cut, cut_a_conversion(cut, total).await));
        }
    }
    let converted = outcomes.iter().filter(|(_, c)| *c).count();
    eprintln!(
        "{total} requests in a conversion; {} cuts: {} kept the plain volume, {converted} found it converted",
        outcomes.len(),
        outcomes.len() - converted
    );
}

/// One conversion cut after `cut` requests and the boot after it; true when the volume came back
/// converted.
async fn cut_a_conversion(cut: u64, total: u64) -> bool {
    let what = format!("a cut after {cut} of the conversion's {total} requests");
    let mut rig = Rig::new(34).await;
    rig.catalog.create(create_req("p", 4 * MIB, "raid1")).await.expect("create");
    let want = fill(&rig, "p", 10).await;
    let before = records(&rig);
    rig.switch.trip_after_ops(cut);
    let returned = rig.catalog.convert(convert_req("p", "tiered:ec:4+2"), &mut |_, _| {}).await.is_ok();
    rig.power_cut(cut).await;
    assert_eq!(rig.catalog.names(), ["p"], "{what}");
    let converted = is_log(&rig, "p");
    if !converted {
        assert!(!returned, "{what}: the conversion returned and the volume is plain again");
        assert_eq!(records(&rig), before, "{what}: the copy is gone and nothing leaked");
    }
    assert!(read_all(&rig, "p").await == want, "{what}: the bytes");
    let (volumes, tiered) = records(&rig);
    assert!(volumes.iter().chain(&tiered).all(|n| !n.contains(".convert")), "{what}: {volumes:?} {tiered:?}");
    if !converted {
        rig.catalog.convert(convert_req("p", "tiered:ec:4+2"), &mut |_, _| {}).await.expect("convert again");
        assert!(read_all(&rig, "p").await == want, "{what}: the bytes after converting again");
    }
    rig.catalog.snapshot_create("p", "s").await.expect("a snapshot");
    rig.volume("p").write(0, IoBytes::copy_from(&[1u8; 4096]), Durability::Fua).await.expect("a write");
    assert!(read_all(&rig, "p@s").await == want, "{what}: the snapshot");
    converted
}
