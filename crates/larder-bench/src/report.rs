//! Text for people: the Markdown tables of `larder bench chunk`, its report.md, and the
//! text histogram of `larder chunk`.

use std::fmt::Write as _;

use crate::chunk::{describe, ChunkBenchReport, Measurement, Series};
use crate::plot::{format_size, PlotFile};
use crate::stats::SizeBucket;

/// How many input names the tables list before summing up the rest.
const NAMES_LISTED: usize = 20;

/// One line per power-of-two bucket: its range, its chunk count and a bar of `#`
/// scaled so that the fullest bucket gets `width` marks.
pub fn histogram_lines(buckets: &[SizeBucket], width: usize) -> Vec<String> {
    let most = buckets.iter().map(|b| b.chunks).max().unwrap_or(0).max(1);
    let total: u64 = buckets.iter().map(|b| b.chunks).sum();
    buckets
        .iter()
        .map(|b| {
            let marks = (b.chunks as f64 / most as f64 * width as f64).round() as usize;
            let marks = if b.chunks > 0 { marks.max(1) } else { 0 };
            format!(
                "{:>9} to {:>9}  {:>10}  {:>5.1}%  {}",
                format_size(b.low as f64),
                format_size(b.high as f64),
                b.chunks,
                100.0 * b.chunks as f64 / total.max(1) as f64,
                "#".repeat(marks)
            )
        })
        .collect()
}

fn table(out: &mut String, header: &[String], rows: &[Vec<String>]) {
    let line = |cells: &[String]| format!("| {} |\n", cells.join(" | "));
    out.push_str(&line(header));
    let rule: Vec<String> = header
        .iter()
        .enumerate()
        .map(|(i, _)| if i == 0 { "---".into() } else { "---:".into() })
        .collect();
    out.push_str(&line(&rule));
    for row in rows {
        out.push_str(&line(row));
    }
    out.push('\n');
}

/// A table with one row per series and one column per value of `key`.
fn sweep_table(
    out: &mut String,
    first: &str,
    series: &[Series],
    columns: &[usize],
    key: impl Fn(&Measurement) -> usize,
    cell: impl Fn(&Measurement) -> String,
) {
    let mut header = vec![first.to_string()];
    header.extend(columns.iter().map(|&c| format_size(c as f64)));
    let rows: Vec<Vec<String>> = series
        .iter()
        .map(|s| {
            let mut row = vec![s.label.clone()];
            row.extend(columns.iter().map(|&c| {
                s.points
                    .iter()
                    .find(|m| key(m) == c)
                    .map_or_else(|| "skipped".to_string(), &cell)
            }));
            row
        })
        .collect();
    table(out, &header, &rows);
}

fn speed_cell(m: &Measurement) -> String {
    let s = &m.speed;
    if s.run_seconds.len() > 1 {
        format!(
            "{:.0} ({:.0}-{:.0})",
            s.median_mb_per_sec, s.min_mb_per_sec, s.max_mb_per_sec
        )
    } else {
        format!("{:.0}", s.median_mb_per_sec)
    }
}

fn dedup_cell(m: &Measurement) -> String {
    format!("{:.3}x ({:.2}%)", m.dedup.ratio, m.dedup.duplicate_percent)
}

fn mean_cell(m: &Measurement) -> String {
    format!("{:.0}", m.sizes.mean)
}

/// The tables of a report, in Markdown, for stdout and report.md.
pub fn markdown_tables(report: &ChunkBenchReport) -> String {
    let plan = &report.plan;
    let mut out = String::new();
    let corpus = &report.corpus;
    let _ = writeln!(
        out,
        "Input: {} stream(s), {} bytes ({:.1} MB), each file one stream, dedup counted across all.\n",
        corpus.streams,
        corpus.bytes,
        corpus.bytes as f64 / 1e6
    );
    for name in corpus.names.iter().take(NAMES_LISTED) {
        let _ = writeln!(out, "- `{name}`");
    }
    if corpus.names.len() > NAMES_LISTED {
        let _ = writeln!(out, "- and {} more", corpus.names.len() - NAMES_LISTED);
    }
    let runs = if plan.runs == 1 {
        "one run".to_string()
    } else {
        format!("median of {} runs (slowest-fastest)", plan.runs)
    };
    let _ = writeln!(
        out,
        "\n### Chunking speed, MB/s (FastCDC paper Fig. 10)\n\n\
         Chunking alone, one thread, input in memory; {runs}. Columns: expected chunk \
         size (min = 1/4, max = 8x); FastCDC at normalization level {}.\n",
        plan.level
    );
    let avg_key = |m: &Measurement| m.config.avg_size;
    sweep_table(
        &mut out,
        "algorithm",
        &report.size_sweep,
        &plan.avg_sizes,
        avg_key,
        speed_cell,
    );
    let _ = writeln!(
        out,
        "### Dedup ratio (FastCDC paper Table 3)\n\n\
         Input bytes / bytes of distinct chunks (BLAKE3), and in brackets the paper's \
         measure: the share of bytes found duplicate.\n"
    );
    sweep_table(
        &mut out,
        "algorithm",
        &report.size_sweep,
        &plan.avg_sizes,
        avg_key,
        dedup_cell,
    );
    let _ = writeln!(
        out,
        "### Average chunk size, bytes (FastCDC paper Table 3)\n"
    );
    sweep_table(
        &mut out,
        "algorithm",
        &report.size_sweep,
        &plan.avg_sizes,
        avg_key,
        mean_cell,
    );

    let min_avg = format_size(plan.min_sweep_avg as f64);
    let min_key = |m: &Measurement| m.config.min_size;
    let _ = writeln!(
        out,
        "### Minimum chunk size at {min_avg} expected (FastCDC paper Fig. 11)\n\n\
         Columns: minimum chunk size; maximum {}. \"NC n\": normalization level n (0: \
         cut-point skipping alone, as in the paper's Fig. 11).\n\nSpeed, MB/s, {runs}:\n",
        format_size((plan.min_sweep_avg * 8) as f64)
    );
    sweep_table(
        &mut out,
        "series",
        &report.min_sweep,
        &plan.min_sizes,
        min_key,
        speed_cell,
    );
    out.push_str("Dedup ratio:\n\n");
    sweep_table(
        &mut out,
        "series",
        &report.min_sweep,
        &plan.min_sizes,
        min_key,
        dedup_cell,
    );
    out.push_str("Average chunk size, bytes:\n\n");
    sweep_table(
        &mut out,
        "series",
        &report.min_sweep,
        &plan.min_sizes,
        min_key,
        mean_cell,
    );

    let _ = writeln!(
        out,
        "### Chunk sizes at {} expected (FastCDC paper Fig. 9)\n",
        format_size(plan.distribution_avg as f64)
    );
    let header: Vec<String> = [
        "algorithm",
        "chunks",
        "mean",
        "std dev",
        "smallest",
        "largest",
        "< expected/2",
        "at maximum",
    ]
    .map(String::from)
    .to_vec();
    let rows: Vec<Vec<String>> = report
        .distributions()
        .into_iter()
        .map(|m| {
            let h = &m.distribution;
            let total = h.total().max(1) as f64;
            // Bins are 1/8 of the expected size wide, so the first four are below half of it.
            let below_half: u64 = h.counts.iter().take(4).sum();
            let at_max = h.counts.last().copied().unwrap_or(0);
            vec![
                m.algo.to_string(),
                m.sizes.chunks.to_string(),
                format!("{:.0}", m.sizes.mean),
                format!("{:.0}", m.sizes.std_dev),
                m.sizes.min.to_string(),
                m.sizes.max.to_string(),
                format!("{:.1}%", 100.0 * below_half as f64 / total),
                format!("{:.1}%", 100.0 * at_max as f64 / total),
            ]
        })
        .collect();
    table(&mut out, &header, &rows);

    if !report.notes.is_empty() {
        out.push_str("### Skipped\n\n");
        for n in &report.notes {
            let what = n.config.map_or(n.algo.to_string(), |c| describe(&c));
            let _ = writeln!(out, "- {}: {what}: {}", n.experiment, n.reason);
        }
        out.push('\n');
    }
    out
}

/// report.md: how it was made, the tables, and every plot with its caption.
pub fn report_markdown(report: &ChunkBenchReport, plots: &[PlotFile], command: &str) -> String {
    let mut out = String::from("# larder bench chunk\n\n");
    let _ = writeln!(
        out,
        "Made by `{command}`. The experiments and their settings are described in \
         larder's `docs/design/bench.md`.\n"
    );
    out.push_str("## Results\n\n");
    out.push_str(&markdown_tables(report));
    out.push_str("## Plots\n\n");
    for p in plots {
        let _ = writeln!(
            out,
            "### {}\n\n![{}]({})\n\n{}\n",
            p.title, p.title, p.file, p.caption
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_lines_scale_bars_to_the_fullest_bucket() {
        let buckets = [
            SizeBucket {
                low: 1024,
                high: 2048,
                chunks: 1,
            },
            SizeBucket {
                low: 2048,
                high: 4096,
                chunks: 0,
            },
            SizeBucket {
                low: 4096,
                high: 8192,
                chunks: 10,
            },
        ];
        let lines = histogram_lines(&buckets, 20);
        assert_eq!(lines.len(), 3);
        assert!(
            lines[0].contains("1 KiB") && lines[0].ends_with(" ##"),
            "{}",
            lines[0]
        );
        assert!(!lines[1].contains('#'));
        assert!(lines[2].ends_with(&"#".repeat(20)));
        assert!(lines[2].contains("90.9%"));
    }
}
