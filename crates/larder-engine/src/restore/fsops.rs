//! The file-system operations of restore, each relative to an open directory
//! descriptor and never through a symlink: the kernel, not a check made earlier on a
//! path, keeps every one of them inside the target while another local user changes
//! what the target holds (docs/design/restore.md, "Against another local user").
//!
//! - Directories are opened with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`
//!   below a directory already open (a component-by-component `openat(O_NOFOLLOW |
//!   O_DIRECTORY)` walk where the kernel has no `openat2`), so no `..`, absolute path
//!   or symlink, the last component included, leads anywhere else.
//! - Entries are created, linked and removed by name in an open directory (`openat`,
//!   `mkdirat`, `symlinkat`, `mknodat`, `linkat`, `unlinkat`), each of which acts on
//!   that name itself and never follows a symlink it names.
//! - Metadata is set on descriptors (`meta/apply.rs`): a file's or directory's own, or,
//!   for what cannot be opened for I/O (symlinks, FIFOs, device nodes), an `O_PATH`
//!   descriptor of the entry itself, whose kind and owner [`open_node`] verifies.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use rustix::fs::{AtFlags, Dev, FileType, Mode, OFlags, ResolveFlags};

/// The longest relative path opened in one `openat2` call: below `PATH_MAX` (4,096
/// bytes with its NUL); longer paths are opened in pieces.
const PATH_PIECE: usize = 4000;

/// Directories deeper than this below what [`remove_tree`] removes are refused: each
/// level holds a descriptor while its entries are removed.
pub(super) const REMOVE_DEPTH: usize = 256;

/// Set once `openat2` answered `ENOSYS` (or `EPERM`, a seccomp filter's answer for
/// system calls it does not know): later opens walk component by component.
static NO_OPENAT2: AtomicBool = AtomicBool::new(false);

/// Flags of every directory open: read-only, close-on-exec, a directory and not a
/// symlink.
fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

/// This process's effective uid, asked once: what the restore creates is its.
pub(super) fn euid() -> u32 {
    static EUID: OnceLock<u32> = OnceLock::new();
    *EUID.get_or_init(|| rustix::process::geteuid().as_raw())
}

/// The identity of a file: its device and inode.
pub(super) type DevIno = (u64, u64);

/// Opens the restore target, a path the user gave; everything below it is reached
/// through the returned descriptor only.
pub(super) fn open_target(path: &std::path::Path) -> io::Result<OwnedFd> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    Ok(rustix::fs::open(path, flags, Mode::empty())?)
}

/// Opens directory `rel` (names separated by `/`) below `dir`, never through a
/// symlink (the last component included) and never outside `dir`.
pub(super) fn open_beneath(dir: BorrowedFd<'_>, rel: &[u8]) -> io::Result<OwnedFd> {
    if rel.len() <= PATH_PIECE {
        return open_piece(dir, rel);
    }
    // Pieces that end at a `/`, each short enough for one call.
    let mut rest = rel;
    let mut cur: Option<OwnedFd> = None;
    while !rest.is_empty() {
        let cut = if rest.len() <= PATH_PIECE {
            rest.len()
        } else {
            rest[..=PATH_PIECE]
                .iter()
                .rposition(|&b| b == b'/')
                .filter(|&at| at > 0)
                .ok_or_else(|| io::Error::from_raw_os_error(libc::ENAMETOOLONG))?
        };
        let base = cur.as_ref().map_or(dir, |fd| fd.as_fd());
        cur = Some(open_piece(base, &rest[..cut])?);
        rest = rest.get(cut + 1..).unwrap_or_default();
    }
    cur.ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))
}

fn open_piece(dir: BorrowedFd<'_>, rel: &[u8]) -> io::Result<OwnedFd> {
    if !NO_OPENAT2.load(Ordering::Relaxed) {
        let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS;
        loop {
            match rustix::fs::openat2(dir, rel, dir_flags(), Mode::empty(), resolve) {
                Ok(fd) => return Ok(fd),
                // A rename elsewhere on the file system raced the lookup: retry.
                Err(rustix::io::Errno::AGAIN) => continue,
                Err(rustix::io::Errno::NOSYS | rustix::io::Errno::PERM) => {
                    NO_OPENAT2.store(true, Ordering::Relaxed);
                    break;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
    walk(dir, rel)
}

/// The walk where `openat2` is missing: one `openat(O_NOFOLLOW | O_DIRECTORY)` per
/// component, each a plain name (not empty, `.` or `..`), so the same paths resolve as
/// with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`.
fn walk(dir: BorrowedFd<'_>, rel: &[u8]) -> io::Result<OwnedFd> {
    let mut cur: Option<OwnedFd> = None;
    for name in rel.split(|&b| b == b'/') {
        if !is_plain_name(name) {
            return Err(io::Error::from_raw_os_error(libc::EXDEV));
        }
        let base = cur.as_ref().map_or(dir, |fd| fd.as_fd());
        cur = Some(rustix::fs::openat(base, name, dir_flags(), Mode::empty())?);
    }
    cur.ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))
}

/// Whether `name` names an entry of a directory: not empty, not `.` or `..`, no `/`
/// and no NUL.
pub(super) fn is_plain_name(name: &[u8]) -> bool {
    !name.is_empty() && name != b"." && name != b".." && !name.contains(&b'/') && !name.contains(&0)
}

/// Opens directory `name` of `dir` (one name), as [`open_beneath`] does.
pub(super) fn open_dir(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<OwnedFd> {
    if !is_plain_name(name) {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    open_piece(dir, name)
}

/// Device, inode, kind, owner and link count of an open descriptor.
pub(super) fn stat(fd: BorrowedFd<'_>) -> io::Result<rustix::fs::Stat> {
    Ok(rustix::fs::fstat(fd)?)
}

pub(super) fn dev_ino(st: &rustix::fs::Stat) -> DevIno {
    (st.st_dev, st.st_ino)
}

/// What `name` in `dir` is, not following a symlink.
pub(super) fn stat_at(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<rustix::fs::Stat> {
    Ok(rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)?)
}

/// Creates file `name` in `dir`, empty and mode 0600, failing if anything (a symlink
/// included) is there.
pub(super) fn create_file(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<File> {
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = rustix::fs::openat(dir, name, flags, Mode::from_raw_mode(0o600))?;
    Ok(File::from(fd))
}

/// Creates directory `name` in `dir`, mode 0700 until the directory-metadata pass
/// gives it its own: nobody else can use it before the restore is done with it.
pub(super) fn make_dir(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<()> {
    Ok(rustix::fs::mkdirat(dir, name, Mode::from_raw_mode(0o700))?)
}

pub(super) fn make_symlink(dir: BorrowedFd<'_>, name: &[u8], target: &[u8]) -> io::Result<()> {
    Ok(rustix::fs::symlinkat(target, dir, name)?)
}

/// Creates FIFO or device node `name` in `dir`, mode 0600 until its metadata is set.
pub(super) fn make_node(
    dir: BorrowedFd<'_>,
    name: &[u8],
    kind: FileType,
    dev: Dev,
) -> io::Result<()> {
    Ok(rustix::fs::mknodat(
        dir,
        name,
        kind,
        Mode::from_raw_mode(0o600),
        dev,
    )?)
}

/// Links `new` in `new_dir` to `old` in `old_dir` (not following `old` if it is a
/// symlink).
pub(super) fn make_link(
    old_dir: BorrowedFd<'_>,
    old: &[u8],
    new_dir: BorrowedFd<'_>,
    new: &[u8],
) -> io::Result<()> {
    Ok(rustix::fs::linkat(
        old_dir,
        old,
        new_dir,
        new,
        AtFlags::empty(),
    )?)
}

/// Removes `name` from `dir` if it is not a directory (`EISDIR` if it is).
pub(super) fn remove_entry(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<()> {
    Ok(rustix::fs::unlinkat(dir, name, AtFlags::empty())?)
}

/// Removes directory `name` from `dir` if it is empty (`ENOTEMPTY` if not).
pub(super) fn remove_empty_dir(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<()> {
    Ok(rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR)?)
}

/// The names in open directory `dir`, with whether each is a directory (not
/// following symlinks), `.` and `..` left out.
pub(super) fn list(dir: BorrowedFd<'_>) -> io::Result<Vec<(Vec<u8>, bool)>> {
    let mut names = Vec::new();
    let mut entries = rustix::fs::Dir::read_from(dir)?;
    while let Some(entry) = entries.read() {
        let entry = entry?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        let is_dir = match entry.file_type() {
            FileType::Directory => true,
            FileType::Unknown => stat_at(dir, name)
                .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Directory),
            _ => false,
        };
        names.push((name.to_vec(), is_dir));
    }
    Ok(names)
}

/// Removes `name` from `dir` and, if it is a directory, everything in it first, each
/// level through its own descriptor (never following a symlink); refuses to go below
/// a mount point (another device than `dir`'s) or deeper than [`REMOVE_DEPTH`].
/// Returns the entries removed.
pub(super) fn remove_tree(dir: BorrowedFd<'_>, name: &[u8], is_dir: bool) -> io::Result<u64> {
    if !is_dir {
        remove_entry(dir, name)?;
        return Ok(1);
    }
    let device = stat(dir)?.st_dev;
    let removed = empty_dir(dir, name, device, 0)?;
    remove_empty_dir(dir, name)?;
    Ok(removed + 1)
}

fn empty_dir(parent: BorrowedFd<'_>, name: &[u8], device: u64, depth: usize) -> io::Result<u64> {
    if depth >= REMOVE_DEPTH {
        return Err(io::Error::other(format!(
            "more than {REMOVE_DEPTH} directories deep; not removed"
        )));
    }
    let fd = open_dir(parent, name)?;
    if stat(fd.as_fd())?.st_dev != device {
        return Err(io::Error::other("a mount point; not removed"));
    }
    let mut removed = 0;
    for (child, is_dir) in list(fd.as_fd())? {
        if is_dir {
            removed += empty_dir(fd.as_fd(), &child, device, depth + 1)?;
            remove_empty_dir(fd.as_fd(), &child)?;
        } else {
            remove_entry(fd.as_fd(), &child)?;
        }
        removed += 1;
    }
    Ok(removed)
}

/// Opens entry `name` of `dir` itself (`O_PATH | O_NOFOLLOW`: a symlink is not
/// followed, a FIFO or device is not opened for I/O) and verifies it is of `kind`,
/// this process's (the restore created it) and has one name (no link to it was made
/// from elsewhere). Metadata set through the descriptor reaches that entry only,
/// whatever is renamed in its place later.
pub(super) fn open_node(dir: BorrowedFd<'_>, name: &[u8], kind: FileType) -> io::Result<OwnedFd> {
    let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = rustix::fs::openat(dir, name, flags, Mode::empty())?;
    let st = stat(fd.as_fd())?;
    let ours = st.st_uid == euid();
    if FileType::from_raw_mode(st.st_mode) != kind || !ours || st.st_nlink != 1 {
        return Err(io::Error::other(
            "was replaced during the restore; its metadata is not set",
        ));
    }
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn target() -> (tempfile::TempDir, OwnedFd) {
        let dir = tempfile::tempdir().unwrap();
        let fd = open_target(dir.path()).unwrap();
        (dir, fd)
    }

    fn errno(e: &io::Error) -> i32 {
        e.raw_os_error().unwrap_or(0)
    }

    #[test]
    fn opens_stay_beneath_and_never_follow_symlinks() {
        let (dir, fd) = target();
        let root = dir.path();
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        symlink(root.join("a"), root.join("link")).unwrap();
        symlink("b", root.join("a/rel")).unwrap();
        assert!(open_beneath(fd.as_fd(), b"a/b").is_ok());
        // A symlink as the last component is not a directory (O_NOFOLLOW |
        // O_DIRECTORY); one on the way is a loop (RESOLVE_NO_SYMLINKS).
        for (path, why) in [
            (&b"link"[..], [libc::ENOTDIR, libc::ELOOP]),
            (b"link/b", [libc::ELOOP, libc::ELOOP]),
            (b"a/rel", [libc::ENOTDIR, libc::ELOOP]),
            (b"..", [libc::EXDEV, libc::EXDEV]),
            (b"a/../..", [libc::EXDEV, libc::EXDEV]),
            (b"missing", [libc::ENOENT, libc::ENOENT]),
        ] {
            let e = open_beneath(fd.as_fd(), path).unwrap_err();
            assert!(
                why.contains(&errno(&e)),
                "{}: {e}",
                String::from_utf8_lossy(path)
            );
        }
        // An absolute path is refused, not resolved from `/`.
        assert!(open_beneath(fd.as_fd(), b"/tmp").is_err());
        // The fallback walk refuses the same paths.
        assert!(walk(fd.as_fd(), b"a/b").is_ok());
        for path in [&b"link"[..], b"a/rel", b"..", b"a/../a", b"", b"a//b"] {
            assert!(walk(fd.as_fd(), path).is_err(), "{path:?}");
        }
    }

    /// Regression guard: a path longer than PATH_MAX opens (in pieces), where a
    /// path-based restore failed with "File name too long".
    #[test]
    fn paths_longer_than_path_max_open() {
        let (_dir, fd) = target();
        let name = vec![b'n'; 200];
        let mut rel = Vec::new();
        let mut cur = fd.try_clone().unwrap();
        for _ in 0..30 {
            make_dir(cur.as_fd(), &name).unwrap();
            cur = open_dir(cur.as_fd(), &name).unwrap();
            if !rel.is_empty() {
                rel.push(b'/');
            }
            rel.extend_from_slice(&name);
        }
        assert!(rel.len() > 4096);
        let deep = open_beneath(fd.as_fd(), &rel).unwrap();
        assert_eq!(
            dev_ino(&stat(deep.as_fd()).unwrap()),
            dev_ino(&stat(cur.as_fd()).unwrap())
        );
        assert_eq!(remove_tree(fd.as_fd(), &name, true).unwrap(), 30);
        assert!(list(fd.as_fd()).unwrap().is_empty());
    }

    #[test]
    fn creates_fail_on_anything_there_and_never_follow() {
        let (dir, fd) = target();
        let outside = tempfile::tempdir().unwrap();
        symlink(outside.path().join("f"), dir.path().join("f")).unwrap();
        let e = create_file(fd.as_fd(), b"f").unwrap_err();
        assert_eq!(errno(&e), libc::EEXIST);
        assert!(make_dir(fd.as_fd(), b"f").is_err());
        assert!(!outside.path().join("f").exists());
        // Removing the link removes the link, not what it names.
        std::fs::write(outside.path().join("f"), b"x").unwrap();
        remove_entry(fd.as_fd(), b"f").unwrap();
        assert_eq!(std::fs::read(outside.path().join("f")).unwrap(), b"x");
        for name in [&b".."[..], b".", b"", b"a/b", b"a\0b"] {
            assert!(open_dir(fd.as_fd(), name).is_err(), "{name:?}");
        }
    }

    #[test]
    fn a_node_replaced_by_a_symlink_is_refused() {
        let (dir, fd) = target();
        make_node(fd.as_fd(), b"p", FileType::Fifo, 0).unwrap();
        assert!(open_node(fd.as_fd(), b"p", FileType::Fifo).is_ok());
        std::fs::remove_file(dir.path().join("p")).unwrap();
        symlink("/etc/passwd", dir.path().join("p")).unwrap();
        assert!(open_node(fd.as_fd(), b"p", FileType::Fifo).is_err());
        // The symlink itself, opened as what it is.
        let link = open_node(fd.as_fd(), b"p", FileType::Symlink).unwrap();
        assert_eq!(
            FileType::from_raw_mode(stat(link.as_fd()).unwrap().st_mode),
            FileType::Symlink
        );
    }

    #[test]
    fn remove_tree_empties_through_descriptors() {
        let (dir, fd) = target();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("keep"), b"k").unwrap();
        std::fs::create_dir_all(dir.path().join("d/e/f")).unwrap();
        std::fs::write(dir.path().join("d/e/f/x"), b"x").unwrap();
        symlink(outside.path(), dir.path().join("d/out")).unwrap();
        assert_eq!(remove_tree(fd.as_fd(), b"d", true).unwrap(), 5);
        assert!(!dir.path().join("d").exists());
        assert_eq!(std::fs::read(outside.path().join("keep")).unwrap(), b"k");
    }
}
