//! Per-volume QoS (docs/design/qos.md): reservations, limits and weights, dmClock's way, over
//! costs that reflect what a request makes the drives do.
//!
//! * [`sched`]: the tags and the choice of the next request (pure, simulated time in its tests).
//! * [`cost`]: the cost of a request per layout from the pool's calibration; admission control.
//! * [`Dispatcher`]: the pool's queues, the window of cost in flight, the clock and the timer.
//! * [`QosVolume`]: a volume whose requests go through the dispatcher.

pub mod cost;
mod dispatch;
pub mod sched;
mod volume;

pub use cost::{CostProfile, OpKind, RESERVABLE, admit_reservation, class_index};
pub use dispatch::{Dispatcher, FlowRates, Grant};
pub use sched::{Demand, FlowId, FlowSpec, Phase, Pick, Rates, Scheduler};
pub use volume::QosVolume;

/// The flow of rebuilds (a background class: no setting, the default weight; the `~` keeps it
/// apart from volume names).
pub const REBUILD_FLOW: &str = "~rebuild";
/// The flow of scrubs.
pub const SCRUB_FLOW: &str = "~scrub";
/// The flow of extent moves (`pool rebalance`, `drive remove`).
pub const REBALANCE_FLOW: &str = "~rebalance";
