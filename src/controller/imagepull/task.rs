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
//! 4. admission by size (`admit.rs`, when a floor is kept): the image's size from its manifest,
//!    read with those credentials; an image that would take the filesystem below the floor or
//!    past the kubelet's GC threshold fails the attempt (retried: the GC may make room), or the
//!    tag at once when it would not fit even on the empty filesystem;
//! 5. `PullImage` through the shared [`Puller`], each credential in turn.
//!
//! Where the runtime shows what a pull has landed (containerd: `progress.rs`), the tag's
//! `progress` follows it, an attempt is cut off after `timeoutSeconds` without a byte landing
//! rather than after `timeoutSeconds` in all (a pull that progresses goes on, within
//! `activeDeadlineSeconds`), and a pull that lands nothing for `--image-pull-stall-timeout`
//! fails that attempt at once. Elsewhere an attempt is cut at `timeoutSeconds`, as kruise's.
//!
//! A failed attempt after which the runtime does not answer at all (`ImageFsInfo` unreachable:
//! containerd restarting or crashed) does not count: the task asks every 250 ms and makes the
//! next attempt as soon as the runtime answers, within `activeDeadlineSeconds` when one is set.
//! kruise-daemon spends its `backoffLimit` on such failures and fails the tag after ~7 s.
//!
//! An attempt called off because a pod on the node began to wait for its own image (`turn.rs`)
//! does not count either: the tag stays `Pulling` and pulls again in its turn, without backoff.
//!
//! A task whose tag left the spec (or got a new version) is cancelled: it stops waiting, its pull
//! is cancelled unless another task shares it, and it writes and records nothing more.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::admit::{self, Admission};
use super::disk;
use super::keyring::Credential;
use super::metrics::{Metrics, Outcome, Source};
use super::progress::{self, Landed};
use super::pull::{PullError, PullSpec, Puller, scrub};
use super::reference::{Reference, ReferenceError};
use super::secrets::{Credentials, Problem, problems_text};
use super::settings::Settings;
use super::slots::{Rank, Slots};
use super::state;
use super::turn::{CallOffs, MAX_CALL_OFFS, Turned};
use crate::cri::{CriError, Image, ImageService, PullSandbox};
use crate::k8s::crd::{ImageTagSpec, ImageTagStatus, ReferenceObject, SandboxConfig};
use crate::k8s::keys;
use crate::k8s::time::now_seconds;
use crate::k8s::write::{EventSink, EventSpec};

/// Reason of the event of a successful pull (kruise's).
pub const REASON_SUCCEEDED: &str = "PullImageSucceed";
/// Reason of the event of a failed pull (kruise's).
pub const REASON_FAILED: &str = "PullImageFailed";
/// The `action` of both events.
const EVENT_ACTION: &str = "PullImage";

/// What every pull task works with: the shared puller, the pull secrets, the pull slots, the
/// settings, metrics and events.
pub struct PullTools<I, C> {
    /// Pulls, merged when identical.
    pub puller: Arc<Puller<I>>,
    /// Pull secrets.
    pub credentials: Arc<C>,
    /// Pull slots (`--max-workers-for-pull-image`); `None`: unlimited.
    pub slots: Option<Arc<Slots>>,
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
    /// Told when an in-place update's new image is on the node for a pod; `None`: nobody.
    pub present: Option<PresentHook>,
    /// Whose turn: what pre-pulls yield to, their order and cap ([`super::turn`]).
    pub turn: super::turn::Turn,
    /// Admission of NodeImage and next-batch pulls by the image's size; `None`: off (no floor).
    pub admission: Option<Arc<Admission>>,
}

/// Told that an in-place update's new image is on the node for a pod: its namespace, its name,
/// the image, and since when (ns since the epoch, the runtime's clock). The in-place update
/// timelines' "image present" step (`controller::timeline`), kept a callback so the puller
/// does not depend on them.
pub type PresentHook = Arc<dyn Fn(&str, &str, &str, i64) + Send + Sync>;

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
pub type StatusCell = Arc<Mutex<ImageTagStatus>>;

/// Why an attempt failed.
#[derive(Debug, thiserror::Error)]
pub enum AttemptError {
    /// Listing the runtime's images (`IfNotPresent`) failed.
    #[error("listing images: {0}")]
    ListImages(CriError),
    /// The pull failed. What the tag's status says: the error scrubbed of the credentials'
    /// secrets, and the pull secrets' problems after it.
    #[error("{}", with_problems(.scrubbed, .problems.iter()))]
    Pull {
        /// Why.
        error: PullError,
        /// The error scrubbed of the credentials' secrets.
        scrubbed: String,
        /// The pull secrets' problems, each with whose it is.
        problems: Vec<Problem>,
    },
    /// The attempt ran out of its time.
    #[error("pulling image {reference} timed out after {budget:?}")]
    TimedOut {
        /// `<image>:<tag>` as the NodeImage names them.
        reference: String,
        /// The attempt's time.
        budget: Duration,
    },
    /// The image filesystem is below its floor: another attempt cannot help.
    #[error("{0}")]
    NoRoom(String),
    /// Not admitted by size now: the kubelet's GC may make room, or the registry answer later.
    #[error("{0}")]
    NotAdmitted(String),
}

/// `message`, and `problems` after it in brackets where there are any.
fn with_problems<'a>(message: &str, problems: impl IntoIterator<Item = &'a Problem>) -> String {
    let problems = problems_text(problems);
    if problems.is_empty() {
        message.to_string()
    } else {
        format!("{message} ({problems})")
    }
}

impl AttemptError {
    /// What an owner of the tag in `namespace` is told: the whole message but for the pull
    /// secrets' problems that are not its business ([`Problem::concerns`]).
    fn message_for(&self, namespace: &str) -> String {
        match self {
            AttemptError::Pull {
                scrubbed, problems, ..
            } => with_problems(scrubbed, problems.iter().filter(|p| p.concerns(namespace))),
            other => other.to_string(),
        }
    }

    /// Whether another attempt cannot help.
    fn is_final(&self) -> bool {
        matches!(self, AttemptError::NoRoom(_))
    }

    /// The runtime's error when it did not answer at all (restarting, crashed): it did not
    /// refuse the image, and the attempt does not count.
    fn runtime_away(&self) -> Option<&CriError> {
        match self {
            AttemptError::ListImages(e) if e.is_unreachable() => Some(e),
            AttemptError::Pull { error, .. } => error.runtime_away(),
            _ => None,
        }
    }
}

/// Why a tag's task failed: what its status and its event say.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    /// The NodeImage names no valid reference.
    #[error(transparent)]
    Reference(#[from] ReferenceError),
    /// The last attempt failed (or one after which another cannot help).
    #[error(transparent)]
    Attempt(#[from] AttemptError),
    /// The `activeDeadlineSeconds` passed first.
    #[error(
        "pulling exceeds the activeDeadlineSeconds{}",
        .last.as_ref().map(|e| format!("; last error: {e}")).unwrap_or_default()
    )]
    Deadline {
        /// The error of the last attempt, if one was made.
        last: Option<AttemptError>,
    },
}

impl TaskError {
    /// What an owner of the tag in `namespace` is told ([`AttemptError::message_for`]).
    fn message_for(&self, namespace: &str) -> String {
        match self {
            TaskError::Attempt(e) => e.message_for(namespace),
            TaskError::Deadline { last: Some(e) } => format!(
                "pulling exceeds the activeDeadlineSeconds; last error: {}",
                e.message_for(namespace)
            ),
            other => other.to_string(),
        }
    }
}

/// A successful attempt.
struct Done {
    image_id: String,
    message: String,
}

fn update(cell: &StatusCell, f: impl FnOnce(&mut ImageTagStatus)) {
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

/// One tag's task, to run to the end (or until `cancel`). Its place among the pre-pulls is
/// taken when it is made: tasks made in rank order wait in that order (`turn.rs`).
pub fn run<I, C>(
    tools: Arc<PullTools<I, C>>,
    job: TagJob,
    cell: StatusCell,
    changed: Arc<Notify>,
    cancel: CancellationToken,
) -> impl Future<Output = ()> + Send + 'static
where
    I: ImageService + Clone + 'static,
    C: Credentials,
{
    // the node's own pods first, then the tags in their order, at most the cap at once
    let rank = tools.turn.rank_of(&job.image, &job.spec);
    let turn = tools.turn.pre_pull(tools.slots.as_ref(), rank.clone());
    run_in_turn(tools, job, cell, changed, cancel, (turn, rank))
}

async fn run_in_turn<I, C>(
    tools: Arc<PullTools<I, C>>,
    job: TagJob,
    cell: StatusCell,
    changed: Arc<Notify>,
    cancel: CancellationToken,
    (turn, rank): (impl Future<Output = Turned>, Rank),
) where
    I: ImageService + Clone + 'static,
    C: Credentials,
{
    let mut turn = tokio::select! {
        () = cancel.cancelled() => return,
        t = turn => Some(t),
    };
    let started = Instant::now();
    update(&cell, |s| state::start_pulling(s, now_seconds()));
    changed.notify_one();
    tracing::info!("pulling");

    let (landed, shown) = tokio::sync::watch::channel(None);
    let show = |percent| {
        update(&cell, |s| {
            if s.phase == crate::k8s::crd::ImagePullPhase::Pulling {
                s.progress = percent;
            }
        });
        changed.notify_one();
    };
    let outcome = tokio::select! {
        () = cancel.cancelled() => {
            tracing::info!("stopped: the tag left the spec or got a new version");
            return;
        }
        o = attempts(&tools, &job, &landed, (&mut turn, &rank)) => o,
        never = progress::show(shown, show) => match never {},
    };
    let took = started.elapsed();
    let name_tag = format!("{}:{}", job.image, job.spec.tag);
    match outcome {
        Ok(done) => {
            tracing::info!(image_id = %done.image_id, ?took, "pulled");
            update(&cell, |s| {
                state::succeed(s, now_seconds(), done.image_id, done.message)
            });
            let note = format!("Image {name_tag}, elapsedTime {took:.3?}");
            record(&tools, &job, false, REASON_SUCCEEDED, |_| note.clone());
        }
        Err(e) => {
            let message = e.to_string();
            tracing::warn!(%message, ?took, "pull failed");
            // each owner is told of its own secrets' problems only; the NodeImage of all
            record(
                &tools,
                &job,
                true,
                REASON_FAILED,
                |namespace| match namespace {
                    None => format!("Image {name_tag} {message}"),
                    Some(ns) => format!("Image {name_tag} {}", e.message_for(ns)),
                },
            );
            update(&cell, |s| state::fail(s, now_seconds(), message));
        }
    }
    changed.notify_one();
}

/// Records an event on each owner of the tag and on the NodeImage; `note(namespace)` is what
/// the owner in `namespace` is told, `note(None)` what the NodeImage is (the owners share the
/// tag's pull, not their namespaces' business).
fn record<I, C>(
    tools: &PullTools<I, C>,
    job: &TagJob,
    warning: bool,
    reason: &str,
    note: impl Fn(Option<&str>) -> String,
) {
    let Some(events) = &tools.events else { return };
    let owners = job
        .spec
        .owner_references
        .iter()
        .map(|o| (o, Some(o.namespace.as_deref().unwrap_or_default())));
    for (regarding, namespace) in owners.chain(std::iter::once((&job.node_image, None))) {
        events.record(EventSpec {
            regarding: regarding.clone(),
            warning,
            reason: reason.to_string(),
            note: note(namespace),
            action: EVENT_ACTION.to_string(),
        });
    }
}

/// The attempts of a task, in its `turn` of `rank`; the last failure when all fail. An attempt
/// called off (`turn.rs`) is no attempt: the turn is given back, and taken again before the
/// next one; the time without it does not count against `activeDeadlineSeconds`. After
/// [`MAX_CALL_OFFS`] call-offs of the task the attempts are let finish.
async fn attempts<I, C>(
    tools: &PullTools<I, C>,
    job: &TagJob,
    landed: &tokio::sync::watch::Sender<Option<Landed>>,
    (turn, rank): (&mut Option<Turned>, &Rank),
) -> Result<Done, TaskError>
where
    I: ImageService + Clone + 'static,
    C: Credentials,
{
    let reference = Reference::from_name_tag(&job.image, &job.spec.tag)?;
    let limit = job.spec.backoff_limit();
    let timeout = job.spec.timeout();
    let mut deadline = job
        .spec
        .active_deadline()
        .map(|d| crate::k8s::time::later(Instant::now(), d));
    let mut last_error = None;
    let mut attempt = 0;
    let mut offs = CallOffs::default();
    while attempt <= limit {
        let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        let Some(budget) = state::attempt_budget(timeout, left) else {
            return Err(TaskError::Deadline { last: last_error });
        };
        // the budget is time without a byte landing where that is known, else a wall clock;
        // the deadline is a wall clock. Each attempt counts its own bytes.
        landed.send_replace(None);
        let this_attempt = progress::until_quiet(
            budget,
            left,
            landed.subscribe(),
            attempt_once(tools, job, &reference, budget, landed),
        );
        let result = tokio::select! {
            biased;
            r = this_attempt => match r {
                Some(r) => r,
                None => Err(AttemptError::TimedOut {
                    reference: format!("{}:{}", job.image, job.spec.tag),
                    budget,
                }),
            },
            () = tools.turn.called_off_within(&mut offs) => {
                tracing::info!(called_off = offs.count(), of = MAX_CALL_OFFS, "called off: a pod on the node waits for its own image or an in-place pull runs; pulling again after, in turn");
                *turn = None;
                let since = Instant::now();
                *turn = Some(tools.turn.pre_pull(tools.slots.as_ref(), rank.clone()).await);
                deadline = deadline.map(|d| crate::k8s::time::later(d, since.elapsed()));
                tracing::info!("pulling again");
                continue;
            }
        };
        match result {
            Ok(done) => return Ok(done),
            Err(e) if e.is_final() => return Err(e.into()),
            Err(e) => {
                // a runtime that is away (restarting, crashed) did not refuse the image: the
                // attempt does not count, and the next one starts as soon as it answers again
                if let Some(away) = e.runtime_away() {
                    tracing::warn!(error = %e, runtime = %away, "pull cut off: the runtime is unreachable; waiting for it, the attempt does not count");
                    last_error = Some(e);
                    if !wait_until_the_runtime_answers(tools, deadline).await {
                        return Err(TaskError::Deadline { last: last_error });
                    }
                    tracing::info!("the runtime answers again; pulling");
                    continue;
                }
                tracing::warn!(attempt = attempt + 1, of = limit + 1, error = %e, "pull attempt failed");
                last_error = Some(e);
            }
        }
        attempt += 1;
        if attempt <= limit {
            let pause = crate::backoff::exponential(
                attempt - 1,
                tools.settings.backoff_base,
                tools.settings.backoff_cap,
            );
            if !pause_within(pause, deadline).await {
                return Err(TaskError::Deadline { last: last_error });
            }
        }
    }
    // every attempt failed: at least one was made (the limit counts from 0)
    Err(match last_error {
        Some(e) => e.into(),
        None => TaskError::Deadline { last: None },
    })
}

/// How often a task waiting for an unreachable runtime asks whether it answers again.
const RUNTIME_POLL: Duration = Duration::from_millis(250);

/// Waits until the runtime answers again (`ImageFsInfo`, even with an error of its own);
/// false when the deadline passes first.
async fn wait_until_the_runtime_answers<I, C>(
    tools: &PullTools<I, C>,
    deadline: Option<Instant>,
) -> bool
where
    I: ImageService + Clone + 'static,
{
    loop {
        if !pause_within(RUNTIME_POLL, deadline).await {
            return false;
        }
        match tools.puller.runtime().image_fs_info().await {
            Err(e) if e.is_unreachable() => {}
            _ => return true,
        }
    }
}

/// Waits `pause`; when the deadline comes first, waits until it and returns false.
async fn pause_within(pause: Duration, deadline: Option<Instant>) -> bool {
    match deadline {
        Some(d) if crate::k8s::time::later(Instant::now(), pause) >= d => {
            tokio::time::sleep_until(d).await;
            false
        }
        _ => {
            tokio::time::sleep(pause).await;
            true
        }
    }
}

/// One attempt: presence check, disk check, credentials, pull.
async fn attempt_once<I, C>(
    tools: &PullTools<I, C>,
    job: &TagJob,
    reference: &Reference,
    budget: Duration,
    landed: &tokio::sync::watch::Sender<Option<Landed>>,
) -> Result<Done, AttemptError>
where
    I: ImageService + Clone + 'static,
    C: Credentials,
{
    let runtime = tools.puller.runtime();
    if job.spec.if_not_present() {
        match runtime.list_images().await {
            Ok(images) => {
                if let Some(image) = find_image(&images, reference) {
                    tracing::info!(image_id = %image.id, "image already present (IfNotPresent)");
                    tools.metrics.pulled(Source::NodeImage, Outcome::Present);
                    return Ok(Done {
                        image_id: format!("{}@{}", job.image, image.id),
                        message: String::new(),
                    });
                }
            }
            Err(e) => return Err(AttemptError::ListImages(e)),
        }
    }
    if let Some(refusal) = disk_refusal(tools, Source::NodeImage).await {
        return Err(AttemptError::NoRoom(refusal));
    }

    let resolved = tools
        .credentials
        .resolve_for(&job.pull_secrets, &reference.name())
        .await;
    let credentials = resolved.keyring.lookup(&reference.name());
    let secrets = resolved.keyring.secrets();
    let problems = resolved.problems;
    if !problems.is_empty() {
        let problems = problems_text(&problems);
        tracing::warn!(%problems, "pull secrets could not all be used; pulling with what was found");
    }
    let admitted = match admit_by_size(tools, Source::NodeImage, reference, &credentials).await {
        Ok(a) => a,
        Err(r) if r.last => return Err(AttemptError::NoRoom(r.message)),
        Err(r) => return Err(AttemptError::NotAdmitted(r.message)),
    };
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
    match tools.puller.pull_watched(spec, budget, Some(landed)).await {
        Ok(image_ref) => {
            if let Some(a) = admitted {
                learn(tools, a, &image_ref).await;
            }
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
                message: problems_text(&problems),
            })
        }
        Err(error) => {
            tools.credentials.invalidate(&job.pull_secrets);
            let scrubbed = scrub(&error.to_string(), &secrets);
            Err(AttemptError::Pull {
                error,
                scrubbed,
                problems,
            })
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
pub(super) async fn disk_refusal<I, C>(tools: &PullTools<I, C>, source: Source) -> Option<String>
where
    I: ImageService + Clone + 'static,
{
    let mut usage = match tools.puller.runtime().image_fs_info().await {
        Ok(u) => u,
        Err(e) => {
            tracing::debug!(error = %e, "ImageFsInfo failed; no disk check");
            return None;
        }
    };
    // the image filesystem as the daemon sees it, when one is named (--image-fs-path)
    if let Some(path) = tools.admission.as_ref().and_then(|a| a.fs_path.as_ref())
        && let Some(fs) = usage.first_mut()
    {
        fs.mountpoint = path.display().to_string();
    }
    let Some(fs) = disk::image_fs(&usage, tools.free_space) else {
        tracing::debug!("the runtime reports no image filesystem; no disk check");
        return None;
    };
    tools.metrics.image_fs(fs.used_bytes, fs.free_bytes);
    let floor = tools.settings.image_fs_min_free;
    if floor > 0 && fs.free_bytes.is_none() {
        tracing::debug!(mountpoint = %fs.mountpoint, "the image filesystem is not visible here; no disk check");
    }
    let refusal = disk::refusal(&fs, floor);
    if refusal.is_some() {
        tools.metrics.pulled(source, Outcome::Failed);
    }
    refusal
}

#[cfg(test)]
#[path = "task_tests.rs"]
pub(super) mod tests;

/// Why the size admission refused a pull.
#[derive(Debug)]
pub(super) struct SizeRefusal {
    /// What the status and the log say.
    pub message: String,
    /// Another attempt cannot help (the filesystem is not visible, or too small even empty).
    pub last: bool,
}

/// An admitted pull: what to learn the ratio from after it, and its share of the image
/// filesystem, held until the pull ends so that concurrent pulls do not count the same space.
pub(super) struct Admitted {
    admission: Arc<Admission>,
    compressed: u64,
    free_before: u64,
    path: PathBuf,
    reserved: u64,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut r = crate::sync::lock(&self.admission.reserved);
        *r = r.saturating_sub(self.reserved);
    }
}

/// Admission of an optional pull by the image's size (`admit.rs`); `Ok(None)` when it is off.
/// Only NodeImage tags and next-batch images: an in-place update's pull keeps the floor only.
pub(super) async fn admit_by_size<I, C>(
    tools: &PullTools<I, C>,
    source: Source,
    reference: &Reference,
    credentials: &[Credential],
) -> Result<Option<Admitted>, SizeRefusal>
where
    I: ImageService + Clone + 'static,
{
    let Some(admission) = &tools.admission else {
        return Ok(None);
    };
    if source == Source::InPlace {
        return Ok(None);
    }
    let image = reference.pull_key();
    let refuse = |message: String, last: bool| {
        tracing::warn!(reason = %message, "pull not admitted");
        tools.metrics.pulled(source, Outcome::Failed);
        SizeRefusal { message, last }
    };
    let path = match &admission.fs_path {
        Some(p) => Some(p.clone()),
        None => match tools.puller.runtime().image_fs_info().await {
            Ok(usage) => usage
                .first()
                .filter(|fs| !fs.mountpoint.is_empty())
                .map(|fs| PathBuf::from(&fs.mountpoint)),
            Err(e) => {
                return Err(refuse(
                    format!(
                        "not pulling {image}: the runtime did not say where its images are (ImageFsInfo: {e})"
                    ),
                    false,
                ));
            }
        },
    };
    let Some(path) = path else {
        let m = "the runtime reports no image filesystem: optional pre-pulls are refused (set --image-fs-path)";
        admission.note(m.to_string());
        return Err(refuse(format!("not pulling {image}: {m}"), true));
    };
    let Some(space) = (admission.space)(&path) else {
        let m = format!(
            "the image filesystem {} is not visible to kruised: optional pre-pulls are refused; \
             mount it read-only at the same path (deploy/daemonset.yaml) or set --image-fs-path",
            path.display()
        );
        admission.note(m.clone());
        return Err(refuse(format!("not pulling {image}: {m}"), true));
    };
    let compressed = admission
        .sizes
        .compressed_size(reference, credentials)
        .await
        .map_err(|e| {
            refuse(
                format!("not pulling {image}: its size could not be read from its registry: {e}"),
                false,
            )
        })?;
    let mut reserved = crate::sync::lock(&admission.reserved);
    let inputs = admit::Inputs {
        compressed,
        ratio: admission.ratio.get(),
        space: disk::Space {
            free: space.free.saturating_sub(*reserved),
            capacity: space.capacity,
        },
        floor: tools.settings.image_fs_min_free,
        high_percent: admission.high_percent,
    };
    admission.note(format!(
        "the image filesystem {} is visible: {} free of {}, {} held by pulls under way; size ratio {:.2}",
        path.display(),
        disk::human(space.free),
        disk::human(space.capacity),
        disk::human(*reserved),
        inputs.ratio
    ));
    match admit::decide(&image, &inputs) {
        admit::Verdict::Admit {
            unpacked,
            free_after,
        } => {
            *reserved = reserved.saturating_add(unpacked);
            drop(reserved);
            tracing::info!(
                %image,
                compressed,
                unpacked,
                free_after,
                ratio = inputs.ratio,
                "pull admitted by size"
            );
            Ok(Some(Admitted {
                admission: admission.clone(),
                compressed,
                free_before: space.free,
                path,
                reserved: unpacked,
            }))
        }
        admit::Verdict::Wait(m) => Err(refuse(m, false)),
        admit::Verdict::Refuse(m) => Err(refuse(m, true)),
    }
}

/// Learns the size ratio from an admitted pull that ended well: what the runtime reports for
/// `image_ref`, and what the filesystem lost meanwhile.
pub(super) async fn learn<I, C>(tools: &PullTools<I, C>, admitted: Admitted, image_ref: &str)
where
    I: ImageService + Clone + 'static,
{
    let reported = match tools.puller.runtime().image_status(image_ref).await {
        Ok(Some(i)) => i.size,
        _ => 0,
    };
    let taken = (admitted.admission.space)(&admitted.path)
        .map(|s| admitted.free_before.saturating_sub(s.free))
        .unwrap_or(0);
    if let Some(ratio) = admitted
        .admission
        .ratio
        .learn(admitted.compressed, reported, taken)
    {
        tracing::info!(
            compressed = admitted.compressed,
            reported,
            taken,
            ratio,
            "learned the image size ratio"
        );
    }
}
