//! Setting the metadata a tree entry records on a restored entry: owner, extended
//! attributes (POSIX ACLs among them), permission bits and times.
//!
//! Order (must-list; each step would undo or block a later one if swapped):
//! 1. Owner first: `chown` clears the setuid and setgid bits and the
//!    `security.capability` attribute.
//! 2. Then the attributes that are not ACLs: setting a `user.` attribute needs write
//!    permission on the file, which the recorded mode (0444, say) may not give a
//!    restore that is not run as root.
//! 3. Then the permission bits, with `chmod`.
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
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use larder_store::{attr_flag_letters, EntryKind, TreeEntry, Xattr};

use super::attr_flags::{open_dir, set_attr_flags};
use super::c_path;

/// Where metadata is set: an open file, or a path that is not followed if it names a
/// symlink (`lchown`, `lsetxattr`, `utimensat(AT_SYMLINK_NOFOLLOW)`).
#[derive(Clone, Copy)]
pub(crate) enum Node<'a> {
    File(&'a File),
    Path(&'a Path),
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
        // SAFETY: geteuid has no preconditions and cannot fail.
        let root = unsafe { libc::geteuid() } == 0;
        Self {
            restore,
            root,
            refused: Arc::new(AtomicU64::new(0)),
        }
    }
}

/// Whether an attribute is a POSIX ACL (set after the mode, see the module docs).
fn is_acl(x: &Xattr) -> bool {
    x.name == b"system.posix_acl_access" || x.name == b"system.posix_acl_default"
}

/// Sets the owner, attributes, permission bits (unless `mode` is false: symlinks have
/// none to set), times and attribute flags that `entry` records on `node`, in the
/// module's order.
/// Returns one message per thing that could not be set, naming it.
pub(crate) fn restore_metadata(
    node: Node<'_>,
    entry: &TreeEntry,
    owners: &OwnerPolicy,
    mode: bool,
) -> Vec<String> {
    let mut failed = Vec::new();
    let c = match node {
        Node::File(_) => None,
        Node::Path(path) => match c_path(path) {
            Ok(c) => Some(c),
            Err(e) => return vec![e.to_string()],
        },
    };
    let target = match (node, &c) {
        (Node::File(f), _) => Target::Fd(f.as_raw_fd()),
        (Node::Path(_), Some(c)) => Target::Path(c),
        (Node::Path(_), None) => unreachable!("a path node has its C path"),
    };
    if owners.restore {
        match restore_owner(node, target, entry, owners.root) {
            Ok(Owner::Set) => {}
            Ok(Owner::NotPermitted) => {
                owners.refused.fetch_add(1, Ordering::Relaxed);
            }
            Err(message) => failed.push(message),
        }
    }
    for x in entry.xattrs.iter().filter(|x| !is_acl(x)) {
        if let Err(e) = set_xattr(target, x) {
            failed.push(xattr_failure(x, &e));
        }
    }
    if mode {
        if let Err(e) = set_mode(target, entry.mode & 0o7777) {
            failed.push(format!(
                "cannot restore mode {:04o}: {e}",
                entry.mode & 0o7777
            ));
        }
    }
    for x in entry.xattrs.iter().filter(|x| is_acl(x)) {
        if let Err(e) = set_xattr(target, x) {
            failed.push(xattr_failure(x, &e));
        }
    }
    if let Err(e) = set_times(target, entry.mtime_sec, entry.mtime_nsec) {
        failed.push(format!("cannot restore modification time: {e}"));
    }
    if let Err(e) = restore_attr_flags(node, entry) {
        let flags = attr_flag_letters(entry.attr_flags);
        failed.push(format!("cannot restore attribute flags {flags}: {e}"));
    }
    failed
}

/// Sets the attribute flags `entry` records (step 6) on the open file, or on the
/// directory at a path (opened for it, never through a symlink). An entry without
/// flags costs no call: what restore creates keeps the flags it was created with.
fn restore_attr_flags(node: Node<'_>, entry: &TreeEntry) -> io::Result<()> {
    match node {
        _ if entry.attr_flags == 0 => Ok(()),
        Node::File(f) => set_attr_flags(f, entry.attr_flags),
        Node::Path(p) if entry.kind == EntryKind::Dir => {
            set_attr_flags(&open_dir(p)?, entry.attr_flags)
        }
        Node::Path(_) => Ok(()),
    }
}

fn xattr_failure(x: &Xattr, e: &io::Error) -> String {
    format!(
        "cannot restore extended attribute {}: {e}",
        String::from_utf8_lossy(&x.name)
    )
}

/// The raw handle of a [`Node`]: a descriptor, or a C path not followed.
#[derive(Clone, Copy)]
enum Target<'a> {
    Fd(libc::c_int),
    Path(&'a CString),
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
fn restore_owner(
    node: Node<'_>,
    target: Target<'_>,
    entry: &TreeEntry,
    root: bool,
) -> Result<Owner, String> {
    let (uid, gid) = (entry.uid, entry.gid);
    let failed = |e: io::Error| format!("cannot restore owner {uid}:{gid}: {e}");
    if root {
        return chown(target, uid, gid).map(|()| Owner::Set).map_err(failed);
    }
    let meta = match node {
        Node::File(f) => f.metadata(),
        Node::Path(p) => std::fs::symlink_metadata(p),
    }
    .map_err(failed)?;
    if (meta.uid(), meta.gid()) == (uid, gid) {
        return Ok(Owner::Set);
    }
    match chown(target, uid, gid) {
        Ok(()) => Ok(Owner::Set),
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
            if meta.gid() != gid {
                // Best effort: a group the user does not belong to is refused too.
                let _ = chown(target, u32::MAX, gid);
            }
            Ok(Owner::NotPermitted)
        }
        Err(e) => Err(failed(e)),
    }
}

/// `fchown` or `lchown`; an id of `u32::MAX` (-1) leaves that id as it is.
fn chown(target: Target<'_>, uid: u32, gid: u32) -> io::Result<()> {
    let rc = match target {
        // SAFETY: fchown takes a descriptor and two ids and retains nothing; a closed or
        // wrong descriptor is an error return, not undefined behaviour.
        Target::Fd(fd) => unsafe { libc::fchown(fd, uid, gid) },
        // SAFETY: `c` is a valid NUL-terminated path; lchown does not retain it.
        Target::Path(c) => unsafe { libc::lchown(c.as_ptr(), uid, gid) },
    };
    check(rc)
}

/// `fsetxattr` or `lsetxattr` (never through a symlink), creating or replacing.
fn set_xattr(target: Target<'_>, x: &Xattr) -> io::Result<()> {
    let name = CString::new(x.name.as_slice())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "name holds a NUL byte"))?;
    let value = x.value.as_ptr().cast::<libc::c_void>();
    let rc = match target {
        // SAFETY: `name` is NUL-terminated and `value` is valid for `x.value.len()`
        // bytes; the call copies both and retains neither.
        Target::Fd(fd) => unsafe { libc::fsetxattr(fd, name.as_ptr(), value, x.value.len(), 0) },
        // SAFETY: as above, and `c` is a valid NUL-terminated path.
        Target::Path(c) => unsafe {
            libc::lsetxattr(c.as_ptr(), name.as_ptr(), value, x.value.len(), 0)
        },
    };
    check(rc)
}

/// `fchmod` or `chmod`. `chmod` follows a symlink: callers never pass one (a symlink
/// has no permission bits of its own on Linux).
fn set_mode(target: Target<'_>, mode: u32) -> io::Result<()> {
    let rc = match target {
        // SAFETY: fchmod takes a descriptor and a mode and retains nothing.
        Target::Fd(fd) => unsafe { libc::fchmod(fd, mode as libc::mode_t) },
        // SAFETY: `c` is a valid NUL-terminated path; chmod does not retain it.
        Target::Path(c) => unsafe { libc::chmod(c.as_ptr(), mode as libc::mode_t) },
    };
    check(rc)
}

/// Sets access and modification time to the recorded mtime (`futimens`, or
/// `utimensat` on the path itself, not a symlink's target).
fn set_times(target: Target<'_>, sec: i64, nsec: u32) -> io::Result<()> {
    let ts = libc::timespec {
        tv_sec: sec as libc::time_t,
        tv_nsec: nsec.min(999_999_999) as libc::c_long,
    };
    let times = [ts, ts];
    let rc = match target {
        // SAFETY: `times` points to two timespecs, as futimens requires; not retained.
        Target::Fd(fd) => unsafe { libc::futimens(fd, times.as_ptr()) },
        // SAFETY: `c` is a valid NUL-terminated path and `times` two timespecs; neither
        // is retained after the call.
        Target::Path(c) => unsafe {
            libc::utimensat(
                libc::AT_FDCWD,
                c.as_ptr(),
                times.as_ptr(),
                libc::AT_SYMLINK_NOFOLLOW,
            )
        },
    };
    check(rc)
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::read_xattrs;
    use std::os::unix::fs::PermissionsExt;

    fn entry_with(xattrs: Vec<Xattr>, mode: u32) -> TreeEntry {
        // SAFETY: getuid and getgid have no preconditions.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        TreeEntry {
            mode,
            mtime_sec: 1_234_567_890,
            mtime_nsec: 123_456_789,
            uid,
            gid,
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
        let failed = restore_metadata(Node::File(&file), &entry, &OwnerPolicy::new(true), true);
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
        let failed = restore_metadata(Node::Path(&path), &entry, &OwnerPolicy::new(true), true);
        assert_eq!(failed.len(), 1, "{failed:?}");
        assert!(
            failed[0].starts_with("cannot restore extended attribute nonsense.attribute: "),
            "{failed:?}"
        );
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o7777, 0o640);
    }
}
