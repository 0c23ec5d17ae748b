//! The slice protocol of a stria cluster (docs/design/cluster.md).
//!
//! Every node serves slices of its drives to the coordinators of volumes ([`server`]); a
//! coordinator uses each as a drive through [`RemoteDevice`], so a cluster volume is a pool
//! whose drives are slices on several nodes. The protocol is small, framed and pipelined
//! ([`wire`]). Its safety rule: a slice executes a request only at its own persisted epoch,
//! and a FENCE raises that epoch (persisted) once the requests of the old one have finished,
//! so an owner that a newer one fenced can never complete a write on that slice again.

// Offsets and lengths are u64 on the wire and usize in buffers; stria is built for 64-bit only.
#![allow(clippy::cast_possible_truncation)]

pub mod client;
pub mod fuzzing;
pub mod server;
pub mod slice;
pub mod testing;
pub mod wire;

pub use client::{RemoteDevice, SliceInfo};
pub use server::{SliceSet, serve, serve_connection};
pub use slice::{Slice, SliceCounters, SliceError, SliceHeader};
