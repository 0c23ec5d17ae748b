//! What every implementation of [`BlockVolume::compare_and_write`](crate::BlockVolume) shares:
//! its limits, the checks of its arguments, and the comparison, so that each kind of volume
//! refuses and reports alike.

use crate::error::VolumeError;

/// Offsets and lengths of a compare and write are multiples of this: whole sectors of 512 bytes.
/// SCSI's COMPARE AND WRITE counts whole logical blocks of the size a target exports; the
/// smallest is 512 bytes (512e exports, on which VMware's ATS compares one sector), so the
/// contract takes sectors and a target exporting 4 KiB logical blocks only ever sends whole
/// blocks. Volumes store whole 4 KiB blocks: a compare and write of part of one reads, compares
/// and merges the whole block under the same lock.
pub const COMPARE_AND_WRITE_ALIGN_BYTES: u64 = 512;

/// The longest compare and write: 1 MiB. A SCSI target reports the smaller of 255 logical blocks
/// (its CDB's NUMBER OF LOGICAL BLOCKS is one byte) and this, in its logical blocks, as MAXIMUM
/// COMPARE AND WRITE LENGTH (Block Limits VPD page). VMware's ATS compares a single block; the
/// bound keeps short what a compare and write holds locked.
pub const COMPARE_AND_WRITE_MAX_BYTES: u64 = 1 << 20;

/// `InvalidRequest` unless `compare` and `write` are one length, whole sectors at a sector
/// offset ([`COMPARE_AND_WRITE_ALIGN_BYTES`]) and at most [`COMPARE_AND_WRITE_MAX_BYTES`].
/// Implementations call it first, before the range check, so that a request of the wrong shape
/// is refused alike on every kind of volume whatever it holds.
pub fn check_compare_and_write(offset_bytes: u64, compare: &[u8], write: &[u8]) -> Result<(), VolumeError> {
    let len_bytes = write.len() as u64;
    let refuse = |why: String| Err(VolumeError::InvalidRequest { offset_bytes, len_bytes, why });
    if compare.len() != write.len() {
        return refuse(format!(
            "compare and write: {} bytes to compare but {} to write (they must be one length)",
            compare.len(),
            write.len()
        ));
    }
    if !offset_bytes.is_multiple_of(COMPARE_AND_WRITE_ALIGN_BYTES)
        || !len_bytes.is_multiple_of(COMPARE_AND_WRITE_ALIGN_BYTES)
    {
        return refuse(format!(
            "compare and write takes whole sectors of {COMPARE_AND_WRITE_ALIGN_BYTES} bytes at a sector offset"
        ));
    }
    if len_bytes > COMPARE_AND_WRITE_MAX_BYTES {
        return refuse(format!("compare and write takes at most {COMPARE_AND_WRITE_MAX_BYTES} bytes"));
    }
    Ok(())
}

/// `Ok` when `found` (read from volume `volume` at `offset_bytes`) equals `compare`, else
/// [`VolumeError::Miscompare`] naming the first byte that differs.
pub fn check_compare(
    volume: &str,
    offset_bytes: u64,
    compare: &[u8],
    found: &[u8],
) -> Result<(), VolumeError> {
    assert_eq!(
        compare.len(),
        found.len(),
        "invariant: a compare and write compares with exactly the bytes of its range"
    );
    if compare == found {
        return Ok(());
    }
    let first = compare.iter().zip(found).position(|(a, b)| a != b).expect("the slices differ");
    Err(VolumeError::Miscompare {
        volume: volume.to_string(),
        offset_bytes,
        len_bytes: compare.len() as u64,
        miscompare_offset_bytes: first as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    fn kind(r: Result<(), VolumeError>) -> Option<ErrorKind> {
        r.err().map(|e| e.kind())
    }

    #[test]
    fn the_shape_is_checked() {
        let s = vec![0u8; 512];
        let b = vec![0u8; 4096];
        let max_len = usize::try_from(COMPARE_AND_WRITE_MAX_BYTES).expect("1 MiB fits");
        let max = vec![0u8; max_len];
        let over = vec![0u8; max_len + 512];
        for (o, c, w) in [(0, &s, &s), (512, &s, &s), (4096, &b, &b), (1 << 40, &max, &max)] {
            assert_eq!(kind(check_compare_and_write(o, c, w)), None, "{o} +{}", c.len());
        }
        assert_eq!(kind(check_compare_and_write(7, &[], &[])), Some(ErrorKind::InvalidInput));
        assert_eq!(kind(check_compare_and_write(0, &[], &[])), None, "an empty request at a sector");
        for (o, c, w) in [(0, &s, &b), (1, &s, &s), (256, &b, &b), (0, &over, &over)] {
            let e = check_compare_and_write(o, c, w).expect_err("refused");
            assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
        }
        let odd = vec![0u8; 1000];
        let e = check_compare_and_write(0, &odd, &odd).expect_err("not whole sectors");
        assert_eq!(
            e.to_string(),
            "invalid request at offset 0 (+1000 bytes): compare and write takes whole sectors of 512 bytes at a sector offset"
        );
    }

    #[test]
    fn a_miscompare_names_the_first_byte_that_differs() {
        let a = vec![5u8; 1024];
        assert!(check_compare("v", 512, &a, &a).is_ok());
        for at in [0, 1, 511, 1023] {
            let mut b = a.clone();
            b[at] = 6;
            if at < 1023 {
                b[1023] = 7;
            }
            match check_compare("v", 512, &a, &b) {
                Err(VolumeError::Miscompare { volume, offset_bytes, len_bytes, miscompare_offset_bytes }) => {
                    assert_eq!((volume.as_str(), offset_bytes, len_bytes), ("v", 512, 1024));
                    assert_eq!(miscompare_offset_bytes, at as u64);
                }
                other => panic!("{at}: {other:?}"),
            }
        }
        let e = check_compare("v", 0, &a, &[0; 1024]).expect_err("differs");
        assert_eq!(e.kind(), ErrorKind::Miscompare);
    }
}
