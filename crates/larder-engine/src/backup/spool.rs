//! Stage 3's spool (docs/design/pipeline.md, "Stage 3 with the disk index"): the bytes
//! of chunks that wait for lazy answers once stage 3's share of `--index-memory` is
//! full. Appended sequentially, read back only for the chunks answered `New`.
//!
//! The file is `spool-<pid>.tmp` in the repository's `tmp/`: created at the first
//! append, emptied (truncated to nothing) whenever no spooled chunk is live, and
//! removed when the spool is dropped, at the end of the backup and on every error. A
//! crash leaves it in `tmp/`, which the next writer's open empties.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::error::{EngineError, Result};

/// Appends are gathered into writes of this many bytes.
const WRITE_BUFFER: usize = 1 << 20;

/// Invariants: the spool's logical content is the file's first `flushed` bytes
/// followed by `buffer`; `live` counts the spooled chunks not yet read back or
/// released, and when it is zero nothing spooled is needed any more.
pub(super) struct Spool {
    path: PathBuf,
    file: Option<File>,
    buffer: Vec<u8>,
    flushed: u64,
    pub(super) live: usize,
    /// Bytes appended over the backup.
    pub(super) bytes_spooled: u64,
}

impl Spool {
    /// A spool in `dir`; nothing is created until the first append.
    pub(super) fn new(dir: &Path) -> Self {
        Self {
            path: dir.join(format!("spool-{}.tmp", std::process::id())),
            file: None,
            buffer: Vec::new(),
            flushed: 0,
            live: 0,
            bytes_spooled: 0,
        }
    }

    fn io(&self) -> impl FnOnce(std::io::Error) -> EngineError + '_ {
        |e| EngineError::io(&self.path, e)
    }

    /// Appends one chunk's bytes; returns its offset.
    pub(super) fn append(&mut self, data: &[u8]) -> Result<u64> {
        let offset = self.flushed + self.buffer.len() as u64;
        if self.buffer.len() + data.len() > WRITE_BUFFER {
            self.flush()?;
        }
        if data.len() > WRITE_BUFFER {
            self.write_at_end(data)?;
        } else {
            self.buffer.extend_from_slice(data);
        }
        self.live += 1;
        self.bytes_spooled += data.len() as u64;
        Ok(offset)
    }

    /// Reads back the chunk of `len` bytes at `offset`, which is then no longer live.
    pub(super) fn take(&mut self, offset: u64, len: usize) -> Result<Vec<u8>> {
        if offset + len as u64 > self.flushed {
            self.flush()?;
        }
        let mut out = vec![0; len];
        let file = self
            .file
            .as_ref()
            .expect("a spooled chunk was flushed to the file");
        file.read_exact_at(&mut out, offset).map_err(self.io())?;
        self.release()?;
        Ok(out)
    }

    /// A spooled chunk that is not needed (answered not new). When none is live the
    /// file is emptied, so that it holds at most what is still waiting since it was
    /// last empty.
    pub(super) fn release(&mut self) -> Result<()> {
        self.live -= 1;
        if self.live == 0 {
            self.buffer.clear();
            self.flushed = 0;
            if let Some(file) = &self.file {
                file.set_len(0).map_err(self.io())?;
            }
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        if !self.buffer.is_empty() {
            let buffer = std::mem::take(&mut self.buffer);
            self.write_at_end(&buffer)?;
            self.buffer = buffer;
            self.buffer.clear();
        }
        Ok(())
    }

    fn write_at_end(&mut self, data: &[u8]) -> Result<()> {
        if self.file.is_none() {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(&self.path)
                .map_err(self.io())?;
            self.file = Some(file);
        }
        let file = self.file.as_ref().expect("opened above");
        file.write_all_at(data, self.flushed).map_err(self.io())?;
        self.flushed += data.len() as u64;
        Ok(())
    }
}

impl Drop for Spool {
    fn drop(&mut self) {
        if self.file.take().is_some() {
            // Best effort: a leftover is removed by the next writer's open.
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_read_back_byte_for_byte_and_the_file_empties_when_none_is_live() {
        let dir = tempfile::tempdir().unwrap();
        let mut spool = Spool::new(dir.path());
        let chunks: Vec<Vec<u8>> = (0..40u32)
            .map(|i| {
                (0..(i * 9_001) % 70_000 + 1)
                    .map(|b| (b ^ i) as u8)
                    .collect()
            })
            .collect();
        let at: Vec<u64> = chunks.iter().map(|c| spool.append(c).unwrap()).collect();
        let path = spool.path.clone();
        for (i, (c, &o)) in chunks.iter().zip(&at).enumerate().rev() {
            if i % 3 == 0 {
                spool.release().unwrap();
            } else {
                assert_eq!(&spool.take(o, c.len()).unwrap(), c, "chunk {i}");
            }
        }
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
        // Offsets start again at zero.
        assert_eq!(spool.append(&chunks[1]).unwrap(), 0);
        assert_eq!(spool.take(0, chunks[1].len()).unwrap(), chunks[1]);
        drop(spool);
        assert!(!path.exists(), "dropped spool removes its file");
    }

    #[test]
    fn a_spool_that_cannot_create_its_file_fails_with_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let not_a_dir = dir.path().join("file");
        std::fs::write(&not_a_dir, b"x").unwrap();
        let mut spool = Spool::new(&not_a_dir);
        let big = vec![7u8; WRITE_BUFFER + 1];
        let err = spool.append(&big).unwrap_err();
        assert!(err.to_string().contains("spool-"), "{err}");
    }
}
