//! RFC 3339 times for reports, written and read by hand from Unix time:
//! the runner has no date library, and reports only ever need UTC instants
//! to the millisecond (`2024-05-01T12:34:56.789Z`). Parsing accepts any
//! offset, so reports edited or made by other tools still merge.

use std::time::{SystemTime, UNIX_EPOCH};

const MILLISECONDS_PER_DAY: i64 = 86_400_000;

/// Milliseconds since the Unix epoch (negative before it).
pub fn unix_milliseconds(time: SystemTime) -> i64 {
    match time.duration_since(UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_millis()).unwrap_or(i64::MAX),
        Err(before) => -i64::try_from(before.duration().as_millis()).unwrap_or(i64::MAX),
    }
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ` for an instant given in Unix milliseconds.
pub fn format_rfc3339(unix_milliseconds: i64) -> String {
    let days = unix_milliseconds.div_euclid(MILLISECONDS_PER_DAY);
    let of_day = unix_milliseconds.rem_euclid(MILLISECONDS_PER_DAY);
    let (year, month, day) = civil_from_days(days);
    let (seconds, milliseconds) = (of_day / 1000, of_day % 1000);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{milliseconds:03}Z",
        seconds / 3600,
        seconds / 60 % 60,
        seconds % 60
    )
}

/// The Unix milliseconds of an RFC 3339 time (`2024-05-01T12:34:56Z`,
/// `2024-05-01T14:34:56.5+02:00`); fractions beyond milliseconds are cut.
pub fn parse_rfc3339(text: &str) -> Option<i64> {
    let bytes = text.as_bytes();
    let number = |range: std::ops::Range<usize>| -> Option<i64> {
        let digits = bytes.get(range)?;
        digits.iter().all(u8::is_ascii_digit).then(|| digits.iter().fold(0, |n, d| n * 10 + i64::from(d - b'0')))
    };
    let separators_fit = bytes.get(4) == Some(&b'-')
        && bytes.get(7) == Some(&b'-')
        && matches!(bytes.get(10), Some(b'T' | b't' | b' '))
        && bytes.get(13) == Some(&b':')
        && bytes.get(16) == Some(&b':');
    if !separators_fit {
        return None;
    }
    let (year, month, day) = (number(0..4)?, number(5..7)?, number(8..10)?);
    let (hour, minute, second) = (number(11..13)?, number(14..16)?, number(17..19)?);
    if !(1..=12).contains(&month) || day < 1 || day > days_in_month(year, month) {
        return None;
    }
    if hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let mut rest = &text[19..];
    let mut milliseconds = 0;
    if let Some(fraction) = rest.strip_prefix('.') {
        let digits = fraction.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let kept = &fraction[..digits.min(3)];
        milliseconds = kept.parse::<i64>().ok()? * 10_i64.pow(3 - kept.len() as u32);
        rest = &fraction[digits..];
    }
    let offset_minutes = match rest.as_bytes() {
        [b'Z' | b'z'] => 0,
        [sign @ (b'+' | b'-'), h1, h2, b':', m1, m2] => {
            let digit = |d: &u8| d.is_ascii_digit().then(|| i64::from(d - b'0'));
            let hours = digit(h1)? * 10 + digit(h2)?;
            let minutes = digit(m1)? * 10 + digit(m2)?;
            if hours > 23 || minutes > 59 {
                return None;
            }
            let total = hours * 60 + minutes;
            if *sign == b'-' {
                -total
            } else {
                total
            }
        }
        _ => return None,
    };
    let seconds = days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second - offset_minutes * 60;
    Some(seconds * 1000 + milliseconds)
}

fn is_leap_year(year: i64) -> bool {
    year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if is_leap_year(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Year, month, day of the day `days` after 1970-01-01 (Howard Hinnant's
/// `civil_from_days`: eras of 400 years, years starting in March).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let shifted = days + 719_468;
    let era = shifted.div_euclid(146_097);
    let day_of_era = shifted.rem_euclid(146_097);
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 { month_from_march + 3 } else { month_from_march - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// The inverse of [`civil_from_days`].
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let month_from_march = (month + 9) % 12;
    let day_of_year = (153 * month_from_march + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn known_instants_are_formatted() {
        assert_eq!(format_rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_rfc3339(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(format_rfc3339(951_868_800_000), "2000-03-01T00:00:00.000Z");
        assert_eq!(format_rfc3339(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
        assert_eq!(format_rfc3339(4_107_542_399_999), "2100-02-28T23:59:59.999Z");
        assert_eq!(format_rfc3339(253_402_300_799_999), "9999-12-31T23:59:59.999Z");
        assert_eq!(format_rfc3339(-1), "1969-12-31T23:59:59.999Z");
        assert_eq!(format_rfc3339(-86_400_000 * 365), "1969-01-01T00:00:00.000Z");
    }

    #[test]
    fn system_times_become_unix_milliseconds() {
        let later = UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        assert_eq!(unix_milliseconds(later), 1_700_000_000_123);
        let earlier = UNIX_EPOCH - Duration::from_millis(1500);
        assert_eq!(unix_milliseconds(earlier), -1500);
    }

    #[test]
    fn formatted_times_parse_back() {
        for milliseconds in (-400_i64 * 366 * 86_400_000..=400 * 366 * 86_400_000).step_by(86_400_000 * 7 + 3_600_123) {
            assert_eq!(parse_rfc3339(&format_rfc3339(milliseconds)), Some(milliseconds), "{milliseconds}");
        }
    }

    #[test]
    fn offsets_and_fractions_are_read() {
        assert_eq!(parse_rfc3339("2023-11-14T22:13:20Z"), Some(1_700_000_000_000));
        assert_eq!(parse_rfc3339("2023-11-15T00:13:20.5+02:00"), Some(1_700_000_000_500));
        assert_eq!(parse_rfc3339("2023-11-14t21:13:20.123456-01:00"), Some(1_700_000_000_123));
        for bad in ["", "2023-11-14", "2023-02-29T00:00:00Z", "2023-11-14T24:00:00Z", "2023-11-14T22:13:20", "x"] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
    }
}
