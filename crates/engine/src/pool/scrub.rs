//! Scrub: verify every block of a volume, repair what fails, check parity and copies agree.

use std::sync::atomic::Ordering::Relaxed;

use stria_dev::BlockDevice;

use super::Pool;
use crate::error::EngineError;

/// What a scrub found and did.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ScrubReport {
    pub volume: String,
    pub rows: u64,
    /// Blocks read and verified (data, parity and copies).
    pub blocks_checked: u64,
    /// Blocks that failed their checksum or could not be read and were rewritten from redundancy.
    pub blocks_repaired: u64,
    /// Parity blocks that disagreed with verified data and were recomputed.
    pub parity_blocks_fixed: u64,
    /// Mirror copy blocks that disagreed and were made to agree.
    pub copy_blocks_fixed: u64,
    /// Blocks that could not be verified or repaired (more damage than the layout covers).
    pub unrecoverable_blocks: u64,
    /// Blocks whose copies (or data and parity) each verify but disagree, with nothing to say
    /// which is current (two mirror copies, or one parity shard): reported, left as they are.
    pub inconsistent_blocks: u64,
}

impl ScrubReport {
    /// Adds the counters of `other` (a part of the same volume) to these.
    pub fn add(&mut self, other: &ScrubReport) {
        self.rows += other.rows;
        self.blocks_checked += other.blocks_checked;
        self.blocks_repaired += other.blocks_repaired;
        self.parity_blocks_fixed += other.parity_blocks_fixed;
        self.copy_blocks_fixed += other.copy_blocks_fixed;
        self.unrecoverable_blocks += other.unrecoverable_blocks;
        self.inconsistent_blocks += other.inconsistent_blocks;
    }
}

impl<D: BlockDevice> Pool<D> {
    /// Scrubs volume `name`; `progress(rows_done, rows_total)` is called as rows complete.
    pub async fn scrub(
        &self,
        name: &str,
        mut progress: impl FnMut(u64, u64),
    ) -> Result<ScrubReport, EngineError> {
        let vol = self.volume(name).ok_or_else(|| EngineError::NoSuchVolume(name.into()))?;
        let map = vol.current_map();
        let total: u64 = map.segments.iter().map(|s| s.rows).sum();
        let repaired_before = vol.counters().repaired_blocks.load(Relaxed);
        let mut report = ScrubReport { volume: name.to_string(), rows: total, ..ScrubReport::default() };
        let mut done = 0;
        for (si, seg) in map.segments.iter().enumerate() {
            for row in 0..seg.rows {
                let _op = vol.enter_op()?;
                let turn =
                    self.background_turn(crate::qos::SCRUB_FLOW, &vol, crate::qos::OpKind::Scrub).await;
                let stats = vol.scrub_row(&map, si, row).await?;
                drop(turn);
                report.blocks_checked += stats.checked_blocks;
                report.parity_blocks_fixed += stats.parity_blocks;
                report.copy_blocks_fixed += stats.copy_blocks;
                report.unrecoverable_blocks += stats.unrecoverable_blocks;
                report.inconsistent_blocks += stats.inconsistent_blocks;
                done += 1;
                progress(done, total);
            }
        }
        report.blocks_repaired = vol.counters().repaired_blocks.load(Relaxed) - repaired_before;
        // What the scrub found must outlive this process (it may be a one-off `stria scrub`).
        self.core.commit_drive_errors().await?;
        tracing::info!(?report, "scrub done");
        Ok(report)
    }
}
