//! The `stria` command: CLI and daemon in one binary.
#![forbid(unsafe_code)]

/// `println!` that never panics: a closed stdout ends the output, not the command (stdio.rs).
macro_rules! outln {
    () => {
        $crate::stdio::out(format_args!(""))
    };
    ($($arg:tt)*) => {
        $crate::stdio::out(format_args!($($arg)*))
    };
}

/// `eprintln!` that never panics: a closed stderr loses the line, nothing else (stdio.rs).
macro_rules! errln {
    ($($arg:tt)*) => {
        $crate::stdio::err(format_args!($($arg)*))
    };
}

mod config;
mod control;
mod daemon;
mod drive_check;
mod http;
mod iostat;
mod jobs;
mod nbd_limits;
mod ops;
mod output;
mod pooldir;
mod refusal;
mod stats;
mod stdio;
mod transfer;

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use serde_json::Value;
use stria_catalog::{Catalog, CreateVolume, QosUpdate, Setting, StatusView};
use stria_engine::units::{parse_block_size, parse_size};
use stria_engine::{DriveClass, ScrubReport};

use daemon::{NbdAddr, ServeOptions};
use ops::{Ctx, Progress, Request};
use pooldir::{DriveSpec, Opener, PoolDir};

/// stria: software-defined block storage for NVMe flash.
#[derive(Debug, Parser)]
#[command(name = "stria", version, about, propagate_version = true)]
struct Cli {
    /// The pool directory (drive files, config, lock, control socket).
    #[arg(long, global = true, default_value = "./stria-data", env = "STRIA_POOL")]
    pool: PathBuf,
    /// Log level: error, warn, info, debug or trace (or a tracing filter).
    #[arg(long, global = true, default_value = "info", env = "STRIA_LOG")]
    log_level: String,
    /// Log format: text (for people) or json (one object per line, for collectors).
    #[arg(long, global = true, default_value = "text", env = "STRIA_LOG_FORMAT", value_parser = ["text", "json"])]
    log_format: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create or inspect the pool.
    #[command(subcommand)]
    Pool(PoolCmd),
    /// Create, list, show, resize, delete, import and export volumes.
    #[command(subcommand)]
    Volume(VolumeCmd),
    /// List, fail and replace drives; clear their error counters.
    #[command(subcommand)]
    Drive(DriveCmd),
    /// Make and list snapshots of tiered and log volumes (exported read-only as VOL@SNAP).
    #[command(subcommand)]
    Snapshot(SnapshotCmd),
    /// Verify every block of a volume, repair what fails, check parity and copies agree.
    Scrub {
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// Drives, volumes, states and counters.
    Status {
        #[arg(long)]
        json: bool,
    },
    /// Run the daemon: export every volume over NBD until SIGTERM/SIGINT.
    Serve(ServeArgs),
    /// Live I/O of each volume (as its NBD clients see it: requests and MB per second, mean and
    /// p99 latency, requests in flight) and each drive, every INTERVAL seconds. Needs the daemon.
    Iostat {
        /// Seconds between reports (fractions allowed).
        #[arg(default_value = "1", value_parser = parse_interval)]
        interval: f64,
        /// Number of reports (default: until interrupted).
        count: Option<u64>,
    },
    /// Create the default demo pool if there is none (2 fast + 6 capacity file drives and a
    /// tiered:ec:4+2 volume vol0), then serve it.
    Up(UpArgs),
}

#[derive(Debug, Subcommand)]
enum PoolCmd {
    /// Measure what each drive class delivers (a few seconds per class, on scratch space, beside
    /// client I/O): QoS costs and reservations are counted against it. Run once by the first
    /// QoS reservation or weight; run again after the drives change.
    Calibrate {
        #[arg(long)]
        json: bool,
    },
    /// Resume writes suspended because the filesystem holding the drives filled up (free
    /// space there first): resynchronises what the failed writes touched, then resumes.
    Clear,
    /// Move extents until every drive of a class is within 5 % of even use (after `drive add`),
    /// copied while I/O goes on; a restart resumes it. In the daemon it runs in the background
    /// (`status` shows the progress).
    Rebalance {
        /// Bytes copied per second at most, e.g. 100M (default: no limit besides QoS).
        #[arg(long, value_parser = parse_size, default_value = "0")]
        rate: u64,
        #[arg(long)]
        json: bool,
    },
    /// Create a pool from sparse files in the pool directory and/or given devices.
    Create {
        /// Pool name.
        #[arg(long, default_value = "stria")]
        name: String,
        /// Number of fast drives to create as sparse files.
        #[arg(long, default_value_t = 0)]
        fast: usize,
        /// Number of capacity drives to create as sparse files.
        #[arg(long, default_value_t = 0)]
        capacity: usize,
        /// Size of each sparse-file drive (e.g. 4G, 512M, 1TiB).
        #[arg(long, value_parser = parse_block_size, default_value = "4G")]
        drive_size: u64,
        /// An existing device or file: CLASS:PATH[:DOMAIN] (repeat).
        #[arg(long = "drive")]
        drives: Vec<DriveSpec>,
        /// Format PATH even though it is a drive of another pool (repeat; each such --drive must
        /// be named: that pool loses the drive).
        #[arg(long, value_name = "PATH")]
        overwrite: Vec<PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
enum VolumeCmd {
    /// Create a volume.
    Create {
        name: String,
        /// Size, e.g. 64G (at most 1024P).
        #[arg(long, value_parser = parse_volume_size)]
        size: u64,
        /// raid0[:W], raid1[:N], raid10[:WxN], ec:K+M (K+1 is RAID-5, K+2 RAID-6),
        /// tiered:ec:K+M (thin, log-structured: write cache and map on fast drives, whole
        /// stripes on ec:K+M of the capacity drives) or log:ec:K+M (the same without fast drives).
        #[arg(long)]
        layout: String,
        /// Chunk (stripe height): how much goes to one drive before the next.
        #[arg(long, value_parser = parse_block_size)]
        chunk: Option<u64>,
        /// Drive class to place it on (default: capacity if the pool has capacity drives).
        #[arg(long)]
        class: Option<DriveClass>,
        /// tiered: and log: layouts: size of the write cache (default: 1/8 of the volume).
        #[arg(long, value_parser = parse_block_size)]
        cache_size: Option<u64>,
        /// tiered: and log: layouts: copies of the write cache and the map, 2 or 3 (default 2).
        #[arg(long)]
        cache_copies: Option<u32>,
        /// tiered: and log: layouts: data bytes the segment space may grow to, taken from the pool
        /// as it fills (default: 1.5 x --size). Less than --size over-commits the volume: writes
        /// get ENOSPC when the space is full.
        #[arg(long, value_parser = parse_block_size)]
        space: Option<u64>,
        #[command(flatten)]
        qos: QosArgs,
    },
    /// Change a volume's QoS settings while it serves (settings not given are kept; `none`
    /// removes one).
    Set {
        name: String,
        #[command(flatten)]
        qos: QosArgs,
        #[arg(long)]
        json: bool,
    },
    /// List volumes.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Show one volume.
    Show {
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// Grow or shrink a volume (shrinking discards the tail, and needs --allow-shrink).
    Resize {
        name: String,
        #[arg(long, value_parser = parse_volume_size)]
        size: u64,
        /// Shrink: discard everything past the new end.
        #[arg(long)]
        allow_shrink: bool,
        /// Shrink even while NBD clients have the volume open (they get errors past the new end).
        #[arg(long)]
        force: bool,
    },
    /// Delete a volume and free its space.
    Delete {
        name: String,
        /// Delete even while NBD clients have the volume open (they are cut off).
        #[arg(long)]
        force: bool,
    },
    /// Roll a volume back to its newest snapshot (delete newer ones first to go further back):
    /// it then reads as the snapshot does, and the snapshot stays. No data is copied. Writes
    /// wait while it runs; unmount file systems on the volume first.
    Rollback {
        name: String,
        snapshot: String,
        /// Roll back even while NBD clients have the volume open (their caches go stale).
        #[arg(long)]
        force: bool,
        #[arg(long)]
        json: bool,
    },
    /// Make a writable clone of a snapshot of a log-structured volume (SOURCE is VOLUME@SNAPSHOT):
    /// it reads as the snapshot until written and shares its data; nothing is copied. It is
    /// exported over NBD as NAME and deleted with `volume delete NAME`.
    Clone {
        source: String,
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// Copy a raw image file into a volume (byte-exact).
    Import { name: String, file: PathBuf },
    /// Copy a volume out into a raw image file (byte-exact, sparse where the volume is), or onto
    /// a device (written in place). Refuses an existing file, a block device and a drive of
    /// another pool unless --overwrite; never writes a drive of this pool or one in use. A block
    /// that cannot be read (no good copy or parity) stops it, naming the block.
    Export {
        name: String,
        file: PathBuf,
        /// Replace FILE if it exists, or write over the block device it names.
        #[arg(long)]
        overwrite: bool,
        /// Go on past blocks that cannot be read: the image gets zeros there, each such range is
        /// listed, and the command exits 1.
        #[arg(long)]
        skip_unreadable: bool,
    },
}

/// QoS settings of `volume create` and `volume set` (docs/design/qos.md).
#[derive(Debug, Args)]
struct QosArgs {
    /// Most requests per second (`none`: no limit).
    #[arg(long, value_name = "IOPS", value_parser = parse_count_setting)]
    iops_limit: Option<Setting>,
    /// Most bytes per second, e.g. 200M (`none`: no limit).
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes_setting)]
    bw_limit: Option<Setting>,
    /// Requests per second guaranteed while other volumes load the same drives (`none`:
    /// none). Refused when the pool cannot deliver it beside the other reservations.
    #[arg(long, value_name = "IOPS", value_parser = parse_count_setting)]
    iops_reserve: Option<Setting>,
    /// Bytes per second guaranteed, e.g. 50M (`none`: none).
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes_setting)]
    bw_reserve: Option<Setting>,
    /// Share of what reservations leave, 1-10000 (default 100; `none`: back to the default).
    #[arg(long, value_parser = parse_count_setting)]
    weight: Option<Setting>,
}

impl QosArgs {
    fn update(&self) -> QosUpdate {
        QosUpdate {
            iops_limit: self.iops_limit,
            bw_limit: self.bw_limit,
            iops_reserve: self.iops_reserve,
            bw_reserve: self.bw_reserve,
            weight: self.weight,
        }
    }

    /// The settings of a new volume (`none` means nothing there is to remove).
    fn spec(&self) -> Result<stria_engine::QosSpec> {
        let update = self.update();
        if [update.iops_limit, update.bw_limit, update.iops_reserve, update.bw_reserve, update.weight]
            .contains(&Some(Setting::Clear))
        {
            bail!("`none` removes a setting with `volume set`; a new volume has none to remove");
        }
        update.apply(stria_engine::QosSpec::default()).map_err(anyhow::Error::msg)
    }
}

/// A volume's `--size`: whole 4 KiB blocks, and no more than a volume may be.
fn parse_volume_size(text: &str) -> Result<u64, String> {
    let bytes = parse_size(text)?;
    if bytes > stria_engine::VOLUME_BYTES_MAX {
        return Err(format!(
            "`{text}` ({bytes} bytes) is too large: a volume is at most {} (2^60 bytes)",
            stria_engine::units::format_size(stria_engine::VOLUME_BYTES_MAX)
        ));
    }
    parse_block_size(text)
}

fn parse_interval(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if (0.1..=3600.0).contains(&v) => Ok(v),
        _ => Err(format!("`{text}`: an interval in seconds from 0.1 to 3600")),
    }
}

fn parse_count_setting(text: &str) -> Result<Setting, String> {
    if text == "none" {
        return Ok(Setting::Clear);
    }
    text.parse::<u64>().map(Setting::Set).map_err(|e| format!("`{text}`: {e} (a whole number, or `none`)"))
}

fn parse_bytes_setting(text: &str) -> Result<Setting, String> {
    if text == "none" {
        return Ok(Setting::Clear);
    }
    parse_size(text).map(Setting::Set)
}

#[derive(Debug, Subcommand)]
enum SnapshotCmd {
    /// Make a snapshot: writes in flight finish first, new ones wait until it is made; it holds
    /// every write acknowledged before, none after. Served read-only over NBD as VOLUME@NAME.
    Create {
        volume: String,
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// List snapshots (of one volume, or of all).
    List {
        volume: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Delete a snapshot. No data is copied: its map pages are handed to the next older
    /// snapshot or dropped, and blocks only it held are freed for garbage collection.
    Delete {
        volume: String,
        name: String,
        /// Delete it even while NBD clients have VOLUME@NAME open (they are cut off).
        #[arg(long)]
        force: bool,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
enum DriveCmd {
    /// List drives with their counters.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Take a drive out of service (its volumes run degraded). Refused when it holds the last
    /// in-sync copy of some data, unless --force.
    Fail {
        /// Drive id (slot) or path.
        drive: String,
        /// Fail it even if some volume becomes unreadable.
        #[arg(long)]
        force: bool,
    },
    /// Bring a failed drive whose device is present again back into service: it gets a new id
    /// and is rebuilt in full from the other drives.
    Online {
        /// Drive id (slot) or path of the failed drive.
        drive: String,
        /// Bring it back even if some volume has nothing to rebuild it from.
        #[arg(long)]
        force: bool,
    },
    /// Add a drive to the pool while it serves: new volumes (and new segments of growing ones)
    /// use it at once; existing data stays where it is (docs/design/pool-growth.md).
    Add {
        /// A device or file; with --size and no PATH, a new sparse file in the pool directory.
        path: Option<PathBuf>,
        /// Its class.
        #[arg(long)]
        class: DriveClass,
        /// Size of a new sparse file (e.g. 4G).
        #[arg(long, value_parser = parse_block_size)]
        size: Option<u64>,
        /// Failure-domain label.
        #[arg(long)]
        domain: Option<String>,
        /// Format it even though it is a drive of another pool.
        #[arg(long)]
        overwrite: bool,
        /// Leave existing extents where they are (by default a rebalance onto the new drive is
        /// asked for, as `pool rebalance` does).
        #[arg(long)]
        no_rebalance: bool,
        #[arg(long)]
        json: bool,
    },
    /// Take a drive out of the pool. Its data first moves to the other drives of its class,
    /// copied while I/O goes on (in the daemon's background: `status` shows the progress, and
    /// the drive leaves once empty). Refused, with the reason, when the others cannot take it.
    Remove {
        /// Drive id (slot) or path.
        drive: String,
        /// Bytes copied per second at most, e.g. 100M (default: no limit besides QoS). Also
        /// asks for a rebalance at that rate once the drive is empty.
        #[arg(long, value_parser = parse_size, default_value = "0")]
        rate: u64,
    },
    /// Replace a drive and rebuild its data onto the replacement.
    Replace {
        /// Drive id (slot) or path of the drive to replace.
        drive: String,
        /// The replacement (a device or file; a new sparse file of the old size is created when
        /// omitted or missing).
        new: Option<PathBuf>,
        /// Failure-domain label of the replacement (default: the old drive's).
        #[arg(long)]
        domain: Option<String>,
        /// Replace even when the drive holds the last copy of some data or there is nothing to
        /// rebuild from (that data is lost).
        #[arg(long)]
        force: bool,
        /// Format the replacement even though it is a drive of another pool.
        #[arg(long)]
        overwrite: bool,
    },
    /// Limit rebuild bandwidth (e.g. 200M per second; 0 = unlimited). Kept in the pool: it
    /// applies at once and after restarts (a daemon started with --rebuild-rate, or with
    /// rebuild_rate in its configuration file, uses that instead until it stops).
    RebuildRate {
        #[arg(value_parser = parse_size)]
        rate: u64,
    },
    /// Reset a drive's error counters (read errors, write errors, checksum repairs) to zero.
    ///
    /// The counters shown by `stria status` and `stria drive list` are kept in the pool
    /// metadata and survive restarts until cleared here (like `zpool clear`).
    #[command(group(clap::ArgGroup::new("which").required(true).args(["drive", "all"])))]
    ClearErrors {
        /// Drive id (slot) or path.
        drive: Option<String>,
        /// Clear the counters of every drive.
        #[arg(long)]
        all: bool,
    },
}

#[derive(Debug, Args)]
struct ServeArgs {
    /// NBD listen address: unix:PATH or tcp:HOST:PORT (repeat; default tcp:127.0.0.1:10809).
    #[arg(long)]
    nbd: Vec<NbdAddr>,
    /// TLS: off, on (STARTTLS offered) or require (nothing else is allowed before it).
    #[arg(long, default_value = "off")]
    tls: String,
    /// PEM certificate chain for TLS.
    #[arg(long)]
    tls_cert: Option<PathBuf>,
    /// PEM private key for TLS.
    #[arg(long)]
    tls_key: Option<PathBuf>,
    /// PEM file of CA certificates: NBD clients must present a certificate from one of them
    /// (needs --tls require). The way to keep strangers off TCP (docs/nbd.md).
    #[arg(long, value_name = "FILE")]
    tls_client_ca: Option<PathBuf>,
    /// Open even without a majority of the pool's drives, losing any change recorded only on
    /// the missing ones (docs/on-disk-format.md, commit protocol).
    #[arg(long)]
    force: bool,
    /// Rebuild bandwidth limit while this daemon runs (e.g. 200M per second; 0 = unlimited).
    /// Without it, the rate kept in the pool applies (`stria drive rebuild-rate`; none at first).
    #[arg(long, value_parser = parse_size)]
    rebuild_rate: Option<u64>,
    /// Memory for cached checksum pages, split over the drives (each 4 KiB page covers 4 MiB of
    /// a drive; pages are read from the drives on demand beyond this).
    #[arg(long, value_parser = parse_size, default_value = "256M")]
    metadata_cache: u64,
    /// A TOML file of settings (contrib/stria.toml lists every key); flags given here win over
    /// it. SIGHUP re-reads it: log_level, rebuild_rate and the token file change at once.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// The file as read (set by the parser, not a flag).
    #[arg(skip)]
    config_source: Option<config::Source>,
    #[command(flatten)]
    nbd_limits: nbd_limits::NbdLimitArgs,
    /// HTTP listener for the metrics (/metrics), the REST API (/api/v1) and the dashboard (/):
    /// tcp:IP:PORT, e.g. tcp:127.0.0.1:9810 (`stria up` listens there by default). Off the
    /// loopback it needs --http-tls-cert and --http-tls-key.
    #[arg(long, value_name = "ADDR", value_parser = http::parse_addr)]
    http: Option<std::net::SocketAddr>,
    /// PEM certificate chain for HTTPS.
    #[arg(long, requires = "http")]
    http_tls_cert: Option<PathBuf>,
    /// PEM private key for HTTPS.
    #[arg(long, requires = "http")]
    http_tls_key: Option<PathBuf>,
    /// File holding the API's bearer token (default POOL/http.token, made with mode 0600 at the
    /// first start). Changes through the API need it, and so do reads off the loopback.
    #[arg(long, requires = "http")]
    http_token_file: Option<PathBuf>,
    /// The directory the REST API's volume import and export may read images from and write
    /// them to (paths given to the API are inside it); without it the API refuses both.
    #[arg(long, value_name = "DIR")]
    api_transfer_dir: Option<PathBuf>,
    /// Benchmarks only: ignore --pool and serve a new pool of COUNTxSIZE memory drives (e.g.
    /// 6x1G) that vanishes at exit, with the volumes of --bench-volume.
    #[arg(long, hide = true, value_parser = daemon::parse_memory_drives)]
    bench_memory_drives: Option<(usize, u64)>,
    /// Benchmarks only: a volume of the memory pool, NAME:LAYOUT:SIZE (repeat).
    #[arg(long, hide = true, requires = "bench_memory_drives")]
    bench_volume: Vec<daemon::MemoryVolumeSpec>,
}

#[derive(Debug, Args)]
struct UpArgs {
    #[command(flatten)]
    serve: ServeArgs,
    /// Size of each drive file of the default pool.
    #[arg(long, value_parser = parse_block_size, default_value = "2G")]
    drive_size: u64,
    /// Size of the default volume.
    #[arg(long, value_parser = parse_volume_size, default_value = "4G")]
    volume_size: u64,
    /// No HTTP listener (by default `up` serves metrics, API and dashboard on 127.0.0.1:9810).
    #[arg(long, conflicts_with = "http")]
    no_http: bool,
}

/// The layout of the volume `stria up` makes in a new pool (its help says it).
const UP_LAYOUT: &str = "tiered:ec:4+2";

/// Where `stria up` serves metrics, the REST API and the dashboard.
const DEFAULT_HTTP_PORT: u16 = 9810;

/// Parses the command line; for `serve` and `up` with `--config FILE`, adds the file's
/// settings that the command line does not give (see [`config::as_args`]).
fn parse_cli() -> Result<Cli, clap::Error> {
    use clap::{CommandFactory, FromArgMatches};
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let matches = Cli::command().try_get_matches_from(&argv)?;
    let config = match matches.subcommand() {
        Some(("serve" | "up", sub)) => sub.get_one::<PathBuf>("config").cloned().map(|p| (p, sub.clone())),
        _ => None,
    };
    let Some((path, sub)) = config else { return Cli::from_arg_matches(&matches) };
    let file = match config::load(&path) {
        Ok(f) => f,
        Err(e) => {
            return Err(
                Cli::command().error(clap::error::ErrorKind::InvalidValue, format!("--config: {e:#}"))
            );
        }
    };
    let (extra, overridden) = config::as_args(&file, &matches, &sub);
    let matches = Cli::command()
        .try_get_matches_from(argv.into_iter().chain(extra.into_iter().map(Into::into)))
        .map_err(|e| {
            Cli::command()
                .error(e.kind(), format!("in {}: {}", path.display(), e.render().to_string().trim()))
        })?;
    let mut cli = Cli::from_arg_matches(&matches)?;
    if let Command::Serve(a) | Command::Up(UpArgs { serve: a, .. }) = &mut cli.command {
        a.config_source = Some(config::Source { path, file, overridden });
    }
    Ok(cli)
}

/// Changes the log filter of the running process (SIGHUP with a new `log_level`).
pub(crate) fn set_log_level(text: &str) -> Result<(), String> {
    let filter = log_filter(text)?;
    let handle = LOG_FILTER.get().ok_or("logging is not set up")?;
    handle.reload(filter).map_err(|e| e.to_string())
}

/// The log filter's reload handle, set once at start.
static LOG_FILTER: std::sync::OnceLock<
    tracing_subscriber::reload::Handle<tracing_subscriber::EnvFilter, tracing_subscriber::Registry>,
> = std::sync::OnceLock::new();

fn main() {
    use tracing_subscriber::prelude::*;
    let cli = parse_cli().unwrap_or_else(|e| e.exit());
    let filter = match log_filter(&cli.log_level) {
        Ok(f) => f,
        Err(e) => {
            errln!("error: {e}");
            std::process::exit(2);
        }
    };
    let (filter, handle) = tracing_subscriber::reload::Layer::new(filter);
    let _ = LOG_FILTER.set(handle);
    // Colour only on a terminal (a log file gets plain text), and never with NO_COLOR set.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr()) && std::env::var_os("NO_COLOR").is_none();
    let format = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_target(false);
    let format = if cli.log_format == "json" {
        format.json().with_current_span(false).boxed()
    } else {
        format.with_ansi(ansi).boxed()
    };
    tracing_subscriber::registry().with(filter).with(format).init();
    // Runtime threads: one per CPU this process may run on (taskset/cpusets are honoured); on a
    // single CPU everything runs on the main thread (a current-thread runtime), which there
    // avoids handing requests between threads that share the core: measured through NBD on one
    // pinned core, 4 KiB QD1 reads 9.7k -> 14.7k IOPS and QD16 writes 88k -> 111k.
    // STRIA_WORKER_THREADS overrides it (0 = current-thread).
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    let default_threads = if cpus == 1 { 0 } else { cpus.min(64) };
    let threads = std::env::var("STRIA_WORKER_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(default_threads);
    let runtime = match threads {
        0 => tokio::runtime::Builder::new_current_thread().enable_all().build(),
        n => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(n)
            .thread_stack_size(RUNTIME_STACK_BYTES)
            .enable_all()
            .build(),
    };
    let runtime = match runtime {
        Ok(rt) => rt,
        Err(e) => {
            errln!("error: cannot start the async runtime: {e}");
            std::process::exit(1);
        }
    };
    let pool_path = cli.pool.clone();
    // On a thread of its own with a large stack: an unoptimized build polls the commands' futures
    // with stack frames of several MiB each (the release build needs far less).
    let result = std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name("stria-main".into())
            .stack_size(RUNTIME_STACK_BYTES)
            .spawn_scoped(scope, || runtime.block_on(Box::pin(run(cli))))
            .map_err(anyhow::Error::from)
            .and_then(|t| t.join().unwrap_or_else(|_| Err(anyhow::anyhow!("the command panicked"))))
    });
    let code = match result {
        Ok(code) => stdio::exit_code(code),
        Err(e) if e.downcast_ref::<Interrupted>().is_some() => {
            errln!("error: {e:#}");
            INTERRUPTED
        }
        Err(e) => {
            let message = format!("{e:#}");
            errln!("error: {message}");
            // Refused because writes are suspended (the engine's message names no command).
            if refusal::kind_of(&e) == stria_engine::ErrorKind::Suspended {
                errln!(
                    "hint: free space on the filesystem holding the drives, then run `stria pool clear --pool {}`",
                    pool_path.display()
                );
            }
            1
        }
    };
    // The message is out before the runtime winds down (its tasks are dropped, its threads
    // joined): whatever happens there, the operator has read why the command failed.
    drop(runtime);
    std::process::exit(code);
}

/// Stack of the thread that runs a command and of the runtime's workers (virtual memory: pages
/// are only used as the stack grows).
const RUNTIME_STACK_BYTES: usize = 64 << 20;

/// `--log-level`: a level (error, warn, info, debug, trace, off) or a tracing filter with
/// directives (`stria=debug,warn`). A bare word that is not a level is refused: the filter
/// syntax would take it as a module name and log nothing.
fn log_filter(text: &str) -> Result<tracing_subscriber::EnvFilter, String> {
    const LEVELS: [&str; 6] = ["error", "warn", "info", "debug", "trace", "off"];
    let bare = text
        .split(',')
        .any(|d| !d.contains('=') && !LEVELS.contains(&d.trim().to_ascii_lowercase().as_str()));
    if text.trim().is_empty() || bare {
        return Err(format!(
            "invalid --log-level `{text}`: use one of {} or a filter such as `stria=debug,warn`",
            LEVELS.join(", ")
        ));
    }
    tracing_subscriber::EnvFilter::try_new(text).map_err(|e| format!("invalid --log-level `{text}`: {e}"))
}

/// Exit codes of `stria status` (also in the README): 0 all healthy, 2 something degraded or
/// rebuilding (all data readable, redundancy reduced), 3 something failed or unavailable (some
/// data unreadable). Errors running the command exit 1.
const STATUS_DEGRADED: i32 = 2;
const STATUS_FAILED: i32 = 3;

/// Runs a command; returns the exit code (0 unless `status` reports a problem).
async fn run(cli: Cli) -> Result<i32> {
    let dir = PoolDir::new(&cli.pool);
    match cli.command {
        Command::Pool(PoolCmd::Calibrate { json }) => {
            let v = request(&dir, Request::PoolCalibrate).await?;
            if json { print_json(&v) } else { output::calibration(&view(v)?) }
        }
        Command::Pool(PoolCmd::Rebalance { rate, json }) => {
            let v = request(&dir, Request::PoolRebalance { rate_bytes_per_sec: rate }).await?;
            if json {
                print_json(&v);
            } else if v["rebalance"] == "done" {
                let r = &v["report"];
                outln!(
                    "rebalance done: {} extent(s) moved, {} copied",
                    r["moves"],
                    stria_engine::units::format_size(r["bytes_copied"].as_u64().unwrap_or(0))
                );
                if let Some(why) = r["stuck"].as_str() {
                    outln!("not everything could move: {why}");
                }
            } else {
                outln!("rebalance running in the daemon; `stria status` shows its progress");
            }
        }
        Command::Pool(PoolCmd::Clear) => {
            let v = request(&dir, Request::PoolClear).await?;
            if v["was_suspended"].is_null() {
                outln!("writes were not suspended; nothing to clear");
            } else {
                let r = &v["resync"];
                outln!(
                    "writes resumed: {} rows resynchronised ({} parity and {} copy blocks rewritten)",
                    r["rows_resynced"],
                    r["parity_blocks_rewritten"],
                    r["copy_blocks_rewritten"]
                );
            }
        }
        Command::Pool(PoolCmd::Create { name, fast, capacity, drive_size, drives, overwrite }) => {
            let existed = dir.path.exists();
            let lock = dir.lock_new()?;
            let pool = match dir.create_pool(&name, fast, capacity, drive_size, &drives, &overwrite).await {
                Ok(pool) => pool,
                Err(e) => {
                    // A refused create leaves nothing behind: the directories it made are
                    // removed if they are empty (never anything else).
                    drop(lock);
                    if !existed {
                        let _ = std::fs::remove_file(dir.path.join(".lock"));
                        let _ = std::fs::remove_dir(dir.drives_dir());
                        let _ = std::fs::remove_dir(&dir.path);
                    }
                    return Err(e);
                }
            };
            let status = pool.status();
            pool.close().await?;
            outln!("created pool {} with {} drives in {}", name, status.drives.len(), dir.path.display());
            output::drives(&status.drives);
            warn_overcommit(&dir);
        }
        Command::Volume(cmd) => volume(&dir, cmd).await?,
        Command::Drive(cmd) => drive(&dir, cmd).await?,
        Command::Snapshot(cmd) => snapshot(&dir, cmd).await?,
        Command::Scrub { name, json } => scrub(&dir, name, json).await?,
        Command::Status { json } => return status(&dir, json).await,
        Command::Serve(args) => serve(dir, args).await?,
        Command::Iostat { interval, count } => {
            let socket = dir.control_socket();
            if !control::daemon_running(&socket).await {
                bail!(
                    "no daemon is serving {}: iostat shows what `stria serve` (or `stria up`) counts; start it first",
                    dir.path.display()
                );
            }
            let sample = || async {
                let v = control::call(&socket, Request::Stats, |_| {}).await?;
                view::<stats::StatsView>(v)
            };
            iostat::run(std::time::Duration::from_secs_f64(interval), count, sample).await?;
        }
        Command::Up(args) => up(dir, args).await?,
    }
    Ok(0)
}

/// Warns (on stderr) when sparse drive files promise more than their filesystem has.
fn warn_overcommit(dir: &PoolDir) {
    for w in dir.overcommit_warnings() {
        errln!("warning: {w}");
    }
}

/// `stria snapshot ...`.
async fn snapshot(dir: &PoolDir, cmd: SnapshotCmd) -> Result<()> {
    match cmd {
        SnapshotCmd::Create { volume, name, json } => {
            let v = request(dir, Request::SnapshotCreate { volume, name }).await?;
            if json {
                print_json(&v);
            } else {
                let s: stria_catalog::SnapshotView = view(v)?;
                outln!("made snapshot {} of {} (export {}, read-only)", s.name, s.volume, s.export);
            }
        }
        SnapshotCmd::List { volume, json } => {
            let v = request(dir, Request::SnapshotList { volume }).await?;
            if json {
                print_json(&v);
            } else {
                output::snapshots(&view::<Vec<stria_catalog::SnapshotView>>(v)?);
            }
        }
        SnapshotCmd::Delete { volume, name, force, json } => {
            let v = request(dir, Request::SnapshotDelete { volume, name, force }).await?;
            if json {
                print_json(&v);
            } else {
                let d: stria_catalog::SnapshotDeletedView = view(v)?;
                if d.kept_for_clones {
                    outln!(
                        "deleted snapshot {} of {}: it has clones, so its map pages are kept (hidden) until the last of them is deleted; nothing freed yet",
                        d.name,
                        d.volume
                    );
                    return Ok(());
                }
                outln!(
                    "deleted snapshot {} of {} in {:.3} s: {} map pages handed on, {} dropped, {} blocks freed for GC",
                    d.name,
                    d.volume,
                    d.seconds,
                    d.map_pages_handed_on,
                    d.map_pages_dropped,
                    d.blocks_freed
                );
            }
        }
    }
    Ok(())
}

/// `stria volume ...`.
async fn volume(dir: &PoolDir, cmd: VolumeCmd) -> Result<()> {
    match cmd {
        VolumeCmd::Create { name, size, layout, chunk, class, cache_size, cache_copies, space, qos } => {
            let req = Request::VolumeCreate(CreateVolume {
                name,
                size_bytes: size,
                layout,
                chunk_bytes: chunk,
                class,
                cache_bytes: cache_size,
                cache_copies,
                space_bytes: space,
                qos: qos.spec()?,
            });
            let v = request(dir, req).await?;
            output::volume(&view(v)?);
            Ok(())
        }
        VolumeCmd::Set { name, qos, json } => {
            let update = qos.update();
            if update.is_empty() {
                bail!(
                    "nothing to set: give --iops-limit, --bw-limit, --iops-reserve, --bw-reserve or --weight"
                );
            }
            let v = request(dir, Request::VolumeSet { name, qos: update }).await?;
            if json {
                print_json(&v)
            } else {
                output::volume(&view(v)?)
            }
            Ok(())
        }
        VolumeCmd::List { json } => {
            let v = request(dir, Request::Status).await?;
            if json {
                print_json(&serde_json::to_value(view::<StatusView>(v)?.volume_list())?);
            } else {
                output::volumes(&view(v)?);
            }
            Ok(())
        }
        VolumeCmd::Show { name, json } => {
            let v = request(dir, Request::VolumeShow { name }).await?;
            if json {
                print_json(&v)
            } else {
                output::volume(&view(v)?)
            }
            Ok(())
        }
        VolumeCmd::Resize { name, size, allow_shrink, force } => {
            let v =
                request(dir, Request::VolumeResize { name, size_bytes: size, force, allow_shrink }).await?;
            output::volume(&view(v)?);
            Ok(())
        }
        VolumeCmd::Delete { name, force } => {
            request(dir, Request::VolumeDelete { name: name.clone(), force }).await?;
            outln!("deleted volume {name}");
            Ok(())
        }
        VolumeCmd::Clone { source, name, json } => {
            let v = request(dir, Request::VolumeClone { source, name }).await?;
            if json {
                print_json(&v);
            } else {
                let c: stria_catalog::CloneView = view(v)?;
                outln!("made clone {} of {}@{} (export {}, writable)", c.name, c.origin, c.snapshot, c.name);
            }
            Ok(())
        }
        VolumeCmd::Rollback { name, snapshot, force, json } => {
            let v = request(dir, Request::VolumeRollback { volume: name, snapshot, force }).await?;
            if json {
                print_json(&v);
            } else {
                let r: stria_catalog::RollbackView = view(v)?;
                outln!(
                    "rolled {} back to snapshot {} in {:.3} s: {} blocks changed",
                    r.volume,
                    r.snapshot,
                    r.seconds,
                    r.blocks_changed
                );
            }
            Ok(())
        }
        VolumeCmd::Import { name, file } => {
            let path = pooldir::absolute(&file)?;
            let v = request(dir, Request::VolumeImport { name, path }).await?;
            outln!("imported {} bytes into {}", v["bytes"], v["volume"].as_str().unwrap_or(""));
            Ok(())
        }
        VolumeCmd::Export { name, file, overwrite, skip_unreadable } => {
            let path = pooldir::absolute(&file)?;
            let v = request(dir, Request::VolumeExport { name, path, overwrite, skip_unreadable }).await?;
            outln!(
                "exported {} bytes of {} to {}",
                v["bytes"],
                v["volume"].as_str().unwrap_or(""),
                file.display()
            );
            let unreadable = v["unreadable"].as_array().cloned().unwrap_or_default();
            if unreadable.is_empty() {
                return Ok(());
            }
            for r in &unreadable {
                let (offset, len) =
                    (r["offset_bytes"].as_u64().unwrap_or(0), r["len_bytes"].as_u64().unwrap_or(0));
                errln!(
                    "unreadable: bytes {offset}..{} ({} blocks of 4 KiB) are zeros in {}",
                    offset + len,
                    len.div_ceil(4096),
                    file.display()
                );
            }
            bail!(
                "{} bytes of {} could not be read (listed above); everything else was copied",
                v["unreadable_bytes"],
                v["volume"].as_str().unwrap_or("")
            )
        }
    }
}

/// `stria scrub`: fails when it found what it could not repair or decide.
async fn scrub(dir: &PoolDir, name: String, json: bool) -> Result<()> {
    let v = request(dir, Request::Scrub { name }).await?;
    let report: ScrubReport = view(v.clone())?;
    if json {
        print_json(&v)
    } else {
        output::scrub(&report)
    }
    if report.unrecoverable_blocks > 0 {
        bail!("scrub found unrecoverable blocks");
    }
    if report.inconsistent_blocks > 0 {
        bail!(
            "scrub found copies or parity that disagree with nothing to say which is current; \
             they were left as they are (see the log for where)"
        );
    }
    Ok(())
}

/// `stria status`: exits 0 when all is healthy, [`STATUS_DEGRADED`] or [`STATUS_FAILED`]
/// otherwise.
async fn status(dir: &PoolDir, json: bool) -> Result<i32> {
    let v = request(dir, Request::Status).await?;
    let status: StatusView = view(v.clone())?;
    if json {
        print_json(&v)
    } else {
        output::status(&status)
    }
    warn_overcommit(dir);
    Ok(status_code(&status))
}

/// The exit code `stria status` gives for what it shows.
fn status_code(v: &StatusView) -> i32 {
    use stria_engine::VolumeState as S;
    let states = v.pool.volumes.iter().map(|x| x.state).chain(v.log.iter().map(|t| t.state));
    let mut code = 0;
    for s in states {
        match s {
            S::Failed => return STATUS_FAILED,
            S::Degraded | S::Rebuilding => code = STATUS_DEGRADED,
            S::Healthy => {}
        }
    }
    if !v.unavailable.is_empty() {
        return STATUS_FAILED;
    }
    if code == 0 && (v.pool.suspended.is_some() || v.pool.drives.iter().any(|d| d.state != "active")) {
        code = STATUS_DEGRADED;
    }
    code
}

/// `stria serve`.
async fn serve(dir: PoolDir, mut args: ServeArgs) -> Result<()> {
    if let Some((drives, drive_bytes)) = args.bench_memory_drives {
        let volumes = std::mem::take(&mut args.bench_volume);
        let spec = daemon::MemoryPoolSpec { drives, drive_bytes, volumes };
        let opts = serve_tls_options(args)?;
        return daemon::serve_memory(spec, opts, |uris| print_ready(uris, None)).await;
    }
    let opts = serve_options(&dir, args)?;
    daemon::serve(dir, opts, |uris| print_ready(uris, None)).await
}

/// `stria up`: the default pool, created on first use, then served.
async fn up(dir: PoolDir, args: UpArgs) -> Result<()> {
    if !dir.exists() {
        let _lock = dir.lock_new()?;
        let pool = std::sync::Arc::new(dir.create_pool("stria", 2, 6, args.drive_size, &[], &[]).await?);
        let catalog = Catalog::open(pool).await?;
        let vol0 = CreateVolume {
            name: "vol0".into(),
            size_bytes: args.volume_size,
            layout: UP_LAYOUT.into(),
            chunk_bytes: None,
            class: None,
            cache_bytes: None,
            cache_copies: None,
            space_bytes: None,
            qos: Default::default(),
        };
        catalog.create(vol0).await?;
        catalog.close().await?;
        errln!(
            "created the default pool in {} (2 fast + 6 capacity drives) with volume vol0 ({UP_LAYOUT})",
            dir.path.display()
        );
    }
    warn_overcommit(&dir);
    let mut serve = args.serve;
    if serve.nbd.is_empty() {
        serve.nbd = vec![NbdAddr::Unix(dir.default_nbd_socket()), NbdAddr::Tcp("127.0.0.1:10809".into())];
    }
    if serve.http.is_none() && !args.no_http {
        serve.http = Some(std::net::SocketAddr::from(([127, 0, 0, 1], DEFAULT_HTTP_PORT)));
    }
    let opts = serve_options(&dir, serve)?;
    let pool_dir = dir.path.display().to_string();
    daemon::serve(dir, opts, move |uris| print_ready(uris, Some(&pool_dir))).await
}

/// `stria drive ...`.
async fn drive(dir: &PoolDir, cmd: DriveCmd) -> Result<()> {
    match cmd {
        DriveCmd::List { json } => {
            let v = request(dir, Request::Status).await?;
            if json { print_json(&v["drives"]) } else { output::drives(&view::<StatusView>(v)?.pool.drives) }
        }
        DriveCmd::Fail { drive, force } => {
            let v = request(dir, Request::DriveFail { drive, force }).await?;
            outln!(
                "drive {} failed; its volumes run degraded until it is replaced \
                 (or brought back with `stria drive online {}`)",
                v["failed"],
                v["failed"]
            );
        }
        DriveCmd::Online { drive, force } => {
            let v = request(dir, Request::DriveOnline { drive, force }).await?;
            outln!(
                "drive {} is back in service as drive {}; rebuild {}",
                v["online"],
                v["new_drive"],
                v["rebuild"].as_str().unwrap_or("")
            );
        }
        DriveCmd::Add { path, class, size, domain, overwrite, no_rebalance, json } => {
            if path.is_none() && size.is_none() {
                bail!("give the drive's PATH, or --size to create a new sparse file in the pool directory");
            }
            // Relative to where the command runs, not where the daemon does.
            let path = path.map(|p| pooldir::absolute(&p)).transpose()?;
            let add = Request::DriveAdd { class, path, size_bytes: size, domain, overwrite, no_rebalance };
            let v = request(dir, add).await?;
            if json {
                print_json(&v);
            } else {
                outln!("added drive {}; rebalance {}", v["added"], v["rebalance"].as_str().unwrap_or(""));
                let status: stria_engine::PoolStatus = view(v["status"].clone())?;
                output::drives(&status.drives);
            }
        }
        DriveCmd::Remove { drive, rate } => {
            let v = request(dir, Request::DriveRemove { drive, rate_bytes_per_sec: rate }).await?;
            if !v["draining"].is_null() {
                outln!(
                    "drive {} is draining: its data moves to the other drives in the daemon, then it leaves the \
                     pool (`stria status` shows the progress)",
                    v["draining"]
                );
                return Ok(());
            }
            outln!("removed drive {}", v["removed"]);
            if let Some(kept) = v["file_kept_as"].as_str() {
                outln!("its file was kept as {kept}");
            }
        }
        DriveCmd::Replace { drive, new, domain, force, overwrite } => {
            let new_path = new.map(|p| pooldir::absolute(&p)).transpose()?;
            let v = request(dir, Request::DriveReplace { drive, new_path, domain, force, overwrite }).await?;
            outln!(
                "drive {} replaced by drive {}; rebuild {}",
                v["replaced"],
                v["new_drive"],
                v["rebuild"].as_str().unwrap_or("")
            );
            if let Some(kept) = v["old_file_kept_as"].as_str() {
                outln!("the old drive file was kept as {kept}; delete it once the rebuild is done");
            }
        }
        DriveCmd::RebuildRate { rate } => {
            request(dir, Request::RebuildRate { bytes_per_sec: rate }).await?;
            if rate == 0 {
                outln!("rebuild rate set to unlimited (kept in the pool)");
            } else {
                outln!("rebuild rate set to {}/s (kept in the pool)", stria_engine::units::format_size(rate));
            }
        }
        DriveCmd::ClearErrors { drive, all: _ } => {
            let v = request(dir, Request::DriveClearErrors { drive }).await?;
            output::cleared_errors(&v);
        }
    }
    Ok(())
}

fn serve_options(dir: &PoolDir, args: ServeArgs) -> Result<ServeOptions> {
    if !dir.exists() {
        bail!(
            "no pool at {}; create one with `stria pool create --pool {} --fast 2 --capacity 6 --drive-size 4G` \
             (or run `stria up` for a default one)",
            dir.path.display(),
            dir.path.display()
        );
    }
    serve_tls_options(args)
}

/// The options of `stria serve` that do not depend on the pool directory.
fn serve_tls_options(args: ServeArgs) -> Result<ServeOptions> {
    let tls_mode = args.tls.parse().map_err(|e| anyhow::anyhow!("--tls: {e}"))?;
    Ok(ServeOptions {
        nbd: args.nbd,
        tls_mode,
        tls_cert: args.tls_cert,
        tls_key: args.tls_key,
        tls_client_ca: args.tls_client_ca,
        force: args.force,
        rebuild_rate_bytes: args.rebuild_rate,
        metadata_cache_bytes: args.metadata_cache,
        nbd_limits: args.nbd_limits,
        config: args.config_source,
        http: args.http.map(|addr| http::HttpOptions {
            addr,
            tls_cert: args.http_tls_cert,
            tls_key: args.http_tls_key,
            token_file: args.http_token_file,
            transfer_dir: args.api_transfer_dir,
        }),
    })
}

/// Where to connect; with `examples` (the pool directory), client commands to try.
fn print_ready(uris: &[String], examples: Option<&str>) {
    outln!("stria is serving; NBD URIs (replace VOLUME by a volume name):");
    for u in uris.iter().filter(|u| u.starts_with("nbd")) {
        outln!("  {u}");
    }
    for u in uris.iter().filter(|u| u.starts_with("http")) {
        outln!("dashboard: {u}   metrics: {u}metrics   REST API: {u}api/v1/status");
    }
    if let Some(pool_dir) = examples {
        let u = uris.first().map(|u| u.replace("VOLUME", "vol0")).unwrap_or_default();
        outln!("try:");
        outln!("  nbdinfo '{u}'");
        outln!("  qemu-io -f raw '{u}' -c 'write -P 0xab 0 1M' -c 'read -P 0xab 0 1M'");
        outln!("  nbdcopy /path/to/image.raw '{u}'");
        outln!("  stria status --pool {pool_dir}      # from another terminal");
        outln!("stop with Ctrl-C (or SIGTERM): requests in flight finish, everything is flushed");
    }
}

/// A reply as the typed view it was made from.
fn view<T: serde::de::DeserializeOwned>(v: Value) -> Result<T> {
    serde_json::from_value(v).context("the reply does not match this version of stria")
}

fn print_json(v: &Value) {
    outln!("{}", serde_json::to_string_pretty(v).expect("JSON values serialize"));
}

/// Runs a request through the daemon if one serves the pool, otherwise here.
async fn request(dir: &PoolDir, req: Request) -> Result<Value> {
    let mut bar = output::Bar::new();
    let socket = dir.control_socket();
    if control::daemon_running(&socket).await {
        let v = control::call(&socket, req, |p| bar.update(&p)).await;
        bar.finish();
        return v;
    }
    let _lock = dir.lock()?;
    let catalog = Catalog::open(std::sync::Arc::new(dir.open_pool(Opener::Command).await?)).await?;
    let ctx = Ctx { catalog: &catalog, dir, daemon: false, clients: None };
    let read_only = req.is_read_only();
    let bar = parking_lot::Mutex::new(bar);
    let finish = || std::mem::replace(&mut *bar.lock(), output::Bar::new()).finish();
    let mut on_progress = |p: Progress| bar.lock().update(&p);
    let work = ops::execute(&ctx, req, &mut on_progress);
    if read_only {
        let result = work.await;
        finish();
        catalog.close().await?;
        return result;
    }
    // A change may run long (a rebuild, a scrub, an import): Ctrl-C or SIGTERM stops it at its
    // next safe point and closes the pool cleanly, as the daemon does at shutdown.
    tokio::pin!(work);
    let signal = tokio::select! {
        result = &mut work => {
            finish();
            catalog.close().await?;
            return result;
        }
        // (Were the signals not to be had, the operation just runs to its end.)
        Ok(signal) = interrupt() => signal,
    };
    errln!("\n{signal}: stopping at the next safe point and closing the pool (again to exit at once)");
    tokio::spawn(async {
        if interrupt().await.is_ok() {
            errln!("exiting at once: the next open recovers the pool as after a crash");
            std::process::exit(INTERRUPTED);
        }
    });
    // The close refuses new requests and rebuild or move rows, waits for those in flight and
    // flushes; the operation, still polled meanwhile, ends at its next step.
    let (closed, result) = tokio::join!(catalog.close(), work);
    finish();
    closed?;
    if let Err(e) = result {
        tracing::debug!(error = %format!("{e:#}"), "the interrupted operation ended with an error");
    }
    Err(Interrupted(format!(
        "interrupted by {signal}: the pool was closed cleanly. What the command had not done yet is not \
         done; a rebuild or rebalance in progress goes on when the daemon starts (`stria serve --pool {}`) \
         and `stria status` shows what is left",
        dir.path.display()
    ))
    .into())
}

/// What an offline command ended with when a signal stopped it (exit code [`INTERRUPTED`]).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Interrupted(String);

/// The exit code of a command stopped by SIGINT or SIGTERM (128 + SIGINT, as shells report).
const INTERRUPTED: i32 = 130;

/// Waits for SIGINT or SIGTERM; returns which.
async fn interrupt() -> Result<&'static str> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut int = signal(SignalKind::interrupt())?;
    let mut term = signal(SignalKind::terminate())?;
    Ok(tokio::select! {
        _ = int.recv() => "SIGINT",
        _ = term.recv() => "SIGTERM",
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use stria_engine::EngineError;

    /// The commands a message quotes between backticks, split into words.
    fn quoted_commands(message: &str) -> Vec<Vec<String>> {
        message
            .split('`')
            .skip(1)
            .step_by(2)
            .map(|c| c.split_whitespace().map(String::from).collect())
            .collect()
    }

    /// Parses a quoted command as the shell would hand it to stria.
    fn parse(words: &[String]) -> Cli {
        Cli::try_parse_from(words)
            .unwrap_or_else(|e| panic!("`{}` is not a valid command: {e}", words.join(" ")))
    }

    fn no_quorum() -> EngineError {
        EngineError::NoQuorum { present: 1, total: 2, needed: 2, missing: "slot 1 (d1)".into() }
    }

    #[test]
    fn the_no_quorum_hint_of_a_command_without_force_names_one_that_takes_it() {
        // `volume export` opens the pool itself when no daemon runs, and takes no --force.
        assert!(Cli::try_parse_from(["stria", "volume", "export", "v", "v.raw", "--force"]).is_err());
        let message = PoolDir::new("/srv/tank").no_quorum_message(&no_quorum(), Opener::Command);
        let commands = quoted_commands(&message);
        assert_eq!(commands.len(), 1, "{message}");
        let cli = parse(&commands[0]);
        assert!(matches!(cli.command, Command::Serve(ServeArgs { force: true, .. })), "{message}");
        assert_eq!(cli.pool, PathBuf::from("/srv/tank"), "the hint names the same pool");
    }

    #[test]
    fn the_no_quorum_hint_of_the_daemon_names_its_own_flag() {
        let message = PoolDir::new("p").no_quorum_message(&no_quorum(), Opener::Daemon { force: false });
        assert!(message.contains("again with --force"), "{message}");
        // Both commands that open as the daemon take it.
        for args in [["stria", "serve", "--force"], ["stria", "up", "--force"]] {
            Cli::try_parse_from(args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
        }
    }

    #[test]
    fn the_missing_pool_hints_name_commands_that_work() {
        let dir = PoolDir::new("/nonexistent/stria-pool");
        let missing = format!("{:#}", dir.config().unwrap_err());
        let Cli { command: Command::Serve(args), .. } = parse(&["stria".into(), "serve".into()]) else {
            panic!("serve parses as serve");
        };
        let serve = format!("{:#}", serve_options(&dir, args).unwrap_err());
        for message in [missing, serve] {
            let commands = quoted_commands(&message);
            assert!(!commands.is_empty(), "{message}");
            for words in commands {
                let cli = parse(&words);
                if let Command::Pool(PoolCmd::Create { fast, capacity, drives, .. }) = cli.command {
                    assert!(
                        fast + capacity + drives.len() > 0,
                        "`{}` would create no drive",
                        words.join(" ")
                    );
                }
            }
        }
    }

    #[test]
    fn up_says_which_volume_it_makes() {
        use clap::CommandFactory;
        let mut cli = Cli::command();
        let up = cli.find_subcommand_mut("up").expect("up");
        let help = up.render_long_help().to_string();
        assert!(help.contains(&format!("a {UP_LAYOUT} volume vol0")), "{help}");
    }

    #[test]
    fn clear_errors_takes_one_drive_or_all() {
        let parsed =
            |args: &[&str]| Cli::try_parse_from(["stria", "drive", "clear-errors"].iter().chain(args));
        assert!(matches!(
            parsed(&["3"]).map(|c| c.command),
            Ok(Command::Drive(DriveCmd::ClearErrors { drive: Some(d), all: false })) if d == "3"
        ));
        assert!(matches!(
            parsed(&["--all"]).map(|c| c.command),
            Ok(Command::Drive(DriveCmd::ClearErrors { drive: None, all: true }))
        ));
        assert!(parsed(&[]).is_err(), "a drive or --all is required");
        assert!(parsed(&["3", "--all"]).is_err(), "not both");
    }
}
