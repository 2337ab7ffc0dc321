//! A whole fake node for integration tests and benchmarks: the API-server double as control
//! plane, the fake CRI runtime as containerd (or, with [`FakeNode::start_on`], as the runtime a
//! [`Dialect`] names), and this module as the kubelet that keeps the two
//! consistent (pods in the API with container statuses, containers in the runtime with the
//! kubelet's labels, annotations, hash and env resolved from the pod's metadata).

use std::collections::BTreeMap;
use std::path::PathBuf;

use apiserver_double::{ApiServer, Handle};
use k8s_openapi::api::core::v1::{Container as SpecContainer, Pod};
use kruised::cri::fake::{Dialect, FakeRuntime};
use kruised::cri::{ContainerConfig, ContainerMetadata, SandboxMetadata, StringMap};
use kruised::hash::env::{MetaRef, env_meta_refs};
use kruised::hash::kubelet::{format_hash, hash_container};
use kruised::k8s::keys;

use super::kubelet_meta::{PodRef, container_annotations, container_labels};
use serde_json::{Value, json};

/// The node's name in these tests.
pub const NODE: &str = "node-a";

/// Control plane, runtime and kubelet of one fake node.
pub struct FakeNode {
    /// The API-server double.
    pub api: Handle,
    /// The fake runtime (named `containerd`, or as its dialect's runtime names itself).
    pub cri: FakeRuntime,
    /// Where the kubeconfig and socket live.
    pub dir: tempfile::TempDir,
    /// Sandbox ID per pod name.
    pub sandboxes: BTreeMap<String, String>,
}

impl FakeNode {
    /// The IDs of every container the runtime was asked to stop so far, in order.
    pub fn stopped_ids(&self) -> Vec<String> {
        self.cri
            .state()
            .stops
            .iter()
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Starts both halves, the runtime the plain fake named `containerd`
    /// ([`Dialect::Plain`]).
    pub async fn start() -> FakeNode {
        Self::start_with(None).await
    }

    /// Like [`FakeNode::start`], the API-server double with `config` (its address ignored: a
    /// free port on loopback).
    pub async fn start_with_api(config: apiserver_double::Config) -> FakeNode {
        Self::start_on_api(None, config).await
    }

    /// Starts both halves, the runtime answering as `dialect`: its name in `Version` and so the
    /// kubelet's container IDs (`cri-o://…` on CRI-O), its image fields and its events.
    pub async fn start_on(dialect: Dialect) -> FakeNode {
        Self::start_with(Some(dialect)).await
    }

    async fn start_with(dialect: Option<Dialect>) -> FakeNode {
        Self::start_on_api(dialect, apiserver_double::Config::default()).await
    }

    async fn start_on_api(dialect: Option<Dialect>, config: apiserver_double::Config) -> FakeNode {
        let dir = tempfile::tempdir().expect("tempdir");
        let api = ApiServer::start_with(apiserver_double::Config {
            addr: "127.0.0.1:0".parse().expect("addr"),
            ..config
        })
        .await
        .expect("start the API double");
        api.write_kubeconfig(dir.path().join("kubeconfig"))
            .expect("kubeconfig");
        let socket = dir.path().join("cri.sock");
        let cri = match dialect {
            Some(d) => FakeRuntime::start_as(&socket, d).await,
            None => FakeRuntime::start(&socket, "containerd").await,
        }
        .expect("start the fake runtime");
        FakeNode {
            api,
            cri,
            dir,
            sandboxes: BTreeMap::new(),
        }
    }

    /// The kubeconfig file.
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("kubeconfig")
    }

    /// `unix://` endpoint of the fake runtime.
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.dir.path().join("cri.sock").display())
    }

    /// Arguments for `kruised run` against this node.
    pub fn daemon_args(&self) -> Vec<String> {
        super::daemon_args(&self.kubeconfig(), &self.endpoint())
    }

    /// Creates a kruise-managed pod (owned by a CloneSet) running `containers`, with
    /// `annotations`, and `InPlaceUpdateReady` set to `ready`.
    pub fn add_pod(
        &mut self,
        name: &str,
        containers: Value,
        annotations: Value,
        ready: bool,
    ) -> Pod {
        let owners = json!([{"apiVersion": "apps.kruise.io/v1alpha1", "kind": "CloneSet",
                             "name": "demo", "uid": "cs-1", "controller": true}]);
        self.add_owned_pod(name, containers, annotations, ready, owners)
    }

    /// Like [`FakeNode::add_pod`], with the given owner references (`[]`: a bare pod).
    pub fn add_owned_pod(
        &mut self,
        name: &str,
        containers: Value,
        annotations: Value,
        ready: bool,
        owners: Value,
    ) -> Pod {
        // the API server assigns the uid: create the pod first, then its containers
        let created = self
            .api
            .create(
                "pods",
                json!({
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {
                        "name": name, "namespace": "default",
                        "labels": {"app": "demo"},
                        "annotations": annotations,
                        "ownerReferences": owners
                    },
                    "spec": {"nodeName": NODE, "containers": containers},
                    "status": {"phase": "Pending"}
                }),
            )
            .expect("create pod");
        let pod: Pod = serde_json::from_value(created).expect("pod");
        let uid = pod.metadata.uid.clone().expect("uid");
        let sandbox = self.cri.add_sandbox(
            SandboxMetadata {
                name: name.into(),
                uid,
                namespace: "default".into(),
                attempt: 0,
            },
            StringMap::new(),
            "127.0.0.1",
        );
        self.sandboxes.insert(name.into(), sandbox.clone());
        let mut statuses = Vec::new();
        for c in &pod.spec.as_ref().expect("spec").containers {
            let id = self.start_container(&pod, &sandbox, c, 0, true, true);
            statuses.push(self.status(&c.name, &id, 0));
        }
        let updated = self
            .api
            .modify("pods", "default", name, |p| {
                p["status"] = json!({
                    "phase": "Running",
                    "conditions": [{"type": keys::INPLACE_UPDATE_READY,
                                    "status": if ready { "True" } else { "False" }}],
                    "containerStatuses": statuses,
                });
            })
            .expect("pod status");
        serde_json::from_value(updated).expect("pod")
    }

    /// Starts a container the way the kubelet does ([`start_container`]) in the pod's sandbox.
    pub fn start_container(
        &self,
        pod: &Pod,
        sandbox: &str,
        c: &SpecContainer,
        attempt: u32,
        env_in_info: bool,
        has_env_binary: bool,
    ) -> String {
        let pod_ref = PodRef {
            name: pod.metadata.name.as_deref().unwrap_or_default(),
            namespace: "default",
            uid: pod.metadata.uid.as_deref().unwrap_or_default(),
        };
        start_container(
            &self.cri,
            pod_ref,
            pod,
            sandbox,
            c,
            attempt,
            env_in_info,
            has_env_binary,
        )
    }

    /// What the kubelet does after a container exited, or when its spec hash changed: creates
    /// it again (attempt + 1) from the pod's current spec and metadata, and reports the new
    /// container in the pod's status. Returns the new container ID.
    pub fn recreate(&self, pod_name: &str, container: &str) -> String {
        let (id, attempt) = self.recreate_unreported(pod_name, container);
        self.api
            .modify("pods", "default", pod_name, |p| {
                for s in p["status"]["containerStatuses"]
                    .as_array_mut()
                    .into_iter()
                    .flatten()
                {
                    if s["name"] == container {
                        *s = self.status(container, &id, attempt);
                    }
                }
            })
            .expect("update pod status");
        id
    }

    /// The runtime's part of [`FakeNode::recreate`] alone, as it is before the kubelet
    /// reports it: the old container exits and a new one runs, the pod's status is as before.
    /// Returns the new container's ID and attempt.
    pub fn recreate_unreported(&self, pod_name: &str, container: &str) -> (String, u32) {
        let obj = self
            .api
            .get("pods", "default", pod_name)
            .expect("pod exists");
        let pod: Pod = serde_json::from_value(obj).expect("pod");
        let spec = pod
            .spec
            .as_ref()
            .expect("spec")
            .containers
            .iter()
            .find(|c| c.name == container)
            .expect("container in spec")
            .clone();
        let statuses = pod
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.clone())
            .unwrap_or_default();
        let old = statuses
            .iter()
            .find(|s| s.name == container)
            .expect("status");
        let attempt = u32::try_from(old.restart_count + 1).expect("restart count");
        let prefix = self.cri.kubelet_id("");
        if let Some(old_id) = old
            .container_id
            .as_deref()
            .and_then(|i| i.strip_prefix(prefix.as_str()))
        {
            self.cri.exit_container(old_id, 0);
        }
        let sandbox = &self.sandboxes[pod_name];
        let id = self.start_container(&pod, sandbox, &spec, attempt, true, true);
        (id, attempt)
    }

    /// The kubelet's container ID of `id` on this node's runtime: `<runtime name>://<id>`.
    pub fn kubelet_id(&self, id: &str) -> String {
        self.cri.kubelet_id(id)
    }

    /// A container's status as the kubelet reports it.
    fn status(&self, name: &str, id: &str, restarts: u32) -> Value {
        json!({"name": name, "containerID": self.kubelet_id(id), "image": "busybox",
               "imageID": "sha256:1", "ready": true, "restartCount": restarts, "started": true,
               "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}})
    }

    /// The pod's current `runtime-containers-meta`, parsed.
    pub fn meta(&self, pod: &str) -> Option<keys::RuntimeContainerMetaSet> {
        meta_of(&self.api.get("pods", "default", pod)?)
    }

    /// Waits until the pod's annotation satisfies `cond` (the store is locked while `cond` runs:
    /// do not call back into the API double from it).
    pub async fn wait_meta(
        &self,
        pod: &str,
        limit: std::time::Duration,
        mut cond: impl FnMut(&keys::RuntimeContainerMetaSet) -> bool,
    ) -> Option<keys::RuntimeContainerMetaSet> {
        self.api
            .wait_for_value(limit, |view| {
                view.get("pods", "default", pod)
                    .and_then(|o| meta_of(&o))
                    .filter(|m| cond(m))
            })
            .await
            .ok()
    }
}

/// Starts a container in `sandbox` of `cri` the way the kubelet does: its labels, the kubelet
/// hash of its spec, restart count and grace period, and its env with `valueFrom` resolved from
/// the pod's metadata now. `env_in_info` and `has_env_binary` say how the runtime exposes that
/// env. Returns its ID.
#[allow(
    clippy::too_many_arguments,
    reason = "the container's parts, each named"
)]
pub fn start_container(
    cri: &FakeRuntime,
    pod_ref: PodRef<'_>,
    pod: &Pod,
    sandbox: &str,
    c: &SpecContainer,
    attempt: u32,
    env_in_info: bool,
    has_env_binary: bool,
) -> String {
    let labels = container_labels(pod_ref, &c.name, &StringMap::new());
    // what the kubelet records on the container: its hash, attempt and the pod's grace, its
    // preStop hook and ports as JSON (kuberuntime_container.go newContainerAnnotations)
    let pre_stop = c
        .lifecycle
        .as_ref()
        .and_then(|l| l.pre_stop.as_ref())
        .and_then(|h| serde_json::to_string(h).ok());
    let grace = pod
        .spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .unwrap_or(30);
    let mut annotations = container_annotations(
        &format_hash(hash_container(c)),
        attempt,
        grace,
        pre_stop.as_deref(),
    );
    if let Some(ports) = c.ports.as_ref().filter(|p| !p.is_empty())
        && let Ok(json) = serde_json::to_string(ports)
    {
        annotations.insert(keys::KUBELET_CONTAINER_PORTS.into(), json);
    }
    cri.add_container(
        sandbox,
        ContainerConfig {
            metadata: ContainerMetadata {
                name: c.name.clone(),
                attempt,
            },
            image: c.image.clone().unwrap_or_default(),
            envs: resolve_env(pod, c),
            labels,
            annotations,
            ..Default::default()
        },
        env_in_info,
        has_env_binary,
    )
}

/// The `runtime-containers-meta` of a pod object, parsed.
pub fn meta_of(obj: &Value) -> Option<keys::RuntimeContainerMetaSet> {
    let annotations: BTreeMap<String, String> =
        serde_json::from_value(obj["metadata"]["annotations"].clone()).unwrap_or_default();
    keys::parse_runtime_containers_meta(&annotations)
        .ok()
        .flatten()
}

/// The env the kubelet would give `c`: plain values, and `fieldRef`s to the pod's labels and
/// annotations resolved now.
pub fn resolve_env(pod: &Pod, c: &SpecContainer) -> Vec<(String, String)> {
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    let refs: BTreeMap<String, MetaRef> = env_meta_refs(c).into_iter().collect();
    c.env
        .iter()
        .flatten()
        .map(|e| {
            let value = match refs.get(&e.name) {
                Some(MetaRef::Label(k)) => labels.get(k).cloned().unwrap_or_default(),
                Some(MetaRef::Annotation(k)) => annotations.get(k).cloned().unwrap_or_default(),
                None => e.value.clone().unwrap_or_default(),
            };
            (e.name.clone(), value)
        })
        .collect()
}
