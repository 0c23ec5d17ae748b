//! Destage: the oldest cached blocks, any logical addresses, appended as one batch (whole
//! stripes and their summary) to the host stream's open segment; and the batch write GC shares:
//! data and summary durable, then conditional map updates ("still where I read it"), then the
//! places the moves left freed.

use std::sync::atomic::Ordering::Relaxed;

use stria_dev::{BLOCK_BYTES, BLOCK_USIZE, BlockDevice, IoBuf, IoBytes};
use stria_engine::VolumeError;

use super::LogVolume;
use super::space::{Stream, SummaryEntry, encode_summary};
use crate::map::{MapEntry, Place, Update};
use stria_dev::block_crc;

/// A block on its way to a new place: where it is, its map entry there, its data.
#[derive(Clone)]
pub(crate) struct Move {
    pub(super) block: u64,
    pub(super) from: Place,
    pub(super) entry: MapEntry,
    pub(super) data: IoBytes,
}

/// A batch's buffer with its moved blocks already in place ([`LogVolume::read_cached`]):
/// `front` holds the moves' data in order, `rest` follows it in the same allocation (the empty
/// slots and the summary, which [`LogVolume::write_batch`] fills).
pub(crate) struct Laid {
    front: IoBytes,
    rest: IoBuf,
}

impl<D: BlockDevice> LogVolume<D> {
    /// Destages up to one batch of the oldest cached blocks; `pad` writes a short batch too
    /// (otherwise only full ones). Under [`super::GcPolicy::Temperature`] the batch is the
    /// hot or the cold blocks among the oldest two batches' worth ([`Self::by_temperature`]).
    /// Returns whether it wrote anything.
    pub(crate) async fn destage_batch(&self, pad: bool) -> Result<bool, VolumeError> {
        self.check_writable(0, self.size_bytes())?;
        let want = self.geo.batch_data() as usize;
        let temperature = self.params().gc == super::GcPolicy::Temperature;
        let window = if temperature { 2 * want } else { want };
        let mut moves: Vec<Move> = Vec::with_capacity(window);
        let mut scanned = 0;
        // The last position looked at: the ring's tail may move between two looks (writers free
        // positions), so the next look starts after it, not at an index (a position looked at
        // twice would be moved twice in one batch).
        let mut after: Option<u64> = None;
        let mut stale = Vec::new();
        // Positions whose block has moved on (a newer write, being freed) are skipped.
        while moves.len() < window {
            let oldest: Vec<(u64, u64)> = self
                .ring
                .oldest_live(scanned + window)
                .into_iter()
                .filter(|&(pos, _)| after.is_none_or(|a| pos > a))
                .collect();
            if oldest.is_empty() {
                break;
            }
            // Entries of as many positions as could still fill the window, read together.
            let chunk = &oldest[..(window - moves.len()).min(oldest.len())];
            after = chunk.last().map(|&(pos, _)| pos);
            // The head, or a snapshot that kept the block, may hold the position.
            let asked: Vec<(u64, Place)> =
                chunk.iter().map(|&(pos, block)| (block, Place::Cache(pos))).collect();
            let held = self.map.holding(&asked).await.map_err(|e| super::map_error(&self.name, e))?;
            for (&(pos, block), e) in chunk.iter().zip(held) {
                if let Some(e) = e {
                    moves.push(Move { block, from: e.place, entry: e, data: IoBytes::zeroed(0) });
                } else if self.ring.is_restored(pos, block) {
                    stale.push((pos, block));
                }
            }
            scanned += chunk.len();
        }
        if !stale.is_empty() {
            self.release_stale(stale).await?;
        }
        let (stream, mut moves) =
            if temperature { self.by_temperature(moves, want) } else { (Stream::Host, moves) };
        if moves.is_empty() || (moves.len() < want && !pad) {
            return Ok(false);
        }
        let laid = self.read_cached(&mut moves).await?;
        if moves.is_empty() {
            return Ok(false);
        }
        let written = self.write_batch(stream, moves, laid).await?;
        self.counters.destage_batches.fetch_add(1, Relaxed);
        self.counters.destaged_blocks.fetch_add(written, Relaxed);
        Ok(true)
    }

    /// The batch to destage from `moves` (the oldest cached blocks, oldest first, up to two
    /// batches' worth) and its stream: a batch of the hot ones or of the cold ones (by the
    /// marks of their cache positions), the kind of the oldest first; when neither fills a
    /// batch (the cache holds less than two), the oldest blocks mixed, into the cold stream.
    fn by_temperature(&self, moves: Vec<Move>, want: usize) -> (Stream, Vec<Move>) {
        let marks = self.ring.hot(moves.iter().map(|m| match m.from {
            Place::Cache(p) => p,
            _ => unreachable!("destage moves cached blocks"),
        }));
        let oldest_hot = marks.first().copied().unwrap_or(false);
        let hot = marks.iter().filter(|&&h| h).count();
        let cold = marks.len() - hot;
        let take = |moves: Vec<Move>, which: bool| -> Vec<Move> {
            moves.into_iter().zip(&marks).filter(|(_, h)| **h == which).map(|(m, _)| m).take(want).collect()
        };
        match (oldest_hot, hot >= want, cold >= want) {
            (true, true, _) | (false, true, false) => (Stream::HostHot, take(moves, true)),
            (false, _, true) | (true, false, true) => (Stream::Host, take(moves, false)),
            _ => (Stream::Host, moves.into_iter().take(want).collect()),
        }
    }

    /// Frees restored cache positions (claims of a persisted table) whose block's map entry
    /// points elsewhere. A writer that replaced such an entry may not have freed the position
    /// yet: with every writer out of the map-update-to-free window, what still points elsewhere
    /// is stale (no later update can make a block point at an old position).
    pub(super) async fn release_stale(&self, stale: Vec<(u64, u64)>) -> Result<(), VolumeError> {
        let _settled = self.gates.settle.write().await;
        self.settle_write_back().await?;
        for (pos, block) in stale {
            let held = self
                .map
                .holding(&[(block, Place::Cache(pos))])
                .await
                .map_err(|e| super::map_error(&self.name, e))?;
            if held[0].is_none() {
                self.ring.release_if_restored(pos, block);
            }
        }
        Ok(())
    }

    /// Reads the cached blocks of `moves` (at most one batch; contiguous positions in one read)
    /// and drops the ones whose entry changed meanwhile. Each read goes straight to its place
    /// in a new batch buffer: returned laid out for [`Self::write_batch`] unless a move was
    /// dropped or a read came back in a buffer of its own (a repair), when the batch write
    /// copies the blocks as it does GC's.
    pub(super) async fn read_cached(&self, moves: &mut Vec<Move>) -> Result<Option<Laid>, VolumeError> {
        assert!(moves.len() as u64 <= self.geo.batch_data(), "destage reads at most a batch");
        // Live positions: their blocks stay where this layout says while they are.
        let ring = self.ring.layout();
        let mut read_crcs = Vec::with_capacity(moves.len());
        let mut rest = IoBuf::for_overwrite((self.geo.batch_blocks() * BLOCK_BYTES) as usize);
        let mut pieces = Vec::new();
        // Whether every read came back in its piece of the batch (a repaired one does not).
        let mut in_place = true;
        let mut i = 0;
        while i < moves.len() {
            let Place::Cache(p0) = moves[i].from else { unreachable!("destage moves cached blocks") };
            let mut n = 1;
            while i + n < moves.len()
                && moves[i + n].from == Place::Cache(p0 + n as u64)
                && !ring.breaks_at(p0 + n as u64)
            {
                n += 1;
            }
            let tail = rest.split_off(n * BLOCK_USIZE);
            let piece = std::mem::replace(&mut rest, tail);
            let at = piece.as_ptr() as usize;
            // With each block's checksum as the cache drive verified it: compared with the map's
            // below instead of computed again.
            let (buf, crcs) =
                self.parts.cache.read_with_crcs_into(ring.block_of(p0) * BLOCK_BYTES, piece).await?;
            // The batch's allocation is alive (`rest`): a buffer of another starts elsewhere.
            in_place &= buf.as_ptr() as usize == at;
            let buf = buf.freeze();
            for (k, m) in moves[i..i + n].iter_mut().enumerate() {
                m.data = buf.slice(k * BLOCK_USIZE..(k + 1) * BLOCK_USIZE);
                read_crcs.push(crcs[k]);
            }
            pieces.push(buf);
            i += n;
        }
        let read = moves.len();
        let mut kept = Vec::with_capacity(moves.len());
        for (m, crc) in moves.drain(..).zip(read_crcs) {
            debug_assert_eq!(crc, block_crc(&m.data), "the cache read's checksum is its data's");
            if crc == m.entry.crc {
                kept.push(m);
                continue;
            }
            let held =
                self.map.holding(&[(m.block, m.from)]).await.map_err(|e| super::map_error(&self.name, e))?;
            if held[0].is_some() {
                return Err(self.unrecoverable(
                    m.block,
                    "a cached block does not match its checksum in the map (both cache copies bad?)",
                ));
            }
        }
        *moves = kept;
        if moves.len() < read || !in_place {
            return Ok(None);
        }
        let mut pieces = pieces.into_iter();
        let Some(mut front) = pieces.next() else { return Ok(None) };
        for piece in pieces {
            front.unsplit(piece).expect("reads in place are consecutive pieces of the batch");
        }
        Ok(Some(Laid { front, rest }))
    }

    /// Writes `moves` (at most one batch) with their summary as the next batch of `stream`'s
    /// segment, then moves their map entries there (each only if the block is still where it
    /// was read), then frees the places the moves left. `laid`: the moves' data already in
    /// place in the batch's buffer ([`Self::read_cached`]); without it they are copied there.
    /// Returns the blocks moved.
    pub(super) async fn write_batch(
        &self,
        stream: Stream,
        moves: Vec<Move>,
        laid: Option<Laid>,
    ) -> Result<u64, VolumeError> {
        let geo = self.geo;
        let data_slots = geo.batch_data() as usize;
        assert!(moves.len() <= data_slots && !moves.is_empty());
        self.check_moves(stream, &moves);
        let mut taken = self.space.lock().take_batch(stream, moves.len() as u64);
        if taken.is_none() && stream.is_host() && self.space.counts_suspect.load(Relaxed) {
            self.recount().await?;
            taken = self.space.lock().take_batch(stream, moves.len() as u64);
        }
        if taken.is_none() && stream.is_host() && self.grow_space().await {
            taken = self.space.lock().take_batch(stream, moves.len() as u64);
        }
        let Some((seg, batch)) = taken else {
            let c = self.space_counts();
            let size =
                |segments: u64| stria_engine::units::format_size(segments * geo.segment_data() * BLOCK_BYTES);
            let limit = if c.segments >= c.max_segments {
                format!("it is at its most ({}, --space)", size(c.max_segments))
            } else {
                match &*self.space.growth_failed.lock() {
                    Some((why, _)) => format!("it cannot grow ({why})"),
                    None => "it could not grow".to_string(),
                }
            };
            let why = format!(
                "the segment space is full: {} of {} segments free, {} reserved for GC, {} of garbage to collect; \
                 {limit}; TRIM or delete data to free space",
                c.free_segments,
                c.segments,
                c.reserve_segments,
                stria_engine::units::format_size(c.garbage_blocks * BLOCK_BYTES),
            );
            self.space.no_space.lock().get_or_insert(why.clone());
            return Err(VolumeError::NoSpace {
                volume: self.name.clone(),
                offset_bytes: 0,
                len_bytes: 0,
                why: format!("destage: {why}"),
            });
        };
        if stream.is_host() && self.space.lock().is_hot(seg) {
            self.counters.destage_hot_batches.fetch_add(1, Relaxed);
        }
        if stream.is_host() {
            *self.space.no_space.lock() = None;
        }
        let base = geo.batch_addr(seg, batch);
        // Every byte is written below: the moved blocks (in `front`), zeros in the slots they
        // leave empty, and the summary (in `rest`).
        let data_bytes = moves.len() * BLOCK_USIZE;
        let (front, mut rest) = match laid {
            Some(Laid { front, rest }) if front.len() == data_bytes => {
                debug_assert!(
                    moves
                        .iter()
                        .enumerate()
                        .all(|(i, m)| m.data.as_ptr() == front[i * BLOCK_USIZE..].as_ptr()),
                    "a laid-out batch holds its moves' data in order"
                );
                (front, rest)
            }
            _ => {
                let mut buf = IoBuf::for_overwrite((geo.batch_blocks() * BLOCK_BYTES) as usize);
                let rest = buf.split_off(data_bytes);
                for (i, m) in moves.iter().enumerate() {
                    buf[i * BLOCK_USIZE..(i + 1) * BLOCK_USIZE].copy_from_slice(&m.data);
                }
                (buf.freeze(), rest)
            }
        };
        let summary: Vec<SummaryEntry> = moves
            .iter()
            .map(|m| SummaryEntry { block: m.block, seq: m.entry.seq, crc: m.entry.crc })
            .collect();
        let empty_bytes = data_slots * BLOCK_USIZE - data_bytes;
        rest[..empty_bytes].fill(0);
        let batch_seq = self.seq.fetch_add(1, Relaxed);
        encode_summary(batch_seq, &summary, &mut rest[empty_bytes..]);
        self.counters.padded_slots.fetch_add((data_slots - moves.len()) as u64, Relaxed);
        // The batch's checksums for the segment write: the moved blocks' are their entries'
        // (checked against the data when read, and again above in debug builds), the empty
        // slots' that of a zero block, the summary's computed here.
        let mut crcs: Vec<u32> = moves.iter().map(|m| m.entry.crc).collect();
        if empty_bytes > 0 {
            crcs.resize(data_slots, block_crc(&rest[..BLOCK_USIZE]));
        }
        crcs.extend(rest[empty_bytes..].chunks_exact(BLOCK_USIZE).map(block_crc));
        let mut whole = front;
        whole.unsplit(rest.freeze()).expect("a batch's front and rest are two pieces of one buffer");
        if let Err(e) = self.parts.seg.write_with_crcs(base * BLOCK_BYTES, whole, &crcs, true).await {
            self.space.lock().lower(seg, moves.len() as u64);
            return Err(e);
        }
        let updates: Vec<Update> = moves
            .iter()
            .enumerate()
            .map(|(i, m)| Update {
                block: m.block,
                entry: MapEntry { place: Place::Segment(base + i as u64), ..m.entry },
                expect: Some(m.entry),
            })
            .collect();
        let olds = self.update_map(&updates).await?;
        let lost = olds.iter().filter(|o| o.is_none()).count() as u64;
        if lost > 0 {
            self.counters.moves_lost.fetch_add(lost, Relaxed);
            self.space.lock().lower(seg, lost);
        }
        self.free_places(moves.iter().zip(olds).filter_map(|(m, o)| o.map(|o| (m.block, o))));
        Ok(moves.len() as u64 - lost)
    }

    /// What a batch carries, checked before it is written: destage moves cached blocks and GC
    /// segment blocks, each place once, each with the data its entry's checksum names (both
    /// verified the data when they read it; the data cannot change since, so the checksums are
    /// computed again only in debug builds).
    fn check_moves(&self, stream: Stream, moves: &[Move]) {
        let mut places = std::collections::HashSet::with_capacity(moves.len());
        for m in moves {
            assert!(
                matches!((stream.is_host(), m.from), (true, Place::Cache(_)) | (false, Place::Segment(_))),
                "volume {}: the {stream:?} stream moves block {} from {:?}",
                self.name,
                m.block,
                m.from
            );
            assert!(
                m.entry.place == m.from && m.data.len() == BLOCK_USIZE,
                "volume {}: block {}'s move from {:?} carries entry {:?} and {} bytes",
                self.name,
                m.block,
                m.from,
                m.entry,
                m.data.len()
            );
            // One block may move twice (from the head's place and from an older one a snapshot
            // holds), one place never: it was read twice.
            assert!(places.insert(m.from), "volume {}: {:?} moved twice in one batch", self.name, m.from);
            if cfg!(debug_assertions) {
                assert_eq!(
                    block_crc(&m.data),
                    m.entry.crc,
                    "volume {}: block {}'s data does not match its checksum before the batch write",
                    self.name,
                    m.block
                );
            }
        }
    }
}
