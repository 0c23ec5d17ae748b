//! The errors the codec returns for bad input. None of them leaves an output half written.

use crate::Backend;

/// Why an erasure-code operation refused its input.
///
/// Every operation checks its arguments before it touches an output buffer, so on error the
/// outputs hold what they held before the call.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EcError {
    /// data_shards must be at least 1, got {data_shards}
    #[error("data_shards must be at least 1, got {data_shards}")]
    InvalidDataShards {
        /// The requested number of data shards.
        data_shards: usize,
    },
    /// parity_shards must be at least 1, got {parity_shards}
    #[error("parity_shards must be at least 1, got {parity_shards}")]
    InvalidParityShards {
        /// The requested number of parity shards.
        parity_shards: usize,
    },
    /// data_shards + parity_shards must be at most 255
    #[error("data_shards + parity_shards must be at most {max}, got {data_shards} + {parity_shards}")]
    TooManyShards {
        /// The requested number of data shards.
        data_shards: usize,
        /// The requested number of parity shards.
        parity_shards: usize,
        /// The largest supported total.
        max: usize,
    },
    /// A list of shards or buffers has the wrong number of entries.
    #[error("expected {expected} {what}, got {actual}")]
    WrongShardCount {
        /// Which list: "data shards", "parity shards", "shards", ...
        what: &'static str,
        /// How many entries the codec needs.
        expected: usize,
        /// How many it was given.
        actual: usize,
    },
    /// A shard's length differs from the others'.
    #[error("shard {index} is {actual_bytes} bytes, expected {expected_bytes} like the others")]
    ShardLengthMismatch {
        /// The position of the offending shard in the stripe (data first, then parity).
        index: usize,
        /// The length of the other shards.
        expected_bytes: usize,
        /// The length of this one.
        actual_bytes: usize,
    },
    /// More shards are missing than the parity can restore.
    #[error("{missing} shards are missing but only {parity_shards} can be rebuilt")]
    TooManyErasures {
        /// Shards missing from the stripe.
        missing: usize,
        /// The number of parity shards, the most that can be missing.
        parity_shards: usize,
    },
    /// A shard index is past the end of the stripe.
    #[error("shard index {index} is out of range for a stripe of {shards} shards")]
    ShardIndexOutOfRange {
        /// The index given.
        index: usize,
        /// `data_shards + parity_shards`, or `data_shards` where a data shard is meant.
        shards: usize,
    },
    /// A shard was asked to be rebuilt twice in one call.
    #[error("shard {index} is requested more than once")]
    DuplicateShard {
        /// The repeated index.
        index: usize,
    },
    /// A shard asked to be rebuilt is present in the input.
    #[error("shard {index} is present; only missing shards are rebuilt")]
    ShardNotMissing {
        /// The index of the present shard.
        index: usize,
    },
    /// An output buffer overlaps an input buffer or another output.
    #[error("output buffer {output} overlaps {other}")]
    OutputAliasesInput {
        /// The position of the output in its list.
        output: usize,
        /// What it overlaps, e.g. "input 3" or "output 0".
        other: String,
    },
    /// The requested backend cannot run on this CPU.
    #[error("backend {backend} is not supported by this CPU")]
    UnsupportedBackend {
        /// The backend asked for.
        backend: Backend,
    },
}
