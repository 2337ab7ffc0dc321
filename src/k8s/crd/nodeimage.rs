//! `NodeImage` (cluster-scoped, one per node, named after the node): the images kruise-manager
//! wants pre-pulled on the node, and the daemon's report of each pull task.
//!
//! Go source: `apis/apps/v1alpha1/nodeimage_types.go`; status semantics in docs/kruise-wire.md.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube_derive::CustomResource;
use serde::{Deserialize, Serialize};

use super::{is_zero_i32, is_zero_i64, null_as_default, string_enum};

/// Pull timeout of one attempt when the tag's policy gives none (`timeoutSeconds` default).
pub const DEFAULT_PULL_TIMEOUT: Duration = Duration::from_secs(600);
/// Retries after the first attempt when the tag's policy gives none, or a negative number.
pub const DEFAULT_PULL_BACKOFF_LIMIT: u32 = 3;

/// NodeImageSpec defines the desired state of NodeImage.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "test-util", derive(schemars::JsonSchema))]
#[cfg_attr(not(feature = "test-util"), kube(schema = "disabled"))]
#[kube(
    group = "apps.kruise.io",
    version = "v1alpha1",
    kind = "NodeImage",
    status = "NodeImageStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "NodeImage is the Schema for the nodeimages API",
    printcolumn = r#"{"name": "DESIRED", "type": "integer", "jsonPath": ".status.desired", "description": "Number of all images on this node"}"#,
    printcolumn = r#"{"name": "PULLING", "type": "integer", "jsonPath": ".status.pulling", "description": "Number of image pull task active"}"#,
    printcolumn = r#"{"name": "SUCCEED", "type": "integer", "jsonPath": ".status.succeeded", "description": "Number of image pull task succeeded"}"#,
    printcolumn = r#"{"name": "FAILED", "type": "integer", "jsonPath": ".status.failed", "description": "Number of image pull tasks failed"}"#,
    printcolumn = r#"{"name": "AGE", "type": "date", "jsonPath": ".metadata.creationTimestamp", "description": "CreationTimestamp is a timestamp representing the server time when this object was created. It is not guaranteed to be set in happens-before order across separate operations. Clients may not set this value. It is represented in RFC3339 form and is in UTC."}"#
)]
pub struct NodeImageSpec {
    /// Specifies images to be pulled on this node, keyed by image name without tag.
    /// It can not be more than 256 for each NodeImage.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub images: BTreeMap<String, ImageSpec>,
}

/// ImageSpec defines the pulling spec of an image.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "test-util", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ImageSpec {
    /// Secrets (in namespace `kruise-daemon-config`) holding registry credentials for this image.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub pull_secrets: Vec<ReferenceObject>,
    /// Tags is a list of versions of this image.
    #[serde(default, deserialize_with = "null_as_default")]
    pub tags: Vec<ImageTagSpec>,
    /// Labels and annotations for the sandbox config of the CRI PullImage call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_config: Option<SandboxConfig>,
}

/// ReferenceObject comprises a resource name, with a mandatory namespace, rendered as
/// `<namespace>/<name>`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "test-util", derive(schemars::JsonSchema))]
pub struct ReferenceObject {
    /// Namespace of the referent.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// Name of the referent.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// How the manager uses the secret (`v1beta1` only, kruise 1.9+: `batch` for the copies it
    /// makes of an ImagePullJob's secrets). kruised reads it through and never writes spec.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mode: String,
}

/// SandboxConfig attaches metadata to the CRI PullImage call.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "test-util", derive(schemars::JsonSchema))]
pub struct SandboxConfig {
    /// Labels of the pull sandbox config.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub labels: BTreeMap<String, String>,
    /// Annotations of the pull sandbox config.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub annotations: BTreeMap<String, String>,
}

/// ImageTagSpec defines the pulling spec of an image tag.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "test-util", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ImageTagSpec {
    /// Specifies the image tag.
    #[serde(default)]
    pub tag: String,
    /// Specifies the create time of this tag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<Time>,
    /// Parameters of the pulling task; defaults apply when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull_policy: Option<ImageTagPullPolicy>,
    /// The objects (ImagePullJobs) that asked for this tag.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub owner_references: Vec<ObjectReference>,
    /// Opaque version of this tag; the manager bumps it to request a re-pull.
    #[serde(default, skip_serializing_if = "is_zero_i64")]
    pub version: i64,
    /// Image pull policy: `Always` or `IfNotPresent` (the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<ImagePullPolicy>,
}

/// ImageTagPullPolicy defines the policy of the pulling task.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "test-util", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ImageTagPullPolicy {
    /// Specifies the timeout of the pulling task. Defaults to 600.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<i32>,
    /// Specifies the number of retries before marking the pulling task failed. Defaults to 3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff_limit: Option<i32>,
    /// Lifetime of a finished task (enforced by the manager).
    #[serde(
        default,
        rename = "ttlSecondsAfterFinished",
        skip_serializing_if = "Option::is_none"
    )]
    pub ttl_seconds_after_finished: Option<i32>,
    /// Duration relative to the start time that the task may be active.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_deadline_seconds: Option<i64>,
}

string_enum! {
    /// Image pull policy of a tag (`ImagePullPolicy`).
    pub enum ImagePullPolicy {
        /// Always pull.
        Always = "Always",
        /// Pull only if the image is not on the node.
        IfNotPresent = "IfNotPresent",
    }
}

/// NodeImageStatus defines the observed state of NodeImage. The counters are always written.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "test-util", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct NodeImageStatus {
    /// The desired number of pulling tasks (tags over all images in spec).
    #[serde(default)]
    pub desired: i32,
    /// The number of pulling tasks which reached phase Succeeded.
    #[serde(default)]
    pub succeeded: i32,
    /// The number of pulling tasks which reached phase Failed.
    #[serde(default)]
    pub failed: i32,
    /// The number of pulling tasks which are not finished.
    #[serde(default)]
    pub pulling: i32,
    /// The number of pulling tasks which are waiting (kruise 1.9+; pruned by older CRDs).
    #[serde(default)]
    pub waiting: i32,
    /// All statuses of active image pulling tasks, keyed by image name.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub image_statuses: BTreeMap<String, ImageStatus>,
    /// Written by the manager only (the daemon never sets it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_sync_status: Option<SyncStatus>,
}

/// ImageStatus defines the pulling status of an image.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "test-util", derive(schemars::JsonSchema))]
pub struct ImageStatus {
    /// Represents statuses of pulling tasks on this node.
    #[serde(default, deserialize_with = "null_as_default")]
    pub tags: Vec<ImageTagStatus>,
}

/// ImageTagStatus defines the pulling status of an image tag.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "test-util", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ImageTagStatus {
    /// Represents the image tag.
    #[serde(default)]
    pub tag: String,
    /// Represents the image pulling task phase.
    #[serde(default)]
    pub phase: ImagePullPhase,
    /// Pulling progress, 0–100.
    #[serde(default, skip_serializing_if = "is_zero_i32")]
    pub progress: i32,
    /// When the pulling task was acknowledged by the image puller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// When the pulling task was completed; set means the task for `version` is finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
    /// The version of the tag spec that the daemon handled.
    #[serde(default, skip_serializing_if = "is_zero_i64")]
    pub version: i64,
    /// `<name>@<CRI image id>`.
    #[serde(default, rename = "imageID", skip_serializing_if = "String::is_empty")]
    pub image_id: String,
    /// Summary information (the error of a failed pull).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

string_enum! {
    /// ImagePullPhase defines the phase of a pull task.
    pub enum ImagePullPhase {
        /// The task has not started (waiting for a worker slot).
        Waiting = "Waiting",
        /// The task has been started, but not completed.
        Pulling = "Pulling",
        /// The task has completed.
        Succeeded = "Succeeded",
        /// The task has failed.
        Failed = "Failed",
    }
}

/// SyncStatus is the summary of the first completion of all pull tasks on the node (manager).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "test-util", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SyncStatus {
    /// When the node's first sync finished.
    #[serde(default)]
    pub sync_at: Option<Time>,
    /// `Succeeded` or `Failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<SyncStatusPhase>,
    /// Details.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

string_enum! {
    /// SyncStatusPhase defines the node status.
    pub enum SyncStatusPhase {
        /// All tasks succeeded on this node.
        Succeeded = "Succeeded",
        /// Some task failed on this node.
        Failed = "Failed",
    }
}

// === impl NodeImageSpec ===

impl NodeImageSpec {
    /// The number of pull tasks the spec asks for: the tags over all images (`status.desired`).
    pub fn desired(&self) -> i32 {
        let n: usize = self.images.values().map(|i| i.tags.len()).sum();
        i32::try_from(n).unwrap_or(i32::MAX)
    }
}

// === impl ImageSpec ===

impl ImageSpec {
    /// The spec of `tag`, if the image lists it.
    pub fn tag(&self, tag: &str) -> Option<&ImageTagSpec> {
        self.tags.iter().find(|t| t.tag == tag)
    }
}

// === impl ImageTagSpec ===

impl ImageTagSpec {
    /// Timeout of one pull attempt: `timeoutSeconds`, or [`DEFAULT_PULL_TIMEOUT`]. A negative value
    /// is zero (Go's context then expires at once).
    pub fn timeout(&self) -> Duration {
        match self.pull_policy.as_ref().and_then(|p| p.timeout_seconds) {
            Some(s) => super::api_seconds(i64::from(s)),
            None => DEFAULT_PULL_TIMEOUT,
        }
    }

    /// Retries after the first attempt: `backoffLimit`, or [`DEFAULT_PULL_BACKOFF_LIMIT`] when
    /// unset or negative.
    pub fn backoff_limit(&self) -> u32 {
        self.pull_policy
            .as_ref()
            .and_then(|p| p.backoff_limit)
            .and_then(|b| u32::try_from(b).ok())
            .unwrap_or(DEFAULT_PULL_BACKOFF_LIMIT)
    }

    /// How long the task may be active after its start time, if limited (negative is zero).
    pub fn active_deadline(&self) -> Option<Duration> {
        self.pull_policy
            .as_ref()
            .and_then(|p| p.active_deadline_seconds)
            .map(super::api_seconds)
    }

    /// Whether the tag asks to skip the pull when the image is already present.
    pub fn if_not_present(&self) -> bool {
        self.image_pull_policy == Some(ImagePullPolicy::IfNotPresent)
    }
}

// === impl NodeImageStatus ===

impl NodeImageStatus {
    /// Sets `desired` and recomputes succeeded/failed/pulling/waiting from the tag phases of every
    /// image, as kruise-daemon does before each status write. Tags in unknown phases count in
    /// none of the counters.
    pub fn recount(&mut self, desired: i32) {
        self.desired = desired;
        self.succeeded = 0;
        self.failed = 0;
        self.pulling = 0;
        self.waiting = 0;
        for tag in self.image_statuses.values().flat_map(|i| &i.tags) {
            match tag.phase {
                ImagePullPhase::Succeeded => self.succeeded += 1,
                ImagePullPhase::Failed => self.failed += 1,
                ImagePullPhase::Pulling => self.pulling += 1,
                ImagePullPhase::Waiting => self.waiting += 1,
                ImagePullPhase::Other(_) => {}
            }
        }
    }

    /// The status of `image:tag` for the given spec `version`.
    pub fn tag_status(&self, image: &str, tag: &str, version: i64) -> Option<&ImageTagStatus> {
        self.image_statuses.get(image)?.tag_status(tag, version)
    }

    /// Whether pulls are still outstanding, kruise's `isImageInPulling`: fewer finished tasks than
    /// desired, or a reported tag whose version differs from the spec's. The daemon then resyncs
    /// within seconds instead of minutes.
    pub fn is_pulling(&self, spec: &NodeImageSpec) -> bool {
        if self.succeeded.saturating_add(self.failed) < self.desired {
            return true;
        }
        self.image_statuses.iter().any(|(image, status)| {
            status.tags.iter().any(|t| {
                spec.images
                    .get(image)
                    .and_then(|i| i.tag(&t.tag))
                    .is_some_and(|s| s.version != t.version)
            })
        })
    }
}

// === impl ImageStatus ===

impl ImageStatus {
    /// Sorts the tags by tag string (byte order), as kruise's `SortStatusImageTags`.
    pub fn sort_tags(&mut self) {
        self.tags.sort_by(|a, b| a.tag.cmp(&b.tag));
    }

    /// The status entry with the same `tag` and the same `version`.
    pub fn tag_status(&self, tag: &str, version: i64) -> Option<&ImageTagStatus> {
        self.tags
            .iter()
            .find(|t| t.tag == tag && t.version == version)
    }
}

// === impl ImageTagStatus ===

impl ImageTagStatus {
    /// Whether the task is finished (`completionTime` set): the daemon adopts such a status and
    /// does not pull again for the same version.
    pub fn is_finished(&self) -> bool {
        self.completion_time.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tag_status(tag: &str, phase: ImagePullPhase, version: i64) -> ImageTagStatus {
        ImageTagStatus {
            tag: tag.into(),
            phase,
            version,
            ..Default::default()
        }
    }

    #[test]
    fn a_manager_written_node_image_parses() {
        let json = r#"{
          "apiVersion": "apps.kruise.io/v1alpha1", "kind": "NodeImage",
          "metadata": {"name": "node-1", "resourceVersion": "42"},
          "spec": {"images": {"nginx": {
            "pullSecrets": [{"namespace": "kruise-daemon-config", "name": "s", "mode": "batch"}],
            "tags": [{"tag": "1.25", "createdAt": "2025-01-02T03:04:05Z", "version": 2,
                      "imagePullPolicy": "IfNotPresent",
                      "pullPolicy": {"timeoutSeconds": 30, "backoffLimit": -1, "ttlSecondsAfterFinished": 300,
                                     "activeDeadlineSeconds": 1200},
                      "ownerReferences": [{"apiVersion": "apps.kruise.io/v1alpha1", "kind": "ImagePullJob",
                                           "name": "j", "namespace": "default", "uid": "u"}]}],
            "sandboxConfig": {"labels": {"a": "b"}}}}},
          "status": {"desired": 1, "succeeded": 0, "failed": 0, "pulling": 0,
                     "firstSyncStatus": {"syncAt": null, "status": "Succeeded"},
                     "futureCounter": 7}
        }"#;
        let ni: NodeImage = serde_json::from_str(json).unwrap();
        let image = &ni.spec.images["nginx"];
        assert_eq!(image.pull_secrets[0].namespace, "kruise-daemon-config");
        let tag = image.tag("1.25").unwrap();
        assert_eq!(tag.version, 2);
        assert!(tag.if_not_present());
        assert_eq!(tag.timeout(), Duration::from_secs(30));
        assert_eq!(tag.backoff_limit(), DEFAULT_PULL_BACKOFF_LIMIT);
        assert_eq!(tag.active_deadline(), Some(Duration::from_secs(1200)));
        assert_eq!(
            tag.owner_references[0].kind.as_deref(),
            Some("ImagePullJob")
        );
        let status = ni.status.unwrap();
        assert_eq!(status.desired, 1);
        assert_eq!(status.waiting, 0);
        assert!(status.image_statuses.is_empty());
    }

    #[test]
    fn a_tag_without_pull_policy_gets_kruise_defaults() {
        let tag = ImageTagSpec::default();
        assert_eq!(tag.timeout(), DEFAULT_PULL_TIMEOUT);
        assert_eq!(tag.backoff_limit(), 3);
        assert_eq!(tag.active_deadline(), None);
        assert!(!tag.if_not_present());
    }

    #[test]
    fn status_counters_are_always_written_and_empty_image_statuses_omitted() {
        let json = serde_json::to_value(NodeImageStatus::default()).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"desired":0,"succeeded":0,"failed":0,"pulling":0,"waiting":0})
        );
    }

    #[test]
    fn tag_status_serializes_like_go_with_omitempty() {
        let s = tag_status("v1", ImagePullPhase::Pulling, 0);
        assert_eq!(
            serde_json::to_string(&s).unwrap(),
            r#"{"tag":"v1","phase":"Pulling"}"#
        );
        let s = ImageTagStatus {
            progress: 100,
            image_id: "nginx@sha256:1".into(),
            version: 3,
            ..tag_status("v1", ImagePullPhase::Succeeded, 3)
        };
        assert_eq!(
            serde_json::to_string(&s).unwrap(),
            r#"{"tag":"v1","phase":"Succeeded","progress":100,"version":3,"imageID":"nginx@sha256:1"}"#
        );
    }

    #[test]
    fn an_unknown_tag_phase_parses_and_counts_nowhere() {
        let s: ImageTagStatus =
            serde_json::from_str(r#"{"tag":"v1","phase":"Verifying","extra":true}"#).unwrap();
        assert_eq!(s.phase, ImagePullPhase::Other("Verifying".into()));
        let mut status = NodeImageStatus::default();
        status.image_statuses.insert(
            "a".into(),
            ImageStatus {
                tags: vec![
                    s,
                    tag_status("v2", ImagePullPhase::Succeeded, 1),
                    tag_status("v3", ImagePullPhase::Failed, 1),
                    tag_status("v4", ImagePullPhase::Pulling, 1),
                ],
            },
        );
        status.image_statuses.insert(
            "b".into(),
            ImageStatus {
                tags: vec![
                    tag_status("v1", ImagePullPhase::Waiting, 1),
                    tag_status("v2", ImagePullPhase::Succeeded, 1),
                ],
            },
        );
        status.recount(7);
        assert_eq!(
            (
                status.desired,
                status.succeeded,
                status.failed,
                status.pulling,
                status.waiting
            ),
            (7, 2, 1, 1, 1)
        );
    }

    #[test]
    fn tag_status_lookup_needs_the_same_tag_and_version() {
        let image = ImageStatus {
            tags: vec![tag_status("v1", ImagePullPhase::Succeeded, 2)],
        };
        assert!(image.tag_status("v1", 2).is_some());
        assert!(image.tag_status("v1", 1).is_none());
        assert!(image.tag_status("v2", 2).is_none());
    }

    #[test]
    fn sort_tags_orders_by_tag_bytes() {
        let mut image = ImageStatus {
            tags: ["latest", "1.10", "1.9", "Z"]
                .into_iter()
                .map(|t| tag_status(t, ImagePullPhase::Waiting, 0))
                .collect(),
        };
        image.sort_tags();
        let tags: Vec<_> = image.tags.iter().map(|t| t.tag.as_str()).collect();
        assert_eq!(tags, ["1.10", "1.9", "Z", "latest"]);
    }

    #[test]
    fn pulling_until_all_tasks_finish_at_the_spec_version() {
        let mut spec = NodeImageSpec::default();
        spec.images.insert(
            "nginx".into(),
            ImageSpec {
                tags: vec![ImageTagSpec {
                    tag: "1".into(),
                    version: 2,
                    ..Default::default()
                }],
                ..Default::default()
            },
        );
        let mut status = NodeImageStatus::default();
        status.image_statuses.insert(
            "nginx".into(),
            ImageStatus {
                tags: vec![tag_status("1", ImagePullPhase::Pulling, 2)],
            },
        );
        status.recount(spec.desired());
        assert_eq!(status.desired, 1);
        assert!(status.is_pulling(&spec));

        status.image_statuses.get_mut("nginx").unwrap().tags[0].phase = ImagePullPhase::Succeeded;
        status.recount(spec.desired());
        assert!(!status.is_pulling(&spec));

        status.image_statuses.get_mut("nginx").unwrap().tags[0].version = 1;
        assert!(status.is_pulling(&spec));
    }
}
