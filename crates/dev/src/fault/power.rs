//! A power switch shared by several fault-injecting drives, so one power cut hits them all at
//! the same point in the global order of their requests.

use std::sync::Arc;

use parking_lot::Mutex;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Where a power cut happened.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PowerCutPoint {
    /// The drive whose request saw the cut (empty when tripped by [`PowerSwitch::trip`]).
    pub device: String,
    /// Requests (over all drives) that the switch let through before the cut.
    pub ops_before_cut: u64,
}

#[derive(Debug, Default)]
struct PowerState {
    cut: Option<PowerCutPoint>,
    /// Requests still let through before the cut, when armed.
    ops_until_cut: Option<u64>,
    /// Requests let through so far (all drives).
    ops_passed: u64,
}

/// The outcome of one request passing the switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Power {
    On,
    /// This request is the one the power was cut under.
    CutNow,
    /// The power was already off.
    Off,
}

/// A power supply shared by drives (`Arc<PowerSwitch>`). Every request of every attached
/// [`super::FaultDevice`] passes it first, in one global order.
#[derive(Debug, Default)]
pub struct PowerSwitch {
    state: Mutex<PowerState>,
}

impl PowerSwitch {
    /// A switch with the power on and no cut armed.
    pub fn new() -> Arc<PowerSwitch> {
        Arc::new(PowerSwitch::default())
    }

    /// Cuts the power now.
    pub fn trip(&self) {
        let mut state = self.state.lock();
        if state.cut.is_none() {
            state.cut = Some(PowerCutPoint { device: String::new(), ops_before_cut: state.ops_passed });
        }
    }

    /// Lets `ops` more requests (over all drives) through, then cuts the power under the next.
    pub fn trip_after_ops(&self, ops: u64) {
        self.state.lock().ops_until_cut = Some(ops);
    }

    /// Arms a cut after a number of requests drawn from `0..ops_max` by `seed`; returns it.
    ///
    /// Tests first count the requests of a run without a cut ([`PowerSwitch::ops_passed`]) and
    /// then pass that count, so the cut lands somewhere inside the operation under test.
    pub fn trip_at_random(&self, seed: u64, ops_max: u64) -> u64 {
        let ops = ChaCha8Rng::seed_from_u64(seed).random_range(0..ops_max.max(1));
        self.trip_after_ops(ops);
        ops
    }

    /// True once the power has been cut.
    pub fn is_off(&self) -> bool {
        self.state.lock().cut.is_some()
    }

    /// Where the power was cut, if it was.
    pub fn cut_point(&self) -> Option<PowerCutPoint> {
        self.state.lock().cut.clone()
    }

    /// Requests the switch has let through so far (all drives).
    pub fn ops_passed(&self) -> u64 {
        self.state.lock().ops_passed
    }

    /// Passes one request of `device` through the switch.
    pub(super) fn pass(&self, device: &str) -> Power {
        let mut state = self.state.lock();
        if state.cut.is_some() {
            return Power::Off;
        }
        if let Some(left) = state.ops_until_cut.as_mut() {
            if *left == 0 {
                state.ops_until_cut = None;
                state.cut =
                    Some(PowerCutPoint { device: device.to_owned(), ops_before_cut: state.ops_passed });
                return Power::CutNow;
            }
            *left -= 1;
        }
        state.ops_passed += 1;
        Power::On
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_armed_switch_cuts_under_the_next_request_after_the_count() {
        let switch = PowerSwitch::new();
        switch.trip_after_ops(2);
        assert_eq!(switch.pass("a"), Power::On);
        assert_eq!(switch.pass("b"), Power::On);
        assert_eq!(switch.pass("b"), Power::CutNow);
        assert_eq!(switch.pass("a"), Power::Off);
        assert_eq!(switch.cut_point(), Some(PowerCutPoint { device: "b".into(), ops_before_cut: 2 }));
    }

    #[test]
    fn random_cut_points_depend_only_on_the_seed() {
        let a = PowerSwitch::new().trip_at_random(42, 1000);
        let b = PowerSwitch::new().trip_at_random(42, 1000);
        assert_eq!(a, b);
        assert!(a < 1000);
        let manual = PowerSwitch::new();
        manual.trip();
        assert!(manual.is_off());
        assert_eq!(manual.pass("x"), Power::Off);
    }
}
