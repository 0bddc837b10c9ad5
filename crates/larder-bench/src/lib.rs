//! Experiments for larder: the FastCDC paper's chunking comparisons (chunking speed,
//! dedup ratio and average chunk size against the expected chunk size, the effect of
//! the minimum chunk size, chunk-size distributions), `larder chunk`'s streaming
//! statistics, and `larder bench report`'s experiments beyond them.
//!
//! - [`chunk`]: the chunking experiments, pure functions over an in-memory [`Corpus`];
//! - [`stream`]: files chunked block by block in bounded memory (`larder chunk`);
//! - [`stats`]: chunk-size statistics and dedup ratios shared by both;
//! - [`pipeline`]: P-Dedupe's serial, pipelined and parallel backups against its model,
//!   and parallel against sequential chunking;
//! - [`gen_truth`]: larder's dedup against the workload generator's ground truth;
//! - [`index`]: the fingerprint index's insert and lookup rates;
//! - [`disk_index`]: `larder bench index`, eager against lazy lookup in the disk index
//!   (the Lazy Exact Deduplication paper's Tables V to VII and Fig. 12);
//! - [`report_all`]: `larder bench report`, every experiment in one report.md;
//! - [`plot`]: SVG plots; [`report`]: Markdown tables and report.md of `bench chunk`;
//! - [`corpus`]: loading the experiments' input files;
//! - [`experiment_key`]: the keyed chunker's key in experiments (random per process).
//!
//! `docs/design/bench.md` describes the experiments and their settings.

pub mod chunk;
pub mod chunk_plots;
pub mod corpus;
pub mod disk_index;
mod disk_index_plots;
mod disk_index_text;
mod error;
pub mod experiment_key;
pub mod gen_truth;
pub mod index;
pub mod pipeline;
pub mod plot;
pub mod report;
pub mod report_all;
mod report_plots;
mod report_text;
mod seeded;
pub mod stats;
pub mod stream;

pub use chunk::{run_chunk_bench, ChunkBenchReport, Plan};
pub use corpus::Corpus;
pub use error::BenchError;
