//! Names from trees, the file system and storage as larder shows them. Any of them may
//! be hostile: a file name can hold an escape sequence that clears the screen, a
//! newline that forges a line of output, or bytes that are not UTF-8.
//!
//! The rules, one escaping function behind both:
//! - Where a name is put into text, it is escaped with [`escape_name`]: exact (every
//!   byte can be read back) and unambiguous (`\` is doubled).
//! - Where a line is written to a terminal or log, it is made safe with
//!   [`escape_controls`], which leaves text that is already escaped as it is. So a
//!   message that embeds a name raw (an I/O error's path) can never disturb the
//!   terminal either.
//! - In JSON, a name is a string, with its exact bytes in hex beside it where it is not
//!   UTF-8 ([`BytesField`]), so that the output is always representable.

use std::borrow::Cow;

use serde::ser::{Serialize, SerializeMap, Serializer};

pub use larder_store::{escape_controls, escape_name};

/// A snapshot path as larder shows it: with a leading `/`, the source path it was
/// backed up from, escaped by [`escape_name`].
pub fn display_path(path: &[u8]) -> String {
    let mut out = String::with_capacity(path.len() + 1);
    out.push('/');
    out.push_str(&escape_name(path));
    out
}

/// Bytes under `key` as a JSON string: exact where they are UTF-8; otherwise decoded
/// lossily, with the exact bytes in hex under `KEY_hex`. Meant for
/// `#[serde(flatten)]`, as it adds one or two keys.
pub struct BytesField<'a> {
    key: &'static str,
    bytes: Cow<'a, [u8]>,
}

impl<'a> BytesField<'a> {
    pub fn new(key: &'static str, bytes: &'a [u8]) -> Self {
        Self {
            key,
            bytes: Cow::Borrowed(bytes),
        }
    }

    /// A path in a snapshot, with the leading `/` it had as a source path.
    pub fn slash_path(key: &'static str, path: &[u8]) -> Self {
        let mut bytes = Vec::with_capacity(path.len() + 1);
        bytes.push(b'/');
        bytes.extend_from_slice(path);
        Self {
            key,
            bytes: Cow::Owned(bytes),
        }
    }
}

impl Serialize for BytesField<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match std::str::from_utf8(&self.bytes) {
            Ok(text) => {
                let mut map = s.serialize_map(Some(1))?;
                map.serialize_entry(self.key, text)?;
                map.end()
            }
            Err(_) => {
                let mut map = s.serialize_map(Some(2))?;
                map.serialize_entry(self.key, &String::from_utf8_lossy(&self.bytes))?;
                let hex: String = self.bytes.iter().map(|b| format!("{b:02x}")).collect();
                map.serialize_entry(&format!("{}_hex", self.key), &hex)?;
                map.end()
            }
        }
    }
}

/// For a field of bytes named `path`, with `#[serde(flatten, serialize_with =
/// "crate::names::path_fields")]`: `path`, and `path_hex` where it is not UTF-8.
pub(crate) fn path_fields<S: Serializer>(path: &[u8], s: S) -> Result<S::Ok, S::Error> {
    BytesField::new("path", path).serialize(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_escaped_for_the_terminal() {
        assert_eq!(escape_name(b"plain name.txt"), "plain name.txt");
        assert_eq!(escape_name("é".as_bytes()), "é");
        assert_eq!(escape_name(b"a\\b"), "a\\\\b");
        assert_eq!(escape_name(b"a\nb\x1b[31m"), "a\\x0ab\\x1b[31m");
        assert_eq!(escape_name(b"\xff\xfe"), "\\xff\\xfe");
        assert_eq!(escape_name("\u{85}".as_bytes()), "\\u{85}");
        assert_eq!(escape_name("\u{9b}2J".as_bytes()), "\\u{9b}2J");
        assert_eq!(display_path(b"home/me"), "/home/me");
    }

    /// Text with names already escaped comes out of the line filter unchanged; raw
    /// controls do not.
    #[test]
    fn escaping_controls_leaves_escaped_text_alone() {
        let escaped = format!("cannot read {}: gone", display_path(b"a\\b\n\x1b\xff"));
        assert_eq!(escape_controls(escaped.as_bytes()), escaped);
        assert_eq!(
            escape_controls(b"raw a\\b\r\n\x1b[2J\xff"),
            "raw a\\b\\x0d\\x0a\\x1b[2J\\xff"
        );
    }
}
