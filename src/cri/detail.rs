//! Domain types for what the runtime reports beyond what the daemon decides on: image specs in
//! full, mounts, resources, users and namespace modes of container and sandbox status, runtime
//! handlers and features, container statistics. `kruised crictl` shows them; the daemon ignores
//! them. Still free of generated protobuf types (conversions are in `convert_detail.rs`).

use super::parts::{ContainerMetadata, FilesystemUsage, StringMap};

/// An image reference with the context the CRI attaches to it (the CRI `ImageSpec`).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageSpec {
    /// The image: a reference or an image ID.
    pub image: String,
    /// Annotations of the image spec.
    pub annotations: StringMap,
    /// The image as the user wrote it in the pod spec (newer kubelets).
    pub user_specified_image: String,
    /// Runtime handler to use for the image (newer kubelets).
    pub runtime_handler: String,
    /// The resolved image reference (newer runtimes).
    pub image_ref: String,
}

/// A range of user or group IDs mapped between the host and a container.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IdMapping {
    /// First ID on the host.
    pub host_id: u32,
    /// First ID in the container.
    pub container_id: u32,
    /// Number of IDs.
    pub length: u32,
}

/// Mount propagation of a bind mount.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MountPropagation {
    /// No propagation (`PROPAGATION_PRIVATE`).
    #[default]
    Private,
    /// Host mounts propagate into the container (`PROPAGATION_HOST_TO_CONTAINER`).
    HostToContainer,
    /// Both ways (`PROPAGATION_BIDIRECTIONAL`).
    Bidirectional,
    /// A value from a newer CRI.
    Other(i32),
}

/// A mount of a container.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Mount {
    /// Path in the container.
    pub container_path: String,
    /// Path on the host.
    pub host_path: String,
    /// Read-only.
    pub readonly: bool,
    /// SELinux relabelling requested.
    pub selinux_relabel: bool,
    /// Propagation mode.
    pub propagation: MountPropagation,
    /// User ID mappings of an idmapped mount.
    pub uid_mappings: Vec<IdMapping>,
    /// Group ID mappings of an idmapped mount.
    pub gid_mappings: Vec<IdMapping>,
    /// Recursively read-only.
    pub recursive_read_only: bool,
    /// The image mounted, for image volumes.
    pub image: Option<ImageSpec>,
    /// Sub path of the image mounted.
    pub image_sub_path: String,
    /// Mount options.
    pub mount_options: Vec<String>,
}

/// A hugepage limit of a Linux container.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HugepageLimit {
    /// Page size, e.g. `2MB`.
    pub page_size: String,
    /// Limit in bytes.
    pub limit: u64,
}

/// Linux resource limits applied to a container.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LinuxResources {
    /// CFS period.
    pub cpu_period: i64,
    /// CFS quota.
    pub cpu_quota: i64,
    /// CPU shares.
    pub cpu_shares: i64,
    /// Memory limit in bytes.
    pub memory_limit_in_bytes: i64,
    /// OOM score adjustment.
    pub oom_score_adj: i64,
    /// CPUs allowed (cpuset).
    pub cpuset_cpus: String,
    /// Memory nodes allowed (cpuset).
    pub cpuset_mems: String,
    /// Hugepage limits.
    pub hugepage_limits: Vec<HugepageLimit>,
    /// cgroup v2 settings.
    pub unified: StringMap,
    /// Memory plus swap limit in bytes.
    pub memory_swap_limit_in_bytes: i64,
}

/// CPU affinity within one Windows processor group.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WindowsCpuGroupAffinity {
    /// CPU mask.
    pub cpu_mask: u64,
    /// Processor group.
    pub cpu_group: u32,
}

/// Windows resource limits applied to a container.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WindowsResources {
    /// CPU shares.
    pub cpu_shares: i64,
    /// Number of CPUs.
    pub cpu_count: i64,
    /// CPU cycles as a fraction of 10000.
    pub cpu_maximum: i64,
    /// Memory limit in bytes.
    pub memory_limit_in_bytes: i64,
    /// Root filesystem size in bytes.
    pub rootfs_size_in_bytes: i64,
    /// CPU affinity.
    pub affinity_cpus: Vec<WindowsCpuGroupAffinity>,
}

/// Resource limits applied to a container.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerResources {
    /// Linux limits, if reported.
    pub linux: Option<LinuxResources>,
    /// Windows limits, if reported.
    pub windows: Option<WindowsResources>,
}

/// The user a Linux container's first process runs as.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LinuxUser {
    /// User ID.
    pub uid: i64,
    /// Group ID.
    pub gid: i64,
    /// Supplemental group IDs.
    pub supplemental_groups: Vec<i64>,
}

/// The user a container's first process runs as.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerUser {
    /// On Linux.
    pub linux: Option<LinuxUser>,
}

/// What `ContainerStatus` reports beyond what the daemon uses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerStatusDetail {
    /// The image spec in full (its `image` equals the status's `image`).
    pub image_spec: ImageSpec,
    /// Mounts.
    pub mounts: Vec<Mount>,
    /// Resource limits, if reported.
    pub resources: Option<ContainerResources>,
    /// The user of the first process, if reported.
    pub user: Option<ContainerUser>,
    /// The stop signal by its CRI name (`RUNTIME_DEFAULT`, `SIGTERM`, ...).
    pub stop_signal: String,
}

/// Scope of a Linux namespace.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NamespaceMode {
    /// The pod's (`POD`).
    #[default]
    Pod,
    /// The container's own (`CONTAINER`).
    Container,
    /// The node's (`NODE`).
    Node,
    /// Another container's (`TARGET`).
    Target,
    /// A value from a newer CRI.
    Other(i32),
}

/// A user namespace and its mappings.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UserNamespace {
    /// Mode.
    pub mode: NamespaceMode,
    /// User ID mappings.
    pub uids: Vec<IdMapping>,
    /// Group ID mappings.
    pub gids: Vec<IdMapping>,
}

/// Namespace settings of a sandbox.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NamespaceOption {
    /// Network namespace.
    pub network: NamespaceMode,
    /// PID namespace.
    pub pid: NamespaceMode,
    /// IPC namespace.
    pub ipc: NamespaceMode,
    /// Target container of `TARGET` mode.
    pub target_id: String,
    /// User namespace, if set.
    pub userns_options: Option<UserNamespace>,
}

/// What `PodSandboxStatus` reports beyond what the daemon uses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SandboxStatusDetail {
    /// Whether the runtime reported network status at all.
    pub network_reported: bool,
    /// Namespace settings (`linux.namespaces.options`), when reported.
    pub namespace_options: Option<NamespaceOption>,
}

/// Features of one runtime handler.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RuntimeHandlerFeatures {
    /// Supports recursive read-only mounts.
    pub recursive_read_only_mounts: bool,
    /// Supports user namespaces.
    pub user_namespaces: bool,
}

/// A runtime handler (RuntimeClass) the runtime offers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RuntimeHandler {
    /// Name; empty for the default handler.
    pub name: String,
    /// Its features, if reported.
    pub features: Option<RuntimeHandlerFeatures>,
}

/// Features of the runtime as a whole.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RuntimeFeatures {
    /// Supports the supplemental groups policy.
    pub supplemental_groups_policy: bool,
    /// Supports user namespaces with host network.
    pub user_namespaces_host_network: bool,
    /// Supports mount options.
    pub mount_options: bool,
}

/// Usage of the filesystems that hold images and container layers (`ImageFsInfo`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImageFsInfo {
    /// Filesystems holding images.
    pub image_filesystems: Vec<FilesystemUsage>,
    /// Filesystems holding container writable layers, when separate.
    pub container_filesystems: Vec<FilesystemUsage>,
}

/// Filter of `ListContainerStats`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerStatsFilter {
    /// Only this container (prefix on most runtimes).
    pub id: Option<String>,
    /// Only containers of this sandbox.
    pub pod_sandbox_id: Option<String>,
    /// Only containers carrying all these labels.
    pub labels: StringMap,
}

/// Identity of a container in its statistics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerAttributes {
    /// Container ID.
    pub id: String,
    /// Name and attempt.
    pub metadata: ContainerMetadata,
    /// Labels.
    pub labels: StringMap,
    /// Annotations.
    pub annotations: StringMap,
}

/// Pressure stall totals and averages.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PsiData {
    /// Total stall time.
    pub total: u64,
    /// Average over 10 s.
    pub avg10: f64,
    /// Average over 60 s.
    pub avg60: f64,
    /// Average over 300 s.
    pub avg300: f64,
}

/// Pressure stall information of one resource.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PsiStats {
    /// All tasks stalled.
    pub full: Option<PsiData>,
    /// Some tasks stalled.
    pub some: Option<PsiData>,
}

/// CPU usage.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CpuUsage {
    /// When sampled (ns since the epoch).
    pub timestamp: i64,
    /// Cumulative CPU time, ns.
    pub usage_core_nano_seconds: Option<u64>,
    /// Recent CPU use, nano-cores.
    pub usage_nano_cores: Option<u64>,
    /// Pressure.
    pub psi: Option<PsiStats>,
}

/// Memory usage.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct MemoryUsage {
    /// When sampled (ns since the epoch).
    pub timestamp: i64,
    /// Working set, bytes.
    pub working_set_bytes: Option<u64>,
    /// Available, bytes.
    pub available_bytes: Option<u64>,
    /// Usage, bytes.
    pub usage_bytes: Option<u64>,
    /// RSS, bytes.
    pub rss_bytes: Option<u64>,
    /// Page faults.
    pub page_faults: Option<u64>,
    /// Major page faults.
    pub major_page_faults: Option<u64>,
    /// Pressure.
    pub psi: Option<PsiStats>,
}

/// Swap usage.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SwapUsage {
    /// When sampled (ns since the epoch).
    pub timestamp: i64,
    /// Swap available, bytes.
    pub swap_available_bytes: Option<u64>,
    /// Swap used, bytes.
    pub swap_usage_bytes: Option<u64>,
}

/// IO usage.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct IoUsage {
    /// When sampled (ns since the epoch).
    pub timestamp: i64,
    /// Pressure.
    pub psi: Option<PsiStats>,
}

/// Resource usage of one container (`ListContainerStats`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ContainerStats {
    /// Which container.
    pub attributes: Option<ContainerAttributes>,
    /// CPU.
    pub cpu: Option<CpuUsage>,
    /// Memory.
    pub memory: Option<MemoryUsage>,
    /// Writable layer.
    pub writable_layer: Option<FilesystemUsage>,
    /// Swap.
    pub swap: Option<SwapUsage>,
    /// IO.
    pub io: Option<IoUsage>,
}
