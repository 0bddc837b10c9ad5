//! The narrow I/O layer under the disk index: positional reads and writes of three
//! named files, in whole pages (docs/design/disk-index.md). `DirIo` keeps them in a
//! directory, optionally opened with `O_DIRECT`; `MemIo` keeps them in memory and can
//! be told to fail, for tests.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The page size of every file and the alignment of every offset, length and (for
/// `O_DIRECT`) buffer.
pub const PAGE: usize = 4096;

/// The files of a disk index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IndexFile {
    Table,
    Meta,
    Bloom,
    /// Runs spilled from the insert buffer: scratch, valid only while the table is
    /// dirty, so never synced (docs/design/disk-index.md, "`runs`").
    Runs,
}

impl IndexFile {
    /// The durable files, which `create` makes and `sync` syncs.
    pub const ALL: [IndexFile; 3] = [IndexFile::Table, IndexFile::Meta, IndexFile::Bloom];

    pub fn name(self) -> &'static str {
        match self {
            IndexFile::Table => "table",
            IndexFile::Meta => "meta",
            IndexFile::Bloom => "bloom",
            IndexFile::Runs => "runs",
        }
    }

    fn number(self) -> usize {
        self as usize
    }
}

/// Positional I/O on the index's files. Offsets and lengths are multiples of [`PAGE`]
/// and buffers come from [`PageBuf`], so an implementation may bypass the page cache.
pub trait IndexIo {
    /// Fills `buf` from `offset`; reading past the end of the file is an
    /// `UnexpectedEof` error.
    fn read_at(&mut self, file: IndexFile, offset: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Writes all of `buf` at `offset`, extending the file if needed.
    fn write_at(&mut self, file: IndexFile, offset: u64, buf: &[u8]) -> io::Result<()>;
    /// The file's length, or `None` if it does not exist.
    fn len(&mut self, file: IndexFile) -> io::Result<Option<u64>>;
    /// Creates the file empty, replacing any old one.
    fn create(&mut self, file: IndexFile) -> io::Result<()>;
    /// Makes every write to the file so far durable.
    fn sync(&mut self, file: IndexFile) -> io::Result<()>;
    /// A name for the file in error messages.
    fn path(&self, file: IndexFile) -> PathBuf;
}

/// A byte buffer whose start is aligned to [`PAGE`], as `O_DIRECT` requires.
pub struct PageBuf {
    storage: Vec<u8>,
    start: usize,
    len: usize,
}

impl PageBuf {
    /// `len` zero bytes.
    pub fn zeroed(len: usize) -> Self {
        let storage = vec![0u8; len + PAGE];
        let start = (PAGE - storage.as_ptr() as usize % PAGE) % PAGE;
        Self {
            storage,
            start,
            len,
        }
    }
}

impl std::ops::Deref for PageBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.storage[self.start..self.start + self.len]
    }
}

impl std::ops::DerefMut for PageBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.start + self.len]
    }
}

/// The files in a directory: `DIR/table`, `DIR/meta`, `DIR/bloom`, `DIR/runs`.
pub struct DirIo {
    dir: PathBuf,
    direct: bool,
    files: [Option<File>; 4],
}

impl DirIo {
    /// Files in `dir` (which must exist). With `direct`, they are opened with
    /// `O_DIRECT` so that every read reaches the disk (on Linux; elsewhere the flag is
    /// not available and `direct` is refused with `Unsupported`).
    pub fn open(dir: &Path, direct: bool) -> io::Result<Self> {
        if direct && !cfg!(target_os = "linux") {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "O_DIRECT is only used on Linux",
            ));
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            direct,
            files: [None, None, None, None],
        })
    }

    fn options(&self) -> OpenOptions {
        let mut options = OpenOptions::new();
        options.read(true).write(true);
        #[cfg(target_os = "linux")]
        if self.direct {
            options.custom_flags(libc::O_DIRECT);
        }
        options
    }

    fn file(&mut self, file: IndexFile) -> io::Result<&File> {
        let slot = file.number();
        if self.files[slot].is_none() {
            let opened = self.options().open(self.path(file))?;
            self.files[slot] = Some(opened);
        }
        Ok(self.files[slot].as_ref().expect("opened above"))
    }
}

impl IndexIo for DirIo {
    fn read_at(&mut self, file: IndexFile, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.file(file)?.read_exact_at(buf, offset)
    }

    fn write_at(&mut self, file: IndexFile, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.file(file)?.write_all_at(buf, offset)
    }

    fn len(&mut self, file: IndexFile) -> io::Result<Option<u64>> {
        match self.file(file) {
            Ok(f) => Ok(Some(f.metadata()?.len())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn create(&mut self, file: IndexFile) -> io::Result<()> {
        // Private to its owner whatever the umask, as every repository file is.
        let created = self
            .options()
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(self.path(file))?;
        self.files[file.number()] = Some(created);
        Ok(())
    }

    fn sync(&mut self, file: IndexFile) -> io::Result<()> {
        self.file(file)?.sync_data()
    }

    fn path(&self, file: IndexFile) -> PathBuf {
        self.dir.join(file.name())
    }
}

/// The files in memory. Reads and writes can be made to fail, to test that errors lose
/// nothing.
#[derive(Default, Clone)]
pub struct MemIo {
    files: [Option<Vec<u8>>; 4],
    /// Reads that succeed before every later one fails; `None`: none fails.
    reads_before_failure: Option<u64>,
    /// The same for writes.
    writes_before_failure: Option<u64>,
}

impl MemIo {
    pub fn new() -> Self {
        Self::default()
    }

    /// After `reads` more successful reads, every read fails until
    /// [`MemIo::heal`].
    pub fn fail_reads_after(&mut self, reads: u64) {
        self.reads_before_failure = Some(reads);
    }

    /// After `writes` more successful writes, every write fails until
    /// [`MemIo::heal`].
    pub fn fail_writes_after(&mut self, writes: u64) {
        self.writes_before_failure = Some(writes);
    }

    pub fn heal(&mut self) {
        self.reads_before_failure = None;
        self.writes_before_failure = None;
    }

    /// The bytes of a file, for tests that damage them.
    pub fn file_mut(&mut self, file: IndexFile) -> Option<&mut Vec<u8>> {
        self.files[file.number()].as_mut()
    }
}

impl IndexIo for MemIo {
    fn read_at(&mut self, file: IndexFile, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        if let Some(left) = self.reads_before_failure.as_mut() {
            if *left == 0 {
                return Err(io::Error::other("injected read failure"));
            }
            *left -= 1;
        }
        let data = self.files[file.number()]
            .as_ref()
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
        let start = usize::try_from(offset).map_err(io::Error::other)?;
        let end = start.checked_add(buf.len()).filter(|&e| e <= data.len());
        let end = end.ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
        buf.copy_from_slice(&data[start..end]);
        Ok(())
    }

    fn write_at(&mut self, file: IndexFile, offset: u64, buf: &[u8]) -> io::Result<()> {
        if let Some(left) = self.writes_before_failure.as_mut() {
            if *left == 0 {
                return Err(io::Error::other("injected write failure"));
            }
            *left -= 1;
        }
        let data = self.files[file.number()]
            .as_mut()
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
        let start = usize::try_from(offset).map_err(io::Error::other)?;
        if data.len() < start + buf.len() {
            data.resize(start + buf.len(), 0);
        }
        data[start..start + buf.len()].copy_from_slice(buf);
        Ok(())
    }

    fn len(&mut self, file: IndexFile) -> io::Result<Option<u64>> {
        Ok(self.files[file.number()].as_ref().map(|d| d.len() as u64))
    }

    fn create(&mut self, file: IndexFile) -> io::Result<()> {
        self.files[file.number()] = Some(Vec::new());
        Ok(())
    }

    fn sync(&mut self, _file: IndexFile) -> io::Result<()> {
        Ok(())
    }

    fn path(&self, file: IndexFile) -> PathBuf {
        PathBuf::from(format!("<memory>/{}", file.name()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(io: &mut dyn IndexIo) {
        assert_eq!(io.len(IndexFile::Meta).unwrap(), None);
        io.create(IndexFile::Meta).unwrap();
        let mut page = PageBuf::zeroed(2 * PAGE);
        page[5] = 7;
        page[PAGE + 9] = 3;
        io.write_at(IndexFile::Meta, PAGE as u64, &page).unwrap();
        io.sync(IndexFile::Meta).unwrap();
        assert_eq!(io.len(IndexFile::Meta).unwrap(), Some(3 * PAGE as u64));
        let mut back = PageBuf::zeroed(PAGE);
        io.read_at(IndexFile::Meta, 2 * PAGE as u64, &mut back)
            .unwrap();
        assert_eq!(back[9], 3);
        let err = io
            .read_at(IndexFile::Meta, 3 * PAGE as u64, &mut back)
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn page_buffers_are_aligned() {
        for len in [0, 1, PAGE, 3 * PAGE] {
            let b = PageBuf::zeroed(len);
            assert_eq!(b.as_ptr() as usize % PAGE, 0);
            assert_eq!(b.len(), len);
        }
    }

    #[test]
    fn memory_and_directory_io_read_back_what_they_wrote() {
        round_trip(&mut MemIo::new());
        let dir = std::env::temp_dir().join(format!("larder-index-io-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        round_trip(&mut DirIo::open(&dir, false).unwrap());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn injected_failures_fail_reads_until_healed() {
        let mut io = MemIo::new();
        io.create(IndexFile::Table).unwrap();
        io.write_at(IndexFile::Table, 0, &PageBuf::zeroed(PAGE))
            .unwrap();
        io.fail_reads_after(1);
        let mut b = PageBuf::zeroed(PAGE);
        io.read_at(IndexFile::Table, 0, &mut b).unwrap();
        assert!(io.read_at(IndexFile::Table, 0, &mut b).is_err());
        io.heal();
        io.read_at(IndexFile::Table, 0, &mut b).unwrap();
    }
}
