//! ImagePullJobs as kruise-manager 07169cf runs them
//! (`pkg/controller/imagepulljob/imagepulljob_controller.go`, `imagepulljob_utils.go`,
//! `pkg/util/imagejob/imagejob_reader.go`): the job's defaults (its mutating webhook), its
//! finalizer, its pull secrets copied into `kruise-daemon-config`, one tag per selected
//! NodeImage, and the job's status counted from the NodeImages' status.

use std::collections::BTreeSet;

use apiserver_double::{Control, Operation};
use serde_json::{Value, json};

use super::nodeimage::default_pull_policy;
use super::{
    DAEMON_CONFIG_NS, Inner, Res, Wake, array_mut, deleting, jitter, name_of, now, ns_of,
    pod_active, rfc3339, secs, since, time_of, uid_of, version,
};

/// The finalizer the controller adds (`:763-774`).
const FINALIZER: &str = "apps.kruise.io/deletion-protection";
const REFERENCES: &str = "imagepulljobs.kruise.io/references";
const SOURCE_KEY: &str = "imagepulljobs.kruise.io/source-key";
const MODE: &str = "imagepulljobs.kruise.io/mode";

pub(crate) fn register_webhook(control: &Control) {
    // apis/apps/defaults/v1beta1.go:220-236, registered as mimagepulljob-v1beta1.kb.io
    control.add_mutating_admission(
        "mimagepulljob-v1beta1.kb.io",
        "apps.kruise.io",
        "imagepulljobs",
        &[Operation::Create, Operation::Update],
        |r| {
            let spec = &mut r.object["spec"];
            let fill = |field: &mut Value, default: &str| {
                if field.as_str().unwrap_or("").is_empty() {
                    *field = json!(default);
                }
            };
            fill(&mut spec["completionPolicy"]["type"], "Always");
            fill(&mut spec["imagePullPolicy"], "IfNotPresent");
            default_pull_policy(&mut spec["pullPolicy"]);
            Ok(())
        },
    );
}

/// One pass over every job (`Reconcile`, :160-293).
pub(crate) async fn reconcile(m: &Inner) -> Wake {
    let mut wake = Wake::default();
    for job in m.list(Res::ImagePullJobs, None) {
        wake.merge(sync(m, &job).await);
    }
    wake
}

/// The strings of a JSON array (none for anything else).
pub(crate) fn strings(v: &Value) -> Vec<String> {
    let items = v.as_array().into_iter().flatten();
    items.filter_map(|x| x.as_str().map(String::from)).collect()
}

/// Whether `obj` has the finalizer `f`.
pub(crate) fn has_finalizer(obj: &Value, f: &str) -> bool {
    strings(&obj["metadata"]["finalizers"])
        .iter()
        .any(|x| x == f)
}

/// `obj` with the finalizer `f` added (`add`) or removed.
pub(crate) fn with_finalizer(obj: &Value, f: &str, add: bool) -> Value {
    let mut finalizers = strings(&obj["metadata"]["finalizers"]);
    finalizers.retain(|x| x != f);
    if add {
        finalizers.push(f.into());
    }
    let mut next = obj.clone();
    next["metadata"]["finalizers"] = json!(finalizers);
    next
}

async fn sync(m: &Inner, job: &Value) -> Wake {
    let completed = job["status"]["completionTime"].is_string();
    if deleting(job) || completed {
        sync_secrets(m, job, false).await;
        if has_finalizer(job, FINALIZER) {
            let j = with_finalizer(job, FINALIZER, false);
            m.replace("remove the job's finalizer", Res::ImagePullJobs, &j)
                .await;
            return Wake::default();
        }
        if deleting(job) {
            return Wake::default();
        }
        let (mut wake, done) = (Wake::default(), time_of(&job["status"]["completionTime"]));
        if let Some(ttl) = secs(&job["spec"]["completionPolicy"]["ttlSecondsAfterFinished"])
            && wake.passed(ttl, done.unwrap_or_else(now))
        {
            m.delete("delete the job after its TTL", Res::ImagePullJobs, job)
                .await;
        }
        return wake;
    }
    if !has_finalizer(job, FINALIZER) {
        let j = with_finalizer(job, FINALIZER, true);
        m.replace("add the job's finalizer", Res::ImagePullJobs, &j)
            .await;
        return Wake::default();
    }
    let node_images = select(m, job);
    let Some(refs) = sync_secrets(m, job, true).await else {
        return Wake::default();
    };
    let (name, tag) = name_and_tag(job["spec"]["image"].as_str().unwrap_or_default());
    let new_status = status_of(job, &node_images, &name, &tag, &refs);
    sync_node_images(m, job, &node_images, &name, &tag, &refs, &new_status).await;
    if new_status != job["status"] {
        let mut j = job.clone();
        j["status"] = new_status;
        m.replace_status("the job's status", Res::ImagePullJobs, &j)
            .await;
        return Wake::default();
    }
    let always = job["spec"]["completionPolicy"]["type"] != "Never";
    match (
        always,
        secs(&job["spec"]["completionPolicy"]["activeDeadlineSeconds"]),
    ) {
        (true, Some(ads)) => {
            let start = time_of(&job["status"]["startTime"]).unwrap_or_else(now);
            Wake::after(
                ads.saturating_sub(since(start))
                    .max(std::time::Duration::from_secs(1)),
            )
        }
        _ => Wake::default(),
    }
}

/// The NodeImages the job selects, by name order (imagejob_reader.go:69-156): by name, by the
/// nodes of the pods selected, or by the NodeImages' labels (all without a selector).
fn select(m: &Inner, job: &Value) -> Vec<Value> {
    let spec = &job["spec"];
    let nodes: Option<BTreeSet<String>> = if spec["selector"]["names"].is_array() {
        Some(strings(&spec["selector"]["names"]).into_iter().collect())
    } else if spec["podSelector"].is_object() {
        let pods = m.list(Res::Pods, Some(ns_of(job)));
        let selected = pods.into_iter().filter(|p| {
            pod_active(p) && matches_labels(&spec["podSelector"], &p["metadata"]["labels"])
        });
        Some(
            selected
                .filter_map(|p| p["spec"]["nodeName"].as_str().map(String::from))
                .collect(),
        )
    } else {
        None
    };
    let all = m.list(Res::NodeImages, None).into_iter();
    all.filter(|n| match &nodes {
        Some(nodes) => nodes.contains(name_of(n)),
        None => matches_labels(&spec["selector"], &n["metadata"]["labels"]),
    })
    .collect()
}

/// A label selector's `matchLabels` (the double's tests use no expressions).
pub(crate) fn matches_labels(selector: &Value, labels: &Value) -> bool {
    selector["matchLabels"]
        .as_object()
        .is_none_or(|want| want.iter().all(|(k, v)| &labels[k] == v))
}

/// `NormalizeImageRefToNameTag` (pkg/daemon/util/util.go:72-117): the familiar name, and the
/// digest, else the tag, else `latest`.
pub(crate) fn name_and_tag(image: &str) -> (String, String) {
    let (rest, tag) = match image.split_once('@') {
        Some((n, digest)) => (n.to_string(), Some(digest.to_string())),
        None => (image.to_string(), None),
    };
    let slash = rest.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match (tag, rest[slash..].rfind(':')) {
        (Some(d), _) => (rest.clone(), d),
        (None, Some(i)) => (
            rest[..slash + i].to_string(),
            rest[slash + i + 1..].to_string(),
        ),
        (None, None) => (rest.clone(), "latest".into()),
    };
    let name = name
        .strip_prefix("docker.io/library/")
        .or_else(|| name.strip_prefix("docker.io/"))
        .map_or(name.clone(), String::from);
    (name, tag)
}

/// The job's ownerReference in a tag (imagepulljob_utils.go:61-69).
fn owner_ref(job: &Value) -> Value {
    json!({"apiVersion": "apps.kruise.io/v1beta1", "kind": "ImagePullJob",
           "name": name_of(job), "namespace": ns_of(job), "uid": uid_of(job)})
}

/// The tag's `pullPolicy` (imagepulljob_utils.go:40-102).
fn pull_policy(m: &Inner, job: &Value) -> Value {
    let spec = &job["spec"];
    let timeout = spec["pullPolicy"]["timeoutSeconds"].as_i64().unwrap_or(600);
    let backoff = spec["pullPolicy"]["backoffLimit"].as_i64().unwrap_or(3);
    let mut p = json!({"timeoutSeconds": timeout, "backoffLimit": backoff});
    let cp = &spec["completionPolicy"];
    let seed = uid_of(job);
    if cp["type"] == "Never" {
        let j = i64::try_from(jitter(seed, 1200)).unwrap_or(0);
        p["ttlSecondsAfterFinished"] = json!(86_400 + j - 600);
        p["activeDeadlineSeconds"] = json!(timeout.max(1800));
    } else {
        if let Some(ads) = cp["activeDeadlineSeconds"].as_i64() {
            p["activeDeadlineSeconds"] = json!(ads);
        }
        let base = cp["ttlSecondsAfterFinished"]
            .as_i64()
            .or(cp["activeDeadlineSeconds"].as_i64())
            .unwrap_or(timeout * backoff);
        let d = i64::try_from(m.timing.default_ttl_for_always_node_image.as_secs()).unwrap_or(0);
        let j = i64::try_from(jitter(seed, 300)).unwrap_or(0);
        p["ttlSecondsAfterFinished"] = json!(base + d + j);
    }
    p
}

fn owned_by(tag: &Value, job: &Value) -> bool {
    tag["ownerReferences"]
        .as_array()
        .is_some_and(|o| o.iter().any(|r| r["uid"] == uid_of(job)))
}

/// Whether `secrets` (an image's `pullSecrets`) has the secret `r` refers to.
fn has_ref(secrets: &[Value], r: &Value) -> bool {
    (secrets.iter()).any(|p| p["namespace"] == r["namespace"] && p["name"] == r["name"])
}

/// The entry of `tag` in a list of tags (`spec.images.<name>.tags`, `imageStatuses.<name>.tags`).
fn tag_in<'a>(tags: &'a Value, tag: &str) -> Option<&'a Value> {
    tags.as_array()?.iter().find(|t| t["tag"] == tag)
}

/// Whether a NodeImage carries the job's tag and secrets (calculateStatus's "synced").
fn synced(ni: &Value, job: &Value, name: &str, tag: &str, refs: &[Value]) -> bool {
    let image = &ni["spec"]["images"][name];
    let secrets = image["pullSecrets"].as_array().cloned().unwrap_or_default();
    refs.iter().all(|r| has_ref(&secrets, r))
        && image["tags"]
            .as_array()
            .is_some_and(|t| t.iter().any(|t| t["tag"] == tag && owned_by(t, job)))
}

/// `calculateStatus` (:645-748).
fn status_of(job: &Value, nis: &[Value], name: &str, tag: &str, refs: &[Value]) -> Value {
    let old = &job["status"];
    let start = old["startTime"]
        .as_str()
        .map_or_else(|| rfc3339(now()), String::from);
    let (mut active, mut succeeded, mut failed) = (0, 0, Vec::new());
    let (mut pulling, mut not_synced) = (Vec::new(), Vec::new());
    for ni in nis {
        let node = name_of(ni).to_string();
        if !synced(ni, job, name, tag, refs) {
            not_synced.push(node);
            continue;
        }
        let spec_version = tag_in(&ni["spec"]["images"][name]["tags"], tag).map(version);
        match tag_in(&ni["status"]["imageStatuses"][name]["tags"], tag) {
            Some(s) if Some(version(s)) == spec_version && s["phase"] == "Succeeded" => {
                succeeded += 1;
            }
            Some(s) if Some(version(s)) == spec_version && s["phase"] == "Failed" => {
                failed.push(node);
            }
            _ => {
                active += 1;
                pulling.push(node);
            }
        }
    }
    let desired = nis.len();
    let cp = &job["spec"]["completionPolicy"];
    let always = cp["type"] != "Never";
    let finished = succeeded + failed.len() == desired;
    let mut status = json!({"desired": desired, "startTime": start});
    let deadline = secs(&cp["activeDeadlineSeconds"]);
    let started = time_of(&json!(start)).unwrap_or_else(now);
    if always && !finished && deadline.is_some_and(|d| since(started) >= d) {
        let mut failed_nodes = failed;
        failed_nodes.extend(pulling);
        failed_nodes.extend(not_synced);
        status["completionTime"] = json!(rfc3339(now()));
        status["succeeded"] = json!(succeeded);
        status["failed"] = json!(failed_nodes.len());
        status["failedNodes"] = json!(failed_nodes);
        status["active"] = json!(0);
        status["message"] = json!("job exceeds activeDeadlineSeconds");
        return keep_times(old, status);
    }
    failed.sort();
    status["active"] = json!(active);
    status["succeeded"] = json!(succeeded);
    status["failed"] = json!(failed.len());
    if !failed.is_empty() {
        status["failedNodes"] = json!(failed);
    }
    if always && finished {
        status["completionTime"] = json!(rfc3339(now()));
    }
    // imagepulljob_utils.go:113-121
    status["message"] = json!(if status["completionTime"].is_string() {
        "job has completed".to_string()
    } else if desired == 0 {
        "job is running, no progress".to_string()
    } else {
        #[allow(clippy::cast_precision_loss, reason = "a percentage of a few nodes")]
        let p = (succeeded + failed.len()) as f64 / desired as f64 * 100.0;
        format!("job is running, progress {p:.1}%")
    });
    keep_times(old, status)
}

/// A completion time already written stays (the status is otherwise recomputed each pass).
fn keep_times(old: &Value, mut new: Value) -> Value {
    if new["completionTime"].is_string() && old["completionTime"].is_string() {
        new["completionTime"] = old["completionTime"].clone();
    }
    new
}

/// `syncNodeImages` (:325-445): at most `parallelism − active` NodeImages not synced yet, in
/// name order, each one `PUT`.
async fn sync_node_images(
    m: &Inner,
    job: &Value,
    nis: &[Value],
    name: &str,
    tag: &str,
    refs: &[Value],
    status: &Value,
) {
    let parallelism = match &job["spec"]["parallelism"] {
        Value::Number(n) => n.as_u64().unwrap_or(1),
        Value::String(s) => s.parse().unwrap_or(1),
        _ => 1,
    };
    let active = status["active"].as_u64().unwrap_or(0);
    let budget = usize::try_from(parallelism.saturating_sub(active)).unwrap_or(0);
    let todo = nis.iter().filter(|ni| !synced(ni, job, name, tag, refs));
    for ni in todo.take(budget) {
        let mut ni = ni.clone();
        let image = &mut ni["spec"]["images"][name];
        if !image.is_object() {
            *image = json!({"tags": []});
        }
        if job["spec"]["sandboxConfig"].is_object() {
            image["sandboxConfig"] = job["spec"]["sandboxConfig"].clone();
        }
        let status_version =
            tag_in(&ni["status"]["imageStatuses"][name]["tags"], tag).map_or(-1, version);
        let image = &mut ni["spec"]["images"][name];
        let tags = array_mut(&mut image["tags"]);
        match tags.iter_mut().find(|t| t["tag"] == tag) {
            Some(t) if owned_by(t, job) => {}
            Some(t) => {
                // owned by other jobs: a new version of it, `pullPolicy` kept
                t["version"] = json!(version(t) + 1);
                let mut owners = t["ownerReferences"].as_array().cloned().unwrap_or_default();
                owners.push(owner_ref(job));
                t["ownerReferences"] = json!(owners);
                t["createdAt"] = json!(rfc3339(now()));
                t["imagePullPolicy"] = job["spec"]["imagePullPolicy"].clone();
            }
            None => tags.push(json!({
                "tag": tag, "version": status_version + 1, "pullPolicy": pull_policy(m, job),
                "ownerReferences": [owner_ref(job)], "createdAt": rfc3339(now()),
                "imagePullPolicy": job["spec"]["imagePullPolicy"]})),
        }
        tags.sort_by(|a, b| a["tag"].as_str().cmp(&b["tag"].as_str()));
        let mut secrets = image["pullSecrets"].as_array().cloned().unwrap_or_default();
        for r in refs {
            if !has_ref(&secrets, r) {
                secrets.push(r.clone());
            }
        }
        if !secrets.is_empty() {
            image["pullSecrets"] = json!(secrets);
        }
        m.replace("the job's tag on a NodeImage", Res::NodeImages, &ni)
            .await;
    }
}

fn references(secret: &Value) -> BTreeSet<String> {
    secret["metadata"]["annotations"][REFERENCES]
        .as_str()
        .unwrap_or("")
        .split(',')
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

/// The job's pull secrets as NodeImage refs, their copies in `kruise-daemon-config` made,
/// refreshed or released (:295-323,447-643). `None` when the namespace is missing (an error).
async fn sync_secrets(m: &Inner, job: &Value, wanted_now: bool) -> Option<Vec<Value>> {
    let job_ns = ns_of(job);
    let job_key = format!("{job_ns}/{}", name_of(job));
    let names = strings(&job["spec"]["pullSecrets"]);
    let config_ns = m.get(Res::Namespaces, "", DAEMON_CONFIG_NS);
    if config_ns.as_ref().is_none_or(deleting) {
        if wanted_now {
            m.error(format!(
                "{job_key}: namespace {DAEMON_CONFIG_NS} is missing or being deleted"
            ));
        }
        return None;
    }
    if job_ns == DAEMON_CONFIG_NS {
        return Some(
            names
                .iter()
                .map(|n| json!({"namespace": job_ns, "name": n}))
                .collect(),
        );
    }
    let wanted: BTreeSet<String> = if wanted_now {
        names.iter().map(|n| format!("{job_ns}/{n}")).collect()
    } else {
        BTreeSet::new()
    };
    let copies = m.list(Res::Secrets, Some(DAEMON_CONFIG_NS));
    let mut refs = Vec::new();
    for source_key in &wanted {
        let of_source: Vec<&Value> = copies
            .iter()
            .filter(|s| s["metadata"]["annotations"][SOURCE_KEY] == source_key.as_str())
            .collect();
        let existing = of_source
            .iter()
            .find(|s| references(s).contains(&job_key))
            .or_else(|| of_source.first());
        let (src_ns, src_name) = source_key.split_once('/').expect("ns/name");
        let Some(source) = m.get(Res::Secrets, src_ns, src_name) else {
            continue;
        };
        let (copy_name, mode) = match existing {
            Some(copy) => {
                let mut c = (*copy).clone();
                let mut set = references(copy);
                set.insert(job_key.clone());
                c["metadata"]["annotations"][REFERENCES] =
                    json!(set.into_iter().collect::<Vec<_>>().join(","));
                c["data"] = source["data"].clone();
                if c != **copy {
                    m.replace("refresh a secret copy", Res::Secrets, &c).await;
                }
                let mode = copy["metadata"]["annotations"][MODE].as_str().unwrap_or("");
                (name_of(copy).to_string(), mode.to_string())
            }
            None => {
                let copy_name = format!("{src_name}-{:06x}", jitter(&job_key, 0x100_0000));
                let mut annotations = source["metadata"]["annotations"].clone();
                if !annotations.is_object() {
                    annotations = json!({});
                }
                annotations[REFERENCES] = json!(job_key);
                annotations[SOURCE_KEY] = json!(source_key);
                annotations[MODE] = json!("batch");
                let copy = json!({"apiVersion": "v1", "kind": "Secret",
                    "metadata": {"namespace": DAEMON_CONFIG_NS, "name": copy_name,
                                 "labels": source["metadata"]["labels"], "annotations": annotations},
                    "type": source["type"], "data": source["data"]});
                if m.create("copy a pull secret", Res::Secrets, &copy)
                    .await
                    .is_none()
                {
                    continue;
                }
                (copy_name, "batch".to_string())
            }
        };
        refs.push(json!({"namespace": DAEMON_CONFIG_NS, "name": copy_name, "mode": mode}));
    }
    // release the copies this job no longer wants
    for copy in &copies {
        let mut set = references(copy);
        let source = copy["metadata"]["annotations"][SOURCE_KEY]
            .as_str()
            .unwrap_or("");
        if !set.contains(&job_key) || wanted.contains(source) {
            continue;
        }
        set.remove(&job_key);
        if set.is_empty() {
            m.delete("delete a released secret copy", Res::Secrets, copy)
                .await;
        } else {
            let mut c = copy.clone();
            c["metadata"]["annotations"][REFERENCES] =
                json!(set.into_iter().collect::<Vec<_>>().join(","));
            m.replace("release a secret copy", Res::Secrets, &c).await;
        }
    }
    Some(refs)
}
