//! `stria serve`: owns a pool, exports its volumes over NBD, answers the control socket, starts
//! the engine's maintenance services (`stria_engine::maint`: rebuilds, moves, drained drives),
//! and shuts down cleanly on SIGTERM/SIGINT.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use stria_catalog::{Catalog, CreateVolume};
use stria_dev::BlockDevice;
use stria_dev::mem::MemDevice;
use stria_engine::maint;
use stria_engine::units::parse_size;
use stria_engine::{DriveClass, NewDrive, Pool};
use stria_front::Registry;
use stria_nbd::{Server, ServerConfig, ServerHandle, TlsConfig, TlsMode};
use tokio::net::UnixListener;

use serde_json::Value;
use tokio::sync::mpsc::UnboundedSender;

use crate::control;
use crate::jobs::{self, Jobs};
use crate::ops::{self, Ctx, Progress, Request};
use crate::pooldir::{Dev, Opener, PoolDir};
use crate::stats::StatsView;

/// Where the NBD server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum NbdAddr {
    Unix(PathBuf),
    Tcp(String),
}

impl std::str::FromStr for NbdAddr {
    type Err = String;
    fn from_str(s: &str) -> Result<NbdAddr, String> {
        if let Some(p) = s.strip_prefix("unix:") {
            return Ok(NbdAddr::Unix(PathBuf::from(p)));
        }
        if let Some(a) = s.strip_prefix("tcp:") {
            if a.parse::<std::net::SocketAddr>().is_err() && !a.contains(':') {
                return Err(format!("`{s}`: expected tcp:HOST:PORT, e.g. tcp:127.0.0.1:10809"));
            }
            return Ok(NbdAddr::Tcp(a.to_string()));
        }
        Err(format!("`{s}`: expected unix:PATH or tcp:HOST:PORT"))
    }
}

/// Options of `stria serve`.
#[derive(Debug, Clone)]
pub(crate) struct ServeOptions {
    pub(crate) nbd: Vec<NbdAddr>,
    pub(crate) tls_mode: TlsMode,
    pub(crate) tls_cert: Option<PathBuf>,
    pub(crate) tls_key: Option<PathBuf>,
    /// Clients must present a certificate from a CA in this PEM file (`--tls-client-ca`).
    pub(crate) tls_client_ca: Option<PathBuf>,
    pub(crate) force: bool,
    /// `--rebuild-rate` (or the configuration file's): overrides the pool's stored rate while
    /// this daemon runs.
    pub(crate) rebuild_rate_bytes: Option<u64>,
    /// Bound on cached checksum pages (`Pool::set_metadata_cache`).
    pub(crate) metadata_cache_bytes: u64,
    /// The HTTP listener (metrics, REST API, dashboard), if any.
    pub(crate) http: Option<crate::http::HttpOptions>,
    /// The NBD limits given (`--nbd-*`; the rest are the server's defaults).
    pub(crate) nbd_limits: crate::nbd_limits::NbdLimitArgs,
    /// iSCSI listeners (`--iscsi`, `HOST:PORT`).
    pub(crate) iscsi: Vec<String>,
    /// `--iscsi-connections-max`.
    pub(crate) iscsi_connections_max: usize,
    /// `--iscsi-busy-poll`, microseconds.
    pub(crate) iscsi_busy_poll: u64,
    /// `--iscsi-threads` (`None`: the default, one per CPU when there are several).
    pub(crate) iscsi_threads: Option<u64>,
    /// `--iscsi-chap-*`: CHAP every iSCSI login must pass.
    pub(crate) iscsi_chap: Option<Arc<stria_iscsi::Chap>>,
    /// The configuration file, re-read on SIGHUP.
    pub(crate) config: Option<crate::config::Source>,
}

/// A pool of memory drives made at start-up and gone at exit (`stria serve
/// --bench-memory-drives`): for benchmarks of the serving path without drive I/O underneath.
#[derive(Debug, Clone)]
pub(crate) struct MemoryPoolSpec {
    /// Capacity drives to create.
    pub(crate) drives: usize,
    /// Size of each drive.
    pub(crate) drive_bytes: u64,
    /// Fast drives to create (tiered volumes' cache and map go there), and their size.
    pub(crate) fast_drives: usize,
    pub(crate) fast_drive_bytes: u64,
    /// Volumes to create on them.
    pub(crate) volumes: Vec<MemoryVolumeSpec>,
}

/// `COUNTxSIZE`, e.g. `6x1G`.
pub(crate) fn parse_memory_drives(s: &str) -> Result<(usize, u64), String> {
    let (count, size) = s.split_once('x').ok_or_else(|| format!("`{s}`: expected COUNTxSIZE, e.g. 6x1G"))?;
    let count =
        count.parse::<usize>().map_err(|_| format!("`{s}`: drive count `{count}` is not a number"))?;
    if count == 0 {
        return Err(format!("`{s}`: at least one drive is needed"));
    }
    Ok((count, parse_size(size).map_err(|e| format!("`{s}`: {e}"))?))
}

/// A volume of a memory pool: `NAME:LAYOUT:SIZE`, e.g. `r0:raid0:1G` or `ec:ec:4+2:1G`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MemoryVolumeSpec {
    pub(crate) name: String,
    pub(crate) layout: String,
    pub(crate) size_bytes: u64,
}

impl std::str::FromStr for MemoryVolumeSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<MemoryVolumeSpec, String> {
        let usage = || format!("`{s}`: expected NAME:LAYOUT:SIZE, e.g. r0:raid0:1G or e:ec:4+2:1G");
        let (name, rest) = s.split_once(':').ok_or_else(usage)?;
        let (layout, size) = rest.rsplit_once(':').ok_or_else(usage)?;
        if name.is_empty() || layout.is_empty() {
            return Err(usage());
        }
        let size_bytes = parse_size(size).map_err(|e| format!("`{s}`: {e}"))?;
        Ok(MemoryVolumeSpec { name: name.to_string(), layout: layout.to_string(), size_bytes })
    }
}

/// Makes the exports match the pool's volumes (every client-visible volume, by name) and their
/// snapshots (`VOL@SNAP`, read-only).
fn sync_exports<D: BlockDevice>(catalog: &Catalog<D>, exports: &Registry) {
    let mut wanted = catalog.names();
    wanted.extend(catalog.snapshots(None).unwrap_or_default().into_iter().map(|s| s.export));
    let synced = exports.sync(wanted, |name| catalog.lookup(name));
    for name in &synced.removed {
        tracing::info!(volume = %name, "export removed");
    }
    for name in &synced.added {
        tracing::info!(volume = %name, "export added");
    }
}

/// Clears the way for a Unix socket at `path`: a socket no server answers on (left by one that
/// was killed) is removed. Anything else there is refused and left as it is: a socket a server
/// answers on, and whatever is not a socket (a file, a directory, a link), since a mistyped path
/// (`--nbd unix:disk.img`) must not delete what it names.
fn remove_stale_socket(path: &Path) -> Result<()> {
    use std::os::unix::fs::FileTypeExt;
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("cannot look at {}", path.display())),
    };
    let kind = meta.file_type();
    if !kind.is_socket() {
        let what = if kind.is_symlink() {
            "a symbolic link"
        } else if kind.is_dir() {
            "a directory"
        } else if kind.is_file() {
            "a regular file"
        } else {
            "a device or a FIFO"
        };
        bail!(
            "{} exists and is {what}, not a socket: stria removes only a socket no server answers on. \
             Give another path for the socket",
            path.display()
        );
    }
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        bail!("{} is in use by another server", path.display());
    }
    std::fs::remove_file(path).with_context(|| format!("cannot remove stale socket {}", path.display()))
}

/// What the daemon's front ends (control socket, REST API, metrics, dashboard) share.
pub(crate) struct Daemon {
    pub(crate) catalog: Arc<Catalog<Dev>>,
    pub(crate) dir: PoolDir,
    pub(crate) exports: Arc<Registry>,
    pub(crate) jobs: Jobs,
    /// The NBD server (its connection gauges).
    pub(crate) nbd: Server,
    /// The iSCSI target, when `--iscsi` listens (its counters).
    pub(crate) iscsi: Option<Arc<stria_iscsi::Target>>,
}

impl Daemon {
    /// Runs `request`: reads at once, changes as a job (a task of their own that runs to its
    /// end even if the caller goes away). `progress` sees the job's progress.
    pub(crate) async fn execute(
        self: &Arc<Self>,
        request: Request,
        progress: Option<UnboundedSender<Progress>>,
    ) -> Result<Value> {
        if request.is_read_only() {
            return self.run(request, &mut |_| {}).await;
        }
        let (_, task) = self.spawn(request, progress)?;
        task.await.context("the operation's task ended abnormally")?
    }

    /// Starts `request` as a job; returns its id and its task.
    pub(crate) fn spawn(
        self: &Arc<Self>,
        request: Request,
        progress: Option<UnboundedSender<Progress>>,
    ) -> Result<(u64, tokio::task::JoinHandle<Result<Value>>)> {
        let described = serde_json::to_value(&request)?;
        let op = described["op"].as_str().unwrap_or("?").to_string();
        let Some(id) = self.jobs.begin(op, described) else {
            bail!(
                "{} operations are running already; try again when one has finished",
                jobs::RUNNING_JOBS_MAX
            )
        };
        let daemon = Arc::clone(self);
        let task = tokio::spawn(async move {
            let jobs = daemon.jobs.clone();
            let result = daemon
                .run(request, &mut |p| {
                    if let Some(tx) = &progress {
                        let _ = tx.send(p.clone());
                    }
                    jobs.progress(id, p);
                })
                .await;
            daemon.jobs.finish(id, &result);
            result
        });
        Ok((id, task))
    }

    async fn run(&self, request: Request, progress: &mut (dyn FnMut(Progress) + Send)) -> Result<Value> {
        if let Request::Stats = request {
            return Ok(serde_json::to_value(self.stats())?);
        }
        let resync = request.changes_volumes();
        // A name whose volume the request replaces by another (a conversion, or a failed one's
        // handle opened again): served anew, not kept as it was.
        let replaced = request.replaces_volume().map(str::to_string);
        let clients = |name: &str| self.exports.clients(name);
        let ctx = Ctx { catalog: &self.catalog, dir: &self.dir, daemon: true, clients: Some(&clients) };
        let result = ops::execute(&ctx, request, progress).await;
        if let Some(name) = replaced {
            self.exports.remove(&name);
        }
        if resync {
            sync_exports(&self.catalog, &self.exports);
        }
        result
    }

    /// Every export's request counters and every drive's I/O counters.
    pub(crate) fn stats(&self) -> StatsView {
        self.stats_of(self.catalog.pool().status().drives)
    }

    /// [`Daemon::stats`] with the drives of a status already taken (a scrape needs both).
    pub(crate) fn stats_of(&self, drives: Vec<stria_engine::DriveStatus>) -> StatsView {
        let handles = self.catalog.pool().drives();
        let latency =
            |id: u32| handles.iter().find(|d| d.slot() == id).map(|d| d.latency()).unwrap_or_default();
        StatsView::new(self.exports.stats(), drives, latency)
    }
}

/// Runs the daemon until SIGTERM or SIGINT.
pub(crate) async fn serve(dir: PoolDir, opts: ServeOptions, on_ready: impl FnOnce(&[String])) -> Result<()> {
    let _lock = dir.lock()?;
    let pool = Arc::new(dir.open_pool(Opener::Daemon { force: opts.force }).await?);
    let catalog = Arc::new(Catalog::open(Arc::clone(&pool)).await?);
    if let Some(rate) = opts.rebuild_rate_bytes {
        let stored = pool.rebuild_rate();
        pool.set_rebuild_rate(rate);
        if rate != stored {
            tracing::info!(
                bytes_per_sec = rate,
                stored_bytes_per_sec = stored,
                "rebuild rate from --rebuild-rate or the configuration file, instead of the pool's"
            );
        }
    }
    pool.set_metadata_cache(opts.metadata_cache_bytes);
    let report = pool.recovery_report();
    if report.journal_txns_replayed + report.rows_resynced + report.move_rows_recopied > 0 {
        tracing::warn!(?report, "recovered from an unclean stop");
    }
    let exports = Arc::new(Registry::new());
    sync_exports(&catalog, &exports);

    // The handlers are in place before the first listener: a SIGTERM sent as soon as any of
    // them answers (or READY=1 arrives) must stop the daemon cleanly once it is up, not kill it
    // (the default action). Before this point a signal still kills it, as during recovery.
    let mut signals = Signals::install()?;
    let (handles, mut uris) = start_nbd(&opts, &exports).await?;
    let reservations = dir.path.join("iscsi-reservations");
    let (iscsi, iscsi_uris, iscsi_target) =
        start_iscsi(&opts, &exports, &pool.status().name, Some(reservations)).await?;
    uris.extend(iscsi_uris);
    let nbd = handles.first().map(|h| h.server().clone()).context("no NBD listener")?;
    let daemon = Arc::new(Daemon {
        catalog: Arc::clone(&catalog),
        dir: dir.clone(),
        exports,
        jobs: Jobs::default(),
        nbd,
        iscsi: iscsi_target,
    });

    let control_path = dir.control_socket();
    remove_stale_socket(&control_path)?;
    let listener = UnixListener::bind(&control_path)
        .with_context(|| format!("cannot bind {}", control_path.display()))?;
    let handler: control::Handler = {
        let daemon = Arc::clone(&daemon);
        Arc::new(move |request, tx| {
            let daemon = Arc::clone(&daemon);
            Box::pin(async move { daemon.execute(request, Some(tx)).await })
        })
    };
    let control_task = tokio::spawn(control::serve(listener, handler));
    let http = match &opts.http {
        Some(http) => {
            let h = crate::http::start(http, Arc::clone(&daemon)).await?;
            uris.push(h.url.clone());
            Some(h)
        }
        None => None,
    };

    let removal = Arc::new(ops::DirRemoval(dir.clone()));
    let services =
        maint::Services::start(Arc::clone(&pool), maint::Settings::default().on_drive_removed(removal));

    on_ready(&uris);
    notify_systemd("READY=1");
    let reload = || reload_config(opts.config.as_ref(), &pool, http.as_ref());
    signals.wait(reload).await;
    notify_systemd("STOPPING=1");
    tracing::info!("shutting down: no new connections, finishing requests in flight");
    control_task.abort();
    // iSCSI sessions answer the commands they run, then close (NBD's shutdown below does the
    // same for its connections), before the pool closes.
    if let Some(target) = &daemon.iscsi {
        target.shutdown(std::time::Duration::from_secs(10)).await;
    }
    for t in iscsi {
        t.abort();
    }
    if let Some(h) = http {
        h.shutdown().await;
    }
    for h in handles {
        h.shutdown().await;
    }
    // The maintenance services are stopped, not aborted: a task dropped in the middle of a
    // metadata commit or a rebuild row would leave its work half done. The pool's close refuses
    // new rows, so a rebuild in progress ends at its next row.
    let stopping = services.stop();
    catalog.close().await.context("flushing the pool on shutdown")?;
    stopping.await;
    let _ = std::fs::remove_file(&control_path);
    tracing::info!("pool closed cleanly");
    Ok(())
}

/// Builds the NBD server for `exports` and starts its listeners; returns them with their URIs.
async fn start_nbd(opts: &ServeOptions, exports: &Arc<Registry>) -> Result<(Vec<ServerHandle>, Vec<String>)> {
    let client_ca = opts.tls_client_ca.as_deref();
    let tls = match (opts.tls_mode, &opts.tls_cert, &opts.tls_key) {
        (TlsMode::Off, _, _) if client_ca.is_some() => bail!("--tls-client-ca needs --tls require"),
        (TlsMode::Off, _, _) => TlsConfig::off(),
        (mode, Some(cert), Some(key)) => {
            TlsConfig::from_pem_files_with_client_ca(mode, cert, key, client_ca)?
        }
        _ => bail!("--tls on/require needs --tls-cert and --tls-key"),
    };
    let registry: Arc<Registry> = Arc::clone(exports);
    let config = ServerConfig {
        tls,
        limits: opts.nbd_limits.limits()?,
        connection_threads: opts.nbd_limits.connection_threads(),
        // As the runtime's threads: an unoptimised build's futures need deep stacks.
        connection_thread_stack_bytes: crate::RUNTIME_STACK_BYTES,
    };
    let server = Server::new(config, registry).map_err(crate::nbd_limits::explain)?;
    let mut handles = Vec::new();
    let mut uris = Vec::new();
    let addrs =
        if opts.nbd.is_empty() { vec![NbdAddr::Tcp("127.0.0.1:10809".into())] } else { opts.nbd.clone() };
    for addr in &addrs {
        match addr {
            NbdAddr::Unix(path) => {
                remove_stale_socket(path)?;
                handles.push(
                    server
                        .serve_unix(path)
                        .with_context(|| format!("cannot listen on {}", path.display()))?,
                );
                let abs = std::fs::canonicalize(path).unwrap_or_else(|_| path.clone());
                uris.push(format!("nbd+unix:///VOLUME?socket={}", abs.display()));
            }
            NbdAddr::Tcp(a) => {
                let h =
                    server.serve_tcp(a.as_str()).await.with_context(|| format!("cannot listen on {a}"))?;
                if let stria_nbd::ListenAddr::Tcp(sa) = h.local_addr() {
                    uris.push(format!("nbd://{sa}/VOLUME"));
                }
                handles.push(h);
            }
        }
    }
    Ok((handles, uris))
}

/// `--iscsi`: `tcp:HOST:PORT` (or `HOST:PORT`), as `HOST:PORT`.
pub(crate) fn parse_iscsi_addr(s: &str) -> Result<String, String> {
    let a = s.strip_prefix("tcp:").unwrap_or(s);
    match a.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => Ok(a.to_string()),
        _ => Err(format!("`{s}`: expected tcp:HOST:PORT, e.g. tcp:127.0.0.1:3260")),
    }
}

/// Starts the iSCSI target's listeners (`--iscsi`), if any: their tasks, their URIs (one
/// `iscsi://` URI per listener, with VOLUME to replace) and the target.
async fn start_iscsi(
    opts: &ServeOptions,
    exports: &Arc<Registry>,
    pool: &str,
    reservations_dir: Option<std::path::PathBuf>,
) -> Result<IscsiStarted> {
    let (mut tasks, mut uris) = (Vec::new(), Vec::new());
    if opts.iscsi.is_empty() {
        return Ok((tasks, uris, None));
    }
    if let Some(dir) = &reservations_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot make {}", dir.display()))?;
    }
    let config = stria_iscsi::TargetConfig {
        pool: pool.to_string(),
        max_connections: opts.iscsi_connections_max,
        busy_poll: std::time::Duration::from_micros(opts.iscsi_busy_poll),
        connection_threads: crate::nbd_limits::connection_threads(opts.iscsi_threads),
        connection_thread_stack_bytes: crate::RUNTIME_STACK_BYTES,
        chap: opts.iscsi_chap.clone(),
        reservations_dir,
        ..Default::default()
    };
    let target = stria_iscsi::Target::new(Arc::clone(exports), config);
    for addr in &opts.iscsi {
        let listener = tokio::net::TcpListener::bind(addr.as_str())
            .await
            .with_context(|| format!("cannot listen on {addr}"))?;
        let local = listener.local_addr()?;
        uris.push(format!("iscsi://{local}/{}:VOLUME/0", stria_iscsi::target::name_prefix(pool)));
        tracing::info!(%local, "iscsi: listening");
        let target = Arc::clone(&target);
        tasks.push(tokio::spawn(async move {
            if let Err(e) = target.serve(listener).await {
                tracing::error!(error = %e, "iscsi: listener stopped");
            }
        }));
    }
    Ok((tasks, uris, Some(target)))
}

/// What [`start_iscsi`] started: the listeners' tasks, their URIs, and the target.
type IscsiStarted = (Vec<tokio::task::JoinHandle<()>>, Vec<String>, Option<Arc<stria_iscsi::Target>>);

/// Serves a pool of memory drives (see [`MemoryPoolSpec`]) until SIGTERM or SIGINT. There is no
/// pool directory, control socket or rebuild: only the NBD exports of the volumes asked for.
pub(crate) async fn serve_memory(
    spec: MemoryPoolSpec,
    opts: ServeOptions,
    on_ready: impl FnOnce(&[String]),
) -> Result<()> {
    tracing::warn!(
        drives = spec.drives,
        drive_bytes = spec.drive_bytes,
        fast_drives = spec.fast_drives,
        "serving a benchmark pool of memory drives: nothing written survives this process"
    );
    let fast = (0..spec.fast_drives).map(|i| (DriveClass::Fast, spec.fast_drive_bytes, format!("fast-{i}")));
    let capacity = (0..spec.drives).map(|i| (DriveClass::Capacity, spec.drive_bytes, i.to_string()));
    let drives = fast
        .chain(capacity)
        .map(|(class, bytes, id)| NewDrive {
            dev: MemDevice::new(&format!("memory-{id}"), bytes),
            path: format!("memory:{id}"),
            class,
            domain: String::new(),
            fresh: true,
        })
        .collect();
    let pool = Arc::new(Pool::create("bench-memory", drives).await.context("cannot create the memory pool")?);
    pool.set_metadata_cache(opts.metadata_cache_bytes);
    let catalog = Catalog::open(Arc::clone(&pool)).await?;
    for v in &spec.volumes {
        let volume = CreateVolume {
            name: v.name.clone(),
            size_bytes: v.size_bytes,
            layout: v.layout.clone(),
            chunk_bytes: None,
            // Plain volumes go on the capacity drives, as `volume create` puts them.
            class: None,
            cache_bytes: None,
            cache_copies: None,
            space_bytes: None,
            gc: None,
            cache_mode: None,
            qos: Default::default(),
        };
        catalog.create(volume).await.with_context(|| format!("cannot create volume {}", v.name))?;
    }
    let exports = Arc::new(Registry::new());
    sync_exports(&catalog, &exports);
    // Before the first listener, as in `serve`.
    let mut signals = Signals::install()?;
    let (handles, mut uris) = start_nbd(&opts, &exports).await?;
    let (iscsi, iscsi_uris, iscsi_target) = start_iscsi(&opts, &exports, "bench-memory", None).await?;
    uris.extend(iscsi_uris);
    on_ready(&uris);
    signals.wait(|| tracing::info!("SIGHUP ignored: a memory pool has no configuration file")).await;
    tracing::info!("shutting down: no new connections, finishing requests in flight");
    if let Some(target) = &iscsi_target {
        target.shutdown(std::time::Duration::from_secs(10)).await;
    }
    for t in iscsi {
        t.abort();
    }
    for h in handles {
        h.shutdown().await;
    }
    pool.close().await.context("closing the memory pool")?;
    Ok(())
}

/// SIGHUP: re-reads the configuration file and applies what can change while serving (log
/// level, rebuild rate, the API token); logs what would need a restart. Without a file, or
/// when the file does not parse, nothing changes.
fn reload_config(
    source: Option<&crate::config::Source>,
    pool: &Pool<Dev>,
    http: Option<&crate::http::HttpHandle>,
) {
    let Some(source) = source else {
        return tracing::info!("SIGHUP: no configuration file to reload (start with --config FILE)");
    };
    let path = source.path.display().to_string();
    let (live, restart) = match crate::config::reload(&source.path, &source.file) {
        Ok(r) => r,
        Err(e) => {
            return tracing::error!(file = path, error = %format!("{e:#}"), "SIGHUP: the file does not load; nothing changed");
        }
    };
    let kept = |key: &str| source.overridden.contains(&key);
    if let Some(level) = live.log_level.filter(|_| !kept("log_level")) {
        match crate::set_log_level(&level) {
            Ok(()) => tracing::info!(level, "SIGHUP: log level set"),
            Err(e) => tracing::error!(error = e, "SIGHUP: log level not changed"),
        }
    }
    if let Some(rate) = live.rebuild_rate_bytes.filter(|_| !kept("rebuild_rate")) {
        pool.set_rebuild_rate(rate);
        tracing::info!(bytes_per_sec = rate, "SIGHUP: rebuild rate set");
    }
    if let Some(http) = http
        && !kept("http_token_file")
    {
        match http.reload_token(live.http_token_file.as_deref()) {
            Ok(()) => tracing::info!("SIGHUP: API token read again"),
            Err(e) => tracing::error!(error = %format!("{e:#}"), "SIGHUP: API token not changed"),
        }
    }
    for key in restart {
        tracing::warn!(key, file = path, "SIGHUP: this setting changed; it takes effect at the next start");
    }
    for key in &source.overridden {
        tracing::info!(key, "SIGHUP: set on the command line, which wins over the file");
    }
}

/// Tells systemd (Type=notify) how the daemon stands, when it runs under systemd.
fn notify_systemd(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else { return };
    let socket = match std::os::unix::net::UnixDatagram::unbound() {
        Ok(s) => s,
        Err(e) => return tracing::warn!(error = %e, "cannot notify systemd"),
    };
    let bytes = path.as_encoded_bytes();
    let sent = if let Some(name) = bytes.strip_prefix(b"@") {
        // An abstract socket.
        use std::os::linux::net::SocketAddrExt;
        std::os::unix::net::SocketAddr::from_abstract_name(name)
            .and_then(|a| socket.send_to_addr(state.as_bytes(), &a))
    } else {
        socket.send_to(state.as_bytes(), &path)
    };
    if let Err(e) = sent {
        tracing::warn!(error = %e, "cannot notify systemd");
    }
}

/// The signals the daemon answers: SIGTERM and SIGINT stop it (a clean shutdown follows),
/// SIGHUP reloads its configuration file (a closed terminal must not kill the daemon
/// uncleanly).
pub(crate) struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    /// Installs the handlers: from here on these signals are caught (and kept until
    /// [`Signals::wait`] looks), never the default action.
    pub(crate) fn install() -> Result<Signals> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            hup: signal(SignalKind::hangup())?,
        })
    }

    /// Returns at SIGTERM or SIGINT; runs `reload` at each SIGHUP.
    pub(crate) async fn wait(&mut self, reload: impl Fn()) {
        loop {
            tokio::select! {
                _ = self.term.recv() => { tracing::info!("SIGTERM"); return }
                _ = self.int.recv() => { tracing::info!("SIGINT"); return }
                _ = self.hup.recv() => reload(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::remove_stale_socket;

    /// Only a socket nobody answers on is removed; a live socket, a file, a directory and a
    /// symbolic link are refused and left as they are.
    #[test]
    fn only_a_stale_socket_is_removed() {
        let dir = tempfile::tempdir().expect("temporary directory");
        remove_stale_socket(&dir.path().join("missing.sock")).expect("nothing there");

        let file = dir.path().join("disk.img");
        std::fs::write(&file, b"precious").expect("write");
        let e = remove_stale_socket(&file).expect_err("a regular file");
        assert!(e.to_string().contains("is a regular file, not a socket"), "{e}");
        assert_eq!(std::fs::read(&file).expect("still there"), b"precious");

        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub).expect("mkdir");
        let e = remove_stale_socket(&sub).expect_err("a directory");
        assert!(e.to_string().contains("is a directory, not a socket"), "{e}");
        assert!(sub.is_dir());

        let link = dir.path().join("link.sock");
        std::os::unix::fs::symlink(&file, &link).expect("symlink");
        let e = remove_stale_socket(&link).expect_err("a link");
        assert!(e.to_string().contains("is a symbolic link, not a socket"), "{e}");
        assert!(std::fs::symlink_metadata(&link).is_ok() && file.exists());

        let live = dir.path().join("live.sock");
        let listener = std::os::unix::net::UnixListener::bind(&live).expect("bind");
        let e = remove_stale_socket(&live).expect_err("a live socket");
        assert!(e.to_string().contains("in use by another server"), "{e}");
        assert!(live.exists());
        // Closed, its file stays and nobody answers: a stale socket, removed.
        drop(listener);
        remove_stale_socket(&live).expect("a stale socket");
        assert!(!live.exists());
    }
}
