//! The disk index of an encrypted repository: its files sealed page by page under any
//! [`IndexIo`] (docs/design/crypto.md, "Disk index pages"). The index above sees the
//! plaintext files of docs/design/disk-index.md, unchanged; below, every file starts
//! with its build's 112-byte header and logical page `p` is the 4144 sealed bytes at
//! `112 + 4144 p`. The cryptography is `larder_crypto::PageSealer`'s.
//!
//! Physical pages are not 4096-byte aligned, so a sealed index never uses `O_DIRECT`:
//! [`SealedIo::open_dir`] opens its directory without it.

use std::io;
use std::path::{Path, PathBuf};

use larder_crypto::index_page::{INDEX_HEADER_LEN, SEALED_PAGE_LEN};
use larder_crypto::{IndexPart, PageSealer, RepoKeys};

use super::io::{DirIo, IndexFile, IndexIo, PAGE};
use crate::{IndexError, Result};

const HEADER: u64 = INDEX_HEADER_LEN as u64;
const SEALED: u64 = SEALED_PAGE_LEN as u64;

fn part(file: IndexFile) -> IndexPart {
    match file {
        IndexFile::Table => IndexPart::Table,
        IndexFile::Meta => IndexPart::Meta,
        IndexFile::Bloom => IndexPart::Bloom,
        IndexFile::Runs => IndexPart::Runs,
    }
}

/// Where logical page `page` of a file lies.
fn physical(page: u64) -> u64 {
    HEADER + page * SEALED
}

/// Sealed bytes that do not open, carried through `io::Error` to the store, which
/// reports them as [`IndexError::Corrupt`] naming the file and the place.
#[derive(Debug)]
pub(super) struct Unopenable {
    file: IndexFile,
    offset: u64,
    reason: String,
}

impl std::fmt::Display for Unopenable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "corrupt disk index file {} at byte {}: {}",
            self.file.name(),
            self.offset,
            self.reason
        )
    }
}

impl std::error::Error for Unopenable {}

impl Unopenable {
    fn io(file: IndexFile, offset: u64, reason: impl Into<String>) -> io::Error {
        io::Error::new(
            io::ErrorKind::InvalidData,
            Self {
                file,
                offset,
                reason: reason.into(),
            },
        )
    }

    pub(super) fn into_error(self) -> IndexError {
        IndexError::Corrupt {
            file: self.file.name(),
            offset: self.offset,
            reason: self.reason,
        }
    }
}

/// The files of `inner`, sealed with a repository's keys (full or write-only).
///
/// Invariants: `build` is the build whose header starts `table` (drawn by
/// `create(Table)`, or read from `table` on first use); `current[f]` says file `f`'s
/// header is known to be that build's.
pub struct SealedIo<I> {
    inner: I,
    /// A write-only copy: opening and sealing pages needs no more.
    keys: RepoKeys,
    build: Option<PageSealer>,
    current: [bool; 4],
}

impl SealedIo<DirIo> {
    /// The sealed files in `dir` (which must exist), opened without `O_DIRECT`.
    pub fn open_dir(dir: &Path, keys: &RepoKeys) -> io::Result<Self> {
        Ok(Self::new(DirIo::open(dir, false)?, keys))
    }
}

impl<I: IndexIo> SealedIo<I> {
    /// Seals the files of `inner`, which must take reads and writes at any offset (a
    /// [`DirIo`] without `O_DIRECT`, a [`super::MemIo`]).
    pub fn new(inner: I, keys: &RepoKeys) -> Self {
        Self {
            inner,
            keys: keys.write_only(),
            build: None,
            current: [false; 4],
        }
    }

    /// The files below, as stored: for tests that damage them.
    pub fn inner_mut(&mut self) -> &mut I {
        &mut self.inner
    }

    /// Seals the `held` record of the current build (docs/design/crypto.md, "`held`
    /// and the last backup's counters").
    pub fn seal_held(&mut self, held: &[u8]) -> Result<Vec<u8>> {
        Ok(self.sealer_or_error()?.seal_held(held))
    }

    /// Opens a `held` record; one that does not open, or is another build's, is a
    /// corrupt file named `held`.
    pub fn open_held(&mut self, sealed: &[u8]) -> Result<Vec<u8>> {
        self.sealer_or_error()?
            .open_held(sealed)
            .map_err(|e| IndexError::Corrupt {
                file: "held",
                offset: 0,
                reason: e.to_string(),
            })
    }

    fn sealer_or_error(&mut self) -> Result<&PageSealer> {
        if let Err(e) = self.load_build() {
            return Err(super::store::io_error(self, IndexFile::Table, e));
        }
        Ok(self.sealer())
    }

    /// The current build; [`Self::load_build`] has succeeded.
    fn sealer(&self) -> &PageSealer {
        self.build.as_ref().expect("the build is loaded first")
    }

    /// Reads the current build from `table`'s header, unless it is known.
    fn load_build(&mut self) -> io::Result<()> {
        if self.build.is_some() {
            return Ok(());
        }
        let mut header = [0u8; INDEX_HEADER_LEN];
        self.read_header(IndexFile::Table, &mut header)?;
        let sealer = self.keys.open_index_build(&header).map_err(|e| {
            Unopenable::io(
                IndexFile::Table,
                0,
                format!("its sealed header does not open: {e}"),
            )
        })?;
        self.build = Some(sealer);
        self.current = [false; 4];
        self.current[IndexFile::Table as usize] = true;
        Ok(())
    }

    fn read_header(
        &mut self,
        file: IndexFile,
        header: &mut [u8; INDEX_HEADER_LEN],
    ) -> io::Result<()> {
        self.inner
            .read_at(file, 0, header)
            .map_err(|e| match e.kind() {
                io::ErrorKind::UnexpectedEof => {
                    Unopenable::io(file, 0, "shorter than its sealed header")
                }
                _ => e,
            })
    }

    /// Makes sure `file` is the current build's before its pages are used: a file
    /// read must start with the build's header (else it is another build's); a file
    /// written gets it (what it held is then replaced page by page, and a page of
    /// another build never opens).
    fn ensure_current(&mut self, file: IndexFile, writing: bool) -> io::Result<()> {
        self.load_build()?;
        if self.current[file as usize] {
            return Ok(());
        }
        let expected = *self.sealer().header();
        let mut header = [0u8; INDEX_HEADER_LEN];
        match self.read_header(file, &mut header) {
            Ok(()) if header == expected => {}
            Ok(()) if !writing => {
                return Err(Unopenable::io(
                    file,
                    0,
                    "its header is not the table's: it belongs to another build of the index",
                ))
            }
            Err(e) if !writing || e.kind() != io::ErrorKind::InvalidData => return Err(e),
            _ => self.inner.write_at(file, 0, &expected)?,
        }
        self.current[file as usize] = true;
        Ok(())
    }
}

/// The first page and page count of a logical range, which must be whole pages.
fn pages(offset: u64, len: usize) -> io::Result<(u64, u64)> {
    if !offset.is_multiple_of(PAGE as u64) || !len.is_multiple_of(PAGE) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{len} bytes at {offset} are not whole pages"),
        ));
    }
    Ok((offset / PAGE as u64, (len / PAGE) as u64))
}

impl<I: IndexIo> IndexIo for SealedIo<I> {
    fn read_at(&mut self, file: IndexFile, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let (first, count) = pages(offset, buf.len())?;
        self.ensure_current(file, false)?;
        let mut sealed = vec![0u8; (count * SEALED) as usize];
        self.inner.read_at(file, physical(first), &mut sealed)?;
        let sealer = self.sealer();
        let pieces = sealed
            .chunks_exact(SEALED_PAGE_LEN)
            .zip(buf.chunks_exact_mut(PAGE));
        for (i, (sealed, out)) in pieces.enumerate() {
            let page = first + i as u64;
            // A hole of the sparse table (a primary page never written) reads as the
            // zero page it stands for (docs/design/crypto.md, "Zero pages").
            if file == IndexFile::Table && page > 0 && sealed.iter().all(|&b| b == 0) {
                out.fill(0);
                continue;
            }
            sealer
                .open_page(part(file), page, sealed, out)
                .map_err(|e| {
                    Unopenable::io(
                        file,
                        physical(page),
                        format!("sealed page {page} does not open: {e}"),
                    )
                })?;
        }
        Ok(())
    }

    fn write_at(&mut self, file: IndexFile, offset: u64, buf: &[u8]) -> io::Result<()> {
        let (first, count) = pages(offset, buf.len())?;
        self.ensure_current(file, true)?;
        let mut sealed = vec![0u8; (count * SEALED) as usize];
        self.sealer()
            .seal_pages(part(file), first, buf, &mut sealed);
        self.inner.write_at(file, physical(first), &sealed)
    }

    /// The logical length: whole sealed pages after the header.
    fn len(&mut self, file: IndexFile) -> io::Result<Option<u64>> {
        Ok(self.inner.len(file)?.map(|len| {
            len.checked_sub(HEADER)
                .map_or(0, |body| body / SEALED * PAGE as u64)
        }))
    }

    /// Creating `table` starts a new build (a new build id, so that no page of an
    /// earlier build opens); the other files take the current build's header.
    fn create(&mut self, file: IndexFile) -> io::Result<()> {
        let header = if file == IndexFile::Table {
            let sealer = self.keys.new_index_build();
            let header = *sealer.header();
            self.build = Some(sealer);
            self.current = [false; 4];
            header
        } else {
            self.load_build()?;
            *self.sealer().header()
        };
        self.inner.create(file)?;
        self.inner.write_at(file, 0, &header)?;
        self.current[file as usize] = true;
        Ok(())
    }

    fn sync(&mut self, file: IndexFile) -> io::Result<()> {
        self.inner.sync(file)
    }

    fn path(&self, file: IndexFile) -> PathBuf {
        self.inner.path(file)
    }
}

/// A repository's disk index files in a directory: plain in a plaintext repository
/// (byte for byte the layout of docs/design/disk-index.md), sealed in an encrypted one.
pub enum IndexDir {
    Plain(DirIo),
    /// Boxed: the keys and the build's sealer are most of a kilobyte.
    Sealed(Box<SealedIo<DirIo>>),
}

impl IndexDir {
    /// The files in `dir`: sealed with `keys` when there are keys.
    pub fn open(dir: &Path, keys: Option<&RepoKeys>) -> io::Result<Self> {
        Ok(match keys {
            None => Self::Plain(DirIo::open(dir, false)?),
            Some(keys) => Self::Sealed(Box::new(SealedIo::open_dir(dir, keys)?)),
        })
    }
}

impl IndexIo for IndexDir {
    fn read_at(&mut self, file: IndexFile, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        match self {
            Self::Plain(io) => io.read_at(file, offset, buf),
            Self::Sealed(io) => io.read_at(file, offset, buf),
        }
    }

    fn write_at(&mut self, file: IndexFile, offset: u64, buf: &[u8]) -> io::Result<()> {
        match self {
            Self::Plain(io) => io.write_at(file, offset, buf),
            Self::Sealed(io) => io.write_at(file, offset, buf),
        }
    }

    fn len(&mut self, file: IndexFile) -> io::Result<Option<u64>> {
        match self {
            Self::Plain(io) => io.len(file),
            Self::Sealed(io) => io.len(file),
        }
    }

    fn create(&mut self, file: IndexFile) -> io::Result<()> {
        match self {
            Self::Plain(io) => io.create(file),
            Self::Sealed(io) => io.create(file),
        }
    }

    fn sync(&mut self, file: IndexFile) -> io::Result<()> {
        match self {
            Self::Plain(io) => io.sync(file),
            Self::Sealed(io) => io.sync(file),
        }
    }

    fn path(&self, file: IndexFile) -> PathBuf {
        match self {
            Self::Plain(io) => io.path(file),
            Self::Sealed(io) => io.path(file),
        }
    }
}
