//! How the process ends when its output has nowhere to go (issue: "process exits"): a reader
//! that goes away (`stria status | head -1`, `stria status 2>&1 | grep -m1 drive`) closes the
//! pipe, and every later write fails with EPIPE. The command must still end with the exit code
//! it earned, never an abort, and a `serve` that refuses to start exits 1 with its message.
//!
//! A pipe whose read end is closed before the process starts stands in for the reader that left:
//! every write to it fails, so the outcome does not depend on timing.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{Daemon, POOL, Stria, binary, expect, wait_bounded};

/// Where a stream of the child goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sink {
    /// A pipe nobody reads any more (its read end closed).
    Closed,
    /// A pipe read to the end by the test.
    Read,
}

/// What a run with `stdout` and `stderr` sent to those sinks gave: the exit code (`None`: a
/// signal ended it) and whatever stderr said when it was read.
fn run(stria: &Stria, args: &[&str], stdout: Sink, stderr: Sink) -> (Option<i32>, String) {
    let closed = || {
        let (reader, writer) = std::io::pipe().expect("pipe");
        drop(reader);
        Stdio::from(writer)
    };
    let sink = |s: Sink| if s == Sink::Closed { closed() } else { Stdio::piped() };
    let mut child = Command::new(binary())
        .arg("--pool")
        .arg(POOL)
        .args(args)
        .current_dir(stria.dir.path())
        .env_remove("STRIA_POOL")
        .env("STRIA_LOG", "info")
        .stdin(Stdio::null())
        .stdout(sink(stdout))
        .stderr(sink(stderr))
        .spawn()
        .expect("spawn the stria binary");
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut text = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut text);
            }
            String::from_utf8_lossy(&text).into_owned()
        })
    };
    let out = drain(child.stdout.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let err = drain(child.stderr.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    // Bounded: a command that should have ended (a refused serve, iostat without a reader) and
    // did not is killed, and the test fails instead of hanging.
    let status = wait_bounded(&mut child, Duration::from_secs(60), &format!("`stria {}`", args.join(" ")));
    drop(out.join());
    (status.code(), err.join().expect("stderr reader"))
}

/// Checks `stria ARGS` ends with `code` for every way of closing its output.
fn ends_with(stria: &Stria, args: &[&str], code: i32) {
    for (stdout, stderr) in
        [(Sink::Closed, Sink::Read), (Sink::Read, Sink::Closed), (Sink::Closed, Sink::Closed)]
    {
        let (got, err) = run(stria, args, stdout, stderr);
        assert_eq!(
            got,
            Some(code),
            "`stria {}` with stdout {stdout:?} and stderr {stderr:?} exited {got:?}, not {code}:\n{err}",
            args.join(" ")
        );
    }
}

#[test]
fn a_closed_stdout_or_stderr_ends_the_output_and_the_command_exits_as_it_earned() {
    let stria = Stria::new();
    expect(&stria, &["pool", "create", "--capacity", "4", "--drive-size", "64M"], 0);
    expect(&stria, &["volume", "create", "m", "--size", "8M", "--layout", "raid1"], 0);
    expect(&stria, &["volume", "create", "z", "--size", "8M", "--layout", "raid0:1"], 0);
    ends_with(&stria, &["status"], 0);
    ends_with(&stria, &["volume", "list"], 0);
    ends_with(&stria, &["status", "--json"], 0);
    // A refusal: its message is lost with stderr, its code is not.
    ends_with(&stria, &["volume", "delete", "nothing-here"], 1);
    ends_with(&Stria::new(), &["status"], 1);
    // Degraded, then failed: `status` says so by its code, whatever happened to its output (the
    // drive left out is also logged on stderr at every open).
    let drives_of = |name: &str| -> Vec<String> {
        let out = expect(&stria, &["volume", "show", name, "--json"], 0);
        let v: serde_json::Value = serde_json::from_str(&out.stdout).expect("volume JSON");
        v["segments"][0]["members"]
            .as_array()
            .expect("members")
            .iter()
            .map(|m| m["drive"].to_string())
            .collect()
    };
    let (m, z) = (drives_of("m"), drives_of("z"));
    let only_m = m.iter().find(|d| !z.contains(d)).expect("a drive of m alone");
    expect(&stria, &["drive", "fail", only_m], 0);
    ends_with(&stria, &["status"], 2);
    ends_with(&stria, &["status", "--json"], 2);
    expect(&stria, &["drive", "fail", &z[0], "--force"], 0);
    ends_with(&stria, &["status"], 3);
    ends_with(&stria, &["drive", "list"], 0);
}

#[test]
fn a_refused_serve_exits_1_with_its_message() {
    let stria = Stria::new();
    // No pool: refused before anything opens.
    let (code, err) = run(&stria, &["serve", "--nbd", "unix:nbd.sock"], Sink::Read, Sink::Read);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("error: no pool at"), "{err}");
    ends_with(&stria, &["serve", "--nbd", "unix:nbd.sock"], 1);
    // The pool is served already: refused at its lock, with the running daemon untouched.
    expect(&stria, &["pool", "create", "--capacity", "2", "--drive-size", "64M"], 0);
    let daemon = Daemon::start(&stria);
    let (code, err) = run(&stria, &["serve", "--nbd", "unix:other.sock"], Sink::Read, Sink::Read);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.starts_with("error: ") || err.contains("\nerror: "), "{err}");
    ends_with(&stria, &["serve", "--nbd", "unix:other.sock"], 1);
    expect(&stria, &["status"], 0);
    let (code, log) = daemon.stop();
    assert_eq!(code, Some(0), "{log}");
}

#[test]
fn a_serve_refused_by_a_full_filesystem_exits_1_every_time() {
    let stria = Stria::new();
    let at = stria.dir.path().join(POOL);
    let Some(fs) = crate::operator_safety::SmallFs::mount(&stria.dir.path().join("fs.img"), &at, 64) else {
        eprintln!("skipped: cannot mount a loop filesystem here (needs root)");
        return;
    };
    // The first open commits its metadata to slot 1 (generations 1 and 2 were written by the
    // create and its clean close: slot 1 holds the older one). Its blocks are given back to the
    // filesystem, so that with the filesystem full that commit cannot be written: the open is
    // refused and nothing is failed.
    expect(&stria, &["pool", "create", "--capacity", "2", "--drive-size", "64M"], 0);
    for drive in ["capacity-0.img", "capacity-1.img"] {
        let punched = Command::new("fallocate")
            .args(["--punch-hole", "--offset", "2097152", "--length", "1048576"])
            .arg(at.join("drives").join(drive))
            .status()
            .expect("fallocate");
        assert!(punched.success(), "fallocate --punch-hole of metadata slot 1");
    }
    // Every block taken: preallocated, then written until ENOSPC (what fallocate leaves).
    let free = rustix::fs::statvfs(&at).map(|s| s.f_bavail * s.f_frsize).expect("statvfs");
    let _ =
        Command::new("fallocate").args(["-l", &(free & !4095).to_string()]).arg(at.join("filler")).status();
    let _ = Command::new("dd")
        .args(["if=/dev/zero", "bs=4k"])
        .arg(format!("of={}", at.join("filler2").display()))
        .stderr(Stdio::null())
        .status();
    for round in 0..5 {
        let sinks = [(Sink::Read, Sink::Read), (Sink::Closed, Sink::Closed), (Sink::Read, Sink::Closed)];
        let (stdout, stderr) = sinks[round % sinks.len()];
        let (code, err) = run(&stria, &["serve", "--nbd", "unix:nbd.sock"], stdout, stderr);
        assert_eq!(code, Some(1), "round {round}, stdout {stdout:?}, stderr {stderr:?}:\n{err}");
        if stderr == Sink::Read {
            assert!(err.contains("Free space there and run the command again"), "{err}");
        }
    }
    let _ = std::fs::remove_file(at.join("filler2"));
    fs.free_space();
    expect(&stria, &["status"], 0);
    drop(fs);
}

#[test]
fn iostat_stops_when_its_reader_goes_away() {
    let stria = Stria::new();
    expect(&stria, &["pool", "create", "--capacity", "2", "--drive-size", "64M"], 0);
    let daemon = Daemon::start(&stria);
    let start = Instant::now();
    // No count: it would report for ever.
    let (code, err) = run(&stria, &["iostat", "0.1"], Sink::Closed, Sink::Read);
    assert_eq!(code, Some(0), "{err}");
    assert!(start.elapsed() < Duration::from_secs(30), "iostat went on after its reader left");
    let (code, log) = daemon.stop();
    assert_eq!(code, Some(0), "{log}");
}
