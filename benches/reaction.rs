//! Benchmark: how fast kruised reacts to an env-from-metadata change, on a full node.
//!
//! The `kruised` binary runs against the API-server double and the fake runtime with 110 pods of
//! 3 containers each (330 containers). Each change patches the annotation a container's env refers
//! to on a pod whose `InPlaceUpdateReady` is False; the latency is from just before that write to
//! the runtime receiving `StopContainer` for the container. The harness then plays the kubelet
//! (recreates the container, reports it in the pod status) and waits for the new annotation.
//!
//! The daemon runs with `--env-restart-delay` from `KRUISED_BENCH_RESTART_DELAY`, `0s` unless set:
//! the daemon's own reaction. With `auto` (the default of `kruised run`), the latency includes the
//! deliberate settle wait, at least 250 ms, that keeps the kubelet from missing the restart (see
//! `src/controller/containermeta/settle.rs`).
//!
//! Also reported: the daemon's resident memory on that node (anonymous: heap and stacks; file:
//! the binary's pages in use), the API requests and runtime calls it makes in an idle window
//! (`KRUISED_BENCH_IDLE_SECS`, 10 s unless set; give 300 or more to see watch renewals and a
//! relist), and those it makes per change (the node's share of a rollout).
//!
//! `cargo bench --bench reaction` runs 200 changes; under `cargo test` (no `--bench` argument)
//! a 5-change smoke run checks that the harness still works.

#![allow(
    clippy::unwrap_used,
    reason = "benchmark harness: a failed unwrap is a failed run"
)]

use kruised_test_support as support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::json;
use support::daemon::Daemon;
use support::node::{FakeNode, NODE};
use support::wait;

const PODS: usize = 110;
const LIMIT: Duration = Duration::from_secs(30);

fn containers() -> serde_json::Value {
    json!([
        {"name": "app", "image": "registry.local/app:v1",
         "env": [{"name": "ROLE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['role']"}}},
                 {"name": "ZONE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}}]},
        {"name": "log", "image": "registry.local/log:v1"},
        {"name": "mesh", "image": "registry.local/mesh:v1"}
    ])
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let changes = if full { 200 } else { 5 };
    let mut node = FakeNode::start().await;
    for i in 0..PODS {
        node.add_pod(
            &format!("web-{i}"),
            containers(),
            json!({"role": "blue"}),
            false,
        );
    }
    let delay = std::env::var("KRUISED_BENCH_RESTART_DELAY").unwrap_or_else(|_| "0s".into());
    let load_before = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load_before = load_before
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ");
    let mut args = node.daemon_args();
    args.extend(["--env-restart-delay".to_string(), delay.clone()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut d = Daemon::start(NODE, &args);
    let started = Instant::now();
    d.wait_for_log("daemon ready", LIMIT).await;
    let ready_after = started.elapsed();
    // pods present at start are written on their first change
    for i in 0..PODS {
        node.api
            .modify("pods", "default", &format!("web-{i}"), |p| {
                p["metadata"]["labels"]["bench"] = json!("1")
            })
            .unwrap();
    }
    for i in 0..PODS {
        wait::try_meta(
            &node.api,
            LIMIT,
            "default",
            &format!("web-{i}"),
            "the annotation",
            |m| {
                m.containers.len() == 3
                    && m.containers
                        .iter()
                        .all(|c| c.hashes.extracted_env_from_metadata_hash != 0)
            },
        )
        .await
        .ok()
        .unwrap_or_else(|| {
            let problems: Vec<_> = d
                .log()
                .into_iter()
                .filter(|v| v["level"] != "INFO" && v["level"] != "DEBUG")
                .collect();
            panic!(
                "web-{i} never annotated: {:?}; daemon warnings: {problems:#?}",
                node.meta(&format!("web-{i}"))
            )
        });
    }
    let rss_loaded = d.resident();
    let by_mapping = d.resident_by_mapping();

    // steady state: an idle window with nothing changing
    let api_before = node.api.request_counts();
    let cri_before = node.cri.state().calls.clone();
    let idle = if full {
        Duration::from_secs(support::env_or("KRUISED_BENCH_IDLE_SECS", 10))
    } else {
        Duration::from_millis(500)
    };
    tokio::time::sleep(idle).await;
    let (idle_reads, idle_writes) = api_delta(&api_before, &node.api.request_counts());
    let idle_cri = cri_delta(&cri_before, &node.cri.state().calls);
    let rss_idle = d.resident();

    let api_before = node.api.request_counts();
    let cri_before = node.cri.state().calls.clone();
    let mut latencies = Vec::with_capacity(changes);
    for i in 0..changes {
        let pod = format!("web-{}", i % PODS);
        let stops_before = node.cri.state().stops.len();
        let t0 = Instant::now();
        node.api
            .modify("pods", "default", &pod, |p| {
                p["metadata"]["annotations"]["role"] = json!(format!("role-{i}"))
            })
            .unwrap();
        node.cri
            .wait_for(LIMIT, |s| s.stops.len() > stops_before)
            .await
            .unwrap_or_else(|_| panic!("change {i} on {pod}: no StopContainer"));
        let stopped_at = node.cri.state().stops[stops_before].1;
        latencies.push(stopped_at.duration_since(t0));
        let new_id = node.recreate(&pod, "app");
        let followed = |m: &kruised::k8s::keys::RuntimeContainerMetaSet| {
            m.container("app")
                .is_some_and(|c| c.container_id.ends_with(&new_id))
        };
        wait::meta(&node.api, LIMIT, "default", &pod, "the recreate", followed).await;
    }
    let (change_reads, change_writes) = api_delta(&api_before, &node.api.request_counts());
    let change_calls = cri_calls(&cri_before, &node.cri.state().calls);
    let change_cri = change_calls.values().sum::<u64>() as usize;
    let by_rpc: Vec<String> = change_calls
        .iter()
        .map(|(k, n)| format!("{k} {:.2}", *n as f64 / changes as f64))
        .collect();
    let stops = node.cri.state().stops.len();
    assert_eq!(stops, changes, "exactly one stop per change");
    let rss_after = d.resident();
    d.terminate();
    assert!(d.wait_exit(LIMIT).await.success());

    latencies.sort();
    let mean = latencies.iter().sum::<Duration>() / u32::try_from(changes).unwrap();
    let mib = |r: Option<support::daemon::Resident>| r.map_or("n/a".to_string(), |r| r.to_string());
    let per_minute = |n: usize| n as f64 * 60.0 / idle.as_secs_f64();
    let per_change = |n: usize| n as f64 / changes as f64;
    println!(
        "reaction benchmark: {PODS} pods, {} containers, {changes} changes, --env-restart-delay {delay}",
        PODS * 3
    );
    println!("  ready after start:         {ready_after:?}");
    println!(
        "  watch event -> StopContainer: p50 {:?}  p99 {:?}  max {:?}  mean {mean:?}",
        percentile(&latencies, 0.50),
        percentile(&latencies, 0.99),
        latencies[latencies.len() - 1],
    );
    println!(
        "  resident memory: {} loaded, {} idle, {} after the changes",
        mib(rss_loaded),
        mib(rss_idle),
        mib(rss_after)
    );
    if let Some(by) = by_mapping {
        println!("  loaded, by mapping: {by}");
    }
    println!(
        "  idle {idle:?}: {idle_writes} API writes, {idle_reads} API reads ({:.2}/min), {idle_cri} runtime calls ({:.2}/min)",
        per_minute(idle_reads),
        per_minute(idle_cri)
    );
    println!(
        "  per change: {:.2} API writes, {:.2} API reads, {:.2} runtime calls",
        per_change(change_writes),
        per_change(change_reads),
        per_change(change_cri)
    );
    println!("  runtime calls per change: {}", by_rpc.join(", "));
    println!(
        "  machine: {}; load average before: {load_before}",
        support::machine()
    );
}

/// API (reads, writes) between two request counts.
fn api_delta(
    before: &BTreeMap<(String, String), usize>,
    after: &BTreeMap<(String, String), usize>,
) -> (usize, usize) {
    let mut reads = 0;
    let mut writes = 0;
    for (k @ (verb, _), n) in after {
        let d = n - before.get(k).copied().unwrap_or(0);
        if matches!(verb.as_str(), "get" | "list" | "watch") {
            reads += d;
        } else {
            writes += d;
        }
    }
    (reads, writes)
}

/// Runtime calls made between two call counts, by RPC (those made at all).
fn cri_calls(
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    after
        .iter()
        .map(|(k, n)| (k.clone(), n - before.get(k).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// Runtime calls made between two call counts.
fn cri_delta(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> usize {
    cri_calls(before, after).values().sum::<u64>() as usize
}
