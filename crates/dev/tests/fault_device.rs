//! Each fault kind of the fault-injecting drive, its determinism, and power-cut semantics.

use std::sync::Arc;

use stria_dev::exec::block_on;
use stria_dev::fault::PowerCutPoint;
use stria_dev::mem::MemDevice;
use stria_dev::{
    BLOCK_BYTES, BLOCK_USIZE as BLOCK, BlockDevice, DevError, FaultConfig, FaultDevice, FaultEvent,
    FaultKind, IoBuf, IoBytes, PowerSwitch,
};

const DRIVE_BYTES: u64 = 64 * BLOCK_BYTES;

fn filled(fill: u8, blocks: usize) -> IoBytes {
    IoBytes::copy_from(&vec![fill; blocks * BLOCK])
}

fn write(dev: &FaultDevice, block_index: u64, fill: u8, blocks: usize) -> Result<(), DevError> {
    block_on(dev.write(block_index * BLOCK_BYTES, filled(fill, blocks), false))
}

fn read(dev: &FaultDevice, block_index: u64, blocks: usize) -> Result<IoBuf, DevError> {
    block_on(dev.read(block_index * BLOCK_BYTES, IoBuf::zeroed(blocks * BLOCK)))
}

/// The fill byte of each block of the live contents (bypassing faults); `None` if mixed.
fn fills(peek: impl Fn(u64, &mut [u8]), blocks: std::ops::Range<u64>) -> Vec<Option<u8>> {
    blocks
        .map(|b| {
            let mut buf = vec![0u8; BLOCK];
            peek(b * BLOCK_BYTES, &mut buf);
            buf.iter().all(|&x| x == buf[0]).then_some(buf[0])
        })
        .collect()
}

fn image_fills(image: &MemDevice, blocks: std::ops::Range<u64>) -> Vec<Option<u8>> {
    fills(|at, out| image.read_at(at, out), blocks)
}

fn dev_fills(dev: &FaultDevice, blocks: std::ops::Range<u64>) -> Vec<Option<u8>> {
    fills(|at, out| dev.peek(at, out), blocks)
}

#[test]
fn transient_errors_follow_probability_and_arming_and_are_counted() {
    let config =
        FaultConfig { read_error_probability: 0.3, write_error_probability: 0.2, ..Default::default() };
    let dev = FaultDevice::with_config(MemDevice::new("f0", DRIVE_BYTES), config, 7);
    let mut failed_writes = 0;
    let mut failed_reads = 0;
    for i in 0..200u64 {
        failed_writes += u64::from(write(&dev, i % 64, 1, 1).is_err());
        failed_reads += u64::from(read(&dev, i % 64, 1).is_err());
    }
    let counts = dev.counts();
    assert_eq!((counts.write_errors, counts.read_errors), (failed_writes, failed_reads));
    assert!((20..60).contains(&failed_writes), "about 20% of 200: {failed_writes}");
    assert!((35..90).contains(&failed_reads), "about 30% of 200: {failed_reads}");
    assert_eq!(dev.counters().snapshot().errors, failed_reads + failed_writes);

    let quiet = FaultDevice::new("f1", DRIVE_BYTES, 1);
    quiet.arm_read_error();
    quiet.arm_write_error();
    let err = read(&quiet, 0, 1).unwrap_err();
    assert!(err.is_media_error());
    assert!(read(&quiet, 0, 1).is_ok(), "an armed fault fires once");
    assert!(write(&quiet, 0, 5, 1).is_err());
    assert_eq!(dev_fills(&quiet, 0..1), vec![Some(0)], "a failed write writes nothing");
}

#[test]
fn a_drive_dies_on_command_or_after_its_countdown() {
    let config = FaultConfig { die_after_ops: Some(3), ..Default::default() };
    let dev = FaultDevice::with_config(MemDevice::new("f0", DRIVE_BYTES), config, 1);
    for _ in 0..3 {
        write(&dev, 0, 1, 1).unwrap();
    }
    assert!(read(&dev, 0, 1).is_err());
    assert!(block_on(dev.flush()).is_err());
    assert!(dev.is_dead());
    let counts = dev.counts();
    assert_eq!((counts.drive_deaths, counts.dead_drive_requests), (1, 2));

    let other = FaultDevice::new("f1", DRIVE_BYTES, 1);
    write(&other, 0, 1, 1).unwrap();
    other.kill();
    assert!(read(&other, 0, 1).is_err());
    assert!(block_on(other.discard(0, BLOCK_BYTES)).is_err());
    assert_eq!(other.counts().drive_deaths, 1);
}

#[test]
fn latent_sector_errors_fail_reads_until_rewritten() {
    let config = FaultConfig { latent_error_blocks: vec![5], ..Default::default() };
    let dev = FaultDevice::with_config(MemDevice::new("f0", DRIVE_BYTES), config, 1);
    dev.add_latent_error(9);
    assert_eq!(dev.latent_error_blocks(), vec![5, 9]);
    assert!(read(&dev, 4, 2).is_err(), "a read covering block 5 fails");
    assert!(read(&dev, 5, 1).is_err(), "and keeps failing");
    assert!(read(&dev, 6, 3).is_ok());
    write(&dev, 5, 3, 1).unwrap();
    assert_eq!(&read(&dev, 5, 1).unwrap()[..], &[3u8; BLOCK][..]);
    assert!(read(&dev, 9, 1).is_err());
    let counts = dev.counts();
    assert_eq!((counts.latent_errors_added, counts.latent_read_failures), (2, 3));
    assert!(dev.events().iter().any(|e| e.kind == FaultKind::LatentReadFailure { block_index: 9 }));
}

#[test]
fn bit_flips_corrupt_stored_data_or_only_what_a_read_returns() {
    let dev = FaultDevice::new("f0", DRIVE_BYTES, 3);
    write(&dev, 2, 0, 4).unwrap();
    dev.flip_bit(3, 9);
    let got = read(&dev, 3, 1).unwrap();
    assert_eq!(got[1], 2, "bit 9 is bit 1 of byte 1");
    assert_eq!(got.iter().map(|b| b.count_ones()).sum::<u32>(), 1);
    let (block_index, bit_index) = dev.flip_random_bit(2..6);
    assert!((2..6).contains(&block_index));
    let got = read(&dev, block_index, 1).unwrap();
    assert_ne!(got[(bit_index / 8) as usize] & (1 << (bit_index % 8)), 0);
    assert_eq!(dev.counts().stored_bit_flips, 2);

    let config = FaultConfig { read_bit_flip_probability: 1.0, ..Default::default() };
    let flaky = FaultDevice::with_config(MemDevice::new("f1", DRIVE_BYTES), config, 3);
    let got = read(&flaky, 0, 2).unwrap();
    assert_eq!(got.iter().map(|b| b.count_ones()).sum::<u32>(), 1, "one bit flipped on the way");
    assert_eq!(dev_fills(&flaky, 0..2), vec![Some(0), Some(0)], "the medium is intact");
    assert_eq!(flaky.counts().read_bit_flips, 1);
}

#[test]
fn a_misdirected_write_lands_elsewhere_and_the_target_keeps_old_data() {
    let dev = FaultDevice::new("f0", DRIVE_BYTES, 11);
    write(&dev, 10, 1, 2).unwrap();
    dev.arm_misdirected_write();
    write(&dev, 10, 2, 2).unwrap();
    assert_eq!(dev_fills(&dev, 10..12), vec![Some(1), Some(1)]);
    let event = dev.events().pop().unwrap();
    let FaultKind::MisdirectedWrite { landed_offset_bytes } = event.kind else { panic!("{event:?}") };
    assert_ne!(landed_offset_bytes, 10 * BLOCK_BYTES);
    let landed = landed_offset_bytes / BLOCK_BYTES;
    assert!(landed + 2 <= 10 || landed >= 12, "no overlap with the intended blocks: {landed}");
    assert_eq!(dev_fills(&dev, landed..landed + 2), vec![Some(2), Some(2)]);
    // Many misdirected writes: never onto the intended blocks.
    for _ in 0..50 {
        dev.arm_misdirected_write();
        write(&dev, 10, 4, 2).unwrap();
        assert_eq!(dev_fills(&dev, 10..12), vec![Some(1), Some(1)]);
    }
    assert_eq!(dev.counts().misdirected_writes, 51);
}

#[test]
fn lost_and_torn_writes_are_acknowledged_but_not_fully_stored() {
    let dev = FaultDevice::new("f0", DRIVE_BYTES, 5);
    write(&dev, 0, 1, 8).unwrap();
    dev.arm_lost_write();
    write(&dev, 0, 2, 8).unwrap();
    assert_eq!(dev_fills(&dev, 0..8), vec![Some(1); 8]);
    dev.arm_torn_write();
    write(&dev, 0, 3, 8).unwrap();
    let after = dev_fills(&dev, 0..8);
    let landed = after.iter().filter(|f| **f == Some(3)).count();
    assert!(after.iter().all(|f| matches!(f, Some(1 | 3))));
    assert!((1..8).contains(&landed), "some but not all blocks landed: {after:?}");
    let event = dev.events().pop().unwrap();
    assert_eq!(event.kind, FaultKind::TornWrite { blocks_landed: landed as u64, blocks_total: 8 });
    let counts = dev.counts();
    assert_eq!((counts.lost_writes, counts.torn_writes, counts.silent_corruptions()), (1, 1, 2));
}

/// A workload with every probabilistic fault enabled: the same seed gives the same log and
/// contents; another seed gives another.
fn chaotic_run(seed: u64) -> (Vec<FaultEvent>, Vec<Option<u8>>) {
    let config = FaultConfig {
        read_error_probability: 0.05,
        write_error_probability: 0.05,
        read_bit_flip_probability: 0.05,
        misdirected_write_probability: 0.05,
        lost_write_probability: 0.05,
        torn_write_probability: 0.2,
        ..Default::default()
    };
    let dev = FaultDevice::with_config(MemDevice::new("f0", DRIVE_BYTES), config, seed);
    for i in 0..300u64 {
        let fill = u8::try_from(i % 250).unwrap() + 1;
        let _ = write(&dev, (i * 7) % 60, fill, 1 + usize::try_from(i % 4).unwrap());
        let _ = read(&dev, (i * 3) % 60, 2);
        if i % 50 == 0 {
            let _ = block_on(dev.flush());
        }
    }
    (dev.events(), dev_fills(&dev, 0..64))
}

#[test]
fn the_same_seed_and_requests_give_the_same_outcome() {
    let first = chaotic_run(99);
    assert!(first.0.len() > 20, "the run injected faults");
    assert_eq!(first, chaotic_run(99));
    assert_ne!(first, chaotic_run(100));
}

#[test]
fn a_power_cut_hits_every_drive_on_the_switch_at_one_point() {
    let switch = PowerSwitch::new();
    let drives: Vec<FaultDevice> = (0..3)
        .map(|i| FaultDevice::new(&format!("d{i}"), DRIVE_BYTES, i).with_power_switch(Arc::clone(&switch)))
        .collect();
    // 2 requests per drive per round; cut in the middle of round 3, on the second drive.
    switch.trip_after_ops(2 * 3 * 2 + 3);
    let mut failures_seen = 0;
    for round in 0..5u8 {
        for dev in &drives {
            failures_seen += u32::from(write(dev, u64::from(round), round + 1, 1).is_err());
            failures_seen += u32::from(block_on(dev.flush()).is_err());
        }
    }
    assert!(switch.is_off());
    assert_eq!(switch.cut_point(), Some(PowerCutPoint { device: "d1".into(), ops_before_cut: 15 }));
    assert_eq!(failures_seen, 30 - 15);
    let cuts: u64 = drives.iter().map(|d| d.counts().power_cuts).sum();
    assert_eq!(cuts, 1);
    assert!(read(&drives[0], 0, 1).is_err(), "every request fails after the cut");
    for dev in &drives {
        let image = dev.crash_image(1);
        // Rounds 0..=1 were flushed everywhere; round 2 on d0 was flushed too.
        assert_eq!(image_fills(&image, 0..2), vec![Some(1), Some(2)]);
        assert_eq!(image_fills(&image, 3..5), vec![Some(0), Some(0)], "nothing after the cut");
    }
    assert_eq!(image_fills(&drives[0].crash_image(1), 2..3), vec![Some(3)]);
}

#[test]
fn after_a_cut_flushed_data_survives_and_unflushed_blocks_are_old_or_new() {
    let switch = PowerSwitch::new();
    let dev = FaultDevice::new("d0", DRIVE_BYTES, 3).with_power_switch(Arc::clone(&switch));
    write(&dev, 0, 1, 16).unwrap();
    block_on(dev.flush()).unwrap();
    write(&dev, 0, 2, 8).unwrap(); // unflushed, 8 blocks: each may land or not
    write(&dev, 4, 3, 8).unwrap(); // overlaps: blocks 4..8 have three versions
    block_on(dev.write(20 * BLOCK_BYTES, filled(9, 2), true)).unwrap(); // FUA: durable at once
    assert_eq!(dev.unflushed_blocks(), 12);
    switch.trip();
    assert!(write(&dev, 30, 4, 1).is_err());
    let mut seen_per_block = vec![std::collections::BTreeSet::new(); 16];
    for seed in 0..200 {
        let image = dev.crash_image(seed);
        let got = image_fills(&image, 0..16);
        for (block, fill) in got.iter().enumerate() {
            let allowed: &[u8] = match block {
                0..4 => &[1, 2],
                4..8 => &[1, 2, 3],
                8..12 => &[1, 3],
                _ => &[1],
            };
            let fill = fill.expect("never a mix of versions inside one block");
            assert!(allowed.contains(&fill), "block {block} holds {fill} (seed {seed})");
            seen_per_block[block].insert(fill);
        }
        assert_eq!(image_fills(&image, 20..22), vec![Some(9), Some(9)]);
        assert_eq!(image_fills(&image, 30..31), vec![Some(0)]);
    }
    assert_eq!(seen_per_block[5].len(), 3, "every version shows up for some seed");
    assert_eq!(dev.crash_image(7).size_bytes(), DRIVE_BYTES);
    // The reboot: the image becomes a fresh drive.
    let rebooted = FaultDevice::with_config(dev.crash_image(7), FaultConfig::default(), 8);
    assert!(read(&rebooted, 0, 16).is_ok());
    assert_eq!(rebooted.name(), "d0");
}
