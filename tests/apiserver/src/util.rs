//! Small helpers: RFC 3339 timestamps, UIDs, `generateName` suffixes, query
//! string decoding and the metadata validation the real server performs
//! (DNS names, label and annotation keys and values).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value};

static SEQ: AtomicU64 = AtomicU64::new(0);

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn random_u64() -> u64 {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    splitmix(nanos ^ splitmix(SEQ.fetch_add(1, Ordering::Relaxed)))
}

/// A fresh UUID-v4-shaped string.
pub fn new_uid() -> String {
    let a = random_u64();
    let b = random_u64();
    format!(
        "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xfff,
        0x8000 | ((b >> 48) & 0x3fff),
        b & 0xffff_ffff_ffff
    )
}

/// Five characters from the alphabet the real server uses for `generateName`.
pub fn name_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut r = random_u64();
    (0..5)
        .map(|_| {
            let c = ALPHABET[(r % ALPHABET.len() as u64) as usize] as char;
            r /= ALPHABET.len() as u64;
            c
        })
        .collect()
}

/// Current time as `2006-01-02T15:04:05Z`.
pub fn now_rfc3339() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    format_rfc3339(secs)
}

/// Format Unix seconds as an RFC 3339 UTC timestamp.
pub fn format_rfc3339(secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

/// Decode `application/x-www-form-urlencoded` text (`+` is a space).
pub fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = b
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok());
        match (b[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'+', _) => out.push(b' '),
            (b'%', Some(h)) => {
                out.push(h);
                i += 2;
            }
            (c, _) => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Split a query string into decoded `(key, value)` pairs.
pub fn parse_query(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (percent_decode(k), percent_decode(v)),
            None => (percent_decode(p), String::new()),
        })
        .collect()
}

fn is_dns_part(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// Whether `s` is an RFC 1123 DNS label (what namespace names must be).
pub fn is_dns_label(s: &str) -> bool {
    s.len() <= 63 && is_dns_part(s)
}

/// Why `s` cannot be a path segment (apimachinery's `IsValidPathSegmentName`), if it cannot:
/// what RBAC object names and the names the authorizer reads from field selectors must be.
pub fn path_segment_problem(s: &str) -> Option<&'static str> {
    match s {
        "." => Some("may not be '.'"),
        ".." => Some("may not be '..'"),
        _ if s.contains('/') => Some("may not contain '/'"),
        _ if s.contains('%') => Some("may not contain '%'"),
        _ => None,
    }
}

/// Whether `s` is an RFC 1123 DNS subdomain (what most object names must be).
pub fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns_part)
}

fn is_qualified_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// Whether `key` is a valid label or annotation key (`[prefix/]name`).
pub fn is_qualified_name(key: &str) -> bool {
    match key.split_once('/') {
        Some((prefix, name)) => is_dns_subdomain(prefix) && is_qualified_name_part(name),
        None => is_qualified_name_part(key),
    }
}

/// Whether `v` is a valid label value.
pub fn is_label_value(v: &str) -> bool {
    v.is_empty() || is_qualified_name_part(v)
}

const NAME_PART: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const LABEL_VALUE: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";

/// Validation failures for `metadata.labels` and `metadata.annotations`, as
/// `(field, reason, message)` causes.
pub fn validate_meta(meta: &Map<String, Value>) -> Vec<(String, &'static str, String)> {
    let mut causes = Vec::new();
    for field in ["labels", "annotations"] {
        let mut bad = |reason, msg: String| causes.push((format!("metadata.{field}"), reason, msg));
        let map = match meta.get(field) {
            None | Some(Value::Null) => continue,
            Some(Value::Object(map)) => map,
            Some(_) => {
                bad("FieldValueInvalid", "must be a map of strings".into());
                continue;
            }
        };
        let labels = field == "labels";
        let mut total = 0;
        for (k, v) in map {
            total += k.len() + v.as_str().map_or(0, str::len);
            let key = if labels { k.clone() } else { k.to_lowercase() };
            if !is_qualified_name(&key) {
                bad(
                    "FieldValueInvalid",
                    format!("Invalid value: {k:?}: {NAME_PART}"),
                );
            }
            match v.as_str() {
                Some(s) if !labels || is_label_value(s) => {}
                _ if labels => bad(
                    "FieldValueInvalid",
                    format!("Invalid value: {v}: {LABEL_VALUE}"),
                ),
                _ => bad(
                    "FieldValueInvalid",
                    format!("Invalid value: {v}: must be a string"),
                ),
            }
        }
        if !labels && total > 256 * 1024 {
            bad(
                "FieldValueTooLong",
                "Too long: must have at most 262144 bytes".into(),
            );
        }
    }
    causes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_and_names() {
        assert_eq!(format_rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(percent_decode("a%3Db+c%2"), "a=b c%2");
        assert!(is_dns_subdomain("node-1.example"));
        assert!(!is_dns_subdomain("Node"));
        assert!(is_qualified_name("apps.kruise.io/foo_bar"));
        assert!(!is_label_value("-x"));
        assert_ne!(new_uid(), new_uid());
        assert_eq!(name_suffix().len(), 5);
    }
}
