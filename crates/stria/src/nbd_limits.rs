//! `stria serve`'s NBD limits: flags (and `[limits]` keys of the config file) that override
//! `stria_nbd::Limits`' defaults. docs/nbd.md describes each limit and what it protects.

use anyhow::{Result, anyhow};
use clap::Args;
use stria_engine::units::parse_size;
use stria_nbd::{ConfigError, Limits};

/// The NBD limits an operator may set; `None` keeps the server's default.
#[derive(Debug, Clone, Default, PartialEq, Eq, Args)]
pub(crate) struct NbdLimitArgs {
    /// NBD connections in transmission at once; a handshake that ends beyond it is refused
    /// (default 128). Each is guaranteed one request of --nbd-payload-max bytes, so this sizes
    /// the daemon's worst-case memory (docs/nbd.md).
    #[arg(long, value_name = "N")]
    pub(crate) nbd_connections_max: Option<usize>,
    /// NBD connections in transmission from one peer: one TCP address, or one local user on a
    /// Unix socket (root and the daemon's own user are not limited per peer) (default 64, at
    /// most --nbd-connections-max).
    #[arg(long, value_name = "N")]
    pub(crate) nbd_connections_per_peer_max: Option<usize>,
    /// NBD connections in the handshake at once; beyond it a new connection takes the place of
    /// the least active handshake (default 64).
    #[arg(long, value_name = "N")]
    pub(crate) nbd_handshakes_max: Option<usize>,
    /// NBD connections in the handshake from one peer; beyond it a new one takes the place of
    /// that peer's least active handshake (default 16, at most --nbd-handshakes-max).
    #[arg(long, value_name = "N")]
    pub(crate) nbd_handshakes_per_peer_max: Option<usize>,
    /// Largest NBD read or write, advertised as the maximum block size (default 4M).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub(crate) nbd_payload_max: Option<u64>,
    /// Bytes one NBD connection may hold for requests in flight (default 16M).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub(crate) nbd_in_flight_max: Option<u64>,
    /// Bytes NBD connections may hold for requests in flight beyond the one request each is
    /// guaranteed, all together (default 64M).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub(crate) nbd_in_flight_shared: Option<u64>,
    /// Microseconds an NBD connection keeps polling for its next request without sleeping,
    /// after it last did something: server CPU traded for latency (default 100; 0 sleeps at
    /// once; the window halves while a client pauses; docs/nbd.md).
    #[arg(long, value_name = "MICROSECONDS", value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    pub(crate) nbd_busy_poll: Option<u64>,
    /// Threads NBD connections run on: each connection is served on one of them from accept
    /// to close, the one with the fewest connections when it came (default: one per CPU the
    /// daemon may use when it has more than one; 0 serves connections on the daemon's shared
    /// runtime; docs/design/datapath.md).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(0..=1024))]
    pub(crate) nbd_threads: Option<u64>,
}

/// The flag that sets a field of [`Limits`], for error messages.
const FLAGS: &[(&str, &str)] = &[
    ("max_connections", "--nbd-connections-max"),
    ("max_connections_per_peer", "--nbd-connections-per-peer-max"),
    ("max_handshaking", "--nbd-handshakes-max"),
    ("max_handshaking_per_peer", "--nbd-handshakes-per-peer-max"),
    ("max_payload_bytes", "--nbd-payload-max"),
    ("max_in_flight_bytes", "--nbd-in-flight-max"),
    ("max_shared_in_flight_bytes", "--nbd-in-flight-shared"),
];

impl NbdLimitArgs {
    /// The server's limits with these applied. A per-peer limit not given is lowered to the
    /// server-wide one when that is smaller.
    pub(crate) fn limits(&self) -> Result<Limits> {
        let mut limits = Limits::default();
        if let Some(n) = self.nbd_connections_max {
            limits.max_connections = n;
            limits.max_connections_per_peer = limits.max_connections_per_peer.min(n);
        }
        if let Some(n) = self.nbd_connections_per_peer_max {
            limits.max_connections_per_peer = n;
        }
        if let Some(n) = self.nbd_handshakes_max {
            limits.max_handshaking = n;
            limits.max_handshaking_per_peer = limits.max_handshaking_per_peer.min(n);
        }
        if let Some(n) = self.nbd_handshakes_per_peer_max {
            limits.max_handshaking_per_peer = n;
        }
        if let Some(bytes) = self.nbd_payload_max {
            limits.max_payload_bytes =
                u32::try_from(bytes).map_err(|_| anyhow!("--nbd-payload-max must be below 4G"))?;
        }
        if let Some(bytes) = self.nbd_in_flight_max {
            limits.max_in_flight_bytes =
                usize::try_from(bytes).map_err(|_| anyhow!("--nbd-in-flight-max is too large"))?;
        }
        if let Some(bytes) = self.nbd_in_flight_shared {
            limits.max_shared_in_flight_bytes =
                usize::try_from(bytes).map_err(|_| anyhow!("--nbd-in-flight-shared is too large"))?;
        }
        if let Some(us) = self.nbd_busy_poll {
            limits.busy_poll = std::time::Duration::from_micros(us);
        }
        Ok(limits)
    }

    /// How many connection threads the NBD server gets: `--nbd-threads`, else one per CPU this
    /// process may run on when that is more than one (on one CPU a second thread would only
    /// take turns with the runtime's; connections then run on the runtime, as before).
    pub(crate) fn connection_threads(&self) -> usize {
        connection_threads(self.nbd_threads)
    }
}

/// Connection threads of a front end: `asked`, else one per CPU this process may run on when
/// that is more than one (at most 64), else none.
pub(crate) fn connection_threads(asked: Option<u64>) -> usize {
    match asked {
        Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
        None => match std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get) {
            1 => 0,
            cpus => cpus.min(64),
        },
    }
}

/// Says which flag a limit error is about.
pub(crate) fn explain(error: ConfigError) -> anyhow::Error {
    match &error {
        ConfigError::BadLimit { name, reason } => match FLAGS.iter().find(|(field, _)| field == name) {
            Some((_, flag)) => anyhow!("{flag} ({name}) is out of range: {reason}"),
            None => anyhow!(error),
        },
        _ => anyhow!(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_override_defaults_and_clamp_per_peer_limits() {
        assert_eq!(NbdLimitArgs::default().limits().expect("defaults"), Limits::default());
        let few =
            NbdLimitArgs { nbd_connections_max: Some(8), nbd_handshakes_max: Some(4), ..Default::default() };
        let limits = few.limits().expect("valid");
        assert_eq!((limits.max_connections, limits.max_connections_per_peer), (8, 8));
        assert_eq!((limits.max_handshaking, limits.max_handshaking_per_peer), (4, 4));
        let sized = NbdLimitArgs {
            nbd_payload_max: Some(1 << 20),
            nbd_in_flight_max: Some(8 << 20),
            nbd_in_flight_shared: Some(0),
            nbd_connections_per_peer_max: Some(2),
            ..Default::default()
        };
        let limits = sized.limits().expect("valid");
        assert_eq!(limits.max_payload_bytes, 1 << 20);
        assert_eq!((limits.max_in_flight_bytes, limits.max_shared_in_flight_bytes), (8 << 20, 0));
        assert_eq!(limits.max_connections_per_peer, 2);
        let too_big = NbdLimitArgs { nbd_payload_max: Some(1 << 32), ..Default::default() };
        assert!(too_big.limits().is_err());
    }

    #[test]
    fn limit_errors_name_the_flag() {
        let error =
            explain(ConfigError::BadLimit { name: "max_in_flight_bytes", reason: "must be at most 4 GiB" });
        assert_eq!(
            error.to_string(),
            "--nbd-in-flight-max (max_in_flight_bytes) is out of range: must be at most 4 GiB"
        );
    }
}
