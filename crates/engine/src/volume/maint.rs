//! Row maintenance: resynchronisation after an unclean stop, and scrub.
//!
//! *Resync* trusts the data it finds (the checksums of a dirty region may lag it): it takes the
//! logical contents (zeros for unwritten blocks, raw bytes otherwise), makes checksums match
//! them, makes mirror copies agree and recomputes parity. *Scrub* trusts the checksums: it
//! verifies every block, repairs the bad ones from redundancy, then checks that parity (or the
//! copies) agree with the verified data.
//!
//! This module holds what the families share (row dispatch, the rebuild write-out, logical
//! reads, checksum blessing); each family's row algorithms are its `LayoutFamily::resync`,
//! `scrub_locked` and `rebuild_chunk` (mirror.rs, ec.rs).

use crate::volume::member::MemberDrive;
use stria_dev::{BLOCK_BYTES, BLOCK_USIZE, BlockDevice, DevError, IoBuf, IoBytes};

use super::map::{Member, VolumeMap};
use super::{LayoutFamily, Volume};
use crate::drive::Drive;
use crate::drive::csum::Entry;
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

/// Reads blocks without verification, zeroing the unwritten ones; says which are written (a
/// block whose checksum page is damaged counts as written: resync trusts what it finds).
pub(super) async fn read_logical<D: BlockDevice>(
    drive: &Drive<D>,
    block: u64,
    blocks: u64,
) -> Result<(IoBuf, Vec<bool>), DevError> {
    let entries = drive.csum_entries(block, blocks).await?;
    let mut buf = drive.read_raw(block, IoBuf::zeroed((blocks * BLOCK_BYTES) as usize)).await?;
    let written: Vec<bool> = entries.iter().map(|e| *e != Entry::Unwritten).collect();
    for (i, w) in written.iter().enumerate() {
        if !w {
            buf[i * BLOCK_USIZE..(i + 1) * BLOCK_USIZE].fill(0);
        }
    }
    Ok((buf, written))
}

/// Calls `f(first, end)` for each run of consecutive indices where `bad[i]` is true.
pub(crate) fn for_each_run(bad: &[bool], mut f: impl FnMut(usize, usize)) {
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
    pub(super) fn pool_err(&self, e: VolumeError) -> EngineError {
        EngineError::Volume(e)
    }

    /// Resynchronises row `row` of segment `si` under its stripe lock (recovery, where nothing
    /// else runs, and clearing a suspension, pool/suspend.rs, while reads go on).
    pub(crate) async fn resync_row(
        &self,
        map: &VolumeMap<D>,
        si: usize,
        row: u64,
    ) -> Result<RowStats, EngineError> {
        let _guard = self.locks.lock([(si, row)]).await;
        // Where the members are now, not when the caller looked (a move may have ended).
        let current = self.map.load_full();
        let map = if map.segments.len() == current.segments.len() { &current } else { map };
        with_family!(self, |f| f.resync(map, si, row).await)
    }

    pub(super) async fn read_member_logical(
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
                self.drive_error(&member.drive, "read failed during resync", &e)
                    .await
                    .map_err(|e| self.pool_err(e))?;
                Ok(None)
            }
        }
    }

    /// Sets the checksums of the written blocks of `data` (at `block` on `member`'s drive) from
    /// their contents; a drive that cannot read its checksum pages is failed.
    pub(super) async fn bless(
        &self,
        member: &Member<D>,
        block: u64,
        data: &[u8],
        written: &[bool],
    ) -> Result<(), EngineError> {
        if let Err(e) = member.drive.bless(block, data, written).await {
            self.drive_error(&member.drive, "checksum page read failed during resync", &e)
                .await
                .map_err(|e| self.pool_err(e))?;
        }
        Ok(())
    }

    /// Scrubs row `row` of segment `si` under its stripe lock.
    pub(crate) async fn scrub_row(
        &self,
        map: &VolumeMap<D>,
        si: usize,
        row: u64,
    ) -> Result<RowStats, EngineError> {
        let _guard = self.locks.lock([(si, row)]).await;
        let current = self.map.load_full(); // as in `resync_row`
        let map = if map.segments.len() == current.segments.len() { &current } else { map };
        with_family!(self, |f| f.scrub_locked(map, si, row).await)
    }

    /// Rewrites, on parity member `member` of row `row`, the blocks of its chunk where `have`
    /// (what it holds) differs from `want` (what it should hold), in runs. Returns how many
    /// blocks it counted as fixed; a write that fails fails the drive (`what` names the
    /// caller in the reason) and stops there.
    pub(super) async fn rewrite_differing(
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
                self.drive_error(&member.drive, &format!("{what} write failed"), &e)
                    .await
                    .map_err(|e| self.pool_err(e))?;
                break;
            }
        }
        Ok(fixed)
    }
}

impl<D: BlockDevice> Volume<D> {
    /// For the delta resync of member `mi` of segment `si` (docs/design/delta-resync.md): when
    /// row `row` was not written while the member was out — no other non-failed member marked
    /// the row's region in out generation `generation`, each of them has that generation, at
    /// least one was asked, and the member's own region is not in `own` — advances its cursor
    /// past the row without I/O and returns true. Decided under the row's stripe lock, so no
    /// write of the row falls between the check and the cursor.
    pub(crate) async fn skip_unchanged_row(
        &self,
        map: &VolumeMap<D>,
        si: usize,
        mi: usize,
        row: u64,
        generation: u64,
        own: &std::collections::BTreeSet<u64>,
    ) -> bool {
        use crate::format::layout::INTENT_REGION_BLOCKS as REGION;
        let _guard = self.locks.lock([(si, row)]).await;
        let seg = &map.segments[si];
        let chunk = self.geo.chunk_blocks;
        let regions = |start: u64| {
            let first = start + row * chunk;
            first / REGION..=(first + chunk - 1) / REGION
        };
        let member = &seg.members[mi];
        if regions(member.start_block).any(|r| own.contains(&r)) {
            return false;
        }
        let mut asked = 0;
        for (j, other) in seg.members.iter().enumerate() {
            if j == mi || other.drive.is_failed() {
                continue;
            }
            if other.drive.out.generation() != Some(generation)
                || regions(other.start_block).any(|r| other.drive.out.is_marked(r))
            {
                return false;
            }
            asked += 1;
        }
        if asked == 0 {
            return false;
        }
        member.rebuild_cursor.store(row + 1, std::sync::atomic::Ordering::Release);
        true
    }

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
        let data = with_family!(self, |f| f.rebuild_chunk(map, si, mi, row).await)?;
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
                self.drive_error(&member.drive, "rebuild write failed", &e)
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
