//! No clobbering (issue: "files are overwritten without asking"): `volume export` never writes
//! a drive of its own pool and replaces an existing file only with `--overwrite`; it writes a
//! device in place instead of renaming a regular file over its node; `volume import` does not
//! read a drive of the pool nor write over data a volume holds unasked; the REST API reads and writes files only inside the directory its
//! setting names; shrinking a volume needs `--allow-shrink`.

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::{Daemon, POOL, Stria, binary, expect, wait_bounded};

fn says(text: &str, part: &str) {
    assert!(text.contains(part), "expected `{part}` in:\n{text}");
}

/// A pool of 2 fast and 4 capacity drives of 64 MiB, with a raid1 volume `r` of 8 MiB on the
/// fast drives holding [`image`], and a raid0 volume `big` of 64 MiB on the capacity drives.
fn pool_with_data() -> Stria {
    let stria = Stria::new();
    expect(&stria, &["pool", "create", "--fast", "2", "--capacity", "4", "--drive-size", "64M"], 0);
    expect(&stria, &["volume", "create", "r", "--size", "8M", "--layout", "raid1", "--class", "fast"], 0);
    expect(&stria, &["volume", "create", "big", "--size", "64M", "--layout", "raid0"], 0);
    std::fs::write(stria.dir.path().join("image.raw"), image()).expect("write image");
    expect(&stria, &["volume", "import", "r", "image.raw"], 0);
    stria
}

/// 1 MiB of a pattern: what `r` holds at its start (the rest reads as zeros).
fn image() -> Vec<u8> {
    (0..1u32 << 20).map(|i| (i % 251) as u8 | 1).collect()
}

/// What an export of `r` holds: the image, then zeros to 8 MiB.
fn exported_r() -> Vec<u8> {
    let mut bytes = image();
    bytes.resize(8 << 20, 0);
    bytes
}

fn drive_file(stria: &Stria, name: &str) -> PathBuf {
    stria.dir.path().join(POOL).join("drives").join(name)
}

#[test]
fn import_writes_over_data_only_when_told() {
    let stria = pool_with_data();
    let other: Vec<u8> = (0..1u32 << 20).map(|i| (i % 241) as u8 | 2).collect();
    std::fs::write(stria.dir.path().join("other.raw"), &other).expect("write other.raw");
    // `r` holds the image from byte 0: a mistyped name must not destroy it.
    let out = expect(&stria, &["volume", "import", "r", "other.raw"], 1);
    says(&out.stderr, "volume r holds data where the image would go (its first written block is at byte 0)");
    says(&out.stderr, "--overwrite");
    expect(&stria, &["volume", "export", "r", "r.raw"], 0);
    assert!(std::fs::read(stria.dir.path().join("r.raw")).expect("r.raw") == exported_r(), "r changed");
    // Told, it writes over it; a volume that holds nothing (`big`) needs no flag.
    expect(&stria, &["volume", "import", "r", "other.raw", "--overwrite"], 0);
    expect(&stria, &["volume", "export", "r", "r2.raw"], 0);
    let got = std::fs::read(stria.dir.path().join("r2.raw")).expect("r2.raw");
    assert!(got[..1 << 20] == other[..] && got[1 << 20..].iter().all(|&b| b == 0), "r is not the new image");
    expect(&stria, &["volume", "import", "big", "other.raw"], 0);
    // Only the range the image covers counts: data past its end is no reason to refuse.
    let mut tail = vec![0u8; 8 << 20];
    tail[(4 << 20)..(4 << 20) + 4096].fill(7);
    std::fs::write(stria.dir.path().join("tail.raw"), &tail).expect("write tail.raw");
    expect(&stria, &["volume", "create", "t", "--size", "8M", "--layout", "raid0"], 0);
    expect(&stria, &["volume", "import", "t", "tail.raw"], 0);
    std::fs::write(stria.dir.path().join("head.raw"), vec![9u8; 1 << 20]).expect("write head.raw");
    expect(&stria, &["volume", "import", "t", "head.raw"], 0);
    let out = expect(&stria, &["volume", "import", "t", "tail.raw"], 1);
    says(&out.stderr, "its first written block is at byte 0");
}

#[test]
fn export_never_writes_a_drive_of_its_pool_nor_an_existing_file_unasked() {
    let stria = pool_with_data();
    let member = drive_file(&stria, "capacity-3.img");
    // Each command opens and closes the pool, which commits: the drive's bytes change, but it
    // stays the same file, of the same size, and a drive of the pool.
    let file_of = |p: &Path| {
        let m = std::fs::metadata(p).expect("stat the drive");
        (std::os::unix::fs::MetadataExt::ino(&m), m.len())
    };
    let before = file_of(&member);
    for extra in [&[][..], &["--overwrite"]] {
        let mut args = vec!["volume", "export", "r", "pool/drives/capacity-3.img"];
        args.extend_from_slice(extra);
        let out = expect(&stria, &args, 1);
        says(
            &out.stderr,
            "capacity-3.img is drive 3 of this pool; exporting over it would destroy that drive",
        );
    }
    assert_eq!(file_of(&member), before, "the drive file was replaced");
    // Through the daemon, which holds the drives: the same.
    let daemon = Daemon::start(&stria);
    let out = expect(&stria, &["volume", "export", "r", "pool/drives/fast-0.img", "--overwrite"], 1);
    says(&out.stderr, "fast-0.img is drive 0 of this pool");
    let (code, log) = daemon.stop();
    assert_eq!(code, Some(0), "{log}");
    // Nor is a drive read as an image.
    let out = expect(&stria, &["volume", "import", "big", "pool/drives/capacity-2.img"], 1);
    says(&out.stderr, "capacity-2.img is drive 2 of this pool, not a volume image");
    let status = expect(&stria, &["status", "--json"], 0);
    let v: serde_json::Value = serde_json::from_str(&status.stdout).expect("status JSON");
    assert!(v["drives"].as_array().expect("drives").iter().all(|d| d["state"] == "active"), "{v}");
    assert_eq!(v["drives"].as_array().map(Vec::len), Some(6), "{v}");

    // An existing file is replaced only when the command says so.
    let keep = stria.dir.path().join("keep.raw");
    std::fs::write(&keep, b"precious").expect("write");
    let out = expect(&stria, &["volume", "export", "r", "keep.raw"], 1);
    says(&out.stderr, "keep.raw exists; exporting would replace it");
    says(&out.stderr, "--overwrite");
    assert_eq!(std::fs::read(&keep).expect("read"), b"precious");
    assert!(!stria.dir.path().join("keep.raw.stria-partial").exists());
    expect(&stria, &["volume", "export", "r", "keep.raw", "--overwrite"], 0);
    assert!(std::fs::read(&keep).expect("read") == exported_r(), "the export replaced the file");
    // A new file, as before; no partial file is left.
    expect(&stria, &["volume", "export", "r", "new.raw"], 0);
    assert!(std::fs::read(stria.dir.path().join("new.raw")).expect("read") == exported_r());
    assert!(!stria.dir.path().join("new.raw.stria-partial").exists());
}

/// `mknod PATH TYPE MAJOR MINOR`; false when this machine does not allow it (not root).
fn mknod(path: &Path, kind: &str, major: u64, minor: u64) -> bool {
    Command::new("mknod")
        .arg(path)
        .arg(kind)
        .arg(major.to_string())
        .arg(minor.to_string())
        .status()
        .is_ok_and(|s| s.success())
}

/// A loop device over a 16 MiB file; detached when dropped, also when the test fails.
struct Loop {
    device: String,
}

impl Loop {
    fn new(dir: &Path) -> Option<Loop> {
        let image = dir.join("loop.img");
        std::fs::File::create(&image).expect("create").set_len(16 << 20).expect("size");
        let out = Command::new("losetup").args(["-f", "--show"]).arg(&image).output().ok()?;
        let device = String::from_utf8_lossy(&out.stdout).trim().to_string();
        (out.status.success() && !device.is_empty()).then_some(Loop { device })
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.device).status();
    }
}

#[test]
fn export_writes_a_device_in_place_and_never_renames_over_its_node() {
    let stria = pool_with_data();
    // A node of /dev/null made for the test: the export must write it, not replace it.
    let null = stria.dir.path().join("null");
    if !mknod(&null, "c", 1, 3) {
        eprintln!("skipped: cannot make device nodes here (needs root)");
        return;
    }
    expect(&stria, &["volume", "export", "r", "null"], 0);
    let kind = std::fs::symlink_metadata(&null).expect("stat").file_type();
    assert!(kind.is_char_device(), "the export replaced the device node by {kind:?}");
    assert!(!stria.dir.path().join("null.stria-partial").exists());

    // A block device, through a node of its own made for the test.
    let Some(lo) = Loop::new(stria.dir.path()) else {
        eprintln!("skipped the block device part: no loop device");
        return;
    };
    let rdev = std::os::unix::fs::MetadataExt::rdev(&std::fs::metadata(&lo.device).expect("stat"));
    let blk = stria.dir.path().join("blk");
    let (major, minor) =
        (((rdev >> 32) & 0xffff_f000) | ((rdev >> 8) & 0xfff), ((rdev >> 12) & 0xffff_ff00) | (rdev & 0xff));
    assert!(mknod(&blk, "b", major, minor), "mknod");
    std::fs::write(&blk, vec![0xffu8; 16 << 20]).expect("fill the device");
    let out = expect(&stria, &["volume", "export", "r", "blk"], 1);
    says(&out.stderr, "blk is a block device; exporting writes the volume over what it holds");
    says(&out.stderr, "--overwrite");
    assert!(std::fs::read(&blk).expect("read").iter().all(|&b| b == 0xff), "written without --overwrite");
    expect(&stria, &["volume", "export", "r", "blk", "--overwrite"], 0);
    let kind = std::fs::symlink_metadata(&blk).expect("stat").file_type();
    assert!(kind.is_block_device(), "the export replaced the device node by {kind:?}");
    let bytes = std::fs::read(&blk).expect("read the device");
    assert!(bytes[..8 << 20] == exported_r()[..], "the device holds the volume, its holes as zeros");
    assert!(bytes[8 << 20..].iter().all(|&b| b == 0xff), "nothing past the volume was written");
    // Too small a device for a volume is refused before anything is written.
    let out = expect(&stria, &["volume", "export", "big", "blk", "--overwrite"], 1);
    says(&out.stderr, "the volume does not fit");
    drop(lo);
}

/// The size of volume `name` as `volume show --json` gives it.
fn volume_bytes(stria: &Stria, name: &str) -> u64 {
    let out = expect(stria, &["volume", "show", name, "--json"], 0);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).expect("volume JSON");
    v["size_bytes"].as_u64().unwrap_or_else(|| panic!("no size_bytes in {v}"))
}

#[test]
fn shrinking_a_volume_needs_allow_shrink_and_growing_does_not() {
    let stria = pool_with_data();
    let out = expect(&stria, &["volume", "resize", "r", "--size", "512K"], 1);
    says(
        &out.stderr,
        "shrinking volume r from 8 MiB to 512 KiB discards its last 7.5 MiB (bytes 524288 to 8388608)",
    );
    says(&out.stderr, "--allow-shrink");
    assert_eq!(volume_bytes(&stria, "r"), 8 << 20, "refused, and nothing changed");
    expect(&stria, &["volume", "export", "r", "before.raw"], 0);
    assert!(std::fs::read(stria.dir.path().join("before.raw")).expect("read") == exported_r());
    // Growing needs no flag; shrinking back to where the data ends, with the flag, keeps it.
    expect(&stria, &["volume", "resize", "r", "--size", "16M"], 0);
    assert_eq!(volume_bytes(&stria, "r"), 16 << 20);
    expect(&stria, &["volume", "resize", "r", "--size", "1M", "--allow-shrink"], 0);
    assert_eq!(volume_bytes(&stria, "r"), 1 << 20);
    expect(&stria, &["volume", "export", "r", "after.raw"], 0);
    assert!(std::fs::read(stria.dir.path().join("after.raw")).expect("read") == image());
}

/// Serves `stria`'s pool with the HTTP listener on a free port and `extra` arguments; returns
/// the daemon, the port and the token.
fn serve_http(stria: &Stria, extra: &[&str]) -> (Daemon, u16, String) {
    use crate::http_api::free_port;
    let port = free_port();
    let addr = format!("tcp:127.0.0.1:{port}");
    let mut args = vec!["--http", addr.as_str()];
    args.extend_from_slice(extra);
    let daemon = Daemon::start_with(stria, &args);
    let start = std::time::Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(start.elapsed() < std::time::Duration::from_secs(30), "the http listener did not come up");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let token = std::fs::read_to_string(stria.dir.path().join(POOL).join("http.token")).expect("token");
    (daemon, port, token.trim().to_string())
}

/// Waits for the job an API answer started; returns it when it has ended.
fn finished_job(port: u16, answer: &str) -> serde_json::Value {
    use crate::http_api::{http, json};
    let href = json(answer)["href"].as_str().unwrap_or_else(|| panic!("no job in {answer}")).to_string();
    let start = std::time::Instant::now();
    loop {
        let (_, body) = http(port, "GET", &href, None, "");
        let job = json(&body);
        if job["state"] != "running" {
            return job;
        }
        assert!(start.elapsed() < std::time::Duration::from_secs(60), "the job did not end: {job}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[test]
fn the_api_reads_and_writes_files_only_inside_its_transfer_directory() {
    use crate::http_api::{http, json};
    let stria = pool_with_data();
    let dir = stria.dir.path().canonicalize().expect("canonical");
    let (daemon, port, token) = serve_http(&stria, &[]);
    let t = Some(token.as_str());
    // No transfer directory set: import and export are refused, naming the setting.
    let escaped = dir.join("escaped.raw").display().to_string();
    for (route, body) in [
        ("/api/v1/volumes/r/import", r#"{"path": "/etc/hostname"}"#.to_string()),
        ("/api/v1/volumes/r/export", format!(r#"{{"path": "{escaped}"}}"#)),
    ] {
        let (status, answer) = http(port, "POST", route, t, &body);
        assert_eq!(status, 403, "{route} {body}: {answer}");
        says(&answer, "set `api_transfer_dir`");
    }
    assert!(!dir.join("escaped.raw").exists());
    let (_, jobs) = http(port, "GET", "/api/v1/jobs", None, "");
    assert_eq!(json(&jobs), serde_json::json!([]), "a refused transfer started a job");
    // Shrinking needs allow_shrink; growing does not.
    let (status, answer) = http(port, "POST", "/api/v1/volumes/r/resize", t, r#"{"size_bytes": 4194304}"#);
    assert_eq!(status, 409, "{answer}");
    says(&answer, "discards its last 4 MiB");
    says(&answer, "allow_shrink");
    let grow = r#"{"size_bytes": 16777216}"#;
    assert_eq!(http(port, "POST", "/api/v1/volumes/r/resize", t, grow).0, 200);
    let shrink = r#"{"size_bytes": 4194304, "allow_shrink": true}"#;
    let (status, answer) = http(port, "POST", "/api/v1/volumes/r/resize", t, shrink);
    assert_eq!((status, json(&answer)["size_bytes"].as_u64()), (200, Some(4 << 20)), "{answer}");
    let (code, log) = daemon.stop();
    assert_eq!(code, Some(0), "{log}");

    // A transfer directory, set in the configuration file: paths inside it only.
    let xfer = dir.join("xfer");
    std::fs::create_dir(&xfer).expect("mkdir");
    std::fs::write(dir.join("stria.toml"), "api_transfer_dir = \"xfer\"\n").expect("config");
    std::os::unix::fs::symlink("/etc/hostname", xfer.join("link")).expect("symlink");
    let (daemon, port, token) = serve_http(&stria, &["--config", "stria.toml"]);
    let t = Some(token.as_str());
    let (status, answer) = http(port, "POST", "/api/v1/volumes/r/export", t, r#"{"path": "out.raw"}"#);
    assert_eq!(status, 202, "{answer}");
    let job = finished_job(port, &answer);
    assert_eq!(job["state"], "done", "{job}");
    assert_eq!(std::fs::metadata(xfer.join("out.raw")).expect("exported").len(), 4 << 20);
    let outside = format!(r#"{{"path": "{escaped}"}}"#);
    for (route, body, why) in [
        ("export", r#"{"path": "../escaped.raw"}"#, "`..` is not allowed"),
        ("export", outside.as_str(), "outside api_transfer_dir"),
        ("import", r#"{"path": "/etc/hostname"}"#, "outside api_transfer_dir"),
        ("import", r#"{"path": "link"}"#, "a symbolic link to /etc/hostname, outside"),
    ] {
        let (status, answer) = http(port, "POST", &format!("/api/v1/volumes/r/{route}"), t, body);
        assert_eq!(status, 403, "{route} {body}: {answer}");
        says(&answer, why);
    }
    assert!(!dir.join("escaped.raw").exists());
    // An existing file in the directory is replaced only when the request says so.
    let (status, answer) = http(port, "POST", "/api/v1/volumes/r/export", t, r#"{"path": "out.raw"}"#);
    assert_eq!(status, 202, "{answer}");
    let job = finished_job(port, &answer);
    assert_eq!(job["state"], "failed", "{job}");
    says(&job.to_string(), "exists; exporting would replace it");
    // An import writes over the data `r` holds only when the request says so.
    let (status, answer) = http(port, "POST", "/api/v1/volumes/r/import", t, r#"{"path": "out.raw"}"#);
    assert_eq!(status, 202, "{answer}");
    let job = finished_job(port, &answer);
    assert_eq!(job["state"], "failed", "{job}");
    says(&job.to_string(), "holds data where the image would go");
    let body = r#"{"path": "out.raw", "overwrite": true}"#;
    let (status, answer) = http(port, "POST", "/api/v1/volumes/r/import", t, body);
    assert_eq!(status, 202, "{answer}");
    assert_eq!(finished_job(port, &answer)["state"], "done");
    let (code, log) = daemon.stop();
    assert_eq!(code, Some(0), "{log}");
}

/// `serve --nbd unix:PATH` where PATH is not a socket (a mistyped path: a drive of the pool
/// itself, a file beside it) refuses to start and leaves it where it was: only a socket that no
/// server answers on is removed to make way.
#[test]
fn serve_does_not_remove_what_its_socket_path_names() {
    use std::time::Duration;
    let stria = pool_with_data();
    let notes = stria.dir.path().join("notes.txt");
    std::fs::write(&notes, b"keep me").expect("write notes.txt");
    for path in [drive_file(&stria, "capacity-2.img"), notes.clone()] {
        let mut child = Command::new(binary())
            .args(["--pool", POOL, "serve", "--nbd"])
            .arg(format!("unix:{}", path.display()))
            .current_dir(stria.dir.path())
            .env("STRIA_LOG", "warn")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("start stria serve");
        let what = format!("`stria serve` with its socket over {}", path.display());
        let status = wait_bounded(&mut child, Duration::from_secs(60), &what);
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().expect("piped"), &mut stderr).expect("read");
        assert!(!status.success(), "{stderr}");
        says(&stderr, "is a regular file, not a socket");
        assert!(path.is_file(), "{} is gone", path.display());
    }
    assert_eq!(std::fs::read(&notes).expect("notes.txt"), b"keep me");
    // The pool is whole: every drive active, `r` as it was.
    expect(&stria, &["status"], 0);
    expect(&stria, &["volume", "export", "r", "r.raw"], 0);
    assert!(std::fs::read(stria.dir.path().join("r.raw")).expect("r.raw") == exported_r(), "r changed");
}
