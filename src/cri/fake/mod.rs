//! An in-memory CRI runtime for tests: a real tonic server on a unix socket, so the daemon's real
//! client is what talks to it.
//!
//! It keeps sandboxes, containers (labels, annotations, state, env) and images, emits container
//! events, counts calls per RPC, and lets a test inject failures (with the runtimes' own words)
//! and delays per RPC, and stop and start it again on the same socket as a restarted runtime.
//! RPCs it does not model answer `Unimplemented`, as an older runtime would.
//!
//! It answers as one [`Dialect`]: containerd 1.6, containerd 2.x, CRI-O with or without pod
//! events, or the plain fake that the older tests were written against ([`FakeRuntime::start`]).
//!
//! - `dialect`: what each runtime answers differently;
//! - `state`: what the fake holds, and the image fields each dialect reports;
//! - `runtime`, `images`: the two CRI services;
//! - `events`: the container event stream.

mod content;
mod dialect;
mod events;
mod images;
mod runtime;
mod state;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{broadcast, oneshot};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Response, Status};

use super::proto::image_service_server::ImageServiceServer;
use super::proto::runtime_service_server::RuntimeServiceServer;
use super::{Endpoint, parts::*, types::*};

pub use dialect::{Dialect, ImageOfContainer};
pub use state::{FakeContainer, FakeState};

use state::Fault;

/// How long a stopping server may take to finish the calls in flight before it is left behind.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// The fake runtime's state as both of its gRPC services serve it, with what tells tests of
/// its changes.
#[derive(Clone)]
struct Backend {
    state: Arc<Mutex<FakeState>>,
    /// Bumped after every call, so tests wait on the state instead of polling it.
    changed: Arc<tokio::sync::watch::Sender<u64>>,
    events: broadcast::Sender<ContainerEvent>,
    /// Bumped to break every open event stream (with an error, as a runtime that goes away).
    break_events: Arc<tokio::sync::watch::Sender<u64>>,
    runtime_name: String,
}

impl Backend {
    fn lock(&self) -> MutexGuard<'_, FakeState> {
        // a test that panicked while holding the lock already failed; keep serving
        crate::sync::lock(&self.state)
    }

    /// Counts the call, then applies an injected delay or failure.
    async fn enter(&self, rpc: &str) -> Result<(), Status> {
        let (delay, fault) = {
            let mut st = self.lock();
            *st.calls.entry(rpc.to_string()).or_default() += 1;
            let delay = st.delays.get(rpc).copied();
            let fault = st
                .faults
                .get_mut(rpc)
                .and_then(|q| q.pop_front())
                .map(|f| Status::new(f.code, f.message));
            (delay, fault)
        };
        self.changed.send_modify(|n| *n += 1);
        if let Some(d) = delay {
            tokio::time::sleep(d).await;
        }
        fault.map_or(Ok(()), Err)
    }

    /// Wakes the tests waiting on the state.
    fn touch(&self) {
        self.changed.send_modify(|n| *n += 1);
    }

    /// A new ready host-network sandbox, with the events its runtime sends for a new one;
    /// returns its ID.
    fn new_sandbox(
        &self,
        md: SandboxMetadata,
        labels: StringMap,
        notes: StringMap,
        ip: &str,
    ) -> String {
        let (id, events) = {
            let mut st = self.lock();
            let id = st.insert_sandbox(md, labels, notes, ip);
            let kinds = [ContainerEventKind::Created, ContainerEventKind::Started];
            let events = events::sandbox_events(&st, &id, &kinds);
            (id, events)
        };
        self.send(events);
        id
    }
}

/// Whether `labels` has every label of `want`.
fn has_labels<'a>(
    labels: &StringMap,
    mut want: impl Iterator<Item = (&'a String, &'a String)>,
) -> bool {
    want.all(|(k, v)| labels.get(k) == Some(v))
}

/// The server of one run of the runtime, and how to end it.
struct Serving {
    shutdown: oneshot::Sender<()>,
    server: tokio::task::JoinHandle<()>,
}

/// A running fake runtime. Dropping it stops the server.
pub struct FakeRuntime {
    shared: Backend,
    socket: PathBuf,
    serving: Option<Serving>,
}

impl FakeRuntime {
    /// Starts a fake runtime named `runtime_name` (the container ID prefix the kubelet would
    /// use) listening on `socket`, answering as [`Dialect::Plain`].
    pub async fn start(socket: &Path, runtime_name: &str) -> std::io::Result<Self> {
        Self::start_named(socket, runtime_name, Dialect::Plain).await
    }

    /// Starts a fake runtime answering as `dialect` (and named as that runtime names itself)
    /// listening on `socket`.
    pub async fn start_as(socket: &Path, dialect: Dialect) -> std::io::Result<Self> {
        Self::start_named(socket, dialect.runtime_name(), dialect).await
    }

    async fn start_named(
        socket: &Path,
        runtime_name: &str,
        dialect: Dialect,
    ) -> std::io::Result<Self> {
        let (events, _) = broadcast::channel(1024);
        let shared = Backend {
            state: Arc::new(Mutex::new(FakeState::new(dialect))),
            changed: Arc::new(tokio::sync::watch::channel(0).0),
            events,
            break_events: Arc::new(tokio::sync::watch::channel(0).0),
            runtime_name: runtime_name.to_string(),
        };
        let mut rt = FakeRuntime {
            shared,
            socket: socket.to_path_buf(),
            serving: None,
        };
        rt.serve_again().await?;
        Ok(rt)
    }

    pub fn dialect(&self) -> Dialect {
        self.state().dialect()
    }

    /// The name it answers in `Version`: the prefix of the kubelet's container IDs.
    pub fn runtime_name(&self) -> &str {
        &self.shared.runtime_name
    }

    /// The kubelet's container ID of `id`: `<runtime name>://<id>`.
    pub fn kubelet_id(&self, id: &str) -> String {
        format!("{}://{id}", self.shared.runtime_name)
    }

    pub fn endpoint(&self) -> Endpoint {
        Endpoint::unix(&self.socket)
    }

    /// Locks the state for inspection or changes. Do not hold it across an await.
    pub fn state(&self) -> MutexGuard<'_, FakeState> {
        self.shared.lock()
    }

    /// Waits until `cond` holds of the state (checked after every call), at most `limit`.
    pub async fn wait_for(
        &self,
        limit: Duration,
        mut cond: impl FnMut(&FakeState) -> bool,
    ) -> Result<(), tokio::time::error::Elapsed> {
        let mut rx = self.shared.changed.subscribe();
        tokio::time::timeout(limit, async {
            // the state's lock is let go before waiting for the next change
            while !cond(&self.state()) {
                if rx.changed().await.is_err() {
                    return;
                }
            }
        })
        .await
    }

    /// Breaks every open container event stream with an error (`Unavailable`), as a runtime
    /// that restarts does; the calls made after it stream again.
    pub fn break_event_streams(&self) {
        self.shared.break_events.send_modify(|n| *n += 1);
    }

    /// The runtime goes away, as a stopped or crashed runtime process does: open event streams
    /// break, the calls in flight finish, the socket is removed and new calls find nothing to
    /// dial. What it holds stays (containers outlive their runtime's restart, as with
    /// containerd's shims and CRI-O's conmon); [`FakeRuntime::serve_again`] brings it back.
    pub async fn stop_serving(&mut self) {
        let Some(serving) = self.serving.take() else {
            return;
        };
        self.break_event_streams();
        let _ = serving.shutdown.send(());
        if tokio::time::timeout(STOP_GRACE, serving.server)
            .await
            .is_err()
        {
            tracing::warn!("fake runtime: calls still in flight after {STOP_GRACE:?}; left behind");
        }
        let _ = std::fs::remove_file(&self.socket);
    }

    /// Serves again on the same socket, with what it held: the runtime is back. Does nothing
    /// while it serves.
    pub async fn serve_again(&mut self) -> std::io::Result<()> {
        if self.serving.is_some() {
            return Ok(());
        }
        let _ = std::fs::remove_file(&self.socket);
        let listener = tokio::net::UnixListener::bind(&self.socket)?;
        let (tx, rx) = oneshot::channel::<()>();
        let svc = Svc(self.shared.clone());
        let server = tokio::spawn(async move {
            let result = tonic::transport::Server::builder()
                .add_service(RuntimeServiceServer::new(svc.clone()))
                .add_service(ImageServiceServer::new(svc.clone()))
                .add_service(content::server(svc))
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                    let _ = rx.await;
                })
                .await;
            if let Err(e) = result {
                tracing::error!(error = %e, "fake runtime server failed");
            }
        });
        self.serving = Some(Serving {
            shutdown: tx,
            server,
        });
        Ok(())
    }

    /// The next `n` calls of `rpc` fail with `code` (and a message saying they were injected),
    /// instead of the failures queued so far.
    pub fn fail_next(&self, rpc: &str, code: tonic::Code, n: usize) {
        let fault = Fault {
            code,
            message: format!("injected failure of {rpc}"),
        };
        self.state()
            .faults
            .insert(rpc.to_string(), std::iter::repeat_n(fault, n).collect());
    }

    /// The next call of `rpc` not failed yet fails with `code` and `message`: a runtime's own
    /// words (e.g. `Unknown` "ttrpc: closed" from containerd 1.6, `Cancelled` "operation was
    /// canceled" from containerd 2.3, each during a restart). Failures queue: calling it `n`
    /// times fails the next `n` calls.
    pub fn fail_next_with(&self, rpc: &str, code: tonic::Code, message: &str) {
        self.state()
            .faults
            .entry(rpc.to_string())
            .or_default()
            .push_back(Fault {
                code,
                message: message.to_string(),
            });
    }

    /// containerd's content ingests in flight from now on (`ListStatuses`); `None`: the
    /// content service answers `Unimplemented`, as CRI-O's (the default).
    pub fn set_ingests(&self, ingests: Option<Vec<crate::cri::containerd::content::Ingest>>) {
        self.state().ingests = ingests;
        self.shared.touch();
    }

    /// Every call of `rpc` is delayed by `delay` (zero removes it).
    pub fn delay(&self, rpc: &str, delay: Duration) {
        self.state().delays.insert(rpc.to_string(), delay);
    }

    /// The pulls sleeping out their delay (`PullImage.body`) now end at once, as they would
    /// after it: a long pull let finish when the test says. Later pulls keep their delay.
    pub fn end_pulls_in_flight(&self) {
        self.state().pulls_ended += 1;
        self.shared.touch();
    }

    /// Pulls of `image` fail with `code` and `message` (as a registry error would).
    pub fn fail_pulls_of(&self, image: &str, code: tonic::Code, message: &str) {
        self.state()
            .pull_failures
            .insert(image.to_string(), (code, message.to_string()));
    }

    /// Pulls of `image` fail as this runtime fails them where the registry answers `how`
    /// ([`Dialect::missing_tag`], [`Dialect::unauthorized`]).
    pub fn fail_pulls_as(&self, image: &str, how: fn(Dialect, &str) -> (tonic::Code, String)) {
        let (code, message) = how(self.dialect(), image);
        self.fail_pulls_of(image, code, &message);
    }

    /// Adds a ready host-network sandbox, with the events its runtime sends for a new one;
    /// returns its ID.
    pub fn add_sandbox(&self, metadata: SandboxMetadata, labels: StringMap, ip: &str) -> String {
        self.shared
            .new_sandbox(metadata, labels, StringMap::new(), ip)
    }

    /// Adds a running container to a sandbox; returns its ID.
    pub fn add_container(
        &self,
        sandbox_id: &str,
        config: ContainerConfig,
        env_in_info: bool,
        has_env_binary: bool,
    ) -> String {
        let state = ContainerState::Running;
        let mut st = self.state();
        let id = st.insert_container(sandbox_id, config, state, env_in_info, has_env_binary);
        drop(st);
        for kind in [ContainerEventKind::Created, ContainerEventKind::Started] {
            self.shared.emit(&id, sandbox_id, kind);
        }
        id
    }

    /// Sets a container's state as is (no event): e.g. `Created` for one not started yet.
    pub fn set_state(&self, id: &str, state: ContainerState) {
        if let Some(c) = self.state().containers.get_mut(id) {
            c.status.state = state;
        }
    }

    /// Marks a container exited (as if its process died), emitting a stop event.
    pub fn exit_container(&self, id: &str, exit_code: i32) {
        let sandbox = {
            let mut st = self.state();
            let Some(c) = st.containers.get_mut(id) else {
                return;
            };
            c.status.state = ContainerState::Exited;
            c.status.finished_at = state::now_ns();
            c.status.exit_code = exit_code;
            c.pod_sandbox_id.clone()
        };
        self.shared.emit(id, &sandbox, ContainerEventKind::Stopped);
    }

    /// Stops the server and waits for it.
    pub async fn stop(mut self) {
        self.stop_serving().await;
    }
}

impl Drop for FakeRuntime {
    fn drop(&mut self) {
        if let Some(serving) = self.serving.take() {
            let _ = serving.shutdown.send(());
        }
    }
}

#[derive(Clone)]
struct Svc(Backend);

fn unimplemented<T>(rpc: &str) -> Result<Response<T>, Status> {
    Err(Status::unimplemented(format!(
        "the fake runtime does not implement {rpc}"
    )))
}

fn not_found(what: &str, id: &str) -> Status {
    Status::not_found(format!("{what} {id:?} not found"))
}
