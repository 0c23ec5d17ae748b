//! A sparse two-level table indexed by page number, for [`crate::MemExport`].
//!
//! A lookup is two array indexings (a `BTreeMap` of a fully written 1 GiB export is seven levels
//! of pointer chasing, which showed up as the top cost in profiles of 4 KiB random reads). The
//! directory costs 8 bytes per 2 MiB of address space (4 MiB for a 1 TiB export); leaves are
//! allocated on first use and freed when they empty.

/// Entries per leaf.
const LEAF_ENTRIES: usize = 512;

pub(crate) struct PageTable<T> {
    leaves: Vec<Option<Box<Leaf<T>>>>,
    len: usize,
}

struct Leaf<T> {
    slots: Vec<Option<T>>,
    used: usize,
}

fn split(page: u64) -> (usize, usize) {
    let page = usize::try_from(page).expect("page numbers of an in-memory export fit usize");
    (page / LEAF_ENTRIES, page % LEAF_ENTRIES)
}

impl<T> PageTable<T> {
    /// A table for pages `0..page_count`.
    pub(crate) fn new(page_count: u64) -> PageTable<T> {
        let pages = usize::try_from(page_count).expect("page count of an in-memory export fits usize");
        let leaves = pages.div_ceil(LEAF_ENTRIES);
        PageTable { leaves: (0..leaves).map(|_| None).collect(), len: 0 }
    }

    /// Entries present.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn get(&self, page: u64) -> Option<&T> {
        let (leaf, slot) = split(page);
        self.leaves.get(leaf)?.as_ref()?.slots[slot].as_ref()
    }

    pub(crate) fn get_mut(&mut self, page: u64) -> Option<&mut T> {
        let (leaf, slot) = split(page);
        self.leaves.get_mut(leaf)?.as_mut()?.slots[slot].as_mut()
    }

    /// Sets an entry; returns the old one.
    pub(crate) fn insert(&mut self, page: u64, value: T) -> Option<T> {
        let (leaf, slot) = split(page);
        let leaf = self.leaves[leaf].get_or_insert_with(|| {
            Box::new(Leaf { slots: (0..LEAF_ENTRIES).map(|_| None).collect(), used: 0 })
        });
        let old = leaf.slots[slot].replace(value);
        if old.is_none() {
            leaf.used += 1;
            self.len += 1;
        }
        old
    }

    /// The entry, inserted with `make` if absent.
    pub(crate) fn get_or_insert_with(&mut self, page: u64, make: impl FnOnce() -> T) -> &mut T {
        if self.get(page).is_none() {
            self.insert(page, make());
        }
        self.get_mut(page).expect("inserted above")
    }

    pub(crate) fn remove(&mut self, page: u64) -> Option<T> {
        let (leaf_index, slot) = split(page);
        let leaf = self.leaves.get_mut(leaf_index)?.as_mut()?;
        let old = leaf.slots[slot].take();
        if old.is_some() {
            leaf.used -= 1;
            self.len -= 1;
            if leaf.used == 0 {
                self.leaves[leaf_index] = None;
            }
        }
        old
    }

    /// Present entries with page numbers in `first..=last`, in order; empty leaves are skipped.
    pub(crate) fn range(&self, first: u64, last: u64) -> impl Iterator<Item = (u64, &T)> {
        let (first_leaf, _) = split(first);
        let (last_leaf, _) = split(last);
        let last_leaf = last_leaf.min(self.leaves.len().saturating_sub(1));
        self.leaves
            .get(first_leaf..=last_leaf)
            .unwrap_or(&[])
            .iter()
            .enumerate()
            .filter_map(move |(offset, leaf)| leaf.as_ref().map(|leaf| (first_leaf + offset, leaf)))
            .flat_map(|(leaf_index, leaf)| {
                leaf.slots.iter().enumerate().filter_map(move |(slot, value)| {
                    let page = u64::try_from(leaf_index * LEAF_ENTRIES + slot).expect("usize fits u64");
                    value.as_ref().map(|value| (page, value))
                })
            })
            .filter(move |(page, _)| (first..=last).contains(page))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_get_remove_and_range() {
        let mut table: PageTable<u32> = PageTable::new(5000);
        assert_eq!(table.insert(3, 30), None);
        assert_eq!(table.insert(700, 7), None);
        assert_eq!(table.insert(4999, 49), None);
        assert_eq!(table.insert(3, 31), Some(30));
        assert_eq!(table.len(), 3);
        assert_eq!(table.get(3), Some(&31));
        assert_eq!(table.get(4), None);
        let all: Vec<(u64, u32)> = table.range(0, 4999).map(|(p, v)| (p, *v)).collect();
        assert_eq!(all, vec![(3, 31), (700, 7), (4999, 49)]);
        let middle: Vec<u64> = table.range(4, 4998).map(|(p, _)| p).collect();
        assert_eq!(middle, vec![700]);
        assert_eq!(table.remove(700), Some(7));
        assert!(table.leaves[1].is_none(), "empty leaf freed");
        *table.get_or_insert_with(10, || 0) += 5;
        assert_eq!(table.get(10), Some(&5));
        assert_eq!(table.len(), 3);
    }
}
