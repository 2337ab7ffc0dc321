//! `kubelet-stand-in`: the kubelet's part of one node, for kruised's demo on a machine without
//! Kubernetes (`scripts/demo.sh --api double`): the API-server double plays the control plane,
//! a real containerd runs the containers, and this plays the kubelet between them. Test
//! infrastructure, never shipped.
//!
//! Every `--sync-period` it lists the pods bound to `--node-name` and, for each, does what the
//! kubelet does as far as kruised can tell, with the tests' one kubelet
//! (`kruised_test_support::kubelet`: its labels, env, hash, CRI steps and status):
//!
//! * a new pod gets a sandbox and its containers through CRI, with the kubelet's labels and
//!   annotations (pod identity, container hash, restart count, grace period), each image pulled
//!   as its `imagePullPolicy` says, and each env var resolved from the pod as it is at that
//!   moment (`fieldRef` to labels, annotations, name, namespace, uid, node name);
//! * a container that exited is created again with attempt + 1 and the env of the pod as it is
//!   now (restart policy `Always`; the last dead container is kept, older ones removed); one
//!   whose spec changed (its hash) is killed first, as the kubelet does;
//! * the pod status reports each container (ID with the runtime's prefix, image ID, restart
//!   count, running state, last termination) and the conditions, `Ready` only when every
//!   container runs and every readiness gate is True; it is patched only when it changed;
//! * a pod that left the API is stopped and removed, and so is every pod at SIGTERM or Ctrl-C.
//!
//! Not a kubelet: no volumes, probes, resources, init containers, networking (pods share the
//! host's network namespace) or restart backoff.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use clap::Parser;
use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::jiff::Timestamp;
use kruised::cri::{
    ContainerState, Endpoint, KubeletService, RemoteRuntime, RuntimeService, SandboxConfig,
    Timeouts,
};
use kruised::k8s::keys;
use kruised_test_support::kubelet::meta::PodRef;
use kruised_test_support::kubelet::status::{self, Report, rfc3339_ns};
use kruised_test_support::kubelet::{Kubelet, PullPolicy, spec};
use kube::api::{ListParams, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client};
use serde_json::json;

/// The kubelet's part of one node, on a real CRI runtime, for the API-server double.
#[derive(Debug, Parser)]
#[command(name = "kubelet-stand-in", version)]
struct Args {
    /// Kubeconfig of the API server (the double writes one).
    #[arg(long)]
    kubeconfig: PathBuf,
    /// The node whose pods this runs.
    #[arg(long)]
    node_name: String,
    /// The CRI runtime, `unix:///path` or a path.
    #[arg(long)]
    runtime_endpoint: Endpoint,
    /// Root of the pods' log directories.
    #[arg(long)]
    log_dir: PathBuf,
    /// Cgroup parent of the sandboxes (`<this>/pod<uid>`), cgroupfs.
    #[arg(long, default_value = "/cri-lab")]
    cgroup_root: String,
    /// How often pods and containers are compared (the kubelet relists every second).
    #[arg(long, default_value = "500ms", value_parser = parse_millis)]
    sync_period: Duration,
}

fn parse_millis(s: &str) -> Result<Duration, String> {
    let ms = s.strip_suffix("ms").unwrap_or(s);
    ms.parse::<u64>()
        .map(Duration::from_millis)
        .map_err(|e| format!("{s}: {e} (milliseconds, e.g. 500ms)"))
}

/// How long a pod that failed to start waits before the next try.
const RETRY_AFTER: Duration = Duration::from_secs(10);

/// A container this process created, as it stands.
struct Running {
    id: String,
    attempt: u32,
    /// The previous container of this name, exited, kept as the kubelet keeps one.
    dead: Option<String>,
    /// `lastState.terminated` of the status, once a container of this name exited.
    last_terminated: Option<serde_json::Value>,
}

/// A pod this process runs.
struct RunningPod {
    namespace: String,
    name: String,
    sandbox: String,
    sandbox_config: SandboxConfig,
    grace: Duration,
    containers: BTreeMap<String, Running>,
}

struct StandIn {
    args: Args,
    pods: Api<Pod>,
    kubelet: Kubelet,
    /// The runtime's name: the prefix of container IDs in the pod status.
    runtime_name: String,
    running: HashMap<String, RunningPod>,
    /// Pods whose start failed, by uid, and when.
    failed: HashMap<String, Instant>,
}

fn log(msg: impl std::fmt::Display) {
    eprintln!(
        "{} kubelet-stand-in: {msg}",
        Timestamp::now().strftime("%H:%M:%S%.3f")
    );
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let kubeconfig = Kubeconfig::read_from(&args.kubeconfig)
        .with_context(|| format!("reading {}", args.kubeconfig.display()))?;
    let config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    let client = Client::try_from(config)?;
    let runtime = RemoteRuntime::new(args.runtime_endpoint.clone(), None, Timeouts::default());
    let version = runtime
        .version()
        .await
        .with_context(|| format!("the runtime at {}", args.runtime_endpoint))?;
    log(format!(
        "node {}, runtime {} {} at {}",
        args.node_name, version.runtime_name, version.runtime_version, args.runtime_endpoint
    ));
    let mut kubelet = Kubelet::new(runtime, &args.log_dir);
    kubelet.cgroup_root = args.cgroup_root.clone();
    let mut stand_in = StandIn {
        pods: Api::all(client),
        kubelet,
        runtime_name: version.runtime_name,
        running: HashMap::new(),
        failed: HashMap::new(),
        args,
    };
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    loop {
        if let Err(e) = stand_in.sync().await {
            log(format!("sync: {e:#}"));
        }
        tokio::select! {
            _ = term.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
            () = tokio::time::sleep(stand_in.args.sync_period) => {}
        }
    }
    for (_, pod) in std::mem::take(&mut stand_in.running) {
        stand_in.remove(pod).await;
    }
    log("stopped; every pod it ran is removed");
    Ok(())
}

impl StandIn {
    async fn sync(&mut self) -> Result<()> {
        let selector = format!("spec.nodeName={}", self.args.node_name);
        let pods = self
            .pods
            .list(&ListParams::default().fields(&selector))
            .await
            .context("listing the node's pods")?;
        let mut seen = BTreeSet::new();
        for pod in &pods.items {
            let Some(uid) = pod.metadata.uid.clone() else {
                continue;
            };
            seen.insert(uid.clone());
            if let Err(e) = self.sync_pod(&uid, pod).await {
                log(format!(
                    "pod {}/{}: {e:#}",
                    pod.metadata.namespace.as_deref().unwrap_or_default(),
                    pod.metadata.name.as_deref().unwrap_or_default()
                ));
            }
        }
        let gone: Vec<String> = self
            .running
            .keys()
            .filter(|uid| !seen.contains(*uid))
            .cloned()
            .collect();
        for uid in gone {
            if let Some(pod) = self.running.remove(&uid) {
                self.remove(pod).await;
            }
        }
        self.failed.retain(|uid, _| seen.contains(uid));
        Ok(())
    }

    async fn sync_pod(&mut self, uid: &str, pod: &Pod) -> Result<()> {
        if !self.running.contains_key(uid) {
            if self
                .failed
                .get(uid)
                .is_some_and(|at| at.elapsed() < RETRY_AFTER)
            {
                return Ok(());
            }
            match self.start_pod(uid, pod).await {
                Ok(running) => {
                    self.failed.remove(uid);
                    self.running.insert(uid.to_string(), running);
                }
                Err(e) => {
                    self.failed.insert(uid.to_string(), Instant::now());
                    return Err(e);
                }
            }
        }
        let Some(mut running) = self.running.remove(uid) else {
            return Ok(());
        };
        let result = self.sync_containers(pod, &mut running).await;
        self.running.insert(uid.to_string(), running);
        result
    }

    /// Creates again the containers that exited or whose spec changed, then reports the
    /// containers in the pod status when what it reports changed.
    async fn sync_containers(&self, pod: &Pod, running: &mut RunningPod) -> Result<()> {
        let runtime = self.kubelet.runtime();
        let mut reports = Vec::new();
        let sandbox = (running.sandbox.clone(), running.sandbox_config.clone());
        for c in pod.spec.iter().flat_map(|s| &s.containers) {
            let Some(r) = running.containers.get_mut(&c.name) else {
                continue;
            };
            let mut status = runtime.container_status(&r.id, false).await?;
            let exited = status.state == ContainerState::Exited;
            // a runtime that keeps no annotations tells of no change
            let recorded = status.annotations.get(keys::KUBELET_CONTAINER_HASH);
            let changed = recorded.is_some_and(|h| *h != spec::hash(c));
            if exited || changed {
                // the kubelet kills a container whose spec changed, with the pod's grace
                let old = r.id.clone();
                let kill = (!exited).then_some((old.as_str(), running.grace));
                r.attempt += 1;
                r.id = self
                    .start_container(pod, c, r.attempt, &sandbox, kill)
                    .await?;
                let dead = runtime.container_status(&old, false).await?;
                r.last_terminated = Some(json!({
                    "exitCode": dead.exit_code,
                    "reason": dead.reason,
                    "startedAt": rfc3339_ns(dead.started_at),
                    "finishedAt": rfc3339_ns(dead.finished_at),
                    "containerID": format!("{}://{old}", self.runtime_name),
                }));
                if let Some(older) = r.dead.replace(old) {
                    let _ = runtime.remove_container(&older).await;
                }
                let why = if exited { "exited" } else { "changed" };
                log(format!(
                    "pod {}/{}: container {} {why} ({}), started again as {} (restartCount {})",
                    running.namespace, running.name, c.name, dead.exit_code, r.id, r.attempt
                ));
                status = runtime.container_status(&r.id, false).await?;
            }
            let is_running = status.state == ContainerState::Running;
            reports.push(Report {
                name: c.name.clone(),
                container_id: format!("{}://{}", self.runtime_name, r.id),
                image: c.image.clone().unwrap_or_default(),
                image_id: if status.image_ref.is_empty() {
                    status.image_id
                } else {
                    status.image_ref
                },
                restart_count: r.attempt,
                running: is_running.then(|| rfc3339_ns(status.started_at)),
                waiting: Some("ContainerCreating".into()),
                last_terminated: r.last_terminated.clone(),
            });
        }
        let pod_json = serde_json::to_value(pod)?;
        let containers = reports.iter().map(Report::json).collect();
        let status = status::pod_status(&pod_json, &pod_json, containers);
        if status::changed(&pod_json, &status) {
            Api::<Pod>::namespaced(self.pods.clone().into_client(), &running.namespace)
                .patch_status(
                    &running.name,
                    &PatchParams::default(),
                    &Patch::Strategic(json!({ "status": status })),
                )
                .await
                .context("patching the pod status")?;
        }
        Ok(())
    }

    async fn start_pod(&self, uid: &str, pod: &Pod) -> Result<RunningPod> {
        let spec = pod.spec.as_ref().context("the pod has no spec")?;
        let pod_ref = PodRef::of(pod);
        let meta = &pod.metadata;
        let labels = meta.labels.clone().unwrap_or_default();
        let sandbox_config = spec::sandbox_config(
            pod_ref,
            0,
            &labels,
            meta.annotations.clone().unwrap_or_default(),
            &self.args.log_dir,
            &self.args.cgroup_root,
        );
        std::fs::create_dir_all(&sandbox_config.log_directory).with_context(|| {
            format!(
                "creating the log directory {}",
                sandbox_config.log_directory
            )
        })?;
        let runtime = self.kubelet.runtime();
        let mut running = RunningPod {
            namespace: pod_ref.namespace.into(),
            name: pod_ref.name.into(),
            sandbox: runtime.run_pod_sandbox(sandbox_config.clone()).await?,
            sandbox_config,
            grace: Duration::from_secs(spec::grace_seconds(pod).try_into().unwrap_or(30)),
            containers: BTreeMap::new(),
        };
        for c in &spec.containers {
            match self
                .start_container(
                    pod,
                    c,
                    0,
                    &(running.sandbox.clone(), running.sandbox_config.clone()),
                    None,
                )
                .await
            {
                Ok(id) => {
                    let r = Running {
                        id,
                        attempt: 0,
                        dead: None,
                        last_terminated: None,
                    };
                    running.containers.insert(c.name.clone(), r);
                }
                Err(e) => {
                    self.remove(running).await;
                    return Err(e.context(format!("container {}", c.name)));
                }
            }
        }
        let ids: Vec<String> = running
            .containers
            .iter()
            .map(|(n, r)| format!("{n}={}", r.id))
            .collect();
        log(format!(
            "pod {}/{} (uid {uid}): sandbox {} with {}",
            running.namespace,
            running.name,
            running.sandbox,
            ids.join(" ")
        ));
        Ok(running)
    }

    /// Starts container `c` of `pod` with `attempt` as the kubelet does, killing `kill` first:
    /// the image step (a pull as its policy says), the create, the start.
    async fn start_container(
        &self,
        pod: &Pod,
        c: &Container,
        attempt: u32,
        (sandbox, sandbox_config): &(String, SandboxConfig),
        kill: Option<(&str, Duration)>,
    ) -> Result<String> {
        let config = spec::container_config(pod, c, attempt);
        let policy = PullPolicy::of_container(c);
        self.kubelet
            .start_config(sandbox, config, policy, sandbox_config.clone(), kill)
            .await
            .map_err(|e| anyhow!("starting the container: {e}"))
    }

    /// Stops and removes a pod's containers and sandbox, as the kubelet does for a deleted pod.
    async fn remove(&self, pod: RunningPod) {
        for r in pod.containers.values() {
            if let Err(e) = self
                .kubelet
                .runtime()
                .stop_container(&r.id, pod.grace)
                .await
            {
                log(format!("stopping {}: {e}", r.id));
            }
        }
        match self.kubelet.remove_sandbox(&pod.sandbox).await {
            Ok(()) => log(format!("pod {}/{}: removed", pod.namespace, pod.name)),
            Err(e) => log(format!(
                "pod {}/{}: removing sandbox {}: {e}",
                pod.namespace, pod.name, pod.sandbox
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kruised::hash::kubelet::{format_hash, hash_container};
    use serde_json::Value;

    fn pod_status(pod: &Pod, containers: Vec<Value>) -> Value {
        let pod = serde_json::to_value(pod).expect("a pod's JSON");
        status::pod_status(&pod, &pod, containers)
    }

    fn pod(gate_status: Option<&str>) -> Pod {
        let mut conditions = vec![json!({"type": "Ready", "status": "False",
                                         "lastTransitionTime": "2026-01-01T00:00:00Z"})];
        if let Some(s) = gate_status {
            conditions.push(json!({"type": "InPlaceUpdateReady", "status": s}));
        }
        serde_json::from_value(json!({
            "metadata": {"name": "web-0", "namespace": "demo", "uid": "u1",
                         "labels": {"tier": "front"}, "annotations": {"app-config": "v1"}},
            "spec": {"nodeName": "n1", "readinessGates": [{"conditionType": "InPlaceUpdateReady"}],
                     "containers": [{"name": "app", "image": "busybox", "env": [
                        {"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['app-config']"}}},
                        {"name": "L", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['tier']"}}},
                        {"name": "N", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                        {"name": "H", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                        {"name": "P", "value": "plain"},
                        {"name": "M", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['missing']"}}}]}]},
            "status": {"conditions": conditions}
        }))
        .expect("a pod")
    }

    fn condition(status: &Value, type_: &str) -> (String, String) {
        let c = status["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == type_))
            .unwrap_or_else(|| panic!("no {type_} condition in {status}"));
        (
            c["status"].as_str().unwrap_or_default().to_string(),
            c["lastTransitionTime"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        )
    }

    fn running() -> Vec<Value> {
        vec![json!({"name": "app", "ready": true})]
    }

    #[test]
    fn the_pod_is_ready_only_when_its_containers_run_and_every_readiness_gate_is_true() {
        assert_eq!(
            condition(&pod_status(&pod(Some("True")), running()), "Ready").0,
            "True"
        );
        assert_eq!(
            condition(&pod_status(&pod(Some("False")), running()), "Ready").0,
            "False"
        );
        assert_eq!(
            condition(&pod_status(&pod(None), running()), "Ready").0,
            "False"
        );
        let stopped = vec![json!({"name": "app", "ready": false})];
        let status = pod_status(&pod(Some("True")), stopped);
        assert_eq!(condition(&status, "Ready").0, "False");
        assert_eq!(condition(&status, "ContainersReady").0, "False");
    }

    #[test]
    fn ready_false_gives_the_kubelets_reason_which_kruised_reads() {
        let reason = |status: &Value| {
            status["conditions"]
                .as_array()
                .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
                .map(|c| c["reason"].clone())
        };
        let gate = pod_status(&pod(Some("False")), running());
        assert_eq!(reason(&gate), Some(json!("ReadinessGatesNotReady")));
        let stopped = vec![json!({"name": "app", "ready": false})];
        let containers = pod_status(&pod(Some("False")), stopped);
        assert_eq!(reason(&containers), Some(json!("ContainersNotReady")));
        let ready = pod_status(&pod(Some("True")), running());
        assert_eq!(reason(&ready), Some(Value::Null));
    }

    #[test]
    fn a_condition_keeps_its_transition_time_until_its_status_changes() {
        let unchanged = pod_status(&pod(Some("False")), running());
        assert_eq!(
            condition(&unchanged, "Ready"),
            ("False".to_string(), "2026-01-01T00:00:00Z".to_string())
        );
        let changed = pod_status(&pod(Some("True")), running());
        assert_ne!(condition(&changed, "Ready").1, "2026-01-01T00:00:00Z");
    }

    #[test]
    fn env_is_resolved_from_the_pod_as_it_is_when_the_container_is_created() {
        let p = pod(None);
        let c = &p.spec.as_ref().expect("spec").containers[0];
        let config = spec::container_config(&p, c, 2);
        let env: BTreeMap<_, _> = config.envs.iter().cloned().collect();
        assert_eq!(env["A"], "v1");
        assert_eq!(env["L"], "front");
        assert_eq!(env["N"], "web-0");
        assert_eq!(env["H"], "n1");
        assert_eq!(env["P"], "plain");
        assert_eq!(
            env["M"], "",
            "a missing key resolves to empty, as in the kubelet"
        );
        assert_eq!(config.metadata.attempt, 2);
        assert_eq!(
            config.annotations[keys::KUBELET_CONTAINER_RESTART_COUNT],
            "2"
        );
        assert_eq!(
            config.annotations[keys::KUBELET_CONTAINER_HASH],
            format_hash(hash_container(c))
        );
        assert_eq!(config.labels[keys::KUBELET_POD_UID], "u1");
    }

    #[test]
    fn a_missing_pull_policy_is_the_api_servers_default_for_the_image() {
        for (image, want) in [
            ("busybox", PullPolicy::Always),
            ("r.io/busybox:latest", PullPolicy::Always),
            ("r.io:5000/busybox:v1", PullPolicy::IfNotPresent),
            ("r.io/busybox@sha256:ab", PullPolicy::IfNotPresent),
        ] {
            assert_eq!(PullPolicy::of(None, image), want, "{image}");
        }
        assert_eq!(PullPolicy::of(Some("Never"), "busybox"), PullPolicy::Never);
    }

    #[tokio::test]
    async fn a_recreate_kills_then_pulls_as_the_policy_says_then_starts() {
        use kruised::cri::fake::FakeRuntime;
        use kruised_test_support::kubelet::cri::{
            ensure_image_fake, recreate_fake, sandbox_fake, start_fake,
        };
        let dir = std::env::temp_dir().join(format!("kubelet-stand-in-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory");
        let cri = FakeRuntime::start(&dir.join("cri.sock"), "containerd")
            .await
            .expect("the fake runtime");
        let p = pod(None);
        let sandbox = sandbox_fake(&cri, &p);
        let mut c = p.spec.as_ref().expect("spec").containers[0].clone();
        let old = start_fake(&cri, &p, &sandbox, &c, 0, true, true);
        c.image = Some("r.io/app:v2".into());
        c.image_pull_policy = Some("Never".into());
        let never = recreate_fake(&cri, &p, &sandbox, &c, Some((&old, 137)), 1);
        let e = never.expect_err("a missing image with policy Never");
        assert_eq!(e.reason, "ErrImageNeverPull");
        assert_eq!(
            cri.state().containers[&old].status.state,
            ContainerState::Exited,
            "killed first"
        );
        c.image_pull_policy = Some("IfNotPresent".into());
        let new = recreate_fake(&cri, &p, &sandbox, &c, None, 1).expect("pulled, started");
        assert!(cri.state().find_image("r.io/app:v2").is_some());
        assert_eq!(cri.state().containers[&new].status.metadata.attempt, 1);
        let pulled = |policy| ensure_image_fake(&cri, "r.io/app:v2", policy).map(|s| s.pulled);
        assert!(!pulled(PullPolicy::IfNotPresent).expect("present"));
        assert!(pulled(PullPolicy::Always).expect("pulled again"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
