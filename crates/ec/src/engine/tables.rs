//! Per-coefficient encodings, computed once per matrix so the kernels only load them.

use crate::gf256;
use crate::matrix::Matrix;

/// A coefficient matrix in every encoding a kernel may want.
///
/// Built at codec construction (the generator) or when a decode plan is made, never on the hot
/// path. Costs 41 bytes per coefficient: 1 raw + 8 for the GFNI affine matrix + 32 for the
/// split-nibble tables.
pub(crate) struct CoefTable {
    rows: usize,
    cols: usize,
    raw: Box<[u8]>,
    affine: Box<[u64]>,
    nibbles: Box<[[u8; 32]]>,
}

impl std::fmt::Debug for CoefTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CoefTable")
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .finish_non_exhaustive()
    }
}

impl CoefTable {
    pub(crate) fn new(matrix: &Matrix) -> Self {
        let raw: Box<[u8]> = matrix.cells().into();
        let affine = raw.iter().map(|&c| gf256::affine_matrix(c)).collect();
        let nibbles = raw.iter().map(|&c| gf256::nibble_table(c)).collect();
        let (rows, cols) = (matrix.rows(), matrix.cols());
        Self { rows, cols, raw, affine, nibbles }
    }

    pub(crate) fn rows(&self) -> usize {
        self.rows
    }

    pub(crate) fn cols(&self) -> usize {
        self.cols
    }

    /// The raw coefficients of one row.
    pub(crate) fn raw_row(&self, row: usize) -> &[u8] {
        &self.raw[row * self.cols..(row + 1) * self.cols]
    }

    /// Whether every coefficient of row `row` is one (that row is a plain XOR).
    pub(crate) fn row_is_ones(&self, row: usize) -> bool {
        self.raw_row(row).iter().all(|&c| c == 1)
    }

    /// The coefficients of rows `first..first + count`, in every encoding.
    pub(crate) fn group(&self, first: usize, count: usize) -> GroupCoefs<'_> {
        let range = first * self.cols..(first + count) * self.cols;
        GroupCoefs {
            cols: self.cols,
            raw: &self.raw[range.clone()],
            affine: &self.affine[range.clone()],
            nibbles: &self.nibbles[range],
            col0_ones: self.cols > 0 && (first..first + count).all(|r| self.raw[r * self.cols] == 1),
        }
    }
}

/// The coefficients of a group of consecutive rows, row-major, `cols` per row.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GroupCoefs<'a> {
    pub(crate) cols: usize,
    pub(crate) raw: &'a [u8],
    pub(crate) affine: &'a [u64],
    pub(crate) nibbles: &'a [[u8; 32]],
    /// Every row of the group has coefficient one for input 0: accumulators start as a copy of it.
    pub(crate) col0_ones: bool,
}
