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
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:09}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        nsec.min(999_999_999)
    )
}

/// (year, month, day) of `days` since 1970-01-01 in the proleptic Gregorian calendar
/// (Howard Hinnant's civil-from-days). No step overflows for any day an `i64` of
/// seconds reaches: |days| < 1.1e14, so |year| < 3e11.
pub(crate) fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's
/// days-from-civil, the inverse of the algorithm in [`utc_rfc3339`]).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if month > 2 { month - 3 } else { month + 9 };
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Seconds since the Unix epoch of a UTC RFC 3339 time as snapshots store it
/// (`YYYY-MM-DDTHH:MM:SS[.fraction]Z`); `None` for anything else.
pub fn parse_utc_rfc3339(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || b[10] != b'T'
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let t = s.get(r)?;
        t.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| t.parse().ok())?
    };
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, min, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let rest = &s[19..];
    let fraction_ok = match rest.strip_suffix('Z')?.strip_prefix('.') {
        Some(f) => !f.is_empty() && f.bytes().all(|c| c.is_ascii_digit()),
        None => rest == "Z",
    };
    if !fraction_ok
        || !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || min > 59
        || sec > 60
    {
        return None;
    }
    Some(days_from_civil(year, month, day) * 86_400 + hour * 3600 + min * 60 + sec)
}

/// Like [`parse_utc_rfc3339`], with the fraction of a second as nanoseconds (digits
/// past the ninth are dropped: the time is rounded down).
pub(crate) fn parse_utc_rfc3339_nanos(s: &str) -> Option<(i64, u32)> {
    let sec = parse_utc_rfc3339(s)?;
    let fraction = s[19..].trim_end_matches('Z').trim_start_matches('.');
    let digits: String = fraction
        .chars()
        .chain(std::iter::repeat('0'))
        .take(9)
        .collect();
    Some((sec, digits.parse().ok()?))
}

/// The local time zone's offset from UTC at `sec` (seconds since the Unix epoch), in
/// seconds east of UTC; 0 if the C library cannot tell.
pub fn local_offset(sec: i64) -> i64 {
    let t: libc::time_t = sec;
    // SAFETY: `tm` is plain data that localtime_r fills; both pointers are valid for
    // the call, and localtime_r is the reentrant form.
    unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&t, &mut tm).is_null() {
            return 0;
        }
        tm.tm_gmtoff
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_inverts_format() {
        for sec in [
            0,
            1,
            951_782_400,
            1_700_000_000,
            -1_000_000,
            253_402_300_799,
        ] {
            assert_eq!(
                parse_utc_rfc3339(&utc_rfc3339(sec, 123)),
                Some(sec),
                "{sec}"
            );
        }
        assert_eq!(
            parse_utc_rfc3339("2023-11-14T22:13:20Z"),
            Some(1_700_000_000)
        );
        for bad in [
            "",
            "2023-11-14 22:13:20Z",
            "2023-13-14T22:13:20Z",
            "2023-11-14T22:13:20",
            "2023-11-14T22:13:20.Z",
            "2023-11-14T22:13:20+01:00",
            "2023-1a-14T22:13:20Z",
        ] {
            assert_eq!(parse_utc_rfc3339(bad), None, "{bad}");
        }
    }

    #[test]
    fn days_round_trip_through_the_calendar() {
        for days in (-800_000..800_000)
            .step_by(997)
            .chain([0, -1, 11_016, 11_017])
        {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }
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
    fn fractions_parse_to_nanoseconds_rounded_down() {
        assert_eq!(
            parse_utc_rfc3339_nanos("2023-11-14T22:13:20.000000005Z"),
            Some((1_700_000_000, 5))
        );
        assert_eq!(
            parse_utc_rfc3339_nanos("2023-11-14T22:13:20.5Z"),
            Some((1_700_000_000, 500_000_000))
        );
        assert_eq!(
            parse_utc_rfc3339_nanos("2023-11-14T22:13:20.1234567899Z"),
            Some((1_700_000_000, 123_456_789))
        );
        assert_eq!(
            parse_utc_rfc3339_nanos("2023-11-14T22:13:20Z"),
            Some((1_700_000_000, 0))
        );
        assert_eq!(parse_utc_rfc3339_nanos("2023-11-14T22:13:20.Z"), None);
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
