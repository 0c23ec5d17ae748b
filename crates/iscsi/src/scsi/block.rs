//! The block commands (SBC-4): reads, writes, verifies, capacity, cache, WRITE SAME, UNMAP,
//! COMPARE AND WRITE and GET LBA STATUS, each turned into calls of the volume contract.
//!
//! UNMAP and WRITE SAME with UNMAP zero the range ([`Attachment::write_zeroes`]) rather than
//! discard it: the logical unit reports LBPRZ (unmapped blocks read as zeros), and a discard is
//! only a hint that leaves the edges of a range, and whole ranges on some layouts, as they were.
//! Zeroing drops every whole unit as a discard does and writes zeros at the edges, so what an
//! initiator reads after an UNMAP is zeros, as libiscsi's UNMAP tests check.

use stria_dev::IoBytes;
use stria_front::Attachment;
use stria_front::status::split;
use stria_volume::{Durability, Extent, Zeroing};

use super::cdb::{Cdb, param_be};
use super::inquiry::MAX_COMPARE_AND_WRITE_BLOCKS;
use super::sense::Check;
use super::{
    LOGICAL_BLOCK_BYTES, LOGICAL_PER_PHYSICAL_EXPONENT, LogicalUnit, MAX_TRANSFER_BLOCKS, MAX_UNMAP_BLOCKS,
    MAX_UNMAP_DESCRIPTORS, MAX_WRITE_SAME_BLOCKS, Outcome, WRITE_SAME_CHUNK_BYTES, data_in, op,
};

/// The most LBA status descriptors one GET LBA STATUS returns.
const MAX_LBA_STATUS_DESCRIPTORS: usize = 512;

/// The volume's capacity in logical blocks.
fn capacity_blocks(volume: &Attachment) -> u64 {
    volume.size_bytes() / LOGICAL_BLOCK_BYTES
}

/// The byte range of `blocks` logical blocks at `lba`, or LOGICAL BLOCK ADDRESS OUT OF RANGE
/// when it passes the end (or overflows).
fn byte_range(volume: &Attachment, lba: u64, blocks: u64) -> Result<(u64, u64), Check> {
    match lba.checked_add(blocks) {
        Some(end) if end <= capacity_blocks(volume) => {
            Ok((lba * LOGICAL_BLOCK_BYTES, blocks * LOGICAL_BLOCK_BYTES))
        }
        _ => Err(Check::lba_out_of_range()),
    }
}

/// A byte count known to be at most [`super::MAX_TRANSFER_BYTES`] (or another small bound) as
/// a buffer length.
fn buffer_len(len_bytes: u64) -> usize {
    usize::try_from(len_bytes).expect("bounded transfer lengths fit in memory")
}

/// The fields of a READ, WRITE, VERIFY or WRITE AND VERIFY CDB.
struct Transfer {
    lba: u64,
    blocks: u64,
    /// Byte 1 (protection field, DPO, FUA, BYTCHK), 0 for the 6-byte CDBs.
    flags: u8,
    /// Where TRANSFER LENGTH is, for the field pointer.
    length_at: u16,
}

fn transfer(cdb: &Cdb<'_>) -> Result<Transfer, Check> {
    let t = match cdb.len() {
        6 => {
            let blocks = match cdb.u8(4)? {
                0 => 256,
                n => u64::from(n),
            };
            Transfer { lba: u64::from(cdb.be24(1)? & 0x1F_FFFF), blocks, flags: 0, length_at: 4 }
        }
        10 => Transfer {
            lba: u64::from(cdb.be32(2)?),
            blocks: u64::from(cdb.be16(7)?),
            flags: cdb.u8(1)?,
            length_at: 7,
        },
        12 => Transfer {
            lba: u64::from(cdb.be32(2)?),
            blocks: u64::from(cdb.be32(6)?),
            flags: cdb.u8(1)?,
            length_at: 6,
        },
        _ => {
            Transfer { lba: cdb.be64(2)?, blocks: u64::from(cdb.be32(10)?), flags: cdb.u8(1)?, length_at: 10 }
        }
    };
    // RDPROTECT/WRPROTECT/VRPROTECT: this logical unit has no protection information.
    if t.flags >> 5 != 0 {
        return Err(Check::invalid_cdb(1, Some(7)));
    }
    if t.blocks > u64::from(MAX_TRANSFER_BLOCKS) {
        return Err(Check::invalid_cdb(t.length_at, None));
    }
    Ok(t)
}

/// The index of the first byte where `a` and `b` differ.
fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y)
}

impl LogicalUnit {
    /// The block commands, by operation code.
    pub(super) async fn block_command(
        &self,
        volume: &Attachment,
        cdb: &Cdb<'_>,
        data_out: IoBytes,
    ) -> Outcome {
        let map = |e: stria_volume::VolumeError| Check::of_volume(&e);
        match cdb.opcode() {
            op::READ_6 | op::READ_10 | op::READ_12 | op::READ_16 => {
                let t = transfer(cdb)?;
                let (offset, len) = byte_range(volume, t.lba, t.blocks)?;
                if len == 0 {
                    return Ok(None);
                }
                Ok(Some(volume.read(offset, buffer_len(len)).await.map_err(map)?))
            }
            op::WRITE_6 | op::WRITE_10 | op::WRITE_12 | op::WRITE_16 => {
                let t = transfer(cdb)?;
                let (offset, len) = byte_range(volume, t.lba, t.blocks)?;
                self.check_writable(volume)?;
                if len == 0 {
                    return Ok(None);
                }
                let data = data_out.slice(0..buffer_len(len));
                volume.write(offset, data, self.durability(t.flags & 0x08 != 0)).await.map_err(map)?;
                Ok(None)
            }
            op::WRITE_AND_VERIFY_10 | op::WRITE_AND_VERIFY_12 | op::WRITE_AND_VERIFY_16 => {
                let t = transfer(cdb)?;
                let (offset, len) = byte_range(volume, t.lba, t.blocks)?;
                self.check_writable(volume)?;
                if len == 0 {
                    return Ok(None);
                }
                let data = data_out.slice(0..buffer_len(len));
                volume.write(offset, data.clone(), self.durability(false)).await.map_err(map)?;
                let found = volume.read(offset, data.len()).await.map_err(map)?;
                match first_difference(&data, &found) {
                    Some(at) => Err(Check::miscompare_at(at as u64).into()),
                    None => Ok(None),
                }
            }
            op::VERIFY_10 | op::VERIFY_12 | op::VERIFY_16 => verify(volume, cdb, &data_out).await,
            op::READ_CAPACITY_10 => read_capacity_10(volume, cdb),
            op::SYNCHRONIZE_CACHE_10 | op::SYNCHRONIZE_CACHE_16 => {
                let (lba, blocks) = if cdb.len() == 10 {
                    (u64::from(cdb.be32(2)?), u64::from(cdb.be16(7)?))
                } else {
                    (cdb.be64(2)?, u64::from(cdb.be32(10)?))
                };
                byte_range(volume, lba, blocks)?;
                volume.flush().await.map_err(map)?;
                Ok(None)
            }
            op::WRITE_SAME_10 | op::WRITE_SAME_16 => self.write_same(volume, cdb, &data_out).await,
            op::UNMAP => self.unmap(volume, cdb, &data_out).await,
            op::COMPARE_AND_WRITE => self.compare_and_write(volume, cdb, &data_out).await,
            op::SERVICE_ACTION_IN_16 => match cdb.service_action()? {
                op::SA_READ_CAPACITY_16 => read_capacity_16(volume, cdb),
                op::SA_GET_LBA_STATUS => get_lba_status(volume, cdb).await,
                _ => Err(Check::invalid_cdb(1, Some(4)).into()),
            },
            _ => Err(Check::invalid_opcode().into()),
        }
    }

    /// DATA PROTECT, WRITE PROTECTED for a read-only volume (a snapshot), before any write is
    /// tried (the volume would refuse it with the same sense).
    fn check_writable(&self, volume: &Attachment) -> Result<(), Check> {
        if volume.info().read_only { Err(Check::write_protected()) } else { Ok(()) }
    }

    /// WRITE SAME(10) and (16).
    async fn write_same(&self, volume: &Attachment, cdb: &Cdb<'_>, data_out: &IoBytes) -> Outcome {
        let sixteen = cdb.opcode() == op::WRITE_SAME_16;
        let flags = cdb.u8(1)?;
        let (lba, blocks, count_at) = if sixteen {
            (cdb.be64(2)?, u64::from(cdb.be32(10)?), 10)
        } else {
            (u64::from(cdb.be32(2)?), u64::from(cdb.be16(7)?), 7)
        };
        if flags >> 5 != 0 {
            return Err(Check::invalid_cdb(1, Some(7)).into()); // WRPROTECT
        }
        if flags & 0x10 != 0 {
            return Err(Check::invalid_cdb(1, Some(4)).into()); // ANCHOR (ANC_SUP is 0)
        }
        if !sixteen && flags & 0x06 != 0 {
            return Err(Check::invalid_cdb(1, Some(2)).into()); // PBDATA, LBDATA
        }
        if sixteen && flags & 0x06 != 0 {
            return Err(Check::invalid_cdb(1, Some(2)).into()); // obsolete PBDATA, LBDATA
        }
        let unmap = flags & 0x08 != 0;
        let ndob = sixteen && flags & 0x01 != 0;
        // WSNZ is set: 0 blocks is refused rather than meaning "to the end".
        if blocks == 0 || blocks > MAX_WRITE_SAME_BLOCKS {
            return Err(Check::invalid_cdb(count_at, None).into());
        }
        let (offset, len) = byte_range(volume, lba, blocks)?;
        self.check_writable(volume)?;
        let durability = self.durability(false);
        let block = if ndob {
            IoBytes::zeroed(buffer_len(LOGICAL_BLOCK_BYTES))
        } else {
            data_out.slice(0..buffer_len(LOGICAL_BLOCK_BYTES))
        };
        let map = |e: stria_volume::VolumeError| Check::of_volume(&e);
        if unmap && block.iter().all(|b| *b == 0) {
            volume.write_zeroes(offset, len, Zeroing::ANY, durability).await.map_err(map)?;
            return Ok(None);
        }
        write_pattern(volume, offset, len, &block, durability).await.map_err(map)?;
        Ok(None)
    }

    /// UNMAP: checks every descriptor, then zeroes each range (see the module).
    async fn unmap(&self, volume: &Attachment, cdb: &Cdb<'_>, data_out: &[u8]) -> Outcome {
        if cdb.bit(1, 0)? {
            return Err(Check::invalid_cdb(1, Some(0)).into()); // ANCHOR
        }
        let len = usize::from(cdb.be16(7)?);
        if len == 0 {
            return Ok(None);
        }
        if len < 8 {
            return Err(Check::param_list_length().into());
        }
        let data = data_out.get(..len).ok_or(Check::param_list_length())?;
        let descriptors_len = buffer_len(param_be(data, 2, 2).ok_or(Check::param_list_length())?);
        if descriptors_len > len - 8 {
            return Err(Check::invalid_param(2, None).into());
        }
        // A trailing partial descriptor is ignored (SBC-4 5.32.2).
        let count = descriptors_len / 16;
        if count > buffer_len(u64::from(MAX_UNMAP_DESCRIPTORS)) {
            return Err(Check::invalid_param(2, None).into());
        }
        let mut ranges = Vec::with_capacity(count);
        let mut total_blocks = 0u64;
        for i in 0..count {
            let at = 8 + 16 * i;
            let lba = param_be(data, at, 8).ok_or(Check::param_list_length())?;
            let blocks = param_be(data, at + 8, 4).ok_or(Check::param_list_length())?;
            total_blocks = total_blocks.saturating_add(blocks);
            if total_blocks > u64::from(MAX_UNMAP_BLOCKS) {
                let pointer = u16::try_from(at + 8).expect("at most 256 descriptors");
                return Err(Check::invalid_param(pointer, None).into());
            }
            ranges.push(byte_range(volume, lba, blocks)?);
        }
        self.check_writable(volume)?;
        let durability = self.durability(false);
        for (offset, len) in ranges.into_iter().filter(|(_, len)| *len > 0) {
            volume
                .write_zeroes(offset, len, Zeroing::ANY, durability)
                .await
                .map_err(|e| Check::of_volume(&e))?;
        }
        Ok(None)
    }

    /// COMPARE AND WRITE: Data-Out holds the blocks to compare, then those to write.
    async fn compare_and_write(&self, volume: &Attachment, cdb: &Cdb<'_>, data_out: &IoBytes) -> Outcome {
        let flags = cdb.u8(1)?;
        if flags >> 5 != 0 {
            return Err(Check::invalid_cdb(1, Some(7)).into()); // WRPROTECT
        }
        let lba = cdb.be64(2)?;
        let blocks = cdb.u8(13)?;
        // Today the limit is the field's maximum (the contract's 1 MiB is more than 255
        // blocks); the check keeps the two in step should either change.
        #[allow(clippy::absurd_extreme_comparisons)]
        if blocks > MAX_COMPARE_AND_WRITE_BLOCKS {
            return Err(Check::invalid_cdb(13, None).into());
        }
        let (offset, len) = byte_range(volume, lba, u64::from(blocks))?;
        self.check_writable(volume)?;
        if len == 0 {
            return Ok(None);
        }
        let len = buffer_len(len);
        let compare = data_out.slice(0..len);
        let write = data_out.slice(len..2 * len);
        let durability = self.durability(flags & 0x08 != 0);
        volume
            .compare_and_write(offset, compare, write, durability)
            .await
            .map_err(|e| Check::of_volume(&e))?;
        Ok(None)
    }
}

/// Writes `block` repeated over `len` bytes at `offset`, in writes of at most
/// [`WRITE_SAME_CHUNK_BYTES`] (one buffer of the pattern, reused).
async fn write_pattern(
    volume: &Attachment,
    offset: u64,
    len: u64,
    block: &[u8],
    durability: Durability,
) -> Result<(), stria_volume::VolumeError> {
    let chunk_len = buffer_len(len.min(WRITE_SAME_CHUNK_BYTES as u64));
    let mut pattern = Vec::with_capacity(chunk_len);
    while pattern.len() < chunk_len {
        pattern.extend_from_slice(block);
    }
    let pattern = IoBytes::copy_from(&pattern);
    let mut done = 0u64;
    while done < len {
        let n = buffer_len((len - done).min(chunk_len as u64));
        volume.write(offset + done, pattern.slice(0..n), durability).await?;
        done += n as u64;
    }
    Ok(())
}

/// VERIFY(10/12/16): BYTCHK 00b reads the range (it must be readable), 01b compares it with the
/// Data-Out, 11b compares every block with the one block of Data-Out.
async fn verify(volume: &Attachment, cdb: &Cdb<'_>, data_out: &[u8]) -> Outcome {
    let t = transfer(cdb)?;
    let bytchk = (t.flags >> 1) & 0x03;
    if bytchk == 0b10 {
        return Err(Check::invalid_cdb(1, Some(2)).into());
    }
    let (offset, len) = byte_range(volume, t.lba, t.blocks)?;
    if len == 0 {
        return Ok(None);
    }
    let found = volume.read(offset, buffer_len(len)).await.map_err(|e| Check::of_volume(&e))?;
    let block = buffer_len(LOGICAL_BLOCK_BYTES);
    let difference = match bytchk {
        0b01 => first_difference(&data_out[..found.len()], &found),
        0b11 => found
            .chunks(block)
            .enumerate()
            .find_map(|(i, chunk)| first_difference(&data_out[..block], chunk).map(|at| i * block + at)),
        _ => None,
    };
    match difference {
        Some(at) => Err(Check::miscompare_at(at as u64).into()),
        None => Ok(None),
    }
}

/// READ CAPACITY(10): the last LBA (FFFFFFFFh when it does not fit: use READ CAPACITY(16))
/// and the block length. PMI is obsolete; without it the LBA field must be 0.
fn read_capacity_10(volume: &Attachment, cdb: &Cdb<'_>) -> Outcome {
    let lba = cdb.be32(2)?;
    if !cdb.bit(8, 0)? && lba != 0 {
        return Err(Check::invalid_cdb(2, None).into());
    }
    let last = capacity_blocks(volume).saturating_sub(1);
    let mut d = u32::try_from(last).unwrap_or(u32::MAX).to_be_bytes().to_vec();
    d.extend_from_slice(&512u32.to_be_bytes());
    Ok(data_in(d, 8))
}

/// READ CAPACITY(16): last LBA, block length, 8 logical blocks per physical block, LBPME and
/// LBPRZ (thin provisioned, unmapped blocks read as zeros).
fn read_capacity_16(volume: &Attachment, cdb: &Cdb<'_>) -> Outcome {
    let alloc = buffer_len(u64::from(cdb.be32(10)?));
    let mut d = vec![0u8; 32];
    d[0..8].copy_from_slice(&capacity_blocks(volume).saturating_sub(1).to_be_bytes());
    d[8..12].copy_from_slice(&512u32.to_be_bytes());
    d[13] = LOGICAL_PER_PHYSICAL_EXPONENT;
    d[14] = 0x80 | 0x40; // LBPME, LBPRZ; LOWEST ALIGNED LBA 0
    Ok(data_in(d, alloc))
}

/// GET LBA STATUS: the provisioning status of blocks from the starting LBA on, from the
/// volume's allocation map (a prefix of the rest of the volume, as the front ends' block-status
/// chunking gives it): mapped (0) or deallocated (1).
/// How far GET LBA STATUS looks when the initiator has room for one descriptor: a little more
/// than a large read (a volume's block status costs in proportion to the range).
const ONE_DESCRIPTOR_LOOK_BYTES: u64 = 128 << 10;

async fn get_lba_status(volume: &Attachment, cdb: &Cdb<'_>) -> Outcome {
    let lba = cdb.be64(2)?;
    let alloc = buffer_len(u64::from(cdb.be32(10)?));
    let capacity = capacity_blocks(volume);
    if lba >= capacity {
        return Err(Check::lba_out_of_range().into());
    }
    let offset = lba * LOGICAL_BLOCK_BYTES;
    let max_descriptors = (alloc.saturating_sub(8) / 16).clamp(1, MAX_LBA_STATUS_DESCRIPTORS);
    // An initiator that takes one descriptor wants the status of where it is about to read
    // (qemu's iscsi driver asks before every read of a region it has not seen), so the answer
    // covers a little more than a read. Looking further costs the volume a scan of up to 64 MiB
    // per read (measured: random 4 KiB reads through qemu fell from about 6,000 to 500 per
    // second); a shorter answer only means the initiator reads instead of assuming zeros.
    let mut look = (capacity - lba) * LOGICAL_BLOCK_BYTES;
    if max_descriptors == 1 {
        look = look.min(ONE_DESCRIPTOR_LOOK_BYTES);
    }
    let extents = volume.block_status(offset, look).await.map_err(|e| Check::of_volume(&e))?;
    // Runs of at most 2^31 blocks, so that each fits the 32-bit block count.
    let runs = split(extents, (1u64 << 31) * LOGICAL_BLOCK_BYTES);
    let mut descriptors: Vec<(u64, u64, bool)> = Vec::new();
    let mut at_bytes = offset;
    for Extent { len_bytes, unallocated } in runs {
        let start = at_bytes / LOGICAL_BLOCK_BYTES;
        at_bytes += len_bytes;
        let end = at_bytes / LOGICAL_BLOCK_BYTES;
        if end == start {
            continue;
        }
        let full = descriptors.len() == max_descriptors;
        match descriptors.last_mut() {
            Some(last) if last.2 == unallocated && last.1 + (end - start) <= u64::from(u32::MAX) => {
                last.1 += end - start;
            }
            _ if full => break,
            _ => descriptors.push((start, end - start, unallocated)),
        }
    }
    let mut d = vec![0u8; 8];
    let length = u32::try_from(4 + 16 * descriptors.len()).expect("bounded descriptors");
    d[0..4].copy_from_slice(&length.to_be_bytes());
    for (start, blocks, unallocated) in descriptors {
        d.extend_from_slice(&start.to_be_bytes());
        d.extend_from_slice(&u32::try_from(blocks).expect("runs are cut to fit").to_be_bytes());
        d.extend_from_slice(&[u8::from(unallocated), 0, 0, 0]);
    }
    Ok(data_in(d, alloc))
}
