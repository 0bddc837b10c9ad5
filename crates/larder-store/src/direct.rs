//! Writing large files with `O_DIRECT`, so that container data goes from our buffer to
//! the device without being copied into the page cache (which cost about a quarter of
//! a backup's CPU time in profiles; docs/performance.md). Falls back to ordinary
//! buffered writes where the filesystem refuses `O_DIRECT` (tmpfs, some FUSE mounts).

use std::alloc::{self, Layout};
use std::cell::RefCell;
use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;

/// Alignment `O_DIRECT` needs for buffer address, length and file offset (the largest
/// logical block size in common use).
const ALIGN: usize = 4096;

/// A heap buffer aligned to [`ALIGN`].
struct AlignedBuf {
    ptr: *mut u8,
    cap: usize,
}

impl AlignedBuf {
    fn with_capacity(cap: usize) -> Option<Self> {
        let layout = Layout::from_size_align(cap.max(ALIGN), ALIGN).ok()?;
        // SAFETY: the layout has non-zero size.
        let ptr = unsafe { alloc::alloc_zeroed(layout) };
        (!ptr.is_null()).then_some(Self {
            ptr,
            cap: layout.size(),
        })
    }

    fn slice_mut(&mut self, len: usize) -> &mut [u8] {
        assert!(len <= self.cap);
        // SAFETY: `ptr` points to `cap` initialized (zeroed) bytes owned by `self`, and
        // `&mut self` guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `with_capacity` with exactly this layout.
        unsafe { alloc::dealloc(self.ptr, Layout::from_size_align_unchecked(self.cap, ALIGN)) }
    }
}

thread_local! {
    /// Each writing thread reuses one buffer, grown as needed.
    static BUFFER: RefCell<Option<AlignedBuf>> = const { RefCell::new(None) };
}

fn set_direct(file: &File, on: bool) -> io::Result<()> {
    let fd = file.as_raw_fd();
    // SAFETY: F_GETFL/F_SETFL on a file descriptor we own; no pointers involved.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    let flags = if on {
        flags | libc::O_DIRECT
    } else {
        flags & !libc::O_DIRECT
    };
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Creates `path` (which must not exist) holding `data`, durable on return (data and
/// size; the caller fsyncs the directory after renaming).
pub(crate) fn write_durable(path: &Path, data: &[u8]) -> io::Result<()> {
    let mut file = crate::backend::private_file_options()
        .create_new(true)
        .open(path)?;
    let aligned = data.len() / ALIGN * ALIGN;
    let mut done = 0;
    if aligned >= 16 * ALIGN && set_direct(&file, true).is_ok() {
        let direct = BUFFER.with(|cell| -> io::Result<()> {
            let mut slot = cell.borrow_mut();
            if slot.as_ref().is_none_or(|b| b.cap < aligned) {
                *slot = Some(AlignedBuf::with_capacity(aligned).ok_or(io::ErrorKind::OutOfMemory)?);
            }
            let buf = slot
                .as_mut()
                .map(|b| b.slice_mut(aligned))
                .ok_or(io::ErrorKind::OutOfMemory)?;
            buf.copy_from_slice(&data[..aligned]);
            file.write_all_at(buf, 0)
        });
        match direct {
            Ok(()) => done = aligned,
            // EINVAL: this filesystem does not do O_DIRECT after all; write buffered.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
            Err(e) => return Err(e),
        }
        set_direct(&file, false)?;
    }
    file.write_all_at(&data[done..], done as u64)?;
    file.flush()?;
    file.sync_data()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_every_length_exactly() {
        let dir = tempfile::tempdir().unwrap();
        for len in [
            0,
            1,
            ALIGN - 1,
            ALIGN,
            16 * ALIGN,
            16 * ALIGN + 1,
            40 * ALIGN + 123,
            1 << 20,
        ] {
            let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4096) as u8).collect();
            let path = dir.path().join(format!("f{len}"));
            write_durable(&path, &data).unwrap();
            assert_eq!(std::fs::read(&path).unwrap(), data, "length {len}");
        }
    }
}
