//! The device kernels, as CUDA C++ source compiled at run time by NVRTC.
//!
//! The source uses no CUDA header and no builtin beyond `threadIdx`, `blockIdx`,
//! `blockDim`, `__shared__` and `__syncthreads`, so that the very same text also compiles
//! as plain C++ on the host (`tests/kernels_on_host.rs` runs it there, one thread at a
//! time, against the CPU chunker and hashes). The Gear table is generated from
//! [`larder_chunk::GEAR`] and the BLAKE3 message schedule from its permutation, so
//! that no constant is written out twice.
//!
//! Kernels (names as loaded from the module):
//! - [`SCAN_KERNEL`]: FastCDC 2020's candidate scan ([`larder_chunk::CandidateChunker::scan`])
//!   over `stretch`-byte stretches, one per thread, each warmed up on the 47 bytes
//!   before it; every thread writes its candidates into `slots` fixed slots and its
//!   true count (see [`crate::stretch`] for the layout and the overflow rule).
//! - [`BLAKE3_KERNEL`], [`SHA256_KERNEL`], [`SHA1_KERNEL`]: one chunk per thread; chunk
//!   `i` is `data[offsets[i]..offsets[i + 1]]`, its fingerprint goes to
//!   `out[32 * i..32 * i + 32]` in [`larder_hash::Fingerprint`]'s layout (SHA-1 padded
//!   with zeros).

use std::fmt::Write as _;

pub const SCAN_KERNEL: &str = "fastcdc_scan";
pub const BLAKE3_KERNEL: &str = "blake3_batch";
pub const SHA256_KERNEL: &str = "sha256_batch";
pub const SHA1_KERNEL: &str = "sha1_batch";

/// Every kernel the module defines, in the order above.
pub const ALL_KERNELS: [&str; 4] = [SCAN_KERNEL, BLAKE3_KERNEL, SHA256_KERNEL, SHA1_KERNEL];

/// BLAKE3's message permutation (the BLAKE3 paper, section 2.2).
const BLAKE3_PERMUTATION: [usize; 16] = [2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8];

/// The whole translation unit: the generated tables, then the kernels.
pub fn source() -> String {
    let mut src = String::with_capacity(24 * 1024);
    src.push_str(PRELUDE);
    src.push_str("__constant__ u64 GEAR[256] = {");
    for (i, g) in larder_chunk::GEAR.iter().enumerate() {
        if i % 4 == 0 {
            src.push_str("\n   ");
        }
        let _ = write!(src, " 0x{g:016x}ull,");
    }
    src.push_str("\n};\n");
    src.push_str("__constant__ unsigned char B3_SCHEDULE[7][16] = {\n");
    let mut round: [usize; 16] = std::array::from_fn(|i| i);
    for _ in 0..7 {
        src.push_str("    {");
        for w in round {
            let _ = write!(src, "{w},");
        }
        src.push_str("},\n");
        round = std::array::from_fn(|i| round[BLAKE3_PERMUTATION[i]]);
    }
    src.push_str("};\n");
    src.push_str(SCAN);
    src.push_str(BLAKE3);
    src.push_str(SHA_PADDING);
    src.push_str(SHA256);
    src.push_str(SHA1);
    src
}

const PRELUDE: &str = r#"
typedef unsigned char u8;
typedef unsigned int u32;
typedef unsigned long long u64;

__device__ __forceinline__ u32 rotr32(u32 x, u32 n) { return (x >> n) | (x << (32 - n)); }
__device__ __forceinline__ u32 rotl32(u32 x, u32 n) { return (x << n) | (x >> (32 - n)); }
"#;

/// Invariants the host guarantees (crate::stretch): `from >= 47`, so every warm-up
/// reads inside `data`; `end < 2^30`, so a buffer index fits the 30 bits of an
/// encoded candidate; `n_threads == ceil((end - from) / stretch)`.
const SCAN: &str = r#"
// Candidate scan: thread t judges buffer indices [from + t*stretch, min(.. + stretch, end)).
// Output: counts[t] = candidates found (may exceed `slots`: the host then rescans the
// stretch); found[t*slots + j] = index << 2 | strict << 1 | loose for j < min(count, slots).
extern "C" __global__ void fastcdc_scan(const u8* data, u64 from, u64 end, u32 stretch,
                                        u64 mask_s, u64 mask_l, u32 slots, u32 n_threads,
                                        u32* counts, u32* found) {
    __shared__ u64 gear[256];
    for (u32 k = threadIdx.x; k < 256; k += blockDim.x) gear[k] = GEAR[k];
    __syncthreads();
    u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n_threads) return;
    u64 lo = from + t * stretch;
    u64 hi = end - lo < stretch ? end : lo + stretch;
    u64 hash = 0;
    for (u64 i = lo - 47; i < lo; ++i) hash = (hash << 1) + gear[data[i]];
    u32 count = 0;
    u32* out = found + t * slots;
    for (u64 i = lo; i < hi; ++i) {
        hash = (hash << 1) + gear[data[i]];
        u32 strict = (hash & mask_s) == 0;
        u32 loose = (hash & mask_l) == 0;
        if (strict | loose) {
            if (count < slots) out[count] = ((u32)i << 2) | (strict << 1) | loose;
            ++count;
        }
    }
    counts[t] = count;
}
"#;

const BLAKE3: &str = r#"
__constant__ u32 B3_IV[8] = {0x6A09E667u, 0xBB67AE85u, 0x3C6EF372u, 0xA54FF53Au,
                             0x510E527Fu, 0x9B05688Cu, 0x1F83D9ABu, 0x5BE0CD19u};
#define B3_CHUNK_START 1u
#define B3_CHUNK_END 2u
#define B3_PARENT 4u
#define B3_ROOT 8u

__device__ __forceinline__ void b3_g(u32* s, int a, int b, int c, int d, u32 x, u32 y) {
    s[a] = s[a] + s[b] + x; s[d] = rotr32(s[d] ^ s[a], 16);
    s[c] = s[c] + s[d];     s[b] = rotr32(s[b] ^ s[c], 12);
    s[a] = s[a] + s[b] + y; s[d] = rotr32(s[d] ^ s[a], 8);
    s[c] = s[c] + s[d];     s[b] = rotr32(s[b] ^ s[c], 7);
}

// The first 8 words of BLAKE3's compression function: a chaining value, or the
// first 32 bytes of the root output.
__device__ void b3_compress(const u32* cv, const u32* m, u64 counter, u32 len, u32 flags,
                            u32* out) {
    u32 s[16];
    for (int i = 0; i < 8; ++i) s[i] = cv[i];
    for (int i = 0; i < 4; ++i) s[8 + i] = B3_IV[i];
    s[12] = (u32)counter; s[13] = (u32)(counter >> 32); s[14] = len; s[15] = flags;
    for (int r = 0; r < 7; ++r) {
        const unsigned char* w = B3_SCHEDULE[r];
        b3_g(s, 0, 4, 8, 12, m[w[0]], m[w[1]]);
        b3_g(s, 1, 5, 9, 13, m[w[2]], m[w[3]]);
        b3_g(s, 2, 6, 10, 14, m[w[4]], m[w[5]]);
        b3_g(s, 3, 7, 11, 15, m[w[6]], m[w[7]]);
        b3_g(s, 0, 5, 10, 15, m[w[8]], m[w[9]]);
        b3_g(s, 1, 6, 11, 12, m[w[10]], m[w[11]]);
        b3_g(s, 2, 7, 8, 13, m[w[12]], m[w[13]]);
        b3_g(s, 3, 4, 9, 14, m[w[14]], m[w[15]]);
    }
    for (int i = 0; i < 8; ++i) out[i] = s[i] ^ s[8 + i];
}

// The chaining value of BLAKE3 chunk `index` (`len` <= 1024 bytes at `p`), with
// `root` set when it is the only chunk of the input (then it is the hash itself).
__device__ void b3_chunk(const u8* p, u32 len, u64 index, bool root, u32* cv) {
    for (int i = 0; i < 8; ++i) cv[i] = B3_IV[i];
    u32 blocks = len == 0 ? 1 : (len + 63) / 64;
    for (u32 b = 0; b < blocks; ++b) {
        u32 m[16];
        u32 block_len = b + 1 < blocks ? 64 : len - 64 * b;
        for (int w = 0; w < 16; ++w) {
            u32 word = 0;
            for (int k = 0; k < 4; ++k) {
                u32 at = 4 * w + k;
                u32 byte = at < block_len ? p[64 * b + at] : 0;
                word |= byte << (8 * k);
            }
            m[w] = word;
        }
        u32 flags = (b == 0 ? B3_CHUNK_START : 0) | (b + 1 == blocks ? B3_CHUNK_END : 0);
        if (root && b + 1 == blocks) flags |= B3_ROOT;
        b3_compress(cv, m, index, block_len, flags, cv);
    }
}

__device__ void b3_parent(const u32* left, const u32* right, u32 flags, u32* out) {
    u32 m[16];
    for (int i = 0; i < 8; ++i) { m[i] = left[i]; m[8 + i] = right[i]; }
    b3_compress(B3_IV, m, 0, 64, B3_PARENT | flags, out);
}

// BLAKE3 of one whole input, one thread: chunks left to right, the chaining values of
// complete subtrees on a stack (one entry per set bit of the chunk count, at most 54),
// merged eagerly except for the last chunk, which is folded in root-last.
__device__ void b3_hash(const u8* p, u64 len, u8* out) {
    u32 stack[54][8];
    int depth = 0;
    u64 chunks = len == 0 ? 1 : (len + 1023) / 1024;
    u32 cv[8];
    for (u64 c = 0; c + 1 < chunks; ++c) {
        b3_chunk(p + 1024 * c, 1024, c, false, cv);
        for (u64 total = c + 1; (total & 1) == 0; total >>= 1) {
            --depth;
            b3_parent(stack[depth], cv, 0, cv);
        }
        for (int i = 0; i < 8; ++i) stack[depth][i] = cv[i];
        ++depth;
    }
    u64 last = chunks - 1;
    b3_chunk(p + 1024 * last, (u32)(len - 1024 * last), last, chunks == 1, cv);
    while (depth > 0) {
        --depth;
        b3_parent(stack[depth], cv, depth == 0 ? B3_ROOT : 0, cv);
    }
    for (int i = 0; i < 8; ++i)
        for (int k = 0; k < 4; ++k) out[4 * i + k] = (u8)(cv[i] >> (8 * k));
}

extern "C" __global__ void blake3_batch(const u8* data, const u64* offsets, u32 n, u8* out) {
    u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n) return;
    b3_hash(data + offsets[t], offsets[t + 1] - offsets[t], out + 32 * t);
}
"#;

/// MD-style padding shared by SHA-256 and SHA-1: the message, 0x80, zeros, and the
/// bit length as a big-endian u64 in the last 8 bytes of the last 64-byte block.
const SHA_PADDING: &str = r#"
__device__ __forceinline__ u64 sha_blocks(u64 len) { return (len + 9 + 63) / 64; }

__device__ __forceinline__ u32 sha_word(const u8* p, u64 len, u64 at) {
    u64 total = 64 * sha_blocks(len);
    u32 word = 0;
    for (int k = 0; k < 4; ++k) {
        u64 i = at + k;
        u32 byte;
        if (i < len) byte = p[i];
        else if (i == len) byte = 0x80;
        else if (i >= total - 8) byte = (u32)(((len * 8) >> (8 * (total - 1 - i))) & 0xff);
        else byte = 0;
        word = (word << 8) | byte;
    }
    return word;
}

__device__ __forceinline__ void sha_store(const u32* h, int words, u8* out) {
    for (int i = 0; i < 32; ++i) out[i] = 0;
    for (int i = 0; i < words; ++i)
        for (int k = 0; k < 4; ++k) out[4 * i + k] = (u8)(h[i] >> (24 - 8 * k));
}
"#;

const SHA256: &str = r#"
__constant__ u32 SHA256_K[64] = {
    0x428a2f98u, 0x71374491u, 0xb5c0fbcfu, 0xe9b5dba5u, 0x3956c25bu, 0x59f111f1u, 0x923f82a4u, 0xab1c5ed5u,
    0xd807aa98u, 0x12835b01u, 0x243185beu, 0x550c7dc3u, 0x72be5d74u, 0x80deb1feu, 0x9bdc06a7u, 0xc19bf174u,
    0xe49b69c1u, 0xefbe4786u, 0x0fc19dc6u, 0x240ca1ccu, 0x2de92c6fu, 0x4a7484aau, 0x5cb0a9dcu, 0x76f988dau,
    0x983e5152u, 0xa831c66du, 0xb00327c8u, 0xbf597fc7u, 0xc6e00bf3u, 0xd5a79147u, 0x06ca6351u, 0x14292967u,
    0x27b70a85u, 0x2e1b2138u, 0x4d2c6dfcu, 0x53380d13u, 0x650a7354u, 0x766a0abbu, 0x81c2c92eu, 0x92722c85u,
    0xa2bfe8a1u, 0xa81a664bu, 0xc24b8b70u, 0xc76c51a3u, 0xd192e819u, 0xd6990624u, 0xf40e3585u, 0x106aa070u,
    0x19a4c116u, 0x1e376c08u, 0x2748774cu, 0x34b0bcb5u, 0x391c0cb3u, 0x4ed8aa4au, 0x5b9cca4fu, 0x682e6ff3u,
    0x748f82eeu, 0x78a5636fu, 0x84c87814u, 0x8cc70208u, 0x90befffau, 0xa4506cebu, 0xbef9a3f7u, 0xc67178f2u};

extern "C" __global__ void sha256_batch(const u8* data, const u64* offsets, u32 n, u8* out) {
    u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n) return;
    const u8* p = data + offsets[t];
    u64 len = offsets[t + 1] - offsets[t];
    u32 h[8] = {0x6a09e667u, 0xbb67ae85u, 0x3c6ef372u, 0xa54ff53au,
                0x510e527fu, 0x9b05688cu, 0x1f83d9abu, 0x5be0cd19u};
    u64 blocks = sha_blocks(len);
    for (u64 b = 0; b < blocks; ++b) {
        u32 w[64];
        for (int i = 0; i < 16; ++i) w[i] = sha_word(p, len, 64 * b + 4 * i);
        for (int i = 16; i < 64; ++i) {
            u32 s0 = rotr32(w[i - 15], 7) ^ rotr32(w[i - 15], 18) ^ (w[i - 15] >> 3);
            u32 s1 = rotr32(w[i - 2], 17) ^ rotr32(w[i - 2], 19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16] + s0 + w[i - 7] + s1;
        }
        u32 a = h[0], b_ = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
        for (int i = 0; i < 64; ++i) {
            u32 t1 = hh + (rotr32(e, 6) ^ rotr32(e, 11) ^ rotr32(e, 25)) + ((e & f) ^ (~e & g))
                     + SHA256_K[i] + w[i];
            u32 t2 = (rotr32(a, 2) ^ rotr32(a, 13) ^ rotr32(a, 22)) + ((a & b_) ^ (a & c) ^ (b_ & c));
            hh = g; g = f; f = e; e = d + t1; d = c; c = b_; b_ = a; a = t1 + t2;
        }
        h[0] += a; h[1] += b_; h[2] += c; h[3] += d; h[4] += e; h[5] += f; h[6] += g; h[7] += hh;
    }
    sha_store(h, 8, out + 32 * t);
}
"#;

const SHA1: &str = r#"
extern "C" __global__ void sha1_batch(const u8* data, const u64* offsets, u32 n, u8* out) {
    u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n) return;
    const u8* p = data + offsets[t];
    u64 len = offsets[t + 1] - offsets[t];
    u32 h[5] = {0x67452301u, 0xEFCDAB89u, 0x98BADCFEu, 0x10325476u, 0xC3D2E1F0u};
    u64 blocks = sha_blocks(len);
    for (u64 b = 0; b < blocks; ++b) {
        u32 w[80];
        for (int i = 0; i < 16; ++i) w[i] = sha_word(p, len, 64 * b + 4 * i);
        for (int i = 16; i < 80; ++i) w[i] = rotl32(w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16], 1);
        u32 a = h[0], b_ = h[1], c = h[2], d = h[3], e = h[4];
        for (int i = 0; i < 80; ++i) {
            u32 f, k;
            if (i < 20) { f = (b_ & c) | (~b_ & d); k = 0x5A827999u; }
            else if (i < 40) { f = b_ ^ c ^ d; k = 0x6ED9EBA1u; }
            else if (i < 60) { f = (b_ & c) | (b_ & d) | (c & d); k = 0x8F1BBCDCu; }
            else { f = b_ ^ c ^ d; k = 0xCA62C1D6u; }
            u32 temp = rotl32(a, 5) + f + e + k + w[i];
            e = d; d = c; c = rotl32(b_, 30); b_ = a; a = temp;
        }
        h[0] += a; h[1] += b_; h[2] += c; h[3] += d; h[4] += e;
    }
    sha_store(h, 5, out + 32 * t);
}
"#;
