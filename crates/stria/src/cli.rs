//! The command line: clap's definitions of every command and its arguments, their parsers, and
//! the configuration file's settings added to `serve` and `up` (`parse_cli`).

use std::path::PathBuf;

use anyhow::{Result, bail};
use clap::{Args, Parser, Subcommand};
use stria_catalog::{QosUpdate, Setting};
use stria_engine::DriveClass;
use stria_engine::units::{parse_block_size, parse_size};
use stria_tier::log::{CacheMode, GcPolicy};

use crate::daemon::{self, NbdAddr};
use crate::pooldir::DriveSpec;
use crate::{config, http, nbd_limits};

/// stria: software-defined block storage for NVMe flash.
#[derive(Debug, Parser)]
#[command(name = "stria", version, about, propagate_version = true)]
pub(crate) struct Cli {
    /// The pool directory (drive files, config, lock, control socket).
    #[arg(long, global = true, default_value = "./stria-data", env = "STRIA_POOL")]
    pub(crate) pool: PathBuf,
    /// Log level: error, warn, info, debug or trace (or a tracing filter).
    #[arg(long, global = true, default_value = "info", env = "STRIA_LOG")]
    pub(crate) log_level: String,
    /// Log format: text (for people) or json (one object per line, for collectors).
    #[arg(long, global = true, default_value = "text", env = "STRIA_LOG_FORMAT", value_parser = ["text", "json"])]
    pub(crate) log_format: String,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
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
    /// Run a cluster node (docs/design/cluster.md): serve its slices to the other nodes, take
    /// volumes nobody owns, serve the ones it owns over NBD. Needs etcd.
    #[command(subcommand)]
    Node(NodeCmd),
    /// Look at and change the cluster in etcd: status, volumes.
    #[command(subcommand)]
    Cluster(ClusterCmd),
}

#[derive(Debug, Subcommand)]
pub(crate) enum NodeCmd {
    /// Run the node until SIGTERM or SIGINT (then it closes its volumes and gives them up).
    Run(NodeRunArgs),
}

#[derive(Debug, Args)]
pub(crate) struct NodeRunArgs {
    /// The node's name, unique in the cluster.
    #[arg(long)]
    pub(crate) name: String,
    /// etcd endpoints, comma-separated (http://HOST:PORT).
    #[arg(long, value_delimiter = ',', required = true)]
    pub(crate) etcd: Vec<String>,
    /// The node's directory (its slice files live in DIR/slices).
    #[arg(long)]
    pub(crate) dir: PathBuf,
    /// Where the slice server listens (the other nodes reach this node's slices there).
    #[arg(long, default_value = "127.0.0.1:7700")]
    pub(crate) listen: String,
    /// Where the NBD server listens. Every node serves every volume: the owner itself, the
    /// others by forwarding each request to the owner (one hop more).
    #[arg(long, default_value = "127.0.0.1:10809")]
    pub(crate) nbd: String,
    /// Serve the node's metrics (`/metrics`), the cluster's status (`/api/v1/cluster`), the
    /// node's report (`/api/v1/node`) and a page showing them (`/`) here: tcp:127.0.0.1:PORT
    /// (the loopback only).
    #[arg(long, value_name = "ADDR", value_parser = crate::http::parse_addr)]
    pub(crate) http: Option<std::net::SocketAddr>,
    /// Create this many slice files if they do not exist yet (needs --slice-size).
    #[arg(long)]
    pub(crate) slices: Option<u32>,
    /// Usable bytes per new slice, e.g. 1G.
    #[arg(long, value_parser = parse_size)]
    pub(crate) slice_size: Option<u64>,
    /// Lease time to live in seconds: a dead node's volumes move this long after its last renewal.
    #[arg(long, default_value = "5")]
    pub(crate) ttl: u64,
    /// Seconds an out member's node may stay away before the member is rebuilt on another
    /// node's free slice (a node back sooner has its member rebuilt in place).
    #[arg(long, default_value = "600")]
    pub(crate) out_time: u64,
    /// Seconds requests are held past the lease deadline (etcd lost or slow) before they fail.
    #[arg(long, default_value = "60")]
    pub(crate) suspend: u64,
    /// etcd key prefix (one cluster per prefix).
    #[arg(long, default_value = "/stria/v1")]
    pub(crate) prefix: String,
}

/// A volume's new size, as `volume resize` and `cluster volume-resize` take it.
#[derive(Debug, Args)]
pub(crate) struct ResizeArgs {
    /// The new size, e.g. 20G (a whole number of 4 KiB blocks).
    #[arg(long, value_parser = parse_volume_size)]
    pub(crate) size: u64,
    /// Shrink: discard everything past the new end.
    #[arg(long)]
    pub(crate) allow_shrink: bool,
    /// Shrink even while NBD clients have the volume open (they get errors past the new end).
    #[arg(long)]
    pub(crate) force: bool,
}

/// Where the cluster's records are: etcd's endpoints and the key prefix.
#[derive(Debug, Args)]
pub(crate) struct EtcdArgs {
    /// etcd endpoints, comma-separated (http://HOST:PORT).
    #[arg(long, value_delimiter = ',', required = true)]
    pub(crate) etcd: Vec<String>,
    /// etcd key prefix (one cluster per prefix).
    #[arg(long, default_value = "/stria/v1")]
    pub(crate) prefix: String,
}

#[derive(Debug, Subcommand)]
pub(crate) enum ClusterCmd {
    /// Nodes (with their slices), volumes (owner, epoch, members in and out).
    Status {
        #[command(flatten)]
        at: EtcdArgs,
        #[arg(long)]
        json: bool,
    },
    /// Move a volume's coordination to another node with no error at its clients: the owner
    /// stops admitting requests (they wait), finishes those running, closes the volume and gives
    /// it up; NODE takes it, and the waiting requests go there. Waits for the move to finish.
    VolumeMove {
        name: String,
        /// The node to move it to (a live node; `stria cluster status` lists them).
        #[arg(required_unless_present = "cancel")]
        node: Option<String>,
        /// End a pending move instead (one the target could not finish).
        #[arg(long)]
        cancel: bool,
        /// Seconds to wait for the target to take the volume (the move stays pending after).
        #[arg(long, default_value = "60")]
        wait: u64,
        #[command(flatten)]
        at: EtcdArgs,
    },
    /// Delete a volume: its owner closes it and deletes it, and its slices are free again
    /// (nobody owning it, any node or this command deletes it). Refused while a node counts NBD
    /// clients attached to it, unless --force. Waits for the delete to finish.
    VolumeDelete {
        name: String,
        /// Delete it even with NBD clients attached (their requests fail from then on).
        #[arg(long)]
        force: bool,
        /// Seconds to wait for the delete (it stays pending after).
        #[arg(long, default_value = "60")]
        wait: u64,
        #[command(flatten)]
        at: EtcdArgs,
    },
    /// Grow or shrink a volume online (shrinking discards the tail, and needs --allow-shrink):
    /// its owner resizes it, then every node exports the new size. NBD clients see it when they
    /// connect again. Waits for the resize to finish.
    VolumeResize {
        name: String,
        #[command(flatten)]
        to: ResizeArgs,
        /// Seconds to wait for the resize (it stays pending after).
        #[arg(long, default_value = "60")]
        wait: u64,
        #[command(flatten)]
        at: EtcdArgs,
    },
    /// Take a node out of service for maintenance: it takes no volume while another live node
    /// could, receives no planned move and no new slice. Its slices keep serving. Kept across
    /// the node's restarts until node-uncordon.
    NodeCordon {
        node: String,
        /// Why, for `stria cluster status`.
        #[arg(long, default_value = "")]
        reason: String,
        #[command(flatten)]
        at: EtcdArgs,
    },
    /// Cordon a node, then move every volume it coordinates to the other nodes, one at a time,
    /// with no error at their clients. Running it again goes on where it stopped.
    NodeDrain {
        node: String,
        /// Why, for `stria cluster status`.
        #[arg(long, default_value = "")]
        reason: String,
        /// Seconds to wait for all the moves (the node stays cordoned after).
        #[arg(long, default_value = "300")]
        wait: u64,
        #[command(flatten)]
        at: EtcdArgs,
    },
    /// Put a cordoned node back in service: it takes volumes again (none move back by itself).
    NodeUncordon {
        node: String,
        #[command(flatten)]
        at: EtcdArgs,
    },
    /// Specify a new volume: its slices are placed across nodes now; the first node to take it
    /// makes its pool and serves it.
    VolumeCreate {
        name: String,
        /// raid1:N (mirror:N), raid10:WxC, ec:K+M, raid0:N.
        #[arg(long)]
        layout: String,
        #[arg(long, value_parser = parse_size)]
        size: u64,
        /// Node losses the volume must survive (members per node are capped to match).
        #[arg(long, default_value = "1")]
        tolerate: u32,
        #[arg(long, value_parser = parse_size, default_value = "64K")]
        chunk: u64,
        #[command(flatten)]
        at: EtcdArgs,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum PoolCmd {
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
pub(crate) enum VolumeCmd {
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
        /// tiered: and log: layouts: size of the write cache, fixed (default: it starts at 8 MiB
        /// and grows as writes fill it, to 1/8 of the volume, or of --space where that is
        /// smaller; 64 MiB to 8 GiB).
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
        /// tiered: and log: layouts: how GC picks the segments it collects: temperature (the
        /// default: hot and cold blocks in segments of their own, victims by cost-benefit),
        /// cost-benefit (garbage times age per cost) or greedy (the emptiest segment).
        #[arg(long, value_name = "POLICY")]
        gc: Option<GcPolicy>,
        /// tiered: and log: layouts: when a write without FUA is acknowledged: write-through
        /// (the default: once durable) or write-back (once in the cache and the map in memory;
        /// durable at the client's next flush or a few milliseconds later, as with a drive's
        /// volatile write cache).
        #[arg(long, value_name = "MODE")]
        cache_mode: Option<CacheMode>,
        #[command(flatten)]
        qos: QosArgs,
    },
    /// Change a volume's QoS settings or cache mode while it serves (settings not given are
    /// kept; `none` removes one).
    Set {
        name: String,
        #[command(flatten)]
        qos: QosArgs,
        /// Tiered and log volumes: write-through or write-back (see `volume create`). Switching
        /// to write-through makes every write acknowledged before it durable.
        #[arg(long, value_name = "MODE")]
        cache_mode: Option<CacheMode>,
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
    /// Grow or shrink a volume or a clone (shrinking discards the tail, and needs
    /// --allow-shrink). A clone grows up to the size its origin has now.
    Resize {
        name: String,
        #[command(flatten)]
        to: ResizeArgs,
    },
    /// Delete a volume and free its space. A volume with snapshots is refused unless
    /// --with-snapshots says to delete them too. A tiered or log volume whose snapshots have
    /// clones is deleted with its snapshots and kept, hidden, until its last clone is deleted
    /// (the clones' data lives in its cache and segment space); its space comes back then. A
    /// clone is marked deleted before the command returns and its map pages are dropped by the
    /// daemon's background task afterwards, unless --wait or no daemon serves the pool.
    Delete {
        name: String,
        /// Delete even while NBD clients have the volume open (they are cut off).
        #[arg(long)]
        force: bool,
        /// Delete the volume's snapshots with it (as `zfs destroy -r`); without it a volume
        /// that has snapshots is refused, naming them.
        #[arg(long)]
        with_snapshots: bool,
        /// A clone: drop its map pages and free its blocks before returning (else the daemon's
        /// background task does, after the answer).
        #[arg(long)]
        wait: bool,
    },
    /// Roll a volume back to a snapshot: it then reads as the snapshot does, and the snapshot
    /// stays. No data is copied. Writes wait while it runs; unmount file systems on the volume
    /// first. Only the newest snapshot, unless --destroy-newer.
    Rollback {
        name: String,
        snapshot: String,
        /// Roll back even while NBD clients have the volume open (their caches go stale).
        #[arg(long)]
        force: bool,
        /// Delete the snapshots newer than SNAPSHOT first (their data is lost), so that any
        /// snapshot can be rolled back to. Refused if a clone was made of one of them.
        #[arg(long)]
        destroy_newer: bool,
        #[arg(long)]
        json: bool,
    },
    /// Convert a plain volume (raid0/1/10, ec) into a log-structured one (tiered: or log:) of
    /// the same name, size and bytes, so that it takes snapshots and clones: its data is copied
    /// within the pool (blocks of zeros skipped), then it is switched over in one step. It takes
    /// no requests while it is copied; a crash leaves it as it was or converted.
    Convert {
        name: String,
        /// tiered:ec:K+M or log:ec:K+M.
        #[arg(long)]
        layout: String,
        /// Chunk of the segment space.
        #[arg(long, value_parser = parse_block_size)]
        chunk: Option<u64>,
        /// Size of the write cache, fixed (default: it starts at 8 MiB and grows as writes fill
        /// it, to 1/8 of the volume, or of --space where that is smaller; 64 MiB to 8 GiB).
        #[arg(long, value_parser = parse_block_size)]
        cache_size: Option<u64>,
        /// Copies of the write cache and the map, 2 or 3 (default 2).
        #[arg(long)]
        cache_copies: Option<u32>,
        /// Data bytes the segment space may grow to (default: 1.5 x the volume's size).
        #[arg(long, value_parser = parse_block_size)]
        space: Option<u64>,
        /// Convert even while NBD clients have the volume open (their requests fail until the
        /// conversion ends; they must reconnect).
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
    /// Copy a raw image file into a volume (byte-exact). Refused when the part of the volume the
    /// image would cover holds data (a block written and not trimmed), unless --overwrite, and
    /// while NBD clients have the volume open, unless --force.
    Import {
        name: String,
        file: PathBuf,
        /// Write over what the volume holds where the image goes.
        #[arg(long)]
        overwrite: bool,
        /// Import even while NBD clients have the volume open (what they read changes under them).
        #[arg(long)]
        force: bool,
    },
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
pub(crate) struct QosArgs {
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
    pub(crate) fn update(&self) -> QosUpdate {
        QosUpdate {
            iops_limit: self.iops_limit,
            bw_limit: self.bw_limit,
            iops_reserve: self.iops_reserve,
            bw_reserve: self.bw_reserve,
            weight: self.weight,
        }
    }

    /// The settings of a new volume (`none` means nothing there is to remove).
    pub(crate) fn spec(&self) -> Result<stria_engine::QosSpec> {
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
pub(crate) enum SnapshotCmd {
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
    /// snapshot or dropped, and blocks only it held are freed for garbage collection. The
    /// snapshot is gone (durably) when the command returns; its pages are handed on by a
    /// background task of the daemon afterwards (`volume show` counts deletes in progress),
    /// unless --wait or no daemon serves the pool (the command then does it).
    Delete {
        volume: String,
        name: String,
        /// Delete it even while NBD clients have VOLUME@NAME open (they are cut off).
        #[arg(long)]
        force: bool,
        /// Hand its pages on and free its blocks before returning, and print what that did.
        #[arg(long)]
        wait: bool,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum DriveCmd {
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
    /// Bring a failed drive whose device is present again back into service: in its own slot,
    /// copying only what was written while it was out, when the pool recorded that and the device
    /// is that very drive; otherwise under a new id, rebuilt in full from the other drives.
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
pub(crate) struct ServeArgs {
    /// NBD listen address: unix:PATH or tcp:HOST:PORT (repeat; default tcp:127.0.0.1:10809).
    #[arg(long)]
    pub(crate) nbd: Vec<NbdAddr>,
    /// TLS: off, on (STARTTLS offered) or require (nothing else is allowed before it).
    #[arg(long, default_value = "off")]
    pub(crate) tls: String,
    /// PEM certificate chain for TLS.
    #[arg(long)]
    pub(crate) tls_cert: Option<PathBuf>,
    /// PEM private key for TLS.
    #[arg(long)]
    pub(crate) tls_key: Option<PathBuf>,
    /// PEM file of CA certificates: NBD clients must present a certificate from one of them
    /// (needs --tls require). The way to keep strangers off TCP (docs/nbd.md).
    #[arg(long, value_name = "FILE")]
    pub(crate) tls_client_ca: Option<PathBuf>,
    /// Open even without a majority of the pool's drives, losing any change recorded only on
    /// the missing ones (docs/on-disk-format.md, commit protocol).
    #[arg(long)]
    pub(crate) force: bool,
    /// Rebuild bandwidth limit while this daemon runs (e.g. 200M per second; 0 = unlimited).
    /// Without it, the rate kept in the pool applies (`stria drive rebuild-rate`; none at first).
    #[arg(long, value_parser = parse_size)]
    pub(crate) rebuild_rate: Option<u64>,
    /// Memory for cached checksum pages, split over the drives (each 4 KiB page covers 4 MiB of
    /// a drive; pages are read from the drives on demand beyond this).
    #[arg(long, value_parser = parse_size, default_value = "256M")]
    pub(crate) metadata_cache: u64,
    /// A TOML file of settings (contrib/stria.toml lists every key); flags given here win over
    /// it. SIGHUP re-reads it: log_level, rebuild_rate and the token file change at once.
    #[arg(long, value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,
    /// The file as read (set by the parser, not a flag).
    #[arg(skip)]
    pub(crate) config_source: Option<config::Source>,
    #[command(flatten)]
    pub(crate) nbd_limits: nbd_limits::NbdLimitArgs,
    /// iSCSI listen address: tcp:HOST:PORT (repeat; none by default; 3260 is iSCSI's port).
    /// Every volume is a target of its own, iqn.2026-11.io.stria:POOL:VOLUME, LUN 0
    /// (docs/iscsi.md).
    #[arg(long, value_name = "ADDR", value_parser = daemon::parse_iscsi_addr)]
    pub(crate) iscsi: Vec<String>,
    /// iSCSI connections at once (more are closed when they connect).
    #[arg(long, value_name = "N", default_value_t = 128)]
    pub(crate) iscsi_connections_max: usize,
    /// Microseconds an iSCSI connection keeps polling for its next PDU without sleeping, after
    /// it last read or sent one: server CPU traded for latency (0 sleeps at once; the window
    /// halves while an initiator pauses; docs/iscsi.md).
    #[arg(long, value_name = "MICROSECONDS", default_value_t = 100,
          value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    pub(crate) iscsi_busy_poll: u64,
    /// Threads iSCSI connections run on: each connection (its reader, writer and commands) is
    /// served on one of them from accept to close, the one with the fewest connections when it
    /// came (default: one per CPU the daemon may use when it has more than one; 0 serves
    /// connections on the daemon's shared runtime; docs/iscsi.md).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(0..=1024))]
    pub(crate) iscsi_threads: Option<u64>,
    /// Nice levels the daemon's shared runtime (destage, GC, rebuilds, checkpoints, the control
    /// plane) runs below the threads that serve host requests, while connections have threads
    /// of their own (0: the same priority; docs/design/datapath.md, "Background work below the
    /// host's").
    #[arg(long, value_name = "LEVELS", default_value_t = 5, value_parser = clap::value_parser!(u8).range(0..=19))]
    pub(crate) background_nice: u8,
    /// iSCSI CHAP: every login must give this name and prove the secret of
    /// --iscsi-chap-secret-file (without it, logins need no authentication).
    #[arg(long, value_name = "NAME", requires = "iscsi_chap_secret_file")]
    pub(crate) iscsi_chap_user: Option<String>,
    /// The file holding the CHAP secret: 12 to 256 bytes (a final newline is not part of it).
    #[arg(long, value_name = "FILE", requires = "iscsi_chap_user")]
    pub(crate) iscsi_chap_secret_file: Option<PathBuf>,
    /// Mutual CHAP: the name the target answers an initiator's challenge with, proving the
    /// secret of --iscsi-chap-mutual-secret-file.
    #[arg(long, value_name = "NAME", requires_all = ["iscsi_chap_mutual_secret_file", "iscsi_chap_user"])]
    pub(crate) iscsi_chap_mutual_user: Option<String>,
    /// The file holding the target's mutual CHAP secret (12 to 256 bytes, not the initiators').
    #[arg(long, value_name = "FILE", requires = "iscsi_chap_mutual_user")]
    pub(crate) iscsi_chap_mutual_secret_file: Option<PathBuf>,
    /// HTTP listener for the metrics (/metrics), the REST API (/api/v1) and the dashboard (/):
    /// tcp:IP:PORT, e.g. tcp:127.0.0.1:9810 (`stria up` listens there by default). Off the
    /// loopback it needs --http-tls-cert and --http-tls-key.
    #[arg(long, value_name = "ADDR", value_parser = http::parse_addr)]
    pub(crate) http: Option<std::net::SocketAddr>,
    /// PEM certificate chain for HTTPS.
    #[arg(long, requires = "http")]
    pub(crate) http_tls_cert: Option<PathBuf>,
    /// PEM private key for HTTPS.
    #[arg(long, requires = "http")]
    pub(crate) http_tls_key: Option<PathBuf>,
    /// File holding the API's bearer token (default POOL/http.token, made with mode 0600 at the
    /// first start). Changes through the API need it, and so do reads off the loopback.
    #[arg(long, requires = "http")]
    pub(crate) http_token_file: Option<PathBuf>,
    /// The directory the REST API's volume import and export may read images from and write
    /// them to (paths given to the API are inside it); without it the API refuses both.
    #[arg(long, value_name = "DIR")]
    pub(crate) api_transfer_dir: Option<PathBuf>,
    /// Benchmarks only: ignore --pool and serve a new pool of COUNTxSIZE memory drives (e.g.
    /// 6x1G) that vanishes at exit, with the volumes of --bench-volume.
    #[arg(long, hide = true, value_parser = daemon::parse_memory_drives)]
    pub(crate) bench_memory_drives: Option<(usize, u64)>,
    /// Benchmarks only: fast memory drives beside those of --bench-memory-drives, COUNTxSIZE
    /// (for tiered volumes, whose cache and map need two fast drives).
    #[arg(long, hide = true, value_parser = daemon::parse_memory_drives, requires = "bench_memory_drives")]
    pub(crate) bench_memory_fast_drives: Option<(usize, u64)>,
    /// Benchmarks only: a volume of the memory pool, NAME:LAYOUT:SIZE (repeat).
    #[arg(long, hide = true, requires = "bench_memory_drives")]
    pub(crate) bench_volume: Vec<daemon::MemoryVolumeSpec>,
}

#[derive(Debug, Args)]
pub(crate) struct UpArgs {
    #[command(flatten)]
    pub(crate) serve: ServeArgs,
    /// Size of each drive file of the default pool.
    #[arg(long, value_parser = parse_block_size, default_value = "2G")]
    pub(crate) drive_size: u64,
    /// Size of the default volume.
    #[arg(long, value_parser = parse_volume_size, default_value = "4G")]
    pub(crate) volume_size: u64,
    /// No HTTP listener (by default `up` serves metrics, API and dashboard on 127.0.0.1:9810).
    #[arg(long, conflicts_with = "http")]
    pub(crate) no_http: bool,
}

/// The layout of the volume `stria up` makes in a new pool (its help says it).
pub(crate) const UP_LAYOUT: &str = "tiered:ec:4+2";

/// Where `stria up` serves metrics, the REST API and the dashboard.
pub(crate) const DEFAULT_HTTP_PORT: u16 = 9810;

impl Cli {
    /// Nice levels the shared runtime's threads run below the process (`--background-nice`):
    /// for `serve` and `up` only, and only while every front end serves its connections on
    /// threads of their own (otherwise host requests run on that runtime too, and it stays at
    /// the process's priority).
    pub(crate) fn background_nice_levels(&self) -> Option<u8> {
        let (Command::Serve(a) | Command::Up(UpArgs { serve: a, .. })) = &self.command else { return None };
        let nbd_threads = nbd_limits::connection_threads(a.nbd_limits.nbd_threads);
        let iscsi_threads = nbd_limits::connection_threads(a.iscsi_threads);
        let own_threads = nbd_threads > 0 && (a.iscsi.is_empty() || iscsi_threads > 0);
        (a.background_nice > 0 && own_threads).then_some(a.background_nice)
    }
}

/// Parses the command line; for `serve` and `up` with `--config FILE`, adds the file's
/// settings that the command line does not give (see [`config::as_args`]).
pub(crate) fn parse_cli() -> Result<Cli, clap::Error> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::serve_options;
    use crate::pooldir::{Opener, PoolDir};
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
    fn background_work_runs_lower_only_for_a_daemon_whose_connections_have_threads() {
        let levels = |args: &[&str]| {
            let words: Vec<String> =
                std::iter::once("stria").chain(args.iter().copied()).map(String::from).collect();
            parse(&words).background_nice_levels()
        };
        // With more than one CPU connections get threads by default; on one they do not.
        let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
        let default = (cpus > 1).then_some(5);
        assert_eq!(levels(&["serve"]), default);
        assert_eq!(levels(&["up"]), default);
        assert_eq!(levels(&["serve", "--iscsi", "0.0.0.0:3260"]), default);
        assert_eq!(levels(&["serve", "--background-nice", "2", "--nbd-threads", "2"]), Some(2));
        assert_eq!(levels(&["serve", "--background-nice", "0"]), None);
        assert_eq!(levels(&["serve", "--nbd-threads", "0"]), None);
        assert_eq!(
            levels(&["serve", "--iscsi", "0.0.0.0:3260", "--iscsi-threads", "0", "--nbd-threads", "2"]),
            None
        );
        assert_eq!(levels(&["serve", "--nbd-threads", "2", "--iscsi-threads", "0"]), Some(5));
        assert_eq!(levels(&["volume", "list"]), None);
        assert!(Cli::try_parse_from(["stria", "serve", "--background-nice", "20"]).is_err());
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
