//! Creating sandboxes and containers as the kubelet does, and creating them again when they
//! exited or their spec changed (kuberuntime_manager.go SyncPod: kill, then start; and
//! kuberuntime_container.go startContainer: the image step, create, start), on a real CRI
//! runtime ([`Kubelet`], through CRI) or on the fake runtime of an in-process node
//! ([`sandbox_fake`], [`recreate_fake`], into its state).
//!
//! The image step is one step of its own ([`Kubelet::ensure_image`], [`ensure_image_fake`]),
//! as image_manager.go EnsureImageExists: `Always` pulls, `IfNotPresent` pulls when the image
//! is not on the node, `Never` fails with `ErrImageNeverPull` when it is not.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, LifecycleHandler, Pod};
use kruised::cri::fake::FakeRuntime;
use kruised::cri::{
    ContainerConfig, ContainerState, ImageService, KubeletService, PullRequest, RemoteRuntime,
    RuntimeService, SandboxConfig, SandboxMetadata,
};

use super::meta::{PodRef, sandbox_labels};
use super::spec::{ContainerSpec, PodSpec, PullPolicy, container_config};

/// An error of a step through CRI.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a container's image step failed, with the kubelet's waiting reason.
#[derive(Debug)]
pub struct ImageError {
    /// `ErrImageNeverPull` or `ErrImagePull`.
    pub reason: &'static str,
    /// The kubelet's message.
    pub message: String,
}

impl std::fmt::Display for ImageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.reason, self.message)
    }
}

impl std::error::Error for ImageError {}

/// What the image step did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageStep {
    /// The image's ID, which the kubelet passes to `CreateContainer`.
    pub id: String,
    /// Whether it pulled.
    pub pulled: bool,
}

/// Whether the kubelet pulls with `policy` when the image is `present`; `Err` for a missing
/// image it may not pull (image_manager.go shouldPullImage and EnsureImageExists).
fn should_pull(policy: PullPolicy, image: &str, present: bool) -> Result<bool, ImageError> {
    match policy {
        PullPolicy::Always => Ok(true),
        PullPolicy::IfNotPresent => Ok(!present),
        PullPolicy::Never if present => Ok(false),
        PullPolicy::Never => Err(ImageError {
            reason: "ErrImageNeverPull",
            message: format!(
                "Container image \"{image}\" is not present with pull policy of Never"
            ),
        }),
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

    /// Its containers as the kubelet reports them (image `busybox`, no state), each ID with
    /// the lab runtime's prefix.
    pub fn reports(&self) -> Vec<super::status::Report> {
        let report = |(n, id): (&String, &String)| {
            super::status::Report::ready(n, &crate::kubelet_id(id), self.attempts[n])
        };
        self.containers.iter().map(report).collect()
    }
}

/// Plays the kubelet against a real (or fake) CRI runtime, through CRI.
pub struct Kubelet {
    runtime: RemoteRuntime,
    log_root: PathBuf,
    /// The sandboxes' cgroup parent is `<this>/pod<uid>` (cgroupfs).
    pub cgroup_root: String,
}

impl Kubelet {
    /// A driver for `runtime`, writing container logs under `log_root`.
    pub fn new(runtime: RemoteRuntime, log_root: impl Into<PathBuf>) -> Self {
        Kubelet {
            runtime,
            log_root: log_root.into(),
            cgroup_root: "/cri-lab".into(),
        }
    }

    /// The runtime client.
    pub fn runtime(&self) -> &RemoteRuntime {
        &self.runtime
    }

    /// Waits until the container `id` has exited, as the kubelet's relist would see it: for
    /// a stop that somebody else (the daemon) makes, hook first. Fails the test after `limit`.
    pub async fn wait_exited(&self, id: &str, limit: Duration) {
        crate::within(limit, "the container exiting", async {
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            loop {
                tick.tick().await;
                let status = self.runtime.container_status(id, false).await;
                if status.is_ok_and(|s| s.state == ContainerState::Exited) {
                    return;
                }
            }
        })
        .await;
    }

    /// Pulls each image through CRI, each within `limit`.
    pub async fn pull(&self, images: &[String], limit: Duration) {
        for image in images {
            let request = PullRequest {
                image: image.clone(),
                ..Default::default()
            };
            crate::within(limit, "image pull", self.runtime.pull_image(request, limit))
                .await
                .unwrap_or_else(|e| panic!("pulling {image}: {e}"));
        }
    }

    /// The image step of a container's start: makes sure `image` is on the node, pulling it
    /// as `policy` says (within `limit`).
    pub async fn ensure_image(
        &self,
        image: &str,
        policy: PullPolicy,
        limit: Duration,
    ) -> Result<ImageStep, ImageError> {
        let pull_error = |e: &dyn std::fmt::Display| ImageError {
            reason: "ErrImagePull",
            message: format!("{image}: {e}"),
        };
        let present = self
            .runtime
            .image_status(image)
            .await
            .map_err(|e| pull_error(&e))?;
        if !should_pull(policy, image, present.is_some())? {
            let id = present.map(|i| i.id).unwrap_or_default();
            return Ok(ImageStep { id, pulled: false });
        }
        let request = PullRequest {
            image: image.into(),
            ..Default::default()
        };
        let id = self
            .runtime
            .pull_image(request, limit)
            .await
            .map_err(|e| pull_error(&e))?;
        Ok(ImageStep { id, pulled: true })
    }

    /// The pod's sandbox config, its log directory made.
    pub fn sandbox_config(&self, spec: &PodSpec) -> SandboxConfig {
        let (labels, annotations) = (&spec.labels, spec.annotations.clone());
        self.sandbox_config_for(spec.pod_ref(), spec.attempt, labels, annotations)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// The sandbox config of a pod of the API, its log directory made.
    pub fn sandbox_config_of(&self, pod: &Pod) -> Result<SandboxConfig, BoxError> {
        let m = &pod.metadata;
        let labels = m.labels.clone().unwrap_or_default();
        let annotations = m.annotations.clone().unwrap_or_default();
        self.sandbox_config_for(PodRef::of(pod), 0, &labels, annotations)
    }

    fn sandbox_config_for(
        &self,
        pod: PodRef<'_>,
        attempt: u32,
        labels: &kruised::cri::StringMap,
        annotations: kruised::cri::StringMap,
    ) -> Result<SandboxConfig, BoxError> {
        let (logs, cgroups) = (&self.log_root, &self.cgroup_root);
        let config = super::spec::sandbox_config(pod, attempt, labels, annotations, logs, cgroups);
        std::fs::create_dir_all(&config.log_directory)
            .map_err(|e| format!("creating the log directory {}: {e}", config.log_directory))?;
        Ok(config)
    }

    /// What the kubelet does for `CreateContainer`: the image step (the spec's image to the
    /// ID it passes to the runtime), the container's log directory (CRI-O's conmon needs it),
    /// then the create (not started). Returns its ID.
    pub async fn create_config(
        &self,
        sandbox_id: &str,
        mut config: ContainerConfig,
        policy: PullPolicy,
        sandbox: SandboxConfig,
    ) -> Result<String, BoxError> {
        let image = self
            .ensure_image(&config.image, policy, Duration::from_secs(300))
            .await?;
        config.user_specified_image = std::mem::replace(&mut config.image, image.id);
        let dir = std::path::Path::new(&sandbox.log_directory).join(&config.metadata.name);
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("creating the log directory {}: {e}", dir.display()))?;
        Ok(self
            .runtime
            .create_container(sandbox_id, config, sandbox)
            .await?)
    }

    /// Creates (without starting) container `c` with `attempt` in the sandbox of `pod`.
    pub async fn create(
        &self,
        pod: &PodSpec,
        sandbox_id: &str,
        c: &ContainerSpec,
        attempt: u32,
    ) -> String {
        self.create_config(
            sandbox_id,
            c.config(pod, attempt),
            c.policy(),
            self.sandbox_config(pod),
        )
        .await
        .unwrap_or_else(|e| panic!("create container {}: {e}", c.name))
    }

    /// Creates the sandbox of `spec` (no containers); returns its ID.
    pub async fn run_sandbox(&self, spec: &PodSpec) -> String {
        self.runtime
            .run_pod_sandbox(self.sandbox_config(spec))
            .await
            .unwrap_or_else(|e| panic!("run sandbox {}: {e}", spec.name))
    }

    /// What the kubelet does to start a container (kuberuntime_manager.go SyncPod: the kill of
    /// the old one first, when given with its grace period; then startContainer): the image
    /// step, the create, the start. Returns its ID.
    pub async fn start_config(
        &self,
        sandbox_id: &str,
        config: ContainerConfig,
        policy: PullPolicy,
        sandbox: SandboxConfig,
        kill: Option<(&str, Duration)>,
    ) -> Result<String, BoxError> {
        if let Some((old, grace)) = kill {
            self.kill(old, grace).await?;
        }
        let id = self
            .create_config(sandbox_id, config, policy, sandbox)
            .await?;
        self.runtime.start_container(&id).await?;
        Ok(id)
    }

    /// The kill of a container (kuberuntime_container.go killContainer): if it runs, its preStop
    /// exec hook (from its annotations) within `grace`, then the stop with the rest of it, at
    /// least 2 s (minimumGracePeriodInSeconds; only after a hook here: the tests' kills without
    /// one stay immediate).
    async fn kill(&self, id: &str, grace: Duration) -> Result<(), BoxError> {
        let status = self.runtime.container_status(id, false).await?;
        let hook = status
            .annotations
            .get(kruised::k8s::keys::KUBELET_PRESTOP_HANDLER);
        let hook = hook.and_then(|h| serde_json::from_str::<LifecycleHandler>(h).ok());
        let mut rest = grace;
        if let Some(cmd) = hook
            .and_then(|h| h.exec?.command)
            .filter(|_| !grace.is_zero() && status.state == ContainerState::Running)
        {
            let started = std::time::Instant::now();
            // a failed hook is only logged by the kubelet: the stop follows all the same
            let _ = self.runtime.exec_sync(id, cmd, grace).await;
            rest = grace
                .saturating_sub(started.elapsed())
                .max(Duration::from_secs(2));
        }
        Ok(self.runtime.stop_container(id, rest).await?)
    }

    /// Creates and starts container `c` with `attempt` in the sandbox of `pod`.
    pub async fn start(
        &self,
        pod: &PodSpec,
        sandbox_id: &str,
        c: &ContainerSpec,
        attempt: u32,
    ) -> String {
        self.recreate_in(pod, sandbox_id, c, attempt, None).await
    }

    /// [`Kubelet::start`], killing `kill` first.
    async fn recreate_in(
        &self,
        pod: &PodSpec,
        sandbox_id: &str,
        c: &ContainerSpec,
        attempt: u32,
        kill: Option<(&str, Duration)>,
    ) -> String {
        let (config, sandbox) = (c.config(pod, attempt), self.sandbox_config(pod));
        self.start_config(sandbox_id, config, c.policy(), sandbox, kill)
            .await
            .unwrap_or_else(|e| panic!("start container {}: {e}", c.name))
    }

    /// Creates the sandbox and starts every container, as the kubelet does for a new pod.
    pub async fn run_pod(&self, spec: PodSpec) -> RunningPod {
        let sandbox_id = self.run_sandbox(&spec).await;
        let mut pod = RunningPod {
            spec,
            sandbox_id,
            containers: BTreeMap::new(),
            attempts: BTreeMap::new(),
        };
        for c in pod.spec.containers.clone() {
            let id = self.start(&pod.spec, &pod.sandbox_id, &c, 0).await;
            pod.containers.insert(c.name.clone(), id);
            pod.attempts.insert(c.name, 0);
        }
        pod
    }

    /// Creates the container `name` again with attempt + 1, optionally with a new spec, as the
    /// kubelet does when it exited or its spec changed: kills the old one (with the pod's grace
    /// period; nothing when it already exited), the image step, then the start.
    pub async fn recreate(
        &self,
        pod: &mut RunningPod,
        name: &str,
        spec: Option<ContainerSpec>,
    ) -> String {
        let idx = pod.spec.containers.iter().position(|c| c.name == name);
        let idx = idx.unwrap_or_else(|| panic!("no container {name}"));
        if let Some(s) = spec {
            pod.spec.containers[idx] = s;
        }
        let grace = Duration::from_secs(pod.spec.termination_grace_seconds.try_into().unwrap_or(0));
        let attempt = pod.attempts.get(name).copied().unwrap_or(0) + 1;
        let c = &pod.spec.containers[idx];
        let kill = Some((pod.container(name), grace));
        let id = self
            .recreate_in(&pod.spec, &pod.sandbox_id, c, attempt, kill)
            .await;
        pod.containers.insert(name.into(), id.clone());
        pod.attempts.insert(name.into(), attempt);
        id
    }

    /// Stops and removes the pod's sandbox and containers.
    pub async fn remove_pod(&self, pod: &RunningPod) {
        for id in pod.containers.values() {
            let _ = self.runtime.stop_container(id, Duration::ZERO).await;
        }
        self.remove_sandbox(&pod.sandbox_id)
            .await
            .unwrap_or_else(|e| panic!("remove sandbox of {}: {e}", pod.spec.name));
    }

    /// Stops and removes a sandbox.
    pub async fn remove_sandbox(&self, id: &str) -> kruised::cri::Result<()> {
        self.runtime.stop_pod_sandbox(id).await?;
        self.runtime.remove_pod_sandbox(id).await
    }
}

/// The image step on the fake runtime: its images are its state's, a pull adds the image there
/// (the fake's `pulls` record only the daemon's, through CRI).
pub fn ensure_image_fake(
    cri: &FakeRuntime,
    image: &str,
    policy: PullPolicy,
) -> Result<ImageStep, ImageError> {
    let mut st = cri.state();
    let present = st.find_image(image).map(|i| i.id.clone());
    if should_pull(policy, image, present.is_some())? {
        return Ok(ImageStep {
            id: st.add_image(image),
            pulled: true,
        });
    }
    Ok(ImageStep {
        id: present.unwrap_or_default(),
        pulled: false,
    })
}

/// A host-network sandbox for `pod` in the fake runtime; returns its ID.
pub fn sandbox_fake(cri: &FakeRuntime, pod: &Pod) -> String {
    let r = PodRef::of(pod);
    let metadata = SandboxMetadata {
        name: r.name.into(),
        uid: r.uid.into(),
        namespace: r.namespace.into(),
        attempt: 0,
    };
    cri.add_sandbox(
        metadata,
        sandbox_labels(r, &pod.metadata.labels.clone().unwrap_or_default()),
        super::status::POD_IP,
    )
}

/// What the kubelet does on the fake runtime when container `c` exited or its spec changed:
/// kills the old one (`kill`: its ID and the exit code it dies with), the image step, then
/// starts it again from `pod` with `attempt`. Returns the new container's ID.
pub fn recreate_fake(
    cri: &FakeRuntime,
    pod: &Pod,
    sandbox: &str,
    c: &Container,
    kill: Option<(&str, i32)>,
    attempt: u32,
) -> Result<String, ImageError> {
    if let Some((old, code)) = kill {
        cri.exit_container(old, code);
    }
    ensure_image_fake(
        cri,
        c.image.as_deref().unwrap_or_default(),
        PullPolicy::of_container(c),
    )?;
    Ok(cri.add_container(sandbox, container_config(pod, c, attempt), true, true))
}
