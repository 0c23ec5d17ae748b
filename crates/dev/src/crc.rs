//! The checksum of one block: what a drive's checksum table (stria-engine) and a log volume's
//! map entries and segment summaries (stria-tier) store. One function, so the two agree and
//! both get the fast one.

use crate::BLOCK_USIZE;

/// The stored checksum of one 4 KiB block: its CRC32C (Castagnoli, iSCSI's), with 0 remapped
/// to 1 so that 0 can mean "unwritten" (a drive's checksum table) or "no data" (a map entry).
/// Stored on disk by both, so the value for given bytes never changes.
///
/// Computed with `crc-fast` (VPCLMULQDQ folding on CPUs with AVX-512, ~110 ns per 4 KiB block on
/// Zen 4 against ~230 ns for the SSE4.2 `crc32c` crate; `target/release/stria-bench-engine`
/// prints both). Every block read from a drive goes through here, so its speed is a large part
/// of the read path.
pub fn block_crc(block: &[u8]) -> u32 {
    assert_eq!(block.len(), BLOCK_USIZE, "a block checksum covers exactly one block");
    match crc_fast::crc32_iscsi(block) {
        0 => 1,
        crc => crc,
    }
}

/// The plain CRC32C (Castagnoli) of any bytes: what headers of stria's wire frames carry.
pub fn crc32c(bytes: &[u8]) -> u32 {
    crc_fast::crc32_iscsi(bytes)
}

/// The CRC32C of the concatenation of `parts`, without joining them: for structures whose
/// checksum covers their bytes around the field that stores it.
pub fn crc32c_parts(parts: &[&[u8]]) -> u32 {
    let mut digest = crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi);
    for part in parts {
        digest.update(part);
    }
    u32::try_from(digest.finalize()).expect("a CRC32 fits 32 bits")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_checksum_as_their_concatenation() {
        let bytes: Vec<u8> = (0..5000u32).map(|i| (i * 7 + i / 3).to_le_bytes()[0]).collect();
        for cut in [0, 1, 4, 8, 4091, 5000] {
            let (a, b) = bytes.split_at(cut);
            assert_eq!(crc32c_parts(&[a, b]), crc32c(&bytes), "cut at {cut}");
        }
        assert_eq!(crc32c_parts(&[b"1234", b"", b"56789"]), 0xE306_9283);
    }

    #[test]
    fn block_crc_is_crc32c_with_zero_remapped() {
        // CRC32C("123456789") = 0xE3069283, the standard check value.
        assert_eq!(crc_fast::crc32_iscsi(b"123456789"), 0xE306_9283);
        let zeros = [0u8; BLOCK_USIZE];
        assert_eq!(block_crc(&zeros), crc_fast::crc32_iscsi(&zeros).max(1));
        assert_ne!(block_crc(&zeros), 0);
    }
}
