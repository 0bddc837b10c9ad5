//! Achieved statistics of a workload, gathered generation by generation: run lengths
//! per state, transition frequencies, and the ground-truth dedup ratios.

use serde::Serialize;

use crate::lognormal::RunStats;
use crate::model::{Fitted, State};
use crate::workload::{Generation, Truth};

/// Mean, median and maximum of a sample, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Moments {
    pub mean: f64,
    pub median: f64,
    pub max: f64,
}

impl Moments {
    /// Sorts `values` in place. The median of an even count is the mean of the middle two.
    fn of(values: &mut [f64]) -> Moments {
        if values.is_empty() {
            return Moments::default();
        }
        values.sort_unstable_by(f64::total_cmp);
        let n = values.len();
        let median = if n % 2 == 1 {
            values[n / 2]
        } else {
            0.5 * (values[n / 2 - 1] + values[n / 2])
        };
        Moments {
            mean: values.iter().sum::<f64>() / n as f64,
            median,
            max: values[n - 1],
        }
    }
}

/// The runs of one state: how many, the statistics the model targets, those of the
/// lengths drawn, and those after rounding up to whole blocks.
#[derive(Clone, Debug, Serialize)]
pub struct RunReport {
    pub state: &'static str,
    pub runs: usize,
    pub target: RunStats,
    pub sampled: Moments,
    pub rounded: Moments,
}

/// The dedup ratio of one generation over all clients: its bytes over its new bytes.
#[derive(Clone, Debug, Serialize)]
pub struct GenerationReport {
    pub generation: u32,
    pub bytes: u64,
    pub new_bytes: u64,
    pub dedup_ratio: f64,
}

/// Everything `--stats` prints.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub bytes: u64,
    pub new_bytes: u64,
    pub duplicate_bytes: u64,
    /// Ground truth of the whole workload: bytes over new bytes (exact dedup of
    /// identical content at any granularity down to the byte; in aligned mode, exactly
    /// the dedup ratio of 4 KiB blocks).
    pub dedup_ratio: f64,
    pub target_later_dedup_ratio: f64,
    pub generations: Vec<GenerationReport>,
    pub runs: Vec<RunReport>,
    /// Observed P(from -> to) in later generations, rows and columns in the order
    /// U, R, BR; `None` for a state never left.
    pub transitions: [[Option<f64>; 3]; 3],
    pub insertions: u64,
    pub deletions: u64,
    pub inserted_bytes: u64,
    pub deleted_bytes: u64,
    pub per_client: Vec<Truth>,
}

/// Collects generations as they are planned.
#[derive(Default)]
pub struct Summary {
    sampled: [Vec<f64>; 3],
    rounded: [Vec<f64>; 3],
    transitions: [[u64; 3]; 3],
    truths: Vec<Truth>,
}

impl Summary {
    pub fn add(&mut self, g: &Generation) {
        for run in &g.runs {
            self.sampled[run.state.index()].push(run.sampled);
            self.rounded[run.state.index()].push(run.rounded as f64);
        }
        if g.truth.generation > 1 {
            for pair in g.runs.windows(2) {
                self.transitions[pair[0].state.index()][pair[1].state.index()] += 1;
            }
        }
        self.truths.push(g.truth.clone());
    }

    /// The observed transition counts (rows and columns U, R, BR).
    pub fn transition_counts(&self) -> [[u64; 3]; 3] {
        self.transitions
    }

    pub fn report(mut self, fitted: &Fitted) -> Report {
        let sum = |f: fn(&Truth) -> u64| self.truths.iter().map(f).sum::<u64>();
        let bytes = sum(|t| t.bytes);
        let new_bytes = sum(|t| t.new_bytes);
        let last = self.truths.iter().map(|t| t.generation).max().unwrap_or(0);
        let generations = (1..=last)
            .map(|g| {
                let of_g = self.truths.iter().filter(|t| t.generation == g);
                let (b, n) = of_g.fold((0, 0), |(b, n), t| (b + t.bytes, n + t.new_bytes));
                GenerationReport {
                    generation: g,
                    bytes: b,
                    new_bytes: n,
                    dedup_ratio: ratio(b, n),
                }
            })
            .collect();
        let targets = [
            fitted.model.unique,
            fitted.model.redundant,
            fitted.copied_stats,
        ];
        let runs = State::ALL
            .iter()
            .map(|&s| {
                let i = s.index();
                RunReport {
                    state: s.name(),
                    runs: self.sampled[i].len(),
                    target: targets[i],
                    sampled: Moments::of(&mut self.sampled[i]),
                    rounded: Moments::of(&mut self.rounded[i]),
                }
            })
            .collect();
        let transitions = self.transitions.map(|row| {
            let total: u64 = row.iter().sum();
            row.map(|n| (total > 0).then(|| n as f64 / total as f64))
        });
        Report {
            bytes,
            new_bytes,
            duplicate_bytes: bytes - new_bytes,
            dedup_ratio: ratio(bytes, new_bytes),
            target_later_dedup_ratio: fitted.model.dedup_ratio,
            generations,
            runs,
            transitions,
            insertions: sum(|t| t.insertions),
            deletions: sum(|t| t.deletions),
            inserted_bytes: sum(|t| t.inserted_bytes),
            deleted_bytes: sum(|t| t.deleted_bytes),
            per_client: self.truths,
        }
    }
}

fn ratio(bytes: u64, new_bytes: u64) -> f64 {
    if new_bytes == 0 {
        1.0
    } else {
        bytes as f64 / new_bytes as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moments_of_odd_and_even_samples() {
        let m = Moments::of(&mut [3.0, 1.0, 2.0]);
        assert_eq!((m.mean, m.median, m.max), (2.0, 2.0, 3.0));
        let m = Moments::of(&mut [4.0, 1.0, 2.0, 3.0]);
        assert_eq!((m.mean, m.median, m.max), (2.5, 2.5, 4.0));
        assert_eq!(Moments::of(&mut []), Moments::default());
    }
}
