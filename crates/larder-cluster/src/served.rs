//! Which paths a job may touch (docs/design/cluster.md, "Security"): a path beneath
//! one the node serves (`larder node --serve`) and beneath one the client's
//! certificate grants, resolved from the served path's descriptor without following
//! any symlink (`openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`). A node that
//! serves no paths runs no backups or restores.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{openat2, Mode, OFlags, ResolveFlags};

use crate::rpc::{Grants, RpcError};
use crate::tls::is_plain_absolute;

/// How every name below a served path is resolved: never above it, never through a
/// symlink (so the lexical checks against the grants are exact).
const BENEATH: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS);

fn denied(message: String) -> RpcError {
    RpcError::PermissionDenied(message)
}

fn io_failed(path: &Path, e: impl std::fmt::Display) -> RpcError {
    RpcError::Handler {
        message: format!("{}: {e}", path.display()),
        retryable: false,
    }
}

/// The paths a node serves: absolute, made of plain names.
#[derive(Debug, Clone, Default)]
pub struct Served {
    roots: Vec<PathBuf>,
}

impl Served {
    /// The node serves `roots`; each must be an absolute path of plain names.
    pub fn new(roots: Vec<PathBuf>) -> Result<Self, String> {
        for root in &roots {
            if !is_plain_absolute(root) {
                return Err(format!(
                    "served path {}: give an absolute path without '.' or '..'",
                    root.display()
                ));
            }
        }
        Ok(Self { roots })
    }

    /// The served root `path` lies beneath, and `path` relative to it, once `path`
    /// is also beneath one of `grants`.
    fn authorize<'a>(
        &'a self,
        grants: &Grants,
        path: &'a Path,
    ) -> Result<(&'a Path, &'a Path), RpcError> {
        if !is_plain_absolute(path) {
            return Err(denied(format!(
                "{}: a job's paths are absolute, without '.' or '..'",
                path.display()
            )));
        }
        let root = self
            .roots
            .iter()
            .filter(|root| path.starts_with(root))
            .max_by_key(|root| root.components().count())
            .ok_or_else(|| {
                denied(format!(
                    "{} is not beneath a path this node serves",
                    path.display()
                ))
            })?;
        if let Grants::Paths(granted) = grants {
            if !granted.iter().any(|g| path.starts_with(g)) {
                return Err(denied(format!(
                    "{} is not beneath a path the client's certificate grants",
                    path.display()
                )));
            }
        }
        let rel = path.strip_prefix(root).unwrap_or(Path::new(""));
        Ok((root, rel))
    }

    /// Checks that a backup may read `path`: authorized, and every name below its
    /// served root resolves beneath it without a symlink (the last one may be one: a
    /// backup records a symlink source as a symlink).
    pub fn check_source(&self, grants: &Grants, path: &Path) -> Result<(), RpcError> {
        let (root, rel) = self.authorize(grants, path)?;
        let root_fd = open_root(root)?;
        if rel.as_os_str().is_empty() {
            return Ok(());
        }
        openat2(
            &root_fd,
            rel,
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
            BENEATH,
        )
        .map(drop)
        .map_err(|e| match e {
            rustix::io::Errno::NOENT => io_failed(path, "no such file or directory"),
            e => denied(format!(
                "{}: not reachable beneath {} without following a symlink ({e})",
                path.display(),
                root.display()
            )),
        })
    }

    /// Opens restore target `path` as a directory, creating what is missing (0700),
    /// every name resolved beneath its served root without a symlink. The restore
    /// then writes through this descriptor (`/proc/self/fd/N`), never the path again.
    pub fn open_target(&self, grants: &Grants, path: &Path) -> Result<OwnedFd, RpcError> {
        let (root, rel) = self.authorize(grants, path)?;
        let mut dir = open_root(root)?;
        let dir_flags = OFlags::DIRECTORY | OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        for name in rel.components() {
            let name = name.as_os_str();
            let next = match openat2(&dir, name, dir_flags, Mode::empty(), BENEATH) {
                Err(rustix::io::Errno::NOENT) => {
                    match rustix::fs::mkdirat(&dir, name, Mode::from_raw_mode(0o700)) {
                        Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                        Err(e) => return Err(io_failed(path, e)),
                    }
                    openat2(&dir, name, dir_flags, Mode::empty(), BENEATH)
                }
                other => other,
            };
            dir = next.map_err(|e| {
                denied(format!(
                    "{}: not a directory reachable beneath {} without following a symlink ({e})",
                    path.display(),
                    root.display()
                ))
            })?;
        }
        Ok(dir)
    }
}

/// A served root, opened as a directory (the administrator named it: it is followed
/// as given).
fn open_root(root: &Path) -> Result<OwnedFd, RpcError> {
    rustix::fs::open(
        root,
        OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| io_failed(root, format!("the served path: {e}")))
}

/// The path through which a process reaches the directory `fd` itself.
pub fn fd_path(fd: &OwnedFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `served/a/x`, `served/ab/y`, and `served/a/link` -> `../ab`: a symlink that
    /// stays beneath the served path but leaves the grant.
    fn tree() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let served = dir.path().join("served");
        std::fs::create_dir_all(served.join("a")).unwrap();
        std::fs::create_dir_all(served.join("ab")).unwrap();
        std::fs::write(served.join("a/x"), b"x").unwrap();
        std::fs::write(served.join("ab/y"), b"y").unwrap();
        std::os::unix::fs::symlink("../ab", served.join("a/link")).unwrap();
        (dir, served)
    }

    fn denied(result: Result<(), RpcError>) -> bool {
        matches!(result, Err(RpcError::PermissionDenied(_)))
    }

    #[test]
    fn grants_are_whole_components_and_no_symlink_is_followed() {
        let (_dir, served) = tree();
        let node = Served::new(vec![served.clone()]).unwrap();
        let grants = Grants::Paths(vec![served.join("a")]);
        node.check_source(&grants, &served.join("a/x")).unwrap();
        // A symlink as the last name is backed up as one.
        node.check_source(&grants, &served.join("a/link")).unwrap();
        assert!(denied(node.check_source(&grants, &served.join("ab/y"))));
        assert!(denied(node.check_source(&grants, &served.join("a/link/y"))));
        assert!(denied(
            node.check_source(&grants, &served.join("a/../ab/y"))
        ));
        assert!(denied(node.check_source(&grants, Path::new("relative"))));
        assert!(denied(
            node.check_source(&Grants::Served, Path::new("/etc/passwd"))
        ));
        // No served path: nothing.
        assert!(denied(
            Served::default().check_source(&Grants::Served, &served.join("a/x"))
        ));
    }

    #[test]
    fn a_restore_target_is_made_and_opened_beneath_without_symlinks() {
        let (_dir, served) = tree();
        let node = Served::new(vec![served.clone()]).unwrap();
        let grants = Grants::Paths(vec![served.join("a")]);
        let fd = node
            .open_target(&grants, &served.join("a/new/deeper"))
            .unwrap();
        assert_eq!(
            std::fs::canonicalize(fd_path(&fd)).unwrap(),
            std::fs::canonicalize(served.join("a/new/deeper")).unwrap()
        );
        let through_link = node.open_target(&grants, &served.join("a/link/z"));
        assert!(matches!(through_link, Err(RpcError::PermissionDenied(_))));
        assert!(!served.join("ab/z").exists());
        let beside = node.open_target(&grants, &served.join("ab"));
        assert!(matches!(beside, Err(RpcError::PermissionDenied(_))));
    }
}
