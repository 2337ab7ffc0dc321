//! What a pass observes: the pod's requests as the watch has them, the runtime of a request's
//! containers, what the runtime shows of each container the request names, and the pod's IPs
//! where the node's pods are watched.

use std::collections::BTreeMap;
use std::sync::Arc;

use kube::ResourceExt;

use super::controller::RecreateController;
use super::decide::{Key, Observed, key_of};
use crate::cri::{Container, CriError, RemoteRuntime, RuntimeLookupError, RuntimeService};
use crate::k8s::crd::ContainerRecreateRequest;
use crate::k8s::keys;

/// The requests of pod `key` as the watch has them, but those this daemon completed that the
/// watch does not show completed yet (a copy older than the completion).
pub fn requests_of(shared: &RecreateController, key: &Key) -> Vec<Arc<ContainerRecreateRequest>> {
    let (requests, done): (Vec<Arc<ContainerRecreateRequest>>, Vec<_>) = shared
        .requests
        .state()
        .into_iter()
        .filter(|r| key_of(r) == *key)
        .partition(|r| !completed_here(shared, r));
    for r in done {
        tracing::debug!(request = %r.name_any(), "completed here; waiting for the watch to show it");
    }
    requests
}

fn completed_here(shared: &RecreateController, r: &ContainerRecreateRequest) -> bool {
    r.uid()
        .is_some_and(|uid| shared.memory.completed_here(&uid))
}

/// The runtime of the request's containers: the one their `statusContext` IDs name, else the
/// node's primary runtime.
pub fn runtime_of(
    shared: &RecreateController,
    r: &ContainerRecreateRequest,
) -> Result<(RemoteRuntime, String), RuntimeLookupError> {
    let ids = r
        .spec
        .containers
        .iter()
        .filter_map(|c| c.status_context.as_ref())
        .map(|c| c.container_id.as_str());
    shared.runtimes.for_containers(ids)
}

/// The UID of the request's pod, as its label gives it (empty: none).
pub fn pod_uid(r: &ContainerRecreateRequest) -> String {
    r.labels()
        .get(keys::CRR_POD_UID_LABEL)
        .cloned()
        .unwrap_or_default()
}

/// What the runtime (named `runtime_name`) shows of the newest container of each name the
/// request lists, by name; `newest` is the pod's newest container of each name. One call per
/// distinct name the pod has: a request may list a name any number of times (kruise's
/// webhook checks the list on create only), and a pass must not cost a call per entry.
pub async fn containers(
    (runtime, runtime_name): (&RemoteRuntime, &str),
    r: &ContainerRecreateRequest,
    newest: &BTreeMap<&str, &Container>,
) -> Result<BTreeMap<String, Observed>, CriError> {
    let mut observed = BTreeMap::new();
    for c in r.spec.containers.iter() {
        if observed.contains_key(&c.name) {
            continue;
        }
        let Some(running) = newest.get(c.name.as_str()) else {
            continue;
        };
        let status = runtime.container_status(&running.id, false).await?;
        observed.insert(
            c.name.clone(),
            Observed {
                container_id: format!("{runtime_name}://{}", running.id),
                state: status.state,
                restart_count: running
                    .annotations
                    .get(keys::KUBELET_CONTAINER_RESTART_COUNT)
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0),
                started_at_ns: status.started_at,
            },
        );
    }
    Ok(observed)
}

/// The status IPs of the request's pod (UID `pod_uid`), from the node's pods where they are
/// watched: a host-network pod's sandbox has none.
pub fn status_ips(
    shared: &RecreateController,
    r: &ContainerRecreateRequest,
    pod_uid: &str,
) -> Vec<String> {
    shared
        .pods
        .as_ref()
        .and_then(|pods| {
            pods.state().into_iter().find(|p| {
                p.uid().as_deref() == Some(pod_uid)
                    && p.namespace() == r.namespace()
                    && p.name_any() == r.spec.pod_name
            })
        })
        .map(|p| crate::k8s::pod_ips(&p))
        .unwrap_or_default()
}
