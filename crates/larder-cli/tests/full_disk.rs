//! A repository on a full disk (docs/design/gc.md, "A full disk"): `forget --prune`
//! and `gc` free the space backups filled, though not one byte is free when they
//! start; the lock note that cannot be written is a warning. On a small tmpfs filled
//! to the last byte, as root.

mod support;

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use support::{is_root, pseudo_random, Repo};

/// A tmpfs of `size` at `at`, unmounted on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn new(at: &Path, size: &str) -> Option<Self> {
        fs::create_dir_all(at).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0700")])
            .arg("tmpfs")
            .arg(at)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            eprintln!("skipping: cannot mount a tmpfs here");
            return None;
        }
        Some(Self(at.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// Bytes free on the file system of `path`.
fn free_bytes(path: &Path) -> u64 {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: statvfs is plain data filled by the call; `c` is a valid path.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
    st.f_bavail * st.f_frsize
}

/// Fills the file system of `dir` to the last byte with `dir/filler-N`.
fn fill(dir: &Path, n: u32) {
    let mut f = fs::File::create(dir.join(format!("filler-{n}"))).unwrap();
    let block = vec![0x5a; 4096];
    while f.write_all(&block).is_ok() {}
    while f.write_all(&[0x5a]).is_ok() {}
    assert_eq!(free_bytes(dir), 0, "the disk is not full");
}

/// A repository on a 24 MiB tmpfs with three snapshots of 5 MiB of distinct data
/// each, the disk then filled to the last byte. Returns the repository fixture (its
/// `path` on the tmpfs), the mount, the sources and the snapshot ids.
fn full_repository(repo: &mut Repo) -> Option<(Tmpfs, Vec<PathBuf>, Vec<String>)> {
    let disk = repo.scratch.path().join("disk");
    let tmpfs = Tmpfs::new(&disk, "24m")?;
    repo.path = disk.join("repo");
    let mut args = vec!["init"];
    args.extend_from_slice(&support::CHEAP_KDF);
    repo.run(&args).expect_ok();
    let mut sources = Vec::new();
    let mut ids = Vec::new();
    for i in 0..3 {
        let src = repo.dir(&format!("src{i}"));
        fs::write(src.join("data"), pseudo_random(i, 5 << 20)).unwrap();
        let id = repo.backup(&[&src])["snapshot"]
            .as_str()
            .unwrap()
            .to_string();
        sources.push(src);
        ids.push(id);
    }
    fill(&disk, 0);
    Some((tmpfs, sources, ids))
}

#[test]
fn forget_prune_frees_a_full_disk() {
    if !is_root() {
        eprintln!("skipping: mounting a tmpfs needs root");
        return;
    }
    let mut repo = Repo::uninit();
    let Some((_tmpfs, sources, ids)) = full_repository(&mut repo) else {
        return;
    };
    let out = repo.run(["--json", "forget", &ids[0], &ids[1], "--prune"]);
    out.expect_ok();
    assert_eq!(out.json()["gc"]["disk_was_full"], true, "{out}");
    assert!(
        free_bytes(&repo.path) > 8 << 20,
        "forget --prune freed {} bytes",
        free_bytes(&repo.path)
    );
    repo.check(true).expect_ok();
    let target = repo.new_path("target");
    repo.restore(&ids[2], &target, &[]).expect_ok();
    support::assert_same_tree(&sources[2], &support::restored(&target, &sources[2]));
}

#[test]
fn gc_frees_a_full_disk_after_forget() {
    if !is_root() {
        eprintln!("skipping: mounting a tmpfs needs root");
        return;
    }
    let mut repo = Repo::uninit();
    let Some((_tmpfs, sources, ids)) = full_repository(&mut repo) else {
        return;
    };
    repo.run(["forget", &ids[0], &ids[1]]).expect_ok();
    // What forget freed is taken again: not a byte is free for gc.
    fill(repo.path.parent().unwrap(), 1);
    let out = repo.run(["--json", "gc"]);
    out.expect_ok();
    assert_eq!(out.json()["disk_was_full"], true, "{out}");
    assert!(free_bytes(&repo.path) > 8 << 20, "gc freed too little");
    // The collection made its reserve again, in the space it freed.
    assert!(repo.path.join("reserve").is_file());
    repo.check(true).expect_ok();
    let target = repo.new_path("target");
    repo.restore(&ids[2], &target, &[]).expect_ok();
    support::assert_same_tree(&sources[2], &support::restored(&target, &sources[2]));
}

/// Container ids in `repo/containers`.
fn containers(repo: &Path) -> Vec<u64> {
    let mut ids: Vec<u64> = fs::read_dir(repo.join("containers"))
        .unwrap()
        .map(|e| {
            let name = e.unwrap().file_name();
            u64::from_str_radix(name.to_str().unwrap().trim_end_matches(".ctr"), 16).unwrap()
        })
        .collect();
    ids.sort_unstable();
    ids
}

/// A full-disk collection killed after it deleted the unused containers and before
/// its commit: the next writer rolls it forward (a roll-back would leave segments
/// naming the deleted containers, which a backup could deduplicate against).
#[test]
fn a_full_disk_collection_killed_before_its_commit_is_rolled_forward() {
    let repo = Repo::init_plain(&[]);
    let mut ids = Vec::new();
    let mut sources = Vec::new();
    for i in 0..3 {
        let src = repo.dir(&format!("src{i}"));
        fs::write(src.join("data"), pseudo_random(i, 3 << 20)).unwrap();
        ids.push(
            repo.backup(&[&src])["snapshot"]
                .as_str()
                .unwrap()
                .to_string(),
        );
        sources.push(src);
    }
    repo.run(["forget", &ids[0], &ids[1]]).expect_ok();
    // Which containers a collection deletes: those of a copy that ran one.
    let copy = repo.scratch.path().join("copy");
    assert!(Command::new("cp")
        .arg("-a")
        .arg(&repo.path)
        .arg(&copy)
        .status()
        .unwrap()
        .success());
    let mut c = support::larder_command(repo.xdg());
    c.env_remove("LARDER_PASSWORD")
        .arg("--repo")
        .arg(&copy)
        .arg("gc");
    support::run_command(c, support::RUN_TIMEOUT).expect_ok();
    let after = containers(&copy);
    let empty: Vec<u64> = containers(&repo.path)
        .into_iter()
        .filter(|id| !after.contains(id))
        .collect();
    assert!(!empty.is_empty());

    // The state the kill leaves: a durable plan naming them, the files gone, no
    // segment <id>.
    let mut segments: Vec<u64> = fs::read_dir(repo.path.join("index"))
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().to_str().unwrap().to_string();
            u64::from_str_radix(name.strip_suffix(".idx")?, 16).ok()
        })
        .collect();
    segments.sort_unstable();
    let plan = larder_store::GcPlan {
        id: segments.last().unwrap() + 1,
        old_segments: segments,
        delete: empty.clone(),
        new_containers: Vec::new(),
    };
    fs::write(
        repo.path.join(format!("gc/{}.plan", plan.name())),
        plan.encode(),
    )
    .unwrap();
    for id in &empty {
        fs::remove_file(repo.path.join(format!("containers/{id:016x}.ctr"))).unwrap();
    }

    // The next writer finishes it.
    let src = &sources[2];
    let out = repo.run(["backup", src.to_str().unwrap()]);
    out.expect_ok()
        .expect_stderr(&["finished garbage collection"]);
    repo.check(true).expect_ok();
    let target = repo.new_path("target");
    repo.restore(&ids[2], &target, &[]).expect_ok();
    support::assert_same_tree(src, &support::restored(&target, src));
    assert!(fs::read_dir(repo.path.join("gc")).unwrap().all(|e| !e
        .unwrap()
        .file_name()
        .to_str()
        .unwrap()
        .ends_with(".plan")));
}
