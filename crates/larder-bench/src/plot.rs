//! SVG line and bar charts, drawn with plotters' SVG backend, for every benchmark's
//! plots (`chunk_plots.rs`, `disk_index_plots.rs`, `report_plots.rs`). Text is laid
//! out by plotters itself (no font files), so plots render on a machine without fonts;
//! the viewer picks a sans-serif font. Every plot has a title, axis labels with units,
//! and a legend in a panel to the right of the plotting area, where it hides no data.

use std::fmt::Display;

use plotters::coord::Shift;
use plotters::element::{Drawable, PointCollection};
use plotters::prelude::*;
use plotters_backend::text_anchor::{HPos, Pos, VPos};
use plotters_backend::{BackendCoord, DrawingErrorKind};
use serde::Serialize;

use crate::BenchError;

pub(crate) const WIDTH: u32 = 1040;
pub(crate) const HEIGHT: u32 = 600;
/// Width of the legend panel on the right.
pub(crate) const LEGEND_WIDTH: u32 = 270;
pub(crate) const FONT: &str = "sans-serif";

/// Tableau 10: distinct colours, readable on white and by most colour-blind readers.
const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

pub(crate) fn colour(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

/// A plot written to the output directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlotFile {
    /// File name inside the output directory.
    pub file: String,
    pub title: String,
    /// What the plot shows, one sentence, for report.md.
    pub caption: String,
}

pub(crate) fn failed<E: Display>(plot: &str) -> impl Fn(E) -> BenchError + '_ {
    move |e| BenchError::Plot {
        plot: plot.to_string(),
        reason: e.to_string(),
    }
}

/// One line: `(x, y)` points and, optionally, a vertical bar `(x, low, high)` at each.
#[derive(Clone)]
pub(crate) struct Line {
    pub label: String,
    pub points: Vec<(f64, f64)>,
    pub bars: Vec<(f64, f64, f64)>,
}

/// How x values are shown.
#[derive(Clone, Copy)]
pub(crate) enum XScale {
    /// x is log2 of a size in bytes; ticks at whole powers of two.
    Log2Bytes,
    /// x is linear, in the unit its axis label names.
    Linear,
    /// x counts something (generations): ticks only at whole numbers.
    Count,
}

pub(crate) struct LineChart<'a> {
    pub name: &'a str,
    pub title: String,
    pub x_desc: &'a str,
    pub y_desc: &'a str,
    pub x_scale: XScale,
    pub y_scale: YScale,
    /// Draw a marker on every this many points (1: all of them).
    pub marker_every: usize,
    pub lines: Vec<Line>,
}

/// A size in bytes as people write it: `512 B`, `8 KiB`, `1.5 MiB`.
pub fn format_size(bytes: f64) -> String {
    const UNITS: [(&str, f64); 3] = [
        ("GiB", 1024.0 * 1024.0 * 1024.0),
        ("MiB", 1024.0 * 1024.0),
        ("KiB", 1024.0),
    ];
    for (unit, scale) in UNITS {
        if bytes >= scale {
            let v = bytes / scale;
            return if (v - v.round()).abs() < 0.05 {
                format!("{v:.0} {unit}")
            } else {
                format!("{v:.1} {unit}")
            };
        }
    }
    format!("{bytes:.0} B")
}

/// Formats axis ticks over a range `span` wide: enough decimals to tell ticks apart
/// (plotters puts about ten on an axis), trailing zeros dropped.
pub(crate) fn tick_format(span: f64) -> impl Fn(&f64) -> String {
    let decimals = if span > 0.0 {
        (1.0 - (span / 10.0).log10().floor()).clamp(0.0, 6.0) as usize
    } else {
        0
    };
    move |v: &f64| {
        let text = format!("{v:.decimals$}");
        if text.contains('.') {
            text.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            text
        }
    }
}

/// `low..high` padded by 8% of the span on each side (and by 1 where the span is 0);
/// from zero when `from_zero` and every value is positive.
pub(crate) fn padded(low: f64, high: f64, from_zero: bool) -> (f64, f64) {
    let low = if from_zero { low.min(0.0) } else { low };
    let span = if high > low { high - low } else { 1.0 };
    let pad = span * 0.08;
    let bottom = if from_zero && low >= 0.0 {
        0.0
    } else {
        low - pad
    };
    (bottom, high + pad)
}

/// The marker of line `line` of a chart, at one point. Shapes differ as well as
/// colours and shrink from the first line to the seventh, each drawn over the ones
/// before, so points that coincide (FastCDC 2016 and 2020 cut alike) show as nested
/// shapes rather than one hiding the other.
struct Marker<C> {
    at: C,
    line: usize,
}

impl<'a, C> PointCollection<'a, C> for &'a Marker<C> {
    type Point = &'a C;
    type IntoIter = std::iter::Once<&'a C>;

    fn point_iter(self) -> Self::IntoIter {
        std::iter::once(&self.at)
    }
}

impl<DB: DrawingBackend, C> Drawable<DB> for Marker<C> {
    fn draw<I: Iterator<Item = BackendCoord>>(
        &self,
        mut points: I,
        backend: &mut DB,
        _: (u32, u32),
    ) -> Result<(), DrawingErrorKind<DB::ErrorType>> {
        let Some((x, y)) = points.next() else {
            return Ok(());
        };
        let c = colour(self.line);
        let (filled, hollow) = (c.filled(), c.stroke_width(2));
        let triangle = |r: i32| [(x, y - r), (x - r, y + r * 3 / 4), (x + r, y + r * 3 / 4)];
        match self.line % 7 {
            0 => backend.draw_rect((x - 8, y - 8), (x + 8, y + 8), &hollow, false),
            1 => backend.draw_circle((x, y), 6, &hollow, false),
            2 => {
                backend.draw_line((x - 5, y - 5), (x + 5, y + 5), &hollow)?;
                backend.draw_line((x - 5, y + 5), (x + 5, y - 5), &hollow)
            }
            3 => backend.fill_polygon(triangle(5), &filled),
            4 => backend.draw_circle((x, y), 3, &filled, true),
            5 => backend.draw_rect((x - 2, y - 2), (x + 2, y + 2), &filled, true),
            _ => {
                let [a, b, d] = triangle(11);
                backend.draw_path([a, b, d, a], &hollow)
            }
        }
    }
}

/// How a legend entry is drawn.
pub(crate) enum LegendMark {
    /// A filled box, for bars.
    Bar(RGBColor),
    /// A plain line, for a marked value.
    Line(RGBColor),
    /// Line `i` of a line chart, with its marker.
    Series(usize),
}

pub(crate) fn draw_legend(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    entries: &[(String, LegendMark)],
    name: &str,
) -> Result<(), BenchError> {
    let fail = failed(name);
    area.draw(&Text::new(
        "legend",
        (12, 60),
        (FONT, 16).into_font().style(FontStyle::Bold),
    ))
    .map_err(&fail)?;
    for (i, (label, mark)) in entries.iter().enumerate() {
        let y = 90 + 28 * i as i32;
        let segment = |c: RGBColor| PathElement::new(vec![(8, y), (44, y)], c.stroke_width(2));
        match *mark {
            LegendMark::Bar(c) => area
                .draw(&Rectangle::new([(14, y - 7), (38, y + 7)], c.filled()))
                .map_err(&fail)?,
            LegendMark::Line(c) => area.draw(&segment(c)).map_err(&fail)?,
            LegendMark::Series(line) => {
                area.draw(&segment(colour(line))).map_err(&fail)?;
                area.draw(&Marker { at: (26, y), line }).map_err(&fail)?;
            }
        }
        area.draw(&Text::new(label.as_str(), (54, y - 8), (FONT, 15)))
            .map_err(&fail)?;
    }
    Ok(())
}

/// How y values are laid out.
#[derive(Clone, Copy)]
pub(crate) enum YScale {
    /// Linear, from zero (sizes).
    FromZero,
    /// Linear, fitted to the values (dedup ratios, which differ by little).
    Fitted,
    /// Linear from zero, leaving out lines that peak at more than [`OFF_SCALE`] times
    /// the median line's peak (speeds: fixed-size chunking does no per-byte work and
    /// would flatten every content-defined line); the legend names them off scale.
    FromZeroWithoutOutliers,
    /// Logarithmic (values that span orders of magnitude, all positive): drawn as
    /// log10, ticks labelled with the values at whole powers of ten.
    Log10,
    /// What `Log10` is drawn as: the values are already log10.
    Log10Drawn,
}

/// `spec` with every y value (points and bars) replaced by its log10, to be drawn as
/// [`YScale::Log10Drawn`]. Values that are not positive are left out.
fn log10_lines<'a>(spec: &LineChart<'a>) -> LineChart<'a> {
    let lines = spec
        .lines
        .iter()
        .map(|l| Line {
            label: l.label.clone(),
            points: l
                .points
                .iter()
                .filter(|p| p.1 > 0.0)
                .map(|&(x, y)| (x, y.log10()))
                .collect(),
            bars: l
                .bars
                .iter()
                .filter(|b| b.1 > 0.0)
                .map(|&(x, lo, hi)| (x, lo.log10(), hi.log10()))
                .collect(),
        })
        .collect();
    LineChart {
        name: spec.name,
        title: spec.title.clone(),
        x_desc: spec.x_desc,
        y_desc: spec.y_desc,
        x_scale: spec.x_scale,
        y_scale: YScale::Log10Drawn,
        marker_every: spec.marker_every,
        lines,
    }
}

const OFF_SCALE: f64 = 20.0;

fn peak(line: &Line) -> f64 {
    line.points
        .iter()
        .map(|p| p.1)
        .chain(line.bars.iter().map(|b| b.2))
        .fold(f64::MIN, f64::max)
}

/// Which lines to leave out of a chart's axis range.
fn off_scale(spec: &LineChart<'_>) -> Vec<bool> {
    let mut peaks: Vec<f64> = spec.lines.iter().map(peak).collect();
    if !matches!(spec.y_scale, YScale::FromZeroWithoutOutliers) || peaks.is_empty() {
        return vec![false; spec.lines.len()];
    }
    peaks.sort_by(f64::total_cmp);
    let median = peaks[peaks.len() / 2];
    spec.lines
        .iter()
        .map(|l| median > 0.0 && peak(l) > OFF_SCALE * median)
        .collect()
}

/// The lines of `spec` (all but the `hidden` ones), their markers and bars, on `area`.
fn draw_lines(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    spec: &LineChart<'_>,
    (x_low, x_high): (f64, f64),
    (y_low, y_high): (f64, f64),
    hidden: &[bool],
) -> Result<(), BenchError> {
    let fail = failed(spec.name);
    let mut chart = ChartBuilder::on(area)
        .caption(&spec.title, (FONT, 20))
        .margin(14)
        .x_label_area_size(52)
        .y_label_area_size(78)
        .build_cartesian_2d(x_low..x_high, y_low..y_high)
        .map_err(&fail)?;
    let x_scale = spec.x_scale;
    let kib_format = tick_format(x_high - x_low);
    let x_format = move |x: &f64| match x_scale {
        XScale::Log2Bytes if (x - x.round()).abs() < 1e-6 => format_size(x.round().exp2()),
        XScale::Log2Bytes => String::new(),
        XScale::Linear => kib_format(x),
        XScale::Count if (x - x.round()).abs() < 1e-6 => format!("{x:.0}"),
        XScale::Count => String::new(),
    };
    let linear_format = tick_format(y_high - y_low);
    let log_axis = matches!(spec.y_scale, YScale::Log10Drawn);
    let y_format = move |y: &f64| match log_axis {
        // Ticks at whole powers of ten and at 2x and 5x them; others unlabelled.
        true => {
            let decade = 10f64.powf(y.floor());
            let lead = 10f64.powf(*y) / decade;
            match [1.0, 2.0, 5.0].iter().find(|&&m| (lead - m).abs() < 0.02) {
                Some(m) if m * decade >= 1.0 => format!("{:.0}", m * decade),
                Some(m) => format!("{}", m * decade),
                None => String::new(),
            }
        }
        false => linear_format(y),
    };
    chart
        .configure_mesh()
        .x_desc(spec.x_desc)
        .y_desc(spec.y_desc)
        .axis_desc_style((FONT, 16))
        .label_style((FONT, 14))
        .x_label_formatter(&x_format)
        .y_label_formatter(&y_format)
        .light_line_style(RGBColor(235, 235, 235))
        .draw()
        .map_err(&fail)?;
    for (i, line) in spec.lines.iter().enumerate() {
        if hidden[i] {
            continue;
        }
        let c = colour(i);
        chart
            .draw_series(LineSeries::new(line.points.clone(), c.stroke_width(2)))
            .map_err(&fail)?;
        chart
            .draw_series(
                line.bars.iter().map(|&(x, lo, hi)| {
                    PathElement::new(vec![(x, lo), (x, hi)], c.stroke_width(1))
                }),
            )
            .map_err(&fail)?;
        chart
            .draw_series(
                line.points
                    .iter()
                    .step_by(spec.marker_every.max(1))
                    .map(|&at| Marker { at, line: i }),
            )
            .map_err(&fail)?;
    }
    Ok(())
}

pub(crate) fn line_chart(spec: &LineChart<'_>) -> Result<String, BenchError> {
    if matches!(spec.y_scale, YScale::Log10) {
        return line_chart(&log10_lines(spec));
    }
    let fail = failed(spec.name);
    let hidden = off_scale(spec);
    let shown = || {
        spec.lines
            .iter()
            .zip(&hidden)
            .filter(|(_, &h)| !h)
            .map(|(l, _)| l)
    };
    let all_x = spec.lines.iter().flat_map(|l| l.points.iter().map(|p| p.0));
    let all_y = shown().flat_map(|l| {
        l.points
            .iter()
            .map(|p| p.1)
            .chain(l.bars.iter().flat_map(|b| [b.1, b.2]))
    });
    let (x_low, x_high) = all_x.fold((f64::MAX, f64::MIN), |(lo, hi), x| (lo.min(x), hi.max(x)));
    let (y_low, y_high) = all_y.fold((f64::MAX, f64::MIN), |(lo, hi), y| (lo.min(y), hi.max(y)));
    let x_range = if x_low > x_high {
        (0.0, 1.0)
    } else {
        let pad = ((x_high - x_low) * 0.05).max(0.25);
        (x_low - pad, x_high + pad)
    };
    let y_range = if y_low > y_high {
        (0.0, 1.0)
    } else {
        let from_zero = !matches!(spec.y_scale, YScale::Fitted | YScale::Log10Drawn);
        padded(y_low, y_high, from_zero)
    };

    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(&fail)?;
        let (plot_area, legend_area) = root.split_horizontally(WIDTH - LEGEND_WIDTH);
        draw_lines(&plot_area, spec, x_range, y_range, &hidden)?;
        let entries: Vec<_> = spec
            .lines
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let label = if hidden[i] {
                    format!("{}: off scale", l.label)
                } else {
                    l.label.clone()
                };
                (label, LegendMark::Series(i))
            })
            .collect();
        draw_legend(&legend_area, &entries, spec.name)?;
        root.present().map_err(&fail)?;
    }
    Ok(svg)
}

/// One series of a bar chart: a value per category (`None`: not measured), each a
/// median with the smallest and largest of its runs.
pub(crate) struct BarSeries {
    pub label: String,
    pub values: Vec<Option<Spread>>,
}

/// A median and the range of the runs around it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    /// The median, smallest and largest of `values` (all 0 when there are none).
    pub fn of(values: &[f64]) -> Self {
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = match n {
            0 => 0.0,
            _ if n % 2 == 1 => v[n / 2],
            _ => (v[n / 2 - 1] + v[n / 2]) / 2.0,
        };
        Self {
            median,
            min: v.first().copied().unwrap_or(0.0),
            max: v.last().copied().unwrap_or(0.0),
        }
    }

    /// A single value (a model's prediction, a count): no spread.
    pub fn exact(value: f64) -> Self {
        Self {
            median: value,
            min: value,
            max: value,
        }
    }
}

/// Grouped bars: one group per category along x, one bar per series in each group,
/// a whisker from the smallest to the largest run and the median written on top.
pub(crate) struct BarChart<'a> {
    pub name: &'a str,
    pub title: String,
    pub y_desc: &'a str,
    pub categories: Vec<String>,
    pub series: Vec<BarSeries>,
}

pub(crate) fn bar_chart(spec: &BarChart<'_>) -> Result<String, BenchError> {
    let fail = failed(spec.name);
    let groups = spec.categories.len().max(1) as f64;
    let high = spec
        .series
        .iter()
        .flat_map(|s| s.values.iter().flatten())
        .map(|v| v.max.max(v.median))
        .fold(0.0, f64::max);
    // Room above the tallest bar for its label.
    let (_, y_high) = padded(0.0, if high > 0.0 { high * 1.06 } else { 1.0 }, true);
    let value_format = tick_format(y_high / 10.0);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(&fail)?;
        let (plot_area, legend_area) = root.split_horizontally(WIDTH - LEGEND_WIDTH);
        let mut chart = ChartBuilder::on(&plot_area)
            .caption(&spec.title, (FONT, 20))
            .margin(14)
            .x_label_area_size(52)
            .y_label_area_size(78)
            .build_cartesian_2d(0.0..groups, 0.0..y_high)
            .map_err(&fail)?;
        let y_format = tick_format(y_high);
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(0)
            .y_desc(spec.y_desc)
            .axis_desc_style((FONT, 16))
            .label_style((FONT, 14))
            .y_label_formatter(&y_format)
            .light_line_style(RGBColor(235, 235, 235))
            .draw()
            .map_err(&fail)?;
        let width = 0.8 / spec.series.len().max(1) as f64;
        let label_style =
            TextStyle::from((FONT, 12).into_font()).pos(Pos::new(HPos::Center, VPos::Bottom));
        for (j, series) in spec.series.iter().enumerate() {
            let c = colour(j);
            for (i, value) in series.values.iter().enumerate() {
                let Some(v) = value else { continue };
                let left = i as f64 + 0.1 + j as f64 * width;
                let mid = left + width / 2.0;
                chart
                    .draw_series(std::iter::once(Rectangle::new(
                        [(left, 0.0), (left + width * 0.92, v.median)],
                        c.mix(0.85).filled(),
                    )))
                    .map_err(&fail)?;
                if v.max > v.min {
                    chart
                        .draw_series(std::iter::once(PathElement::new(
                            vec![(mid, v.min), (mid, v.max)],
                            BLACK.stroke_width(2),
                        )))
                        .map_err(&fail)?;
                }
                let (x, y) = chart.backend_coord(&(mid, v.median.max(v.max)));
                plot_area
                    .draw(&Text::new(
                        value_format(&v.median),
                        (x, y - 3),
                        label_style.clone(),
                    ))
                    .map_err(&fail)?;
            }
        }
        // Category names under their groups (plotters' own x labels fall at round
        // numbers, not at the groups' centres).
        let name_style =
            TextStyle::from((FONT, 14).into_font()).pos(Pos::new(HPos::Center, VPos::Top));
        for (i, name) in spec.categories.iter().enumerate() {
            let (x, y) = chart.backend_coord(&(i as f64 + 0.5, 0.0));
            plot_area
                .draw(&Text::new(name.as_str(), (x, y + 8), name_style.clone()))
                .map_err(&fail)?;
        }
        let mut entries: Vec<(String, LegendMark)> = spec
            .series
            .iter()
            .enumerate()
            .map(|(j, s)| (s.label.clone(), LegendMark::Bar(colour(j))))
            .collect();
        entries.push(("min to max of the runs".into(), LegendMark::Line(BLACK)));
        draw_legend(&legend_area, &entries, spec.name)?;
        root.present().map_err(&fail)?;
    }
    Ok(svg)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Every `<text>` element's content, in document order.
    pub(crate) fn texts(svg: &str) -> Vec<String> {
        let doc = roxmltree::Document::parse(svg).unwrap_or_else(|e| panic!("not XML: {e}"));
        assert_eq!(doc.root_element().tag_name().name(), "svg");
        doc.descendants()
            .filter(|n| n.has_tag_name("text"))
            .filter_map(|n| n.text().map(|t| t.trim().to_string()))
            .collect()
    }

    #[test]
    fn a_line_twenty_times_above_the_median_is_named_off_scale_not_drawn() {
        let line = |label: &str, y: f64| Line {
            label: label.into(),
            points: vec![(1.0, y), (2.0, y)],
            bars: Vec::new(),
        };
        let chart = |y_scale| LineChart {
            name: "t.svg",
            title: "t".into(),
            x_desc: "x (KiB)",
            y_desc: "y (MB/s)",
            x_scale: XScale::Linear,
            y_scale,
            marker_every: 1,
            lines: vec![
                line("slow", 100.0),
                line("fast", 300.0),
                line("trivial", 1e7),
            ],
        };
        let spec = chart(YScale::FromZeroWithoutOutliers);
        assert_eq!(off_scale(&spec), [false, false, true]);
        let texts = texts(&line_chart(&spec).unwrap());
        assert!(
            texts.contains(&"trivial: off scale".to_string()),
            "{texts:?}"
        );
        assert!(!texts.iter().any(|t| t.starts_with("1000000")), "{texts:?}");
        assert_eq!(off_scale(&chart(YScale::FromZero)), [false; 3]);
    }

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(format_size(512.0), "512 B");
        assert_eq!(format_size(8192.0), "8 KiB");
        assert_eq!(format_size(1536.0), "1.5 KiB");
        assert_eq!(format_size(4.0 * 1024.0 * 1024.0), "4 MiB");
    }
}
