//! The properties the fuzz targets check, one function per target. Each takes the fuzzer's raw
//! bytes, runs the parser or encoder on them, and panics (which the fuzzer reports as a crash)
//! when the code panics itself or breaks a property that must hold for every input: a parsed
//! value that does not survive its own round trip, an encoder whose output another decoder reads
//! back differently, a credential that shows in a `Debug` string.
//!
//! `fuzz/run.sh` builds them with libFuzzer's instrumentation and runs them.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::str::FromStr;

use kruised::controller::httpget::{self, Get, GetErrorKind, Reader};
use kruised::controller::imagepull::credprovider;
use kruised::controller::imagepull::keyring::{self, Keyring};
use kruised::controller::imagepull::reference::{self, Reference};
use kruised::cri::{Endpoint, EndpointSource};
use kruised::gojson::{self, Dialect, GoValue};
use kruised::k8s::keys;
use serde_json::Value;

fn text(data: &[u8]) -> String {
    String::from_utf8_lossy(data).into_owned()
}

/// The annotation parsers of `k8s/keys.rs`: never a panic; what parses survives a round trip
/// through the daemon's own encoding (`to_annotation_value` is what the daemon writes and compares
/// before patching, so a set that does not read back equal would be patched forever).
pub fn keys(data: &[u8]) {
    let value = text(data);
    let annotations = |key: &str| BTreeMap::from([(key.to_string(), value.clone())]);

    if let Ok(Some(set)) =
        keys::parse_runtime_containers_meta(&annotations(keys::RUNTIME_CONTAINERS_META))
    {
        let written = set.to_annotation_value();
        let again = keys::parse_runtime_containers_meta(&BTreeMap::from([(
            keys::RUNTIME_CONTAINERS_META.to_string(),
            written.clone(),
        )]))
        .expect("the daemon's own annotation parses")
        .expect("present");
        assert_eq!(
            again, set,
            "runtime-containers-meta round trip via {written}"
        );
        assert_eq!(
            again.to_annotation_value(),
            written,
            "equal sets give equal strings"
        );
        let generic: Value = serde_json::from_str(&written).expect("valid JSON");
        assert!(generic["containers"].is_array(), "{written}");
    }
    // read-only for the daemon: they must parse or fail, never panic; the old key is the
    // fallback of the new one
    let new = keys::parse_inplace_update_state(&annotations(keys::INPLACE_UPDATE_STATE));
    let old = keys::parse_inplace_update_state(&annotations(keys::INPLACE_UPDATE_STATE_OLD));
    match (new, old) {
        (Ok(a), Ok(b)) => assert_eq!(a, b, "the old key reads like the new one"),
        (Err(_), Err(_)) => {}
        (a, b) => panic!("the old key reads differently: {a:?} vs {b:?}"),
    }
    let _ = keys::parse_sync_container_statuses(&annotations(keys::CRR_SYNC_CONTAINER_STATUSES));
    if let Ok(Some(t)) = keys::parse_unready_acquired(&annotations(keys::CRR_UNREADY_ACQUIRED)) {
        let again = keys::parse_unready_acquired(&BTreeMap::from([(
            keys::CRR_UNREADY_ACQUIRED.to_string(),
            t.to_string(),
        )]))
        .expect("its own RFC3339 form parses")
        .expect("present");
        assert_eq!(again, t);
    }
}

/// Image references: never a panic; normalisation is idempotent (a normalised reference parses
/// to itself, so `nginx` and `docker.io/library/nginx` pull once); the pull key and (but for
/// docker's own ambiguity) the familiar name name the same repository.
pub fn reference(data: &[u8]) {
    let s = text(data);
    if let Ok(r) = Reference::parse(&s) {
        assert!(!r.domain.is_empty() && !r.path.is_empty(), "{s:?} -> {r:?}");
        assert!(
            !r.path.chars().any(|c| c.is_ascii_uppercase()),
            "{s:?} -> {r:?}"
        );
        let shown = r.to_string();
        let again = Reference::parse(&shown)
            .unwrap_or_else(|e| panic!("{s:?} normalised to {shown:?}, which fails: {e}"));
        assert_eq!(again, r, "{s:?} -> {shown:?}");
        let key = r.pull_key();
        let keyed = Reference::parse(&key)
            .unwrap_or_else(|e| panic!("pull key {key:?} of {s:?} fails: {e}"));
        assert_eq!(keyed.pull_key(), key, "the pull key is stable");
        assert_eq!(keyed.name(), r.name());
        // docker's FamiliarName has one ambiguity, kept for compatibility: a Docker Hub path
        // whose first component looks like a host (`docker.io/a.b/c` -> `a.b/c`) reads back as
        // that host, or not at all (both found by this target; the daemon never parses a
        // familiar name back)
        let familiar = r.familiar_name();
        let first = r.path.split('/').next().unwrap_or_default();
        let looks_like_host = first.contains(['.', ':']) || first == "localhost";
        if !(r.domain == reference::DEFAULT_DOMAIN && looks_like_host) {
            let short = Reference::parse(&familiar)
                .unwrap_or_else(|e| panic!("familiar name {familiar:?} of {s:?} fails: {e}"));
            assert_eq!(
                short.name(),
                r.name(),
                "{familiar:?} names another repository"
            );
        }
        if let Some(t) = &r.tag {
            assert!(reference::is_tag(t));
        }
        if let Some(d) = &r.digest {
            assert!(reference::is_digest(d));
        }
    }
    // the NodeImage spelling: the name, then a tag or digest on the next line
    if let Some((name, tag)) = s.split_once('\n')
        && let Ok(r) = Reference::from_name_tag(name, tag)
    {
        assert!(r.tag.is_some() != r.digest.is_some(), "{name:?} {tag:?}");
        let again = Reference::parse(&r.pull_key()).expect("the pull key parses");
        assert_eq!(again.pull_key(), r.pull_key());
    }
}

/// Docker config files and the kubelet's keyring matching: never a panic, never a password in a
/// `Debug` string, base64 that round-trips, and a location without glob characters matches
/// itself.
pub fn keyring(data: &[u8]) {
    let mut ring = Keyring::default();
    let json_ok = ring.add_config_json(data).is_ok();
    let cfg_ok = ring.add_dockercfg(data).is_ok();
    if json_ok || cfg_ok {
        let shown = format!("{ring:?}");
        for image in [
            "nginx",
            "docker.io/library/nginx",
            "r.io/a/b",
            "127.0.0.1:5000/x/y",
        ] {
            for cred in ring.lookup(image) {
                if cred.password.len() >= 8 && !shown.contains("<redacted>") {
                    panic!("a keyring with credentials does not redact: {shown}");
                }
                if cred.password.len() >= 8
                    && !cred.username.contains(&cred.password)
                    && !ring.secrets().iter().any(|s| s.contains(&cred.password))
                {
                    assert!(!shown.contains(&cred.password), "password in {shown}");
                }
            }
        }
    }
    // the matcher on two arbitrary locations (glob, then target), split at the first newline
    let s = text(data);
    let (glob, target) = s.split_once('\n').unwrap_or((&s, ""));
    let _ = keyring::urls_match(glob, target);
    if !glob.contains(['*', '?', '[', '\\']) {
        assert!(
            keyring::urls_match(glob, glob),
            "{glob:?} does not match itself"
        );
    }
    // base64 both ways
    let encoded = keyring::base64_encode(data);
    assert_eq!(keyring::base64_decode(&encoded).as_deref(), Some(data));
    if let Some(decoded) = keyring::base64_decode(&s) {
        assert_eq!(
            keyring::base64_encode(&decoded).trim_end_matches('='),
            s.trim_end_matches('='),
            "base64 of {s:?} is not canonical"
        );
    }
}

/// Credential provider configs (YAML or JSON) and plugin answers: never a panic; what a config
/// accepts are providers with usable, distinct names.
pub fn credprovider(data: &[u8]) {
    let s = text(data);
    if let Ok(providers) = credprovider::parse::config(&s) {
        assert!(!providers.is_empty());
        let mut names: Vec<&str> = providers.iter().map(|(n, _)| n.as_str()).collect();
        for n in &names {
            assert!(!n.is_empty() && !n.contains(['/', ' ']) && *n != "." && *n != "..");
            assert!(PathBuf::from(n).components().count() == 1, "{n:?}");
        }
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), providers.len(), "duplicate names accepted");
    }
    for version in [
        "credentialprovider.kubelet.k8s.io/v1",
        "credentialprovider.kubelet.k8s.io/v1alpha1",
    ] {
        if let Ok(answer) = credprovider::parse::response(data, version) {
            let _ = format!("{answer:?}");
        }
    }
    let _ = credprovider::parse_go_duration(&s);
}

/// The Go-JSON encoder: for any JSON document, what it writes is valid JSON that serde_json
/// reads back as the same document (floats to within rounding), with Go's HTML escaping; for
/// any bytes as a Go string, one U+FFFD per byte that is not valid UTF-8, as Go writes them.
pub fn gojson(data: &[u8]) {
    if let Ok(v) = serde_json::from_slice::<Value>(data) {
        let go = GoValue::from(&v);
        for dialect in [Dialect::Go122, Dialect::PreGo122] {
            let out = gojson::marshal_with(&go, dialect);
            let text = std::str::from_utf8(&out).expect("Go JSON is UTF-8");
            assert!(
                !text.contains(['<', '>', '&', '\u{2028}', '\u{2029}']),
                "not HTML-escaped: {text}"
            );
            let back: Value =
                serde_json::from_str(text).unwrap_or_else(|e| panic!("invalid JSON {text:?}: {e}"));
            assert!(same_json(&back, &v), "{v} encoded as {text}");
        }
    }
    let out = gojson::marshal(&GoValue::ByteString(data.to_vec()));
    let text = std::str::from_utf8(&out).expect("Go JSON is UTF-8");
    let back: String =
        serde_json::from_str(text).unwrap_or_else(|e| panic!("invalid JSON {text:?}: {e}"));
    assert_eq!(back, go_lossy(data), "bytes {data:?} encoded as {text}");
}

/// Go's view of bytes as a string: each byte that does not start a valid UTF-8 sequence is one
/// U+FFFD (`utf8.DecodeRune` returns `(RuneError, 1)`).
fn go_lossy(data: &[u8]) -> String {
    let mut s = String::new();
    for chunk in data.utf8_chunks() {
        s.push_str(chunk.valid());
        for _ in chunk.invalid() {
            s.push('\u{fffd}');
        }
    }
    s
}

fn same_json(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            match (x.as_i64(), y.as_i64(), x.as_u64(), y.as_u64()) {
                (Some(p), Some(q), _, _) => p == q,
                (_, _, Some(p), Some(q)) => p == q,
                _ => {
                    let (p, q) = (
                        x.as_f64().unwrap_or(f64::NAN),
                        y.as_f64().unwrap_or(f64::NAN),
                    );
                    p == q || (p - q).abs() <= p.abs().max(q.abs()) * 4.0 * f64::EPSILON
                }
            }
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same_json(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, p)| y.get(k).is_some_and(|q| same_json(p, q)))
        }
        _ => a == b,
    }
}

/// CRI endpoints: never a panic; an endpoint that parses prints as `unix://` + an absolute path
/// that parses back to itself; kruise's `--socket-file` with any name gives one candidate.
pub fn endpoint(data: &[u8]) {
    let s = text(data);
    if let Ok(e) = Endpoint::from_str(&s) {
        assert!(e.path().is_absolute(), "{s:?} -> {e:?}");
        let shown = e.to_string();
        assert!(shown.starts_with("unix:///"), "{shown}");
        let again = Endpoint::from_str(&shown)
            .unwrap_or_else(|err| panic!("{s:?} shown as {shown:?}, which fails: {err}"));
        assert_eq!(again, e);
    }
    let source = EndpointSource::SocketFile {
        host_run_dir: PathBuf::from("/var/run"),
        name: s,
    };
    assert_eq!(source.candidates().len(), 1);
    let _ = source.describe();
}

/// The HTTP response reader of probes and hooks (`controller/httpget.rs`), fed the bytes in
/// pieces whose sizes the input's first byte chooses: never a panic; never more taken than a
/// head and a body's limits; each byte looked at a bounded number of times however the bytes
/// are cut; an answer's body within the limit.
pub fn http_response(data: &[u8]) {
    let (step, rest) = match data.split_first() {
        Some((s, rest)) => (usize::from(*s).max(1), rest),
        None => return,
    };
    let mut r = Reader::default();
    let mut done = false;
    for piece in rest.chunks(step) {
        match r.push(piece) {
            Ok(true) => {
                done = true;
                break;
            }
            Ok(false) => {}
            Err(GetErrorKind::HeadTooLong) => {
                assert!(
                    r.taken() >= httpget::HEAD_LIMIT,
                    "too long at {}",
                    r.taken()
                );
                return;
            }
            Err(e) => panic!("push fails only for a long head: {e:?}"),
        }
        assert!(r.taken() <= httpget::HEAD_LIMIT + httpget::BODY_LIMIT);
        assert!(
            r.scanned() <= 4 * r.taken() + 4 * rest.len().div_ceil(step),
            "{} looked at for {} taken",
            r.scanned(),
            r.taken()
        );
    }
    let _ = done;
    if let Ok((answer, _)) = r.finish() {
        assert!(
            answer.body.len() <= 4 * httpget::BODY_LIMIT,
            "lossy UTF-8 at most triples"
        );
        assert!((100..1000).contains(&answer.status));
    }
}

/// The request head of probes and hooks (`controller/httpget.rs`): a path and one header from
/// the input (split at `|`): either refused, or a head whose lines are
/// exactly the request line and the headers, none holding a CR, LF or NUL of the input's.
pub fn http_request(data: &[u8]) {
    let input = text(data);
    let mut parts = input.splitn(3, '|');
    let path = parts.next().unwrap_or_default().to_string();
    let name = parts.next().unwrap_or("X-Fuzz").to_string();
    let value = parts.next().unwrap_or_default().to_string();
    let headers = [(name, value)];
    let get = Get {
        host: "10.0.0.1",
        port: 8080,
        https: false,
        path: &path,
        headers: &headers,
        user_agent: "kube-probe/1.36",
    };
    let Ok(head) = httpget::request_head(&get, &path) else {
        return;
    };
    let body = head
        .strip_suffix("\r\n\r\n")
        .expect("a head ends with a blank line");
    let lines: Vec<&str> = body.split("\r\n").collect();
    // the request line, Connection, Host, User-Agent, Accept (each unless the header replaces
    // it), and the header (unless it is an empty Accept)
    assert!(lines.len() <= 6, "{lines:?}");
    for l in &lines {
        assert!(
            !l.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0),
            "a control character in {l:?}"
        );
    }
    assert!(lines[0].starts_with("GET ") && lines[0].ends_with(" HTTP/1.1"));
    assert_eq!(lines[0].matches(' ').count(), 2, "{}", lines[0]);
}
