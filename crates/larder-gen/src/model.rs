//! The workload model's settings and what follows from them: the fitted run-length
//! distributions, the Markov chain's stationary distribution, and the redundant-copy
//! (BR) run length that gives the target dedup ratio (`docs/design/gen.md`).

use serde::Serialize;

use crate::error::GenError;
use crate::lognormal::{RunStats, TruncatedLogNormal};

/// Every run is a whole number of these blocks (the paper's block-based backup).
pub const BLOCK: u64 = 4096;

const KIB: f64 = 1024.0;
const MIB: f64 = 1024.0 * 1024.0;

/// The data states of the paper's model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum State {
    /// Unique: new data from the PRNG.
    U,
    /// Redundant: blocks from the shared pool (intra-backup redundancy).
    R,
    /// Backup-redundant: copied from the previous generation at the same position.
    BR,
}

impl State {
    pub const ALL: [State; 3] = [State::U, State::R, State::BR];

    pub fn index(self) -> usize {
        self as usize
    }

    pub fn name(self) -> &'static str {
        match self {
            State::U => "U",
            State::R => "R",
            State::BR => "BR",
        }
    }
}

/// The transition probabilities of later generations. The chain never stays in a
/// state (a run already has its length), so each row has one free probability.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Transitions {
    /// P(BR -> U); P(BR -> R) is the rest.
    pub br_to_u: f64,
    /// P(U -> BR); P(U -> R) is the rest.
    pub u_to_br: f64,
    /// P(R -> BR); P(R -> U) is the rest.
    pub r_to_br: f64,
}

impl Transitions {
    /// The paper's traces.
    pub const PAPER: Transitions = Transitions {
        br_to_u: 0.916,
        u_to_br: 0.822,
        r_to_br: 0.315,
    };

    /// P(from -> to), rows summing to 1, zero on the diagonal.
    pub fn p(&self, from: State, to: State) -> f64 {
        use State::*;
        match (from, to) {
            (BR, U) => self.br_to_u,
            (BR, R) => 1.0 - self.br_to_u,
            (U, BR) => self.u_to_br,
            (U, R) => 1.0 - self.u_to_br,
            (R, BR) => self.r_to_br,
            (R, U) => 1.0 - self.r_to_br,
            _ => 0.0,
        }
    }

    /// The long-run fraction of runs in each state (indexed by `State::index`), by
    /// the Markov chain tree theorem: state i's weight is the sum, over the spanning
    /// trees directed into i, of their edge probabilities. For three states these are
    /// the two trees with both others pointing at i and the two paths into i.
    pub fn stationary(&self) -> [f64; 3] {
        let p = |a, b| self.p(a, b);
        let weight = |i: State, j: State, k: State| {
            p(j, i) * p(k, i) + p(j, k) * p(k, i) + p(k, j) * p(j, i)
        };
        use State::*;
        let w = [weight(U, R, BR), weight(R, U, BR), weight(BR, U, R)];
        let total: f64 = w.iter().sum();
        w.map(|x| x / total)
    }

    fn validate(&self) -> Result<(), GenError> {
        for (name, v) in [
            ("BR->U", self.br_to_u),
            ("U->BR", self.u_to_br),
            ("R->BR", self.r_to_br),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return Err(GenError::Transitions(format!(
                    "P({name}) is {v}, not between 0 and 1"
                )));
            }
        }
        let pi = self.stationary();
        if !pi.iter().all(|x| x.is_finite()) || pi[State::U.index()] <= 0.0 {
            return Err(GenError::Transitions(
                "the chain never reaches U, so later generations would hold no new data".into(),
            ));
        }
        if pi[State::BR.index()] <= 0.0 {
            return Err(GenError::Transitions(
                "the chain never reaches BR, so no generation would copy the one before".into(),
            ));
        }
        Ok(())
    }
}

/// Shifting edits inside copied (BR) runs: insertions of new bytes and deletions of
/// copied ones, at exponentially distributed gaps, each of a length uniform in
/// `1..=max_len` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Edits {
    /// Mean bytes of copied data between two edits.
    pub mean_gap: u64,
    /// Longest insertion or deletion, in bytes.
    pub max_len: u32,
}

impl Edits {
    pub const DEFAULT: Edits = Edits {
        mean_gap: 4 << 20,
        max_len: 1024,
    };

    /// New (inserted) bytes per copied byte: half of the edits insert, a mean of
    /// (1 + max_len) / 2 bytes each.
    pub fn inserted_per_copied_byte(&self) -> f64 {
        0.5 * (1.0 + f64::from(self.max_len)) / 2.0 / self.mean_gap as f64
    }
}

/// How R runs take blocks from the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum PoolPick {
    /// Each run starts at one exponentially picked block and takes the blocks after
    /// it in pool order (wrapping), so that a run repeats an earlier run's content.
    Run,
    /// Each block is picked on its own (the paper's model, for 4 KiB block backups).
    Block,
}

/// Everything that shapes the data, apart from sizes and the seed.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Model {
    pub unique: RunStats,
    pub redundant: RunStats,
    pub transitions: Transitions,
    /// Target dedup ratio of each later generation: its bytes over the bytes it adds.
    pub dedup_ratio: f64,
    /// `None`: the paper's aligned model.
    pub edits: Option<Edits>,
    /// Blocks in the shared pool of redundant data.
    pub pool_blocks: u32,
    /// Mean of the exponential pick, in blocks from the start of the pool.
    pub pool_pick_mean: f64,
    pub pool_pick: PoolPick,
}

impl Default for Model {
    /// The paper's statistics and transitions, with shifting edits and run-wise pool
    /// picks; `Model::pure` is the paper's model unchanged.
    fn default() -> Self {
        Model {
            unique: RunStats {
                mean: 337.0 * KIB,
                median: 19.0 * KIB,
                max: 6582.0 * MIB,
            },
            redundant: RunStats {
                mean: 143.0 * KIB,
                median: 16.0 * KIB,
                max: 3498.0 * MIB,
            },
            transitions: Transitions::PAPER,
            dedup_ratio: 50.0,
            edits: Some(Edits::DEFAULT),
            pool_blocks: 4096,
            pool_pick_mean: 256.0,
            pool_pick: PoolPick::Run,
        }
    }
}

impl Model {
    /// The paper's model: aligned (no edits), each redundant block picked on its own.
    pub fn pure() -> Self {
        Model {
            edits: None,
            pool_pick: PoolPick::Block,
            ..Model::default()
        }
    }
}

/// A validated model with its fitted distributions.
#[derive(Clone, Debug, Serialize)]
pub struct Fitted {
    pub model: Model,
    pub unique: TruncatedLogNormal,
    pub redundant: TruncatedLogNormal,
    /// BR runs: R's shape (median/mean) and the larger maximum, with the mean that
    /// gives the target dedup ratio.
    pub copied: TruncatedLogNormal,
    pub copied_stats: RunStats,
    pub stationary: [f64; 3],
}

impl Fitted {
    pub fn new(model: Model) -> Result<Self, GenError> {
        model.transitions.validate()?;
        if model.pool_blocks == 0 {
            return Err(GenError::Config("the pool needs at least one block".into()));
        }
        if !(model.pool_pick_mean > 0.0 && model.pool_pick_mean.is_finite()) {
            return Err(GenError::Config(
                "the pool pick mean must be positive".into(),
            ));
        }
        if let Some(e) = model.edits {
            if e.mean_gap == 0 || e.max_len == 0 {
                return Err(GenError::Config(
                    "edits need a positive mean gap and maximum length".into(),
                ));
            }
        }
        let unique = TruncatedLogNormal::fit("unique (U)", model.unique)?;
        let redundant = TruncatedLogNormal::fit("redundant (R)", model.redundant)?;
        let stationary = model.transitions.stationary();
        let copied_mean = copied_mean(&model, &unique, &redundant, &stationary)?;
        let copied_stats = RunStats {
            mean: copied_mean,
            median: copied_mean * model.redundant.median / model.redundant.mean,
            max: model.unique.max.max(model.redundant.max),
        };
        let copied = TruncatedLogNormal::fit("copied (BR)", copied_stats).map_err(|e| {
            GenError::DedupRatio {
                ratio: model.dedup_ratio,
                reason: e.to_string(),
            }
        })?;
        Ok(Fitted {
            model,
            unique,
            redundant,
            copied,
            copied_stats,
            stationary,
        })
    }

    pub fn distribution(&self, state: State) -> &TruncatedLogNormal {
        match state {
            State::U => &self.unique,
            State::R => &self.redundant,
            State::BR => &self.copied,
        }
    }
}

/// The mean BR run length b that makes a later generation's bytes r times its new
/// bytes. Per step of the chain (π the stationary fractions, u and q the mean U and R
/// runs after rounding to blocks, ι the inserted bytes per copied byte):
/// new = π_U u + π_BR b ι and total = π_U u + π_R q + π_BR b (1 + ι), so
/// r new = total gives b = (π_U u (r - 1) - π_R q) / (π_BR (1 + ι - r ι)).
/// Pool blocks seen for the first time are left out: the pool is small and hot, so
/// they are a vanishing share of a large generation.
fn copied_mean(
    model: &Model,
    unique: &TruncatedLogNormal,
    redundant: &TruncatedLogNormal,
    pi: &[f64; 3],
) -> Result<f64, GenError> {
    let r = model.dedup_ratio;
    let err = |reason: String| GenError::DedupRatio { ratio: r, reason };
    if !(r > 1.0 && r.is_finite()) {
        return Err(err("must be above 1".into()));
    }
    let u = unique.rounded_mean(BLOCK as f64);
    let q = redundant.rounded_mean(BLOCK as f64);
    let iota = model.edits.map_or(0.0, |e| e.inserted_per_copied_byte());
    let (pu, pr, pbr) = (
        pi[State::U.index()],
        pi[State::R.index()],
        pi[State::BR.index()],
    );
    let numerator = pu * u * (r - 1.0) - pr * q;
    let denominator = pbr * (1.0 + iota - r * iota);
    if numerator <= 0.0 {
        return Err(err(format!(
            "too low: U and R runs alone give {:.3}; ask for more",
            (pu * u + pr * q) / (pu * u)
        )));
    }
    if denominator <= 0.0 {
        return Err(err(format!(
            "too high for these edits: inserted bytes alone cap it below {:.0}; edit \
             less often (--edit-gap) or turn edits off (--aligned)",
            (1.0 + iota) / iota
        )));
    }
    Ok(numerator / denominator)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stationary_solves_pi_equals_pi_p() {
        let t = Transitions::PAPER;
        let pi = t.stationary();
        assert!((pi.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        for to in State::ALL {
            let inflow: f64 = State::ALL
                .iter()
                .map(|&from| pi[from.index()] * t.p(from, to))
                .sum();
            assert!((inflow - pi[to.index()]).abs() < 1e-12);
        }
    }

    #[test]
    fn copied_mean_gives_the_target_ratio_in_expectation() {
        for edits in [None, Some(Edits::DEFAULT)] {
            let model = Model {
                edits,
                dedup_ratio: 20.0,
                ..Model::default()
            };
            let f = Fitted::new(model.clone()).unwrap();
            let pi = f.stationary;
            let b = f.copied.rounded_mean(BLOCK as f64);
            let u = f.unique.rounded_mean(BLOCK as f64);
            let q = f.redundant.rounded_mean(BLOCK as f64);
            let iota = edits.map_or(0.0, |e| e.inserted_per_copied_byte());
            let new = pi[0] * u + pi[2] * b * iota;
            let total = pi[0] * u + pi[1] * q + pi[2] * b * (1.0 + iota);
            // The BR runs' own rounding (well under a block on a mean of megabytes).
            assert!((total / new / 20.0 - 1.0).abs() < 1e-3, "{}", total / new);
        }
    }

    #[test]
    fn unreachable_ratios_and_bad_settings_are_refused() {
        let with = |m: Model| Fitted::new(m).is_err();
        assert!(with(Model {
            dedup_ratio: 1.05,
            ..Model::default()
        }));
        assert!(with(Model {
            dedup_ratio: 1e9,
            ..Model::default()
        }));
        assert!(with(Model {
            transitions: Transitions {
                br_to_u: 1.5,
                ..Transitions::PAPER
            },
            ..Model::default()
        }));
        assert!(with(Model {
            transitions: Transitions {
                br_to_u: 0.0,
                u_to_br: 1.0,
                r_to_br: 1.0
            },
            ..Model::default()
        }));
        assert!(with(Model {
            pool_blocks: 0,
            ..Model::default()
        }));
    }
}
