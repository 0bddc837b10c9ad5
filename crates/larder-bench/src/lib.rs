//! Chunking experiments for larder: the FastCDC paper's comparisons (chunking speed,
//! dedup ratio and average chunk size against the expected chunk size, the effect of
//! the minimum chunk size, chunk-size distributions) on any input, and `larder chunk`'s
//! streaming statistics.
//!
//! - [`chunk`]: the experiments, pure functions over an in-memory [`Corpus`];
//! - [`stream`]: files chunked block by block in bounded memory (`larder chunk`);
//! - [`stats`]: chunk-size statistics and dedup ratios shared by both;
//! - [`plot`]: SVG plots; [`report`]: Markdown tables and report.md;
//! - [`corpus`]: loading the experiments' input files.
//!
//! `docs/design/bench.md` describes the experiments and their settings.

pub mod chunk;
pub mod corpus;
mod error;
pub mod gen_truth;
pub mod index;
pub mod pipeline;
pub mod plot;
pub mod report;
pub mod report_all;
mod report_plots;
mod report_text;
pub mod stats;
pub mod stream;

pub use chunk::{run_chunk_bench, ChunkBenchReport, Plan};
pub use corpus::Corpus;
pub use error::BenchError;
