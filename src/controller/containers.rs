//! A pod's containers as the runtime holds them: every attempt of each, found by the kubelet's
//! pod-UID label, and the newest of each name (what the kubelet takes for the current one).
//! Container meta, recreate requests, pod probes, `kruised explain` and `kruised crictl ps`
//! look them up alike.

use std::collections::BTreeMap;

use crate::cri::{Container, ContainerFilter, CriError, RuntimeService};
use crate::k8s::keys;

/// Every container the runtime holds of the pod `uid` (the kubelet's pod-UID label), every
/// attempt of each.
pub async fn containers_of_pod<R: RuntimeService>(
    runtime: &R,
    uid: &str,
) -> Result<Vec<Container>, CriError> {
    runtime
        .list_containers(ContainerFilter {
            labels: [(keys::KUBELET_POD_UID.to_string(), uid.to_string())]
                .into_iter()
                .collect(),
            ..Default::default()
        })
        .await
}

/// The container's name as the kubelet labelled it.
fn name_of(c: &Container) -> Option<&str> {
    c.labels
        .get(keys::KUBELET_CONTAINER_NAME)
        .map(String::as_str)
}

/// Whether `c` is newer than `current`: a higher attempt, then a later creation.
fn is_newer(c: &Container, current: &Container) -> bool {
    (c.metadata.attempt, c.created_at) > (current.metadata.attempt, current.created_at)
}

/// The newest runtime container of each name (highest attempt, then latest creation): what the
/// kubelet considers the current one.
pub fn newest_by_name(containers: &[Container]) -> BTreeMap<&str, &Container> {
    let mut out: BTreeMap<&str, &Container> = BTreeMap::new();
    for c in containers {
        let Some(name) = name_of(c) else {
            continue;
        };
        if out.get(name).is_none_or(|cur| is_newer(c, cur)) {
            out.insert(name, c);
        }
    }
    out
}

/// The newest container named `name` among `containers` (as [`newest_by_name`] picks it).
pub fn newest_named<'a>(containers: &'a [Container], name: &str) -> Option<&'a Container> {
    containers.iter().filter(|c| name_of(c) == Some(name)).fold(
        None,
        |newest: Option<&Container>, c| match newest {
            Some(cur) if !is_newer(c, cur) => Some(cur),
            _ => Some(c),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::{ContainerMetadata, ContainerState, StringMap};

    fn container(id: &str, name: &str, attempt: u32, created_at: i64) -> Container {
        Container {
            id: id.into(),
            pod_sandbox_id: "s1".into(),
            metadata: ContainerMetadata {
                name: name.into(),
                attempt,
            },
            image: String::new(),
            image_ref: String::new(),
            state: ContainerState::Running,
            created_at,
            labels: [(keys::KUBELET_CONTAINER_NAME.to_string(), name.to_string())]
                .into_iter()
                .collect::<StringMap>(),
            annotations: StringMap::new(),
            image_id: String::new(),
            image_spec: Default::default(),
        }
    }

    #[test]
    fn the_newest_of_a_name_is_the_highest_attempt_then_the_latest_creation() {
        let cs = [
            container("a0", "app", 0, 30),
            container("a2", "app", 2, 10),
            container("a1", "app", 1, 20),
            container("s0", "side", 0, 5),
            container("s0b", "side", 0, 6),
        ];
        let newest = newest_by_name(&cs);
        assert_eq!(newest["app"].id, "a2");
        assert_eq!(newest["side"].id, "s0b");
        assert_eq!(newest_named(&cs, "app").map(|c| c.id.as_str()), Some("a2"));
        assert_eq!(
            newest_named(&cs, "side").map(|c| c.id.as_str()),
            Some("s0b")
        );
        assert!(newest_named(&cs, "none").is_none());
    }
}
