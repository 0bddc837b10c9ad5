//! `--device auto|cpu|gpu` on `larder chunk` and `larder backup`: cpu and auto chunk
//! exactly as before (auto falls back to the CPU without a GPU or without the `gpu`
//! feature), and gpu either runs on a GPU or fails with the reason, before any work.

mod support;

use std::fs;

use support::{larder, pseudo_random, Repo, Scratch};

/// The cut list of `larder chunk --cuts`, without the summary (it holds timings).
fn cuts(stdout: &str) -> Vec<&str> {
    let cuts: Vec<&str> = stdout
        .lines()
        .take_while(|l| !l.starts_with("chunker"))
        .collect();
    assert!(cuts.len() > 10, "too few cuts to compare:\n{stdout}");
    cuts
}

#[test]
fn chunk_on_cpu_and_auto_prints_what_the_default_prints() {
    let scratch = Scratch::new();
    let file = scratch.path().join("data.bin");
    fs::write(&file, pseudo_random(7, 500_000)).unwrap();
    let file = file.to_str().unwrap();
    let default = larder(scratch.path(), ["chunk", "--cuts", file]);
    default.expect_ok();
    for device in ["cpu", "auto"] {
        let out = larder(
            scratch.path(),
            ["chunk", "--cuts", "--device", device, file],
        );
        out.expect_ok();
        // auto on a GPU that calibrates faster prints the GPU's own format.
        if !out.stderr.contains("using the GPU") {
            assert_eq!(
                cuts(&out.stdout),
                cuts(&default.stdout),
                "--device {device}\n{out}"
            );
        }
    }
}

#[test]
fn device_gpu_says_why_it_cannot_run() {
    let scratch = Scratch::new();
    let file = scratch.path().join("data.bin");
    fs::write(&file, pseudo_random(8, 100_000)).unwrap();
    let file = file.to_str().unwrap();
    let out = larder(scratch.path(), ["chunk", "--device", "gpu", file]);
    if cfg!(feature = "gpu") {
        if out.code != Some(0) {
            out.expect_code(1).expect_stderr(&["CUDA"]);
        }
    } else {
        out.expect_code(1)
            .expect_stderr(&["built without GPU support", "--features gpu"]);
    }
    // Other chunkers have no device scan.
    let out = larder(
        scratch.path(),
        ["chunk", "--device", "gpu", "--algo", "rabin", file],
    );
    out.expect_code(1);
    assert!(
        out.stderr.contains("fastcdc2020 only") || out.stderr.contains("built without GPU support"),
        "{out}"
    );
}

#[test]
fn backup_device_gpu_fails_before_writing_a_snapshot() {
    let repo = Repo::init(&[]);
    let src = repo.dir("src");
    fs::write(src.join("f"), pseudo_random(9, 50_000)).unwrap();
    let out = repo.run([
        std::ffi::OsStr::new("backup"),
        "--device".as_ref(),
        "gpu".as_ref(),
        src.as_os_str(),
    ]);
    // Built with the GPU backend, the default repository (encrypted, keyed chunker) is
    // what the GPU cannot serve; built without it, the build is.
    let why = if cfg!(feature = "gpu") {
        "the GPU cannot back up into this repository"
    } else {
        "built without GPU support"
    };
    out.expect_code(1).expect_stderr(&[why]);
    assert!(repo.snapshots().is_empty(), "a snapshot was written\n{out}");
    let out = repo.run([
        std::ffi::OsStr::new("backup"),
        "--device".as_ref(),
        "cpu".as_ref(),
        src.as_os_str(),
    ]);
    out.expect_ok();
    assert_eq!(repo.snapshots().len(), 1);
}
