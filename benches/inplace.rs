//! The user's figure of an env-from-metadata in-place update, on the real cluster of the test
//! layer (real kube-apiserver, kubelet and containerd): from the manager's annotation change to
//! both containers of the pod running with the new value, and how many restarts that took,
//! for kruised's `auto` restart timing side by side with a fixed 1 s delay (kruise-daemon's
//! behaviour) and with no delay at all (the race the `auto` timing avoids).
//!
//! Each mode: 50 pods (two containers each, exec and HTTP preStop hooks), then one in-place
//! update per pod as kruise-manager makes it (`InPlaceUpdateReady=False`, then the annotation
//! change), in waves of 10, with two busy processes loading the cores. Also reported: the
//! daemon's resident memory on that node (`KRUISED_TEST_BIN=target/dist/kruised` measures the
//! shipped build).
//!
//!     # with the cluster lab of tests/run.sh running (KRUISED_KUBE_LAB and friends exported)
//!     cargo bench --bench inplace
//!     KRUISED_BENCH_MODES=auto cargo bench --bench inplace     # one mode
//!
//! Under `cargo test` (no `--bench` argument) a smoke run of one wave in `auto` mode checks that
//! the harness still works.

#![allow(
    clippy::unwrap_used,
    reason = "benchmark code: a failed unwrap is a failed run"
)]

use kruised_test_support as support;

use std::time::Duration;

use support::cluster::{self, KubeLab, Rbac, Scene};
use support::daemon::Resident;
use support::restarts::{self, ChangeResult, CpuLoad, HookServer};

const PODS: usize = 50;
const WAVE: usize = 10;

/// Resident memory of the daemon with its pods loaded, and after the changes.
type Memory = [Option<Resident>; 2];

async fn run_mode(
    lab: &KubeLab,
    mode: &str,
    pods: usize,
    full: bool,
) -> (Vec<ChangeResult>, Memory) {
    let scene = Scene::new(lab, "bench").await;
    let identity = cluster::identity(lab, &scene.admin, Rbac::Deploy).await;
    let mut d = cluster::start_daemon(lab, &identity, &["--env-restart-delay", mode]);
    d.wait_for_log("daemon ready", Duration::from_secs(60))
        .await;
    let hooks = HookServer::start().await;
    let pods = restarts::create_pods(&scene, &hooks, "b", pods).await;
    let loaded = d.resident();
    // the measurement: always two busy loops; the smoke run only tops the machine's load up
    let load = if full {
        CpuLoad::start(2)
    } else {
        CpuLoad::top_up()
    };
    let mut results = Vec::new();
    for wave in pods.chunks(WAVE) {
        results.extend(restarts::change_wave(&scene, &hooks, wave, "v2").await);
    }
    drop(load);
    let after = d.resident();
    d.terminate();
    d.wait_exit(Duration::from_secs(30)).await;
    scene.cleanup().await;
    (results, [loaded, after])
}

fn report(mode: &str, results: &[ChangeResult], memory: Memory) {
    let once = results.iter().filter(|r| r.restarts == [1, 1]).count();
    let more = results.len() - once;
    let hooks_once = results.iter().filter(|r| r.hooks == [1, 1]).count();
    let stale = results.iter().filter(|r| r.seen != ["v2", "v2"]).count();
    let mut took: Vec<Duration> = results.iter().map(|r| r.took).collect();
    println!(
        "{mode:>5}: {} changes; exactly one restart per container: {once}, more: {more}; one preStop per container: {hooks_once}; stale value seen: {stale}; change -> running with the new value: p50 {:.2}s p90 {:.2}s max {:.2}s",
        results.len(),
        restarts::percentile(&mut took, 0.5).as_secs_f64(),
        restarts::percentile(&mut took, 0.9).as_secs_f64(),
        restarts::percentile(&mut took, 1.0).as_secs_f64(),
    );
    let mib = |m: Option<Resident>| m.map_or("n/a".into(), |r| r.to_string());
    println!(
        "{mode:>5}: daemon resident memory: {} with the pods loaded, {} after the changes",
        mib(memory[0]),
        mib(memory[1])
    );
}

fn main() {
    let Some(lab) = KubeLab::get() else {
        println!("inplace: no cluster lab (KRUISED_KUBE_LAB); start it as tests/run.sh does");
        return;
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    // under `cargo test` (no --bench argument) a smoke run: one wave, the default mode
    let full = std::env::args().any(|a| a == "--bench");
    let (pods, default_modes) = if full {
        (PODS, "auto,1s,0s")
    } else {
        (WAVE, "auto")
    };
    println!(
        "inplace: {pods} pods x 2 containers, waves of {WAVE}, 2 busy loops; {}",
        support::machine()
    );
    // KRUISED_BENCH_MODES=auto,1s runs a subset
    let modes = std::env::var("KRUISED_BENCH_MODES").unwrap_or_else(|_| default_modes.into());
    for mode in modes.split(',').map(str::trim).filter(|m| !m.is_empty()) {
        let (results, memory) = rt.block_on(run_mode(&lab, mode, pods, full));
        report(mode, &results, memory);
    }
}
