//! The cluster's scenarios against a real etcd (Debian etcd-server; scripts/test.sh installs
//! it) and slice servers on 127.0.0.1, in one test binary.

// Test patterns truncate on purpose; stria is built for 64-bit only.
#![allow(clippy::cast_possible_truncation)]

mod common;
mod forward;
mod ownership;
mod repair;
mod simulation;
mod takeover;
