//! The stops recreate requests made, written on their pods ([`crate::controller::provenance`]):
//! the pod's next pass writes the stops its annotation lacks, merged into the annotation as the
//! watched copy of the pod has it, or as a list of the pod by name gives it where pods are not
//! watched (kruised's RBAC lists pods; it does not get them).

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::ListParams;
use kube::runtime::reflector::ObjectRef;

use super::controller::{RETRY, RecreateController};
use super::decide::Key;
use crate::controller::provenance::PodId;
use crate::k8s::pods::Pods;
use crate::k8s::{keys, write};

/// Writes the stops recorded for the pod `key` that it does not show yet. A write that fails
/// is logged and tried again on a pass of its own where it may go through later (throttling, a
/// server error); otherwise the stops are not written (the log, the event and
/// `kruised_container_stops_total` still have them).
pub(super) async fn write_stops_or_retry(shared: &RecreateController, key: &Key) {
    let Err(e) = write_stops(shared, key).await else {
        return;
    };
    if write::is_retryable(&e) {
        tracing::warn!(pod = %key.1, error = %e, "recording the stops on the pod failed; trying again");
        shared.queue.retry_after(key.clone(), RETRY, &shared.cancel);
    } else {
        tracing::warn!(pod = %key.1, error = %e, "cannot record the stops on the pod; they are left out");
        if let Some(id) = shared.book.unwritten(&key.0, &key.1) {
            shared.book.forget(&id.uid);
        }
    }
}

async fn write_stops(shared: &RecreateController, key: &Key) -> Result<(), kube::Error> {
    let Some(pod_id) = shared.book.unwritten(&key.0, &key.1) else {
        return Ok(());
    };
    let pods = Pods::namespaced(shared.client.clone(), &key.0);
    let Some(pod) = current_pod(shared, &pods, &pod_id).await? else {
        // gone, or replaced by another pod of the same name: nothing to write on
        shared.book.forget(&pod_id.uid);
        return Ok(());
    };
    let Some(value) = shared.book.update(&pod_id, pod.annotations()) else {
        if let Some(held) = pod.annotations().get(keys::LAST_RESTARTS) {
            shared.book.written(&pod_id, held);
        }
        return Ok(());
    };
    write::patch_pod_annotation(&pods, &pod_id.name, keys::LAST_RESTARTS, Some(&value)).await?;
    shared.book.written(&pod_id, &value);
    tracing::debug!(pod = %key.1, stops = %value, "recorded the stops on the pod");
    Ok(())
}

/// The pod `id` as the node's watch has it, else as the API lists it; `None` if no pod of that
/// name has that UID.
async fn current_pod(
    shared: &RecreateController,
    pods: &Pods,
    id: &PodId,
) -> Result<Option<Pod>, kube::Error> {
    let watched = shared
        .pods
        .as_ref()
        .and_then(|watched| {
            watched
                .store()
                .get(&ObjectRef::new(&id.name).within(&id.namespace))
        })
        .filter(|p| p.uid().as_deref() == Some(id.uid.as_str()));
    if let Some(pod) = watched {
        return Ok(Some((*pod).clone()));
    }
    let listed = pods
        .list(&ListParams::default().fields(&format!("metadata.name={}", id.name)))
        .await?;
    Ok(listed
        .into_iter()
        .find(|p| p.uid().as_deref() == Some(id.uid.as_str())))
}
