//! The pool's dispatcher: requests of every volume with QoS wait in [`Scheduler`] queues and
//! go, dmClock's way, while the cost in flight on each drive class stays under a window (the
//! calibrated latency at queue depth 32: enough work to keep the class busy, little enough
//! that who goes next is decided here and not by the drives' queues).
//!
//! With no setting on any volume the dispatcher is off: [`Dispatcher::active`] is one read of a
//! flag that changes only with the settings, and requests go straight to the volume. With any
//! setting every request of the pool goes through it (a flood without settings must be held
//! back for a reservation to mean anything).
//!
//! **Per-core shards** (docs/design/qos.md, "Per-core shards"). The scheduler and the window
//! are one per pool, under one lock. So that a request does not take that lock when nothing
//! is being decided, each thread admits through a shard of its own (threads are spread
//! over `min(CPUs, 16)` shards), which holds a *lease* on part of the window: while no request
//! waits anywhere, a request of a flow with no reservation and no limit goes on its shard's
//! lease, under the shard's lock only, and its finish returns the cost to the lease. Such a
//! request is one that dmClock would let go at once too: nothing is queued, its flow has no
//! limit to hold it, and the window has room (the lease is part of the window, taken from it
//! under the pool's lock). The shard charges the work to the flow's weight tag and rates at a
//! periodic exchange (every [`EXCHANGE_SECONDS`] and at each second's turn), the distributed
//! form of dmClock's accounting. As soon as a request must wait, nothing goes on a lease: every
//! request then goes through the scheduler, and each lease comes back to the window as its
//! requests finish (at once, for a shard with none in flight), so what waits is decided by the
//! tags exactly as without shards.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
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

/// The most shards a dispatcher has.
const MAX_SHARDS: usize = 16;
/// How often a shard with admits of its own hands their accounting to the scheduler.
const EXCHANGE_SECONDS: f64 = 0.010;
/// The share of a class's window a shard leases at a time (at least the request's cost).
const LEASE_FRACTION: f64 = 1.0 / 8.0;

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
    fn count(&mut self, second: u64, ops: u64, bytes: u64, phase: Phase) {
        self.ops += ops;
        if phase == Phase::Reservation {
            self.reserved_ops += ops;
        }
        let b = &mut self.ring[(second % RING as u64) as usize];
        if b.second != second {
            *b = Bucket { second, ops: 0, bytes: 0 };
        }
        b.ops += ops;
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

    /// Whether a request of this flow may go on a shard's lease: no reservation (whose tags
    /// and counts the scheduler keeps) and no limit (which may hold a request back).
    fn leasable(&self) -> bool {
        self.spec.iops_limit.is_none()
            && self.spec.bw_limit.is_none()
            && self.spec.iops_reserve.is_none()
            && self.spec.bw_reserve.is_none()
    }
}

struct State {
    sched: Scheduler<oneshot::Sender<()>>,
    names: HashMap<String, FlowId>,
    flows: Vec<FlowState>,
    calibration: Option<Calibration>,
    /// Changed with every setting: a shard whose copy of `leasable` is of another generation
    /// refreshes it.
    generation: u64,
    /// Cost in flight per class, and the most there may be.
    in_flight: [f64; 2],
    /// Requests in flight per class (the cost sums carry rounding: "nothing in flight" is
    /// told by the count, and the sum is reset to 0 with it).
    in_flight_ops: [u32; 2],
    window: [f64; 2],
    /// Cost leased to shards per class (in flight on their leases or not), and how many shards
    /// hold a lease (0: the sum is reset to 0, as `in_flight` is).
    leased: [f64; 2],
    lease_holders: u32,
    /// When the armed timer fires, if one is.
    timer_at: Option<f64>,
    /// How often shards took a lease and requests went through the scheduler (tests).
    leases_taken: u64,
    scheduled: u64,
}

/// A flow's admits on a shard since its last exchange.
#[derive(Debug, Clone, Copy, Default)]
struct Unreported {
    ops: u64,
    bytes: u64,
    cost: f64,
    /// The latest admit's time, and its second (a second's counts are reported before the next
    /// second's begin).
    last: f64,
    second: u64,
}

/// One shard's lease and its admits (see the module docs).
#[derive(Debug, Default)]
struct ShardState {
    /// `State::generation` of `leasable` (0: never copied; generations start at 1).
    generation: u64,
    leasable: Vec<bool>,
    /// The calibration of that generation (costs are computed with it).
    calibration: Option<Calibration>,
    /// Cost leased, and the part of it in flight, per class; requests in flight on the lease.
    leased: [f64; 2],
    in_use: [f64; 2],
    in_use_ops: u32,
    holds_lease: bool,
    unreported: Vec<Unreported>,
    next_exchange: f64,
}

/// A shard on a cache line (or more) of its own.
#[repr(align(128))]
#[derive(Default)]
struct Shard(Mutex<ShardState>);

/// The pool's QoS dispatcher (see the module docs).
pub struct Dispatcher {
    active: AtomicBool,
    /// True while requests wait in the scheduler: then nothing goes on a lease.
    contended: AtomicBool,
    /// A copy of `State::generation`, read by shards without the lock.
    generation: AtomicU64,
    epoch: Instant,
    me: Weak<Dispatcher>,
    shards: Box<[Shard]>,
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

static NEXT_SHARD: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's shard, taken round-robin at its first admit (a connection thread or a
    /// runtime worker keeps it).
    static SHARD: usize = NEXT_SHARD.fetch_add(1, Ordering::Relaxed) % MAX_SHARDS;
}

/// Leave to go, held for as long as the request runs; dropping it returns its cost to the
/// window (or to the lease of the shard it went on).
#[must_use = "the request may go only while its grant is held"]
#[derive(Debug)]
pub struct Grant<'a> {
    /// Borrowed, not counted: a reference count would be one more cache line every request
    /// of every core writes.
    dispatcher: Option<&'a Dispatcher>,
    cost: [f64; 2],
    /// The shard whose lease it went on.
    shard: Option<usize>,
}

impl Drop for Grant<'_> {
    fn drop(&mut self) {
        if let Some(d) = self.dispatcher.take() {
            match self.shard {
                Some(shard) => d.release_leased(shard, self.cost),
                None => d.release(self.cost),
            }
        }
    }
}

/// A request waiting for its turn. Dropped before it learnt the answer (its future dropped
/// mid-wait), it gives back a turn it was given, so the window does not lose that cost for
/// ever; a turn not given yet is skipped when it comes (its sender finds the receiver gone).
struct Waiting<'a> {
    rx: oneshot::Receiver<()>,
    /// Taken once the answer is in.
    dispatcher: Option<&'a Dispatcher>,
    cost: [f64; 2],
}

impl Drop for Waiting<'_> {
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
    /// An idle dispatcher with no flows, with a shard per CPU (at most 16).
    pub fn new(calibration: Option<Calibration>) -> Arc<Dispatcher> {
        let cpus = std::thread::available_parallelism().map_or(1, usize::from);
        Self::with_shards(calibration, cpus)
    }

    /// An idle dispatcher with `shards` shards (1 to 16).
    pub fn with_shards(calibration: Option<Calibration>, shards: usize) -> Arc<Dispatcher> {
        let shards = shards.clamp(1, MAX_SHARDS);
        Arc::new_cyclic(|me| Dispatcher {
            active: AtomicBool::new(false),
            contended: AtomicBool::new(false),
            generation: AtomicU64::new(1),
            epoch: Instant::now(),
            me: me.clone(),
            shards: (0..shards).map(|_| Shard::default()).collect(),
            state: Mutex::new(State {
                sched: Scheduler::default(),
                names: HashMap::new(),
                flows: Vec::new(),
                window: windows(calibration.as_ref()),
                calibration,
                generation: 1,
                in_flight: [0.0; 2],
                in_flight_ops: [0; 2],
                leased: [0.0; 2],
                lease_holders: 0,
                timer_at: None,
                leases_taken: 0,
                scheduled: 0,
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
        self.flow_locked(&mut st, name)
    }

    fn flow_locked(&self, st: &mut State, name: &str) -> FlowId {
        if let Some(&id) = st.names.get(name) {
            return id;
        }
        let id = st.sched.add_flow(FlowSpec::default());
        // Flows of a name are kept for the dispatcher's life (they are a few words each, one per
        // volume name ever served), so a volume re-created under a name reuses its flow.
        st.names.insert(name.to_string(), id);
        st.flows.push(FlowState::default());
        // Shards learn of the flow at their next lease.
        self.bump_generation(st);
        id
    }

    fn bump_generation(&self, st: &mut State) {
        st.generation += 1;
        self.generation.store(st.generation, Ordering::Relaxed);
    }

    /// Sets volume `name`'s settings (an empty spec removes them).
    pub fn set(&self, name: &str, spec: QosSpec) {
        // What shards admitted on their own so far is charged under the settings it went under.
        self.exchange_all(false);
        {
            let mut st = self.state.lock();
            let id = self.flow_locked(&mut st, name);
            st.sched.set_flow(id, flow_spec(&spec));
            st.flows[id].spec = spec;
            self.bump_generation(&mut st);
            let any = st.flows.iter().any(|f| !f.spec.is_empty());
            self.active.store(any, Ordering::Relaxed);
            // Requests already queued may go now (a limit raised or removed).
            self.run(&mut st);
        }
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
        {
            let mut st = self.state.lock();
            st.window = windows(cal.as_ref());
            st.calibration = cal;
            self.bump_generation(&mut st);
            self.run(&mut st);
        }
        // Leases were cut from the old windows: every idle one comes back.
        self.exchange_all(true);
    }

    /// What volume `name` got.
    pub fn rates(&self, name: &str) -> FlowRates {
        self.exchange_all(false);
        let st = self.state.lock();
        let second = self.now() as u64;
        st.names.get(name).map(|&id| st.flows[id].rates(second)).unwrap_or_default()
    }

    /// Waits until a request of `kind` and `bytes` of `flow` may go. Hold the grant while the
    /// request runs.
    pub async fn admit(&self, flow: FlowId, profile: &CostProfile, kind: OpKind, bytes: u64) -> Grant<'_> {
        let shard = SHARD.with(|s| *s) % self.shards.len();
        self.admit_on(shard, flow, profile, kind, bytes).await
    }

    /// [`Self::admit`] through shard `shard`.
    async fn admit_on(
        &self,
        shard: usize,
        flow: FlowId,
        profile: &CostProfile,
        kind: OpKind,
        bytes: u64,
    ) -> Grant<'_> {
        let demand_under = |cal: Option<&Calibration>| profile.demand(kind, bytes, cal);
        if !self.contended.load(Ordering::Relaxed)
            && let Some(cost) = self.try_leased(shard, flow, demand_under)
        {
            return Grant { dispatcher: Some(self), cost, shard: Some(shard) };
        }
        let (cost, rx, recall) = {
            let mut st = self.state.lock();
            st.scheduled += 1;
            let demand = demand_under(st.calibration.as_ref());
            let now = self.now();
            // Nothing queued: a request that would be picked at once goes without a queue, a
            // channel or a wait (the common case when no limit binds and the window has room).
            if st.sched.is_empty() {
                let fits = Self::fits(&st);
                if let Some(phase) = st.sched.go_now(flow, &demand, now, fits) {
                    Self::started(&mut st, flow, phase, &demand, now);
                    return Grant { dispatcher: Some(self), cost: demand.cost, shard: None };
                }
            }
            let (tx, rx) = oneshot::channel();
            st.sched.push(flow, demand, now, tx);
            self.run(&mut st);
            // It waits: leases not in use come back to the window for it.
            let recall = st.lease_holders > 0 && !st.sched.is_empty();
            (demand.cost, rx, recall)
        };
        if recall {
            self.exchange_all(true);
        }
        let mut waiting = Waiting { rx, dispatcher: Some(self), cost };
        // The sender is only dropped unsent if the dispatcher itself goes away.
        let granted = (&mut waiting.rx).await.is_ok();
        let me = waiting.dispatcher.take();
        Grant { dispatcher: me.filter(|_| granted), cost, shard: None }
    }

    /// Lets a request of `flow` go on shard `shard`'s lease if it may (see the module docs;
    /// `demand_under` gives its demand under a calibration): its cost when it went; `None` when
    /// it must go through the scheduler.
    fn try_leased(
        &self,
        shard: usize,
        flow: FlowId,
        demand_under: impl Fn(Option<&Calibration>) -> Demand,
    ) -> Option<[f64; 2]> {
        let mut sh = self.shards[shard].0.lock();
        if sh.generation != self.generation.load(Ordering::Relaxed) && !self.lease(&mut sh, None) {
            return None;
        }
        if !sh.leasable.get(flow).copied().unwrap_or(false) {
            return None;
        }
        let demand = demand_under(sh.calibration.as_ref());
        let short = |sh: &ShardState| {
            (0..2).any(|i| demand.cost[i] > 0.0 && sh.leased[i] - sh.in_use[i] < demand.cost[i])
        };
        if short(&sh) && (!self.lease(&mut sh, Some(&demand)) || short(&sh)) {
            return None;
        }
        for i in 0..2 {
            if demand.cost[i] > 0.0 {
                sh.in_use[i] += demand.cost[i];
            }
        }
        sh.in_use_ops += 1;
        let now = self.now();
        let second = now as u64;
        if sh.unreported.len() <= flow {
            sh.unreported.resize(flow + 1, Unreported::default());
        }
        let u = sh.unreported[flow];
        if (u.ops > 0 && u.second != second) || now >= sh.next_exchange {
            self.exchange(&mut sh, false);
        }
        let u = &mut sh.unreported[flow];
        u.ops += 1;
        u.bytes += demand.bytes as u64;
        u.cost += demand.total_cost();
        u.last = now;
        u.second = second;
        Some(demand.cost)
    }

    /// Under the pool's lock, while nothing is queued: refreshes the shard's copy of the
    /// settings and the calibration, and leases enough of each class's window for `demand`
    /// (at least [`LEASE_FRACTION`] of it) if there is room. False, changing no lease, when
    /// something is queued or the room is not there.
    fn lease(&self, sh: &mut ShardState, demand: Option<&Demand>) -> bool {
        let mut st = self.state.lock();
        if !st.sched.is_empty() {
            return false;
        }
        if sh.generation != st.generation {
            sh.leasable = st.flows.iter().map(FlowState::leasable).collect();
            sh.calibration.clone_from(&st.calibration);
            sh.generation = st.generation;
        }
        let Some(demand) = demand else { return true };
        let take = [0, 1].map(|i| {
            let short = demand.cost[i] - (sh.leased[i] - sh.in_use[i]);
            if demand.cost[i] == 0.0 || short <= 0.0 {
                return Some(0.0);
            }
            let room = st.window[i] - st.in_flight[i] - st.leased[i];
            (room >= short).then(|| short.max(st.window[i] * LEASE_FRACTION).min(room))
        });
        let [Some(take0), Some(take1)] = take else { return false };
        for (i, take) in [take0, take1].into_iter().enumerate() {
            sh.leased[i] += take;
            st.leased[i] += take;
        }
        if !sh.holds_lease {
            sh.holds_lease = true;
            st.lease_holders += 1;
        }
        st.leases_taken += 1;
        true
    }

    /// The periodic exchange of a shard: hands what it admitted to the scheduler (the flows'
    /// weight tags and rates). With `give_back`, also returns the part of its lease not in
    /// flight to the window (all of it when nothing is) and lets waiting requests go.
    fn exchange(&self, sh: &mut ShardState, give_back: bool) {
        let mut st = self.state.lock();
        for (flow, u) in sh.unreported.iter_mut().enumerate() {
            if u.ops > 0 {
                st.sched.charge(flow, u.cost, u.last);
                st.flows[flow].count(u.second, u.ops, u.bytes, Phase::Weight);
                *u = Unreported::default();
            }
        }
        sh.next_exchange = self.now() + EXCHANGE_SECONDS;
        if !give_back || !sh.holds_lease {
            return;
        }
        if sh.in_use_ops == 0 {
            sh.holds_lease = false;
            st.lease_holders -= 1;
            for i in 0..2 {
                st.leased[i] =
                    if st.lease_holders == 0 { 0.0 } else { (st.leased[i] - sh.leased[i]).max(0.0) };
            }
            sh.leased = [0.0; 2];
            sh.in_use = [0.0; 2];
        } else {
            for i in 0..2 {
                let idle = (sh.leased[i] - sh.in_use[i]).max(0.0);
                st.leased[i] = (st.leased[i] - idle).max(0.0);
                sh.leased[i] -= idle;
            }
        }
        if !st.sched.is_empty() {
            self.run(&mut st);
        }
    }

    /// Exchanges every shard (`give_back`: and takes back their idle leases).
    fn exchange_all(&self, give_back: bool) {
        for shard in &self.shards {
            let mut sh = shard.0.lock();
            if sh.holds_lease || sh.unreported.iter().any(|u| u.ops > 0) {
                self.exchange(&mut sh, give_back);
            }
        }
    }

    /// Returns a finished request's cost to its shard's lease; while requests wait, the lease
    /// goes back to the window.
    fn release_leased(&self, shard: usize, cost: [f64; 2]) {
        let mut sh = self.shards[shard].0.lock();
        for (i, c) in cost.into_iter().enumerate() {
            if c > 0.0 {
                sh.in_use[i] = (sh.in_use[i] - c).max(0.0);
            }
        }
        sh.in_use_ops -= 1;
        if sh.in_use_ops == 0 {
            sh.in_use = [0.0; 2];
        }
        if self.contended.load(Ordering::Relaxed) {
            self.exchange(&mut sh, true);
        }
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

    /// Whether a request asking a demand fits the window now: each class it uses has room
    /// beside what is in flight and leased, or nothing in flight or leased there (so one larger
    /// than the window still goes).
    fn fits(st: &State) -> impl Fn(&Demand) -> bool + use<> {
        let (in_flight, ops, window, leased) = (st.in_flight, st.in_flight_ops, st.window, st.leased);
        move |d: &Demand| {
            (0..2).all(|i| {
                d.cost[i] == 0.0
                    || (ops[i] == 0 && leased[i] == 0.0)
                    || in_flight[i] + leased[i] + d.cost[i] <= window[i]
            })
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
        st.flows[flow].count(now as u64, 1, demand.bytes as u64, phase);
    }

    /// Lets requests go while the window has room; arms a timer for a limit that holds the
    /// next one back. Afterwards shards lease again only if nothing is left waiting.
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
                Pick::Full | Pick::Idle(None) => break,
                Pick::Idle(Some(due)) => {
                    self.arm(st, due, now);
                    break;
                }
            }
        }
        self.contended.store(!st.sched.is_empty(), Ordering::Relaxed);
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
        flood_and_res_on(res, 1).await
    }

    /// [`flood_and_res`] with the requests spread over `shards` shards (each task admits
    /// through its own, in turn).
    async fn flood_and_res_on(res: QosSpec, shards: usize) -> (f64, f64) {
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
        let d = Dispatcher::with_shards(Some(cal), shards);
        d.set("flood", QosSpec { weight: Some(900), ..QosSpec::default() });
        d.set("res", res);
        let drive = Arc::new(tokio::sync::Mutex::new(()));
        let end = tokio::time::Instant::now() + Duration::from_secs(10);
        let mut tasks = Vec::new();
        for (name, depth) in [("flood", 64), ("res", 16)] {
            let flow = d.flow(name);
            for task in 0..depth {
                let (d, drive) = (Arc::clone(&d), Arc::clone(&drive));
                let shard = task % shards;
                tasks.push(tokio::spawn(async move {
                    let mut done = 0u64;
                    while tokio::time::Instant::now() < end {
                        let _grant = d.admit_on(shard, flow, &profile(), OpKind::Read, 4096).await;
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
            async move {
                let grant = d.admit(f, &p, OpKind::Read, 1 << 20).await;
                drop(grant);
            }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!second.is_finished(), "the window is full");
        drop(first);
        second.await.expect("granted once the first finished");
    }

    #[tokio::test(start_paused = true)]
    async fn a_reservation_holds_against_a_flood_spread_over_shards() {
        // The flood has no reservation or limit: with nothing waiting its requests go on the
        // shards' leases; res's wait, and from then on everything goes by the tags.
        for shards in [2, 4] {
            let (flood, res) =
                flood_and_res_on(QosSpec { weight: Some(100), ..QosSpec::default() }, shards).await;
            assert!((80.0..130.0).contains(&res), "{shards} shards: res {res}, flood {flood}");
            let (flood, res) =
                flood_and_res_on(QosSpec { iops_reserve: Some(300), ..QosSpec::default() }, shards).await;
            assert!(res >= 0.95 * 300.0, "{shards} shards: res {res}, flood {flood}");
            assert!(res <= 1.1 * 300.0, "{shards} shards: res {res}");
            assert!(flood + res >= 950.0, "{shards} shards: the drive stays busy: {flood} + {res}");
        }
    }

    /// Two shards; flow `free` with a weight only, `reserved` with a reservation of `iops`.
    fn free_and_reserved(iops: u64) -> (Arc<Dispatcher>, FlowId, FlowId) {
        let d = Dispatcher::with_shards(None, 2);
        let (free, reserved) = (d.flow("free"), d.flow("reserved"));
        d.set("free", QosSpec { weight: Some(100), ..QosSpec::default() });
        d.set("reserved", QosSpec { iops_reserve: Some(iops), ..QosSpec::default() });
        (d, free, reserved)
    }

    #[tokio::test(start_paused = true)]
    async fn requests_with_nothing_to_decide_go_on_their_shards_lease() {
        let (d, free, reserved) = free_and_reserved(1_000_000);
        let p = profile();
        for i in 0..1000 {
            // Up to 8 in flight on each shard: the lease is taken a few times, then reused.
            let grants: Vec<Grant> = futures::future::join_all(
                (0..8).map(|k| d.admit_on((i + k) % 2, free, &p, OpKind::Read, 4096)),
            )
            .await;
            assert!(grants.iter().all(|g| g.shard.is_some()), "nothing waits: every request on a lease");
            drop(grants);
        }
        {
            let st = d.state.lock();
            assert_eq!(st.scheduled, 0, "no request of `free` went through the scheduler");
            assert!(st.leases_taken <= 8, "{} leases for 8,000 requests", st.leases_taken);
            assert_eq!(st.in_flight_ops, [0, 0]);
        }
        // The shards report what they admitted: rates, and the weight tag (charged 8,000 reads).
        let rates = d.rates("free");
        assert_eq!(rates.ops, 8000, "{rates:?}");
        // A reservation's requests always go through the scheduler (its tags decide the phase).
        for _ in 0..10 {
            let g = d.admit_on(0, reserved, &p, OpKind::Read, 4096).await;
            assert!(g.shard.is_none());
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(d.state.lock().scheduled, 10);
        assert_eq!(d.rates("reserved").reserved_ops, 10);
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_shards_lease_comes_back_for_a_request_that_waits() {
        let d = Dispatcher::with_shards(None, 2);
        let f = d.flow("v");
        d.set("v", QosSpec { weight: Some(100), ..QosSpec::default() });
        let p = profile();
        // Shard 1 leases part of the window and goes idle with it.
        drop(d.admit_on(1, f, &p, OpKind::Read, 4096).await);
        assert!(d.state.lock().leased[class_index(DriveClass::Capacity)] > 0.0);
        // A read larger than the window fits only alone: it waits for the lease, which comes back.
        let big =
            tokio::time::timeout(Duration::from_secs(1), d.admit_on(0, f, &p, OpKind::Read, 1 << 20)).await;
        let big = big.expect("the idle lease came back for the request that waited");
        assert!(big.shard.is_none());
        let st = d.state.lock();
        assert_eq!((st.leased, st.lease_holders), ([0.0; 2], 0));
    }

    /// Cost in flight through the scheduler plus every lease is within the window, but for one
    /// request larger than the window going alone.
    fn assert_the_window_holds(d: &Dispatcher) {
        let st = d.state.lock();
        for i in 0..2 {
            let used = st.in_flight[i] + st.leased[i];
            assert!(
                used <= st.window[i] + 1e-6 || (st.in_flight_ops[i] == 1 && st.leased[i] == 0.0),
                "class {i}: {used} in flight and leased, window {}",
                st.window[i]
            );
        }
    }

    /// Random requests of flows with and without reservations and limits, from many tasks over
    /// three shards, some larger than the window, held for random times: the window (cost in
    /// flight through the scheduler plus every lease) is never exceeded except by one request
    /// alone, no lease holds more than is in flight on it plus what it took, and every request
    /// goes.
    #[tokio::test(start_paused = true)]
    async fn leases_and_the_scheduler_share_one_window() {
        use rand::{Rng, SeedableRng};
        let d = Dispatcher::with_shards(None, 3);
        let specs = [
            ("a", QosSpec { weight: Some(100), ..QosSpec::default() }),
            ("b", QosSpec { weight: Some(300), ..QosSpec::default() }),
            ("r", QosSpec { iops_reserve: Some(2000), ..QosSpec::default() }),
            ("l", QosSpec { iops_limit: Some(3000), ..QosSpec::default() }),
        ];
        let flows: Vec<FlowId> = specs
            .iter()
            .map(|(n, s)| {
                d.set(n, *s);
                d.flow(n)
            })
            .collect();
        // Enough tasks that the window (100 uncalibrated 4 KiB reads) fills at times.
        const TASKS: u64 = 160;
        const PER_TASK: u64 = 60;
        let done = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for t in 0..TASKS {
            let (d, flows, done) = (Arc::clone(&d), flows.clone(), Arc::clone(&done));
            tasks.push(tokio::spawn(async move {
                let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(t);
                for _ in 0..PER_TASK {
                    let flow = flows[rng.random_range(0..flows.len())];
                    let bytes = if rng.random_bool(0.03) { 1 << 20 } else { 4096 };
                    let g = d.admit_on(rng.random_range(0..3), flow, &profile(), OpKind::Read, bytes).await;
                    assert_the_window_holds(&d);
                    for sh in d.shards.iter() {
                        let sh = sh.0.lock();
                        for i in 0..2 {
                            assert!(sh.in_use[i] <= sh.leased[i] + 1e-6, "{sh:?}");
                        }
                    }
                    tokio::time::sleep(Duration::from_micros(rng.random_range(0..2000))).await;
                    drop(g);
                    done.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
        let all = futures::future::join_all(tasks);
        tokio::time::timeout(Duration::from_secs(600), all).await.expect("every request went");
        assert_eq!(done.load(Ordering::Relaxed), TASKS * PER_TASK);
        let st = d.state.lock();
        assert!(st.leases_taken > 0 && st.scheduled > 0, "both ways were taken");
        assert_eq!(st.in_flight_ops, [0, 0]);
    }

    #[tokio::test(start_paused = true)]
    async fn what_runs_on_leases_counts_against_the_window() {
        let (d, free, reserved) = free_and_reserved(100);
        let p = profile();
        // The window holds 100 uncalibrated 4 KiB reads: 100 on leases of both shards fill it.
        let on_leases: Vec<Grant> =
            futures::future::join_all((0..100).map(|k| d.admit_on(k % 2, free, &p, OpKind::Read, 4096)))
                .await;
        assert!(on_leases.iter().all(|g| g.shard.is_some()));
        // A request through the scheduler finds no room: it waits, and so does the next of
        // `free` (something waits: no lease is used).
        let mut waits = Box::pin(d.admit_on(0, reserved, &p, OpKind::Read, 4096));
        assert!(futures::poll!(waits.as_mut()).is_pending(), "the leases fill the window");
        let mut next = Box::pin(d.admit_on(1, free, &p, OpKind::Read, 4096));
        assert!(futures::poll!(next.as_mut()).is_pending(), "a request waits: nothing goes on a lease");
        // One request on a lease finishes: its cost and the leases' idle parts go back to the
        // window, and the reservation's request (first in the tags' order) goes.
        let mut on_leases = on_leases.into_iter();
        drop(on_leases.next());
        let granted = tokio::time::timeout(Duration::from_millis(10), waits).await.expect("it went");
        assert!(granted.shard.is_none());
        drop(on_leases);
        let next = tokio::time::timeout(Duration::from_millis(10), next).await.expect("it went");
        assert!(next.shard.is_none(), "it went through the scheduler");
        drop((granted, next));
        // Nothing waits any more: the shards keep their leases (idle) for the next requests.
        let st = d.state.lock();
        assert_eq!(st.in_flight_ops, [0, 0]);
        assert!((0..2).all(|i| st.leased[i] <= st.window[i]), "{:?}", st.leased);
    }

    /// The same sharing under real threads: four runtime workers, each on the shard its thread
    /// takes, admitting and finishing requests of leased and scheduled flows at once for real
    /// time. Every request goes (no lost wakeup, no deadlock between a shard's lock and the
    /// pool's), the window holds after every admit, and once all have finished nothing is left
    /// in flight on the scheduler or on any lease.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn leases_hold_under_threads() {
        use rand::{Rng, SeedableRng};
        let d = Dispatcher::with_shards(None, 3);
        let mut flows = Vec::new();
        for (name, spec) in [
            ("a", QosSpec { weight: Some(100), ..QosSpec::default() }),
            ("b", QosSpec { weight: Some(500), ..QosSpec::default() }),
            ("r", QosSpec { iops_reserve: Some(20_000), ..QosSpec::default() }),
        ] {
            d.set(name, spec);
            flows.push(d.flow(name));
        }
        let mut tasks = Vec::new();
        for t in 0..64u64 {
            let (d, flows) = (Arc::clone(&d), flows.clone());
            tasks.push(tokio::spawn(async move {
                let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(t);
                for _ in 0..300 {
                    let flow = flows[rng.random_range(0..flows.len())];
                    let bytes = if rng.random_bool(0.01) { 1 << 20 } else { 4096 };
                    let g = d.admit(flow, &profile(), OpKind::Read, bytes).await;
                    assert_the_window_holds(&d);
                    if rng.random_bool(0.5) {
                        tokio::task::yield_now().await;
                    }
                    drop(g);
                }
            }));
        }
        let all = futures::future::join_all(tasks);
        let done = tokio::time::timeout(Duration::from_secs(60), all).await.expect("every request went");
        assert!(done.into_iter().all(|r| r.is_ok()), "a task panicked");
        for sh in d.shards.iter() {
            let sh = sh.0.lock();
            assert_eq!(sh.in_use_ops, 0, "{sh:?}");
        }
        let st = d.state.lock();
        assert_eq!(st.in_flight_ops, [0, 0]);
        assert!(st.sched.is_empty());
    }
}
