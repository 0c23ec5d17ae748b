//! One conformance suite for the volume contract (`stria_engine::BlockVolume`, engine
//! `volume/contract.rs`), run against every kind of volume the catalog hands out: plain
//! raid0, raid1, raid10 and ec:4+2 volumes, `tiered:ec:4+2` (write-through and write-back) and
//! `log:ec:4+2` volumes, a snapshot (read-only) and a clone (writable) of a log-structured volume.
//!
//! Each clause is one generic body over an `Arc<dyn BlockVolume>` looked up by name through the
//! catalog (as the NBD export gets it), plus a [`Kind`] that names the differences the contract
//! documents (read-only snapshots, the unit zeroing drops whole, writes that are durable when
//! acknowledged). Each body runs once per kind (`every_kind!`), so a failure names the clause and
//! the kind: `conformance::zeroing::ec`.
//!
//! A clause body also takes a [`Wrap`]: the tests pass [`plain`]; `catches.rs` passes broken
//! volumes to show that the clause fails on them.

pub mod block_status;
pub mod cancellation;
mod catches;
pub mod compare_and_write;
pub mod durability;
pub mod errors;
pub mod model_ops;
pub mod ranges;
pub mod unaligned;
pub mod zeroing;

use std::sync::Arc;

use rand::Rng;
use rand_chacha::ChaCha8Rng;
use stria_catalog::CreateVolume;
use stria_dev::{BLOCK_BYTES, IoBytes};
use stria_engine::{BlockVolume, Durability, ErrorKind, VolumeError};

use crate::common::{Rig, create_req, random_bytes, rng};

/// Bytes of every volume under test: not a whole number of ec rows (256 KiB), so the last row is
/// partial and the end of the volume is an edge of its own.
pub const SIZE_BYTES: u64 = (3 << 20) + 5 * BLOCK_BYTES;

/// Which implementation of the contract, as the catalog makes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Raid0,
    Raid1,
    Raid10,
    Ec,
    Tiered,
    Log,
    /// A `tiered:ec:4+2` volume made with `--cache-mode write-back`: writes without FUA are
    /// durable at the next flush, as on the plain kinds.
    WriteBack,
    /// `base@snap` of a `tiered:ec:4+2` volume, written before and after the snapshot.
    Snapshot,
    /// A clone of such a snapshot.
    Clone,
}

impl Kind {
    /// The catalog layout of the volume (of the origin, for snapshots and clones).
    pub fn layout(self) -> &'static str {
        match self {
            Kind::Raid0 => "raid0",
            Kind::Raid1 => "raid1",
            Kind::Raid10 => "raid10",
            Kind::Ec => "ec:4+2",
            Kind::Tiered | Kind::WriteBack | Kind::Snapshot | Kind::Clone => "tiered:ec:4+2",
            Kind::Log => "log:ec:4+2",
        }
    }

    /// A snapshot: reads only; writes, zeroing and discards fail with `ReadOnly`.
    pub fn read_only(self) -> bool {
        self == Kind::Snapshot
    }

    /// Log-structured kinds (but a write-back one) make every acknowledged write, zeroing and
    /// discard durable before completing (the contract's Durability clause): no flush needed.
    pub fn acked_is_durable(self) -> bool {
        matches!(self, Kind::Tiered | Kind::Log | Kind::Clone)
    }

    /// Whether zeroed whole units report unallocated. A snapshot takes no zeroing, and reports
    /// everything allocated ("allocated when in doubt").
    pub fn reports_holes(self) -> bool {
        !self.read_only()
    }
}

/// What a clause body runs against instead of the volume itself (a broken wrapper, in
/// `catches.rs`).
pub type Wrap = fn(Arc<dyn BlockVolume>) -> Arc<dyn BlockVolume>;

/// The volume as the catalog hands it out.
pub fn plain(vol: Arc<dyn BlockVolume>) -> Arc<dyn BlockVolume> {
    vol
}

/// A volume under test, the pool it lives in and what it must read back.
pub struct Subject {
    pub kind: Kind,
    pub rig: Rig,
    /// The name it is looked up by (`base@snap` for the snapshot).
    pub name: String,
    pub vol: Arc<dyn BlockVolume>,
    pub model: Model,
    /// Bytes of the unit zeroing drops whole: a block, or an ec row.
    pub zero_unit: u64,
    wrap: Wrap,
}

/// The origin of the snapshot and the clone.
const BASE: &str = "base";

impl Subject {
    /// A fresh pool with one volume of `kind` (and, for a snapshot or a clone, its origin).
    pub async fn new(kind: Kind, seed: u64, wrap: Wrap) -> Subject {
        Self::new_sized(kind, seed, wrap, SIZE_BYTES).await
    }

    /// [`Subject::new`] of `size_bytes`.
    pub async fn new_sized(kind: Kind, seed: u64, wrap: Wrap, size_bytes: u64) -> Subject {
        let rig = Rig::new(seed).await;
        let mut model = Model::zeros(size_bytes);
        let name = match kind {
            Kind::Snapshot | Kind::Clone => {
                let mut r = rng(seed ^ 0xba5e);
                // Room for the origin written twice over and the clone's own writes: a family
                // shares one segment space, and the default (1.5 x the size) would fill.
                let req = CreateVolume {
                    space_bytes: Some(4 * size_bytes),
                    ..create_req(BASE, size_bytes, kind.layout())
                };
                rig.catalog.create(req).await.expect("create the origin");
                let base = rig.volume(BASE);
                fill_pattern(&*base, &mut model, &mut r).await;
                rig.catalog.snapshot_create(BASE, "snap").await.expect("snapshot");
                let name = if kind == Kind::Snapshot {
                    "base@snap".to_string()
                } else {
                    rig.catalog.volume_clone("base@snap", "clone").await.expect("clone");
                    "clone".to_string()
                };
                // The origin moves on: none of this may show through the snapshot or the clone.
                let mut after = Model::zeros(size_bytes);
                after.bytes.clone_from(&model.bytes);
                fill_pattern(&*base, &mut after, &mut r).await;
                name
            }
            _ => {
                // Log-structured kinds get room to spare: with the default (1.5 x the size) a
                // whole rewrite after a whole discard fails (`errors::trim_then_rewrite`, a
                // finding of its own), which would hide every clause behind it.
                let space_bytes =
                    matches!(kind, Kind::Tiered | Kind::Log | Kind::WriteBack).then_some(4 * size_bytes);
                let cache_mode = (kind == Kind::WriteBack).then_some(stria_tier::log::CacheMode::WriteBack);
                let req =
                    CreateVolume { space_bytes, cache_mode, ..create_req("v", size_bytes, kind.layout()) };
                rig.catalog.create(req).await.expect("create");
                "v".to_string()
            }
        };
        let zero_unit = match kind {
            Kind::Ec => rig.catalog.pool().volume(&name).expect("plain volume").row_bytes(),
            _ => BLOCK_BYTES,
        };
        let vol = wrap(rig.volume(&name));
        assert_eq!(vol.size_bytes(), size_bytes, "{kind:?}: size as created");
        Subject { kind, rig, name, vol, model, zero_unit, wrap }
    }

    /// Looks the volume up again (after a reopen), through the same wrapper.
    pub fn relookup(&mut self) {
        self.vol = (self.wrap)(self.rig.volume(&self.name));
    }

    pub fn size(&self) -> u64 {
        self.model.len()
    }

    /// Reads the whole volume and compares it with the model.
    pub async fn check_all(&self, what: &str) {
        self.check_range(0, self.size(), what).await;
    }

    /// Reads `[offset, offset + len)` and compares it with the model.
    pub async fn check_range(&self, offset: u64, len: u64, what: &str) {
        let step = 512 << 10;
        let mut at = offset;
        while at < offset + len {
            let n = step.min(offset + len - at);
            let got = self
                .vol
                .read(at, n as usize)
                .await
                .unwrap_or_else(|e| panic!("{:?} {what}: read at {at} (+{n}): {e}", self.kind));
            assert_eq!(got.len() as u64, n, "{:?} {what}: a read returns the bytes asked for", self.kind);
            if let Err(m) = self.model.check(at, &got) {
                panic!("{:?} {what}: {m}", self.kind);
            }
            at += n;
        }
    }

    /// Writes and records in the model; panics on an error.
    pub async fn write(&mut self, offset: u64, data: Vec<u8>, durability: Durability) {
        self.vol
            .write(offset, IoBytes::copy_from(&data), durability)
            .await
            .unwrap_or_else(|e| panic!("{:?}: write at {offset} (+{}): {e}", self.kind, data.len()));
        self.model.write(offset, &data);
    }

    /// Whether `CheapOnly` zeroing of the range must be refused: it has an edge that is not a
    /// whole unit.
    pub fn zeroing_has_edge(&self, offset: u64, len: u64) -> bool {
        len > 0 && (!offset.is_multiple_of(self.zero_unit) || !(offset + len).is_multiple_of(self.zero_unit))
    }
}

/// Writes random data over about half of the volume, in runs of blocks and bytes, and zeroes a
/// few runs: a pattern with data, zeros and holes.
async fn fill_pattern(vol: &dyn BlockVolume, model: &mut Model, r: &mut ChaCha8Rng) {
    let size = model.len();
    for _ in 0..24 {
        let len = r.random_range(1..=64 << 10);
        let at = r.random_range(0..size - len);
        let data = random_bytes(r, len as usize);
        vol.write(at, IoBytes::copy_from(&data), Durability::Buffered).await.expect("pattern write");
        model.write(at, &data);
    }
    for _ in 0..4 {
        let len = r.random_range(1..=32 << 10);
        let at = r.random_range(0..size - len);
        vol.write_zeroes(at, len, stria_engine::Zeroing::ANY, Durability::Buffered)
            .await
            .expect("pattern zeroing");
        model.zero(at, len);
    }
    vol.flush().await.expect("pattern flush");
}

/// What a volume must read back: per byte its value, and whether it may also read as zero (a
/// discard is a hint: each byte reads as before or as zero).
#[derive(Clone)]
pub struct Model {
    pub bytes: Vec<u8>,
    maybe_zero: Vec<bool>,
}

impl Model {
    pub fn zeros(len: u64) -> Model {
        Model { bytes: vec![0; len as usize], maybe_zero: vec![false; len as usize] }
    }

    pub fn len(&self) -> u64 {
        self.bytes.len() as u64
    }

    pub fn write(&mut self, offset: u64, data: &[u8]) {
        let at = offset as usize;
        self.bytes[at..at + data.len()].copy_from_slice(data);
        self.maybe_zero[at..at + data.len()].fill(false);
    }

    pub fn zero(&mut self, offset: u64, len: u64) {
        let (at, end) = (offset as usize, (offset + len) as usize);
        self.bytes[at..end].fill(0);
        self.maybe_zero[at..end].fill(false);
    }

    pub fn discard(&mut self, offset: u64, len: u64) {
        self.maybe_zero[offset as usize..(offset + len) as usize].fill(true);
    }

    /// Whether byte `i` may read as `v`.
    pub fn allows(&self, i: usize, v: u8) -> bool {
        self.bytes[i] == v || (v == 0 && self.maybe_zero[i])
    }

    /// `Err` naming the first byte of `got` (read at `offset`) the model does not allow.
    pub fn check(&self, offset: u64, got: &[u8]) -> Result<(), String> {
        let at = offset as usize;
        match (0..got.len()).find(|&i| !self.allows(at + i, got[i])) {
            None => Ok(()),
            Some(i) => Err(format!(
                "byte {} reads {:#04x}, the model says {:#04x}{}",
                at + i,
                got[i],
                self.bytes[at + i],
                if self.maybe_zero[at + i] { " or zero" } else { "" }
            )),
        }
    }

    /// Whether every byte of the range may read as zero.
    pub fn reads_zero(&self, offset: u64, len: u64) -> bool {
        (offset as usize..(offset + len) as usize).all(|i| self.allows(i, 0))
    }
}

/// Asserts that `r` failed with an error of `kind`.
#[track_caller]
pub fn expect_kind<T: std::fmt::Debug>(r: Result<T, VolumeError>, kind: ErrorKind, what: &str) {
    match r {
        Err(e) => assert_eq!(e.kind(), kind, "{what}: failed with {e} ({:?}), expected {kind:?}", e.kind()),
        Ok(v) => panic!("{what}: succeeded ({v:?}), expected {kind:?}"),
    }
}

/// Runs a clause body once per kind, each as a test of its own named for the kind.
macro_rules! every_kind {
    ($body:path) => {
        $crate::conformance::every_kind!(@one $body, raid0, Raid0);
        $crate::conformance::every_kind!(@one $body, raid1, Raid1);
        $crate::conformance::every_kind!(@one $body, raid10, Raid10);
        $crate::conformance::every_kind!(@one $body, ec, Ec);
        $crate::conformance::every_kind!(@one $body, tiered, Tiered);
        $crate::conformance::every_kind!(@one $body, log, Log);
        $crate::conformance::every_kind!(@one $body, write_back, WriteBack);
        $crate::conformance::every_kind!(@one $body, snapshot, Snapshot);
        $crate::conformance::every_kind!(@one $body, clone, Clone);
    };
    (@one $body:path, $test:ident, $kind:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $test() {
            $body($crate::conformance::Kind::$kind, $crate::conformance::plain).await
        }
    };
}
pub(crate) use every_kind;
