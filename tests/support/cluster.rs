//! The cluster test layer: a real Kubernetes (kube-apiserver with RBAC, etcd, controller-manager,
//! scheduler and a kubelet on its own containerd), started by `tests/run.sh` with
//! `kube-lab.sh` from the binaries named by `KRUISED_KUBE_ASSETS`, with OpenKruise's
//! kruise-manager beside it (`KRUISED_KRUISE_ASSETS`), where someone provides them: no package
//! registry ships them, so CI runs without this layer. The kubelet and the manager do their own
//! parts; a [`Scene`] is for the tests that play the manager by hand.
//!
//! The daemon under test never runs as cluster-admin: [`Identity`] gives it a ServiceAccount
//! token bound to exactly the RBAC of `deploy/` or of kruise's Helm chart.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kruised::k8s::keys;
use kube::api::{
    Api, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::wait::{Condition, await_condition, conditions};
use kube::{Client, Resource, ResourceExt};

use serde_json::{Value, json};

use super::daemon::Daemon;
use super::{Lab, LabRuntime, wait};

/// Field manager of everything the tests write (they play kruise-manager).
pub const MANAGER: &str = "kruise-manager";

/// The real cluster started by `tests/run.sh`; derefs to the `tests/cri-lab.sh` lab of its
/// runtime (its socket, registries, images and credentials).
#[derive(Clone, Debug)]
pub struct KubeLab {
    /// kube-lab's state directory.
    pub dir: PathBuf,
    /// The admin kubeconfig (system:masters): only the tests use it, never the daemon.
    pub kubeconfig: PathBuf,
    pub node: String,
    /// The lab of the cluster's own runtime, containerd 2.3 (`KRUISED_KUBE_LAB_CRI_LAB`;
    /// kube-lab's own is `$KLAB/cri`), its socket `KRUISED_KUBE_LAB_CRI`.
    pub cri: Lab,
}

impl std::ops::Deref for KubeLab {
    type Target = Lab;
    fn deref(&self) -> &Lab {
        &self.cri
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

impl KubeLab {
    /// The cluster named by `KRUISED_KUBE_LAB` (exported by `tests/run.sh`). Without it the
    /// test is skipped with a message, except with `KRUISED_REQUIRE_LAB=1` (`tests/run.sh`'s
    /// parts) where it fails, unless `tests/run.sh` said it found no Kubernetes binaries
    /// (`KRUISED_KUBE_LAB_SKIPPED`, and one line in its closing table).
    pub fn get() -> Option<KubeLab> {
        let lab = env("KRUISED_KUBE_LAB")
            .map(PathBuf::from)
            .map(|dir| KubeLab {
                kubeconfig: dir.join("kubeconfig"),
                node: env("KRUISED_KUBE_LAB_NODE").unwrap_or_else(|| "lab-node".into()),
                cri: Lab {
                    socket: env("KRUISED_KUBE_LAB_CRI")
                        .map(PathBuf::from)
                        .unwrap_or_else(|| dir.join("cri/containerd.sock")),
                    dir: env("KRUISED_KUBE_LAB_CRI_LAB")
                        .map(PathBuf::from)
                        .unwrap_or_else(|| dir.join("cri")),
                    runtime: LabRuntime::Containerd2,
                    registry: env("KRUISED_KUBE_LAB_REGISTRY")
                        .unwrap_or_else(|| "127.0.0.1:16500".into()),
                    auth_registry: env("KRUISED_KUBE_LAB_AUTH_REGISTRY")
                        .unwrap_or_else(|| "127.0.0.1:16501".into()),
                },
                dir,
            });
        if let Some(lab) = &lab {
            assert!(
                lab.kubeconfig.exists(),
                "KRUISED_KUBE_LAB={} has no kubeconfig: is the cluster running?",
                lab.dir.display()
            );
            return Some(lab.clone());
        }
        // CI included: no package registry ships the Kubernetes binaries, so the layer runs
        // only where someone provides them
        let required = env("KRUISED_KUBE_LAB_SKIPPED").is_none()
            && env("KRUISED_REQUIRE_LAB").is_some_and(|v| v == "1");
        assert!(
            !required,
            "the cluster layer (real kube-apiserver + kubelet) is required here but \
             KRUISED_KUBE_LAB is not set: run the tests with tests/run.sh, with the Kubernetes \
             binaries in KRUISED_KUBE_ASSETS (a directory of plain binaries)"
        );
        eprintln!(
            "SKIPPED: no real Kubernetes (run the tests with tests/run.sh and KRUISED_KUBE_ASSETS)"
        );
        None
    }

    /// The tests of one binary run one at a time: they share the node (and its NodeImage), and
    /// each starts a daemon that acts on every pod of the node.
    pub async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
        static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
        LOCK.lock().await
    }

    /// A client with the admin's rights, for playing kruise-manager and setting up.
    pub async fn admin(&self) -> Client {
        client_from(&self.kubeconfig).await
    }
}

/// A client from a kubeconfig file.
pub async fn client_from(path: &Path) -> Client {
    let kubeconfig = Kubeconfig::read_from(path).expect("read kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("kubeconfig");
    Client::try_from(config).expect("client")
}

/// Applies every object of a multi-document YAML text, server-side, as the tests' manager.
pub async fn apply_yaml(client: &Client, yaml: &str) {
    let docs: Vec<Value> = serde_saphyr::from_multiple(yaml).expect("parse manifests");
    for doc in docs.into_iter().filter(|d| d.is_object()) {
        apply_object(client, doc).await;
    }
}

/// Applies one object (server-side apply, forced).
pub async fn apply_object(client: &Client, obj: Value) {
    let gv: kube::core::GroupVersion = obj["apiVersion"]
        .as_str()
        .expect("apiVersion")
        .parse()
        .expect("apiVersion");
    let kind = obj["kind"].as_str().expect("kind").to_string();
    let gvk = gv.with_kind(&kind);
    let (resource, caps) = kube::discovery::pinned_kind(client, &gvk)
        .await
        .unwrap_or_else(|e| panic!("discover {gvk:?}: {e}"));
    let name = obj["metadata"]["name"].as_str().expect("name").to_string();
    let api: Api<DynamicObject> = match obj["metadata"]["namespace"].as_str() {
        Some(ns) if caps.scope == kube::discovery::Scope::Namespaced => {
            Api::namespaced_with(client.clone(), ns, &resource)
        }
        _ => Api::all_with(client.clone(), &resource),
    };
    api.patch(
        &name,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&obj),
    )
    .await
    .unwrap_or_else(|e| panic!("apply {kind} {name}: {e}"));
}

/// Which RBAC the daemon runs with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rbac {
    /// `deploy/rbac.yaml`: ServiceAccount `kruise-system/kruised`.
    Deploy,
    /// kruise's Helm chart (1.9): ServiceAccount `kruise-system/kruise-daemon` bound to
    /// `kruise-daemon-role` (core `events` only) and the secrets Role in `kruise-daemon-config`.
    KruiseChart,
}

/// The daemon's identity: a kubeconfig with a ServiceAccount token and nothing else.
pub struct Identity {
    pub kubeconfig: PathBuf,
    _dir: tempfile::TempDir,
}

/// Applies the RBAC of `rbac` and returns a kubeconfig for its ServiceAccount.
pub async fn identity(lab: &KubeLab, admin: &Client, rbac: Rbac) -> Identity {
    apply_yaml(admin, super::rbac::NAMESPACE_YAML).await;
    let (sa, yaml) = super::rbac::manifests(rbac);
    apply_yaml(admin, yaml).await;
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), "kruise-system");
    let request: TokenRequest = serde_json::from_value(json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"audiences": [], "expirationSeconds": 7200}
    }))
    .expect("token request");
    let token: TokenRequest = accounts
        .create_subresource("token", sa, &PostParams::default(), &request)
        .await
        .unwrap_or_else(|e| panic!("token for {sa}: {e}"));
    let token = token.status.expect("token status").token;

    let admin_config = Kubeconfig::read_from(&lab.kubeconfig).expect("admin kubeconfig");
    let cluster = admin_config.clusters[0]
        .cluster
        .clone()
        .expect("cluster entry");
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    let text = json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "lab", "cluster": {
            "server": cluster.server,
            "certificate-authority-data": cluster.certificate_authority_data,
        }}],
        "users": [{"name": sa, "user": {"token": token}}],
        "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": sa}}],
        "current-context": "lab",
    });
    std::fs::write(&kubeconfig, serde_json::to_vec_pretty(&text).expect("json")).expect("write");
    Identity {
        kubeconfig,
        _dir: dir,
    }
}

/// A namespace of one test, deleted with its pods by [`TestNamespace::delete`].
pub struct TestNamespace {
    pub name: String,
    client: Client,
}

impl TestNamespace {
    /// Creates a namespace named after `prefix` and this process.
    pub async fn create(client: &Client, prefix: &str) -> TestNamespace {
        let name = super::unique(prefix);
        let api: Api<Namespace> = Api::all(client.clone());
        api.create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": name}})).expect("namespace"),
        )
        .await
        .expect("create namespace");
        // the controller-manager creates the default ServiceAccount the pods need
        let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &name);
        let there = |sa: Option<&ServiceAccount>| sa.is_some();
        wait_for(&accounts, "default", "the ServiceAccount", there).await;
        TestNamespace {
            name,
            client: client.clone(),
        }
    }

    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.name)
    }

    /// Deletes the pods (the kubelet stops their containers and confirms) and the namespace;
    /// returns once the kubelet has removed every pod of it. All pods at once: the kubelet stops
    /// them in parallel, where one after the other a namespace of fifty pods took most of a minute.
    pub async fn delete(self) {
        let pods = self.pods();
        let list = pods.list(&Default::default()).await.expect("list pods");
        let mut gone = Vec::new();
        for pod in &list.items {
            let (name, uid) = (pod.name_any(), pod.uid().unwrap_or_default());
            let _ = pods
                .delete(&name, &DeleteParams::default().grace_period(1))
                .await;
            // each wait lists before it watches: a pod already gone is seen as gone
            let pods = pods.clone();
            gone.push(async move {
                await_condition(pods, &name, conditions::is_deleted(&uid))
                    .await
                    .expect("watch pod deletion")
            });
        }
        super::within(
            LIMIT,
            "the kubelet removing the test pods",
            futures::future::join_all(gone),
        )
        .await;
        let api: Api<Namespace> = Api::all(self.client.clone());
        let _ = api.delete(&self.name, &DeleteParams::default()).await;
    }
}

/// How long the cluster's own steps may take (pod start, kubelet restarts, pulls).
pub const LIMIT: Duration = Duration::from_secs(90);

/// Waits until `cond` holds for the object `name` of `api`, at most `LIMIT`; returns it.
pub async fn wait_for<K>(api: &Api<K>, name: &str, what: &str, cond: impl Condition<K>) -> K
where
    K: Clone + std::fmt::Debug + serde::de::DeserializeOwned + Resource + Send + Sync + 'static,
{
    let found = wait::try_kube(api, LIMIT, name, what, cond).await;
    found.unwrap_or_else(|m| m.fail())
}

/// Waits until the object `name` of `api` no longer exists, at most `LIMIT`.
pub async fn wait_deleted<K>(api: &Api<K>, name: &str, what: &str)
where
    K: Clone + std::fmt::Debug + serde::de::DeserializeOwned + Resource + Send + Sync + 'static,
{
    let gone = |o: Option<&K>| o.is_none();
    let found = wait::try_kube_maybe(api, LIMIT, name, what, gone).await;
    found.unwrap_or_else(|m| m.fail());
}

/// Starts `kruised run` for the lab's node with `identity` and the lab's runtime.
pub fn start_daemon(lab: &KubeLab, identity: &Identity, extra: &[&str]) -> Daemon {
    let mut args = super::daemon_args(&identity.kubeconfig, &lab.endpoint().to_string());
    args.extend(extra.iter().map(|a| a.to_string()));
    Daemon::start(
        &lab.node,
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
    )
}

/// kruise's default admin port, which `Daemon::start_exe` expects.
const KRUISE_DAEMON_ADDR: &str = "127.0.0.1:10221";

/// Starts OpenKruise's kruise-daemon (the binary `exe`) for the lab's node as its DaemonSet pod
/// runs it: the RBAC of kruise's chart, the runtime's socket under `/hostvarrun` (a private
/// mount namespace, `dir` holding what it needs), `NODE_NAME`. Returns it once `/healthz`
/// answers, and how long that took from its start.
pub async fn start_kruise_daemon(
    lab: &KubeLab,
    admin: &Client,
    exe: &Path,
    dir: &Path,
) -> (Daemon, Duration) {
    let identity = identity(lab, admin, Rbac::KruiseChart).await;
    // its DaemonSet mounts the host's /var/run at /hostvarrun: the lab's socket there
    let varrun = dir.join("varrun");
    let socket = varrun.join("containerd/containerd.sock");
    std::fs::create_dir_all(varrun.join("containerd")).expect("create varrun/containerd");
    let _ = std::fs::remove_file(&socket);
    std::os::unix::fs::symlink(&lab.socket, &socket).expect("link the runtime's socket");
    let kubeconfig = dir.join("kruise-daemon.kubeconfig");
    std::fs::copy(&identity.kubeconfig, &kubeconfig).expect("copy the kubeconfig");
    let script = format!(
        "mkdir -p /hostvarrun && mount --bind {} /hostvarrun && exec {} --addr={KRUISE_DAEMON_ADDR} \
         --enable-pprof=false --socket-file=containerd/containerd.sock \
         --feature-gates=ImagePullJobGate=true --logtostderr=true --v=2",
        varrun.display(),
        exe.display()
    );
    let started = std::time::Instant::now();
    let d = Daemon::start_exe(
        Path::new("unshare"),
        &["-m", "--propagation", "private", "sh", "-c", &script],
        &[
            ("NODE_NAME", lab.node.as_str()),
            ("KUBECONFIG", kubeconfig.to_str().expect("a UTF-8 path")),
        ],
    );
    let addr = KRUISE_DAEMON_ADDR.parse().expect("kruise-daemon's address");
    super::within(Duration::from_secs(60), "kruise-daemon healthy", async {
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        loop {
            tick.tick().await;
            let up = tokio::net::TcpStream::connect(addr).await.is_ok();
            if up && super::daemon::http_get(addr, "/healthz").await.0 == 200 {
                return;
            }
        }
    })
    .await;
    (d, started.elapsed())
}

// telling refusals from the daemon's log: shared with the integration layer, which runs in CI
pub use super::rbac::{assert_never_forbidden, is_refusal};

// === scenes: what the kruise-manager side of a test needs ===

/// The owner kind of the pods of the tests that play kruise-manager: of kruise's API group (kruised
/// manages only pods with such an owner), run by no controller, so the real kruise-manager, when it
/// runs beside these tests, leaves the pods to them.
const TESTWORKLOAD_CRD: &str = include_str!("../fixtures/cluster/testworkload-crd.yaml");

/// A container of [`Scene::kruise_pod`]: name, image, and env variables with the annotation
/// each reads.
pub type ContainerDef<'a> = (&'a str, &'a str, &'a [(&'a str, &'a str)]);

/// Deletes the namespaces an earlier run left behind when it panicked: those named
/// `<prefix>-<pid>-<n>` (as [`TestNamespace::create`] names them) for one of `prefixes`, whose
/// process is gone. Returns their names. The namespaces of a live process are left alone.
pub async fn remove_leftover_namespaces(lab: &KubeLab, prefixes: &[&str]) -> Vec<String> {
    let admin = lab.admin().await;
    let api: Api<Namespace> = Api::all(admin);
    let list = api
        .list(&Default::default())
        .await
        .expect("list namespaces");
    let mut removed = Vec::new();
    for ns in list.items {
        let name = ns.name_any();
        let pid = prefixes.iter().find_map(|p| {
            let rest = name.strip_prefix(p)?.strip_prefix('-')?;
            rest.split('-').next()?.parse::<u32>().ok()
        });
        let Some(pid) = pid else { continue };
        if ns.metadata.deletion_timestamp.is_some() || Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        if api.delete(&name, &DeleteParams::default()).await.is_ok() {
            removed.push(name);
        }
    }
    removed
}

/// What every scenario where the test plays kruise-manager needs: the lab, an admin client, a
/// namespace of its own and a [`TESTWORKLOAD_CRD`] owner in it for the pods.
pub struct Scene {
    pub lab: KubeLab,
    pub admin: Client,
    pub ns: TestNamespace,
    owner_uid: String,
}

impl Scene {
    pub async fn new(lab: &KubeLab, prefix: &str) -> Scene {
        let admin = lab.admin().await;
        let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
        apply_yaml(&admin, TESTWORKLOAD_CRD).await;
        let established = conditions::is_crd_established();
        let what = "the TestWorkload CRD established";
        wait_for(&crds, "testworkloads.apps.kruise.io", what, established).await;
        let ns = TestNamespace::create(&admin, prefix).await;
        apply_object(
            &admin,
            json!({"apiVersion": "apps.kruise.io/v1alpha1", "kind": "TestWorkload",
                   "metadata": {"name": "demo", "namespace": ns.name}}),
        )
        .await;
        let gvk = GroupVersionKind::gvk("apps.kruise.io", "v1alpha1", "TestWorkload");
        let ar = kube::discovery::ApiResource::from_gvk(&gvk);
        let owners: Api<DynamicObject> = Api::namespaced_with(admin.clone(), &ns.name, &ar);
        let owner_uid = owners.get("demo").await.unwrap().uid().unwrap();
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

    /// A pod as a CloneSet makes it, owned by the scene's TestWorkload, with the `InPlaceUpdateReady`
    /// readiness gate, host network, on the lab's node. Each container is `(name, image, env)`
    /// where `env` maps a variable to the annotation it reads. The containers exit at once on
    /// SIGTERM; the grace period is the kubelet's default, 30 s, which is also what a preStop
    /// hook may take (5 s cut exec hooks short on a loaded machine).
    pub fn kruise_pod(&self, name: &str, containers: &[ContainerDef<'_>]) -> Value {
        let containers: Vec<Value> = containers
            .iter()
            .map(|(c, image, env)| container(c, image, env))
            .collect();
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": self.ns.name,
                "labels": {"app": "demo"},
                "annotations": {"app-config": "v1"},
                "ownerReferences": [{"apiVersion": "apps.kruise.io/v1alpha1", "kind": "TestWorkload",
                    "name": "demo", "uid": self.owner_uid, "controller": true,
                    "blockOwnerDeletion": true}]},
            "spec": {"nodeName": self.lab.node, "hostNetwork": true,
                "terminationGracePeriodSeconds": 30,
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

/// A container that ends at once on SIGTERM; `env` maps variables to the annotation each
/// reads (`valueFrom.fieldRef`).
pub fn container(name: &str, image: &str, env: &[(&str, &str)]) -> Value {
    let env: Vec<Value> = env
        .iter()
        .map(|(var, key)| {
            json!({"name": var, "valueFrom": {"fieldRef":
                {"fieldPath": format!("metadata.annotations['{key}']")}}})
        })
        .collect();
    json!({"name": name, "image": image, "env": env,
           "command": ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"]})
}

/// The status of the pod's condition `type_`, if it has one.
pub fn condition<'a>(p: &'a Pod, type_: &str) -> Option<&'a str> {
    p.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| c.status.as_str())
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
    keys::parse_runtime_containers_meta(p.annotations())
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
    kruised::cri::split_container_id(container_id).1
}
