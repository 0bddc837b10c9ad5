//! The FUSE file system: fuser's callbacks over the fixed namespace, the snapshot
//! trees (each read when first entered) and the chunk cache.
//!
//! Read-only: every call that would change something is answered `EROFS`, and so is
//! an open for writing (the mount is read-only too, so the kernel refuses most of
//! them before they come). Content never changes while mounted, so the kernel may
//! cache attributes, names and file pages for as long as it likes ([`TTL`],
//! `FOPEN_KEEP_CACHE`).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    AccessFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, LockOwner, OpenAccMode, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyWrite, ReplyXattr, Request, TimeOrNow,
    WriteFlags,
};
use larder_engine::{load_tree, parse_utc_rfc3339, ChunkCache, ChunkReader, FileLayout};
use larder_store::{error_chain, EntryKind, IdentifiedSnapshot, Repository, TreeEntry, Xattr};

use super::namespace::{Namespace, Node};
use super::tree::{Inodes, MountedTree};

/// How long the kernel may keep attributes and names: nothing changes while mounted.
const TTL: Duration = Duration::from_secs(24 * 3600);

/// A read-only file system of a repository's snapshots. Holds the repository, and
/// with it its shared lock, until it is dropped at unmount.
pub struct SnapshotFs {
    repo: Arc<Repository>,
    snapshots: Vec<IdentifiedSnapshot>,
    namespace: Namespace,
    trees: Mutex<Trees>,
    cache: Arc<ChunkCache>,
    /// Layouts of open files, by file handle.
    open: Mutex<HashMap<u64, Arc<FileLayout>>>,
    next_handle: AtomicU64,
    /// Owner and time of the fixed nodes: the mounting user, and the mount's start.
    owner: (u32, u32),
    mounted_at: SystemTime,
}

/// The trees loaded so far, by snapshot.
struct Trees {
    loaded: Vec<Option<Loaded>>,
    inodes: Inodes,
}

/// A loaded tree, the first inode of its block, and its snapshot.
#[derive(Clone)]
struct Loaded {
    tree: Arc<MountedTree>,
    first: u64,
    snapshot: usize,
}

/// What an inode names.
enum Target<'a> {
    Fixed(&'a Node),
    /// Entry `i` of a loaded tree.
    Entry(Loaded, u32),
}

/// A directory's children, read by index (`readdir` resumes at an offset): a fixed
/// directory's, or those of a tree's root (`None`) or entry.
enum Children<'a> {
    Fixed(&'a [(Vec<u8>, u64)]),
    Tree(Loaded, Option<u32>),
}

impl SnapshotFs {
    /// `snapshots` as `Repository::snapshots` lists them; `cache_bytes` bounds the
    /// decoded chunks held.
    pub fn new(repo: Repository, snapshots: Vec<IdentifiedSnapshot>, cache_bytes: usize) -> Self {
        let namespace = Namespace::new(&snapshots);
        let trees = Trees {
            loaded: vec![None; snapshots.len()],
            inodes: Inodes::new(namespace.last_inode()),
        };
        let repo = Arc::new(repo);
        // SAFETY: getuid and getgid have no preconditions and cannot fail.
        let owner = unsafe { (libc::getuid(), libc::getgid()) };
        Self {
            cache: Arc::new(ChunkCache::new(repo.clone(), cache_bytes)),
            repo,
            snapshots,
            namespace,
            trees: Mutex::new(trees),
            open: Mutex::new(HashMap::new()),
            next_handle: AtomicU64::new(1),
            owner,
            mounted_at: SystemTime::now(),
        }
    }

    /// Snapshot `n`'s tree, read and verified on first use.
    fn tree(&self, n: usize) -> Result<Loaded, Errno> {
        if let Some(loaded) = &lock(&self.trees).loaded[n] {
            return Ok(loaded.clone());
        }
        let (id, snapshot) = &self.snapshots[n];
        let entries = snapshot
            .tree
            .fingerprints()
            .map_err(Into::into)
            .and_then(|fps| load_tree(&mut ChunkReader::new(&self.repo), &fps))
            .map_err(|e| {
                io_error(&format!(
                    "cannot read the tree of snapshot {id}: {}",
                    error_chain(&e)
                ))
            })?;
        let tree = Arc::new(MountedTree::new(entries));
        let mut trees = lock(&self.trees);
        let trees = &mut *trees;
        // Another thread may have loaded it meanwhile: the first one stays.
        let loaded = trees.loaded[n].get_or_insert_with(|| Loaded {
            first: trees.inodes.allocate(n, tree.entries.len()),
            tree,
            snapshot: n,
        });
        Ok(loaded.clone())
    }

    fn target(&self, ino: u64) -> Result<Target<'_>, Errno> {
        if let Some(node) = self.namespace.node(ino) {
            return Ok(Target::Fixed(node));
        }
        let trees = lock(&self.trees);
        let (n, i) = trees.inodes.find(ino).ok_or(Errno::ENOENT)?;
        let loaded = trees.loaded[n].clone().ok_or(Errno::ENOENT)?;
        Ok(Target::Entry(loaded, i))
    }

    fn attr(&self, ino: u64, target: &Target<'_>) -> FileAttr {
        match target {
            Target::Fixed(node) => self.fixed_attr(ino, node),
            Target::Entry(loaded, i) => entry_attr(ino, &loaded.tree.entries[*i as usize]),
        }
    }

    fn fixed_attr(&self, ino: u64, node: &Node) -> FileAttr {
        let (kind, size, time) = match node {
            Node::Dir(_) => (FileType::Directory, 0, self.mounted_at),
            Node::Link(target) => (FileType::Symlink, target.len() as u64, self.mounted_at),
            Node::Snapshot(n) => {
                let time = parse_utc_rfc3339(&self.snapshots[*n].1.time)
                    .map_or(self.mounted_at, |sec| time_of(sec, 0));
                (FileType::Directory, 0, time)
            }
        };
        let perm = if kind == FileType::Symlink {
            0o777
        } else {
            0o555
        };
        FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: 0,
            atime: time,
            mtime: time,
            ctime: time,
            crtime: time,
            kind,
            perm,
            nlink: 1,
            uid: self.owner.0,
            gid: self.owner.1,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }

    /// The children of directory `ino`.
    fn children(&self, ino: u64) -> Result<Children<'_>, Errno> {
        match self.target(ino)? {
            Target::Fixed(Node::Dir(children)) => Ok(Children::Fixed(children)),
            Target::Fixed(Node::Snapshot(n)) => Ok(Children::Tree(self.tree(*n)?, None)),
            Target::Entry(loaded, i) if loaded.tree.entries[i as usize].kind == EntryKind::Dir => {
                Ok(Children::Tree(loaded, Some(i)))
            }
            _ => Err(Errno::ENOTDIR),
        }
    }

    fn child(&self, parent: u64, name: &[u8]) -> Result<FileAttr, Errno> {
        match self.children(parent)? {
            Children::Fixed(_) => {
                let ino = self.namespace.lookup(parent, name).ok_or(Errno::ENOENT)?;
                Ok(self.attr(ino, &self.target(ino)?))
            }
            Children::Tree(loaded, dir) => {
                let i = loaded.tree.lookup(dir, name).ok_or(Errno::ENOENT)?;
                Ok(entry_attr(
                    loaded.first + u64::from(i),
                    &loaded.tree.entries[i as usize],
                ))
            }
        }
    }

    fn open_file(&self, ino: u64) -> Result<u64, Errno> {
        let Target::Entry(loaded, i) = self.target(ino)? else {
            return Err(Errno::EISDIR);
        };
        let entry = &loaded.tree.entries[i as usize];
        match entry.kind {
            EntryKind::File => {}
            EntryKind::Dir => return Err(Errno::EISDIR),
            _ => return Err(Errno::ENXIO),
        }
        let layout = self
            .cache
            .layout(entry, short_id(&self.snapshots[loaded.snapshot].0))
            .map_err(|e| io_error(&error_chain(&e)))?;
        let fh = self.next_handle.fetch_add(1, Ordering::Relaxed);
        lock(&self.open).insert(fh, Arc::new(layout));
        Ok(fh)
    }

    fn xattrs(&self, ino: u64) -> Result<Vec<Xattr>, Errno> {
        Ok(match self.target(ino)? {
            Target::Fixed(_) => Vec::new(),
            Target::Entry(loaded, i) => loaded.tree.entries[i as usize].xattrs.clone(),
        })
    }
}

impl Children<'_> {
    /// Child `i`: its inode, kind and name.
    fn get(&self, ns: &Namespace, i: usize) -> Option<(u64, FileType, &[u8])> {
        match self {
            Children::Fixed(list) => {
                let (name, ino) = list.get(i)?;
                let kind = match ns.node(*ino)? {
                    Node::Link(_) => FileType::Symlink,
                    Node::Dir(_) | Node::Snapshot(_) => FileType::Directory,
                };
                Some((*ino, kind, name))
            }
            Children::Tree(loaded, dir) => {
                let tree = &loaded.tree;
                let c = *tree.children(*dir).get(i)?;
                let kind = file_type(tree.entries[c as usize].kind);
                Some((loaded.first + u64::from(c), kind, tree.name(c)))
            }
        }
    }
}

fn entry_attr(ino: u64, e: &TreeEntry) -> FileAttr {
    let mtime = time_of(e.mtime_sec, e.mtime_nsec);
    let size = match e.kind {
        EntryKind::Symlink => e.target.len() as u64,
        _ => e.size,
    };
    FileAttr {
        ino: INodeNo(ino),
        size,
        blocks: size.div_ceil(512),
        atime: mtime,
        mtime,
        ctime: time_of(e.ctime_sec, e.ctime_nsec),
        crtime: mtime,
        kind: file_type(e.kind),
        perm: (e.mode & 0o7777) as u16,
        nlink: 1,
        uid: e.uid,
        gid: e.gid,
        rdev: e.rdev as u32,
        blksize: 4096,
        flags: 0,
    }
}

fn file_type(kind: EntryKind) -> FileType {
    match kind {
        EntryKind::File => FileType::RegularFile,
        EntryKind::Dir => FileType::Directory,
        EntryKind::Symlink => FileType::Symlink,
        EntryKind::Fifo => FileType::NamedPipe,
        EntryKind::CharDevice => FileType::CharDevice,
        EntryKind::BlockDevice => FileType::BlockDevice,
    }
}

/// `sec` seconds and `nsec` nanoseconds from the Unix epoch (before it if negative).
fn time_of(sec: i64, nsec: u32) -> SystemTime {
    let nanos = Duration::from_nanos(u64::from(nsec.min(999_999_999)));
    let at = Duration::from_secs(sec.unsigned_abs());
    let whole = if sec >= 0 {
        UNIX_EPOCH.checked_add(at)
    } else {
        UNIX_EPOCH.checked_sub(at)
    };
    whole
        .and_then(|t| t.checked_add(nanos))
        .unwrap_or(UNIX_EPOCH)
}

/// Answers an extended-attribute request for `data`: its size when `size` is 0,
/// `ERANGE` when it does not fit in `size`.
fn reply_sized(reply: ReplyXattr, size: u32, data: &[u8]) {
    if size == 0 {
        reply.size(data.len() as u32);
    } else if data.len() > size as usize {
        reply.error(Errno::ERANGE);
    } else {
        reply.data(data);
    }
}

/// Says on stderr, as larder's other errors, why a call fails with `EIO`: the
/// program reading sees only the errno.
fn io_error(why: &str) -> Errno {
    crate::output::stderr_line(Some("error"), why);
    Errno::EIO
}

/// The first 8 digits of a snapshot id, as `larder snapshots` shows it.
fn short_id(id: &str) -> &str {
    id.get(..8).unwrap_or(id)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Filesystem for SnapshotFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.child(parent.0, name.as_bytes()) {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.target(ino.0) {
            Ok(target) => reply.attr(&TTL, &self.attr(ino.0, &target)),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.target(ino.0) {
            Ok(Target::Fixed(Node::Link(target))) => reply.data(target),
            Ok(Target::Entry(loaded, i)) => match &loaded.tree.entries[i as usize] {
                e if e.kind == EntryKind::Symlink => reply.data(&e.target),
                _ => reply.error(Errno::EINVAL),
            },
            Ok(_) => reply.error(Errno::EINVAL),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if flags.acc_mode() != OpenAccMode::O_RDONLY {
            return reply.error(Errno::EROFS);
        }
        match self.open_file(ino.0) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::FOPEN_KEEP_CACHE),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let Some(file) = lock(&self.open).get(&fh.0).cloned() else {
            return reply.error(Errno::EBADF);
        };
        match self.cache.read_at(&file, offset, u64::from(size)) {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(io_error(&error_chain(&e))),
        }
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        lock(&self.open).remove(&fh.0);
        reply.ok();
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let children = match self.children(ino.0) {
            Ok(children) => children,
            Err(e) => return reply.error(e),
        };
        // Offsets: 1 after `.`, 2 after `..`, 3 + i after child i.
        for at in offset as usize.. {
            let (child, kind, name): (u64, FileType, &[u8]) = match at {
                0 => (ino.0, FileType::Directory, b"."),
                1 => (ino.0, FileType::Directory, b".."),
                _ => match children.get(&self.namespace, at - 2) {
                    Some(child) => child,
                    None => break,
                },
            };
            if reply.add(INodeNo(child), at as u64 + 1, kind, OsStr::from_bytes(name)) {
                break;
            }
        }
        reply.ok();
    }

    fn access(&self, _req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        match self.target(ino.0) {
            Ok(_) if mask.contains(AccessFlags::W_OK) => reply.error(Errno::EROFS),
            Ok(_) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        match self.xattrs(ino.0) {
            Ok(xattrs) => match xattrs.iter().find(|x| x.name == name.as_bytes()) {
                Some(x) => reply_sized(reply, size, &x.value),
                None => reply.error(Errno::NO_XATTR),
            },
            Err(e) => reply.error(e),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        match self.xattrs(ino.0) {
            Ok(xattrs) => {
                let mut names = Vec::new();
                for x in &xattrs {
                    names.extend_from_slice(&x.name);
                    names.push(0);
                }
                reply_sized(reply, size, &names);
            }
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        _size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        reply.error(Errno::EROFS);
    }

    fn mknod(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }

    fn mkdir(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }

    fn unlink(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS);
    }

    fn rmdir(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS);
    }

    fn symlink(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _link_name: &OsStr,
        _target: &Path,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }

    fn rename(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _newparent: INodeNo,
        _newname: &OsStr,
        _flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EROFS);
    }

    fn link(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _newparent: INodeNo,
        _newname: &OsStr,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        reply.error(Errno::EROFS);
    }

    fn create(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        reply.error(Errno::EROFS);
    }

    fn setxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EROFS);
    }

    fn removexattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS);
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _length: u64,
        _mode: i32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EROFS);
    }
}
