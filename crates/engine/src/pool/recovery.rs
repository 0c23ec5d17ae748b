//! Recovery after an unclean stop: replay the journals, then resynchronise what the intent
//! bitmaps say may be inconsistent. See docs/crash-consistency.md for why this suffices.

use std::collections::{BTreeMap, BTreeSet};

use stria_dev::BlockDevice;

use super::Pool;
use crate::drive::journal::RecoveredPiece;
use crate::drive::{OpenFindings, Watermarks};
use crate::error::EngineError;
use crate::format::layout::{CSUM_ENTRIES_PER_PAGE, INTENT_REGION_BLOCKS};
use crate::volume::Volume;
use crate::volume::map::VolumeMap;

/// What recovery did when the pool was opened.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RecoveryReport {
    /// Journal transactions found complete and applied again.
    pub journal_txns_replayed: u64,
    /// Journal transactions found incomplete (never applied in place) and dropped.
    pub journal_txns_dropped: u64,
    /// Intent regions found dirty.
    pub dirty_regions: u64,
    /// Checksum pages found damaged (their blocks were resynchronised).
    pub bad_csum_pages: u64,
    /// Stripes (rows) resynchronised.
    pub rows_resynced: u64,
    /// Parity blocks rewritten because they disagreed with the data.
    pub parity_blocks_rewritten: u64,
    /// Mirror copy blocks rewritten because the copies disagreed.
    pub copy_blocks_rewritten: u64,
    /// Rows of an extent being moved copied again to its destination, so that the move resumes
    /// at its committed cursor (docs/design/pool-growth.md, "Resuming a move").
    #[serde(default)]
    pub move_rows_recopied: u64,
}

/// The rows (segment index, row) of `vol` that the drive ranges in `dirty` (slot -> (first
/// block, blocks) in the drive's data area) touch.
pub(super) fn dirty_rows<D: BlockDevice>(
    vol: &Volume<D>,
    map: &VolumeMap<D>,
    dirty: &BTreeMap<u32, Vec<(u64, u64)>>,
) -> BTreeSet<(usize, u64)> {
    let mut rows = BTreeSet::new();
    for (si, seg) in map.segments.iter().enumerate() {
        let extent = seg.rows * vol.geometry().chunk_blocks;
        for m in &seg.members {
            for &(start, len) in dirty.get(&m.drive.slot()).map(Vec::as_slice).unwrap_or(&[]) {
                let lo = start.max(m.start_block);
                let hi = (start + len).min(m.start_block + extent);
                if lo < hi {
                    let first_row = (lo - m.start_block) / vol.geometry().chunk_blocks;
                    let last_row = (hi - 1 - m.start_block) / vol.geometry().chunk_blocks;
                    rows.extend((first_row..=last_row).map(|r| (si, r)));
                }
            }
        }
    }
    rows
}

impl<D: BlockDevice> Pool<D> {
    pub(super) async fn recover(
        &self,
        findings: Vec<(u32, OpenFindings)>,
    ) -> Result<RecoveryReport, EngineError> {
        let mut report = RecoveryReport::default();
        let mut dirty: BTreeMap<u32, Vec<(u64, u64)>> = BTreeMap::new();
        let mut txns: BTreeMap<u64, Vec<(u32, RecoveredPiece)>> = BTreeMap::new();
        let mut bad_pages: Vec<(u32, Vec<u64>)> = Vec::new();
        // Any drive's watermarks are pool-wide facts (written after the drives of the
        // transactions they cover were flushed): a transaction at or below the highest mark any
        // drive gives its volume is applied and durable, and is not replayed (it may have been
        // overwritten since by a durable write that no journal holds).
        let marks: Vec<Watermarks> = findings.iter().map(|(_, f)| f.watermarks.clone()).collect();
        let durable_to = |volume: u64| marks.iter().map(|m| m.of(volume)).max().unwrap_or(0);
        for (slot, f) in findings {
            report.dirty_regions += f.dirty_regions.len() as u64;
            report.bad_csum_pages += f.bad_csum_pages.len() as u64;
            let ranges = dirty.entry(slot).or_default();
            for r in f.dirty_regions {
                ranges.push((r * INTENT_REGION_BLOCKS, INTENT_REGION_BLOCKS));
            }
            for &p in &f.bad_csum_pages {
                ranges.push((p * CSUM_ENTRIES_PER_PAGE, CSUM_ENTRIES_PER_PAGE));
            }
            bad_pages.push((slot, f.bad_csum_pages));
            for piece in f.journal {
                txns.entry(piece.piece.txn_id).or_default().push((slot, piece));
            }
        }
        txns.retain(|&id, pieces| id > durable_to(pieces[0].1.piece.volume_id));
        let replayed = self.replay(txns, &mut report).await?;
        let had_work = report.journal_txns_replayed + report.journal_txns_dropped > 0
            || dirty.values().any(|r| !r.is_empty());
        if !had_work {
            // A move cut by a clean close resumes at its cursor (nothing needs copying again).
            report.move_rows_recopied = self.resume_move(&dirty).await?;
            return Ok(report);
        }
        for vol in self.volumes() {
            let map = vol.current_map();
            for (si, row) in dirty_rows(&vol, &map, &dirty) {
                let stats = vol.resync_row(&map, si, row).await?;
                report.rows_resynced += 1;
                report.parity_blocks_rewritten += stats.parity_blocks;
                report.copy_blocks_rewritten += stats.copy_blocks;
            }
        }
        // The source of a move is right now; where the destination may differ from it below
        // the move's cursor, it is copied again (replayed pieces were written without a shadow).
        for (slot, range) in replayed {
            dirty.entry(slot).or_default().push(range);
        }
        report.move_rows_recopied = self.resume_move(&dirty).await?;
        // Every written block of the damaged checksum pages now has its entry from its contents.
        for (slot, pages) in bad_pages {
            if let Some(d) = self.core.drive(slot).filter(|d| !d.is_failed()) {
                d.csum.mark_repaired(&pages);
            }
        }
        // Make the result durable, checkpoint the replayed records and start with a clean bitmap.
        self.core.flush_all().await?;
        for d in self.core.drives().iter().filter(|d| !d.is_failed()) {
            if let Err(e) = d.clear_idle_intents(true).await {
                // Everything is durable; a bit left set only costs a resync at the next open.
                self.core.drive_error(d.slot(), "intent bitmap write", &e).await?;
            }
        }
        tracing::info!(?report, "recovery done");
        Ok(report)
    }

    /// Applies every complete journal transaction again, oldest first; returns the drive
    /// ranges (slot, (first block, blocks)) it wrote.
    async fn replay(
        &self,
        txns: BTreeMap<u64, Vec<(u32, RecoveredPiece)>>,
        report: &mut RecoveryReport,
    ) -> Result<Vec<(u32, (u64, u64))>, EngineError> {
        let mut written = Vec::new();
        for (txn, pieces) in txns {
            let slots = &pieces[0].1.piece.piece_slots;
            // Above the watermark no record was ever released, so a transaction missing its
            // piece on a live drive was never fully journaled, hence never applied in place.
            let complete = slots.iter().all(|&s| {
                let live = self.core.drive(u32::from(s)).is_some_and(|d| !d.is_failed());
                !live || pieces.iter().any(|(slot, _)| *slot == u32::from(s))
            });
            if !complete {
                report.journal_txns_dropped += 1;
                tracing::debug!(txn, "dropping incomplete journal transaction");
                continue;
            }
            report.journal_txns_replayed += 1;
            for (slot, p) in pieces {
                tracing::debug!(txn, slot, seq = p.seq, "replaying journal piece");
                let Some(drive) = self.core.drive(slot).filter(|d| !d.is_failed()) else { continue };
                let blocks = (p.piece.data.len() as u64).div_ceil(stria_dev::BLOCK_BYTES);
                written.push((slot, (p.piece.target_block, blocks)));
                if let Err(e) =
                    drive.write_with_crcs(p.piece.target_block, p.piece.data.clone(), &p.piece.crcs).await
                {
                    self.core.drive_error(slot, "journal replay write failed", &e).await?;
                }
            }
        }
        Ok(written)
    }
}
