//! CuckooIndex against a `HashMap` model, with fingerprints crafted to collide in the
//! bits that choose partitions, buckets and tags (the layout of docs/design/index.md:
//! in the first 8 bytes as a little-endian u64, the top 10 bits choose the partition,
//! the next 42 are the tag, whose low 21 bits choose the bucket in table 0 and high 21
//! bits the bucket in table 1).

use std::collections::HashMap;

use larder_hash::Fingerprint;
use larder_index::{ChunkLocation, CuckooIndex, FingerprintIndex};
use proptest::prelude::*;

/// A fingerprint with the given partition, table-0 and table-1 bucket bits; `low`
/// fills the 12 bits below the tag and `rest` bytes 8 to 31.
fn crafted(partition: u64, choice0: u64, choice1: u64, low: u64, rest: [u8; 24]) -> Fingerprint {
    let w0 = (partition << 54) | (choice1 << 33) | (choice0 << 12) | (low & 0xfff);
    let mut fp = [0; 32];
    fp[..8].copy_from_slice(&w0.to_le_bytes());
    fp[8..].copy_from_slice(&rest);
    Fingerprint(fp)
}

fn spread(i: u64) -> [u8; 24] {
    let mut out = [0; 24];
    for (k, b) in out.iter_mut().enumerate() {
        *b = (i.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> ((k % 8) * 8)) as u8 ^ k as u8;
    }
    out
}

fn loc(i: u64) -> ChunkLocation {
    ChunkLocation {
        container: 1 + i / 300,
        offset: 32 + (i % 300) as u32 * 4096,
        length: 4096,
    }
}

/// Kinds of fingerprints a test pool mixes.
fn fingerprint_strategy() -> impl Strategy<Value = Fingerprint> {
    let rest = any::<[u8; 24]>();
    prop_oneof![
        // Uniform, as real fingerprints.
        any::<[u8; 32]>().prop_map(Fingerprint),
        // SHA-1: 20 digest bytes, 12 zero bytes.
        any::<[u8; 20]>().prop_map(|d| {
            let mut fp = [0; 32];
            fp[..20].copy_from_slice(&d);
            Fingerprint(fp)
        }),
        // Both buckets and the tag shared by many: the stash.
        (0..4u64, rest).prop_map(|(low, rest)| crafted(7, 5, 9, low, rest)),
        // Same tag, entries differing only in the bits below the tag.
        (any::<u64>()).prop_map(|low| crafted(7, 5, 9, low, [3; 24])),
        // One partition, table-0 choice from four values: long kick chains, growth.
        (0..4u64, any::<u64>(), rest).prop_map(|(c0, c1, rest)| crafted(
            3,
            c0,
            c1 & 0x1f_ffff,
            c1 >> 40,
            rest
        )),
        // One partition, everything else random: growth.
        (any::<u64>(), rest).prop_map(|(t, rest)| crafted(
            1,
            t & 0x1f_ffff,
            (t >> 21) & 0x1f_ffff,
            t >> 50,
            rest
        )),
    ]
}

/// Any location: most fit the packed fields, some overflow them.
fn location_strategy() -> impl Strategy<Value = ChunkLocation> {
    prop_oneof![
        (0..40u64, 0..(20u32 << 20), 1..=(16u32 << 20)).prop_map(|(c, o, l)| ChunkLocation {
            container: c,
            offset: o,
            length: l,
        }),
        (any::<u64>(), any::<u32>(), any::<u32>()).prop_map(|(c, o, l)| ChunkLocation {
            container: c,
            offset: o,
            length: l,
        }),
    ]
}

#[derive(Debug, Clone)]
enum Op {
    Insert(usize, ChunkLocation),
    Get(usize),
}

fn ops_strategy() -> impl Strategy<Value = (Vec<Fingerprint>, Vec<Op>)> {
    proptest::collection::vec(fingerprint_strategy(), 1..400).prop_flat_map(|pool| {
        let n = pool.len();
        let op = prop_oneof![
            3 => (0..n, location_strategy()).prop_map(|(i, l)| Op::Insert(i, l)),
            1 => (0..n).prop_map(Op::Get),
        ];
        (Just(pool), proptest::collection::vec(op, 1..1200))
    })
}

/// Everything the index says equals the model: len, every lookup (single and batch),
/// and the full contents through `iter`.
fn assert_same(
    index: &CuckooIndex,
    model: &HashMap<Fingerprint, ChunkLocation>,
    pool: &[Fingerprint],
) {
    assert_eq!(index.len(), model.len());
    let singles: Vec<_> = pool.iter().map(|fp| index.get(fp)).collect();
    let expected: Vec<_> = pool.iter().map(|fp| model.get(fp).copied()).collect();
    assert_eq!(singles, expected);
    assert_eq!(index.get_batch(pool), expected);
    let contents: HashMap<_, _> = index.iter().collect();
    assert_eq!(
        index.iter().count(),
        model.len(),
        "iter yields a fingerprint twice"
    );
    assert_eq!(&contents, model);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn behaves_like_a_hash_map_keeping_first_inserts((pool, ops) in ops_strategy()) {
        let mut index = CuckooIndex::new();
        let mut model = HashMap::new();
        for op in ops {
            match op {
                Op::Insert(i, l) => {
                    let new = !model.contains_key(&pool[i]);
                    model.entry(pool[i]).or_insert(l);
                    prop_assert_eq!(index.insert(pool[i], l), new);
                }
                Op::Get(i) => prop_assert_eq!(index.get(&pool[i]), model.get(&pool[i]).copied()),
            }
        }
        assert_same(&index, &model, &pool);
    }

    #[test]
    fn parallel_insert_batch_equals_sequential_inserts(
        (pool, ops) in ops_strategy(),
        threads in 1..5usize,
        split in 0..100usize,
    ) {
        let items: Vec<(Fingerprint, ChunkLocation)> = ops
            .iter()
            .map(|op| match op {
                Op::Insert(i, l) => (pool[*i], *l),
                Op::Get(i) => (pool[*i], loc(*i as u64)),
            })
            .collect();
        let mut sequential = CuckooIndex::new();
        let new_sequential = items.iter().filter(|(f, l)| sequential.insert(*f, *l)).count();
        // Two batches, so that the second meets fingerprints the first inserted.
        let (a, b) = items.split_at(split * items.len() / 100);
        let mut batched = CuckooIndex::new();
        let new_batched = batched.insert_batch(a, threads) + batched.insert_batch(b, threads);
        prop_assert_eq!(new_batched, new_sequential);
        let model: HashMap<_, _> = sequential.iter().collect();
        assert_same(&batched, &model, &pool);
    }

    #[test]
    fn get_batch_equals_get_on_any_keys(
        present in proptest::collection::vec(fingerprint_strategy(), 0..300),
        absent in proptest::collection::vec(fingerprint_strategy(), 0..300),
    ) {
        let mut index = CuckooIndex::new();
        for (i, fp) in present.iter().enumerate() {
            index.insert(*fp, loc(i as u64));
        }
        let keys: Vec<_> = present.iter().chain(&absent).copied().collect();
        let singles: Vec<_> = keys.iter().map(|fp| index.get(fp)).collect();
        prop_assert_eq!(index.get_batch(&keys), singles);
    }
}

/// Regression guard for the kick loop: an insert that evicts slot after slot must end
/// with every slot somewhere (in its tables or the stash). Dropping the last homeless
/// slot, or writing it over an occupied one, loses a fingerprint that was found before.
#[test]
fn long_kick_chains_lose_no_fingerprint() {
    let mut index = CuckooIndex::new();
    let mut inserted = Vec::new();
    // All in one partition, which grows from one segment to many and fills to 95%
    // before each growth: thousands of evictions.
    for i in 0..20_000u64 {
        let t = i.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let fp = crafted(3, t & 0x1f_ffff, (t >> 21) & 0x1f_ffff, i, spread(i));
        assert!(index.insert(fp, loc(i)));
        inserted.push(fp);
        if i % 1000 == 999 {
            for (j, fp) in inserted.iter().enumerate() {
                assert_eq!(index.get(fp), Some(loc(j as u64)), "lost {j} after {i}");
            }
        }
    }
    let stats = index.stats();
    assert!(stats.kicks > 5_000, "too few evictions to test: {stats:?}");
    assert!(stats.growths > 5, "{stats:?}");
    assert_eq!(index.iter().count(), inserted.len());
}

/// Fingerprints crafted to share table 0's buckets (four of them) have one real choice
/// each: many fail to place at low load and wait in the stash, where they are found.
#[test]
fn fingerprints_crowding_table_zero_are_stashed_and_found() {
    let mut index = CuckooIndex::new();
    let fps: Vec<_> = (0..3000u64)
        .map(|i| crafted(5, (i % 4) << 19, (i * 7919) & 0x1f_ffff, i, spread(i)))
        .collect();
    for (i, fp) in fps.iter().enumerate() {
        assert!(index.insert(*fp, loc(i as u64)));
    }
    let stats = index.stats();
    assert!(stats.stashed > 0, "{stats:?}");
    for (i, fp) in fps.iter().enumerate() {
        assert_eq!(index.get(fp), Some(loc(i as u64)));
    }
    assert_eq!(
        index.get_batch(&fps),
        fps.iter().map(|f| index.get(f)).collect::<Vec<_>>()
    );
    assert_eq!(index.iter().count(), fps.len());
}

/// Nine or more fingerprints that share both buckets cannot all be in the tables; the
/// stash keeps the rest, and growing (which cannot separate them) is not repeated for
/// each of them.
#[test]
fn fingerprints_sharing_both_buckets_go_to_the_stash() {
    let mut index = CuckooIndex::new();
    let fps: Vec<_> = (0..100u64)
        .map(|i| crafted(9, 11, 13, i, spread(i)))
        .collect();
    for (i, fp) in fps.iter().enumerate() {
        assert!(index.insert(*fp, loc(i as u64)));
    }
    let stats = index.stats();
    assert_eq!(stats.stashed, 92, "{stats:?}");
    assert!(
        stats.slots <= 1024,
        "grew for collisions growth cannot fix: {stats:?}"
    );
    for (i, fp) in fps.iter().enumerate() {
        assert_eq!(index.get(fp), Some(loc(i as u64)));
    }
    assert_eq!(
        index.get_batch(&fps),
        fps.iter().map(|f| index.get(f)).collect::<Vec<_>>()
    );
}

/// Growth places the stash's slots again with the tables' (regression guard: a
/// growth that rebuilt only the tables lost every stashed fingerprint).
#[test]
fn stashed_fingerprints_survive_growth() {
    let mut index = CuckooIndex::new();
    let colliding: Vec<_> = (0..40u64)
        .map(|i| crafted(9, 11, 13, i, spread(i)))
        .collect();
    for (i, fp) in colliding.iter().enumerate() {
        index.insert(*fp, loc(i as u64));
    }
    assert!(index.stats().stashed > 0);
    // Random fingerprints of the same partition until it has grown several times.
    for i in 0..5000u64 {
        let t = (i + 1).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        index.insert(
            crafted(9, t & 0x1f_ffff, (t >> 21) & 0x1f_ffff, t, spread(t)),
            loc(i),
        );
    }
    assert!(index.stats().growths >= 3, "{:?}", index.stats());
    for (i, fp) in colliding.iter().enumerate() {
        assert_eq!(index.get(fp), Some(loc(i as u64)), "lost colliding {i}");
    }
}

/// Growth keeps the tables full: never far below the 95% they grow at (a growth
/// factor of 1.25 leaves 76% just after growing), once partitions span several
/// segments (2000 fingerprints each).
#[test]
fn growth_from_empty_keeps_the_load_factor_high() {
    let mut index = CuckooIndex::new();
    let mut seen_low = f64::MAX;
    for i in 0..2_500_000u64 {
        let mut fp = [0; 32];
        fp[..8].copy_from_slice(&i.wrapping_mul(0x9e37_79b9_7f4a_7c15).to_le_bytes());
        fp[8..].copy_from_slice(&spread(i));
        index.insert(Fingerprint(fp), loc(i));
        if i >= 2_000_000 && i % 50_000 == 0 {
            seen_low = seen_low.min(index.stats().load_factor());
        }
    }
    let stats = index.stats();
    assert_eq!(stats.stashed, 0, "{stats:?}");
    assert!(stats.growths > 0);
    assert!(seen_low > 0.74, "load fell to {seen_low}");
}

/// Sized so that whole segments fit exactly (1024 partitions, 2 tables of 64 buckets
/// of 4 slots, at 90%).
#[test]
fn with_capacity_does_not_grow_and_fills_to_ninety_percent() {
    let n = 1024 * 460u64;
    let mut index = CuckooIndex::with_capacity(n as usize);
    for i in 0..n {
        let mut fp = [0; 32];
        fp[..8].copy_from_slice(
            &(i ^ 0x5555)
                .wrapping_mul(0xbf58_476d_1ce4_e5b9)
                .to_le_bytes(),
        );
        fp[8..].copy_from_slice(&spread(i));
        index.insert(Fingerprint(fp), loc(i));
    }
    let stats = index.stats();
    assert_eq!(stats.growths, 0, "{stats:?}");
    assert!(stats.load_factor() > 0.89, "{stats:?}");
}
