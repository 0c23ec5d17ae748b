//! The flush record (format §2a): the newest flush epoch a drive took part in, and the epochs of
//! other drives it has seen confirmed (docs/design/stale-copies.md).

use uuid::Uuid;

use super::{FormatError, Reader, Writer, crc_of, seal_crc};

const MAGIC: &[u8; 8] = b"STRIA-FE";
/// The record's version (a reader refuses another, which counts as no record).
const VERSION: u32 = 1;
/// Byte offset of the record on every drive: block 1, in the gap after superblock copy 0, so a
/// copy made front to back reads it before any data block.
pub const FLUSH_RECORD_OFFSET_BYTES: u64 = 4096;
/// Bytes before the witness entries.
const HEADER_BYTES: usize = 64;
/// Bytes of one witness entry: slot (4), epoch (8).
const ENTRY_BYTES: usize = 12;
/// Most witness entries one record holds.
pub const WITNESSES_MAX: usize = (4092 - HEADER_BYTES) / ENTRY_BYTES;

/// The decoded flush record of one drive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlushRecord {
    pub pool_uuid: Uuid,
    pub drive_uuid: Uuid,
    /// This drive's own flush epoch: the number of flushes it took part in after writes.
    /// Everything written to it before its flush number `epoch` started was durable when this
    /// value was.
    pub epoch: u64,
    /// Other drives' epochs, by slot, that were durable on those drives when this copy was
    /// written (each was confirmed after the drive's own record held it). A drive whose own
    /// epoch is below what any other drive of its pool witnessed of it missed a flush it took
    /// part in: it is an old copy. Sorted by slot, each slot once, at most [`WITNESSES_MAX`].
    pub witnessed: Vec<(u32, u64)>,
}

impl FlushRecord {
    /// Encodes into one 4 KiB block.
    pub fn encode(&self) -> Vec<u8> {
        assert!(
            self.witnessed.len() <= WITNESSES_MAX,
            "flush record with {} witnesses, at most {WITNESSES_MAX} fit",
            self.witnessed.len()
        );
        assert!(
            self.witnessed.windows(2).all(|w| w[0].0 < w[1].0),
            "flush record witnesses not sorted by slot, or a slot twice"
        );
        let mut w = Writer::new(4096);
        w.bytes(MAGIC);
        w.u32(VERSION);
        w.u32(u32::try_from(self.witnessed.len()).expect("bounded above"));
        w.bytes(self.pool_uuid.as_bytes());
        w.bytes(self.drive_uuid.as_bytes());
        w.u64(self.epoch);
        w.zeros(HEADER_BYTES - w.position());
        for &(slot, epoch) in &self.witnessed {
            w.u32(slot);
            w.u64(epoch);
        }
        let mut block = w.finish();
        seal_crc(&mut block);
        block
    }

    /// Decodes a block; `NotStria` when there is no record (a pool made before records existed,
    /// or a block never written).
    pub fn decode(block: &[u8]) -> Result<FlushRecord, FormatError> {
        if block.len() != 4096 || &block[..8] != MAGIC {
            return Err(FormatError::NotStria);
        }
        if crc_of(block) != u32::from_le_bytes(block[4092..].try_into().expect("4 bytes")) {
            return Err(FormatError::BadChecksum("flush record"));
        }
        let mut r = Reader::new(&block[8..]);
        let version = r.u32();
        if version != VERSION {
            return Err(FormatError::UnsupportedVersion(version));
        }
        let count = r.u32() as usize;
        if count > WITNESSES_MAX {
            return Err(FormatError::BadField("flush record: witness count"));
        }
        let (pool_uuid, drive_uuid, epoch) = (r.uuid(), r.uuid(), r.u64());
        let mut r = Reader::new(&block[HEADER_BYTES..]);
        let witnessed: Vec<(u32, u64)> = (0..count).map(|_| (r.u32(), r.u64())).collect();
        if !witnessed.windows(2).all(|w| w[0].0 < w[1].0) {
            return Err(FormatError::BadField("flush record: witnesses not sorted by slot"));
        }
        Ok(FlushRecord { pool_uuid, drive_uuid, epoch, witnessed })
    }

    /// What this record witnessed of the drive in `slot` (0: nothing).
    pub fn witnessed(&self, slot: u32) -> u64 {
        self.witnessed.binary_search_by_key(&slot, |w| w.0).map_or(0, |i| self.witnessed[i].1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(witnessed: Vec<(u32, u64)>) -> FlushRecord {
        FlushRecord { pool_uuid: Uuid::new_v4(), drive_uuid: Uuid::new_v4(), epoch: 42, witnessed }
    }

    #[test]
    fn a_record_round_trips_and_damage_is_seen() {
        let rec = record(vec![(0, 7), (3, 41), (9, 2)]);
        let block = rec.encode();
        assert_eq!(FlushRecord::decode(&block), Ok(rec.clone()));
        assert_eq!((rec.witnessed(3), rec.witnessed(4)), (41, 0));
        for byte in [8, 12, 16, 48, 56, 64, 75, 4000, 4093] {
            let mut torn = block.clone();
            torn[byte] ^= 0x10;
            assert_eq!(
                FlushRecord::decode(&torn),
                Err(FormatError::BadChecksum("flush record")),
                "byte {byte}"
            );
        }
        assert_eq!(FlushRecord::decode(&[0u8; 4096]), Err(FormatError::NotStria));
    }

    #[test]
    fn a_full_record_fits_and_a_bad_count_or_order_is_refused() {
        let full = record((0..WITNESSES_MAX as u32).map(|s| (s, u64::from(s) * 3)).collect());
        assert_eq!(FlushRecord::decode(&full.encode()), Ok(full));
        let mut block = record(vec![(1, 1), (2, 2)]).encode();
        block[12..16].copy_from_slice(&(WITNESSES_MAX as u32 + 1).to_le_bytes());
        seal_crc(&mut block);
        assert!(matches!(FlushRecord::decode(&block), Err(FormatError::BadField(_))));
        let mut block = record(vec![(1, 1), (2, 2)]).encode();
        block[76..80].copy_from_slice(&1u32.to_le_bytes()); // the second entry's slot: 1 again
        seal_crc(&mut block);
        assert!(matches!(FlushRecord::decode(&block), Err(FormatError::BadField(_))));
    }
}
