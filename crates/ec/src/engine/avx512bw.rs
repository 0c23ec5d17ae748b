//! Split-nibble multiplication on 512-bit vectors: `c * x = lo_c[x & 15] ^ hi_c[x >> 4]`, two
//! `vpshufb` lookups into 16-byte tables broadcast to every 128-bit lane, added into the
//! accumulator with one `vpternlogd`.

use core::arch::x86_64::{
    __m128i, __m512i, _mm_loadu_si128, _mm_sfence, _mm512_and_si512, _mm512_broadcast_i32x4,
    _mm512_loadu_si512, _mm512_set1_epi8, _mm512_setzero_si512, _mm512_shuffle_epi8, _mm512_srli_epi16,
    _mm512_storeu_si512, _mm512_stream_si512, _mm512_ternarylogic_epi32, _mm512_xor_si512,
};

use super::kernel::{self, GroupJob, Simd, UpdateJob};
use super::tables::GroupCoefs;

/// Proof that the CPU has AVX-512F and AVX-512BW.
#[derive(Clone, Copy)]
struct Token(());

impl Token {
    /// The low- and high-nibble tables of a coefficient, in every lane.
    #[inline(always)]
    fn tables(self, c: &[u8; 32]) -> (__m512i, __m512i) {
        let (lo, hi) = c.split_at(16);
        // SAFETY: `lo` is 16 readable bytes; SSE2 is part of x86_64.
        let lo: __m128i = unsafe { _mm_loadu_si128(lo.as_ptr().cast()) };
        // SAFETY: `hi` is 16 readable bytes.
        let hi: __m128i = unsafe { _mm_loadu_si128(hi.as_ptr().cast()) };
        // SAFETY: the token proves AVX-512F.
        let lo = unsafe { _mm512_broadcast_i32x4(lo) };
        // SAFETY: the token proves AVX-512F.
        let hi = unsafe { _mm512_broadcast_i32x4(hi) };
        (lo, hi)
    }

    #[inline(always)]
    fn lookups(self, x: (__m512i, __m512i), c: &[u8; 32]) -> (__m512i, __m512i) {
        let (lo, hi) = self.tables(c);
        // SAFETY: the token proves AVX-512BW.
        let lo = unsafe { _mm512_shuffle_epi8(lo, x.0) };
        // SAFETY: the token proves AVX-512BW.
        let hi = unsafe { _mm512_shuffle_epi8(hi, x.1) };
        (lo, hi)
    }
}

impl Simd for Token {
    type V = __m512i;
    type Prep = (__m512i, __m512i);
    type Coef = [u8; 32];
    const BYTES: usize = 64;

    fn coefs<'a>(group: &GroupCoefs<'a>) -> &'a [[u8; 32]] {
        group.nibbles
    }

    #[inline(always)]
    unsafe fn load(self, p: *const u8) -> __m512i {
        // SAFETY: the token proves AVX-512F; the caller guarantees 64 readable bytes at `p`.
        unsafe { _mm512_loadu_si512(p.cast()) }
    }

    #[inline(always)]
    unsafe fn store(self, p: *mut u8, v: __m512i) {
        // SAFETY: the token proves AVX-512F; the caller guarantees 64 writable bytes at `p`.
        unsafe { _mm512_storeu_si512(p.cast(), v) }
    }

    #[inline(always)]
    unsafe fn store_stream(self, p: *mut u8, v: Self::V) {
        // SAFETY: the token proves AVX-512F; the caller guarantees `p` is writable and aligned.
        unsafe { _mm512_stream_si512(p.cast(), v) }
    }

    #[inline(always)]
    fn fence(self) {
        // SAFETY: SSE is part of x86_64.
        unsafe { _mm_sfence() }
    }

    #[inline(always)]
    fn zero(self) -> __m512i {
        // SAFETY: the token proves AVX-512F.
        unsafe { _mm512_setzero_si512() }
    }

    #[inline(always)]
    fn xor(self, a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: the token proves AVX-512F.
        unsafe { _mm512_xor_si512(a, b) }
    }

    #[inline(always)]
    fn xor3(self, a: __m512i, b: __m512i, c: __m512i) -> __m512i {
        // SAFETY: the token proves AVX-512F. 0x96 is the truth table of a ^ b ^ c.
        unsafe { _mm512_ternarylogic_epi32::<0x96>(a, b, c) }
    }

    #[inline(always)]
    fn prep(self, x: __m512i) -> (__m512i, __m512i) {
        // SAFETY: the token proves AVX-512BW.
        let mask = unsafe { _mm512_set1_epi8(0x0f) };
        // SAFETY: the token proves AVX-512BW.
        let shifted = unsafe { _mm512_srli_epi16::<4>(x) };
        // SAFETY: the token proves AVX-512F.
        let lo = unsafe { _mm512_and_si512(x, mask) };
        // SAFETY: the token proves AVX-512F.
        let hi = unsafe { _mm512_and_si512(shifted, mask) };
        (lo, hi)
    }

    #[inline(always)]
    fn mul(self, x: (__m512i, __m512i), c: &[u8; 32]) -> __m512i {
        let (lo, hi) = self.lookups(x, c);
        self.xor(lo, hi)
    }

    #[inline(always)]
    fn mul_add(self, acc: __m512i, x: (__m512i, __m512i), c: &[u8; 32]) -> __m512i {
        let (lo, hi) = self.lookups(x, c);
        self.xor3(acc, lo, hi)
    }

    #[inline(always)]
    fn mul_add2(
        self,
        acc: __m512i,
        x1: (__m512i, __m512i),
        c1: &[u8; 32],
        x2: (__m512i, __m512i),
        c2: &[u8; 32],
    ) -> __m512i {
        self.mul_add(self.mul_add(acc, x1, c1), x2, c2)
    }
}

/// Runs a group of up to 8 rows; returns the offset reached (the caller does the tail).
///
/// # Safety
/// The CPU must support AVX-512F and AVX-512BW.
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn mul_group(job: &mut GroupJob<'_, '_, '_>) -> usize {
    let s = Token(());
    kernel::dispatch_rows!(s, job, { 1 => 4, 2 => 4, 3 => 2, 4 => 2, 5 => 2, 6 => 2, 7 => 1, 8 => 1 })
}

/// Runs an incremental parity update for a group of parity rows; returns the offset reached.
///
/// # Safety
/// The CPU must support AVX-512F and AVX-512BW.
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn update(job: &mut UpdateJob<'_, '_>) -> usize {
    kernel::dispatch_update!(Token(()), job, { 1 => 4, 2 => 4, 3 => 2, 4 => 2, 5 => 2, 6 => 2, 7 => 2, 8 => 2 })
}
