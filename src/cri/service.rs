//! The calls the daemon, `kruised crictl` and the tests' kubelet make on a runtime, in domain
//! types: [`RuntimeService`], [`KubeletService`] (test machinery), [`ImageService`].

use std::future::Future;
use std::time::Duration;

use futures::stream::BoxStream;

use super::detail::{ContainerStats, ContainerStatsFilter, ImageFsInfo};
use super::error::Result;
use super::parts::{FilesystemUsage, StringMap};
use super::types::*;

/// The runtime side of the CRI that the daemon and `kruised crictl` call: sandboxes and
/// containers listed and inspected, stops, exec, events.
pub trait RuntimeService: Send + Sync {
    /// The runtime's name and versions.
    fn version(&self) -> impl Future<Output = Result<RuntimeVersion>> + Send;
    /// The runtime's readiness conditions.
    fn status(&self) -> impl Future<Output = Result<RuntimeStatus>> + Send;
    /// The runtime's conditions, handlers and features; `verbose` adds the runtime's `info`.
    fn runtime_status(&self, verbose: bool) -> impl Future<Output = Result<RuntimeStatus>> + Send;
    /// Resource usage of the containers matching the filter.
    fn list_container_stats(
        &self,
        filter: ContainerStatsFilter,
    ) -> impl Future<Output = Result<Vec<ContainerStats>>> + Send;
    /// Sandboxes matching the filter.
    fn list_pod_sandboxes(
        &self,
        filter: SandboxFilter,
    ) -> impl Future<Output = Result<Vec<PodSandbox>>> + Send;
    /// One sandbox's status; `verbose` adds the runtime's `info`.
    fn pod_sandbox_status(
        &self,
        id: &str,
        verbose: bool,
    ) -> impl Future<Output = Result<PodSandboxStatus>> + Send;
    /// Containers matching the filter.
    fn list_containers(
        &self,
        filter: ContainerFilter,
    ) -> impl Future<Output = Result<Vec<Container>>> + Send;
    /// One container's status; `verbose` adds the runtime's `info` (containerd and CRI-O include
    /// the OCI spec there).
    fn container_status(
        &self,
        id: &str,
        verbose: bool,
    ) -> impl Future<Output = Result<ContainerStatus>> + Send;
    /// Stops a container: SIGTERM, then SIGKILL after `grace`.
    fn stop_container(&self, id: &str, grace: Duration) -> impl Future<Output = Result<()>> + Send;
    /// Runs a command in a container and waits for it, at most `timeout`.
    fn exec_sync(
        &self,
        id: &str,
        cmd: Vec<String>,
        timeout: Duration,
    ) -> impl Future<Output = Result<ExecResult>> + Send;
    /// The runtime's stream of container lifecycle events (CRI `GetContainerEvents`). The call
    /// is made when the stream is first polled and has no deadline: a quiet runtime sends
    /// nothing, for as long as it stays quiet. It fails when the runtime goes away; runtimes
    /// without the call fail it with [`CriError::Unsupported`](super::error::CriError::Unsupported) (containerd 1.6), and some end it
    /// at once without an event (CRI-O without `enable_pod_events`). Dropping it ends the call.
    fn container_events(&self) -> BoxStream<'static, Result<ContainerEvent>>;
}

/// The kubelet's side of the runtime service: sandboxes and containers made, started, stopped
/// and removed. The tests' kubelet calls it; the daemon and `kruised crictl` never do, so it is
/// test machinery (feature `test-util`), like the fake runtime.
#[cfg(feature = "test-util")]
pub trait KubeletService: RuntimeService {
    /// Creates and starts a sandbox; returns its ID.
    fn run_pod_sandbox(&self, config: SandboxConfig)
    -> impl Future<Output = Result<String>> + Send;
    /// Stops a sandbox and all its containers.
    fn stop_pod_sandbox(&self, id: &str) -> impl Future<Output = Result<()>> + Send;
    /// Removes a stopped sandbox.
    fn remove_pod_sandbox(&self, id: &str) -> impl Future<Output = Result<()>> + Send;
    /// Creates a container in a sandbox; returns its ID.
    fn create_container(
        &self,
        sandbox_id: &str,
        config: ContainerConfig,
        sandbox: SandboxConfig,
    ) -> impl Future<Output = Result<String>> + Send;
    /// Starts a created container.
    fn start_container(&self, id: &str) -> impl Future<Output = Result<()>> + Send;
    /// Removes a container.
    fn remove_container(&self, id: &str) -> impl Future<Output = Result<()>> + Send;
}

/// The image side of the CRI.
pub trait ImageService: Send + Sync {
    /// Images held by the runtime.
    fn list_images(&self) -> impl Future<Output = Result<Vec<Image>>> + Send;
    /// One image by reference; `None` when the runtime does not have it.
    fn image_status(&self, image: &str) -> impl Future<Output = Result<Option<Image>>> + Send;
    /// Pulls an image; returns the runtime's reference to it (the image ID on containerd).
    fn pull_image(
        &self,
        request: PullRequest,
        timeout: Duration,
    ) -> impl Future<Output = Result<String>> + Send;
    /// Removes an image.
    fn remove_image(&self, image: &str) -> impl Future<Output = Result<()>> + Send;
    /// Usage of the filesystems that hold images.
    fn image_fs_info(&self) -> impl Future<Output = Result<Vec<FilesystemUsage>>> + Send;

    // The calls below serve inspection (`kruised crictl`). Doubles that do not model them get
    // these defaults, built on the calls above.

    /// Images matching a reference, as the runtime filters them (many runtimes ignore the
    /// filter and list everything).
    fn list_images_matching(&self, image: &str) -> impl Future<Output = Result<Vec<Image>>> + Send {
        let _ = image;
        self.list_images()
    }
    /// One image with the runtime's verbose `info`; `None` when the runtime does not have it.
    fn image_status_verbose(
        &self,
        image: &str,
        verbose: bool,
    ) -> impl Future<Output = Result<Option<(Image, StringMap)>>> + Send {
        let _ = verbose;
        async move {
            Ok(self
                .image_status(image)
                .await?
                .map(|i| (i, StringMap::new())))
        }
    }
    /// Usage of the filesystems holding images and, where separate, container layers.
    fn image_fs_info_full(&self) -> impl Future<Output = Result<ImageFsInfo>> + Send {
        async move {
            Ok(ImageFsInfo {
                image_filesystems: self.image_fs_info().await?,
                container_filesystems: Vec::new(),
            })
        }
    }
}
