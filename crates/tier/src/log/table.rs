//! The persisted segment table (docs/design/log-structured-volumes.md, "Step 3a"; byte table in
//! docs/on-disk-format.md §8.2): the live count of every segment, the owners of the cache
//! positions and the next write sequence, written by every map checkpoint so that open does not
//! scan the map.
//!
//! The counts may be too high, never too low (docs/crash-consistency.md, "Map checkpoint and the
//! segment table"): they are a snapshot taken after the checkpoint's pages are durable, and
//! replay adds +1 for each new segment place logged from the checkpoint's position on. The owners include claims whose update never became durable, so open
//! restores them as positions destage checks before trusting.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use parking_lot::Mutex;
use stria_dev::{BLOCK_BYTES, BLOCK_USIZE, IoBytes};

use super::space::Space;
use crate::map::CheckpointTable;
use crate::ring::CacheRing;

const MAGIC: u32 = u32::from_le_bytes(*b"SSTB");
const VERSION: u32 = 1;
const SEGMENT_BYTES: u64 = 8;
const OWNER_BYTES: u64 = 16;

/// What a table holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Table {
    /// The map replay position it belongs to.
    pub stamp: u64,
    pub next_seq: u64,
    /// Live blocks per segment (never below the truth).
    pub live: Vec<u64>,
    /// (cache position, logical block) of every claimed position.
    pub owners: Vec<(u64, u64)>,
}

/// Bytes of the table region for `segments` segments and a cache ring of `ring` blocks.
pub(crate) fn region_bytes(segments: u64, ring: u64) -> u64 {
    BLOCK_BYTES + (segments * SEGMENT_BYTES + ring * OWNER_BYTES).next_multiple_of(BLOCK_BYTES)
}

fn header_crc(b: &[u8]) -> u32 {
    stria_dev::crc::crc32c_parts(&[&b[..44], &b[48..BLOCK_USIZE]])
}

impl Table {
    /// Header block then body, padded to whole blocks.
    pub(super) fn encode(&self) -> Vec<u8> {
        let body_len = self.live.len() as u64 * SEGMENT_BYTES + self.owners.len() as u64 * OWNER_BYTES;
        let mut b = vec![0u8; (BLOCK_BYTES + body_len.next_multiple_of(BLOCK_BYTES)) as usize];
        let mut at = BLOCK_USIZE;
        for &l in &self.live {
            b[at..at + 8].copy_from_slice(&l.to_le_bytes());
            at += 8;
        }
        for &(pos, block) in &self.owners {
            b[at..at + 8].copy_from_slice(&pos.to_le_bytes());
            b[at + 8..at + 16].copy_from_slice(&block.to_le_bytes());
            at += 16;
        }
        let body_crc = stria_dev::crc::crc32c(&b[BLOCK_USIZE..at]);
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&VERSION.to_le_bytes());
        for (i, v) in
            [self.stamp, self.next_seq, self.live.len() as u64, self.owners.len() as u64].iter().enumerate()
        {
            b[8 + 8 * i..16 + 8 * i].copy_from_slice(&v.to_le_bytes());
        }
        b[40..44].copy_from_slice(&body_crc.to_le_bytes());
        let crc = header_crc(&b);
        b[44..48].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// The header's (stamp, next sequence, segments, owners, body CRC), if it is a valid one.
    pub(super) fn decode_header(b: &[u8]) -> Option<(u64, u64, u64, u64, u32)> {
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4"));
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8"));
        (u32_at(0) == MAGIC && u32_at(4) == VERSION && u32_at(44) == header_crc(b))
            .then(|| (u64_at(8), u64_at(16), u64_at(24), u64_at(32), u32_at(40)))
    }

    /// Bytes after the header block that hold `segments` counts and `owners` owners.
    pub(super) fn body_bytes(segments: u64, owners: u64) -> u64 {
        segments * SEGMENT_BYTES + owners * OWNER_BYTES
    }

    /// The table from its header fields and body; `None` if the body's CRC does not hold.
    pub(super) fn decode_body(
        (stamp, next_seq, segments, owners, body_crc): (u64, u64, u64, u64, u32),
        body: &[u8],
    ) -> Option<Table> {
        let len = Self::body_bytes(segments, owners) as usize;
        if body.len() < len || stria_dev::crc::crc32c(&body[..len]) != body_crc {
            return None;
        }
        let u64_at = |i: usize| u64::from_le_bytes(body[i..i + 8].try_into().expect("8"));
        let live = (0..segments as usize).map(|i| u64_at(8 * i)).collect();
        let base = segments as usize * 8;
        let owners =
            (0..owners as usize).map(|i| (u64_at(base + 16 * i), u64_at(base + 16 * i + 8))).collect();
        Some(Table { stamp, next_seq, live, owners })
    }
}

/// Writes the table of a volume with every map checkpoint.
pub(crate) struct Writer {
    /// Byte offset of the region in the metadata part (moves when the volume grows).
    pub at: Arc<AtomicU64>,
    pub space: Arc<Mutex<Space>>,
    pub ring: Arc<CacheRing>,
    pub seq: Arc<AtomicU64>,
    /// The stamp of the last table written: a checkpoint never goes back.
    pub last_stamp: AtomicU64,
}

impl CheckpointTable for Writer {
    fn snapshot(&self, stamp: u64) -> (u64, IoBytes) {
        let last = self.last_stamp.fetch_max(stamp, Relaxed);
        // Checkpoints run one at a time and their replay positions only rise: a lower stamp
        // would be an older checkpoint's table written over a newer one's.
        assert!(stamp >= last, "segment table: a checkpoint at replay position {stamp} after one at {last}");
        let table = Table {
            stamp,
            next_seq: self.seq.load(Relaxed),
            live: self.space.lock().live_counts(),
            owners: self.ring.owners(),
        };
        // One owner per position (the ring gives them oldest first).
        assert!(
            table.owners.windows(2).all(|w| w[0].0 < w[1].0),
            "segment table: cache positions out of order or named twice"
        );
        (self.at.load(Relaxed), IoBytes::copy_from(&table.encode()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_round_trips_and_damage_is_seen() {
        let t = Table { stamp: 77, next_seq: 9, live: vec![3, 0, 510], owners: vec![(1000, 5), (1003, 9)] };
        let b = t.encode();
        assert_eq!(b.len(), 2 * BLOCK_USIZE);
        let h = Table::decode_header(&b[..BLOCK_USIZE]).expect("valid header");
        assert_eq!(Table::decode_body(h, &b[BLOCK_USIZE..]), Some(t.clone()));
        let mut torn = b.clone();
        torn[BLOCK_USIZE + 8] ^= 1;
        assert_eq!(Table::decode_body(h, &torn[BLOCK_USIZE..]), None, "a damaged body is not used");
        let mut bad = b;
        bad[9] ^= 1;
        assert_eq!(Table::decode_header(&bad[..BLOCK_USIZE]), None, "a damaged header is not used");
        assert_eq!(Table::decode_header(&[0u8; BLOCK_USIZE]), None, "a stale (zeroed) table is not used");
        assert!(region_bytes(3, 2) >= 2 * BLOCK_BYTES);
    }
}
