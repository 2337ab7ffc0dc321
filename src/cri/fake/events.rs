//! The fake's container events (CRI `GetContainerEvents`), shaped as its dialect sends them:
//! containerd 2.x adds sandbox events and the statuses of the sandbox's containers, CRI-O
//! sandbox start and stop events and the sandbox's status alone. Every dialect that streams
//! answers the call only with its first event, as a Go gRPC server does: a quiet node sends
//! nothing, not even the response headers.

use std::pin::Pin;

use futures::{Stream, StreamExt};
use tokio::sync::broadcast;
use tonic::Status;

use super::super::{ContainerEvent, ContainerEventKind, convert, proto};
use super::Backend;
use super::state::{FakeState, now_ns};

/// The server side of `GetContainerEvents`.
pub(super) type EventStream =
    Pin<Box<dyn Stream<Item = Result<proto::ContainerEventResponse, Status>> + Send>>;

/// The event of `kind` about `subject` (a container, or the sandbox itself) of sandbox
/// `sandbox_id`, as the dialect sends it; built while the sandbox is still in `st`.
pub(super) fn event(
    st: &FakeState,
    subject: &str,
    sandbox_id: &str,
    kind: ContainerEventKind,
) -> ContainerEvent {
    let dialect = st.dialect();
    let sandbox_status = st
        .sandboxes
        .get(sandbox_id)
        .filter(|_| dialect.sends_sandbox_status())
        .map(|s| Box::new(s.clone()));
    let container_statuses = if dialect.sends_container_statuses() {
        st.containers
            .values()
            .filter(|c| c.pod_sandbox_id == sandbox_id)
            .map(|c| st.status_of(c))
            .collect()
    } else {
        Vec::new()
    };
    ContainerEvent {
        container_id: subject.to_string(),
        kind,
        created_at: now_ns(),
        pod_sandbox_id: Some(sandbox_id.to_string()),
        sandbox_status,
        container_statuses,
    }
}

/// The sandbox's own events of `kinds`, those the dialect sends.
pub(super) fn sandbox_events(
    st: &FakeState,
    sandbox_id: &str,
    kinds: &[ContainerEventKind],
) -> Vec<ContainerEvent> {
    kinds
        .iter()
        .filter(|k| st.dialect().sends_sandbox_event(**k))
        .map(|k| event(st, sandbox_id, sandbox_id, *k))
        .collect()
}

/// An event as the runtime sends it.
fn message(e: &ContainerEvent) -> proto::ContainerEventResponse {
    let mut m = convert::container_event_message(e);
    if let Some(s) = &e.sandbox_status {
        m.pod_sandbox_status = convert::sandbox_status_message(s).status;
    }
    m.containers_statuses = e
        .container_statuses
        .iter()
        .filter_map(|c| convert::container_status_message(c).status)
        .collect();
    m
}

impl Backend {
    /// Sends events to every open stream (and wakes the tests waiting on the state).
    pub(super) fn send(&self, events: Vec<ContainerEvent>) {
        self.touch();
        for e in events {
            // no subscriber is fine
            let _ = self.events.send(e);
        }
    }

    /// Sends the event of `kind` about container `container_id` of `sandbox_id`.
    pub(super) fn emit(&self, container_id: &str, sandbox_id: &str, kind: ContainerEventKind) {
        let e = event(&self.lock(), container_id, sandbox_id, kind);
        self.send(vec![e]);
    }
}

async fn next(rx: &mut broadcast::Receiver<ContainerEvent>) -> Option<ContainerEvent> {
    loop {
        match rx.recv().await {
            Ok(e) => return Some(e),
            // a slow reader misses events, as with a real runtime's bounded buffer
            Err(broadcast::error::RecvError::Lagged(_)) => continue,
            Err(broadcast::error::RecvError::Closed) => return None,
        }
    }
}

/// `GetContainerEvents`, as the dialect answers it.
pub(super) async fn get_container_events(shared: &Backend) -> Result<EventStream, Status> {
    // subscribe before the call is counted: a test that waits for the count may emit at once
    let mut rx = shared.events.subscribe();
    shared.enter("GetContainerEvents").await?;
    let (dialect, off) = {
        let st = shared.lock();
        (st.dialect(), st.events_off)
    };
    dialect.events_call()?;
    if off {
        return Ok(Box::pin(futures::stream::empty()));
    }
    let mut broken = shared.break_events.subscribe();
    broken.mark_unchanged();
    let gone = || Status::unavailable("event stream broken by the test");
    // as a Go gRPC server (containerd, CRI-O) does, answer the call only with its first
    // message: on a quiet runtime the client waits for the response headers
    let first = tokio::select! {
        e = next(&mut rx) => e,
        _ = broken.changed() => return Err(gone()),
    };
    // then every event, until the test breaks the stream with an error
    let rest = futures::stream::unfold(Some((rx, broken)), move |open| async move {
        let (mut rx, mut broken) = open?;
        tokio::select! {
            e = next(&mut rx) => Some((Ok(message(&e?)), Some((rx, broken)))),
            _ = broken.changed() => Some((Err(gone()), None)),
        }
    });
    let first = futures::stream::iter(first.map(|e| Ok(message(&e))));
    Ok(Box::pin(first.chain(rest)))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures::StreamExt;

    use super::super::{Dialect, FakeRuntime};
    use crate::cri::{
        ContainerConfig, ContainerEvent, ContainerEventKind as K, ContainerMetadata, CriError,
        KubeletService, RemoteRuntime, RuntimeService, SandboxConfig, SandboxMetadata,
    };

    const LIMIT: Duration = Duration::from_secs(10);

    /// What the kubelet does to one pod's life: a sandbox, a container created and started,
    /// the sandbox stopped and removed. Returns the runtime's events about it, the sandbox's
    /// ID and the container's.
    async fn a_pods_life(
        dialect: Dialect,
        expected: usize,
    ) -> (Vec<ContainerEvent>, String, String) {
        let dir = tempfile::tempdir().unwrap();
        let fake = FakeRuntime::start_as(&dir.path().join("cri.sock"), dialect)
            .await
            .unwrap();
        let rt = RemoteRuntime::new(fake.endpoint(), None, Default::default());
        let mut stream = rt.container_events();
        let reader = tokio::spawn(async move {
            let mut seen = Vec::new();
            while seen.len() < expected {
                match stream.next().await {
                    Some(Ok(e)) => seen.push(e),
                    other => panic!("the stream ended after {seen:?}: {other:?}"),
                }
            }
            seen
        });
        fake.wait_for(LIMIT, |s| s.call_count("GetContainerEvents") == 1)
            .await
            .expect("the events were asked for");
        let sandbox_config = SandboxConfig {
            metadata: SandboxMetadata {
                name: "web-0".into(),
                uid: "uid-1".into(),
                namespace: "default".into(),
                attempt: 0,
            },
            ..Default::default()
        };
        let sandbox = rt.run_pod_sandbox(sandbox_config.clone()).await.unwrap();
        let config = ContainerConfig {
            metadata: ContainerMetadata {
                name: "main".into(),
                attempt: 0,
            },
            image: "r.io/app:v1".into(),
            ..Default::default()
        };
        let container = rt
            .create_container(&sandbox, config, sandbox_config)
            .await
            .unwrap();
        rt.start_container(&container).await.unwrap();
        rt.stop_pod_sandbox(&sandbox).await.unwrap();
        rt.remove_pod_sandbox(&sandbox).await.unwrap();
        let events = tokio::time::timeout(LIMIT, reader)
            .await
            .unwrap_or_else(|_| panic!("{expected} events did not come"))
            .unwrap();
        (events, sandbox, container)
    }

    fn kinds(events: &[ContainerEvent]) -> Vec<(&str, K)> {
        events
            .iter()
            .map(|e| (e.container_id.as_str(), e.kind))
            .collect()
    }

    // seen on containerd 2.3.4, recorded in docs/runtimes.md
    // (the container events table)
    #[tokio::test]
    async fn containerd_2_sends_sandbox_events_and_every_event_carries_the_sandbox_and_its_containers()
     {
        let (events, s, c) = a_pods_life(Dialect::Containerd2, 7).await;
        assert_eq!(
            kinds(&events),
            [
                (s.as_str(), K::Created),
                (s.as_str(), K::Started),
                (c.as_str(), K::Created),
                (c.as_str(), K::Started),
                (c.as_str(), K::Stopped),
                (s.as_str(), K::Stopped),
                (s.as_str(), K::Deleted),
            ]
        );
        for e in &events {
            let status = e.sandbox_status.as_ref().expect("the sandbox's status");
            assert_eq!(status.sandbox.id, s);
            assert_eq!(status.sandbox.metadata.uid, "uid-1");
            assert_eq!(e.pod_sandbox_id.as_deref(), Some(s.as_str()));
        }
        assert!(events[1].container_statuses.is_empty(), "no container yet");
        for e in &events[2..] {
            assert_eq!(e.container_statuses.len(), 1, "{e:?}");
            assert_eq!(e.container_statuses[0].id, c);
        }
    }

    // seen on CRI-O 1.36.3 with enable_pod_events, recorded in docs/runtimes.md
    // (the container events table)
    #[tokio::test]
    async fn cri_o_sends_only_sandbox_starts_and_stops_and_never_the_containers_statuses() {
        let (events, s, c) = a_pods_life(Dialect::CriO, 5).await;
        assert_eq!(
            kinds(&events),
            [
                (s.as_str(), K::Started),
                (c.as_str(), K::Created),
                (c.as_str(), K::Started),
                (c.as_str(), K::Stopped),
                (s.as_str(), K::Stopped),
            ]
        );
        for e in &events {
            let status = e.sandbox_status.as_ref().expect("the sandbox's status");
            assert_eq!(status.sandbox.metadata.uid, "uid-1");
            assert!(e.container_statuses.is_empty(), "{e:?}");
        }
    }

    // seen on containerd 1.6.20 and on CRI-O 1.36.3 as it comes, recorded in the project's
    // docs/runtimes.md (the container events table)
    #[tokio::test]
    async fn containerd_1_6_has_no_events_and_cri_o_without_pod_events_ends_the_call_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let old = FakeRuntime::start_as(&dir.path().join("a.sock"), Dialect::Containerd16)
            .await
            .unwrap();
        let rt = RemoteRuntime::new(old.endpoint(), None, Default::default());
        let first = tokio::time::timeout(LIMIT, rt.container_events().next())
            .await
            .expect("containerd 1.6 answers at once");
        assert!(
            matches!(
                first,
                Some(Err(CriError::Unsupported {
                    call: "GetContainerEvents",
                    ..
                }))
            ),
            "{first:?}"
        );
        let crio = FakeRuntime::start_as(&dir.path().join("b.sock"), Dialect::CriOWithoutPodEvents)
            .await
            .unwrap();
        let rt = RemoteRuntime::new(crio.endpoint(), None, Default::default());
        let first = tokio::time::timeout(LIMIT, rt.container_events().next())
            .await
            .expect("CRI-O answers at once");
        assert!(first.is_none(), "{first:?}");
    }
}
