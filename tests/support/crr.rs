//! ContainerRecreateRequests as kruise-manager's webhook leaves them for the daemon: active,
//! labelled with their node and their pod's UID, each container with the `statusContext` of the
//! container it recreates. The one builder of the layers that make requests by hand (the
//! manager double and the real manager make their own through the webhook).

use serde_json::{Value, json};

use kruised::k8s::keys;

/// A request being built; [`Request::json`] gives the object to create.
#[derive(Clone, Debug)]
pub struct Request {
    name: String,
    namespace: String,
    node: String,
    pod_name: String,
    pod_uid: String,
    containers: Vec<Value>,
    strategy: Value,
    active_deadline: Option<i64>,
}

impl Request {
    /// A request `namespace/name` on `node` for the pod `pod_name` whose UID is `pod_uid` (a
    /// forged one, when the test says so), with no container yet and kruise's default strategy.
    pub fn new(name: &str, namespace: &str, node: &str, pod_name: &str, pod_uid: &str) -> Self {
        Request {
            name: name.into(),
            namespace: namespace.into(),
            node: node.into(),
            pod_name: pod_name.into(),
            pod_uid: pod_uid.into(),
            containers: Vec::new(),
            strategy: json!({}),
            active_deadline: None,
        }
    }

    /// Recreates the container `name`, running as `container_id` (the kubelet's ID,
    /// `<runtime>://<id>`; `None`: not running, no `statusContext`), with the `preStop` hook
    /// `pre_stop`.
    #[must_use]
    pub fn container(
        mut self,
        name: &str,
        container_id: Option<&str>,
        pre_stop: Option<Value>,
    ) -> Self {
        let mut c = json!({ "name": name });
        if let Some(id) = container_id {
            c["statusContext"] = json!({"containerID": id, "restartCount": 0});
        }
        if let Some(hook) = pre_stop {
            c["preStop"] = hook;
        }
        self.containers.push(c);
        self
    }

    /// The whole `spec.strategy`.
    #[must_use]
    pub fn strategy(mut self, strategy: Value) -> Self {
        self.strategy = strategy;
        self
    }

    /// `spec.strategy.terminationGracePeriodSeconds`.
    #[must_use]
    pub fn grace(mut self, seconds: i64) -> Self {
        self.strategy["terminationGracePeriodSeconds"] = json!(seconds);
        self
    }

    /// `spec.activeDeadlineSeconds`.
    #[must_use]
    pub fn active_deadline(mut self, seconds: i64) -> Self {
        self.active_deadline = Some(seconds);
        self
    }

    /// The object to create.
    pub fn json(&self) -> Value {
        let mut spec = json!({"podName": self.pod_name, "containers": self.containers,
                              "strategy": self.strategy});
        if let Some(d) = self.active_deadline {
            spec["activeDeadlineSeconds"] = json!(d);
        }
        json!({
            "apiVersion": "apps.kruise.io/v1alpha1", "kind": "ContainerRecreateRequest",
            "metadata": {"name": self.name, "namespace": self.namespace, "labels": {
                keys::CRR_NODE_NAME_LABEL: self.node, keys::CRR_ACTIVE_LABEL: "true",
                keys::CRR_POD_UID_LABEL: self.pod_uid}},
            "spec": spec
        })
    }
}
