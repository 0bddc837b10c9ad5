//! `larder bench index --quick`: every configuration runs (eager once, lazy with and
//! without prelookup at each BFT), each finds exactly the oracle's new chunks, the
//! tables name every run, and every plot disk-index.md shows exists and is an SVG
//! with a title, axis labels with units and a legend. Timings are not checked.

mod support;

use std::fs;
use std::time::Duration;

use support::{larder_command, run_command, Scratch};

/// The debug binary on a loaded machine: generous, the run itself takes seconds.
const TIMEOUT: Duration = Duration::from_secs(300);

#[path = "support/report.rs"]
mod report;

use report::{svg_texts, table_after};

/// The first cells of the rows of the Markdown table after `heading`.
fn first_cells(report: &str, heading: &str) -> Vec<String> {
    table_after(report, heading)
        .into_iter()
        .map(|row| row[0].clone())
        .collect()
}

#[test]
fn quick_run_has_every_configuration_exact_and_every_plot() {
    let scratch = Scratch::new();
    let out_dir = scratch.path().join("out");
    let work = scratch.dir("work");
    let mut cmd = larder_command(scratch.path());
    cmd.args(["--json", "bench", "index", "--quick", "--bft", "4,16,32,64"])
        .arg("--out")
        .arg(&out_dir)
        .arg("--dir")
        .arg(&work);
    let out = run_command(cmd, TIMEOUT);
    out.expect_ok();
    let v = out.json();
    let report = &v["report"];
    let distinct = report["distinct"].as_u64().unwrap();
    let chunks = report["chunks"].as_u64().unwrap();
    assert!(distinct > 20_000 && chunks > 5 * distinct / 2, "{report}");
    let runs = report["runs"].as_array().unwrap();
    let mut labels = Vec::new();
    for r in runs {
        // The oracle check passed: every run answered every chunk, and exactly the
        // distinct ones new.
        assert_eq!(r["new_chunks"].as_u64(), Some(distinct), "{r}");
        assert_eq!(r["counts"]["submitted"].as_u64(), Some(chunks), "{r}");
        let kind = r["kind"].as_str().unwrap();
        labels.push(match r["bft"].as_u64() {
            None => kind.to_string(),
            Some(b) => format!("{kind} {b}"),
        });
    }
    let expected: Vec<String> = ["eager".to_string()]
        .into_iter()
        .chain(
            ["lazy", "lazy-no-prelookup"]
                .iter()
                .flat_map(|k| [4, 16, 32, 64].iter().map(move |b| format!("{k} {b}"))),
        )
        .collect();
    assert_eq!(labels, expected);
    // The index is larger than the quick budget, as the experiment needs.
    let index_bytes = runs[0]["index_bytes"].as_u64().unwrap();
    assert!(index_bytes > 2 << 20, "{index_bytes}");
    // Scratch removed after.
    assert_eq!(fs::read_dir(&work).unwrap().count(), 0);

    let md = fs::read_to_string(out_dir.join("disk-index.md")).unwrap();
    assert!(md.contains("matched the HashSet oracle"), "{md}");
    let rows = first_cells(&md, "### Every run: I/Os and hit rates");
    assert_eq!(rows.len(), 9, "{rows:?}");
    assert_eq!(rows[0], "eager");
    assert!(rows.contains(&"lazy, BFT 32".to_string()), "{rows:?}");
    assert!(
        rows.contains(&"lazy, no prelookup, BFT 64".to_string()),
        "{rows:?}"
    );
    assert_eq!(
        first_cells(&md, "### Every run: seconds per component").len(),
        9
    );
    for heading in [
        "(the paper's Table VII)",
        "(the paper's Table V)",
        "(the paper's Table VI)",
        "Machine:",
    ] {
        assert!(md.contains(heading), "disk-index.md lacks {heading:?}");
    }

    let plots: Vec<&str> = v["plots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["file"].as_str().unwrap())
        .collect();
    assert_eq!(plots.len(), 3, "{plots:?}");
    for name in plots {
        assert!(
            md.contains(&format!("]({name})")),
            "disk-index.md does not show {name}"
        );
        let svg = fs::read_to_string(out_dir.join(name)).unwrap();
        let texts = svg_texts(&svg, name);
        assert!(texts.iter().any(|t| t == "legend"), "{name}: no legend");
        assert!(
            texts.iter().any(|t| t.starts_with("eager")),
            "{name}: no eager line"
        );
        assert!(
            texts.iter().any(|t| t.contains("BFT") && t.contains('(')),
            "{name}: no x axis label with a unit in {texts:?}"
        );
    }
}

#[test]
fn an_unknown_lookup_is_a_usage_error() {
    let scratch = Scratch::new();
    let mut cmd = larder_command(scratch.path());
    cmd.args(["bench", "index", "--quick", "--lookup", "lazy,greedy"]);
    let out = run_command(cmd, TIMEOUT);
    out.expect_code(2).expect_stderr(&["greedy"]);
}
