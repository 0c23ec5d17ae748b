//! The volumes a front end serves, by name: each with how many clients hold it and what they see
//! ([`VolumeStats`]). The daemon keeps it in step with the catalog ([`Registry::sync`]); a
//! protocol adapter looks a volume up ([`Registry::attach`]) and serves the [`Attachment`] it
//! gets, which counts as one client until it is dropped and counts every request it carries.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::RwLock;
use stria_dev::{IoBuf, IoBytes};
use stria_volume::{BlockVolume, Durability, Extent, VolumeError, VolumeInfo, Zeroing};

use crate::stats::{Op, VolumeStats, VolumeStatsSnapshot};

/// A served volume, how many attachments hold it, and what they see.
struct Entry {
    volume: Arc<dyn BlockVolume>,
    clients: Arc<AtomicUsize>,
    stats: Arc<VolumeStats>,
}

/// The volumes served, by name. Names and volumes may change while serving; an attachment keeps
/// the volume it attached to until it is dropped.
#[derive(Default)]
pub struct Registry {
    volumes: RwLock<BTreeMap<String, Entry>>,
    /// Called after each attach ([`Registry::on_attach`]).
    on_attach: std::sync::OnceLock<Box<dyn Fn() + Send + Sync>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry").field("names", &self.names()).finish()
    }
}

/// What [`Registry::sync`] changed, for the log.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Synced {
    /// Names served from now on.
    pub added: Vec<String>,
    /// Names no longer served (their attachments keep them until they close).
    pub removed: Vec<String>,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Registry {
        Registry::default()
    }

    /// Serves `volume` as `name`, replacing a volume of that name (its clients and counters
    /// start again from zero; attachments to the old one keep it).
    pub fn insert(&self, name: &str, volume: Arc<dyn BlockVolume>) {
        let entry = Entry { volume, clients: Arc::default(), stats: Arc::default() };
        self.volumes.write().insert(name.to_string(), entry);
    }

    /// Stops serving `name`; attachments that hold it keep it until they are dropped. True when
    /// it was served.
    pub fn remove(&self, name: &str) -> bool {
        self.volumes.write().remove(name).is_some()
    }

    /// True when `name` is served.
    pub fn contains(&self, name: &str) -> bool {
        self.volumes.read().contains_key(name)
    }

    /// The names served, in order.
    pub fn names(&self) -> Vec<String> {
        self.volumes.read().keys().cloned().collect()
    }

    /// Serves exactly the names of `wanted`: stops serving the others, and serves each wanted
    /// name not served yet as what `lookup` finds for it (a name it finds nothing for is left
    /// out, and tried again at the next sync). A name served already keeps its volume, its
    /// clients and its counters.
    pub fn sync(
        &self,
        wanted: impl IntoIterator<Item = String>,
        mut lookup: impl FnMut(&str) -> Option<Arc<dyn BlockVolume>>,
    ) -> Synced {
        let wanted: Vec<String> = wanted.into_iter().collect();
        let mut synced = Synced::default();
        for name in self.names() {
            if !wanted.contains(&name) {
                self.remove(&name);
                synced.removed.push(name);
            }
        }
        for name in wanted {
            if self.contains(&name) {
                continue;
            }
            if let Some(volume) = lookup(&name) {
                self.insert(&name, volume);
                synced.added.push(name);
            }
        }
        synced
    }

    /// Has `f` called after every attach from now on (a cluster node wakes its agent with it, so
    /// that the count a delete checks is published at once). Set once; later calls are ignored.
    pub fn on_attach(&self, f: impl Fn() + Send + Sync + 'static) {
        let _ = self.on_attach.set(Box::new(f));
    }

    /// Attachments that hold `name` now (a protocol's connections that have it open or are
    /// asking about it); 0 when it is not served.
    pub fn clients(&self, name: &str) -> usize {
        self.volumes.read().get(name).map_or(0, |e| e.clients.load(Ordering::Relaxed))
    }

    /// Every served volume's request counters, in the order of their names.
    pub fn stats(&self) -> Vec<VolumeStatsSnapshot> {
        self.volumes.read().iter().map(|(name, e)| e.stats.snapshot(name)).collect()
    }

    /// The volume `name`, counted as one more client until the attachment is dropped. The empty
    /// name means the only volume when exactly one is served.
    pub fn attach(&self, name: &str) -> Option<Attachment> {
        let map = self.volumes.read();
        let (name, entry) = match map.get_key_value(name) {
            Some(found) => found,
            None if name.is_empty() && map.len() == 1 => map.iter().next()?,
            None => return None,
        };
        entry.clients.fetch_add(1, Ordering::Relaxed);
        let attachment = Attachment {
            name: name.clone(),
            info: entry.volume.info(),
            volume: Arc::clone(&entry.volume),
            clients: Arc::clone(&entry.clients),
            stats: Arc::clone(&entry.stats),
        };
        drop(map);
        if let Some(f) = self.on_attach.get() {
            f();
        }
        Some(attachment)
    }
}

/// One client's hold on a served volume: counted in the volume's clients while it lives, and
/// the way its requests reach the volume, each counted in the volume's statistics. Calls are
/// the volume contract's ([`BlockVolume`]), with its guarantees; like them, every future must be
/// polled to completion.
pub struct Attachment {
    /// The volume's canonical name (what it was attached by, or the only volume's name).
    name: String,
    volume: Arc<dyn BlockVolume>,
    /// Fixed for the volume's life (name, layout, preferred I/O size).
    info: VolumeInfo,
    clients: Arc<AtomicUsize>,
    /// Shared by every attachment of the volume.
    stats: Arc<VolumeStats>,
}

impl std::fmt::Debug for Attachment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attachment").field("name", &self.name).field("info", &self.info).finish()
    }
}

impl Drop for Attachment {
    fn drop(&mut self) {
        self.clients.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Attachment {
    /// The name the volume is served as.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Name, layout, preferred I/O size and whether it takes writes, read when attached.
    pub fn info(&self) -> &VolumeInfo {
        &self.info
    }

    /// The volume's size now.
    pub fn size_bytes(&self) -> u64 {
        self.volume.size_bytes()
    }

    /// Reads `len_bytes` at `offset_bytes` (counted).
    pub fn read(
        &self,
        offset_bytes: u64,
        len_bytes: usize,
    ) -> impl Future<Output = Result<IoBuf, VolumeError>> + Send + '_ {
        let read = self.volume.read(offset_bytes, len_bytes);
        self.stats.count(Op::Read, len_bytes as u64, read)
    }

    /// Writes `data` at `offset_bytes` (counted).
    pub fn write(
        &self,
        offset_bytes: u64,
        data: IoBytes,
        durability: Durability,
    ) -> impl Future<Output = Result<(), VolumeError>> + Send + '_ {
        let len = data.len() as u64;
        let write = self.volume.write(offset_bytes, data, durability);
        self.stats.count(Op::Write, len, write)
    }

    /// Writes `write` at `offset_bytes` if the range holds `compare` (SCSI COMPARE AND WRITE;
    /// counted as an [`Op::Write`] of its length, a miscompare as a failed one).
    pub fn compare_and_write(
        &self,
        offset_bytes: u64,
        compare: IoBytes,
        write: IoBytes,
        durability: Durability,
    ) -> impl Future<Output = Result<(), VolumeError>> + Send + '_ {
        let len = write.len() as u64;
        let cas = self.volume.compare_and_write(offset_bytes, compare, write, durability);
        self.stats.count(Op::Write, len, cas)
    }

    /// Makes `len_bytes` at `offset_bytes` read as zeros (counted as [`Op::Zero`]).
    pub fn write_zeroes(
        &self,
        offset_bytes: u64,
        len_bytes: u64,
        zeroing: Zeroing,
        durability: Durability,
    ) -> impl Future<Output = Result<(), VolumeError>> + Send + '_ {
        let zero = self.volume.write_zeroes(offset_bytes, len_bytes, zeroing, durability);
        self.stats.count(Op::Zero, len_bytes, zero)
    }

    /// Discards `len_bytes` at `offset_bytes` (counted as [`Op::Trim`]).
    pub fn discard(
        &self,
        offset_bytes: u64,
        len_bytes: u64,
        durability: Durability,
    ) -> impl Future<Output = Result<(), VolumeError>> + Send + '_ {
        let discard = self.volume.discard(offset_bytes, len_bytes, durability);
        self.stats.count(Op::Trim, len_bytes, discard)
    }

    /// Makes every completed write durable (counted).
    pub fn flush(&self) -> impl Future<Output = Result<(), VolumeError>> + Send + '_ {
        self.stats.count(Op::Flush, 0, self.volume.flush())
    }

    /// The allocation status of a prefix of the range ([`crate::status::prefix`]; not counted).
    pub fn block_status(
        &self,
        offset_bytes: u64,
        len_bytes: u64,
    ) -> impl Future<Output = Result<Vec<Extent>, VolumeError>> + Send + '_ {
        crate::status::prefix(&*self.volume, offset_bytes, len_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::MapVolume;

    fn volume() -> Arc<dyn BlockVolume> {
        Arc::new(MapVolume::new(1 << 20, &[]))
    }

    #[test]
    fn sync_serves_exactly_the_names_wanted_and_keeps_what_it_served() {
        let r = Registry::new();
        let found = |name: &str| (name != "gone").then(volume);
        let synced = r.sync(["b".to_string(), "a".to_string(), "gone".to_string()], found);
        assert_eq!(synced, Synced { added: vec!["b".into(), "a".into()], removed: vec![] });
        assert_eq!(r.names(), ["a", "b"]);

        let held = r.attach("a").expect("served");
        let mut looked_up = Vec::new();
        let synced = r.sync(["a".to_string(), "c".to_string()], |name| {
            looked_up.push(name.to_string());
            Some(volume())
        });
        assert_eq!(synced, Synced { added: vec!["c".into()], removed: vec!["b".into()] });
        assert_eq!(looked_up, ["c"], "a name served already is not looked up again");
        assert_eq!(r.clients("a"), 1, "a name served already keeps its clients");
        drop(held);

        assert_eq!(
            r.sync(Vec::new(), |_| None),
            Synced { added: vec![], removed: vec!["a".into(), "c".into()] }
        );
        assert!(r.names().is_empty());
    }

    #[test]
    fn attachments_are_counted_while_they_live_and_outlive_their_name() {
        let r = Registry::new();
        r.insert("v", volume());
        assert_eq!(r.clients("v"), 0);
        let one = r.attach("v").expect("served");
        let two = r.attach("").expect("the only volume");
        assert_eq!((one.name(), two.name()), ("v", "v"));
        assert_eq!(r.clients("v"), 2);
        drop(one);
        assert_eq!(r.clients("v"), 1);
        assert!(r.attach("w").is_none());
        r.insert("w", volume());
        assert!(r.attach("").is_none(), "no default among two volumes");
        assert!(r.remove("v") && !r.remove("v"));
        assert_eq!(r.clients("v"), 0, "a name not served has no clients");
        assert_eq!(two.size_bytes(), 1 << 20, "an attachment keeps its volume");
    }

    #[tokio::test]
    async fn requests_through_an_attachment_are_counted_in_its_volume() {
        let r = Registry::new();
        r.insert("v", volume());
        let a = r.attach("v").expect("served");
        let b = r.attach("v").expect("served");
        a.write(0, IoBytes::zeroed(8192), Durability::Buffered).await.expect("write");
        // The test volume reads zeros: a compare with zeros matches, any other miscompares.
        let (zeros, ones) = (IoBytes::zeroed(512), IoBytes::copy_from(&[1; 512]));
        b.compare_and_write(512, zeros.clone(), ones.clone(), Durability::Fua).await.expect("cas");
        let e = b.compare_and_write(0, ones.clone(), zeros, Durability::Fua).await.expect_err("miscompare");
        assert_eq!(e.kind(), crate::ErrorKind::Miscompare);
        b.read(4096, 4096).await.expect("read");
        b.read(1 << 20, 4096).await.expect_err("beyond the end");
        a.write_zeroes(0, 4096, Zeroing::ANY, Durability::Fua).await.expect("zero");
        a.discard(0, 4096, Durability::Buffered).await.expect("trim");
        a.flush().await.expect("flush");
        a.block_status(0, 4096).await.expect("status");
        let stats = r.stats();
        assert_eq!(stats.len(), 1);
        let s = &stats[0];
        assert_eq!(s.name, "v");
        assert_eq!((s.write.count, s.write.bytes, s.write.errors), (3, 8192 + 512, 1));
        assert_eq!((s.read.count, s.read.bytes, s.read.errors), (2, 4096, 1));
        assert_eq!((s.write_zeroes.count, s.trim.count, s.flush.count), (1, 1, 1));
        assert_eq!(s.in_flight, 0);
    }
}
