//! NodeImage pre-pull on the real API server, at the version it stores (`v1beta1` with
//! kruise's current CRDs): tags pulled by the cluster's containerd, the status right, and every
//! field kruised does not own kept (a write through `v1alpha1` would prune `mode`). The test
//! plays kruise-manager to write tags of every shape at once, as its webhook accepts them (a
//! TTL, a fresh `createdAt`, no owner that does not exist: the real manager drops such tags);
//! `kruise.rs` has ImagePullJobs made by the real manager.

use std::collections::BTreeMap;
use std::time::Duration;

use kruised::cri::ImageService;
use kruised::k8s::crd::{ImagePullPhase, NodeImage};
use kube::api::{Api, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams};
use serde_json::{Value, json};

use super::support::cluster::{self, Identity, KubeLab, MANAGER, Rbac, apply_object, wait_for};
use super::support::daemon::Daemon;

const READY: Duration = Duration::from_secs(60);
/// The namespace kruise-manager copies pull secrets to (kruise's `kruise-daemon-config`).
pub const CONFIG_NS: &str = "kruise-daemon-config";

fn b64(s: &str) -> String {
    kruised::controller::imagepull::keyring::base64_encode(s.as_bytes())
}

/// The NodeImage API at `version`, as raw objects (what the server stores, unpruned by our
/// types).
pub fn node_images(admin: &kube::Client, version: &str) -> Api<DynamicObject> {
    let ar = kube::discovery::ApiResource::from_gvk(&GroupVersionKind::gvk(
        "apps.kruise.io",
        version,
        "NodeImage",
    ));
    Api::all_with(admin.clone(), &ar)
}

/// Creates (or replaces) the pull secret for the authenticated registry, as the manager copies
/// it into the config namespace.
pub async fn pull_secret(lab: &KubeLab, admin: &kube::Client, name: &str) {
    let (user, password) = lab.auth_credentials();
    let config = json!({"auths": {lab.auth_registry.clone(): {
        "auth": b64(&format!("{user}:{password}"))}}});
    apply_object(
        admin,
        json!({"apiVersion": "v1", "kind": "Secret",
               "metadata": {"name": name, "namespace": CONFIG_NS},
               "type": "kubernetes.io/dockerconfigjson",
               "data": {".dockerconfigjson": b64(&config.to_string())}}),
    )
    .await;
}

/// Removes the node's NodeImage and waits until it is gone, or made again empty: kruise-manager
/// makes every node's NodeImage at once when it runs.
pub async fn remove_node_image(lab: &KubeLab, admin: &kube::Client) {
    let api = node_images(admin, "v1beta1");
    let Ok(old) = api.get(&lab.node).await else {
        return;
    };
    let _ = api.delete(&lab.node, &DeleteParams::default()).await;
    let typed: Api<NodeImage> = Api::all(admin.clone());
    let old_uid = old.metadata.uid;
    let gone =
        kube::runtime::wait::await_condition(typed, &lab.node, move |o: Option<&NodeImage>| {
            o.is_none_or(|o| o.metadata.uid != old_uid)
        });
    super::support::within(cluster::LIMIT, "the NodeImage deleted", gone)
        .await
        .expect("watch the NodeImage");
}

/// Every tag of the status Succeeded, `desired` of them.
fn all_succeeded(desired: i32) -> impl Fn(Option<&NodeImage>) -> bool {
    move |o: Option<&NodeImage>| {
        o.and_then(|o| o.status.as_ref()).is_some_and(|s| {
            s.desired == desired
                && s.succeeded == desired
                && s.image_statuses
                    .values()
                    .flat_map(|i| i.tags.iter())
                    .count()
                    == usize::try_from(desired).unwrap_or(0)
        })
    }
}

/// Runs the NodeImage scenario with the daemon given, returns the NodeImage as stored.
pub async fn pull_scenario(lab: &KubeLab, admin: &kube::Client) -> Value {
    pull_secret(lab, admin, "lab-registry").await;
    remove_node_image(lab, admin).await;
    let registry_repo = format!("{}/test/busybox", lab.registry);
    let secure_repo = format!("{}/secure/busybox", lab.auth_registry);
    // as kruise-manager writes tags (its webhook requires a TTL; a tag older than 10 min
    // without a status is one it fails as "node has not responded for a long time")
    let created_at = k8s_openapi::jiff::Timestamp::now()
        .round(k8s_openapi::jiff::Unit::Second)
        .unwrap()
        .to_string();
    let ttl = 600;
    apply_object(
        admin,
        json!({
            "apiVersion": "apps.kruise.io/v1beta1", "kind": "NodeImage",
            "metadata": {"name": lab.node, "labels": {"kubernetes.io/hostname": lab.node}},
            "spec": {"images": {
                registry_repo.clone(): {"tags": [
                    {"tag": "v1", "version": 1, "createdAt": created_at,
                     "pullPolicy": {"ttlSecondsAfterFinished": ttl}},
                    {"tag": "v2", "version": 1, "createdAt": created_at,
                     "pullPolicy": {"timeoutSeconds": 120, "backoffLimit": 2, "ttlSecondsAfterFinished": ttl}}
                ]},
                secure_repo.clone(): {
                    "pullSecrets": [{"namespace": CONFIG_NS, "name": "lab-registry", "mode": "batch"}],
                    "tags": [{"tag": "v1", "version": 3, "createdAt": created_at,
                              "pullPolicy": {"ttlSecondsAfterFinished": ttl}}]
                }
            }}
        }),
    )
    .await;
    // the manager's own status field, which the daemon never writes
    node_images(admin, "v1beta1")
        .patch_status(
            &lab.node,
            &PatchParams::apply(MANAGER),
            &Patch::Merge(
                json!({"status": {"desired": 0, "succeeded": 0, "failed": 0, "pulling": 0,
                "firstSyncStatus": {"syncAt": created_at, "status": "Succeeded"}}}),
            ),
        )
        .await
        .unwrap();

    let typed: Api<NodeImage> = Api::all(admin.clone());
    let done = wait_for(&typed, &lab.node, "every tag pulled", all_succeeded(3)).await;
    let status = done.status.unwrap();
    let runtime = lab.runtime();
    for (repo, tag, version) in [
        (&registry_repo, "v1", 1),
        (&registry_repo, "v2", 1),
        (&secure_repo, "v1", 3),
    ] {
        let t = status.image_statuses[repo]
            .tags
            .iter()
            .find(|t| t.tag == tag)
            .unwrap_or_else(|| panic!("{repo}:{tag} in {status:#?}"));
        assert_eq!(t.phase, ImagePullPhase::Succeeded, "{repo}:{tag}");
        assert_eq!(t.version, version, "{repo}:{tag}");
        assert!(t.completion_time.is_some(), "{repo}:{tag}");
        let image = runtime
            .image_status(&format!("{repo}:{tag}"))
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{repo}:{tag} is on the node"));
        assert_eq!(t.image_id, format!("{repo}@{}", image.id), "{repo}:{tag}");
    }

    // read back at the stored version: nothing the daemon does not own was lost
    let stored = node_images(admin, "v1beta1").get(&lab.node).await.unwrap();
    let stored = serde_json::to_value(&stored).unwrap();
    assert_eq!(
        stored["spec"]["images"][&secure_repo]["pullSecrets"][0]["mode"], "batch",
        "v1beta1's mode survives the daemon's status writes: {stored:#}"
    );
    assert_eq!(
        stored["status"]["firstSyncStatus"]["status"], "Succeeded",
        "the manager's status field survives: {stored:#}"
    );
    stored
}

async fn daemon(lab: &KubeLab, identity: &Identity) -> Daemon {
    let mut d = cluster::start_daemon(lab, identity, &[]);
    d.wait_for_log("daemon ready", READY).await;
    d
}

#[tokio::test]
async fn node_image_tags_are_pulled_at_the_stored_version_and_foreign_fields_survive() {
    let Some(lab) = KubeLab::get() else { return };
    let _serial = KubeLab::serial().await;
    let admin = lab.admin().await;
    let identity = cluster::identity(&lab, &admin, Rbac::Deploy).await;
    let mut d = daemon(&lab, &identity).await;
    d.wait_for_log("using apps.kruise.io/v1beta1", READY).await;
    let stored = pull_scenario(&lab, &admin).await;
    let counts: BTreeMap<&str, i64> = ["desired", "succeeded", "failed", "pulling", "waiting"]
        .into_iter()
        .map(|k| (k, stored["status"][k].as_i64().unwrap_or(0)))
        .collect();
    assert_eq!(
        counts,
        BTreeMap::from([
            ("desired", 3),
            ("succeeded", 3),
            ("failed", 0),
            ("pulling", 0),
            ("waiting", 0)
        ])
    );
    d.terminate();
    assert!(d.wait_exit(READY).await.success());
    cluster::assert_never_forbidden(&d);
    remove_node_image(&lab, &admin).await;
}
