//! The drive superblock (format §2): who this drive is and where its regions are.

use uuid::Uuid;

use super::layout::DriveLayout;
use super::{FormatError, Reader, Writer, crc_of, seal_crc};
use crate::DriveClass;

const MAGIC: &[u8; 8] = b"STRIA-SB";
/// The on-disk format this build writes and opens. Format 1 (before log-structured tiered
/// volumes) has the same superblock bytes; its pools are refused at open (docs/on-disk-format.md).
pub const FORMAT_VERSION: u32 = 2;
/// The oldest format whose superblock still decodes (so its drives are recognised, named and
/// never formatted over, though their pools are not opened).
const OLDEST_DECODED: u32 = 1;
const LABEL_BYTES: usize = 64;

/// The decoded superblock of one drive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    pub pool_uuid: Uuid,
    pub drive_uuid: Uuid,
    pub slot: u32,
    pub class: DriveClass,
    pub generation: u64,
    pub layout: DriveLayout,
    pub created_unix_secs: u64,
    /// Failure-domain label; empty means the drive is its own domain.
    pub domain: String,
    pub pool_name: String,
    /// The newest metadata generation known, when this copy was written, to have reached every
    /// drive active in it (0: unknown, as on pools made before this field existed). A drive whose
    /// `generation` is below the highest `committed_generation` of its pool missed a commit
    /// every active drive took: it is an old copy (restored, swapped back) and is not trusted.
    pub committed_generation: u64,
    /// The format version the superblock was read with ([`FORMAT_VERSION`] for new ones; the
    /// encoder always writes [`FORMAT_VERSION`]).
    pub format_version: u32,
}

impl Superblock {
    /// Encodes into one 4 KiB block.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new(4096);
        w.bytes(MAGIC);
        w.u32(FORMAT_VERSION);
        w.u32(0);
        w.bytes(self.pool_uuid.as_bytes());
        w.bytes(self.drive_uuid.as_bytes());
        w.u32(self.slot);
        w.u8(match self.class {
            DriveClass::Fast => 0,
            DriveClass::Capacity => 1,
        });
        w.zeros(3);
        w.u64(self.generation);
        let l = &self.layout;
        for v in [
            l.drive_bytes,
            l.metadata_offset_bytes,
            l.metadata_slot_bytes,
            l.intent_offset_bytes,
            l.intent_bytes,
            l.journal_offset_bytes,
            l.journal_bytes,
            l.csum_offset_bytes,
            l.csum_bytes,
            l.data_offset_bytes,
            l.data_bytes,
        ] {
            w.u64(v);
        }
        w.u64(self.created_unix_secs);
        w.label(&self.domain, LABEL_BYTES);
        w.label(&self.pool_name, LABEL_BYTES);
        w.u64(self.committed_generation);
        let mut block = w.finish();
        seal_crc(&mut block);
        block
    }

    /// Decodes and validates one 4 KiB block.
    pub fn decode(block: &[u8]) -> Result<Superblock, FormatError> {
        if block.len() != 4096 || &block[..8] != MAGIC {
            return Err(FormatError::NotStria);
        }
        if crc_of(block) != u32::from_le_bytes(block[4092..].try_into().expect("4 bytes")) {
            return Err(FormatError::BadChecksum("superblock"));
        }
        let mut r = Reader::new(&block[8..]);
        let version = r.u32();
        if !(OLDEST_DECODED..=FORMAT_VERSION).contains(&version) {
            return Err(FormatError::UnsupportedVersion(version));
        }
        let _flags = r.u32();
        let pool_uuid = r.uuid();
        let drive_uuid = r.uuid();
        let slot = r.u32();
        let class = match r.u8() {
            0 => DriveClass::Fast,
            1 => DriveClass::Capacity,
            _ => return Err(FormatError::BadField("drive class")),
        };
        r.skip(3);
        let generation = r.u64();
        let mut v = [0u64; 11];
        for x in &mut v {
            *x = r.u64();
        }
        let layout = DriveLayout {
            drive_bytes: v[0],
            metadata_offset_bytes: v[1],
            metadata_slot_bytes: v[2],
            intent_offset_bytes: v[3],
            intent_bytes: v[4],
            journal_offset_bytes: v[5],
            journal_bytes: v[6],
            csum_offset_bytes: v[7],
            csum_bytes: v[8],
            data_offset_bytes: v[9],
            data_bytes: v[10],
        };
        layout.validate()?;
        let created_unix_secs = r.u64();
        let domain = r.label(LABEL_BYTES)?;
        let pool_name = r.label(LABEL_BYTES)?;
        let committed_generation = r.u64();
        if committed_generation > generation {
            return Err(FormatError::BadField("committed generation above the generation"));
        }
        Ok(Superblock {
            pool_uuid,
            drive_uuid,
            slot,
            class,
            generation,
            layout,
            created_unix_secs,
            domain,
            pool_name,
            committed_generation,
            format_version: version,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Superblock {
        Superblock {
            pool_uuid: Uuid::from_u128(1),
            drive_uuid: Uuid::from_u128(2),
            slot: 7,
            class: DriveClass::Capacity,
            generation: 42,
            layout: DriveLayout::for_new_drive(1 << 30).unwrap(),
            created_unix_secs: 1_700_000_000,
            domain: "rack-3".into(),
            pool_name: "tank".into(),
            committed_generation: 0,
            format_version: FORMAT_VERSION,
        }
    }

    #[test]
    fn a_format_1_superblock_decodes_with_its_version_and_a_newer_one_does_not() {
        let mut block = sample().encode();
        for (version, decodes) in
            [(1u32, true), (FORMAT_VERSION, true), (FORMAT_VERSION + 1, false), (0, false)]
        {
            block[8..12].copy_from_slice(&version.to_le_bytes());
            seal_crc(&mut block);
            match Superblock::decode(&block) {
                Ok(sb) => assert!(decodes && sb.format_version == version, "version {version}"),
                Err(e) => {
                    assert!(!decodes && matches!(e, FormatError::UnsupportedVersion(v) if v == version))
                }
            }
        }
    }

    #[test]
    fn round_trips() {
        let sb = sample();
        let block = sb.encode();
        assert_eq!(block.len(), 4096);
        assert_eq!(Superblock::decode(&block).unwrap(), sb);
    }

    #[test]
    fn any_flipped_bit_is_detected() {
        let block = sample().encode();
        for byte in [0usize, 9, 20, 52, 60, 100, 170, 300, 4000, 4093] {
            let mut bad = block.clone();
            bad[byte] ^= 0x10;
            assert!(Superblock::decode(&bad).is_err(), "flip at {byte} not detected");
        }
    }

    #[test]
    fn foreign_bytes_are_not_stria() {
        assert!(matches!(Superblock::decode(&[0u8; 4096]), Err(FormatError::NotStria)));
    }
}
