//! `larder chunk` and `larder bench chunk`: their output in text and JSON, the cuts
//! tiling each file, exit codes for bad input, and the files the bench writes.

mod support;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use larder_chunk::{ChunkerConfig, ChunkerKind};
use serde_json::Value;
use support::{larder, pseudo_random, Scratch};

/// Asserts that `(offset, length)` pairs, in order, cover `0..size` with no gap or overlap.
#[track_caller]
fn assert_tiles(cuts: &[(u64, u64)], size: u64, what: &str) {
    let mut next = 0;
    for &(offset, len) in cuts {
        assert_eq!(offset, next, "{what}: gap or overlap at {offset}");
        assert!(len > 0, "{what}: empty chunk at {offset}");
        next = offset + len;
    }
    assert_eq!(next, size, "{what}: cuts end at {next}, the file at {size}");
}

fn two_files(scratch: &Scratch) -> Vec<(PathBuf, u64)> {
    let a = scratch.path().join("a.bin");
    let b = scratch.path().join("b with space.bin");
    fs::write(&a, pseudo_random(1, 300_000)).unwrap();
    fs::write(&b, pseudo_random(2, 70_001)).unwrap();
    vec![(a, 300_000), (b, 70_001)]
}

#[test]
fn chunk_cuts_tile_each_file_exactly_in_text_and_json() {
    let scratch = Scratch::new();
    let files = two_files(&scratch);
    let paths: Vec<&Path> = files.iter().map(|(p, _)| p.as_path()).collect();

    let mut args = vec![Path::new("chunk"), Path::new("--cuts")];
    args.extend(&paths);
    let out = larder(scratch.path(), &args);
    out.expect_ok();
    let mut text_cuts: BTreeMap<String, Vec<(u64, u64)>> = BTreeMap::new();
    let mut lines = out.stdout.lines();
    assert_eq!(
        lines.next(),
        Some("cuts (offset, length, gear fingerprint, file):"),
        "{out}"
    );
    for line in lines.by_ref().take_while(|l| !l.starts_with("chunker")) {
        // "OFFSET LENGTH FINGERPRINT  PATH", the numbers right-aligned; the path may
        // hold spaces.
        let (offset, rest) = line.trim_start().split_once(' ').unwrap();
        let (len, rest) = rest.trim_start().split_once(' ').unwrap();
        let (fingerprint, path) = rest
            .trim_start()
            .split_once("  ")
            .unwrap_or_else(|| panic!("bad cut line {line:?}"));
        fingerprint.parse::<u64>().unwrap();
        text_cuts
            .entry(path.to_string())
            .or_default()
            .push((offset.parse().unwrap(), len.parse().unwrap()));
    }
    for (path, size) in &files {
        let cuts = &text_cuts[&path.display().to_string()];
        assert_tiles(cuts, *size, &format!("text cuts of {}", path.display()));
    }
    for needle in ["chunks ", "dedup ", "MB/s in the chunker alone", "to "] {
        assert!(
            out.stdout.contains(needle),
            "stdout lacks {needle:?}\n{out}"
        );
    }

    let mut args = vec![
        Path::new("--json"),
        Path::new("chunk"),
        Path::new("--cuts"),
        Path::new("--algo"),
        Path::new("fixed"),
        Path::new("--avg"),
        Path::new("4KiB"),
    ];
    args.extend(&paths);
    let out = larder(scratch.path(), &args);
    out.expect_ok();
    assert_eq!(out.stdout.lines().count(), 1, "one JSON object\n{out}");
    let v = out.json();
    assert_eq!(v["algo"], "fixed");
    let mut chunks = 0;
    for ((path, size), file) in files.iter().zip(v["files"].as_array().unwrap()) {
        assert_eq!(file["path"], path.display().to_string());
        let offsets = file["cuts"]["offsets"].as_array().unwrap();
        let lengths = file["cuts"]["lengths"].as_array().unwrap();
        let cuts: Vec<(u64, u64)> = offsets
            .iter()
            .zip(lengths)
            .map(|(o, l)| (o.as_u64().unwrap(), l.as_u64().unwrap()))
            .collect();
        assert_tiles(&cuts, *size, "JSON cuts");
        assert!(lengths[..lengths.len() - 1].iter().all(|l| l == 4096));
        chunks += cuts.len() as u64;
    }
    assert_eq!(v["sizes"]["chunks"], chunks);
    let in_buckets: u64 = v["sizes"]["histogram"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["chunks"].as_u64().unwrap())
        .sum();
    assert_eq!(in_buckets, chunks);
    assert!(v["chunk_mb_per_sec"].as_f64().unwrap() > 0.0);
    assert!(v["timed"].as_str().unwrap().contains("chunker alone"));
}

#[test]
fn chunk_accepts_every_algorithm_name_and_counts_a_repeat_as_duplicate() {
    let scratch = Scratch::new();
    let file = scratch.path().join("f");
    fs::write(&file, pseudo_random(3, 200_000)).unwrap();
    for kind in ChunkerKind::ALL {
        let valid = ChunkerConfig {
            kind,
            ..ChunkerConfig::default()
        }
        .validate()
        .is_ok();
        let f = file.as_os_str();
        let out = larder(
            scratch.path(),
            [
                "--json".as_ref(),
                "chunk".as_ref(),
                "--algo".as_ref(),
                kind.name().as_ref(),
                f,
                f,
            ],
        );
        if !valid {
            out.expect_code(2);
            continue;
        }
        out.expect_ok();
        let v = out.json();
        assert_eq!(v["algo"], kind.name());
        assert_eq!(v["dedup"]["ratio"], 2.0, "{}", kind.name());
    }
}

#[test]
fn chunk_bad_parameters_exit_2_with_the_validation_message() {
    let scratch = Scratch::new();
    let file = scratch.path().join("f");
    fs::write(&file, b"data").unwrap();
    let f = file.to_str().unwrap();
    let cases: [(&[&str], &str); 4] = [
        (&["--min", "16KiB", "--avg", "4KiB"], "min <= avg <= max"),
        (&["--level", "9"], "normalization level 9"),
        (&["--algo", "nope"], "unknown algorithm \"nope\""),
        (&["--avg", "8XB"], "unknown size suffix"),
    ];
    for (extra, message) in cases {
        let mut args = vec!["chunk"];
        args.extend_from_slice(extra);
        args.push(f);
        larder(scratch.path(), &args)
            .expect_code(2)
            .expect_stderr(&[message]);
    }
    let out = larder(scratch.path(), ["--json", "chunk", "--level", "9", f]);
    out.expect_code(2);
    assert!(out.json()["error"]
        .as_str()
        .unwrap()
        .contains("normalization level"));
}

/// The keyed chunker draws a key each run unless `--secret` gives one: with the same
/// secret the cuts repeat, and the output says where the key came from. `--secret`
/// is refused for a chunker without a key, and a secret must be 64 hex digits.
#[test]
fn chunk_keyed_takes_a_random_key_or_the_given_secret() {
    let scratch = Scratch::new();
    let file = scratch.path().join("f");
    fs::write(&file, pseudo_random(4, 400_000)).unwrap();
    let f = file.to_str().unwrap();
    let secret = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
    let cuts = |extra: &[&str]| {
        let mut args = vec!["--json", "chunk", "--chunker", "keyed", "--cuts"];
        args.extend_from_slice(extra);
        args.push(f);
        let out = larder(scratch.path(), &args);
        out.expect_ok();
        let v = out.json();
        (v["key"].clone(), v["files"][0]["cuts"]["lengths"].clone())
    };
    let (key, given) = cuts(&["--secret", secret]);
    assert_eq!(key, "given");
    assert_eq!(cuts(&["--secret", secret]).1, given);
    let (key, random) = cuts(&[]);
    assert_eq!(key, "random");
    assert!(random.as_array().is_some_and(|l| !l.is_empty()));
    larder(
        scratch.path(),
        ["chunk", "--chunker", "keyed", "--secret", "abc", f],
    )
    .expect_code(2)
    .expect_stderr(&["64 hex digits"]);
    larder(scratch.path(), ["chunk", "--secret", secret, f])
        .expect_code(2)
        .expect_stderr(&["--secret is for the keyed chunker"]);
    let out = larder(scratch.path(), ["chunk", "--chunker", "keyed", f]);
    out.expect_ok();
    assert!(out.stdout.contains("key         random"), "{out}");
}

#[test]
fn chunk_names_a_missing_file_exit_1_alone_and_3_beside_a_readable_one() {
    let scratch = Scratch::new();
    let good = scratch.path().join("good");
    fs::write(&good, pseudo_random(4, 50_000)).unwrap();
    let missing = scratch.path().join("no-such-file");
    let (g, m) = (good.to_str().unwrap(), missing.to_str().unwrap());

    let out = larder(scratch.path(), ["chunk", m]);
    out.expect_code(1).expect_stderr(&[m, "No such file"]);
    let out = larder(scratch.path(), ["--json", "chunk", m]);
    out.expect_code(1);
    assert!(out.json()["error"].as_str().unwrap().contains(m));

    let out = larder(scratch.path(), ["--json", "chunk", g, m]);
    out.expect_code(3).expect_stderr(&[m]);
    let v = out.json();
    assert_eq!(v["files"].as_array().unwrap().len(), 1);
    assert_eq!(v["failed"][0]["path"], m);
    assert_eq!(v["sizes"]["bytes"], 50_000);
}

/// Two "releases": the second is the first with 10 KB inserted in the middle.
fn releases(scratch: &Scratch) -> PathBuf {
    let dir = scratch.dir("releases");
    let v1 = pseudo_random(5, 300_000);
    let mut v2 = v1[..150_000].to_vec();
    v2.extend_from_slice(&pseudo_random(6, 10_000));
    v2.extend_from_slice(&v1[150_000..]);
    fs::write(dir.join("1.tar"), &v1).unwrap();
    fs::write(dir.join("2.tar"), &v2).unwrap();
    dir
}

#[test]
fn bench_chunk_quick_writes_report_md_and_every_plot() {
    let scratch = Scratch::new();
    let input = releases(&scratch);
    let out_dir = scratch.path().join("out");
    let (i, o) = (input.to_str().unwrap(), out_dir.to_str().unwrap());

    let out = larder(scratch.path(), ["bench", "chunk", "--quick", "--out", o, i]);
    out.expect_ok();
    for needle in [
        "Chunking speed",
        "Dedup ratio",
        "Minimum chunk size",
        "Chunk sizes at",
    ] {
        assert!(
            out.stdout.contains(needle),
            "stdout lacks {needle:?}\n{out}"
        );
    }
    for kind in ChunkerKind::ALL {
        assert!(
            out.stdout.contains(&format!("| {} |", kind.name())),
            "no row for {}\n{out}",
            kind.name()
        );
    }
    let report = fs::read_to_string(out_dir.join("report.md")).unwrap();
    let svgs: Vec<String> = fs::read_dir(&out_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".svg"))
        .collect();
    assert!(svgs.len() >= 7 + ChunkerKind::ALL.len(), "{svgs:?}");
    for svg in &svgs {
        assert!(
            report.contains(&format!("]({svg})")),
            "report.md does not show {svg}"
        );
        let text = fs::read_to_string(out_dir.join(svg)).unwrap();
        assert!(
            text.starts_with("<svg") && text.trim_end().ends_with("</svg>"),
            "{svg}"
        );
        assert!(text.contains("legend"), "{svg} has no legend");
    }
    assert!(svgs.contains(&"speed-vs-expected-size.svg".to_string()));

    let out = larder(
        scratch.path(),
        [
            "--json", "bench", "chunk", "--quick", "--runs", "2", "--out", o, i,
        ],
    );
    out.expect_ok();
    let v: Value = out.json();
    let sweep = v["report"]["size_sweep"].as_array().unwrap();
    assert_eq!(sweep.len(), ChunkerKind::ALL.len());
    assert_eq!(v["report"]["plan"]["runs"], 2);
    let ratios = |kind: ChunkerKind| -> Vec<f64> {
        let series = sweep.iter().find(|s| s["algo"] == kind.name()).unwrap();
        series["points"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                assert_eq!(p["speed"]["run_seconds"].as_array().unwrap().len(), 2);
                p["dedup"]["ratio"].as_f64().unwrap()
            })
            .collect()
    };
    // The second release shifts the first's second half by 10 KB: content-defined
    // chunking finds it again (about 610 / 335 KB), fixed-size chunking does not.
    for (cdc, fixed) in ratios(ChunkerKind::Fastcdc2020)
        .into_iter()
        .zip(ratios(ChunkerKind::Fixed))
    {
        assert!(cdc > 1.6 && fixed < 1.4, "fastcdc {cdc}, fixed {fixed}");
    }
    assert_eq!(
        v["plots"].as_array().unwrap().len(),
        svgs.len(),
        "the JSON lists every plot"
    );
}

#[test]
fn bench_chunk_refuses_too_much_input_and_names_a_missing_path() {
    let scratch = Scratch::new();
    let input = releases(&scratch);
    let i = input.to_str().unwrap();
    let out_dir = scratch.path().join("out");
    let o = out_dir.to_str().unwrap();
    larder(
        scratch.path(),
        [
            "bench",
            "chunk",
            "--quick",
            "--max-input",
            "100KiB",
            "--out",
            o,
            i,
        ],
    )
    .expect_code(1)
    .expect_stderr(&["--max-input", "610000 bytes"]);
    let missing = scratch.path().join("nothing-here");
    let m = missing.to_str().unwrap();
    larder(scratch.path(), ["bench", "chunk", "--quick", "--out", o, m])
        .expect_code(1)
        .expect_stderr(&[m]);
    assert!(!out_dir.exists(), "nothing is written when the input fails");
}

/// The Remote Execution API's FastCDC 2020 vectors for seed 666 (4096/16384/65535,
/// level 2): offset, length and the Gear fingerprint at each cut, as `larder chunk
/// --cuts --json` reports them on one thread and on two (larder-chunk's
/// `tests/reapi.rs` checks the seed 0 vectors and the chunks' SHA-256 too).
#[test]
fn chunk_reproduces_the_remote_execution_api_vectors_with_a_seed() {
    const SEED_666: [(u64, u64, u64); 6] = [
        (0, 17635, 17021115692437263050),
        (17635, 17334, 8231525949846907466),
        (34969, 19136, 10944310959829698982),
        (54105, 17467, 13602876513398592944),
        (71572, 23593, 2945079350535657389),
        (95165, 14301, 8981594897574481255),
    ];
    let image =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/chunk/reapi/SekienAkashita.jpg");
    let scratch = Scratch::new();
    for threads in ["1", "2"] {
        let args = [
            "--json",
            "chunk",
            "--cuts",
            "--min",
            "4096",
            "--avg",
            "16384",
            "--max",
            "65535",
            "--seed",
            "666",
            "--threads",
            threads,
        ];
        let mut args: Vec<&Path> = args.iter().map(Path::new).collect();
        args.push(&image);
        let out = larder(scratch.path(), &args);
        out.expect_ok();
        let v = out.json();
        assert_eq!(v["config"]["seed"], 666, "{out}");
        let cuts = &v["files"][0]["cuts"];
        let field = |name: &str| -> Vec<u64> {
            cuts[name]
                .as_array()
                .unwrap_or_else(|| panic!("no {name} in {out}"))
                .iter()
                .map(|n| n.as_u64().unwrap())
                .collect()
        };
        let got: Vec<(u64, u64, u64)> = field("offsets")
            .into_iter()
            .zip(field("lengths"))
            .zip(field("gear_fingerprints"))
            .map(|((o, l), f)| (o, l, f))
            .collect();
        assert_eq!(got, SEED_666, "{threads} thread(s)");
    }
    // A seed is FastCDC's only: the fixed chunker refuses it as a usage error.
    let args = ["chunk", "--algo", "fixed", "--seed", "1"];
    let mut args: Vec<&Path> = args.iter().map(Path::new).collect();
    args.push(&image);
    let out = larder(scratch.path(), &args);
    assert_eq!(out.code, Some(2), "{out}");
    assert!(out.stderr.contains("seed"), "{out}");
}
