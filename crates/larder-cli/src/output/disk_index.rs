//! A backup's disk index counters (the Lazy Exact Deduplication paper's Tables IV, V
//! and VII): in `backup --json`, in the file `stats --index` reads them back from, and
//! as the text `stats --index` shows.

use std::io::{self, Write};

use larder_index::disk::DiskIndexMetrics;
use larder_store::Repository;
use serde::Serialize;
use serde_json::Value;

use super::secs;

/// The counters as JSON: answers by component, I/Os and bytes, hit rates, Bloom false
/// positives, seconds per component.
#[derive(Serialize)]
pub struct DiskIndexCounters {
    fingerprints: u64,
    answered: Answered,
    prelookups: u64,
    prelookup_hit_rate: f64,
    postlookups: u64,
    postlookup_hit_rate: f64,
    buffered: u64,
    batches: u64,
    disk_lookups: u64,
    lookup_ios: u64,
    lookup_bytes: u64,
    prefetches: u64,
    prefetch_ios: u64,
    prefetch_bytes: u64,
    prefetched_records: u64,
    bloom_false_positives: u64,
    bloom_false_positive_rate: f64,
    flushes: u64,
    merges: u64,
    flush_reads: u64,
    flush_writes: u64,
    flush_bytes_written: u64,
    seconds: Seconds,
}

/// Which component answered each fingerprint.
#[derive(Serialize)]
struct Answered {
    bloom: u64,
    prelookup: u64,
    insert_buffer: u64,
    waiting: u64,
    postlookup: u64,
    disk: u64,
}

#[derive(Serialize)]
struct Seconds {
    bloom: f64,
    prelookup: f64,
    disk_lookup: f64,
    prefetch: f64,
    postlookup: f64,
    flush: f64,
    /// Inside the index's calls, but in none of the components above.
    other: f64,
    total: f64,
}

impl From<&DiskIndexMetrics> for DiskIndexCounters {
    fn from(m: &DiskIndexMetrics) -> Self {
        let t = &m.time;
        let other = t.total.saturating_sub(
            t.bloom + t.prelookup + t.disk_lookup + t.prefetch + t.postlookup + t.flush,
        );
        Self {
            fingerprints: m.submitted,
            answered: Answered {
                bloom: m.bloom_new,
                prelookup: m.prelookup_hits,
                insert_buffer: m.insert_buffer_hits,
                waiting: m.waited,
                postlookup: m.postlookup_hits,
                disk: m.disk_found + m.bloom_false_positives,
            },
            prelookups: m.prelookups,
            prelookup_hit_rate: m.prelookup_hit_rate(),
            postlookups: m.postlookups,
            postlookup_hit_rate: m.postlookup_hit_rate(),
            buffered: m.buffered,
            batches: m.batches,
            disk_lookups: m.disk_lookups,
            lookup_ios: m.lookup_ios,
            lookup_bytes: m.lookup_bytes,
            prefetches: m.prefetches,
            prefetch_ios: m.prefetch_ios,
            prefetch_bytes: m.prefetch_bytes,
            prefetched_records: m.prefetched_records,
            bloom_false_positives: m.bloom_false_positives,
            bloom_false_positive_rate: m.bloom_false_positives as f64
                / (m.submitted - m.bloom_new).max(1) as f64,
            flushes: m.flushes,
            merges: m.merges,
            flush_reads: m.flush_reads,
            flush_writes: m.flush_writes,
            flush_bytes_written: m.flush_bytes_written,
            seconds: Seconds {
                bloom: secs(t.bloom),
                prelookup: secs(t.prelookup),
                disk_lookup: secs(t.disk_lookup),
                prefetch: secs(t.prefetch),
                postlookup: secs(t.postlookup),
                flush: secs(t.flush),
                other: secs(other),
                total: secs(t.total),
            },
        }
    }
}

/// Records a backup's disk index counters for `stats --index` (sealed in an encrypted
/// repository); a failure to write them is ignored: the backup is committed, and the
/// record is informational only, never read for correctness (docs/design/format.md,
/// "Disk index").
pub fn save_last_backup(repo: &Repository, counters: &DiskIndexCounters) {
    if let Ok(value) = serde_json::to_value(counters) {
        let _ = repo.save_last_backup_counters(value.to_string().as_bytes());
    }
}

/// The last backup's counters as that backup wrote them (any larder version), if any.
pub fn last_backup(repo: &Repository) -> Option<Value> {
    serde_json::from_slice(&repo.last_backup_counters()?).ok()
}

/// The counters of [`last_backup`] as text, one line per group; a field the file lacks
/// shows as 0.
pub fn write_counters_text(w: &mut dyn Write, m: &Value) -> io::Result<()> {
    let n = |k: &str| m.get(k).and_then(Value::as_f64).unwrap_or(0.0);
    let a = |k: &str| m["answered"].get(k).and_then(Value::as_f64).unwrap_or(0.0);
    let t = |k: &str| 1e3 * m["seconds"].get(k).and_then(Value::as_f64).unwrap_or(0.0);
    writeln!(w, "    fingerprints     {}", n("fingerprints"))?;
    writeln!(
        w,
        "    answered by      bloom {} | prelookup {} | insert buffer {} | waiting {} | postlookup {} | disk {}",
        a("bloom"), a("prelookup"), a("insert_buffer"), a("waiting"), a("postlookup"), a("disk")
    )?;
    writeln!(
        w,
        "    hit rates        prelookup {:.1}% of {} | postlookup {:.1}% of {}",
        100.0 * n("prelookup_hit_rate"),
        n("prelookups"),
        100.0 * n("postlookup_hit_rate"),
        n("postlookups")
    )?;
    writeln!(
        w,
        "    on-disk lookup   {} fingerprints, {} I/Os, {} bytes ({} batches)",
        n("disk_lookups"),
        n("lookup_ios"),
        n("lookup_bytes"),
        n("batches")
    )?;
    writeln!(
        w,
        "    prefetch         {} prefetches, {} I/Os, {} bytes, {} records",
        n("prefetches"),
        n("prefetch_ios"),
        n("prefetch_bytes"),
        n("prefetched_records")
    )?;
    writeln!(
        w,
        "    bloom            {} false positives ({:.4}% of the fingerprints it passed)",
        n("bloom_false_positives"),
        100.0 * n("bloom_false_positive_rate")
    )?;
    writeln!(
        w,
        "    flush            {} flushes ({} merges of runs into the table), {} page reads, {} writes, {} bytes",
        n("flushes"),
        n("merges"),
        n("flush_reads"),
        n("flush_writes"),
        n("flush_bytes_written")
    )?;
    writeln!(
        w,
        "    time (ms)        bloom {:.1} | prelookup {:.1} | on-disk lookup {:.1} | prefetch {:.1} | postlookup {:.1} | flush {:.1} | other {:.1} | total {:.1}",
        t("bloom"), t("prelookup"), t("disk_lookup"), t("prefetch"), t("postlookup"), t("flush"), t("other"), t("total")
    )
}
