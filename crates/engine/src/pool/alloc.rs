//! Extent allocation and member placement.
//!
//! Free space is derived from the volume records (never stored), so it cannot disagree with
//! them. Members go on distinct drives of the requested class; members that protect each other
//! go on distinct failure domains (an unlabelled drive is its own domain).

use std::collections::BTreeMap;

use stria_dev::BLOCK_BYTES as BLOCK;

use crate::error::EngineError;
use crate::format::meta::{DriveClass, DriveState, Layout, MemberRecord, PoolMeta, SegmentRecord};
use crate::units::format_size;

/// A volume is placed in units (docs/design/pool-growth.md, "Placement units"): segments whose
/// member extents are at most a this-many-th of the mean drive of their class ...
pub(crate) const UNITS_PER_DRIVE: u64 = 256;
/// ... and at least this many bytes (smaller units would only grow the metadata).
pub(crate) const UNIT_MIN_BYTES: u64 = 16 << 20;

/// Member blocks of one placement unit on `class` drives: a [`UNITS_PER_DRIVE`]-th of the mean
/// size of the class's active drives, at least [`UNIT_MIN_BYTES`]. So a drive holds a few
/// hundred units at most, whatever the number of volumes, and the rebalance can even out use to
/// within a unit.
pub(crate) fn unit_blocks(meta: &PoolMeta, class: DriveClass) -> u64 {
    let sizes: Vec<u64> = meta
        .drives
        .iter()
        .filter(|d| d.class == class && d.state == DriveState::Active && d.data_blocks > 0)
        .map(|d| d.data_blocks)
        .collect();
    let mean = if sizes.is_empty() { 0 } else { sizes.iter().sum::<u64>() / sizes.len() as u64 };
    (mean / UNITS_PER_DRIVE).max(UNIT_MIN_BYTES / BLOCK)
}

/// Rows of one placement unit of a volume of `chunk_blocks` chunks on `class` drives (at least 1).
pub(crate) fn rows_per_unit(meta: &PoolMeta, class: DriveClass, chunk_blocks: u64) -> u64 {
    (unit_blocks(meta, class) / chunk_blocks.max(1)).max(1)
}

/// `rows` rows in units of at most `unit_rows`, as equal as can be (the first ones a row longer).
pub(crate) fn unit_rows(rows: u64, unit_rows: u64) -> impl Iterator<Item = u64> {
    let units = rows.div_ceil(unit_rows.max(1));
    (0..units).map(move |i| rows / units + u64::from(i < rows % units))
}

/// The unit in rows when an existing segment of volume `v` is cut into units, and the step its
/// pieces are a multiple of: for ec the member count, so that every row keeps the parity
/// rotation it was written with (`row % members` is the same in the piece as in the whole;
/// volume/map.rs `Geometry::ec_member`); the unit is rounded down to a multiple of the step.
fn split_unit_rows(meta: &PoolMeta, v: &crate::format::meta::VolumeRecord) -> (u64, u64) {
    let unit = rows_per_unit(meta, v.class, u64::from(v.chunk_blocks));
    let step = match v.layout {
        Layout::Ec { .. } => u64::from(v.layout.members()),
        _ => 1,
    };
    ((unit / step).max(1) * step, step)
}

/// Cuts every segment longer than a placement unit into units where it lies: the pieces keep
/// their members' drives, and each member's extent is cut at the same rows, so every block
/// stays where it is and is found at the same place through the new records (docs/design/
/// pool-growth.md, "Old volumes cut into units"). Volumes made before placement units are one
/// segment each; cut, the rebalance can move them a unit at a time. A segment with a member
/// being rebuilt or moved, or on a drive that is not active, is left whole (its cursors count
/// its rows): a later open cuts it. Returns the names of the volumes changed.
pub(crate) fn split_into_units(meta: &mut PoolMeta) -> Vec<String> {
    let units: Vec<(u64, u64)> = meta.volumes.iter().map(|v| split_unit_rows(meta, v)).collect();
    let active: Vec<u32> =
        meta.drives.iter().filter(|d| d.state == DriveState::Active).map(|d| d.slot).collect();
    let mut changed = Vec::new();
    for (v, (unit, step)) in meta.volumes.iter_mut().zip(units) {
        let chunk = u64::from(v.chunk_blocks);
        let whole = |seg: &SegmentRecord| {
            seg.rows <= unit
                || seg
                    .members
                    .iter()
                    .any(|m| m.rebuild_cursor_rows.is_some() || m.in_motion() || !active.contains(&m.slot))
        };
        if v.segments.iter().all(whole) {
            continue;
        }
        let mut segments = Vec::with_capacity(v.segments.len());
        for seg in std::mem::take(&mut v.segments) {
            if whole(&seg) {
                segments.push(seg);
                continue;
            }
            // As equal as the step allows: pieces of `piece` rows (at most a unit, since the
            // unit is a multiple of the step), the last one what is left.
            let pieces = seg.rows.div_ceil(unit);
            let piece = seg.rows.div_ceil(pieces).next_multiple_of(step);
            let mut at = 0;
            while at < seg.rows {
                let rows = piece.min(seg.rows - at);
                let members = seg
                    .members
                    .iter()
                    .map(|m| MemberRecord::at(m.slot, m.start_block + at * chunk))
                    .collect();
                segments.push(SegmentRecord { rows, members });
                at += rows;
            }
        }
        v.segments = segments;
        changed.push(v.name.clone());
    }
    changed
}

/// Used extents of drive `slot`, sorted: (start_block, len_blocks).
pub(crate) fn used_extents(meta: &PoolMeta, slot: u32) -> Vec<(u64, u64)> {
    let mut used: Vec<(u64, u64)> = Vec::new();
    for v in &meta.volumes {
        let per_row = u64::from(v.chunk_blocks);
        for seg in &v.segments {
            for m in &seg.members {
                // A member being moved also holds its destination, and a member just moved
                // still holds its source (until the commit after).
                let extents = [
                    Some((m.slot, m.start_block)),
                    m.move_to.map(|e| (e.slot, e.start_block)),
                    m.moved_from.map(|e| (e.slot, e.start_block)),
                ];
                for (s, start) in extents.into_iter().flatten() {
                    if s == slot {
                        used.push((start, seg.rows * per_row));
                    }
                }
            }
        }
    }
    used.sort_unstable();
    used
}

/// Free gaps of drive `slot` (of `data_blocks`), sorted by position.
pub(crate) fn free_extents(meta: &PoolMeta, slot: u32, data_blocks: u64) -> Vec<(u64, u64)> {
    let mut free = Vec::new();
    let mut at = 0;
    for (start, len) in used_extents(meta, slot) {
        if start > at {
            free.push((at, start - at));
        }
        at = at.max(start + len);
    }
    if data_blocks > at {
        free.push((at, data_blocks - at));
    }
    free
}

/// First free gap of at least `blocks` on `slot`.
pub(crate) fn first_fit(meta: &PoolMeta, slot: u32, data_blocks: u64, blocks: u64) -> Option<u64> {
    free_extents(meta, slot, data_blocks).into_iter().find(|&(_, len)| len >= blocks).map(|(s, _)| s)
}

/// True when `blocks` more blocks directly after the extent at `start`/`len` are free.
pub(crate) fn can_extend(
    meta: &PoolMeta,
    slot: u32,
    data_blocks: u64,
    start: u64,
    len: u64,
    blocks: u64,
) -> bool {
    let end = start + len;
    free_extents(meta, slot, data_blocks).iter().any(|&(s, l)| s == end && l >= blocks)
}

/// Failure domain of a drive: its label, or the drive itself when unlabelled.
pub(crate) fn domain_of(meta: &PoolMeta, slot: u32) -> String {
    match meta.drive(slot) {
        Some(d) if !d.domain.is_empty() => d.domain.clone(),
        _ => format!("#drive-{slot}"),
    }
}

struct Candidate {
    slot: u32,
    domain: String,
    start: u64,
    free_blocks: u64,
}

/// Chooses member extents of `member_blocks` each for a new segment of `layout` on `class`
/// drives, skipping `exclude` slots. Members are returned in layout order.
pub(crate) fn place(
    meta: &PoolMeta,
    layout: Layout,
    class: DriveClass,
    member_blocks: u64,
    exclude: &[u32],
) -> Result<Vec<MemberRecord>, EngineError> {
    let n = layout.members() as usize;
    let active: Vec<_> = meta
        .drives
        .iter()
        .filter(|d| {
            d.class == class && d.state == DriveState::Active && !d.draining && !exclude.contains(&d.slot)
        })
        .collect();
    let domains_total = {
        let mut ds: Vec<String> = active.iter().map(|d| domain_of(meta, d.slot)).collect();
        ds.sort();
        ds.dedup();
        ds.len()
    };
    // How many distinct domains the layout needs among members that protect each other.
    let group = match layout {
        Layout::Raid0 { .. } => 1,
        Layout::Raid1 { copies } | Layout::Raid10 { copies, .. } => copies as usize,
        Layout::Ec { .. } => n,
    };
    let labelled = active.iter().any(|d| !d.domain.is_empty());
    if active.len() < n {
        return Err(EngineError::Placement(format!(
            "{layout} needs {n} active {class} drives; the pool has {}",
            active.len()
        )));
    }
    if domains_total < group {
        let what = if labelled { "drives in distinct failure domains" } else { "drives" };
        return Err(EngineError::Placement(format!(
            "{layout} needs {group} {class} {what}; the pool has {domains_total}"
        )));
    }
    let mut candidates: Vec<Candidate> = active
        .iter()
        .filter_map(|d| {
            let start = first_fit(meta, d.slot, d.data_blocks, member_blocks)?;
            let free_blocks = free_extents(meta, d.slot, d.data_blocks).iter().map(|e| e.1).sum();
            Some(Candidate { slot: d.slot, domain: domain_of(meta, d.slot), start, free_blocks })
        })
        .collect();
    // Most free space first, so volumes spread over the drives.
    candidates.sort_by(|a, b| b.free_blocks.cmp(&a.free_blocks).then(a.slot.cmp(&b.slot)));

    let columns = n / group;
    let mut chosen: Vec<Candidate> = Vec::with_capacity(n);
    for _ in 0..columns {
        let mut column: Vec<usize> = Vec::with_capacity(group);
        for (i, c) in candidates.iter().enumerate() {
            if column.len() == group {
                break;
            }
            if column.iter().all(|&j| candidates[j].domain != c.domain) {
                column.push(i);
            }
        }
        if column.len() < group {
            return Err(no_space(meta, layout, class, member_blocks, &candidates, group));
        }
        // Remove the chosen ones (highest index first keeps the others' positions valid).
        column.sort_unstable_by(|a, b| b.cmp(a));
        let mut picked: Vec<Candidate> = column.into_iter().map(|i| candidates.remove(i)).collect();
        picked.reverse();
        chosen.extend(picked);
    }
    // Members come out column by column: column c, copy k at c * group + k (what the mirror
    // layouts expect); for ec the single "column" is the whole stripe.
    let members = chosen.into_iter().map(|c| MemberRecord::at(c.slot, c.start)).collect();
    Ok(members)
}

/// What [`place_units`] places: `rows` rows of `layout` on `class` drives, in units of at most
/// `unit` rows of `chunk_blocks` per member each.
pub(crate) struct Units {
    pub(crate) layout: Layout,
    pub(crate) class: DriveClass,
    pub(crate) chunk_blocks: u64,
    pub(crate) rows: u64,
    pub(crate) unit: u64,
}

/// Places `units` (each against the free space the ones before left) and hands each unit's
/// rows and members to `add`. When the drives run out, the error says so in totals when the
/// whole could never fit (`what`, e.g. "volume x (raid0:6, 100 GiB)", names it), rather than
/// naming the one unit that found no room.
pub(crate) fn place_units(
    meta: &mut PoolMeta,
    units: Units,
    what: &str,
    mut add: impl FnMut(&mut PoolMeta, u64, Vec<MemberRecord>),
) -> Result<(), EngineError> {
    let Units { layout, class, chunk_blocks, rows, unit } = units;
    let free: Vec<(u32, u64)> = meta
        .drives
        .iter()
        .filter(|d| d.class == class && d.state == DriveState::Active && !d.draining)
        .map(|d| (d.slot, free_extents(meta, d.slot, d.data_blocks).iter().map(|e| e.1).sum()))
        .collect();
    let count = rows.div_ceil(unit.max(1));
    for (i, unit_rows) in unit_rows(rows, unit).enumerate() {
        match place(meta, layout, class, unit_rows * chunk_blocks, &[]) {
            Ok(members) => add(meta, unit_rows, members),
            Err(EngineError::NoSpace(why)) => {
                let n = u64::from(layout.members());
                let need = rows * chunk_blocks;
                let total: u64 = free.iter().map(|f| f.1).sum();
                // Each member needs `need` blocks on a drive of its own: the whole fits only if
                // the drives hold n members' worth, each drive at most one member of the unit.
                let usable: u64 = free.iter().map(|f| f.1.min(need)).sum();
                if usable < need * n {
                    let list: Vec<String> =
                        free.iter().map(|(s, b)| format!("drive {s}: {}", format_size(b * BLOCK))).collect();
                    return Err(EngineError::NoSpace(format!(
                        "not enough free space for {what}: its {n} members need {} each on distinct {class} \
                         drives, {} in all, and the active {class} drives have {} free ({})",
                        format_size(need * BLOCK),
                        format_size(need * n * BLOCK),
                        format_size(total * BLOCK),
                        list.join(", ")
                    )));
                }
                if i > 0 {
                    return Err(EngineError::NoSpace(format!(
                        "{why} (placement unit {} of {count} of {what}; the free space is there in \
                         total but not in extents large enough on enough distinct drives)",
                        i + 1
                    )));
                }
                return Err(EngineError::NoSpace(why));
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn no_space(
    meta: &PoolMeta,
    layout: Layout,
    class: DriveClass,
    member_blocks: u64,
    candidates: &[Candidate],
    group: usize,
) -> EngineError {
    let mut largest: BTreeMap<u32, u64> = BTreeMap::new();
    for d in meta.drives.iter().filter(|d| d.class == class && d.state == DriveState::Active) {
        let big = free_extents(meta, d.slot, d.data_blocks).iter().map(|e| e.1).max().unwrap_or(0);
        largest.insert(d.slot, big);
    }
    let list: Vec<String> =
        largest.iter().map(|(slot, b)| format!("drive {slot}: {}", format_size(b * BLOCK))).collect();
    let spread = if group > 1 { " in distinct failure domains" } else { "" };
    EngineError::NoSpace(format!(
        "not enough free space for {layout}: it needs {} members of {} on distinct {class} drives{spread}, \
         but only {} such drives have room (largest free extents: {})",
        layout.members(),
        format_size(member_blocks * BLOCK),
        candidates.len(),
        list.join(", ")
    ))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::format::meta::{DriveErrors, DriveRecord, ExtentRecord, VolumeRecord, VolumeRole};
    use uuid::Uuid;

    pub(crate) fn meta(domains: &[&str]) -> PoolMeta {
        PoolMeta {
            pool_uuid: Uuid::nil(),
            name: "p".into(),
            generation: 1,
            created_unix_secs: 0,
            next_volume_id: 1,
            next_slot: domains.len() as u32,
            drives: domains
                .iter()
                .enumerate()
                .map(|(i, d)| DriveRecord {
                    slot: i as u32,
                    uuid: Uuid::from_u128(i as u128 + 1),
                    class: DriveClass::Capacity,
                    domain: (*d).into(),
                    state: DriveState::Active,
                    failed_reason: None,
                    path_hint: String::new(),
                    data_blocks: 1000,
                    errors: DriveErrors::default(),
                    draining: false,
                    out: None,
                })
                .collect(),
            volumes: vec![],
            tiered: vec![],
            qos: Default::default(),
            calibration: None,
            rebalance: None,
            rebuild_rate_bytes_per_sec: None,
            record_generations: Default::default(),
        }
    }

    #[test]
    fn ec_members_land_in_distinct_domains() {
        let m = meta(&["a", "a", "b", "c", "d", "e", "f"]);
        let members =
            place(&m, Layout::Ec { data_shards: 4, parity_shards: 2 }, DriveClass::Capacity, 100, &[])
                .unwrap();
        let mut ds: Vec<String> = members.iter().map(|x| domain_of(&m, x.slot)).collect();
        ds.sort();
        ds.dedup();
        assert_eq!(ds.len(), 6);
    }

    #[test]
    fn too_few_domains_is_refused_with_numbers() {
        let m = meta(&["a", "a", "b", "c", "d", "e"]);
        let err = place(&m, Layout::Ec { data_shards: 4, parity_shards: 2 }, DriveClass::Capacity, 100, &[])
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "ec:4+2 needs 6 capacity drives in distinct failure domains; the pool has 5"
        );
    }

    #[test]
    fn raid10_columns_may_share_domains_but_copies_may_not() {
        let m = meta(&["a", "a", "b", "b"]);
        let members =
            place(&m, Layout::Raid10 { width: 2, copies: 2 }, DriveClass::Capacity, 100, &[]).unwrap();
        for col in members.chunks(2) {
            assert_ne!(domain_of(&m, col[0].slot), domain_of(&m, col[1].slot));
        }
    }

    /// Two drives of 1,000 blocks with a raid1 volume of 30 rows of 10 blocks on them: at block
    /// 100 of drive 0 (free: 0-99 and 400-999) and block 0 of drive 1 (free: 300-999).
    fn two_drives_with_a_mirror() -> PoolMeta {
        let mut m = meta(&["", ""]);
        m.volumes.push(VolumeRecord {
            id: 1,
            name: "v".into(),
            size_bytes: 0,
            layout: Layout::Raid1 { copies: 2 },
            chunk_blocks: 10,
            class: DriveClass::Capacity,
            role: VolumeRole::Plain,
            segments: vec![SegmentRecord {
                rows: 30,
                members: vec![MemberRecord::at(0, 100), MemberRecord::at(1, 0)],
            }],
        });
        m
    }

    #[test]
    fn free_space_is_derived_from_extents() {
        let m = two_drives_with_a_mirror();
        assert_eq!(free_extents(&m, 0, 1000), vec![(0, 100), (400, 600)]);
        assert_eq!(first_fit(&m, 0, 1000, 200), Some(400));
        assert!(can_extend(&m, 1, 1000, 0, 300, 700));
        assert!(!can_extend(&m, 1, 1000, 0, 300, 701));
        let err = place(&m, Layout::Raid1 { copies: 2 }, DriveClass::Capacity, 800, &[]).unwrap_err();
        assert!(err.to_string().contains("not enough free space"), "{err}");
    }

    #[test]
    fn units_that_run_out_say_whether_the_space_or_its_shape_is_short() {
        let m = two_drives_with_a_mirror();
        let mirror = Layout::Raid1 { copies: 2 };
        // 700 blocks free on each drive; on drive 0 in two gaps (100 and 600).
        let units =
            |rows| Units { layout: mirror, class: DriveClass::Capacity, chunk_blocks: 10, rows, unit: 60 };
        // `add` records each unit in the document, as the callers do, for the next to see.
        let mut placed = Vec::new();
        let mut add = |m: &mut PoolMeta, rows, members| {
            placed.push(rows);
            m.volumes[0].segments.push(SegmentRecord { rows, members });
        };
        let err = place_units(&mut m.clone(), units(71), "w", &mut add).unwrap_err();
        assert!(
            err.to_string().starts_with(
                "not enough free space for w: its 2 members need 2.8 MiB each on distinct capacity drives, \
                 5.5 MiB in all, and the active capacity drives have 5.5 MiB free (drive 0: 2.7 MiB, drive 1: 2.7 MiB)"
            ),
            "{err}"
        );
        // 650 blocks fit in total, but the second unit of 320 finds no gap that large on drive 0.
        let err = place_units(&mut m.clone(), units(65), "w", &mut add).unwrap_err();
        assert!(
            err.to_string().contains("(placement unit 2 of 2 of w; the free space is there in total"),
            "{err}"
        );
        let mut fits = m.clone();
        place_units(&mut fits, units(60), "w", &mut add).unwrap();
        assert_eq!(placed, [36, 33, 60], "71 rows: one unit placed; 65: one; 60: the one");
        assert_eq!(fits.volumes[0].segments.len(), 2);
    }

    #[test]
    fn old_segments_are_cut_into_units_where_they_lie() {
        let mut m = meta(&["", "", "", "", "", "", ""]);
        for d in &mut m.drives {
            d.data_blocks = 1 << 20; // 4 GiB: units of 16 MiB (4,096 blocks, 256 rows of 16)
        }
        let ec = Layout::Ec { data_shards: 4, parity_shards: 2 };
        let segment = |rows, base: u64| SegmentRecord {
            rows,
            members: (0..6).map(|i| MemberRecord::at(i, base + u64::from(i) * 7 * 4096)).collect(),
        };
        let volume = |id, name: &str, layout, segments| VolumeRecord {
            id,
            name: name.into(),
            size_bytes: 0,
            layout,
            chunk_blocks: 16,
            class: DriveClass::Capacity,
            role: VolumeRole::Plain,
            segments,
        };
        let mut moving = segment(700, 300_000);
        moving.members[2].move_to = Some(ExtentRecord { slot: 6, start_block: 0 });
        m.volumes.push(volume(1, "ec", ec, vec![segment(1000, 0), moving.clone()]));
        m.volumes.push(volume(
            2,
            "mirror",
            Layout::Raid1 { copies: 2 },
            vec![SegmentRecord {
                rows: 600,
                members: vec![MemberRecord::at(5, 900_000), MemberRecord::at(6, 0)],
            }],
        ));
        m.volumes.push(volume(3, "small", ec, vec![segment(252, 500_000)]));
        let before = m.clone();
        assert_eq!(split_into_units(&mut m), vec!["ec".to_string(), "mirror".to_string()]);
        // ec: 252 rows a unit (256 rounded down to a multiple of 6), four pieces as equal as
        // that allows; the moving segment whole; the mirror in three of 200.
        let rows = |v: &VolumeRecord| v.segments.iter().map(|s| s.rows).collect::<Vec<_>>();
        assert_eq!(rows(&m.volumes[0]), vec![252, 252, 252, 244, 700]);
        assert_eq!(m.volumes[0].segments[4], moving);
        assert_eq!(rows(&m.volumes[1]), vec![200, 200, 200]);
        assert_eq!(m.volumes[2], before.volumes[2]);
        // Every row of every member is where it was, and keeps its parity rotation.
        for (old, new) in before.volumes.iter().zip(&m.volumes) {
            let n = u64::from(old.layout.members());
            let (mut first_old, mut first_new) = (0, 0);
            let mut pieces = new.segments.iter().map(|s| {
                let f = first_new;
                first_new += s.rows;
                (f, s)
            });
            let mut piece = pieces.next().unwrap();
            for seg in &old.segments {
                for row in 0..seg.rows {
                    let at = first_old + row;
                    while at >= piece.0 + piece.1.rows {
                        piece = pieces.next().unwrap();
                    }
                    let in_piece = at - piece.0;
                    assert_eq!(in_piece % n, row % n, "{}: row {at}", old.name);
                    for (a, b) in seg.members.iter().zip(&piece.1.members) {
                        assert_eq!(
                            (a.slot, a.start_block + row * 16),
                            (b.slot, b.start_block + in_piece * 16)
                        );
                    }
                }
                first_old += seg.rows;
            }
        }
        for slot in 0..7 {
            assert_eq!(free_extents(&m, slot, 1 << 20), free_extents(&before, slot, 1 << 20), "slot {slot}");
        }
        // Once cut, nothing more to cut.
        let cut = m.clone();
        assert!(split_into_units(&mut m).is_empty());
        assert_eq!(m, cut);
    }
}
