//! The cache's version check against a fake backend whose files carry a write counter
//! as their version tag.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU32;
use std::sync::Arc;

use super::*;

/// Files in memory; each write gives the file a new tag, unique among every fake's
/// (an object store's ETag of other bytes, a file's modification time).
#[derive(Default)]
struct Fake {
    files: Mutex<BTreeMap<(String, String), FakeFile>>,
    reads: AtomicU32,
}

/// A file's bytes and tag, by directory and name.
type FakeFile = (Vec<u8>, u64);

/// The tags of every fake's writes.
static WRITES: AtomicU64 = AtomicU64::new(0);

impl Fake {
    fn key(kind: FileKind, name: &str) -> (String, String) {
        (kind.dir().to_string(), name.to_string())
    }

    fn reads(&self) -> u32 {
        self.reads.load(Ordering::SeqCst)
    }
}

impl Backend for Fake {
    fn read(&self, kind: FileKind, name: &str) -> Result<Vec<u8>> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        lock(&self.files)
            .get(&Self::key(kind, name))
            .map(|(data, _)| data.clone())
            .ok_or_else(|| StoreError::io(name, std::io::ErrorKind::NotFound.into()))
    }

    fn read_ranges(&self, _: FileKind, _: &str, _: &[Range<u64>]) -> Result<Vec<Vec<u8>>> {
        unimplemented!("not cached")
    }

    fn file_len(&self, kind: FileKind, name: &str) -> Result<u64> {
        self.read(kind, name).map(|d| d.len() as u64)
    }

    fn write(&self, kind: FileKind, name: &str, data: &[u8]) -> Result<()> {
        let tag = WRITES.fetch_add(1, Ordering::SeqCst);
        lock(&self.files).insert(Self::key(kind, name), (data.to_vec(), tag));
        Ok(())
    }

    fn write_new(&self, kind: FileKind, name: &str, data: &[u8]) -> Result<bool> {
        if lock(&self.files).contains_key(&Self::key(kind, name)) {
            return Ok(false);
        }
        self.write(kind, name, data).map(|()| true)
    }

    fn sync(&self, _: FileKind) -> Result<()> {
        Ok(())
    }

    fn list(&self, kind: FileKind) -> Result<Vec<String>> {
        Ok(self
            .list_versions(kind)?
            .into_iter()
            .map(|(n, _)| n)
            .collect())
    }

    fn list_versions(&self, kind: FileKind) -> Result<Vec<(String, FileVersion)>> {
        Ok(lock(&self.files)
            .iter()
            .filter(|((dir, _), _)| dir == kind.dir())
            .map(|((_, name), (data, tag))| {
                let version = FileVersion {
                    len: data.len() as u64,
                    tag: tag.to_string(),
                };
                (name.clone(), version)
            })
            .collect())
    }

    fn remove(&self, kind: FileKind, name: &str) -> Result<()> {
        lock(&self.files).remove(&Self::key(kind, name));
        Ok(())
    }

    fn location(&self) -> String {
        "fake".into()
    }
}

const SEG: FileKind = FileKind::IndexSegment;

#[test]
fn an_entry_is_served_while_storage_lists_its_version() {
    let fake = Arc::new(Fake::default());
    fake.write(SEG, "02", b"segment A").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cache = CachedBackend::new(fake.clone(), dir.path()).unwrap();
    assert_eq!(cache.read(SEG, "02").unwrap(), b"segment A");
    // A new process: its first read lists the kind, and the entry is served.
    let cache = CachedBackend::new(fake.clone(), dir.path()).unwrap();
    assert_eq!(cache.read(SEG, "02").unwrap(), b"segment A");
    assert_eq!(fake.reads(), 1, "the second process read the entry");
}

#[test]
fn a_file_written_again_under_its_name_is_read_again() {
    let fake = Arc::new(Fake::default());
    fake.write(SEG, "02", b"segment A").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cache = CachedBackend::new(fake.clone(), dir.path()).unwrap();
    assert_eq!(cache.read(SEG, "02").unwrap(), b"segment A");
    // Storage rolled back and written again: the same name and length, other bytes.
    fake.write(SEG, "02", b"segment B").unwrap();
    let cache = CachedBackend::new(fake.clone(), dir.path()).unwrap();
    assert_eq!(cache.read(SEG, "02").unwrap(), b"segment B");
    assert_eq!(fake.reads(), 2);
}

#[test]
fn two_copies_of_one_repository_share_a_cache_without_mixing() {
    let (a, b) = (Arc::new(Fake::default()), Arc::new(Fake::default()));
    a.write(SEG, "01", b"common").unwrap();
    b.write(SEG, "01", b"common").unwrap();
    // Each copy writes its own segment 02 through the shared cache directory.
    let dir = tempfile::tempdir().unwrap();
    CachedBackend::new(a.clone(), dir.path())
        .unwrap()
        .write(SEG, "02", b"A's data")
        .unwrap();
    let cache_b = CachedBackend::new(b.clone(), dir.path()).unwrap();
    cache_b.write(SEG, "02", b"B's data").unwrap();
    cache_b.list(SEG).unwrap();
    for _ in 0..2 {
        let cache = CachedBackend::new(a.clone(), dir.path()).unwrap();
        assert_eq!(cache.read(SEG, "02").unwrap(), b"A's data");
        let cache = CachedBackend::new(b.clone(), dir.path()).unwrap();
        assert_eq!(cache.read(SEG, "02").unwrap(), b"B's data");
    }
}

#[test]
fn what_a_process_wrote_takes_the_version_its_next_listing_shows() {
    let fake = Arc::new(Fake::default());
    let dir = tempfile::tempdir().unwrap();
    let cache = CachedBackend::new(fake.clone(), dir.path()).unwrap();
    cache.write(SEG, "03", b"written here").unwrap();
    // Read before any listing: listed first, adopted, served.
    assert_eq!(cache.read(SEG, "03").unwrap(), b"written here");
    let cache = CachedBackend::new(fake.clone(), dir.path()).unwrap();
    assert_eq!(cache.read(SEG, "03").unwrap(), b"written here");
    assert_eq!(fake.reads(), 0);

    // Written and never listed by the writer: no version, read again once.
    let cache = CachedBackend::new(fake.clone(), dir.path()).unwrap();
    cache.write(SEG, "04", b"unlisted").unwrap();
    let cache = CachedBackend::new(fake.clone(), dir.path()).unwrap();
    assert_eq!(cache.read(SEG, "04").unwrap(), b"unlisted");
    assert_eq!(cache.read(SEG, "04").unwrap(), b"unlisted");
    assert_eq!(fake.reads(), 1);
}

#[test]
fn an_entry_of_an_older_larder_has_no_version_and_is_read_again() {
    let fake = Arc::new(Fake::default());
    fake.write(SEG, "05", b"on storage").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cache = CachedBackend::new(fake.clone(), dir.path()).unwrap();
    let old = [&b"stale"[..], blake3::hash(b"stale").as_bytes()].concat();
    fs::write(dir.path().join("index/05.idx"), old).unwrap();
    assert_eq!(cache.read(SEG, "05").unwrap(), b"on storage");
    assert_eq!(fake.reads(), 1);
}

#[test]
fn entries_round_trip_and_every_flip_is_damage() {
    let version = FileVersion {
        len: 4,
        tag: "\"etag\"".into(),
    };
    for v in [None, Some(&version)] {
        let bytes = encode(b"data", v);
        let e = decode(bytes.clone()).unwrap();
        assert_eq!((e.data.as_slice(), e.version.as_ref()), (&b"data"[..], v));
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 1;
            assert!(decode(b).is_none(), "flip at {i}");
        }
    }
}

#[test]
fn verifying_reads_storage_and_refreshes_entries_that_differ() {
    let fake = Arc::new(Fake::default());
    for (name, data) in [("01", &b"one"[..]), ("02", b"two"), ("03", b"three")] {
        fake.write(SEG, name, data).unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let cache = CachedBackend::new(fake.clone(), dir.path()).unwrap();
    for name in ["01", "02", "03"] {
        cache.read(SEG, name).unwrap();
    }
    // 01: an intact entry with other bytes (another copy's); 02: damaged bytes.
    let entry = |n: &str| dir.path().join(format!("index/{n}.idx"));
    let listed = cache.listed_version(SEG, "01").unwrap();
    fs::write(entry("01"), encode(b"ONE", listed.as_ref())).unwrap();
    let mut damaged = fs::read(entry("02")).unwrap();
    damaged[0] ^= 1;
    fs::write(entry("02"), damaged).unwrap();

    let check = CachedBackend::verifying(fake.clone(), dir.path()).unwrap();
    check.list(SEG).unwrap();
    let before = fake.reads();
    for name in ["01", "02", "03"] {
        let want = fake.read(SEG, name).unwrap();
        assert_eq!(check.read(SEG, name).unwrap(), want);
    }
    assert_eq!(fake.reads() - before, 6, "every read went to storage");
    assert_eq!(check.refreshed(), ["index/01.idx", "index/02.idx"]);
    // Repaired: a normal process serves the entries again.
    let cache = CachedBackend::new(fake.clone(), dir.path()).unwrap();
    let before = fake.reads();
    assert_eq!(cache.read(SEG, "01").unwrap(), b"one");
    assert_eq!(cache.read(SEG, "02").unwrap(), b"two");
    assert_eq!(fake.reads(), before);
}
