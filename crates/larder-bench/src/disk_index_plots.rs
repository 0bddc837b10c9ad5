//! The plots of `larder bench index`: the paper's Fig. 12 (seconds per component
//! against BFT), once with prelookup and once without, and on-disk lookup I/Os against
//! BFT, with eager (which has no BFT) drawn as a flat reference line. Drawn with
//! [`crate::plot`]'s line chart: title, axis labels with units, legend on the right.

use crate::disk_index::{DiskIndexReport, RunKind, RunResult, Seconds};
use crate::plot::{line_chart, Line, LineChart, PlotFile, Spread, XScale, YScale};
use crate::BenchError;

/// One component's seconds of a run.
type Component = fn(&Seconds) -> Spread;

const BFT_AXIS: &str = "buffer fingerprint threshold, BFT (fingerprints per batch)";

/// The lazy runs of `kind`, by BFT.
fn sweep(report: &DiskIndexReport, kind: RunKind) -> Vec<(f64, &RunResult)> {
    report
        .runs
        .iter()
        .filter(|r| r.kind == kind)
        .filter_map(|r| r.bft.map(|b| (b as f64, r)))
        .collect()
}

/// A line of one value of each run, with the runs' range as bars.
fn line(label: &str, runs: &[(f64, &RunResult)], value: &dyn Fn(&RunResult) -> Spread) -> Line {
    Line {
        label: label.to_string(),
        points: runs.iter().map(|&(x, r)| (x, value(r).median)).collect(),
        bars: runs
            .iter()
            .map(|&(x, r)| {
                let v = value(r);
                (x, v.min, v.max)
            })
            .collect(),
    }
}

/// Eager's `value` across the BFTs swept, as a flat line.
fn eager_line(label: &str, report: &DiskIndexReport, value: f64) -> Option<Line> {
    let low = *report.plan.bfts.iter().min()? as f64;
    let high = *report.plan.bfts.iter().max()? as f64;
    Some(Line {
        label: label.to_string(),
        points: vec![(low, value), (high, value)],
        bars: Vec::new(),
    })
}

/// Fig. 12 for one kind of lazy run.
fn components(
    report: &DiskIndexReport,
    kind: RunKind,
) -> Result<Option<(PlotFile, String)>, BenchError> {
    let runs = sweep(report, kind);
    if runs.is_empty() {
        return Ok(None);
    }
    let parts: [(&str, Component); 8] = [
        ("on-disk lookup", |s| s.disk_lookup),
        ("prefetch", |s| s.prefetch),
        ("prelookup", |s| s.prelookup),
        ("postlookup", |s| s.postlookup),
        ("flush (inserts)", |s| s.flush),
        ("Bloom filter", |s| s.bloom),
        ("other", |s| s.other),
        ("index total", |s| s.total),
    ];
    let mut lines: Vec<Line> = parts
        .iter()
        .filter(|(name, _)| kind != RunKind::LazyNoPrelookup || *name != "prelookup")
        .map(|&(name, part)| line(name, &runs, &|r| part(&r.seconds)))
        .collect();
    if let Some(e) = report.eager() {
        lines.extend(eager_line(
            "eager, index total",
            report,
            e.seconds.total.median,
        ));
    }
    let (file, what) = match kind {
        RunKind::LazyNoPrelookup => ("disk-index-fig12-no-prelookup.svg", "without prelookup"),
        _ => ("disk-index-fig12.svg", "with prelookup"),
    };
    let title = format!("Lazy lookup {what}: seconds per component vs BFT (Fig. 12)");
    let svg = line_chart(&LineChart {
        name: file,
        title: title.clone(),
        x_desc: BFT_AXIS,
        y_desc: "seconds in the index (median of the runs)",
        x_scale: XScale::Linear,
        y_scale: YScale::FromZero,
        marker_every: 1,
        lines,
    })?;
    Ok(Some((
        PlotFile {
            file: file.into(),
            title,
            caption: format!(
                "Time inside the disk index's calls for the whole stream, by component, lazy lookup {what}, against the buffer fingerprint threshold; bars span the runs. The budget is fixed, so a larger BFT leaves fewer, wider buffer buckets. Eager lookup has no BFT: its total is the flat line."
            ),
        },
        svg,
    )))
}

/// On-disk lookup I/Os against BFT, eager as the reference.
fn lookup_ios(report: &DiskIndexReport) -> Result<Option<(PlotFile, String)>, BenchError> {
    let mut lines = Vec::new();
    for kind in [RunKind::Lazy, RunKind::LazyNoPrelookup] {
        let runs = sweep(report, kind);
        if !runs.is_empty() {
            lines.push(line(kind.title(), &runs, &|r| {
                Spread::exact(r.counts.lookup_ios as f64)
            }));
        }
    }
    if lines.is_empty() {
        return Ok(None);
    }
    if let Some(e) = report.eager() {
        lines.extend(eager_line("eager", report, e.counts.lookup_ios as f64));
    }
    let file = "disk-index-lookup-ios.svg";
    let title = "On-disk lookup I/Os vs BFT, lazy and eager".to_string();
    let svg = line_chart(&LineChart {
        name: file,
        title: title.clone(),
        x_desc: BFT_AXIS,
        y_desc: "on-disk lookup I/Os (reads of bucket pages, log scale)",
        x_scale: XScale::Linear,
        y_scale: YScale::Log10,
        marker_every: 1,
        lines,
    })?;
    Ok(Some((
        PlotFile {
            file: file.into(),
            title,
            caption: "Reads of the on-disk hash table's bucket pages for the whole stream: one per fingerprint looked up for eager (the flat line, it has no BFT), one per batch of BFT fingerprints for lazy. Counts, the same in every run.".into(),
        },
        svg,
    )))
}

/// Every plot, as `(file, svg)`, in the order disk-index.md shows them; none without
/// lazy runs.
pub fn disk_index_plots(report: &DiskIndexReport) -> Result<Vec<(PlotFile, String)>, BenchError> {
    Ok([
        components(report, RunKind::Lazy)?,
        components(report, RunKind::LazyNoPrelookup)?,
        lookup_ios(report)?,
    ]
    .into_iter()
    .flatten()
    .collect())
}
