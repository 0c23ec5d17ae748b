//! A slice: a range of a node's drive served to coordinators, with its fencing epoch persisted
//! in its first block (docs/design/cluster.md §3.3).
//!
//! Slice header (block 0 of the backing device, 4096 bytes, little-endian):
//!
//! | bytes  | field                                                   |
//! |--------|---------------------------------------------------------|
//! | 0..8   | magic `STRIASLC`                                        |
//! | 8..12  | version, 1                                              |
//! | 12..16 | reserved, 0                                             |
//! | 16..32 | slice uuid (random at format)                           |
//! | 32..40 | epoch: the highest epoch fenced                         |
//! | 40..48 | usable bytes (the device minus this block)              |
//! | 48..52 | CRC32C of bytes 0..48                                   |
//! | 52..   | zero                                                    |
//!
//! Data byte `x` of the slice is byte `4096 + x` of the device.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use stria_dev::{BLOCK_BYTES, BLOCK_USIZE, BlockDevice, DevError, IoBuf, IoBytes};

const MAGIC: [u8; 8] = *b"STRIASLC";
const VERSION: u32 = 1;

/// Why a slice could not be formatted or opened.
#[derive(Debug, thiserror::Error)]
pub enum SliceError {
    #[error(transparent)]
    Dev(#[from] DevError),
    #[error("{device}: not a stria slice ({why})")]
    NotASlice { device: String, why: String },
    #[error("{device}: too small for a slice ({bytes} bytes; at least two blocks)")]
    TooSmall { device: String, bytes: u64 },
}

/// The decoded slice header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SliceHeader {
    pub uuid: [u8; 16],
    pub epoch: u64,
    pub usable_bytes: u64,
}

impl SliceHeader {
    /// The header block's bytes.
    pub fn encode(&self) -> [u8; BLOCK_USIZE] {
        let mut b = [0u8; BLOCK_USIZE];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[16..32].copy_from_slice(&self.uuid);
        b[32..40].copy_from_slice(&self.epoch.to_le_bytes());
        b[40..48].copy_from_slice(&self.usable_bytes.to_le_bytes());
        let sum = stria_dev::crc::crc32c(&b[..48]);
        b[48..52].copy_from_slice(&sum.to_le_bytes());
        b
    }

    /// Decodes a header block; `Err` says why it is not one.
    pub fn decode(b: &[u8]) -> Result<SliceHeader, String> {
        if b.len() < 52 {
            return Err(format!("{} bytes, a header has 52", b.len()));
        }
        if b[0..8] != MAGIC {
            return Err("no slice magic".into());
        }
        let sum = u32::from_le_bytes([b[48], b[49], b[50], b[51]]);
        if sum != stria_dev::crc::crc32c(&b[..48]) {
            return Err("header checksum mismatch".into());
        }
        let version = u32::from_le_bytes([b[8], b[9], b[10], b[11]]);
        if version != VERSION {
            return Err(format!("version {version}, this build reads {VERSION}"));
        }
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&b[16..32]);
        let u64_at = |at: usize| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&b[at..at + 8]);
            u64::from_le_bytes(x)
        };
        Ok(SliceHeader { uuid, epoch: u64_at(32), usable_bytes: u64_at(40) })
    }
}

/// Counters of one slice (what the cluster's checker and status read).
#[derive(Debug, Default)]
pub struct SliceCounters {
    /// Requests executed.
    pub executed: AtomicU64,
    /// Requests refused because their epoch was below the slice's.
    pub fenced: AtomicU64,
    /// Requests refused because their epoch was above the slice's (not fenced yet).
    pub unfenced: AtomicU64,
    /// FENCE requests that raised the epoch.
    pub fences: AtomicU64,
    /// Requests refused because another connection fenced the slice since (at the same epoch).
    pub superseded: AtomicU64,
}

/// One slice served by this node.
#[derive(Debug)]
pub struct Slice<D> {
    id: u32,
    dev: D,
    uuid: [u8; 16],
    usable_bytes: u64,
    /// The persisted epoch. Every data request holds it shared while it runs; FENCE holds it
    /// exclusively, so it waits for the requests of the old epoch and no request of a lower
    /// epoch starts after it.
    epoch: tokio::sync::RwLock<u64>,
    /// The connection that fenced the slice last (0: none since the server started, or a caller
    /// without one): requests of any other connection are refused, so a request still unread in
    /// an old connection cannot run after a newer FENCE, even one at the same epoch. Changed only
    /// under the epoch lock held exclusively.
    holder: AtomicU64,
    pub counters: SliceCounters,
}

/// Who sends a request: the slice server's id of the connection it came on (never 0).
pub type ConnectionId = u64;

impl<D: BlockDevice> Slice<D> {
    /// Formats `dev` as a new slice at epoch 0 (its data is left as it is: unwritten blocks of a
    /// fresh slice read as whatever the device held; the pool above formats what it uses).
    pub async fn format(id: u32, dev: D) -> Result<Slice<D>, SliceError> {
        let bytes = dev.size_bytes();
        if bytes < 2 * BLOCK_BYTES {
            return Err(SliceError::TooSmall { device: dev.name().to_string(), bytes });
        }
        let header = SliceHeader { uuid: rand::random(), epoch: 0, usable_bytes: bytes - BLOCK_BYTES };
        dev.write(0, IoBytes::copy_from(&header.encode()), true).await?;
        Ok(Slice::from_header(id, dev, header))
    }

    /// Opens a formatted slice.
    pub async fn open(id: u32, dev: D) -> Result<Slice<D>, SliceError> {
        let block = dev.read(0, IoBuf::zeroed(BLOCK_USIZE)).await?;
        let header = SliceHeader::decode(&block)
            .map_err(|why| SliceError::NotASlice { device: dev.name().to_string(), why })?;
        if header.usable_bytes + BLOCK_BYTES > dev.size_bytes() {
            return Err(SliceError::NotASlice {
                device: dev.name().to_string(),
                why: format!(
                    "the header says {} usable bytes, the device has {}",
                    header.usable_bytes,
                    dev.size_bytes()
                ),
            });
        }
        Ok(Slice::from_header(id, dev, header))
    }

    fn from_header(id: u32, dev: D, h: SliceHeader) -> Slice<D> {
        Slice {
            id,
            dev,
            uuid: h.uuid,
            usable_bytes: h.usable_bytes,
            epoch: tokio::sync::RwLock::new(h.epoch),
            holder: AtomicU64::new(0),
            counters: SliceCounters::default(),
        }
    }

    pub fn id(&self) -> u32 {
        self.id
    }

    pub fn uuid(&self) -> [u8; 16] {
        self.uuid
    }

    /// Bytes a coordinator can use.
    pub fn usable_bytes(&self) -> u64 {
        self.usable_bytes
    }

    /// The persisted epoch (waits while a FENCE runs).
    pub async fn epoch(&self) -> u64 {
        *self.epoch.read().await
    }

    /// The device under the slice.
    pub fn device(&self) -> &D {
        &self.dev
    }

    /// Raises the epoch to `epoch`: waits for every running request, persists the header with
    /// FUA, and only then returns. Returns the slice's epoch after the call; a lower `epoch` than
    /// the slice's changes nothing (the caller was fenced: compare the result).
    pub async fn fence(&self, epoch: u64) -> Result<u64, DevError> {
        self.fence_by(0, epoch).await
    }

    /// [`Slice::fence`] sent on connection `conn`: a FENCE that succeeds (raises the epoch or
    /// finds it equal) makes `conn` the slice's connection, and every other connection's requests
    /// are refused from then on (`0`: any connection's).
    pub async fn fence_by(&self, conn: ConnectionId, epoch: u64) -> Result<u64, DevError> {
        let mut current = self.epoch.write().await;
        if epoch > *current {
            let header = SliceHeader { uuid: self.uuid, epoch, usable_bytes: self.usable_bytes };
            self.dev.write(0, IoBytes::copy_from(&header.encode()), true).await?;
            *current = epoch;
            self.counters.fences.fetch_add(1, Relaxed);
        }
        if epoch == *current {
            self.holder.store(conn, Relaxed);
        }
        Ok(*current)
    }

    /// Runs `io` on the data area if `epoch` is the slice's epoch, holding the epoch shared
    /// while it runs. `Err(slice_epoch)` when it is not.
    pub async fn admit<T>(&self, epoch: u64, io: impl AsyncFnOnce(&D, u64) -> T) -> Result<T, (bool, u64)> {
        self.admit_by(0, epoch, io).await
    }

    /// [`Slice::admit`] for a request of connection `conn`: refused as not fenced
    /// (`Err((false, epoch))`) when another connection fenced the slice last.
    pub async fn admit_by<T>(
        &self,
        conn: ConnectionId,
        epoch: u64,
        io: impl AsyncFnOnce(&D, u64) -> T,
    ) -> Result<T, (bool, u64)> {
        let current = self.epoch.read().await;
        if epoch != *current {
            let below = epoch < *current;
            let counter = if below { &self.counters.fenced } else { &self.counters.unfenced };
            counter.fetch_add(1, Relaxed);
            return Err((below, *current));
        }
        let holder = self.holder.load(Relaxed);
        if holder != 0 && holder != conn {
            self.counters.superseded.fetch_add(1, Relaxed);
            return Err((false, *current));
        }
        let out = io(&self.dev, BLOCK_BYTES).await;
        self.counters.executed.fetch_add(1, Relaxed);
        drop(current);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_round_trips_and_refuses_damage() {
        let h = SliceHeader { uuid: [7; 16], epoch: 42, usable_bytes: 1 << 30 };
        let b = h.encode();
        assert_eq!(SliceHeader::decode(&b), Ok(h));
        for at in [0, 9, 20, 33, 41, 49] {
            let mut c = b;
            c[at] ^= 0x10;
            assert!(SliceHeader::decode(&c).is_err(), "byte {at} flipped was accepted");
        }
        assert!(SliceHeader::decode(&[0u8; 4096]).is_err());
        assert!(SliceHeader::decode(&b[..40]).is_err());
    }
}
