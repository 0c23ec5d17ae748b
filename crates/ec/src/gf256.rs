//! Arithmetic in GF(2^8) with the primitive polynomial x^8 + x^4 + x^3 + x^2 + 1 (0x11d).
//!
//! Addition is XOR. Multiplication is done three ways, each for a different consumer:
//! - [`mul`] through log/exp tables: matrix construction and inversion;
//! - [`mul_slow`] by shift-and-add: the reference engine, so that it shares no table with the fast
//!   paths it checks;
//! - [`MUL_TABLE`], a full 256 x 256 product table: the portable scalar engine.
//!
//! The SIMD engines use per-coefficient encodings built here: [`nibble_table`] (two 16-entry
//! lookup tables for the split-nibble `pshufb` method) and [`affine_matrix`] (the 8x8 bit matrix of
//! "multiply by c" for `gf2p8affineqb`).

/// The low byte of the field polynomial x^8 + x^4 + x^3 + x^2 + 1.
pub const POLY_LOW: u8 = 0x1d;

/// Multiplies by shift-and-add (Russian peasant); no tables. Slow, obviously correct.
#[must_use]
pub const fn mul_slow(mut a: u8, mut b: u8) -> u8 {
    let mut product = 0u8;
    while b != 0 {
        if b & 1 != 0 {
            product ^= a;
        }
        let carry = a & 0x80 != 0;
        a <<= 1;
        if carry {
            a ^= POLY_LOW;
        }
        b >>= 1;
    }
    product
}

const fn build_exp() -> [u8; 512] {
    let mut exp = [0u8; 512];
    let mut x = 1u8;
    let mut i = 0;
    while i < 255 {
        exp[i] = x;
        exp[i + 255] = x;
        x = mul_slow(x, 2);
        i += 1;
    }
    // exp[510] and exp[511] are never read: log values are < 255, so sums are < 510.
    exp
}

// Indices here are < 256 by the loop bounds.
#[allow(clippy::cast_possible_truncation)]
const fn build_log(exp: &[u8; 512]) -> [u8; 256] {
    let mut log = [0u8; 256];
    let mut i = 0;
    while i < 255 {
        log[exp[i] as usize] = i as u8;
        i += 1;
    }
    log
}

/// `EXP[i] = 2^i`, doubled so that `EXP[LOG[a] + LOG[b]]` needs no reduction modulo 255.
static EXP: [u8; 512] = build_exp();
/// `LOG[a]` for a != 0 (`LOG[0]` is unused and 0).
static LOG: [u8; 256] = build_log(&EXP);

/// Multiplies two field elements through log/exp tables.
#[must_use]
#[inline]
pub fn mul(a: u8, b: u8) -> u8 {
    if a == 0 || b == 0 {
        return 0;
    }
    EXP[usize::from(LOG[usize::from(a)]) + usize::from(LOG[usize::from(b)])]
}

/// The multiplicative inverse of a non-zero element. Zero has none: asking for it is a bug.
#[must_use]
pub fn inv(a: u8) -> u8 {
    assert!(a != 0, "zero has no inverse in GF(2^8)");
    EXP[255 - usize::from(LOG[usize::from(a)])]
}

// Indices here are < 256 by the loop bounds.
#[allow(clippy::cast_possible_truncation)]
const fn build_mul_table() -> [[u8; 256]; 256] {
    let mut table = [[0u8; 256]; 256];
    let mut c = 1;
    while c < 256 {
        // Row c is linear in x: fill it from the products with single bits.
        let mut bit = 0;
        while bit < 8 {
            table[c][1 << bit] = mul_slow(c as u8, 1 << bit);
            bit += 1;
        }
        let mut x: usize = 3;
        while x < 256 {
            let high = 1usize << (usize::BITS - 1 - x.leading_zeros());
            if high != x {
                table[c][x] = table[c][high] ^ table[c][x ^ high];
            }
            x += 1;
        }
        c += 1;
    }
    table
}

/// `MUL_TABLE[c][x] = c * x`: 64 KiB, read one 256-byte row per coefficient by the scalar engine.
pub static MUL_TABLE: [[u8; 256]; 256] = build_mul_table();

/// Split-nibble tables for "multiply by `c`": bytes 0..16 hold `c * n`, bytes 16..32 hold
/// `c * (n << 4)`, so that `c * x = lo[x & 15] ^ hi[x >> 4]`.
#[must_use]
pub fn nibble_table(c: u8) -> [u8; 32] {
    let row = &MUL_TABLE[usize::from(c)];
    let mut table = [0u8; 32];
    for n in 0..16 {
        table[n] = row[n];
        table[16 + n] = row[n << 4];
    }
    table
}

/// The 8x8 GF(2) matrix of "multiply by `c`" in the layout `gf2p8affineqb` expects.
///
/// The instruction computes output bit `i` of each byte as the parity of `x & A.byte[7 - i]`.
/// Output bit `i` of `c * x` is the XOR over the set input bits `j` of bit `i` of `c * 2^j`, so
/// byte `7 - i` of the matrix has bit `j` set iff bit `i` of `c * 2^j` is set.
#[must_use]
pub fn affine_matrix(c: u8) -> u64 {
    AFFINE_TABLE[usize::from(c)]
}

// Indices here are < 256 by the loop bounds.
#[allow(clippy::cast_possible_truncation)]
const fn build_affine_table() -> [u64; 256] {
    let mut table = [0u64; 256];
    let mut c = 0;
    while c < 256 {
        let mut in_bit = 0;
        while in_bit < 8 {
            let column = mul_slow(c as u8, 1 << in_bit);
            let mut out_bit = 0;
            while out_bit < 8 {
                if (column >> out_bit) & 1 != 0 {
                    table[c] |= 1 << (8 * (7 - out_bit) + in_bit);
                }
                out_bit += 1;
            }
            in_bit += 1;
        }
        c += 1;
    }
    table
}

/// `AFFINE_TABLE[c]` is [`affine_matrix`]`(c)`, computed at compile time.
static AFFINE_TABLE: [u64; 256] = build_affine_table();

/// Applies an affine matrix to one byte the way `gf2p8affineqb` does (imm8 = 0); for tests.
#[cfg(test)]
fn apply_affine(matrix: u64, x: u8) -> u8 {
    let mut out = 0u8;
    for out_bit in 0..8 {
        let row = matrix.to_be_bytes()[out_bit];
        if (row & x).count_ones() % 2 == 1 {
            out |= 1 << out_bit;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_cycles_through_every_non_zero_element() {
        let mut seen = [false; 256];
        for i in 0..255 {
            assert!(!seen[usize::from(EXP[i])]);
            seen[usize::from(EXP[i])] = true;
        }
        assert!(!seen[0]);
    }

    #[test]
    fn the_three_multiplications_agree() {
        for a in 0..=255u8 {
            for b in 0..=255u8 {
                let expected = mul_slow(a, b);
                assert_eq!(mul(a, b), expected, "{a} * {b}");
                assert_eq!(MUL_TABLE[usize::from(a)][usize::from(b)], expected);
            }
        }
    }

    #[test]
    fn field_axioms_hold() {
        for a in 1..=255u8 {
            assert_eq!(mul(a, inv(a)), 1);
            assert_eq!(mul(a, 1), a);
            for b in [1u8, 2, 3, 0x53, 0xca, 0xff] {
                assert_eq!(mul(a, b), mul(b, a));
                for c in [7u8, 0x8e] {
                    assert_eq!(mul(a, b ^ c), mul(a, b) ^ mul(a, c));
                }
            }
        }
    }

    #[test]
    fn nibble_tables_and_affine_matrices_multiply() {
        for c in 0..=255u8 {
            let table = nibble_table(c);
            let matrix = affine_matrix(c);
            for x in 0..=255u8 {
                let expected = mul(c, x);
                let split = table[usize::from(x & 15)] ^ table[16 + usize::from(x >> 4)];
                assert_eq!(split, expected);
                assert_eq!(apply_affine(matrix, x), expected);
            }
        }
    }
}
