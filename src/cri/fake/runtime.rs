//! The fake's runtime service: sandboxes and containers (made, started, stopped, removed,
//! listed), `ExecSync` of a few commands, container statistics and container events, each as
//! the dialect answers it.

use std::future::Future;
use std::pin::Pin;

use tonic::{Request, Response, Status};

use super::super::proto::runtime_service_server::RuntimeService as RuntimeRpc;
use super::super::{ContainerEventKind, ContainerState, SandboxState, StringMap, convert, proto};
use super::events::{self, EventStream};
use super::state::{FakeContainer, now_ns};
use super::{Svc, has_labels, not_found, unimplemented};

/// The JSON `info` containerd and CRI-O put in a verbose container status: the OCI spec's
/// environment under `runtimeSpec.process.env`.
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

/// What runc says when the binary is missing from the image.
fn no_such_binary(cmd: &str) -> Status {
    Status::unknown(format!(
        "failed to exec in container: failed to start exec: OCI runtime exec failed: \
         exec failed: unable to start container process: exec: \"{cmd}\": \
         executable file not found in $PATH: unknown"
    ))
}

/// A container's statistics: it has used a millisecond of CPU per second it ran.
fn stats_of(c: &FakeContainer, now: i64) -> proto::ContainerStats {
    let value = |value: u64| Some(proto::UInt64Value { value });
    let running = c.status.state == ContainerState::Running;
    let ran = u64::try_from((now - c.status.started_at) / 1000).unwrap_or(0);
    proto::ContainerStats {
        attributes: Some(proto::ContainerAttributes {
            id: c.status.id.clone(),
            metadata: Some(c.status.metadata.clone().into()),
            labels: c.status.labels.clone(),
            annotations: c.status.annotations.clone(),
        }),
        cpu: Some(proto::CpuUsage {
            timestamp: now,
            usage_core_nano_seconds: value(if running { ran } else { 0 }),
            ..Default::default()
        }),
        memory: Some(proto::MemoryUsage {
            timestamp: now,
            working_set_bytes: value(if running { 475_136 } else { 0 }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The RPCs the fake does not model, each answering `Unimplemented` as an older runtime would:
/// the methods as `async_trait` writes an `async fn` (the attribute never sees what a macro
/// expands to).
macro_rules! unimplemented_rpcs {
    ($($rpc:ident($req:ident) -> $resp:ident: $name:literal;)*) => {$(
        fn $rpc<'life0, 'async_trait>(
            &'life0 self,
            _r: Request<proto::$req>,
        ) -> Pin<Box<
            dyn Future<Output = Result<Response<proto::$resp>, Status>> + Send + 'async_trait,
        >>
        where
            'life0: 'async_trait,
            Self: 'async_trait,
        {
            Box::pin(std::future::ready(unimplemented($name)))
        }
    )*};
}

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
            runtime_version: self.0.lock().dialect().runtime_version().into(),
            runtime_api_version: "v1".into(),
        }))
    }

    async fn run_pod_sandbox(
        &self,
        r: Request<proto::RunPodSandboxRequest>,
    ) -> Result<Response<proto::RunPodSandboxResponse>, Status> {
        self.0.enter("RunPodSandbox").await?;
        let c = convert::sandbox_config_from(r.into_inner().config.unwrap_or_default());
        let id = self
            .0
            .new_sandbox(c.metadata, c.labels, c.annotations, "127.0.0.1");
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
        let events = {
            let mut st = self.0.lock();
            if let Some(s) = st.sandboxes.get_mut(&id) {
                s.sandbox.state = SandboxState::NotReady;
            }
            let stopped: Vec<String> = st
                .containers
                .iter_mut()
                .filter(|(_, c)| {
                    c.pod_sandbox_id == id && c.status.state == ContainerState::Running
                })
                .map(|(cid, c)| {
                    c.status.state = ContainerState::Exited;
                    c.status.finished_at = now_ns();
                    cid.clone()
                })
                .collect();
            let mut events: Vec<_> = stopped
                .iter()
                .map(|cid| events::event(&st, cid, &id, ContainerEventKind::Stopped))
                .collect();
            let kinds = [ContainerEventKind::Stopped];
            events.extend(events::sandbox_events(&st, &id, &kinds));
            events
        };
        self.0.send(events);
        Ok(Response::new(proto::StopPodSandboxResponse {}))
    }

    async fn remove_pod_sandbox(
        &self,
        r: Request<proto::RemovePodSandboxRequest>,
    ) -> Result<Response<proto::RemovePodSandboxResponse>, Status> {
        self.0.enter("RemovePodSandbox").await?;
        let id = r.into_inner().pod_sandbox_id;
        let events = {
            let mut st = self.0.lock();
            // the sandbox's event carries its status: made while it is still there
            let events = events::sandbox_events(&st, &id, &[ContainerEventKind::Deleted]);
            st.sandboxes.remove(&id);
            st.containers.retain(|_, c| c.pod_sandbox_id != id);
            events
        };
        self.0.send(events);
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
            .filter(|s| has_labels(&s.sandbox.labels, f.labels.iter()))
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
        let id = {
            let mut st = self.0.lock();
            if !st.sandboxes.contains_key(&r.pod_sandbox_id) {
                return Err(not_found("sandbox", &r.pod_sandbox_id));
            }
            let created = ContainerState::Created;
            st.insert_container(&r.pod_sandbox_id, config, created, true, true)
        };
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
            .filter(|c| has_labels(&c.status.labels, f.labels.iter()))
            .map(|c| st.listed(c).into())
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
        let mut status = st.status_of(c);
        if r.verbose {
            status.info = verbose_info(c);
        }
        Ok(Response::new(convert::container_status_message(&status)))
    }

    async fn exec_sync(
        &self,
        r: Request<proto::ExecSyncRequest>,
    ) -> Result<Response<proto::ExecSyncResponse>, Status> {
        self.0.enter("ExecSync").await?;
        let r = r.into_inner();
        let (dialect, resp) = {
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
            let dialect = st.dialect();
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
                // the time now (ns): an output that differs at every run (issue 43, row 7)
                Some("date") => proto::ExecSyncResponse {
                    stdout: format!("{}\n", now_ns()).into_bytes(),
                    ..Default::default()
                },
                Some("false") => proto::ExecSyncResponse {
                    exit_code: 1,
                    ..Default::default()
                },
                Some("sleep") if dialect.runs_sleep() => proto::ExecSyncResponse::default(),
                Some(cmd) => return Err(no_such_binary(cmd)),
                None => return Err(Status::invalid_argument("empty command")),
            };
            (dialect, resp)
        };
        // `sleep <seconds>` takes that long; the runtime ends it at the call's timeout
        if r.cmd.first().map(String::as_str) == Some("sleep") {
            let secs: u64 = r.cmd.get(1).and_then(|s| s.parse().ok()).unwrap_or(0);
            let limit = u64::try_from(r.timeout).unwrap_or(0);
            if limit > 0 && secs > limit {
                tokio::time::sleep(std::time::Duration::from_secs(limit)).await;
                return dialect.exec_timed_out(r.timeout).map(Response::new);
            }
            tokio::time::sleep(std::time::Duration::from_secs(secs)).await;
        }
        Ok(Response::new(resp))
    }

    async fn list_container_stats(
        &self,
        r: Request<proto::ListContainerStatsRequest>,
    ) -> Result<Response<proto::ListContainerStatsResponse>, Status> {
        if self.0.lock().dialect() == super::Dialect::Plain {
            return unimplemented("ListContainerStats");
        }
        self.0.enter("ListContainerStats").await?;
        let f = r.into_inner().filter.unwrap_or_default();
        let st = self.0.lock();
        let exited_too = st.dialect().lists_stats_of_exited();
        let now = now_ns();
        let stats = st
            .containers
            .values()
            .filter(|c| c.status.id.starts_with(&f.id))
            .filter(|c| c.pod_sandbox_id.starts_with(&f.pod_sandbox_id))
            .filter(|c| has_labels(&c.status.labels, f.label_selector.iter()))
            .filter(|c| exited_too || c.status.state == ContainerState::Running)
            .map(|c| stats_of(c, now))
            .collect();
        Ok(Response::new(proto::ListContainerStatsResponse { stats }))
    }

    unimplemented_rpcs! {
        update_container_resources(UpdateContainerResourcesRequest)
            -> UpdateContainerResourcesResponse: "UpdateContainerResources";
        reopen_container_log(ReopenContainerLogRequest)
            -> ReopenContainerLogResponse: "ReopenContainerLog";
        exec(ExecRequest) -> ExecResponse: "Exec";
        attach(AttachRequest) -> AttachResponse: "Attach";
        port_forward(PortForwardRequest) -> PortForwardResponse: "PortForward";
        container_stats(ContainerStatsRequest) -> ContainerStatsResponse: "ContainerStats";
        pod_sandbox_stats(PodSandboxStatsRequest) -> PodSandboxStatsResponse: "PodSandboxStats";
        list_pod_sandbox_stats(ListPodSandboxStatsRequest)
            -> ListPodSandboxStatsResponse: "ListPodSandboxStats";
        update_runtime_config(UpdateRuntimeConfigRequest)
            -> UpdateRuntimeConfigResponse: "UpdateRuntimeConfig";
        runtime_config(RuntimeConfigRequest) -> RuntimeConfigResponse: "RuntimeConfig";
    }

    async fn status(
        &self,
        _r: Request<proto::StatusRequest>,
    ) -> Result<Response<proto::StatusResponse>, Status> {
        self.0.enter("Status").await?;
        let cond = |t: &str| proto::RuntimeCondition {
            r#type: t.to_string(),
            status: true,
            ..Default::default()
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
        events::get_container_events(&self.0)
            .await
            .map(Response::new)
    }
}
