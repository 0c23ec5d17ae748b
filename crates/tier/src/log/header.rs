//! The metadata header of a log volume (block 0 of `<name>.meta`; byte table in
//! docs/on-disk-format.md §8): the geometry, the sizes of the regions that follow, and where the
//! persisted segment table and the snapshot page pool lie.

use stria_dev::{BLOCK_BYTES, BLOCK_USIZE};

use super::space::Geometry;
use super::table;
use crate::map::MapLayout;

/// Version 2 adds the persisted segment table after the map region; version 1 headers (no
/// table: open scans the map) are still read.
pub(super) const FORMAT_VERSION: u32 = 3;
pub(super) const HEADER_MAGIC: &[u8; 8] = b"STRIA-LV";
/// The metadata header (block 0 of `<name>.meta`); byte table in docs/on-disk-format.md §8.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Header {
    /// 1: no persisted segment table; 2: the table follows the map region; 3: a layer table and
    /// a page pool for snapshots follow the table.
    pub(super) version: u32,
    pub(super) volume_bytes: u64,
    pub(super) geo: Geometry,
    pub(super) cache_blocks: u64,
    pub(super) map_log_blocks: u64,
    /// Pages of the snapshot page pool (version 3).
    pub(super) pool_pages: u64,
}

impl Header {
    /// The header block. Checked before it is written: a header open would refuse, or read
    /// back as another, must never reach the disk.
    pub(super) fn encode(&self) -> Vec<u8> {
        let g = self.geo;
        assert!(
            (1..=FORMAT_VERSION).contains(&self.version)
                && self.volume_bytes > 0
                && self.volume_bytes.is_multiple_of(BLOCK_BYTES)
                && g.row_blocks > 0
                && g.batch_rows > 0
                && g.segment_batches > 0
                && g.segments >= 6
                && self.cache_blocks >= 2 * g.batch_data()
                && self.map_log_blocks >= 4
                && u32::try_from(self.pool_pages).is_ok(),
            "log volume header {self:?} breaks its rules"
        );
        let mut b = vec![0u8; BLOCK_USIZE];
        b[0..8].copy_from_slice(HEADER_MAGIC);
        b[8..12].copy_from_slice(&self.version.to_le_bytes());
        let fields = [
            self.volume_bytes,
            self.geo.row_blocks,
            self.geo.batch_rows,
            self.geo.segment_batches,
            self.geo.segments,
            self.cache_blocks,
            self.map_log_blocks,
            self.pool_pages,
        ];
        for (i, f) in fields.iter().enumerate() {
            b[16 + 8 * i..24 + 8 * i].copy_from_slice(&f.to_le_bytes());
        }
        let crc = header_crc(&b);
        b[12..16].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(
            Header::decode(&b).as_ref(),
            Ok(self),
            "a log volume header does not read back as written"
        );
        b
    }

    pub(super) fn decode(b: &[u8]) -> Result<Header, String> {
        if &b[0..8] != HEADER_MAGIC {
            return Err("not a log-structured volume header (bad magic)".into());
        }
        let version = u32::from_le_bytes(b[8..12].try_into().expect("4"));
        if !(1..=FORMAT_VERSION).contains(&version) {
            return Err(format!("header format version {version}; this build reads {FORMAT_VERSION}"));
        }
        if u32::from_le_bytes(b[12..16].try_into().expect("4")) != header_crc(b) {
            return Err("header checksum mismatch".into());
        }
        let f = |i: usize| u64::from_le_bytes(b[16 + 8 * i..24 + 8 * i].try_into().expect("8"));
        Ok(Header {
            version,
            volume_bytes: f(0),
            geo: Geometry { row_blocks: f(1), batch_rows: f(2), segment_batches: f(3), segments: f(4) },
            cache_blocks: f(5),
            map_log_blocks: f(6),
            pool_pages: if version >= 3 { f(7) } else { 0 },
        })
    }

    /// Byte offset and size of the persisted segment table in the metadata part, if it has one.
    pub(super) fn table_region(&self) -> Option<(u64, u64)> {
        (self.version >= 2).then(|| {
            (
                BLOCK_BYTES + self.map_layout().bytes(),
                table::region_bytes(self.geo.segments, self.cache_blocks),
            )
        })
    }

    /// Bytes of the metadata part.
    pub(super) fn meta_bytes(&self) -> u64 {
        let map = self.map_layout();
        map.end().max(BLOCK_BYTES + map.bytes() + self.table_region().map_or(0, |r| r.1))
    }

    pub(super) fn map_layout(&self) -> MapLayout {
        let plain = MapLayout {
            base: BLOCK_BYTES,
            log_blocks: self.map_log_blocks,
            blocks: self.volume_bytes / BLOCK_BYTES,
            pool: None,
        };
        // Version 3: the layer table and the page pool follow the segment table.
        let pool = (self.version >= 3).then(|| {
            let layers_at =
                BLOCK_BYTES + plain.bytes() + table::region_bytes(self.geo.segments, self.cache_blocks);
            crate::map::PoolLayout {
                layers_at,
                pages_at: layers_at + crate::layers::LAYER_TABLE_BLOCKS as u64 * BLOCK_BYTES,
                pages: u32::try_from(self.pool_pages).expect("pool pages fit in 32 bits"),
            }
        });
        MapLayout { pool, ..plain }
    }
}

pub(super) fn header_crc(b: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&b[..12]), &b[16..])
}
