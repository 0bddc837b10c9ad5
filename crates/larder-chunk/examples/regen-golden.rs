//! Writes `testdata/chunk/golden.json`, the cut points `tests/golden.rs` freezes.
//!
//! Run `cargo run -p larder-chunk --example regen-golden` only to add a chunker or a
//! case that has not been released: released cut points must never change.

#[path = "../tests/support/inputs.rs"]
mod inputs;

#[path = "../tests/support/golden_file.rs"]
mod golden_file;

use golden_file::{build, fnv1a64_hex, Case, Generator, GoldenFile, InputSpec, GOLDEN_PATH};
use larder_chunk::{ChunkerConfig, ChunkerKind};

const ABOUT: &str = "Cut points (chunk lengths) of every larder chunker on deterministic \
inputs from crates/larder-chunk/tests/support/inputs.rs. Released cut points are frozen: \
crates/larder-chunk/tests/golden.rs fails if any changes. Written by \
`cargo run -p larder-chunk --example regen-golden`, to be run only to add an unreleased \
chunker or case.";

fn input(name: &str, generator: Generator, seed: u64, len: usize) -> InputSpec {
    let mut spec = InputSpec {
        name: name.to_owned(),
        generator,
        seed,
        len,
        fnv1a64: String::new(),
    };
    spec.fnv1a64 = fnv1a64_hex(&spec.generate());
    spec
}

fn config(kind: ChunkerKind, (min, avg, max): (usize, usize, usize), level: u8) -> ChunkerConfig {
    ChunkerConfig {
        kind,
        min_size: min,
        avg_size: avg,
        max_size: max,
        level,
        seed: 0,
    }
}

/// `(input, config)` pairs. Inputs end on odd lengths so that the final stretch of
/// FastCDC 2020 (see its module docs) is frozen as well; on "odd-tail" the two forms
/// differ there.
fn cases() -> Vec<(&'static str, ChunkerConfig)> {
    use ChunkerKind::{Adler, Ae, Fastcdc2016, Fastcdc2020, Fixed, Gear, Keyed, Rabin};
    const DEFAULT: (usize, usize, usize) = (2048, 8192, 65536);
    let mut cases = Vec::new();
    for kind in [Fastcdc2016, Fastcdc2020] {
        for level in 0..=3 {
            cases.push(("random", config(kind, DEFAULT, level)));
        }
        cases.push(("random", config(kind, (64, 256, 1024), 2)));
        cases.push(("random", config(kind, (6000, 12000, 48000), 2)));
        cases.push(("random", config(kind, (16384, 65536, 262144), 1)));
        cases.push(("text", config(kind, DEFAULT, 2)));
        cases.push(("text", config(kind, (64, 256, 1024), 1)));
        cases.push(("text", config(kind, (64, 256, 1024), 3)));
    }
    for kind in [Fastcdc2016, Fastcdc2020] {
        cases.push(("odd-tail", config(kind, (64, 256, 1024), 1)));
    }
    cases.push(("random", config(Fastcdc2016, (1001, 3001, 9001), 1)));
    for size in [1000, 4096, 65536] {
        cases.push(("random", config(Fixed, (size, size, size), 0)));
    }
    cases.push(("text", config(Fixed, (4096, 4096, 4096), 0)));
    // Added with minimum sizes below 64 and the papers' baselines; appended, so that
    // the cases above keep their place in the file.
    for kind in [Fastcdc2016, Fastcdc2020] {
        cases.push(("random", config(kind, (0, 8192, 65536), 0)));
        cases.push(("random", config(kind, (0, 8192, 65536), 2)));
        cases.push(("random", config(kind, (8192, 8192, 65536), 0)));
        cases.push(("text", config(kind, (0, 256, 1024), 1)));
        cases.push(("odd-tail", config(kind, (2, 256, 1024), 1)));
    }
    for kind in [Rabin, Adler, Gear, Ae] {
        cases.push(("random", config(kind, DEFAULT, 0)));
        cases.push(("random", config(kind, (0, 1024, 8192), 0)));
        cases.push(("random", config(kind, (16384, 65536, 262144), 0)));
        cases.push(("text", config(kind, DEFAULT, 0)));
        cases.push(("text", config(kind, (64, 256, 1024), 0)));
        cases.push(("odd-tail", config(kind, (0, 256, 1024), 0)));
    }
    // Averages that are not powers of two, which only these two accept.
    cases.push(("random", config(Adler, (2000, 6000, 24000), 0)));
    cases.push(("random", config(Ae, (2000, 6000, 24000), 0)));
    // The keyed chunker, under `GOLDEN_SECRET`: every level, the smallest minimum, odd
    // sizes and an average that is not a power of two.
    for level in 0..=3 {
        cases.push(("random", config(Keyed, DEFAULT, level)));
    }
    cases.push(("random", config(Keyed, (64, 256, 1024), 2)));
    cases.push(("random", config(Keyed, (16384, 65536, 262144), 1)));
    cases.push(("random", config(Keyed, (2001, 6001, 24001), 2)));
    cases.push(("text", config(Keyed, DEFAULT, 2)));
    cases.push(("text", config(Keyed, (64, 256, 1024), 3)));
    cases.push(("odd-tail", config(Keyed, (64, 256, 1024), 1)));
    cases
}

/// Pretty at the top level, one input or case per line, so a diff names the case.
fn to_json(file: &GoldenFile) -> serde_json::Result<String> {
    let lines = |items: Vec<String>| items.join(",\n    ");
    let inputs = file
        .inputs
        .iter()
        .map(serde_json::to_string)
        .collect::<Result<_, _>>()?;
    let cases = file
        .cases
        .iter()
        .map(serde_json::to_string)
        .collect::<Result<_, _>>()?;
    Ok(format!(
        "{{\n  \"about\": {},\n  \"inputs\": [\n    {}\n  ],\n  \"cases\": [\n    {}\n  ]\n}}\n",
        serde_json::to_string(&file.about)?,
        lines(inputs),
        lines(cases)
    ))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let inputs = vec![
        input("random", Generator::Random, 1, (1 << 20) + 3),
        input("text", Generator::TextLike, 2, (64 << 10) + 1),
        // Seed picked so that FastCDC 2016 cuts one byte before the end at 64/256/1K.
        input("odd-tail", Generator::Random, 262, 10_001),
    ];
    let cases = cases()
        .into_iter()
        .map(|(name, config)| {
            config.validate()?;
            let spec = inputs
                .iter()
                .find(|i| i.name == name)
                .ok_or("unknown input")?;
            let lengths = build(&config).chunk_lengths(&spec.generate());
            Ok(Case {
                input: name.to_owned(),
                config,
                lengths,
            })
        })
        .collect::<Result<_, Box<dyn std::error::Error>>>()?;
    let file = GoldenFile {
        about: ABOUT.to_owned(),
        inputs,
        cases,
    };
    std::fs::write(GOLDEN_PATH, to_json(&file)?)?;
    println!("wrote {} cases to {GOLDEN_PATH}", file.cases.len());
    Ok(())
}
