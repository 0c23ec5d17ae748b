//! The loops every SIMD engine shares, generic over a [`Simd`] token.
//!
//! An engine file supplies a zero-sized token type whose methods wrap the intrinsics of one
//! instruction set, and thin `#[target_feature]` entry points that create the token and call the
//! `#[inline(always)]` bodies here, so the whole loop is compiled with that feature set.
//!
//! The token is the proof that the CPU has the features: it is only created inside an entry
//! point, whose caller checked the CPU first. Every method can then be a safe function.

// The loops over `r < R` and `b < B` index several arrays in step with constant bounds; LLVM
// unrolls them and keeps every element in a register. Iterator chains would obscure that.
#![allow(clippy::needless_range_loop)]

use super::RowZero;
use super::tables::GroupCoefs;

/// One instruction set's vector operations. Implemented by zero-sized tokens.
pub(super) trait Simd: Copy {
    /// A vector register.
    type V: Copy;
    /// An input vector prepared for multiplication (the vector itself, or its two nibbles).
    type Prep: Copy;
    /// One coefficient's encoding in a [`GroupCoefs`].
    type Coef;
    /// Bytes per vector.
    const BYTES: usize;

    /// This engine's encoding of the coefficients of a group.
    fn coefs<'a>(group: &GroupCoefs<'a>) -> &'a [Self::Coef];

    /// Loads `BYTES` bytes from `p`.
    ///
    /// # Safety
    /// `p` must be valid for reads of `BYTES` bytes.
    unsafe fn load(self, p: *const u8) -> Self::V;

    /// Stores `BYTES` bytes to `p`.
    ///
    /// # Safety
    /// `p` must be valid for writes of `BYTES` bytes.
    unsafe fn store(self, p: *mut u8, v: Self::V);

    /// Stores `BYTES` bytes to `p` bypassing the caches (a non-temporal store).
    ///
    /// # Safety
    /// `p` must be valid for writes of `BYTES` bytes and aligned to `BYTES`.
    unsafe fn store_stream(self, p: *mut u8, v: Self::V);

    /// Orders earlier non-temporal stores before any later store (`sfence`).
    fn fence(self);

    /// A vector of zeros (also the filler for arrays about to be overwritten).
    fn zero(self) -> Self::V;

    fn xor(self, a: Self::V, b: Self::V) -> Self::V;

    fn xor3(self, a: Self::V, b: Self::V, c: Self::V) -> Self::V;

    fn prep(self, x: Self::V) -> Self::Prep;

    /// `acc + c * x`.
    fn mul_add(self, acc: Self::V, x: Self::Prep, c: &Self::Coef) -> Self::V;

    /// `acc + c1 * x1 + c2 * x2`.
    fn mul_add2(
        self,
        acc: Self::V,
        x1: Self::Prep,
        c1: &Self::Coef,
        x2: Self::Prep,
        c2: &Self::Coef,
    ) -> Self::V;

    /// `c * x`.
    fn mul(self, x: Self::Prep, c: &Self::Coef) -> Self::V;
}

/// Everything a group kernel needs: inputs, up to a register file's worth of output rows, their
/// coefficients, and the byte range to cover.
#[derive(Debug)]
pub(crate) struct GroupJob<'a, 'i, 'o> {
    pub(crate) inputs: &'a [&'i [u8]],
    pub(crate) outputs: &'a mut [&'o mut [u8]],
    pub(crate) coefs: GroupCoefs<'a>,
    pub(crate) row0: RowZero,
    /// Add the products into the outputs instead of overwriting them.
    pub(crate) accumulate: bool,
    pub(crate) start: usize,
    pub(crate) end: usize,
}

/// Computes `outputs[r][start..] (+)= sum_j coefs[r][j] * inputs[j][start..]` in blocks of
/// `B` vectors, then single vectors, and returns where it stopped (less than one vector before
/// `end`; the caller finishes the tail).
#[inline(always)]
pub(super) fn mul_rows<S: Simd, const R: usize, const B: usize, const XOR0: bool>(
    s: S,
    job: &mut GroupJob<'_, '_, '_>,
) -> usize {
    if job.end - job.start >= STREAMING_MIN_BYTES {
        // From memory, one vector per input per step streams best; and when every output is
        // aligned, non-temporal stores skip reading each parity line before overwriting it.
        let aligned = job.outputs.iter().all(|o| (o.as_ptr().addr() + job.start).is_multiple_of(S::BYTES));
        let stream = aligned && !job.accumulate;
        let off = mul_rows_blocks::<S, R, 1, XOR0>(s, job, job.start, stream);
        if stream {
            s.fence();
        }
        return off;
    }
    let off = mul_rows_blocks::<S, R, B, XOR0>(s, job, job.start, false);
    mul_rows_blocks::<S, R, 1, XOR0>(s, job, off, false)
}

#[inline(always)]
fn mul_rows_blocks<S: Simd, const R: usize, const B: usize, const XOR0: bool>(
    s: S,
    job: &mut GroupJob<'_, '_, '_>,
    mut off: usize,
    stream: bool,
) -> usize {
    let k = job.coefs.cols;
    let ins = job.inputs;
    let outs = &mut *job.outputs;
    // These checks make every load and store below in bounds: each slice holds at least `end`
    // bytes and the loop only touches `off..off + B * BYTES` with `off + B * BYTES <= end`.
    assert!(k >= 1 && ins.len() == k && outs.len() == R);
    assert!(ins.iter().all(|x| x.len() >= job.end) && outs.iter().all(|x| x.len() >= job.end));
    let coefs = S::coefs(&job.coefs);
    assert!(coefs.len() == R * k);
    let rows: [&[S::Coef]; R] = core::array::from_fn(|r| &coefs[r * k..(r + 1) * k]);
    // With XOR0, row 0 adds inputs `0..ones` and ignores the rest.
    let ones = if XOR0 { job.row0.ones().expect("XOR0 kernels run XOR rows") } else { 0 };
    assert!(!XOR0 || (1..=k).contains(&ones));
    let fold = XOR0 && matches!(job.row0, RowZero::FoldXor { .. });
    let paired = XOR0 && job.row0.paired();
    assert!(!paired || (2 <= ones && ones < k));
    let col0_ones = job.coefs.col0_ones;
    let step = B * S::BYTES;

    while off + step <= job.end {
        // Input 0 initialises the accumulators.
        let x0 = load_block::<S, B>(s, ins[0], off);
        let mut acc = [x0; R];
        if !col0_ones {
            let p0 = prep_block::<S, B>(s, &x0);
            for r in 0..R {
                if !(XOR0 && r == 0) {
                    for b in 0..B {
                        acc[r][b] = s.mul(p0[b], &rows[r][0]);
                    }
                }
            }
        }
        if XOR0 && paired {
            add_inputs::<S, R, B, ROW0_XOR>(s, &mut acc, ins, off, &rows, 1..ones - 1);
            add_pair::<S, R, B>(s, &mut acc, ins, off, &rows, ones - 1, k - 1);
            add_inputs::<S, R, B, ROW0_SKIP>(s, &mut acc, ins, off, &rows, ones..k - 1);
        } else if XOR0 {
            add_inputs::<S, R, B, ROW0_XOR>(s, &mut acc, ins, off, &rows, 1..ones);
            add_inputs::<S, R, B, ROW0_SKIP>(s, &mut acc, ins, off, &rows, ones..k);
        } else {
            add_inputs::<S, R, B, ROW0_MUL>(s, &mut acc, ins, off, &rows, 1..k);
        }
        if fold {
            // Row 0 also adds every other output (see `RowZero::FoldXor`).
            for r in 1..R {
                for b in 0..B {
                    acc[0][b] = s.xor(acc[0][b], acc[r][b]);
                }
            }
        }
        for (r, out) in outs.iter_mut().enumerate() {
            for b in 0..B {
                let p = out.as_mut_ptr().wrapping_add(off + b * S::BYTES);
                let mut v = acc[r][b];
                if job.accumulate {
                    // SAFETY: `off + (b + 1) * BYTES <= end <= out.len()`.
                    v = s.xor(v, unsafe { s.load(p) });
                }
                if stream {
                    // SAFETY: as above, and `p` is aligned: the caller checked `out + start` is,
                    // and `off - start` is a multiple of `BYTES`.
                    unsafe { s.store_stream(p, v) };
                } else {
                    // SAFETY: as above; `out` is an exclusive borrow, so nothing else reads it.
                    unsafe { s.store(p, v) };
                }
            }
        }
        off += step;
    }
    off
}

/// Shards at least this long are streamed from memory rather than cache.
pub(super) const STREAMING_MIN_BYTES: usize = 256 * 1024;

/// Row 0 is multiplied like the others.
const ROW0_MUL: u8 = 0;
/// Row 0 adds these inputs with coefficient 1.
const ROW0_XOR: u8 = 1;
/// Row 0 does not depend on these inputs.
const ROW0_SKIP: u8 = 2;

/// `acc[r] += rows[r][j] * input[j]` for `j` in `inputs`, taking inputs in pairs so that each
/// accumulator takes one three-way XOR per pair.
#[inline(always)]
fn add_inputs<S: Simd, const R: usize, const B: usize, const ROW0: u8>(
    s: S,
    acc: &mut [[S::V; B]; R],
    ins: &[&[u8]],
    off: usize,
    rows: &[&[S::Coef]; R],
    inputs: core::ops::Range<usize>,
) {
    let mut j = inputs.start;
    while j + 1 < inputs.end {
        let x1 = load_block::<S, B>(s, ins[j], off);
        let x2 = load_block::<S, B>(s, ins[j + 1], off);
        let p1 = prep_block::<S, B>(s, &x1);
        let p2 = prep_block::<S, B>(s, &x2);
        for r in 0..R {
            for b in 0..B {
                acc[r][b] = match (r, ROW0) {
                    (0, ROW0_XOR) => s.xor3(acc[r][b], x1[b], x2[b]),
                    (0, ROW0_SKIP) => acc[r][b],
                    _ => s.mul_add2(acc[r][b], p1[b], &rows[r][j], p2[b], &rows[r][j + 1]),
                };
            }
        }
        j += 2;
    }
    if j < inputs.end {
        let x1 = load_block::<S, B>(s, ins[j], off);
        let p1 = prep_block::<S, B>(s, &x1);
        for r in 0..R {
            for b in 0..B {
                acc[r][b] = match (r, ROW0) {
                    (0, ROW0_XOR) => s.xor(acc[r][b], x1[b]),
                    (0, ROW0_SKIP) => acc[r][b],
                    _ => s.mul_add(acc[r][b], p1[b], &rows[r][j]),
                };
            }
        }
    }
}

/// Adds input `j1` to row 0, and `rows[r][j1] * (input j1 + input j2)` to the other rows (see
/// [`RowZero::paired`]).
#[inline(always)]
fn add_pair<S: Simd, const R: usize, const B: usize>(
    s: S,
    acc: &mut [[S::V; B]; R],
    ins: &[&[u8]],
    off: usize,
    rows: &[&[S::Coef]; R],
    j1: usize,
    j2: usize,
) {
    let x1 = load_block::<S, B>(s, ins[j1], off);
    let x2 = load_block::<S, B>(s, ins[j2], off);
    let mut sum = x1;
    for b in 0..B {
        sum[b] = s.xor(x1[b], x2[b]);
    }
    let p = prep_block::<S, B>(s, &sum);
    for b in 0..B {
        acc[0][b] = s.xor(acc[0][b], x1[b]);
    }
    for r in 1..R {
        for b in 0..B {
            acc[r][b] = s.mul_add(acc[r][b], p[b], &rows[r][j1]);
        }
    }
}

/// Loads `B` consecutive vectors of `input` from `off`. Plain loops, no closures: a closure
/// would be compiled without the entry point's target features and keep the intrinsics out of
/// line.
#[inline(always)]
fn load_block<S: Simd, const B: usize>(s: S, input: &[u8], off: usize) -> [S::V; B] {
    assert!(off + B * S::BYTES <= input.len());
    let mut x = [s.zero(); B];
    for b in 0..B {
        let p = input.as_ptr().wrapping_add(off + b * S::BYTES);
        // SAFETY: `off + (b + 1) * BYTES <= input.len()`, asserted above (and implied by the
        // caller's loop condition, so the check folds away).
        x[b] = unsafe { s.load(p) };
    }
    x
}

#[inline(always)]
fn prep_block<S: Simd, const B: usize>(s: S, x: &[S::V; B]) -> [S::Prep; B] {
    let mut p = [s.prep(x[0]); B];
    for b in 1..B {
        p[b] = s.prep(x[b]);
    }
    p
}

/// Adds `coefs[r] * (old + new)` (or `coefs[r] * old` without `new`) into `parity[r][start..]`
/// for the `R` rows of a group, and returns where it stopped (less than one vector before
/// `end`). With `XOR0`, row 0's coefficient is one: it takes the change as is.
#[inline(always)]
pub(super) fn update_rows<S: Simd, const R: usize, const B: usize, const XOR0: bool>(
    s: S,
    job: &mut UpdateJob<'_, '_>,
) -> usize {
    let off = update_rows_blocks::<S, R, B, XOR0>(s, job, job.start);
    update_rows_blocks::<S, R, 1, XOR0>(s, job, off)
}

/// The arguments of an incremental parity update over one byte range.
#[derive(Debug)]
pub(crate) struct UpdateJob<'a, 'b> {
    pub(crate) old: &'a [u8],
    pub(crate) new: Option<&'a [u8]>,
    pub(crate) parity: &'a mut [&'b mut [u8]],
    /// One row per parity shard of the group, one column (the changed data shard's).
    pub(crate) coefs: GroupCoefs<'a>,
    pub(crate) start: usize,
    pub(crate) end: usize,
}

#[inline(always)]
fn update_rows_blocks<S: Simd, const R: usize, const B: usize, const XOR0: bool>(
    s: S,
    job: &mut UpdateJob<'_, '_>,
    mut off: usize,
) -> usize {
    let (old, new) = (job.old, job.new);
    let parity = &mut *job.parity;
    let coefs = S::coefs(&job.coefs);
    // These checks put every access below in bounds (see `mul_rows_blocks`).
    assert!(job.coefs.cols == 1 && coefs.len() == R && parity.len() == R);
    assert!(!XOR0 || job.coefs.raw[0] == 1);
    assert!(old.len() >= job.end && new.is_none_or(|n| n.len() >= job.end));
    assert!(parity.iter().all(|p| p.len() >= job.end));
    let step = B * S::BYTES;
    while off + step <= job.end {
        let mut x = load_block::<S, B>(s, old, off);
        if let Some(new) = new {
            let y = load_block::<S, B>(s, new, off);
            for b in 0..B {
                x[b] = s.xor(x[b], y[b]);
            }
        }
        let p = prep_block::<S, B>(s, &x);
        // All loads of the step before any store, so no load waits behind a store.
        let mut v = [[s.zero(); B]; R];
        for r in 0..R {
            v[r] = load_block::<S, B>(s, parity[r], off);
        }
        for r in 0..R {
            let out = &mut *parity[r];
            let v = v[r];
            for b in 0..B {
                let v = if XOR0 && r == 0 { s.xor(v[b], x[b]) } else { s.mul_add(v[b], p[b], &coefs[r]) };
                let at = out.as_mut_ptr().wrapping_add(off + b * S::BYTES);
                // SAFETY: `off + (b + 1) * BYTES <= end <= out.len()`; `out` is an exclusive borrow.
                unsafe { s.store(at, v) };
            }
        }
        off += step;
    }
    off
}

/// Expands to a `match` on an update group's row count, like [`dispatch_rows`].
macro_rules! dispatch_update {
    ($token:expr, $job:expr, { $($rows:literal => $blocks:literal),* $(,)? }) => {{
        let xor0 = $job.coefs.raw.first() == Some(&1);
        match ($job.parity.len(), xor0) {
            $(
                ($rows, false) => $crate::engine::kernel::update_rows::<_, $rows, $blocks, false>($token, $job),
                ($rows, true) => $crate::engine::kernel::update_rows::<_, $rows, $blocks, true>($token, $job),
            )*
            (rows, _) => unreachable!("update group of {rows} rows exceeds this engine's group size"),
        }
    }};
}
pub(super) use dispatch_update;

/// Expands to a `match` on the group's row count that calls `mul_rows` with the register
/// blocking chosen for each count: `rows => blocks` pairs.
macro_rules! dispatch_rows {
    ($token:expr, $job:expr, { $($rows:literal => $blocks:literal),* $(,)? }) => {{
        let xor0 = $job.row0.ones().is_some();
        match ($job.outputs.len(), xor0) {
            $(
                ($rows, false) => $crate::engine::kernel::mul_rows::<_, $rows, $blocks, false>($token, $job),
                ($rows, true) => $crate::engine::kernel::mul_rows::<_, $rows, $blocks, true>($token, $job),
            )*
            (rows, _) => unreachable!("group of {rows} rows exceeds this engine's group size"),
        }
    }};
}
pub(super) use dispatch_rows;
