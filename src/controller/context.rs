//! What the daemon hands each capability controller: its settings, the API client, the
//! watches, the runtimes, and the task machinery (spawn, drain, liveness, events).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::queue::WorkQueue;
use crate::config::DaemonConfig;
use crate::cri::RuntimeHandle;
use crate::health::Liveness;
use crate::k8s::crd::{ContainerRecreateRequest, NodeImage, NodePodProbe};
use crate::k8s::watch as kwatch;
use crate::k8s::write::EventSink;

/// The daemon's shared handles, passed to each capability controller.
#[derive(Clone)]
pub struct Context {
    /// Validated settings.
    pub config: Arc<DaemonConfig>,
    /// The API client.
    pub client: kube::Client,
    /// The runtimes, once found.
    pub runtimes: RuntimeHandle,
    /// The node's pods, if pods are watched.
    pub pods: Option<kwatch::Watched<Pod>>,
    /// The NodeImage named after the node.
    pub node_images: kwatch::Watched<NodeImage>,
    /// The node's active recreate requests.
    pub recreate_requests: kwatch::Watched<ContainerRecreateRequest>,
    /// The NodePodProbe named after the node, if probes are enabled.
    pub pod_probes: Option<kwatch::Watched<NodePodProbe>>,
    /// Ends every task when cancelled.
    pub cancel: CancellationToken,
    /// Tracks every task, for the drain.
    pub tracker: TaskTracker,
    /// What `/healthz` and the systemd watchdog check: every long-lived task alive, no key of a
    /// work queue worked on for too long.
    pub liveness: Liveness,
    /// What `/readyz` reports; a controller may add a condition that is always ready and notes
    /// what it sees (`/readyz?verbose`).
    pub readiness: crate::health::Readiness,
}

/// How long one pass over a key may take before liveness fails: every call in a pass has its
/// own time limit (the runtime's, the API client's) far below it, and kills run on tasks of
/// their own, so a pass this long is stuck, and a restart is what helps. A test build may
/// shorten it ([`stuck_pass`], `failpoint`).
pub const STUCK_PASS: Duration = Duration::from_secs(300);

/// [`STUCK_PASS`], or in a test build what `KRUISED_FAILPOINT_STUCK_PASS_SECS` sets
/// (`failpoint`).
pub fn stuck_pass() -> Duration {
    #[cfg(feature = "test-util")]
    if let Some(d) = super::failpoint::stuck_pass() {
        return d;
    }
    STUCK_PASS
}

impl Context {
    /// Spawns the long-lived task `name` (it runs until the daemon stops): on the daemon's
    /// tracker, and watched by liveness, so that it ending early (a panic, a return) fails
    /// `/healthz` and the systemd watchdog instead of leaving a controller quietly half-dead.
    pub fn spawn(
        &self,
        name: &'static str,
        task: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        let guard = self.liveness.task(name, &self.cancel);
        self.tracker.spawn(async move {
            let _alive = guard;
            task.await;
        });
    }

    /// Makes liveness fail while a key of `queue` has been worked on for longer than
    /// [`STUCK_PASS`] (a pass waiting on a call that never ends).
    pub fn watch_queue<K>(&self, name: &'static str, queue: &WorkQueue<K>)
    where
        K: Clone + Eq + std::hash::Hash + std::fmt::Debug + Send + Sync + 'static,
    {
        self.liveness
            .register_check(name, stuck_check(name, queue, stuck_pass()));
    }

    /// A sink of the events `component` records about this node's objects, on the daemon's
    /// tasks.
    pub fn event_sink(&self, component: &str) -> EventSink {
        EventSink::spawn(
            self.client.clone(),
            component,
            &self.config.node_name,
            self.cancel.clone(),
            &self.tracker,
        )
    }
}

/// What [`Context::watch_queue`] registers with liveness: why `queue` (named `name`) fails
/// it, when a key has been in work for longer than `limit`.
pub fn stuck_check<K>(
    name: &'static str,
    queue: &WorkQueue<K>,
    limit: Duration,
) -> impl Fn() -> Option<String> + Send + Sync + 'static
where
    K: Clone + Eq + std::hash::Hash + std::fmt::Debug + Send + Sync + 'static,
{
    let queue = queue.clone();
    move || {
        queue
            .longest_active()
            .filter(|(_, d)| *d > limit)
            .map(|(key, d)| {
                format!(
                    "{name}: {key:?} in work for {}s (limit {}s)",
                    d.as_secs(),
                    limit.as_secs()
                )
            })
    }
}
