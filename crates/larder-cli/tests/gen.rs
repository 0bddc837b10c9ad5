//! `larder gen`: files per generation and client, the same bytes on stdout, the same
//! bytes for the same seed, statistics in text and JSON, existing files never
//! overwritten, settings the model cannot meet and terminals refused.

mod support;

use std::fs;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::Path;
use std::process::{Command, Stdio};

use support::{larder, larder_command, Scratch, LARDER};

/// Runs `larder gen ARGS` with stdout captured as bytes; stderr as text.
fn gen_stdout(args: &[&str]) -> (Vec<u8>, String) {
    let out = Command::new(LARDER)
        .arg("gen")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run larder gen");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "larder gen {args:?} failed:\n{stderr}"
    );
    (out.stdout, stderr)
}

#[test]
fn out_dir_holds_one_file_per_generation_and_client_equal_to_the_stream() {
    let scratch = Scratch::new();
    let dir = scratch.path().join("gens");
    let args = [
        "--seed",
        "3",
        "--size",
        "1MiB",
        "--generations",
        "3",
        "--clients",
        "2",
    ];
    let mut with_out = vec!["gen", "--json", "--out", dir.to_str().unwrap()];
    with_out.extend(args);
    let out = larder(scratch.path(), &with_out);
    out.expect_ok();
    let report = out.json();
    assert_eq!(report["bytes"], 6 << 20, "{out}");
    assert_eq!(report["per_client"].as_array().unwrap().len(), 6);
    let ratio = report["dedup_ratio"].as_f64().unwrap();
    let (bytes, new) = (
        report["bytes"].as_f64().unwrap(),
        report["new_bytes"].as_f64().unwrap(),
    );
    assert!((ratio - bytes / new).abs() < 1e-9 && ratio > 1.0);

    let mut concatenated = Vec::new();
    for g in 1..=3 {
        for c in 0..2 {
            let path = dir.join(format!("gen-{g:03}/client-{c:03}.bin"));
            let data = fs::read(&path).unwrap();
            assert_eq!(data.len(), 1 << 20, "{}", path.display());
            concatenated.extend(data);
        }
    }
    let (stream, stderr) = gen_stdout(&args);
    assert!(stderr.is_empty(), "{stderr}");
    assert!(stream == concatenated, "stdout differs from the files");
    let (again, _) = gen_stdout(&args);
    assert!(again == stream, "same seed, different bytes");
    let mut other = args.to_vec();
    other[1] = "4";
    assert!(
        gen_stdout(&other).0 != stream,
        "another seed gave the same bytes"
    );
}

#[test]
fn stats_go_to_stderr_when_streaming() {
    let (stream, stderr) = gen_stdout(&["--size", "2MiB", "--generations", "2", "--stats"]);
    assert_eq!(stream.len(), 4 << 20);
    for needle in ["truth", "dedup ratio", "runs (KiB)", "transitions", "edits"] {
        assert!(
            stderr.contains(needle),
            "stderr lacks {needle:?}:\n{stderr}"
        );
    }
    let (_, json) = gen_stdout(&["--size", "1MiB", "--json", "--pure"]);
    let v: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
    assert_eq!(v["mode"], "pure");
    assert_eq!(v["bytes"], 1 << 20);
}

#[test]
fn existing_files_are_never_overwritten() {
    let scratch = Scratch::new();
    let dir = scratch.path().join("gens");
    let args = ["gen", "--size", "64KiB", "--out", dir.to_str().unwrap()];
    larder(scratch.path(), args).expect_ok();
    let file = dir.join("gen-001/client-000.bin");
    fs::write(&file, b"keep me").unwrap();
    larder(scratch.path(), args)
        .expect_code(1)
        .expect_stderr(&["client-000.bin", "never overwritten"]);
    assert_eq!(fs::read(&file).unwrap(), b"keep me");
}

#[test]
fn settings_the_model_cannot_meet_are_usage_errors() {
    let scratch = Scratch::new();
    let dir = scratch.path().join("never");
    let out_dir = dir.to_str().unwrap();
    for (bad, why) in [
        (&["--dedup-ratio", "1.01"][..], "dedup ratio"),
        (&["--u-median", "400KiB"][..], "median < mean"),
        (&["--r-max", "100KiB"][..], "mean < max"),
        (&["--p-br-u", "1.5"][..], "between 0 and 1"),
        (&["--pool", "5000"][..], "multiple of 4096"),
        (&["--generations", "0"][..], "generations"),
    ] {
        let mut args = vec!["gen", "--size", "64KiB", "--out", out_dir];
        args.extend(bad);
        larder(scratch.path(), &args)
            .expect_code(2)
            .expect_stderr(&[why]);
    }
    assert!(
        !Path::new(out_dir).exists(),
        "nothing is written on a usage error"
    );
}

#[test]
fn a_terminal_on_stdout_is_refused() {
    let (mut master, mut slave) = (0, 0);
    // SAFETY: openpty writes two descriptors into the given integers; the name,
    // termios and window size pointers may be null.
    let rc = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: both descriptors were just opened by openpty and are owned here alone.
    let (_master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    let scratch = Scratch::new();
    let mut cmd = larder_command(scratch.path());
    cmd.args(["gen", "--size", "64KiB"])
        .stdout(Stdio::from(slave));
    let out = support::run_command(cmd, support::RUN_TIMEOUT);
    out.expect_code(2).expect_stderr(&["terminal", "--out DIR"]);
}
