//! A small stand-in for the kubelet's CRI side: creates host-network sandboxes and containers with
//! the kubelet's labels and annotations, recreates an exited container with attempt + 1, and
//! removes what it created.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kruised::cri::{
    ContainerConfig, ContainerMetadata, ImageService, KubeletService, PullRequest, RemoteRuntime,
    RuntimeService, SandboxConfig, SandboxMetadata, StringMap,
};
use kruised::hash::kubelet::{format_hash, hash_container};

use super::kubelet_meta::{self, PodRef};

/// A container as a pod spec would describe it.
#[derive(Clone, Debug, Default)]
pub struct ContainerSpec {
    /// Name in the pod spec.
    pub name: String,
    /// Image reference.
    pub image: String,
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
        ContainerSpec {
            name: name.to_string(),
            image: image.to_string(),
            command: vec![
                "/bin/sh".into(),
                "-c".into(),
                "trap 'exit 0' TERM; while :; do sleep 1; done".into(),
            ],
            hash: "1a2b3c4d".into(),
            ..Default::default()
        }
    }

    /// The kubelet's container spec for container `name` of `pod` now: its image, its env
    /// resolved from the pod as it is, the kubelet hash of its spec; it runs as a sleeper.
    pub fn of_pod(pod: &Pod, name: &str) -> Self {
        let c = pod
            .spec
            .as_ref()
            .and_then(|s| s.containers.iter().find(|c| c.name == name))
            .unwrap_or_else(|| panic!("no container {name} in the pod's spec"));
        let mut spec = Self::sleeper(name, c.image.as_deref().unwrap_or_default());
        spec.env = super::node::resolve_env(pod, c);
        spec.hash = format_hash(hash_container(c));
        spec
    }

    /// A container that ignores SIGTERM, so only SIGKILL after the grace period ends it.
    pub fn stubborn(name: &str, image: &str) -> Self {
        ContainerSpec {
            command: vec![
                "/bin/sh".into(),
                "-c".into(),
                "trap '' TERM; while :; do sleep 1; done".into(),
            ],
            ..Self::sleeper(name, image)
        }
    }
}

/// A pod as the test wants it on the node.
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
            name: name.to_string(),
            namespace: "default".into(),
            uid: format!("uid-{name}"),
            labels: StringMap::new(),
            annotations: StringMap::new(),
            attempt: 0,
            termination_grace_seconds: 30,
            containers,
        }
    }
}

/// A pod the driver created.
#[derive(Clone, Debug)]
pub struct RunningPod {
    /// The spec it was created from.
    pub spec: PodSpec,
    /// Its sandbox.
    pub sandbox_id: String,
    /// Current container ID per container name.
    pub containers: BTreeMap<String, String>,
    /// Current attempt per container name.
    pub attempts: BTreeMap<String, u32>,
}

impl RunningPod {
    /// The current container ID of `name`.
    pub fn container(&self, name: &str) -> &str {
        self.containers
            .get(name)
            .map(String::as_str)
            .unwrap_or_else(|| panic!("no container {name} in pod {}", self.spec.name))
    }
}

/// Plays the kubelet against a real (or fake) CRI runtime.
pub struct Kubelet {
    runtime: RemoteRuntime,
    log_root: std::path::PathBuf,
}

impl Kubelet {
    /// A driver for `runtime`, writing container logs under `log_root`.
    pub fn new(runtime: RemoteRuntime, log_root: impl Into<std::path::PathBuf>) -> Self {
        Kubelet {
            runtime,
            log_root: log_root.into(),
        }
    }

    /// The runtime client.
    pub fn runtime(&self) -> &RemoteRuntime {
        &self.runtime
    }

    /// Waits until the container `id` has exited, as the kubelet's relist would see it: for
    /// a stop that somebody else (the daemon) makes, hook first. Fails the test after `limit`.
    pub async fn wait_exited(&self, id: &str, limit: Duration) {
        super::within(limit, "the container exiting", async {
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            loop {
                tick.tick().await;
                let status = self.runtime.container_status(id, false).await;
                if status.is_ok_and(|s| s.state == kruised::cri::ContainerState::Exited) {
                    return;
                }
            }
        })
        .await;
    }

    /// Pulls each image through CRI, each within `limit`.
    pub async fn pull(&self, images: &[String], limit: Duration) {
        for image in images {
            super::within(
                limit,
                "image pull",
                self.runtime.pull_image(
                    PullRequest {
                        image: image.clone(),
                        ..Default::default()
                    },
                    limit,
                ),
            )
            .await
            .unwrap_or_else(|e| panic!("pulling {image}: {e}"));
        }
    }

    fn make_log_directory(&self, spec: &PodSpec) {
        let dir = self.log_directory(spec);
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("creating the log directory {}: {e}", dir.display()));
    }

    fn sandbox_config(&self, spec: &PodSpec) -> SandboxConfig {
        SandboxConfig {
            metadata: SandboxMetadata {
                name: spec.name.clone(),
                uid: spec.uid.clone(),
                namespace: spec.namespace.clone(),
                attempt: spec.attempt,
            },
            // host-network pods keep the node's hostname (no UTS namespace of their own)
            hostname: String::new(),
            log_directory: self.log_directory(spec).display().to_string(),
            labels: kubelet_meta::sandbox_labels(spec.pod_ref(), &spec.labels),
            annotations: spec.annotations.clone(),
            cgroup_parent: format!("/cri-lab/pod{}", spec.uid),
        }
    }

    /// The pod's log directory, as the kubelet names it.
    fn log_directory(&self, spec: &PodSpec) -> std::path::PathBuf {
        self.log_root
            .join(format!("{}_{}_{}", spec.namespace, spec.name, spec.uid))
    }

    /// What the kubelet does before `CreateContainer`: resolves the spec's image to the image
    /// ID it passes to the runtime (`ImageStatus`), and makes the container's log directory
    /// (CRI-O's conmon needs it to exist).
    async fn container_config(
        &self,
        pod: &PodSpec,
        c: &ContainerSpec,
        attempt: u32,
    ) -> ContainerConfig {
        let image = self
            .runtime
            .image_status(&c.image)
            .await
            .unwrap_or_else(|e| panic!("ImageStatus {}: {e}", c.image))
            .unwrap_or_else(|| panic!("image {} is not on the node: pull it first", c.image));
        let dir = self.log_directory(pod).join(&c.name);
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("creating the log directory {}: {e}", dir.display()));
        ContainerConfig {
            metadata: ContainerMetadata {
                name: c.name.clone(),
                attempt,
            },
            image: image.id,
            user_specified_image: c.image.clone(),
            command: c.command.clone(),
            args: vec![],
            envs: c.env.clone(),
            labels: kubelet_meta::container_labels(pod.pod_ref(), &c.name, &c.labels),
            annotations: kubelet_meta::container_annotations(
                &c.hash,
                attempt,
                pod.termination_grace_seconds,
                c.pre_stop.as_deref(),
            ),
            log_path: format!("{}/{attempt}.log", c.name),
        }
    }

    /// Creates (without starting) container `c` with `attempt` in the sandbox of `pod`.
    pub async fn create(
        &self,
        pod: &PodSpec,
        sandbox_id: &str,
        c: &ContainerSpec,
        attempt: u32,
    ) -> String {
        self.runtime
            .create_container(
                sandbox_id,
                self.container_config(pod, c, attempt).await,
                self.sandbox_config(pod),
            )
            .await
            .unwrap_or_else(|e| panic!("create container {}: {e}", c.name))
    }

    /// Creates the sandbox of `spec` (no containers); returns its ID.
    pub async fn run_sandbox(&self, spec: &PodSpec) -> String {
        self.make_log_directory(spec);
        self.runtime
            .run_pod_sandbox(self.sandbox_config(spec))
            .await
            .unwrap_or_else(|e| panic!("run sandbox {}: {e}", spec.name))
    }

    /// Creates and starts container `c` with `attempt` in the sandbox of `pod`.
    pub async fn start(
        &self,
        pod: &PodSpec,
        sandbox_id: &str,
        c: &ContainerSpec,
        attempt: u32,
    ) -> String {
        let id = self
            .runtime
            .create_container(
                sandbox_id,
                self.container_config(pod, c, attempt).await,
                self.sandbox_config(pod),
            )
            .await
            .unwrap_or_else(|e| panic!("create container {}: {e}", c.name));
        self.runtime
            .start_container(&id)
            .await
            .unwrap_or_else(|e| panic!("start container {}: {e}", c.name));
        id
    }

    /// Creates the sandbox and starts every container, as the kubelet does for a new pod.
    /// Images must already be on the node.
    pub async fn run_pod(&self, spec: PodSpec) -> RunningPod {
        let sandbox_id = self.run_sandbox(&spec).await;
        let mut containers = BTreeMap::new();
        let mut attempts = BTreeMap::new();
        for c in &spec.containers {
            let id = self.start(&spec, &sandbox_id, c, 0).await;
            containers.insert(c.name.clone(), id);
            attempts.insert(c.name.clone(), 0);
        }
        RunningPod {
            spec,
            sandbox_id,
            containers,
            attempts,
        }
    }

    /// Creates the container `name` again with attempt + 1 (after it exited), optionally with a
    /// new spec, as the kubelet does when it restarts a container.
    pub async fn recreate(
        &self,
        pod: &mut RunningPod,
        name: &str,
        spec: Option<ContainerSpec>,
    ) -> String {
        let idx = pod
            .spec
            .containers
            .iter()
            .position(|c| c.name == name)
            .unwrap_or_else(|| panic!("no container {name}"));
        if let Some(s) = spec {
            pod.spec.containers[idx] = s;
        }
        let attempt = pod.attempts.get(name).copied().unwrap_or(0) + 1;
        let c = pod.spec.containers[idx].clone();
        let id = self.start(&pod.spec, &pod.sandbox_id, &c, attempt).await;
        pod.containers.insert(name.to_string(), id.clone());
        pod.attempts.insert(name.to_string(), attempt);
        id
    }

    /// Stops and removes the pod's sandbox and containers.
    pub async fn remove_pod(&self, pod: &RunningPod) {
        for id in pod.containers.values() {
            let _ = self.runtime.stop_container(id, Duration::ZERO).await;
        }
        self.runtime
            .stop_pod_sandbox(&pod.sandbox_id)
            .await
            .unwrap_or_else(|e| panic!("stop sandbox of {}: {e}", pod.spec.name));
        self.runtime
            .remove_pod_sandbox(&pod.sandbox_id)
            .await
            .unwrap_or_else(|e| panic!("remove sandbox of {}: {e}", pod.spec.name));
    }
}
