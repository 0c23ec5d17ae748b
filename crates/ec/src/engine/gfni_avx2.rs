//! GFNI on 256-bit vectors (CPUs with GFNI but without AVX-512, and Zen 4-like cores where the
//! narrower vectors cost the same per byte): one `vgf2p8affineqb` per coefficient and vector.
//!
//! There is no three-way XOR without AVX-512VL, so products are added with plain `vpxor`.

use core::arch::x86_64::{
    __m256i, _mm_sfence, _mm256_gf2p8affine_epi64_epi8, _mm256_loadu_si256, _mm256_set1_epi64x,
    _mm256_setzero_si256, _mm256_storeu_si256, _mm256_stream_si256, _mm256_xor_si256,
};

use super::kernel::{self, GroupJob, Simd, UpdateJob};
use super::tables::GroupCoefs;

/// Proof that the CPU has AVX2 and GFNI.
#[derive(Clone, Copy)]
struct Token(());

impl Simd for Token {
    type V = __m256i;
    type Prep = __m256i;
    type Coef = u64;
    const BYTES: usize = 32;

    fn coefs<'a>(group: &GroupCoefs<'a>) -> &'a [u64] {
        group.affine
    }

    #[inline(always)]
    unsafe fn load(self, p: *const u8) -> __m256i {
        // SAFETY: the token proves AVX; the caller guarantees 32 readable bytes at `p`.
        unsafe { _mm256_loadu_si256(p.cast()) }
    }

    #[inline(always)]
    unsafe fn store(self, p: *mut u8, v: __m256i) {
        // SAFETY: the token proves AVX; the caller guarantees 32 writable bytes at `p`.
        unsafe { _mm256_storeu_si256(p.cast(), v) }
    }

    #[inline(always)]
    unsafe fn store_stream(self, p: *mut u8, v: Self::V) {
        // SAFETY: the token proves AVX; the caller guarantees `p` is writable and aligned.
        unsafe { _mm256_stream_si256(p.cast(), v) }
    }

    #[inline(always)]
    fn fence(self) {
        // SAFETY: SSE is part of x86_64.
        unsafe { _mm_sfence() }
    }

    #[inline(always)]
    fn zero(self) -> __m256i {
        // SAFETY: the token proves AVX.
        unsafe { _mm256_setzero_si256() }
    }

    #[inline(always)]
    fn xor(self, a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: the token proves AVX2.
        unsafe { _mm256_xor_si256(a, b) }
    }

    #[inline(always)]
    fn xor3(self, a: __m256i, b: __m256i, c: __m256i) -> __m256i {
        self.xor(self.xor(a, b), c)
    }

    #[inline(always)]
    fn prep(self, x: __m256i) -> __m256i {
        x
    }

    #[inline(always)]
    fn mul(self, x: __m256i, c: &u64) -> __m256i {
        // SAFETY: the token proves AVX.
        let matrix = unsafe { _mm256_set1_epi64x(i64::from_ne_bytes(c.to_ne_bytes())) };
        // SAFETY: the token proves GFNI and AVX.
        unsafe { _mm256_gf2p8affine_epi64_epi8::<0>(x, matrix) }
    }

    #[inline(always)]
    fn mul_add(self, acc: __m256i, x: __m256i, c: &u64) -> __m256i {
        self.xor(acc, self.mul(x, c))
    }

    #[inline(always)]
    fn mul_add2(self, acc: __m256i, x1: __m256i, c1: &u64, x2: __m256i, c2: &u64) -> __m256i {
        // Two independent chains keep the XOR latency off the critical path.
        self.xor(acc, self.xor(self.mul(x1, c1), self.mul(x2, c2)))
    }
}

/// Runs a group of up to 4 rows; returns the offset reached (the caller does the tail).
///
/// # Safety
/// The CPU must support AVX2 and GFNI.
#[target_feature(enable = "avx2,gfni")]
pub(super) unsafe fn mul_group(job: &mut GroupJob<'_, '_, '_>) -> usize {
    let s = Token(());
    kernel::dispatch_rows!(s, job, { 1 => 4, 2 => 4, 3 => 2, 4 => 2 })
}

/// Runs an incremental parity update for a group of parity rows; returns the offset reached.
///
/// # Safety
/// The CPU must support AVX2 and GFNI.
#[target_feature(enable = "avx2,gfni")]
pub(super) unsafe fn update(job: &mut UpdateJob<'_, '_>) -> usize {
    kernel::dispatch_update!(Token(()), job, { 1 => 4, 2 => 2, 3 => 2, 4 => 2 })
}
