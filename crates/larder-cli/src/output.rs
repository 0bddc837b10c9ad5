//! What the CLI prints: text for people, JSON for scripts, progress bars on a terminal.

mod browse;
mod gc;

use std::io::IsTerminal;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use larder_bench::disk_index::{report_tables, DiskIndexResults};
use larder_bench::plot::{format_size, PlotFile};
use larder_bench::report;
use larder_bench::report_all::ReportResults;
use larder_bench::stream::ChunkFilesReport;
use larder_bench::ChunkBenchReport;
use larder_engine::{BackupSummary, CheckReport, Progress, RestoreSummary, Warning};
use larder_index::disk::DiskIndexMetrics;
use larder_store::{RepoConfig, Repository, Snapshot};
use serde_json::json;

pub struct Output {
    json: bool,
    quiet: bool,
}

fn mb(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

fn secs(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e4).round() / 1e4
}

impl Output {
    pub fn new(json: bool, quiet: bool) -> Self {
        Self { json, quiet }
    }

    pub fn is_json(&self) -> bool {
        self.json
    }

    fn text(&self) -> bool {
        !self.json && !self.quiet
    }

    pub fn error(&self, e: &anyhow::Error) {
        if self.json {
            println!("{}", json!({ "error": format!("{e:#}") }));
        }
        eprintln!("larder: error: {e:#}");
    }

    /// Reports a usage error (bad arguments): nothing was done. Returns exit code 2,
    /// the code clap uses for the errors it catches itself.
    pub fn usage(&self, msg: &str) -> ExitCode {
        if self.json {
            println!("{}", json!({ "error": msg }));
        }
        eprintln!("larder: error: {msg}");
        ExitCode::from(2)
    }

    /// Names a problem that did not stop the command (its exit code says so).
    pub fn error_line(&self, msg: &str) {
        eprintln!("larder: error: {msg}");
    }

    pub fn warn(&self, msg: &str) {
        eprintln!("larder: warning: {msg}");
    }

    pub fn note(&self, msg: &str) {
        if !self.quiet {
            eprintln!("larder: {msg}");
        }
    }

    pub fn init_done(&self, path: &Path, config: &RepoConfig) {
        if self.json {
            println!("{}", json!({ "repository": path, "config": config }));
        } else if !self.quiet {
            let c = &config.chunker;
            println!(
                "created repository {} at {} ({} {}/{}/{} level {}, {}, compression {})",
                config.id,
                path.display(),
                c.kind.name(),
                c.min_size,
                c.avg_size,
                c.max_size,
                c.level,
                config.hash.name(),
                config.compression.name()
            );
        }
    }

    pub fn backup_done(&self, s: &BackupSummary) {
        let t = &s.stages;
        if self.json {
            println!(
                "{}",
                json!({
                    "snapshot": s.snapshot_id,
                    "files": s.files, "dirs": s.dirs, "symlinks": s.symlinks,
                    "bytes_in": s.bytes_in, "bytes_new": s.bytes_new,
                    "bytes_new_stored": s.bytes_new_stored, "bytes_stored": s.bytes_stored,
                    "dedup_ratio": s.dedup_ratio(), "compression_ratio": s.compression_ratio(),
                    "overall_ratio": s.overall_ratio(),
                    "chunks": s.chunks, "chunks_new": s.chunks_new,
                    "containers_written": s.containers_written,
                    "excluded": s.excluded,
                    "seconds": secs(s.elapsed), "mb_per_sec": s.mb_per_sec(),
                    "stage_seconds": {
                        "walk": secs(t.walk), "chunk": secs(t.chunk), "fingerprint": secs(t.fingerprint),
                        "index": secs(t.index), "compress": secs(t.compress), "write": secs(t.write),
                        "sync": secs(t.sync),
                    },
                    "warnings": s.warnings,
                    "disk_index": s.disk_index.as_ref().map(disk_metrics_json),
                })
            );
            return;
        }
        if self.quiet {
            return;
        }
        println!("snapshot {} saved", &s.snapshot_id[..8]);
        println!(
            "  files       {} files, {} dirs, {} symlinks, {} in",
            s.files,
            s.dirs,
            s.symlinks,
            mb(s.bytes_in)
        );
        if s.excluded > 0 {
            println!(
                "  excluded    {} entries (matched --exclude, --exclude-file or .larderignore; not read)",
                s.excluded
            );
        }
        println!(
            "  new         {} after dedup, {} after compression ({} with metadata)",
            mb(s.bytes_new),
            mb(s.bytes_new_stored),
            mb(s.bytes_stored)
        );
        println!(
            "  ratios      dedup {:.2}x, compression {:.2}x, overall {:.2}x (input / repository growth)",
            s.dedup_ratio(),
            s.compression_ratio(),
            s.overall_ratio()
        );
        println!(
            "  chunks      {} ({} new) in {} new containers",
            s.chunks, s.chunks_new, s.containers_written
        );
        println!(
            "  time        {:.3} s, {:.0} MB/s",
            s.elapsed.as_secs_f64(),
            s.mb_per_sec()
        );
        println!(
            "  stages      walk {:.3} s, chunk {:.3} s, fingerprint {:.3} s (all threads), index {:.3} s, compress {:.3} s (all threads), write {:.3} s, sync {:.3} s",
            secs(t.walk),
            secs(t.chunk),
            secs(t.fingerprint),
            secs(t.index),
            secs(t.compress),
            secs(t.write),
            secs(t.sync)
        );
        if let Some(m) = &s.disk_index {
            println!("  disk index");
            for line in m.to_string().lines() {
                println!("    {line}");
            }
        }
        self.warnings(&s.warnings);
    }

    fn warnings(&self, warnings: &[Warning]) {
        let errors = warnings.iter().filter(|w| w.is_error).count();
        if errors > 0 {
            println!("  {errors} path(s) could not be processed (see warnings above)");
        }
    }

    pub fn restore_done(&self, s: &RestoreSummary) {
        if self.json {
            println!(
                "{}",
                json!({
                    "snapshot": s.snapshot_id, "files": s.files, "dirs": s.dirs, "symlinks": s.symlinks,
                    "bytes": s.bytes, "filtered_out": s.filtered_out, "reads": s.reads,
                    "container_reads_per_mb": s.container_reads_per_mb(),
                    "seconds": secs(s.elapsed), "warnings": s.warnings,
                })
            );
        } else if self.text() {
            println!(
                "restored snapshot {}: {} files, {} dirs, {} symlinks, {} in {:.3} s",
                &s.snapshot_id[..8],
                s.files,
                s.dirs,
                s.symlinks,
                mb(s.bytes),
                s.elapsed.as_secs_f64()
            );
            let r = &s.reads;
            println!(
                "  read {} containers in {} reads ({} distinct; {} tables, {} for the tree), {}: {:.3} container reads per MB restored",
                r.container_reads,
                r.range_reads,
                r.distinct_containers,
                r.table_reads,
                r.tree_container_reads,
                mb(r.bytes_read),
                s.container_reads_per_mb()
            );
            if s.filtered_out > 0 {
                println!(
                    "  {} entries not selected by --include/--exclude",
                    s.filtered_out
                );
            }
            self.warnings(&s.warnings);
        }
    }

    pub fn snapshots(&self, snapshots: &[(String, Snapshot)]) {
        if self.json {
            let list: Vec<_> = snapshots
                .iter()
                .map(|(id, s)| json!({ "id": id, "snapshot": s }))
                .collect();
            println!("{}", serde_json::Value::Array(list));
            return;
        }
        if self.quiet {
            return;
        }
        println!(
            "{:<10} {:<20} {:<16} {:>12}  paths",
            "id", "time", "host", "size"
        );
        for (id, s) in snapshots {
            let time = s.time.get(..19).unwrap_or(&s.time).replace('T', " ");
            println!(
                "{:<10} {:<20} {:<16} {:>12}  {}",
                &id[..8],
                time,
                s.hostname,
                mb(s.summary.bytes_in),
                s.paths.join(" ")
            );
        }
        println!("{} snapshot(s)", snapshots.len());
    }

    pub fn check_done(&self, r: &CheckReport, read_data: bool) {
        if self.json {
            println!(
                "{}",
                json!({ "ok": r.is_ok(), "read_data": read_data, "report": r })
            );
            return;
        }
        for d in &r.damage {
            eprintln!("larder: damage: {}", describe(d));
        }
        if !r.is_ok() {
            eprintln!("larder: error: check found {} problem(s)", r.damage.len());
        }
        if self.text() {
            println!(
                "checked {} snapshots, {} containers, {} chunks{}: {}",
                r.snapshots,
                r.containers,
                r.chunks,
                if read_data {
                    format!(", read {}", mb(r.bytes_read))
                } else {
                    String::new()
                },
                if r.is_ok() {
                    "no errors".to_string()
                } else {
                    format!("{} problem(s)", r.damage.len())
                }
            );
        }
    }

    pub fn stats(&self, repo: &Repository, index: bool) -> anyhow::Result<()> {
        let (snapshots, _) = repo.snapshots()?;
        let logical: u64 = snapshots.iter().map(|(_, s)| s.summary.bytes_in).sum();
        let mut stored = 0u64;
        for dir in ["containers", "index", "index/disk", "snapshots"] {
            let Ok(entries) = std::fs::read_dir(repo.root().join(dir)) else {
                continue;
            };
            for e in entries {
                let meta = e?.metadata()?;
                if !meta.is_file() {
                    continue;
                }
                stored += if dir == "index/disk" {
                    // The disk index's table is sparse: count what it occupies.
                    meta.len()
                        .min(std::os::unix::fs::MetadataExt::blocks(&meta) * 512)
                } else {
                    meta.len()
                };
            }
        }
        let chunks = repo.index().len();
        let shape = repo.index().disk_shape();
        let last_backup = index.then(|| last_backup_metrics(repo)).flatten();
        let chunk_bytes = repo.chunk_bytes();
        let ratio = |num: u64, den: u64| num as f64 / den.max(1) as f64;
        let dedup = ratio(logical, chunk_bytes.raw);
        let compression = ratio(chunk_bytes.raw, chunk_bytes.stored);
        let overall = ratio(logical, stored);
        if self.json {
            println!(
                "{}",
                json!({
                    "snapshots": snapshots.len(), "containers": repo.indexed_containers().len(),
                    "chunks": chunks, "index_segments": repo.segment_count(),
                    "logical_bytes": logical, "unique_bytes": chunk_bytes.raw,
                    "chunk_bytes_stored": chunk_bytes.stored, "stored_bytes": stored,
                    "dedup_ratio": dedup, "compression_ratio": compression,
                    "overall_ratio": overall,
                    "config": repo.config(),
                    "index": repo.config().index.describe(),
                    "disk_index": index.then_some(json!({
                        "shape": shape, "last_backup": last_backup,
                    })),
                })
            );
        } else if self.text() {
            println!("repository  {}", repo.root().display());
            println!("snapshots   {}", snapshots.len());
            println!(
                "containers  {} ({} index segments)",
                repo.indexed_containers().len(),
                repo.segment_count()
            );
            println!("chunks      {chunks} unique");
            println!("logical     {} (sum over snapshots)", mb(logical));
            println!(
                "unique      {} of chunks, {} after compression ({})",
                mb(chunk_bytes.raw),
                mb(chunk_bytes.stored),
                repo.config().compression.name()
            );
            println!("stored      {} on disk", mb(stored));
            println!(
                "ratios      dedup {dedup:.2}x, compression {compression:.2}x, overall {overall:.2}x (logical / on disk)"
            );
            println!("index       {}", repo.config().index.describe());
            if !index {
                return Ok(());
            }
            match shape {
                None => println!("  (a memory index: no disk index metrics)"),
                Some(d) => {
                    println!(
                        "  files     {} apparent, the table sparse ({} fingerprints, {} table buckets, {} lazy buffer buckets)",
                        mb(d.disk_bytes),
                        d.fingerprints,
                        d.table_buckets,
                        d.buffer_buckets
                    );
                    println!(
                        "  memory    {} at full use; Bloom filter {}, false-positive rate {:.4}% at {} fingerprints",
                        mb(d.memory_estimate),
                        mb(d.bloom_bytes),
                        100.0 * d.bloom_false_positive_rate,
                        d.fingerprints
                    );
                }
            }
            match &last_backup {
                Some(m) => {
                    println!("  last backup's lookups");
                    print_metrics_json(m);
                }
                None if shape.is_some() => println!("  (no backup recorded its lookups yet)"),
                None => {}
            }
        }
        Ok(())
    }

    pub fn chunk_done(&self, r: &ChunkFilesReport) {
        if self.json {
            // The report holds only strings, integers and floats, which always serialize.
            let mut value = serde_json::to_value(r).unwrap_or_default();
            value["timed"] = json!("the chunker alone: file reads and fingerprinting are excluded");
            println!("{value}");
            return;
        }
        if self.quiet {
            return;
        }
        let with_cuts: Vec<_> = r
            .files
            .iter()
            .filter_map(|f| Some((f, f.cuts.as_ref()?)))
            .collect();
        if !with_cuts.is_empty() {
            println!("cuts (offset, length, file):");
            for (file, cuts) in with_cuts {
                for (offset, len) in cuts.offsets.iter().zip(&cuts.lengths) {
                    println!("{offset:>14} {len:>10}  {}", file.path);
                }
            }
        }
        let c = &r.config;
        let s = &r.sizes;
        let d = &r.dedup;
        println!(
            "chunker     {}, min {}, avg {}, max {}, level {}",
            r.algo,
            format_size(c.min_size as f64),
            format_size(c.avg_size as f64),
            format_size(c.max_size as f64),
            c.level
        );
        println!(
            "input       {} file(s), {} ({} bytes)",
            r.files.len(),
            mb(s.bytes),
            s.bytes
        );
        println!(
            "chunks      {}: mean {:.0} B, std dev {:.0} B, smallest {} B, largest {} B",
            s.chunks, s.mean, s.std_dev, s.min, s.max
        );
        println!(
            "dedup       {:.3}x: {} bytes in {} distinct chunks ({:.2}% duplicate, by BLAKE3 fingerprint)",
            d.ratio, d.distinct_bytes, d.distinct_chunks, d.duplicate_percent
        );
        println!(
            "speed       {:.0} MB/s in the chunker alone on {} thread(s) ({:.3} s; file reads and fingerprinting not timed)",
            r.chunk_mb_per_sec, r.threads, r.chunk_seconds
        );
        if r.threads > 1 {
            let p = &r.parallel;
            println!(
                "parallel    {} segments; {} bytes ({} chunks) re-chunked to resynchronise, {} by the sequential merge; cut points identical to one thread by construction",
                p.segments, p.rechunked_bytes, p.rechunked_chunks, p.merge_chunked_bytes
            );
        }
        println!("sizes       chunks per power-of-two size range:");
        for line in report::histogram_lines(&s.histogram, 40) {
            println!("  {line}");
        }
    }

    pub fn bench_report_done(&self, r: &ReportResults) {
        let plots: Vec<&str> = r.plots().iter().map(|p| p.file.as_str()).collect();
        if self.json {
            println!(
                "{}",
                json!({ "report_md": r.report_path, "plots": plots, "seconds": r.seconds })
            );
        } else if self.text() {
            println!(
                "{} plots and the report in {:.0} s: {}",
                plots.len(),
                r.seconds,
                r.report_path.display()
            );
        }
    }

    pub fn bench_index_done(&self, r: &DiskIndexResults) {
        if self.json {
            println!(
                "{}",
                json!({ "report": r.report, "report_md": r.report_path, "plots": r.plots })
            );
        } else if self.text() {
            print!("{}", report_tables(&r.report));
            println!(
                "{} plots and the report: {}",
                r.plots.len(),
                r.report_path.display()
            );
        }
    }

    pub fn bench_chunk_done(&self, r: &ChunkBenchReport, plots: &[PlotFile], report_md: &Path) {
        if self.json {
            println!(
                "{}",
                json!({ "report": r, "report_md": report_md, "plots": plots })
            );
        } else if self.text() {
            print!("{}", report::markdown_tables(r));
            println!(
                "{} plots and the report: {}",
                plots.len(),
                report_md.display()
            );
        }
    }
}

fn describe(d: &larder_engine::Damage) -> String {
    use larder_engine::Damage::*;
    match d {
        Segment { name, reason } => format!("index segment {name}: {reason}"),
        Container { id, reason } => format!("container {id}: {reason}"),
        Chunks { container, count } => format!("container {container}: {count} chunk(s) damaged"),
        Snapshot { reason } => format!("snapshot unreadable: {reason}"),
        Tree { snapshot, reason } => format!("snapshot {snapshot}: tree unreadable: {reason}"),
        File {
            snapshot,
            path,
            bad_chunks,
        } => {
            format!("snapshot {snapshot}: file {path} has {bad_chunks} damaged or missing chunk(s)")
        }
    }
}

/// A progress bar on stderr when it is a terminal; silent otherwise.
pub struct Bar {
    bar: ProgressBar,
}

impl Bar {
    pub fn bytes(out: &Output) -> Self {
        let bar = if out.text() && std::io::stderr().is_terminal() {
            let b = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
            b.set_style(
                ProgressStyle::with_template(
                    "{bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            b
        } else {
            ProgressBar::hidden()
        };
        Self { bar }
    }

    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

impl Progress for Bar {
    fn set_total(&self, bytes: u64) {
        self.bar.set_length(bytes);
    }

    fn advance(&self, bytes: u64) {
        self.bar.inc(bytes);
    }

    fn warn(&self, w: &Warning) {
        self.bar.suspend(|| eprintln!("larder: warning: {w}"));
    }
}

/// A backup's disk index counters as JSON (the paper's Tables IV, V and VII): answers
/// by component, I/Os and bytes, hit rates, Bloom false positives, seconds per
/// component.
pub fn disk_metrics_json(m: &DiskIndexMetrics) -> serde_json::Value {
    let t = &m.time;
    let other = t.total.saturating_sub(
        t.bloom + t.prelookup + t.disk_lookup + t.prefetch + t.postlookup + t.flush,
    );
    let fp_rate = m.bloom_false_positives as f64 / (m.submitted - m.bloom_new).max(1) as f64;
    json!({
        "fingerprints": m.submitted,
        "answered": {
            "bloom": m.bloom_new, "prelookup": m.prelookup_hits,
            "insert_buffer": m.insert_buffer_hits, "waiting": m.waited,
            "postlookup": m.postlookup_hits,
            "disk": m.disk_found + m.bloom_false_positives,
        },
        "prelookups": m.prelookups, "prelookup_hit_rate": m.prelookup_hit_rate(),
        "postlookups": m.postlookups, "postlookup_hit_rate": m.postlookup_hit_rate(),
        "buffered": m.buffered, "batches": m.batches,
        "disk_lookups": m.disk_lookups, "lookup_ios": m.lookup_ios, "lookup_bytes": m.lookup_bytes,
        "prefetches": m.prefetches, "prefetch_ios": m.prefetch_ios,
        "prefetch_bytes": m.prefetch_bytes, "prefetched_records": m.prefetched_records,
        "bloom_false_positives": m.bloom_false_positives,
        "bloom_false_positive_rate": fp_rate,
        "flushes": m.flushes, "merges": m.merges,
        "flush_reads": m.flush_reads, "flush_writes": m.flush_writes,
        "flush_bytes_written": m.flush_bytes_written,
        "seconds": {
            "bloom": secs(t.bloom), "prelookup": secs(t.prelookup),
            "disk_lookup": secs(t.disk_lookup), "prefetch": secs(t.prefetch),
            "postlookup": secs(t.postlookup), "flush": secs(t.flush), "other": secs(other),
            "total": secs(t.total),
        },
    })
}

/// Where a backup leaves its disk index counters for `stats --index`: informational
/// only, never read for correctness (docs/design/format.md, "Disk index").
fn last_backup_path(repo: &Repository) -> std::path::PathBuf {
    larder_store::DiskState::dir_of(repo.root()).join("last-backup.json")
}

/// Records a backup's disk index counters; a failure to write them is only a warning's
/// worth, and is ignored: the backup is committed.
pub fn save_last_backup_metrics(repo: &Repository, m: &DiskIndexMetrics) {
    let _ = std::fs::write(last_backup_path(repo), disk_metrics_json(m).to_string());
}

fn last_backup_metrics(repo: &Repository) -> Option<serde_json::Value> {
    let raw = std::fs::read(last_backup_path(repo)).ok()?;
    serde_json::from_slice(&raw).ok()
}

/// Prints the JSON of [`disk_metrics_json`] as text, one line per group.
fn print_metrics_json(m: &serde_json::Value) {
    let n = |k: &str| m.get(k).and_then(serde_json::Value::as_f64).unwrap_or(0.0);
    let a = |k: &str| {
        m["answered"]
            .get(k)
            .and_then(serde_json::Value::as_f64)
            .unwrap_or(0.0)
    };
    let t = |k: &str| {
        1e3 * m["seconds"]
            .get(k)
            .and_then(serde_json::Value::as_f64)
            .unwrap_or(0.0)
    };
    println!("    fingerprints     {}", n("fingerprints"));
    println!(
        "    answered by      bloom {} | prelookup {} | insert buffer {} | waiting {} | postlookup {} | disk {}",
        a("bloom"), a("prelookup"), a("insert_buffer"), a("waiting"), a("postlookup"), a("disk")
    );
    println!(
        "    hit rates        prelookup {:.1}% of {} | postlookup {:.1}% of {}",
        100.0 * n("prelookup_hit_rate"),
        n("prelookups"),
        100.0 * n("postlookup_hit_rate"),
        n("postlookups")
    );
    println!(
        "    on-disk lookup   {} fingerprints, {} I/Os, {} bytes ({} batches)",
        n("disk_lookups"),
        n("lookup_ios"),
        n("lookup_bytes"),
        n("batches")
    );
    println!(
        "    prefetch         {} prefetches, {} I/Os, {} bytes, {} records",
        n("prefetches"),
        n("prefetch_ios"),
        n("prefetch_bytes"),
        n("prefetched_records")
    );
    println!(
        "    bloom            {} false positives ({:.4}% of the fingerprints it passed)",
        n("bloom_false_positives"),
        100.0 * n("bloom_false_positive_rate")
    );
    println!(
        "    flush            {} flushes ({} merges of runs into the table), {} page reads, {} writes, {} bytes",
        n("flushes"),
        n("merges"),
        n("flush_reads"),
        n("flush_writes"),
        n("flush_bytes_written")
    );
    println!(
        "    time (ms)        bloom {:.1} | prelookup {:.1} | on-disk lookup {:.1} | prefetch {:.1} | postlookup {:.1} | flush {:.1} | other {:.1} | total {:.1}",
        t("bloom"), t("prelookup"), t("disk_lookup"), t("prefetch"), t("postlookup"), t("flush"), t("other"), t("total")
    );
}
