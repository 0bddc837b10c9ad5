//! Properties of any workload: every generation has exactly its size, its truth adds
//! up, no chunking finds more duplicates than the truth, and in aligned mode fixed
//! 4 KiB chunks find exactly the truth.

use std::collections::HashSet;

use larder_chunk::{ChunkerConfig, ChunkerKind};
use larder_gen::{Config, Edits, Model, PoolPick, RunStats, Workload, BLOCK};
use proptest::prelude::*;

fn duplicate_bytes(streams: &[Vec<u8>], chunker: &ChunkerConfig) -> u64 {
    let chunker = chunker.build();
    let mut seen: HashSet<&[u8]> = HashSet::new();
    let mut dup = 0;
    for s in streams {
        let mut at = 0;
        for len in chunker.chunk_lengths(s) {
            if !seen.insert(&s[at..at + len]) {
                dup += len as u64;
            }
            at += len;
        }
    }
    dup
}

fn chunker(kind: ChunkerKind, min: usize, avg: usize, max: usize) -> ChunkerConfig {
    ChunkerConfig {
        kind,
        min_size: min,
        avg_size: avg,
        max_size: max,
        level: 2,
        seed: 0,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn truth_adds_up_and_bounds_every_chunking(
        seed in any::<u64>(),
        blocks in 1u64..200,
        generations in 1u32..4,
        clients in 1u32..3,
        edits in prop::option::of((32_768u64..131_072, 1u32..4_000)),
        per_block in any::<bool>(),
        ratio in 1.5f64..8.0,
        pool_blocks in 1u32..64,
    ) {
        // Short runs and a small pool, so that a few hundred KiB hold every case:
        // runs of all states, pool reuse and wrap-around, edits near the end.
        let short = RunStats { mean: 12.0 * 1024.0, median: 5.0 * 1024.0, max: 2.0 * 1024.0 * 1024.0 };
        let model = Model {
            unique: short,
            redundant: short,
            dedup_ratio: ratio,
            edits: edits.map(|(mean_gap, max_len)| Edits { mean_gap, max_len }),
            pool_blocks,
            pool_pick_mean: 4.0,
            pool_pick: if per_block { PoolPick::Block } else { PoolPick::Run },
            ..Model::default()
        };
        let size = blocks * BLOCK;
        let mut w = Workload::new(Config { seed, generation_size: size, generations, clients, model })
            .unwrap();
        let (mut streams, mut truth_dup) = (Vec::new(), 0);
        while let Some(g) = w.next_generation() {
            let t = &g.truth;
            prop_assert_eq!(t.bytes, size);
            prop_assert_eq!(t.unique_bytes + t.pool_bytes + t.copied_bytes + t.inserted_bytes, size);
            prop_assert!(t.new_bytes >= t.unique_bytes + t.inserted_bytes && t.new_bytes <= size);
            prop_assert_eq!(g.extents().iter().map(|e| e.len).sum::<u64>(), size);
            let mut out = Vec::new();
            w.write(&g, &mut out).unwrap();
            prop_assert_eq!(out.len() as u64, size);
            truth_dup += t.duplicate_bytes();
            streams.push(out);
        }
        let fixed = duplicate_bytes(&streams, &chunker(ChunkerKind::Fixed, 4096, 4096, 4096));
        let cdc = duplicate_bytes(&streams, &chunker(ChunkerKind::Fastcdc2020, 512, 2048, 16_384));
        prop_assert!(cdc <= truth_dup, "CDC {} > truth {}", cdc, truth_dup);
        if edits.is_none() {
            prop_assert_eq!(fixed, truth_dup);
        } else {
            prop_assert!(fixed <= truth_dup, "fixed {} > truth {}", fixed, truth_dup);
        }
    }
}
