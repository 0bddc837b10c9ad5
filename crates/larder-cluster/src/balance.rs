//! Where partitions go (docs/design/cluster.md, "Load balancing"): the master's plan
//! of moves, pure, so that it is tested apart from etcd.

use std::collections::BTreeMap;

use crate::ids::{NodeId, PartitionId};

/// The moves that give every partition a live owner and spread them evenly, moving as
/// few as possible: partitions of nodes not in `live` (and unowned ones) go to the
/// least loaded live nodes, then the most loaded give to the least loaded until their
/// counts differ by at most one. `owners[p]` is partition `p`'s owner (0: none).
/// Deterministic: ties go to the lower node id and the lower partition. With `live`
/// empty there is nowhere to move anything: no moves.
pub fn plan_moves(owners: &[NodeId], live: &[NodeId]) -> Vec<(PartitionId, NodeId)> {
    let mut held: BTreeMap<NodeId, Vec<u32>> = live.iter().map(|&n| (n, Vec::new())).collect();
    if held.is_empty() {
        return Vec::new();
    }
    let mut orphans = Vec::new();
    for (p, &owner) in owners.iter().enumerate() {
        match held.get_mut(&owner) {
            Some(list) => list.push(p as u32),
            None => orphans.push(p as u32),
        }
    }
    let total = owners.len();
    let nodes = held.len();
    // The lower ids take the remainder: node i may hold `base + 1` if i < extra.
    let (base, extra) = (total / nodes, total % nodes);
    let quota: BTreeMap<NodeId, usize> = held
        .keys()
        .enumerate()
        .map(|(i, &n)| (n, base + usize::from(i < extra)))
        .collect();
    // Over-quota nodes give up their highest partitions first.
    for (node, list) in held.iter_mut() {
        while list.len() > quota[node] {
            orphans.push(list.pop().expect("over quota, so not empty"));
        }
    }
    orphans.sort_unstable();
    let mut moves = Vec::with_capacity(orphans.len());
    let mut orphans = orphans.into_iter();
    for (node, list) in held.iter() {
        for _ in list.len()..quota[node] {
            let p = orphans.next().expect("quotas sum to the partition count");
            moves.push((PartitionId(p), *node));
        }
    }
    debug_assert!(orphans.next().is_none());
    moves.sort_unstable();
    moves
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn apply(owners: &mut [NodeId], moves: &[(PartitionId, NodeId)]) {
        for &(p, n) in moves {
            owners[p.0 as usize] = n;
        }
    }

    proptest! {
        /// After the plan every partition has a live owner, loads differ by at most
        /// one, partitions of live nodes within their quota stay put, and planning again
        /// moves nothing.
        #[test]
        fn plans_are_even_minimal_and_stable(
            owners in proptest::collection::vec(0u16..8, 1..300),
            live in proptest::collection::btree_set(1u16..8, 0..7),
        ) {
            let live: Vec<NodeId> = live.into_iter().collect();
            let mut after = owners.clone();
            let moves = plan_moves(&owners, &live);
            apply(&mut after, &moves);
            if live.is_empty() {
                prop_assert!(moves.is_empty());
                return Ok(());
            }
            prop_assert!(after.iter().all(|o| live.contains(o)));
            let loads: Vec<usize> = live.iter().map(|n| after.iter().filter(|o| *o == n).count()).collect();
            prop_assert!(loads.iter().max().unwrap() - loads.iter().min().unwrap() <= 1, "{:?}", loads);
            // Minimal: a node never loses a partition while at or under its quota, so
            // the moves are exactly the orphans plus each node's excess.
            let total = owners.len();
            let base = total / live.len();
            let excess: usize = live.iter().map(|n| owners.iter().filter(|o| *o == n).count().saturating_sub(base + 1)).sum();
            let orphaned = owners.iter().filter(|o| !live.contains(o)).count();
            prop_assert!(moves.len() <= orphaned + excess + live.len(), "{} moves", moves.len());
            prop_assert!(moves.iter().all(|&(p, n)| owners[p.0 as usize] != n));
            for &(p, _) in &moves {
                let from = owners[p.0 as usize];
                let held = owners.iter().filter(|&&o| o == from).count();
                prop_assert!(!live.contains(&from) || held > base, "node {} held {}", from, held);
            }
            prop_assert!(plan_moves(&after, &live).is_empty());
        }
    }

    #[test]
    fn a_joining_node_takes_an_even_share_from_the_others() {
        let mut owners: Vec<NodeId> = (0..1024).map(|p| 1 + (p % 3) as NodeId).collect();
        let moves = plan_moves(&owners, &[1, 2, 3, 4]);
        assert_eq!(moves.len(), 256);
        assert!(moves.iter().all(|&(_, n)| n == 4));
        apply(&mut owners, &moves);
        let moves = plan_moves(&owners, &[1, 2, 4]);
        apply(&mut owners, &moves);
        for n in [1, 2, 4] {
            let load = owners.iter().filter(|&&o| o == n).count();
            assert!((341..=342).contains(&load), "node {n}: {load}");
        }
    }
}
