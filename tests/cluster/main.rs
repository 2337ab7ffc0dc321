//! The cluster layer: the `kruised` binary against a real kube-apiserver (RBAC on, kruise's
//! CRDs), etcd, and a real kubelet on its own containerd (see `tests/support/cluster.rs`). The
//! tests play kruise-manager's part with the real API; the kubelet does its own.
//!
//! One binary, so that its tests run one at a time ([`KubeLab::serial`]): they share the node.

#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

#[path = "../support/mod.rs"]
mod support;

mod containermeta;
mod imagepull;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use kruised::k8s::keys;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use support::cluster::{KubeLab, MANAGER, TestNamespace, apply_object, wait_for};

/// A stand-in for kruise's CloneSet CRD: pods need a real controller owner in `apps.kruise.io`
/// (kruised manages only those), and the garbage collector deletes pods whose owner is gone.
const CLONESET_CRD: &str = include_str!("../fixtures/cluster/cloneset-crd.yaml");

/// A container of [`Scene::kruise_pod`]: name, image, and env variables with the annotation
/// each reads.
pub type ContainerDef<'a> = (&'a str, &'a str, &'a [(&'a str, &'a str)]);

/// What every scenario needs: the lab, an admin client, a namespace of its own and a CloneSet
/// in it to own the pods.
pub struct Scene {
    pub lab: KubeLab,
    pub admin: Client,
    pub ns: TestNamespace,
    owner_uid: String,
}

impl Scene {
    pub async fn new(lab: &KubeLab, prefix: &str) -> Scene {
        let admin = lab.admin().await;
        support::cluster::apply_yaml(&admin, CLONESET_CRD).await;
        let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
            Api::all(admin.clone());
        wait_for(
            &crds,
            "clonesets.apps.kruise.io",
            "the CloneSet CRD established",
            |c: Option<&k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>| {
                c.and_then(|c| c.status.as_ref())
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Established" && c.status == "True"))
            },
        )
        .await;
        let ns = TestNamespace::create(&admin, prefix).await;
        apply_object(
            &admin,
            json!({"apiVersion": "apps.kruise.io/v1alpha1", "kind": "CloneSet",
                   "metadata": {"name": "demo", "namespace": ns.name}, "spec": {"replicas": 0}}),
        )
        .await;
        let ar = kube::discovery::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(
            "apps.kruise.io",
            "v1alpha1",
            "CloneSet",
        ));
        let sets: Api<DynamicObject> = Api::namespaced_with(admin.clone(), &ns.name, &ar);
        let owner_uid = sets.get("demo").await.unwrap().uid().unwrap();
        Scene {
            lab: lab.clone(),
            admin,
            ns,
            owner_uid,
        }
    }

    pub fn pods(&self) -> Api<Pod> {
        self.ns.pods()
    }

    /// A pod as a CloneSet makes it: owned by the CloneSet, with the `InPlaceUpdateReady`
    /// readiness gate, host network, on the lab's node. Each container is `(name, image, env)`
    /// where `env` maps a variable to the annotation it reads. The containers exit at once on
    /// SIGTERM.
    pub fn kruise_pod(&self, name: &str, containers: &[ContainerDef<'_>]) -> Value {
        let containers: Vec<Value> = containers
            .iter()
            .map(|(c, image, env)| {
                let env: Vec<Value> = env
                    .iter()
                    .map(|(var, key)| {
                        json!({"name": var, "valueFrom": {"fieldRef":
                            {"fieldPath": format!("metadata.annotations['{key}']")}}})
                    })
                    .collect();
                json!({"name": c, "image": image, "env": env,
                       "command": ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"]})
            })
            .collect();
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": self.ns.name,
                "labels": {"app": "demo"},
                "annotations": {"app-config": "v1"},
                "ownerReferences": [{"apiVersion": "apps.kruise.io/v1alpha1", "kind": "CloneSet",
                    "name": "demo", "uid": self.owner_uid, "controller": true,
                    "blockOwnerDeletion": true}]},
            "spec": {"nodeName": self.lab.node, "hostNetwork": true,
                "terminationGracePeriodSeconds": 5,
                "readinessGates": [{"conditionType": keys::INPLACE_UPDATE_READY}],
                "containers": containers}
        })
    }

    /// Creates the pod, marks it updated (`InPlaceUpdateReady=True`, as the manager does on
    /// creation), and waits until the kubelet reports every container running.
    pub async fn run_pod(&self, pod: Value) -> Pod {
        let name = pod["metadata"]["name"].as_str().unwrap().to_string();
        let pods = self.pods();
        pods.create(&Default::default(), &serde_json::from_value(pod).unwrap())
            .await
            .unwrap();
        self.set_update_ready(&name, true).await;
        wait_for(&pods, &name, "every container running", all_running).await
    }

    /// Sets the pod's `InPlaceUpdateReady` condition, as kruise-manager does (status patch).
    pub async fn set_update_ready(&self, name: &str, ready: bool) {
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let patch = json!({"status": {"conditions": [{"type": keys::INPLACE_UPDATE_READY,
            "status": if ready { "True" } else { "False" }, "lastTransitionTime": now}]}});
        self.pods()
            .patch_status(
                name,
                &PatchParams::apply(MANAGER),
                &Patch::Strategic(&patch),
            )
            .await
            .unwrap();
    }

    /// Changes pod metadata (and spec) with one patch, as the manager's in-place update does.
    pub async fn patch_pod(&self, name: &str, patch: Value) -> Pod {
        self.pods()
            .patch(
                name,
                &PatchParams::apply(MANAGER),
                &Patch::Strategic(&patch),
            )
            .await
            .unwrap()
    }

    pub async fn cleanup(self) {
        self.ns.delete().await;
    }
}

/// Every container of the pod running, with an ID, as the kubelet reports it.
pub fn all_running(p: Option<&Pod>) -> bool {
    p.and_then(|p| p.status.as_ref())
        .and_then(|s| s.container_statuses.as_ref())
        .is_some_and(|cs| {
            !cs.is_empty()
                && cs.iter().all(|c| {
                    c.container_id.is_some()
                        && c.state.as_ref().is_some_and(|s| s.running.is_some())
                })
        })
}

/// The pod's `runtime-containers-meta`, parsed.
pub fn meta(p: &Pod) -> Option<keys::RuntimeContainerMetaSet> {
    let annotations: BTreeMap<String, String> = p.annotations().clone();
    keys::parse_runtime_containers_meta(&annotations)
        .ok()
        .flatten()
}

/// The kubelet's status of container `name`.
pub fn status_of<'a>(p: &'a Pod, name: &str) -> &'a k8s_openapi::api::core::v1::ContainerStatus {
    p.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.name == name))
        .unwrap_or_else(|| panic!("no status of container {name}"))
}

/// The runtime ID in a kubelet container ID (`containerd://<id>`).
pub fn runtime_id(container_id: &str) -> &str {
    container_id
        .split_once("://")
        .map_or(container_id, |(_, id)| id)
}
