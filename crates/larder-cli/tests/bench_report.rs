//! `larder bench report` on a tiny input: it writes report.md with every section, and
//! every plot report.md shows exists and is an SVG with a title, axis labels and a
//! legend. Timings are not checked; exactness is (parallel chunking misses nothing).

mod support;

use std::fs;
use std::time::Duration;

use support::{larder_command, pseudo_random, run_command, Scratch};

/// The debug binary on a loaded machine: generous, the run itself takes seconds.
const TIMEOUT: Duration = Duration::from_secs(300);

#[path = "support/report.rs"]
mod report;

use report::{svg_texts, table_after};

#[test]
fn quick_report_on_a_tiny_input_has_every_section_and_readable_plots() {
    let scratch = Scratch::new();
    let input = scratch.dir("input");
    let release = pseudo_random(5, 400_000);
    let mut next = release.clone();
    next[100_000..100_010].fill(0);
    fs::write(input.join("r1.bin"), &release).unwrap();
    fs::write(input.join("r2.bin"), &next).unwrap();
    let out_dir = scratch.path().join("report");
    let mut cmd = larder_command(scratch.path());
    cmd.args(["--json", "bench", "report", "--quick", "--size", "1MiB"])
        .args(["--index-keys", "20000", "--runs", "1", "--out"])
        .arg(&out_dir)
        .arg(&input);
    let out = run_command(cmd, TIMEOUT);
    out.expect_ok();
    let v = out.json();
    let plots: Vec<&str> = v["plots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap())
        .collect();
    assert!(plots.len() >= 6, "{plots:?}");

    let report = fs::read_to_string(out_dir.join("report.md")).unwrap();
    for heading in [
        "## FastCDC on generated",
        "## FastCDC on ",
        "## P-Dedupe on generated",
        "(P-Dedupe Fig. 14)",
        "(P-Dedupe equations 3 to 6)",
        "(P-Dedupe Table 3)",
        "## Generator ground truth",
        "## Cuckoo",
        "## Lazy",
        "Machine:",
    ] {
        assert!(report.contains(heading), "report lacks {heading:?}");
    }
    assert!(
        report.contains(input.to_str().unwrap()),
        "the second dataset is not named"
    );

    // Every plot report.md shows exists, parses and is labelled.
    let shown: Vec<&str> = report
        .split("](")
        .skip(1)
        .map(|rest| &rest[..rest.find(')').unwrap()])
        .collect();
    assert_eq!(shown.len(), plots.len(), "report.md shows {shown:?}");
    for name in &shown {
        assert!(plots.contains(name), "{name} not in the JSON's plots");
        let svg = fs::read_to_string(out_dir.join(name)).unwrap();
        let texts = svg_texts(&svg, name);
        assert!(texts.iter().any(|t| t == "legend"), "{name}: no legend");
        assert!(
            texts.iter().any(|t| t.contains('(') && t.contains(')')),
            "{name}: no axis label with a unit in {texts:?}"
        );
    }

    // Exact parallel chunking: no cut point differs from sequential chunking, on both
    // datasets, at any segment size.
    let mut rows = 0;
    for (at, _) in report.match_indices("(P-Dedupe Table 3)") {
        for row in table_after(&report[at..], "(P-Dedupe Table 3)") {
            assert_eq!(row[1], "0", "exact parallel chunking differs: {row:?}");
            rows += 1;
        }
    }
    assert!(rows >= 8, "{rows} Table 3 rows");
    // The ground truth's table ends with the whole series.
    let truth = table_after(&report, "## Generator ground truth");
    assert_eq!(truth.len(), 6, "{truth:?}");
    assert_eq!(truth[5][0], "all");
}

#[test]
fn a_missing_path_is_an_error_that_names_it() {
    let scratch = Scratch::new();
    let missing = scratch.path().join("no-such-dir");
    let mut cmd = larder_command(scratch.path());
    cmd.args(["bench", "report", "--quick", "--size", "64KiB", "--out"])
        .arg(scratch.path().join("out"))
        .arg(&missing);
    let out = run_command(cmd, TIMEOUT);
    out.expect_code(1).expect_stderr(&["no-such-dir"]);
}
