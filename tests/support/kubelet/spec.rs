//! The pod and containers as the kubelet creates them ([`PodSpec`], [`ContainerSpec`]: taken
//! from a pod of the API, or written out by the end-to-end tests without one), and what it
//! passes to CRI for them: the sandbox's and containers' configs with the kubelet's labels and
//! annotations (kuberuntime_labels.go, kuberuntime_container.go generateContainerConfig and
//! newContainerAnnotations), the kubelet hash of a container's spec (`kruised::hash::kubelet`),
//! its image pull policy.

use k8s_openapi::api::core::v1::{Container, EnvVar, Pod};
use kruised::controller::imagepull::reference::{DEFAULT_TAG, Reference};
use kruised::cri::{ContainerConfig, ContainerMetadata, SandboxConfig, SandboxMetadata, StringMap};
use kruised::hash::env::env_meta_ref;
use kruised::hash::kubelet::{format_hash, hash_container};
use kruised::k8s::keys;

/// The kubelet hash of a container's spec, lowercase hex.
pub fn hash(c: &Container) -> String {
    format_hash(hash_container(c))
}

/// The container `name` of the pod's spec.
pub fn container<'a>(pod: &'a Pod, name: &str) -> &'a Container {
    pod.spec
        .iter()
        .flat_map(|s| &s.containers)
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no container {name} in the pod's spec"))
}

/// The env the kubelet gives `c` of `pod` when it creates the container (kubelet_pods.go
/// makeEnvironmentVariables): plain values, and `fieldRef`s to the pod's labels, annotations,
/// name, namespace, uid, node name and IPs, read from the pod as it is at that moment. A missing
/// label or annotation gives an empty value, as in the kubelet.
fn env(pod: &Pod, c: &Container) -> Vec<(String, String)> {
    let value = |e: &EnvVar| {
        let meta = &pod.metadata;
        if let Some(r) = env_meta_ref(e) {
            let labels = meta.labels.clone().unwrap_or_default();
            let annotations = meta.annotations.clone().unwrap_or_default();
            return r.resolve(&labels, &annotations).to_string();
        }
        let field = e.value_from.as_ref().and_then(|v| v.field_ref.as_ref());
        match field.map(|f| f.field_path.as_str()) {
            Some("metadata.name") => meta.name.clone().unwrap_or_default(),
            Some("metadata.namespace") => meta.namespace.clone().unwrap_or_default(),
            Some("metadata.uid") => meta.uid.clone().unwrap_or_default(),
            Some("spec.nodeName") => pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .unwrap_or_default(),
            // host network: the pod's IPs are the node's
            Some("status.hostIP" | "status.podIP") => super::status::POD_IP.into(),
            _ => e.value.clone().unwrap_or_default(),
        }
    };
    let env = c.env.iter().flatten();
    env.map(|e| (e.name.clone(), value(e))).collect()
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
    /// (core/v1 defaults.go: `Always` for the tag `latest`, or neither tag nor digest; else
    /// `IfNotPresent`, an image name that does not parse included).
    pub fn of(policy: Option<&str>, image: &str) -> Self {
        let latest = |r: Reference| r.tag.map_or(r.digest.is_none(), |t| t == DEFAULT_TAG);
        match policy {
            Some("Always") => PullPolicy::Always,
            Some("Never") => PullPolicy::Never,
            Some("IfNotPresent") => PullPolicy::IfNotPresent,
            _ if Reference::parse(image).is_ok_and(latest) => PullPolicy::Always,
            _ => PullPolicy::IfNotPresent,
        }
    }
}

/// The config the kubelet passes to `CreateContainer` for `c` of `pod` with `attempt`.
pub fn container_config(pod: &Pod, c: &Container, attempt: u32) -> ContainerConfig {
    ContainerSpec::of(pod, c).config(&PodSpec::of(pod), attempt)
}

/// A container as the kubelet creates it.
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
    /// Arguments.
    pub args: Vec<String>,
    /// Environment.
    pub env: Vec<(String, String)>,
    /// The kubelet hash to record (lowercase hex), as the kubelet computes it from the spec.
    pub hash: String,
    /// The preStop handler JSON to record, if any.
    pub pre_stop: Option<String>,
    /// The ports JSON to record, if any.
    pub ports: Option<String>,
    /// Labels beyond the kubelet's own (a real kubelet adds none).
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

    /// Container `c` of `pod` as the kubelet creates it now: the env resolved from the pod as
    /// it is, the hash of its spec, its preStop handler and ports.
    pub fn of(pod: &Pod, c: &Container) -> Self {
        let json = |v: Option<String>| v.filter(|s| s != "[]");
        let pre_stop = c.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref());
        ContainerSpec {
            name: c.name.clone(),
            image: c.image.clone().unwrap_or_default(),
            pull_policy: c.image_pull_policy.clone(),
            command: c.command.clone().unwrap_or_default(),
            args: c.args.clone().unwrap_or_default(),
            env: env(pod, c),
            hash: hash(c),
            pre_stop: json(pre_stop.and_then(|h| serde_json::to_string(h).ok())),
            ports: json(c.ports.as_ref().and_then(|p| serde_json::to_string(p).ok())),
            labels: StringMap::new(),
        }
    }

    /// Container `name` of `pod` as [`ContainerSpec::of`] has it, its image, pull policy, env
    /// and hash, run as a sleeper.
    pub fn of_pod(pod: &Pod, name: &str) -> Self {
        let c = Self::of(pod, container(pod, name));
        ContainerSpec {
            pull_policy: c.pull_policy,
            env: c.env,
            hash: c.hash,
            ..Self::sleeper(name, &c.image)
        }
    }

    /// Its pull policy.
    pub fn policy(&self) -> PullPolicy {
        PullPolicy::of(self.pull_policy.as_deref(), &self.image)
    }

    /// Its config for `CreateContainer` in `pod` with `attempt`, the image as the spec names it:
    /// the kubelet's labels, and its annotations: the hash, the restart count (the attempt),
    /// the pod's grace period, the default termination message settings, the preStop handler
    /// and ports if it has them.
    pub fn config(&self, pod: &PodSpec, attempt: u32) -> ContainerConfig {
        let mut labels = pod.identity(&self.labels);
        labels.insert(keys::KUBELET_CONTAINER_NAME.into(), self.name.clone());
        let grace = pod.termination_grace_seconds.to_string();
        let annotations = [
            (keys::KUBELET_CONTAINER_HASH, Some(self.hash.clone())),
            (
                keys::KUBELET_CONTAINER_RESTART_COUNT,
                Some(attempt.to_string()),
            ),
            (
                keys::KUBELET_TERMINATION_MESSAGE_PATH,
                Some("/dev/termination-log".into()),
            ),
            (
                keys::KUBELET_TERMINATION_MESSAGE_POLICY,
                Some("File".into()),
            ),
            (keys::KUBELET_POD_TERMINATION_GRACE, Some(grace)),
            (keys::KUBELET_CONTAINER_TYPE, Some("container".into())),
            (keys::KUBELET_PRESTOP_HANDLER, self.pre_stop.clone()),
            (keys::KUBELET_CONTAINER_PORTS, self.ports.clone()),
        ];
        ContainerConfig {
            metadata: ContainerMetadata {
                name: self.name.clone(),
                attempt,
            },
            image: self.image.clone(),
            command: self.command.clone(),
            args: self.args.clone(),
            envs: self.env.clone(),
            labels,
            annotations: annotations
                .into_iter()
                .filter_map(|(k, v)| Some((k.to_string(), v?)))
                .collect(),
            log_path: format!("{}/{attempt}.log", self.name),
            ..Default::default()
        }
    }
}

/// A pod as the kubelet creates it on the node.
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

    /// `pod` of the API as the kubelet creates it now (namespace `default` when it has none,
    /// grace period 30 s unless set), its containers as [`ContainerSpec::of`] has them.
    pub fn of(pod: &Pod) -> Self {
        let m = &pod.metadata;
        let spec = pod.spec.as_ref();
        PodSpec {
            name: m.name.clone().unwrap_or_default(),
            namespace: m.namespace.clone().unwrap_or_else(|| "default".into()),
            uid: m.uid.clone().unwrap_or_default(),
            labels: m.labels.clone().unwrap_or_default(),
            annotations: m.annotations.clone().unwrap_or_default(),
            attempt: 0,
            termination_grace_seconds: spec
                .and_then(|s| s.termination_grace_period_seconds)
                .unwrap_or(30),
            containers: spec
                .iter()
                .flat_map(|s| &s.containers)
                .map(|c| ContainerSpec::of(pod, c))
                .collect(),
        }
    }

    /// `labels`, then the kubelet's labels of the pod's identity.
    fn identity(&self, labels: &StringMap) -> StringMap {
        let mut labels = labels.clone();
        labels.insert(keys::KUBELET_POD_NAME.into(), self.name.clone());
        labels.insert(keys::KUBELET_POD_NAMESPACE.into(), self.namespace.clone());
        labels.insert(keys::KUBELET_POD_UID.into(), self.uid.clone());
        labels
    }

    /// Its host-network sandbox config, without the log directory and cgroup parent (the
    /// node's): its identity, its labels then the kubelet's, its annotations.
    pub fn sandbox_config(&self) -> SandboxConfig {
        let mut labels = self.identity(&self.labels);
        labels.insert(keys::KUBELET_CONTAINER_TYPE.into(), "podsandbox".into());
        SandboxConfig {
            metadata: SandboxMetadata {
                name: self.name.clone(),
                uid: self.uid.clone(),
                namespace: self.namespace.clone(),
                attempt: self.attempt,
            },
            // host network: the node's hostname (no UTS namespace of its own)
            hostname: String::new(),
            labels,
            annotations: self.annotations.clone(),
            ..Default::default()
        }
    }
}
