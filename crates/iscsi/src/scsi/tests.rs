//! The command layer against an in-memory volume that keeps its data and a per-4 KiB allocation
//! map, so that every answer can be checked against what was written.

// Test sizes and offsets are small constants: a 4 MiB volume, byte patterns.
#![allow(clippy::cast_possible_truncation)]

use std::sync::Arc;

use stria_dev::IoBytes;
use stria_front::{Attachment, Registry};
use stria_volume::{BlockVolume, Durability};

use super::*;

const VOLUME_BYTES: u64 = crate::testing::MEM_VOLUME_BYTES;
const VOLUME_BLOCKS: u64 = VOLUME_BYTES / 512;

use crate::testing::MemVolume;

struct Fixture {
    lu: LogicalUnit,
    volume: Arc<MemVolume>,
    attachment: Attachment,
    _registry: Registry,
}

fn nexus(name: &str) -> Nexus {
    Nexus { initiator_port: format!("{name},i,0x000000000001"), relative_target_port: 1 }
}

fn fixture_with(read_only: bool) -> Fixture {
    let registry = Registry::new();
    let volume = Arc::new(MemVolume::new(read_only));
    registry.insert("v", Arc::clone(&volume) as Arc<dyn BlockVolume>);
    let attachment = registry.attach("v").expect("served");
    let lu = LogicalUnit::new("iqn.2024-01.io.stria:v", "serial-v");
    Fixture { lu, volume, attachment, _registry: registry }
}

fn fixture() -> Fixture {
    fixture_with(false)
}

impl Fixture {
    async fn run(&self, who: &Nexus, cdb: &[u8], data_out: &[u8]) -> Response {
        self.lu.execute(&self.attachment, who, cdb, IoBytes::copy_from(data_out)).await
    }

    async fn good(&self, who: &Nexus, cdb: &[u8], data_out: &[u8]) -> Vec<u8> {
        let r = self.run(who, cdb, data_out).await;
        assert_eq!(r.status, GOOD, "{cdb:02x?}: {:02x?}", r.sense);
        r.data_in.map(|d| d.to_vec()).unwrap_or_default()
    }
}

/// Sense key, ASC and ASCQ of a CHECK CONDITION.
fn sense_of(r: &Response) -> (u8, u8, u8) {
    assert_eq!(r.status, CHECK_CONDITION, "expected CHECK CONDITION");
    let s = r.sense.as_ref().expect("sense data");
    assert_eq!(s.len(), FIXED_SENSE_BYTES);
    assert_eq!(s[0] & 0x7F, 0x70, "fixed format, current");
    assert_eq!(s[7], 10);
    (s[2] & 0x0F, s[12], s[13])
}

fn read10(lba: u32, blocks: u16) -> Vec<u8> {
    let mut c = vec![0x28, 0];
    c.extend_from_slice(&lba.to_be_bytes());
    c.push(0);
    c.extend_from_slice(&blocks.to_be_bytes());
    c.push(0);
    c
}

fn write10(lba: u32, blocks: u16, fua: bool) -> Vec<u8> {
    let mut c = read10(lba, blocks);
    c[0] = 0x2A;
    c[1] = if fua { 0x08 } else { 0 };
    c
}

fn cdb16(opcode: u8, byte1: u8, lba: u64, count: u32) -> Vec<u8> {
    let mut c = vec![opcode, byte1];
    c.extend_from_slice(&lba.to_be_bytes());
    c.extend_from_slice(&count.to_be_bytes());
    c.extend_from_slice(&[0, 0]);
    c
}

const ILLEGAL: u8 = 0x05;

#[tokio::test]
async fn standard_inquiry_and_every_vpd_page_have_consistent_lengths() {
    let f = fixture();
    let a = nexus("a");
    let std = f.good(&a, &[0x12, 0, 0, 1, 4, 0], &[]).await;
    assert_eq!(std.len(), 96);
    assert_eq!(usize::from(std[4]) + 5, std.len(), "ADDITIONAL LENGTH");
    assert_eq!((std[0], std[2], std[3] & 0x0F), (0, 0x06, 2), "disk, SPC-4, format 2");
    assert_eq!(std[7] & 0x02, 0x02, "CMDQUE");
    assert_eq!(&std[8..16], b"STRIA   ");
    assert_eq!(&std[16..32], b"vol__1          ", "product: the volume's name in printable ASCII");
    assert!(std[8..36].iter().all(|b| (0x20..=0x7E).contains(b)));
    // Cut to the allocation length.
    assert_eq!(f.good(&a, &[0x12, 0, 0, 0, 36, 0], &[]).await.len(), 36);

    let page = |code| [0x12, 1, code, 1, 0, 0];
    let supported = f.good(&a, &page(0x00), &[]).await;
    assert_eq!(&supported[4..], &[0x00, 0x80, 0x83, 0xB0, 0xB1, 0xB2]);
    for code in [0x00, 0x80, 0x83, 0xB0, 0xB1, 0xB2] {
        let p = f.good(&a, &page(code), &[]).await;
        assert_eq!(p[1], code);
        assert_eq!(usize::from(u16::from_be_bytes([p[2], p[3]])) + 4, p.len(), "page {code:#x} length");
    }
    assert_eq!(&f.good(&a, &page(0x80), &[]).await[4..], b"serial-v");
    let limits = f.good(&a, &page(0xB0), &[]).await;
    assert_eq!(limits.len(), 64);
    assert_eq!(limits[4] & 1, 1, "WSNZ");
    assert_eq!(limits[5], 255, "MAXIMUM COMPARE AND WRITE LENGTH");
    assert_eq!(u16::from_be_bytes([limits[6], limits[7]]), 128, "64 KiB granularity");
    assert_eq!(u32::from_be_bytes(limits[8..12].try_into().unwrap()), MAX_TRANSFER_BLOCKS);
    assert_eq!(u32::from_be_bytes(limits[28..32].try_into().unwrap()), 8, "unmap granularity");
    let lbp = f.good(&a, &page(0xB2), &[]).await;
    assert_eq!((lbp[5], lbp[6] & 0x07), (0xE4, 2), "LBPU LBPWS LBPWS10 LBPRZ, thin");
    assert_eq!(f.good(&a, &page(0xB1), &[]).await[4..6], [0, 1], "non-rotating");

    // Device identification: NAA 3 first, the target's SCSI name string somewhere.
    let id = f.good(&a, &page(0x83), &[]).await;
    assert_eq!(&id[4..8], &[0x01, 0x03, 0, 8]);
    assert_eq!(id[8] >> 4, 3, "NAA locally assigned");
    let mut at = 4;
    let mut types = Vec::new();
    while at < id.len() {
        types.push(id[at + 1] & 0x0F);
        if id[at + 1] & 0x0F == 8 {
            let len = usize::from(id[at + 3]);
            assert_eq!(len % 4, 0, "SCSI name string padded to 4");
            assert!(id[at + 4..at + 4 + len].starts_with(b"iqn.2024-01.io.stria:v\0"));
        }
        at += 4 + usize::from(id[at + 3]);
    }
    assert_eq!(at, id.len(), "descriptors fill the page exactly");
    assert_eq!(types, [3, 1, 4, 8]);
    let other = LogicalUnit::new("iqn.2024-01.io.stria:w", "serial-w");
    assert_ne!(other.naa, f.lu.naa, "another volume, another identifier");

    // Unsupported page, page code without EVPD, CmdDt.
    for cdb in [page(0x86), [0x12, 0, 0x80, 0, 255, 0], [0x12, 2, 0, 0, 255, 0]] {
        assert_eq!(sense_of(&f.run(&a, &cdb, &[]).await), (ILLEGAL, 0x24, 0));
    }
}

#[tokio::test]
async fn read_capacity_reports_512_byte_blocks_thin_and_4k_physical() {
    let f = fixture();
    let a = nexus("a");
    let rc10 = f.good(&a, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[]).await;
    assert_eq!(u32::from_be_bytes(rc10[0..4].try_into().unwrap()), (VOLUME_BLOCKS - 1) as u32);
    assert_eq!(u32::from_be_bytes(rc10[4..8].try_into().unwrap()), 512);
    let rc16 = f.good(&a, &cdb16(0x9E, 0x10, 0, 32), &[]).await;
    assert_eq!(rc16.len(), 32);
    assert_eq!(u64::from_be_bytes(rc16[0..8].try_into().unwrap()), VOLUME_BLOCKS - 1);
    assert_eq!(u32::from_be_bytes(rc16[8..12].try_into().unwrap()), 512);
    assert_eq!((rc16[13] & 0x0F, rc16[14] & 0xC0), (3, 0xC0), "8 per physical block, LBPME LBPRZ");
    assert_eq!(f.good(&a, &cdb16(0x9E, 0x10, 0, 12), &[]).await.len(), 12, "allocation length");
    // An LBA without PMI, and an unknown service action.
    let r = f.run(&a, &[0x25, 0, 0, 0, 0, 1, 0, 0, 0, 0], &[]).await;
    assert_eq!(sense_of(&r), (ILLEGAL, 0x24, 0));
    let r = f.run(&a, &cdb16(0x9E, 0x1F, 0, 32), &[]).await;
    assert_eq!(sense_of(&r), (ILLEGAL, 0x24, 0));
    assert_eq!(r.sense.unwrap()[15..18], [0xC0 | 0x08 | 4, 0, 1], "field pointer: the service action");
}

#[tokio::test]
async fn writes_read_back_with_their_durability() {
    let f = fixture();
    let a = nexus("a");
    let data: Vec<u8> = (0..4 * 512).map(|i| (i % 251) as u8).collect();
    f.good(&a, &write10(3, 4, false), &data).await;
    f.good(&a, &write10(100, 1, true), &data[..512]).await;
    assert_eq!(*f.volume.durabilities.lock(), [Durability::Buffered, Durability::Fua]);
    assert_eq!(f.good(&a, &read10(3, 4), &[]).await, data);
    assert_eq!(f.good(&a, &cdb16(0x88, 0, 100, 1), &[]).await, data[..512]);
    let mut read12 = vec![0xA8, 0, 0, 0, 0, 3, 0, 0, 0, 4, 0, 0];
    assert_eq!(f.good(&a, &read12, &[]).await, data);
    read12[0] = 0xAA; // WRITE(12)
    f.good(&a, &read12, &vec![7; 2048]).await;
    // READ(6) and WRITE(6): 0 blocks means 256.
    let big = vec![9u8; 256 * 512];
    f.good(&a, &[0x0A, 0, 2, 0, 0, 0], &big).await;
    assert_eq!(f.good(&a, &[0x08, 0, 2, 0, 0, 0], &[]).await, big);
    // Zero blocks transfer nothing.
    assert!(f.good(&a, &read10(0, 0), &[]).await.is_empty());
    f.good(&a, &write10(0, 0, false), &[]).await;
    f.good(&a, &[0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[]).await; // SYNCHRONIZE CACHE(10)
    f.good(&a, &cdb16(0x91, 0, 0, 0), &[]).await; // SYNCHRONIZE CACHE(16)
}

#[tokio::test]
async fn out_of_range_protected_and_oversized_transfers_are_refused() {
    let f = fixture();
    let a = nexus("a");
    let last = (VOLUME_BLOCKS - 1) as u32;
    assert!(f.good(&a, &read10(last, 1), &[]).await.len() == 512);
    for cdb in [read10(last, 2), read10(last + 2, 0), write10(last, 2, false), cdb16(0x88, 0, u64::MAX, 1)] {
        let r = f.run(&a, &cdb, &[0; 1024]).await;
        assert_eq!(sense_of(&r), (ILLEGAL, 0x21, 0), "{cdb:02x?}");
    }
    assert_eq!(
        sense_of(&f.run(&a, &cdb16(0x88, 0, 0, MAX_TRANSFER_BLOCKS + 1), &[]).await),
        (ILLEGAL, 0x24, 0)
    );
    let mut rdprotect = read10(0, 1);
    rdprotect[1] = 0x20;
    assert_eq!(sense_of(&f.run(&a, &rdprotect, &[]).await), (ILLEGAL, 0x24, 0));
    // Less Data-Out than the CDB transfers: nothing is written.
    let r = f.run(&a, &write10(0, 2, false), &[1; 512]).await;
    assert_eq!(sense_of(&r), (ILLEGAL, 0x0E, 0x03));
    assert!(f.volume.durabilities.lock().is_empty());
}

#[tokio::test]
async fn a_read_only_volume_refuses_writes_with_data_protect() {
    let f = fixture_with(true);
    let a = nexus("a");
    f.good(&a, &read10(0, 1), &[]).await;
    let cases: Vec<(Vec<u8>, usize)> = vec![
        (write10(0, 1, false), 512),
        (cdb16(0x93, 0x08, 0, 8), 512),
        ([0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0].to_vec(), 24),
        (cdb16(0x89, 0, 0, 1), 1024),
    ];
    for (mut cdb, len) in cases {
        let mut data = vec![0u8; len];
        if cdb[0] == 0x42 {
            data[..4].copy_from_slice(&[0, 22, 0, 16]);
            data[19] = 8;
        }
        if cdb[0] == 0x89 {
            cdb[13] = 1;
            cdb[10..13].fill(0);
        }
        assert_eq!(sense_of(&f.run(&a, &cdb, &data).await), (0x07, 0x27, 0x00), "{cdb:02x?}");
    }
    let ms = f.good(&a, &[0x1A, 0x08, 0x3F, 0, 255, 0], &[]).await;
    assert_eq!(ms[2] & 0x80, 0x80, "WP in the device-specific parameter");
}

fn unmap_list(ranges: &[(u64, u32)]) -> Vec<u8> {
    let mut d = vec![0u8; 8];
    d[0..2].copy_from_slice(&u16::try_from(6 + 16 * ranges.len()).unwrap().to_be_bytes());
    d[2..4].copy_from_slice(&u16::try_from(16 * ranges.len()).unwrap().to_be_bytes());
    for (lba, n) in ranges {
        d.extend_from_slice(&lba.to_be_bytes());
        d.extend_from_slice(&n.to_be_bytes());
        d.extend_from_slice(&[0; 4]);
    }
    d
}

fn unmap_cdb(len: usize) -> Vec<u8> {
    let mut c = vec![0x42, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    c[7..9].copy_from_slice(&u16::try_from(len).unwrap().to_be_bytes());
    c
}

/// The (LBA, blocks, deallocated) descriptors of GET LBA STATUS at `lba`.
async fn lba_status(f: &Fixture, lba: u64) -> Vec<(u64, u32, bool)> {
    let d = f.good(&nexus("a"), &cdb16(0x9E, 0x12, lba, 4096), &[]).await;
    let len = u32::from_be_bytes(d[0..4].try_into().unwrap()) as usize;
    assert_eq!(len + 4, d.len(), "PARAMETER DATA LENGTH");
    d[8..]
        .chunks(16)
        .map(|c| {
            let lba = u64::from_be_bytes(c[0..8].try_into().unwrap());
            (lba, u32::from_be_bytes(c[8..12].try_into().unwrap()), c[12] & 0x0F == 1)
        })
        .collect()
}

#[tokio::test]
async fn unmapped_blocks_read_zeros_and_report_deallocated() {
    let f = fixture();
    let a = nexus("a");
    f.good(&a, &write10(0, 64, false), &vec![b'a'; 64 * 512]).await;
    // A prefix of the rest of the volume is described (the front ends' block-status chunking).
    let status = lba_status(&f, 0).await;
    assert_eq!((status[0], status[1].0, status[1].2), ((0, 64, false), 64, true));
    // One unaligned block and one 4 KiB unit.
    let list = unmap_list(&[(1, 1), (16, 8)]);
    f.good(&a, &unmap_cdb(list.len()), &list).await;
    let back = f.good(&a, &read10(0, 64), &[]).await;
    assert!(back[512..1024].iter().all(|b| *b == 0), "LBPRZ: an unmapped block reads zeros");
    assert!(back[..512].iter().all(|b| *b == b'a') && back[1024..16 * 512].iter().all(|b| *b == b'a'));
    assert_eq!(lba_status(&f, 0).await[..3], [(0, 16, false), (16, 8, true), (24, 40, false)]);
    assert_eq!(lba_status(&f, 20).await[0], (20, 4, true), "from a starting LBA inside a run");
    let r = f.run(&a, &cdb16(0x9E, 0x12, VOLUME_BLOCKS, 4096), &[]).await;
    assert_eq!(sense_of(&r), (ILLEGAL, 0x21, 0));

    // Malformed parameter lists, and ANCHOR.
    assert_eq!(sense_of(&f.run(&a, &unmap_cdb(4), &[0; 4]).await), (ILLEGAL, 0x1A, 0));
    let mut lying = unmap_list(&[(0, 1)]);
    lying[2..4].copy_from_slice(&64u16.to_be_bytes());
    assert_eq!(sense_of(&f.run(&a, &unmap_cdb(lying.len()), &lying).await), (ILLEGAL, 0x26, 0));
    let beyond = unmap_list(&[(VOLUME_BLOCKS, 1)]);
    assert_eq!(sense_of(&f.run(&a, &unmap_cdb(beyond.len()), &beyond).await), (ILLEGAL, 0x21, 0));
    let too_many = unmap_list(&vec![(0, 1); 257]);
    assert_eq!(sense_of(&f.run(&a, &unmap_cdb(too_many.len()), &too_many).await), (ILLEGAL, 0x26, 0));
    let mut anchor = unmap_cdb(list.len());
    anchor[1] = 1;
    assert_eq!(sense_of(&f.run(&a, &anchor, &list).await), (ILLEGAL, 0x24, 0));
    f.good(&a, &unmap_cdb(0), &[]).await;
}

#[tokio::test]
async fn write_same_writes_the_pattern_or_unmaps_zeros() {
    let f = fixture();
    let a = nexus("a");
    let block: Vec<u8> = (0..512).map(|i| i as u8).collect();
    f.good(&a, &cdb16(0x93, 0, 10, 2048 + 3), &block).await;
    let back = f.good(&a, &cdb16(0x88, 0, 10, 2048 + 3), &[]).await;
    assert!(back.chunks(512).all(|c| c == block.as_slice()), "every block holds the pattern");
    // WRITE SAME(10) with UNMAP and zeros deallocates; NDOB needs no data.
    f.good(&a, &[0x41, 0x08, 0, 0, 0, 16, 0, 0, 16, 0], &[0; 512]).await;
    assert_eq!(lba_status(&f, 16).await[0], (16, 16, true));
    f.good(&a, &cdb16(0x93, 0x09, 40, 8), &[]).await;
    assert_eq!(lba_status(&f, 40).await[0], (40, 8, true));
    assert!(f.good(&a, &cdb16(0x88, 0, 16, 16), &[]).await.iter().all(|b| *b == 0));
    assert!(f.good(&a, &cdb16(0x88, 0, 40, 8), &[]).await.iter().all(|b| *b == 0));
    assert_eq!(f.good(&a, &cdb16(0x88, 0, 32, 1), &[]).await, block, "between the two, the pattern");
    // UNMAP with a pattern that is not zeros writes it.
    f.good(&a, &cdb16(0x93, 0x08, 16, 1), &block).await;
    assert_eq!(f.good(&a, &cdb16(0x88, 0, 16, 1), &[]).await, block);
    // 0 blocks (WSNZ), beyond the end, ANCHOR.
    for (cdb, sense) in [
        (cdb16(0x93, 0, 0, 0), (ILLEGAL, 0x24, 0)),
        (cdb16(0x93, 0, VOLUME_BLOCKS - 1, 2), (ILLEGAL, 0x21, 0)),
        (cdb16(0x93, 0, VOLUME_BLOCKS + 1, 1), (ILLEGAL, 0x21, 0)),
        (cdb16(0x93, 0x10, 0, 1), (ILLEGAL, 0x24, 0)),
    ] {
        assert_eq!(sense_of(&f.run(&a, &cdb, &block).await), sense, "{cdb:02x?}");
    }
}

#[tokio::test]
async fn compare_and_write_writes_on_a_match_and_names_the_first_difference() {
    let f = fixture();
    let a = nexus("a");
    let old = vec![5u8; 1024];
    f.good(&a, &write10(8, 2, false), &old).await;
    let mut caw = cdb16(0x89, 0x08, 8, 0);
    caw[10..14].fill(0);
    caw[13] = 2;
    let new = vec![6u8; 1024];
    f.good(&a, &caw, &[old.clone(), new.clone()].concat()).await;
    assert_eq!(f.good(&a, &read10(8, 2), &[]).await, new);
    assert_eq!(f.volume.durabilities.lock().last(), Some(&Durability::Fua));

    let mut compare = new.clone();
    compare[700] = 0;
    let r = f.run(&a, &caw, &[compare, old.clone()].concat()).await;
    assert_eq!(sense_of(&r), (0x0E, 0x1D, 0x00));
    let sense = r.sense.unwrap();
    assert_eq!(sense[0], 0xF0, "VALID: INFORMATION holds the offset");
    assert_eq!(u32::from_be_bytes(sense[3..7].try_into().unwrap()), 700);
    assert_eq!(f.good(&a, &read10(8, 2), &[]).await, new, "nothing written");

    caw[13] = 0;
    f.good(&a, &caw, &[]).await;
    caw[2..10].copy_from_slice(&(VOLUME_BLOCKS - 1).to_be_bytes());
    caw[13] = 2;
    assert_eq!(sense_of(&f.run(&a, &caw, &[0; 2048]).await), (ILLEGAL, 0x21, 0));
    caw[1] = 0x20; // WRPROTECT
    assert_eq!(sense_of(&f.run(&a, &caw, &[0; 2048]).await), (ILLEGAL, 0x24, 0));
}

#[tokio::test]
async fn verify_compares_with_the_data_out() {
    let f = fixture();
    let a = nexus("a");
    f.good(&a, &write10(0, 2, false), &[3; 1024]).await;
    let mut verify = read10(0, 2);
    verify[0] = 0x2F;
    f.good(&a, &verify, &[]).await; // BYTCHK 0: readable
    verify[1] = 0x02; // BYTCHK 1
    f.good(&a, &verify, &[3; 1024]).await;
    let mut other = vec![3u8; 1024];
    other[513] = 4;
    let r = f.run(&a, &verify, &other).await;
    assert_eq!(sense_of(&r), (0x0E, 0x1D, 0));
    assert_eq!(u32::from_be_bytes(r.sense.unwrap()[3..7].try_into().unwrap()), 513);
    verify[1] = 0x06; // BYTCHK 11b: one block against each
    f.good(&a, &verify, &[3; 512]).await;
    verify[1] = 0x04; // reserved
    assert_eq!(sense_of(&f.run(&a, &verify, &[]).await), (ILLEGAL, 0x24, 0));
}

#[tokio::test]
async fn mode_pages_report_their_values_and_only_wce_changes() {
    let f = fixture();
    let (a, b) = (nexus("a"), nexus("b"));
    f.lu.nexus_added(&b);
    let all = f.good(&a, &[0x1A, 0, 0x3F, 0, 255, 0], &[]).await;
    assert_eq!(usize::from(all[0]) + 1, all.len(), "MODE DATA LENGTH");
    assert_eq!((all[2], all[3]), (0x10, 8), "DPOFUA, one short block descriptor");
    assert_eq!(u32::from_be_bytes(all[4..8].try_into().unwrap()), VOLUME_BLOCKS as u32);
    let mut pages = Vec::new();
    let mut at = 12;
    while at < all.len() {
        pages.push(all[at] & 0x3F);
        at += 2 + usize::from(all[at + 1]);
    }
    assert_eq!((pages, at), (vec![0x08, 0x0A, 0x1C], all.len()));
    let caching = f.good(&a, &[0x1A, 0x08, 0x08, 0, 255, 0], &[]).await;
    assert_eq!(&caching[..4], &[3 + 20, 0, 0x10, 0], "DBD: no block descriptor");
    assert_eq!((caching[4], caching[5], caching[6] & 0x04), (0x08, 18, 0x04), "WCE");
    let changeable = f.good(&a, &[0x1A, 0x08, 0x48, 0, 255, 0], &[]).await;
    assert_eq!(changeable[6], 0x04, "only WCE is changeable");
    let long = f.good(&a, &[0x5A, 0x10, 0x0A, 0, 0, 0, 0, 1, 0, 0], &[]).await;
    assert_eq!(usize::from(u16::from_be_bytes([long[0], long[1]])) + 2, long.len());
    assert_eq!((long[4] & 1, u16::from_be_bytes([long[6], long[7]])), (1, 16), "LONGLBA");
    assert_eq!(sense_of(&f.run(&a, &[0x1A, 0, 0xC8, 0, 255, 0], &[]).await), (ILLEGAL, 0x39, 0));
    assert_eq!(sense_of(&f.run(&a, &[0x1A, 0, 0x19, 0, 255, 0], &[]).await), (ILLEGAL, 0x24, 0));

    // Clearing WCE makes writes durable; the other nexus is told.
    let mut select = vec![0u8; 4];
    select.extend_from_slice(&caching[4..]);
    select[6] &= !0x04;
    let mut cdb = [0x15, 0x10, 0, 0, 0, 0];
    cdb[4] = u8::try_from(select.len()).unwrap();
    f.good(&a, &cdb, &select).await;
    f.good(&a, &write10(0, 1, false), &[1; 512]).await;
    assert_eq!(f.volume.durabilities.lock().last(), Some(&Durability::Fua));
    let r = f.run(&b, &[0, 0, 0, 0, 0, 0], &[]).await;
    assert_eq!(sense_of(&r), (0x06, 0x29, 0x00));
    assert_eq!(sense_of(&f.run(&b, &[0, 0, 0, 0, 0, 0], &[]).await), (0x06, 0x2A, 0x01));
    // Changing what is not changeable is refused, and changes nothing.
    let mut bad = select.clone();
    bad[6] |= 0x04;
    bad[7] = 1; // a bit of byte 3 of the caching page
    let r = f.run(&a, &cdb, &bad).await;
    assert_eq!(sense_of(&r), (ILLEGAL, 0x26, 0));
    assert_eq!(r.sense.unwrap()[15..18], [0x80, 0, 7], "field pointer into the parameter list");
    assert_eq!(f.good(&a, &[0x1A, 0x08, 0x08, 0, 255, 0], &[]).await[6] & 0x04, 0);
    let mut truncated = select.clone();
    truncated.truncate(10);
    cdb[4] = 10;
    assert_eq!(sense_of(&f.run(&a, &cdb, &truncated).await), (ILLEGAL, 0x1A, 0), "a page cut short");
}

#[tokio::test]
async fn report_luns_lists_lun_0() {
    let f = fixture();
    let a = nexus("a");
    let mut cdb = [0xA0, 0, 0, 0, 0, 0, 0, 0, 0, 16, 0, 0];
    assert_eq!(f.good(&a, &cdb, &[]).await, [0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    cdb[2] = 1;
    assert_eq!(f.good(&a, &cdb, &[]).await, [0; 8], "no well-known logical units");
    cdb[2] = 2;
    assert_eq!(f.good(&a, &cdb, &[]).await.len(), 16);
    cdb[2] = 3;
    assert_eq!(sense_of(&f.run(&a, &cdb, &[]).await), (ILLEGAL, 0x24, 0));
    cdb[2] = 0;
    cdb[9] = 15;
    assert_eq!(sense_of(&f.run(&a, &cdb, &[]).await), (ILLEGAL, 0x24, 0));
}

fn prout(action: u8, kind: u8, key: u64, sa_key: u64) -> (Vec<u8>, Vec<u8>) {
    let cdb = vec![0x5F, action, kind, 0, 0, 0, 0, 0, 24, 0];
    let mut data = key.to_be_bytes().to_vec();
    data.extend_from_slice(&sa_key.to_be_bytes());
    data.resize(24, 0);
    (cdb, data)
}

async fn pr_out(f: &Fixture, who: &Nexus, action: u8, kind: u8, key: u64, sa_key: u64) -> Response {
    let (cdb, data) = prout(action, kind, key, sa_key);
    f.run(who, &cdb, &data).await
}

async fn read_keys(f: &Fixture) -> (u32, Vec<u64>) {
    let d = f.good(&nexus("a"), &[0x5E, 0, 0, 0, 0, 0, 0, 1, 0, 0], &[]).await;
    let keys = d[8..].chunks(8).map(|c| u64::from_be_bytes(c.try_into().unwrap())).collect();
    (u32::from_be_bytes(d[0..4].try_into().unwrap()), keys)
}

#[tokio::test]
async fn persistent_reservations_between_two_nexuses() {
    let f = fixture();
    let (a, b) = (nexus("a"), nexus("b"));
    for n in [&a, &b] {
        f.lu.nexus_added(n);
        f.run(n, &[0, 0, 0, 0, 0, 0], &[]).await; // the power-on unit attention
    }
    assert_eq!(pr_out(&f, &a, 0, 0, 0, 0xA).await.status, GOOD);
    assert_eq!(pr_out(&f, &b, 6, 0, 0, 0xB).await.status, GOOD, "REGISTER AND IGNORE EXISTING KEY");
    assert_eq!(read_keys(&f).await, (2, vec![0xA, 0xB]));
    assert_eq!(pr_out(&f, &b, 0, 0, 0x99, 0xC).await.status, RESERVATION_CONFLICT, "wrong key");

    // Write Exclusive held by a: b reads but cannot write.
    assert_eq!(pr_out(&f, &a, 1, 0x01, 0xA, 0).await.status, GOOD);
    let rr = f.good(&a, &[0x5E, 1, 0, 0, 0, 0, 0, 0, 255, 0], &[]).await;
    assert_eq!(
        (u32::from_be_bytes(rr[4..8].try_into().unwrap()), rr[8..16].to_vec(), rr[21]),
        (16, 0xAu64.to_be_bytes().to_vec(), 1)
    );
    f.good(&b, &read10(0, 1), &[]).await;
    assert_eq!(f.run(&b, &write10(0, 1, false), &[0; 512]).await.status, RESERVATION_CONFLICT);
    f.good(&a, &write10(0, 1, false), &[0; 512]).await;
    assert_eq!(pr_out(&f, &b, 1, 0x01, 0xB, 0).await.status, RESERVATION_CONFLICT, "held by another");
    f.good(&b, &[0x12, 0, 0, 0, 36, 0], &[]).await; // INQUIRY is always allowed

    // Exclusive Access blocks b's reads too, after a changes the type by preempting itself.
    // The other registrant learns that the reservation it lived with is gone (SPC-5 5.13.11.2.4).
    assert_eq!(pr_out(&f, &a, 4, 0x03, 0xA, 0xA).await.status, GOOD);
    assert_eq!(sense_of(&f.run(&b, &read10(0, 1), &[]).await), (0x06, 0x2A, 0x04));
    assert_eq!(f.run(&b, &read10(0, 1), &[]).await.status, RESERVATION_CONFLICT);
    assert_eq!(
        sense_of(&pr_out(&f, &a, 2, 0x01, 0xA, 0).await),
        (ILLEGAL, 0x26, 0x04),
        "release of the wrong type"
    );
    assert_eq!(pr_out(&f, &a, 2, 0x03, 0xA, 0).await.status, GOOD);
    f.good(&b, &read10(0, 1), &[]).await;

    // b takes a Write Exclusive Registrants Only reservation; a, registered, may write.
    assert_eq!(pr_out(&f, &b, 1, 0x05, 0xB, 0).await.status, GOOD);
    f.good(&a, &write10(0, 1, false), &[0; 512]).await;
    // a preempts b: b's registration goes and b is told.
    let before = read_keys(&f).await.0;
    assert_eq!(pr_out(&f, &a, 4, 0x01, 0xA, 0xB).await.status, GOOD);
    assert_eq!(read_keys(&f).await, (before + 1, vec![0xA]));
    assert_eq!(sense_of(&f.run(&b, &read10(0, 1), &[]).await), (0x06, 0x2A, 0x05));
    assert_eq!(f.run(&b, &write10(0, 1, false), &[0; 512]).await.status, RESERVATION_CONFLICT);
    assert_eq!(pr_out(&f, &b, 1, 0x01, 0xB, 0).await.status, RESERVATION_CONFLICT, "b is not registered");

    // Registrations survive the nexus; CLEAR removes everything.
    f.lu.nexus_removed(&a);
    assert_eq!(read_keys(&f).await.1, [0xA]);
    f.lu.nexus_added(&a);
    f.run(&a, &[0, 0, 0, 0, 0, 0], &[]).await;
    assert_eq!(pr_out(&f, &b, 6, 0, 0, 0xB).await.status, GOOD);
    assert_eq!(pr_out(&f, &a, 3, 0, 0xA, 0).await.status, GOOD);
    assert_eq!(read_keys(&f).await.1, Vec::<u64>::new());
    assert_eq!(sense_of(&f.run(&b, &read10(0, 1), &[]).await), (0x06, 0x2A, 0x03));
    f.good(&b, &write10(0, 1, false), &[0; 512]).await;

    // Refused parameter lists: APTPL, a wrong length, an unknown type.
    let (cdb, mut data) = prout(0, 0, 0, 0xA);
    data[20] = 1;
    assert_eq!(sense_of(&f.run(&a, &cdb, &data).await), (ILLEGAL, 0x26, 0));
    let mut short = cdb.clone();
    short[8] = 20;
    assert_eq!(sense_of(&f.run(&a, &short, &data[..20]).await), (ILLEGAL, 0x1A, 0));
    assert_eq!(pr_out(&f, &a, 0, 0, 0, 0xA).await.status, GOOD);
    assert_eq!(sense_of(&pr_out(&f, &a, 1, 0x02, 0xA, 0).await), (ILLEGAL, 0x24, 0));
    let caps = f.good(&a, &[0x5E, 2, 0, 0, 0, 0, 0, 0, 8, 0], &[]).await;
    assert_eq!((caps[1], caps[2] & 1, caps[4], caps[5]), (8, 0, 0xEA, 0x01), "no PTPL, six types");
    let full = f.good(&a, &[0x5E, 3, 0, 0, 0, 0, 0, 1, 0, 0], &[]).await;
    assert_eq!(u32::from_be_bytes(full[4..8].try_into().unwrap()) as usize + 8, full.len());
    assert_eq!(full[8..16], 0xAu64.to_be_bytes());
    assert_eq!(sense_of(&f.run(&a, &[0x5E, 4, 0, 0, 0, 0, 0, 0, 8, 0], &[]).await), (ILLEGAL, 0x24, 0));
}

#[tokio::test]
async fn registrations_are_bounded() {
    let f = fixture();
    for i in 0..pr::MAX_REGISTRATIONS {
        let r = pr_out(&f, &nexus(&format!("i{i}")), 0, 0, 0, 1 + i as u64).await;
        assert_eq!(r.status, GOOD);
    }
    let r = pr_out(&f, &nexus("one-more"), 0, 0, 0, 1000).await;
    assert_eq!(sense_of(&r), (ILLEGAL, 0x55, 0x04));
}

#[tokio::test]
async fn spc2_reservations_block_others_until_released_logout_or_reset() {
    let f = fixture();
    let (a, b) = (nexus("a"), nexus("b"));
    f.good(&a, &[0x16, 0, 0, 0, 0, 0], &[]).await;
    assert_eq!(f.run(&b, &read10(0, 1), &[]).await.status, RESERVATION_CONFLICT);
    assert_eq!(f.run(&b, &[0x16, 0, 0, 0, 0, 0], &[]).await.status, RESERVATION_CONFLICT);
    f.good(&b, &[0x17, 0, 0, 0, 0, 0], &[]).await; // another's release: no effect
    assert_eq!(f.run(&b, &read10(0, 1), &[]).await.status, RESERVATION_CONFLICT);
    f.good(&a, &[0x17, 0, 0, 0, 0, 0], &[]).await;
    f.good(&b, &read10(0, 1), &[]).await;
    f.good(&a, &[0x16, 0, 0, 0, 0, 0], &[]).await;
    f.lu.nexus_removed(&a);
    f.good(&b, &read10(0, 1), &[]).await;
    f.good(&a, &[0x16, 0, 0, 0, 0, 0], &[]).await;
    f.lu.reset(&b);
    f.good(&b, &read10(0, 1), &[]).await;
    // Refused while persistent registrations exist.
    assert_eq!(pr_out(&f, &a, 0, 0, 0, 7).await.status, GOOD);
    assert_eq!(f.run(&b, &[0x16, 0, 0, 0, 0, 0], &[]).await.status, RESERVATION_CONFLICT);
}

#[tokio::test]
async fn a_new_nexus_gets_one_unit_attention_that_inquiry_does_not_clear() {
    let f = fixture();
    let (a, b) = (nexus("a"), nexus("b"));
    f.lu.nexus_added(&a);
    f.good(&a, &[0x12, 0, 0, 0, 36, 0], &[]).await;
    f.good(&a, &[0xA0, 0, 0, 0, 0, 0, 0, 0, 0, 16, 0, 0], &[]).await;
    let r = f.run(&a, &read10(0, 1), &[]).await;
    assert_eq!(sense_of(&r), (0x06, 0x29, 0x00));
    f.good(&a, &read10(0, 1), &[]).await;
    // REQUEST SENSE reports (and clears) a pending one; then NO SENSE.
    f.lu.nexus_added(&b);
    f.lu.reset(&a);
    let rs = f.good(&b, &[0x03, 0, 0, 0, 252, 0], &[]).await;
    assert_eq!((rs[2], rs[12], rs[13]), (0x06, 0x29, 0x03), "the reset supersedes power on");
    let rs = f.good(&b, &[0x03, 0, 0, 0, 252, 0], &[]).await;
    assert_eq!((rs[0], rs[2], rs[12]), (0x70, 0, 0));
    f.good(&a, &[0, 0, 0, 0, 0, 0], &[]).await; // the nexus that reset is not told
    f.lu.nexus_removed(&b);
    f.good(&b, &[0, 0, 0, 0, 0, 0], &[]).await;
}

#[test]
fn data_out_lengths_come_from_the_cdb() {
    let bytes = LogicalUnit::data_out_bytes;
    assert_eq!(bytes(&write10(0, 3, false)), Some(1536));
    assert_eq!(bytes(&[0x0A, 0, 0, 0, 0, 0]), Some(256 * 512));
    assert_eq!(bytes(&read10(0, 3)), Some(0));
    let mut caw = cdb16(0x89, 0, 0, 0);
    caw[13] = 4;
    assert_eq!(bytes(&caw), Some(4096));
    assert_eq!(bytes(&cdb16(0x93, 0x01, 0, 8)), Some(0), "NDOB");
    assert_eq!(bytes(&cdb16(0x93, 0, 0, 8)), Some(512));
    assert_eq!(bytes(&unmap_cdb(40)), Some(40));
    assert_eq!(bytes(&[0x5F, 0, 0, 0, 0, 0, 0, 0, 24, 0]), Some(24));
    assert_eq!(bytes(&[0x15, 0, 0, 0, 28, 0]), Some(28));
    assert_eq!(bytes(&[0xC0; 16]), None, "unknown opcode");
    assert_eq!(bytes(&[0x2A, 0, 0]), None, "too short");
    assert_eq!(bytes(&[0x00; 6]), Some(0));
}

#[test]
fn sense_data_is_fixed_format() {
    let s = fixed_sense(0x0E, 0x1D, 0x00, Some(700), None);
    assert_eq!(s.len(), 18);
    assert_eq!((s[0], s[2], s[7], s[12], s[13]), (0xF0, 0x0E, 10, 0x1D, 0));
    assert_eq!(&s[3..7], &700u32.to_be_bytes());
    let s = sense::Check::invalid_cdb(7, Some(3)).encode();
    assert_eq!((s[0], s[2], s[12]), (0x70, 0x05, 0x24));
    assert_eq!(&s[15..18], &[0x80 | 0x40 | 0x08 | 3, 0, 7]);
}

/// A tiny seeded generator (xorshift64*), enough for malformed inputs.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

#[tokio::test]
async fn no_cdb_makes_the_layer_panic_or_answer_malformed() {
    let f = fixture();
    let (a, b) = (nexus("a"), nexus("b"));
    let mut rng = Rng(0x5EED);
    for opcode in 0..=255u8 {
        for len in 0..=16usize {
            for round in 0..6 {
                let mut cdb: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
                if let Some(first) = cdb.first_mut() {
                    *first = opcode;
                }
                if round % 2 == 0 && len > 9 {
                    // Small transfer lengths, so that commands get past their range checks.
                    for byte in cdb.iter_mut().skip(2).take(len - 4) {
                        *byte &= 0x01;
                    }
                }
                let wanted = LogicalUnit::data_out_bytes(&cdb).unwrap_or(0).min(1 << 16) as usize;
                let data_len = if round == 5 { wanted / 2 } else { wanted };
                let data: Vec<u8> = (0..data_len).map(|_| rng.next() as u8).collect();
                let who = if round % 3 == 0 { &a } else { &b };
                let r = f.run(who, &cdb, &data).await;
                match r.status {
                    GOOD => assert!(r.sense.is_none()),
                    CHECK_CONDITION => {
                        let s = r.sense.as_ref().expect("sense");
                        assert_eq!((s.len(), s[0] & 0x7F), (FIXED_SENSE_BYTES, 0x70), "{cdb:02x?}");
                        assert!(r.data_in.is_none());
                    }
                    RESERVATION_CONFLICT => assert!(r.sense.is_none()),
                    other => panic!("status {other:#x} for {cdb:02x?}"),
                }
                if !op::KNOWN.contains(&opcode) && len > 0 {
                    assert_eq!(sense_of(&r), (ILLEGAL, 0x20, 0), "{cdb:02x?}");
                }
            }
        }
    }
}

/// A store in memory that can be made to fail.
#[derive(Default)]
struct MemStore {
    saved: Arc<parking_lot::Mutex<Option<Vec<u8>>>>,
    fail: Arc<std::sync::atomic::AtomicBool>,
}

impl ReservationStore for MemStore {
    fn load(&self) -> std::io::Result<Option<Vec<u8>>> {
        Ok(self.saved.lock().clone())
    }

    fn save(&self, state: Option<&[u8]>) -> std::io::Result<()> {
        if self.fail.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(std::io::Error::other("disk full"));
        }
        *self.saved.lock() = state.map(<[u8]>::to_vec);
        Ok(())
    }
}

#[tokio::test]
async fn registrations_with_aptpl_survive_a_restart_and_a_failed_save_changes_nothing() {
    let store = MemStore::default();
    let (saved, fail) = (Arc::clone(&store.saved), Arc::clone(&store.fail));
    let mut f = fixture();
    f.lu = LogicalUnit::new("iqn.2024-01.io.stria:v", "serial-v").with_store(Box::new(store));
    let (a, b) = (nexus("a"), nexus("b"));
    for n in [&a, &b] {
        f.lu.nexus_added(n);
        f.run(n, &[0, 0, 0, 0, 0, 0], &[]).await;
    }
    // REGISTERs with APTPL (the last REGISTER's APTPL decides), then a Write Exclusive
    // reservation: all saved.
    for (who, key) in [(&a, 0xA), (&b, 0xB)] {
        let (cdb, mut data) = prout(0, 0, 0, key);
        data[20] = 1;
        assert_eq!(f.run(who, &cdb, &data).await.status, GOOD);
    }
    assert_eq!(pr_out(&f, &a, 1, 0x01, 0xA, 0).await.status, GOOD);
    let caps = f.good(&a, &[0x5E, 2, 0, 0, 0, 0, 0, 0, 8, 0], &[]).await;
    assert_eq!((caps[2] & 1, caps[3] & 1), (1, 1), "PTPL_C and PTPL_A");
    // A save that fails undoes the change and fails the command.
    fail.store(true, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(sense_of(&pr_out(&f, &b, 6, 0, 0, 0xC).await).0, 0x04, "HARDWARE ERROR");
    fail.store(false, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(read_keys(&f).await.1, vec![0xA, 0xB]);

    // The daemon restarts: a new unit over the same store has the registrations and the
    // reservation, so b still cannot write.
    let restored = MemStore { saved: Arc::clone(&saved), ..MemStore::default() };
    f.lu = LogicalUnit::new("iqn.2024-01.io.stria:v", "serial-v").with_store(Box::new(restored));
    for n in [&a, &b] {
        f.lu.nexus_added(n);
        f.run(n, &[0, 0, 0, 0, 0, 0], &[]).await;
    }
    assert_eq!(read_keys(&f).await.1, vec![0xA, 0xB]);
    assert_eq!(f.run(&b, &write10(0, 1, false), &[0; 512]).await.status, RESERVATION_CONFLICT);
    f.good(&a, &write10(0, 1, false), &[0; 512]).await;
    // A REGISTER without APTPL turns persistence off: the store is emptied.
    assert_eq!(pr_out(&f, &b, 0, 0, 0xB, 0xD).await.status, GOOD);
    assert!(saved.lock().is_none(), "APTPL off: nothing kept");
}

#[test]
fn the_file_store_replaces_its_file_whole_and_removes_it() {
    let dir = std::env::temp_dir().join(format!("stria-pr-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let store = FileReservationStore::new(dir.join("v.pr"));
    assert_eq!(store.load().expect("load"), None);
    store.save(Some(b"one")).expect("save");
    store.save(Some(b"two")).expect("save again");
    assert_eq!(store.load().expect("load").as_deref(), Some(&b"two"[..]));
    assert!(!dir.join("v.tmp").exists(), "no temporary file left");
    store.save(None).expect("remove");
    store.save(None).expect("remove what is gone");
    assert_eq!(store.load().expect("load"), None);
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

#[tokio::test]
async fn one_descriptor_of_lba_status_looks_only_a_little_ahead() {
    let f = fixture();
    let a = nexus("a");
    f.good(&a, &[0, 0, 0, 0, 0, 0], &[]).await;
    // The whole volume written: one allocated run of 4 MiB.
    for mib in 0..4u32 {
        let cdb = write10(mib * 2048, 2048, false);
        f.good(&a, &cdb, &vec![1; 1 << 20]).await;
    }
    let descriptor = |d: &[u8]| (u32::from_be_bytes(d[16..20].try_into().unwrap()), d[20]);
    // Room for one descriptor (qemu's question before a read): the first 128 KiB only.
    let one = f.good(&a, &cdb16(0x9E, 0x12, 0, 24), &[]).await;
    assert_eq!(descriptor(&one), (256, 0));
    // Room for more: the run as far as the chunking looks.
    let many = f.good(&a, &cdb16(0x9E, 0x12, 0, 4096), &[]).await;
    assert_eq!(descriptor(&many), (VOLUME_BLOCKS as u32, 0));
}

#[tokio::test]
async fn report_supported_operation_codes_lists_every_command_and_answers_for_one() {
    let f = fixture();
    let a = nexus("a");
    let rsoc = |options: u8, opcode: u8, action: u16| {
        let mut c = [0u8; 12];
        c[0] = 0xA3;
        c[1] = 0x0C;
        c[2] = options;
        c[3] = opcode;
        c[4..6].copy_from_slice(&action.to_be_bytes());
        c[6..10].copy_from_slice(&4096u32.to_be_bytes());
        c
    };
    // All commands: 8-byte descriptors, a service action's own flagged.
    let all = f.good(&a, &rsoc(0, 0, 0), &[]).await;
    let len = u32::from_be_bytes([all[0], all[1], all[2], all[3]]) as usize;
    assert_eq!(len, all.len() - 4);
    assert_eq!(len % 8, 0);
    let descriptors: Vec<&[u8]> = all[4..].chunks(8).collect();
    let find = |opcode: u8, action: u16| {
        descriptors.iter().find(|d| d[0] == opcode && u16::from_be_bytes([d[2], d[3]]) == action).copied()
    };
    let read10 = find(0x28, 0).expect("READ(10) listed");
    assert_eq!((read10[5], u16::from_be_bytes([read10[6], read10[7]])), (0, 10));
    let rc16 = find(0x9E, 0x10).expect("READ CAPACITY(16) listed");
    assert_eq!((rc16[5], u16::from_be_bytes([rc16[6], rc16[7]])), (1, 16), "service action valid");
    assert!(find(0xA3, 0x0C).is_some(), "itself");
    assert!(find(0x9E, 0x11).is_none() && find(0xC0, 0).is_none());
    // With timeouts: 20-byte descriptors, CTDP set, a descriptor of length 0Ah.
    let with = f.good(&a, &rsoc(0x80, 0, 0), &[]).await;
    assert_eq!(with.len() - 4, descriptors.len() * 20);
    assert_eq!((with[4 + 5] & 0x02, with[4 + 8], with[4 + 9]), (0x02, 0, 0x0A));
    // One command by operation code: supported, its CDB size and usage map.
    let one = f.good(&a, &rsoc(1, 0x28, 0), &[]).await;
    assert_eq!((one[1] & 0x07, u16::from_be_bytes([one[2], one[3]])), (3, 10));
    assert_eq!((one.len(), one[4], one[13]), (14, 0x28, 0), "opcode first, control byte last");
    // A command with service actions is asked for with one (options 2 or 3).
    assert_eq!(sense_of(&f.run(&a, &rsoc(1, 0x9E, 0), &[]).await), (ILLEGAL, 0x24, 0));
    let sa = f.good(&a, &rsoc(2, 0x9E, 0x12), &[]).await;
    assert_eq!((sa[1] & 0x07, sa[4], sa[5]), (3, 0x9E, 0x12), "GET LBA STATUS");
    assert_eq!(f.good(&a, &rsoc(3, 0x9E, 0x10), &[]).await[1] & 0x07, 3);
    assert_eq!(sense_of(&f.run(&a, &rsoc(2, 0x28, 0), &[]).await), (ILLEGAL, 0x24, 0), "READ(10) has none");
    // Not supported: SUPPORT 001b and nothing more.
    assert_eq!(f.good(&a, &rsoc(1, 0xC0, 0), &[]).await, [0, 1, 0, 0]);
    assert_eq!(f.good(&a, &rsoc(2, 0x9E, 0x11), &[]).await, [0, 1, 0, 0]);
    // Timeouts for one command; an unknown reporting option; another MAINTENANCE IN action.
    let timed = f.good(&a, &rsoc(0x81, 0x2A, 0), &[]).await;
    assert_eq!((timed[1] & 0x80, timed.len()), (0x80, 4 + 10 + 12));
    assert_eq!(sense_of(&f.run(&a, &rsoc(7, 0, 0), &[]).await), (ILLEGAL, 0x24, 0));
    let mut tpg = rsoc(0, 0, 0);
    tpg[1] = 0x0A;
    assert_eq!(sense_of(&f.run(&a, &tpg, &[]).await), (ILLEGAL, 0x24, 0), "REPORT TARGET PORT GROUPS");
}
