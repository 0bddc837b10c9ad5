//! Extents: what a generation is made of. A generation is planned as a list of
//! extents first (cheap: a few per run), then rendered into bytes; the plan of
//! generation k is what generation k + 1's BR runs copy from.

use crate::model::BLOCK;

/// Where an extent's bytes come from: the blocks `first`, `first + 1`, ... of one
/// source (a pool index wraps around the pool), starting `offset` bytes into `first`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// Unique blocks, by global id; each id's 4 KiB are a function of the seed and id.
    Unique,
    /// Pool blocks, by index into the pool.
    Pool,
}

/// Invariant: `offset < BLOCK` and `len > 0`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub source: Source,
    pub first: u64,
    pub offset: u32,
    pub len: u64,
}

impl Extent {
    /// The bytes `from..from + len` of this extent, as an extent of the same source.
    pub fn slice(&self, from: u64, len: u64) -> Extent {
        debug_assert!(from + len <= self.len && len > 0);
        let at = u64::from(self.offset) + from;
        Extent {
            source: self.source,
            first: self.first + at / BLOCK,
            offset: (at % BLOCK) as u32,
            len,
        }
    }
}

/// A generation's extents with their start offsets, for finding the extent at an
/// offset by binary search. Invariant: `starts[i]` is the sum of the lengths before
/// extent i, and `len` the sum of all.
#[derive(Clone, Debug, Default)]
pub struct Layout {
    extents: Vec<Extent>,
    starts: Vec<u64>,
    len: u64,
}

impl Layout {
    pub fn push(&mut self, e: Extent) {
        self.starts.push(self.len);
        self.len += e.len;
        self.extents.push(e);
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn extents(&self) -> &[Extent] {
        &self.extents
    }

    /// Appends to `out` the extents that make up the bytes `from..from + len` of this
    /// layout (`from + len <= self.len()`).
    pub fn copy_range(&self, from: u64, len: u64, out: &mut Layout) {
        debug_assert!(from + len <= self.len);
        let mut i = self.starts.partition_point(|&s| s <= from) - 1;
        let mut at = from;
        let end = from + len;
        while at < end {
            let e = &self.extents[i];
            let inner = at - self.starts[i];
            let take = (e.len - inner).min(end - at);
            out.push(e.slice(inner, take));
            at += take;
            i += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unique(first: u64, offset: u32, len: u64) -> Extent {
        Extent {
            source: Source::Unique,
            first,
            offset,
            len,
        }
    }

    #[test]
    fn slice_carries_the_offset_into_later_blocks() {
        let e = unique(10, 100, 3 * BLOCK);
        assert_eq!(e.slice(BLOCK, 5), unique(11, 100, 5));
        assert_eq!(e.slice(BLOCK - 100, 5), unique(11, 0, 5));
        assert_eq!(e.slice(2 * BLOCK - 50, 5), unique(12, 50, 5));
    }

    #[test]
    fn copy_range_spans_extents() {
        let mut l = Layout::default();
        l.push(unique(0, 0, 10));
        l.push(unique(100, 0, 20));
        l.push(unique(200, 7, 30));
        let mut out = Layout::default();
        l.copy_range(5, 40, &mut out);
        assert_eq!(
            out.extents(),
            &[unique(0, 5, 5), unique(100, 0, 20), unique(200, 7, 15)]
        );
        assert_eq!(out.len(), 40);
        let mut one = Layout::default();
        l.copy_range(10, 1, &mut one);
        assert_eq!(one.extents(), &[unique(100, 0, 1)]);
    }
}
