//! Observing a pod: what a pass sees, and what `kruised explain` shows, taken the same way so
//! the two cannot disagree. The pod's containers in its runtime; the annotation as the pod
//! carries it and as it should be, every env hash the runtime gave filled in (read where the
//! annotation holds none for the running container); and, where env from metadata is
//! followed, what the restart plan needs: per running container, whether its image matches
//! the spec's, and what the memory holds of it.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use tokio::time::Instant;

use super::decide;
use super::env::{self, EnvError, EnvSource};
use super::memory::{Memory, View};
use super::restart;
use super::settle::RestartDelay;
use crate::controller::containers::{containers_of_pod, newest_by_name};
use crate::cri::{Container, CriError, RemoteRuntime};
use crate::hash::env::current_env_hash;
use crate::k8s::keys::{self, RuntimeContainerMetaSet};

/// What was seen of a pod.
pub struct Observed {
    /// The pod.
    pub pod: Arc<Pod>,
    /// Its runtime.
    pub runtime: RemoteRuntime,
    /// The runtime's name, as the kubelet's container IDs begin (`containerd`).
    pub runtime_name: String,
    /// Every container of the pod in the runtime.
    pub containers: Vec<Container>,
    /// The annotation as the pod carries it (`None`: none, or malformed).
    pub old: Option<RuntimeContainerMetaSet>,
    /// The annotation as it should be, every env hash the runtime gave filled in.
    pub meta: RuntimeContainerMetaSet,
    /// The container whose env could not be read, and why, if one could not (the last).
    pub env_error: Option<(String, EnvError)>,
    /// Where each env read came from.
    pub env_read: Vec<EnvSource>,
    /// Containers whose env is still to read, left for the pod's next pass
    /// ([`env::ENV_READS_PER_PASS`]).
    pub env_deferred: usize,
    /// Where env from metadata is followed: what a restart is decided on.
    pub restarts: Option<RestartInputs>,
    /// When it was observed.
    pub now: Instant,
}

/// What the restart plan needs beyond the pod: per container of the new annotation that runs
/// (in its order), whether its image matches the spec's, and what the memory holds of it.
pub struct RestartInputs {
    /// The containers' names, in the annotation's order.
    pub names: Vec<String>,
    /// Per container: whether the spec image resolves to the one it runs, where asked.
    pub image_id_matches: Vec<Option<bool>>,
    /// What the memory holds of them.
    pub memory: View,
}

/// Observes `pod`, whose containers run in `runtime` (named `runtime_name` in their IDs);
/// `with_env`: whether env from metadata is followed; `memory` and `delay`: what is
/// remembered of the pod, and how restarts wait for the kubelet.
pub async fn observe_pod(
    pod: Arc<Pod>,
    runtime: RemoteRuntime,
    runtime_name: String,
    with_env: bool,
    memory: &Memory,
    delay: RestartDelay,
) -> Result<Observed, CriError> {
    let uid = pod.uid().unwrap_or_default();
    let containers = containers_of_pod(&runtime, &uid).await?;
    let old = match keys::parse_runtime_containers_meta(pod.annotations()) {
        Ok(m) => m,
        Err(e) => {
            tracing::warn!(error = %e, "ignoring a malformed annotation; it will be rewritten");
            None
        }
    };
    let newest = newest_by_name(&containers);
    let (mut meta, to_read) =
        decide::build_meta(&pod, &runtime_name, &newest, old.as_ref(), with_env);
    let mut env_error = None;
    let mut env_read = Vec::new();
    // a few at once, within a budget: the rest are the next pass's (`env::read_envs`)
    let wanted: Vec<(String, String)> = to_read
        .into_iter()
        .filter(|r| decide::spec_of(&pod, &r.name).is_some())
        .map(|r| (r.name, r.id))
        .collect();
    let reads = env::read_envs(&runtime, &wanted).await;
    for (name, result) in reads.done {
        let Some(spec) = decide::spec_of(&pod, &name) else {
            continue;
        };
        match result {
            Ok((values, source)) => {
                env_read.push(source);
                let hash = current_env_hash(spec, |n| values.get(n).cloned());
                if let Some(e) = meta.containers.iter_mut().find(|e| e.name == name) {
                    e.hashes.extracted_env_from_metadata_hash = hash;
                }
            }
            Err(e) => env_error = Some((name, e)),
        }
    }
    // per container of the new annotation that runs, where env from metadata is followed:
    // whether its image matches the spec's, then what the memory holds of it, as of `now`
    let mut names = Vec::new();
    let mut running = Vec::new();
    let mut image_id_matches = Vec::new();
    for entry in meta.containers.iter().filter(|_| with_env) {
        let (Some(spec), Some(current)) = (
            decide::spec_of(&pod, &entry.name),
            newest.get(entry.name.as_str()),
        ) else {
            continue;
        };
        image_id_matches.push(restart::image_id_matches(&runtime, spec, current).await);
        names.push(entry.name.clone());
        running.push((entry.name.as_str(), current.id.as_str()));
    }
    let now = Instant::now();
    let restarts = with_env.then(|| RestartInputs {
        memory: memory.view(&uid, &running, now, delay),
        names,
        image_id_matches,
    });
    Ok(Observed {
        pod,
        runtime,
        runtime_name,
        containers,
        old,
        meta,
        env_error,
        env_read,
        env_deferred: reads.deferred,
        restarts,
        now,
    })
}

/// `pod` observed as a daemon that just started observes it: env from metadata followed,
/// nothing remembered. What `kruised explain` shows.
pub async fn observe_as_started(
    pod: Arc<Pod>,
    runtime: RemoteRuntime,
    runtime_name: String,
) -> Result<Observed, CriError> {
    let memory = Memory::default();
    observe_pod(
        pod,
        runtime,
        runtime_name,
        true,
        &memory,
        RestartDelay::Auto,
    )
    .await
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;
    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::controller::context::{STUCK_PASS, stuck_check};
    use crate::controller::queue::WorkQueue;
    use crate::cri::fake::FakeRuntime;
    use crate::cri::{ContainerConfig, ContainerMetadata, SandboxMetadata};
    use crate::health::Liveness;

    const UID: &str = "0f6a3c9e-uid";

    /// A kruise-managed pod of `n` running containers, each reading the label `version` into
    /// its env, carrying `annotation` as its runtime-containers-meta where given.
    fn pod(n: usize, annotation: Option<String>) -> Pod {
        let names: Vec<String> = (0..n).map(|i| format!("c{i}")).collect();
        let containers: Vec<_> = names
            .iter()
            .map(|name| {
                json!({"name": name, "image": "busybox:v1", "env": [{"name": "VERSION",
                    "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['version']"}}}]})
            })
            .collect();
        let statuses: Vec<_> = names
            .iter()
            .map(|name| {
                json!({"name": name, "image": "busybox:v1", "imageID": "", "ready": true,
                "restartCount": 0, "state": {"running": {}}})
            })
            .collect();
        let mut annotations = serde_json::Map::new();
        if let Some(a) = annotation {
            annotations.insert(keys::RUNTIME_CONTAINERS_META.into(), a.into());
        }
        serde_json::from_value(json!({
            "metadata": {"name": "web-0", "namespace": "tenant", "uid": UID,
                "labels": {"version": "v1"}, "annotations": annotations,
                "ownerReferences": [{"apiVersion": "apps.kruise.io/v1alpha1", "kind": "CloneSet",
                    "name": "web", "uid": "cs", "controller": true}]},
            "spec": {"containers": containers},
            "status": {"containerStatuses": statuses},
        }))
        .expect("a pod")
    }

    /// A fake runtime running `pod(n)`'s containers, their env `VERSION=v1` in the verbose
    /// status where `env_in_info`, else only through `exec env`; and a client of it.
    async fn runtime_of(
        dir: &std::path::Path,
        n: usize,
        env_in_info: bool,
    ) -> (FakeRuntime, RemoteRuntime) {
        let rt = FakeRuntime::start(&dir.join("cri.sock"), "containerd")
            .await
            .expect("the fake runtime starts");
        let labels = |name: Option<&str>| {
            let mut l: crate::cri::StringMap = [
                (keys::KUBELET_POD_UID, UID),
                (keys::KUBELET_POD_NAME, "web-0"),
                (keys::KUBELET_POD_NAMESPACE, "tenant"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
            if let Some(name) = name {
                l.insert(keys::KUBELET_CONTAINER_NAME.into(), name.into());
            }
            l
        };
        let sandbox = rt.add_sandbox(
            SandboxMetadata {
                name: "web-0".into(),
                uid: UID.into(),
                namespace: "tenant".into(),
                attempt: 0,
            },
            labels(None),
            "10.0.0.5",
        );
        for i in 0..n {
            let name = format!("c{i}");
            let config = ContainerConfig {
                metadata: ContainerMetadata {
                    name: name.clone(),
                    attempt: 0,
                },
                image: "busybox:v1".into(),
                envs: vec![("VERSION".into(), "v1".into())],
                labels: labels(Some(&name)),
                ..Default::default()
            };
            rt.add_container(&sandbox, config, env_in_info, true);
        }
        let client = RemoteRuntime::new(rt.endpoint(), None, Default::default());
        (rt, client)
    }

    async fn observe(pod: Pod, runtime: &RemoteRuntime) -> Observed {
        observe_pod(
            Arc::new(pod),
            runtime.clone(),
            "containerd".into(),
            true,
            &Memory::default(),
            RestartDelay::Auto,
        )
        .await
        .expect("the pod is observed")
    }

    #[tokio::test(start_paused = true)]
    async fn sixty_four_containers_whose_exec_env_hangs_cost_a_pass_its_env_budget_and_healthz_stays_healthy()
     {
        // the attack: a runtime without the env in its status (so kruised execs `env`), and
        // containers whose `env` never answers; before, one pass execed into each in turn, 5 s
        // apiece: 64 of them kept the pass in work 320 s, past the 300 s stuck check
        const N: usize = 64;
        let dir = tempfile::tempdir().expect("a temporary directory");
        let (rt, client) = runtime_of(dir.path(), N, false).await;
        rt.delay("ExecSync", Duration::from_secs(24 * 3600));
        // the pass as the daemon's worker holds it, watched by liveness as `/healthz` is
        let liveness = Liveness::new();
        let queue = WorkQueue::new();
        liveness.register_check(
            "containermeta",
            stuck_check("containermeta", &queue, STUCK_PASS),
        );
        let cancel = CancellationToken::new();
        queue.add("tenant/web-0");
        let key = queue.next(&cancel).await.expect("the pod's key");
        let started = Instant::now();
        let pass = observe(pod(N, None), &client);
        tokio::pin!(pass);
        // systemd's watchdog asks liveness every second (of the paused clock) while it runs
        let mut watchdog = tokio::time::interval(Duration::from_secs(1));
        let mut unhealthy = None;
        let seen = loop {
            tokio::select! {
                seen = &mut pass => break seen,
                _ = watchdog.tick() => {
                    if let Err(e) = liveness.check() {
                        unhealthy.get_or_insert((started.elapsed(), e.to_string()));
                    }
                }
            }
        };
        let took = started.elapsed();
        queue.done(&key);
        assert_eq!(unhealthy, None, "liveness failed during the pass");
        assert!(
            took <= env::ENV_READ_BUDGET,
            "the pass took {took:?} of the paused clock, more than its env budget"
        );
        let execs = rt.state().call_count("ExecSync");
        assert_eq!(
            execs,
            env::ENV_READS_PER_PASS as u64,
            "one exec per container read this pass, none for those left"
        );
        assert_eq!(seen.env_deferred, N - env::ENV_READS_PER_PASS);
        let (container, error) = seen.env_error.expect("the hanging reads fail the pass");
        assert!(
            container.starts_with('c'),
            "{container}: {error} names a container"
        );
        assert!(
            seen.meta
                .containers
                .iter()
                .all(|c| c.hashes.extracted_env_from_metadata_hash == 0),
            "no env was read"
        );
        assert_eq!(liveness.check(), Ok(()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_pod_of_twenty_containers_has_eight_envs_read_a_pass_and_the_rest_in_the_next_passes()
    {
        const N: usize = 20;
        let dir = tempfile::tempdir().expect("a temporary directory");
        let (rt, client) = runtime_of(dir.path(), N, false).await;
        let mut annotation = None;
        let mut left = Vec::new();
        for _ in 0..3 {
            let seen = observe(pod(N, annotation.clone()), &client).await;
            assert!(seen.env_error.is_none(), "{:?}", seen.env_error);
            left.push(seen.env_deferred);
            annotation = Some(seen.meta.to_annotation_value());
        }
        assert_eq!(left, [12, 4, 0], "envs left after each pass");
        assert_eq!(
            rt.state().call_count("ExecSync"),
            N as u64,
            "each read once"
        );
        let meta = keys::parse_runtime_containers_meta(
            &[(
                keys::RUNTIME_CONTAINERS_META.to_string(),
                annotation.expect("written"),
            )]
            .into_iter()
            .collect(),
        )
        .expect("the annotation parses")
        .expect("it is there");
        assert!(
            meta.containers
                .iter()
                .all(|c| c.hashes.extracted_env_from_metadata_hash != 0),
            "every container's env hash known after three passes"
        );
    }
}
