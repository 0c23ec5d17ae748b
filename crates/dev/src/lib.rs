//! Device I/O for stria.
//!
//! Everything above the drives (layouts, write cache, export) is generic over [`BlockDevice`],
//! so tests swap real drives ([`FileDevice`]) for [`mem::MemDevice`] or the seeded fault
//! injector [`FaultDevice`].

pub mod buf;
pub mod counters;
pub mod crc;
pub mod device;
pub mod exec;
pub mod fault;
pub mod file;
pub mod histogram;
pub mod mem;
pub mod priority;

pub use buf::{BUF_ALIGN_BYTES, IoBuf, IoBytes};
pub use counters::{Counter, DevCounters, DevCountersSnapshot, DevLatency};
pub use crc::block_crc;
pub use device::{BLOCK_BYTES, BLOCK_USIZE, BlockDevice, DevError, check_range};
pub use fault::{
    FaultConfig, FaultCounts, FaultDevice, FaultEvent, FaultKind, HoldWrites, HostSpace, PowerSwitch,
};
pub use file::{DriveLock, FileDevice, FileOptions, Holder, IoEngine, OpenError};
pub use histogram::{Histogram, HistogramSnapshot};
