//! Pinning benchmark (issue 42, item 1): how many images kruised pre-pulls are removed by the
//! kubelet's image garbage collector before their first use. The real `kruised` binary pre-pulls
//! five images of a NodeImage (the lab's `bench/img1..4:v1`, each the busybox base plus 16 MiB of
//! its own, and `pin/busybox:v1`) from the lab's registry into the lab's runtime; then one pass of
//! a collector following the kubelet's rule (`tests/support/image_gc.rs`) over a disk far past
//! its high threshold (85 %), freeing all it may (low threshold 0), kept to those five
//! repositories. Each round removes the five first, so each is pulled anew.
//!
//! ```sh
//! LAB=/tmp/lab2 REG_ADDR=127.0.0.1:5602 CRI_LAB_RUNTIMES=containerd2 bash tests/cri-lab.sh start
//! KRUISED_LAB=/tmp/lab2 KRUISED_LAB_RUNTIME=containerd2 KRUISED_LAB_REGISTRY=127.0.0.1:5602 \
//!   cargo bench --bench pin
//! # after --: --rounds N (default 3)
//! ```
//!
//! On containerd 2.x kruised pins: 0 removed is the goal. On containerd 1.6 it cannot (what every
//! node saw before): all five are. Under `cargo test` (no `--bench` argument) it does nothing.

#![allow(
    clippy::unwrap_used,
    reason = "benchmark code: a failed unwrap is a failed run"
)]

use kruised_test_support as support;

use std::time::Duration;

use kruised::cri::{ImageService, RuntimeService};
use serde_json::{Map, Value, json};
use support::image_gc::ImageGc;
use support::pull::{LIMIT, NODE, create_node_image};
use support::{Lab, Plane, arg_or, wait};

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("pin benchmark: skipped (run it with `cargo bench --bench pin`)");
        return;
    }
    let rounds = arg_or("--rounds", 3usize).max(1);
    let Some(lab) = Lab::get() else { return };
    lab.script("bench-images");
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(bench(lab, rounds));
}

async fn bench(lab: Lab, rounds: usize) {
    let rt = lab.runtime();
    let mut names: Vec<String> = (1..=4)
        .map(|i| format!("{}/bench/img{i}", lab.registry))
        .collect();
    names.push(format!("{}/pin/busybox", lab.registry));
    let scope: Vec<&str> = names.iter().map(String::as_str).collect();
    let v = rt.version().await.unwrap();
    let version = format!("{} {}", v.runtime_name, v.runtime_version);
    let mut removed_total = 0;
    for round in 1..=rounds {
        for n in &names {
            rt.remove_image(&format!("{n}:v1")).await.unwrap();
        }
        let plane = Plane::start().await;
        let images: Map<String, Value> = names
            .iter()
            .map(|n| (n.clone(), json!({"tags": [{"tag": "v1", "version": 1}]})))
            .collect();
        create_node_image(&plane.api, Value::Object(images), None);
        let mut d = plane.start_daemon(&lab, NODE, &[], LIMIT).await;
        wait::node_image(&plane.api, LIMIT * 3, NODE, "all Succeeded", |s| {
            s.succeeded == 5
        })
        .await;
        let gc = ImageGc::new(1, 85, 0).scope(&scope);
        let pass = gc.pass(&rt).await;
        let removed = names.iter().filter(|n| pass.removed_named(n)).count();
        removed_total += removed;
        println!(
            "round {round}: {removed} of {} pre-pulled images removed by the first GC pass \
             before their first use ({} skipped as pinned)",
            names.len(),
            pass.skipped_pinned.len()
        );
        d.terminate();
        d.wait_exit(Duration::from_secs(10)).await;
    }
    for n in &names {
        rt.remove_image(&format!("{n}:v1")).await.unwrap();
    }
    println!(
        "{version}: {removed_total} of {} pre-pulled images removed before their first use, \
         {rounds} rounds",
        names.len() * rounds
    );
}
