//! INQUIRY (standard data and vital product data pages) and REPORT LUNS (SPC-5 6.7, 6.33, 7.7;
//! SBC-4 6.6).

use stria_front::Attachment;

use super::cdb::Cdb;
use super::sense::Check;
use super::{
    LOGICAL_BLOCK_BYTES, LogicalUnit, MAX_TRANSFER_BLOCKS, MAX_UNMAP_BLOCKS, MAX_UNMAP_DESCRIPTORS,
    MAX_WRITE_SAME_BLOCKS, Nexus, Outcome, data_in,
};

/// The T10 vendor identification, 8 bytes.
const VENDOR: &[u8; 8] = b"STRIA   ";
/// The VPD pages supported, in order (page 00h lists them).
const VPD_PAGES: [u8; 6] = [0x00, 0x80, 0x83, 0xB0, 0xB1, 0xB2];
/// OPTIMAL UNMAP GRANULARITY: 8 logical blocks, stria's 4 KiB block, the smallest unit that a
/// mirror or tier volume deallocates.
const UNMAP_GRANULARITY_BLOCKS: u32 = 8;
/// MAXIMUM COMPARE AND WRITE LENGTH: the contract's 1 MiB in logical blocks, capped by the
/// one-byte NUMBER OF LOGICAL BLOCKS of the CDB.
#[allow(clippy::cast_possible_truncation)] // at most 255 after the cap
pub(crate) const MAX_COMPARE_AND_WRITE_BLOCKS: u8 = {
    let blocks = stria_volume::COMPARE_AND_WRITE_MAX_BYTES / LOGICAL_BLOCK_BYTES;
    if blocks > 255 { 255 } else { blocks as u8 }
};

/// `s` with every byte outside printable ASCII replaced by `_` (SPC-5 4.3.1 allows only
/// 20h..7Eh in ASCII fields).
pub(crate) fn printable(s: &str) -> String {
    s.bytes().map(|b| if (0x20..=0x7E).contains(&b) { char::from(b) } else { '_' }).collect()
}

/// `s` in a fixed-width ASCII field: printable, cut or padded with spaces.
fn ascii_field(s: &str, width: usize) -> Vec<u8> {
    let mut field: Vec<u8> = printable(s).into_bytes();
    field.resize(width, b' ');
    field
}

/// An NAA locally assigned designator (NAA 3h, SPC-5 7.7.6.6.4): 60 bits of an FNV-1a hash of
/// the target name and the serial under the NAA nibble. FNV is written out so that the
/// identifier never changes with the standard library's hasher.
pub(crate) fn naa_locally_assigned(target_name: &str, serial: &str) -> [u8; 8] {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in target_name.bytes().chain([0]).chain(serial.bytes()) {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01B3);
    }
    ((hash & 0x0FFF_FFFF_FFFF_FFFF) | (0x3 << 60)).to_be_bytes()
}

/// A designation descriptor (SPC-5 7.7.6.1).
fn designator(out: &mut Vec<u8>, protocol_and_code_set: u8, piv_assoc_type: u8, id: &[u8]) {
    let len = u8::try_from(id.len()).expect("designators here are short");
    out.extend_from_slice(&[protocol_and_code_set, piv_assoc_type, 0, len]);
    out.extend_from_slice(id);
}

/// A VPD page: the header (device type 0, page code, PAGE LENGTH) and `body`.
fn vpd_page(code: u8, body: &[u8]) -> Vec<u8> {
    let len = u16::try_from(body.len()).expect("VPD pages here are short");
    let mut page = vec![0, code];
    page.extend_from_slice(&len.to_be_bytes());
    page.extend_from_slice(body);
    page
}

impl LogicalUnit {
    /// INQUIRY: standard data (EVPD 0) or a VPD page.
    pub(super) fn inquiry(&self, volume: &Attachment, nexus: &Nexus, cdb: &Cdb<'_>) -> Outcome {
        if cdb.bit(1, 1)? {
            return Err(Check::invalid_cdb(1, Some(1)).into()); // CmdDt (obsolete)
        }
        let evpd = cdb.bit(1, 0)?;
        let page = cdb.u8(2)?;
        let alloc = usize::from(cdb.be16(3)?);
        let data = match (evpd, page) {
            (false, 0) => standard(volume),
            (false, _) => return Err(Check::invalid_cdb(2, None).into()),
            (true, 0x00) => vpd_page(0x00, &VPD_PAGES),
            (true, 0x80) => vpd_page(0x80, self.serial.as_bytes()),
            (true, 0x83) => self.device_identification(nexus),
            (true, 0xB0) => block_limits(volume),
            (true, 0xB1) => block_device_characteristics(),
            (true, 0xB2) => logical_block_provisioning(),
            (true, _) => return Err(Check::invalid_cdb(2, None).into()),
        };
        Ok(data_in(data, alloc))
    }

    /// Device Identification (83h): an NAA designator and a T10 vendor ID of the logical unit,
    /// the target's SCSI name string, and the relative port of the nexus asking.
    fn device_identification(&self, nexus: &Nexus) -> Vec<u8> {
        let mut body = Vec::new();
        // Binary code set, logical unit association, NAA.
        designator(&mut body, 0x01, 0x03, &self.naa);
        // ASCII, logical unit association, T10 vendor ID: vendor and serial.
        let mut t10 = VENDOR.to_vec();
        t10.extend_from_slice(self.serial.as_bytes());
        t10.truncate(252);
        designator(&mut body, 0x02, 0x01, &t10);
        // iSCSI, binary, PIV, target port association, relative target port.
        let port = nexus.relative_target_port.to_be_bytes();
        designator(&mut body, 0x51, 0x94, &[0, 0, port[0], port[1]]);
        // iSCSI, UTF-8, PIV, target device association, SCSI name string: null-terminated,
        // padded to a multiple of 4 (SPC-5 7.7.6.11), at most 256 bytes.
        let mut name = printable(&self.target_name).into_bytes();
        name.truncate(223);
        name.push(0);
        name.resize(name.len().next_multiple_of(4), 0);
        designator(&mut body, 0x53, 0xA8, &name);
        vpd_page(0x83, &body)
    }
}

/// Standard INQUIRY data (SPC-5 6.7.2), 96 bytes with version descriptors.
fn standard(volume: &Attachment) -> Vec<u8> {
    let mut d = vec![0u8; 96];
    d[0] = 0x00; // connected, direct access block device
    d[2] = 0x06; // SPC-4
    d[3] = 0x12; // HISUP, RESPONSE DATA FORMAT 2
    d[4] = 96 - 5; // ADDITIONAL LENGTH
    d[7] = 0x02; // CMDQUE
    d[8..16].copy_from_slice(VENDOR);
    let product = if volume.info().name.is_empty() { "VOLUME" } else { volume.info().name.as_str() };
    d[16..32].copy_from_slice(&ascii_field(product, 16));
    d[32..36].copy_from_slice(&ascii_field(env!("CARGO_PKG_VERSION"), 4));
    // Version descriptors: SAM-5, iSCSI, SPC-4, SBC-3.
    for (i, v) in [0x00A0u16, 0x0960, 0x0460, 0x04C0].into_iter().enumerate() {
        d[58 + 2 * i..60 + 2 * i].copy_from_slice(&v.to_be_bytes());
    }
    d
}

/// Block Limits (B0h, SBC-4 6.6.4): 64 bytes.
fn block_limits(volume: &Attachment) -> Vec<u8> {
    let mut b = vec![0u8; 60];
    b[0] = 0x01; // WSNZ: WRITE SAME with 0 blocks is refused, not "to the end"
    b[1] = MAX_COMPARE_AND_WRITE_BLOCKS;
    let preferred_blocks = (volume.info().preferred_block_bytes / LOGICAL_BLOCK_BYTES).max(1);
    let granularity = u16::try_from(preferred_blocks).unwrap_or(u16::MAX);
    b[2..4].copy_from_slice(&granularity.to_be_bytes());
    b[4..8].copy_from_slice(&MAX_TRANSFER_BLOCKS.to_be_bytes());
    let optimal = u32::try_from(preferred_blocks).unwrap_or(u32::MAX).min(MAX_TRANSFER_BLOCKS);
    b[8..12].copy_from_slice(&optimal.to_be_bytes());
    b[16..20].copy_from_slice(&MAX_UNMAP_BLOCKS.to_be_bytes());
    b[20..24].copy_from_slice(&MAX_UNMAP_DESCRIPTORS.to_be_bytes());
    b[24..28].copy_from_slice(&UNMAP_GRANULARITY_BLOCKS.to_be_bytes());
    b[28..32].copy_from_slice(&0x8000_0000u32.to_be_bytes()); // UGAVALID, aligned at LBA 0
    b[32..40].copy_from_slice(&MAX_WRITE_SAME_BLOCKS.to_be_bytes());
    vpd_page(0xB0, &b)
}

/// Block Device Characteristics (B1h, SBC-4 6.6.2): non-rotating medium.
fn block_device_characteristics() -> Vec<u8> {
    let mut b = vec![0u8; 60];
    b[0..2].copy_from_slice(&1u16.to_be_bytes());
    vpd_page(0xB1, &b)
}

/// Logical Block Provisioning (B2h, SBC-4 6.6.6): UNMAP, WRITE SAME(16) and (10) with UNMAP,
/// unmapped blocks read as zeros, thin provisioned.
fn logical_block_provisioning() -> Vec<u8> {
    // THRESHOLD EXPONENT; LBPU LBPWS LBPWS10 and LBPRZ 001b; PROVISIONING TYPE 2; reserved.
    vpd_page(0xB2, &[0x00, 0xE4, 0x02, 0x00])
}

/// REPORT LUNS: LUN 0, the only one of this target (SELECT REPORT 00h and 02h), or no
/// well-known logical units (01h).
pub(super) fn report_luns(cdb: &Cdb<'_>) -> Outcome {
    let select = cdb.u8(2)?;
    let alloc = cdb.be32(6)?;
    if alloc < 16 {
        return Err(Check::invalid_cdb(6, None).into());
    }
    let luns: u32 = match select {
        0x00 | 0x02 => 1,
        0x01 => 0,
        _ => return Err(Check::invalid_cdb(2, None).into()),
    };
    let mut d = vec![0u8; 8];
    d[0..4].copy_from_slice(&(luns * 8).to_be_bytes());
    d.resize(8 + 8 * usize::try_from(luns).expect("at most one"), 0); // LUN 0 is all zeros
    Ok(data_in(d, usize::try_from(alloc).unwrap_or(usize::MAX)))
}
