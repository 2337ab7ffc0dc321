//! The container the kubelet creates: its CRI config from the pod's spec
//! (kuberuntime_container.go generateContainerConfig), the kubelet hash of its spec
//! (`kruised::hash::kubelet`), its image pull policy, and the end-to-end tests' own
//! [`ContainerSpec`] and [`PodSpec`] for pods that need no API object.

use std::path::Path;

use k8s_openapi::api::core::v1::{Container, Pod};
use kruised::cri::{ContainerConfig, ContainerMetadata, SandboxConfig, SandboxMetadata, StringMap};
use kruised::hash::kubelet::{format_hash, hash_container};

use super::meta::{self, PodRef};

/// The kubelet hash of a container's spec, lowercase hex.
pub fn hash(c: &Container) -> String {
    format_hash(hash_container(c))
}

/// The pod's `terminationGracePeriodSeconds` (30 unless set).
pub fn grace_seconds(pod: &Pod) -> i64 {
    pod.spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .unwrap_or(30)
}

/// The container `name` of the pod's spec.
pub fn container<'a>(pod: &'a Pod, name: &str) -> &'a Container {
    pod.spec
        .iter()
        .flat_map(|s| &s.containers)
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no container {name} in the pod's spec"))
}

/// When the kubelet pulls a container's image (`imagePullPolicy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PullPolicy {
    /// Every time the container starts.
    Always,
    /// When the image is not on the node.
    IfNotPresent,
    /// Never: a missing image fails the start (`ErrImageNeverPull`).
    Never,
}

impl PullPolicy {
    /// The policy `policy` names, or the API server's default for `image` when it names none
    /// (core/v1 defaults.go: `Always` for the tag `latest` or no tag, else `IfNotPresent`).
    pub fn of(policy: Option<&str>, image: &str) -> Self {
        match policy {
            Some("Always") => PullPolicy::Always,
            Some("Never") => PullPolicy::Never,
            Some("IfNotPresent") => PullPolicy::IfNotPresent,
            _ => {
                let (name, digest) = image
                    .split_once('@')
                    .map_or((image, false), |(n, _)| (n, true));
                let last = name.rsplit('/').next().unwrap_or(name);
                match last.split_once(':') {
                    Some((_, "latest")) => PullPolicy::Always,
                    Some(_) => PullPolicy::IfNotPresent,
                    None if digest => PullPolicy::IfNotPresent,
                    None => PullPolicy::Always,
                }
            }
        }
    }

    /// The policy of container `c`.
    pub fn of_container(c: &Container) -> Self {
        Self::of(
            c.image_pull_policy.as_deref(),
            c.image.as_deref().unwrap_or_default(),
        )
    }
}

/// The config the kubelet passes to `CreateContainer` for `c` of `pod` with `attempt`: the
/// spec's image (the start resolves it to its ID), command, args, the env resolved from the pod
/// now, and the kubelet's labels and annotations.
pub fn container_config(pod: &Pod, c: &Container, attempt: u32) -> ContainerConfig {
    let json = |v: Option<String>| v.filter(|s| s != "[]");
    let pre_stop = json(
        c.lifecycle
            .as_ref()
            .and_then(|l| l.pre_stop.as_ref())
            .and_then(|h| serde_json::to_string(h).ok()),
    );
    let ports = json(c.ports.as_ref().and_then(|p| serde_json::to_string(p).ok()));
    ContainerConfig {
        metadata: ContainerMetadata {
            name: c.name.clone(),
            attempt,
        },
        image: c.image.clone().unwrap_or_default(),
        command: c.command.clone().unwrap_or_default(),
        args: c.args.clone().unwrap_or_default(),
        envs: super::env::resolve(pod, c),
        labels: meta::container_labels(PodRef::of(pod), &c.name, &StringMap::new()),
        annotations: meta::container_annotations(
            &hash(c),
            attempt,
            grace_seconds(pod),
            pre_stop.as_deref(),
            ports.as_deref(),
        ),
        log_path: format!("{}/{attempt}.log", c.name),
        ..Default::default()
    }
}

/// The host-network sandbox config of a pod: its identity and labels, its annotations, its log
/// directory under `log_root`, its cgroup parent under `cgroup_root`.
pub fn sandbox_config(
    pod: PodRef<'_>,
    attempt: u32,
    labels: &StringMap,
    annotations: StringMap,
    log_root: &Path,
    cgroup_root: &str,
) -> SandboxConfig {
    SandboxConfig {
        metadata: SandboxMetadata {
            name: pod.name.into(),
            uid: pod.uid.into(),
            namespace: pod.namespace.into(),
            attempt,
        },
        // host network: the node's hostname (no UTS namespace of its own)
        hostname: String::new(),
        log_directory: log_root
            .join(format!("{}_{}_{}", pod.namespace, pod.name, pod.uid))
            .display()
            .to_string(),
        labels: meta::sandbox_labels(pod, labels),
        annotations,
        cgroup_parent: format!("{cgroup_root}/pod{}", pod.uid),
    }
}

/// A container as the end-to-end tests describe it, without a pod object.
#[derive(Clone, Debug, Default)]
pub struct ContainerSpec {
    /// Name in the pod spec.
    pub name: String,
    /// Image reference.
    pub image: String,
    /// `imagePullPolicy` (none: the API server's default for the image).
    pub pull_policy: Option<String>,
    /// Command (entrypoint override).
    pub command: Vec<String>,
    /// Environment.
    pub env: Vec<(String, String)>,
    /// The kubelet hash to record (lowercase hex), as the kubelet computes it from the spec.
    pub hash: String,
    /// The preStop handler JSON to record, if any.
    pub pre_stop: Option<String>,
    /// Labels beyond the kubelet's own.
    pub labels: StringMap,
}

impl ContainerSpec {
    /// A container that runs until stopped and exits 0 on SIGTERM.
    pub fn sleeper(name: &str, image: &str) -> Self {
        Self::shell(name, image, "trap 'exit 0' TERM; while :; do sleep 1; done")
    }

    /// A container that ignores SIGTERM, so only SIGKILL after the grace period ends it.
    pub fn stubborn(name: &str, image: &str) -> Self {
        Self::shell(name, image, "trap '' TERM; while :; do sleep 1; done")
    }

    fn shell(name: &str, image: &str, script: &str) -> Self {
        ContainerSpec {
            name: name.into(),
            image: image.into(),
            command: ["/bin/sh", "-c", script].map(String::from).to_vec(),
            hash: "1a2b3c4d".into(),
            ..Default::default()
        }
    }

    /// The kubelet's container spec for container `name` of `pod` now: its image and pull
    /// policy, its env resolved from the pod as it is, the kubelet hash of its spec; it runs
    /// as a sleeper.
    pub fn of_pod(pod: &Pod, name: &str) -> Self {
        let c = container(pod, name);
        ContainerSpec {
            pull_policy: c.image_pull_policy.clone(),
            env: super::env::resolve(pod, c),
            hash: hash(c),
            ..Self::sleeper(name, c.image.as_deref().unwrap_or_default())
        }
    }

    /// Its pull policy.
    pub fn policy(&self) -> PullPolicy {
        PullPolicy::of(self.pull_policy.as_deref(), &self.image)
    }

    /// Its config for `CreateContainer` in `pod` with `attempt`, the image as the spec names it.
    pub fn config(&self, pod: &PodSpec, attempt: u32) -> ContainerConfig {
        ContainerConfig {
            metadata: ContainerMetadata {
                name: self.name.clone(),
                attempt,
            },
            image: self.image.clone(),
            command: self.command.clone(),
            envs: self.env.clone(),
            labels: meta::container_labels(pod.pod_ref(), &self.name, &self.labels),
            annotations: meta::container_annotations(
                &self.hash,
                attempt,
                pod.termination_grace_seconds,
                self.pre_stop.as_deref(),
                None,
            ),
            log_path: format!("{}/{attempt}.log", self.name),
            ..Default::default()
        }
    }
}

/// A pod as the end-to-end tests want it on the node.
#[derive(Clone, Debug, Default)]
pub struct PodSpec {
    /// Pod name.
    pub name: String,
    /// Pod namespace.
    pub namespace: String,
    /// Pod uid.
    pub uid: String,
    /// Pod labels.
    pub labels: StringMap,
    /// Pod annotations (the kubelet passes them to the sandbox).
    pub annotations: StringMap,
    /// The sandbox attempt (how many sandboxes the kubelet made for the pod before).
    pub attempt: u32,
    /// `terminationGracePeriodSeconds`.
    pub termination_grace_seconds: i64,
    /// Containers.
    pub containers: Vec<ContainerSpec>,
}

impl PodSpec {
    /// Its identity, as the kubelet labels what it creates for it.
    pub fn pod_ref(&self) -> PodRef<'_> {
        PodRef {
            name: &self.name,
            namespace: &self.namespace,
            uid: &self.uid,
        }
    }

    /// A pod with a unique uid and the given containers.
    pub fn new(name: &str, containers: Vec<ContainerSpec>) -> Self {
        PodSpec {
            name: name.into(),
            namespace: "default".into(),
            uid: format!("uid-{name}"),
            termination_grace_seconds: 30,
            containers,
            ..Default::default()
        }
    }
}
