//! Benchmark: issue 43's goal, a hostile tenant's attacks of rows 1, 3, 5 and 7 at once on one
//! node: kruised's resident memory stays under 48 MiB, `/healthz` answers the node at least 99 %
//! of the time, and kruised is never restarted.
//!
//! The `kruised` binary runs against the API-server double and the fake runtime (no lab: the
//! attacks are on kruised's own code, its admin port, probe and watch code), while, together:
//!
//! - row 1: four pods (127.0.0.2 to .5) each hold 16 idle connections to the admin port,
//!   reopening each one it closes (`support::hostile::IdlePeers`);
//! - row 3: 256 HTTP probes (8 pods of one namespace, 32 each, kruised's per-pod cap) against
//!   the tenant's server trickling its answers, timeout 60 s, every second
//!   (`support::hostile::trickling_server`);
//! - row 5: 200 recreate requests with 200 KiB of annotations each, waiting from before the
//!   start (`support::hostile::fat_recreate_requests`);
//! - row 7: 32 exec probes printing the time at every run (`date`), every second.
//!
//! For the window (`KRUISED_BENCH_SECS`, 60 s; 5 s under `cargo test`, the smoke run) it polls
//! `/healthz` from the node's address (loopback) every 100 ms, each with the kubelet's default
//! probe timeout (1 s), and samples the daemon's resident memory (VmRSS, RssAnon, RssFile of
//! /proc/PID/status). Printed: the peak resident memory (sampled, and the kernel's high-water
//! mark from its start, which the fat requests' list sets), the healthz success ratio, restarts
//! (0 when the process measured is the one started and still runs), NodePodProbe status writes
//! per second, and what the attackers held. The goal is met or not, said on the last line; the
//! smoke run only checks the harness (a debug build is larger than the shipped one).
//!
//! `KRUISED_TEST_BIN=target/dist/kruised cargo bench --bench hostile` measures the shipped
//! build.

#![allow(
    clippy::unwrap_used,
    reason = "benchmark harness: a failed unwrap is a failed run"
)]

use kruised_test_support as support;

use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use kruised::controller::podprobe::PROBES_PER_POD;
use kruised::k8s::crd::ProbeState;
use serde_json::{Value, json};
use support::daemon::{Daemon, Resident, try_http_get};
use support::hostile::{IdlePeers, fat_recreate_requests, trickling_server};
use support::node::{FakeNode, NODE};
use support::wait;

const LIMIT: Duration = Duration::from_secs(120);
/// The goal's bound on resident memory.
const GOAL_RSS: u64 = 48 << 20;
/// The goal's share of `/healthz` polls answered.
const GOAL_HEALTHZ: f64 = 0.99;
/// How often `/healthz` is asked and memory sampled.
const POLL: Duration = Duration::from_millis(100);
/// The kubelet's default probe timeout: a slower answer is a failed probe.
const HEALTHZ_TIMEOUT: Duration = Duration::from_secs(1);
/// Row 1: the pods holding the admin port's connections, and how many each.
const PEERS: u8 = 4;
const CONNECTIONS_PER_PEER: usize = 16;
/// Row 3: the trickled pods.
const TRICKLED_PODS: usize = 8;
/// Row 5: the fat requests, and their annotations' KiB each.
const REQUESTS: usize = 200;
const REQUEST_KIB: usize = 200;
/// Row 7: the pods of exec probes printing the time.
const CLOCK_PODS: usize = 1;

fn main_container() -> Value {
    json!([{"name": "main", "image": "busybox:v1"}])
}

fn probe(name: &str, timeout: i32, handler: Value) -> Value {
    let mut p = json!({"periodSeconds": 1, "timeoutSeconds": timeout});
    for (k, v) in handler.as_object().unwrap() {
        p[k] = v.clone();
    }
    json!({"name": name, "containerName": "main", "probe": p})
}

/// A pod of the fake node, and its entry of the NodePodProbe in `namespace` with `probes`.
fn pod_probes(node: &mut FakeNode, pod: &str, namespace: &str, probes: Vec<Value>) -> Value {
    let p = node.add_pod(pod, main_container(), json!({}), true);
    json!({"name": pod, "namespace": namespace, "uid": p.metadata.uid.unwrap(),
           "IP": "127.0.0.1", "probes": probes})
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / 1048576.0)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let window = Duration::from_secs(support::env_or(
        "KRUISED_BENCH_SECS",
        if full { 60 } else { 5 },
    ));
    let mut node = FakeNode::start().await;

    // row 5: waiting before the daemon starts (it lists them at every start)
    node.add_pod("crr-target", main_container(), json!({}), true);
    fat_recreate_requests(
        &node.api,
        NODE,
        "default",
        "crr-target",
        "fat",
        REQUESTS,
        REQUEST_KIB,
    );
    // row 3 and row 7: the tenant's markers, as kruise-manager lists them for the node
    let (trickle, trickled) = trickling_server().await;
    let mut entries = Vec::new();
    for i in 0..TRICKLED_PODS {
        let probes = (0..PROBES_PER_POD)
            .map(|j| {
                probe(
                    &format!("m#http-{j:02}"),
                    60,
                    json!({"httpGet": {"port": trickle}}),
                )
            })
            .collect();
        entries.push(pod_probes(
            &mut node,
            &format!("trickled-{i}"),
            "tenant-3",
            probes,
        ));
    }
    for i in 0..CLOCK_PODS {
        let probes = (0..PROBES_PER_POD)
            .map(|j| {
                probe(
                    &format!("m#clock-{j:02}"),
                    1,
                    json!({"exec": {"command": ["date"]}}),
                )
            })
            .collect();
        entries.push(pod_probes(
            &mut node,
            &format!("clock-{i}"),
            "tenant-7",
            probes,
        ));
    }
    let clock_uid = entries.last().unwrap()["uid"].as_str().unwrap().to_string();
    node.api
        .create(
            "nodepodprobes",
            json!({"apiVersion": "apps.kruise.io/v1alpha1", "kind": "NodePodProbe",
                   "metadata": {"name": NODE}, "spec": {"podProbes": entries}}),
        )
        .unwrap();

    let args = node.daemon_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let started = Instant::now();
    let mut d = Daemon::start(NODE, &args);
    let pid = d.pid().unwrap();
    d.wait_for_log("daemon ready", LIMIT).await;
    let ready_after = started.elapsed();

    // row 1: the tenant's pods take the admin port's connections
    let tenants: Vec<IpAddr> = (0..PEERS)
        .map(|n| Ipv4Addr::new(127, 0, 0, 2 + n).into())
        .collect();
    let peers = IdlePeers::hold(d.admin, &tenants, CONNECTIONS_PER_PEER);
    // every attack under way before the window: the pods hold connections, the trickled
    // probes hold theirs, the clock probes report
    wait::poll(
        LIMIT,
        POLL,
        "each tenant pod holding admin connections, the trickled probes holding theirs",
        || async { (peers.held(), trickled.open.load(Ordering::SeqCst)) },
        |(held, open)| *held >= tenants.len() && *open >= 1,
    )
    .await;
    wait::probe_state(
        &node.api,
        LIMIT,
        NODE,
        &clock_uid,
        "m#clock-00",
        ProbeState::Succeeded,
    )
    .await;

    let writes_before = node.api.request_count("patch", "nodepodprobes/status");
    let opened_before = peers.opened();
    let t0 = Instant::now();
    let (mut polls, mut answered) = (0usize, 0usize);
    let mut peak = Resident::default();
    let mut held_most = (0usize, 0usize);
    let mut tick = tokio::time::interval(POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while t0.elapsed() < window {
        tick.tick().await;
        // the kubelet's probe: from the node's address (loopback), its timeout
        polls += 1;
        let got = tokio::time::timeout(HEALTHZ_TIMEOUT, try_http_get(d.admin, "/healthz")).await;
        if matches!(got, Ok(Ok((200, _)))) {
            answered += 1;
        }
        if let Some(r) = Resident::of(pid)
            && r.total > peak.total
        {
            peak = r;
        }
        held_most.0 = held_most.0.max(peers.held());
        held_most.1 = held_most.1.max(trickled.open.load(Ordering::SeqCst));
    }
    let elapsed = t0.elapsed();
    let writes = node.api.request_count("patch", "nodepodprobes/status") - writes_before;
    let reopened = peers.opened() - opened_before;
    let high_water = d.rss_peak_bytes().unwrap_or(0);
    let alive = d.running() && d.pid() == Some(pid);
    let restarts = usize::from(!alive);
    drop(peers);
    let ratio = answered as f64 / polls.max(1) as f64;
    let secs = elapsed.as_secs_f64();

    println!(
        "hostile benchmark: issue 43's rows 1, 3, 5 and 7 at once, {elapsed:.1?} window, ready {ready_after:.1?} after start"
    );
    println!(
        "  attacks: {PEERS} pods x {CONNECTIONS_PER_PEER} idle admin connections (at most {} connected at once as the pods count them, {reopened} reopened in the window); {} HTTP probes against a trickling server (held at most {} connections); {REQUESTS} recreate requests x {REQUEST_KIB} KiB of annotations; {} exec probes printing the time each second",
        held_most.0,
        TRICKLED_PODS * PROBES_PER_POD,
        held_most.1,
        CLOCK_PODS * PROBES_PER_POD,
    );
    println!(
        "  resident memory: peak sampled {peak}; high-water mark since start {}",
        mib(high_water)
    );
    println!(
        "  /healthz from the node every {POLL:?}: {answered} of {polls} answered within {HEALTHZ_TIMEOUT:?} ({:.2}%)",
        100.0 * ratio
    );
    println!("  restarts: {restarts}");
    println!(
        "  NodePodProbe status writes: {writes} ({:.2}/s)",
        writes as f64 / secs
    );
    println!("  binary: {}", support::daemon::kruised_bin().display());
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    println!(
        "  machine: {}, load average {}",
        support::machine(),
        load.join(" ")
    );
    let met =
        peak.total < GOAL_RSS && high_water < GOAL_RSS && ratio >= GOAL_HEALTHZ && restarts == 0;
    println!(
        "  goal (resident under {}, /healthz at least {:.0}%, no restart): {}",
        mib(GOAL_RSS),
        100.0 * GOAL_HEALTHZ,
        if met { "met" } else { "NOT met" }
    );
    // the smoke run checks the harness: the attacks ran and kruised lived through them
    assert!(alive, "kruised exited\n{}", d.log_text());
    assert!(polls > 0 && answered > 0, "no /healthz answered");
    d.terminate();
    assert!(d.wait_exit(LIMIT).await.success());
}
