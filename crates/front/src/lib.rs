//! What stria's front ends share, so that each protocol is a thin adapter and none copies
//! another (docs/design/seams.md, section 2.2):
//!
//! * [`registry`]: the volumes served, by name ([`Registry`]), kept in step with the catalog by
//!   [`Registry::sync`]; a client holds an [`Attachment`], counted as the volume's client while
//!   it lives, whose requests are counted in the volume's statistics.
//! * [`stats`]: per-volume request counters and latency histograms ([`VolumeStats`]).
//! * [`status`]: block-status chunking (how much of a range one answer looks at, and extents
//!   split to what a protocol can describe).
//! * [`errors`]: the one mapping per protocol of [`ErrorKind`]: NBD errno, HTTP status, SCSI
//!   sense data.
//! * [`nbd`]: the NBD adapter: `stria_nbd::Export` for an attachment, `stria_nbd::ExportRegistry`
//!   for the registry. The NBD protocol crate knows nothing of this one.
//!
//! The crate sees volumes through the contract only (`stria-volume`): never the engine, the tier
//! or the catalog.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod errors;
pub mod nbd;
pub mod registry;
pub mod stats;
pub mod status;
#[cfg(test)]
mod testing;

pub use registry::{Attachment, Registry, Synced};
pub use stats::{Op, OpSnapshot, VolumeStats, VolumeStatsSnapshot};
pub use stria_volume::ErrorKind;
