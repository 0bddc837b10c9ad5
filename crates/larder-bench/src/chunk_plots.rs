//! The plots of a [`ChunkBenchReport`]: speed, dedup ratio and mean size against the
//! sweeps' parameters, the size distributions overlaid, and a histogram per
//! measurement, drawn with `plot.rs`'s charts.

use std::fs;
use std::path::Path;

use plotters::prelude::*;

use crate::chunk::{ChunkBenchReport, Measurement, Series};
use crate::plot::{
    colour, draw_legend, failed, format_size, line_chart, padded, tick_format, LegendMark, Line,
    LineChart, PlotFile, XScale, YScale, FONT, HEIGHT, LEGEND_WIDTH, WIDTH,
};
use crate::BenchError;

/// What a sweep plot puts on the y axis.
#[derive(Clone, Copy)]
enum Metric {
    Speed,
    DedupRatio,
    MeanSize,
}

impl Metric {
    fn y_scale(self) -> YScale {
        match self {
            Metric::Speed => YScale::FromZeroWithoutOutliers,
            Metric::DedupRatio => YScale::Fitted,
            Metric::MeanSize => YScale::FromZero,
        }
    }
}

fn metric_lines(series: &[Series], x: impl Fn(&Measurement) -> f64, metric: Metric) -> Vec<Line> {
    series
        .iter()
        .filter(|s| !s.points.is_empty())
        .map(|s| Line {
            label: s.label.clone(),
            points: s
                .points
                .iter()
                .map(|m| {
                    let y = match metric {
                        Metric::Speed => m.speed.median_mb_per_sec,
                        Metric::DedupRatio => m.dedup.ratio,
                        Metric::MeanSize => m.sizes.mean / 1024.0,
                    };
                    (x(m), y)
                })
                .collect(),
            bars: match metric {
                Metric::Speed => s
                    .points
                    .iter()
                    .map(|m| (x(m), m.speed.min_mb_per_sec, m.speed.max_mb_per_sec))
                    .collect(),
                _ => Vec::new(),
            },
        })
        .collect()
}

const SPEED_DESC: &str = "chunking speed (MB/s; median, bars min to max)";
const DEDUP_DESC: &str = "dedup ratio (input bytes / distinct bytes)";
const MEAN_DESC: &str = "average chunk size (KiB)";

fn sweep_plots(report: &ChunkBenchReport) -> Vec<(PlotFile, LineChart<'static>)> {
    let avg_x = |m: &Measurement| (m.config.avg_size as f64).log2();
    let min_x = |m: &Measurement| m.config.min_size as f64 / 1024.0;
    let min_avg = format_size(report.plan.min_sweep_avg as f64);
    let size_x_desc = "expected chunk size (KiB, log scale; min = 1/4, max = 8x)";
    let min_x_desc = "minimum chunk size (KiB)";
    let size = |file: &'static str, title: &str, caption: &str, metric: Metric, y_desc| {
        (
            PlotFile {
                file: file.into(),
                title: title.into(),
                caption: caption.into(),
            },
            LineChart {
                name: file,
                title: title.into(),
                x_desc: size_x_desc,
                y_desc,
                x_scale: XScale::Log2Bytes,
                y_scale: metric.y_scale(),
                marker_every: 1,
                lines: metric_lines(&report.size_sweep, avg_x, metric),
            },
        )
    };
    let min = |file: &'static str, title: String, caption: &str, metric: Metric, y_desc| {
        (
            PlotFile {
                file: file.into(),
                title: title.clone(),
                caption: caption.into(),
            },
            LineChart {
                name: file,
                title,
                x_desc: min_x_desc,
                y_desc,
                x_scale: XScale::Linear,
                y_scale: metric.y_scale(),
                marker_every: 1,
                lines: metric_lines(&report.min_sweep, min_x, metric),
            },
        )
    };
    vec![
        size(
            "speed-vs-expected-size.svg",
            "Chunking speed vs expected chunk size (FastCDC paper Fig. 10)",
            "Chunking speed of each algorithm (median of the runs, bars from the slowest to the fastest run) as the expected chunk size grows; a kind more than 20 times faster than the median one (fixed-size chunking) is named off scale in the legend, its figures are in the table.",
            Metric::Speed,
            SPEED_DESC,
        ),
        size(
            "dedup-vs-expected-size.svg",
            "Dedup ratio vs expected chunk size (FastCDC paper Table 3)",
            "Input bytes over bytes of distinct chunks across all inputs, per algorithm and expected chunk size.",
            Metric::DedupRatio,
            DEDUP_DESC,
        ),
        size(
            "mean-size-vs-expected-size.svg",
            "Average chunk size vs expected chunk size (FastCDC paper Table 3)",
            "The average size of the chunks each algorithm actually cut, against the expected size it was configured with.",
            Metric::MeanSize,
            MEAN_DESC,
        ),
        min(
            "speed-vs-min-size.svg",
            format!("Chunking speed vs minimum chunk size at {min_avg} expected (Fig. 11a/b)"),
            "Cut-point skipping: chunking speed as the minimum chunk size grows (the bytes below it are never hashed).",
            Metric::Speed,
            SPEED_DESC,
        ),
        min(
            "dedup-vs-min-size.svg",
            format!("Dedup ratio vs minimum chunk size at {min_avg} expected (Fig. 11c)"),
            "What cut-point skipping costs in duplicates found, with and without normalized chunking.",
            Metric::DedupRatio,
            DEDUP_DESC,
        ),
        min(
            "mean-size-vs-min-size.svg",
            format!("Average chunk size vs minimum chunk size at {min_avg} expected (Fig. 11d)"),
            "The average size of the chunks cut as the minimum grows, with and without normalized chunking (the paper expects about expected + minimum without it).",
            Metric::MeanSize,
            MEAN_DESC,
        ),
    ]
}

fn percent(count: u64, total: u64) -> f64 {
    if total == 0 {
        0.0
    } else {
        100.0 * count as f64 / total as f64
    }
}

/// The cumulative size distributions of every kind at the distribution size, one line
/// each (the paper's Fig. 7 form): histograms of kinds as different as fixed-size and
/// content-defined chunking do not share a readable y axis, shares up to a size do.
fn distribution_overlay(report: &ChunkBenchReport) -> (PlotFile, LineChart<'static>) {
    let avg = format_size(report.plan.distribution_avg as f64);
    let title = format!("Cumulative chunk-size distribution at {avg} expected (Fig. 9)");
    let lines = report
        .distributions()
        .into_iter()
        .map(|m| {
            let h = &m.distribution;
            let total = h.total();
            let bin_kib = h.bin_bytes as f64 / 1024.0;
            let mut below = 0;
            let mut points = vec![(0.0, 0.0)];
            for (i, &count) in h.counts.iter().enumerate() {
                below += count;
                points.push(((i + 1) as f64 * bin_kib, percent(below, total)));
            }
            Line {
                label: m.algo.to_string(),
                points,
                bars: Vec::new(),
            }
        })
        .collect();
    (
        PlotFile {
            file: "size-distribution.svg".into(),
            title: title.clone(),
            caption: format!(
                "Share of chunks smaller than each size, per algorithm, in steps of 1/8 of {avg}; the last step holds the chunks cut at the maximum size."
            ),
        },
        LineChart {
            name: "size-distribution.svg",
            title,
            x_desc: "chunk size (KiB)",
            y_desc: "chunks smaller than the size (% of all chunks)",
            x_scale: XScale::Linear,
            y_scale: YScale::FromZero,
            marker_every: 8,
            lines,
        },
    )
}

/// A histogram of one measurement's chunk sizes, with its minimum, expected and mean
/// sizes marked.
pub fn histogram_svg(m: &Measurement, title: &str, name: &str) -> Result<String, BenchError> {
    let fail = failed(name);
    let h = &m.distribution;
    let total = h.total();
    let bin_kib = h.bin_bytes as f64 / 1024.0;
    let bars: Vec<(f64, f64)> = h
        .counts
        .iter()
        .enumerate()
        .map(|(i, &c)| (i as f64 * bin_kib, percent(c, total)))
        .collect();
    let x_high = h.counts.len() as f64 * bin_kib;
    let y_high = bars.iter().map(|b| b.1).fold(0.0, f64::max);
    let (_, y_high) = padded(0.0, y_high, true);
    let min_kib = m.config.min_size as f64 / 1024.0;
    let avg_kib = m.config.avg_size as f64 / 1024.0;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(&fail)?;
        let (plot_area, legend_area) = root.split_horizontally(WIDTH - LEGEND_WIDTH);
        let mut chart = ChartBuilder::on(&plot_area)
            .caption(title, (FONT, 20))
            .margin(14)
            .x_label_area_size(52)
            .y_label_area_size(78)
            .build_cartesian_2d(0.0..x_high, 0.0..y_high)
            .map_err(&fail)?;
        let x_format = tick_format(x_high);
        let y_format = tick_format(y_high);
        chart
            .configure_mesh()
            .x_desc("chunk size (KiB)")
            .y_desc("chunks in the bin (% of all chunks)")
            .axis_desc_style((FONT, 16))
            .label_style((FONT, 14))
            .x_label_formatter(&x_format)
            .y_label_formatter(&y_format)
            .light_line_style(RGBColor(235, 235, 235))
            .draw()
            .map_err(&fail)?;
        let bar_colour = colour(0);
        chart
            .draw_series(bars.iter().map(|&(x, y)| {
                Rectangle::new([(x, 0.0), (x + bin_kib, y)], bar_colour.mix(0.8).filled())
            }))
            .map_err(&fail)?;
        let mean_kib = m.sizes.mean / 1024.0;
        let marks = [
            (min_kib, colour(3)),
            (avg_kib, colour(2)),
            (mean_kib, colour(1)),
        ];
        for (x, c) in marks {
            chart
                .draw_series(std::iter::once(PathElement::new(
                    vec![(x, 0.0), (x, y_high)],
                    c.stroke_width(2),
                )))
                .map_err(&fail)?;
        }
        let entries = [
            (
                format!("{}: {} chunks", m.algo, m.sizes.chunks),
                LegendMark::Bar(bar_colour),
            ),
            (
                format!("minimum {}", format_size(m.config.min_size as f64)),
                LegendMark::Line(colour(3)),
            ),
            (
                format!("expected {}", format_size(m.config.avg_size as f64)),
                LegendMark::Line(colour(2)),
            ),
            (
                format!("mean {}", format_size(m.sizes.mean)),
                LegendMark::Line(colour(1)),
            ),
        ];
        draw_legend(&legend_area, &entries, name)?;
        root.present().map_err(&fail)?;
    }
    Ok(svg)
}

/// Every plot of `report`, as `(file, svg)`, in the order report.md shows them.
pub fn render_all(report: &ChunkBenchReport) -> Result<Vec<(PlotFile, String)>, BenchError> {
    let mut plots = Vec::new();
    let mut charts = sweep_plots(report);
    charts.push(distribution_overlay(report));
    for (file, chart) in charts {
        let svg = line_chart(&chart)?;
        plots.push((file, svg));
    }
    let avg = format_size(report.plan.distribution_avg as f64);
    for m in report.distributions() {
        let file = format!("size-distribution-{}.svg", m.algo);
        let title = format!("{} chunk sizes at {avg} expected (Fig. 9)", m.algo);
        let svg = histogram_svg(m, &title, &file)?;
        plots.push((
            PlotFile {
                file,
                title,
                caption: format!(
                    "{}: share of chunks per size bin, with its minimum, expected and mean sizes marked.",
                    m.algo
                ),
            },
            svg,
        ));
    }
    Ok(plots)
}

/// Writes every plot into `dir` (created if missing).
pub fn write_all(report: &ChunkBenchReport, dir: &Path) -> Result<Vec<PlotFile>, BenchError> {
    fs::create_dir_all(dir).map_err(|e| BenchError::io(dir, e))?;
    let mut files = Vec::new();
    for (file, svg) in render_all(report)? {
        let path = dir.join(&file.file);
        fs::write(&path, svg).map_err(|e| BenchError::io(&path, e))?;
        files.push(file);
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunk::{run_chunk_bench, Plan};
    use crate::corpus::{Corpus, Stream};
    use crate::plot::tests::texts;

    fn report() -> ChunkBenchReport {
        let mut state = 7u64;
        let data: Vec<u8> = (0..400_000)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 56) as u8
            })
            .collect();
        let corpus = Corpus {
            streams: vec![Stream {
                name: "random".into(),
                data,
            }],
        };
        run_chunk_bench(&corpus, &Plan::quick(), &mut |_| {}).unwrap()
    }

    #[test]
    fn every_plot_is_valid_svg_with_title_axis_labels_and_legend() {
        let report = report();
        let plots = render_all(&report).unwrap();
        let kinds = report.size_sweep.len();
        assert_eq!(plots.len(), 7 + kinds);
        for (file, svg) in &plots {
            let texts = texts(svg);
            let has = |s: &str| texts.iter().any(|t| t.contains(s));
            assert!(has(&file.title), "{}: no title in {texts:?}", file.file);
            assert!(has("legend"), "{}: no legend", file.file);
            assert!(
                texts.iter().any(|t| t.contains("(KiB")),
                "{}: no x-axis label with a unit",
                file.file
            );
            assert!(
                has("MB/s") || has("dedup ratio") || has("(KiB)") || has("% of all chunks"),
                "{}: no y-axis label in {texts:?}",
                file.file
            );
        }
        let (_, speed) = &plots[0];
        let texts = texts(speed);
        for series in &report.size_sweep {
            assert!(
                texts.iter().any(|t| t.starts_with(&series.label)),
                "legend lacks {} in {texts:?}",
                series.label
            );
        }
        assert!(texts.contains(&SPEED_DESC.to_string()));
        assert!(texts.iter().any(|t| t == "8 KiB"), "x ticks: {texts:?}");
    }

    #[test]
    fn write_all_writes_every_file() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("plots");
        let files = write_all(&report(), &out).unwrap();
        for f in &files {
            let svg = std::fs::read_to_string(out.join(&f.file)).unwrap();
            assert!(svg.starts_with("<svg"), "{}", f.file);
        }
    }
}
