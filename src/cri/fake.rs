//! An in-memory CRI runtime for tests: a real tonic server on a unix socket, so the daemon's real
//! client is what talks to it.
//!
//! It keeps sandboxes, containers (labels, annotations, state, env) and images, emits container
//! events, counts calls per RPC, and lets a test inject failures and delays per RPC. RPCs it
//! does not model answer `Unimplemented`, as an older runtime would.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::Stream;
use tokio::sync::{broadcast, oneshot};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

use super::proto::image_service_server::{ImageService as ImageRpc, ImageServiceServer};
use super::proto::runtime_service_server::{RuntimeService as RuntimeRpc, RuntimeServiceServer};
use super::{Endpoint, convert, proto, types::*};

/// A container in the fake runtime.
#[derive(Clone, Debug)]
pub struct FakeContainer {
    /// What the CRI reports for it.
    pub status: ContainerStatus,
    /// Its sandbox.
    pub pod_sandbox_id: String,
    /// Environment as `KEY=VALUE` entries (what `exec env` prints and the OCI spec holds).
    pub env: Vec<String>,
    /// Whether verbose `ContainerStatus` includes the OCI spec's `process.env` in `info`, as
    /// containerd and CRI-O do.
    pub env_in_info: bool,
    /// Whether `exec env` works (images without an `env` binary fail it).
    pub has_env_binary: bool,
}

/// An injected failure: the next `remaining` calls of an RPC answer `code`.
#[derive(Clone, Debug)]
struct Fault {
    code: tonic::Code,
    message: String,
    remaining: usize,
}

/// Everything the fake runtime holds; tests reach it through [`FakeRuntime::state`].
#[derive(Debug, Default)]
pub struct FakeState {
    /// Sandboxes by ID, with their status.
    pub sandboxes: BTreeMap<String, PodSandboxStatus>,
    /// Containers by ID.
    pub containers: BTreeMap<String, FakeContainer>,
    /// Images by ID.
    pub images: BTreeMap<String, Image>,
    /// Every pull request received, in order.
    pub pulls: Vec<PullRequest>,
    /// Pulls in flight now, and the most seen at once.
    pub pulls_in_flight: usize,
    /// The largest number of concurrent pulls seen.
    pub max_concurrent_pulls: usize,
    /// Calls received, per RPC name.
    pub calls: BTreeMap<String, u64>,
    /// Every StopContainer received: container ID and when.
    pub stops: Vec<(String, std::time::Instant)>,
    /// `GetContainerEvents` ends at once with no event and status OK, as CRI-O does without
    /// `enable_pod_events` (its default).
    pub events_off: bool,
    faults: HashMap<String, Fault>,
    delays: HashMap<String, Duration>,
    unimplemented: Vec<String>,
    pull_failures: HashMap<String, (tonic::Code, String)>,
    next_id: u64,
}

impl FakeState {
    fn new_id(&mut self, prefix: &str) -> String {
        self.next_id += 1;
        format!("{prefix}{:060x}", self.next_id)
    }

    /// Calls received for one RPC (e.g. `"StopContainer"`).
    pub fn call_count(&self, rpc: &str) -> u64 {
        self.calls.get(rpc).copied().unwrap_or(0)
    }

    /// Adds an image under a tag; returns its ID.
    pub fn add_image(&mut self, tag: &str) -> String {
        let id = format!("sha256:{:064x}", fnv(tag));
        let image = self.images.entry(id.clone()).or_insert_with(|| Image {
            id: id.clone(),
            repo_tags: vec![],
            repo_digests: vec![],
            size: 1024,
            ..Default::default()
        });
        if !image.repo_tags.iter().any(|t| t == tag) {
            image.repo_tags.push(tag.to_string());
        }
        id
    }
}

fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100000001b3)
    })
}

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

#[derive(Clone)]
struct Shared {
    state: Arc<Mutex<FakeState>>,
    /// Bumped after every call, so tests wait on the state instead of polling it.
    changed: Arc<tokio::sync::watch::Sender<u64>>,
    events: broadcast::Sender<ContainerEvent>,
    /// Bumped to break every open event stream (with an error, as a runtime that goes away).
    break_events: Arc<tokio::sync::watch::Sender<u64>>,
    runtime_name: String,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, FakeState> {
        // a test that panicked while holding the lock already failed; keep serving
        crate::sync::lock(&self.state)
    }

    /// Counts the call, then applies an injected delay or failure.
    async fn enter(&self, rpc: &str) -> Result<(), Status> {
        let (delay, fault) = {
            let mut st = self.lock();
            *st.calls.entry(rpc.to_string()).or_default() += 1;
            if st.unimplemented.iter().any(|u| u == rpc) {
                return Err(Status::unimplemented(format!(
                    "unknown service runtime.v1 method {rpc}"
                )));
            }
            let delay = st.delays.get(rpc).copied();
            let fault = match st.faults.get_mut(rpc) {
                Some(f) if f.remaining > 0 => {
                    f.remaining -= 1;
                    Some(Status::new(f.code, f.message.clone()))
                }
                _ => None,
            };
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

    fn emit(&self, container_id: &str, sandbox_id: &str, kind: ContainerEventKind) {
        self.touch();
        // no subscriber is fine
        let _ = self.events.send(ContainerEvent {
            container_id: container_id.to_string(),
            kind,
            created_at: now_ns(),
            pod_sandbox_id: Some(sandbox_id.to_string()),
            sandbox_status: None,
            container_statuses: Vec::new(),
        });
    }
}

/// A running fake runtime. Dropping it stops the server.
pub struct FakeRuntime {
    shared: Shared,
    socket: PathBuf,
    shutdown: Option<oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<()>>,
}

impl FakeRuntime {
    /// Starts a fake runtime named `runtime_name` (the container ID prefix the kubelet would
    /// use) listening on `socket`.
    pub async fn start(socket: &Path, runtime_name: &str) -> std::io::Result<Self> {
        let _ = std::fs::remove_file(socket);
        let listener = tokio::net::UnixListener::bind(socket)?;
        let (events, _) = broadcast::channel(1024);
        let shared = Shared {
            state: Arc::new(Mutex::new(FakeState::default())),
            changed: Arc::new(tokio::sync::watch::channel(0).0),
            events,
            break_events: Arc::new(tokio::sync::watch::channel(0).0),
            runtime_name: runtime_name.to_string(),
        };
        let (tx, rx) = oneshot::channel::<()>();
        let svc = Svc(shared.clone());
        let server = tokio::spawn(async move {
            let result = tonic::transport::Server::builder()
                .add_service(RuntimeServiceServer::new(svc.clone()))
                .add_service(ImageServiceServer::new(svc))
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                    let _ = rx.await;
                })
                .await;
            if let Err(e) = result {
                tracing::error!(error = %e, "fake runtime server failed");
            }
        });
        Ok(FakeRuntime {
            shared,
            socket: socket.to_path_buf(),
            shutdown: Some(tx),
            server: Some(server),
        })
    }

    /// The endpoint to dial.
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
            loop {
                if cond(&self.state()) {
                    return;
                }
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

    /// The next `n` calls of `rpc` fail with `code`.
    pub fn fail_next(&self, rpc: &str, code: tonic::Code, n: usize) {
        self.state().faults.insert(
            rpc.to_string(),
            Fault {
                code,
                message: format!("injected failure of {rpc}"),
                remaining: n,
            },
        );
    }

    /// Every call of `rpc` is delayed by `delay` (zero removes it).
    pub fn delay(&self, rpc: &str, delay: Duration) {
        self.state().delays.insert(rpc.to_string(), delay);
    }

    /// `rpc` answers `Unimplemented`, as a runtime without it would.
    pub fn unimplement(&self, rpc: &str) {
        self.state().unimplemented.push(rpc.to_string());
    }

    /// Pulls of `image` fail with `code` and `message` (as a registry error would).
    pub fn fail_pulls_of(&self, image: &str, code: tonic::Code, message: &str) {
        self.state()
            .pull_failures
            .insert(image.to_string(), (code, message.to_string()));
    }

    /// Adds a ready host-network sandbox; returns its ID.
    pub fn add_sandbox(&self, metadata: SandboxMetadata, labels: StringMap, ip: &str) -> String {
        let mut st = self.state();
        let id = st.new_id("s");
        st.sandboxes.insert(
            id.clone(),
            PodSandboxStatus {
                sandbox: PodSandbox {
                    id: id.clone(),
                    metadata,
                    state: SandboxState::Ready,
                    created_at: now_ns(),
                    labels,
                    annotations: StringMap::new(),
                    runtime_handler: String::new(),
                },
                ip: ip.to_string(),
                additional_ips: vec![],
                host_network: true,
                info: StringMap::new(),
                detail: Default::default(),
            },
        );
        id
    }

    /// Adds a running container to a sandbox; returns its ID.
    pub fn add_container(
        &self,
        sandbox_id: &str,
        config: ContainerConfig,
        env_in_info: bool,
        has_env_binary: bool,
    ) -> String {
        let id = {
            let mut st = self.state();
            let image_id = st.add_image(&config.image);
            let id = st.new_id("c");
            let now = now_ns();
            st.containers.insert(
                id.clone(),
                FakeContainer {
                    status: ContainerStatus {
                        id: id.clone(),
                        metadata: config.metadata,
                        state: ContainerState::Running,
                        created_at: now,
                        started_at: now,
                        finished_at: 0,
                        exit_code: 0,
                        image: image_id.clone(),
                        image_ref: image_id,
                        image_id: String::new(),
                        reason: String::new(),
                        message: String::new(),
                        labels: config.labels,
                        annotations: config.annotations,
                        log_path: config.log_path,
                        info: StringMap::new(),
                        detail: Default::default(),
                    },
                    pod_sandbox_id: sandbox_id.to_string(),
                    env: config
                        .envs
                        .into_iter()
                        .map(|(k, v)| format!("{k}={v}"))
                        .collect(),
                    env_in_info,
                    has_env_binary,
                },
            );
            id
        };
        self.shared
            .emit(&id, sandbox_id, ContainerEventKind::Created);
        self.shared
            .emit(&id, sandbox_id, ContainerEventKind::Started);
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
            c.status.finished_at = now_ns();
            c.status.exit_code = exit_code;
            c.pod_sandbox_id.clone()
        };
        self.shared.emit(id, &sandbox, ContainerEventKind::Stopped);
    }

    /// Stops the server and waits for it.
    pub async fn stop(mut self) {
        self.shutdown_now().await;
    }

    async fn shutdown_now(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(server) = self.server.take() {
            let _ = server.await;
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

impl Drop for FakeRuntime {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

#[derive(Clone)]
struct Svc(Shared);

fn unimplemented<T>(rpc: &str) -> Result<Response<T>, Status> {
    Err(Status::unimplemented(format!(
        "the fake runtime does not implement {rpc}"
    )))
}

fn not_found(what: &str, id: &str) -> Status {
    Status::not_found(format!("{what} {id:?} not found"))
}

/// The JSON `info` containerd puts in a verbose container status: the OCI spec's environment
/// under `runtimeSpec.process.env`.
fn verbose_info(c: &FakeContainer) -> StringMap {
    let mut info = StringMap::new();
    if c.env_in_info {
        let spec = serde_json::json!({
            "pid": 1,
            "runtimeSpec": { "process": { "env": c.env } },
        });
        info.insert("info".to_string(), spec.to_string());
    }
    info
}

type EventStream =
    Pin<Box<dyn Stream<Item = Result<proto::ContainerEventResponse, Status>> + Send>>;

#[tonic::async_trait]
impl RuntimeRpc for Svc {
    async fn version(
        &self,
        _r: Request<proto::VersionRequest>,
    ) -> Result<Response<proto::VersionResponse>, Status> {
        self.0.enter("Version").await?;
        Ok(Response::new(proto::VersionResponse {
            version: "0.1.0".into(),
            runtime_name: self.0.runtime_name.clone(),
            runtime_version: "0.0.0-fake".into(),
            runtime_api_version: "v1".into(),
        }))
    }

    async fn run_pod_sandbox(
        &self,
        r: Request<proto::RunPodSandboxRequest>,
    ) -> Result<Response<proto::RunPodSandboxResponse>, Status> {
        self.0.enter("RunPodSandbox").await?;
        let config = convert::sandbox_config_from(r.into_inner().config.unwrap_or_default());
        let mut st = self.0.lock();
        let id = st.new_id("s");
        st.sandboxes.insert(
            id.clone(),
            PodSandboxStatus {
                sandbox: PodSandbox {
                    id: id.clone(),
                    metadata: config.metadata,
                    state: SandboxState::Ready,
                    created_at: now_ns(),
                    labels: config.labels,
                    annotations: config.annotations,
                    runtime_handler: String::new(),
                },
                ip: "127.0.0.1".into(),
                additional_ips: vec![],
                host_network: true,
                info: StringMap::new(),
                detail: Default::default(),
            },
        );
        Ok(Response::new(proto::RunPodSandboxResponse {
            pod_sandbox_id: id,
        }))
    }

    async fn stop_pod_sandbox(
        &self,
        r: Request<proto::StopPodSandboxRequest>,
    ) -> Result<Response<proto::StopPodSandboxResponse>, Status> {
        self.0.enter("StopPodSandbox").await?;
        let id = r.into_inner().pod_sandbox_id;
        let stopped: Vec<String> = {
            let mut st = self.0.lock();
            if let Some(s) = st.sandboxes.get_mut(&id) {
                s.sandbox.state = SandboxState::NotReady;
            }
            st.containers
                .iter_mut()
                .filter(|(_, c)| {
                    c.pod_sandbox_id == id && c.status.state == ContainerState::Running
                })
                .map(|(cid, c)| {
                    c.status.state = ContainerState::Exited;
                    c.status.finished_at = now_ns();
                    cid.clone()
                })
                .collect()
        };
        for cid in stopped {
            self.0.emit(&cid, &id, ContainerEventKind::Stopped);
        }
        Ok(Response::new(proto::StopPodSandboxResponse {}))
    }

    async fn remove_pod_sandbox(
        &self,
        r: Request<proto::RemovePodSandboxRequest>,
    ) -> Result<Response<proto::RemovePodSandboxResponse>, Status> {
        self.0.enter("RemovePodSandbox").await?;
        let id = r.into_inner().pod_sandbox_id;
        let mut st = self.0.lock();
        st.sandboxes.remove(&id);
        st.containers.retain(|_, c| c.pod_sandbox_id != id);
        Ok(Response::new(proto::RemovePodSandboxResponse {}))
    }

    async fn pod_sandbox_status(
        &self,
        r: Request<proto::PodSandboxStatusRequest>,
    ) -> Result<Response<proto::PodSandboxStatusResponse>, Status> {
        self.0.enter("PodSandboxStatus").await?;
        let id = r.into_inner().pod_sandbox_id;
        let st = self.0.lock();
        let s = st
            .sandboxes
            .get(&id)
            .ok_or_else(|| not_found("sandbox", &id))?;
        Ok(Response::new(convert::sandbox_status_message(s)))
    }

    async fn list_pod_sandbox(
        &self,
        r: Request<proto::ListPodSandboxRequest>,
    ) -> Result<Response<proto::ListPodSandboxResponse>, Status> {
        self.0.enter("ListPodSandbox").await?;
        let f = convert::sandbox_filter_from(r.into_inner().filter);
        let st = self.0.lock();
        let items = st
            .sandboxes
            .values()
            .filter(|s| {
                f.id.as_ref()
                    .is_none_or(|id| s.sandbox.id.starts_with(id.as_str()))
            })
            .filter(|s| f.state.is_none_or(|st| s.sandbox.state == st))
            .filter(|s| {
                f.labels
                    .iter()
                    .all(|(k, v)| s.sandbox.labels.get(k) == Some(v))
            })
            .map(|s| s.sandbox.clone().into())
            .collect();
        Ok(Response::new(proto::ListPodSandboxResponse { items }))
    }

    async fn create_container(
        &self,
        r: Request<proto::CreateContainerRequest>,
    ) -> Result<Response<proto::CreateContainerResponse>, Status> {
        self.0.enter("CreateContainer").await?;
        let r = r.into_inner();
        let config = convert::container_config_from(r.config.unwrap_or_default());
        let mut st = self.0.lock();
        if !st.sandboxes.contains_key(&r.pod_sandbox_id) {
            return Err(not_found("sandbox", &r.pod_sandbox_id));
        }
        let image_id = st.add_image(&config.image);
        let id = st.new_id("c");
        st.containers.insert(
            id.clone(),
            FakeContainer {
                status: ContainerStatus {
                    id: id.clone(),
                    metadata: config.metadata,
                    state: ContainerState::Created,
                    created_at: now_ns(),
                    started_at: 0,
                    finished_at: 0,
                    exit_code: 0,
                    image: image_id.clone(),
                    image_ref: image_id,
                    image_id: String::new(),
                    reason: String::new(),
                    message: String::new(),
                    labels: config.labels,
                    annotations: config.annotations,
                    log_path: config.log_path,
                    info: StringMap::new(),
                    detail: Default::default(),
                },
                pod_sandbox_id: r.pod_sandbox_id.clone(),
                env: config
                    .envs
                    .into_iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect(),
                env_in_info: true,
                has_env_binary: true,
            },
        );
        drop(st);
        self.0
            .emit(&id, &r.pod_sandbox_id, ContainerEventKind::Created);
        Ok(Response::new(proto::CreateContainerResponse {
            container_id: id,
        }))
    }

    async fn start_container(
        &self,
        r: Request<proto::StartContainerRequest>,
    ) -> Result<Response<proto::StartContainerResponse>, Status> {
        self.0.enter("StartContainer").await?;
        let id = r.into_inner().container_id;
        let sandbox = {
            let mut st = self.0.lock();
            let c = st
                .containers
                .get_mut(&id)
                .ok_or_else(|| not_found("container", &id))?;
            c.status.state = ContainerState::Running;
            c.status.started_at = now_ns();
            c.pod_sandbox_id.clone()
        };
        self.0.emit(&id, &sandbox, ContainerEventKind::Started);
        Ok(Response::new(proto::StartContainerResponse {}))
    }

    async fn stop_container(
        &self,
        r: Request<proto::StopContainerRequest>,
    ) -> Result<Response<proto::StopContainerResponse>, Status> {
        self.0.enter("StopContainer").await?;
        let id = r.into_inner().container_id;
        let sandbox = {
            let mut st = self.0.lock();
            st.stops.push((id.clone(), std::time::Instant::now()));
            self.0.touch();
            let c = st
                .containers
                .get_mut(&id)
                .ok_or_else(|| not_found("container", &id))?;
            if c.status.state != ContainerState::Running {
                return Ok(Response::new(proto::StopContainerResponse {}));
            }
            c.status.state = ContainerState::Exited;
            c.status.finished_at = now_ns();
            c.status.exit_code = 143;
            c.status.reason = "Error".into();
            c.pod_sandbox_id.clone()
        };
        self.0.emit(&id, &sandbox, ContainerEventKind::Stopped);
        Ok(Response::new(proto::StopContainerResponse {}))
    }

    async fn remove_container(
        &self,
        r: Request<proto::RemoveContainerRequest>,
    ) -> Result<Response<proto::RemoveContainerResponse>, Status> {
        self.0.enter("RemoveContainer").await?;
        let id = r.into_inner().container_id;
        let removed = self.0.lock().containers.remove(&id);
        if let Some(c) = removed {
            self.0
                .emit(&id, &c.pod_sandbox_id, ContainerEventKind::Deleted);
        }
        Ok(Response::new(proto::RemoveContainerResponse {}))
    }

    async fn list_containers(
        &self,
        r: Request<proto::ListContainersRequest>,
    ) -> Result<Response<proto::ListContainersResponse>, Status> {
        self.0.enter("ListContainers").await?;
        let f = convert::container_filter_from(r.into_inner().filter);
        let st = self.0.lock();
        let containers = st
            .containers
            .values()
            .filter(|c| {
                f.id.as_ref()
                    .is_none_or(|id| c.status.id.starts_with(id.as_str()))
            })
            .filter(|c| f.state.is_none_or(|s| c.status.state == s))
            .filter(|c| {
                f.pod_sandbox_id
                    .as_ref()
                    .is_none_or(|s| c.pod_sandbox_id.starts_with(s.as_str()))
            })
            .filter(|c| {
                f.labels
                    .iter()
                    .all(|(k, v)| c.status.labels.get(k) == Some(v))
            })
            .map(|c| {
                Container {
                    id: c.status.id.clone(),
                    pod_sandbox_id: c.pod_sandbox_id.clone(),
                    metadata: c.status.metadata.clone(),
                    image: c.status.image.clone(),
                    image_ref: c.status.image_ref.clone(),
                    state: c.status.state,
                    created_at: c.status.created_at,
                    labels: c.status.labels.clone(),
                    annotations: c.status.annotations.clone(),
                    image_id: c.status.image_id.clone(),
                    image_spec: c.status.detail.image_spec.clone(),
                }
                .into()
            })
            .collect();
        Ok(Response::new(proto::ListContainersResponse { containers }))
    }

    async fn container_status(
        &self,
        r: Request<proto::ContainerStatusRequest>,
    ) -> Result<Response<proto::ContainerStatusResponse>, Status> {
        self.0.enter("ContainerStatus").await?;
        let r = r.into_inner();
        let st = self.0.lock();
        let c = st
            .containers
            .get(&r.container_id)
            .ok_or_else(|| not_found("container", &r.container_id))?;
        let mut status = c.status.clone();
        if r.verbose {
            status.info = verbose_info(c);
        }
        Ok(Response::new(convert::container_status_message(&status)))
    }

    async fn update_container_resources(
        &self,
        _r: Request<proto::UpdateContainerResourcesRequest>,
    ) -> Result<Response<proto::UpdateContainerResourcesResponse>, Status> {
        unimplemented("UpdateContainerResources")
    }

    async fn reopen_container_log(
        &self,
        _r: Request<proto::ReopenContainerLogRequest>,
    ) -> Result<Response<proto::ReopenContainerLogResponse>, Status> {
        unimplemented("ReopenContainerLog")
    }

    async fn exec_sync(
        &self,
        r: Request<proto::ExecSyncRequest>,
    ) -> Result<Response<proto::ExecSyncResponse>, Status> {
        self.0.enter("ExecSync").await?;
        let r = r.into_inner();
        let st = self.0.lock();
        let c = st
            .containers
            .get(&r.container_id)
            .ok_or_else(|| not_found("container", &r.container_id))?;
        if c.status.state != ContainerState::Running {
            return Err(Status::failed_precondition(format!(
                "container {} is not running",
                r.container_id
            )));
        }
        let resp = match r.cmd.first().map(String::as_str) {
            Some("env") if c.has_env_binary => proto::ExecSyncResponse {
                stdout: c
                    .env
                    .iter()
                    .flat_map(|e| format!("{e}\n").into_bytes())
                    .collect(),
                stderr: vec![],
                exit_code: 0,
            },
            Some("true") => proto::ExecSyncResponse::default(),
            Some("false") => proto::ExecSyncResponse {
                exit_code: 1,
                ..Default::default()
            },
            Some(cmd) => {
                // what runc says when the binary is missing from the image
                return Err(Status::unknown(format!(
                    "failed to exec in container: failed to start exec: OCI runtime exec failed: \
                     exec failed: unable to start container process: exec: \"{cmd}\": \
                     executable file not found in $PATH: unknown"
                )));
            }
            None => return Err(Status::invalid_argument("empty command")),
        };
        Ok(Response::new(resp))
    }

    async fn exec(
        &self,
        _r: Request<proto::ExecRequest>,
    ) -> Result<Response<proto::ExecResponse>, Status> {
        unimplemented("Exec")
    }

    async fn attach(
        &self,
        _r: Request<proto::AttachRequest>,
    ) -> Result<Response<proto::AttachResponse>, Status> {
        unimplemented("Attach")
    }

    async fn port_forward(
        &self,
        _r: Request<proto::PortForwardRequest>,
    ) -> Result<Response<proto::PortForwardResponse>, Status> {
        unimplemented("PortForward")
    }

    async fn container_stats(
        &self,
        _r: Request<proto::ContainerStatsRequest>,
    ) -> Result<Response<proto::ContainerStatsResponse>, Status> {
        unimplemented("ContainerStats")
    }

    async fn list_container_stats(
        &self,
        _r: Request<proto::ListContainerStatsRequest>,
    ) -> Result<Response<proto::ListContainerStatsResponse>, Status> {
        unimplemented("ListContainerStats")
    }

    async fn pod_sandbox_stats(
        &self,
        _r: Request<proto::PodSandboxStatsRequest>,
    ) -> Result<Response<proto::PodSandboxStatsResponse>, Status> {
        unimplemented("PodSandboxStats")
    }

    async fn list_pod_sandbox_stats(
        &self,
        _r: Request<proto::ListPodSandboxStatsRequest>,
    ) -> Result<Response<proto::ListPodSandboxStatsResponse>, Status> {
        unimplemented("ListPodSandboxStats")
    }

    async fn update_runtime_config(
        &self,
        _r: Request<proto::UpdateRuntimeConfigRequest>,
    ) -> Result<Response<proto::UpdateRuntimeConfigResponse>, Status> {
        unimplemented("UpdateRuntimeConfig")
    }

    async fn status(
        &self,
        _r: Request<proto::StatusRequest>,
    ) -> Result<Response<proto::StatusResponse>, Status> {
        self.0.enter("Status").await?;
        let cond = |t: &str| proto::RuntimeCondition {
            r#type: t.to_string(),
            status: true,
            reason: String::new(),
            message: String::new(),
        };
        Ok(Response::new(proto::StatusResponse {
            status: Some(proto::RuntimeStatus {
                conditions: vec![cond("RuntimeReady"), cond("NetworkReady")],
            }),
            ..Default::default()
        }))
    }

    type GetContainerEventsStream = EventStream;

    async fn get_container_events(
        &self,
        _r: Request<proto::GetEventsRequest>,
    ) -> Result<Response<Self::GetContainerEventsStream>, Status> {
        // subscribe before the call is counted: a test that waits for the count may emit at once
        let mut rx = self.0.events.subscribe();
        self.0.enter("GetContainerEvents").await?;
        if self.0.lock().events_off {
            return Ok(Response::new(Box::pin(futures::stream::empty())));
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
        let mut broken = self.0.break_events.subscribe();
        broken.mark_unchanged();
        // as a Go gRPC server (containerd, CRI-O) does, answer the call only with its first
        // message: on a quiet runtime the client waits for the response headers
        let first = tokio::select! {
            e = next(&mut rx) => e,
            _ = broken.changed() => return Err(Status::unavailable("event stream broken by the test")),
        };
        let stream = futures::stream::unfold(
            (first, rx, broken, false),
            |(first, mut rx, mut broken, done)| async move {
                if done {
                    return None;
                }
                let e = match first {
                    Some(e) => e,
                    None => tokio::select! {
                        e = next(&mut rx) => e?,
                        _ = broken.changed() => {
                            let err = Status::unavailable("event stream broken by the test");
                            return Some((Err(err), (None, rx, broken, true)));
                        }
                    },
                };
                Some((
                    Ok(convert::container_event_message(&e)),
                    (None, rx, broken, false),
                ))
            },
        );
        Ok(Response::new(Box::pin(stream)))
    }

    async fn runtime_config(
        &self,
        _r: Request<proto::RuntimeConfigRequest>,
    ) -> Result<Response<proto::RuntimeConfigResponse>, Status> {
        unimplemented("RuntimeConfig")
    }
}

#[tonic::async_trait]
impl ImageRpc for Svc {
    async fn list_images(
        &self,
        _r: Request<proto::ListImagesRequest>,
    ) -> Result<Response<proto::ListImagesResponse>, Status> {
        self.0.enter("ListImages").await?;
        let images = self
            .0
            .lock()
            .images
            .values()
            .cloned()
            .map(Into::into)
            .collect();
        Ok(Response::new(proto::ListImagesResponse { images }))
    }

    async fn image_status(
        &self,
        r: Request<proto::ImageStatusRequest>,
    ) -> Result<Response<proto::ImageStatusResponse>, Status> {
        self.0.enter("ImageStatus").await?;
        let name = r.into_inner().image.map(|i| i.image).unwrap_or_default();
        let st = self.0.lock();
        let image = st
            .images
            .values()
            .find(|i| i.id == name || i.repo_tags.contains(&name))
            .cloned()
            .map(Into::into);
        // like containerd: OK with no image when unknown
        Ok(Response::new(proto::ImageStatusResponse {
            image,
            info: BTreeMap::new(),
        }))
    }

    async fn pull_image(
        &self,
        r: Request<proto::PullImageRequest>,
    ) -> Result<Response<proto::PullImageResponse>, Status> {
        self.0.enter("PullImage").await?;
        let req = convert::pull_request_from(r.into_inner());
        let failure = {
            let mut st = self.0.lock();
            st.pulls.push(req.clone());
            st.pulls_in_flight += 1;
            st.max_concurrent_pulls = st.max_concurrent_pulls.max(st.pulls_in_flight);
            st.pull_failures.get(&req.image).cloned()
        };
        // let concurrent pulls overlap, as real ones do
        tokio::task::yield_now().await;
        let delay = self.0.lock().delays.get("PullImage.body").copied();
        if let Some(d) = delay {
            tokio::time::sleep(d).await;
        }
        let mut st = self.0.lock();
        st.pulls_in_flight -= 1;
        if let Some((code, message)) = failure {
            drop(st);
            self.0.touch();
            return Err(Status::new(code, message));
        }
        let id = st.add_image(&req.image);
        drop(st);
        self.0.touch();
        Ok(Response::new(proto::PullImageResponse { image_ref: id }))
    }

    async fn remove_image(
        &self,
        r: Request<proto::RemoveImageRequest>,
    ) -> Result<Response<proto::RemoveImageResponse>, Status> {
        self.0.enter("RemoveImage").await?;
        let name = r.into_inner().image.map(|i| i.image).unwrap_or_default();
        self.0
            .lock()
            .images
            .retain(|id, i| *id != name && !i.repo_tags.contains(&name));
        Ok(Response::new(proto::RemoveImageResponse {}))
    }

    async fn image_fs_info(
        &self,
        _r: Request<proto::ImageFsInfoRequest>,
    ) -> Result<Response<proto::ImageFsInfoResponse>, Status> {
        self.0.enter("ImageFsInfo").await?;
        let used: u64 = self.0.lock().images.values().map(|i| i.size).sum();
        Ok(Response::new(proto::ImageFsInfoResponse {
            image_filesystems: vec![
                FilesystemUsage {
                    timestamp: now_ns(),
                    mountpoint: "/var/lib/fake/images".into(),
                    used_bytes: Some(used),
                    inodes_used: Some(0),
                }
                .into(),
            ],
            container_filesystems: vec![],
        }))
    }
}
