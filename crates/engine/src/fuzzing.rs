//! Entry points for the fuzzer (`fuzz/`, target `engine_decoders`) and for the corpus replay
//! test (`tests/fuzz_corpus.rs`). Not part of the stable API.
//!
//! [`decoders`] reads its input as a selector byte (which structure, [`Structure`]), a flags byte
//! ([`SEAL`]: seal the structure's checksums first, so that the fuzzer gets past them to the
//! fields behind), then the structure's bytes, cut or zero-padded to its size. Every decoder of
//! the drive format (docs/on-disk-format.md §2-§6) must refuse bad bytes without panicking, and
//! what it accepts must round trip: the decoded value, encoded and decoded again, is the same
//! value, and its encoding is the input itself when the input was canonical (as the encoder
//! writes it: reserved bytes zero, the current version).

use std::future::Future;
use std::task::{Context, Poll, Waker};

use stria_dev::mem::MemDevice;
use stria_dev::{BLOCK_USIZE, IoBytes};

use crate::drive::csum::{self, ChecksumTable};
use crate::drive::intent::IntentMap;
use crate::drive::journal::{self, Journal, JournalPiece};
use crate::format::flush_record::FlushRecord;
use crate::format::layout::{CSUM_ENTRIES_PER_PAGE, INTENT_BITS_PER_PAGE};
use crate::format::meta::PoolMeta;
use crate::format::superblock::{FORMAT_VERSION, Superblock};
use crate::format::{page_crc, seal_crc};

/// Flags bit: seal the structure's checksums before decoding.
pub const SEAL: u8 = 1;

/// The structures [`decoders`] takes, by selector byte (modulo their number).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Structure {
    /// §2: one 4 KiB block.
    Superblock,
    /// §2a: one 4 KiB block.
    FlushRecord,
    /// §3: a metadata slot (header and JSON payload), any length.
    PoolMeta,
    /// §5: one 4 KiB journal header block.
    JournalHeader,
    /// §5: one 4 KiB record header block.
    JournalRecord,
    /// §5: a whole journal area (two header copies, then a ring of up to 64 blocks), scanned as
    /// `Journal::open` does at assembly.
    JournalRing,
    /// §6: one checksum page.
    CsumPage,
    /// §4: one intent bitmap page.
    IntentPage,
}

impl Structure {
    pub const ALL: [Structure; 8] = [
        Structure::Superblock,
        Structure::FlushRecord,
        Structure::PoolMeta,
        Structure::JournalHeader,
        Structure::JournalRecord,
        Structure::JournalRing,
        Structure::CsumPage,
        Structure::IntentPage,
    ];

    /// The selector byte of this structure.
    pub fn selector(self) -> u8 {
        Structure::ALL.iter().position(|&s| s == self).expect("listed") as u8
    }

    fn of(selector: u8) -> Structure {
        Structure::ALL[usize::from(selector) % Structure::ALL.len()]
    }
}

/// What a decoder made of an input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Refused (not the structure, damaged, or invalid), as it must be for most bytes.
    Refused,
    /// Decoded and round tripped; `exact` when the encoding is the input's own bytes.
    Accepted { exact: bool },
}

/// Runs the decoder `data[0]` selects on the rest of `data` and asserts its properties.
pub fn decoders(data: &[u8]) -> Outcome {
    let Some((&selector, rest)) = data.split_first() else { return Outcome::Refused };
    let (flags, body) = rest.split_first().map_or((0, &[][..]), |(&f, b)| (f, b));
    let seal = flags & SEAL != 0;
    match Structure::of(selector) {
        Structure::Superblock => superblock(&mut block(body), seal),
        Structure::FlushRecord => flush_record(&mut block(body), seal),
        Structure::PoolMeta => pool_meta(body, seal),
        Structure::JournalHeader => journal_header(&mut block(body), seal),
        Structure::JournalRecord => journal_record(&mut block(body), seal),
        Structure::JournalRing => journal_ring(body, seal),
        Structure::CsumPage => csum_page(&mut block(body), seal),
        Structure::IntentPage => intent_page(&mut block(body), seal),
    }
}

/// `body` cut or zero-padded to one block.
fn block(body: &[u8]) -> Vec<u8> {
    let mut b = body[..body.len().min(BLOCK_USIZE)].to_vec();
    b.resize(BLOCK_USIZE, 0);
    b
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn superblock(b: &mut [u8], seal: bool) -> Outcome {
    if seal {
        seal_crc(b);
    }
    let Ok(sb) = Superblock::decode(b) else { return Outcome::Refused };
    let encoded = sb.encode();
    let back = Superblock::decode(&encoded).expect("an encoded superblock decodes");
    // The encoder writes the current version; everything else comes back as it was.
    assert_eq!(back, Superblock { format_version: FORMAT_VERSION, ..sb }, "superblock round trip");
    Outcome::Accepted { exact: encoded == b }
}

fn flush_record(b: &mut [u8], seal: bool) -> Outcome {
    if seal {
        seal_crc(b);
    }
    let Ok(record) = FlushRecord::decode(b) else { return Outcome::Refused };
    let encoded = record.encode();
    assert_eq!(FlushRecord::decode(&encoded), Ok(record), "flush record round trip");
    Outcome::Accepted { exact: encoded == b }
}

/// Header bytes of a metadata slot (format §3).
const META_HEADER_BYTES: usize = 64;

fn pool_meta(body: &[u8], seal: bool) -> Outcome {
    let mut slot = body.to_vec();
    if slot.len() < META_HEADER_BYTES {
        slot.resize(META_HEADER_BYTES, 0);
    }
    if seal {
        // A payload length that fits the slot, then both checksums.
        let payload_bytes = (u32_at(&slot, 32) as usize) % (slot.len() - META_HEADER_BYTES + 1);
        slot[32..36].copy_from_slice(&(payload_bytes as u32).to_le_bytes());
        let payload_crc = crc32c::crc32c(&slot[META_HEADER_BYTES..META_HEADER_BYTES + payload_bytes]);
        slot[36..40].copy_from_slice(&payload_crc.to_le_bytes());
        let header_crc = crc32c::crc32c(&slot[..60]);
        slot[60..64].copy_from_slice(&header_crc.to_le_bytes());
    }
    // The header alone decodes wherever the whole slot does.
    let header = PoolMeta::decode_header(&slot);
    let Ok(meta) = PoolMeta::decode(&slot) else { return Outcome::Refused };
    let (generation, pool_uuid, _, _) = header.expect("a slot that decodes has a valid header");
    assert_eq!((generation, pool_uuid), (meta.generation, meta.pool_uuid), "header and payload agree");
    let encoded = meta.encode(u64::MAX).expect("a decoded document encodes");
    assert_eq!(PoolMeta::decode(&encoded).as_ref(), Ok(&meta), "pool metadata round trip");
    let n = encoded.len().min(slot.len());
    let exact = encoded[..n] == slot[..n] && slot[n..].iter().all(|&x| x == 0) && n == encoded.len();
    Outcome::Accepted { exact }
}

fn journal_header(b: &mut [u8], seal: bool) -> Outcome {
    if seal {
        seal_crc(b);
    }
    let Some(header) = Journal::decode_header(b) else { return Outcome::Refused };
    let encoded = Journal::encode_header(&header);
    assert_eq!(Journal::decode_header(&encoded).as_ref(), Some(&header), "journal header round trip");
    Outcome::Accepted { exact: encoded == b }
}

fn journal_record(b: &mut [u8], seal: bool) -> Outcome {
    if seal {
        seal_crc(b);
    }
    // The sequence and epoch the scan would expect: the block's own, so the fuzzer reaches the
    // fields behind them; any other is refused.
    let (seq, epoch) = (u64_at(b, 8), u64_at(b, journal::EPOCH_AT));
    let Some(record) = journal::decode_record_header(b, seq, epoch) else { return Outcome::Refused };
    assert!(
        journal::decode_record_header(b, seq.wrapping_add(1), epoch).is_none(),
        "another sequence is refused"
    );
    assert!(
        journal::decode_record_header(b, seq, epoch.wrapping_add(1)).is_none(),
        "another epoch is refused"
    );
    assert!(
        record.len_blocks <= journal::MAX_RECORD_BLOCKS && record.piece_slots.len() <= journal::MAX_PIECES
    );
    assert_eq!(record.crcs.len() as u64, record.len_blocks, "one CRC per payload block");
    let encoded = if record.len_blocks == 0 {
        // A pad: "continue at the ring start"; its other fields mean nothing.
        let pad = journal::encode_pad(seq, epoch);
        let back = journal::decode_record_header(&pad, seq, epoch).expect("an encoded pad decodes");
        assert_eq!(back.len_blocks, 0, "a pad round trips as a pad");
        pad
    } else {
        // The encoder writes the piece's CRC list (the decoded one), whatever the payload.
        let piece = JournalPiece {
            txn_id: record.txn_id,
            volume_id: record.volume_id,
            target_block: record.target_block,
            piece_slots: record.piece_slots.clone(),
            data: IoBytes::zeroed(record.len_blocks as usize * BLOCK_USIZE),
            crcs: record.crcs.clone(),
        };
        let encoded = journal::encode_record_header(seq, epoch, &piece);
        let back = journal::decode_record_header(&encoded, seq, epoch).expect("an encoded record decodes");
        assert_eq!(back, record, "journal record round trip");
        encoded
    };
    Outcome::Accepted { exact: encoded == b }
}

/// Most ring blocks of a fuzzed journal area.
const RING_BLOCKS_MAX: usize = 64;

fn journal_ring(body: &[u8], seal: bool) -> Outcome {
    let copies = journal::HEADER_COPIES as usize;
    let blocks = body.len().div_ceil(BLOCK_USIZE).clamp(copies + 4, copies + RING_BLOCKS_MAX);
    let mut area = body[..body.len().min(blocks * BLOCK_USIZE)].to_vec();
    area.resize(blocks * BLOCK_USIZE, 0);
    if seal {
        seal_journal(&mut area);
    }
    let headers: Vec<_> =
        area.chunks_exact(BLOCK_USIZE).take(copies).filter_map(Journal::decode_header).collect();
    let dev = MemDevice::new("fuzz-journal", area.len() as u64);
    dev.write_at(0, &area);
    let (journal, pieces, watermark) =
        block_on(Journal::open(&dev, 0, area.len() as u64)).expect("a memory drive reads");
    let ring = (blocks - copies) as u64;
    assert!(journal.used_blocks() <= ring, "the records found fit the ring");
    for (i, p) in pieces.iter().enumerate() {
        if i > 0 {
            assert_eq!(p.seq, pieces[i - 1].seq + 1, "records follow on");
        }
        assert_eq!(p.piece.data.len(), p.piece.crcs.len() * BLOCK_USIZE, "a payload block per CRC");
        assert!(!p.piece.crcs.is_empty(), "a pad is not a record");
        for (data, &crc) in p.piece.data.chunks_exact(BLOCK_USIZE).zip(&p.piece.crcs) {
            assert_eq!(csum::block_crc(data), crc, "a recovered payload block matches its CRC");
        }
    }
    if headers.is_empty() {
        assert!(pieces.is_empty() && watermark == Default::default(), "no header: an empty journal");
        return Outcome::Refused;
    }
    Outcome::Accepted { exact: false }
}

/// Seals the header copies and every record header of a journal area, with the CRC list of the
/// payload blocks that follow it.
fn seal_journal(area: &mut [u8]) {
    let copies = journal::HEADER_COPIES as usize;
    let blocks = area.len() / BLOCK_USIZE;
    for i in 0..blocks {
        let at = i * BLOCK_USIZE;
        if i < copies {
            if &area[at..at + 8] == journal::HEADER_MAGIC {
                seal_crc(&mut area[at..at + BLOCK_USIZE]);
            }
            continue;
        }
        if &area[at..at + 8] != journal::RECORD_MAGIC {
            continue;
        }
        let len =
            (u32_at(area, at + 40) as usize).min(journal::MAX_RECORD_BLOCKS as usize).min(blocks - i - 1);
        for k in 0..len {
            let payload = (i + 1 + k) * BLOCK_USIZE;
            let crc = csum::block_crc(&area[payload..payload + BLOCK_USIZE]);
            area[at + 560 + 4 * k..at + 564 + 4 * k].copy_from_slice(&crc.to_le_bytes());
        }
        seal_crc(&mut area[at..at + BLOCK_USIZE]);
    }
}

fn csum_page(b: &mut [u8], seal: bool) -> Outcome {
    let id = u64::from(u32_at(b, 4));
    if seal {
        let crc = page_crc(b);
        b[12..16].copy_from_slice(&crc.to_le_bytes());
    }
    let (entries, damaged) = csum::decode_page(id, b);
    if b.iter().all(|&x| x == 0) {
        assert!(!damaged, "an all-zero page is a valid empty page");
    }
    // The page of another index never passes for this one.
    let (_, other_damaged) = csum::decode_page(id ^ 1, b);
    assert!(other_damaged || b.iter().all(|&x| x == 0), "a page read as another page's");
    if damaged {
        return Outcome::Refused;
    }
    // A table whose page `id` is full, so every entry is encoded.
    let table = ChecksumTable::new((id + 1) * CSUM_ENTRIES_PER_PAGE, 0);
    let mut encoded = vec![0u8; BLOCK_USIZE];
    table.encode_page(id, &entries, &mut encoded);
    if b.iter().any(|&x| x != 0) {
        assert_eq!(encoded[..8], b[..8], "magic and index round trip");
        assert_eq!(encoded[16..], b[16..], "the entries round trip");
    }
    let (again, again_damaged) = csum::decode_page(id, &encoded);
    assert!(!again_damaged, "an encoded page decodes");
    let mut twice = vec![0u8; BLOCK_USIZE];
    table.encode_page(id, &again, &mut twice);
    assert_eq!(twice, encoded, "checksum page round trip");
    Outcome::Accepted { exact: encoded == b }
}

fn intent_page(b: &mut [u8], seal: bool) -> Outcome {
    let page = u64::from(u32_at(b, 4));
    if seal {
        let crc = page_crc(b);
        b[12..16].copy_from_slice(&crc.to_le_bytes());
    }
    // A drive with one full bitmap page and part of a second.
    let regions = INTENT_BITS_PER_PAGE + 500;
    let mut map = IntentMap::new(regions, 0);
    let dirty = map.load_page(page, b);
    let first = page.saturating_mul(INTENT_BITS_PER_PAGE).min(regions);
    let last = first.saturating_add(INTENT_BITS_PER_PAGE).min(regions);
    let valid = b.iter().all(|&x| x == 0)
        || (u32_at(b, 0) == 0x5354_4942 && u64::from(u32_at(b, 4)) == page && u32_at(b, 12) == page_crc(b));
    let want: Vec<u64> = (first..last)
        .filter(|&r| {
            let i = (r - first) as usize;
            !valid || b[16 + i / 8] & (1 << (i % 8)) != 0
        })
        .collect();
    assert_eq!(dirty, want, "an intent page marks its set bits dirty, a damaged one every region");
    assert_eq!(map.dirty_list().len(), want.len(), "the map holds what the page marked");
    if valid { Outcome::Accepted { exact: false } } else { Outcome::Refused }
}

/// Polls `f` to completion (the memory drive completes every request at once).
fn block_on<F: Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let mut cx = Context::from_waker(Waker::noop());
    for _ in 0..1_000_000 {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
    }
    panic!("a future over a memory drive never completed");
}
