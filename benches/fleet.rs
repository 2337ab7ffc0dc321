//! A fleet on one machine: N simulated nodes against one real kube-apiserver + etcd
//! (`tests/fleet-lab.sh`; where its binaries are not provided, the API-server double, with the
//! same identities and RBAC, and without the API server's own figures), each node a Node object, a CRI server of its own and the kubelet's
//! part played by `kruised_test_support::fleet`, and one real node daemon process per node:
//! kruise-daemon, then kruised, each run as its DaemonSet runs it. For each daemon, three
//! scenarios, figures from the API server's audit log (every daemon has its own user) and from
//! `/proc`:
//!
//! 1. rollout: every daemon started at once; requests by verb and resource until the last is
//!    ready, the time until then, the API server's CPU and memory;
//! 2. at rest: requests a minute, the watches the API server holds open, its CPU, and each
//!    daemon's resident memory, all of it and by kind (anon, file: `support::daemon::Resident`);
//! 3. a fleet-wide in-place update of one env-from-metadata value of every pod, 10 % of the
//!    pods at a time as kruise-manager rolls out (`InPlaceUpdateReady=False`, then the
//!    annotation): restarts per pod (exactly one is right, and one more where a kubelet
//!    recreated the container from the pod as it was before the change: its watch behind the
//!    daemon's, which the real kubelet's can be too; counted as stale recreations), API writes
//!    per pod, time to done.
//!
//! Run (root: kruise-daemon runs in a mount namespace of its own; the Kubernetes binaries, a
//! directory holding kube-apiserver, etcd and kubectl, in `KRUISED_KUBE_ASSETS`):
//!
//!     KRUISED_KRUISE_DAEMON=/path/to/kruise-daemon KRUISED_TEST_BIN=target/dist/kruised \
//!     KRUISED_FLEET_NODES=10,50,100 cargo bench --bench fleet
//!     # KRUISED_FLEET_PODS (30 a node), KRUISED_FLEET_REST_SECS (600)
//!     # one node of 100 pods at rest (docs/PERFORMANCE.md's memory figures):
//!     # KRUISED_FLEET_NODES=1 KRUISED_FLEET_PODS=100 KRUISED_FLEET_REST_SECS=60
//!
//! Under `cargo test` (no `--bench` argument) a smoke run (5 nodes, 2 pods each, 5 s at rest,
//! the update half the pods at a time) checks the harness, kruised alone unless `KRUISED_KRUISE_DAEMON` is set, and asserts what
//! must hold: every daemon ready, one restart per pod for the change under kruised (and one
//! more only after a stale recreation).

#![allow(
    clippy::unwrap_used,
    reason = "benchmark code: a failed unwrap is a failed run"
)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kruised::k8s::keys;
use kruised_test_support as support;
use kruised_test_support::daemon::{ByMapping, Resident};
use kruised_test_support::wait;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use support::fleet::{
    FleetDaemon, FleetLab, Kind, Kubelets, NAMESPACE, ProcUsage, SimNode, wait_ready,
};

/// The field manager of the harness's writes as the manager (kruise-manager's).
const MANAGER: &str = "kruise-manager";
/// How often a wait on the fleet's kubelets looks at what runs (each look lists every pod).
const LOOK_EVERY: Duration = Duration::from_millis(200);

struct Sizes {
    nodes: Vec<usize>,
    pods_per_node: usize,
    rest: Duration,
    /// The share of the pods updated at once, percent.
    wave_percent: usize,
}

/// Requests by (verb, resource).
type Counts = BTreeMap<(String, String), u64>;

#[derive(Default)]
struct Figures {
    rollout: Duration,
    rollout_counts: Counts,
    rollout_api: ProcUsage,
    rest_per_minute: f64,
    rest_counts: Counts,
    rest_watches: u64,
    rest_api_cpu: Duration,
    update: Duration,
    restarts: BTreeMap<u32, usize>,
    /// Containers a kubelet recreated after the change from the pod as it was before it (its
    /// watch behind the daemon's): each is stopped once more, by design.
    stale_recreations: usize,
    /// Pods restarted once for the change, plus once for each stale recreation.
    once_per_change: usize,
    writes_per_pod: f64,
    update_writes: Counts,
    api_rss: Resident,
    /// Each daemon's resident memory at the end of the window at rest, smallest first.
    rest_resident: Vec<(Resident, ByMapping)>,
    /// Each daemon's resident memory once the update is done, smallest first.
    updated_resident: Vec<Resident>,
}

fn total(c: &Counts) -> u64 {
    c.values().sum()
}

/// The fleet's pods: `per_node` on each node, each one container reading the annotation
/// `app-config`, owned by a kruise workload and gated by `InPlaceUpdateReady` as kruise's pods
/// are; marked updated as the manager does on creation.
async fn create_pods(lab: &FleetLab, nodes: &[SimNode], per_node: usize) -> Vec<String> {
    let admin = &lab.admin;
    let ns: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(admin.clone());
    ns.patch(
        NAMESPACE,
        &PatchParams::apply("fleet"),
        &Patch::Apply(
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}),
        ),
    )
    .await
    .unwrap();
    let workloads: Api<kube::api::DynamicObject> = Api::namespaced_with(
        admin.clone(),
        NAMESPACE,
        &kube::discovery::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(
            keys::KRUISE_GROUP,
            "v1alpha1",
            "TestWorkload",
        )),
    );
    let owner = workloads
        .patch(
            "fleet",
            &PatchParams::apply("fleet"),
            &Patch::Apply(
                json!({"apiVersion": format!("{}/v1alpha1", keys::KRUISE_GROUP),
                "kind": "TestWorkload", "metadata": {"name": "fleet"}}),
            ),
        )
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NAMESPACE);
    let mut names = Vec::new();
    // in the order a rollout takes them: a workload's pods are spread over the nodes, so each
    // 10 % of them touches every node
    for j in 0..per_node {
        for node in nodes {
            let name = format!("{}-p{j}", node.name);
            let pod = json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "labels": {"app": "fleet"},
                    "annotations": {"app-config": "v0"},
                    "ownerReferences": [{"apiVersion": format!("{}/v1alpha1", keys::KRUISE_GROUP),
                        "kind": "TestWorkload", "name": "fleet", "uid": owner.uid().unwrap(),
                        "controller": true}]},
                "spec": {"nodeName": node.name, "hostNetwork": true,
                    "terminationGracePeriodSeconds": 30,
                    "readinessGates": [{"conditionType": keys::INPLACE_UPDATE_READY}],
                    "containers": [{"name": "main", "image": "busybox:v1",
                        "env": [{"name": "APP_CONFIG", "valueFrom": {"fieldRef":
                            {"fieldPath": "metadata.annotations['app-config']"}}}]}]}});
            pods.create(
                &PostParams::default(),
                &serde_json::from_value(pod).unwrap(),
            )
            .await
            .unwrap();
            set_update_ready(&pods, &name, true).await;
            names.push(name);
        }
    }
    names
}

async fn set_update_ready(pods: &Api<Pod>, name: &str, ready: bool) {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let patch = json!({"status": {"conditions": [{"type": keys::INPLACE_UPDATE_READY,
        "status": if ready { "True" } else { "False" }, "lastTransitionTime": now}]}});
    pods.patch_status(
        name,
        &PatchParams::apply(MANAGER),
        &Patch::Strategic(&patch),
    )
    .await
    .unwrap();
}

/// The value of `APP_CONFIG` in the newest container of `pod`, and its restart count, as the
/// kubelets report it.
fn running_value(kubelets: &Kubelets, nodes: &[SimNode]) -> BTreeMap<String, (String, i32)> {
    let mut out = BTreeMap::new();
    for pod in kubelets.pods() {
        let Some(node) = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .and_then(|n| nodes.iter().find(|x| x.name == n))
        else {
            continue;
        };
        let Some(s) = pod
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|c| c.first())
        else {
            continue;
        };
        let id = s
            .container_id
            .as_deref()
            .unwrap_or_default()
            .trim_start_matches("containerd://");
        let value = node
            .cri
            .state()
            .containers
            .get(id)
            .and_then(|c| app_config(&c.env))
            .unwrap_or_default();
        out.insert(pod.name_any(), (value, s.restart_count));
    }
    out
}

/// The value of `APP_CONFIG` in a container's env.
fn app_config(env: &[String]) -> Option<String> {
    env.iter()
        .find_map(|e| e.strip_prefix("APP_CONFIG="))
        .map(str::to_string)
}

/// Every container the kubelets created, by pod name: its attempt and its `APP_CONFIG`.
fn created_by_pod(nodes: &[SimNode]) -> BTreeMap<String, Vec<(u32, String)>> {
    let mut out: BTreeMap<String, Vec<(u32, String)>> = BTreeMap::new();
    for node in nodes {
        for c in node.cri.state().containers.values() {
            if let (Some(pod), Some(value)) = (
                c.status.labels.get(keys::KUBELET_POD_NAME),
                app_config(&c.env),
            ) {
                out.entry(pod.clone())
                    .or_default()
                    .push((c.status.metadata.attempt, value));
            }
        }
    }
    out
}

#[allow(
    clippy::too_many_arguments,
    reason = "one scenario run, its parts named"
)]
async fn run(
    lab: &FleetLab,
    nodes: &[SimNode],
    kubelets: &Kubelets,
    pods: &[String],
    kind: Kind,
    exe: &std::path::Path,
    sizes: &Sizes,
    value: &str,
) -> Figures {
    let mut f = Figures::default();
    let n = nodes.len();
    // 1. rollout: every daemon at once
    let api0 = lab.usage("kube-apiserver");
    let mark = lab.audit_mark();
    let started = Instant::now();
    let mut daemons: Vec<FleetDaemon> = nodes
        .iter()
        .enumerate()
        .map(|(i, node)| FleetDaemon::start(lab, node, i, kind, exe))
        .collect();
    let ready = wait_ready(
        &mut daemons,
        started,
        Duration::from_secs(120 + 2 * n as u64),
    )
    .await;
    f.rollout = ready.iter().copied().max().unwrap_or_default();
    let api1 = lab.usage("kube-apiserver");
    f.rollout_counts = lab.counts(kind, &mark);
    f.rollout_api = ProcUsage {
        cpu: api1.cpu.saturating_sub(api0.cpu),
        rss: api1.rss,
    };

    // 2. at rest, once what the start stirred has settled
    lab.audit_quiet(Duration::from_secs(2), Duration::from_secs(60))
        .await;
    let mark = lab.audit_mark();
    let api0 = lab.usage("kube-apiserver");
    tokio::time::sleep(sizes.rest).await;
    let api1 = lab.usage("kube-apiserver");
    f.rest_counts = lab.counts(kind, &mark);
    f.rest_per_minute = total(&f.rest_counts) as f64 / sizes.rest.as_secs_f64() * 60.0;
    f.rest_watches = lab.open_watches().await;
    f.rest_api_cpu = api1.cpu.saturating_sub(api0.cpu);
    f.rest_resident = daemons
        .iter()
        .filter_map(FleetDaemon::resident_by_mapping)
        .collect();
    f.rest_resident.sort_by_key(|(r, _)| r.total);

    // 3. the in-place update, 10 % of the pods at a time
    let before = running_value(kubelets, nodes);
    let stops_before: usize = nodes.iter().map(|n| n.stops().len()).sum();
    let api: Api<Pod> = Api::namespaced(lab.admin.clone(), NAMESPACE);
    let mark = lab.audit_mark();
    let started = Instant::now();
    let wave = (pods.len() * sizes.wave_percent / 100).max(1);
    for chunk in pods.chunks(wave) {
        for name in chunk {
            set_update_ready(&api, name, false).await;
            api.patch(
                name,
                &PatchParams::apply(MANAGER),
                &Patch::Strategic(json!({"metadata": {"annotations": {"app-config": value}}})),
            )
            .await
            .unwrap();
        }
        let chunk_names: Vec<String> = chunk.to_vec();
        wait::poll(
            // a wave's time grows with its size: each daemon's API client is rate-limited
            Duration::from_secs(120) + Duration::from_secs(chunk.len() as u64),
            LOOK_EVERY,
            "a wave of pods running with the new value",
            || std::future::ready(running_value(kubelets, nodes)),
            |now| {
                chunk_names
                    .iter()
                    .all(|p| now.get(p).is_some_and(|(v, _)| v == value))
            },
        )
        .await;
        for name in chunk {
            set_update_ready(&api, name, true).await;
        }
    }
    f.update = started.elapsed();
    // the last writes (events, the last annotations) are logged once the daemons are done
    lab.audit_quiet(Duration::from_secs(2), Duration::from_secs(60))
        .await;
    f.updated_resident = daemons.iter().filter_map(FleetDaemon::resident).collect();
    f.updated_resident.sort_by_key(|r| r.total);
    let after = running_value(kubelets, nodes);
    let all_created = created_by_pod(nodes);
    for p in pods {
        let restarts = after[p].1 - before[p].1;
        *f.restarts
            .entry(u32::try_from(restarts).unwrap_or(0))
            .or_default() += 1;
        // the value of each container created for the pod after the change
        let created: Vec<&String> = all_created
            .get(p)
            .into_iter()
            .flatten()
            .filter(|(attempt, _)| i64::from(*attempt) > i64::from(before[p].1))
            .map(|(_, value)| value)
            .collect();
        assert_eq!(
            created.len(),
            usize::try_from(restarts).unwrap_or(0),
            "{p}: the kubelets created a container for each restart they reported"
        );
        let stale = created.iter().filter(|v| ***v == before[p].0).count();
        f.stale_recreations += stale;
        if usize::try_from(restarts).ok() == Some(1 + stale) {
            f.once_per_change += 1;
        }
    }
    let stops: usize = nodes.iter().map(|n| n.stops().len()).sum::<usize>() - stops_before;
    let update_counts = lab.counts(kind, &mark);
    f.update_writes = update_counts
        .into_iter()
        .filter(|((verb, _), _)| matches!(verb.as_str(), "create" | "update" | "patch" | "delete"))
        .collect();
    let writes = total(&f.update_writes);
    f.writes_per_pod = writes as f64 / pods.len() as f64;
    f.api_rss = lab.usage("kube-apiserver").rss;
    eprintln!(
        "fleet: {kind:?} on {n} nodes: update of {} pods in {:.1?}, {stops} StopContainer calls",
        pods.len(),
        f.update
    );
    for d in daemons {
        d.stop(Duration::from_secs(15)).await;
    }
    f
}

fn report(n: usize, pods: usize, rows: &[(Kind, Figures)], on_double: bool) {
    println!(
        "\n## {n} nodes, {pods} pods{}\n",
        if on_double {
            " (on the API-server double: no API-server CPU or memory)"
        } else {
            ""
        }
    );
    let fmt = |c: &Counts| {
        c.iter()
            .map(|((v, r), k)| format!("{v} {r} {k}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let api = |u: &ProcUsage| {
        if on_double {
            String::new()
        } else {
            format!("; API server CPU {:.2?}, RSS {}", u.cpu, u.rss)
        }
    };
    for (kind, f) in rows {
        println!(
            "- {kind:?}: rollout to the last ready {:.1?}, {} requests ({}){}",
            f.rollout,
            total(&f.rollout_counts),
            fmt(&f.rollout_counts),
            api(&f.rollout_api)
        );
        println!(
            "  at rest: {:.1} requests a minute ({}); {} watches open{}",
            f.rest_per_minute,
            fmt(&f.rest_counts),
            f.rest_watches,
            if on_double {
                String::new()
            } else {
                format!("; API server CPU {:.2?} over the window", f.rest_api_cpu)
            }
        );
        // the median daemon's and the largest (a node's pods are spread evenly)
        if let (Some((mid, by)), Some((max, _))) = (
            f.rest_resident.get(f.rest_resident.len() / 2),
            f.rest_resident.last(),
        ) {
            println!(
                "  resident at rest, a daemon of {} pods: median {mid}, largest {max}",
                pods / n
            );
            println!("  the median's by mapping: {by}");
        }
        if let (Some(mid), Some(max)) = (
            f.updated_resident.get(f.updated_resident.len() / 2),
            f.updated_resident.last(),
        ) {
            println!("  resident after the update: median {mid}, largest {max}");
        }
        println!(
            "  update: {:.1?}; restarts per pod {:?} ({} stale recreations by the kubelets); {:.2} API writes per pod ({}){}",
            f.update,
            f.restarts,
            f.stale_recreations,
            f.writes_per_pod,
            fmt(&f.update_writes),
            if on_double {
                String::new()
            } else {
                format!("; API server RSS {}", f.api_rss)
            }
        );
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let num = support::env_or::<u64>;
    let sizes = if bench {
        Sizes {
            nodes: std::env::var("KRUISED_FLEET_NODES")
                .unwrap_or_else(|_| "10,50,100".into())
                .split(',')
                .filter_map(|v| v.trim().parse().ok())
                .collect(),
            pods_per_node: usize::try_from(num("KRUISED_FLEET_PODS", 30)).unwrap(),
            rest: Duration::from_secs(num("KRUISED_FLEET_REST_SECS", 600)),
            wave_percent: 10,
        }
    } else {
        Sizes {
            nodes: vec![5],
            pods_per_node: 2,
            rest: Duration::from_secs(5),
            wave_percent: 50,
        }
    };
    let kruise_daemon = std::env::var_os("KRUISED_KRUISE_DAEMON").map(PathBuf::from);
    let kruised = support::daemon::kruised_bin();
    for &n in &sizes.nodes {
        let dir = tempfile::Builder::new().prefix("fleet-").tempdir().unwrap();
        // KRUISED_FLEET_KEEP: the lab's state and every daemon's log stay for a look afterwards
        let (root, _remove) = if std::env::var_os("KRUISED_FLEET_KEEP").is_some() {
            let root = dir.keep();
            eprintln!("fleet: keeping {}", root.display());
            (root, None)
        } else {
            (dir.path().to_path_buf(), Some(dir))
        };
        let lab = FleetLab::start(&root).await;
        if !bench {
            println!(
                "layer: {n} simulated nodes on {}{}",
                if lab.on_double() {
                    "the API-server double"
                } else {
                    "a real kube-apiserver (tests/fleet-lab.sh)"
                },
                if kruise_daemon.is_some() {
                    ", kruise-daemon then kruised"
                } else {
                    ", kruised"
                }
            );
        }
        let mut nodes = Vec::new();
        for i in 0..n {
            nodes.push(SimNode::start(&lab, &root.join("nodes"), i).await);
        }
        let nodes = Arc::new(nodes);
        let kubelets = Kubelets::start(&lab, nodes.clone(), Duration::from_secs(1));
        let t0 = Instant::now();
        let pods = create_pods(&lab, &nodes, sizes.pods_per_node).await;
        wait::poll(
            Duration::from_secs(300),
            LOOK_EVERY,
            "every pod running",
            || std::future::ready(running_value(&kubelets, &nodes)),
            |now| now.len() == pods.len() && now.values().all(|(v, _)| v == "v0"),
        )
        .await;
        eprintln!(
            "fleet: {n} nodes, {} pods running in {:.1?}",
            pods.len(),
            t0.elapsed()
        );
        let mut rows = Vec::new();
        if let Some(exe) = &kruise_daemon {
            rows.push((
                Kind::KruiseDaemon,
                run(
                    &lab,
                    &nodes,
                    &kubelets,
                    &pods,
                    Kind::KruiseDaemon,
                    exe,
                    &sizes,
                    "v1",
                )
                .await,
            ));
        }
        let ours = run(
            &lab,
            &nodes,
            &kubelets,
            &pods,
            Kind::Kruised,
            &kruised,
            &sizes,
            "v2",
        )
        .await;
        // exactly once, but where a kubelet recreated the container from the pod before the
        // change: kruised stops that one once more (and never a third time), by design
        assert_eq!(
            ours.once_per_change,
            pods.len(),
            "kruised: every pod restarted once for the change: restarts {:?}, stale recreations {}",
            ours.restarts,
            ours.stale_recreations
        );
        rows.push((Kind::Kruised, ours));
        report(n, pods.len(), &rows, lab.on_double());
        drop(kubelets);
        drop(lab);
    }
}
