//! Which peers are the node itself: the kubelet probes the admin port from the node, so a
//! connection from one of these addresses always gets a slot ([`super::limits::NODE_RESERVE`]).
//!
//! The node is: loopback; the node's IPs the DaemonSet passes (`--node-ips`, from the downward
//! API's `status.hostIP`: where kruised runs on the host network, and where the CNI sends the
//! host's traffic to pods from its own address, as Calico does); and the pod's default gateways
//! (`/proc/net/route`, `/proc/net/ipv6_route`: where a bridge CNI sends the host's traffic from
//! the bridge's address). None of these is an address a tenant's pod can take: pods get
//! addresses from the pod CIDRs, and a pod on the host network is not a tenant's.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The node's own addresses, as seen from kruised's network namespace.
#[derive(Debug, Clone, Default)]
pub(crate) struct NodePeers {
    addresses: HashSet<IpAddr>,
}

const LOOPBACK: [IpAddr; 2] = [
    IpAddr::V4(Ipv4Addr::LOCALHOST),
    IpAddr::V6(Ipv6Addr::LOCALHOST),
];

impl NodePeers {
    /// The node's IPs given, and the default gateways of this network namespace.
    pub(crate) fn discover(node_ips: &[IpAddr]) -> Self {
        let mut addresses: HashSet<IpAddr> = node_ips.iter().map(|a| a.to_canonical()).collect();
        addresses.extend(LOOPBACK);
        if let Ok(table) = std::fs::read_to_string("/proc/net/route") {
            addresses.extend(ipv4_default_gateways(&table).map(IpAddr::V4));
        }
        if let Ok(table) = std::fs::read_to_string("/proc/net/ipv6_route") {
            addresses.extend(ipv6_default_gateways(&table).map(IpAddr::V6));
        }
        NodePeers { addresses }
    }

    /// Exactly `addresses` (not even loopback: tests choose which of their addresses is the
    /// node).
    #[cfg(test)]
    pub(crate) fn of(addresses: &[IpAddr]) -> Self {
        NodePeers {
            addresses: addresses.iter().copied().collect(),
        }
    }

    /// Whether `peer` is the node.
    pub(crate) fn contains(&self, peer: IpAddr) -> bool {
        self.addresses.contains(&peer.to_canonical())
    }

    /// The addresses, for the log line at start.
    pub(crate) fn addresses(&self) -> Vec<IpAddr> {
        let mut all: Vec<IpAddr> = self.addresses.iter().copied().collect();
        all.sort();
        all
    }
}

/// The gateways of the default routes in `/proc/net/route` (`Iface Destination Gateway Flags
/// ...`, addresses as little-endian hex).
fn ipv4_default_gateways(table: &str) -> impl Iterator<Item = Ipv4Addr> + '_ {
    table.lines().skip(1).filter_map(|line| {
        let mut fields = line.split_whitespace().skip(1);
        let (destination, gateway) = (fields.next()?, fields.next()?);
        if destination != "00000000" {
            return None;
        }
        let gateway = u32::from_str_radix(gateway, 16).ok()?;
        let gateway = Ipv4Addr::from(gateway.swap_bytes());
        (!gateway.is_unspecified()).then_some(gateway)
    })
}

/// The next hops of the default routes in `/proc/net/ipv6_route` (`destination prefix source
/// prefix next-hop ...`, addresses as 32 hex digits).
fn ipv6_default_gateways(table: &str) -> impl Iterator<Item = Ipv6Addr> + '_ {
    table.lines().filter_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (destination, prefix, next_hop) = (fields.first()?, fields.get(1)?, fields.get(4)?);
        if u128::from_str_radix(destination, 16).ok()? != 0 || *prefix != "00" {
            return None;
        }
        let next_hop = Ipv6Addr::from(u128::from_str_radix(next_hop, 16).ok()?);
        (!next_hop.is_unspecified()).then_some(next_hop)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_gateway_of_a_bridge_cni_is_read_from_the_route_table() {
        let table = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
                     eth0\t00000000\t0100F40A\t0003\t0\t0\t0\t00000000\t0\t0\t0\n\
                     eth0\t0000F40A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n";
        let gateways: Vec<Ipv4Addr> = ipv4_default_gateways(table).collect();
        assert_eq!(gateways, vec![Ipv4Addr::new(10, 244, 0, 1)]);
    }

    #[test]
    fn the_ipv6_default_route_next_hop_is_read_and_a_link_route_without_one_is_not() {
        let table = "00000000000000000000000000000000 00 00000000000000000000000000000000 00 fe800000000000000000000000000001 00000400 00000001 00000000 00000003     eth0\n\
                     fd000000000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001     eth0\n";
        let hops: Vec<Ipv6Addr> = ipv6_default_gateways(table).collect();
        assert_eq!(
            hops,
            vec!["fe80::1".parse::<Ipv6Addr>().expect("an address")]
        );
    }

    #[test]
    fn loopback_and_the_given_node_ips_are_the_node_and_a_pod_ip_is_not() {
        let peers = NodePeers::discover(&["192.168.1.10".parse().expect("ip")]);
        assert!(peers.contains("127.0.0.1".parse().expect("ip")));
        assert!(peers.contains("::1".parse().expect("ip")));
        assert!(!peers.contains("127.0.0.2".parse().expect("ip")));
        assert!(peers.contains("::ffff:192.168.1.10".parse().expect("ip")));
        assert!(!peers.contains("10.244.1.7".parse().expect("ip")));
    }
}
