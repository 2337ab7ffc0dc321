//! The capability controllers, one per folder or file: container meta, image pull, recreate
//! requests, pod probes. Each reads the daemon's watches and runtime and writes through
//! `k8s::write`.

pub mod containermeta;
#[cfg(feature = "test-util")]
pub mod failpoint;
pub mod httpget;
pub mod imagepull;
pub mod kill;
pub mod podprobe;
pub mod provenance;
pub mod queue;
pub mod recreate;
pub mod target;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use prometheus_client::registry::Registry;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::DaemonConfig;
use crate::cri::{Container, ContainerFilter, CriError, RuntimeService, Runtimes};
use crate::health::Liveness;
use crate::k8s::crd::{ContainerRecreateRequest, NodeImage, NodePodProbe};
use crate::k8s::keys;
use crate::k8s::watch as kwatch;
use crate::k8s::write::EventSink;

/// Starts every enabled controller on the daemon's tasks: their metrics on `registry`
/// (kruised's, `kruised_` prefixed), their queues' on `queues` (client-go's work queue families,
/// which the caller registered on its unprefixed root: [`queue::QueueMetrics::register`]).
pub fn start(ctx: &Context, registry: &mut Registry, queues: &queue::QueueMetrics) {
    #[cfg(feature = "test-util")]
    failpoint::announce();
    let stops = provenance::Book::register(registry);
    containermeta::start(
        ctx,
        registry.sub_registry_with_prefix("containermeta"),
        queues,
        &stops,
    );
    imagepull::start(ctx, registry.sub_registry_with_prefix("imagepull"));
    recreate::start(
        ctx,
        registry.sub_registry_with_prefix("recreate"),
        queues,
        &stops,
    );
    podprobe::start(ctx, registry.sub_registry_with_prefix("podprobe"));
}

/// The daemon's shared handles, passed to each capability controller.
#[derive(Clone)]
pub struct Context {
    /// Validated settings.
    pub config: Arc<DaemonConfig>,
    /// The API client.
    pub client: kube::Client,
    /// The runtimes, once found (`None` until then).
    pub runtimes: watch::Receiver<Option<Runtimes>>,
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
    if let Some(d) = failpoint::stuck_pass() {
        return d;
    }
    STUCK_PASS
}

/// Every container the runtime holds of the pod `uid` (the kubelet's pod-UID label), every
/// attempt of each: container meta, recreate requests and `kruised explain` look them up alike.
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
    pub fn watch_queue<K>(&self, name: &'static str, queue: &queue::WorkQueue<K>)
    where
        K: Clone + Eq + std::hash::Hash + std::fmt::Debug + Send + Sync + 'static,
    {
        let queue = queue.clone();
        let limit = stuck_pass();
        self.liveness.register_check(name, move || {
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
        });
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

/// `at + d`, or the farthest time an `Instant` holds past `at` when that overflows (an `Instant`
/// plus a duration from the API panics on overflow; the durations are clamped to a year at the
/// boundary, and this keeps any later sum safe too).
pub fn later(at: tokio::time::Instant, d: Duration) -> tokio::time::Instant {
    at.checked_add(d)
        .or_else(|| at.checked_add(crate::k8s::crd::MAX_API_DURATION))
        .unwrap_or(at)
}

/// What a program wrote (a hook's stderr, `env`'s), fit for a log line or an event: lossy UTF-8,
/// trimmed, control characters (a forged log line's newline, a terminal's escapes) as `?`, at
/// most `limit` bytes cut on a character boundary with `…` after.
pub fn bounded_text(bytes: &[u8], limit: usize) -> String {
    let head = &bytes[..bytes.len().min(limit.saturating_mul(4))];
    let text: String = String::from_utf8_lossy(head)
        .trim()
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    if text.len() <= limit {
        return text;
    }
    let mut end = limit;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// `d` ± 20 %, so many nodes do not retry in step.
pub fn jitter(d: Duration) -> Duration {
    d.mul_f64(rand::random_range(0.8..1.2))
}

/// The pause after failed attempt `attempt` (0-based): `base × 2^attempt`, at most `cap`. The
/// daemon's one exponential back-off: [`Backoff`] walks it with jitter; the image puller's tags
/// count their attempts themselves.
pub fn exponential(attempt: u32, base: Duration, cap: Duration) -> Duration {
    base.saturating_mul(2u32.saturating_pow(attempt.min(31)))
        .min(cap)
}

/// Jittered exponential back-off: `min`, doubling up to `max`, each pause ± 20 %.
#[derive(Clone, Debug)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    attempt: u32,
}

impl Backoff {
    /// A back-off that starts at `min` and doubles up to `max`.
    pub fn new(min: Duration, max: Duration) -> Self {
        Backoff {
            min,
            max,
            attempt: 0,
        }
    }

    /// The next pause; each call doubles the one after it, up to the maximum.
    pub fn pause(&mut self) -> Duration {
        let d = exponential(self.attempt, self.min, self.max);
        self.attempt = self.attempt.saturating_add(1);
        jitter(d)
    }

    /// Starts again from the minimum (after a success).
    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exponential_backoff_doubles_from_the_base_up_to_the_cap() {
        let (b, cap) = (Duration::from_secs(1), Duration::from_secs(30));
        let steps: Vec<_> = (0..7).map(|i| exponential(i, b, cap).as_secs()).collect();
        assert_eq!(steps, [1, 2, 4, 8, 16, 30, 30]);
        assert_eq!(exponential(u32::MAX, b, cap), cap);
        assert_eq!(
            exponential(2, Duration::from_millis(1), cap),
            Duration::from_millis(4)
        );
    }

    #[test]
    fn backoff_doubles_up_to_its_maximum_and_starts_again_after_a_reset() {
        let mut b = Backoff::new(Duration::from_millis(500), Duration::from_secs(4));
        let pauses: Vec<Duration> = (0..6).map(|_| b.pause()).collect();
        let nominal = [500, 1000, 2000, 4000, 4000, 4000];
        for (got, want) in pauses.iter().zip(nominal) {
            let want = Duration::from_millis(want);
            assert!(
                *got >= want.mul_f64(0.8) && *got <= want.mul_f64(1.2),
                "{got:?} is not {want:?} ± 20 %"
            );
        }
        b.reset();
        assert!(b.pause() <= Duration::from_millis(600));
    }
}
