//! Every decoder of the disk index's files (docs/design/disk-index.md) must refuse bad
//! bytes with an error, never panic: each page decoder (run pages included) on the
//! input as one page, then a whole index opened from the input cut into its three
//! files and asked for a few fingerprints (which reads bucket and metadata pages through the same decoders).
#![no_main]
use larder_hash::Fingerprint;
use larder_index::disk::{
    decode_meta_header, decode_record_page, BloomHeader, BucketPage, DiskIndex,
    DiskIndexConfig, IndexFile, IndexIo, Lookup, MemIo, RunList, TableHeader, PAGE,
};
use libfuzzer_sys::fuzz_target;

fn pages(data: &[u8], count: usize) -> Vec<u8> {
    let mut out = data.to_vec();
    out.resize(count * PAGE, 0);
    out
}

fuzz_target!(|data: &[u8]| {
    let page = pages(data, 1);
    let _ = decode_meta_header(&page);
    let _ = decode_record_page(&page, &mut Vec::new());
    if let Ok(header) = TableHeader::decode(&page) {
        for bucket in [0, header.buckets.saturating_sub(1)] {
            let _ = BucketPage::decode(&page, 1, bucket, &header);
        }
    }
    if let Ok(header) = BloomHeader::decode(&page) {
        let _ = header.check_bits(&page, &[0; 512]);
    }
    let small = TableHeader { buckets: 3, pages: 9, entries: 40, dirty: false, runs: RunList::default() };
    let _ = BucketPage::decode(&page, 4, 1, &small);
    for buckets in [1, 3, 1 << 20] {
        let _ = BucketPage::decode_run(&page, buckets, 40);
    }

    // A whole index: the first byte is the table's length in pages, the rest after it
    // the metadata array (each padded to whole pages, so that short inputs still reach
    // the page decoders).
    let Some((&table_pages, rest)) = data.split_first() else { return };
    let cut = (usize::from(table_pages) * PAGE).min(rest.len());
    let (table, meta) = rest.split_at(cut);
    let mut io = MemIo::new();
    for (file, bytes) in [(IndexFile::Table, table), (IndexFile::Meta, meta)] {
        io.create(file).expect("memory");
        let n = bytes.len().div_ceil(PAGE).max(1);
        io.write_at(file, 0, &pages(bytes, n)).expect("memory");
    }
    let config = DiskIndexConfig {
        memory_budget: 64 << 10,
        bft: 2,
        ..DiskIndexConfig::default()
    };
    for lookup in [Lookup::Eager, Lookup::Lazy] {
        let mut io_copy = MemIo::new();
        for file in [IndexFile::Table, IndexFile::Meta] {
            io_copy.create(file).expect("memory");
            let mut bytes = vec![0; io.len(file).expect("memory").unwrap_or(0) as usize];
            io.read_at(file, 0, &mut bytes).expect("memory");
            io_copy.write_at(file, 0, &bytes).expect("memory");
        }
        let Ok(mut index) = DiskIndex::<_, u32>::open(io_copy, config.clone(), lookup) else {
            continue;
        };
        for i in 0..8u32 {
            let mut fp = [0u8; 32];
            fp[..4].copy_from_slice(&i.wrapping_mul(0x9e37_79b9).to_le_bytes());
            fp[7] = (i * 37) as u8;
            let _ = index.submit(Fingerprint(fp), i);
        }
        let _ = index.finish();
        while index.poll().is_some() {}
    }
});
