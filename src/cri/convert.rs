//! Conversions between the generated CRI messages and the domain types, in both directions
//! (the fake runtime of the tests serves domain state as CRI messages: those directions only
//! with the `test-util` feature).

use std::fmt;

#[cfg(feature = "test-util")]
use super::convert_detail::namespace_option_message;
use super::convert_detail::{container_status_detail, image_spec_named};
use super::detail::{NamespaceMode, SandboxStatusDetail};
use super::parts::*;
use super::proto;
use super::types::*;

// === impl SandboxState / ContainerState ===

impl From<SandboxState> for proto::PodSandboxState {
    fn from(s: SandboxState) -> Self {
        match s {
            SandboxState::Ready => proto::PodSandboxState::SandboxReady,
            SandboxState::NotReady => proto::PodSandboxState::SandboxNotready,
        }
    }
}

pub(crate) fn sandbox_state(v: i32) -> SandboxState {
    match proto::PodSandboxState::try_from(v) {
        Ok(proto::PodSandboxState::SandboxReady) => SandboxState::Ready,
        _ => SandboxState::NotReady,
    }
}

impl From<ContainerState> for proto::ContainerState {
    fn from(s: ContainerState) -> Self {
        match s {
            ContainerState::Created => proto::ContainerState::ContainerCreated,
            ContainerState::Running => proto::ContainerState::ContainerRunning,
            ContainerState::Exited => proto::ContainerState::ContainerExited,
            ContainerState::Unknown => proto::ContainerState::ContainerUnknown,
        }
    }
}

pub(crate) fn container_state(v: i32) -> ContainerState {
    match proto::ContainerState::try_from(v) {
        Ok(proto::ContainerState::ContainerCreated) => ContainerState::Created,
        Ok(proto::ContainerState::ContainerRunning) => ContainerState::Running,
        Ok(proto::ContainerState::ContainerExited) => ContainerState::Exited,
        _ => ContainerState::Unknown,
    }
}

// === metadata ===

impl From<proto::PodSandboxMetadata> for SandboxMetadata {
    fn from(m: proto::PodSandboxMetadata) -> Self {
        SandboxMetadata {
            name: m.name,
            uid: m.uid,
            namespace: m.namespace,
            attempt: m.attempt,
        }
    }
}

impl From<SandboxMetadata> for proto::PodSandboxMetadata {
    fn from(m: SandboxMetadata) -> Self {
        proto::PodSandboxMetadata {
            name: m.name,
            uid: m.uid,
            namespace: m.namespace,
            attempt: m.attempt,
        }
    }
}

impl From<proto::ContainerMetadata> for ContainerMetadata {
    fn from(m: proto::ContainerMetadata) -> Self {
        ContainerMetadata {
            name: m.name,
            attempt: m.attempt,
        }
    }
}

impl From<ContainerMetadata> for proto::ContainerMetadata {
    fn from(m: ContainerMetadata) -> Self {
        proto::ContainerMetadata {
            name: m.name,
            attempt: m.attempt,
        }
    }
}

fn image_name(spec: Option<proto::ImageSpec>) -> String {
    spec.map(|s| s.image).unwrap_or_default()
}

pub(crate) fn image_spec(image: &str) -> proto::ImageSpec {
    proto::ImageSpec {
        image: image.to_string(),
        ..Default::default()
    }
}

// === sandboxes ===

impl From<proto::PodSandbox> for PodSandbox {
    fn from(p: proto::PodSandbox) -> Self {
        PodSandbox {
            id: p.id,
            metadata: p.metadata.map(Into::into).unwrap_or_default(),
            state: sandbox_state(p.state),
            created_at: p.created_at,
            labels: p.labels,
            annotations: p.annotations,
            runtime_handler: p.runtime_handler,
        }
    }
}

impl From<PodSandbox> for proto::PodSandbox {
    fn from(p: PodSandbox) -> Self {
        proto::PodSandbox {
            id: p.id,
            metadata: Some(p.metadata.into()),
            state: proto::PodSandboxState::from(p.state).into(),
            created_at: p.created_at,
            labels: p.labels,
            annotations: p.annotations,
            runtime_handler: p.runtime_handler,
        }
    }
}

pub(crate) fn sandbox_status(resp: proto::PodSandboxStatusResponse) -> Option<PodSandboxStatus> {
    sandbox_status_of(resp.status?, resp.info)
}

pub(crate) fn sandbox_status_of(
    s: proto::PodSandboxStatus,
    info: StringMap,
) -> Option<PodSandboxStatus> {
    let network_reported = s.network.is_some();
    let network = s.network.unwrap_or_default();
    let namespace_options: Option<super::detail::NamespaceOption> = s
        .linux
        .and_then(|l| l.namespaces)
        .and_then(|n| n.options)
        .map(Into::into);
    let host_network = namespace_options
        .as_ref()
        .is_some_and(|o| o.network == NamespaceMode::Node);
    Some(PodSandboxStatus {
        sandbox: PodSandbox {
            id: s.id,
            metadata: s.metadata.map(Into::into).unwrap_or_default(),
            state: sandbox_state(s.state),
            created_at: s.created_at,
            labels: s.labels,
            annotations: s.annotations,
            runtime_handler: s.runtime_handler,
        },
        ip: network.ip,
        additional_ips: network.additional_ips.into_iter().map(|i| i.ip).collect(),
        host_network,
        info,
        detail: SandboxStatusDetail {
            network_reported,
            namespace_options,
        },
    })
}

#[cfg(feature = "test-util")]
pub(crate) fn sandbox_status_message(s: &PodSandboxStatus) -> proto::PodSandboxStatusResponse {
    let network_mode = if s.host_network {
        proto::NamespaceMode::Node
    } else {
        proto::NamespaceMode::Pod
    };
    proto::PodSandboxStatusResponse {
        status: Some(proto::PodSandboxStatus {
            id: s.sandbox.id.clone(),
            metadata: Some(s.sandbox.metadata.clone().into()),
            state: proto::PodSandboxState::from(s.sandbox.state).into(),
            created_at: s.sandbox.created_at,
            network: Some(proto::PodSandboxNetworkStatus {
                ip: s.ip.clone(),
                additional_ips: s
                    .additional_ips
                    .iter()
                    .map(|ip| proto::PodIp { ip: ip.clone() })
                    .collect(),
            }),
            linux: Some(proto::LinuxPodSandboxStatus {
                namespaces: Some(proto::Namespace {
                    options: Some(match &s.detail.namespace_options {
                        Some(o) => namespace_option_message(o),
                        None => proto::NamespaceOption {
                            network: network_mode.into(),
                            ..Default::default()
                        },
                    }),
                }),
            }),
            labels: s.sandbox.labels.clone(),
            annotations: s.sandbox.annotations.clone(),
            runtime_handler: s.sandbox.runtime_handler.clone(),
        }),
        info: s.info.clone(),
        ..Default::default()
    }
}

pub(crate) fn sandbox_filter(f: SandboxFilter) -> proto::PodSandboxFilter {
    proto::PodSandboxFilter {
        id: f.id.unwrap_or_default(),
        state: f.state.map(|s| proto::PodSandboxStateValue {
            state: proto::PodSandboxState::from(s).into(),
        }),
        label_selector: f.labels,
    }
}

#[cfg(feature = "test-util")]
pub(crate) fn sandbox_filter_from(f: Option<proto::PodSandboxFilter>) -> SandboxFilter {
    let Some(f) = f else {
        return SandboxFilter::default();
    };
    SandboxFilter {
        id: Some(f.id).filter(|s| !s.is_empty()),
        state: f.state.map(|s| sandbox_state(s.state)),
        labels: f.label_selector,
    }
}

#[cfg(feature = "test-util")]
/// The namespaces the kubelet gives a host-network pod without `shareProcessNamespace`: the
/// node's network, a PID namespace per container, IPC shared in the pod.
fn pod_namespaces() -> proto::NamespaceOption {
    proto::NamespaceOption {
        network: proto::NamespaceMode::Node.into(),
        pid: proto::NamespaceMode::Container.into(),
        ipc: proto::NamespaceMode::Pod.into(),
        ..Default::default()
    }
}

#[cfg(feature = "test-util")]
pub(crate) fn sandbox_config(c: SandboxConfig) -> proto::PodSandboxConfig {
    proto::PodSandboxConfig {
        metadata: Some(c.metadata.into()),
        hostname: c.hostname,
        log_directory: c.log_directory,
        labels: c.labels,
        annotations: c.annotations,
        linux: Some(proto::LinuxPodSandboxConfig {
            cgroup_parent: c.cgroup_parent,
            security_context: Some(proto::LinuxSandboxSecurityContext {
                namespace_options: Some(pod_namespaces()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[cfg(feature = "test-util")]
pub(crate) fn sandbox_config_from(c: proto::PodSandboxConfig) -> SandboxConfig {
    SandboxConfig {
        metadata: c.metadata.map(Into::into).unwrap_or_default(),
        hostname: c.hostname,
        log_directory: c.log_directory,
        labels: c.labels,
        annotations: c.annotations,
        cgroup_parent: c.linux.map(|l| l.cgroup_parent).unwrap_or_default(),
    }
}

// === containers ===

impl From<proto::Container> for Container {
    fn from(c: proto::Container) -> Self {
        let image_spec: super::detail::ImageSpec = c.image.map(Into::into).unwrap_or_default();
        Container {
            id: c.id,
            pod_sandbox_id: c.pod_sandbox_id,
            metadata: c.metadata.map(Into::into).unwrap_or_default(),
            image: image_spec.image.clone(),
            image_ref: c.image_ref,
            state: container_state(c.state),
            created_at: c.created_at,
            labels: c.labels,
            annotations: c.annotations,
            image_id: c.image_id,
            image_spec,
        }
    }
}

impl From<Container> for proto::Container {
    fn from(c: Container) -> Self {
        proto::Container {
            id: c.id,
            pod_sandbox_id: c.pod_sandbox_id,
            metadata: Some(c.metadata.into()),
            image: Some(image_spec_named(&c.image, &c.image_spec)),
            image_ref: c.image_ref,
            state: proto::ContainerState::from(c.state).into(),
            created_at: c.created_at,
            labels: c.labels,
            annotations: c.annotations,
            image_id: c.image_id,
        }
    }
}

pub(crate) fn container_status(resp: proto::ContainerStatusResponse) -> Option<ContainerStatus> {
    Some(container_status_of(resp.status?, resp.info))
}

pub(crate) fn container_status_of(
    mut s: proto::ContainerStatus,
    info: StringMap,
) -> ContainerStatus {
    let detail = container_status_detail(&mut s);
    ContainerStatus {
        id: s.id,
        metadata: s.metadata.map(Into::into).unwrap_or_default(),
        state: container_state(s.state),
        created_at: s.created_at,
        started_at: s.started_at,
        finished_at: s.finished_at,
        exit_code: s.exit_code,
        image: image_name(s.image),
        image_ref: s.image_ref,
        image_id: s.image_id,
        reason: s.reason,
        message: s.message,
        labels: s.labels,
        annotations: s.annotations,
        log_path: s.log_path,
        info,
        detail,
    }
}

#[cfg(feature = "test-util")]
pub(crate) fn container_status_message(s: &ContainerStatus) -> proto::ContainerStatusResponse {
    proto::ContainerStatusResponse {
        status: Some(proto::ContainerStatus {
            id: s.id.clone(),
            metadata: Some(s.metadata.clone().into()),
            state: proto::ContainerState::from(s.state).into(),
            created_at: s.created_at,
            started_at: s.started_at,
            finished_at: s.finished_at,
            exit_code: s.exit_code,
            image: Some(image_spec_named(&s.image, &s.detail.image_spec)),
            image_ref: s.image_ref.clone(),
            image_id: s.image_id.clone(),
            reason: s.reason.clone(),
            message: s.message.clone(),
            labels: s.labels.clone(),
            annotations: s.annotations.clone(),
            log_path: s.log_path.clone(),
            ..Default::default()
        }),
        info: s.info.clone(),
    }
}

pub(crate) fn container_filter(f: ContainerFilter) -> proto::ContainerFilter {
    proto::ContainerFilter {
        id: f.id.unwrap_or_default(),
        state: f.state.map(|s| proto::ContainerStateValue {
            state: proto::ContainerState::from(s).into(),
        }),
        pod_sandbox_id: f.pod_sandbox_id.unwrap_or_default(),
        label_selector: f.labels,
    }
}

#[cfg(feature = "test-util")]
pub(crate) fn container_filter_from(f: Option<proto::ContainerFilter>) -> ContainerFilter {
    let Some(f) = f else {
        return ContainerFilter::default();
    };
    ContainerFilter {
        id: Some(f.id).filter(|s| !s.is_empty()),
        state: f.state.map(|s| container_state(s.state)),
        pod_sandbox_id: Some(f.pod_sandbox_id).filter(|s| !s.is_empty()),
        labels: f.label_selector,
    }
}

#[cfg(feature = "test-util")]
pub(crate) fn container_config(c: ContainerConfig) -> proto::ContainerConfig {
    proto::ContainerConfig {
        metadata: Some(c.metadata.into()),
        image: Some(proto::ImageSpec {
            image: c.image,
            user_specified_image: c.user_specified_image,
            ..Default::default()
        }),
        command: c.command,
        args: c.args,
        envs: c
            .envs
            .into_iter()
            .map(|(key, value)| proto::KeyValue {
                key,
                value: value.into_bytes(),
            })
            .collect(),
        labels: c.labels,
        annotations: c.annotations,
        log_path: c.log_path,
        // the kubelet gives a container the namespaces of its pod
        linux: Some(proto::LinuxContainerConfig {
            security_context: Some(proto::LinuxContainerSecurityContext {
                namespace_options: Some(pod_namespaces()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[cfg(feature = "test-util")]
pub(crate) fn container_config_from(c: proto::ContainerConfig) -> ContainerConfig {
    ContainerConfig {
        metadata: c.metadata.map(Into::into).unwrap_or_default(),
        user_specified_image: c
            .image
            .as_ref()
            .map(|i| i.user_specified_image.clone())
            .unwrap_or_default(),
        image: image_name(c.image),
        command: c.command,
        args: c.args,
        envs: c
            .envs
            .into_iter()
            .map(|kv| (kv.key, String::from_utf8_lossy(&kv.value).into_owned()))
            .collect(),
        labels: c.labels,
        annotations: c.annotations,
        log_path: c.log_path,
    }
}

pub(crate) fn container_event(e: proto::ContainerEventResponse) -> ContainerEvent {
    let kind = match proto::ContainerEventType::try_from(e.container_event_type) {
        Ok(proto::ContainerEventType::ContainerCreatedEvent) => ContainerEventKind::Created,
        Ok(proto::ContainerEventType::ContainerStartedEvent) => ContainerEventKind::Started,
        Ok(proto::ContainerEventType::ContainerStoppedEvent) => ContainerEventKind::Stopped,
        Ok(proto::ContainerEventType::ContainerDeletedEvent) => ContainerEventKind::Deleted,
        // an event type from a newer CRI: treat it as "something changed"
        Err(_) => ContainerEventKind::Stopped,
    };
    let sandbox_status = e
        .pod_sandbox_status
        .and_then(|s| sandbox_status_of(s, StringMap::new()));
    ContainerEvent {
        container_id: e.container_id,
        kind,
        created_at: e.created_at,
        pod_sandbox_id: sandbox_status
            .as_ref()
            .map(|s| s.sandbox.id.clone())
            .filter(|id| !id.is_empty()),
        sandbox_status: sandbox_status.map(Box::new),
        container_statuses: e
            .containers_statuses
            .into_iter()
            .map(|s| container_status_of(s, StringMap::new()))
            .collect(),
    }
}

#[cfg(feature = "test-util")]
pub(crate) fn container_event_message(e: &ContainerEvent) -> proto::ContainerEventResponse {
    let kind = match e.kind {
        ContainerEventKind::Created => proto::ContainerEventType::ContainerCreatedEvent,
        ContainerEventKind::Started => proto::ContainerEventType::ContainerStartedEvent,
        ContainerEventKind::Stopped => proto::ContainerEventType::ContainerStoppedEvent,
        ContainerEventKind::Deleted => proto::ContainerEventType::ContainerDeletedEvent,
    };
    proto::ContainerEventResponse {
        container_id: e.container_id.clone(),
        container_event_type: kind.into(),
        created_at: e.created_at,
        pod_sandbox_status: e.pod_sandbox_id.as_ref().map(|id| proto::PodSandboxStatus {
            id: id.clone(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

// === images ===

impl From<proto::Image> for Image {
    fn from(i: proto::Image) -> Self {
        Image {
            id: i.id,
            repo_tags: i.repo_tags,
            repo_digests: i.repo_digests,
            size: i.size,
            pinned: i.pinned,
            uid: i.uid.map(|u| u.value),
            username: i.username,
            spec: i.spec.map(Into::into),
        }
    }
}

impl From<Image> for proto::Image {
    fn from(i: Image) -> Self {
        proto::Image {
            id: i.id,
            repo_tags: i.repo_tags,
            repo_digests: i.repo_digests,
            size: i.size,
            pinned: i.pinned,
            uid: i.uid.map(|value| proto::Int64Value { value }),
            username: i.username,
            spec: i.spec.map(Into::into),
        }
    }
}

impl From<proto::FilesystemUsage> for FilesystemUsage {
    fn from(f: proto::FilesystemUsage) -> Self {
        FilesystemUsage {
            timestamp: f.timestamp,
            mountpoint: f.fs_id.map(|i| i.mountpoint).unwrap_or_default(),
            used_bytes: f.used_bytes.map(|v| v.value),
            inodes_used: f.inodes_used.map(|v| v.value),
        }
    }
}

impl From<FilesystemUsage> for proto::FilesystemUsage {
    fn from(f: FilesystemUsage) -> Self {
        proto::FilesystemUsage {
            timestamp: f.timestamp,
            fs_id: Some(proto::FilesystemIdentifier {
                mountpoint: f.mountpoint,
            }),
            used_bytes: f.used_bytes.map(|value| proto::UInt64Value { value }),
            inodes_used: f.inodes_used.map(|value| proto::UInt64Value { value }),
        }
    }
}

impl From<PullAuth> for proto::AuthConfig {
    fn from(a: PullAuth) -> Self {
        proto::AuthConfig {
            username: a.username,
            password: a.password,
            auth: a.auth,
            server_address: a.server_address,
            identity_token: a.identity_token,
            registry_token: a.registry_token,
        }
    }
}

impl From<proto::AuthConfig> for PullAuth {
    fn from(a: proto::AuthConfig) -> Self {
        PullAuth {
            username: a.username,
            password: a.password,
            auth: a.auth,
            server_address: a.server_address,
            identity_token: a.identity_token,
            registry_token: a.registry_token,
        }
    }
}

/// Generated without `Debug` (see tools/cri-gen): requests that carry credentials must be safe to
/// log. Only the user name and server are shown.
impl fmt::Debug for proto::AuthConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&PullAuth::from(self.clone()), f)
    }
}

pub(crate) fn pull_request(r: PullRequest) -> proto::PullImageRequest {
    proto::PullImageRequest {
        image: Some(image_spec(&r.image)),
        auth: r.auth.map(Into::into),
        sandbox_config: r.sandbox.map(|s| proto::PodSandboxConfig {
            labels: s.labels,
            annotations: s.annotations,
            ..Default::default()
        }),
    }
}

#[cfg(feature = "test-util")]
pub(crate) fn pull_request_from(r: proto::PullImageRequest) -> PullRequest {
    PullRequest {
        image: image_name(r.image),
        auth: r.auth.map(Into::into),
        sandbox: r.sandbox_config.map(|s| PullSandbox {
            labels: s.labels,
            annotations: s.annotations,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auth_config_debug_never_shows_secrets() {
        let auth = proto::AuthConfig {
            username: "alice".into(),
            password: "hunter2".into(),
            auth: "YWxpY2U6aHVudGVyMg==".into(),
            server_address: "registry.example.com".into(),
            identity_token: "idtok".into(),
            registry_token: "regtok".into(),
        };
        let req = proto::PullImageRequest {
            image: Some(image_spec("registry.example.com/app:v1")),
            auth: Some(auth),
            sandbox_config: None,
        };
        let text = format!("{req:?}");
        for secret in ["hunter2", "YWxpY2U6aHVudGVyMg==", "idtok", "regtok"] {
            assert!(!text.contains(secret), "{secret} leaked in {text}");
        }
        assert!(
            text.contains("alice") && text.contains("<redacted>"),
            "{text}"
        );
    }

    #[test]
    fn states_round_trip_through_the_wire_enums() {
        for s in [
            ContainerState::Created,
            ContainerState::Running,
            ContainerState::Exited,
            ContainerState::Unknown,
        ] {
            assert_eq!(container_state(proto::ContainerState::from(s) as i32), s);
        }
        for s in [SandboxState::Ready, SandboxState::NotReady] {
            assert_eq!(sandbox_state(proto::PodSandboxState::from(s) as i32), s);
        }
        assert_eq!(container_state(99), ContainerState::Unknown);
    }
}
