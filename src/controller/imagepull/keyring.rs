//! Registry credentials from docker config files, matched to images the way the kubelet's
//! keyring does it (`k8s.io/kubernetes/pkg/credentialprovider`, `BasicDockerKeyring`).
//!
//! - Keys are registry locations: `host[:port][/path]`, with or without `https://`/`http://`;
//!   a `/v1/` or `/v2/` path means the bare host (`https://index.docker.io/v1/` is
//!   `index.docker.io`).
//! - A key matches an image when the host has as many dot-separated parts as the image's and each
//!   part matches as a glob (`*.example.com` matches `a.example.com`, not `a.b.example.com`), the
//!   ports are equal, and the key's path is a prefix of the image's path.
//! - Keys are tried most specific first (reverse byte order: `quay.io/team` before `quay.io`); a
//!   key's credentials keep the order they were added in (secrets in `pullSecrets` order).
//! - When no key matches, an image on Docker Hub (`nginx`, `docker.io/...`,
//!   `index.docker.io/...`) uses the credentials stored for `index.docker.io`.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::cri::PullAuth;

/// The default registry's key (`https://index.docker.io/v1/` reduces to this).
const DEFAULT_REGISTRY_HOST: &str = "index.docker.io";

/// A docker config that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum KeyringError {
    /// Not the JSON of a docker config.
    #[error("not a docker config: {0}")]
    Json(#[source] serde_json::Error),
    /// An `auth` field that is not base64 of `user:password`.
    #[error("the auth field for {registry:?} is not base64 of user:password")]
    Auth {
        /// The registry key the entry is stored under.
        registry: String,
    },
}

/// One entry of a docker config (`DockerConfigEntry`).
#[derive(Clone, Default, Deserialize)]
struct ConfigEntry {
    #[serde(default)]
    username: String,
    #[serde(default)]
    password: String,
    /// base64 of `user:password`; wins over username/password when set.
    #[serde(default)]
    auth: String,
}

/// `.dockerconfigjson`: `{"auths": {...}}`.
#[derive(Deserialize)]
struct ConfigJson {
    #[serde(default)]
    auths: BTreeMap<String, ConfigEntry>,
}

/// Credentials of one registry location.
#[derive(Clone, PartialEq, Eq)]
pub struct Credential {
    /// User name.
    pub username: String,
    /// Password (or token).
    pub password: String,
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credential")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

impl Credential {
    /// The CRI auth config of a pull with this credential: only user and password, as
    /// kruise-daemon sends.
    pub fn to_pull_auth(&self) -> PullAuth {
        PullAuth {
            username: self.username.clone(),
            password: self.password.clone(),
            ..Default::default()
        }
    }
}

/// Credentials by registry location, looked up like the kubelet's keyring.
#[derive(Clone, Debug, Default)]
pub struct Keyring {
    creds: BTreeMap<String, Vec<Credential>>,
}

impl Keyring {
    /// Adds the entries of a `.dockerconfigjson` (`{"auths": {...}}`).
    pub fn add_config_json(&mut self, data: &[u8]) -> Result<(), KeyringError> {
        let cfg: ConfigJson = serde_json::from_slice(data).map_err(KeyringError::Json)?;
        self.add_entries(cfg.auths)
    }

    /// Adds the entries of a legacy `.dockercfg` (`{"registry": {...}}`).
    pub fn add_dockercfg(&mut self, data: &[u8]) -> Result<(), KeyringError> {
        let cfg: BTreeMap<String, ConfigEntry> =
            serde_json::from_slice(data).map_err(KeyringError::Json)?;
        self.add_entries(cfg)
    }

    fn add_entries(&mut self, entries: BTreeMap<String, ConfigEntry>) -> Result<(), KeyringError> {
        for (location, entry) in entries {
            let cred = credential(&location, entry)?;
            self.creds.entry(key_of(&location)).or_default().push(cred);
        }
        Ok(())
    }

    /// Adds one credential for `location` (as a registry config or a plugin answer names it).
    pub fn add(&mut self, location: &str, username: &str, password: &str) {
        self.creds
            .entry(key_of(location))
            .or_default()
            .push(Credential {
                username: username.to_string(),
                password: password.to_string(),
            });
    }

    /// Appends every credential of `other` (after this keyring's own, key by key).
    pub fn extend(&mut self, other: Keyring) {
        for (k, v) in other.creds {
            self.creds.entry(k).or_default().extend(v);
        }
    }

    /// Whether the keyring holds no credential.
    pub fn is_empty(&self) -> bool {
        self.creds.is_empty()
    }

    /// Every credential that applies to `image` (a repository name, `host/path`, normalised or
    /// not), most specific location first. Empty: pull anonymously.
    pub fn lookup(&self, image: &str) -> Vec<Credential> {
        let mut found = Vec::new();
        // reverse order: longer (more specific) keys with a common prefix come first
        for (key, creds) in self.creds.iter().rev() {
            if urls_match(key, image) {
                found.extend(creds.iter().cloned());
            }
        }
        if found.is_empty()
            && is_default_registry_match(image)
            && let Some(creds) = self.creds.get(DEFAULT_REGISTRY_HOST)
        {
            found.extend(creds.iter().cloned());
        }
        found
    }

    /// Every password and `auth` string this keyring holds, to scrub from messages.
    pub fn secrets(&self) -> Vec<String> {
        self.creds
            .values()
            .flatten()
            .flat_map(|c| [c.password.clone(), encode_auth(&c.username, &c.password)])
            .filter(|s| !s.is_empty())
            .collect()
    }
}

/// The credential of an entry: `auth` (base64 `user:password`) wins over the separate fields.
fn credential(location: &str, entry: ConfigEntry) -> Result<Credential, KeyringError> {
    if entry.auth.is_empty() {
        return Ok(Credential {
            username: entry.username,
            password: entry.password,
        });
    }
    let bad = || KeyringError::Auth {
        registry: location.to_string(),
    };
    let decoded = base64_decode(entry.auth.trim()).ok_or_else(bad)?;
    let text = String::from_utf8(decoded).map_err(|_| bad())?;
    let (user, password) = text.split_once(':').ok_or_else(bad)?;
    Ok(Credential {
        username: user.to_string(),
        password: password.trim_matches('\0').to_string(),
    })
}

/// The keyring key of a config location: scheme dropped, `/v1/` and `/v2/` dropped, host plus
/// path otherwise.
fn key_of(location: &str) -> String {
    let rest = location
        .strip_prefix("https://")
        .or_else(|| location.strip_prefix("http://"))
        .unwrap_or(location);
    let (host, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let path = if path.starts_with("/v1/") || path.starts_with("/v2/") {
        &path[3..]
    } else {
        path
    };
    if path.is_empty() || path == "/" {
        host.to_string()
    } else {
        format!("{host}{path}")
    }
}

/// Splits `host[:port][/path]` into host parts, port and path (`/...` or empty).
fn split_url(s: &str) -> (Vec<&str>, &str, &str) {
    let (hostport, path) = match s.find('/') {
        Some(i) => (&s[..i], &s[i..]),
        None => (s, ""),
    };
    let (host, port) = match hostport.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') || h.ends_with(']') => (h, p),
        _ => (hostport, ""),
    };
    (host.split('.').collect(), port, path)
}

/// `URLsMatchStr(glob, target)` of the kubelet.
/// The kubelet's `URLsMatchStr`: whether `target` (`host[:port]/path`) is covered by `glob`
/// (same port, same number of host labels each matching the glob's, path prefix).
pub fn urls_match(glob: &str, target: &str) -> bool {
    let (glob_parts, glob_port, glob_path) = split_url(glob);
    let (target_parts, target_port, target_path) = split_url(target);
    glob_port == target_port
        && glob_parts.len() == target_parts.len()
        && target_path.starts_with(glob_path)
        && glob_parts
            .iter()
            .zip(&target_parts)
            .all(|(g, t)| glob_match(g.as_bytes(), t.as_bytes()))
}

/// Whether `image` is on Docker Hub by the docker client's rule (`isDefaultRegistryMatch`).
fn is_default_registry_match(image: &str) -> bool {
    match image.split_once('/') {
        None => !image.is_empty(),
        Some(("", _)) => false,
        Some((first, _)) => {
            first == "docker.io"
                || first == DEFAULT_REGISTRY_HOST
                || (!first.contains(['.', ':']) && first != "localhost")
        }
    }
}

/// Shell glob of Go's `filepath.Match` for one host part: `*`, `?`, `[...]` (with ranges and
/// `^` negation), `\` escapes.
///
/// Matched left to right, going back only to the last `*` on a mismatch: every other token
/// matches exactly one byte, so that is enough, and it takes at most `len(p) * len(s)` steps. (A
/// version that tried every split at every `*` took minutes on a host glob of eleven `*`, found
/// while fuzzing the keyring; the globs come from pull secrets and plugin configs.)
fn glob_match(p: &[u8], s: &[u8]) -> bool {
    let (mut pi, mut si) = (0, 0);
    // after the last `*` seen: where the pattern goes on, and where in `s` that try began
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        if p.get(pi) == Some(&b'*') {
            pi += 1;
            star = Some((pi, si));
            continue;
        }
        if let Some(n) = one(&p[pi..], s[si]) {
            pi += n;
            si += 1;
            continue;
        }
        // mismatch: the last `*` takes one byte more
        let Some((sp, ss)) = star else {
            return false;
        };
        pi = sp;
        si = ss + 1;
        star = Some((sp, si));
    }
    p[pi..].iter().all(|&c| c == b'*')
}

/// Whether the pattern token at the start of `p` (not `*`) matches byte `c`: the token's length
/// if so, `None` if not or if the token is malformed (an unclosed `[`, a trailing `\`).
fn one(p: &[u8], c: u8) -> Option<usize> {
    match p.split_first()? {
        (b'?', _) => Some(1),
        (b'[', rest) => {
            let end = rest.iter().position(|&x| x == b']')?;
            let class = &rest[..end];
            let (negate, class) = match class.split_first() {
                Some((b'^', c)) => (true, c),
                _ => (false, class),
            };
            let mut hit = false;
            let mut i = 0;
            while i < class.len() {
                if i + 2 < class.len() && class[i + 1] == b'-' {
                    hit |= class[i] <= c && c <= class[i + 2];
                    i += 3;
                } else {
                    hit |= class[i] == c;
                    i += 1;
                }
            }
            (hit != negate).then_some(end + 2)
        }
        (b'\\', rest) => (rest.first() == Some(&c)).then_some(2),
        (pc, _) => (*pc == c).then_some(1),
    }
}

const BASE64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 (padding optional). `None` for anything else.
pub fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let s = s.trim_end_matches('=');
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let mut acc = 0u32;
    let mut bits = 0;
    for b in s.bytes() {
        let v = BASE64.iter().position(|&x| x == b)?;
        acc = (acc << 6) | u32::try_from(v).ok()?;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push(u8::try_from((acc >> bits) & 0xff).ok()?);
        }
    }
    // leftover bits must be padding zeros, and a single leftover sextet is invalid
    (bits < 6 && acc & ((1 << bits) - 1) == 0).then_some(out)
}

/// Standard base64 with padding.
pub fn base64_encode(data: &[u8]) -> String {
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, &b)| acc | (u32::from(b) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(BASE64[((n >> (18 - 6 * i)) & 0x3f) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// base64 of `user:password`, as docker config files hold it.
fn encode_auth(user: &str, password: &str) -> String {
    if password.is_empty() {
        return String::new();
    }
    base64_encode(format!("{user}:{password}").as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keyring(json: &str) -> Keyring {
        let mut k = Keyring::default();
        k.add_config_json(json.as_bytes()).unwrap();
        k
    }

    fn users(k: &Keyring, image: &str) -> Vec<String> {
        k.lookup(image).into_iter().map(|c| c.username).collect()
    }

    #[test]
    fn auth_field_wins_and_is_decoded() {
        let auth = base64_encode(b"alice:s3:cret");
        let k = keyring(&format!(
            r#"{{"auths": {{"reg.example.com": {{"username": "x", "password": "y", "auth": "{auth}"}}}}}}"#
        ));
        let c = &k.lookup("reg.example.com/app")[0];
        assert_eq!(
            (c.username.as_str(), c.password.as_str()),
            ("alice", "s3:cret")
        );
        let bad = Keyring::default()
            .add_config_json(br#"{"auths": {"r.io": {"auth": "!!!"}}}"#)
            .unwrap_err();
        assert!(bad.to_string().contains("r.io"), "{bad}");
        assert!(!bad.to_string().contains("!!!"));
    }

    #[test]
    fn legacy_dockercfg_has_no_auths_wrapper() {
        let mut k = Keyring::default();
        k.add_dockercfg(br#"{"https://reg.example.com": {"username": "u", "password": "p"}}"#)
            .unwrap();
        assert_eq!(users(&k, "reg.example.com/a/b"), ["u"]);
    }

    #[test]
    fn host_port_and_path_prefix_must_match() {
        let k = keyring(
            r#"{"auths": {
                "reg.example.com": {"username": "host"},
                "reg.example.com:5000": {"username": "port"},
                "reg.example.com/team": {"username": "team"},
                "https://other.io/v2/": {"username": "v2"}
            }}"#,
        );
        assert_eq!(users(&k, "reg.example.com/team/app"), ["team", "host"]);
        assert_eq!(users(&k, "reg.example.com/else/app"), ["host"]);
        assert_eq!(users(&k, "reg.example.com:5000/team/app"), ["port"]);
        assert_eq!(users(&k, "other.io/x"), ["v2"]);
        assert!(users(&k, "example.com/app").is_empty());
        // the prefix is a string prefix, as the kubelet's is
        assert_eq!(users(&k, "reg.example.com/teamwork/app"), ["team", "host"]);
    }

    #[test]
    fn wildcards_match_one_host_part_each() {
        let k = keyring(
            r#"{"auths": {"*.example.com": {"username": "w"}, "r?g.io": {"username": "q"}}}"#,
        );
        assert_eq!(users(&k, "a.example.com/app"), ["w"]);
        assert!(users(&k, "a.b.example.com/app").is_empty());
        assert!(users(&k, "example.com/app").is_empty());
        assert_eq!(users(&k, "reg.io/app"), ["q"]);
        assert!(glob_match(b"[a-c]x", b"bx") && !glob_match(b"[^a-c]x", b"bx"));
        assert!(glob_match(b"*", b"") && glob_match(b"a*", b"a") && !glob_match(b"a?", b"a"));
        assert!(glob_match(b"*b*c", b"abxbc") && !glob_match(b"*b*c", b"abxbd"));
        assert!(glob_match(br"\*x", b"*x") && !glob_match(br"\*x", b"ax"));
        assert!(!glob_match(b"[ab", b"a") && !glob_match(br"a\", b"a"));
    }

    #[test]
    fn a_glob_of_many_stars_is_matched_without_backtracking_blowup() {
        // the recursive matcher took minutes on 11 stars and 44 bytes
        let glob = "*a".repeat(30) + "*b";
        let host = "a".repeat(200);
        assert!(!glob_match(glob.as_bytes(), host.as_bytes()));
        assert!(glob_match(glob.as_bytes(), format!("{host}b").as_bytes()));
    }

    /// The first, recursive matcher: right, but exponential in the number of `*`.
    fn recursive_glob_match(p: &[u8], s: &[u8]) -> bool {
        match p.split_first() {
            None => s.is_empty(),
            Some((b'*', rest)) => (0..=s.len()).any(|i| recursive_glob_match(rest, &s[i..])),
            Some((b'?', rest)) => !s.is_empty() && recursive_glob_match(rest, &s[1..]),
            Some((b'\\', rest)) => match (rest.split_first(), s.split_first()) {
                (Some((pc, pr)), Some((sc, sr))) => pc == sc && recursive_glob_match(pr, sr),
                _ => false,
            },
            Some((b'[', _)) => match s.split_first() {
                Some((&c, s_rest)) => {
                    one(p, c).is_some_and(|n| recursive_glob_match(&p[n..], s_rest))
                }
                None => false,
            },
            Some((pc, rest)) => s.first() == Some(pc) && recursive_glob_match(rest, &s[1..]),
        }
    }

    proptest::proptest! {
        #[test]
        fn the_linear_matcher_agrees_with_the_recursive_one(
            p in "[ab*?\\[\\]^\\\\-]{0,8}",
            s in "[ab*\\]-]{0,8}",
        ) {
            proptest::prop_assert_eq!(
                glob_match(p.as_bytes(), s.as_bytes()),
                recursive_glob_match(p.as_bytes(), s.as_bytes()),
                "{:?} {:?}", p, s
            );
        }
    }

    #[test]
    fn docker_hub_names_use_the_index_docker_io_entry() {
        let k = keyring(r#"{"auths": {"https://index.docker.io/v1/": {"username": "hub"}}}"#);
        for image in [
            "nginx",
            "library/nginx",
            "docker.io/library/nginx",
            "index.docker.io/library/nginx",
            "bitnami/redis",
        ] {
            assert_eq!(users(&k, image), ["hub"], "{image}");
        }
        assert!(users(&k, "quay.io/app").is_empty());
        assert!(users(&k, "localhost/app").is_empty());
        let k = keyring(r#"{"auths": {"docker.io": {"username": "d"}}}"#);
        assert_eq!(users(&k, "docker.io/library/nginx"), ["d"]);
    }

    #[test]
    fn credentials_of_several_secrets_keep_their_order() {
        let mut k = keyring(r#"{"auths": {"r.io": {"username": "first"}}}"#);
        k.extend(keyring(
            r#"{"auths": {"r.io": {"username": "second"}, "r.io/a": {"username": "deep"}}}"#,
        ));
        assert_eq!(users(&k, "r.io/a/b"), ["deep", "first", "second"]);
    }

    #[test]
    fn debug_never_shows_a_password() {
        let k = keyring(r#"{"auths": {"r.io": {"username": "u", "password": "hunter2"}}}"#);
        let text = format!("{k:?} {:?}", k.lookup("r.io/a"));
        assert!(!text.contains("hunter2"), "{text}");
        assert!(k.secrets().contains(&"hunter2".to_string()));
        assert!(k.secrets().contains(&base64_encode(b"u:hunter2")));
    }

    #[test]
    fn base64_round_trips_and_refuses_garbage() {
        for s in ["", "a", "ab", "abc", "user:pass", "\u{e9}\0x"] {
            let enc = base64_encode(s.as_bytes());
            assert_eq!(base64_decode(&enc).unwrap(), s.as_bytes(), "{enc}");
            assert_eq!(
                base64_decode(enc.trim_end_matches('=')).unwrap(),
                s.as_bytes()
            );
        }
        assert_eq!(base64_encode(b"user:pass"), "dXNlcjpwYXNz");
        assert!(base64_decode("a").is_none());
        assert!(base64_decode("ab!d").is_none());
    }
}
