//! The daemon's Kubernetes side against the API-server double, reached over HTTP by the real kube
//! client: the node's pod cache, the writers, readiness.

use crate::support;

use std::collections::BTreeSet;
use std::time::Duration;

use apiserver_double::{ApiServer, Config};
use k8s_openapi::api::core::v1::Pod;
use kruised::admin::Readiness;
use kruised::k8s::crd::NodeImage;
use kruised::k8s::pods::Pods;
use kruised::k8s::{client, watch as kwatch, write};
use kube::{Api, ResourceExt};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

const LIMIT: Duration = Duration::from_secs(20);

async fn double() -> (apiserver_double::Handle, kube::Client, tempfile::TempDir) {
    double_with(Config::default()).await
}

async fn double_with(
    config: Config,
) -> (apiserver_double::Handle, kube::Client, tempfile::TempDir) {
    let server = ApiServer::start_with(config).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let client = client::build(&client::ClientSettings {
        kubeconfig: Some(kubeconfig),
        qps: 1000.0,
        burst: 1000,
        versions: Default::default(),
    })
    .await
    .unwrap();
    (server, client, dir)
}

fn pod(name: &str, node: &str) -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": "x"},
                     "annotations": {"team": "a"}},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "busybox:v1"}]}
    })
}

/// Waits until the cached pod names equal `want`.
async fn cache_holds(pods: &kwatch::Watched<Pod>, want: &[&str], what: &str) {
    let want: BTreeSet<String> = want.iter().map(|s| s.to_string()).collect();
    let mut generation = pods.generation();
    support::within(LIMIT, what, async {
        loop {
            let have: BTreeSet<String> = pods.state().iter().map(|p| p.name_any()).collect();
            if have == want {
                return;
            }
            generation.changed().await.expect("watch task ended");
        }
    })
    .await;
}

/// A readiness, a cancellation and a task tracker for a watch under test.
fn watch_tasks() -> (Readiness, CancellationToken, TaskTracker) {
    (
        Readiness::new(),
        CancellationToken::new(),
        TaskTracker::new(),
    )
}

fn watch_pods(
    client: &kube::Client,
    node: &str,
    readiness: &Readiness,
    cancel: &CancellationToken,
    tracker: &TaskTracker,
) -> kwatch::Watched<Pod> {
    kwatch::spawn(
        kwatch::WatchSpec::new(
            "pods",
            Api::<Pod>::all(client.clone()),
            kwatch::pods_of_node(node),
            kwatch::prune_pod,
        ),
        readiness.condition("pods"),
        cancel.clone(),
        tracker,
        &kruised::health::Liveness::new(),
        std::future::ready(()),
    )
}

#[tokio::test]
async fn pod_cache_holds_exactly_the_nodes_pods_through_adds_updates_and_deletes() {
    let (server, client, _dir) = double().await;
    server.create("pods", pod("a", "n1")).unwrap();
    server.create("pods", pod("other", "n2")).unwrap();
    let (readiness, cancel, tracker) = watch_tasks();
    let pods = watch_pods(&client, "n1", &readiness, &cancel, &tracker);
    cache_holds(&pods, &["a"], "initial list").await;

    server.create("pods", pod("b", "n1")).unwrap();
    server.create("pods", pod("c", "n2")).unwrap();
    cache_holds(&pods, &["a", "b"], "add").await;

    server
        .modify("pods", "default", "b", |p| {
            p["metadata"]["labels"]["app"] = json!("y")
        })
        .unwrap();
    let mut generation = pods.generation();
    support::within(LIMIT, "update", async {
        while pods
            .state()
            .iter()
            .find(|p| p.name_any() == "b")
            .is_none_or(|p| p.labels().get("app").map(String::as_str) != Some("y"))
        {
            generation.changed().await.unwrap();
        }
    })
    .await;

    server.delete("pods", "default", "a").unwrap();
    cache_holds(&pods, &["b"], "delete").await;
    cancel.cancel();
}

#[tokio::test]
async fn pod_cache_recovers_from_a_dropped_watch_and_from_410_gone() {
    let (server, client, _dir) = double().await;
    server.create("pods", pod("a", "n1")).unwrap();
    server.create("pods", pod("b", "n1")).unwrap();
    let (readiness, cancel, tracker) = watch_tasks();
    let pods = watch_pods(&client, "n1", &readiness, &cancel, &tracker);
    cache_holds(&pods, &["a", "b"], "initial list").await;

    // a network drop: the watch resumes from its last resourceVersion
    server.drop_watches();
    server.create("pods", pod("c", "n1")).unwrap();
    cache_holds(&pods, &["a", "b", "c"], "add after a dropped watch").await;

    // history compacted while the watch was down: it gets 410 Gone, relists, and a pod deleted
    // meanwhile disappears although no DELETED event was ever sent for it
    let before = server.request_count("list", "pods");
    server.delete("pods", "default", "a").unwrap();
    server.compact();
    server.drop_watches();
    server.create("pods", pod("d", "n1")).unwrap();
    cache_holds(&pods, &["b", "c", "d"], "relist after 410").await;
    assert!(readiness.is_ready(), "a relist keeps the cache ready");
    assert!(
        server.request_count("list", "pods") > before,
        "the cache relisted rather than missing the delete"
    );
    cancel.cancel();
}

/// The `resourceVersion` each list of pods asked for, oldest first (`None`: a consistent read).
fn pod_list_versions(server: &apiserver_double::Handle) -> Vec<Option<String>> {
    server
        .requests()
        .iter()
        .filter(|r| r.verb == "list" && r.resource == "pods")
        .map(|r| {
            r.query
                .split('&')
                .find_map(|kv| kv.strip_prefix("resourceVersion="))
                .map(str::to_string)
        })
        .collect()
}

/// The query parameter `key` of each pod list kruised made, in order.
fn pod_list_params(server: &apiserver_double::Handle, key: &str) -> Vec<Option<String>> {
    let key = format!("{key}=");
    server
        .requests()
        .iter()
        .filter(|r| r.verb == "list" && r.resource == "pods")
        .map(|r| {
            r.query
                .split('&')
                .find_map(|kv| kv.strip_prefix(key.as_str()))
                .map(str::to_string)
        })
        .collect()
}

/// Issue 43, row 4: an API server restarted under a large cluster answers every node's watch
/// with 410. Before, each node's relist was a consistent read from etcd (every pod of the
/// cluster read for each node, under the 30 s call limit: cancelled and retried for ever).
/// Now, as client-go's reflector, it reads the watch cache, no older than what the watch saw.
#[tokio::test]
async fn after_410_gone_the_relist_reads_the_watch_cache_no_older_than_the_watch_had_seen() {
    let (server, client, _dir) = double().await;
    server.create("pods", pod("a", "n1")).unwrap();
    let (readiness, cancel, tracker) = watch_tasks();
    let pods = watch_pods(&client, "n1", &readiness, &cancel, &tracker);
    cache_holds(&pods, &["a"], "initial list").await;
    assert_eq!(
        pod_list_versions(&server),
        [Some("0".to_string())],
        "the first list is served from the API server's cache, as an informer's is"
    );

    // two relists after 410 Gone, each seeing a pod created just before; each watch first
    // hears a pod (it is live, past its list's version) before history is compacted
    for (round, heard, name) in [(1, "a1", "b"), (2, "b1", "c")] {
        server.create("pods", pod(heard, "n1")).unwrap();
        let mut have: Vec<&str> = ["a", "a1", "b", "b1", "c"][..2 * round].to_vec();
        cache_holds(&pods, &have, "a pod the live watch hears").await;
        let seen = pods
            .state()
            .iter()
            .filter_map(|p| p.metadata.resource_version.clone())
            .max_by_key(|v| v.parse::<u64>().unwrap_or(0))
            .expect("a version seen");
        server.compact();
        server.drop_watches();
        server.create("pods", pod(name, "n1")).unwrap();
        have.push(name);
        cache_holds(&pods, &have, "relist after 410").await;
        let versions = pod_list_versions(&server);
        assert_eq!(
            versions.len(),
            1 + round,
            "one list per relist: {versions:?}"
        );
        let relist = versions
            .last()
            .cloned()
            .flatten()
            .expect("a resourceVersion");
        let relist: u64 = relist.parse().expect("a number");
        assert!(
            relist >= seen.parse::<u64>().expect("a number") && relist > 0,
            "relist {round} asks for no older than what the watch saw ({seen}): {versions:?}"
        );
        assert_eq!(
            pod_list_params(&server, "resourceVersionMatch").last(),
            Some(&Some("NotOlderThan".to_string())),
            "relist {round} is served by the watch cache"
        );
    }
    cancel.cancel();
}

/// Where the watch cache cannot serve the relist (it answers 410), the relist reads etcd, in
/// pages of 500, so that no one call reads a large cluster's pods under its time limit.
#[tokio::test]
async fn a_relist_the_cache_refuses_reads_etcd_in_pages_of_five_hundred_and_misses_nothing() {
    let (server, client, _dir) = double().await;
    for i in 0..1_001 {
        server.create("pods", pod(&format!("p{i}"), "n1")).unwrap();
    }
    let (readiness, cancel, tracker) = watch_tasks();
    let pods = watch_pods(&client, "n1", &readiness, &cancel, &tracker);
    support::within(LIMIT, "the first list", pods.wait_synced()).await;
    assert_eq!(pods.state().len(), 1_001);

    server.create("pods", pod("heard", "n1")).unwrap();
    let mut names: Vec<String> = (0..1_001).map(|i| format!("p{i}")).collect();
    names.push("heard".into());
    let want: Vec<&str> = names.iter().map(String::as_str).collect();
    cache_holds(&pods, &want, "the live watch hears a pod").await;
    server.fail_next(1, 410, Some("list"), Some("pods"));
    server.compact();
    server.drop_watches();
    server.create("pods", pod("late", "n1")).unwrap();
    names.push("late".into());
    let want: Vec<&str> = names.iter().map(String::as_str).collect();
    cache_holds(&pods, &want, "the relist through etcd").await;
    assert_eq!(pods.state().len(), 1_003, "every pod, none twice");
    let limits = pod_list_params(&server, "limit");
    let versions = pod_list_versions(&server);
    // the first list, the relist the cache refused, then the consistent pages
    assert_eq!(limits[..2], [None, None], "{limits:?}");
    assert!(
        versions[1].is_some(),
        "the refused relist asked the cache: {versions:?}"
    );
    let pages = &limits[2..];
    assert_eq!(pages.len(), 3, "1,003 pods in pages of 500: {limits:?}");
    assert!(
        pages.iter().all(|l| l.as_deref() == Some("500")),
        "{limits:?}"
    );
    assert!(
        versions[2..].iter().all(Option::is_none),
        "the pages are a consistent read: {versions:?}"
    );
    cancel.cancel();
}

#[tokio::test]
async fn readiness_flips_to_ready_only_after_the_first_list() {
    let (server, client, _dir) = double().await;
    server.create("pods", pod("a", "n1")).unwrap();
    // the first lists fail: the watch backs off and retries, and stays not ready meanwhile
    server.fail_next(2, 500, Some("list"), Some("pods"));
    let (readiness, cancel, tracker) = watch_tasks();
    let pods = watch_pods(&client, "n1", &readiness, &cancel, &tracker);
    assert!(!readiness.is_ready(), "not ready before the first list");
    server
        .wait_for_requests(LIMIT, |log| log.count("list", "pods") >= 2)
        .await
        .unwrap();
    support::within(LIMIT, "readiness", readiness.wait_ready()).await;
    assert_eq!(
        pods.state().len(),
        1,
        "ready means the cache holds the list"
    );
    assert!(server.request_count("list", "pods") >= 3);
    cancel.cancel();
}

#[tokio::test]
async fn every_task_waiting_for_the_first_list_wakes_when_it_is_in() {
    let (server, client, _dir) = double().await;
    server.create("pods", pod("a", "n1")).unwrap();
    // the first list fails: both tasks wait before the cache is synced (kube's ready signal
    // alone woke only the last of them)
    server.fail_next(1, 500, Some("list"), Some("pods"));
    let (readiness, cancel, tracker) = watch_tasks();
    let pods = watch_pods(&client, "n1", &readiness, &cancel, &tracker);
    let waiter = |pods: kwatch::Watched<Pod>| tokio::spawn(async move { pods.wait_synced().await });
    let (first, second) = (waiter(pods.clone()), waiter(pods.clone()));
    support::within(LIMIT, "both waiting tasks woken", async {
        first.await.unwrap();
        second.await.unwrap();
    })
    .await;
    assert_eq!(
        pods.state().len(),
        1,
        "synced means the cache holds the list"
    );
    cancel.cancel();
}

/// A watch of the node's pods that renews every `timeout` (both bounds) with `margin`.
fn watch_pods_renewing(
    client: &kube::Client,
    readiness: &Readiness,
    cancel: &CancellationToken,
    tracker: &TaskTracker,
    timeout: Duration,
    margin: Duration,
) -> kwatch::Watched<Pod> {
    let spec = kwatch::WatchSpec::new(
        "pods",
        Api::<Pod>::all(client.clone()),
        kwatch::pods_of_node("n1"),
        kwatch::prune_pod,
    )
    .with_renewal(kwatch::Renewal {
        min: timeout,
        max: timeout,
        margin,
    });
    kwatch::spawn(
        spec,
        readiness.condition("pods"),
        cancel.clone(),
        tracker,
        &kruised::health::Liveness::new(),
        std::future::ready(()),
    )
}

/// `(resourceVersion, timeoutSeconds)` of each watch of pods, oldest first.
fn pod_watches(server: &apiserver_double::Handle) -> Vec<(String, String)> {
    let param = |q: &str, name: &str| {
        q.split('&')
            .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
            .unwrap_or_default()
            .to_string()
    };
    server
        .requests()
        .iter()
        .filter(|r| r.verb == "watch" && r.resource == "pods")
        .map(|r| {
            (
                param(&r.query, "resourceVersion"),
                param(&r.query, "timeoutSeconds"),
            )
        })
        .collect()
}

// kube's watcher used bookmarks too; kruised's own loop must not lose that: a renewal resumes
// from the last bookmark, so it replays nothing the server already passed (checked to fail with
// the bookmark's resourceVersion ignored)
#[tokio::test]
async fn a_renewed_watch_resumes_from_the_last_bookmark_not_from_the_list() {
    let (server, client, _dir) = double_with(Config {
        bookmark_interval: Duration::from_millis(100),
        ..Config::default()
    })
    .await;
    server.create("pods", pod("a", "n1")).unwrap();
    let (readiness, cancel, tracker) = watch_tasks();
    // each watch asks for 3 s; the server ends it then, after a bookmark every 100 ms
    let pods = watch_pods_renewing(
        &client,
        &readiness,
        &cancel,
        &tracker,
        Duration::from_secs(3),
        Duration::from_secs(5),
    );
    cache_holds(&pods, &["a"], "initial list").await;
    let listed = server.resource_version();
    // another node's pod: the resourceVersion moves, the watch sees no event, a bookmark says so
    server.create("pods", pod("elsewhere", "n2")).unwrap();
    let moved = server.resource_version();
    assert!(moved > listed);
    server
        .wait_for_requests(LIMIT, |log| log.count("watch", "pods") >= 2)
        .await
        .expect("the watch was renewed");
    let watches = pod_watches(&server);
    assert_eq!(watches[0].0, listed.to_string(), "{watches:?}");
    assert_eq!(
        watches[1].0,
        moved.to_string(),
        "the renewal starts where the bookmark said: {watches:?}"
    );
    assert_eq!(server.request_count("list", "pods"), 1, "no relist");
    cancel.cancel();
}

// the server ends every watch at its timeoutSeconds: one still open and silent past it is a
// dead connection (here: a double whose watches outlive their timeout a thousandfold). Without
// the bound the first watch never ends and no second comes.
#[tokio::test]
async fn a_watch_silent_past_its_timeout_is_dropped_unready_and_resumed_from_its_resource_version()
{
    let (server, client, _dir) = double_with(Config {
        watch_timeout_scale: 1000.0,
        ..Config::default()
    })
    .await;
    server.create("pods", pod("a", "n1")).unwrap();
    let (readiness, cancel, tracker) = watch_tasks();
    let pods = watch_pods_renewing(
        &client,
        &readiness,
        &cancel,
        &tracker,
        Duration::from_secs(2),
        Duration::from_secs(2),
    );
    support::within(LIMIT, "ready", readiness.wait_ready()).await;
    assert_eq!(pods.state().len(), 1);
    let listed = server.resource_version();
    // the next watch of pods is answered only when the test says: meanwhile the old one is
    // known dead and no new one accepted
    let held = server.hold_requests("watch", "pods", "");
    server
        .wait_for_requests(LIMIT, |log| log.count("watch", "pods") >= 2)
        .await
        .expect("the silent watch was dropped and watched again");
    let report = readiness.report();
    assert!(!readiness.is_ready(), "{report:?}");
    assert!(
        report[0].detail.starts_with("not live since ")
            && report[0].detail.contains("timeoutSeconds=2")
            && report[0].detail.contains("dead connection"),
        "{report:?}"
    );
    let watches = pod_watches(&server);
    assert_eq!(
        watches[1],
        (listed.to_string(), "2".to_string()),
        "resumed from its resourceVersion: {watches:?}"
    );
    assert_eq!(server.request_count("list", "pods"), 1, "no relist");
    held.release();
    support::within(
        LIMIT,
        "ready again once the watch is accepted",
        readiness.wait_ready(),
    )
    .await;
    cancel.cancel();
}

// 410 Gone relists at once, as the history was compacted; but from the resourceVersion a list
// just gave it cannot be that: a failure, backed off, or a server answering 410 to every watch
// would be asked list after watch in a tight loop (checked to fail with every 410 a relist)
#[tokio::test]
async fn a_410_on_the_first_watch_after_a_list_is_a_failure_backed_off_not_a_relist_loop() {
    let (server, client, _dir) = double().await;
    server.create("pods", pod("a", "n1")).unwrap();
    server.fail_next(1_000_000, 410, Some("watch"), Some("pods"));
    let (readiness, cancel, tracker) = watch_tasks();
    let pods = watch_pods(&client, "n1", &readiness, &cancel, &tracker);
    server
        .wait_for_requests(LIMIT, |log| log.count("list", "pods") >= 2)
        .await
        .expect("listed again after the 410");
    let report = readiness.report();
    assert!(
        report[0]
            .detail
            .contains("410 Gone from the resourceVersion a list just gave"),
        "{report:?}"
    );
    server.clear_faults();
    support::within(
        LIMIT,
        "ready once a watch is accepted",
        readiness.wait_ready(),
    )
    .await;
    assert_eq!(pods.state().len(), 1);
    // 0.8 s, then 1.6 s apart at least 0.64 s each: a loop would have asked hundreds of times
    assert!(
        server.request_count("list", "pods") <= 4,
        "{:?}",
        server.request_counts()
    );
    cancel.cancel();
}

#[tokio::test]
async fn annotation_patch_never_touches_anyone_elses_annotations_or_labels() {
    let (server, client, _dir) = double().await;
    server.create("pods", pod("p", "n1")).unwrap();
    let pods = Pods::namespaced(client, "default");
    let key = "apps.kruise.io/runtime-containers-meta";

    // another writer changes the pod's annotations and labels while we patch ours, many times
    let other = server.control();
    let writer = tokio::task::spawn_blocking(move || {
        for i in 0..50 {
            other
                .modify("pods", "default", "p", |p| {
                    p["metadata"]["annotations"][format!("other-{i}")] = json!(i.to_string());
                    p["metadata"]["labels"]["rev"] = json!(i.to_string());
                })
                .unwrap();
        }
    });
    for i in 0..50 {
        write::patch_pod_annotation(&pods, "p", key, Some(&format!("{{\"n\":{i}}}")))
            .await
            .unwrap();
    }
    writer.await.unwrap();

    let p = server.get("pods", "default", "p").unwrap();
    let annotations = p["metadata"]["annotations"].as_object().unwrap();
    assert_eq!(annotations[key], json!("{\"n\":49}"));
    assert_eq!(
        annotations["team"],
        json!("a"),
        "a pre-existing annotation survives"
    );
    for i in 0..50 {
        assert_eq!(
            annotations[&format!("other-{i}")],
            json!(i.to_string()),
            "other-{i} lost"
        );
    }
    assert_eq!(p["metadata"]["labels"]["rev"], json!("49"));
    assert_eq!(p["metadata"]["labels"]["app"], json!("x"));

    // on the wire: a strategic-merge patch of pods/status carrying our annotation only
    let patches: Vec<_> = server
        .requests()
        .into_iter()
        .filter(|r| r.verb == "patch")
        .collect();
    assert_eq!(patches.len(), 50);
    for r in &patches {
        assert_eq!(r.resource, "pods/status");
        let ctype = r.content_type.as_deref().unwrap_or_default();
        assert!(ctype.contains("strategic-merge-patch"), "{ctype}");
        let body = r.json();
        assert_eq!(
            body["metadata"]["annotations"].as_object().unwrap().len(),
            1
        );
        assert_eq!(
            body.as_object().unwrap().len(),
            1,
            "nothing but metadata: {body}"
        );
    }

    // and None removes ours, still leaving everyone else's
    write::patch_pod_annotation(&pods, "p", key, None)
        .await
        .unwrap();
    let p = server.get("pods", "default", "p").unwrap();
    assert!(p["metadata"]["annotations"].get(key).is_none());
    assert_eq!(p["metadata"]["annotations"]["team"], json!("a"));
}

fn node_image(name: &str) -> serde_json::Value {
    json!({
        "apiVersion": "apps.kruise.io/v1alpha1", "kind": "NodeImage",
        "metadata": {"name": name},
        "spec": {"images": {"busybox": {"tags": [{"tag": "v1", "version": 1}]}}},
        "status": {"desired": 1, "succeeded": 0, "failed": 0, "pulling": 0,
                   "firstSyncStatus": {"status": "Succeeded", "message": "manager's"}}
    })
}

#[tokio::test]
async fn status_merge_patch_carries_only_our_fields() {
    let (server, client, _dir) = double().await;
    server.create("nodeimages", node_image("n1")).unwrap();
    let api: Api<NodeImage> = Api::all(client);
    write::patch_status(&api, "n1", &json!({"succeeded": 1, "pulling": 0}))
        .await
        .unwrap();
    let stored = server.get("nodeimages", "", "n1").unwrap();
    assert_eq!(stored["status"]["succeeded"], json!(1));
    assert_eq!(
        stored["status"]["firstSyncStatus"]["message"],
        json!("manager's")
    );
    assert_eq!(
        stored["spec"]["images"]["busybox"]["tags"][0]["tag"],
        json!("v1")
    );
    let r = server
        .requests()
        .into_iter()
        .find(|r| r.verb == "patch")
        .unwrap();
    assert_eq!(r.resource, "nodeimages/status");
    let ctype = r.content_type.as_deref().unwrap_or_default();
    assert_eq!(ctype, "application/merge-patch+json");
}

#[tokio::test]
async fn requests_carry_kruiseds_user_agent() {
    let (server, client, _dir) = double().await;
    server.create("pods", pod("a", "n1")).unwrap();
    let api: Api<Pod> = Api::namespaced(client, "default");
    api.get("a").await.unwrap();
    let r = server
        .requests()
        .into_iter()
        .find(|r| r.verb == "get")
        .unwrap();
    assert_eq!(
        r.user_agent.as_deref(),
        Some(concat!("kruised/", env!("CARGO_PKG_VERSION")))
    );
}
