//! `stria serve` and `stria up`: their options, and where the daemon says it serves.

use anyhow::{Context, Result, bail};
use stria_catalog::{Catalog, CreateVolume};

use super::warn_overcommit;
use crate::cli::{DEFAULT_HTTP_PORT, ServeArgs, UP_LAYOUT, UpArgs};
use crate::daemon::{self, NbdAddr, ServeOptions};
use crate::http;
use crate::pooldir::PoolDir;

/// `stria serve`.
pub(super) async fn serve(dir: PoolDir, mut args: ServeArgs) -> Result<()> {
    if let Some((drives, drive_bytes)) = args.bench_memory_drives {
        let volumes = std::mem::take(&mut args.bench_volume);
        let fast = args.bench_memory_fast_drives.unwrap_or((0, 0));
        let spec = daemon::MemoryPoolSpec {
            drives,
            drive_bytes,
            fast_drives: fast.0,
            fast_drive_bytes: fast.1,
            volumes,
        };
        let opts = serve_tls_options(args)?;
        return daemon::serve_memory(spec, opts, |uris| print_ready(uris, None)).await;
    }
    let opts = serve_options(&dir, args)?;
    daemon::serve(dir, opts, |uris| print_ready(uris, None)).await
}

/// `stria up`: the default pool, created on first use, then served.
pub(super) async fn up(dir: PoolDir, args: UpArgs) -> Result<()> {
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
            gc: None,
            cache_mode: None,
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

pub(crate) fn serve_options(dir: &PoolDir, args: ServeArgs) -> Result<ServeOptions> {
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
    let iscsi_chap = iscsi_chap(&args)?;
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
        iscsi_chap,
        iscsi: args.iscsi,
        iscsi_connections_max: args.iscsi_connections_max,
        iscsi_busy_poll: args.iscsi_busy_poll,
        iscsi_threads: args.iscsi_threads,
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

/// `--iscsi-chap-*`: the CHAP credentials, their secrets read from their files.
fn iscsi_chap(args: &ServeArgs) -> Result<Option<std::sync::Arc<stria_iscsi::Chap>>> {
    let read = |path: &std::path::Path, flag: &str| -> Result<Vec<u8>> {
        let mut secret =
            std::fs::read(path).with_context(|| format!("{flag}: cannot read {}", path.display()))?;
        if secret.ends_with(b"\n") {
            secret.pop();
        }
        let min = stria_iscsi::login::CHAP_SECRET_MIN_BYTES;
        if !(min..=256).contains(&secret.len()) {
            bail!(
                "{flag}: the secret in {} is {} bytes; CHAP needs {min} to 256",
                path.display(),
                secret.len()
            );
        }
        Ok(secret)
    };
    let (Some(user), Some(file)) = (&args.iscsi_chap_user, &args.iscsi_chap_secret_file) else {
        return Ok(None);
    };
    let secret = read(file, "--iscsi-chap-secret-file")?;
    let mutual = match (&args.iscsi_chap_mutual_user, &args.iscsi_chap_mutual_secret_file) {
        (Some(user), Some(file)) => Some((user.clone(), read(file, "--iscsi-chap-mutual-secret-file")?)),
        _ => None,
    };
    if mutual.as_ref().is_some_and(|(_, s)| *s == secret) {
        bail!("--iscsi-chap-mutual-secret-file: the target's secret must differ from the initiators'");
    }
    Ok(Some(std::sync::Arc::new(stria_iscsi::Chap { user: user.clone(), secret, mutual })))
}

/// Where to connect; with `examples` (the pool directory), client commands to try.
fn print_ready(uris: &[String], examples: Option<&str>) {
    outln!("stria is serving; NBD URIs (replace VOLUME by a volume name):");
    for u in uris.iter().filter(|u| u.starts_with("nbd")) {
        outln!("  {u}");
    }
    for u in uris.iter().filter(|u| u.starts_with("iscsi")) {
        outln!("iSCSI: {u}");
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
