//! A CloneSet's in-place update, for a workload the test describes by a [`Template`]: the API
//! double serves no CloneSet kind, so the test changes the template through
//! [`ManagerDouble::set_template`](super::ManagerDouble::set_template) where a user patches a
//! CloneSet, and this module does what kruise-manager 07169cf does to the pods
//! (`pkg/util/inplaceupdate/inplace_update.go`, `inplace_update_defaults.go`,
//! `pkg/controller/cloneset/sync/cloneset_update.go`): `InPlaceUpdateReady=False` first, then
//! one pod write with the new metadata and images and the update state (with a grace period:
//! the update spec in the grace annotation instead, applied once the grace is over), then, once
//! the containers are done (`runtime-containers-meta`, the env hash, the images), the next batch
//! or `InPlaceUpdateReady=True` and the lifecycle back to `Normal`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;

use k8s_openapi::api::core::v1::Container;
use kruised::hash::env::{MetaRef, env_meta_refs, expected_env_hash};
use kruised::hash::kubelet::{hash_container, hash_container_legacy};
use kruised::k8s::keys::{INPLACE_UPDATE_GRACE, INPLACE_UPDATE_GRACE_OLD};
use serde::Serialize;
use serde_json::{Value, json};

use super::{Inner, Res, Wake, array_mut, condition, lock, name_of, now, rfc3339, time_of};

/// Readiness gate and condition (kruise 07169cf apis/apps/pub/inplace_update.go:32).
pub const INPLACE_UPDATE_READY: &str = "InPlaceUpdateReady";
/// The update state annotation (apis/apps/pub/inplace_update.go:36-38).
pub const INPLACE_UPDATE_STATE: &str = "apps.kruise.io/inplace-update-state";
/// The legacy key, read as a fallback and deleted on write (inplace_update.go:388).
const INPLACE_UPDATE_STATE_LEGACY: &str = "inplace-update-state";
/// What the daemon reports of the running containers (apis/apps/pub/inplace_update.go:48).
pub const RUNTIME_CONTAINERS_META: &str = "apps.kruise.io/runtime-containers-meta";
/// The CloneSet's revision labels (pkg/controller/cloneset/utils/cloneset_utils.go:71-85).
pub const REVISION_LABEL: &str = "controller-revision-hash";
const TEMPLATE_HASH_LABEL: &str = "pod-template-hash";
/// Lifecycle state and its timestamp (pkg/util/lifecycle/lifecycle_utils.go:99-113).
pub const LIFECYCLE_STATE: &str = "lifecycle.apps.kruise.io/state";
const LIFECYCLE_TIMESTAMP: &str = "lifecycle.apps.kruise.io/timestamp";
/// The container launch priority env (pkg/util/containerlaunchpriority/
/// container_launch_priority.go:33-41).
const BARRIER_ENV: &str = "KRUISE_CONTAINER_BARRIER";

/// A workload's pod template: its metadata and containers (JSON, as in a pod spec).
#[derive(Clone, Debug, PartialEq)]
pub struct Template {
    /// `metadata.labels`.
    pub labels: BTreeMap<String, String>,
    /// `metadata.annotations`.
    pub annotations: BTreeMap<String, String>,
    /// `spec.containers`.
    pub containers: Value,
}

impl Template {
    /// A template of `containers` with no metadata.
    pub fn new(containers: Value) -> Template {
        Template {
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            containers,
        }
    }

    /// The same with label `key=value`.
    pub fn label(mut self, key: &str, value: &str) -> Template {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// The same with annotation `key=value`.
    pub fn annotation(mut self, key: &str, value: &str) -> Template {
        self.annotations.insert(key.into(), value.into());
        self
    }

    fn typed(&self) -> Vec<Container> {
        serde_json::from_value(self.containers.clone()).expect("containers of a pod spec")
    }

    /// The revision hash: kruise names a ControllerRevision `<set>-<hash>` with the hash made
    /// safe by `rand.SafeEncodeString` (a 32-bit FNV of the template here).
    fn hash(&self) -> String {
        let text = json!({"labels": self.labels, "annotations": self.annotations,
                          "containers": self.containers})
        .to_string();
        let mut h: u32 = 0x811c_9dc5;
        for b in text.bytes() {
            h ^= u32::from(b);
            h = h.wrapping_mul(0x0100_0193);
        }
        const SAFE: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        h.to_string()
            .bytes()
            .map(|b| char::from(SAFE[usize::from(b) % SAFE.len()]))
            .collect()
    }
}

/// A workload's status, as a CloneSet's.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WorkloadStatus {
    /// Its pods.
    pub replicas: usize,
    /// Pods at the update revision.
    pub updated_replicas: usize,
    /// Pods `Ready=True`.
    pub ready_replicas: usize,
    /// Pods at the update revision, `Ready=True` and in lifecycle state `Normal`.
    pub updated_ready_replicas: usize,
    /// The update revision (`<name>-<hash>`).
    pub update_revision: String,
}

/// One workload: its pods and its templates by revision.
#[derive(Clone, Debug)]
pub(crate) struct Workload {
    name: String,
    pods: Vec<String>,
    revisions: BTreeMap<String, Template>,
    update_revision: String,
    /// `updateStrategy.rollingUpdate.inPlaceUpdateStrategy.gracePeriodSeconds`.
    pub grace_seconds: u32,
}

impl Workload {
    pub fn new(name: &str, template: Template, pods: &[&str]) -> Workload {
        let mut w = Workload {
            name: name.to_string(),
            pods: pods.iter().map(|p| p.to_string()).collect(),
            revisions: BTreeMap::new(),
            update_revision: String::new(),
            grace_seconds: 0,
        };
        w.set_template(template);
        w
    }

    pub fn set_template(&mut self, template: Template) {
        let hash = template.hash();
        self.update_revision = format!("{}-{hash}", self.name);
        self.revisions
            .insert(self.update_revision.clone(), template);
    }

    fn hash_of(revision: &str) -> &str {
        revision.rsplit('-').next().unwrap_or_default()
    }

    /// Gives the pods what the CloneSet gives the pods it creates: the readiness gate, the
    /// template's labels, the revision labels and lifecycle state `Normal`.
    pub fn adopt(&self, control: &apiserver_double::Control) {
        let template = &self.revisions[&self.update_revision];
        for pod in &self.pods {
            control
                .modify("pods", "default", pod, |p| {
                    let gates = p["spec"]["readinessGates"].as_array().cloned();
                    let mut gates = gates.unwrap_or_default();
                    if !gates
                        .iter()
                        .any(|g| g["conditionType"] == INPLACE_UPDATE_READY)
                    {
                        gates.push(json!({"conditionType": INPLACE_UPDATE_READY}));
                    }
                    p["spec"]["readinessGates"] = json!(gates);
                    let labels = &mut p["metadata"]["labels"];
                    for (k, v) in &template.labels {
                        labels[k] = json!(v);
                    }
                    labels[REVISION_LABEL] = json!(self.update_revision);
                    labels[TEMPLATE_HASH_LABEL] = json!(Self::hash_of(&self.update_revision));
                    labels[LIFECYCLE_STATE] = json!("Normal");
                })
                .expect("a pod of the workload exists");
        }
    }

    /// The status over `pod(name)`.
    pub fn status_with(&self, pod: impl Fn(&str) -> Option<Value>) -> WorkloadStatus {
        let mut s = WorkloadStatus {
            update_revision: self.update_revision.clone(),
            ..Default::default()
        };
        for p in self.pods.iter().filter_map(|n| pod(n)) {
            s.replicas += 1;
            let updated = p["metadata"]["labels"][REVISION_LABEL] == self.update_revision.as_str();
            let ready = condition(&p, "Ready").is_some_and(|c| c["status"] == "True");
            let normal = p["metadata"]["labels"][LIFECYCLE_STATE] == "Normal";
            s.updated_replicas += usize::from(updated);
            s.ready_replicas += usize::from(ready);
            s.updated_ready_replicas += usize::from(updated && ready && normal);
        }
        s
    }

    pub fn status(&self, control: &apiserver_double::Control) -> WorkloadStatus {
        self.status_with(|n| control.get("pods", "default", n))
    }
}

/// One pass over every workload's pods.
pub(crate) async fn reconcile(m: &Inner) -> Wake {
    let workloads: Vec<Workload> = lock(&m.workloads).values().cloned().collect();
    let mut wake = Wake::default();
    for w in &workloads {
        for name in &w.pods {
            let Some(pod) = m.get(Res::Pods, "default", name) else {
                continue;
            };
            // Refresh, for every pod first, starts with the grace period (inplace_update.go:121-131)
            let a = &pod["metadata"]["annotations"];
            match a[INPLACE_UPDATE_GRACE]
                .as_str()
                .or(a[INPLACE_UPDATE_GRACE_OLD].as_str())
            {
                Some(text) => wake.merge(finish_grace(m, &pod, text).await),
                None => sync_pod(m, w, &pod).await,
            }
        }
    }
    wake
}

async fn sync_pod(m: &Inner, w: &Workload, pod: &Value) {
    let revision = pod["metadata"]["labels"][REVISION_LABEL]
        .as_str()
        .unwrap_or_default();
    let state = state_of(pod);
    if revision != w.update_revision {
        // cloneset_update.go:254-316: in place for a pod in a lifecycle state that allows it
        let lifecycle = pod["metadata"]["labels"][LIFECYCLE_STATE]
            .as_str()
            .unwrap_or("");
        if !matches!(lifecycle, "" | "PreparingNormal" | "Normal" | "Updating") {
            return;
        }
        let Some(old) = w.revisions.get(revision) else {
            return;
        };
        let new = &w.revisions[&w.update_revision];
        match UpdateSpec::between(old, new) {
            Ok(mut spec) => {
                spec.revision.clone_from(&w.update_revision);
                spec.grace_seconds = w.grace_seconds;
                start_update(m, w, pod, &spec).await;
            }
            Err(why) => m.error(format!(
                "{}: not an in-place update ({why}); the double does not recreate pods",
                name_of(pod)
            )),
        }
        return;
    }
    // Refresh (inplace_update.go:121-180)
    if let Some(state) = &state {
        if !containers_done(pod, state) {
            return;
        }
        if state.has_next() {
            next_batch(m, pod, state).await;
            return;
        }
    }
    set_ready_true(m, pod).await;
    if state.is_some() && pod["metadata"]["labels"][LIFECYCLE_STATE] == "Updating" {
        // the CloneSet moves the lifecycle back once the update is complete
        // (cloneset_update.go:204-211; lifecycle_utils.go:132-159)
        let patch = json!({"metadata": {"labels": {LIFECYCLE_STATE: "Normal"},
                                         "annotations": {LIFECYCLE_TIMESTAMP: rfc3339(now())}}});
        m.merge_patch("lifecycle Normal", Res::Pods, pod, &patch)
            .await;
    }
}

// === the update spec ===

/// What changes from one template to the next (`UpdateSpec`, inplace_update_defaults.go:268-412),
/// as kruise writes it into the grace annotation (inplace_update.go:86-98).
#[derive(Debug, Default, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct UpdateSpec {
    revision: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    container_images: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    container_ref_metadata: BTreeMap<String, RefMeta>,
    /// The labels and annotations to set (`null`: remove) as a patch of the pod, base64 (Go's
    /// `[]byte` in JSON).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    meta_data_patch: String,
    #[serde(default, skip_serializing_if = "is_false")]
    update_env_from_metadata: bool,
    #[serde(default, skip_serializing_if = "is_zero")]
    grace_seconds: u32,
}

/// Labels and annotations one container's env takes (an `ObjectMeta` in kruise's JSON).
#[derive(Clone, Debug, Default, PartialEq, Serialize, serde::Deserialize)]
struct RefMeta {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    annotations: BTreeMap<String, String>,
}

impl UpdateSpec {
    fn between(old: &Template, new: &Template) -> Result<UpdateSpec, String> {
        let mut spec = UpdateSpec::default();
        let (old_c, new_c) = (old.typed(), new.typed());
        if old_c.len() != new_c.len() {
            return Err("containers added or removed".into());
        }
        // spec ops: only `replace /spec/containers/N/image` updates in place (:300-340)
        for (o, n) in old_c.iter().zip(&new_c) {
            let mut o2 = o.clone();
            o2.image = n.image.clone();
            if o2 != *n {
                return Err(format!("container {} changed beyond its image", n.name));
            }
            if o.image != n.image {
                spec.container_images
                    .insert(n.name.clone(), n.image.clone().unwrap_or_default());
            }
        }
        let refs_of = |c: &Container| env_meta_refs(c).into_iter().map(|(_, r)| r).collect();
        let refs: Vec<(String, Vec<MetaRef>)> =
            new_c.iter().map(|c| (c.name.clone(), refs_of(c))).collect();
        let mut patch = json!({});
        for (is_label, o, n) in [
            (true, &old.labels, &new.labels),
            (false, &old.annotations, &new.annotations),
        ] {
            let field = if is_label { "labels" } else { "annotations" };
            for (k, v) in n.iter().filter(|(k, v)| o.get(*k) != Some(v)) {
                // a whole-map `add` (the template had none of these) never becomes ref-metadata
                // (inplace_update_defaults.go:356-399)
                let referencing: Vec<&String> = if o.is_empty() {
                    Vec::new()
                } else {
                    refs.iter()
                        .filter(|(_, rs)| {
                            rs.iter().any(|r| match r {
                                MetaRef::Label(key) => is_label && key == k,
                                MetaRef::Annotation(key) => !is_label && key == k,
                            })
                        })
                        .map(|(c, _)| c)
                        .collect()
                };
                if referencing.is_empty() {
                    patch[field][k] = json!(v);
                    continue;
                }
                spec.update_env_from_metadata = true;
                for c in referencing {
                    let meta = spec.container_ref_metadata.entry(c.clone()).or_default();
                    let map = if is_label {
                        &mut meta.labels
                    } else {
                        &mut meta.annotations
                    };
                    map.insert(k.clone(), v.clone());
                }
            }
            for k in o.keys().filter(|k| !n.contains_key(*k)) {
                patch[field][k] = Value::Null;
            }
        }
        if patch != json!({}) {
            spec.meta_data_patch = BASE64.encode(json!({ "metadata": patch }).to_string());
        }
        Ok(spec)
    }
}

// === the state annotation ===

/// `InPlaceUpdateState` in kruise's key order (apis/apps/pub/inplace_update.go:52-105).
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct State {
    revision: String,
    update_timestamp: String,
    /// Not `omitempty`: `null` when no image changes.
    last_container_statuses: Option<BTreeMap<String, ImageId>>,
    #[serde(default, skip_serializing_if = "is_false")]
    update_env_from_metadata: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    update_resources: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    update_images: bool,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    next_container_images: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    next_container_ref_metadata: BTreeMap<String, RefMeta>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pre_check_before_next: Option<PreCheck>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    container_batches_record: Vec<BatchRecord>,
}

#[derive(Clone, Debug, Default, Serialize, serde::Deserialize)]
struct ImageId {
    #[serde(rename = "imageID")]
    image_id: String,
}

#[derive(Clone, Debug, Default, Serialize, serde::Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct PreCheck {
    containers_required_ready: Vec<String>,
}

#[derive(Clone, Debug, Default, Serialize, serde::Deserialize)]
struct BatchRecord {
    timestamp: String,
    containers: Vec<String>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl State {
    fn has_next(&self) -> bool {
        !self.next_container_images.is_empty() || !self.next_container_ref_metadata.is_empty()
    }
}

fn state_of(pod: &Value) -> Option<State> {
    let a = &pod["metadata"]["annotations"];
    let text = a[INPLACE_UPDATE_STATE]
        .as_str()
        .or_else(|| a[INPLACE_UPDATE_STATE_LEGACY].as_str())?;
    serde_json::from_str(text).ok()
}

// === writes ===

/// Step 1 (inplace_update.go:326-347): `InPlaceUpdateReady=False` (reason `StartInPlaceUpdate`)
/// and `Ready` recomputed, in one `PUT pods/status`; then step 2: one pod `PUT` (:360-414), with
/// the spec applied, or with a grace period the spec in the grace annotation.
async fn start_update(m: &Inner, w: &Workload, pod: &Value, spec: &UpdateSpec) {
    let mut pod = pod.clone();
    if gated(&pod) {
        let mut status_pod = pod.clone();
        let t = rfc3339(now());
        let changed = set_condition(
            &mut status_pod,
            json!({"type": INPLACE_UPDATE_READY, "status": "False",
                   "reason": "StartInPlaceUpdate", "lastTransitionTime": t}),
        );
        not_ready_for_gate(&mut status_pod, &t);
        if changed {
            let Some(written) = m
                .replace_status("InPlaceUpdateReady=False", Res::Pods, &status_pod)
                .await
            else {
                return;
            };
            pod = written;
        }
    }
    let mut state = State {
        revision: w.update_revision.clone(),
        update_timestamp: rfc3339(now()),
        update_env_from_metadata: spec.update_env_from_metadata,
        update_images: !spec.container_images.is_empty(),
        ..Default::default()
    };
    let labels = &mut pod["metadata"]["labels"];
    labels[REVISION_LABEL] = json!(w.update_revision);
    labels[TEMPLATE_HASH_LABEL] = json!(Workload::hash_of(&w.update_revision));
    labels[LIFECYCLE_STATE] = json!("Updating");
    let annotations = &mut pod["metadata"]["annotations"];
    if !annotations.is_object() {
        *annotations = json!({});
    }
    annotations[LIFECYCLE_TIMESTAMP] = json!(rfc3339(now()));
    if spec.grace_seconds > 0 {
        let text = serde_json::to_string(spec).expect("the update spec serialises");
        annotations[INPLACE_UPDATE_GRACE] = json!(text);
    } else {
        patch_spec(&mut pod, &mut state, spec);
    }
    write_pod(m, &pod, &state, "in-place update").await;
}

/// The end of a grace period (`finishGracePeriod`, inplace_update.go:194-247): once
/// `graceSeconds` have passed since the state's `updateTimestamp`, the spec is applied and the
/// annotation removed in one pod `PUT`; until then, a look again when they have.
async fn finish_grace(m: &Inner, pod: &Value, text: &str) -> Wake {
    let (spec, mut state) = match (serde_json::from_str::<UpdateSpec>(text), state_of(pod)) {
        (Ok(spec), Some(state)) => (spec, state),
        (spec, _) => {
            let why = spec
                .err()
                .map_or("no update state".into(), |e| e.to_string());
            m.error(format!("{}: grace annotation: {why}", name_of(pod)));
            return Wake::default();
        }
    };
    let mut pod = pod.clone();
    // a revision changed meanwhile drops the spec (:217-219)
    if pod["metadata"]["labels"][REVISION_LABEL] == spec.revision.as_str() {
        let at = time_of(&json!(state.update_timestamp)).unwrap_or_else(now);
        let since = now().as_millisecond() - at.as_millisecond();
        let left = i64::from(spec.grace_seconds) * 1000 - since;
        if left > 0 {
            // roundupSeconds (:463-468)
            return Wake::after(Duration::from_secs(left.unsigned_abs().div_ceil(1000)));
        }
        patch_spec(&mut pod, &mut state, &spec);
    }
    if let Some(a) = pod["metadata"]["annotations"].as_object_mut() {
        a.remove(INPLACE_UPDATE_GRACE);
        a.remove(INPLACE_UPDATE_GRACE_OLD);
    }
    write_pod(m, &pod, &state, "in-place update after its grace period").await;
    Wake::default()
}

/// `defaultPatchUpdateSpecToPod` (inplace_update_defaults.go:75-219): the metadata patch, then
/// this batch's images and ref-metadata.
fn patch_spec(pod: &mut Value, state: &mut State, spec: &UpdateSpec) {
    let patch = BASE64.decode(&spec.meta_data_patch).unwrap_or_default();
    let patch: Value = serde_json::from_slice(&patch).unwrap_or_default();
    for field in ["labels", "annotations"] {
        for (k, v) in patch["metadata"][field].as_object().into_iter().flatten() {
            let map = &mut pod["metadata"][field];
            if v.is_null() {
                map.as_object_mut().map(|m| m.remove(k));
            } else {
                map[k] = v.clone();
            }
        }
    }
    let (images, refs) = (&spec.container_images, &spec.container_ref_metadata);
    apply_batch(pod, state, images.clone(), refs.clone());
}

/// Applies the batch chosen from `images` and `ref_metadata` to `pod` and records the rest for
/// the next batches (inplace_update_defaults.go:101-126,145-209,221-263).
fn apply_batch(
    pod: &mut Value,
    state: &mut State,
    images: BTreeMap<String, String>,
    ref_metadata: BTreeMap<String, RefMeta>,
) {
    let batch = choose_batch(pod, &images, &ref_metadata);
    let statuses = pod["status"]["containerStatuses"].clone();
    for (c, image) in &images {
        if !batch.contains(c) {
            state.next_container_images.insert(c.clone(), image.clone());
            continue;
        }
        if let Some(spec) = pod["spec"]["containers"]
            .as_array_mut()
            .and_then(|cs| cs.iter_mut().find(|x| x["name"] == c.as_str()))
        {
            spec["image"] = json!(image);
        }
        // recorded once, for containers with a status (:145-157)
        let status = statuses
            .as_array()
            .and_then(|s| s.iter().find(|s| s["name"] == c.as_str()));
        if let Some(s) = status {
            let last = state
                .last_container_statuses
                .get_or_insert_with(BTreeMap::new);
            last.entry(c.clone()).or_insert_with(|| ImageId {
                image_id: s["imageID"].as_str().unwrap_or_default().into(),
            });
        }
    }
    for (c, meta) in &ref_metadata {
        if !batch.contains(c) {
            state
                .next_container_ref_metadata
                .insert(c.clone(), meta.clone());
            continue;
        }
        for (k, v) in &meta.labels {
            pod["metadata"]["labels"][k] = json!(v);
        }
        for (k, v) in &meta.annotations {
            pod["metadata"]["annotations"][k] = json!(v);
        }
    }
    let mut sorted: Vec<String> = batch.into_iter().collect();
    sorted.sort();
    state.pre_check_before_next = state.has_next().then(|| PreCheck {
        containers_required_ready: sorted.clone(),
    });
    state.container_batches_record.push(BatchRecord {
        timestamp: rfc3339(now()),
        containers: sorted,
    });
}

/// This batch: the containers without a launch priority, those with the highest, and the
/// ref-metadata containers sharing a key with those (inplace_update_defaults.go:221-263).
fn choose_batch(
    pod: &Value,
    images: &BTreeMap<String, String>,
    ref_metadata: &BTreeMap<String, RefMeta>,
) -> BTreeSet<String> {
    let all: BTreeSet<&String> = images.keys().chain(ref_metadata.keys()).collect();
    let priority = |c: &str| -> Option<i64> {
        let env = pod["spec"]["containers"]
            .as_array()?
            .iter()
            .find(|x| x["name"] == c)?["env"]
            .as_array()?
            .iter()
            .find(|e| e["name"] == BARRIER_ENV)?;
        env["valueFrom"]["configMapKeyRef"]["key"]
            .as_str()?
            .strip_prefix("p_")?
            .parse()
            .ok()
    };
    let highest = all.iter().filter_map(|c| priority(c)).max();
    let mut batch: BTreeSet<String> = all
        .iter()
        .filter(|c| {
            let p = priority(c);
            p.is_none() || p == highest
        })
        .map(|c| c.to_string())
        .collect();
    loop {
        let keys: BTreeSet<(bool, &String)> = batch
            .iter()
            .filter_map(|c| ref_metadata.get(c))
            .flat_map(|m| {
                m.labels
                    .keys()
                    .map(|k| (true, k))
                    .chain(m.annotations.keys().map(|k| (false, k)))
            })
            .collect();
        let more: Vec<String> = ref_metadata
            .iter()
            .filter(|(c, _)| !batch.contains(*c))
            .filter(|(_, m)| {
                m.labels.keys().any(|k| keys.contains(&(true, k)))
                    || m.annotations.keys().any(|k| keys.contains(&(false, k)))
            })
            .map(|(c, _)| c.clone())
            .collect();
        if more.is_empty() {
            return batch;
        }
        batch.extend(more);
    }
}

/// The next batch once the current one is done and its containers are ready
/// (`updateNextBatch`, inplace_update.go:145-160,257-306): revision and timestamp kept.
async fn next_batch(m: &Inner, pod: &Value, state: &State) {
    let statuses = pod["status"]["containerStatuses"].as_array();
    let required = state
        .pre_check_before_next
        .as_ref()
        .map(|p| p.containers_required_ready.clone())
        .unwrap_or_default();
    for c in &required {
        let ready = statuses
            .and_then(|s| s.iter().find(|s| s["name"] == c.as_str()))
            .is_some_and(|s| s["ready"] == true);
        if !ready {
            return;
        }
    }
    let mut pod = pod.clone();
    let mut next = state.clone();
    let images = std::mem::take(&mut next.next_container_images);
    let refs = std::mem::take(&mut next.next_container_ref_metadata);
    next.pre_check_before_next = None;
    apply_batch(&mut pod, &mut next, images, refs);
    write_pod(m, &pod, &next, "next in-place batch").await;
}

async fn write_pod(m: &Inner, pod: &Value, state: &State, what: &str) {
    let mut pod = pod.clone();
    let text = serde_json::to_string(state).expect("the state serialises");
    let annotations = &mut pod["metadata"]["annotations"];
    annotations[INPLACE_UPDATE_STATE] = json!(text);
    annotations
        .as_object_mut()
        .map(|a| a.remove(INPLACE_UPDATE_STATE_LEGACY));
    m.replace(what, Res::Pods, &pod).await;
}

/// Sets `cond` on the pod as kruise's `SetPodCondition` (pkg/util/pods.go:328-338): replaced only
/// when its status differs, appended when missing. Whether it changed.
fn set_condition(pod: &mut Value, cond: Value) -> bool {
    let type_ = cond["type"].as_str().unwrap_or_default();
    let same = condition(pod, type_).is_some_and(|c| c["status"] == cond["status"]);
    if !same {
        put_condition(pod, cond);
    }
    !same
}

/// Puts `cond` in place of the pod's condition of its type, or after the others.
pub(crate) fn put_condition(pod: &mut Value, cond: Value) {
    let list = array_mut(&mut pod["status"]["conditions"]);
    match list.iter_mut().find(|c| c["type"] == cond["type"]) {
        Some(c) => *c = cond,
        None => list.push(cond),
    }
}

/// Whether the pod has the `InPlaceUpdateReady` readiness gate.
fn gated(pod: &Value) -> bool {
    let gates = pod["spec"]["readinessGates"].as_array();
    gates.is_some_and(|g| g.iter().any(|g| g["conditionType"] == INPLACE_UPDATE_READY))
}

/// `Ready=False` (`ReadinessGatesNotReady`) when `Ready` and `ContainersReady=True` exist
/// (pkg/util/pods.go:352-390).
fn not_ready_for_gate(pod: &mut Value, t: &str) {
    let containers_ready = condition(pod, "ContainersReady").is_some_and(|c| c["status"] == "True");
    if !containers_ready || condition(pod, "Ready").is_none() {
        return;
    }
    let gate_status = condition(pod, INPLACE_UPDATE_READY)
        .and_then(|c| c["status"].as_str())
        .unwrap_or("")
        .to_string();
    let list = pod["status"]["conditions"]
        .as_array_mut()
        .expect("conditions");
    if let Some(ready) = list.iter_mut().find(|c| c["type"] == "Ready") {
        if ready["status"] != "False" {
            ready["lastTransitionTime"] = json!(t);
        }
        ready["status"] = json!("False");
        ready["reason"] = json!("ReadinessGatesNotReady");
        ready["message"] = json!(format!(
            "the status of pod readiness gate \"{INPLACE_UPDATE_READY}\" is not \"True\", but {gate_status}"
        ));
    }
}

/// `InPlaceUpdateReady=True` with no reason or message, on the observed pod, unless it is so
/// already (inplace_update.go:163-179, `hasEqualCondition` :486-491).
async fn set_ready_true(m: &Inner, pod: &Value) {
    if !gated(pod) {
        return;
    }
    let equal = condition(pod, INPLACE_UPDATE_READY).is_some_and(|c| {
        c["status"] == "True"
            && c["reason"].as_str().unwrap_or("").is_empty()
            && c["message"].as_str().unwrap_or("").is_empty()
    });
    if equal {
        return;
    }
    let mut pod = pod.clone();
    let cond = json!({"type": INPLACE_UPDATE_READY, "status": "True",
                      "lastTransitionTime": rfc3339(now())});
    put_condition(&mut pod, cond);
    m.replace_status("InPlaceUpdateReady=True", Res::Pods, &pod)
        .await;
}

// === completion ===

/// Whether the containers of the current batch are done
/// (`defaultCheckContainersInPlaceUpdateCompleted`, inplace_update_defaults.go:434-492).
fn containers_done(pod: &Value, state: &State) -> bool {
    let meta_text = pod["metadata"]["annotations"][RUNTIME_CONTAINERS_META].as_str();
    let meta: Option<Value> = match meta_text.map(serde_json::from_str::<Value>) {
        Some(Ok(v)) => Some(v),
        Some(Err(_)) => return false,
        None => None,
    };
    let containers: Vec<Container> =
        serde_json::from_value(pod["spec"]["containers"].clone()).unwrap_or_default();
    let statuses = pod["status"]["containerStatuses"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let status_of = |name: &str| statuses.iter().find(|s| s["name"] == name);
    let entry_of = |name: &str| {
        meta.as_ref()
            .and_then(|m| m["containers"].as_array())
            .and_then(|cs| cs.iter().find(|c| c["name"] == name))
            .cloned()
    };
    let labels: BTreeMap<String, String> =
        serde_json::from_value(pod["metadata"]["labels"].clone()).unwrap_or_default();
    let annotations: BTreeMap<String, String> =
        serde_json::from_value(pod["metadata"]["annotations"].clone()).unwrap_or_default();
    // every container, not only the updated ones (checkAllContainersHashConsistent, :505-562)
    let consistent = |hash: &dyn Fn(&Container, &Value) -> bool| {
        containers.iter().all(|c| {
            let (Some(s), Some(e)) = (status_of(&c.name), entry_of(&c.name)) else {
                return false;
            };
            e["containerID"] == s["containerID"] && hash(c, &e)
        })
    };
    if state.update_env_from_metadata {
        if meta.is_none() {
            return false;
        }
        let env_ok = consistent(&|c, e| {
            e["hashes"]["extractedEnvFromMetadataHash"]
                .as_u64()
                .unwrap_or(0)
                == expected_env_hash(c, &labels, &annotations)
        });
        if !env_ok {
            return false;
        }
    }
    // the plain hash: kubelet's ≥ 1.31 formula or the pre-1.31 JSON one (:540-549,567-574)
    if meta.is_some()
        && consistent(&|c, e| {
            let h = e["hashes"]["plainHash"].as_u64().unwrap_or(0);
            h == hash_container(c) || h == hash_container_legacy(c)
        })
    {
        return true;
    }
    // else the images (:567-600)
    let mut last = state.last_container_statuses.clone().unwrap_or_default();
    for s in &statuses {
        let name = s["name"].as_str().unwrap_or_default();
        let Some(recorded) = last.remove(name) else {
            continue;
        };
        let spec_image = containers
            .iter()
            .find(|c| c.name == name)
            .and_then(|c| c.image.clone())
            .unwrap_or_default();
        let spec_image = if spec_image.contains(':') {
            spec_image
        } else {
            format!("{spec_image}:latest")
        };
        if s["imageID"] == recorded.image_id.as_str() && s["image"] != spec_image.as_str() {
            return false;
        }
    }
    last.is_empty()
}
