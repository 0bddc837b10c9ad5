//! The metadata a tree entry records besides `lstat`'s: reading owner names and
//! extended attributes (POSIX ACLs are the attributes `system.posix_acl_access` and
//! `system.posix_acl_default`) for backup, here; file attribute flags, in
//! `attr_flags`; setting owner, attributes, mode, times and flags on what restore
//! creates, in `apply`.

mod apply;
mod attr_flags;

pub(crate) use apply::{restore_metadata, Node, OwnerPolicy};
pub(crate) use attr_flags::{read_attr_flags, read_dir_attr_flags};

use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use larder_store::Xattr;

/// User and group names by id, each looked up once (`getpwuid_r`, `getgrgid_r`).
#[derive(Default)]
pub(crate) struct Owners {
    users: HashMap<u32, Vec<u8>>,
    groups: HashMap<u32, Vec<u8>>,
}

impl Owners {
    /// The name of user `uid`, empty when it has none.
    pub fn user(&mut self, uid: u32) -> Vec<u8> {
        self.users
            .entry(uid)
            .or_insert_with(|| larder_store::user_name(uid))
            .clone()
    }

    /// The name of group `gid`, empty when it has none.
    pub fn group(&mut self, gid: u32) -> Vec<u8> {
        self.groups
            .entry(gid)
            .or_insert_with(|| larder_store::group_name(gid))
            .clone()
    }
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path holds a NUL byte"))
}

/// Calls `fill(buf)` (a listxattr or getxattr call: a length, or -1 and errno) with
/// a buffer of the size the call reports, again while the value grows under it.
/// `Ok(None)` when the call fails with `ENODATA` (the attribute went away).
fn sized_call(mut fill: impl FnMut(&mut [u8]) -> isize) -> io::Result<Option<Vec<u8>>> {
    loop {
        let len = fill(&mut []);
        if len < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::ENODATA) => Ok(None),
                _ => Err(e),
            };
        }
        if len == 0 {
            return Ok(Some(Vec::new()));
        }
        let mut buf = vec![0u8; len as usize];
        let got = fill(&mut buf);
        if got >= 0 {
            buf.truncate(got as usize);
            return Ok(Some(buf));
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::ERANGE) => continue,
            Some(libc::ENODATA) => return Ok(None),
            _ => return Err(e),
        }
    }
}

/// The extended attributes of `path` itself (never of a symlink's target), names
/// ascending. A file system without attributes gives none; an attribute that
/// vanishes while it is read is left out; any other failure is an error.
pub fn read_xattrs(path: &Path) -> io::Result<Vec<Xattr>> {
    let c = c_path(path)?;
    let list = sized_call(|buf| {
        // SAFETY: `c` is NUL-terminated; `buf` is valid for `buf.len()` bytes (a null
        // pointer with length 0 asks for the size).
        unsafe { libc::llistxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) }
    });
    let list = match list {
        Ok(list) => list.unwrap_or_default(),
        Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut xattrs = Vec::new();
    for name in list.split(|&b| b == 0).filter(|n| !n.is_empty()) {
        // Names are at most 255 bytes on Linux (XATTR_NAME_MAX); the tree's layout
        // relies on it.
        if name.len() > 255 {
            continue;
        }
        let cname = CString::new(name).expect("split on NUL");
        let value = sized_call(|buf| {
            // SAFETY: as above, for the path and the attribute name.
            unsafe {
                libc::lgetxattr(
                    c.as_ptr(),
                    cname.as_ptr(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                )
            }
        })
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("{}: {e}", crate::names::escape_name(name)),
            )
        })?;
        if let Some(value) = value {
            xattrs.push(Xattr {
                name: name.to_vec(),
                value,
            });
        }
    }
    xattrs.sort();
    xattrs.dedup_by(|a, b| a.name == b.name);
    Ok(xattrs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_and_its_group_have_names() {
        let mut owners = Owners::default();
        assert_eq!(owners.user(0), b"root");
        assert_eq!(owners.group(0), b"root");
        // An id nobody has.
        assert!(owners.user(0x7fff_fff0).is_empty());
    }

    #[test]
    fn user_attributes_read_back_sorted() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("f");
        std::fs::write(&f, b"x").unwrap();
        let c = c_path(&f).unwrap();
        for (name, value) in [("user.b", &b"2"[..]), ("user.a", b"\x00\xff")] {
            let n = CString::new(name).unwrap();
            // SAFETY: valid NUL-terminated strings and a value buffer of its length.
            let rc = unsafe {
                libc::lsetxattr(
                    c.as_ptr(),
                    n.as_ptr(),
                    value.as_ptr().cast(),
                    value.len(),
                    0,
                )
            };
            if rc != 0 {
                // The temporary directory's file system takes no user attributes.
                return;
            }
        }
        let got = read_xattrs(&f).unwrap();
        assert_eq!(
            got,
            vec![
                Xattr {
                    name: b"user.a".to_vec(),
                    value: b"\x00\xff".to_vec()
                },
                Xattr {
                    name: b"user.b".to_vec(),
                    value: b"2".to_vec()
                },
            ]
        );
    }
}
