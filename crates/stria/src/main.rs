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

/// mimalloc instead of the system allocator: per-request buffers and futures are allocated and
/// freed on the datapath (malloc/free was 7-14 % of the server's CPU, docs/design/datapath.md §3).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod cli;
mod commands;
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

use anyhow::Result;

use commands::{INTERRUPTED, Interrupted};

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
    let cli = cli::parse_cli().unwrap_or_else(|e| e.exit());
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
        n => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(n).thread_stack_size(RUNTIME_STACK_BYTES).enable_all();
            // A daemon whose connections have threads of their own runs the shared runtime's
            // workers (background work, the control plane) below them (`--background-nice`).
            if let Some(levels) = cli.background_nice_levels() {
                b.on_thread_start(move || {
                    if let Err(e) = stria_dev::priority::run_as_background(levels) {
                        tracing::warn!(error = %e, "a runtime thread could not lower its priority");
                    }
                });
            }
            b.build()
        }
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
            .spawn_scoped(scope, || {
                runtime.block_on(Box::pin(async {
                    // On a current-thread runtime every request runs on this thread: it gets an
                    // io_uring of its own for the file drives (stria_dev::file::local).
                    if threads == 0 {
                        match stria_dev::file::local::install() {
                            Ok(Some(reaper)) => drop(tokio::spawn(reaper.run())),
                            Ok(None) => {}
                            Err(error) => {
                                tracing::debug!(%error, "no io_uring of the thread's own: file drives use their own rings");
                            }
                        }
                    }
                    commands::run(cli).await
                }))
            })
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
pub(crate) const RUNTIME_STACK_BYTES: usize = 64 << 20;

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
