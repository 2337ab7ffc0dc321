//! The real CRI client: tonic over a unix socket, with connect and per-call timeouts.
//!
//! The channel connects lazily and reconnects on the next call after the runtime went away, so a
//! containerd restart costs the calls made while it is down and nothing else: no crash, no loop.
//! Callers that poll (watches, readiness) bring their own jittered backoff.

use std::future::Future;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use tonic::transport::Channel;

use super::endpoint::Endpoint;
use super::error::{CriError, Result};
use super::proto::image_service_client::ImageServiceClient;
use super::proto::runtime_service_client::RuntimeServiceClient;
#[cfg(feature = "test-util")]
use super::service::KubeletService;
use super::service::{ImageService, RuntimeService};
use super::{convert, convert_detail, detail::*, parts::*, proto, types::*};

/// Largest message accepted from the runtime (kruise-daemon and the kubelet use 16 MiB).
const MAX_MESSAGE_SIZE: usize = 16 * 1024 * 1024;
/// The least time limit of the calls the runtime may take long over.
const SLOW_CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// HTTP/2 keepalive of the runtime connection: how often a ping goes out while a call is open
/// (the container event stream always is), and how long its answer may take before the
/// connection counts as dead. Go gRPC servers (containerd, CRI-O) answer pings sent more often
/// than every 5 minutes with GOAWAY "too_many_pings", closing every call on the connection.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(330);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// The CRI API version the daemon asks for in `Version`.
const CRI_API_VERSION: &str = "v1";

/// Time limits of CRI calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// Limit for establishing the connection to the socket.
    pub connect: Duration,
    /// Limit for ordinary unary calls (list, status, version). Calls that take as long as they
    /// need (exec, stop, pull) get their own limit from the caller.
    pub call: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect: Duration::from_secs(2),
            call: Duration::from_secs(5),
        }
    }
}

/// A CRI runtime reached over unix sockets (one for the runtime service, one for images;
/// usually the same).
#[derive(Clone, Debug)]
pub struct RemoteRuntime {
    endpoint: Endpoint,
    image_endpoint: Endpoint,
    runtime: RuntimeServiceClient<Channel>,
    image: ImageServiceClient<Channel>,
    timeouts: Timeouts,
    /// The largest `ExecSync` answer accepted (stdout and stderr together).
    exec_output_limit: usize,
}

pub(super) fn channel(endpoint: &Endpoint, connect_timeout: Duration) -> Channel {
    let path = endpoint.path().to_path_buf();
    // The URI is required by tonic but unused: the connector dials the socket.
    tonic::transport::Endpoint::from_static("http://cri.invalid")
        .connect_timeout(connect_timeout)
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(false)
        .connect_with_connector_lazy(super::dial::Dial::Unix(path))
}

impl RemoteRuntime {
    /// A client for the runtime at `endpoint` (and images at `image_endpoint`, default the
    /// same). Does no I/O: the first call connects.
    pub fn new(endpoint: Endpoint, image_endpoint: Option<Endpoint>, timeouts: Timeouts) -> Self {
        let image_endpoint = image_endpoint.unwrap_or_else(|| endpoint.clone());
        let runtime_channel = channel(&endpoint, timeouts.connect);
        let image_channel = if image_endpoint == endpoint {
            runtime_channel.clone()
        } else {
            channel(&image_endpoint, timeouts.connect)
        };
        RemoteRuntime {
            runtime: RuntimeServiceClient::new(runtime_channel)
                .max_decoding_message_size(MAX_MESSAGE_SIZE),
            image: ImageServiceClient::new(image_channel)
                .max_decoding_message_size(MAX_MESSAGE_SIZE),
            endpoint,
            image_endpoint,
            timeouts,
            exec_output_limit: MAX_MESSAGE_SIZE,
        }
    }

    /// The same client, accepting `ExecSync` answers of at most `bytes` (16 MiB by default, as
    /// crictl): what a container writes is its author's, and the daemon's own execs (probes,
    /// hooks, `env`) keep little of it.
    pub fn with_exec_output_limit(mut self, bytes: usize) -> Self {
        self.exec_output_limit = bytes;
        self
    }

    /// The time limit of a call the runtime may take long over: running a sandbox (which may
    /// pull the pause image), stopping and removing one, creating, starting and removing a
    /// container, removing an image. The ordinary limit, but at least a minute.
    fn slow_call_timeout(&self) -> Duration {
        self.timeouts.call.max(SLOW_CALL_TIMEOUT)
    }

    /// The runtime service endpoint.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// The image service endpoint.
    pub fn image_endpoint(&self) -> &Endpoint {
        &self.image_endpoint
    }

    /// The configured time limits.
    pub fn timeouts(&self) -> Timeouts {
        self.timeouts
    }

    /// Runs one call with a deadline, sent to the runtime as `grpc-timeout` too, and maps its
    /// error.
    async fn call<T, F, Fut>(
        endpoint: &Endpoint,
        name: &'static str,
        timeout: Duration,
        f: F,
    ) -> Result<T>
    where
        F: FnOnce(Duration) -> Fut,
        Fut: Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    {
        match tokio::time::timeout(timeout, f(timeout)).await {
            Ok(Ok(resp)) => Ok(resp.into_inner()),
            Ok(Err(status)) => Err(
                match CriError::from_status(&endpoint.to_string(), name, status) {
                    CriError::Timeout { call, .. } => CriError::Timeout {
                        call,
                        after: timeout,
                    },
                    other => other,
                },
            ),
            Err(_) => Err(CriError::Timeout {
                call: name,
                after: timeout,
            }),
        }
    }

    async fn runtime_call<Req, T, F, Fut>(
        &self,
        name: &'static str,
        timeout: Duration,
        req: Req,
        f: F,
    ) -> Result<T>
    where
        F: FnOnce(RuntimeServiceClient<Channel>, tonic::Request<Req>) -> Fut,
        Fut: Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    {
        let client = self.runtime.clone();
        Self::call(&self.endpoint, name, timeout, |t| {
            f(client, with_timeout(req, t))
        })
        .await
    }

    async fn image_call<Req, T, F, Fut>(
        &self,
        name: &'static str,
        timeout: Duration,
        req: Req,
        f: F,
    ) -> Result<T>
    where
        F: FnOnce(ImageServiceClient<Channel>, tonic::Request<Req>) -> Fut,
        Fut: Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    {
        let client = self.image.clone();
        Self::call(&self.image_endpoint, name, timeout, |t| {
            f(client, with_timeout(req, t))
        })
        .await
    }
}

fn with_timeout<T>(msg: T, timeout: Duration) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    req.set_timeout(timeout);
    req
}

fn missing(call: &'static str, what: &str) -> CriError {
    CriError::Malformed {
        call,
        message: format!("the response carries no {what}"),
    }
}

/// Extra time allowed over the runtime's own limit for exec and stop, so the runtime's answer
/// (with its exit code) arrives before our deadline fires.
const CALL_SLACK: Duration = Duration::from_secs(2);

impl RuntimeService for RemoteRuntime {
    async fn version(&self) -> Result<RuntimeVersion> {
        let req = proto::VersionRequest {
            version: CRI_API_VERSION.to_string(),
        };
        let v = self
            .runtime_call("Version", self.timeouts.call, req, |mut c, r| async move {
                c.version(r).await
            })
            .await?;
        Ok(RuntimeVersion {
            version: v.version,
            runtime_name: v.runtime_name,
            runtime_version: v.runtime_version,
            runtime_api_version: v.runtime_api_version,
        })
    }

    async fn status(&self) -> Result<RuntimeStatus> {
        self.runtime_status(false).await
    }

    async fn runtime_status(&self, verbose: bool) -> Result<RuntimeStatus> {
        let req = proto::StatusRequest { verbose };
        let s = self
            .runtime_call("Status", self.timeouts.call, req, |mut c, r| async move {
                c.status(r).await
            })
            .await?;
        Ok(RuntimeStatus {
            conditions: s
                .status
                .map(|s| s.conditions)
                .unwrap_or_default()
                .into_iter()
                .map(|c| RuntimeCondition {
                    kind: c.r#type,
                    status: c.status,
                    reason: c.reason,
                    message: c.message,
                })
                .collect(),
            info: s.info,
            handlers: convert_detail::runtime_handlers(s.runtime_handlers),
            features: convert_detail::runtime_features(s.features),
        })
    }

    async fn list_container_stats(
        &self,
        filter: ContainerStatsFilter,
    ) -> Result<Vec<ContainerStats>> {
        let req = proto::ListContainerStatsRequest {
            filter: Some(convert_detail::container_stats_filter(filter)),
        };
        let resp = self
            .runtime_call(
                "ListContainerStats",
                self.timeouts.call,
                req,
                |mut c, r| async move { c.list_container_stats(r).await },
            )
            .await?;
        Ok(resp.stats.into_iter().map(Into::into).collect())
    }

    async fn list_pod_sandboxes(&self, filter: SandboxFilter) -> Result<Vec<PodSandbox>> {
        let req = proto::ListPodSandboxRequest {
            filter: Some(convert::sandbox_filter(filter)),
        };
        let resp = self
            .runtime_call(
                "ListPodSandbox",
                self.timeouts.call,
                req,
                |mut c, r| async move { c.list_pod_sandbox(r).await },
            )
            .await?;
        Ok(resp.items.into_iter().map(Into::into).collect())
    }

    async fn pod_sandbox_status(&self, id: &str, verbose: bool) -> Result<PodSandboxStatus> {
        let req = proto::PodSandboxStatusRequest {
            pod_sandbox_id: id.to_string(),
            verbose,
        };
        let resp = self
            .runtime_call(
                "PodSandboxStatus",
                self.timeouts.call,
                req,
                |mut c, r| async move { c.pod_sandbox_status(r).await },
            )
            .await?;
        convert::sandbox_status(resp).ok_or_else(|| missing("PodSandboxStatus", "status"))
    }

    async fn list_containers(&self, filter: ContainerFilter) -> Result<Vec<Container>> {
        let req = proto::ListContainersRequest {
            filter: Some(convert::container_filter(filter)),
        };
        let resp = self
            .runtime_call(
                "ListContainers",
                self.timeouts.call,
                req,
                |mut c, r| async move { c.list_containers(r).await },
            )
            .await?;
        Ok(resp.containers.into_iter().map(Into::into).collect())
    }

    async fn container_status(&self, id: &str, verbose: bool) -> Result<ContainerStatus> {
        let req = proto::ContainerStatusRequest {
            container_id: id.to_string(),
            verbose,
        };
        let resp = self
            .runtime_call(
                "ContainerStatus",
                self.timeouts.call,
                req,
                |mut c, r| async move { c.container_status(r).await },
            )
            .await?;
        convert::container_status(resp).ok_or_else(|| missing("ContainerStatus", "status"))
    }

    async fn stop_container(&self, id: &str, grace: Duration) -> Result<()> {
        let req = proto::StopContainerRequest {
            container_id: id.to_string(),
            // the CRI takes whole seconds; round up so the grace is never shortened
            timeout: i64::try_from(grace.as_secs() + u64::from(grace.subsec_nanos() > 0))
                .unwrap_or(i64::MAX),
        };
        let timeout = grace + self.timeouts.call + CALL_SLACK;
        self.runtime_call("StopContainer", timeout, req, |mut c, r| async move {
            c.stop_container(r).await
        })
        .await?;
        Ok(())
    }

    async fn exec_sync(&self, id: &str, cmd: Vec<String>, timeout: Duration) -> Result<ExecResult> {
        let limit = self.exec_output_limit;
        let req = proto::ExecSyncRequest {
            container_id: id.to_string(),
            cmd,
            timeout: i64::try_from(timeout.as_secs().max(1)).unwrap_or(i64::MAX),
        };
        let resp = self
            .runtime_call(
                "ExecSync",
                timeout + CALL_SLACK,
                req,
                move |c, r| async move { c.max_decoding_message_size(limit).exec_sync(r).await },
            )
            .await?;
        Ok(ExecResult {
            stdout: resp.stdout,
            stderr: resp.stderr,
            exit_code: resp.exit_code,
        })
    }

    fn container_events(&self) -> BoxStream<'static, Result<ContainerEvent>> {
        let endpoint = self.endpoint.to_string();
        let mut client = self.runtime.clone();
        // No deadline, not even on the first message: a runtime sends the response headers
        // with its first event, which on a quiet node may come hours later. The stream is as
        // healthy as its connection (a runtime that exits or restarts closes the socket; the
        // channel's HTTP/2 keepalive finds a peer that vanished without closing it), and it
        // ends when the caller drops it.
        futures::stream::once(async move {
            client
                .get_container_events(proto::GetEventsRequest {})
                .await
        })
        .flat_map(move |call| match call {
            Ok(response) => {
                let endpoint = endpoint.clone();
                response
                    .into_inner()
                    .map(move |item| {
                        item.map(convert::container_event)
                            .map_err(|s| CriError::from_status(&endpoint, "GetContainerEvents", s))
                    })
                    .boxed()
            }
            Err(s) => futures::stream::once(futures::future::ready(Err(CriError::from_status(
                &endpoint,
                "GetContainerEvents",
                s,
            ))))
            .boxed(),
        })
        .boxed()
    }
}

#[cfg(feature = "test-util")]
impl KubeletService for RemoteRuntime {
    async fn run_pod_sandbox(&self, config: SandboxConfig) -> Result<String> {
        let req = proto::RunPodSandboxRequest {
            config: Some(convert::sandbox_config(config)),
            runtime_handler: String::new(),
        };
        // creating a sandbox may pull the pause image
        let timeout = self.slow_call_timeout();
        let resp = self
            .runtime_call("RunPodSandbox", timeout, req, |mut c, r| async move {
                c.run_pod_sandbox(r).await
            })
            .await?;
        Ok(resp.pod_sandbox_id)
    }

    async fn stop_pod_sandbox(&self, id: &str) -> Result<()> {
        let req = proto::StopPodSandboxRequest {
            pod_sandbox_id: id.to_string(),
        };
        let timeout = self.slow_call_timeout();
        self.runtime_call("StopPodSandbox", timeout, req, |mut c, r| async move {
            c.stop_pod_sandbox(r).await
        })
        .await?;
        Ok(())
    }

    async fn remove_pod_sandbox(&self, id: &str) -> Result<()> {
        let req = proto::RemovePodSandboxRequest {
            pod_sandbox_id: id.to_string(),
        };
        let timeout = self.slow_call_timeout();
        self.runtime_call("RemovePodSandbox", timeout, req, |mut c, r| async move {
            c.remove_pod_sandbox(r).await
        })
        .await?;
        Ok(())
    }

    async fn create_container(
        &self,
        sandbox_id: &str,
        config: ContainerConfig,
        sandbox: SandboxConfig,
    ) -> Result<String> {
        let req = proto::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.to_string(),
            config: Some(convert::container_config(config)),
            sandbox_config: Some(convert::sandbox_config(sandbox)),
        };
        let timeout = self.slow_call_timeout();
        let resp = self
            .runtime_call("CreateContainer", timeout, req, |mut c, r| async move {
                c.create_container(r).await
            })
            .await?;
        Ok(resp.container_id)
    }

    async fn start_container(&self, id: &str) -> Result<()> {
        let req = proto::StartContainerRequest {
            container_id: id.to_string(),
        };
        let timeout = self.slow_call_timeout();
        self.runtime_call("StartContainer", timeout, req, |mut c, r| async move {
            c.start_container(r).await
        })
        .await?;
        Ok(())
    }

    async fn remove_container(&self, id: &str) -> Result<()> {
        let req = proto::RemoveContainerRequest {
            container_id: id.to_string(),
        };
        let timeout = self.slow_call_timeout();
        self.runtime_call("RemoveContainer", timeout, req, |mut c, r| async move {
            c.remove_container(r).await
        })
        .await?;
        Ok(())
    }
}

impl ImageService for RemoteRuntime {
    async fn list_images(&self) -> Result<Vec<Image>> {
        let req = proto::ListImagesRequest { filter: None };
        let resp = self
            .image_call(
                "ListImages",
                self.timeouts.call,
                req,
                |mut c, r| async move { c.list_images(r).await },
            )
            .await?;
        Ok(resp.images.into_iter().map(Into::into).collect())
    }

    async fn image_status(&self, image: &str) -> Result<Option<Image>> {
        Ok(self
            .image_status_verbose(image, false)
            .await?
            .map(|(i, _)| i))
    }

    async fn list_images_matching(&self, image: &str) -> Result<Vec<Image>> {
        let req = proto::ListImagesRequest {
            filter: Some(proto::ImageFilter {
                image: Some(convert::image_spec(image)),
            }),
        };
        let resp = self
            .image_call(
                "ListImages",
                self.timeouts.call,
                req,
                |mut c, r| async move { c.list_images(r).await },
            )
            .await?;
        Ok(resp.images.into_iter().map(Into::into).collect())
    }

    async fn image_status_verbose(
        &self,
        image: &str,
        verbose: bool,
    ) -> Result<Option<(Image, StringMap)>> {
        let req = proto::ImageStatusRequest {
            image: Some(convert::image_spec(image)),
            verbose,
        };
        match self
            .image_call(
                "ImageStatus",
                self.timeouts.call,
                req,
                |mut c, r| async move { c.image_status(r).await },
            )
            .await
        {
            // containerd answers OK with no image; other runtimes answer NotFound
            Ok(resp) => Ok(resp.image.map(|i| (i.into(), resp.info))),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn pull_image(&self, request: PullRequest, timeout: Duration) -> Result<String> {
        let req = convert::pull_request(request);
        let resp = self
            .image_call("PullImage", timeout, req, |mut c, r| async move {
                c.pull_image(r).await
            })
            .await?;
        Ok(resp.image_ref)
    }

    async fn remove_image(&self, image: &str) -> Result<()> {
        let req = proto::RemoveImageRequest {
            image: Some(convert::image_spec(image)),
        };
        let timeout = self.slow_call_timeout();
        self.image_call("RemoveImage", timeout, req, |mut c, r| async move {
            c.remove_image(r).await
        })
        .await?;
        Ok(())
    }

    async fn image_fs_info(&self) -> Result<Vec<FilesystemUsage>> {
        Ok(self.image_fs_info_full().await?.image_filesystems)
    }

    async fn image_fs_info_full(&self) -> Result<ImageFsInfo> {
        let req = proto::ImageFsInfoRequest {};
        let resp = self
            .image_call(
                "ImageFsInfo",
                self.timeouts.call,
                req,
                |mut c, r| async move { c.image_fs_info(r).await },
            )
            .await?;
        Ok(ImageFsInfo {
            image_filesystems: resp.image_filesystems.into_iter().map(Into::into).collect(),
            container_filesystems: resp
                .container_filesystems
                .into_iter()
                .map(Into::into)
                .collect(),
        })
    }
}
