//! Byte-scanning kernels: a portable implementation that is the spec, and AVX2 and
//! AVX-512 twins chosen once at run time, in the manner of BLAKE3's `platform.rs`.
//!
//! Every kernel has the same signature on every platform, and `tests` at the bottom
//! compare each platform the machine has against the portable one over boundary
//! lengths. `LARDER_SIMD=portable|avx2|avx512` caps the platform (read once, at the
//! first call), so the test suite can run with each instruction set switched off in
//! turn (`scripts/test` does).

mod portable;
#[cfg(target_arch = "x86_64")]
mod x86;

use std::sync::OnceLock;

pub use portable::{is_natural_anchor, NATURAL_MULTIPLIER};

/// An instruction-set level the kernels are compiled for, best last.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Platform {
    Portable,
    Avx2,
    Avx512,
}

impl Platform {
    /// Every platform, for help texts and tests.
    pub const ALL: [Platform; 3] = [Self::Portable, Self::Avx2, Self::Avx512];

    pub fn name(self) -> &'static str {
        match self {
            Self::Portable => "portable",
            Self::Avx2 => "avx2",
            Self::Avx512 => "avx512",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.name() == name)
    }

    /// Whether this machine can run the platform's kernels.
    pub fn is_supported(self) -> bool {
        match self {
            Self::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Self::Avx2 => std::arch::is_x86_feature_detected!("avx2"),
            #[cfg(target_arch = "x86_64")]
            Self::Avx512 => {
                std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512bw")
            }
            #[cfg(not(target_arch = "x86_64"))]
            Self::Avx2 | Self::Avx512 => false,
        }
    }

    /// The best supported platform, capped by `LARDER_SIMD` when it names one.
    pub fn detect() -> Self {
        let cap = std::env::var("LARDER_SIMD")
            .ok()
            .and_then(|v| Self::from_name(v.trim()))
            .unwrap_or(Self::Avx512);
        Self::ALL
            .into_iter()
            .filter(|p| *p <= cap && p.is_supported())
            .max()
            .unwrap_or(Self::Portable)
    }

    /// [`Platform::detect`], computed once per process.
    pub fn active() -> Self {
        static ACTIVE: OnceLock<Platform> = OnceLock::new();
        *ACTIVE.get_or_init(Self::detect)
    }

    /// How many leading bytes of `data` equal `byte`.
    pub fn run_len(self, data: &[u8], byte: u8) -> usize {
        match self {
            Self::Portable => portable::run_len(data, byte),
            #[cfg(target_arch = "x86_64")]
            Self::Avx2 if self.is_supported() => {
                // SAFETY: AVX2 support was just checked.
                unsafe { x86::run_len_avx2(data, byte) }
            }
            #[cfg(target_arch = "x86_64")]
            Self::Avx512 if self.is_supported() => {
                // SAFETY: AVX-512F and AVX-512BW support was just checked.
                unsafe { x86::run_len_avx512(data, byte) }
            }
            _ => portable::run_len(data, byte),
        }
    }

    /// Natural anchors of the keyed chunker: bit `k % 64` of `out[k / 64]` says
    /// whether position `start + k` is one ([`is_natural_anchor`]); positions at or
    /// past `data.len()` get 0. `start >= 3`. AVX-512 machines run the AVX2 kernel.
    pub fn natural_anchors(self, data: &[u8], start: usize, out: &mut [u64]) {
        match self {
            #[cfg(target_arch = "x86_64")]
            Self::Avx2 | Self::Avx512 if Self::Avx2.is_supported() => {
                // SAFETY: AVX2 support was just checked.
                unsafe { x86::natural_anchors_avx2(data, start, out) }
            }
            _ => portable::natural_anchors(data, start, out),
        }
    }

    /// The keyed chunker's stage-1 passes: bit `j` of `out[k]` is set where
    /// `blocks[k][j] <= max`, for `k` below the shorter of `blocks` and `out`.
    /// AVX-512 machines run the AVX2 kernel.
    pub fn stage1_pass_masks(self, blocks: &[[u8; 16]], max: u8, out: &mut [u16]) {
        match self {
            #[cfg(target_arch = "x86_64")]
            Self::Avx2 | Self::Avx512 if Self::Avx2.is_supported() => {
                // SAFETY: AVX2 support was just checked.
                unsafe { x86::stage1_pass_masks_avx2(blocks, max, out) }
            }
            _ => portable::stage1_pass_masks(blocks, max, out),
        }
    }
}

/// The kernels of the keyed chunker, for its scan, which is generic over them and
/// compiled once for each: portably, and inside a function with AVX2, BMI1, BMI2,
/// POPCNT and LZCNT enabled, so that the whole scan (its bit tricks and vectorized
/// loops included) uses those instructions.
pub trait KeyedKernels: Copy {
    /// [`Platform::natural_anchors`].
    fn natural_anchors(self, data: &[u8], start: usize, out: &mut [u64]);
    /// [`Platform::stage1_pass_masks`].
    fn stage1_pass_masks(self, blocks: &[[u8; 16]], max: u8, out: &mut [u16]);
}

/// The portable kernels.
#[derive(Debug, Clone, Copy)]
pub struct PortableKernels;

impl KeyedKernels for PortableKernels {
    #[inline(always)]
    fn natural_anchors(self, data: &[u8], start: usize, out: &mut [u64]) {
        portable::natural_anchors(data, start, out)
    }

    #[inline(always)]
    fn stage1_pass_masks(self, blocks: &[[u8; 16]], max: u8, out: &mut [u16]) {
        portable::stage1_pass_masks(blocks, max, out)
    }
}

/// The AVX2 kernels. A value exists only where the CPU supports AVX2, BMI1, BMI2,
/// POPCNT and LZCNT and `LARDER_SIMD` allows AVX2: it is the proof that calling them
/// (and the functions compiled with those features) is sound.
#[cfg(target_arch = "x86_64")]
#[derive(Debug, Clone, Copy)]
pub struct Avx2Kernels(());

#[cfg(target_arch = "x86_64")]
impl Avx2Kernels {
    /// The kernels, where the machine and `LARDER_SIMD` allow them.
    pub fn detect() -> Option<Self> {
        use std::arch::is_x86_feature_detected as has;
        let usable = Platform::active() >= Platform::Avx2
            && has!("avx2")
            && has!("bmi1")
            && has!("bmi2")
            && has!("popcnt")
            && has!("lzcnt");
        usable.then_some(Self(()))
    }
}

#[cfg(target_arch = "x86_64")]
impl KeyedKernels for Avx2Kernels {
    #[inline(always)]
    fn natural_anchors(self, data: &[u8], start: usize, out: &mut [u64]) {
        // SAFETY: an `Avx2Kernels` exists only where AVX2 is supported.
        unsafe { x86::natural_anchors_avx2(data, start, out) }
    }

    #[inline(always)]
    fn stage1_pass_masks(self, blocks: &[[u8; 16]], max: u8, out: &mut [u16]) {
        // SAFETY: an `Avx2Kernels` exists only where AVX2 is supported.
        unsafe { x86::stage1_pass_masks_avx2(blocks, max, out) }
    }
}

/// The keyed chunker's stage-1 passes on the active platform; see
/// [`Platform::stage1_pass_masks`].
pub fn stage1_pass_masks(blocks: &[[u8; 16]], max: u8, out: &mut [u16]) {
    Platform::active().stage1_pass_masks(blocks, max, out)
}

/// Natural anchors of the keyed chunker on the active platform; see
/// [`Platform::natural_anchors`].
pub fn natural_anchors(data: &[u8], start: usize, out: &mut [u64]) {
    Platform::active().natural_anchors(data, start, out)
}

/// How many leading bytes of `data` equal `byte`, on the active platform.
pub fn run_len(data: &[u8], byte: u8) -> usize {
    Platform::active().run_len(data, byte)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The obvious model every platform must equal.
    fn model(data: &[u8], byte: u8) -> usize {
        data.iter().take_while(|&&b| b == byte).count()
    }

    /// Lengths around every vector width and word size.
    fn boundary_lengths() -> Vec<usize> {
        let mut lengths: Vec<usize> = (0..=160).collect();
        for w in [256, 512, 1024, 4096] {
            lengths.extend([w - 1, w, w + 1]);
        }
        lengths
    }

    #[test]
    fn every_platform_equals_the_model_over_boundary_lengths() {
        let platforms: Vec<Platform> = Platform::ALL
            .into_iter()
            .filter(|p| p.is_supported())
            .collect();
        for len in boundary_lengths() {
            for byte in [0u8, 0xab] {
                let mut data = vec![byte; len + 1];
                // The whole run, then a differing byte at every position.
                for platform in &platforms {
                    assert_eq!(
                        platform.run_len(&data[..len], byte),
                        len,
                        "{platform:?} len {len}"
                    );
                }
                for stop in (0..len).step_by(1 + len / 40) {
                    data[stop] = byte ^ 0x01;
                    let want = model(&data[..len], byte);
                    assert_eq!(want, stop);
                    for platform in &platforms {
                        assert_eq!(
                            platform.run_len(&data[..len], byte),
                            want,
                            "{platform:?} len {len} stop {stop}"
                        );
                    }
                    data[stop] = byte;
                }
            }
        }
    }

    #[test]
    fn natural_anchors_agree_with_the_definition_on_every_platform() {
        let mut data: Vec<u8> = (0..5000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        // A zero run: no natural position (runs of one byte never are).
        data[1000..1200].fill(0);
        for platform in Platform::ALL.into_iter().filter(|p| p.is_supported()) {
            for len in [4, 5, 35, 36, 67, 68, 69, 100, 131, 1300, 5000] {
                for start in [3, 4, 5, 17, 64, 900, 1100] {
                    for words in 0..=5 {
                        let mut got = vec![u64::MAX; words];
                        platform.natural_anchors(&data[..len], start, &mut got);
                        for k in 0..64 * words {
                            let i = start + k;
                            let want = i < len && is_natural_anchor(&data, i);
                            let bit = got[k / 64] >> (k % 64) & 1 == 1;
                            assert_eq!(bit, want, "{platform:?} len {len} start {start} {i}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn stage1_pass_masks_agree_with_the_definition_on_every_platform() {
        let blocks: Vec<[u8; 16]> = (0..37u32)
            .map(|k| std::array::from_fn(|j| (k * 41 + j as u32 * 97) as u8))
            .collect();
        for platform in Platform::ALL.into_iter().filter(|p| p.is_supported()) {
            for max in [0u8, 1, 3, 31, 127, 128, 254, 255] {
                for count in [0, 1, 2, 3, 16, 17, 36, 37] {
                    let mut got = vec![0xabcd; count];
                    platform.stage1_pass_masks(&blocks[..count], max, &mut got);
                    for (block, &bits) in blocks.iter().zip(&got) {
                        for (j, &b) in block.iter().enumerate() {
                            assert_eq!(bits >> j & 1 == 1, b <= max, "{platform:?} {max}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn unaligned_starts_agree() {
        let mut data = vec![0u8; 300];
        data[250] = 1;
        for platform in Platform::ALL.into_iter().filter(|p| p.is_supported()) {
            for start in 0..70 {
                assert_eq!(
                    platform.run_len(&data[start..], 0),
                    250 - start,
                    "{platform:?}"
                );
            }
        }
    }

    /// `scripts/test` runs the suite again under `LARDER_SIMD=avx2` and `=portable`;
    /// this checks that those runs really use no better instruction set.
    #[test]
    fn larder_simd_caps_the_active_platform() {
        if let Some(cap) = std::env::var("LARDER_SIMD")
            .ok()
            .and_then(|v| Platform::from_name(&v))
        {
            assert!(
                Platform::active() <= cap,
                "{:?} above {cap:?}",
                Platform::active()
            );
        }
    }

    #[test]
    fn names_round_trip_and_portable_is_always_supported() {
        for p in Platform::ALL {
            assert_eq!(Platform::from_name(p.name()), Some(p));
        }
        assert!(Platform::Portable.is_supported());
        assert!(Platform::active().is_supported());
    }
}
