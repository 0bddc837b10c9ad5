//! File attribute flags (`chattr`, `lsattr`; Linux's `FS_IOC_GETFLAGS` and
//! `FS_IOC_SETFLAGS`), always on an open descriptor: read at backup, set at restore.
//! Only the flags of [`ATTR_FLAGS_KEPT`] are read or changed; a file system without
//! flags (tmpfs before Linux 6.0, FAT, most FUSE file systems) has none to read, which
//! is not an error.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use larder_store::ATTR_FLAGS_KEPT;

/// The flags of [`ATTR_FLAGS_KEPT`] that the file open as `fd` has; 0 where its file
/// system has no flags or refuses to say.
pub(crate) fn read_attr_flags(fd: &impl AsRawFd) -> u32 {
    get_flags(fd).map_or(0, |flags| flags & ATTR_FLAGS_KEPT)
}

/// The flags of the directory at `path` ([`open_dir`]); 0 where it cannot be opened
/// or has none.
pub(crate) fn read_dir_attr_flags(path: &Path) -> u32 {
    open_dir(path).map_or(0, |dir| read_attr_flags(&dir))
}

/// Gives the file open as `fd` the flags of [`ATTR_FLAGS_KEPT`] that `flags` has and
/// none of the others in that set, leaving every flag outside it as it is. Nothing
/// is set when they are already so (so a file system without flags takes a file that
/// has none).
pub(crate) fn set_attr_flags(fd: &impl AsRawFd, flags: u32) -> io::Result<()> {
    let wanted = flags & ATTR_FLAGS_KEPT;
    let current = match get_flags(fd) {
        Ok(current) => current,
        Err(_) if wanted == 0 => return Ok(()),
        Err(e) => return Err(e),
    };
    let new = (current & !ATTR_FLAGS_KEPT) | wanted;
    if new == current {
        return Ok(());
    }
    let arg = new as libc::c_int;
    // SAFETY: FS_IOC_SETFLAGS reads one int from the pointer, which is valid for the
    // call; a descriptor the request does not fit is an error return.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::FS_IOC_SETFLAGS, &arg) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn get_flags(fd: &impl AsRawFd) -> io::Result<u32> {
    let mut flags: libc::c_int = 0;
    // SAFETY: FS_IOC_GETFLAGS writes one int (the kernel's size, whatever the request
    // number's encoding says) to the pointer, which is valid for the call.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::FS_IOC_GETFLAGS, &mut flags) };
    if rc == 0 {
        Ok(flags as u32)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Opens the directory at `path` to read or set its flags, refusing a symlink in its
/// place.
pub(crate) fn open_dir(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(path)
}
