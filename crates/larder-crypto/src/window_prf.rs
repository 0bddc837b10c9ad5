//! The pseudo-random function of the keyed chunker's cut decisions
//! (docs/design/chunking.md, section `keyed`).
//!
//! Two AES-128 keys, derived from a 32-byte chunker secret with BLAKE3's `derive_key`,
//! encrypt 16-byte windows of the data: stage 1 (`k1`) the windows that end at the
//! chunker's anchors, stage 2 (`k2`) the windows of the rare positions that pass
//! stage 1. The key bytes never leave [`WindowPrf`]: it hands out AES outputs only,
//! and its round keys are zeroed when it is dropped.
//!
//! Three backends compute the same function, chosen once when the PRF is built
//! ([`AesBackend::detect`]), in the manner of BLAKE3's `Platform`:
//! - `portable` (`window_prf/portable.rs`): RustCrypto's `aes` crate, one block at a
//!   time. It is the executable spec the others are tested against.
//! - `aes-ni` (`window_prf/x86.rs`): AES-NI intrinsics, eight blocks in flight, with
//!   the FIPS-197 key schedule computed by `aeskeygenassist`.
//! - `vaes`: VAES on 256-bit registers, two blocks a register and sixteen in flight.
//!
//! The tests below check every backend the machine has against the portable one
//! (fixed cases over boundary batch sizes and a property test over random data and
//! anchors) and against FIPS-197's Appendix C.1 known answer.

mod portable;
#[cfg(target_arch = "x86_64")]
mod x86;

use std::fmt;

use zeroize::Zeroizing;

/// The BLAKE3 `derive_key` context of the stage-1 key (its first 16 bytes).
pub const STAGE1_CONTEXT: &str = "larder 2026-11-28 keyed chunker stage 1";
/// The BLAKE3 `derive_key` context of the stage-2 key (its first 16 bytes).
pub const STAGE2_CONTEXT: &str = "larder 2026-11-28 keyed chunker stage 2";
/// Bytes in a window: one AES block. The window of position `i` is `data[i-15..=i]`.
pub const WINDOW_LEN: usize = 16;

/// An implementation of AES-128 encryption the PRF can run on. All compute the same
/// function; they differ in speed only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum AesBackend {
    /// RustCrypto's `aes` crate, one block at a time: the spec.
    Portable,
    /// AES-NI, eight 128-bit blocks in flight.
    AesNi,
    /// VAES on 256-bit registers (and AVX2 to broadcast the round keys), sixteen
    /// blocks in flight.
    Vaes,
}

impl AesBackend {
    /// Every backend, worst first.
    pub const ALL: [AesBackend; 3] = [Self::Portable, Self::AesNi, Self::Vaes];

    pub fn name(self) -> &'static str {
        match self {
            Self::Portable => "portable",
            Self::AesNi => "aes-ni",
            Self::Vaes => "vaes",
        }
    }

    /// Whether this machine can run the backend.
    pub fn is_supported(self) -> bool {
        match self {
            Self::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Self::AesNi => std::arch::is_x86_feature_detected!("aes"),
            #[cfg(target_arch = "x86_64")]
            Self::Vaes => {
                std::arch::is_x86_feature_detected!("aes")
                    && std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("vaes")
            }
            #[cfg(not(target_arch = "x86_64"))]
            Self::AesNi | Self::Vaes => false,
        }
    }

    /// The best backend this machine supports.
    pub fn detect() -> Self {
        Self::ALL
            .into_iter()
            .filter(|b| b.is_supported())
            .max()
            .unwrap_or(Self::Portable)
    }
}

/// The keyed chunker's PRF: AES-128 under two secret keys, over 16-byte windows.
///
/// Opaque: no method returns key bytes, `Debug` prints the backend only, and the
/// round keys are zeroed on drop. Shared between threads behind an `Arc`.
pub struct WindowPrf {
    engine: Engine,
}

/// The expanded keys, in the form the backend uses.
enum Engine {
    // Boxed: RustCrypto's two ciphers take 704 bytes, twice the other variants.
    Portable(Box<portable::Keys>),
    #[cfg(target_arch = "x86_64")]
    AesNi(x86::Keys),
    #[cfg(target_arch = "x86_64")]
    Vaes(x86::Keys),
}

/// `(k1, k2)` from a chunker secret: the first 16 bytes of BLAKE3 `derive_key` under
/// [`STAGE1_CONTEXT`] and [`STAGE2_CONTEXT`].
fn derive_keys(secret: &[u8; 32]) -> (Zeroizing<[u8; 16]>, Zeroizing<[u8; 16]>) {
    let first_16 = |context: &str| {
        let full = Zeroizing::new(blake3::derive_key(context, secret));
        let mut key = Zeroizing::new([0u8; 16]);
        key.copy_from_slice(&full[..16]);
        key
    };
    (first_16(STAGE1_CONTEXT), first_16(STAGE2_CONTEXT))
}

impl WindowPrf {
    /// The PRF of a 32-byte chunker secret, on the best backend of this machine.
    pub fn from_secret(secret: &[u8; 32]) -> Self {
        let (k1, k2) = derive_keys(secret);
        Self::from_keys(&k1, &k2, AesBackend::detect())
    }

    /// As [`WindowPrf::from_secret`] on a chosen backend, or `None` where this machine
    /// cannot run it: for tests and benchmarks that compare backends.
    pub fn from_secret_on(secret: &[u8; 32], backend: AesBackend) -> Option<Self> {
        if !backend.is_supported() {
            return None;
        }
        let (k1, k2) = derive_keys(secret);
        Some(Self::from_keys(&k1, &k2, backend))
    }

    /// A PRF under a fresh secret from the operating system's random number generator,
    /// for experiments without a repository (`larder chunk`): nothing can reproduce its
    /// cut points.
    ///
    /// # Panics
    /// If the operating system cannot supply random bytes, which leaves nothing
    /// sensible to do (std's `HashMap` seeding panics likewise).
    pub fn random() -> Self {
        let mut secret = Zeroizing::new([0u8; 32]);
        if let Err(e) = getrandom::fill(secret.as_mut()) {
            panic!("the operating system's random number generator failed: {e}");
        }
        Self::from_secret(&secret)
    }

    /// From the two AES keys themselves. `backend` must be supported.
    fn from_keys(k1: &[u8; 16], k2: &[u8; 16], backend: AesBackend) -> Self {
        let engine = match backend {
            #[cfg(target_arch = "x86_64")]
            AesBackend::AesNi if backend.is_supported() => {
                // SAFETY: AES-NI support was just checked.
                Engine::AesNi(unsafe { x86::Keys::expand(k1, k2) })
            }
            #[cfg(target_arch = "x86_64")]
            AesBackend::Vaes if backend.is_supported() => {
                // SAFETY: VAES support (which includes AES-NI) was just checked.
                Engine::Vaes(unsafe { x86::Keys::expand(k1, k2) })
            }
            _ => Engine::Portable(Box::new(portable::Keys::new(k1, k2))),
        };
        Self { engine }
    }

    /// The backend this PRF runs on.
    pub fn backend(&self) -> AesBackend {
        match self.engine {
            Engine::Portable(_) => AesBackend::Portable,
            #[cfg(target_arch = "x86_64")]
            Engine::AesNi(_) => AesBackend::AesNi,
            #[cfg(target_arch = "x86_64")]
            Engine::Vaes(_) => AesBackend::Vaes,
        }
    }

    /// Stage 1 over a batch: `out[k] = AES_k1(data[anchors[k]-15 ..= anchors[k]])`, the
    /// encryption of the 16-byte window that ends at byte `anchors[k]`.
    ///
    /// # Panics
    /// If `out` and `anchors` differ in length, or an anchor is below 15 or not below
    /// `data.len()` (its window would not lie inside `data`).
    pub fn stage1(&self, data: &[u8], anchors: &[u32], out: &mut [[u8; 16]]) {
        assert_eq!(
            anchors.len(),
            out.len(),
            "one output block for every anchor"
        );
        match &self.engine {
            Engine::Portable(keys) => keys.stage1(data, anchors, out),
            #[cfg(target_arch = "x86_64")]
            // SAFETY: an `AesNi` engine is only built where AES-NI is supported.
            Engine::AesNi(keys) => unsafe {
                x86::encrypt_windows_aesni(&keys.stage1, data, anchors, out)
            },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: a `Vaes` engine is only built where AES-NI, AVX2 and VAES are.
            Engine::Vaes(keys) => unsafe {
                x86::encrypt_windows_vaes(&keys.stage1, data, anchors, out)
            },
        }
    }

    /// Stage 1 of one window: `AES_k1(window)`. [`WindowPrf::stage1`] of a batch is
    /// this, window by window.
    pub fn stage1_block(&self, window: &[u8; 16]) -> [u8; 16] {
        match &self.engine {
            Engine::Portable(keys) => keys.encrypt_stage1(window),
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as in `stage1`, the engine exists only where its features do.
            Engine::AesNi(keys) | Engine::Vaes(keys) => unsafe {
                x86::encrypt_block(&keys.stage1, window)
            },
        }
    }

    /// Stage 2 of one window: the first four bytes of `AES_k2(window)`, little-endian.
    pub fn stage2(&self, window: &[u8; 16]) -> u32 {
        let block = match &self.engine {
            Engine::Portable(keys) => keys.encrypt_stage2(window),
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as in `stage1`, the engine exists only where its features do.
            Engine::AesNi(keys) | Engine::Vaes(keys) => unsafe {
                x86::encrypt_block(&keys.stage2, window)
            },
        };
        u32::from_le_bytes([block[0], block[1], block[2], block[3]])
    }
}

impl fmt::Debug for WindowPrf {
    /// The backend only: no key bytes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WindowPrf")
            .field("backend", &self.backend().name())
            .finish_non_exhaustive()
    }
}

/// Panics, naming the first anchor whose window does not lie inside `data`, unless
/// every one does. One pass of minimum and maximum (vectorized in the SIMD backends'
/// instruction sets), so that their kernels then load windows without checking each.
#[inline(always)]
fn check_anchors(data: &[u8], anchors: &[u32]) {
    let (low, high) = anchors
        .iter()
        .fold((u32::MAX, 0), |(low, high), &a| (low.min(a), high.max(a)));
    if !anchors.is_empty() && ((low as usize) < WINDOW_LEN - 1 || high as usize >= data.len()) {
        for &a in anchors {
            window(data, a);
        }
    }
}

/// The window that ends at `data[end]`, or a panic naming the contract it breaks.
#[inline(always)]
fn window(data: &[u8], end: u32) -> &[u8; 16] {
    let end = end as usize;
    let found = end
        .checked_sub(WINDOW_LEN - 1)
        .and_then(|start| data.get(start..))
        .and_then(<[u8]>::first_chunk::<WINDOW_LEN>);
    match found {
        Some(window) => window,
        None => panic!(
            "anchor {end} has no 16-byte window inside {} bytes of data",
            data.len()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn backends() -> Vec<AesBackend> {
        AesBackend::ALL
            .into_iter()
            .filter(|b| b.is_supported())
            .collect()
    }

    fn hex16(s: &str) -> [u8; 16] {
        let mut out = [0u8; 16];
        for (k, byte) in out.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&s[2 * k..2 * k + 2], 16).unwrap();
        }
        out
    }

    /// FIPS-197 Appendix C.1 (AES-128): the key schedule and the cipher of every
    /// backend, stage 1 and stage 2 alike.
    #[test]
    fn fips_197_appendix_c1_on_every_backend() {
        let key = hex16("000102030405060708090a0b0c0d0e0f");
        let plaintext = hex16("00112233445566778899aabbccddeeff");
        let ciphertext = hex16("69c4e0d86a7b0430d8cdb78070b4c55a");
        for backend in backends() {
            let prf = WindowPrf::from_keys(&key, &key, backend);
            assert_eq!(prf.backend(), backend);
            assert_eq!(prf.stage1_block(&plaintext), ciphertext, "{backend:?}");
            let mut out = [[0u8; 16]; 1];
            prf.stage1(&plaintext, &[15], &mut out);
            assert_eq!(out[0], ciphertext, "{backend:?} batch");
            let expect = u32::from_le_bytes([0x69, 0xc4, 0xe0, 0xd8]);
            assert_eq!(prf.stage2(&plaintext), expect, "{backend:?}");
        }
    }

    /// The derivation from a secret, frozen: a change here changes every keyed
    /// chunker's cut points.
    #[test]
    fn derivation_is_frozen() {
        let mut secret = [0u8; 32];
        for (k, byte) in secret.iter_mut().enumerate() {
            *byte = k as u8;
        }
        let window = *b"larder window 16";
        for backend in backends() {
            let prf = WindowPrf::from_secret_on(&secret, backend).unwrap();
            assert_eq!(
                prf.stage1_block(&window),
                hex16(FROZEN_STAGE1),
                "{backend:?}"
            );
            assert_eq!(prf.stage2(&window), FROZEN_STAGE2, "{backend:?}");
        }
    }

    /// Checked independently: the keys derived from bytes 0..32 are
    /// `k1 = b59776952d8924ecf63ebaac0aacb387`, `k2 = 91909388f35e6e8d1b74639e74daab58`,
    /// and `printf 'larder window 16' | openssl enc -aes-128-ecb -nopad -K <k>` gives
    /// these blocks (stage 2: `3e4a371f...`, read little-endian).
    const FROZEN_STAGE1: &str = "86651ddbefb4265d837a36ea5abe46cd";
    const FROZEN_STAGE2: u32 = 0x1f37_4a3e;

    #[test]
    fn stage_keys_differ_and_depend_on_the_secret() {
        let window = [7u8; 16];
        let a = WindowPrf::from_secret(&[1; 32]);
        let b = WindowPrf::from_secret(&[2; 32]);
        assert_ne!(a.stage1_block(&window), b.stage1_block(&window));
        let a1 = a.stage1_block(&window);
        assert_ne!(
            u32::from_le_bytes([a1[0], a1[1], a1[2], a1[3]]),
            a.stage2(&window)
        );
    }

    #[test]
    fn debug_shows_the_backend_and_no_key() {
        let prf = WindowPrf::from_secret(&[0x5a; 32]);
        let text = format!("{prf:?}");
        let name = prf.backend().name();
        assert_eq!(text, format!("WindowPrf {{ backend: {name:?}, .. }}"));
    }

    #[test]
    fn random_prfs_differ() {
        let window = [0u8; 16];
        assert_ne!(
            WindowPrf::random().stage1_block(&window),
            WindowPrf::random().stage1_block(&window)
        );
    }

    fn batch_on(prf: &WindowPrf, data: &[u8], anchors: &[u32]) -> Vec<[u8; 16]> {
        let mut out = vec![[0u8; 16]; anchors.len()];
        prf.stage1(data, anchors, &mut out);
        out
    }

    fn assert_backends_agree(secret: &[u8; 32], data: &[u8], anchors: &[u32]) {
        let portable = WindowPrf::from_secret_on(secret, AesBackend::Portable).unwrap();
        let want: Vec<[u8; 16]> = anchors
            .iter()
            .map(|&a| portable.stage1_block(window(data, a)))
            .collect();
        for backend in backends() {
            let prf = WindowPrf::from_secret_on(secret, backend).unwrap();
            assert_eq!(batch_on(&prf, data, anchors), want, "{backend:?}");
            for &a in anchors.iter().take(8) {
                let w = window(data, a);
                assert_eq!(prf.stage2(w), portable.stage2(w), "{backend:?}");
            }
        }
    }

    /// Batch sizes around every unroll width (8 blocks, 16 blocks as 8 registers).
    #[test]
    fn batches_of_every_size_agree_with_portable() {
        let data: Vec<u8> = (0..600u32).map(|i| (i * 37 % 251) as u8).collect();
        for n in (0..=40).chain([63, 64, 65, 127, 128, 129]) {
            let anchors: Vec<u32> = (0..n).map(|k| 15 + (k * 7 % 580) as u32).collect();
            assert_backends_agree(&[n as u8; 32], &data, &anchors);
        }
    }

    #[test]
    fn windows_at_both_ends_of_the_data() {
        let data: Vec<u8> = (0..32u8).collect();
        assert_backends_agree(&[9; 32], &data, &[15, 31, 15, 16, 30]);
    }

    #[test]
    #[should_panic(expected = "no 16-byte window")]
    fn anchor_below_15_panics() {
        let prf = WindowPrf::from_secret(&[0; 32]);
        let mut out = [[0u8; 16]; 1];
        prf.stage1(&[0u8; 64], &[14], &mut out);
    }

    #[test]
    #[should_panic(expected = "no 16-byte window")]
    fn anchor_past_the_data_panics() {
        for backend in backends() {
            let prf = WindowPrf::from_secret_on(&[0; 32], backend).unwrap();
            let mut out = [[0u8; 16]; 17];
            let mut anchors = [20u32; 17];
            anchors[16] = 64;
            prf.stage1(&[0u8; 64], &anchors, &mut out);
        }
    }

    proptest! {
        #[test]
        fn every_backend_equals_portable(
            secret in any::<[u8; 32]>(),
            data in proptest::collection::vec(any::<u8>(), 16..400),
            picks in proptest::collection::vec(any::<u32>(), 0..70),
        ) {
            let span = (data.len() - 15) as u32;
            let anchors: Vec<u32> = picks.iter().map(|p| 15 + p % span).collect();
            assert_backends_agree(&secret, &data, &anchors);
        }
    }
}
