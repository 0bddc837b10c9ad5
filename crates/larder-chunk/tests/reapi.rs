//! The FastCDC 2020 test vectors of the Bazel Remote Execution API
//! (`build/bazel/remote/execution/v2/fastcdc2020_test_vectors.txt` in
//! bazelbuild/remote-apis): min 4096, average 16384, max 65535 (odd), normalization
//! level 2, seeds 0 and 666, over the image `testdata/chunk/reapi/SekienAkashita.jpg`
//! (its README says where it comes from). Each chunk's offset, length, SHA-256 and the
//! 64-bit Gear value the reference implementations report with it must match.

use larder_chunk::{ChunkerConfig, ChunkerKind, FastCdc2020};
use sha2::{Digest, Sha256};

const INPUT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../testdata/chunk/reapi/SekienAkashita.jpg"
);
const INPUT_SHA256: &str = "d9e749d9367fc908876749d6502eb212fee88c9a94892fb07da5ef3ba8bc39ed";

/// `(offset, length, sha256, fingerprint)`, as published for seed 0.
const SEED_0: [(usize, usize, &str, u64); 6] = [
    (
        0,
        19186,
        "0f9efa589121d5d9e9e2c4ace91337d77cae866537143f6f15a0ffd525a77c2d",
        17583755766661134474,
    ),
    (
        19186,
        19279,
        "c7c86a165573c16448cda35c9169742e85645af42be22889f8b96b8ee0ec7cb0",
        4098594969649699419,
    ),
    (
        38465,
        17354,
        "bc88521e28a8b4479cdea5f75aa721a24f3a0a7d0be903aa6d505c574e51e89d",
        2365586132076908760,
    ),
    (
        55819,
        16387,
        "4b8dac2652e4685c629d2bb1ae9d4448e676b86f2e67ca0b2fff3d9580184b79",
        16009206469796846404,
    ),
    (
        72206,
        19940,
        "c0a7062da6f2386c28e086ee0cedd5732252741269838773cff1ddb05b2df6ed",
        2473608525189754172,
    ),
    (
        92146,
        17320,
        "7fa5b12134dc75cd2ac8dc60d3a8f3c8d22f0ee9d4cf74a4aa937e2a0d2d79a5",
        2504464741100432583,
    ),
];

/// The same for seed 666.
const SEED_666: [(usize, usize, &str, u64); 6] = [
    (
        0,
        17635,
        "cb3a9d80a3569772d4ed331ca37ab0c862c759897b890fc1aac90a4f2ea3a407",
        17021115692437263050,
    ),
    (
        17635,
        17334,
        "d758c6b7b0b7eef1e996f8ccd17de6c645360b03a26c35541e7581348ac08944",
        8231525949846907466,
    ),
    (
        34969,
        19136,
        "24846aefd89e510594bae3e9d7d5ea5012067601512610fed126a3c57ba993f5",
        10944310959829698982,
    ),
    (
        54105,
        17467,
        "efa785e1fefb49f190e665f72fd246c1442079874508c312196da1fb3040d00b",
        13602876513398592944,
    ),
    (
        71572,
        23593,
        "a2f557bdd8d40d8faada963ad5f91ec54b10ccee7c5ae72754a65137592dc607",
        2945079350535657389,
    ),
    (
        95165,
        14301,
        "e131100b4a7147ccad19dc63c4a2fac1f5d8b644e1373eeb6803825024234efc",
        8981594897574481255,
    ),
];

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn input() -> Vec<u8> {
    let data = std::fs::read(INPUT).unwrap_or_else(|e| panic!("cannot read {INPUT}: {e}"));
    assert_eq!(
        hex(&Sha256::digest(&data)),
        INPUT_SHA256,
        "{INPUT} is not the vectors' input"
    );
    data
}

/// The API's parameters, built as a repository would build them: from a config.
fn config(seed: u64) -> ChunkerConfig {
    let config = ChunkerConfig {
        kind: ChunkerKind::Fastcdc2020,
        min_size: 4096,
        avg_size: 16384,
        max_size: 65535,
        level: 2,
        seed,
    };
    config.validate().expect("the API's parameters are valid");
    config
}

fn check(seed: u64, expected: &[(usize, usize, &str, u64)]) {
    let data = input();
    let lengths = config(seed).build().chunk_lengths(&data);
    let chunker = FastCdc2020::with_seed(4096, 16384, 65535, 2, seed);
    let mut offset = 0;
    let mut got = Vec::new();
    for len in lengths {
        let rest = &data[offset..];
        let fingerprint = chunker.cut_fingerprint(rest, len);
        got.push((offset, len, hex(&Sha256::digest(&rest[..len])), fingerprint));
        offset += len;
    }
    let expected: Vec<_> = expected
        .iter()
        .map(|&(o, l, sha, fp)| (o, l, sha.to_string(), fp))
        .collect();
    assert_eq!(got, expected, "seed {seed}");
}

#[test]
fn seed_0_vectors_are_reproduced() {
    check(0, &SEED_0);
}

#[test]
fn seed_666_vectors_are_reproduced() {
    check(666, &SEED_666);
}
