//! No clobbering (issue: "files are overwritten without asking"): `volume export` never writes
//! a drive of its own pool and replaces an existing file only with `--overwrite`; it writes a
//! device in place instead of renaming a regular file over its node; `volume import` does not
//! read a drive of the pool; the REST API reads and writes files only inside the directory its
//! setting names; shrinking a volume needs `--allow-shrink`.

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::{Daemon, POOL, Stria, expect};

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
