//! An image's compressed size from its registry manifest, for the size admission (`admit.rs`).
//!
//! The registry API v2 (the OCI distribution spec): `GET /v2/<name>/manifests/<tag|digest>`
//! accepting OCI and docker manifests and indexes; an index (manifest list) is resolved to the
//! entry for this node's platform (`linux/<arch>`) and that manifest read by digest; the size is
//! the config's size plus the layers'. Authentication as a runtime does it with the pull's own
//! credentials: an answer of 401 names the scheme in `WWW-Authenticate`, `Basic` (the
//! credential itself) or `Bearer` (a token from the named realm, asked with the credential).
//!
//! The image is named by a tenant: every response is bounded ([`MAX_MANIFEST`],
//! [`MAX_TOKEN`]), every request has a time limit ([`REQUEST_TIMEOUT`]), redirects are not
//! followed, an index is resolved one level deep, and credentials go over plain HTTP only to a
//! loopback registry or realm (docker's rule: `localhost` and `127.0.0.0/8` are insecure
//! registries by default; every other registry is asked over HTTPS with the system's roots).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::future::BoxFuture;
use http::header::{ACCEPT, AUTHORIZATION, USER_AGENT, WWW_AUTHENTICATE};
use http::{Request, StatusCode, Uri};
use http_body_util::{BodyExt, Limited};
use hyper::body::Bytes;
use hyper_util::client::legacy::connect::HttpConnector;
use kube::client::Body;
use tower::ServiceExt;

use crate::k8s::client::connect::{Pooled, any, pooled};
use serde::Deserialize;

use super::admit::SizeSource;
use super::keyring::{Credential, base64_encode};
use super::reference::{DEFAULT_DOMAIN, DEFAULT_TAG, Reference, is_digest};

/// The largest manifest or index read (the distribution registry's own limit is 4 MiB).
pub const MAX_MANIFEST: usize = 4 << 20;
/// The largest token response read.
pub const MAX_TOKEN: usize = 256 << 10;
/// The time limit of each request (connect, headers and body).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);
/// The time limit of connecting.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Manifests and indexes, OCI and docker.
const ACCEPT_MANIFESTS: &str = "application/vnd.oci.image.index.v1+json, \
     application/vnd.docker.distribution.manifest.list.v2+json, \
     application/vnd.oci.image.manifest.v1+json, \
     application/vnd.docker.distribution.manifest.v2+json";

/// The API client's pooled client (`k8s::client::connect::pooled`): hyper's client is compiled
/// once for both (issue 44).
type HttpClient = Pooled;

/// Reads images' sizes from their registries. The client (and the system's root certificates)
/// is made at the first read, so a daemon that admits no pull holds none of it.
#[derive(Default)]
pub struct Registry {
    client: OnceLock<Result<HttpClient, String>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry").finish_non_exhaustive()
    }
}

/// One HTTP answer: status, the `WWW-Authenticate` header, the body (read only on 200).
struct Answer {
    status: StatusCode,
    challenge: Option<String>,
    body: Bytes,
}

/// A client with the system's root certificates (none found: only loopback registries over
/// HTTP can be read, and the error of each HTTPS one says why).
fn client() -> Result<HttpClient, String> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(Some(CONNECT_TIMEOUT));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = match hyper_rustls::HttpsConnectorBuilder::new()
        .with_provider_and_native_roots(provider.clone())
    {
        Ok(b) => b,
        Err(e) => {
            tracing::warn!(error = %e, "no system root certificates: the image size admission reads only loopback registries");
            let tls = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map_err(|e| format!("TLS settings: {e}"))?
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth();
            hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(tls)
        }
    };
    let https = builder.https_or_http().enable_http1().wrap_connector(http);
    Ok(pooled(any(https), Some(CONNECT_TIMEOUT), None))
}

impl Registry {
    async fn get(&self, url: &str, auth: Option<&str>, limit: usize) -> Result<Answer, String> {
        let mut req = Request::get(url)
            .header(ACCEPT, ACCEPT_MANIFESTS)
            .header(USER_AGENT, concat!("kruised/", env!("CARGO_PKG_VERSION")));
        if let Some(a) = auth {
            req = req.header(AUTHORIZATION, a);
        }
        let req = req
            .body(Body::empty())
            .map_err(|e| format!("bad request to {url}: {e}"))?;
        let client = self
            .client
            .get_or_init(client)
            .as_ref()
            .map_err(Clone::clone)?;
        let exchange = async {
            let resp = client
                .clone()
                .oneshot(req)
                .await
                .map_err(|e| format!("GET {url}: {}", innermost(&*e)))?;
            let status = resp.status();
            let challenge = resp
                .headers()
                .get(WWW_AUTHENTICATE)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            let body = if status == StatusCode::OK {
                Limited::new(resp.into_body(), limit)
                    .collect()
                    .await
                    .map_err(|e| {
                        format!("GET {url}: reading the answer: {e} (limit {limit} bytes)")
                    })?
                    .to_bytes()
            } else {
                Bytes::new()
            };
            Ok(Answer {
                status,
                challenge,
                body,
            })
        };
        tokio::time::timeout(REQUEST_TIMEOUT, exchange)
            .await
            .map_err(|_| format!("GET {url}: no answer within {REQUEST_TIMEOUT:?}"))?
    }

    /// The document at `url`, authenticating with `credential` when the registry asks.
    async fn document(
        &self,
        url: &str,
        path: &str,
        credential: Option<&Credential>,
        auth: &mut Option<String>,
    ) -> Result<Bytes, String> {
        let mut answer = self.get(url, auth.as_deref(), MAX_MANIFEST).await?;
        if answer.status == StatusCode::UNAUTHORIZED && auth.is_none() {
            let challenge = answer.challenge.take().unwrap_or_default();
            *auth = Some(self.authorize(&challenge, path, credential).await?);
            answer = self.get(url, auth.as_deref(), MAX_MANIFEST).await?;
        }
        match answer.status {
            StatusCode::OK => Ok(answer.body),
            s => Err(format!("GET {url}: the registry answered {s}")),
        }
    }

    /// The `Authorization` header for `challenge`.
    async fn authorize(
        &self,
        challenge: &str,
        path: &str,
        credential: Option<&Credential>,
    ) -> Result<String, String> {
        let basic = credential.map(|c| {
            format!(
                "Basic {}",
                base64_encode(format!("{}:{}", c.username, c.password).as_bytes())
            )
        });
        let (scheme, params) = parse_challenge(challenge).ok_or_else(|| {
            format!("the registry asks for a login it does not name ({challenge:?})")
        })?;
        if scheme.eq_ignore_ascii_case("basic") {
            return basic.ok_or_else(|| {
                "the registry asks for a login and the pull has no credentials for it".to_string()
            });
        }
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(format!(
                "the registry asks for the unknown login scheme {scheme:?}"
            ));
        }
        let param = |k: &str| {
            params
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(k))
                .map(|(_, v)| v.as_str())
        };
        let realm = param("realm").ok_or("the registry's bearer challenge names no realm")?;
        let uri: Uri = realm
            .parse()
            .map_err(|_| format!("the registry's token realm {realm:?} is not a URL"))?;
        match (uri.scheme_str(), uri.host()) {
            (Some("https"), Some(_)) => {}
            (Some("http"), Some(h)) if is_loopback(h) => {}
            _ => {
                return Err(format!(
                    "the registry's token realm {realm:?} is neither https nor a loopback http URL"
                ));
            }
        }
        let enc = |s: &str| {
            percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
        };
        let scope = param("scope")
            .map(str::to_string)
            .unwrap_or_else(|| format!("repository:{path}:pull"));
        let mut url = format!(
            "{realm}{}scope={}",
            if realm.contains('?') { '&' } else { '?' },
            enc(&scope)
        );
        if let Some(service) = param("service") {
            url.push_str(&format!("&service={}", enc(service)));
        }
        let answer = self.get(&url, basic.as_deref(), MAX_TOKEN).await?;
        if answer.status != StatusCode::OK {
            return Err(format!(
                "the token realm {realm} answered {}",
                answer.status
            ));
        }
        #[derive(Deserialize)]
        struct Token {
            token: Option<String>,
            access_token: Option<String>,
        }
        let t: Token = serde_json::from_slice(&answer.body)
            .map_err(|e| format!("the token realm {realm} answered no token: {e}"))?;
        let token = t
            .token
            .or(t.access_token)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| format!("the token realm {realm} answered no token"))?;
        Ok(format!("Bearer {token}"))
    }

    /// The compressed size of `reference` with one credential (or none).
    async fn size_with(
        &self,
        reference: &Reference,
        credential: Option<&Credential>,
    ) -> Result<u64, String> {
        let base = base_url(&reference.domain);
        let path = &reference.path;
        let wanted = reference
            .digest
            .clone()
            .or_else(|| reference.tag.clone())
            .unwrap_or_else(|| DEFAULT_TAG.to_string());
        let mut auth = None;
        let url = format!("{base}/v2/{path}/manifests/{wanted}");
        let doc = self.document(&url, path, credential, &mut auth).await?;
        match manifest_size(&doc, &url)? {
            Size::Bytes(n) => Ok(n),
            Size::Index(digest) => {
                let url = format!("{base}/v2/{path}/manifests/{digest}");
                let doc = self.document(&url, path, credential, &mut auth).await?;
                match manifest_size(&doc, &url)? {
                    Size::Bytes(n) => Ok(n),
                    Size::Index(_) => Err(format!("{url}: an index inside an index")),
                }
            }
        }
    }
}

impl SizeSource for Registry {
    fn compressed_size<'a>(
        &'a self,
        reference: &'a Reference,
        credentials: &'a [Credential],
    ) -> BoxFuture<'a, Result<u64, String>> {
        Box::pin(async move {
            if credentials.is_empty() {
                return self.size_with(reference, None).await;
            }
            let mut last = String::new();
            for c in credentials {
                match self.size_with(reference, Some(c)).await {
                    Ok(n) => return Ok(n),
                    Err(e) => last = e,
                }
            }
            Err(last)
        })
    }
}

/// The message of the last error in `e`'s chain of causes.
fn innermost(e: &(dyn std::error::Error + 'static)) -> String {
    let mut last = e;
    while let Some(next) = last.source() {
        last = next;
    }
    last.to_string()
}

/// Whether `host` (a name or address, brackets allowed) is the loopback.
pub fn is_loopback(host: &str) -> bool {
    let h = host.trim_start_matches('[').trim_end_matches(']');
    h.eq_ignore_ascii_case("localhost")
        || h.parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The API's base URL for a registry domain (`host[:port]`).
pub fn base_url(domain: &str) -> String {
    if domain == DEFAULT_DOMAIN {
        return "https://registry-1.docker.io".to_string();
    }
    let host = match domain.rsplit_once(':') {
        Some((h, port)) if !h.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => domain,
    };
    if is_loopback(host) {
        format!("http://{domain}")
    } else {
        format!("https://{domain}")
    }
}

/// A `WWW-Authenticate` challenge: its scheme and its `key="value"` parameters.
pub fn parse_challenge(header: &str) -> Option<(String, Vec<(String, String)>)> {
    let header = header.trim();
    let (scheme, rest) = header.split_once(' ').unwrap_or((header, ""));
    if scheme.is_empty() {
        return None;
    }
    let mut params = Vec::new();
    let mut chars = rest.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ',' || c.is_whitespace()) {
            chars.next();
        }
        let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
        if key.is_empty() {
            break;
        }
        let mut value = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            while let Some(c) = chars.next() {
                match c {
                    '"' => break,
                    '\\' => value.extend(chars.next()),
                    c => value.push(c),
                }
            }
        } else {
            value = chars.by_ref().take_while(|c| *c != ',').collect();
        }
        params.push((key.trim().to_string(), value.trim().to_string()));
    }
    Some((scheme.to_string(), params))
}

/// What a manifest document says: a size, or the digest of this node's entry in an index.
#[derive(Debug, PartialEq, Eq)]
enum Size {
    Bytes(u64),
    Index(String),
}

#[derive(Deserialize)]
struct Doc {
    manifests: Option<Vec<Entry>>,
    config: Option<Blob>,
    layers: Option<Vec<Blob>>,
}

#[derive(Deserialize)]
struct Blob {
    size: u64,
}

#[derive(Deserialize)]
struct Entry {
    digest: String,
    platform: Option<Platform>,
}

#[derive(Deserialize)]
struct Platform {
    os: String,
    architecture: String,
}

/// This node's architecture as OCI platforms name it (Go's `GOARCH`).
pub fn node_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        "loongarch64" => "loong64",
        other => other,
    }
}

fn manifest_size(doc: &[u8], url: &str) -> Result<Size, String> {
    let doc: Doc = serde_json::from_slice(doc)
        .map_err(|e| format!("{url}: not an image manifest or index: {e}"))?;
    if let Some(entries) = doc.manifests {
        let arch = node_arch();
        let entry = entries
            .iter()
            .find(|e| {
                e.platform
                    .as_ref()
                    .is_some_and(|p| p.os == "linux" && p.architecture == arch)
            })
            .ok_or_else(|| format!("{url}: the index has no image for linux/{arch}"))?;
        if !is_digest(&entry.digest) {
            return Err(format!("{url}: the index names a bad digest"));
        }
        return Ok(Size::Index(entry.digest.clone()));
    }
    let (Some(config), Some(layers)) = (doc.config, doc.layers) else {
        return Err(format!(
            "{url}: a manifest without config or layers (schema 1 is not read)"
        ));
    };
    layers
        .iter()
        .try_fold(config.size, |sum, l| sum.checked_add(l.size))
        .map(Size::Bytes)
        .ok_or_else(|| format!("{url}: the sizes add up past 2^64"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manifest_sums_its_config_and_layers() {
        let doc = br#"{"schemaVersion":2,"config":{"size":100,"digest":"sha256:x"},
            "layers":[{"size":1000},{"size":24}]}"#;
        assert_eq!(manifest_size(doc, "u"), Ok(Size::Bytes(1124)));
    }

    #[test]
    fn an_index_resolves_to_this_nodes_platform() {
        let d = |c: char| format!("sha256:{}", c.to_string().repeat(64));
        let doc = format!(
            r#"{{"manifests":[
                {{"digest":"{}","platform":{{"os":"unknown","architecture":"unknown"}}}},
                {{"digest":"{}","platform":{{"os":"linux","architecture":"s390x-not"}}}},
                {{"digest":"{}","platform":{{"os":"linux","architecture":"{}"}}}}]}}"#,
            d('a'),
            d('b'),
            d('c'),
            node_arch()
        );
        assert_eq!(manifest_size(doc.as_bytes(), "u"), Ok(Size::Index(d('c'))));
        let none = r#"{"manifests":[{"digest":"sha256:x","platform":{"os":"windows","architecture":"amd64"}}]}"#;
        let e = manifest_size(none.as_bytes(), "u").unwrap_err();
        assert!(e.contains("no image for linux/"), "{e}");
    }

    #[test]
    fn hostile_manifests_are_refused_with_a_message() {
        let bad_digest = format!(
            r#"{{"manifests":[{{"digest":"../../x","platform":{{"os":"linux","architecture":"{}"}}}}]}}"#,
            node_arch()
        );
        assert!(
            manifest_size(bad_digest.as_bytes(), "u")
                .unwrap_err()
                .contains("bad digest")
        );
        let overflow = br#"{"config":{"size":18446744073709551615},"layers":[{"size":1}]}"#;
        assert!(
            manifest_size(overflow, "u")
                .unwrap_err()
                .contains("past 2^64")
        );
        assert!(
            manifest_size(b"<html>", "u")
                .unwrap_err()
                .contains("not an image manifest")
        );
        assert!(
            manifest_size(br#"{"schemaVersion":1,"fsLayers":[]}"#, "u")
                .unwrap_err()
                .contains("schema 1")
        );
        let negative = br#"{"config":{"size":-1},"layers":[]}"#;
        assert!(manifest_size(negative, "u").is_err());
    }

    #[test]
    fn challenges_parse_with_quoted_commas() {
        let (s, p) = parse_challenge(
            r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:a/b:pull,push""#,
        )
        .unwrap();
        assert_eq!(s, "Bearer");
        assert_eq!(
            p,
            vec![
                ("realm".into(), "https://auth.docker.io/token".into()),
                ("service".into(), "registry.docker.io".into()),
                ("scope".into(), "repository:a/b:pull,push".into()),
            ]
        );
        let (s, p) = parse_challenge(r#"Basic realm="Registry Realm""#).unwrap();
        assert_eq!((s.as_str(), p.len()), ("Basic", 1));
        assert_eq!(parse_challenge("  "), None);
    }

    #[test]
    fn only_loopback_registries_are_read_over_http() {
        assert_eq!(base_url("127.0.0.1:5000"), "http://127.0.0.1:5000");
        assert_eq!(base_url("localhost"), "http://localhost");
        assert_eq!(base_url("[::1]:5000"), "http://[::1]:5000");
        assert_eq!(
            base_url("registry.example:5000"),
            "https://registry.example:5000"
        );
        assert_eq!(base_url("10.0.0.1:5000"), "https://10.0.0.1:5000");
        assert_eq!(base_url("docker.io"), "https://registry-1.docker.io");
    }
}
