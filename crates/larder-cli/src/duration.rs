//! Durations on the command line: `500ms`, `30s`, `5m`, `2h` (a bare number is seconds).

use std::time::Duration;

/// Parses a duration: a number with a unit, `500ms`, `30s`, `5m`, `2h` (a bare number
/// is seconds).
pub fn parse(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let n: f64 = number
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (try 30s, 5m or 1h)"))?;
    let scale = match unit.trim() {
        "ms" => 1e-3,
        "" | "s" => 1.0,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        other => {
            return Err(format!(
                "unknown duration unit {other:?} (use ms, s, m or h)"
            ))
        }
    };
    Duration::try_from_secs_f64(n * scale).map_err(|e| format!("{s:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::parse;
    use std::time::Duration;

    #[test]
    fn durations() {
        assert_eq!(parse("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse("1.5m"), Ok(Duration::from_secs(90)));
        assert_eq!(parse("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse("250ms"), Ok(Duration::from_millis(250)));
        assert!(parse("5 parsecs").is_err());
        assert!(parse("s").is_err());
        assert!(parse("-1s").is_err());
    }
}
