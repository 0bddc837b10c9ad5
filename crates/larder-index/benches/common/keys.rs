//! The keys and values of the index benches and examples, shared so that every
//! measurement holds the same fingerprints.

use larder_hash::Fingerprint;
use larder_index::ChunkLocation;

/// Uniform 32-byte fingerprint number `i` (splitmix64 of `4i .. 4i+3`).
pub fn fingerprint(i: u64) -> Fingerprint {
    let mut out = [0; 32];
    for (k, word) in out.chunks_exact_mut(8).enumerate() {
        let mut z = (i * 4 + k as u64).wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        word.copy_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    Fingerprint(out)
}

/// Where a backup of 8 KiB chunks puts chunk `i`: 500 chunks to a 4 MiB container.
pub fn location(i: u64) -> ChunkLocation {
    ChunkLocation {
        container: 1 + i / 500,
        offset: 32 + (i % 500) as u32 * 8192,
        length: 8192,
    }
}
