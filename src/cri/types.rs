//! Domain types of the container runtime, free of any generated protobuf type.
//!
//! The CRI's own messages are converted into these at the boundary (`convert.rs`), so the rest of
//! the daemon never sees tonic or prost.

use std::fmt;

use super::detail::{
    ContainerStatusDetail, ImageSpec, RuntimeFeatures, RuntimeHandler, SandboxStatusDetail,
};
use super::parts::{ContainerMetadata, StringMap};

/// What the runtime answers to `Version`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeVersion {
    /// Version of the kubelet runtime API the runtime speaks to (e.g. `0.1.0`).
    pub version: String,
    /// Name of the runtime (`containerd`, `cri-o`, `docker`): the prefix of kubelet container IDs.
    pub runtime_name: String,
    /// Version of the runtime itself.
    pub runtime_version: String,
    /// CRI API version the runtime serves (`v1`).
    pub runtime_api_version: String,
}

/// Lifecycle state of a pod sandbox.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SandboxState {
    /// The sandbox is running.
    Ready,
    /// The sandbox is stopped or failed to start.
    NotReady,
}

impl SandboxState {
    /// The name crictl prints (`SANDBOX_READY`, `SANDBOX_NOTREADY`).
    pub fn cri_name(self) -> &'static str {
        match self {
            SandboxState::Ready => "SANDBOX_READY",
            SandboxState::NotReady => "SANDBOX_NOTREADY",
        }
    }
}

/// Lifecycle state of a container, as the CRI reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ContainerState {
    /// Created but not started.
    Created,
    /// Running.
    Running,
    /// Exited.
    Exited,
    /// The runtime does not know.
    Unknown,
}

impl ContainerState {
    /// The name crictl prints (`CONTAINER_RUNNING`, ...).
    pub fn cri_name(self) -> &'static str {
        match self {
            ContainerState::Created => "CONTAINER_CREATED",
            ContainerState::Running => "CONTAINER_RUNNING",
            ContainerState::Exited => "CONTAINER_EXITED",
            ContainerState::Unknown => "CONTAINER_UNKNOWN",
        }
    }
}

/// Name, uid, namespace and attempt of a sandbox (the kubelet's pod identity).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SandboxMetadata {
    /// Pod name.
    pub name: String,
    /// Pod uid.
    pub uid: String,
    /// Pod namespace.
    pub namespace: String,
    /// How many times the kubelet created a sandbox for this pod before.
    pub attempt: u32,
}

/// A sandbox as `ListPodSandbox` returns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodSandbox {
    /// Runtime ID of the sandbox.
    pub id: String,
    /// Pod identity.
    pub metadata: SandboxMetadata,
    /// Current state.
    pub state: SandboxState,
    /// Creation time, nanoseconds since the epoch.
    pub created_at: i64,
    /// Sandbox labels (the pod's labels plus the kubelet's).
    pub labels: StringMap,
    /// Sandbox annotations.
    pub annotations: StringMap,
    /// Runtime handler (RuntimeClass) that runs it; empty for the default.
    pub runtime_handler: String,
}

/// What `PodSandboxStatus` returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodSandboxStatus {
    /// The sandbox itself.
    pub sandbox: PodSandbox,
    /// Primary pod IP, empty for host-network pods on some runtimes.
    pub ip: String,
    /// Further pod IPs (dual stack).
    pub additional_ips: Vec<String>,
    /// Whether the sandbox shares the node's network namespace.
    pub host_network: bool,
    /// Runtime-specific details (verbose mode), e.g. containerd's `info` JSON.
    pub info: StringMap,
    /// What else the runtime reports (namespaces, whether network status was sent).
    pub detail: SandboxStatusDetail,
}

/// A container as `ListContainers` returns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Container {
    /// Runtime ID of the container.
    pub id: String,
    /// ID of the sandbox it belongs to.
    pub pod_sandbox_id: String,
    /// Container identity.
    pub metadata: ContainerMetadata,
    /// The image as the container was created with (usually the image ID on containerd).
    pub image: String,
    /// The image reference the runtime resolved (image ID on containerd's list).
    pub image_ref: String,
    /// Current state.
    pub state: ContainerState,
    /// Creation time, nanoseconds since the epoch.
    pub created_at: i64,
    /// Container labels (the kubelet's pod/container identity labels).
    pub labels: StringMap,
    /// Container annotations (the kubelet's hash, restart count, preStop handler, ...).
    pub annotations: StringMap,
    /// The image ID where the runtime reports it separately (newer runtimes), else empty.
    pub image_id: String,
    /// The image spec in full (its `image` equals `image`).
    pub image_spec: ImageSpec,
}

/// What `ContainerStatus` returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerStatus {
    /// Runtime ID of the container.
    pub id: String,
    /// Container identity.
    pub metadata: ContainerMetadata,
    /// Current state.
    pub state: ContainerState,
    /// Creation time (ns since the epoch).
    pub created_at: i64,
    /// Start time (ns), 0 if never started.
    pub started_at: i64,
    /// Finish time (ns), 0 if not finished.
    pub finished_at: i64,
    /// Exit code, valid once exited.
    pub exit_code: i32,
    /// The image spec the container was created with.
    pub image: String,
    /// The image reference: on containerd the repo digest (`repo@sha256:...`).
    pub image_ref: String,
    /// The image ID where the runtime reports it separately (newer runtimes), else empty.
    pub image_id: String,
    /// Brief reason for the state (e.g. `Completed`, `Error`).
    pub reason: String,
    /// Human-readable detail for the state.
    pub message: String,
    /// Container labels.
    pub labels: StringMap,
    /// Container annotations.
    pub annotations: StringMap,
    /// Path of the container's log file.
    pub log_path: String,
    /// Runtime-specific details (verbose mode): containerd and CRI-O put a JSON `info` with the OCI
    /// spec here.
    pub info: StringMap,
    /// What else the runtime reports (mounts, resources, user, stop signal, full image spec).
    pub detail: ContainerStatusDetail,
}

/// Output of a synchronous exec.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExecResult {
    /// Captured standard output.
    pub stdout: Vec<u8>,
    /// Captured standard error.
    pub stderr: Vec<u8>,
    /// Exit code of the command.
    pub exit_code: i32,
}

/// Kind of a container lifecycle event (`GetContainerEvents`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ContainerEventKind {
    /// A container was created.
    Created,
    /// A container started.
    Started,
    /// A container stopped.
    Stopped,
    /// A container was deleted.
    Deleted,
}

/// A container lifecycle event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerEvent {
    /// The container the event is about.
    pub container_id: String,
    /// What happened.
    pub kind: ContainerEventKind,
    /// When (ns since the epoch).
    pub created_at: i64,
    /// The sandbox of the container, when the runtime says.
    pub pod_sandbox_id: Option<String>,
    /// The sandbox's status as the event carries it, when it does.
    pub sandbox_status: Option<Box<PodSandboxStatus>>,
    /// The statuses of the sandbox's containers as the event carries them.
    pub container_statuses: Vec<ContainerStatus>,
}

/// An image held by the runtime.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Image {
    /// Image ID (`sha256:<config digest>`).
    pub id: String,
    /// Tags the image is known under (`registry/repo:tag`).
    pub repo_tags: Vec<String>,
    /// Digests the image is known under (`registry/repo@sha256:...`).
    pub repo_digests: Vec<String>,
    /// Size in bytes.
    pub size: u64,
    /// Whether the runtime pins the image against garbage collection.
    pub pinned: bool,
    /// The user the image runs as, by ID, if the image says.
    pub uid: Option<i64>,
    /// The user the image runs as, by name, if the image says.
    pub username: String,
    /// The image spec the runtime reports for it, if any.
    pub spec: Option<ImageSpec>,
}

/// Credentials for one pull. `Debug` never prints secrets.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct PullAuth {
    /// User name.
    pub username: String,
    /// Password.
    pub password: String,
    /// Base64 `user:password`, as docker config files hold it.
    pub auth: String,
    /// Registry server the credentials are for.
    pub server_address: String,
    /// Identity token.
    pub identity_token: String,
    /// Registry bearer token.
    pub registry_token: String,
}

impl fmt::Debug for PullAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn redacted(s: &str) -> &'static str {
            if s.is_empty() { "" } else { "<redacted>" }
        }
        f.debug_struct("PullAuth")
            .field("username", &self.username)
            .field("password", &redacted(&self.password))
            .field("auth", &redacted(&self.auth))
            .field("server_address", &self.server_address)
            .field("identity_token", &redacted(&self.identity_token))
            .field("registry_token", &redacted(&self.registry_token))
            .finish()
    }
}

/// The sandbox context of an image pull (runtimes may pick a platform or snapshotter from it).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PullSandbox {
    /// Sandbox labels.
    pub labels: StringMap,
    /// Sandbox annotations.
    pub annotations: StringMap,
}

/// A request to pull one image.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PullRequest {
    /// The image reference, `name:tag` or `name@digest`.
    pub image: String,
    /// Credentials, if any.
    pub auth: Option<PullAuth>,
    /// Sandbox context, if any.
    pub sandbox: Option<PullSandbox>,
}

/// Filter for `ListContainers`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerFilter {
    /// Only this container ID.
    pub id: Option<String>,
    /// Only containers in this state.
    pub state: Option<ContainerState>,
    /// Only containers of this sandbox.
    pub pod_sandbox_id: Option<String>,
    /// Only containers carrying all these labels.
    pub labels: StringMap,
}

/// Filter for `ListPodSandbox`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SandboxFilter {
    /// Only this sandbox ID.
    pub id: Option<String>,
    /// Only sandboxes in this state.
    pub state: Option<SandboxState>,
    /// Only sandboxes carrying all these labels.
    pub labels: StringMap,
}

#[cfg(feature = "test-util")]
/// What is needed to create a sandbox the way the kubelet does (host network only: the daemon
/// and its tests never set up pod networking).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SandboxConfig {
    /// Pod identity.
    pub metadata: SandboxMetadata,
    /// Hostname inside the sandbox.
    pub hostname: String,
    /// Directory for container logs.
    pub log_directory: String,
    /// Sandbox labels.
    pub labels: StringMap,
    /// Sandbox annotations.
    pub annotations: StringMap,
    /// Cgroup parent (cgroupfs path).
    pub cgroup_parent: String,
}

#[cfg(feature = "test-util")]
/// What is needed to create a container the way the kubelet does.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerConfig {
    /// Container identity.
    pub metadata: ContainerMetadata,
    /// Image to run: the kubelet passes the image ID it resolved.
    pub image: String,
    /// The image as the pod spec names it (CRI-O refuses a container without it when a
    /// signature policy is set).
    pub user_specified_image: String,
    /// Entrypoint override.
    pub command: Vec<String>,
    /// Arguments.
    pub args: Vec<String>,
    /// Environment, in order.
    pub envs: Vec<(String, String)>,
    /// Container labels.
    pub labels: StringMap,
    /// Container annotations.
    pub annotations: StringMap,
    /// Log path relative to the sandbox's log directory.
    pub log_path: String,
}

/// A runtime condition (`RuntimeReady`, `NetworkReady`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct RuntimeCondition {
    /// Condition type.
    #[serde(rename = "type")]
    pub kind: String,
    /// Whether it holds.
    pub status: bool,
    /// Machine-readable reason when it does not.
    pub reason: String,
    /// Human-readable message.
    pub message: String,
}

/// What `Status` returns.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct RuntimeStatus {
    /// Runtime conditions.
    pub conditions: Vec<RuntimeCondition>,
    /// Runtime-specific details (verbose).
    pub info: StringMap,
    /// The runtime handlers offered, when the runtime reports them.
    #[serde(skip)]
    pub handlers: Vec<RuntimeHandler>,
    /// The runtime's features, when it reports them.
    #[serde(skip)]
    pub features: Option<RuntimeFeatures>,
}

impl RuntimeStatus {
    /// Whether the runtime says it is ready to run containers (network readiness is not
    /// required: host-network pods need none, and the kubelet owns networking).
    pub fn runtime_ready(&self) -> bool {
        self.conditions
            .iter()
            .any(|c| c.kind == "RuntimeReady" && c.status)
    }
}
