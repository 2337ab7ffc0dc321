//! Pre-pull benchmark: the time to pull a set of images through the image puller (a NodeImage
//! written to the API double, until its status says every tag Succeeded) next to the time to
//! pull the same images directly through CRI `PullImage`, side by side in one run against the
//! real lab (containerd + registry from `tests/cri-lab.sh`). Images are removed before every
//! run, so each run fetches their layers again; the two ways alternate their order each round.
//!
//! Run (with a lab started by `tests/cri-lab.sh`, as the README's Tests section shows):
//!
//! ```sh
//! KRUISED_LAB=/tmp/kruised-lab cargo bench --bench prepull
//! # options after --: --rounds N (default 15), --images N (1..=4, default 4)
//! # PREPULL_VERBOSE=1 prints each run's PullImage calls
//! ```
//!
//! It builds the lab's bench images first (`cri-lab.sh bench-images`: four images, each the
//! busybox base plus one 16 MiB layer of random bytes). Target: ratio ≤ 1.05. Under `cargo test`
//! (no `--bench` argument) it does nothing.

#![allow(
    clippy::unwrap_used,
    reason = "benchmark code: a failed unwrap is a failed run"
)]

use kruised_test_support as support;
use kruised_test_support::pull as pull_support;

use std::time::{Duration, Instant};

use kruised::controller::imagepull::Settings;
use kruised::cri::{RemoteRuntime, Timeouts};
use kruised::k8s::crd::ImagePullPhase;
use pull_support::PullNode;
use serde_json::{Value, json};
use support::{Lab, arg_or};

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("prepull benchmark: skipped (run it with `cargo bench --bench prepull`)");
        return;
    }
    let rounds = arg_or("--rounds", 15usize).max(1);
    let count = arg_or("--images", 4usize).clamp(1, 4);
    let Some(lab) = Lab::get() else { return };
    lab.script("bench-images");
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(bench(lab, rounds, count));
}

/// One run through the puller: total time, and the daemon's share of it: before the first
/// `PullImage` started and after the last one returned.
struct Run {
    total: Duration,
    before: Duration,
    after: Duration,
    /// Start of each pull after the first one's, and its duration.
    calls: Vec<(Duration, Duration)>,
}

/// The same images as NodeImage tags at `version`, until the stored status has them all
/// Succeeded.
async fn through_puller(node: &PullNode, repos: &[String], version: i64) -> Run {
    let images: serde_json::Map<String, Value> = repos
        .iter()
        .map(|r| {
            (
                r.clone(),
                json!({"tags": [{"tag": "v1", "version": version}]}),
            )
        })
        .collect();
    let started = Instant::now();
    if version == 1 {
        node.create_node_image(Value::Object(images));
    } else {
        node.set_images(Value::Object(images));
    }
    node.wait_status("every tag Succeeded", |s| {
        s.succeeded as usize == repos.len()
            && s.image_statuses.values().all(|i| {
                i.tags
                    .iter()
                    .all(|t| t.version == version && t.phase == ImagePullPhase::Succeeded)
            })
    })
    .await;
    let ended = Instant::now();
    let calls: Vec<_> = node
        .pull_calls()
        .into_iter()
        .filter(|c| c.started >= started)
        .collect();
    let first = calls.iter().map(|c| c.started).min().unwrap();
    let last = calls.iter().map(|c| c.ended).max().unwrap();
    Run {
        total: ended - started,
        before: first - started,
        after: ended - last,
        calls: calls
            .iter()
            .map(|c| (c.started - first, c.ended - c.started))
            .collect(),
    }
}

fn median(v: &[Duration]) -> Duration {
    let mut s = v.to_vec();
    s.sort();
    s[s.len() / 2]
}

fn mean(v: &[Duration]) -> Duration {
    v.iter().sum::<Duration>() / u32::try_from(v.len()).unwrap()
}

async fn bench(lab: Lab, rounds: usize, count: usize) {
    let repos: Vec<String> = (1..=count)
        .map(|i| format!("{}/bench/img{i}", lab.registry))
        .collect();
    let images: Vec<String> = repos.iter().map(|r| format!("{r}:v1")).collect();
    let rt = RemoteRuntime::new(lab.endpoint(), None, Timeouts::default());
    let version = kruised::cri::RuntimeService::version(&rt).await.unwrap();
    // the daemon's own settings: unlimited workers, default coalescing
    let node = PullNode::start(Settings::default(), lab.endpoint()).await;

    // warm-up: one of each, not counted (first connections, first registry reads)
    pull_support::remove_images(&rt, &images).await;
    pull_support::pull_at_once(&rt, &images).await;
    pull_support::remove_images(&rt, &images).await;
    through_puller(&node, &repos, 1).await;

    let (mut d, mut p, mut before, mut after) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let verbose = std::env::var_os("PREPULL_VERBOSE").is_some();
    let mut record = |r: Run| {
        if verbose {
            let calls: Vec<String> = r
                .calls
                .iter()
                .map(|(at, took)| format!("+{}ms/{}ms", at.as_millis(), took.as_millis()))
                .collect();
            println!(
                "  kruised: {}ms before, {}ms after; pulls (start, duration): {}",
                r.before.as_millis(),
                r.after.as_millis(),
                calls.join(" ")
            );
        }
        before.push(r.before);
        after.push(r.after);
        r.total
    };
    for round in 0..rounds {
        let v = i64::try_from(round).unwrap() + 2;
        if round % 2 == 0 {
            pull_support::remove_images(&rt, &images).await;
            d.push(pull_support::pull_at_once(&rt, &images).await);
            pull_support::remove_images(&rt, &images).await;
            p.push(record(through_puller(&node, &repos, v).await));
        } else {
            pull_support::remove_images(&rt, &images).await;
            p.push(record(through_puller(&node, &repos, v).await));
            pull_support::remove_images(&rt, &images).await;
            d.push(pull_support::pull_at_once(&rt, &images).await);
        }
        println!(
            "round {}: direct CRI {:>8.1} ms   through kruised {:>8.1} ms",
            round + 1,
            d[round].as_secs_f64() * 1e3,
            p[round].as_secs_f64() * 1e3
        );
    }
    let ratio = median(&p).as_secs_f64() / median(&d).as_secs_f64();
    let mean_ratio = mean(&p).as_secs_f64() / mean(&d).as_secs_f64();
    // each round's pair ran back to back: their ratio cancels slow drift in the machine's load
    let mut paired: Vec<f64> = p
        .iter()
        .zip(&d)
        .map(|(p, d)| p.as_secs_f64() / d.as_secs_f64())
        .collect();
    paired.sort_by(f64::total_cmp);
    let paired = paired[paired.len() / 2];
    println!();
    println!("machine:  {}", support::machine());
    println!(
        "runtime:  {} {} ({}), registry on loopback",
        version.runtime_name, version.runtime_version, lab.registry
    );
    println!(
        "images:   {count} x (busybox base + 16 MiB random layer), pulled concurrently, removed before each run"
    );
    println!(
        "direct CRI PullImage:   median {:>8.1} ms  mean {:>8.1} ms",
        median(&d).as_secs_f64() * 1e3,
        mean(&d).as_secs_f64() * 1e3
    );
    println!(
        "through kruised:        median {:>8.1} ms  mean {:>8.1} ms",
        median(&p).as_secs_f64() * 1e3,
        mean(&p).as_secs_f64() * 1e3
    );
    println!(
        "kruised's share:        median {:>8.1} ms before the first PullImage, {:>6.1} ms after the last",
        median(&before).as_secs_f64() * 1e3,
        median(&after).as_secs_f64() * 1e3
    );
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "load average at the end: {}",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!(
        "ratio: medians {ratio:.3}, means {mean_ratio:.3}, median of per-round ratios {paired:.3}  \
         (target <= 1.05) {}",
        if ratio <= 1.05 { "OK" } else { "ABOVE TARGET" }
    );
}
