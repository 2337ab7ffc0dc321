//! The real kruise-manager drives kruised. The tests act only as a user does (kubectl-level
//! objects: a CloneSet, an ImagePullJob, a ContainerRecreateRequest, a PodProbeMarker); the manager
//! (started by `tests/run.sh` beside the cluster, `KRUISED_KRUISE_MANAGER`) does its part, its
//! webhooks included; kruised, a process with `deploy/`'s RBAC, does the node's; the real kubelet
//! its own. The other modules play the manager by hand, where they do what it cannot (faults,
//! exact timing, v1alpha1-only clusters).

use std::collections::BTreeSet;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kruised::cri::{ImageService, RuntimeService};
use kube::api::{
    Api, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, WatchEvent, WatchParams,
};
use kube::discovery::ApiResource;
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use super::containermeta::{self, stops_logged};
use super::support::cluster::{
    self, Identity, KubeLab, LIMIT, Rbac, TestNamespace, condition, container, wait_for,
};
use super::support::daemon::Daemon;
use super::support::restarts::HookServer;
use super::support::wait;
use super::{runtime_id, status_of};

/// The real kruise-manager runs beside the cluster (`KRUISED_KRUISE_MANAGER`, its health
/// address). Without it the test is skipped with a message, except where the cluster layer is
/// required (`KRUISED_REQUIRE_LAB=1`) and `tests/run.sh` did not say it found no manager
/// (`KRUISED_KRUISE_MANAGER_SKIPPED`): there it fails.
fn manager_runs() -> bool {
    let set = |name: &str| std::env::var(name).is_ok_and(|v| !v.is_empty());
    if set("KRUISED_KRUISE_MANAGER") {
        return true;
    }
    let required = !set("KRUISED_KRUISE_MANAGER_SKIPPED")
        && std::env::var("KRUISED_REQUIRE_LAB").is_ok_and(|v| v == "1");
    assert!(
        !required,
        "the real kruise-manager is required here but KRUISED_KRUISE_MANAGER is not set: run \
         the tests with tests/run.sh, with OpenKruise's kruise-manager in KRUISED_KRUISE_ASSETS \
         (a directory of plain binaries)"
    );
    eprintln!(
        "SKIPPED: no kruise-manager (run the tests with tests/run.sh and KRUISED_KRUISE_ASSETS)"
    );
    false
}

/// The manager's log so far, its last lines: for a failing test's message.
fn manager_log_tail() -> String {
    let Ok(path) = std::env::var("KRUISED_KRUISE_MANAGER_LOG") else {
        return String::new();
    };
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

fn kind(group: &str, version: &str, kind: &str) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind))
}

/// A namespace of the test's, an admin client (the user), and kruised.
struct User {
    lab: KubeLab,
    admin: Client,
    ns: TestNamespace,
    identity: Identity,
}

impl User {
    async fn new(lab: &KubeLab, prefix: &str) -> User {
        let admin = lab.admin().await;
        let ns = TestNamespace::create(&admin, prefix).await;
        let identity = cluster::identity(lab, &admin, Rbac::Deploy).await;
        User {
            lab: lab.clone(),
            admin,
            ns,
            identity,
        }
    }

    async fn kruised(&self) -> Daemon {
        let mut daemon = cluster::start_daemon(&self.lab, &self.identity, &[]);
        daemon
            .wait_for_log("daemon ready", Duration::from_secs(60))
            .await;
        daemon
    }

    fn api(&self, r: &ApiResource) -> Api<DynamicObject> {
        Api::namespaced_with(self.admin.clone(), &self.ns.name, r)
    }

    fn clonesets(&self) -> Api<DynamicObject> {
        self.api(&kind("apps.kruise.io", "v1beta1", "CloneSet"))
    }

    async fn create(&self, r: &ApiResource, obj: Value) -> DynamicObject {
        let obj: DynamicObject = serde_json::from_value(obj).unwrap();
        self.api(r)
            .create(&Default::default(), &obj)
            .await
            .unwrap_or_else(|e| panic!("create {}: {e}", r.kind))
    }

    /// A CloneSet of one pod that updates in place; `containers` as in [`container`].
    async fn cloneset(&self, containers: Vec<Value>) {
        self.cloneset_with_grace(containers, 0).await;
    }

    /// [`User::cloneset`] with `rollingUpdate.inPlaceUpdateStrategy.gracePeriodSeconds: grace`.
    async fn cloneset_with_grace(&self, containers: Vec<Value>, grace: u32) {
        self.create(
            &kind("apps.kruise.io", "v1beta1", "CloneSet"),
            json!({"apiVersion": "apps.kruise.io/v1beta1", "kind": "CloneSet",
                "metadata": {"name": "web"},
                "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
                    "template": {
                        "metadata": {"labels": {"app": "web"}, "annotations": {"app-config": "v1"}},
                        "spec": {"hostNetwork": true, "terminationGracePeriodSeconds": 5,
                                 "containers": containers}},
                    "updateStrategy": {"rollingUpdate": {"podUpdatePolicy": "InPlaceIfPossible",
                        "inPlaceUpdateStrategy": {"gracePeriodSeconds": grace}}}}}),
        )
        .await;
    }

    /// Waits until the CloneSet has updated and ready every replica of its current spec;
    /// returns its one pod.
    async fn cloneset_updated(&self, what: &str) -> Pod {
        let done = |o: &DynamicObject| {
            let (spec, status) = (&o.data["spec"], &o.data["status"]);
            status["observedGeneration"].as_i64() == o.metadata.generation
                && status["updatedReadyReplicas"] == spec["replicas"]
                && status["readyReplicas"] == spec["replicas"]
                && status["replicas"] == spec["replicas"]
        };
        let done = move |o: Option<&DynamicObject>| o.is_some_and(done);
        let finished = wait::try_kube(&self.clonesets(), LIMIT, "web", what, done).await;
        if let Err(status) = finished.map_err(status_then) {
            let pods: Vec<String> = self
                .pods_now()
                .await
                .iter()
                .map(|p| {
                    json!({"name": p.name_any(), "annotations": p.annotations(),
                           "status": p.status})
                    .to_string()
                })
                .collect();
            panic!(
                "{what}: the CloneSet did not finish within {LIMIT:?}; its status {status}\n\
                 pods:\n{}\nkruise-manager's log:\n{}",
                pods.join("\n"),
                manager_log_tail()
            );
        }
        let pods = self.pods_now().await;
        assert_eq!(pods.len(), 1, "{pods:#?}");
        pods.into_iter().next().unwrap()
    }

    async fn pods_now(&self) -> Vec<Pod> {
        self.ns
            .pods()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
    }

    /// Changes the CloneSet's template as a user's `kubectl patch --type merge` does.
    async fn patch_template(&self, template: Value) {
        self.clonesets()
            .patch(
                "web",
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": {"template": template}})),
            )
            .await
            .unwrap();
    }

    async fn cleanup(self) {
        // the CloneSet first: the manager would make its pod again
        let _ = self.clonesets().delete("web", &Default::default()).await;
        self.ns.delete().await;
    }
}

/// What `echo $VAR` prints in the running container of `name`.
async fn echo(lab: &KubeLab, pod: &Pod, name: &str, var: &str) -> String {
    let id = status_of(pod, name).container_id.as_deref().unwrap();
    containermeta::echo(lab, runtime_id(id), var).await
}

/// The status of the object a wait on kruise's objects gave up on, as it was then.
fn status_then(missed: wait::Missed<Option<DynamicObject>>) -> Value {
    missed
        .last
        .flatten()
        .map_or(Value::Null, |o| o.data["status"].clone())
}

/// The pod's in-place update is finished as the manager records it: its state names the
/// CloneSet's update revision with nothing left for a next batch, and `InPlaceUpdateReady` is
/// true again.
async fn assert_in_place_finished(user: &User, pod: &Pod) {
    let set = user.clonesets().get("web").await.unwrap();
    let revision = set.data["status"]["updateRevision"].as_str().unwrap();
    let state: Value = serde_json::from_str(
        pod.annotations()
            .get(kruised::k8s::keys::INPLACE_UPDATE_STATE)
            .expect("the manager's in-place update state"),
    )
    .unwrap();
    assert_eq!(state["revision"], revision, "{state}");
    assert!(
        state.get("nextContainerRefMetadata").is_none()
            && state.get("nextContainerImages").is_none(),
        "nothing left for a next batch: {state}"
    );
    assert_eq!(
        condition(pod, kruised::k8s::keys::INPLACE_UPDATE_READY),
        Some("True")
    );
}

#[tokio::test]
async fn a_cloneset_updates_env_in_place_by_one_restart_of_kruised_and_image_and_env_by_the_kubelets()
 {
    let Some(lab) = KubeLab::get() else { return };
    if !manager_runs() {
        return;
    }
    let _serial = KubeLab::serial().await;
    let user = User::new(&lab, "kcloneset").await;
    let mut daemon = user.kruised().await;
    let v1 = lab.image("busybox:v1");
    user.cloneset(vec![
        container("main", &v1, &[("APP_CONFIG", "app-config")]),
        container("side", &v1, &[]),
    ])
    .await;
    let before = user.cloneset_updated("the first pod").await;
    let uid = before.uid().unwrap();
    assert_eq!(echo(&lab, &before, "main", "APP_CONFIG").await, "v1");

    // the env of one container of two reads the changed annotation: kruised restarts it once
    user.patch_template(json!({"metadata": {"annotations": {"app-config": "v2"}}}))
        .await;
    let after = user.cloneset_updated("the annotation v2 in place").await;
    assert_eq!(after.uid().unwrap(), uid, "updated in place: the same pod");
    assert_eq!(
        status_of(&after, "main").restart_count,
        1,
        "kruised's stops: {:#?}",
        containermeta::stops(&daemon)
    );
    assert_eq!(echo(&lab, &after, "main", "APP_CONFIG").await, "v2");
    assert_eq!(
        status_of(&after, "side").container_id,
        status_of(&before, "side").container_id,
        "side untouched"
    );
    assert_eq!(stops_logged(&daemon), 1, "kruised stopped main once");
    assert_in_place_finished(&user, &after).await;

    // image and annotation together: the kubelet recreates main for its new image with the new
    // value; kruised stops nothing
    let v2 = lab.image("busybox:v2");
    user.patch_template(json!({
        "metadata": {"annotations": {"app-config": "v3"}},
        "spec": {"containers": [container("main", &v2, &[("APP_CONFIG", "app-config")]),
                                container("side", &v1, &[])]}}))
        .await;
    let last = user.cloneset_updated("image and annotation in place").await;
    assert_eq!(last.uid().unwrap(), uid);
    let main = status_of(&last, "main");
    assert_eq!(main.restart_count, 2, "one more restart, the kubelet's");
    assert!(main.image.contains("busybox:v2"), "{}", main.image);
    assert_eq!(echo(&lab, &last, "main", "APP_CONFIG").await, "v3");
    assert_eq!(stops_logged(&daemon), 1, "kruised stopped nothing more");
    assert_in_place_finished(&user, &last).await;

    daemon.terminate();
    assert!(daemon.wait_exit(LIMIT).await.success());
    cluster::assert_never_forbidden(&daemon);
    user.cleanup().await;
}

#[tokio::test]
async fn a_cloneset_image_update_with_a_grace_period_has_the_image_on_the_node_before_the_spec_names_it()
 {
    let Some(lab) = KubeLab::get() else { return };
    if !manager_runs() {
        return;
    }
    let _serial = KubeLab::serial().await;
    let user = User::new(&lab, "kgrace").await;
    let mut daemon = user.kruised().await;
    let (v1, v2) = (lab.image("busybox:v1"), lab.image("busybox:v2"));
    // v2 not on the node: only kruised's pull can bring it there while the spec names v1
    let runtime = lab.runtime();
    let _ = runtime.remove_image(&v2).await;
    user.cloneset_with_grace(vec![container("main", &v1, &[])], 10)
        .await;
    let before = user.cloneset_updated("the first pod").await;
    let name = before.name_any();
    user.patch_template(json!({"spec": {"containers": [container("main", &v2, &[])]}}))
        .await;

    // the manager's grace annotation names v2 while the pod's spec still runs v1
    let grace = kruised::k8s::keys::INPLACE_UPDATE_GRACE;
    let pods = user.ns.pods();
    let in_grace = |p: Option<&Pod>| p.is_some_and(|p| p.annotations().contains_key(grace));
    let pod = wait::try_kube(&pods, LIMIT, &name, "the grace annotation", in_grace)
        .await
        .unwrap_or_else(|m| m.fail_with(format!("kruise-manager's log:\n{}", manager_log_tail())));
    let spec: Value = serde_json::from_str(&pod.annotations()[grace]).unwrap();
    assert_eq!(spec["containerImages"]["main"], v2.as_str(), "{spec}");
    assert_eq!(spec["graceSeconds"], 10, "{spec}");
    let images = |p: &Pod| -> Vec<Option<String>> {
        let spec = p.spec.as_ref().unwrap();
        spec.containers.iter().map(|c| c.image.clone()).collect()
    };
    assert_eq!(
        images(&pod),
        [Some(v1.clone())],
        "the spec waits for the grace"
    );

    // kruised pulls v2 at the annotation: on the node while the grace still runs
    let present = wait::try_poll(
        Duration::from_secs(10),
        Duration::from_millis(200),
        "v2 on the node",
        || runtime.image_status(&v2),
        |s| matches!(s, Ok(Some(_))),
    )
    .await;
    let still = pods.get(&name).await.unwrap();
    if let Err(m) = present {
        m.fail();
    }
    assert!(
        still.annotations().contains_key(grace) && images(&still) == [Some(v1.clone())],
        "v2 arrived within the grace period, before the spec named it: {:?}",
        still.annotations()
    );

    // after the grace the manager patches the image and the kubelet recreates main in place
    let after = user.cloneset_updated("v2 after the grace period").await;
    assert_eq!(after.uid(), before.uid(), "updated in place: the same pod");
    assert!(
        !after.annotations().contains_key(grace),
        "{:?}",
        after.annotations()
    );
    let main = status_of(&after, "main");
    assert_eq!(main.restart_count, 1, "the kubelet's one restart");
    assert!(main.image.contains("busybox:v2"), "{}", main.image);
    assert_in_place_finished(&user, &after).await;

    daemon.terminate();
    assert!(daemon.wait_exit(LIMIT).await.success());
    cluster::assert_never_forbidden(&daemon);
    user.cleanup().await;
}

#[tokio::test]
async fn without_kruised_the_managers_env_update_waits_and_kruised_finishes_it_when_it_starts() {
    let Some(lab) = KubeLab::get() else { return };
    if !manager_runs() {
        return;
    }
    let _serial = KubeLab::serial().await;
    let user = User::new(&lab, "knodaemon").await;
    let v1 = lab.image("busybox:v1");
    user.cloneset(vec![container(
        "main",
        &v1,
        &[("APP_CONFIG", "app-config")],
    )])
    .await;
    let before = user.cloneset_updated("the first pod").await;
    user.patch_template(json!({"metadata": {"annotations": {"app-config": "v2"}}}))
        .await;
    // the manager starts the update: the pod out of service, the new annotation on it
    let pods = user.ns.pods();
    let name = before.name_any();
    let waiting = wait_for(
        &pods,
        &name,
        "the manager starting the update",
        |p: Option<&Pod>| {
            p.is_some_and(|p| {
                p.annotations().get("app-config").map(String::as_str) == Some("v2")
                    && condition(p, kruised::k8s::keys::INPLACE_UPDATE_READY) == Some("False")
            })
        },
    )
    .await;
    // the scenario, not a synchronisation: nobody on the node acts for a while
    tokio::time::sleep(Duration::from_secs(10)).await;
    let still = pods.get(&name).await.unwrap();
    assert_eq!(
        status_of(&still, "main").restart_count,
        0,
        "nothing restarted it"
    );
    assert_eq!(
        status_of(&still, "main").container_id,
        status_of(&waiting, "main").container_id
    );
    let set = user.clonesets().get("web").await.unwrap();
    assert_eq!(
        set.data["status"]["updatedReadyReplicas"],
        json!(0),
        "the update is not finished without the daemon: {:#?}",
        set.data["status"]
    );

    let daemon = user.kruised().await;
    let after = user.cloneset_updated("the update, once kruised runs").await;
    assert_eq!(
        status_of(&after, "main").restart_count,
        1,
        "kruised's stops: {:#?}",
        containermeta::stops(&daemon)
    );
    assert_eq!(echo(&lab, &after, "main", "APP_CONFIG").await, "v2");
    assert_in_place_finished(&user, &after).await;
    assert_eq!(stops_logged(&daemon), 1);
    daemon.terminate();
    user.cleanup().await;
}

#[tokio::test]
async fn an_image_pull_job_is_pulled_by_kruised_and_succeeds_with_and_without_a_pull_secret() {
    let Some(lab) = KubeLab::get() else { return };
    if !manager_runs() {
        return;
    }
    let _serial = KubeLab::serial().await;
    let user = User::new(&lab, "kpulljob").await;
    let daemon = user.kruised().await;
    let public = format!("{}/imagepull/busybox:v1", lab.registry);
    let (u, p) = lab.auth_credentials();
    let private = format!("{}/secure/busybox:v1", lab.auth_registry);
    // images the node lacks
    let images = lab.runtime();
    for image in [&public, &private] {
        if let Ok(Some(found)) = images.image_status(image).await {
            images.remove_image(&found.id).await.unwrap();
        }
    }
    let config =
        json!({"auths": {lab.auth_registry.clone(): {"username": u, "password": p}}}).to_string();
    let secrets: Api<Secret> = Api::namespaced(user.admin.clone(), &user.ns.name);
    secrets
        .create(
            &Default::default(),
            &serde_json::from_value(json!({"metadata": {"name": "regcred"},
                "type": "kubernetes.io/dockerconfigjson",
                "stringData": {".dockerconfigjson": config}}))
            .unwrap(),
        )
        .await
        .unwrap();

    let jobs = kind("apps.kruise.io", "v1beta1", "ImagePullJob");
    for (name, image, secrets) in [
        ("public", &public, json!([])),
        ("private", &private, json!(["regcred"])),
    ] {
        user.create(
            &jobs,
            json!({"apiVersion": "apps.kruise.io/v1beta1", "kind": "ImagePullJob",
                "metadata": {"name": name},
                "spec": {"image": image, "pullSecrets": secrets, "parallelism": 1,
                         "completionPolicy": {"type": "Always", "activeDeadlineSeconds": 120},
                         "pullPolicy": {"backoffLimit": 1, "timeoutSeconds": 60}}}),
        )
        .await;
    }
    for name in ["public", "private"] {
        let done = |o: Option<&DynamicObject>| {
            o.is_some_and(|o| o.data["status"]["completionTime"].is_string())
        };
        let job = wait::try_kube(&user.api(&jobs), LIMIT, name, "the job complete", done)
            .await
            .map_err(status_then)
            .unwrap_or_else(|status| {
            panic!(
                "job {name} did not complete within {LIMIT:?}: {status:#}\nkruise-manager's log:\n{}",
                manager_log_tail()
            )
        });
        let status = &job.data["status"];
        assert_eq!(status["succeeded"], json!(1), "{name}: {status:#}");
        assert_eq!(
            status["failed"].as_i64().unwrap_or(0),
            0,
            "{name}: {status:#}"
        );
    }
    for image in [&public, &private] {
        assert!(
            images.image_status(image).await.unwrap().is_some(),
            "{image} is on the node"
        );
    }
    // the password never reaches the log
    assert!(!daemon.log_text().contains(&p));
    cluster::assert_never_forbidden(&daemon);
    user.cleanup().await;
}

#[tokio::test]
async fn a_users_recreate_request_is_filled_by_the_webhook_and_carried_out_by_kruised() {
    let Some(lab) = KubeLab::get() else { return };
    if !manager_runs() {
        return;
    }
    let _serial = KubeLab::serial().await;
    let user = User::new(&lab, "kcrr").await;
    let daemon = user.kruised().await;
    let v1 = lab.image("busybox:v1");
    // a's preStop hook calls the test (host network): the webhook copies it into the request
    let hooks = HookServer::start().await;
    let mut a = container("a", &v1, &[]);
    a["lifecycle"] = json!({"preStop": {"exec": {"command": ["sh", "-c",
        format!("wget -q -O /dev/null http://127.0.0.1:{}/hook/web/a", hooks.port)]}}});
    user.cloneset(vec![a, container("b", &v1, &[])]).await;
    let pod = user.cloneset_updated("the pod").await;

    let crrs = kind("apps.kruise.io", "v1beta1", "ContainerRecreateRequest");
    let made = user
        .create(
            &crrs,
            json!({"apiVersion": "apps.kruise.io/v1beta1", "kind": "ContainerRecreateRequest",
                "metadata": {"name": "again"},
                "spec": {"podName": pod.name_any(), "containers": [{"name": "a"}, {"name": "b"}],
                         "strategy": {"orderedRecreate": true}}}),
        )
        .await;
    // the manager's webhook filled in what a user leaves out
    let spec = &made.data["spec"];
    for (i, c) in ["a", "b"].iter().enumerate() {
        assert_eq!(
            spec["containers"][i]["statusContext"]["containerID"].as_str(),
            status_of(&pod, c).container_id.as_deref(),
            "{spec:#}"
        );
    }
    assert_eq!(
        made.labels().get(kruised::k8s::keys::CRR_NODE_NAME_LABEL),
        Some(&lab.node)
    );
    let crr = recreate_succeeded(&user.api(&crrs), "again").await;
    let states = &crr.data["status"]["containerRecreateStates"];
    assert_eq!(states.as_array().map(Vec::len), Some(2), "{states:#}");
    let after = user.ns.pods().get(&pod.name_any()).await.unwrap();
    for c in ["a", "b"] {
        assert_eq!(status_of(&after, c).restart_count, 1, "{c} recreated once");
    }
    assert_eq!(hooks.count("web", "a"), 1, "a's preStop hook ran once");
    cluster::assert_never_forbidden(&daemon);
    user.cleanup().await;
}

/// The names of the namespace's requests in the order their status turned `Completed`, as a
/// watch begun at `version` (before any was made) saw the writes: the API server's order.
fn completions(
    api: &Api<DynamicObject>,
    version: String,
    n: usize,
) -> tokio::task::JoinHandle<Vec<String>> {
    let api = api.clone();
    tokio::spawn(async move {
        let mut events = api
            .watch(&WatchParams::default(), &version)
            .await
            .expect("watch the requests")
            .boxed();
        let mut order = Vec::new();
        while order.len() < n {
            match tokio::time::timeout(LIMIT, events.try_next()).await {
                Ok(Ok(Some(WatchEvent::Added(o) | WatchEvent::Modified(o)))) => {
                    let name = o.name_any();
                    if o.data["status"]["phase"] == "Completed" && !order.contains(&name) {
                        order.push(name);
                    }
                }
                Ok(Ok(Some(_))) => {}
                other => panic!("no more completions after {order:?}: {other:?}"),
            }
        }
        order
    })
}

/// A user's request to recreate `main` of `pod`: what the webhook fills is left out.
fn recreate_main(name: &str, pod: &str) -> Value {
    json!({"apiVersion": "apps.kruise.io/v1beta1", "kind": "ContainerRecreateRequest",
        "metadata": {"name": name},
        "spec": {"podName": pod, "containers": [{"name": "main"}]}})
}

/// Waits until the request `name` is Completed, and asserts that every container of it
/// Succeeded; the request then.
async fn recreate_succeeded(api: &Api<DynamicObject>, name: &str) -> DynamicObject {
    let done =
        |o: Option<&DynamicObject>| o.is_some_and(|o| o.data["status"]["phase"] == "Completed");
    let crr = wait::try_kube(api, LIMIT, name, "Completed", done)
        .await
        .map_err(status_then)
        .unwrap_or_else(|status| {
            panic!(
                "{name} not Completed within {LIMIT:?}: {status:#}\nkruise-manager's log:\n{}",
                manager_log_tail()
            )
        });
    let states = crr.data["status"]["containerRecreateStates"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        !states.is_empty() && states.iter().all(|s| s["phase"] == "Succeeded"),
        "{name}: {states:#?}"
    );
    crr
}

/// `n` requests for one pod made together through the real manager's webhook (kruise issues
/// #1058, #1626, kruise-rollouts #207: on kruise-daemon the second stayed `Pending`): each is
/// Completed, in creation order, and the container is recreated by kruise's rule, once for
/// each container the requests were made against (their `statusContext`): requests made
/// before one recreation share it, never more. The manager double's twin:
/// `tests/integration/manager.rs`, `requests_made_together`.
async fn recreate_requests_made_together_with_the_real_manager(n: usize) {
    let Some(lab) = KubeLab::get() else { return };
    if !manager_runs() {
        return;
    }
    let _serial = KubeLab::serial().await;
    let user = User::new(&lab, "kcrrs").await;
    let daemon = user.kruised().await;
    user.cloneset(vec![container("main", &lab.image("busybox:v1"), &[])])
        .await;
    let pod = user.cloneset_updated("the pod").await;
    let api = user.api(&kind(
        "apps.kruise.io",
        "v1beta1",
        "ContainerRecreateRequest",
    ));
    let version = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap_or_default();
    let order = completions(&api, version, n);
    let names: Vec<String> = (1..=n).map(|i| format!("r{i}")).collect();
    let mut made_against = BTreeSet::new();
    for name in &names {
        let made = user
            .create(
                &kind("apps.kruise.io", "v1beta1", "ContainerRecreateRequest"),
                recreate_main(name, &pod.name_any()),
            )
            .await;
        made_against.insert(
            made.data["spec"]["containers"][0]["statusContext"]["containerID"]
                .as_str()
                .expect("the webhook filled the statusContext")
                .to_string(),
        );
    }
    for name in &names {
        recreate_succeeded(&api, name).await;
    }
    let order = tokio::time::timeout(LIMIT, order)
        .await
        .expect("every completion watched")
        .expect("the watch task");
    assert_eq!(order, names, "Completed in creation order");
    let after = user.ns.pods().get(&pod.name_any()).await.unwrap();
    assert_eq!(
        usize::try_from(status_of(&after, "main").restart_count).unwrap(),
        made_against.len(),
        "one recreation for each container the requests were made against: {made_against:?}"
    );
    cluster::assert_never_forbidden(&daemon);
    user.cleanup().await;
}

#[tokio::test]
async fn two_recreate_requests_made_together_through_the_real_manager_complete_in_creation_order() {
    recreate_requests_made_together_with_the_real_manager(2).await;
}

#[tokio::test]
async fn three_recreate_requests_made_together_through_the_real_manager_complete_in_creation_order()
{
    recreate_requests_made_together_with_the_real_manager(3).await;
}

/// Requests for one pod made one after the other through the real manager (kruise issues
/// #1058, #1626): each is made after the last recreation, so each recreates `main` once more,
/// never more. The manager double's twin: `tests/integration/manager.rs`.
#[tokio::test]
async fn recreate_requests_made_one_after_the_other_through_the_real_manager_each_restart_once_more()
 {
    let Some(lab) = KubeLab::get() else { return };
    if !manager_runs() {
        return;
    }
    let _serial = KubeLab::serial().await;
    let user = User::new(&lab, "kcrrs").await;
    let daemon = user.kruised().await;
    user.cloneset(vec![container("main", &lab.image("busybox:v1"), &[])])
        .await;
    let pod = user.cloneset_updated("the pod").await;
    let crrs = kind("apps.kruise.io", "v1beta1", "ContainerRecreateRequest");
    for (i, name) in ["r1", "r2", "r3"].iter().enumerate() {
        let made = user
            .create(&crrs, recreate_main(name, &pod.name_any()))
            .await;
        assert_eq!(
            made.data["spec"]["containers"][0]["statusContext"]["restartCount"], i,
            "the webhook took the container as it runs now"
        );
        recreate_succeeded(&user.api(&crrs), name).await;
        let after = user.ns.pods().get(&pod.name_any()).await.unwrap();
        assert_eq!(
            usize::try_from(status_of(&after, "main").restart_count).unwrap(),
            i + 1,
            "{name} recreated main once more"
        );
    }
    cluster::assert_never_forbidden(&daemon);
    user.cleanup().await;
}

#[tokio::test]
async fn a_pod_probe_markers_exec_tcp_and_http_probes_set_the_pods_conditions_and_labels_and_follow_them()
 {
    let Some(lab) = KubeLab::get() else { return };
    if !manager_runs() {
        return;
    }
    let _serial = KubeLab::serial().await;
    let user = User::new(&lab, "kprobe").await;
    let daemon = user.kruised().await;
    let v1 = lab.image("busybox:v1");
    // a TCP port of the pod's own (host network): one the test picks free
    let port = super::support::daemon::free_addr().port();
    let mut srv = container("srv", &v1, &[]);
    srv["command"] = json!([
        "sh",
        "-c",
        format!(
            "mkdir -p /www && echo up > /www/index.html && exec httpd -f -p 127.0.0.1:{port} -h /www"
        )
    ]);
    user.cloneset(vec![container("main", &v1, &[]), srv]).await;
    let pod = user.cloneset_updated("the pod").await;

    let markers = kind("apps.kruise.io", "v1alpha1", "PodProbeMarker");
    user.create(
        &markers,
        json!({"apiVersion": "apps.kruise.io/v1alpha1", "kind": "PodProbeMarker",
            "metadata": {"name": "marker"},
            "spec": {"selector": {"matchLabels": {"app": "web"}}, "probes": [
                {"name": "healthy", "containerName": "main",
                 "probe": {"exec": {"command": ["test", "!", "-e", "/tmp/sick"]},
                           "periodSeconds": 1, "failureThreshold": 1},
                 "podConditionType": "example.com/healthy",
                 "markerPolicy": [{"state": "Succeeded", "labels": {"example.com/healthy": "yes"}},
                                  {"state": "Failed", "labels": {"example.com/healthy": "no"}}]},
                {"name": "serving", "containerName": "srv",
                 "probe": {"tcpSocket": {"port": port}, "periodSeconds": 1, "failureThreshold": 1},
                 "podConditionType": "example.com/serving",
                 "markerPolicy": [{"state": "Succeeded", "labels": {"example.com/serving": "yes"}}]},
                {"name": "page", "containerName": "srv",
                 "probe": {"httpGet": {"port": port, "path": "/index.html", "scheme": "HTTP"},
                           "periodSeconds": 1, "failureThreshold": 1},
                 "podConditionType": "example.com/page"}]}}),
    )
    .await;
    let pods = user.ns.pods();
    let name = pod.name_any();
    let marked = |healthy: &'static str| {
        move |p: Option<&Pod>| {
            p.is_some_and(|p| {
                let label = |k: &str| p.labels().get(k).cloned();
                let condition = |t: &str| condition(p, t);
                label("example.com/healthy").as_deref() == Some(healthy)
                    && condition("example.com/healthy")
                        == Some(if healthy == "yes" { "True" } else { "False" })
                    && label("example.com/serving").as_deref() == Some("yes")
                    && condition("example.com/serving") == Some("True")
                    && condition("example.com/page") == Some("True")
            })
        }
    };
    wait_for(&pods, &name, "both probes succeeded, marked", marked("yes")).await;

    // the exec probe fails from now on: the marker follows
    let main = runtime_id(status_of(&pod, "main").container_id.as_deref().unwrap()).to_string();
    let out = lab
        .runtime()
        .exec_sync(
            &main,
            vec!["touch".into(), "/tmp/sick".into()],
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    assert_eq!(out.exit_code, 0);
    wait_for(&pods, &name, "the exec probe failed, marked", marked("no")).await;
    cluster::assert_never_forbidden(&daemon);
    let _ = user
        .api(&markers)
        .delete("marker", &Default::default())
        .await;
    user.cleanup().await;
}
