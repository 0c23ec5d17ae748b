//! Exclusive drives (issue: "two daemons can serve the same drives"): every drive is held by the
//! process that has it open, so a second daemon on the same drives (a copied pool directory, a
//! `drives/` that links to another pool's), a `pool create` or `drive add` of a served drive,
//! even with `--overwrite`, are refused with a message naming the holder; and a device that is
//! mounted, or carries a filesystem or swap, is not formatted without `--overwrite PATH`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{Daemon, Outcome, POOL, Stria, binary, expect};

fn says(text: &str, part: &str) {
    assert!(text.contains(part), "expected `{part}` in:\n{text}");
}

/// `stria ARGS` in the test's directory, killed after `limit` (a second daemon that starts
/// serving never exits by itself): `None` when it had to be killed.
fn run_for(stria: &Stria, args: &[&str], limit: Duration) -> Option<Outcome> {
    let mut child = Command::new(binary())
        .args(args)
        .current_dir(stria.dir.path())
        .env("STRIA_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn stria");
    let start = Instant::now();
    loop {
        if child.try_wait().expect("wait").is_some() {
            let out = child.wait_with_output().expect("output");
            return Some(Outcome {
                stdout: String::from_utf8_lossy(&out.stdout).into(),
                stderr: String::from_utf8_lossy(&out.stderr).into(),
                code: out.status.code(),
            });
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `stria --pool DIR ARGS` with another pool directory than the test's.
fn run_pool(stria: &Stria, dir: &Path, args: &[&str]) -> Outcome {
    let dir = dir.display().to_string();
    let mut all = vec!["--pool", dir.as_str()];
    all.extend_from_slice(args);
    run_for(stria, &all, Duration::from_secs(300)).expect("the command finished")
}

/// What a refusal names when `daemon` holds the drive.
fn holder_text(stria: &Stria, daemon: &Daemon) -> String {
    let pool = stria.dir.path().join(POOL).canonicalize().expect("pool dir");
    format!("is in use by stria serve (pid {}, pool {})", daemon.child.id(), pool.display())
}

fn drive_paths(stria: &Stria) -> Vec<String> {
    let dir = stria.dir.path().join(POOL).join("drives").canonicalize().expect("drives dir");
    let mut paths: Vec<String> = std::fs::read_dir(&dir)
        .expect("drives")
        .map(|e| e.expect("entry").path().display().to_string())
        .collect();
    paths.sort();
    paths
}

#[test]
fn a_second_daemon_on_the_same_drives_is_refused_naming_the_first() {
    let stria = Stria::new();
    expect(&stria, &["pool", "create", "--capacity", "3", "--drive-size", "64M"], 0);
    expect(&stria, &["volume", "create", "v", "--size", "8M", "--layout", "raid1"], 0);
    let daemon = Daemon::start(&stria);
    let held = holder_text(&stria, &daemon);

    // A copied configuration: another pool directory whose pool.json names the same drives.
    let copy = stria.dir.path().join("copy");
    std::fs::create_dir(&copy).expect("mkdir");
    let config = serde_json::json!({ "name": "stria", "devices": drive_paths(&stria) });
    std::fs::write(copy.join("pool.json"), config.to_string()).expect("pool.json");
    let serve = ["--pool", "copy", "serve", "--nbd", "unix:copy.sock"];
    let Some(out) = run_for(&stria, &serve, Duration::from_secs(60)) else {
        panic!("a second `stria serve` on the same drives started serving");
    };
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    says(&out.stderr, "cannot open the pool at copy: its drive");
    says(&out.stderr, &held);

    // A pool directory whose drives/ links to the first pool's: a command opening it is refused.
    let linked = stria.dir.path().join("linked");
    std::fs::create_dir(&linked).expect("mkdir");
    std::os::unix::fs::symlink(stria.dir.path().join(POOL).join("drives"), linked.join("drives"))
        .expect("symlink");
    std::fs::write(linked.join("pool.json"), r#"{"name": "stria", "devices": []}"#).expect("pool.json");
    for args in [&["volume", "list"][..], &["volume", "create", "w", "--size", "4M", "--layout", "raid1"]] {
        let out = run_pool(&stria, &linked, args);
        assert_eq!(out.code, Some(1), "{args:?}: {}", out.stdout);
        says(&out.stderr, &held);
    }

    // The first daemon serves on, with its volumes as they were.
    let list = expect(&stria, &["volume", "list"], 0);
    assert!(list.stdout.lines().any(|l| l.starts_with("v ")), "{}", list.stdout);
    assert!(!list.stdout.lines().any(|l| l.starts_with("w ")), "{}", list.stdout);
    expect(&stria, &["status"], 0);
    let (code, log) = daemon.stop();
    assert_eq!(code, Some(0), "{log}");
    // Once it has stopped, the drives are free again (one process at a time).
    expect(&stria, &["status"], 0);
}

#[test]
fn a_served_drive_is_not_formatted_even_with_overwrite() {
    let stria = Stria::new();
    expect(&stria, &["pool", "create", "--capacity", "3", "--drive-size", "64M"], 0);
    let other = stria.dir.path().join("other");
    let spare = run_pool(&stria, &other, &["pool", "create", "--capacity", "2", "--drive-size", "64M"]);
    assert_eq!(spare.code, Some(0), "{}", spare.stderr);
    let daemon = Daemon::start(&stria);
    let held = holder_text(&stria, &daemon);
    let member = drive_paths(&stria)[2].clone();

    let third = stria.dir.path().join("third");
    let drive = format!("capacity:{member}");
    let out = run_pool(&stria, &third, &["pool", "create", "--drive", &drive, "--overwrite", &member]);
    assert_eq!(out.code, Some(1), "{}", out.stdout);
    says(&out.stderr, &held);
    assert!(!third.exists(), "a refused create leaves no directory behind");
    let out = run_pool(&stria, &other, &["drive", "add", &member, "--class", "capacity", "--overwrite"]);
    assert_eq!(out.code, Some(1), "{}", out.stdout);
    says(&out.stderr, &held);

    let (code, log) = daemon.stop();
    assert_eq!(code, Some(0), "{log}");
    expect(&stria, &["status"], 0);
}

/// A sparse file of `mib` MiB at `path`, made into what `mkfs` (a command and its arguments)
/// makes of it; `false` when that program is missing.
fn formatted(path: &Path, mib: u64, mkfs: &[&str]) -> bool {
    std::fs::File::create(path).expect("create").set_len(mib << 20).expect("size");
    Command::new(mkfs[0])
        .args(&mkfs[1..])
        .arg(path)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn a_file_with_a_filesystem_or_swap_needs_overwrite() {
    let stria = Stria::new();
    let fs = stria.dir.path().join("fs.img");
    let swap = stria.dir.path().join("swap.img");
    if !formatted(&fs, 64, &["mkfs.ext4", "-q", "-F"]) || !formatted(&swap, 64, &["mkswap"]) {
        eprintln!("skipped: mkfs.ext4 or mkswap missing");
        return;
    }
    let out = expect(&stria, &["pool", "create", "--drive", "capacity:fs.img"], 1);
    says(&out.stderr, "fs.img carries an ext2/ext3/ext4 filesystem");
    says(&out.stderr, "--overwrite fs.img");
    assert!(!stria.dir.path().join(POOL).exists(), "a refused create leaves no directory behind");

    expect(&stria, &["pool", "create", "--capacity", "2", "--drive-size", "64M"], 0);
    let out = expect(&stria, &["drive", "add", "fs.img", "--class", "capacity"], 1);
    says(&out.stderr, "carries an ext2/ext3/ext4 filesystem");
    let out = expect(&stria, &["drive", "add", "swap.img", "--class", "capacity"], 1);
    says(&out.stderr, "carries a swap area");
    says(&out.stderr, "--overwrite");
    expect(&stria, &["drive", "list"], 0);
    // Said so, they are taken.
    expect(&stria, &["drive", "add", "fs.img", "--class", "capacity", "--overwrite", "--no-rebalance"], 0);
    expect(&stria, &["drive", "add", "swap.img", "--class", "capacity", "--overwrite", "--no-rebalance"], 0);
    let list = expect(&stria, &["drive", "list", "--json"], 0);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&list.stdout).expect("json").as_array().map(Vec::len),
        Some(4)
    );
}

/// A loop device over a file, with an ext4 filesystem mounted on it; unmounted and detached
/// when dropped, also when the test fails.
struct LoopFs {
    device: String,
    mount: PathBuf,
    mounted: bool,
}

impl LoopFs {
    /// `None` when this machine cannot (not root, no loop devices): the caller skips.
    fn new(dir: &Path) -> Option<LoopFs> {
        let image = dir.join("loop.img");
        if !formatted(&image, 64, &["mkfs.ext4", "-q", "-F"]) {
            return None;
        }
        let out = Command::new("losetup").args(["-f", "--show"]).arg(&image).output().ok()?;
        let device = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if !out.status.success() || device.is_empty() {
            return None;
        }
        let mount = dir.join("mnt");
        std::fs::create_dir_all(&mount).expect("mount point");
        let mut lo = LoopFs { device, mount, mounted: false };
        lo.mounted = Command::new("mount").arg(&lo.device).arg(&lo.mount).status().is_ok_and(|s| s.success());
        lo.mounted.then_some(lo)
    }

    fn unmount(&mut self) {
        let ok = Command::new("umount").arg(&self.mount).status().is_ok_and(|s| s.success());
        assert!(ok, "umount {}", self.mount.display());
        self.mounted = false;
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        if self.mounted {
            let _ = Command::new("umount").arg(&self.mount).status();
        }
        let _ = Command::new("losetup").arg("-d").arg(&self.device).status();
    }
}

#[test]
fn a_mounted_device_is_refused_and_a_served_one_names_its_daemon() {
    let stria = Stria::new();
    let Some(mut lo) = LoopFs::new(stria.dir.path()) else {
        eprintln!("skipped: cannot make and mount a loop device here (needs root)");
        return;
    };
    let dev = lo.device.clone();
    let drive = format!("capacity:{dev}");
    let mount = lo.mount.canonicalize().expect("mount point");
    let out = expect(&stria, &["pool", "create", "--drive", &drive, "--overwrite", &dev], 1);
    says(&out.stderr, &format!("{dev} is in use: mounted at {}", mount.display()));
    lo.unmount();
    let out = expect(&stria, &["pool", "create", "--drive", &drive], 1);
    says(&out.stderr, &format!("{dev} carries an ext2/ext3/ext4 filesystem"));
    expect(&stria, &["pool", "create", "--drive", &drive, "--overwrite", &dev], 0);
    expect(&stria, &["volume", "create", "v", "--size", "8M", "--layout", "raid0"], 0);

    let daemon = Daemon::start(&stria);
    let held = holder_text(&stria, &daemon);
    let other = stria.dir.path().join("other");
    let out = run_pool(&stria, &other, &["pool", "create", "--drive", &drive, "--overwrite", &dev]);
    assert_eq!(out.code, Some(1), "{}", out.stdout);
    says(&out.stderr, &held);
    // Through another node of the same device (no lock on it to read): O_EXCL still refuses,
    // and the holder is found among the processes that have the device open.
    let rdev = std::os::unix::fs::MetadataExt::rdev(&std::fs::metadata(&dev).expect("stat"));
    let alias = stria.dir.path().join("alias");
    let made = Command::new("mknod")
        .arg(&alias)
        .arg("b")
        .arg(libc_major(rdev).to_string())
        .arg(libc_minor(rdev).to_string())
        .status()
        .is_ok_and(|s| s.success());
    assert!(made, "mknod");
    let alias = alias.display().to_string();
    let out = run_pool(
        &stria,
        &other,
        &["pool", "create", "--drive", &format!("capacity:{alias}"), "--overwrite", &alias],
    );
    assert_eq!(out.code, Some(1), "{}", out.stdout);
    says(&out.stderr, &held);
    let (code, log) = daemon.stop();
    assert_eq!(code, Some(0), "{log}");
    expect(&stria, &["status"], 0);
    drop(lo);
}

/// `major(3)` of a Linux device number.
fn libc_major(rdev: u64) -> u64 {
    ((rdev >> 32) & 0xffff_f000) | ((rdev >> 8) & 0xfff)
}

/// `minor(3)` of a Linux device number.
fn libc_minor(rdev: u64) -> u64 {
    ((rdev >> 12) & 0xffff_ff00) | (rdev & 0xff)
}
