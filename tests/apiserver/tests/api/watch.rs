//! WATCH semantics and paging (rule 3).

use apiserver_double::Config;
use serde_json::json;

use crate::common::*;

#[tokio::test]
async fn watch_without_resource_version_sends_current_objects_as_added_first() {
    let (_s, c) = start().await;
    c.post(PODS, &pod("a", "n1", json!({}))).await;
    c.post(PODS, &pod("b", "n1", json!({}))).await;
    for q in ["watch=true", "watch=1&resourceVersion=0"] {
        let mut w = c.watch(&format!("{PODS}?{q}")).await;
        assert_eq!(w.status, 200);
        assert_eq!(ev(&w.next("initial a").await), ("ADDED".into(), "a".into()));
        assert_eq!(ev(&w.next("initial b").await), ("ADDED".into(), "b".into()));
        c.delete(&format!("{PODS}/a")).await;
        assert_eq!(
            ev(&w.next("live delete").await),
            ("DELETED".into(), "a".into())
        );
        c.post(PODS, &pod("a", "n1", json!({}))).await;
    }
}

#[tokio::test]
async fn watch_from_resource_version_replays_later_events_then_live_ones() {
    let (_s, c) = start().await;
    let a = c.post(PODS, &pod("a", "n1", json!({}))).await.body;
    c.post(PODS, &pod("b", "n1", json!({}))).await;
    c.patch(
        &format!("{PODS}/a"),
        "application/merge-patch+json",
        &json!({"metadata": {"labels": {"x": "1"}}}),
    )
    .await;
    let mut w = c
        .watch(&format!("{PODS}?watch=true&resourceVersion={}", rv(&a)))
        .await;
    assert_eq!(
        ev(&w.next("replayed b").await),
        ("ADDED".into(), "b".into())
    );
    let m = w.next("replayed modify").await;
    assert_eq!(ev(&m), ("MODIFIED".into(), "a".into()));
    assert_eq!(m["object"]["metadata"]["labels"]["x"], "1");
    c.post(PODS, &pod("c", "n1", json!({}))).await;
    let live = w.next("live add").await;
    assert_eq!(ev(&live), ("ADDED".into(), "c".into()));
    assert!(rv(&live["object"]) > rv(&m["object"]));
}

#[tokio::test]
async fn watch_sends_deleted_when_object_stops_matching_selector() {
    let (_s, c) = start().await;
    let a = c
        .post(PODS, &pod("a", "n1", json!({"app": "web"})))
        .await
        .body;
    let mut w = c
        .watch(&format!(
            "{PODS}?watch=true&resourceVersion={}&labelSelector=app%3Dweb",
            rv(&a)
        ))
        .await;
    let changed = c
        .patch(
            &format!("{PODS}/a"),
            "application/merge-patch+json",
            &json!({"metadata": {"labels": {"app": "db"}}}),
        )
        .await
        .body;
    let gone = w.next("DELETED on leaving the selector").await;
    assert_eq!(ev(&gone), ("DELETED".into(), "a".into()));
    assert_eq!(
        gone["object"]["metadata"]["labels"]["app"], "web",
        "the last matching state is sent"
    );
    assert_eq!(
        rv(&gone["object"]),
        rv(&changed),
        "stamped with the RV of the change"
    );
    c.patch(
        &format!("{PODS}/a"),
        "application/merge-patch+json",
        &json!({"metadata": {"labels": {"app": "web"}}}),
    )
    .await;
    assert_eq!(
        ev(&w.next("ADDED on entering the selector").await),
        ("ADDED".into(), "a".into())
    );
}

/// A write to another kind: moves the global resourceVersion without a pod event.
async fn bump(c: &Client, name: &str) {
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}});
    assert_eq!(
        c.post("/api/v1/namespaces/default/secrets", &secret)
            .await
            .status,
        201
    );
}

#[tokio::test]
async fn periodic_bookmarks_are_sent_only_when_the_resource_version_moved() {
    let (s, c) = start().await;
    let from = s.resource_version();
    let mut w = c
        .watch(&format!(
            "{PODS}?watch=true&resourceVersion={from}&allowWatchBookmarks=true&timeoutSeconds=2"
        ))
        .await;
    let quiet = tokio::time::timeout(std::time::Duration::from_millis(700), w.next_raw()).await;
    assert!(
        quiet.is_err(),
        "no bookmark while nothing changed (the real server repeats none): {quiet:?}"
    );
    bump(&c, "s1").await;
    let b = w.next("bookmark after a write elsewhere").await;
    assert_eq!(b["type"], "BOOKMARK");
    assert_eq!(
        b["object"]["metadata"]["resourceVersion"],
        s.resource_version().to_string()
    );
    assert_eq!(
        b["object"],
        json!({"kind": "Pod", "apiVersion": "v1",
            "metadata": {"resourceVersion": s.resource_version().to_string()},
            "spec": {"containers": null}, "status": {}}),
        "a pod bookmark is an empty Pod as the real server serializes it"
    );
    let mut quiet = c
        .watch(&format!(
            "{PODS}?watch=true&resourceVersion={from}&timeoutSeconds=1"
        ))
        .await;
    bump(&c, "s2").await;
    let (events, end) = quiet.until_end("timeout without bookmarks").await;
    assert!(events.is_empty(), "no bookmarks unless allowed: {events:?}");
    assert_eq!(end, End::Clean);
}

#[tokio::test]
async fn the_last_bookmark_comes_two_seconds_before_the_timeout_and_the_stream_ends_without_one() {
    let (s, c) = start_with(Config {
        bookmark_interval: std::time::Duration::from_secs(60),
        ..Config::default()
    })
    .await;
    let started = std::time::Instant::now();
    let mut w = c
        .watch(&format!(
            "{PODS}?watch=true&resourceVersion={}&allowWatchBookmarks=true&timeoutSeconds=3",
            s.resource_version()
        ))
        .await;
    bump(&c, "s1").await;
    let b = w.next("pre-timeout bookmark").await;
    assert_eq!(b["type"], "BOOKMARK");
    let at = started.elapsed();
    assert!(
        at >= std::time::Duration::from_millis(900) && at < std::time::Duration::from_millis(2500),
        "sent about 2 s before the 3 s timeout, at {at:?}"
    );
    let (rest, end) = w.until_end("timeout").await;
    assert_eq!(end, End::Clean, "timeoutSeconds closes the stream cleanly");
    assert!(rest.is_empty(), "nothing after it: {rest:?}");
}

#[tokio::test]
async fn a_watch_timeout_scale_ends_a_watch_after_its_timeout_seconds_times_the_scale() {
    // 0.01: a watch that asked for 300 s ends after 3 s, cleanly, as at its timeout
    let (s, c) = start_with(Config {
        watch_timeout_scale: 0.01,
        ..Config::default()
    })
    .await;
    let started = std::time::Instant::now();
    let mut w = c
        .watch(&format!(
            "{PODS}?watch=true&resourceVersion={}&timeoutSeconds=300",
            s.resource_version()
        ))
        .await;
    let (events, end) = w.until_end("the scaled timeout").await;
    let took = started.elapsed();
    assert_eq!(end, End::Clean, "ended as at timeoutSeconds: {events:?}");
    assert!(
        took >= std::time::Duration::from_millis(2900) && took < std::time::Duration::from_secs(6),
        "300 s x 0.01 is 3 s, took {took:?}"
    );
}

#[tokio::test]
async fn a_watch_from_the_current_state_ends_the_initial_events_with_a_marked_bookmark() {
    let (_s, c) = start().await;
    c.post(PODS, &pod("a", "n1", json!({}))).await;
    for q in [
        "watch=true&allowWatchBookmarks=true",
        "watch=true&resourceVersion=0&allowWatchBookmarks=true",
    ] {
        let mut w = c.watch(&format!("{PODS}?{q}&timeoutSeconds=1")).await;
        assert_eq!(ev(&w.next("initial a").await), ("ADDED".into(), "a".into()));
        let b = w.next("initial-events-end bookmark").await;
        assert_eq!(b["type"], "BOOKMARK", "{q}");
        assert_eq!(
            b["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"], "true",
            "{q}: the real server marks the end of the initial events without sendInitialEvents too"
        );
    }
    let mut w = c
        .watch(&format!(
            "{PODS}?watch=true&resourceVersion=0&timeoutSeconds=1"
        ))
        .await;
    let (events, _) = w
        .until_end("no bookmarks without allowWatchBookmarks")
        .await;
    assert_eq!(events.len(), 1, "{events:?}");
}

#[tokio::test]
async fn resuming_from_a_bookmark_misses_no_event() {
    let (s, c) = start().await;
    let mut w = c
        .watch(&format!(
            "{PODS}?watch=true&resourceVersion={}&allowWatchBookmarks=true",
            s.resource_version()
        ))
        .await;
    c.post(PODS, &pod("a", "n1", json!({}))).await;
    assert_eq!(
        ev(&w.next_non_bookmark("ADDED a").await),
        ("ADDED".into(), "a".into())
    );
    bump(&c, "s1").await;
    let mut bookmark = None;
    while bookmark.is_none() {
        let e = w.next("a bookmark after the write elsewhere").await;
        if e["type"] == "BOOKMARK" {
            bookmark = Some(rv(&e["object"]));
        }
    }
    let from = bookmark.unwrap();
    c.post(PODS, &pod("b", "n1", json!({}))).await;
    let mut resumed = c
        .watch(&format!("{PODS}?watch=true&resourceVersion={from}"))
        .await;
    assert_eq!(
        ev(&resumed.next("b after resume").await),
        ("ADDED".into(), "b".into())
    );
}

#[tokio::test]
async fn watch_from_compacted_version_gets_410_expired() {
    let (s, c) = start().await;
    let a = c.post(PODS, &pod("a", "n1", json!({}))).await.body;
    let old = rv(&a);
    let compacted = s.compact();
    let mut w = c
        .watch(&format!("{PODS}?watch=true&resourceVersion={old}"))
        .await;
    assert_eq!(w.status, 200);
    let e = w.next("410 error event").await;
    assert_eq!(e["type"], "ERROR");
    assert_eq!(e["object"]["kind"], "Status");
    assert_eq!(e["object"]["code"], 410);
    assert_eq!(e["object"]["reason"], "Expired");
    assert_eq!(
        e["object"]["message"],
        format!("too old resource version: {old} ({compacted})")
    );
    assert_eq!(w.until_end("end after 410").await.1, End::Clean);
    let fresh = c.get(PODS).await.body;
    let fresh_rv: u64 = fresh["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(fresh_rv > compacted, "a relist yields a watchable RV");
    let mut w = c
        .watch(&format!("{PODS}?watch=true&resourceVersion={fresh_rv}"))
        .await;
    c.post(PODS, &pod("b", "n1", json!({}))).await;
    assert_eq!(
        ev(&w.next("event after relist").await),
        ("ADDED".into(), "b".into())
    );
}

#[tokio::test]
async fn a_watch_from_a_future_resource_version_answers_200_and_sends_what_comes_after_it() {
    let (s, c) = start().await;
    let future = s.resource_version() + 2;
    let mut w = c
        .watch(&format!(
            "{PODS}?watch=true&resourceVersion={future}&allowWatchBookmarks=true"
        ))
        .await;
    assert_eq!(w.status, 200, "no 504 for a watch, unlike a list");
    for n in ["a", "b", "c"] {
        c.post(PODS, &pod(n, "n1", json!({}))).await;
    }
    let e = w.next_non_bookmark("the first event after the RV").await;
    assert_eq!(ev(&e), ("ADDED".into(), "c".into()));
    assert!(rv(&e["object"]) > future);
    let r = c
        .get(&format!("{PODS}?resourceVersion={}", future + 100))
        .await;
    assert_eq!(r.status, 504, "a list waits, then answers 504");
    assert_eq!(r.body["reason"], "Timeout");
    assert_eq!(
        r.body["message"],
        format!(
            "Timeout: Too large resource version: {}, current: {}",
            future + 100,
            s.resource_version()
        )
    );
}

#[tokio::test]
async fn watch_with_send_initial_events_ends_initial_state_with_a_marked_bookmark() {
    let (_s, c) = start().await;
    c.post(PODS, &pod("a", "n1", json!({}))).await;
    let mut w = c
        .watch(&format!("{PODS}?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true"))
        .await;
    assert_eq!(
        ev(&w.next("initial ADDED").await),
        ("ADDED".into(), "a".into())
    );
    let b = w.next("initial-events-end bookmark").await;
    assert_eq!(b["type"], "BOOKMARK");
    assert_eq!(
        b["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
    let bad = c
        .watch(&format!("{PODS}?watch=true&sendInitialEvents=true"))
        .await;
    assert_eq!(bad.status, 422);
}

#[tokio::test]
async fn watch_list_options_are_validated_like_the_real_server() {
    let (_s, c) = start().await;
    c.post(PODS, &pod("a", "n1", json!({}))).await;
    let r = c
        .get(&format!("{PODS}?watch=true&sendInitialEvents=true"))
        .await;
    assert_eq!(r.status, 422);
    assert_eq!(
        r.body["message"],
        "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan"
    );
    assert!(r.body["details"].get("name").is_none(), "no empty name");
    let r = c
        .get(&format!(
            "{PODS}?watch=true&resourceVersion=1&resourceVersionMatch=NotOlderThan"
        ))
        .await;
    assert_eq!(r.status, 422);
    assert_eq!(
        r.body["details"]["causes"][0]["message"],
        "Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided"
    );
    let r = c
        .get(&format!(
            "{PODS}?watch=true&resourceVersion=1&resourceVersionMatch=Exact"
        ))
        .await;
    assert_eq!(
        r.body["details"]["causes"].as_array().map(Vec::len),
        Some(2),
        "{}",
        r.text
    );
    let mut w = c
        .watch(&format!(
            "{PODS}?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&timeoutSeconds=1"
        ))
        .await;
    assert_eq!(w.status, 200, "bookmarks are not required");
    let (events, end) = w.until_end("initial events only").await;
    assert_eq!(
        events.len(),
        1,
        "no bookmark without allowWatchBookmarks: {events:?}"
    );
    assert_eq!(end, End::Clean);
}

#[tokio::test]
async fn watch_of_a_single_object_path_sees_only_that_object() {
    let (s, c) = start().await;
    let mut w = c
        .watch(&format!(
            "{PODS}/b?watch=true&resourceVersion={}",
            s.resource_version()
        ))
        .await;
    c.post(PODS, &pod("a", "n1", json!({}))).await;
    c.post(PODS, &pod("b", "n1", json!({}))).await;
    assert_eq!(ev(&w.next("b only").await), ("ADDED".into(), "b".into()));
}

#[tokio::test]
async fn list_with_limit_pages_with_continue_over_a_consistent_snapshot() {
    let (_s, c) = start().await;
    for n in ["a", "b", "c", "d", "e"] {
        c.post(PODS, &pod(n, "n1", json!({}))).await;
    }
    let first = c.get(&format!("{PODS}?limit=2")).await.body;
    assert_eq!(first["items"].as_array().unwrap().len(), 2);
    assert_eq!(first["metadata"]["remainingItemCount"], 3);
    let snapshot_rv = first["metadata"]["resourceVersion"].clone();
    let token = first["metadata"]["continue"]
        .as_str()
        .expect("continue token")
        .to_string();
    c.delete(&format!("{PODS}/e")).await;
    let mut names: Vec<String> = Vec::new();
    let mut page = first;
    loop {
        for i in page["items"].as_array().unwrap() {
            names.push(i["metadata"]["name"].as_str().unwrap().to_string());
        }
        assert_eq!(
            page["metadata"]["resourceVersion"], snapshot_rv,
            "every page reports the snapshot RV"
        );
        let Some(next) = page["metadata"]["continue"].as_str().map(str::to_string) else {
            break;
        };
        page = c.get(&format!("{PODS}?limit=2&continue={next}")).await.body;
    }
    assert_eq!(
        names,
        ["a", "b", "c", "d", "e"],
        "later pages come from the snapshot"
    );
    let all = c.get(PODS).await.body;
    assert!(
        all["metadata"].get("continue").is_none(),
        "no continue without limit"
    );
    let stale = c.get(&format!("{PODS}?limit=2&continue={token}")).await;
    assert_eq!(stale.status, 200, "a token stays valid until compaction");
}

#[tokio::test]
async fn continue_token_from_before_compaction_answers_410() {
    let (s, c) = start().await;
    for n in ["a", "b", "c"] {
        c.post(PODS, &pod(n, "n1", json!({}))).await;
    }
    let first = c.get(&format!("{PODS}?limit=1")).await.body;
    let token = first["metadata"]["continue"].as_str().unwrap().to_string();
    s.compact();
    let r = c.get(&format!("{PODS}?limit=1&continue={token}")).await;
    assert_eq!(r.status, 410);
    assert_eq!(r.body["reason"], "Expired");
}

#[tokio::test]
async fn history_beyond_the_limit_is_compacted_automatically() {
    let (_s, c) = start_with(Config {
        history_limit: 3,
        ..Config::default()
    })
    .await;
    let a = c.post(PODS, &pod("a", "n1", json!({}))).await.body;
    for n in ["b", "c", "d", "e"] {
        c.post(PODS, &pod(n, "n1", json!({}))).await;
    }
    let mut w = c
        .watch(&format!("{PODS}?watch=true&resourceVersion={}", rv(&a)))
        .await;
    assert_eq!(w.next("410 after pruning").await["object"]["code"], 410);
}

#[tokio::test]
async fn list_with_resource_version_0_ignores_limit_like_the_watch_cache() {
    let (_s, c) = start().await;
    for n in ["a", "b", "c"] {
        c.post(PODS, &pod(n, "n1", json!({}))).await;
    }
    let all = c
        .get(&format!("{PODS}?limit=1&resourceVersion=0"))
        .await
        .body;
    assert_eq!(all["items"].as_array().map(Vec::len), Some(3));
    assert!(all["metadata"].get("continue").is_none());
    let page = c.get(&format!("{PODS}?limit=1")).await.body;
    assert_eq!(page["items"].as_array().map(Vec::len), Some(1));
}

#[tokio::test]
async fn list_options_are_validated_like_the_real_server() {
    let (s, c) = start().await;
    for n in ["a", "b"] {
        c.post(PODS, &pod(n, "n1", json!({}))).await;
    }
    let token = c.get(&format!("{PODS}?limit=1")).await.body["metadata"]["continue"]
        .as_str()
        .expect("continue")
        .to_string();
    let r = c
        .get(&format!(
            "{PODS}?limit=1&continue={token}&resourceVersion={}",
            s.resource_version()
        ))
        .await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.body["message"],
        "specifying resource version is not allowed when using continue"
    );
    let r = c
        .get(&format!("{PODS}?resourceVersionMatch=NotOlderThan"))
        .await;
    assert_eq!(r.status, 422);
    assert_eq!(
        r.body["message"],
        "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided"
    );
}
