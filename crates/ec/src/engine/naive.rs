//! The reference engine: byte-at-a-time log/exp arithmetic, no tables shared with the others.
//!
//! It ignores every shortcut the fast engines take (XOR rows, folded rows, unit columns) and
//! computes each output byte straight from the raw coefficients, which is what makes it a useful
//! oracle for them.

use super::kernel::{GroupJob, UpdateJob};
use crate::gf256;

pub(super) fn mul_rows(job: &mut GroupJob<'_, '_, '_>) {
    let k = job.coefs.cols;
    for (r, out) in job.outputs.iter_mut().enumerate() {
        let row = &job.coefs.raw[r * k..(r + 1) * k];
        for i in job.start..job.end {
            let mut v = if job.accumulate { out[i] } else { 0 };
            for (input, &c) in job.inputs.iter().zip(row) {
                v ^= gf256::mul(c, input[i]);
            }
            out[i] = v;
        }
    }
}

pub(super) fn update_rows(job: &mut UpdateJob<'_, '_>) {
    for (out, &c) in job.parity.iter_mut().zip(job.coefs.raw) {
        for i in job.start..job.end {
            let delta = job.old[i] ^ job.new.map_or(0, |n| n[i]);
            out[i] ^= gf256::mul(c, delta);
        }
    }
}
