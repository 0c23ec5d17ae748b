//! A drive whose writes a test can hold: while a hold is set, each new write that its rule
//! matches waits until the hold is released, as a write waits behind a descheduled thread, a
//! slow drive or a busy link. Reads, flushes and discards always go through.

use std::fmt;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::watch;

use crate::buf::{IoBuf, IoBytes};
use crate::counters::DevCounters;
use crate::device::{BlockDevice, DevError};

/// Which writes a hold takes: `(offset_bytes, len_bytes, fua)`.
type Rule = Arc<dyn Fn(u64, usize, bool) -> bool + Send + Sync>;

/// See the module documentation.
pub struct HoldWrites<D> {
    inner: D,
    /// The hold's rule while new writes are held.
    rule: Mutex<Option<Rule>>,
    /// Bumped by every release; a held write waits for the next bump.
    releases: watch::Sender<u64>,
    /// Writes held so far.
    held: watch::Sender<u64>,
}

impl<D: BlockDevice> HoldWrites<D> {
    /// `inner`, holding nothing yet.
    pub fn new(inner: D) -> HoldWrites<D> {
        HoldWrites { inner, rule: Mutex::new(None), releases: watch::channel(0).0, held: watch::channel(0).0 }
    }

    /// The wrapped drive.
    pub fn inner(&self) -> &D {
        &self.inner
    }

    /// From now on, every write for which `rule(offset_bytes, len_bytes, fua)` is true waits
    /// until [`HoldWrites::release`].
    pub fn hold(&self, rule: impl Fn(u64, usize, bool) -> bool + Send + Sync + 'static) {
        *self.rule.lock() = Some(Arc::new(rule));
    }

    /// Holds no new write; the writes held already wait for the release.
    pub fn stop_holding(&self) {
        *self.rule.lock() = None;
    }

    /// Holds no new write and lets every held write go on.
    pub fn release(&self) {
        let mut rule = self.rule.lock();
        *rule = None;
        self.releases.send_modify(|r| *r += 1);
    }

    /// Writes held so far (released ones included).
    pub fn held(&self) -> u64 {
        *self.held.borrow()
    }

    /// Waits until `n` writes have been held in all.
    pub async fn until_held(&self, n: u64) {
        let mut held = self.held.subscribe();
        let _ = held.wait_for(|h| *h >= n).await;
    }
}

impl<D: BlockDevice> fmt::Debug for HoldWrites<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HoldWrites")
            .field("name", &self.inner.name())
            .field("holding", &self.rule.lock().is_some())
            .field("held", &self.held())
            .finish_non_exhaustive()
    }
}

impl<D: BlockDevice> BlockDevice for HoldWrites<D> {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    async fn read(&self, offset_bytes: u64, buf: IoBuf) -> Result<IoBuf, DevError> {
        self.inner.read(offset_bytes, buf).await
    }
    async fn write(&self, offset_bytes: u64, data: IoBytes, fua: bool) -> Result<(), DevError> {
        // Decided under the rule's lock, which a release takes too: a write that matched waits
        // for a release that comes after it.
        let waits = {
            let rule = self.rule.lock();
            rule.as_ref().filter(|r| r(offset_bytes, data.len(), fua)).map(|_| {
                self.held.send_modify(|h| *h += 1);
                let mut releases = self.releases.subscribe();
                releases.borrow_and_update();
                releases
            })
        };
        if let Some(mut releases) = waits {
            let _ = releases.changed().await;
        }
        self.inner.write(offset_bytes, data, fua).await
    }
    async fn flush(&self) -> Result<(), DevError> {
        self.inner.flush().await
    }
    async fn discard(&self, offset_bytes: u64, len_bytes: u64) -> Result<(), DevError> {
        self.inner.discard(offset_bytes, len_bytes).await
    }
    fn counters(&self) -> &DevCounters {
        self.inner.counters()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::MemDevice;

    #[tokio::test]
    async fn matching_writes_wait_for_the_release_and_others_go_on() {
        let dev = Arc::new(HoldWrites::new(MemDevice::new("h", 1 << 20)));
        dev.hold(|offset, _, _| offset >= 8192);
        dev.write(0, IoBytes::copy_from(&[1u8; 4096]), false).await.expect("not held");
        let held = tokio::spawn({
            let dev = Arc::clone(&dev);
            async move { dev.write(8192, IoBytes::copy_from(&[2u8; 4096]), true).await }
        });
        dev.until_held(1).await;
        dev.stop_holding();
        dev.write(16384, IoBytes::copy_from(&[3u8; 4096]), false).await.expect("no longer held");
        tokio::task::yield_now().await;
        assert!(!held.is_finished(), "a held write waits for the release, not for stop_holding");
        let before = dev.read(8192, IoBuf::zeroed(4096)).await.expect("read");
        assert!(before.iter().all(|&b| b == 0), "the held write has not reached the drive");
        dev.release();
        held.await.expect("task").expect("released write");
        let after = dev.read(8192, IoBuf::zeroed(4096)).await.expect("read");
        assert!(after.iter().all(|&b| b == 2));
        assert_eq!(dev.held(), 1);
    }
}
