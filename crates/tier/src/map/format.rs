//! The map's on-disk encodings (docs/on-disk-format.md §7): entries and places, map pages,
//! log blocks and the log header. Encoders write into a caller's block; decoders take bytes
//! read from the volume and return `None` for anything that is not what was asked for.

use super::{DELTAS_PER_LOG_BLOCK, ENTRIES_PER_PAGE, MapEntry, Place};

pub(super) const PAGE_MAGIC: u32 = u32::from_le_bytes(*b"SMAP");
pub(super) const LOG_MAGIC: u32 = u32::from_le_bytes(*b"SMLG");
pub(super) const HEADER_MAGIC: u32 = u32::from_le_bytes(*b"SMLH");
pub(super) const DELTA_BYTES: usize = 24;
pub(super) const LOG_HEADER_BYTES: usize = 32;

pub(super) const POSITION_MASK: u64 = (1 << 62) - 1;

impl Place {
    pub(super) fn encode(self) -> u64 {
        if let Place::Cache(p) | Place::Segment(p) = self {
            // Masked, a larger one would alias another place.
            assert!(p <= POSITION_MASK, "map: {self:?} does not fit the 62 bits of a map entry's place");
        }
        match self {
            Place::Unallocated => 0,
            Place::Zero => 1 << 62,
            Place::Cache(p) => 2 << 62 | (p & POSITION_MASK),
            Place::Segment(p) => 3 << 62 | (p & POSITION_MASK),
        }
    }

    pub(super) fn decode(raw: u64) -> Place {
        let at = raw & POSITION_MASK;
        match raw >> 62 {
            0 => Place::Unallocated,
            1 => Place::Zero,
            2 => Place::Cache(at),
            _ => Place::Segment(at),
        }
    }
}

impl MapEntry {
    pub(super) fn encode(self, out: &mut [u8]) {
        out[0..8].copy_from_slice(&self.place.encode().to_le_bytes());
        out[8..12].copy_from_slice(&self.crc.to_le_bytes());
        out[12..16].copy_from_slice(&self.seq.to_le_bytes());
    }

    pub(super) fn decode(b: &[u8]) -> MapEntry {
        MapEntry {
            place: Place::decode(u64::from_le_bytes(b[0..8].try_into().expect("8 bytes"))),
            crc: u32::from_le_bytes(b[8..12].try_into().expect("4 bytes")),
            seq: u32::from_le_bytes(b[12..16].try_into().expect("4 bytes")),
        }
    }
}

pub(super) fn page_crc(page: &[u8]) -> u32 {
    stria_dev::crc::crc32c_parts(&[&page[..8], &page[12..]])
}

/// Encodes map page `page` of layer `owner` (0: the head; else a snapshot's copy of it).
pub(super) fn encode_page(owner: u16, page: u64, entries: &[MapEntry], out: &mut [u8]) {
    assert_eq!(
        entries.len() as u64,
        ENTRIES_PER_PAGE,
        "map page {page} encoded from {} entries",
        entries.len()
    );
    out.fill(0);
    out[0..4].copy_from_slice(&PAGE_MAGIC.to_le_bytes());
    out[4..8].copy_from_slice(&u32::try_from(page).expect("page index fits in 32 bits").to_le_bytes());
    out[12..14].copy_from_slice(&owner.to_le_bytes());
    for (i, e) in entries.iter().enumerate() {
        e.encode(&mut out[16 + 16 * i..32 + 16 * i]);
    }
    let crc = page_crc(out);
    out[8..12].copy_from_slice(&crc.to_le_bytes());
}

/// The entries of page `page` from its bytes; all zeros is an empty page; `None` if damaged.
pub(super) fn decode_page(page: u64, b: &[u8]) -> Option<Box<[MapEntry]>> {
    if b.iter().all(|&x| x == 0) {
        return Some(vec![MapEntry::UNALLOCATED; ENTRIES_PER_PAGE as usize].into_boxed_slice());
    }
    let magic = u32::from_le_bytes(b[0..4].try_into().expect("4 bytes"));
    let index = u32::from_le_bytes(b[4..8].try_into().expect("4 bytes"));
    let crc = u32::from_le_bytes(b[8..12].try_into().expect("4 bytes"));
    let owner = u16::from_le_bytes(b[12..14].try_into().expect("2 bytes"));
    if magic != PAGE_MAGIC || u64::from(index) != page || owner != 0 || crc != page_crc(b) {
        return None;
    }
    Some((0..ENTRIES_PER_PAGE as usize).map(|i| MapEntry::decode(&b[16 + 16 * i..32 + 16 * i])).collect())
}

/// A snapshot's copy of map page `page` from its bytes (never all zeros); `None` if it is not a
/// copy of that page. The owner written in it is not checked: a delete hands copies to older
/// snapshots, and a copy is rewritten with its new owner only at the next checkpoint.
pub(super) fn decode_owned_page(page: u64, b: &[u8]) -> Option<Box<[MapEntry]>> {
    let magic = u32::from_le_bytes(b[0..4].try_into().expect("4 bytes"));
    let index = u32::from_le_bytes(b[4..8].try_into().expect("4 bytes"));
    let crc = u32::from_le_bytes(b[8..12].try_into().expect("4 bytes"));
    let found = u16::from_le_bytes(b[12..14].try_into().expect("2 bytes"));
    if magic != PAGE_MAGIC || u64::from(index) != page || found == 0 || crc != page_crc(b) {
        return None;
    }
    Some((0..ENTRIES_PER_PAGE as usize).map(|i| MapEntry::decode(&b[16 + 16 * i..32 + 16 * i])).collect())
}

pub(super) fn encode_log_block(seq: u64, deltas: &[(u64, [u8; 16])], out: &mut [u8]) {
    assert!(deltas.len() <= DELTAS_PER_LOG_BLOCK, "map log block {seq}: {} deltas", deltas.len());
    out.fill(0);
    out[0..4].copy_from_slice(&LOG_MAGIC.to_le_bytes());
    out[4..6].copy_from_slice(&u16::try_from(deltas.len()).expect("fits").to_le_bytes());
    out[8..16].copy_from_slice(&seq.to_le_bytes());
    for (i, (block, e)) in deltas.iter().enumerate() {
        let at = LOG_HEADER_BYTES + DELTA_BYTES * i;
        out[at..at + 8].copy_from_slice(&block.to_le_bytes());
        out[at + 8..at + 24].copy_from_slice(e);
    }
    let crc = stria_dev::crc::crc32c_parts(&[&out[..16], &out[20..]]);
    out[16..20].copy_from_slice(&crc.to_le_bytes());
}

/// The deltas of the log block expected to carry `seq`; `None` if it is not that block (stale
/// from an earlier lap of the ring, torn, or never written).
pub(super) fn decode_log_block(b: &[u8], seq: u64) -> Option<Vec<(u64, [u8; 16])>> {
    let magic = u32::from_le_bytes(b[0..4].try_into().expect("4 bytes"));
    let count = usize::from(u16::from_le_bytes(b[4..6].try_into().expect("2 bytes")));
    let found = u64::from_le_bytes(b[8..16].try_into().expect("8 bytes"));
    let crc = u32::from_le_bytes(b[16..20].try_into().expect("4 bytes"));
    if magic != LOG_MAGIC
        || found != seq
        || count > DELTAS_PER_LOG_BLOCK
        || crc != stria_dev::crc::crc32c_parts(&[&b[..16], &b[20..]])
    {
        return None;
    }
    Some(
        (0..count)
            .map(|i| {
                let at = LOG_HEADER_BYTES + DELTA_BYTES * i;
                let block = u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
                (block, b[at + 8..at + 24].try_into().expect("16 bytes"))
            })
            .collect(),
    )
}

pub(super) fn encode_header(replay_seq: u64, out: &mut [u8]) {
    out.fill(0);
    out[0..4].copy_from_slice(&HEADER_MAGIC.to_le_bytes());
    out[8..16].copy_from_slice(&replay_seq.to_le_bytes());
    let crc = stria_dev::crc::crc32c(&out[..16]);
    out[16..20].copy_from_slice(&crc.to_le_bytes());
}

/// The replay position in a header block; `None` for a new (all-zero) or unreadable header.
pub(super) fn decode_header(b: &[u8]) -> Option<u64> {
    let magic = u32::from_le_bytes(b[0..4].try_into().expect("4 bytes"));
    let crc = u32::from_le_bytes(b[16..20].try_into().expect("4 bytes"));
    (magic == HEADER_MAGIC && crc == stria_dev::crc::crc32c(&b[..16]))
        .then(|| u64::from_le_bytes(b[8..16].try_into().expect("8 bytes")))
}
