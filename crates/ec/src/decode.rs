//! Decode plans: which survivors to read and which rows to multiply them by, per erasure pattern.

use crate::engine::RowZero;
use crate::engine::tables::CoefTable;
use crate::matrix::Matrix;

/// A set of shard positions (`< 256`) as a bitmap.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct ShardSet([u64; 4]);

impl ShardSet {
    pub(crate) fn insert(&mut self, index: usize) {
        self.0[index / 64] |= 1 << (index % 64);
    }

    pub(crate) fn contains(&self, index: usize) -> bool {
        self.0[index / 64] & (1 << (index % 64)) != 0
    }

    /// The members in ascending order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.0.iter().enumerate().flat_map(|(word_index, &word)| {
            let mut bits = word;
            core::iter::from_fn(move || {
                (bits != 0).then(|| {
                    let bit = bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    word_index * 64 + bit
                })
            })
        })
    }
}

/// What identifies a plan: the survivors read and the shards rebuilt.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct PatternKey {
    pub(crate) survivors: ShardSet,
    pub(crate) wanted: ShardSet,
}

/// How to rebuild a set of shards from `K` survivors with one matrix multiplication.
#[derive(Debug)]
pub(crate) struct DecodePlan {
    /// The `K` survivor positions, ascending: input `j` of the multiplication.
    pub(crate) survivors: Box<[u8]>,
    /// The shard each row of `table` rebuilds (row 0 first: it may be the special one).
    pub(crate) outputs: Box<[u8]>,
    /// `outputs.len() x K` coefficients over the survivors.
    pub(crate) table: CoefTable,
    pub(crate) row0: RowZero,
}

impl DecodePlan {
    /// Builds the plan for `key` from the parity part of the generator (`M x K`).
    ///
    /// The survivors' rows of the systematic generator `[I; C]` form a `K x K` matrix `S` with
    /// `survivors = S x data`; every such `S` is invertible because every square submatrix of
    /// `C` is. Data shard `d` is row `d` of `S^-1` times the survivors; parity shard `p` is
    /// `C[p] x S^-1` times the survivors.
    pub(crate) fn build(parity: &Matrix, key: &PatternKey) -> DecodePlan {
        let k = parity.cols();
        let mut survivors: Vec<usize> = key.survivors.iter().collect();
        assert_eq!(survivors.len(), k, "a plan reads exactly K survivors");
        let mut outputs: Vec<usize> = key.wanted.iter().collect();
        let mut rows = decode_rows(parity, &survivors, &outputs);
        let mut row0 = RowZero::General;
        if let Some(special) = special_row(&rows) {
            // Make the special row row 0 and its inputs with coefficient 1 inputs `0..ones`.
            outputs.swap(0, special.row);
            let (mut order, mut without): (Vec<usize>, Vec<usize>) = (0..k).partition(|&j| special.ones[j]);
            let ones = order.len();
            // A column read by row 0 and one it ignores, equal in every other row: put them last
            // in their parts so the kernel can add them before multiplying.
            let pair = find_pair(&rows, special.row, &order, &without);
            if let Some((a, b)) = pair {
                let a = order.remove(a);
                order.push(a);
                let b = without.remove(b);
                without.push(b);
            }
            let paired = pair.is_some();
            order.extend(without);
            survivors = order.iter().map(|&j| survivors[j]).collect();
            // Reordering the survivors reorders the columns, and the swap above two rows.
            let mut permuted = Matrix::zero(outputs.len(), k);
            for r in 0..outputs.len() {
                let from = if r == 0 {
                    special.row
                } else if r == special.row {
                    0
                } else {
                    r
                };
                for (j, &col) in order.iter().enumerate() {
                    permuted.set(r, j, rows.get(from, col));
                }
            }
            rows = permuted;
            row0 =
                if special.fold { RowZero::FoldXor { ones, paired } } else { RowZero::Xor { ones, paired } };
        }
        DecodePlan {
            survivors: survivors.iter().map(|&s| shard_byte(s)).collect(),
            outputs: outputs.iter().map(|&s| shard_byte(s)).collect(),
            table: CoefTable::new(&rows),
            row0,
        }
    }
}

/// The coefficients that rebuild each of `outputs` from `survivors` (in that order).
fn decode_rows(parity: &Matrix, survivors: &[usize], outputs: &[usize]) -> Matrix {
    let k = parity.cols();
    let mut select = Matrix::zero(k, k);
    for (i, &s) in survivors.iter().enumerate() {
        for j in 0..k {
            let cell = if s < k { u8::from(s == j) } else { parity.get(s - k, j) };
            select.set(i, j, cell);
        }
    }
    let decode = select.inverse().expect("every K rows of a Cauchy-systematic generator are independent");
    let mut rows = Matrix::zero(outputs.len(), k);
    for (r, &w) in outputs.iter().enumerate() {
        let coefs = if w < k {
            decode.row(w).to_vec()
        } else {
            let mut one = Matrix::zero(1, k);
            for j in 0..k {
                one.set(0, j, parity.get(w - k, j));
            }
            one.mul(&decode).row(0).to_vec()
        };
        for (j, c) in coefs.into_iter().enumerate() {
            rows.set(r, j, c);
        }
    }
    rows
}

/// Positions `(a, b)` in `with_one` and `without` of two columns with equal coefficients in
/// every row but `special`, if there is at least one such row and `with_one` keeps another
/// column for input 0.
fn find_pair(rows: &Matrix, special: usize, with_one: &[usize], without: &[usize]) -> Option<(usize, usize)> {
    if rows.rows() < 2 || with_one.len() < 2 {
        return None;
    }
    let same = |x: usize, y: usize| {
        (0..rows.rows()).filter(|&r| r != special).all(|r| rows.get(r, x) == rows.get(r, y))
    };
    without.iter().enumerate().find_map(|(b, &y)| {
        // Input 0 seeds the accumulators: keep the first column of `with_one` out of the pair.
        with_one.iter().enumerate().skip(1).find(|&(_, &x)| same(x, y)).map(|(a, _)| (a, b))
    })
}

/// A row the kernels can compute with XORs only.
struct SpecialRow {
    row: usize,
    /// Computed as XOR of inputs plus the other outputs, rather than of inputs alone.
    fold: bool,
    /// Which inputs it adds.
    ones: Vec<bool>,
}

/// Finds a row whose coefficients are all 0 or 1 (at least one 1), or else checks whether the
/// sum of all rows is such: then any row is that sum plus the other rows, and row 0 will do
/// (`r_0 = s + r_1 + ... + r_n` as addition is XOR).
fn special_row(rows: &Matrix) -> Option<SpecialRow> {
    let zero_one = |coefs: &[u8]| coefs.iter().all(|&c| c <= 1) && coefs.contains(&1);
    if let Some(row) = (0..rows.rows()).find(|&r| zero_one(rows.row(r))) {
        return Some(SpecialRow { row, fold: false, ones: rows.row(row).iter().map(|&c| c == 1).collect() });
    }
    let mut sum = vec![0u8; rows.cols()];
    for r in 0..rows.rows() {
        for (s, &c) in sum.iter_mut().zip(rows.row(r)) {
            *s ^= c;
        }
    }
    (rows.rows() > 1 && zero_one(&sum)).then(|| SpecialRow {
        row: 0,
        fold: true,
        ones: sum.iter().map(|&c| c == 1).collect(),
    })
}

fn shard_byte(index: usize) -> u8 {
    u8::try_from(index).expect("shard positions are below 256")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_lost_data_shards_with_p_surviving_fold() {
        // 8+2 losing data 0 and 1: survivors are data 2..8, P and Q.
        let parity = Matrix::cauchy_parity(8, 2);
        let mut key = PatternKey::default();
        for s in 2..10 {
            key.survivors.insert(s);
        }
        key.wanted.insert(0);
        key.wanted.insert(1);
        let plan = DecodePlan::build(&parity, &key);
        // Data 1 = P + data 2..8 + data 0: Q (shard 9) is read for data 0 only, so it goes last.
        // Data 0 depends on P and Q only through P + Q: they are paired.
        assert_eq!(plan.row0, RowZero::FoldXor { ones: 7, paired: true });
        assert_eq!(&*plan.survivors, &[2, 3, 4, 5, 6, 7, 8, 9]);
    }

    #[test]
    fn shard_sets_iterate_in_order() {
        let mut set = ShardSet::default();
        for i in [200, 0, 63, 64, 254, 7] {
            set.insert(i);
        }
        assert_eq!(set.iter().collect::<Vec<_>>(), [0, 7, 63, 64, 200, 254]);
        assert!(set.contains(64) && !set.contains(65));
    }

    #[test]
    fn one_lost_data_shard_with_p_surviving_is_a_xor() {
        let parity = Matrix::cauchy_parity(4, 2);
        let mut key = PatternKey::default();
        for s in [0, 1, 3, 4] {
            key.survivors.insert(s);
        }
        key.wanted.insert(2);
        let plan = DecodePlan::build(&parity, &key);
        assert_eq!(plan.row0, RowZero::Xor { ones: 4, paired: false });
        assert!(plan.table.row_is_ones(0));
    }
}
