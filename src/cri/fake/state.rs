//! What the fake runtime holds: sandboxes, containers, images, the calls it received and the
//! failures it was told to answer; and how its dialect names a container's image.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Duration;

use super::super::parts::*;
use super::super::types::*;
use super::dialect::{Call, Dialect, ImageOfContainer, split_tag};

/// A container in the fake runtime.
#[derive(Clone, Debug)]
pub struct FakeContainer {
    /// What the CRI reports for it (its image fields as the dialect's `ContainerStatus` does).
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
    /// The image it was created from, from which each call's image fields are made.
    pub image: ImageOfContainer,
}

/// An injected failure of one call.
#[derive(Clone, Debug)]
pub(super) struct Fault {
    pub code: tonic::Code,
    pub message: String,
}

/// Everything the fake runtime holds; tests reach it through [`super::FakeRuntime::state`].
#[derive(Debug, Default)]
pub struct FakeState {
    /// containerd's content ingests in flight, as `ListStatuses` in namespace `k8s.io` answers
    /// them (pull progress); `None`: the content service answers `Unimplemented`, as CRI-O.
    pub ingests: Option<Vec<crate::cri::containerd::content::Ingest>>,
    /// Sandboxes by ID, with their status.
    pub sandboxes: BTreeMap<String, PodSandboxStatus>,
    /// Containers by ID.
    pub containers: BTreeMap<String, FakeContainer>,
    /// Images by ID (in the dialect's form: bare hex on CRI-O).
    pub images: BTreeMap<String, Image>,
    /// Every pull request received, in order.
    pub pulls: Vec<PullRequest>,
    /// Pulls in flight now, and the most seen at once.
    pub pulls_in_flight: usize,
    /// The largest number of concurrent pulls seen.
    pub max_concurrent_pulls: usize,
    /// Pulls whose caller went away before they ended (the call cancelled).
    pub pulls_cancelled: usize,
    /// Calls received, per RPC name.
    pub calls: BTreeMap<String, u64>,
    /// Every StopContainer received: container ID and when.
    pub stops: Vec<(String, std::time::Instant)>,
    /// `GetContainerEvents` ends at once with no event and status OK, as CRI-O does without
    /// `enable_pod_events` (its default; [`Dialect::CriOWithoutPodEvents`] does it too).
    pub events_off: bool,
    pub(super) dialect: Dialect,
    pub(super) faults: HashMap<String, VecDeque<Fault>>,
    pub(super) delays: HashMap<String, Duration>,
    pub(super) pull_failures: HashMap<String, (tonic::Code, String)>,
    /// Bumped by [`super::FakeRuntime::end_pulls_in_flight`].
    pub(super) pulls_ended: u64,
    /// Tags whose image is another tag's (same content, so the same ID).
    pub(super) same_as: HashMap<String, String>,
    next_id: u64,
}

pub(super) fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100000001b3)
    })
}

/// 64 hex digits made from `seed` (an image ID or digest of the fake's images).
fn hex64(seed: &str) -> String {
    (0..4)
        .map(|i| format!("{:016x}", fnv(&format!("{i}/{seed}"))))
        .collect()
}

/// The fake stamps its times on the runtime's clock, which a test's paused tokio clock moves.
pub(super) fn now_ns() -> i64 {
    crate::cri::clock::now_ns()
}

impl FakeState {
    pub(super) fn new(dialect: Dialect) -> Self {
        FakeState {
            dialect,
            events_off: dialect == Dialect::CriOWithoutPodEvents,
            ..Default::default()
        }
    }

    pub(super) fn new_id(&mut self, prefix: &str) -> String {
        self.next_id += 1;
        format!("{prefix}{:060x}", self.next_id)
    }

    /// The runtime this state answers as.
    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// Calls received for one RPC (e.g. `"StopContainer"`).
    pub fn call_count(&self, rpc: &str) -> u64 {
        self.calls.get(rpc).copied().unwrap_or(0)
    }

    /// Makes `tag` the same image as `as_tag` (the same content pushed under two names): a
    /// pull of either gives the one image both tags.
    pub fn same_image(&mut self, tag: &str, as_tag: &str) {
        self.same_as.insert(tag.to_string(), as_tag.to_string());
    }

    /// Adds an image under a tag (if it has no image yet); returns its ID, in the dialect's
    /// form.
    pub fn add_image(&mut self, tag: &str) -> String {
        let content = self
            .same_as
            .get(tag)
            .cloned()
            .unwrap_or_else(|| tag.to_string());
        let real = self.dialect.real_images();
        let id = if real {
            self.dialect.image_id(&hex64(&content))
        } else {
            format!("sha256:{:064x}", fnv(&content))
        };
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
        if real {
            let digest = repo_digest(tag, &content);
            if !image.repo_digests.contains(&digest) {
                image.repo_digests.push(digest);
            }
        }
        id
    }

    /// The image `name` names: its ID (with or without `sha256:`), a tag or a repo digest.
    pub fn find_image(&self, name: &str) -> Option<&Image> {
        let bare = |s: &str| s.strip_prefix("sha256:").unwrap_or(s).to_string();
        self.images.values().find(|i| {
            bare(&i.id) == bare(name)
                || i.repo_tags.iter().any(|t| t == name)
                || i.repo_digests.iter().any(|d| d == name)
        })
    }

    /// The image a new container created with `image` (a tag or an image ID, as the kubelet
    /// passes it) and `user_specified` (the pod spec's image) runs; the image is added when
    /// `image` is an unknown tag.
    pub(super) fn image_for(&mut self, image: &str, user_specified: &str) -> ImageOfContainer {
        let known = self.find_image(image).map(|i| i.id.clone());
        let id = match known {
            Some(id) => id,
            None => self.add_image(image),
        };
        let Some(found) = self.images.get(&id) else {
            return ImageOfContainer::default();
        };
        let tag = [user_specified, image]
            .into_iter()
            .find(|t| found.repo_tags.iter().any(|r| r == t))
            .or_else(|| found.repo_tags.first().map(String::as_str))
            .unwrap_or_default()
            .to_string();
        let repo = split_tag(&tag).0;
        let repo_digest = found
            .repo_digests
            .iter()
            .find(|d| d.split('@').next() == Some(repo))
            .or_else(|| found.repo_digests.first())
            .cloned()
            .unwrap_or_default();
        ImageOfContainer {
            id,
            tag,
            repo_digest,
        }
    }

    /// Removes `name` as the dialect does: containerd the image with every tag, CRI-O a tag
    /// alone when the image has others.
    pub(super) fn remove_image(&mut self, name: &str) {
        let Some(id) = self.find_image(name).map(|i| i.id.clone()) else {
            return;
        };
        let Some(image) = self.images.get_mut(&id) else {
            return;
        };
        let is_tag = image.repo_tags.iter().any(|t| t == name);
        if self.dialect.removes_only_the_tag() && is_tag && image.repo_tags.len() > 1 {
            image.repo_tags.retain(|t| t != name);
            let repo = split_tag(name).0;
            if !image.repo_tags.iter().any(|t| split_tag(t).0 == repo) {
                image
                    .repo_digests
                    .retain(|d| d.split('@').next() != Some(repo));
            }
            return;
        }
        self.images.remove(&id);
    }

    /// What `ContainerStatus` answers for a container (not verbose).
    pub fn container_status(&self, id: &str) -> Option<ContainerStatus> {
        self.containers.get(id).map(|c| self.status_of(c))
    }

    pub(super) fn status_of(&self, c: &FakeContainer) -> ContainerStatus {
        let f = self.dialect.image_fields(&c.image, Call::Status);
        ContainerStatus {
            image: f.image,
            image_ref: f.image_ref,
            image_id: f.image_id,
            ..c.status.clone()
        }
    }

    /// What `ListContainers` answers for a container.
    pub(super) fn listed(&self, c: &FakeContainer) -> Container {
        let f = self.dialect.image_fields(&c.image, Call::List);
        Container {
            id: c.status.id.clone(),
            pod_sandbox_id: c.pod_sandbox_id.clone(),
            metadata: c.status.metadata.clone(),
            image: f.image,
            image_ref: f.image_ref,
            state: c.status.state,
            created_at: c.status.created_at,
            labels: c.status.labels.clone(),
            annotations: c.status.annotations.clone(),
            image_id: f.image_id,
            image_spec: c.status.detail.image_spec.clone(),
        }
    }

    /// A new container of `sandbox_id` in state `state`, from `config`; returns its ID.
    pub(super) fn insert_container(
        &mut self,
        sandbox_id: &str,
        config: ContainerConfig,
        state: ContainerState,
        env_in_info: bool,
        has_env_binary: bool,
    ) -> String {
        let image = self.image_for(&config.image, &config.user_specified_image);
        let id = self.new_id("c");
        let now = now_ns();
        let status = ContainerStatus {
            id: id.clone(),
            metadata: config.metadata,
            state,
            created_at: now,
            started_at: if state == ContainerState::Running {
                now
            } else {
                0
            },
            finished_at: 0,
            exit_code: 0,
            image: String::new(),
            image_ref: String::new(),
            image_id: String::new(),
            reason: String::new(),
            message: String::new(),
            labels: config.labels,
            annotations: config.annotations,
            log_path: config.log_path,
            info: StringMap::new(),
            detail: Default::default(),
        };
        let mut c = FakeContainer {
            status,
            pod_sandbox_id: sandbox_id.to_string(),
            env: config
                .envs
                .into_iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect(),
            env_in_info,
            has_env_binary,
            image,
        };
        // the stored status holds what `ContainerStatus` answers
        c.status = self.status_of(&c);
        self.containers.insert(id.clone(), c);
        id
    }

    /// A new ready host-network sandbox; returns its ID.
    pub(super) fn insert_sandbox(
        &mut self,
        metadata: SandboxMetadata,
        labels: StringMap,
        annotations: StringMap,
        ip: &str,
    ) -> String {
        let id = self.new_id("s");
        self.sandboxes.insert(
            id.clone(),
            PodSandboxStatus {
                sandbox: PodSandbox {
                    id: id.clone(),
                    metadata,
                    state: SandboxState::Ready,
                    created_at: now_ns(),
                    labels,
                    annotations,
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
}

/// The repo digest of `tag`'s repository for an image of `content`.
fn repo_digest(tag: &str, content: &str) -> String {
    format!(
        "{}@sha256:{}",
        split_tag(tag).0,
        hex64(&format!("manifest {content}"))
    )
}
