//! A whole fake node for integration tests and benchmarks: the API-server double as control
//! plane, the fake CRI runtime as containerd (or, with [`FakeNode::start_on`], as the runtime a
//! [`Dialect`] names), and the kubelet ([`crate::kubelet`]) keeping the two consistent (pods in
//! the API with container statuses, containers in the runtime with the kubelet's labels,
//! annotations, hash and env resolved from the pod's metadata).

use std::collections::BTreeMap;
use std::path::PathBuf;

use apiserver_double::{ApiServer, Handle};
use k8s_openapi::api::core::v1::{Container as SpecContainer, Pod};
use kruised::cri::fake::{Dialect, FakeRuntime};
use kruised::k8s::keys;
use serde_json::{Value, json};

use crate::kubelet::cri::{ImageError, ensure_image_fake};
use crate::kubelet::spec::{self, ContainerSpec, PodSpec, container_config};
use crate::kubelet::status::{self, Report};
use crate::wait;

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
        Self::start_on_api(Dialect::Plain, apiserver_double::Config::default()).await
    }

    /// Like [`FakeNode::start`], the API-server double with `config` (its address ignored: a
    /// free port on loopback).
    pub async fn start_with_api(config: apiserver_double::Config) -> FakeNode {
        Self::start_on_api(Dialect::Plain, config).await
    }

    /// Starts both halves, the runtime answering as `dialect`: its name in `Version` and so the
    /// kubelet's container IDs (`cri-o://…` on CRI-O), its image fields and its events.
    pub async fn start_on(dialect: Dialect) -> FakeNode {
        Self::start_on_api(dialect, apiserver_double::Config::default()).await
    }

    async fn start_on_api(dialect: Dialect, config: apiserver_double::Config) -> FakeNode {
        let dir = tempfile::tempdir().expect("tempdir");
        let api = ApiServer::start_with(apiserver_double::Config {
            addr: "127.0.0.1:0".parse().expect("addr"),
            ..config
        })
        .await
        .expect("start the API double");
        api.write_kubeconfig(dir.path().join("kubeconfig"))
            .expect("kubeconfig");
        let cri = FakeRuntime::start_as(&dir.path().join("cri.sock"), dialect)
            .await
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
        let config = PodSpec::of(&pod).sandbox_config();
        let sandbox = self
            .cri
            .add_sandbox(config.metadata, config.labels, status::POD_IP);
        self.sandboxes.insert(name.into(), sandbox.clone());
        let reports: Vec<Report> = pod
            .spec
            .iter()
            .flat_map(|s| &s.containers)
            .map(|c| {
                let id = self.start_container(&pod, &sandbox, c, 0, true, true);
                self.report(c, &id, 0)
            })
            .collect();
        let updated = self
            .api
            .modify("pods", "default", name, |p| {
                status::set_containers(p, &reports);
                p["status"]["phase"] = json!("Running");
                p["status"]["conditions"] = json!([{"type": keys::INPLACE_UPDATE_READY,
                                                     "status": if ready { "True" } else { "False" }}]);
            })
            .expect("pod status");
        serde_json::from_value(updated).expect("pod")
    }

    /// Starts a container the way the kubelet does ([`container_config`]) in the pod's sandbox;
    /// `env_in_info` and `has_env_binary` say how the runtime exposes its env.
    pub fn start_container(
        &self,
        pod: &Pod,
        sandbox: &str,
        c: &SpecContainer,
        attempt: u32,
        env_in_info: bool,
        has_env_binary: bool,
    ) -> String {
        let config = container_config(pod, c, attempt);
        self.cri
            .add_container(sandbox, config, env_in_info, has_env_binary)
    }

    /// What the kubelet does after a container exited, or when its spec hash changed: creates
    /// it again (attempt + 1) from the pod's current spec and metadata, and reports the new
    /// container in the pod's status. Returns the new container ID.
    pub fn recreate(&self, pod_name: &str, container: &str) -> String {
        let (id, attempt) = self.recreate_unreported(pod_name, container);
        let pod = self.api.get("pods", "default", pod_name).expect("pod");
        let pod: Pod = serde_json::from_value(pod).expect("pod");
        let report = self
            .report(spec::container(&pod, container), &id, attempt)
            .json();
        self.api
            .modify("pods", "default", pod_name, |p| {
                status::update_container(p, container, |s| *s = report)
            })
            .expect("update pod status");
        id
    }

    /// The runtime's part of [`FakeNode::recreate`] alone, as it is before the kubelet
    /// reports it: the old container exits (0), the image step, and a new one runs; the pod's
    /// status is as before.
    /// Returns the new container's ID and attempt.
    pub fn recreate_unreported(&self, pod_name: &str, container: &str) -> (String, u32) {
        let obj = self.api.get("pods", "default", pod_name).expect("pod");
        let pod: Pod = serde_json::from_value(obj.clone()).expect("pod");
        let reported = status::container(&obj, container).expect("status");
        let c = spec::container(&pod, container);
        self.recreate_reported(&pod, c, reported, Some(0))
            .unwrap_or_else(|e| panic!("recreating {container}: {e}"))
    }

    /// What the kubelet does for container `c` of `pod` whose status reports `reported`, when
    /// it exited or its spec changed: the old one exits with `kill` (if given), the image step,
    /// then a new one (restartCount + 1) runs, from `pod`. Returns its ID and attempt.
    pub fn recreate_reported(
        &self,
        pod: &Pod,
        c: &SpecContainer,
        reported: &Value,
        kill: Option<i32>,
    ) -> Result<(String, u32), ImageError> {
        let restarts = reported["restartCount"].as_i64().unwrap_or(0);
        let attempt = u32::try_from(restarts + 1).expect("restart count");
        if let Some(code) = kill {
            self.cri.exit_container(&self.runtime_id(reported), code);
        }
        let spec = ContainerSpec::of(pod, c);
        ensure_image_fake(&self.cri, &spec.image, spec.policy())?;
        let sandbox = &self.sandboxes[pod.metadata.name.as_deref().unwrap_or_default()];
        let id = self.start_container(pod, sandbox, c, attempt, true, true);
        Ok((id, attempt))
    }

    /// The runtime's ID of a reported container (its `containerID` without the runtime's
    /// prefix).
    pub fn runtime_id(&self, reported: &Value) -> String {
        let id = reported["containerID"].as_str().unwrap_or_default();
        let prefix = self.cri.kubelet_id("");
        id.strip_prefix(prefix.as_str()).unwrap_or(id).to_string()
    }

    /// The kubelet's container ID of `id` on this node's runtime: `<runtime name>://<id>`.
    pub fn kubelet_id(&self, id: &str) -> String {
        self.cri.kubelet_id(id)
    }

    /// A running container as the kubelet reports it, its image ID and start from the runtime.
    fn report(&self, c: &SpecContainer, id: &str, restarts: u32) -> Report {
        let st = self.cri.state();
        let rc = st.containers.get(id).expect("the container just started");
        Report {
            image: c.image.clone().unwrap_or_default(),
            image_id: rc.image.id.clone(),
            running: Some(status::rfc3339_ns(rc.status.started_at)),
            ..Report::ready(&c.name, &self.kubelet_id(id), restarts)
        }
    }

    /// The pod's current `runtime-containers-meta`, parsed.
    pub fn meta(&self, pod: &str) -> Option<keys::RuntimeContainerMetaSet> {
        wait::meta_of(&self.api.get("pods", "default", pod)?)
    }
}
