//! Every integration test of the erasure code, in one test binary: each scenario file is a module
//! (one link of the dependency graph instead of one per file).

mod bad_input_errors;
mod common;
mod decode_cache_bounds;
mod degraded_read_all_patterns;
mod encode_matches_reference;
mod partial_stripe_update;
