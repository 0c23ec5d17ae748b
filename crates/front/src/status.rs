//! Block-status chunking: how much of a range one answer looks at ([`prefix`]), and extents split
//! to the largest a protocol can describe in one entry ([`split`]).
//!
//! A protocol's block-status command (NBD `BLOCK_STATUS`, SCSI GET LBA STATUS) may answer for a
//! prefix of the range asked; the client asks again for the rest. Looking at the whole range
//! every time made a fragmented map cost a quadratic scan (a 1 GiB `qemu-img compare` of a
//! volume rolled back to a snapshot ran for minutes), so an answer starts small and grows only
//! while what it finds is one extent.

use stria_volume::{BlockVolume, Extent, VolumeError};

/// Most bytes one answer looks at (it answers for a prefix of the range).
pub const PREFIX_MAX_BYTES: u64 = 64 << 20;

/// The first look of an answer; it grows eightfold while the answer is one extent.
pub const FIRST_LOOK_BYTES: u64 = 1 << 20;

/// The allocation status of a prefix of `len_bytes` at `offset_bytes` (at most
/// [`PREFIX_MAX_BYTES`]): the first look of [`FIRST_LOOK_BYTES`] that finds more than one
/// extent, or the whole prefix when it is one extent. Covers at least one byte when
/// `len_bytes > 0`.
pub async fn prefix(
    volume: &dyn BlockVolume,
    offset_bytes: u64,
    len_bytes: u64,
) -> Result<Vec<Extent>, VolumeError> {
    let wanted = len_bytes.min(PREFIX_MAX_BYTES);
    let mut len = wanted.min(FIRST_LOOK_BYTES);
    loop {
        let extents = volume.block_status(offset_bytes, len).await?;
        if extents.len() > 1 || len == wanted {
            return Ok(extents);
        }
        len = (len * 8).min(wanted);
    }
}

/// `extents` in order, each longer than `max_len_bytes` cut into runs of at most that many bytes
/// (the last one shorter) with the same status. Extents of no bytes are dropped.
pub fn split(extents: impl IntoIterator<Item = Extent>, max_len_bytes: u64) -> impl Iterator<Item = Extent> {
    assert!(max_len_bytes > 0, "block-status extents split into runs of no bytes would never end");
    extents.into_iter().flat_map(move |e| {
        let runs = e.len_bytes.div_ceil(max_len_bytes);
        (0..runs).map(move |i| Extent {
            len_bytes: (e.len_bytes - i * max_len_bytes).min(max_len_bytes),
            unallocated: e.unallocated,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::MapVolume;

    fn ext(len_bytes: u64, unallocated: bool) -> Extent {
        Extent { len_bytes, unallocated }
    }

    #[test]
    fn long_extents_are_cut_to_the_limit_and_keep_their_status() {
        let cut: Vec<_> = split([ext(10, true), ext(3, false), ext(0, true), ext(8, false)], 4).collect();
        assert_eq!(
            cut,
            [ext(4, true), ext(4, true), ext(2, true), ext(3, false), ext(4, false), ext(4, false)]
        );
        let total: u64 = cut.iter().map(|e| e.len_bytes).sum();
        assert_eq!(total, 21);
    }

    #[tokio::test]
    async fn an_answer_grows_only_while_it_finds_one_extent() {
        // Allocated up to 20 MiB, a hole after: the looks are 1, 8 and 64 MiB; the third finds
        // two extents and is the answer.
        let v = MapVolume::new(1 << 30, &[(0, 20 << 20)]);
        let got = prefix(&v, 0, 1 << 30).await.expect("status");
        assert_eq!(got, [ext(20 << 20, false), ext(44 << 20, true)]);
        assert_eq!(v.looks(), [1 << 20, 8 << 20, 64 << 20]);

        // A fragmented start answers after the first look.
        let v = MapVolume::new(1 << 30, &[(0, 4096), (8192, 4096)]);
        let got = prefix(&v, 0, 1 << 30).await.expect("status");
        assert_eq!(got.len(), 4);
        assert_eq!(v.looks(), [1 << 20]);

        // A short range is looked at once, whole.
        let v = MapVolume::new(1 << 30, &[]);
        assert_eq!(prefix(&v, 4096, 12288).await.expect("status"), [ext(12288, true)]);
        assert_eq!(v.looks(), [12288]);
    }
}
