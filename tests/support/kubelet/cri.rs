//! Creating sandboxes and containers as the kubelet does, and creating them again when they
//! exited or their spec changed (kuberuntime_manager.go SyncPod: kill, then start; and
//! kuberuntime_container.go startContainer: the image step, create, start), on a real CRI
//! runtime ([`Kubelet`], through CRI) or on the fake runtime of an in-process node
//! ([`FakeNode`], into its state).
//!
//! The image step is one step of its own ([`Kubelet::ensure_image`], [`ensure_image_fake`]),
//! as image_manager.go EnsureImageExists: `Always` pulls, `IfNotPresent` pulls when the image
//! is not on the node, `Never` fails with `ErrImageNeverPull` when it is not.
//!
//! [`FakeNode`]: crate::node::FakeNode

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::LifecycleHandler;
use kruised::cri::fake::FakeRuntime;
use kruised::cri::{
    ContainerState, ImageService, KubeletService, PullRequest, RemoteRuntime, RuntimeService,
    SandboxConfig,
};

use super::spec::{ContainerSpec, PodSpec, PullPolicy};

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
    /// The pod's grace period.
    pub fn grace(&self) -> Duration {
        Duration::from_secs(self.spec.termination_grace_seconds.try_into().unwrap_or(0))
    }

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
            let pull = self.ensure_image(image, PullPolicy::Always, limit);
            crate::within(limit, "image pull", pull)
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
        let pull_error = |e: kruised::cri::CriError| ImageError {
            reason: "ErrImagePull",
            message: format!("{image}: {e}"),
        };
        let present = self.runtime.image_status(image).await.map_err(pull_error)?;
        let pulled = should_pull(policy, image, present.is_some())?;
        let id = match present {
            Some(i) if !pulled => i.id,
            _ => {
                let request = PullRequest {
                    image: image.into(),
                    ..Default::default()
                };
                let pull = self.runtime.pull_image(request, limit);
                pull.await.map_err(pull_error)?
            }
        };
        Ok(ImageStep { id, pulled })
    }

    /// The pod's sandbox config, its log directory made.
    fn sandbox_config(&self, pod: &PodSpec) -> Result<SandboxConfig, BoxError> {
        let dir = format!("{}_{}_{}", pod.namespace, pod.name, pod.uid);
        let config = SandboxConfig {
            log_directory: self.log_root.join(dir).display().to_string(),
            cgroup_parent: format!("{}/pod{}", self.cgroup_root, pod.uid),
            ..pod.sandbox_config()
        };
        std::fs::create_dir_all(&config.log_directory)
            .map_err(|e| format!("creating the log directory {}: {e}", config.log_directory))?;
        Ok(config)
    }

    /// What the kubelet does for `CreateContainer` of `c` with `attempt` in the sandbox of
    /// `pod`: the image step (the spec's image to the ID it passes to the runtime), the
    /// container's log directory (CRI-O's conmon needs it), then the create (not started).
    /// Returns its ID.
    pub async fn try_create(
        &self,
        pod: &PodSpec,
        sandbox_id: &str,
        c: &ContainerSpec,
        attempt: u32,
    ) -> Result<String, BoxError> {
        let (mut config, sandbox) = (c.config(pod, attempt), self.sandbox_config(pod)?);
        let image = self
            .ensure_image(&config.image, c.policy(), Duration::from_secs(300))
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

    /// [`Kubelet::try_create`], failing the test on an error.
    pub async fn create(
        &self,
        pod: &PodSpec,
        sandbox_id: &str,
        c: &ContainerSpec,
        attempt: u32,
    ) -> String {
        self.try_create(pod, sandbox_id, c, attempt)
            .await
            .unwrap_or_else(|e| panic!("create container {}: {e}", c.name))
    }

    /// Creates the sandbox of `spec` (no containers); returns its ID.
    pub async fn run_sandbox(&self, spec: &PodSpec) -> String {
        self.try_run_sandbox(spec)
            .await
            .unwrap_or_else(|e| panic!("run sandbox {}: {e}", spec.name))
    }

    async fn try_run_sandbox(&self, spec: &PodSpec) -> Result<String, BoxError> {
        Ok(self
            .runtime
            .run_pod_sandbox(self.sandbox_config(spec)?)
            .await?)
    }

    /// What the kubelet does to start container `c` of `pod` with `attempt` (kuberuntime_manager.go
    /// SyncPod: the kill of the old one first, when given with its grace period; then
    /// startContainer): the image step, the create, the start. Returns its ID.
    pub async fn try_start(
        &self,
        pod: &PodSpec,
        sandbox_id: &str,
        c: &ContainerSpec,
        attempt: u32,
        kill: Option<(&str, Duration)>,
    ) -> Result<String, BoxError> {
        if let Some((old, grace)) = kill {
            self.kill(old, grace).await?;
        }
        let id = self.try_create(pod, sandbox_id, c, attempt).await?;
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
        self.try_start(pod, sandbox_id, c, attempt, None)
            .await
            .unwrap_or_else(|e| panic!("start container {}: {e}", c.name))
    }

    /// Creates the sandbox and starts every container, as the kubelet does for a new pod.
    pub async fn run_pod(&self, spec: PodSpec) -> RunningPod {
        let name = spec.name.clone();
        self.try_run_pod(spec)
            .await
            .unwrap_or_else(|e| panic!("run pod {name}: {e}"))
    }

    /// [`Kubelet::run_pod`]; on a failure, removes what it made.
    pub async fn try_run_pod(&self, spec: PodSpec) -> Result<RunningPod, BoxError> {
        let mut pod = RunningPod {
            sandbox_id: self.try_run_sandbox(&spec).await?,
            spec,
            containers: BTreeMap::new(),
            attempts: BTreeMap::new(),
        };
        for c in &pod.spec.containers {
            match self.try_start(&pod.spec, &pod.sandbox_id, c, 0, None).await {
                Ok(id) => pod.containers.insert(c.name.clone(), id),
                Err(e) => {
                    let _ = self.try_remove_pod(&pod, Duration::ZERO).await;
                    return Err(format!("container {}: {e}", c.name).into());
                }
            };
            pod.attempts.insert(c.name.clone(), 0);
        }
        Ok(pod)
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
        if let Some(s) = spec {
            let idx = pod.spec.containers.iter().position(|c| c.name == name);
            pod.spec.containers[idx.unwrap_or_else(|| panic!("no container {name}"))] = s;
        }
        self.try_recreate(pod, name, true)
            .await
            .unwrap_or_else(|e| panic!("start container {name}: {e}"))
    }

    /// Creates the container `name` again with attempt + 1 from the pod's spec, killing the
    /// old one first (`kill`) with the pod's grace period. Returns its ID.
    pub async fn try_recreate(
        &self,
        pod: &mut RunningPod,
        name: &str,
        kill: bool,
    ) -> Result<String, BoxError> {
        let c = pod.spec.containers.iter().find(|c| c.name == name);
        let c = c.ok_or_else(|| format!("no container {name} in pod {}", pod.spec.name))?;
        let attempt = pod.attempts.get(name).copied().unwrap_or(0) + 1;
        let kill = kill.then(|| (pod.container(name), pod.grace()));
        let id = self
            .try_start(&pod.spec, &pod.sandbox_id, c, attempt, kill)
            .await?;
        pod.containers.insert(name.into(), id.clone());
        pod.attempts.insert(name.into(), attempt);
        Ok(id)
    }

    /// Stops and removes the pod's sandbox and containers.
    pub async fn remove_pod(&self, pod: &RunningPod) {
        self.try_remove_pod(pod, Duration::ZERO)
            .await
            .unwrap_or_else(|e| panic!("remove sandbox of {}: {e}", pod.spec.name));
    }

    /// Stops the pod's containers with `grace` (one that fails to stop is gone already), then
    /// stops and removes its sandbox.
    pub async fn try_remove_pod(
        &self,
        pod: &RunningPod,
        grace: Duration,
    ) -> kruised::cri::Result<()> {
        for id in pod.containers.values() {
            let _ = self.runtime.stop_container(id, grace).await;
        }
        self.runtime.stop_pod_sandbox(&pod.sandbox_id).await?;
        self.runtime.remove_pod_sandbox(&pod.sandbox_id).await
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
    let pulled = should_pull(policy, image, present.is_some())?;
    let id = match present {
        Some(id) if !pulled => id,
        _ => st.add_image(image),
    };
    Ok(ImageStep { id, pulled })
}
