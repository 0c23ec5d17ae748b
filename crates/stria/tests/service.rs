//! Running stria as a service: the configuration file (flags win over it, unknown keys are
//! refused), JSON logs, SIGHUP reloading what can change live, and `stria iostat`.

use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{Stria, binary, expect};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}

/// `stria ARGS` in the test directory with no STRIA_* environment, its log read as it comes.
struct Serve {
    child: std::process::Child,
    /// The log so far, filled by a reader thread.
    log: Arc<Mutex<String>>,
}

impl Serve {
    fn start(stria: &Stria, args: &[&str]) -> Serve {
        Serve::start_env(stria, args, &[])
    }

    /// Starts it with `env` set as well.
    fn start_env(stria: &Stria, args: &[&str], env: &[(&str, &std::path::Path)]) -> Serve {
        let mut child = Command::new(binary())
            .args(args)
            .envs(env.iter().map(|(k, v)| (*k, *v)))
            .current_dir(stria.dir.path())
            .env_remove("STRIA_POOL")
            .env_remove("STRIA_LOG")
            .env_remove("STRIA_LOG_FORMAT")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start stria serve");
        let mut pipe = child.stderr.take().expect("piped");
        let log = Arc::new(Mutex::new(String::new()));
        let sink = Arc::clone(&log);
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().expect("log lock").push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        Serve { child, log }
    }

    fn text(&self) -> String {
        self.log.lock().expect("log lock").clone()
    }

    /// Waits until the log holds `text` (30 s at most).
    fn wait_for(&self, text: &str) {
        let start = Instant::now();
        while !self.text().contains(text) {
            assert!(start.elapsed() < Duration::from_secs(30), "no `{text}` in the log:\n{}", self.text());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill").args(["-s", sig, &self.child.id().to_string()]).status().expect("kill");
        assert!(ok.success());
    }

    fn stop(mut self) -> String {
        self.signal("TERM");
        let status = self.child.wait().expect("wait");
        std::thread::sleep(Duration::from_millis(100));
        let log = self.text();
        assert!(status.success(), "stria serve exited with {status}:\n{log}");
        log
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn the_configuration_file_sets_the_daemon_and_sighup_reloads_it() {
    let stria = Stria::new();
    expect(&stria, &["pool", "create", "--fast", "0", "--capacity", "3", "--drive-size", "64M"], 0);
    expect(&stria, &["volume", "create", "v", "--size", "16M", "--layout", "raid1"], 0);
    let dir = stria.dir.path();
    let (port, iscsi_port) = (free_port(), free_port());
    let config = |rate: &str, nbd: &str| {
        format!(
            "pool = \"pool\"\nlog_level = \"info\"\nlog_format = \"json\"\nnbd = [\"unix:{nbd}\"]\n\
             iscsi = [\"tcp:127.0.0.1:{iscsi_port}\"]\n\
             http = \"tcp:127.0.0.1:{port}\"\nrebuild_rate = \"{rate}\"\n[limits]\nnbd_connections = 4\n\
             iscsi_connections = 4\n"
        )
    };
    std::fs::write(dir.join("stria.toml"), config("100M", "nbd.sock")).expect("write");

    // An unknown key is refused, naming it; nothing starts.
    std::fs::write(dir.join("bad.toml"), "pool = \"pool\"\nrebuild_rat = \"1M\"\n").expect("write");
    let out = stria.run(&["serve", "--config", "bad.toml"]);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("rebuild_rat"), "{}", out.stderr);

    let serve = Serve::start(&stria, &["serve", "--config", "stria.toml"]);
    serve.wait_for("http listener");
    assert!(dir.join("nbd.sock").exists(), "the NBD listener of the file");
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", iscsi_port)).is_ok(),
        "the iSCSI listener of the file"
    );
    // The pool of the file is the one served: the control socket answers.
    let status = expect(&stria, &["status", "--json"], 0);
    assert!(status.stdout.contains("\"name\": \"v\""), "{}", status.stdout);

    // SIGHUP: the rebuild rate changes at once; a new NBD address waits for a restart.
    std::fs::write(dir.join("stria.toml"), config("5M", "other.sock")).expect("write");
    serve.signal("HUP");
    serve.wait_for("SIGHUP: rebuild rate set");
    serve.wait_for("takes effect at the next start");
    // A file that no longer parses changes nothing and stops nothing.
    std::fs::write(dir.join("stria.toml"), "pool = [").expect("write");
    serve.signal("HUP");
    serve.wait_for("the file does not load; nothing changed");
    let log = serve.stop();
    let mut lines = 0;
    for line in log.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("a log line is not JSON ({e}): {line}"));
        assert!(v["level"].is_string() && v["fields"].is_object(), "{line}");
        lines += 1;
    }
    assert!(lines > 3, "{log}");
    assert!(log.contains("\"bytes_per_sec\":5242880"), "{log}");
    assert!(log.contains("\"key\":\"nbd\""), "{log}");

    // A flag wins over the file: --log-level warn hides the file's info lines.
    std::fs::write(dir.join("stria.toml"), config("100M", "nbd.sock")).expect("write");
    let serve = Serve::start(&stria, &["serve", "--config", "stria.toml", "--log-level", "warn"]);
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(start.elapsed() < Duration::from_secs(30), "no http listener");
        std::thread::sleep(Duration::from_millis(20));
    }
    let log = serve.stop();
    assert!(!log.contains("http listener"), "info lines with --log-level warn:\n{log}");
}

/// A SIGTERM sent the moment the first listener exists stops the daemon cleanly (exit 0, its
/// shutdown logged): the handlers are installed before any listener. They once came after the
/// HTTP listener, and the test above, which stops a daemon as soon as HTTP answers, saw it killed
/// by the signal on a busy machine.
#[test]
fn a_sigterm_as_soon_as_a_listener_exists_stops_the_daemon_cleanly() {
    let stria = Stria::new();
    expect(&stria, &["pool", "create", "--fast", "0", "--capacity", "3", "--drive-size", "64M"], 0);
    expect(&stria, &["volume", "create", "v", "--size", "16M", "--layout", "raid1"], 0);
    let pool = stria.dir.path().join("pool");
    let http = format!("tcp:127.0.0.1:{}", free_port());
    for round in 0..3 {
        let sock = stria.dir.path().join("nbd.sock");
        let _ = std::fs::remove_file(&sock);
        let serve = Serve::start(
            &stria,
            &["serve", "--pool", pool.to_str().expect("utf-8"), "--nbd", "unix:nbd.sock", "--http", &http],
        );
        // Spin, and signal straight from this process (`kill(1)` would take a fork and an exec).
        let start = Instant::now();
        while !sock.exists() {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "round {round}: no NBD socket:\n{}",
                serve.text()
            );
        }
        let pid = libc::pid_t::try_from(serve.child.id()).expect("pid");
        // SAFETY: a plain kill(2) of the child this test started and has not reaped.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
        let mut serve = serve;
        let status = serve.child.wait().expect("wait");
        std::thread::sleep(Duration::from_millis(100));
        let log = serve.text();
        assert!(status.success(), "round {round}: stria serve exited with {status}:\n{log}");
        assert!(log.contains("shutting down"), "round {round}:\n{log}");
    }
}

#[test]
fn under_systemd_the_daemon_says_when_it_is_ready_and_when_it_stops() {
    let stria = Stria::new();
    expect(&stria, &["pool", "create", "--fast", "0", "--capacity", "3", "--drive-size", "64M"], 0);
    let notify = stria.dir.path().join("notify.sock");
    let listener = std::os::unix::net::UnixDatagram::bind(&notify).expect("bind the notify socket");
    listener.set_read_timeout(Some(Duration::from_secs(60))).expect("timeout");
    let mut serve = Serve::start_env(
        &stria,
        &["--pool", "pool", "serve", "--nbd", "unix:nbd.sock"],
        &[("NOTIFY_SOCKET", notify.as_path())],
    );
    let mut buf = [0u8; 256];
    let n = listener.recv(&mut buf).expect("READY=1 from the daemon");
    assert_eq!(&buf[..n], b"READY=1");
    assert!(stria.dir.path().join("nbd.sock").exists(), "ready only once the NBD listener is up");
    serve.signal("TERM");
    let n = listener.recv(&mut buf).expect("STOPPING=1 from the daemon");
    assert_eq!(&buf[..n], b"STOPPING=1");
    let status = serve.child.wait().expect("wait");
    assert!(status.success(), "{}", serve.text());
}

#[test]
fn iostat_reports_volumes_and_drives_from_the_daemon() {
    let stria = Stria::new();
    expect(&stria, &["pool", "create", "--fast", "0", "--capacity", "3", "--drive-size", "64M"], 0);
    expect(&stria, &["volume", "create", "v", "--size", "16M", "--layout", "raid1"], 0);
    let out = expect(&stria, &["iostat", "0.1", "1"], 1);
    assert!(out.stderr.contains("no daemon is serving"), "{}", out.stderr);
    let out = expect(&stria, &["iostat", "0"], 2);
    assert!(out.stderr.contains("from 0.1 to 3600"), "{}", out.stderr);
    let serve = Serve::start(&stria, &["--pool", "pool", "serve", "--nbd", "unix:nbd.sock"]);
    serve.wait_for("NBD server listening");
    let socket = stria.dir.path().join("nbd.sock");
    let writer = Command::new("qemu-io")
        .args(["-f", "raw", &format!("nbd+unix:///v?socket={}", socket.display())])
        .args(["-c", "write -P 1 0 4M", "-c", "read 0 4M"])
        .stdout(Stdio::null())
        .status();
    assert!(writer.expect("qemu-io (package qemu-utils, installed by scripts/test.sh)").success());
    let out = expect(&stria, &["iostat", "0.2", "2"], 0);
    let reports = out.stdout.matches("volume ").count();
    assert_eq!(reports, 2, "{}", out.stdout);
    assert!(out.stdout.lines().any(|l| l.starts_with("v ")), "{}", out.stdout);
    assert_eq!(out.stdout.matches("capacity, active").count(), 6, "3 drives, 2 reports: {}", out.stdout);
    serve.stop();
}

/// `KEY=VALUE` lines of a systemd unit, as (section, key, value).
fn unit_entries(text: &str) -> Vec<(String, String, String)> {
    let mut section = String::new();
    let mut out = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.to_string();
            continue;
        }
        let (key, value) = line.split_once('=').unwrap_or_else(|| panic!("not KEY=VALUE: {line}"));
        out.push((section.clone(), key.trim().to_string(), value.trim().to_string()));
    }
    out
}

/// The documented systemd install works: the shipped unit is valid (`systemd-analyze verify`,
/// where installed), its ExecStart is a `stria serve` command this binary takes, reading the
/// configuration file the install copies from contrib/stria.toml; that file's paths are ones the
/// unit lets the daemon write; and the daemon starts from that file as shipped (the test's own
/// pool and listeners given as flags, which win over it). A file that does not parse made the
/// unit restart for ever: exit 2 (bad arguments or configuration) now stops it.
#[test]
fn the_shipped_unit_and_configuration_file_start_the_daemon() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let unit_path = root.join("contrib/systemd/stria.service");
    let config_path = root.join("contrib/stria.toml").canonicalize().expect("contrib/stria.toml");
    let unit_text = std::fs::read_to_string(&unit_path).expect("the unit");
    let unit = unit_entries(&unit_text);
    let get = |section: &str, key: &str| -> Vec<String> {
        unit.iter().filter(|(s, k, _)| s == section && k == key).map(|(_, _, v)| v.clone()).collect()
    };
    assert_eq!(get("Service", "Type"), ["notify"], "the daemon tells systemd when it is ready");
    assert_eq!(get("Service", "Restart"), ["on-failure"]);
    assert!(
        get("Service", "RestartPreventExitStatus").iter().any(|v| v.split_whitespace().any(|c| c == "2")),
        "a configuration error (exit 2) must not restart for ever"
    );
    let exec = get("Service", "ExecStart");
    assert_eq!(exec.len(), 1, "{exec:?}");
    let words: Vec<&str> = exec[0].split_whitespace().collect();
    assert_eq!(words[0], "/usr/local/bin/stria", "the path docs/operations.md installs to");
    let at = words.iter().position(|w| *w == "--config").expect("ExecStart names a configuration file");
    assert_eq!(
        words[at + 1],
        "/etc/stria/stria.toml",
        "the path docs/operations.md installs contrib/stria.toml to"
    );
    // Every flag of ExecStart is one this binary takes.
    let help = Command::new(binary()).args(&words[1..]).arg("--help").output().expect("run stria");
    assert!(help.status.success(), "`{}` is refused: {}", exec[0], String::from_utf8_lossy(&help.stderr));

    // What the file writes lies where the unit lets it write (ProtectSystem=strict).
    let file: toml::Table = toml::from_str(&std::fs::read_to_string(&config_path).expect("read"))
        .expect("contrib/stria.toml parses");
    let mut writable: Vec<String> = get("Service", "ReadWritePaths")
        .iter()
        .flat_map(|v| v.split_whitespace().map(String::from))
        .collect();
    writable.extend(get("Service", "RuntimeDirectory").iter().map(|d| format!("/run/{d}")));
    writable.extend(get("Service", "StateDirectory").iter().map(|d| format!("/var/lib/{d}")));
    let mut paths = vec![file["pool"].as_str().expect("pool").to_string()];
    paths.push(file["http_token_file"].as_str().expect("http_token_file").to_string());
    for nbd in file["nbd"].as_array().expect("nbd") {
        if let Some(p) = nbd.as_str().and_then(|a| a.strip_prefix("unix:")) {
            paths.push(p.to_string());
        }
    }
    for p in paths {
        assert!(
            writable.iter().any(|w| std::path::Path::new(&p).starts_with(w)),
            "{p} is not under the unit's writable paths {writable:?}"
        );
    }

    if let Ok(out) = Command::new("systemd-analyze").arg("--version").output()
        && out.status.success()
    {
        // A copy whose ExecStart is this binary (verify checks that it exists).
        let dir = tempfile::tempdir().expect("tempdir");
        let copy = dir.path().join("stria.service");
        let exe = binary().canonicalize().expect("binary").display().to_string();
        std::fs::write(&copy, unit_text.replace("/usr/local/bin/stria", &exe)).expect("write");
        let out =
            Command::new("systemd-analyze").args(["verify", "--man=no"]).arg(&copy).output().expect("verify");
        let said =
            format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success() && said.trim().is_empty(), "systemd-analyze verify:\n{said}");
    } else {
        eprintln!("systemd-analyze is not installed: the unit was checked by the parser above only");
    }

    // The daemon starts from the file as shipped.
    let stria = Stria::new();
    expect(&stria, &["pool", "create", "--capacity", "2", "--drive-size", "64M"], 0);
    let port = free_port();
    let config = config_path.display().to_string();
    let http = format!("tcp:127.0.0.1:{port}");
    let serve = Serve::start(
        &stria,
        &[
            "serve",
            "--config",
            &config,
            "--pool",
            "pool",
            "--nbd",
            "unix:nbd.sock",
            "--http",
            &http,
            "--http-token-file",
            "token",
        ],
    );
    serve.wait_for("http listener");
    expect(&stria, &["status"], 0);
    serve.stop();
}

/// Each thread of process `pid`: its name and its nice value (`/proc/PID/task/TID/stat`).
fn thread_nices(pid: u32) -> Vec<(String, i32)> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).expect("the daemon's threads") {
        let dir = task.expect("task").path();
        let (Ok(comm), Ok(stat)) =
            (std::fs::read_to_string(dir.join("comm")), std::fs::read_to_string(dir.join("stat")))
        else {
            continue; // the thread ended meanwhile
        };
        // After the name in parentheses: state is field 3 of stat(5), nice field 19.
        let fields: Vec<&str> = stat[stat.rfind(')').expect("stat has the name") + 2..].split(' ').collect();
        out.push((comm.trim().to_string(), fields[16].parse().expect("nice")));
    }
    out
}

#[test]
fn background_work_runs_below_the_threads_that_serve_host_requests() {
    let stria = Stria::new();
    expect(&stria, &["pool", "create", "--fast", "2", "--capacity", "6", "--drive-size", "256M"], 0);
    let base = thread_nices(std::process::id())[0].1;
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    for (args, levels) in
        [(&[][..], 5), (&["--background-nice", "3"][..], 3), (&["--background-nice", "0"][..], 0)]
    {
        let sock = stria.dir.path().join("bg.sock");
        let mut argv = vec!["--pool", "pool", "serve", "--nbd"];
        let nbd = format!("unix:{}", sock.display());
        argv.push(&nbd);
        argv.extend_from_slice(args);
        let serve = Serve::start(&stria, &argv);
        serve.wait_for("NBD server listening");
        // A drive added while serving is opened by a job on the shared runtime: its I/O threads
        // must still run at the process's priority.
        let before = thread_nices(serve.child.id()).len();
        expect(&stria, &["drive", "add", "--class", "capacity", "--size", "256M", "--no-rebalance"], 0);
        let threads = thread_nices(serve.child.id());
        assert!(threads.len() > before, "the added drive started no thread: {threads:?}");
        // On one CPU there are no connection threads and no workers: everything stays at the
        // process's priority.
        let levels = if cpus > 1 { levels } else { 0 };
        let named = |prefix: &'static str| threads.iter().filter(move |(n, _)| n.starts_with(prefix));
        assert!(cpus == 1 || named("tokio-rt-worker").count() > 0, "{threads:?}");
        for (name, nice) in named("tokio-rt-worker") {
            assert_eq!(*nice, (base + levels).min(19), "{name} with {args:?}: {threads:?}");
        }
        for prefix in ["stria-nbd-conn", "stria-uring-cq", "stria-io-pool", "stria-main"] {
            for (name, nice) in named(prefix) {
                assert_eq!(*nice, base, "{name} serves host requests ({args:?}): {threads:?}");
            }
        }
        serve.stop();
    }
}
