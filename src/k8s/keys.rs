//! Every label and annotation key the daemon reads or writes, and kruise's API group, in one
//! place, and typed parsers for the values that carry structure.
//!
//! Kubelet keys are what the kubelet puts on CRI sandboxes and containers
//! (`k8s.io/kubelet/pkg/types` and `pkg/kubelet/kuberuntime/labels.go`). Kruise keys are those
//! of `docs/kruise-wire.md` (annotations and labels; recreate requests). The parsers take an
//! object's annotation map (kube's `ResourceExt::annotations()`), return `Ok(None)` when the key
//! is absent and a [`KeyError`] naming the key when the value is malformed; like Go's
//! `encoding/json` they ignore unknown fields.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::gojson::{GoStruct, GoValue};
use crate::k8s::crd::{ContainerStatusSnapshot, is_false, null_as_default};

/// The API group of kruise's resources, and of the controllers whose pods it manages (a pod's
/// controller `ownerReference`). The CRD types' derives spell it out, as attributes must.
pub const KRUISE_GROUP: &str = "apps.kruise.io";

/// Kubelet label on sandboxes and containers: the pod's name.
pub const KUBELET_POD_NAME: &str = "io.kubernetes.pod.name";
/// Kubelet label on sandboxes and containers: the pod's namespace.
pub const KUBELET_POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
/// Kubelet label on sandboxes and containers: the pod's uid (the daemon's CRI filter).
pub const KUBELET_POD_UID: &str = "io.kubernetes.pod.uid";
/// Kubelet label on containers: the container's name in the pod spec.
pub const KUBELET_CONTAINER_NAME: &str = "io.kubernetes.container.name";
/// Kubelet annotation: the container hash, lowercase hex (formula depends on the kubelet version).
pub const KUBELET_CONTAINER_HASH: &str = "io.kubernetes.container.hash";
/// Kubelet annotation (1.27 to 1.31, with InPlacePodVerticalScaling): the full-JSON container hash
/// with resources zeroed, which those kubelets compare instead of the full one.
pub const KUBELET_CONTAINER_HASH_WITHOUT_RESOURCES: &str =
    "io.kubernetes.container.hashWithoutResources";
/// Kubelet annotation: the restart count when the container was created (decimal).
pub const KUBELET_CONTAINER_RESTART_COUNT: &str = "io.kubernetes.container.restartCount";
/// Kubelet annotation: where the termination message is written.
pub const KUBELET_TERMINATION_MESSAGE_PATH: &str = "io.kubernetes.container.terminationMessagePath";
/// Kubelet annotation: `File` or `FallbackToLogsOnError`.
pub const KUBELET_TERMINATION_MESSAGE_POLICY: &str =
    "io.kubernetes.container.terminationMessagePolicy";
/// Kubelet annotation: the pod's deletion grace period in seconds, once it is being deleted.
pub const KUBELET_POD_DELETION_GRACE: &str = "io.kubernetes.pod.deletionGracePeriod";
/// Kubelet annotation: the pod's `terminationGracePeriodSeconds`.
pub const KUBELET_POD_TERMINATION_GRACE: &str = "io.kubernetes.pod.terminationGracePeriod";
/// Kubelet annotation: the container's preStop handler as JSON (`LifecycleHandler`).
pub const KUBELET_PRESTOP_HANDLER: &str = "io.kubernetes.container.preStopHandler";
/// Kubelet annotation: the container's ports as JSON (`[]ContainerPort`).
pub const KUBELET_CONTAINER_PORTS: &str = "io.kubernetes.container.ports";
/// Kubelet label on sandboxes: `podsandbox`; on containers the annotation of the same name says
/// `container`, `init` or `ephemeral`.
pub const KUBELET_CONTAINER_TYPE: &str = "io.kubernetes.container.type";

/// kubectl's copy of the last applied object; often the largest annotation, never read here.
pub const LAST_APPLIED_CONFIGURATION: &str = "kubectl.kubernetes.io/last-applied-configuration";

// === kruise keys (docs/kruise-wire.md) ===

/// Pod annotation written by the daemon: JSON [`RuntimeContainerMetaSet`], the runtime container
/// IDs and hashes the manager uses to decide that an in-place update has finished.
pub const RUNTIME_CONTAINERS_META: &str = "apps.kruise.io/runtime-containers-meta";
/// Pod annotation written by the manager: JSON [`InPlaceUpdateState`] of the current in-place
/// update.
pub const INPLACE_UPDATE_STATE: &str = "apps.kruise.io/inplace-update-state";
/// The pre-1.0 name of [`INPLACE_UPDATE_STATE`], still read (the current name wins).
pub const INPLACE_UPDATE_STATE_OLD: &str = "inplace-update-state";
/// Pod annotation written by the manager: JSON `UpdateSpec` to apply when the in-place update
/// grace period ends; the daemon reads its `containerImages` to pull them early
/// (`controller::imagepull::inplace`).
pub const INPLACE_UPDATE_GRACE: &str = "apps.kruise.io/inplace-update-grace";
/// The pre-1.0 name of [`INPLACE_UPDATE_GRACE`].
pub const INPLACE_UPDATE_GRACE_OLD: &str = "inplace-update-grace";
/// Pod condition type the manager sets to `False` while an in-place update runs; the daemon
/// restarts containers for env-from-metadata changes only then.
pub const INPLACE_UPDATE_READY: &str = "InPlaceUpdateReady";
/// Pod annotation set by the SidecarSet webhook; its presence makes the container-meta
/// controller consider a pod that no kruise workload owns.
pub const SIDECARSET_HASH: &str = "kruise.io/sidecarset-hash";

/// CRR label: the uid of the pod whose containers are recreated (immutable).
pub const CRR_POD_UID_LABEL: &str = "crr.apps.kruise.io/pod-uid";
/// CRR label: the node of that pod (immutable); the daemon's watch selects on it.
pub const CRR_NODE_NAME_LABEL: &str = "crr.apps.kruise.io/node-name";
/// CRR label: present with value [`CRR_ACTIVE_TRUE`] until the request completes; the daemon's
/// watch selects on it.
pub const CRR_ACTIVE_LABEL: &str = "crr.apps.kruise.io/active";
/// The value of [`CRR_ACTIVE_LABEL`] on an active request.
pub const CRR_ACTIVE_TRUE: &str = "true";
/// CRR annotation (v1alpha1) written by the manager while Recreating: JSON list of
/// [`ContainerStatusSnapshot`], the pod's current container statuses.
pub const CRR_SYNC_CONTAINER_STATUSES: &str = "crr.apps.kruise.io/sync-container-statuses";
/// CRR annotation (v1alpha1) written by the manager once it made the pod not-ready: the RFC3339
/// time it did so. The same string is the manager's finalizer name on the CRR.
pub const CRR_UNREADY_ACQUIRED: &str = "crr.apps.kruise.io/unready-acquired";
/// CRR condition type (v1beta1) that replaces [`CRR_UNREADY_ACQUIRED`]; its
/// `lastTransitionTime` is the unready time.
pub const CRR_PRE_RECREATE_GRACE: &str = "PreRecreateGrace";

// === kruised's own keys ===

/// Pod annotation written by kruised: the last container stops it made on the pod, each with its
/// reason (`controller::provenance`: the JSON list, bounded, and its lenient parser). The pod's
/// author can write it too: it is read for display (`kruised explain`), never for a decision.
pub const LAST_RESTARTS: &str = "kruised.io/last-restarts";

/// Annotation the daemon adds to the sandbox config of every CRI PullImage call.
pub const PULLING_IMAGE_BY: &str = "apps.kruise.io/pulling-image-by";
/// The value of [`PULLING_IMAGE_BY`] (kept as kruise-daemon's for runtimes and tools that look
/// for it).
pub const PULLING_IMAGE_BY_KRUISE_DAEMON: &str = "kruise-daemon";

/// The label selector of the CRRs the daemon must handle on `node`: active requests for pods on
/// this node.
pub fn crr_label_selector(node: &str) -> String {
    format!("{CRR_NODE_NAME_LABEL}={node},{CRR_ACTIVE_LABEL}={CRR_ACTIVE_TRUE}")
}

// === parsers ===

/// An annotation that is present but cannot be used. The daemon logs it and reports it in the
/// object's status; it never panics on one.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The value is not the JSON the key calls for.
    #[error("annotation {key}: malformed JSON: {source}")]
    Json {
        /// The annotation key.
        key: &'static str,
        /// The decoder's complaint.
        #[source]
        source: serde_json::Error,
    },
    /// The value is not an RFC3339 time.
    #[error("annotation {key}: {value:?} is not an RFC3339 time: {source}")]
    Time {
        /// The annotation key.
        key: &'static str,
        /// The offending value.
        value: String,
        /// The parser's complaint.
        #[source]
        source: k8s_openapi::jiff::Error,
    },
}

/// Decodes the JSON value of `key`, if present.
fn parse_json<T: DeserializeOwned>(
    annotations: &BTreeMap<String, String>,
    key: &'static str,
) -> Result<Option<T>, KeyError> {
    annotations
        .get(key)
        .map(|v| serde_json::from_str(v).map_err(|source| KeyError::Json { key, source }))
        .transpose()
}

/// The pod's [`RUNTIME_CONTAINERS_META`], if present.
pub fn parse_runtime_containers_meta(
    annotations: &BTreeMap<String, String>,
) -> Result<Option<RuntimeContainerMetaSet>, KeyError> {
    parse_json(annotations, RUNTIME_CONTAINERS_META)
}

/// The pod's in-place update state, read from [`INPLACE_UPDATE_STATE`] or, when that is absent,
/// from [`INPLACE_UPDATE_STATE_OLD`] (kruise `GetInPlaceUpdateState`).
pub fn parse_inplace_update_state(
    annotations: &BTreeMap<String, String>,
) -> Result<Option<InPlaceUpdateState>, KeyError> {
    let key = if annotations.contains_key(INPLACE_UPDATE_STATE) {
        INPLACE_UPDATE_STATE
    } else {
        INPLACE_UPDATE_STATE_OLD
    };
    parse_json(annotations, key)
}

/// The CRR's [`CRR_SYNC_CONTAINER_STATUSES`] snapshot, if present (`null` is an empty list).
pub fn parse_sync_container_statuses(
    annotations: &BTreeMap<String, String>,
) -> Result<Option<Vec<ContainerStatusSnapshot>>, KeyError> {
    Ok(parse_json::<Option<Vec<ContainerStatusSnapshot>>>(
        annotations,
        CRR_SYNC_CONTAINER_STATUSES,
    )?
    .map(Option::unwrap_or_default))
}

/// The CRR's [`CRR_UNREADY_ACQUIRED`] time, if present.
pub fn parse_unready_acquired(
    annotations: &BTreeMap<String, String>,
) -> Result<Option<Timestamp>, KeyError> {
    let key = CRR_UNREADY_ACQUIRED;
    annotations
        .get(key)
        .map(|v| {
            v.parse::<Timestamp>().map_err(|source| KeyError::Time {
                key,
                value: v.clone(),
                source,
            })
        })
        .transpose()
}

// === annotation types ===

/// All the containers' runtime meta of a pod (kruise `appspub.RuntimeContainerMetaSet`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuntimeContainerMetaSet {
    /// One entry per container status, in status order.
    #[serde(default, deserialize_with = "null_as_default")]
    pub containers: Vec<RuntimeContainerMeta>,
}

/// The runtime meta of one container.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeContainerMeta {
    /// Container name.
    #[serde(default)]
    pub name: String,
    /// `<runtimeName>://<id>`, as in the pod's container status.
    #[serde(default, rename = "containerID")]
    pub container_id: String,
    /// From the CRI annotation `io.kubernetes.container.restartCount`.
    #[serde(default)]
    pub restart_count: i32,
    /// The container's hashes.
    #[serde(default)]
    pub hashes: RuntimeContainerHashes,
}

/// The hashes of one container.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeContainerHashes {
    /// The kubelet hash (CRI annotation `io.kubernetes.container.hash`, hex, stored in decimal).
    #[serde(default)]
    pub plain_hash: u64,
    /// Hash of the container with env-from-metadata values extracted; 0 (omitted) when unknown.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub extracted_env_from_metadata_hash: u64,
}

fn is_zero_u64(v: &u64) -> bool {
    *v == 0
}

impl RuntimeContainerMetaSet {
    /// The entry of container `name`.
    pub fn container(&self, name: &str) -> Option<&RuntimeContainerMeta> {
        self.containers.iter().find(|c| c.name == name)
    }

    /// The annotation value, byte for byte what Go's `json.Marshal` writes for the same set
    /// (field order name, containerID, restartCount, hashes; HTML-escaped strings;
    /// `extractedEnvFromMetadataHash` omitted when 0). Equal sets give equal strings, so the
    /// daemon can compare before patching.
    pub fn to_annotation_value(&self) -> String {
        let containers = self
            .containers
            .iter()
            .map(|c| {
                let hashes = GoStruct::new()
                    .field("plainHash", GoValue::Uint(c.hashes.plain_hash))
                    .omitempty(
                        "extractedEnvFromMetadataHash",
                        Some(GoValue::Uint(c.hashes.extracted_env_from_metadata_hash)),
                    );
                GoStruct::new()
                    .field("name", c.name.as_str())
                    .field("containerID", c.container_id.as_str())
                    .field("restartCount", c.restart_count)
                    .field("hashes", hashes)
                    .build()
            })
            .collect();
        let set = GoStruct::new().field("containers", GoValue::Array(containers));
        // The encoder writes only ASCII escapes and the UTF-8 of Rust strings.
        String::from_utf8_lossy(&set.build().to_go_json()).into_owned()
    }
}

/// The manager's record of an in-place update (kruise `appspub.InPlaceUpdateState`). Unknown
/// fields are ignored.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InPlaceUpdateState {
    /// The updated revision hash.
    #[serde(default)]
    pub revision: String,
    /// When the in-place update started.
    #[serde(default)]
    pub update_timestamp: Option<Time>,
    /// The container statuses before the update, by container name.
    #[serde(default, deserialize_with = "null_as_default")]
    pub last_container_statuses: BTreeMap<String, InPlaceUpdateContainerStatus>,
    /// Envs from annotations/labels are updated in place.
    #[serde(default, skip_serializing_if = "is_false")]
    pub update_env_from_metadata: bool,
    /// Resources are updated in place.
    #[serde(default, skip_serializing_if = "is_false")]
    pub update_resources: bool,
    /// Images are updated in place.
    #[serde(default, skip_serializing_if = "is_false")]
    pub update_images: bool,
    /// Images of lower-priority containers waiting for the next batch, by container name.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub next_container_images: BTreeMap<String, String>,
    /// Labels/annotations of lower-priority containers waiting for the next batch.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub next_container_ref_metadata: BTreeMap<String, ObjectMeta>,
    /// Resources of lower-priority containers waiting for the next batch.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub next_container_resources: BTreeMap<String, ResourceRequirements>,
    /// The check that must pass before the next batch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pre_check_before_next: Option<InPlaceUpdatePreCheckBeforeNext>,
    /// The batches already patched in this revision.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub container_batches_record: Vec<InPlaceUpdateContainerBatch>,
}

/// A container's status before the in-place update.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InPlaceUpdateContainerStatus {
    /// The image ID the container ran.
    #[serde(default, rename = "imageID", skip_serializing_if = "String::is_empty")]
    pub image_id: String,
}

/// The check that must pass before the next containers can be updated in place.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InPlaceUpdatePreCheckBeforeNext {
    /// Containers that must be ready first.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub containers_required_ready: Vec<String>,
}

/// One update batch.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct InPlaceUpdateContainerBatch {
    /// When the batch was patched.
    #[serde(default)]
    pub timestamp: Option<Time>,
    /// The containers of the batch.
    #[serde(default, deserialize_with = "null_as_default")]
    pub containers: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    /// The annotation as kruise-daemon writes it (`docs/kruise-wire.md`), with a container ID.
    const GO_META: &str = r#"{"containers":[{"name":"main","containerID":"containerd://4f1c2a","restartCount":0,"hashes":{"plainHash":2386938832,"extractedEnvFromMetadataHash":2053173458}}]}"#;

    #[test]
    fn runtime_containers_meta_round_trips_byte_for_byte_with_go() {
        let a = annotations(&[(RUNTIME_CONTAINERS_META, GO_META)]);
        let set = parse_runtime_containers_meta(&a).unwrap().unwrap();
        assert_eq!(
            set.container("main").unwrap().hashes,
            RuntimeContainerHashes {
                plain_hash: 2_386_938_832,
                extracted_env_from_metadata_hash: 2_053_173_458,
            }
        );
        assert_eq!(set.to_annotation_value(), GO_META);
        assert_eq!(serde_json::to_string(&set).unwrap(), GO_META);
    }

    #[test]
    fn runtime_containers_meta_omits_a_zero_env_hash_but_never_the_plain_hash() {
        let set = RuntimeContainerMetaSet {
            containers: vec![RuntimeContainerMeta {
                name: "a".into(),
                container_id: "docker://1".into(),
                restart_count: 3,
                hashes: RuntimeContainerHashes::default(),
            }],
        };
        let want = r#"{"containers":[{"name":"a","containerID":"docker://1","restartCount":3,"hashes":{"plainHash":0}}]}"#;
        assert_eq!(set.to_annotation_value(), want);
        assert_eq!(serde_json::to_string(&set).unwrap(), want);
        assert_eq!(
            RuntimeContainerMetaSet::default().to_annotation_value(),
            r#"{"containers":[]}"#
        );
    }

    #[test]
    fn runtime_containers_meta_escapes_html_like_go() {
        let set = RuntimeContainerMetaSet {
            containers: vec![RuntimeContainerMeta {
                name: "<a&b>".into(),
                ..Default::default()
            }],
        };
        assert!(
            set.to_annotation_value()
                .contains(r#""name":"\u003ca\u0026b\u003e""#)
        );
    }

    #[test]
    fn runtime_containers_meta_tolerates_unknown_fields_and_nulls() {
        let v = r#"{"containers":[{"name":"a","containerID":"c://1","restartCount":1,
                     "hashes":{"plainHash":5,"futureHash":9},"extra":[1]}],"version":2}"#;
        let set = parse_runtime_containers_meta(&annotations(&[(RUNTIME_CONTAINERS_META, v)]))
            .unwrap()
            .unwrap();
        assert_eq!(set.containers[0].hashes.plain_hash, 5);
        let set = parse_runtime_containers_meta(&annotations(&[(
            RUNTIME_CONTAINERS_META,
            r#"{"containers":null}"#,
        )]))
        .unwrap()
        .unwrap();
        assert!(set.containers.is_empty());
    }

    #[test]
    fn missing_annotations_parse_as_none() {
        let a = annotations(&[("other", "x")]);
        assert!(parse_runtime_containers_meta(&a).unwrap().is_none());
        assert!(parse_inplace_update_state(&a).unwrap().is_none());
        assert!(parse_sync_container_statuses(&a).unwrap().is_none());
        assert!(parse_unready_acquired(&a).unwrap().is_none());
    }

    #[test]
    fn malformed_json_annotations_are_errors_naming_the_key() {
        for key in [
            RUNTIME_CONTAINERS_META,
            INPLACE_UPDATE_STATE,
            CRR_SYNC_CONTAINER_STATUSES,
        ] {
            let a = annotations(&[(key, r#"{"containers":[{"name":1}"#)]);
            let err = match key {
                RUNTIME_CONTAINERS_META => parse_runtime_containers_meta(&a).map(|_| ()),
                INPLACE_UPDATE_STATE => parse_inplace_update_state(&a).map(|_| ()),
                _ => parse_sync_container_statuses(&a).map(|_| ()),
            }
            .unwrap_err();
            assert!(matches!(err, KeyError::Json { key: k, .. } if k == key));
            assert!(err.to_string().contains(key), "{err}");
        }
        // Valid JSON of the wrong shape is malformed too.
        let a = annotations(&[(RUNTIME_CONTAINERS_META, r#"{"containers":{"a":1}}"#)]);
        assert!(parse_runtime_containers_meta(&a).is_err());
        let a = annotations(&[(RUNTIME_CONTAINERS_META, "")]);
        assert!(parse_runtime_containers_meta(&a).is_err());
    }

    const STATE: &str = r#"{
      "revision": "web-7d9f", "updateTimestamp": "2025-03-04T05:06:07Z",
      "lastContainerStatuses": {"main": {"imageID": "docker.io/library/nginx@sha256:aa"}},
      "updateEnvFromMetadata": true, "updateImages": true,
      "nextContainerImages": {"sidecar": "busybox:2"},
      "nextContainerRefMetadata": {"sidecar": {"labels": {"l": "1"}, "annotations": {"a": "2"}}},
      "nextContainerResources": {"sidecar": {"limits": {"cpu": "1"}}},
      "preCheckBeforeNext": {"containersRequiredReady": ["main"]},
      "containerBatchesRecord": [{"timestamp": "2025-03-04T05:06:07Z", "containers": ["main"]}],
      "somethingNew": {"x": 1}
    }"#;

    #[test]
    fn inplace_update_state_parses_every_field_and_ignores_unknown_ones() {
        let s = parse_inplace_update_state(&annotations(&[(INPLACE_UPDATE_STATE, STATE)]))
            .unwrap()
            .unwrap();
        assert_eq!(s.revision, "web-7d9f");
        assert_eq!(
            s.update_timestamp.unwrap().0.to_string(),
            "2025-03-04T05:06:07Z"
        );
        assert_eq!(
            s.last_container_statuses["main"].image_id,
            "docker.io/library/nginx@sha256:aa"
        );
        assert!(s.update_env_from_metadata && s.update_images && !s.update_resources);
        assert_eq!(s.next_container_images["sidecar"], "busybox:2");
        let meta = &s.next_container_ref_metadata["sidecar"];
        assert_eq!(meta.labels.as_ref().unwrap()["l"], "1");
        assert_eq!(meta.annotations.as_ref().unwrap()["a"], "2");
        assert!(s.next_container_resources["sidecar"].limits.is_some());
        assert_eq!(
            s.pre_check_before_next.unwrap().containers_required_ready,
            ["main"]
        );
        assert_eq!(s.container_batches_record[0].containers, ["main"]);
        assert!(s.container_batches_record[0].timestamp.is_some());
    }

    #[test]
    fn inplace_update_state_is_read_from_the_old_key_when_the_new_one_is_absent() {
        let old = r#"{"revision":"old","lastContainerStatuses":null}"#;
        let s = parse_inplace_update_state(&annotations(&[(INPLACE_UPDATE_STATE_OLD, old)]))
            .unwrap()
            .unwrap();
        assert_eq!(s.revision, "old");
        assert!(s.last_container_statuses.is_empty());
        assert!(s.update_timestamp.is_none());

        let both = annotations(&[
            (INPLACE_UPDATE_STATE_OLD, old),
            (INPLACE_UPDATE_STATE, r#"{"revision":"new"}"#),
        ]);
        assert_eq!(
            parse_inplace_update_state(&both).unwrap().unwrap().revision,
            "new"
        );

        // A broken old value is reported under the old key.
        let broken = annotations(&[(INPLACE_UPDATE_STATE_OLD, "{")]);
        let err = parse_inplace_update_state(&broken).unwrap_err();
        assert!(matches!(
            err,
            KeyError::Json {
                key: INPLACE_UPDATE_STATE_OLD,
                ..
            }
        ));
    }

    #[test]
    fn sync_container_statuses_parse_with_and_without_container_ids() {
        let v = r#"[{"name":"a","ready":true,"restartCount":2,"containerID":"containerd://x","new":1},
                    {"name":"b","ready":false,"restartCount":0}]"#;
        let list = parse_sync_container_statuses(&annotations(&[(CRR_SYNC_CONTAINER_STATUSES, v)]))
            .unwrap()
            .unwrap();
        assert_eq!(
            list,
            [
                ContainerStatusSnapshot {
                    name: "a".into(),
                    ready: true,
                    restart_count: 2,
                    container_id: "containerd://x".into(),
                },
                ContainerStatusSnapshot {
                    name: "b".into(),
                    ..Default::default()
                },
            ]
        );
        assert_eq!(
            serde_json::to_string(&list[1]).unwrap(),
            r#"{"name":"b","ready":false,"restartCount":0}"#
        );
        let null = annotations(&[(CRR_SYNC_CONTAINER_STATUSES, "null")]);
        assert_eq!(parse_sync_container_statuses(&null).unwrap(), Some(vec![]));
    }

    #[test]
    fn unready_acquired_parses_rfc3339_with_any_offset() {
        let utc = annotations(&[(CRR_UNREADY_ACQUIRED, "2025-01-02T03:04:05Z")]);
        let local = annotations(&[(CRR_UNREADY_ACQUIRED, "2025-01-02T11:04:05+08:00")]);
        let a = parse_unready_acquired(&utc).unwrap().unwrap();
        assert_eq!(a, parse_unready_acquired(&local).unwrap().unwrap());
        assert_eq!(a.as_second(), 1_735_787_045);
    }

    #[test]
    fn malformed_unready_acquired_is_an_error_naming_key_and_value() {
        for bad in ["", "yesterday", "2025-01-02 03:04:05", "1735787045"] {
            let a = annotations(&[(CRR_UNREADY_ACQUIRED, bad)]);
            let err = parse_unready_acquired(&a).unwrap_err();
            assert!(matches!(&err, KeyError::Time { value, .. } if value == bad));
            assert!(err.to_string().contains(CRR_UNREADY_ACQUIRED), "{err}");
        }
    }

    #[test]
    fn crr_label_selector_selects_active_requests_of_the_node() {
        assert_eq!(
            crr_label_selector("node-1"),
            "crr.apps.kruise.io/node-name=node-1,crr.apps.kruise.io/active=true"
        );
    }

    proptest::proptest! {
        #[test]
        fn parsers_never_panic_on_arbitrary_values(value in ".*") {
            for key in [
                RUNTIME_CONTAINERS_META,
                INPLACE_UPDATE_STATE,
                CRR_SYNC_CONTAINER_STATUSES,
                CRR_UNREADY_ACQUIRED,
            ] {
                let a = annotations(&[(key, value.as_str())]);
                let _ = parse_runtime_containers_meta(&a);
                let _ = parse_inplace_update_state(&a);
                let _ = parse_sync_container_statuses(&a);
                let _ = parse_unready_acquired(&a);
            }
        }

        #[test]
        fn runtime_containers_meta_survives_a_round_trip(
            name in "[a-z0-9-]{1,20}",
            id in "[a-z]{1,10}://[0-9a-f]{1,64}",
            restart_count in 0i32..,
            plain_hash: u64,
            env_hash: u64,
        ) {
            let set = RuntimeContainerMetaSet {
                containers: vec![RuntimeContainerMeta {
                    name,
                    container_id: id,
                    restart_count,
                    hashes: RuntimeContainerHashes {
                        plain_hash,
                        extracted_env_from_metadata_hash: env_hash,
                    },
                }],
            };
            let value = set.to_annotation_value();
            proptest::prop_assert_eq!(&value, &serde_json::to_string(&set).unwrap());
            let a = annotations(&[(RUNTIME_CONTAINERS_META, value.as_str())]);
            proptest::prop_assert_eq!(parse_runtime_containers_meta(&a).unwrap(), Some(set));
        }
    }
}
