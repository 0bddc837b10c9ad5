//! The experiments' input: whole files loaded into memory, each one stream.

use std::fs;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::BenchError;

/// One input stream: chunking starts afresh at its first byte.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stream {
    pub name: String,
    pub data: Vec<u8>,
}

/// The streams an experiment chunks, in order. Dedup is counted across all of them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Corpus {
    pub streams: Vec<Stream>,
}

/// What was loaded, for reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CorpusSummary {
    pub streams: usize,
    pub bytes: u64,
    pub names: Vec<String>,
}

/// A path that loading stepped over (not an error: the rest was loaded).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SkippedPath {
    pub path: PathBuf,
    pub reason: String,
}

impl Corpus {
    pub fn bytes(&self) -> u64 {
        self.streams.iter().map(|s| s.data.len() as u64).sum()
    }

    pub fn summary(&self) -> CorpusSummary {
        CorpusSummary {
            streams: self.streams.len(),
            bytes: self.bytes(),
            names: self.streams.iter().map(|s| s.name.clone()).collect(),
        }
    }

    /// Loads every file of `paths`: a file is one stream; a directory gives its regular
    /// files, recursively, in sorted path order (so a directory of numbered releases is
    /// chunked oldest first). Symlinks and special files inside directories are skipped
    /// and listed. Nothing is read unless the files' total size is at most `cap` bytes.
    pub fn load(paths: &[PathBuf], cap: u64) -> Result<(Corpus, Vec<SkippedPath>), BenchError> {
        let mut files = Vec::new();
        let mut skipped = Vec::new();
        for path in paths {
            let meta = fs::metadata(path).map_err(|e| BenchError::io(path, e))?;
            if meta.is_dir() {
                collect_dir(path, &mut files, &mut skipped)?;
            } else if meta.is_file() {
                files.push((path.clone(), meta.len()));
            } else {
                skipped.push(SkippedPath {
                    path: path.clone(),
                    reason: "not a regular file or directory".into(),
                });
            }
        }
        let total: u64 = files.iter().map(|(_, len)| len).sum();
        if total > cap {
            return Err(BenchError::TooLarge { total, cap });
        }
        let mut streams = Vec::with_capacity(files.len());
        for (path, _) in files {
            let data = fs::read(&path).map_err(|e| BenchError::io(&path, e))?;
            streams.push(Stream {
                name: path.display().to_string(),
                data,
            });
        }
        let corpus = Corpus { streams };
        if corpus.bytes() == 0 {
            return Err(BenchError::NoData);
        }
        Ok((corpus, skipped))
    }
}

fn collect_dir(
    dir: &Path,
    files: &mut Vec<(PathBuf, u64)>,
    skipped: &mut Vec<SkippedPath>,
) -> Result<(), BenchError> {
    let mut entries = fs::read_dir(dir)
        .and_then(|rd| rd.collect::<Result<Vec<_>, _>>())
        .map_err(|e| BenchError::io(dir, e))?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let path = entry.path();
        let meta = fs::symlink_metadata(&path).map_err(|e| BenchError::io(&path, e))?;
        if meta.is_dir() {
            collect_dir(&path, files, skipped)?;
        } else if meta.is_file() {
            files.push((path, meta.len()));
        } else {
            skipped.push(SkippedPath {
                path,
                reason: "not a regular file (symlinks are not followed)".into(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directories_give_their_files_in_sorted_order_and_skip_symlinks() {
        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path().to_path_buf();
        fs::create_dir_all(dir.join("b")).unwrap();
        fs::write(dir.join("b/2"), b"two").unwrap();
        fs::write(dir.join("a"), b"one").unwrap();
        fs::write(dir.join("c"), b"three").unwrap();
        std::os::unix::fs::symlink(dir.join("a"), dir.join("link")).unwrap();
        let (corpus, skipped) = Corpus::load(std::slice::from_ref(&dir), 1 << 20).unwrap();
        let data: Vec<&[u8]> = corpus.streams.iter().map(|s| s.data.as_slice()).collect();
        assert_eq!(data, [&b"one"[..], b"two", b"three"]);
        assert_eq!(skipped.len(), 1);
        assert!(skipped[0].path.ends_with("link"));
        assert_eq!(corpus.summary().bytes, 11);

        let err = Corpus::load(std::slice::from_ref(&dir), 10).unwrap_err();
        assert!(matches!(err, BenchError::TooLarge { total: 11, cap: 10 }));
        let missing = dir.join("missing");
        let err = Corpus::load(std::slice::from_ref(&missing), 10).unwrap_err();
        assert!(err.to_string().contains("missing"), "{err}");
    }
}
