//! What the container meta controller decides, as pure functions over the pod, the runtime's
//! containers and the previous annotation: which pods it manages, the new
//! `runtime-containers-meta`, and whether and when a container must be stopped for env from
//! metadata ([`plan_restarts`]).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container as SpecContainer, Pod};
use tokio::time::Instant;

use crate::cri::{Container, ContainerState};
use crate::hash::env::{NO_ENV_HASH, env_meta_refs, expected_env_hash};
use crate::hash::kubelet::{hash_container, hash_container_legacy, parse_hash};
use crate::k8s::keys::{
    self, InPlaceUpdateState, RuntimeContainerHashes, RuntimeContainerMeta, RuntimeContainerMetaSet,
};

/// How much longer than a container's grace period the kubelet may take to recreate a
/// container whose spec changed before kruised stops it itself (kruise's rule).
pub const KUBELET_RECREATE_MARGIN: Duration = Duration::from_secs(10);

/// Whether kruise manages the pod: a controller owner in `apps.kruise.io`, or a sidecar set.
pub fn is_managed(pod: &Pod) -> bool {
    let owned = pod.metadata.owner_references.iter().flatten().any(|o| {
        o.controller == Some(true) && o.api_version.split('/').next() == Some(keys::KRUISE_GROUP)
    });
    owned
        || pod
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(keys::SIDECARSET_HASH))
}

/// Whether the controller has taken the pod out of service for an in-place update: its
/// `InPlaceUpdateReady` condition is explicitly `False`.
pub fn in_place_update_pending(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == keys::INPLACE_UPDATE_READY && c.status == "False")
}

/// The pod's labels and annotations (empty when absent).
pub fn metadata_maps(pod: &Pod) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    (
        pod.metadata.labels.clone().unwrap_or_default(),
        pod.metadata.annotations.clone().unwrap_or_default(),
    )
}

/// The spec of container `name`.
pub fn spec_of<'a>(pod: &'a Pod, name: &str) -> Option<&'a SpecContainer> {
    pod.spec
        .as_ref()
        .and_then(|s| s.containers.iter().find(|c| c.name == name))
}

/// A container whose current env-from-metadata hash must be read from the runtime.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvToRead {
    /// Container name.
    pub name: String,
    /// Runtime container ID (without the runtime prefix).
    pub id: String,
}

/// Builds the new meta set, in the order of `status.containerStatuses`, matching spec, status
/// and runtime containers by name (never by index: kruise #2451). An entry whose container ID
/// did not change is kept as it was (its env hash was computed once for that container).
/// Returns the set and the running containers whose env hash is still unknown.
pub fn build_meta(
    pod: &Pod,
    runtime_name: &str,
    newest: &BTreeMap<&str, &Container>,
    old: Option<&RuntimeContainerMetaSet>,
    with_env: bool,
) -> (RuntimeContainerMetaSet, Vec<EnvToRead>) {
    let spec_names: Vec<&str> = pod
        .spec
        .iter()
        .flat_map(|s| s.containers.iter().map(|c| c.name.as_str()))
        .collect();
    let mut set = RuntimeContainerMetaSet::default();
    let mut to_read = Vec::new();
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref());
    for status in statuses.into_iter().flatten() {
        if !spec_names.contains(&status.name.as_str()) {
            continue;
        }
        let Some(c) = newest.get(status.name.as_str()) else {
            continue;
        };
        let container_id = format!("{runtime_name}://{}", c.id);
        let mut entry = match old.and_then(|o| o.container(&status.name)) {
            Some(prev) if prev.container_id == container_id => prev.clone(),
            _ => RuntimeContainerMeta {
                name: status.name.clone(),
                container_id,
                restart_count: c
                    .annotations
                    .get(keys::KUBELET_CONTAINER_RESTART_COUNT)
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0),
                hashes: RuntimeContainerHashes {
                    plain_hash: c
                        .annotations
                        .get(keys::KUBELET_CONTAINER_HASH)
                        .and_then(|h| parse_hash(h))
                        .unwrap_or(0),
                    extracted_env_from_metadata_hash: 0,
                },
            },
        };
        if !with_env {
            // kruise keeps what was computed when the gate is switched off; it only stops
            // computing new hashes
        } else if entry.hashes.extracted_env_from_metadata_hash == 0
            && c.state == ContainerState::Running
        {
            let reads_metadata =
                spec_of(pod, &status.name).is_some_and(|s| !env_meta_refs(s).is_empty());
            if reads_metadata {
                to_read.push(EnvToRead {
                    name: entry.name.clone(),
                    id: c.id.clone(),
                });
            } else {
                // nothing to read: the hash of no env vars, with no runtime call (as kruise)
                entry.hashes.extracted_env_from_metadata_hash = NO_ENV_HASH;
            }
        }
        set.containers.push(entry);
    }
    (set, to_read)
}

/// Why a container is stopped for env from metadata.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RestartReason {
    /// Its env from metadata is stale and nothing else will replace it.
    EnvChanged,
    /// The kubelet recreated it after our stop, but from a pod it had taken before the change
    /// (its env is stale again): one more stop, reported in an Event.
    StaleRecreation,
    /// The kubelet was expected to recreate it for a spec change, but has not within the
    /// container's grace period and a margin: kruise's rule applies (stop it).
    KubeletDidNotRecreate,
}

impl RestartReason {
    /// The metric label and log word.
    pub fn as_str(self) -> &'static str {
        match self {
            RestartReason::EnvChanged => "env-from-metadata",
            RestartReason::StaleRecreation => "stale-recreation",
            RestartReason::KubeletDidNotRecreate => "kubelet-did-not-recreate",
        }
    }
}

/// Why a container is or is not stopped for env from metadata; also what `kruised explain`
/// prints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Stop it, for this reason.
    Restart(RestartReason),
    /// Nothing to do: its env matches the pod's metadata.
    UpToDate,
    /// Its env is stale, but it must not be stopped now; the reason says why.
    Blocked(String),
    /// The kubelet recreates it by itself, because its spec changed too.
    KubeletRecreates,
    /// Its current env hash is not known yet (not running, or not read yet).
    Unknown(String),
}

/// How the hash the kubelet recorded for a running container compares with its current spec.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordedHash {
    /// It equals one of the kubelet's formulas of the current spec (the ≥ 1.31 name+image hash,
    /// the older full-JSON hash, or, for 1.27 to 1.30 with in-place resize, the full-JSON hash
    /// without resources that the kubelet records beside it): the kubelet keeps the container.
    Matches,
    /// It equals none: the spec changed, or the kubelet hashes some other way.
    Neither,
    /// The container carries no kubelet hash.
    Missing,
}

/// Compares the hash the kubelet recorded for `running` with `spec`, per container.
pub fn recorded_hash(spec: &SpecContainer, running: &Container) -> RecordedHash {
    let parse = |key| {
        running
            .annotations
            .get(key)
            .and_then(|h: &String| parse_hash(h))
    };
    let Some(recorded) = parse(keys::KUBELET_CONTAINER_HASH) else {
        return RecordedHash::Missing;
    };
    if recorded == hash_container(spec) || recorded == hash_container_legacy(spec) {
        return RecordedHash::Matches;
    }
    // kubelet 1.27 to 1.30 with InPlacePodVerticalScaling: a resize changes the full hash but
    // not the container, which the kubelet compares without resources
    if let Some(without) = parse(keys::KUBELET_CONTAINER_HASH_WITHOUT_RESOURCES) {
        let mut bare = spec.clone();
        bare.resources = None;
        if without == hash_container_legacy(&bare) {
            return RecordedHash::Matches;
        }
    }
    RecordedHash::Neither
}

/// Whether the kubelet will recreate this container by itself because its spec no longer
/// matches what the runtime recorded at creation, decided per container: a recorded hash that
/// matches a formula of the current spec means no; one that matches neither means the spec
/// changed or the kubelet hashes differently, and then the image decides (`image_id_matches`:
/// whether the spec image resolves to the image the container runs; unknown counts as a
/// change, and [`RestartInput::kubelet_overdue`] keeps that from blocking for good).
pub fn kubelet_will_recreate(
    spec: &SpecContainer,
    running: &Container,
    image_id_matches: Option<bool>,
) -> bool {
    match recorded_hash(spec, running) {
        RecordedHash::Matches => false,
        RecordedHash::Neither => image_id_matches != Some(true),
        RecordedHash::Missing => image_id_matches == Some(false),
    }
}

/// Whether `name` belongs to a later batch of a multi-batch in-place update, or outside the
/// current batch: only the current batch is restarted.
pub fn outside_current_batch(state: Option<&InPlaceUpdateState>, name: &str) -> bool {
    let Some(state) = state else {
        return false;
    };
    if state.next_container_images.contains_key(name)
        || state.next_container_ref_metadata.contains_key(name)
    {
        return true;
    }
    state
        .container_batches_record
        .last()
        .is_some_and(|batch| !batch.containers.iter().any(|c| c == name))
}

/// This daemon's last stop of a container of a pod, remembered to recognise a stale
/// recreation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreviousStop {
    /// The runtime ID of the container stopped.
    pub id: String,
    /// The env-from-metadata hash the pod's metadata gave then.
    pub expected: u64,
    /// Whether that stop was already the one more stop after a stale recreation.
    pub corrective: bool,
}

/// Inputs of one restart decision.
pub struct RestartInput<'a> {
    /// The pod.
    pub pod: &'a Pod,
    /// The container's spec.
    pub spec: &'a SpecContainer,
    /// Its meta entry, with the current env hash if known.
    pub meta: &'a RuntimeContainerMeta,
    /// Its newest runtime container.
    pub running: &'a Container,
    /// Whether the spec image resolves to the running image, if checked.
    pub image_id_matches: Option<bool>,
    /// The pod's in-place update state, if any.
    pub state: Option<&'a InPlaceUpdateState>,
    /// Whether the daemon already stopped this very container.
    pub already_stopped: bool,
    /// The kubelet was expected to recreate this container for longer than its grace period
    /// and a margin.
    pub kubelet_overdue: bool,
    /// This daemon's last stop of a container of this name in this pod.
    pub previous_stop: Option<&'a PreviousStop>,
}

/// Decides whether to stop a container because its env from metadata is stale.
pub fn decide_restart(input: &RestartInput<'_>) -> Verdict {
    let current = input.meta.hashes.extracted_env_from_metadata_hash;
    if current == 0 {
        return Verdict::Unknown("current env hash not read yet".into());
    }
    let (labels, annotations) = metadata_maps(input.pod);
    let expected = expected_env_hash(input.spec, &labels, &annotations);
    if current == expected {
        return Verdict::UpToDate;
    }
    if input.running.state != ContainerState::Running {
        return Verdict::Blocked("not running".into());
    }
    if !in_place_update_pending(input.pod) {
        return Verdict::Blocked(format!(
            "env from metadata changed, but {} is not False",
            keys::INPLACE_UPDATE_READY
        ));
    }
    if input.already_stopped {
        return Verdict::Blocked("already stopped; waiting for the kubelet to recreate it".into());
    }
    if outside_current_batch(input.state, &input.spec.name) {
        return Verdict::Blocked("belongs to a later batch of the in-place update".into());
    }
    let mut reason = RestartReason::EnvChanged;
    if let Some(prev) = input.previous_stop
        && prev.id != input.running.id
        && prev.expected == expected
    {
        // we stopped its predecessor for this very change, and the kubelet recreated it from
        // a pod it had taken before the change
        if prev.corrective {
            return Verdict::Blocked(
                "the kubelet recreated it with the old values twice; not stopping it again (no \
                 crash loop): the next change of its metadata restarts it"
                    .into(),
            );
        }
        reason = RestartReason::StaleRecreation;
    }
    if kubelet_will_recreate(input.spec, input.running, input.image_id_matches) {
        if !input.kubelet_overdue {
            return Verdict::KubeletRecreates;
        }
        reason = RestartReason::KubeletDidNotRecreate;
    }
    Verdict::Restart(reason)
}

/// One container as the restart plan sees it: its spec and annotation, what runs, and what the
/// daemon remembers of it. The caller gathers it: the daemon from its memory and the runtime,
/// `kruised explain` from the runtime alone (it remembers nothing).
pub struct Observation<'a> {
    /// The container's spec.
    pub spec: &'a SpecContainer,
    /// Its meta entry, with the current env hash if known.
    pub meta: &'a RuntimeContainerMeta,
    /// Its newest runtime container.
    pub running: &'a Container,
    /// Whether the spec image resolves to the running image, if that was asked.
    pub image_id_matches: Option<bool>,
    /// The daemon already stopped this very container.
    pub already_stopped: bool,
    /// The daemon's last stop of a container of this name in this pod.
    pub previous_stop: Option<&'a PreviousStop>,
    /// Since when the daemon expects the kubelet to recreate it by itself.
    pub kubelet_expected_since: Option<Instant>,
}

/// What the plan does about one container.
#[derive(Clone, Debug, PartialEq)]
pub enum RestartStep {
    /// Stop it now.
    Stop(RestartReason),
    /// Stop it, not before `at`: until then the kubelet may not hold the change (see
    /// [`super::settle`]).
    StopAt {
        /// Why it is stopped.
        reason: RestartReason,
        /// The earliest safe moment.
        at: Instant,
    },
    /// The kubelet recreates it by itself, expected since `since`; it is stopped after all if
    /// it still runs at `overdue_at`.
    KubeletRecreates {
        /// Since when the kubelet is expected to.
        since: Instant,
        /// When the daemon looks again.
        overdue_at: Instant,
    },
    /// Nothing to do now; the verdict says why (up to date, blocked, not known yet).
    Nothing(Verdict),
}

/// A pod's restart plan: a step per container, and when to look at the pod again (as
/// kube-runtime's `Action` carries its requeue).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// Per container, by name.
    pub steps: Vec<(String, RestartStep)>,
    /// The earliest moment a step changes by time alone.
    pub recheck_at: Option<Instant>,
}

/// The restart plan of `pod` at `now`; `stop_allowed_at` is the earliest moment a stop is
/// safe (the pod's [`super::settle::Timeline`]; `now` without one). Pure: the one decision the
/// daemon acts on and `kruised explain` prints.
pub fn plan_restarts(
    pod: &Pod,
    observed: &[Observation<'_>],
    now: Instant,
    stop_allowed_at: Instant,
) -> Plan {
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    let state = keys::parse_inplace_update_state(&annotations)
        .ok()
        .flatten();
    let mut plan = Plan::default();
    let mut recheck = |at: Instant| {
        plan.recheck_at = Some(plan.recheck_at.map_or(at, |r: Instant| r.min(at)));
    };
    let mut steps = Vec::new();
    for o in observed {
        // the grace period is the pod author's (clamped to a year): added with checked_add, a
        // time past what an Instant holds is never
        let overdue_after = |since: Instant| {
            crate::k8s::time::later(
                since,
                crate::controller::kill::grace_period(o.running) + KUBELET_RECREATE_MARGIN,
            )
        };
        let input = RestartInput {
            pod,
            spec: o.spec,
            meta: o.meta,
            running: o.running,
            image_id_matches: o.image_id_matches,
            state: state.as_ref(),
            already_stopped: o.already_stopped,
            kubelet_overdue: o
                .kubelet_expected_since
                .is_some_and(|t| now >= overdue_after(t)),
            previous_stop: o.previous_stop,
        };
        let step = match decide_restart(&input) {
            Verdict::Restart(reason) if stop_allowed_at > now => {
                recheck(stop_allowed_at);
                RestartStep::StopAt {
                    reason,
                    at: stop_allowed_at,
                }
            }
            Verdict::Restart(reason) => RestartStep::Stop(reason),
            Verdict::KubeletRecreates => {
                let since = o.kubelet_expected_since.unwrap_or(now);
                let overdue_at = overdue_after(since);
                recheck(overdue_at);
                RestartStep::KubeletRecreates { since, overdue_at }
            }
            v => RestartStep::Nothing(v),
        };
        steps.push((o.meta.name.clone(), step));
    }
    plan.steps = steps;
    plan
}

/// The kubelet IDs (`<runtime>://<id>`) of the pod's containers that have one, in status order.
pub fn container_ids(pod: &Pod) -> impl Iterator<Item = &str> {
    pod.status
        .iter()
        .flat_map(|s| s.container_statuses.iter().flatten())
        .filter_map(|s| s.container_id.as_deref())
        .filter(|id| !id.is_empty())
}

/// Whether the pod's annotation is out of date with what the pod itself says: a container ID
/// that differs, a container missing, or an env-from-metadata hash that the pod's metadata no
/// longer gives. Cheap (no runtime call), so every pod update can be checked.
pub fn needs_sync(pod: &Pod, meta: Option<&RuntimeContainerMetaSet>, with_env: bool) -> bool {
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref());
    let ids: Vec<(&str, &str)> = statuses
        .into_iter()
        .flatten()
        .filter_map(|s| {
            s.container_id
                .as_deref()
                .filter(|id| !id.is_empty())
                .map(|id| (s.name.as_str(), id))
        })
        .collect();
    if ids.is_empty() {
        return false;
    }
    let Some(meta) = meta else {
        return true;
    };
    if ids
        .iter()
        .any(|(name, id)| meta.container(name).is_none_or(|m| m.container_id != *id))
    {
        return true;
    }
    if !with_env {
        return false;
    }
    // a container first annotated before it ran gets its env hash as soon as it runs
    let running_without_hash = statuses.into_iter().flatten().any(|s| {
        s.state.as_ref().is_some_and(|st| st.running.is_some())
            && meta
                .container(&s.name)
                .is_some_and(|m| m.hashes.extracted_env_from_metadata_hash == 0)
    });
    if running_without_hash {
        return true;
    }
    let (labels, annotations) = metadata_maps(pod);
    pod.spec.iter().flat_map(|s| s.containers.iter()).any(|c| {
        meta.container(&c.name).is_some_and(|m| {
            let current = m.hashes.extracted_env_from_metadata_hash;
            current != 0 && current != expected_env_hash(c, &labels, &annotations)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::containers::newest_by_name;
    use crate::cri::{ContainerMetadata, StringMap};
    use crate::hash::kubelet::format_hash;
    use serde_json::json;

    fn pod(extra_annotations: serde_json::Value, ready: &str) -> Pod {
        let mut annotations = json!({"role": "blue"});
        if let Some(m) = extra_annotations.as_object() {
            for (k, v) in m {
                annotations[k] = v.clone();
            }
        }
        serde_json::from_value(json!({
            "metadata": {
                "name": "p", "namespace": "ns", "uid": "u1",
                "labels": {"app": "x"},
                "annotations": annotations,
                "ownerReferences": [{"apiVersion": "apps.kruise.io/v1alpha1", "kind": "CloneSet",
                                     "name": "cs", "uid": "o1", "controller": true}]
            },
            "spec": {"containers": [
                {"name": "main", "image": "busybox:v1",
                 "env": [{"name": "ROLE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['role']"}}}]},
                {"name": "side", "image": "busybox:v1"}
            ]},
            "status": {
                "conditions": [{"type": "InPlaceUpdateReady", "status": ready}],
                "containerStatuses": [
                    {"name": "side", "containerID": "containerd://s2", "image": "busybox:v1", "imageID": "sha256:1", "ready": true, "restartCount": 0},
                    {"name": "main", "containerID": "containerd://m1", "image": "busybox:v1", "imageID": "sha256:1", "ready": true, "restartCount": 0}
                ]
            }
        }))
        .unwrap()
    }

    fn running(pod: &Pod, name: &str, id: &str, attempt: u32) -> Container {
        let spec = pod
            .spec
            .as_ref()
            .unwrap()
            .containers
            .iter()
            .find(|c| c.name == name)
            .unwrap();
        let mut labels = StringMap::new();
        labels.insert(keys::KUBELET_CONTAINER_NAME.into(), name.into());
        let mut annotations = StringMap::new();
        annotations.insert(
            keys::KUBELET_CONTAINER_HASH.into(),
            format_hash(hash_container(spec)),
        );
        annotations.insert(
            keys::KUBELET_CONTAINER_RESTART_COUNT.into(),
            attempt.to_string(),
        );
        Container {
            id: id.into(),
            pod_sandbox_id: "s".into(),
            metadata: ContainerMetadata {
                name: name.into(),
                attempt,
            },
            image: "sha256:1".into(),
            image_ref: "sha256:1".into(),
            state: ContainerState::Running,
            created_at: i64::from(attempt),
            labels,
            annotations,
            image_id: String::new(),
            image_spec: Default::default(),
        }
    }

    #[test]
    fn pods_are_managed_through_a_kruise_controller_or_a_sidecar_set() {
        assert!(is_managed(&pod(json!({}), "True")));
        let mut p = pod(json!({}), "True");
        p.metadata.owner_references = None;
        assert!(!is_managed(&p));
        p.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(keys::SIDECARSET_HASH.into(), "{}".into());
        assert!(is_managed(&p));
        let mut p = pod(json!({}), "True");
        p.metadata.owner_references.as_mut().unwrap()[0].api_version = "apps/v1".into();
        assert!(!is_managed(&p), "a Deployment's pod is not kruise's");
    }

    #[test]
    fn meta_follows_status_order_and_matches_by_name_not_index() {
        let p = pod(json!({}), "True");
        let cs = [
            running(&p, "main", "m1", 0),
            running(&p, "side", "s2", 0),
            running(&p, "main", "m0", 0),
        ];
        let cs = [
            cs[0].clone(),
            cs[1].clone(),
            Container {
                created_at: -1,
                ..cs[2].clone()
            },
        ];
        let newest = newest_by_name(&cs);
        let (set, to_read) = build_meta(&p, "containerd", &newest, None, true);
        let names: Vec<_> = set.containers.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["side", "main"]);
        assert_eq!(
            set.container("main").unwrap().container_id,
            "containerd://m1"
        );
        let spec = &p.spec.as_ref().unwrap().containers[0];
        assert_eq!(
            set.container("main").unwrap().hashes.plain_hash,
            hash_container(spec)
        );
        assert_eq!(
            to_read,
            [EnvToRead {
                name: "main".into(),
                id: "m1".into()
            }],
            "only a container whose env reads metadata needs a runtime call"
        );
        assert_eq!(
            set.container("side")
                .unwrap()
                .hashes
                .extracted_env_from_metadata_hash,
            NO_ENV_HASH,
            "the others get the hash of no env at once (as kruise)"
        );
    }

    #[test]
    fn an_entry_for_the_same_container_keeps_its_env_hash() {
        let p = pod(json!({}), "True");
        let cs = [running(&p, "main", "m1", 0)];
        let newest = newest_by_name(&cs);
        let (mut first, _) = build_meta(&p, "containerd", &newest, None, true);
        first.containers[0].hashes.extracted_env_from_metadata_hash = 42;
        let (again, to_read) = build_meta(&p, "containerd", &newest, Some(&first), true);
        assert_eq!(
            again
                .container("main")
                .unwrap()
                .hashes
                .extracted_env_from_metadata_hash,
            42
        );
        assert!(to_read.is_empty());
    }

    #[test]
    fn with_env_from_metadata_off_existing_hashes_are_kept_and_none_computed() {
        let p = pod(json!({}), "True");
        let cs = [running(&p, "main", "m1", 0), running(&p, "side", "s2", 0)];
        let newest = newest_by_name(&cs);
        let (mut first, _) = build_meta(&p, "containerd", &newest, None, true);
        first.containers.iter_mut().for_each(|c| {
            if c.name == "main" {
                c.hashes.extracted_env_from_metadata_hash = 42;
            }
        });
        let (off, to_read) = build_meta(&p, "containerd", &newest, Some(&first), false);
        assert_eq!(
            off.container("main")
                .unwrap()
                .hashes
                .extracted_env_from_metadata_hash,
            42,
            "kept"
        );
        assert!(to_read.is_empty(), "nothing read with the gate off");
    }

    fn input<'a>(p: &'a Pod, meta: &'a RuntimeContainerMeta, c: &'a Container) -> RestartInput<'a> {
        RestartInput {
            pod: p,
            spec: &p.spec.as_ref().unwrap().containers[0],
            meta,
            running: c,
            image_id_matches: None,
            state: None,
            already_stopped: false,
            kubelet_overdue: false,
            previous_stop: None,
        }
    }

    fn stale_meta(p: &Pod, c: &Container) -> RuntimeContainerMeta {
        // the env the container runs with: role=green (the pod now says blue)
        let spec = &p.spec.as_ref().unwrap().containers[0];
        let mut annotations = BTreeMap::new();
        annotations.insert("role".to_string(), "green".to_string());
        RuntimeContainerMeta {
            name: "main".into(),
            container_id: format!("containerd://{}", c.id),
            restart_count: 0,
            hashes: RuntimeContainerHashes {
                plain_hash: 1,
                extracted_env_from_metadata_hash: expected_env_hash(
                    spec,
                    &BTreeMap::new(),
                    &annotations,
                ),
            },
        }
    }

    /// The annotation of a container running with the env the pod's metadata gives.
    fn up_to_date_meta(p: &Pod, c: &Container) -> RuntimeContainerMeta {
        let mut meta = stale_meta(p, c);
        let (labels, annotations) = metadata_maps(p);
        meta.hashes.extracted_env_from_metadata_hash = expected_env_hash(
            &p.spec.as_ref().unwrap().containers[0],
            &labels,
            &annotations,
        );
        meta
    }

    #[test]
    fn stale_env_restarts_only_while_in_place_update_ready_is_false() {
        let p = pod(json!({}), "False");
        let c = running(&p, "main", "m1", 0);
        let meta = stale_meta(&p, &c);
        assert_eq!(
            decide_restart(&input(&p, &meta, &c)),
            Verdict::Restart(RestartReason::EnvChanged)
        );
        let p = pod(json!({}), "True");
        assert!(
            matches!(decide_restart(&input(&p, &meta, &c)), Verdict::Blocked(r) if r.contains("InPlaceUpdateReady"))
        );
    }

    #[test]
    fn a_container_whose_spec_changed_too_is_left_to_the_kubelet_until_overdue() {
        let mut p = pod(json!({}), "False");
        let c = running(&p, "main", "m1", 0);
        let meta = stale_meta(&p, &c);
        p.spec.as_mut().unwrap().containers[0].image = Some("busybox:v2".into());
        let mut i = input(&p, &meta, &c);
        i.image_id_matches = Some(false);
        assert_eq!(decide_restart(&i), Verdict::KubeletRecreates);
        // the kubelet did not recreate it within its grace period: kruise's rule, stop it
        i.kubelet_overdue = true;
        assert_eq!(
            decide_restart(&i),
            Verdict::Restart(RestartReason::KubeletDidNotRecreate)
        );
    }

    #[test]
    fn when_the_recorded_hash_matches_no_formula_the_image_decides() {
        let p = pod(json!({}), "False");
        let mut c = running(&p, "main", "m1", 0);
        c.annotations
            .insert(keys::KUBELET_CONTAINER_HASH.into(), "deadbeef".into());
        let meta = stale_meta(&p, &c);
        let mut i = input(&p, &meta, &c);
        i.image_id_matches = Some(true);
        assert_eq!(
            decide_restart(&i),
            Verdict::Restart(RestartReason::EnvChanged),
            "same image: only the env is stale"
        );
        i.image_id_matches = Some(false);
        assert_eq!(
            decide_restart(&i),
            Verdict::KubeletRecreates,
            "new image: the kubelet recreates it"
        );
        i.image_id_matches = None;
        assert_eq!(
            decide_restart(&i),
            Verdict::KubeletRecreates,
            "unknown image: wait for the kubelet, with the overdue fallback"
        );
    }

    #[test]
    fn a_resize_on_a_kubelet_hashing_without_resources_does_not_block_a_restart() {
        // kubelet 1.27 to 1.30 with InPlacePodVerticalScaling: the full hash covers resources,
        // the hash beside it does not; a resize changes only the first
        let mut p = pod(json!({}), "False");
        let spec_before = p.spec.as_ref().unwrap().containers[0].clone();
        let mut c = running(&p, "main", "m1", 0);
        c.annotations.insert(
            keys::KUBELET_CONTAINER_HASH.into(),
            format_hash(hash_container_legacy(&spec_before)),
        );
        let mut bare = spec_before.clone();
        bare.resources = None;
        c.annotations.insert(
            keys::KUBELET_CONTAINER_HASH_WITHOUT_RESOURCES.into(),
            format_hash(hash_container_legacy(&bare)),
        );
        p.spec.as_mut().unwrap().containers[0].resources =
            Some(serde_json::from_value(json!({"requests": {"cpu": "200m"}})).unwrap());
        let spec = &p.spec.as_ref().unwrap().containers[0];
        assert_ne!(
            hash_container_legacy(spec),
            hash_container_legacy(&spec_before)
        );
        assert_eq!(recorded_hash(spec, &c), RecordedHash::Matches);
        let meta = stale_meta(&p, &c);
        let i = input(&p, &meta, &c);
        assert_eq!(
            decide_restart(&i),
            Verdict::Restart(RestartReason::EnvChanged)
        );
    }

    #[test]
    fn a_stale_recreation_gets_one_more_stop_and_never_a_third() {
        let p = pod(json!({}), "False");
        let c = running(&p, "main", "m2", 1);
        let meta = stale_meta(&p, &c);
        let (labels, annotations) = metadata_maps(&p);
        let expected = expected_env_hash(
            &p.spec.as_ref().unwrap().containers[0],
            &labels,
            &annotations,
        );
        let stop = |expected, corrective| PreviousStop {
            id: "m1".into(),
            expected,
            corrective,
        };
        let decide = |prev: &PreviousStop| {
            let mut i = input(&p, &meta, &c);
            i.previous_stop = Some(prev);
            decide_restart(&i)
        };
        assert_eq!(
            decide(&stop(expected, false)),
            Verdict::Restart(RestartReason::StaleRecreation)
        );
        assert!(
            matches!(decide(&stop(expected, true)), Verdict::Blocked(r) if r.contains("twice"))
        );
        // a newer change is a new restart, not a correction
        assert_eq!(
            decide(&stop(7, true)),
            Verdict::Restart(RestartReason::EnvChanged)
        );
    }

    #[test]
    fn a_stopped_container_is_never_stopped_twice() {
        let p = pod(json!({}), "False");
        let c = running(&p, "main", "m1", 0);
        let meta = stale_meta(&p, &c);
        let mut i = input(&p, &meta, &c);
        i.already_stopped = true;
        assert!(matches!(decide_restart(&i), Verdict::Blocked(r) if r.contains("already stopped")));
    }

    #[test]
    fn containers_of_a_later_batch_wait_for_their_batch() {
        let state: InPlaceUpdateState = serde_json::from_value(json!({
            "revision": "r2", "nextContainerImages": {"main": "busybox:v2"}
        }))
        .unwrap();
        assert!(outside_current_batch(Some(&state), "main"));
        assert!(!outside_current_batch(Some(&state), "side"));
        let state: InPlaceUpdateState = serde_json::from_value(json!({
            "revision": "r2", "containerBatchesRecord": [{"containers": ["side"]}]
        }))
        .unwrap();
        assert!(outside_current_batch(Some(&state), "main"));
        assert!(!outside_current_batch(None, "main"));
    }

    #[test]
    fn up_to_date_env_needs_nothing() {
        let p = pod(json!({}), "False");
        let c = running(&p, "main", "m1", 0);
        let meta = up_to_date_meta(&p, &c);
        assert_eq!(decide_restart(&input(&p, &meta, &c)), Verdict::UpToDate);
    }

    /// The pod of `pod`, its annotation as kruised writes it once every env was read (the
    /// hash of `main`'s env from the pod's current metadata).
    fn in_sync(p: &Pod) -> RuntimeContainerMetaSet {
        let cs = [running(p, "main", "m1", 0), running(p, "side", "s2", 0)];
        let (mut set, _) = build_meta(p, "containerd", &newest_by_name(&cs), None, true);
        let (labels, annotations) = metadata_maps(p);
        let spec = &p.spec.as_ref().unwrap().containers[0];
        let main = set
            .containers
            .iter_mut()
            .find(|c| c.name == "main")
            .unwrap();
        main.hashes.extracted_env_from_metadata_hash =
            expected_env_hash(spec, &labels, &annotations);
        set
    }

    #[test]
    fn a_pod_whose_annotation_matches_its_status_and_metadata_needs_no_sync() {
        let p = pod(json!({}), "True");
        let meta = in_sync(&p);
        assert!(!needs_sync(&p, Some(&meta), true));
        assert!(!needs_sync(&p, Some(&meta), false));
    }

    #[test]
    fn a_pod_with_running_containers_and_no_annotation_needs_a_sync() {
        let p = pod(json!({}), "True");
        assert!(needs_sync(&p, None, false));
    }

    #[test]
    fn a_pod_whose_containers_have_no_id_yet_needs_no_sync() {
        let mut p = pod(json!({}), "True");
        for s in p
            .status
            .as_mut()
            .unwrap()
            .container_statuses
            .as_mut()
            .unwrap()
        {
            s.container_id = Some(String::new());
        }
        assert!(
            !needs_sync(&p, None, true),
            "nothing runs yet: nothing to report"
        );
    }

    #[test]
    fn a_container_id_other_than_the_annotations_needs_a_sync() {
        let mut p = pod(json!({}), "True");
        let meta = in_sync(&p);
        p.status
            .as_mut()
            .unwrap()
            .container_statuses
            .as_mut()
            .unwrap()[1]
            .container_id = Some("containerd://m2".into());
        assert!(needs_sync(&p, Some(&meta), false), "main was recreated");
        let mut p = pod(json!({}), "True");
        let mut meta = in_sync(&p);
        meta.containers.retain(|c| c.name != "side");
        assert!(needs_sync(&p, Some(&meta), false), "side is missing");
        p.status
            .as_mut()
            .unwrap()
            .container_statuses
            .as_mut()
            .unwrap()[0]
            .container_id = None;
        assert!(
            !needs_sync(&p, Some(&meta), false),
            "a container with no ID yet is not missing"
        );
    }

    #[test]
    fn metadata_that_no_longer_gives_the_annotated_env_hash_needs_a_sync_only_with_env() {
        let mut p = pod(json!({}), "True");
        let meta = in_sync(&p);
        p.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert("role".into(), "green".into());
        assert!(needs_sync(&p, Some(&meta), true));
        assert!(
            !needs_sync(&p, Some(&meta), false),
            "without env restarts the env hash is not compared"
        );
        let mut p = pod(json!({}), "True");
        let meta = in_sync(&p);
        p.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("app".into(), "y".into());
        assert!(
            !needs_sync(&p, Some(&meta), true),
            "a label no env reads changes nothing"
        );
    }

    #[test]
    fn a_running_container_annotated_before_it_ran_needs_its_env_hash() {
        let mut p = pod(json!({}), "True");
        let mut meta = in_sync(&p);
        let main = meta
            .containers
            .iter_mut()
            .find(|c| c.name == "main")
            .unwrap();
        main.hashes.extracted_env_from_metadata_hash = 0;
        assert!(
            !needs_sync(&p, Some(&meta), true),
            "not running yet: its env cannot be read"
        );
        p.status
            .as_mut()
            .unwrap()
            .container_statuses
            .as_mut()
            .unwrap()[1]
            .state = serde_json::from_value(json!({"running": {}})).unwrap();
        assert!(needs_sync(&p, Some(&meta), true));
        assert!(!needs_sync(&p, Some(&meta), false));
    }

    fn observed<'a>(
        p: &'a Pod,
        meta: &'a RuntimeContainerMeta,
        c: &'a Container,
    ) -> Observation<'a> {
        Observation {
            spec: &p.spec.as_ref().unwrap().containers[0],
            meta,
            running: c,
            image_id_matches: None,
            already_stopped: false,
            previous_stop: None,
            kubelet_expected_since: None,
        }
    }

    #[test]
    fn the_plan_stops_a_stale_container_now_when_a_stop_is_safe_and_looks_again_at_nothing() {
        let p = pod(json!({}), "False");
        let c = running(&p, "main", "m1", 0);
        let meta = stale_meta(&p, &c);
        let now = Instant::now();
        let plan = plan_restarts(&p, &[observed(&p, &meta, &c)], now, now);
        assert_eq!(
            plan,
            Plan {
                steps: vec![("main".into(), RestartStep::Stop(RestartReason::EnvChanged))],
                recheck_at: None
            }
        );
    }

    #[test]
    fn the_plan_defers_a_stop_until_it_is_safe_and_looks_again_then() {
        let p = pod(json!({}), "False");
        let c = running(&p, "main", "m1", 0);
        let meta = stale_meta(&p, &c);
        let now = Instant::now();
        let at = now + Duration::from_millis(1500);
        let plan = plan_restarts(&p, &[observed(&p, &meta, &c)], now, at);
        assert_eq!(
            plan.steps,
            [(
                "main".to_string(),
                RestartStep::StopAt {
                    reason: RestartReason::EnvChanged,
                    at
                }
            )]
        );
        assert_eq!(plan.recheck_at, Some(at));
    }

    #[test]
    fn the_plan_leaves_a_respecced_container_to_the_kubelet_until_its_grace_and_margin_pass() {
        let mut p = pod(json!({}), "False");
        let c = running(&p, "main", "m1", 0);
        let meta = stale_meta(&p, &c);
        p.spec.as_mut().unwrap().containers[0].image = Some("busybox:v2".into());
        let now = Instant::now();
        let wait = crate::controller::kill::grace_period(&c) + KUBELET_RECREATE_MARGIN;
        let mut o = observed(&p, &meta, &c);
        o.image_id_matches = Some(false);
        let plan = plan_restarts(&p, std::slice::from_ref(&o), now, now);
        assert_eq!(
            plan.steps,
            [(
                "main".to_string(),
                RestartStep::KubeletRecreates {
                    since: now,
                    overdue_at: now + wait
                }
            )]
        );
        assert_eq!(plan.recheck_at, Some(now + wait));
        // expected since longer than that: the kubelet did not, so the daemon stops it
        o.kubelet_expected_since = Some(now);
        let later = now + wait;
        let plan = plan_restarts(&p, &[o], later, later);
        assert_eq!(
            plan.steps,
            [(
                "main".to_string(),
                RestartStep::Stop(RestartReason::KubeletDidNotRecreate)
            )]
        );
        assert_eq!(plan.recheck_at, None);
    }

    proptest::proptest! {
        /// A pod's author writes the grace period (`terminationGracePeriodSeconds`, up to the
        /// int64 maximum), which the kubelet records on the container: on 2c6dc4e the branch
        /// where the kubelet recreates a respecced container added it to an `Instant`
        /// unchecked, and overflow panics. Any value, any text, plans without a panic, and the
        /// kubelet is waited for no longer than a year and the margin.
        #[test]
        fn an_extreme_grace_period_from_the_pod_never_panics_the_plan(
            grace in proptest::prop_oneof![
                proptest::strategy::Just(i64::MAX.to_string()),
                proptest::strategy::Just(u64::MAX.to_string()),
                proptest::strategy::Just("-1".to_string()),
                proptest::strategy::Strategy::prop_map(proptest::num::i64::ANY, |v| v.to_string()),
                "\\PC{0,24}",
            ],
            deleting in proptest::bool::ANY,
        ) {
            let mut p = pod(json!({}), "False");
            let mut c = running(&p, "main", "m1", 0);
            let key = if deleting {
                keys::KUBELET_POD_DELETION_GRACE
            } else {
                keys::KUBELET_POD_TERMINATION_GRACE
            };
            c.annotations.insert(key.into(), grace);
            let meta = stale_meta(&p, &c);
            p.spec.as_mut().unwrap().containers[0].image = Some("busybox:v2".into());
            let now = Instant::now();
            let mut o = observed(&p, &meta, &c);
            o.image_id_matches = Some(false);
            o.kubelet_expected_since = Some(now);
            let plan = plan_restarts(&p, std::slice::from_ref(&o), now, now);
            let bound = now
                + crate::k8s::crd::MAX_API_DURATION
                + KUBELET_RECREATE_MARGIN;
            proptest::prop_assert!(plan.recheck_at.is_none_or(|at| at <= bound), "{plan:?}");
        }
    }

    #[test]
    fn the_plan_does_nothing_for_a_container_up_to_date_or_blocked() {
        let p = pod(json!({}), "False");
        let c = running(&p, "main", "m1", 0);
        let meta = up_to_date_meta(&p, &c);
        let now = Instant::now();
        let later = now + Duration::from_secs(1);
        let plan = plan_restarts(&p, &[observed(&p, &meta, &c)], now, later);
        assert_eq!(
            plan.steps,
            [("main".to_string(), RestartStep::Nothing(Verdict::UpToDate))]
        );
        assert_eq!(plan.recheck_at, None, "nothing to look at again");
        let meta = stale_meta(&p, &c);
        let mut o = observed(&p, &meta, &c);
        o.already_stopped = true;
        let plan = plan_restarts(&p, &[o], now, later);
        assert!(
            matches!(&plan.steps[0].1, RestartStep::Nothing(Verdict::Blocked(r)) if r.contains("already stopped")),
            "{plan:?}"
        );
        assert_eq!(plan.recheck_at, None);
    }
}
