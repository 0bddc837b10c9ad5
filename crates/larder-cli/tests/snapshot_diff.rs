//! `larder diff` on real changes between two backups of one tree: added, removed and
//! modified entries with what changed (content, size, mode, mtime, symlink target,
//! type), the counts, and the bytes only one snapshot's files use; text and JSON.

mod support;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use serde_json::Value;
use support::{set_mtime, Repo, TreeBuilder};

/// Every file is smaller than the 2 KiB minimum chunk, so it is one chunk of its own
/// size, and every content is distinct: the byte counts are sums of file sizes.
fn build_v1(src: &Path) {
    TreeBuilder::new(src)
        .file("same.txt", b"never changes\n")
        .file("rewrite.txt", b"old words\n")
        .file("grow.txt", b"short\n")
        .file("chmod.txt", b"mode changes\n")
        .file("touch.txt", b"mtime changes\n")
        .file("gone.txt", b"removed file\n")
        .file("gone_dir/inner", b"removed with its directory\n")
        .symlink("link", "same.txt")
        .file("retype", b"a file that becomes a directory\n")
        .finish();
}

/// Changes v1 into v2 in place, keeping every mtime that should not change.
fn change_to_v2(src: &Path) {
    let mtime = |rel: &str| {
        let m = fs::symlink_metadata(src.join(rel)).unwrap();
        use std::os::unix::fs::MetadataExt;
        (m.mtime(), m.mtime_nsec() as u32)
    };
    let root_mtime = mtime("");
    let rewrite_mtime = mtime("rewrite.txt");
    let link_mtime = mtime("link");

    fs::write(src.join("rewrite.txt"), b"new words\n").unwrap();
    set_mtime(&src.join("rewrite.txt"), rewrite_mtime, false);
    fs::write(src.join("grow.txt"), b"short, then longer\n").unwrap();
    set_mtime(&src.join("grow.txt"), (1_800_000_000, 1), false);
    fs::set_permissions(src.join("chmod.txt"), fs::Permissions::from_mode(0o600)).unwrap();
    set_mtime(&src.join("touch.txt"), (1_800_000_000, 2), false);
    fs::remove_file(src.join("gone.txt")).unwrap();
    fs::remove_dir_all(src.join("gone_dir")).unwrap();
    fs::remove_file(src.join("link")).unwrap();
    std::os::unix::fs::symlink("grow.txt", src.join("link")).unwrap();
    set_mtime(&src.join("link"), link_mtime, true);
    fs::write(src.join("new.txt"), b"added file\n").unwrap();
    fs::create_dir(src.join("new_dir")).unwrap();
    fs::write(src.join("new_dir/x"), b"added in a new directory\n").unwrap();
    fs::remove_file(src.join("retype")).unwrap();
    fs::create_dir(src.join("retype")).unwrap();
    fs::write(src.join("retype/inside"), b"inside the new directory\n").unwrap();
    set_mtime(src, root_mtime, false);
}

fn id(summary: &Value) -> String {
    summary["snapshot"].as_str().unwrap().to_string()
}

#[test]
fn diff_names_every_kind_of_change() {
    // Plaintext and uncompressed: the byte counts are stored lengths, which sealing
    // makes 16 bytes longer and compression units shorter (diff.rs's unit tests count
    // units).
    let repo = Repo::init_plain(&["--compression", "none"]);
    let src = repo.dir("src");
    build_v1(&src);
    let v1 = id(&repo.backup(&[&src]));
    change_to_v2(&src);
    let v2 = id(&repo.backup(&[&src]));
    let root = src.display().to_string();

    let out = repo.run(["--json", "diff", &v1, &v2]);
    out.expect_ok();
    let d = out.json();
    assert_eq!(d["snapshot1"], v1.as_str());
    assert_eq!(d["snapshot2"], v2.as_str());
    // Only changes inside the source: its parents (`/tmp`, say) may change meanwhile.
    let changes: BTreeMap<String, (String, String, Vec<String>)> = d["changes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| {
            let path = c["path"].as_str().unwrap();
            let rel = path.strip_prefix(&root)?;
            let changed = c["changed"]
                .as_array()
                .map(|f| f.iter().map(|v| v.as_str().unwrap().to_string()).collect())
                .unwrap_or_default();
            Some((
                rel.to_string(),
                (
                    c["change"].as_str().unwrap().to_string(),
                    c["type"].as_str().unwrap().to_string(),
                    changed,
                ),
            ))
        })
        .collect();
    let expect = |change: &str, kind: &str, fields: &[&str]| {
        (
            change.to_string(),
            kind.to_string(),
            fields.iter().map(|f| f.to_string()).collect::<Vec<_>>(),
        )
    };
    let expected: BTreeMap<String, _> = [
        ("/rewrite.txt", expect("modified", "file", &["content"])),
        (
            "/grow.txt",
            expect("modified", "file", &["content", "size", "mtime"]),
        ),
        ("/chmod.txt", expect("modified", "file", &["mode"])),
        ("/touch.txt", expect("modified", "file", &["mtime"])),
        ("/gone.txt", expect("removed", "file", &[])),
        ("/gone_dir", expect("removed", "dir", &[])),
        ("/gone_dir/inner", expect("removed", "file", &[])),
        ("/link", expect("modified", "symlink", &["target"])),
        ("/new.txt", expect("added", "file", &[])),
        ("/new_dir", expect("added", "dir", &[])),
        ("/new_dir/x", expect("added", "file", &[])),
        ("/retype", expect("modified", "dir", &["type"])),
        ("/retype/inside", expect("added", "file", &[])),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    assert_eq!(changes, expected, "{out}");
    let retype = d["changes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["path"] == format!("{root}/retype").as_str())
        .unwrap();
    assert_eq!(retype["old_type"], "file");
    let counts = (&d["added"], &d["removed"], &d["modified"]);
    let parents_changed = d["changes"].as_array().unwrap().len() - changes.len();
    assert_eq!(
        counts,
        (&4.into(), &3.into(), &(6 + parents_changed).into()),
        "{d}"
    );

    let len = |s: &str| s.len() as u64;
    let added = len("new words\n")
        + len("short, then longer\n")
        + len("added file\n")
        + len("added in a new directory\n")
        + len("inside the new directory\n");
    let removed = len("old words\n")
        + len("short\n")
        + len("removed file\n")
        + len("removed with its directory\n")
        + len("a file that becomes a directory\n");
    assert_eq!(d["bytes_added"], added, "{d}");
    assert_eq!(d["bytes_removed"], removed, "{d}");
    assert_eq!(d["unknown_chunks"], 0);

    let text = repo.run(["diff", &v1, &v2]);
    text.expect_ok();
    let lines: Vec<&str> = text.stdout.lines().collect();
    let inside = lines
        .iter()
        .filter(|l| l.contains(&format!("{root}/")))
        .count();
    assert_eq!(inside, 13, "{text}");
    for line in [
        format!("M {root}/grow.txt (content, size, mtime)"),
        format!("- {root}/gone_dir/"),
        format!("+ {root}/new.txt"),
        format!("M {root}/retype/ (type file -> dir)"),
        format!("M {root}/link (target)"),
    ] {
        assert!(lines.contains(&line.as_str()), "no line {line:?}\n{text}");
    }
    // Changes come in tree order: a directory before what is inside it.
    let position = |needle: &str| lines.iter().position(|l| l.ends_with(needle)).unwrap();
    assert!(position("/gone_dir/") < position("/gone_dir/inner"));
    assert!(position("/chmod.txt (mode)") < position("/touch.txt (mtime)"));
    let summary = lines.last().unwrap();
    let counts = format!(
        "{} -> {}: 4 added, 3 removed, {} modified",
        &v1[..8],
        &v2[..8],
        6 + parents_changed
    );
    assert!(summary.starts_with(&counts), "{summary}");
    assert!(
        summary.contains(&format!("data added {added} B, removed {removed} B")),
        "{summary}"
    );
}

#[test]
fn a_snapshot_compared_with_itself_has_no_changes() {
    let repo = Repo::init(&[]);
    let src = repo.dir("src");
    build_v1(&src);
    let v1 = id(&repo.backup(&[&src]));
    let v1_again = id(&repo.backup(&[&src]));
    for (a, b) in [(v1.as_str(), "latest"), (&v1[..8], v1_again.as_str())] {
        let out = repo.run(["--json", "diff", a, b]);
        out.expect_ok();
        let d = out.json();
        // A snapshot records `src`'s ancestors too; their metadata may change between
        // the two backups (anything else creating files in /tmp), nothing at or below
        // `src` may.
        for change in d["changes"].as_array().expect("changes") {
            let path = change["path"].as_str().expect("path");
            assert!(
                src.starts_with(path) && src != Path::new(path),
                "only ancestors of {} may change: {d}",
                src.display()
            );
        }
        assert_eq!(
            (&d["bytes_added"], &d["bytes_removed"]),
            (&0.into(), &0.into())
        );
    }
    let text = repo.run(["diff", &v1, &v1]);
    text.expect_ok();
    assert_eq!(text.stdout.lines().count(), 1, "only the summary\n{text}");
    repo.run(["-q", "diff", &v1, &v1]).expect_ok();
}

#[test]
fn diff_with_an_unknown_snapshot_fails_naming_it() {
    let repo = Repo::init(&[]);
    let src = repo.dir("src");
    build_v1(&src);
    let v1 = id(&repo.backup(&[&src]));
    let out = repo.run(["--json", "diff", &v1, "ffffffffffff"]);
    out.expect_code(1)
        .expect_stderr(&["no snapshot matches \"ffffffffffff\""]);
    assert!(out.json()["error"].is_string());
    repo.run(["diff", "latest"]).expect_code(2);
}
