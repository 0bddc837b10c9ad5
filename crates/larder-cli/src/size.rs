//! Byte sizes on the command line: `8192`, `8KiB`, `8K`, `1MiB`, `1M`.

/// Parses a size; suffixes are binary (K = KiB = 1024).
pub fn parse(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, suffix) = s.split_at(split);
    let n: usize = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a size (try 8KiB)"))?;
    let mult: usize = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        other => {
            return Err(format!(
                "unknown size suffix {other:?} (use KiB, MiB or GiB)"
            ))
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("{s:?} is too large"))
}

/// Parses a size that must not be zero.
pub fn parse_nonzero(s: &str) -> Result<usize, String> {
    match parse(s)? {
        0 => Err(format!(
            "{:?} is zero; give a size of at least one byte",
            s.trim()
        )),
        n => Ok(n),
    }
}

#[cfg(test)]
mod tests {
    use super::{parse, parse_nonzero};

    #[test]
    fn parses_suffixes() {
        assert_eq!(parse("8192"), Ok(8192));
        assert_eq!(parse("2KiB"), Ok(2048));
        assert_eq!(parse("64k"), Ok(65536));
        assert_eq!(parse("1MiB"), Ok(1 << 20));
        assert!(parse("8XB").is_err());
        assert!(parse("KiB").is_err());
    }

    #[test]
    fn nonzero_sizes_refuse_zero_in_any_unit() {
        assert_eq!(parse_nonzero("1"), Ok(1));
        assert!(parse_nonzero("0").is_err());
        assert!(parse_nonzero("0MiB").is_err());
    }
}
