//! One NodeImage tag's pull task: waits for a pull slot, then makes up to `backoffLimit + 1`
//! attempts and ends `Succeeded` or `Failed` (see `state.rs`). Each phase change is written
//! into the tag's shared status cell and announced to the controller, which reports it.
//!
//! One attempt:
//!
//! 1. `IfNotPresent`: if the runtime already holds the image (names compared after docker
//!    normalisation), done without pulling;
//! 2. disk check: `ImageFsInfo` and statvfs of its mount point; below the floor the tag fails at
//!    once (retrying would not make room);
//! 3. credentials: the tag's pull secrets, matched to the image's registry; problems with them
//!    go into the tag's message, and the pull goes on with what was found;
//! 4. `PullImage` through the shared [`Puller`], each credential in turn.
//!
//! A failed attempt after which the runtime does not answer at all (`ImageFsInfo` unreachable:
//! containerd restarting or crashed) does not count: the task asks every 250 ms and makes the
//! next attempt as soon as the runtime answers, within `activeDeadlineSeconds` when one is set.
//! kruise-daemon spends its `backoffLimit` on such failures and fails the tag after ~7 s.
//!
//! A task whose tag left the spec (or got a new version) is cancelled: it stops waiting, its pull
//! is cancelled unless another task shares it, and it writes and records nothing more.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use tokio::sync::{Notify, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Settings;
use super::disk;
use super::metrics::{Metrics, Outcome, Source};
use super::pull::{PullSpec, Puller, scrub};
use super::reference::Reference;
use super::secrets::Credentials;
use super::state;
use crate::cri::{Image, ImageService, PullSandbox};
use crate::k8s::crd::{ImageTagSpec, ImageTagStatus, ReferenceObject, SandboxConfig};
use crate::k8s::keys;
use crate::k8s::write::{EventSink, EventSpec};

/// Reason of the event of a successful pull (kruise's).
pub const REASON_SUCCEEDED: &str = "PullImageSucceed";
/// Reason of the event of a failed pull (kruise's).
pub const REASON_FAILED: &str = "PullImageFailed";
/// The `action` of both events.
const EVENT_ACTION: &str = "PullImage";

/// What every task shares.
pub struct Env<I, C> {
    /// Pulls, merged when identical.
    pub puller: Arc<Puller<I>>,
    /// Pull secrets.
    pub credentials: Arc<C>,
    /// Pull slots (`--max-workers-for-pull-image`); `None`: unlimited.
    pub slots: Option<Arc<Semaphore>>,
    /// Tunables.
    pub settings: Settings,
    /// Metrics.
    pub metrics: Metrics,
    /// Events; `None` records none.
    pub events: Option<EventSink>,
    /// Free bytes of a path (statvfs; replaced in tests).
    pub free_space: fn(&Path) -> Option<u64>,
    /// Where tasks run.
    pub tracker: tokio_util::task::TaskTracker,
}

/// One tag to pull.
#[derive(Clone, Debug)]
pub struct TagJob {
    /// The image name, as the NodeImage key spells it.
    pub image: String,
    /// The tag's spec.
    pub spec: ImageTagSpec,
    /// The image's pull secrets.
    pub pull_secrets: Vec<ReferenceObject>,
    /// The image's sandbox config.
    pub sandbox: Option<SandboxConfig>,
    /// The NodeImage, for events.
    pub node_image: ObjectReference,
}

/// The shared status cell of a tag.
pub type Cell = Arc<Mutex<ImageTagStatus>>;

/// Why an attempt failed.
#[derive(Debug, thiserror::Error)]
pub enum AttemptError {
    /// Worth another attempt (a pull error, a timeout).
    #[error("{0}")]
    Retry(String),
    /// Another attempt cannot help (no space, an invalid reference).
    #[error("{0}")]
    Final(String),
}

/// A successful attempt.
struct Done {
    image_id: String,
    message: String,
}

fn update(cell: &Cell, f: impl FnOnce(&mut ImageTagStatus)) {
    let mut s = crate::sync::lock(cell);
    f(&mut s);
}

/// The CRI sandbox config of a pull: the image's labels and annotations plus kruise's
/// `pulling-image-by` annotation.
pub fn pull_sandbox(sandbox: Option<&SandboxConfig>) -> PullSandbox {
    let mut s = PullSandbox::default();
    if let Some(c) = sandbox {
        s.labels = c.labels.clone();
        s.annotations = c.annotations.clone();
    }
    s.annotations.insert(
        keys::PULLING_IMAGE_BY.to_string(),
        keys::PULLING_IMAGE_BY_KRUISE_DAEMON.to_string(),
    );
    s
}

/// The image the runtime holds under `reference`, if any: tags and digests compared after
/// normalisation (`nginx:1` is `docker.io/library/nginx:1`).
pub fn find_image<'a>(images: &'a [Image], reference: &Reference) -> Option<&'a Image> {
    let want = reference.pull_key();
    let matches = |name: &String| {
        Reference::parse(name)
            .map(|r| r.pull_key() == want)
            .unwrap_or(false)
    };
    images.iter().find(|i| {
        if reference.digest.is_some() {
            i.repo_digests.iter().any(matches)
        } else {
            i.repo_tags.iter().any(matches)
        }
    })
}

/// Runs one tag's task to the end (or until `cancel`).
pub async fn run<I, C>(
    env: Arc<Env<I, C>>,
    job: TagJob,
    cell: Cell,
    changed: Arc<Notify>,
    cancel: CancellationToken,
) where
    I: ImageService + Clone + 'static,
    C: Credentials,
{
    let _permit = match &env.slots {
        Some(slots) => tokio::select! {
            () = cancel.cancelled() => return,
            p = slots.clone().acquire_owned() => match p {
                Ok(p) => Some(p),
                // closed only at shutdown
                Err(_) => return,
            },
        },
        None => None,
    };
    let started = Instant::now();
    update(&cell, |s| state::start_pulling(s, state::now()));
    changed.notify_one();
    tracing::info!("pulling");

    let outcome = tokio::select! {
        () = cancel.cancelled() => {
            tracing::info!("stopped: the tag left the spec or got a new version");
            return;
        }
        o = attempts(&env, &job) => o,
    };
    let took = started.elapsed();
    let name_tag = format!("{}:{}", job.image, job.spec.tag);
    match outcome {
        Ok(done) => {
            tracing::info!(image_id = %done.image_id, ?took, "pulled");
            update(&cell, |s| {
                state::succeed(s, state::now(), done.image_id, done.message)
            });
            record(
                &env,
                &job,
                false,
                REASON_SUCCEEDED,
                format!("Image {name_tag}, elapsedTime {took:.3?}"),
            );
        }
        Err(message) => {
            tracing::warn!(%message, ?took, "pull failed");
            record(
                &env,
                &job,
                true,
                REASON_FAILED,
                format!("Image {name_tag} {message}"),
            );
            update(&cell, |s| state::fail(s, state::now(), message));
        }
    }
    changed.notify_one();
}

/// Records an event on the NodeImage and on each owner of the tag.
fn record<I, C>(env: &Env<I, C>, job: &TagJob, warning: bool, reason: &str, note: String) {
    let Some(events) = &env.events else { return };
    for regarding in job
        .spec
        .owner_references
        .iter()
        .chain(std::iter::once(&job.node_image))
    {
        events.record(EventSpec {
            regarding: regarding.clone(),
            warning,
            reason: reason.to_string(),
            note: note.clone(),
            action: EVENT_ACTION.to_string(),
        });
    }
}

/// The attempts of a task; the message of the last failure when all fail.
async fn attempts<I, C>(env: &Env<I, C>, job: &TagJob) -> Result<Done, String>
where
    I: ImageService + Clone + 'static,
    C: Credentials,
{
    let reference =
        Reference::from_name_tag(&job.image, &job.spec.tag).map_err(|e| e.to_string())?;
    let limit = job.spec.backoff_limit();
    let timeout = job.spec.timeout();
    let deadline = job
        .spec
        .active_deadline()
        .map(|d| crate::controller::later(Instant::now(), d));
    let mut last_error = None;
    let mut attempt = 0;
    while attempt <= limit {
        let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        let Some(budget) = state::attempt_budget(timeout, left) else {
            return Err(deadline_message(last_error));
        };
        let result =
            match tokio::time::timeout(budget, attempt_once(env, job, &reference, budget)).await {
                Ok(r) => r,
                Err(_) => Err(AttemptError::Retry(format!(
                    "pulling image {}:{} timed out after {budget:?}",
                    job.image, job.spec.tag
                ))),
            };
        match result {
            Ok(done) => return Ok(done),
            Err(AttemptError::Final(m)) => return Err(m),
            Err(AttemptError::Retry(m)) => {
                // a runtime that is away (restarting, crashed) did not refuse the image: the
                // attempt does not count, and the next one starts as soon as it answers again
                if let Some(away) = runtime_away(env).await {
                    tracing::warn!(error = %m, runtime = %away, "pull cut off: the runtime is unreachable; waiting for it, the attempt does not count");
                    last_error = Some(m);
                    if !wait_for_runtime(env, deadline).await {
                        return Err(deadline_message(last_error));
                    }
                    tracing::info!("the runtime answers again; pulling");
                    continue;
                }
                tracing::warn!(attempt = attempt + 1, of = limit + 1, error = %m, "pull attempt failed");
                last_error = Some(m);
            }
        }
        attempt += 1;
        if attempt <= limit {
            let pause = crate::controller::exponential(
                attempt - 1,
                env.settings.backoff_base,
                env.settings.backoff_cap,
            );
            if !pause_within(pause, deadline).await {
                return Err(deadline_message(last_error));
            }
        }
    }
    Err(last_error.unwrap_or_else(|| "pull failed".to_string()))
}

/// How often a task waiting for an unreachable runtime asks whether it answers again.
const RUNTIME_POLL: Duration = Duration::from_millis(250);

/// The error when the runtime does not answer at all; `None` when it answers (even with an
/// error of its own).
async fn runtime_away<I, C>(env: &Env<I, C>) -> Option<crate::cri::CriError>
where
    I: ImageService + Clone + 'static,
{
    match env.puller.runtime().image_fs_info().await {
        Err(e @ crate::cri::CriError::Unreachable { .. }) => Some(e),
        _ => None,
    }
}

/// Waits until the runtime answers; false when the deadline passes first.
async fn wait_for_runtime<I, C>(env: &Env<I, C>, deadline: Option<Instant>) -> bool
where
    I: ImageService + Clone + 'static,
{
    loop {
        if !pause_within(RUNTIME_POLL, deadline).await {
            return false;
        }
        if runtime_away(env).await.is_none() {
            return true;
        }
    }
}

/// Waits `pause`; when the deadline comes first, waits until it and returns false.
async fn pause_within(pause: Duration, deadline: Option<Instant>) -> bool {
    match deadline {
        Some(d) if crate::controller::later(Instant::now(), pause) >= d => {
            tokio::time::sleep_until(d).await;
            false
        }
        _ => {
            tokio::time::sleep(pause).await;
            true
        }
    }
}

fn deadline_message(last_error: Option<String>) -> String {
    match last_error {
        Some(e) => format!("pulling exceeds the activeDeadlineSeconds; last error: {e}"),
        None => "pulling exceeds the activeDeadlineSeconds".to_string(),
    }
}

/// One attempt: presence check, disk check, credentials, pull.
async fn attempt_once<I, C>(
    env: &Env<I, C>,
    job: &TagJob,
    reference: &Reference,
    budget: Duration,
) -> Result<Done, AttemptError>
where
    I: ImageService + Clone + 'static,
    C: Credentials,
{
    let runtime = env.puller.runtime();
    if job.spec.if_not_present() {
        match runtime.list_images().await {
            Ok(images) => {
                if let Some(image) = find_image(&images, reference) {
                    tracing::info!(image_id = %image.id, "image already present (IfNotPresent)");
                    env.metrics.pulled(Source::NodeImage, Outcome::Present);
                    return Ok(Done {
                        image_id: format!("{}@{}", job.image, image.id),
                        message: String::new(),
                    });
                }
            }
            Err(e) => return Err(AttemptError::Retry(format!("listing images: {e}"))),
        }
    }
    if let Some(refusal) = disk_refusal(env, Source::NodeImage).await {
        return Err(AttemptError::Final(refusal));
    }

    let resolved = env
        .credentials
        .resolve_for(&job.pull_secrets, &reference.name())
        .await;
    let credentials = resolved.keyring.lookup(&reference.name());
    let secrets = resolved.keyring.secrets();
    let problems = resolved.problems.join("; ");
    if !problems.is_empty() {
        tracing::warn!(%problems, "pull secrets could not all be used; pulling with what was found");
    }
    tracing::debug!(
        credentials = credentials.len(),
        "pulling through the runtime"
    );
    let spec = PullSpec {
        image: reference_string(job),
        key: reference.pull_key(),
        credentials,
        secrets: secrets.clone(),
        sandbox: Some(pull_sandbox(job.sandbox.as_ref())),
        source: Source::NodeImage,
    };
    let with_problems = |m: String| {
        if problems.is_empty() {
            m
        } else {
            format!("{m} ({problems})")
        }
    };
    match env.puller.pull(spec, budget).await {
        Ok(image_ref) => {
            let id = if crate::cri::dialect::is_image_id(&image_ref) {
                image_ref
            } else {
                runtime
                    .list_images()
                    .await
                    .ok()
                    .and_then(|images| find_image(&images, reference).map(|i| i.id.clone()))
                    .unwrap_or(image_ref)
            };
            Ok(Done {
                image_id: format!("{}@{id}", job.image),
                message: problems,
            })
        }
        Err(e) => {
            env.credentials.invalidate(&job.pull_secrets);
            Err(AttemptError::Retry(with_problems(scrub(
                &e.to_string(),
                &secrets,
            ))))
        }
    }
}

/// The image as sent to the runtime: `<name>:<tag>` as kruise sends it, or `<name>@<digest>`
/// when the tag is a digest (kruise sends `<name>:<digest>`, which no runtime accepts).
fn reference_string(job: &TagJob) -> String {
    if super::reference::is_digest(&job.spec.tag) {
        format!("{}@{}", job.image, job.spec.tag)
    } else {
        format!("{}:{}", job.image, job.spec.tag)
    }
}

/// Updates the image filesystem gauges; below the floor (`--image-fs-min-free`), why the pull
/// of `source` is refused. The one disk check of every pull, NodeImage and next batch.
pub(super) async fn disk_refusal<I, C>(env: &Env<I, C>, source: Source) -> Option<String>
where
    I: ImageService + Clone + 'static,
{
    let usage = match env.puller.runtime().image_fs_info().await {
        Ok(u) => u,
        Err(e) => {
            tracing::debug!(error = %e, "ImageFsInfo failed; no disk check");
            return None;
        }
    };
    let Some(fs) = disk::image_fs(&usage, env.free_space) else {
        tracing::debug!("the runtime reports no image filesystem; no disk check");
        return None;
    };
    env.metrics.image_fs(fs.used_bytes, fs.free_bytes);
    let floor = env.settings.image_fs_min_free;
    if floor > 0 && fs.free_bytes.is_none() {
        tracing::debug!(mountpoint = %fs.mountpoint, "the image filesystem is not visible here; no disk check");
    }
    let refusal = disk::refusal(&fs, floor);
    if refusal.is_some() {
        env.metrics.pulled(source, Outcome::Failed);
    }
    refusal
}

#[cfg(test)]
#[path = "task_tests.rs"]
pub(super) mod tests;
