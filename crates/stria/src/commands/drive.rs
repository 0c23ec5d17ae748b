//! `stria drive ...`.

use anyhow::{Result, bail};
use stria_catalog::StatusView;

use super::{print_json, request, view};
use crate::cli::DriveCmd;
use crate::ops::Request;
use crate::output;
use crate::pooldir::{self, PoolDir};

/// `stria drive ...`.
pub(super) async fn drive(dir: &PoolDir, cmd: DriveCmd) -> Result<()> {
    match cmd {
        DriveCmd::List { json } => {
            let v = request(dir, Request::Status).await?;
            if json { print_json(&v["drives"]) } else { output::drives(&view::<StatusView>(v)?.pool.drives) }
        }
        DriveCmd::Fail { drive, force } => {
            let v = request(dir, Request::DriveFail { drive, force }).await?;
            outln!(
                "drive {} failed; its volumes run degraded until it is replaced \
                 (or brought back with `stria drive online {}`)",
                v["failed"],
                v["failed"]
            );
        }
        DriveCmd::Online { drive, force } => {
            let v = request(dir, Request::DriveOnline { drive, force }).await?;
            outln!(
                "drive {} is back in service as drive {}; resync: {}; rebuild {}",
                v["online"],
                v["new_drive"],
                v["resync"].as_str().unwrap_or(""),
                v["rebuild"].as_str().unwrap_or("")
            );
        }
        DriveCmd::Add { path, class, size, domain, overwrite, no_rebalance, json } => {
            if path.is_none() && size.is_none() {
                bail!("give the drive's PATH, or --size to create a new sparse file in the pool directory");
            }
            // Relative to where the command runs, not where the daemon does.
            let path = path.map(|p| pooldir::absolute(&p)).transpose()?;
            let add = Request::DriveAdd { class, path, size_bytes: size, domain, overwrite, no_rebalance };
            let v = request(dir, add).await?;
            if json {
                print_json(&v);
            } else {
                outln!("added drive {}; rebalance {}", v["added"], v["rebalance"].as_str().unwrap_or(""));
                let status: stria_engine::PoolStatus = view(v["status"].clone())?;
                output::drives(&status.drives);
            }
        }
        DriveCmd::Remove { drive, rate } => {
            let v = request(dir, Request::DriveRemove { drive, rate_bytes_per_sec: rate }).await?;
            if !v["draining"].is_null() {
                outln!(
                    "drive {} is draining: its data moves to the other drives in the daemon, then it leaves the \
                     pool (`stria status` shows the progress)",
                    v["draining"]
                );
                return Ok(());
            }
            outln!("removed drive {}", v["removed"]);
            if let Some(kept) = v["file_kept_as"].as_str() {
                outln!("its file was kept as {kept}");
            }
        }
        DriveCmd::Replace { drive, new, domain, force, overwrite } => {
            let new_path = new.map(|p| pooldir::absolute(&p)).transpose()?;
            let v = request(dir, Request::DriveReplace { drive, new_path, domain, force, overwrite }).await?;
            outln!(
                "drive {} replaced by drive {}; rebuild {}",
                v["replaced"],
                v["new_drive"],
                v["rebuild"].as_str().unwrap_or("")
            );
            if let Some(kept) = v["old_file_kept_as"].as_str() {
                outln!("the old drive file was kept as {kept}; delete it once the rebuild is done");
            }
        }
        DriveCmd::RebuildRate { rate } => {
            request(dir, Request::RebuildRate { bytes_per_sec: rate }).await?;
            if rate == 0 {
                outln!("rebuild rate set to unlimited (kept in the pool)");
            } else {
                outln!("rebuild rate set to {}/s (kept in the pool)", stria_engine::units::format_size(rate));
            }
        }
        DriveCmd::ClearErrors { drive, all: _ } => {
            let v = request(dir, Request::DriveClearErrors { drive }).await?;
            output::cleared_errors(&v);
        }
    }
    Ok(())
}
