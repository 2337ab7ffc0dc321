//! A node for the image-pull tests: the API-server double, a `Context` like the daemon's, and the
//! image puller started in-process over a given CRI endpoint (the fake runtime or the lab's
//! containerd), with its `PullImage` calls recorded; its waits are [`crate::wait`]'s.
//! Used by the integration and end-to-end image-pull tests and the `prepull` benchmark.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use k8s_openapi::api::core::v1::Pod;
use kruised::controller::Context;
use kruised::controller::imagepull::{self, Settings, metrics::Metrics, secrets::SecretStore};
use kruised::cri::{
    Endpoint, FilesystemUsage, Image, ImageService, PullRequest, RemoteRuntime, RuntimeHandle,
    Runtimes, Timeouts,
};
use kruised::k8s::crd::{ContainerRecreateRequest, ImageTagStatus, NodeImage, NodeImageStatus};
use kruised::k8s::{client, watch as kwatch};
use kruised::{Cli, Command};
use kube::Api;
use serde_json::{Value, json};
use tokio_util::sync::{CancellationToken, DropGuard};
use tokio_util::task::TaskTracker;

use crate::kubelet::status::{Report, set_containers};
use crate::wait;

/// Bound of every wait.
pub const LIMIT: Duration = Duration::from_secs(60);
/// The node's name.
pub const NODE: &str = "node-1";
/// Where pull secrets live.
pub const CONFIG_NS: &str = "kruise-daemon-config";

/// One `PullImage` call as the puller made it.
#[derive(Clone, Debug)]
pub struct PullCall {
    /// The reference sent.
    pub image: String,
    /// When the call started.
    pub started: Instant,
    /// When it returned.
    pub ended: Instant,
}

/// An image service that records the pulls and the images `ImageStatus` was asked about.
#[derive(Clone)]
pub struct Observed {
    inner: RemoteRuntime,
    pulls: Arc<Mutex<Vec<PullCall>>>,
    looks: Arc<Mutex<Vec<String>>>,
}

impl ImageService for Observed {
    async fn list_images(&self) -> kruised::cri::Result<Vec<Image>> {
        self.inner.list_images().await
    }
    async fn image_status(&self, image: &str) -> kruised::cri::Result<Option<Image>> {
        self.looks.lock().unwrap().push(image.to_string());
        self.inner.image_status(image).await
    }
    async fn pull_image(
        &self,
        request: PullRequest,
        timeout: Duration,
    ) -> kruised::cri::Result<String> {
        let image = request.image.clone();
        let started = Instant::now();
        let r = self.inner.pull_image(request, timeout).await;
        self.pulls.lock().unwrap().push(PullCall {
            image,
            started,
            ended: Instant::now(),
        });
        r
    }
    async fn remove_image(&self, image: &str) -> kruised::cri::Result<()> {
        self.inner.remove_image(image).await
    }
    async fn image_fs_info(&self) -> kruised::cri::Result<Vec<FilesystemUsage>> {
        self.inner.image_fs_info().await
    }
}

/// Short waits: backoff of milliseconds, quick status writes.
pub fn fast() -> Settings {
    Settings {
        backoff_base: Duration::from_millis(1),
        backoff_cap: Duration::from_millis(10),
        status_coalesce: Duration::from_millis(20),
        status_min_interval: Duration::from_millis(100),
        ..Settings::default()
    }
}

/// The API double and the image puller of one node.
pub struct PullNode {
    /// The API double.
    pub api: apiserver_double::Handle,
    /// A client of the runtime the puller uses.
    pub runtime: RemoteRuntime,
    /// A kubeconfig for the double.
    pub kubeconfig: PathBuf,
    pulls: Arc<Mutex<Vec<PullCall>>>,
    looks: Arc<Mutex<Vec<String>>>,
    /// Stops the puller with the node.
    _cancel: DropGuard,
    _dir: tempfile::TempDir,
}

impl PullNode {
    /// Starts the double and the puller over the runtime at `endpoint`.
    pub async fn start(settings: Settings, endpoint: Endpoint) -> PullNode {
        let crate::Plane { api, dir } = crate::Plane::start().await;
        let kubeconfig = dir.path().join("kubeconfig");
        let ep = endpoint.to_string();
        let cli = Cli::try_parse_from([
            "kruised",
            "run",
            "--node-name",
            NODE,
            "--runtime-endpoint",
            &ep,
            "--image-endpoint",
            &ep,
        ])
        .unwrap();
        let Command::Run(args) = cli.command else {
            panic!("not run")
        };
        let config = Arc::new(args.resolve().unwrap());
        let client = client::build(&client::ClientSettings {
            kubeconfig: Some(kubeconfig.clone()),
            qps: 1000.0,
            burst: 1000,
            versions: Default::default(),
        })
        .await
        .unwrap();
        let (readiness, cancel, tracker) = (
            kruised::admin::Readiness::new(),
            CancellationToken::new(),
            TaskTracker::new(),
        );
        let remote = RemoteRuntime::new(endpoint, None, Timeouts::default());
        let version = kruised::cri::RuntimeService::version(&remote)
            .await
            .unwrap();
        let runtimes = RuntimeHandle::found(Runtimes::single(version, remote.clone()));
        let liveness = kruised::health::Liveness::new();
        // the daemon's watches (`kruised::daemon`), each ready at once
        macro_rules! watch {
            ($name:literal, $kind:ty, $config:expr, $prune:expr) => {
                kwatch::spawn(
                    kwatch::WatchSpec::new(
                        $name,
                        Api::<$kind>::all(client.clone()),
                        $config,
                        $prune,
                    ),
                    readiness.condition($name),
                    cancel.clone(),
                    &tracker,
                    &liveness,
                    std::future::ready(()),
                )
            };
        }
        let ctx = Context {
            config,
            client: client.clone(),
            runtimes,
            pods: Some(watch!(
                "pods",
                Pod,
                kwatch::pods_of_node(NODE),
                kwatch::prune_pod
            )),
            node_images: watch!(
                "nodeimages",
                NodeImage,
                kwatch::named(NODE),
                kwatch::prune_managed_fields
            ),
            recreate_requests: watch!(
                "containerrecreaterequests",
                ContainerRecreateRequest,
                Default::default(),
                kwatch::prune_managed_fields
            ),
            pod_probes: None,
            cancel: cancel.clone(),
            tracker,
            liveness,
            readiness: readiness.clone(),
        };
        let pulls = Arc::new(Mutex::new(Vec::new()));
        let looks = Arc::new(Mutex::new(Vec::new()));
        let observed = Observed {
            inner: remote.clone(),
            pulls: pulls.clone(),
            looks: looks.clone(),
        };
        imagepull::run(
            &ctx,
            observed,
            Arc::new(SecretStore::new(client, CONFIG_NS)),
            settings,
            Metrics::unregistered(),
            Some(ctx.event_sink(imagepull::EVENT_COMPONENT)),
            None,
        );
        PullNode {
            api,
            runtime: remote,
            kubeconfig,
            pulls,
            looks,
            _cancel: cancel.drop_guard(),
            _dir: dir,
        }
    }

    /// Creates the NodeImage with `images` as its spec.
    pub fn create_node_image(&self, images: Value) {
        create_node_image(&self.api, images, None);
    }

    /// Replaces the NodeImage's `spec.images`.
    pub fn set_images(&self, images: Value) {
        self.api
            .modify("nodeimages", "", NODE, |o| o["spec"]["images"] = images)
            .unwrap();
    }

    /// The stored status.
    pub fn status(&self) -> Option<NodeImageStatus> {
        wait::node_image_status(self.api.get("nodeimages", "", NODE))
    }

    /// Waits until the stored status satisfies `pred`.
    pub async fn wait_status(
        &self,
        what: &str,
        pred: impl Fn(&NodeImageStatus) -> bool,
    ) -> NodeImageStatus {
        wait::node_image(&self.api, LIMIT, NODE, what, pred).await
    }

    /// The references the puller sent to `PullImage`, in order of their return.
    pub fn pulls(&self) -> Vec<String> {
        self.pull_calls().into_iter().map(|p| p.image).collect()
    }

    /// The puller's `PullImage` calls with their times.
    pub fn pull_calls(&self) -> Vec<PullCall> {
        self.pulls.lock().unwrap().clone()
    }

    /// The images the puller asked `ImageStatus` about, in order (the watch of the node's pods
    /// waiting for their image).
    pub fn image_status_calls(&self) -> Vec<String> {
        self.looks.lock().unwrap().clone()
    }

    /// Events with `reason`, as the core API shows them.
    pub fn events(&self, reason: &str) -> Vec<Value> {
        let events = self.api.list("events", None).into_iter();
        events.filter(|e| e["reason"] == reason).collect()
    }

    /// Bodies of the status writes received so far.
    pub fn status_writes(&self) -> Vec<Value> {
        self.api
            .requests()
            .into_iter()
            .filter(|r| r.resource == "nodeimages/status")
            .map(|r| r.json())
            .collect()
    }

    /// Creates a pull secret in the config namespace with a `.dockerconfigjson` for
    /// `registry`.
    pub fn create_secret(&self, name: &str, registry: &str, user: &str, password: &str) {
        create_secret(&self.api, name, None, registry, user, password);
    }
}

/// Creates the NodeImage of [`NODE`].
pub fn create_node_image(api: &apiserver_double::Handle, images: Value, status: Option<Value>) {
    let mut obj = json!({
        "apiVersion": "apps.kruise.io/v1alpha1", "kind": "NodeImage",
        "metadata": {"name": NODE},
        "spec": {"images": images},
    });
    if let Some(s) = status {
        obj["status"] = s;
    }
    api.create("nodeimages", obj).unwrap();
}

/// Creates this node's NodeImage with the one tag `name:tag`, at version 1.
pub fn create_one_tag(api: &apiserver_double::Handle, name: &str, tag: &str) {
    create_node_image(
        api,
        json!({ name: {"tags": [{"tag": tag, "version": 1}]}}),
        None,
    );
}

/// The annotation kruise-manager puts on its copy of a pull secret: `<namespace>/<name>` of the
/// secret it copied (kruise 07169cf, as the manager double writes it).
pub const SOURCE_KEY: &str = "imagepulljobs.kruise.io/source-key";

/// Creates a `kubernetes.io/dockerconfigjson` secret in the config namespace, as kruise-manager
/// copies one from `source` (`<namespace>/<name>`), or as made by hand (`None`).
pub fn create_secret(
    api: &apiserver_double::Handle,
    name: &str,
    source: Option<&str>,
    registry: &str,
    user: &str,
    password: &str,
) {
    let config = json!({"auths": {registry: {"username": user, "password": password}}});
    let mut secret = json!({"metadata": {"namespace": CONFIG_NS, "name": name},
           "type": "kubernetes.io/dockerconfigjson",
           "data": {".dockerconfigjson": b64(&config.to_string())}});
    if let Some(source) = source {
        secret["metadata"]["annotations"] = json!({ SOURCE_KEY: source });
    }
    api.create("secrets", secret).unwrap();
}

/// A tag behind a registry's login, pulled first with a wrong password: the secrets `wrong`
/// (`user`, `wrong`) and `right` (`user`, `password`) for `registry`, and a NodeImage tag
/// `name:v1` (version 1, owned by [`owner`], one attempt) naming `wrong`.
/// [`use_the_right_secret`] turns it to `right`.
pub fn create_tag_behind_a_login(
    api: &apiserver_double::Handle,
    registry: &str,
    user: &str,
    password: &str,
    wrong: &str,
    name: &str,
) {
    create_secret(api, "wrong", None, registry, user, wrong);
    create_secret(api, "right", None, registry, user, password);
    create_node_image(
        api,
        json!({ name: {"pullSecrets": [{"namespace": CONFIG_NS, "name": "wrong"}],
                       "tags": [{"tag": "v1", "version": 1, "ownerReferences": [owner()],
                                 "pullPolicy": {"backoffLimit": 0}}]}}),
        None,
    );
}

/// The tag of [`create_tag_behind_a_login`] names the secret `right`, at version 2: it is
/// pulled again.
pub fn use_the_right_secret(api: &apiserver_double::Handle, name: &str) {
    api.modify("nodeimages", "", NODE, |o| {
        o["spec"]["images"][name]["pullSecrets"][0]["name"] = json!("right");
        o["spec"]["images"][name]["tags"][0]["version"] = json!(2);
    })
    .unwrap();
}

/// A pending pod `namespace/name` of this node whose one container `app` waits
/// (`ContainerCreating`) to run `image`: a pod waiting for its own image.
pub fn waiting_pod(namespace: &str, name: &str, image: &str) -> Value {
    let mut pod = json!({
        "metadata": {"namespace": namespace, "name": name, "uid": format!("uid-{name}")},
        "spec": {"nodeName": NODE, "containers": [{"name": "app", "image": image}]},
        "status": {"phase": "Pending"}
    });
    let report = Report {
        name: "app".into(),
        image: image.into(),
        running: None,
        ..Default::default()
    };
    set_containers(&mut pod, &[report]);
    pod
}

/// A pod of this node in an in-place update whose later batch needs `next` (container name,
/// image), as kruise-manager writes `apps.kruise.io/inplace-update-state`; controlled by the
/// CloneSet `web` when `kruise_owned`, by nothing otherwise.
pub fn next_batch_pod(
    namespace: &str,
    name: &str,
    next: &[(&str, &str)],
    kruise_owned: bool,
) -> Value {
    let images: serde_json::Map<String, Value> = next
        .iter()
        .map(|(c, i)| (c.to_string(), json!(i)))
        .collect();
    let state = json!({"revision": "r2", "nextContainerImages": images}).to_string();
    let mut pod = json!({
        "metadata": {"name": name, "namespace": namespace,
                     "annotations": {"apps.kruise.io/inplace-update-state": state}},
        "spec": {"nodeName": NODE, "containers": [{"name": "main", "image": "r.io/app:v1"}]}
    });
    if kruise_owned {
        pod["metadata"]["ownerReferences"] = json!([{
            "apiVersion": "apps.kruise.io/v1alpha1", "kind": "CloneSet", "name": "web",
            "uid": format!("uid-web-{namespace}"), "controller": true, "blockOwnerDeletion": true
        }]);
    }
    pod
}

/// The status of `image:tag`; panics with the status when there is none.
pub fn tag(s: &NodeImageStatus, image: &str, tag: &str) -> ImageTagStatus {
    s.image_statuses
        .get(image)
        .and_then(|i| i.tags.iter().find(|t| t.tag == tag))
        .cloned()
        .unwrap_or_else(|| panic!("no status for {image}:{tag} in {s:#?}"))
}

/// An ImagePullJob owner reference.
pub fn owner() -> Value {
    json!({"apiVersion": "apps.kruise.io/v1alpha1", "kind": "ImagePullJob",
           "namespace": "default", "name": "job-1", "uid": "u-1"})
}

/// Standard base64.
pub fn b64(s: &str) -> String {
    kruised::controller::imagepull::keyring::base64_encode(s.as_bytes())
}

/// Removes the images from the runtime and checks they are gone, so that the next pull fetches
/// their layers again.
pub async fn remove_images(rt: &RemoteRuntime, images: &[String]) {
    for i in images {
        rt.remove_image(i).await.unwrap();
        assert!(
            rt.image_status(i).await.unwrap().is_none(),
            "{i} still present"
        );
    }
}

/// The images pulled at once straight through CRI `PullImage`; how long that took.
pub async fn pull_at_once(rt: &RemoteRuntime, images: &[String]) -> Duration {
    let started = Instant::now();
    let pulls = images.iter().map(|i| {
        rt.pull_image(
            PullRequest {
                image: i.clone(),
                ..Default::default()
            },
            LIMIT,
        )
    });
    for r in futures::future::join_all(pulls).await {
        r.unwrap();
    }
    started.elapsed()
}
