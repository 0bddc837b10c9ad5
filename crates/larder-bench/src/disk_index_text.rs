//! The text of `larder bench index`: the tables (every run's I/Os, hit rates and
//! seconds per component; the paper's Tables VII, V and VI at the reference BFT) and
//! `disk-index.md`, which adds how they were made and the plots.

use std::fmt::Write as _;

use crate::disk_index::{DiskIndexReport, RunKind, RunResult};
use crate::plot::{format_size, PlotFile, Spread};
use crate::report_text::{mb, table};

/// Seconds: the median, and the range of the runs when they differ.
fn secs(s: &Spread) -> String {
    if s.max > s.min {
        format!("{:.2} ({:.2}-{:.2})", s.median, s.min, s.max)
    } else {
        format!("{:.2}", s.median)
    }
}

fn percent(rate: f64) -> String {
    format!("{:.1}%", 100.0 * rate)
}

/// `part` against `whole` as a change: "-92.4%".
fn change(part: f64, whole: f64) -> String {
    if whole > 0.0 {
        format!("{:+.1}%", 100.0 * (part / whole - 1.0))
    } else {
        "-".into()
    }
}

fn times(part: f64, whole: f64) -> String {
    if whole > 0.0 {
        format!("{:.2}x", part / whole)
    } else {
        "-".into()
    }
}

/// A lazy-only figure ("-" for eager).
fn lazy_only(r: &RunResult, value: String) -> String {
    if r.kind == RunKind::Eager {
        "-".into()
    } else {
        value
    }
}

fn io_table(out: &mut String, report: &DiskIndexReport) {
    let eager = report.eager();
    let rows: Vec<Vec<String>> = report
        .runs
        .iter()
        .map(|r| {
            let c = &r.counts;
            vec![
                r.label(),
                lazy_only(r, r.buffer_buckets.to_string()),
                r.cache_fingerprints.to_string(),
                c.disk_lookups.to_string(),
                c.lookup_ios.to_string(),
                eager.map_or("-".into(), |e| {
                    change(c.lookup_ios as f64, e.counts.lookup_ios as f64)
                }),
                mb(c.lookup_bytes),
                c.prefetch_ios.to_string(),
                mb(c.prefetch_bytes),
                if c.prelookups > 0 {
                    percent(c.prelookup_hit_rate())
                } else {
                    "-".into()
                },
                lazy_only(r, percent(c.postlookup_hit_rate())),
                c.bloom_false_positives.to_string(),
                format!("{} / {}", c.flush_writes, c.flush_reads),
                mb(c.flush_bytes_written),
            ]
        })
        .collect();
    table(
        out,
        &[
            "run",
            "buffer buckets",
            "cache (fingerprints)",
            "fingerprints looked up on disk",
            "on-disk lookup I/Os",
            "against eager",
            "lookup bytes",
            "prefetch I/Os",
            "prefetch bytes",
            "prelookup hits",
            "postlookup hits",
            "Bloom false positives",
            "flush writes / reads",
            "flush bytes",
        ],
        &rows,
    );
}

fn time_table(out: &mut String, report: &DiskIndexReport) {
    let eager = report.eager();
    let rows: Vec<Vec<String>> = report
        .runs
        .iter()
        .map(|r| {
            let s = &r.seconds;
            vec![
                r.label(),
                secs(&s.bloom),
                secs(&s.prelookup),
                secs(&s.disk_lookup),
                secs(&s.prefetch),
                lazy_only(r, secs(&s.postlookup)),
                secs(&s.flush),
                secs(&s.other),
                format!("**{}**", secs(&s.total)),
                eager.map_or("-".into(), |e| {
                    times(s.total.median, e.seconds.total.median)
                }),
                secs(&s.wall),
            ]
        })
        .collect();
    table(
        out,
        &[
            "run (seconds)",
            "Bloom",
            "prelookup",
            "on-disk lookup",
            "prefetch",
            "postlookup",
            "flush (inserts)",
            "other",
            "index total",
            "against eager",
            "wall",
        ],
        &rows,
    );
}

/// Eager against lazy at the reference BFT: the paper's Table VII, with the I/O
/// counts beside the times.
fn table_vii(out: &mut String, eager: &RunResult, lazy: &RunResult) {
    let row = |name: &str, e: f64, l: f64, fmt: &dyn Fn(f64) -> String| {
        vec![name.to_string(), fmt(e), fmt(l), times(l, e)]
    };
    let s = |x: f64| format!("{x:.2}");
    let n = |x: f64| format!("{x:.0}");
    let (es, ls) = (&eager.seconds, &lazy.seconds);
    let other = |r: &RunResult| {
        let s = &r.seconds;
        (s.total.median - s.disk_lookup.median - s.prefetch.median).max(0.0)
    };
    let rows = vec![
        row(
            "on-disk lookup (s)",
            es.disk_lookup.median,
            ls.disk_lookup.median,
            &s,
        ),
        row(
            "prefetching (s)",
            es.prefetch.median,
            ls.prefetch.median,
            &s,
        ),
        row(
            "disk access: both (s)",
            es.disk_lookup.median + es.prefetch.median,
            ls.disk_lookup.median + ls.prefetch.median,
            &s,
        ),
        row("other (s)", other(eager), other(lazy), &s),
        row("index total (s)", es.total.median, ls.total.median, &s),
        row(
            "on-disk lookup I/Os",
            eager.counts.lookup_ios as f64,
            lazy.counts.lookup_ios as f64,
            &n,
        ),
        row(
            "prefetch I/Os",
            eager.counts.prefetch_ios as f64,
            lazy.counts.prefetch_ios as f64,
            &n,
        ),
    ];
    table(out, &["", "eager", &lazy.label(), "lazy / eager"], &rows);
}

/// Lazy with and without prelookup at the reference BFT: the paper's Table V.
fn table_v(out: &mut String, with: &RunResult, without: &RunResult) {
    let other = |r: &RunResult| {
        let s = &r.seconds;
        (s.total.median
            - s.disk_lookup.median
            - s.prefetch.median
            - s.prelookup.median
            - s.postlookup.median)
            .max(0.0)
    };
    let s = |x: f64| format!("{x:.2}");
    let row = |name: &str, a: f64, b: f64| vec![name.to_string(), s(a), s(b), times(b, a)];
    let (a, b) = (&with.seconds, &without.seconds);
    let rows = vec![
        row(
            "on-disk lookup (s)",
            a.disk_lookup.median,
            b.disk_lookup.median,
        ),
        row("prefetching (s)", a.prefetch.median, b.prefetch.median),
        vec![
            "prelookup (s)".into(),
            s(a.prelookup.median),
            "-".into(),
            "-".into(),
        ],
        row("postlookup (s)", a.postlookup.median, b.postlookup.median),
        row("other (s)", other(with), other(without)),
        row("index total (s)", a.total.median, b.total.median),
        vec![
            "on-disk lookup I/Os".into(),
            with.counts.lookup_ios.to_string(),
            without.counts.lookup_ios.to_string(),
            times(
                without.counts.lookup_ios as f64,
                with.counts.lookup_ios as f64,
            ),
        ],
    ];
    table(
        out,
        &["", &with.label(), &without.label(), "without / with"],
        &rows,
    );
}

/// Prelookup and postlookup hit rates of every lazy run: the paper's Table VI.
fn table_vi(out: &mut String, report: &DiskIndexReport) {
    let rows: Vec<Vec<String>> = report
        .runs
        .iter()
        .filter(|r| r.kind != RunKind::Eager)
        .map(|r| {
            let c = &r.counts;
            vec![
                r.label(),
                if c.prelookups > 0 {
                    format!(
                        "{} ({} of {})",
                        percent(c.prelookup_hit_rate()),
                        c.prelookup_hits,
                        c.prelookups
                    )
                } else {
                    "-".into()
                },
                format!(
                    "{} ({} of {})",
                    percent(c.postlookup_hit_rate()),
                    c.postlookup_hits,
                    c.postlookups
                ),
            ]
        })
        .collect();
    if !rows.is_empty() {
        table(
            out,
            &["run", "prelookup hit rate", "postlookup hit rate"],
            &rows,
        );
    }
}

/// The one-line verdict of lazy against eager at each BFT.
fn ratios(out: &mut String, report: &DiskIndexReport) {
    let Some(eager) = report.eager() else { return };
    for r in report.runs.iter().filter(|r| r.kind == RunKind::Lazy) {
        let (l, e) = (r.counts.lookup_ios as f64, eager.counts.lookup_ios as f64);
        let _ = writeln!(
            out,
            "- {} / eager: on-disk lookup I/Os {} / {} = {:.3} ({}); index time {:.3}",
            r.label(),
            r.counts.lookup_ios,
            eager.counts.lookup_ios,
            l / e.max(1.0),
            change(l, e),
            r.seconds.total.median / eager.seconds.total.median.max(f64::MIN_POSITIVE)
        );
    }
    out.push('\n');
}

/// The workload, the budget, the index's size and how reads reached the disk.
pub fn summary(report: &DiskIndexReport) -> String {
    let p = &report.plan;
    let index = report.index_bytes();
    let mut out = format!(
        "Workload: larder-gen's fingerprint stream, seed {}, {} generations of {} chunks ({} in all, {} distinct). \
         Budget (--index-memory) {}; the index {} on disk, {:.1}x the budget. \
         Index I/O: {}. {} run{} of each configuration, interleaved; times are medians (slowest-fastest in brackets).\n",
        p.seed,
        p.generations,
        report
            .generation_chunks
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        report.chunks,
        report.distinct,
        format_size(p.memory_budget as f64),
        format_size(index as f64),
        index as f64 / p.memory_budget.max(1) as f64,
        report.cache.note,
        p.runs,
        if p.runs == 1 { "" } else { "s" },
    );
    if index < p.memory_budget {
        let _ = writeln!(
            out,
            "\nNote: the index is smaller than the budget, so it may be held in memory: the experiment needs it several times larger (more --chunks, or a smaller --index-memory)."
        );
    }
    let _ = writeln!(
        out,
        "\nThe lazy buffer reserves {} bytes of chunk data per buffered fingerprint in the index's budget (--buffered-chunk-bytes; 0 is how backup configures it).",
        p.buffered_chunk_bytes
    );
    if p.batch_gap_pages != u64::MAX {
        let _ = writeln!(
            out,
            "\nLazy batches read in runs split where more than {} unneeded table pages lie between needed ones (--batch-gap).",
            p.batch_gap_pages
        );
    }
    // A run whose answers differ from the oracle's fails the benchmark: every run
    // reported was exact.
    let _ = writeln!(
        out,
        "\nExactness: every run's {} answers matched the HashSet oracle ({} new chunks each).",
        report.chunks, report.distinct
    );
    for r in report.runs.iter().filter(|r| !r.counts_identical) {
        let _ = writeln!(
            out,
            "\nNote: the counts of {} differed between runs; those shown are the first run's.",
            r.label()
        );
    }
    out
}

/// Every table, as printed on stdout and in disk-index.md.
pub fn report_tables(report: &DiskIndexReport) -> String {
    let mut out = summary(report);
    out.push_str("\n### Every run: I/Os and hit rates\n\n");
    io_table(&mut out, report);
    out.push_str("### Every run: seconds per component\n\n");
    time_table(&mut out, report);
    ratios(&mut out, report);
    if let Some(bft) = report.reference_bft() {
        if let (Some(e), Some(l)) = (report.eager(), report.lazy(RunKind::Lazy, bft)) {
            let _ = writeln!(
                out,
                "### Eager against lazy at BFT {bft} (the paper's Table VII)\n"
            );
            table_vii(&mut out, e, l);
        }
        if let (Some(a), Some(b)) = (
            report.lazy(RunKind::Lazy, bft),
            report.lazy(RunKind::LazyNoPrelookup, bft),
        ) {
            let _ = writeln!(
                out,
                "### With and without prelookup at BFT {bft} (the paper's Table V)\n"
            );
            table_v(&mut out, a, b);
        }
    }
    if report.runs.iter().any(|r| r.kind != RunKind::Eager) {
        out.push_str("### Hit rates (the paper's Table VI)\n\n");
        table_vi(&mut out, report);
    }
    out
}

/// disk-index.md: the tables, then each plot with its caption, then the machine and
/// the command.
pub fn report_markdown(report: &DiskIndexReport, plots: &[PlotFile], command: &str) -> String {
    let mut out =
        String::from("# Disk index: eager against lazy lookup (`larder bench index`)\n\n");
    out.push_str(&report_tables(report));
    for p in plots {
        let _ = writeln!(
            out,
            "#### {}\n\n![{}]({})\n\n{}\n",
            p.title, p.title, p.file, p.caption
        );
    }
    let _ = writeln!(
        out,
        "Machine: {}. Command: `{command}`. Scratch: {}. {:.0} s in all.",
        report.machine.describe(),
        report.plan.dir.display(),
        report.seconds
    );
    out
}
