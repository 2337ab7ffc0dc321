//! The real kube-apiserver gone silent or away, between it and kruised a TCP relay the test
//! controls (where a load balancer stands): the integration layer's fault tests
//! (`tests/integration/silent_api.rs`, on the API double in CI) against the real server and the
//! real kubelet. The test plays kruise-manager (an env-from-metadata change with
//! `InPlaceUpdateReady` False), as `containermeta.rs` does.
//!
//! The relay stands in for the server's faults: it silences every open connection (no FIN, no
//! RST; new connections work), or silences them and refuses new ones for five minutes (the
//! server away, etcd kept: kube-apiserver's default compaction every 5 minutes may make the
//! watches' resourceVersions too old by then, and kruised must relist). Stopping the lab's
//! kube-apiserver itself, its etcd compacted, and answers slowed to 10 s stay with the double,
//! whose clock and store the test owns. Each test prints how long kruised took to notice and to
//! act.

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;

use super::Scene;
use super::containermeta::{assert_restarts, meta_current, restarted, stops_logged};
use super::support::cluster::{self, KubeLab, Rbac, wait_for};
use super::support::daemon::Daemon;
use super::support::tcp_relay::TcpRelay;
use super::{status_of, support};

/// What kruised may take to act on a change after a fault (issue 34's aim): HTTP/2 pings find a
/// silent connection within 25 s, a failed watch is retried within 36 s.
const ACT_LIMIT: Duration = Duration::from_secs(60);
/// How long the server is away in the outage test.
const OUTAGE: Duration = Duration::from_secs(300);
const READY: Duration = Duration::from_secs(60);

/// The `host:port` of an `https://` server URL, resolved.
fn server_addr(url: &str) -> SocketAddr {
    let authority = url
        .strip_prefix("https://")
        .unwrap_or_else(|| panic!("the lab's server is not https: {url}"))
        .split('/')
        .next()
        .unwrap();
    authority
        .to_socket_addrs()
        .unwrap_or_else(|e| panic!("{authority}: {e}"))
        .next()
        .unwrap()
}

/// kruised with the deploy RBAC's identity, reaching the lab's API server through a relay.
struct Relayed {
    relay: TcpRelay,
    daemon: Daemon,
    _identity: cluster::Identity,
}

async fn start(lab: &KubeLab, scene: &Scene) -> Relayed {
    let identity = cluster::identity(lab, &scene.admin, Rbac::Deploy).await;
    let mut kubeconfig: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&identity.kubeconfig).unwrap()).unwrap();
    let server = kubeconfig["clusters"][0]["cluster"]["server"]
        .as_str()
        .unwrap()
        .to_string();
    let relay = TcpRelay::start(server_addr(&server)).await;
    // the lab's serving certificate names 127.0.0.1, where the relay listens
    kubeconfig["clusters"][0]["cluster"]["server"] = json!(relay.https_url());
    std::fs::write(
        &identity.kubeconfig,
        serde_json::to_vec_pretty(&kubeconfig).unwrap(),
    )
    .unwrap();
    let mut daemon = cluster::start_daemon(lab, &identity, &[]);
    daemon.wait_for_log("daemon ready", READY).await;
    // HTTP/2 (kube-apiserver picks h2): every watch and write of kruised on one connection
    relay
        .wait_until("kruised on one connection", READY, |r| r.open == 1)
        .await;
    Relayed {
        relay,
        daemon,
        _identity: identity,
    }
}

/// Runs the pod `web` (`main` reads the annotation `app-config`), waits for its annotation,
/// and takes it out of service as kruise-manager does before an in-place update (no stale env
/// yet: nothing to restart). Returns `main`'s container ID.
async fn pod_out_of_service(scene: &Scene, lab: &KubeLab) -> String {
    let image = lab.image("busybox:v1");
    scene
        .run_pod(scene.kruise_pod("web", &[("main", &image, &[("APP_CONFIG", "app-config")])]))
        .await;
    let pod = wait_for(
        &scene.pods(),
        "web",
        "an up-to-date annotation",
        meta_current,
    )
    .await;
    scene.set_update_ready("web", false).await;
    status_of(&pod, "main").container_id.clone().unwrap()
}

async fn change(scene: &Scene, value: &str) {
    scene
        .patch_pod(
            "web",
            json!({"metadata": {"annotations": {"app-config": value}}}),
        )
        .await;
}

#[tokio::test]
async fn a_change_made_after_every_open_connection_to_the_real_api_server_went_silent_is_acted_on_once_within_a_minute()
 {
    let Some(lab) = KubeLab::get() else { return };
    let _serial = KubeLab::serial().await;
    let scene = Scene::new(&lab, "silent").await;
    let mut k = start(&lab, &scene).await;
    let old = pod_out_of_service(&scene, &lab).await;
    let before = k.relay.stats();

    assert_eq!(
        k.relay.silence_open(),
        1,
        "kruised's connection went silent"
    );
    let silent_at = Instant::now();
    // the scenario: the change comes 5 s into the silence
    tokio::time::sleep(Duration::from_secs(5)).await;
    change(&scene, "v2").await;
    let changed_at = Instant::now();

    k.relay
        .wait_until("kruised open a new connection", ACT_LIMIT, |r| {
            r.forwarded > before.forwarded
        })
        .await;
    let noticed = silent_at.elapsed();
    k.daemon.wait_for_log("stopping container", ACT_LIMIT).await;
    let acted = changed_at.elapsed();
    eprintln!(
        "real API server, silent connection: noticed (new connection) {:.1}s after the \
         silence; the change acted on {:.1}s after it was made",
        noticed.as_secs_f64(),
        acted.as_secs_f64()
    );
    let after = restarted(&scene, "main", &old).await;
    assert_restarts(&lab, &after, "main", 1, "v2").await;
    assert_eq!(stops_logged(&k.daemon), 1, "one stop for one change");

    k.daemon.terminate();
    assert!(k.daemon.wait_exit(READY).await.success());
    support::cluster::assert_never_forbidden(&k.daemon);
    scene.cleanup().await;
}

#[tokio::test]
async fn changes_made_while_the_real_api_server_was_out_of_reach_for_five_minutes_are_acted_on_once_after_it()
 {
    let Some(lab) = KubeLab::get() else { return };
    let _serial = KubeLab::serial().await;
    let scene = Scene::new(&lab, "outage").await;
    let mut k = start(&lab, &scene).await;
    let old = pod_out_of_service(&scene, &lab).await;

    // a failover: the connections carried go silent, new ones are refused for five minutes
    k.relay.refuse_new(true);
    assert_eq!(
        k.relay.silence_open(),
        1,
        "kruised's connection went silent"
    );
    let away_at = Instant::now();
    // two changes during it (through the test's own connection): one stop, for the last value
    change(&scene, "v2").await;
    tokio::time::sleep_until(away_at + OUTAGE / 2).await;
    change(&scene, "v3").await;
    tokio::time::sleep_until(away_at + OUTAGE).await;
    let during = k.relay.stats();
    assert_eq!(stops_logged(&k.daemon), 0, "nothing acted on while away");
    assert!(k.daemon.running(), "kruised survived the outage");

    k.relay.refuse_new(false);
    let back_at = Instant::now();
    k.daemon.wait_for_log("stopping container", ACT_LIMIT).await;
    let acted = back_at.elapsed();
    eprintln!(
        "real API server, 5 minutes out of reach: {} connection attempts refused during it; the \
         changes acted on {:.1}s after it was reachable again; a 410 Gone seen: {}",
        during.refused,
        acted.as_secs_f64(),
        k.daemon.log_text().contains("410"),
    );
    assert!(
        during.refused < 200,
        "backoff, not a storm: {} attempts in 5 minutes",
        during.refused
    );
    let after = restarted(&scene, "main", &old).await;
    assert_restarts(&lab, &after, "main", 1, "v3").await;
    assert_eq!(stops_logged(&k.daemon), 1, "one stop for both changes");

    k.daemon.terminate();
    assert!(k.daemon.wait_exit(READY).await.success());
    support::cluster::assert_never_forbidden(&k.daemon);
    scene.cleanup().await;
}
