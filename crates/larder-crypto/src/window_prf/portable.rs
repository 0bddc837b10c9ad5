//! The portable backend and executable spec: RustCrypto's AES-128, one block at a
//! time, window by window.

use aes::cipher::{BlockCipherEncrypt, KeyInit};
use aes::{Aes128, Block};

use super::window;

/// The two ciphers. `Aes128` zeroes its round keys on drop (the `aes` crate's
/// `zeroize` feature).
pub struct Keys {
    stage1: Aes128,
    stage2: Aes128,
}

impl Keys {
    pub fn new(k1: &[u8; 16], k2: &[u8; 16]) -> Self {
        Self {
            stage1: Aes128::new(&(*k1).into()),
            stage2: Aes128::new(&(*k2).into()),
        }
    }

    pub fn encrypt_stage1(&self, window: &[u8; 16]) -> [u8; 16] {
        encrypt(&self.stage1, window)
    }

    pub fn encrypt_stage2(&self, window: &[u8; 16]) -> [u8; 16] {
        encrypt(&self.stage2, window)
    }

    /// `out[k] = AES_k1(window ending at anchors[k])`; lengths checked by the caller.
    pub fn stage1(&self, data: &[u8], anchors: &[u32], out: &mut [[u8; 16]]) {
        for (&anchor, out) in anchors.iter().zip(out) {
            *out = encrypt(&self.stage1, window(data, anchor));
        }
    }
}

fn encrypt(cipher: &Aes128, window: &[u8; 16]) -> [u8; 16] {
    let mut block = Block::from(*window);
    cipher.encrypt_block(&mut block);
    block.into()
}
