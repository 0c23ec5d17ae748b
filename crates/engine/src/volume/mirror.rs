//! raid0 / raid1 / raid10: W columns of N copies.

use crate::volume::member::MemberDrive;
use std::sync::atomic::Ordering::Relaxed;

use futures::future::join_all;
use stria_dev::{BLOCK_BYTES, BLOCK_USIZE, BlockDevice, IoBuf, IoBytes};

use super::maint::{RowStats, for_each_run};
use super::map::{ChunkRun, Member, Segment, VolumeMap};
use super::{BlockRole, ChunkResult, InFamily, LayoutFamily, RowResult};
use crate::error::EngineError;
use crate::error::VolumeError;
use crate::join::join_all_ok;

/// What one copy gave back for a run, block by block.
struct CopyRead {
    member: usize,
    buf: Option<IoBuf>,
    /// Per block: true when the copy's block is verified good.
    good: Vec<bool>,
    /// Some block failed with an I/O error (not a checksum mismatch).
    io_error: bool,
}

/// The mirror/stripe family (raid0, raid1, raid10): no state beyond the geometry.
pub(crate) struct Mirror;

impl<D: BlockDevice> LayoutFamily<D> for InFamily<'_, Mirror, D> {
    fn failure_groups(&self, _members: usize) -> Vec<Vec<usize>> {
        (0..self.geo.layout.data_columns())
            .map(|c| (0..self.geo.copies()).map(|k| self.geo.mirror_member(c, k)).collect())
            .collect()
    }

    fn fua_by_pool_flush(&self) -> bool {
        false
    }

    fn fast_source<'m>(&self, seg: &'m Segment<D>, run: &ChunkRun) -> Option<(&'m Member<D>, u64)> {
        let m = self.copy_members(run).find(|&m| seg.members[m].usable(run.row))?;
        let member = &seg.members[m];
        Some((member, self.member_block(member, run)))
    }

    async fn read_locked(
        &self,
        map: &VolumeMap<D>,
        run: ChunkRun,
        _spare: Option<IoBuf>,
    ) -> Result<IoBuf, VolumeError> {
        self.mirror_read_locked(map, run).await
    }

    async fn write_runs_locked(
        &self,
        map: &VolumeMap<D>,
        runs: &[ChunkRun],
        data: IoBytes,
        crcs: Option<&[u32]>,
        fua: bool,
    ) -> Result<(), VolumeError> {
        let mut at = 0usize;
        let mut writes = Vec::with_capacity(runs.len());
        for run in runs {
            let len = (run.blocks * BLOCK_BYTES) as usize;
            let run_crcs = crcs.map(|c| &c[at / BLOCK_USIZE..(at + len) / BLOCK_USIZE]);
            writes.push(self.mirror_write_run_locked(map, *run, data.slice(at..at + len), run_crcs, fua));
            at += len;
        }
        join_all_ok(writes).await.map(drop)
    }

    fn unmap_unit_blocks(&self) -> u64 {
        1
    }

    fn cheap_zero_needs_healthy(&self) -> bool {
        false
    }

    fn status_members<'m>(&self, seg: &'m Segment<D>, run: &ChunkRun) -> Vec<&'m Member<D>> {
        (0..self.geo.copies())
            .map(|c| &seg.members[self.geo.mirror_member(run.column, c)])
            .filter(|m| m.usable(run.row))
            .collect()
    }

    fn locate_members(&self, run: &ChunkRun) -> Vec<(usize, BlockRole)> {
        (0..self.geo.copies()).map(|c| (self.geo.mirror_member(run.column, c), BlockRole::Data)).collect()
    }

    async fn unmap_run(&self, map: &VolumeMap<D>, run: &ChunkRun) -> Result<(), VolumeError> {
        let members = (0..self.geo.copies()).map(|c| self.geo.mirror_member(run.column, c));
        self.zero_members(&map.segments[run.segment], run, members).await
    }

    async fn resync(&self, map: &VolumeMap<D>, si: usize, row: u64) -> RowResult {
        let seg = &map.segments[si];
        let chunk = self.geo.chunk_blocks;
        let mut stats = RowStats::default();
        for column in 0..self.geo.layout.data_columns() {
            let mut canonical: Option<(IoBuf, Vec<bool>)> = None;
            for copy in 0..self.geo.copies() {
                let member = &seg.members[self.geo.mirror_member(column, copy)];
                let Some((data, written)) = self.read_member_logical(member, row).await? else { continue };
                let block = member.start_block + row * chunk;
                stats.checked_blocks += chunk;
                match &canonical {
                    None => {
                        self.bless(member, block, &data, &written).await?;
                        canonical = Some((data, written));
                    }
                    Some((want, want_written)) => {
                        let differs: Vec<bool> = (0..chunk as usize)
                            .map(|i| {
                                let r = i * BLOCK_USIZE..(i + 1) * BLOCK_USIZE;
                                want_written[i] != written[i] || want[r.clone()] != data[r]
                            })
                            .collect();
                        self.bless(member, block, &data, &written).await?;
                        let mut runs = Vec::new();
                        for_each_run(&differs, |a, b| runs.push((a, b)));
                        for (a, b) in runs {
                            stats.copy_blocks += (b - a) as u64;
                            let at = block + a as u64;
                            let result = if want_written[a..b].iter().all(|w| !w) {
                                member.drive.zero(at, (b - a) as u64).await
                            } else {
                                let bytes = IoBytes::copy_from(&want[a * BLOCK_USIZE..b * BLOCK_USIZE]);
                                member.drive.write(at, bytes, false).await
                            };
                            if let Err(e) = result {
                                self.drive_error(&member.drive, "resync write failed", &e)
                                    .await
                                    .map_err(|e| self.pool_err(e))?;
                                break;
                            }
                        }
                    }
                }
            }
        }
        Ok(stats)
    }

    async fn scrub_locked(&self, map: &VolumeMap<D>, si: usize, row: u64) -> RowResult {
        let seg = &map.segments[si];
        let chunk = self.geo.chunk_blocks;
        let mut stats = RowStats::default();
        for column in 0..self.geo.layout.data_columns() {
            let run = ChunkRun { segment: si, row, column, offset_in_chunk: 0, blocks: chunk };
            // Verifies every copy and rewrites bad blocks from good ones.
            match self.mirror_read_locked(map, run).await {
                Ok(_) => {}
                Err(VolumeError::Unrecoverable { .. }) => {
                    stats.unrecoverable_blocks += chunk;
                    continue;
                }
                Err(e) => return Err(self.pool_err(e)),
            };
            stats.checked_blocks += chunk * u64::from(self.geo.copies());
            self.scrub_copies_agree(seg, &run, &mut stats).await?;
        }
        Ok(stats)
    }

    async fn rebuild_chunk(&self, map: &VolumeMap<D>, si: usize, mi: usize, row: u64) -> ChunkResult {
        let column = mi as u32 / self.geo.copies();
        let run = ChunkRun { segment: si, row, column, offset_in_chunk: 0, blocks: self.geo.chunk_blocks };
        self.mirror_read_locked(map, run).await.map_err(|e| self.pool_err(e))
    }
}

impl<D: BlockDevice> InFamily<'_, Mirror, D> {
    pub(super) fn copy_members(&self, run: &ChunkRun) -> impl Iterator<Item = usize> + '_ {
        let copies = self.geo.copies();
        // Start at a copy chosen by row so reads of different rows spread over the copies.
        let first = (run.row % u64::from(copies)) as u32;
        let column = run.column;
        (0..copies).map(move |i| self.geo.mirror_member(column, (first + i) % copies))
    }

    pub(super) fn member_block(&self, member: &Member<D>, run: &ChunkRun) -> u64 {
        member.start_block + self.geo.member_block(run.row, run.offset_in_chunk)
    }

    /// Reads a run with the stripe lock held: reads every usable copy, assembles good data
    /// block by block, and rewrites the bad blocks of each copy from a good one.
    pub(super) async fn mirror_read_locked(
        &self,
        map: &VolumeMap<D>,
        run: ChunkRun,
    ) -> Result<IoBuf, VolumeError> {
        let seg = &map.segments[run.segment];
        let len = (run.blocks * BLOCK_BYTES) as usize;
        let n = run.blocks as usize;
        let mut reads: Vec<CopyRead> = Vec::new();
        for m in self.copy_members(&run) {
            let member = &seg.members[m];
            if !member.usable(run.row) {
                continue;
            }
            let read = match member.drive.read_isolating(self.member_block(member, &run), run.blocks).await {
                Some((buf, good, io_error)) => CopyRead { member: m, buf: Some(buf), good, io_error },
                None => CopyRead { member: m, buf: None, good: vec![false; n], io_error: false },
            };
            reads.push(read);
        }
        let mut out = IoBuf::zeroed(len);
        let mut unrecoverable = Vec::new();
        for i in 0..n {
            let source = reads.iter().find(|r| r.good[i]);
            match source.and_then(|r| r.buf.as_ref()) {
                Some(buf) => out[i * BLOCK_USIZE..(i + 1) * BLOCK_USIZE]
                    .copy_from_slice(&buf[i * BLOCK_USIZE..(i + 1) * BLOCK_USIZE]),
                None => unrecoverable.push(i),
            }
        }
        if !unrecoverable.is_empty() {
            for r in reads.iter().filter(|r| r.io_error) {
                self.fail_drive(
                    &seg.members[r.member].drive,
                    "read error that redundancy could not repair".into(),
                )
                .await?;
            }
            let why =
                if reads.is_empty() { "no copy is available" } else { "every copy of the block is bad" };
            self.counters.degraded_reads.fetch_add(1, Relaxed);
            let mut lost = vec![false; n];
            for &i in &unrecoverable {
                lost[i] = true;
            }
            return Err(self.unrecoverable_blocks(&run, &lost, why));
        }
        if reads.len() < self.geo.copies() as usize || reads.iter().any(|r| r.good.contains(&false)) {
            self.counters.degraded_reads.fetch_add(1, Relaxed);
        }
        let out = out.freeze();
        for r in reads.iter().filter(|r| r.good.contains(&false)) {
            self.rewrite_bad_blocks(&seg.members[r.member], &run, &r.good, &out).await?;
        }
        Ok(IoBuf::copy_from(&out))
    }

    /// Rewrites the blocks of `member` marked bad in `good` with the good contents `data`.
    async fn rewrite_bad_blocks(
        &self,
        member: &Member<D>,
        run: &ChunkRun,
        good: &[bool],
        data: &IoBytes,
    ) -> Result<(), VolumeError> {
        let base = self.member_block(member, run);
        let mut i = 0;
        while i < good.len() {
            if good[i] {
                i += 1;
                continue;
            }
            let mut j = i;
            while j < good.len() && !good[j] {
                j += 1;
            }
            let slice = data.slice(i * BLOCK_USIZE..j * BLOCK_USIZE);
            match member.drive.write(base + i as u64, slice, false).await {
                Ok(()) => self.note_repair(&member.drive, base + i as u64, (j - i) as u64),
                Err(e) => {
                    self.drive_error(&member.drive, "repair write failed", &e).await?;
                    return Ok(());
                }
            }
            i = j;
        }
        Ok(())
    }

    /// Writes one run to every usable copy (the caller holds the stripe lock). A copy whose
    /// write fails is failed (persisted) before this returns; the write succeeds if any copy
    /// took it.
    pub(super) async fn mirror_write_run_locked(
        &self,
        map: &VolumeMap<D>,
        run: ChunkRun,
        data: IoBytes,
        crcs: Option<&[u32]>,
        fua: bool,
    ) -> Result<(), VolumeError> {
        let seg = &map.segments[run.segment];
        let targets: Vec<&Member<D>> = (0..self.geo.copies())
            .map(|c| &seg.members[self.geo.mirror_member(run.column, c)])
            .filter(|m| m.usable(run.row))
            .collect();
        let results = match crcs {
            Some(crcs) => {
                join_all(
                    targets
                        .iter()
                        .map(|m| m.drive.write_carrying(self.member_block(m, &run), data.clone(), fua, crcs)),
                )
                .await
            }
            None => {
                join_all(targets.iter().map(|m| m.drive.write(self.member_block(m, &run), data.clone(), fua)))
                    .await
            }
        };
        let mut written = 0;
        for (m, result) in targets.iter().zip(results) {
            match result {
                Ok(()) => written += 1,
                Err(e) => self.drive_error(&m.drive, "write failed", &e).await?,
            }
        }
        if written == 0 {
            return Err(self.unrecoverable(&run, "no copy of the chunk could be written"));
        }
        self.counters.member_write_bytes.fetch_add(written * data.len() as u64, Relaxed);
        Ok(())
    }
}

impl<D: BlockDevice> InFamily<'_, Mirror, D> {
    /// Copies that each verify but disagree cannot come from a crash (resync made them agree)
    /// or from corruption (the checksums would catch it): one of them missed a write. Which one
    /// is decided by evidence, never by which drive answered first: a block held by a strict
    /// majority of the copies is written over the others; with no majority (two copies) the
    /// block is reported as inconsistent and nothing is rewritten.
    async fn scrub_copies_agree(
        &self,
        seg: &super::map::Segment<D>,
        run: &ChunkRun,
        stats: &mut RowStats,
    ) -> Result<(), EngineError> {
        let chunk = self.geo.chunk_blocks;
        let mut copies: Vec<(&Member<D>, IoBuf)> = Vec::new();
        for m in self.copy_members(run) {
            let member = &seg.members[m];
            if !member.usable(run.row) {
                continue;
            }
            let block = self.member_block(member, run);
            if let Ok(buf) =
                member.drive.read_verified(block, IoBuf::zeroed((chunk * BLOCK_BYTES) as usize)).await
            {
                copies.push((member, buf));
            }
        }
        for i in 0..chunk as usize {
            let r = i * BLOCK_USIZE..(i + 1) * BLOCK_USIZE;
            if copies.iter().all(|(_, b)| b[r.clone()] == copies[0].1[r.clone()]) {
                continue;
            }
            let majority = copies.iter().find(|(_, b)| {
                2 * copies.iter().filter(|(_, o)| o[r.clone()] == b[r.clone()]).count() > copies.len()
            });
            let Some((_, winner)) = majority else {
                tracing::error!(volume = %self.name, row = run.row, block = i, "mirror copies disagree and no majority says which is current; not rewritten");
                stats.inconsistent_blocks += 1;
                continue;
            };
            let good = IoBytes::copy_from(&winner[r.clone()]);
            for (member, b) in &copies {
                if b[r.clone()] == good[..] {
                    continue;
                }
                stats.copy_blocks += 1;
                let at = self.member_block(member, run) + i as u64;
                tracing::warn!(volume = %self.name, slot = member.drive.slot(), row = run.row, block = i, "rewriting a mirror copy outvoted by the others");
                if let Err(e) = member.drive.write(at, good.clone(), false).await {
                    self.drive_error(&member.drive, "scrub write failed", &e)
                        .await
                        .map_err(|e| self.pool_err(e))?;
                }
            }
        }
        Ok(())
    }
}
