//! The files the REST API may read (`volume import`) and write (`volume export`): only inside
//! the directory the `api_transfer_dir` setting names (`--api-transfer-dir`). There is none by
//! default, and then both are refused, naming the setting: the daemon runs as root, and an API
//! client holds a token, not a login on the server; without this the API would read and write
//! any path (an import of `/etc/shadow`, an export into `/etc`).
//!
//! A path is relative to the directory or absolute inside it. It may not contain `..`; its
//! parent directory is resolved (symlinks followed) and must lie inside, and a last component
//! that is a symlink must point inside too. The path handed on is the resolved one, and the
//! export and import open its last component with `O_NOFOLLOW`, so a symlink put there
//! afterwards makes them fail rather than escape. (A directory inside swapped for a symlink
//! between this check and the copy is not caught: whoever can write into the transfer directory
//! must be trusted as far as that.)
//!
//! The CLI is not confined: it runs on the server as a user who may open the files itself.

use std::path::{Component, Path, PathBuf};

/// The setting's name in the configuration file.
pub(crate) const SETTING: &str = "api_transfer_dir";

/// The transfer directory as configured, checked at start: it must be an existing directory.
/// Returns it resolved (symlinks followed).
pub(crate) fn resolve_dir(dir: &Path) -> anyhow::Result<PathBuf> {
    let resolved = std::fs::canonicalize(dir)
        .map_err(|e| anyhow::anyhow!("{SETTING} (--api-transfer-dir) {}: {e}", dir.display()))?;
    if !resolved.is_dir() {
        anyhow::bail!("{SETTING} (--api-transfer-dir) {} is not a directory", dir.display());
    }
    Ok(resolved)
}

/// `path` resolved inside `dir` (see the module's doc), or why it may not be used.
pub(crate) fn confine(dir: Option<&Path>, path: &Path) -> Result<PathBuf, String> {
    let Some(dir) = dir else {
        return Err(format!(
            "file transfers through the REST API are off: set `{SETTING}` in the configuration file (or \
             --api-transfer-dir DIR) to a directory the API may read images from and write them to, or \
             run `stria volume import|export` on the server"
        ));
    };
    let shown = path.display();
    let outside = |what: String| format!("`{shown}` is {what}, outside {SETTING} ({})", dir.display());
    if path.components().any(|c| c == Component::ParentDir) {
        return Err(format!(
            "`{shown}`: `..` is not allowed; give a path inside {SETTING} ({})",
            dir.display()
        ));
    }
    let joined = dir.join(path);
    let (Some(parent), Some(name)) = (joined.parent(), joined.file_name()) else {
        return Err(format!("`{shown}` names no file"));
    };
    let parent = std::fs::canonicalize(parent)
        .map_err(|e| format!("`{shown}`: cannot use directory {}: {e}", parent.display()))?;
    if !parent.starts_with(dir) {
        return Err(outside(format!("in {}", parent.display())));
    }
    let full = parent.join(name);
    if std::fs::symlink_metadata(&full).is_ok_and(|m| m.file_type().is_symlink()) {
        let target = std::fs::canonicalize(&full).map_err(|e| format!("`{shown}`: {e}"))?;
        if !target.starts_with(dir) {
            return Err(outside(format!("a symbolic link to {}", target.display())));
        }
        return Ok(target);
    }
    Ok(full)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_stay_inside_the_transfer_directory() {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = resolve_dir(&root.path().join(".")).expect("a directory");
        std::fs::create_dir(dir.join("sub")).expect("mkdir");
        std::fs::write(dir.join("in.raw"), b"x").expect("write");
        std::os::unix::fs::symlink(dir.join("in.raw"), dir.join("inner-link")).expect("symlink");
        std::os::unix::fs::symlink("/etc/hostname", dir.join("outer-link")).expect("symlink");
        std::os::unix::fs::symlink("/etc", dir.join("etc")).expect("symlink");
        let ok = |p: &str| confine(Some(&dir), Path::new(p)).unwrap_or_else(|e| panic!("{p}: {e}"));
        assert_eq!(ok("new.raw"), dir.join("new.raw"));
        assert_eq!(ok("sub/new.raw"), dir.join("sub/new.raw"));
        assert_eq!(ok(&dir.join("in.raw").display().to_string()), dir.join("in.raw"));
        assert_eq!(ok("./in.raw"), dir.join("in.raw"));
        assert_eq!(ok("inner-link"), dir.join("in.raw"), "a link inside is followed");
        for (p, why) in [
            ("../x.raw", "`..` is not allowed"),
            ("sub/../../x.raw", "`..` is not allowed"),
            ("/etc/shadow", "outside api_transfer_dir"),
            ("/tmp/x.raw", "outside api_transfer_dir"),
            ("outer-link", "a symbolic link to /etc/hostname, outside"),
            ("etc/passwd", "is in /etc, outside"),
            ("missing/x.raw", "cannot use directory"),
        ] {
            let e = confine(Some(&dir), Path::new(p)).expect_err(p);
            assert!(e.contains(why), "{p}: {e}");
        }
        let e = confine(None, Path::new("x.raw")).expect_err("off by default");
        assert!(e.contains("set `api_transfer_dir`"), "{e}");
        assert!(resolve_dir(&dir.join("in.raw")).is_err(), "a file is not a directory");
    }
}
