//! One pull through the CRI, shared by everyone who asks for the same thing at the same time.
//!
//! What "the same thing" can mean here: the CRI cannot resolve a tag to a digest without pulling
//! (there is no "resolve" RPC, and the daemon does not talk to registries itself), so two tags
//! that happen to point at the same manifest are two pulls (the second one is cheap: the runtime
//! fetches the manifest and finds every blob present). What the daemon can know before pulling
//! is the normalised reference: `nginx:1.25`, `library/nginx:1.25` and
//! `docker.io/library/nginx:1.25` are one pull, and so are `app:v1@sha256:X` and `app@sha256:X`
//! (a digest fixes the content; the tag next to it does not change what is fetched). The same
//! digest in two repositories is two pulls, because the runtime records the image under the name
//! it was pulled by. Pulls with different credentials are never merged.
//!
//! The pull runs in its own task; every caller waits on its result with its own timeout. When
//! the last caller stops waiting (its tag was removed), the pull is cancelled.
//!
//! Where the runtime shows what a pull has landed (containerd's ingests: [`super::progress`]),
//! the pull's task follows it, publishes it to every caller, and the timeout is the time
//! without a byte landing rather than a wall clock: a pull that progresses is not cut off, one
//! whose bytes stop growing for the stall timeout fails at once ([`PullError::Stalled`]).
//! Where it does not (CRI-O), the timeout is the pull's wall clock, as before.
//!
//! Where the runtime can pin, the image is pinned until its first use before the pull is
//! reported done ([`super::pin`]).

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::keyring::Credential;
use super::metrics::{Metrics, Outcome, Source};
use super::pin::Pins;
use super::progress::{self, CutOff, Landed};
use crate::cri::{CriError, ImageService, PullRequest, PullSandbox};

/// What a pull returns: the runtime's image reference (the image ID on containerd and CRI-O),
/// or why there is none.
pub type PullResult = Result<String, PullError>;

/// Why a pull gave no image. Its text is what a tag's status and events say; no credential is
/// in it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PullError {
    /// The runtime failed every attempt: its errors in order, one per credential tried, each
    /// scrubbed of the credentials' secrets.
    #[error("failed to pull image {image:?}: {}", joined(.attempts))]
    Runtime {
        /// The image as sent to the runtime.
        image: String,
        /// One per attempt.
        attempts: Vec<FailedTry>,
    },
    /// Every waiter went away (their tags were removed) before the pull ended.
    #[error("pulling {0} was stopped")]
    Stopped(String),
    /// The caller's time ran out (the pull may go on for other waiters): its wall clock, or,
    /// where progress is known, the time without a byte landing.
    #[error("pulling timed out after {0:?}")]
    TimedOut(Duration),
    /// Nothing landed for the stall timeout (`--image-pull-stall-timeout`).
    #[error(
        "pulling {image} stalled: {}, then nothing for {:.1}s (--image-pull-stall-timeout)",
        landed_text(.landed),
        .after.as_secs_f64()
    )]
    Stalled {
        /// The image as sent to the runtime.
        image: String,
        /// What had landed.
        landed: Landed,
        /// How long nothing landed.
        after: Duration,
    },
    /// The pull's task ended without a result (the daemon is shutting down).
    #[error("the pull task ended without a result")]
    Lost,
}

impl PullError {
    /// The runtime's error when it did not answer the last try at all (it is away: restarting,
    /// crashed), rather than refusing the image.
    pub fn runtime_away(&self) -> Option<&CriError> {
        match self {
            PullError::Runtime { attempts, .. } => attempts
                .last()
                .map(|t| &t.error)
                .filter(|e| e.is_unreachable()),
            _ => None,
        }
    }
}

/// One try of a pull that the runtime failed: with credential `i` of `n` where there were
/// several, and the runtime's error, scrubbed of the credentials' secrets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailedTry {
    /// `(i, n)`: the try with credential `i` (from 1) of `n`, where `n > 1`.
    pub credential: Option<(usize, usize)>,
    /// What the runtime answered.
    pub error: CriError,
}

impl std::fmt::Display for FailedTry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.credential {
            Some((i, n)) => write!(f, "with credential {i} of {n}: {}", self.error),
            None => write!(f, "{}", self.error),
        }
    }
}

/// `5.0 MiB landed of the 16.0 MiB seen (5242880 of 16777216 bytes)`: what a stalled pull had
/// landed, of the blobs it had begun (not the whole image: see `progress.rs`).
fn landed_text(l: &Landed) -> String {
    let mib = |b: u64| b as f64 / f64::from(1u32 << 20);
    format!(
        "{:.1} MiB landed of the {:.1} MiB seen ({} of {} bytes)",
        mib(l.bytes),
        mib(l.total),
        l.bytes,
        l.total
    )
}

/// The time limit of a runtime's pull call whose progress is followed: the follower cuts it off
/// when nothing lands, and a pull that progresses has no wall clock but this one.
const FOLLOWED_CALL_LIMIT: Duration = Duration::from_secs(24 * 3600);

/// The tries' texts, in order.
fn joined(tries: &[FailedTry]) -> String {
    tries
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// One request to pull. Its `Debug` shows every credential and secret as `<redacted>`.
#[derive(Clone)]
pub struct PullSpec {
    /// The image as sent to the runtime (`name:tag` or `name@digest`).
    pub image: String,
    /// The normalised identity of the pull (see the module docs).
    pub key: String,
    /// Credentials to try in order; empty: anonymous.
    pub credentials: Vec<Credential>,
    /// Strings to scrub from error messages (passwords, `auth` values).
    pub secrets: Vec<String>,
    /// The sandbox config of the CRI request.
    pub sandbox: Option<PullSandbox>,
    /// Who asks (for the metrics).
    pub source: Source,
}

/// Shows as `<redacted>`.
#[derive(Clone, Copy)]
struct Redacted;

impl std::fmt::Debug for Redacted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

impl std::fmt::Debug for PullSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // how many, never what: user names too, a token is often the user name
        let redacted = |n: usize| vec![Redacted; n];
        f.debug_struct("PullSpec")
            .field("image", &self.image)
            .field("key", &self.key)
            .field("credentials", &redacted(self.credentials.len()))
            .field("secrets", &redacted(self.secrets.len()))
            .field("sandbox", &self.sandbox)
            .field("source", &self.source)
            .finish()
    }
}

impl PullSpec {
    /// The key under which identical pulls are merged: the reference and the credentials (by a
    /// hash that never leaves this process).
    fn merge_key(&self) -> String {
        let mut h = DefaultHasher::new();
        for c in &self.credentials {
            c.username.hash(&mut h);
            c.password.hash(&mut h);
        }
        format!("{}#{:016x}", self.key, h.finish())
    }
}

struct InFlight {
    id: u64,
    result: watch::Receiver<Option<PullResult>>,
    /// What the pull has landed; `None` while unknown.
    landed: watch::Receiver<Option<Landed>>,
    waiters: Arc<AtomicUsize>,
    cancel: CancellationToken,
}

/// Pulls through one image service, merging identical concurrent pulls.
pub struct Puller<I> {
    runtime: I,
    inflight: Mutex<HashMap<String, InFlight>>,
    next_id: std::sync::atomic::AtomicU64,
    tracker: TaskTracker,
    metrics: Metrics,
    /// Where pulls' progress comes from; `None`: nowhere (no stall, wall clock timeouts).
    ingests: Option<progress::Source>,
    /// Set once the runtime said it has no content service: no more asking.
    no_ingests: AtomicBool,
    /// The stall timeout; `None`: none.
    stall: Option<Duration>,
    /// Pins what it pulls until its first use (`None`: the runtime cannot).
    pins: Option<Arc<Pins>>,
}

/// Drops one waiter; the last one cancels a pull that has not finished.
struct Waiter {
    waiters: Arc<AtomicUsize>,
    cancel: CancellationToken,
}

impl Drop for Waiter {
    fn drop(&mut self) {
        if self.waiters.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.cancel.cancel();
        }
    }
}

impl<I: ImageService + Clone + 'static> Puller<I> {
    /// A puller over `runtime`; pulls run on `tracker`.
    pub fn new(runtime: I, tracker: TaskTracker, metrics: Metrics) -> Arc<Self> {
        Self::with_progress(runtime, tracker, metrics, None, None, None)
    }

    /// A puller over `runtime` that follows its pulls' progress through `ingests`, fails
    /// those that land nothing for `stall`, and pins each image it pulls with `pins` before it
    /// reports the pull done.
    pub fn with_progress(
        runtime: I,
        tracker: TaskTracker,
        metrics: Metrics,
        ingests: Option<progress::Source>,
        stall: Option<Duration>,
        pins: Option<Arc<Pins>>,
    ) -> Arc<Self> {
        Arc::new(Puller {
            runtime,
            inflight: Mutex::new(HashMap::new()),
            next_id: Default::default(),
            tracker,
            metrics,
            ingests,
            no_ingests: AtomicBool::new(false),
            stall,
            pins,
        })
    }

    /// What it pins with, if it pins.
    pub fn pins(&self) -> Option<&Arc<Pins>> {
        self.pins.as_ref()
    }

    /// The image service.
    pub fn runtime(&self) -> &I {
        &self.runtime
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, InFlight>> {
        crate::sync::lock(&self.inflight)
    }

    /// Pulls `spec`, or joins an identical pull in flight; waits at most `timeout` (without a
    /// byte landing, where that is known). Dropping the returned future stops waiting (and
    /// cancels the pull if nobody else waits).
    pub async fn pull(self: &Arc<Self>, spec: PullSpec, timeout: Duration) -> PullResult {
        self.pull_watched(spec, timeout, None).await
    }

    /// [`Puller::pull`], telling `landed` what the pull has landed as it goes.
    pub async fn pull_watched(
        self: &Arc<Self>,
        spec: PullSpec,
        timeout: Duration,
        landed: Option<&watch::Sender<Option<Landed>>>,
    ) -> PullResult {
        let key = spec.merge_key();
        let source = spec.source;
        let (mut rx, mut progress, waiter, joined) = {
            let mut map = self.lock();
            match map.get(&key) {
                Some(f) if !f.cancel.is_cancelled() => {
                    f.waiters.fetch_add(1, Ordering::AcqRel);
                    let w = Waiter {
                        waiters: f.waiters.clone(),
                        cancel: f.cancel.clone(),
                    };
                    (f.result.clone(), f.landed.clone(), w, true)
                }
                _ => {
                    let id = self.next_id.fetch_add(1, Ordering::Relaxed);
                    let (tx, rx) = watch::channel(None);
                    let (landed_tx, landed_rx) = watch::channel(None);
                    let waiters = Arc::new(AtomicUsize::new(1));
                    let cancel = CancellationToken::new();
                    map.insert(
                        key.clone(),
                        InFlight {
                            id,
                            result: rx.clone(),
                            landed: landed_rx.clone(),
                            waiters: waiters.clone(),
                            cancel: cancel.clone(),
                        },
                    );
                    let this = self.clone();
                    let task_cancel = cancel.clone();
                    self.tracker.spawn(async move {
                        let result = tokio::select! {
                            r = this.pull_followed(&spec, timeout, &landed_tx) => this.pinned(r).await,
                            () = task_cancel.cancelled() => Err(PullError::Stopped(spec.image.clone())),
                        };
                        // the next request for this key starts afresh
                        let mut map = this.lock();
                        if map.get(&key).is_some_and(|f| f.id == id) {
                            map.remove(&key);
                        }
                        drop(map);
                        let _ = tx.send(Some(result));
                    });
                    (rx, landed_rx, Waiter { waiters, cancel }, false)
                }
            }
        };
        if joined {
            self.metrics.pulled(source, Outcome::Shared);
        }
        // the caller's clock: set back whenever bytes land
        let mut until = crate::k8s::time::later(tokio::time::Instant::now(), timeout);
        let mut bytes = 0;
        let mut following = true;
        let result = loop {
            if let Some(r) = rx.borrow_and_update().clone() {
                break r;
            }
            tokio::select! {
                changed = rx.changed() => if changed.is_err() {
                    break Err(PullError::Lost);
                },
                changed = progress.changed(), if following => match changed {
                    Err(_) => following = false,
                    Ok(()) => {
                        let Some(l) = *progress.borrow_and_update() else { continue };
                        if l.bytes > bytes {
                            bytes = l.bytes;
                            until = crate::k8s::time::later(tokio::time::Instant::now(), timeout);
                        }
                        if let Some(to) = landed {
                            to.send_replace(Some(l));
                        }
                    }
                },
                () = tokio::time::sleep_until(until) => break Err(PullError::TimedOut(timeout)),
            }
        };
        drop(waiter);
        result
    }

    /// `result`, its image pinned first when it is a pull done and the puller pins: after the
    /// pull and outside its progress' following, so a slow pin is never taken for a stall.
    async fn pinned(&self, result: PullResult) -> PullResult {
        if let (Ok(image_ref), Some(pins)) = (&result, &self.pins) {
            pins.pin(image_ref).await;
        }
        result
    }

    /// The pull, followed where the runtime shows its ingests: cut off when it lands nothing
    /// for the stall timeout, or for `timeout` at all; else [`Puller::pull_now`] with `timeout`
    /// as its wall clock.
    async fn pull_followed(
        &self,
        spec: &PullSpec,
        timeout: Duration,
        landed: &watch::Sender<Option<Landed>>,
    ) -> PullResult {
        let Some(source) = self
            .ingests
            .as_ref()
            .filter(|_| !self.no_ingests.load(Ordering::Relaxed))
        else {
            return self.pull_now(spec, timeout).await;
        };
        let before = match source.ingests().await {
            Ok(before) => before,
            Err(e) => {
                if progress::unsupported(&e) {
                    tracing::info!(error = %e, "the runtime shows no pull progress (it has no containerd content service): progress is 0 until a pull ends, and pulls have no stall timeout");
                    self.no_ingests.store(true, Ordering::Relaxed);
                } else {
                    tracing::debug!(error = %e, "the runtime's ingests are unknown: pulling without following its progress");
                }
                return self.pull_now(spec, timeout).await;
            }
        };
        tokio::select! {
            r = self.pull_now(spec, timeout.max(FOLLOWED_CALL_LIMIT)) => r,
            cut = progress::follow(source.as_ref(), &before, self.stall, timeout, landed) => {
                self.metrics.pulled(spec.source, Outcome::Failed);
                Err(match cut {
                    CutOff::Stalled(s) => PullError::Stalled {
                        image: spec.image.clone(),
                        landed: s.landed,
                        after: s.after,
                    },
                    CutOff::Quiet(after) => PullError::TimedOut(after),
                })
            }
        }
    }

    /// The CRI calls of one pull: each credential in order until one works, or anonymous when
    /// there are none. All failing: every error, in order.
    async fn pull_now(&self, spec: &PullSpec, timeout: Duration) -> PullResult {
        let auths: Vec<_> = if spec.credentials.is_empty() {
            vec![None]
        } else {
            spec.credentials
                .iter()
                .map(|c| Some(c.to_pull_auth()))
                .collect()
        };
        let n = auths.len();
        let mut errors = Vec::new();
        for (i, auth) in auths.into_iter().enumerate() {
            let request = PullRequest {
                image: spec.image.clone(),
                auth,
                sandbox: spec.sandbox.clone(),
            };
            let started = tokio::time::Instant::now();
            let result = self.runtime.pull_image(request, timeout).await;
            let took = started.elapsed();
            self.metrics.pull_took(spec.source, result.is_ok(), took);
            match result {
                Ok(image_ref) => {
                    self.metrics.pulled(spec.source, Outcome::Succeeded);
                    return Ok(image_ref);
                }
                Err(e) => {
                    self.metrics.pulled(spec.source, Outcome::Failed);
                    errors.push(FailedTry {
                        credential: (n > 1).then_some((i + 1, n)),
                        error: e.map_text(|t| scrub(t, &spec.secrets)),
                    });
                }
            }
        }
        Err(PullError::Runtime {
            image: spec.image.clone(),
            attempts: errors,
        })
    }
}

/// `text` with every non-empty `secrets` entry replaced by `<redacted>`.
pub fn scrub(text: &str, secrets: &[String]) -> String {
    let mut out = text.to_string();
    for s in secrets.iter().filter(|s| s.len() >= 3) {
        out = out.replace(s.as_str(), "<redacted>");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scrubbing_replaces_every_secret() {
        let secrets = vec![
            "hunter2".to_string(),
            "dTpodW50ZXIy".to_string(),
            String::new(),
        ];
        assert_eq!(
            scrub("auth hunter2 and dTpodW50ZXIy failed", &secrets),
            "auth <redacted> and <redacted> failed"
        );
        assert_eq!(scrub("nothing here", &secrets), "nothing here");
    }

    #[test]
    fn a_pull_specs_debug_shows_no_credential() {
        // as AuthConfig's Debug in src/cri, which redacts its secrets
        let spec = PullSpec {
            image: "r.io/app:v1".into(),
            key: "r.io/app:v1".into(),
            credentials: vec![Credential {
                username: "robot-user".into(),
                password: "pw-Zq7-never-print".into(),
            }],
            secrets: vec![
                "pw-Zq7-never-print".into(),
                super::super::keyring::base64_encode(b"robot-user:pw-Zq7-never-print"),
            ],
            sandbox: None,
            source: Source::NextBatch,
        };
        for text in [format!("{spec:?}"), format!("{spec:#?}")] {
            for secret in ["pw-Zq7-never-print", "robot-user", &spec.secrets[1]] {
                assert!(!text.contains(secret), "{secret} in {text}");
            }
            assert!(text.contains("r.io/app:v1"), "{text}");
            assert_eq!(text.matches("<redacted>").count(), 3, "{text}");
        }
    }

    #[test]
    fn merge_keys_differ_by_credentials_only_through_a_hash() {
        let spec = |password: &str| PullSpec {
            image: "nginx:1".into(),
            key: "docker.io/library/nginx:1".into(),
            credentials: vec![Credential {
                username: "u".into(),
                password: password.into(),
            }],
            secrets: vec![],
            sandbox: None,
            source: Source::NodeImage,
        };
        let (a, b) = (
            spec("one-password").merge_key(),
            spec("two-password").merge_key(),
        );
        assert_ne!(a, b);
        assert!(a.starts_with("docker.io/library/nginx:1#"));
        assert!(!a.contains("one-password"));
        assert_eq!(a, spec("one-password").merge_key());
    }
}
