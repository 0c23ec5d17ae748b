//! Split-nibble multiplication on 128-bit vectors: `c * x = lo_c[x & 15] ^ hi_c[x >> 4]` with
//! two `pshufb` lookups. The fallback for x86-64 CPUs without AVX2.

use core::arch::x86_64::{
    __m128i, _mm_and_si128, _mm_loadu_si128, _mm_set1_epi8, _mm_setzero_si128, _mm_sfence, _mm_shuffle_epi8,
    _mm_srli_epi16, _mm_storeu_si128, _mm_stream_si128, _mm_xor_si128,
};

use super::kernel::{self, GroupJob, Simd, UpdateJob};
use super::tables::GroupCoefs;

/// Proof that the CPU has SSSE3.
#[derive(Clone, Copy)]
struct Token(());

impl Simd for Token {
    type V = __m128i;
    type Prep = (__m128i, __m128i);
    type Coef = [u8; 32];
    const BYTES: usize = 16;

    fn coefs<'a>(group: &GroupCoefs<'a>) -> &'a [[u8; 32]] {
        group.nibbles
    }

    #[inline(always)]
    unsafe fn load(self, p: *const u8) -> __m128i {
        // SAFETY: SSE2 is part of x86_64; the caller guarantees 16 readable bytes at `p`.
        unsafe { _mm_loadu_si128(p.cast()) }
    }

    #[inline(always)]
    unsafe fn store(self, p: *mut u8, v: __m128i) {
        // SAFETY: SSE2 is part of x86_64; the caller guarantees 16 writable bytes at `p`.
        unsafe { _mm_storeu_si128(p.cast(), v) }
    }

    #[inline(always)]
    unsafe fn store_stream(self, p: *mut u8, v: Self::V) {
        // SAFETY: the token proves SSE2; the caller guarantees `p` is writable and aligned.
        unsafe { _mm_stream_si128(p.cast(), v) }
    }

    #[inline(always)]
    fn fence(self) {
        // SAFETY: SSE is part of x86_64.
        unsafe { _mm_sfence() }
    }

    #[inline(always)]
    fn zero(self) -> __m128i {
        // SAFETY: the token proves SSE2, part of x86_64.
        unsafe { _mm_setzero_si128() }
    }

    #[inline(always)]
    fn xor(self, a: __m128i, b: __m128i) -> __m128i {
        // SAFETY: SSE2 is part of x86_64.
        unsafe { _mm_xor_si128(a, b) }
    }

    #[inline(always)]
    fn xor3(self, a: __m128i, b: __m128i, c: __m128i) -> __m128i {
        self.xor(self.xor(a, b), c)
    }

    #[inline(always)]
    fn prep(self, x: __m128i) -> (__m128i, __m128i) {
        // SAFETY: SSE2 is part of x86_64.
        let mask = unsafe { _mm_set1_epi8(0x0f) };
        // SAFETY: SSE2 is part of x86_64.
        let shifted = unsafe { _mm_srli_epi16::<4>(x) };
        // SAFETY: SSE2 is part of x86_64.
        let lo = unsafe { _mm_and_si128(x, mask) };
        // SAFETY: SSE2 is part of x86_64.
        let hi = unsafe { _mm_and_si128(shifted, mask) };
        (lo, hi)
    }

    #[inline(always)]
    fn mul(self, x: (__m128i, __m128i), c: &[u8; 32]) -> __m128i {
        let (lo, hi) = c.split_at(16);
        // SAFETY: `lo` is 16 readable bytes.
        let lo: __m128i = unsafe { _mm_loadu_si128(lo.as_ptr().cast()) };
        // SAFETY: `hi` is 16 readable bytes.
        let hi: __m128i = unsafe { _mm_loadu_si128(hi.as_ptr().cast()) };
        // SAFETY: the token proves SSSE3.
        let lo = unsafe { _mm_shuffle_epi8(lo, x.0) };
        // SAFETY: the token proves SSSE3.
        let hi = unsafe { _mm_shuffle_epi8(hi, x.1) };
        self.xor(lo, hi)
    }

    #[inline(always)]
    fn mul_add(self, acc: __m128i, x: (__m128i, __m128i), c: &[u8; 32]) -> __m128i {
        self.xor(acc, self.mul(x, c))
    }

    #[inline(always)]
    fn mul_add2(
        self,
        acc: __m128i,
        x1: (__m128i, __m128i),
        c1: &[u8; 32],
        x2: (__m128i, __m128i),
        c2: &[u8; 32],
    ) -> __m128i {
        self.xor(acc, self.xor(self.mul(x1, c1), self.mul(x2, c2)))
    }
}

/// Runs a group of up to 4 rows; returns the offset reached (the caller does the tail).
///
/// # Safety
/// The CPU must support SSSE3.
#[target_feature(enable = "ssse3")]
pub(super) unsafe fn mul_group(job: &mut GroupJob<'_, '_, '_>) -> usize {
    let s = Token(());
    kernel::dispatch_rows!(s, job, { 1 => 2, 2 => 2, 3 => 1, 4 => 1 })
}

/// Runs an incremental parity update for a group of parity rows; returns the offset reached.
///
/// # Safety
/// The CPU must support SSSE3.
#[target_feature(enable = "ssse3")]
pub(super) unsafe fn update(job: &mut UpdateJob<'_, '_>) -> usize {
    kernel::dispatch_update!(Token(()), job, { 1 => 2, 2 => 2, 3 => 2, 4 => 2 })
}
