//! What a volume needs from whoever hosts it: a pool today, a coordinator of one volume in the
//! cluster tomorrow (docs/design/seams.md §2.3). A volume reaches its host only through this
//! trait; it never sees the pool.

use futures::future::BoxFuture;
use stria_dev::DevError;

use crate::error::EngineError;
use crate::gate::OpPass;

/// The host of a volume's requests.
pub(crate) trait VolumeHost: Send + Sync {
    /// A pass of the host's operation gate for one request (crate::gate): a clean close waits
    /// for every pass; `None` once the host is closing.
    fn enter(&self) -> Option<OpPass<'_>>;

    /// Errs while the host takes no writes (a full host filesystem, a failure it could not
    /// record).
    fn check_writable(&self) -> Result<(), EngineError>;

    /// True when the committed metadata already says the member drive in `slot` is failed.
    fn failure_committed(&self, slot: u32) -> bool;

    /// Fails the member drive in `slot`, the object numbered `incarnation`; its failure is
    /// committed before this returns (no write that skipped it may be acknowledged before the
    /// host knows). Nothing is done when the slot holds another object by then (the drive came
    /// back by a delta resync after this failure was committed).
    fn fail_member(
        &self,
        slot: u32,
        incarnation: u64,
        reason: String,
    ) -> BoxFuture<'_, Result<(), EngineError>>;

    /// An I/O error of the member drive in `slot` (the object numbered `incarnation`) met by
    /// `what`: a full host filesystem suspends writes (the request fails, the drive is not to
    /// blame); any other error fails the drive, committed, as `fail_member`.
    fn member_error<'a>(
        &'a self,
        slot: u32,
        incarnation: u64,
        what: &'a str,
        e: &'a DevError,
    ) -> BoxFuture<'a, Result<(), EngineError>>;

    /// A stripe transaction id of volume `volume` that writes in place on the drives `slots`,
    /// fresh and above every watermark (see `txn_done`); `None` until a flush of the host makes
    /// room for another volume's transactions (a journal header names a bounded number of
    /// volumes).
    fn next_txn_id(&self, volume: u64, slots: &[u16]) -> Option<u64>;

    /// Transaction `id` is applied in place on every drive it names (or abandoned before any
    /// in-place write); a flush of the host, or of members that include all its drives, makes
    /// it durable.
    fn txn_done(&self, id: u64);

    /// Waits until some transaction is applied (or abandoned) after the call, or `most` has
    /// passed: what a writer that found a journal full waits for before it flushes and tries
    /// again (the wait is bounded, so a wake-up that came just before the call costs no more).
    fn txn_applied(&self, most: std::time::Duration) -> BoxFuture<'_, ()>;

    /// Makes every write of volume `volume` completed before the call durable on its member
    /// drives, `slots` (every other drive is left alone), and checkpoints their journals.
    fn flush_members<'a>(&'a self, volume: u64, slots: &'a [u32]) -> BoxFuture<'a, Result<(), EngineError>>;

    /// Makes every write completed before the call durable on every drive of the host, and
    /// checkpoints every journal (what a full journal ring waits for).
    fn flush_all(&self) -> BoxFuture<'_, Result<(), EngineError>>;
}
