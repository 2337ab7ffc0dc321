//! The runtime's container events (CRI `GetContainerEvents`) as a test sees them: followed from
//! a task of their own, and known to be subscribed only once an event the test caused came
//! through (the runtime answers the call only with its first event, so nothing else tells).

use std::time::Duration;

use futures::StreamExt;
use kruised::cri::{ContainerEvent, ContainerEventKind, CriError, KubeletService, RuntimeService};
use tokio::sync::mpsc;
use tokio_util::task::AbortOnDropHandle;

use super::kubelet::{ContainerSpec, Kubelet, RunningPod};
use super::within;

/// A followed event stream.
pub struct Events {
    rx: mpsc::UnboundedReceiver<Result<ContainerEvent, CriError>>,
    _task: AbortOnDropHandle<()>,
    /// The last event through, for a wait's failure.
    last: Option<ContainerEvent>,
}

impl Events {
    /// Follows the events of `kubelet`'s runtime, and returns once they come through: a
    /// container this creates (and removes) in `pod`'s sandbox shows up as `Created`.
    /// `Err` is the stream's first answer when it is not a stream of events
    /// ([`CriError::Unsupported`] on containerd 1.6), or `Ok(None)`'s counterpart: the stream
    /// ended without an event.
    pub async fn subscribe(
        kubelet: &Kubelet,
        pod: &RunningPod,
        limit: Duration,
    ) -> Result<Events, Option<CriError>> {
        let mut stream = kubelet.runtime().container_events();
        let (tx, rx) = mpsc::unbounded_channel();
        let task = AbortOnDropHandle::new(tokio::spawn(async move {
            while let Some(item) = stream.next().await {
                if tx.send(item).is_err() {
                    return;
                }
            }
        }));
        let mut events = Events {
            rx,
            _task: task,
            last: None,
        };
        let probe = ContainerSpec::sleeper("events-probe", &pod.spec.containers[0].image);
        let subscribed = within(limit, "the first event through the stream", async {
            for attempt in 0.. {
                let id = kubelet
                    .create(&pod.spec, &pod.sandbox_id, &probe, attempt)
                    .await;
                let seen = events
                    .next_within(Duration::from_secs(2), |e| {
                        e.container_id == id && e.kind == ContainerEventKind::Created
                    })
                    .await;
                let _ = kubelet.runtime().remove_container(&id).await;
                match seen {
                    Ok(true) => return Ok(()),
                    Ok(false) => continue,
                    Err(e) => return Err(e),
                }
            }
            unreachable!("the loop returns")
        })
        .await;
        subscribed.map(|()| events)
    }

    /// Waits up to `limit` for an event that `matches`: `Ok(true)` when it came, `Ok(false)`
    /// when none did, `Err` when the stream failed or ended.
    async fn next_within(
        &mut self,
        limit: Duration,
        mut matches: impl FnMut(&ContainerEvent) -> bool,
    ) -> Result<bool, Option<CriError>> {
        let found = tokio::time::timeout(limit, async {
            loop {
                let e = self.rx.recv().await.ok_or(None)?.map_err(Some)?;
                let found = matches(&e);
                self.last = Some(e);
                if found {
                    return Ok::<(), Option<CriError>>(());
                }
            }
        })
        .await;
        found.map_or(Ok(false), |r| r.map(|()| true))
    }

    /// Waits for an event that `matches`, failing the test with `what` and the last event that
    /// came through after `limit` or when the stream fails. (A stream is no state, so this is
    /// no [`crate::wait`]: each event is seen once, here.)
    pub async fn wait_for(
        &mut self,
        limit: Duration,
        what: &str,
        matches: impl FnMut(&ContainerEvent) -> bool,
    ) {
        match self.next_within(limit, matches).await {
            Ok(true) => {}
            Ok(false) => panic!(
                "{what}: no such event within {limit:?}; the last through: {:#?}",
                self.last
            ),
            Err(e) => panic!(
                "{what}: the event stream ended: {e:?}; the last through: {:#?}",
                self.last
            ),
        }
    }
}
