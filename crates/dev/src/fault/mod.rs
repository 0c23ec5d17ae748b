//! A seeded fault-injecting drive for crash and fault tests.
//!
//! [`FaultDevice`] wraps a [`MemDevice`] and, driven by a seed (ChaCha8), injects transient I/O
//! errors, drive death, latent sector errors, bit flips (stored or on read), misdirected, lost and
//! torn writes, and power cuts that drop unflushed writes. Several drives share one
//! [`PowerSwitch`] so a cut hits them at the same point. Every injected fault is logged and
//! counted ([`FaultDevice::events`], [`FaultDevice::counts`]), so a test can check that what the
//! engine detected equals what was injected. Same seed, same configuration and same sequence of
//! requests give the same outcome; requests are applied synchronously, one at a time per drive.

mod durable;
mod hold;
mod log;
mod power;
mod space;

use std::future::{Future, ready};
use std::io;
use std::ops::Range;
use std::sync::Arc;

use parking_lot::Mutex;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::buf::{IoBuf, IoBytes};
use crate::counters::DevCounters;
use crate::device::{BLOCK_BYTES, BLOCK_USIZE as BLOCK, BlockDevice, DevError, check_range};
use crate::mem::MemDevice;
use durable::Versions;
pub use hold::HoldWrites;
pub use log::{FaultConfig, FaultCounts, FaultEvent, FaultKind};
use power::Power;
pub use power::{PowerCutPoint, PowerSwitch};
pub use space::HostSpace;

/// Events kept in the log; later ones are still counted but not kept.
pub const FAULT_EVENTS_MAX: usize = 100_000;

/// The bits in one block.
const BLOCK_BITS: u32 = 4096 * 8;
const _: () = assert!(BLOCK_BITS as u64 == BLOCK_BYTES * 8, "BLOCK_BITS is the bits of one block");

/// One-shot faults armed by the control API; each applies to the next matching request.
#[derive(Debug, Default)]
struct Armed {
    read_errors: u32,
    write_errors: u32,
    lost_writes: u32,
    torn_writes: u32,
    misdirected_writes: u32,
}

#[derive(Debug)]
struct State {
    rng: ChaCha8Rng,
    config: FaultConfig,
    armed: Armed,
    /// Requests seen by this drive (the power switch and bad ranges aside).
    op_index: u64,
    dead: bool,
    latent: std::collections::BTreeSet<u64>,
    versions: Versions,
    events: Vec<FaultEvent>,
    counts: FaultCounts,
}

impl State {
    fn log(&mut self, kind: FaultKind, offset_bytes: u64, len_bytes: u64) {
        self.counts.count(&kind);
        tracing::debug!(op_index = self.op_index, ?kind, offset_bytes, len_bytes, "injected fault");
        if self.events.len() < FAULT_EVENTS_MAX {
            self.events.push(FaultEvent { op_index: self.op_index, kind, offset_bytes, len_bytes });
        }
    }

    /// True with probability `p` (draws from the RNG only when `p > 0`).
    fn roll(&mut self, p: f64) -> bool {
        p > 0.0 && self.rng.random::<f64>() < p
    }
}

/// Consumes one armed one-shot fault, if any is armed.
fn take_armed(armed: &mut u32) -> bool {
    let hit = *armed > 0;
    *armed = armed.saturating_sub(1);
    hit
}

/// A memory drive that misbehaves on purpose. See the module documentation.
#[derive(Debug)]
pub struct FaultDevice {
    name: Arc<str>,
    mem: MemDevice,
    state: Mutex<State>,
    power: Option<Arc<PowerSwitch>>,
    space: Option<Arc<HostSpace>>,
    counters: DevCounters,
}

impl FaultDevice {
    /// A fault-free, zero-filled drive of `size_bytes`; faults come from the control API.
    pub fn new(name: &str, size_bytes: u64, seed: u64) -> FaultDevice {
        FaultDevice::with_config(MemDevice::new(name, size_bytes), FaultConfig::default(), seed)
    }

    /// Wraps `mem` (for example a crash image being "rebooted") with `config` and `seed`.
    ///
    /// Panics if a probability is outside `[0, 1]` (a test bug).
    pub fn with_config(mem: MemDevice, config: FaultConfig, seed: u64) -> FaultDevice {
        for p in [
            config.read_error_probability,
            config.write_error_probability,
            config.read_bit_flip_probability,
            config.misdirected_write_probability,
            config.lost_write_probability,
            config.torn_write_probability,
        ] {
            assert!((0.0..=1.0).contains(&p), "fault probability {p} is outside [0, 1]");
        }
        let name: Arc<str> = Arc::from(mem.name());
        let state = State {
            rng: ChaCha8Rng::seed_from_u64(seed),
            versions: Versions::new(config.unflushed_versions_per_block_max),
            latent: Default::default(),
            config: FaultConfig { latent_error_blocks: Vec::new(), ..config.clone() },
            armed: Armed::default(),
            op_index: 0,
            dead: false,
            events: Vec::new(),
            counts: FaultCounts::default(),
        };
        let dev = FaultDevice {
            name,
            mem,
            state: Mutex::new(state),
            power: None,
            space: None,
            counters: DevCounters::default(),
        };
        for block_index in config.latent_error_blocks {
            dev.add_latent_error(block_index);
        }
        dev
    }

    /// Attaches the drive to a power switch shared with other drives.
    pub fn with_power_switch(mut self, switch: Arc<PowerSwitch>) -> FaultDevice {
        self.power = Some(switch);
        self
    }

    /// Puts the drive (a file) on a host filesystem shared with other drives: while it is full,
    /// writes and flushes fail with ENOSPC and store nothing.
    pub fn with_host_space(mut self, space: Arc<HostSpace>) -> FaultDevice {
        self.space = Some(space);
        self
    }

    /// Kills the drive: every later request fails with EIO.
    pub fn kill(&self) {
        let mut state = self.state.lock();
        if !state.dead {
            state.dead = true;
            state.log(FaultKind::DriveDied, 0, 0);
        }
    }

    /// True once the drive has died.
    pub fn is_dead(&self) -> bool {
        self.state.lock().dead
    }

    /// The next read fails with EIO (calls add up).
    pub fn arm_read_error(&self) {
        self.state.lock().armed.read_errors += 1;
    }

    /// The next write fails with EIO and writes nothing.
    pub fn arm_write_error(&self) {
        self.state.lock().armed.write_errors += 1;
    }

    /// The next write is acknowledged but not stored.
    pub fn arm_lost_write(&self) {
        self.state.lock().armed.lost_writes += 1;
    }

    /// The next multi-block write stores only some of its blocks.
    pub fn arm_torn_write(&self) {
        self.state.lock().armed.torn_writes += 1;
    }

    /// The next write lands at another offset.
    pub fn arm_misdirected_write(&self) {
        self.state.lock().armed.misdirected_writes += 1;
    }

    /// Block `block_index` fails reads with EIO until it is rewritten (or discarded).
    pub fn add_latent_error(&self, block_index: u64) {
        assert!(block_index < self.mem.size_bytes() / BLOCK_BYTES, "latent error beyond the drive");
        let mut state = self.state.lock();
        if state.latent.insert(block_index) {
            state.log(FaultKind::LatentErrorAdded { block_index }, block_index * BLOCK_BYTES, BLOCK_BYTES);
        }
    }

    /// Blocks that currently fail reads.
    pub fn latent_error_blocks(&self) -> Vec<u64> {
        self.state.lock().latent.iter().copied().collect()
    }

    /// Silently flips bit `bit_index` (0..32768) of stored block `block_index`.
    pub fn flip_bit(&self, block_index: u64, bit_index: u32) {
        assert!(block_index < self.mem.size_bytes() / BLOCK_BYTES, "bit flip beyond the drive");
        assert!(bit_index < BLOCK_BITS, "bit {bit_index} is outside a block");
        let mut state = self.state.lock();
        state.versions.flip_bit(&self.mem, block_index, bit_index);
        state.log(
            FaultKind::StoredBitFlip { block_index, bit_index },
            block_index * BLOCK_BYTES,
            BLOCK_BYTES,
        );
    }

    /// Flips a random bit (from the drive's seed) of a random block in `blocks`; returns
    /// `(block_index, bit_index)`.
    pub fn flip_random_bit(&self, blocks: Range<u64>) -> (u64, u32) {
        assert!(!blocks.is_empty(), "no block to flip a bit in");
        let (block_index, bit_index) = {
            let mut state = self.state.lock();
            let block_index = state.rng.random_range(blocks);
            (block_index, state.rng.random_range(0..BLOCK_BITS))
        };
        self.flip_bit(block_index, bit_index);
        (block_index, bit_index)
    }

    /// Replaces the probabilities and countdown (latent blocks in `config` are added).
    pub fn set_config(&self, config: FaultConfig) {
        let latent = config.latent_error_blocks.clone();
        self.state.lock().config = FaultConfig { latent_error_blocks: Vec::new(), ..config };
        for block_index in latent {
            self.add_latent_error(block_index);
        }
    }

    /// The log of injected faults (the first [`FAULT_EVENTS_MAX`]).
    pub fn events(&self) -> Vec<FaultEvent> {
        self.state.lock().events.clone()
    }

    /// How many faults of each kind were injected.
    pub fn counts(&self) -> FaultCounts {
        self.state.lock().counts
    }

    /// Blocks written since the last flush (what a power cut may roll back).
    pub fn unflushed_blocks(&self) -> usize {
        self.state.lock().versions.unflushed_blocks()
    }

    /// Copies the live contents at `offset_bytes` into `out`, bypassing every fault and counter.
    pub fn peek(&self, offset_bytes: u64, out: &mut [u8]) {
        self.mem.read_at(offset_bytes, out);
    }

    /// Overwrites the medium at `offset_bytes` (block aligned) with `data`, durably, bypassing
    /// every fault and counter: for tests that build a state by hand (an old copy of part of a
    /// drive put back, say).
    pub fn poke(&self, offset_bytes: u64, data: &[u8]) {
        self.state.lock().versions.write(&self.mem, offset_bytes, data, true);
    }

    /// The drive's contents after a power cut now, as a fresh memory drive to "reboot" with:
    /// flushed data as is, and each block written since the last flush at its durable version or
    /// any later one, chosen per block by `seed`. Different seeds explore different outcomes of
    /// the same cut. Latent errors and the fault configuration are not carried over.
    pub fn crash_image(&self, seed: u64) -> MemDevice {
        self.state.lock().versions.crash_image(&self.mem, &self.name, seed)
    }

    /// The drive's contents after the *process* died now (`kill -9`), as a fresh memory drive:
    /// every write the drive accepted is there, flushed or not (the operating system still
    /// writes back what the process handed it). The cut request itself landed or not, as
    /// [`FaultDevice::admit`] decided.
    pub fn kill_image(&self) -> MemDevice {
        self.mem.clone_contents(&self.name)
    }

    /// Logs `kind` and fails the request with it.
    fn refuse(&self, state: &mut State, kind: FaultKind, offset_bytes: u64, len_bytes: u64) -> DevError {
        self.counters.record_error();
        let source = match kind {
            FaultKind::HostFull => io::Error::from_raw_os_error(libc::ENOSPC),
            _ => io::Error::other(format!("injected fault: {kind:?}")),
        };
        state.log(kind, offset_bytes, len_bytes);
        DevError::Io { device: Arc::clone(&self.name), offset_bytes, len_bytes, source }
    }

    /// The checks every request goes through: the power switch, then the drive's own death.
    /// A write that is cut lands (unflushed) or not, at the seed's choice; it still fails.
    fn admit(&self, state: &mut State, offset_bytes: u64, write: Option<&[u8]>) -> Result<(), FaultKind> {
        if let Some(switch) = &self.power {
            match switch.pass(&self.name) {
                Power::On => {}
                Power::Off => return Err(FaultKind::PoweredOffRequest),
                Power::CutNow => {
                    state.op_index += 1;
                    // The write under the cut lands whole, not at all, or torn: each of its
                    // blocks independently (a multi-block write is not atomic on a real drive).
                    if let Some(data) = write {
                        let torn = data.len() > BLOCK && state.rng.random_bool(0.3);
                        let whole = state.rng.random_bool(0.5);
                        for (i, block) in data.chunks_exact(BLOCK).enumerate() {
                            if (torn && state.rng.random_bool(0.5)) || (!torn && whole) {
                                let at = offset_bytes + (i * BLOCK) as u64;
                                state.versions.write(&self.mem, at, block, false);
                            }
                        }
                    }
                    return Err(FaultKind::PowerCut);
                }
            }
        }
        state.op_index += 1;
        if !state.dead && state.config.die_after_ops.is_some_and(|n| state.op_index > n) {
            state.dead = true;
            state.log(FaultKind::DriveDied, 0, 0);
        }
        if state.dead {
            return Err(FaultKind::DeadDriveRequest);
        }
        Ok(())
    }

    fn do_read(&self, offset_bytes: u64, buf: &mut [u8]) -> Result<(), DevError> {
        let len_bytes = buf.len() as u64;
        let mut state = self.state.lock();
        if let Err(kind) = self.admit(&mut state, offset_bytes, None) {
            return Err(self.refuse(&mut state, kind, offset_bytes, len_bytes));
        }
        let blocks = offset_bytes / BLOCK_BYTES..(offset_bytes + len_bytes) / BLOCK_BYTES;
        if let Some(&block_index) = state.latent.range(blocks).next() {
            let kind = FaultKind::LatentReadFailure { block_index };
            return Err(self.refuse(&mut state, kind, offset_bytes, len_bytes));
        }
        let p = state.config.read_error_probability;
        if take_armed(&mut state.armed.read_errors) || state.roll(p) {
            return Err(self.refuse(&mut state, FaultKind::ReadError, offset_bytes, len_bytes));
        }
        self.mem.read_at(offset_bytes, buf);
        let p = state.config.read_bit_flip_probability;
        if !buf.is_empty() && state.roll(p) {
            let byte_index = state.rng.random_range(0..buf.len());
            let bit_index = state.rng.random_range(0..8u32);
            buf[byte_index] ^= 1 << bit_index;
            state.log(
                FaultKind::ReadBitFlip { byte_index: byte_index as u64, bit_index },
                offset_bytes,
                len_bytes,
            );
        }
        self.counters.record_read(len_bytes);
        Ok(())
    }

    fn do_write(&self, offset_bytes: u64, data: &[u8], fua: bool) -> Result<(), DevError> {
        let len_bytes = data.len() as u64;
        let mut state = self.state.lock();
        if let Err(kind) = self.admit(&mut state, offset_bytes, Some(data)) {
            return Err(self.refuse(&mut state, kind, offset_bytes, len_bytes));
        }
        if self.space.as_ref().is_some_and(|s| !s.admit()) {
            return Err(self.refuse(&mut state, FaultKind::HostFull, offset_bytes, len_bytes));
        }
        let p = state.config.write_error_probability;
        if take_armed(&mut state.armed.write_errors) || state.roll(p) {
            return Err(self.refuse(&mut state, FaultKind::WriteError, offset_bytes, len_bytes));
        }
        self.counters.record_write(len_bytes);
        let p = state.config.lost_write_probability;
        if take_armed(&mut state.armed.lost_writes) || state.roll(p) {
            state.log(FaultKind::LostWrite, offset_bytes, len_bytes);
            return Ok(());
        }
        let blocks_total = len_bytes / BLOCK_BYTES;
        let p = state.config.misdirected_write_probability;
        if blocks_total < self.mem.size_bytes() / BLOCK_BYTES
            && (take_armed(&mut state.armed.misdirected_writes) || state.roll(p))
        {
            let landed_offset_bytes = self.misdirect_target(&mut state, offset_bytes, len_bytes);
            self.store(&mut state, landed_offset_bytes, data, fua);
            state.log(FaultKind::MisdirectedWrite { landed_offset_bytes }, offset_bytes, len_bytes);
            return Ok(());
        }
        let p = state.config.torn_write_probability;
        if blocks_total > 1 && (take_armed(&mut state.armed.torn_writes) || state.roll(p)) {
            let blocks_landed = self.store_torn(&mut state, offset_bytes, data, fua);
            state.log(FaultKind::TornWrite { blocks_landed, blocks_total }, offset_bytes, len_bytes);
            return Ok(());
        }
        self.store(&mut state, offset_bytes, data, fua);
        Ok(())
    }

    /// A block-aligned offset where `len_bytes` fits, not overlapping the intended range when
    /// the drive has room for that (so the intended blocks keep their old data).
    fn misdirect_target(&self, state: &mut State, offset_bytes: u64, len_bytes: u64) -> u64 {
        let blocks_total = self.mem.size_bytes() / BLOCK_BYTES;
        let n = len_bytes / BLOCK_BYTES;
        let intended = offset_bytes / BLOCK_BYTES;
        // Starts left of the intended range: 0..=intended-n; right of it: intended+n..=total-n.
        let left_count = if intended >= n { intended - n + 1 } else { 0 };
        let right_first = intended + n;
        let right_count = (blocks_total + 1).saturating_sub(right_first + n);
        let start = if left_count + right_count > 0 {
            let drawn = state.rng.random_range(0..left_count + right_count);
            if drawn < left_count { drawn } else { right_first + drawn - left_count }
        } else {
            // A tiny drive: any other start (overlapping) will do; the caller made sure one exists.
            let drawn = state.rng.random_range(0..blocks_total - n);
            if drawn >= intended { drawn + 1 } else { drawn }
        };
        start * BLOCK_BYTES
    }

    /// Stores a write on the medium: it clears latent errors of the blocks it covers.
    fn store(&self, state: &mut State, offset_bytes: u64, data: &[u8], fua: bool) {
        let first = offset_bytes / BLOCK_BYTES;
        let blocks = first..first + data.len() as u64 / BLOCK_BYTES;
        let healed: Vec<u64> = state.latent.range(blocks).copied().collect();
        for block_index in healed {
            state.latent.remove(&block_index);
        }
        state.versions.write(&self.mem, offset_bytes, data, fua);
    }

    /// Stores a random proper, non-empty subset of the blocks of `data`; returns how many landed.
    fn store_torn(&self, state: &mut State, offset_bytes: u64, data: &[u8], fua: bool) -> u64 {
        let blocks = data.len() / BLOCK;
        let mut lands: Vec<bool> = (0..blocks).map(|_| state.rng.random_bool(0.5)).collect();
        let missing = state.rng.random_range(0..blocks);
        let landing = (missing + state.rng.random_range(1..blocks)) % blocks;
        lands[missing] = false;
        lands[landing] = true;
        for (i, _) in lands.iter().enumerate().filter(|(_, lands)| **lands) {
            let at = offset_bytes + (i * BLOCK) as u64;
            self.store(state, at, &data[i * BLOCK..(i + 1) * BLOCK], fua);
        }
        lands.iter().filter(|l| **l).count() as u64
    }

    fn do_flush(&self) -> Result<(), DevError> {
        let mut state = self.state.lock();
        if let Err(kind) = self.admit(&mut state, 0, None) {
            return Err(self.refuse(&mut state, kind, 0, 0));
        }
        // A filesystem reports ENOSPC on fsync too (blocks it could not allocate at write-back);
        // the data written before stays where it was (not made durable).
        if self.space.as_ref().is_some_and(|s| !s.admit()) {
            return Err(self.refuse(&mut state, FaultKind::HostFull, 0, 0));
        }
        state.versions.flush();
        self.counters.record_flush();
        Ok(())
    }

    fn do_discard(&self, offset_bytes: u64, len_bytes: u64) -> Result<(), DevError> {
        let mut state = self.state.lock();
        if let Err(kind) = self.admit(&mut state, offset_bytes, None) {
            return Err(self.refuse(&mut state, kind, offset_bytes, len_bytes));
        }
        // Discarded blocks read as zeros; for power cuts that is one more unflushed version.
        let zeros = vec![0u8; BLOCK];
        for at in (offset_bytes..offset_bytes + len_bytes).step_by(BLOCK) {
            self.store(&mut state, at, &zeros, false);
        }
        self.counters.record_discard();
        Ok(())
    }
}

/// A request's result, delivered after `polls_left` more polls (see
/// [`FaultConfig::completion_polls_max`]).
struct Delayed<T> {
    result: Option<T>,
    polls_left: u32,
}

impl<T: Unpin> Future for Delayed<T> {
    type Output = T;
    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<T> {
        if self.polls_left > 0 {
            self.polls_left -= 1;
            cx.waker().wake_by_ref();
            return std::task::Poll::Pending;
        }
        std::task::Poll::Ready(self.result.take().expect("polled after completion"))
    }
}

impl FaultDevice {
    /// Wraps a request's result so that it completes after a seeded number of polls.
    fn delayed<T: Unpin>(&self, result: T) -> Delayed<T> {
        let mut state = self.state.lock();
        let max = state.config.completion_polls_max;
        let polls_left = if max == 0 { 0 } else { state.rng.random_range(0..=max) };
        Delayed { result: Some(result), polls_left }
    }
}

impl BlockDevice for FaultDevice {
    fn name(&self) -> &str {
        &self.name
    }

    fn size_bytes(&self) -> u64 {
        self.mem.size_bytes()
    }

    fn read(
        &self,
        offset_bytes: u64,
        mut buf: IoBuf,
    ) -> impl Future<Output = Result<IoBuf, DevError>> + Send {
        let len_bytes = buf.len() as u64;
        let result = check_range(&self.name, self.mem.size_bytes(), offset_bytes, len_bytes)
            .and_then(|()| self.do_read(offset_bytes, &mut buf))
            .map(|()| buf);
        self.delayed(result)
    }

    fn write(
        &self,
        offset_bytes: u64,
        data: IoBytes,
        fua: bool,
    ) -> impl Future<Output = Result<(), DevError>> + Send {
        let result = check_range(&self.name, self.mem.size_bytes(), offset_bytes, data.len() as u64)
            .and_then(|()| self.do_write(offset_bytes, &data, fua));
        self.delayed(result)
    }

    fn flush(&self) -> impl Future<Output = Result<(), DevError>> + Send {
        self.delayed(self.do_flush())
    }

    fn discard(
        &self,
        offset_bytes: u64,
        len_bytes: u64,
    ) -> impl Future<Output = Result<(), DevError>> + Send {
        let result = check_range(&self.name, self.mem.size_bytes(), offset_bytes, len_bytes)
            .and_then(|()| self.do_discard(offset_bytes, len_bytes));
        ready(result)
    }

    fn counters(&self) -> &DevCounters {
        &self.counters
    }
}
