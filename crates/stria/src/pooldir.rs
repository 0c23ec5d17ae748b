//! The pool directory (`--pool DIR`): where a pool's file-backed drives, its list of device
//! paths, its lock and its control socket live.
//!
//! ```text
//! DIR/pool.json       name and the paths to look for drives at (a hint: drives are
//!                     recognised by their superblocks, found in any order under any name)
//! DIR/drives/*.img    sparse-file drives made by `pool create --fast/--capacity`
//! DIR/.lock           held (flock) by whoever has the pool open
//! DIR/stria.sock      the daemon's control socket while `stria serve` runs
//! DIR/nbd.sock        the daemon's default NBD Unix socket
//! ```

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use serde::{Deserialize, Serialize};
use stria_dev::{FileDevice, FileOptions};
use stria_engine::{DriveClass, EngineError, FoundDrive, NewDrive, Pool};

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

    /// Takes the pool's lock, or says who holds it.
    pub(crate) fn lock(&self) -> Result<PoolLock> {
        fs::create_dir_all(&self.path).with_context(|| format!("cannot create {}", self.path.display()))?;
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

    /// Every path that may hold a drive of this pool.
    pub(crate) fn candidate_paths(&self) -> Result<Vec<PathBuf>> {
        let config = self.config()?;
        let mut paths: Vec<PathBuf> = config.devices.iter().map(PathBuf::from).collect();
        if let Ok(entries) = fs::read_dir(self.drives_dir()) {
            let mut files: Vec<PathBuf> = entries
                .filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "img"))
                .collect();
            files.sort();
            paths.extend(files);
        }
        Ok(paths)
    }

    /// Opens the pool from the drives found (in any order). `opener` says who asks, so that a
    /// refusal names a command that can force the open.
    pub(crate) async fn open_pool(&self, opener: Opener) -> Result<Pool<FileDevice>> {
        let mut found = Vec::new();
        for path in self.candidate_paths()? {
            match FileDevice::open(&path, &FileOptions::default()) {
                Ok(dev) => found.push(FoundDrive { dev, path: path.display().to_string() }),
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "cannot open a drive; leaving it out")
                }
            }
        }
        if found.is_empty() {
            bail!("no drive of the pool at {} could be opened", self.path.display());
        }
        let force = matches!(opener, Opener::Daemon { force: true });
        match Pool::open_skipping(found, force).await {
            Ok(pool) => Ok(pool),
            Err(e @ EngineError::NoQuorum { .. }) => Err(anyhow!(self.no_quorum_message(&e, opener))),
            Err(e) => {
                Err(anyhow::Error::new(e)
                    .context(format!("cannot assemble the pool at {}", self.path.display())))
            }
        }
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
    ) -> Result<Pool<FileDevice>> {
        if self.exists() {
            bail!("a pool already exists at {}; pick another --pool directory", self.path.display());
        }
        if fast + capacity + specs.len() == 0 {
            bail!("no drives: give --fast N and/or --capacity N (with --drive-size), or --drive CLASS:PATH");
        }
        fs::create_dir_all(self.drives_dir())?;
        let mut drives = Vec::new();
        let mut made = Vec::new();
        for (class, n) in [(DriveClass::Fast, fast), (DriveClass::Capacity, capacity)] {
            for i in 0..n {
                let path = self.drives_dir().join(format!("{class}-{i}.img"));
                let dev = FileDevice::create(&path, drive_bytes)
                    .with_context(|| format!("cannot create drive file {}", path.display()))?;
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
        for spec in specs {
            let dev = FileDevice::open(&spec.path, &FileOptions::default())
                .with_context(|| format!("cannot open {}", spec.path.display()))?;
            drives.push(NewDrive {
                dev,
                path: spec.path.display().to_string(),
                class: spec.class,
                domain: spec.domain.clone(),
                fresh: false,
            });
        }
        let result = Pool::create(name, drives).await;
        match result {
            Ok(pool) => {
                self.write_config(&PoolConfig {
                    name: name.into(),
                    devices: specs.iter().map(|s| s.path.display().to_string()).collect(),
                })?;
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
        if !config.devices.contains(&p) && !path.starts_with(self.drives_dir()) {
            config.devices.push(p);
            self.write_config(&config)?;
        }
        Ok(())
    }
}
