//! Row maintenance: resynchronisation after an unclean stop, and scrub.
//!
//! *Resync* trusts the data it finds (the checksums of a dirty region may lag it): it takes the
//! logical contents (zeros for unwritten blocks, raw bytes otherwise), makes checksums match
//! them, makes mirror copies agree and recomputes parity. *Scrub* trusts the checksums: it
//! verifies every block, repairs the bad ones from redundancy, then checks that parity (or the
//! copies) agree with the verified data.

use stria_dev::{BLOCK_BYTES, BLOCK_USIZE, BlockDevice, DevError, IoBuf, IoBytes};

use super::ec::Ec;
use super::map::{ChunkRun, Member, VolumeMap};
use super::mirror::Mirror;
use super::{Family, InFamily, Volume};
use crate::drive::Drive;
use crate::drive::csum::{UNWRITTEN, block_crc};
use crate::error::{EngineError, VolumeError};

/// What maintenance of one row did.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct RowStats {
    pub(crate) checked_blocks: u64,
    pub(crate) parity_blocks: u64,
    pub(crate) copy_blocks: u64,
    pub(crate) unrecoverable_blocks: u64,
    /// Blocks whose copies (or data and parity) all verify but disagree, with no evidence of
    /// which one is current: reported, not rewritten.
    pub(crate) inconsistent_blocks: u64,
}

/// Reads blocks without verification, zeroing the unwritten ones; says which are written.
async fn read_logical<D: BlockDevice>(
    drive: &Drive<D>,
    block: u64,
    blocks: u64,
) -> Result<(IoBuf, Vec<bool>), DevError> {
    let mut buf = drive.read_raw(block, IoBuf::zeroed((blocks * BLOCK_BYTES) as usize)).await?;
    let written: Vec<bool> = (0..blocks).map(|i| drive.csum.get(block + i) != UNWRITTEN).collect();
    for (i, w) in written.iter().enumerate() {
        if !w {
            buf[i * BLOCK_USIZE..(i + 1) * BLOCK_USIZE].fill(0);
        }
    }
    Ok((buf, written))
}

/// Makes the checksum of every written block match its contents.
fn bless<D: BlockDevice>(drive: &Drive<D>, block: u64, data: &[u8], written: &[bool]) {
    for (i, w) in written.iter().enumerate() {
        if *w {
            drive.csum.set(block + i as u64, block_crc(&data[i * BLOCK_USIZE..(i + 1) * BLOCK_USIZE]));
        }
    }
}

/// Calls `f(first, end)` for each run of consecutive indices where `bad[i]` is true.
fn for_each_run(bad: &[bool], mut f: impl FnMut(usize, usize)) {
    let mut i = 0;
    while i < bad.len() {
        if !bad[i] {
            i += 1;
            continue;
        }
        let mut j = i;
        while j < bad.len() && bad[j] {
            j += 1;
        }
        f(i, j);
        i = j;
    }
}

impl<D: BlockDevice> Volume<D> {
    fn pool_err(&self, e: VolumeError) -> EngineError {
        EngineError::Volume(e)
    }

    /// Resynchronises row `row` of segment `si` (recovery; no I/O runs concurrently).
    pub(crate) async fn resync_row(
        &self,
        map: &VolumeMap<D>,
        si: usize,
        row: u64,
    ) -> Result<RowStats, EngineError> {
        match &self.family {
            Family::Ec(fam) => InFamily { vol: self, fam }.resync_ec_row(map, si, row).await,
            Family::Mirror(_) => self.resync_mirror_row(map, si, row).await,
        }
    }

    async fn read_member_logical(
        &self,
        member: &Member<D>,
        row: u64,
    ) -> Result<Option<(IoBuf, Vec<bool>)>, EngineError> {
        if !member.usable(row) {
            return Ok(None);
        }
        let block = member.start_block + row * self.geo.chunk_blocks;
        match read_logical(&member.drive, block, self.geo.chunk_blocks).await {
            Ok(r) => Ok(Some(r)),
            Err(e) => {
                self.fail_drive(&member.drive, format!("read failed during resync: {e}"))
                    .await
                    .map_err(|e| self.pool_err(e))?;
                Ok(None)
            }
        }
    }

    async fn resync_mirror_row(
        &self,
        map: &VolumeMap<D>,
        si: usize,
        row: u64,
    ) -> Result<RowStats, EngineError> {
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
                        bless(&member.drive, block, &data, &written);
                        canonical = Some((data, written));
                    }
                    Some((want, want_written)) => {
                        let differs: Vec<bool> = (0..chunk as usize)
                            .map(|i| {
                                let r = i * BLOCK_USIZE..(i + 1) * BLOCK_USIZE;
                                want_written[i] != written[i] || want[r.clone()] != data[r]
                            })
                            .collect();
                        bless(&member.drive, block, &data, &written);
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
                                self.fail_drive(&member.drive, format!("resync write failed: {e}"))
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

    /// Scrubs row `row` of segment `si` under its stripe lock.
    pub(crate) async fn scrub_row(
        &self,
        map: &VolumeMap<D>,
        si: usize,
        row: u64,
    ) -> Result<RowStats, EngineError> {
        let _guard = self.locks.lock([(si, row)]).await;
        match &self.family {
            Family::Ec(fam) => InFamily { vol: self, fam }.scrub_ec_row(map, si, row).await,
            Family::Mirror(fam) => InFamily { vol: self, fam }.scrub_mirror_row(map, si, row).await,
        }
    }

    /// Rewrites, on parity member `member` of row `row`, the blocks of its chunk where `have`
    /// (what it holds) differs from `want` (what it should hold), in runs. Returns how many
    /// blocks it counted as fixed; a write that fails fails the drive (`what` names the
    /// caller in the reason) and stops there.
    async fn rewrite_differing(
        &self,
        member: &Member<D>,
        row: u64,
        want: &[u8],
        have: &[u8],
        what: &str,
    ) -> Result<u64, EngineError> {
        let chunk = self.geo.chunk_blocks;
        let differs: Vec<bool> =
            want.chunks_exact(BLOCK_USIZE).zip(have.chunks_exact(BLOCK_USIZE)).map(|(w, h)| w != h).collect();
        let mut runs = Vec::new();
        for_each_run(&differs, |a, b| runs.push((a, b)));
        let mut fixed = 0;
        for (a, b) in runs {
            fixed += (b - a) as u64;
            let bytes = IoBytes::copy_from(&want[a * BLOCK_USIZE..b * BLOCK_USIZE]);
            if let Err(e) =
                member.drive.write(member.start_block + row * chunk + a as u64, bytes, false).await
            {
                self.fail_drive(&member.drive, format!("{what} write failed: {e}"))
                    .await
                    .map_err(|e| self.pool_err(e))?;
                break;
            }
        }
        Ok(fixed)
    }
}

impl<D: BlockDevice> Volume<D> {
    /// Rebuilds row `row` of member `mi` of segment `si` from the other members, writes it to the
    /// member and advances its cursor, all under the stripe lock.
    pub(crate) async fn rebuild_row(
        &self,
        map: &VolumeMap<D>,
        si: usize,
        mi: usize,
        row: u64,
    ) -> Result<(), EngineError> {
        let _guard = self.locks.lock([(si, row)]).await;
        let seg = &map.segments[si];
        let member = &seg.members[mi];
        let chunk = self.geo.chunk_blocks;
        let data = match &self.family {
            Family::Ec(fam) => {
                let f = InFamily { vol: self, fam };
                let (k, m) = f.ec_shape();
                let shard = self.geo.ec_shard(row, mi) as usize;
                let mut skip = vec![false; k + m];
                skip[shard] = true;
                let mut reads = f.read_shards(seg, row, 0, chunk, &skip).await;
                let mut want = vec![false; k + m];
                want[shard] = true;
                if !f.decode_rows(&mut reads, &want).is_empty() {
                    let run = ChunkRun { segment: si, row, column: 0, offset_in_chunk: 0, blocks: chunk };
                    return Err(
                        self.pool_err(self.unrecoverable(&run, "too few members left to rebuild the stripe"))
                    );
                }
                reads.swap_remove(shard).buf.expect("decoded")
            }
            Family::Mirror(fam) => {
                let f = InFamily { vol: self, fam };
                let column = mi as u32 / self.geo.copies();
                let run = ChunkRun { segment: si, row, column, offset_in_chunk: 0, blocks: chunk };
                f.mirror_read_locked(map, run).await.map_err(|e| self.pool_err(e))?
            }
        };
        // All-zero blocks stay unwritten on the new member (sparse volumes stay sparse).
        let zero: Vec<bool> = data.chunks_exact(BLOCK_USIZE).map(|b| b.iter().all(|&x| x == 0)).collect();
        let nonzero: Vec<bool> = zero.iter().map(|z| !z).collect();
        let base = member.start_block + row * chunk;
        let data = data.freeze();
        let mut ops = Vec::new();
        for_each_run(&nonzero, |a, b| ops.push((a, b, true)));
        for_each_run(&zero, |a, b| ops.push((a, b, false)));
        for (a, b, write) in ops {
            let result = if write {
                member.drive.write(base + a as u64, data.slice(a * BLOCK_USIZE..b * BLOCK_USIZE), false).await
            } else {
                member.drive.zero(base + a as u64, (b - a) as u64).await
            };
            if let Err(e) = result {
                self.fail_drive(&member.drive, format!("rebuild write failed: {e}"))
                    .await
                    .map_err(|e| self.pool_err(e))?;
                return Err(EngineError::Busy(format!(
                    "the replacement drive failed during the rebuild: {e}"
                )));
            }
        }
        member.rebuild_cursor.store(row + 1, std::sync::atomic::Ordering::Release);
        Ok(())
    }
}

impl<D: BlockDevice> InFamily<'_, Mirror, D> {
    async fn scrub_mirror_row(
        &self,
        map: &VolumeMap<D>,
        si: usize,
        row: u64,
    ) -> Result<RowStats, EngineError> {
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
                    self.fail_drive(&member.drive, format!("scrub write failed: {e}"))
                        .await
                        .map_err(|e| self.pool_err(e))?;
                }
            }
        }
        Ok(())
    }
}

impl<D: BlockDevice> InFamily<'_, Ec, D> {
    async fn resync_ec_row(&self, map: &VolumeMap<D>, si: usize, row: u64) -> Result<RowStats, EngineError> {
        let seg = &map.segments[si];
        let (k, m) = self.ec_shape();
        let chunk = self.geo.chunk_blocks;
        let mut stats = RowStats::default();
        let mut shards: Vec<Option<IoBuf>> = Vec::with_capacity(k + m);
        for s in 0..k + m {
            let (_, member) = self.shard_member(seg, row, s);
            let read = self.read_member_logical(member, row).await?;
            if let Some((data, written)) = &read {
                bless(&member.drive, member.start_block + row * chunk, data, written);
                stats.checked_blocks += chunk;
            }
            shards.push(read.map(|r| r.0));
        }
        if shards.iter().any(Option::is_none) {
            // Degraded: parity cannot be checked against missing data; writes to degraded
            // stripes are journaled, so the replay already made them consistent.
            return Ok(stats);
        }
        let data: Vec<IoBuf> = shards.drain(..k).map(|s| s.expect("present")).collect();
        let parity = self.encode_rows(&data, chunk);
        for (p, (want, have)) in
            parity.iter().zip(shards.iter().map(|s| s.as_ref().expect("present"))).enumerate()
        {
            let (_, member) = self.shard_member(seg, row, k + p);
            stats.parity_blocks += self.rewrite_differing(member, row, want, have, "resync").await?;
        }
        Ok(stats)
    }

    async fn scrub_ec_row(&self, map: &VolumeMap<D>, si: usize, row: u64) -> Result<RowStats, EngineError> {
        let seg = &map.segments[si];
        let (k, m) = self.ec_shape();
        let total = k + m;
        let chunk = self.geo.chunk_blocks;
        let mut stats = RowStats { checked_blocks: chunk * total as u64, ..RowStats::default() };
        let mut reads = self.read_shards(seg, row, 0, chunk, &vec![false; total]).await;
        let before: Vec<Vec<bool>> = reads.iter().map(|r| r.good.clone()).collect();
        let want: Vec<bool> = (0..total).map(|s| self.shard_member(seg, row, s).1.usable(row)).collect();
        let failed_rows = self.decode_rows(&mut reads, &want);
        stats.unrecoverable_blocks += failed_rows.len() as u64;
        self.write_repairs(seg, row, 0, &reads, &before).await.map_err(|e| self.pool_err(e))?;
        if !failed_rows.is_empty() || !want.iter().all(|&w| w) {
            return Ok(stats);
        }
        // Every shard is present and verified: parity must agree with the data. Where it does
        // not, one shard missed a write; which one is decided by the others, never assumed.
        let shards: Vec<IoBuf> = reads.drain(..).map(|r| r.buf.expect("present")).collect();
        let parity = self.encode_rows(&shards[..k], chunk);
        for line in 0..chunk as usize {
            let r = line * BLOCK_USIZE..(line + 1) * BLOCK_USIZE;
            if parity.iter().zip(&shards[k..]).all(|(want, have)| want[r.clone()] == have[r.clone()]) {
                continue;
            }
            match self.odd_shard_out(&shards, r.clone()) {
                Some((bad, content)) => {
                    let (_, member) = self.shard_member(seg, row, bad);
                    tracing::warn!(volume = %self.name, slot = member.drive.slot(), row, block = line, shard = bad, "rewriting the one shard the others outvote");
                    let at = member.start_block + row * chunk + line as u64;
                    if bad < k {
                        stats.copy_blocks += 1;
                    } else {
                        stats.parity_blocks += 1;
                    }
                    if let Err(e) = member.drive.write(at, IoBytes::copy_from(&content), false).await {
                        self.fail_drive(&member.drive, format!("scrub write failed: {e}"))
                            .await
                            .map_err(|e| self.pool_err(e))?;
                    }
                }
                None => {
                    tracing::error!(volume = %self.name, row, block = line, "data and parity disagree and no single shard explains it; not rewritten");
                    stats.inconsistent_blocks += 1;
                }
            }
        }
        Ok(stats)
    }

    /// The one shard of a block line that disagrees with all the others: for each shard, decode
    /// the line from K of the rest and check the remaining ones agree. Returns the shard and its
    /// content as the others imply, when exactly one shard explains the disagreement (this needs
    /// M >= 2: with one parity shard any shard explains it).
    fn odd_shard_out(&self, shards: &[IoBuf], r: std::ops::Range<usize>) -> Option<(usize, Vec<u8>)> {
        let (k, m) = self.ec_shape();
        if m < 2 {
            return None;
        }
        let total = k + m;
        let mut found = None;
        for suspect in 0..total {
            let sources_idx: Vec<usize> = (0..total).filter(|&s| s != suspect).take(k).collect();
            let mut sources: Vec<Option<&[u8]>> = vec![None; total];
            for &s in &sources_idx {
                sources[s] = Some(&shards[s][r.clone()]);
            }
            let rest: Vec<usize> = (0..total).filter(|s| !sources_idx.contains(s)).collect();
            let mut outs: Vec<Vec<u8>> = rest.iter().map(|_| vec![0u8; r.len()]).collect();
            {
                let mut targets: Vec<(usize, &mut [u8])> =
                    rest.iter().copied().zip(outs.iter_mut().map(|o| &mut o[..])).collect();
                self.codec().reconstruct(&sources, &mut targets).expect("shapes are consistent");
            }
            let agree = rest.iter().zip(&outs).all(|(&s, o)| s == suspect || shards[s][r.clone()] == o[..]);
            if agree {
                if found.is_some() {
                    return None;
                }
                let at = rest.iter().position(|&s| s == suspect).expect("suspect is decoded");
                found = Some((suspect, outs.swap_remove(at)));
            }
        }
        found
    }
}
