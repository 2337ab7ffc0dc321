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

#[tokio::test]
async fn watch_sends_periodic_bookmarks_and_one_before_a_clean_timeout() {
    let (s, c) = start().await;
    let mut w = c
        .watch(&format!(
            "{PODS}?watch=true&resourceVersion={}&allowWatchBookmarks=true&timeoutSeconds=1",
            s.resource_version()
        ))
        .await;
    let b = w.next("periodic bookmark").await;
    assert_eq!(b["type"], "BOOKMARK");
    assert_eq!(b["object"]["kind"], "Pod");
    assert_eq!(b["object"]["apiVersion"], "v1");
    assert_eq!(
        b["object"]["metadata"]["resourceVersion"],
        s.resource_version().to_string()
    );
    let (rest, end) = w.until_end("timeout").await;
    assert_eq!(end, End::Clean, "timeoutSeconds closes the stream cleanly");
    assert_eq!(
        rest.last().map(|e| e["type"].clone()),
        Some(json!("BOOKMARK")),
        "a bookmark right before closing"
    );
    let mut quiet = c
        .watch(&format!(
            "{PODS}?watch=true&resourceVersion={}&timeoutSeconds=1",
            s.resource_version()
        ))
        .await;
    let (events, end) = quiet.until_end("timeout without bookmarks").await;
    assert!(events.is_empty(), "no bookmarks unless allowed: {events:?}");
    assert_eq!(end, End::Clean);
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
    let mut bookmark = None;
    while bookmark.is_none() {
        let e = w.next("a bookmark after the create").await;
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
async fn watch_with_a_resource_version_from_the_future_answers_504() {
    let (s, c) = start().await;
    let w = c
        .watch(&format!(
            "{PODS}?watch=true&resourceVersion={}",
            s.resource_version() + 100
        ))
        .await;
    assert_eq!(w.status, 504);
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
