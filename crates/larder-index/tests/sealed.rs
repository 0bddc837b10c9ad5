//! The disk index of an encrypted repository (docs/design/crypto.md, "Disk index
//! pages"): through `SealedIo` it answers exactly as over plain files, its files hold
//! no fingerprint, location or plaintext byte, and a page flipped, moved, swapped or
//! left from an earlier build is a corrupt file named with its page, while a zeroed
//! table page only makes fingerprints look new.

use larder_crypto::{AeadKind, FingerprintKind, RepoKeys};
use larder_hash::{Fingerprint, HashAlgo};
use larder_index::disk::{
    bucket_of, Answer, DiskIndex, DiskIndexConfig, IndexDir, IndexFile, IndexIo, Lookup, MemIo,
    PageBuf, SealedIo, PAGE,
};
use larder_index::{ChunkLocation, IndexError};

const HEADER: usize = 112;
const SEALED: usize = 4144;

fn fp(id: u64) -> Fingerprint {
    HashAlgo::Blake3.fingerprint(&id.to_le_bytes())
}

fn loc(id: u64) -> ChunkLocation {
    ChunkLocation {
        container: id / 64 + 1,
        offset: (id % 64) as u32 * 4096,
        length: 4096 + (id % 7) as u32,
    }
}

fn keys(aead: AeadKind) -> RepoKeys {
    RepoKeys::generate([7; 16], aead, FingerprintKind::KeyedBlake3)
}

/// A budget small enough that inserts spill runs and merge them into the table.
fn config() -> DiskIndexConfig {
    DiskIndexConfig {
        memory_budget: 1 << 20,
        expected_fingerprints: 20_000,
        buffered_chunk_bytes: 64,
        bft: 8,
        ..DiskIndexConfig::default()
    }
}

type Index = DiskIndex<SealedIo<MemIo>, u64>;

/// Submits `ids` as one backup would, inserting every `New` at `loc(id)`; returns how
/// many were new.
fn fill(index: &mut Index, ids: impl Iterator<Item = u64>) -> usize {
    let ids: Vec<u64> = ids.collect();
    for &id in &ids {
        index.submit(fp(id), id).unwrap();
    }
    index.finish().unwrap();
    let mut new = 0;
    while let Some(r) = index.poll() {
        match r.answer {
            Answer::New => {
                index.insert(r.fp, loc(r.token)).unwrap();
                new += 1;
            }
            Answer::Duplicate(at) => assert_eq!(at, loc(r.token % 10_000), "{}", r.token),
        }
    }
    new
}

/// A synced index of ids `0 .. 10_000` (a few hundred flushes and merges), closed.
fn filled(keys: &RepoKeys, lookup: Lookup) -> SealedIo<MemIo> {
    let mut index = DiskIndex::create(SealedIo::new(MemIo::new(), keys), config(), lookup).unwrap();
    assert_eq!(fill(&mut index, 0..10_000), 10_000);
    index.close().unwrap()
}

fn open(io: SealedIo<MemIo>) -> Result<Index, IndexError> {
    DiskIndex::open(io, config(), Lookup::Eager)
}

fn file(io: &mut SealedIo<MemIo>, f: IndexFile) -> &mut Vec<u8> {
    io.inner_mut().file_mut(f).unwrap()
}

/// The primary page of `fp(id)`'s bucket.
fn page_of(index: &Index, id: u64) -> usize {
    1 + bucket_of(&fp(id), index.buckets().0) as usize
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[track_caller]
fn assert_corrupt(e: IndexError, file: &str, page: usize) {
    match &e {
        IndexError::Corrupt {
            file: f,
            offset,
            reason,
        } => {
            assert_eq!(*f, file, "{e}");
            assert_eq!(*offset, (HEADER + SEALED * page) as u64, "{e}");
            assert!(
                reason.contains(&format!("sealed page {page} does not open")),
                "{e}"
            );
        }
        _ => panic!("not a corrupt file: {e}"),
    }
}

#[test]
fn the_sealed_files_keep_the_index_contract() {
    let mut io = SealedIo::new(MemIo::new(), &keys(AeadKind::Aes256Gcm));
    io.create(IndexFile::Table).unwrap();
    io.create(IndexFile::Meta).unwrap();
    assert_eq!(io.len(IndexFile::Meta).unwrap(), Some(0));
    assert_eq!(io.len(IndexFile::Bloom).unwrap(), None);
    let mut pages = PageBuf::zeroed(2 * PAGE);
    pages[5] = 7;
    pages[PAGE + 9] = 3;
    io.write_at(IndexFile::Meta, PAGE as u64, &pages).unwrap();
    assert_eq!(io.len(IndexFile::Meta).unwrap(), Some(3 * PAGE as u64));
    let mut back = PageBuf::zeroed(2 * PAGE);
    io.read_at(IndexFile::Meta, PAGE as u64, &mut back).unwrap();
    assert_eq!(&back[..], &pages[..]);
    let err = io
        .read_at(IndexFile::Meta, 3 * PAGE as u64, &mut back)
        .unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof);
    // The layout: the build's header, then pages of 4144 bytes; every file starts
    // with the same header.
    let meta = file(&mut io, IndexFile::Meta).clone();
    assert_eq!(meta.len(), HEADER + 3 * SEALED);
    assert_eq!(meta[..HEADER], file(&mut io, IndexFile::Table)[..HEADER]);
    // A page never written of `meta` (a hole) is damage, not a zero page.
    let err = io
        .read_at(IndexFile::Meta, 0, &mut back[..PAGE])
        .unwrap_err();
    assert!(
        err.to_string().contains("sealed page 0 does not open"),
        "{err}"
    );
    // Not whole pages.
    assert!(io.read_at(IndexFile::Meta, 1, &mut back[..PAGE]).is_err());
}

#[test]
fn a_sealed_index_answers_like_a_plain_one_and_reopens() {
    for (aead, lookup) in [
        (AeadKind::Aes256Gcm, Lookup::Eager),
        (AeadKind::XChaCha20Poly1305, Lookup::Lazy),
    ] {
        let k = keys(aead);
        let mut io = filled(&k, lookup);
        // A write-only key reads and extends it: the second generation repeats half
        // of the first and adds as many new ones.
        let io = SealedIo::new(io.inner_mut().clone(), &k.write_only());
        let mut index = DiskIndex::open(io, config(), lookup).unwrap();
        assert_eq!(index.len(), 10_000);
        assert_eq!(fill(&mut index, 5_000..15_000), 5_000);
        let io = index.close().unwrap();
        let mut index = open(io).unwrap();
        for id in (0..15_000).step_by(7) {
            assert_eq!(index.get(&fp(id)).unwrap(), Some(loc(id)), "{id}");
        }
        assert_eq!(index.get(&fp(20_000)).unwrap(), None);
    }
}

#[test]
fn no_sealed_file_holds_a_fingerprint_or_a_location() {
    let mut io = filled(&keys(AeadKind::Aes256Gcm), Lookup::Lazy);
    for f in [
        IndexFile::Table,
        IndexFile::Meta,
        IndexFile::Bloom,
        IndexFile::Runs,
    ] {
        let Some(bytes) = io.inner_mut().file_mut(f).cloned() else {
            continue;
        };
        for id in (0..10_000).step_by(97) {
            assert!(
                !contains(&bytes, &fp(id).as_bytes()[..8]),
                "{f:?} holds fp {id}"
            );
            let l = loc(id);
            let mut pattern = l.container.to_le_bytes().to_vec();
            pattern.extend_from_slice(&l.offset.to_le_bytes());
            pattern.extend_from_slice(&l.length.to_le_bytes());
            assert!(!contains(&bytes, &pattern), "{f:?} holds location {id}");
        }
        for magic in [&b"LDXTABLE"[..], b"LDXMETA1", b"LDXBLOOM"] {
            assert!(!contains(&bytes, magic), "{f:?} holds a magic");
        }
    }
}

/// `io`'s index opened, the primary page of `fp(0)`'s bucket, and `io` back.
fn page_of_zero(io: SealedIo<MemIo>) -> (usize, SealedIo<MemIo>) {
    let index = open(io).unwrap();
    let page = page_of(&index, 0);
    (page, index.into_io_unsynced())
}

fn page_range(page: usize) -> std::ops::Range<usize> {
    HEADER + SEALED * page..HEADER + SEALED * (page + 1)
}

/// A copy of `io`'s files with `damage` done to them, sealed with `k` again.
fn damaged(
    io: &mut SealedIo<MemIo>,
    k: &RepoKeys,
    damage: impl FnOnce(&mut MemIo),
) -> SealedIo<MemIo> {
    let mut copy = io.inner_mut().clone();
    damage(&mut copy);
    SealedIo::new(copy, k)
}

fn bytes(m: &mut MemIo, f: IndexFile) -> &mut Vec<u8> {
    m.file_mut(f).unwrap()
}

#[test]
fn a_flipped_bit_is_a_corrupt_file_naming_its_page() {
    let k = keys(AeadKind::Aes256Gcm);
    let (page, mut io) = page_of_zero(filled(&k, Lookup::Eager));
    // A table page: the index opens (its header is fine); the lookup that reads the
    // page fails, naming it; other buckets still answer.
    let at = page_range(page).start + 100;
    let table = damaged(&mut io, &k, |m| bytes(m, IndexFile::Table)[at] ^= 4);
    let mut index = open(table).unwrap();
    assert_corrupt(index.get(&fp(0)).unwrap_err(), "table", page);
    let other = (1..).find(|&id| page_of(&index, id) != page).unwrap();
    assert_eq!(index.get(&fp(other)).unwrap(), Some(loc(other)));
    // A meta page: the open, which reads meta's header page, fails naming it.
    let at = page_range(0).start + 4000;
    let meta = damaged(&mut io, &k, |m| bytes(m, IndexFile::Meta)[at] ^= 1);
    assert_corrupt(open(meta).err().unwrap(), "meta", 0);
    // The table's own header: no build, so a corrupt table at byte 0.
    let header = damaged(&mut io, &k, |m| bytes(m, IndexFile::Table)[20] ^= 1);
    match open(header).err().unwrap() {
        IndexError::Corrupt {
            file,
            offset,
            reason,
        } => {
            assert_eq!((file, offset), ("table", 0));
            assert!(reason.contains("sealed header does not open"), "{reason}");
        }
        e => panic!("{e}"),
    }
}

#[test]
fn swapped_pages_and_pages_of_an_earlier_build_do_not_open() {
    let k = keys(AeadKind::Aes256Gcm);
    let (page, mut io) = page_of_zero(filled(&k, Lookup::Eager));
    let old = io.inner_mut().clone();
    // Two table pages swapped.
    let swapped = damaged(&mut io, &k, |m| {
        let t = bytes(m, IndexFile::Table);
        let other = if page > 1 { page - 1 } else { page + 1 };
        let a = t[page_range(page)].to_vec();
        let b = t[page_range(other)].to_vec();
        t[page_range(page)].copy_from_slice(&b);
        t[page_range(other)].copy_from_slice(&a);
    });
    assert_corrupt(
        open(swapped).unwrap().get(&fp(0)).unwrap_err(),
        "table",
        page,
    );
    // A rebuild in the same files: a new build, the same ids, the same layout.
    let mut index = DiskIndex::create(io, config(), Lookup::Eager).unwrap();
    assert_eq!(fill(&mut index, 0..10_000), 10_000);
    let mut io = index.close().unwrap();
    assert_eq!(page_of_zero(damaged(&mut io, &k, |_| {})).0, page);
    // The earlier build's version of a page, put back where it was, does not open.
    let mut old_io = old.clone();
    let earlier = bytes(&mut old_io, IndexFile::Table)[page_range(page)].to_vec();
    let back = damaged(&mut io, &k, |m| {
        bytes(m, IndexFile::Table)[page_range(page)].copy_from_slice(&earlier)
    });
    assert_corrupt(open(back).unwrap().get(&fp(0)).unwrap_err(), "table", page);
    // The whole earlier table beside the new meta: meta is another build's.
    let mut old_io = old.clone();
    let earlier = bytes(&mut old_io, IndexFile::Table).clone();
    let mixed = damaged(&mut io, &k, |m| *bytes(m, IndexFile::Table) = earlier);
    let e = open(mixed).err().unwrap();
    assert!(
        e.to_string().contains("meta at byte 0")
            && e.to_string().contains("another build of the index"),
        "{e}"
    );
}

#[test]
fn a_zeroed_table_page_makes_fingerprints_new_and_other_zero_pages_are_damage() {
    let k = keys(AeadKind::Aes256Gcm);
    let (page, mut io) = page_of_zero(filled(&k, Lookup::Eager));
    let zeroed = damaged(&mut io, &k, |m| {
        bytes(m, IndexFile::Table)[page_range(page)].fill(0)
    });
    let mut index = open(zeroed).unwrap();
    assert_eq!(index.get(&fp(0)).unwrap(), None);
    // The same backup again: of the bucket's fingerprints, those the cache does not
    // find through their neighbours' records in `meta` are new and stored again;
    // every other answer is still exact (`fill` checks each location).
    let lost: Vec<u64> = (0..10_000)
        .filter(|&id| page_of(&index, id) == page)
        .collect();
    assert!(lost.contains(&0));
    let again = fill(&mut index, 0..10_000);
    assert!(
        (1..=lost.len()).contains(&again),
        "{again} new, {} lost",
        lost.len()
    );
    for f in [IndexFile::Meta, IndexFile::Bloom] {
        let zeroed = damaged(&mut io, &k, |m| bytes(m, f)[page_range(0)].fill(0));
        match f {
            // meta's header page is read by the open.
            IndexFile::Meta => assert_corrupt(open(zeroed).err().unwrap(), "meta", 0),
            // A Bloom file that does not open is rebuilt from meta.
            _ => assert_eq!(open(zeroed).unwrap().get(&fp(5)).unwrap(), Some(loc(5))),
        }
    }
}

#[test]
fn a_bloom_file_of_another_build_is_rebuilt_and_written_over() {
    let k = keys(AeadKind::Aes256Gcm);
    let mut io = filled(&k, Lookup::Lazy);
    let mut other = filled(&k, Lookup::Lazy);
    let bloom = file(&mut other, IndexFile::Bloom).clone();
    let stale = damaged(&mut io, &k, |m| *bytes(m, IndexFile::Bloom) = bloom);
    let mut index = DiskIndex::open(stale, config(), Lookup::Lazy).unwrap();
    assert_eq!(fill(&mut index, 10_000..10_100), 100);
    let mut io = index.close().unwrap();
    let table_header = file(&mut io, IndexFile::Table)[..HEADER].to_vec();
    assert_eq!(file(&mut io, IndexFile::Bloom)[..HEADER], table_header[..]);
    let mut index = open(io).unwrap();
    assert_eq!(index.get(&fp(10_050)).unwrap(), Some(loc(10_050)));
}

#[test]
fn a_repository_index_dir_is_plain_without_keys() {
    let dir = std::env::temp_dir().join(format!("larder-sealed-dir-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let k = keys(AeadKind::Aes256Gcm);
    for keys in [None, Some(&k)] {
        let io = IndexDir::open(&dir, keys).unwrap();
        let mut index: DiskIndex<IndexDir, u64> =
            DiskIndex::create(io, config(), Lookup::Eager).unwrap();
        for id in 0..100 {
            index.submit(fp(id), id).unwrap();
        }
        index.finish().unwrap();
        while let Some(r) = index.poll() {
            index.insert(r.fp, loc(r.token)).unwrap();
        }
        index.close().unwrap();
        let table = std::fs::read(dir.join("table")).unwrap();
        assert_eq!(table.starts_with(b"LDXTABLE"), keys.is_none());
        let io = IndexDir::open(&dir, keys).unwrap();
        let mut index: DiskIndex<IndexDir, u64> =
            DiskIndex::open(io, config(), Lookup::Eager).unwrap();
        assert_eq!(index.get(&fp(42)).unwrap(), Some(loc(42)));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
