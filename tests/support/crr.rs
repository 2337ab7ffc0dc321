//! ContainerRecreateRequests as kruise-manager's webhook leaves them for the daemon: active,
//! labelled with their node and their pod's UID, each container with the `statusContext` of the
//! container it recreates. The one builder of the layers that make requests by hand (the
//! manager double and the real manager make their own through the webhook).

use serde_json::{Value, json};

use kruised::k8s::keys;

/// A request being built; [`Request::json`] gives the object to create.
#[derive(Clone, Debug)]
pub struct Request(Value);

impl Request {
    /// A request `namespace/name` on `node` for the pod `pod_name` whose UID is `pod_uid` (a
    /// forged one, when the test says so), with no container yet and kruise's default strategy.
    pub fn new(name: &str, namespace: &str, node: &str, pod_name: &str, pod_uid: &str) -> Self {
        Request(json!({
            "apiVersion": "apps.kruise.io/v1alpha1", "kind": "ContainerRecreateRequest",
            "metadata": {"name": name, "namespace": namespace, "labels": {
                keys::CRR_NODE_NAME_LABEL: node, keys::CRR_ACTIVE_LABEL: "true",
                keys::CRR_POD_UID_LABEL: pod_uid}},
            "spec": {"podName": pod_name, "containers": [], "strategy": {}}
        }))
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
        if let Some(containers) = self.0["spec"]["containers"].as_array_mut() {
            containers.push(c);
        }
        self
    }

    /// The whole `spec.strategy`.
    #[must_use]
    pub fn strategy(mut self, strategy: Value) -> Self {
        self.0["spec"]["strategy"] = strategy;
        self
    }

    /// `spec.strategy.terminationGracePeriodSeconds`.
    #[must_use]
    pub fn grace(mut self, seconds: i64) -> Self {
        self.0["spec"]["strategy"]["terminationGracePeriodSeconds"] = json!(seconds);
        self
    }

    /// `spec.activeDeadlineSeconds`.
    #[must_use]
    pub fn active_deadline(mut self, seconds: i64) -> Self {
        self.0["spec"]["activeDeadlineSeconds"] = json!(seconds);
        self
    }

    /// The object to create.
    pub fn json(&self) -> Value {
        self.0.clone()
    }
}
