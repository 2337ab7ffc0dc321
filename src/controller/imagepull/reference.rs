//! Docker-style image references, normalised the way `docker/distribution/reference`'s
//! `ParseNormalizedNamed` does it, so that `nginx`, `library/nginx`, `docker.io/library/nginx` and
//! `index.docker.io/library/nginx` are one image.
//!
//! Rules (from the distribution reference grammar):
//!
//! - the first path component is a registry host when it contains `.` or `:`, is `localhost`, or
//!   has an upper-case letter; otherwise the registry is `docker.io`;
//! - `index.docker.io` is `docker.io`; a one-component path on `docker.io` gets `library/`;
//! - the repository path is lower case: components of `[a-z0-9]` joined by `.`, `_`, `__` or
//!   runs of `-`, separated by `/`;
//! - a tag is `[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`; a digest is `algorithm:hex` with at least 32
//!   hex digits; a reference may carry both (`name:tag@digest`), and the digest then wins.

use std::fmt;

/// The registry of references without one.
pub const DEFAULT_DOMAIN: &str = "docker.io";
/// The legacy name of [`DEFAULT_DOMAIN`].
pub const LEGACY_DEFAULT_DOMAIN: &str = "index.docker.io";
/// The namespace of official images on [`DEFAULT_DOMAIN`].
const OFFICIAL_REPO_PREFIX: &str = "library/";
/// The tag of a reference without tag or digest.
pub const DEFAULT_TAG: &str = "latest";

/// A reference that cannot be parsed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReferenceError {
    /// Nothing to parse.
    #[error("invalid image reference: empty")]
    Empty,
    /// The repository path has upper-case letters.
    #[error("invalid image reference {0:?}: repository name must be lowercase")]
    Uppercase(String),
    /// Something else breaks the grammar.
    #[error("invalid image reference {reference:?}: {reason}")]
    Invalid {
        /// The reference as given.
        reference: String,
        /// Which part is wrong.
        reason: &'static str,
    },
}

/// A parsed, normalised image reference.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Reference {
    /// Registry host (and port): `docker.io`, `127.0.0.1:5000`, ...
    pub domain: String,
    /// Repository path in the registry: `library/nginx`, `test/busybox`.
    pub path: String,
    /// The tag, if given.
    pub tag: Option<String>,
    /// The digest (`sha256:...`), if given.
    pub digest: Option<String>,
}

impl Reference {
    /// Parses and normalises `s` (`ParseNormalizedNamed`).
    pub fn parse(s: &str) -> Result<Self, ReferenceError> {
        if s.is_empty() {
            return Err(ReferenceError::Empty);
        }
        let invalid = |reason| ReferenceError::Invalid {
            reference: s.to_string(),
            reason,
        };
        let (rest, digest) = match s.split_once('@') {
            Some((r, d)) => {
                if !is_digest(d) {
                    return Err(invalid("bad digest"));
                }
                (r, Some(d.to_string()))
            }
            None => (s, None),
        };
        // a tag follows the last ':' that has no '/' after it (a ':' before a '/' is a port)
        let (name, tag) = match rest.rfind(':') {
            Some(i) if !rest[i + 1..].contains('/') => (&rest[..i], Some(&rest[i + 1..])),
            _ => (rest, None),
        };
        if let Some(t) = tag
            && !is_tag(t)
        {
            return Err(invalid("bad tag"));
        }
        let (domain, path) = split_domain(name);
        if domain.is_empty() || path.is_empty() {
            return Err(invalid("empty registry or repository"));
        }
        if path.chars().any(|c| c.is_ascii_uppercase()) {
            return Err(ReferenceError::Uppercase(s.to_string()));
        }
        if !is_domain(&domain) {
            return Err(invalid("bad registry host"));
        }
        if !path.split('/').all(is_path_component) {
            return Err(invalid("bad repository path"));
        }
        if domain.len() + 1 + path.len() > 255 {
            return Err(invalid("name longer than 255 characters"));
        }
        Ok(Reference {
            domain,
            path,
            tag: tag.map(str::to_string),
            digest,
        })
    }

    /// Parses `name` and `tag` as a NodeImage spells them (the map key and a tag). A tag that is
    /// a digest (kruise sends digests "as tags", `sha256:...`) becomes the digest.
    pub fn from_name_tag(name: &str, tag: &str) -> Result<Self, ReferenceError> {
        let mut r = Reference::parse(name)?;
        if r.tag.is_some() || r.digest.is_some() {
            return Err(ReferenceError::Invalid {
                reference: name.to_string(),
                reason: "the image name carries a tag or digest",
            });
        }
        if is_digest(tag) {
            r.digest = Some(tag.to_string());
        } else if is_tag(tag) {
            r.tag = Some(tag.to_string());
        } else {
            return Err(ReferenceError::Invalid {
                reference: format!("{name}:{tag}"),
                reason: "bad tag",
            });
        }
        Ok(r)
    }

    /// `domain/path`: the fully qualified repository name.
    pub fn name(&self) -> String {
        format!("{}/{}", self.domain, self.path)
    }

    /// The short name docker prints: no `docker.io/`, no `library/` (`FamiliarName`).
    pub fn familiar_name(&self) -> String {
        if self.domain == DEFAULT_DOMAIN {
            self.path
                .strip_prefix(OFFICIAL_REPO_PREFIX)
                .filter(|p| !p.contains('/'))
                .unwrap_or(&self.path)
                .to_string()
        } else {
            self.name()
        }
    }

    /// The same reference with `latest` when it has neither tag nor digest (`TagNameOnly`).
    pub fn with_default_tag(mut self) -> Self {
        if self.tag.is_none() && self.digest.is_none() {
            self.tag = Some(DEFAULT_TAG.to_string());
        }
        self
    }

    /// What identifies one pull: `name@digest` for a digest reference (a tag next to a digest
    /// does not change what is fetched), else `name:tag` (`latest` by default). Two requests with
    /// the same key fetch the same thing, whatever names they were spelled with.
    pub fn pull_key(&self) -> String {
        match &self.digest {
            Some(d) => format!("{}@{d}", self.name()),
            None => format!(
                "{}:{}",
                self.name(),
                self.tag.as_deref().unwrap_or(DEFAULT_TAG)
            ),
        }
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.domain, self.path)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

/// Splits a name into registry and path, normalising docker.io (`splitDockerDomain`).
fn split_domain(name: &str) -> (String, String) {
    let (mut domain, mut path) = match name.split_once('/') {
        Some((first, rest))
            if first.contains(['.', ':'])
                || first == "localhost"
                || first.chars().any(|c| c.is_ascii_uppercase()) =>
        {
            (first.to_string(), rest.to_string())
        }
        _ => (DEFAULT_DOMAIN.to_string(), name.to_string()),
    };
    if domain == LEGACY_DEFAULT_DOMAIN {
        domain = DEFAULT_DOMAIN.to_string();
    }
    if domain == DEFAULT_DOMAIN && !path.contains('/') {
        path = format!("{OFFICIAL_REPO_PREFIX}{path}");
    }
    (domain, path)
}

/// `[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*`
fn is_path_component(c: &str) -> bool {
    let b = c.as_bytes();
    let alnum = |x: u8| x.is_ascii_lowercase() || x.is_ascii_digit();
    if b.is_empty() || !alnum(b[0]) || !alnum(b[b.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        if alnum(b[i]) {
            i += 1;
            continue;
        }
        // a separator: '.', '_', '__' or a run of '-'
        let start = i;
        match b[i] {
            b'.' => i += 1,
            b'_' => {
                i += 1;
                if i < b.len() && b[i] == b'_' {
                    i += 1;
                }
            }
            b'-' => {
                while i < b.len() && b[i] == b'-' {
                    i += 1;
                }
            }
            _ => return false,
        }
        if i == start || i >= b.len() || !alnum(b[i]) {
            return false;
        }
    }
    true
}

/// Host components of letters, digits and inner `-`, separated by `.`, optionally `:port`; or a
/// bracketed IPv6 address with optional port.
fn is_domain(d: &str) -> bool {
    let (host, port) = if let Some(rest) = d.strip_prefix('[') {
        match rest.split_once(']') {
            Some((ip, after)) => {
                if ip.is_empty() || !ip.chars().all(|c| c.is_ascii_hexdigit() || c == ':') {
                    return false;
                }
                match after {
                    "" => return true,
                    p => match p.strip_prefix(':') {
                        Some(p) => ("x", Some(p)),
                        None => return false,
                    },
                }
            }
            None => return false,
        }
    } else {
        match d.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (d, None),
        }
    };
    if let Some(p) = port
        && (p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()))
    {
        return false;
    }
    host.split('.').all(|c| {
        let b = c.as_bytes();
        !b.is_empty()
            && b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric()
            && b.iter().all(|x| x.is_ascii_alphanumeric() || *x == b'-')
    })
}

/// `[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`
pub fn is_tag(t: &str) -> bool {
    let b = t.as_bytes();
    let word = |x: u8| x.is_ascii_alphanumeric() || x == b'_';
    !b.is_empty()
        && b.len() <= 128
        && word(b[0])
        && b[1..].iter().all(|x| word(*x) || *x == b'.' || *x == b'-')
}

/// `algorithm:hex` with an algorithm of letters and digits (and `-_+.` between them) and at
/// least 32 hex digits.
pub fn is_digest(d: &str) -> bool {
    let Some((alg, hex)) = d.split_once(':') else {
        return false;
    };
    let ab = alg.as_bytes();
    !ab.is_empty()
        && ab[0].is_ascii_alphabetic()
        && ab
            .iter()
            .all(|x| x.is_ascii_alphanumeric() || b"-_+.".contains(x))
        && hex.len() >= 32
        && hex.bytes().all(|x| x.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIGEST: &str = "sha256:bc8813ea7b3603864987522f02a76101c17ad122e1c46d790efc0fca78ca7bfb";

    fn key(s: &str) -> String {
        Reference::parse(s).unwrap().pull_key()
    }

    #[test]
    fn short_library_and_qualified_docker_hub_names_are_one_image() {
        let want = "docker.io/library/nginx:latest";
        for s in [
            "nginx",
            "nginx:latest",
            "library/nginx",
            "docker.io/nginx",
            "docker.io/library/nginx:latest",
            "index.docker.io/library/nginx",
        ] {
            assert_eq!(key(s), want, "{s}");
        }
        assert_eq!(key("nginx:1.25"), "docker.io/library/nginx:1.25");
        assert_ne!(key("nginx:1.25"), key("nginx:1.26"));
    }

    #[test]
    fn a_first_component_with_a_dot_colon_or_localhost_is_a_registry() {
        let r = Reference::parse("127.0.0.1:5000/test/busybox:v1").unwrap();
        assert_eq!(
            (r.domain.as_str(), r.path.as_str(), r.tag.as_deref()),
            ("127.0.0.1:5000", "test/busybox", Some("v1"))
        );
        assert_eq!(
            Reference::parse("localhost/app").unwrap().name(),
            "localhost/app"
        );
        assert_eq!(
            Reference::parse("quay.io/coreos/etcd").unwrap().name(),
            "quay.io/coreos/etcd"
        );
        // a plain first component is a docker.io namespace, not a host
        assert_eq!(
            Reference::parse("bitnami/redis").unwrap().name(),
            "docker.io/bitnami/redis"
        );
        // a port without a tag is not a tag
        let r = Reference::parse("registry:5000/app").unwrap();
        assert_eq!((r.domain.as_str(), r.tag), ("registry:5000", None));
    }

    #[test]
    fn familiar_names_drop_docker_io_and_library() {
        for (s, want) in [
            ("docker.io/library/nginx", "nginx"),
            ("docker.io/bitnami/redis", "bitnami/redis"),
            ("127.0.0.1:5000/test/busybox", "127.0.0.1:5000/test/busybox"),
        ] {
            assert_eq!(Reference::parse(s).unwrap().familiar_name(), want);
        }
    }

    #[test]
    fn a_digest_reference_keys_by_digest_and_ignores_its_tag() {
        let a = key(&format!("nginx@{DIGEST}"));
        let b = key(&format!("docker.io/library/nginx:1.25@{DIGEST}"));
        assert_eq!(a, format!("docker.io/library/nginx@{DIGEST}"));
        assert_eq!(a, b);
        // the same digest in another repository is another pull: the runtime records names
        assert_ne!(a, key(&format!("other/nginx@{DIGEST}")));
    }

    #[test]
    fn a_nodeimage_tag_that_is_a_digest_becomes_the_digest() {
        let r = Reference::from_name_tag("nginx", DIGEST).unwrap();
        assert_eq!(r.digest.as_deref(), Some(DIGEST));
        assert_eq!(r.tag, None);
        assert_eq!(r.to_string(), format!("docker.io/library/nginx@{DIGEST}"));
        let r = Reference::from_name_tag("docker.io/library/nginx", "1.25").unwrap();
        assert_eq!(r.to_string(), "docker.io/library/nginx:1.25");
        assert!(Reference::from_name_tag("nginx:1", "2").is_err());
        assert!(Reference::from_name_tag("nginx", "bad tag").is_err());
    }

    #[test]
    fn malformed_references_are_refused_with_a_reason() {
        assert_eq!(Reference::parse(""), Err(ReferenceError::Empty));
        assert!(matches!(
            Reference::parse("Nginx/App"),
            Err(ReferenceError::Invalid { .. }) | Err(ReferenceError::Uppercase(_))
        ));
        assert!(matches!(
            Reference::parse("library/Nginx"),
            Err(ReferenceError::Uppercase(_))
        ));
        for bad in [
            "nginx:",
            "nginx:-bad",
            "nginx@sha256:short",
            "nginx@:abc",
            "a//b",
            "-nginx",
            "nginx-",
            "ngi..nx",
            "ngi___nx",
            "host:port/app",
            "/app",
        ] {
            assert!(Reference::parse(bad).is_err(), "{bad} should be refused");
        }
        for good in [
            "a",
            "a-b",
            "a--b",
            "a__b",
            "a.b_c",
            "[::1]:5000/app:v1",
            "my-registry.local:443/team/app",
        ] {
            assert!(
                Reference::parse(good).is_ok(),
                "{good}: {:?}",
                Reference::parse(good)
            );
        }
    }

    #[test]
    fn tags_and_digests_follow_the_grammar() {
        assert!(is_tag("v1.2.3-rc_1") && is_tag("_x") && is_tag("latest"));
        assert!(!is_tag("") && !is_tag(".x") && !is_tag("a/b") && !is_tag(&"x".repeat(129)));
        assert!(is_digest(DIGEST));
        assert!(!is_digest("sha256:xyz") && !is_digest("1sha:0123456789abcdef0123456789abcdef"));
    }

    #[test]
    fn display_writes_the_fully_qualified_reference() {
        assert_eq!(
            Reference::parse("nginx:1").unwrap().to_string(),
            "docker.io/library/nginx:1"
        );
        assert_eq!(
            Reference::parse("nginx")
                .unwrap()
                .with_default_tag()
                .to_string(),
            "docker.io/library/nginx:latest"
        );
    }
}
