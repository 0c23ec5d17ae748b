//! GFNI on 512-bit vectors: one `vgf2p8affineqb` per coefficient and vector, products folded
//! into the accumulators with `vpternlogd`.
//!
//! The coefficient operand is a 64-bit 8x8 bit matrix broadcast from memory (`{1to8}`), so a
//! coefficient costs one narrow load and no register.

use core::arch::x86_64::{
    __m512i, _mm_sfence, _mm512_gf2p8affine_epi64_epi8, _mm512_loadu_si512, _mm512_set1_epi64,
    _mm512_setzero_si512, _mm512_storeu_si512, _mm512_stream_si512, _mm512_ternarylogic_epi32,
    _mm512_xor_si512,
};

use super::kernel::{self, GroupJob, Simd, UpdateJob};
use super::tables::GroupCoefs;

/// Proof that the CPU has AVX-512F, AVX-512BW and GFNI.
#[derive(Clone, Copy)]
struct Token(());

impl Simd for Token {
    type V = __m512i;
    type Prep = __m512i;
    type Coef = u64;
    const BYTES: usize = 64;

    fn coefs<'a>(group: &GroupCoefs<'a>) -> &'a [u64] {
        group.affine
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
    fn prep(self, x: __m512i) -> __m512i {
        x
    }

    #[inline(always)]
    fn mul(self, x: __m512i, c: &u64) -> __m512i {
        // SAFETY: the token proves AVX-512F.
        let matrix = unsafe { _mm512_set1_epi64(i64::from_ne_bytes(c.to_ne_bytes())) };
        // SAFETY: the token proves GFNI and AVX-512F.
        unsafe { _mm512_gf2p8affine_epi64_epi8::<0>(x, matrix) }
    }

    #[inline(always)]
    fn mul_add(self, acc: __m512i, x: __m512i, c: &u64) -> __m512i {
        self.xor(acc, self.mul(x, c))
    }

    #[inline(always)]
    fn mul_add2(self, acc: __m512i, x1: __m512i, c1: &u64, x2: __m512i, c2: &u64) -> __m512i {
        self.xor3(acc, self.mul(x1, c1), self.mul(x2, c2))
    }
}

/// Runs a group of up to 8 rows; returns the offset reached (the caller does the tail).
///
/// # Safety
/// The CPU must support AVX-512F, AVX-512BW and GFNI.
#[target_feature(enable = "avx512f,avx512bw,gfni")]
pub(super) unsafe fn mul_group(job: &mut GroupJob<'_, '_, '_>) -> usize {
    let s = Token(());
    kernel::dispatch_rows!(s, job, { 1 => 4, 2 => 4, 3 => 4, 4 => 4, 5 => 2, 6 => 2, 7 => 2, 8 => 2 })
}

/// Runs an incremental parity update for a group of parity rows; returns the offset reached.
///
/// # Safety
/// The CPU must support AVX-512F, AVX-512BW and GFNI.
#[target_feature(enable = "avx512f,avx512bw,gfni")]
pub(super) unsafe fn update(job: &mut UpdateJob<'_, '_>) -> usize {
    kernel::dispatch_update!(Token(()), job, { 1 => 4, 2 => 4, 3 => 2, 4 => 2, 5 => 2, 6 => 2, 7 => 2, 8 => 2 })
}
