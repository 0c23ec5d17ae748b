//! Split-nibble multiplication on 256-bit vectors: `c * x = lo_c[x & 15] ^ hi_c[x >> 4]`, two
//! `vpshufb` lookups into 16-byte tables broadcast to both 128-bit lanes.

use core::arch::x86_64::{
    __m128i, __m256i, _mm_loadu_si128, _mm_sfence, _mm256_and_si256, _mm256_broadcastsi128_si256,
    _mm256_loadu_si256, _mm256_set1_epi8, _mm256_setzero_si256, _mm256_shuffle_epi8, _mm256_srli_epi16,
    _mm256_storeu_si256, _mm256_stream_si256, _mm256_xor_si256,
};

use super::kernel::{self, GroupJob, Simd, UpdateJob};
use super::tables::GroupCoefs;

/// Proof that the CPU has AVX2.
#[derive(Clone, Copy)]
struct Token(());

impl Simd for Token {
    type V = __m256i;
    type Prep = (__m256i, __m256i);
    type Coef = [u8; 32];
    const BYTES: usize = 32;

    fn coefs<'a>(group: &GroupCoefs<'a>) -> &'a [[u8; 32]] {
        group.nibbles
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
    fn prep(self, x: __m256i) -> (__m256i, __m256i) {
        // SAFETY: the token proves AVX.
        let mask = unsafe { _mm256_set1_epi8(0x0f) };
        // SAFETY: the token proves AVX2.
        let shifted = unsafe { _mm256_srli_epi16::<4>(x) };
        // SAFETY: the token proves AVX2.
        let lo = unsafe { _mm256_and_si256(x, mask) };
        // SAFETY: the token proves AVX2.
        let hi = unsafe { _mm256_and_si256(shifted, mask) };
        (lo, hi)
    }

    #[inline(always)]
    fn mul(self, x: (__m256i, __m256i), c: &[u8; 32]) -> __m256i {
        let (lo, hi) = c.split_at(16);
        // SAFETY: `lo` is 16 readable bytes; SSE2 is part of x86_64.
        let lo: __m128i = unsafe { _mm_loadu_si128(lo.as_ptr().cast()) };
        // SAFETY: `hi` is 16 readable bytes.
        let hi: __m128i = unsafe { _mm_loadu_si128(hi.as_ptr().cast()) };
        // SAFETY: the token proves AVX2.
        let lo = unsafe { _mm256_broadcastsi128_si256(lo) };
        // SAFETY: the token proves AVX2.
        let hi = unsafe { _mm256_broadcastsi128_si256(hi) };
        // SAFETY: the token proves AVX2.
        let lo = unsafe { _mm256_shuffle_epi8(lo, x.0) };
        // SAFETY: the token proves AVX2.
        let hi = unsafe { _mm256_shuffle_epi8(hi, x.1) };
        self.xor(lo, hi)
    }

    #[inline(always)]
    fn mul_add(self, acc: __m256i, x: (__m256i, __m256i), c: &[u8; 32]) -> __m256i {
        self.xor(acc, self.mul(x, c))
    }

    #[inline(always)]
    fn mul_add2(
        self,
        acc: __m256i,
        x1: (__m256i, __m256i),
        c1: &[u8; 32],
        x2: (__m256i, __m256i),
        c2: &[u8; 32],
    ) -> __m256i {
        self.xor(acc, self.xor(self.mul(x1, c1), self.mul(x2, c2)))
    }
}

/// Runs a group of up to 4 rows; returns the offset reached (the caller does the tail).
///
/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn mul_group(job: &mut GroupJob<'_, '_, '_>) -> usize {
    let s = Token(());
    kernel::dispatch_rows!(s, job, { 1 => 2, 2 => 2, 3 => 1, 4 => 1 })
}

/// Runs an incremental parity update for a group of parity rows; returns the offset reached.
///
/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn update(job: &mut UpdateJob<'_, '_>) -> usize {
    kernel::dispatch_update!(Token(()), job, { 1 => 2, 2 => 2, 3 => 2, 4 => 2 })
}
