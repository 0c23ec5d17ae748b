//! Erasure-coded layout: K data + M parity chunks per stripe, parity rotated per stripe.

use crate::volume::member::MemberDrive;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use futures::future::join_all;

use crate::join::join_all_ok;
use stria_dev::{BLOCK_BYTES, BLOCK_USIZE, BlockDevice, IoBuf, IoBytes};
use stria_ec::ReedSolomon;

use super::maint::RowStats;
use super::map::{ChunkRun, Member, Segment, VolumeMap};
use super::{BlockRole, ChunkResult, InFamily, LayoutFamily, RowResult};
use crate::drive::journal::{AppendError, JournalPiece};
use crate::error::VolumeError;

/// How long a partial-stripe write waits for room in a full journal ring before it fails. The
/// records in a ring are released as soon as their transactions are applied in place and a
/// flush checkpoints them, which takes milliseconds; only a drive that stops answering (its
/// in-place writes never return) keeps a ring full for long.
const JOURNAL_FULL_WAIT: std::time::Duration = std::time::Duration::from_secs(30);
/// The longest a writer waiting for journal room sleeps between flushes when no transaction
/// is applied meanwhile.
const JOURNAL_FULL_POLL: std::time::Duration = std::time::Duration::from_millis(10);
/// Most members an ec stripe has (`Layout::validate` bounds K + M), for stack arrays.
const MAX_SHARDS: usize = 64;

/// The new data of one stripe: per data shard, the range written (offset in chunk, bytes).
struct StripeWrite<'a> {
    segment: usize,
    row: u64,
    shards: Vec<Option<(u64, IoBytes)>>,
    /// Per data shard, the checksums of its blocks when the writer carried them in (only a
    /// full stripe uses them: a partial one journals blocks it makes itself).
    crcs: Vec<Option<&'a [u32]>>,
}

/// One shard's blocks over a row range, as read (None: unavailable), with per-block validity.
pub(super) struct ShardRead {
    pub(super) buf: Option<IoBuf>,
    pub(super) good: Vec<bool>,
    /// The drive answered with an I/O error (not a checksum mismatch).
    pub(super) io_error: bool,
}

/// A block range to write on one member as part of a stripe update.
struct Piece {
    member: usize,
    block: u64,
    data: IoBytes,
    /// True when the write replaces bad blocks (counted as a repair).
    repair: bool,
}

/// The erasure-coded family: its codec (shared by the pool's volumes of one shape).
pub(crate) struct Ec {
    pub(crate) codec: Arc<ReedSolomon>,
}

impl<D: BlockDevice> LayoutFamily<D> for InFamily<'_, Ec, D> {
    fn failure_groups(&self, members: usize) -> Vec<Vec<usize>> {
        vec![(0..members).collect()]
    }

    fn fua_by_pool_flush(&self) -> bool {
        true
    }

    /// Reads a run with the stripe lock held, reconstructing what is missing or bad and
    /// rewriting bad blocks on members that are still usable.
    async fn read_locked(
        &self,
        map: &VolumeMap<D>,
        run: ChunkRun,
        spare: Option<IoBuf>,
    ) -> Result<IoBuf, VolumeError> {
        let seg = &map.segments[run.segment];
        let target = run.column as usize;
        let (_, target_member) = self.shard_member(seg, run.row, target);
        // Someone may have fixed things while we waited for the lock (or the fault was a race).
        let target_usable = target_member.usable(run.row);
        if target_usable {
            let block = target_member.start_block + self.geo.member_block(run.row, run.offset_in_chunk);
            if let Ok(buf) = target_member
                .drive
                .read_verified(block, IoBuf::zeroed((run.blocks * BLOCK_BYTES) as usize))
                .await
            {
                return Ok(buf);
            }
        }
        self.counters.degraded_reads.fetch_add(1, Relaxed);
        // The member is gone: K survivors are enough when they all read back good.
        if !target_usable && let Some(buf) = self.ec_read_from_survivors(seg, &run, spare).await {
            return Ok(buf);
        }
        let total = seg.members.len();
        let mut reads =
            self.read_shards(seg, run.row, run.offset_in_chunk, run.blocks, &vec![false; total]).await;
        let before: Vec<Vec<bool>> = reads.iter().map(|r| r.good.clone()).collect();
        // Rebuild the target and any bad block on a usable member (a repair).
        let want: Vec<bool> =
            (0..total).map(|s| s == target || self.shard_member(seg, run.row, s).1.usable(run.row)).collect();
        let failed_rows = self.decode_rows(&mut reads, &want);
        drop(failed_rows); // rows that could not be decoded for other shards just stay unrepaired
        if !reads[target].good.iter().all(|&g| g) {
            self.fail_unrepairable(seg, run.row, &reads).await?;
            let lost: Vec<bool> = reads[target].good.iter().map(|&g| !g).collect();
            return Err(self.unrecoverable_blocks(
                &run,
                &lost,
                "more chunks of the stripe are missing or corrupt than its parity covers",
            ));
        }
        self.write_repairs(seg, run.row, run.offset_in_chunk, &reads, &before).await?;
        Ok(reads.swap_remove(target).buf.expect("target decoded"))
    }

    fn fast_source<'m>(&self, seg: &'m Segment<D>, run: &ChunkRun) -> Option<(&'m Member<D>, u64)> {
        let (_, member) = self.shard_member(seg, run.row, run.column as usize);
        member
            .usable(run.row)
            .then(|| (member, member.start_block + self.geo.member_block(run.row, run.offset_in_chunk)))
    }

    /// Writes block-aligned `data` covering `runs` (the caller holds the stripe locks).
    async fn write_runs_locked(
        &self,
        map: &VolumeMap<D>,
        runs: &[ChunkRun],
        data: IoBytes,
        crcs: Option<&[u32]>,
        fua: bool,
    ) -> Result<(), VolumeError> {
        let (k, _) = self.ec_shape();
        let mut stripes: Vec<StripeWrite> = Vec::new();
        let mut at = 0usize;
        for run in runs {
            let len = (run.blocks * BLOCK_BYTES) as usize;
            let slice = data.slice(at..at + len);
            let run_crcs = crcs.map(|c| &c[at / BLOCK_USIZE..(at + len) / BLOCK_USIZE]);
            at += len;
            match stripes.last_mut() {
                Some(s) if s.segment == run.segment && s.row == run.row => {
                    s.shards[run.column as usize] = Some((run.offset_in_chunk, slice));
                    s.crcs[run.column as usize] = run_crcs;
                }
                _ => {
                    let mut shards = vec![None; k];
                    shards[run.column as usize] = Some((run.offset_in_chunk, slice));
                    let mut crcs = vec![None; k];
                    crcs[run.column as usize] = run_crcs;
                    stripes.push(StripeWrite { segment: run.segment, row: run.row, shards, crcs });
                }
            }
        }
        join_all_ok(stripes.into_iter().map(|s| self.ec_write_stripe_locked(map, s, fua))).await.map(drop)
    }

    fn unmap_unit_blocks(&self) -> u64 {
        self.geo.row_blocks()
    }

    /// A degraded ec stripe is zeroed through the journal (see `unmap_run`), not cheaply.
    fn cheap_zero_needs_healthy(&self) -> bool {
        true
    }

    /// The data block's own member; when it is not usable, every usable member of the row:
    /// parity is non-zero whenever any data block of the row was written.
    fn status_members<'m>(&self, seg: &'m Segment<D>, run: &ChunkRun) -> Vec<&'m Member<D>> {
        let own = &seg.members[self.geo.ec_member(run.row, run.column)];
        if own.usable(run.row) {
            vec![own]
        } else {
            seg.members.iter().filter(|m| m.usable(run.row)).collect()
        }
    }

    fn locate_members(&self, run: &ChunkRun) -> Vec<(usize, BlockRole)> {
        let (k, m) = (self.fam.codec.data_shards() as u32, self.fam.codec.parity_shards() as u32);
        let parity = (k..k + m).map(|p| (self.geo.ec_member(run.row, p), BlockRole::Parity));
        std::iter::once((self.geo.ec_member(run.row, run.column), BlockRole::Data)).chain(parity).collect()
    }

    async fn unmap_run(&self, map: &VolumeMap<D>, run: &ChunkRun) -> Result<(), VolumeError> {
        assert!(
            run.offset_in_chunk == 0 && run.blocks == self.geo.chunk_blocks,
            "invariant: ec unmaps whole chunks of whole rows (parity is zeroed with them); got {run:?}"
        );
        let seg = &map.segments[run.segment];
        if !seg.members.iter().all(|m| m.durably_usable(run.row)) {
            // Entry-only zeroing is safe on a healthy stripe (recovery recomputes parity from
            // the data) but not on a degraded one, where a crash could leave members
            // disagreeing with nothing to resolve it: write zeros through the journal.
            let zeros = IoBytes::zeroed((run.blocks * BLOCK_BYTES) as usize);
            return self.write_runs_locked(map, std::slice::from_ref(run), zeros, None, false).await;
        }
        // A whole stripe: every member's chunk (data and parity) becomes zeros.
        self.zero_members(seg, run, 0..seg.members.len()).await
    }

    async fn resync(&self, map: &VolumeMap<D>, si: usize, row: u64) -> RowResult {
        let seg = &map.segments[si];
        let (k, m) = self.ec_shape();
        let chunk = self.geo.chunk_blocks;
        let mut stats = RowStats::default();
        let mut shards: Vec<Option<IoBuf>> = Vec::with_capacity(k + m);
        for s in 0..k + m {
            let (_, member) = self.shard_member(seg, row, s);
            let read = self.read_member_logical(member, row).await?;
            if let Some((data, written)) = &read {
                self.bless(member, member.start_block + row * chunk, data, written).await?;
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

    async fn scrub_locked(&self, map: &VolumeMap<D>, si: usize, row: u64) -> RowResult {
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
                        self.drive_error(&member.drive, "scrub write failed", &e)
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

    async fn rebuild_chunk(&self, map: &VolumeMap<D>, si: usize, mi: usize, row: u64) -> ChunkResult {
        let seg = &map.segments[si];
        let chunk = self.geo.chunk_blocks;
        let (k, m) = self.ec_shape();
        let shard = self.geo.ec_shard(row, mi) as usize;
        let mut skip = vec![false; k + m];
        skip[shard] = true;
        let mut reads = self.read_shards(seg, row, 0, chunk, &skip).await;
        let mut want = vec![false; k + m];
        want[shard] = true;
        if !self.decode_rows(&mut reads, &want).is_empty() {
            let run = ChunkRun { segment: si, row, column: 0, offset_in_chunk: 0, blocks: chunk };
            return Err(self.pool_err(self.unrecoverable(&run, "too few members left to rebuild the stripe")));
        }
        Ok(reads.swap_remove(shard).buf.expect("decoded"))
    }
}

impl<D: BlockDevice> InFamily<'_, Ec, D> {
    pub(super) fn codec(&self) -> &ReedSolomon {
        &self.fam.codec
    }

    pub(super) fn ec_shape(&self) -> (usize, usize) {
        let codec = self.codec();
        (codec.data_shards(), codec.parity_shards())
    }

    pub(super) fn shard_member<'a>(
        &self,
        seg: &'a Segment<D>,
        row: u64,
        shard: usize,
    ) -> (usize, &'a Member<D>) {
        let m = self.geo.ec_member(row, shard as u32);
        (m, &seg.members[m])
    }

    /// The degraded read of a run whose member is missing (failed, or not rebuilt that far):
    /// reads exactly K verified survivors, data shards first (the ones the codec prefers, so
    /// its cached decode plan applies), and decodes the run from them into `out` (or a new
    /// buffer). `None` when fewer than K members are usable or a survivor does not read back
    /// verified: the caller then takes the general path, which reads every member, repairs
    /// what is bad and reports what cannot be rebuilt. The caller holds the stripe lock.
    async fn ec_read_from_survivors(
        &self,
        seg: &Segment<D>,
        run: &ChunkRun,
        out: Option<IoBuf>,
    ) -> Option<IoBuf> {
        let (k, m) = self.ec_shape();
        let total = k + m;
        let target = run.column as usize;
        let len = (run.blocks * BLOCK_BYTES) as usize;
        let mut chosen = [0usize; MAX_SHARDS];
        let mut n = 0;
        for shard in (0..total).filter(|&s| s != target) {
            if n == k {
                break;
            }
            if self.shard_member(seg, run.row, shard).1.usable(run.row) {
                chosen[n] = shard;
                n += 1;
            }
        }
        if n < k {
            return None;
        }
        // One allocation for all survivors, split into a view per drive read.
        let mut rest = Some(IoBuf::zeroed(k * len));
        let first = self.geo.member_block(run.row, run.offset_in_chunk);
        let reads = chosen[..k].iter().map(|&shard| {
            let mut view = rest.take().expect("one view per survivor");
            if view.len() > len {
                rest = Some(view.split_off(len));
            }
            let (_, member) = self.shard_member(seg, run.row, shard);
            member.drive.read_verified(member.start_block + first, view)
        });
        let survivors = join_all(reads).await;
        let mut sources: [Option<&[u8]>; MAX_SHARDS] = [None; MAX_SHARDS];
        for (&shard, read) in chosen[..k].iter().zip(&survivors) {
            sources[shard] = Some(&read.as_ref().ok()?[..]);
        }
        let mut out = out.filter(|b| b.len() == len).unwrap_or_else(|| IoBuf::for_overwrite(len));
        self.codec()
            .reconstruct(&sources[..total], &mut [(target, &mut out[..])])
            .expect("shapes are consistent");
        Some(out)
    }

    /// Reads `rows` blocks from `first` of every shard's chunk in a stripe (verified).
    pub(super) async fn read_shards(
        &self,
        seg: &Segment<D>,
        row: u64,
        first: u64,
        rows: u64,
        skip: &[bool],
    ) -> Vec<ShardRead> {
        let n = rows as usize;
        let total = seg.members.len();
        let reads = (0..total).map(|shard| {
            let (_, member) = self.shard_member(seg, row, shard);
            let wanted = !skip[shard] && member.usable(row);
            async move {
                if !wanted {
                    return ShardRead { buf: None, good: vec![false; n], io_error: false };
                }
                let block = member.start_block + self.geo.member_block(row, first);
                match member.drive.read_isolating(block, rows).await {
                    Some((buf, good, io_error)) => ShardRead { buf: Some(buf), good, io_error },
                    None => ShardRead { buf: None, good: vec![false; n], io_error: false },
                }
            }
        });
        join_all(reads).await
    }

    /// Fills in every shard block that is not good (for shards in `want`) by decoding from the
    /// good ones, row by row (grouping rows with the same set of good shards). Returns the rows
    /// that could not be decoded.
    pub(super) fn decode_rows(&self, reads: &mut [ShardRead], want: &[bool]) -> Vec<usize> {
        let (k, _) = self.ec_shape();
        let total = reads.len();
        let n = reads.iter().map(|r| r.good.len()).max().unwrap_or(0);
        for r in reads.iter_mut() {
            if r.buf.is_none() {
                r.buf = Some(IoBuf::zeroed(n * BLOCK_USIZE));
            }
        }
        let mut failed_rows = Vec::new();
        let mut i = 0;
        while i < n {
            let mask: Vec<bool> = reads.iter().map(|r| r.good[i]).collect();
            let mut j = i + 1;
            while j < n && reads.iter().zip(&mask).all(|(r, &g)| r.good[j] == g) {
                j += 1;
            }
            let targets: Vec<usize> = (0..total).filter(|&s| want[s] && !mask[s]).collect();
            if !targets.is_empty() {
                if mask.iter().filter(|&&g| g).count() < k {
                    failed_rows.extend(i..j);
                } else {
                    let range = i * BLOCK_USIZE..j * BLOCK_USIZE;
                    // Split the shard buffers into sources (good) and outputs (targets).
                    let mut sources: Vec<Option<&[u8]>> = vec![None; total];
                    let mut outputs: Vec<(usize, &mut [u8])> = Vec::new();
                    for (s, r) in reads.iter_mut().enumerate() {
                        let buf = r.buf.as_mut().expect("filled above");
                        if mask[s] {
                            sources[s] = Some(&buf[range.clone()]);
                        } else if targets.contains(&s) {
                            outputs.push((s, &mut buf[range.clone()]));
                        }
                    }
                    self.codec().reconstruct(&sources, &mut outputs).expect("shapes are consistent");
                    for &s in &targets {
                        reads[s].good[i..j].fill(true);
                    }
                }
            }
            i = j;
        }
        failed_rows
    }

    /// Fails the drives that answered with I/O errors when nothing could be rebuilt to rewrite
    /// (and so cure) the blocks they could not read.
    pub(super) async fn fail_unrepairable(
        &self,
        seg: &Segment<D>,
        row: u64,
        reads: &[ShardRead],
    ) -> Result<(), VolumeError> {
        for (shard, r) in reads.iter().enumerate() {
            if r.io_error && !r.good.iter().all(|&g| g) {
                let (_, member) = self.shard_member(seg, row, shard);
                self.fail_drive(&member.drive, "read error that redundancy could not repair".into()).await?;
            }
        }
        Ok(())
    }

    /// Writes back blocks that were bad (per `before`) and are good now, on usable members.
    pub(super) async fn write_repairs(
        &self,
        seg: &Segment<D>,
        row: u64,
        first: u64,
        reads: &[ShardRead],
        before: &[Vec<bool>],
    ) -> Result<(), VolumeError> {
        for (shard, (r, was)) in reads.iter().zip(before).enumerate() {
            let (_, member) = self.shard_member(seg, row, shard);
            if !member.usable(row) || was.iter().all(|&g| g) {
                continue;
            }
            let buf = r.buf.as_ref().expect("decoded shards have buffers");
            let mut i = 0;
            while i < was.len() {
                if was[i] || !r.good[i] {
                    i += 1;
                    continue;
                }
                let mut j = i;
                while j < was.len() && !was[j] && r.good[j] {
                    j += 1;
                }
                let block = member.start_block + self.geo.member_block(row, first + i as u64);
                let data = IoBytes::copy_from(&buf[i * BLOCK_USIZE..j * BLOCK_USIZE]);
                match member.drive.write(block, data, false).await {
                    Ok(()) => self.note_repair(&member.drive, block, (j - i) as u64),
                    Err(e) => {
                        self.drive_error(&member.drive, "repair write failed", &e).await?;
                        break;
                    }
                }
                i = j;
            }
        }
        Ok(())
    }

    async fn ec_write_stripe_locked(
        &self,
        map: &VolumeMap<D>,
        sw: StripeWrite<'_>,
        fua: bool,
    ) -> Result<(), VolumeError> {
        let seg = &map.segments[sw.segment];
        let chunk = self.geo.chunk_blocks;
        let full =
            sw.shards.iter().all(|s| matches!(s, Some((0, d)) if d.len() as u64 == chunk * BLOCK_BYTES));
        // Unjournaled only where every member stays usable after a crash (see `durably_usable`).
        let all_usable = seg.members.iter().all(|m| m.durably_usable(sw.row));
        if full && all_usable {
            self.counters.full_stripe_writes.fetch_add(1, Relaxed);
            self.ec_full_stripe(seg, &sw, fua).await
        } else {
            self.counters.partial_stripe_writes.fetch_add(1, Relaxed);
            self.ec_partial_stripe(seg, &sw).await
        }
    }

    /// A full stripe on a healthy stripe: encode, write everything, no journal.
    async fn ec_full_stripe(
        &self,
        seg: &Segment<D>,
        sw: &StripeWrite<'_>,
        fua: bool,
    ) -> Result<(), VolumeError> {
        let (k, m) = self.ec_shape();
        let len = (self.geo.chunk_blocks * BLOCK_BYTES) as usize;
        let data: Vec<&IoBytes> = sw.shards.iter().map(|s| &s.as_ref().expect("full stripe").1).collect();
        // The encoder writes every byte of the parity: no need to zero it first.
        let mut parity: Vec<IoBuf> = (0..m).map(|_| IoBuf::for_overwrite(len)).collect();
        {
            let refs: Vec<&[u8]> = data.iter().map(|d| &d[..]).collect();
            let mut outs: Vec<&mut [u8]> = parity.iter_mut().map(|p| &mut p[..]).collect();
            self.codec().encode(&refs, &mut outs).expect("shapes are consistent");
        }
        let mut pieces: Vec<Piece> = Vec::with_capacity(k + m);
        for (shard, d) in data.into_iter().enumerate() {
            let (member, mb) = self.shard_member(seg, sw.row, shard);
            pieces.push(Piece {
                member,
                block: mb.start_block + sw.row * self.geo.chunk_blocks,
                data: d.clone(),
                repair: false,
            });
        }
        self.push_parity_pieces(seg, sw.row, 0, parity, &mut pieces);
        // The data pieces come first, in shard order: their checksums, where carried in.
        self.write_pieces(seg, sw, &pieces, &sw.crcs, fua).await
    }

    /// Writes pieces in place; failed drives are failed (persisted). Errors if the stripe ends
    /// up with more members lost than its parity covers.
    async fn write_pieces(
        &self,
        seg: &Segment<D>,
        sw: &StripeWrite<'_>,
        pieces: &[Piece],
        crcs: &[Option<&[u32]>],
        fua: bool,
    ) -> Result<(), VolumeError> {
        let writes = pieces.iter().enumerate().map(|(i, p)| {
            let drive = &seg.members[p.member].drive;
            let carried = crcs.get(i).copied().flatten();
            async move {
                match carried {
                    Some(c) => drive.write_carrying(p.block, p.data.clone(), fua, c).await,
                    None => drive.write(p.block, p.data.clone(), fua).await,
                }
            }
        });
        let results = join_all(writes).await;
        for (p, result) in pieces.iter().zip(results) {
            let drive = &seg.members[p.member].drive;
            if result.is_ok() {
                self.counters.member_write_bytes.fetch_add(p.data.len() as u64, Relaxed);
            }
            match result {
                Ok(()) if p.repair => self.note_repair(drive, p.block, p.data.len() as u64 / BLOCK_BYTES),
                Ok(()) => {}
                Err(e) => self.drive_error(drive, "write failed", &e).await?,
            }
        }
        self.check_stripe_alive(seg, sw)
    }

    fn check_stripe_alive(&self, seg: &Segment<D>, sw: &StripeWrite<'_>) -> Result<(), VolumeError> {
        let (_, m) = self.ec_shape();
        let lost = seg.members.iter().filter(|mb| !mb.usable(sw.row)).count();
        if lost > m {
            let run = ChunkRun {
                segment: sw.segment,
                row: sw.row,
                column: 0,
                offset_in_chunk: 0,
                blocks: self.geo.chunk_blocks,
            };
            return Err(
                self.unrecoverable(&run, format!("{lost} members of the stripe are lost; parity covers {m}"))
            );
        }
        Ok(())
    }

    /// A partial-stripe write (or any write to a degraded stripe): compute new data and parity
    /// blocks, journal them on their drives, then apply them in place.
    async fn ec_partial_stripe(&self, seg: &Segment<D>, sw: &StripeWrite<'_>) -> Result<(), VolumeError> {
        let (k, m) = self.ec_shape();
        let total = k + m;
        let touched: Vec<(usize, u64, &IoBytes)> =
            sw.shards.iter().enumerate().filter_map(|(j, s)| s.as_ref().map(|(o, d)| (j, *o, d))).collect();
        let rmin = touched.iter().map(|t| t.1).min().expect("a stripe write touches a shard");
        let rmax = touched.iter().map(|t| t.1 + t.2.len() as u64 / BLOCK_BYTES).max().expect("non-empty");
        let rows = rmax - rmin;
        let usable: Vec<bool> =
            (0..total).map(|s| self.shard_member(seg, sw.row, s).1.usable(sw.row)).collect();
        let covers_all = |j: usize| matches!(&sw.shards[j], Some((o, d)) if *o == rmin && d.len() as u64 == rows * BLOCK_BYTES);

        let inc_possible = touched.iter().all(|t| usable[t.0]) && (k..total).all(|p| usable[p]);
        let inc_reads: u64 =
            touched.iter().map(|t| t.2.len() as u64 / BLOCK_BYTES).sum::<u64>() + m as u64 * rows;
        let rw_possible = (0..k).all(|j| covers_all(j) || usable[j]);
        let rw_reads = (0..k).filter(|&j| !covers_all(j)).count() as u64 * rows;

        let mut pieces = None;
        if inc_possible && (!rw_possible || inc_reads <= rw_reads) {
            pieces = self.incremental_pieces(seg, sw, &touched, rmin, rows).await;
        } else if rw_possible {
            pieces = self.reconstruct_write_pieces(seg, sw, rmin, rows, &usable).await;
        }
        let pieces = match pieces {
            Some(p) => p,
            None => self.degraded_pieces(seg, sw, rmin, rows).await?,
        };
        self.journal_and_apply(seg, sw, pieces).await
    }

    /// Incremental update: read the old blocks being replaced and the old parity rows.
    /// Returns None if any read is not clean (the degraded path handles it).
    async fn incremental_pieces(
        &self,
        seg: &Segment<D>,
        sw: &StripeWrite<'_>,
        touched: &[(usize, u64, &IoBytes)],
        rmin: u64,
        rows: u64,
    ) -> Option<Vec<Piece>> {
        let (k, m) = self.ec_shape();
        let chunk = self.geo.chunk_blocks;
        let old_reads = touched.iter().map(|&(j, off, d)| {
            let (_, mb) = self.shard_member(seg, sw.row, j);
            mb.drive.read_verified(mb.start_block + sw.row * chunk + off, IoBuf::zeroed(d.len()))
        });
        let parity_reads = (k..k + m).map(|p| {
            let (_, mb) = self.shard_member(seg, sw.row, p);
            mb.drive.read_verified(
                mb.start_block + sw.row * chunk + rmin,
                IoBuf::zeroed((rows * BLOCK_BYTES) as usize),
            )
        });
        let (olds, parities) = futures::join!(join_all(old_reads), join_all(parity_reads));
        let olds: Vec<IoBuf> = olds.into_iter().collect::<Result<_, _>>().ok()?;
        let mut parities: Vec<IoBuf> = parities.into_iter().collect::<Result<_, _>>().ok()?;
        for (&(j, off, new), old) in touched.iter().zip(&olds) {
            let at = ((off - rmin) * BLOCK_BYTES) as usize;
            let mut outs: Vec<&mut [u8]> = parities.iter_mut().map(|p| &mut p[at..at + new.len()]).collect();
            self.codec().update(j, old, new, &mut outs).expect("shapes are consistent");
        }
        let mut pieces = self.data_pieces(seg, sw);
        self.push_parity_pieces(seg, sw.row, rmin, parities, &mut pieces);
        Some(pieces)
    }

    /// Reconstruct-write: read the untouched data of the affected rows and encode.
    /// Returns None if any read is not clean.
    async fn reconstruct_write_pieces(
        &self,
        seg: &Segment<D>,
        sw: &StripeWrite<'_>,
        rmin: u64,
        rows: u64,
        usable: &[bool],
    ) -> Option<Vec<Piece>> {
        let (k, _) = self.ec_shape();
        let chunk = self.geo.chunk_blocks;
        let len = (rows * BLOCK_BYTES) as usize;
        let reads = (0..k).map(|j| {
            let (_, mb) = self.shard_member(seg, sw.row, j);
            let needs_read = !matches!(&sw.shards[j], Some((o, d)) if *o == rmin && d.len() == len);
            async move {
                if !needs_read {
                    return Ok(IoBuf::zeroed(len));
                }
                debug_assert!(usable[j]);
                mb.drive.read_verified(mb.start_block + sw.row * chunk + rmin, IoBuf::zeroed(len)).await
            }
        });
        let mut data: Vec<IoBuf> = join_all(reads).await.into_iter().collect::<Result<_, _>>().ok()?;
        self.overlay_new_data(sw, rmin, &mut data);
        let parity = self.encode_rows(&data, rows);
        let mut pieces = self.data_pieces(seg, sw);
        self.push_parity_pieces(seg, sw.row, rmin, parity, &mut pieces);
        Some(pieces)
    }

    /// The general path: read every available member over the affected rows, decode whatever
    /// is missing or bad, apply the new data and encode. Also repairs bad blocks it finds.
    async fn degraded_pieces(
        &self,
        seg: &Segment<D>,
        sw: &StripeWrite<'_>,
        rmin: u64,
        rows: u64,
    ) -> Result<Vec<Piece>, VolumeError> {
        let (k, m) = self.ec_shape();
        let total = k + m;
        let chunk = self.geo.chunk_blocks;
        // Read every available shard, even those the write replaces entirely: their old
        // contents may be needed to decode a missing one.
        let mut reads = self.read_shards(seg, sw.row, rmin, rows, &vec![false; total]).await;
        let before: Vec<Vec<bool>> = reads.iter().map(|r| r.good.clone()).collect();
        // Decode the old contents of every data shard that is not fully overwritten.
        let want: Vec<bool> = (0..total).map(|s| s < k).collect();
        let failed = self.decode_rows(&mut reads, &want);
        if !failed.is_empty() {
            self.fail_unrepairable(seg, sw.row, &reads).await?;
            let run =
                ChunkRun { segment: sw.segment, row: sw.row, column: 0, offset_in_chunk: rmin, blocks: rows };
            return Err(self.unrecoverable(
                &run,
                "more chunks of the stripe are missing or corrupt than its parity covers",
            ));
        }
        let mut data: Vec<IoBuf> = reads.drain(..k).map(|r| r.buf.expect("decoded")).collect();
        self.overlay_new_data(sw, rmin, &mut data);
        let parity = self.encode_rows(&data, rows);
        let mut pieces = self.data_pieces(seg, sw);
        // Untouched data shards whose blocks were bad on a usable member: write them back.
        for (j, buf) in data.iter().enumerate() {
            let (member, mb) = self.shard_member(seg, sw.row, j);
            if sw.shards[j].is_none() && mb.usable(sw.row) && before[j].iter().any(|&g| !g) {
                pieces.push(Piece {
                    member,
                    block: mb.start_block + sw.row * chunk + rmin,
                    data: IoBytes::copy_from(buf),
                    repair: true,
                });
            }
        }
        self.push_parity_pieces(seg, sw.row, rmin, parity, &mut pieces);
        Ok(pieces)
    }

    /// Lays the new data of each touched shard over its buffer of the affected rows.
    fn overlay_new_data(&self, sw: &StripeWrite<'_>, rmin: u64, data: &mut [IoBuf]) {
        for (j, s) in sw.shards.iter().enumerate() {
            if let Some((off, d)) = s {
                let at = ((off - rmin) * BLOCK_BYTES) as usize;
                data[j][at..at + d.len()].copy_from_slice(d);
            }
        }
    }

    pub(super) fn encode_rows(&self, data: &[IoBuf], rows: u64) -> Vec<IoBuf> {
        let (_, m) = self.ec_shape();
        let mut parity: Vec<IoBuf> =
            (0..m).map(|_| IoBuf::for_overwrite((rows * BLOCK_BYTES) as usize)).collect();
        let refs: Vec<&[u8]> = data.iter().map(|d| &d[..]).collect();
        let mut outs: Vec<&mut [u8]> = parity.iter_mut().map(|p| &mut p[..]).collect();
        self.codec().encode(&refs, &mut outs).expect("shapes are consistent");
        parity
    }

    /// Appends the writes of `parity` (one buffer per parity shard, `M` of them) at block
    /// offset `offset` of row `row`'s parity chunks.
    fn push_parity_pieces(
        &self,
        seg: &Segment<D>,
        row: u64,
        offset: u64,
        parity: Vec<IoBuf>,
        pieces: &mut Vec<Piece>,
    ) {
        let (k, _) = self.ec_shape();
        for (p, buf) in parity.into_iter().enumerate() {
            let (member, mb) = self.shard_member(seg, row, k + p);
            let block = mb.start_block + row * self.geo.chunk_blocks + offset;
            pieces.push(Piece { member, block, data: buf.freeze(), repair: false });
        }
    }

    /// Pieces for the new data of every touched shard.
    fn data_pieces(&self, seg: &Segment<D>, sw: &StripeWrite<'_>) -> Vec<Piece> {
        sw.shards
            .iter()
            .enumerate()
            .filter_map(|(j, s)| {
                let (off, d) = s.as_ref()?;
                let (member, mb) = self.shard_member(seg, sw.row, j);
                Some(Piece {
                    member,
                    block: mb.start_block + sw.row * self.geo.chunk_blocks + off,
                    data: d.clone(),
                    repair: false,
                })
            })
            .collect()
    }

    /// Makes the pieces (on usable members) durable in their drives' journals, then writes
    /// them in place and marks the journal records applied.
    async fn journal_and_apply(
        &self,
        seg: &Segment<D>,
        sw: &StripeWrite<'_>,
        pieces: Vec<Piece>,
    ) -> Result<(), VolumeError> {
        let mut pieces: Vec<Piece> =
            pieces.into_iter().filter(|p| seg.members[p.member].usable(sw.row)).collect();
        // Each block's checksum, computed once: for its journal record and its write in place.
        let mut crcs: Vec<Vec<u32>> = pieces.iter().map(|p| JournalPiece::crcs_of(&p.data)).collect();
        let slots_of = |pieces: &[Piece]| -> Vec<u16> {
            pieces
                .iter()
                .map(|p| u16::try_from(seg.members[p.member].drive.slot()).expect("slot fits"))
                .collect()
        };
        let mut slots = slots_of(&pieces);
        // Set when an attempt first found a journal full.
        let mut full_since: Option<tokio::time::Instant> = None;
        let outcome = loop {
            // A member that failed while this waited for journal room is left out, as one
            // failed before the write began: a failed drive's ring is never checkpointed again
            // (flushes leave failed drives out), so appending to it would find it full for good.
            if full_since.is_some() && pieces.iter().any(|p| !seg.members[p.member].usable(sw.row)) {
                self.check_stripe_alive(seg, sw)?;
                (pieces, crcs) = std::mem::take(&mut pieces)
                    .into_iter()
                    .zip(std::mem::take(&mut crcs))
                    .filter(|(p, _)| seg.members[p.member].usable(sw.row))
                    .unzip();
                slots = slots_of(&pieces);
            }
            let Some(txn_id) = self.host.next_txn_id(self.id, &slots) else {
                // Too many volumes have transactions waiting for a flush: flush them all.
                self.host
                    .flush_all()
                    .await
                    .map_err(|e| VolumeError::Pool { volume: self.name.clone(), source: Box::new(e) })?;
                continue;
            };
            let appends = pieces.iter().zip(&crcs).map(|(p, crcs)| {
                let drive = &seg.members[p.member].drive;
                let piece = JournalPiece {
                    txn_id,
                    volume_id: self.id,
                    target_block: p.block,
                    piece_slots: slots.clone(),
                    data: p.data.clone(),
                    crcs: crcs.clone(),
                };
                drive.journal_append(piece)
            });
            let results = join_all(appends).await;
            // Each record written: its header block and the payload (an attempt abandoned below
            // wrote some too).
            let journal_bytes: u64 = pieces
                .iter()
                .zip(&results)
                .filter(|(_, r)| r.is_ok())
                .map(|(p, _)| BLOCK_BYTES + p.data.len() as u64)
                .sum();
            self.counters.member_write_bytes.fetch_add(journal_bytes, Relaxed);
            let run =
                || ChunkRun { segment: sw.segment, row: sw.row, column: 0, offset_in_chunk: 0, blocks: 1 };
            if let Some(Err(e @ AppendError::TooLarge { .. })) =
                results.iter().find(|r| matches!(r, Err(AppendError::TooLarge { .. })))
            {
                self.host.txn_done(txn_id);
                return Err(self.unrecoverable(&run(), e.to_string()));
            }
            let full = results.iter().any(|r| matches!(r, Err(AppendError::Full)));
            if full {
                // Abandon this attempt: its records are harmless (an incomplete transaction is
                // never replayed) and become checkpointable at once.
                self.host.txn_done(txn_id);
                // The ring fills faster than flushes release it when transactions are slow to
                // apply (a thread descheduled between its journal append and its in-place
                // write): wait for one to be applied, then flush, for as long as it takes
                // within the bound. (A fixed number of quick retries failed writes with EIO on
                // a loaded machine.)
                match full_since {
                    None => full_since = Some(tokio::time::Instant::now()),
                    Some(since) if since.elapsed() > JOURNAL_FULL_WAIT => {
                        return Err(self.unrecoverable(
                            &run(),
                            format!(
                                "journal stayed full: no transaction in it was applied for {} s",
                                JOURNAL_FULL_WAIT.as_secs()
                            ),
                        ));
                    }
                    Some(_) => self.host.txn_applied(JOURNAL_FULL_POLL).await,
                }
                self.host
                    .flush_all()
                    .await
                    .map_err(|e| VolumeError::Pool { volume: self.name.clone(), source: Box::new(e) })?;
                continue;
            }
            let mut journaled = Vec::with_capacity(pieces.len());
            for (p, r) in pieces.iter().zip(results) {
                match r {
                    Ok(_) => journaled.push(true),
                    Err(AppendError::Dev(e)) => {
                        journaled.push(false);
                        if let Err(e) =
                            self.drive_error(&seg.members[p.member].drive, "journal write failed", &e).await
                        {
                            // Nothing was written in place: the transaction is over.
                            self.host.txn_done(txn_id);
                            return Err(e);
                        }
                    }
                    Err(AppendError::Full | AppendError::TooLarge { .. }) => unreachable!("handled above"),
                }
            }
            break (txn_id, journaled);
        };
        let (txn_id, journaled) = outcome;
        if let Err(e) = self.check_stripe_alive(seg, sw) {
            self.host.txn_done(txn_id);
            return Err(e);
        }
        let (live, live_crcs): (Vec<Piece>, Vec<Option<&[u32]>>) = pieces
            .into_iter()
            .zip(&crcs)
            .zip(&journaled)
            .filter(|(_, j)| **j)
            .map(|((p, c), _)| (p, Some(&c[..])))
            .unzip();
        let result = self.write_pieces(seg, sw, &live, &live_crcs, false).await;
        // Every piece is in place (or its drive is failed): the transaction is applied.
        self.host.txn_done(txn_id);
        result
    }
}

impl<D: BlockDevice> InFamily<'_, Ec, D> {
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

#[cfg(test)]
mod tests;
