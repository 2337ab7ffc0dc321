//! The image puller against the API-server double and the fake CRI runtime, over the real
//! protocols: NodeImage statuses, counters, versions, events, concurrency, pull secrets and the
//! next-batch pre-pull.

use std::ops::Deref;
use std::time::Duration;

use crate::pull_support::{
    CONFIG_NS, LIMIT, NODE, PullNode, b64, create_node_image, fast, next_batch_pod, owner, tag,
};
use crate::support::wait::{self, occurrences};
use kruised::controller::imagepull::Settings;
use kruised::cri::fake::{FakeRuntime, FakeState};
use kruised::k8s::crd::ImagePullPhase;
use serde_json::{Value, json};

/// The puller over the fake runtime.
struct Node {
    pull: PullNode,
    cri: FakeRuntime,
    _dir: tempfile::TempDir,
}

impl Deref for Node {
    type Target = PullNode;
    fn deref(&self) -> &PullNode {
        &self.pull
    }
}

impl Node {
    async fn start(settings: Settings) -> Node {
        let dir = tempfile::tempdir().unwrap();
        let cri = FakeRuntime::start(&dir.path().join("cri.sock"), "containerd")
            .await
            .unwrap();
        let pull = PullNode::start(settings, cri.endpoint()).await;
        Node {
            pull,
            cri,
            _dir: dir,
        }
    }
}

fn pulls_of(st: &FakeState, image: &str) -> usize {
    st.pulls.iter().filter(|p| p.image == image).count()
}

#[tokio::test]
async fn new_tags_report_waiting_and_pulling_then_succeed_with_counters_image_ids_and_events() {
    let node = Node::start(fast()).await;
    node.cri.delay("PullImage.body", Duration::from_millis(300));
    create_node_image(
        &node.api,
        json!({"r.io/app": {"tags": [
            {"tag": "v1", "version": 1, "ownerReferences": [owner()]},
            {"tag": "v2", "version": 1}
        ]}}),
        Some(
            json!({"desired": 0, "succeeded": 0, "failed": 0, "pulling": 0,
                    "firstSyncStatus": {"status": "Succeeded", "message": "manager's"}}),
        ),
    );
    // reported while the pulls run, well before they end
    let early = node
        .wait_status("Pulling reported", |s| s.pulling == 2)
        .await;
    assert_eq!(early.desired, 2);
    assert_eq!(tag(&early, "r.io/app", "v1").version, 1);
    assert!(tag(&early, "r.io/app", "v1").start_time.is_some());

    let s = node
        .wait_status("both Succeeded", |s| s.succeeded == 2)
        .await;
    assert_eq!(
        (s.desired, s.succeeded, s.failed, s.pulling, s.waiting),
        (2, 2, 0, 0, 0)
    );
    let ids: Vec<_> = node
        .cri
        .state()
        .images
        .values()
        .map(|i| (i.repo_tags.clone(), i.id.clone()))
        .collect();
    for t in ["v1", "v2"] {
        let ts = tag(&s, "r.io/app", t);
        let id = &ids
            .iter()
            .find(|(tags, _)| tags.contains(&format!("r.io/app:{t}")))
            .unwrap()
            .1;
        assert_eq!(ts.image_id, format!("r.io/app@{id}"));
        assert_eq!(ts.progress, 100);
        assert!(ts.completion_time.is_some());
    }
    assert_eq!(
        s.first_sync_status.unwrap().message,
        "manager's",
        "fields the daemon does not own are kept"
    );
    let (pulls_v1, sandbox) = {
        let st = node.cri.state();
        (
            pulls_of(&st, "r.io/app:v1"),
            st.pulls[0].sandbox.clone().unwrap(),
        )
    };
    assert_eq!(pulls_v1, 1);
    assert_eq!(
        sandbox.annotations["apps.kruise.io/pulling-image-by"],
        "kruise-daemon"
    );

    // one event per tag on the NodeImage, one more on the ImagePullJob of v1
    let events = wait::events(&node.api, LIMIT, "PullImageSucceed", 3).await;
    let on = |kind: &str| -> u64 {
        events
            .iter()
            .filter(|e| e["involvedObject"]["kind"] == kind)
            .map(occurrences)
            .sum()
    };
    assert_eq!((on("NodeImage"), on("ImagePullJob")), (2, 1), "{events:#?}");
    assert!(events.iter().all(|e| e["type"] == "Normal"));
    assert!(
        events.iter().any(|e| e["message"]
            .as_str()
            .unwrap()
            .starts_with("Image r.io/app:v1, elapsedTime")),
        "{events:#?}"
    );
}

#[tokio::test]
async fn a_failing_tag_ends_failed_after_backoff_limit_plus_one_attempts_with_the_runtimes_message()
{
    let node = Node::start(fast()).await;
    node.cri.fail_pulls_of(
        "r.io/app:bad",
        tonic::Code::NotFound,
        "failed to resolve reference \"r.io/app:bad\": r.io/app:bad: not found",
    );
    node.create_node_image(json!({"r.io/app": {"tags": [
        {"tag": "bad", "version": 1, "pullPolicy": {"backoffLimit": 2}, "ownerReferences": [owner()]}
    ]}}));
    let s = node.wait_status("Failed", |s| s.failed == 1).await;
    let t = tag(&s, "r.io/app", "bad");
    assert!(
        t.message.contains("r.io/app:bad: not found"),
        "{}",
        t.message
    );
    assert!(t.completion_time.is_some());
    assert_eq!((s.desired, s.succeeded, s.pulling, s.waiting), (1, 0, 0, 0));
    assert_eq!(pulls_of(&node.cri.state(), "r.io/app:bad"), 3);

    let events = wait::events(&node.api, LIMIT, "PullImageFailed", 2).await;
    assert!(events.iter().all(|e| e["type"] == "Warning"));
    let kinds: Vec<_> = events
        .iter()
        .map(|e| e["involvedObject"]["kind"].as_str().unwrap().to_string())
        .collect();
    assert!(
        kinds.contains(&"ImagePullJob".to_string()) && kinds.contains(&"NodeImage".to_string()),
        "{kinds:?}"
    );
    assert!(
        events[0]["message"]
            .as_str()
            .unwrap()
            .contains("r.io/app:bad: not found")
    );
}

#[tokio::test]
async fn bumping_the_version_pulls_again_and_reports_the_new_version() {
    let node = Node::start(fast()).await;
    node.create_node_image(json!({"r.io/app": {"tags": [{"tag": "v1", "version": 1}]}}));
    node.wait_status("v1 done", |s| s.succeeded == 1).await;
    assert_eq!(pulls_of(&node.cri.state(), "r.io/app:v1"), 1);

    node.set_images(json!({"r.io/app": {"tags": [{"tag": "v1", "version": 2}]}}));
    let s = node
        .wait_status("version 2 done", |s| {
            s.succeeded == 1
                && s.image_statuses
                    .get("r.io/app")
                    .is_some_and(|i| i.tags[0].version == 2)
        })
        .await;
    assert_eq!(tag(&s, "r.io/app", "v1").version, 2);
    assert_eq!(pulls_of(&node.cri.state(), "r.io/app:v1"), 2);
}

#[tokio::test]
async fn if_not_present_on_a_present_image_makes_no_pull_call() {
    let node = Node::start(fast()).await;
    let id = node.cri.state().add_image("docker.io/library/nginx:1.25");
    node.create_node_image(json!({
        "nginx": {"tags": [{"tag": "1.25", "version": 1, "imagePullPolicy": "IfNotPresent"}]},
        "docker.io/library/nginx": {"tags": [{"tag": "1.25", "version": 1, "imagePullPolicy": "IfNotPresent"}]}
    }));
    let s = node.wait_status("both done", |s| s.succeeded == 2).await;
    assert_eq!(tag(&s, "nginx", "1.25").image_id, format!("nginx@{id}"));
    assert_eq!(
        tag(&s, "docker.io/library/nginx", "1.25").image_id,
        format!("docker.io/library/nginx@{id}")
    );
    assert_eq!(node.cri.state().call_count("PullImage"), 0);
}

#[tokio::test]
async fn max_workers_2_with_6_tags_never_runs_more_than_2_pulls_at_once() {
    let node = Node::start(Settings {
        max_workers: Some(2),
        ..fast()
    })
    .await;
    node.cri.delay("PullImage.body", Duration::from_millis(150));
    let tags: Vec<Value> = (1..=6)
        .map(|i| json!({"tag": format!("v{i}"), "version": 1}))
        .collect();
    node.create_node_image(json!({"r.io/app": {"tags": tags}}));
    // the queue is reported: two pulling, four waiting
    node.wait_status("2 pulling, 4 waiting", |s| s.pulling == 2 && s.waiting == 4)
        .await;
    let s = node.wait_status("all done", |s| s.succeeded == 6).await;
    assert_eq!((s.pulling, s.waiting, s.failed), (0, 0, 0));
    let st = node.cri.state();
    assert_eq!(st.pulls.len(), 6);
    assert_eq!(st.max_concurrent_pulls, 2);
    drop(st);

    // writes were coalesced, and none repeated the status before it
    let writes = node.status_writes();
    assert!(writes.len() <= 8, "{} writes: {writes:#?}", writes.len());
    for pair in writes.windows(2) {
        assert_ne!(pair[0], pair[1], "an unchanged status was written again");
    }
}

#[tokio::test]
async fn identical_references_under_several_names_are_pulled_once() {
    let node = Node::start(fast()).await;
    node.cri.delay("PullImage.body", Duration::from_millis(200));
    node.create_node_image(json!({
        "nginx": {"tags": [{"tag": "1.25", "version": 1}]},
        "library/nginx": {"tags": [{"tag": "1.25", "version": 1}]},
        "docker.io/library/nginx": {"tags": [{"tag": "1.25", "version": 1}]}
    }));
    let s = node.wait_status("all done", |s| s.succeeded == 3).await;
    assert_eq!(node.cri.state().call_count("PullImage"), 1);
    let id = |name: &str| {
        tag(&s, name, "1.25")
            .image_id
            .split_once('@')
            .unwrap()
            .1
            .to_string()
    };
    assert_eq!(id("nginx"), id("docker.io/library/nginx"));
}

#[tokio::test]
async fn a_missing_pull_secret_is_reported_in_the_message_and_the_pull_goes_on() {
    let node = Node::start(fast()).await;
    node.create_node_image(json!({"r.io/app": {
        "pullSecrets": [{"namespace": CONFIG_NS, "name": "gone"}],
        "tags": [{"tag": "v1", "version": 1}]
    }}));
    let s = node.wait_status("done", |s| s.succeeded == 1).await;
    let t = tag(&s, "r.io/app", "v1");
    assert!(
        t.message
            .contains("pull secret kruise-daemon-config/gone not found"),
        "{}",
        t.message
    );
    assert_eq!(node.cri.state().pulls[0].auth, None, "anonymous");
}

#[tokio::test]
async fn the_matching_secret_is_sent_and_its_password_reaches_no_status_or_event() {
    let node = Node::start(fast()).await;
    let password = "pw-Zq7-never-print";
    let config = json!({"auths": {
        "r.io": {"username": "robot", "password": password},
        "other.io": {"username": "nobody", "password": "x"}
    }});
    node.api
        .create(
            "secrets",
            json!({"metadata": {"namespace": CONFIG_NS, "name": "regcred"},
                   "type": "kubernetes.io/dockerconfigjson",
                   "data": {".dockerconfigjson": b64(&config.to_string())}}),
        )
        .unwrap();
    // a registry that refuses, echoing what it got
    node.cri.fail_pulls_of(
        "r.io/app:denied",
        tonic::Code::Unknown,
        &format!("401 Unauthorized: bad credentials robot:{password}"),
    );
    node.create_node_image(json!({"r.io/app": {
        "pullSecrets": [{"namespace": CONFIG_NS, "name": "regcred"}],
        "tags": [{"tag": "v1", "version": 1},
                 {"tag": "denied", "version": 1, "pullPolicy": {"backoffLimit": 0}}]
    }}));
    let s = node
        .wait_status("one done, one failed", |s| {
            s.succeeded == 1 && s.failed == 1
        })
        .await;
    let auth = node
        .cri
        .state()
        .pulls
        .iter()
        .find(|p| p.image == "r.io/app:v1")
        .unwrap()
        .auth
        .clone()
        .unwrap();
    assert_eq!(
        (auth.username.as_str(), auth.password.as_str()),
        ("robot", password)
    );
    let failed = tag(&s, "r.io/app", "denied");
    assert!(
        failed.message.contains("401 Unauthorized"),
        "{}",
        failed.message
    );
    wait::events(&node.api, LIMIT, "PullImageFailed", 1).await;
    let everything = format!(
        "{} {}",
        serde_json::to_string(&node.api.get("nodeimages", "", NODE)).unwrap(),
        serde_json::to_string(&node.api.list("events", None)).unwrap()
    );
    assert!(!everything.contains(password), "{everything}");
}

/// Issue 43, row 16: a tag's owners are ImagePullJobs of any namespace sharing one pull, and the
/// image's `pullSecrets` are every job's. Each owner's failure event carried every secret's
/// problem: a tenant naming another's image learnt, in its own namespace, the names of the other
/// tenant's pull secrets and what was wrong with them (and the other tenant got this tenant's
/// in its namespace).
#[tokio::test]
async fn a_tag_two_tenants_share_tells_each_owner_of_its_own_secrets_problems_only() {
    let node = Node::start(fast()).await;
    for tenant in ["alpha", "bravo"] {
        node.api
            .create("namespaces", json!({"metadata": {"name": tenant}}))
            .unwrap();
    }
    // kruise-manager's copies of each tenant's pull secret, neither usable
    for (name, source) in [
        ("alpha-regcred-x7k2p", "alpha/regcred"),
        ("bravo-registry-login-q9w4d", "bravo/registry-login"),
    ] {
        node.api
            .create(
                "secrets",
                json!({"metadata": {"namespace": CONFIG_NS, "name": name,
                           "annotations": {"imagepulljobs.kruise.io/source-key": source}},
                       "type": "kubernetes.io/dockerconfigjson", "data": {}}),
            )
            .unwrap();
    }
    node.cri.fail_pulls_of(
        "r.io/app:v1",
        tonic::Code::NotFound,
        "failed to resolve reference \"r.io/app:v1\": r.io/app:v1: not found",
    );
    let job = |namespace: &str| {
        json!({"apiVersion": "apps.kruise.io/v1alpha1", "kind": "ImagePullJob",
               "namespace": namespace, "name": "pull", "uid": format!("u-{namespace}")})
    };
    node.create_node_image(json!({"r.io/app": {
        "pullSecrets": [{"namespace": CONFIG_NS, "name": "alpha-regcred-x7k2p"},
                        {"namespace": CONFIG_NS, "name": "bravo-registry-login-q9w4d"},
                        {"namespace": CONFIG_NS, "name": "gone-z1"}],
        "tags": [{"tag": "v1", "version": 1, "pullPolicy": {"backoffLimit": 0},
                  "ownerReferences": [job("alpha"), job("bravo")]}]
    }}));
    let events = wait::events(&node.api, LIMIT, "PullImageFailed", 3).await;
    let told = |kind: &str, namespace: Option<&str>| -> String {
        let e = events
            .iter()
            .find(|e| {
                e["involvedObject"]["kind"] == kind
                    && namespace.is_none_or(|ns| e["involvedObject"]["namespace"] == ns)
            })
            .unwrap_or_else(|| panic!("no event on {kind} {namespace:?}: {events:#?}"));
        if let Some(ns) = namespace {
            assert_eq!(e["metadata"]["namespace"], ns, "{e:#}");
        }
        e["message"].as_str().unwrap().to_string()
    };
    let (alpha, bravo) = (
        told("ImagePullJob", Some("alpha")),
        told("ImagePullJob", Some("bravo")),
    );
    // each is told of the pull's failure, which is theirs alike, and of its own secret
    for (message, own, other) in [
        (&alpha, "alpha-regcred-x7k2p", "bravo-registry-login"),
        (&bravo, "bravo-registry-login-q9w4d", "alpha-regcred"),
    ] {
        assert!(message.contains("r.io/app:v1: not found"), "{message}");
        assert!(message.contains(own), "its own secret's problem: {message}");
        assert!(
            !message.contains(other),
            "another tenant's secret: {message}"
        );
        assert!(
            !message.contains("gone-z1"),
            "a secret of nobody known: {message}"
        );
    }
    // the cluster's objects keep the whole story: the NodeImage's event and the tag's status
    let whole = told("NodeImage", None);
    let s = node.wait_status("failed", |s| s.failed == 1).await;
    let status = tag(&s, "r.io/app", "v1").message.clone();
    for message in [&whole, &status] {
        for name in [
            "alpha-regcred-x7k2p",
            "bravo-registry-login-q9w4d",
            "gone-z1",
        ] {
            assert!(message.contains(name), "{name} in {message}");
        }
    }
}

#[tokio::test]
async fn a_removed_tag_stops_and_its_status_goes_while_the_others_continue() {
    let node = Node::start(fast()).await;
    node.cri.delay("PullImage.body", Duration::from_secs(30));
    node.create_node_image(
        json!({"r.io/app": {"tags": [{"tag": "slow", "version": 1}]},
                                  "r.io/other": {"tags": [{"tag": "v1", "version": 1}]}}),
    );
    node.wait_status("both pulling", |s| s.pulling == 2).await;
    node.cri.delay("PullImage.body", Duration::ZERO);
    node.set_images(
        json!({"r.io/other": {"tags": [{"tag": "v1", "version": 1}, {"tag": "v2", "version": 1}]}}),
    );
    let s = node
        .wait_status("the removed image's status is gone", |s| {
            !s.image_statuses.contains_key("r.io/app") && s.desired == 2
        })
        .await;
    assert_eq!(s.image_statuses.len(), 1);
    // the new tag is pulled while the old slow pulls would still be running
    let s = node
        .wait_status("v2 done", |s| {
            s.image_statuses["r.io/other"]
                .tags
                .iter()
                .any(|t| t.tag == "v2" && t.phase == ImagePullPhase::Succeeded)
        })
        .await;
    assert!(!s.image_statuses.contains_key("r.io/app"));
    assert_eq!(
        node.events("PullImageFailed").len(),
        0,
        "a stopped task records nothing"
    );
}

#[tokio::test]
async fn a_restarted_puller_does_not_rewrite_a_status_that_is_already_right() {
    let node = Node::start(fast()).await;
    create_node_image(
        &node.api,
        json!({"r.io/app": {"tags": [{"tag": "v1", "version": 3}]}}),
        Some(
            json!({"desired": 1, "succeeded": 1, "failed": 0, "pulling": 0, "waiting": 0,
            "imageStatuses": {"r.io/app": {"tags": [{"tag": "v1", "phase": "Succeeded",
                "progress": 100, "version": 3, "imageID": "r.io/app@sha256:1",
                "startTime": "2025-01-01T00:00:00Z", "completionTime": "2025-01-01T00:00:01Z"}]}}}),
        ),
    );
    // a change after the first one: a new tag, which must be the first thing written
    node.set_images(
        json!({"r.io/app": {"tags": [{"tag": "v1", "version": 3}, {"tag": "v2", "version": 1}]}}),
    );
    let s = node.wait_status("v2 done", |s| s.succeeded == 2).await;
    assert_eq!(
        tag(&s, "r.io/app", "v1")
            .completion_time
            .unwrap()
            .0
            .to_string(),
        "2025-01-01T00:00:01Z"
    );
    assert_eq!(pulls_of(&node.cri.state(), "r.io/app:v1"), 0);
    let writes = node.status_writes();
    assert!(!writes.is_empty());
    for w in &writes {
        let tags = w["status"]["imageStatuses"]["r.io/app"]["tags"]
            .as_array()
            .unwrap();
        assert!(
            tags.iter().any(|t| t["tag"] == "v2"),
            "a write without the new tag: {w}"
        );
    }
}

#[tokio::test]
async fn a_removed_image_key_is_deleted_from_the_status_with_null() {
    let node = Node::start(fast()).await;
    node.create_node_image(json!({"r.io/a": {"tags": [{"tag": "v1", "version": 1}]},
                                  "r.io/b": {"tags": [{"tag": "v1", "version": 1}]}}));
    node.wait_status("both done", |s| s.succeeded == 2).await;
    node.set_images(json!({"r.io/a": {"tags": [{"tag": "v1", "version": 1}]}}));
    let s = node
        .wait_status("b removed", |s| !s.image_statuses.contains_key("r.io/b"))
        .await;
    assert_eq!((s.desired, s.succeeded), (1, 1));
    let last = node.status_writes().pop().unwrap();
    assert_eq!(last["status"]["imageStatuses"]["r.io/b"], Value::Null);
}

#[tokio::test]
async fn the_next_in_place_batch_is_pre_pulled_after_the_nodeimage_work() {
    let node = Node::start(fast()).await;
    node.cri.state().add_image("r.io/present:v1");
    node.api
        .create(
            "pods",
            next_batch_pod(
                "default",
                "web-0",
                &[("sidecar", "r.io/next:v2"), ("other", "r.io/present:v1")],
                true,
            ),
        )
        .unwrap();
    let pulled = |st: &FakeState| pulls_of(st, "r.io/next:v2");
    wait::cri(
        &node.cri,
        LIMIT,
        "the next batch's image pulled",
        pulled,
        |n| *n == 1,
    )
    .await;
    let st = node.cri.state();
    assert_eq!(
        pulls_of(&st, "r.io/present:v1"),
        0,
        "present images are not pulled"
    );
    assert_eq!(
        st.pulls[0].sandbox.as_ref().unwrap().annotations["apps.kruise.io/pulling-image-by"],
        "kruise-daemon"
    );
}

// The next-batch pre-pull takes the wanted images in order of their normalised reference, one
// at a time (src/controller/imagepull/prepull.rs, `run`). So once an image that sorts last has
// been pulled, every image the daemon wanted at that moment and that sorts before it has been
// tried: the tests below prove "not pulled" by waiting for such a last image, not for time.

#[tokio::test]
async fn a_pod_not_owned_by_a_kruise_workload_gets_no_pre_pull() {
    let node = Node::start(fast()).await;
    // anyone who can create a pod can write the annotation; only kruise's workloads are heard
    node.api
        .create(
            "pods",
            next_batch_pod("tenant-a", "bare", &[("c", "r.io/a-unowned:v2")], false),
        )
        .unwrap();
    node.api
        .create(
            "pods",
            next_batch_pod("tenant-a", "web-0", &[("c", "r.io/z-owned:v2")], true),
        )
        .unwrap();
    let pulled = |st: &FakeState| pulls_of(st, "r.io/z-owned:v2");
    wait::cri(
        &node.cri,
        LIMIT,
        "the owned pod's next image pulled",
        pulled,
        |n| *n == 1,
    )
    .await;
    assert_eq!(pulls_of(&node.cri.state(), "r.io/a-unowned:v2"), 0);
}

#[tokio::test]
async fn another_tenants_secret_is_not_borrowed_for_a_pods_next_batch() {
    use crate::pull_support::create_secret;

    let node = Node::start(fast()).await;
    // tenant-b pulls its private repository through an ImagePullJob: kruise-manager's copy of
    // its secret, and a secret an admin made by hand, both named by the NodeImage entry
    create_secret(
        &node.api,
        "regcred-b-x1",
        Some("tenant-b/regcred"),
        "r.io",
        "robot-b",
        "pw-b",
    );
    create_secret(&node.api, "by-hand", None, "r.io", "admin", "pw-admin");
    node.create_node_image(json!({"r.io/private": {
        "pullSecrets": [{"namespace": CONFIG_NS, "name": "regcred-b-x1"},
                        {"namespace": CONFIG_NS, "name": "by-hand"}],
        "tags": [{"tag": "v1", "version": 1}]
    }}));
    node.wait_status("the NodeImage tag done", |s| s.succeeded == 1)
        .await;
    // tenant-a asks for tenant-b's private tags; tenant-b for one of its own
    node.api
        .create(
            "pods",
            next_batch_pod("tenant-a", "web-0", &[("c", "r.io/private:v2")], true),
        )
        .unwrap();
    node.api
        .create(
            "pods",
            next_batch_pod("tenant-b", "web-0", &[("c", "r.io/private:v3")], true),
        )
        .unwrap();
    let tried = |st: &FakeState| {
        (
            pulls_of(st, "r.io/private:v2"),
            pulls_of(st, "r.io/private:v3"),
        )
    };
    wait::cri(
        &node.cri,
        LIMIT,
        "both next images tried",
        tried,
        |&(v2, v3)| v2 >= 1 && v3 >= 1,
    )
    .await;
    let st = node.cri.state();
    let auths = |image: &str| -> Vec<Option<String>> {
        st.pulls
            .iter()
            .filter(|p| p.image == image)
            .map(|p| p.auth.as_ref().map(|a| a.username.clone()))
            .collect()
    };
    assert_eq!(
        auths("r.io/private:v1"),
        [Some("robot-b".to_string())],
        "the NodeImage pull"
    );
    assert_eq!(
        auths("r.io/private:v2"),
        [None],
        "tenant-a pulls anonymously"
    );
    assert_eq!(
        auths("r.io/private:v3"),
        [Some("robot-b".to_string())],
        "tenant-b with its own copy"
    );
}

#[tokio::test]
async fn a_pod_listing_1000_images_pre_pulls_at_most_its_share() {
    use kruised::controller::imagepull::prepull::plan::MAX_IMAGES_PER_POD;

    let node = Node::start(fast()).await;
    let images: Vec<(String, String)> = (0..1000)
        .map(|i| (format!("c{i:04}"), format!("r.io/i{i:04}:v1")))
        .collect();
    let next: Vec<(&str, &str)> = images
        .iter()
        .map(|(c, i)| (c.as_str(), i.as_str()))
        .collect();
    node.api
        .create("pods", next_batch_pod("tenant-a", "greedy", &next, true))
        .unwrap();
    let pulled_of_greedy = |st: &FakeState| {
        st.pulls
            .iter()
            .filter(|p| p.image.starts_with("r.io/i"))
            .count()
    };
    let share = "the greedy pod's share pulled";
    wait::cri(&node.cri, LIMIT, share, pulled_of_greedy, |n| {
        *n == MAX_IMAGES_PER_POD
    })
    .await;
    // a later pod's image, which sorts after every one of the greedy pod's
    node.api
        .create(
            "pods",
            next_batch_pod("tenant-b", "web-0", &[("c", "r.io/zzz-last:v1")], true),
        )
        .unwrap();
    let pulled = |st: &FakeState| pulls_of(st, "r.io/zzz-last:v1");
    wait::cri(
        &node.cri,
        LIMIT,
        "the later pod's image pulled",
        pulled,
        |n| *n == 1,
    )
    .await;
    let st = node.cri.state();
    assert_eq!(pulled_of_greedy(&st), MAX_IMAGES_PER_POD);
    for i in 0..MAX_IMAGES_PER_POD {
        assert_eq!(
            pulls_of(&st, &format!("r.io/i{i:04}:v1")),
            1,
            "the first containers by name"
        );
    }
}

#[tokio::test]
async fn pull_secrets_are_cached_briefly_missing_ones_are_looked_up_again_and_failures_reread() {
    use kruised::controller::imagepull::secrets::{Credentials, SecretStore};
    use kruised::k8s::crd::ReferenceObject;

    let node = Node::start(fast()).await;
    let client = kruised::k8s::client::build(&kruised::k8s::client::ClientSettings {
        kubeconfig: Some(node.kubeconfig.clone()),
        qps: 1000.0,
        burst: 1000,
        versions: Default::default(),
    })
    .await
    .unwrap();
    let store = SecretStore::new(client, CONFIG_NS);
    let refs = [ReferenceObject {
        namespace: CONFIG_NS.into(),
        name: "late".into(),
        ..Default::default()
    }];
    let users = |r: &kruised::controller::imagepull::secrets::Resolved| -> Vec<String> {
        r.keyring
            .lookup("r.io/app")
            .into_iter()
            .map(|c| c.username)
            .collect()
    };

    let r = store.resolve(&refs).await;
    assert_eq!(
        r.problems_text(),
        "pull secret kruise-daemon-config/late not found"
    );
    // created after the first look: found on the next one
    node.create_secret("late", "r.io", "first", "pw-1");
    let r = store.resolve(&refs).await;
    assert!(r.problems.is_empty(), "{:?}", r.problems);
    assert_eq!(users(&r), ["first"]);

    // a change is not seen while the read is fresh ...
    node.api.delete("secrets", CONFIG_NS, "late").unwrap();
    node.create_secret("late", "r.io", "second", "pw-2");
    let gets = node.api.request_count("get", "secrets");
    assert_eq!(users(&store.resolve(&refs).await), ["first"]);
    assert_eq!(
        node.api.request_count("get", "secrets"),
        gets,
        "served from the cache"
    );
    // ... until a failed pull drops it
    store.invalidate(&refs);
    assert_eq!(users(&store.resolve(&refs).await), ["second"]);
}
