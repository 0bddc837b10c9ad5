//! Multi-generation streams of chunk ids with locality, for the disk index: its tests
//! (`crates/larder-index/tests/disk.rs`) and `larder bench index` (larder-bench's
//! `disk_index`). No bytes: chunk id `i` stands for one distinct chunk, and the caller
//! maps it to a fingerprint.
//!
//! The first generation is new chunks; each later one copies runs of the one before,
//! in order, with new runs inserted, runs deleted, runs of older generations copied out
//! of place, and chunks repeated a few positions later (repeats inside one lazy buffer).
//!
//! The stream is frozen, as a chunker's cut points are: `docs/performance.md` quotes
//! counts of it (seed 1: 11 820 370 chunks, 2 302 753 distinct at 2 000 000), and the
//! golden test below pins it. It therefore keeps its own small generator (xorshift*)
//! rather than the workload model's xoshiro256**.

/// xorshift* (Marsaglia's xorshift with a multiplied output): enough for run lengths
/// and choices, and a seed names a stream.
struct XorShiftStar(u64);

impl XorShiftStar {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Below `n` (below 1 when `n` is 0).
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// `generations` streams of chunk ids, the first of `len` new chunks (plus repeats).
/// Runs are 1 to 120 chunks; of every 10 runs, one is new chunks (a quarter of its
/// length), one is deleted, one is copied from a random older generation, seven are
/// copied in place. A new chunk is repeated within the 40 positions before it with
/// probability 1/10.
///
/// Ids are handed out from 0 in the order chunks first appear, so the stream holds
/// exactly the ids `0..=max` ([`distinct`] of them), and a chunk is new exactly where
/// its id is larger than every id before it.
pub fn generations(seed: u64, generations: usize, len: usize) -> Vec<Vec<u64>> {
    let mut rng = XorShiftStar(seed | 1);
    let mut next_id = 0u64;
    let mut fresh = |rng: &mut XorShiftStar, out: &mut Vec<u64>, n: u64| {
        for _ in 0..n {
            out.push(next_id);
            next_id += 1;
            if rng.below(10) == 0 && out.len() > 2 {
                let back = 1 + rng.below(out.len().min(40) as u64 - 1) as usize;
                out.push(out[out.len() - back]);
            }
        }
    };
    let mut gens: Vec<Vec<u64>> = Vec::new();
    if generations == 0 {
        return gens;
    }
    let mut first = Vec::new();
    fresh(&mut rng, &mut first, len as u64);
    gens.push(first);
    for _ in 1..generations {
        let prev = gens.last().expect("one generation");
        let mut out = Vec::with_capacity(prev.len() + prev.len() / 8);
        let mut at = 0;
        while at < prev.len() {
            let run = 1 + rng.below(120) as usize;
            match rng.below(10) {
                0 => fresh(&mut rng, &mut out, run as u64 / 4 + 1),
                1 => at += run,
                2 => {
                    let g = &gens[rng.below(gens.len() as u64) as usize];
                    let from = rng.below(g.len() as u64) as usize;
                    out.extend_from_slice(&g[from..(from + run).min(g.len())]);
                }
                _ => {
                    out.extend_from_slice(&prev[at..(at + run).min(prev.len())]);
                    at += run;
                }
            }
        }
        gens.push(out);
    }
    gens
}

/// Distinct chunk ids in `gens` (as made by [`generations`]): the largest plus one.
pub fn distinct(gens: &[Vec<u64>]) -> u64 {
    gens.iter().flatten().max().map_or(0, |&m| m + 1)
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    /// FNV-1a over the ids, with a separator after each generation.
    fn digest(gens: &[Vec<u64>]) -> u64 {
        let step = |h: u64, x: u64| (h ^ x).wrapping_mul(0x0000_0100_0000_01b3);
        gens.iter().fold(0xcbf2_9ce4_8422_2325, |h, g| {
            step(g.iter().fold(h, |h, &x| step(h, x)), 0xffff)
        })
    }

    #[test]
    fn a_seed_names_one_stream() {
        for seed in [0, 1, 2, 7, u64::MAX] {
            assert_eq!(generations(seed, 4, 3000), generations(seed, 4, 3000));
        }
        assert_ne!(
            digest(&generations(1, 4, 3000)),
            digest(&generations(2, 4, 3000))
        );
        // Seeds differing only in the lowest bit name the same stream (the state must
        // be odd, so the bit is set).
        assert_eq!(generations(6, 3, 500), generations(7, 3, 500));
    }

    /// The stream as it was when the figures of docs/performance.md were measured
    /// (then among larder-index's bench helpers).
    #[test]
    fn the_stream_is_frozen() {
        let g = generations(1, 5, 2000);
        let lens: Vec<usize> = g.iter().map(Vec::len).collect();
        assert_eq!(lens, [2174, 2384, 2519, 2445, 2394]);
        assert_eq!(distinct(&g), 2338);
        assert_eq!(digest(&g), 0xa57e_d553_5265_19c8);
        let g = generations(7, 4, 20_000);
        assert_eq!(g.iter().map(Vec::len).sum::<usize>(), 88_471);
        assert_eq!(distinct(&g), 22_475);
        assert_eq!(digest(&g), 0x550d_e269_ba9d_fe82);
    }

    #[test]
    fn ids_first_appear_in_order_and_every_one_appears() {
        let g = generations(3, 5, 5000);
        let mut seen = HashSet::new();
        let mut next = 0;
        for &id in g.iter().flatten() {
            if seen.insert(id) {
                assert_eq!(id, next, "a new id out of order");
                next += 1;
            } else {
                assert!(id < next);
            }
        }
        assert_eq!(next, distinct(&g));
        assert_eq!(g[0].iter().filter(|&&id| id < 5000).count(), g[0].len());
        assert!(g[0].len() > 5000, "the first generation has repeats");
    }

    #[test]
    fn no_generations_is_an_empty_stream() {
        assert!(generations(1, 0, 100).is_empty());
        assert_eq!(distinct(&[]), 0);
        assert_eq!(generations(1, 3, 0), vec![Vec::<u64>::new(); 3]);
    }
}
