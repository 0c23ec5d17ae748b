//! Systematic Reed-Solomon erasure coding over GF(2^8) with runtime-dispatched SIMD kernels.
