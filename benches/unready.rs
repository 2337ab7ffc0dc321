//! The unready window of an in-place image update (issue 41): from the manager's
//! `InPlaceUpdateReady=False` to the pod's `Ready=True` again, as the API double's pod shows
//! them, with the image's pull on a slow upstream. The real `kruised` binary and a real runtime
//! from the lab (`KRUISED_LAB`, `KRUISED_LAB_RUNTIME`: Debian's containerd 1.6, or 2.x with
//! `containerd2`), the API-server double, the manager double making the update as kruise does
//! (its grace period included), and the tests' kubelet (`kubelet::run`: kill with the preStop
//! hook, the image step as `imagePullPolicy` says, start) on that same runtime. The images
//! (`cri-lab.sh bench-images`: the busybox base plus a 16 MiB random layer each) are pulled
//! through a relay to the lab's registry that forwards at a fixed rate (`--rate`, default a
//! 10 s pull of the layer); each run removes its image afterwards, so every pull moves the
//! layer again (the relay's byte count says so in the table).
//!
//! Cases, one run of each a round, the rounds one after the other (`--rounds`, default 20):
//! the image already on the node (the baseline, without and with a 15 s grace period), then
//! each of no grace period, `gracePeriodSeconds: 15`, and no grace with a 5 s preStop hook,
//! with kruised without the in-place pull (`--feature-gates=PrePullInPlaceUpdate=false`) and
//! with it. The goals (issue 41): with the grace, within the baseline with the same grace
//! + 10 %; with the preStop hook, at least 4.5 s shorter than without the feature.
//!
//! ```sh
//! LAB=/tmp/lab REG_ADDR=127.0.0.1:5000 bash tests/cri-lab.sh start
//! KRUISED_LAB=/tmp/lab KRUISED_LAB_REGISTRY=127.0.0.1:5000 cargo bench --bench unready
//! # options after --: --rounds N (20), --rate BYTES_PER_SECOND (1677721), --cases a,b (all),
//! #   --dedup (only the one-transfer-or-two probe: a second PullImage of an image whose pull
//! #   is in flight, and the bytes the registry sent)
//! ```
//!
//! Under `cargo test` (no `--bench` argument) it does nothing.

#![allow(
    clippy::unwrap_used,
    reason = "benchmark code: a failed unwrap is a failed run"
)]

use kruised_test_support as support;

use std::time::{Duration, Instant};

use apiserver_double::{Control, Handle};
use kruised::cri::{ContainerFilter, ImageService, PullRequest, RuntimeService};
use kruised::k8s::keys;
use kube::Api;
use serde_json::{Value, json};
use support::daemon::Daemon;
use support::kubelet::Kubelet;
use support::kubelet::run::{NodeKubelet, NodeKubelets};
use support::manager::{ManagerDouble, Template, Timing};
use support::tcp_relay::TcpRelay;
use support::unready::{self, Case, HostsToml, Run};
use support::{Lab, Plane, wait};

const NODE: &str = "bench-node";
const LAYER: u64 = 16 << 20;
const LIMIT: Duration = Duration::from_secs(180);

fn arg(args: &[String], name: &str) -> Option<String> {
    let i = args.iter().position(|a| a == name)?;
    args.get(i + 1).cloned()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if !args.iter().any(|a| a == "--bench") {
        println!("unready benchmark: skipped (run it with `cargo bench --bench unready`)");
        return;
    }
    let rounds: usize = arg(&args, "--rounds").map_or(20, |v| v.parse().unwrap());
    let rate: u64 = arg(&args, "--rate").map_or(LAYER / 10, |v| v.parse().unwrap());
    let cases = unready::cases(arg(&args, "--cases").as_deref());
    let Some(lab) = Lab::get() else { return };
    lab.script("bench-images");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut bench = Bench::start(lab, rate).await;
        if args.iter().any(|a| a == "--dedup") {
            bench.dedup(3).await;
        } else {
            bench.run(&cases, rounds).await;
        }
        bench.stop();
    });
}

struct Bench {
    lab: Lab,
    rate: u64,
    relay: TcpRelay,
    _hosts: HostsToml,
    plane: Plane,
    manager: ManagerDouble,
    kubelets: tokio::task::JoinHandle<()>,
    runtime: kruised::cri::RemoteRuntime,
    /// The image every pod starts on (the lab's registry, pulled first).
    from: String,
    runs: usize,
}

impl Bench {
    async fn start(lab: Lab, rate: u64) -> Bench {
        let relay = TcpRelay::start(lab.registry.parse().unwrap()).await;
        relay.limit(Some(rate), None);
        let hosts = HostsToml::write(&lab, relay.addr);
        let plane = Plane::start().await;
        let manager = ManagerDouble::start(plane.api.control(), Timing::default()).await;
        let runtime = lab.runtime();
        let from = lab.image("busybox:v1");
        Kubelet::new(lab.runtime(), lab.dir.join("pods"))
            .pull(std::slice::from_ref(&from), LIMIT)
            .await;
        let client = kube_client(&plane).await;
        let mut kubelet = Kubelet::new(lab.runtime(), lab.dir.join("pods"));
        kubelet.cgroup_root = "/cri-lab".into();
        let verbose = std::env::var_os("UNREADY_VERBOSE").is_some();
        let node = NodeKubelet::new(NODE, kubelet, lab.runtime.cri_name(), verbose);
        let mut kubelets = NodeKubelets::new(Api::all(client), vec![node]);
        let kubelets = tokio::spawn(async move { kubelets.run(Duration::from_secs(1)).await });
        Bench {
            lab,
            rate,
            relay,
            _hosts: hosts,
            plane,
            manager,
            kubelets,
            runtime,
            from,
            runs: 0,
        }
    }

    fn stop(self) {
        self.kubelets.abort();
    }

    fn api(&self) -> &Handle {
        &self.plane.api
    }

    /// A bench image through the relay, a different one each run.
    fn next_image(&mut self) -> String {
        self.runs += 1;
        format!("{}/bench/img{}:v1", self.relay.addr, self.runs % 4 + 1)
    }

    async fn daemon(&self, feature: bool) -> Daemon {
        let gates = format!("--feature-gates=PrePullInPlaceUpdate={feature}");
        self.plane
            .start_daemon(&self.lab, NODE, &[gates.as_str()], Duration::from_secs(60))
            .await
    }

    async fn run(&mut self, cases: &[Case], rounds: usize) {
        println!(
            "unready: {rounds} rounds, layer {} MiB at {:.2} MiB/s through the relay, runtime {}; {}; load {}",
            LAYER >> 20,
            self.rate as f64 / 1048576.0,
            self.lab.runtime.lab_name(),
            support::machine(),
            unready::loadavg()
        );
        let results = unready::rounds(self, cases, rounds).await;
        println!("load at the end {}", unready::loadavg());
        unready::report(cases, &results, None);
    }

    /// One in-place update of a new pod from the lab's busybox to a bench image; returns the
    /// window and the bytes pulled through the relay meanwhile.
    async fn one(&mut self, c: &Case, round: usize) -> Run {
        let image = self.next_image();
        let _ = self.runtime.remove_image(&image).await;
        if c.present {
            self.relay.limit(None, None);
            self.pull(&image).await;
            self.relay.limit(Some(self.rate), None);
        }
        // unique beyond this process: a pod an interrupted run left in the runtime keeps its name
        let name = format!("{}-{round}-{}", c.name, std::process::id());
        let container = |image: &str| {
            let mut c0 = json!({"name": "main", "image": image, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", "trap 'exit 0' TERM; sleep 100000 & wait"]});
            if c.pre_stop {
                c0["lifecycle"] = json!({"preStop": {"exec": {"command": ["sleep", "5"]}}});
            }
            json!([c0])
        };
        let pod = json!({
            "metadata": {"name": name, "namespace": "default",
                "ownerReferences": [{"apiVersion": "apps.kruise.io/v1alpha1", "kind": "CloneSet",
                                     "name": name, "uid": format!("cs-{name}"), "controller": true}]},
            "spec": {"nodeName": NODE, "terminationGracePeriodSeconds": 30,
                     "containers": container(&self.from)}
        });
        self.api().create("pods", pod).unwrap();
        self.manager
            .add_workload(&name, Template::new(container(&self.from)), &[&name]);
        self.manager.set_grace_period(&name, c.grace);
        wait::store(
            self.api(),
            LIMIT,
            &format!("pod {name} ready"),
            |v| v.get("pods", "default", &name).map(|p| conditions(&p)),
            |s| {
                s.as_ref()
                    .is_some_and(|(gate, ready)| gate == "True" && ready == "True")
            },
        )
        .await;
        // armed: the watch of the window has looked once before the update starts
        let (armed_tx, armed) = tokio::sync::oneshot::channel();
        let watch = tokio::spawn(window(self.api().control(), name.clone(), armed_tx));
        armed.await.unwrap();
        let bytes = self.relay.stats().bytes_down;
        self.manager
            .set_template(&name, Template::new(container(&image)));
        let window = watch.await.unwrap();
        let bytes = self.relay.stats().bytes_down - bytes;
        self.remove(&name, &image).await;
        Run { window, bytes }
    }

    async fn pull(&self, image: &str) {
        let request = PullRequest {
            image: image.into(),
            ..Default::default()
        };
        self.runtime.pull_image(request, LIMIT).await.unwrap();
    }

    /// Deletes the pod, waits for the kubelet to remove its containers, removes the image.
    async fn remove(&self, name: &str, image: &str) {
        self.api().force_delete("pods", "default", name);
        let filter = ContainerFilter {
            labels: [(keys::KUBELET_POD_NAME.to_string(), name.to_string())].into(),
            ..Default::default()
        };
        let _ = wait::poll(
            LIMIT,
            Duration::from_millis(200),
            &format!("the containers of {name} removed"),
            || self.runtime.list_containers(filter.clone()),
            |l| l.as_ref().is_ok_and(|l| l.is_empty()),
        )
        .await;
        self.runtime.remove_image(image).await.unwrap();
    }

    /// One transfer or two: a second `PullImage` of an image whose pull is in flight (the
    /// kubelet's, while kruised's runs), and the bytes the registry sent for both.
    async fn dedup(&self, trials: usize) {
        println!(
            "dedup on {}: a second PullImage 1 s after the first, the layer ({} MiB) at {:.2} MiB/s",
            self.lab.runtime.lab_name(),
            LAYER >> 20,
            self.rate as f64 / 1048576.0
        );
        for t in 0..trials {
            let image = format!("{}/bench/img{}:v1", self.relay.addr, t % 4 + 1);
            let _ = self.runtime.remove_image(&image).await;
            let before = self.relay.stats().bytes_down;
            let started = Instant::now();
            let first = async {
                self.pull(&image).await;
                started.elapsed()
            };
            let second = async {
                tokio::time::sleep(Duration::from_secs(1)).await;
                self.pull(&image).await;
                started.elapsed()
            };
            let (first, second) = tokio::join!(first, second);
            let bytes = self.relay.stats().bytes_down - before;
            println!(
                "trial {t}: the first pull done at {:.2} s, the second (sent at 1 s) at {:.2} s; the registry sent {:.1} MiB = {:.2} x the layer",
                first.as_secs_f64(),
                second.as_secs_f64(),
                bytes as f64 / 1048576.0,
                bytes as f64 / LAYER as f64
            );
            self.runtime.remove_image(&image).await.unwrap();
        }
    }
}

impl unready::Mode for Bench {
    async fn daemon(&mut self, feature: bool) -> Daemon {
        Bench::daemon(self, feature).await
    }

    async fn one(&mut self, c: &Case, round: usize) -> Run {
        Bench::one(self, c, round).await
    }
}

/// The pod's `InPlaceUpdateReady` and `Ready` statuses.
fn conditions(pod: &Value) -> (String, String) {
    let of = |t: &str| {
        pod["status"]["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == t))
            .and_then(|c| c["status"].as_str())
            .unwrap_or("")
            .to_string()
    };
    (of(keys::INPLACE_UPDATE_READY), of("Ready"))
}

/// The window of the pod's update: from `InPlaceUpdateReady=False` to `Ready=True` with the
/// gate `True` again, each seen at the store's write. Says `armed` once it has looked.
async fn window(api: Control, name: String, armed: tokio::sync::oneshot::Sender<()>) -> Duration {
    let mut armed = Some(armed);
    let gate_false = |(gate, _): &(String, String)| gate == "False";
    until(
        &api,
        &name,
        "InPlaceUpdateReady=False",
        &mut armed,
        gate_false,
    )
    .await;
    let start = Instant::now();
    let ready = |(gate, ready): &(String, String)| gate == "True" && ready == "True";
    until(&api, &name, "Ready again", &mut armed, ready).await;
    start.elapsed()
}

/// Waits until `done` holds of the pod's conditions, at each write; says `armed` at its first
/// look; fails with what it saw last.
async fn until(
    api: &Control,
    name: &str,
    what: &str,
    armed: &mut Option<tokio::sync::oneshot::Sender<()>>,
    done: impl Fn(&(String, String)) -> bool,
) {
    let mut last = None;
    let seen = api
        .wait_for_value(LIMIT, |v| {
            if let Some(a) = armed.take() {
                let _ = a.send(());
            }
            let s = v.get("pods", "default", name).map(|p| conditions(&p));
            let hit = s.as_ref().is_some_and(&done);
            last = s;
            hit.then_some(())
        })
        .await;
    seen.unwrap_or_else(|_| panic!("{name}: {what} not seen within {LIMIT:?}; last {last:?}"));
}

async fn kube_client(plane: &Plane) -> kube::Client {
    let kubeconfig = kube::config::Kubeconfig::read_from(plane.kubeconfig()).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    kube::Client::try_from(config).unwrap()
}
