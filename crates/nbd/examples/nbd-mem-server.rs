//! `nbd-mem-server`: serves sparse in-memory exports over NBD, for client tests and benchmarks.
//!
//! ```text
//! nbd-mem-server [--unix PATH] [--tcp HOST:PORT] [--size BYTES[K|M|G]] [--export NAME]...
//!                [--ro-export NAME]... [--faulty-export NAME]... [--slow-zero-export NAME]... [--description TEXT]
//!                [--tls off|on|require --tls-cert PEM --tls-key PEM [--tls-client-ca PEM]] [--threads N]
//! ```
//!
//! A faulty export fails every operation touching bytes [1 MiB, 1 MiB + 4 KiB) with EIO; a
//! slow-zero export refuses `FAST_ZERO` (ENOTSUP) as if zeroing were as slow as writing. With
//! `--tls-client-ca` (and `--tls require`) clients must present a certificate from that CA.
//! SIGINT or SIGTERM shut the server down gracefully.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use stria_nbd::{ExportMap, MemExport, Server, ServerConfig, TlsConfig, TlsMode};

/// Bytes of the faulty export that fail with EIO.
const FAULT_RANGE: std::ops::Range<u64> = (1 << 20)..((1 << 20) + 4096);

#[derive(Debug)]
struct Args {
    unix: Option<PathBuf>,
    tcp: Option<String>,
    size_bytes: u64,
    exports: Vec<String>,
    ro_exports: Vec<String>,
    faulty_exports: Vec<String>,
    slow_zero_exports: Vec<String>,
    description: Option<String>,
    tls: TlsMode,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    tls_client_ca: Option<PathBuf>,
    threads: usize,
}

fn parse_size(text: &str) -> Result<u64, String> {
    let (digits, shift) = match text.chars().last() {
        Some('K' | 'k') => (&text[..text.len() - 1], 10),
        Some('M' | 'm') => (&text[..text.len() - 1], 20),
        Some('G' | 'g') => (&text[..text.len() - 1], 30),
        Some('T' | 't') => (&text[..text.len() - 1], 40),
        _ => (text, 0),
    };
    let value: u64 = digits.parse().map_err(|_| format!("bad size {text:?}"))?;
    value.checked_mul(1 << shift).ok_or_else(|| format!("size {text:?} overflows"))
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        unix: None,
        tcp: None,
        size_bytes: 1 << 30,
        exports: Vec::new(),
        ro_exports: Vec::new(),
        faulty_exports: Vec::new(),
        slow_zero_exports: Vec::new(),
        description: None,
        tls: TlsMode::Off,
        tls_cert: None,
        tls_key: None,
        tls_client_ca: None,
        threads: 1,
    };
    let mut iter = std::env::args().skip(1);
    while let Some(flag) = iter.next() {
        let mut value = || iter.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--unix" => args.unix = Some(PathBuf::from(value()?)),
            "--tcp" => args.tcp = Some(value()?),
            "--size" => args.size_bytes = parse_size(&value()?)?,
            "--export" => args.exports.push(value()?),
            "--ro-export" => args.ro_exports.push(value()?),
            "--faulty-export" => args.faulty_exports.push(value()?),
            "--slow-zero-export" => args.slow_zero_exports.push(value()?),
            "--description" => args.description = Some(value()?),
            "--tls" => args.tls = value()?.parse().map_err(|err| format!("{err}"))?,
            "--tls-cert" => args.tls_cert = Some(PathBuf::from(value()?)),
            "--tls-key" => args.tls_key = Some(PathBuf::from(value()?)),
            "--tls-client-ca" => args.tls_client_ca = Some(PathBuf::from(value()?)),
            "--threads" => args.threads = value()?.parse().map_err(|_| "bad --threads".to_owned())?,
            "--help" | "-h" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if args.unix.is_none() && args.tcp.is_none() {
        return Err("give --unix PATH and/or --tcp HOST:PORT".to_owned());
    }
    if args.exports.is_empty()
        && args.ro_exports.is_empty()
        && args.faulty_exports.is_empty()
        && args.slow_zero_exports.is_empty()
    {
        args.exports.push(String::new());
    }
    Ok(args)
}

fn build_exports(args: &Args) -> Result<Arc<ExportMap>, String> {
    let exports = Arc::new(ExportMap::new());
    let described = |export: MemExport, name: &str| match &args.description {
        Some(text) => export.with_description(text.clone()),
        None => export.with_description(format!("stria in-memory export {name:?}")),
    };
    for name in &args.exports {
        let export = described(MemExport::new(args.size_bytes), name);
        exports.insert(name, Arc::new(export)).map_err(|err| err.to_string())?;
    }
    for name in &args.ro_exports {
        let export = described(MemExport::new(args.size_bytes).with_read_only(true), name);
        exports.insert(name, Arc::new(export)).map_err(|err| err.to_string())?;
    }
    for name in &args.faulty_exports {
        let export = described(MemExport::new(args.size_bytes).with_io_error_range(FAULT_RANGE), name);
        exports.insert(name, Arc::new(export)).map_err(|err| err.to_string())?;
    }
    for name in &args.slow_zero_exports {
        let export = described(MemExport::new(args.size_bytes).with_fast_zero(false), name);
        exports.insert(name, Arc::new(export)).map_err(|err| err.to_string())?;
    }
    Ok(exports)
}

async fn serve(args: Args) -> Result<(), String> {
    let tls = match args.tls {
        TlsMode::Off if args.tls_client_ca.is_some() => {
            return Err("--tls-client-ca needs --tls require".to_owned());
        }
        TlsMode::Off => TlsConfig::off(),
        mode => {
            let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) else {
                return Err("--tls on|require needs --tls-cert and --tls-key".to_owned());
            };
            TlsConfig::from_pem_files_with_client_ca(mode, cert, key, args.tls_client_ca.as_deref())
                .map_err(|err| err.to_string())?
        }
    };
    let config = ServerConfig { tls, ..ServerConfig::default() };
    let server = Server::new(config, build_exports(&args)?).map_err(|err| err.to_string())?;
    if let Some(path) = &args.unix {
        server.serve_unix(path).map_err(|err| format!("cannot listen on {}: {err}", path.display()))?;
    }
    if let Some(addr) = &args.tcp {
        server.serve_tcp(addr.as_str()).await.map_err(|err| format!("cannot listen on {addr}: {err}"))?;
    }
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|err| format!("cannot watch SIGTERM: {err}"))?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
    server.shutdown().await;
    Ok(())
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            if !message.is_empty() {
                eprintln!("nbd-mem-server: {message}");
            }
            eprintln!(
                "usage: nbd-mem-server [--unix PATH] [--tcp HOST:PORT] [--size BYTES[K|M|G]] [--export NAME]... \
                 [--ro-export NAME]... [--faulty-export NAME]... [--slow-zero-export NAME]... [--description TEXT] \
                 [--tls off|on|require --tls-cert PEM --tls-key PEM [--tls-client-ca PEM]] [--threads N]"
            );
            return ExitCode::from(2);
        }
    };
    let runtime = if args.threads <= 1 {
        tokio::runtime::Builder::new_current_thread().enable_all().build()
    } else {
        tokio::runtime::Builder::new_multi_thread().worker_threads(args.threads).enable_all().build()
    };
    let runtime = match runtime {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("nbd-mem-server: cannot start the runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("nbd-mem-server: {message}");
            ExitCode::FAILURE
        }
    }
}
