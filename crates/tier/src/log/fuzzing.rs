//! The volume header and the segment table (private to `log`) for [`crate::fuzzing`], and the
//! structures of a live volume read back from its parts, as seeds.

use stria_dev::{BLOCK_BYTES, BLOCK_USIZE, BlockDevice};

use super::LogVolume;
use super::header::{Header, header_crc};
use super::table::Table;
use crate::fuzzing::Structure;
use crate::layers::{IndexLevel, LAYER_TABLE_BLOCKS};

/// Seals a volume header (CRC of bytes 0..12 and 16.. at 12..16).
pub fn seal_header(b: &mut [u8]) {
    let crc = header_crc(b);
    b[12..16].copy_from_slice(&crc.to_le_bytes());
}

/// Decodes a volume header, round trips it, and computes what open computes from it before it
/// compares it with the pool record: the sizes of a segment, of the space and of the metadata
/// part, the segment table's region and the map's layout.
pub fn header(b: &[u8]) -> Option<bool> {
    let h = Header::decode(b).ok()?;
    let encoded = h.encode();
    assert_eq!(Header::decode(&encoded), Ok(h), "volume header round trip");
    let _ = (h.geo.segment_blocks(), h.geo.space_blocks(), h.meta_bytes(), h.table_region(), h.map_layout());
    Some(encoded == b)
}

/// Most segments and owners of a fuzzed table: open reads a table only when its counts are the
/// volume header's (`read_table`), so they are bounded by a geometry that decoded.
const SEGMENTS_MAX: u64 = 4096;
const OWNERS_MAX: u64 = 4096;

/// Seals a segment table: its body's CRC (of as many bytes as its header counts, within `b`),
/// then its header's.
pub fn seal_table(b: &mut [u8]) {
    let segments = u64::from_le_bytes(b[24..32].try_into().expect("8")) % (SEGMENTS_MAX + 1);
    let owners = u64::from_le_bytes(b[32..40].try_into().expect("8")) % (OWNERS_MAX + 1);
    b[24..32].copy_from_slice(&segments.to_le_bytes());
    b[32..40].copy_from_slice(&owners.to_le_bytes());
    let body_len = (Table::body_bytes(segments, owners) as usize).min(b.len() - BLOCK_USIZE);
    let body_crc = crc32c::crc32c(&b[BLOCK_USIZE..BLOCK_USIZE + body_len]);
    b[40..44].copy_from_slice(&body_crc.to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&b[..44]), &b[48..BLOCK_USIZE]);
    b[44..48].copy_from_slice(&crc.to_le_bytes());
}

/// Decodes a segment table (header block, then body) as open does, and round trips it.
pub fn table(b: &[u8]) -> Option<bool> {
    let h = Table::decode_header(&b[..BLOCK_USIZE])?;
    let (_, _, segments, owners, _) = h;
    if segments > SEGMENTS_MAX || owners > OWNERS_MAX {
        return None;
    }
    let t = Table::decode_body(h, &b[BLOCK_USIZE..])?;
    assert_eq!(
        (t.live.len() as u64, t.owners.len() as u64),
        (segments, owners),
        "the counts the header says"
    );
    let encoded = t.encode();
    let back = Table::decode_header(&encoded[..BLOCK_USIZE]).expect("an encoded table header decodes");
    assert_eq!(back, h, "segment table header round trip");
    assert_eq!(Table::decode_body(back, &encoded[BLOCK_USIZE..]), Some(t), "segment table round trip");
    let n = encoded.len().min(b.len());
    Some(n == encoded.len() && encoded[..] == b[..n] && b[n..].iter().all(|&x| x == 0))
}

/// The structures of `vol` as its parts hold them (after a clean close, so that the map's pages,
/// the segment table and the layer table are written): `(name, structure, bytes)`.
pub async fn live_structures<D: BlockDevice>(vol: &LogVolume<D>) -> Vec<(String, Structure, Vec<u8>)> {
    let [meta, _, seg] = vol.parts();
    let read =
        |at: u64, len: u64| async move { meta.read(at, len as usize).await.expect("read the metadata part") };
    let block0 = read(0, BLOCK_BYTES).await;
    let h = Header::decode(&block0).expect("the volume header");
    let mut out = vec![("volume-header".to_string(), Structure::VolumeHeader, block0.to_vec())];
    let layout = h.map_layout();
    out.push((
        "map-log-header".into(),
        Structure::MapLogHeader,
        read(layout.base, BLOCK_BYTES).await.to_vec(),
    ));
    for i in 0..layout.log_blocks.min(4) {
        let b = read(layout.base + (1 + i) * BLOCK_BYTES, BLOCK_BYTES).await;
        out.push((format!("map-log-block-{i}"), Structure::MapLogBlock, b.to_vec()));
    }
    let pages_at = layout.base + (1 + layout.log_blocks) * BLOCK_BYTES;
    for p in 0..layout.pages().min(2) {
        let b = read(pages_at + p * BLOCK_BYTES, BLOCK_BYTES).await;
        out.push((format!("map-page-{p}"), Structure::MapPage, b.to_vec()));
    }
    if let Some((at, len)) = h.table_region() {
        let head = read(at, BLOCK_BYTES).await;
        if let Some((_, _, segments, owners, _)) = Table::decode_header(&head) {
            let body =
                Table::body_bytes(segments, owners).next_multiple_of(BLOCK_BYTES).min(len - BLOCK_BYTES);
            out.push((
                "segment-table".into(),
                Structure::SegmentTable,
                read(at, BLOCK_BYTES + body).await.to_vec(),
            ));
        }
    }
    if let Some(pool) = layout.pool {
        let table = read(pool.layers_at, LAYER_TABLE_BLOCKS as u64 * BLOCK_BYTES).await;
        out.push(("layer-table".into(), Structure::LayerTable, table.to_vec()));
        let records = crate::layers::decode_layer_table(&table).expect("the layer table");
        for r in records.iter().filter(|r| r.root_page != 0) {
            let root = read(pool.pages_at + u64::from(r.root_page) * BLOCK_BYTES, BLOCK_BYTES).await;
            out.push((format!("index-root-{}", r.id), Structure::IndexPage, root.to_vec()));
            let page =
                crate::layers::IndexPage::decode(&root, IndexLevel::Root, r.id, 0).expect("a root page");
            if let Some(&dir) = page.entries.iter().find(|&&e| e != 0) {
                let b = read(pool.pages_at + u64::from(dir) * BLOCK_BYTES, BLOCK_BYTES).await;
                out.push((format!("index-directory-{}", r.id), Structure::IndexPage, b.to_vec()));
            }
        }
    }
    // The summary of the first batch of segment 0, if it was written.
    let geo = h.geo;
    let summary_at = (geo.batch_blocks() - geo.summary_blocks()) * BLOCK_BYTES;
    let summary =
        seg.read(summary_at, (geo.summary_blocks() * BLOCK_BYTES) as usize).await.expect("read the space");
    if summary.iter().any(|&b| b != 0) {
        // The data slots the summary describes, then its blocks (see `crate::fuzzing`).
        let mut input = u16::try_from(geo.batch_data()).expect("a batch of test size").to_le_bytes().to_vec();
        input.extend_from_slice(&summary);
        out.push(("summary".into(), Structure::Summary, input));
    }
    out
}
