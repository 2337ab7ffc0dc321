//! The control API, discovery, kubeconfig and the binary (rules 8 and 9).

use std::time::{Duration, Instant};

use apiserver_double::Fault;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::common::*;

#[tokio::test]
async fn control_writes_bump_the_resource_version_and_reach_watchers() {
    let (s, c) = start().await;
    let before = s.resource_version();
    let mut w = c
        .watch(&format!("{PODS}?watch=true&resourceVersion={before}"))
        .await;
    let mut p = pod("a", "n1", json!({}));
    p["status"] = json!({"phase": "Running"});
    let created = s.create("pods", p).unwrap();
    assert_eq!(
        created["status"]["phase"], "Running",
        "control create keeps status"
    );
    assert!(rv(&created) > before);
    assert_eq!(
        ev(&w.next("control create").await),
        ("ADDED".into(), "a".into())
    );
    s.merge_patch(
        "pods",
        "default",
        "a",
        &json!({"status": {"podIP": "10.0.0.1"}}),
    )
    .unwrap();
    let m = w.next("control patch").await;
    assert_eq!(m["object"]["status"]["podIP"], "10.0.0.1");
    s.modify("pods", "default", "a", |p| {
        p["metadata"]["finalizers"] = json!(["f"])
    })
    .unwrap();
    w.next("control modify").await;
    s.delete("pods", "default", "a").unwrap();
    assert!(w.next("deletion mark").await["object"]["metadata"]["deletionTimestamp"].is_string());
    s.force_delete("pods", "default", "a").unwrap();
    assert_eq!(
        ev(&w.next("force delete").await),
        ("DELETED".into(), "a".into())
    );
    assert!(s.get("pods", "default", "a").is_none());
}

#[tokio::test]
async fn drop_watches_aborts_open_streams_like_a_network_drop() {
    let (s, c) = start().await;
    let mut w1 = c.watch(&format!("{PODS}?watch=true")).await;
    let mut w2 = c.watch(&format!("{NODEIMAGES}?watch=true")).await;
    assert_eq!(s.open_watches(), 2);
    s.drop_watches();
    assert_eq!(w1.until_end("drop").await.1, End::Aborted);
    assert_eq!(w2.until_end("drop").await.1, End::Aborted);
    bounded("watch count to reach zero", async {
        while s.open_watches() > 0 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    let mut w3 = c.watch(&format!("{PODS}?watch=true")).await;
    s.create("pods", pod("a", "n1", json!({}))).unwrap();
    assert_eq!(
        ev(&w3.next("new watch after a drop").await),
        ("ADDED".into(), "a".into())
    );
}

#[tokio::test]
async fn fail_next_answers_matching_requests_with_the_injected_status() {
    let (s, c) = start().await;
    c.post(PODS, &pod("a", "n1", json!({}))).await;
    s.fail_next(2, 500, Some("get"), Some("pods"));
    s.fail_next(1, 429, Some("patch"), Some("pods/status"));
    assert_eq!(c.get(PODS).await.status, 200, "list is not get");
    let r = c.get(&format!("{PODS}/a")).await;
    assert_eq!(r.status, 500);
    assert_eq!(r.body["reason"], "InternalError");
    assert_eq!(c.get(&format!("{PODS}/a")).await.status, 500);
    assert_eq!(
        c.get(&format!("{PODS}/a")).await.status,
        200,
        "only n failures"
    );
    assert_eq!(
        c.patch(
            &format!("{PODS}/a"),
            "application/merge-patch+json",
            &json!({})
        )
        .await
        .status,
        200
    );
    let r = c
        .patch(
            &format!("{PODS}/a/status"),
            "application/merge-patch+json",
            &json!({}),
        )
        .await;
    assert_eq!(r.status, 429);
    assert_eq!(
        r.headers.get("retry-after").and_then(|v| v.to_str().ok()),
        Some("1")
    );
    assert_eq!(r.body["details"]["retryAfterSeconds"], 1);
    s.add_fault(Fault {
        count: 1,
        code: 409,
        ..Fault::default()
    });
    assert_eq!(
        c.get(NODEIMAGES).await.status,
        409,
        "unfiltered faults match anything"
    );
}

#[tokio::test]
async fn set_delay_delays_every_response() {
    let (s, c) = start().await;
    s.set_delay(Duration::from_millis(300));
    let t0 = Instant::now();
    assert_eq!(c.get(PODS).await.status, 200);
    assert!(t0.elapsed() >= Duration::from_millis(300));
    s.set_delay(Duration::ZERO);
}

#[tokio::test]
async fn a_held_request_waits_unserved_in_the_log_until_released_and_others_go_on() {
    let (s, c) = start().await;
    c.post(PODS, &pod("a", "n1", json!({}))).await;
    let hold = s.hold_requests("patch", "pods/status", "held");
    let path = format!("{PODS}/a/status");
    let held = tokio::spawn(async move {
        c.patch(
            &path,
            "application/merge-patch+json",
            &json!({"status": {"message": "held"}}),
        )
        .await
    });
    bounded(
        "the held patch in the request log",
        s.wait_for_requests(T, |log| log.count("patch", "pods/status") == 1),
    )
    .await
    .unwrap();
    let other = c
        .patch(
            &format!("{PODS}/a/status"),
            "application/merge-patch+json",
            &json!({"status": {"reason": "other"}}),
        )
        .await;
    assert_eq!(
        other.status, 200,
        "a request the hold does not match goes on"
    );
    assert!(
        s.get("pods", "default", "a").unwrap()["status"]
            .get("message")
            .is_none(),
        "the held write has not happened"
    );
    assert!(!held.is_finished(), "the held request has no answer yet");
    hold.release();
    let r = bounded("the released patch's answer", held).await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(
        s.get("pods", "default", "a").unwrap()["status"]["message"],
        "held"
    );
}

#[tokio::test]
async fn held_watch_events_come_after_release_in_order_while_reads_see_the_writes() {
    let (s, c) = start().await;
    let from = s.resource_version();
    let mut w = c
        .watch(&format!(
            "{PODS}?watch=true&allowWatchBookmarks=true&resourceVersion={from}"
        ))
        .await;
    s.create("pods", pod("before", "n1", json!({}))).unwrap();
    assert_eq!(
        ev(&w.next("the write before the hold").await),
        ("ADDED".into(), "before".into())
    );
    let hold = s.hold_watch_events("pods").unwrap();
    let other_write = rv(&s.create("nodeimages", node_image("n1")).unwrap());
    let a = s.create("pods", pod("a", "n1", json!({}))).unwrap();
    s.create("pods", pod("b", "n1", json!({}))).unwrap();
    assert_eq!(c.get(PODS).await.body["items"].as_array().unwrap().len(), 3);
    // the watch goes on (its next bookmark, every 200 ms here) up to the held event, not past it
    let progress = w.next("a bookmark while the events are held").await;
    assert_eq!(progress["type"], "BOOKMARK", "not a held event: {progress}");
    assert_eq!(rv(&progress["object"]), other_write);
    assert!(other_write < rv(&a));
    let mut other = c
        .watch(&format!("{NODEIMAGES}?watch=true&resourceVersion={from}"))
        .await;
    assert_eq!(
        ev(&other.next("another resource's event").await),
        ("ADDED".into(), "n1".into()),
        "only the held resource's events wait"
    );
    hold.release();
    assert_eq!(
        ev(&w.next_non_bookmark("the first held event").await),
        ("ADDED".into(), "a".into())
    );
    assert_eq!(
        ev(&w.next_non_bookmark("the second held event").await),
        ("ADDED".into(), "b".into())
    );
}

#[tokio::test]
async fn request_counts_track_verb_and_resource_and_can_be_reset() {
    let (s, c) = start().await;
    c.post(PODS, &pod("a", "n1", json!({}))).await;
    c.get(PODS).await;
    c.get(&format!("{PODS}/a")).await;
    c.patch(
        &format!("{PODS}/a/status"),
        "application/merge-patch+json",
        &json!({}),
    )
    .await;
    c.patch(
        &format!("{PODS}/a/status"),
        "application/merge-patch+json",
        &json!({}),
    )
    .await;
    let mut w = c
        .watch(&format!("{PODS}?watch=true&timeoutSeconds=1"))
        .await;
    w.until_end("short watch").await;
    c.delete(&format!("{PODS}/a")).await;
    c.get("/version").await;
    assert_eq!(s.request_count("create", "pods"), 1);
    assert_eq!(s.request_count("list", "pods"), 1);
    assert_eq!(s.request_count("get", "pods"), 1);
    assert_eq!(s.request_count("patch", "pods/status"), 2);
    assert_eq!(s.request_count("watch", "pods"), 1);
    assert_eq!(s.request_count("delete", "pods"), 1);
    assert_eq!(
        s.request_counts().values().sum::<usize>(),
        7,
        "non-resource paths are not counted"
    );
    s.reset_requests();
    assert_eq!(s.request_count("create", "pods"), 0);
    assert!(s.requests().is_empty());
}

#[tokio::test]
async fn request_log_records_method_path_query_content_type_and_body() {
    let (s, c) = start().await;
    c.post(PODS, &pod("a", "n1", json!({}))).await;
    c.patch(
        &format!("{PODS}/a?fieldManager=kruised"),
        "application/merge-patch+json",
        &json!({"metadata": {"labels": {"x": "y"}}}),
    )
    .await;
    let log = s.requests();
    let last = log.last().unwrap();
    assert_eq!(last.method, "PATCH");
    assert_eq!(last.path, "/api/v1/namespaces/default/pods/a");
    assert_eq!(last.query, "fieldManager=kruised");
    assert_eq!(
        last.content_type.as_deref(),
        Some("application/merge-patch+json")
    );
    assert_eq!(last.json(), json!({"metadata": {"labels": {"x": "y"}}}));
    assert_eq!(
        (last.verb.as_str(), last.resource.as_str()),
        ("patch", "pods")
    );
    assert_eq!(last.namespace.as_deref(), Some("default"));
    assert_eq!(last.name.as_deref(), Some("a"));
}

#[tokio::test]
async fn wait_for_returns_once_the_condition_holds_and_times_out_otherwise() {
    let (s, c) = start().await;
    let waiter = {
        let s = s.control();
        tokio::spawn(async move {
            s.wait_for_value(T, |v| {
                v.get("pods", "default", "a")
                    .map(|p| p["metadata"]["uid"].clone())
            })
            .await
        })
    };
    c.post(PODS, &pod("a", "n1", json!({}))).await;
    let uid = bounded("wait_for_value task", waiter)
        .await
        .unwrap()
        .expect("condition met");
    assert!(uid.is_string());
    let miss = s
        .wait_for(Duration::from_millis(100), |v| {
            v.list("pods", None).len() > 5
        })
        .await;
    assert!(miss.is_err());
    let reqs = s.control();
    let seen = tokio::spawn(async move {
        reqs.wait_for_requests(T, |log| log.count("get", "pods") > 0)
            .await
    });
    c.get(&format!("{PODS}/a")).await;
    bounded("wait_for_requests task", seen)
        .await
        .unwrap()
        .expect("request seen");
}

#[tokio::test]
async fn double_http_endpoints_mirror_the_control_api() {
    let (s, c) = start().await;
    let r = c
        .post("/_double/objects/pods", &pod("a", "n1", json!({})))
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let r = c
        .patch(
            "/_double/objects/pods/a?namespace=default",
            "application/json",
            &json!({"status": {"phase": "Running"}}),
        )
        .await;
    assert_eq!(r.body["status"]["phase"], "Running");
    assert_eq!(
        c.get("/_double/objects/pods/a?namespace=default")
            .await
            .body["status"]["phase"],
        "Running"
    );
    assert_eq!(
        c.get("/_double/objects/pods").await.body["items"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    c.post(
        "/_double/fail-next",
        &json!({"count": 1, "code": 503, "verb": "list", "resource": "pods"}),
    )
    .await;
    assert_eq!(c.get(PODS).await.status, 503);
    let counts = c.get("/_double/counts").await.body;
    assert!(
        counts["counts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e == &json!({"verb": "list", "resource": "pods", "count": 1}))
    );
    let reqs = c.get("/_double/requests").await.body;
    assert_eq!(reqs["requests"][0]["verb"], "list");
    c.delete("/_double/counts").await;
    assert_eq!(s.request_count("list", "pods"), 0);
    let rv_before = c.get("/_double/resource-version").await.body["resourceVersion"]
        .as_u64()
        .unwrap();
    let compacted = c.post("/_double/compact", &json!({})).await.body;
    assert_eq!(compacted["compacted"], rv_before);
    let _w = c.watch(&format!("{PODS}?watch=true")).await;
    assert_eq!(c.get("/_double/watches").await.body["open"], 1);
    assert_eq!(
        c.post("/_double/drop-watches", &json!({})).await.body["dropped"],
        1
    );
    assert_eq!(
        c.put("/_double/delay", &json!({"millis": 0})).await.status,
        200
    );
    assert_eq!(
        c.delete("/_double/objects/pods/a?namespace=default")
            .await
            .status,
        200
    );
    assert!(s.get("pods", "default", "a").is_none());
}

#[tokio::test]
async fn discovery_lists_resources_with_status_subresources_and_version() {
    let (_s, c) = start().await;
    let v = c.get("/version").await.body;
    assert_eq!(v["gitVersion"], "v1.36.2");
    assert_eq!(
        (v["major"].as_str(), v["minor"].as_str()),
        (Some("1"), Some("36"))
    );
    assert_eq!(c.get("/api").await.body["versions"], json!(["v1"]));
    let core = c.get("/api/v1").await.body;
    let res = core["resources"].as_array().unwrap();
    let pods = res.iter().find(|r| r["name"] == "pods").unwrap();
    assert_eq!(
        (pods["namespaced"].as_bool(), pods["kind"].as_str()),
        (Some(true), Some("Pod"))
    );
    assert!(pods["verbs"].as_array().unwrap().contains(&json!("watch")));
    assert!(res.iter().any(|r| r["name"] == "pods/status"));
    assert!(
        res.iter()
            .any(|r| r["name"] == "nodes" && r["namespaced"] == false)
    );
    let groups = c.get("/apis").await.body;
    assert!(
        groups["groups"]
            .as_array()
            .unwrap()
            .iter()
            .any(|g| g["name"] == "apps.kruise.io")
    );
    let kruise = c.get("/apis/apps.kruise.io/v1alpha1").await.body;
    let names: Vec<&str> = kruise["resources"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["name"].as_str())
        .collect();
    for n in [
        "nodeimages",
        "nodeimages/status",
        "containerrecreaterequests",
        "containerrecreaterequests/status",
        "nodepodprobes",
        "nodepodprobes/status",
    ] {
        assert!(names.contains(&n), "{n} missing from {names:?}");
    }
    assert_eq!(c.get("/apis/nope.io/v1").await.status, 404);
}

#[tokio::test]
async fn kubeconfig_points_at_the_server_with_a_token_and_current_context() {
    let (s, _c) = start().await;
    let dir = std::env::temp_dir().join(format!("apiserver-double-kc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("kubeconfig");
    s.write_kubeconfig(&path).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains(&format!("server: {}", s.url())));
    assert!(s.url().starts_with("http://127.0.0.1:"));
    assert!(text.contains("current-context: apiserver-double"));
    assert!(text.contains("token: "));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn shutdown_stops_accepting_connections() {
    let (s, _c) = start().await;
    let addr = s.addr();
    bounded("shutdown", s.shutdown()).await;
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}

#[tokio::test]
async fn the_binary_prints_its_url_writes_files_and_stops_on_sigterm() {
    let dir = std::env::temp_dir().join(format!("apiserver-double-bin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kc = dir.join("kubeconfig");
    let ready = dir.join("ready");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_apiserver-double"))
        .args(["--listen", "127.0.0.1:0", "--kubeconfig"])
        .arg(&kc)
        .arg("--ready-file")
        .arg(&ready)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let url = bounded("the binary to print its URL", lines.next_line())
        .await
        .unwrap()
        .unwrap();
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    assert!(std::fs::read_to_string(&kc).unwrap().contains(&url));
    let port: u16 = url.rsplit(':').next().unwrap().parse().unwrap();
    let c = Client {
        addr: ([127, 0, 0, 1], port).into(),
        token: None,
    };
    assert_eq!(c.get("/version").await.status, 200);
    bounded("the ready file", async {
        while !ready.exists() {
            tokio::task::yield_now().await;
        }
    })
    .await;
    let pid = child.id().unwrap().to_string();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = bounded("the binary to exit on SIGTERM", child.wait())
        .await
        .unwrap();
    assert!(exit.success(), "{exit:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}
