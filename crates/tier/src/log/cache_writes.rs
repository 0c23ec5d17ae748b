//! Group commit of the writes into the cache ring.
//!
//! Every host write puts its blocks in the cache ring at positions it reserved, and concurrent
//! writes reserve consecutive positions. Written one by one, each 4 KiB write is a separate
//! write on each cache copy (two drive operations, each with its checksum, intent and syscall
//! costs); written together, the writes of one round of requests are one write per run of
//! consecutive positions. Whoever finds the writer free writes every queued piece, merging
//! small pieces that follow each other on the ring, and tells each waiter whether its pieces
//! are written. A waiter whose batch failed (or whose writer was cancelled) writes its own
//! pieces again alone, so it gets its own error: writing the same bytes to the same reserved
//! positions twice is harmless.
//!
//! Each piece carries its blocks' checksums, computed once by the host write (they go into the
//! map entries too): both cache copies store them instead of computing them again.
//!
//! Durability is unchanged: every batch is written with FUA, and a waiter goes on to its map
//! update only once the write that holds its pieces is done (docs/crash-consistency.md,
//! "Log-structured volumes").

use std::sync::Arc;

use stria_dev::{BLOCK_BYTES, BlockDevice, IoBuf, IoBytes};
use stria_engine::{VolumeError, join_all_ok};
use tokio::sync::oneshot;

use super::LogVolume;

/// Pieces at most this long are merged with their neighbours (a copy); longer ones go alone.
const MERGE_PIECE_BYTES: usize = 64 << 10;
/// The longest merged write.
const MERGE_RUN_BYTES: usize = 512 << 10;

/// The queue of cache writes and the right to write it.
#[derive(Default)]
pub(crate) struct CacheWrites {
    pending: parking_lot::Mutex<Vec<Queued>>,
    writer: tokio::sync::Mutex<()>,
}

/// A piece of a host write for the cache: its first ring block, its data, and the checksum of
/// each of its blocks (`stria_dev::block_crc`).
pub(super) type CachePiece = (u64, IoBytes, Arc<[u32]>);

/// One request's pieces and where to say whether they are written.
struct Queued {
    pieces: Vec<CachePiece>,
    fua: bool,
    done: oneshot::Sender<bool>,
}

/// A write of consecutive ring blocks: its pieces, and the requests they came from.
struct Run {
    start: u64,
    blocks: u64,
    bytes: usize,
    parts: Vec<IoBytes>,
    /// The checksums of its blocks, in order.
    crcs: Vec<u32>,
    owners: Vec<usize>,
    /// Whether later pieces may join (it starts with a small piece).
    open: bool,
}

impl<D: BlockDevice> LogVolume<D> {
    /// Writes `pieces` (cache ring blocks and their data) into the cache durably, together with
    /// the pieces of whatever other writes are queued meanwhile.
    pub(super) async fn write_cache(&self, pieces: Vec<CachePiece>, fua: bool) -> Result<(), VolumeError> {
        let q = &self.cache_writes;
        let (tx, mut rx) = oneshot::channel();
        q.pending.lock().push(Queued { pieces: pieces.clone(), fua, done: tx });
        // Let the other requests of this round queue theirs: one write for all of them.
        tokio::task::yield_now().await;
        let written = loop {
            let writer = q.writer.lock().await;
            match rx.try_recv() {
                Ok(written) => break written,
                Err(oneshot::error::TryRecvError::Closed) => break false,
                Err(oneshot::error::TryRecvError::Empty) => {}
            }
            let batch = std::mem::take(&mut *q.pending.lock());
            if batch.is_empty() {
                // Taken by a writer that has not reported yet (it reports before it lets go of
                // the lock, unless it was cancelled: then the pieces are written again below).
                drop(writer);
                break rx.await.unwrap_or(false);
            }
            self.write_cache_batch(batch).await;
        };
        if written {
            return Ok(());
        }
        let writes = pieces.iter().map(|(at, data, crcs)| {
            self.parts.cache.write_with_crcs(at * BLOCK_BYTES, data.clone(), crcs, fua)
        });
        join_all_ok(writes).await.map(|_| ())
    }

    /// Writes a batch, one write per run of consecutive ring blocks, and tells each request
    /// whether every write holding its pieces succeeded.
    async fn write_cache_batch(&self, batch: Vec<Queued>) {
        let runs = merge_runs(&batch);
        let fua = batch.iter().any(|q| q.fua);
        let writes = runs.iter().map(|r| {
            let data = match &r.parts[..] {
                [one] => one.clone(),
                parts => {
                    let mut buf = IoBuf::for_overwrite(r.bytes);
                    let mut at = 0;
                    for p in parts {
                        buf[at..at + p.len()].copy_from_slice(p);
                        at += p.len();
                    }
                    buf.freeze()
                }
            };
            self.parts.cache.write_with_crcs(r.start * BLOCK_BYTES, data, &r.crcs, fua)
        });
        let results = futures::future::join_all(writes).await;
        let mut ok = vec![true; batch.len()];
        for (r, result) in runs.iter().zip(results) {
            if result.is_err() {
                for &o in &r.owners {
                    ok[o] = false;
                }
            }
        }
        self.counters.cache_write_batches.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.counters.cache_writes.fetch_add(runs.len() as u64, std::sync::atomic::Ordering::Relaxed);
        for (q, ok) in batch.into_iter().zip(ok) {
            let _ = q.done.send(ok);
        }
    }
}

/// The batch's pieces in ring order, small neighbours merged into runs.
fn merge_runs(batch: &[Queued]) -> Vec<Run> {
    let mut all: Vec<(u64, &IoBytes, &[u32], usize)> = batch
        .iter()
        .enumerate()
        .flat_map(|(i, q)| q.pieces.iter().map(move |(at, data, crcs)| (*at, data, &crcs[..], i)))
        .collect();
    all.sort_by_key(|p| p.0);
    let mut runs: Vec<Run> = Vec::new();
    for (at, data, crcs, owner) in all {
        let blocks = data.len() as u64 / BLOCK_BYTES;
        let small = data.len() <= MERGE_PIECE_BYTES;
        if let Some(r) = runs.last_mut()
            && small
            && r.start + r.blocks == at
            && r.open
            && r.bytes + data.len() <= MERGE_RUN_BYTES
        {
            r.blocks += blocks;
            r.bytes += data.len();
            r.parts.push(data.clone());
            r.crcs.extend_from_slice(crcs);
            if r.owners.last() != Some(&owner) {
                r.owners.push(owner);
            }
            continue;
        }
        runs.push(Run {
            start: at,
            blocks,
            bytes: data.len(),
            parts: vec![data.clone()],
            crcs: crcs.to_vec(),
            owners: vec![owner],
            open: small,
        });
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queued(pieces: &[(u64, usize)]) -> (Queued, oneshot::Receiver<bool>) {
        let (tx, rx) = oneshot::channel();
        let pieces = pieces
            .iter()
            .map(|&(at, blocks)| (at, IoBytes::zeroed(blocks * 4096), Arc::from(vec![0u32; blocks])))
            .collect();
        (Queued { pieces, fua: true, done: tx }, rx)
    }

    #[test]
    fn small_neighbours_merge_and_large_or_distant_pieces_do_not() {
        let (a, _ra) = queued(&[(10, 1)]);
        let (b, _rb) = queued(&[(11, 2)]);
        let (c, _rc) = queued(&[(13, 1), (0, 1)]); // wrapped: its tail is at the ring's start
        let (d, _rd) = queued(&[(14, 32)]); // 128 KiB: alone
        let (e, _re) = queued(&[(46, 1)]);
        let (f, _rf) = queued(&[(50, 1)]); // not next to anything
        let runs = merge_runs(&[a, b, c, d, e, f]);
        let shape: Vec<(u64, u64, Vec<usize>)> =
            runs.iter().map(|r| (r.start, r.blocks, r.owners.clone())).collect();
        assert_eq!(
            shape,
            vec![
                (0, 1, vec![2]),
                (10, 4, vec![0, 1, 2]),
                (14, 32, vec![3]),
                (46, 1, vec![4]),
                (50, 1, vec![5]),
            ]
        );
    }

    #[test]
    fn a_run_stops_at_its_longest() {
        let batch: Vec<Queued> = (0..200).map(|i| queued(&[(i * 4, 4)]).0).collect();
        let runs = merge_runs(&batch);
        assert!(runs.iter().all(|r| r.bytes <= MERGE_RUN_BYTES));
        assert_eq!(runs.iter().map(|r| r.blocks).sum::<u64>(), 800);
        assert_eq!(runs.len(), 800 * 4096 / MERGE_RUN_BYTES + usize::from(800 * 4096 % MERGE_RUN_BYTES != 0));
    }
}
