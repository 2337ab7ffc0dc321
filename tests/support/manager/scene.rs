//! A test's cluster around the manager double: a [`FakeNode`] with the pods of one workload,
//! its kubelet ([`KubeletTiming::at_once`]), the namespace kruise's chart creates, the
//! [`ManagerDouble`], and a user's kube client, so a test acts as a user does (`kubectl`-level objects) and waits on the
//! store.

use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use kube::api::{Api, DynamicObject, GroupVersionKind};
use kube::discovery::ApiResource;
use serde_json::{Value, json};

use super::{DAEMON_CONFIG_NS, KubeletTiming, ManagerDouble, Template, Timing};
use crate::daemon::Daemon;
use crate::node::{FakeNode, NODE};

/// How long a scene waits for anything.
pub const LIMIT: Duration = Duration::from_secs(30);

/// The name of the scene's workload.
pub const WORKLOAD: &str = "demo";

/// A node, its kubelet, the manager and a user.
pub struct Scene {
    /// The node: the API double, the fake runtime.
    pub node: Arc<FakeNode>,
    /// The manager double.
    pub manager: ManagerDouble,
    /// The user's client (the double's admin kubeconfig).
    pub user: Client,
    _kubelet: KubeletTiming,
}

impl Timing {
    /// As the cluster lab ran the manager: NodeImages made at once
    /// (`--nodeimage-creation-delay=0s`, as tests/run.sh starts it), the rest kruise's defaults.
    pub fn as_in_the_cluster_lab() -> Timing {
        Timing {
            node_image_creation_delay: Duration::ZERO,
            ..Timing::default()
        }
    }
}

/// A kind of the API, for the user's client.
pub fn kind(group: &str, version: &str, kind: &str) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind))
}

impl Scene {
    /// A node with `pods` (each made from its template, as a CloneSet makes its pods, and
    /// taken into the workload [`WORKLOAD`] of the first template), its kubelet, the namespace
    /// `kruise-daemon-config`, and the manager with `timing`.
    pub async fn start(pods: &[(&str, &Template)], timing: Timing) -> Scene {
        let mut node = FakeNode::start().await;
        for (name, t) in pods {
            node.add_pod(name, t.containers.clone(), json!(t.annotations), true);
        }
        node.api
            .create(
                "namespaces",
                json!({"metadata": {"name": DAEMON_CONFIG_NS}}),
            )
            .expect("create the chart's namespace");
        let node = Arc::new(node);
        let kubelet = KubeletTiming::at_once(node.clone());
        let manager = ManagerDouble::start(node.api.control(), timing).await;
        if let Some((_, t)) = pods.first() {
            let names: Vec<&str> = pods.iter().map(|(n, _)| *n).collect();
            manager.add_workload(WORKLOAD, (*t).clone(), &names);
        }
        Scene {
            user: crate::cluster::client_from(&node.kubeconfig()).await,
            manager,
            node,
            _kubelet: kubelet,
        }
    }

    /// Starts `kruised run` for the node and waits until it is ready.
    pub async fn kruised(&self) -> Daemon {
        let args = self.node.daemon_args();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut d = Daemon::start(NODE, &args);
        d.wait_for_log("daemon ready", LIMIT).await;
        d
    }

    /// The user's API of `r` in namespace `default`.
    pub fn api(&self, r: &ApiResource) -> Api<DynamicObject> {
        Api::namespaced_with(self.user.clone(), "default", r)
    }

    /// Creates `obj` as the user, in namespace `default`.
    pub async fn try_create(
        &self,
        r: &ApiResource,
        obj: Value,
    ) -> Result<DynamicObject, kube::Error> {
        let obj: DynamicObject = serde_json::from_value(obj).expect("an object");
        self.api(r).create(&Default::default(), &obj).await
    }

    /// Creates `obj` as the user; a refusal fails the test.
    pub async fn create(&self, r: &ApiResource, obj: Value) -> DynamicObject {
        self.try_create(r, obj)
            .await
            .unwrap_or_else(|e| panic!("create {}: {e}", r.kind))
    }

    /// The pod `name` of namespace `default` as stored now.
    pub fn pod(&self, name: &str) -> Value {
        self.node
            .api
            .get("pods", "default", name)
            .unwrap_or_else(|| panic!("pod {name} exists"))
    }

    /// Waits until the stored object satisfies `cond`; returns it. `resource` as the API
    /// double's control API names it (`pods`, `apps.kruise.io/v1beta1/nodeimages`).
    pub async fn wait(
        &self,
        resource: &str,
        namespace: &str,
        name: &str,
        what: &str,
        cond: impl Fn(&Value) -> bool,
    ) -> Value {
        self.node
            .api
            .wait_for_value(LIMIT, |v| {
                v.get(resource, namespace, name).filter(|o| cond(o))
            })
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "{what} within {LIMIT:?}; {resource} {name} now: {:#}\n\
                     the manager's errors: {:?}",
                    self.node
                        .api
                        .get(resource, namespace, name)
                        .unwrap_or_default(),
                    self.manager.errors()
                )
            })
    }

    /// Waits until the workload has updated every pod and they are ready; returns `pod`.
    pub async fn updated(&self, pod: &str, what: &str) -> Value {
        if let Err(s) = self.manager.wait_workload_updated(WORKLOAD, LIMIT).await {
            panic!(
                "{what}: the workload did not finish within {LIMIT:?}: {s:?}\npod: {:#}\n\
                 the manager's errors: {:?}",
                self.pod(pod),
                self.manager.errors()
            );
        }
        self.pod(pod)
    }

    /// The value of `var` in the environment the runtime started `container` of `pod` with.
    pub fn env(&self, pod: &Value, container: &str, var: &str) -> String {
        let id = pod["status"]["containerStatuses"]
            .as_array()
            .and_then(|s| s.iter().find(|s| s["name"] == container))
            .and_then(|s| s["containerID"].as_str())
            .unwrap_or_else(|| panic!("a container {container} in {pod:#}"));
        let id = id.split_once("://").map_or(id, |(_, id)| id);
        let st = self.node.cri.state();
        let prefix = format!("{var}=");
        st.containers[id]
            .env
            .iter()
            .find_map(|e| e.strip_prefix(prefix.as_str()).map(String::from))
            .unwrap_or_default()
    }
}
