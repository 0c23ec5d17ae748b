//! The contract of a client-visible stria volume, in a crate of its own so that the front ends
//! (the NBD server's adapter, the iSCSI target, anything serving `stria-front`'s registry) depend
//! on the contract and not on the engine that implements it.
//!
//! * [`BlockVolume`] and the types of its calls ([`Durability`], [`Zeroing`], [`Dealloc`],
//!   [`ZeroCost`], [`Extent`], [`VolumeInfo`], [`VolumeFuture`]), and [`VolumeState`] (a
//!   volume's health as its status reports it);
//! * the limits and checks every [`BlockVolume::compare_and_write`] shares
//!   ([`COMPARE_AND_WRITE_ALIGN_BYTES`], [`COMPARE_AND_WRITE_MAX_BYTES`],
//!   [`check_compare_and_write`], [`check_compare`]);
//! * [`VolumeError`], and [`ErrorKind`]: what kind of failure an error is, which each protocol
//!   maps once (the tables live in `stria-front`).
//!
//! The engine (`stria-engine`) re-exports every item where it was defined before this crate
//! existed, so `stria_engine::BlockVolume` and this crate's `BlockVolume` are one trait.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod compare;
mod contract;
mod error;

pub use compare::{
    COMPARE_AND_WRITE_ALIGN_BYTES, COMPARE_AND_WRITE_MAX_BYTES, check_compare, check_compare_and_write,
};
pub use contract::{
    BlockVolume, Dealloc, Durability, Extent, VolumeFuture, VolumeInfo, VolumeState, ZeroCost, Zeroing,
};
pub use error::{ErrorKind, PoolFailure, VolumeError};
