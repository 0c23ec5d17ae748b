//! Smaller truths an operator met (issue: "smaller truths the operator met"), each with the real
//! binary: what the command said or did, and what it says and does now. The shipped
//! configuration and unit file are checked in service.rs, the dashboard by tests/ui/run.sh.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::{Daemon, Outcome, POOL, Stria, binary, expect, wait_bounded};

fn says(text: &str, part: &str) {
    assert!(text.contains(part), "expected `{part}` in:\n{text}");
}

fn json(out: &Outcome) -> Value {
    serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", out.stdout))
}

/// The files in `dir`, by name (none when it does not exist).
fn files(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut names: Vec<String> =
        entries.map(|e| e.expect("entry").file_name().to_string_lossy().into()).collect();
    names.sort();
    names
}

/// qemu-io on `volume` through the daemon's socket; panics when a command fails.
fn qemu_io(daemon: &Daemon, volume: &str, commands: &[&str]) {
    let (ok, text) = crate::common::qemu_io(&daemon.socket, volume, commands);
    assert!(ok, "qemu-io {commands:?}:\n{text}");
}

#[test]
fn a_failed_pool_create_leaves_no_drive_file_and_a_retry_works() {
    let stria = Stria::new();
    let drives = stria.dir.path().join(POOL).join("drives");
    // A file in the way of the second drive file: the first one made is taken away again.
    std::fs::create_dir_all(&drives).expect("mkdir");
    std::fs::write(drives.join("capacity-1.img"), b"not ours").expect("write");
    let out = expect(&stria, &["pool", "create", "--capacity", "2", "--drive-size", "64M"], 1);
    says(&out.stderr, "capacity-1.img exists already");
    says(&out.stderr, "never writes over one");
    assert_eq!(files(&drives), ["capacity-1.img"], "the refused create left a drive file behind");
    assert_eq!(std::fs::read(drives.join("capacity-1.img")).expect("read"), b"not ours");
    std::fs::remove_file(drives.join("capacity-1.img")).expect("rm");
    expect(&stria, &["pool", "create", "--capacity", "2", "--drive-size", "64M"], 0);

    // A size no file can have: the file made before the size was refused goes too, and the
    // message names the path and the reason once each.
    // (In a pool directory that exists already, which a refused create keeps.)
    let other = Stria::new();
    let drives = other.dir.path().join(POOL).join("drives");
    std::fs::create_dir_all(other.dir.path().join(POOL)).expect("mkdir");
    let out = expect(&other, &["pool", "create", "--capacity", "2", "--drive-size", "16383P"], 1);
    let error = out.stderr.lines().find(|l| l.starts_with("error: ")).expect("an error line");
    assert_eq!(error.matches("capacity-0.img").count(), 1, "the path twice: {error}");
    says(error, "ftruncate failed");
    assert!(files(&drives).is_empty(), "a 0-byte drive file was left: {:?}", files(&drives));
    expect(&other, &["pool", "create", "--capacity", "2", "--drive-size", "64M"], 0);
}

#[test]
fn the_rebuild_rate_is_kept_in_the_pool() {
    let stria = Stria::new();
    expect(&stria, &["pool", "create", "--capacity", "2", "--drive-size", "64M"], 0);
    let rate = |s: &Stria| json(&expect(s, &["status", "--json"], 0))["rebuild_rate_bytes_per_sec"].as_u64();
    assert_eq!(rate(&stria), Some(0), "no limit at first");
    // Without a daemon it is stored for the next one.
    let out = expect(&stria, &["drive", "rebuild-rate", "7M"], 0);
    says(&out.stdout, "kept in the pool");
    assert_eq!(rate(&stria), Some(7 << 20));
    let daemon = Daemon::start(&stria);
    assert_eq!(rate(&stria), Some(7 << 20), "the daemon starts with the stored rate");
    expect(&stria, &["drive", "rebuild-rate", "5M"], 0);
    assert_eq!(rate(&stria), Some(5 << 20));
    let (code, log) = daemon.stop();
    assert_eq!(code, Some(0), "{log}");
    let daemon = Daemon::start(&stria);
    assert_eq!(rate(&stria), Some(5 << 20), "the rate set in the last daemon survives its restart");
    daemon.stop();
    // A rate given at start wins while that daemon runs, and is not stored.
    let daemon = Daemon::start_with(&stria, &["--rebuild-rate", "9M"]);
    assert_eq!(rate(&stria), Some(9 << 20));
    daemon.stop();
    assert_eq!(rate(&stria), Some(5 << 20));
    expect(&stria, &["drive", "rebuild-rate", "0"], 0);
    assert_eq!(rate(&stria), Some(0));
}

#[test]
fn write_amplification_counts_each_volume_s_own_writes() {
    let stria = Stria::new();
    expect(&stria, &["pool", "create", "--fast", "2", "--capacity", "6", "--drive-size", "256M"], 0);
    expect(&stria, &["volume", "create", "a", "--size", "64M", "--layout", "tiered:ec:4+2"], 0);
    expect(&stria, &["volume", "create", "b", "--size", "64M", "--layout", "tiered:ec:4+2"], 0);
    let daemon = Daemon::start(&stria);
    // A little to `a`, then much more to `b` on the same drives.
    qemu_io(&daemon, "a", &["write -P 0xa1 0 1M", "flush"]);
    qemu_io(&daemon, "b", &["write -P 0xb2 0 32M", "flush"]);
    let wa = |name: &str, tier: &str| -> Option<f64> {
        json(&expect(&stria, &["volume", "show", name, "--json"], 0))[format!("write_amplification_{tier}")]
            .as_f64()
    };
    // Its cache and map are mirrored: about 2 drive bytes per host byte, plus the map log.
    // Counting the drives' writes gave `a` more than 60 (b's 64 MiB of cache copies over its 1).
    for name in ["a", "b"] {
        let fast = wa(name, "fast").expect("host writes were made");
        assert!((1.9..6.0).contains(&fast), "{name}: fast-tier write amplification {fast}");
        if let Some(capacity) = wa(name, "capacity") {
            assert!(capacity < 6.0, "{name}: capacity-tier write amplification {capacity}");
        }
    }
    let shown = expect(&stria, &["volume", "show", "a"], 0).stdout;
    says(&shown, "TO DRIVES");
    let (code, log) = daemon.stop();
    assert_eq!(code, Some(0), "{log}");
}

#[test]
fn volume_list_shows_the_volumes_clients_see() {
    let stria = Stria::new();
    expect(&stria, &["pool", "create", "--fast", "2", "--capacity", "6", "--drive-size", "128M"], 0);
    expect(&stria, &["volume", "create", "vm", "--size", "32M", "--layout", "tiered:ec:4+2"], 0);
    expect(&stria, &["volume", "create", "th", "--size", "32M", "--layout", "log:ec:4+2"], 0);
    expect(&stria, &["volume", "create", "r", "--size", "8M", "--layout", "raid1"], 0);
    expect(&stria, &["snapshot", "create", "vm", "s"], 0);
    expect(&stria, &["volume", "clone", "vm@s", "c"], 0);
    let list = json(&expect(&stria, &["volume", "list", "--json"], 0));
    let entries = list.as_array().expect("an array");
    let names: Vec<&str> = entries.iter().map(|e| e["name"].as_str().expect("name")).collect();
    assert_eq!(names, ["c", "r", "th", "vm"], "{list}");
    let kind = |n: &str| {
        entries.iter().find(|e| e["name"] == n).expect(n)["kind"].as_str().expect("kind").to_string()
    };
    assert_eq!([kind("c"), kind("r"), kind("th"), kind("vm")], ["clone", "plain", "log", "tiered"]);
    let vm = entries.iter().find(|e| e["name"] == "vm").expect("vm");
    assert_eq!(vm["layout"], "tiered:ec:4+2");
    assert_eq!(vm["parts"], serde_json::json!(["vm.meta", "vm.cache", "vm.seg"]));
    assert_eq!(entries.iter().find(|e| e["name"] == "c").expect("c")["origin"], "vm@s");
    // The parts stay where an operator needs them.
    says(&expect(&stria, &["volume", "show", "vm"], 0).stdout, "vm.cache");
    expect(&stria, &["volume", "show", "vm.cache"], 0);
    // The table and the JSON list the same volumes.
    let table = expect(&stria, &["volume", "list"], 0).stdout;
    let rows: Vec<&str> = table.lines().skip(1).filter_map(|l| l.split_whitespace().next()).collect();
    assert_eq!(rows, names, "{table}");
}

#[test]
fn a_raid0_member_failed_with_force_is_refused_with_a_way_out_that_is_not_the_same_command() {
    let stria = Stria::new();
    expect(&stria, &["pool", "create", "--capacity", "3", "--drive-size", "64M"], 0);
    expect(&stria, &["volume", "create", "z", "--size", "8M", "--layout", "raid0:3"], 0);
    expect(&stria, &["volume", "create", "m", "--size", "8M", "--layout", "raid1"], 0);
    std::fs::write(stria.dir.path().join("z.raw"), vec![0x5a; 1 << 20]).expect("image");
    expect(&stria, &["volume", "import", "z", "z.raw"], 0);
    expect(&stria, &["drive", "fail", "1", "--force"], 0);
    expect(&stria, &["status"], 3);
    for command in [&["drive", "online", "1"][..], &["drive", "replace", "1"]] {
        let out = expect(&stria, command, 1);
        says(&out.stderr, "volume(s) z are raid0");
        says(&out.stderr, "stria does not take back a failed drive's old contents");
        says(&out.stderr, "`stria volume delete NAME`");
        says(&out.stderr, "--force");
        let circular = format!("`stria {}", command[..2].join(" "));
        assert!(!out.stderr.contains(&circular), "the refusal suggests the command refused:\n{}", out.stderr);
    }
    // The way out it names: give z up, then the drive comes back for m.
    expect(&stria, &["volume", "delete", "z"], 0);
    let out = expect(&stria, &["drive", "online", "1"], 0);
    says(&out.stdout, "is back in service");
    expect(&stria, &["status"], 0);
}

#[test]
fn an_unreadable_block_is_named_exactly_and_export_can_go_past_it() {
    let stria = Stria::new();
    expect(&stria, &["pool", "create", "--capacity", "2", "--drive-size", "64M"], 0);
    expect(&stria, &["volume", "create", "z", "--size", "4M", "--layout", "raid0:2"], 0);
    // Every block different, one marked, in the middle of a 64 KiB chunk.
    let mut image: Vec<u8> = (0..4u32 << 20).map(|i| (i % 251) as u8 + 1).collect();
    let bad_at: usize = 5 * (64 << 10) + 3 * 4096;
    image[bad_at..bad_at + 16].copy_from_slice(b"stria-bad-block!");
    std::fs::write(stria.dir.path().join("z.raw"), &image).expect("image");
    expect(&stria, &["volume", "import", "z", "z.raw"], 0);
    let drives = stria.dir.path().join(POOL).join("drives");
    let mut hit = 0;
    for name in files(&drives) {
        let path = drives.join(&name);
        let mut bytes = std::fs::read(&path).expect("read drive");
        if let Some(at) = bytes.windows(16).position(|w| w == b"stria-bad-block!") {
            bytes[at..at + 16].copy_from_slice(b"garbage-garbage!");
            std::fs::write(&path, &bytes).expect("corrupt");
            hit += 1;
        }
    }
    assert_eq!(hit, 1, "the marked block is on one drive");

    let out = expect(&stria, &["volume", "export", "z", "out.raw"], 1);
    says(&out.stderr, &format!("data at offset {bad_at} (+4096 bytes) of volume z is unrecoverable"));
    says(&out.stderr, "--skip-unreadable");
    assert!(!stria.dir.path().join("out.raw").exists(), "a stopped export wrote its file");
    assert!(!stria.dir.path().join("out.stria-partial").exists(), "a stopped export left its partial file");

    let out = expect(&stria, &["volume", "export", "z", "out.raw", "--skip-unreadable"], 1);
    says(&out.stderr, &format!("unreadable: bytes {bad_at}..{} (1 blocks of 4 KiB)", bad_at + 4096));
    says(&out.stderr, "4096 bytes of z could not be read");
    let got = std::fs::read(stria.dir.path().join("out.raw")).expect("the image");
    let mut want = image;
    want[bad_at..bad_at + 4096].fill(0);
    assert!(got == want, "the image differs from the volume beyond the unreadable block");
}

#[test]
fn a_volume_name_must_start_with_a_letter_or_a_digit() {
    let stria = Stria::new();
    expect(&stria, &["pool", "create", "--capacity", "2", "--drive-size", "64M"], 0);
    for name in ["-rf", ".x", "_x"] {
        let out = expect(&stria, &["volume", "create", "--size", "4M", "--layout", "raid1", "--", name], 1);
        says(&out.stderr, &format!("volume name `{name}` is invalid"));
        says(&out.stderr, "starting with a letter or a digit");
    }
    let list = expect(&stria, &["volume", "list"], 0);
    says(&list.stdout, "no volumes");
}

#[test]
fn a_size_too_large_is_called_too_large() {
    let stria = Stria::new();
    expect(&stria, &["pool", "create", "--capacity", "2", "--drive-size", "64M"], 0);
    for size in ["18446744073709551615", "18446744073709547520", "16383P", "2048P"] {
        let out = expect(&stria, &["volume", "create", "v", "--size", size, "--layout", "raid1"], 2);
        says(&out.stderr, "is too large: a volume is at most 1024 PiB (2^60 bytes)");
    }
    let out =
        expect(&stria, &["volume", "create", "v", "--size", "18446744073709551616", "--layout", "raid1"], 2);
    says(&out.stderr, "out of range");
    expect(&stria, &["volume", "create", "v", "--size", "4M", "--layout", "raid1"], 0);
    let out = expect(&stria, &["volume", "resize", "v", "--size", "16383P"], 2);
    says(&out.stderr, "is too large");
}

#[test]
fn up_help_names_the_volume_it_makes() {
    let stria = Stria::new();
    let out = expect(&stria, &["up", "--help"], 0);
    says(&out.stdout, "a tiered:ec:4+2 volume vol0");
}

#[test]
fn ctrl_c_stops_an_offline_rebuild_and_closes_the_pool_cleanly() {
    let stria = Stria::new();
    expect(&stria, &["pool", "create", "--capacity", "3", "--drive-size", "128M"], 0);
    expect(&stria, &["volume", "create", "m", "--size", "64M", "--layout", "raid1"], 0);
    std::fs::write(stria.dir.path().join("m.raw"), vec![0x6d; 64 << 20]).expect("image");
    expect(&stria, &["volume", "import", "m", "m.raw"], 0);
    let members = json(&expect(&stria, &["volume", "show", "m", "--json"], 0));
    let slot = members["segments"][0]["members"][0]["drive"].as_u64().expect("a member's drive").to_string();
    expect(&stria, &["drive", "fail", &slot], 0);
    // 64 MiB at 2 MiB/s: half a minute of rebuild, stopped after a second.
    expect(&stria, &["drive", "rebuild-rate", "2M"], 0);
    let mut child = Command::new(binary())
        .args(["--pool", POOL, "drive", "replace", &slot])
        .current_dir(stria.dir.path())
        .env("STRIA_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start drive replace");
    std::thread::sleep(Duration::from_millis(1500));
    let sent = Command::new("kill").args(["-s", "INT", &child.id().to_string()]).status().expect("kill");
    assert!(sent.success());
    let status = wait_bounded(&mut child, Duration::from_secs(20), "`drive replace` after SIGINT");
    let out = child.wait_with_output().expect("output");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(status.code(), Some(130), "{stderr}");
    says(&stderr, "interrupted by SIGINT: the pool was closed cleanly");
    // Closed cleanly: nothing to recover, and the rebuild is still to do.
    let status = json(&expect(&stria, &["status", "--json"], 2));
    assert_eq!(status["recovery"]["journal_txns_replayed"], 0, "{status}");
    assert_eq!(status["recovery"]["rows_resynced"], 0, "{status}");
    let m =
        &status["volumes"].as_array().expect("volumes").iter().find(|v| v["name"] == "m").expect("m").clone();
    assert_eq!(m["state"], "rebuilding", "{status}");
    // It goes on (and ends) when asked to: here, a daemon at full speed.
    expect(&stria, &["drive", "rebuild-rate", "0"], 0);
    let daemon = Daemon::start(&stria);
    let start = Instant::now();
    while expect_code(&stria) != 0 {
        assert!(start.elapsed() < Duration::from_secs(60), "the rebuild did not finish in the daemon");
        std::thread::sleep(Duration::from_millis(200));
    }
    daemon.stop();
}

fn expect_code(stria: &Stria) -> i32 {
    stria.run(&["status"]).code.expect("an exit code")
}

/// `volume rollback` to an older snapshot is refused, naming the way; with `--destroy-newer`
/// the newer snapshots are deleted first and each is said.
#[test]
fn rollback_to_an_older_snapshot_needs_destroy_newer_and_says_what_it_deleted() {
    let stria = Stria::new();
    expect(&stria, &["pool", "create", "--fast", "2", "--capacity", "6", "--drive-size", "128M"], 0);
    expect(&stria, &["volume", "create", "vm", "--size", "32M", "--layout", "tiered:ec:4+2"], 0);
    for s in ["a", "b", "c"] {
        expect(&stria, &["snapshot", "create", "vm", s], 0);
    }
    let refused = expect(&stria, &["volume", "rollback", "vm", "a"], 1);
    says(&refused.stderr, "newest snapshot");
    let done = expect(&stria, &["volume", "rollback", "vm", "a", "--destroy-newer"], 0);
    says(&done.stdout, "deleted snapshot vm@c (newer than a)");
    says(&done.stdout, "deleted snapshot vm@b (newer than a)");
    says(&done.stdout, "rolled vm back to snapshot a");
    let list = json(&expect(&stria, &["snapshot", "list", "vm", "--json"], 0));
    let names: Vec<&str> =
        list.as_array().expect("an array").iter().map(|s| s["name"].as_str().expect("name")).collect();
    assert_eq!(names, ["a"], "{list}");
}
