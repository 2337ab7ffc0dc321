//! The Kubernetes side: well-known keys, and (with the daemon) the API client, typed resources,
//! the node's pod cache and the status writers.

pub mod client;
pub mod crd;
pub mod events;
pub mod keys;
pub mod node;
pub mod pods;
pub mod time;
pub mod watch;
pub mod write;

/// A pod's `status.podIPs` (and `status.podIP`, which older objects may carry alone), as the
/// kubelet reported them: for a host-network pod, the node's IP.
pub fn pod_ips(pod: &k8s_openapi::api::core::v1::Pod) -> Vec<String> {
    let status = pod.status.as_ref();
    let mut ips: Vec<String> = status
        .and_then(|s| s.pod_ips.as_ref())
        .into_iter()
        .flatten()
        .map(|p| p.ip.clone())
        .collect();
    if let Some(ip) = status.and_then(|s| s.pod_ip.clone())
        && !ips.contains(&ip)
    {
        ips.insert(0, ip);
    }
    ips
}
