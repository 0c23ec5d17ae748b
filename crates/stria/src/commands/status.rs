//! `stria status` and `stria scrub`: what they show, and how they exit.

use anyhow::{Result, bail};
use stria_catalog::StatusView;
use stria_engine::ScrubReport;

use super::{print_json, request, view, warn_overcommit};
use crate::ops::Request;
use crate::output;
use crate::pooldir::PoolDir;

/// Exit codes of `stria status` (also in the README): 0 all healthy, 2 something degraded or
/// rebuilding (all data readable, redundancy reduced), 3 something failed or unavailable (some
/// data unreadable). Errors running the command exit 1.
const STATUS_DEGRADED: i32 = 2;
const STATUS_FAILED: i32 = 3;

/// `stria scrub`: fails when it found what it could not repair or decide.
pub(super) async fn scrub(dir: &PoolDir, name: String, json: bool) -> Result<()> {
    let v = request(dir, Request::Scrub { name }).await?;
    let report: ScrubReport = view(v.clone())?;
    if json {
        print_json(&v)
    } else {
        output::scrub(&report)
    }
    if report.unrecoverable_blocks > 0 {
        bail!("scrub found unrecoverable blocks");
    }
    if report.inconsistent_blocks > 0 {
        bail!(
            "scrub found copies or parity that disagree with nothing to say which is current; \
             they were left as they are (see the log for where)"
        );
    }
    Ok(())
}

/// `stria status`: exits 0 when all is healthy, [`STATUS_DEGRADED`] or [`STATUS_FAILED`]
/// otherwise.
pub(super) async fn status(dir: &PoolDir, json: bool) -> Result<i32> {
    let v = request(dir, Request::Status).await?;
    let status: StatusView = view(v.clone())?;
    if json {
        print_json(&v)
    } else {
        output::status(&status)
    }
    warn_overcommit(dir);
    Ok(status_code(&status))
}

/// The exit code `stria status` gives for what it shows.
fn status_code(v: &StatusView) -> i32 {
    use stria_engine::VolumeState as S;
    let states = v.pool.volumes.iter().map(|x| x.state).chain(v.log.iter().map(|t| t.state));
    let mut code = 0;
    for s in states {
        match s {
            S::Failed => return STATUS_FAILED,
            S::Degraded | S::Rebuilding => code = STATUS_DEGRADED,
            S::Healthy => {}
        }
    }
    if !v.unavailable.is_empty() {
        return STATUS_FAILED;
    }
    if code == 0 && (v.pool.suspended.is_some() || v.pool.drives.iter().any(|d| d.state != "active")) {
        code = STATUS_DEGRADED;
    }
    code
}
