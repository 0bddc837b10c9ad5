//! The tree stream: a snapshot's directory tree with every file's recipe and metadata
//! (docs/design/format.md, "Tree stream"). Version 3 is written; versions 1 to 3 are
//! read.

use larder_hash::Fingerprint;

use crate::container::{le_u32, le_u64};
use crate::error::{Result, StoreError};

const MAGIC_V1: &[u8; 8] = b"LARDERT1";
const MAGIC_V2: &[u8; 8] = b"LARDERT2";
const MAGIC_V3: &[u8; 8] = b"LARDERT3";
const NANOS: u32 = 1_000_000_000;

/// The file attribute flags (`chattr`; Linux's `FS_IOC_GETFLAGS`) an entry records,
/// with the letter `lsattr` shows for each, in `lsattr`'s order: those a user sets for
/// how a file behaves. Flags that describe how a file system stores the file
/// (extents, inline data, encryption, ...) are not recorded: a restore could not set
/// them, and they would differ between file systems.
pub const ATTR_FLAGS: [(u32, char); 7] = [
    (0x0000_0008, 'S'), // FS_SYNC_FL: synchronous updates
    (0x0001_0000, 'D'), // FS_DIRSYNC_FL: synchronous directory updates
    (0x0000_0010, 'i'), // FS_IMMUTABLE_FL
    (0x0000_0020, 'a'), // FS_APPEND_FL: append only
    (0x0000_0040, 'd'), // FS_NODUMP_FL: no dump
    (0x0000_0080, 'A'), // FS_NOATIME_FL: no atime updates
    (0x0000_0004, 'c'), // FS_COMPR_FL: compressed (where the file system compresses)
];

/// The bits of [`ATTR_FLAGS`]: every other bit of `attr_flags` is zero.
pub const ATTR_FLAGS_KEPT: u32 = {
    let mut mask = 0;
    let mut i = 0;
    while i < ATTR_FLAGS.len() {
        mask |= ATTR_FLAGS[i].0;
        i += 1;
    }
    mask
};

/// `flags` as `chattr` writes them, `+ia` for immutable and append-only; empty for
/// none. Bits outside [`ATTR_FLAGS`] are ignored.
pub fn attr_flag_letters(flags: u32) -> String {
    let letters: String = ATTR_FLAGS
        .iter()
        .filter(|(bit, _)| flags & bit != 0)
        .map(|&(_, letter)| letter)
        .collect();
    if letters.is_empty() {
        letters
    } else {
        format!("+{letters}")
    }
}

/// Bit 0 of an entry's marks byte (version 3): the file changed while it was read.
const MARK_CHANGED: u8 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EntryKind {
    File,
    Dir,
    Symlink,
    Fifo,
    CharDevice,
    BlockDevice,
}

impl EntryKind {
    fn code(self) -> u8 {
        match self {
            Self::File => 1,
            Self::Dir => 2,
            Self::Symlink => 3,
            Self::Fifo => 4,
            Self::CharDevice => 5,
            Self::BlockDevice => 6,
        }
    }

    /// The kind of `code` in a stream of `version`; version 1 knew the first three.
    fn from_code(code: u8, version: u8) -> Option<Self> {
        Some(match (code, version) {
            (1, _) => Self::File,
            (2, _) => Self::Dir,
            (3, _) => Self::Symlink,
            (4, 2..) => Self::Fifo,
            (5, 2..) => Self::CharDevice,
            (6, 2..) => Self::BlockDevice,
            _ => return None,
        })
    }

    /// Whether the entry records a device number (`rdev`).
    pub fn is_device(self) -> bool {
        matches!(self, Self::CharDevice | Self::BlockDevice)
    }
}

/// One extended attribute: its full name (with namespace) and value.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Xattr {
    pub name: Vec<u8>,
    pub value: Vec<u8>,
}

/// One entry of a snapshot: a file, directory, symlink, FIFO or device node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeEntry {
    pub kind: EntryKind,
    /// Relative path, components joined by `/`, raw bytes.
    pub path: Vec<u8>,
    pub mode: u32,
    pub mtime_sec: i64,
    pub mtime_nsec: u32,
    pub ctime_sec: i64,
    pub ctime_nsec: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub inode: u64,
    pub device: u64,
    pub nlink: u32,
    /// The owner's user and group names; empty when unknown.
    pub user: Vec<u8>,
    pub group: Vec<u8>,
    /// Extended attributes, names strictly ascending.
    pub xattrs: Vec<Xattr>,
    /// The file's recipe (files only).
    pub chunks: Vec<Fingerprint>,
    /// The link target (symlinks only).
    pub target: Vec<u8>,
    /// The device number (device nodes only).
    pub rdev: u64,
    /// File attribute flags (`chattr`), only those of [`ATTR_FLAGS`]; files and
    /// directories only, 0 where the file system has none.
    pub attr_flags: u32,
    /// The file changed while the backup read it: its content is what was read, which
    /// may mix the states before and after the change (files only).
    pub changed_while_read: bool,
}

impl TreeEntry {
    /// An entry of `kind` at `path` with every other field zero or empty.
    pub fn new(kind: EntryKind, path: Vec<u8>) -> Self {
        Self {
            kind,
            path,
            mode: 0,
            mtime_sec: 0,
            mtime_nsec: 0,
            ctime_sec: 0,
            ctime_nsec: 0,
            uid: 0,
            gid: 0,
            size: 0,
            inode: 0,
            device: 0,
            nlink: 0,
            user: Vec::new(),
            group: Vec::new(),
            xattrs: Vec::new(),
            chunks: Vec::new(),
            target: Vec::new(),
            rdev: 0,
            attr_flags: 0,
            changed_while_read: false,
        }
    }

    /// Appends the entry in the version 3 layout. Owner names longer than 255 bytes
    /// are written empty, and attributes whose names are empty or longer than 255
    /// bytes are left out (Linux has none); attribute names must be strictly
    /// ascending (the walk sorts them).
    pub fn encode(&self, out: &mut Vec<u8>) {
        let read = FileAsRead {
            size: self.size,
            chunks: &self.chunks,
            attr_flags: self.attr_flags,
            changed_while_read: self.changed_while_read,
        };
        self.encode_as(&read, out);
    }

    /// Appends the entry as [`TreeEntry::encode`] does, with the fields of `read` in
    /// place of its own (a file as a backup read it, without copying the entry).
    /// Attribute flags outside [`ATTR_FLAGS`] are left out.
    pub fn encode_as(&self, read: &FileAsRead<'_>, out: &mut Vec<u8>) {
        out.push(self.kind.code());
        put_bytes32(out, &self.path);
        out.extend_from_slice(&self.mode.to_le_bytes());
        out.extend_from_slice(&self.mtime_sec.to_le_bytes());
        out.extend_from_slice(&self.mtime_nsec.to_le_bytes());
        out.extend_from_slice(&self.ctime_sec.to_le_bytes());
        out.extend_from_slice(&self.ctime_nsec.to_le_bytes());
        out.extend_from_slice(&self.uid.to_le_bytes());
        out.extend_from_slice(&self.gid.to_le_bytes());
        out.extend_from_slice(&read.size.to_le_bytes());
        out.extend_from_slice(&self.inode.to_le_bytes());
        out.extend_from_slice(&self.device.to_le_bytes());
        out.extend_from_slice(&self.nlink.to_le_bytes());
        put_name(out, &self.user);
        put_name(out, &self.group);
        let xattrs = || {
            self.xattrs
                .iter()
                .filter(|x| (1..=255).contains(&x.name.len()))
        };
        out.extend_from_slice(&(xattrs().count() as u32).to_le_bytes());
        for x in xattrs() {
            out.push(x.name.len() as u8);
            out.extend_from_slice(&x.name);
            put_bytes32(out, &x.value);
        }
        out.push(if read.changed_while_read {
            MARK_CHANGED
        } else {
            0
        });
        out.extend_from_slice(&(read.attr_flags & ATTR_FLAGS_KEPT).to_le_bytes());
        self.encode_tail(read.chunks, out);
    }

    /// The kind's own fields, laid out alike in every version (devices: from 2 on).
    fn encode_tail(&self, chunks: &[Fingerprint], out: &mut Vec<u8>) {
        match self.kind {
            EntryKind::File => {
                out.extend_from_slice(&(chunks.len() as u64).to_le_bytes());
                for fp in chunks {
                    out.extend_from_slice(fp.as_bytes());
                }
            }
            EntryKind::Symlink => put_bytes32(out, &self.target),
            EntryKind::CharDevice | EntryKind::BlockDevice => {
                out.extend_from_slice(&self.rdev.to_le_bytes())
            }
            EntryKind::Dir | EntryKind::Fifo => {}
        }
    }
}

/// The fields of a file entry a backup learns by reading the file, which
/// [`TreeEntry::encode_as`] writes in place of the entry's own.
pub struct FileAsRead<'a> {
    pub size: u64,
    pub chunks: &'a [Fingerprint],
    pub attr_flags: u32,
    pub changed_while_read: bool,
}

fn put_bytes32(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(bytes);
}

/// A user or group name: up to 255 bytes, else nothing.
fn put_name(out: &mut Vec<u8>, name: &[u8]) {
    let name = if name.len() <= 255 { name } else { &[] };
    out.push(name.len() as u8);
    out.extend_from_slice(name);
}

/// The bytes every tree stream this larder writes starts with.
pub fn encode_tree_header(out: &mut Vec<u8>) {
    out.extend_from_slice(MAGIC_V3);
}

/// The whole tree stream of `entries`, in the order given: the header, each entry,
/// and the end byte (docs/design/format.md).
pub fn encode_tree(entries: &[TreeEntry]) -> Vec<u8> {
    let mut out = Vec::new();
    encode_tree_header(&mut out);
    for e in entries {
        e.encode(&mut out);
    }
    out.push(0);
    out
}

/// True if `path` is a non-empty relative path of normal components: no empty
/// component, no `.` or `..`, no leading `/`, no NUL. Restore relies on this to keep
/// every entry inside its target.
pub fn is_safe_relative_path(path: &[u8]) -> bool {
    !path.is_empty()
        && !path.contains(&0)
        && path
            .split(|&b| b == b'/')
            .all(|c| !c.is_empty() && c != b"." && c != b"..")
}

/// Reads entries back from a whole tree stream of version 1, 2 or 3. Yields an error
/// (and then nothing) on malformed input or an unsafe path; never panics.
pub struct TreeDecoder<'a> {
    data: &'a [u8],
    pos: usize,
    version: u8,
    done: bool,
}

fn damaged(reason: impl Into<String>) -> StoreError {
    StoreError::corrupt("tree", "", reason)
}

impl<'a> TreeDecoder<'a> {
    pub fn new(data: &'a [u8]) -> Result<Self> {
        let version = match data.get(..8) {
            Some(m) if m == MAGIC_V3 => 3,
            Some(m) if m == MAGIC_V2 => 2,
            Some(m) if m == MAGIC_V1 => 1,
            _ => return Err(damaged("bad magic")),
        };
        Ok(Self {
            data,
            pos: 8,
            version,
            done: false,
        })
    }

    /// The stream's format version, 1 to 3.
    pub fn version(&self) -> u8 {
        self.version
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.data.len());
        let end = end.ok_or_else(|| damaged(format!("truncated at byte {}", self.pos)))?;
        let s = &self.data[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32> {
        Ok(le_u32(self.take(4)?))
    }

    fn u64(&mut self) -> Result<u64> {
        Ok(le_u64(self.take(8)?))
    }

    fn bytes32(&mut self) -> Result<Vec<u8>> {
        let len = self.u32()? as usize;
        Ok(self.take(len)?.to_vec())
    }

    fn bytes8(&mut self) -> Result<Vec<u8>> {
        let len = usize::from(self.u8()?);
        Ok(self.take(len)?.to_vec())
    }

    fn nanos(&mut self) -> Result<u32> {
        let n = self.u32()?;
        // Version 1 wrote nanoseconds unchecked; restore clamps them.
        if n >= NANOS && self.version >= 2 {
            return Err(damaged(format!("nanoseconds {n} out of range")));
        }
        Ok(n)
    }

    fn entry(&mut self, code: u8) -> Result<TreeEntry> {
        let kind = EntryKind::from_code(code, self.version)
            .ok_or_else(|| damaged(format!("unknown entry kind {code}")))?;
        let path = self.bytes32()?;
        if !is_safe_relative_path(&path) {
            return Err(damaged(format!(
                "unsafe path \"{}\"",
                crate::names::escape_name(&path)
            )));
        }
        let mut e = TreeEntry::new(kind, path);
        e.mode = self.u32()?;
        e.mtime_sec = self.u64()? as i64;
        e.mtime_nsec = self.nanos()?;
        if self.version >= 2 {
            e.ctime_sec = self.u64()? as i64;
            e.ctime_nsec = self.nanos()?;
        }
        e.uid = self.u32()?;
        e.gid = self.u32()?;
        e.size = self.u64()?;
        if self.version >= 2 {
            e.inode = self.u64()?;
            e.device = self.u64()?;
            e.nlink = self.u32()?;
            e.user = self.bytes8()?;
            e.group = self.bytes8()?;
            e.xattrs = self.xattrs()?;
        }
        if self.version >= 3 {
            let marks = self.u8()?;
            if marks & !MARK_CHANGED != 0 {
                return Err(damaged(format!("unknown entry marks {marks:#04x}")));
            }
            e.changed_while_read = marks & MARK_CHANGED != 0;
            e.attr_flags = self.u32()?;
            if e.attr_flags & !ATTR_FLAGS_KEPT != 0 {
                return Err(damaged(format!(
                    "unknown attribute flags {:#010x}",
                    e.attr_flags
                )));
            }
        }
        self.tail(&mut e)?;
        Ok(e)
    }

    fn xattrs(&mut self) -> Result<Vec<Xattr>> {
        let count = self.u32()?;
        // Each attribute takes at least 6 bytes, so a count the rest cannot hold is
        // refused before anything is allocated for it.
        if count as usize > (self.data.len() - self.pos) / 6 {
            return Err(damaged(format!("{count} extended attributes overflow")));
        }
        let mut xattrs: Vec<Xattr> = Vec::with_capacity(count as usize);
        for _ in 0..count {
            let name = self.bytes8()?;
            if name.is_empty() {
                return Err(damaged("empty extended attribute name"));
            }
            if xattrs.last().is_some_and(|last| last.name >= name) {
                return Err(damaged("extended attribute names out of order"));
            }
            let value = self.bytes32()?;
            xattrs.push(Xattr { name, value });
        }
        Ok(xattrs)
    }

    fn tail(&mut self, e: &mut TreeEntry) -> Result<()> {
        match e.kind {
            EntryKind::File => {
                let count = self.u64()?;
                let bytes = usize::try_from(count)
                    .ok()
                    .and_then(|c| c.checked_mul(Fingerprint::LEN))
                    .ok_or_else(|| damaged("chunk count overflows"))?;
                e.chunks = self
                    .take(bytes)?
                    .chunks_exact(Fingerprint::LEN)
                    .map(|c| {
                        let mut fp = [0u8; 32];
                        fp.copy_from_slice(c);
                        Fingerprint(fp)
                    })
                    .collect();
            }
            EntryKind::Symlink => e.target = self.bytes32()?,
            EntryKind::CharDevice | EntryKind::BlockDevice => e.rdev = self.u64()?,
            EntryKind::Dir | EntryKind::Fifo => {}
        }
        Ok(())
    }
}

impl Iterator for TreeDecoder<'_> {
    type Item = Result<TreeEntry>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let result = match self.take(1) {
            Ok([0]) => {
                self.done = true;
                return (self.pos != self.data.len())
                    .then(|| Err(damaged("bytes after the end marker")));
            }
            Ok(code) => self.entry(code[0]),
            Err(e) => Err(e),
        };
        if result.is_err() {
            self.done = true;
        }
        Some(result)
    }
}

#[cfg(test)]
mod tests;
