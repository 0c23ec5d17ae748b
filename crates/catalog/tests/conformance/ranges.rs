//! Contract, "Ranges" and "Size": a call whose `offset + len` overflows or passes the end fails
//! with `OutOfRange` and changes nothing; `len == 0` only checks the range (`read` returns an
//! empty buffer); the size is whole blocks. Also `info()`: the read-only flag and a preferred I/O
//! size of whole blocks.

use stria_dev::{BLOCK_BYTES, IoBytes};
use stria_engine::{Durability, ErrorKind, Zeroing};

use super::{Subject, Wrap, every_kind, expect_kind};

pub async fn clause(kind: super::Kind, wrap: Wrap) {
    let s = Subject::new(kind, 11, wrap).await;
    let size = s.size();
    let v = &s.vol;
    assert!(size.is_multiple_of(BLOCK_BYTES), "{kind:?}: size {size} is whole blocks");
    let info = v.info();
    assert_eq!(info.read_only, kind.read_only(), "{kind:?}: info().read_only");
    assert!(
        info.preferred_block_bytes > 0 && info.preferred_block_bytes.is_multiple_of(BLOCK_BYTES),
        "{kind:?}: preferred_block_bytes {} is whole blocks",
        info.preferred_block_bytes
    );

    // Past the end, straddling the end, far beyond it, and overflowing u64.
    let bad: [(u64, u64); 7] = [
        (size, 1),
        (size - 1, 2),
        (size - BLOCK_BYTES, BLOCK_BYTES + 1),
        (size + BLOCK_BYTES, BLOCK_BYTES),
        (0, size + 1),
        (u64::MAX - 10, 20),
        (u64::MAX, 1),
    ];
    for (o, l) in bad {
        let what = |op: &str| format!("{kind:?}: {op} at {o} (+{l})");
        // Reads and block status take a length the caller may make up; writes carry their data,
        // so the overflow cases use a small payload.
        if let Ok(n) = usize::try_from(l)
            && n <= (64 << 10)
        {
            expect_kind(v.read(o, n).await, ErrorKind::OutOfRange, &what("read"));
            let data = IoBytes::copy_from(&vec![0xEE; n]);
            for d in [Durability::Buffered, Durability::Fua] {
                expect_kind(v.write(o, data.clone(), d).await, ErrorKind::OutOfRange, &what("write"));
            }
        }
        expect_kind(
            v.write_zeroes(o, l, Zeroing::ANY, Durability::Buffered).await,
            ErrorKind::OutOfRange,
            &what("write_zeroes"),
        );
        expect_kind(v.discard(o, l, Durability::Fua).await, ErrorKind::OutOfRange, &what("discard"));
        expect_kind(v.block_status(o, l).await, ErrorKind::OutOfRange, &what("block_status"));
    }
    // A zero-length request beyond the end is out of range too.
    expect_kind(
        v.read(size + 1, 0).await,
        ErrorKind::OutOfRange,
        &format!("{kind:?}: empty read past the end"),
    );
    expect_kind(
        v.block_status(size + 1, 0).await,
        ErrorKind::OutOfRange,
        &format!("{kind:?}: empty block status past the end"),
    );
    s.check_all("after the refused out-of-range requests").await;

    // `len == 0` inside the range (and exactly at the end) only checks it.
    for o in [0, 1, BLOCK_BYTES - 1, size / 2 + 3, size] {
        let got = v.read(o, 0).await.unwrap_or_else(|e| panic!("{kind:?}: empty read at {o}: {e}"));
        assert!(got.is_empty(), "{kind:?}: an empty read returns an empty buffer");
        let extents =
            v.block_status(o, 0).await.unwrap_or_else(|e| panic!("{kind:?}: empty status at {o}: {e}"));
        assert!(
            extents.iter().all(|e| e.len_bytes == 0),
            "{kind:?}: empty status covers nothing: {extents:?}"
        );
        if !kind.read_only() {
            v.write(o, IoBytes::copy_from(&[]), Durability::Fua)
                .await
                .unwrap_or_else(|e| panic!("{kind:?}: empty write at {o}: {e}"));
            v.write_zeroes(o, 0, Zeroing::ANY, Durability::Buffered)
                .await
                .unwrap_or_else(|e| panic!("{kind:?}: empty zeroing at {o}: {e}"));
            v.discard(o, 0, Durability::Buffered)
                .await
                .unwrap_or_else(|e| panic!("{kind:?}: empty discard at {o}: {e}"));
        }
    }
    s.check_all("after the empty requests").await;
}

every_kind!(clause);
