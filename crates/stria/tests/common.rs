//! What the integration tests share: running the built `stria` binary in a temporary directory.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The pool directory, relative to the temporary directory the commands run in.
pub(crate) const POOL: &str = "pool";
/// Longer than any command here takes on a loaded machine; a hung command fails the test.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(300);

/// The binary under test: the one cargo built, or `STRIA_TEST_BIN` (to show that a test fails
/// on an older build: `STRIA_TEST_BIN=/old/target/debug/stria cargo test -p stria --test
/// stria_cli -- operator_safety`).
pub(crate) fn binary() -> std::path::PathBuf {
    std::env::var_os("STRIA_TEST_BIN").map_or_else(|| env!("CARGO_BIN_EXE_stria").into(), Into::into)
}

/// What one run of the binary gave.
pub(crate) struct Outcome {
    pub(crate) stdout: String,
    pub(crate) stderr: String,
    /// The exit code, or `None` when a signal ended it.
    pub(crate) code: Option<i32>,
}

/// Runs the built `stria` in a temporary directory holding the pool.
pub(crate) struct Stria {
    pub(crate) dir: tempfile::TempDir,
}

impl Stria {
    pub(crate) fn new() -> Self {
        Self { dir: tempfile::tempdir().expect("temporary directory") }
    }

    /// `stria --pool pool ARGS...` in the temporary directory.
    pub(crate) fn run(&self, args: &[&str]) -> Outcome {
        self.run_in(self.dir.path(), args)
    }

    /// `stria --pool pool ARGS...` with `cwd` as the working directory.
    pub(crate) fn run_in(&self, cwd: &Path, args: &[&str]) -> Outcome {
        let mut child = Command::new(binary())
            .arg("--pool")
            .arg(POOL)
            .args(args)
            .current_dir(cwd)
            .env_remove("STRIA_POOL")
            .env_remove("STRIA_WORKER_THREADS")
            .env_remove("NO_COLOR")
            .env("STRIA_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the stria binary");
        let drain = |mut pipe: Box<dyn Read + Send>| {
            std::thread::spawn(move || {
                let mut bytes = Vec::new();
                pipe.read_to_end(&mut bytes).expect("read the output of stria");
                String::from_utf8(bytes).expect("stria prints UTF-8")
            })
        };
        let stdout = drain(Box::new(child.stdout.take().expect("piped stdout")));
        let stderr = drain(Box::new(child.stderr.take().expect("piped stderr")));
        let start = Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait for stria") {
                break status;
            }
            if start.elapsed() > COMMAND_TIMEOUT {
                child.kill().ok();
                child.wait().ok();
                panic!("`stria {}` did not finish in {COMMAND_TIMEOUT:?}", args.join(" "));
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        Outcome {
            stdout: stdout.join().expect("stdout reader"),
            stderr: stderr.join().expect("stderr reader"),
            code: status.code(),
        }
    }
}

/// Runs `stria ARGS` and checks the exit code; returns what it gave.
/// Waits for `child` at most `limit`: a command that should have ended (a refused serve, one
/// interrupted by a signal) and did not is killed, and the test fails, naming `what`, instead of
/// hanging.
pub(crate) fn wait_bounded(child: &mut Child, limit: Duration, what: &str) -> ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("wait for stria") {
            return status;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} still ran after {} s", limit.as_secs());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub(crate) fn expect(stria: &Stria, args: &[&str], code: i32) -> Outcome {
    let out = stria.run(args);
    assert_eq!(
        out.code,
        Some(code),
        "`stria {}` exited {:?}, not {code}\nstdout:\n{}\nstderr:\n{}",
        args.join(" "),
        out.code,
        out.stdout,
        out.stderr
    );
    out
}

/// `stria serve` on a Unix socket in the test's directory, killed when dropped.
pub(crate) struct Daemon {
    pub(crate) child: Child,
    pub(crate) socket: PathBuf,
    /// Reads the log as it comes (a full pipe would block the daemon).
    log: Option<std::thread::JoinHandle<String>>,
}

impl Daemon {
    pub(crate) fn start(stria: &Stria) -> Daemon {
        Daemon::start_with(stria, &[])
    }

    /// Starts it with `extra` arguments after `serve --nbd unix:SOCKET`.
    pub(crate) fn start_with(stria: &Stria, extra: &[&str]) -> Daemon {
        let socket = stria.dir.path().join("nbd.sock");
        let mut child = Command::new(binary())
            .args(["--pool", POOL, "serve", "--nbd"])
            .arg(format!("unix:{}", socket.display()))
            .args(extra)
            .current_dir(stria.dir.path())
            .env("STRIA_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start stria serve");
        let control = stria.dir.path().join(POOL).join("stria.sock");
        let start = Instant::now();
        while !(control.exists() && socket.exists()) {
            assert!(start.elapsed() < Duration::from_secs(60), "stria serve did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        let mut pipe = child.stderr.take().expect("piped");
        let log = std::thread::spawn(move || {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut pipe, &mut text).expect("read the log");
            text
        });
        Daemon { child, socket, log: Some(log) }
    }

    pub(crate) fn signal(&self, sig: &str) {
        let ok = Command::new("kill").args(["-s", sig, &self.child.id().to_string()]).status().expect("kill");
        assert!(ok.success());
    }

    /// Stops it with SIGTERM; returns its exit code and log.
    pub(crate) fn stop(mut self) -> (Option<i32>, String) {
        self.signal("TERM");
        let code = self.child.wait().expect("wait").code();
        let log = self.log.take().expect("once").join().expect("log reader");
        (code, log)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// qemu-io on export `volume` of the NBD socket `socket`: whether every command succeeded
/// (qemu-io exits 0 even when a command fails, and says so), and what it printed.
pub(crate) fn qemu_io(socket: &Path, volume: &str, commands: &[&str]) -> (bool, String) {
    let mut cmd = Command::new("qemu-io");
    cmd.args(["-f", "raw"]).arg(format!("nbd+unix:///{volume}?socket={}", socket.display()));
    for c in commands {
        cmd.args(["-c", c]);
    }
    let out = cmd.output().expect("qemu-io (package qemu-utils, installed by scripts/test.sh)");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success() && !text.contains("failed"), text)
}
