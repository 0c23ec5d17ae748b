//! `stria serve --config FILE`: the daemon's settings in TOML (`contrib/stria.toml` is an
//! example with every key). Every key has a flag of the same meaning, and a flag given on the
//! command line (or its environment variable) wins over the file. Unknown keys are an error that
//! names them. SIGHUP re-reads the file and applies what can change while serving
//! ([`Reloadable`]); the rest is logged as needing a restart.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::ArgMatches;
use clap::parser::ValueSource;
use serde::Deserialize;

/// The file, as written. Sizes and rates take the CLI's forms (`200M`, `1G`, or a number).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ConfigFile {
    /// The pool directory (`--pool`).
    pub(crate) pool: Option<PathBuf>,
    /// `--log-level`: error, warn, info, debug, trace or a filter. Reloaded on SIGHUP.
    pub(crate) log_level: Option<String>,
    /// `--log-format`: `text` or `json`.
    pub(crate) log_format: Option<String>,
    /// `--nbd`, each `unix:PATH` or `tcp:HOST:PORT`.
    pub(crate) nbd: Option<Vec<String>>,
    /// `--tls`, `--tls-cert`, `--tls-key`, `--tls-client-ca` (NBD).
    pub(crate) tls: Option<NbdTls>,
    /// `--iscsi`, each `tcp:HOST:PORT`.
    pub(crate) iscsi: Option<Vec<String>>,
    /// `--iscsi-chap-user`, `--iscsi-chap-secret-file`, `--iscsi-chap-mutual-user`,
    /// `--iscsi-chap-mutual-secret-file`.
    pub(crate) iscsi_chap: Option<IscsiChap>,
    /// `--http`.
    pub(crate) http: Option<String>,
    /// `--http-tls-cert`, `--http-tls-key`.
    pub(crate) http_tls: Option<HttpTls>,
    /// `--http-token-file`. Reloaded on SIGHUP (the token is read again).
    pub(crate) http_token_file: Option<PathBuf>,
    /// `--rebuild-rate`. Reloaded on SIGHUP.
    pub(crate) rebuild_rate: Option<String>,
    /// `--metadata-cache`.
    pub(crate) metadata_cache: Option<String>,
    /// `--api-transfer-dir`: where the REST API's import and export may read and write.
    pub(crate) api_transfer_dir: Option<PathBuf>,
    pub(crate) limits: Option<Limits>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NbdTls {
    pub(crate) mode: Option<String>,
    pub(crate) cert: Option<PathBuf>,
    pub(crate) key: Option<PathBuf>,
    pub(crate) client_ca: Option<PathBuf>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct IscsiChap {
    pub(crate) user: Option<String>,
    pub(crate) secret_file: Option<PathBuf>,
    pub(crate) mutual_user: Option<String>,
    pub(crate) mutual_secret_file: Option<PathBuf>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct HttpTls {
    pub(crate) cert: Option<PathBuf>,
    pub(crate) key: Option<PathBuf>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Limits {
    /// `--nbd-connections-max`: NBD connections in transmission at once.
    pub(crate) nbd_connections: Option<usize>,
    /// `--nbd-connections-per-peer-max`: the same from one TCP address or local user.
    pub(crate) nbd_connections_per_peer: Option<usize>,
    /// `--nbd-handshakes-max`: NBD connections in the handshake at once.
    pub(crate) nbd_handshakes: Option<usize>,
    /// `--nbd-handshakes-per-peer-max`: the same from one TCP address or local user.
    pub(crate) nbd_handshakes_per_peer: Option<usize>,
    /// `--nbd-payload-max`: largest NBD read or write (a size, e.g. `4M`).
    pub(crate) nbd_payload: Option<String>,
    /// `--nbd-in-flight-max`: bytes one NBD connection may hold for requests in flight.
    pub(crate) nbd_in_flight: Option<String>,
    /// `--nbd-in-flight-shared`: bytes beyond each connection's guaranteed request, together.
    pub(crate) nbd_in_flight_shared: Option<String>,
    /// `--nbd-busy-poll`: microseconds an NBD connection polls for its next request.
    pub(crate) nbd_busy_poll: Option<u64>,
    /// `--nbd-threads`: threads NBD connections run on.
    pub(crate) nbd_threads: Option<u64>,
    /// `--iscsi-connections-max`: iSCSI connections at once.
    pub(crate) iscsi_connections: Option<usize>,
    /// `--iscsi-busy-poll`: microseconds an iSCSI connection polls for its next PDU.
    pub(crate) iscsi_busy_poll: Option<u64>,
    /// `--iscsi-threads`: threads iSCSI connections run on.
    pub(crate) iscsi_threads: Option<u64>,
    /// `--background-nice`: nice levels background work runs below host requests.
    pub(crate) background_nice: Option<u8>,
}

/// The file a daemon was started with: to re-read on SIGHUP.
#[derive(Debug, Clone)]
pub(crate) struct Source {
    pub(crate) path: PathBuf,
    /// As read at start.
    pub(crate) file: ConfigFile,
    /// Keys the command line overrode (a reload leaves them alone too).
    pub(crate) overridden: Vec<&'static str>,
}

/// Reads and parses `path`; the error names the file, line and key.
pub(crate) fn load(path: &Path) -> Result<ConfigFile> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    toml::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

/// The arguments a file may set, as `(key in the file, clap argument id)`.
const KEYS: &[(&str, &str)] = &[
    ("pool", "pool"),
    ("log_level", "log_level"),
    ("log_format", "log_format"),
    ("nbd", "nbd"),
    ("tls.mode", "tls"),
    ("tls.cert", "tls_cert"),
    ("tls.key", "tls_key"),
    ("tls.client_ca", "tls_client_ca"),
    ("iscsi", "iscsi"),
    ("iscsi_chap.user", "iscsi_chap_user"),
    ("iscsi_chap.secret_file", "iscsi_chap_secret_file"),
    ("iscsi_chap.mutual_user", "iscsi_chap_mutual_user"),
    ("iscsi_chap.mutual_secret_file", "iscsi_chap_mutual_secret_file"),
    ("http", "http"),
    ("http_tls.cert", "http_tls_cert"),
    ("http_tls.key", "http_tls_key"),
    ("http_token_file", "http_token_file"),
    ("rebuild_rate", "rebuild_rate"),
    ("metadata_cache", "metadata_cache"),
    ("api_transfer_dir", "api_transfer_dir"),
    ("limits.nbd_connections", "nbd_connections_max"),
    ("limits.nbd_connections_per_peer", "nbd_connections_per_peer_max"),
    ("limits.nbd_handshakes", "nbd_handshakes_max"),
    ("limits.nbd_handshakes_per_peer", "nbd_handshakes_per_peer_max"),
    ("limits.nbd_payload", "nbd_payload_max"),
    ("limits.nbd_in_flight", "nbd_in_flight_max"),
    ("limits.nbd_in_flight_shared", "nbd_in_flight_shared"),
    ("limits.nbd_busy_poll", "nbd_busy_poll"),
    ("limits.nbd_threads", "nbd_threads"),
    ("limits.iscsi_connections", "iscsi_connections_max"),
    ("limits.iscsi_busy_poll", "iscsi_busy_poll"),
    ("limits.iscsi_threads", "iscsi_threads"),
    ("limits.background_nice", "background_nice"),
];

/// The file's settings as command-line arguments, leaving out those given on the command line
/// or by environment (`top` and `sub` are the matches of the command and its subcommand): what
/// to insert after the subcommand's name so clap parses and checks them as it does flags.
/// Returns them with the keys the command line overrode.
pub(crate) fn as_args(
    file: &ConfigFile,
    top: &ArgMatches,
    sub: &ArgMatches,
) -> (Vec<String>, Vec<&'static str>) {
    let explicit = |id: &str| {
        [top, sub].iter().any(|m| {
            matches!(
                m.try_get_raw(id).ok().flatten().and_then(|_| m.value_source(id)),
                Some(ValueSource::CommandLine | ValueSource::EnvVariable)
            )
        })
    };
    let mut args = Vec::new();
    let mut overridden = Vec::new();
    let tls = file.tls.clone().unwrap_or_default();
    let http_tls = file.http_tls.clone().unwrap_or_default();
    let chap = file.iscsi_chap.clone().unwrap_or_default();
    let limits = file.limits.clone().unwrap_or_default();
    let path = |p: &Option<PathBuf>| p.as_ref().map(|p| vec![p.display().to_string()]);
    let count = |n: Option<usize>| n.map(|n| vec![n.to_string()]);
    let text = |t: &Option<String>| t.clone().map(|t| vec![t]);
    for (key, id) in KEYS {
        let values: Option<Vec<String>> = match *key {
            "pool" => path(&file.pool),
            "log_level" => file.log_level.clone().map(|v| vec![v]),
            "log_format" => file.log_format.clone().map(|v| vec![v]),
            "nbd" => file.nbd.clone(),
            "tls.mode" => tls.mode.clone().map(|v| vec![v]),
            "tls.cert" => path(&tls.cert),
            "tls.key" => path(&tls.key),
            "tls.client_ca" => path(&tls.client_ca),
            "iscsi" => file.iscsi.clone(),
            "iscsi_chap.user" => text(&chap.user),
            "iscsi_chap.secret_file" => path(&chap.secret_file),
            "iscsi_chap.mutual_user" => text(&chap.mutual_user),
            "iscsi_chap.mutual_secret_file" => path(&chap.mutual_secret_file),
            "http" => file.http.clone().map(|v| vec![v]),
            "http_tls.cert" => path(&http_tls.cert),
            "http_tls.key" => path(&http_tls.key),
            "http_token_file" => path(&file.http_token_file),
            "rebuild_rate" => file.rebuild_rate.clone().map(|v| vec![v]),
            "metadata_cache" => file.metadata_cache.clone().map(|v| vec![v]),
            "api_transfer_dir" => path(&file.api_transfer_dir),
            "limits.nbd_connections" => count(limits.nbd_connections),
            "limits.nbd_connections_per_peer" => count(limits.nbd_connections_per_peer),
            "limits.nbd_handshakes" => count(limits.nbd_handshakes),
            "limits.nbd_handshakes_per_peer" => count(limits.nbd_handshakes_per_peer),
            "limits.nbd_payload" => text(&limits.nbd_payload),
            "limits.nbd_in_flight" => text(&limits.nbd_in_flight),
            "limits.nbd_in_flight_shared" => text(&limits.nbd_in_flight_shared),
            "limits.nbd_busy_poll" => limits.nbd_busy_poll.map(|v| vec![v.to_string()]),
            "limits.nbd_threads" => limits.nbd_threads.map(|v| vec![v.to_string()]),
            "limits.iscsi_connections" => count(limits.iscsi_connections),
            "limits.iscsi_busy_poll" => limits.iscsi_busy_poll.map(|v| vec![v.to_string()]),
            "limits.iscsi_threads" => limits.iscsi_threads.map(|v| vec![v.to_string()]),
            "limits.background_nice" => limits.background_nice.map(|v| vec![v.to_string()]),
            _ => unreachable!("every key of KEYS is matched"),
        };
        let Some(values) = values else { continue };
        if explicit(id) {
            overridden.push(*key);
            continue;
        }
        for v in values {
            args.push(format!("--{}={v}", id.replace('_', "-")));
        }
    }
    (args, overridden)
}

/// What SIGHUP applies from the file without a restart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reloadable {
    pub(crate) log_level: Option<String>,
    pub(crate) rebuild_rate_bytes: Option<u64>,
    pub(crate) http_token_file: Option<PathBuf>,
}

/// Re-reads `path` for SIGHUP: the settings that can change live, and the keys that changed
/// but need a restart (compared with `started`, the file as read at start).
pub(crate) fn reload(path: &Path, started: &ConfigFile) -> Result<(Reloadable, Vec<&'static str>)> {
    let now = load(path)?;
    let rebuild_rate_bytes = match &now.rebuild_rate {
        Some(r) => Some(stria_engine::units::parse_size(r).map_err(anyhow::Error::msg)?),
        None => None,
    };
    if let Some(level) = &now.log_level
        && level.trim().is_empty()
    {
        bail!("{}: log_level is empty", path.display());
    }
    let mut restart = Vec::new();
    let fixed: [(&str, bool); 11] = [
        ("pool", now.pool != started.pool),
        ("log_format", now.log_format != started.log_format),
        ("nbd", now.nbd != started.nbd),
        ("tls", now.tls != started.tls),
        ("iscsi", now.iscsi != started.iscsi),
        ("iscsi_chap", now.iscsi_chap != started.iscsi_chap),
        ("http", now.http != started.http),
        ("http_tls", now.http_tls != started.http_tls),
        ("metadata_cache", now.metadata_cache != started.metadata_cache),
        ("api_transfer_dir", now.api_transfer_dir != started.api_transfer_dir),
        ("limits", now.limits != started.limits),
    ];
    for (key, changed) in fixed {
        if changed {
            restart.push(key);
        }
    }
    let live =
        Reloadable { log_level: now.log_level, rebuild_rate_bytes, http_token_file: now.http_token_file };
    Ok((live, restart))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_keys_are_refused_by_name() {
        let e = toml::from_str::<ConfigFile>("pool = \"/p\"\nrebuild_rat = \"1M\"\n").expect_err("unknown");
        assert!(e.to_string().contains("rebuild_rat"), "{e}");
        let e = toml::from_str::<ConfigFile>("[limits]\nconnections = 3\n").expect_err("unknown");
        assert!(e.to_string().contains("connections"), "{e}");
        let ok: ConfigFile = toml::from_str(
            "nbd = [\"unix:/run/s.sock\"]\n[tls]\nmode = \"off\"\n[limits]\nnbd_connections = 8\n",
        )
        .expect("parses");
        assert_eq!(ok.limits.and_then(|l| l.nbd_connections), Some(8));
        let iscsi: ConfigFile = toml::from_str(
            "iscsi = [\"tcp:0.0.0.0:3260\"]\n[iscsi_chap]\nuser = \"u\"\nsecret_file = \"/etc/s\"\n\
             [limits]\niscsi_connections = 9\niscsi_busy_poll = 0\nnbd_busy_poll = 250\nnbd_threads = 3\n\
             iscsi_threads = 0\n",
        )
        .expect("parses");
        assert_eq!(iscsi.iscsi.as_deref(), Some(&["tcp:0.0.0.0:3260".to_string()][..]));
        assert_eq!(iscsi.iscsi_chap.and_then(|c| c.secret_file), Some(PathBuf::from("/etc/s")));
        let limits = iscsi.limits.expect("limits");
        assert_eq!(
            (limits.iscsi_connections, limits.iscsi_busy_poll, limits.nbd_busy_poll),
            (Some(9), Some(0), Some(250))
        );
        assert_eq!((limits.nbd_threads, limits.iscsi_threads), (Some(3), Some(0)));
        let e = toml::from_str::<ConfigFile>("[iscsi_chap]\nsecret = \"x\"\n").expect_err("unknown");
        assert!(e.to_string().contains("secret"), "{e}");
        let nbd: ConfigFile = toml::from_str(
            "[tls]\nclient_ca = \"/etc/ca.pem\"\n[limits]\nnbd_handshakes_per_peer = 4\nnbd_in_flight_shared = \"32M\"\n",
        )
        .expect("parses");
        assert_eq!(nbd.tls.and_then(|t| t.client_ca), Some(PathBuf::from("/etc/ca.pem")));
        let limits = nbd.limits.expect("limits");
        assert_eq!(
            (limits.nbd_handshakes_per_peer, limits.nbd_in_flight_shared.as_deref()),
            (Some(4), Some("32M"))
        );
    }

    /// Every configuration file shipped in contrib/ loads with the daemon's parser, and sets the
    /// keys it shows outside any table (a key after `[tls]` belongs to that table).
    #[test]
    fn the_shipped_configuration_files_load() {
        let contrib = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../contrib");
        let mut loaded = 0;
        for entry in std::fs::read_dir(&contrib).expect("contrib/") {
            let path = entry.expect("entry").path();
            if path.extension().is_none_or(|e| e != "toml") {
                continue;
            }
            let file = load(&path).unwrap_or_else(|e| panic!("{e:#}"));
            let text = std::fs::read_to_string(&path).expect("read");
            let shown = |key: &str| text.lines().any(|l| l.starts_with(&format!("{key} =")));
            for (key, set) in [
                ("pool", file.pool.is_some()),
                ("http", file.http.is_some()),
                ("http_token_file", file.http_token_file.is_some()),
                ("rebuild_rate", file.rebuild_rate.is_some()),
                ("metadata_cache", file.metadata_cache.is_some()),
            ] {
                assert_eq!(shown(key), set, "{}: `{key}` as written and as parsed differ", path.display());
            }
            loaded += 1;
        }
        assert!(loaded > 0, "no configuration file in {}", contrib.display());
    }

    #[test]
    fn a_reload_reports_what_needs_a_restart() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("stria.toml");
        std::fs::write(&path, "pool = \"/a\"\nrebuild_rate = \"100M\"\nlog_level = \"info\"\n")
            .expect("write");
        let started = load(&path).expect("load");
        std::fs::write(&path, "pool = \"/b\"\nrebuild_rate = \"200M\"\nlog_level = \"debug\"\n")
            .expect("write");
        let (live, restart) = reload(&path, &started).expect("reload");
        assert_eq!(live.rebuild_rate_bytes, Some(200 << 20));
        assert_eq!(live.log_level.as_deref(), Some("debug"));
        assert_eq!(restart, ["pool"]);
        std::fs::write(&path, "rebuild_rate = \"fast\"\n").expect("write");
        assert!(reload(&path, &started).is_err(), "a bad value is refused, nothing applied");
    }
}
