//! What one version of a pod says of an in-place update, taken from the pod alone (no I/O):
//! the manager's grace annotation and its images, the `InPlaceUpdateReady` gate, the spec's
//! images and env-from-metadata hashes, the kubelet's container IDs and `Ready`, and the
//! container IDs of kruised's `runtime-containers-meta` annotation. Bounded: at most
//! [`MAX_CONTAINERS`] containers are kept, whatever the pod holds.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

use crate::cri::split_container_id;
use crate::hash::env::expected_env_hash;
use crate::k8s::keys;

/// The most containers of a pod a timeline follows (a pod may list more; the rest are not
/// followed, so a hostile pod cannot make a timeline large).
pub const MAX_CONTAINERS: usize = 32;

/// The longest image name kept as it is; a longer one is kept as its head and a hash of the
/// whole ([`bounded_image`]), so that a pod cannot make the memory grow by its image names.
pub const MAX_IMAGE_LEN: usize = 256;

/// `image` as a timeline keeps it: itself up to [`MAX_IMAGE_LEN`] bytes, else its head and a
/// hash of the whole (two names are still told apart).
pub fn bounded_image(image: &str) -> String {
    use std::hash::{Hash, Hasher};
    if image.len() <= MAX_IMAGE_LEN {
        return image.to_string();
    }
    let mut h = std::collections::hash_map::DefaultHasher::new();
    image.hash(&mut h);
    let mut head = MAX_IMAGE_LEN / 2;
    while !image.is_char_boundary(head) {
        head -= 1;
    }
    format!("{}...#{:016x}", &image[..head], h.finish())
}

/// One container of the spec: its image and the env-from-metadata hash the pod's metadata
/// gives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecContainer {
    /// Its name.
    pub name: String,
    /// The spec's image.
    pub image: String,
    /// [`expected_env_hash`] of it.
    pub env_hash: u64,
}

/// One container as the kubelet reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatusContainer {
    /// Its name.
    pub name: String,
    /// The runtime ID (without `<runtime>://`), empty before the kubelet gives one.
    pub id: String,
    /// Whether it runs.
    pub running: bool,
}

/// What one version of a pod says (see the module's head).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodFacts {
    /// The images of the manager's grace annotation, by container (those of the spec only);
    /// `None` without the annotation.
    pub grace: Option<BTreeMap<String, String>>,
    /// `InPlaceUpdateReady` is False.
    pub gate_false: bool,
    /// The pod's `Ready` condition is True.
    pub ready: bool,
    /// The spec's containers.
    pub spec: Vec<SpecContainer>,
    /// The kubelet's container statuses.
    pub statuses: Vec<StatusContainer>,
    /// The runtime IDs of kruised's `runtime-containers-meta`, by container.
    pub meta_ids: BTreeMap<String, String>,
}

/// The part of the manager's `UpdateSpec` (kruise `pkg/util/inplaceupdate`) that the grace
/// annotation carries and a timeline needs.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct GraceSpec {
    #[serde(default)]
    container_images: Option<BTreeMap<String, String>>,
}

impl PodFacts {
    /// The facts of `pod`.
    pub fn of(pod: &Pod) -> PodFacts {
        let empty = BTreeMap::new();
        let annotations = pod.metadata.annotations.as_ref().unwrap_or(&empty);
        let labels = pod.metadata.labels.as_ref().unwrap_or(&empty);
        let spec: Vec<SpecContainer> = pod
            .spec
            .iter()
            .flat_map(|s| s.containers.iter())
            .take(MAX_CONTAINERS)
            .map(|c| SpecContainer {
                name: c.name.clone(),
                image: bounded_image(c.image.as_deref().unwrap_or_default()),
                env_hash: expected_env_hash(c, labels, annotations),
            })
            .collect();
        let grace = annotations
            .get(keys::INPLACE_UPDATE_GRACE)
            .or_else(|| annotations.get(keys::INPLACE_UPDATE_GRACE_OLD))
            .map(|raw| {
                // a malformed value still says an update is coming: its images are unknown
                let images = serde_json::from_str::<GraceSpec>(raw)
                    .ok()
                    .and_then(|g| g.container_images)
                    .unwrap_or_default();
                images
                    .into_iter()
                    .filter(|(name, _)| spec.iter().any(|c| c.name == *name))
                    .map(|(name, image)| (name, bounded_image(&image)))
                    .collect()
            });
        let conditions = || {
            pod.status
                .iter()
                .flat_map(|s| s.conditions.iter().flatten())
        };
        let gate_false =
            conditions().any(|c| c.type_ == keys::INPLACE_UPDATE_READY && c.status == "False");
        let ready = conditions().any(|c| c.type_ == "Ready" && c.status == "True");
        let statuses = pod
            .status
            .iter()
            .flat_map(|s| s.container_statuses.iter().flatten())
            .take(MAX_CONTAINERS)
            .map(|s| StatusContainer {
                name: s.name.clone(),
                id: s
                    .container_id
                    .as_deref()
                    .map(|id| split_container_id(id).1.to_string())
                    .unwrap_or_default(),
                running: s.state.as_ref().is_some_and(|st| st.running.is_some()),
            })
            .collect();
        let meta_ids = keys::parse_runtime_containers_meta(annotations)
            .ok()
            .flatten()
            .map(|m| {
                m.containers
                    .into_iter()
                    .take(MAX_CONTAINERS)
                    .map(|c| (c.name, split_container_id(&c.container_id).1.to_string()))
                    .collect()
            })
            .unwrap_or_default();
        PodFacts {
            grace,
            gate_false,
            ready,
            spec,
            statuses,
            meta_ids,
        }
    }

    /// The kubelet's status of container `name`.
    pub fn status(&self, name: &str) -> Option<&StatusContainer> {
        self.statuses.iter().find(|s| s.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_grace_annotations_images_gate_ready_and_ids_are_read_from_the_pod() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "annotations": {
                "apps.kruise.io/inplace-update-grace":
                    "{\"revision\":\"r2\",\"containerImages\":{\"main\":\"app:v2\",\"ghost\":\"x\"},\"graceSeconds\":15}",
                "apps.kruise.io/runtime-containers-meta":
                    "{\"containers\":[{\"name\":\"main\",\"containerID\":\"containerd://c1\"}]}"
            }},
            "spec": {"containers": [{"name": "main", "image": "app:v1"}]},
            "status": {
                "conditions": [
                    {"type": "InPlaceUpdateReady", "status": "False"},
                    {"type": "Ready", "status": "True"}
                ],
                "containerStatuses": [{"name": "main", "containerID": "containerd://c1",
                    "image": "app:v1", "imageID": "", "ready": true, "restartCount": 0,
                    "state": {"running": {}}}]
            }
        }))
        .expect("a pod");
        let f = PodFacts::of(&pod);
        assert_eq!(
            f.grace,
            Some([("main".to_string(), "app:v2".to_string())].into()),
            "a container the spec does not have is left out"
        );
        assert!(f.gate_false && f.ready);
        assert_eq!(f.spec[0].image, "app:v1");
        assert_eq!(f.status("main").map(|s| s.id.as_str()), Some("c1"));
        assert_eq!(f.meta_ids.get("main").map(String::as_str), Some("c1"));
    }

    #[test]
    fn a_malformed_grace_annotation_still_announces_an_update_without_images() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "annotations": {"inplace-update-grace": "{not json"}},
            "spec": {"containers": [{"name": "main", "image": "app:v1"}]}
        }))
        .expect("a pod");
        assert_eq!(PodFacts::of(&pod).grace, Some(BTreeMap::new()));
    }

    #[test]
    fn a_long_image_name_is_kept_short_and_still_told_from_another() {
        let a = format!("registry.example/{}:v1", "x".repeat(10_000));
        let b = format!("registry.example/{}:v2", "x".repeat(10_000));
        assert!(bounded_image(&a).len() < 2 * MAX_IMAGE_LEN);
        assert_ne!(bounded_image(&a), bounded_image(&b));
        assert_eq!(bounded_image("app:v1"), "app:v1");
    }
}
