//! The target: a listener, the target names of the served volumes, one logical unit per volume,
//! and the bounds on connections and logins (docs/design/iscsi.md §1, §5).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use stria_front::Registry;
use stria_poll::ConnectionThreads;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use crate::login::{Chap, Offer};
use crate::scsi::{FileReservationStore, LogicalUnit};

/// The naming authority of every stria target name.
pub const IQN_PREFIX: &str = "iqn.2026-11.io.stria";

/// How a target behaves and what it allows.
#[derive(Debug, Clone)]
pub struct TargetConfig {
    /// The pool's name: target names are `IQN_PREFIX:POOL:VOLUME`.
    pub pool: String,
    /// Connections at once (beyond it a new one is closed at accept).
    pub max_connections: usize,
    /// Logins in progress at once.
    pub max_logins: usize,
    /// How long a login may take.
    pub login_timeout: Duration,
    /// What the target offers in negotiation.
    pub offer: Offer,
    /// CHAP credentials every login must prove (`None`: no authentication).
    pub chap: Option<Arc<Chap>>,
    /// Where persistent reservations made with APTPL are kept, a file per volume (`None`:
    /// APTPL is refused).
    pub reservations_dir: Option<std::path::PathBuf>,
    /// How long a connection's reader keeps polling for the next PDU without sleeping after
    /// the connection last read or sent one (zero: sleep at once). Adaptive: the window halves
    /// while an initiator pauses (`stria_poll::BusyPoll`, docs/iscsi.md).
    pub busy_poll: Duration,
    /// Threads connections run on, each connection (its reader, writer and commands) on one
    /// of them from accept to close (`stria_poll::ConnectionThreads`, docs/iscsi.md); 0 runs
    /// them on the runtime that accepted them.
    pub connection_threads: usize,
    /// Stack of each connection thread.
    pub connection_thread_stack_bytes: usize,
}

impl Default for TargetConfig {
    fn default() -> TargetConfig {
        TargetConfig {
            pool: "stria".into(),
            max_connections: 128,
            max_logins: 16,
            login_timeout: Duration::from_secs(15),
            offer: Offer::default(),
            chap: None,
            reservations_dir: None,
            busy_poll: Duration::from_micros(100),
            connection_threads: 0,
            connection_thread_stack_bytes: 8 << 20,
        }
    }
}

/// One part of a target name: as it is when it holds only characters an IQN allows (lower-case
/// letters, digits, `-`, `.`), otherwise `-` and its bytes in hex (volume names never start with
/// `-`, so the two forms cannot collide).
fn name_part(part: &str) -> String {
    let plain = !part.is_empty()
        && !part.starts_with('-')
        && part.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
    if plain {
        part.to_string()
    } else {
        let mut out = String::from("-");
        for b in part.bytes() {
            out.push_str(&format!("{b:02x}"));
        }
        out
    }
}

/// What every target name of `pool` starts with (`IQN_PREFIX:POOL`).
pub fn name_prefix(pool: &str) -> String {
    format!("{IQN_PREFIX}:{}", name_part(pool))
}

/// The target name of `volume` in `pool` (`VOL@SNAP` for a snapshot becomes `...:VOL:SNAP`).
pub fn target_name(pool: &str, volume: &str) -> String {
    let mut name = name_prefix(pool);
    let (vol, snap) = match volume.split_once('@') {
        Some((vol, snap)) => (vol, Some(snap)),
        None => (volume, None),
    };
    name.push(':');
    name.push_str(&name_part(vol));
    if let Some(snap) = snap {
        name.push(':');
        name.push_str(&name_part(snap));
    }
    name
}

/// Counters of what the target refused or saw, for the log and metrics.
#[derive(Debug, Default)]
pub struct TargetCounters {
    /// Connections accepted.
    pub connections: AtomicU64,
    /// Connections closed at accept: too many.
    pub refused_connections: AtomicU64,
    /// Logins that failed or timed out.
    pub failed_logins: AtomicU64,
    /// Connections closed for a protocol error.
    pub protocol_errors: AtomicU64,
    /// Sessions in the full feature phase now.
    pub sessions: AtomicU64,
}

/// An iSCSI target serving the volumes of a registry.
pub struct Target {
    pub(crate) registry: Arc<Registry>,
    pub(crate) config: TargetConfig,
    units: Mutex<HashMap<String, Arc<LogicalUnit>>>,
    next_tsih: AtomicU16,
    pub(crate) connections: Arc<Semaphore>,
    pub(crate) logins: Arc<Semaphore>,
    /// What was refused.
    pub counters: TargetCounters,
    /// Set by [`Target::shutdown`]: listeners stop accepting, connections stop taking commands.
    pub(crate) stopping: tokio::sync::watch::Sender<bool>,
    /// Where accepted connections run (`None`: on the accepting runtime).
    threads: Option<ConnectionThreads>,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target").field("pool", &self.config.pool).finish()
    }
}

impl Target {
    /// A target for the volumes `registry` serves.
    ///
    /// If the connection threads the configuration asks for cannot be started, says so and runs
    /// connections on the accepting runtime.
    pub fn new(registry: Arc<Registry>, config: TargetConfig) -> Arc<Target> {
        let threads = match config.connection_threads {
            0 => None,
            n => {
                match ConnectionThreads::start(n, "stria-iscsi-conn", config.connection_thread_stack_bytes) {
                    Ok(threads) => Some(threads),
                    Err(error) => {
                        tracing::warn!(%error, "iscsi: connection threads not started; connections run on the shared runtime");
                        None
                    }
                }
            }
        };
        Arc::new(Target {
            registry,
            connections: Arc::new(Semaphore::new(config.max_connections)),
            logins: Arc::new(Semaphore::new(config.max_logins)),
            config,
            units: Mutex::default(),
            next_tsih: AtomicU16::new(1),
            counters: TargetCounters::default(),
            stopping: tokio::sync::watch::Sender::new(false),
            threads,
        })
    }

    /// Live connections on each connection thread (empty without connection threads).
    pub fn connections_per_thread(&self) -> Vec<usize> {
        self.threads.as_ref().map_or_else(Vec::new, ConnectionThreads::live)
    }

    /// Connections in the login phase now.
    pub fn logins_in_progress(&self) -> usize {
        self.config.max_logins.saturating_sub(self.logins.available_permits())
    }

    /// The target name of a served volume.
    pub fn name_of(&self, volume: &str) -> String {
        target_name(&self.config.pool, volume)
    }

    /// The served volume whose target name is `name`.
    pub fn volume_of(&self, name: &str) -> Option<String> {
        self.registry.names().into_iter().find(|v| self.name_of(v) == name)
    }

    /// Every served volume's target name, in the order of the volumes' names.
    pub fn names(&self) -> Vec<String> {
        self.registry.names().iter().map(|v| self.name_of(v)).collect()
    }

    /// The logical unit of `volume`: one per volume name, shared by every session, kept while
    /// the volume is served (units of volumes no longer served are dropped here).
    pub(crate) fn unit(&self, volume: &str) -> Arc<LogicalUnit> {
        let mut units = self.units.lock();
        units.retain(|name, _| self.registry.contains(name));
        let name = self.name_of(volume);
        let dir = self.config.reservations_dir.as_ref();
        Arc::clone(units.entry(volume.to_string()).or_insert_with(|| {
            let unit = LogicalUnit::new(&name, &name);
            Arc::new(match dir {
                // One file per volume, named by the name's bytes in hex (snapshot names hold `@`).
                Some(dir) => {
                    let file: String = volume.bytes().map(|b| format!("{b:02x}")).collect();
                    unit.with_store(Box::new(FileReservationStore::new(dir.join(format!("{file}.pr")))))
                }
                None => unit,
            })
        }))
    }

    /// A TSIH for a new session (never 0).
    pub(crate) fn new_tsih(&self) -> u16 {
        loop {
            let t = self.next_tsih.fetch_add(1, Ordering::Relaxed);
            if t != 0 {
                return t;
            }
        }
    }

    /// Stops the target: the listeners close, logins in progress end, every session stops
    /// reading commands, answers those it runs and closes, so that nothing runs on the volumes
    /// once it returns (a session that takes longer than `grace` is left to end by itself).
    pub async fn shutdown(&self, grace: Duration) {
        self.stopping.send_replace(true);
        let deadline = tokio::time::Instant::now() + grace;
        while self.connections.available_permits() < self.config.max_connections {
            if tokio::time::Instant::now() >= deadline {
                tracing::warn!(
                    left = self.config.max_connections - self.connections.available_permits(),
                    "iscsi: connections still open after the grace period"
                );
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Accepts connections on `listener` until [`Target::shutdown`] (or the task is dropped).
    pub async fn serve(self: Arc<Self>, listener: TcpListener) -> std::io::Result<()> {
        let mut stopping = self.stopping.subscribe();
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                _ = crate::target::stopped(&mut stopping) => return Ok(()),
            };
            let (stream, peer) = match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of descriptors and the like: wait a little rather than spin.
                    tracing::warn!(error = %e, "iscsi: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let Ok(permit) = Arc::clone(&self.connections).try_acquire_owned() else {
                self.counters.refused_connections.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%peer, max = self.config.max_connections, "iscsi: connection refused: too many");
                drop(stream);
                continue;
            };
            self.counters.connections.fetch_add(1, Ordering::Relaxed);
            let target = Arc::clone(&self);
            let Some(threads) = &self.threads else {
                tokio::spawn(run_connection(target, permit, stream, peer));
                continue;
            };
            // To the connection thread with the fewest: the socket is registered with that
            // thread's reactor, and everything the connection spawns runs there too.
            match stream.into_std() {
                Ok(std) => {
                    threads.spawn(async move {
                        match TcpStream::from_std(std) {
                            Ok(stream) => run_connection(target, permit, stream, peer).await,
                            Err(e) => tracing::info!(%peer, error = %e, "iscsi: connection not registered on its thread"),
                        }
                    });
                }
                Err(e) => tracing::info!(%peer, error = %e, "iscsi: connection not handed to its thread"),
            }
        }
    }
}

/// Runs one accepted connection to its end; `permit` is its place among `max_connections`.
async fn run_connection(
    target: Arc<Target>,
    permit: tokio::sync::OwnedSemaphorePermit,
    stream: TcpStream,
    peer: SocketAddr,
) {
    let _permit = permit;
    let portal = stream.local_addr().map(portal).unwrap_or_default();
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(%peer, error = %e, "iscsi: TCP_NODELAY not set");
    }
    if let Err(e) = crate::conn::run(target, stream, peer.to_string(), portal).await {
        tracing::info!(%peer, error = %e, "iscsi: connection ended");
    }
}

/// Returns once the target is stopping (or its sender is gone).
pub(crate) async fn stopped(rx: &mut tokio::sync::watch::Receiver<bool>) {
    // The guard wait_for returns is dropped at once: it must not live across an await.
    let _ = rx.wait_for(|stop| *stop).await.map(|_| ());
}

/// `HOST:PORT` as a TargetAddress (IPv6 in brackets).
fn portal(addr: SocketAddr) -> String {
    match addr {
        SocketAddr::V4(a) => format!("{}:{}", a.ip(), a.port()),
        SocketAddr::V6(a) => format!("[{}]:{}", a.ip(), a.port()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_names_are_valid_iqns_and_never_collide() {
        assert_eq!(target_name("tank", "vm-1.disk"), "iqn.2026-11.io.stria:tank:vm-1.disk");
        assert_eq!(target_name("tank", "vm@daily"), "iqn.2026-11.io.stria:tank:vm:daily");
        assert_eq!(target_name("Tank", "My_Vol"), "iqn.2026-11.io.stria:-54616e6b:-4d795f566f6c");
        let names = ["a", "A", "a_b", "a-b", "a.b", "a@b", "-61", "ab"];
        let iqns: std::collections::HashSet<String> = names.iter().map(|n| target_name("p", n)).collect();
        assert_eq!(iqns.len(), names.len());
        for iqn in &iqns {
            assert!(
                iqn.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-.:".contains(&b)),
                "{iqn}"
            );
        }
    }
}
