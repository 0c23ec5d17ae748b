//! Where each region of a drive lives (format §1), computed once from the drive size.

use super::FormatError;

pub(crate) const BLOCK: u64 = stria_dev::BLOCK_BYTES;
const MIB: u64 = 1 << 20;

/// Data blocks covered by one intent bit (4 MiB).
pub const INTENT_REGION_BLOCKS: u64 = 1024;
/// Intent bits per bitmap page (4080 bytes of bits).
pub const INTENT_BITS_PER_PAGE: u64 = 4080 * 8;
/// Where the out bitmap's pages start (format §4a): the gap between the flush record and the
/// first metadata slot.
pub const OUT_OFFSET_BYTES: u64 = 8192;
/// Out bitmap pages that fit the gap (8 KiB .. 1 MiB).
pub const OUT_PAGES_MAX: u64 = (MIB - OUT_OFFSET_BYTES) / BLOCK;
/// Out bits per page (4072 bytes of bits).
pub const OUT_BITS_PER_PAGE: u64 = 4072 * 8;
/// Checksum entries per checksum page.
pub const CSUM_ENTRIES_PER_PAGE: u64 = 1020;
/// Smallest data area a drive may have.
pub const MIN_DATA_BYTES: u64 = 16 * MIB;

/// Byte offsets and sizes of the regions of one drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DriveLayout {
    pub drive_bytes: u64,
    pub metadata_offset_bytes: u64,
    pub metadata_slot_bytes: u64,
    pub intent_offset_bytes: u64,
    pub intent_bytes: u64,
    pub journal_offset_bytes: u64,
    pub journal_bytes: u64,
    pub csum_offset_bytes: u64,
    pub csum_bytes: u64,
    pub data_offset_bytes: u64,
    pub data_bytes: u64,
}

impl DriveLayout {
    /// The layout stria gives a new drive of `drive_bytes`.
    pub fn for_new_drive(drive_bytes: u64) -> Result<DriveLayout, FormatError> {
        let drive_bytes = drive_bytes - drive_bytes % BLOCK;
        let metadata_offset_bytes = MIB;
        let metadata_slot_bytes = MIB;
        // Size the per-block structures for the whole drive: a slight overestimate of the data
        // area, which keeps the computation one pass.
        let max_data_blocks = drive_bytes / BLOCK;
        let intent_regions = max_data_blocks.div_ceil(INTENT_REGION_BLOCKS);
        let intent_bytes = intent_regions.div_ceil(INTENT_BITS_PER_PAGE).max(1) * BLOCK;
        let journal_bytes = if drive_bytes >= 4 << 30 {
            64 * MIB
        } else if drive_bytes >= 1 << 30 {
            16 * MIB
        } else {
            4 * MIB
        };
        let csum_bytes = max_data_blocks.div_ceil(CSUM_ENTRIES_PER_PAGE) * BLOCK;

        let intent_offset_bytes = metadata_offset_bytes + 2 * metadata_slot_bytes;
        let journal_offset_bytes = intent_offset_bytes + intent_bytes;
        let csum_offset_bytes = journal_offset_bytes + journal_bytes;
        let data_offset_bytes = (csum_offset_bytes + csum_bytes).next_multiple_of(MIB);
        let tail = data_offset_bytes + BLOCK;
        let data_bytes = if drive_bytes > tail { (drive_bytes - tail) / BLOCK * BLOCK } else { 0 };
        if data_bytes < MIN_DATA_BYTES {
            return Err(FormatError::DriveTooSmall {
                drive_bytes,
                min_bytes: data_offset_bytes + MIN_DATA_BYTES + BLOCK,
            });
        }
        let layout = DriveLayout {
            drive_bytes,
            metadata_offset_bytes,
            metadata_slot_bytes,
            intent_offset_bytes,
            intent_bytes,
            journal_offset_bytes,
            journal_bytes,
            csum_offset_bytes,
            csum_bytes,
            data_offset_bytes,
            data_bytes,
        };
        layout.validate()?;
        Ok(layout)
    }

    /// Checks the regions are ordered, aligned, non-overlapping and inside the drive: run on
    /// every layout read back from a superblock before any offset from it is used.
    pub fn validate(&self) -> Result<(), FormatError> {
        let regions = [
            (BLOCK, self.metadata_offset_bytes, 2 * self.metadata_slot_bytes),
            (BLOCK, self.intent_offset_bytes, self.intent_bytes),
            (BLOCK, self.journal_offset_bytes, self.journal_bytes),
            (BLOCK, self.csum_offset_bytes, self.csum_bytes),
            (BLOCK, self.data_offset_bytes, self.data_bytes),
        ];
        // Superblock copy 0, then the flush record (§2a).
        let mut end_of_previous = super::flush_record::FLUSH_RECORD_OFFSET_BYTES + BLOCK;
        for (align, offset, len) in regions {
            let end = offset.checked_add(len).ok_or(FormatError::BadLayout("region overflows"))?;
            if !offset.is_multiple_of(align) || !len.is_multiple_of(BLOCK) || offset < end_of_previous {
                return Err(FormatError::BadLayout("regions overlap or are misaligned"));
            }
            end_of_previous = end;
        }
        if end_of_previous + BLOCK > self.drive_bytes {
            return Err(FormatError::BadLayout("regions extend past the drive"));
        }
        if self.journal_bytes < 2 * BLOCK || self.intent_bytes < BLOCK {
            return Err(FormatError::BadLayout("journal or intent bitmap too small"));
        }
        let data_blocks = self.data_blocks();
        if self.csum_bytes / BLOCK * CSUM_ENTRIES_PER_PAGE < data_blocks
            || self.intent_bytes / BLOCK * INTENT_BITS_PER_PAGE * INTENT_REGION_BLOCKS < data_blocks
        {
            return Err(FormatError::BadLayout(
                "checksum table or intent bitmap too small for the data area",
            ));
        }
        Ok(())
    }

    /// Number of 4 KiB blocks in the data area.
    pub fn data_blocks(&self) -> u64 {
        self.data_bytes / BLOCK
    }

    /// Byte offset of the second superblock copy (the last block of the drive).
    pub fn tail_superblock_offset_bytes(&self) -> u64 {
        self.drive_bytes - BLOCK
    }

    /// Byte offset of metadata slot `slot` (0 or 1).
    pub fn metadata_slot_offset_bytes(&self, slot: u64) -> u64 {
        self.metadata_offset_bytes + (slot % 2) * self.metadata_slot_bytes
    }

    /// Number of checksum pages in use for the data area.
    pub fn csum_pages(&self) -> u64 {
        self.data_blocks().div_ceil(CSUM_ENTRIES_PER_PAGE)
    }

    /// Number of intent regions in the data area.
    pub fn intent_regions(&self) -> u64 {
        self.data_blocks().div_ceil(INTENT_REGION_BLOCKS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_for_common_sizes_validate() {
        for gib in [1u64, 2, 4, 64, 1024, 16384] {
            let l = DriveLayout::for_new_drive(gib << 30).unwrap();
            assert!(l.data_bytes > (gib << 30) * 9 / 10 || gib < 4, "{gib} GiB: {l:?}");
            assert_eq!(l.data_offset_bytes % MIB, 0);
            l.validate().unwrap();
        }
    }

    #[test]
    fn tiny_drives_are_refused_with_the_minimum() {
        match DriveLayout::for_new_drive(8 * MIB) {
            Err(FormatError::DriveTooSmall { min_bytes, .. }) => assert!(min_bytes > 16 * MIB),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn corrupted_layouts_are_rejected() {
        let good = DriveLayout::for_new_drive(1 << 30).unwrap();
        let mut bad = good;
        bad.data_offset_bytes = good.csum_offset_bytes;
        assert!(bad.validate().is_err());
        let mut bad = good;
        bad.data_bytes = u64::MAX - 5;
        assert!(bad.validate().is_err());
        let mut bad = good;
        bad.csum_bytes = BLOCK;
        bad.data_offset_bytes = good.data_offset_bytes;
        assert!(bad.validate().is_err());
    }
}
