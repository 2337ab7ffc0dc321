//! The unready window of an in-place image update (issue 41) on the real cluster of the test
//! layer, with kruised as the node daemon and then with OpenKruise's kruise-daemon beside
//! kruise-manager's pre-download (`PreDownloadImageForInPlaceUpdate`, which `tests/run.sh`
//! turns on): the cases of `benches/unready.rs` (`support::unready`) as CloneSet in-place image
//! updates that the real kruise-manager makes, the real kubelet on the cluster's runtime
//! carrying them out, the image pulled through the same slowed relay (`--rate` there: the 16 MiB
//! layer in about 10 s).
//!
//! Each run: a CloneSet of 4 pods of the lab's busybox (kruise pre-downloads only for more than
//! 3 replicas updated in more than one batch: a partition of 3 updates one pod, the one
//! measured), its template changed to a bench image through the relay; the window is from the
//! watch event where that pod's `InPlaceUpdateReady` is `False` to the one where it is `Ready`
//! with the gate `True` again. Then the CloneSet is deleted and the image removed. kruised runs
//! every case, restarted between those without and with its in-place pull
//! (`--feature-gates=PrePullInPlaceUpdate=...`); kruise-daemon runs the cases with an early pull
//! (its is the manager's ImagePullJob). The manager's pre-download is on for both daemons: the
//! report says in how many updates it made an ImagePullJob.
//!
//! ```sh
//! # the cluster lab of tests/run.sh running (KRUISED_KUBE_LAB and friends exported, as for
//! # benches/inplace.rs), its kruise-manager with the gates tests/run.sh gives it
//! # (KRUISED_KRUISE_MANAGER, KRUISED_KRUISE_MANAGER_GATES), kruise-daemon provided:
//! KRUISED_KRUISE_DAEMON=/path/to/kruise-daemon KRUISED_TEST_BIN=target/dist/kruised \
//!   cargo bench --bench unready_cluster
//! # KRUISED_BENCH_ROUNDS (20), KRUISED_BENCH_CASES (all: present,nograce-off,...),
//! # KRUISED_BENCH_RATE (bytes a second through the relay: 1677721, the layer in 10 s)
//! ```
//!
//! Where any of those is not provided (CI: no registry ships the Kubernetes or kruise
//! binaries) it prints one line, what it would run and why it did not, and exits 0; so under
//! `cargo test` (`tests/run.sh` runs that path with the unit tests). Under `cargo test` with
//! everything provided, a smoke run: one round of `prestop5-on` with each daemon.

#![allow(
    clippy::unwrap_used,
    reason = "benchmark code: a failed unwrap is a failed run"
)]

use kruised_test_support as support;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kruised::cri::{ImageService, PullRequest, RemoteRuntime};
use kruised::k8s::keys;
use kube::api::{Api, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams};
use kube::discovery::ApiResource;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use support::cluster::{self, Identity, KubeLab, Rbac, TestNamespace, condition};
use support::daemon::Daemon;
use support::tcp_relay::TcpRelay;
use support::unready::{self, Case, HostsToml, Run};
use support::wait;

const LAYER: u64 = 16 << 20;
const LIMIT: Duration = Duration::from_secs(180);
/// More than kruise's 3, the fewest replicas it pre-downloads for; all but one kept by the
/// partition, so the update has more than one batch and one pod is updated.
const REPLICAS: i64 = 4;
const KRUISE_PULL: &str = "kruise-manager's pre-download";

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let rounds = support::env_or("KRUISED_BENCH_ROUNDS", if bench { 20 } else { 1 });
    let only = std::env::var("KRUISED_BENCH_CASES").ok();
    let cases = unready::cases(only.as_deref().or((!bench).then_some("prestop5-on")));
    let names: Vec<&str> = cases.iter().map(|c| c.name).collect();
    let exe = match unready::cluster_provided(|name| std::env::var(name).ok()) {
        Ok(exe) => exe,
        Err(why) => {
            println!(
                "unready_cluster: skipped: {why}; it would run {rounds} round(s) of {} as \
                 CloneSet in-place image updates on the real cluster, with kruised and with \
                 kruise-daemon beside {KRUISE_PULL}",
                names.join(",")
            );
            return;
        }
    };
    let Some(lab) = KubeLab::get() else { return };
    lab.script("bench-images");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut bench = Bench::start(lab).await;
        println!(
            "unready_cluster: {rounds} rounds, layer {} MiB at {:.2} MiB/s through the relay, \
             CloneSets of {REPLICAS} (partition {}); {}; load {}",
            LAYER >> 20,
            bench.rate as f64 / 1048576.0,
            REPLICAS - 1,
            support::machine(),
            unready::loadavg()
        );
        let ours = unready::rounds(&mut bench, &cases, rounds).await;
        let our_jobs = std::mem::take(&mut bench.jobs);
        bench.kruise_daemon = Some(exe);
        let early: Vec<Case> = cases.iter().filter(|c| c.feature).copied().collect();
        let theirs = unready::rounds(&mut bench, &early, rounds).await;
        println!("load at the end {}", unready::loadavg());
        println!("kruised (the in-place pull: its own, PrePullInPlaceUpdate):");
        unready::report(&cases, &ours, None);
        println!("kruise-daemon (the early pull: {KRUISE_PULL}):");
        unready::report(&early, &theirs, Some(KRUISE_PULL));
        println!(
            "ImagePullJobs kruise-manager made for the updates: {our_jobs} of {} with kruised, \
             {} of {} with kruise-daemon",
            ours.iter().map(Vec::len).sum::<usize>(),
            bench.jobs,
            theirs.iter().map(Vec::len).sum::<usize>()
        );
        bench.ns.delete().await;
    });
}

struct Bench {
    lab: KubeLab,
    admin: Client,
    ns: TestNamespace,
    /// kruised's (`deploy/`'s RBAC).
    identity: Identity,
    /// kruise-daemon's binary: it is the node daemon once set.
    kruise_daemon: Option<PathBuf>,
    /// kruise-daemon's files (its kubeconfig, its `/hostvarrun`).
    dir: tempfile::TempDir,
    relay: TcpRelay,
    rate: u64,
    _hosts: HostsToml,
    runtime: RemoteRuntime,
    /// The image every pod starts on (the cluster's registry, on the node).
    from: String,
    runs: usize,
    /// The updates for which kruise-manager made an ImagePullJob.
    jobs: usize,
}

impl Bench {
    async fn start(lab: KubeLab) -> Bench {
        let relay = TcpRelay::start(lab.registry.parse().unwrap()).await;
        let rate = support::env_or("KRUISED_BENCH_RATE", LAYER / 10);
        relay.limit(Some(rate), None);
        let hosts = HostsToml::write(&lab, relay.addr);
        // what a run that panicked left on the node (its pods would share the node's pulls)
        let left = cluster::remove_leftover_namespaces(&lab, &["unready"]).await;
        if !left.is_empty() {
            eprintln!("unready_cluster: removed namespaces an earlier run left behind: {left:?}");
        }
        let admin = lab.admin().await;
        let ns = TestNamespace::create(&admin, "unready").await;
        let identity = cluster::identity(&lab, &admin, Rbac::Deploy).await;
        Bench {
            runtime: lab.runtime(),
            from: lab.image("busybox:v1"),
            lab,
            admin,
            ns,
            identity,
            kruise_daemon: None,
            dir: tempfile::tempdir().unwrap(),
            relay,
            rate,
            _hosts: hosts,
            runs: 0,
            jobs: 0,
        }
    }

    fn api(&self, kind: &str, version: &str) -> Api<DynamicObject> {
        let gvk = GroupVersionKind::gvk("apps.kruise.io", version, kind);
        Api::namespaced_with(
            self.admin.clone(),
            &self.ns.name,
            &ApiResource::from_gvk(&gvk),
        )
    }

    /// The CloneSet `name` of [`REPLICAS`] pods running `container`, updated in place one pod
    /// at a time (the partition keeps all but one), after `grace` seconds.
    fn cloneset(name: &str, container: Value, grace: u32) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "apps.kruise.io/v1beta1", "kind": "CloneSet",
            "metadata": {"name": name},
            "spec": {"replicas": REPLICAS, "selector": {"matchLabels": {"app": name}},
                "template": {"metadata": {"labels": {"app": name}},
                    "spec": {"hostNetwork": true, "terminationGracePeriodSeconds": 30,
                             "containers": [container]}},
                "updateStrategy": {"rollingUpdate": {"podUpdatePolicy": "InPlaceIfPossible",
                    "partition": REPLICAS - 1, "maxUnavailable": 1,
                    "inPlaceUpdateStrategy": {"gracePeriodSeconds": grace}}}}
        }))
        .unwrap()
    }

    async fn one(&mut self, c: &Case, round: usize) -> Run {
        self.runs += 1;
        let image = format!("{}/bench/img{}:v1", self.relay.addr, self.runs % 4 + 1);
        let _ = self.runtime.remove_image(&image).await;
        if c.present {
            self.relay.limit(None, None);
            let request = PullRequest {
                image: image.clone(),
                ..Default::default()
            };
            self.runtime.pull_image(request, LIMIT).await.unwrap();
            self.relay.limit(Some(self.rate), None);
        }
        // unique to the run: the CloneSet of an earlier one may still be going away
        let name = format!("{}-{round}-{}", c.name, self.runs);
        let container = |image: &str| {
            let mut c0 = cluster::container("main", image, &[]);
            c0["imagePullPolicy"] = json!("IfNotPresent");
            if c.pre_stop {
                c0["lifecycle"] = json!({"preStop": {"exec": {"command": ["sleep", "5"]}}});
            }
            c0
        };
        let clonesets = self.api("CloneSet", "v1beta1");
        let set = Self::cloneset(&name, container(&self.from), c.grace);
        clonesets.create(&Default::default(), &set).await.unwrap();
        let ready = |o: Option<&DynamicObject>| {
            o.is_some_and(|o| {
                let status = &o.data["status"];
                status["observedGeneration"].as_i64() == o.metadata.generation
                    && status["readyReplicas"].as_i64() == Some(REPLICAS)
            })
        };
        cluster::wait_for(&clonesets, &name, "every pod of the CloneSet ready", ready).await;
        // armed: the watch has listed the pods before the update starts
        let (armed_tx, armed) = tokio::sync::oneshot::channel();
        let watch = tokio::spawn(window(self.ns.pods(), name.clone(), armed_tx));
        armed.await.unwrap();
        let bytes = self.relay.stats().bytes_down;
        let template = json!({"spec": {"template": {"spec": {"containers": [container(&image)]}}}});
        let patch = Patch::Merge(&template);
        clonesets
            .patch(&name, &PatchParams::default(), &patch)
            .await
            .unwrap();
        let window = watch.await.unwrap();
        let bytes = self.relay.stats().bytes_down - bytes;
        let jobs = self.api("ImagePullJob", "v1alpha1");
        let jobs = jobs.list(&ListParams::default()).await.unwrap();
        let owned = |j: &DynamicObject| j.owner_references().iter().any(|o| o.name == name);
        self.jobs += usize::from(jobs.items.iter().any(owned));
        self.remove(&clonesets, &name, &image).await;
        Run { window, bytes }
    }

    /// Deletes the CloneSet, waits until its pods are gone, removes the image.
    async fn remove(&self, clonesets: &Api<DynamicObject>, name: &str, image: &str) {
        clonesets.delete(name, &Default::default()).await.unwrap();
        let pods = self.ns.pods();
        let mine = ListParams::default().labels(&format!("app={name}"));
        let _ = wait::poll(
            LIMIT,
            Duration::from_millis(500),
            &format!("the pods of {name} gone"),
            || pods.list(&mine),
            |l| l.as_ref().is_ok_and(|l| l.items.is_empty()),
        )
        .await;
        self.runtime.remove_image(image).await.unwrap();
    }
}

impl unready::Mode for Bench {
    async fn daemon(&mut self, feature: bool) -> Daemon {
        if let Some(exe) = &self.kruise_daemon {
            let dir = self.dir.path();
            return cluster::start_kruise_daemon(&self.lab, &self.admin, exe, dir)
                .await
                .0;
        }
        let gates = format!("--feature-gates=PrePullInPlaceUpdate={feature}");
        let mut d = cluster::start_daemon(&self.lab, &self.identity, &[gates.as_str()]);
        d.wait_for_log("daemon ready", Duration::from_secs(60))
            .await;
        d
    }

    async fn one(&mut self, c: &Case, round: usize) -> Run {
        Bench::one(self, c, round).await
    }
}

/// The window of the update of the CloneSet `name`: from the watch event where its first pod
/// to be updated has `InPlaceUpdateReady=False` to the one where that pod is `Ready` with the
/// gate `True` again. Says `armed` once the watch has listed the pods; fails with what it saw
/// last.
async fn window(pods: Api<Pod>, name: String, armed: tokio::sync::oneshot::Sender<()>) -> Duration {
    let config = watcher::Config::default().labels(&format!("app={name}"));
    // a watch that breaks is resumed after a back-off: its relist sees what changed meanwhile,
    // late by the break
    let mut events = watcher(pods, config).default_backoff().boxed();
    let mut armed = Some(armed);
    let mut unready: Option<(String, Instant)> = None;
    let mut last = String::from("no pod");
    let closed = tokio::time::timeout(LIMIT, async {
        while let Some(event) = events.next().await {
            let Ok(event) = event else { continue };
            let pod = match event {
                watcher::Event::Apply(p) | watcher::Event::InitApply(p) => p,
                watcher::Event::InitDone => {
                    if let Some(a) = armed.take() {
                        let _ = a.send(());
                    }
                    continue;
                }
                watcher::Event::Init | watcher::Event::Delete(_) => continue,
            };
            let gate = condition(&pod, keys::INPLACE_UPDATE_READY);
            let ready = condition(&pod, "Ready");
            last = format!("{}: {gate:?}, Ready {ready:?}", pod.name_any());
            if let Some((updated, since)) = &unready {
                if *updated == pod.name_any() && gate == Some("True") && ready == Some("True") {
                    return since.elapsed();
                }
            } else if gate == Some("False") {
                unready = Some((pod.name_any(), Instant::now()));
            }
        }
        panic!("the watch of the pods of {name} ended");
    })
    .await;
    closed.unwrap_or_else(|_| {
        panic!(
            "{name}: the window not closed within {LIMIT:?}; last seen InPlaceUpdateReady {last}"
        )
    })
}
