//! Lower-case hex, as key slots store their binary fields.

pub(crate) fn encode(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(2 * bytes.len());
    for &b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 15)] as char);
    }
    s
}

/// Decodes lower-case hex only (what `encode` writes): anything else is `None`, so that
/// one stored value has exactly one spelling.
pub(crate) fn decode(hex: &str) -> Option<Vec<u8>> {
    fn digit(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        }
    }
    let bytes = hex.as_bytes();
    if !bytes.len().is_multiple_of(2) {
        return None;
    }
    bytes
        .chunks_exact(2)
        .map(|p| Some(digit(p[0])? << 4 | digit(p[1])?))
        .collect()
}

/// Decodes exactly `N` bytes of lower-case hex.
pub(crate) fn decode_array<const N: usize>(hex: &str) -> Option<[u8; N]> {
    decode(hex)?.try_into().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_refuses_other_spellings() {
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(decode(&encode(&all)).unwrap(), all);
        assert_eq!(encode(&[0x0f, 0xa0]), "0fa0");
        for bad in ["0FA0", "0fa", "0g", " 0f", "+f"] {
            assert_eq!(decode(bad), None, "{bad}");
        }
        assert_eq!(decode_array::<2>("0fa0"), Some([0x0f, 0xa0]));
        assert_eq!(decode_array::<3>("0fa0"), None);
    }
}
