use stria_dev::HoldWrites;
use stria_dev::mem::MemDevice;
use stria_engine::{DriveClass, FoundDrive, Layout, NewDrive, Pool, VolumeRole, VolumeSpec};

use super::format::POSITION_MASK;
use super::*;

fn entry(n: u64) -> MapEntry {
    MapEntry { place: Place::Segment(n), crc: n as u32 + 7, seq: n as u32 }
}

async fn pool_with_map_volume(layout: MapLayout) -> (Vec<Arc<MemDevice>>, Arc<Volume<Arc<MemDevice>>>) {
    let devs: Vec<Arc<MemDevice>> =
        (0..2).map(|i| Arc::new(MemDevice::new(&format!("m{i}"), 64 << 20))).collect();
    let vol = map_volume(&devs, layout).await;
    (devs, vol)
}

/// A mirrored volume for `layout` on a new pool of `devs`.
async fn map_volume<D: BlockDevice + Clone>(devs: &[D], layout: MapLayout) -> Arc<Volume<D>> {
    let nd = devs
        .iter()
        .map(|d| NewDrive {
            dev: d.clone(),
            path: d.name().into(),
            class: DriveClass::Fast,
            domain: String::new(),
            fresh: true,
        })
        .collect();
    let pool = Pool::create("t", nd).await.unwrap();
    let spec = VolumeSpec {
        name: "map".into(),
        size_bytes: layout.end().next_multiple_of(64 << 10),
        layout: Layout::Raid1 { copies: 2 },
        chunk_bytes: 64 << 10,
        class: DriveClass::Fast,
        role: VolumeRole::Plain,
    };
    pool.create_volume(spec).await.unwrap()
}

#[tokio::test]
async fn updates_go_on_while_a_checkpoint_writes_pages() {
    let layout = MapLayout { base: 0, log_blocks: 64, blocks: 5000, pool: None, head: None };
    let devs: Vec<Arc<HoldWrites<MemDevice>>> =
        (0..2).map(|i| Arc::new(HoldWrites::new(MemDevice::new(&format!("g{i}"), 64 << 20)))).collect();
    let map = Arc::new(MapStore::open(map_volume(&devs, layout).await, layout, 64).await.unwrap());
    map.checkpoint_in_background();
    let first: Vec<Update> =
        (0..20).map(|i| Update { block: i * 255, entry: entry(i), expect: None }).collect();
    map.update(&first).await.unwrap();
    // A checkpoint's page writes (runs of consecutive pages, without FUA) wait at the drives,
    // after it took the 20 dirty pages; log blocks (single blocks with FUA) and the engine's
    // checksum pages that go with them (single blocks) go on.
    for d in &devs {
        d.hold(|_, len_bytes, fua| !fua && len_bytes > BLOCK_USIZE);
    }
    let checkpoint = tokio::spawn({
        let map = Arc::clone(&map);
        async move { map.checkpoint().await }
    });
    while map.cache.dirty_pages() > 0 {
        tokio::task::yield_now().await;
    }
    // Updates are logged (FUA writes) and acknowledged meanwhile.
    let during = Update { block: 7, entry: entry(77), expect: None };
    let update = tokio::time::timeout(std::time::Duration::from_secs(5), map.update(&[during])).await;
    assert!(update.expect("an update waited for the checkpoint's page writes").is_ok());
    assert!(!checkpoint.is_finished());
    for d in &devs {
        d.release();
    }
    checkpoint.await.unwrap().unwrap();
    assert_eq!(map.stats().checkpoints, 1);
    // The update made during the checkpoint is past its position: a reopen replays it.
    drop(Arc::into_inner(map).expect("the only reference"));
    let found = devs.iter().map(|d| FoundDrive { dev: d.clone(), path: d.name().into() }).collect();
    let vol = Pool::open(found).await.unwrap().volume("map").unwrap();
    let map = MapStore::open(vol, layout, 64).await.unwrap();
    assert_eq!(map.get(7).await.unwrap(), during.entry);
    assert_eq!(map.get(19 * 255).await.unwrap(), entry(19));
    assert!(map.stats().deltas_replayed >= 1);
}

fn layer(name: &str, kind: crate::layers::LayerKind) -> crate::layers::LayerRecord {
    crate::layers::LayerRecord::named(name, kind, 600 * 4096)
}

/// A 600-block map (3 pages) with a pool of `pool_pages` after it.
fn snapshot_layout(pool_pages: u32) -> MapLayout {
    let plain = MapLayout { base: 0, log_blocks: 16, blocks: 600, pool: None, head: None };
    let layers_at = plain.bytes();
    let pages_at = layers_at + crate::layers::LAYER_TABLE_BLOCKS as u64 * BLOCK_BYTES;
    MapLayout { pool: Some(PoolLayout { layers_at, pages_at, pages: pool_pages, runs: None }), ..plain }
}

async fn snapshot(map: &MapStore<Arc<MemDevice>>, name: &str) -> u16 {
    use crate::layers::LayerKind;
    map.create_snapshot(layer("vol", LayerKind::Head), layer(name, LayerKind::Snapshot)).await.unwrap()
}

async fn write_all(map: &MapStore<Arc<MemDevice>>, version: u64) -> Vec<Option<MapEntry>> {
    let updates: Vec<Update> =
        (0..600).map(|b| Update { block: b, entry: entry(version * 1000 + b), expect: None }).collect();
    map.update(&updates).await.unwrap()
}

async fn view(map: &MapStore<Arc<MemDevice>>, layer: u16) -> Vec<MapEntry> {
    let blocks: Vec<u64> = (0..600).collect();
    if layer == 0 { map.get_many(&blocks).await.unwrap() } else { map.get_in(layer, &blocks).await.unwrap() }
}

#[tokio::test]
async fn snapshots_keep_their_view_through_overwrites_moves_and_reopens() {
    let layout = snapshot_layout(64);
    let (devs, vol) = pool_with_map_volume(layout).await;
    let map = MapStore::open(vol, layout, 4).await.unwrap();
    write_all(&map, 1).await;
    let s1 = snapshot(&map, "s1").await;
    // Half the blocks overwritten: what they replaced is held by s1, so nothing is freed.
    let half: Vec<Update> =
        (0..300).map(|b| Update { block: b * 2, entry: entry(2000 + b * 2), expect: None }).collect();
    let freed = map.update(&half).await.unwrap();
    assert!(freed.iter().all(|f| *f == Some(MapEntry::UNALLOCATED)), "s1 holds every replaced entry");
    assert_eq!(map.stats().pages_preserved, 3, "each head page copied once");
    // Overwritten again: the version s1 does not hold is freed.
    let again = map.update(&half[..1]).await.unwrap();
    assert_eq!(again, vec![Some(entry(2000))]);
    let s2 = snapshot(&map, "s2").await;
    write_all(&map, 3).await;
    let want_s1: Vec<MapEntry> = (0..600).map(|b| entry(1000 + b)).collect();
    let want_s2: Vec<MapEntry> =
        (0..600).map(|b| if b % 2 == 0 { entry(2000 + b) } else { entry(1000 + b) }).collect();
    assert_eq!(view(&map, s1).await, want_s1);
    assert_eq!(view(&map, s2).await, want_s2);
    // GC moves a block only s1 holds (odd blocks are shared by s1 and s2 through s2's copy).
    let old = entry(1000 + 4);
    let moved = MapEntry { place: Place::Segment(999_999), ..old };
    let r = map.update(&[Update { block: 4, entry: moved, expect: Some(old) }]).await.unwrap();
    assert_eq!(r, vec![Some(old)], "the move applied (to s1 only) and its old place is free");
    let shared = entry(1000 + 5);
    let moved5 = MapEntry { place: Place::Segment(888_888), ..shared };
    map.update(&[Update { block: 5, entry: moved5, expect: Some(shared) }]).await.unwrap();
    let mut want_s1 = want_s1;
    let mut want_s2 = want_s2;
    want_s1[4] = moved;
    want_s1[5] = moved5;
    want_s2[5] = moved5;
    assert_eq!(view(&map, s1).await, want_s1, "s1 sees both moves");
    assert_eq!(view(&map, s2).await, want_s2, "s2 holds block 5 too: moved in both");
    let want_head: Vec<MapEntry> = (0..600).map(|b| entry(3000 + b)).collect();
    assert_eq!(view(&map, 0).await, want_head, "the head is untouched by moves of old versions");
    // Reopen without a clean stop (some of it is only in the log), then after a checkpoint.
    drop(map);
    let map = MapStore::open(reopen(&devs).await, layout, 4).await.unwrap();
    assert_eq!(map.snapshots().iter().map(|r| r.name.as_str()).collect::<Vec<_>>(), ["s1", "s2"]);
    assert_eq!(view(&map, s1).await, want_s1);
    assert_eq!(view(&map, s2).await, want_s2);
    assert_eq!(view(&map, 0).await, want_head);
    map.checkpoint().await.unwrap();
    drop(map);
    let map = MapStore::open(reopen(&devs).await, layout, 4).await.unwrap();
    assert_eq!(view(&map, s1).await, want_s1);
    assert_eq!(view(&map, s2).await, want_s2);
    // s2 is the newest: its copies are marked, so another overwrite copies nothing.
    let before = map.stats().pages_preserved;
    write_all(&map, 4).await;
    assert_eq!(map.stats().pages_preserved, before);
    assert_eq!(view(&map, s2).await, want_s2);
    let (used, pages) = map.pool_pages();
    // 2 snapshots x (root + directory + table + 3 copies).
    assert_eq!((used, pages), (1 + 2 * 6, 64));
}

async fn delete(map: &MapStore<Arc<MemDevice>>, layer: u16) -> (DeleteStats, Vec<MapEntry>) {
    let mut freed = Vec::new();
    let stats =
        map.delete_snapshot(layer, None, |f| freed.extend(f.into_iter().map(|(_, e)| e))).await.unwrap();
    freed.sort_by_key(|e| e.seq);
    (stats, freed)
}

fn versions(v: impl Fn(u64) -> u64) -> Vec<MapEntry> {
    (0..600).map(|b| entry(v(b) * 1000 + b)).collect()
}

async fn set(map: &MapStore<Arc<MemDevice>>, blocks: std::ops::Range<u64>, e: impl Fn(u64) -> MapEntry) {
    let updates: Vec<Update> = blocks.map(|b| Update { block: b, entry: e(b), expect: None }).collect();
    map.update(&updates).await.unwrap();
}

/// (referenced, exclusive) blocks of `layer`.
async fn held(map: &MapStore<Arc<MemDevice>>, layer: u16) -> (u64, u64) {
    let refs = map.referenced_blocks().await.unwrap();
    let r = refs.iter().find(|r| r.0 == layer).expect("listed").1;
    (r, map.exclusive_blocks(layer).await.unwrap())
}

#[tokio::test]
async fn each_snapshot_references_the_data_in_its_view_and_shares_what_it_does_not_hold_alone() {
    let layout = snapshot_layout(64);
    let (devs, vol) = pool_with_map_volume(layout).await;
    let map = MapStore::open(vol, layout, 4).await.unwrap();
    assert!(map.referenced_blocks().await.unwrap().is_empty(), "no snapshots");
    // Pages 0 and 1 mostly written; page 2 (blocks 510..) has 10 blocks no write changes later.
    set(&map, 0..400, |b| entry(1000 + b)).await;
    set(&map, 550..560, |b| entry(1000 + b)).await;
    let s1 = snapshot(&map, "s1").await;
    assert_eq!(held(&map, s1).await, (410, 0), "all shared with the head");
    // Overwritten, trimmed, zeroed and new blocks.
    set(&map, 0..100, |b| entry(2000 + b)).await;
    set(&map, 100..200, |_| MapEntry::UNALLOCATED).await;
    set(&map, 200..250, |b| MapEntry { place: Place::Zero, crc: 0, seq: b as u32 }).await;
    set(&map, 400..430, |b| entry(2000 + b)).await;
    let s2 = snapshot(&map, "s2").await;
    // s1 alone holds its versions of 0..250; it shares 250..400 and 550..560 with s2 and the head.
    assert_eq!(held(&map, s1).await, (410, 250));
    // s2: 0..100, 250..430, 550..560; the head holds all of it.
    assert_eq!(held(&map, s2).await, (290, 0));
    set(&map, 0..50, |b| entry(3000 + b)).await;
    assert_eq!(held(&map, s2).await, (290, 50), "0..50 are its own now");
    assert_eq!(held(&map, s1).await, (410, 250), "unchanged by writes after s2");
    // A snapshot of a smaller size counts only its blocks (a volume that grew keeps it so).
    use crate::layers::{LayerKind, LayerRecord};
    let small = LayerRecord::named("small", LayerKind::Snapshot, 300 * 4096);
    let s3 = map.create_snapshot(layer("vol", LayerKind::Head), small).await.unwrap();
    assert_eq!(map.referenced_blocks().await.unwrap().iter().find(|r| r.0 == s3).unwrap().1, 100 + 50);
    // The same after a reopen (copies read back from the pool), and after a delete hands on.
    map.checkpoint().await.unwrap();
    drop(map);
    let found = devs.iter().map(|d| FoundDrive { dev: Arc::clone(d), path: d.name().into() }).collect();
    let vol = Pool::open(found).await.unwrap().volume("map").unwrap();
    let map = MapStore::open(vol, layout, 4).await.unwrap();
    let refs = map.referenced_blocks().await.unwrap();
    assert_eq!(refs, vec![(s1, 410), (s2, 290), (s3, 150)]);
    map.delete_snapshot(s2, None, |_| {}).await.unwrap();
    assert_eq!(map.referenced_blocks().await.unwrap(), vec![(s1, 410), (s3, 150)]);
    // s2's own versions of 0..50 were freed, those of 50..100 are s3's (made after them).
    assert_eq!(held(&map, s1).await, (410, 250));
    set(&map, 0..300, |b| entry(4000 + b)).await;
    assert_eq!(held(&map, s3).await, (150, 100), "0..100 are its own now; 250..300 are s1's too");
}

#[tokio::test]
async fn deleting_snapshots_hands_copies_on_and_frees_only_what_no_layer_holds() {
    let layout = snapshot_layout(64);
    let (devs, vol) = pool_with_map_volume(layout).await;
    let map = MapStore::open(vol, layout, 4).await.unwrap();
    write_all(&map, 1).await;
    let s1 = snapshot(&map, "s1").await;
    write_all(&map, 2).await;
    let s2 = snapshot(&map, "s2").await;
    let even: Vec<Update> =
        (0..300).map(|b| Update { block: b * 2, entry: entry(3000 + b * 2), expect: None }).collect();
    map.update(&even).await.unwrap();
    let s3 = snapshot(&map, "s3").await;
    write_all(&map, 4).await;
    let (want1, want3, want_head) =
        (versions(|_| 1), versions(|b| if b % 2 == 0 { 3 } else { 2 }), versions(|_| 4));
    // The middle one: s1 has its own copy of every page, so s2's are dropped; of s2's
    // entries only the even blocks' are held by nobody else (s3 holds the odd ones).
    assert_eq!(map.exclusive_blocks(s2).await.unwrap(), 300, "what deleting s2 frees");
    let (stats, freed) = delete(&map, s2).await;
    assert_eq!(
        stats,
        DeleteStats { pages_moved: 0, pages_dropped: 3, entries_freed: 300, ..DeleteStats::default() }
    );
    assert_eq!(freed, (0..300).map(|b| entry(2000 + b * 2)).collect::<Vec<_>>());
    assert_eq!(map.snapshots().iter().map(|r| r.name.as_str()).collect::<Vec<_>>(), ["s1", "s3"]);
    assert!(map.get_in(s2, &[0]).await.is_err(), "a deleted snapshot cannot be read");
    assert_eq!(view(&map, s1).await, want1);
    assert_eq!(view(&map, s3).await, want3);
    assert_eq!(view(&map, 0).await, want_head);
    // The newest: s1 becomes the one preserves go to, and it owns every page already.
    let (stats, freed) = delete(&map, s3).await;
    assert_eq!((stats.pages_dropped, freed.len()), (3, 600));
    let before = map.stats().pages_preserved;
    write_all(&map, 5).await;
    assert_eq!(map.stats().pages_preserved, before, "s1 owns every page: nothing copied");
    assert_eq!(view(&map, s1).await, want1);
    // Moves: sa copies page 0 only, sb pages 0 and 1; deleting sb hands page 1 to sa.
    let sa = snapshot(&map, "sa").await;
    map.update(&[Update { block: 0, entry: entry(6000), expect: None }]).await.unwrap();
    let sb = snapshot(&map, "sb").await;
    let both = [0, 300].map(|b| Update { block: b, entry: entry(7000 + b), expect: None });
    map.update(&both).await.unwrap();
    let want_a = view(&map, sa).await;
    assert_eq!(map.exclusive_blocks(sb).await.unwrap(), 1);
    let (stats, freed) = delete(&map, sb).await;
    assert_eq!(
        stats,
        DeleteStats { pages_moved: 1, pages_dropped: 1, entries_freed: 1, ..DeleteStats::default() }
    );
    assert_eq!(freed, vec![entry(6000)], "block 0's version between sa and sb");
    assert_eq!(view(&map, sa).await, want_a);
    // What the deletes did is in the tables and the log: a reopen sees the same.
    drop(map);
    let map = MapStore::open(reopen(&devs).await, layout, 4).await.unwrap();
    assert_eq!(map.snapshots().iter().map(|r| r.name.as_str()).collect::<Vec<_>>(), ["s1", "sa"]);
    assert_eq!(view(&map, s1).await, want1);
    assert_eq!(view(&map, sa).await, want_a);
    // Deleting all gives every pool page back after a checkpoint.
    delete(&map, s1).await;
    delete(&map, sa).await;
    map.checkpoint().await.unwrap();
    assert_eq!(map.pool_pages(), (1, 64), "only page 0, which is never used");
    let ids = snapshot(&map, "again").await;
    assert!(ids > sa, "layer ids are not reused in one open (none is left to take the max of)");
}

#[tokio::test]
async fn a_clone_reads_through_its_snapshot_writes_only_its_own_pages_and_keeps_a_deleted_parent() {
    let layout = snapshot_layout(64);
    let (devs, vol) = pool_with_map_volume(layout).await;
    let map = MapStore::open(vol, layout, 4).await.unwrap();
    write_all(&map, 1).await;
    let s1 = snapshot(&map, "s1").await;
    let c = map.create_clone(s1, layer("c", crate::layers::LayerKind::Clone)).await.unwrap();
    assert_eq!(view(&map, c).await, versions(|_| 1), "a new clone reads as its snapshot");
    assert_eq!(map.pool_pages().0, 1 + 2 * 2, "a snapshot and a clone: a root and a directory each");
    write_all(&map, 2).await;
    // The clone's first writes replace what its parent holds: nothing to free.
    let even: Vec<Update> =
        (0..300).map(|b| Update { block: b * 2, entry: entry(9000 + b * 2), expect: None }).collect();
    let olds = map.update_clone(c, &even).await.unwrap();
    assert!(olds.iter().all(|o| *o == Some(MapEntry::UNALLOCATED)), "the parent holds them");
    // A second write replaces the clone's own block: that one is freed.
    let again = [Update { block: 4, entry: entry(9999), expect: None }];
    assert_eq!(map.update_clone(c, &again).await.unwrap(), vec![Some(entry(9004))]);
    let want_c: Vec<MapEntry> = (0..600)
        .map(|b| match b {
            4 => entry(9999),
            b if b % 2 == 0 => entry(9000 + b),
            b => entry(1000 + b),
        })
        .collect();
    assert_eq!(view(&map, c).await, want_c);
    assert_eq!(view(&map, s1).await, versions(|_| 1), "the snapshot keeps its view");
    assert_eq!(view(&map, 0).await, versions(|_| 2), "the volume keeps its own");
    // A move (GC) of a block the clone and its parent share changes both.
    let moved = MapEntry { place: entry(5001).place, ..entry(1001) };
    let mv = [Update { block: 1, entry: moved, expect: Some(entry(1001)) }];
    assert_eq!(map.update(&mv).await.unwrap(), vec![Some(entry(1001))]);
    assert_eq!(map.get_in(c, &[1]).await.unwrap(), vec![moved]);
    assert_eq!(map.get_in(s1, &[1]).await.unwrap(), vec![moved]);
    // Deleting the snapshot keeps it, hidden, for the clone: nothing is freed.
    let (stats, freed) = delete(&map, s1).await;
    assert!(stats.kept_for_clones && freed.is_empty(), "{stats:?}");
    assert!(map.snapshots().is_empty());
    let mut want_c = want_c;
    want_c[1] = moved;
    assert_eq!(view(&map, c).await, want_c);
    drop(map);
    let map = MapStore::open(reopen(&devs).await, layout, 4).await.unwrap();
    assert_eq!(map.clones().iter().map(|r| r.name.as_str()).collect::<Vec<_>>(), ["c"]);
    assert_eq!(view(&map, c).await, want_c, "after a reopen");
    // The clone's delete frees its own blocks, then finishes the snapshot's: all of the
    // snapshot's blocks but none of the volume's.
    let mut freed = Vec::new();
    map.delete_clone(c, None, |f| freed.extend(f.into_iter().map(|(_, e)| e))).await.unwrap();
    freed.sort_by_key(|e| e.seq);
    let mut want: Vec<MapEntry> = (0..600)
        .map(|b| if b == 1 { moved } else { entry(1000 + b) })
        .chain((0..300).map(|b| if b == 2 { entry(9999) } else { entry(9000 + b * 2) }))
        .collect();
    want.sort_by_key(|e| e.seq);
    assert_eq!(freed, want);
    assert!(map.clones().is_empty() && map.get_in(c, &[0]).await.is_err());
    assert_eq!(view(&map, 0).await, versions(|_| 2));
    map.checkpoint().await.unwrap();
    assert_eq!(map.pool_pages(), (1, 64), "every pool page is back");
}

#[tokio::test]
async fn a_full_snapshot_pool_refuses_the_write_and_changes_nothing() {
    // Root, directory, table and one copy: the second head page finds no room.
    let layout = snapshot_layout(5);
    let (_devs, vol) = pool_with_map_volume(layout).await;
    let map = MapStore::open(vol, layout, 8).await.unwrap();
    write_all(&map, 1).await;
    let s = snapshot(&map, "s").await;
    map.update(&[Update { block: 0, entry: entry(7), expect: None }]).await.unwrap();
    let err = map.update(&[Update { block: 300, entry: entry(8), expect: None }]).await.unwrap_err();
    assert!(matches!(err, MapError::PoolFull { needed: 1, free: 0 }), "{err}");
    assert_eq!(map.get(300).await.unwrap(), entry(1300), "the refused update changed nothing");
    assert_eq!(map.get_in(s, &[0, 300]).await.unwrap(), vec![entry(1000), entry(1300)]);
    map.update(&[Update { block: 1, entry: entry(9), expect: None }]).await.unwrap();
}

async fn reopen(devs: &[Arc<MemDevice>]) -> Arc<Volume<Arc<MemDevice>>> {
    let found = devs.iter().map(|d| FoundDrive { dev: Arc::clone(d), path: d.name().into() }).collect();
    Pool::open(found).await.unwrap().volume("map").unwrap()
}

#[test]
fn places_round_trip_through_their_encoding() {
    for p in
        [Place::Unallocated, Place::Zero, Place::Cache(0), Place::Cache(77), Place::Segment(POSITION_MASK)]
    {
        assert_eq!(Place::decode(p.encode()), p);
    }
    let mut page = vec![0u8; BLOCK_USIZE];
    let entries: Vec<MapEntry> = (0..ENTRIES_PER_PAGE).map(entry).collect();
    encode_page(0, 9, &entries, &mut page);
    assert_eq!(decode_page(9, &page).unwrap().to_vec(), entries);
    assert!(decode_page(8, &page).is_none(), "another page's bytes are damaged");
    page[100] ^= 1;
    assert!(decode_page(9, &page).is_none(), "a flipped bit is damage");
    assert!(decode_page(3, &[0u8; BLOCK_USIZE]).unwrap().iter().all(|e| *e == MapEntry::UNALLOCATED));
    let deltas: Vec<(u64, [u8; 16])> = (0..DELTAS_PER_LOG_BLOCK as u64)
        .map(|i| {
            let mut b = [0u8; 16];
            entry(i).encode(&mut b);
            (i * 3, b)
        })
        .collect();
    encode_log_block(41, &deltas, &mut page);
    assert_eq!(decode_log_block(&page, 41).unwrap(), deltas);
    assert!(decode_log_block(&page, 42).is_none(), "a block of another lap is not replayed");
    assert_eq!(DELTAS_PER_LOG_BLOCK, 169);
}

#[tokio::test]
async fn updates_survive_reopen_through_the_log_and_through_checkpoints() {
    let layout = MapLayout { base: 8192, log_blocks: 4, blocks: 5000, pool: None, head: None };
    let (devs, vol) = pool_with_map_volume(layout).await;
    let map = MapStore::open(vol, layout, 2).await.unwrap();
    // No task runs the checkpoints handed to it: only the bounds (a full ring, a cache past
    // its hard bound) make updates checkpoint, so the log carries the last updates.
    map.checkpoint_in_background();
    assert_eq!(map.get(4999).await.unwrap(), MapEntry::UNALLOCATED, "a new map is empty");
    assert!(matches!(map.get(5000).await, Err(MapError::OutOfRange { .. })));
    // 2000 updates over 20 pages with a 4-block ring (676 deltas): the ring wraps, which
    // forces checkpoints; a 2-page cache forces evictions and re-reads.
    for round in 0..10u64 {
        let updates: Vec<Update> = (0..200)
            .map(|i| Update { block: (i * 25 + round) % 5000, entry: entry(round * 1000 + i), expect: None })
            .collect();
        assert!(map.update(&updates).await.unwrap().iter().all(Option::is_some));
    }
    let stats = map.stats();
    assert!(stats.checkpoints > 0 && stats.cache.evicted_pages > 0, "{stats:?}");
    // One batch of 2400 deltas needs 15 log blocks, more than the ring: it checkpoints on
    // the way. Its blocks (b % 25 >= 10) are ones no round wrote.
    let big: Vec<Update> = (1000..5000)
        .filter(|b| b % 25 >= 10)
        .map(|b| Update { block: b, entry: entry(50_000 + b), expect: None })
        .collect();
    assert!(map.update(&big).await.unwrap().iter().all(Option::is_some));
    // One more update, to a page the last one left cached: no bound is reached, so it stays
    // in the log only (the batch's own deltas may all be in pages by now).
    let last = Update { block: 4998, entry: entry(99_999), expect: None };
    let checkpoints = map.stats().checkpoints;
    map.update(&[last]).await.unwrap();
    assert_eq!(map.stats().checkpoints, checkpoints, "the last update is only in the log");
    drop(map);
    // Reopen without a clean stop: what the log holds past the last checkpoint is replayed.
    let map = MapStore::open(reopen(&devs).await, layout, 2).await.unwrap();
    for round in 0..10u64 {
        for i in 0..200u64 {
            let b = (i * 25 + round) % 5000;
            // A later round may have written the same block.
            let last = (0..10u64)
                .rev()
                .find_map(|r| (0..200u64).find(|&j| (j * 25 + r) % 5000 == b).map(|j| r * 1000 + j));
            assert_eq!(map.get(b).await.unwrap(), entry(last.unwrap()), "block {b}");
        }
    }
    for u in big.iter().filter(|u| u.block != last.block) {
        assert_eq!(map.get(u.block).await.unwrap(), u.entry, "block {} of the big batch", u.block);
    }
    assert_eq!(map.get(last.block).await.unwrap(), last.entry);
    assert!(map.stats().deltas_replayed > 0);
}

#[tokio::test]
async fn a_conditional_update_loses_to_a_newer_write() {
    let layout = MapLayout { base: 0, log_blocks: 8, blocks: 600, pool: None, head: None };
    let (_devs, vol) = pool_with_map_volume(layout).await;
    let map = MapStore::open(vol, layout, 16).await.unwrap();
    let cached = MapEntry { place: Place::Cache(5), crc: 1, seq: 1 };
    map.update(&[Update { block: 3, entry: cached, expect: None }]).await.unwrap();
    // The host rewrites block 3 while a destage moves its old copy: the move must lose.
    let newer = MapEntry { place: Place::Cache(9), crc: 2, seq: 2 };
    map.update(&[Update { block: 3, entry: newer, expect: None }]).await.unwrap();
    let moved = MapEntry { place: Place::Segment(100), crc: 1, seq: 1 };
    let applied = map
        .update(&[
            Update { block: 3, entry: moved, expect: Some(cached) },
            Update { block: 4, entry: moved, expect: Some(MapEntry::UNALLOCATED) },
        ])
        .await
        .unwrap();
    assert_eq!(
        applied,
        vec![None, Some(MapEntry::UNALLOCATED)],
        "the move loses; the other returns what it replaced"
    );
    assert_eq!(map.get(3).await.unwrap(), newer);
    assert_eq!(map.get(4).await.unwrap(), moved);
    // A place freed and written again between a move's read and its update: the entry there
    // has the same place and other data (checksum, sequence): the stale move loses too.
    let again = MapEntry { place: Place::Cache(5), crc: 3, seq: 3 };
    map.update(&[Update { block: 3, entry: again, expect: None }]).await.unwrap();
    let stale = MapEntry { place: Place::Segment(101), ..cached };
    let applied = map.update(&[Update { block: 3, entry: stale, expect: Some(cached) }]).await.unwrap();
    assert_eq!(applied, vec![None], "the stale move loses to the block written at its old place");
    assert_eq!(map.get(3).await.unwrap(), again);
}

#[tokio::test]
async fn a_damaged_header_or_page_is_an_error_not_an_empty_map() {
    let layout = MapLayout { base: 0, log_blocks: 4, blocks: 600, pool: None, head: None };
    let (devs, vol) = pool_with_map_volume(layout).await;
    let map = MapStore::open(Arc::clone(&vol), layout, 16).await.unwrap();
    map.update(&[Update { block: 300, entry: entry(1), expect: None }]).await.unwrap();
    map.checkpoint().await.unwrap();
    drop(map);
    // Garbage written through the volume (so its own checksums pass): the map must notice.
    let page1 = layout.page_offset(1);
    let mut bytes = vol.read(page1, BLOCK_USIZE).await.unwrap();
    bytes[40] ^= 1;
    vol.write(page1, IoBytes::copy_from(&bytes), true).await.unwrap();
    let map = MapStore::open(Arc::clone(&vol), layout, 16).await.unwrap();
    assert!(matches!(map.get(300).await, Err(MapError::DamagedPage { page: 1 })));
    assert_eq!(map.get(3).await.unwrap(), MapEntry::UNALLOCATED, "other pages are fine");
    vol.write(layout.base, IoBytes::copy_from(&[7u8; BLOCK_USIZE]), true).await.unwrap();
    assert!(matches!(MapStore::open(vol, layout, 16).await, Err(MapError::DamagedHeader)));
    drop(devs);
}

/// Reads every snapshot's view of the whole map until table page `table` has been evicted
/// from the table cache (it must be clean and unheld).
async fn evict_table<D: BlockDevice>(map: &MapStore<D>, snaps: &[u16], table: u32) {
    let blocks: Vec<u64> = (0..600).collect();
    for _ in 0..100 {
        if map.snap.tables.peek(u64::from(table)).is_none() {
            return;
        }
        for &s in snaps {
            map.get_in(s, &blocks).await.unwrap();
        }
    }
    panic!("table page {table} stayed cached");
}

/// A read that missed a table page and read it must not put what it read in the cache over a
/// newer version: here a clone's write loads the same table page, names a new copy in it, is
/// checkpointed and the page evicted, all between the read's page read and its insert (its
/// thread descheduled). The clone then read its page through its parent: an acknowledged write
/// read back older.
#[tokio::test]
async fn a_slow_table_read_does_not_cache_a_table_page_older_than_a_write_it_raced() {
    use crate::layers::LayerKind;
    let layout = snapshot_layout(64);
    let (_devs, vol) = pool_with_map_volume(layout).await;
    let map = Arc::new(MapStore::open(vol, layout, 4).await.unwrap());
    let write_all = |version: u64| {
        let map = Arc::clone(&map);
        async move {
            let updates: Vec<Update> = (0..600)
                .map(|b| Update { block: b, entry: entry(version * 1000 + b), expect: None })
                .collect();
            map.update(&updates).await.unwrap();
        }
    };
    write_all(1).await;
    let snapshot = |name: &'static str| {
        let map = Arc::clone(&map);
        async move {
            map.create_snapshot(layer("vol", LayerKind::Head), layer(name, LayerKind::Snapshot))
                .await
                .unwrap()
        }
    };
    let s1 = snapshot("s1").await;
    let c = map.create_clone(s1, layer("c", LayerKind::Clone)).await.unwrap();
    map.update_clone(c, &[Update { block: 0, entry: entry(7), expect: None }]).await.unwrap();
    // More table pages than the table cache holds (4): one per snapshot with copies.
    let mut snaps = vec![s1];
    for (v, name) in [(2, "s2"), (3, "s3"), (4, "s4"), (5, "s5")] {
        write_all(v).await;
        snaps.push(snapshot(name).await);
    }
    write_all(6).await;
    map.checkpoint().await.unwrap();
    let tc = map.table_of(c, 0);
    evict_table(&map, &snaps, tc).await;
    // The read of the clone's block 300 misses its table page, reads it and waits.
    map.snap.load_hold.arm();
    let read = tokio::spawn({
        let map = Arc::clone(&map);
        async move { map.get_in(c, &[300]).await.unwrap()[0] }
    });
    while !map.snap.load_hold.is_held() {
        tokio::task::yield_now().await;
    }
    // Meanwhile the clone's first write of map page 1 (a new copy the table names).
    let written = entry(9300);
    let mut write = tokio::spawn({
        let (map, snaps) = (Arc::clone(&map), snaps.clone());
        async move {
            map.update_clone(c, &[Update { block: 300, entry: written, expect: None }]).await.unwrap();
            map.checkpoint().await.unwrap();
            evict_table(&map, &snaps, tc).await;
        }
    });
    // It may wait for the read's load (then it is not finished here); either way the read goes on.
    let early = tokio::time::timeout(std::time::Duration::from_millis(500), &mut write).await;
    map.snap.load_hold.open();
    let before = read.await.unwrap();
    assert!(before == entry(1300) || before == written, "{before:?}");
    match early {
        Ok(done) => done.unwrap(),
        Err(_) => write.await.unwrap(),
    }
    assert_eq!(map.get_in(c, &[300]).await.unwrap(), vec![written], "the clone reads back its write");
    assert_eq!(map.get_in(c, &[0]).await.unwrap(), vec![entry(7)]);
}
