//! The swap of kruised into kruise's Helm-made DaemonSet (`deploy/overlays/swap-kruise-daemon`)
//! as an operator makes it: `kubectl kustomize` renders the patch, `kubectl patch --type
//! strategic` sends it, to the API-server double, which merges a DaemonSet's pod template by the
//! real server's merge keys (containers, env and volumes by name, volumeMounts by mountPath,
//! args replaced whole). The field report this answers: `kubectl apply -k` of the overlay's
//! earlier whole-object form put the chart's default arguments back over a user's
//! `--feature-gates=ImagePullJobGate=true,PodProbeMarkerGate=true --socket-file=crio.sock`.
//!
//! kubectl is Debian's (1.36, `tests/kubectl.sh DIR` fetches it), named by `KRUISED_KUBECTL`;
//! without it the tests that run it skip with a message, or fail under
//! `KRUISED_REQUIRE_KUBECTL=1`. What only a real cluster shows: the DaemonSet controller
//! writing the ControllerRevision that `kubectl rollout undo` reads (here its data is built as
//! the controller builds it), and the real server's defaulting and validation of DaemonSets
//! (the double has neither).

use std::path::{Path, PathBuf};
use std::time::Duration;

use apiserver_double::{ApiServer, Handle};
use serde_json::{Value, json};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const OVERLAY: &str = "deploy/overlays/swap-kruise-daemon";
const CHART_DAEMON_YAML: &str = include_str!("../fixtures/kruise-chart/daemon.yaml");
const NAMESPACE: &str = "kruise-system";
const NAME: &str = "kruise-daemon";
/// One kubectl run against the in-process double: start, discovery, one request.
const KUBECTL_LIMIT: Duration = Duration::from_secs(60);
/// The container's image after the swap: the overlay's `images:` entry (`newTag: 0.1.0`).
const KRUISED_IMAGE: &str = "kruised:0.1.0";

/// `KRUISED_KUBECTL`, or `None` with a message (a failure under `KRUISED_REQUIRE_KUBECTL=1`).
fn kubectl() -> Option<PathBuf> {
    let named = std::env::var_os("KRUISED_KUBECTL");
    if let Some(path) = &named {
        let path = PathBuf::from(path);
        assert!(
            path.is_file(),
            "KRUISED_KUBECTL={} is not a file (tests/kubectl.sh DIR puts one in DIR)",
            path.display()
        );
        return Some(path);
    }
    assert!(
        std::env::var("KRUISED_REQUIRE_KUBECTL").as_deref() != Ok("1"),
        "KRUISED_REQUIRE_KUBECTL=1 and KRUISED_KUBECTL is not set (tests/kubectl.sh DIR fetches \
         Debian's kubectl)"
    );
    eprintln!(
        "SKIPPING: KRUISED_KUBECTL is not set (tests/kubectl.sh DIR fetches Debian's kubectl)"
    );
    None
}

/// kubectl with the double's kubeconfig (its discovery cache beside it, not in `$HOME`);
/// returns stdout, fails the test on a non-zero exit.
async fn run(kubectl: &Path, kubeconfig: &Path, args: &[&str]) -> String {
    let cache = kubeconfig.with_file_name("kube-cache");
    let out = tokio::process::Command::new(kubectl)
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env("KUBECACHEDIR", cache)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(KUBECTL_LIMIT, out)
        .await
        .unwrap_or_else(|_| {
            panic!(
                "kubectl {} did not end in {KUBECTL_LIMIT:?}",
                args.join(" ")
            )
        })
        .unwrap_or_else(|e| panic!("run {}: {e}", kubectl.display()));
    assert!(
        out.status.success(),
        "kubectl {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The chart's DaemonSet (tests/fixtures/kruise-chart/daemon.yaml) as a user's values make it:
/// more feature gates, CRI-O's socket, a credential provider with its config, plugins and AWS
/// credentials (the chart's `daemon.credentialProvider` values: docs/kruise-wire.md), a proxy
/// (`daemon.extraEnvs`) and more memory.
fn users_chart_daemonset() -> Value {
    let mut ds = serde_saphyr::from_multiple::<Value>(CHART_DAEMON_YAML)
        .expect("the chart fixture is YAML")
        .into_iter()
        .find(|d| d["kind"] == "DaemonSet")
        .expect("the chart fixture has the DaemonSet");
    let c = &mut ds["spec"]["template"]["spec"]["containers"][0];
    c["args"] = json!([
        "--logtostderr=true",
        "--v=4",
        "--addr=:10221",
        "--feature-gates=ImagePullJobGate=true,PodProbeMarkerGate=true",
        "--socket-file=crio.sock",
        "--enable-pprof=true",
        "--pprof-addr=localhost:10222",
        "--plugin-config-file=/credential-provider-config/CredentialProviderPlugin.yaml",
        "--plugin-bin-dir=/credential-provider-plugin"
    ]);
    push(
        &mut c["env"],
        json!({"name": "HTTPS_PROXY", "value": "http://proxy.internal:3128"}),
    );
    for (name, path) in [
        ("credential-provider-config", "/credential-provider-config"),
        ("credential-provider-plugin", "/credential-provider-plugin"),
        ("aws-credentials", "/root/.aws"),
    ] {
        push(
            &mut c["volumeMounts"],
            json!({"name": name, "mountPath": path, "readOnly": true}),
        );
    }
    c["resources"] = json!({"limits": {"cpu": "200m", "memory": "256Mi"},
                            "requests": {"cpu": "10m", "memory": "64Mi"}});
    let pod = &mut ds["spec"]["template"]["spec"];
    push(
        &mut pod["volumes"],
        json!({"name": "credential-provider-config",
               "configMap": {"name": "kruise-credential-provider"}}),
    );
    push(
        &mut pod["volumes"],
        json!({"name": "credential-provider-plugin",
               "hostPath": {"path": "/etc/kubernetes/credential-providers", "type": ""}}),
    );
    push(
        &mut pod["volumes"],
        json!({"name": "aws-credentials", "hostPath": {"path": "/root/.aws", "type": ""}}),
    );
    ds
}

fn push(list: &mut Value, item: Value) {
    list.as_array_mut().expect("a list").push(item);
}

/// The JSON pointers under which `a` and `b` differ: a key only one has is one pointer, as is
/// a list whose length changed.
fn differences(a: &Value, b: &Value, at: &str, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                let (l, r) = (x.get(k), y.get(k));
                let here = format!("{at}/{k}");
                match (l, r) {
                    (Some(l), Some(r)) => differences(l, r, &here, out),
                    _ => out.push(here),
                }
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (l, r)) in x.iter().zip(y).enumerate() {
                differences(l, r, &format!("{at}/{i}"), out);
            }
        }
        _ if a != b => out.push(at.to_string()),
        _ => {}
    }
}

/// Every key in `v`, at any depth.
fn keys(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                out.push(k.clone());
                keys(v, out);
            }
        }
        Value::Array(a) => a.iter().for_each(|v| keys(v, out)),
        _ => {}
    }
}

/// What the swap may change in the DaemonSet's spec, and nothing else.
const CHANGED_BY_THE_SWAP: [&str; 3] = [
    "/spec/template/spec/containers/0/image",
    "/spec/template/spec/containers/0/readinessProbe",
    "/spec/template/spec/containers/0/securityContext/runAsUser",
];

/// A double holding the user's chart-made DaemonSet (created as Helm creates it: no
/// `last-applied-configuration`), and a kubeconfig for kubectl.
struct Install {
    api: Handle,
    dir: tempfile::TempDir,
    before: Value,
}

impl Install {
    async fn new() -> Install {
        let api = ApiServer::start("127.0.0.1:0".parse().expect("addr"))
            .await
            .expect("start the API double");
        let dir = tempfile::tempdir().expect("tempdir");
        api.write_kubeconfig(dir.path().join("kubeconfig"))
            .expect("kubeconfig");
        let before = api
            .create("daemonsets", users_chart_daemonset())
            .expect("create the chart's DaemonSet");
        Install { api, dir, before }
    }

    fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("kubeconfig")
    }

    fn daemonset(&self) -> Value {
        self.api
            .get("daemonsets", NAMESPACE, NAME)
            .expect("the DaemonSet")
    }

    /// The documented swap: render the overlay, patch the DaemonSet with it.
    async fn swap(&self, kubectl: &Path) -> Value {
        let rendered = run(kubectl, &self.kubeconfig(), &["kustomize", &overlay()]).await;
        let file = self.dir.path().join("swap.yaml");
        std::fs::write(&file, &rendered).expect("write the rendered patch");
        run(
            kubectl,
            &self.kubeconfig(),
            &[
                "-n",
                NAMESPACE,
                "patch",
                "daemonset",
                NAME,
                "--type",
                "strategic",
                "--patch-file",
                &file.display().to_string(),
            ],
        )
        .await;
        self.daemonset()
    }

    /// `kubectl patch --type strategic -p <patch>`.
    async fn patch(&self, kubectl: &Path, patch: &Value) {
        run(
            kubectl,
            &self.kubeconfig(),
            &[
                "-n",
                NAMESPACE,
                "patch",
                "daemonset",
                NAME,
                "--type",
                "strategic",
                "-p",
                &patch.to_string(),
            ],
        )
        .await;
    }
}

fn overlay() -> String {
    Path::new(ROOT).join(OVERLAY).display().to_string()
}

fn spec_differences(before: &Value, after: &Value) -> Vec<String> {
    let mut found = Vec::new();
    differences(&before["spec"], &after["spec"], "/spec", &mut found);
    found
}

// The report: `kubectl apply -k` of the overlay's whole-object form over a chart install put
// the chart's default args back (the user's feature gates and --socket-file were lost). The
// real server merges a pod template's containers by name and replaces `args` whole (k8s.io/api
// core/v1 types.go patch tags; tests/apiserver/src/patch.rs `merge_key`): a patch that names
// only the image, the probe and the user cannot touch the rest.
#[tokio::test]
async fn the_swap_patch_changes_only_the_image_the_probe_and_the_user_and_keeps_the_users_args_env_volumes_and_resources()
 {
    let Some(kubectl) = kubectl() else { return };
    let install = Install::new().await;
    let after = install.swap(&kubectl).await;

    let patches: Vec<_> = install
        .api
        .requests()
        .into_iter()
        .filter(|r| r.verb == "patch" && r.resource == "daemonsets")
        .collect();
    assert_eq!(patches.len(), 1, "one PATCH: {patches:#?}");
    assert_eq!(
        patches[0].content_type.as_deref(),
        Some("application/strategic-merge-patch+json"),
        "a strategic merge"
    );
    assert_eq!(
        spec_differences(&install.before, &after),
        CHANGED_BY_THE_SWAP,
        "only what the swap must change"
    );
    let c = &after["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["image"], KRUISED_IMAGE);
    assert_eq!(
        c["readinessProbe"]["httpGet"],
        json!({"path": "/readyz", "port": 10221, "scheme": "HTTP"})
    );
    assert_eq!(c["securityContext"]["runAsUser"], 0);
    assert_eq!(
        c["securityContext"]["capabilities"],
        install.before["spec"]["template"]["spec"]["containers"][0]["securityContext"]["capabilities"],
        "the rest of the chart's securityContext stays"
    );
    let args: Vec<&str> = c["args"]
        .as_array()
        .expect("args")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for kept in [
        "--feature-gates=ImagePullJobGate=true,PodProbeMarkerGate=true",
        "--socket-file=crio.sock",
        "--plugin-config-file=/credential-provider-config/CredentialProviderPlugin.yaml",
    ] {
        assert!(args.contains(&kept), "{kept} kept: {args:?}");
    }
    assert!(
        after["metadata"]["annotations"]
            .get("kubectl.kubernetes.io/last-applied-configuration")
            .is_none(),
        "kubectl patch writes no last-applied-configuration (a later apply deletes nothing)"
    );
}

// `kubectl rollout undo ds/<name>` patches the DaemonSet with the previous ControllerRevision's
// data, a strategic merge (kubectl's DaemonSetRollbacker.Rollback, StrategicMergePatchType), and
// the DaemonSet controller writes that data as the whole template marked `$patch: replace`
// (pkg/controller/daemon/update.go `getPatch`). The double has no controller: the revision's
// data is built here as the controller builds it, and sent as rollout undo sends it.
#[tokio::test]
async fn rollout_undos_patch_of_the_previous_revision_gives_back_the_charts_template_exactly() {
    let Some(kubectl) = kubectl() else { return };
    let install = Install::new().await;
    let swapped = install.swap(&kubectl).await;
    assert_ne!(
        swapped["spec"]["template"],
        install.before["spec"]["template"]
    );
    let mut template = install.before["spec"]["template"].clone();
    template["$patch"] = json!("replace");
    let revision_data = json!({"spec": {"template": template}});
    install.patch(&kubectl, &revision_data).await;
    let back = install.daemonset();
    assert_eq!(
        back["spec"],
        install.before["spec"],
        "the template before the swap, exactly: {:?}",
        spec_differences(&install.before, &back)
    );
}

// docs/migrating.md, "The way back" without history: `helm upgrade --reuse-values` puts the
// chart's image back (Helm 3's three-way merge sets what the chart sets), then a patch removes
// what the swap added. Helm's part is played by a patch of the image.
#[tokio::test]
async fn without_history_the_image_put_back_and_the_documented_patch_give_back_the_charts_template()
{
    let Some(kubectl) = kubectl() else { return };
    let install = Install::new().await;
    install.swap(&kubectl).await;
    let chart_image = install.before["spec"]["template"]["spec"]["containers"][0]["image"].clone();
    install
        .patch(
            &kubectl,
            &json!({"spec": {"template": {"spec": {"containers": [
                {"name": "daemon", "image": chart_image}]}}}}),
        )
        .await;
    let documented = json!({"spec": {"template": {"spec": {"containers": [{"name": "daemon",
        "readinessProbe": null, "securityContext": {"runAsUser": null}}]}}}});
    let doc = std::fs::read_to_string(Path::new(ROOT).join("docs/migrating.md"))
        .expect("docs/migrating.md");
    assert!(
        doc.contains(&documented.to_string()),
        "docs/migrating.md documents this patch: {documented}"
    );
    install.patch(&kubectl, &documented).await;
    let back = install.daemonset();
    assert_eq!(
        spec_differences(&install.before, &back),
        Vec::<String>::new(),
        "the chart's template again"
    );
}

// Always runs, kubectl or not: the patch names nothing the user sets, and merged by the
// double's strategic merge (the real server's merge keys) over the user's DaemonSet it changes
// only what the swap must.
#[test]
fn the_overlays_patch_names_no_args_env_volumes_or_resources_and_merges_into_the_users_daemonset() {
    let dir = Path::new(ROOT).join(OVERLAY);
    let kustomization: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(dir.join("kustomization.yaml")).expect("kustomization.yaml"),
    )
    .expect("kustomization.yaml is YAML");
    assert_eq!(kustomization["resources"], json!(["patch.yaml"]));
    let mut patch: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(dir.join("patch.yaml")).expect("patch.yaml"),
    )
    .expect("patch.yaml is YAML");
    let mut named = Vec::new();
    keys(&patch, &mut named);
    for never in [
        "args",
        "command",
        "env",
        "envFrom",
        "volumes",
        "volumeMounts",
        "resources",
        "livenessProbe",
        "tolerations",
        "hostNetwork",
    ] {
        assert!(
            !named.iter().any(|k| k == never),
            "patch.yaml names {never}"
        );
    }
    // the image as kustomize sets it (`images:` name kruised, newTag)
    let image = &kustomization["images"][0];
    assert_eq!(image["name"], "kruised");
    let c = &mut patch["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["image"], "kruised");
    c["image"] = json!(format!(
        "kruised:{}",
        image["newTag"].as_str().expect("newTag")
    ));
    assert_eq!(c["image"], KRUISED_IMAGE);

    let before = users_chart_daemonset();
    let mut after = before.clone();
    apiserver_double::strategic_merge(&mut after, &patch).expect("a strategic merge patch");
    assert_eq!(spec_differences(&before, &after), CHANGED_BY_THE_SWAP);
}

/// The environment in the image's config that `scripts/build-image.sh` writes, packaging
/// `binary` into `out` (not target/dist).
fn image_env(binary: &Path, out: &Path) -> Vec<String> {
    let built = std::process::Command::new("bash")
        .arg(Path::new(ROOT).join("scripts/build-image.sh"))
        .arg("--binary")
        .arg(binary)
        .arg("--out")
        .arg(out)
        .output()
        .expect("run scripts/build-image.sh");
    assert!(
        built.status.success(),
        "scripts/build-image.sh: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    let blob = |digest: &str| -> Value {
        let hex = digest.strip_prefix("sha256:").expect("a sha256 digest");
        let text = std::fs::read_to_string(out.join("oci/blobs/sha256").join(hex))
            .expect("a blob of the image");
        serde_json::from_str(&text).expect("JSON")
    };
    let index: Value = serde_json::from_str(
        &std::fs::read_to_string(out.join("oci/index.json")).expect("index.json"),
    )
    .expect("JSON");
    let manifest = blob(index["manifests"][0]["digest"].as_str().expect("digest"));
    let config = blob(manifest["config"]["digest"].as_str().expect("digest"));
    config["config"]["Env"]
        .as_array()
        .expect("Env")
        .iter()
        .filter_map(|e| e.as_str().map(str::to_string))
        .collect()
}

// Field report: ECR's and other credential plugins read `$HOME/.aws`; kruise's chart mounts the
// host's AWS credentials at /root/.aws (docs/kruise-wire.md, the daemon's optional volumes), and
// with no HOME in the image the runtime gives a user without a passwd entry HOME=/ (runc's
// default), so the plugins looked in /.aws. The swap leaves the chart's env as it is: the
// image's HOME is what kruised, and the plugins it runs, get there.
#[test]
fn the_image_sets_home_to_root_where_kruises_chart_mounts_the_aws_credentials() {
    // any static binary will do for the image's config; Debian's busybox-static is one, and
    // tests/cri-lab.sh installs it
    let busybox = Path::new("/bin/busybox");
    if !busybox.is_file() {
        eprintln!("SKIPPING: no /bin/busybox (busybox-static) to package as the image's binary");
        return;
    }
    let out = tempfile::tempdir().expect("tempdir");
    let env = image_env(busybox, out.path());
    assert!(env.iter().any(|e| e == "HOME=/root"), "{env:?}");
    assert!(
        env.iter().any(|e| e.starts_with("PATH=")),
        "the image names the default PATH too (containerd's oci.WithImageConfig, as ctr and \
         nerdctl run it, gives it only to an image without an environment): {env:?}"
    );
}
