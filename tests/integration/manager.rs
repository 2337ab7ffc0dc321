//! What the cluster layer proved with the real kruise-manager (`tests/cluster/kruise.rs`, run
//! only where its binary is provided), kept in CI against the doubles: the test acts as a user
//! (objects through the API, a workload's template changed as a CloneSet's), the manager double
//! (`support::manager`, written from kruise 07169cf) does the manager's part, webhooks
//! included, `kruised` runs as its own process and does the node's, and the kubelet stand-in and
//! the fake runtime are the node.

use std::time::Duration;

use crate::pull_support::b64;
use crate::support::daemon::Daemon;
use crate::support::manager::scene::{LIMIT, Scene, WORKLOAD, kind};
use crate::support::manager::{
    CRR_WEBHOOK, DAEMON_CONFIG_NS, NODE_IMAGE_VALIDATING_WEBHOOK, Template, Timing,
};
use crate::support::node::NODE;
use crate::support::restarts::HookServer;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::discovery::ApiResource;
use serde_json::{Value, json};

fn status<'a>(pod: &'a Value, container: &str) -> &'a Value {
    pod["status"]["containerStatuses"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["name"] == container))
        .unwrap_or_else(|| panic!("a status of {container}: {pod:#}"))
}

fn runtime_id(id: &Value) -> String {
    id.as_str()
        .unwrap()
        .trim_start_matches("containerd://")
        .to_string()
}

fn condition<'a>(obj: &'a Value, t: &str) -> Option<&'a str> {
    obj["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == t)?["status"]
        .as_str()
}

fn container(name: &str, image: &str, env_from_annotations: &[(&str, &str)]) -> Value {
    let env: Vec<Value> = env_from_annotations
        .iter()
        .map(|(var, key)| {
            json!({"name": var, "valueFrom": {"fieldRef":
                {"fieldPath": format!("metadata.annotations['{key}']")}}})
        })
        .collect();
    json!({"name": name, "image": image, "env": env})
}

fn template(containers: Vec<Value>) -> Template {
    Template::new(json!(containers))
        .label("app", "demo")
        .annotation("app-config", "v1")
}

/// The pod's in-place update is finished as the manager records it: its state names the
/// update revision with nothing left for a next batch, and `InPlaceUpdateReady` is True.
fn assert_in_place_finished(s: &Scene, pod: &Value) {
    let revision = s.manager.workload_status(WORKLOAD).update_revision;
    let state: Value = serde_json::from_str(
        pod["metadata"]["annotations"]["apps.kruise.io/inplace-update-state"]
            .as_str()
            .expect("the manager's in-place update state"),
    )
    .unwrap();
    assert_eq!(state["revision"], revision.as_str(), "{state}");
    assert!(
        state.get("nextContainerRefMetadata").is_none()
            && state.get("nextContainerImages").is_none(),
        "nothing left for a next batch: {state}"
    );
    assert_eq!(condition(pod, "InPlaceUpdateReady"), Some("True"));
}

async fn stop(s: &Scene, mut d: Daemon) {
    d.terminate();
    assert!(d.wait_exit(LIMIT).await.success());
    assert_eq!(
        s.manager.errors(),
        Vec::<String>::new(),
        "the manager's errors"
    );
}

// === CloneSet in-place updates ===

/// Seen with kruise-manager 07169cf on the cluster layer,
/// `tests/cluster/kruise.rs::a_cloneset_updates_env_in_place_by_one_restart_of_kruised_and_image_and_env_by_the_kubelets`.
#[tokio::test]
async fn a_cloneset_updates_env_in_place_by_one_restart_of_kruised_and_image_and_env_by_the_kubelets()
 {
    let t = template(vec![
        container("main", "busybox:v1", &[("APP_CONFIG", "app-config")]),
        container("side", "busybox:v1", &[]),
    ]);
    let s = Scene::start(&[("web-0", &t)], Timing::as_in_the_cluster_lab()).await;
    let d = s.kruised().await;
    let before = s.updated("web-0", "the first pod").await;
    assert_eq!(s.env(&before, "main", "APP_CONFIG"), "v1");

    // the env of one container of two reads the changed annotation: kruised restarts it once
    s.manager
        .set_template(WORKLOAD, t.clone().annotation("app-config", "v2"));
    let after = s.updated("web-0", "the annotation v2 in place").await;
    assert_eq!(
        after["metadata"]["uid"], before["metadata"]["uid"],
        "the same pod"
    );
    assert_eq!(status(&after, "main")["restartCount"], 1);
    assert_eq!(s.env(&after, "main", "APP_CONFIG"), "v2");
    assert_eq!(
        status(&after, "side")["containerID"],
        status(&before, "side")["containerID"],
        "side untouched"
    );
    assert_eq!(
        s.node.stopped_ids(),
        [runtime_id(&status(&before, "main")["containerID"])],
        "kruised stopped main once"
    );
    assert_in_place_finished(&s, &after);
    // the state as kruise serialises it (apis/apps/pub/inplace_update.go:52-105)
    let state = after["metadata"]["annotations"]["apps.kruise.io/inplace-update-state"]
        .as_str()
        .unwrap();
    assert!(
        state.starts_with(&format!(
            "{{\"revision\":\"{}\",\"updateTimestamp\":\"",
            s.manager.workload_status(WORKLOAD).update_revision
        )) && state.contains(
            "\"lastContainerStatuses\":null,\"updateEnvFromMetadata\":true,\
             \"containerBatchesRecord\":[{\"timestamp\":"
        ) && state.ends_with(",\"containers\":[\"main\"]}]}"),
        "{state}"
    );

    // image and annotation together: the kubelet recreates main for its new image with the new
    // value; kruised stops nothing
    s.manager.set_template(
        WORKLOAD,
        template(vec![
            container("main", "busybox:v2", &[("APP_CONFIG", "app-config")]),
            container("side", "busybox:v1", &[]),
        ])
        .annotation("app-config", "v3"),
    );
    let last = s.updated("web-0", "image and annotation in place").await;
    assert_eq!(last["metadata"]["uid"], before["metadata"]["uid"]);
    let main = status(&last, "main");
    assert_eq!(main["restartCount"], 2, "one more restart, the kubelet's");
    assert_eq!(main["image"], "busybox:v2");
    assert_eq!(s.env(&last, "main", "APP_CONFIG"), "v3");
    assert_eq!(
        s.node.stopped_ids().len(),
        1,
        "kruised stopped nothing more"
    );
    assert_in_place_finished(&s, &last);
    stop(&s, d).await;
}

/// kruise 07169cf with `gracePeriodSeconds` (inplace_update.go:360-414, 194-247): the pod is
/// unready first, then the update spec waits in the grace annotation with the pod's images and
/// metadata unchanged, and only after the grace period is applied, the annotation removed; the
/// kubelet recreates the container then.
#[tokio::test]
async fn with_a_grace_period_the_update_waits_in_the_grace_annotation_and_is_applied_after_it() {
    let t = template(vec![container("main", "busybox:v1", &[])]);
    let s = Scene::start(&[("web-0", &t)], Timing::as_in_the_cluster_lab()).await;
    let d = s.kruised().await;
    s.updated("web-0", "the first pod").await;

    s.manager.set_grace_period(WORKLOAD, 2);
    let v2 = template(vec![container("main", "busybox:v2", &[])]).annotation("app-config", "v2");
    s.manager.set_template(WORKLOAD, v2);
    let grace = "apps.kruise.io/inplace-update-grace";
    let waiting = s
        .wait("pods", "default", "web-0", "the grace annotation", |p| {
            p["metadata"]["annotations"][grace].is_string()
        })
        .await;
    assert_eq!(condition(&waiting, "InPlaceUpdateReady"), Some("False"));
    let spec: Value =
        serde_json::from_str(waiting["metadata"]["annotations"][grace].as_str().unwrap()).unwrap();
    let revision = s.manager.workload_status(WORKLOAD).update_revision;
    assert_eq!(spec["revision"], revision.as_str(), "{spec}");
    assert_eq!(
        spec["containerImages"],
        json!({"main": "busybox:v2"}),
        "{spec}"
    );
    assert_eq!(spec["graceSeconds"], 2, "{spec}");
    assert_eq!(waiting["spec"]["containers"][0]["image"], "busybox:v1");
    assert_eq!(waiting["metadata"]["annotations"]["app-config"], "v1");

    let after = s.updated("web-0", "the image after the grace period").await;
    assert!(
        after["metadata"]["annotations"].get(grace).is_none(),
        "{after:#}"
    );
    assert_eq!(after["metadata"]["annotations"]["app-config"], "v2");
    let main = status(&after, "main");
    assert_eq!(main["restartCount"], 1, "the kubelet's one restart");
    assert_eq!(main["image"], "busybox:v2");
    assert_in_place_finished(&s, &after);
    stop(&s, d).await;
}

/// A container's launch priority (`KRUISE_CONTAINER_BARRIER` from a key `p_<N>`) splits an
/// in-place update into batches, the highest priority first, the next only once the first
/// batch's containers are done and ready (kruise 07169cf inplace_update_defaults.go:221-263,
/// inplace_update.go:145-160,257-306): kruised restarts each container once, in that order.
#[tokio::test]
async fn containers_of_different_launch_priorities_are_updated_in_batches_highest_first() {
    let barrier = |p: u32| {
        json!({"name": "KRUISE_CONTAINER_BARRIER", "valueFrom": {"configMapKeyRef":
            {"name": "demo-barrier", "key": format!("p_{p}")}}})
    };
    let mut first = container("first", "busybox:v1", &[("A", "a")]);
    first["env"].as_array_mut().unwrap().push(barrier(1000));
    let mut second = container("second", "busybox:v1", &[("B", "b")]);
    second["env"].as_array_mut().unwrap().push(barrier(100));
    let t = template(vec![first, second])
        .annotation("a", "1")
        .annotation("b", "1");
    let s = Scene::start(&[("web-0", &t)], Timing::as_in_the_cluster_lab()).await;
    let d = s.kruised().await;
    let before = s.updated("web-0", "the first pod").await;
    s.manager.set_template(
        WORKLOAD,
        t.clone().annotation("a", "2").annotation("b", "2"),
    );
    // the first batch: only the higher priority's annotation, the rest recorded for next
    let first_batch = s
        .wait("pods", "default", "web-0", "the first batch begun", |p| {
            p["metadata"]["annotations"]["a"] == "2"
        })
        .await;
    assert_eq!(first_batch["metadata"]["annotations"]["b"], "1");
    let state: Value = serde_json::from_str(
        first_batch["metadata"]["annotations"]["apps.kruise.io/inplace-update-state"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        state["nextContainerRefMetadata"],
        json!({"second": {"annotations": {"b": "2"}}})
    );
    assert_eq!(
        state["preCheckBeforeNext"],
        json!({"containersRequiredReady": ["first"]})
    );
    let after = s.updated("web-0", "both batches").await;
    assert_eq!(
        (s.env(&after, "first", "A"), s.env(&after, "second", "B")),
        ("2".into(), "2".into())
    );
    assert_eq!(
        s.node.stopped_ids(),
        [
            runtime_id(&status(&before, "first")["containerID"]),
            runtime_id(&status(&before, "second")["containerID"]),
        ],
        "each restarted once, the higher priority first"
    );
    let state: Value = serde_json::from_str(
        after["metadata"]["annotations"]["apps.kruise.io/inplace-update-state"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    let batches: Vec<&Value> = state["containerBatchesRecord"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| &b["containers"])
        .collect();
    assert_eq!(batches, [&json!(["first"]), &json!(["second"])]);
    assert_in_place_finished(&s, &after);
    stop(&s, d).await;
}

/// Seen with kruise-manager 07169cf on the cluster layer,
/// `tests/cluster/kruise.rs::without_kruised_the_managers_env_update_waits_and_kruised_finishes_it_when_it_starts`
/// (README, "What running the real manager showed").
#[tokio::test]
async fn without_kruised_the_managers_env_update_waits_and_kruised_finishes_it_when_it_starts() {
    let t = template(vec![container(
        "main",
        "busybox:v1",
        &[("APP_CONFIG", "app-config")],
    )]);
    let s = Scene::start(&[("web-0", &t)], Timing::as_in_the_cluster_lab()).await;
    let before = s.updated("web-0", "the first pod").await;
    s.manager
        .set_template(WORKLOAD, t.clone().annotation("app-config", "v2"));
    // the manager starts the update: the pod out of service, the new annotation on it
    let waiting = s
        .wait(
            "pods",
            "default",
            "web-0",
            "the manager starting the update",
            |p| {
                p["metadata"]["annotations"]["app-config"] == "v2"
                    && condition(p, "InPlaceUpdateReady") == Some("False")
            },
        )
        .await;
    // then it has nothing more to do, and nobody on the node acts
    s.manager
        .wait_idle(LIMIT)
        .await
        .expect("the manager settles with the update begun");
    let still = s.pod("web-0");
    assert_eq!(
        status(&still, "main")["restartCount"],
        0,
        "nothing restarted it"
    );
    assert_eq!(
        status(&still, "main")["containerID"],
        status(&waiting, "main")["containerID"]
    );
    assert_eq!(
        s.manager.workload_status(WORKLOAD).updated_ready_replicas,
        0,
        "the update is not finished without the daemon"
    );
    assert!(s.node.stopped_ids().is_empty());

    let d = s.kruised().await;
    let after = s.updated("web-0", "the update, once kruised runs").await;
    assert_eq!(status(&after, "main")["restartCount"], 1);
    assert_eq!(s.env(&after, "main", "APP_CONFIG"), "v2");
    assert_in_place_finished(&s, &after);
    assert_eq!(
        s.node.stopped_ids(),
        [runtime_id(&status(&before, "main")["containerID"])]
    );
    stop(&s, d).await;
}

// === ImagePullJob → NodeImage ===

/// A `kubernetes.io/dockerconfigjson` secret of the user's with a login for `registry`.
async fn login_secret(s: &Scene, name: &str, registry: &str, password: &str) {
    let config = json!({"auths": {registry: {"username": "robot", "password": password}}});
    let secrets = kind("", "v1", "Secret");
    s.create(
        &secrets,
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name},
               "type": "kubernetes.io/dockerconfigjson",
               "data": {".dockerconfigjson": b64(&config.to_string())}}),
    )
    .await;
}

fn pull_job(name: &str, image: &str, secrets: &[&str]) -> Value {
    json!({"apiVersion": "apps.kruise.io/v1beta1", "kind": "ImagePullJob",
        "metadata": {"name": name},
        "spec": {"image": image, "pullSecrets": secrets, "parallelism": 1,
                 "completionPolicy": {"type": "Always", "activeDeadlineSeconds": 120},
                 "pullPolicy": {"backoffLimit": 1, "timeoutSeconds": 60}}})
}

/// Seen with kruise-manager 07169cf on the cluster layer,
/// `tests/cluster/kruise.rs::an_image_pull_job_is_pulled_by_kruised_and_succeeds_with_and_without_a_pull_secret`
/// (the secret copied into `kruise-daemon-config`, the job counted from the NodeImage).
#[tokio::test]
async fn an_image_pull_job_is_pulled_by_kruised_and_succeeds_with_and_without_a_pull_secret() {
    let s = Scene::start(&[], Timing::as_in_the_cluster_lab()).await;
    let d = s.kruised().await;
    let password = "pw-Mq4-never-print";
    let (public, private) = (
        "r.example/imagepull/busybox:v1",
        "secure.example:5001/secure/busybox:v1",
    );
    login_secret(&s, "regcred", "secure.example:5001", password).await;
    let jobs = kind("apps.kruise.io", "v1beta1", "ImagePullJob");
    s.create(&jobs, pull_job("public", public, &[])).await;
    s.create(&jobs, pull_job("private", private, &["regcred"]))
        .await;
    for name in ["public", "private"] {
        let job = s
            .wait(
                "apps.kruise.io/v1beta1/imagepulljobs",
                "default",
                name,
                "the job completing",
                |j| j["status"]["completionTime"].is_string(),
            )
            .await;
        let st = &job["status"];
        assert_eq!(st["succeeded"], 1, "{name}: {st:#}");
        assert_eq!(st["failed"], 0, "{name}: {st:#}");
        assert_eq!(st["message"], "job has completed");
    }
    {
        let st = s.node.cri.state();
        for image in [public, private] {
            assert!(st.find_image(image).is_some(), "{image} is on the node");
        }
        let auth_of = |image: &str| {
            st.pulls
                .iter()
                .find(|p| p.image == image)
                .and_then(|p| p.auth.clone())
                .map(|a| (a.username, a.password))
        };
        assert_eq!(auth_of(public), None);
        assert_eq!(
            auth_of(private),
            Some(("robot".to_string(), password.to_string())),
            "pulled with the login of the user's secret, through its copy"
        );
    }
    // what the manager wrote and kruised accepted: a copy of the secret for the daemon, and a
    // tag as the NodeImage webhook requires it
    let copies = s.node.api.list("secrets", Some(DAEMON_CONFIG_NS));
    assert_eq!(copies.len(), 1, "{copies:#?}");
    let a = &copies[0]["metadata"]["annotations"];
    assert_eq!(a["imagepulljobs.kruise.io/source-key"], "default/regcred");
    assert_eq!(a["imagepulljobs.kruise.io/mode"], "batch");
    assert_eq!(a["imagepulljobs.kruise.io/references"], "default/private");
    let ni = s
        .node
        .api
        .get("apps.kruise.io/v1beta1/nodeimages", "", NODE)
        .unwrap();
    let image = &ni["spec"]["images"]["secure.example:5001/secure/busybox"];
    assert_eq!(image["pullSecrets"][0]["mode"], "batch", "{image:#}");
    let tag = &image["tags"][0];
    assert_eq!(tag["tag"], "v1");
    assert!(
        tag["pullPolicy"]["ttlSecondsAfterFinished"].is_i64(),
        "{tag:#}"
    );
    assert!(tag["createdAt"].is_string(), "{tag:#}");
    assert_eq!(tag["ownerReferences"][0]["kind"], "ImagePullJob");
    // the password never reaches the log
    assert!(!d.log_text().contains(password));
    stop(&s, d).await;
}

// === recreate requests ===

fn crrs() -> ApiResource {
    kind("apps.kruise.io", "v1beta1", "ContainerRecreateRequest")
}

const CRRS: &str = "apps.kruise.io/v1beta1/containerrecreaterequests";

fn request(name: &str, pod: &str, containers: &[&str]) -> Value {
    let containers: Vec<Value> = containers.iter().map(|c| json!({"name": c})).collect();
    json!({"apiVersion": "apps.kruise.io/v1beta1", "kind": "ContainerRecreateRequest",
           "metadata": {"name": name},
           "spec": {"podName": pod, "containers": containers}})
}

/// Seen with kruise-manager 07169cf on the cluster layer,
/// `tests/cluster/kruise.rs::a_users_recreate_request_is_filled_by_the_webhook_and_carried_out_by_kruised`.
#[tokio::test]
async fn a_users_recreate_request_is_filled_by_the_webhook_and_carried_out_by_kruised() {
    // a's preStop hook calls the test (host network) through a named port: the webhook copies
    // the hook, and the ports because the hook is an HTTP one
    let hooks = HookServer::start().await;
    let mut a = container("a", "busybox:v1", &[]);
    a["ports"] = json!([{"name": "hook", "containerPort": hooks.port}]);
    a["lifecycle"] = json!({"preStop": {"httpGet": {"path": "/hook/web-0/a", "port": "hook"}}});
    let t = template(vec![a, container("b", "busybox:v1", &[])]);
    let s = Scene::start(&[("web-0", &t)], Timing::as_in_the_cluster_lab()).await;
    let d = s.kruised().await;
    let pod = s.updated("web-0", "the pod").await;

    let mut r = request("again", "web-0", &["a", "b"]);
    r["spec"]["strategy"] = json!({"orderedRecreate": true});
    let made = s.create(&crrs(), r).await;
    // the manager's webhook filled in what a user leaves out
    let spec = &made.data["spec"];
    for (i, c) in ["a", "b"].iter().enumerate() {
        assert_eq!(
            spec["containers"][i]["statusContext"],
            json!({"containerID": status(&pod, c)["containerID"], "restartCount": 0}),
            "{spec:#}"
        );
    }
    assert_eq!(
        spec["containers"][0]["preStop"],
        json!({"httpGet": {"path": "/hook/web-0/a", "port": "hook"}})
    );
    assert_eq!(spec["containers"][0]["ports"][0]["name"], "hook");
    assert!(spec["containers"][1].get("preStop").is_none(), "{spec:#}");
    assert_eq!(spec["strategy"]["failurePolicy"], "Fail");
    let labels = made.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels["crr.apps.kruise.io/node-name"], NODE);
    assert_eq!(
        labels["crr.apps.kruise.io/pod-uid"],
        pod["metadata"]["uid"].as_str().unwrap()
    );
    assert_eq!(labels["crr.apps.kruise.io/active"], "true");

    let crr = s
        .wait(
            CRRS,
            "default",
            "again",
            "the request Completed and no longer active",
            |o| {
                o["status"]["phase"] == "Completed"
                    && o["metadata"]["labels"]["crr.apps.kruise.io/active"].is_null()
            },
        )
        .await;
    let states = crr["status"]["containerRecreateStates"].as_array().unwrap();
    assert_eq!(states.len(), 2, "{states:#?}");
    assert!(
        states.iter().all(|s| s["phase"] == "Succeeded"),
        "{states:#?}"
    );
    assert!(
        crr["status"].get("message").is_none(),
        "{:#}",
        crr["status"]
    );
    let after = s.pod("web-0");
    for c in ["a", "b"] {
        assert_eq!(status(&after, c)["restartCount"], 1, "{c} recreated once");
    }
    assert_eq!(hooks.count("web-0", "a"), 1, "a's preStop hook ran once");
    assert_eq!(s.node.stopped_ids().len(), 2);
    stop(&s, d).await;
}

/// The order the daemon completed `names` in: its status writes, as the API double logged them.
fn completion_order(s: &Scene, names: &[&str]) -> Vec<String> {
    s.node
        .api
        .requests()
        .iter()
        .filter(|r| r.resource == "containerrecreaterequests/status")
        .filter(|r| r.json()["status"]["phase"] == "Completed")
        .filter_map(|r| r.name.clone())
        .filter(|n| names.contains(&n.as_str()))
        .collect()
}

/// Waits until every request of `names` is Completed with each container Succeeded.
async fn all_succeeded(s: &Scene, names: &[&str]) {
    for name in names {
        s.wait(
            CRRS,
            "default",
            name,
            "the request Completed, its containers Succeeded",
            |o| {
                o["status"]["phase"] == "Completed"
                    && o["status"]["containerRecreateStates"]
                        .as_array()
                        .is_some_and(|st| {
                            !st.is_empty() && st.iter().all(|c| c["phase"] == "Succeeded")
                        })
            },
        )
        .await;
    }
}

/// Requests for one pod made together (the field case of kruise issues #1058 and #1626, where a
/// second request stayed Pending for ever on kruise-daemon): each is Completed, in creation
/// order (the daemon serialises a pod's requests; the manager does not, kruise 07169cf
/// crr_daemon_controller.go:276-305), and kruise's rule lets requests made before
/// one recreation share it: a container whose ID changed since the request's statusContext is
/// recreated already (crr_daemon_util.go:60-136).
async fn requests_made_together(n: usize) {
    let t = template(vec![container("main", "busybox:v1", &[])]);
    let s = Scene::start(&[("web-0", &t)], Timing::as_in_the_cluster_lab()).await;
    let d = s.kruised().await;
    s.updated("web-0", "the pod").await;
    let names: Vec<String> = (1..=n).map(|i| format!("r{i}")).collect();
    for name in &names {
        s.create(&crrs(), request(name, "web-0", &["main"])).await;
    }
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    all_succeeded(&s, &names).await;
    assert_eq!(
        completion_order(&s, &names),
        names,
        "completed in creation order"
    );
    assert_eq!(
        status(&s.pod("web-0"), "main")["restartCount"],
        1,
        "one recreation for requests made together"
    );
    assert_eq!(s.node.stopped_ids().len(), 1, "stopped once");
    stop(&s, d).await;
}

#[tokio::test]
async fn two_recreate_requests_made_together_both_complete_in_creation_order_on_one_restart() {
    requests_made_together(2).await;
}

#[tokio::test]
async fn three_recreate_requests_made_together_all_complete_in_creation_order_on_one_restart() {
    requests_made_together(3).await;
}

/// Requests for one pod made one after the other (kruise issues #1058, #1626): each is made
/// after the last recreation, so each recreates the container once more, never more.
#[tokio::test]
async fn recreate_requests_made_one_after_the_other_each_restart_the_container_once_more() {
    let t = template(vec![container("main", "busybox:v1", &[])]);
    let s = Scene::start(&[("web-0", &t)], Timing::as_in_the_cluster_lab()).await;
    let d = s.kruised().await;
    s.updated("web-0", "the pod").await;
    for (i, name) in ["r1", "r2", "r3"].iter().enumerate() {
        let made = s.create(&crrs(), request(name, "web-0", &["main"])).await;
        assert_eq!(
            made.data["spec"]["containers"][0]["statusContext"]["restartCount"], i,
            "the webhook took the container as it runs now"
        );
        all_succeeded(&s, &[name]).await;
        assert_eq!(status(&s.pod("web-0"), "main")["restartCount"], i + 1);
        assert_eq!(s.node.stopped_ids().len(), i + 1);
    }
    assert_eq!(
        completion_order(&s, &["r1", "r2", "r3"]),
        ["r1", "r2", "r3"]
    );
    stop(&s, d).await;
}

/// README, "What running the real manager showed": the webhook refuses a request whose creator
/// filled what it fills (kruise 07169cf crr_mutating_handler.go:320-374, its message's "ready-only"
/// sic), and the other refusals of its create path (:188-252) in its words.
#[tokio::test]
async fn a_request_whose_creator_filled_its_status_context_is_refused_with_kruises_ready_only_message()
 {
    let t = template(vec![container("main", "busybox:v1", &[])]);
    let s = Scene::start(&[("web-0", &t)], Timing::as_in_the_cluster_lab()).await;
    let pod = s.pod("web-0");
    let mut filled = request("filled", "web-0", &["main"]);
    filled["spec"]["containers"][0]["statusContext"] =
        json!({"containerID": status(&pod, "main")["containerID"], "restartCount": 0});
    let mut twice = request("twice", "web-0", &["main", "main"]);
    twice["spec"]["strategy"] = json!({"failurePolicy": "Ignore"});
    let mut short = request("short", "web-0", &["main"]);
    short["spec"]["activeDeadlineSeconds"] = json!(2);
    let cases = [
        (
            filled,
            "preStop, ports, statusContext in container are ready-only fields",
        ),
        (request("nopod", "", &["main"]), "podName can not be empty"),
        (
            request("gone", "web-9", &["main"]),
            "no found Pod named web-9",
        ),
        (
            request("none", "web-0", &[]),
            "containers list can not be null",
        ),
        (
            request("other", "web-0", &["nginx"]),
            "container nginx not found in Pod",
        ),
        (twice, "can not recreate main multi times"),
        (short, "activeDeadlineSeconds can not be less than 3s"),
    ];
    for (r, message) in cases {
        let name = r["metadata"]["name"].as_str().unwrap().to_string();
        match s.try_create(&crrs(), r).await {
            Err(kube::Error::Api(st)) => {
                assert_eq!(st.code, 400, "{name}: {st:?}");
                assert_eq!(
                    st.message,
                    format!("admission webhook \"{CRR_WEBHOOK}\" denied the request: {message}"),
                    "{name}"
                );
            }
            other => panic!("{name}: not refused: {other:?}"),
        }
        assert!(
            s.node.api.get(CRRS, "default", &name).is_none(),
            "{name} not stored"
        );
    }
    // the spec is immutable once made (:171-186)
    s.create(&crrs(), request("made", "web-0", &["main"])).await;
    let changed = s
        .api(&crrs())
        .patch(
            "made",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"podName": "web-1"}})),
        )
        .await;
    match changed {
        Err(kube::Error::Api(st)) => assert_eq!(
            (st.code, st.message.as_str()),
            (
                403,
                "admission webhook \"mcontainerrecreaterequest.kb.io\" denied the request: \
                 spec of ContainerRecreateRequest is immutable"
            )
        ),
        other => panic!("the spec changed: {other:?}"),
    }
    assert_eq!(s.manager.errors(), Vec::<String>::new());
}

/// The manager ends a request at its `activeDeadlineSeconds`, counted from its creation, and
/// deletes it `ttlSecondsAfterFinished` after its completion (kruise 07169cf
/// crr_controller.go:167-178,200-207); no daemon runs, and the deadline comes before the
/// manager's response timeout.
#[tokio::test]
async fn a_request_past_its_deadline_is_completed_by_the_manager_and_deleted_after_its_ttl() {
    let t = template(vec![container("main", "busybox:v1", &[])]);
    let s = Scene::start(&[("web-0", &t)], Timing::as_in_the_cluster_lab()).await;
    let mut r = request("late", "web-0", &["main"]);
    r["spec"]["activeDeadlineSeconds"] = json!(3);
    r["spec"]["ttlSecondsAfterFinished"] = json!(1);
    s.create(&crrs(), r).await;
    let crr = s
        .wait(CRRS, "default", "late", "the manager ending it", |o| {
            o["status"]["phase"] == "Completed"
        })
        .await;
    assert_eq!(
        crr["status"]["message"],
        "recreating has exceeded the activeDeadlineSeconds"
    );
    s.node
        .api
        .wait_for(LIMIT, |v| v.get(CRRS, "default", "late").is_none())
        .await
        .expect("the request deleted after its TTL");
    assert_eq!(s.manager.errors(), Vec::<String>::new());
}

/// The manager completes a request no daemon answers (kruise 07169cf crr_controller.go:190-197,
/// `responseTimeout`, here shortened), and only once its phase stayed empty that long.
#[tokio::test]
async fn a_request_no_daemon_answers_is_completed_by_the_manager_after_its_response_timeout() {
    let timing = Timing {
        crr_response_timeout: Duration::from_secs(2),
        ..Timing::as_in_the_cluster_lab()
    };
    let t = template(vec![container("main", "busybox:v1", &[])]);
    let s = Scene::start(&[("web-0", &t)], timing).await;
    let made_at = std::time::Instant::now();
    s.create(&crrs(), request("unanswered", "web-0", &["main"]))
        .await;
    let crr = s
        .wait(
            CRRS,
            "default",
            "unanswered",
            "the manager completing it",
            |o| o["status"]["phase"] == "Completed",
        )
        .await;
    assert!(
        made_at.elapsed() >= Duration::from_secs(1),
        "not before its timeout"
    );
    assert_eq!(
        crr["status"]["message"],
        "daemon has not responded for a long time"
    );
    assert!(s.node.stopped_ids().is_empty());
}

// === NodeImage webhook and controller ===

/// README, "What running the real manager showed": the webhook refuses a NodeImage tag without
/// `pullPolicy.ttlSecondsAfterFinished` (kruise 07169cf pkg/webhook/nodeimage/validating/
/// nodeimage_create_update_handler.go:145-147), after its mutating webhook defaulted the rest.
#[tokio::test]
async fn a_node_image_tag_without_a_ttl_is_refused_by_the_managers_webhook() {
    let s = Scene::start(&[], Timing::as_in_the_cluster_lab()).await;
    s.wait(
        "apps.kruise.io/v1beta1/nodeimages",
        "",
        NODE,
        "the node's NodeImage",
        |_| true,
    )
    .await;
    let node_images: Api<DynamicObject> = Api::all_with(
        s.user.clone(),
        &kind("apps.kruise.io", "v1beta1", "NodeImage"),
    );
    let tag = |ttl: Option<i64>| {
        let mut t = json!({"tag": "v1", "version": 0});
        if let Some(ttl) = ttl {
            t["pullPolicy"] = json!({"ttlSecondsAfterFinished": ttl});
        }
        json!({"spec": {"images": {"r.io/app": {"tags": [t]}}}})
    };
    let refused = node_images
        .patch(NODE, &PatchParams::default(), &Patch::Merge(&tag(None)))
        .await;
    match refused {
        Err(kube::Error::Api(st)) => assert_eq!(
            (st.code, st.message),
            (
                400,
                format!(
                    "admission webhook \"{NODE_IMAGE_VALIDATING_WEBHOOK}\" denied the request: \
                     pullPolicy.ttlSecondsAfterFinished for r.io/app/v1 must set"
                )
            )
        ),
        other => panic!("a tag without a TTL was taken: {other:?}"),
    }
    let taken = node_images
        .patch(
            NODE,
            &PatchParams::default(),
            &Patch::Merge(&tag(Some(300))),
        )
        .await
        .expect("a tag with a TTL is taken");
    let t = &taken.data["spec"]["images"]["r.io/app"]["tags"][0];
    assert!(t["createdAt"].is_string(), "createdAt defaulted: {t:#}");
    assert_eq!(t["pullPolicy"]["timeoutSeconds"], 600, "{t:#}");
    assert_eq!(t["pullPolicy"]["backoffLimit"], 3, "{t:#}");
}

/// README, "What running the real manager showed": the manager fails a tag no node reports,
/// after its response timeout from `createdAt` (kruise 07169cf nodeimage_controller.go:73,405-535;
/// 10 minutes, here shortened), and the job counts it failed.
#[tokio::test]
async fn a_tag_no_node_answers_is_failed_by_the_manager_after_its_response_timeout() {
    let timing = Timing {
        node_image_response_timeout: Duration::from_secs(2),
        ..Timing::as_in_the_cluster_lab()
    };
    let s = Scene::start(&[], timing).await;
    let jobs = kind("apps.kruise.io", "v1beta1", "ImagePullJob");
    s.create(&jobs, pull_job("unanswered", "r.example/app:v1", &[]))
        .await;
    let job = s
        .wait(
            "apps.kruise.io/v1beta1/imagepulljobs",
            "default",
            "unanswered",
            "the job completing",
            |j| j["status"]["completionTime"].is_string(),
        )
        .await;
    assert_eq!(job["status"]["failed"], 1, "{:#}", job["status"]);
    assert_eq!(job["status"]["failedNodes"], json!([NODE]));
    let ni = s
        .node
        .api
        .get("apps.kruise.io/v1beta1/nodeimages", "", NODE)
        .unwrap();
    let st = &ni["status"]["imageStatuses"]["r.example/app"]["tags"][0];
    assert_eq!(st["phase"], "Failed", "{st:#}");
    assert_eq!(st["message"], "node has not responded for a long time");
    assert_eq!(s.manager.errors(), Vec::<String>::new());
}

// === pod probes ===

/// A server on the pod's network (the host's: loopback) answering every request `200 up`: the
/// TCP and HTTP probes' target.
async fn serve_up() -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                let _ = conn.read(&mut buf).await;
                let _ = conn
                    .write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nup\n",
                    )
                    .await;
            });
        }
    });
    port
}

/// Seen with kruise-manager 07169cf on the cluster layer,
/// `tests/cluster/kruise.rs::a_pod_probe_markers_exec_tcp_and_http_probes_set_the_pods_conditions_and_labels_and_follow_them`.
/// The exec probe's container stops answering (its command hangs past the probe's timeout) where
/// the cluster test made it fail by a file: the fake runtime runs no shell.
#[tokio::test]
async fn a_pod_probe_markers_exec_tcp_and_http_probes_set_the_pods_conditions_and_labels_and_follow_them()
 {
    let port = serve_up().await;
    let mut srv = container("srv", "busybox:v1", &[]);
    srv["ports"] = json!([{"name": "http", "containerPort": port}]);
    let t = template(vec![container("main", "busybox:v1", &[]), srv]);
    let s = Scene::start(&[("web-0", &t)], Timing::as_in_the_cluster_lab()).await;
    let d = s.kruised().await;
    s.updated("web-0", "the pod").await;

    let markers = kind("apps.kruise.io", "v1alpha1", "PodProbeMarker");
    s.create(
        &markers,
        json!({"apiVersion": "apps.kruise.io/v1alpha1", "kind": "PodProbeMarker",
            "metadata": {"name": "marker"},
            "spec": {"selector": {"matchLabels": {"app": "demo"}}, "probes": [
                {"name": "healthy", "containerName": "main",
                 "probe": {"exec": {"command": ["true"]}, "periodSeconds": 1,
                           "timeoutSeconds": 1, "failureThreshold": 1},
                 "podConditionType": "example.com/healthy",
                 "markerPolicy": [{"state": "Succeeded", "labels": {"example.com/healthy": "yes"}},
                                  {"state": "Failed", "labels": {"example.com/healthy": "no"}}]},
                {"name": "serving", "containerName": "srv",
                 "probe": {"tcpSocket": {"port": "http"}, "periodSeconds": 1, "failureThreshold": 1},
                 "podConditionType": "example.com/serving",
                 "markerPolicy": [{"state": "Succeeded", "labels": {"example.com/serving": "yes"}}]},
                {"name": "page", "containerName": "srv",
                 "probe": {"httpGet": {"port": port, "path": "/index.html", "scheme": "HTTP"},
                           "periodSeconds": 1, "failureThreshold": 1},
                 "podConditionType": "example.com/page"}]}}),
    )
    .await;
    let marked = |healthy: &'static str| {
        move |p: &Value| {
            let label = |k: &str| p["metadata"]["labels"][k].as_str();
            label("example.com/healthy") == Some(healthy)
                && condition(p, "example.com/healthy")
                    == Some(if healthy == "yes" { "True" } else { "False" })
                && label("example.com/serving") == Some("yes")
                && condition(p, "example.com/serving") == Some("True")
                && condition(p, "example.com/page") == Some("True")
        }
    };
    s.wait(
        "pods",
        "default",
        "web-0",
        "all three probes succeeded, marked",
        marked("yes"),
    )
    .await;
    // what the manager wrote for kruised: the pod's entry, its IP, the named port resolved
    let npp = s
        .node
        .api
        .get("apps.kruise.io/v1alpha1/nodepodprobes", "", NODE)
        .unwrap();
    let entry = &npp["spec"]["podProbes"][0];
    assert_eq!(entry["IP"], "127.0.0.1", "{npp:#}");
    let names: Vec<&str> = entry["probes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    assert_eq!(names, ["marker#healthy", "marker#serving", "marker#page"]);
    assert_eq!(entry["probes"][1]["probe"]["tcpSocket"]["port"], port);

    // the exec probe fails from now on: the marker follows
    s.node.cri.delay("ExecSync", Duration::from_secs(60));
    s.wait(
        "pods",
        "default",
        "web-0",
        "the exec probe failed, marked",
        marked("no"),
    )
    .await;
    s.node.cri.delay("ExecSync", Duration::ZERO);

    // a deleted marker's probes leave the node
    s.api(&markers)
        .delete("marker", &Default::default())
        .await
        .unwrap();
    s.wait(
        "apps.kruise.io/v1alpha1/nodepodprobes",
        "",
        NODE,
        "the marker's probes removed",
        |n| n["spec"]["podProbes"].as_array().is_none_or(Vec::is_empty),
    )
    .await;
    s.node
        .api
        .wait_for(LIMIT, |v| {
            v.get(
                "apps.kruise.io/v1alpha1/podprobemarkers",
                "default",
                "marker",
            )
            .is_none()
        })
        .await
        .expect("the marker gone once the manager removed its finalizer");
    stop(&s, d).await;
}
