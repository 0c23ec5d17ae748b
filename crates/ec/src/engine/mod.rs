//! The compute engines, and the one place that picks between them.
//!
//! Every engine computes the same thing, "output rows = coefficient matrix x input rows" over
//! GF(2^8), byte-wise along the shards. They differ in how they multiply a vector of bytes by a
//! constant:
//!
//! | engine          | multiply by `c`                                  | bytes/vector |
//! |-----------------|--------------------------------------------------|--------------|
//! | `GfniAvx512`    | `vgf2p8affineqb` with the 8x8 bit matrix of `c`  | 64           |
//! | `GfniAvx2`      | the same on 256-bit registers                    | 32           |
//! | `Avx512Bw`      | split nibbles, two `vpshufb` table lookups       | 64           |
//! | `Avx2`          | split nibbles                                    | 32           |
//! | `Ssse3`         | split nibbles                                    | 16           |
//! | `Scalar`        | a 256-byte product table row per coefficient     | 1            |
//! | `Naive`         | log/exp multiplication, byte by byte (reference) | 1            |
//!
//! The choice is made once, when a codec is built ([`Backend::detect`] or a forced backend), and
//! branched on once per call, outside every loop.

pub(crate) mod kernel;
mod naive;
mod scalar;
pub(crate) mod tables;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512bw;
#[cfg(target_arch = "x86_64")]
mod gfni_avx2;
#[cfg(target_arch = "x86_64")]
mod gfni_avx512;
#[cfg(target_arch = "x86_64")]
mod ssse3;

use kernel::{GroupJob, UpdateJob};
use tables::CoefTable;

/// Most shards in a stripe; every shard index fits in a byte.
pub(crate) const MAX_SHARDS: usize = 255;

/// Bytes processed per pass when the outputs span several register groups, so that the inputs
/// are read from L1/L2 rather than memory by every group after the first.
const MULTI_GROUP_BLOCK_BYTES: usize = 16 * 1024;

/// A compute engine. [`Backend::detect`] picks the fastest this CPU supports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Backend {
    /// GFNI affine multiplication on 512-bit vectors (AVX-512F + AVX-512BW + GFNI).
    GfniAvx512,
    /// GFNI affine multiplication on 256-bit vectors (AVX2 + GFNI).
    GfniAvx2,
    /// Split-nibble table lookups on 512-bit vectors (AVX-512F + AVX-512BW).
    Avx512Bw,
    /// Split-nibble table lookups on 256-bit vectors (AVX2).
    Avx2,
    /// Split-nibble table lookups on 128-bit vectors (SSSE3).
    Ssse3,
    /// Portable code: a 256-byte product table per coefficient. Runs everywhere.
    Scalar,
    /// Byte-at-a-time log/exp arithmetic: the reference the other engines are tested against.
    /// Slow; for tests.
    Naive,
}

impl Backend {
    /// Every backend, fastest first.
    pub const ALL: [Backend; 7] = [
        Backend::GfniAvx512,
        Backend::GfniAvx2,
        Backend::Avx512Bw,
        Backend::Avx2,
        Backend::Ssse3,
        Backend::Scalar,
        Backend::Naive,
    ];

    /// The fastest backend this CPU supports (never `Naive`).
    #[must_use]
    pub fn detect() -> Backend {
        Self::ALL.into_iter().find(|b| *b != Backend::Naive && b.is_supported()).unwrap_or(Backend::Scalar)
    }

    /// The backends this CPU supports, fastest first.
    #[must_use]
    pub fn supported() -> Vec<Backend> {
        Self::ALL.into_iter().filter(|b| b.is_supported()).collect()
    }

    /// Whether this CPU can run the backend.
    #[must_use]
    pub fn is_supported(self) -> bool {
        match self {
            Backend::Scalar | Backend::Naive => true,
            #[cfg(target_arch = "x86_64")]
            Backend::GfniAvx512 => {
                is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("gfni")
            }
            #[cfg(target_arch = "x86_64")]
            Backend::GfniAvx2 => is_x86_feature_detected!("avx2") && is_x86_feature_detected!("gfni"),
            #[cfg(target_arch = "x86_64")]
            Backend::Avx512Bw => is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw"),
            #[cfg(target_arch = "x86_64")]
            Backend::Avx2 => is_x86_feature_detected!("avx2"),
            #[cfg(target_arch = "x86_64")]
            Backend::Ssse3 => is_x86_feature_detected!("ssse3"),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// A short stable name: `gfni-avx512`, `gfni-avx2`, `avx512bw`, `avx2`, `ssse3`, `scalar`,
    /// `naive`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Backend::GfniAvx512 => "gfni-avx512",
            Backend::GfniAvx2 => "gfni-avx2",
            Backend::Avx512Bw => "avx512bw",
            Backend::Avx2 => "avx2",
            Backend::Ssse3 => "ssse3",
            Backend::Scalar => "scalar",
            Backend::Naive => "naive",
        }
    }

    /// The backend with this [`name`](Backend::name), if any.
    #[must_use]
    pub fn from_name(name: &str) -> Option<Backend> {
        Self::ALL.into_iter().find(|b| b.name() == name)
    }

    /// How many output rows one pass of this engine keeps in registers.
    fn group_rows(self) -> usize {
        match self {
            Backend::GfniAvx512 | Backend::Avx512Bw => 8,
            Backend::GfniAvx2 | Backend::Avx2 | Backend::Ssse3 => 4,
            Backend::Scalar | Backend::Naive => MAX_SHARDS,
        }
    }
}

/// A backend this CPU was checked to support: the only way to reach the SIMD entry points.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Engine(Backend);

impl Engine {
    /// The engine for `backend`, if this CPU can run it.
    pub(crate) fn new(backend: Backend) -> Option<Engine> {
        backend.is_supported().then_some(Engine(backend))
    }

    pub(crate) fn backend(self) -> Backend {
        self.0
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What row 0 of a coefficient table is, so kernels can skip its multiplications.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RowZero {
    /// Nothing special.
    General,
    /// Row 0 is 1 for inputs `0..ones` and 0 for the others (`ones >= 1`): output 0 is the XOR
    /// of those inputs. The generator's parity 0 is this with `ones = K`.
    Xor { ones: usize, paired: bool },
    /// Output 0 is the XOR of inputs `0..ones` and of all the other outputs (`ones >= 1`).
    /// Holds when the sum of all rows is 1 on inputs `0..ones` and 0 elsewhere, e.g. when two
    /// data shards are rebuilt and P survives: the second is P plus the surviving data plus the
    /// first.
    FoldXor { ones: usize, paired: bool },
}

impl RowZero {
    /// How many leading inputs row 0 adds with coefficient 1, if it is a XOR row.
    pub(crate) fn ones(self) -> Option<usize> {
        match self {
            RowZero::General => None,
            RowZero::Xor { ones, .. } | RowZero::FoldXor { ones, .. } => Some(ones),
        }
    }

    /// Whether the last input has the same coefficient as input `ones - 1` in every row but
    /// row 0, which does not read it (`2 <= ones < K`): the kernels add the two inputs and
    /// multiply once. Rebuilding two data shards from P and Q is the common case: the second
    /// shard depends on P and Q only through P + Q.
    pub(crate) fn paired(self) -> bool {
        matches!(self, RowZero::Xor { paired: true, .. } | RowZero::FoldXor { paired: true, .. })
    }
}

/// Input rows gathered on the stack up to this count; larger stripes gather into a `Vec`.
const STACK_ROWS: usize = 32;
/// Output rows gathered on the stack up to this count.
const STACK_OUTPUTS: usize = 8;

/// The input rows of a multiplication.
pub(crate) trait Inputs {
    fn count(&self) -> usize;
    /// Calls `f` with the rows as one slice of slices.
    fn with_rows<T>(&self, f: impl FnOnce(&[&[u8]]) -> T) -> T;
}

impl Inputs for [&[u8]] {
    fn count(&self) -> usize {
        self.len()
    }
    fn with_rows<T>(&self, f: impl FnOnce(&[&[u8]]) -> T) -> T {
        f(self)
    }
}

/// The output rows of a multiplication.
pub(crate) trait Outputs {
    fn count(&self) -> usize;
    /// Calls `f` with the rows as one slice of exclusive slices.
    fn with_rows_mut<T>(&mut self, f: impl FnOnce(&mut [&mut [u8]]) -> T) -> T;
}

impl Outputs for [&mut [u8]] {
    fn count(&self) -> usize {
        self.len()
    }
    fn with_rows_mut<T>(&mut self, f: impl FnOnce(&mut [&mut [u8]]) -> T) -> T {
        f(self)
    }
}

/// Gathers `count` rows given by `row(i)` into a slice of slices, on the stack when few (in an
/// array sized to the count's tier, since filling the array is part of every call's cost).
pub(crate) fn gather<'a, T>(
    count: usize,
    row: impl Fn(usize) -> &'a [u8],
    f: impl FnOnce(&[&'a [u8]]) -> T,
) -> T {
    fn on_stack<'a, T, const N: usize>(
        count: usize,
        row: impl Fn(usize) -> &'a [u8],
        f: impl FnOnce(&[&'a [u8]]) -> T,
    ) -> T {
        let mut rows: [&[u8]; N] = [&[]; N];
        for (i, slot) in rows[..count].iter_mut().enumerate() {
            *slot = row(i);
        }
        f(&rows[..count])
    }
    match count {
        0..=8 => on_stack::<T, 8>(count, row, f),
        9..=STACK_ROWS => on_stack::<T, STACK_ROWS>(count, row, f),
        _ => f(&(0..count).map(row).collect::<Vec<_>>()),
    }
}

/// Gathers `count` exclusive rows, given with their positions, into a slice of slices.
pub(crate) fn gather_mut<'a, T>(
    count: usize,
    rows: impl Iterator<Item = (usize, &'a mut [u8])>,
    f: impl FnOnce(&mut [&'a mut [u8]]) -> T,
) -> T {
    if count <= STACK_OUTPUTS {
        let mut slots: [&mut [u8]; STACK_OUTPUTS] = Default::default();
        for (i, row) in rows {
            slots[i] = row;
        }
        f(&mut slots[..count])
    } else {
        let mut slots: Vec<&mut [u8]> = (0..count).map(|_| Default::default()).collect();
        for (i, row) in rows {
            slots[i] = row;
        }
        f(&mut slots)
    }
}

/// `outputs (+)= table x inputs` over `len` bytes of every row.
///
/// The caller has validated counts and lengths; a mismatch here is a bug and panics.
pub(crate) fn mul_rows<I: Inputs + ?Sized, O: Outputs + ?Sized>(
    engine: Engine,
    table: &CoefTable,
    row0: RowZero,
    accumulate: bool,
    inputs: &I,
    outputs: &mut O,
    len: usize,
) {
    let (rows, cols) = (table.rows(), table.cols());
    assert!(inputs.count() == cols && outputs.count() == rows && cols <= MAX_SHARDS && rows <= MAX_SHARDS);
    inputs.with_rows(|ins| {
        outputs.with_rows_mut(|outs| mul_slices(engine, table, row0, accumulate, ins, outs, len));
    });
}

fn mul_slices(
    engine: Engine,
    table: &CoefTable,
    row0: RowZero,
    accumulate: bool,
    ins: &[&[u8]],
    outs: &mut [&mut [u8]],
    len: usize,
) {
    let rows = table.rows();
    assert!(ins.iter().all(|i| i.len() == len), "an input has the wrong length");
    assert!(outs.iter().all(|o| o.len() == len), "an output has the wrong length");
    if rows == 0 || len == 0 {
        return;
    }
    let group_rows = engine.0.group_rows();
    // A fold needs every other output in registers: with several groups row 0 is computed from
    // its own coefficients instead, which is the same value.
    let row0 =
        if matches!(row0, RowZero::FoldXor { .. }) && rows > group_rows { RowZero::General } else { row0 };
    let block = if rows > group_rows { MULTI_GROUP_BLOCK_BYTES } else { len };
    let mut start = 0;
    while start < len {
        let end = len.min(start + block);
        let mut first = 0;
        while first < rows {
            let count = group_rows.min(rows - first);
            let mut job = GroupJob {
                inputs: ins,
                outputs: &mut outs[first..first + count],
                coefs: table.group(first, count),
                row0: if first == 0 { row0 } else { RowZero::General },
                accumulate,
                start,
                end,
            };
            let done = mul_group(engine, &mut job);
            if done < end {
                job.start = done;
                scalar::mul_rows(&mut job);
            }
            first += count;
        }
        start = end;
    }
}

/// Runs one group on the chosen engine; returns the offset it reached.
fn mul_group(engine: Engine, job: &mut GroupJob<'_, '_, '_>) -> usize {
    match engine.0 {
        Backend::Naive => {
            naive::mul_rows(job);
            job.end
        }
        Backend::Scalar => {
            scalar::mul_rows(job);
            job.end
        }
        #[cfg(target_arch = "x86_64")]
        Backend::GfniAvx512 => {
            // SAFETY: an `Engine` is only made for a backend the CPU supports.
            unsafe { gfni_avx512::mul_group(job) }
        }
        #[cfg(target_arch = "x86_64")]
        Backend::GfniAvx2 => {
            // SAFETY: as above.
            unsafe { gfni_avx2::mul_group(job) }
        }
        #[cfg(target_arch = "x86_64")]
        Backend::Avx512Bw => {
            // SAFETY: as above.
            unsafe { avx512bw::mul_group(job) }
        }
        #[cfg(target_arch = "x86_64")]
        Backend::Avx2 => {
            // SAFETY: as above.
            unsafe { avx2::mul_group(job) }
        }
        #[cfg(target_arch = "x86_64")]
        Backend::Ssse3 => {
            // SAFETY: as above.
            unsafe { ssse3::mul_group(job) }
        }
        #[cfg(not(target_arch = "x86_64"))]
        _ => unreachable!("an `Engine` is only made for a supported backend"),
    }
}

/// `parity[r] += column[r] * (old + new)`, or `column[r] * old` when `new` is `None` (a delta).
///
/// `table` has one row per data shard holding that shard's column of the generator.
pub(crate) fn update_rows(
    engine: Engine,
    table: &CoefTable,
    data_index: usize,
    old: &[u8],
    new: Option<&[u8]>,
    parity: &mut [&mut [u8]],
) {
    let len = old.len();
    assert!(new.is_none_or(|n| n.len() == len) && parity.iter().all(|p| p.len() == len));
    assert!(table.cols() == parity.len() && data_index < table.rows());
    let row = table.group(data_index, 1);
    let group_rows = engine.0.group_rows();
    let mut first = 0;
    while first < parity.len() {
        let count = group_rows.min(parity.len() - first);
        let range = first..first + count;
        // Seen from the kernel, the coefficients are one column: one row per parity shard.
        let coefs = tables::GroupCoefs {
            cols: 1,
            col0_ones: false,
            raw: &row.raw[range.clone()],
            affine: &row.affine[range.clone()],
            nibbles: &row.nibbles[range.clone()],
        };
        let mut job = UpdateJob { old, new, parity: &mut parity[range], coefs, start: 0, end: len };
        let done = update_group(engine, &mut job);
        if done < len {
            job.start = done;
            scalar::update_rows(&mut job);
        }
        first += count;
    }
}

fn update_group(engine: Engine, job: &mut UpdateJob<'_, '_>) -> usize {
    match engine.0 {
        Backend::Naive => {
            naive::update_rows(job);
            job.end
        }
        Backend::Scalar => {
            scalar::update_rows(job);
            job.end
        }
        #[cfg(target_arch = "x86_64")]
        Backend::GfniAvx512 => {
            // SAFETY: an `Engine` is only made for a backend the CPU supports.
            unsafe { gfni_avx512::update(job) }
        }
        #[cfg(target_arch = "x86_64")]
        Backend::GfniAvx2 => {
            // SAFETY: as above.
            unsafe { gfni_avx2::update(job) }
        }
        #[cfg(target_arch = "x86_64")]
        Backend::Avx512Bw => {
            // SAFETY: as above.
            unsafe { avx512bw::update(job) }
        }
        #[cfg(target_arch = "x86_64")]
        Backend::Avx2 => {
            // SAFETY: as above.
            unsafe { avx2::update(job) }
        }
        #[cfg(target_arch = "x86_64")]
        Backend::Ssse3 => {
            // SAFETY: as above.
            unsafe { ssse3::update(job) }
        }
        #[cfg(not(target_arch = "x86_64"))]
        _ => unreachable!("an `Engine` is only made for a supported backend"),
    }
}
