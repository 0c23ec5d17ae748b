//! Layers of a log-structured volume family: the snapshots and clones of docs/design/snapshots.md
//! ("The model: a flat head and before-image layers"). This module holds what is stored and how
//! it is allocated, with no I/O of its own:
//!
//! * [`LayerRecord`]: one layer (the origin's head, a snapshot, a clone head) in the family's
//!   layer table, 128 bytes, [`LAYERS_PER_BLOCK`] to a block, written whole by checkpoints;
//! * [`IndexPage`]: a pool page of [`INDEX_ENTRIES`] pool-page numbers, one format for the three
//!   levels of a snapshot's page table (root -> directory -> table -> the snapshot's map pages);
//! * [`PagePool`]: which pool pages are in use. Not stored: rebuilt at open from the tables of
//!   the live layers; a freed page is reused only after a checkpoint past its release.
//!
//! Byte tables: docs/on-disk-format.md §8.3 (layer table) and §8.4 (page pool).

use stria_dev::BLOCK_USIZE;

/// Bytes of one layer record.
pub const LAYER_RECORD_BYTES: usize = 128;
/// Layer records per 4 KiB block of the layer table.
pub const LAYERS_PER_BLOCK: usize = BLOCK_USIZE / LAYER_RECORD_BYTES;
/// Blocks of the layer table.
pub const LAYER_TABLE_BLOCKS: usize = 8;
/// Most layers a family holds (the origin's head, its snapshots, clones and theirs).
pub const MAX_LAYERS: usize = LAYERS_PER_BLOCK * LAYER_TABLE_BLOCKS;
/// Longest layer name, in bytes.
pub const MAX_NAME_BYTES: usize = 64;
/// Pool-page numbers in one index page.
pub const INDEX_ENTRIES: usize = (BLOCK_USIZE - INDEX_HEADER_BYTES) / 4;

const INDEX_HEADER_BYTES: usize = 32;
const INDEX_MAGIC: u32 = u32::from_le_bytes(*b"SLIX");
const NAME_AT: usize = 48;
const RECORD_CRC_AT: usize = LAYER_RECORD_BYTES - 4;

/// What a layer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerKind {
    /// The origin volume's writable head (layer 1 of a family).
    Head,
    /// A read-only before-image layer of a head.
    Snapshot,
    /// A clone's writable head: its own copied pages over a parent snapshot or frozen layer.
    Clone,
    /// A snapshot of a clone: the clone's pages as they were, read-only (docs/design/snapshots.md,
    /// "Snapshots, rollback and clones of a clone"); the clone goes on as a new layer over it.
    Frozen,
}

impl LayerKind {
    fn code(self) -> u16 {
        match self {
            LayerKind::Head => 1,
            LayerKind::Snapshot => 2,
            LayerKind::Clone => 3,
            LayerKind::Frozen => 4,
        }
    }

    fn from_code(code: u16) -> Option<LayerKind> {
        match code {
            1 => Some(LayerKind::Head),
            2 => Some(LayerKind::Snapshot),
            3 => Some(LayerKind::Clone),
            4 => Some(LayerKind::Frozen),
            _ => None,
        }
    }
}

/// One record of the layer table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerRecord {
    /// 1.. (0 marks an empty record on disk).
    pub id: u16,
    pub kind: LayerKind,
    /// A snapshot's head; a clone's parent snapshot; 0 for the origin's head.
    pub parent: u16,
    /// Deleted by the user, kept while clones read through it.
    pub hidden: bool,
    /// The family's write sequence when the layer was made.
    pub created_seq: u64,
    /// Unix time in milliseconds when the layer was made.
    pub created_ms: u64,
    /// Allocated blocks of the layer's view when it was made (a snapshot's never change).
    pub allocated_blocks: u64,
    /// A snapshot's root index page (a pool page), or 0.
    pub root_page: u32,
    /// First page of a head's or clone's flat map region, in pages of the meta part; 0 for
    /// snapshots.
    pub region_page: u32,
    /// Logical size of a head or clone (a snapshot has its head's size when it was made).
    pub logical_bytes: u64,
    pub name: String,
    /// A head's or clone's rollback to this snapshot began and has not finished (0: none);
    /// open finishes it.
    pub rollback_to: u16,
    /// A frozen layer's clone (the clone it is a snapshot of); 0 for other kinds.
    pub of_clone: u16,
}

impl LayerRecord {
    /// A record for a layer to be made: id, parent, pages and sequence are filled in by whoever
    /// makes it.
    pub fn named(name: &str, kind: LayerKind, logical_bytes: u64) -> LayerRecord {
        LayerRecord {
            id: 0,
            kind,
            parent: 0,
            hidden: false,
            created_seq: 0,
            created_ms: 0,
            allocated_blocks: 0,
            root_page: 0,
            region_page: 0,
            logical_bytes,
            name: name.into(),
            rollback_to: 0,
            of_clone: 0,
        }
    }
}

/// Why a name cannot name a layer (`None` if it can).
pub fn name_problem(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("a name cannot be empty".into());
    }
    if name.len() > MAX_NAME_BYTES {
        return Some(format!("the name is {} bytes long; at most {MAX_NAME_BYTES} are allowed", name.len()));
    }
    if let Some(c) = name.chars().find(|c| matches!(c, '@' | '/') || c.is_control() || c.is_whitespace()) {
        return Some(format!(
            "the name holds {c:?}: '@', '/', spaces and control characters are not allowed"
        ));
    }
    None
}

/// Where a head's pending rollback target is (in what was reserved space before it).
const ROLLBACK_AT: usize = 112;
/// Where a frozen layer's clone is.
const OF_CLONE_AT: usize = 114;

fn record_crc(b: &[u8]) -> u32 {
    stria_dev::crc::crc32c(&b[..RECORD_CRC_AT])
}

impl LayerRecord {
    /// Its 128 bytes. Panics on a name [`name_problem`] refuses (callers check first).
    pub fn encode(&self, out: &mut [u8]) {
        assert!(self.id != 0, "layer id 0 marks an empty record");
        assert!(name_problem(&self.name).is_none(), "layer name {:?} was not checked", self.name);
        let out = &mut out[..LAYER_RECORD_BYTES];
        out.fill(0);
        out[0..2].copy_from_slice(&self.id.to_le_bytes());
        out[2..4].copy_from_slice(&self.kind.code().to_le_bytes());
        out[4..6].copy_from_slice(&self.parent.to_le_bytes());
        out[6..8].copy_from_slice(&u16::from(self.hidden).to_le_bytes());
        out[8..16].copy_from_slice(&self.created_seq.to_le_bytes());
        out[16..24].copy_from_slice(&self.created_ms.to_le_bytes());
        out[24..32].copy_from_slice(&self.allocated_blocks.to_le_bytes());
        out[32..36].copy_from_slice(&self.root_page.to_le_bytes());
        out[36..40].copy_from_slice(&self.region_page.to_le_bytes());
        out[40..48].copy_from_slice(&self.logical_bytes.to_le_bytes());
        out[NAME_AT..NAME_AT + self.name.len()].copy_from_slice(self.name.as_bytes());
        out[ROLLBACK_AT..ROLLBACK_AT + 2].copy_from_slice(&self.rollback_to.to_le_bytes());
        out[OF_CLONE_AT..OF_CLONE_AT + 2].copy_from_slice(&self.of_clone.to_le_bytes());
        let crc = record_crc(out);
        out[RECORD_CRC_AT..].copy_from_slice(&crc.to_le_bytes());
    }

    /// The record in `b`: `Ok(None)` for an empty (all-zero) one, `Err` for a damaged one.
    pub fn decode(b: &[u8]) -> Result<Option<LayerRecord>, String> {
        let b = &b[..LAYER_RECORD_BYTES];
        if b.iter().all(|&x| x == 0) {
            return Ok(None);
        }
        let crc = u32::from_le_bytes(b[RECORD_CRC_AT..].try_into().expect("4 bytes"));
        if crc != record_crc(b) {
            return Err("layer record checksum mismatch".into());
        }
        let u16_at = |at: usize| u16::from_le_bytes(b[at..at + 2].try_into().expect("2 bytes"));
        let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"));
        let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
        let id = u16_at(0);
        let kind = LayerKind::from_code(u16_at(2))
            .ok_or_else(|| format!("layer {id}: unknown kind {}", u16_at(2)))?;
        let name_bytes = &b[NAME_AT..NAME_AT + MAX_NAME_BYTES];
        let len = name_bytes.iter().position(|&x| x == 0).unwrap_or(MAX_NAME_BYTES);
        let name = std::str::from_utf8(&name_bytes[..len])
            .map_err(|_| format!("layer {id}: the name is not UTF-8"))?;
        if id == 0 {
            return Err("a layer record with id 0".into());
        }
        if let Some(why) = name_problem(name) {
            return Err(format!("layer {id}: {why}"));
        }
        Ok(Some(LayerRecord {
            id,
            kind,
            parent: u16_at(4),
            hidden: u16_at(6) & 1 == 1,
            created_seq: u64_at(8),
            created_ms: u64_at(16),
            allocated_blocks: u64_at(24),
            root_page: u32_at(32),
            region_page: u32_at(36),
            logical_bytes: u64_at(40),
            name: name.to_owned(),
            rollback_to: u16_at(ROLLBACK_AT),
            of_clone: u16_at(OF_CLONE_AT),
        }))
    }
}

/// The layer table's blocks for `records` (in the order given; at most [`MAX_LAYERS`]).
pub fn encode_layer_table(records: &[LayerRecord]) -> Vec<u8> {
    assert!(records.len() <= MAX_LAYERS, "{} layers; a family holds at most {MAX_LAYERS}", records.len());
    let mut b = vec![0u8; LAYER_TABLE_BLOCKS * BLOCK_USIZE];
    for (r, out) in records.iter().zip(b.chunks_exact_mut(LAYER_RECORD_BYTES)) {
        r.encode(out);
    }
    b
}

/// The records of a layer table; an error names the first damaged record, a duplicate id, a
/// duplicate name, or a parent that is not in the table.
pub fn decode_layer_table(b: &[u8]) -> Result<Vec<LayerRecord>, String> {
    let mut records: Vec<LayerRecord> = Vec::new();
    for (i, chunk) in b.chunks_exact(LAYER_RECORD_BYTES).take(MAX_LAYERS).enumerate() {
        if let Some(r) = LayerRecord::decode(chunk).map_err(|e| format!("layer table record {i}: {e}"))? {
            if records.iter().any(|o| o.id == r.id) {
                return Err(format!("layer table record {i}: layer id {} appears twice", r.id));
            }
            // Names are unique among the layers shown (a deleted one kept for clones may share
            // its name with a newer one): heads and clones among themselves, a snapshot among
            // its head's, a frozen layer among its clone's.
            let volume = |k: LayerKind| matches!(k, LayerKind::Head | LayerKind::Clone);
            let shown = |o: &LayerRecord| !o.hidden && !r.hidden && o.name == r.name;
            if records.iter().any(|o| shown(o) && volume(o.kind) && volume(r.kind)) {
                return Err(format!("layer table record {i}: volume name {:?} appears twice", r.name));
            }
            if records.iter().any(|o| {
                shown(o)
                    && o.kind == r.kind
                    && ((r.kind == LayerKind::Snapshot && o.parent == r.parent)
                        || (r.kind == LayerKind::Frozen && o.of_clone == r.of_clone))
            }) {
                return Err(format!(
                    "layer table record {i}: snapshot {:?} of layer {} appears twice",
                    r.name, r.parent
                ));
            }
            records.push(r);
        }
    }
    for r in &records {
        if r.parent != 0 && !records.iter().any(|o| o.id == r.parent) {
            return Err(format!(
                "layer {} ({:?}) names parent {}, which is not in the table",
                r.id, r.name, r.parent
            ));
        }
    }
    Ok(records)
}

/// The level of an index page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexLevel {
    /// Entries are the pool pages holding a snapshot's map pages.
    Table,
    /// Entries are table pages.
    Directory,
    /// Entries are directory pages (one root per snapshot).
    Root,
}

impl IndexLevel {
    fn code(self) -> u8 {
        match self {
            IndexLevel::Table => 1,
            IndexLevel::Directory => 2,
            IndexLevel::Root => 3,
        }
    }
}

/// A pool page of [`INDEX_ENTRIES`] pool-page numbers (0: none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexPage {
    pub level: IndexLevel,
    /// The snapshot it belongs to.
    pub layer: u16,
    /// Index (in units of the level below) of the first entry: for a table page the first map
    /// page it covers.
    pub first: u64,
    pub entries: Box<[u32]>,
}

fn index_crc(b: &[u8]) -> u32 {
    stria_dev::crc::crc32c_parts(&[&b[..16], &b[20..BLOCK_USIZE]])
}

impl IndexPage {
    /// An index page with no entries.
    pub fn empty(level: IndexLevel, layer: u16, first: u64) -> IndexPage {
        IndexPage { level, layer, first, entries: vec![0; INDEX_ENTRIES].into_boxed_slice() }
    }

    /// Its 4 KiB.
    pub fn encode(&self, out: &mut [u8]) {
        let out = &mut out[..BLOCK_USIZE];
        out.fill(0);
        out[0..4].copy_from_slice(&INDEX_MAGIC.to_le_bytes());
        out[4..6].copy_from_slice(&self.layer.to_le_bytes());
        out[6] = self.level.code();
        out[8..16].copy_from_slice(&self.first.to_le_bytes());
        for (e, o) in self.entries.iter().zip(out[INDEX_HEADER_BYTES..].chunks_exact_mut(4)) {
            o.copy_from_slice(&e.to_le_bytes());
        }
        let crc = index_crc(out);
        out[16..20].copy_from_slice(&crc.to_le_bytes());
    }

    /// The page in `b` if it is the index page expected there (`level`, `layer`, `first`).
    pub fn decode(b: &[u8], level: IndexLevel, layer: u16, first: u64) -> Result<IndexPage, String> {
        let b = &b[..BLOCK_USIZE];
        let what = || format!("{level:?} page of layer {layer} from index {first}");
        if u32::from_le_bytes(b[0..4].try_into().expect("4 bytes")) != INDEX_MAGIC {
            return Err(format!("{}: bad magic", what()));
        }
        if u32::from_le_bytes(b[16..20].try_into().expect("4 bytes")) != index_crc(b) {
            return Err(format!("{}: checksum mismatch", what()));
        }
        let found_layer = u16::from_le_bytes(b[4..6].try_into().expect("2 bytes"));
        let found_first = u64::from_le_bytes(b[8..16].try_into().expect("8 bytes"));
        if b[6] != level.code() || found_layer != layer || found_first != first {
            return Err(format!(
                "{}: the page holds level {} of layer {found_layer} from index {found_first}",
                what(),
                b[6]
            ));
        }
        let entries = b[INDEX_HEADER_BYTES..]
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect();
        Ok(IndexPage { level, layer, first, entries })
    }
}

/// Which pages of the page pool are in use. Page 0 is never handed out (0 means "none").
#[derive(Debug, Clone)]
pub struct PagePool {
    used: Vec<u64>,
    pages: u32,
    free: u32,
    /// Where the next search starts.
    cursor: u32,
    /// Released pages and the map log position a checkpoint must start past before they are
    /// free again (until then the tables of the last checkpoint may still name them).
    released: Vec<(u64, u32)>,
}

impl PagePool {
    /// A pool of `pages` pages, none in use.
    pub fn new(pages: u32) -> PagePool {
        let mut pool = PagePool {
            used: vec![0; (pages as usize).div_ceil(64)],
            pages,
            free: pages,
            cursor: 1,
            released: Vec::new(),
        };
        if pages > 0 {
            pool.set(0);
        }
        pool
    }

    /// A pool of `pages` pages with `in_use` taken (as read from the tables at open); an error
    /// names a page taken twice or past the pool's end.
    pub fn with_used(pages: u32, in_use: impl IntoIterator<Item = u32>) -> Result<PagePool, String> {
        let mut pool = PagePool::new(pages);
        for p in in_use {
            if p == 0 || p >= pages {
                return Err(format!("pool page {p} is named, but the pool has pages 1..{pages}"));
            }
            if pool.is_used(p) {
                return Err(format!("pool page {p} is named twice"));
            }
            pool.set(p);
        }
        Ok(pool)
    }

    /// Whether page `p` is in use (released ones included until they are free).
    pub fn is_used(&self, p: u32) -> bool {
        p < self.pages && self.used[p as usize / 64] >> (p % 64) & 1 == 1
    }

    /// Whether page `p` was released and waits for a checkpoint.
    pub fn is_released(&self, p: u32) -> bool {
        self.released.iter().any(|&(_, r)| r == p)
    }

    fn set(&mut self, p: u32) {
        self.used[p as usize / 64] |= 1 << (p % 64);
        self.free -= 1;
    }

    /// Pages of the pool (page 0 included).
    pub fn pages(&self) -> u32 {
        self.pages
    }

    /// Pages free now (released ones not included until they are).
    pub fn free(&self) -> u32 {
        self.free
    }

    /// Takes a free page; `None` when there is none (grow the pool).
    pub fn allocate(&mut self) -> Option<u32> {
        if self.free == 0 {
            return None;
        }
        let words = self.used.len() as u32;
        let start = self.cursor / 64;
        for k in 0..=words {
            let w = (start + k) % words;
            let bits = self.used[w as usize];
            if bits == u64::MAX {
                continue;
            }
            let p = w * 64 + (!bits).trailing_zeros();
            if p >= self.pages {
                continue;
            }
            self.set(p);
            self.cursor = p + 1;
            return Some(p);
        }
        unreachable!("{} pages counted free, none found", self.free)
    }

    /// Takes page `page` if it is free (replay naming a page a record made); false if in use.
    pub fn claim(&mut self, page: u32) -> bool {
        assert!(page != 0 && page < self.pages, "pool page {page} is outside the pool");
        if self.is_used(page) {
            return false;
        }
        self.set(page);
        true
    }

    /// Gives `page` back once a checkpoint whose replay starts past log position `after` is
    /// done ([`PagePool::checkpoint_done`]).
    pub fn release(&mut self, page: u32, after: u64) {
        assert!(page != 0 && page < self.pages && self.is_used(page), "pool page {page} is not in use");
        assert!(!self.released.iter().any(|&(_, p)| p == page), "pool page {page} released twice");
        self.released.push((after, page));
    }

    /// A checkpoint whose replay starts at `until` is durable: pages released before it are free.
    pub fn checkpoint_done(&mut self, until: u64) {
        let mut keep = Vec::new();
        for (after, p) in std::mem::take(&mut self.released) {
            if until > after {
                self.used[p as usize / 64] &= !(1 << (p % 64));
                self.free += 1;
                self.cursor = self.cursor.min(p);
            } else {
                keep.push((after, p));
            }
        }
        self.released = keep;
    }

    /// Pages waiting for a checkpoint before they are free.
    pub fn released(&self) -> usize {
        self.released.len()
    }

    /// Adds pages at the end (the meta part grew).
    pub fn grow(&mut self, pages: u32) {
        assert!(pages >= self.pages, "a pool only grows");
        self.used.resize((pages as usize).div_ceil(64), 0);
        self.free += pages - self.pages;
        self.pages = pages;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: u16, kind: LayerKind, parent: u16, name: &str) -> LayerRecord {
        LayerRecord {
            id,
            kind,
            parent,
            hidden: false,
            created_seq: 1_000_000_007 * u64::from(id),
            created_ms: 1_795_000_000_000 + u64::from(id),
            allocated_blocks: 12345,
            root_page: if kind == LayerKind::Snapshot { 40 + u32::from(id) } else { 0 },
            region_page: if kind == LayerKind::Snapshot { 0 } else { 9 },
            logical_bytes: 1 << 40,
            name: name.into(),
            rollback_to: if kind == LayerKind::Head { 7 } else { 0 },
            of_clone: if kind == LayerKind::Frozen { 6 } else { 0 },
        }
    }

    #[test]
    fn layer_records_round_trip_and_damage_is_found() {
        let mut r = record(3, LayerKind::Snapshot, 1, "nightly-2026-11-24");
        r.hidden = true;
        let mut b = [0u8; LAYER_RECORD_BYTES];
        r.encode(&mut b);
        assert_eq!(LayerRecord::decode(&b).unwrap(), Some(r));
        assert_eq!(LayerRecord::decode(&[0u8; LAYER_RECORD_BYTES]).unwrap(), None, "all zeros: empty");
        let long = "x".repeat(MAX_NAME_BYTES);
        let r = record(7, LayerKind::Clone, 3, &long);
        r.encode(&mut b);
        assert_eq!(LayerRecord::decode(&b).unwrap().unwrap().name, long, "a name may fill its field");
        b[20] ^= 4;
        assert!(LayerRecord::decode(&b).unwrap_err().contains("checksum"));
    }

    #[test]
    fn names_with_separators_or_too_long_are_refused() {
        assert!(name_problem("snap-1.a_b").is_none());
        for bad in ["", "a@b", "a/b", "a b", "tab\t", &"y".repeat(MAX_NAME_BYTES + 1)] {
            assert!(name_problem(bad).is_some(), "{bad:?} must be refused");
        }
        assert!(name_problem("é".repeat(32).as_str()).is_none(), "64 bytes of UTF-8 fit");
        assert!(name_problem("é".repeat(33).as_str()).unwrap().contains("66 bytes"));
    }

    #[test]
    fn layer_tables_round_trip_and_refuse_inconsistent_tables() {
        let records = vec![
            record(1, LayerKind::Head, 0, "vol"),
            record(2, LayerKind::Snapshot, 1, "s1"),
            record(5, LayerKind::Snapshot, 1, "s2"),
            record(6, LayerKind::Clone, 2, "vol-clone"),
            record(7, LayerKind::Snapshot, 6, "s1"),
            record(8, LayerKind::Frozen, 2, "s1"),
        ];
        let b = encode_layer_table(&records);
        assert_eq!(b.len(), LAYER_TABLE_BLOCKS * BLOCK_USIZE);
        assert_eq!(decode_layer_table(&b).unwrap(), records, "snapshots of different heads may share a name");
        assert!(decode_layer_table(&vec![0u8; b.len()]).unwrap().is_empty());
        let mut twice = records.clone();
        twice[2].id = 2;
        assert!(decode_layer_table(&encode_layer_table(&twice)).unwrap_err().contains("appears twice"));
        let mut orphan = records.clone();
        orphan[3].parent = 9;
        assert!(decode_layer_table(&encode_layer_table(&orphan)).unwrap_err().contains("not in the table"));
        let mut snap_twice = records.clone();
        snap_twice[2].name = "s1".into();
        assert!(
            decode_layer_table(&encode_layer_table(&snap_twice))
                .unwrap_err()
                .contains("snapshot \"s1\" of layer 1")
        );
        let mut same = records.clone();
        same[3].name = "vol".into();
        assert!(
            decode_layer_table(&encode_layer_table(&same)).unwrap_err().contains("\"vol\" appears twice")
        );
        // A deleted snapshot kept for its clones may share its name with a newer one.
        let mut kept = records.clone();
        kept[1].hidden = true;
        kept[2].name = "s1".into();
        assert_eq!(decode_layer_table(&encode_layer_table(&kept)).unwrap(), kept);
        // Snapshots of one clone (frozen layers) have names of their own.
        let mut frozen_twice = records;
        frozen_twice.push(record(9, LayerKind::Frozen, 8, "s1"));
        assert!(
            decode_layer_table(&encode_layer_table(&frozen_twice)).unwrap_err().contains("appears twice")
        );
        assert_eq!(MAX_LAYERS, 256);
    }

    #[test]
    fn index_pages_round_trip_and_refuse_another_place() {
        let mut page = IndexPage::empty(IndexLevel::Table, 4, 3 * INDEX_ENTRIES as u64);
        page.entries[0] = 17;
        page.entries[INDEX_ENTRIES - 1] = u32::MAX;
        let mut b = vec![0u8; BLOCK_USIZE];
        page.encode(&mut b);
        assert_eq!(IndexPage::decode(&b, IndexLevel::Table, 4, page.first).unwrap(), page);
        assert!(IndexPage::decode(&b, IndexLevel::Directory, 4, page.first).is_err(), "another level");
        assert!(IndexPage::decode(&b, IndexLevel::Table, 5, page.first).is_err(), "another layer's page");
        assert!(IndexPage::decode(&b, IndexLevel::Table, 4, 0).is_err(), "another range");
        assert!(
            IndexPage::decode(&[0u8; BLOCK_USIZE], IndexLevel::Root, 4, 0).unwrap_err().contains("magic")
        );
        b[100] ^= 1;
        assert!(IndexPage::decode(&b, IndexLevel::Table, 4, page.first).unwrap_err().contains("checksum"));
        assert_eq!(INDEX_ENTRIES, 1016);
    }

    #[test]
    fn pool_pages_are_reused_only_after_a_checkpoint_past_their_release() {
        let mut pool = PagePool::new(130);
        assert_eq!(pool.free(), 129, "page 0 is never handed out");
        let taken: Vec<u32> = (0..129).map(|_| pool.allocate().unwrap()).collect();
        assert_eq!(taken, (1..130).collect::<Vec<u32>>());
        assert_eq!(pool.allocate(), None, "full");
        pool.release(77, 10);
        pool.release(5, 12);
        assert_eq!((pool.allocate(), pool.released()), (None, 2), "released pages wait");
        pool.checkpoint_done(10);
        assert_eq!(pool.allocate(), None, "a checkpoint starting at the release position is not past it");
        pool.checkpoint_done(11);
        assert_eq!((pool.allocate(), pool.allocate(), pool.released()), (Some(77), None, 1));
        pool.checkpoint_done(13);
        assert_eq!(pool.allocate(), Some(5));
        pool.grow(200);
        assert_eq!(pool.free(), 70);
        assert_eq!(pool.allocate(), Some(130));
    }

    #[test]
    fn a_pool_rebuilt_from_tables_refuses_pages_named_twice_or_outside() {
        let mut pool = PagePool::with_used(100, [3, 64, 99]).unwrap();
        assert_eq!(pool.free(), 96);
        let got: Vec<u32> = (0..4).map(|_| pool.allocate().unwrap()).collect();
        assert_eq!(got, vec![1, 2, 4, 5]);
        assert!(PagePool::with_used(100, [3, 3]).unwrap_err().contains("twice"));
        assert!(PagePool::with_used(100, [100]).unwrap_err().contains("1..100"));
        assert!(PagePool::with_used(100, [0]).is_err(), "page 0 means none");
    }
}
