//! Benchmark: how fast kruised reacts to an env-from-metadata change, on a full node.
//!
//! The `kruised` binary runs against the API-server double and the fake runtime with 110 pods of
//! 3 containers each (330 containers). Each change patches the annotation a container's env refers
//! to on a pod whose `InPlaceUpdateReady` is False; the latency is from just before that write to
//! the runtime receiving `StopContainer` for the container. The harness then plays the kubelet
//! (recreates the container, reports it in the pod status) and waits for the new annotation.
//!
//! Also reported: the daemon's resident memory on that node, and the API writes and runtime calls
//! it makes in an idle window (steady state).
//!
//! `cargo bench --bench reaction` runs 200 changes; under `cargo test` (no `--bench` argument)
//! a 5-change smoke run checks that the harness still works.

#![allow(
    clippy::unwrap_used,
    reason = "benchmark harness: a failed unwrap is a failed run"
)]

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use serde_json::json;
use support::daemon::Daemon;
use support::node::{FakeNode, NODE};

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
    let args = node.daemon_args();
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
        node.wait_meta(&format!("web-{i}"), LIMIT, |m| {
            m.containers.len() == 3
                && m.containers
                    .iter()
                    .all(|c| c.hashes.extracted_env_from_metadata_hash != 0)
        })
        .await
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
    let rss_loaded = d.rss_bytes();

    // steady state: an idle window with nothing changing
    let api_before = node.api.request_counts();
    let cri_before = node.cri.state().calls.clone();
    let idle = if full {
        Duration::from_secs(10)
    } else {
        Duration::from_millis(500)
    };
    tokio::time::sleep(idle).await;
    let api_writes: usize = node
        .api
        .request_counts()
        .iter()
        .filter(|((verb, _), _)| !matches!(verb.as_str(), "get" | "list" | "watch"))
        .map(|(k, n)| n - api_before.get(k).copied().unwrap_or(0))
        .sum();
    let cri_calls: u64 = node
        .cri
        .state()
        .calls
        .iter()
        .map(|(k, n)| n - cri_before.get(k).copied().unwrap_or(0))
        .sum();

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
        node.wait_meta(&pod, LIMIT, |m| {
            m.container("app")
                .is_some_and(|c| c.container_id.ends_with(&new_id))
        })
        .await
        .unwrap_or_else(|| panic!("{pod}: annotation never followed the recreate"));
    }
    let stops = node.cri.state().stops.len();
    assert_eq!(stops, changes, "exactly one stop per change");
    let rss_after = d.rss_bytes();
    d.terminate();
    assert!(d.wait_exit(LIMIT).await.success());

    latencies.sort();
    let mean = latencies.iter().sum::<Duration>() / u32::try_from(changes).unwrap();
    let mib = |b: Option<u64>| {
        b.map_or("n/a".to_string(), |b| {
            format!("{:.1} MiB", b as f64 / 1048576.0)
        })
    };
    println!(
        "reaction benchmark: {PODS} pods, {} containers, {changes} changes",
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
        "  resident memory: {} loaded, {} after the changes",
        mib(rss_loaded),
        mib(rss_after)
    );
    println!("  idle {idle:?}: {api_writes} API writes, {cri_calls} runtime calls");
    println!("  machine: {}", support::machine());
}
