//! A test double of OpenKruise's kruise-manager (controllers and webhooks), written from kruise's
//! source at commit 07169cf (each part cites the file and lines its behaviour comes from) and
//! from what the cluster layer saw the real manager do (`tests/cluster/kruise.rs`). It runs against the API-server double as the real manager runs
//! against kube-apiserver: its webhooks are the double's admission hooks, its writes go over
//! HTTP through a kube client (so they meet the same schemas, resourceVersion checks and
//! webhooks), and it reads the double's store, woken by every write (the double's change
//! notifications), by the test changing a workload, or by a timer it set (deadlines, TTLs).
//!
//! What it does, each in its own module:
//!
//! * `crr`: the ContainerRecreateRequest mutating webhook and the manager's CRR controller
//!   (container-status snapshot, `active` label, deadlines, TTL; never serialising a pod's
//!   requests, as the real one does not);
//! * `workload`: a CloneSet's in-place update for a [`Template`] the test changes (kruise's
//!   `pkg/util/inplaceupdate`), a test workload standing in for the CloneSet object, which the
//!   API double does not serve;
//! * `imagepull` and `nodeimage`: ImagePullJob → NodeImage tags and pull secrets, the job's
//!   status from the NodeImage's, NodeImage creation per Ready node, its webhooks and its
//!   no-response failure;
//! * `podprobe`: NodePodProbe per Ready node, PodProbeMarker → NodePodProbe, and NodePodProbe
//!   status → the pods' conditions, labels and annotations.
//!
//! [`KubeletTiming::at_once`] plays the kubelet's part FakeNode does not play on its own.

mod crr;
mod imagepull;
mod nodeimage;
mod podprobe;
pub mod scene;
mod workload;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use apiserver_double::Control;
use k8s_openapi::jiff::Timestamp;
use serde_json::Value;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

pub use crate::kubelet::KubeletTiming;
pub use crr::CRR_WEBHOOK;
pub use nodeimage::{NODE_IMAGE_MUTATING_WEBHOOK, NODE_IMAGE_VALIDATING_WEBHOOK};
pub use workload::{Template, WorkloadStatus};

/// The manager's durations, kruise's defaults unless a test shortens one.
#[derive(Clone, Debug)]
pub struct Timing {
    /// A request whose phase the daemon has not set this long after its creation is completed
    /// with `daemon has not responded for a long time` (kruise 07169cf
    /// pkg/controller/containerrecreaterequest/crr_controller.go:55, `responseTimeout`, 1 m).
    pub crr_response_timeout: Duration,
    /// A Recreating request is looked at again at least this often (crr_controller.go:216-217, 3 s).
    pub crr_recreating_requeue: Duration,
    /// A NodeImage tag the node has not reported this long after its `createdAt` fails with
    /// `node has not responded for a long time` (pkg/controller/nodeimage/
    /// nodeimage_controller.go:73, `responseTimeout`, 10 m).
    pub node_image_response_timeout: Duration,
    /// `--nodeimage-creation-delay`: a Ready node gets its NodeImage this long after its Ready
    /// condition's `lastTransitionTime` (nodeimage_controller.go:59-67, 30 s; the cluster lab
    /// ran the manager with `0s`).
    pub node_image_creation_delay: Duration,
    /// `--default-ttlseconds-for-always-nodeimage` (cmd main.go:71, pkg/util/nodeimage.go:24-39,
    /// 300 s).
    pub default_ttl_for_always_node_image: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            crr_response_timeout: Duration::from_secs(60),
            crr_recreating_requeue: Duration::from_secs(3),
            node_image_response_timeout: Duration::from_secs(600),
            node_image_creation_delay: Duration::from_secs(30),
            default_ttl_for_always_node_image: Duration::from_secs(300),
        }
    }
}

/// The namespace of the pull-secret copies (`KRUISE_DAEMON_CONFIG_NS`' default, kruise 07169cf
/// pkg/util/meta.go:28-33).
pub const DAEMON_CONFIG_NS: &str = "kruise-daemon-config";

/// A running manager double. Dropping it stops its controllers; its webhooks stay registered
/// with the API double (its admission hooks cannot be removed), as webhook configurations stay
/// in a cluster whose manager stopped.
pub struct ManagerDouble {
    inner: Arc<Inner>,
    task: JoinHandle<()>,
}

/// What the controllers share.
pub(crate) struct Inner {
    pub control: Control,
    http: kube::Client,
    pub timing: Timing,
    pub workloads: Mutex<BTreeMap<String, workload::Workload>>,
    wake: Notify,
    idle: watch::Sender<u64>,
    errors: Mutex<Vec<String>>,
    writes: AtomicU64,
}

impl ManagerDouble {
    /// Registers the webhooks with the API double behind `control` and starts the controllers.
    pub async fn start(control: Control, timing: Timing) -> ManagerDouble {
        crr::register_webhook(&control);
        nodeimage::register_webhooks(&control);
        imagepull::register_webhook(&control);
        let http = connect(&control).await;
        let inner = Arc::new(Inner {
            control,
            http,
            timing,
            workloads: Mutex::new(BTreeMap::new()),
            wake: Notify::new(),
            idle: watch::channel(0).0,
            errors: Mutex::new(Vec::new()),
            writes: AtomicU64::new(0),
        });
        let task = tokio::spawn(run(inner.clone()));
        ManagerDouble { inner, task }
    }

    /// Takes `pods` (in namespace `default`) into the workload `name` running `template`, as a
    /// CloneSet owns the pods it made from its template: the pods get what the CloneSet puts
    /// into every pod it creates (the `InPlaceUpdateReady` readiness gate, kruise 07169cf
    /// pkg/controller/cloneset/core/cloneset_core.go:105; the revision labels, cloneset_utils.go:
    /// 71-85; lifecycle state `Normal`), which [`FakeNode::add_pod`] cannot give them.
    ///
    /// [`FakeNode::add_pod`]: crate::node::FakeNode::add_pod
    pub fn add_workload(&self, name: &str, template: Template, pods: &[&str]) {
        let w = workload::Workload::new(name, template, pods);
        w.adopt(&self.inner.control);
        self.lock_workloads().insert(name.to_string(), w);
        self.inner.wake.notify_one();
    }

    /// Changes the workload's template, as a user's `kubectl patch` of a CloneSet's
    /// `spec.template` does: the manager updates its pods in place.
    pub fn set_template(&self, name: &str, template: Template) {
        self.lock_workloads()
            .get_mut(name)
            .expect("a workload added with add_workload")
            .set_template(template);
        self.inner.wake.notify_one();
    }

    /// Sets the CloneSet's `updateStrategy.rollingUpdate.inPlaceUpdateStrategy.
    /// gracePeriodSeconds`: the updates it starts from now on wait that long in the grace
    /// annotation.
    pub fn set_grace_period(&self, name: &str, seconds: u32) {
        self.lock_workloads()
            .get_mut(name)
            .expect("a workload added with add_workload")
            .grace_seconds = seconds;
    }

    /// The workload's status as a CloneSet's reads (`replicas`, `updatedReplicas`,
    /// `readyReplicas`, `updatedReadyReplicas`, `updateRevision`).
    pub fn workload_status(&self, name: &str) -> WorkloadStatus {
        let workloads = self.lock_workloads();
        let w = workloads
            .get(name)
            .expect("a workload added with add_workload");
        w.status(&self.inner.control)
    }

    /// Waits until every pod of the workload runs its current template, is ready and in-place
    /// update ready, as `tests/cluster/kruise.rs` waits for a CloneSet (`updatedReadyReplicas ==
    /// readyReplicas == replicas`).
    pub async fn wait_workload_updated(
        &self,
        name: &str,
        limit: Duration,
    ) -> Result<WorkloadStatus, WorkloadStatus> {
        let done = |s: &WorkloadStatus| {
            s.updated_ready_replicas == s.replicas && s.ready_replicas == s.replicas
        };
        // the predicate runs under the store lock: it reads the pods through the view, and a
        // copy of the workload taken now (a template changed meanwhile is the test's own doing)
        let w = self
            .lock_workloads()
            .get(name)
            .cloned()
            .expect("a workload added with add_workload");
        let _ = self
            .inner
            .control
            .wait_for(limit, |v| {
                done(&w.status_with(|p| v.get("pods", "default", p)))
            })
            .await;
        let s = self.workload_status(name);
        if done(&s) { Ok(s) } else { Err(s) }
    }

    /// Waits until the manager has nothing left to do for the store as it is now: its last pass
    /// saw the current resourceVersion and wrote nothing. Timers it set (deadlines, TTLs) may
    /// still be due later.
    pub async fn wait_idle(&self, limit: Duration) -> Result<(), Duration> {
        let mut rx = self.inner.idle.subscribe();
        tokio::time::timeout(limit, async {
            loop {
                if *rx.borrow_and_update() == self.inner.control.resource_version() {
                    return;
                }
                self.inner.wake.notify_one();
                if rx.changed().await.is_err() {
                    return;
                }
            }
        })
        .await
        .map_err(|_| limit)
    }

    /// Every write the manager could not make for a reason other than a conflict or a missing
    /// object (both retried or moot), oldest first: a test asserts there are none.
    pub fn errors(&self) -> Vec<String> {
        lock(&self.inner.errors).clone()
    }

    fn lock_workloads(&self) -> MutexGuard<'_, BTreeMap<String, workload::Workload>> {
        lock(&self.inner.workloads)
    }
}

impl Drop for ManagerDouble {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Locks `m`, whether or not a panic poisoned it.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The controllers' loop: one pass over everything, then wait for a write to the store, a
/// change by the test, or the earliest timer a controller set.
async fn run(inner: Arc<Inner>) {
    const FAR: Duration = Duration::from_secs(3600);
    loop {
        let rv = inner.control.resource_version();
        inner.writes.store(0, Ordering::SeqCst);
        let mut wake = Wake::default();
        wake.merge(nodeimage::reconcile_nodes(&inner).await);
        wake.merge(podprobe::reconcile_nodes(&inner).await);
        wake.merge(workload::reconcile(&inner).await);
        wake.merge(crr::reconcile(&inner).await);
        wake.merge(imagepull::reconcile(&inner).await);
        wake.merge(nodeimage::reconcile_status(&inner).await);
        wake.merge(podprobe::reconcile_markers(&inner).await);
        wake.merge(podprobe::reconcile_statuses(&inner).await);
        if inner.writes.load(Ordering::SeqCst) == 0 {
            inner.idle.send_replace(rv);
        }
        let left = wake
            .0
            .map_or(FAR, |at| at.saturating_duration_since(Instant::now()));
        let control = inner.control.clone();
        tokio::select! {
            _ = control.wait_for(left, |v| v.resource_version() != rv) => {}
            () = inner.wake.notified() => {}
        }
    }
}

/// When a controller wants to look again without any event: the earliest wins.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Wake(Option<Instant>);

impl Wake {
    /// Look again after `d`.
    pub fn after(d: Duration) -> Wake {
        Wake(Some(Instant::now() + d))
    }

    /// The earlier of the two.
    pub fn merge(&mut self, other: Wake) {
        self.0 = match (self.0, other.0) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }

    /// Whether `d` has passed since `t`; if not, look again once it has.
    pub fn passed(&mut self, d: Duration, t: Timestamp) -> bool {
        let left = d.saturating_sub(since(t));
        if !left.is_zero() {
            self.merge(Wake::after(left));
        }
        left.is_zero()
    }
}

// === impl Inner ===

impl Inner {
    /// Records what the double could not do (see [`ManagerDouble::errors`]).
    pub fn error(&self, what: String) {
        let mut errors = lock(&self.errors);
        // a pass repeats what it could not do: once is enough
        if !errors.contains(&what) {
            errors.push(what);
        }
    }

    /// One object of the store (`resource` as [`Res::control`] names it).
    pub fn get(&self, res: Res, ns: &str, name: &str) -> Option<Value> {
        self.control.get(&res.control(), ns, name)
    }

    /// Every object of `res` (in `ns`, or everywhere).
    pub fn list(&self, res: Res, ns: Option<&str>) -> Vec<Value> {
        self.control.list(&res.control(), ns)
    }
}

/// The resources the manager reads and writes, at the versions kruise-manager 07169cf uses
/// (v1beta1 for CRR, NodeImage and ImagePullJob; v1alpha1 for the probe kinds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Res {
    Pods,
    Nodes,
    Secrets,
    Namespaces,
    Crrs,
    NodeImages,
    ImagePullJobs,
    NodePodProbes,
    PodProbeMarkers,
}

impl Res {
    /// (API prefix, plural, namespaced)
    fn parts(self) -> (&'static str, &'static str, bool) {
        const KRUISE_B: &str = "/apis/apps.kruise.io/v1beta1";
        const KRUISE_A: &str = "/apis/apps.kruise.io/v1alpha1";
        match self {
            Res::Pods => ("/api/v1", "pods", true),
            Res::Nodes => ("/api/v1", "nodes", false),
            Res::Secrets => ("/api/v1", "secrets", true),
            Res::Namespaces => ("/api/v1", "namespaces", false),
            Res::Crrs => (KRUISE_B, "containerrecreaterequests", true),
            Res::NodeImages => (KRUISE_B, "nodeimages", false),
            Res::ImagePullJobs => (KRUISE_B, "imagepulljobs", true),
            Res::NodePodProbes => (KRUISE_A, "nodepodprobes", false),
            Res::PodProbeMarkers => (KRUISE_A, "podprobemarkers", true),
        }
    }

    /// The name the control API resolves to this version.
    fn control(self) -> String {
        let (prefix, plural, _) = self.parts();
        match prefix.strip_prefix("/apis/") {
            Some(gv) => format!("{gv}/{plural}"),
            None => plural.to_string(),
        }
    }

    /// The URL path of `obj`'s collection.
    fn collection(self, obj: &Value) -> String {
        let (prefix, plural, namespaced) = self.parts();
        match namespaced {
            true => format!("{prefix}/namespaces/{}/{plural}", ns_of(obj)),
            false => format!("{prefix}/{plural}"),
        }
    }

    /// The URL path of `obj`, followed by `sub` (`""`, or `/status` for the status subresource).
    fn path(self, obj: &Value, sub: &str) -> String {
        format!("{}/{}{sub}", self.collection(obj), name_of(obj))
    }
}

/// The manager's HTTP client of the API double (the double's default kubeconfig: the admin).
async fn connect(control: &Control) -> kube::Client {
    let yaml = control.kubeconfig_with_token(apiserver_double::DEFAULT_TOKEN);
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&yaml).expect("the double's kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("a client config");
    kube::Client::try_from(config).expect("a kube client")
}

// === the writes ===

const JSON: &str = "application/json";
const MERGE: &str = "application/merge-patch+json";

impl Inner {
    /// Makes a write over HTTP and counts it; a conflict or a missing object is left to the next
    /// pass (the store moved, so one comes), any other failure is recorded in
    /// [`ManagerDouble::errors`] as `what`.
    async fn send(
        &self,
        what: &str,
        method: http::Method,
        path: String,
        content_type: &str,
        body: Option<&Value>,
    ) -> Option<Value> {
        let req = http::Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::CONTENT_TYPE, content_type)
            .body(body.map(Value::to_string).unwrap_or_default().into_bytes())
            .expect("a valid request");
        match self.http.request::<Value>(req).await {
            Ok(v) => {
                self.writes.fetch_add(1, Ordering::SeqCst);
                Some(v)
            }
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => None,
            Err(e) => {
                self.error(format!("{what}: {e}"));
                None
            }
        }
    }

    /// `POST` of `obj` to its collection.
    pub async fn create(&self, what: &str, res: Res, obj: &Value) -> Option<Value> {
        let path = res.collection(obj);
        self.send(what, http::Method::POST, path, JSON, Some(obj))
            .await
    }

    /// `PUT` of the object (its `resourceVersion` is the precondition).
    pub async fn replace(&self, what: &str, res: Res, obj: &Value) -> Option<Value> {
        let path = res.path(obj, "");
        self.send(what, http::Method::PUT, path, JSON, Some(obj))
            .await
    }

    /// `PUT` of the object's status subresource.
    pub async fn replace_status(&self, what: &str, res: Res, obj: &Value) -> Option<Value> {
        let path = res.path(obj, "/status");
        self.send(what, http::Method::PUT, path, JSON, Some(obj))
            .await
    }

    /// A JSON merge patch of the object.
    pub async fn merge_patch(&self, what: &str, res: Res, obj: &Value, patch: &Value) {
        let path = res.path(obj, "");
        self.send(what, http::Method::PATCH, path, MERGE, Some(patch))
            .await;
    }

    /// A JSON merge patch of the object's status subresource.
    pub async fn merge_patch_status(&self, what: &str, res: Res, obj: &Value, patch: &Value) {
        let path = res.path(obj, "/status");
        self.send(what, http::Method::PATCH, path, MERGE, Some(patch))
            .await;
    }

    /// `DELETE` of the object.
    pub async fn delete(&self, what: &str, res: Res, obj: &Value) {
        let path = res.path(obj, "");
        self.send(what, http::Method::DELETE, path, JSON, None)
            .await;
    }
}

// === object helpers ===

/// `metadata.name`.
pub(crate) fn name_of(obj: &Value) -> &str {
    obj["metadata"]["name"].as_str().unwrap_or_default()
}

/// `metadata.namespace` (`""` when cluster-scoped).
pub(crate) fn ns_of(obj: &Value) -> &str {
    obj["metadata"]["namespace"].as_str().unwrap_or_default()
}

/// `metadata.uid`.
pub(crate) fn uid_of(obj: &Value) -> &str {
    obj["metadata"]["uid"].as_str().unwrap_or_default()
}

pub(crate) fn label<'a>(obj: &'a Value, key: &str) -> Option<&'a str> {
    obj["metadata"]["labels"][key].as_str()
}

/// Whether the object has a `deletionTimestamp`.
pub(crate) fn deleting(obj: &Value) -> bool {
    obj["metadata"]["deletionTimestamp"].is_string()
}

/// A status condition of `type_` (pods, nodes, CRRs).
pub(crate) fn condition<'a>(obj: &'a Value, type_: &str) -> Option<&'a Value> {
    obj["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

/// The array at `v`, made an empty one first if it is anything else.
pub(crate) fn array_mut(v: &mut Value) -> &mut Vec<Value> {
    if !v.is_array() {
        *v = Value::Array(Vec::new());
    }
    v.as_array_mut().expect("an array")
}

/// Whether a pod is active: not Succeeded or Failed, not deleting (kruise's `IsPodActive`).
pub(crate) fn pod_active(pod: &Value) -> bool {
    !deleting(pod)
        && !matches!(
            pod["status"]["phase"].as_str(),
            Some("Succeeded" | "Failed")
        )
}

pub(crate) fn now() -> Timestamp {
    Timestamp::now()
}

/// A time as Kubernetes writes `metav1.Time`: RFC 3339 in seconds, UTC.
pub(crate) fn rfc3339(t: Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// A `metav1.Time` field, parsed.
pub(crate) fn time_of(v: &Value) -> Option<Timestamp> {
    v.as_str()?.parse().ok()
}

/// How long ago `t` was (zero for a time in the future).
pub(crate) fn since(t: Timestamp) -> Duration {
    let d = now().as_nanosecond() - t.as_nanosecond();
    Duration::from_nanos(u64::try_from(d).unwrap_or(0))
}

/// `d` seconds as a `Duration` (negative: zero).
pub(crate) fn secs(v: &Value) -> Option<Duration> {
    v.as_i64()
        .map(|s| Duration::from_secs(u64::try_from(s).unwrap_or(0)))
}

/// A tag's `version` (Go's `int64` with `omitempty`: absent is 0).
pub(crate) fn version(tag: &Value) -> i64 {
    tag["version"].as_i64().unwrap_or(0)
}

/// A pseudo-random number below `n` for what kruise randomises (TTL jitter, secret-copy names),
/// from `seed` and the clock: the tests never depend on its value.
pub(crate) fn jitter(seed: &str, n: u64) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let nanos = now().as_nanosecond().unsigned_abs();
    for b in seed.bytes().chain(nanos.to_le_bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h % n.max(1)
}
