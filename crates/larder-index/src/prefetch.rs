//! Software prefetching: hints that start loading a cache line before it is read, so
//! that the misses of independent lookups overlap. Without effect on results; a no-op
//! on targets other than x86-64. Used by the cuckoo index and the disk index's cache.

const CACHE_LINE: usize = 64;

/// Asks the CPU to start loading the cache line that holds the start of `value`; a
/// hint with no effect on results.
pub fn prefetch_line<T>(value: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: prefetching is a hint; it never faults, whatever the address, and
        // does not read memory as far as the program can tell.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(value.as_ptr().cast::<i8>()) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = value;
}

/// Like [`prefetch_line`], for a value that may straddle two lines (an entry): the
/// second line is requested only when the value reaches into it.
pub fn prefetch_lines<T>(value: &[T]) {
    prefetch_line(value);
    let start = value.as_ptr() as usize;
    let end = start + size_of_val(value);
    if start / CACHE_LINE != (end - 1) / CACHE_LINE {
        if let Some(last) = value.len().checked_sub(1) {
            prefetch_line(&value[last..]);
        }
    }
}

/// Like [`prefetch_line`], for every line of `value`: a struct that a lookup reads
/// fields of all over (a partition's index, when a batch moves from one partition to
/// the next).
pub fn prefetch_value<T>(value: &T) {
    let start = value as *const T as usize;
    let end = start + size_of::<T>();
    let mut line = start - start % CACHE_LINE;
    while line < end {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            // SAFETY: as in `prefetch_line`; the address is inside or just before
            // `value`, and a prefetch never faults anyway.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(line as *const i8) }
        }
        line += CACHE_LINE;
    }
}
