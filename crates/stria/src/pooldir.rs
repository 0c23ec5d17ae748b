//! The pool directory (`--pool DIR`): where a pool's file-backed drives, its list of device
//! paths, its lock and its control socket live.
//!
//! ```text
//! DIR/pool.json       name and the paths to look for drives at (a hint: drives are
//!                     recognised by their superblocks, found in any order under any name)
//! DIR/drives/*.img    sparse-file drives made by `pool create --fast/--capacity`
//! DIR/.lock           held (flock) by whoever has the pool open (each drive is held too, by
//!                     the process that has it open: stria-dev's DriveLock)
//! DIR/stria.sock      the daemon's control socket while `stria serve` runs
//! DIR/nbd.sock        the daemon's default NBD Unix socket
//! ```

use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use serde::{Deserialize, Serialize};
use stria_dev::{FileDevice, FileOptions, Holder, OpenError};
use stria_engine::units::format_size;
use stria_engine::{DriveClass, EngineError, FoundDrive, NewDrive, Pool, read_label};

use crate::drive_check;

/// The drives of a pool directory.
pub(crate) type Dev = FileDevice;

/// The pool's configuration file.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct PoolConfig {
    pub(crate) name: String,
    /// Device paths outside `DIR/drives` (block devices or files given with `--drive`).
    #[serde(default)]
    pub(crate) devices: Vec<String>,
}

/// A pool directory.
#[derive(Debug, Clone)]
pub(crate) struct PoolDir {
    pub(crate) path: PathBuf,
}

/// The exclusive hold on a pool directory; released on drop.
#[derive(Debug)]
pub(crate) struct PoolLock {
    _file: fs::File,
}

/// Who opens a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Opener {
    /// `stria serve` or `stria up`, which take `--force`.
    Daemon { force: bool },
    /// Any other command, run without a daemon (none takes `--force`).
    Command,
}

/// A drive to create: `CLASS:PATH[:DOMAIN]`.
#[derive(Debug, Clone)]
pub(crate) struct DriveSpec {
    pub(crate) class: DriveClass,
    pub(crate) path: PathBuf,
    pub(crate) domain: String,
}

impl std::str::FromStr for DriveSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<DriveSpec, String> {
        let mut parts = s.splitn(3, ':');
        let (Some(class), Some(path)) = (parts.next(), parts.next()) else {
            return Err(format!("`{s}`: expected CLASS:PATH[:DOMAIN], e.g. capacity:/dev/nvme1n1:rack2"));
        };
        if path.is_empty() {
            return Err(format!("`{s}`: the path is empty"));
        }
        Ok(DriveSpec {
            class: class.parse()?,
            path: PathBuf::from(path),
            domain: parts.next().unwrap_or("").into(),
        })
    }
}

/// What makes two paths the same drive: the inode of a file, or the device number of a block
/// device (two device nodes, or a symlink and its target, name one device).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Identity {
    File { dev: u64, ino: u64 },
    Block { rdev: u64 },
}

/// The identity of the file or device at `path` (symlinks followed).
pub(crate) fn identity(path: &Path) -> std::io::Result<Identity> {
    let m = fs::metadata(path)?;
    Ok(if m.file_type().is_block_device() {
        Identity::Block { rdev: m.rdev() }
    } else {
        Identity::File { dev: m.dev(), ino: m.ino() }
    })
}

/// `path` made absolute without following symlinks in its last part: the canonical parent
/// directory and the file name. A path whose parent does not exist is an error.
pub(crate) fn absolute(path: &Path) -> Result<PathBuf> {
    if let Ok(p) = fs::canonicalize(path) {
        return Ok(p);
    }
    let name = path.file_name().ok_or_else(|| anyhow!("`{}` names no file", path.display()))?;
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let parent = fs::canonicalize(&parent)
        .with_context(|| format!("cannot use {}: no directory {}", path.display(), parent.display()))?;
    Ok(parent.join(name))
}

impl PoolDir {
    pub(crate) fn new(path: impl Into<PathBuf>) -> PoolDir {
        PoolDir { path: path.into() }
    }

    fn config_path(&self) -> PathBuf {
        self.path.join("pool.json")
    }

    pub(crate) fn drives_dir(&self) -> PathBuf {
        self.path.join("drives")
    }

    pub(crate) fn control_socket(&self) -> PathBuf {
        self.path.join("stria.sock")
    }

    pub(crate) fn default_nbd_socket(&self) -> PathBuf {
        self.path.join("nbd.sock")
    }

    /// True when a pool was created here.
    pub(crate) fn exists(&self) -> bool {
        self.config_path().exists()
    }

    pub(crate) fn config(&self) -> Result<PoolConfig> {
        let path = self.config_path();
        let text = fs::read_to_string(&path).with_context(|| {
            format!(
                "no pool at {} (missing {}); create one with \
                 `stria pool create --pool {} --fast 2 --capacity 6 --drive-size 4G`",
                self.path.display(),
                path.display(),
                self.path.display()
            )
        })?;
        serde_json::from_str(&text).with_context(|| format!("{} is not a valid pool config", path.display()))
    }

    fn write_config(&self, config: &PoolConfig) -> Result<()> {
        let tmp = self.path.join("pool.json.tmp");
        fs::write(&tmp, serde_json::to_vec_pretty(config)?)?;
        fs::rename(&tmp, self.config_path())?;
        Ok(())
    }

    /// Takes the lock of an existing pool, or says who holds it. Creates nothing but the lock
    /// file inside the pool directory: a mistyped `--pool` gets "no pool at ..." and leaves no
    /// trace.
    pub(crate) fn lock(&self) -> Result<PoolLock> {
        self.config()?;
        self.take_lock()
    }

    /// Creates the pool directory (for `pool create` and `up`) and takes its lock.
    pub(crate) fn lock_new(&self) -> Result<PoolLock> {
        fs::create_dir_all(&self.path).with_context(|| format!("cannot create {}", self.path.display()))?;
        self.take_lock()
    }

    fn take_lock(&self) -> Result<PoolLock> {
        let path = self.path.join(".lock");
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)
            .with_context(|| format!("cannot open {}", path.display()))?;
        if file.try_lock().is_err() {
            let holder = fs::read_to_string(&path).unwrap_or_default();
            // No hint to use the daemon: a command that gets here found none answering, and the
            // commands that take the lock themselves (pool create, serve, up) cannot use one.
            bail!(
                "the pool at {} is in use by another stria process{}; wait for it to finish or stop it",
                self.path.display(),
                if holder.trim().is_empty() { String::new() } else { format!(" (pid {})", holder.trim()) }
            );
        }
        let _ = fs::write(&path, std::process::id().to_string());
        Ok(PoolLock { _file: file })
    }

    /// Every path that may hold a drive of this pool, absolute, each file or device once (a
    /// device listed under two spellings, or also lying in `DIR/drives`, is opened once).
    pub(crate) fn candidate_paths(&self) -> Result<Vec<PathBuf>> {
        let config = self.config()?;
        let mut listed: Vec<PathBuf> = config.devices.iter().map(PathBuf::from).collect();
        if let Ok(entries) = fs::read_dir(self.drives_dir()) {
            let mut files: Vec<PathBuf> = entries
                .filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "img"))
                .collect();
            files.sort();
            listed.extend(files);
        }
        let mut seen: HashMap<Identity, PathBuf> = HashMap::new();
        let mut paths = Vec::new();
        for p in listed {
            let p = fs::canonicalize(&p).unwrap_or(p);
            if let Ok(id) = identity(&p) {
                match seen.entry(id) {
                    std::collections::hash_map::Entry::Occupied(first) => {
                        tracing::debug!(first = %first.get().display(), again = %p.display(), "one drive listed twice; opened once");
                        continue;
                    }
                    std::collections::hash_map::Entry::Vacant(v) => {
                        v.insert(p.clone());
                    }
                }
            }
            paths.push(p);
        }
        Ok(paths)
    }

    /// Refuses `path` as the replacement of drive `replacing` when it is another drive of this
    /// pool already: the same file or device as a path the pool opens a drive from, or a device
    /// whose superblock says it is a drive of this pool. The drive being replaced itself may be
    /// given (a rebuild in place onto its own device).
    pub(crate) async fn refuse_member(
        &self,
        path: &Path,
        replacing: u32,
        pool: &Pool<FileDevice>,
    ) -> Result<()> {
        let this_pool = pool.meta().pool_uuid;
        let label_of = async |p: &Path| match FileDevice::open(p, &FileOptions::default()) {
            Ok(dev) => read_label(&dev).await.filter(|l| l.pool_uuid == this_pool),
            Err(_) => None,
        };
        let Ok(id) = identity(path) else { return Ok(()) }; // A new file: no one's.
        let label = label_of(path).await;
        if let Some(l) = &label
            && l.slot != replacing
        {
            bail!(
                "{} is already drive {} of this pool; give a new device or file, or none to create a new file",
                path.display(),
                l.slot
            );
        }
        if label.is_none() {
            for p in self.candidate_paths()? {
                if identity(&p).is_ok_and(|other| other == id) {
                    bail!(
                        "{} is already a drive path of this pool (the same file as {}); give a new device \
                         or file, or none to create a new file",
                        path.display(),
                        p.display()
                    );
                }
            }
        }
        Ok(())
    }

    /// Sparse drive files that may still grow by more than their filesystem has free: one
    /// warning per filesystem, with the numbers. When such a filesystem fills, writes to the
    /// drives on it fail.
    pub(crate) fn overcommit_warnings(&self) -> Vec<String> {
        let Ok(paths) = self.candidate_paths() else { return Vec::new() };
        overcommit_warnings(&paths)
    }

    /// Opens the pool from the drives found (in any order). `opener` says who asks, so that a
    /// refusal names a command that can force the open.
    pub(crate) async fn open_pool(&self, opener: Opener) -> Result<Pool<FileDevice>> {
        let mut found = Vec::new();
        let mut busy = Vec::new();
        for path in self.candidate_paths()? {
            match FileDevice::open(&path, &FileOptions::default()) {
                Ok(dev) => found.push(FoundDrive { dev, path: path.display().to_string() }),
                Err(OpenError::Busy { path, holder }) => busy.push((path, holder)),
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "cannot open a drive; leaving it out")
                }
            }
        }
        self.refuse_busy(&found, busy).await?;
        if found.is_empty() {
            bail!("no drive of the pool at {} could be opened", self.path.display());
        }
        let force = matches!(opener, Opener::Daemon { force: true });
        match Pool::open_skipping(found, force).await {
            Ok(pool) => Ok(pool),
            Err(e @ EngineError::NoQuorum { .. }) => Err(anyhow!(self.no_quorum_message(&e, opener))),
            // Opening writes (a metadata commit, recovery): it could not, and failed nothing.
            Err(EngineError::HostFull(reason)) => Err(anyhow!(
                "cannot open the pool at {}: {reason}. Free space there and run the command again",
                self.path.display()
            )),
            Err(e) => {
                Err(anyhow::Error::new(e)
                    .context(format!("cannot assemble the pool at {}", self.path.display())))
            }
        }
    }

    /// Refuses to open the pool when a drive of it is held by another process: another daemon
    /// serves it (from this directory's copy, or a `drives/` that links to its own), or a
    /// command has it open. A busy path whose label names another pool (a device this pool
    /// once had, now another pool's) is left out with a warning, as before.
    async fn refuse_busy(
        &self,
        found: &[FoundDrive<FileDevice>],
        busy: Vec<(PathBuf, Holder)>,
    ) -> Result<()> {
        if busy.is_empty() {
            return Ok(()); // Read no label: the drives' I/O counters show only the pool's reads.
        }
        let mut pools = Vec::new();
        for f in found {
            if let Some(label) = read_label(&f.dev).await {
                pools.push(label.pool_uuid);
            }
        }
        for (path, holder) in busy {
            let label = drive_check::peek_label(&path).await;
            let ours = label.as_ref().is_some_and(|l| pools.contains(&l.pool_uuid));
            if ours || found.is_empty() {
                bail!(
                    "cannot open the pool at {}: its drive {}. A drive is served by one process at a time: \
                     stop that one first (or, if this directory is a copy of that pool's, use that pool)",
                    self.path.display(),
                    drive_check::in_use(&path, &holder)
                );
            }
            tracing::warn!(
                path = %path.display(),
                "leaving out a device held by another process: {}",
                drive_check::in_use(&path, &holder)
            );
        }
        Ok(())
    }

    /// The refusal to open without a quorum, with a way to force it that `opener` has: the
    /// engine's message names no flag, since only some commands take `--force`.
    pub(crate) fn no_quorum_message(&self, e: &EngineError, opener: Opener) -> String {
        let how = match opener {
            Opener::Daemon { .. } => "run the same command again with --force".to_string(),
            Opener::Command => format!(
                "start the daemon with `stria serve --pool {} --force`; this command then runs through it",
                self.path.display()
            ),
        };
        format!("cannot assemble the pool at {}: {e}. To open it anyway, {how}", self.path.display())
    }

    /// Creates a pool: sparse files in `DIR/drives` and/or the given devices.
    pub(crate) async fn create_pool(
        &self,
        name: &str,
        fast: usize,
        capacity: usize,
        drive_bytes: u64,
        specs: &[DriveSpec],
        overwrite: &[PathBuf],
    ) -> Result<Pool<FileDevice>> {
        if self.exists() {
            bail!("a pool already exists at {}; pick another --pool directory", self.path.display());
        }
        if fast + capacity + specs.len() == 0 {
            bail!("no drives: give --fast N and/or --capacity N (with --drive-size), or --drive CLASS:PATH");
        }
        // Every --drive is checked before anything is created: that it opens, is given once
        // (by any spelling), and carries no other pool's superblock unless --overwrite names it.
        let mut given: Vec<(PathBuf, FileDevice, &DriveSpec)> = Vec::new();
        let mut seen: HashMap<Identity, PathBuf> = HashMap::new();
        for spec in specs {
            let path = absolute(&spec.path)?;
            let dev = drive_check::open_drive(&path)
                .with_context(|| format!("cannot use {} as a drive", spec.path.display()))?;
            let id = identity(&path).with_context(|| format!("cannot stat {}", path.display()))?;
            if let Some(first) = seen.insert(id, path.clone()) {
                bail!(
                    "{} is given twice (as {} and as {}); a device can be one drive only",
                    path.display(),
                    first.display(),
                    spec.path.display()
                );
            }
            let named = overwrite.iter().any(|o| identity(o).ok() == Some(id));
            drive_check::refuse_foreign(&dev, &path, named, &format!("--overwrite {}", spec.path.display()))
                .await?;
            given.push((path, dev, spec));
        }
        fs::create_dir_all(self.drives_dir())?;
        let drives_dir = absolute(&self.drives_dir())?;
        let mut drives = Vec::new();
        let mut made = Vec::new();
        // Files are named after the slot (drive id) they get: `fast-0.img` is drive 0.
        let mut slot = 0;
        for (class, n) in [(DriveClass::Fast, fast), (DriveClass::Capacity, capacity)] {
            for _ in 0..n {
                let path = drives_dir.join(format!("{class}-{slot}.img"));
                slot += 1;
                let dev = match FileDevice::create(&path, drive_bytes) {
                    Ok(dev) => dev,
                    Err(e) => {
                        // Nothing of this create is left behind: a retry starts clean.
                        for p in &made {
                            let _ = fs::remove_file(p);
                        }
                        return Err(drive_file_error(&path, drive_bytes, e));
                    }
                };
                made.push(path.clone());
                drives.push(NewDrive {
                    dev,
                    path: path.display().to_string(),
                    class,
                    domain: String::new(),
                    fresh: true,
                });
            }
        }
        let devices: Vec<String> = given.iter().map(|(p, _, _)| p.display().to_string()).collect();
        for (path, dev, spec) in given {
            drives.push(NewDrive {
                dev,
                path: path.display().to_string(),
                class: spec.class,
                domain: spec.domain.clone(),
                fresh: false,
            });
        }
        let result = Pool::create(name, drives).await;
        match result {
            Ok(pool) => {
                self.write_config(&PoolConfig { name: name.into(), devices })?;
                Ok(pool)
            }
            Err(e) => {
                for path in made {
                    let _ = fs::remove_file(path);
                }
                Err(anyhow::Error::new(e).context("cannot create the pool"))
            }
        }
    }

    /// Records an extra device path (a replacement given by path outside `DIR/drives`).
    pub(crate) fn add_device(&self, path: &Path) -> Result<()> {
        let mut config = self.config()?;
        let p = path.display().to_string();
        let ours = absolute(&self.drives_dir()).is_ok_and(|d| path.starts_with(d));
        if !config.devices.contains(&p) && !ours {
            config.devices.push(p);
            self.write_config(&config)?;
        }
        Ok(())
    }
}

impl PoolDir {
    /// Forgets an extra device path (a drive that left the pool).
    pub(crate) fn remove_device(&self, path: &Path) -> Result<()> {
        let mut config = self.config()?;
        let p = path.display().to_string();
        if config.devices.contains(&p) {
            config.devices.retain(|d| d != &p);
            self.write_config(&config)?;
        }
        Ok(())
    }
}

/// Why `pool create` could not make drive file `path`, said once (the error's own text names the
/// path, the call and the errno; anyhow's chain would repeat them).
fn drive_file_error(path: &Path, drive_bytes: u64, e: stria_dev::OpenError) -> anyhow::Error {
    if let stria_dev::OpenError::Io { op: "create", source, .. } = &e
        && source.kind() == std::io::ErrorKind::AlreadyExists
    {
        return anyhow!(
            "{} exists already: `pool create` makes new drive files and never writes over one. If it is \
             left from an earlier attempt, remove it; to use it as a drive, give it with --drive CLASS:PATH",
            path.display()
        );
    }
    anyhow!("cannot create a drive file of {}: {e}", format_size(drive_bytes))
}

/// [`PoolDir::overcommit_warnings`] for these drive paths.
fn overcommit_warnings(paths: &[PathBuf]) -> Vec<String> {
    // Per filesystem: how much the sparse files on it may still grow, and a directory on it.
    let mut growth: HashMap<u64, (u64, usize, PathBuf)> = HashMap::new();
    for p in paths {
        let Ok(m) = fs::metadata(p) else { continue };
        if !m.file_type().is_file() {
            continue;
        }
        let allocated = m.blocks() * 512;
        let entry = growth.entry(m.dev()).or_insert((0, 0, p.parent().unwrap_or(p).to_path_buf()));
        entry.0 += m.len().saturating_sub(allocated);
        entry.1 += 1;
    }
    let mut out = Vec::new();
    for (grow, files, dir) in growth.into_values() {
        let Ok(st) = rustix::fs::statvfs(&dir) else { continue };
        let free = st.f_bavail.saturating_mul(st.f_frsize);
        if grow > free {
            out.push(format!(
                "{files} sparse drive file(s) in {} can still grow by {}, but their filesystem has {} free: \
                 when it fills, writes to those drives fail (free space, or use smaller or fewer drives)",
                dir.display(),
                format_size(grow),
                format_size(free)
            ));
        }
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overcommit_is_reported_with_the_numbers() {
        let dir = tempfile::tempdir().expect("tempdir");
        let small = dir.path().join("small.img");
        fs::File::create(&small).expect("create").set_len(1 << 20).expect("size");
        assert!(overcommit_warnings(std::slice::from_ref(&small)).is_empty(), "1 MiB fits");
        // Twice what the filesystem has free, and sparse: nothing is allocated.
        let free = rustix::fs::statvfs(dir.path()).map(|s| s.f_bavail * s.f_frsize).expect("statvfs");
        let huge_bytes = (free * 2 + (1 << 30)).next_multiple_of(4096);
        if huge_bytes > 8 << 40 {
            eprintln!("skipped: {free} bytes free is more than a file here can over-commit");
            return;
        }
        let huge = dir.path().join("huge.img");
        fs::File::create(&huge).expect("create").set_len(huge_bytes).expect("size");
        let w = overcommit_warnings(&[small, huge]);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].starts_with("2 sparse drive file(s)"), "{}", w[0]);
        let grow = format!("can still grow by {}", format_size(huge_bytes + (1 << 20)));
        assert!(w[0].contains(&grow), "{}", w[0]);
    }

    #[test]
    fn absolute_paths_do_not_depend_on_the_spelling() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = dir.path().join("d.img");
        fs::write(&f, b"x").expect("write");
        let dotted = dir.path().join(".").join("d.img");
        assert_eq!(absolute(&dotted).expect("resolves"), absolute(&f).expect("resolves"));
        assert_eq!(identity(&dotted).expect("stat"), identity(&f).expect("stat"));
        let missing = dir.path().join("new.img");
        assert_eq!(
            absolute(&missing).expect("parent exists"),
            fs::canonicalize(dir.path()).expect("c").join("new.img")
        );
        assert!(absolute(Path::new("/nonexistent-dir-x/y.img")).is_err());
    }
}
