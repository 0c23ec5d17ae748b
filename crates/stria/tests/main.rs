//! Every integration test of the `stria` binary, in one test binary: each scenario file is a
//! module (one link of the dependency graph instead of one per file).

mod bench_pool;
mod cli_output;
mod common;
mod error_kinds;
mod exclusive_drives;
mod http_api;
mod no_clobber;
mod operator_safety;
mod operator_truths;
mod process_exits;
mod qos;
mod service;
