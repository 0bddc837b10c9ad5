//! Buffers for the blocks stage 1 reads large files into.
//!
//! A backup of one large file touches fresh memory for every block in flight, and on
//! Linux each first touch of a 4 KiB page is a page fault that the kernel must also
//! zero-fill: reading a 59 MB tarball into 4 KiB pages cost about as much CPU as
//! chunking it (docs/performance.md, "Backup: where the time goes"). Two measures:
//! block buffers ask for transparent huge pages (one fault per 2 MiB where the kernel
//! allows it, `transparent_hugepage=madvise` or `always`), and file bytes are read
//! straight into a buffer's spare capacity, so they are never zero-filled in user space
//! first.

use std::io;
use std::os::fd::AsRawFd;

/// Bytes of a transparent huge page on x86-64 and most aarch64 kernels.
const HUGE_PAGE: usize = 2 << 20;

/// An empty buffer with room for `capacity` bytes, its memory advised as huge pages.
pub(crate) fn block_buffer(capacity: usize) -> Vec<u8> {
    let buf = Vec::with_capacity(capacity);
    advise_huge_pages(&buf);
    buf
}

/// Asks the kernel to back the whole 2 MiB pages inside `buf`'s allocation with
/// transparent huge pages. Advice only: it changes no byte, and failure (an old kernel,
/// THP off) leaves ordinary pages.
#[cfg(target_os = "linux")]
fn advise_huge_pages(buf: &Vec<u8>) {
    let start = buf.as_ptr() as usize;
    let end = start + buf.capacity();
    let aligned_start = start.next_multiple_of(HUGE_PAGE);
    let aligned_end = end - end % HUGE_PAGE;
    if aligned_end > aligned_start {
        // SAFETY: the range lies inside `buf`'s live allocation, and MADV_HUGEPAGE only
        // changes how its pages are backed, never their contents or mapping.
        unsafe {
            libc::madvise(
                aligned_start as *mut libc::c_void,
                aligned_end - aligned_start,
                libc::MADV_HUGEPAGE,
            );
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn advise_huge_pages(_buf: &Vec<u8>) {}

/// Reads at most `max` bytes from `file` (a file or a pipe), appending them to `buf`
/// without initializing the spare capacity first. Returns the count read, 0 at the end
/// of the file; retries reads interrupted by a signal.
pub(crate) fn read_append(file: &impl AsRawFd, buf: &mut Vec<u8>, max: usize) -> io::Result<usize> {
    buf.reserve(max);
    let len = buf.len();
    loop {
        // SAFETY: `reserve` made `max` bytes of capacity available after `len`; read(2)
        // writes at most `max` bytes there, and exactly `n` of them are marked
        // initialized below.
        let n = unsafe {
            libc::read(
                file.as_raw_fd(),
                buf.as_mut_ptr().add(len).cast::<libc::c_void>(),
                max,
            )
        };
        if n >= 0 {
            let n = n as usize;
            // SAFETY: the kernel initialized `buf[len..len + n]`, within the capacity.
            unsafe { buf.set_len(len + n) };
            return Ok(n);
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;
    use std::io::Write;

    #[test]
    fn read_append_reads_a_file_exactly_in_any_step() {
        let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        let mut tmp = tempfile::NamedTempFile::new().unwrap();
        tmp.write_all(&data).unwrap();
        for step in [1, 4095, 65536, 1 << 20] {
            let file = File::open(tmp.path()).unwrap();
            let mut buf = block_buffer(16);
            buf.extend_from_slice(b"prefix");
            loop {
                match read_append(&file, &mut buf, step).unwrap() {
                    0 => break,
                    n => assert!(n <= step),
                }
            }
            assert_eq!(&buf[..6], b"prefix");
            assert!(buf[6..] == data[..], "step {step}");
        }
    }

    #[test]
    fn block_buffer_is_empty_with_the_capacity_asked() {
        let buf = block_buffer(9 << 20);
        assert!(buf.is_empty());
        assert!(buf.capacity() >= 9 << 20);
    }
}
