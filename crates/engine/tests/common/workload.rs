//! The concurrent workload of the crash simulations: three writers (partial- and full-stripe
//! writes, unaligned writes, FUA writes, zeroing) and a flusher over a 1 MiB volume, and the
//! tracker of which version of each block a crash may leave.

use std::cell::RefCell;

use rand::Rng;
use rand_chacha::ChaCha8Rng;
use stria_dev::IoBytes;
use stria_engine::Volume;

use super::{Dev, random_bytes, rng};

pub const VOLUME_BYTES: u64 = 1 << 20;
pub const BLOCKS: usize = (VOLUME_BYTES / 4096) as usize;

/// Every version each block has had, and which of them is known durable.
pub struct Tracker {
    pub versions: Vec<Vec<Vec<u8>>>,
    /// Per block, per version: the completion sequence number of the write that made it.
    completed: Vec<Vec<Option<u64>>>,
    pub durable: Vec<usize>,
    /// Per block, per version: how it was written (for failure messages).
    pub how: Vec<Vec<String>>,
    pub seq: u64,
}

impl Tracker {
    pub fn new() -> Tracker {
        Tracker {
            versions: vec![vec![vec![0u8; 4096]]; BLOCKS],
            completed: vec![vec![Some(0)]; BLOCKS],
            durable: vec![0; BLOCKS],
            how: vec![vec!["initial".into()]; BLOCKS],
            seq: 1,
        }
    }

    /// Records a write about to be issued; returns its (block, version) pairs.
    pub fn issue(&mut self, offset: u64, data: &[u8], how: &str) -> Vec<(usize, usize)> {
        let first = (offset / 4096) as usize;
        let last = ((offset + data.len() as u64 - 1) / 4096) as usize;
        let mut out = Vec::new();
        for b in first..=last {
            let mut block = self.versions[b].last().expect("a version").clone();
            let start = (b * 4096).max(offset as usize);
            let end = ((b + 1) * 4096).min(offset as usize + data.len());
            block[start - b * 4096..end - b * 4096]
                .copy_from_slice(&data[start - offset as usize..end - offset as usize]);
            self.versions[b].push(block);
            self.completed[b].push(None);
            self.how[b].push(format!("{how} {offset}+{} issued at seq {}", data.len(), self.seq));
            out.push((b, self.versions[b].len() - 1));
        }
        out
    }

    /// The write of `written` completed; with `durable` (FUA) it is durable too.
    pub fn complete(&mut self, written: &[(usize, usize)], durable: bool) {
        self.seq += 1;
        for &(b, v) in written {
            self.completed[b][v] = Some(self.seq);
            self.how[b][v] += &format!(", completed at seq {}", self.seq);
            if durable {
                self.durable[b] = self.durable[b].max(v);
            }
        }
    }

    /// A flush that started at `start_seq` completed: writes completed before it are durable.
    pub fn flushed(&mut self, start_seq: u64) {
        for b in 0..BLOCKS {
            for (v, c) in self.completed[b].iter().enumerate() {
                if c.is_some_and(|c| c <= start_seq) && v > self.durable[b] {
                    self.how[b][v] += &format!(", flushed by a flush started at seq {start_seq}");
                    self.durable[b] = v;
                }
            }
        }
    }

    /// The versions block `b` may read back as.
    pub fn allowed(&self, b: usize) -> &[Vec<u8>] {
        &self.versions[b][self.durable[b]..]
    }

    /// What to say about a read of block `b` that is not allowed.
    pub fn describe(&self, b: usize, got: &[u8]) -> String {
        let older = self.versions[b][..self.durable[b]].iter().position(|v| v[..] == got[..]);
        format!(
            "{} (durable version {} of {}); history: {:#?}",
            match older {
                Some(v) => format!("version {v}, OLDER than the last durable one"),
                None => "bytes never written".into(),
            },
            self.durable[b],
            self.versions[b].len() - 1,
            self.how[b]
        )
    }

    /// After a verified boot, what was read is the only version: recovery made it durable.
    pub fn settle(&mut self, b: usize, observed: Vec<u8>) {
        self.versions[b] = vec![observed];
        self.completed[b] = vec![Some(0)];
        self.durable[b] = 0;
        self.how[b] = vec!["read back after recovery".into()];
    }
}

/// Which of a writer's operations are FUA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FuaMix {
    /// One write in ten; zeroing never.
    WritesOnly,
    /// One write in ten, and every zeroing.
    WritesAndZeroing,
}

/// Writer `w` (of 3): 30 operations on its own blocks, stopping at the first error (the power
/// is off, the pool closed, or the volume failed).
pub async fn worker(vol: &Volume<Dev>, tracker: &RefCell<Tracker>, seed: u64, w: usize, mix: FuaMix) {
    let mut rng = rng(seed * 31 + w as u64);
    for _ in 0..30 {
        let (offset, len) = owned_range(&mut rng, w);
        let roll = rng.random_range(0..10);
        let data = if roll == 0 { vec![0u8; len as usize] } else { random_bytes(&mut rng, len as usize) };
        let fua = roll == 1 || (roll == 0 && mix == FuaMix::WritesAndZeroing);
        let how = match (roll, fua) {
            (0, false) => "zero",
            (0, true) => "fua zero",
            (1, _) => "fua write",
            _ => "write",
        };
        let written = tracker.borrow_mut().issue(offset, &data, &format!("worker {w} {how}"));
        let result = if roll == 0 {
            vol.write_zeroes(offset, len, fua, false).await
        } else {
            vol.write(offset, IoBytes::copy_from(&data), fua).await
        };
        if result.is_err() {
            return;
        }
        tracker.borrow_mut().complete(&written, fua);
        tokio::task::yield_now().await;
    }
}

/// Which blocks worker `w` (of 3) writes: worker 0 owns the first half (whole stripes); workers
/// 1 and 2 share the second half in alternating 32 KiB pieces (so they share stripes).
fn owned_range(rng: &mut ChaCha8Rng, w: usize) -> (u64, u64) {
    let half = VOLUME_BYTES / 2;
    if w == 0 {
        let start = rng.random_range(0..half / 4096) * 4096;
        let len = rng.random_range(1..=(half - start).min(160 << 10));
        let start = if rng.random_bool(0.3) { start + rng.random_range(0..4096).min(len - 1) } else { start };
        let len = len.min(half - start);
        return (start, len.max(1));
    }
    let pieces = half / (32 << 10);
    let p = (rng.random_range(0..pieces / 2) * 2 + (w as u64 - 1)) * (32 << 10) + half;
    let o = rng.random_range(0..32 << 10);
    let len = rng.random_range(1..=(32 << 10) - o);
    (p + o, len)
}

/// Twelve flushes at seeded moments; each completed one makes earlier completed writes durable.
pub async fn flusher(vol: &Volume<Dev>, tracker: &RefCell<Tracker>, seed: u64) {
    let mut rng = rng(seed * 7 + 3);
    for _ in 0..12 {
        for _ in 0..rng.random_range(1..8) {
            tokio::task::yield_now().await;
        }
        let start = tracker.borrow().seq;
        if vol.flush().await.is_err() {
            return;
        }
        tracker.borrow_mut().flushed(start);
    }
}
