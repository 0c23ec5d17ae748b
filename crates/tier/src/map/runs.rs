//! Where the pages of a region lie when it grew in pieces (log volume header format 4,
//! docs/on-disk-format.md §8): a region of numbered 4 KiB pages (the map's head pages, or the
//! snapshot page pool) is a list of runs, each the page number it starts at and the byte offset
//! of that page; a run holds the pages up to the next run's first. A region that grows gets a new
//! run where the metadata part ends, so nothing already written moves.

use stria_dev::BLOCK_BYTES;

/// Most runs of one region (a header holds two lists of them).
pub const MAX_RUNS: usize = 16;

/// The runs of a region, by first page (the first run starts at page 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Runs {
    n: u8,
    at: [(u64, u64); MAX_RUNS],
}

impl Runs {
    /// One run: page `p` at `offset + p x 4096`.
    pub fn one(offset: u64) -> Runs {
        let mut at = [(0, 0); MAX_RUNS];
        at[0] = (0, offset);
        Runs { n: 1, at }
    }

    /// Runs from (first page, byte offset) pairs: the first starts at page 0, each later one at a
    /// larger page, every offset a whole block.
    pub fn from_pairs(pairs: &[(u64, u64)]) -> Result<Runs, String> {
        if pairs.is_empty() || pairs.len() > MAX_RUNS {
            return Err(format!("{} page runs (1 to {MAX_RUNS} allowed)", pairs.len()));
        }
        if pairs[0].0 != 0 {
            return Err(format!("the first page run starts at page {}, not 0", pairs[0].0));
        }
        if pairs.windows(2).any(|w| w[1].0 <= w[0].0) {
            return Err("page runs out of order".into());
        }
        if pairs.iter().any(|&(_, off)| !off.is_multiple_of(BLOCK_BYTES)) {
            return Err("a page run starts inside a block".into());
        }
        let mut at = [(0, 0); MAX_RUNS];
        at[..pairs.len()].copy_from_slice(pairs);
        Ok(Runs { n: pairs.len() as u8, at })
    }

    /// The (first page, byte offset) of each run, in order.
    pub fn pairs(&self) -> &[(u64, u64)] {
        &self.at[..usize::from(self.n)]
    }

    /// Adds a run from page `first` (past every run's first) at byte `offset`.
    pub fn push(&mut self, first: u64, offset: u64) -> Result<(), String> {
        let mut pairs = self.pairs().to_vec();
        pairs.push((first, offset));
        *self = Runs::from_pairs(&pairs)?;
        Ok(())
    }

    /// Byte offset of page `page`.
    pub fn offset(&self, page: u64) -> u64 {
        let &(first, off) = self.pairs().iter().rev().find(|r| r.0 <= page).expect("run 0 starts at page 0");
        off + (page - first) * BLOCK_BYTES
    }

    /// How many pages from `page` on (at most `most`) lie one after another in one run.
    pub fn contiguous(&self, page: u64, most: u64) -> u64 {
        let next = self.pairs().iter().find(|r| r.0 > page).map_or(u64::MAX, |r| r.0);
        most.min(next - page)
    }

    /// The byte ranges `[start, end)` that pages `0..pages` occupy (one per run they reach).
    pub fn spans(&self, pages: u64) -> Vec<(u64, u64)> {
        let p = self.pairs();
        p.iter()
            .enumerate()
            .filter(|(_, r)| r.0 < pages)
            .map(|(i, &(first, off))| {
                let end = p.get(i + 1).map_or(pages, |r| r.0.min(pages));
                (off, off + (end - first) * BLOCK_BYTES)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_are_found_in_their_run() {
        let mut r = Runs::one(8192);
        assert_eq!(r.offset(0), 8192);
        assert_eq!(r.offset(9), 8192 + 9 * 4096);
        r.push(10, 1 << 20).expect("room");
        assert_eq!(r.offset(9), 8192 + 9 * 4096);
        assert_eq!(r.offset(10), 1 << 20);
        assert_eq!(r.offset(12), (1 << 20) + 2 * 4096);
        assert_eq!(r.contiguous(8, 64), 2);
        assert_eq!(r.contiguous(10, 64), 64);
        assert_eq!(r.spans(12), vec![(8192, 8192 + 10 * 4096), (1 << 20, (1 << 20) + 2 * 4096)]);
        assert_eq!(r.spans(5), vec![(8192, 8192 + 5 * 4096)]);
        assert!(r.push(10, 4096).is_err(), "runs must start at rising pages");
        assert!(Runs::from_pairs(&[(1, 0)]).is_err(), "the first run starts at page 0");
        assert!(Runs::from_pairs(&[(0, 100)]).is_err(), "runs start on blocks");
        let full: Vec<(u64, u64)> = (0..MAX_RUNS as u64).map(|i| (i, i * 4096)).collect();
        let mut f = Runs::from_pairs(&full).expect("valid");
        assert!(f.push(100, 0).is_err(), "at most MAX_RUNS runs");
    }
}
