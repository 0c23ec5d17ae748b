//! What the CLI prints, without ever dying of it: stdout or stderr may be a pipe whose reader has
//! gone (`stria status | head -1`, `stria status 2>&1 | grep -m1 drive`). Rust ignores SIGPIPE,
//! so such a write fails with EPIPE, and `println!`/`eprintln!` panic on a failed write (an
//! abort, exit 134, in the release build). Here a closed stdout only ends the output: the command
//! goes on and exits with the code it earned (`status` still says 2 for a degraded pool). A
//! closed stderr loses the messages, nothing else.
//!
//! A stdout that fails for another reason (a full disk under `> file`) is reported on stderr
//! once the command is done, and a command that earned 0 then exits 1: its output is incomplete.

use std::io::Write;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

/// Set at the first failed write to stdout: nothing more is written there.
static STDOUT_GONE: AtomicBool = AtomicBool::new(false);
/// Why stdout failed, when it was not a reader that went away.
static STDOUT_ERROR: OnceLock<String> = OnceLock::new();

/// One line on stdout (the `outln!` macro).
pub(crate) fn out(args: std::fmt::Arguments<'_>) {
    if STDOUT_GONE.load(Relaxed) {
        return;
    }
    let mut stdout = std::io::stdout().lock();
    // Line buffered: the newline flushes, so a closed pipe shows here and not at exit.
    if let Err(e) = stdout.write_fmt(args).and_then(|()| stdout.write_all(b"\n")) {
        STDOUT_GONE.store(true, Relaxed);
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            let _ = STDOUT_ERROR.set(e.to_string());
        }
    }
}

/// One line on stderr (the `errln!` macro); a failed write is dropped.
pub(crate) fn err(args: std::fmt::Arguments<'_>) {
    let _ = writeln!(std::io::stderr().lock(), "{args}");
}

/// True once stdout is closed (or failed): output that goes on for ever (`iostat`) stops.
pub(crate) fn stdout_gone() -> bool {
    STDOUT_GONE.load(Relaxed)
}

/// The exit code of a command that earned `earned`: the same, unless stdout failed for a reason
/// other than a reader that went away and the command would have exited 0 (the output it was
/// run for is incomplete).
pub(crate) fn exit_code(earned: i32) -> i32 {
    match STDOUT_ERROR.get() {
        Some(why) => {
            err(format_args!("error: the output could not be written: {why}"));
            if earned == 0 { 1 } else { earned }
        }
        None => earned,
    }
}
