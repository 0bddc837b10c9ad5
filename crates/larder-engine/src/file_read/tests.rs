use proptest::prelude::*;

use super::*;

/// A layout of chunks with raw lengths `lens`, each `(container, offset, stored_len)`
/// as `stored` gives it.
fn layout(lens: &[u32], stored: &[(u32, u32, u32)]) -> FileLayout {
    let mut end = 0;
    let ends = lens
        .iter()
        .map(|&l| {
            end += u64::from(l);
            end
        })
        .collect();
    let chunks = stored
        .iter()
        .zip(lens)
        .enumerate()
        .map(
            |(i, (&(container, offset, stored_len), &raw_len))| ChunkSpot {
                container,
                index: i as u32,
                offset,
                stored_len,
                raw_len,
                encoding: ChunkEncoding::Raw,
                fingerprint: Fingerprint([i as u8; 32]),
            },
        )
        .collect();
    FileLayout {
        path: "/f".into(),
        snapshot: "00000000".into(),
        ends,
        chunks,
        containers: Vec::new(),
        last_end: AtomicU64::new(0),
    }
}

#[test]
fn a_byte_range_maps_to_the_chunks_that_hold_it() {
    let f = layout(&[10, 20, 30], &[(0, 0, 10), (0, 10, 20), (0, 30, 30)]);
    assert_eq!(f.size(), 60);
    assert_eq!(f.span(0, 10), 0..1);
    assert_eq!(f.span(0, 11), 0..2);
    assert_eq!(f.span(9, 2), 0..2);
    assert_eq!(f.span(10, 20), 1..2);
    assert_eq!(f.span(29, 100), 1..3);
    assert_eq!(f.span(59, 1), 2..3);
    assert_eq!(f.span(60, 1), 0..0, "past the end");
    assert_eq!(f.span(5, 0), 0..0, "nothing asked");
    assert_eq!(f.span(u64::MAX, u64::MAX), 0..0);
    assert_eq!((f.start(0), f.start(1), f.start(2)), (0, 10, 30));
    assert_eq!(layout(&[], &[]).span(0, 4096), 0..0, "an empty file");
}

#[test]
fn a_run_stays_in_one_container_and_within_its_byte_bound() {
    let big = (RUN_BYTES / 2) as u32;
    let f = layout(
        &[1; 6],
        &[
            (0, 0, 100),
            (0, 100, 100),
            (1, 0, 100),
            (1, 100, big),
            (1, big + 100, big),
            (1, 2 * big + 100, 10),
        ],
    );
    assert_eq!(
        f.run_from(0, |_| false),
        vec![0, 1],
        "stops at another container"
    );
    assert_eq!(
        f.run_from(2, |_| false),
        vec![2, 3],
        "stops where the span passes the bound"
    );
    assert_eq!(f.run_from(4, |_| false), vec![4, 5]);
    let cached = Fingerprint([1; 32]);
    assert_eq!(
        f.run_from(0, |fp| *fp == cached),
        vec![0],
        "skips what is cached"
    );
    assert_eq!(
        f.run_from(1, |_| true),
        vec![1],
        "always the chunk asked for"
    );
}

#[test]
fn ranges_merge_across_small_gaps_only() {
    let ranges = [50..60, 0..10, 12..20, 200..210, 5..8];
    assert_eq!(
        merged_ranges(ranges.iter().cloned(), 0),
        vec![0..10, 12..20, 50..60, 200..210]
    );
    assert_eq!(
        merged_ranges(ranges.iter().cloned(), 2),
        vec![0..20, 50..60, 200..210]
    );
    assert_eq!(merged_ranges(ranges.iter().cloned(), 140), vec![0..210]);
}

proptest! {
    /// Reading the span of any range covers it exactly: the first chunk holds its
    /// first byte, the last its last byte.
    #[test]
    fn spans_cover_exactly_the_range(
        lens in proptest::collection::vec(1u32..50, 0..40),
        offset in 0u64..2100,
        len in 0u64..300,
    ) {
        let stored: Vec<_> = lens.iter().map(|_| (0, 0, 1)).collect();
        let f = layout(&lens, &stored);
        let span = f.span(offset, len);
        let end = (offset + len).min(f.size());
        if offset >= end {
            prop_assert!(span.is_empty());
        } else {
            prop_assert!(f.start(span.start) <= offset && offset < f.ends[span.start]);
            let last = span.end - 1;
            prop_assert!(f.start(last) < end && end <= f.ends[last]);
        }
    }
}
