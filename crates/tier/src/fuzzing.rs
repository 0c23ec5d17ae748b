//! Entry points for the fuzzer (`fuzz/`, target `tier_decoders`) and for the corpus replay test
//! (`tests/fuzz_corpus.rs`). Not part of the stable API.
//!
//! [`decoders`] reads its input as a selector byte (which structure, [`Structure`]), a flags byte
//! ([`SEAL`]: seal the structure's checksums first, so that the fuzzer gets past them to the
//! fields behind), then the structure's bytes, cut or zero-padded to its size. Every decoder of a
//! log-structured volume's format (docs/on-disk-format.md §7-§8) must refuse bad bytes without
//! panicking, and what it accepts must round trip: the decoded value, encoded and decoded again,
//! is the same value, and its encoding is the input itself when the input was canonical (as the
//! encoder writes it).

use stria_dev::{BLOCK_USIZE, BlockDevice};

use crate::layers::{self, IndexLevel, IndexPage, LAYER_RECORD_BYTES, LAYER_TABLE_BLOCKS};
use crate::log::LogVolume;
use crate::log::space::{SummaryEntry, decode_summary, encode_summary};

/// Flags bit: seal the structure's checksums before decoding.
pub const SEAL: u8 = 1;

/// The structures [`decoders`] takes, by selector byte (modulo their number).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Structure {
    /// §7: the map's log header, one block.
    MapLogHeader,
    /// §7: one log block, decoded at the sequence it carries, with each record in it.
    MapLogBlock,
    /// §7: one map page, as the head's page and as a snapshot's copy.
    MapPage,
    /// §8: a batch summary: the number of data slots (2 bytes), then 1-4 summary blocks.
    Summary,
    /// §8.2: the segment table, a header block and its body (up to 16 blocks).
    SegmentTable,
    /// §8.3: the layer table, 8 blocks.
    LayerTable,
    /// §8.4: one index page, decoded as the page it says it is.
    IndexPage,
    /// §8: the volume header (block 0 of the metadata part).
    VolumeHeader,
}

impl Structure {
    pub const ALL: [Structure; 8] = [
        Structure::MapLogHeader,
        Structure::MapLogBlock,
        Structure::MapPage,
        Structure::Summary,
        Structure::SegmentTable,
        Structure::LayerTable,
        Structure::IndexPage,
        Structure::VolumeHeader,
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

impl From<Option<bool>> for Outcome {
    fn from(exact: Option<bool>) -> Outcome {
        exact.map_or(Outcome::Refused, |exact| Outcome::Accepted { exact })
    }
}

/// Runs the decoder `data[0]` selects on the rest of `data` and asserts its properties.
pub fn decoders(data: &[u8]) -> Outcome {
    let Some((&selector, rest)) = data.split_first() else { return Outcome::Refused };
    let (flags, body) = rest.split_first().map_or((0, &[][..]), |(&f, b)| (f, b));
    let seal = flags & SEAL != 0;
    let sealed = |blocks: usize, f: fn(&mut [u8])| {
        let mut b = padded(body, blocks);
        if seal {
            f(&mut b);
        }
        b
    };
    match Structure::of(selector) {
        Structure::MapLogHeader => {
            crate::map::fuzzing::log_header(&sealed(1, crate::map::fuzzing::seal_log_header))
        }
        Structure::MapLogBlock => {
            crate::map::fuzzing::log_block(&sealed(1, crate::map::fuzzing::seal_log_block))
        }
        Structure::MapPage => crate::map::fuzzing::page(&sealed(1, crate::map::fuzzing::seal_page)),
        Structure::Summary => summary(body, seal),
        Structure::SegmentTable => {
            let blocks = body.len().div_ceil(BLOCK_USIZE).clamp(1, 16);
            crate::log::fuzzing::table(&sealed(blocks, crate::log::fuzzing::seal_table))
        }
        Structure::LayerTable => layer_table(&sealed(LAYER_TABLE_BLOCKS, seal_layer_table)),
        Structure::IndexPage => index_page(&sealed(1, seal_index_page)),
        Structure::VolumeHeader => crate::log::fuzzing::header(&sealed(1, crate::log::fuzzing::seal_header)),
    }
    .into()
}

/// `body` cut or zero-padded to `blocks` blocks.
fn padded(body: &[u8], blocks: usize) -> Vec<u8> {
    let mut b = body[..body.len().min(blocks * BLOCK_USIZE)].to_vec();
    b.resize(blocks * BLOCK_USIZE, 0);
    b
}

const SUMMARY_MAGIC: u32 = u32::from_le_bytes(*b"SSUM");
/// Entries of one summary block.
const SUMMARY_ENTRIES: usize = 255;

fn summary(body: &[u8], seal: bool) -> Option<bool> {
    let (count, blocks) = body.split_at_checked(2).unwrap_or((&[0, 0], body));
    let blocks_n = blocks.len().div_ceil(BLOCK_USIZE).clamp(1, 4);
    let mut b = padded(blocks, blocks_n);
    // The data slots of the batch: at most what its summary blocks describe.
    let data = usize::from(u16::from_le_bytes([count[0], count[1]])) % (blocks_n * SUMMARY_ENTRIES + 1);
    if seal {
        for block in b.chunks_exact_mut(BLOCK_USIZE) {
            if u32::from_le_bytes(block[0..4].try_into().expect("4")) == SUMMARY_MAGIC {
                let crc = crc32c::crc32c_append(crc32c::crc32c(&block[..4]), &block[8..]);
                block[4..8].copy_from_slice(&crc.to_le_bytes());
            }
        }
    }
    let entries = decode_summary(&b, data);
    assert_eq!(entries.len(), data, "one entry per data slot");
    // Slots of a valid or never written block decode; those of a damaged one do not.
    let entries: Vec<SummaryEntry> = entries.into_iter().collect::<Option<_>>()?;
    let seq = u64::from_le_bytes(b[8..16].try_into().expect("8"));
    let mut encoded = vec![0u8; b.len()];
    encode_summary(seq, &entries, &mut encoded);
    let back: Vec<SummaryEntry> =
        decode_summary(&encoded, data).into_iter().map(|e| e.expect("encoded")).collect();
    assert_eq!(back, entries, "summary round trip");
    Some(encoded == b)
}

/// Seals every non-empty record of a layer table (CRC of bytes 0..124 at 124..128).
fn seal_layer_table(b: &mut [u8]) {
    for r in b.chunks_exact_mut(LAYER_RECORD_BYTES) {
        if r.iter().any(|&x| x != 0) {
            let crc = crc32c::crc32c(&r[..LAYER_RECORD_BYTES - 4]);
            r[LAYER_RECORD_BYTES - 4..].copy_from_slice(&crc.to_le_bytes());
        }
    }
}

fn layer_table(b: &[u8]) -> Option<bool> {
    // Each record on its own, then the table (which also refuses duplicates and orphans).
    for r in b.chunks_exact(LAYER_RECORD_BYTES) {
        if let Ok(Some(rec)) = layers::LayerRecord::decode(r) {
            let mut encoded = vec![0u8; LAYER_RECORD_BYTES];
            rec.encode(&mut encoded);
            assert_eq!(layers::LayerRecord::decode(&encoded), Ok(Some(rec)), "layer record round trip");
        }
    }
    let records = layers::decode_layer_table(b).ok()?;
    let encoded = layers::encode_layer_table(&records);
    assert_eq!(layers::decode_layer_table(&encoded).as_ref(), Ok(&records), "layer table round trip");
    Some(encoded == b)
}

/// Seals an index page (CRC of bytes 0..16 and 20.. at 16..20).
fn seal_index_page(b: &mut [u8]) {
    let crc = crc32c::crc32c_append(crc32c::crc32c(&b[..16]), &b[20..]);
    b[16..20].copy_from_slice(&crc.to_le_bytes());
}

fn index_page(b: &[u8]) -> Option<bool> {
    // Decoded as the page it says it is (level, layer, first), so the fuzzer reaches the entries.
    let level = match b[6] {
        1 => IndexLevel::Table,
        2 => IndexLevel::Directory,
        _ => IndexLevel::Root,
    };
    let layer = u16::from_le_bytes(b[4..6].try_into().expect("2"));
    let first = u64::from_le_bytes(b[8..16].try_into().expect("8"));
    let page = IndexPage::decode(b, level, layer, first).ok()?;
    assert!(IndexPage::decode(b, level, layer ^ 1, first).is_err(), "another layer's page is refused");
    assert!(IndexPage::decode(b, level, layer, first ^ 1).is_err(), "a page of another index is refused");
    let mut encoded = vec![0u8; BLOCK_USIZE];
    page.encode(&mut encoded);
    assert_eq!(IndexPage::decode(&encoded, level, layer, first), Ok(page), "index page round trip");
    Some(encoded == b)
}

/// Seeds: the map's structures made by its encoders, and the structures of `vol` as its parts
/// hold them (see [`crate::log::fuzzing::live_structures`]). Each is `(name, input)`.
pub async fn seeds<D: BlockDevice>(vol: &LogVolume<D>) -> Vec<(String, Vec<u8>)> {
    let input = |s: Structure, bytes: &[u8]| {
        let mut v = vec![s.selector(), 0];
        v.extend_from_slice(bytes);
        v
    };
    let made = crate::map::fuzzing::seeds().into_iter().map(|(name, b)| {
        let s = match name {
            "map-log-header" => Structure::MapLogHeader,
            "map-log-block" => Structure::MapLogBlock,
            _ => Structure::MapPage,
        };
        (format!("made-{name}"), input(s, &b))
    });
    let live = crate::log::fuzzing::live_structures(vol).await;
    made.chain(live.into_iter().map(|(name, s, b)| (format!("live-{name}"), input(s, &b)))).collect()
}
