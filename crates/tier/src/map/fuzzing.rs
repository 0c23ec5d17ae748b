//! The block map's decoders for [`crate::fuzzing`] (they are private to the map): the log
//! header, log blocks with the records they carry, map pages (the head's and snapshot copies).
//! Each panics on a broken property; see [`crate::fuzzing`].

use stria_dev::BLOCK_USIZE;

use super::format::{
    decode_header, decode_log_block, decode_owned_page, decode_page, encode_header, encode_log_block,
    encode_page, page_crc,
};
use super::snap::{Record, decode_record, encode_preserve, encode_table_op};
use super::{ENTRIES_PER_PAGE, MapEntry};

/// Seals a log header (CRC of bytes 0..16 at 16..20).
pub fn seal_log_header(b: &mut [u8]) {
    let crc = crc32c::crc32c(&b[..16]);
    b[16..20].copy_from_slice(&crc.to_le_bytes());
}

/// Decodes a log header; `Some(exact)` when it round trips.
pub fn log_header(b: &[u8]) -> Option<bool> {
    let replay = decode_header(b)?;
    let mut encoded = vec![0u8; BLOCK_USIZE];
    encode_header(replay, &mut encoded);
    assert_eq!(decode_header(&encoded), Some(replay), "map log header round trip");
    Some(encoded == b)
}

/// Seals a log block (CRC of bytes 0..16 and 20.. at 16..20).
pub fn seal_log_block(b: &mut [u8]) {
    let crc = crc32c::crc32c_append(crc32c::crc32c(&b[..16]), &b[20..]);
    b[16..20].copy_from_slice(&crc.to_le_bytes());
}

/// Decodes a log block as replay does (at the sequence it carries), and each record in it.
pub fn log_block(b: &[u8]) -> Option<bool> {
    let seq = u64::from_le_bytes(b[8..16].try_into().expect("8 bytes"));
    let deltas = decode_log_block(b, seq)?;
    assert!(decode_log_block(b, seq.wrapping_add(1)).is_none(), "a log block of another sequence is refused");
    assert!(deltas.len() <= super::DELTAS_PER_LOG_BLOCK, "at most a block's worth of deltas");
    let mut encoded = vec![0u8; BLOCK_USIZE];
    encode_log_block(seq, &deltas, &mut encoded);
    assert_eq!(decode_log_block(&encoded, seq).as_ref(), Some(&deltas), "map log block round trip");
    for (field, bytes) in &deltas {
        record(*field, bytes);
    }
    Some(encoded == b)
}

/// A record decoded from a delta re-encodes to a delta that decodes to it.
fn record(field: u64, bytes: &[u8; 16]) {
    let Some(rec) = decode_record(field, bytes) else { return };
    let (field2, bytes2) = match rec {
        Record::Entry { layer, block, entry } => {
            let mut b = [0u8; 16];
            entry.encode(&mut b);
            (u64::from(layer) << 48 | block, b)
        }
        Record::Preserve { layer, page, pool, table } => encode_preserve(layer, page, pool, table),
        Record::Table(op) => encode_table_op(op),
    };
    assert_eq!(decode_record(field2, &bytes2), Some(rec), "map log record round trip");
}

/// Seals a map page (CRC of bytes 0..8 and 12.. at 8..12).
pub fn seal_page(b: &mut [u8]) {
    let crc = page_crc(b);
    b[8..12].copy_from_slice(&crc.to_le_bytes());
}

/// Decodes a map page as the head's page and as a snapshot's copy (the index it carries), at
/// most one of which takes it.
pub fn page(b: &[u8]) -> Option<bool> {
    let index = u64::from(u32::from_le_bytes(b[4..8].try_into().expect("4 bytes")));
    let owner = u16::from_le_bytes(b[12..14].try_into().expect("2 bytes"));
    let head = decode_page(index, b);
    let copy = decode_owned_page(index, b);
    let zeros = b.iter().all(|&x| x == 0);
    assert!(!(head.is_some() && copy.is_some()), "a page is the head's or a copy, never both");
    assert!(!zeros || head.is_some(), "an all-zero head page is an empty page");
    if !zeros {
        assert!(decode_page(index ^ 1, b).is_none(), "a page of another index is refused");
    }
    let entries = head.or(copy)?;
    assert_eq!(entries.len() as u64, ENTRIES_PER_PAGE);
    let mut encoded = vec![0u8; BLOCK_USIZE];
    encode_page(owner, index, &entries, &mut encoded);
    let back = if owner == 0 { decode_page(index, &encoded) } else { decode_owned_page(index, &encoded) };
    assert_eq!(back.as_deref(), Some(&entries[..]), "map page round trip");
    Some(if zeros { false } else { encoded == b })
}

/// Valid encodings: a log header, a log block with entries and control records, a head page
/// and a snapshot's copy.
pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    use super::Place;
    let entry = |place, crc, seq| MapEntry { place, crc, seq };
    let mut header = vec![0u8; BLOCK_USIZE];
    encode_header(12345, &mut header);
    let mut deltas: Vec<(u64, [u8; 16])> = Vec::new();
    for (i, place) in [Place::Unallocated, Place::Zero, Place::Cache(77), Place::Segment((1 << 62) - 1)]
        .into_iter()
        .enumerate()
    {
        let mut b = [0u8; 16];
        entry(place, 0xC0FFEE + i as u32, 9 + i as u32).encode(&mut b);
        deltas.push(((i as u64) << 48 | (1000 + i as u64), b));
    }
    deltas.push(encode_preserve(3, 17, 5, 6));
    deltas.push(encode_table_op(super::snap::TableOp::Own { from: 3, to: 2, page: 17, pool: 5, table: 0 }));
    deltas.push(encode_table_op(super::snap::TableOp::Drop { layer: 4, page: 18, pool: 9 }));
    let mut log = vec![0u8; BLOCK_USIZE];
    encode_log_block(7, &deltas, &mut log);
    let entries: Vec<MapEntry> = (0..ENTRIES_PER_PAGE)
        .map(|i| match i % 4 {
            0 => MapEntry::UNALLOCATED,
            1 => entry(Place::Zero, 0, i as u32),
            2 => entry(Place::Cache(i), 0xABCD_0000 + i as u32, i as u32),
            _ => entry(Place::Segment(i * 3), 0x1234_0000 + i as u32, i as u32),
        })
        .collect();
    let mut head = vec![0u8; BLOCK_USIZE];
    encode_page(0, 3, &entries, &mut head);
    let mut copy = vec![0u8; BLOCK_USIZE];
    encode_page(5, 3, &entries, &mut copy);
    vec![("map-log-header", header), ("map-log-block", log), ("map-page-head", head), ("map-page-copy", copy)]
}
