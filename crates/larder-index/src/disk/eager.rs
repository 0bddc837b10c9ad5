//! Eager lookup, the DDFS-style baseline (docs/design/disk-index.md, "Lookup"): Bloom
//! filter, cache, insert buffer, then the disk at once, with a forward prefetch on a
//! hit.

use larder_hash::Fingerprint;

use super::io::IndexIo;
use super::DiskIndex;
use crate::Result;

impl<I: IndexIo, T> DiskIndex<I, T> {
    /// Looks up again, in submission order, the fingerprints queued behind a failed
    /// disk lookup; stops at the first error, leaving the queue in order.
    pub(super) fn finish_eager(&mut self) -> Result<()> {
        while let Some((fp, token)) = self.retry.pop_front() {
            if let Some(waiters) = self.pending.get_mut(&fp) {
                waiters.push(token);
                self.store.metrics.waited += 1;
                continue;
            }
            self.submit_eager(fp, token)?;
        }
        Ok(())
    }

    pub(super) fn submit_eager(&mut self, fp: Fingerprint, token: T) -> Result<()> {
        if self.bloom_says_new(&fp) {
            self.resolve_new(fp, token, Vec::new());
            return Ok(());
        }
        if let Some(location) = self.prelookup(&fp) {
            self.resolve_duplicate(fp, token, location);
            return Ok(());
        }
        match self.store.lookup_one(&fp) {
            Err(e) => {
                // Kept at the head of the queue, for `finish` (or the next submit) to
                // retry or `abandon` to hand back.
                self.retry.push_front((fp, token));
                return Err(e);
            }
            Ok(Some(found)) => {
                self.store.metrics.disk_found += 1;
                self.cache.insert(fp, found.location);
                self.resolve_duplicate(fp, token, found.location);
                let n = self.config.prefetch;
                self.prefetch(found.position..found.position.saturating_add(n))?;
            }
            Ok(None) => {
                self.store.metrics.bloom_false_positives += 1;
                self.resolve_new(fp, token, Vec::new());
            }
        }
        Ok(())
    }
}
