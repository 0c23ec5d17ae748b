//! Errors by kind, as clients meet them (issue 35, finding 4): a full thin volume answers NBD
//! writes with ENOSPC (not EIO, which ext4 and qemu take for a media error), says `full` in its
//! state, and takes writes again once TRIM freed space.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::{Daemon, Stria, expect, qemu_io};

fn show(stria: &Stria, vol: &str) -> Value {
    serde_json::from_str(&expect(stria, &["volume", "show", vol, "--json"], 0).stdout).expect("JSON")
}

#[test]
fn a_full_thin_volume_answers_enospc_says_full_and_recovers_after_trim() {
    let stria = Stria::new();
    expect(&stria, &["pool", "create", "--capacity", "6", "--drive-size", "256M"], 0);
    // 128 MiB of logical size over 24 MiB of segment space: an over-committed thin volume.
    let created = expect(
        &stria,
        &[
            "volume",
            "create",
            "thin",
            "--size",
            "128M",
            "--layout",
            "log:ec:4+2",
            "--space",
            "24M",
            "--cache-size",
            "8M",
        ],
        0,
    );
    assert!(
        created.stderr.contains("over-commit") || created.stdout.contains("over-commit"),
        "{}",
        created.stderr
    );
    let daemon = Daemon::start(&stria);
    let (_, text) = qemu_io(&daemon.socket, "thin", &["write -P 0x5a 0 96M"]);
    assert!(text.contains("No space left on device"), "a full thin volume must answer ENOSPC:\n{text}");
    assert!(!text.contains("Input/output error"), "ENOSPC, not EIO:\n{text}");
    let view = show(&stria, "thin");
    assert_eq!(view["full"], true, "{view}");
    let listed = expect(&stria, &["volume", "show", "thin"], 0).stdout;
    assert!(listed.contains("full"), "the state says full:\n{listed}");

    // TRIM everything: space comes back and writes are accepted again.
    let (_, text) = qemu_io(&daemon.socket, "thin", &["discard 0 128M", "flush"]);
    assert!(!text.contains("failed"), "{text}");
    let start = Instant::now();
    loop {
        let (_, text) =
            qemu_io(&daemon.socket, "thin", &["write -P 0x6b 0 4M", "flush", "read -P 0x6b 0 4M"]);
        if !text.contains("failed") {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "writes still fail after TRIM:\n{text}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let start = Instant::now();
    while show(&stria, "thin")["full"] == true {
        assert!(start.elapsed() < Duration::from_secs(30), "still full after TRIM and a write");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (code, log) = daemon.stop();
    assert_eq!(code, Some(0), "{log}");
    let warnings: Vec<&str> = log.lines().filter(|l| l.contains("fail with ENOSPC")).collect();
    assert!(
        !warnings.is_empty() && warnings.iter().all(|w| w.contains("TRIM")),
        "a warning that names what frees space:\n{log}"
    );
    assert!(warnings.len() <= 2, "the warning is rate-limited, not repeated every retry:\n{log}");
    assert!(log.contains("space available again"), "{log}");
}
