//! What stria checks before it uses a path as a drive, or writes over one: who holds it (the
//! exclusive hold of `stria-dev`, described for people), whose drive it is (its label, read
//! without taking the drive), and what else it carries (a filesystem, a partition table, ...).
//!
//! Foreign content is recognised here, by its signature, rather than by running `blkid -p`: the
//! check reads the very bytes that formatting would overwrite, through the drive stria already
//! holds exclusively (no second open, no window for the device to change in between), it gives
//! the same answer on every machine (`blkid` is missing from many containers and its verdicts
//! change between util-linux versions), and each signature is unit-tested. The cost is coverage:
//! the formats below are those put on Linux disks in practice; an exotic filesystem goes
//! unrecognised, and an unrecognised device is formatted as it was before these checks.
//! A device with nothing recognisable (zeros, or an old drive's random leftovers) needs no flag.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Result, anyhow, bail};
use stria_dev::{
    BlockDevice, DevCounters, DevError, FileDevice, FileOptions, Holder, IoBuf, IoBytes, OpenError,
};
use stria_engine::{DriveLabel, read_label};

/// Opens `path` as a drive (held exclusively by this process while the device lives). A drive
/// another process holds is refused with who holds it.
pub(crate) fn open_drive(path: &Path) -> Result<FileDevice> {
    FileDevice::open(path, &FileOptions::default()).map_err(|e| match e {
        OpenError::Busy { path, holder } => anyhow!(in_use(&path, &holder)),
        e => anyhow::Error::new(e),
    })
}

/// "PATH is in use by stria serve (pid 1234, pool /srv/tank)", or with what else holds it.
pub(crate) fn in_use(path: &Path, holder: &Holder) -> String {
    match (holder.pid, stria_command(&holder.args)) {
        (Some(pid), Some(command)) if holder.mounts.is_empty() && holder.kernel.is_empty() => {
            let pool = pool_of(pid).map(|p| format!(", pool {}", p.display())).unwrap_or_default();
            format!("{} is in use by {command} (pid {pid}{pool})", path.display())
        }
        _ => format!("{} is in use: {holder}", path.display()),
    }
}

/// `stria serve`, `stria volume export`, ...: what a stria command line runs, or `None` for
/// another program.
fn stria_command(args: &[String]) -> Option<String> {
    let program = Path::new(args.first()?).file_name()?.to_str()?;
    if !program.starts_with("stria") {
        return None;
    }
    // The global flags that take a value (`--pool DIR`); `--pool=DIR` is one word.
    const VALUED: [&str; 3] = ["--pool", "--log-level", "--log-format"];
    let mut words = vec!["stria".to_string()];
    let mut rest = args[1..].iter();
    while let Some(arg) = rest.next() {
        if VALUED.contains(&arg.as_str()) {
            rest.next();
        } else if !arg.starts_with('-') {
            words.push(arg.clone());
            // `serve`, `up`: one word; `volume export`, `pool create`: two.
            if !["volume", "drive", "pool", "snapshot"].contains(&arg.as_str()) || words.len() == 3 {
                break;
            }
        }
    }
    Some(words.join(" "))
}

/// The pool directory process `pid` holds (the directory of the `.lock` it has open, beside a
/// `pool.json`), when `/proc` lets us see it.
fn pool_of(pid: u32) -> Option<PathBuf> {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?;
    fds.flatten().filter_map(|fd| std::fs::read_link(fd.path()).ok()).find_map(|target| {
        let dir = target.parent()?;
        (target.file_name()? == ".lock" && dir.join("pool.json").exists()).then(|| dir.to_path_buf())
    })
}

/// The stria label of the file or device at `path`, read without holding it (it may be a drive
/// another process serves; reading two blocks of it harms nothing). `None` when it has none or
/// cannot be read.
pub(crate) async fn peek_label(path: &Path) -> Option<DriveLabel> {
    let dev = Peek::open(path).ok()?;
    read_label(&dev).await
}

/// A file or device opened read-only, without a hold: only [`peek_label`] reads through it.
#[derive(Debug)]
struct Peek {
    name: Arc<str>,
    file: std::fs::File,
    size_bytes: u64,
    counters: DevCounters,
}

impl Peek {
    fn open(path: &Path) -> std::io::Result<Peek> {
        use std::io::Seek;
        let mut file = std::fs::File::open(path)?;
        let meta = file.metadata()?;
        if !(meta.is_file() || std::os::unix::fs::FileTypeExt::is_block_device(&meta.file_type())) {
            return Err(std::io::Error::other("not a file or block device"));
        }
        let len = file.seek(std::io::SeekFrom::End(0))?;
        Ok(Peek {
            name: Arc::from(path.display().to_string()),
            file,
            size_bytes: len - len % stria_dev::BLOCK_BYTES,
            counters: DevCounters::default(),
        })
    }

    fn refused(&self, offset_bytes: u64, len_bytes: u64) -> DevError {
        let source = std::io::Error::new(std::io::ErrorKind::PermissionDenied, "opened to read a label only");
        DevError::Io { device: Arc::clone(&self.name), offset_bytes, len_bytes, source }
    }
}

impl BlockDevice for Peek {
    fn name(&self) -> &str {
        &self.name
    }

    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    async fn read(&self, offset_bytes: u64, mut buf: IoBuf) -> Result<IoBuf, DevError> {
        let len_bytes = buf.len() as u64;
        stria_dev::check_range(&self.name, self.size_bytes, offset_bytes, len_bytes)?;
        self.file.read_exact_at(&mut buf, offset_bytes).map_err(|source| DevError::Io {
            device: Arc::clone(&self.name),
            offset_bytes,
            len_bytes,
            source,
        })?;
        Ok(buf)
    }

    async fn write(&self, offset_bytes: u64, data: IoBytes, _fua: bool) -> Result<(), DevError> {
        Err(self.refused(offset_bytes, data.len() as u64))
    }

    async fn flush(&self) -> Result<(), DevError> {
        Err(self.refused(0, 0))
    }

    async fn discard(&self, offset_bytes: u64, len_bytes: u64) -> Result<(), DevError> {
        Err(self.refused(offset_bytes, len_bytes))
    }

    fn counters(&self) -> &DevCounters {
        &self.counters
    }
}

/// Bytes at the start of a device that [`signature`] looks at (ZFS's first label ends there).
pub(crate) const HEAD_BYTES: usize = 256 << 10;

/// What the first [`HEAD_BYTES`] of a device (fewer on a smaller one) say it carries: a
/// filesystem, a partition table, a volume manager's or RAID's member, swap, ... `None` when
/// nothing known is there.
pub(crate) fn signature(head: &[u8]) -> Option<&'static str> {
    let at = |offset: usize, magic: &[u8]| head.get(offset..offset + magic.len()) == Some(magic);
    let le32 =
        |offset: usize| head.get(offset..offset + 4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    let boot_signature = at(510, &[0x55, 0xAA]);
    let found = if at(0, b"LUKS\xba\xbe") {
        "a LUKS encrypted volume"
    } else if at(0, b"XFSB") {
        "an XFS filesystem"
    } else if at(1080, &0xEF53u16.to_le_bytes()) {
        "an ext2/ext3/ext4 filesystem"
    } else if at(65600, b"_BHRfS_M") {
        "a btrfs filesystem"
    } else if le32(1024) == Some(0xF2F5_2010) {
        "an F2FS filesystem"
    } else if [4096, 8192, 16384, 65536]
        .iter()
        .any(|&page| at(page - 10, b"SWAPSPACE2") || at(page - 10, b"SWAP-SPACE"))
    {
        "a swap area"
    } else if [0, 512, 1024, 1536].iter().any(|&sector| at(sector, b"LABELONE")) {
        "an LVM2 physical volume"
    } else if le32(0) == Some(0xA92B_4EFC) || le32(4096) == Some(0xA92B_4EFC) {
        "an md RAID member"
    } else if zfs_uberblock(head) {
        "a ZFS pool member"
    } else if at(32769, b"CD001") {
        "an ISO 9660 filesystem"
    } else if at(0, b"hsqs") {
        "a squashfs filesystem"
    } else if at(3, b"NTFS    ") {
        "an NTFS filesystem"
    } else if boot_signature && (at(54, b"FAT") || at(82, b"FAT32")) {
        "a FAT filesystem"
    } else if at(512, b"EFI PART") || at(4096, b"EFI PART") {
        "a GPT partition table"
    } else if boot_signature && (0..4).any(|i| head.get(446 + 16 * i + 4).is_some_and(|&t| t != 0)) {
        "an MBR partition table"
    } else {
        return None;
    };
    Some(found)
}

/// A ZFS uberblock (magic 0x00bab10c, either byte order) in the uberblock array of the first
/// vdev label (its second 128 KiB), at any 1 KiB slot.
fn zfs_uberblock(head: &[u8]) -> bool {
    const MAGIC: u64 = 0x00ba_b10c;
    (128 << 10..256 << 10).step_by(1024).any(|offset| {
        head.get(offset..offset + 8).is_some_and(|b| {
            let bytes = [b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]];
            u64::from_le_bytes(bytes) == MAGIC || u64::from_be_bytes(bytes) == MAGIC
        })
    })
}

/// The loop device a regular file backs, if any (`/sys/block/loopN/loop/backing_file`).
pub(crate) fn loop_backed(path: &Path) -> Option<String> {
    let path = std::fs::canonicalize(path).ok()?;
    std::fs::read_dir("/sys/block").ok()?.flatten().find_map(|entry| {
        let name = entry.file_name().to_string_lossy().into_owned();
        let backing = std::fs::read_to_string(entry.path().join("loop/backing_file")).ok()?;
        (Path::new(backing.trim_end()) == path).then(|| format!("/dev/{name}"))
    })
}

/// Refuses to format `dev` when it carries anything: a stria label (a drive of another pool; a
/// member of this one is refused before, by `refuse_member`), a filesystem, a partition table,
/// ... unless `allowed`; `flag` is how the command allows it. A file that backs a loop device is
/// refused even then: the kernel reads and writes it through that device.
pub(crate) async fn refuse_foreign(dev: &FileDevice, path: &Path, allowed: bool, flag: &str) -> Result<()> {
    if !dev.is_block_device()
        && let Some(device) = loop_backed(path)
    {
        bail!(
            "{} is in use: it backs the loop device {device}, which reads and writes it. Detach that \
             first (`losetup -d {device}`, after unmounting it)",
            path.display()
        );
    }
    if let Some(label) = read_label(dev).await {
        if allowed {
            tracing::warn!(path = %path.display(), pool = %label.pool_name, "overwriting a drive of another pool ({flag})");
            return Ok(());
        }
        bail!(
            "{} is drive {} of pool `{}` ({}); formatting it would take it from that pool. \
             If that pool is gone for good, say so with {flag}",
            path.display(),
            label.slot,
            label.pool_name,
            label.pool_uuid,
        )
    }
    let Some(found) = device_signature(dev).await else { return Ok(()) };
    if allowed {
        tracing::warn!(path = %path.display(), "formatting over {found} ({flag})");
        return Ok(());
    }
    bail!(
        "{} carries {found}; formatting it would destroy what is there. If nothing on it is needed, \
         say so with {flag}",
        path.display()
    )
}

/// [`signature`] of the start of `dev`.
pub(crate) async fn device_signature(dev: &impl BlockDevice) -> Option<&'static str> {
    let len = usize::try_from(dev.size_bytes()).unwrap_or(usize::MAX).min(HEAD_BYTES);
    let head = dev.read(0, IoBuf::zeroed(len)).await.ok()?;
    signature(&head)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A head of zeros with `magic` at `offset`.
    fn head_with(offset: usize, magic: &[u8]) -> Vec<u8> {
        let mut head = vec![0u8; HEAD_BYTES];
        head[offset..offset + magic.len()].copy_from_slice(magic);
        head
    }

    #[test]
    fn known_signatures_are_recognised_and_zeros_are_not() {
        assert_eq!(signature(&vec![0u8; HEAD_BYTES]), None);
        assert_eq!(signature(&[0u8; 4096]), None, "a short head is fine");
        let cases: &[(usize, &[u8], &str)] = &[
            (0, b"LUKS\xba\xbe", "LUKS"),
            (0, b"XFSB", "XFS"),
            (1080, &[0x53, 0xEF], "ext2/ext3/ext4"),
            (65600, b"_BHRfS_M", "btrfs"),
            (1024, &0xF2F5_2010u32.to_le_bytes(), "F2FS"),
            (4086, b"SWAPSPACE2", "swap"),
            (65526, b"SWAPSPACE2", "swap"),
            (512, b"LABELONE", "LVM2"),
            (4096, &0xA92B_4EFCu32.to_le_bytes(), "md RAID"),
            ((128 << 10) + 3072, &0x00ba_b10cu64.to_le_bytes(), "ZFS"),
            ((200 << 10), &0x00ba_b10cu64.to_be_bytes(), "ZFS"),
            (32769, b"CD001", "ISO 9660"),
            (0, b"hsqs", "squashfs"),
            (3, b"NTFS    ", "NTFS"),
            (512, b"EFI PART", "GPT"),
            (4096, b"EFI PART", "GPT"),
        ];
        for (offset, magic, name) in cases {
            let found = signature(&head_with(*offset, magic));
            assert!(found.is_some_and(|f| f.contains(name)), "{name} at {offset}: {found:?}");
        }
    }

    #[test]
    fn boot_sectors_need_their_partitions_or_filesystem() {
        let mut head = head_with(510, &[0x55, 0xAA]);
        assert_eq!(signature(&head), None, "a boot signature over an empty table is nothing");
        head[446 + 16 + 4] = 0x83; // second entry: a Linux partition
        assert_eq!(signature(&head), Some("an MBR partition table"));
        head[54..57].copy_from_slice(b"FAT");
        assert_eq!(signature(&head), Some("a FAT filesystem"));
    }

    #[test]
    fn stria_commands_are_named_by_their_subcommand() {
        let args = |s: &str| s.split(' ').map(String::from).collect::<Vec<_>>();
        let name = |s: &str| stria_command(&args(s));
        assert_eq!(
            name("/usr/bin/stria --pool /srv/tank serve --nbd unix:x").as_deref(),
            Some("stria serve")
        );
        assert_eq!(name("stria --log-level warn up").as_deref(), Some("stria up"));
        assert_eq!(
            name("target/debug/stria --pool=p volume export v f").as_deref(),
            Some("stria volume export")
        );
        assert_eq!(name("stria").as_deref(), Some("stria"));
        assert_eq!(name("python3 -c x"), None);
    }

    #[test]
    fn a_label_is_peeked_without_holding_the_drive() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("plain.img");
        std::fs::File::create(&path).expect("create").set_len(8 << 20).expect("size");
        let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        // The drive is held (as a daemon holds its drives); peeking still works and holds nothing.
        let held = open_drive(&path).expect("open");
        assert_eq!(rt.block_on(peek_label(&path)), None, "no stria superblock on zeros");
        drop(held);
        assert!(rt.block_on(device_signature(&Peek::open(&path).expect("peek"))).is_none());
    }
}
