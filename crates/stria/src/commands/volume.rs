//! `stria volume ...`.

use anyhow::{Result, bail};
use stria_catalog::{ConvertVolume, CreateVolume, StatusView};
use stria_engine::units::format_size;

use super::{print_json, request, view};
use crate::cli::VolumeCmd;
use crate::ops::Request;
use crate::output;
use crate::pooldir::{self, PoolDir};

/// `stria volume ...`.
pub(super) async fn volume(dir: &PoolDir, cmd: VolumeCmd) -> Result<()> {
    match cmd {
        VolumeCmd::Create {
            name,
            size,
            layout,
            chunk,
            class,
            cache_size,
            cache_copies,
            space,
            gc,
            cache_mode,
            qos,
        } => {
            let req = Request::VolumeCreate(CreateVolume {
                name,
                size_bytes: size,
                layout,
                chunk_bytes: chunk,
                class,
                cache_bytes: cache_size,
                cache_copies,
                space_bytes: space,
                gc,
                cache_mode,
                qos: qos.spec()?,
            });
            let v = request(dir, req).await?;
            output::volume(&view(v)?);
            Ok(())
        }
        VolumeCmd::Set { name, qos, cache_mode, json } => {
            let update = qos.update();
            if update.is_empty() && cache_mode.is_none() {
                bail!(
                    "nothing to set: give --iops-limit, --bw-limit, --iops-reserve, --bw-reserve, --weight or \
                     --cache-mode"
                );
            }
            let mut v = Default::default();
            if let Some(mode) = cache_mode {
                v = request(dir, Request::VolumeCacheMode { name: name.clone(), cache_mode: mode }).await?;
            }
            if !update.is_empty() {
                v = request(dir, Request::VolumeSet { name, qos: update }).await?;
            }
            if json {
                print_json(&v)
            } else {
                output::volume(&view(v)?)
            }
            Ok(())
        }
        VolumeCmd::List { json } => {
            let v = request(dir, Request::Status).await?;
            if json {
                print_json(&serde_json::to_value(view::<StatusView>(v)?.volume_list())?);
            } else {
                output::volumes(&view(v)?);
            }
            Ok(())
        }
        VolumeCmd::Show { name, json } => {
            let v = request(dir, Request::VolumeShow { name }).await?;
            if json {
                print_json(&v)
            } else {
                output::volume(&view(v)?)
            }
            Ok(())
        }
        VolumeCmd::Resize { name, to } => {
            let (size_bytes, force, allow_shrink) = (to.size, to.force, to.allow_shrink);
            let v = request(dir, Request::VolumeResize { name, size_bytes, force, allow_shrink }).await?;
            output::volume(&view(v)?);
            Ok(())
        }
        VolumeCmd::Delete { name, force, with_snapshots, wait } => {
            let v = request(dir, Request::VolumeDelete { name: name.clone(), force, with_snapshots, wait })
                .await?;
            let in_background = v["in_background"].as_bool() == Some(true);
            match v["kept_for_clones"].as_array() {
                Some(clones) => {
                    let clones: Vec<&str> = clones.iter().filter_map(|c| c.as_str()).collect();
                    outln!(
                        "deleted volume {name}; its cache and segment space are kept for its clones ({}) until the last of them is deleted{}",
                        clones.join(", "),
                        if in_background { " (its snapshots are handed on in the background)" } else { "" }
                    );
                }
                None if in_background => outln!(
                    "deleted clone {name}; its map pages are dropped in the background (`volume show` of its origin counts deletes in progress)"
                ),
                None => outln!("deleted volume {name}"),
            }
            Ok(())
        }
        VolumeCmd::Convert { name, layout, chunk, cache_size, cache_copies, space, force, json } => {
            let volume = ConvertVolume {
                name,
                layout,
                chunk_bytes: chunk,
                cache_bytes: cache_size,
                cache_copies,
                space_bytes: space,
            };
            let v = request(dir, Request::VolumeConvert { volume, force }).await?;
            if json {
                print_json(&v);
            } else {
                let c: stria_catalog::ConvertView = view(v)?;
                outln!(
                    "converted {} from {} to {} in {:.2}s: {} copied, {} of zeros skipped",
                    c.name,
                    c.from_layout,
                    c.layout,
                    c.seconds,
                    format_size(c.data_bytes),
                    format_size(c.zero_bytes)
                );
            }
            Ok(())
        }
        VolumeCmd::Clone { source, name, json } => {
            let v = request(dir, Request::VolumeClone { source, name }).await?;
            if json {
                print_json(&v);
            } else {
                let c: stria_catalog::CloneView = view(v)?;
                let of = c.of_clone.as_deref().unwrap_or(&c.origin);
                outln!("made clone {} of {of}@{} (export {}, writable)", c.name, c.snapshot, c.name);
            }
            Ok(())
        }
        VolumeCmd::Rollback { name, snapshot, force, destroy_newer, json } => {
            let v = request(dir, Request::VolumeRollback { volume: name, snapshot, force, destroy_newer })
                .await?;
            if json {
                print_json(&v);
            } else {
                let r: stria_catalog::RollbackView = view(v)?;
                for name in &r.snapshots_deleted {
                    outln!("deleted snapshot {}@{name} (newer than {})", r.volume, r.snapshot);
                }
                outln!(
                    "rolled {} back to snapshot {} in {:.3} s: {} blocks changed",
                    r.volume,
                    r.snapshot,
                    r.seconds,
                    r.blocks_changed
                );
            }
            Ok(())
        }
        VolumeCmd::Import { name, file, overwrite, force } => {
            let path = pooldir::absolute(&file)?;
            let v = request(dir, Request::VolumeImport { name, path, overwrite, force }).await?;
            outln!("imported {} bytes into {}", v["bytes"], v["volume"].as_str().unwrap_or(""));
            Ok(())
        }
        VolumeCmd::Export { name, file, overwrite, skip_unreadable } => {
            let path = pooldir::absolute(&file)?;
            let v = request(dir, Request::VolumeExport { name, path, overwrite, skip_unreadable }).await?;
            outln!(
                "exported {} bytes of {} to {}",
                v["bytes"],
                v["volume"].as_str().unwrap_or(""),
                file.display()
            );
            let unreadable = v["unreadable"].as_array().cloned().unwrap_or_default();
            if unreadable.is_empty() {
                return Ok(());
            }
            for r in &unreadable {
                let (offset, len) =
                    (r["offset_bytes"].as_u64().unwrap_or(0), r["len_bytes"].as_u64().unwrap_or(0));
                errln!(
                    "unreadable: bytes {offset}..{} ({} blocks of 4 KiB) are zeros in {}",
                    offset + len,
                    len.div_ceil(4096),
                    file.display()
                );
            }
            bail!(
                "{} bytes of {} could not be read (listed above); everything else was copied",
                v["unreadable_bytes"],
                v["volume"].as_str().unwrap_or("")
            )
        }
    }
}
