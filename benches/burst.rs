//! A pod's own pull during a burst of four pre-pulls (issue 42, item 3: the goal is at most
//! 1.1x its time alone), on a real runtime from the lab (`KRUISED_LAB`, `KRUISED_LAB_RUNTIME`)
//! through a relay to the lab's registry that forwards at a fixed rate, all connections
//! together (`tcp_relay`'s `limit`): the node's one link. The image puller runs in-process
//! (`pull::PullNode`, the daemon's settings) with the API-server double; the pod's pull is the
//! kubelet's (CRI `PullImage` of its image) while the pod, in the double, reports its container
//! `ContainerCreating`. Images: `cri-lab.sh bench-images` with `BENCH_IMAGES=5` (the busybox
//! base plus a 16 MiB random layer each): img1 is the pod's, img2..img5 the burst's; every run
//! removes them first, so each pull moves its layer again.
//!
//! Cases, each round in turn (`--rounds`, default 10):
//!
//! - `alone`: the pod's pull, nothing else on the link;
//! - `burst arrives, kruised`: a NodeImage of four tags is written 0.5 s into the pod's pull;
//!   kruised holds them until the pod runs (the time of the pod's pull; then the four);
//! - `burst arrives, all at once`: the same four pulled straight through CRI 0.5 s into the
//!   pod's pull, as a daemon that starts every tag at once would (kruise-daemon);
//! - `burst running, kruised`: the four tags already pulling when the pod begins to wait:
//!   kruised calls them off (cancels their `PullImage` calls) and pulls them again, from their
//!   first byte, once the pod runs (`turn.rs`).
//!
//! ```sh
//! LAB=/tmp/lab REG_ADDR=127.0.0.1:5000 bash tests/cri-lab.sh start
//! KRUISED_LAB=/tmp/lab KRUISED_LAB_REGISTRY=127.0.0.1:5000 cargo bench --bench burst
//! # options after --: --rounds N (10), --rate BYTES_PER_SECOND (8388608)
//! ```
//!
//! Under `cargo test` (no `--bench` argument) it does nothing.

#![allow(
    clippy::unwrap_used,
    reason = "benchmark code: a failed unwrap is a failed run"
)]

use kruised_test_support as support;
use kruised_test_support::pull as pull_support;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use kruised::controller::imagepull::Settings;
use kruised::cri::{ImageService, PullRequest, RemoteRuntime, Timeouts};
use kruised::k8s::crd::ImagePullPhase;
use pull_support::PullNode;
use serde_json::{Value, json};
use support::kubelet::status::update_container;
use support::restarts::percentile;
use support::tcp_relay::TcpRelay;
use support::{Lab, arg_or, machine};

const NS: &str = "shop";
const LIMIT: Duration = Duration::from_secs(300);
/// When the burst arrives, into the pod's pull.
const ARRIVES: Duration = Duration::from_millis(500);

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("burst benchmark: skipped (run it with `cargo bench --bench burst`)");
        return;
    }
    let rounds = arg_or("--rounds", 10u64).max(1);
    let rate = arg_or("--rate", 8u64 << 20).max(1 << 16);
    let Some(lab) = Lab::get() else { return };
    lab.script_with("bench-images", &[("BENCH_IMAGES", "5")]);
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(bench(lab, rounds, rate));
}

/// The relay's address as containerd's registry host: a `hosts.toml` under the lab's
/// `certs.d` (containerd's `config_path`), plain HTTP; removed when dropped.
struct HostsToml(PathBuf);

impl HostsToml {
    fn write(lab: &Lab, addr: SocketAddr) -> HostsToml {
        let dir = lab.dir.join("certs.d").join(addr.to_string());
        std::fs::create_dir_all(&dir).unwrap();
        let text = format!(
            "server = \"http://{addr}\"\n\n[host.\"http://{addr}\"]\n  capabilities = [\"pull\", \"resolve\"]\n  skip_verify = true\n"
        );
        std::fs::write(dir.join("hosts.toml"), text).unwrap();
        HostsToml(dir)
    }
}

impl Drop for HostsToml {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

struct Bench {
    node: PullNode,
    rt: RemoteRuntime,
    relay: TcpRelay,
    /// img1 (the pod's), img2..img5 (the burst's), through the relay.
    images: Vec<String>,
    version: i64,
    pods: usize,
}

impl Bench {
    fn pod_image(&self) -> &str {
        &self.images[0]
    }

    fn burst(&self) -> &[String] {
        &self.images[1..]
    }

    async fn clean(&self) {
        pull_support::remove_images(&self.rt, &self.images).await;
    }

    /// The kubelet's pull of the pod's image.
    async fn pod_pull(rt: RemoteRuntime, image: String) -> Duration {
        let started = Instant::now();
        let request = PullRequest {
            image,
            ..Default::default()
        };
        rt.pull_image(request, LIMIT).await.unwrap();
        started.elapsed()
    }

    /// A new pod of the node, its container waiting for the pod's image; its name.
    fn pod_waits(&mut self) -> String {
        self.pods += 1;
        let name = format!("web-{}", self.pods);
        let pod = pull_support::waiting_pod(NS, &name, self.pod_image());
        self.node.api.create("pods", pod).unwrap();
        name
    }

    /// The pod's container started; then the pod leaves.
    fn pod_runs(&self, name: &str) {
        self.node
            .api
            .modify("pods", NS, name, |p| {
                update_container(p, "app", |s| {
                    s["state"] = json!({"running": {"startedAt": "2026-01-01T00:00:00Z"}});
                });
            })
            .unwrap();
        self.node.api.delete("pods", NS, name).unwrap();
    }

    /// Writes the burst's four tags at a new version.
    fn write_burst(&mut self) {
        self.version += 1;
        let v = self.version;
        let images: serde_json::Map<String, Value> = self
            .burst()
            .iter()
            .map(|i| {
                let repo = i.strip_suffix(":v1").unwrap().to_string();
                (repo, json!({"tags": [{"tag": "v1", "version": v}]}))
            })
            .collect();
        if v == 1 {
            self.node.create_node_image(Value::Object(images));
        } else {
            self.node.set_images(Value::Object(images));
        }
    }

    async fn burst_done(&self) {
        let v = self.version;
        self.node
            .wait_status("the burst pulled", |s| {
                s.succeeded == 4
                    && s.image_statuses.values().all(|i| {
                        i.tags
                            .iter()
                            .all(|t| t.version == v && t.phase == ImagePullPhase::Succeeded)
                    })
            })
            .await;
    }

    async fn alone(&mut self) -> Duration {
        self.clean().await;
        Self::pod_pull(self.rt.clone(), self.pod_image().to_string()).await
    }

    async fn burst_arrives_kruised(&mut self) -> Duration {
        self.clean().await;
        let pod = self.pod_waits();
        let pull = tokio::spawn(Self::pod_pull(
            self.rt.clone(),
            self.pod_image().to_string(),
        ));
        tokio::time::sleep(ARRIVES).await;
        self.write_burst();
        let took = pull.await.unwrap();
        self.pod_runs(&pod);
        self.burst_done().await;
        took
    }

    async fn burst_arrives_at_once(&mut self) -> Duration {
        self.clean().await;
        let pull = tokio::spawn(Self::pod_pull(
            self.rt.clone(),
            self.pod_image().to_string(),
        ));
        tokio::time::sleep(ARRIVES).await;
        let rt = self.rt.clone();
        let burst = self.burst().to_vec();
        let others = tokio::spawn(async move { pull_support::pull_at_once(&rt, &burst).await });
        let took = pull.await.unwrap();
        others.await.unwrap();
        took
    }

    async fn burst_running_kruised(&mut self) -> Duration {
        self.clean().await;
        self.write_burst();
        self.node
            .wait_status("the burst pulling", |s| s.pulling == 4)
            .await;
        let pod = self.pod_waits();
        let took = Self::pod_pull(self.rt.clone(), self.pod_image().to_string()).await;
        self.pod_runs(&pod);
        self.burst_done().await;
        took
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

async fn bench(lab: Lab, rounds: u64, rate: u64) {
    let relay = TcpRelay::start(lab.registry.parse().unwrap()).await;
    let _hosts = HostsToml::write(&lab, relay.addr);
    let rt = RemoteRuntime::new(lab.endpoint(), None, Timeouts::default());
    let version = kruised::cri::RuntimeService::version(&rt).await.unwrap();
    let images: Vec<String> = (1..=5)
        .map(|i| format!("{}/bench/img{i}:v1", relay.addr))
        .collect();
    let node = PullNode::start(Settings::default(), lab.endpoint()).await;
    let mut b = Bench {
        node,
        rt,
        relay,
        images,
        version: 0,
        pods: 0,
    };
    // warm-up, unlimited and not counted: first connections, first registry reads
    b.clean().await;
    pull_support::pull_at_once(&b.rt, &b.images).await;
    b.relay.limit(Some(rate), None);

    let names = [
        "alone",
        "burst arrives, kruised",
        "burst arrives, all at once",
        "burst running, kruised",
    ];
    let mut runs: Vec<Vec<Duration>> = vec![Vec::new(); names.len()];
    for round in 0..rounds {
        runs[0].push(b.alone().await);
        runs[1].push(b.burst_arrives_kruised().await);
        runs[2].push(b.burst_arrives_at_once().await);
        runs[3].push(b.burst_running_kruised().await);
        let line: Vec<String> = names
            .iter()
            .zip(&runs)
            .map(|(n, r)| format!("{n} {:.0} ms", ms(r[r.len() - 1])))
            .collect();
        println!("round {}: {}", round + 1, line.join(", "));
    }
    b.clean().await;
    println!();
    println!("machine:  {}", machine());
    println!(
        "runtime:  {} {}, registry through a relay at {:.2} MiB/s (all connections together)",
        version.runtime_name,
        version.runtime_version,
        rate as f64 / f64::from(1 << 20)
    );
    println!("images:   5 x (busybox base + 16 MiB random layer), removed before each run");
    println!("the pod's own pull, {rounds} rounds:");
    let alone_p50 = percentile(&mut runs[0].clone(), 0.5);
    for (n, r) in names.iter().zip(&mut runs) {
        let (p50, p99) = (percentile(r, 0.5), percentile(r, 0.99));
        println!(
            "  {n:<28} p50 {:>8.0} ms  p99 {:>8.0} ms  p50/alone p50 {:.2}",
            ms(p50),
            ms(p99),
            p50.as_secs_f64() / alone_p50.as_secs_f64()
        );
    }
}
