//! Listen addresses in Go's style (`:10221`, `host:port`, `[ipv6]:port`, `localhost:port`), as
//! kruise-daemon's `--addr` and `--pprof-addr` take them.

use std::net::{AddrParseError, IpAddr, Ipv4Addr, SocketAddr};

/// Why [`parse_addr`] rejected an address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddrError {
    /// There is no `:port`.
    #[error("address {addr:?} has no port (want :port, host:port or [ipv6]:port)")]
    MissingPort {
        /// The address as given.
        addr: String,
    },
    /// The port is not a number from 0 to 65535.
    #[error("address {addr:?} has an invalid port {port:?}")]
    InvalidPort {
        /// The address as given.
        addr: String,
        /// The part after the last `:`.
        port: String,
    },
    /// An IPv6 address without brackets: its colons make the port ambiguous.
    #[error("address {addr:?}: IPv6 hosts need brackets, as in [::1]:10221")]
    UnbracketedIpv6 {
        /// The address as given.
        addr: String,
    },
    /// The host is neither an IP address nor `localhost` (names are not resolved).
    #[error("address {addr:?}: host {host:?} is not an IP address or localhost")]
    InvalidHost {
        /// The address as given.
        addr: String,
        /// The host part.
        host: String,
        /// Why it did not parse as an IP address.
        #[source]
        source: AddrParseError,
    },
}

/// Parses a listen address the way kruise-daemon's Go flags spell it: `:10221` (all IPv4
/// interfaces), `127.0.0.1:10221`, `localhost:10222` (the chart's `--pprof-addr`), `[::1]:10221`.
///
/// As in Go (`net.SplitHostPort` takes any host out of the brackets), an IPv4 host may be
/// bracketed too: `[10.0.0.7]:10221`. That is what lets one manifest say
/// `--addr=[$(POD_IP)]:10221` for IPv4 and IPv6 pod IPs alike.
///
/// Unlike Go, `:port` means `0.0.0.0`, not a dual-stack `[::]`; write `[::]:port` for IPv6.
pub fn parse_addr(s: &str) -> Result<SocketAddr, AddrError> {
    let missing_port = || AddrError::MissingPort { addr: s.to_owned() };
    let (host, port, bracketed) = match s.strip_prefix('[') {
        Some(rest) => {
            let (host, port) = rest.split_once("]:").ok_or_else(missing_port)?;
            (host, port, true)
        }
        None => {
            let (host, port) = s.rsplit_once(':').ok_or_else(missing_port)?;
            if host.contains(':') {
                return Err(AddrError::UnbracketedIpv6 { addr: s.to_owned() });
            }
            (host, port, false)
        }
    };
    let port = port
        .bytes()
        .all(|b| b.is_ascii_digit())
        .then(|| port.parse::<u16>().ok())
        .flatten()
        .ok_or_else(|| AddrError::InvalidPort {
            addr: s.to_owned(),
            port: port.to_owned(),
        })?;
    let invalid_host = |source| AddrError::InvalidHost {
        addr: s.to_owned(),
        host: host.to_owned(),
        source,
    };
    let ip: IpAddr = match host {
        "" if !bracketed => Ipv4Addr::UNSPECIFIED.into(),
        "localhost" => Ipv4Addr::LOCALHOST.into(),
        // unbracketed, a host has no colon (checked above), so only IPv4 parses here
        _ => host.parse::<IpAddr>().map_err(invalid_host)?,
    };
    Ok(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::net::Ipv6Addr;

    #[test]
    fn parse_addr_accepts_go_style_addresses() {
        let ok = |s: &str| parse_addr(s).unwrap_or_else(|e| panic!("{s}: {e}"));
        assert_eq!(ok(":10221"), "0.0.0.0:10221".parse().expect("addr"));
        assert_eq!(
            ok("127.0.0.1:8080"),
            "127.0.0.1:8080".parse().expect("addr")
        );
        assert_eq!(
            ok("localhost:10222"),
            "127.0.0.1:10222".parse().expect("addr")
        );
        assert_eq!(ok("[::1]:10221"), "[::1]:10221".parse().expect("addr"));
        assert_eq!(ok("[::]:0"), "[::]:0".parse().expect("addr"));
    }

    /// deploy/daemonset.yaml passes `--addr=[$(POD_IP)]:10221`: the kubelet puts the pod's IP
    /// between the brackets, IPv4 or IPv6 (Go's `net.SplitHostPort` accepts both the same way).
    #[test]
    fn parse_addr_accepts_a_bracketed_pod_ip_of_either_family() {
        for (given, want) in [
            ("[10.244.1.7]:10221", "10.244.1.7:10221"),
            ("[fd00:10:244::7]:10221", "[fd00:10:244::7]:10221"),
        ] {
            assert_eq!(
                parse_addr(given),
                Ok(want.parse().expect("addr")),
                "{given}"
            );
        }
        assert!(
            matches!(
                parse_addr("[$(POD_IP)]:10221"),
                Err(AddrError::InvalidHost { .. })
            ),
            "an unexpanded reference (POD_IP not in the env) is refused"
        );
        assert!(
            matches!(parse_addr("[]:10221"), Err(AddrError::InvalidHost { .. })),
            "an empty pod IP is refused, not taken for every interface"
        );
    }

    #[test]
    fn parse_addr_rejects_what_it_cannot_bind() {
        let err = |s: &str| parse_addr(s).expect_err(s);
        assert!(matches!(err("10221"), AddrError::MissingPort { .. }));
        assert!(matches!(err("[::1]"), AddrError::MissingPort { .. }));
        assert!(matches!(err(":"), AddrError::InvalidPort { .. }));
        assert!(matches!(err(":+80"), AddrError::InvalidPort { .. }));
        assert!(matches!(err(":65536"), AddrError::InvalidPort { .. }));
        assert!(matches!(err("::1:80"), AddrError::UnbracketedIpv6 { .. }));
        assert!(matches!(
            err("example.com:80"),
            AddrError::InvalidHost { .. }
        ));
        assert!(matches!(
            err("[10.0.0.256]:80"),
            AddrError::InvalidHost { .. }
        ));
        assert_eq!(
            err("nope:80").to_string(),
            "address \"nope:80\": host \"nope\" is not an IP address or localhost"
        );
    }

    proptest! {
        #[test]
        fn parse_addr_round_trips_displayed_socket_addrs(
            v4 in any::<[u8; 4]>(),
            v6 in any::<[u16; 8]>(),
            port in any::<u16>(),
        ) {
            let v4 = SocketAddr::new(Ipv4Addr::from(v4).into(), port);
            prop_assert_eq!(parse_addr(&v4.to_string()), Ok(v4));
            let v6 = SocketAddr::new(Ipv6Addr::from(v6).into(), port);
            prop_assert_eq!(parse_addr(&v6.to_string()), Ok(v6));
            let any = SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), port);
            prop_assert_eq!(parse_addr(&format!(":{port}")), Ok(any));
        }
    }
}
