//! `stria snapshot ...`.

use anyhow::Result;

use super::{print_json, request, view};
use crate::cli::SnapshotCmd;
use crate::ops::Request;
use crate::output;
use crate::pooldir::PoolDir;

/// `stria snapshot ...`.
pub(super) async fn snapshot(dir: &PoolDir, cmd: SnapshotCmd) -> Result<()> {
    match cmd {
        SnapshotCmd::Create { volume, name, json } => {
            let v = request(dir, Request::SnapshotCreate { volume, name }).await?;
            if json {
                print_json(&v);
            } else {
                let s: stria_catalog::SnapshotView = view(v)?;
                outln!("made snapshot {} of {} (export {}, read-only)", s.name, s.volume, s.export);
            }
        }
        SnapshotCmd::List { volume, json } => {
            let v = request(dir, Request::SnapshotList { volume }).await?;
            if json {
                print_json(&v);
            } else {
                output::snapshots(&view::<Vec<stria_catalog::SnapshotView>>(v)?);
            }
        }
        SnapshotCmd::Delete { volume, name, force, wait, json } => {
            let v = request(dir, Request::SnapshotDelete { volume, name, force, wait }).await?;
            if json {
                print_json(&v);
            } else {
                let d: stria_catalog::SnapshotDeletedView = view(v)?;
                if d.kept_for_clones {
                    outln!(
                        "deleted snapshot {} of {}: it has clones, so its map pages are kept (hidden) until the last of them is deleted; nothing freed yet",
                        d.name,
                        d.volume
                    );
                    return Ok(());
                }
                if d.in_background {
                    outln!(
                        "deleted snapshot {} of {}: its map pages are handed on and its blocks freed in the background (`volume show` counts deletes in progress)",
                        d.name,
                        d.volume
                    );
                    return Ok(());
                }
                outln!(
                    "deleted snapshot {} of {} in {:.3} s: {} map pages handed on, {} dropped, {} blocks freed for GC",
                    d.name,
                    d.volume,
                    d.seconds,
                    d.map_pages_handed_on,
                    d.map_pages_dropped,
                    d.blocks_freed
                );
            }
        }
    }
    Ok(())
}
