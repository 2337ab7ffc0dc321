//! Small helpers: RFC 3339 timestamps, UIDs, `generateName` suffixes, query
//! string decoding and the metadata validation the real server performs
//! (DNS names, label and annotation keys and values).

use serde_json::{Map, Value};

/// A fresh UUID-v4-shaped string.
pub fn new_uid() -> String {
    let (a, b) = (fastrand::u64(..), fastrand::u64(..));
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
    (0..5)
        .map(|_| char::from(ALPHABET[fastrand::usize(..ALPHABET.len())]))
        .collect()
}

/// Current time as `2006-01-02T15:04:05Z`.
pub fn now_rfc3339() -> String {
    format_rfc3339(jiff::Timestamp::now().as_second())
}

/// Format Unix seconds as an RFC 3339 UTC timestamp.
pub fn format_rfc3339(secs: i64) -> String {
    let t = jiff::Timestamp::from_second(secs).unwrap_or(jiff::Timestamp::UNIX_EPOCH);
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// Decode a percent-encoded path segment.
pub fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

/// The percent-decoded segments of a URL path.
pub fn segments(path: &str) -> Vec<String> {
    path.split('/')
        .filter(|s| !s.is_empty())
        .map(percent_decode)
        .collect()
}

/// Split a query string into decoded `(key, value)` pairs (`+` is a space).
pub fn parse_query(q: &str) -> Vec<(String, String)> {
    form_urlencoded::parse(q.as_bytes()).into_owned().collect()
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
        let invalid = "FieldValueInvalid";
        let map = match meta.get(field) {
            None | Some(Value::Null) => continue,
            Some(Value::Object(map)) => map,
            Some(_) => {
                bad(invalid, "must be a map of strings".into());
                continue;
            }
        };
        let labels = field == "labels";
        let mut total = 0;
        for (k, v) in map {
            total += k.len() + v.as_str().map_or(0, str::len);
            let key = if labels { k.clone() } else { k.to_lowercase() };
            if !is_qualified_name(&key) {
                bad(invalid, format!("Invalid value: {k:?}: {NAME_PART}"));
            }
            match v.as_str() {
                Some(s) if !labels || is_label_value(s) => {}
                _ if labels => bad(invalid, format!("Invalid value: {v}: {LABEL_VALUE}")),
                _ => bad(invalid, format!("Invalid value: {v}: must be a string")),
            }
        }
        if !labels && total > 256 * 1024 {
            let why = "Too long: must have at most 262144 bytes";
            bad("FieldValueTooLong", why.into());
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
        assert_eq!(percent_decode("a%3Db+c%2"), "a=b+c%2");
        assert_eq!(
            parse_query("s=a%3Db+c&w"),
            [("s".into(), "a=b c".into()), ("w".into(), String::new())]
        );
        assert!(is_dns_subdomain("node-1.example"));
        assert!(!is_dns_subdomain("Node"));
        assert!(is_qualified_name("apps.kruise.io/foo_bar"));
        assert!(!is_label_value("-x"));
        assert_ne!(new_uid(), new_uid());
        assert_eq!(name_suffix().len(), 5);
    }
}
