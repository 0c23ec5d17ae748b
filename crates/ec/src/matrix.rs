//! Small dense matrices over GF(2^8): the Cauchy generator and Gauss-Jordan inversion.

use crate::gf256;

/// A row-major matrix over GF(2^8).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Matrix {
    rows: usize,
    cols: usize,
    cells: Vec<u8>,
}

impl Matrix {
    pub(crate) fn zero(rows: usize, cols: usize) -> Self {
        Self { rows, cols, cells: vec![0; rows * cols] }
    }

    pub(crate) fn identity(size: usize) -> Self {
        let mut m = Self::zero(size, size);
        for i in 0..size {
            m.set(i, i, 1);
        }
        m
    }

    pub(crate) fn rows(&self) -> usize {
        self.rows
    }

    pub(crate) fn cols(&self) -> usize {
        self.cols
    }

    pub(crate) fn get(&self, row: usize, col: usize) -> u8 {
        self.cells[row * self.cols + col]
    }

    pub(crate) fn set(&mut self, row: usize, col: usize, value: u8) {
        self.cells[row * self.cols + col] = value;
    }

    pub(crate) fn row(&self, row: usize) -> &[u8] {
        &self.cells[row * self.cols..(row + 1) * self.cols]
    }

    /// All cells, row after row.
    pub(crate) fn cells(&self) -> &[u8] {
        &self.cells
    }

    /// The parity part of a systematic generator: a `parity_shards x data_shards` Cauchy matrix,
    /// scaled so that its first row and first column are all ones.
    ///
    /// `C[i][j] = 1 / (x_i + y_j)` with `x_i = data_shards + i` and `y_j = j`: all `x` and `y` are
    /// distinct elements (hence `K + M <= 256`), so no denominator is zero and every square
    /// submatrix of `C` is a Cauchy matrix, which is invertible. Multiplying rows and columns by
    /// non-zero constants multiplies each minor by a non-zero constant, so the scaled matrix keeps
    /// that property; it makes parity 0 the plain XOR of the data (RAID-5's P) and lets the kernels
    /// skip the multiplications by one.
    pub(crate) fn cauchy_parity(data_shards: usize, parity_shards: usize) -> Self {
        assert!(data_shards + parity_shards <= 256, "Cauchy points must be distinct field elements");
        let mut m = Self::zero(parity_shards, data_shards);
        for i in 0..parity_shards {
            for j in 0..data_shards {
                let x = field_element(data_shards + i);
                let y = field_element(j);
                m.set(i, j, gf256::inv(x ^ y));
            }
        }
        // Scale column j by 1 / C[0][j], then row i by 1 / C[i][0].
        for j in 0..data_shards {
            let scale = gf256::inv(m.get(0, j));
            for i in 0..parity_shards {
                m.set(i, j, gf256::mul(m.get(i, j), scale));
            }
        }
        for i in 1..parity_shards {
            let scale = gf256::inv(m.get(i, 0));
            for j in 0..data_shards {
                m.set(i, j, gf256::mul(m.get(i, j), scale));
            }
        }
        m
    }

    /// `self * rhs`.
    pub(crate) fn mul(&self, rhs: &Self) -> Self {
        assert_eq!(self.cols, rhs.rows, "matrix shapes do not chain");
        let mut out = Self::zero(self.rows, rhs.cols);
        for i in 0..self.rows {
            for k in 0..self.cols {
                let a = self.get(i, k);
                if a == 0 {
                    continue;
                }
                for j in 0..rhs.cols {
                    let cell = out.get(i, j) ^ gf256::mul(a, rhs.get(k, j));
                    out.set(i, j, cell);
                }
            }
        }
        out
    }

    /// The inverse by Gauss-Jordan elimination, or `None` if the matrix is singular.
    pub(crate) fn inverse(&self) -> Option<Self> {
        assert_eq!(self.rows, self.cols, "only square matrices have inverses");
        let n = self.rows;
        let mut work = self.clone();
        let mut inv = Self::identity(n);
        for col in 0..n {
            let pivot = (col..n).find(|&r| work.get(r, col) != 0)?;
            work.swap_rows(pivot, col);
            inv.swap_rows(pivot, col);
            let scale = gf256::inv(work.get(col, col));
            work.scale_row(col, scale);
            inv.scale_row(col, scale);
            for r in 0..n {
                let factor = work.get(r, col);
                if r != col && factor != 0 {
                    work.add_scaled_row(r, col, factor);
                    inv.add_scaled_row(r, col, factor);
                }
            }
        }
        Some(inv)
    }

    fn swap_rows(&mut self, a: usize, b: usize) {
        if a != b {
            for j in 0..self.cols {
                self.cells.swap(a * self.cols + j, b * self.cols + j);
            }
        }
    }

    fn scale_row(&mut self, row: usize, factor: u8) {
        for j in 0..self.cols {
            let cell = gf256::mul(self.get(row, j), factor);
            self.set(row, j, cell);
        }
    }

    /// `row[dst] += factor * row[src]`.
    fn add_scaled_row(&mut self, dst: usize, src: usize, factor: u8) {
        for j in 0..self.cols {
            let cell = self.get(dst, j) ^ gf256::mul(factor, self.get(src, j));
            self.set(dst, j, cell);
        }
    }
}

/// A shard position as a field element; positions are < 256 by the codec's limits.
fn field_element(index: usize) -> u8 {
    u8::try_from(index).expect("shard positions fit in a field element")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn submatrix(m: &Matrix, rows: &[usize], cols: &[usize]) -> Matrix {
        let mut out = Matrix::zero(rows.len(), cols.len());
        for (i, &r) in rows.iter().enumerate() {
            for (j, &c) in cols.iter().enumerate() {
                out.set(i, j, m.get(r, c));
            }
        }
        out
    }

    /// All `size`-subsets of `0..n`, in lexicographic order.
    fn subsets(n: usize, size: usize) -> Vec<Vec<usize>> {
        let mut out = Vec::new();
        let mut current = Vec::new();
        fn walk(start: usize, n: usize, size: usize, current: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
            if current.len() == size {
                out.push(current.clone());
                return;
            }
            for i in start..n {
                current.push(i);
                walk(i + 1, n, size, current, out);
                current.pop();
            }
        }
        walk(0, n, size, &mut current, &mut out);
        out
    }

    #[test]
    fn scaled_cauchy_has_unit_first_row_and_column() {
        for (k, m) in [(1, 1), (4, 2), (10, 4), (200, 55)] {
            let c = Matrix::cauchy_parity(k, m);
            assert!(c.row(0).iter().all(|&x| x == 1));
            assert!((0..m).all(|i| c.get(i, 0) == 1));
            assert!(c.cells().iter().all(|&x| x != 0));
        }
    }

    #[test]
    fn every_square_submatrix_of_the_scaled_cauchy_is_invertible() {
        let (k, m) = (8, 5);
        let c = Matrix::cauchy_parity(k, m);
        for size in 1..=m {
            for rows in subsets(m, size) {
                for cols in subsets(k, size) {
                    let sub = submatrix(&c, &rows, &cols);
                    assert!(sub.inverse().is_some(), "singular minor rows {rows:?} cols {cols:?}");
                }
            }
        }
    }

    #[test]
    fn inverse_times_matrix_is_identity() {
        let c = Matrix::cauchy_parity(6, 6);
        let inv = c.inverse().expect("a Cauchy matrix is invertible");
        assert_eq!(c.mul(&inv), Matrix::identity(6));
        assert_eq!(inv.mul(&c), Matrix::identity(6));
    }

    #[test]
    fn singular_matrix_has_no_inverse() {
        let mut m = Matrix::identity(3);
        m.set(2, 2, 0);
        m.set(2, 0, 0);
        assert!(m.inverse().is_none());
        let zero = Matrix::zero(2, 2);
        assert!(zero.inverse().is_none());
    }
}
