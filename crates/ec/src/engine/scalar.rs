//! The portable engine: one 256-byte row of the product table per coefficient, XOR for ones.
//!
//! Also finishes the last partial vector of every SIMD engine.

use super::kernel::{GroupJob, UpdateJob};
use crate::gf256::MUL_TABLE;

/// Bytes of each row processed before moving to the next row, so that the inputs stay in L1.
const BLOCK_BYTES: usize = 4096;

pub(super) fn mul_rows(job: &mut GroupJob<'_, '_, '_>) {
    let k = job.coefs.cols;
    let mut start = job.start;
    while start < job.end {
        let end = job.end.min(start + BLOCK_BYTES);
        for (r, out) in job.outputs.iter_mut().enumerate() {
            let out = &mut out[start..end];
            let row = &job.coefs.raw[r * k..(r + 1) * k];
            for (j, (input, &c)) in job.inputs.iter().zip(row).enumerate() {
                let input = &input[start..end];
                if j == 0 && !job.accumulate {
                    assign_product(out, input, c);
                } else {
                    add_product(out, input, c);
                }
            }
        }
        start = end;
    }
}

pub(super) fn update_rows(job: &mut UpdateJob<'_, '_>) {
    let range = job.start..job.end;
    let old = &job.old[range.clone()];
    let new = job.new.map(|n| &n[range.clone()]);
    for (out, &c) in job.parity.iter_mut().zip(job.coefs.raw) {
        let out = &mut out[range.clone()];
        add_product(out, old, c);
        if let Some(new) = new {
            add_product(out, new, c);
        }
    }
}

/// `out = c * input`.
fn assign_product(out: &mut [u8], input: &[u8], c: u8) {
    match c {
        0 => out.fill(0),
        1 => out.copy_from_slice(input),
        _ => {
            let table = &MUL_TABLE[usize::from(c)];
            for (o, &x) in out.iter_mut().zip(input) {
                *o = table[usize::from(x)];
            }
        }
    }
}

/// `out += c * input`.
fn add_product(out: &mut [u8], input: &[u8], c: u8) {
    match c {
        0 => {}
        1 => {
            for (o, &x) in out.iter_mut().zip(input) {
                *o ^= x;
            }
        }
        _ => {
            let table = &MUL_TABLE[usize::from(c)];
            for (o, &x) in out.iter_mut().zip(input) {
                *o ^= table[usize::from(x)];
            }
        }
    }
}
