//! Device I/O for stria.
//!
//! Everything above the drives (layouts, write cache, export) is generic over [`BlockDevice`],
//! so tests swap real drives for [`mem::MemDevice`] or a seeded fault injector.

pub mod buf;
pub mod counters;
pub mod device;
pub mod mem;

pub use buf::{BUF_ALIGN_BYTES, IoBuf, IoBytes};
pub use counters::{DevCounters, DevCountersSnapshot};
pub use device::{BLOCK_BYTES, BlockDevice, DevError, check_range};
