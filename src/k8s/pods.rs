//! Pods through the API server, read the one way the node's watch reads them.
//!
//! kruised's API calls on pods (a list by name, a get, a patch of annotations) go out as
//! untyped objects ([`DynamicObject`]) and are read into k8s-openapi's [`Pod`] from a
//! `serde_json::Value`, as [`super::watch::read_lenient`] reads the watch's pods. A typed
//! `Api<Pod>` would read the response text into `Pod` directly, which builds every deserialiser
//! of the pod's types (`PodSpec`, `Volume`, `Container` and the rest) a second time, for kube's
//! text reader: about 0.3 MB of the shipped binary for a handful of calls (issue 44,
//! `scripts/size-report.sh`). What it costs instead: the response is held once more as a
//! `Value` while it is read, on calls that are rare (a write, a lookup by name).
//!
//! A patch's answer is not read at all (`client::send_unread`): no caller needs it.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::{Api, Client};
use serde::Serialize;

use super::client::{from_dynamic, send_unread};

/// Pods of one namespace, through the API server.
#[derive(Clone)]
pub struct Pods {
    api: Api<DynamicObject>,
    client: Client,
}

impl Pods {
    /// The pods of `namespace`.
    pub fn namespaced(client: Client, namespace: &str) -> Self {
        Pods {
            api: Api::namespaced_with(client.clone(), namespace, &ApiResource::erase::<Pod>(&())),
            client,
        }
    }

    /// The pod `name`.
    pub async fn get(&self, name: &str) -> Result<Pod, kube::Error> {
        from_dynamic(self.api.get(name).await?)
    }

    /// The pods `params` select.
    pub async fn list(&self, params: &ListParams) -> Result<Vec<Pod>, kube::Error> {
        self.api
            .list(params)
            .await?
            .items
            .into_iter()
            .map(from_dynamic)
            .collect()
    }

    /// Patches the pod's `status` subresource (which also takes metadata changes).
    pub async fn patch_status<P: Serialize + std::fmt::Debug>(
        &self,
        name: &str,
        params: &PatchParams,
        patch: &Patch<P>,
    ) -> Result<(), kube::Error> {
        let request = kube::core::Request::new(self.api.resource_url())
            .patch_subresource("status", name, params, patch);
        send_unread(&self.client, request).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_read_through_a_value_keeps_its_spec_and_status() {
        let o: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ns", "annotations": {"a": "b"}},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "busybox"}]},
            "status": {"podIP": "10.0.0.7"},
        }))
        .expect("a dynamic object");
        let pod: Pod = from_dynamic(o).expect("a pod");
        assert_eq!(pod.metadata.name.as_deref(), Some("p"));
        let spec = pod.spec.expect("a spec");
        assert_eq!(spec.node_name.as_deref(), Some("n1"));
        assert_eq!(spec.containers[0].image.as_deref(), Some("busybox"));
        assert_eq!(
            pod.status.and_then(|s| s.pod_ip).as_deref(),
            Some("10.0.0.7")
        );
    }

    #[test]
    fn a_pod_with_a_field_of_the_wrong_type_is_an_error_not_a_panic() {
        let o: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p"},
            "spec": {"containers": "not a list"},
        }))
        .expect("a dynamic object");
        let err = from_dynamic::<Pod>(o).expect_err("not a pod");
        assert!(
            matches!(&err, kube::Error::SerdeError(e) if e.to_string().contains("invalid type")),
            "{err}"
        );
    }
}
