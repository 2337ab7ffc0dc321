//! Conversions of the detail types (`detail.rs`) between the generated CRI messages and the
//! domain, in both directions where the fake runtime serves them.

use super::detail::*;
use super::parts::{ContainerMetadata, FilesystemUsage};
use super::proto;

// === image spec ===

impl From<proto::ImageSpec> for ImageSpec {
    fn from(s: proto::ImageSpec) -> Self {
        ImageSpec {
            image: s.image,
            annotations: s.annotations,
            user_specified_image: s.user_specified_image,
            runtime_handler: s.runtime_handler,
            image_ref: s.image_ref,
        }
    }
}

impl From<ImageSpec> for proto::ImageSpec {
    fn from(s: ImageSpec) -> Self {
        proto::ImageSpec {
            image: s.image,
            annotations: s.annotations,
            user_specified_image: s.user_specified_image,
            runtime_handler: s.runtime_handler,
            image_ref: s.image_ref,
        }
    }
}

/// The full spec of `image`, with `name` as its image (the domain keeps the name beside the
/// spec; the name is what callers set).
pub(crate) fn image_spec_named(name: &str, spec: &ImageSpec) -> proto::ImageSpec {
    proto::ImageSpec {
        image: name.to_string(),
        ..spec.clone().into()
    }
}

// === mounts ===

fn id_mapping(m: proto::IdMapping) -> IdMapping {
    IdMapping {
        host_id: m.host_id,
        container_id: m.container_id,
        length: m.length,
    }
}

fn propagation(v: i32) -> MountPropagation {
    match proto::MountPropagation::try_from(v) {
        Ok(proto::MountPropagation::PropagationPrivate) => MountPropagation::Private,
        Ok(proto::MountPropagation::PropagationHostToContainer) => {
            MountPropagation::HostToContainer
        }
        Ok(proto::MountPropagation::PropagationBidirectional) => MountPropagation::Bidirectional,
        Err(_) => MountPropagation::Other(v),
    }
}

impl From<proto::Mount> for Mount {
    fn from(m: proto::Mount) -> Self {
        Mount {
            container_path: m.container_path,
            host_path: m.host_path,
            readonly: m.readonly,
            selinux_relabel: m.selinux_relabel,
            propagation: propagation(m.propagation),
            uid_mappings: m.uid_mappings.into_iter().map(id_mapping).collect(),
            gid_mappings: m.gid_mappings.into_iter().map(id_mapping).collect(),
            recursive_read_only: m.recursive_read_only,
            image: m.image.map(Into::into),
            image_sub_path: m.image_sub_path,
            mount_options: m.mount_options,
        }
    }
}

// === resources, user, signal ===

impl From<proto::LinuxContainerResources> for LinuxResources {
    fn from(r: proto::LinuxContainerResources) -> Self {
        LinuxResources {
            cpu_period: r.cpu_period,
            cpu_quota: r.cpu_quota,
            cpu_shares: r.cpu_shares,
            memory_limit_in_bytes: r.memory_limit_in_bytes,
            oom_score_adj: r.oom_score_adj,
            cpuset_cpus: r.cpuset_cpus,
            cpuset_mems: r.cpuset_mems,
            hugepage_limits: r
                .hugepage_limits
                .into_iter()
                .map(|h| HugepageLimit {
                    page_size: h.page_size,
                    limit: h.limit,
                })
                .collect(),
            unified: r.unified,
            memory_swap_limit_in_bytes: r.memory_swap_limit_in_bytes,
        }
    }
}

impl From<proto::WindowsContainerResources> for WindowsResources {
    fn from(r: proto::WindowsContainerResources) -> Self {
        WindowsResources {
            cpu_shares: r.cpu_shares,
            cpu_count: r.cpu_count,
            cpu_maximum: r.cpu_maximum,
            memory_limit_in_bytes: r.memory_limit_in_bytes,
            rootfs_size_in_bytes: r.rootfs_size_in_bytes,
            affinity_cpus: r
                .affinity_cpus
                .into_iter()
                .map(|a| WindowsCpuGroupAffinity {
                    cpu_mask: a.cpu_mask,
                    cpu_group: a.cpu_group,
                })
                .collect(),
        }
    }
}

/// The upstream CRI name of a stop signal (`RUNTIME_DEFAULT`, `SIGKILL`, ...): this
/// definition prefixes the enum's values with `SIGNAL_`, which the wire does not carry.
fn signal_name(v: i32) -> String {
    match proto::Signal::try_from(v) {
        Ok(s) => {
            let name = s.as_str_name();
            name.strip_prefix("SIGNAL_").unwrap_or(name).to_string()
        }
        Err(_) => v.to_string(),
    }
}

/// The container-status fields that only inspection shows.
pub(crate) fn container_status_detail(s: &mut proto::ContainerStatus) -> ContainerStatusDetail {
    ContainerStatusDetail {
        image_spec: s.image.clone().map(Into::into).unwrap_or_default(),
        mounts: std::mem::take(&mut s.mounts)
            .into_iter()
            .map(Into::into)
            .collect(),
        resources: s.resources.take().map(|r| ContainerResources {
            linux: r.linux.map(Into::into),
            windows: r.windows.map(Into::into),
        }),
        user: s.user.take().map(|u| ContainerUser {
            linux: u.linux.map(|l| LinuxUser {
                uid: l.uid,
                gid: l.gid,
                supplemental_groups: l.supplemental_groups,
            }),
        }),
        stop_signal: signal_name(s.stop_signal),
    }
}

// === namespaces ===

pub(crate) fn namespace_mode(v: i32) -> NamespaceMode {
    match proto::NamespaceMode::try_from(v) {
        Ok(proto::NamespaceMode::Pod) => NamespaceMode::Pod,
        Ok(proto::NamespaceMode::Container) => NamespaceMode::Container,
        Ok(proto::NamespaceMode::Node) => NamespaceMode::Node,
        Ok(proto::NamespaceMode::Target) => NamespaceMode::Target,
        Err(_) => NamespaceMode::Other(v),
    }
}

#[cfg(feature = "test-util")]
fn namespace_mode_value(m: NamespaceMode) -> i32 {
    match m {
        NamespaceMode::Pod => proto::NamespaceMode::Pod as i32,
        NamespaceMode::Container => proto::NamespaceMode::Container as i32,
        NamespaceMode::Node => proto::NamespaceMode::Node as i32,
        NamespaceMode::Target => proto::NamespaceMode::Target as i32,
        NamespaceMode::Other(v) => v,
    }
}

impl From<proto::NamespaceOption> for NamespaceOption {
    fn from(o: proto::NamespaceOption) -> Self {
        NamespaceOption {
            network: namespace_mode(o.network),
            pid: namespace_mode(o.pid),
            ipc: namespace_mode(o.ipc),
            target_id: o.target_id,
            userns_options: o.userns_options.map(|u| UserNamespace {
                mode: namespace_mode(u.mode),
                uids: u.uids.into_iter().map(id_mapping).collect(),
                gids: u.gids.into_iter().map(id_mapping).collect(),
            }),
        }
    }
}

#[cfg(feature = "test-util")]
pub(crate) fn namespace_option_message(o: &NamespaceOption) -> proto::NamespaceOption {
    let mapping = |m: &IdMapping| proto::IdMapping {
        host_id: m.host_id,
        container_id: m.container_id,
        length: m.length,
    };
    proto::NamespaceOption {
        network: namespace_mode_value(o.network),
        pid: namespace_mode_value(o.pid),
        ipc: namespace_mode_value(o.ipc),
        target_id: o.target_id.clone(),
        userns_options: o.userns_options.as_ref().map(|u| proto::UserNamespace {
            mode: namespace_mode_value(u.mode),
            uids: u.uids.iter().map(mapping).collect(),
            gids: u.gids.iter().map(mapping).collect(),
        }),
    }
}

// === runtime status ===

pub(crate) fn runtime_handlers(h: Vec<proto::RuntimeHandler>) -> Vec<RuntimeHandler> {
    h.into_iter()
        .map(|h| RuntimeHandler {
            name: h.name,
            features: h.features.map(|f| RuntimeHandlerFeatures {
                recursive_read_only_mounts: f.recursive_read_only_mounts,
                user_namespaces: f.user_namespaces,
            }),
        })
        .collect()
}

pub(crate) fn runtime_features(f: Option<proto::RuntimeFeatures>) -> Option<RuntimeFeatures> {
    f.map(|f| RuntimeFeatures {
        supplemental_groups_policy: f.supplemental_groups_policy,
        user_namespaces_host_network: f.user_namespaces_host_network,
        mount_options: f.mount_options,
    })
}

// === stats ===

fn value(v: Option<proto::UInt64Value>) -> Option<u64> {
    v.map(|v| v.value)
}

fn psi(p: Option<proto::PsiStats>) -> Option<PsiStats> {
    let data = |d: proto::PsiData| PsiData {
        total: d.total,
        avg10: d.avg10,
        avg60: d.avg60,
        avg300: d.avg300,
    };
    p.map(|p| PsiStats {
        full: p.full.map(data),
        some: p.some.map(data),
    })
}

impl From<proto::ContainerStats> for ContainerStats {
    fn from(s: proto::ContainerStats) -> Self {
        ContainerStats {
            attributes: s.attributes.map(|a| ContainerAttributes {
                id: a.id,
                metadata: a.metadata.map(ContainerMetadata::from).unwrap_or_default(),
                labels: a.labels,
                annotations: a.annotations,
            }),
            cpu: s.cpu.map(|c| CpuUsage {
                timestamp: c.timestamp,
                usage_core_nano_seconds: value(c.usage_core_nano_seconds),
                usage_nano_cores: value(c.usage_nano_cores),
                psi: psi(c.psi),
            }),
            memory: s.memory.map(|m| MemoryUsage {
                timestamp: m.timestamp,
                working_set_bytes: value(m.working_set_bytes),
                available_bytes: value(m.available_bytes),
                usage_bytes: value(m.usage_bytes),
                rss_bytes: value(m.rss_bytes),
                page_faults: value(m.page_faults),
                major_page_faults: value(m.major_page_faults),
                psi: psi(m.psi),
            }),
            writable_layer: s.writable_layer.map(FilesystemUsage::from),
            swap: s.swap.map(|w| SwapUsage {
                timestamp: w.timestamp,
                swap_available_bytes: value(w.swap_available_bytes),
                swap_usage_bytes: value(w.swap_usage_bytes),
            }),
            io: s.io.map(|i| IoUsage {
                timestamp: i.timestamp,
                psi: psi(i.psi),
            }),
        }
    }
}

pub(crate) fn container_stats_filter(f: ContainerStatsFilter) -> proto::ContainerStatsFilter {
    proto::ContainerStatsFilter {
        id: f.id.unwrap_or_default(),
        pod_sandbox_id: f.pod_sandbox_id.unwrap_or_default(),
        label_selector: f.labels,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_signals_have_their_upstream_names() {
        assert_eq!(signal_name(0), "RUNTIME_DEFAULT");
        assert_eq!(signal_name(13), "SIGKILL");
        assert_eq!(signal_name(9999), "9999");
    }

    #[test]
    fn namespace_modes_round_trip() {
        for v in 0..5 {
            assert_eq!(namespace_mode_value(namespace_mode(v)), v);
        }
    }
}
