//! Flush epochs (docs/design/stale-copies.md, on-disk-format.md §2a): every drive counts the
//! flushes it took part in after writes, and the drives record what they have seen confirmed of
//! each other, so that an old copy of a drive (one that missed a flush) is told apart at the next
//! open.
//!
//! The book is the pool's memory of both: each drive's own epoch (the last one claimed for it)
//! and, per drive, the newest epoch confirmed durable on it. A flush claims a new epoch for each
//! drive written since its last one ([`EpochBook::claim`]), the drive makes its record of that
//! epoch durable after its data, and once every flushed drive holds its record the new epochs are
//! confirmed ([`EpochBook::confirm`]) and written into the records of every drive the flush
//! covered, as witnesses.

use std::collections::BTreeMap;

use crate::format::flush_record::{FlushRecord, WITNESSES_MAX};

/// One drive's entry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct DriveEpochs {
    /// The newest epoch claimed for the drive (its record may or may not hold it yet).
    claimed: u64,
    /// The newest epoch confirmed durable on the drive.
    confirmed: u64,
    /// When `confirmed` last moved (the book's confirmation count then): a record too small for
    /// every drive keeps the witnesses confirmed most recently.
    confirmed_at: u64,
}

/// The pool's flush epochs, by drive slot.
#[derive(Debug, Default, Clone)]
pub(crate) struct EpochBook {
    drives: BTreeMap<u32, DriveEpochs>,
    /// Confirmations so far (orders the witnesses by recency).
    confirmations: u64,
}

impl EpochBook {
    /// The book as the drives found at open hold it: each drive's own epoch, durable in its
    /// record, is confirmed.
    pub(crate) fn from_records<'a>(
        records: impl IntoIterator<Item = (u32, Option<&'a FlushRecord>)>,
    ) -> EpochBook {
        let mut book = EpochBook::default();
        for (slot, record) in records {
            let epoch = record.map_or(0, |r| r.epoch);
            book.drives.insert(slot, DriveEpochs { claimed: epoch, confirmed: epoch, confirmed_at: 0 });
        }
        book
    }

    /// A drive that joins the pool: epoch 0, nothing to confirm.
    pub(crate) fn admit(&mut self, slot: u32) {
        let previous = self.drives.insert(slot, DriveEpochs::default());
        assert!(previous.is_none(), "drive slot {slot} admitted twice to the flush epochs");
    }

    /// A drive that comes back to its slot with `epoch` durable in its record.
    pub(crate) fn admit_at(&mut self, slot: u32, epoch: u64) {
        let previous = self
            .drives
            .insert(slot, DriveEpochs { claimed: epoch, confirmed: epoch, confirmed_at: self.confirmations });
        assert!(previous.is_none(), "drive slot {slot} admitted twice to the flush epochs");
    }

    /// Claims the next epoch of the drive in `slot` (written since its last one); `None` for a
    /// drive that left the pool meanwhile.
    pub(crate) fn claim(&mut self, slot: u32) -> Option<u64> {
        let d = self.drives.get_mut(&slot)?;
        d.claimed += 1;
        Some(d.claimed)
    }

    /// The epoch last claimed for the drive in `slot`.
    pub(crate) fn own(&self, slot: u32) -> u64 {
        self.drives.get(&slot).map_or(0, |d| d.claimed)
    }

    /// Every drive of `slots` holds its claimed epoch durably: confirms them. A drive that left
    /// the pool while the flush ran (a drained drive removed) is not confirmed: nothing will
    /// ever be witnessed of its slot again.
    pub(crate) fn confirm(&mut self, slots: &[u32]) {
        self.confirmations += 1;
        for slot in slots {
            let Some(d) = self.drives.get_mut(slot) else { continue };
            assert!(
                d.claimed >= d.confirmed,
                "drive {slot}: flush epoch {} confirmed, only {} claimed",
                d.confirmed,
                d.claimed
            );
            d.confirmed = d.claimed;
            d.confirmed_at = self.confirmations;
        }
    }

    /// The newest epoch confirmed of the drive in `slot`.
    pub(crate) fn confirmed(&self, slot: u32) -> u64 {
        self.drives.get(&slot).map_or(0, |d| d.confirmed)
    }

    /// The witnesses a record carries: every drive's confirmed epoch, sorted by slot; when
    /// there are more drives than a record holds, the ones confirmed most recently.
    pub(crate) fn witnesses(&self) -> Vec<(u32, u64)> {
        let mut all: Vec<(u32, DriveEpochs)> =
            self.drives.iter().filter(|(_, d)| d.confirmed > 0).map(|(&s, &d)| (s, d)).collect();
        if all.len() > WITNESSES_MAX {
            all.sort_by_key(|(_, d)| std::cmp::Reverse(d.confirmed_at));
            all.truncate(WITNESSES_MAX);
            all.sort_by_key(|(s, _)| *s);
        }
        all.into_iter().map(|(s, d)| (s, d.confirmed)).collect()
    }

    /// Forgets a drive that left the pool.
    pub(crate) fn forget(&mut self, slot: u32) {
        self.drives.remove(&slot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_confirmed_epochs_are_witnessed_and_a_full_record_keeps_the_newest() {
        let mut book = EpochBook::from_records([(0, None), (1, None)]);
        assert_eq!(book.witnesses(), vec![]);
        assert_eq!((book.claim(0), book.claim(1)), (Some(1), Some(1)));
        assert_eq!(book.witnesses(), vec![], "claimed is not confirmed");
        book.confirm(&[0, 1]);
        assert_eq!(book.witnesses(), vec![(0, 1), (1, 1)]);
        assert_eq!(book.claim(0), Some(2));
        assert_eq!(book.claim(7), None, "a drive not in the pool");
        assert_eq!(book.witnesses(), vec![(0, 1), (1, 1)]);
        book.confirm(&[0]);
        assert_eq!(book.witnesses(), vec![(0, 2), (1, 1)]);

        let mut big = EpochBook::default();
        for slot in 0..WITNESSES_MAX as u32 + 5 {
            big.admit(slot);
            big.claim(slot);
            big.confirm(&[slot]);
        }
        let w = big.witnesses();
        assert_eq!(w.len(), WITNESSES_MAX);
        assert_eq!(w.first(), Some(&(5, 1)), "the oldest confirmations are left out");
    }
}
