//! The SVG plots of `larder bench report` beyond `larder bench chunk`'s: P-Dedupe's
//! throughputs, its model, parallel chunking against segment size, the generator's
//! ground truth and the index rates. Drawn with [`crate::plot`]'s charts, so they share
//! its layout: title, axis labels with units, legend on the right.

use crate::gen_truth::GenTruthReport;
use crate::index::{IndexRate, CUCKOO, CUCKOO_PARALLEL, HASHBROWN, HIT, INSERT, MISS};
use crate::pipeline::PipelineReport;
use crate::plot::{
    bar_chart, format_size, line_chart, BarChart, BarSeries, Line, LineChart, PlotFile, Spread,
    XScale, YScale,
};
use crate::BenchError;

const THROUGHPUT: &str = "backup throughput (MB/s of input)";

fn plot_file(file: String, title: String, caption: String) -> PlotFile {
    PlotFile {
        file,
        title,
        caption,
    }
}

/// Short names of the modes for the x axis ("serial", "pipelined", "N threads").
fn mode_name(threads: usize, serial: bool) -> String {
    match (serial, threads) {
        (true, _) => "serial".into(),
        (false, 1) => "pipelined".into(),
        (false, t) => format!("+ parallel, {t} threads"),
    }
}

/// P-Dedupe's Fig. 14 and the model of its equations 4 to 6, for one dataset.
pub fn pipeline_plots(
    r: &PipelineReport,
    prefix: &str,
    dataset: &str,
) -> Result<Vec<(PlotFile, String)>, BenchError> {
    let categories: Vec<String> = r
        .modes
        .iter()
        .map(|m| mode_name(m.threads, m.serial))
        .collect();
    let file = format!("{prefix}pdedupe-throughput.svg");
    let title = format!("Backup throughput by mode, {dataset} (P-Dedupe Fig. 14)");
    let svg = bar_chart(&BarChart {
        name: &file,
        title: title.clone(),
        y_desc: THROUGHPUT,
        categories: categories.clone(),
        series: vec![BarSeries {
            label: "larder backup".into(),
            values: r.modes.iter().map(|m| Some(m.mb_per_sec)).collect(),
        }],
    })?;
    let mut plots = vec![(
        plot_file(
            file,
            title,
            format!(
                "Input MB per second of a whole backup of {dataset} into a fresh repository, start to commit: the stages taking turns on one thread (P-Dedupe's baseline), overlapped on one thread each, and overlapped with chunking, fingerprinting and compression on N threads."
            ),
        ),
        svg,
    )];
    let file = format!("{prefix}pdedupe-model.svg");
    let title = format!("Measured throughput against equations 4 to 6, {dataset}");
    let svg = bar_chart(&BarChart {
        name: &file,
        title: title.clone(),
        y_desc: THROUGHPUT,
        categories,
        series: vec![
            BarSeries {
                label: "measured".into(),
                values: r.model.iter().map(|m| Some(m.measured)).collect(),
            },
            BarSeries {
                label: "model, eq. 4 to 6".into(),
                values: r
                    .model
                    .iter()
                    .map(|m| Some(Spread::exact(m.model_mb_per_sec)))
                    .collect(),
            },
            BarSeries {
                label: format!("model on {} cores", r.cores),
                values: r
                    .model
                    .iter()
                    .map(|m| Some(Spread::exact(m.bounded_mb_per_sec)))
                    .collect(),
            },
        ],
    })?;
    plots.push((
        plot_file(
            file,
            title,
            "The paper's model from the serial runs' median stage times (Tc chunk, Tf fingerprint, Ti index, Tw/D write of the new data): eq. 4 serial, eq. 5 pipelined, eq. 6 with N threads; and the same bounded by the cores, which cannot do the stages' total work faster than all together.".into(),
        ),
        svg,
    ));
    let file = format!("{prefix}parallel-chunking.svg");
    let title = format!("Parallel chunking speed vs segment size, {dataset}");
    let mut lines = Vec::new();
    for &t in &r.plan.segment_threads {
        let points: Vec<_> = r.segments.iter().filter(|p| p.threads == t).collect();
        lines.push(Line {
            label: format!("{t} thread{}", if t == 1 { "" } else { "s" }),
            points: points
                .iter()
                .map(|p| ((p.segment_size as f64).log2(), p.mb_per_sec.median))
                .collect(),
            bars: points
                .iter()
                .map(|p| {
                    let x = (p.segment_size as f64).log2();
                    (x, p.mb_per_sec.min, p.mb_per_sec.max)
                })
                .collect(),
        });
    }
    let svg = line_chart(&LineChart {
        name: &file,
        title: title.clone(),
        x_desc: "segment size (log scale)",
        y_desc: "chunking speed (MB/s; median, bars min to max)",
        x_scale: XScale::Log2Bytes,
        y_scale: YScale::FromZero,
        marker_every: 1,
        lines,
    })?;
    plots.push((
        plot_file(
            file,
            title,
            "larder's exact parallel chunker (FastCDC 2/8/64 KiB, whole streams in memory, chunking alone) against its segment size, per thread count (P-Dedupe Fig. 10 measures its whole pipeline this way).".into(),
        ),
        svg,
    ));
    Ok(plots)
}

/// The dedup ratio per generation: the truth against larder's counts, log scale.
pub fn gen_truth_plot(r: &GenTruthReport) -> Result<(PlotFile, String), BenchError> {
    let file = "gen-truth.svg".to_string();
    let title = format!(
        "Dedup ratio per generation against the ground truth ({} generations)",
        format_size(r.plan.generation_size as f64)
    );
    type Column = fn(&crate::gen_truth::GenerationRow) -> u64;
    let columns: [(&str, Column); 4] = [
        ("generator's truth", |g| g.truth_new),
        ("larder backup", |g| g.backup_new),
        ("FastCDC, data only", |g| g.data_new),
        ("fixed 4 KiB, data only", |g| g.fixed_new),
    ];
    let lines = columns
        .iter()
        .map(|(label, column)| Line {
            label: label.to_string(),
            points: r
                .rows
                .iter()
                .map(|g| (f64::from(g.generation), g.ratio(column(g))))
                .collect(),
            bars: Vec::new(),
        })
        .collect();
    let svg = line_chart(&LineChart {
        name: &file,
        title: title.clone(),
        x_desc: "generation (1 is the first full backup)",
        y_desc: "dedup ratio (bytes / new bytes, log scale)",
        x_scale: XScale::Count,
        y_scale: YScale::Log10,
        marker_every: 1,
        lines,
    })?;
    Ok((
        plot_file(
            file,
            title,
            "Each generation's bytes over its new bytes: what the generator knows is new, what larder's backup stored (file data and the tree stream), and the new chunk bytes of the data alone with FastCDC (the backup's chunker) and with fixed 4 KiB chunks.".into(),
        ),
        svg,
    ))
}

/// Insert and lookup rates per structure, one group per operation and size.
pub fn index_plot(rates: &[IndexRate]) -> Result<(PlotFile, String), BenchError> {
    let file = "index-rates.svg".to_string();
    let title = "Fingerprint index: inserts and lookups, one thread unless noted".to_string();
    let mut sizes: Vec<usize> = rates.iter().map(|r| r.size).collect();
    sizes.dedup();
    let groups: Vec<(usize, &str)> = sizes
        .iter()
        .flat_map(|&n| [INSERT, HIT, MISS].map(|o| (n, o)))
        .collect();
    let millions = |n: usize| format!("{}M", n as f64 / 1e6);
    let categories = groups
        .iter()
        .map(|(n, o)| format!("{o}, {}", millions(*n)))
        .collect();
    let series = [CUCKOO, CUCKOO_PARALLEL, HASHBROWN]
        .iter()
        .map(|&s| BarSeries {
            label: s.to_string(),
            values: groups
                .iter()
                .map(|&(n, o)| {
                    rates
                        .iter()
                        .find(|r| r.size == n && r.operation == o && r.structure == s)
                        .map(|r| r.mops)
                })
                .collect(),
        })
        .collect();
    let svg = bar_chart(&BarChart {
        name: &file,
        title: title.clone(),
        y_desc: "rate (million operations per second)",
        categories,
        series,
    })?;
    Ok((
        plot_file(
            file,
            title,
            "CuckooIndex (larder-index) against hashbrown's HashMap holding the same uniform 32-byte keys, sized for them: inserts of every key; lookups of every inserted key (hit) and of as many keys never inserted (miss). insert_batch runs on every core.".into(),
        ),
        svg,
    ))
}
