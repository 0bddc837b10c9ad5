//! Synthetic backup generations: the workload model of the dedupv1 cluster paper
//! (section VI-A), extended with edits that shift content. Pure logic above a
//! `std::io::Write` sink; `docs/design/gen.md` specifies the model, the fitted
//! distributions and the ground truth.
//!
//! Generation 1 of each client alternates unique (U) runs, new bytes from a PRNG, with
//! redundant (R) runs, blocks from a pool shared by all clients. Later generations
//! follow a Markov chain over U, R and BR (copied from the previous generation at the
//! same position). Each generation is planned as extents first, which gives its
//! ground truth (which bytes are copies of earlier ones), then rendered.
//!
//! [`fingerprint_stream`] is a second, byte-free workload: streams of chunk ids with
//! locality over several generations, for the disk index's tests and `larder bench index`.

mod error;
mod extent;
pub mod fingerprint_stream;
mod lognormal;
mod model;
mod rng;
mod stats;
mod workload;

pub use error::GenError;
pub use extent::{Extent, Source};
pub use lognormal::{RunStats, TruncatedLogNormal};
pub use model::{Edits, Fitted, Model, PoolPick, State, Transitions, BLOCK};
pub use rng::{seeded_bytes, SplitMix64, Xoshiro256};
pub use stats::{GenerationReport, Moments, Report, RunReport, Summary};
pub use workload::{Config, Generation, Run, Truth, Workload};
