//! Exclusive drives: a drive is held by one process at a time, for as long as that process has
//! it open, so that two pools (two daemons, or a daemon and a `pool create`) can never write the
//! same drive. Every opener of a drive passes through [`super::FileDevice::open`], which takes the
//! hold before it opens the drive for I/O; nothing above it can forget to.
//!
//! How a drive is held:
//!
//! * a regular file: `flock(LOCK_EX)`. Not an OFD lock: `/proc/locks` shows the pid of a `flock`
//!   holder but -1 for an OFD lock, and the pid is what lets a refusal name who holds the drive.
//! * a block device: an `O_EXCL` open, which the kernel refuses (`EBUSY`) while the device, or a
//!   partition of it, is mounted, is part of a device-mapper or md device, is active swap, or is
//!   held `O_EXCL` by another process. The node is also `flock`ed, so the holder's pid shows in
//!   `/proc/locks` when both use the same node.
//!
//! The hold lives on a descriptor of its own, not on the one I/O goes through, and is shared
//! within the process: opening a drive a second time in the same process (reading a label while
//! the pool has the drive open, a drive replaced in place) shares the first hold instead of
//! failing against it (both `flock` and `O_EXCL` conflict between two descriptors of the same
//! process). One process serves one pool, so sharing within it is safe. The hold is released
//! when the last device using it is dropped, or when the process dies (even by `kill -9`).
//!
//! On a refusal, [`Holder`] says who holds the drive, as far as `/proc` tells: the pid and
//! command line of the process with the lock, where the device is mounted, what the kernel has
//! built on it.

use std::collections::HashMap;
use std::fmt;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Weak};
use std::time::Duration;

use parking_lot::Mutex;

use super::OpenError;

/// What makes two paths the same drive: the inode of a file, the device number of a block
/// device (two nodes, or a symlink and its target, name one device).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Key {
    File { dev: u64, ino: u64 },
    Block { rdev: u64 },
}

impl Key {
    fn of(meta: &std::fs::Metadata) -> Option<Key> {
        let file_type = meta.file_type();
        if file_type.is_block_device() {
            Some(Key::Block { rdev: meta.rdev() })
        } else if file_type.is_file() {
            Some(Key::File { dev: meta.dev(), ino: meta.ino() })
        } else {
            None
        }
    }
}

/// The drives this process holds. An entry is removed only by the drop of its hold, after the
/// hold's descriptor is closed (under this lock), so a new hold of the same drive never races
/// the release of the old one.
static HELD: LazyLock<Mutex<HashMap<Key, Weak<DriveLock>>>> = LazyLock::new(Default::default);

/// How long [`DriveLock::take`] waits at most for a hold of this process that is being released.
const RELEASE_WAIT: Duration = Duration::from_secs(5);

/// This process's exclusive hold on one drive (see the module's doc); released when the last
/// `Arc` of it is dropped.
#[derive(Debug)]
pub struct DriveLock {
    key: Key,
    /// The descriptor that holds the lock (`None` once released, in `drop`).
    file: Option<File>,
}

impl DriveLock {
    /// Holds the regular file or block device at `path` exclusively for this process, or shares
    /// the hold this process has on it already. Fails with [`OpenError::Busy`], naming the
    /// holder, when another process (or the kernel: a mount, device-mapper, md, swap) has it.
    pub fn take(path: &Path) -> Result<Arc<DriveLock>, OpenError> {
        let io_err = |op, source| OpenError::Io { path: path.to_path_buf(), op, source };
        let meta = std::fs::metadata(path).map_err(|e| io_err("stat", e))?;
        let key =
            Key::of(&meta).ok_or_else(|| OpenError::NotAFileOrBlockDevice { path: path.to_path_buf() })?;
        let started = std::time::Instant::now();
        loop {
            let mut held = HELD.lock();
            match held.get(&key) {
                Some(weak) => {
                    if let Some(lock) = weak.upgrade() {
                        return Ok(lock);
                    }
                    // Being released by another thread of this process: it closes the
                    // descriptor and removes the entry under the lock we hold; let it.
                    drop(held);
                    if started.elapsed() > RELEASE_WAIT {
                        return Err(io_err(
                            "lock",
                            std::io::Error::other("a hold of this process on the drive was never released"),
                        ));
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                None => {
                    let lock = Arc::new(DriveLock { key, file: Some(hold(path, key)?) });
                    held.insert(key, Arc::downgrade(&lock));
                    return Ok(lock);
                }
            }
        }
    }

    /// True when `meta` (of a descriptor opened after the hold was taken) is the drive held: the
    /// path was not swapped for another file in between.
    pub fn covers(&self, meta: &std::fs::Metadata) -> bool {
        Key::of(meta) == Some(self.key)
    }
}

impl Drop for DriveLock {
    fn drop(&mut self) {
        let mut held = HELD.lock();
        drop(self.file.take());
        if held.get(&self.key).is_some_and(|w| w.strong_count() == 0) {
            held.remove(&self.key);
        }
    }
}

/// Opens the descriptor that holds the drive and takes the lock on it.
fn hold(path: &Path, key: Key) -> Result<File, OpenError> {
    let io_err = |op, source| OpenError::Io { path: path.to_path_buf(), op, source };
    let block = matches!(key, Key::Block { .. });
    let mut options = OpenOptions::new();
    options.read(true).custom_flags(libc::O_CLOEXEC | if block { libc::O_EXCL } else { 0 });
    let file = match options.open(path) {
        Ok(f) => f,
        Err(e) if block && e.raw_os_error() == Some(libc::EBUSY) => return Err(busy(path)),
        Err(e) => return Err(io_err("open", e)),
    };
    let opened = file.metadata().map_err(|e| io_err("stat", e))?;
    if Key::of(&opened) != Some(key) {
        return Err(io_err("open", std::io::Error::other("the path changed while it was being opened")));
    }
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(busy(path)),
        Err(std::fs::TryLockError::Error(e)) => Err(io_err("flock", e)),
    }
}

fn busy(path: &Path) -> OpenError {
    OpenError::Busy { path: path.to_path_buf(), holder: Holder::of(path) }
}

/// Who holds a drive, as far as `/proc` and `/sys` tell.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Holder {
    /// The process holding the drive's lock (or, failing that, one that has the device open).
    pub pid: Option<u32>,
    /// Its command line (`/proc/PID/cmdline`), empty when unknown.
    pub args: Vec<String>,
    /// Where the device or one of its partitions is mounted.
    pub mounts: Vec<PathBuf>,
    /// What the kernel built on the device or its partitions: `dm-0`, `md127`, `swap`.
    pub kernel: Vec<String>,
}

impl Holder {
    /// Looks up who holds `path` (a regular file or a block device).
    pub fn of(path: &Path) -> Holder {
        let Ok(meta) = std::fs::metadata(path) else { return Holder::default() };
        let mut holder = Holder { pid: flock_holder(meta.dev(), meta.ino()), ..Holder::default() };
        if meta.file_type().is_block_device() {
            let devices = with_partitions(meta.rdev());
            holder.mounts = mount_points(&devices);
            holder.kernel = kernel_holders(&devices);
            if swap_devices().contains(&meta.rdev()) {
                holder.kernel.push("swap".into());
            }
            if holder.pid.is_none() && holder.mounts.is_empty() && holder.kernel.is_empty() {
                holder.pid = process_with_device_open(meta.rdev());
            }
        }
        holder.args = holder.pid.map(command_args).unwrap_or_default();
        holder
    }

    /// The holder's command line as shown in messages (at most 200 characters).
    pub fn command(&self) -> Option<String> {
        const SHOWN_CHARS_MAX: usize = 200;
        if self.args.is_empty() {
            return None;
        }
        let line = self.args.join(" ");
        if line.chars().count() <= SHOWN_CHARS_MAX {
            return Some(line);
        }
        Some(line.chars().take(SHOWN_CHARS_MAX).collect::<String>() + "...")
    }
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if !self.mounts.is_empty() {
            let at: Vec<String> = self.mounts.iter().map(|m| m.display().to_string()).collect();
            parts.push(format!("mounted at {}", at.join(", ")));
        }
        if !self.kernel.is_empty() {
            parts.push(format!("held by the kernel for {}", self.kernel.join(", ")));
        }
        match (self.pid, self.command()) {
            (Some(pid), Some(command)) => parts.push(format!("held by pid {pid} (`{command}`)")),
            (Some(pid), None) => parts.push(format!("held by pid {pid}")),
            _ => {}
        }
        if parts.is_empty() {
            return f.write_str("held exclusively by another process");
        }
        f.write_str(&parts.join("; "))
    }
}

/// The pid of the process holding a `flock` (or POSIX) lock on inode `ino` of device `dev`, from
/// `/proc/locks` (lines like `1: FLOCK  ADVISORY  WRITE 1234 08:02:131 0 EOF`).
fn flock_holder(dev: u64, ino: u64) -> Option<u32> {
    let text = std::fs::read_to_string("/proc/locks").ok()?;
    parse_lock_holder(&text, libc::major(dev), libc::minor(dev), ino)
}

fn parse_lock_holder(text: &str, major: u32, minor: u32, ino: u64) -> Option<u32> {
    text.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        // Waiters are listed as `N: -> FLOCK ...`: not holders.
        if fields.get(1) == Some(&"->") || fields.len() < 6 {
            return None;
        }
        let mut id = fields[5].split(':');
        let (maj, min, inode) = (id.next()?, id.next()?, id.next()?);
        let same = u32::from_str_radix(maj, 16).ok()? == major
            && u32::from_str_radix(min, 16).ok()? == minor
            && inode.parse::<u64>().ok()? == ino;
        // An OFD lock shows pid -1, which does not parse: no pid, the caller says so.
        if same { fields[4].parse::<u32>().ok() } else { None }
    })
}

/// `rdev` and the device numbers of its partitions (from `/sys/dev/block/MAJ:MIN/*/dev`).
fn with_partitions(rdev: u64) -> Vec<(u32, u32)> {
    let whole = (libc::major(rdev), libc::minor(rdev));
    let mut devices = vec![whole];
    let dir = PathBuf::from(format!("/sys/dev/block/{}:{}", whole.0, whole.1));
    for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        if !entry.path().join("partition").exists() {
            continue;
        }
        if let Some(dev) = std::fs::read_to_string(entry.path().join("dev")).ok().and_then(|t| parse_dev(&t))
        {
            devices.push(dev);
        }
    }
    devices
}

fn parse_dev(text: &str) -> Option<(u32, u32)> {
    let (major, minor) = text.trim().split_once(':')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// Where any of `devices` is mounted (`/proc/self/mountinfo`: field 3 is the device, 5 the
/// mount point, with spaces written `\040`).
fn mount_points(devices: &[(u32, u32)]) -> Vec<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    parse_mount_points(&text, devices)
}

fn parse_mount_points(text: &str, devices: &[(u32, u32)]) -> Vec<PathBuf> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let dev = parse_dev(fields.get(2)?)?;
            let at = fields.get(4)?;
            devices.contains(&dev).then(|| PathBuf::from(at.replace("\\040", " ")))
        })
        .collect()
}

/// Devices the kernel stacked on any of `devices` (`/sys/dev/block/MAJ:MIN/holders`).
fn kernel_holders(devices: &[(u32, u32)]) -> Vec<String> {
    let mut names = Vec::new();
    for (major, minor) in devices {
        let dir = format!("/sys/dev/block/{major}:{minor}/holders");
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            names.push(entry.file_name().to_string_lossy().into_owned());
        }
    }
    names.sort();
    names.dedup();
    names
}

/// Device numbers of the active swap devices (`/proc/swaps`).
fn swap_devices() -> Vec<u64> {
    let text = std::fs::read_to_string("/proc/swaps").unwrap_or_default();
    text.lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .filter_map(|p| std::fs::metadata(p.replace("\\040", " ")).ok())
        .filter(|m| m.file_type().is_block_device())
        .map(|m| m.rdev())
        .collect()
}

/// Another process that has block device `rdev` open (the holder of an `O_EXCL` open through
/// another node shows in no lock table): scans `/proc/*/fd`. Only on a refusal.
fn process_with_device_open(rdev: u64) -> Option<u32> {
    let me = std::process::id();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        if pid == me {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else { continue };
        let open = fds.flatten().any(|fd| {
            std::fs::metadata(fd.path()).is_ok_and(|m| m.file_type().is_block_device() && m.rdev() == rdev)
        });
        if open {
            return Some(pid);
        }
    }
    None
}

/// The arguments of `pid`'s command line.
fn command_args(pid: u32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|bytes| {
            bytes
                .split(|&b| b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::BufRead;
    use std::process::{Command, Stdio};

    #[test]
    fn proc_locks_lines_give_the_holder_pid() {
        let text = "1: FLOCK  ADVISORY  WRITE 4242 fd:01:1234 0 EOF\n\
                    1: -> FLOCK  ADVISORY  WRITE 99 fd:01:1234 0 EOF\n\
                    2: OFDLCK ADVISORY  WRITE -1 08:02:77 0 EOF\n\
                    3: POSIX  ADVISORY  WRITE 17 08:02:78 0 EOF\n";
        assert_eq!(parse_lock_holder(text, 0xfd, 1, 1234), Some(4242));
        assert_eq!(parse_lock_holder(text, 8, 2, 77), None, "an OFD lock has no pid");
        assert_eq!(parse_lock_holder(text, 8, 2, 78), Some(17));
        assert_eq!(parse_lock_holder(text, 8, 2, 79), None);
    }

    #[test]
    fn mountinfo_lines_give_mount_points() {
        let text = "36 35 98:0 / /mnt/with\\040space rw - ext3 /dev/root rw\n\
                    37 35 8:17 / /boot rw - ext4 /dev/sdb1 rw\n\
                    38 35 0:22 / /proc rw - proc proc rw\n";
        assert_eq!(parse_mount_points(text, &[(8, 16), (8, 17)]), vec![PathBuf::from("/boot")]);
        assert_eq!(parse_mount_points(text, &[(98, 0)]), vec![PathBuf::from("/mnt/with space")]);
        assert!(parse_mount_points(text, &[(8, 0)]).is_empty());
    }

    #[test]
    fn a_second_hold_in_the_same_process_is_shared_and_released_with_the_last() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("d.img");
        std::fs::File::create(&path).expect("create").set_len(1 << 20).expect("size");
        let link = dir.path().join("alias.img");
        std::fs::hard_link(&path, &link).expect("link");
        let first = DriveLock::take(&path).expect("first");
        let second = DriveLock::take(&link).expect("the same inode under another name is shared");
        assert!(Arc::ptr_eq(&first, &second));
        drop(first);
        drop(second);
        assert!(!HELD.lock().contains_key(&Key::of(&std::fs::metadata(&path).expect("stat")).expect("file")));
        let again = DriveLock::take(&path).expect("taken again once released");
        drop(again);
        assert!(matches!(DriveLock::take(dir.path()), Err(OpenError::NotAFileOrBlockDevice { .. })));
    }

    #[test]
    fn another_process_holding_the_drive_is_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("held.img");
        std::fs::File::create(&path).expect("create").set_len(1 << 20).expect("size");
        let script = "import fcntl, sys\nf = open(sys.argv[1])\nfcntl.flock(f, fcntl.LOCK_EX)\nprint('held', flush=True)\nsys.stdin.read()\n";
        let Ok(mut child) = Command::new("python3")
            .args(["-c", script])
            .arg(&path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
        else {
            eprintln!("skipped: no python3 to hold the lock");
            return;
        };
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.as_mut().expect("piped")).read_line(&mut line).expect("read");
        assert_eq!(line.trim(), "held");
        let refused = DriveLock::take(&path);
        let Err(OpenError::Busy { holder, .. }) = &refused else { panic!("not refused: {refused:?}") };
        assert_eq!(holder.pid, Some(child.id()), "{holder}");
        assert!(holder.command().is_some_and(|c| c.contains("python")), "{holder}");
        let text = refused.expect_err("busy").to_string();
        assert!(text.contains(&format!("held by pid {}", child.id())), "{text}");
        drop(child.stdin.take());
        child.wait().expect("the holder exits");
        DriveLock::take(&path).expect("free once the holder is gone");
    }
}
