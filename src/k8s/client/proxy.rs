//! Which proxy the API client goes through, by client-go's rules: the kubeconfig cluster's
//! `proxy-url` for every request when it has one (clientcmd sets `rest.Config.Proxy =
//! http.ProxyURL(u)`), else the environment as Go's `http.ProxyFromEnvironment` reads it
//! (golang.org/x/net/http/httpproxy, whose rules this module follows line by line).
//!
//! The API client talks to one server, so the choice is made once, when the client is built.

use std::net::IpAddr;

use http::Uri;

/// The proxy variables of the environment, as httpproxy's `FromEnvironment` reads them: the
/// upper-case name first, then the lower-case one; an empty value counts as unset.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProxyEnv {
    /// `HTTP_PROXY` / `http_proxy`, with the name it was read from.
    pub http_proxy: Option<(&'static str, String)>,
    /// `HTTPS_PROXY` / `https_proxy`, with the name it was read from.
    pub https_proxy: Option<(&'static str, String)>,
    /// `NO_PROXY` / `no_proxy`.
    pub no_proxy: String,
    /// `REQUEST_METHOD` is set: a CGI environment, where `HTTP_PROXY` can come from a request
    /// header and is refused (golang.org/s/cgihttpproxy).
    pub cgi: bool,
}

impl ProxyEnv {
    /// Reads this process's environment.
    pub fn from_process() -> Self {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads the variables through `get` (tests pass a table).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Self {
        let any = |names: [&'static str; 2]| {
            names
                .into_iter()
                .find_map(|n| get(n).filter(|v| !v.is_empty()).map(|v| (n, v)))
        };
        ProxyEnv {
            http_proxy: any(["HTTP_PROXY", "http_proxy"]),
            https_proxy: any(["HTTPS_PROXY", "https_proxy"]),
            no_proxy: any(["NO_PROXY", "no_proxy"])
                .map(|(_, v)| v)
                .unwrap_or_default(),
            cgi: get("REQUEST_METHOD").is_some_and(|v| !v.is_empty()),
        }
    }
}

/// How kruised speaks to a proxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProxyScheme {
    /// Plain HTTP to the proxy: `CONNECT` for an https server, absolute-form requests for an
    /// http one (as Go's transport does).
    Http,
    /// The same over TLS to the proxy.
    Https,
    /// SOCKS5 (RFC 1928), the server's name resolved by the proxy.
    Socks5,
}

impl ProxyScheme {
    /// The port a proxy URL without one means (Go's `portMap`).
    pub fn default_port(self) -> u16 {
        match self {
            ProxyScheme::Http => 80,
            ProxyScheme::Https => 443,
            ProxyScheme::Socks5 => 1080,
        }
    }
}

/// Where the proxy setting came from, for messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProxyOrigin {
    /// The kubeconfig cluster's `proxy-url`.
    Kubeconfig,
    /// The environment variable of that name.
    Env(&'static str),
}

impl std::fmt::Display for ProxyOrigin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProxyOrigin::Kubeconfig => f.write_str("the kubeconfig's proxy-url"),
            ProxyOrigin::Env(name) => f.write_str(name),
        }
    }
}

/// The proxy the API client goes through. Its `Debug` hides the password of the URL's user
/// info ([`redact`]).
#[derive(Clone, PartialEq, Eq)]
pub struct Proxy {
    /// The proxy's URL, user info included.
    pub url: Uri,
    /// How to speak to it.
    pub scheme: ProxyScheme,
    /// Where it was set.
    pub origin: ProxyOrigin,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("url", &redact(&self.url.to_string()))
            .field("scheme", &self.scheme)
            .field("origin", &self.origin)
            .finish()
    }
}

/// `value` (a proxy URL or `user:pass@host:port`) with the password of its user info replaced
/// by `xxxxx`, as Go's `url.Redacted` writes it: for errors and logs, which must never carry a
/// proxy's password.
pub fn redact(value: &str) -> String {
    let start = value.find("://").map_or(0, |i| i + 3);
    let end = value[start..]
        .find(['/', '?', '#'])
        .map_or(value.len(), |i| start + i);
    let Some(at) = value[start..end].rfind('@').map(|i| start + i) else {
        return value.to_string();
    };
    match value[start..at].find(':') {
        Some(colon) => format!("{}:xxxxx{}", &value[..start + colon], &value[at..]),
        None => value.to_string(),
    }
}

impl Proxy {
    /// The proxy's `host:port`, the port explicit.
    pub fn authority(&self) -> String {
        let host = self.url.host().unwrap_or_default();
        let port = self
            .url
            .port_u16()
            .unwrap_or_else(|| self.scheme.default_port());
        format!("{host}:{port}")
    }

    /// The proxy's user and password from its URL's user info, percent-decoded.
    pub fn credentials(&self) -> Option<(String, String)> {
        let authority = self.url.authority()?.as_str();
        let (userinfo, _) = authority.rsplit_once('@')?;
        let decode = |s: &str| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8_lossy()
                .into_owned()
        };
        Some(match userinfo.split_once(':') {
            Some((user, pass)) => (decode(user), decode(pass)),
            None => (decode(userinfo), String::new()),
        })
    }
}

/// The proxy setting cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProxyError {
    /// The kubeconfig's `proxy-url` is not a URL (client-go: "could not parse").
    #[error("the kubeconfig's proxy-url {value:?} could not be parsed")]
    KubeconfigUnparsable {
        /// The value.
        value: String,
    },
    /// A proxy URL names a scheme other than http, https and socks5.
    #[error(
        "proxy {value:?} from {origin}: unsupported scheme {scheme:?}, must be http, https, or socks5"
    )]
    UnsupportedScheme {
        /// Where it was set.
        origin: ProxyOrigin,
        /// The value.
        value: String,
        /// Its scheme.
        scheme: String,
    },
    /// `HTTP_PROXY` in a CGI environment (httpproxy's own message).
    #[error("refusing to use HTTP_PROXY value in CGI environment; see golang.org/s/cgihttpproxy")]
    Cgi,
}

/// The proxy for requests to `cluster`: the kubeconfig's `proxy_url` when set (for every
/// request, as client-go), else `env` by httpproxy's `ProxyForURL`: `HTTPS_PROXY` for an https
/// server, `HTTP_PROXY` for an http one, none for `localhost`, loopback addresses and what
/// `NO_PROXY` names.
pub fn choose(
    cluster: &Uri,
    kubeconfig_proxy: Option<&str>,
    env: &ProxyEnv,
) -> Result<Option<Proxy>, ProxyError> {
    if let Some(value) = kubeconfig_proxy.filter(|v| !v.is_empty()) {
        let url: Uri = value
            .parse()
            .map_err(|_| ProxyError::KubeconfigUnparsable {
                value: redact(value),
            })?;
        return proxy_of(url, value, ProxyOrigin::Kubeconfig).map(Some);
    }
    let configured = match cluster.scheme_str() {
        Some("https") => env.https_proxy.as_ref(),
        Some("http") => {
            if env.http_proxy.is_some() && env.cgi {
                return Err(ProxyError::Cgi);
            }
            env.http_proxy.as_ref()
        }
        _ => None,
    };
    // httpproxy ignores a value it cannot parse at all
    let Some((name, value, url)) =
        configured.and_then(|(n, v)| Some((*n, v.as_str(), parse_env_proxy(v)?)))
    else {
        return Ok(None);
    };
    let host = cluster.host().unwrap_or_default();
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let port = match cluster.port_u16() {
        Some(p) => p.to_string(),
        None if cluster.scheme_str() == Some("https") => "443".into(),
        None => "80".into(),
    };
    if !NoProxy::parse(&env.no_proxy).use_proxy(host, &port) {
        return Ok(None);
    }
    proxy_of(url, value, ProxyOrigin::Env(name)).map(Some)
}

fn proxy_of(url: Uri, value: &str, origin: ProxyOrigin) -> Result<Proxy, ProxyError> {
    let scheme = match url.scheme_str() {
        Some("http") => ProxyScheme::Http,
        Some("https") => ProxyScheme::Https,
        Some("socks5") => ProxyScheme::Socks5,
        other => {
            return Err(ProxyError::UnsupportedScheme {
                origin,
                value: redact(value),
                scheme: other.unwrap_or_default().to_string(),
            });
        }
    };
    Ok(Proxy {
        url,
        scheme,
        origin,
    })
}

/// httpproxy's `parseProxy`: a URL of scheme http, https or socks5 as it is; anything else is
/// tried as `http://<value>` ("host[:port]" means an http proxy); what still does not parse is
/// kept as it was when it parses at all (its scheme is refused later), else ignored.
fn parse_env_proxy(value: &str) -> Option<Uri> {
    let parsed = value.parse::<Uri>().ok();
    let known = |u: &Uri| matches!(u.scheme_str(), Some("http" | "https" | "socks5"));
    if let Some(u) = parsed.as_ref().filter(|u| known(u)) {
        return Some(u.clone());
    }
    // Go's url.Parse reads "foo://host" as scheme foo; http::Uri agrees, and prepending
    // http:// to it cannot parse, so an unknown scheme is preserved as httpproxy preserves it
    if !value.contains("://")
        && let Ok(u) = format!("http://{value}").parse::<Uri>()
    {
        return Some(u);
    }
    parsed.filter(|u| u.scheme().is_some() && u.host().is_some())
}

// === impl NoProxy ===

/// `NO_PROXY` parsed as httpproxy's `config.init` parses it: comma-separated, trimmed and
/// lower-cased entries; `*` matches everything; an IP or CIDR matches addresses; anything else
/// is a domain (`foo.com` matches it and its subdomains, `.foo.com` and `*.foo.com` the
/// subdomains only), each optionally with `:port`; malformed entries are ignored.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NoProxy {
    all: bool,
    ips: Vec<IpRule>,
    domains: Vec<DomainRule>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum IpRule {
    Cidr { net: IpAddr, prefix: u8 },
    Ip { ip: IpAddr, port: String },
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct DomainRule {
    /// With a leading `.`.
    suffix: String,
    port: String,
    /// The entry had no leading `.`: the name itself matches too.
    match_host: bool,
}

impl NoProxy {
    /// Parses a `NO_PROXY` value; never fails (httpproxy ignores what it cannot read).
    pub fn parse(value: &str) -> NoProxy {
        let mut np = NoProxy::default();
        for entry in value.split(',') {
            let p = entry.trim().to_lowercase();
            if p.is_empty() {
                continue;
            }
            if p == "*" {
                return NoProxy {
                    all: true,
                    ..NoProxy::default()
                };
            }
            if let Some((net, prefix)) = parse_cidr(&p) {
                np.ips.push(IpRule::Cidr { net, prefix });
                continue;
            }
            let (mut host, port) = match split_host_port(&p) {
                Some(("", _)) => continue,
                Some((host, port)) => (host.to_string(), port.to_string()),
                None => (p.clone(), String::new()),
            };
            if host.starts_with('[') && host.ends_with(']') {
                host = host[1..host.len() - 1].to_string();
            }
            if let Ok(ip) = host.parse::<IpAddr>() {
                np.ips.push(IpRule::Ip {
                    ip: ip.to_canonical(),
                    port,
                });
                continue;
            }
            if host.is_empty() {
                continue;
            }
            if let Some(rest) = host.strip_prefix("*.") {
                host = format!(".{rest}");
            }
            let match_host = !host.starts_with('.');
            if match_host {
                host = format!(".{host}");
            }
            np.domains.push(DomainRule {
                suffix: host,
                port,
                match_host,
            });
        }
        np
    }

    /// httpproxy's `useProxy` for a request to `host` (no brackets) on `port`: never for
    /// `localhost` and loopback addresses, else unless an entry matches.
    pub fn use_proxy(&self, host: &str, port: &str) -> bool {
        if host == "localhost" {
            return false;
        }
        let ip = host.parse::<IpAddr>().ok().map(|ip| ip.to_canonical());
        if ip.is_some_and(|ip| ip.is_loopback()) {
            return false;
        }
        if self.all {
            return false;
        }
        let host = host.trim().to_lowercase();
        if let Some(ip) = ip {
            for rule in &self.ips {
                let hit = match rule {
                    IpRule::Cidr { net, prefix } => cidr_contains(*net, *prefix, ip),
                    IpRule::Ip {
                        ip: rip,
                        port: rport,
                    } => *rip == ip && (rport.is_empty() || rport == port),
                };
                if hit {
                    return false;
                }
            }
        }
        for rule in &self.domains {
            let name_hit =
                host.ends_with(&rule.suffix) || (rule.match_host && host == rule.suffix[1..]);
            if name_hit && (rule.port.is_empty() || rule.port == port) {
                return false;
            }
        }
        true
    }
}

/// Go's `net.ParseCIDR`: `addr/prefix`, the prefix decimal and within the address's length.
fn parse_cidr(s: &str) -> Option<(IpAddr, u8)> {
    let (addr, prefix) = s.split_once('/')?;
    let ip: IpAddr = addr.parse().ok()?;
    if prefix.is_empty() || !prefix.bytes().all(|b| b.is_ascii_digit()) || prefix.len() > 3 {
        return None;
    }
    let prefix: u8 = prefix.parse().ok()?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    (prefix <= max).then_some((ip, prefix))
}

fn cidr_contains(net: IpAddr, prefix: u8, ip: IpAddr) -> bool {
    match (net, ip) {
        (IpAddr::V4(n), IpAddr::V4(a)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            u32::from(n) & mask == u32::from(a) & mask
        }
        (IpAddr::V6(n), IpAddr::V6(a)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            u128::from(n) & mask == u128::from(a) & mask
        }
        _ => false,
    }
}

/// Go's `net.SplitHostPort`: `host:port` or `[host]:port` (brackets removed); `None` where Go
/// answers an error (no port, too many colons, stray brackets). The port may be empty.
fn split_host_port(s: &str) -> Option<(&str, &str)> {
    let i = s.rfind(':')?;
    let (host, j, k) = if s.starts_with('[') {
        let end = s.find(']')?;
        if end + 1 != i {
            return None;
        }
        (&s[1..end], 1, end + 1)
    } else {
        let host = &s[..i];
        if host.contains(':') {
            return None;
        }
        (host, 0, 0)
    };
    if s[j..].contains('[') || s[k..].contains(']') {
        return None;
    }
    Some((host, &s[i + 1..]))
}

#[cfg(test)]
mod tests;
