//! Benchmark: 1000 NodePodProbe probes on one node, and what they cost.
//!
//! The `kruised` binary runs against the API-server double and the fake runtime with 100 pods
//! of 2 containers, and a NodePodProbe listing 10 exec probes per pod (1000 probes; one in ten
//! fails). Reported:
//! - the time from the daemon being ready to all 1000 results in the NodePodProbe's status;
//! - in a steady window where no result changes: the daemon's CPU use (as a share of one core),
//!   its resident memory, the `ExecSync` calls it makes per second (the probes themselves), its
//!   other runtime calls, and its API writes (none are needed: nothing changed);
//! - the time from a spec change flipping 100 probes to failing commands to all 100 reported
//!   Failed.
//!
//! `cargo bench --bench podprobe` probes every second (`periodSeconds: 1`, the kubelet's
//! minimum and the most work); `KRUISED_BENCH_PROBE_PERIOD=10` gives the kubelet's default.
//! Under `cargo test` (no `--bench` argument) a 40-probe smoke run checks the harness.

#![allow(
    clippy::unwrap_used,
    reason = "benchmark harness: a failed unwrap is a failed run"
)]

use kruised_test_support as support;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::daemon::Daemon;
use support::node::{FakeNode, NODE};

const PROBES_PER_POD: usize = 10;
const LIMIT: Duration = Duration::from_secs(60);

fn containers() -> Value {
    json!([
        {"name": "app", "image": "registry.local/app:v1"},
        {"name": "side", "image": "registry.local/side:v1"}
    ])
}

/// Probe `j` of a pod: on `app` or `side` alternately; probe 9 runs `false` (Failed).
fn probe(j: usize, period: i64, command: &str) -> Value {
    json!({"name": format!("bench#p{j}"),
           "containerName": if j.is_multiple_of(2) { "app" } else { "side" },
           "probe": {"exec": {"command": [command]}, "periodSeconds": period,
                     "timeoutSeconds": 1}})
}

fn command(j: usize, flipped: bool) -> &'static str {
    if j == PROBES_PER_POD - 1 || (flipped && j == 0) {
        "false"
    } else {
        "true"
    }
}

fn spec(pods: &[(String, String)], period: i64, flipped: bool) -> Value {
    let pod_probes: Vec<Value> = pods
        .iter()
        .map(|(name, uid)| {
            json!({"name": name, "namespace": "default", "uid": uid, "IP": "127.0.0.1",
                   "probes": (0..PROBES_PER_POD)
                       .map(|j| probe(j, period, command(j, flipped)))
                       .collect::<Vec<_>>()})
        })
        .collect();
    json!({"podProbes": pod_probes})
}

/// (probe name, state) of every result in the status.
fn states(npp: &Value) -> Vec<(String, String)> {
    npp["status"]["podProbeStatuses"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| p["probeStates"].as_array().cloned().unwrap_or_default())
        .map(|s| {
            (
                s["name"].as_str().unwrap_or_default().to_string(),
                s["state"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

type Counts = std::collections::BTreeMap<(String, String), usize>;

/// The writes (every verb but get, list and watch) made between two request counts, by verb
/// and resource (those made at all).
fn writes(before: &Counts, after: &Counts) -> Counts {
    after
        .iter()
        .filter(|((verb, _), _)| !matches!(verb.as_str(), "get" | "list" | "watch"))
        .map(|(k, n)| (k.clone(), n - before.get(k).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let pods = if full { 100 } else { 4 };
    let period: i64 = support::env_or("KRUISED_BENCH_PROBE_PERIOD", 1);
    let probes = pods * PROBES_PER_POD;
    let mut node = FakeNode::start().await;
    let mut uids = Vec::new();
    for i in 0..pods {
        let name = format!("web-{i}");
        let pod = node.add_pod(&name, containers(), json!({}), true);
        uids.push((name, pod.metadata.uid.unwrap()));
    }
    node.api
        .create(
            "nodepodprobes",
            json!({"apiVersion": "apps.kruise.io/v1alpha1", "kind": "NodePodProbe",
                   "metadata": {"name": NODE}, "spec": spec(&uids, period, false)}),
        )
        .unwrap();
    let args = node.daemon_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut d = Daemon::start(NODE, &args);
    d.wait_for_log("daemon ready", LIMIT).await;
    let t0 = Instant::now();
    let failing = pods;
    node.api
        .wait_for_value(LIMIT, |v| {
            let s = states(&v.get("nodepodprobes", "", NODE)?);
            let failed = s.iter().filter(|(_, st)| st == "Failed").count();
            let succeeded = s.iter().filter(|(_, st)| st == "Succeeded").count();
            (failed == failing && succeeded == probes - failing).then_some(())
        })
        .await
        .unwrap_or_else(|_| {
            panic!(
                "not all {probes} results reported; status now {:?}",
                node.api.get("nodepodprobes", "", NODE).map(|v| states(&v))
            )
        });
    let all_reported = t0.elapsed();

    // steady state: probes keep running, no result changes
    let window = if full {
        Duration::from_secs(30)
    } else {
        Duration::from_secs(2)
    };
    let counts_before = node.api.request_counts();
    let cri_before = node.cri.state().calls.clone();
    let cpu_before = d.cpu_time();
    tokio::time::sleep(window).await;
    let cpu = d.cpu_time().zip(cpu_before).map(|(a, b)| a - b);
    let rss = d.resident();
    let written = writes(&counts_before, &node.api.request_counts());
    let api_writes: usize = written.values().sum();
    let write_kinds: Vec<String> = written
        .iter()
        .map(|((verb, resource), n)| format!("{verb} {resource}: {n}"))
        .collect();
    let cri_after = node.cri.state().calls.clone();
    let delta = |rpc: &str| {
        cri_after.get(rpc).copied().unwrap_or(0) - cri_before.get(rpc).copied().unwrap_or(0)
    };
    let execs = delta("ExecSync");
    let other: u64 = cri_after
        .keys()
        .filter(|k| k.as_str() != "ExecSync")
        .map(|k| delta(k))
        .sum();

    // a spec change flips probe 0 of every pod to a failing command
    let t1 = Instant::now();
    node.api
        .modify("nodepodprobes", "", NODE, |v| {
            v["spec"] = spec(&uids, period, true)
        })
        .unwrap();
    node.api
        .wait_for_value(LIMIT, |v| {
            let s = states(&v.get("nodepodprobes", "", NODE)?);
            let failed = s
                .iter()
                .filter(|(n, st)| n == "bench#p0" && st == "Failed")
                .count();
            (failed == pods).then_some(())
        })
        .await
        .unwrap_or_else(|_| panic!("the flipped probes were never all Failed"));
    let flipped = t1.elapsed();
    d.terminate();
    assert!(d.wait_exit(LIMIT).await.success());

    let secs = window.as_secs_f64();
    println!(
        "podprobe benchmark: {pods} pods, {probes} exec probes every {period}s ({failing} failing)"
    );
    println!("  all results reported after ready: {all_reported:?}");
    println!(
        "  steady {window:?}: CPU {}, resident memory {}",
        cpu.map_or("n/a".into(), |c| format!(
            "{:.1}% of one core",
            100.0 * c.as_secs_f64() / secs
        )),
        rss.map_or("n/a".into(), |r| r.to_string())
    );
    println!(
        "  steady {window:?}: {:.0} ExecSync/s (probes), {other} other runtime calls, {api_writes} API writes {write_kinds:?}",
        execs as f64 / secs
    );
    println!("  spec change -> {pods} flipped probes reported Failed: {flipped:?}");
    println!("  machine: {}", support::machine());
}
