//! The flush record (format §2a): the newest pool flush epoch a drive took part in, and the
//! newest epoch known, when it was written, to have completed on every drive in use
//! (docs/design/stale-copies.md).

use uuid::Uuid;

use super::{FormatError, Reader, Writer, crc_of, seal_crc};

const MAGIC: &[u8; 8] = b"STRIA-FE";
/// The record's version: 1, one pool-wide epoch. (A later version may carry an epoch per drive,
/// for flushes that touch only a volume's own drives; a reader refuses a version it does not
/// know, which counts as no record.)
const VERSION: u32 = 1;
/// Byte offset of the record on every drive: block 1, in the gap after superblock copy 0, so a
/// copy made front to back reads it before any data block.
pub const FLUSH_RECORD_OFFSET_BYTES: u64 = 4096;

/// The decoded flush record of one drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlushRecord {
    pub pool_uuid: Uuid,
    pub drive_uuid: Uuid,
    /// The newest pool flush epoch whose flush this drive completed: everything written to it
    /// before that flush started was durable when this value was.
    pub epoch: u64,
    /// The newest epoch that, when this copy was written, every drive in use held durably. A
    /// drive whose `epoch` is below the highest `confirmed` of its pool missed a flush every
    /// drive in use took: it is an old copy.
    pub confirmed: u64,
}

impl FlushRecord {
    /// Encodes into one 4 KiB block.
    pub fn encode(&self) -> Vec<u8> {
        assert!(
            self.confirmed <= self.epoch,
            "flush record confirms epoch {} above its own epoch {}",
            self.confirmed,
            self.epoch
        );
        let mut w = Writer::new(4096);
        w.bytes(MAGIC);
        w.u32(VERSION);
        w.u32(0);
        w.bytes(self.pool_uuid.as_bytes());
        w.bytes(self.drive_uuid.as_bytes());
        w.u64(self.epoch);
        w.u64(self.confirmed);
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
        r.skip(4);
        let record =
            FlushRecord { pool_uuid: r.uuid(), drive_uuid: r.uuid(), epoch: r.u64(), confirmed: r.u64() };
        if record.confirmed > record.epoch {
            return Err(FormatError::BadField("flush record: confirmed epoch above its own"));
        }
        Ok(record)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_round_trips_and_damage_is_seen() {
        let rec =
            FlushRecord { pool_uuid: Uuid::new_v4(), drive_uuid: Uuid::new_v4(), epoch: 42, confirmed: 41 };
        let block = rec.encode();
        assert_eq!(FlushRecord::decode(&block), Ok(rec));
        for byte in [8, 16, 48, 56, 64, 4000, 4093] {
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
    fn a_confirmation_above_the_epoch_is_refused() {
        let rec = FlushRecord { pool_uuid: Uuid::nil(), drive_uuid: Uuid::nil(), epoch: 3, confirmed: 3 };
        let mut block = rec.encode();
        block[56..64].copy_from_slice(&4u64.to_le_bytes());
        seal_crc(&mut block);
        assert!(matches!(FlushRecord::decode(&block), Err(FormatError::BadField(_))));
    }
}
