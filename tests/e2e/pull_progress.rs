//! Real pull progress and the stall timeout (issue 42, item 4), on real containerd: the image
//! puller in-process over the lab's socket, the registry behind a relay that slows it down or
//! goes silent (`tcp_relay`). Each test pulls a bench image no other e2e test pulls
//! (`cri-lab.sh bench-images`: the busybox base plus one 16 MiB random layer, made anew).
//!
//! The figures they print (`FIGURES`) are docs/PERFORMANCE.md's: how soon the NodeImage's
//! progress follows the bytes the registry sent, and when a stalled pull fails against its
//! bound. Timings are printed, never asserted.

use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::pull_support::{LIMIT, NODE, PullNode, fast, tag};
use crate::support::tcp_relay::TcpRelay;
use crate::support::{Lab, LabRuntime, wait};
use kruised::controller::imagepull::Settings;
use kruised::cri::ImageService;
use kruised::k8s::crd::ImagePullPhase;
use serde_json::json;

/// The random layer of a bench image.
const LAYER: u64 = 16 << 20;

/// A registry host for containerd that is the relay (`certs.d/<relay>/hosts.toml`); removed
/// on drop.
pub(crate) struct RelayHost(std::path::PathBuf);

impl RelayHost {
    pub(crate) fn new(lab: &Lab, addr: SocketAddr) -> RelayHost {
        let dir = lab.dir.join("certs.d").join(addr.to_string());
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("hosts.toml"),
            format!(
                "server = \"http://{addr}\"\n[host.\"http://{addr}\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
            ),
        )
        .unwrap();
        RelayHost(dir)
    }
}

impl Drop for RelayHost {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Taken by the tests that read a pull's progress from the node's ingests, and by those that
/// land bytes slowly beside them (`pull_turn.rs`): containerd's ingests are the node's, not a
/// pull's (`progress.rs`), and another test's bytes landing would count as this one's (a stall
/// not seen).
pub(crate) async fn ingests_alone() -> tokio::sync::MutexGuard<'static, ()> {
    static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    LOCK.lock().await
}

/// Whether the lab's runtime shows pulls' progress (containerd's content service).
fn shows_progress(lab: &Lab) -> bool {
    if lab.runtime == LabRuntime::Crio {
        eprintln!("SKIPPED: CRI-O shows no pull progress (docs/security.md, README)");
        return false;
    }
    true
}

#[tokio::test]
async fn a_nodeimage_tag_shows_its_progress_rise_between_0_and_100_while_its_layer_lands() {
    let Some(lab) = Lab::get() else { return };
    if !shows_progress(&lab) {
        return;
    }
    let _alone = ingests_alone().await;
    lab.script("bench-images");
    // 4 MiB/s: the 16 MiB layer lands over about four seconds
    let relay = TcpRelay::start(lab.registry.parse().unwrap()).await;
    relay.limit(Some(4 << 20), None);
    let _host = RelayHost::new(&lab, relay.addr);
    let name = format!("{}/bench/img3", relay.addr);
    let node = PullNode::start(fast(), lab.endpoint()).await;
    let _ = node.runtime.remove_image(&format!("{name}:v1")).await;

    // the bytes the registry sent, and the progress the NodeImage showed, each when seen
    let sent = Mutex::new(Vec::<(Instant, u64)>::new());
    let shown = Mutex::new(Vec::<(Instant, i32)>::new());
    node.create_node_image(json!({ &name: {"tags": [{"tag": "v1", "version": 1}]}}));
    let (_, status) = tokio::join!(
        relay.wait_until("the whole layer sent", LIMIT, |s| {
            sent.lock().unwrap().push((Instant::now(), s.bytes_down));
            s.bytes_down >= LAYER
        }),
        wait::node_image(&node.api, LIMIT, NODE, "v1 Succeeded", |s| {
            let Some(t) = s
                .image_statuses
                .get(&name)
                .and_then(|i| i.tags.iter().find(|t| t.tag == "v1"))
            else {
                return false;
            };
            let mut shown = shown.lock().unwrap();
            if shown.last().is_none_or(|&(_, p)| p != t.progress) {
                shown.push((Instant::now(), t.progress));
            }
            t.phase == ImagePullPhase::Succeeded || t.phase == ImagePullPhase::Failed
        }),
    );
    let _ = node.runtime.remove_image(&format!("{name}:v1")).await;
    let t = tag(&status, &name, "v1");
    let shown = shown.into_inner().unwrap();
    assert_eq!(
        (&t.phase, t.progress),
        (&ImagePullPhase::Succeeded, 100),
        "{t:?}"
    );
    let between: Vec<i32> = shown
        .iter()
        .map(|&(_, p)| p)
        .filter(|p| (1..100).contains(p))
        .collect();
    assert!(
        !between.is_empty(),
        "the tag's progress was seen between 0 and 100 while its layer landed; it showed {:?}",
        shown.iter().map(|&(_, p)| p).collect::<Vec<_>>()
    );
    assert!(
        between.windows(2).all(|w| w[0] < w[1]),
        "progress only rises: {between:?}"
    );

    // how soon the status followed the bytes: for each percent shown, the time since the relay
    // had sent that share of what it sent in all (an approximation: the relay's bytes are the
    // layer, the manifest, the config and HTTP)
    let sent = sent.into_inner().unwrap();
    let all = sent.last().map_or(1, |&(_, b)| b.max(1));
    let lags: Vec<(i32, Duration)> = shown
        .iter()
        .filter(|&&(_, p)| (1..100).contains(&p))
        .filter_map(|&(at, p)| {
            let want = all * u64::try_from(p).unwrap() / 100;
            let landed = sent.iter().find(|&&(_, b)| b >= want)?.0;
            Some((p, at.saturating_duration_since(landed)))
        })
        .collect();
    eprintln!(
        "FIGURES progress: {} values between 0 and 100 ({between:?}); the status followed the \
         relay's bytes by {}",
        between.len(),
        lags.iter()
            .map(|(p, d)| format!("{p}%: {} ms", d.as_millis()))
            .collect::<Vec<_>>()
            .join(", ")
    );
}

#[tokio::test]
async fn a_pull_whose_registry_goes_silent_mid_layer_fails_at_its_stall_timeout_naming_the_stall() {
    let Some(lab) = Lab::get() else { return };
    if !shows_progress(&lab) {
        return;
    }
    let _alone = ingests_alone().await;
    const STALL: Duration = Duration::from_secs(5);
    lab.script("bench-images");
    // 2 MiB/s: the layer would take eight seconds
    let relay = TcpRelay::start(lab.registry.parse().unwrap()).await;
    relay.limit(Some(2 << 20), None);
    let _host = RelayHost::new(&lab, relay.addr);
    let name = format!("{}/bench/img2", relay.addr);
    let settings = Settings {
        stall_timeout: Some(STALL),
        ..fast()
    };
    let node = PullNode::start(settings, lab.endpoint()).await;
    let _ = node.runtime.remove_image(&format!("{name}:v1")).await;

    // one attempt of up to ten minutes: only the stall can end it within the wait below
    node.create_node_image(json!({ &name: {"tags": [{"tag": "v1", "version": 1,
        "pullPolicy": {"timeoutSeconds": 600, "backoffLimit": 0}}]}}));
    relay
        .wait_until("3 MiB sent", LIMIT, |s| s.bytes_down > 3 << 20)
        .await;
    let silenced = relay.silence_open();
    let since = Instant::now();
    assert!(silenced > 0, "the pull's connection was open");
    // the bound: the stall timeout, a poll of the ingests, a status write
    let bound = STALL + Duration::from_secs(5);
    let status = wait::node_image(&node.api, bound, NODE, "v1 Failed", |s| s.failed == 1).await;
    let took = since.elapsed();
    let t = tag(&status, &name, "v1");
    assert_eq!(t.phase, ImagePullPhase::Failed);
    for said in [
        "stalled",
        "MiB",
        "nothing for",
        "--image-pull-stall-timeout",
    ] {
        assert!(t.message.contains(said), "{said:?} in {:?}", t.message);
    }
    assert!(
        (1..100).contains(&t.progress),
        "the failed tag keeps the progress it made: {}",
        t.progress
    );
    eprintln!(
        "FIGURES stall: the tag failed {} ms after the registry went silent (stall timeout {} ms): {}",
        took.as_millis(),
        STALL.as_millis(),
        t.message
    );
}
