//! The pool's dispatcher: requests of every volume with QoS wait in [`Scheduler`] queues and
//! go, dmClock's way, while the cost in flight on each drive class stays under a window (the
//! calibrated latency at queue depth 32: enough work to keep the class busy, little enough
//! that who goes next is decided here and not by the drives' queues).
//!
//! With no setting on any volume the dispatcher is off: [`Dispatcher::active`] is one read of a
//! flag that changes only with the settings, and requests go straight to the volume. With any
//! setting every request of the pool goes through it (a flood without settings must be held
//! back for a reservation to mean anything), under one lock per pool.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::time::Instant;

use parking_lot::Mutex;
use tokio::sync::oneshot;

use crate::format::meta::{Calibration, DriveClass, QosSpec};

use super::cost::{CostProfile, OpKind, class_figures, class_index};
use super::sched::{Demand, FlowId, FlowSpec, Phase, Pick, Rates, Scheduler};

/// Seconds of history the rates in [`FlowRates`] average over.
const RATE_SECONDS: u64 = 5;
const RING: usize = 8;

/// What a volume got, for `volume show`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FlowRates {
    /// Requests per second over the last few seconds (0 when the dispatcher was off).
    pub iops: u64,
    pub bytes_per_sec: u64,
    /// Of the requests counted since the daemon started, how many went within the reservation.
    pub reserved_ops: u64,
    pub ops: u64,
}

#[derive(Debug, Clone, Copy, Default)]
struct Bucket {
    second: u64,
    ops: u64,
    bytes: u64,
}

#[derive(Debug, Default)]
struct FlowState {
    spec: QosSpec,
    ops: u64,
    reserved_ops: u64,
    ring: [Bucket; RING],
}

impl FlowState {
    fn count(&mut self, second: u64, bytes: u64, phase: Phase) {
        self.ops += 1;
        if phase == Phase::Reservation {
            self.reserved_ops += 1;
        }
        let b = &mut self.ring[(second % RING as u64) as usize];
        if b.second != second {
            *b = Bucket { second, ops: 0, bytes: 0 };
        }
        b.ops += 1;
        b.bytes += bytes;
    }

    fn rates(&self, second: u64) -> FlowRates {
        // The last RATE_SECONDS whole seconds (the current one is still filling).
        let window = second.saturating_sub(RATE_SECONDS)..second;
        let (ops, bytes) = self
            .ring
            .iter()
            .filter(|b| window.contains(&b.second) && b.ops > 0)
            .fold((0, 0), |(o, by), b| (o + b.ops, by + b.bytes));
        FlowRates {
            iops: ops / RATE_SECONDS,
            bytes_per_sec: bytes / RATE_SECONDS,
            reserved_ops: self.reserved_ops,
            ops: self.ops,
        }
    }
}

struct State {
    sched: Scheduler<oneshot::Sender<()>>,
    names: HashMap<String, FlowId>,
    flows: Vec<FlowState>,
    calibration: Option<Calibration>,
    /// Cost in flight per class, and the most there may be.
    in_flight: [f64; 2],
    /// Requests in flight per class (the cost sums carry rounding: "nothing in flight" is
    /// told by the count, and the sum is reset to 0 with it).
    in_flight_ops: [u32; 2],
    window: [f64; 2],
    /// When the armed timer fires, if one is.
    timer_at: Option<f64>,
}

/// The pool's QoS dispatcher (see the module docs).
pub struct Dispatcher {
    active: AtomicBool,
    epoch: Instant,
    me: Weak<Dispatcher>,
    state: Mutex<State>,
}

impl std::fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatcher").field("active", &self.active()).finish_non_exhaustive()
    }
}

/// `spec` in the scheduler's terms (rates per second; weight as a share).
fn flow_spec(spec: &QosSpec) -> FlowSpec {
    let f = |v: Option<u64>| v.map(|v| v as f64);
    FlowSpec {
        reservation: Rates { iops: f(spec.iops_reserve), bytes: f(spec.bw_reserve) },
        limit: Rates { iops: f(spec.iops_limit), bytes: f(spec.bw_limit) },
        weight: f64::from(spec.weight.unwrap_or(QosSpec::DEFAULT_WEIGHT).max(1)),
    }
}

/// The window of each class under `cal`: twice the calibrated latency at queue depth 32.
fn windows(cal: Option<&Calibration>) -> [f64; 2] {
    let mut w = [0.0; 2];
    for class in [DriveClass::Fast, DriveClass::Capacity] {
        w[class_index(class)] = 2.0 * class_figures(cal, class).read_latency_us.max(100) as f64;
    }
    w
}

/// Leave to go, held for as long as the request runs; dropping it returns its cost to the
/// window.
#[must_use = "the request may go only while its grant is held"]
#[derive(Debug)]
pub struct Grant {
    dispatcher: Option<Arc<Dispatcher>>,
    cost: [f64; 2],
}

impl Drop for Grant {
    fn drop(&mut self) {
        if let Some(d) = self.dispatcher.take() {
            d.release(self.cost);
        }
    }
}

/// A request waiting for its turn. Dropped before it learnt the answer (its future dropped
/// mid-wait), it gives back a turn it was given, so the window does not lose that cost for
/// ever; a turn not given yet is skipped when it comes (its sender finds the receiver gone).
struct Waiting {
    rx: oneshot::Receiver<()>,
    /// Taken once the answer is in.
    dispatcher: Option<Arc<Dispatcher>>,
    cost: [f64; 2],
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if let Some(d) = self.dispatcher.take() {
            // No send may succeed after this: what was sent before is seen below.
            self.rx.close();
            if self.rx.try_recv().is_ok() {
                d.release(self.cost);
            }
        }
    }
}

impl Dispatcher {
    /// An idle dispatcher with no flows.
    pub fn new(calibration: Option<Calibration>) -> Arc<Dispatcher> {
        Arc::new_cyclic(|me| Dispatcher {
            active: AtomicBool::new(false),
            epoch: Instant::now(),
            me: me.clone(),
            state: Mutex::new(State {
                sched: Scheduler::default(),
                names: HashMap::new(),
                flows: Vec::new(),
                window: windows(calibration.as_ref()),
                calibration,
                in_flight: [0.0; 2],
                in_flight_ops: [0; 2],
                timer_at: None,
            }),
        })
    }

    /// True when some volume has a setting: requests must go through [`Dispatcher::admit`].
    pub fn active(&self) -> bool {
        self.active.load(Ordering::Relaxed)
    }

    fn now(&self) -> f64 {
        self.epoch.elapsed().as_secs_f64()
    }

    /// The flow of volume `name` (made, without settings, on first use).
    pub fn flow(&self, name: &str) -> FlowId {
        let mut st = self.state.lock();
        Self::flow_locked(&mut st, name)
    }

    fn flow_locked(st: &mut State, name: &str) -> FlowId {
        if let Some(&id) = st.names.get(name) {
            return id;
        }
        let id = st.sched.add_flow(FlowSpec::default());
        // Flows of a name are kept for the dispatcher's life (they are a few words each, one per
        // volume name ever served), so a volume re-created under a name reuses its flow.
        st.names.insert(name.to_string(), id);
        st.flows.push(FlowState::default());
        id
    }

    /// Sets volume `name`'s settings (an empty spec removes them).
    pub fn set(&self, name: &str, spec: QosSpec) {
        let mut st = self.state.lock();
        let id = Self::flow_locked(&mut st, name);
        st.sched.set_flow(id, flow_spec(&spec));
        st.flows[id].spec = spec;
        let any = st.flows.iter().any(|f| !f.spec.is_empty());
        self.active.store(any, Ordering::Relaxed);
        // Requests already queued may go now (a limit raised or removed).
        self.run(&mut st);
    }

    /// The settings of volume `name` (empty when none).
    pub fn spec(&self, name: &str) -> QosSpec {
        let st = self.state.lock();
        st.names.get(name).map(|&id| st.flows[id].spec).unwrap_or_default()
    }

    /// Every volume with settings.
    pub fn specs(&self) -> Vec<(String, QosSpec)> {
        let st = self.state.lock();
        let mut out: Vec<_> = st
            .names
            .iter()
            .filter(|(_, id)| !st.flows[**id].spec.is_empty())
            .map(|(n, &id)| (n.clone(), st.flows[id].spec))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Takes a new calibration (costs and windows follow it).
    pub fn set_calibration(&self, cal: Option<Calibration>) {
        let mut st = self.state.lock();
        st.window = windows(cal.as_ref());
        st.calibration = cal;
        self.run(&mut st);
    }

    /// What volume `name` got.
    pub fn rates(&self, name: &str) -> FlowRates {
        let st = self.state.lock();
        let second = self.now() as u64;
        st.names.get(name).map(|&id| st.flows[id].rates(second)).unwrap_or_default()
    }

    /// Waits until a request of `kind` and `bytes` of `flow` may go. Hold the grant while the
    /// request runs.
    pub async fn admit(&self, flow: FlowId, profile: &CostProfile, kind: OpKind, bytes: u64) -> Grant {
        let me = self.me.upgrade().expect("a dispatcher is used through its Arc");
        let (cost, rx) = {
            let mut st = self.state.lock();
            let demand = profile.demand(kind, bytes, st.calibration.as_ref());
            let now = self.now();
            // Nothing queued: a request that would be picked at once goes without a queue, a
            // channel or a wait (the common case when no limit binds and the window has room).
            if st.sched.is_empty() {
                let fits = Self::fits(&st);
                if let Some(phase) = st.sched.go_now(flow, &demand, now, fits) {
                    Self::started(&mut st, flow, phase, &demand, now);
                    return Grant { dispatcher: Some(me), cost: demand.cost };
                }
            }
            let (tx, rx) = oneshot::channel();
            st.sched.push(flow, demand, now, tx);
            self.run(&mut st);
            (demand.cost, rx)
        };
        let mut waiting = Waiting { rx, dispatcher: Some(me), cost };
        // The sender is only dropped unsent if the dispatcher itself goes away.
        let granted = (&mut waiting.rx).await.is_ok();
        let me = waiting.dispatcher.take();
        Grant { dispatcher: me.filter(|_| granted), cost }
    }

    /// Returns a finished request's cost to the window and lets the next ones go.
    fn release(&self, cost: [f64; 2]) {
        let mut st = self.state.lock();
        for (i, c) in cost.into_iter().enumerate() {
            if c > 0.0 {
                st.in_flight_ops[i] -= 1;
                st.in_flight[i] = if st.in_flight_ops[i] == 0 { 0.0 } else { (st.in_flight[i] - c).max(0.0) };
            }
        }
        // Nothing queued: nothing to let go (and no limit's timer to arm).
        if !st.sched.is_empty() {
            self.run(&mut st);
        }
    }

    /// Whether a request asking a demand fits the window now: each class it uses has room, or
    /// nothing in flight there (so one larger than the window still goes).
    fn fits(st: &State) -> impl Fn(&Demand) -> bool + use<> {
        let (in_flight, ops, window) = (st.in_flight, st.in_flight_ops, st.window);
        move |d: &Demand| {
            (0..2).all(|i| d.cost[i] == 0.0 || ops[i] == 0 || in_flight[i] + d.cost[i] <= window[i])
        }
    }

    /// Counts a request that goes now: its cost in the window, its flow's rates.
    fn started(st: &mut State, flow: FlowId, phase: Phase, demand: &Demand, now: f64) {
        for i in 0..2 {
            if demand.cost[i] > 0.0 {
                st.in_flight[i] += demand.cost[i];
                st.in_flight_ops[i] += 1;
            }
        }
        st.flows[flow].count(now as u64, demand.bytes as u64, phase);
    }

    /// Lets requests go while the window has room; arms a timer for a limit that holds the
    /// next one back.
    fn run(&self, st: &mut State) {
        loop {
            let now = self.now();
            let fits = Self::fits(st);
            match st.sched.pick(now, fits) {
                Pick::Go { flow, phase, demand, item } => {
                    if item.send(()).is_err() {
                        continue; // its waiter went away: nothing to run
                    }
                    Self::started(st, flow, phase, &demand, now);
                }
                Pick::Full => return,
                Pick::Idle(None) => return,
                Pick::Idle(Some(due)) => {
                    self.arm(st, due, now);
                    return;
                }
            }
        }
    }

    fn arm(&self, st: &mut State, due: f64, now: f64) {
        if st.timer_at.is_some_and(|t| t <= due) {
            return;
        }
        let (Ok(rt), Some(me)) = (tokio::runtime::Handle::try_current(), self.me.upgrade()) else {
            return;
        };
        st.timer_at = Some(due);
        // The timer has millisecond ticks: wake a tick late rather than early (an early wake
        // finds nothing due and would re-arm at once). Tags are computed from tags, not from
        // when a request went, so a late one does not lower the rate a limit gives.
        let wait = Duration::from_secs_f64((due - now).max(0.0)) + Duration::from_millis(1);
        rt.spawn(async move {
            tokio::time::sleep(wait).await;
            let mut st = me.state.lock();
            if st.timer_at == Some(due) {
                st.timer_at = None;
            }
            me.run(&mut st);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::meta::Layout;

    fn profile() -> CostProfile {
        CostProfile::Plain {
            layout: Layout::Raid0 { width: 1 },
            chunk_bytes: 4096,
            class: DriveClass::Capacity,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_limit_holds_through_the_dispatcher_and_rates_are_reported() {
        let d = Dispatcher::new(None);
        assert!(!d.active());
        let f = d.flow("v");
        d.set("v", QosSpec { iops_limit: Some(100), ..QosSpec::default() });
        assert!(d.active());
        let start = tokio::time::Instant::now();
        for _ in 0..600 {
            let g = d.admit(f, &profile(), OpKind::Read, 4096).await;
            drop(g);
        }
        let took = start.elapsed().as_secs_f64();
        assert!((5.9..6.1).contains(&took), "600 requests at 100/s took {took} s");
        let r = d.rates("v");
        assert_eq!(r.ops, 600);
        assert!(r.iops.abs_diff(100) <= 2, "{r:?}");
        d.set("v", QosSpec::default());
        assert!(!d.active(), "no settings left: off");
    }

    /// One drive serving one request at a time, 1 ms each (1000/s), behind the dispatcher: a
    /// flood (weight 900, qd 64) and `res` (weight 100, qd 16) for 10 s of simulated time.
    /// Returns what each got per second.
    async fn flood_and_res(res: QosSpec) -> (f64, f64) {
        use crate::format::meta::ClassCalibration;
        let cal = Calibration {
            measured_unix_secs: 0,
            classes: vec![ClassCalibration {
                class: DriveClass::Capacity,
                drives: 1,
                read_iops: 1000,
                write_iops: 1000,
                read_bytes_per_sec: 1 << 30,
                write_bytes_per_sec: 1 << 30,
                read_latency_us: 4000,
            }],
        };
        let d = Dispatcher::new(Some(cal));
        d.set("flood", QosSpec { weight: Some(900), ..QosSpec::default() });
        d.set("res", res);
        let drive = Arc::new(tokio::sync::Mutex::new(()));
        let end = tokio::time::Instant::now() + Duration::from_secs(10);
        let mut tasks = Vec::new();
        for (name, depth) in [("flood", 64), ("res", 16)] {
            let flow = d.flow(name);
            for _ in 0..depth {
                let (d, drive) = (Arc::clone(&d), Arc::clone(&drive));
                tasks.push(tokio::spawn(async move {
                    let mut done = 0u64;
                    while tokio::time::Instant::now() < end {
                        let _grant = d.admit(flow, &profile(), OpKind::Read, 4096).await;
                        let _busy = drive.lock().await;
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        done += 1;
                    }
                    (name, done)
                }));
            }
        }
        let (mut flood, mut res) = (0.0, 0.0);
        for t in tasks {
            match t.await.expect("a worker") {
                ("flood", n) => flood += n as f64 / 10.0,
                (_, n) => res += n as f64 / 10.0,
            }
        }
        (flood, res)
    }

    #[tokio::test(start_paused = true)]
    async fn a_reservation_holds_against_a_flood_on_a_busy_drive() {
        // Without a reservation the weights give res a tenth: about 100/s.
        let (flood, res) = flood_and_res(QosSpec { weight: Some(100), ..QosSpec::default() }).await;
        assert!((80.0..130.0).contains(&res), "res {res}, flood {flood}");
        // Reserved 300/s: it gets them, and the drive stays busy.
        let (flood, res) = flood_and_res(QosSpec { iops_reserve: Some(300), ..QosSpec::default() }).await;
        assert!(res >= 0.95 * 300.0, "res {res}, flood {flood}");
        assert!(res <= 1.1 * 300.0, "no more than the reservation when its weight gives less: {res}");
        assert!(flood + res >= 950.0, "the drive stays busy: {flood} + {res}");
    }

    #[tokio::test(start_paused = true)]
    async fn rounding_in_the_cost_sums_never_leaves_a_large_request_waiting() {
        use crate::format::meta::ClassCalibration;
        // Costs of 1e6/7 and 1e6/13 us: added and taken away in this order, the sum is left at
        // 1.5e-11, not 0. A request larger than the window must still go once nothing runs (it
        // used to wait forever: a client hung in the first real-client run with QoS on).
        let cal = Calibration {
            measured_unix_secs: 0,
            classes: vec![ClassCalibration {
                class: DriveClass::Capacity,
                drives: 1,
                read_iops: 7,
                write_iops: 13,
                read_bytes_per_sec: 1 << 40,
                write_bytes_per_sec: 1 << 40,
                // A window of 20 s of class time: the read and the write fit together; the
                // 1 MiB read below (256 reads, 36.6 s) only fits alone.
                read_latency_us: 10_000_000,
            }],
        };
        let d = Dispatcher::new(Some(cal));
        let f = d.flow("v");
        d.set("v", QosSpec { weight: Some(100), ..QosSpec::default() });
        let p = profile();
        let both =
            async { (d.admit(f, &p, OpKind::Read, 4096).await, d.admit(f, &p, OpKind::Write, 4096).await) };
        let (r, w) = tokio::time::timeout(Duration::from_secs(1), both).await.expect("both fit the window");
        drop(r);
        drop(w);
        let big = tokio::time::timeout(Duration::from_secs(1), d.admit(f, &p, OpKind::Read, 1 << 20)).await;
        assert!(big.is_ok(), "a request larger than the window waits with nothing in flight");
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_dropped_while_it_waits_gives_its_turn_back() {
        let d = Dispatcher::new(None);
        let f = d.flow("v");
        d.set("v", QosSpec { weight: Some(100), ..QosSpec::default() });
        let p = profile();
        // A 1 MiB read fills the window: the next one waits; its future is dropped once its turn
        // has been given (the first finishes meanwhile) but before it ran.
        let first = d.admit(f, &p, OpKind::Read, 1 << 20).await;
        let mut second = Box::pin(d.admit(f, &p, OpKind::Read, 1 << 20));
        assert!(futures::poll!(second.as_mut()).is_pending(), "the window is full");
        drop(first); // the second gets the turn, but nobody polls it
        drop(second);
        let third = tokio::time::timeout(Duration::from_secs(1), d.admit(f, &p, OpKind::Read, 1 << 20)).await;
        assert!(third.is_ok(), "the dropped request's turn came back");
    }

    #[tokio::test(start_paused = true)]
    async fn the_window_holds_requests_until_others_finish() {
        let d = Dispatcher::new(None);
        let f = d.flow("v");
        d.set("v", QosSpec { weight: Some(100), ..QosSpec::default() });
        // A 1 MiB read of 4 KiB chunks costs more than the window (256 reads of an uncalibrated
        // class: 2.6 ms; the window is 1 ms): one goes alone, the next waits for it.
        let p = profile();
        let first = d.admit(f, &p, OpKind::Read, 1 << 20).await;
        let second = tokio::spawn({
            let d = Arc::clone(&d);
            async move { d.admit(f, &p, OpKind::Read, 1 << 20).await }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!second.is_finished(), "the window is full");
        drop(first);
        let _second = second.await.expect("granted once the first finished");
    }
}
