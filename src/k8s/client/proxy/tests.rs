//! Go's own cases for its proxy rules, from golang.org/x/net `http/httpproxy/proxy_test.go`
//! (golang/net at 29181b8c03a8e33d784696b8cf368d3d7b576a9e: `UseProxyTests` with its
//! `noProxy`, `TestInvalidNoProxy`, `TestAllNoProxy`, `proxyForURLTests`, `TestFromEnvironment*`),
//! and client-go's precedence of the kubeconfig's `proxy-url` (`clientcmd/client_config.go`,
//! `ClientConfig`: `clientConfig.Proxy = http.ProxyURL(u)`).

use std::collections::HashMap;

use super::*;

/// httpproxy's `noProxy` for `TestUseProxy`, verbatim.
const GO_NO_PROXY: &str = "foobar.com, .barbaz.net, *.wildcard.io, 192.168.1.1, 192.168.1.2:81, \
    192.168.1.3:80, 10.0.0.0/30, 2001:db8::52:0:1, [2001:db8::52:0:2]:443, [2001:db8::52:0:3]:80, \
    2002:db8:a::45/64";

/// httpproxy's `UseProxyTests`, verbatim: the host (each is asked for on port 80) and whether it
/// is proxied.
const USE_PROXY_TESTS: &[(&str, bool)] = &[
    // Never proxy localhost:
    ("localhost", false),
    ("127.0.0.1", false),
    ("127.0.0.2", false),
    ("[::1]", false),
    ("[::2]", true),                       // not a loopback address
    ("192.168.1.1", false),                // matches exact IPv4
    ("192.168.1.2", true),                 // ports do not match
    ("192.168.1.3", false),                // matches exact IPv4:port
    ("192.168.1.4", true),                 // no match
    ("10.0.0.2", false),                   // matches IPv4/CIDR
    ("[2001:db8::52:0:1]", false),         // matches exact IPv6
    ("[2001:db8::52:0:2]", true),          // no match
    ("[2001:db8::52:0:3]", false),         // matches exact [IPv6]:port
    ("[2002:db8:a::123]", false),          // matches IPv6/CIDR
    ("[fe80::424b:c8be:1643:a1b6]", true), // no match
    ("barbaz.net", true),                  // does not match as .barbaz.net
    ("www.barbaz.net", false),             // does match as .barbaz.net
    ("foobar.com", false),                 // does match as foobar.com
    ("www.foobar.com", false),             // match because NO_PROXY includes "foobar.com"
    ("foofoobar.com", true),               // not match as a part of foobar.com
    ("baz.com", true),                     // not match as a part of barbaz.com
    ("localhost.net", true),               // not match as suffix of address
    ("local.localhost", true),             // not match as prefix as address
    ("barbarbaz.net", true),               // not match, wrong domain
    ("wildcard.io", true),                 // does not match as *.wildcard.io
    ("nested.wildcard.io", false),         // match as *.wildcard.io
    ("awildcard.io", true),                // not a match because of '*'
];

fn unbracket(host: &str) -> &str {
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
}

#[test]
fn no_proxy_matches_go_httpproxy_use_proxy_table() {
    let np = NoProxy::parse(GO_NO_PROXY);
    for (host, proxied) in USE_PROXY_TESTS {
        assert_eq!(
            np.use_proxy(unbracket(host), "80"),
            *proxied,
            "useProxy({host}:80) with NO_PROXY={GO_NO_PROXY:?}"
        );
    }
}

#[test]
fn a_malformed_no_proxy_entry_is_ignored_not_fatal() {
    // TestInvalidNoProxy: ":1" has no host; it must not panic and must not match
    assert!(NoProxy::parse(":1").use_proxy("example.com", "80"));
}

#[test]
fn no_proxy_star_keeps_every_host_direct() {
    // TestAllNoProxy
    let np = NoProxy::parse("*");
    for (host, _) in USE_PROXY_TESTS {
        assert!(
            !np.use_proxy(unbracket(host), "80"),
            "{host} with NO_PROXY=*"
        );
    }
}

#[test]
fn ipv4_mapped_addresses_are_the_ipv4_addresses_they_map() {
    // Go's net.IP is 16 bytes for both; IsLoopback and Equal compare the IPv4 form
    assert!(!NoProxy::default().use_proxy("::ffff:127.0.0.1", "80"));
    assert!(!NoProxy::parse("10.1.2.3").use_proxy("::ffff:10.1.2.3", "80"));
}

/// httpproxy's `Config` for one case of `proxyForURLTests`.
#[derive(Default)]
struct Cfg {
    http: &'static str,
    https: &'static str,
    no: &'static str,
    cgi: bool,
}

fn env_of(cfg: &Cfg) -> ProxyEnv {
    let mut vars = HashMap::new();
    vars.insert("HTTP_PROXY", cfg.http);
    vars.insert("HTTPS_PROXY", cfg.https);
    vars.insert("NO_PROXY", cfg.no);
    if cfg.cgi {
        vars.insert("REQUEST_METHOD", "GET");
    }
    ProxyEnv::from_lookup(|k| vars.get(k).map(|v| v.to_string()))
}

/// What `choose` gives for the environment `cfg` and a request to `req`, written as the Go
/// test writes its `want`: the proxy URL, or `<nil>`.
fn proxy_for(cfg: &Cfg, req: &str) -> Result<String, ProxyError> {
    let req: Uri = req.parse().expect("request URL");
    Ok(match choose(&req, None, &env_of(cfg))? {
        None => "<nil>".to_string(),
        Some(p) => format!(
            "{}://{}",
            p.url.scheme_str().expect("scheme"),
            p.url.authority().expect("authority")
        ),
    })
}

#[test]
fn proxy_for_url_matches_go_httpproxy_proxy_for_url_table() {
    let default_req = "http://example.com";
    let cases: &[(Cfg, &str, &str)] = &[
        (
            Cfg {
                http: "127.0.0.1:8080",
                ..Cfg::default()
            },
            default_req,
            "http://127.0.0.1:8080",
        ),
        (
            Cfg {
                http: "cache.corp.example.com:1234",
                ..Cfg::default()
            },
            default_req,
            "http://cache.corp.example.com:1234",
        ),
        (
            Cfg {
                http: "cache.corp.example.com",
                ..Cfg::default()
            },
            default_req,
            "http://cache.corp.example.com",
        ),
        // single label domain is recognized as scheme by url.Parse
        (
            Cfg {
                http: "localhost",
                ..Cfg::default()
            },
            default_req,
            "http://localhost",
        ),
        (
            Cfg {
                http: "https://cache.corp.example.com",
                ..Cfg::default()
            },
            default_req,
            "https://cache.corp.example.com",
        ),
        (
            Cfg {
                http: "http://127.0.0.1:8080",
                ..Cfg::default()
            },
            default_req,
            "http://127.0.0.1:8080",
        ),
        (
            Cfg {
                http: "https://127.0.0.1:8080",
                ..Cfg::default()
            },
            default_req,
            "https://127.0.0.1:8080",
        ),
        (
            Cfg {
                http: "socks5://127.0.0.1",
                ..Cfg::default()
            },
            default_req,
            "socks5://127.0.0.1",
        ),
        // Don't use secure for http
        (
            Cfg {
                http: "http.proxy.tld",
                https: "secure.proxy.tld",
                ..Cfg::default()
            },
            "http://insecure.tld/",
            "http://http.proxy.tld",
        ),
        // Use secure for https.
        (
            Cfg {
                http: "http.proxy.tld",
                https: "secure.proxy.tld",
                ..Cfg::default()
            },
            "https://secure.tld/",
            "http://secure.proxy.tld",
        ),
        (
            Cfg {
                http: "http.proxy.tld",
                https: "https://secure.proxy.tld",
                ..Cfg::default()
            },
            "https://secure.tld/",
            "https://secure.proxy.tld",
        ),
        (
            Cfg {
                http: "http.proxy.tld",
                ..Cfg::default()
            },
            "https://secure.tld/",
            "<nil>",
        ),
        (
            Cfg {
                http: "http.proxy.tld",
                ..Cfg::default()
            },
            "ftp://insecure.tld/",
            "<nil>",
        ),
        // HTTPS proxy is still used even in CGI environment.
        (
            Cfg {
                https: "https://secure.proxy.tld",
                cgi: true,
                ..Cfg::default()
            },
            "https://secure.tld/",
            "https://secure.proxy.tld",
        ),
        (Cfg::default(), default_req, "<nil>"),
        (
            Cfg {
                no: "example.com",
                http: "proxy",
                ..Cfg::default()
            },
            "http://example.com/",
            "<nil>",
        ),
        (
            Cfg {
                no: ".example.com",
                http: "proxy",
                ..Cfg::default()
            },
            "http://example.com/",
            "http://proxy",
        ),
        (
            Cfg {
                no: "ample.com",
                http: "proxy",
                ..Cfg::default()
            },
            "http://example.com/",
            "http://proxy",
        ),
        (
            Cfg {
                no: "example.com",
                http: "proxy",
                ..Cfg::default()
            },
            "http://foo.example.com/",
            "<nil>",
        ),
        (
            Cfg {
                no: ".foo.com",
                http: "proxy",
                ..Cfg::default()
            },
            "http://example.com/",
            "http://proxy",
        ),
        // Go's cases with non-ASCII names (IDNA) are left out: an API server's URL is ASCII
        // (http::Uri admits nothing else), and kruised does not convert NO_PROXY entries to
        // punycode; so is the one with a zone in a bracketed IPv6 host, which http::Uri refuses
    ];
    for (cfg, req, want) in cases {
        let got = proxy_for(cfg, req);
        assert_eq!(
            got.as_deref(),
            Ok(*want),
            "http_proxy={:?} https_proxy={:?} no_proxy={:?} cgi={} req={req:?}",
            cfg.http,
            cfg.https,
            cfg.no,
            cfg.cgi
        );
    }
}

#[test]
fn an_unknown_proxy_scheme_is_kept_and_then_refused() {
    // proxyForURLTests: "Preserve unknown schemes" (foo://host); Go's transport then fails the
    // request, kruised fails building the client and says why
    let got = proxy_for(
        &Cfg {
            http: "foo://host",
            ..Cfg::default()
        },
        "http://example.com",
    );
    assert_eq!(
        got,
        Err(ProxyError::UnsupportedScheme {
            origin: ProxyOrigin::Env("HTTP_PROXY"),
            value: "foo://host".to_string(),
            scheme: "foo".to_string(),
        })
    );
}

#[test]
fn http_proxy_is_refused_in_a_cgi_environment() {
    // proxyForURLTests, Issue 16405: HTTP_PROXY can be attacker-controlled under CGI
    let cfg = Cfg {
        http: "http://10.1.2.3:8080",
        cgi: true,
        ..Cfg::default()
    };
    assert_eq!(proxy_for(&cfg, "http://example.com"), Err(ProxyError::Cgi));
}

#[test]
fn environment_is_read_upper_case_first_then_lower_case() {
    // TestFromEnvironment, TestFromEnvironmentLowerCase, TestFromEnvironmentWithRequestMethod
    let upper: HashMap<&str, &str> = [
        ("HTTP_PROXY", "httpproxy"),
        ("HTTPS_PROXY", "httpsproxy"),
        ("NO_PROXY", "noproxy"),
        ("http_proxy", "lower"),
        ("REQUEST_METHOD", ""),
    ]
    .into();
    let env = ProxyEnv::from_lookup(|k| upper.get(k).map(|v| v.to_string()));
    assert_eq!(
        env,
        ProxyEnv {
            http_proxy: Some(("HTTP_PROXY", "httpproxy".into())),
            https_proxy: Some(("HTTPS_PROXY", "httpsproxy".into())),
            no_proxy: "noproxy".into(),
            cgi: false,
        }
    );
    let lower: HashMap<&str, &str> = [
        ("HTTP_PROXY", ""),
        ("http_proxy", "httpproxy"),
        ("https_proxy", "httpsproxy"),
        ("no_proxy", "noproxy"),
        ("REQUEST_METHOD", "PUT"),
    ]
    .into();
    let env = ProxyEnv::from_lookup(|k| lower.get(k).map(|v| v.to_string()));
    assert_eq!(
        env,
        ProxyEnv {
            http_proxy: Some(("http_proxy", "httpproxy".into())),
            https_proxy: Some(("https_proxy", "httpsproxy".into())),
            no_proxy: "noproxy".into(),
            cgi: true,
        },
        "an empty upper-case variable counts as unset"
    );
}

#[test]
fn the_kubeconfig_proxy_url_wins_over_the_environment_and_no_proxy() {
    // client-go: a cluster's proxy-url becomes rest.Config.Proxy = http.ProxyURL(u), used for
    // every request: the environment, NO_PROXY and the loopback rule do not apply
    let env = env_of(&Cfg {
        https: "http://env-proxy:3128",
        no: "*",
        ..Cfg::default()
    });
    for cluster in [
        "https://127.0.0.1:6443",
        "https://api.example.com",
        "http://localhost:8080",
    ] {
        let p = choose(
            &cluster.parse().expect("url"),
            Some("socks5://user:p%40ss@sp:1080"),
            &env,
        )
        .expect("valid")
        .expect("a proxy");
        assert_eq!(p.scheme, ProxyScheme::Socks5, "{cluster}");
        assert_eq!(p.origin, ProxyOrigin::Kubeconfig);
        assert_eq!(p.authority(), "sp:1080");
        assert_eq!(p.credentials(), Some(("user".into(), "p@ss".into())));
    }
}

#[test]
fn a_kubeconfig_proxy_url_of_another_scheme_is_refused_as_client_go_refuses_it() {
    let err = choose(
        &"https://api.example.com".parse().expect("url"),
        Some("ftp://proxy:21"),
        &ProxyEnv::default(),
    )
    .expect_err("ftp is no proxy scheme");
    assert_eq!(
        err.to_string(),
        "proxy \"ftp://proxy:21\" from the kubeconfig's proxy-url: unsupported scheme \"ftp\", \
         must be http, https, or socks5"
    );
}

#[test]
fn the_cluster_port_defaults_by_scheme_when_no_proxy_names_a_port() {
    let env = env_of(&Cfg {
        https: "proxy:3128",
        http: "proxy:3128",
        no: "api.example.com:443",
        ..Cfg::default()
    });
    let direct = choose(&"https://api.example.com".parse().expect("url"), None, &env);
    assert_eq!(direct, Ok(None), "https without a port is :443");
    let proxied = choose(&"http://api.example.com".parse().expect("url"), None, &env)
        .expect("valid")
        .expect("proxied: http without a port is :80");
    assert_eq!(proxied.authority(), "proxy:3128");
    assert_eq!(proxied.origin, ProxyOrigin::Env("HTTP_PROXY"));
}

#[test]
fn proxy_ports_default_by_the_proxy_scheme() {
    for (url, authority) in [
        ("http://p", "p:80"),
        ("https://p", "p:443"),
        ("socks5://p", "p:1080"),
        ("http://u:pw@p:8080", "p:8080"),
    ] {
        let p = choose(
            &"https://api".parse().expect("url"),
            Some(url),
            &ProxyEnv::default(),
        )
        .expect("valid")
        .expect("a proxy");
        assert_eq!(p.authority(), authority, "{url}");
    }
}

#[test]
fn a_proxy_password_never_appears_in_an_error_or_a_debug_line() {
    // issue 43, row 9: HTTPS_PROXY=socks4://u:secret@p:1080 printed the password
    let err = proxy_for(
        &Cfg {
            https: "socks4://u:secret@p:1080",
            ..Cfg::default()
        },
        "https://example.com",
    )
    .expect_err("socks4 is no proxy scheme");
    let text = err.to_string();
    assert!(!text.contains("secret"), "{text}");
    assert!(text.contains("socks4://u:xxxxx@p:1080"), "{text}");
    let err = choose(
        &"https://api.example.com".parse().expect("url"),
        Some("http://u:secret@bad host"),
        &ProxyEnv::default(),
    )
    .expect_err("a space is no URL");
    assert!(!err.to_string().contains("secret"), "{err}");
    let p = choose(
        &"https://api.example.com".parse().expect("url"),
        Some("socks5://u:secret@sp:1080"),
        &ProxyEnv::default(),
    )
    .expect("socks5")
    .expect("a proxy");
    let debug = format!("{p:?}");
    assert!(
        !debug.contains("secret") && debug.contains("xxxxx"),
        "{debug}"
    );
    assert_eq!(p.credentials(), Some(("u".into(), "secret".into())));
}

#[test]
fn redact_hides_only_the_password_of_the_user_info() {
    for (value, want) in [
        ("http://u:p@h:1/x@y", "http://u:xxxxx@h:1/x@y"),
        ("u:p:q@h:1", "u:xxxxx@h:1"),
        ("http://u@h:1", "http://u@h:1"),
        ("http://h:1/p:q@r", "http://h:1/p:q@r"),
        ("socks5://a%40b:p%3A@h", "socks5://a%40b:xxxxx@h"),
    ] {
        assert_eq!(redact(value), want, "{value}");
    }
}
