//! Compression end to end: round trips with compression on and off, at several levels,
//! in units and chunk by chunk, and with every chunker; what is stored compressed and
//! what raw;
//! container fill by stored bytes; repositories without compression (format
//! version 1, including one written by larder before compression existed, in
//! testdata/repo-v1) still read and stay version 1; config validation; the reported
//! ratios; unknown chunk encodings refused by name.
//!
//! Containers are read with the test's own decoder of docs/design/format.md.

mod support;

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value;
use support::{assert_same_tree, pseudo_random, pseudo_text, restored, Repo, TreeBuilder};

const HEADER_LEN: usize = 32;
const ENTRY_LEN: usize = 48;
/// Footer (16) + checksum (32) + end magic (8).
const TRAILER_LEN: usize = 56;

/// One table entry: (offset, stored length, raw length, flags).
type Entry = (usize, usize, usize, u8);

fn le_u32(b: &[u8]) -> u32 {
    u32::from_le_bytes(b[..4].try_into().unwrap())
}

/// The table of the container file at `path`.
fn table(path: &Path) -> Vec<Entry> {
    let bytes = fs::read(path).unwrap();
    let footer = bytes.len() - TRAILER_LEN;
    let table_offset = u64::from_le_bytes(bytes[footer..footer + 8].try_into().unwrap()) as usize;
    bytes[table_offset..footer]
        .chunks_exact(ENTRY_LEN)
        .map(|e| {
            (
                le_u32(&e[32..]) as usize,
                le_u32(&e[36..]) as usize,
                le_u32(&e[40..]) as usize,
                e[44],
            )
        })
        .collect()
}

fn container_files(repo: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(repo.join("containers"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
}

/// Every table entry of every container of the repository.
fn all_entries(repo: &Path) -> Vec<Entry> {
    container_files(repo)
        .iter()
        .flat_map(|p| table(p))
        .collect()
}

fn config(repo: &Repo) -> Value {
    serde_json::from_slice(&fs::read(repo.path.join("config")).unwrap()).unwrap()
}

/// Text, noise, a duplicated text file and a file larger than the 1 MiB small-file
/// limit (read in blocks), about 3 MB.
fn mixed_tree(root: &Path) -> PathBuf {
    let dup = pseudo_text(1, 70_000);
    TreeBuilder::new(root)
        .file("text.txt", pseudo_text(2, 300_000))
        .file("noise.bin", pseudo_random(3, 200_000))
        .file("dup/a.txt", &dup)
        .file("dup/b.txt", &dup)
        .file("large.txt", pseudo_text(4, 2_500_000))
        .file("tiny", b"x")
        .file("empty", b"")
        .symlink("link", "text.txt")
        .finish()
}

/// init with `args`, back up a mixed tree, restore it, compare, check every chunk.
/// Returns the repository and the backup's JSON summary.
fn round_trip(args: &[&str]) -> (Repo, Value) {
    let repo = Repo::init_plain(args);
    let src = mixed_tree(&repo.dir("src"));
    let summary = repo.backup(&[&src]);
    let target = repo.dir("target");
    repo.restore("latest", &target, &[]).expect_ok();
    assert_same_tree(&src, &restored(&target, &src));
    let check = repo.check(true);
    check.expect_ok();
    assert_eq!(check.json()["ok"], true, "{check}");
    (repo, summary)
}

fn u(v: &Value, field: &str) -> u64 {
    v[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field} missing in {v}"))
}

fn f(v: &Value, field: &str) -> f64 {
    v[field]
        .as_f64()
        .unwrap_or_else(|| panic!("{field} missing in {v}"))
}

#[test]
fn every_chunker_round_trips_with_compression_on_and_off() {
    for chunker in [
        "fastcdc",
        "fastcdc2016",
        "fixed",
        "rabin",
        "adler",
        "gear",
        "ae",
    ] {
        let (repo, summary) = round_trip(&["--chunker", chunker, "--compression", "none"]);
        assert_eq!(config(&repo)["version"], 1, "{chunker}");
        assert!(
            all_entries(&repo.path)
                .iter()
                .all(|&(_, stored, raw, flags)| flags == 0 && stored == raw),
            "{chunker}: compression none stored a compressed chunk"
        );
        assert_eq!(u(&summary, "bytes_new_stored"), u(&summary, "bytes_new"));
        assert_eq!(f(&summary, "compression_ratio"), 1.0);

        let (repo, summary) = round_trip(&["--chunker", chunker]);
        assert_eq!(config(&repo)["version"], 4, "{chunker}");
        assert_eq!(
            config(&repo)["compression"],
            serde_json::json!({ "kind": "zstd", "level": 3, "unit_chunks": 16 })
        );
        assert!(
            all_entries(&repo.path).iter().any(|e| e.3 == 2),
            "{chunker}: nothing was compressed in units"
        );
        assert!(
            f(&summary, "compression_ratio") > 1.5,
            "{chunker}: {summary}"
        );

        let (repo, summary) = round_trip(&["--chunker", chunker, "--compression", "zstd:3:1"]);
        assert_eq!(config(&repo)["version"], 2, "{chunker}");
        assert_eq!(
            config(&repo)["compression"],
            serde_json::json!({ "kind": "zstd", "level": 3 })
        );
        let entries = all_entries(&repo.path);
        assert!(
            entries.iter().any(|e| e.3 == 1),
            "{chunker}: nothing was compressed"
        );
        assert!(
            entries.iter().all(|e| e.3 < 2),
            "{chunker}: a unit without units"
        );
        assert!(
            f(&summary, "compression_ratio") > 1.5,
            "{chunker}: {summary}"
        );
    }
}

#[test]
fn levels_round_trip_and_higher_levels_store_no_more() {
    let mut stored = Vec::new();
    for level in ["zstd:1", "zstd:3", "zstd:9", "zstd:19"] {
        let (repo, summary) = round_trip(&["--compression", level]);
        let n: u32 = level[5..].parse().unwrap();
        assert_eq!(config(&repo)["compression"]["level"], n);
        stored.push((level, u(&summary, "bytes_new_stored")));
    }
    assert!(
        stored[3].1 <= stored[0].1,
        "level 19 stored more than level 1: {stored:?}"
    );
}

#[test]
fn incompressible_chunks_are_stored_raw_and_compressible_ones_as_frames() {
    let repo = Repo::init_plain(&[]);
    let src = repo.dir("src");
    TreeBuilder::new(&src)
        .file("noise.bin", pseudo_random(7, 600_000))
        .finish();
    let summary = repo.backup(&[&src]);
    let entries = all_entries(&repo.path);
    let raw: Vec<_> = entries.iter().filter(|e| e.3 == 0).collect();
    assert!(raw
        .iter()
        .all(|&&(_, stored, raw_len, _)| stored == raw_len));
    let raw_bytes: usize = raw.iter().map(|e| e.2).sum();
    assert!(
        raw_bytes >= 600_000,
        "noise was stored compressed: {entries:?}"
    );
    // Only the tree stream (text) shrinks.
    assert!(u(&summary, "bytes_new") - u(&summary, "bytes_new_stored") < 2_000);

    fs::write(src.join("text.txt"), pseudo_text(8, 600_000)).unwrap();
    let summary = repo.backup(&[&src]);
    let entries = all_entries(&repo.path);
    let frames: Vec<_> = entries.iter().filter(|e| e.3 == 1).collect();
    assert!(frames.iter().all(|&&(_, stored, raw, _)| stored < raw));
    // A unit's members share its offset and stored length, and follow each other.
    let mut units: Vec<(usize, usize, usize)> = Vec::new();
    for &(offset, stored, raw, _) in entries.iter().filter(|e| e.3 == 2) {
        match units.last_mut() {
            Some(u) if u.0 == offset && u.1 == stored => u.2 += raw,
            _ => units.push((offset, stored, raw)),
        }
    }
    assert!(
        units.iter().all(|&(_, stored, raw)| stored < raw),
        "{units:?}"
    );
    let frame_raw: usize =
        frames.iter().map(|e| e.2).sum::<usize>() + units.iter().map(|u| u.2).sum::<usize>();
    assert!(frame_raw >= 600_000, "text was stored raw");
    assert!(f(&summary, "compression_ratio") > 2.0, "{summary}");
}

/// Containers are filled by stored bytes: with text that compresses about fourfold,
/// each full container holds about 4 MiB of frames and far more raw data.
#[test]
fn containers_hold_about_4_mib_of_stored_bytes() {
    let repo = Repo::init_plain(&[]);
    let src = repo.dir("src");
    TreeBuilder::new(&src)
        .file("big.txt", pseudo_text(9, 40_000_000))
        .finish();
    repo.backup(&[&src]);
    let files = container_files(&repo.path);
    assert!(files.len() >= 2, "{files:?}");
    const TARGET: usize = 4 << 20;
    const MAX_CHUNK: usize = 64 << 10;
    for p in &files[..files.len() - 1] {
        let t = table(p);
        let end = t.last().map_or(HEADER_LEN, |e| e.0 + e.1);
        assert!(
            end > TARGET - MAX_CHUNK && end <= TARGET + MAX_CHUNK,
            "{}: data ends at {end}",
            p.display()
        );
        let raw: usize = t.iter().map(|e| e.2).sum();
        assert!(raw > 2 * TARGET, "{}: only {raw} raw bytes", p.display());
    }
}

/// A repository made before compression existed: what `--compression none` writes,
/// minus the config's `compression` field. Its containers, segments and snapshots are
/// byte for byte what format version 1 wrote (the layouts did not change).
#[test]
fn old_uncompressed_repositories_still_read_and_stay_version_1() {
    let repo = Repo::init_plain(&["--compression", "none"]);
    let mut cfg = config(&repo);
    cfg.as_object_mut().unwrap().remove("compression");
    assert_eq!(cfg["version"], 1);
    let old_config = serde_json::to_vec_pretty(&cfg).unwrap();
    fs::write(repo.path.join("config"), &old_config).unwrap();

    let src = mixed_tree(&repo.dir("src"));
    repo.backup(&[&src]);
    fs::write(src.join("more.txt"), pseudo_text(11, 100_000)).unwrap();
    repo.backup(&[&src]);
    let target = repo.dir("target");
    repo.restore("latest", &target, &[]).expect_ok();
    assert_same_tree(&src, &restored(&target, &src));
    repo.check(true).expect_ok();
    let stats = repo.run(["--json", "stats"]);
    stats.expect_ok();
    assert_eq!(stats.json()["config"]["compression"]["kind"], "none");
    assert_eq!(f(&stats.json(), "compression_ratio"), 1.0);
    assert!(all_entries(&repo.path).iter().all(|e| e.3 == 0));
    assert_eq!(fs::read(repo.path.join("config")).unwrap(), old_config);
}

/// Copies `src` to `dst` (directories, files and symlinks).
fn copy_tree(src: &Path, dst: &Path) {
    fs::create_dir_all(dst).unwrap();
    for e in fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        let (from, to) = (e.path(), dst.join(e.file_name()));
        let kind = e.file_type().unwrap();
        if kind.is_dir() {
            copy_tree(&from, &to);
        } else if kind.is_symlink() {
            std::os::unix::fs::symlink(fs::read_link(&from).unwrap(), &to).unwrap();
        } else {
            fs::copy(&from, &to).unwrap();
        }
    }
}

/// Regression guard for the format change: a repository written by larder before
/// compression existed (testdata/repo-v1) is read, checked and restored, and a backup
/// into it leaves it version 1 with raw chunks only.
#[test]
fn a_repository_written_before_compression_reads_and_stays_version_1() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/repo-v1");
    let repo = Repo::uninit();
    copy_tree(&fixture.join("repo"), &repo.path);
    let old_config = fs::read(repo.path.join("config")).unwrap();
    assert!(!String::from_utf8_lossy(&old_config).contains("compression"));

    let check = repo.check(true);
    check.expect_ok();
    assert_eq!(check.json()["report"]["snapshots"], 1, "{check}");
    let snapshots = repo.snapshots();
    let source = PathBuf::from(snapshots[0]["snapshot"]["paths"][0].as_str().unwrap());
    let target = repo.dir("target");
    repo.restore("latest", &target, &[]).expect_ok();
    let restored_root = restored(&target, &source);
    for file in ["hello.txt", "random.bin", "sub/words.txt"] {
        assert!(
            fs::read(restored_root.join(file)).unwrap()
                == fs::read(fixture.join("source").join(file)).unwrap(),
            "{file} restored wrong"
        );
    }
    assert_eq!(
        fs::read_link(restored_root.join("link")).unwrap(),
        Path::new("hello.txt")
    );

    let src = repo.dir("src");
    TreeBuilder::new(&src)
        .file("new.txt", pseudo_text(14, 200_000))
        .finish();
    repo.backup(&[&src]);
    assert!(all_entries(&repo.path).iter().all(|e| e.3 == 0));
    assert_eq!(fs::read(repo.path.join("config")).unwrap(), old_config);
    repo.check(true).expect_ok();
}

#[test]
fn init_validates_the_compression_argument() {
    for bad in [
        "lz4",
        "zstd:0",
        "zstd:20",
        "zstd:-1",
        "zstd:fast",
        "gzip:3",
        "zstd:3:0",
        "zstd:3:256",
        "",
    ] {
        let (repo, out) = Repo::init_plain_with(&["--compression", bad]);
        out.expect_code(2).expect_stderr(&[
            "invalid compression",
            "none, zstd, zstd:LEVEL or zstd:LEVEL:UNIT",
            "1 to 19",
        ]);
        assert!(!repo.path.exists(), "{bad}: a repository was created");
    }
    let (_, out) = Repo::init_plain_with(&["--compression", "zstd:19", "--json"]);
    out.expect_ok();
    assert_eq!(
        out.json()["config"]["compression"],
        serde_json::json!({ "kind": "zstd", "level": 19, "unit_chunks": 16 })
    );
    let (_, out) = Repo::init_plain_with(&["--compression", "zstd:19:1", "--json"]);
    out.expect_ok();
    assert_eq!(
        out.json()["config"]["compression"],
        serde_json::json!({ "kind": "zstd", "level": 19 })
    );
    let (_, out) = Repo::init_plain_with(&["--compression", "zstd:7"]);
    out.expect_ok();
    assert!(out.stdout.contains("compression zstd:7:16"), "{out}");
}

#[test]
fn a_config_with_impossible_compression_is_refused() {
    let repo = Repo::init_plain(&[]);
    let src = repo.dir("src");
    TreeBuilder::new(&src).file("f", b"data").finish();
    let good = config(&repo);
    let with = |version: u64, compression: Value| {
        let mut c = good.clone();
        c["version"] = version.into();
        c["compression"] = compression;
        serde_json::to_vec(&c).unwrap()
    };
    let cases = [
        (
            with(1, serde_json::json!({ "kind": "zstd", "level": 3 })),
            "format version 1 cannot use compression zstd:3",
        ),
        (
            with(2, serde_json::json!({ "kind": "zstd", "level": 23 })),
            "zstd level 23 is outside 1..=19",
        ),
        (
            with(2, serde_json::json!({ "kind": "lz4" })),
            "invalid repository config",
        ),
        (
            with(3, serde_json::json!({ "kind": "zstd", "level": 3 })),
            "format version 3 is for encrypted repositories",
        ),
        (
            with(
                2,
                serde_json::json!({ "kind": "zstd", "level": 3, "unit_chunks": 8 }),
            ),
            "format version 2 cannot use compression zstd:3:8; it needs version 4",
        ),
        (
            with(5, serde_json::json!({ "kind": "zstd", "level": 3 })),
            "repository format version 5 is not supported",
        ),
    ];
    for (cfg, needle) in cases {
        fs::write(repo.path.join("config"), &cfg).unwrap();
        repo.backup_run(&[&src])
            .expect_code(1)
            .expect_stderr(&[needle]);
        repo.run(["check"]).expect_code(1).expect_stderr(&[needle]);
    }
    // Version 2 without compression is consistent (a hand-made config, say).
    fs::write(
        repo.path.join("config"),
        with(2, serde_json::json!({ "kind": "none" })),
    )
    .unwrap();
    repo.backup(&[&src]);
}

#[test]
fn backup_and_stats_report_dedup_and_compression_separately() {
    let repo = Repo::init_plain(&[]);
    let src = repo.dir("src");
    let text = pseudo_text(12, 400_000);
    TreeBuilder::new(&src)
        .file("a.txt", &text)
        .file("b.txt", &text)
        .file("c.txt", &text)
        .finish();
    let s = repo.backup(&[&src]);
    let (bytes_in, new, new_stored) = (
        u(&s, "bytes_in"),
        u(&s, "bytes_new"),
        u(&s, "bytes_new_stored"),
    );
    assert_eq!(bytes_in, 1_200_000);
    let close = |a: f64, b: f64| (a - b).abs() < 1e-9 * b.max(1.0);
    assert!(close(f(&s, "dedup_ratio"), bytes_in as f64 / new as f64));
    assert!(close(
        f(&s, "compression_ratio"),
        new as f64 / new_stored as f64
    ));
    assert!(f(&s, "dedup_ratio") > 2.5, "{s}");
    assert!(f(&s, "compression_ratio") > 2.0, "{s}");
    assert!(s["stage_seconds"]["compress"].is_number(), "{s}");

    let stats = repo.run(["--json", "stats"]);
    stats.expect_ok();
    let st = stats.json();
    assert_eq!(u(&st, "unique_bytes"), new);
    assert_eq!(u(&st, "chunk_bytes_stored"), new_stored);
    assert!(close(
        f(&st, "compression_ratio"),
        new as f64 / new_stored as f64
    ));
    assert!(close(
        f(&st, "dedup_ratio"),
        u(&st, "logical_bytes") as f64 / new as f64
    ));

    let text_out = repo.run(["stats"]);
    text_out.expect_ok();
    assert!(
        text_out.stdout.contains("ratios      dedup ") && text_out.stdout.contains("compression "),
        "{text_out}"
    );
    let backup_out = repo.run(["backup", src.to_str().unwrap()]);
    backup_out.expect_ok();
    assert!(
        backup_out.stdout.contains("ratios      dedup ") && backup_out.stdout.contains("compress "),
        "{backup_out}"
    );
}

/// Rewrites the flags of the first entry of the container at `path` to `flags` and
/// recomputes the checksum, as a newer larder with another encoding would write it.
fn set_first_flags(path: &Path, flags: u8) {
    let mut bytes = fs::read(path).unwrap();
    let footer = bytes.len() - TRAILER_LEN;
    let table_offset = u64::from_le_bytes(bytes[footer..footer + 8].try_into().unwrap()) as usize;
    bytes[table_offset + 44] = flags;
    let mut h = blake3::Hasher::new();
    h.update(&bytes[..HEADER_LEN]);
    h.update(&bytes[table_offset..footer + 16]);
    let sum = *h.finalize().as_bytes();
    bytes[footer + 16..footer + 48].copy_from_slice(&sum);
    fs::remove_file(path).unwrap();
    fs::write(path, bytes).unwrap();
}

#[test]
fn unknown_chunk_encodings_are_refused_by_name() {
    let repo = Repo::init_plain(&[]);
    let src = repo.dir("src");
    TreeBuilder::new(&src)
        .file("t.txt", pseudo_text(13, 50_000))
        .finish();
    repo.backup(&[&src]);
    let files = container_files(&repo.path);
    assert_eq!(files.len(), 1);
    set_first_flags(&files[0], 7);
    let out = repo.check(false);
    out.expect_code(1);
    assert!(
        out.stdout.contains("unknown chunk encoding (flags 7)"),
        "{out}"
    );
    let target = repo.dir("target");
    repo.restore("latest", &target, &[])
        .expect_code(1)
        .expect_stderr(&["unknown chunk encoding (flags 7)", "newer larder"]);
}
