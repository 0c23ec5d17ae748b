//! An iSCSI target (RFC 7143) for stria volumes (docs/design/iscsi.md): every served volume is
//! LUN 0 of a target of its own.
//!
//! * [`target`]: the listener, target names, one logical unit per volume, the bounds;
//! * `conn`: one connection, its login phase ([`login`]) and its full feature phase;
//! * [`pdu`] and [`text`]: PDUs and text keys on the wire;
//! * [`scsi`]: the SBC-4/SPC-5 command set over a `stria_front::Attachment` (a CDB and its
//!   data in, status, sense and data out), with the state a logical unit keeps across sessions
//!   (persistent reservations, unit attentions).

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub(crate) mod conn;
#[doc(hidden)]
pub mod fuzzing;
pub mod login;
pub mod pdu;
pub mod scsi;
pub mod target;
#[doc(hidden)]
pub mod testing;
pub mod text;

pub use conn::{ConnError, DATA_BUDGET_BYTES, TRANSFER_MAX_BYTES, WINDOW};
pub use login::Chap;
pub use scsi::{FileReservationStore, ReservationStore};
pub use target::{Target, TargetConfig, target_name};
