//! Every integration test of the catalog, in one test binary: the volume contract's conformance
//! suite over every kind of volume the catalog hands out (`conformance/`), and the catalog's own
//! operations.
#![allow(clippy::cast_possible_truncation)] // 64-bit only, like the engine; test sizes are small
#![allow(unreachable_pub)] // test modules share helpers with `pub`; nothing leaves the binary

mod catalog_ops;
mod common;
mod conformance;
mod convert;
