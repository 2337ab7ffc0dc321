//! Where a pod's probes and lifecycle hooks may go: the pod's own IPs, and nowhere else.
//!
//! A probe's or hook's `host` is written by the pod's author (a PodProbeMarker, a pod spec, a
//! recreate request). Dialled as written, it makes the node fetch any address it reaches (its
//! own loopback services, a cloud's metadata server) with the answer going back into a status the
//! author reads. The kubelet's probes report no body, and kruise-manager refuses `host` in its
//! PodProbeMarker webhook since kruise #2309, but older managers pass it, and hooks never had
//! such a check. So kruised dials only the pod's IPs: those its sandbox reports to the runtime,
//! and its `status.podIPs` (the kubelet's: for a host-network pod, whose sandbox reports none,
//! the node's IP, where the kubelet sends its own probes and hooks too). A handler naming another
//! host fails, saying why. [`PodIps::address`] is the one resolver of a handler's host and
//! port, for hooks and probes alike.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::ContainerPort;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::cri::PodSandboxStatus;

/// The IPs of one pod, the first its primary.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodIps(Vec<IpAddr>);

/// Why a handler's target was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    /// The pod has no IP (yet): nothing to dial.
    #[error("the pod has no IP yet")]
    NoIp,
    /// The handler names a host that is not one of the pod's IPs.
    #[error(
        "host {host:?} is not the pod's (its IPs: {ips}): kruised sends probes and hooks to the \
         pod itself only"
    )]
    NotThePod {
        /// The host the handler named.
        host: String,
        /// The pod's IPs, comma-separated.
        ips: String,
    },
    /// The handler's port is no port (out of range, or zero).
    #[error("invalid port number: {0}")]
    InvalidPort(String),
    /// A named port the container does not have.
    #[error("named port {0:?} not found in the container's ports")]
    NoSuchPort(String),
}

impl TargetError {
    /// Whether the handler's port is wrong (rather than its host): the handler cannot run at
    /// all, whoever the pod is.
    pub fn is_port(&self) -> bool {
        matches!(
            self,
            TargetError::InvalidPort(_) | TargetError::NoSuchPort(_)
        )
    }
}

/// A handler's port: a number, or a name looked up in `named` (the container's ports; a probe
/// from kruise-manager has its names resolved already, and passes none).
pub fn resolve_port(port: &IntOrString, named: &[ContainerPort]) -> Result<u16, TargetError> {
    let number = |n: i64| {
        u16::try_from(n)
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| TargetError::InvalidPort(n.to_string()))
    };
    match port {
        IntOrString::Int(n) => number(i64::from(*n)),
        IntOrString::String(name) => match name.parse::<i64>() {
            Ok(n) => number(n),
            Err(_) => named
                .iter()
                .find(|p| p.name.as_deref() == Some(name.as_str()))
                .ok_or_else(|| TargetError::NoSuchPort(name.clone()))
                .and_then(|p| number(i64::from(p.container_port))),
        },
    }
}

impl PodIps {
    /// The IPs among `ips` (strings that are no IP are left out), each once, in order.
    pub fn new<S: AsRef<str>>(ips: impl IntoIterator<Item = S>) -> Self {
        let mut out: Vec<IpAddr> = Vec::new();
        for ip in ips {
            if let Ok(ip) = ip.as_ref().trim().parse::<IpAddr>()
                && !out.contains(&ip)
            {
                out.push(ip);
            }
        }
        PodIps(out)
    }

    /// The pod's IPs from its sandbox's status (the runtime's view) and its `status.podIPs`
    /// (the kubelet's), the sandbox's first.
    pub fn of<S: AsRef<str>>(
        sandbox: Option<&PodSandboxStatus>,
        status_ips: impl IntoIterator<Item = S>,
    ) -> Self {
        let from_sandbox = sandbox
            .into_iter()
            .flat_map(|s| std::iter::once(&s.ip).chain(&s.additional_ips))
            .map(|s| s.as_str().to_string());
        let from_status = status_ips.into_iter().map(|s| s.as_ref().to_string());
        Self::new(from_sandbox.chain(from_status))
    }

    /// The primary IP, as text.
    pub fn primary(&self) -> Option<String> {
        self.0.first().map(IpAddr::to_string)
    }

    /// Whether the pod has no IP.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The host and port to dial for a handler that names `host` and `port` (see [`host`] and
    /// [`resolve_port`]): the host is checked first.
    ///
    /// [`host`]: PodIps::host
    pub fn address(
        &self,
        host: Option<&str>,
        port: &IntOrString,
        named_ports: &[ContainerPort],
    ) -> Result<(String, u16), TargetError> {
        let host = self.host(host)?;
        Ok((host, resolve_port(port, named_ports)?))
    }

    /// The host to dial for a handler that names `named` (none or empty: the pod's primary IP).
    /// A named host must be one of the pod's IPs, written as an IP: a name could resolve
    /// anywhere.
    pub fn host(&self, named: Option<&str>) -> Result<String, TargetError> {
        let named = named.map(str::trim).filter(|h| !h.is_empty());
        let Some(named) = named else {
            return self.primary().ok_or(TargetError::NoIp);
        };
        // `[::1]` as a URL writes it
        let bare = named.trim_start_matches('[').trim_end_matches(']');
        match bare.parse::<IpAddr>() {
            Ok(ip) if self.0.contains(&ip) => Ok(ip.to_string()),
            _ => Err(TargetError::NotThePod {
                host: named.to_string(),
                ips: self
                    .0
                    .iter()
                    .map(IpAddr::to_string)
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handler_without_a_host_goes_to_the_pods_primary_ip() {
        // the sandbox's IPs (primary, then dual-stack), then the pod's status: each once
        let ips = PodIps::new(["10.0.0.5", "fd00::5", "10.0.0.5"]);
        assert_eq!(ips.host(None).as_deref(), Ok("10.0.0.5"));
        assert_eq!(ips.host(Some("")).as_deref(), Ok("10.0.0.5"));
        assert_eq!(ips.host(Some("fd00::5")).as_deref(), Ok("fd00::5"));
        assert_eq!(ips.host(Some("[fd00::5]")).as_deref(), Ok("fd00::5"));
    }

    #[test]
    fn a_host_network_pod_is_reached_at_its_status_ip_not_at_kruiseds_loopback() {
        // its sandbox reports no IP; 2c6dc4e sent its hooks to 127.0.0.1 in kruised's network
        // namespace, where the kubelet sends them to status.podIP
        let ips = PodIps::of(None, ["", "192.168.1.7"]);
        assert_eq!(ips.host(None).as_deref(), Ok("192.168.1.7"));
        assert_eq!(
            PodIps::of(None, Vec::<String>::new()).host(None),
            Err(TargetError::NoIp)
        );
    }

    #[test]
    fn a_port_is_a_number_in_range_or_a_name_of_the_containers_ports() {
        let ports: Vec<ContainerPort> =
            serde_json::from_str(r#"[{"name":"http","containerPort":8080,"protocol":"TCP"}]"#)
                .expect("ports");
        let port = |p: IntOrString| resolve_port(&p, &ports);
        assert_eq!(port(IntOrString::String("http".into())), Ok(8080));
        assert_eq!(port(IntOrString::String("81".into())), Ok(81));
        assert_eq!(port(IntOrString::Int(81)), Ok(81));
        assert_eq!(
            port(IntOrString::String("grpc".into())),
            Err(TargetError::NoSuchPort("grpc".into()))
        );
        for bad in [
            IntOrString::Int(70000),
            IntOrString::Int(0),
            IntOrString::Int(-1),
        ] {
            let e = port(bad).unwrap_err();
            assert!(
                e.is_port() && e.to_string().starts_with("invalid port number: "),
                "{e}"
            );
        }
        // a probe's port names were resolved by the manager: none left to look up
        assert_eq!(
            resolve_port(&IntOrString::String("http".into()), &[]),
            Err(TargetError::NoSuchPort("http".into()))
        );
    }

    #[test]
    fn the_host_is_checked_before_the_port() {
        let ips = PodIps::new(["10.0.0.5"]);
        assert_eq!(
            ips.address(None, &IntOrString::Int(80), &[]),
            Ok(("10.0.0.5".to_string(), 80))
        );
        let e = ips
            .address(Some("10.9.9.9"), &IntOrString::Int(0), &[])
            .unwrap_err();
        assert!(!e.is_port(), "{e}");
    }

    #[test]
    fn a_probe_or_hook_naming_another_host_is_refused_and_says_why() {
        let ips = PodIps::new(["10.0.0.5"]);
        for host in [
            "169.254.169.254",
            "127.0.0.1",
            "localhost",
            "metadata.google.internal",
            "10.0.0.50",
        ] {
            let e = ips.host(Some(host)).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!(
                    "host {host:?} is not the pod's (its IPs: 10.0.0.5): kruised sends probes and \
                     hooks to the pod itself only"
                )
            );
        }
    }
}
