//! Civil UTC times from Unix times, for snapshot times and listed mtimes.

use std::time::SystemTime;

/// `t` as RFC 3339 in UTC with nanoseconds, e.g. `2026-11-22T15:04:05.123456789Z`;
/// times before 1970 print as 1970.
pub(crate) fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    utc_rfc3339(
        i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        d.subsec_nanos(),
    )
}

/// `sec` seconds and `nsec` nanoseconds after the Unix epoch (before it if `sec` is
/// negative) as RFC 3339 in UTC with nanoseconds. Defined for every `i64`: years
/// after 9999 print with more digits, years before 1 with a sign. An `nsec` above
/// 999,999,999 (only a damaged tree holds one) prints as 999,999,999.
pub fn utc_rfc3339(sec: i64, nsec: u32) -> String {
    let (days, rem) = (sec.div_euclid(86_400), sec.rem_euclid(86_400));
    // Civil-from-days (Howard Hinnant's algorithm) for the proleptic Gregorian
    // calendar. No step overflows: |days| < 1.1e14, so |year| < 3e11.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:09}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        nsec.min(999_999_999)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn rfc3339_formats_known_instants() {
        let t = SystemTime::UNIX_EPOCH + Duration::new(1_700_000_000, 5);
        assert_eq!(rfc3339(t), "2023-11-14T22:13:20.000000005Z");
        assert_eq!(
            rfc3339(SystemTime::UNIX_EPOCH),
            "1970-01-01T00:00:00.000000000Z"
        );
        let leap = SystemTime::UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(rfc3339(leap), "2000-02-29T00:00:00.000000000Z");
    }

    #[test]
    fn times_before_1970_and_extremes() {
        assert_eq!(utc_rfc3339(-1, 5), "1969-12-31T23:59:59.000000005Z");
        assert_eq!(utc_rfc3339(-1_000_000, 0), "1969-12-20T10:13:20.000000000Z");
        assert_eq!(
            utc_rfc3339(0, 2_000_000_000),
            "1970-01-01T00:00:00.999999999Z"
        );
        for sec in [i64::MIN, i64::MAX, i64::MIN + 1, i64::MAX - 1] {
            let s = utc_rfc3339(sec, u32::MAX);
            assert!(s.ends_with(".999999999Z"), "{s}");
        }
    }
}
