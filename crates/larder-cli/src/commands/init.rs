//! `larder init`: create a repository.

use std::io::{self, Write};
use std::path::Path;
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use larder_chunk::{ChunkerConfig, ChunkerKind};
use larder_hash::HashAlgo;
use larder_store::{Compression, RepoConfig, Repository};
use serde::Serialize;

use super::index::IndexArgs;
use super::Globals;
use crate::output::{Output, Render};
use crate::size;

#[derive(Args)]
pub struct InitArgs {
    /// fastcdc (= fastcdc2020), fastcdc2016, fixed; the papers' baselines rabin, adler, gear, ae
    #[arg(long, default_value = "fastcdc")]
    chunker: String,
    /// Minimum chunk size (bytes; KiB/MiB suffixes accepted)
    #[arg(long, default_value = "2KiB", value_parser = size::parse)]
    min: usize,
    /// Average (expected) chunk size; the chunk size for `fixed`
    #[arg(long, default_value = "8KiB", value_parser = size::parse)]
    avg: usize,
    /// Maximum chunk size
    #[arg(long, default_value = "64KiB", value_parser = size::parse)]
    max: usize,
    /// FastCDC normalization level, 0 to 3
    #[arg(long, default_value_t = 2)]
    level: u8,
    /// Fingerprint: blake3, sha256 or sha1 (sha1 only to reproduce the papers)
    #[arg(long, default_value = "blake3")]
    hash: String,
    /// How new chunks are stored: zstd (level 3), zstd:LEVEL (1 to 19) or none
    #[arg(long, default_value = "zstd")]
    compression: String,
    #[command(flatten)]
    index: IndexArgs,
}

impl InitArgs {
    /// The new repository's configuration, its index settings not yet validated; on
    /// error, the usage message.
    fn config(&self, out: &Output) -> Result<RepoConfig, String> {
        let compression = Compression::parse(&self.compression)?;
        let Some(kind) = ChunkerKind::from_name(&self.chunker) else {
            let names: Vec<&str> = ChunkerKind::ALL.iter().map(|k| k.name()).collect();
            return Err(format!(
                "unknown chunker {:?}: use fastcdc or one of {}",
                self.chunker,
                names.join(", ")
            ));
        };
        let Some(hash) = HashAlgo::from_name(&self.hash) else {
            return Err(format!(
                "unknown hash {:?}: use blake3, sha256 or sha1",
                self.hash
            ));
        };
        if hash == HashAlgo::Sha1 {
            out.warn(
                "SHA-1 is broken against chosen collisions: use it only to reproduce the papers",
            );
        }
        let chunker = ChunkerConfig {
            kind,
            min_size: self.min,
            avg_size: self.avg,
            max_size: self.max,
            level: self.level,
        };
        chunker.validate().map_err(|e| e.to_string())?;
        Ok(RepoConfig::new(chunker, hash)
            .with_compression(compression)
            .with_index(self.index.settings()))
    }
}

pub fn run(args: InitArgs, g: &Globals, out: &Output) -> Result<ExitCode> {
    let config = match args.config(out) {
        Ok(config) => config,
        Err(msg) => return Ok(out.usage(&msg)),
    };
    let path = g.repo.init_path()?;
    if let Err(e) = config.index.validate() {
        return Ok(out.usage(&e.to_string()));
    }
    Repository::init(&path, &config)?;
    out.print(&Created {
        repository: &path,
        config: &config,
    })?;
    Ok(ExitCode::SUCCESS)
}

/// The repository `init` created.
#[derive(Serialize)]
struct Created<'a> {
    repository: &'a Path,
    config: &'a RepoConfig,
}

impl Render for Created<'_> {
    fn write_text(&self, w: &mut dyn Write) -> io::Result<()> {
        let config = self.config;
        let c = &config.chunker;
        writeln!(
            w,
            "created repository {} at {} ({} {}/{}/{} level {}, {}, compression {})",
            config.id,
            self.repository.display(),
            c.kind.name(),
            c.min_size,
            c.avg_size,
            c.max_size,
            c.level,
            config.hash.name(),
            config.compression.name()
        )
    }
}
