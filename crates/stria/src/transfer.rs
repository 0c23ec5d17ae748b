//! `volume import` and `volume export`: raw images into and out of a volume, clobbering nothing.
//!
//! What export writes to, by what is at the path:
//!
//! * nothing: `PATH.stria-partial` (a new file, never one that exists), renamed to PATH once it
//!   is complete and synced, without replacing what may have appeared at PATH meanwhile
//!   (`RENAME_NOREPLACE`). An export that fails removes its partial file.
//! * a regular file: refused unless `--overwrite`; then the same, renamed over it.
//! * a block device: refused unless `--overwrite` (it always holds something); then written in
//!   place, held exclusively while it is written (so refused while it is mounted or in use), the
//!   volume's holes written as zeros, and synced. Its node is never replaced.
//! * a character device or a FIFO (`/dev/null`, a pipe): written in place, as a stream.
//!
//! Whatever the flags, export refuses a drive of this pool (writing it would destroy a drive of
//! the pool it reads from) and a drive another process holds; a drive of another pool needs
//! `--overwrite`, as `pool create` does.
//!
//! Import writes only over blocks of the volume that hold nothing (never written, or trimmed or
//! zeroed since), unless `--overwrite`: a mistyped volume name must not destroy a filesystem.
//!
//! Import reads a regular file or a block device. It refuses a drive of this pool and a file or
//! device another process holds (a running pool's drive is no volume image, and reading it as
//! it changes would copy garbage); it holds the source while it reads. A file that carries
//! another pool's superblock nobody holds (a drive of a pool that is gone, or the image of a
//! volume a guest made a stria drive) is imported, with a warning: reading it harms nothing.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, anyhow, bail};
use serde_json::{Value, json};
use stria_catalog::Catalog;
use stria_dev::{BLOCK_BYTES, DriveLock, IoBytes, OpenError};
use stria_engine::units::format_size;
use stria_engine::{BlockVolume, Durability, ErrorKind, Zeroing};

use crate::drive_check;
use crate::ops::{Progress, ProgressFn};
use crate::pooldir::Dev;
use crate::refusal;

/// Bytes moved per request by import and export.
const COPY_STEP_BYTES: usize = 4 << 20;

/// Copies the image at `path` into volume `name`; unless `overwrite`, only over blocks that
/// hold nothing (never written, or trimmed or zeroed since).
pub(crate) async fn import(
    catalog: &Catalog<Dev>,
    name: &str,
    path: &Path,
    overwrite: bool,
    progress: ProgressFn<'_>,
) -> Result<Value> {
    let vol = catalog.lookup(name).ok_or_else(|| refusal::not_found(format!("no volume named `{name}`")))?;
    let (mut file, len, _hold) = open_source(catalog, path).await?;
    if len > vol.size_bytes() {
        return Err(refusal::invalid(image_too_large(catalog, name, path, len, vol.size_bytes())));
    }
    if !overwrite && let Some(at) = first_data(vol.as_ref(), len).await? {
        return Err(refusal::conflict(format!(
            "volume {name} holds data where the image would go (its first written block is at byte {at}); \
             importing {} writes over its first {} ({len} bytes). If nothing on it is needed, say so with \
             --overwrite (`\"overwrite\": true` through the REST API)",
            path.display(),
            format_size(len)
        )));
    }
    let mut buf = vec![0u8; COPY_STEP_BYTES];
    let mut at = 0u64;
    let mut zeroed = 0u64;
    while at < len {
        let n = usize::try_from(len - at).unwrap_or(usize::MAX).min(COPY_STEP_BYTES);
        file.read_exact(&mut buf[..n])?;
        if buf[..n].iter().all(|&b| b == 0) {
            vol.write_zeroes(at, n as u64, Zeroing::ANY, Durability::Buffered).await?;
            zeroed += n as u64;
        } else {
            vol.write(at, IoBytes::copy_from(&buf[..n]), Durability::Buffered).await?;
        }
        at += n as u64;
        progress(Progress { what: format!("import {name}"), done: at, total: len });
    }
    vol.flush().await?;
    Ok(json!({ "volume": name, "bytes": len, "zero_bytes": zeroed, "volume_bytes": vol.size_bytes() }))
}

/// The first byte below `len` of a block of `vol` that holds data (written, and neither trimmed
/// nor zeroed since), asked of the volume's allocation map a step at a time.
async fn first_data(vol: &dyn BlockVolume, len: u64) -> Result<Option<u64>> {
    // A step's map entries are held in memory at once (one per block for log volumes).
    const STEP_BYTES: u64 = 256 << 20;
    let end = len.next_multiple_of(BLOCK_BYTES).min(vol.size_bytes());
    let mut at = 0;
    while at < end {
        let step = (end - at).min(STEP_BYTES);
        let mut offset = at;
        for e in vol.block_status(at, step).await? {
            if !e.unallocated {
                return Ok(Some(offset));
            }
            offset += e.len_bytes;
        }
        at += step;
    }
    Ok(None)
}

/// Copies volume `name` out to `path` (see the module's doc for what `overwrite` allows).
/// How an export may treat what is there and what cannot be read.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ExportOptions {
    /// Replace an existing file, or write over a block device.
    pub(crate) overwrite: bool,
    /// Go on past blocks no copy or parity can give back: zeros in the image there, each range
    /// listed in the reply (`unreadable`). By default the first stops the export, naming it.
    pub(crate) skip_unreadable: bool,
}

pub(crate) async fn export(
    catalog: &Catalog<Dev>,
    name: &str,
    path: &Path,
    opts: ExportOptions,
    progress: ProgressFn<'_>,
) -> Result<Value> {
    let vol = catalog.lookup(name).ok_or_else(|| refusal::not_found(format!("no volume named `{name}`")))?;
    let size = vol.size_bytes();
    let mut copy = ImageCopy {
        vol: vol.as_ref(),
        name,
        path,
        skip_unreadable: opts.skip_unreadable,
        unreadable: Vec::new(),
    };
    match Target::open(catalog, name, path, size, opts.overwrite).await? {
        Target::Replace { replace, _hold } => export_to_file(&mut copy, replace, progress).await?,
        Target::InPlace { mut file, block, _hold } => {
            copy.copy_out(&mut file, false, progress).await?;
            if block {
                file.sync_all().with_context(|| format!("cannot sync {}", path.display()))?;
            }
        }
    }
    let ranges: Vec<Value> =
        copy.unreadable.iter().map(|(o, l)| json!({ "offset_bytes": o, "len_bytes": l })).collect();
    let unreadable_bytes: u64 = copy.unreadable.iter().map(|(_, l)| l).sum();
    Ok(json!({
        "volume": name,
        "bytes": size,
        "path": path,
        "unreadable": ranges,
        "unreadable_bytes": unreadable_bytes,
    }))
}

/// Where an export goes.
enum Target {
    /// A new file, or (`replace`) an existing regular file replaced whole: written to
    /// `PATH.stria-partial`, then renamed to PATH.
    Replace { replace: bool, _hold: Option<Arc<DriveLock>> },
    /// A device or FIFO, written in place; a block device is held while it is written.
    InPlace { file: File, block: bool, _hold: Option<Arc<DriveLock>> },
}

impl Target {
    async fn open(
        catalog: &Catalog<Dev>,
        name: &str,
        path: &Path,
        size: u64,
        overwrite: bool,
    ) -> Result<Target> {
        let meta = match std::fs::symlink_metadata(path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Target::Replace { replace: false, _hold: None });
            }
            Err(e) => return Err(e).with_context(|| format!("cannot export to {}", path.display())),
        };
        let kind = meta.file_type();
        if kind.is_symlink() {
            return Err(refusal::invalid(format!(
                "{} is a symbolic link; give the path it points to",
                path.display()
            )));
        }
        if kind.is_dir() {
            return Err(refusal::invalid(format!(
                "{} is a directory; give the path of a file to write",
                path.display()
            )));
        }
        if kind.is_char_device() || kind.is_fifo() {
            return Ok(Target::InPlace { file: open_in_place(path)?, block: false, _hold: None });
        }
        if !(kind.is_file() || kind.is_block_device()) {
            return Err(refusal::invalid(format!(
                "{} is neither a file nor a device; give the path of a file to write",
                path.display()
            )));
        }
        let hold = hold_unless_drive(catalog, path, Use::ExportOver { overwrite }).await?;
        if kind.is_file() {
            if !overwrite {
                bail!(
                    "{} exists; exporting would replace it. Give a new path, or say so with --overwrite",
                    path.display()
                );
            }
            return Ok(Target::Replace { replace: true, _hold: Some(hold) });
        }
        let mut file = open_in_place(path)?;
        let device_bytes = file.seek(SeekFrom::End(0))?;
        if device_bytes < size {
            bail!(
                "{} holds {} but volume {name} is {}: the volume does not fit",
                path.display(),
                format_size(device_bytes),
                format_size(size)
            );
        }
        if !overwrite {
            let carrying = device_signature(&file).map(|s| format!(" that carries {s}")).unwrap_or_default();
            bail!(
                "{} is a block device{carrying}; exporting writes the volume over what it holds. \
                 If nothing on it is needed, say so with --overwrite",
                path.display()
            );
        }
        file.seek(SeekFrom::Start(0))?;
        Ok(Target::InPlace { file, block: true, _hold: Some(hold) })
    }
}

/// Opens a device or FIFO to write it in place: no creation, no truncation, no symlink.
fn open_in_place(path: &Path) -> Result<File> {
    OpenOptions::new()
        .write(true)
        .custom_flags(no_follow())
        .open(path)
        .with_context(|| format!("cannot open {} to write", path.display()))
}

/// `O_NOFOLLOW`, for `custom_flags`: an open fails on a symlink in the last component.
fn no_follow() -> i32 {
    i32::try_from(rustix::fs::OFlags::NOFOLLOW.bits()).expect("O_NOFOLLOW fits an int")
}

/// What the start of a block device carries, for the refusal to write over it.
fn device_signature(file: &File) -> Option<&'static str> {
    let mut head = vec![0u8; drive_check::HEAD_BYTES];
    let n = file.read_at(&mut head, 0).ok()?;
    drive_check::signature(&head[..n])
}

/// How a path that may be a drive is about to be used.
#[derive(Debug, Clone, Copy)]
enum Use {
    ImportFrom,
    ExportOver { overwrite: bool },
}

/// Holds the regular file or block device at `path` while it is read or written, and refuses a
/// stria drive: one another process holds, or one of this pool, always; one of another pool
/// when exported over without `overwrite`.
async fn hold_unless_drive(catalog: &Catalog<Dev>, path: &Path, usage: Use) -> Result<Arc<DriveLock>> {
    let why = match usage {
        Use::ImportFrom => {
            "it cannot be imported while another process uses it (it may change under the copy)"
        }
        Use::ExportOver { .. } => "a volume cannot be exported over it while another process uses it",
    };
    let hold = DriveLock::take(path).map_err(|e| match e {
        OpenError::Busy { path, holder } => anyhow!("{}; {why}", drive_check::in_use(&path, &holder)),
        e => anyhow::Error::new(e),
    })?;
    let Some(label) = drive_check::peek_label(path).await else { return Ok(hold) };
    let (slot, pool) = (label.slot, &label.pool_name);
    if label.pool_uuid == catalog.pool().meta().pool_uuid {
        match usage {
            Use::ImportFrom => bail!(
                "{} is drive {slot} of this pool, not a volume image; give an image file (`stria volume \
                 export` makes one)",
                path.display()
            ),
            Use::ExportOver { .. } => bail!(
                "{} is drive {slot} of this pool; exporting over it would destroy that drive (the pool would \
                 leave it out at its next open). Give another path",
                path.display()
            ),
        }
    }
    match usage {
        Use::ExportOver { overwrite: false } => bail!(
            "{} is drive {slot} of pool `{pool}` ({}); exporting over it would take it from that pool. If \
             that pool is gone for good, say so with --overwrite",
            path.display(),
            label.pool_uuid
        ),
        Use::ExportOver { overwrite: true } => {
            tracing::warn!(path = %path.display(), pool, "exporting over a drive of another pool (--overwrite)");
        }
        Use::ImportFrom => {
            tracing::warn!(path = %path.display(), pool, slot, "importing a file that carries a stria superblock of another pool");
        }
    }
    Ok(hold)
}

/// The image to import: open, its length, and the hold on it while it is read.
async fn open_source(catalog: &Catalog<Dev>, path: &Path) -> Result<(File, u64, Arc<DriveLock>)> {
    let meta = std::fs::symlink_metadata(path).with_context(|| format!("cannot open {}", path.display()))?;
    let kind = meta.file_type();
    if kind.is_symlink() {
        return Err(refusal::invalid(format!(
            "{} is a symbolic link; give the path it points to",
            path.display()
        )));
    }
    if !(kind.is_file() || kind.is_block_device()) {
        return Err(refusal::invalid(format!(
            "{} is not a regular file or a block device; give a raw image file",
            path.display()
        )));
    }
    let hold = hold_unless_drive(catalog, path, Use::ImportFrom).await?;
    let mut file = OpenOptions::new()
        .read(true)
        .custom_flags(no_follow())
        .open(path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    // A block device's length is its size, which its metadata does not give.
    let len = file.seek(SeekFrom::End(0))?;
    file.seek(SeekFrom::Start(0))?;
    Ok((file, len, hold))
}

/// Why an image does not fit a volume, and what would make it fit.
fn image_too_large(catalog: &Catalog<Dev>, name: &str, path: &Path, len: u64, vol_bytes: u64) -> String {
    let fix = if catalog.resizable(name) {
        format!("resize the volume first: `stria volume resize {name} --size {len}`")
    } else {
        "it cannot be resized; import into a new, larger volume".to_string()
    };
    format!(
        "{} is {} but volume {name} is {}; {fix}",
        path.display(),
        format_size(len),
        format_size(vol_bytes)
    )
}

/// `PATH.stria-partial`: where an export to a file is written before it is renamed to PATH.
fn partial_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_os_string();
    name.push(".stria-partial");
    PathBuf::from(name)
}

/// Writes the volume to `PATH.stria-partial`, then renames it to `path`: over an existing file
/// when `replace`, and only if nothing is at `path` otherwise.
async fn export_to_file(copy: &mut ImageCopy<'_>, replace: bool, progress: ProgressFn<'_>) -> Result<()> {
    let (name, path) = (copy.name, copy.path);
    let partial = partial_path(path);
    let mut file = match OpenOptions::new().write(true).create_new(true).open(&partial) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => bail!(
            "{} exists (left by an export that did not finish, or someone else's file); remove it and run \
             the command again",
            partial.display()
        ),
        Err(e) => return Err(e).with_context(|| format!("cannot create {}", partial.display())),
    };
    let written = async {
        copy.copy_out(&mut file, true, progress).await?;
        file.set_len(copy.vol.size_bytes())?;
        file.sync_all()?;
        if replace {
            std::fs::rename(&partial, path)?;
        } else {
            rename_no_replace(&partial, path)?;
        }
        anyhow::Ok(())
    }
    .await;
    if let Err(e) = written {
        let _ = std::fs::remove_file(&partial);
        return Err(e.context(format!("cannot export volume {name} to {}", path.display())));
    }
    // The rename is durable once the directory is.
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        File::open(dir)
            .and_then(|d| d.sync_all())
            .with_context(|| format!("cannot sync {}", dir.display()))?;
    }
    Ok(())
}

/// Renames `from` to `to` unless something is at `to` (`renameat2(RENAME_NOREPLACE)`; a link
/// and an unlink where the filesystem cannot).
fn rename_no_replace(from: &Path, to: &Path) -> Result<()> {
    use rustix::fs::{CWD, RenameFlags, renameat_with};
    use rustix::io::Errno;
    let appeared =
        || anyhow!("{} appeared while the volume was exported; it was left as it is", to.display());
    match renameat_with(CWD, from, CWD, to, RenameFlags::NOREPLACE) {
        Ok(()) => Ok(()),
        Err(Errno::EXIST) => Err(appeared()),
        Err(Errno::INVAL | Errno::NOSYS) => match std::fs::hard_link(from, to) {
            Ok(()) => Ok(std::fs::remove_file(from)?),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Err(appeared()),
            Err(e) => Err(e.into()),
        },
        Err(e) => Err(std::io::Error::from(e).into()),
    }
}

/// One export's copy: the volume, and the unreadable ranges met so far.
struct ImageCopy<'a> {
    vol: &'a dyn BlockVolume,
    name: &'a str,
    path: &'a Path,
    skip_unreadable: bool,
    /// Unreadable (offset, length) ranges, adjacent blocks merged.
    unreadable: Vec<(u64, u64)>,
}

impl ImageCopy<'_> {
    /// Copies the volume into `out` from its start; a `sparse` (new, empty) file skips holes
    /// instead of writing zeros.
    async fn copy_out(&mut self, out: &mut File, sparse: bool, progress: ProgressFn<'_>) -> Result<()> {
        let size = self.vol.size_bytes();
        let zeros = vec![0u8; COPY_STEP_BYTES];
        let mut at = 0u64;
        while at < size {
            let n = usize::try_from(size - at).unwrap_or(usize::MAX).min(COPY_STEP_BYTES);
            let status = self.vol.block_status(at, n as u64).await?;
            if status.iter().all(|e| e.unallocated) {
                skip(out, &zeros[..n], sparse)?;
            } else {
                match self.vol.read(at, n).await {
                    Ok(data) => out.write_all(&data)?,
                    Err(e) if e.kind() == ErrorKind::Unrecoverable => {
                        self.around_unreadable(out, at, n, sparse, &zeros).await?;
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            at += n as u64;
            progress(Progress { what: format!("export {}", self.name), done: at, total: size });
        }
        Ok(())
    }

    /// The `len_bytes` at `at` that did not read in one request, block by block: what reads goes
    /// into `out`; an unreadable block stops the export (naming it), or with `skip_unreadable`
    /// leaves zeros there and joins `unreadable`.
    async fn around_unreadable(
        &mut self,
        out: &mut File,
        at: u64,
        len_bytes: usize,
        sparse: bool,
        zeros: &[u8],
    ) -> Result<()> {
        let end = at + len_bytes as u64;
        let mut off = at;
        while off < end {
            let len = usize::try_from((end - off).min(BLOCK_BYTES)).expect("one block");
            match self.vol.read(off, len).await {
                Ok(data) => out.write_all(&data)?,
                Err(e) if e.kind() == ErrorKind::Unrecoverable && !self.skip_unreadable => {
                    let (name, path) = (self.name, self.path.display());
                    return Err(anyhow!(
                        "{e}. The export stopped there; `stria volume export {name} {path} --skip-unreadable` \
                         copies the rest, with zeros where blocks cannot be read, and lists them"
                    ));
                }
                Err(e) if e.kind() == ErrorKind::Unrecoverable => {
                    skip(out, &zeros[..len], sparse)?;
                    match self.unreadable.last_mut() {
                        Some((o, l)) if *o + *l == off => *l += len as u64,
                        _ => self.unreadable.push((off, len as u64)),
                    }
                    tracing::warn!(
                        volume = self.name,
                        offset_bytes = off,
                        len_bytes = len,
                        "unreadable block: zeros in the image"
                    );
                }
                Err(e) => return Err(e.into()),
            }
            off += len as u64;
        }
        Ok(())
    }
}

/// Leaves `zeros.len()` bytes of zeros in `out`: a hole in a sparse (new) file, written zeros
/// otherwise (a device, or a file that held data).
fn skip(out: &mut File, zeros: &[u8], sparse: bool) -> Result<()> {
    if sparse {
        out.seek(SeekFrom::Current(zeros.len() as i64))?;
    } else {
        out.write_all(zeros)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_partial_file_is_beside_the_target_under_a_longer_name() {
        assert_eq!(partial_path(Path::new("/x/a.raw")), PathBuf::from("/x/a.raw.stria-partial"));
        assert_eq!(partial_path(Path::new("img")), PathBuf::from("img.stria-partial"));
    }

    #[test]
    fn a_rename_never_replaces_what_appeared() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (from, to) = (dir.path().join("from"), dir.path().join("to"));
        std::fs::write(&from, b"new").expect("write");
        std::fs::write(&to, b"old").expect("write");
        let e = rename_no_replace(&from, &to).expect_err("refused");
        assert!(e.to_string().contains("appeared while the volume was exported"), "{e}");
        assert_eq!(std::fs::read(&to).expect("read"), b"old");
        std::fs::remove_file(&to).expect("remove");
        rename_no_replace(&from, &to).expect("renamed");
        assert_eq!(std::fs::read(&to).expect("read"), b"new");
        assert!(!from.exists());
    }

    #[test]
    fn o_nofollow_is_what_the_kernel_calls_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let target = dir.path().join("t");
        std::fs::write(&target, b"x").expect("write");
        let link = dir.path().join("l");
        std::os::unix::fs::symlink(&target, &link).expect("symlink");
        let e = open_in_place(&link).expect_err("a symlink is not followed");
        let os = e.downcast_ref::<std::io::Error>().and_then(std::io::Error::raw_os_error);
        assert_eq!(os, Some(40), "ELOOP: {e:#}");
        open_in_place(&target).expect("the file itself opens");
    }
}
