//! Watches of the API objects of this node, each kept in an in-memory store: the node's pods
//! (field selector `spec.nodeName`), the NodeImage and NodePodProbe named after the node, and
//! the node's active ContainerRecreateRequests.
//!
//! A watch relists on `410 Gone`, backs off on errors, prunes what the daemon never reads, marks
//! its readiness condition once the first list is in, and tells subscribers what changed.
//!
//! Objects are read one by one, leniently ([`read_lenient`]): a typed list fails whole on one
//! object it cannot read, and a recreate request is written by any tenant (kruise's CRD does not
//! even require its `spec`), so one unreadable object would stop the node's watch and keep the
//! daemon unready. Go's decoder, kruise-daemon's, reads a missing field as its zero value; so
//! does this, and an object that still cannot be read is kept by its name alone, with a
//! warning.

use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::health::ReadinessCondition;

/// How many unread changes a slow subscriber may fall behind before it must resync (every
/// subscriber treats `Lagged` as a resync against the store, so this bounds memory, not
/// correctness). A broadcast channel allocates all its slots up front: 4096 slots cost 512 KiB
/// per watch, 2 MiB of the daemon's 4.8 MiB heap on a 110-pod node (massif); 256 cost 32 KiB.
const CHANGE_BUFFER: usize = 256;

/// Something that changed in a watched store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change<K: Resource<DynamicType = ()>> {
    /// The object was added or modified.
    Applied(ObjectRef<K>),
    /// A (re)list found the object, at this resourceVersion. The store may hold a newer
    /// version by the time a subscriber reads it: a subscriber that must tell the objects as
    /// they were at start from later changes compares with this.
    Listed(ObjectRef<K>, Option<String>),
    /// The object was deleted.
    Deleted(ObjectRef<K>),
    /// The store was (re)filled from a full list: objects may have vanished without a
    /// `Deleted` (after `410 Gone`). Subscribers compare with the store.
    Resynced,
}

/// A watched, cached set of objects.
#[derive(Clone)]
pub struct Watched<K: Resource<DynamicType = ()> + Clone + 'static>
where
    K::DynamicType: Eq + Hash + Clone,
{
    store: Store<K>,
    changes: broadcast::Sender<Change<K>>,
    generation: watch::Receiver<u64>,
}

impl<K> Watched<K>
where
    K: Resource<DynamicType = ()> + Clone + Debug + Send + Sync + 'static,
{
    /// The current objects.
    pub fn store(&self) -> &Store<K> {
        &self.store
    }

    /// The current objects, as a list.
    pub fn state(&self) -> Vec<Arc<K>> {
        self.store.state()
    }

    /// A receiver of changes from now on. A receiver that lags gets
    /// `RecvError::Lagged` and should treat it as [`Change::Resynced`].
    pub fn subscribe(&self) -> broadcast::Receiver<Change<K>> {
        self.changes.subscribe()
    }

    /// A counter bumped after every change is applied to the store, for waiting on a condition
    /// without polling.
    pub fn generation(&self) -> watch::Receiver<u64> {
        self.generation.clone()
    }

    /// Waits until the first list is in the store.
    pub async fn wait_synced(&self) {
        // the writer lives as long as the watch task; an ended task also ends the wait
        let _ = self.store.wait_until_ready().await;
    }
}

/// Starts a watch of `api` with `config`, once `after` is done, in a task that ends with
/// `cancel`. `prune` drops what the daemon never reads before the object is stored. `ready`
/// becomes ready after the first list.
#[expect(
    clippy::too_many_arguments,
    reason = "each is a distinct part of the watch; the callers read best with them spelt out"
)]
pub fn spawn<K>(
    name: &'static str,
    api: Api<K>,
    config: watcher::Config,
    prune: fn(&mut K),
    ready: ReadinessCondition,
    cancel: CancellationToken,
    tracker: &tokio_util::task::TaskTracker,
    liveness: &crate::health::Liveness,
    after: impl std::future::Future<Output = ()> + Send + 'static,
) -> Watched<K>
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
{
    let (reader, mut writer) = reflector::store();
    let (changes, _) = broadcast::channel(CHANGE_BUFFER);
    let (gen_tx, generation) = watch::channel(0u64);
    let tx = changes.clone();
    ready.set_not_ready("waiting for the first list");
    // The first list reads the API server's watch cache (resourceVersion=0), as client-go's
    // informers do: a fleet's daemons starting at once never read etcd, and before
    // Kubernetes 1.31 a consistent list of pods by `spec.nodeName` reads every pod of the
    // cluster from etcd, for each node. A relist (after 410 Gone) reads the current state
    // instead: an API server whose cache lags must not take the store back in time.
    let api: Api<DynamicObject> = Api::all_with(api.into_client(), &ApiResource::erase::<K>(&()));
    let open = move |config: watcher::Config| {
        Box::pin(
            watcher(api.clone(), config)
                .default_backoff()
                .filter_map(move |e| {
                    futures::future::ready(match e {
                        Ok(e) => typed::<K>(e, prune).map(Ok),
                        Err(e) => Some(Err(e)),
                    })
                }),
        )
    };
    let mut first = config.clone().any_semantic();
    // a paged list cannot be served from the cache: kube sends no resourceVersion=0 with a
    // limit (the cache ignores it anyway; a node's objects are few)
    first.page_size = None;
    let mut stream = open(first);
    let mut relists_consistent = false;
    // a watch that ends while the daemon runs leaves its store frozen: liveness says so
    let alive = liveness.task(name, &cancel);
    tracker.spawn(
        async move {
            let _alive = alive;
            // the watch starts once `after` is done (the served versions are known)
            tokio::select! {
                () = cancel.cancelled() => return,
                () = after => {}
            }
            let mut synced = false;
            let mut last_error: Option<String> = None;
            loop {
                let event = tokio::select! {
                    () = cancel.cancelled() => break,
                    e = stream.next() => e,
                };
                if synced && !relists_consistent && matches!(event, Some(Ok(watcher::Event::Init)))
                {
                    // the first relist: from here on every list is a consistent read
                    relists_consistent = true;
                    stream = open(config.clone());
                    continue;
                }
                if let Some(Ok(e)) = &event {
                    writer.apply_watcher_event(e);
                }
                let change = match event {
                    None => break,
                    Some(Ok(watcher::Event::Apply(o))) => {
                        Some(Change::Applied(ObjectRef::from_obj(&o)))
                    }
                    Some(Ok(watcher::Event::InitApply(o))) => Some(Change::Listed(
                        ObjectRef::from_obj(&o),
                        o.meta().resource_version.clone(),
                    )),
                    Some(Ok(watcher::Event::Delete(o))) => {
                        Some(Change::Deleted(ObjectRef::from_obj(&o)))
                    }
                    Some(Ok(watcher::Event::Init)) => None,
                    Some(Ok(watcher::Event::InitDone)) => {
                        if !synced {
                            tracing::info!("synced");
                        } else {
                            tracing::info!("relisted");
                        }
                        synced = true;
                        last_error = None;
                        ready.set_ready();
                        Some(Change::Resynced)
                    }
                    Some(Err(e)) => {
                        // log each distinct error once; the watcher backs off by itself
                        let text = e.to_string();
                        if last_error.as_deref() != Some(&text) {
                            tracing::warn!(error = %text, "watch failed; retrying with backoff");
                            last_error = Some(text.clone());
                        }
                        if !synced {
                            ready.set_not_ready(format!("not listed yet: {text}"));
                        }
                        None
                    }
                };
                if let Some(c) = change {
                    // no subscriber is fine
                    let _ = tx.send(c);
                    gen_tx.send_modify(|g| *g += 1);
                }
            }
            tracing::debug!("watch stopped");
        }
        .instrument(tracing::info_span!("watch", resource = name)),
    );
    Watched {
        store: reader,
        changes,
        generation,
    }
}

/// A watch event of raw objects as one of `K`'s, each object read with [`read_lenient`] and
/// pruned; `None` for an object that cannot be read at all (it is left out, with a warning).
fn typed<K>(e: watcher::Event<DynamicObject>, prune: fn(&mut K)) -> Option<watcher::Event<K>>
where
    K: Resource<DynamicType = ()> + DeserializeOwned,
{
    let read = |o: DynamicObject| {
        let mut k = read_lenient::<K>(o)?;
        prune(&mut k);
        Some(k)
    };
    Some(match e {
        watcher::Event::Apply(o) => watcher::Event::Apply(read(o)?),
        watcher::Event::InitApply(o) => watcher::Event::InitApply(read(o)?),
        watcher::Event::Delete(o) => watcher::Event::Delete(read(o)?),
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitDone => watcher::Event::InitDone,
    })
}

/// Reads `o` as a `K` the way Go's decoder would: a missing `spec` is an empty one. An object
/// that still cannot be read (a field of the wrong type: the API server's schema lets few
/// through) is kept by its name alone, its spec empty, with a warning naming it and why, so the
/// rest of the watch goes on; `None` where even that cannot be read.
pub fn read_lenient<K>(o: DynamicObject) -> Option<K>
where
    K: Resource<DynamicType = ()> + DeserializeOwned,
{
    let with_spec = |mut v: serde_json::Value| {
        if let Some(map) = v.as_object_mut() {
            map.entry("spec").or_insert_with(|| serde_json::json!({}));
        }
        v
    };
    let error = match serde_json::to_value(&o).map(with_spec) {
        Ok(v) => match serde_json::from_value::<K>(v) {
            Ok(k) => return Some(k),
            Err(e) => e.to_string(),
        },
        Err(e) => e.to_string(),
    };
    tracing::warn!(kind = %K::kind(&()), namespace = ?o.namespace(), name = %o.name_any(), %error,
        "an object could not be read: kept by its name alone");
    let bare = with_spec(serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "metadata": serde_json::to_value(&o.metadata).ok()?,
    }));
    serde_json::from_value::<K>(bare).ok()
}

/// The field selector of the node's pods.
pub fn pods_of_node(node: &str) -> watcher::Config {
    watcher::Config::default().fields(&format!("spec.nodeName={node}"))
}

/// The field selector of a cluster-scoped object named after the node.
pub fn named(node: &str) -> watcher::Config {
    watcher::Config::default().fields(&format!("metadata.name={node}"))
}

/// Drops what the daemon never reads from a pod, to keep the cache small on a full node:
/// managed fields, the last-applied copy, volumes, scheduling constraints. The containers stay
/// whole: kubelet ≤ 1.30 hashes every field of a container, volume mounts included.
pub fn prune_pod(pod: &mut Pod) {
    pod.metadata.managed_fields = None;
    if let Some(a) = pod.metadata.annotations.as_mut() {
        a.remove(crate::k8s::keys::LAST_APPLIED_CONFIGURATION);
    }
    if let Some(spec) = pod.spec.as_mut() {
        spec.volumes = None;
        spec.affinity = None;
        spec.tolerations = None;
        spec.topology_spread_constraints = None;
        spec.node_selector = None;
        spec.image_pull_secrets = None;
    }
}

/// Drops managed fields, the one part of every object the daemon never reads.
pub fn prune_managed_fields<K: Resource>(o: &mut K) {
    o.meta_mut().managed_fields = None;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::k8s::crd::{ContainerRecreateRequest, NodePodProbe};

    fn raw(v: serde_json::Value) -> DynamicObject {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn an_object_without_a_spec_is_read_with_an_empty_one_as_go_reads_it() {
        // kruise's CRDs require no spec: `kubectl create` of metadata alone is accepted, and
        // 2c6dc4e's typed watch then failed whole ("missing field spec"), kruised never ready
        let crr: ContainerRecreateRequest = read_lenient(raw(serde_json::json!({
            "apiVersion": "apps.kruise.io/v1alpha1", "kind": "ContainerRecreateRequest",
            "metadata": {"name": "r", "namespace": "tenant"}
        })))
        .unwrap();
        assert_eq!(crr.spec.pod_name, "");
        assert!(crr.spec.containers.is_empty());
        let npp: NodePodProbe = read_lenient(raw(serde_json::json!({
            "apiVersion": "apps.kruise.io/v1alpha1", "kind": "NodePodProbe",
            "metadata": {"name": "node-a"}
        })))
        .unwrap();
        assert!(npp.spec.pod_probes.is_empty());
    }

    #[test]
    fn an_object_with_a_field_of_the_wrong_type_is_kept_by_its_name_alone() {
        let crr: ContainerRecreateRequest = read_lenient(raw(serde_json::json!({
            "apiVersion": "apps.kruise.io/v1alpha1", "kind": "ContainerRecreateRequest",
            "metadata": {"name": "odd", "namespace": "tenant", "uid": "u1"},
            "spec": {"podName": "p", "containers": "not a list"}
        })))
        .unwrap();
        assert_eq!(crr.metadata.name.as_deref(), Some("odd"));
        assert_eq!(crr.metadata.uid.as_deref(), Some("u1"));
        assert!(crr.spec.containers.is_empty());
    }

    #[test]
    fn pruning_a_pod_keeps_what_the_daemon_reads_and_the_containers_whole() {
        let mut pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "p", "namespace": "ns", "uid": "u1",
                "labels": {"app": "x"},
                "annotations": {
                    "apps.kruise.io/inplace-update-state": "{}",
                    "kubectl.kubernetes.io/last-applied-configuration": "{\"big\":true}"
                },
                "managedFields": [{"manager": "kubectl"}]
            },
            "spec": {
                "nodeName": "n1",
                "volumes": [{"name": "v", "emptyDir": {}}],
                "tolerations": [{"operator": "Exists"}],
                "containers": [{
                    "name": "main", "image": "nginx:1",
                    "env": [{"name": "E", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}}],
                    "volumeMounts": [{"name": "v", "mountPath": "/v"}]
                }]
            },
            "status": {"containerStatuses": [{"name": "main", "containerID": "containerd://1",
                "image": "nginx:1", "imageID": "sha256:1", "ready": true, "restartCount": 0}]}
        }))
        .unwrap();
        let whole = pod.clone();
        prune_pod(&mut pod);
        assert!(pod.metadata.managed_fields.is_none());
        let annotations = pod.metadata.annotations.as_ref().unwrap();
        assert!(annotations.contains_key("apps.kruise.io/inplace-update-state"));
        assert!(!annotations.contains_key("kubectl.kubernetes.io/last-applied-configuration"));
        let spec = pod.spec.as_ref().unwrap();
        assert!(spec.volumes.is_none() && spec.tolerations.is_none());
        assert_eq!(spec.containers[0].env.as_ref().unwrap().len(), 1);
        // the legacy kubelet hash covers the whole container
        let before =
            crate::hash::kubelet::hash_container_legacy(&whole.spec.unwrap().containers[0]);
        assert_eq!(
            crate::hash::kubelet::hash_container_legacy(&spec.containers[0]),
            before
        );
        assert_eq!(pod.status.unwrap().container_statuses.unwrap().len(), 1);
    }
}
