//! `check` finds damage and says what it costs: every flipped byte of a container is
//! reported with the container, and damaged chunk data with the snapshot and the files
//! that use it; damaged index segments, truncated and deleted containers are reported;
//! `restore` of a damaged file fails naming it and never writes wrong bytes.
//!
//! The tests read containers and tree streams with their own decoders, written from
//! docs/design/format.md, to know which files each byte belongs to.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value;
use support::{pseudo_random, pseudo_text, restored, snapshot_path, Repo, TreeBuilder};

type Fp = [u8; 32];

const HEADER_LEN: usize = 32;
const ENTRY_LEN: usize = 48;
/// Footer (16) + checksum (32) + end magic (8).
const TRAILER_LEN: usize = 56;

/// One table entry of a container.
#[derive(Debug, Clone)]
struct Chunk {
    fp: Fp,
    offset: usize,
    /// Stored length.
    len: usize,
    raw_len: usize,
    /// 0 raw, 1 zstd, 2 a compression unit's member.
    flags: u8,
    /// A member's offset in its unit's raw bytes.
    unit_offset: usize,
}

/// A container file, parsed per docs/design/format.md.
#[derive(Debug, Clone)]
struct Container {
    name: String,
    bytes: Vec<u8>,
    table_offset: usize,
    chunks: Vec<Chunk>,
}

fn le_u32(b: &[u8]) -> u32 {
    u32::from_le_bytes(b[..4].try_into().unwrap())
}

fn le_u64(b: &[u8]) -> u64 {
    u64::from_le_bytes(b[..8].try_into().unwrap())
}

impl Container {
    fn read(path: &Path) -> Self {
        let bytes = fs::read(path).expect("read container");
        assert_eq!(&bytes[..8], b"LARDERC1");
        assert_eq!(&bytes[bytes.len() - 8..], b"LARDERCE");
        let footer = bytes.len() - TRAILER_LEN;
        let table_offset = le_u64(&bytes[footer..]) as usize;
        let count = le_u32(&bytes[footer + 8..]) as usize;
        assert_eq!(table_offset + count * ENTRY_LEN, footer);
        let chunks = bytes[table_offset..footer]
            .chunks_exact(ENTRY_LEN)
            .map(|e| Chunk {
                fp: e[..32].try_into().unwrap(),
                offset: le_u32(&e[32..]) as usize,
                len: le_u32(&e[36..]) as usize,
                raw_len: le_u32(&e[40..]) as usize,
                flags: e[44],
                unit_offset: le_u32(&[e[45], e[46], e[47], 0]) as usize,
            })
            .collect();
        let name = path.file_stem().unwrap().to_str().unwrap().to_string();
        Self {
            name,
            bytes,
            table_offset,
            chunks,
        }
    }

    /// The raw bytes of `chunk`, decoded per its flags.
    fn raw(&self, chunk: &Chunk) -> Vec<u8> {
        let stored = &self.bytes[chunk.offset..chunk.offset + chunk.len];
        match chunk.flags {
            0 => stored.to_vec(),
            1 => zstd::bulk::decompress(stored, chunk.raw_len).expect("a zstd frame"),
            2 => {
                let unit = decode_unit(stored, self.unit_len(chunk)).expect("a zstd frame");
                unit[chunk.unit_offset..chunk.unit_offset + chunk.raw_len].to_vec()
            }
            f => panic!("unknown flags {f}"),
        }
    }

    /// The members of `chunk`'s unit (just `chunk` when it is stored alone).
    fn unit_of(&self, chunk: &Chunk) -> Vec<&Chunk> {
        match chunk.flags {
            2 => self
                .chunks
                .iter()
                .filter(|c| c.flags == 2 && c.offset == chunk.offset)
                .collect(),
            _ => vec![self.chunks.iter().find(|c| c.fp == chunk.fp).unwrap()],
        }
    }

    /// Raw bytes of `chunk`'s unit: its members' raw lengths summed.
    fn unit_len(&self, chunk: &Chunk) -> usize {
        self.unit_of(chunk).iter().map(|c| c.raw_len).sum()
    }

    /// The chunks larder finds damaged when this container's bytes become `damaged`,
    /// by a change inside the stored bytes of `chunk`: the chunk, if it is stored
    /// alone; if it is a unit's member, every member when the unit no longer decodes
    /// (as larder decodes: one whole frame, its header's unused bit clear, exactly the
    /// unit's raw length), else the members whose bytes changed.
    fn damaged_by(&self, chunk: &Chunk, damaged: &[u8]) -> BTreeSet<Fp> {
        let members = self.unit_of(chunk);
        if chunk.flags != 2 {
            return BTreeSet::from([chunk.fp]);
        }
        let stored = &damaged[chunk.offset..chunk.offset + chunk.len];
        let Some(unit) = decode_unit(stored, self.unit_len(chunk)) else {
            return members.iter().map(|m| m.fp).collect();
        };
        members
            .iter()
            .filter(|m| unit[m.unit_offset..m.unit_offset + m.raw_len] != self.raw(m)[..])
            .map(|m| m.fp)
            .collect()
    }

    fn footer(&self) -> usize {
        self.bytes.len() - TRAILER_LEN
    }

    /// The first chunk whose stored bytes hold `pos`.
    fn chunk_at(&self, pos: usize) -> Option<&Chunk> {
        self.chunks
            .iter()
            .find(|c| (c.offset..c.offset + c.len).contains(&pos))
    }

    /// Positions spread over every region: header, chunk data (including the middle
    /// of the first stored units), table, footer, checksum and end magic.
    fn interesting_positions(&self) -> Vec<usize> {
        let (t, f, n) = (self.table_offset, self.footer(), self.chunks.len());
        let mut p = vec![0, 7, 8, 11, 12, 13, 15, 16, 23, 24, 31];
        p.extend([HEADER_LEN, t - 1]);
        p.extend((1..12).map(|i| HEADER_LEN + (t - HEADER_LEN) * i / 12));
        // The middles of the first six stored units (a unit's members share its bytes).
        let mut units: Vec<(usize, usize)> =
            self.chunks.iter().map(|c| (c.offset, c.len)).collect();
        units.dedup();
        p.extend(units.iter().take(6).map(|(offset, len)| offset + len / 2));
        p.extend([t, t + 31, t + 32, t + 36, t + 40, t + 44, t + 45]);
        p.extend([t + ENTRY_LEN * (n / 2) + 5, f - 1]);
        p.extend([f, f + 8, f + 12, f + 15]);
        p.extend([f + 16, f + 31, f + 47]);
        p.extend([f + 48, f + 55]);
        p.sort_unstable();
        p.dedup();
        p
    }
}

/// A unit's frame decoded as larder decodes it (docs/design/format.md, "Container"):
/// `None` unless it is one whole zstd frame, with its header's unused bit clear, that
/// decodes to exactly `unit_len` bytes.
fn decode_unit(stored: &[u8], unit_len: usize) -> Option<Vec<u8>> {
    let whole = zstd::zstd_safe::find_frame_compressed_size(stored).ok()? == stored.len();
    if !whole || stored.get(4).is_none_or(|d| d & 0x10 != 0) {
        return None;
    }
    let mut out = vec![0; unit_len];
    let n = zstd::bulk::Decompressor::new()
        .ok()?
        .decompress_to_buffer(stored, &mut out)
        .ok()?;
    (n == unit_len).then_some(out)
}

/// A file of the snapshot: its path as stored and its recipe.
#[derive(Debug, Clone)]
struct FileEntry {
    path: String,
    chunks: Vec<Fp>,
}

/// Decodes a tree stream (docs/design/format.md, "Tree stream", version 1 to 3);
/// files only.
fn decode_tree(stream: &[u8]) -> Vec<FileEntry> {
    let version = match &stream[..8] {
        b"LARDERT1" => 1,
        b"LARDERT2" => 2,
        b"LARDERT3" => 3,
        magic => panic!("not a tree stream: {magic:?}"),
    };
    let mut pos = 8;
    let mut files = Vec::new();
    loop {
        let kind = stream[pos];
        pos += 1;
        if kind == 0 {
            assert_eq!(pos, stream.len(), "bytes after the end marker");
            return files;
        }
        let plen = le_u32(&stream[pos..]) as usize;
        let path = String::from_utf8_lossy(&stream[pos + 4..pos + 4 + plen]).into_owned();
        if version >= 2 {
            // Mode, mtime, ctime, uid, gid, size, inode, device, link count.
            pos += 4 + plen + 4 + 12 + 12 + 4 + 4 + 8 + 8 + 8 + 4;
            // User and group names.
            for _ in 0..2 {
                pos += 1 + usize::from(stream[pos]);
            }
            let xattrs = le_u32(&stream[pos..]);
            pos += 4;
            for _ in 0..xattrs {
                pos += 1 + usize::from(stream[pos]);
                pos += 4 + le_u32(&stream[pos..]) as usize;
            }
            if version >= 3 {
                // Marks and attribute flags.
                pos += 1 + 4;
            }
        } else {
            pos += 4 + plen + 4 + 8 + 4 + 4 + 4 + 8;
        }
        match kind {
            1 => {
                let k = le_u64(&stream[pos..]) as usize;
                pos += 8;
                let chunks = stream[pos..pos + 32 * k]
                    .chunks_exact(32)
                    .map(|c| c.try_into().unwrap())
                    .collect();
                pos += 32 * k;
                files.push(FileEntry { path, chunks });
            }
            2 => {}
            3 => pos += 4 + le_u32(&stream[pos..]) as usize,
            4 => {}
            5 | 6 => pos += 8,
            k => panic!("unknown entry kind {k}"),
        }
    }
}

fn hex_to_fp(h: &str) -> Fp {
    let mut fp = [0u8; 32];
    for (i, b) in fp.iter_mut().enumerate() {
        *b = u8::from_str_radix(&h[2 * i..2 * i + 2], 16).unwrap();
    }
    fp
}

/// A repository with one snapshot of a few files, and everything the tests need to
/// know about where their bytes lie.
struct Fixture {
    repo: Repo,
    src: PathBuf,
    /// Short snapshot id, as `check` reports it.
    short: String,
    containers: Vec<Container>,
    tree_chunks: BTreeSet<Fp>,
    files: Vec<FileEntry>,
    /// The original contents, by stored path.
    contents: BTreeMap<String, Vec<u8>>,
}

impl Fixture {
    /// Files of random bytes: every file chunk is stored raw (only the tree stream's
    /// chunks are compressed).
    fn new() -> Self {
        Self::with_files(pseudo_random, 4_500_000)
    }

    /// Files of compressible text: file chunks are stored in compression units (the
    /// default), each unit one zstd frame.
    fn compressible() -> Self {
        let fx = Self::with_files(pseudo_text, 24_000_000);
        let data = fx.data_container();
        // A batch's last unit may hold one chunk, stored as its own frame.
        assert!(
            data.chunks.iter().all(|c| c.flags != 0) && data.chunks.iter().any(|c| c.flags == 2),
            "text chunks are compressed in units"
        );
        fx
    }

    /// A snapshot of files made by `make(seed, len)`, the big one `big` bytes: more
    /// than a container holds once stored, so that the tree lands in another
    /// container than the small files.
    fn with_files(make: fn(u64, usize) -> Vec<u8>, big: usize) -> Self {
        // Plaintext: the test parses and damages containers per format.md; encrypted
        // ones are damaged in larder-engine's tests/encrypted.rs.
        let repo = Repo::init_plain(&[]);
        let src = repo.dir("src");
        let dup = make(10, 40_000);
        TreeBuilder::new(&src)
            .file("a_dup1", &dup)
            .file("a_dup2", &dup)
            .file("b", make(11, 100_000))
            .file("c_tiny", make(12, 100))
            .file("d_empty", b"")
            .file("e_big", make(13, big))
            .finish();
        let summary = repo.backup(&[&src]);
        let id = summary["snapshot"].as_str().unwrap().to_string();
        let snaps = repo.snapshots();
        assert_eq!(snaps.len(), 1);
        let tree: Vec<Fp> = snaps[0]["snapshot"]["tree"]["chunks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| hex_to_fp(h.as_str().unwrap()))
            .collect();

        let mut names: Vec<PathBuf> = fs::read_dir(repo.path.join("containers"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        names.sort();
        let containers: Vec<Container> = names.iter().map(|p| Container::read(p)).collect();
        assert!(containers.len() >= 2, "expected data in several containers");
        let chunk_data = |fp: &Fp| -> Vec<u8> {
            containers
                .iter()
                .find_map(|c| c.chunks.iter().find(|e| &e.fp == fp).map(|e| c.raw(e)))
                .expect("every tree chunk is in a container")
        };
        let stream: Vec<u8> = tree.iter().flat_map(chunk_data).collect();
        let files = decode_tree(&stream);

        let mut contents = BTreeMap::new();
        for name in ["a_dup1", "a_dup2", "b", "c_tiny", "d_empty", "e_big"] {
            let p = src.join(name);
            contents.insert(snapshot_path(&p), fs::read(&p).unwrap());
        }
        assert_eq!(
            files
                .iter()
                .map(|f| f.path.clone())
                .collect::<BTreeSet<_>>(),
            contents.keys().cloned().collect::<BTreeSet<_>>(),
            "the tree lists other files than were backed up"
        );
        // The recipes really are the files' contents.
        for f in &files {
            let joined: Vec<u8> = f.chunks.iter().flat_map(chunk_data).collect();
            assert!(joined == contents[&f.path], "recipe of {} is wrong", f.path);
        }
        Self {
            repo,
            src,
            short: id[..8].to_string(),
            containers,
            tree_chunks: tree.into_iter().collect(),
            files,
            contents,
        }
    }

    /// The container holding no tree chunk and the most file chunks.
    fn data_container(&self) -> &Container {
        self.containers
            .iter()
            .filter(|c| c.chunks.iter().all(|e| !self.tree_chunks.contains(&e.fp)))
            .max_by_key(|c| c.chunks.len())
            .expect("a container without tree chunks")
    }

    /// The container holding the tree stream's chunks.
    fn tree_container(&self) -> &Container {
        self.containers
            .iter()
            .find(|c| c.chunks.iter().any(|e| self.tree_chunks.contains(&e.fp)))
            .expect("a container with tree chunks")
    }

    /// A copy of the repository at `dst`: containers hard-linked (a damaged one is
    /// replaced by a new file, never written in place), the rest copied.
    fn copy_repo(&self, dst: &Path) {
        copy_dir(&self.repo.path, dst);
    }

    /// What `check` must report when `bad` chunks (or, if `whole` is set, all of
    /// container `c`) are damaged: one key per damage, sorted.
    fn expected_damage(&self, c: &Container, bad: &BTreeSet<Fp>, whole: bool) -> Vec<String> {
        let mut out = vec![if whole {
            format!("container {}", c.name)
        } else {
            format!("chunks {} {}", c.name, bad.len())
        }];
        if bad.iter().any(|fp| self.tree_chunks.contains(fp)) {
            out.push(format!("tree {}", self.short));
        } else {
            for f in &self.files {
                let n = f.chunks.iter().filter(|fp| bad.contains(*fp)).count();
                if n > 0 {
                    out.push(format!("file {} {} {}", self.short, f.path, n));
                }
            }
        }
        out.sort();
        out
    }

    /// The files a damage to `bad` makes unrestorable.
    fn affected_files(&self, bad: &BTreeSet<Fp>) -> BTreeSet<String> {
        self.files
            .iter()
            .filter(|f| f.chunks.iter().any(|fp| bad.contains(fp)))
            .map(|f| f.path.clone())
            .collect()
    }
}

fn copy_dir(src: &Path, dst: &Path) {
    fs::create_dir_all(dst).unwrap();
    for e in fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        let (from, to) = (e.path(), dst.join(e.file_name()));
        if e.file_type().unwrap().is_dir() {
            copy_dir(&from, &to);
        } else if from.extension().is_some_and(|x| x == "ctr") {
            fs::hard_link(&from, &to).unwrap();
        } else {
            fs::copy(&from, &to).unwrap();
        }
    }
}

/// Replaces `path` by a new file holding `bytes` (never writes through a hard link).
fn replace_file(path: &Path, bytes: &[u8]) {
    fs::remove_file(path).unwrap();
    fs::write(path, bytes).unwrap();
}

fn container_path(repo: &Path, c: &Container) -> PathBuf {
    repo.join("containers").join(format!("{}.ctr", c.name))
}

/// `check`'s damage list as sorted keys (reasons left out).
fn damage_keys(report: &Value) -> Vec<String> {
    let mut keys: Vec<String> = report["report"]["damage"]
        .as_array()
        .unwrap_or_else(|| panic!("no damage list in {report}"))
        .iter()
        .map(|d| {
            let s = |f: &str| d[f].as_str().map(str::to_string).unwrap_or_default();
            match d["kind"].as_str().unwrap() {
                "container" => format!("container {}", s("id")),
                "chunks" => format!("chunks {} {}", s("container"), d["count"]),
                "tree" => format!("tree {}", s("snapshot")),
                "file" => format!("file {} {} {}", s("snapshot"), s("path"), d["bad_chunks"]),
                "segment" => format!("segment {}", s("name")),
                "snapshot" => "snapshot".to_string(),
                k => panic!("unknown damage kind {k}"),
            }
        })
        .collect();
    keys.sort();
    keys
}

/// Runs `check --json [--read-data]` on the repository at `path`.
fn check_at(fx: &Fixture, path: &Path, read_data: bool) -> support::Output {
    let mut args = vec!["--repo", path.to_str().unwrap(), "--json", "check"];
    if read_data {
        args.push("--read-data");
    }
    support::larder(fx.repo.xdg(), args)
}

fn restore_at(fx: &Fixture, path: &Path, target: &Path) -> support::Output {
    support::larder(
        fx.repo.xdg(),
        [
            "--repo",
            path.to_str().unwrap(),
            "--json",
            "restore",
            "latest",
            target.to_str().unwrap(),
        ],
    )
}

#[test]
fn an_undamaged_repository_checks_clean() {
    for fx in [Fixture::new(), Fixture::compressible()] {
        checks_clean(&fx);
    }
}

fn checks_clean(fx: &Fixture) {
    for read_data in [false, true] {
        let out = fx.repo.check(read_data);
        out.expect_ok();
        let report = out.json();
        assert_eq!(report["ok"], true, "{out}");
        assert_eq!(report["read_data"], read_data);
        assert_eq!(damage_keys(&report), Vec::<String>::new());
        assert_eq!(report["report"]["snapshots"], 1);
        assert_eq!(report["report"]["containers"], fx.containers.len());
    }
}

#[test]
fn every_flipped_byte_of_a_container_is_found_and_traced_to_its_files() {
    flipped_bytes_are_found_and_traced(&Fixture::new());
}

#[test]
fn every_flipped_byte_of_compressed_chunks_is_found_and_traced_to_its_files() {
    flipped_bytes_are_found_and_traced(&Fixture::compressible());
}

fn flipped_bytes_are_found_and_traced(fx: &Fixture) {
    let mut cases: Vec<(&Container, usize)> = Vec::new();
    let data = fx.data_container();
    cases.extend(data.interesting_positions().into_iter().map(|p| (data, p)));
    // The container with the tree: a file chunk, a tree chunk, the structure.
    let tc = fx.tree_container();
    let tree_chunk = tc
        .chunks
        .iter()
        .find(|e| fx.tree_chunks.contains(&e.fp))
        .unwrap();
    let file_chunk = tc
        .chunks
        .iter()
        .find(|e| !fx.tree_chunks.contains(&e.fp))
        .expect("the tree container also holds file data");
    for p in [
        0,
        file_chunk.offset,
        tree_chunk.offset + tree_chunk.len / 2,
        tc.table_offset + 3,
        tc.bytes.len() - 1,
    ] {
        cases.push((tc, p));
    }
    assert!(cases.len() >= 40, "only {} cases", cases.len());

    let mut failures = Vec::new();
    for (i, (c, pos)) in cases.iter().enumerate() {
        let copy = fx.repo.scratch.path().join(format!("case-{i}"));
        fx.copy_repo(&copy);
        let mut bytes = c.bytes.clone();
        bytes[*pos] ^= 1 << (i % 8);
        replace_file(&container_path(&copy, c), &bytes);

        let out = check_at(fx, &copy, true);
        let (bad, whole) = match c.chunk_at(*pos) {
            Some(chunk) => (c.damaged_by(chunk, &bytes), false),
            None => (c.chunks.iter().map(|e| e.fp).collect(), true),
        };
        let expected = fx.expected_damage(c, &bad, whole);
        if out.code != Some(1) {
            failures.push(format!(
                "byte {pos} of {}: exit {:?}\n{out}",
                c.name, out.code
            ));
        } else if damage_keys(&out.json()) != expected {
            failures.push(format!(
                "byte {pos} of {}: reported {:#?}, expected {expected:#?}",
                c.name,
                damage_keys(&out.json())
            ));
        }
        fs::remove_dir_all(&copy).unwrap();
    }
    assert!(
        failures.is_empty(),
        "{} of {} flips misreported:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn text_output_names_container_snapshot_and_files() {
    let fx = Fixture::new();
    let c = fx.data_container();
    let dup_chunk = c.chunks[0].clone();
    let mut bytes = c.bytes.clone();
    bytes[dup_chunk.offset + 10] ^= 0x80;
    replace_file(&container_path(&fx.repo.path, c), &bytes);

    let out = fx.repo.run(["check", "--read-data"]);
    out.expect_code(1);
    let affected = fx.affected_files(&BTreeSet::from([dup_chunk.fp]));
    assert_eq!(
        affected.len(),
        2,
        "the first chunk should be shared by the duplicate files"
    );
    let mut needles = vec![
        format!("container {}: 1 chunk(s) damaged", c.name),
        "check found".to_string(),
    ];
    needles.extend(
        affected
            .iter()
            .map(|p| format!("snapshot {}: file {p} has 1 damaged", fx.short)),
    );
    out.expect_stderr(&needles.iter().map(String::as_str).collect::<Vec<_>>());
}

/// Checks that a restore after damage names every affected file, restores the others
/// exactly, and leaves no wrong byte in a damaged file (at most a correct prefix).
fn assert_restore_reports(
    fx: &Fixture,
    repo: &Path,
    container: &Container,
    affected: &BTreeSet<String>,
    tag: &str,
) {
    let target = fx.repo.scratch.path().join(format!("restore-{tag}"));
    let out = restore_at(fx, repo, &target);
    out.expect_code(3);
    let warned: BTreeSet<String> = out.json()["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["path"].as_str().unwrap().to_string())
        .collect();
    let expected: BTreeSet<String> = affected
        .iter()
        .map(|p| target.join(p).to_str().unwrap().to_string())
        .collect();
    assert_eq!(warned, expected, "{out}");
    for p in &expected {
        out.expect_stderr(&[p, "corrupt container", &container.name]);
    }
    for (path, original) in &fx.contents {
        let restored_file = target.join(path);
        if affected.contains(path) {
            if let Ok(written) = fs::read(&restored_file) {
                assert!(
                    written.len() < original.len() && original.starts_with(&written),
                    "{path}: a damaged file was restored with wrong or complete bytes"
                );
            }
        } else {
            assert!(
                fs::read(&restored_file).unwrap() == *original,
                "{path} was not restored intact"
            );
        }
    }
}

#[test]
fn restore_of_damaged_chunk_data_names_the_files_and_writes_no_wrong_bytes() {
    restore_of_damaged_chunks_is_reported(&Fixture::new());
}

#[test]
fn restore_of_damaged_compressed_chunks_names_the_files_and_writes_no_wrong_bytes() {
    restore_of_damaged_chunks_is_reported(&Fixture::compressible());
}

fn restore_of_damaged_chunks_is_reported(fx: &Fixture) {
    let c = fx.data_container();
    // The duplicate files' first chunk, and a chunk of the big file.
    let big = fx.files.iter().find(|f| f.path.ends_with("e_big")).unwrap();
    let big_chunk = c
        .chunks
        .iter()
        .find(|e| e.fp == big.chunks[3])
        .expect("the big file starts in the data container");
    for (tag, chunk) in [("dup", c.chunks[0].clone()), ("big", big_chunk.clone())] {
        let copy = fx.repo.scratch.path().join(format!("copy-{tag}"));
        fx.copy_repo(&copy);
        let mut bytes = c.bytes.clone();
        bytes[chunk.offset + chunk.len - 1] ^= 0x01;
        replace_file(&container_path(&copy, c), &bytes);
        let affected = fx.affected_files(&c.damaged_by(&chunk, &bytes));
        assert!(!affected.is_empty());
        assert_restore_reports(fx, &copy, c, &affected, tag);
    }
}

#[test]
fn restore_from_a_container_with_a_damaged_header_names_every_file_in_it() {
    let fx = Fixture::new();
    let c = fx.data_container();
    let mut bytes = c.bytes.clone();
    bytes[20] ^= 0x04;
    replace_file(&container_path(&fx.repo.path, c), &bytes);
    let all: BTreeSet<Fp> = c.chunks.iter().map(|e| e.fp).collect();
    let affected = fx.affected_files(&all);
    assert_eq!(
        affected.len(),
        5,
        "every file but the empty one: {affected:?}"
    );
    assert_restore_reports(&fx, &fx.repo.path, c, &affected, "header");
}

#[test]
fn restore_with_a_damaged_tree_fails_and_writes_nothing() {
    let fx = Fixture::new();
    let c = fx.tree_container();
    let tree_chunk = c
        .chunks
        .iter()
        .find(|e| fx.tree_chunks.contains(&e.fp))
        .unwrap();
    let mut bytes = c.bytes.clone();
    bytes[tree_chunk.offset + 1] ^= 0x10;
    replace_file(&container_path(&fx.repo.path, c), &bytes);
    let target = fx.repo.scratch.path().join("target");
    let out = fx.repo.restore("latest", &target, &[]);
    out.expect_code(1).expect_stderr(&[&c.name, "damaged"]);
    assert!(
        !target.exists() || support::list_tree(&target).is_empty(),
        "restore wrote something from a damaged tree"
    );
}

#[test]
fn a_damaged_index_segment_is_reported_and_restore_still_works() {
    let fx = Fixture::new();
    let index = fx.repo.path.join("index");
    let segs: Vec<PathBuf> = fs::read_dir(&index)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(segs.len(), 1, "one backup writes one segment");
    let seg = &segs[0];
    let name = seg.file_stem().unwrap().to_str().unwrap().to_string();
    let original = fs::read(seg).unwrap();
    let len = original.len();
    for (i, pos) in [0, 12, 16, 24, 40, len / 2, len - 33, len - 1]
        .into_iter()
        .enumerate()
    {
        let mut bytes = original.clone();
        bytes[pos] ^= 1 << (i % 8);
        replace_file(seg, &bytes);
        for read_data in [false, true] {
            let out = fx.repo.check(read_data);
            out.expect_code(1)
                .expect_stderr(&[&format!("index segment {name} is damaged")]);
            assert_eq!(
                damage_keys(&out.json()),
                [format!("segment {name}")],
                "flip at byte {pos}\n{out}"
            );
        }
        // The containers are read directly: nothing is lost.
        let target = fx.repo.scratch.path().join(format!("restore-{i}"));
        fx.repo.restore("latest", &target, &[]).expect_ok();
        support::assert_same_tree(&fx.src, &restored(&target, &fx.src));
    }
}

#[test]
fn truncated_containers_are_reported_without_read_data() {
    let fx = Fixture::new();
    let c = fx.data_container();
    let all: BTreeSet<Fp> = c.chunks.iter().map(|e| e.fp).collect();
    let expected = fx.expected_damage(c, &all, true);
    let len = c.bytes.len();
    for keep in [
        len - 1,
        len - 8,
        len - 57,
        c.table_offset,
        len / 2,
        40,
        31,
        0,
    ] {
        replace_file(&container_path(&fx.repo.path, c), &c.bytes[..keep]);
        for read_data in [false, true] {
            let out = fx.repo.check(read_data);
            out.expect_code(1);
            assert_eq!(
                damage_keys(&out.json()),
                expected,
                "truncated to {keep} bytes\n{out}"
            );
        }
    }
}

#[test]
fn a_deleted_container_is_reported_with_the_files_it_held() {
    let fx = Fixture::new();
    let c = fx.data_container();
    fs::remove_file(container_path(&fx.repo.path, c)).unwrap();
    let all: BTreeSet<Fp> = c.chunks.iter().map(|e| e.fp).collect();
    let out = fx.repo.check(false);
    out.expect_code(1);
    assert_eq!(damage_keys(&out.json()), fx.expected_damage(c, &all, true));
    let files = fx.affected_files(&all);
    assert_eq!(files.len(), 5, "{files:?}");

    let out = fx.repo.run(["check"]);
    out.expect_code(1);
    let needles: Vec<String> = files
        .iter()
        .map(|p| format!("snapshot {}: file {p} has", fx.short))
        .chain([format!("container {}", c.name)])
        .collect();
    out.expect_stderr(&needles.iter().map(String::as_str).collect::<Vec<_>>());

    let target = fx.repo.scratch.path().join("target");
    let out = fx.repo.restore("latest", &target, &[]);
    out.expect_code(3);
    for p in &files {
        out.expect_stderr(&[target.join(p).to_str().unwrap()]);
    }
}

#[test]
fn check_json_output_is_one_object_even_with_damage() {
    let fx = Fixture::new();
    fs::remove_file(container_path(&fx.repo.path, fx.data_container())).unwrap();
    let out = fx.repo.check(false);
    out.expect_code(1);
    let parsed: Result<Value, _> = serde_json::from_str(&out.stdout);
    assert!(parsed.is_ok(), "stdout is not one JSON object\n{out}");
}

/// The damage kinds of `check --json`, with `unindexed` containers by id.
fn unindexed(report: &Value) -> Vec<String> {
    report["report"]["damage"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["kind"] == "unindexed")
        .map(|d| d["id"].as_str().unwrap().to_string())
        .collect()
}

fn segment_files(repo: &Path) -> Vec<PathBuf> {
    let mut segs: Vec<PathBuf> = fs::read_dir(repo.join("index"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "idx"))
        .collect();
    segs.sort();
    segs
}

/// Regression: a deleted index segment was reported as "left by an interrupted
/// backup" and `check` said "no errors". Its containers hold the snapshot's chunks, so
/// a segment named them once: that is damage, and `larder repair` writes their index.
#[test]
fn a_deleted_index_segment_is_damage_that_repair_fixes() {
    let fx = Fixture::new();
    let segs = segment_files(&fx.repo.path);
    assert_eq!(segs.len(), 1, "one backup writes one segment");
    fs::remove_file(&segs[0]).unwrap();
    let out = fx.repo.check(false);
    out.expect_code(1);
    let advice = out.json()["advice"].to_string();
    assert!(advice.contains("larder repair"), "{out}");
    let mut ids = unindexed(&out.json());
    ids.sort();
    let all: Vec<String> = fx.containers.iter().map(|c| c.name.clone()).collect();
    assert_eq!(ids, all, "{out}");

    fx.repo
        .run(["check"])
        .expect_code(1)
        .expect_stderr(&["no index segment names", "advice: `larder repair`"]);
    fx.repo.run(["repair"]).expect_ok();
    assert_eq!(segment_files(&fx.repo.path).len(), 1);
    checks_clean(&fx);
}

/// An older segment lost while a newer one names later containers: its containers
/// are damage even when no snapshot uses them any more (a later writer would have
/// named them).
#[test]
fn containers_below_named_ones_without_a_segment_are_damage() {
    let fx = Fixture::new();
    let first = fx.repo.snapshots()[0]["id"].as_str().unwrap().to_string();
    // Another tree: the second backup uses none of the first one's chunks.
    let other = fx.repo.dir("other");
    fs::write(other.join("later"), pseudo_random(20, 200_000)).unwrap();
    fx.repo.backup(&[&other]);
    fx.repo.run(["forget", &first]).expect_ok();
    let segs = segment_files(&fx.repo.path);
    assert_eq!(segs.len(), 2);
    fs::remove_file(&segs[0]).unwrap();
    let out = fx.repo.check(false);
    out.expect_code(1);
    assert!(!unindexed(&out.json()).is_empty(), "{out}");
}

/// What a backup killed between its containers and its segment leaves (containers
/// above every named one, no snapshot using them) is no damage.
#[test]
fn a_killed_backups_containers_are_no_damage() {
    let fx = Fixture::new();
    fs::write(fx.src.join("later"), pseudo_random(21, 200_000)).unwrap();
    let second = fx.repo.backup(&[&fx.src])["snapshot"]
        .as_str()
        .unwrap()
        .to_string();
    let segs = segment_files(&fx.repo.path);
    fs::remove_file(segs.last().unwrap()).unwrap();
    let snap = fx
        .repo
        .path
        .join("snapshots")
        .join(format!("{second}.snap"));
    fs::remove_file(snap).unwrap();
    let out = fx.repo.check(true);
    out.expect_ok()
        .expect_stderr(&["left by an interrupted backup"]);
    assert!(unindexed(&out.json()).is_empty(), "{out}");
}

/// Regression: a tree whose chunk is missing was reported with the advice "run
/// `larder check`", from `check` itself. Every advice names the command that fixes
/// the damage.
#[test]
fn every_advice_names_the_command_that_fixes_it() {
    let fx = Fixture::new();
    let tc = fx.tree_container();
    fs::remove_file(container_path(&fx.repo.path, tc)).unwrap();
    let out = fx.repo.run(["check"]);
    out.expect_code(1)
        .expect_stderr(&["larder repair", &format!("--container {}", tc.name)]);
    assert!(
        !out.stderr.contains("run `larder check`"),
        "check advises itself:\n{out}"
    );
}
