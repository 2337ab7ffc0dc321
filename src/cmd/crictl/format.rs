//! crictl's small formats: truncated IDs, human ages ("2 hours ago"), decimal sizes ("4.5MB"),
//! Go's `%g`, and the time layouts crictl prints (RFC 3339 with nanoseconds, Go's
//! `time.Time.String()`), all as pure functions.
//!
//! References: cri-tools `cmd/crictl/util.go` (`getTruncatedID`), docker/go-units `duration.go`
//! (`HumanDuration`) and `size.go` (`HumanSizeWithPrecision`), Go's `strconv.FormatFloat`.

/// How many characters of an ID crictl shows (`truncatedIDLen`).
pub const TRUNCATED_ID_LEN: usize = 13;

/// `id` without `prefix`, cut to 13 characters, as crictl's tables show IDs.
pub fn truncate_id<'a>(id: &'a str, prefix: &str) -> &'a str {
    let id = id.strip_prefix(prefix).unwrap_or(id);
    match id.char_indices().nth(TRUNCATED_ID_LEN) {
        Some((i, _)) => &id[..i],
        None => id,
    }
}

const NS_PER_SEC: i64 = 1_000_000_000;

/// go-units' `HumanDuration` of `ns` nanoseconds: "Less than a second", "1 second",
/// "About a minute", "3 hours", "2 weeks", ...
pub fn human_duration(ns: i64) -> String {
    let d = ns as f64;
    let seconds = (d / 1e9) as i64;
    if seconds < 1 {
        return "Less than a second".into();
    }
    if seconds == 1 {
        return "1 second".into();
    }
    if seconds < 60 {
        return format!("{seconds} seconds");
    }
    let minutes = (d / 6e10) as i64;
    if minutes == 1 {
        return "About a minute".into();
    }
    if minutes < 60 {
        return format!("{minutes} minutes");
    }
    let hours = (d / 3.6e12 + 0.5) as i64;
    if hours == 1 {
        return "About an hour".into();
    }
    if hours < 48 {
        return format!("{hours} hours");
    }
    if hours < 24 * 7 * 2 {
        return format!("{} days", hours / 24);
    }
    if hours < 24 * 30 * 2 {
        return format!("{} weeks", hours / 24 / 7);
    }
    if hours < 24 * 365 * 2 {
        return format!("{} months", hours / 24 / 30);
    }
    format!("{} years", (d / 3.6e12) as i64 / 24 / 365)
}

/// "<human duration> ago" of a creation time, as crictl's CREATED column shows it.
pub fn age(now_ns: i64, created_ns: i64) -> String {
    format!("{} ago", human_duration(now_ns.saturating_sub(created_ns)))
}

/// go-units' `HumanSizeWithPrecision`: decimal units (`B kB MB GB ...`), `precision`
/// significant digits, Go's `%g`.
pub fn human_size_with_precision(size: f64, precision: usize) -> String {
    const UNITS: [&str; 9] = ["B", "kB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB"];
    let mut size = size;
    let mut i = 0;
    while size >= 1000.0 && i < UNITS.len() - 1 {
        size /= 1000.0;
        i += 1;
    }
    format!("{}{}", go_format_g(size, precision), UNITS[i])
}

/// go-units' `HumanSize`: [`human_size_with_precision`] with 4 digits.
pub fn human_size(size: f64) -> String {
    human_size_with_precision(size, 4)
}

/// The digits and decimal exponent of `v` rounded to `digits` significant digits (`None`:
/// the shortest that round-trips), e.g. 1089183 at 3 -> ("109", 6).
fn decimal_digits(v: f64, digits: Option<usize>) -> (String, i32) {
    let s = match digits {
        Some(d) => format!("{:.*e}", d.saturating_sub(1), v.abs()),
        None => format!("{:e}", v.abs()),
    };
    let (mantissa, exp) = s.split_once('e').unwrap_or((&s, "0"));
    (mantissa.replace('.', ""), exp.parse().unwrap_or(0))
}

/// Lays out `digits` (with decimal exponent `exp`) the way Go's `%g` does: exponent form when
/// `exp < -4 || exp >= eprec`, trailing zeros dropped.
fn layout_g(negative: bool, digits: &str, exp: i32, eprec: i32) -> String {
    let digits = digits.trim_end_matches('0');
    let digits = if digits.is_empty() { "0" } else { digits };
    let sign = if negative { "-" } else { "" };
    if exp < -4 || exp >= eprec {
        let (first, rest) = digits.split_at(1);
        let frac = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let esign = if exp < 0 { '-' } else { '+' };
        return format!("{sign}{first}{frac}e{esign}{:02}", exp.unsigned_abs());
    }
    if exp < 0 {
        let zeros = "0".repeat(exp.unsigned_abs() as usize - 1);
        return format!("{sign}0.{zeros}{digits}");
    }
    let int_len = exp as usize + 1;
    if digits.len() <= int_len {
        format!("{sign}{digits}{}", "0".repeat(int_len - digits.len()))
    } else {
        format!("{sign}{}.{}", &digits[..int_len], &digits[int_len..])
    }
}

/// Go's `fmt.Sprintf("%.*g", precision, v)` for finite `v`.
pub fn go_format_g(v: f64, precision: usize) -> String {
    let precision = precision.max(1);
    if v == 0.0 {
        return "0".into();
    }
    let (digits, exp) = decimal_digits(v, Some(precision));
    layout_g(v < 0.0, &digits, exp, precision as i32)
}

/// Go's `strconv.FormatFloat(v, 'g', -1, 64)` (shortest digits; exponent form from 1e+06 or
/// below 1e-04), as YAML writes floats. Non-finite values as YAML spells them.
pub fn go_format_g_shortest(v: f64) -> String {
    if v.is_nan() {
        return ".nan".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { ".inf" } else { "-.inf" }.into();
    }
    if v == 0.0 {
        return if v.is_sign_negative() { "-0" } else { "0" }.into();
    }
    let (digits, exp) = decimal_digits(v, None);
    layout_g(v < 0.0, &digits, exp, 6)
}

// === times ===

/// A civil date and time in UTC.
struct Civil {
    year: i64,
    month: u32,
    day: u32,
    hour: u32,
    minute: u32,
    second: u32,
    nanos: u32,
}

/// Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// A civil date to days since 1970-01-01.
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil(ns: i64) -> Civil {
    let secs = ns.div_euclid(NS_PER_SEC);
    let nanos = ns.rem_euclid(NS_PER_SEC) as u32;
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400) as u32;
    let (year, month, day) = civil_from_days(days);
    Civil {
        year,
        month,
        day,
        hour: sod / 3600,
        minute: sod / 60 % 60,
        second: sod % 60,
        nanos,
    }
}

fn offset_text(offset_secs: i32, z_for_utc: bool, colon: bool) -> String {
    if offset_secs == 0 && z_for_utc {
        return "Z".into();
    }
    let sign = if offset_secs < 0 { '-' } else { '+' };
    let abs = offset_secs.unsigned_abs();
    if colon {
        format!("{sign}{:02}:{:02}", abs / 3600, abs / 60 % 60)
    } else {
        format!("{sign}{:02}{:02}", abs / 3600, abs / 60 % 60)
    }
}

fn date_time(c: &Civil, sep: char) -> String {
    format!(
        "{:04}-{:02}-{:02}{sep}{:02}:{:02}:{:02}",
        c.year, c.month, c.day, c.hour, c.minute, c.second
    )
}

/// Nanoseconds with trailing zeros dropped (`.86684199`), empty for a whole second.
fn trimmed_nanos(n: u32) -> String {
    if n == 0 {
        return String::new();
    }
    format!(".{n:09}").trim_end_matches('0').to_string()
}

/// Go's `time.Unix(0, ns).UTC().Format(time.RFC3339Nano)`: `2026-11-30T17:11:49.86684199Z`.
pub fn rfc3339_nano(ns: i64) -> String {
    let c = civil(ns);
    format!("{}{}Z", date_time(&c, 'T'), trimmed_nanos(c.nanos))
}

/// Go's zero `time.Time` in RFC 3339, what crictl prints for a time that is not set.
pub const ZERO_TIME: &str = "0001-01-01T00:00:00Z";

/// RFC 3339 with exactly nine fractional digits in the zone `offset_secs` east of UTC
/// (cri-client's `RFC3339NanoFixed`, the `logs -t` prefix).
pub fn rfc3339_nano_fixed(ns: i64, offset_secs: i32) -> String {
    let c = civil(ns + i64::from(offset_secs) * NS_PER_SEC);
    format!(
        "{}.{:09}{}",
        date_time(&c, 'T'),
        c.nanos,
        offset_text(offset_secs, true, true)
    )
}

/// Go's `time.Unix(0, ns).UTC().String()`: `2026-11-30 17:11:49.86684199 +0000 UTC`.
pub fn go_time_string(ns: i64) -> String {
    let c = civil(ns);
    format!(
        "{}{} {} UTC",
        date_time(&c, ' '),
        trimmed_nanos(c.nanos),
        offset_text(0, false, false)
    )
}

/// Parses an RFC 3339 time with any fraction (`2026-11-30T17:11:52.1Z`,
/// `2026-11-30T18:11:52+01:00`); returns nanoseconds since the epoch and the zone offset in
/// seconds.
pub fn parse_rfc3339(s: &str) -> Option<(i64, i32)> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<u32> {
        let t = s.get(r)?;
        if t.bytes().all(|c| c.is_ascii_digit()) {
            t.parse().ok()
        } else {
            None
        }
    };
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 {
        return None;
    }
    let mut i = 19;
    let mut nanos: u32 = 0;
    if b.get(i) == Some(&b'.') {
        i += 1;
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        let frac = &s[start..i];
        if frac.is_empty() {
            return None;
        }
        let padded: String = frac.chars().chain(std::iter::repeat('0')).take(9).collect();
        nanos = padded.parse().ok()?;
    }
    let offset: i32 = match s.get(i..)? {
        "Z" | "z" => 0,
        rest if rest.len() == 6 && matches!(rest.as_bytes()[0], b'+' | b'-') => {
            let h: i32 = rest.get(1..3)?.parse().ok()?;
            let m: i32 = rest.get(4..6)?.parse().ok()?;
            let v = h * 3600 + m * 60;
            if rest.starts_with('-') { -v } else { v }
        }
        _ => return None,
    };
    let days = days_from_civil(i64::from(year), month, day);
    let secs = days * 86_400 + i64::from(hour * 3600 + minute * 60 + second) - i64::from(offset);
    Some((secs * NS_PER_SEC + i64::from(nanos), offset))
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = NS_PER_SEC;

    #[test]
    fn ids_are_cut_to_thirteen_characters_after_the_prefix() {
        let id = "861cdbaeffe96760627fcc17acf84f6ded333011e9eae9e92718ceabfd2a4b25";
        assert_eq!(truncate_id(id, ""), "861cdbaeffe96");
        assert_eq!(
            truncate_id(&format!("sha256:{id}"), "sha256:"),
            "861cdbaeffe96"
        );
        assert_eq!(truncate_id("abc", ""), "abc");
    }

    #[test]
    fn ages_follow_go_units_at_every_threshold() {
        let cases: &[(i64, &str)] = &[
            (-5 * S, "Less than a second"),
            (0, "Less than a second"),
            (S - 1, "Less than a second"),
            (S, "1 second"),
            (2 * S, "2 seconds"),
            (59 * S + S / 2, "59 seconds"),
            (60 * S, "About a minute"),
            (119 * S, "About a minute"),
            (120 * S, "2 minutes"),
            (59 * 60 * S, "59 minutes"),
            (60 * 60 * S, "About an hour"),
            (89 * 60 * S, "About an hour"),
            (90 * 60 * S, "2 hours"),
            (47 * 3600 * S, "47 hours"),
            (48 * 3600 * S, "2 days"),
            (13 * 24 * 3600 * S, "13 days"),
            (14 * 24 * 3600 * S, "2 weeks"),
            (59 * 24 * 3600 * S, "8 weeks"),
            (60 * 24 * 3600 * S, "2 months"),
            (729 * 24 * 3600 * S, "24 months"),
            (730 * 24 * 3600 * S, "2 years"),
        ];
        for (ns, want) in cases {
            assert_eq!(human_duration(*ns), *want, "{ns} ns");
        }
        assert_eq!(age(100 * S, 90 * S), "10 seconds ago");
    }

    #[test]
    fn sizes_are_decimal_with_go_g_precision() {
        assert_eq!(human_size_with_precision(0.0, 3), "0B");
        assert_eq!(human_size_with_precision(1_089_183.0, 3), "1.09MB");
        assert_eq!(human_size_with_precision(999.0, 3), "999B");
        assert_eq!(human_size_with_precision(999_999.0, 3), "1e+03kB");
        assert_eq!(human_size(475_136.0), "475.1kB");
        assert_eq!(human_size(8192.0), "8.192kB");
        assert_eq!(human_size(212_992.0), "213kB");
        assert_eq!(human_size(2_101_248.0), "2.101MB");
        assert_eq!(human_size(4_500_000.0), "4.5MB");
        assert_eq!(human_size(1e27), "1000YB");
    }

    #[test]
    fn go_g_formats_like_fmt_and_strconv() {
        assert_eq!(go_format_g(100.0, 3), "100");
        assert_eq!(go_format_g(0.000_123_4, 3), "0.000123");
        assert_eq!(go_format_g(0.000_012_34, 3), "1.23e-05");
        assert_eq!(go_format_g(-2.5, 3), "-2.5");
        assert_eq!(go_format_g_shortest(1.5), "1.5");
        assert_eq!(go_format_g_shortest(123_456.0), "123456");
        assert_eq!(go_format_g_shortest(1_234_567.0), "1.234567e+06");
        assert_eq!(go_format_g_shortest(1e21), "1e+21");
        assert_eq!(go_format_g_shortest(0.0001), "0.0001");
        assert_eq!(go_format_g_shortest(0.00001), "1e-05");
    }

    #[test]
    fn times_print_in_go_layouts() {
        let ns = 1_796_058_709_866_841_990;
        assert_eq!(rfc3339_nano(ns), "2026-11-30T17:11:49.86684199Z");
        assert_eq!(rfc3339_nano(ns - 866_841_990), "2026-11-30T17:11:49Z");
        assert_eq!(go_time_string(ns), "2026-11-30 17:11:49.86684199 +0000 UTC");
        assert_eq!(rfc3339_nano_fixed(ns, 0), "2026-11-30T17:11:49.866841990Z");
        assert_eq!(
            rfc3339_nano_fixed(ns, 3600),
            "2026-11-30T18:11:49.866841990+01:00"
        );
        assert_eq!(rfc3339_nano(0), "1970-01-01T00:00:00Z");
    }

    #[test]
    fn rfc3339_parses_any_fraction_and_offset() {
        let ns = 1_796_058_709_866_841_990;
        assert_eq!(
            parse_rfc3339("2026-11-30T17:11:49.86684199Z"),
            Some((ns, 0))
        );
        assert_eq!(
            parse_rfc3339("2026-11-30T18:11:49.86684199+01:00"),
            Some((ns, 3600))
        );
        assert_eq!(
            parse_rfc3339("2026-11-30T17:11:49Z"),
            Some((ns - 866_841_990, 0))
        );
        assert_eq!(parse_rfc3339("2026-11-30"), None);
        assert_eq!(parse_rfc3339("2026-11-30T17:11:49.Z"), None);
        for ns in [0, 951_782_400 * S + 5, ns] {
            assert_eq!(parse_rfc3339(&rfc3339_nano(ns)), Some((ns, 0)));
        }
    }
}
