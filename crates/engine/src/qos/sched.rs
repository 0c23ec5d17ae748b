//! dmClock's three tags per request over per-flow queues, and the choice of which request goes
//! next. Pure and synchronous: time and costs are given by the caller, so it is tested with
//! simulated time; [`super::Dispatcher`] drives it with the clock and a window of cost in flight.
//!
//! A flow (a volume, or a background class) has a reservation and a limit, each in requests
//! and/or bytes per second, and a weight. Each request gets, at arrival, three tags:
//! `R = max(R' + r_step, now)`, `L = max(L' + l_step, now)` and `P = max(P' + cost / w, now)`
//! (primes: the flow's previous request's tags). With both a request rate and a byte rate set,
//! the reservation's step is the smaller of `1 / iops` and `bytes / bps` (the flow is within its
//! reservation while under either) and the limit's the larger (it must be under both).
//! [`Scheduler::pick`]:
//! 1. the request whose reservation tag is smallest and due (`R <= now`) goes first
//!    (constraint phase);
//! 2. else, among flows whose head request's limit tag is due, the smallest weight tag goes
//!    (weight phase), and the flow's queued reservation tags are pulled back by that request's
//!    reservation step, so work it got beyond its reservation does not count against it;
//! 3. a flow whose limit tag is in the future waits, even on idle drives.

use std::collections::VecDeque;

/// A rate in requests and/or bytes per second (`None`: not set).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Rates {
    pub iops: Option<f64>,
    pub bytes: Option<f64>,
}

impl Rates {
    fn is_set(&self) -> bool {
        self.iops.is_some() || self.bytes.is_some()
    }

    /// Seconds each dimension takes to allow a request of `bytes`.
    fn steps(&self, bytes: f64) -> impl Iterator<Item = f64> {
        let per_op = self.iops.map(|r| 1.0 / r);
        let per_byte = self.bytes.map(|r| bytes / r);
        per_op.into_iter().chain(per_byte)
    }
}

/// What one flow is promised.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FlowSpec {
    pub reservation: Rates,
    pub limit: Rates,
    /// Share of what is left once reservations are met (> 0).
    pub weight: f64,
}

impl Default for FlowSpec {
    fn default() -> FlowSpec {
        FlowSpec { reservation: Rates::default(), limit: Rates::default(), weight: 1.0 }
    }
}

/// What one request asks: its bytes (for byte rates) and its cost (drive time, for weights and
/// the window), per drive class.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Demand {
    pub bytes: f64,
    /// Microseconds of each class's time (index: [`super::class_index`]).
    pub cost: [f64; 2],
}

impl Demand {
    /// The cost over all classes.
    pub fn total_cost(&self) -> f64 {
        self.cost[0] + self.cost[1]
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
    demand: Demand,
    /// The reservation step this request took (pulled back if it goes in the weight phase).
    r_step: f64,
    r: f64,
    l: f64,
    p: f64,
    item: T,
}

/// The tags a request gets at arrival (see the module docs), and its reservation step (`r` is
/// infinite, and the step 0, when the flow has no reservation).
struct Tags {
    r_step: f64,
    r: f64,
    l: f64,
    p: f64,
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

impl<T> Flow<T> {
    /// The tags of a request asking `demand` that arrives at `now`.
    fn tags(&self, demand: &Demand, now: f64) -> Tags {
        let (r_step, r) = if self.spec.reservation.is_set() {
            let step = self.spec.reservation.steps(demand.bytes).fold(f64::INFINITY, f64::min);
            (step, (self.last_r + step).max(now))
        } else {
            (0.0, f64::INFINITY)
        };
        let l_step = self.spec.limit.steps(demand.bytes).fold(0.0, f64::max);
        Tags {
            r_step,
            r,
            l: (self.last_l + l_step).max(now),
            p: (self.last_p + demand.total_cost() / self.spec.weight).max(now),
        }
    }
}

/// What [`Scheduler::pick`] found.
#[derive(Debug, PartialEq)]
pub enum Pick<T> {
    /// This request goes now.
    Go { flow: FlowId, phase: Phase, demand: Demand, item: T },
    /// The request that should go next does not fit (the caller's `fits` said no): wait for
    /// work in flight to finish.
    Full,
    /// Nothing can go: no request queued, or every flow with requests is held by its limit
    /// (then: the time the first becomes due).
    Idle(Option<f64>),
}

/// Per-flow queues and dmClock's choice between them.
#[derive(Debug)]
pub struct Scheduler<T> {
    flows: Vec<Flow<T>>,
    /// Requests queued over all flows.
    queued: usize,
}

impl<T> Default for Scheduler<T> {
    fn default() -> Self {
        Scheduler { flows: Vec::new(), queued: 0 }
    }
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

    /// Queues `item`, asking `demand`, on `flow`, arrived at `now` (seconds).
    pub fn push(&mut self, flow: FlowId, demand: Demand, now: f64, item: T) {
        let f = &mut self.flows[flow];
        let Tags { r_step, r, l, p } = f.tags(&demand, now);
        if r.is_finite() {
            f.last_r = r;
        }
        f.last_l = l;
        f.last_p = p;
        f.queue.push_back(Queued { demand, r_step, r, l, p, item });
        self.queued += 1;
    }

    /// Requests queued on `flow`.
    pub fn queued(&self, flow: FlowId) -> usize {
        self.flows[flow].queue.len()
    }

    /// Whether no request is queued on any flow.
    pub fn is_empty(&self) -> bool {
        self.queued == 0
    }

    /// A request asking `demand` on `flow` at `now`, with nothing queued on any flow: exactly
    /// what [`Self::push`] then [`Self::pick`] would do with it, without queueing it. `Some`
    /// (the phase it goes in, its tags taken) when it goes at once; `None`, changing nothing,
    /// when it would wait (its limit or `fits` holds it back): then push it.
    pub fn go_now(
        &mut self,
        flow: FlowId,
        demand: &Demand,
        now: f64,
        fits: impl FnOnce(&Demand) -> bool,
    ) -> Option<Phase> {
        assert!(self.is_empty(), "go_now is for an empty scheduler");
        let f = &mut self.flows[flow];
        let Tags { r_step, r, l, p } = f.tags(demand, now);
        let phase = if r <= now {
            Phase::Reservation
        } else if l <= now {
            Phase::Weight
        } else {
            return None;
        };
        if !fits(demand) {
            return None;
        }
        if r.is_finite() {
            // As `pick` with this request alone queued: in the weight phase the reservation
            // step it took is given back.
            f.last_r = if phase == Phase::Weight { r - r_step } else { r };
        }
        f.last_l = l;
        f.last_p = p;
        Some(phase)
    }

    /// Charges `flow` for work that went without the scheduler (a dispatcher shard's own
    /// admits, while nothing was queued): `cost` over its weight added to its weight tag, and
    /// no tag left below `last`, the time of the latest of that work. For a flow with no
    /// reservation and no limit this is what as many [`Self::go_now`]s would have left, except
    /// that each `max` with its own arrival time is taken once, with the last (the tag is at
    /// most the cost of the work before `last` lower).
    pub fn charge(&mut self, flow: FlowId, cost: f64, last: f64) {
        let f = &mut self.flows[flow];
        f.last_p = (f.last_p + cost / f.spec.weight).max(last);
        f.last_l = f.last_l.max(last);
    }

    /// The request to go at `now`, if `fits` lets its demand go (the dispatcher's window).
    pub fn pick(&mut self, now: f64, fits: impl FnOnce(&Demand) -> bool) -> Pick<T> {
        let due_r = self
            .flows
            .iter()
            .enumerate()
            .filter_map(|(i, f)| f.queue.front().filter(|q| q.r <= now).map(|q| (i, q.r)))
            .min_by(|a, b| a.1.total_cmp(&b.1));
        let (i, phase) = match due_r {
            Some((i, _)) => (i, Phase::Reservation),
            None => {
                let by_weight = self
                    .flows
                    .iter()
                    .enumerate()
                    .filter_map(|(i, f)| f.queue.front().filter(|q| q.l <= now).map(|q| (i, q.p)))
                    .min_by(|a, b| a.1.total_cmp(&b.1));
                match by_weight {
                    Some((i, _)) => (i, Phase::Weight),
                    None => return Pick::Idle(self.next_due()),
                }
            }
        };
        let f = &mut self.flows[i];
        if !fits(&f.queue.front().expect("a head").demand) {
            return Pick::Full;
        }
        let q = f.queue.pop_front().expect("a head");
        self.queued -= 1;
        if phase == Phase::Weight && q.r_step > 0.0 {
            // Work beyond the reservation does not count against it.
            for later in &mut f.queue {
                later.r -= q.r_step;
            }
            f.last_r -= q.r_step;
        }
        Pick::Go { flow: i, phase, demand: q.demand, item: q.item }
    }

    /// When the earliest held request becomes due by its limit or reservation.
    fn next_due(&self) -> Option<f64> {
        self.flows.iter().filter_map(|f| f.queue.front().map(|q| q.l.min(q.r))).min_by(f64::total_cmp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ops(rate: f64) -> Rates {
        Rates { iops: Some(rate), bytes: None }
    }

    /// A server of `capacity` requests per second serving the scheduler for `seconds`: every
    /// flow in `backlogged` always has requests queued; flow `k` of `offered` sends a request
    /// every `1 / rate` seconds. Each request is 4 KiB and costs 1. Returns the requests each
    /// flow got per second.
    fn simulate(
        specs: &[FlowSpec],
        backlogged: &[bool],
        offered: &[f64],
        capacity: f64,
        seconds: f64,
    ) -> Vec<f64> {
        let demand = Demand { bytes: 4096.0, cost: [1.0, 0.0] };
        let mut s = Scheduler::default();
        let flows: Vec<FlowId> = specs.iter().map(|&f| s.add_flow(f)).collect();
        let mut got = vec![0.0; flows.len()];
        let mut next_arrival: Vec<f64> = vec![0.0; flows.len()];
        let mut now = 0.0;
        while now < seconds {
            for (k, &f) in flows.iter().enumerate() {
                if backlogged[k] {
                    while s.queued(f) < 8 {
                        s.push(f, demand, now, ());
                    }
                } else {
                    while next_arrival[k] <= now && offered[k] > 0.0 {
                        s.push(f, demand, next_arrival[k], ());
                        next_arrival[k] += 1.0 / offered[k];
                    }
                }
            }
            match s.pick(now, |_| true) {
                Pick::Go { flow, demand, .. } => {
                    got[flow] += 1.0;
                    now += demand.total_cost() / capacity;
                }
                Pick::Full => unreachable!("everything fits"),
                Pick::Idle(due) => now = due.unwrap_or(now + 1e-3).max(now + 1e-6),
            }
        }
        got.iter().map(|g| g / seconds).collect()
    }

    #[test]
    fn a_reservation_is_met_while_another_flow_floods() {
        // The flood's weight would leave the other 10 %: its reservation of 300 is the floor.
        let flood = FlowSpec { weight: 9.0, ..FlowSpec::default() };
        let reserved = FlowSpec { reservation: ops(300.0), ..FlowSpec::default() };
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
        let limited = FlowSpec { limit: ops(200.0), ..FlowSpec::default() };
        let got = simulate(&[limited], &[true], &[0.0], 1000.0, 20.0);
        assert!((got[0] - 200.0).abs() <= 200.0 * 0.01, "{got:?}");
    }

    #[test]
    fn a_byte_limit_and_an_iops_limit_both_hold() {
        // 4 KiB requests: 409.6 KB/s is 100 requests/s, below the iops limit of 300.
        let both =
            FlowSpec { limit: Rates { iops: Some(300.0), bytes: Some(409_600.0) }, ..FlowSpec::default() };
        let got = simulate(&[both], &[true], &[0.0], 1000.0, 20.0);
        assert!((got[0] - 100.0).abs() <= 1.0, "{got:?}");
        // A byte reservation with an iops reservation: met while under either (the larger).
        let flood = FlowSpec { weight: 100.0, ..FlowSpec::default() };
        let res = FlowSpec {
            reservation: Rates { iops: Some(100.0), bytes: Some(819_200.0) },
            ..FlowSpec::default()
        };
        let got = simulate(&[flood, res], &[true, true], &[0.0, 0.0], 1000.0, 20.0);
        assert!(got[1] >= 200.0 * 0.99, "{got:?}");
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
        let reserved = FlowSpec { reservation: ops(300.0), ..FlowSpec::default() };
        let got = simulate(&[flood, reserved], &[true, false], &[0.0, 100.0], 1000.0, 20.0);
        assert!((got[1] - 100.0).abs() < 2.0, "{got:?}");
        assert!(got[0] > 880.0, "{got:?}");
    }

    #[test]
    fn reservation_limit_and_weight_together() {
        // c: reserved 200, limited 400; a and b weights 1 and 1; 1000 units of capacity.
        let a = FlowSpec::default();
        let b = FlowSpec::default();
        let c = FlowSpec { reservation: ops(200.0), limit: ops(400.0), weight: 4.0 };
        let got = simulate(&[a, b, c], &[true, true, true], &[0.0; 3], 1000.0, 30.0);
        assert!(got[2] >= 200.0 * 0.99 && got[2] <= 400.0 * 1.01, "{got:?}");
        // c's weight would take 2/3 of the rest; its limit stops it at 400; a and b share the rest.
        assert!((got[2] - 400.0).abs() < 8.0, "{got:?}");
        assert!((got[0] - got[1]).abs() < 10.0, "{got:?}");
        assert!((got.iter().sum::<f64>() - 1000.0).abs() < 5.0, "{got:?}");
    }

    #[test]
    fn a_request_that_does_not_fit_waits_at_the_head() {
        let mut s = Scheduler::default();
        let f = s.add_flow(FlowSpec::default());
        s.push(f, Demand { bytes: 4096.0, cost: [5.0, 0.0] }, 0.0, 'a');
        s.push(f, Demand { bytes: 4096.0, cost: [1.0, 0.0] }, 0.0, 'b');
        assert_eq!(s.pick(0.0, |d| d.total_cost() <= 2.0), Pick::Full);
        assert_eq!(s.queued(f), 2, "nothing was taken");
        assert!(matches!(s.pick(0.0, |_| true), Pick::Go { item: 'a', .. }));
        assert!(matches!(s.pick(0.0, |_| true), Pick::Go { item: 'b', .. }));
        assert_eq!(s.pick(0.0, |_| true), Pick::Idle(None));
    }

    /// `go_now` on an empty scheduler decides as `push` then `pick` would, and leaves the same
    /// tags behind: two schedulers, one taking the shortcut and one not, fed the same arrivals
    /// (reservations, limits in requests and bytes, windows that fit or not) stay in step.
    #[test]
    fn going_at_once_is_what_push_and_pick_would_do() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(40);
        let mut went = [0u32; 3];
        for _ in 0..200 {
            let mut rate = |p: f64, scale: f64| rng.random_bool(p).then(|| rng.random_range(1.0..scale));
            let spec = FlowSpec {
                reservation: Rates { iops: rate(0.5, 200.0), bytes: rate(0.3, 1e6) },
                limit: Rates { iops: rate(0.5, 400.0), bytes: rate(0.3, 2e6) },
                weight: rng.random_range(1.0..10.0),
            };
            let (mut fast, mut slow) = (Scheduler::default(), Scheduler::default());
            let (f, g) = (fast.add_flow(spec), slow.add_flow(spec));
            let mut now = 0.0;
            for _ in 0..50 {
                now += rng.random_range(0.0..0.01);
                let demand = Demand { bytes: rng.random_range(0..64) as f64 * 4096.0, cost: [0.0, 50.0] };
                let fits = rng.random_bool(0.8);
                let shortcut = fast.go_now(f, &demand, now, |_| fits);
                if shortcut.is_none() {
                    fast.push(f, demand, now, ());
                }
                slow.push(g, demand, now, ());
                match slow.pick(now, |_| fits) {
                    Pick::Go { phase, .. } => {
                        assert_eq!(shortcut, Some(phase));
                        went[usize::from(phase == Phase::Weight)] += 1;
                    }
                    _ => {
                        assert_eq!(shortcut, None);
                        went[2] += 1;
                        // Both hold it: let it go when it is due, in both.
                        let due = match slow.pick(now, |_| false) {
                            Pick::Idle(Some(due)) => due,
                            _ => now,
                        };
                        now = now.max(due);
                        let a = fast.pick(now, |_| true);
                        let b = slow.pick(now, |_| true);
                        assert!(
                            matches!((&a, &b), (Pick::Go { phase: x, .. }, Pick::Go { phase: y, .. }) if x == y)
                        );
                    }
                }
                let (a, b) = (&fast.flows[f], &slow.flows[g]);
                assert!(fast.is_empty() && slow.is_empty());
                assert_eq!((a.last_r, a.last_l, a.last_p), (b.last_r, b.last_l, b.last_p));
            }
        }
        // Every outcome came up.
        assert!(went.iter().all(|&n| n > 100), "{went:?}");
    }
}
