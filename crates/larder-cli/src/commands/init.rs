//! `larder init`: create a repository.

use std::io::{self, Write};
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use larder_chunk::{ChunkerConfig, ChunkerKind};
use larder_crypto::{AeadKind, KdfParams};
use larder_hash::HashAlgo;
use larder_store::{Compression, RepoConfig};
use serde::Serialize;

use super::index::IndexArgs;
use super::Globals;
use crate::location::RepoLocation;
use crate::output::{Output, Render};
use crate::password::{self, KdfArgs, NewPasswordArgs, Password};
use crate::repo_open::create;
use crate::size;

#[derive(Args)]
pub struct InitArgs {
    /// keyed (the default of encrypted repositories: cut points no one without the key
    /// can predict), fastcdc (= fastcdc2020; the default of plaintext ones),
    /// fastcdc2016, fixed; the papers' baselines rabin, adler, gear, ae
    #[arg(long)]
    chunker: Option<String>,
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
    /// XORed into every entry of FastCDC's Gear table (fastcdc, fastcdc2016): the
    /// fastcdc crate's and the Remote Execution API's seed
    #[arg(long, default_value_t = 0)]
    chunker_seed: u64,
    /// Fingerprint: blake3, sha256 or sha1 (sha1 only to reproduce the papers)
    #[arg(long, default_value = "blake3")]
    hash: String,
    /// How new chunks are stored: zstd (level 3, units of 16 chunks), zstd:LEVEL (1 to
    /// 19), zstd:LEVEL:UNIT (UNIT consecutive new chunks compressed together, 1 to 255;
    /// 1 compresses each alone) or none
    #[arg(long, default_value = "zstd")]
    compression: String,
    /// aes-256-gcm, xchacha20-poly1305, or none for a plaintext repository (benchmarks,
    /// the papers' experiments)
    #[arg(long, default_value = "aes-256-gcm")]
    encryption: String,
    #[command(flatten)]
    new_password: NewPasswordArgs,
    #[command(flatten)]
    kdf: KdfArgs,
    #[command(flatten)]
    index: IndexArgs,
}

impl InitArgs {
    /// The new repository's configuration, its index settings not yet validated; on
    /// error, the usage message.
    fn config(&self, out: &Output) -> Result<RepoConfig, String> {
        let compression = Compression::parse(&self.compression)?;
        let plaintext = self.encryption.eq_ignore_ascii_case("none");
        let name = match &self.chunker {
            Some(name) => name.as_str(),
            None if plaintext => "fastcdc",
            None => "keyed",
        };
        let Some(kind) = ChunkerKind::from_name(name) else {
            let names: Vec<&str> = ChunkerKind::ALL.iter().map(|k| k.name()).collect();
            return Err(format!(
                "unknown chunker {name:?}: use fastcdc or one of {}",
                names.join(", ")
            ));
        };
        if kind.needs_key() && plaintext {
            return Err(format!(
                "the {name} chunker needs an encrypted repository (its key): drop --encryption none"
            ));
        }
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
            seed: self.chunker_seed,
        };
        chunker.validate().map_err(|e| e.to_string())?;
        let config = RepoConfig::new(chunker, hash)
            .with_compression(compression)
            .with_index(self.index.settings());
        match self.encryption.to_ascii_lowercase().as_str() {
            "none" => Ok(config),
            name => {
                let aead = AeadKind::from_name(name).ok_or_else(|| {
                    format!(
                        "unknown encryption {:?}: use aes-256-gcm, xchacha20-poly1305 or none",
                        self.encryption
                    )
                })?;
                if hash == HashAlgo::Sha1 {
                    return Err(
                        "SHA-1 repositories cannot be encrypted: use --encryption none".into(),
                    );
                }
                Ok(config.with_encryption(aead))
            }
        }
    }
}

pub fn run(args: InitArgs, g: &Globals, out: &Output) -> Result<ExitCode> {
    let config = match args.config(out) {
        Ok(config) => config,
        Err(msg) => return Ok(out.usage(&msg)),
    };
    g.repo.require_lock("creates a repository")?;
    let location = g.repo.init_location()?;
    if let Err(e) = config.index.validate() {
        return Ok(out.usage(&e.to_string()));
    }
    let storage = g.repo.storage_at(&location)?;
    if config.encryption.is_none() {
        create(&storage, &config, None, out)?;
    } else {
        let (password, params) = new_password(&args, g)?;
        let params = match args.kdf.apply(params) {
            Ok(params) => params,
            Err(msg) => return Ok(out.usage(&msg)),
        };
        create(&storage, &config, Some((&password, params)), out)?;
    }
    out.print(&Created {
        repository: &location,
        config: &config,
    })?;
    Ok(ExitCode::SUCCESS)
}

/// The password of the new repository's first key: `--new-password-file`,
/// `LARDER_NEW_PASSWORD`, or the ordinary password sources; for the default
/// repository, else a generated one (docs/design/crypto.md); else a prompt. With the
/// Argon2id parameters its slot gets (lighter for a generated 256-bit password).
fn new_password(args: &InitArgs, g: &Globals) -> Result<(Password, KdfParams)> {
    if args.new_password.new_password_file.is_some()
        || std::env::var_os("LARDER_NEW_PASSWORD").is_some()
    {
        return Ok((args.new_password.get()?, KdfParams::DEFAULT));
    }
    if let Some(p) = g.repo.password.given()? {
        return Ok((password::non_empty(p)?, KdfParams::DEFAULT));
    }
    if g.repo.is_default() {
        return Ok((g.repo.new_default_password()?, KdfParams::GENERATED));
    }
    Ok((args.new_password.get()?, KdfParams::DEFAULT))
}

/// The repository `init` created.
#[derive(Serialize)]
struct Created<'a> {
    #[serde(serialize_with = "crate::location::serialize")]
    repository: &'a RepoLocation,
    config: &'a RepoConfig,
}

impl Render for Created<'_> {
    fn write_text(&self, w: &mut dyn Write) -> io::Result<()> {
        let config = self.config;
        let c = &config.chunker;
        writeln!(
            w,
            "created repository {} at {} ({} {}/{}/{} level {}, {}, compression {}, encryption {})",
            config.id,
            self.repository,
            c.kind.name(),
            c.min_size,
            c.avg_size,
            c.max_size,
            c.level,
            config.hash.name(),
            config.compression.name(),
            config.encryption.map_or("none", |e| e.aead.name())
        )
    }
}
