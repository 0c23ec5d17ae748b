//! The metadata header of a log volume (block 0 of `<name>.meta`; byte table in
//! docs/on-disk-format.md §8): the geometry, the sizes of the regions that follow, and where the
//! persisted segment table and the snapshot page pool lie.

use stria_dev::{BLOCK_BYTES, BLOCK_USIZE};

use super::space::Geometry;
use super::table;
use crate::map::{ENTRIES_PER_PAGE, MAX_RUNS, MapLayout, Runs};
use crate::ring::{Epoch, RingLayout};

/// Version 2 adds the persisted segment table after the map region; version 3 a layer table
/// and page pool after it; version 4 says where each region lies (head pages and pool pages in
/// runs), so a volume's map can grow (`LogVolume::resize`); version 5 the origin's own size when
/// a clone grew the map past it; version 6 where the write cache's positions lie once it grew
/// (`LogVolume::grow_cache`). Versions 1 to 3 are still read (their regions follow one
/// another); a resize writes version 4, 5 while the two sizes differ, 6 once the cache grew.
pub(super) const FORMAT_VERSION: u32 = 6;
/// The version a new volume is made with (5 only once a clone grows past its origin, 6 once its
/// cache grows, so that builds that read 4 still open every other volume).
pub(super) const NEW_VERSION: u32 = 4;
pub(super) const HEADER_MAGIC: &[u8; 8] = b"STRIA-LV";
/// Byte offsets of the version 4 fields past the eight of version 3.
const V4_TABLE_AT: usize = 80;
const V4_LAYERS_AT: usize = 88;
const V4_HEAD_CAP: usize = 96;
const V4_HEAD_RUNS: usize = 104;
const V4_POOL_RUNS: usize = 108;
const V4_RUNS_AT: usize = 112;
/// Byte offset of the version 5 field: past the most runs version 4 may hold.
const V5_HEAD_BYTES: usize = V4_RUNS_AT + 16 * 2 * MAX_RUNS;
/// Byte offset of the version 6 fields: the cache ring's layout (six u64).
const V6_RING: usize = V5_HEAD_BYTES + 8;

/// Where the regions of the metadata part lie (explicit in version 4; derived for 1 to 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Regions {
    /// Byte offset of the persisted segment table (versions 2 on).
    pub(super) table_at: u64,
    /// Byte offset of the layer table (versions 3 on).
    pub(super) layers_at: u64,
    /// Head pages the runs hold (at least the map's pages; more after a shrink).
    pub(super) head_cap: u64,
    pub(super) head: Runs,
    /// The snapshot pool's pages (page 0 at `layers_at` + the layer table).
    pub(super) pool: Runs,
}

/// The metadata header (block 0 of `<name>.meta`); byte table in docs/on-disk-format.md §8.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Header {
    /// 1: no persisted segment table; 2: the table follows the map region; 3: a layer table and
    /// a page pool for snapshots follow the table; 4: the regions are where `regions` says.
    pub(super) version: u32,
    /// The map's size: the volume's logical size, unless `head_bytes` says otherwise.
    pub(super) volume_bytes: u64,
    /// Version 5: the origin's own size when a clone grew the map past it; 0 when the same.
    pub(super) head_bytes: u64,
    pub(super) geo: Geometry,
    pub(super) cache_blocks: u64,
    /// Where the cache ring's positions lie (version 6; a ring of `cache_blocks` that never
    /// grew before it).
    pub(super) ring: RingLayout,
    pub(super) map_log_blocks: u64,
    /// Pages of the snapshot page pool (version 3).
    pub(super) pool_pages: u64,
    pub(super) regions: Regions,
}

impl Header {
    /// A header whose regions follow one another (as versions 1 to 3 lay them out, and as a new
    /// volume starts).
    pub(super) fn packed(
        version: u32,
        volume_bytes: u64,
        geo: Geometry,
        cache_blocks: u64,
        map_log_blocks: u64,
        pool_pages: u64,
    ) -> Header {
        let pages = (volume_bytes / BLOCK_BYTES).div_ceil(ENTRIES_PER_PAGE);
        let map_bytes = (1 + map_log_blocks + pages) * BLOCK_BYTES;
        let table_at = BLOCK_BYTES + map_bytes;
        let layers_at = table_at + table::region_bytes(geo.segments, cache_blocks);
        let regions = Regions {
            table_at,
            layers_at,
            head_cap: pages,
            head: Runs::one(BLOCK_BYTES + (1 + map_log_blocks) * BLOCK_BYTES),
            pool: Runs::one(layers_at + crate::layers::LAYER_TABLE_BLOCKS as u64 * BLOCK_BYTES),
        };
        Header {
            version,
            volume_bytes,
            head_bytes: 0,
            geo,
            cache_blocks,
            ring: RingLayout::fixed(cache_blocks),
            map_log_blocks,
            pool_pages,
            regions,
        }
    }

    /// The lowest version that says everything the header holds (for version 4 on).
    pub(super) fn fit_version(&mut self) {
        if self.version >= 4 {
            self.version = if self.ring.grown() {
                6
            } else if self.head_bytes != 0 {
                5
            } else {
                4
            };
        }
    }

    /// The origin's own size (the head's): at most the map's.
    pub(super) fn head_size(&self) -> u64 {
        if self.head_bytes == 0 { self.volume_bytes } else { self.head_bytes }
    }

    /// Sets the map's size and the origin's, and the version that can say them (at least 4: the
    /// caller writes regions where they are).
    pub(super) fn set_sizes(&mut self, map_bytes: u64, head_bytes: u64) {
        debug_assert!(head_bytes <= map_bytes);
        self.volume_bytes = map_bytes;
        self.head_bytes = if head_bytes == map_bytes { 0 } else { head_bytes };
        self.version = 4;
        self.fit_version();
    }

    /// Head pages of the map.
    pub(super) fn map_pages(&self) -> u64 {
        (self.volume_bytes / BLOCK_BYTES).div_ceil(ENTRIES_PER_PAGE)
    }

    /// The byte ranges `[start, end)` of every region, named, in offset order.
    pub(super) fn spans(&self) -> Vec<(u64, u64, &'static str)> {
        let r = &self.regions;
        let mut v = vec![
            (0, BLOCK_BYTES, "header"),
            (BLOCK_BYTES, BLOCK_BYTES + (1 + self.map_log_blocks) * BLOCK_BYTES, "map log"),
        ];
        v.extend(r.head.spans(r.head_cap).into_iter().map(|(a, b)| (a, b, "map pages")));
        if let Some((at, len)) = self.table_region() {
            v.push((at, at + len, "segment table"));
        }
        if self.version >= 3 {
            let table_end = r.layers_at + crate::layers::LAYER_TABLE_BLOCKS as u64 * BLOCK_BYTES;
            v.push((r.layers_at, table_end, "layer table"));
            v.extend(r.pool.spans(self.pool_pages).into_iter().map(|(a, b)| (a, b, "page pool")));
        }
        v.retain(|s| s.1 > s.0);
        v.sort_unstable();
        v
    }

    /// Whether the header keeps its rules (checked before it is written, and when it is read).
    fn check(&self) -> Result<(), String> {
        let g = self.geo;
        if !((1..=FORMAT_VERSION).contains(&self.version)
            && self.volume_bytes > 0
            && self.volume_bytes.is_multiple_of(BLOCK_BYTES)
            && g.row_blocks > 0
            && g.batch_rows > 0
            && g.segment_batches > 0
            && g.segments >= 6
            && self.cache_blocks >= 2 * g.batch_data()
            && self.map_log_blocks >= 4
            && u32::try_from(self.pool_pages).is_ok()
            && (self.head_bytes == 0
                || (self.version >= 5
                    && self.head_bytes < self.volume_bytes
                    && self.head_bytes.is_multiple_of(BLOCK_BYTES)))
            && self.ring.blocks() == self.cache_blocks
            && (!self.ring.grown() || self.version >= 6))
        {
            return Err(format!("header fields break their rules: {self:?}"));
        }
        self.ring.check()?;
        if self.regions.head_cap < self.map_pages() {
            return Err(format!(
                "the map needs {} pages; its runs hold {}",
                self.map_pages(),
                self.regions.head_cap
            ));
        }
        let spans = self.spans();
        if let Some(w) = spans.windows(2).find(|w| w[1].0 < w[0].1) {
            return Err(format!("the {} and the {} overlap", w[0].2, w[1].2));
        }
        Ok(())
    }

    /// The header block. Checked before it is written: a header open would refuse, or read
    /// back as another, must never reach the disk.
    pub(super) fn encode(&self) -> Vec<u8> {
        if let Err(why) = self.check() {
            panic!("log volume header {self:?} breaks its rules: {why}");
        }
        if self.version < 4 {
            assert_eq!(
                self.regions,
                Header::packed(
                    self.version,
                    self.volume_bytes,
                    self.geo,
                    self.cache_blocks,
                    self.map_log_blocks,
                    self.pool_pages
                )
                .regions,
                "a version {} header cannot say where its regions moved",
                self.version
            );
        }
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
        if self.version >= 4 {
            let r = &self.regions;
            b[V4_TABLE_AT..V4_TABLE_AT + 8].copy_from_slice(&r.table_at.to_le_bytes());
            b[V4_LAYERS_AT..V4_LAYERS_AT + 8].copy_from_slice(&r.layers_at.to_le_bytes());
            b[V4_HEAD_CAP..V4_HEAD_CAP + 8].copy_from_slice(&r.head_cap.to_le_bytes());
            b[V4_HEAD_RUNS..V4_HEAD_RUNS + 4].copy_from_slice(&(r.head.pairs().len() as u32).to_le_bytes());
            b[V4_POOL_RUNS..V4_POOL_RUNS + 4].copy_from_slice(&(r.pool.pairs().len() as u32).to_le_bytes());
            for (i, &(first, off)) in r.head.pairs().iter().chain(r.pool.pairs()).enumerate() {
                let at = V4_RUNS_AT + 16 * i;
                b[at..at + 8].copy_from_slice(&first.to_le_bytes());
                b[at + 8..at + 16].copy_from_slice(&off.to_le_bytes());
            }
        }
        if self.version >= 5 {
            b[V5_HEAD_BYTES..V5_HEAD_BYTES + 8].copy_from_slice(&self.head_bytes.to_le_bytes());
        }
        if self.version >= 6 {
            let (p, c) = (self.ring.prev, self.ring.cur);
            for (i, f) in [p.base, p.off, p.blocks, c.base, c.off, self.ring.skip_from].iter().enumerate() {
                b[V6_RING + 8 * i..V6_RING + 8 * i + 8].copy_from_slice(&f.to_le_bytes());
            }
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
        let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8"));
        let f = |i: usize| u64_at(16 + 8 * i);
        // Bounds first, so that no size below overflows (a damaged header is refused, never a
        // panic): counts below 2^44, byte sizes and offsets below 2^56.
        if (0..8).any(|i| f(i) >= 1 << 56) || (1..8).any(|i| f(i) >= 1 << 44) {
            return Err("a header field is out of range".into());
        }
        let mut h = Header::packed(
            version,
            f(0),
            Geometry { row_blocks: f(1), batch_rows: f(2), segment_batches: f(3), segments: f(4) },
            f(5),
            f(6),
            if version >= 3 { f(7) } else { 0 },
        );
        if version >= 4 {
            let count = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().expect("4")) as usize;
            let (nh, np) = (count(V4_HEAD_RUNS), count(V4_POOL_RUNS));
            if nh > MAX_RUNS || np > MAX_RUNS {
                return Err(format!("{nh} head and {np} pool page runs (at most {MAX_RUNS} each)"));
            }
            let pairs: Vec<(u64, u64)> = (0..nh + np)
                .map(|i| (u64_at(V4_RUNS_AT + 16 * i), u64_at(V4_RUNS_AT + 16 * i + 8)))
                .collect();
            let offsets = [V4_TABLE_AT, V4_LAYERS_AT].map(u64_at);
            if offsets.iter().chain(pairs.iter().map(|p| &p.1)).any(|&o| o >= 1 << 56)
                || pairs.iter().map(|p| p.0).chain([u64_at(V4_HEAD_CAP)]).any(|n| n >= 1 << 44)
            {
                return Err("a region of the header is out of range".into());
            }
            h.regions = Regions {
                table_at: u64_at(V4_TABLE_AT),
                layers_at: u64_at(V4_LAYERS_AT),
                head_cap: u64_at(V4_HEAD_CAP),
                head: Runs::from_pairs(&pairs[..nh]).map_err(|e| format!("map pages: {e}"))?,
                pool: Runs::from_pairs(&pairs[nh..]).map_err(|e| format!("page pool: {e}"))?,
            };
        }
        if version >= 5 {
            h.head_bytes = u64_at(V5_HEAD_BYTES);
        }
        if version >= 6 {
            let f = |i: usize| u64_at(V6_RING + 8 * i);
            if (0..6).any(|i| f(i) >= 1 << 62) {
                return Err("the cache ring's layout is out of range".into());
            }
            h.ring = RingLayout {
                prev: Epoch { base: f(0), off: f(1), blocks: f(2) },
                cur: Epoch { base: f(3), off: f(4), blocks: h.cache_blocks },
                skip_from: f(5),
            };
        }
        h.check()?;
        Ok(h)
    }

    /// Byte offset and size of the persisted segment table in the metadata part, if it has one.
    pub(super) fn table_region(&self) -> Option<(u64, u64)> {
        (self.version >= 2)
            .then(|| (self.regions.table_at, table::region_bytes(self.geo.segments, self.cache_blocks)))
    }

    /// Bytes of the metadata part (where its last region ends).
    pub(super) fn meta_bytes(&self) -> u64 {
        self.spans().iter().map(|s| s.1).max().expect("the header block")
    }

    pub(super) fn map_layout(&self) -> MapLayout {
        let r = &self.regions;
        let pool = (self.version >= 3).then(|| crate::map::PoolLayout {
            layers_at: r.layers_at,
            pages_at: r.pool.offset(0),
            pages: u32::try_from(self.pool_pages).expect("pool pages fit in 32 bits"),
            runs: (self.version >= 4).then_some(r.pool),
        });
        MapLayout {
            base: BLOCK_BYTES,
            log_blocks: self.map_log_blocks,
            blocks: self.volume_bytes / BLOCK_BYTES,
            pool,
            head: (self.version >= 4).then_some(r.head),
        }
    }
}

pub(super) fn header_crc(b: &[u8]) -> u32 {
    stria_dev::crc::crc32c_parts(&[&b[..12], &b[16..]])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> Header {
        let geo = Geometry { row_blocks: 4, batch_rows: 31, segment_batches: 4, segments: 40 };
        Header::packed(NEW_VERSION, 900 * BLOCK_BYTES, geo, 1024, 1024, 64)
    }

    #[test]
    fn the_origins_own_size_round_trips_in_version_5_and_only_there() {
        let mut h = header();
        assert_eq!((h.version, h.head_size()), (4, 900 * BLOCK_BYTES));
        // A clone grew the map past the origin: version 5 says both sizes.
        h.set_sizes(1000 * BLOCK_BYTES, 900 * BLOCK_BYTES);
        h.regions.head_cap = h.map_pages();
        assert_eq!((h.version, h.volume_bytes, h.head_size()), (5, 1000 * BLOCK_BYTES, 900 * BLOCK_BYTES));
        let b = h.encode();
        assert_eq!(
            u64::from_le_bytes(b[V5_HEAD_BYTES..V5_HEAD_BYTES + 8].try_into().unwrap()),
            900 * BLOCK_BYTES
        );
        assert_eq!(Header::decode(&b), Ok(h));
        // The origin grown to the map's size: version 4 again, the field zero.
        h.set_sizes(1000 * BLOCK_BYTES, 1000 * BLOCK_BYTES);
        assert_eq!((h.version, h.head_bytes), (4, 0));
        let b = h.encode();
        assert!(b[V5_HEAD_BYTES..V5_HEAD_BYTES + 8].iter().all(|&x| x == 0));
        // A version 4 header does not read the field; a version 5 one whose origin is not
        // smaller than its map, or not whole blocks, is refused.
        let mut b4 = b.clone();
        b4[V5_HEAD_BYTES..V5_HEAD_BYTES + 8].copy_from_slice(&(7 * BLOCK_BYTES).to_le_bytes());
        crate::log::fuzzing::seal_header(&mut b4);
        assert_eq!(Header::decode(&b4).map(|h| h.head_size()), Ok(1000 * BLOCK_BYTES));
        for bad in [1000 * BLOCK_BYTES, 2000 * BLOCK_BYTES, 900 * BLOCK_BYTES + 1] {
            let mut b5 = b.clone();
            b5[8..12].copy_from_slice(&5u32.to_le_bytes());
            b5[V5_HEAD_BYTES..V5_HEAD_BYTES + 8].copy_from_slice(&bad.to_le_bytes());
            crate::log::fuzzing::seal_header(&mut b5);
            assert!(Header::decode(&b5).is_err(), "origin size {bad} over a map of {}", 1000 * BLOCK_BYTES);
        }
    }

    #[test]
    fn a_grown_cache_ring_round_trips_in_version_6_and_a_broken_one_is_refused() {
        let mut h = header();
        let old = h.ring;
        // The larger ring's table (room for its owners) where the part ended.
        h.regions.table_at = h.meta_bytes();
        h.cache_blocks = 2048;
        h.ring =
            RingLayout { prev: old.cur, cur: Epoch { base: 3072, off: 1024, blocks: 2048 }, skip_from: 3000 };
        h.fit_version();
        assert_eq!(h.version, 6);
        let b = h.encode();
        assert_eq!(Header::decode(&b), Ok(h));
        // A layout whose new ring does not start on the old ring's first block, or names a
        // size other than the cache's, is refused.
        for (at, value) in [(V6_RING + 24, 3073u64), (V6_RING + 32, 1000), (V6_RING + 40, 3100)] {
            let mut bad = b.clone();
            bad[at..at + 8].copy_from_slice(&value.to_le_bytes());
            crate::log::fuzzing::seal_header(&mut bad);
            assert!(Header::decode(&bad).is_err(), "field at {at} = {value}");
        }
        // Version 5 and below do not read the fields: a header that says 5 has a ring that
        // never grew, which disagrees with a grown cache only through `cache_blocks`.
        let mut v5 = b.clone();
        v5[8..12].copy_from_slice(&5u32.to_le_bytes());
        crate::log::fuzzing::seal_header(&mut v5);
        assert_eq!(Header::decode(&v5).map(|h| h.ring), Ok(RingLayout::fixed(2048)));
        // A ring that never grew keeps version 4.
        let mut plain = header();
        plain.fit_version();
        assert_eq!(plain.version, 4);
    }
}
