//! Helpers shared by the integration tests: a seeded generator and stripe builders.
#![allow(dead_code, unreachable_pub)]

use stria_ec::{Backend, ReedSolomon};

/// SplitMix64: small, seedable, good enough to fill test buffers.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.next_u64() % u64::try_from(n).unwrap()).unwrap()
    }

    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

/// The backends to test on this CPU: every supported one except the reference.
pub fn fast_backends() -> Vec<Backend> {
    Backend::supported().into_iter().filter(|b| *b != Backend::Naive).collect()
}

/// A buffer of `count` shards of `len` bytes, each starting `misalign` bytes past a 64-byte
/// boundary, so kernels see unaligned pointers.
pub struct Shards {
    storage: Vec<u8>,
    len: usize,
    stride: usize,
    misalign: usize,
    count: usize,
}

impl Shards {
    pub fn new(count: usize, len: usize, misalign: usize) -> Self {
        let stride = (len + misalign + 64).next_multiple_of(64);
        Self { storage: vec![0; count * stride + 64], len, stride, misalign, count }
    }

    pub fn random(count: usize, len: usize, misalign: usize, rng: &mut Rng) -> Self {
        let mut s = Self::new(count, len, misalign);
        for i in 0..count {
            rng.fill(s.get_mut(i));
        }
        s
    }

    fn base(&self) -> usize {
        self.storage.as_ptr().align_offset(64)
    }

    pub fn get(&self, i: usize) -> &[u8] {
        let start = self.base() + i * self.stride + self.misalign;
        &self.storage[start..start + self.len]
    }

    pub fn get_mut(&mut self, i: usize) -> &mut [u8] {
        let start = self.base() + i * self.stride + self.misalign;
        &mut self.storage[start..start + self.len]
    }

    pub fn all(&self) -> Vec<&[u8]> {
        (0..self.count).map(|i| self.get(i)).collect()
    }

    pub fn all_mut(&mut self) -> Vec<&mut [u8]> {
        let (base, stride, misalign, len) = (self.base(), self.stride, self.misalign, self.len);
        let body = &mut self.storage[base..];
        body.chunks_mut(stride).take(self.count).map(|c| &mut c[misalign..misalign + len]).collect()
    }

    pub fn to_vecs(&self) -> Vec<Vec<u8>> {
        (0..self.count).map(|i| self.get(i).to_vec()).collect()
    }
}

/// Parity of `data` computed by `rs`.
pub fn encode(rs: &ReedSolomon, data: &Shards, len: usize, misalign: usize) -> Shards {
    let mut parity = Shards::new(rs.parity_shards(), len, misalign);
    rs.encode(&data.all(), &mut parity.all_mut()).expect("valid stripe");
    parity
}

/// All subsets of `0..n` with at most `max` elements (including the empty set).
pub fn subsets_up_to(n: usize, max: usize) -> Vec<Vec<usize>> {
    let mut out = vec![Vec::new()];
    let mut frontier = vec![Vec::new()];
    for _ in 0..max {
        let mut next = Vec::new();
        for set in &frontier {
            let start = set.last().map_or(0, |&l: &usize| l + 1);
            for i in start..n {
                let mut s = set.clone();
                s.push(i);
                next.push(s);
            }
        }
        out.extend(next.iter().cloned());
        frontier = next;
    }
    out
}
