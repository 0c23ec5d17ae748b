//! The benchmarks' memory pool (`stria serve --bench-memory-drives`, hidden): what
//! `scripts/bench-nbd.sh --drives memory` and `scripts/profile-datapath.sh --drives memory` serve.
//! Every layout they measure must be served, keep what a client writes while the process lives,
//! and a layout the pool cannot hold must stop the start with the reason.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{Stria, binary, qemu_io};

/// The server, killed when dropped (a failed assertion must not leave it running).
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `stria serve` of a memory pool on Unix socket `socket` with `args` after it (its stderr piped,
/// killed when dropped).
fn serve(stria: &Stria, socket: &Path, args: &[&str]) -> Killed {
    Killed(
        Command::new(binary())
            .args(["serve", "--log-level", "warn", "--nbd"])
            .arg(format!("unix:{}", socket.display()))
            .args(args)
            .current_dir(stria.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start stria serve"),
    )
}

#[test]
fn the_benchmark_memory_pool_serves_every_layout_the_benchmarks_measure() {
    let stria = Stria::new();
    let socket = stria.dir.path().join("bench.sock");
    let mut server = serve(
        &stria,
        &socket,
        &[
            "--bench-memory-drives",
            "6x1G",
            "--bench-memory-fast-drives",
            "2x512M",
            "--bench-volume",
            "r0:raid0:128M",
            "--bench-volume",
            "e:ec:4+2:128M",
            "--bench-volume",
            "tv:tiered:ec:4+2:128M",
            "--bench-volume",
            "lv:log:ec:4+2:128M",
        ],
    );
    let start = Instant::now();
    while !socket.exists() {
        if let Some(status) = server.0.try_wait().expect("wait") {
            panic!("stria serve with a memory pool exited at start: {status}");
        }
        assert!(start.elapsed() < Duration::from_secs(60), "stria serve did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    for vol in ["r0", "e", "tv", "lv"] {
        let (ok, text) = qemu_io(
            &socket,
            vol,
            &["write -P 0x3c 1M 3M", "flush", "read -P 0x3c 1M 3M", "read -P 0 0 1M", "read -P 0 4M 1M"],
        );
        assert!(ok, "volume {vol} of the memory pool: {text}");
    }
    let killed =
        Command::new("kill").args(["-s", "TERM", &server.0.id().to_string()]).status().expect("kill");
    assert!(killed.success());
    let status = server.0.wait().expect("wait");
    assert_eq!(status.code(), Some(0), "stria serve of a memory pool stopped by SIGTERM");

    // A tiered volume without fast drives: refused at start, with the reason (a server that
    // started anyway would be killed when the wait below gives up).
    let mut refused = serve(
        &stria,
        &stria.dir.path().join("refused.sock"),
        &["--bench-memory-drives", "6x1G", "--bench-volume", "tv:tiered:ec:4+2:128M"],
    );
    let start = Instant::now();
    let status = loop {
        if let Some(status) = refused.0.try_wait().expect("wait") {
            break status;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "stria serve with a tiered volume and no fast drives runs"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut refused.0.stderr.take().expect("piped"), &mut stderr)
        .expect("read stderr");
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("cannot create volume tv") && stderr.contains("fast drive"), "{stderr}");
}
