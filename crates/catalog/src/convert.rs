//! `volume convert`: a plain volume made into a log-structured one of the same name, size and
//! bytes (docs/design/convert.md). The copy runs into a new log volume `NAME.convert` whose pool
//! record says it replaces `NAME`; one metadata commit then removes the plain volume and renames
//! the new one. A crash before that commit leaves the plain volume, and open deletes the copy.

use std::sync::Arc;

use stria_dev::{BLOCK_BYTES, BLOCK_USIZE, IoBytes};
use stria_engine::{BlockVolume, Pool};
use stria_tier::TierError;
use stria_tier::log::{self, LogSpec, LogVolume};

use crate::{Catalog, CatalogError, LayoutSpec, LogOptions, VolumeView, is_log_layout, log_spec};
use stria_dev::BlockDevice;

/// What `volume convert` takes: the plain volume and the log layout it becomes (the options
/// of `volume create` for log layouts).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ConvertVolume {
    pub name: String,
    /// `tiered:ec:K+M` or `log:ec:K+M`.
    pub layout: String,
    /// The segment space's chunk (default as `volume create`).
    #[serde(default)]
    pub chunk_bytes: Option<u64>,
    #[serde(default)]
    pub cache_bytes: Option<u64>,
    #[serde(default)]
    pub cache_copies: Option<u32>,
    #[serde(default)]
    pub space_bytes: Option<u64>,
}

/// What a conversion did (`volume convert`'s answer).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ConvertView {
    pub name: String,
    /// The layout it had, and has now.
    pub from_layout: String,
    pub layout: String,
    pub size_bytes: u64,
    /// Bytes copied (blocks that were not all zeros), and bytes of zeros skipped.
    pub data_bytes: u64,
    pub zero_bytes: u64,
    pub seconds: f64,
}

/// Bytes read and written per step of the copy.
const STEP_BYTES: u64 = 1 << 20;

/// The name the new volume has until it takes the plain volume's.
pub(crate) fn temp_name(name: &str) -> String {
    format!("{name}.convert")
}

/// The longest name a plain volume may have to be converted (its temporary name's parts, such
/// as `NAME.convert.cache`, must be valid names: 64 characters at most).
const NAME_MAX: usize = 64 - ".convert.cache".len();

impl<D: BlockDevice> Catalog<D> {
    /// Converts plain volume `req.name` into a log-structured volume of the layout asked for,
    /// with the same size, bytes and name (docs/design/convert.md). The volume takes no
    /// requests while it runs (they fail: callers refuse while clients are attached). On an
    /// error before the last step the plain volume is as it was.
    /// `progress(bytes_done, bytes_total)` is called after each step of the copy.
    pub async fn convert(
        &self,
        req: ConvertVolume,
        progress: &mut (dyn FnMut(u64, u64) + Send),
    ) -> Result<ConvertView, CatalogError> {
        let started = std::time::Instant::now();
        let name = req.name.as_str();
        let plain = self.plain(name)?;
        let from_layout = self.show(name).ok().and_then(|v| match v {
            VolumeView::Plain(p) => Some(p.status.layout.clone()),
            _ => None,
        });
        if !is_log_layout(&req.layout) {
            return Err(CatalogError::Invalid(format!(
                "volume convert makes a log-structured volume: --layout must be tiered:ec:K+M or log:ec:K+M, \
                 not `{}`",
                req.layout
            )));
        }
        let layout = req.layout.parse::<LayoutSpec>()?;
        if name.len() > NAME_MAX {
            return Err(CatalogError::Invalid(format!(
                "volume `{name}` has a name of {} characters: a conversion needs one of at most {NAME_MAX} (it \
                 copies into `{}` first)",
                name.len(),
                temp_name(name)
            )));
        }
        let temp = temp_name(name);
        if self.entry(&temp).is_some()
            || self.pool.volume(&temp).is_some()
            || self.pool.meta().tiered.iter().any(|t| t.name == temp)
        {
            return Err(CatalogError::Invalid(format!(
                "a conversion of `{name}` copies into a new volume named `{temp}` first, and a volume of that \
                 name exists: delete it, or convert with an export and an import"
            )));
        }
        let size = plain.size_bytes();
        let options = LogOptions {
            chunk_bytes: req.chunk_bytes,
            cache_bytes: req.cache_bytes,
            cache_copies: req.cache_copies,
            space_bytes: req.space_bytes,
            gc: None,
            cache_mode: None,
        };
        let spec = LogSpec { replaces: Some(name.to_string()), ..log_spec(&temp, size, layout, options) };
        let lv = log::create(&self.pool, spec).await?;
        drop(plain);
        let copied = match self.pool.close_volume(name).await {
            Ok(source) => copy(&*source, &lv, progress).await,
            Err(e) => Err(e.into()),
        };
        lv.close().await;
        let mut counts = (0, 0);
        let adopted = match copied {
            Ok((data, zeros)) => {
                counts = (data, zeros);
                tracing::info!(
                    volume = name,
                    data_bytes = data,
                    zero_bytes = zeros,
                    "copied; adopting the copy"
                );
                self.pool.adopt_tiered(&temp, name).await.map_err(CatalogError::from)
            }
            Err(e) => Err(e),
        };
        // The commit is the conversion: if it happened, what failed after it (installing the
        // parts under their new names) is the open's to report below.
        let committed = self.pool.meta().tiered.iter().any(|t| t.name == name);
        match adopted {
            Err(e) if !committed => {
                give_up(&self.pool, &temp, name).await;
                return Err(e);
            }
            Err(e) => tracing::warn!(volume = name, error = %e, "converted; opening it"),
            Ok(()) => {}
        }
        let rec = self.pool.meta().tiered.iter().find(|t| t.name == name).cloned().ok_or_else(|| {
            CatalogError::Invalid(format!("volume `{name}` was converted but its record is missing"))
        })?;
        let lv = log::open(&self.pool, &rec).await?;
        self.logs.write().insert(name.to_string(), lv);
        Ok(ConvertView {
            name: name.to_string(),
            from_layout: from_layout.unwrap_or_default(),
            layout: req.layout.clone(),
            size_bytes: size,
            data_bytes: counts.0,
            zero_bytes: counts.1,
            seconds: started.elapsed().as_secs_f64(),
        })
    }
}

/// Copies `source` into `lv` step by step, skipping blocks that are all zeros (a new log volume
/// reads zeros there and holds nothing for them), then flushes `lv`. Returns the bytes written
/// and the bytes skipped.
async fn copy<D: BlockDevice>(
    source: &dyn BlockVolume,
    lv: &LogVolume<D>,
    progress: &mut (dyn FnMut(u64, u64) + Send),
) -> Result<(u64, u64), CatalogError> {
    let size = source.size_bytes();
    let (mut data, mut zeros) = (0, 0);
    let mut at = 0;
    while at < size {
        let len = STEP_BYTES.min(size - at);
        let buf = source
            .read(at, usize::try_from(len).expect("a step is 1 MiB at most"))
            .await
            .map_err(TierError::from)?;
        // Runs of blocks that are not all zeros, each written at once.
        let block = BLOCK_USIZE;
        let zero = |i: usize| buf[i * block..(i + 1) * block].iter().all(|&b| b == 0);
        let blocks = buf.len() / block;
        let mut i = 0;
        while i < blocks {
            if zero(i) {
                zeros += BLOCK_BYTES;
                i += 1;
                continue;
            }
            let start = i;
            while i < blocks && !zero(i) {
                i += 1;
            }
            let run = &buf[start * block..i * block];
            let offset = at + (start * block) as u64;
            lv.write(offset, IoBytes::copy_from(run), false).await.map_err(TierError::from)?;
            data += run.len() as u64;
        }
        at += len;
        progress(at, size);
    }
    lv.flush().await.map_err(TierError::from)?;
    Ok((data, zeros))
}

/// Undoes a conversion that failed before its commit: the copy deleted, the plain volume open
/// again. Failures here are logged: open finishes the first (the copy's record says what it
/// replaces), and the second only means the volume serves again after a restart.
async fn give_up<D: BlockDevice>(pool: &Arc<Pool<D>>, temp: &str, name: &str) {
    if let Err(e) = stria_tier::delete(pool, temp).await {
        tracing::warn!(volume = name, copy = temp, error = %e, "could not delete the copy of a failed conversion; the next open deletes it");
    }
    if let Err(e) = pool.reopen_volume(name) {
        tracing::error!(volume = name, error = %e, "could not open the volume again after a failed conversion");
    }
}
