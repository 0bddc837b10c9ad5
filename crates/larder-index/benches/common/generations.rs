//! Multi-generation chunk-id streams with locality, shared by the disk index's tests
//! (tests/disk.rs) and its eager-versus-lazy example (examples/disk_lookup.rs): the
//! first generation is new chunks; each later one copies runs of the one before, in
//! order, with new runs inserted, runs deleted, runs of older generations copied out of
//! place, and chunks repeated a few positions later (repeats inside one lazy buffer).

/// A small deterministic generator (xorshift*), so that a seed names a workload.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// `generations` streams of chunk ids, the first of `len` new chunks (plus repeats).
/// Runs are 1 to 120 chunks; of every 10 runs, one is new chunks (a quarter of its
/// length), one is deleted, one is copied from a random older generation, seven are
/// copied in place.
pub fn generations(seed: u64, generations: usize, len: usize) -> Vec<Vec<u64>> {
    let mut rng = Rng(seed | 1);
    let mut next_id = 0u64;
    let mut fresh = |rng: &mut Rng, out: &mut Vec<u64>, n: u64| {
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
