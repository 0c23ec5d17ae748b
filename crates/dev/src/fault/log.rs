//! What the fault injector is told to do ([`FaultConfig`]) and what it did ([`FaultEvent`],
//! [`FaultCounts`]), so a test can assert that every injected fault was detected.

/// Probabilities and countdowns of a [`super::FaultDevice`]. All probabilities are per request
/// and in `[0, 1]`; zero (the default) disables a fault.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct FaultConfig {
    /// A read fails with EIO (nothing else happens).
    pub read_error_probability: f64,
    /// A write fails with EIO and writes nothing.
    pub write_error_probability: f64,
    /// A read returns data with one bit flipped (the stored data is intact).
    pub read_bit_flip_probability: f64,
    /// A write lands at another, random offset; the intended blocks keep their old data.
    pub misdirected_write_probability: f64,
    /// A write is acknowledged but never stored.
    pub lost_write_probability: f64,
    /// A multi-block write is acknowledged but only some of its blocks are stored.
    pub torn_write_probability: f64,
    /// The drive dies after this many requests: every later request fails with EIO.
    pub die_after_ops: Option<u64>,
    /// Blocks (indexes of [`crate::BLOCK_BYTES`]-byte blocks) that fail reads until rewritten.
    pub latent_error_blocks: Vec<u64>,
    /// Unflushed versions kept per block for power cuts (older middle versions are forgotten,
    /// which only narrows the choice of post-crash contents). At least 1.
    pub unflushed_versions_per_block_max: usize,
    /// Each request completes after 0 to this many polls (drawn by the seed; its effect on the
    /// medium happens when it is submitted). With 0 every request completes at once; above 0 the
    /// caller's other tasks run between a request's submission and its completion, so a seeded
    /// simulation explores interleavings (a flush racing a write, a close racing a destage).
    pub completion_polls_max: u32,
}

impl Default for FaultConfig {
    fn default() -> Self {
        FaultConfig {
            read_error_probability: 0.0,
            write_error_probability: 0.0,
            read_bit_flip_probability: 0.0,
            misdirected_write_probability: 0.0,
            lost_write_probability: 0.0,
            torn_write_probability: 0.0,
            die_after_ops: None,
            latent_error_blocks: Vec::new(),
            unflushed_versions_per_block_max: 8,
            completion_polls_max: 0,
        }
    }
}

/// One injected fault (or a request refused because of one).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum FaultKind {
    /// A read failed with a transient EIO.
    ReadError,
    /// A write failed with a transient EIO and wrote nothing.
    WriteError,
    /// A block was marked as failing reads until rewritten.
    LatentErrorAdded { block_index: u64 },
    /// A read failed because it covered a latent bad block.
    LatentReadFailure { block_index: u64 },
    /// A stored bit was flipped (silent corruption of the medium).
    StoredBitFlip { block_index: u64, bit_index: u32 },
    /// A read returned one flipped bit at `byte_index` of the request.
    ReadBitFlip { byte_index: u64, bit_index: u32 },
    /// A write landed at `landed_offset_bytes` instead of the request's offset.
    MisdirectedWrite { landed_offset_bytes: u64 },
    /// A write was acknowledged but not stored.
    LostWrite,
    /// A write was acknowledged but only `blocks_landed` of its `blocks_total` blocks were stored.
    TornWrite { blocks_landed: u64, blocks_total: u64 },
    /// The drive died (on command or after its countdown).
    DriveDied,
    /// A request failed because the drive is dead.
    DeadDriveRequest,
    /// The power was cut during this request (which failed; a write may or may not have landed).
    PowerCut,
    /// A request failed because the power is off.
    PoweredOffRequest,
    /// A write or flush failed with ENOSPC: the host filesystem under the drive is full.
    HostFull,
}

/// One entry of the fault log.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FaultEvent {
    /// 1-based index of the request on this drive (0 for faults injected by a control call).
    pub op_index: u64,
    pub kind: FaultKind,
    /// The request's range (or the affected block for control calls).
    pub offset_bytes: u64,
    pub len_bytes: u64,
}

/// How many faults of each kind were injected.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FaultCounts {
    pub read_errors: u64,
    pub write_errors: u64,
    pub latent_errors_added: u64,
    pub latent_read_failures: u64,
    pub stored_bit_flips: u64,
    pub read_bit_flips: u64,
    pub misdirected_writes: u64,
    pub lost_writes: u64,
    pub torn_writes: u64,
    pub drive_deaths: u64,
    pub dead_drive_requests: u64,
    pub power_cuts: u64,
    pub powered_off_requests: u64,
    #[serde(default)]
    pub host_full_requests: u64,
}

impl FaultCounts {
    /// Faults that silently corrupt data (nothing fails; only a checksum can tell).
    pub fn silent_corruptions(&self) -> u64 {
        self.stored_bit_flips
            + self.read_bit_flips
            + self.misdirected_writes
            + self.lost_writes
            + self.torn_writes
    }

    /// Requests that returned an error because of an injected fault.
    pub fn failed_requests(&self) -> u64 {
        self.read_errors
            + self.write_errors
            + self.latent_read_failures
            + self.dead_drive_requests
            + self.power_cuts
            + self.powered_off_requests
            + self.host_full_requests
    }

    pub(super) fn count(&mut self, kind: &FaultKind) {
        let counter = match kind {
            FaultKind::ReadError => &mut self.read_errors,
            FaultKind::WriteError => &mut self.write_errors,
            FaultKind::LatentErrorAdded { .. } => &mut self.latent_errors_added,
            FaultKind::LatentReadFailure { .. } => &mut self.latent_read_failures,
            FaultKind::StoredBitFlip { .. } => &mut self.stored_bit_flips,
            FaultKind::ReadBitFlip { .. } => &mut self.read_bit_flips,
            FaultKind::MisdirectedWrite { .. } => &mut self.misdirected_writes,
            FaultKind::LostWrite => &mut self.lost_writes,
            FaultKind::TornWrite { .. } => &mut self.torn_writes,
            FaultKind::DriveDied => &mut self.drive_deaths,
            FaultKind::DeadDriveRequest => &mut self.dead_drive_requests,
            FaultKind::PowerCut => &mut self.power_cuts,
            FaultKind::PoweredOffRequest => &mut self.powered_off_requests,
            FaultKind::HostFull => &mut self.host_full_requests,
        };
        *counter += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_group_silent_corruptions_and_failures() {
        let mut counts = FaultCounts::default();
        for kind in [
            FaultKind::LostWrite,
            FaultKind::StoredBitFlip { block_index: 1, bit_index: 2 },
            FaultKind::ReadError,
            FaultKind::PowerCut,
            FaultKind::DriveDied,
        ] {
            counts.count(&kind);
        }
        assert_eq!(counts.silent_corruptions(), 2);
        assert_eq!(counts.failed_requests(), 2);
        assert_eq!(counts.drive_deaths, 1);
    }
}
