//! The kernel source itself, compiled as plain C++ by the host compiler and run one
//! thread at a time (`blockDim.x = 1`, a loop over `blockIdx.x`), against the CPU
//! chunker and hashes: the arithmetic of every kernel is checked here without a GPU.
//! What this cannot check (memory model, launch shapes, transfers) is left to the
//! device tests (`tests/device.rs`). Needs `c++` on PATH; without it the test says so
//! and passes, unless LARDER_REQUIRE_CXX=1.

#[path = "support/noise.rs"]
mod noise;

use std::path::{Path, PathBuf};
use std::process::Command;

use larder_chunk::{CandidateChunker, WINDOW};
use larder_gpu::stretch::{decode, ScanLayout, ScanOutput};
use larder_hash::HashAlgo;
use noise::noise;

const HARNESS: &str = r#"
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
struct Dim3 { unsigned x, y, z; };
static Dim3 threadIdx = {0, 0, 0}, blockIdx = {0, 0, 0}, blockDim = {1, 1, 1};
#define __global__
#define __device__
#define __constant__
#define __forceinline__ inline
#define __shared__ static
#define __syncthreads()
#include "kernels.cu"

static std::vector<unsigned char> slurp(const char* path) {
    FILE* f = fopen(path, "rb");
    if (!f) { perror(path); exit(2); }
    std::vector<unsigned char> v;
    unsigned char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) v.insert(v.end(), buf, buf + n);
    fclose(f);
    return v;
}
static void spit(const char* path, const void* p, size_t n) {
    FILE* f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n) { perror(path); exit(2); }
    fclose(f);
}
int main(int argc, char** argv) {
    if (argc == 10 && !strcmp(argv[1], "scan")) {
        std::vector<unsigned char> data = slurp(argv[2]);
        u64 from = strtoull(argv[3], 0, 10), end = strtoull(argv[4], 0, 10);
        u32 stretch = strtoul(argv[5], 0, 10);
        u64 ms = strtoull(argv[6], 0, 10), ml = strtoull(argv[7], 0, 10);
        u32 slots = strtoul(argv[8], 0, 10);
        u32 threads = (u32)((end - from + stretch - 1) / stretch);
        std::vector<u32> out(threads + (size_t)threads * slots, 0);
        for (blockIdx.x = 0; blockIdx.x < threads; ++blockIdx.x)
            fastcdc_scan(data.data(), from, end, stretch, ms, ml, slots, threads, out.data(),
                         out.data() + threads);
        spit(argv[9], out.data(), out.size() * 4);
        return 0;
    }
    if (argc == 6 && !strcmp(argv[1], "hash")) {
        std::vector<unsigned char> data = slurp(argv[3]);
        std::vector<unsigned char> raw = slurp(argv[4]);
        std::vector<u64> offsets(raw.size() / 8);
        memcpy(offsets.data(), raw.data(), raw.size());
        u32 n = (u32)offsets.size() - 1;
        std::vector<unsigned char> out(32 * (size_t)n + 1, 0);
        for (blockIdx.x = 0; blockIdx.x < n; ++blockIdx.x) {
            if (!strcmp(argv[2], "blake3")) blake3_batch(data.data(), offsets.data(), n, out.data());
            else if (!strcmp(argv[2], "sha256")) sha256_batch(data.data(), offsets.data(), n, out.data());
            else sha1_batch(data.data(), offsets.data(), n, out.data());
        }
        spit(argv[5], out.data(), 32 * (size_t)n);
        return 0;
    }
    fprintf(stderr, "usage: harness scan|hash ...\n");
    return 2;
}
"#;

/// The kernels built as a host program, or `None` (with the reason printed).
fn build_harness(dir: &Path) -> Option<PathBuf> {
    std::fs::write(dir.join("kernels.cu"), larder_gpu::kernels::source()).unwrap();
    std::fs::write(dir.join("harness.cpp"), HARNESS).unwrap();
    let exe = dir.join("harness");
    let status = Command::new("c++")
        .args(["-O2", "-std=c++14", "-w", "-o"])
        .arg(&exe)
        .arg(dir.join("harness.cpp"))
        .status();
    match status {
        Ok(s) if s.success() => Some(exe),
        Ok(s) => panic!("the kernel source does not compile as C++ ({s})"),
        Err(e) => {
            let required = std::env::var("LARDER_REQUIRE_CXX").is_ok_and(|v| v == "1");
            assert!(!required, "LARDER_REQUIRE_CXX=1 but c++ cannot run: {e}");
            eprintln!("SKIPPED: no host C++ compiler (c++: {e}); the kernels were not run");
            None
        }
    }
}

fn words(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|w| u32::from_le_bytes(w.try_into().unwrap()))
        .collect()
}

#[test]
fn kernel_source_on_host_equals_cpu_path() {
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = build_harness(dir.path()) else {
        return;
    };
    let run = |args: &[String]| {
        let status = Command::new(&exe).args(args).status().unwrap();
        assert!(status.success(), "harness {args:?}: {status}");
    };
    let path = |name: &str| dir.path().join(name).to_str().unwrap().to_string();

    // The scan, with stretches that overflow and ones that do not.
    let mut data = noise(300_000, 5);
    data[100_000..140_000].fill(0);
    std::fs::write(path("data"), &data).unwrap();
    for (avg, level, stretch, slots) in [(8192, 2, 4096, 16), (256, 1, 1000, 2), (1024, 3, 97, 1)] {
        let chunker = CandidateChunker::new(avg / 4, avg, avg * 8, level);
        let (ms, ml) = chunker.masks();
        let layout = ScanLayout::new(WINDOW - 1, data.len(), stretch, slots).unwrap();
        run(&[
            "scan".into(),
            path("data"),
            layout.from.to_string(),
            layout.end.to_string(),
            stretch.to_string(),
            ms.to_string(),
            ml.to_string(),
            slots.to_string(),
            path("scan.out"),
        ]);
        let raw = words(&std::fs::read(path("scan.out")).unwrap());
        let threads = layout.threads();
        let output = ScanOutput {
            counts: raw[..threads].to_vec(),
            found: raw[threads..].to_vec(),
        };
        let mut got = Vec::new();
        decode(&data, &layout, &chunker, &output, &mut got);
        let mut expected = Vec::new();
        chunker.scan(&data, layout.from..layout.end, &mut expected);
        assert_eq!(got, expected, "scan at avg {avg} level {level}");
    }

    // The hashes, over BLAKE3's and SHA's boundary lengths and real chunk sizes:
    // every length 0..=2100 once, then tree shapes up to 9 BLAKE3 chunks.
    let mut lengths: Vec<usize> = (0..=2100).collect();
    lengths.extend([
        3072,
        4095,
        4096,
        4097,
        8191,
        8192,
        8193,
        9 * 1024 + 1,
        65_536,
    ]);
    let mut offsets = vec![0u64];
    for len in &lengths {
        offsets.push(offsets.last().unwrap() + *len as u64);
    }
    let total = *offsets.last().unwrap() as usize;
    let hashed = noise(total, 9);
    std::fs::write(path("hashed"), &hashed).unwrap();
    let raw: Vec<u8> = offsets.iter().flat_map(|o| o.to_le_bytes()).collect();
    std::fs::write(path("offsets"), raw).unwrap();
    for algo in HashAlgo::ALL {
        run(&[
            "hash".into(),
            algo.name().into(),
            path("hashed"),
            path("offsets"),
            path("fp.out"),
        ]);
        let out = std::fs::read(path("fp.out")).unwrap();
        for (i, w) in offsets.windows(2).enumerate() {
            let chunk = &hashed[w[0] as usize..w[1] as usize];
            assert_eq!(
                &out[32 * i..32 * i + 32],
                algo.fingerprint(chunk).as_bytes(),
                "{} of {} bytes",
                algo.name(),
                chunk.len()
            );
        }
    }
}
