//! Systematic Reed-Solomon erasure coding over GF(2^8), with SIMD engines chosen at run time.
//!
//! A stripe has `K` data shards and `M` parity shards (`K, M >= 1`, `K + M <= 255`), all of the
//! same length. Any `K` of them determine the other `M`:
//!
//! - [`ReedSolomon::encode`] computes the parity from the data;
//! - [`ReedSolomon::reconstruct`] rebuilds any missing shards, data or parity, from any `K`
//!   survivors, computing only the shards asked for;
//! - [`ReedSolomon::verify`] checks a full stripe;
//! - [`ReedSolomon::update`] and [`ReedSolomon::update_delta`] patch the parity after a partial
//!   write, from the old and new contents of the changed shard alone.
//!
//! The generator is `[I; C]` with `C` a Cauchy matrix scaled so that its first row and column
//! are ones: parity 0 is the XOR of the data (with `M = 1` this is RAID-5; with `M = 2`, RAID-6),
//! and every square submatrix of `C` is invertible, which is what makes any `K` shards enough.
//!
//! The arithmetic runs on the fastest engine the CPU has (GFNI, AVX-512BW, AVX2, SSSE3 or
//! portable code; see [`Backend`]), picked once per codec.
//!
//! # Example
//!
//! ```
//! use stria_ec::ReedSolomon;
//!
//! let rs = ReedSolomon::new(4, 2)?;
//! let data: Vec<Vec<u8>> = (0..4u8).map(|i| vec![i; 4096]).collect();
//! let mut parity = vec![vec![0u8; 4096]; 2];
//! {
//!     let data: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
//!     let mut parity: Vec<&mut [u8]> = parity.iter_mut().map(Vec::as_mut_slice).collect();
//!     rs.encode(&data, &mut parity)?;
//! }
//!
//! // Lose data shard 1 and parity shard 0 (shard 4), then rebuild data shard 1.
//! let shards = [Some(&data[0][..]), None, Some(&data[2][..]), Some(&data[3][..]), None, Some(&parity[1][..])];
//! let mut rebuilt = vec![0u8; 4096];
//! rs.reconstruct(&shards, &mut [(1, &mut rebuilt[..])])?;
//! assert_eq!(rebuilt, data[1]);
//!
//! // A partial write to data shard 2: patch the parity without reading shards 0, 1 and 3.
//! let new = vec![0xa5u8; 4096];
//! {
//!     let mut parity: Vec<&mut [u8]> = parity.iter_mut().map(Vec::as_mut_slice).collect();
//!     rs.update(2, &data[2], &new, &mut parity)?;
//! }
//! let stripe = [&data[0][..], &data[1][..], &new[..], &data[3][..], &parity[0][..], &parity[1][..]];
//! assert!(rs.verify(&stripe)?);
//! # Ok::<(), stria_ec::EcError>(())
//! ```

mod cache;
mod codec;
mod decode;
mod engine;
mod error;
pub mod gf256;
mod matrix;

pub use cache::DEFAULT_DECODE_CACHE_ENTRIES;
pub use codec::{Config, MAX_TOTAL_SHARDS, ReedSolomon};
pub use engine::Backend;
pub use error::EcError;

/// The name of the engine [`ReedSolomon::new`] picks on this CPU, e.g. `gfni-avx512`.
#[must_use]
pub fn backend_name() -> &'static str {
    Backend::detect().name()
}
