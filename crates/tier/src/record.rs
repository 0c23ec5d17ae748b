//! The metadata volume's format (docs/tiering.md "Metadata (format)"): a header page and one
//! record page per blockset.

/// Bytes of a metadata page (header or record); part of the on-disk format.
pub const PAGE_BYTES: usize = 4096;
// Each page is written and read as one block of the metadata volume: another block size would
// need a format change.
const _: () = assert!(PAGE_BYTES == stria_dev::BLOCK_USIZE, "a metadata page is one block");
/// Entries a record can hold: blockset bytes / 4096 may not exceed this.
pub const MAX_BLOCKS_PER_BLOCKSET: usize = (PAGE_BYTES - 32 - 4) / 12;

const HEADER_MAGIC: &[u8; 8] = b"STRIA-TM";
const RECORD_MAGIC: &[u8; 8] = b"STRIA-TR";
const FORMAT_VERSION: u32 = 1;

/// `position` of a block whose data is in the capacity tier.
pub const CLEAN: u64 = u64::MAX;
/// `position` of a block zeroed in the cache (no data anywhere; reads as zeros).
pub const ZEROED: u64 = u64::MAX - 1;
/// `crc` of a block that reads as zeros without being stored.
pub const ZERO_CRC: u32 = 0;

/// Where one block of a blockset lives and its checksum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// Cache log position, or [`CLEAN`] / [`ZEROED`].
    pub position: u64,
    /// CRC32C of the block (0 remapped to 1), or [`ZERO_CRC`] for an all-zero block never stored.
    pub crc: u32,
}

impl Entry {
    /// A block never written: clean, reads as zeros.
    pub const EMPTY: Entry = Entry { position: CLEAN, crc: ZERO_CRC };

    /// True when the data is in the cache log (not yet destaged).
    pub fn in_cache(&self) -> bool {
        self.position < ZEROED
    }

    /// True when the capacity tier does not hold the block's current contents.
    pub fn dirty(&self) -> bool {
        self.position != CLEAN
    }
}

/// The stored checksum of a 4 KiB block (0 is reserved for "zeros, not stored").
pub fn block_crc(block: &[u8]) -> u32 {
    match crc32c::crc32c(block) {
        0 => 1,
        c => c,
    }
}

/// One blockset's record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The client owning the blockset's cached data (0 = this daemon).
    pub owner: u32,
    pub generation: u64,
    pub entries: Vec<Entry>,
}

impl Record {
    /// An empty record of `blocks` entries.
    pub fn empty(blocks: usize) -> Record {
        Record { owner: 0, generation: 0, entries: vec![Entry::EMPTY; blocks] }
    }

    /// Encodes into one page.
    ///
    /// Stops the process rather than write a record that breaks the rules reads and recovery
    /// rely on: no more entries than a page holds, no cache position claimed by two blocks (one
    /// of them would read the other's data), no cached block without its checksum.
    pub fn encode(&self, page: &mut [u8]) {
        assert_eq!(page.len(), PAGE_BYTES, "a record is one metadata page");
        assert!(
            self.entries.len() <= MAX_BLOCKS_PER_BLOCKSET,
            "record of {} entries; a page holds {MAX_BLOCKS_PER_BLOCKSET}",
            self.entries.len()
        );
        if let Some(pos) = claimed_twice(&self.entries) {
            panic!("record (generation {}): cache position {pos} claimed by two blocks", self.generation);
        }
        if let Some(i) = self.entries.iter().position(|e| e.in_cache() && e.crc == ZERO_CRC) {
            panic!(
                "record (generation {}): cached block {i} at position {} has no checksum",
                self.generation, self.entries[i].position
            );
        }
        page.fill(0);
        page[..8].copy_from_slice(RECORD_MAGIC);
        page[8..12].copy_from_slice(&self.owner.to_le_bytes());
        page[16..24].copy_from_slice(&self.generation.to_le_bytes());
        page[24..28].copy_from_slice(&u32::try_from(self.entries.len()).expect("bounded").to_le_bytes());
        for (i, e) in self.entries.iter().enumerate() {
            let at = 32 + 12 * i;
            page[at..at + 8].copy_from_slice(&e.position.to_le_bytes());
            page[at + 8..at + 12].copy_from_slice(&e.crc.to_le_bytes());
        }
        let crc = crc32c::crc32c(&page[..PAGE_BYTES - 4]);
        page[PAGE_BYTES - 4..].copy_from_slice(&crc.to_le_bytes());
    }

    /// Decodes a page of a blockset of `blocks` blocks. An all-zero page is an empty record.
    pub fn decode(page: &[u8], blocks: usize) -> Result<Record, String> {
        if page.len() != PAGE_BYTES {
            return Err("record page has the wrong size".into());
        }
        if page.iter().all(|&b| b == 0) {
            return Ok(Record::empty(blocks));
        }
        if &page[..8] != RECORD_MAGIC {
            return Err("record page has no record magic".into());
        }
        let stored = u32::from_le_bytes(page[PAGE_BYTES - 4..].try_into().expect("4 bytes"));
        if crc32c::crc32c(&page[..PAGE_BYTES - 4]) != stored {
            return Err("record page checksum mismatch".into());
        }
        let n = u32::from_le_bytes(page[24..28].try_into().expect("4 bytes")) as usize;
        if n != blocks {
            return Err(format!("record has {n} entries, the volume's blocksets have {blocks}"));
        }
        if n > MAX_BLOCKS_PER_BLOCKSET {
            return Err(format!("record has {n} entries; a page holds {MAX_BLOCKS_PER_BLOCKSET}"));
        }
        let entries: Vec<Entry> = (0..n)
            .map(|i| {
                let at = 32 + 12 * i;
                Entry {
                    position: u64::from_le_bytes(page[at..at + 8].try_into().expect("8 bytes")),
                    crc: u32::from_le_bytes(page[at + 8..at + 12].try_into().expect("4 bytes")),
                }
            })
            .collect();
        if let Some(pos) = claimed_twice(&entries) {
            return Err(format!("record claims cache position {pos} for two blocks"));
        }
        Ok(Record {
            owner: u32::from_le_bytes(page[8..12].try_into().expect("4 bytes")),
            generation: u64::from_le_bytes(page[16..24].try_into().expect("8 bytes")),
            entries,
        })
    }
}

/// A cache position two entries of one record point to, if any.
fn claimed_twice(entries: &[Entry]) -> Option<u64> {
    let mut cached: Vec<u64> = entries.iter().filter(|e| e.in_cache()).map(|e| e.position).collect();
    cached.sort_unstable();
    cached.windows(2).find(|w| w[0] == w[1]).map(|w| w[0])
}

/// The metadata volume's header page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub blockset_bytes: u64,
    pub blocksets: u64,
    pub cache_blocks: u64,
    pub volume_bytes: u64,
}

impl Header {
    /// Encodes into one page.
    pub fn encode(&self) -> Vec<u8> {
        let mut page = vec![0u8; PAGE_BYTES];
        page[..8].copy_from_slice(HEADER_MAGIC);
        page[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        for (i, v) in
            [self.blockset_bytes, self.blocksets, self.cache_blocks, self.volume_bytes].iter().enumerate()
        {
            page[16 + 8 * i..24 + 8 * i].copy_from_slice(&v.to_le_bytes());
        }
        let crc = crc32c::crc32c(&page[..PAGE_BYTES - 4]);
        page[PAGE_BYTES - 4..].copy_from_slice(&crc.to_le_bytes());
        page
    }

    /// Decodes and checks a header page.
    pub fn decode(page: &[u8]) -> Result<Header, String> {
        if page.len() != PAGE_BYTES || &page[..8] != HEADER_MAGIC {
            return Err("not a stria tiered-volume metadata header".into());
        }
        let stored = u32::from_le_bytes(page[PAGE_BYTES - 4..].try_into().expect("4 bytes"));
        if crc32c::crc32c(&page[..PAGE_BYTES - 4]) != stored {
            return Err("metadata header checksum mismatch".into());
        }
        let version = u32::from_le_bytes(page[8..12].try_into().expect("4 bytes"));
        if version != FORMAT_VERSION {
            return Err(format!("unsupported tiered metadata version {version}"));
        }
        let v = |i: usize| u64::from_le_bytes(page[16 + 8 * i..24 + 8 * i].try_into().expect("8 bytes"));
        Ok(Header { blockset_bytes: v(0), blocksets: v(1), cache_blocks: v(2), volume_bytes: v(3) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_detect_damage() {
        let mut r = Record::empty(128);
        r.owner = 3;
        r.generation = 77;
        r.entries[5] = Entry { position: 12345, crc: 99 };
        r.entries[127] = Entry { position: ZEROED, crc: ZERO_CRC };
        let mut page = vec![0u8; PAGE_BYTES];
        r.encode(&mut page);
        assert_eq!(Record::decode(&page, 128).unwrap(), r);
        for at in [0, 9, 20, 40, 1000, 4095] {
            let mut bad = page.clone();
            bad[at] ^= 0x40;
            assert!(Record::decode(&bad, 128).is_err(), "flip at {at}");
        }
        assert!(Record::decode(&page, 64).is_err(), "shape is checked");
        assert_eq!(Record::decode(&[0u8; PAGE_BYTES], 128).unwrap(), Record::empty(128));
    }

    #[test]
    #[should_panic(expected = "cache position 7 claimed by two blocks")]
    fn a_record_pointing_two_blocks_at_one_position_is_never_written() {
        let mut r = Record::empty(8);
        r.entries[1] = Entry { position: 7, crc: 5 };
        r.entries[4] = Entry { position: 7, crc: 6 };
        r.encode(&mut vec![0u8; PAGE_BYTES]);
    }

    #[test]
    fn a_record_pointing_two_blocks_at_one_position_is_refused() {
        let mut r = Record::empty(8);
        r.entries[1] = Entry { position: 7, crc: 5 };
        let mut page = vec![0u8; PAGE_BYTES];
        r.encode(&mut page);
        // The same entry again at index 4, with the page checksum redone.
        page.copy_within(32 + 12..32 + 24, 32 + 12 * 4);
        let crc = crc32c::crc32c(&page[..PAGE_BYTES - 4]);
        page[PAGE_BYTES - 4..].copy_from_slice(&crc.to_le_bytes());
        let err = Record::decode(&page, 8).unwrap_err();
        assert!(err.contains("position 7 for two blocks"), "{err}");
        // CLEAN and ZEROED are states, not positions: any number of blocks may have them.
        let mut r = Record::empty(8);
        r.entries[2] = Entry { position: ZEROED, crc: ZERO_CRC };
        r.entries[3] = Entry { position: ZEROED, crc: ZERO_CRC };
        r.encode(&mut page);
        assert_eq!(Record::decode(&page, 8).unwrap(), r);
    }

    #[test]
    fn headers_round_trip() {
        let h = Header { blockset_bytes: 512 << 10, blocksets: 8, cache_blocks: 1000, volume_bytes: 4 << 20 };
        assert_eq!(Header::decode(&h.encode()).unwrap(), h);
        assert!(Header::decode(&[0u8; PAGE_BYTES]).is_err());
    }

    #[test]
    fn entry_states() {
        assert!(!Entry::EMPTY.dirty() && !Entry::EMPTY.in_cache());
        assert!(Entry { position: ZEROED, crc: 0 }.dirty());
        assert!(Entry { position: 7, crc: 1 }.in_cache());
        assert_ne!(block_crc(&[0u8; 4096]), ZERO_CRC);
    }
}
