//! What ships, on the real cluster: the image `scripts/build-image.sh` builds, pushed to the
//! cluster's registry and run by the kubelet, deployed with `kubectl apply -k deploy/`, and swapped
//! into kruise's own Helm-made DaemonSet with `deploy/overlays/swap-kruise-daemon`.
//!
//! The lab has no pod network and its containerd socket is not under `/var/run`, so each test
//! applies a small overlay of the shipped kustomization: host network, the lab's socket
//! directory as the host's run directory, a free admin port, and the image by digest from the
//! lab's registry. Everything else is what an operator applies.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Pod, PodSpec};
use kube::api::{Api, ListParams, LogParams};
use kube::runtime::wait::await_condition;
use serde_json::json;

use super::support::cluster::{self, KubeLab, Scene, wait_for};
use super::support::daemon::free_addr;
use super::{meta, runtime_id, status_of};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const NAMESPACE: &str = "kruise-system";
/// The feature gates a user set in the chart's install: the swap must keep them.
const USERS_GATES: &str = "ImagePullJobGate=true,PodProbeMarkerGate=true";
const CHART_DAEMON_YAML: &str = include_str!("../fixtures/kruise-chart/daemon.yaml");
const CHART_RBAC_YAML: &str = include_str!("../fixtures/kruise-chart/rbac.yaml");
/// From `kubectl apply` to the DaemonSet's pod Ready: pull, start, caches synced.
const ROLLOUT: Duration = Duration::from_secs(120);

/// The image in the lab's registry.
struct Image {
    /// `host:port/kruised@sha256:...`, as kustomize writes it.
    name: String,
    digest: String,
}

/// Builds the image with the shipped script (a no-op rebuild when `tests/run.sh` built it
/// already) and pushes it to the lab's registry.
fn push_image(lab: &KubeLab) -> Image {
    let reference = format!("{}/kruised:{}", lab.registry, env!("CARGO_PKG_VERSION"));
    let mut build = Command::new("bash");
    build
        .arg(Path::new(ROOT).join("scripts/build-image.sh"))
        .args(["--push", &reference])
        .current_dir(ROOT);
    // tests/run.sh builds the release binary before the tests; package that one. Without it
    // the script builds, with the environment cargo gives the test process removed: it would
    // make cargo rebuild the release binary (and rebuild it again on the next outer build)
    let built = Path::new(ROOT).join("target/dist/kruised");
    if built.exists() {
        build.arg("--binary").arg(&built);
    }
    for (name, _) in std::env::vars_os() {
        let n = name.to_string_lossy();
        if (n == "CARGO" || n.starts_with("CARGO_") || n == "LD_LIBRARY_PATH")
            && n != "CARGO_HOME"
            && n != "CARGO_TARGET_DIR"
        {
            build.env_remove(&name);
        }
    }
    let out = build.output().expect("run scripts/build-image.sh");
    assert!(
        out.status.success(),
        "scripts/build-image.sh failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let digest = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(digest.starts_with("sha256:"), "digest printed: {digest}");
    eprintln!("{}", String::from_utf8_lossy(&out.stderr).trim_end());
    Image {
        name: format!("{}/kruised", lab.registry),
        digest,
    }
}

/// A kustomization over `base` (a directory of the repository) for the lab, in a temp dir.
struct LabOverlay {
    dir: tempfile::TempDir,
}

impl LabOverlay {
    /// `patch` is a JSON patch (YAML) of the DaemonSet `daemonset`.
    fn new(base: &str, daemonset: &str, image: &Image, patch: &str) -> LabOverlay {
        // kustomize takes bases by relative path only: the overlay lives in target/
        let scratch = Path::new(ROOT).join("target");
        std::fs::create_dir_all(&scratch).expect("target/");
        let dir = tempfile::Builder::new()
            .prefix("lab-overlay")
            .tempdir_in(&scratch)
            .expect("tempdir");
        let base = Path::new("../..").join(base);
        let (name, digest) = (&image.name, &image.digest);
        let text = format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
             resources:\n  - {base}\n\
             images:\n  - name: kruised\n    newName: {name}\n    digest: {digest}\n\
             patches:\n  - target:\n      kind: DaemonSet\n      name: {daemonset}\n    patch: |-\n{patch}",
            base = base.display(),
            patch = indent(patch, 6)
        );
        std::fs::write(dir.path().join("kustomization.yaml"), text).expect("write overlay");
        LabOverlay { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

fn indent(text: &str, by: usize) -> String {
    text.lines().map(|l| format!("{:by$}{l}\n", "")).collect()
}

/// Runs the lab's kubectl (v1.36) as the admin; returns stdout.
fn kubectl(lab: &KubeLab, args: &[&str]) -> String {
    let kubectl: PathBuf = lab.dir.join("bin/kubectl");
    let out = Command::new(&kubectl)
        .args(args)
        .env("KUBECONFIG", &lab.kubeconfig)
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", kubectl.display()));
    assert!(
        out.status.success(),
        "kubectl {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The lab's API server as `(host, port)`: it has no kube-proxy, so the kubelet's
/// `KUBERNETES_SERVICE_HOST` (the service IP) leads nowhere; host-network pods reach it here.
fn api_server(lab: &KubeLab) -> (String, String) {
    let config = kube::config::Kubeconfig::read_from(&lab.kubeconfig).expect("admin kubeconfig");
    let server = config.clusters[0]
        .cluster
        .as_ref()
        .and_then(|c| c.server.clone())
        .expect("server");
    let hostport = server.trim_start_matches("https://").trim_end_matches('/');
    let (host, port) = hostport.rsplit_once(':').expect("host:port");
    (host.to_string(), port.to_string())
}

/// JSON-patch lines (YAML) that point the pod's in-cluster config at the lab's API server.
fn in_cluster_env(lab: &KubeLab) -> String {
    let (host, port) = api_server(lab);
    format!(
        "- {{op: add, path: /spec/template/spec/containers/0/env/-, value: {{name: KUBERNETES_SERVICE_HOST, value: \"{host}\"}}}}\n\
         - {{op: add, path: /spec/template/spec/containers/0/env/-, value: {{name: KUBERNETES_SERVICE_PORT, value: \"{port}\"}}}}"
    )
}

/// Deletes the DaemonSet (foreground: its pods first) when dropped, also when the test fails:
/// a daemon left behind would act on the next tests' pods.
struct Installed<'a> {
    lab: &'a KubeLab,
    name: &'static str,
}

impl Drop for Installed<'_> {
    fn drop(&mut self) {
        let _ = Command::new(self.lab.dir.join("bin/kubectl"))
            .args(["-n", NAMESPACE, "delete", "daemonset", self.name])
            .args([
                "--cascade=foreground",
                "--wait",
                "--timeout=90s",
                "--ignore-not-found",
            ])
            .env("KUBECONFIG", &self.lab.kubeconfig)
            .output();
    }
}

/// The socket directory of the lab's containerd: the "host's run directory" of the tests.
fn run_dir(lab: &KubeLab) -> String {
    lab.socket
        .parent()
        .expect("socket directory")
        .display()
        .to_string()
}

/// Waits until the DaemonSet `name` has rolled out `image` and its pod is Ready; returns the
/// pod and how long that took since `since`.
async fn rolled_out(
    admin: &kube::Client,
    name: &str,
    selector: &str,
    image: &Image,
    since: Instant,
) -> (Pod, Duration) {
    let sets: Api<DaemonSet> = Api::namespaced(admin.clone(), NAMESPACE);
    let ready = |d: Option<&DaemonSet>| {
        d.and_then(|d| d.status.as_ref()).is_some_and(|s| {
            s.desired_number_scheduled == 1
                && s.updated_number_scheduled == Some(1)
                && s.number_ready == 1
                && s.number_unavailable.unwrap_or(0) == 0
        })
    };
    let found = tokio::time::timeout(ROLLOUT, await_condition(sets.clone(), name, ready)).await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NAMESPACE);
    let listed = pods
        .list(&ListParams::default().labels(selector))
        .await
        .expect("list the DaemonSet's pods");
    assert!(
        matches!(found, Ok(Ok(Some(_)))),
        "DaemonSet {name} not Ready within {ROLLOUT:?}: {:#?}",
        listed
            .items
            .iter()
            .map(|p| (&p.metadata.name, &p.status))
            .collect::<Vec<_>>()
    );
    let took = since.elapsed();
    let pod = listed
        .items
        .into_iter()
        .find(|p| {
            p.metadata.deletion_timestamp.is_none()
                && p.spec.as_ref().is_some_and(|s| {
                    s.containers[0]
                        .image
                        .as_deref()
                        .is_some_and(|i| i.ends_with(&image.digest))
                })
        })
        .expect("a pod of the new template");
    (pod, took)
}

/// The pod's log, checked for refusals: its identity must have every right it uses.
async fn assert_log_never_forbidden(admin: &kube::Client, pod: &Pod) -> String {
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NAMESPACE);
    let name = pod.metadata.name.as_deref().expect("pod name");
    let log = pods
        .logs(name, &LogParams::default())
        .await
        .expect("the pod's log");
    let refused: Vec<&str> = log.lines().filter(|l| cluster::is_refusal(l)).collect();
    assert!(
        refused.is_empty(),
        "{name} was refused by RBAC:\n{}",
        refused.join("\n")
    );
    assert!(
        log.contains("daemon ready"),
        "{name} logged no readiness:\n{log}"
    );
    log
}

/// What `echo $VAR` prints in the running container `id`.
async fn echo(lab: &KubeLab, id: &str, var: &str) -> String {
    use kruised::cri::RuntimeService;
    let out = lab
        .runtime()
        .exec_sync(
            runtime_id(id),
            vec!["sh".into(), "-c".into(), format!("echo ${var}")],
            Duration::from_secs(10),
        )
        .await
        .expect("exec echo");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[tokio::test]
async fn kubectl_apply_k_deploy_runs_the_image_and_it_restarts_a_stale_env() {
    let Some(lab) = KubeLab::get() else { return };
    let _serial = KubeLab::serial().await;
    let scene = Scene::new(&lab, "ship").await;
    let image = push_image(&lab);
    let port = free_addr().port();
    // volumes/1, the image filesystem's directory for the size admission (containerd's ingest
    // under /var/lib/containerd): the lab's containerd keeps its root elsewhere, so a directory
    // that exists, the run directory
    let overlay = LabOverlay::new(
        "deploy",
        "kruised",
        &image,
        &format!(
            "- {{op: add, path: /spec/template/spec/hostNetwork, value: true}}\n\
             - {{op: replace, path: /spec/template/spec/volumes/0/hostPath/path, value: {dir}}}\n\
             - {{op: replace, path: /spec/template/spec/volumes/1/hostPath/path, value: {dir}}}\n\
             - {{op: replace, path: /spec/template/spec/containers/0/args/1, value: \"--addr=:{port}\"}}\n\
             - {{op: replace, path: /spec/template/spec/containers/0/ports/0/containerPort, value: {port}}}\n{env}",
            dir = run_dir(&lab),
            env = in_cluster_env(&lab)
        ),
    );
    let selector = "app.kubernetes.io/name=kruised";
    let since = Instant::now();
    let installed = Installed {
        lab: &lab,
        name: "kruised",
    };
    kubectl(
        &lab,
        &["apply", "-k", &overlay.path().display().to_string()],
    );
    let (daemon_pod, took) = rolled_out(&scene.admin, "kruised", selector, &image, since).await;
    eprintln!("kubectl apply -k deploy/: the DaemonSet's pod Ready {took:?} after the apply");

    // the env-from-metadata scenario, as kruise-manager drives it, through that pod
    let image_v1 = lab.image("busybox:v1");
    scene
        .run_pod(scene.kruise_pod(
            "web",
            &[("main", &image_v1, &[("APP_CONFIG", "app-config")])],
        ))
        .await;
    let pods = scene.pods();
    let before = wait_for(
        &pods,
        "web",
        "annotated by the DaemonSet's kruised",
        |p: Option<&Pod>| {
            p.and_then(meta).is_some_and(|m| {
                m.container("main")
                    .is_some_and(|c| c.hashes.extracted_env_from_metadata_hash != 0)
            })
        },
    )
    .await;
    let old = status_of(&before, "main").container_id.clone().unwrap();
    assert_eq!(echo(&lab, &old, "APP_CONFIG").await, "v1");
    scene.set_update_ready("web", false).await;
    scene
        .patch_pod(
            "web",
            json!({"metadata": {"annotations": {"app-config": "v2"}}}),
        )
        .await;
    let after = wait_for(
        &pods,
        "web",
        "main restarted with the new value",
        |p: Option<&Pod>| {
            p.is_some_and(|p| {
                let s = status_of(p, "main");
                s.container_id.as_deref() != Some(old.as_str())
                    && s.state.as_ref().is_some_and(|st| st.running.is_some())
            })
        },
    )
    .await;
    let main = status_of(&after, "main");
    assert_eq!(main.restart_count, 1, "exactly one restart");
    assert_eq!(
        echo(&lab, main.container_id.as_deref().unwrap(), "APP_CONFIG").await,
        "v2",
        "the new container sees the new value"
    );

    let log = assert_log_never_forbidden(&scene.admin, &daemon_pod).await;
    assert!(
        log.contains("stopping container"),
        "the DaemonSet's kruised did the restart:\n{log}"
    );
    drop(installed);
    scene.cleanup().await;
}

/// The pod template's spec of the DaemonSet `kruise-daemon` now.
async fn template_spec(sets: &Api<DaemonSet>) -> PodSpec {
    sets.get("kruise-daemon")
        .await
        .expect("the DaemonSet")
        .spec
        .expect("spec")
        .template
        .spec
        .expect("pod spec")
}

#[tokio::test]
async fn the_swap_overlay_turns_kruises_chart_daemonset_into_kruised() {
    let Some(lab) = KubeLab::get() else { return };
    let _serial = KubeLab::serial().await;
    let admin = lab.admin().await;
    // an OpenKruise install: the chart's daemon objects and RBAC (its image cannot be pulled
    // here, as on a cluster whose nodes cannot reach Docker Hub; the swap replaces it)
    // the lab's install of the chart: the lab's socket directory as the host's run directory, a
    // free admin port, the API server's address (no kube-proxy here); the swap keeps all three
    let port = free_addr().port();
    let (host, api_port) = api_server(&lab);
    let chart = CHART_DAEMON_YAML
        .replace("path: /var/run", &format!("path: {}", run_dir(&lab)))
        .replace("--addr=:10221", &format!("--addr=:{port}"))
        .replace("port: 10221", &format!("port: {port}"))
        .replace(
            "        env:\n",
            &format!(
                "        env:\n        - name: KUBERNETES_SERVICE_HOST\n          value: \"{host}\"\n\
                 \x20       - name: KUBERNETES_SERVICE_PORT\n          value: \"{api_port}\"\n\
                 \x20       - name: USERS_OWN_SETTING\n          value: kept\n"
            ),
        )
        // a user's own flags (the field case: feature gates lost in the swap)
        .replace(
            "--feature-gates=ImagePullJobGate=true\n",
            &format!("--feature-gates={USERS_GATES}\n"),
        );
    cluster::apply_yaml(&admin, &chart).await;
    cluster::apply_yaml(&admin, CHART_RBAC_YAML).await;
    let sets: Api<DaemonSet> = Api::namespaced(admin.clone(), NAMESPACE);
    // the controller has written the install's revision (before its status): what
    // `rollout undo` goes back to
    let installed = wait_for(
        &sets,
        "kruise-daemon",
        "the chart's DaemonSet observed",
        |d: Option<&DaemonSet>| {
            d.is_some_and(|d| {
                d.status.as_ref().and_then(|s| s.observed_generation) == d.metadata.generation
            })
        },
    )
    .await
    .spec
    .expect("spec")
    .template
    .spec
    .expect("pod spec");
    let installed_args = installed.containers[0].args.clone();
    assert!(
        installed_args
            .iter()
            .flatten()
            .any(|a| *a == format!("--feature-gates={USERS_GATES}")),
        "the install has the user's gates: {installed_args:?}"
    );
    let image = push_image(&lab);
    // the documented swap: the overlay rendered (the lab's image, the probe on the lab's port)
    // and sent as a strategic-merge patch
    let overlay = LabOverlay::new(
        "deploy/overlays/swap-kruise-daemon",
        "kruise-daemon",
        &image,
        &format!(
            "- {{op: replace, path: /spec/template/spec/containers/0/readinessProbe/httpGet/port, value: {port}}}"
        ),
    );
    let rendered = kubectl(&lab, &["kustomize", &overlay.path().display().to_string()]);
    let patch = overlay.path().join("swap.yaml");
    std::fs::write(&patch, rendered).expect("write the rendered patch");
    let selector = "control-plane=daemon";
    let since = Instant::now();
    let uninstall = Installed {
        lab: &lab,
        name: "kruise-daemon",
    };
    kubectl(
        &lab,
        &[
            "-n",
            NAMESPACE,
            "patch",
            "daemonset",
            "kruise-daemon",
            "--type",
            "strategic",
            "--patch-file",
            &patch.display().to_string(),
        ],
    );
    let (pod, took) = rolled_out(&admin, "kruise-daemon", selector, &image, since).await;
    eprintln!("swap-kruise-daemon over the chart's DaemonSet: pod Ready {took:?} after the apply");
    let spec = pod.spec.as_ref().unwrap();
    assert_eq!(spec.service_account_name.as_deref(), Some("kruise-daemon"));
    assert_eq!(
        spec.containers[0].args, installed_args,
        "the install's arguments kept"
    );
    // the rest, in the template (the pod adds its service account token's volume and mount)
    let swapped = template_spec(&sets).await;
    let (now, then) = (&swapped.containers[0], &installed.containers[0]);
    assert_eq!(now.env, then.env, "the install's env kept");
    assert_eq!(now.volume_mounts, then.volume_mounts, "its mounts kept");
    assert_eq!(now.resources, then.resources, "its resources kept");
    assert_eq!(swapped.volumes, installed.volumes, "its volumes kept");
    assert_eq!(spec.containers[0].name, "daemon");
    assert_eq!(
        spec.containers[0].command.as_deref(),
        Some(&["/kruise-daemon".to_string()][..]),
        "the chart's command runs kruised"
    );
    let log = assert_log_never_forbidden(&admin, &pod).await;
    assert!(
        log.contains("no effect here"),
        "the chart's kruise-daemon flags were accepted:\n{log}"
    );
    // and the way back: the install's revision, exactly
    kubectl(
        &lab,
        &[
            "-n",
            NAMESPACE,
            "rollout",
            "undo",
            "daemonset/kruise-daemon",
        ],
    );
    assert_eq!(
        template_spec(&sets).await,
        installed,
        "rollout undo gives back the install's pod template"
    );
    drop(uninstall);
}
