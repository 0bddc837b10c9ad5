//! Names from trees, the file system and storage made safe to print. Any of them may
//! be hostile: a file name can hold an escape sequence that clears the screen, a
//! newline that forges a line of output, or bytes that are not UTF-8. The rules for
//! where each function applies are in larder-engine's `names.rs`.

use std::fmt::Write as _;

/// `name` made safe to print: `\` becomes `\\`, a control character `\xNN` (ASCII)
/// or `\u{N}` (other), and a byte that is not part of valid UTF-8 `\xNN`. Names that
/// need none of this print as they are.
pub fn escape_name(name: &[u8]) -> String {
    escape(name, true)
}

/// `text` made safe to write to a terminal: as [`escape_name`], except that `\` stays
/// as it is, so that text with names already escaped comes out unchanged.
pub fn escape_controls(text: &[u8]) -> String {
    escape(text, false)
}

fn escape(bytes: &[u8], backslash: bool) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' if backslash => out.push_str("\\\\"),
                // Writing to a String cannot fail.
                c if c.is_ascii_control() => {
                    let _ = write!(out, "\\x{:02x}", u32::from(c));
                }
                c if c.is_control() => {
                    let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
                }
                c => out.push(c),
            }
        }
        for byte in chunk.invalid() {
            let _ = write!(out, "\\x{byte:02x}");
        }
    }
    out
}
