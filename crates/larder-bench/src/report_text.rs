//! report.md of `larder bench report`: how it was made, every table, every plot with
//! its caption and the machine, command and runs it came from.

use std::fmt::Write as _;

use crate::gen_truth::{GenTruthReport, GenerationRow};
use crate::index::{IndexRate, CUCKOO, CUCKOO_PARALLEL, HASHBROWN, HIT, INSERT, MISS};
use crate::pipeline::PipelineReport;
use crate::plot::{format_size, PlotFile, Spread};
use crate::report::markdown_tables;
use crate::report_all::ReportResults;

/// A markdown table: the first column left-aligned, the others right-aligned.
pub(crate) fn table(out: &mut String, header: &[&str], rows: &[Vec<String>]) {
    let _ = writeln!(out, "| {} |", header.join(" | "));
    let rule: Vec<&str> = (0..header.len())
        .map(|i| if i == 0 { "---" } else { "---:" })
        .collect();
    let _ = writeln!(out, "| {} |", rule.join(" | "));
    for row in rows {
        let _ = writeln!(out, "| {} |", row.join(" | "));
    }
    out.push('\n');
}

fn spread(s: &Spread) -> String {
    if s.max > s.min {
        format!("{:.0} ({:.0}-{:.0})", s.median, s.min, s.max)
    } else {
        format!("{:.0}", s.median)
    }
}

/// Bytes in decimal megabytes, one decimal.
pub(crate) fn mb(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

/// A plot with its caption and where it came from.
fn figure(out: &mut String, p: &PlotFile, footer: &str) {
    let _ = writeln!(
        out,
        "#### {}\n\n![{}]({})\n\n{} {footer}\n",
        p.title, p.title, p.file, p.caption
    );
}

fn pipeline_section(out: &mut String, r: &PipelineReport) {
    let serial = r
        .modes
        .iter()
        .find(|m| m.serial)
        .map_or(1.0, |m| m.mb_per_sec.median);
    let _ = writeln!(
        out,
        "### Throughput: serial, pipelined, pipelined + parallel (P-Dedupe Fig. 14)\n\n\
         {} file(s), {}, backed up whole into a fresh repository each time (FastCDC \
         2/8/64 KiB, BLAKE3, no compression: the paper's four stages) under {}; the \
         backup's dedup ratio is {:.3}. MB/s of input, start to commit, median of {} \
         interleaved runs (slowest-fastest).\n",
        r.files,
        mb(r.bytes),
        r.repository_dir,
        r.backup_dedup_ratio,
        r.plan.runs
    );
    let rows: Vec<Vec<String>> = r
        .modes
        .iter()
        .map(|m| {
            vec![
                m.label.clone(),
                spread(&m.mb_per_sec),
                format!("{:.2}x", m.mb_per_sec.median / serial.max(1e-9)),
            ]
        })
        .collect();
    table(out, &["mode", "MB/s", "vs serial"], &rows);
    let t = &r.serial_stages;
    let stage_rate = |s: f64| format!("{:.0}", r.bytes as f64 / 1e6 / s.max(1e-9));
    let _ = writeln!(
        out,
        "### Stage times against the model (P-Dedupe equations 3 to 6)\n\n\
         Stage times of the serial runs (medians), where each stage works alone: Tc \
         reading and chunking, Tf fingerprinting, Ti indexing, Tw/D writing the new \
         chunks and committing (only new data is written, so this is the paper's Tw/D; \
         equation 3, writing without dedup, is not a mode larder has).\n"
    );
    let stages = [
        ("Tc (walk, read, chunk)", t.chunk),
        ("Tf (fingerprint)", t.fingerprint),
        ("Ti (index)", t.index),
        ("Tw/D (write new chunks, commit)", t.write),
        ("sum", t.sum()),
    ];
    let rows: Vec<Vec<String>> = stages
        .iter()
        .map(|(n, s)| vec![n.to_string(), format!("{s:.3}"), stage_rate(*s)])
        .collect();
    table(out, &["stage", "seconds", "MB/s of the stage alone"], &rows);
    let rows: Vec<Vec<String>> = r
        .model
        .iter()
        .map(|m| {
            vec![
                m.label.clone(),
                m.equation.to_string(),
                spread(&m.measured),
                format!("{:.0}", m.model_mb_per_sec),
                format!("{:.0}", m.bounded_mb_per_sec),
                format!("{:.2}", m.measured.median / m.bounded_mb_per_sec.max(1e-9)),
            ]
        })
        .collect();
    let _ = writeln!(
        out,
        "Measured MB/s against the equations, and against the equations bounded by the \
         {} cores (the stages' total work, {:.3} s, cannot take less than its share per \
         core):\n",
        r.cores,
        t.sum()
    );
    table(
        out,
        &[
            "mode",
            "equation",
            "measured",
            "model",
            "model on the cores",
            "measured / model on the cores",
        ],
        &rows,
    );
    let serial_seconds = r
        .modes
        .iter()
        .find(|m| m.serial)
        .map_or(0.0, |m| Spread::of(&m.seconds).median);
    let _ = writeln!(
        out,
        "The serial backup took {serial_seconds:.3} s against {:.3} s of stage work: \
         {:.1}% of it is outside the four stages (handing batches between threads, \
         building the tree stream's recipes, creating the repository's files).\n",
        t.sum(),
        100.0 * (1.0 - t.sum() / serial_seconds.max(1e-9))
    );
    let _ = writeln!(
        out,
        "### Parallel against sequential chunking (P-Dedupe Table 3)\n\n\
         {} chunks; sequential chunking's dedup ratio {:.4}. \"Exact\" is larder's \
         parallel chunker on {} threads; \"independent\" chunks every segment on its own \
         (P-Dedupe without its boundary jointing), for comparison. Differing cut \
         points count both ways. \"Missed\" is the paper's measure: the share of bytes \
         found duplicate by sequential chunking less that found by the parallel one.\n",
        r.chunks,
        r.sequential_ratio,
        r.plan.segment_threads.iter().max().unwrap_or(&1)
    );
    let dup = |ratio: f64| 100.0 * (1.0 - 1.0 / ratio);
    let rows: Vec<Vec<String>> = r
        .segment_dedup
        .iter()
        .map(|d| {
            vec![
                format_size(d.segment_size as f64),
                d.exact_differing_cuts.to_string(),
                format!("{:.4}", d.exact_ratio),
                format!("{:.4}%", dup(r.sequential_ratio) - dup(d.exact_ratio)),
                d.independent_differing_cuts.to_string(),
                format!("{:.4}", d.independent_ratio),
                format!("{:.4}%", dup(r.sequential_ratio) - dup(d.independent_ratio)),
            ]
        })
        .collect();
    table(
        out,
        &[
            "segment",
            "exact: differing cuts",
            "exact: dedup ratio",
            "exact: missed",
            "independent: differing cuts",
            "independent: dedup ratio",
            "independent: missed",
        ],
        &rows,
    );
    let _ = writeln!(
        out,
        "### Chunking speed against segment size and threads (P-Dedupe Fig. 10)\n\n\
         MB/s of larder's exact parallel chunker over whole streams in memory (chunking \
         alone), median of {} interleaved runs (slowest-fastest). Every configuration \
         cut exactly the sequential cut points: {} differing in all.\n",
        r.plan.runs,
        r.segments.iter().map(|p| p.differing_cuts).sum::<u64>()
    );
    let mut header = vec!["segment".to_string()];
    header.extend(
        r.plan
            .segment_threads
            .iter()
            .map(|t| format!("{t} thread(s)")),
    );
    let rows: Vec<Vec<String>> = r
        .plan
        .segment_sizes
        .iter()
        .map(|&s| {
            let mut row = vec![format_size(s as f64)];
            row.extend(r.plan.segment_threads.iter().map(|&t| {
                r.segments
                    .iter()
                    .find(|p| p.segment_size == s && p.threads == t)
                    .map_or("-".into(), |p| spread(&p.mb_per_sec))
            }));
            row
        })
        .collect();
    let header: Vec<&str> = header.iter().map(String::as_str).collect();
    table(out, &header, &rows);
}

fn gen_section(out: &mut String, g: &GenTruthReport) {
    let _ = writeln!(
        out,
        "`larder gen`'s model with its defaults (shifting edits), seed {}, one client, \
         {} generations of {}; each generation backed up as one snapshot into one \
         repository (larder's default chunker, FastCDC 2/8/64 KiB). New bytes: the \
         generator's ground truth (bytes never written before); the backup's \
         `bytes_new` (new chunks of file data and of the tree stream); and the new chunk \
         bytes of the file data alone, with FastCDC and with fixed 4 KiB chunks (the \
         generator's block size). Ratios are bytes / new bytes.\n",
        g.plan.seed,
        g.plan.generations,
        format_size(g.plan.generation_size as f64)
    );
    let row = |name: String, r: &GenerationRow| -> Vec<String> {
        let lost = r.lost_straddling + r.lost_whole;
        vec![
            name,
            mb(r.bytes),
            format!("{:.3}", r.ratio(r.truth_new)),
            format!("{:.3}", r.ratio(r.backup_new)),
            format!("{:.3}", r.ratio(r.data_new)),
            format!("{:.3}", r.ratio(r.fixed_new)),
            r.boundaries.to_string(),
            r.junctions.to_string(),
            mb(r.lost_straddling),
            mb(r.lost_whole),
            format!(
                "{:.1} KiB",
                lost as f64 / (r.boundaries + r.junctions).max(1) as f64 / 1024.0
            ),
        ]
    };
    let mut rows: Vec<Vec<String>> = g
        .rows
        .iter()
        .map(|r| row(r.generation.to_string(), r))
        .collect();
    let all = GenerationRow {
        generation: 0,
        bytes: g.total(|r| r.bytes),
        truth_new: g.total(|r| r.truth_new),
        backup_new: g.total(|r| r.backup_new),
        data_new: g.total(|r| r.data_new),
        fixed_new: g.total(|r| r.fixed_new),
        boundaries: g.total(|r| r.boundaries),
        junctions: g.total(|r| r.junctions),
        lost_straddling: g.total(|r| r.lost_straddling),
        lost_whole: g.total(|r| r.lost_whole),
        insertions: g.total(|r| r.insertions),
        deletions: g.total(|r| r.deletions),
    };
    rows.push(row("all".into(), &all));
    table(
        out,
        &[
            "generation",
            "bytes",
            "truth",
            "larder backup",
            "FastCDC, data only",
            "fixed 4 KiB, data only",
            "copied/new boundaries",
            "junctions of copies",
            "copied bytes stored again: in straddling chunks",
            "in chunks of copied bytes only",
            "stored again per change",
        ],
        &rows,
    );
    let lost = all.lost_straddling + all.lost_whole;
    let changes = all.boundaries + all.junctions;
    let per_change = lost as f64 / changes.max(1) as f64;
    let _ = writeln!(
        out,
        "Over the series larder's backup gives {:.3} against a truth of {:.3} ({:+.1}%); \
         the file data alone {:.3} ({:+.1}%). Every byte of the difference is accounted \
         for (the generator's extents say which bytes repeat earlier ones, and \
         `truth new + stored again = FastCDC new` holds exactly):\n\n\
         - **Changes.** The stream changes {} times over the series: {} boundaries \
         between copied and new bytes (a unique run, a first-time pool run or an \
         insertion starting or ending inside copied data; {} insertions in all) and {} \
         junctions where two copies meet that were not adjacent before (a deletion, {} \
         in all; a copied pool run next to other copied data).\n\
         - **Chunks straddling a boundary.** A chunk holding any new byte is new, so the \
         copied bytes it also holds are stored again: {}.\n\
         - **Chunks of copied bytes alone that are new**: cut differently from every \
         earlier copy of their bytes (across a junction, or next to a boundary until \
         the chunker resynchronises; a short copied run that no earlier chunk matches): \
         {}.\n\
         - Together {:.1} KiB per change, {:.2} times the mean chunk ({:.0} bytes).\n\
         - **Metadata.** The backup also stores the tree stream (each file's recipe, 32 \
         bytes a chunk): {} more new bytes than the data alone.\n\
         - **Fixed 4 KiB chunks** match the truth in generation 1 (its runs are whole \
         blocks from a block boundary: {} against {} new bytes) and fall apart in later \
         generations, whose shifting edits move every later block off the grid.\n",
        all.ratio(all.backup_new),
        all.ratio(all.truth_new),
        100.0 * (all.ratio(all.backup_new) / all.ratio(all.truth_new) - 1.0),
        all.ratio(all.data_new),
        100.0 * (all.ratio(all.data_new) / all.ratio(all.truth_new) - 1.0),
        changes,
        all.boundaries,
        all.insertions,
        all.junctions,
        all.deletions,
        mb(all.lost_straddling),
        mb(all.lost_whole),
        per_change / 1024.0,
        per_change / g.mean_chunk.max(1.0),
        g.mean_chunk,
        mb(all.backup_new.saturating_sub(all.data_new)),
        g.rows.first().map_or(0, |r| r.fixed_new),
        g.rows.first().map_or(0, |r| r.truth_new),
    );
}

fn index_section(out: &mut String, rates: &[IndexRate], threads: usize, runs: usize) {
    let _ = writeln!(
        out,
        "Million operations per second, median of {runs} interleaved runs \
         (slowest-fastest). Uniform 32-byte keys, structures sized for them; \
         `get_batch` asks 1024 keys a call (as the backup's index stage does), `get` and \
         hashbrown's `contains_key` one at a time; `insert_batch` runs on {threads} \
         threads, everything else on one.\n"
    );
    let mut sizes: Vec<usize> = rates.iter().map(|r| r.size).collect();
    sizes.dedup();
    let mut rows = Vec::new();
    for &n in &sizes {
        for op in [INSERT, HIT, MISS] {
            let find = |s: &str| {
                rates
                    .iter()
                    .find(|r| r.size == n && r.operation == op && r.structure == s)
            };
            let cell = |s: &str| {
                find(s).map_or("-".into(), |r| {
                    format!("{:.2} ({:.2}-{:.2})", r.mops.median, r.mops.min, r.mops.max)
                })
            };
            let ratio = match (find(CUCKOO), find(HASHBROWN)) {
                (Some(c), Some(h)) => format!("{:.2}x", c.mops.median / h.mops.median.max(1e-9)),
                _ => "-".into(),
            };
            rows.push(vec![
                format!("{}M", n as f64 / 1e6),
                op.to_string(),
                cell(CUCKOO),
                cell(CUCKOO_PARALLEL),
                cell(HASHBROWN),
                ratio,
            ]);
        }
    }
    table(
        out,
        &[
            "keys",
            "operation",
            "Cuckoo insert / get_batch",
            "Cuckoo insert_batch / get",
            "hashbrown",
            "Cuckoo (first column) / hashbrown",
        ],
        &rows,
    );
}

/// The whole report.md.
pub fn report_markdown(r: &ReportResults, command: &str) -> String {
    let mut out = String::from("# larder bench report\n\n");
    let footer = format!(
        "_Machine: {}. Command: `{command}`. Medians of interleaved runs, min to max as bars._",
        r.machine.describe()
    );
    let _ = writeln!(
        out,
        "Made by `{command}` in {:.0} s.\n\n\
         - **Machine:** {}.\n\
         - **Scratch** (generated files, benchmark repositories): {}.\n\
         - **Runs:** every speed and throughput is the median of interleaved runs (each \
         round runs every configuration once, so that a burst of load on a shared \
         machine spreads over all of them), with the slowest and fastest run in brackets \
         and as bars or whiskers in the plots. FastCDC: {} run(s); backups and parallel \
         chunking: {}; index: {}.\n\
         - The experiments and their settings: larder's `docs/design/bench.md`; earlier \
         measurements to compare with: `docs/performance.md`.\n",
        r.seconds,
        r.machine.describe(),
        r.scratch,
        r.plan.chunk.runs,
        r.plan.pipeline.runs,
        r.plan.index.runs
    );
    out.push_str("## Inputs\n\n");
    for d in &r.datasets {
        let _ = writeln!(
            out,
            "- **{}**: {} file(s), {}.",
            d.name,
            d.files,
            mb(d.bytes)
        );
    }
    for s in &r.skipped {
        let _ = writeln!(out, "- skipped {}: {}", s.path.display(), s.reason);
    }
    out.push('\n');
    for d in &r.datasets {
        let _ = writeln!(out, "## FastCDC on {}\n", d.name);
        out.push_str(&markdown_tables(&d.chunk));
        out.push_str("### Plots\n\n");
        for p in d.plots.iter().filter(|p| !is_pipeline_plot(p)) {
            figure(&mut out, p, &footer);
        }
    }
    for d in &r.datasets {
        let _ = writeln!(out, "## P-Dedupe on {}\n", d.name);
        pipeline_section(&mut out, &d.pipeline);
        out.push_str("### Plots\n\n");
        for p in d.plots.iter().filter(|p| is_pipeline_plot(p)) {
            figure(&mut out, p, &footer);
        }
    }
    out.push_str("## Generator ground truth: larder's dedup against the generator's\n\n");
    gen_section(&mut out, &r.gen_truth);
    figure(&mut out, &r.gen_plot, &footer);
    out.push_str("## Cuckoo: index inserts and lookups\n\n");
    index_section(&mut out, &r.index, r.plan.index.threads, r.plan.index.runs);
    figure(&mut out, &r.index_plot, &footer);
    out.push_str(
        "## Lazy\n\nEager against lazy lookups in the disk index are `larder bench index`'s \
         experiment (docs/design/bench.md), with its own report: this one does not run them.\n",
    );
    out
}

fn is_pipeline_plot(p: &PlotFile) -> bool {
    p.file.contains("pdedupe-") || p.file.contains("parallel-chunking")
}
