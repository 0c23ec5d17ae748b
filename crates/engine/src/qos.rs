//! The core of per-volume QoS (docs/design/qos.md): dmClock's three tags per request over
//! per-flow queues, and the choice of which request goes next. Pure and synchronous: time and
//! costs are given by the caller, so it is tested with simulated time. **Not wired into the I/O
//! path yet** (issue 14): the dispatcher that holds requests back under a window of cost in
//! flight, the calibration that gives costs, and the settings per volume come next.
//!
//! A flow (a volume, or a background class) has a reservation `r`, a limit `l` and a weight `w`,
//! in cost units per second (the weight is a share, no unit). Each request of cost `c` gets, at
//! arrival, tags `R = max(R' + c/r, now)`, `L = max(L' + c/l, now)` and `P = max(P' + c/w, now)`
//! (primes: the flow's previous request's tags). [`Scheduler::pick`]:
//! 1. the request whose reservation tag is smallest and due (`R <= now`) goes first
//!    (constraint phase);
//! 2. else, among flows whose head request's limit tag is due, the smallest weight tag goes
//!    (weight phase), and the flow's queued reservation tags are pulled back by `c/r` so the work
//!    it got beyond its reservation does not count against it;
//! 3. a flow whose limit tag is in the future waits, even on idle drives.

use std::collections::VecDeque;

/// What one flow is promised (rates in cost units per second; `None`: no reservation, no limit).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FlowSpec {
    pub reservation: Option<f64>,
    pub limit: Option<f64>,
    /// Share of what is left once reservations are met (> 0).
    pub weight: f64,
}

impl Default for FlowSpec {
    fn default() -> FlowSpec {
        FlowSpec { reservation: None, limit: None, weight: 1.0 }
    }
}

/// A flow's index in its [`Scheduler`].
pub type FlowId = usize;

/// Which phase let a request go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Reservation,
    Weight,
}

#[derive(Debug)]
struct Queued<T> {
    cost: f64,
    r: f64,
    l: f64,
    p: f64,
    item: T,
}

#[derive(Debug)]
struct Flow<T> {
    spec: FlowSpec,
    queue: VecDeque<Queued<T>>,
    /// Tags of the flow's last request to arrive.
    last_r: f64,
    last_l: f64,
    last_p: f64,
}

/// Per-flow queues and dmClock's choice between them.
#[derive(Debug)]
pub struct Scheduler<T> {
    flows: Vec<Flow<T>>,
}

impl<T> Default for Scheduler<T> {
    fn default() -> Self {
        Scheduler { flows: Vec::new() }
    }
}

/// `c / rate`, or 0 when there is no rate (no reservation: the tag never makes a request due
/// early; no limit: never late).
fn step(cost: f64, rate: Option<f64>) -> f64 {
    rate.map_or(0.0, |r| cost / r)
}

impl<T> Scheduler<T> {
    /// Adds a flow; returns its id.
    pub fn add_flow(&mut self, spec: FlowSpec) -> FlowId {
        assert!(spec.weight > 0.0, "a flow's weight is positive");
        self.flows.push(Flow {
            spec,
            queue: VecDeque::new(),
            last_r: f64::NEG_INFINITY,
            last_l: f64::NEG_INFINITY,
            last_p: f64::NEG_INFINITY,
        });
        self.flows.len() - 1
    }

    /// Changes a flow's settings; requests queued keep their tags, later ones use the new ones.
    pub fn set_flow(&mut self, flow: FlowId, spec: FlowSpec) {
        assert!(spec.weight > 0.0, "a flow's weight is positive");
        self.flows[flow].spec = spec;
    }

    /// Queues `item`, costing `cost` units, on `flow`, arrived at `now` (seconds).
    pub fn push(&mut self, flow: FlowId, cost: f64, now: f64, item: T) {
        let f = &mut self.flows[flow];
        let r = if f.spec.reservation.is_some() {
            (f.last_r + step(cost, f.spec.reservation)).max(now)
        } else {
            f64::INFINITY
        };
        let l = (f.last_l + step(cost, f.spec.limit)).max(now);
        let p = (f.last_p + cost / f.spec.weight).max(now);
        if r.is_finite() {
            f.last_r = r;
        }
        f.last_l = l;
        f.last_p = p;
        f.queue.push_back(Queued { cost, r, l, p, item });
    }

    /// Requests queued on `flow`.
    pub fn queued(&self, flow: FlowId) -> usize {
        self.flows[flow].queue.len()
    }

    /// The next request to go at `now`, with its flow, cost and the phase that chose it; `None`
    /// when nothing is queued or every flow with requests is held by its limit.
    pub fn pick(&mut self, now: f64) -> Option<(FlowId, f64, Phase, T)> {
        let due_r = self
            .flows
            .iter()
            .enumerate()
            .filter_map(|(i, f)| f.queue.front().filter(|q| q.r <= now).map(|q| (i, q.r)))
            .min_by(|a, b| a.1.total_cmp(&b.1));
        if let Some((i, _)) = due_r {
            let q = self.flows[i].queue.pop_front().expect("a head");
            return Some((i, q.cost, Phase::Reservation, q.item));
        }
        let (i, _) = self
            .flows
            .iter()
            .enumerate()
            .filter_map(|(i, f)| f.queue.front().filter(|q| q.l <= now).map(|q| (i, q.p)))
            .min_by(|a, b| a.1.total_cmp(&b.1))?;
        let f = &mut self.flows[i];
        let q = f.queue.pop_front().expect("a head");
        // Work beyond the reservation does not count against it.
        let back = step(q.cost, f.spec.reservation);
        if back > 0.0 {
            for later in &mut f.queue {
                later.r -= back;
            }
            f.last_r -= back;
        }
        Some((i, q.cost, Phase::Weight, q.item))
    }

    /// When the earliest held request becomes due by its limit (for a dispatcher to sleep until),
    /// if nothing can go now.
    pub fn next_due(&self) -> Option<f64> {
        self.flows.iter().filter_map(|f| f.queue.front().map(|q| q.l.min(q.r))).min_by(f64::total_cmp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server of `capacity` cost units per second serving the scheduler for `seconds`: every
    /// flow in `backlogged` always has requests queued; flow `k` of `offered` sends a request of
    /// `cost` every `1 / rate` seconds. Returns the cost each flow got per second.
    fn simulate(
        specs: &[FlowSpec],
        backlogged: &[bool],
        offered: &[f64],
        capacity: f64,
        seconds: f64,
    ) -> Vec<f64> {
        let cost = 1.0;
        let mut s = Scheduler::default();
        let flows: Vec<FlowId> = specs.iter().map(|&f| s.add_flow(f)).collect();
        let mut got = vec![0.0; flows.len()];
        let mut next_arrival: Vec<f64> = vec![0.0; flows.len()];
        let mut now = 0.0;
        while now < seconds {
            for (k, &f) in flows.iter().enumerate() {
                if backlogged[k] {
                    while s.queued(f) < 8 {
                        s.push(f, cost, now, ());
                    }
                } else {
                    while next_arrival[k] <= now && offered[k] > 0.0 {
                        s.push(f, cost, next_arrival[k], ());
                        next_arrival[k] += 1.0 / offered[k];
                    }
                }
            }
            match s.pick(now) {
                Some((f, c, _, ())) => {
                    got[f] += c;
                    now += c / capacity;
                }
                None => now = s.next_due().unwrap_or(now + 1e-3).max(now + 1e-6),
            }
        }
        got.iter().map(|g| g / seconds).collect()
    }

    #[test]
    fn a_reservation_is_met_while_another_flow_floods() {
        // The flood's weight would leave the other 10 %: its reservation of 300 is the floor.
        let flood = FlowSpec { weight: 9.0, ..FlowSpec::default() };
        let reserved = FlowSpec { reservation: Some(300.0), ..FlowSpec::default() };
        let got = simulate(&[flood, reserved], &[true, true], &[0.0, 0.0], 1000.0, 20.0);
        assert!(got[1] >= 300.0 * 0.99, "{got:?}");
        assert!(got[1] <= 300.0 * 1.02, "no more than the reservation when the weight gives less: {got:?}");
        assert!((got[0] + got[1] - 1000.0).abs() < 5.0, "the server is kept busy: {got:?}");
        // With equal weights the weight share (500) is above the reservation: it gets that.
        let got = simulate(&[FlowSpec::default(), reserved], &[true, true], &[0.0, 0.0], 1000.0, 20.0);
        assert!((got[1] - 500.0).abs() < 10.0, "{got:?}");
    }

    #[test]
    fn a_limit_holds_even_on_an_idle_server() {
        let limited = FlowSpec { limit: Some(200.0), ..FlowSpec::default() };
        let got = simulate(&[limited], &[true], &[0.0], 1000.0, 20.0);
        assert!((got[0] - 200.0).abs() <= 200.0 * 0.01, "{got:?}");
    }

    #[test]
    fn weights_split_what_is_left() {
        let a = FlowSpec { weight: 3.0, ..FlowSpec::default() };
        let b = FlowSpec { weight: 1.0, ..FlowSpec::default() };
        let got = simulate(&[a, b], &[true, true], &[0.0, 0.0], 1000.0, 20.0);
        assert!((got[0] / got[1] - 3.0).abs() < 0.03, "{got:?}");
    }

    #[test]
    fn a_flow_below_its_reservation_gets_all_it_asks() {
        // It asks 100/s with a reservation of 300: it gets its 100; the flood gets the rest.
        let flood = FlowSpec { weight: 10.0, ..FlowSpec::default() };
        let reserved = FlowSpec { reservation: Some(300.0), ..FlowSpec::default() };
        let got = simulate(&[flood, reserved], &[true, false], &[0.0, 100.0], 1000.0, 20.0);
        assert!((got[1] - 100.0).abs() < 2.0, "{got:?}");
        assert!(got[0] > 880.0, "{got:?}");
    }

    #[test]
    fn reservation_limit_and_weight_together() {
        // c: reserved 200, limited 400; a and b weights 1 and 1; 1000 units of capacity.
        let a = FlowSpec::default();
        let b = FlowSpec::default();
        let c = FlowSpec { reservation: Some(200.0), limit: Some(400.0), weight: 4.0 };
        let got = simulate(&[a, b, c], &[true, true, true], &[0.0; 3], 1000.0, 30.0);
        assert!(got[2] >= 200.0 * 0.99 && got[2] <= 400.0 * 1.01, "{got:?}");
        // c's weight would take 2/3 of the rest; its limit stops it at 400; a and b share the rest.
        assert!((got[2] - 400.0).abs() < 8.0, "{got:?}");
        assert!((got[0] - got[1]).abs() < 10.0, "{got:?}");
        assert!((got.iter().sum::<f64>() - 1000.0).abs() < 5.0, "{got:?}");
    }
}
