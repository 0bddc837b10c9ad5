//! Setting the metadata a tree entry records on a restored entry: owner, extended
//! attributes (POSIX ACLs among them), permission bits and times, always through a
//! descriptor of the entry itself (never a path looked up again, which another user
//! could have swapped for a symlink: docs/design/restore.md, "Against another local
//! user").
//!
//! Order (must-list; each step would undo or block a later one if swapped):
//! 1. Owner first: `chown` clears the setuid and setgid bits and the
//!    `security.capability` attribute.
//! 2. Then the attributes that are not ACLs: setting a `user.` attribute needs write
//!    permission on the file, which the recorded mode (0444, say) may not give a
//!    restore that is not run as root.
//! 3. Then the permission bits, with `chmod`; a setuid or setgid bit only where the
//!    recorded owner or group was given back, as `cp -p` does, so that a user's
//!    setuid file never comes back setuid to whoever restores it.
//! 4. Then the ACLs (`system.posix_acl_access`, `system.posix_acl_default`): an ACL
//!    sets the group bits of the mode to its mask, so `chmod` after it would change
//!    the ACL.
//! 5. Then times: every step above changes the ctime, and none the mtime, but a
//!    restore's writes do.
//! 6. Attribute flags very last (`chattr`): `i` forbids every change after it, `a`
//!    every change but appending.
//!
//! A step that fails is reported and the next one is still tried.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use larder_store::{attr_flag_letters, TreeEntry, Xattr};
use rustix::fs::{AtFlags, Mode, Timespec, Timestamps, XattrFlags};
use rustix::process::{Gid, Uid};

use super::attr_flags::set_attr_flags;

/// What metadata is set on: a descriptor of the entry itself, never a path.
#[derive(Clone, Copy)]
pub(crate) enum Node<'a> {
    /// A file or directory, open (`fchown`, `fsetxattr`, `fchmod`, `futimens`).
    Fd(BorrowedFd<'a>),
    /// A FIFO or device node, opened `O_PATH` (not for I/O) and verified to be the one
    /// the restore made: `fchownat(AT_EMPTY_PATH)` on it, the other calls on
    /// `/proc/self/fd/N`, which leads to that very inode.
    Special(BorrowedFd<'a>),
    /// A symlink: `link` is the link itself (`O_PATH | O_NOFOLLOW`, verified), `name`
    /// its name in the open directory `dir`. A symlink has no mode of its own;
    /// attributes are set with `lsetxattr` on `/proc/self/fd/DIR/NAME`, which acts on
    /// the name itself and never follows it.
    Symlink {
        link: BorrowedFd<'a>,
        dir: BorrowedFd<'a>,
        name: &'a [u8],
    },
}

impl Node<'_> {
    /// The descriptor of the entry itself.
    fn fd(&self) -> BorrowedFd<'_> {
        match *self {
            Node::Fd(fd) | Node::Special(fd) => fd,
            Node::Symlink { link, .. } => link,
        }
    }
}

/// Whether and how owners are restored.
#[derive(Clone, Debug)]
pub(crate) struct OwnerPolicy {
    /// Restore the recorded uid and gid at all.
    pub restore: bool,
    /// The restore runs as root: `chown` always, whatever the entry got. A user that is
    /// not root tries only where the recorded ids differ from what the entry got (it
    /// may still change the group to one of its own).
    pub root: bool,
    /// Entries whose owner a user that is not root was not permitted to set. Like
    /// `cp -a`, `rsync -a` and restic, that is not an error of each entry: the restore
    /// reports the count once.
    pub refused: Arc<AtomicU64>,
}

impl OwnerPolicy {
    /// Restores owners if `restore`, as root or not as this process runs.
    pub fn new(restore: bool) -> Self {
        Self {
            restore,
            root: rustix::process::geteuid().is_root(),
            refused: Arc::new(AtomicU64::new(0)),
        }
    }
}

/// Whether an attribute is a POSIX ACL (set after the mode, see the module docs).
fn is_acl(x: &Xattr) -> bool {
    x.name == b"system.posix_acl_access" || x.name == b"system.posix_acl_default"
}

/// Sets the owner, attributes, permission bits (not for symlinks, which have none),
/// times and attribute flags that `entry` records on `node`, in the module's order.
/// Returns one message per thing that could not be set, naming it.
pub(crate) fn restore_metadata(
    node: Node<'_>,
    entry: &TreeEntry,
    owners: &OwnerPolicy,
) -> Vec<String> {
    let mut failed = Vec::new();
    let owner_set = owners.restore
        && match restore_owner(node, entry, owners.root) {
            Ok(Owner::Set) => true,
            Ok(Owner::NotPermitted) => {
                owners.refused.fetch_add(1, Ordering::Relaxed);
                false
            }
            Err(message) => {
                failed.push(message);
                false
            }
        };
    for x in entry.xattrs.iter().filter(|x| !is_acl(x)) {
        if let Err(e) = set_xattr(node, x) {
            failed.push(xattr_failure(x, &e));
        }
    }
    if !matches!(node, Node::Symlink { .. }) {
        let mode = kept_special_bits(node, entry, owner_set);
        if let Err(e) = set_mode(node, mode) {
            failed.push(format!("cannot restore mode {mode:04o}: {e}"));
        }
    }
    for x in entry.xattrs.iter().filter(|x| is_acl(x)) {
        if let Err(e) = set_xattr(node, x) {
            failed.push(xattr_failure(x, &e));
        }
    }
    if let Err(e) = set_times(node, entry.mtime_sec, entry.mtime_nsec) {
        failed.push(format!("cannot restore modification time: {e}"));
    }
    if let Err(e) = restore_attr_flags(node, entry) {
        let flags = attr_flag_letters(entry.attr_flags);
        failed.push(format!("cannot restore attribute flags {flags}: {e}"));
    }
    failed
}

/// The recorded permission bits, less the setuid bit unless the entry has the
/// recorded owner and the setgid bit unless it has the recorded group (`owner_set`:
/// both were just given back).
fn kept_special_bits(node: Node<'_>, entry: &TreeEntry, owner_set: bool) -> u32 {
    let mode = entry.mode & 0o7777;
    if owner_set || mode & 0o6000 == 0 {
        return mode;
    }
    let (uid, gid) = match rustix::fs::fstat(node.fd()) {
        Ok(st) => (st.st_uid, st.st_gid),
        Err(_) => return mode & !0o6000,
    };
    let mut mode = mode;
    if uid != entry.uid {
        mode &= !0o4000;
    }
    if gid != entry.gid {
        mode &= !0o2000;
    }
    mode
}

/// Sets the attribute flags `entry` records (step 6) on an open file or directory.
/// FIFOs, devices and symlinks take none (the ioctl needs a descriptor open for
/// I/O). An entry without flags costs no call: what restore creates keeps the flags
/// it was created with.
fn restore_attr_flags(node: Node<'_>, entry: &TreeEntry) -> io::Result<()> {
    match node {
        _ if entry.attr_flags == 0 => Ok(()),
        Node::Fd(fd) => set_attr_flags(&fd, entry.attr_flags),
        Node::Special(_) | Node::Symlink { .. } => Ok(()),
    }
}

fn xattr_failure(x: &Xattr, e: &io::Error) -> String {
    format!(
        "cannot restore extended attribute {}: {e}",
        crate::names::escape_name(&x.name)
    )
}

/// What became of an entry's owner.
enum Owner {
    Set,
    /// A user that is not root may not give the entry that owner (`EPERM`); the group
    /// was set where the user may.
    NotPermitted,
}

/// Changes the owner to the recorded uid and gid: always as root; otherwise only if
/// they differ from what the entry has, and if the whole change is not permitted, the
/// group alone (a user may give a file any group it belongs to).
fn restore_owner(node: Node<'_>, entry: &TreeEntry, root: bool) -> Result<Owner, String> {
    let (uid, gid) = (entry.uid, entry.gid);
    let failed = |e: io::Error| format!("cannot restore owner {uid}:{gid}: {e}");
    if root {
        return chown(node, Some(uid), Some(gid))
            .map(|()| Owner::Set)
            .map_err(failed);
    }
    let st = rustix::fs::fstat(node.fd()).map_err(|e| failed(e.into()))?;
    if (st.st_uid, st.st_gid) == (uid, gid) {
        return Ok(Owner::Set);
    }
    match chown(node, Some(uid), Some(gid)) {
        Ok(()) => Ok(Owner::Set),
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
            if st.st_gid != gid {
                // Best effort: a group the user does not belong to is refused too.
                let _ = chown(node, None, Some(gid));
            }
            Ok(Owner::NotPermitted)
        }
        Err(e) => Err(failed(e)),
    }
}

/// `fchown`, or `fchownat(AT_EMPTY_PATH)` on an `O_PATH` descriptor (the entry itself,
/// a symlink not followed). `None`, or an id of `u32::MAX` (-1), leaves that id as it
/// is.
fn chown(node: Node<'_>, uid: Option<u32>, gid: Option<u32>) -> io::Result<()> {
    let uid = uid.filter(|&u| u != u32::MAX).map(Uid::from_raw);
    let gid = gid.filter(|&g| g != u32::MAX).map(Gid::from_raw);
    match node {
        Node::Fd(fd) => rustix::fs::fchown(fd, uid, gid)?,
        Node::Special(fd) | Node::Symlink { link: fd, .. } => {
            rustix::fs::chownat(fd, "", uid, gid, AtFlags::EMPTY_PATH)?
        }
    }
    Ok(())
}

/// Sets one attribute, creating or replacing it.
fn set_xattr(node: Node<'_>, x: &Xattr) -> io::Result<()> {
    let (name, value, flags) = (x.name.as_slice(), x.value.as_slice(), XattrFlags::empty());
    match node {
        Node::Fd(fd) => rustix::fs::fsetxattr(fd, name, value, flags)?,
        Node::Special(fd) => rustix::fs::setxattr(proc_fd(fd), name, value, flags)?,
        Node::Symlink {
            dir, name: entry, ..
        } => rustix::fs::lsetxattr(proc_child(dir, entry)?, name, value, flags)?,
    }
    Ok(())
}

/// `fchmod`, or `chmod` of `/proc/self/fd/N` for an `O_PATH` descriptor of a FIFO or
/// device node (`fchmod` takes no `O_PATH` descriptor).
fn set_mode(node: Node<'_>, mode: u32) -> io::Result<()> {
    let mode = Mode::from_raw_mode(mode);
    match node {
        Node::Fd(fd) => rustix::fs::fchmod(fd, mode)?,
        Node::Special(fd) => rustix::fs::chmod(proc_fd(fd), mode)?,
        // Linux has no mode for a symlink.
        Node::Symlink { .. } => {}
    }
    Ok(())
}

/// Sets access and modification time to the recorded mtime: `futimens`, or
/// `utimensat` on the entry itself (`AT_EMPTY_PATH` on its `O_PATH` descriptor; where
/// the kernel does not take that, `/proc/self/fd/N` for a node and the name, not
/// followed, for a symlink).
fn set_times(node: Node<'_>, sec: i64, nsec: u32) -> io::Result<()> {
    let ts = Timespec {
        tv_sec: sec,
        tv_nsec: nsec.min(999_999_999).into(),
    };
    let times = Timestamps {
        last_access: ts,
        last_modification: ts,
    };
    match node {
        Node::Fd(fd) => rustix::fs::futimens(fd, &times)?,
        Node::Special(fd) => match rustix::fs::utimensat(fd, "", &times, AtFlags::EMPTY_PATH) {
            Err(rustix::io::Errno::INVAL) => {
                rustix::fs::utimensat(rustix::fs::CWD, proc_fd(fd), &times, AtFlags::empty())?
            }
            other => other?,
        },
        Node::Symlink { link, dir, name } => {
            match rustix::fs::utimensat(link, "", &times, AtFlags::EMPTY_PATH) {
                Err(rustix::io::Errno::INVAL) => {
                    rustix::fs::utimensat(dir, name, &times, AtFlags::SYMLINK_NOFOLLOW)?
                }
                other => other?,
            }
        }
    }
    Ok(())
}

/// `/proc/self/fd/N`: the magic link to what descriptor `fd` refers to, for the calls
/// that take no `O_PATH` descriptor. Following it reaches that very inode, not a path
/// looked up again.
fn proc_fd(fd: BorrowedFd<'_>) -> CString {
    CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd())).expect("digits hold no NUL")
}

/// `/proc/self/fd/DIR/NAME`: `name` in open directory `dir`.
fn proc_child(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<CString> {
    let mut path = format!("/proc/self/fd/{}/", dir.as_raw_fd()).into_bytes();
    path.extend_from_slice(name);
    CString::new(path).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::read_xattrs;
    use larder_store::EntryKind;
    use std::fs::File;
    use std::os::fd::AsFd;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    #[test]
    fn a_failed_xattrs_name_is_shown_exactly_and_never_raw() {
        let x = Xattr {
            name: b"user.\xff\x1b[2J".to_vec(),
            value: Vec::new(),
        };
        let text = xattr_failure(&x, &io::Error::from_raw_os_error(libc::ENOTSUP));
        assert!(text.contains(r"user.\xff\x1b[2J"), "{text}");
        assert!(
            !text.contains('\u{1b}') && !text.contains('\u{fffd}'),
            "{text}"
        );
    }

    fn entry_with(xattrs: Vec<Xattr>, mode: u32) -> TreeEntry {
        TreeEntry {
            mode,
            mtime_sec: 1_234_567_890,
            mtime_nsec: 123_456_789,
            uid: rustix::process::getuid().as_raw(),
            gid: rustix::process::getgid().as_raw(),
            xattrs,
            ..TreeEntry::new(EntryKind::File, b"f".to_vec())
        }
    }

    /// Regression guard for the order of the must-list: user attributes are set before
    /// a read-only mode, so the restore of a 0444 file keeps them even without root.
    #[test]
    fn a_read_only_file_keeps_its_attributes_mode_and_time() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let file = File::create(&path).unwrap();
        let xattrs = vec![Xattr {
            name: b"user.larder".to_vec(),
            value: b"v\x00".to_vec(),
        }];
        let entry = entry_with(xattrs.clone(), 0o100_444);
        let failed = restore_metadata(Node::Fd(file.as_fd()), &entry, &OwnerPolicy::new(true));
        let supported = failed.is_empty();
        if !supported {
            // The temporary directory's file system takes no user attributes.
            assert!(
                failed.len() == 1 && failed[0].contains("user.larder"),
                "{failed:?}"
            );
        }
        drop(file);
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o7777, 0o444);
        assert_eq!(
            (meta.mtime(), meta.mtime_nsec()),
            (1_234_567_890, 123_456_789)
        );
        if supported {
            assert_eq!(read_xattrs(&path).unwrap(), xattrs);
        }
    }

    #[test]
    fn failures_name_what_was_not_restored() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"x").unwrap();
        // No file system takes attributes in a namespace that does not exist.
        let entry = entry_with(
            vec![Xattr {
                name: b"nonsense.attribute".to_vec(),
                value: b"1".to_vec(),
            }],
            0o100_640,
        );
        let file = File::open(&path).unwrap();
        let failed = restore_metadata(Node::Fd(file.as_fd()), &entry, &OwnerPolicy::new(true));
        assert_eq!(failed.len(), 1, "{failed:?}");
        assert!(
            failed[0].starts_with("cannot restore extended attribute nonsense.attribute: "),
            "{failed:?}"
        );
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o7777, 0o640);
    }

    /// Regression guard: a setuid or setgid bit comes back only with the recorded
    /// owner or group; a restore that does not give them back (`--no-owner`, or a
    /// refused `chown`) clears it, as `cp -p` does.
    #[test]
    fn setuid_and_setgid_bits_need_their_owner() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let file = File::create(&path).unwrap();
        let mine = entry_with(Vec::new(), 0o106_755);
        let theirs = TreeEntry {
            uid: mine.uid.wrapping_add(1),
            gid: mine.gid.wrapping_add(1),
            ..mine.clone()
        };
        let group_only = TreeEntry {
            gid: mine.gid.wrapping_add(1),
            ..mine.clone()
        };
        let no_owner = OwnerPolicy::new(false);
        for (entry, mode) in [(&mine, 0o6755), (&theirs, 0o755), (&group_only, 0o4755)] {
            assert!(restore_metadata(Node::Fd(file.as_fd()), entry, &no_owner).is_empty());
            let got = file.metadata().unwrap().permissions().mode() & 0o7777;
            assert_eq!(got, mode, "recorded {}:{}", entry.uid, entry.gid);
        }
    }

    #[test]
    fn symlinks_and_nodes_get_theirs_without_following() {
        let dir = tempfile::tempdir().unwrap();
        let root =
            rustix::fs::open(dir.path(), rustix::fs::OFlags::DIRECTORY, Mode::empty()).unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"v").unwrap();
        std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::symlink(&victim, dir.path().join("l")).unwrap();
        rustix::fs::mknodat(
            &root,
            "p",
            rustix::fs::FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let opath = rustix::fs::OFlags::PATH | rustix::fs::OFlags::NOFOLLOW;
        let link = rustix::fs::openat(&root, "l", opath, Mode::empty()).unwrap();
        let node = rustix::fs::openat(&root, "p", opath, Mode::empty()).unwrap();
        let entry = TreeEntry {
            mtime_sec: 1_000_000_000,
            ..entry_with(Vec::new(), 0o010_644)
        };
        let owners = OwnerPolicy::new(true);
        let symlink = Node::Symlink {
            link: link.as_fd(),
            dir: root.as_fd(),
            name: b"l",
        };
        assert!(restore_metadata(symlink, &entry, &owners).is_empty());
        assert!(restore_metadata(Node::Special(node.as_fd()), &entry, &owners).is_empty());
        let meta = std::fs::symlink_metadata(dir.path().join("l")).unwrap();
        assert_eq!(meta.mtime(), 1_000_000_000);
        let meta = std::fs::symlink_metadata(dir.path().join("p")).unwrap();
        assert_eq!((meta.mode() & 0o7777, meta.mtime()), (0o644, 1_000_000_000));
        let meta = std::fs::symlink_metadata(&victim).unwrap();
        assert_ne!(meta.mtime(), 1_000_000_000);
        assert_eq!(meta.mode() & 0o7777, 0o600);
    }
}
