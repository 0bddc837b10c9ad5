//! The pattern options of `backup` and `restore` (docs/design/patterns.md). A pattern
//! that does not parse, or an exclude file that cannot be read, is a usage error: the
//! command stops before it starts, with exit code 2.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use clap::Args;
use larder_engine::{parse_pattern_file, Pattern, PatternList};

#[derive(Args)]
pub struct BackupExcludes {
    /// Do not back up what PATTERN selects, nor read it (repeatable; gitignore-style,
    /// matched against the absolute path: docs/design/patterns.md)
    #[arg(long, value_name = "PATTERN", allow_hyphen_values = true)]
    exclude: Vec<OsString>,
    /// Read exclude patterns from FILE: one a line, `#` starts a comment line, blank
    /// lines are skipped (repeatable)
    #[arg(long, value_name = "FILE")]
    exclude_file: Vec<PathBuf>,
}

impl BackupExcludes {
    /// The patterns of every `--exclude-file`, in the order given, then every
    /// `--exclude`; the last pattern that matches a path decides. On error, the usage
    /// message.
    pub fn patterns(&self) -> Result<PatternList, String> {
        let mut patterns = Vec::new();
        for file in &self.exclude_file {
            let text = std::fs::read(file)
                .map_err(|e| format!("cannot read --exclude-file {}: {e}", file.display()))?;
            for (line, parsed) in parse_pattern_file(&text) {
                patterns.push(parsed.map_err(|e| format!("{}:{line}: {e}", file.display()))?);
            }
        }
        patterns.extend(parse_all(&self.exclude)?);
        Ok(PatternList::new(patterns))
    }
}

#[derive(Args)]
pub struct RestoreSelection {
    /// Restore only what PATTERN selects, and the directories above it (repeatable;
    /// gitignore-style, matched against the path in the snapshot:
    /// docs/design/patterns.md)
    #[arg(long, value_name = "PATTERN", allow_hyphen_values = true)]
    include: Vec<OsString>,
    /// Do not restore what PATTERN selects; a directory is skipped whole (repeatable)
    #[arg(long, value_name = "PATTERN", allow_hyphen_values = true)]
    exclude: Vec<OsString>,
}

impl RestoreSelection {
    /// The include and exclude lists; on error, the usage message.
    pub fn patterns(&self) -> Result<(PatternList, PatternList), String> {
        Ok((
            PatternList::new(parse_all(&self.include)?),
            PatternList::new(parse_all(&self.exclude)?),
        ))
    }
}

fn parse_all(args: &[OsString]) -> Result<Vec<Pattern>, String> {
    args.iter()
        .map(|arg| Pattern::parse(arg.as_bytes()).map_err(|e| e.to_string()))
        .collect()
}
