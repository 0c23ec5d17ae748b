//! Which slices a new volume gets (docs/design/cluster.md §5): a pure function of the layout,
//! the number of node losses to survive and the free slices, with no solver.
//!
//! The failure domain is the node. To survive `f` node losses a mirror keeps its copies on
//! distinct nodes (f < copies), raid10 keeps at most `width` members per node (each column's
//! copies on distinct nodes), and `ec:K+M` keeps at most ⌊M/f⌋ members per node; with f = 0 any
//! number may share a node. raid0 has no redundancy and survives no node loss. Slices are taken round-robin over the nodes (sorted by
//! name), so members spread as evenly as the caps allow.

use std::collections::BTreeMap;

use stria_engine::Layout;

use crate::records::SliceRef;

/// Members per node allowed for `layout` to survive `f` node losses, and the member count.
fn caps(layout: Layout, f: u32) -> Result<(usize, usize), String> {
    let usize_of = |x: u32| x as usize;
    match layout {
        Layout::Raid0 { width } if f == 0 => Ok((usize_of(width), usize_of(width))),
        Layout::Raid0 { .. } => {
            Err(format!("{layout} keeps no redundancy: it cannot survive the loss of a node"))
        }
        // Surviving no node loss, every member may be on one node (drive losses are still
        // survived there).
        Layout::Raid1 { copies } if f == 0 => Ok((usize_of(copies), usize_of(copies))),
        Layout::Raid10 { width, copies } if f == 0 => {
            Ok((usize_of(width * copies), usize_of(width * copies)))
        }
        Layout::Raid1 { copies } if f < copies => Ok((1, usize_of(copies))),
        Layout::Raid10 { width, copies } if f < copies => Ok((usize_of(width), usize_of(width * copies))),
        Layout::Raid1 { copies } | Layout::Raid10 { copies, .. } => Err(format!(
            "{layout} keeps {copies} copies: it survives at most {} node losses, not {f}",
            copies - 1
        )),
        Layout::Ec { data_shards, parity_shards } if f == 0 => {
            Ok((usize_of(data_shards + parity_shards), usize_of(data_shards + parity_shards)))
        }
        Layout::Ec { data_shards, parity_shards } if parity_shards >= f => {
            Ok((usize_of(parity_shards / f), usize_of(data_shards + parity_shards)))
        }
        Layout::Ec { parity_shards, .. } => Err(format!(
            "{layout} has {parity_shards} parity shards: it survives at most {parity_shards} node losses, not {f}"
        )),
    }
}

/// Picks the slices of a volume of `layout` that must survive `node_failures` node losses,
/// from `free` (free slices of live nodes). Refused with the numbers when it cannot be placed.
pub fn place(layout: Layout, free: &[SliceRef], node_failures: u32) -> Result<Vec<SliceRef>, String> {
    let (cap, needed) = caps(layout, node_failures)?;
    let mut by_node: BTreeMap<&str, Vec<&SliceRef>> = BTreeMap::new();
    for s in free {
        by_node.entry(s.node.as_str()).or_default().push(s);
    }
    let mut taken: BTreeMap<&str, usize> = BTreeMap::new();
    let mut out = Vec::new();
    while out.len() < needed {
        let before = out.len();
        for (node, slices) in &by_node {
            let n = taken.entry(node).or_default();
            if out.len() < needed && *n < cap && *n < slices.len() {
                out.push(slices[*n].clone());
                *n += 1;
            }
        }
        if out.len() == before {
            let nodes_needed = needed.div_ceil(cap);
            return Err(format!(
                "{layout} surviving {node_failures} node loss(es) needs {needed} slices with at most {cap} per node \
                 (so on at least {nodes_needed} nodes); the cluster has {} free slices on {} nodes",
                free.len(),
                by_node.len()
            ));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn free(per_node: &[usize]) -> Vec<SliceRef> {
        let mut out = Vec::new();
        for (n, &count) in per_node.iter().enumerate() {
            for s in 0..count {
                out.push(SliceRef {
                    node: format!("n{n}"),
                    addr: format!("10.0.0.{n}:7000"),
                    slice: u32::try_from(s).unwrap(),
                });
            }
        }
        out
    }

    fn per_node(placed: &[SliceRef]) -> BTreeMap<String, usize> {
        let mut m = BTreeMap::new();
        for s in placed {
            *m.entry(s.node.clone()).or_default() += 1;
        }
        m
    }

    #[test]
    fn mirrors_and_ec_spread_over_nodes_within_their_caps() {
        let mirror = place(Layout::Raid1 { copies: 3 }, &free(&[4, 4, 4]), 1).unwrap();
        assert_eq!(per_node(&mirror).values().copied().collect::<Vec<_>>(), vec![1, 1, 1]);
        let ec21 = place(Layout::Ec { data_shards: 2, parity_shards: 1 }, &free(&[4, 4, 4]), 1).unwrap();
        assert!(per_node(&ec21).values().all(|&n| n == 1));
        let ec42 = place(Layout::Ec { data_shards: 4, parity_shards: 2 }, &free(&[4, 4, 4]), 1).unwrap();
        assert!(per_node(&ec42).values().all(|&n| n == 2), "{:?}", per_node(&ec42));
        let ec42_two_losses =
            place(Layout::Ec { data_shards: 4, parity_shards: 2 }, &free(&[1; 6]), 2).unwrap();
        assert_eq!(per_node(&ec42_two_losses).len(), 6);
        let r10 = place(Layout::Raid10 { width: 2, copies: 2 }, &free(&[3, 3]), 1).unwrap();
        assert_eq!(per_node(&r10).values().copied().collect::<Vec<_>>(), vec![2, 2]);
        let local = place(Layout::Raid0 { width: 3 }, &free(&[3]), 0).unwrap();
        assert_eq!(local.len(), 3);
        // No node loss to survive: a mirror or raid10 may sit on one node, as ec and raid0 may.
        let mirror_local = place(Layout::Raid1 { copies: 2 }, &free(&[2]), 0).unwrap();
        assert_eq!(per_node(&mirror_local).values().copied().collect::<Vec<_>>(), vec![2]);
        let r10_local = place(Layout::Raid10 { width: 2, copies: 2 }, &free(&[4]), 0).unwrap();
        assert_eq!(r10_local.len(), 4);
        // Still spread round-robin where there are nodes to spread over.
        let mirror_spread = place(Layout::Raid1 { copies: 2 }, &free(&[2, 2]), 0).unwrap();
        assert_eq!(per_node(&mirror_spread).values().copied().collect::<Vec<_>>(), vec![1, 1]);
    }

    #[test]
    fn what_cannot_be_placed_is_refused_with_the_numbers() {
        let err = place(Layout::Ec { data_shards: 4, parity_shards: 2 }, &free(&[4, 4]), 1).unwrap_err();
        assert!(err.contains("needs 6 slices with at most 2 per node (so on at least 3 nodes)"), "{err}");
        assert!(err.contains("8 free slices on 2 nodes"), "{err}");
        let err = place(Layout::Raid1 { copies: 3 }, &free(&[9, 9]), 1).unwrap_err();
        assert!(err.contains("at least 3 nodes"), "{err}");
        let err = place(Layout::Raid1 { copies: 2 }, &free(&[9, 9, 9]), 2).unwrap_err();
        assert!(err.contains("survives at most 1 node losses, not 2"), "{err}");
        let err = place(Layout::Raid0 { width: 2 }, &free(&[9, 9]), 1).unwrap_err();
        assert!(err.contains("no redundancy"), "{err}");
        let err = place(Layout::Ec { data_shards: 2, parity_shards: 1 }, &free(&[1, 1, 1]), 2).unwrap_err();
        assert!(err.contains("survives at most 1"), "{err}");
    }
}
