//! Silent corruption (bit flips), latent sector errors and misdirected writes on up to M drives
//! of an `ec:K+M` volume (and on one copy of mirrors): every bad block is detected, repaired from
//! redundancy and counted; none is ever returned to the reader.

#![allow(clippy::cast_possible_truncation)] // 64-bit only, like the engine

use std::collections::BTreeSet;

use crate::common::*;
use rand::Rng;
use stria_dev::{IoBytes, PowerSwitch};
use stria_engine::Layout;

const VOLUME_BYTES: u64 = 2 << 20;
const CHUNK: u64 = 16 << 10;

fn total_repairs(pool: &stria_engine::Pool<Dev>) -> u64 {
    pool.status().drives.iter().map(|d| d.checksum_repairs).sum()
}

#[tokio::test]
async fn bit_flips_and_latent_errors_on_up_to_m_drives_are_repaired_and_counted() {
    let cases = [
        (Layout::Ec { data_shards: 4, parity_shards: 2 }, 6),
        (Layout::Ec { data_shards: 3, parity_shards: 1 }, 4),
        (Layout::Ec { data_shards: 2, parity_shards: 3 }, 5),
        (Layout::Raid1 { copies: 2 }, 2),
        (Layout::Raid10 { width: 2, copies: 2 }, 4),
    ];
    for (layout, n) in cases {
        for seed in 0..6u64 {
            let switch = PowerSwitch::new();
            let devs = drives(n, &switch, seed);
            let pool = create_pool(&devs).await;
            let vol = pool.create_volume(spec("v", VOLUME_BYTES, layout, CHUNK)).await.unwrap();
            let mut model = Model::new(VOLUME_BYTES as usize);
            let mut rng = rng(seed);
            let data = random_bytes(&mut rng, VOLUME_BYTES as usize);
            write(&vol, &mut model, 0, data).await;
            pool.flush().await.unwrap();

            // Pick up to `tolerance` drives and damage blocks on them: data and parity alike.
            let tolerance = layout.tolerance() as usize;
            let victims: Vec<u32> = {
                let mut all: Vec<u32> = (0..n as u32).collect();
                let mut chosen = Vec::new();
                for _ in 0..rng.random_range(1..=tolerance) {
                    let i = rng.random_range(0..all.len());
                    chosen.push(all.remove(i));
                }
                chosen
            };
            let mut damaged: BTreeSet<(u32, u64)> = BTreeSet::new();
            for _ in 0..60 {
                let offset = rng.random_range(0..VOLUME_BYTES / 4096) * 4096;
                let locations = vol.locate(offset).unwrap();
                for loc in locations.iter().filter(|l| victims.contains(&l.slot)) {
                    let block = loc.device_offset_bytes / 4096;
                    if !damaged.insert((loc.slot, block)) {
                        continue;
                    }
                    let dev = &devs[loc.slot as usize];
                    if rng.random_bool(0.5) {
                        dev.flip_bit(block, rng.random_range(0..4096 * 8));
                    } else {
                        dev.add_latent_error(block);
                    }
                }
            }
            assert!(!damaged.is_empty());
            let before = total_repairs(&pool);
            // Every read returns the right data; scrub finds what reads did not touch (parity).
            check(&vol, &model).await;
            let report = pool.scrub("v", |_, _| {}).await.unwrap();
            assert_eq!(report.unrecoverable_blocks, 0, "{layout} seed {seed}: {report:?}");
            let repaired = total_repairs(&pool) - before;
            assert_eq!(
                repaired,
                damaged.len() as u64,
                "{layout} seed {seed}: injected {} bad blocks, repaired {repaired}",
                damaged.len()
            );
            // Nothing is left to find, and no drive was failed for it.
            let again = pool.scrub("v", |_, _| {}).await.unwrap();
            assert_eq!((again.blocks_repaired, again.parity_blocks_fixed), (0, 0), "{layout} seed {seed}");
            assert!(pool.status().drives.iter().all(|d| d.state == "active"));
            check(&vol, &model).await;
        }
    }
}

#[tokio::test]
async fn misdirected_and_lost_writes_are_caught_by_checksums() {
    for (layout, n) in
        [(Layout::Ec { data_shards: 4, parity_shards: 2 }, 6), (Layout::Raid1 { copies: 2 }, 2)]
    {
        for seed in 0..8u64 {
            let switch = PowerSwitch::new();
            let devs = drives(n, &switch, seed);
            let pool = create_pool(&devs).await;
            let vol = pool.create_volume(spec("v", VOLUME_BYTES, layout, CHUNK)).await.unwrap();
            let mut model = Model::new(VOLUME_BYTES as usize);
            let mut rng = rng(seed + 100);
            let data = random_bytes(&mut rng, VOLUME_BYTES as usize);
            write(&vol, &mut model, 0, data).await;
            // One drive misdirects or loses the data part of the next write.
            let victim = rng.random_range(0..n);
            if seed % 2 == 0 {
                devs[victim].arm_misdirected_write();
            } else {
                devs[victim].arm_lost_write();
            }
            for _ in 0..20 {
                let (o, d) = random_write(&mut rng, VOLUME_BYTES, vol.row_bytes());
                vol.write(o, IoBytes::copy_from(&d), false).await.unwrap();
                model.write(o as usize, &d);
            }
            check(&vol, &model).await;
            let report = pool.scrub("v", |_, _| {}).await.unwrap();
            assert_eq!(report.unrecoverable_blocks, 0, "{layout} seed {seed}: {report:?}");
            check(&vol, &model).await;
            let again = pool.scrub("v", |_, _| {}).await.unwrap();
            assert_eq!((again.blocks_repaired, again.parity_blocks_fixed), (0, 0), "{layout} seed {seed}");
        }
    }
}

/// Counters of one drive as `stria status` shows them.
fn drive_errors(pool: &stria_engine::Pool<Dev>, slot: u32) -> stria_engine::DriveStatus {
    pool.status().drives.into_iter().find(|d| d.id == slot).expect("the drive is listed")
}

#[tokio::test]
async fn error_counters_survive_a_reopen_until_cleared() {
    let layout = Layout::Ec { data_shards: 2, parity_shards: 1 };
    let switch = PowerSwitch::new();
    let devs = drives(3, &switch, 7);
    let pool = create_pool(&devs).await;
    let vol = pool.create_volume(spec("v", VOLUME_BYTES, layout, CHUNK)).await.unwrap();
    let mut model = Model::new(VOLUME_BYTES as usize);
    let mut rng = rng(7);
    write(&vol, &mut model, 0, random_bytes(&mut rng, VOLUME_BYTES as usize)).await;
    pool.flush().await.unwrap();

    // Drive 1: four flipped bits and four unreadable blocks. The scrub repairs them all and
    // commits the counters (one metadata commit for the whole error storm).
    let mut damaged = BTreeSet::new();
    for b in 0..VOLUME_BYTES / 4096 {
        for loc in vol.locate(b * 4096).unwrap().iter().filter(|l| l.slot == 1) {
            damaged.insert(loc.device_offset_bytes / 4096);
        }
    }
    let damaged: Vec<u64> = damaged.into_iter().step_by(7).take(8).collect();
    for (i, &block) in damaged.iter().enumerate() {
        if i % 2 == 0 { devs[1].flip_bit(block, 77) } else { devs[1].add_latent_error(block) }
    }
    let generation = pool.meta().generation;
    let report = pool.scrub("v", |_, _| {}).await.unwrap();
    assert_eq!((report.blocks_repaired, report.unrecoverable_blocks), (8, 0), "{report:?}");
    assert_eq!(pool.meta().generation, generation + 1, "one commit carries every counted error");
    let before = drive_errors(&pool, 1);
    assert_eq!(before.checksum_repairs, 8);
    assert!(before.read_errors >= 4, "each unreadable block failed a read: {before:?}");
    assert!(before.last_read_error_unix_secs.is_some_and(|t| t > 0));
    assert!(before.last_checksum_repair_unix_secs.is_some_and(|t| t > 0));
    assert_eq!((before.write_errors, before.last_write_error_unix_secs), (0, None));
    pool.close().await.unwrap();

    // A new process: the counters come back from the metadata, times included.
    let pool = open_pool(&devs).await.unwrap();
    let after = drive_errors(&pool, 1);
    let counters = |d: &stria_engine::DriveStatus| {
        (d.read_errors, d.last_read_error_unix_secs, d.checksum_repairs, d.last_checksum_repair_unix_secs)
    };
    assert_eq!(counters(&after), counters(&before));
    assert!([0, 2].iter().all(|&s| drive_errors(&pool, s).read_errors == 0));

    // A failed write counts too, on a drive the pool then fails; closing commits it.
    devs[2].arm_write_error();
    let vol = pool.volume("v").unwrap();
    vol.write(0, IoBytes::copy_from(&model.bytes[..CHUNK as usize * 2]), false).await.unwrap();
    assert_eq!(drive_errors(&pool, 2).write_errors, 1, "pending counts show before their commit");
    pool.close().await.unwrap();
    let present = vec![devs[0].clone(), devs[1].clone()]; // drive 2 is failed: stale now
    let pool = open_pool(&present).await.unwrap();
    let failed = drive_errors(&pool, 2);
    assert_eq!(failed.write_errors, 1);
    assert!(failed.last_write_error_unix_secs.is_some_and(|t| t > 0));
    assert_eq!(counters(&drive_errors(&pool, 1)), counters(&before));

    // Clearing one drive, then all, is committed: zeros after another reopen.
    assert_eq!(pool.clear_drive_errors(Some(1)).await.unwrap(), vec![1]);
    assert_eq!(drive_errors(&pool, 1).read_errors, 0);
    assert_eq!(drive_errors(&pool, 2).write_errors, 1, "only drive 1 was cleared");
    pool.clear_drive_errors(None).await.unwrap();
    assert!(pool.clear_drive_errors(Some(9)).await.is_err(), "no drive 9");
    pool.close().await.unwrap();
    let pool = open_pool(&present).await.unwrap();
    for d in pool.status().drives {
        let zero = (d.read_errors, d.write_errors, d.checksum_repairs) == (0, 0, 0);
        assert!(zero && d.last_read_error_unix_secs.is_none(), "drive {} after clear: {d:?}", d.id);
    }
    assert!(pool.meta().drives.iter().all(|r| r.errors.is_zero()));
    check(&pool.volume("v").unwrap(), &model).await;
}

/// A drive whose data and checksums are an old, self-consistent copy while its superblock and
/// metadata are current (what no generation can reveal: the old contents came back between two
/// commits). Scrub must decide by evidence: where the other members outvote it (three copies,
/// or ec with two parity shards) it rewrites that drive's blocks; where nothing says which
/// version is current (two copies, one parity shard) it reports them and rewrites nothing, so
/// it never spreads the old data.
#[tokio::test]
async fn scrub_decides_disagreements_by_evidence_never_by_which_drive_answered() {
    let cases = [
        (Layout::Ec { data_shards: 4, parity_shards: 2 }, 6, true),
        (Layout::Ec { data_shards: 2, parity_shards: 3 }, 5, true),
        (Layout::Raid1 { copies: 3 }, 3, true),
        (Layout::Ec { data_shards: 3, parity_shards: 1 }, 4, false),
        (Layout::Raid1 { copies: 2 }, 2, false),
    ];
    for (layout, n, decidable) in cases {
        for victim in 0..n {
            let switch = PowerSwitch::new();
            let devs = drives(n, &switch, 70 + victim as u64);
            let pool = create_pool(&devs).await;
            let vol = pool.create_volume(spec("v", VOLUME_BYTES, layout, CHUNK)).await.unwrap();
            vol.write(0, IoBytes::copy_from(&vec![0xaa; VOLUME_BYTES as usize]), false).await.unwrap();
            vol.flush().await.unwrap();
            let old = devs[victim].kill_image();
            vol.write(0, IoBytes::copy_from(&vec![0xbb; VOLUME_BYTES as usize]), false).await.unwrap();
            pool.close().await.unwrap();
            // The victim's checksum table and data area go back to the old copy.
            let l = pool.drives()[victim].superblock().layout;
            drop((vol, pool));
            for (start, len) in [(l.csum_offset_bytes, l.csum_bytes), (l.data_offset_bytes, l.data_bytes)] {
                let mut buf = vec![0u8; len as usize];
                old.read_at(start, &mut buf);
                devs[victim].poke(start, &buf);
            }
            let pool = open_pool(&reboot(&devs, 1)).await.unwrap();
            let report = pool.scrub("v", |_, _| {}).await.unwrap();
            let vol = pool.volume("v").unwrap();
            let got = vol.read(0, VOLUME_BYTES as usize).await.unwrap();
            let old_blocks = got.chunks(4096).filter(|b| b.iter().all(|&x| x == 0xaa)).count();
            if decidable {
                assert_eq!(report.inconsistent_blocks, 0, "{layout} drive {victim}: {report:?}");
                assert!(report.copy_blocks_fixed + report.parity_blocks_fixed > 0, "{layout}: {report:?}");
                assert_eq!(old_blocks, 0, "{layout} drive {victim}: old data after scrub");
                let again = pool.scrub("v", |_, _| {}).await.unwrap();
                assert_eq!((again.copy_blocks_fixed, again.parity_blocks_fixed), (0, 0), "{again:?}");
            } else {
                assert!(report.inconsistent_blocks > 0, "{layout} drive {victim}: {report:?}");
                assert_eq!(
                    (report.copy_blocks_fixed, report.parity_blocks_fixed),
                    (0, 0),
                    "{layout} drive {victim}: scrub rewrote blocks it could not prove current"
                );
            }
        }
    }
}

/// The checksum page (drive, device offset of the page) that covers the volume block at
/// `offset` on its first data member.
fn csum_page_of(
    pool: &stria_engine::Pool<Dev>,
    vol: &stria_engine::Volume<Dev>,
    offset: u64,
) -> (usize, u64) {
    let loc =
        vol.locate(offset).unwrap().into_iter().find(|l| l.role == stria_engine::BlockRole::Data).unwrap();
    let drive = pool.drives().iter().find(|d| d.slot() == loc.slot).cloned().unwrap();
    let l = drive.superblock().layout;
    let block = (loc.device_offset_bytes - l.data_offset_bytes) / 4096;
    (loc.slot as usize, l.csum_offset_bytes + block / 1020 * 4096)
}

/// Flips a byte of the checksum page at `page_offset` of `dev`.
async fn damage(dev: &Dev, page_offset: u64) {
    use stria_dev::{BlockDevice, IoBuf};
    let mut page = dev.read(page_offset, IoBuf::zeroed(4096)).await.unwrap();
    page[200] ^= 0x10;
    dev.write(page_offset, IoBytes::copy_from(&page), false).await.unwrap();
    dev.flush().await.unwrap();
}

/// A checksum page that no longer passes its CRC (a media error in the table, or a torn page
/// write) describes up to 1020 blocks whose checksums are now unknown. Found at open (its
/// region was dirty: a crash) or later when first paged in (a clean region), its blocks are
/// resynchronised from what they hold, never read as zeros and never returned unverified;
/// the page is rewritten and the next open finds it whole. Every layout, raid0 included.
#[tokio::test]
async fn a_damaged_checksum_page_is_resynchronised_never_trusted_or_zeroed() {
    let layouts = [
        (Layout::Raid0 { width: 2 }, 2),
        (Layout::Raid1 { copies: 2 }, 2),
        (Layout::Ec { data_shards: 4, parity_shards: 2 }, 6),
    ];
    for (layout, n) in layouts {
        for crash in [false, true] {
            let what = format!("{layout}, {}", if crash { "after a crash" } else { "after a clean stop" });
            let switch = PowerSwitch::new();
            let devs = drives(n, &switch, 7);
            let pool = create_pool(&devs).await;
            let vol = pool.create_volume(spec("v", VOLUME_BYTES, layout, CHUNK)).await.unwrap();
            let mut model = Model::new(VOLUME_BYTES as usize);
            let data = random_bytes(&mut rng(3), VOLUME_BYTES as usize);
            write(&vol, &mut model, 0, data).await;
            pool.flush().await.unwrap();
            let (slot, page_offset) = csum_page_of(&pool, &vol, 0);
            let devs = if crash {
                // Intent bits stay set: the next open loads this page and finds the damage.
                drop(vol);
                drop(pool);
                reboot(&devs, 11)
            } else {
                pool.close().await.unwrap();
                devs
            };
            damage(&devs[slot], page_offset).await;

            let pool = open_pool(&devs).await.unwrap();
            let vol = pool.volume("v").unwrap();
            let at_open = pool.recovery_report().bad_csum_pages;
            assert_eq!(at_open, u64::from(crash), "{what}: found at open only when its region was dirty");
            let errors = check_or_error(&vol, &model).await;
            if !crash {
                let found = pool.drives()[slot].csum_cache_stats().damaged_pages;
                assert_eq!(found, 1, "{what}: found when paged in");
                if layout.tolerance() == 0 {
                    assert!(errors > 0, "{what}: unverifiable blocks without redundancy are errors");
                }
                pool.tick().await.unwrap();
            }
            check(&vol, &model).await;
            pool.close().await.unwrap();

            let pool = open_pool(&devs).await.unwrap();
            let vol = pool.volume("v").unwrap();
            check(&vol, &model).await;
            let stats = pool.drives()[slot].csum_cache_stats();
            assert_eq!(
                (pool.recovery_report().bad_csum_pages, stats.damaged_pages),
                (0, 0),
                "{what}: rewritten"
            );
        }
    }
}

/// Reads the whole volume with `read_with_crcs` in pieces of `piece` bytes: the data is the
/// model's and each checksum is its block's (written, unwritten, repaired alike).
async fn check_with_crcs(vol: &stria_engine::Volume<Dev>, model: &Model, piece: usize, what: &str) {
    for at in (0..model.bytes.len()).step_by(piece) {
        let piece = piece.min(model.bytes.len() - at);
        let (buf, crcs) = vol
            .read_with_crcs(at as u64, piece)
            .await
            .unwrap_or_else(|e| panic!("{what}: read at {at}: {e}"));
        assert!(buf[..] == model.bytes[at..at + piece], "{what}: data at {at}");
        let want: Vec<u32> =
            model.bytes[at..at + piece].chunks_exact(4096).map(stria_dev::block_crc).collect();
        assert_eq!(crcs, want, "{what}: checksums at {at}");
    }
}

/// Whole-block writes may carry their blocks' checksums (the tier computes a block's CRC once,
/// for its map entry, and hands it down): every layout stores exactly those, so every block
/// reads back verified and a scrub finds nothing to repair, before and after a reopen; a block
/// damaged after such a write is still caught and repaired from redundancy. Reads that return
/// the checksums they verified return each block's, on the fast path and the repairing one.
#[tokio::test]
async fn writes_that_carry_their_checksums_verify_scrub_clean_and_catch_damage() {
    for (layout, n) in layouts() {
        for seed in 0..3u64 {
            let switch = PowerSwitch::new();
            let devs = drives(n, &switch, seed);
            let pool = create_pool(&devs).await;
            let vol = pool.create_volume(spec("v", VOLUME_BYTES, layout, CHUNK)).await.unwrap();
            let mut model = Model::new(VOLUME_BYTES as usize);
            let mut rng = rng(seed + 300);
            let blocks = VOLUME_BYTES / 4096;
            let row_blocks = vol.row_bytes() / 4096;
            let mut written = BTreeSet::new();
            for i in 0..60 {
                // Whole rows (full stripes), a chunk's worth, and single blocks.
                let (first, len) = match i % 3 {
                    0 => {
                        let r = rng.random_range(0..blocks / row_blocks);
                        (r * row_blocks, row_blocks * rng.random_range(1..=2.min(blocks / row_blocks - r)))
                    }
                    1 => {
                        let b = rng.random_range(0..blocks - CHUNK / 4096);
                        (b, CHUNK / 4096)
                    }
                    _ => (rng.random_range(0..blocks), 1),
                };
                let data = random_bytes(&mut rng, (len * 4096) as usize);
                let crcs: Vec<u32> = data.chunks_exact(4096).map(stria_dev::block_crc).collect();
                vol.write_with_crcs(first * 4096, IoBytes::copy_from(&data), &crcs, i % 2 == 0)
                    .await
                    .unwrap_or_else(|e| panic!("{layout} seed {seed}: write at block {first}: {e}"));
                model.write((first * 4096) as usize, &data);
                written.extend(first..first + len);
            }
            check(&vol, &model).await;
            check_with_crcs(&vol, &model, 4096 * (1 + seed as usize * 7), &format!("{layout} seed {seed}"))
                .await;
            let report = pool.scrub("v", |_, _| {}).await.unwrap();
            assert_eq!(
                (report.blocks_repaired, report.parity_blocks_fixed, report.unrecoverable_blocks),
                (0, 0, 0),
                "{layout} seed {seed}: {report:?}"
            );
            pool.flush().await.unwrap();
            drop(vol);
            pool.close().await.unwrap();
            let pool = open_pool(&devs).await.unwrap();
            let vol = pool.volume("v").unwrap();
            check(&vol, &model).await;
            if layout.tolerance() == 0 {
                continue;
            }
            // Damage a written block on one drive: its stored checksum catches it.
            let written: Vec<u64> = written.into_iter().collect();
            let offset = written[rng.random_range(0..written.len())] * 4096;
            let (slot, at) = {
                let l = &vol.locate(offset).unwrap()[0];
                (l.slot, l.device_offset_bytes)
            };
            devs[slot as usize].flip_bit(at / 4096, rng.random_range(0..4096 * 8));
            let before = total_repairs(&pool);
            // The damaged block's read goes down the repairing path.
            check_with_crcs(&vol, &model, 16 << 10, &format!("{layout} seed {seed}, damaged")).await;
            check(&vol, &model).await;
            let report = pool.scrub("v", |_, _| {}).await.unwrap();
            assert_eq!(report.unrecoverable_blocks, 0, "{layout} seed {seed}: {report:?}");
            assert_eq!(
                total_repairs(&pool) - before,
                1,
                "{layout} seed {seed}: the flipped block is repaired once"
            );
        }
    }
}

/// A checksum that does not match its block is a bug of the caller: debug builds stop there
/// rather than store it (the block would read as corrupt on every copy).
#[cfg(debug_assertions)]
#[tokio::test]
#[should_panic(expected = "carries a wrong checksum")]
async fn a_write_carrying_a_wrong_checksum_stops_debug_builds() {
    let switch = PowerSwitch::new();
    let devs = drives(2, &switch, 0);
    let pool = create_pool(&devs).await;
    let vol = pool.create_volume(spec("v", VOLUME_BYTES, Layout::Raid1 { copies: 2 }, CHUNK)).await.unwrap();
    let data = vec![7u8; 8192];
    let mut crcs: Vec<u32> = data.chunks_exact(4096).map(stria_dev::block_crc).collect();
    crcs[1] ^= 1;
    let _ = vol.write_with_crcs(0, IoBytes::copy_from(&data), &crcs, false).await;
}
