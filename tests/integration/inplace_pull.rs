//! The in-place pull (src/controller/imagepull/inplace.rs) against the API-server double and the
//! fake CRI runtime: a pod's next image is pulled when kruise-manager's grace annotation
//! appears (before the spec changes), or when the spec's image changes, only for pods a kruise
//! workload controls, and several pods' pulls run at once.
//!
//! "Not pulled" is proven without waiting for time: the in-place pull plans every pod of the
//! node at each change of any of them, so once a pull asked for by a pod created (or changed)
//! later has started, every pod before it has been planned.

use std::ops::Deref;
use std::time::Duration;

use crate::pull_support::{LIMIT, NODE, PullNode, fast};
use crate::support::kubelet::status::{Report, set_containers, update_container};
use crate::support::wait;
use kruised::controller::imagepull::Settings;
use kruised::cri::fake::{FakeRuntime, FakeState};
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

    /// Creates `pod`.
    fn create(&self, pod: Value) {
        self.api.create("pods", pod).unwrap();
    }

    /// Creates the pod `namespace/name` (of a kruise workload when `kruise_owned`) whose one
    /// container `c` runs `image`.
    fn create_running(
        &self,
        namespace: &str,
        name: &str,
        c: &str,
        image: &str,
        kruise_owned: bool,
    ) {
        self.create(pod(namespace, name, &[(c, image, image)], kruise_owned));
    }

    /// kruise-manager's grace annotation on the pod `namespace/name`: its container `c` is to
    /// run `next`.
    fn grace(&self, namespace: &str, name: &str, c: &str, next: &str) {
        self.modify(namespace, name, |p| set_grace(p, &[(c, next)]));
    }

    /// Changes the pod `namespace/name` with `f`.
    fn modify(&self, namespace: &str, name: &str, f: impl FnOnce(&mut Value)) {
        self.api.modify("pods", namespace, name, f).unwrap();
    }

    /// Waits until `image` has been sent to `PullImage` `n` times.
    async fn pulled(&self, image: &str, n: usize, what: &str) {
        wait::cri(
            &self.cri,
            LIMIT,
            what,
            |st| pulls_of(st, image),
            |m| *m == n,
        )
        .await;
    }
}

fn pulls_of(st: &FakeState, image: &str) -> usize {
    st.pulls.iter().filter(|p| p.image == image).count()
}

/// A running pod of this node whose containers (name, spec image, image its status reports)
/// run; controlled by the CloneSet `web` when `kruise_owned`, by nothing otherwise.
fn pod(
    namespace: &str,
    name: &str,
    containers: &[(&str, &str, &str)],
    kruise_owned: bool,
) -> Value {
    let specs: Vec<Value> = containers
        .iter()
        .map(|(c, image, _)| json!({"name": c, "image": image}))
        .collect();
    let mut pod = json!({
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"nodeName": NODE, "containers": specs},
        "status": {"phase": "Running"}
    });
    let reports: Vec<Report> = containers
        .iter()
        .map(|(c, _, running)| Report {
            image: running.to_string(),
            ..Report::ready(c, &format!("containerd://{name}-{c}"), 0)
        })
        .collect();
    set_containers(&mut pod, &reports);
    if kruise_owned {
        pod["metadata"]["ownerReferences"] = json!([{
            "apiVersion": "apps.kruise.io/v1alpha1", "kind": "CloneSet", "name": "web",
            "uid": format!("uid-web-{namespace}"), "controller": true, "blockOwnerDeletion": true
        }]);
    }
    pod
}

/// kruise-manager's grace annotation (its `UpdateSpec`, kruise 07169cf) for `images`
/// (container, image).
fn grace(images: &[(&str, &str)]) -> String {
    let m: serde_json::Map<String, Value> = images
        .iter()
        .map(|(c, i)| (c.to_string(), json!(i)))
        .collect();
    json!({"revision": "web-r2", "containerImages": m, "graceSeconds": 15}).to_string()
}

/// Sets the grace annotation, as kruise-manager's first in-place write with a grace period.
fn set_grace(pod: &mut Value, images: &[(&str, &str)]) {
    pod["metadata"]["annotations"]["apps.kruise.io/inplace-update-grace"] = json!(grace(images));
}

/// Applies the update to the spec of container `c`, as kruise-manager when the grace period
/// ends (the grace annotation removed), or at once without one.
fn set_image(pod: &mut Value, c: usize, image: &str) {
    let annotations = pod["metadata"].get_mut("annotations");
    if let Some(a) = annotations.and_then(Value::as_object_mut) {
        a.remove("apps.kruise.io/inplace-update-grace");
    }
    pod["spec"]["containers"][c]["image"] = json!(image);
}

#[tokio::test]
async fn the_next_image_is_pulled_when_the_grace_annotation_appears_before_the_spec_changes() {
    let node = Node::start(fast()).await;
    node.create_running("default", "web-0", "main", "r.io/app:v1", true);
    node.grace("default", "web-0", "main", "r.io/app:v2");
    node.pulled(
        "r.io/app:v2",
        1,
        "the next image pulled at the grace annotation",
    )
    .await;
    let spec = node.api.get("pods", "default", "web-0").unwrap();
    assert_eq!(
        spec["spec"]["containers"][0]["image"], "r.io/app:v1",
        "the spec has not changed yet"
    );
    // the grace period ends: the spec changes; the image is there, so nothing more is pulled,
    // as a later pod's pull shows
    node.modify("default", "web-0", |p| set_image(p, 0, "r.io/app:v2"));
    node.create_running("default", "web-1", "main", "r.io/late:v1", true);
    node.modify("default", "web-1", |p| set_image(p, 0, "r.io/late:v2"));
    node.pulled("r.io/late:v2", 1, "a later pod's next image pulled")
        .await;
    assert_eq!(pulls_of(&node.cri.state(), "r.io/app:v2"), 1);
}

#[tokio::test]
async fn the_next_image_is_pulled_when_the_spec_changes_without_a_grace_period() {
    let node = Node::start(fast()).await;
    // the status spells the image in full: the same image, nothing to pull
    node.create(pod(
        "default",
        "web-0",
        &[
            ("main", "r.io/app:v1", "r.io/app:v1"),
            ("sidecar", "nginx:1.25", "docker.io/library/nginx:1.25"),
        ],
        true,
    ));
    node.modify("default", "web-0", |p| set_image(p, 0, "r.io/app:v2"));
    node.pulled("r.io/app:v2", 1, "the changed spec's image pulled")
        .await;
    let st = node.cri.state();
    assert_eq!(
        pulls_of(&st, "nginx:1.25"),
        0,
        "a running image asks for nothing"
    );
    assert_eq!(pulls_of(&st, "r.io/app:v1"), 0);
    assert_eq!(
        st.pulls[0].sandbox.as_ref().unwrap().annotations["apps.kruise.io/pulling-image-by"],
        "kruise-daemon"
    );
}

#[tokio::test]
async fn a_pod_no_kruise_workload_controls_gets_no_in_place_pull() {
    let node = Node::start(fast()).await;
    // anyone who can create a pod can write the annotation and change its image
    node.create_running("tenant-a", "bare", "c", "r.io/a:v1", false);
    node.grace("tenant-a", "bare", "c", "r.io/a-grace:v2");
    node.create_running("tenant-a", "bare-2", "c", "r.io/b:v1", false);
    node.modify("tenant-a", "bare-2", |p| set_image(p, 0, "r.io/b-spec:v2"));
    node.create_running("tenant-a", "web-0", "c", "r.io/z:v1", true);
    node.grace("tenant-a", "web-0", "c", "r.io/z-owned:v2");
    node.pulled("r.io/z-owned:v2", 1, "the owned pod's next image pulled")
        .await;
    let st = node.cri.state();
    assert_eq!(
        (
            pulls_of(&st, "r.io/a-grace:v2"),
            pulls_of(&st, "r.io/b-spec:v2")
        ),
        (0, 0)
    );
}

#[tokio::test]
async fn several_pods_next_images_are_pulled_at_once_not_one_after_another() {
    let node = Node::start(fast()).await;
    // pulls that take long enough to overlap if they are started together
    node.cri.delay("PullImage.body", Duration::from_secs(2));
    for n in 0..3 {
        let name = format!("web-{n}");
        node.create_running("default", &name, "main", "r.io/app:v1", true);
    }
    for n in 0..3 {
        let image = format!("r.io/app-{n}:v2");
        node.grace("default", &format!("web-{n}"), "main", &image);
    }
    wait::cri(
        &node.cri,
        LIMIT,
        "three pulls in flight together",
        |st| st.max_concurrent_pulls,
        |n| *n == 3,
    )
    .await;
}

#[tokio::test]
async fn the_in_place_pull_is_off_with_its_feature_gate() {
    let node = Node::start(Settings {
        prepull_in_place_update: false,
        ..fast()
    })
    .await;
    node.create_running("default", "web-0", "main", "r.io/app:v1", true);
    node.grace("default", "web-0", "main", "r.io/app:v2");
    // the next-batch pre-pull, still on, shows the pods were seen
    node.create(crate::pull_support::next_batch_pod(
        "default",
        "web-9",
        &[("c", "r.io/next:v2")],
        true,
    ));
    node.pulled("r.io/next:v2", 1, "the next batch's image pulled")
        .await;
    assert_eq!(pulls_of(&node.cri.state(), "r.io/app:v2"), 0);
}

#[tokio::test]
async fn a_pull_for_an_update_rolled_back_in_its_grace_period_is_stopped() {
    let node = Node::start(fast()).await;
    // long enough that the pull is still running when the update is rolled back
    node.cri.delay("PullImage.body", Duration::from_secs(60));
    node.create_running("default", "web-0", "main", "r.io/app:v1", true);
    node.grace("default", "web-0", "main", "r.io/app:v2");
    node.pulled("r.io/app:v2", 1, "the next image's pull started")
        .await;
    // a new revision: kruise-manager drops the grace spec; no pod names v2 any more
    node.modify("default", "web-0", |p| {
        p["metadata"]["annotations"]
            .as_object_mut()
            .map(|a| a.remove("apps.kruise.io/inplace-update-grace"));
    });
    node.create_running("default", "web-1", "main", "r.io/s:v1", true);
    node.modify("default", "web-1", |p| set_image(p, 0, "r.io/s:v2"));
    node.pulled("r.io/s:v2", 1, "a later pod's pull started")
        .await;
    // asked for again, v2 is pulled anew: the first pull was stopped, not joined
    node.grace("default", "web-0", "main", "r.io/app:v2");
    node.pulled("r.io/app:v2", 2, "the next image pulled anew")
        .await;
}

#[tokio::test]
async fn a_running_pull_goes_on_when_the_kubelet_takes_the_container_over() {
    let node = Node::start(fast()).await;
    node.cri.delay("PullImage.body", Duration::from_secs(1));
    node.create_running("default", "web-0", "main", "r.io/app:v1", true);
    node.modify("default", "web-0", |p| set_image(p, 0, "r.io/app:v2"));
    node.pulled("r.io/app:v2", 1, "the next image's pull started")
        .await;
    // the kubelet killed the old container and reports the new one waiting for its image: no
    // pod asks for v2 any more, but the pod still names it
    node.modify("default", "web-0", |p| {
        update_container(p, "main", |s| {
            s["image"] = json!("r.io/app:v2");
            s["state"] = json!({"waiting": {"reason": "ContainerCreating"}});
        });
    });
    wait::cri(
        &node.cri,
        LIMIT,
        "the pull finished",
        |st| st.find_image("r.io/app:v2").is_some(),
        |done| *done,
    )
    .await;
    assert_eq!(pulls_of(&node.cri.state(), "r.io/app:v2"), 1);
}
