//! The codec: argument checking, and the mapping of each operation onto one matrix product.

use std::ops::Range;

use crate::cache::{DEFAULT_DECODE_CACHE_ENTRIES, DecodeCache};
use crate::decode::{DecodePlan, PatternKey};
use crate::engine::tables::CoefTable;
use crate::engine::{self, Backend, Engine, Inputs, Outputs, RowZero, gather, gather_mut};
use crate::error::EcError;
use crate::matrix::Matrix;

/// Most shards (data + parity) in a stripe: shard positions must be distinct field elements.
pub const MAX_TOTAL_SHARDS: usize = 255;

/// Bytes of each shard checked per pass by [`ReedSolomon::verify`].
const VERIFY_BLOCK_BYTES: usize = 16 * 1024;

/// How to build a [`ReedSolomon`] beyond its shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// The engine to use; `None` picks the fastest this CPU supports ([`Backend::detect`]).
    pub backend: Option<Backend>,
    /// Most decode plans kept, one per erasure pattern; 0 disables the cache.
    /// Defaults to [`DEFAULT_DECODE_CACHE_ENTRIES`].
    pub decode_cache_entries: usize,
}

impl Default for Config {
    fn default() -> Self {
        Self { backend: None, decode_cache_entries: DEFAULT_DECODE_CACHE_ENTRIES }
    }
}

/// A systematic Reed-Solomon code over GF(2^8) with `K` data and `M` parity shards.
///
/// Any `K` of the `K + M` shards of a stripe determine the others. Shards are byte slices of
/// equal length (any length, no alignment needed); byte `i` of every parity shard depends only
/// on byte `i` of the data shards.
///
/// Build one per stripe shape and share it (`Arc<ReedSolomon>`): it is `Send + Sync`, its
/// tables are computed once in [`new`](Self::new), and [`encode`](Self::encode) and
/// [`update`](Self::update) neither allocate nor lock.
pub struct ReedSolomon {
    data_shards: usize,
    parity_shards: usize,
    engine: Engine,
    /// The parity rows `C` of the generator `[I; C]`, `M x K`.
    parity: Matrix,
    /// `C` for the kernels.
    encode_table: CoefTable,
    encode_row0: RowZero,
    /// `C` transposed (`K x M`): row `d` is the column of data shard `d`, for updates.
    update_table: CoefTable,
    cache: DecodeCache,
}

impl std::fmt::Debug for ReedSolomon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReedSolomon")
            .field("data_shards", &self.data_shards)
            .field("parity_shards", &self.parity_shards)
            .field("backend", &self.engine.backend())
            .field("decode_cache", &self.cache)
            .finish()
    }
}

impl ReedSolomon {
    /// A codec for `data_shards` + `parity_shards` on the fastest backend of this CPU.
    ///
    /// # Errors
    /// Either count is 0, or their sum exceeds [`MAX_TOTAL_SHARDS`].
    pub fn new(data_shards: usize, parity_shards: usize) -> Result<Self, EcError> {
        Self::with_config(data_shards, parity_shards, Config::default())
    }

    /// A codec on a chosen backend (for tests and benchmarks).
    ///
    /// # Errors
    /// As [`new`](Self::new), or [`EcError::UnsupportedBackend`] if this CPU can't run it.
    pub fn with_backend(data_shards: usize, parity_shards: usize, backend: Backend) -> Result<Self, EcError> {
        Self::with_config(data_shards, parity_shards, Config { backend: Some(backend), ..Config::default() })
    }

    /// A codec with every option.
    ///
    /// # Errors
    /// As [`with_backend`](Self::with_backend).
    pub fn with_config(data_shards: usize, parity_shards: usize, config: Config) -> Result<Self, EcError> {
        if data_shards == 0 {
            return Err(EcError::InvalidDataShards { data_shards });
        }
        if parity_shards == 0 {
            return Err(EcError::InvalidParityShards { parity_shards });
        }
        if data_shards.saturating_add(parity_shards) > MAX_TOTAL_SHARDS {
            return Err(EcError::TooManyShards { data_shards, parity_shards, max: MAX_TOTAL_SHARDS });
        }
        let backend = config.backend.unwrap_or_else(Backend::detect);
        let engine = Engine::new(backend).ok_or(EcError::UnsupportedBackend { backend })?;
        let parity = Matrix::cauchy_parity(data_shards, parity_shards);
        let mut transposed = Matrix::zero(data_shards, parity_shards);
        for r in 0..parity_shards {
            for d in 0..data_shards {
                transposed.set(d, r, parity.get(r, d));
            }
        }
        let encode_table = CoefTable::new(&parity);
        let encode_row0 = if encode_table.row_is_ones(0) {
            RowZero::Xor { ones: data_shards, paired: false }
        } else {
            RowZero::General
        };
        Ok(Self {
            data_shards,
            parity_shards,
            engine,
            encode_table,
            encode_row0,
            update_table: CoefTable::new(&transposed),
            parity,
            cache: DecodeCache::new(config.decode_cache_entries),
        })
    }

    /// `K`.
    #[must_use]
    pub fn data_shards(&self) -> usize {
        self.data_shards
    }

    /// `M`.
    #[must_use]
    pub fn parity_shards(&self) -> usize {
        self.parity_shards
    }

    /// `K + M`.
    #[must_use]
    pub fn total_shards(&self) -> usize {
        self.data_shards + self.parity_shards
    }

    /// The engine this codec runs on.
    #[must_use]
    pub fn backend(&self) -> Backend {
        self.engine.backend()
    }

    /// The most decode plans this codec caches.
    #[must_use]
    pub fn decode_cache_entries(&self) -> usize {
        self.cache.capacity()
    }

    /// Decode plans cached right now (shared map; at most [`decode_cache_entries`](Self::decode_cache_entries)).
    #[must_use]
    pub fn decode_cache_len(&self) -> usize {
        self.cache.len()
    }

    /// The generator coefficient of parity shard `parity_index` for data shard `data_index`.
    ///
    /// Parity 0 is the XOR of the data: its coefficients are all 1.
    #[must_use]
    pub fn coefficient(&self, parity_index: usize, data_index: usize) -> Option<u8> {
        (parity_index < self.parity_shards && data_index < self.data_shards)
            .then(|| self.parity.get(parity_index, data_index))
    }

    /// Computes all `M` parity shards from the `K` data shards.
    ///
    /// # Errors
    /// Wrong shard counts, unequal lengths, or a parity buffer overlapping another buffer.
    pub fn encode(&self, data: &[&[u8]], parity: &mut [&mut [u8]]) -> Result<(), EcError> {
        check_count("data shards", self.data_shards, data.len())?;
        check_count("parity shards", self.parity_shards, parity.len())?;
        let len = data[0].len();
        check_lengths(len, data.iter().map(|d| d.len()).chain(parity.iter().map(|p| p.len())))?;
        check_disjoint(parity, data.iter().copied())?;
        engine::mul_rows(self.engine, &self.encode_table, self.encode_row0, false, data, parity, len);
        Ok(())
    }

    /// Rebuilds the shards listed in `wanted` from the survivors in `shards`, using (and filling)
    /// the decode-plan cache.
    ///
    /// `shards` has `K + M` entries, `None` for each missing shard; at least `K` must be present.
    /// Each `wanted` entry names a missing shard (data or parity) and the buffer to write it to;
    /// missing shards not named are not computed. Reads exactly `K` survivors, preferring data.
    ///
    /// # Errors
    /// Wrong count, unequal lengths, too many missing shards, a wanted index out of range,
    /// present or repeated, or a wanted buffer overlapping another buffer.
    pub fn reconstruct(
        &self,
        shards: &[Option<&[u8]>],
        wanted: &mut [(usize, &mut [u8])],
    ) -> Result<(), EcError> {
        self.reconstruct_with(shards, wanted, true)
    }

    /// [`reconstruct`](Self::reconstruct) without the cache: inverts the survivors' matrix on
    /// every call. For comparisons; prefer the cached form.
    ///
    /// # Errors
    /// As [`reconstruct`](Self::reconstruct).
    pub fn reconstruct_uncached(
        &self,
        shards: &[Option<&[u8]>],
        wanted: &mut [(usize, &mut [u8])],
    ) -> Result<(), EcError> {
        self.reconstruct_with(shards, wanted, false)
    }

    fn reconstruct_with(
        &self,
        shards: &[Option<&[u8]>],
        wanted: &mut [(usize, &mut [u8])],
        cached: bool,
    ) -> Result<(), EcError> {
        let total = self.total_shards();
        check_count("shards", total, shards.len())?;
        // One pass: lengths, and the first K present shards as the survivors.
        let mut len = None;
        let mut key = PatternKey::default();
        let mut present = 0;
        for (index, shard) in shards.iter().enumerate() {
            if let Some(shard) = shard {
                let expected = *len.get_or_insert(shard.len());
                check_length(expected, index, shard.len())?;
                if present < self.data_shards {
                    key.survivors.insert(index);
                }
                present += 1;
            }
        }
        if present < self.data_shards {
            return Err(EcError::TooManyErasures {
                missing: total - present,
                parity_shards: self.parity_shards,
            });
        }
        let len = len.unwrap_or(0);
        for (index, buf) in wanted.iter() {
            let index = *index;
            if index >= total {
                return Err(EcError::ShardIndexOutOfRange { index, shards: total });
            }
            if shards[index].is_some() {
                return Err(EcError::ShardNotMissing { index });
            }
            if key.wanted.contains(index) {
                return Err(EcError::DuplicateShard { index });
            }
            key.wanted.insert(index);
            check_length(len, index, buf.len())?;
        }
        check_disjoint_wanted(wanted, shards.iter().flatten().copied())?;
        if wanted.is_empty() {
            return Ok(());
        }
        let mut run = |plan: &DecodePlan| {
            let inputs = Survivors { shards, indices: &plan.survivors };
            let mut outputs = WantedRows { slots: &mut *wanted, order: &plan.outputs };
            engine::mul_rows(self.engine, &plan.table, plan.row0, false, &inputs, &mut outputs, len);
        };
        let build = || DecodePlan::build(&self.parity, &key);
        if cached {
            self.cache.with_plan(&key, build, run);
        } else {
            run(&build());
        }
        Ok(())
    }

    /// Checks that the parity shards of a full stripe (`K` data then `M` parity) match its data.
    ///
    /// Allocates a scratch buffer of `M x min(len, 16 KiB)` bytes.
    ///
    /// # Errors
    /// Wrong shard count or unequal lengths.
    pub fn verify(&self, shards: &[&[u8]]) -> Result<bool, EcError> {
        check_count("shards", self.total_shards(), shards.len())?;
        let len = shards[0].len();
        check_lengths(len, shards.iter().map(|s| s.len()))?;
        let (data, parity) = shards.split_at(self.data_shards);
        let block = len.clamp(1, VERIFY_BLOCK_BYTES);
        let mut scratch = vec![0u8; self.parity_shards * block];
        let mut start = 0;
        while start < len {
            let end = len.min(start + block);
            let inputs: Vec<&[u8]> = data.iter().map(|d| &d[start..end]).collect();
            let mut outputs: Vec<&mut [u8]> =
                scratch.chunks_mut(block).map(|c| &mut c[..end - start]).collect();
            engine::mul_rows(
                self.engine,
                &self.encode_table,
                self.encode_row0,
                false,
                &inputs[..],
                &mut outputs[..],
                end - start,
            );
            if outputs.iter().zip(parity).any(|(computed, stored)| **computed != stored[start..end]) {
                return Ok(false);
            }
            start = end;
        }
        Ok(true)
    }

    /// Updates all parity shards for a write that changed data shard `data_index` from `old` to
    /// `new`, without reading the other data shards: `parity[r] += C[r][d] * (old + new)`.
    ///
    /// `old`, `new` and the parity buffers may cover any byte range of the shards, as long as it
    /// is the same range in all of them.
    ///
    /// # Errors
    /// `data_index` out of range, wrong parity count, unequal lengths, or overlapping buffers.
    pub fn update(
        &self,
        data_index: usize,
        old: &[u8],
        new: &[u8],
        parity: &mut [&mut [u8]],
    ) -> Result<(), EcError> {
        self.check_update(data_index, old, Some(new), parity)?;
        engine::update_rows(self.engine, &self.update_table, data_index, old, Some(new), parity);
        Ok(())
    }

    /// [`update`](Self::update) given the change itself, `delta = old XOR new`.
    ///
    /// # Errors
    /// As [`update`](Self::update).
    pub fn update_delta(
        &self,
        data_index: usize,
        delta: &[u8],
        parity: &mut [&mut [u8]],
    ) -> Result<(), EcError> {
        self.check_update(data_index, delta, None, parity)?;
        engine::update_rows(self.engine, &self.update_table, data_index, delta, None, parity);
        Ok(())
    }

    fn check_update(
        &self,
        data_index: usize,
        old: &[u8],
        new: Option<&[u8]>,
        parity: &[&mut [u8]],
    ) -> Result<(), EcError> {
        if data_index >= self.data_shards {
            return Err(EcError::ShardIndexOutOfRange { index: data_index, shards: self.data_shards });
        }
        check_count("parity shards", self.parity_shards, parity.len())?;
        let len = old.len();
        if let Some(new) = new {
            check_length(len, data_index, new.len())?;
        }
        for (r, p) in parity.iter().enumerate() {
            check_length(len, self.data_shards + r, p.len())?;
        }
        check_disjoint(parity, [Some(old), new].into_iter().flatten())
    }
}

/// The survivors a plan reads, in plan order.
struct Survivors<'a, 'b> {
    shards: &'a [Option<&'b [u8]>],
    indices: &'a [u8],
}

impl Inputs for Survivors<'_, '_> {
    fn count(&self) -> usize {
        self.indices.len()
    }
    fn with_rows<T>(&self, f: impl FnOnce(&[&[u8]]) -> T) -> T {
        let row =
            |j: usize| self.shards[usize::from(self.indices[j])].expect("a plan only reads present shards");
        gather(self.indices.len(), row, f)
    }
}

/// The caller's wanted buffers, lent in the order of the plan's rows.
struct WantedRows<'a, 'b> {
    slots: &'a mut [(usize, &'b mut [u8])],
    order: &'a [u8],
}

impl Outputs for WantedRows<'_, '_> {
    fn count(&self) -> usize {
        self.slots.len()
    }
    fn with_rows_mut<T>(&mut self, f: impl FnOnce(&mut [&mut [u8]]) -> T) -> T {
        let (count, order) = (self.slots.len(), self.order);
        let rows = self.slots.iter_mut().map(|(index, buf)| {
            let row = order.iter().position(|&o| usize::from(o) == *index);
            (row.expect("a plan rebuilds exactly the wanted shards"), &mut **buf)
        });
        gather_mut(count, rows, f)
    }
}

fn check_count(what: &'static str, expected: usize, actual: usize) -> Result<(), EcError> {
    if expected == actual { Ok(()) } else { Err(EcError::WrongShardCount { what, expected, actual }) }
}

fn check_length(expected_bytes: usize, index: usize, actual_bytes: usize) -> Result<(), EcError> {
    if expected_bytes == actual_bytes {
        Ok(())
    } else {
        Err(EcError::ShardLengthMismatch { index, expected_bytes, actual_bytes })
    }
}

fn check_lengths(expected: usize, lengths: impl Iterator<Item = usize>) -> Result<(), EcError> {
    lengths.enumerate().try_for_each(|(index, actual)| check_length(expected, index, actual))
}

fn overlaps(a: &Range<*const u8>, b: &Range<*const u8>) -> bool {
    a.start < b.end && b.start < a.end
}

/// Errors if an output overlaps an input or an earlier output. Safe code can't build such
/// arguments (`&` and `&mut` borrows never overlap); this guards callers that made slices from
/// raw pointers. `M x (K + M)` pointer compares.
fn check_disjoint<'a>(
    outputs: &[&mut [u8]],
    inputs: impl Iterator<Item = &'a [u8]> + Clone,
) -> Result<(), EcError> {
    for (i, out) in outputs.iter().enumerate() {
        check_one_output(
            i,
            out.as_ptr_range(),
            inputs.clone(),
            outputs[..i].iter().map(|o| o.as_ptr_range()),
        )?;
    }
    Ok(())
}

fn check_disjoint_wanted<'a>(
    wanted: &[(usize, &mut [u8])],
    inputs: impl Iterator<Item = &'a [u8]> + Clone,
) -> Result<(), EcError> {
    for (i, (_, out)) in wanted.iter().enumerate() {
        check_one_output(
            i,
            out.as_ptr_range(),
            inputs.clone(),
            wanted[..i].iter().map(|(_, o)| o.as_ptr_range()),
        )?;
    }
    Ok(())
}

fn check_one_output<'a>(
    i: usize,
    out: Range<*const u8>,
    inputs: impl Iterator<Item = &'a [u8]>,
    earlier: impl Iterator<Item = Range<*const u8>>,
) -> Result<(), EcError> {
    for (j, input) in inputs.enumerate() {
        if overlaps(&out, &input.as_ptr_range()) {
            return Err(EcError::OutputAliasesInput { output: i, other: format!("input {j}") });
        }
    }
    for (j, other) in earlier.enumerate() {
        if overlaps(&out, &other) {
            return Err(EcError::OutputAliasesInput { output: i, other: format!("output {j}") });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codec_is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<ReedSolomon>();
    }

    #[test]
    fn encode_row_zero_is_a_xor() {
        let rs = ReedSolomon::with_backend(5, 3, Backend::Scalar).expect("valid shape");
        assert_eq!(rs.encode_row0, RowZero::Xor { ones: 5, paired: false });
        assert!((0..5).all(|d| rs.coefficient(0, d) == Some(1)));
    }
}
