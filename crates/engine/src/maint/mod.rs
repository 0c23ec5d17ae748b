//! Maintenance of an open pool, as a library: what the `stria` daemon runs and what a cluster
//! node agent will run the same way (docs/design/seams.md §2.5).
//!
//! * [`Services`] (services.rs): the background loop: [`crate::Pool::tick`], rebuilds with a retry
//!   after a failure, extent moves with a retry likewise, and drained drives taken out of the
//!   pool. [`Services::stop`] stops it without cancelling a row or a commit in progress.
//! * The guarded drive workflows (drives.rs): [`fail_drive`] with the last-copy guard,
//!   [`Replacement`] and [`Online`] with the rebuild-source guard, [`start_remove`] with the
//!   drain, [`check_drained`] and [`take_out`]. A guard refuses with a [`Refusal`] inside
//!   [`crate::EngineError::Refused`], whose kind is `Conflict`.
//!
//! Arguments, rendering (the hints that name a command's flags) and the devices' paths stay with
//! the caller.

mod drives;
mod services;
#[cfg(test)]
mod tests;

pub use drives::{
    DriveAction, Online, Refusal, Removal, Replacement, check_drained, fail_drive, start_remove, take_out,
};
pub use services::{Activity, DriveRemoved, Services, Settings, Stopping};
